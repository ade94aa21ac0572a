//! The committed CRD YAML must be exactly what the Rust types generate.

use std::fs;
use std::path::Path;

const REGENERATE: &str =
    "run `make crds` (cargo run -p kontinuum-crds --bin crdgen -- crds) and commit the result";

#[test]
fn committed_crds_match_the_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut stale = Vec::new();
    for crd in kontinuum_crds::all_crds() {
        let name = kontinuum_crds::file_name(&crd);
        let generated = kontinuum_crds::render(&crd).expect("render CRD");
        match fs::read_to_string(dir.join(&name)) {
            Err(err) => stale.push(format!("{name}: cannot read it ({err})")),
            Ok(committed) if committed != generated => {
                let line = committed
                    .lines()
                    .zip(generated.lines())
                    .position(|(a, b)| a != b)
                    .unwrap_or_else(|| committed.lines().count().min(generated.lines().count()));
                stale.push(format!("{name}: differs from line {}", line + 1));
            }
            Ok(_) => {}
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
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let wanted: Vec<String> = kontinuum_crds::all_crds()
        .iter()
        .map(kontinuum_crds::file_name)
        .collect();
    let stray: Vec<String> = fs::read_dir(dir)
        .expect("list the crate directory")
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .filter_map(|path| Some(path.file_name()?.to_str()?.to_owned()))
        .filter(|name| name.starts_with("kontinuum.sh_") && !wanted.contains(name))
        .collect();
    assert!(stray.is_empty(), "stray CRD files {stray:?}, {REGENERATE}");
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
