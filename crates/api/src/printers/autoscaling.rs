//! Printers for autoscaling: HorizontalPodAutoscalers (upstream's `printHorizontalPodAutoscaler`
//! and `formatHPAMetrics`).

use jiff::Timestamp;
use serde_json::{Value, json};

use super::format::{age, int_at, name, str_at};
use super::{AGE, Column, NAME};

pub(crate) const HPA_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Reference",
        "string",
        "scaleTargetRef points to the target resource to scale, and is used to the pods for which metrics should be collected, as well as to actually change the replica count.",
    ),
    Column::new(
        "Targets",
        "string",
        "metrics contains the specifications for which to use to calculate the desired replica count (the maximum replica count across all metrics will be used).  The desired replica count is calculated multiplying the ratio between the target value and the current value by the current number of pods.  Ergo, metrics used must decrease as the pod count is increased, and vice-versa.  See the individual metric source types for more information about how each type of metric must respond. If not set, the default metric will be set to 80% average CPU utilization.",
    ),
    Column::new(
        "MinPods",
        "string",
        "minReplicas is the lower limit for the number of replicas to which the autoscaler can scale down.  It defaults to 1 pod.  minReplicas is allowed to be 0 if the alpha feature gate HPAScaleToZero is enabled and at least one Object or External metric is configured.  Scaling is active as long as at least one metric value is available.",
    ),
    Column::new(
        "MaxPods",
        "string",
        "maxReplicas is the upper limit for the number of replicas to which the autoscaler can scale up. It cannot be less that minReplicas.",
    ),
    Column::new(
        "Replicas",
        "string",
        "currentReplicas is current number of replicas of pods managed by this autoscaler, as last seen by the autoscaler.",
    ),
    AGE,
];

pub(crate) fn horizontalpodautoscaler(obj: &Value, now: Timestamp) -> Vec<Value> {
    let reference = format!(
        "{}/{}",
        str_at(obj, "/spec/scaleTargetRef/kind"),
        str_at(obj, "/spec/scaleTargetRef/name")
    );
    let min = obj
        .pointer("/spec/minReplicas")
        .and_then(Value::as_i64)
        .map_or_else(|| "<unset>".to_string(), |m| m.to_string());
    let empty = Vec::new();
    let specs = obj.pointer("/spec/metrics").and_then(Value::as_array).unwrap_or(&empty);
    let statuses = obj
        .pointer("/status/currentMetrics")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    vec![
        json!(name(obj)),
        json!(reference),
        json!(format_metrics(specs, statuses)),
        json!(min),
        json!(int_at(obj, "/spec/maxReplicas")),
        json!(int_at(obj, "/status/currentReplicas")),
        json!(age(obj, now)),
    ]
}

/// A quantity as written, or `<unknown>`.
fn quantity(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => "<unknown>".into(),
    }
}

/// Upstream's `formatHPAMetrics`: each metric's current value over its target, at most two,
/// then `+ N more...`.
pub(crate) fn format_metrics(specs: &[Value], statuses: &[Value]) -> String {
    if specs.is_empty() {
        return "<none>".into();
    }
    const MAX: usize = 2;
    let mut list = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let status = statuses.get(i);
        let ty = spec.get("type").and_then(Value::as_str).unwrap_or("");
        let item = match ty {
            "Resource" | "ContainerResource" => {
                let member = if ty == "Resource" {
                    "resource"
                } else {
                    "containerResource"
                };
                let source = spec.get(member);
                let rname = source.and_then(|s| s.get("name")).and_then(Value::as_str).unwrap_or("");
                let label = match source.and_then(|s| s.get("container")).and_then(Value::as_str) {
                    Some(c) => format!("{rname} of container \"{c}\""),
                    None => rname.to_string(),
                };
                let target = source.and_then(|s| s.get("target"));
                let current = status.and_then(|s| s.get(member)).and_then(|s| s.get("current"));
                match target.and_then(|t| t.get("averageValue")) {
                    Some(avg) => format!(
                        "{label}: {}/{}",
                        quantity(current.and_then(|c| c.get("averageValue"))),
                        quantity(Some(avg))
                    ),
                    None => {
                        let cur = current
                            .and_then(|c| c.get("averageUtilization"))
                            .and_then(Value::as_i64)
                            .map_or_else(|| "<unknown>".to_string(), |u| format!("{u}%"));
                        let tgt = target
                            .and_then(|t| t.get("averageUtilization"))
                            .and_then(Value::as_i64)
                            .map_or_else(|| "<auto>".to_string(), |u| format!("{u}%"));
                        format!("{label}: {cur}/{tgt}")
                    }
                }
            }
            "Pods" | "Object" | "External" => {
                let member = match ty {
                    "Pods" => "pods",
                    "Object" => "object",
                    _ => "external",
                };
                let source = spec.get(member);
                let target = source.and_then(|s| s.get("target"));
                let current = status.and_then(|s| s.get(member)).and_then(|s| s.get("current"));
                let (cur, tgt) = match target.and_then(|t| t.get("averageValue")) {
                    Some(avg) => (
                        quantity(current.and_then(|c| c.get("averageValue"))),
                        format!("{} (avg)", quantity(Some(avg))),
                    ),
                    None => (
                        quantity(current.and_then(|c| c.get("value"))),
                        quantity(target.and_then(|t| t.get("value"))),
                    ),
                };
                format!("{cur}/{tgt}")
            }
            _ => "<unknown type>".into(),
        };
        list.push(item);
    }
    if list.len() > MAX {
        let more = list.len() - MAX;
        list.truncate(MAX);
        return format!("{} + {more} more...", list.join(", "));
    }
    list.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_read_current_over_target() {
        let cpu = json!({"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}});
        assert_eq!(format_metrics(std::slice::from_ref(&cpu), &[]), "cpu: <unknown>/50%");
        let status = json!({"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 120, "averageValue": "120m"}}});
        assert_eq!(format_metrics(std::slice::from_ref(&cpu), &[status]), "cpu: 120%/50%");
        let mem = json!({"type": "Resource", "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "100Mi"}}});
        assert_eq!(
            format_metrics(std::slice::from_ref(&mem), &[]),
            "memory: <unknown>/100Mi"
        );
        let pods = json!({"type": "Pods", "pods": {"metric": {"name": "qps"}, "target": {"type": "AverageValue", "averageValue": "10"}}});
        assert_eq!(
            format_metrics(&[cpu, mem, pods], &[]),
            "cpu: <unknown>/50%, memory: <unknown>/100Mi + 1 more..."
        );
        assert_eq!(format_metrics(&[], &[]), "<none>");
    }
}
