//! The image map: which host files stand in for the files of a container image.
//!
//! There is no container runtime and no image store here, so an image is whatever the map
//! says it is: a set of in-image paths, each backed by a host file, plus the bits of the
//! image config a kubelet would take from the image (entrypoint, cmd, env, working dir,
//! user). Every mapped file is bind-mounted at its in-image path inside the pod's mount
//! namespace; the rest of the pod's file system is the host's.
//!
//! ```yaml
//! images:
//!   # No tag or digest: every tag and digest of the repository.
//!   - image: ghcr.io/kontinuum/kontinuum
//!     files:
//!       /usr/local/bin/instance-discovery: /work/main/target/debug/instance-discovery
//!       /usr/local/bin/helm: /root/.cache/kontinuum/testbed/<key>/bin/helm
//!     entrypoint: [/usr/local/bin/instance-discovery]
//!   # With a tag (or digest): exactly that reference; exact entries win.
//!   - image: busybox:1.36
//!     files: { /bin/sh: /bin/sh }
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The default `PATH` of an image that sets none (Docker's).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Errors reading an image map.
#[derive(Debug, thiserror::Error)]
pub enum ImageMapError {
    /// The file could not be read.
    #[error("reading image map {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a valid image map.
    #[error("parsing image map {path}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    /// An entry is invalid.
    #[error("image map entry {image}: {problem}")]
    Invalid {
        /// The entry's image.
        image: String,
        /// What is wrong.
        problem: String,
    },
}

impl ImageMapError {
    /// A stable CamelCase reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Read { .. } => "ImageMapUnreadable",
            Self::Parse { .. } => "ImageMapInvalid",
            Self::Invalid { .. } => "ImageMapEntryInvalid",
        }
    }
}

/// The whole map, as written in the file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageMap {
    /// One entry per image (repository, or exact reference).
    #[serde(default)]
    pub images: Vec<ImageEntry>,
}

/// One image.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ImageEntry {
    /// A repository (`ghcr.io/x/y`: any tag or digest) or an exact reference
    /// (`ghcr.io/x/y:1.2`, `ghcr.io/x/y@sha256:...`). Docker Hub short names are normalised
    /// (`busybox` is `docker.io/library/busybox`).
    pub image: String,
    /// In-image absolute path → host path. Relative host paths are relative to the map
    /// file's directory.
    #[serde(default)]
    pub files: BTreeMap<String, PathBuf>,
    /// The image's ENTRYPOINT.
    #[serde(default)]
    pub entrypoint: Vec<String>,
    /// The image's CMD.
    #[serde(default)]
    pub cmd: Vec<String>,
    /// The image's environment (defaults to `PATH` = [`DEFAULT_PATH`]).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The image's working directory (default `/`).
    #[serde(default)]
    pub working_dir: Option<String>,
    /// The image's numeric USER (default 0).
    #[serde(default)]
    pub user: Option<u32>,
}

/// A container's program, resolved through the map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// The host file to execute.
    pub program: PathBuf,
    /// The full argv (argv\[0\] as the container gave it).
    pub argv: Vec<String>,
    /// Every file of the image: in-image path → host path.
    pub files: BTreeMap<String, PathBuf>,
    /// The image's environment (with `PATH` defaulted).
    pub env: BTreeMap<String, String>,
    /// The image's working directory.
    pub working_dir: String,
    /// The image's user.
    pub user: u32,
}

/// Why a container could not be resolved.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// No entry for the image.
    #[error("image {0} is not in the hostlet's image map")]
    ImageNotMapped(String),
    /// Neither the container nor the image says what to run.
    #[error("image {0} has no entrypoint and the container no command")]
    NoCommand(String),
    /// The program is not a file of the image.
    #[error("executable {program} not found in image {image} (not in the image map)")]
    CommandNotMapped {
        /// The image.
        image: String,
        /// The program as given.
        program: String,
    },
}

impl ResolveError {
    /// The container's waiting reason, as a kubelet would report it.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::ImageNotMapped(_) => "ImageNotMapped",
            Self::NoCommand(_) | Self::CommandNotMapped { .. } => "CreateContainerError",
        }
    }
}

impl ImageMap {
    /// Reads and checks a YAML (or JSON) map, making relative host paths absolute.
    pub fn load(path: &Path) -> Result<Self, ImageMapError> {
        let text = std::fs::read_to_string(path).map_err(|source| ImageMapError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let base = path.parent().unwrap_or_else(|| Path::new("/"));
        Self::parse(&text, base).map_err(|e| match e {
            ParseError::Syntax(source) => ImageMapError::Parse {
                path: path.to_path_buf(),
                source,
            },
            ParseError::Invalid(e) => e,
        })
    }

    fn parse(text: &str, base: &Path) -> Result<Self, ParseError> {
        let mut map: ImageMap =
            serde_saphyr::from_str(text).map_err(|e| ParseError::Syntax(Box::new(e)))?;
        for entry in &mut map.images {
            if entry.image.trim().is_empty() {
                return Err(ParseError::Invalid(ImageMapError::Invalid {
                    image: entry.image.clone(),
                    problem: "empty image".into(),
                }));
            }
            for (inside, host) in &mut entry.files {
                if !inside.starts_with('/') {
                    return Err(ParseError::Invalid(ImageMapError::Invalid {
                        image: entry.image.clone(),
                        problem: format!("in-image path {inside} is not absolute"),
                    }));
                }
                if host.is_relative() {
                    *host = base.join(&*host);
                }
            }
        }
        Ok(map)
    }

    /// Parses a map from text (relative host paths are relative to `base`).
    pub fn from_str_in(text: &str, base: &Path) -> Result<Self, ImageMapError> {
        Self::parse(text, base).map_err(|e| match e {
            ParseError::Syntax(source) => ImageMapError::Parse {
                path: PathBuf::from("<inline>"),
                source,
            },
            ParseError::Invalid(e) => e,
        })
    }

    /// The entry for an image reference: an exact entry first, then a repository entry.
    pub fn entry(&self, image: &str) -> Option<&ImageEntry> {
        let wanted = Reference::parse(image);
        let exact = self.images.iter().find(|e| {
            let r = Reference::parse(&e.image);
            r.has_version() && r == wanted
        });
        exact.or_else(|| {
            self.images.iter().find(|e| {
                let r = Reference::parse(&e.image);
                !r.has_version() && r.repository == wanted.repository
            })
        })
    }

    /// Resolves a container's image, `command` and `args` to a host program and argv, as a
    /// runtime combines them with the image's ENTRYPOINT and CMD. `path` is the container's
    /// `PATH` (for a program given without a slash).
    pub fn resolve(
        &self,
        image: &str,
        command: &[String],
        args: &[String],
        path: Option<&str>,
    ) -> Result<Resolved, ResolveError> {
        let entry = self
            .entry(image)
            .ok_or_else(|| ResolveError::ImageNotMapped(image.to_string()))?;
        // Kubernetes' rules: command replaces ENTRYPOINT (and drops CMD); args replace CMD.
        let mut full: Vec<String> = if command.is_empty() {
            entry.entrypoint.clone()
        } else {
            command.to_vec()
        };
        if !args.is_empty() {
            full.extend(args.iter().cloned());
        } else if command.is_empty() {
            full.extend(entry.cmd.iter().cloned());
        }
        let first = full
            .first()
            .ok_or_else(|| ResolveError::NoCommand(image.to_string()))?;
        let mut env = entry.env.clone();
        env.entry("PATH".into())
            .or_insert_with(|| DEFAULT_PATH.to_string());
        let search = path
            .or_else(|| env.get("PATH").map(String::as_str))
            .unwrap_or(DEFAULT_PATH);
        let program = find_program(&entry.files, first, search).ok_or_else(|| {
            ResolveError::CommandNotMapped {
                image: image.to_string(),
                program: first.clone(),
            }
        })?;
        Ok(Resolved {
            program,
            argv: full,
            files: entry.files.clone(),
            env,
            working_dir: entry.working_dir.clone().unwrap_or_else(|| "/".into()),
            user: entry.user.unwrap_or(0),
        })
    }
}

enum ParseError {
    Syntax(Box<serde_saphyr::Error>),
    Invalid(ImageMapError),
}

/// The host file behind `program`: a mapped in-image path, or (without a slash) the first
/// mapped `<dir>/<program>` along `path`.
fn find_program(files: &BTreeMap<String, PathBuf>, program: &str, path: &str) -> Option<PathBuf> {
    if program.contains('/') {
        let normal = normalise(program);
        return files.get(&normal).cloned();
    }
    path.split(':')
        .filter(|d| d.starts_with('/'))
        .find_map(|dir| files.get(&normalise(&format!("{dir}/{program}"))).cloned())
}

/// Collapses `//` and `/./` (no `..` handling: an image path with `..` is not mapped).
fn normalise(path: &str) -> String {
    let parts: Vec<&str> = path
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    format!("/{}", parts.join("/"))
}

/// An image reference split into repository and tag/digest, Docker Hub names normalised.
#[derive(Debug, PartialEq, Eq)]
struct Reference {
    repository: String,
    tag: Option<String>,
    digest: Option<String>,
}

impl Reference {
    fn parse(image: &str) -> Self {
        let image = image.trim();
        let (rest, digest) = match image.split_once('@') {
            Some((r, d)) => (r, Some(d.to_string())),
            None => (image, None),
        };
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (repo, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => (
                &rest[..last_slash + i],
                Some(rest[last_slash + i + 1..].to_string()),
            ),
            None => (rest, None),
        };
        Self {
            repository: normalise_repository(repo),
            tag,
            digest,
        }
    }

    fn has_version(&self) -> bool {
        self.tag.is_some() || self.digest.is_some()
    }
}

fn normalise_repository(repo: &str) -> String {
    let (first, rest) = repo.split_once('/').unwrap_or(("", repo));
    let is_registry =
        !first.is_empty() && (first.contains('.') || first.contains(':') || first == "localhost");
    if is_registry {
        repo.to_string()
    } else if first.is_empty() {
        format!("docker.io/library/{rest}")
    } else {
        format!("docker.io/{repo}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> ImageMap {
        ImageMap::from_str_in(
            "images:
  - image: ghcr.io/kontinuum/kontinuum
    files:
      /usr/local/bin/instance-discovery: /work/main/target/debug/instance-discovery
      /usr/local/bin/helm: bin/helm
    entrypoint: [/usr/local/bin/instance-discovery]
    cmd: [--help]
  - image: ghcr.io/kontinuum/kontinuum:old
    files: { /bin/old: /bin/true }
    entrypoint: [/bin/old]
  - image: busybox
    files: { /bin/sh: /bin/sh, /bin/sleep: /bin/sleep }
    env: { PATH: /bin }
",
            Path::new("/maps"),
        )
        .unwrap()
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| (*x).to_string()).collect()
    }

    #[test]
    fn a_repository_entry_matches_any_tag_and_digest() {
        let m = map();
        for image in [
            "ghcr.io/kontinuum/kontinuum",
            "ghcr.io/kontinuum/kontinuum:1.2.3",
            "ghcr.io/kontinuum/kontinuum@sha256:abcd",
        ] {
            let r = m.resolve(image, &[], &[], None).unwrap();
            assert_eq!(
                r.program,
                PathBuf::from("/work/main/target/debug/instance-discovery")
            );
            assert_eq!(r.argv, s(&["/usr/local/bin/instance-discovery", "--help"]));
            assert_eq!(
                r.files["/usr/local/bin/helm"],
                PathBuf::from("/maps/bin/helm")
            );
        }
    }

    #[test]
    fn an_exact_entry_wins_over_the_repository_entry() {
        let r = map()
            .resolve("ghcr.io/kontinuum/kontinuum:old", &[], &[], None)
            .unwrap();
        assert_eq!(r.program, PathBuf::from("/bin/true"));
    }

    #[test]
    fn docker_hub_names_are_normalised_and_path_is_searched() {
        let m = map();
        for image in [
            "busybox",
            "busybox:1.36",
            "docker.io/library/busybox:latest",
        ] {
            let r = m
                .resolve(image, &s(&["sh", "-c"]), &s(&["echo"]), None)
                .unwrap();
            assert_eq!(r.program, PathBuf::from("/bin/sh"));
            assert_eq!(r.argv, s(&["sh", "-c", "echo"]));
            assert_eq!(r.env["PATH"], "/bin");
        }
        // The container's PATH wins over the image's.
        let err = m
            .resolve("busybox", &s(&["sh"]), &[], Some("/usr/bin"))
            .unwrap_err();
        assert_eq!(err.reason(), "CreateContainerError");
    }

    #[test]
    fn command_and_args_combine_with_entrypoint_and_cmd_as_kubernetes_says() {
        let m = map();
        let img = "ghcr.io/kontinuum/kontinuum";
        // args only: ENTRYPOINT + args.
        let r = m.resolve(img, &[], &s(&["--x"]), None).unwrap();
        assert_eq!(r.argv, s(&["/usr/local/bin/instance-discovery", "--x"]));
        // command only: CMD is dropped.
        let r = m
            .resolve(img, &s(&["/usr/local/bin/helm"]), &[], None)
            .unwrap();
        assert_eq!(r.argv, s(&["/usr/local/bin/helm"]));
        assert_eq!(r.program, PathBuf::from("/maps/bin/helm"));
    }

    #[test]
    fn unmapped_images_and_programs_are_errors_naming_them() {
        let m = map();
        let err = m.resolve("quay.io/x/y:1", &[], &[], None).unwrap_err();
        assert_eq!(err.reason(), "ImageNotMapped");
        assert!(err.to_string().contains("quay.io/x/y:1"));
        let err = m
            .resolve("busybox", &s(&["/bin/cat"]), &[], None)
            .unwrap_err();
        assert!(err.to_string().contains("/bin/cat"), "{err}");
        let err = m.resolve("busybox", &[], &[], None).unwrap_err();
        assert!(matches!(err, ResolveError::NoCommand(_)));
    }

    #[test]
    fn relative_in_image_paths_are_rejected() {
        let err = ImageMap::from_str_in(
            "images: [{image: x, files: {bin/sh: /bin/sh}}]",
            Path::new("/"),
        )
        .unwrap_err();
        assert_eq!(err.reason(), "ImageMapEntryInvalid");
    }
}
