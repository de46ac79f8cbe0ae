//! HorizontalPodAutoscalers on a real node: `kubectl autoscale` scales a Deployment whose pods
//! spin on the CPU, reading the resource metrics `skiff server` serves from its node agent's
//! Docker stats. Needs the local `busybox:latest` image (`skiff images build`).

#![cfg(test)]

mod common;

use std::time::Duration;

use common::eventually;
use common::node::Node;

#[test]
fn a_busy_deployment_is_scaled_up_to_its_maximum() {
    let n = Node::start("hpa", &[]);
    let deployment = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: spin
spec:
  replicas: 1
  selector:
    matchLabels: {app: spin}
  template:
    metadata:
      labels: {app: spin}
    spec:
      terminationGracePeriodSeconds: 0
      containers:
      - name: spin
        image: busybox:latest
        imagePullPolicy: IfNotPresent
        command: ["sh", "-c", "while :; do :; done"]
        resources:
          requests: {cpu: 100m}
"#;
    n.c.apply(deployment, &[]);

    // Refused as upstream refuses it.
    let bad = r#"
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: bad
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: spin}
  minReplicas: 5
  maxReplicas: 2
"#;
    let err = n.c.stdin_kubectl_err(&["apply", "-f", "-"], bad);
    assert!(
        err.contains("spec.maxReplicas: Invalid value: 2: must be greater than or equal to `minReplicas`"),
        "{err}"
    );

    n.c.k(&[
        "autoscale",
        "deployment",
        "spin",
        "--cpu-percent=50",
        "--min=1",
        "--max=3",
    ]);
    let listed = n.c.k(&["get", "hpa", "spin"]);
    assert!(
        listed.contains("Deployment/spin") && listed.contains("/50%"),
        "{listed}"
    );

    // Two samples 10 s apart, then the autoscaler's 15 s period: one spinning pod uses several
    // times its 100m request, so the Deployment goes to its maximum (bounded from 1 + 4).
    let scaled = eventually(Duration::from_secs(150), || {
        let r = n.c.k(&["get", "deployment", "spin", "-o", "jsonpath={.spec.replicas}"]);
        (r == "3").then_some(())
    });
    assert!(
        scaled.is_some(),
        "not scaled to 3:\n{}\n{}",
        n.c.k(&["describe", "hpa", "spin"]),
        n.c.k(&["get", "--raw", "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods"])
    );
    let status = eventually(Duration::from_secs(60), || {
        let hpa = n.c.get_json(&["hpa", "spin"]);
        let conditions = hpa["status"]["conditions"].as_array().cloned().unwrap_or_default();
        let reason = |t: &str| {
            conditions
                .iter()
                .find(|c| c["type"] == t)
                .and_then(|c| c["reason"].as_str())
                .map(str::to_string)
        };
        (hpa["status"]["currentReplicas"] == 3 && reason("ScalingLimited").as_deref() == Some("TooManyReplicas"))
            .then(|| (hpa, reason("ScalingActive")))
    });
    let (hpa, active) = status.expect("the status shows 3 replicas limited by maxReplicas");
    assert_eq!(active.as_deref(), Some("ValidMetricFound"), "{hpa}");
    let utilization = hpa["status"]["currentMetrics"][0]["resource"]["current"]["averageUtilization"]
        .as_i64()
        .expect("a current utilization");
    assert!(utilization > 50, "{hpa}");
    assert!(hpa["status"]["lastScaleTime"].is_string(), "{hpa}");
    let events = n.c.event_messages("involvedObject.kind=HorizontalPodAutoscaler");
    assert!(
        events.contains("New size: 3; reason: cpu resource utilization (percentage of request) above target"),
        "{events}"
    );
    let listed = n.c.k(&["get", "hpa", "spin", "--no-headers"]);
    assert!(listed.contains("cpu: ") && listed.contains("%/50%"), "{listed}");

    n.c.k(&["delete", "deployment", "spin"]);
}

/// autoscaling/v1 and autoscaling/v2 serve the same objects: what one version writes the other
/// reads, converted, and what v1 cannot express survives a v1 round trip in the annotations.
#[test]
fn autoscaling_v1_and_v2_are_one_object() {
    let c = common::Cluster::start(&["--no-agent"]);

    // Discovery: both versions, v2 preferred.
    let group = serde_json::from_str::<serde_json::Value>(&c.k(&["get", "--raw", "/apis/autoscaling"])).expect("json");
    assert_eq!(group["preferredVersion"]["version"], "v2");
    let versions: Vec<&str> = group["versions"]
        .as_array()
        .map(|vs| vs.iter().filter_map(|v| v["version"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(versions, ["v2", "v1"]);
    let v1_resources =
        serde_json::from_str::<serde_json::Value>(&c.k(&["get", "--raw", "/apis/autoscaling/v1"])).expect("json");
    assert!(
        v1_resources["resources"].as_array().is_some_and(|rs| rs
            .iter()
            .any(|r| r["name"] == "horizontalpodautoscalers" && r["shortNames"][0] == "hpa")),
        "{v1_resources}"
    );

    // Written through v1, read through v2. (kubectl expands a short name to the preferred
    // version, as upstream's shortcut expander does: a version is asked for by its plural.)
    c.apply(
        r#"
apiVersion: autoscaling/v1
kind: HorizontalPodAutoscaler
metadata:
  name: web
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  minReplicas: 2
  maxReplicas: 6
  targetCPUUtilizationPercentage: 60
"#,
        &[],
    );
    let v2 = c.get_json(&["hpa.v2.autoscaling", "web"]);
    assert_eq!(v2["apiVersion"], "autoscaling/v2");
    assert_eq!(
        v2["spec"]["metrics"],
        serde_json::json!([{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 60}}}])
    );
    assert_eq!(v2["spec"]["minReplicas"], 2);
    let v1 = c.get_json(&["horizontalpodautoscalers.v1.autoscaling", "web"]);
    assert_eq!(v1["apiVersion"], "autoscaling/v1");
    assert_eq!(v1["spec"]["targetCPUUtilizationPercentage"], 60);
    assert_eq!(v1["metadata"]["resourceVersion"], v2["metadata"]["resourceVersion"]);
    let table = c.k(&["get", "hpa.v1.autoscaling"]);
    assert!(table.contains("web") && table.contains("cpu: <unknown>/60%"), "{table}");
    let table = c.k(&["get", "hpa"]);
    assert!(table.contains("web") && table.contains("Deployment/web"), "{table}");

    // Written through v2 with what v1 cannot say, changed through v1, read through v2.
    c.apply(
        r#"
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: mem
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: mem}
  maxReplicas: 4
  metrics:
  - type: Resource
    resource:
      name: memory
      target: {type: AverageValue, averageValue: 100Mi}
  - type: Resource
    resource:
      name: cpu
      target: {type: Utilization, averageUtilization: 50}
  behavior:
    scaleDown:
      stabilizationWindowSeconds: 60
"#,
        &[],
    );
    let v1 = c.get_json(&["horizontalpodautoscalers.v1.autoscaling", "mem"]);
    assert_eq!(v1["spec"]["targetCPUUtilizationPercentage"], 50);
    let other = v1["metadata"]["annotations"]["autoscaling.alpha.kubernetes.io/metrics"]
        .as_str()
        .unwrap_or_default();
    assert!(other.contains("\"memory\"") && other.contains("100Mi"), "{v1}");
    assert!(
        v1["metadata"]["annotations"]["autoscaling.alpha.kubernetes.io/behavior"].is_string(),
        "{v1}"
    );
    c.k(&[
        "patch",
        "horizontalpodautoscalers.v1.autoscaling",
        "mem",
        "--type=merge",
        "-p",
        r#"{"spec":{"maxReplicas":7,"targetCPUUtilizationPercentage":40}}"#,
    ]);
    // A v1 object read and written back whole (PUT) keeps the v2 fields too.
    let mut whole = c.get_json(&["horizontalpodautoscalers.v1.autoscaling", "mem"]);
    whole["spec"]["minReplicas"] = serde_json::json!(2);
    c.stdin_kubectl(&["replace", "-f", "-"], &whole.to_string());
    let v2 = c.get_json(&["hpa.v2.autoscaling", "mem"]);
    assert_eq!(v2["spec"]["maxReplicas"], 7);
    assert_eq!(v2["spec"]["minReplicas"], 2);
    assert_eq!(
        v2["spec"]["metrics"],
        serde_json::json!([
            {"type": "Resource", "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "100Mi"}}},
            {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 40}}},
        ])
    );
    assert_eq!(v2["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"], 60);
    let annotations = v2["metadata"]["annotations"].as_object().cloned().unwrap_or_default();
    assert!(
        annotations
            .keys()
            .all(|k| !k.starts_with("autoscaling.alpha.kubernetes.io/")),
        "{v2}"
    );

    // Lists and watches through v1 convert too.
    let list = c.get_json(&["horizontalpodautoscalers.v1.autoscaling"]);
    let items = list["items"].as_array().cloned().unwrap_or_default();
    assert_eq!(items.len(), 2);
    assert!(
        items
            .iter()
            .all(|i| i["spec"]["targetCPUUtilizationPercentage"].is_number()),
        "{list}"
    );
    let watched = c.k(&[
        "get",
        "--raw",
        "/apis/autoscaling/v1/namespaces/default/horizontalpodautoscalers?watch=1&timeoutSeconds=2",
    ]);
    let events: Vec<serde_json::Value> = watched.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    assert_eq!(events.len(), 2, "{watched}");
    for e in &events {
        assert_eq!(e["object"]["apiVersion"], "autoscaling/v1", "{e}");
        assert!(e["object"]["spec"]["targetCPUUtilizationPercentage"].is_number(), "{e}");
    }

    // Strict field validation checks v1's own fields.
    let err = c.stdin_kubectl_err(
        &["create", "-f", "-", "--validate=strict"],
        r#"{"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "x"},
            "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "x"}, "maxReplicas": 2, "metrics": []}}"#,
    );
    assert!(err.contains("unknown field \"spec.metrics\""), "{err}");

    // kubectl autoscale (v2) reads back through v1.
    c.k(&["create", "deployment", "auto", "--image=nginx"]);
    c.k(&["autoscale", "deployment", "auto", "--cpu-percent=55", "--max=3"]);
    let v1 = c.get_json(&["horizontalpodautoscalers.v1.autoscaling", "auto"]);
    assert_eq!(v1["spec"]["targetCPUUtilizationPercentage"], 55);
    assert_eq!(v1["spec"]["maxReplicas"], 3);
    c.k(&["delete", "horizontalpodautoscalers.v1.autoscaling", "auto"]);
    assert!(c.get_opt(&["hpa", "auto"]).is_none());
}
