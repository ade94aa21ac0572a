//! The decode phase, as Talos' config loader runs it: split the stream into documents,
//! identify each (`v1alpha1` or `apiVersion`+`kind`), refuse duplicates, unknown kinds,
//! unknown keys and values of the wrong type. Any problem here stops validation, as a
//! decode error does in Talos.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use crate::checks::{parse_bytes, parse_go_duration};
use crate::schema::{self, Kind, Ty};
use crate::yaml::{self, Node, Resolved, Value};
use crate::{Contract, DocumentRef, Problem, ProblemKind};

/// A decoded document: its identity, its schema (None for `v1alpha1`) and its tree.
#[derive(Debug)]
pub(crate) struct Decoded {
    pub id: DocumentRef,
    pub kind: Option<&'static Kind>,
    pub root: Node,
}

/// Decodes every document, or returns the decode problems.
pub(crate) fn decode(text: &str, contract: Contract) -> Result<Vec<Decoded>, Vec<Problem>> {
    let documents = yaml::parse(text).map_err(|e| {
        vec![Problem {
            document: DocumentRef::stream(e.line),
            path: String::new(),
            line: Some(e.line),
            kind: ProblemKind::Syntax,
            message: format!("yaml: line {}: {}", e.line, e.message),
        }]
    })?;
    let mut problems = Vec::new();
    let mut decoded: Vec<Decoded> = Vec::new();
    for document in documents {
        let Some(root) = document.root else { continue };
        if root.is_null() {
            continue; // an empty document between two `---`
        }
        let Value::Map(_) = &root.value else {
            problems.push(Problem {
                document: DocumentRef::stream(root.line),
                path: String::new(),
                line: Some(root.line),
                kind: ProblemKind::Syntax,
                message: format!("expected a YAML document at line {}", root.line),
            });
            continue;
        };
        let id = identify(&root);
        if let Some(first) = decoded.iter().find(|d| d.id.same_as(&id)) {
            problems.push(Problem {
                path: String::new(),
                line: Some(id.line),
                kind: ProblemKind::DuplicateDocument,
                message: format!(
                    "duplicate document {} is not allowed (line {}; first at line {})",
                    id.triple(),
                    id.line,
                    first.id.line
                ),
                document: id,
            });
            continue;
        }
        match schema_of(&id, contract) {
            Err(problem) => problems.push(*problem),
            Ok((ty, kind)) => {
                let mut checker = Checker {
                    document: &id,
                    problems: &mut problems,
                    path: Vec::new(),
                };
                checker.check(ty, &root);
                decoded.push(Decoded { id, kind, root });
            }
        }
    }
    if problems.is_empty() {
        Ok(decoded)
    } else {
        Err(problems)
    }
}

/// The `(apiVersion, kind, name)` of a document, as Talos' decoder computes it: any of
/// `machine`, `cluster`, `debug` or `persist` makes a `v1alpha1` document.
fn identify(root: &Node) -> DocumentRef {
    let mut api_version = root
        .get("apiVersion")
        .and_then(Node::text)
        .map(str::to_owned);
    let kind = root.get("kind").and_then(Node::text).map(str::to_owned);
    if ["machine", "cluster", "debug", "persist"]
        .iter()
        .any(|k| root.has_key(k))
    {
        api_version = Some("v1alpha1".to_owned());
    }
    DocumentRef {
        api_version: api_version.unwrap_or_default(),
        kind: kind.unwrap_or_default(),
        name: root.get("name").and_then(Node::text).map(str::to_owned),
        line: root.line,
    }
}

fn schema_of(
    id: &DocumentRef,
    contract: Contract,
) -> Result<(&'static Ty, Option<&'static Kind>), Box<Problem>> {
    let refuse = |kind: ProblemKind, message: String| {
        Box::new(Problem {
            document: id.clone(),
            path: String::new(),
            line: Some(id.line),
            kind,
            message,
        })
    };
    if id.kind.is_empty() {
        if id.api_version == "v1alpha1" {
            return Ok((&schema::CONFIG_TY, None));
        }
        return Err(refuse(
            ProblemKind::UnknownDocument,
            "missing kind".to_owned(),
        ));
    }
    if id.api_version.is_empty() {
        return Err(refuse(
            ProblemKind::UnknownDocument,
            "missing apiVersion".to_owned(),
        ));
    }
    let not_registered = || {
        refuse(
            ProblemKind::UnknownDocument,
            format!("{:?} {:?}: not registered", id.kind, id.api_version),
        )
    };
    if id.api_version != "v1alpha1" {
        return Err(not_registered());
    }
    let Some(kind) = schema::KINDS.iter().find(|k| k.name == id.kind) else {
        if schema::UNMODELED_KINDS.contains(&id.kind.as_str()) {
            return Err(refuse(
                ProblemKind::UnknownDocument,
                format!(
                    "{:?} {:?}: a Talos document kind this validator does not model \
                     (refused rather than accepted unchecked)",
                    id.kind, id.api_version
                ),
            ));
        }
        return Err(not_registered());
    };
    if contract.minor() < kind.since_minor {
        return Err(refuse(
            ProblemKind::UnknownDocument,
            format!(
                "{:?} {:?}: not registered (the kind exists since Talos v1.{}, this is {})",
                id.kind,
                id.api_version,
                kind.since_minor,
                contract.label()
            ),
        ));
    }
    Ok((kind.ty, Some(kind)))
}

/// Walks a tree against a schema, recording unknown keys and type mismatches.
struct Checker<'a> {
    document: &'a DocumentRef,
    problems: &'a mut Vec<Problem>,
    path: Vec<String>,
}

impl Checker<'_> {
    fn path(&self) -> String {
        let mut out = String::new();
        for seg in &self.path {
            if seg.starts_with('[') {
                out.push_str(seg);
            } else {
                out.push('.');
                out.push_str(seg);
            }
        }
        out
    }

    fn report(&mut self, node: &Node, kind: ProblemKind, message: String) {
        self.problems.push(Problem {
            document: self.document.clone(),
            path: self.path(),
            line: Some(node.line),
            kind,
            message,
        });
    }

    fn mismatch(&mut self, node: &Node, ty: &Ty) {
        // The value itself is never echoed: it may be a secret.
        let message = format!(
            "cannot unmarshal {} into {}",
            node.short_tag(),
            ty.go_name()
        );
        self.report(node, ProblemKind::WrongType, message);
    }

    fn invalid_scalar(&mut self, node: &Node, message: String) {
        self.report(node, ProblemKind::WrongType, message);
    }

    fn check(&mut self, ty: &Ty, node: &Node) {
        if node.is_null() {
            return; // Go's zero value
        }
        match ty {
            Ty::Str
            | Ty::Bool
            | Ty::Int { .. }
            | Ty::FileMode
            | Ty::Duration
            | Ty::Base64
            | Ty::ByteSize
            | Ty::SizeMatcher => self.check_scalar(ty, node),
            Ty::Object => {
                if !matches!(node.value, Value::Map(_)) {
                    self.mismatch(node, ty);
                }
            }
            Ty::List(elem, _) => {
                let Value::Seq(items) = &node.value else {
                    self.mismatch(node, ty);
                    return;
                };
                for (i, item) in items.iter().enumerate() {
                    self.path.push(format!("[{i}]"));
                    self.check(elem, item);
                    self.path.pop();
                }
            }
            Ty::Map(elem, _) => {
                let Value::Map(entries) = &node.value else {
                    self.mismatch(node, ty);
                    return;
                };
                for (key, value) in entries {
                    self.path.push(key.text().unwrap_or_default().to_owned());
                    self.check(elem, value);
                    self.path.pop();
                }
            }
            Ty::Struct(schema) => {
                let Value::Map(entries) = &node.value else {
                    self.mismatch(node, ty);
                    return;
                };
                for (key, value) in entries {
                    let name = key.text().unwrap_or_default();
                    self.path.push(name.to_owned());
                    match schema.field(name) {
                        Some(field_ty) => self.check(field_ty, value),
                        None => self.report(
                            key,
                            ProblemKind::UnknownKey,
                            "unknown keys found during decoding".to_owned(),
                        ),
                    }
                    self.path.pop();
                }
            }
        }
    }

    /// Scalars: the Go types that are not collections.
    fn check_scalar(&mut self, ty: &Ty, node: &Node) {
        match ty {
            Ty::Str if !matches!(node.value, Value::Scalar { .. }) => self.mismatch(node, ty),
            Ty::Bool if node.as_bool().is_none() => self.mismatch(node, ty),
            Ty::Int { min, max, .. } => match node.as_int() {
                Some(i) if (*min..=*max).contains(&i) => {}
                _ => self.mismatch(node, ty),
            },
            Ty::FileMode => match node.as_int() {
                Some(i) if (0..=i128::from(u32::MAX)).contains(&i) => {}
                _ => self.mismatch(node, ty),
            },
            Ty::Duration => match node.resolve() {
                Some(Resolved::Str(s)) => {
                    if parse_go_duration(s).is_none() {
                        self.invalid_scalar(node, "time: invalid duration".to_owned());
                    }
                }
                _ => self.mismatch(node, ty),
            },
            Ty::Base64 => match &node.value {
                Value::Scalar { text, .. } => {
                    if STANDARD.decode(text.trim()).is_err() {
                        self.invalid_scalar(node, "illegal base64 data".to_owned());
                    }
                }
                _ => self.mismatch(node, ty),
            },
            Ty::ByteSize => match (&node.value, node.as_int()) {
                (_, Some(i)) if i >= 0 => {}
                (Value::Scalar { text, .. }, None) if parse_bytes(text).is_some() => {}
                (Value::Scalar { .. }, _) => {
                    self.invalid_scalar(node, "failed to parse disk size".to_owned());
                }
                _ => self.mismatch(node, ty),
            },
            Ty::SizeMatcher => match &node.value {
                Value::Scalar { text, .. } => {
                    if let Err(e) = crate::checks::parse_size_matcher(text) {
                        self.invalid_scalar(node, e);
                    }
                }
                _ => self.mismatch(node, ty),
            },
            _ => {}
        }
    }
}
