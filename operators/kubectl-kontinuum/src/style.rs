//! Terminal styling: colour only on a terminal, and never when `NO_COLOR` is set.

use kontinuum_crds::conditions::ConditionStatus;

/// Whether to colour output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Style {
    color: bool,
}

impl Style {
    /// No colour.
    pub const fn plain() -> Self {
        Self { color: false }
    }

    /// Colour.
    pub const fn colored() -> Self {
        Self { color: true }
    }

    /// Colour when the output is a terminal and `no_color` (the value of `NO_COLOR`) is
    /// unset or empty (<https://no-color.org>).
    pub fn detect(is_terminal: bool, no_color: Option<&str>) -> Self {
        Self {
            color: is_terminal && no_color.is_none_or(str::is_empty),
        }
    }

    /// Whether this style colours.
    pub const fn is_colored(self) -> bool {
        self.color
    }

    /// `text` in the colour of `status`: green True, red False, yellow Unknown.
    pub fn status(self, status: ConditionStatus, text: &str) -> String {
        let code = match status {
            ConditionStatus::True => "32",
            ConditionStatus::False => "31",
            ConditionStatus::Unknown => "33",
        };
        self.paint(code, text)
    }

    /// `text` in bold.
    pub fn bold(self, text: &str) -> String {
        self.paint("1", text)
    }

    fn paint(self, code: &str, text: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(Style::detect(true, None).is_colored());
        assert!(Style::detect(true, Some("")).is_colored());
        assert!(!Style::detect(true, Some("1")).is_colored());
        assert!(!Style::detect(false, None).is_colored());
        assert_eq!(Style::plain().status(ConditionStatus::True, "True"), "True");
        assert_eq!(
            Style::colored().status(ConditionStatus::True, "True"),
            "\x1b[32mTrue\x1b[0m"
        );
    }
}
