//! Coverage of one rule set by another, as upstream's `validation.Covers`.

#![cfg(test)]

use serde_json::{Value, json};
use skiff_rbac::bootstrap::{cluster_roles, covers, rule};

fn r(verbs: &[&str], groups: &[&str], resources: &[&str]) -> Value {
    rule().verbs(verbs).groups(groups).resources(resources).build()
}

#[test]
fn exact_and_wider_rules_cover() {
    let owner = [r(&["get", "list", "watch"], &[""], &["pods", "services"])];
    assert_eq!(covers(&owner, &[r(&["get"], &[""], &["pods"])]), (true, vec![]));
    assert_eq!(covers(&owner, &owner), (true, vec![]));
    assert_eq!(covers(&owner, &[]), (true, vec![]));
    assert_eq!(covers(&[], &[]), (true, vec![]));
}

#[test]
fn uncovered_rules_come_back_broken_down() {
    let owner = [r(&["get"], &[""], &["pods"])];
    // Broken down by group, then resource, then (sorted) verb.
    let (ok, missing) = covers(&owner, &[r(&["get", "delete"], &["", "apps"], &["pods"])]);
    assert!(!ok);
    assert_eq!(
        missing,
        vec![
            json!({ "verbs": ["delete"], "apiGroups": [""], "resources": ["pods"] }),
            json!({ "verbs": ["delete"], "apiGroups": ["apps"], "resources": ["pods"] }),
            json!({ "verbs": ["get"], "apiGroups": ["apps"], "resources": ["pods"] }),
        ]
    );
}

#[test]
fn stars_cover_everything_of_their_kind() {
    let admin = &cluster_roles()[0];
    let rules = admin["rules"].as_array().unwrap();
    for role in cluster_roles() {
        let wanted = role["rules"].as_array().cloned().unwrap_or_default();
        assert!(
            covers(rules, &wanted).0,
            "cluster-admin covers {}",
            role["metadata"]["name"]
        );
    }
    let any_verb = [r(&["*"], &["apps"], &["deployments"])];
    assert!(covers(&any_verb, &[r(&["escalate"], &["apps"], &["deployments"])]).0);
    assert!(!covers(&any_verb, &[r(&["get"], &["batch"], &["deployments"])]).0);
}

#[test]
fn star_slash_subresource_covers_that_subresource_of_anything() {
    let owner = [r(&["get", "update"], &["*"], &["*/scale"])];
    assert!(
        covers(
            &owner,
            &[r(&["update"], &["apps"], &["deployments/scale", "statefulsets/scale"])]
        )
        .0
    );
    assert!(!covers(&owner, &[r(&["get"], &["apps"], &["deployments"])]).0);
    assert!(!covers(&owner, &[r(&["get"], &["apps"], &["deployments/status"])]).0);
}

#[test]
fn resource_names_restrict_coverage() {
    let named = [rule()
        .verbs(&["get"])
        .groups(&[""])
        .resources(&["configmaps"])
        .names(&["a", "b"])
        .build()];
    let one = rule()
        .verbs(&["get"])
        .groups(&[""])
        .resources(&["configmaps"])
        .names(&["a"])
        .build();
    let other = rule()
        .verbs(&["get"])
        .groups(&[""])
        .resources(&["configmaps"])
        .names(&["c"])
        .build();
    assert!(covers(&named, std::slice::from_ref(&one)).0);
    assert!(!covers(&named, &[other]).0);
    // A named owner rule does not cover every object...
    assert!(!covers(&named, &[r(&["get"], &[""], &["configmaps"])]).0);
    // ...but an unnamed one covers named requests.
    assert!(covers(&[r(&["get"], &[""], &["configmaps"])], &[one]).0);
}

#[test]
fn non_resource_urls_match_exactly_or_by_star_prefix() {
    let owner = [rule().verbs(&["get"]).urls(&["/healthz", "/apis/*"]).build()];
    let want = |url: &str| rule().verbs(&["get"]).urls(&[url]).build();
    assert!(covers(&owner, &[want("/healthz")]).0);
    assert!(covers(&owner, &[want("/apis/apps/v1")]).0);
    assert!(covers(&owner, &[want("/apis/")]).0);
    assert!(!covers(&owner, &[want("/apis")]).0);
    assert!(!covers(&owner, &[want("/healthz/etcd")]).0);
    assert!(!covers(&owner, &[rule().verbs(&["post"]).urls(&["/healthz"]).build()]).0);
    // Resource rules and URL rules never cover each other.
    assert!(!covers(&[r(&["*"], &["*"], &["*"])], &[want("/healthz")]).0);
    assert!(
        !covers(
            &[rule().verbs(&["*"]).urls(&["*"]).build()],
            &[r(&["get"], &[""], &["pods"])]
        )
        .0
    );
}

#[test]
fn edit_covers_view_and_admin_covers_edit_once_aggregated() {
    let all = cluster_roles();
    let rules = |n: &str| {
        all.iter().find(|r| r["metadata"]["name"] == n).unwrap()["rules"]
            .as_array()
            .unwrap()
            .clone()
    };
    let view = rules("system:aggregate-to-view");
    let edit = [rules("system:aggregate-to-edit"), view.clone()].concat();
    let admin = [rules("system:aggregate-to-admin"), edit.clone()].concat();
    assert!(covers(&edit, &view).0);
    assert!(covers(&admin, &edit).0);
    let (ok, missing) = covers(&view, &edit);
    assert!(!ok);
    assert!(missing.contains(&json!({ "verbs": ["create"], "apiGroups": [""], "resources": ["pods"] })));
}
