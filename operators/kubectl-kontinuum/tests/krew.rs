//! The krew manifest template: four platforms, the version placeholder, and no host names.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[test]
fn the_krew_manifest_covers_every_platform_without_naming_a_host() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/krew/kontinuum.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let manifest: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(manifest["kind"], "Plugin");
    assert_eq!(manifest["metadata"]["name"], "kontinuum");
    assert_eq!(manifest["spec"]["version"], "{{ .TagName }}");
    let platforms = manifest["spec"]["platforms"].as_array().unwrap();
    let mut seen: Vec<String> = platforms
        .iter()
        .map(|p| {
            let labels = &p["selector"]["matchLabels"];
            let (os, arch) = (
                labels["os"].as_str().unwrap(),
                labels["arch"].as_str().unwrap(),
            );
            let uri = p["uri"].as_str().unwrap();
            assert!(
                uri.starts_with("{{ .DownloadBaseURL }}/{{ .TagName }}/"),
                "{uri}"
            );
            assert!(uri.ends_with(&format!("_{os}_{arch}.tar.gz")), "{uri}");
            assert_eq!(p["bin"], "kubectl-kontinuum");
            assert_eq!(p["sha256"], format!("{{{{ .Sha256.{os}_{arch} }}}}"));
            format!("{os}/{arch}")
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        ["darwin/amd64", "darwin/arm64", "linux/amd64", "linux/arm64"]
    );
    assert!(!text.contains("://"), "the template must not name a host");
}
