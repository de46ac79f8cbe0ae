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
