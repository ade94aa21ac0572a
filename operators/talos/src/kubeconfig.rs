//! The admin kubeconfig as Talos streams it: a gzip-compressed tar holding one regular entry
//! named `kubeconfig`.
//!
//! Talos closes the gzip stream but never the tar writer, so the archive has no end-of-archive
//! blocks; iterating past the entry fails. [`extract`] therefore stops at the `kubeconfig`
//! entry and never reads further.

use std::fmt;
use std::io::Read;

use flate2::read::GzDecoder;

/// Bound on the unpacked kubeconfig, matching Talos' 32 MiB message limit.
const MAX_KUBECONFIG_BYTES: u64 = 32 * 1024 * 1024;

/// The name of the tar entry Talos puts the kubeconfig in.
pub const ENTRY_NAME: &str = "kubeconfig";

/// A kubeconfig (admin credentials). `Debug` shows only its size.
#[derive(Clone, PartialEq, Eq)]
pub struct Kubeconfig(Vec<u8>);

impl Kubeconfig {
    /// The kubeconfig YAML.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The kubeconfig YAML, owned.
    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

impl fmt::Debug for Kubeconfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Kubeconfig(<{} bytes redacted>)", self.0.len())
    }
}

/// Why an archive held no usable kubeconfig.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    #[error("archive is not a readable gzip'd tar")]
    Archive(#[source] std::io::Error),
    #[error("archive has no {ENTRY_NAME:?} entry")]
    NoEntry,
    #[error("kubeconfig entry is larger than {MAX_KUBECONFIG_BYTES} bytes")]
    TooLarge,
}

/// Reads the `kubeconfig` entry of a gzip'd tar and stops there.
pub fn extract(gzip_tar: &[u8]) -> Result<Kubeconfig, KubeconfigError> {
    let mut archive = tar::Archive::new(GzDecoder::new(gzip_tar));
    for entry in archive.entries().map_err(KubeconfigError::Archive)? {
        let entry = entry.map_err(KubeconfigError::Archive)?;
        let is_kubeconfig = entry.header().entry_type().is_file()
            && entry
                .path()
                .is_ok_and(|p| p.as_os_str() == ENTRY_NAME || p.as_os_str() == "./kubeconfig");
        if !is_kubeconfig {
            continue;
        }
        let mut data = Vec::new();
        entry
            .take(MAX_KUBECONFIG_BYTES + 1)
            .read_to_end(&mut data)
            .map_err(KubeconfigError::Archive)?;
        if data.len() as u64 > MAX_KUBECONFIG_BYTES {
            return Err(KubeconfigError::TooLarge);
        }
        return Ok(Kubeconfig(data));
    }
    Err(KubeconfigError::NoEntry)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::io::Write;

    use flate2::Compression;
    use flate2::write::GzEncoder;

    use super::*;

    /// A gzip'd tar with the given entries; `terminate = false` mimics Talos (no end blocks).
    pub(crate) fn archive(entries: &[(&str, &[u8])], terminate: bool) -> Vec<u8> {
        let mut tar = Vec::new();
        for (name, data) in entries {
            let mut header = tar::Header::new_gnu();
            header.set_path(name).unwrap();
            header.set_size(data.len() as u64);
            header.set_mode(0o600);
            header.set_entry_type(tar::EntryType::Regular);
            header.set_cksum();
            tar.extend_from_slice(header.as_bytes());
            tar.extend_from_slice(data);
            if terminate {
                tar.resize(tar.len().div_ceil(512) * 512, 0);
            }
        }
        if terminate {
            tar.extend_from_slice(&[0; 1024]);
        }
        let mut gz = GzEncoder::new(Vec::new(), Compression::default());
        gz.write_all(&tar).unwrap();
        gz.finish().unwrap()
    }

    #[test]
    fn reads_a_terminated_archive() {
        let gz = archive(&[("kubeconfig", b"apiVersion: v1\n")], true);
        assert_eq!(extract(&gz).unwrap().as_bytes(), b"apiVersion: v1\n");
    }

    #[test]
    fn stops_at_the_entry_of_an_unterminated_archive() {
        // What Talos sends: no padding after the data and no end-of-archive blocks. Iterating
        // past the entry would fail with an unexpected EOF.
        let gz = archive(&[("kubeconfig", b"apiVersion: v1\nkind: Config\n")], false);
        assert_eq!(
            extract(&gz).unwrap().as_bytes(),
            b"apiVersion: v1\nkind: Config\n"
        );
    }

    #[test]
    fn skips_other_entries_and_reports_a_missing_one() {
        let gz = archive(&[("other", b"x"), ("kubeconfig", b"k")], true);
        assert_eq!(extract(&gz).unwrap().as_bytes(), b"k");
        let gz = archive(&[("other", b"x")], true);
        assert!(matches!(extract(&gz), Err(KubeconfigError::NoEntry)));
    }

    #[test]
    fn garbage_and_truncation_are_errors() {
        assert!(matches!(
            extract(b"not gzip"),
            Err(KubeconfigError::Archive(_))
        ));
        let gz = archive(&[("kubeconfig", &[b'a'; 4096])], true);
        assert!(extract(&gz[..gz.len() / 2]).is_err());
    }

    #[test]
    fn debug_is_redacted() {
        let k = Kubeconfig(b"client-key-data: SECRET".to_vec());
        assert_eq!(format!("{k:?}"), "Kubeconfig(<23 bytes redacted>)");
    }
}
