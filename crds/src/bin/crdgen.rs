//! Writes one YAML file per CRD into each directory given as an argument (default: the
//! current directory) and, always, into the hub chart's `charts/kontinuum/crds/` (Helm
//! installs the CRDs from there, so it must hold exactly what the types generate; there each
//! file opens its document with `---`); removes files of ours that no kind generates any
//! more.
//!
//! `cargo run -p kontinuum-crds --bin crdgen -- crds`

use std::error::Error;
use std::path::{Path, PathBuf};
use std::{env, fs, io};

/// The hub chart's CRD directory, relative to this crate.
const CHART_CRDS: &str = "../charts/kontinuum/crds";

fn main() -> Result<(), Box<dyn Error>> {
    let mut dirs: Vec<PathBuf> = env::args_os().skip(1).map(PathBuf::from).collect();
    if dirs.is_empty() {
        dirs.push(PathBuf::from("."));
    }

    let crds = kontinuum_crds::all_crds();
    let wanted: Vec<String> = crds.iter().map(kontinuum_crds::file_name).collect();
    let mut files = Vec::with_capacity(crds.len());
    for crd in &crds {
        files.push(kontinuum_crds::render(crd)?);
    }
    for dir in &dirs {
        write_dir(dir, &wanted, &files)?;
    }
    // `helm show crds` concatenates the chart's CRD files as they are: each must open its
    // document with `---`, or `helm show crds | kubectl apply -f -` sees one document.
    let chart_files: Vec<String> = files.iter().map(|f| format!("---\n{f}")).collect();
    write_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join(CHART_CRDS),
        &wanted,
        &chart_files,
    )?;
    Ok(())
}

/// Writes `files` (named `wanted`) into `dir` and removes stray files of ours there.
fn write_dir(dir: &Path, wanted: &[String], files: &[String]) -> io::Result<()> {
    fs::create_dir_all(dir).map_err(|e| context("creating", dir, &e))?;
    for entry in fs::read_dir(dir).map_err(|e| context("listing", dir, &e))? {
        let path = entry?.path();
        if is_ours(&path) && !wanted.iter().any(|w| path.ends_with(w)) {
            fs::remove_file(&path).map_err(|e| context("removing", &path, &e))?;
        }
    }
    for (name, yaml) in wanted.iter().zip(files) {
        let path = dir.join(name);
        fs::write(&path, yaml).map_err(|e| context("writing", &path, &e))?;
    }
    Ok(())
}

/// A file crdgen writes: `<group>_<plural>.yaml`.
fn is_ours(path: &Path) -> bool {
    let prefix = format!("{}_", kontinuum_crds::GROUP);
    path.extension().is_some_and(|e| e == "yaml")
        && path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(&prefix))
}

fn context(action: &str, path: &Path, err: &io::Error) -> io::Error {
    io::Error::new(err.kind(), format!("{action} {}: {err}", path.display()))
}
