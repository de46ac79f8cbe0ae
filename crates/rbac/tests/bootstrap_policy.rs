//! Facts of upstream's 1.33 bootstrap policy that the port must keep.

#![cfg(test)]

use std::collections::HashSet;

use serde_json::{Value, json};
use skiff_rbac::bootstrap::{
    API_VERSION, AUTO_UPDATE_ANNOTATION, BOOTSTRAPPING_LABEL, CONTROLLER_PREFIX, cluster_role_bindings, cluster_roles,
    role_bindings, roles, rule,
};

fn name(obj: &Value) -> &str {
    obj["metadata"]["name"].as_str().unwrap()
}

fn find<'a>(list: &'a [Value], wanted: &str) -> &'a Value {
    list.iter()
        .find(|o| name(o) == wanted)
        .unwrap_or_else(|| panic!("{wanted} is missing"))
}

fn rules(list: &[Value], role: &str) -> Vec<Value> {
    find(list, role)["rules"].as_array().cloned().unwrap_or_default()
}

#[test]
fn counts_match_upstream_defaults() {
    let roles_ = cluster_roles();
    let controllers = roles_.iter().filter(|r| name(r).starts_with(CONTROLLER_PREFIX)).count();
    assert_eq!(roles_.len() - controllers, 31, "policy.go cluster roles");
    assert_eq!(controllers, 35, "controller roles");
    assert_eq!(cluster_role_bindings().len(), 12 + 35);
    assert_eq!(roles().len(), 7);
    assert_eq!(role_bindings().len(), 7);
}

#[test]
fn every_object_carries_the_bootstrap_metadata() {
    let all = [cluster_roles(), cluster_role_bindings(), roles(), role_bindings()].concat();
    for obj in &all {
        assert_eq!(obj["apiVersion"], API_VERSION);
        assert_eq!(
            obj["metadata"]["labels"][BOOTSTRAPPING_LABEL],
            "rbac-defaults",
            "{}",
            name(obj)
        );
        assert_eq!(
            obj["metadata"]["annotations"][AUTO_UPDATE_ANNOTATION],
            "true",
            "{}",
            name(obj)
        );
        for key in ["uid", "resourceVersion", "creationTimestamp"] {
            assert!(obj["metadata"].get(key).is_none());
        }
    }
    for (list, kind, namespaced) in [
        (cluster_roles(), "ClusterRole", false),
        (cluster_role_bindings(), "ClusterRoleBinding", false),
        (roles(), "Role", true),
        (role_bindings(), "RoleBinding", true),
    ] {
        let mut seen = HashSet::new();
        for obj in &list {
            assert_eq!(obj["kind"], kind);
            assert_eq!(obj["metadata"].get("namespace").is_some(), namespaced, "{}", name(obj));
            assert!(
                seen.insert((obj["metadata"]["namespace"].clone(), name(obj).to_string())),
                "duplicate {}",
                name(obj)
            );
        }
    }
}

#[test]
fn rules_have_sorted_lists_and_omit_empty_ones() {
    let all = [cluster_roles(), roles()].concat();
    for role in &all {
        for r in role["rules"].as_array().into_iter().flatten() {
            for (key, list) in r.as_object().unwrap() {
                let list: Vec<&str> = list.as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
                assert!(!list.is_empty(), "{} has an empty {key}", name(role));
                assert!(
                    list.windows(2).all(|w| w[0] <= w[1]),
                    "{}: {key} not sorted",
                    name(role)
                );
            }
            assert!(r.get("verbs").is_some());
        }
    }
    assert_eq!(
        rule()
            .verbs(&["watch", "get"])
            .groups(&["apps", ""])
            .resources(&["b", "a"])
            .build(),
        json!({ "verbs": ["get", "watch"], "apiGroups": ["", "apps"], "resources": ["a", "b"] })
    );
    assert_eq!(
        rule().verbs(&["get"]).urls(&["/b", "/a"]).build(),
        json!({ "verbs": ["get"], "nonResourceURLs": ["/a", "/b"] })
    );
}

#[test]
fn policy_roles_come_in_upstream_order() {
    let names: Vec<String> = cluster_roles().iter().map(|r| name(r).to_string()).collect();
    assert_eq!(
        &names[..8],
        [
            "cluster-admin",
            "system:discovery",
            "system:monitoring",
            "system:basic-user",
            "system:public-info-viewer",
            "admin",
            "edit",
            "view"
        ]
    );
    assert_eq!(names[30], "system:kube-scheduler");
    assert_eq!(names[31], "system:controller:attachdetach-controller");
    assert_eq!(names.last().unwrap(), "system:controller:selinux-warning-controller");
}

#[test]
fn cluster_admin_can_do_anything() {
    assert_eq!(
        rules(&cluster_roles(), "cluster-admin"),
        vec![
            json!({ "verbs": ["*"], "apiGroups": ["*"], "resources": ["*"] }),
            json!({ "verbs": ["*"], "nonResourceURLs": ["*"] })
        ]
    );
}

#[test]
fn admin_edit_and_view_aggregate_their_rules() {
    let all = cluster_roles();
    for (role, from, label) in [
        ("admin", "rbac.authorization.k8s.io/aggregate-to-admin", None),
        (
            "edit",
            "rbac.authorization.k8s.io/aggregate-to-edit",
            Some("rbac.authorization.k8s.io/aggregate-to-admin"),
        ),
        (
            "view",
            "rbac.authorization.k8s.io/aggregate-to-view",
            Some("rbac.authorization.k8s.io/aggregate-to-edit"),
        ),
    ] {
        let r = find(&all, role);
        assert_eq!(
            r["aggregationRule"],
            json!({ "clusterRoleSelectors": [{ "matchLabels": { from: "true" } }] })
        );
        assert_eq!(
            r["rules"],
            Value::Null,
            "the aggregation controller writes {role}'s rules"
        );
        if let Some(label) = label {
            assert_eq!(r["metadata"]["labels"][label], "true");
        }
    }
    for (role, label) in [
        (
            "system:aggregate-to-admin",
            "rbac.authorization.k8s.io/aggregate-to-admin",
        ),
        (
            "system:aggregate-to-edit",
            "rbac.authorization.k8s.io/aggregate-to-edit",
        ),
        (
            "system:aggregate-to-view",
            "rbac.authorization.k8s.io/aggregate-to-view",
        ),
    ] {
        let r = find(&all, role);
        assert_eq!(r["metadata"]["labels"][label], "true");
        assert!(r.get("aggregationRule").is_none());
    }
    let aggregated = all.iter().filter(|r| r.get("aggregationRule").is_some()).count();
    assert_eq!(aggregated, 3);
}

#[test]
fn edit_no_longer_writes_endpoints_but_view_reads_them() {
    let all = cluster_roles();
    let edit = rules(&all, "system:aggregate-to-edit");
    assert!(!edit.iter().any(|r| {
        r["verbs"].as_array().unwrap().contains(&json!("create"))
            && r["resources"]
                .as_array()
                .is_some_and(|res| res.contains(&json!("endpoints")))
    }));
    assert!(edit.contains(&json!({
        "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
    })));
    assert!(
        rules(&all, "system:aggregate-to-view")[0]["resources"]
            .as_array()
            .unwrap()
            .contains(&json!("endpoints"))
    );
}

#[test]
fn node_role_matches_upstream_node_rules() {
    let node = rules(&cluster_roles(), "system:node");
    assert_eq!(node.len(), 22);
    assert_eq!(
        node[0],
        json!({ "verbs": ["create"], "apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"] })
    );
    assert!(node.contains(
        &json!({ "verbs": ["get", "list", "watch"], "apiGroups": [""], "resources": ["configmaps", "secrets"] })
    ));
    assert_eq!(
        node[21],
        json!({ "verbs": ["get", "list", "watch"], "apiGroups": ["node.k8s.io"], "resources": ["runtimeclasses"] })
    );
    // Gated off by default in 1.33: DRA claims, ClusterTrustBundles, service accounts for credential providers.
    for absent in ["resourceclaims", "clustertrustbundles", "serviceaccounts"] {
        assert!(
            !node.iter().any(|r| r["resources"]
                .as_array()
                .is_some_and(|res| res.contains(&json!(absent)))),
            "{absent}"
        );
    }
}

#[test]
fn gates_on_by_default_in_1_33_are_applied() {
    let all = cluster_roles();
    // KubeletFineGrainedAuthz (beta).
    assert_eq!(
        rules(&all, "system:kubelet-api-admin")[3],
        json!({ "verbs": ["*"], "apiGroups": [""], "resources": ["nodes/configz", "nodes/healthz", "nodes/pods"] })
    );
    // MultiCIDRServiceAllocator (GA).
    assert_eq!(
        rules(&all, "system:node-proxier")[3],
        json!({ "verbs": ["list", "watch"], "apiGroups": ["networking.k8s.io"], "resources": ["servicecidrs"] })
    );
    find(&all, "system:controller:service-cidrs-controller");
    // SELinuxChangePolicy (beta).
    find(&all, "system:controller:selinux-warning-controller");
    // Off by default: DynamicResourceAllocation, ClusterTrustBundle, VolumeAttributesClass, StorageVersionMigrator.
    for absent in [
        "system:controller:resource-claim-controller",
        "system:controller:device-taint-eviction-controller",
        "system:cluster-trust-bundle-discovery",
        "system:controller:kube-apiserver-serving-clustertrustbundle-publisher",
        "system:controller:volumeattributesclass-protection-controller",
        "system:controller:storage-version-migrator-controller",
    ] {
        assert!(!all.iter().any(|r| name(r) == absent), "{absent}");
    }
}

#[test]
fn scheduler_and_controller_manager_roles() {
    let all = cluster_roles();
    let scheduler = rules(&all, "system:kube-scheduler");
    assert_eq!(scheduler.len(), 20);
    assert_eq!(
        scheduler[2],
        json!({ "verbs": ["get", "list", "update", "watch"], "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["kube-scheduler"] })
    );
    assert!(scheduler.contains(&json!({ "verbs": ["get", "list", "watch"], "apiGroups": ["storage.k8s.io"], "resources": ["volumeattachments"] })));
    let kcm = rules(&all, "system:kube-controller-manager");
    assert!(kcm.contains(&json!({ "verbs": ["list", "watch"], "apiGroups": ["*"], "resources": ["*"] })));
    assert_eq!(
        kcm[0],
        json!({ "verbs": ["create", "patch", "update"], "apiGroups": ["", "events.k8s.io"], "resources": ["events"] })
    );
}

#[test]
fn certificate_roles_name_their_signers() {
    let all = cluster_roles();
    assert_eq!(
        rules(
            &all,
            "system:certificates.k8s.io:kube-apiserver-client-kubelet-approver"
        ),
        vec![json!({
            "verbs": ["approve"], "apiGroups": ["certificates.k8s.io"], "resources": ["signers"],
            "resourceNames": ["kubernetes.io/kube-apiserver-client-kubelet"],
        })]
    );
    assert_eq!(
        rules(&all, "system:controller:certificate-controller")[3]["resourceNames"],
        json!([
            "kubernetes.io/kube-apiserver-client",
            "kubernetes.io/kube-apiserver-client-kubelet",
            "kubernetes.io/kubelet-serving",
            "kubernetes.io/legacy-unknown"
        ])
    );
}

#[test]
fn controller_roles_before_list_watch_permissions_widened() {
    let all = cluster_roles();
    assert_eq!(
        rules(&all, "system:controller:cronjob-controller")[4]["verbs"],
        json!(["delete", "list"])
    );
    assert_eq!(
        rules(&all, "system:controller:namespace-controller")[2]["verbs"],
        json!(["delete", "deletecollection", "get", "list"])
    );
    assert_eq!(
        rules(&all, "system:controller:persistent-volume-binder")
            .last()
            .unwrap()["resources"],
        json!(["services"])
    );
    assert_eq!(
        rules(&all, "system:controller:legacy-service-account-token-cleaner")[0]["resourceNames"],
        json!(["kube-apiserver-legacy-service-account-token-tracking"])
    );
}

#[test]
fn bindings_point_at_roles_that_exist() {
    let cluster: HashSet<String> = cluster_roles().iter().map(|r| name(r).to_string()).collect();
    let namespaced: HashSet<(String, String)> = roles()
        .iter()
        .map(|r| {
            (
                r["metadata"]["namespace"].as_str().unwrap().to_string(),
                name(r).to_string(),
            )
        })
        .collect();
    for b in cluster_role_bindings() {
        assert_eq!(b["roleRef"]["apiGroup"], "rbac.authorization.k8s.io");
        assert_eq!(b["roleRef"]["kind"], "ClusterRole");
        assert!(cluster.contains(b["roleRef"]["name"].as_str().unwrap()), "{}", name(&b));
    }
    for b in role_bindings() {
        let role = b["roleRef"]["name"].as_str().unwrap().to_string();
        match b["roleRef"]["kind"].as_str().unwrap() {
            "Role" => assert!(namespaced.contains(&(b["metadata"]["namespace"].as_str().unwrap().to_string(), role))),
            kind => panic!("unexpected {kind}"),
        }
    }
}

#[test]
fn subjects_take_the_api_group_only_for_users_and_groups() {
    for b in [cluster_role_bindings(), role_bindings()].concat() {
        for s in b["subjects"].as_array().into_iter().flatten() {
            match s["kind"].as_str().unwrap() {
                "ServiceAccount" => {
                    assert!(s.get("apiGroup").is_none());
                    assert!(s["namespace"].is_string());
                }
                "User" | "Group" => {
                    assert_eq!(s["apiGroup"], "rbac.authorization.k8s.io");
                    assert!(s.get("namespace").is_none());
                }
                kind => panic!("unexpected {kind}"),
            }
        }
    }
}

#[test]
fn cluster_role_bindings_bind_upstream_subjects() {
    let all = cluster_role_bindings();
    let subjects = |n: &str| find(&all, n).get("subjects").cloned();
    assert_eq!(
        subjects("cluster-admin"),
        Some(json!([{ "kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "system:masters" }]))
    );
    assert_eq!(
        subjects("system:public-info-viewer")
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].clone())
            .collect::<Vec<_>>(),
        vec![json!("system:authenticated"), json!("system:unauthenticated")]
    );
    assert_eq!(
        subjects("system:node"),
        None,
        "kept without subjects since the Node authorizer"
    );
    assert_eq!(
        subjects("system:kube-dns"),
        Some(json!([{ "kind": "ServiceAccount", "name": "kube-dns", "namespace": "kube-system" }]))
    );
    assert_eq!(
        find(&all, "system:volume-scheduler")["subjects"][0]["name"],
        "system:kube-scheduler"
    );
    for b in all.iter().filter(|b| name(b).starts_with(CONTROLLER_PREFIX)) {
        let account = &name(b)[CONTROLLER_PREFIX.len()..];
        assert_eq!(
            b["subjects"],
            json!([{ "kind": "ServiceAccount", "name": account, "namespace": "kube-system" }])
        );
    }
}

#[test]
fn namespaced_roles_and_bindings() {
    let all = roles();
    let in_ns = |ns: &str| all.iter().filter(|r| r["metadata"]["namespace"] == ns).count();
    assert_eq!((in_ns("kube-system"), in_ns("kube-public")), (6, 1));
    assert_eq!(
        rules(&all, "extension-apiserver-authentication-reader"),
        vec![json!({
            "verbs": ["get", "list", "watch"], "apiGroups": [""], "resources": ["configmaps"],
            "resourceNames": ["extension-apiserver-authentication"],
        })]
    );
    let scheduler = rules(&all, "system::leader-locking-kube-scheduler");
    assert_eq!(scheduler[1]["resourceNames"], json!(["kube-scheduler"]));
    assert_eq!(scheduler[3]["resources"], json!(["leasecandidates"]));
    let public = all
        .iter()
        .find(|r| r["metadata"]["namespace"] == "kube-public")
        .unwrap();
    assert_eq!(name(public), "system:controller:bootstrap-signer");
    assert_eq!(public["rules"][1]["resourceNames"], json!(["cluster-info"]));

    let bindings = role_bindings();
    let kcm = find(&bindings, "system::leader-locking-kube-controller-manager");
    assert_eq!(
        kcm["subjects"],
        json!([
            { "kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "system:kube-controller-manager" },
            { "kind": "ServiceAccount", "name": "kube-controller-manager", "namespace": "kube-system" },
            { "kind": "ServiceAccount", "name": "leader-election-controller", "namespace": "kube-system" },
        ])
    );
    let reader = find(&bindings, "system::extension-apiserver-authentication-reader");
    assert_eq!(reader["roleRef"]["name"], "extension-apiserver-authentication-reader");
    let public = bindings
        .iter()
        .find(|b| b["metadata"]["namespace"] == "kube-public")
        .unwrap();
    assert_eq!(public["subjects"][0]["namespace"], "kube-system");
}
