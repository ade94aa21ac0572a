//! The committed CRD YAML, in `crds/` and in the hub chart's `charts/kontinuum/crds/`, must be
//! exactly what the Rust types generate.

use std::fs;
use std::path::{Path, PathBuf};

const REGENERATE: &str =
    "run `make crds` (cargo run -p kontinuum-crds --bin crdgen -- crds) and commit the result";

/// Every directory holding a copy of the generated CRDs, with its path in the workspace and
/// what precedes each rendered CRD there: this crate's, and the hub chart's, whose files open
/// their document with `---` (`helm show crds` concatenates them as they are).
fn copies() -> [(&'static str, PathBuf, &'static str); 2] {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    [
        ("crds", dir.to_path_buf(), ""),
        (
            "charts/kontinuum/crds",
            dir.join("../charts/kontinuum/crds"),
            "---\n",
        ),
    ]
}

#[test]
fn committed_crds_match_the_types() {
    let mut stale = Vec::new();
    for (label, dir, prefix) in copies() {
        for crd in kontinuum_crds::all_crds() {
            let name = kontinuum_crds::file_name(&crd);
            let path = dir.join(&name);
            let shown = format!("{label}/{name}");
            let generated = format!(
                "{prefix}{}",
                kontinuum_crds::render(&crd).expect("render CRD")
            );
            match fs::read_to_string(&path) {
                Err(err) => stale.push(format!("{shown}: cannot read it ({err})")),
                Ok(committed) if committed != generated => {
                    let line = committed
                        .lines()
                        .zip(generated.lines())
                        .position(|(a, b)| a != b)
                        .unwrap_or_else(|| {
                            committed.lines().count().min(generated.lines().count())
                        });
                    stale.push(format!("{shown}: differs from line {}", line + 1));
                }
                Ok(_) => {}
            }
        }
    }
    assert!(
        stale.is_empty(),
        "CRD YAML is stale, {REGENERATE}:\n  {}",
        stale.join("\n  ")
    );
}

#[test]
fn no_stray_crd_files() {
    let wanted: Vec<String> = kontinuum_crds::all_crds()
        .iter()
        .map(kontinuum_crds::file_name)
        .collect();
    for (label, dir, _) in copies() {
        let stray: Vec<String> = fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("list {}: {e}", dir.display()))
            .map(|entry| entry.expect("directory entry").path())
            .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
            .filter_map(|path| Some(path.file_name()?.to_str()?.to_owned()))
            .filter(|name| name.starts_with("kontinuum.sh_") && !wanted.contains(name))
            .collect();
        assert!(
            stray.is_empty(),
            "stray CRD files in {label}: {stray:?}, {REGENERATE}"
        );
    }
}

#[test]
fn the_chart_holds_nothing_but_the_generated_crds() {
    // Helm installs every file of a chart's crds/ directory: anything else there would be
    // installed as a CRD too.
    let [_, (label, dir, _)] = copies();
    let wanted: Vec<String> = kontinuum_crds::all_crds()
        .iter()
        .map(kontinuum_crds::file_name)
        .collect();
    let other: Vec<String> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("list {}: {e}", dir.display()))
        .filter_map(|entry| Some(entry.ok()?.file_name().to_str()?.to_owned()))
        .filter(|name| !wanted.contains(name))
        .collect();
    assert!(
        other.is_empty(),
        "{label} holds files crdgen does not write: {other:?}"
    );
}

#[test]
fn generated_yaml_parses_back_into_the_same_crds() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    for crd in kontinuum_crds::all_crds() {
        let yaml = kontinuum_crds::render(&crd).expect("render CRD");
        let parsed: CustomResourceDefinition = serde_saphyr::from_str(&yaml).expect("parse CRD");
        assert_eq!(parsed, crd);
    }
}
