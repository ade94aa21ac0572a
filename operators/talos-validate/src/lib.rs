//! `kontinuum-talos-validate`: a strict Talos machine-config validator of our own, written
//! from Talos' config loader and `Validate` methods (v1.12 and v1.13), independent of the
//! generator in `kontinuum-talos-config`.
//!
//! [`validate`] runs the two phases Talos runs on `ApplyConfiguration`:
//!
//! 1. **Decode**, as `configloader` does: multi-document YAML; each document is the legacy
//!    `v1alpha1` document (any of `version`+`machine`/`cluster`/`debug`/`persist`) or a typed
//!    document (`apiVersion: v1alpha1` + `kind`); unknown kinds are "not registered";
//!    duplicated documents (same apiVersion/kind/name) are refused; every key must be in the
//!    allow-list of its section ("unknown keys found during decoding") and every value must
//!    decode into the Go type Talos uses ("cannot unmarshal !!str into bool"). Any decode
//!    problem stops here, as in Talos.
//! 2. **Validate**, as `v1alpha1.Config.Validate`, each document's `Validate` and the
//!    container's cross-document checks do (see the crate README for the list), plus a few
//!    checks Talos only fails on later, at runtime, marked as such in the messages.
//!
//! A problem names the document, the field path (`.cluster.network.cni.name`), the line, and
//! what is wrong in Talos' words; values are never echoed (a config holds secrets).
//! [`describe`] joins problems into one Talos-shaped message for a gRPC status.
//!
//! The allow-lists ([`allowed_keys`]) cover every key of the `v1alpha1` document and of the
//! typed documents in [`modeled_kinds`]; Talos kinds outside that set are refused by name
//! rather than accepted unchecked.

#![warn(missing_docs)]

mod checks;
mod decode;
mod documents;
mod schema;
mod v1alpha1;
mod yaml;

use std::fmt;
use std::fmt::Write as _;

/// Largest config [`validate`] reads: 1 MiB (Talos' own limit on the config is similar).
pub const MAX_CONFIG_BYTES: usize = 1024 * 1024;

/// The Talos release line the config is validated for: the version of the machine that will
/// receive it (its `Kubernetes` support range, the document kinds it knows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Contract {
    /// Talos v1.12.x (Kubernetes 1.30 to 1.35).
    V1_12,
    /// Talos v1.13.x (Kubernetes 1.31 to 1.36; adds the `RegistryMirrorConfig` document).
    V1_13,
}

/// A Talos version [`Contract::from_version`] does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "talos version {version:?} is not supported by the validator (supported: v1.12.x, v1.13.x)"
)]
pub struct UnsupportedVersion {
    /// The rejected input.
    pub version: String,
}

impl Contract {
    /// `v1.13.8`, `1.13`, `v1.12.0-beta.1` → the contract of that release line.
    pub fn from_version(version: &str) -> Result<Self, UnsupportedVersion> {
        let unsupported = || UnsupportedVersion {
            version: version.to_owned(),
        };
        let rest = version.strip_prefix('v').unwrap_or(version);
        let mut parts = rest.split(['.', '-']);
        match (parts.next(), parts.next()) {
            (Some("1"), Some("12")) => Ok(Self::V1_12),
            (Some("1"), Some("13")) => Ok(Self::V1_13),
            _ => Err(unsupported()),
        }
    }

    /// The minor version (12, 13).
    pub fn minor(self) -> u32 {
        match self {
            Self::V1_12 => 12,
            Self::V1_13 => 13,
        }
    }

    /// `v1.12`, `v1.13`.
    pub fn label(self) -> &'static str {
        match self {
            Self::V1_12 => "v1.12",
            Self::V1_13 => "v1.13",
        }
    }

    /// The Kubernetes versions this Talos line runs, inclusive (Talos' `compatibility`
    /// package: `MinimumKubernetesVersion`, `MaximumKubernetesVersion`).
    pub fn kubernetes_versions(self) -> ((u64, u64, u64), (u64, u64, u64)) {
        match self {
            Self::V1_12 => ((1, 30, 0), (1, 35, 99)),
            Self::V1_13 => ((1, 31, 0), (1, 36, 99)),
        }
    }
}

/// Which document a problem is in: `apiVersion`, `kind`, `name` as Talos identifies it (the
/// legacy document is `v1alpha1` with an empty kind), and the line it starts on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DocumentRef {
    /// `v1alpha1` (also for the legacy document), or empty if missing.
    pub api_version: String,
    /// The typed document's kind; empty for the legacy `v1alpha1` document.
    pub kind: String,
    /// A named document's `name`.
    pub name: Option<String>,
    /// 1-based line of the document's first key.
    pub line: usize,
}

impl DocumentRef {
    fn stream(line: usize) -> Self {
        Self {
            api_version: String::new(),
            kind: String::new(),
            name: None,
            line,
        }
    }

    fn same_as(&self, other: &Self) -> bool {
        self.api_version == other.api_version && self.kind == other.kind && self.name == other.name
    }

    /// Talos' `apiVersion/kind/name` form of the id (kind `v1alpha1` for the legacy document).
    pub fn triple(&self) -> String {
        let kind = if self.kind.is_empty() && self.api_version == "v1alpha1" {
            "v1alpha1"
        } else {
            &self.kind
        };
        let api_version = if self.kind.is_empty() {
            ""
        } else {
            &self.api_version
        };
        format!(
            "{api_version}/{kind}/{}",
            self.name.as_deref().unwrap_or_default()
        )
    }

    /// A short label: `v1alpha1`, `HostnameConfig`, `RegistryMirrorConfig/ghcr.io`.
    pub fn label(&self) -> String {
        match (self.kind.as_str(), &self.name) {
            ("", _) if self.api_version == "v1alpha1" => "v1alpha1".to_owned(),
            ("", _) => format!("document at line {}", self.line),
            (kind, Some(name)) => format!("{kind}/{name}"),
            (kind, None) => kind.to_owned(),
        }
    }
}

/// What kind of problem, from the decode phase (syntax to wrong type) or the validate phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProblemKind {
    /// Not YAML, or a document that is not a mapping.
    Syntax,
    /// Missing or unknown `kind`/`apiVersion` ("not registered").
    UnknownDocument,
    /// The same apiVersion/kind/name twice.
    DuplicateDocument,
    /// A key not in the allow-list of its section.
    UnknownKey,
    /// A value that does not decode into the field's type.
    WrongType,
    /// A required document, section or field is missing.
    Missing,
    /// A value or combination Talos' validation refuses.
    Invalid,
    /// Two documents set the same thing.
    Conflict,
}

impl ProblemKind {
    /// Whether the problem comes from decoding (Talos: "failed to parse config").
    pub fn is_decode(self) -> bool {
        matches!(
            self,
            Self::Syntax
                | Self::UnknownDocument
                | Self::DuplicateDocument
                | Self::UnknownKey
                | Self::WrongType
        )
    }

    /// Stable CamelCase reason, for metrics and conditions.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Syntax => "InvalidYaml",
            Self::UnknownDocument => "UnknownDocument",
            Self::DuplicateDocument => "DuplicateDocument",
            Self::UnknownKey => "UnknownKey",
            Self::WrongType => "WrongType",
            Self::Missing => "MissingField",
            Self::Invalid => "InvalidField",
            Self::Conflict => "ConflictingDocuments",
        }
    }
}

/// One thing wrong with a config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The document it is in.
    pub document: DocumentRef,
    /// The field path, e.g. `.cluster.network.cni.name` (empty: the document itself).
    pub path: String,
    /// The line of the offending key or value, when known.
    pub line: Option<usize>,
    /// The category.
    pub kind: ProblemKind,
    /// What is wrong, in Talos' words (never the value: configs hold secrets).
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.document.label())?;
        if !self.path.is_empty() {
            write!(f, ": {}", self.path)?;
        }
        write!(f, ": {}", self.message)?;
        if let Some(line) = self.line {
            write!(f, " (line {line})")?;
        }
        Ok(())
    }
}

/// `machine.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MachineType {
    /// `init` (legacy control plane).
    Init,
    /// `controlplane`.
    ControlPlane,
    /// `worker` (or the legacy `join`).
    Worker,
}

impl MachineType {
    /// Whether the machine runs the control plane.
    pub fn is_control_plane(self) -> bool {
        matches!(self, Self::Init | Self::ControlPlane)
    }
}

/// A config that passed: its machine type, its documents in order, and Talos' warnings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Validated {
    /// `machine.type` of the `v1alpha1` document.
    pub machine_type: MachineType,
    /// Every document, in order.
    pub documents: Vec<DocumentRef>,
    /// Warnings Talos returns alongside success (e.g. a legacy `join` machine type).
    pub warnings: Vec<String>,
}

/// Validates a machine config for the Talos line `contract`, as Talos' maintenance-mode
/// `ApplyConfiguration` would (decode, then validate for the `metal` platform), plus the
/// runtime-fatal checks noted in the README. Returns every problem found in the failing
/// phase.
pub fn validate(yaml: &[u8], contract: Contract) -> Result<Validated, Vec<Problem>> {
    let whole = |kind, message: String| {
        vec![Problem {
            document: DocumentRef::stream(1),
            path: String::new(),
            line: None,
            kind,
            message,
        }]
    };
    if yaml.len() > MAX_CONFIG_BYTES {
        return Err(whole(
            ProblemKind::Syntax,
            format!(
                "config is {} bytes, more than the {MAX_CONFIG_BYTES} allowed",
                yaml.len()
            ),
        ));
    }
    let Ok(text) = std::str::from_utf8(yaml) else {
        return Err(whole(ProblemKind::Syntax, "config is not UTF-8".to_owned()));
    };
    let decoded = decode::decode(text, contract)?;
    let mut problems = Vec::new();
    let mut warnings = Vec::new();
    let legacy = decoded.iter().find(|d| d.kind.is_none());
    let machine_type = if let Some(doc) = legacy {
        v1alpha1::validate(doc, contract, &mut problems, &mut warnings)
    } else {
        problems.push(Problem {
            document: DocumentRef::stream(1),
            path: String::new(),
            line: None,
            kind: ProblemKind::Missing,
            message: "the v1alpha1 document is required: without it the config is not \
                      complete for boot (Talos would stay in maintenance mode)"
                .to_owned(),
        });
        None
    };
    for doc in decoded.iter().filter(|d| d.kind.is_some()) {
        documents::validate(doc, legacy, &mut problems);
    }
    match machine_type {
        Some(machine_type) if problems.is_empty() => Ok(Validated {
            machine_type,
            documents: decoded.into_iter().map(|d| d.id).collect(),
            warnings,
        }),
        _ => Err(problems),
    }
}

/// One Talos-shaped message for a set of problems (as a gRPC status would carry it):
/// `failed to parse config: error decoding document /v1alpha1/ (line 1): ...` for decode
/// problems, `configuration validation failed: 2 errors occurred: ...` otherwise.
pub fn describe(problems: &[Problem]) -> String {
    if problems.iter().any(|p| p.kind.is_decode()) {
        let parts: Vec<String> = problems
            .iter()
            .map(|p| {
                let mut s = format!(
                    "error decoding document {} (line {}): ",
                    p.document.triple(),
                    p.document.line
                );
                if !p.path.is_empty() {
                    s.push_str(&p.path);
                    s.push_str(": ");
                }
                s.push_str(&p.message);
                if let Some(line) = p
                    .line
                    .filter(|l| *l != p.document.line || !p.path.is_empty())
                {
                    let _ = write!(s, " (line {line})");
                }
                s
            })
            .collect();
        return format!("failed to parse config: {}", parts.join("; "));
    }
    let count = problems.len();
    let mut out = format!(
        "configuration validation failed: {count} error{} occurred:",
        if count == 1 { "" } else { "s" }
    );
    for p in problems {
        out.push_str("\n\t* ");
        out.push_str(&p.to_string());
    }
    out.push_str("\n\n");
    out
}

/// The allowed key paths of the `v1alpha1` document (`"v1alpha1"`) or of a modeled kind,
/// e.g. `machine.install.diskSelector.size`; list items add `[]`, map values `.*`.
pub fn allowed_keys(kind: &str) -> Option<Vec<String>> {
    let ty = if kind == "v1alpha1" {
        &schema::CONFIG_TY
    } else {
        schema::KINDS.iter().find(|k| k.name == kind)?.ty
    };
    let mut out = Vec::new();
    schema::paths(ty, "", &mut out);
    Some(out)
}

/// The typed document kinds the validator models (decodes strictly and validates).
pub fn modeled_kinds() -> Vec<&'static str> {
    schema::KINDS.iter().map(|k| k.name).collect()
}

#[cfg(test)]
mod tests;
