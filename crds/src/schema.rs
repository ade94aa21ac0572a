//! Building blocks of the generated OpenAPI schemas: patterns, limits and CEL rules that more
//! than one kind uses.
//!
//! Every CEL message names the field it is about, so the API server's answer is actionable
//! whatever path it reports. Strings and lists that CEL rules read carry `maxLength` and
//! `maxItems`, which keeps the rules inside the API server's cost budget.

use kube::core::{Reason, Rule};
use schemars::{Schema, SchemaGenerator, json_schema};

/// A DNS-1123 label: lowercase alphanumerics and `-`, starting and ending alphanumeric.
pub const DNS1123_LABEL: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// A DNS-1123 label, or the empty string.
pub const DNS1123_LABEL_OR_EMPTY: &str = "^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$";

/// A DNS-1123 subdomain: dot-separated DNS-1123 labels (the rule for object names).
pub const DNS1123_SUBDOMAIN: &str =
    "^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// A Talos or Kubernetes version: `v1.2.3`, optionally with a pre-release suffix.
pub const VERSION: &str = "^v[0-9]+[.][0-9]+[.][0-9]+(-[0-9A-Za-z.-]+)?$";

/// A Helm chart version: semantic version with an optional leading `v`.
pub const CHART_VERSION: &str =
    "^v?[0-9]+[.][0-9]+[.][0-9]+(-[0-9A-Za-z.-]+)?([+][0-9A-Za-z.-]+)?$";

/// A Helm repository URL.
pub const CHART_REPO: &str = "^(https?|oci)://[^\\s]+$";

/// A Kubernetes kind: PascalCase.
pub const KIND: &str = "^[A-Z][A-Za-z0-9]*$";

/// An `apiVersion`: `v1`, or `<group>/<version>`.
pub const API_VERSION: &str = "^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?v[0-9]+((alpha|beta)[0-9]+)?$";

/// CEL: `self` is an IP address or a DNS name (either case). A dotted string of digits that
/// is not an IP (`10.0.0.256`) is a typo, not a host name, and is refused.
pub const IP_OR_DNS_NAME: &str = "isIP(self) || (self.matches('^[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?([.][A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*$') && !self.matches('^[0-9.]+$'))";

/// CEL: the release of an Addon (`spec.releaseName`, else `metadata.name`) is a built-in.
/// Keep the list in step with [`BuiltinAddon`](crate::v1alpha2::BuiltinAddon); a unit test
/// checks it.
pub const ADDON_IS_BUILTIN: &str = "((has(self.spec.releaseName) ? self.spec.releaseName : self.metadata.name) in ['gateway-api-crds', 'cilium', 'cert-manager'])";

/// The longest object name that is also a valid label value and host name.
pub const MAX_LABEL_LEN: u32 = 63;

/// The longest object name (a DNS-1123 subdomain).
pub const MAX_NAME_LEN: u32 = 253;

/// The longest Helm release name.
pub const MAX_RELEASE_LEN: u32 = 53;

/// A rule with a message.
pub fn rule(rule: &str, message: &str) -> Rule {
    Rule::new(rule).message(message)
}

/// A rule that reports a missing field at `field_path` (relative to the rule's `self`).
pub fn required_rule(rule: &str, field_path: &str, message: &str) -> Rule {
    Rule::new(rule)
        .message(message)
        .field_path(field_path)
        .reason(Reason::FieldValueRequired)
}

/// `type: object` that keeps every field it is given (Helm values).
pub fn preserve_unknown_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// The most machine-config patches one object carries.
pub const MAX_CONFIG_PATCHES: u32 = 16;

/// `configPatches`: Talos strategic merge patches, each one YAML document given as an
/// object (so admission already refuses a patch that is not a mapping). What they say is
/// checked after merging, by the bootstrapper's strict Talos validator.
pub fn config_patches(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": MAX_CONFIG_PATCHES,
        "items": {
            "type": "object",
            "minProperties": 1,
            "maxProperties": 32,
            "x-kubernetes-preserve-unknown-fields": true,
        },
    })
}

/// `spec.interfaces` of an Instance: addresses to dial, each at most once.
pub fn interface_addresses(_: &mut SchemaGenerator) -> Schema {
    address_set("spec.interfaces entries must be IP addresses or DNS names")
}

/// `spec.seed.talosAddresses` of a Zone: addresses to dial, each at most once.
pub fn seed_addresses(_: &mut SchemaGenerator) -> Schema {
    address_set("spec.seed.talosAddresses entries must be IP addresses or DNS names")
}

fn address_set(message: &str) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": 32,
        "x-kubernetes-list-type": "set",
        "items": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_NAME_LEN,
            "x-kubernetes-validations": [{ "rule": IP_OR_DNS_NAME, "message": message }],
        },
    })
}

/// A set of object names in the same namespace.
pub fn name_set(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": 32,
        "x-kubernetes-list-type": "set",
        "items": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_NAME_LEN,
            "pattern": DNS1123_SUBDOMAIN,
        },
    })
}
