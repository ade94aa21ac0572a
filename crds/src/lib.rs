//! The Kontinuum API: every custom resource kind of group `kontinuum.sh`, the vocabulary the
//! operators share (condition types and reasons, labels, finalizers, object names), the
//! condition helpers, and the generated CRD YAML.
//!
//! | Kind | Short name | What it is |
//! | --- | --- | --- |
//! | [`Zone`](v1alpha2::Zone) | `zn` | identity of one zone, and the GitOps fan-out source |
//! | [`Instance`](v1alpha2::Instance) | `inst` | one machine, booted into Talos maintenance mode |
//! | [`InstancePool`](v1alpha2::InstancePool) | `ipool` | claims `Discovered` Instances up to `spec.replicas` |
//! | [`TalosCluster`](v1alpha2::TalosCluster) | `tc` | a Talos Kubernetes cluster built from pools |
//! | [`Addon`](v1alpha2::Addon) | `ao` | one Helm release (or applied chart) on a TalosCluster |
//! | [`Kontinuum`](v1alpha2::Kontinuum) | `kon` | registry entry of one running Kontinuum installation |
//!
//! Every kind is namespaced, has a status subresource, belongs to the category `kontinuum`
//! (`kubectl get kontinuum` lists them all; use `kubectl get kontinuums` for the registry
//! kind alone) and carries standard `metav1.Condition`s with a `Ready` summary.
//!
//! Validation lives in the schema wherever it can (OpenAPI patterns and limits, CEL rules):
//! a bad object is refused by the API server with a message that names the field.
#![warn(missing_docs)]
// Doc comments here double as CRD descriptions (`kubectl explain`), where kind names such as
// TalosCluster are plain words, not code.
#![allow(clippy::doc_markdown)]
// kube-derive's repeated `printcolumn(name = .., type_ = ..)` items are not duplicates.
#![allow(clippy::duplicated_attributes)]

pub mod conditions;
pub mod conversion;
mod crd;
pub mod finalizers;
pub mod labels;
pub mod names;
pub mod reasons;
mod schema;
pub mod v1alpha1;
pub mod v1alpha2;

pub use crd::{RenderError, all_crds, file_name, kontinuum_crd, render};
pub use schema::MAX_CONFIG_PATCHES;

/// The API group of every Kontinuum kind.
pub const GROUP: &str = "kontinuum.sh";

/// The storage version of every Kontinuum kind.
pub const STORAGE_VERSION: &str = "v1alpha2";

/// The category every Kontinuum kind belongs to: `kubectl get kontinuum` lists them all.
pub const CATEGORY: &str = "kontinuum";
