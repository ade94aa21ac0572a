//! The API as the real API server sees it: every CRD installs and becomes Established, a
//! valid example of each kind is accepted and listed with its printer columns, and malformed
//! objects and changes to immutable fields are refused with a message naming the field.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures
)]

use std::collections::BTreeSet;

use kontinuum_e2e::{
    dynamic_api, install_kontinuum_crds, kubectl, load_yaml, namespace, shared_client,
};
use kube::ResourceExt as _;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde::Deserialize;

#[derive(Deserialize)]
struct InvalidCase {
    name: String,
    object: DynamicObject,
    field: String,
}

#[derive(Deserialize)]
struct TransitionCase {
    name: String,
    object: DynamicObject,
    patch: serde_json::Value,
    field: String,
}

#[tokio::test]
async fn every_crd_is_established_and_valid_examples_are_listed() {
    let (client, shared) = shared_client().await.unwrap();
    let crds = install_kontinuum_crds(&client).await.unwrap();
    let kinds: BTreeSet<_> = crds.iter().map(|c| c.spec.names.kind.clone()).collect();
    assert_eq!(
        kinds,
        [
            "Addon",
            "Instance",
            "InstancePool",
            "Kontinuum",
            "TalosCluster",
            "Zone"
        ]
        .map(String::from)
        .into(),
    );

    let ns = namespace(&client, "api-valid").await.unwrap();
    let examples: Vec<DynamicObject> = load_yaml("api/valid.yaml").unwrap();
    let mut example_kinds = BTreeSet::new();
    for obj in &examples {
        let api = dynamic_api(&client, &ns, obj).unwrap();
        api.create(&PostParams::default(), obj)
            .await
            .unwrap_or_else(|e| panic!("valid example {} was refused: {e}", obj.name_any()));
        example_kinds.insert(obj.types.as_ref().unwrap().kind.clone());
    }
    assert_eq!(
        example_kinds, kinds,
        "valid.yaml must hold an example of every kind"
    );

    // `kubectl get kontinuum` (the category) lists every example.
    let listed = kubectl(shared, &["get", "kontinuum", "-n", &ns, "-o", "name"]).unwrap();
    for obj in &examples {
        let kind = obj.types.as_ref().unwrap().kind.to_lowercase();
        let expected = format!("{kind}.kontinuum.sh/{}", obj.name_any());
        assert!(
            listed.lines().any(|l| l == expected),
            "{expected} missing from:\n{listed}"
        );
    }

    // Each kind's table shows its printer columns, including Ready, Reason and Age.
    for crd in &crds {
        let table = kubectl(shared, &["get", &crd.spec.names.plural, "-n", &ns]).unwrap();
        let header: Vec<&str> = table
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        let storage = crd.spec.versions.iter().find(|v| v.storage).unwrap();
        let mut expected = vec!["NAME".to_string()];
        expected.extend(
            storage
                .additional_printer_columns
                .iter()
                .flatten()
                .map(|c| c.name.to_uppercase()),
        );
        assert_eq!(header, expected, "columns of {}", crd.spec.names.plural);
        for column in ["READY", "REASON", "AGE"] {
            assert!(
                header.contains(&column),
                "{} has no {column} column",
                crd.spec.names.plural
            );
        }
        let short = crd
            .spec
            .names
            .short_names
            .as_ref()
            .and_then(|s| s.first())
            .unwrap();
        kubectl(shared, &["get", short, "-n", &ns]).unwrap();
    }
}

#[tokio::test]
async fn malformed_objects_are_refused_with_the_field_named() {
    let (client, _) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let ns = namespace(&client, "api-invalid").await.unwrap();
    let cases: Vec<Vec<InvalidCase>> = load_yaml("api/invalid.yaml").unwrap();
    let cases: Vec<InvalidCase> = cases.into_iter().flatten().collect();
    assert!(cases.len() >= 25, "only {} malformed cases", cases.len());

    let mut failures = Vec::new();
    for case in &cases {
        let api = dynamic_api(&client, &ns, &case.object).unwrap();
        match api.create(&PostParams::default(), &case.object).await {
            Ok(_) => failures.push(format!("{}: accepted", case.name)),
            Err(kube::Error::Api(status)) if status.message.contains(&case.field) => {}
            Err(e) => failures.push(format!(
                "{}: message does not name {}: {e}",
                case.name, case.field
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[tokio::test]
async fn immutable_fields_cannot_change() {
    let (client, _) = shared_client().await.unwrap();
    install_kontinuum_crds(&client).await.unwrap();
    let ns = namespace(&client, "api-immutable").await.unwrap();
    let cases: Vec<Vec<TransitionCase>> = load_yaml("api/transitions.yaml").unwrap();
    let cases: Vec<TransitionCase> = cases.into_iter().flatten().collect();
    assert!(!cases.is_empty());

    let mut failures = Vec::new();
    for case in &cases {
        let api = dynamic_api(&client, &ns, &case.object).unwrap();
        let name = case.object.name_any();
        if let Err(e) = api.create(&PostParams::default(), &case.object).await {
            failures.push(format!(
                "{}: the starting object was refused: {e}",
                case.name
            ));
            continue;
        }
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&case.patch))
            .await
        {
            Ok(_) => failures.push(format!("{}: change accepted", case.name)),
            Err(kube::Error::Api(status)) if status.message.contains(&case.field) => {}
            Err(e) => failures.push(format!(
                "{}: message does not name {}: {e}",
                case.name, case.field
            )),
        }
        api.delete(&name, &DeleteParams::default()).await.unwrap();
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
