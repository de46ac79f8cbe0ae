//! Upstream's ClusterRole aggregation controller: a ClusterRole with an `aggregationRule` has as
//! its rules the rules of every other ClusterRole its selectors match, in name order without
//! repeats, written with server-side apply (field manager `clusterrole-aggregation-controller`).
//! Labelling a ClusterRole `rbac.authorization.k8s.io/aggregate-to-view: "true"` thus extends
//! `view` (and, through the chain of aggregated roles, `edit` and `admin`).

use std::time::Duration;

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::Store;

use crate::controller_utils::{self as cu, WorkQueue};

const CONTROLLER_NAME: &str = "clusterrole-aggregation-controller";

pub async fn run(client: kube::Client) -> anyhow::Result<()> {
    let queue = WorkQueue::new();
    // Any ClusterRole's change may change what every aggregated role collects.
    let (tx, rx) = tokio::sync::watch::channel(());
    let roles = cu::spawn_store_watch(Api::<ClusterRole>::all(client.clone()), queue.clone(), move |_| {
        let _ = tx.send(());
        Vec::new()
    });
    let q = queue.clone();
    let r = roles.clone();
    tokio::spawn(async move {
        let mut rx = rx;
        while rx.changed().await.is_ok() {
            for role in r.state().iter().filter(|c| c.aggregation_rule.is_some()) {
                if let Some(name) = &role.metadata.name {
                    q.add(name.clone());
                }
            }
        }
    });
    queue.run(CONTROLLER_NAME, |key| sync(&client, &roles, key)).await
}

/// The rules an aggregated role should have, from the roles in `all`.
pub fn aggregated_rules(role: &ClusterRole, all: &[std::sync::Arc<ClusterRole>]) -> Option<Vec<PolicyRule>> {
    let rule = role.aggregation_rule.as_ref()?;
    let mut sorted: Vec<&ClusterRole> = all.iter().map(|r| &**r).collect();
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut rules: Vec<PolicyRule> = Vec::new();
    for selector in rule.cluster_role_selectors.iter().flatten() {
        let selector = cu::selector_of(Some(selector));
        for other in &sorted {
            if other.metadata.name == role.metadata.name || !cu::labels_match(&selector, &other.metadata) {
                continue;
            }
            for r in other.rules.iter().flatten() {
                if !rules.contains(r) {
                    rules.push(r.clone());
                }
            }
        }
    }
    Some(rules)
}

async fn sync(client: &kube::Client, roles: &Store<ClusterRole>, key: String) -> anyhow::Result<Option<Duration>> {
    let all = roles.state();
    let Some(role) = all.iter().find(|r| r.metadata.name.as_deref() == Some(key.as_str())) else {
        return Ok(None);
    };
    let Some(desired) = aggregated_rules(role, &all) else {
        return Ok(None);
    };
    // Upstream compares semantically: no rules and an empty list are the same.
    if role.rules.clone().unwrap_or_default() == desired {
        return Ok(None);
    }
    let patch = serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": key},
        "rules": desired,
    });
    let api: Api<ClusterRole> = Api::all(client.clone());
    match api
        .patch(
            &key,
            &PatchParams::apply(CONTROLLER_NAME).force(),
            &Patch::Apply(&patch),
        )
        .await
    {
        Ok(_) => Ok(None),
        Err(e) if cu::is_not_found(&e) => Ok(None),
        Err(e) if cu::is_conflict(&e) => Ok(Some(Duration::from_millis(50))),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Arc;

    fn role(v: serde_json::Value) -> Arc<ClusterRole> {
        Arc::new(serde_json::from_value(v).expect("a ClusterRole"))
    }

    #[test]
    fn rules_of_matching_roles_in_name_order_without_repeats() {
        let view = role(
            json!({"metadata": {"name": "view"}, "aggregationRule": {"clusterRoleSelectors": [
            {"matchLabels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}}]}}),
        );
        let pods = json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]});
        let all = vec![
            view.clone(),
            role(
                json!({"metadata": {"name": "z-widgets", "labels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}},
                "rules": [{"verbs": ["get"], "apiGroups": ["example.com"], "resources": ["widgets"]}, pods.clone()]}),
            ),
            role(
                json!({"metadata": {"name": "a-pods", "labels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}},
                "rules": [pods.clone()]}),
            ),
            role(
                json!({"metadata": {"name": "unlabelled"}, "rules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}]}),
            ),
        ];
        let rules = aggregated_rules(&view, &all).unwrap();
        let names: Vec<String> = rules
            .iter()
            .map(|r| r.resources.clone().unwrap_or_default().join(","))
            .collect();
        assert_eq!(names, vec!["pods", "widgets"]);
        assert!(aggregated_rules(&all[2], &all).is_none());
    }
}
