//! `kubectl-kontinuum`, the kubectl plugin of Kontinuum (`kubectl kontinuum …`, or run
//! standalone).
//!
//! It writes only Zones (`zone add`, `zone remove`) and Instances (`instance add`), with
//! server-side apply and the field manager `kubectl-kontinuum`; the operators on the hub do
//! the rest. Everything else reads: `zone list`, `zone describe` (a tree of the zone's
//! objects, blockers first), `zone kubeconfig`, `instance list`, `version`, and the
//! `--wait` view, which follows the zone with watches.
//!
//! The pure parts (manifests and their validation, the wait view, the describe tree and
//! tables, kubeconfig merging) live in their own modules and are unit-tested; `commands`
//! does the I/O. Errors print as one line on stderr; exit codes: 1 usage or validation,
//! 2 API error, 3 timeout.

pub mod cli;
pub mod commands;
pub mod error;
pub mod hub;
pub mod kubeconfig;
pub mod manifest;
pub mod style;
pub mod tree;
pub mod view;

use std::ffi::OsString;
use std::io::Write as _;

use clap::Parser as _;
use clap::error::ErrorKind;

pub use commands::FIELD_MANAGER;
pub use error::Error;

/// Runs the plugin with `args` (the first being the program name) and returns the exit
/// code. Output goes to stdout; errors go to stderr as one line.
pub fn main_with_args<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match cli::Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(err) => return usage_error(&err),
    };
    kontinuum_operator_common::install_crypto_provider();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return report(&Error::Output(e)),
    };
    let term = commands::Terminal::detect();
    match runtime.block_on(commands::run(cli, &term)) {
        Ok(()) => 0,
        Err(err) => report(&err),
    }
}

fn report(err: &Error) -> u8 {
    let _ = writeln!(std::io::stderr().lock(), "{}", err.one_line());
    err.exit_code()
}

/// Help and version go to stdout with exit 0; a usage error is one line on stderr, exit 1
/// (a missing subcommand shows the help instead).
fn usage_error(err: &clap::Error) -> u8 {
    match err.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = err.print();
            0
        }
        // A bare `kubectl kontinuum` (or `zone`): the help, as a usage error.
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = err.print();
            1
        }
        _ => report(&Error::Usage(usage_line(&err.render().to_string()))),
    }
}

/// clap's message without the usage and hint lines, on one line (without `error:`, which
/// the report adds).
pub fn usage_line(rendered: &str) -> String {
    let body = rendered.split("\nUsage:").next().unwrap_or(rendered);
    let body: String = body
        .lines()
        .filter(|l| !l.trim_start().starts_with("tip:"))
        .collect::<Vec<_>>()
        .join(" ");
    let folded = error::fold_lines(&body);
    folded.strip_prefix("error: ").unwrap_or(&folded).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_errors_fold_into_one_line_naming_the_flag() {
        let err = cli::Cli::try_parse_from(["kubectl-kontinuum", "zone", "add", "--zone", "a"])
            .unwrap_err();
        let line = usage_line(&err.render().to_string());
        assert_eq!(
            line,
            "the following required arguments were not provided: --region <REGION>"
        );
        let err =
            cli::Cli::try_parse_from(["kubectl-kontinuum", "zone", "add", "--bogus"]).unwrap_err();
        let line = usage_line(&err.render().to_string());
        assert!(
            line.starts_with("unexpected argument '--bogus' found"),
            "{line}"
        );
        assert!(!line.contains("tip"), "{line}");
    }
}
