//! PodDisruptionBudgets with the disruption controller and `kubectl drain`: the budget's status
//! counts the pods of a Deployment (expected, healthy, allowed disruptions, the
//! `DisruptionAllowed` condition); a drain that would break the budget is refused with
//! upstream's 429 message until the budget allows it, then the pods move to the other node.

#![cfg(test)]

mod common;

use std::time::Duration;

use common::{Cluster, eventually};

const DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: c
        image: busybox
"#;

fn budget(field: &str) -> String {
    format!(
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: web\nspec:\n  {field}\n  selector:\n    matchLabels: {{app: web}}\n"
    )
}

fn status_of(c: &Cluster) -> serde_json::Value {
    c.get_json(&["pdb", "web"])["status"].clone()
}

#[test]
fn budgets_are_counted_and_drains_respect_them() {
    let c = Cluster::start(&["--no-agent", "--sim-nodes", "2"]);
    c.apply(DEPLOYMENT, &[]);
    c.k(&["rollout", "status", "deployment/web", "--timeout=60s"]);

    // Every pod must stay: nothing may be disrupted.
    c.apply(&budget("maxUnavailable: 0"), &[]);
    let st = eventually(Duration::from_secs(20), || {
        let st = status_of(&c);
        (st["expectedPods"] == 2 && st["currentHealthy"] == 2).then_some(st)
    })
    .expect("the budget's status counts the Deployment's pods");
    assert_eq!(st["desiredHealthy"], 2, "{st}");
    assert_eq!(st["disruptionsAllowed"], 0, "{st}");
    assert_eq!(st["conditions"][0]["type"], "DisruptionAllowed", "{st}");
    assert_eq!(st["conditions"][0]["status"], "False", "{st}");
    assert_eq!(st["conditions"][0]["reason"], "InsufficientPods", "{st}");
    let table = c.k(&["get", "pdb", "web"]);
    assert!(
        table
            .lines()
            .nth(1)
            .is_some_and(|l| l.split_whitespace().take(4).collect::<Vec<_>>() == ["web", "N/A", "0", "0"]),
        "{table}"
    );

    let pods = c.get_json(&["pods", "-l", "app=web"]);
    let node = pods["items"][0]["spec"]["nodeName"]
        .as_str()
        .expect("bound")
        .to_string();
    let out = c.kubectl(&["drain", &node, "--ignore-daemonsets", "--timeout=8s"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a drain broke the budget");
    assert!(
        stderr.contains("Cannot evict pod as it would violate the pod's disruption budget."),
        "{stderr}"
    );

    // One pod may go: the drain evicts, the Deployment's replacement lands on the other node.
    c.apply(&budget("minAvailable: 1"), &[]);
    eventually(Duration::from_secs(20), || {
        (status_of(&c)["disruptionsAllowed"] == 1).then_some(())
    })
    .expect("one disruption allowed");
    c.k(&["drain", &node, "--ignore-daemonsets", "--timeout=90s"]);
    c.k(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    let pods = c.get_json(&["pods", "-l", "app=web"]);
    for p in pods["items"].as_array().expect("items") {
        if p["metadata"]["deletionTimestamp"].is_null() {
            assert_ne!(p["spec"]["nodeName"], node.as_str(), "a pod stayed on the drained node");
        }
    }
    let st = eventually(Duration::from_secs(30), || {
        let st = status_of(&c);
        (st["currentHealthy"] == 2 && st["disruptionsAllowed"] == 1).then_some(st)
    })
    .expect("the budget recovers once the replacement is ready");
    assert_eq!(st["conditions"][0]["reason"], "SufficientPods", "{st}");
}
