//! Writes one YAML file per CRD into the directory given as the only argument (default: the
//! current directory), and removes files of ours that no kind generates any more.
//!
//! `cargo run -p kontinuum-crds --bin crdgen -- crds`

use std::error::Error;
use std::path::{Path, PathBuf};
use std::{env, fs, io};

fn main() -> Result<(), Box<dyn Error>> {
    let dir = PathBuf::from(env::args_os().nth(1).unwrap_or_else(|| ".".into()));
    fs::create_dir_all(&dir).map_err(|e| context("creating", &dir, &e))?;

    let crds = kontinuum_crds::all_crds();
    let wanted: Vec<String> = crds.iter().map(kontinuum_crds::file_name).collect();
    for entry in fs::read_dir(&dir).map_err(|e| context("listing", &dir, &e))? {
        let path = entry?.path();
        if is_ours(&path) && !wanted.iter().any(|w| path.ends_with(w)) {
            fs::remove_file(&path).map_err(|e| context("removing", &path, &e))?;
        }
    }
    for (crd, name) in crds.iter().zip(&wanted) {
        let path = dir.join(name);
        let yaml = kontinuum_crds::render(crd)?;
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
