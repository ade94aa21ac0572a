//! A pod's volumes, materialised under `<pod dir>/volumes/<name>` as a kubelet does:
//! Secret, ConfigMap, downward API and projected volumes (ServiceAccount tokens from the
//! TokenRequest API, bound to the pod and refreshed at 80% of their life) are written file
//! by file (atomically, with their modes and fsGroup) and always mounted read-only;
//! emptyDir is an empty world-writable directory; hostPath is the host path itself.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, DownwardAPIVolumeFile, KeyToPath, Secret, ServiceAccount, Volume,
};
use kube::api::{Api, PostParams};

use crate::env::{PodFacts, field_value, resource_value};
use crate::{Error, api};

/// The default mode of Secret, ConfigMap, downward API and projected files.
const DEFAULT_MODE: i32 = 0o644;
/// How often volume contents are re-synced (Secret and ConfigMap updates, tokens).
pub const SYNC_PERIOD: Duration = Duration::from_secs(60);
/// A token is refreshed after 80% of its life, or after a day, whichever is first.
const MAX_TOKEN_AGE: Duration = Duration::from_secs(24 * 3600);

/// Why a volume could not be set up; the pod stays `ContainerCreating` with this message.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// A referenced object does not exist.
    #[error("MountVolume.SetUp failed for volume \"{volume}\": {kind} \"{name}\" not found")]
    NotFound {
        /// The volume.
        volume: String,
        /// `secret` or `configmap`.
        kind: &'static str,
        /// The object.
        name: String,
    },
    /// A key listed in `items` does not exist.
    #[error("MountVolume.SetUp failed for volume \"{volume}\": key {key} not found in {name}")]
    KeyNotFound {
        /// The volume.
        volume: String,
        /// The object.
        name: String,
        /// The key.
        key: String,
    },
    /// The volume type is not supported by the hostlet.
    #[error("volume \"{0}\" has a type the hostlet does not support")]
    Unsupported(String),
    /// A path in `items` is absolute or has `..`.
    #[error("volume \"{volume}\": invalid path {path}")]
    InvalidPath {
        /// The volume.
        volume: String,
        /// The path.
        path: String,
    },
    /// A downward API value could not be computed.
    #[error("volume \"{volume}\"")]
    Downward {
        /// The volume.
        volume: String,
        /// The cause.
        #[source]
        source: crate::env::EnvError,
    },
    /// An API call failed (retried).
    #[error("volume \"{volume}\"")]
    Api {
        /// The volume.
        volume: String,
        /// The cause.
        #[source]
        source: Box<Error>,
    },
    /// Writing files failed.
    #[error("writing volume \"{volume}\"")]
    Io {
        /// The volume.
        volume: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl VolumeError {
    /// A stable CamelCase reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotFound { .. } | Self::KeyNotFound { .. } => "VolumeSourceNotFound",
            Self::Unsupported(_) => "UnsupportedVolume",
            Self::InvalidPath { .. } => "InvalidVolumePath",
            Self::Downward { .. } => "DownwardApiFailed",
            Self::Api { .. } => "ApiError",
            Self::Io { .. } => "VolumeWriteFailed",
        }
    }
}

/// One set-up volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Materialised {
    /// The host directory (or file) to bind-mount.
    pub path: PathBuf,
    /// Always mounted read-only (Secret, ConfigMap, downward API, projected).
    pub read_only: bool,
}

/// Cached ServiceAccount tokens of one pod, by (audience, expirationSeconds).
#[derive(Debug, Default)]
pub struct Tokens {
    cache: BTreeMap<(String, i64), (String, Instant)>,
}

impl Tokens {
    /// When the earliest token should be refreshed.
    pub fn next_refresh(&self) -> Option<Instant> {
        self.cache.values().map(|(_, at)| *at).min()
    }
}

/// Ownership and the pod's identity, for files.
#[derive(Clone, Copy, Debug)]
pub struct Owner {
    /// `fsGroup`: files get this group and group read.
    pub fs_group: Option<u32>,
}

/// Sets up (or re-syncs) every volume of the pod under `dir`.
pub async fn materialise(
    client: &kube::Client,
    facts: &PodFacts<'_>,
    dir: &Path,
    owner: Owner,
    tokens: &mut Tokens,
) -> Result<BTreeMap<String, Materialised>, VolumeError> {
    let pod = facts.pod;
    let mut out = BTreeMap::new();
    let volumes = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.clone())
        .unwrap_or_default();
    for volume in &volumes {
        let path = dir.join(&volume.name);
        let m = if let Some(host) = &volume.host_path {
            prepare_host_path(&volume.name, &host.path, host.type_.as_deref())?;
            Materialised {
                path: PathBuf::from(&host.path),
                read_only: false,
            }
        } else if volume.empty_dir.is_some() {
            if !path.exists() {
                std::fs::create_dir_all(&path).map_err(io_err(&volume.name))?;
                let mode = if owner.fs_group.is_some() {
                    0o2777
                } else {
                    0o777
                };
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                    .map_err(io_err(&volume.name))?;
                chown_group(&path, owner.fs_group).map_err(io_err(&volume.name))?;
            }
            Materialised {
                path,
                read_only: false,
            }
        } else {
            let files = files_of(client, facts, volume, tokens).await?;
            let Some(files) = files else {
                return Err(VolumeError::Unsupported(volume.name.clone()));
            };
            sync_dir(&path, &files, owner.fs_group).map_err(io_err(&volume.name))?;
            Materialised {
                path,
                read_only: true,
            }
        };
        out.insert(volume.name.clone(), m);
    }
    Ok(out)
}

fn io_err(volume: &str) -> impl FnOnce(std::io::Error) -> VolumeError + '_ {
    move |source| VolumeError::Io {
        volume: volume.to_string(),
        source,
    }
}

fn prepare_host_path(volume: &str, path: &str, kind: Option<&str>) -> Result<(), VolumeError> {
    let p = Path::new(path);
    match kind {
        Some("DirectoryOrCreate") if !p.exists() => {
            std::fs::create_dir_all(p).map_err(io_err(volume))
        }
        Some("FileOrCreate") if !p.exists() => {
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent).map_err(io_err(volume))?;
            }
            std::fs::write(p, b"").map_err(io_err(volume))
        }
        Some("Directory" | "File" | "Socket" | "CharDevice" | "BlockDevice") if !p.exists() => {
            Err(VolumeError::Io {
                volume: volume.to_string(),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            })
        }
        _ => Ok(()),
    }
}

/// A file to write: content and mode.
type Files = BTreeMap<String, (Vec<u8>, u32)>;

/// The files of an atomic-writer volume; `None` for types the hostlet does not support.
async fn files_of(
    client: &kube::Client,
    facts: &PodFacts<'_>,
    volume: &Volume,
    tokens: &mut Tokens,
) -> Result<Option<Files>, VolumeError> {
    let name = &volume.name;
    let mut files = Files::new();
    if let Some(s) = &volume.secret {
        let secret_name = s.secret_name.clone().unwrap_or_default();
        let data = fetch(client, facts, name, &secret_name, secret_data).await?;
        add_keyed(
            &mut files,
            name,
            "secret",
            &secret_name,
            data,
            s.items.as_deref(),
            s.optional,
            s.default_mode.unwrap_or(DEFAULT_MODE),
        )?;
    } else if let Some(c) = &volume.config_map {
        let data = fetch(client, facts, name, &c.name, config_map_data).await?;
        add_keyed(
            &mut files,
            name,
            "configmap",
            &c.name,
            data,
            c.items.as_deref(),
            c.optional,
            c.default_mode.unwrap_or(DEFAULT_MODE),
        )?;
    } else if let Some(d) = &volume.downward_api {
        let mode = d.default_mode.unwrap_or(DEFAULT_MODE);
        add_downward(
            &mut files,
            facts,
            name,
            d.items.as_deref().unwrap_or_default(),
            mode,
        )?;
    } else if let Some(p) = &volume.projected {
        let mode = p.default_mode.unwrap_or(DEFAULT_MODE);
        for source in p.sources.iter().flatten() {
            if let Some(s) = &source.secret {
                let data = fetch(client, facts, name, &s.name, secret_data).await?;
                add_keyed(
                    &mut files,
                    name,
                    "secret",
                    &s.name,
                    data,
                    s.items.as_deref(),
                    s.optional,
                    mode,
                )?;
            } else if let Some(c) = &source.config_map {
                let data = fetch(client, facts, name, &c.name, config_map_data).await?;
                add_keyed(
                    &mut files,
                    name,
                    "configmap",
                    &c.name,
                    data,
                    c.items.as_deref(),
                    c.optional,
                    mode,
                )?;
            } else if let Some(d) = &source.downward_api {
                add_downward(
                    &mut files,
                    facts,
                    name,
                    d.items.as_deref().unwrap_or_default(),
                    mode,
                )?;
            } else if let Some(t) = &source.service_account_token {
                let audience = t.audience.clone().unwrap_or_default();
                let expiration = t.expiration_seconds.unwrap_or(3600);
                let token = token(client, facts, name, &audience, expiration, tokens).await?;
                check_path(name, &t.path)?;
                files.insert(t.path.clone(), (token.into_bytes(), mode_bits(mode)));
            } else {
                return Ok(None);
            }
        }
    } else {
        return Ok(None);
    }
    Ok(Some(files))
}

fn mode_bits(mode: i32) -> u32 {
    u32::try_from(mode).unwrap_or(0o644) & 0o777
}

fn check_path(volume: &str, path: &str) -> Result<(), VolumeError> {
    let p = Path::new(path);
    let ok = !path.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)));
    if ok {
        Ok(())
    } else {
        Err(VolumeError::InvalidPath {
            volume: volume.to_string(),
            path: path.to_string(),
        })
    }
}

#[allow(clippy::too_many_arguments)]
fn add_keyed(
    files: &mut Files,
    volume: &str,
    kind: &'static str,
    object: &str,
    data: Option<BTreeMap<String, Vec<u8>>>,
    items: Option<&[KeyToPath]>,
    optional: Option<bool>,
    mode: i32,
) -> Result<(), VolumeError> {
    let Some(data) = data else {
        if optional == Some(true) {
            return Ok(());
        }
        return Err(VolumeError::NotFound {
            volume: volume.to_string(),
            kind,
            name: object.to_string(),
        });
    };
    match items {
        Some(items) if !items.is_empty() => {
            for item in items {
                let Some(value) = data.get(&item.key) else {
                    if optional == Some(true) {
                        continue;
                    }
                    return Err(VolumeError::KeyNotFound {
                        volume: volume.to_string(),
                        name: object.to_string(),
                        key: item.key.clone(),
                    });
                };
                check_path(volume, &item.path)?;
                files.insert(
                    item.path.clone(),
                    (value.clone(), mode_bits(item.mode.unwrap_or(mode))),
                );
            }
        }
        _ => {
            for (key, value) in data {
                check_path(volume, &key)?;
                files.insert(key, (value, mode_bits(mode)));
            }
        }
    }
    Ok(())
}

fn add_downward(
    files: &mut Files,
    facts: &PodFacts<'_>,
    volume: &str,
    items: &[DownwardAPIVolumeFile],
    mode: i32,
) -> Result<(), VolumeError> {
    for item in items {
        check_path(volume, &item.path)?;
        let value = if let Some(f) = &item.field_ref {
            field_value(facts, f)
        } else if let Some(r) = &item.resource_field_ref {
            resource_value(facts, None, r)
        } else {
            continue;
        }
        .map_err(|source| VolumeError::Downward {
            volume: volume.to_string(),
            source,
        })?;
        files.insert(
            item.path.clone(),
            (value.into_bytes(), mode_bits(item.mode.unwrap_or(mode))),
        );
    }
    Ok(())
}

/// The data of Secret or ConfigMap `name` in the pod's namespace (`None` if it does not
/// exist), decoded by `data`.
async fn fetch<K>(
    client: &kube::Client,
    facts: &PodFacts<'_>,
    volume: &str,
    name: &str,
    data: fn(K) -> BTreeMap<String, Vec<u8>>,
) -> Result<Option<BTreeMap<String, Vec<u8>>>, VolumeError>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let ns = facts.pod.metadata.namespace.clone().unwrap_or_default();
    let object = api::get_opt::<K>(client, &ns, name)
        .await
        .map_err(|e| VolumeError::Api {
            volume: volume.to_string(),
            source: Box::new(e),
        })?;
    Ok(object.map(data))
}

/// A Secret's data, decoded.
pub fn secret_data(secret: Secret) -> BTreeMap<String, Vec<u8>> {
    let mut data: BTreeMap<String, Vec<u8>> = secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    for (k, v) in secret.string_data.unwrap_or_default() {
        data.insert(k, v.into_bytes());
    }
    data
}

/// A ConfigMap's `data` and `binaryData`.
pub fn config_map_data(cm: ConfigMap) -> BTreeMap<String, Vec<u8>> {
    let mut data: BTreeMap<String, Vec<u8>> = cm
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.into_bytes()))
        .collect();
    for (k, v) in cm.binary_data.unwrap_or_default() {
        data.insert(k, v.0);
    }
    data
}

/// A token for the pod's ServiceAccount, bound to the pod, from the cache while fresh.
async fn token(
    client: &kube::Client,
    facts: &PodFacts<'_>,
    volume: &str,
    audience: &str,
    expiration: i64,
    tokens: &mut Tokens,
) -> Result<String, VolumeError> {
    let key = (audience.to_string(), expiration);
    if let Some((token, refresh_at)) = tokens.cache.get(&key)
        && Instant::now() < *refresh_at
    {
        return Ok(token.clone());
    }
    let pod = facts.pod;
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let sa = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".into());
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: (!audience.is_empty()).then(|| vec![audience.to_string()]),
            expiration_seconds: Some(expiration),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
            attestations: None,
        }),
        ..TokenRequest::default()
    };
    let issued = Instant::now();
    let now = jiff::Timestamp::now();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
    let response: TokenRequest = api::call(
        format!("requesting a token for ServiceAccount {ns}/{sa}"),
        accounts.create_subresource("token", &sa, &PostParams::default(), &request),
    )
    .await
    .map_err(|e| VolumeError::Api {
        volume: volume.to_string(),
        source: Box::new(e),
    })?;
    let status = response.status.unwrap_or_default();
    let token = status.token.unwrap_or_default();
    let life = status
        .expiration_timestamp
        .map_or(MAX_TOKEN_AGE, |t| t.0.duration_since(now).unsigned_abs());
    let refresh_at = issued + life.mul_f64(0.8).min(MAX_TOKEN_AGE);
    tokens.cache.insert(key, (token.clone(), refresh_at));
    Ok(token)
}

/// Makes `dir` hold exactly `files`: changed files are replaced atomically (write, then
/// rename), files no longer wanted are removed.
pub fn sync_dir(dir: &Path, files: &Files, fs_group: Option<u32>) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    for (rel, (content, mode)) in files {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mode = if fs_group.is_some() {
            mode | 0o040
        } else {
            *mode
        };
        let current = std::fs::read(&path).ok();
        let current_mode = std::fs::metadata(&path)
            .ok()
            .map(|m| m.permissions().mode() & 0o777);
        if current.as_deref() == Some(content.as_slice()) && current_mode == Some(mode) {
            continue;
        }
        let tmp = path.with_file_name(format!(
            "..{}.tmp",
            path.file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
        ));
        std::fs::write(&tmp, content)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))?;
        chown_group(&tmp, fs_group)?;
        std::fs::rename(&tmp, &path)?;
    }
    remove_stale(dir, dir, files)?;
    Ok(())
}

fn remove_stale(root: &Path, dir: &Path, files: &Files) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let rel = path
            .strip_prefix(root)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        if entry.file_type()?.is_dir() {
            remove_stale(root, &path, files)?;
            if files.keys().all(|k| !k.starts_with(&format!("{rel}/"))) {
                let _ = std::fs::remove_dir_all(&path);
            }
        } else if !files.contains_key(&rel) {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

fn chown_group(path: &Path, gid: Option<u32>) -> std::io::Result<()> {
    if let Some(gid) = gid {
        nix::unistd::chown(path, None, Some(nix::unistd::Gid::from_raw(gid)))
            .map_err(std::io::Error::from)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_dir_writes_modes_replaces_changes_and_removes_stale_files() {
        let dir = std::env::temp_dir().join(format!("hostlet-vol-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut files = Files::new();
        files.insert("a".into(), (b"1".to_vec(), 0o600));
        files.insert("sub/b".into(), (b"2".to_vec(), 0o644));
        sync_dir(&dir, &files, None).unwrap();
        assert_eq!(std::fs::read(dir.join("sub/b")).unwrap(), b"2");
        let mode = std::fs::metadata(dir.join("a"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        files.remove("sub/b");
        files.insert("a".into(), (b"changed".to_vec(), 0o644));
        sync_dir(&dir, &files, Some(1234)).unwrap();
        assert_eq!(std::fs::read(dir.join("a")).unwrap(), b"changed");
        let meta = std::fs::metadata(dir.join("a")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o644);
        assert!(!dir.join("sub").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn item_paths_may_not_escape_the_volume() {
        for bad in ["/etc/passwd", "../x", "a/../../x", ""] {
            assert!(check_path("v", bad).is_err(), "{bad}");
        }
        check_path("v", "a/b.txt").unwrap();
    }

    #[test]
    fn missing_sources_fail_unless_optional() {
        let mut files = Files::new();
        let err = add_keyed(&mut files, "v", "secret", "s", None, None, None, 0o644).unwrap_err();
        assert_eq!(
            err.to_string(),
            "MountVolume.SetUp failed for volume \"v\": secret \"s\" not found"
        );
        add_keyed(
            &mut files,
            "v",
            "secret",
            "s",
            None,
            None,
            Some(true),
            0o644,
        )
        .unwrap();
        let data = BTreeMap::from([("k".to_string(), b"v".to_vec())]);
        let items: [KeyToPath; 1] = [serde_json::from_value(
            serde_json::json!({ "key": "k", "path": "renamed", "mode": 0o400 }),
        )
        .unwrap()];
        add_keyed(
            &mut files,
            "v",
            "configmap",
            "c",
            Some(data),
            Some(&items),
            None,
            0o644,
        )
        .unwrap();
        assert_eq!(files["renamed"], (b"v".to_vec(), 0o400));
    }
}
