//! API Priority and Fairness configuration objects (`flowcontrol.apiserver.k8s.io/v1`): the
//! mandatory and suggested FlowSchemas and PriorityLevelConfigurations upstream 1.33's API server
//! creates at start (`k8s.io/apiserver/pkg/apis/flowcontrol/bootstrap`), each annotated
//! `apf.kubernetes.io/autoupdate-spec: "true"`.

use serde_json::{Value, json};

/// The annotation that says whether the server keeps an object's spec as it ships it.
pub const AUTO_UPDATE_ANNOTATION: &str = "apf.kubernetes.io/autoupdate-spec";

/// The name of the exempt priority level and flow schema.
pub const EXEMPT: &str = "exempt";

const VERB_ALL: &str = "*";
const ALL_GROUPS: &[&str] = &["system:unauthenticated", "system:authenticated"];

fn priority_level(name: &str, spec: Value) -> Value {
    json!({
        "kind": "PriorityLevelConfiguration",
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "metadata": {"name": name, "annotations": {AUTO_UPDATE_ANNOTATION: "true"}},
        "spec": spec,
    })
}

fn limited(shares: i64, lendable: i64, queuing: Option<(i64, i64, i64)>) -> Value {
    let limit_response = match queuing {
        Some((queues, hand_size, queue_length_limit)) => json!({
            "type": "Queue",
            "queuing": {"queues": queues, "handSize": hand_size, "queueLengthLimit": queue_length_limit},
        }),
        None => json!({"type": "Reject"}),
    };
    json!({
        "type": "Limited",
        "limited": {
            "nominalConcurrencyShares": shares,
            "lendablePercent": lendable,
            "limitResponse": limit_response,
        },
    })
}

fn flow_schema(name: &str, level: &str, precedence: i64, distinguisher: Option<&str>, rules: Vec<Value>) -> Value {
    let mut spec = json!({
        "priorityLevelConfiguration": {"name": level},
        "matchingPrecedence": precedence,
        "rules": rules,
    });
    if let (Some(d), Some(m)) = (distinguisher, spec.as_object_mut()) {
        m.insert("distinguisherMethod".into(), json!({"type": d}));
    }
    json!({
        "kind": "FlowSchema",
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "metadata": {"name": name, "annotations": {AUTO_UPDATE_ANNOTATION: "true"}},
        "spec": spec,
    })
}

fn groups(names: &[&str]) -> Vec<Value> {
    names
        .iter()
        .map(|n| json!({"kind": "Group", "group": {"name": n}}))
        .collect()
}

fn users(names: &[&str]) -> Vec<Value> {
    names
        .iter()
        .map(|n| json!({"kind": "User", "user": {"name": n}}))
        .collect()
}

fn kube_system_service_account(name: &str) -> Value {
    json!({"kind": "ServiceAccount", "serviceAccount": {"name": name, "namespace": "kube-system"}})
}

fn resource_rule(
    verbs: &[&str],
    api_groups: &[&str],
    resources: &[&str],
    namespaces: &[&str],
    cluster_scope: bool,
) -> Value {
    let mut r = json!({"verbs": verbs, "apiGroups": api_groups, "resources": resources, "namespaces": namespaces});
    if cluster_scope && let Some(m) = r.as_object_mut() {
        m.insert("clusterScope".into(), json!(true));
    }
    r
}

/// Every verb on every resource and every non-resource URL.
fn everything(subjects: Vec<Value>) -> Value {
    json!({
        "subjects": subjects,
        "resourceRules": [resource_rule(&[VERB_ALL], &["*"], &["*"], &["*"], true)],
        "nonResourceRules": [{"verbs": [VERB_ALL], "nonResourceURLs": ["*"]}],
    })
}

/// The mandatory priority levels: `exempt` and `catch-all`.
pub fn mandatory_priority_levels() -> Vec<Value> {
    vec![
        priority_level(
            EXEMPT,
            json!({"type": "Exempt", "exempt": {"nominalConcurrencyShares": 0, "lendablePercent": 0}}),
        ),
        priority_level("catch-all", limited(5, 0, None)),
    ]
}

/// The mandatory flow schemas: `exempt` (`system:masters`) and `catch-all` (everyone).
pub fn mandatory_flow_schemas() -> Vec<Value> {
    vec![
        flow_schema(EXEMPT, EXEMPT, 1, None, vec![everything(groups(&["system:masters"]))]),
        flow_schema(
            "catch-all",
            "catch-all",
            10000,
            Some("ByUser"),
            vec![everything(groups(ALL_GROUPS))],
        ),
    ]
}

/// The suggested priority levels.
pub fn suggested_priority_levels() -> Vec<Value> {
    vec![
        priority_level("system", limited(30, 33, Some((64, 6, 50)))),
        priority_level("node-high", limited(40, 25, Some((64, 6, 50)))),
        priority_level("leader-election", limited(10, 0, Some((16, 4, 50)))),
        priority_level("workload-high", limited(40, 50, Some((128, 6, 50)))),
        priority_level("workload-low", limited(100, 90, Some((128, 6, 50)))),
        priority_level("global-default", limited(20, 50, Some((128, 6, 50)))),
    ]
}

/// The suggested flow schemas.
pub fn suggested_flow_schemas() -> Vec<Value> {
    let leader_election_rules = |namespaces: &[&str]| {
        vec![
            resource_rule(
                &["get", "create", "update"],
                &[""],
                &["endpoints", "configmaps"],
                namespaces,
                false,
            ),
            resource_rule(
                &["get", "create", "update"],
                &["coordination.k8s.io"],
                &["leases"],
                &["*"],
                false,
            ),
        ]
    };
    let mut system_leader_subjects = users(&["system:kube-controller-manager", "system:kube-scheduler"]);
    system_leader_subjects.push(kube_system_service_account("*"));
    vec![
        flow_schema(
            "system-nodes",
            "system",
            500,
            Some("ByUser"),
            vec![everything(groups(&["system:nodes"]))],
        ),
        flow_schema(
            "system-node-high",
            "node-high",
            400,
            Some("ByUser"),
            vec![json!({
                "subjects": groups(&["system:nodes"]),
                "resourceRules": [
                    resource_rule(&[VERB_ALL], &[""], &["nodes", "nodes/status"], &["*"], true),
                    resource_rule(&[VERB_ALL], &["coordination.k8s.io"], &["leases"], &["*"], false),
                ],
            })],
        ),
        flow_schema(
            "probes",
            EXEMPT,
            2,
            None,
            vec![json!({
                "subjects": groups(ALL_GROUPS),
                "nonResourceRules": [{"verbs": ["get"], "nonResourceURLs": ["/healthz", "/readyz", "/livez"]}],
            })],
        ),
        flow_schema(
            "system-leader-election",
            "leader-election",
            100,
            Some("ByUser"),
            vec![json!({"subjects": system_leader_subjects, "resourceRules": leader_election_rules(&["kube-system"])})],
        ),
        flow_schema(
            "endpoint-controller",
            "workload-high",
            150,
            Some("ByUser"),
            vec![json!({
                "subjects": [
                    users(&["system:kube-controller-manager"])[0].clone(),
                    kube_system_service_account("endpoint-controller"),
                ],
                "resourceRules": [resource_rule(&["get", "create", "update"], &[""], &["endpoints"], &["*"], false)],
            })],
        ),
        flow_schema(
            "workload-leader-election",
            "leader-election",
            200,
            Some("ByUser"),
            vec![
                json!({"subjects": [kube_system_service_account("*")], "resourceRules": leader_election_rules(&["*"])}),
            ],
        ),
        flow_schema(
            "kube-controller-manager",
            "workload-high",
            800,
            Some("ByNamespace"),
            vec![everything(users(&["system:kube-controller-manager"]))],
        ),
        flow_schema(
            "kube-scheduler",
            "workload-high",
            800,
            Some("ByNamespace"),
            vec![everything(users(&["system:kube-scheduler"]))],
        ),
        flow_schema(
            "kube-system-service-accounts",
            "workload-high",
            900,
            Some("ByNamespace"),
            vec![everything(vec![kube_system_service_account("*")])],
        ),
        flow_schema(
            "service-accounts",
            "workload-low",
            9000,
            Some("ByUser"),
            vec![everything(groups(&["system:serviceaccounts"]))],
        ),
        flow_schema(
            "global-default",
            "global-default",
            9900,
            Some("ByUser"),
            vec![everything(groups(ALL_GROUPS))],
        ),
    ]
}

/// The spec a mandatory object of this kind and name must have.
pub fn mandatory_spec(kind: &str, name: &str) -> Option<Value> {
    let objects = match kind {
        "FlowSchema" => mandatory_flow_schemas(),
        "PriorityLevelConfiguration" => mandatory_priority_levels(),
        _ => return None,
    };
    objects
        .into_iter()
        .find(|o| o.pointer("/metadata/name").and_then(Value::as_str) == Some(name))
        .and_then(|o| o.get("spec").cloned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::lookup_kind;

    fn names(objects: &[Value]) -> Vec<&str> {
        objects
            .iter()
            .map(|o| o.pointer("/metadata/name").and_then(Value::as_str).unwrap_or(""))
            .collect()
    }

    #[test]
    fn upstreams_configuration_objects() {
        assert_eq!(names(&mandatory_priority_levels()), ["exempt", "catch-all"]);
        assert_eq!(
            names(&suggested_priority_levels()),
            [
                "system",
                "node-high",
                "leader-election",
                "workload-high",
                "workload-low",
                "global-default"
            ]
        );
        assert_eq!(names(&mandatory_flow_schemas()), ["exempt", "catch-all"]);
        assert_eq!(names(&suggested_flow_schemas()).len(), 11);
        assert_eq!(
            mandatory_spec("PriorityLevelConfiguration", "catch-all"),
            Some(
                json!({"type": "Limited", "limited": {"nominalConcurrencyShares": 5, "lendablePercent": 0,
                "limitResponse": {"type": "Reject"}}})
            )
        );
        assert!(mandatory_spec("FlowSchema", "global-default").is_none());
    }

    #[test]
    fn defaulting_and_validation_leave_them_as_they_are() {
        let fs = lookup_kind("flowcontrol.apiserver.k8s.io", "FlowSchema").expect("served");
        let pl = lookup_kind("flowcontrol.apiserver.k8s.io", "PriorityLevelConfiguration").expect("served");
        let all = mandatory_flow_schemas()
            .into_iter()
            .chain(suggested_flow_schemas())
            .map(|o| (fs, o))
            .chain(
                mandatory_priority_levels()
                    .into_iter()
                    .chain(suggested_priority_levels())
                    .map(|o| (pl, o)),
            );
        for (res, obj) in all {
            let mut defaulted = obj.clone();
            crate::defaults::apply_defaults(res, &mut defaulted);
            assert_eq!(defaulted, obj, "defaults change {}", obj["metadata"]["name"]);
            let errs = crate::validation::validate(res, &obj, None);
            assert!(errs.is_empty(), "{}: {errs:?}", obj["metadata"]["name"]);
        }
    }
}
