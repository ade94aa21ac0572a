//! A small YAML node tree with line numbers, built from `granit-parser` events, and the
//! scalar resolution rules of Go's `yaml.v3` (the decoder Talos uses).
//!
//! Aliases are expanded (bounded: see [`MAX_NODES`]); a mapping key defined twice is a syntax
//! error, as in `yaml.v3` ("mapping key ... already defined").

use std::collections::HashMap;

use granit_parser::{Event, Parser, ScalarStyle};

/// Most nodes one config may expand to (aliases included): a generated config has ~150.
pub(crate) const MAX_NODES: usize = 200_000;

/// One YAML node and the (1-based) line it starts on.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub line: usize,
    pub value: Value,
}

/// The three node kinds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    /// A scalar: its text, whether it was plain (unquoted, so subject to type resolution),
    /// and an explicit core-schema tag (`str`, `int`, ...) if one was given.
    Scalar {
        text: String,
        plain: bool,
        tag: Option<String>,
    },
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

/// One document of the stream; `root` is `None` for an empty document.
#[derive(Debug, Clone)]
pub(crate) struct Document {
    pub root: Option<Node>,
}

/// The stream is not YAML (or is too large once aliases are expanded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SyntaxError {
    pub line: usize,
    pub message: String,
}

/// The type a scalar resolves to, as `yaml.v3` resolves untagged plain scalars.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Resolved<'a> {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(&'a str),
}

impl Resolved<'_> {
    /// The `yaml.v3` short tag, for error messages.
    pub fn tag(&self) -> &'static str {
        match self {
            Self::Null => "!!null",
            Self::Bool(_) => "!!bool",
            Self::Int(_) => "!!int",
            Self::Float(_) => "!!float",
            Self::Str(_) => "!!str",
        }
    }
}

impl Node {
    /// Resolves a scalar (None for a sequence or mapping).
    pub fn resolve(&self) -> Option<Resolved<'_>> {
        let Value::Scalar { text, plain, tag } = &self.value else {
            return None;
        };
        Some(match tag.as_deref() {
            Some("null") => Resolved::Null,
            Some("bool" | "int" | "float") | None if *plain || tag.is_some() => resolve_plain(text),
            _ => Resolved::Str(text),
        })
    }

    /// The `yaml.v3` tag of the node, for error messages.
    pub fn short_tag(&self) -> &'static str {
        match &self.value {
            Value::Scalar { .. } => self.resolve().map_or("!!str", |r| r.tag()),
            Value::Seq(_) => "!!seq",
            Value::Map(_) => "!!map",
        }
    }

    /// Null (`~`, `null`, empty) scalars decode to Go's zero value.
    pub fn is_null(&self) -> bool {
        matches!(self.resolve(), Some(Resolved::Null))
    }

    /// A non-null scalar's text.
    pub fn text(&self) -> Option<&str> {
        match &self.value {
            Value::Scalar { text, .. } if !self.is_null() => Some(text),
            _ => None,
        }
    }

    /// The value at `key` of a mapping (None when absent, null or not a mapping).
    pub fn get(&self, key: &str) -> Option<&Node> {
        let Value::Map(entries) = &self.value else {
            return None;
        };
        entries
            .iter()
            .find(|(k, _)| k.text() == Some(key))
            .map(|(_, v)| v)
            .filter(|v| !v.is_null())
    }

    /// The value at a path of mapping keys.
    pub fn at(&self, path: &[&str]) -> Option<&Node> {
        path.iter().try_fold(self, |node, key| node.get(key))
    }

    /// Whether the key is present in a mapping, even with a null value.
    pub fn has_key(&self, key: &str) -> bool {
        matches!(&self.value, Value::Map(entries) if entries.iter().any(|(k, _)| k.text() == Some(key)))
    }

    /// A mapping's entries (empty for anything else).
    pub fn entries(&self) -> &[(Node, Node)] {
        match &self.value {
            Value::Map(entries) => entries,
            _ => &[],
        }
    }

    /// A sequence's items (empty for anything else).
    pub fn items(&self) -> &[Node] {
        match &self.value {
            Value::Seq(items) => items,
            _ => &[],
        }
    }

    /// The scalar as a bool, with `yaml.v3`'s YAML 1.1 compatibility for typed bools.
    pub fn as_bool(&self) -> Option<bool> {
        match self.resolve()? {
            Resolved::Bool(b) => Some(b),
            Resolved::Str(s) => yaml11_bool(s),
            _ => None,
        }
    }

    /// The scalar as an integer (an integral float counts, as in `yaml.v3`).
    pub fn as_int(&self) -> Option<i128> {
        match self.resolve()? {
            Resolved::Int(i) => Some(i),
            #[allow(
                clippy::cast_possible_truncation,
                reason = "checked integral and in range"
            )]
            Resolved::Float(f) if f.fract() == 0.0 && f.abs() < 9.2e18 => Some(f as i128),
            _ => None,
        }
    }

    /// The strings of a sequence of scalars (non-scalars skipped).
    pub fn strings(&self) -> Vec<&str> {
        self.items().iter().filter_map(Node::text).collect()
    }
}

/// `yaml.v3` accepts these for a typed bool field even though YAML 1.2 reads them as strings.
pub(crate) fn yaml11_bool(s: &str) -> Option<bool> {
    match s {
        "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => Some(true),
        "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => Some(false),
        _ => None,
    }
}

/// `yaml.v3`'s resolution of an untagged plain scalar.
fn resolve_plain(text: &str) -> Resolved<'_> {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Resolved::Null,
        "true" | "True" | "TRUE" => return Resolved::Bool(true),
        "false" | "False" | "FALSE" => return Resolved::Bool(false),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return Resolved::Float(f64::INFINITY);
        }
        "-.inf" | "-.Inf" | "-.INF" => return Resolved::Float(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return Resolved::Float(f64::NAN),
        _ => {}
    }
    if let Some(i) = parse_go_int(text) {
        return Resolved::Int(i);
    }
    if is_yaml_float(text)
        && let Ok(f) = text.parse::<f64>()
    {
        return Resolved::Float(f);
    }
    Resolved::Str(text)
}

/// Go's `strconv.ParseInt(s, 0, 64)` (or `ParseUint`) after removing `_`, as `yaml.v3` does:
/// decimal, `0x`, `0o`, `0b`, or a leading `0` for octal, with an optional sign.
fn parse_go_int(text: &str) -> Option<i128> {
    let plain: String = text.chars().filter(|c| *c != '_').collect();
    let (negative, digits) = match plain.as_bytes().first()? {
        b'-' => (true, &plain[1..]),
        b'+' => (false, &plain[1..]),
        _ => (false, plain.as_str()),
    };
    let (radix, body) = if let Some(rest) = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        (16, rest)
    } else if let Some(rest) = digits
        .strip_prefix("0o")
        .or_else(|| digits.strip_prefix("0O"))
    {
        (8, rest)
    } else if let Some(rest) = digits
        .strip_prefix("0b")
        .or_else(|| digits.strip_prefix("0B"))
    {
        (2, rest)
    } else if digits.len() > 1 && digits.starts_with('0') {
        (8, &digits[1..])
    } else {
        (10, digits)
    };
    if body.is_empty() || !body.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = i128::from_str_radix(body, radix).ok()?;
    let value = if negative { -magnitude } else { magnitude };
    (i128::from(i64::MIN)..=i128::from(u64::MAX))
        .contains(&value)
        .then_some(value)
}

/// `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`
fn is_yaml_float(text: &str) -> bool {
    let s = text.strip_prefix(['-', '+']).unwrap_or(text);
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let digits = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok = match mantissa.split_once('.') {
        Some(("", frac)) => digits(frac),
        Some((int, frac)) => digits(int) && (frac.is_empty() || digits(frac)),
        None => digits(mantissa),
    };
    let exponent_ok = exponent.is_none_or(|e| digits(e.strip_prefix(['-', '+']).unwrap_or(e)));
    mantissa_ok && exponent_ok
}

enum Frame {
    Seq {
        line: usize,
        anchor: usize,
        items: Vec<Node>,
    },
    Map {
        line: usize,
        anchor: usize,
        entries: Vec<(Node, Node)>,
        key: Option<Node>,
    },
}

struct Builder {
    stack: Vec<Frame>,
    anchors: HashMap<usize, Node>,
    nodes: usize,
    root: Option<Node>,
}

impl Builder {
    fn count(&mut self, node: &Node) -> Result<(), SyntaxError> {
        self.nodes += size(node);
        if self.nodes > MAX_NODES {
            return Err(SyntaxError {
                line: node.line,
                message: format!("document expands to more than {MAX_NODES} nodes"),
            });
        }
        Ok(())
    }

    /// Adds a finished node to its parent (or makes it the root).
    fn push(&mut self, node: Node, anchor: usize) -> Result<(), SyntaxError> {
        if anchor != 0 {
            self.anchors.insert(anchor, node.clone());
        }
        match self.stack.last_mut() {
            None => self.root = Some(node),
            Some(Frame::Seq { items, .. }) => items.push(node),
            Some(Frame::Map { entries, key, .. }) => match key.take() {
                None => {
                    if !matches!(node.value, Value::Scalar { .. }) {
                        // yaml.v3 accepts complex keys but Talos' decoder refuses them.
                        return Err(SyntaxError {
                            line: node.line,
                            message: "unexpected mapping key type".to_owned(),
                        });
                    }
                    if let Some((first, _)) = entries.iter().find(|(k, _)| k.value == node.value) {
                        let Value::Scalar { text, .. } = &node.value else {
                            return Ok(());
                        };
                        return Err(SyntaxError {
                            line: node.line,
                            message: format!(
                                "mapping key {text:?} already defined at line {}",
                                first.line
                            ),
                        });
                    }
                    *key = Some(node);
                }
                Some(k) => entries.push((k, node)),
            },
        }
        Ok(())
    }
}

fn size(node: &Node) -> usize {
    1 + match &node.value {
        Value::Scalar { .. } => 0,
        Value::Seq(items) => items.iter().map(size).sum(),
        Value::Map(entries) => entries.iter().map(|(k, v)| size(k) + size(v)).sum(),
    }
}

impl Builder {
    fn new() -> Self {
        Self {
            stack: Vec::new(),
            anchors: HashMap::new(),
            nodes: 0,
            root: None,
        }
    }

    /// Handles one node event of a document.
    fn event(&mut self, event: Event<'_>, line: usize) -> Result<(), SyntaxError> {
        match event {
            Event::Scalar(value, style, anchor, tag) => {
                let node = Node {
                    line,
                    value: Value::Scalar {
                        text: value.into_owned(),
                        plain: style == ScalarStyle::Plain,
                        tag: tag.map(|t| t.core_suffix().unwrap_or("custom").to_owned()),
                    },
                };
                self.count(&node)?;
                self.push(node, anchor)?;
            }
            Event::SequenceStart(_, anchor, _) => self.stack.push(Frame::Seq {
                line,
                anchor,
                items: Vec::new(),
            }),
            Event::MappingStart(_, anchor, _) => self.stack.push(Frame::Map {
                line,
                anchor,
                entries: Vec::new(),
                key: None,
            }),
            Event::SequenceEnd | Event::MappingEnd => {
                let (node, anchor) = match self.stack.pop() {
                    Some(Frame::Seq {
                        line,
                        anchor,
                        items,
                    }) => (
                        Node {
                            line,
                            value: Value::Seq(items),
                        },
                        anchor,
                    ),
                    Some(Frame::Map {
                        line,
                        anchor,
                        entries,
                        ..
                    }) => (
                        Node {
                            line,
                            value: Value::Map(entries),
                        },
                        anchor,
                    ),
                    None => return Ok(()),
                };
                self.nodes += 1;
                self.push(node, anchor)?;
            }
            Event::Alias(id) => {
                let node = self.anchors.get(&id).cloned().ok_or_else(|| SyntaxError {
                    line,
                    message: "unknown anchor referenced".to_owned(),
                })?;
                self.count(&node)?;
                self.push(node, 0)?;
            }
            _ => {}
        }
        Ok(())
    }
}

/// Parses a multi-document stream.
pub(crate) fn parse(text: &str) -> Result<Vec<Document>, SyntaxError> {
    let mut documents = Vec::new();
    let mut builder: Option<Builder> = None;
    for event in Parser::new_from_str(text) {
        let (event, span) = event.map_err(|e| SyntaxError {
            line: e.marker().line(),
            message: e.info(),
        })?;
        match event {
            Event::DocumentStart(..) => builder = Some(Builder::new()),
            Event::DocumentEnd => {
                if let Some(b) = builder.take() {
                    documents.push(Document { root: b.root });
                }
            }
            event => {
                if let Some(b) = builder.as_mut() {
                    b.event(event, span.start.line())?;
                }
            }
        }
    }
    Ok(documents)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scalar(text: &str) -> Node {
        parse(text).unwrap().remove(0).root.unwrap()
    }

    #[test]
    fn resolves_like_yaml_v3() {
        assert_eq!(scalar("~").resolve(), Some(Resolved::Null));
        assert_eq!(scalar("true").resolve(), Some(Resolved::Bool(true)));
        assert_eq!(scalar("'true'").resolve(), Some(Resolved::Str("true")));
        assert_eq!(scalar("yes").resolve(), Some(Resolved::Str("yes")));
        assert_eq!(scalar("yes").as_bool(), Some(true));
        assert_eq!(scalar("0x1F").resolve(), Some(Resolved::Int(31)));
        assert_eq!(scalar("0644").resolve(), Some(Resolved::Int(0o644)));
        assert_eq!(scalar("0o644").resolve(), Some(Resolved::Int(0o644)));
        assert_eq!(scalar("1_000").resolve(), Some(Resolved::Int(1000)));
        assert_eq!(scalar("-7").resolve(), Some(Resolved::Int(-7)));
        assert_eq!(scalar("\"7445\"").resolve(), Some(Resolved::Str("7445")));
        assert_eq!(scalar("1.5").resolve(), Some(Resolved::Float(1.5)));
        assert_eq!(scalar("1.2.3").resolve(), Some(Resolved::Str("1.2.3")));
        assert_eq!(
            scalar("52:54:00:00:00:01").resolve(),
            Some(Resolved::Str("52:54:00:00:00:01"))
        );
        assert_eq!(scalar("!!str 5").resolve(), Some(Resolved::Str("5")));
        assert_eq!(scalar("2.0").as_int(), Some(2));
    }

    #[test]
    fn documents_lines_and_lookups() {
        let docs = parse("a: 1\n---\n---\nb:\n  c: [x, y]\n").unwrap();
        assert_eq!(docs.len(), 3);
        assert_eq!(docs[0].root.as_ref().unwrap().line, 1);
        assert!(docs[1].root.as_ref().unwrap().is_null());
        let b = docs[2].root.as_ref().unwrap();
        assert_eq!(b.line, 4);
        assert_eq!(b.at(&["b", "c"]).unwrap().strings(), vec!["x", "y"]);
        assert_eq!(b.at(&["b", "c"]).unwrap().line, 5);
    }

    #[test]
    fn duplicate_keys_and_aliases() {
        let err = parse("a: 1\nb: 2\na: 3\n").unwrap_err();
        assert_eq!(err.line, 3);
        assert!(err.message.contains("already defined at line 1"), "{err:?}");
        let docs = parse("a: &x {k: v}\nb: *x\n").unwrap();
        let root = docs[0].root.as_ref().unwrap();
        assert_eq!(root.at(&["b", "k"]).unwrap().text(), Some("v"));
        assert!(parse("a: b: c").is_err());
    }

    #[test]
    fn alias_bombs_are_bounded() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..8 {
            let prev = i - 1;
            let refs = vec![format!("*a{prev}"); 10].join(", ");
            text = format!("{text}a{i}: &a{i} [{refs}]\n");
        }
        let err = parse(&text).unwrap_err();
        assert!(err.message.contains("more than"), "{err:?}");
    }
}
