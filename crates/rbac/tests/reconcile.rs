//! Upstream's start-up reconciliation of bootstrap roles and bindings with stored ones.

#![cfg(test)]

use serde_json::{Value, json};
use skiff_rbac::bootstrap::{
    AUTO_UPDATE_ANNOTATION, Reconcile, cluster_role_bindings, cluster_roles, reconcile_binding, reconcile_role,
    role_bindings, roles,
};

fn find(list: Vec<Value>, name: &str) -> Value {
    list.into_iter().find(|o| o["metadata"]["name"] == name).unwrap()
}

/// The object as the store holds it: with the fields the API server adds.
fn stored(mut obj: Value) -> Value {
    let meta = obj["metadata"].as_object_mut().unwrap();
    meta.insert("uid".into(), json!("0f1e2d3c"));
    meta.insert("resourceVersion".into(), json!("42"));
    meta.insert("creationTimestamp".into(), json!("2025-01-01T00:00:00Z"));
    obj
}

fn updated(result: Reconcile) -> Value {
    match result {
        Reconcile::Update(v) => v,
        other => panic!("expected an update, got {other:?}"),
    }
}

#[test]
fn missing_objects_are_created() {
    for role in [cluster_roles(), roles()].concat() {
        assert_eq!(reconcile_role(None, &role), Reconcile::Create(role.clone()));
    }
    for binding in [cluster_role_bindings(), role_bindings()].concat() {
        assert_eq!(reconcile_binding(None, &binding), Reconcile::Create(binding.clone()));
    }
}

#[test]
fn objects_stored_as_expected_are_unchanged() {
    for role in [cluster_roles(), roles()].concat() {
        assert_eq!(reconcile_role(Some(&stored(role.clone())), &role), Reconcile::Unchanged);
    }
    for binding in [cluster_role_bindings(), role_bindings()].concat() {
        assert_eq!(
            reconcile_binding(Some(&stored(binding.clone())), &binding),
            Reconcile::Unchanged
        );
    }
}

#[test]
fn opted_out_objects_are_left_alone() {
    let expected = find(cluster_roles(), "system:node");
    let mut existing = stored(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": { "name": "system:node", "annotations": { AUTO_UPDATE_ANNOTATION: "false" } },
        "rules": [],
    }));
    assert_eq!(reconcile_role(Some(&existing), &expected), Reconcile::Unchanged);
    existing["metadata"]["annotations"][AUTO_UPDATE_ANNOTATION] = json!("true");
    assert!(matches!(
        reconcile_role(Some(&existing), &expected),
        Reconcile::Update(_)
    ));

    let binding = find(cluster_role_bindings(), "cluster-admin");
    let mut existing = stored(binding.clone());
    existing["metadata"]["annotations"][AUTO_UPDATE_ANNOTATION] = json!("false");
    existing["subjects"] = json!([]);
    existing["roleRef"]["name"] = json!("view");
    assert_eq!(reconcile_binding(Some(&existing), &binding), Reconcile::Unchanged);
}

#[test]
fn missing_rules_are_added_broken_down_and_extra_ones_kept() {
    let expected = find(cluster_roles(), "system:kube-dns");
    let extra = json!({ "verbs": ["get"], "apiGroups": [""], "resources": ["pods"] });
    let partial = json!({ "verbs": ["list", "watch"], "apiGroups": [""], "resources": ["endpoints"] });
    let mut existing = stored(expected.clone());
    existing["rules"] = json!([extra, partial]);
    let result = updated(reconcile_role(Some(&existing), &expected));
    assert_eq!(
        result["rules"],
        json!([
            extra,
            partial,
            { "verbs": ["list"], "apiGroups": [""], "resources": ["services"] },
            { "verbs": ["watch"], "apiGroups": [""], "resources": ["services"] },
        ])
    );
    // The stored object's identity is kept.
    assert_eq!(result["metadata"]["uid"], "0f1e2d3c");
    assert_eq!(result["metadata"]["resourceVersion"], "42");
    assert_eq!(result["metadata"]["creationTimestamp"], "2025-01-01T00:00:00Z");
}

#[test]
fn rules_covered_by_wider_stored_rules_are_not_added() {
    let expected = find(cluster_roles(), "system:heapster");
    let mut existing = stored(expected.clone());
    existing["rules"] = json!([{ "verbs": ["*"], "apiGroups": ["*"], "resources": ["*"] }]);
    assert_eq!(reconcile_role(Some(&existing), &expected), Reconcile::Unchanged);
}

#[test]
fn labels_and_annotations_are_unioned_with_stored_values_winning() {
    let expected = find(cluster_roles(), "system:aggregate-to-view");
    let mut existing = stored(expected.clone());
    existing["metadata"]["labels"] = json!({ "team": "a", "rbac.authorization.k8s.io/aggregate-to-view": "false" });
    existing["metadata"]["annotations"] = json!({ "note": "kept" });
    let result = updated(reconcile_role(Some(&existing), &expected));
    assert_eq!(
        result["metadata"]["labels"],
        json!({
            "team": "a",
            "rbac.authorization.k8s.io/aggregate-to-view": "false",
            "kubernetes.io/bootstrapping": "rbac-defaults",
        })
    );
    assert_eq!(
        result["metadata"]["annotations"],
        json!({ "note": "kept", AUTO_UPDATE_ANNOTATION: "true" })
    );
    assert_eq!(result["rules"], expected["rules"]);

    // Without labels or annotations at all, both are added.
    let mut bare = stored(expected.clone());
    bare["metadata"].as_object_mut().unwrap().remove("labels");
    bare["metadata"].as_object_mut().unwrap().remove("annotations");
    let result = updated(reconcile_role(Some(&bare), &expected));
    assert_eq!(result["metadata"]["labels"], expected["metadata"]["labels"]);
    assert_eq!(result["metadata"]["annotations"], expected["metadata"]["annotations"]);
}

#[test]
fn aggregated_roles_get_missing_selectors_but_never_rules() {
    let expected = find(cluster_roles(), "admin");
    // The aggregation controller has written rules, and a user added a selector.
    let mut existing = stored(expected.clone());
    let custom = json!({ "matchLabels": { "example.com/aggregate-to-admin": "true" } });
    existing["rules"] = json!([{ "verbs": ["get"], "apiGroups": [""], "resources": ["pods"] }]);
    existing["aggregationRule"] = json!({ "clusterRoleSelectors": [custom] });
    let result = updated(reconcile_role(Some(&existing), &expected));
    assert_eq!(
        result["aggregationRule"]["clusterRoleSelectors"],
        json!([custom, { "matchLabels": { "rbac.authorization.k8s.io/aggregate-to-admin": "true" } }])
    );
    assert_eq!(result["rules"], existing["rules"]);

    // A selector that differs only by empty parts is the same selector.
    let mut same = stored(expected.clone());
    same["aggregationRule"]["clusterRoleSelectors"][0]["matchExpressions"] = json!([]);
    same["rules"] = json!([]);
    assert_eq!(reconcile_role(Some(&same), &expected), Reconcile::Unchanged);

    // A stored copy that lost its aggregation rule gets it back.
    let mut lost = stored(expected.clone());
    lost.as_object_mut().unwrap().remove("aggregationRule");
    let result = updated(reconcile_role(Some(&lost), &expected));
    assert_eq!(result["aggregationRule"], expected["aggregationRule"]);
}

#[test]
fn an_aggregation_rule_the_bootstrap_role_lacks_is_removed() {
    let expected = find(cluster_roles(), "system:basic-user");
    let mut existing = stored(expected.clone());
    existing["aggregationRule"] = json!({ "clusterRoleSelectors": [{ "matchLabels": { "x": "y" } }] });
    let result = updated(reconcile_role(Some(&existing), &expected));
    assert!(result.get("aggregationRule").is_none());
    assert_eq!(result["rules"], expected["rules"]);
}

#[test]
fn namespaced_roles_reconcile_like_cluster_roles() {
    let expected = find(roles(), "extension-apiserver-authentication-reader");
    let mut existing = stored(expected.clone());
    existing["rules"] = json!([]);
    let result = updated(reconcile_role(Some(&existing), &expected));
    assert_eq!(result["metadata"]["namespace"], "kube-system");
    assert_eq!(result["rules"].as_array().unwrap().len(), 3, "one rule per verb");
}

#[test]
fn bindings_get_missing_subjects_and_keep_extra_ones() {
    let expected = find(role_bindings(), "system::leader-locking-kube-controller-manager");
    let mut existing = stored(expected.clone());
    let extra = json!({ "kind": "ServiceAccount", "name": "custom", "namespace": "kube-system" });
    // An explicit empty apiGroup on a service account is the same subject.
    let same_sa = json!({ "kind": "ServiceAccount", "apiGroup": "", "name": "kube-controller-manager", "namespace": "kube-system" });
    existing["subjects"] = json!([extra, same_sa]);
    let result = updated(reconcile_binding(Some(&existing), &expected));
    assert_eq!(
        result["subjects"],
        json!([
            extra,
            same_sa,
            { "kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "system:kube-controller-manager" },
            { "kind": "ServiceAccount", "name": "leader-election-controller", "namespace": "kube-system" },
        ])
    );
    assert_eq!(result["metadata"]["uid"], "0f1e2d3c");

    // Extra subjects alone call for nothing.
    let mut more = stored(expected.clone());
    more["subjects"].as_array_mut().unwrap().push(extra);
    assert_eq!(reconcile_binding(Some(&more), &expected), Reconcile::Unchanged);
}

#[test]
fn binding_metadata_is_unioned() {
    let expected = find(cluster_role_bindings(), "system:node");
    let mut existing = stored(expected.clone());
    existing["metadata"]["labels"] = json!({ "kubernetes.io/bootstrapping": "custom" });
    existing["subjects"] =
        json!([{ "kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "system:nodes" }]);
    // A stored value for every expected key, and subjects beyond the expected none: nothing to do.
    assert_eq!(reconcile_binding(Some(&existing), &expected), Reconcile::Unchanged);

    existing["metadata"]["annotations"] = json!({});
    let result = updated(reconcile_binding(Some(&existing), &expected));
    assert_eq!(
        result["metadata"]["labels"],
        json!({ "kubernetes.io/bootstrapping": "custom" })
    );
    assert_eq!(
        result["metadata"]["annotations"],
        json!({ AUTO_UPDATE_ANNOTATION: "true" })
    );
    assert_eq!(
        result["subjects"], existing["subjects"],
        "system:node's old subjects are kept"
    );
}

#[test]
fn a_binding_to_another_role_is_recreated() {
    let expected = find(cluster_role_bindings(), "system:kube-dns");
    for (field, value) in [("name", "view"), ("kind", "Role"), ("apiGroup", "example.com")] {
        let mut existing = stored(expected.clone());
        existing["roleRef"][field] = json!(value);
        assert_eq!(
            reconcile_binding(Some(&existing), &expected),
            Reconcile::Recreate(expected.clone()),
            "{field}"
        );
    }
}
