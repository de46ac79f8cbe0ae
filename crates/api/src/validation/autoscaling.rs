//! HorizontalPodAutoscaler (upstream's `pkg/apis/autoscaling/validation`, autoscaling/v2): the
//! scale target, the replica bounds, each metric source and its target, and the behavior's
//! rules and policies, with upstream's messages.

use serde_json::Value;

use super::{Path, field, int_at, invalid, not_supported, required, str_at};
use crate::status::FieldError;

const METRIC_TYPES: &[&str] = &["ContainerResource", "External", "Object", "Pods", "Resource"];
const TARGET_TYPES: &[&str] = &["AverageValue", "Utilization", "Value"];
const POLICY_TYPES: &[&str] = &["Percent", "Pods"];
const SELECT_POLICIES: &[&str] = &["Disabled", "Max", "Min"];
/// `MaxPeriodSeconds` of a scaling policy and `MaxStabilizationWindowSeconds` of a rule.
const MAX_PERIOD_SECONDS: i64 = 1800;
const MAX_STABILIZATION_WINDOW_SECONDS: i64 = 3600;

pub(crate) fn validate_horizontal_pod_autoscaler(obj: &Value, errs: &mut Vec<FieldError>) {
    let spec = field(Some(obj), "spec");
    let p = Path::new("spec");
    validate_scale_target_ref(field(spec, "scaleTargetRef"), &p.child("scaleTargetRef"), errs);
    let min = int_at(spec, "minReplicas");
    if let Some(min) = min
        && min < 1
    {
        errs.push(invalid(
            &p.child("minReplicas"),
            &min.into(),
            "must be greater than or equal to 1",
        ));
    }
    let max = int_at(spec, "maxReplicas").unwrap_or(0);
    if max < 1 {
        errs.push(invalid(&p.child("maxReplicas"), &max.into(), "must be greater than 0"));
    }
    if let Some(min) = min
        && max < min
    {
        errs.push(invalid(
            &p.child("maxReplicas"),
            &max.into(),
            "must be greater than or equal to `minReplicas`",
        ));
    }
    let metrics = field(spec, "metrics").and_then(Value::as_array);
    for (i, m) in metrics.into_iter().flatten().enumerate() {
        validate_metric(m, &p.child("metrics").index(i), errs);
    }
    if let Some(behavior) = field(spec, "behavior") {
        let bp = p.child("behavior");
        for rules in ["scaleUp", "scaleDown"] {
            if let Some(r) = field(Some(behavior), rules) {
                validate_rules(r, &bp.child(rules), errs);
            }
        }
    }
}

fn validate_scale_target_ref(r: Option<&Value>, p: &Path, errs: &mut Vec<FieldError>) {
    let kind = str_at(r, "kind");
    if kind.is_empty() {
        errs.push(required(&p.child("kind"), ""));
    } else if let Some(bad) = path_segment_problem(kind) {
        errs.push(invalid(&p.child("kind"), &kind.into(), bad));
    }
    let name = str_at(r, "name");
    if name.is_empty() {
        errs.push(required(&p.child("name"), ""));
    } else if let Some(bad) = path_segment_problem(name) {
        errs.push(invalid(&p.child("name"), &name.into(), bad));
    }
}

/// `path.IsValidPathSegmentName`'s first complaint.
fn path_segment_problem(s: &str) -> Option<&'static str> {
    match s {
        "." => Some("may not be '.'"),
        ".." => Some("may not be '..'"),
        _ if s.contains('/') => Some("may not contain '/'"),
        _ if s.contains('%') => Some("may not contain '%'"),
        _ => None,
    }
}

fn validate_metric(m: &Value, p: &Path, errs: &mut Vec<FieldError>) {
    let ty = str_at(Some(m), "type");
    if ty.is_empty() {
        errs.push(required(&p.child("type"), "must specify a metric source type"));
        return;
    }
    if !METRIC_TYPES.contains(&ty) {
        errs.push(not_supported(&p.child("type"), &ty.into(), METRIC_TYPES));
        return;
    }
    let member = match ty {
        "Resource" => "resource",
        "ContainerResource" => "containerResource",
        "Pods" => "pods",
        "Object" => "object",
        _ => "external",
    };
    let Some(source) = field(Some(m), member) else {
        errs.push(required(
            &p.child(member),
            &format!("must populate information for the given metric source (type {ty})"),
        ));
        return;
    };
    let sp = p.child(member);
    match ty {
        "Resource" | "ContainerResource" => {
            if str_at(Some(source), "name").is_empty() {
                errs.push(required(&sp.child("name"), "must specify a resource name"));
            }
            if ty == "ContainerResource" && str_at(Some(source), "container").is_empty() {
                errs.push(required(&sp.child("container"), "must specify a container"));
            }
        }
        _ => {
            if str_at(field(Some(source), "metric"), "name").is_empty() {
                errs.push(required(
                    &sp.child("metric").child("name"),
                    "must specify a metric name",
                ));
            }
        }
    }
    if ty == "Object" && field(Some(source), "describedObject").is_none() {
        errs.push(required(&sp.child("describedObject"), ""));
    }
    validate_target(field(Some(source), "target"), ty, &sp.child("target"), errs);
}

fn validate_target(t: Option<&Value>, metric_type: &str, p: &Path, errs: &mut Vec<FieldError>) {
    let ty = str_at(t, "type");
    if ty.is_empty() {
        errs.push(required(&p.child("type"), "must specify a metric target type"));
    } else if !TARGET_TYPES.contains(&ty) {
        errs.push(not_supported(&p.child("type"), &ty.into(), TARGET_TYPES));
    }
    let utilization = int_at(t, "averageUtilization");
    if let Some(u) = utilization
        && u < 1
    {
        errs.push(invalid(
            &p.child("averageUtilization"),
            &u.into(),
            "must be greater than 0",
        ));
    }
    let set = |k: &str| field(t, k).is_some();
    match ty {
        "Utilization" if utilization.is_none() => errs.push(required(
            &p.child("averageUtilization"),
            "must set averageUtilization when metric target type is Utilization",
        )),
        "Utilization" if !matches!(metric_type, "Resource" | "ContainerResource") => errs.push(invalid(
            &p.child("type"),
            &ty.into(),
            "must be either Value or AverageValue for metric types other than Resource and ContainerResource",
        )),
        "Value" if !set("value") => errs.push(required(
            &p.child("value"),
            "must set value when metric target type is Value",
        )),
        "AverageValue" if !set("averageValue") => errs.push(required(
            &p.child("averageValue"),
            "must set averageValue when metric target type is AverageValue",
        )),
        _ => {}
    }
}

fn validate_rules(r: &Value, p: &Path, errs: &mut Vec<FieldError>) {
    if let Some(w) = int_at(Some(r), "stabilizationWindowSeconds")
        && !(0..=MAX_STABILIZATION_WINDOW_SECONDS).contains(&w)
    {
        let detail = if w < 0 {
            "must be greater than or equal to zero".to_string()
        } else {
            format!("must be less than or equal to {MAX_STABILIZATION_WINDOW_SECONDS}")
        };
        errs.push(invalid(&p.child("stabilizationWindowSeconds"), &w.into(), &detail));
    }
    let select = str_at(Some(r), "selectPolicy");
    if !select.is_empty() && !SELECT_POLICIES.contains(&select) {
        errs.push(not_supported(&p.child("selectPolicy"), &select.into(), SELECT_POLICIES));
    }
    let policies = field(Some(r), "policies").and_then(Value::as_array);
    if policies.is_none_or(|a| a.is_empty()) && select != "Disabled" {
        errs.push(required(&p.child("policies"), "must specify at least one Policy"));
    }
    for (i, policy) in policies.into_iter().flatten().enumerate() {
        let pp = p.child("policies").index(i);
        let ty = str_at(Some(policy), "type");
        if !POLICY_TYPES.contains(&ty) {
            errs.push(not_supported(&pp.child("type"), &ty.into(), POLICY_TYPES));
        }
        let value = int_at(Some(policy), "value").unwrap_or(0);
        if value <= 0 {
            errs.push(invalid(&pp.child("value"), &value.into(), "must be greater than zero"));
        }
        let period = int_at(Some(policy), "periodSeconds").unwrap_or(0);
        if period <= 0 {
            errs.push(invalid(
                &pp.child("periodSeconds"),
                &period.into(),
                "must be greater than zero",
            ));
        } else if period > MAX_PERIOD_SECONDS {
            errs.push(invalid(
                &pp.child("periodSeconds"),
                &period.into(),
                &format!("must be less than or equal to {MAX_PERIOD_SECONDS}"),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn messages(obj: &Value) -> Vec<String> {
        let mut errs = Vec::new();
        validate_horizontal_pod_autoscaler(obj, &mut errs);
        errs.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn a_valid_autoscaler_passes() {
        let hpa = json!({"spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "minReplicas": 1, "maxReplicas": 3,
            "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}}],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300, "selectPolicy": "Max",
                "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]}},
        }});
        assert!(messages(&hpa).is_empty(), "{:?}", messages(&hpa));
    }

    #[test]
    fn bounds_targets_and_metrics_as_upstream() {
        let hpa = json!({"spec": {
            "scaleTargetRef": {"kind": "", "name": "a/b"},
            "minReplicas": 5, "maxReplicas": 2,
            "metrics": [
                {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization"}}},
                {"type": "Pods", "pods": {"metric": {"name": "qps"}, "target": {"type": "Utilization", "averageUtilization": 5}}},
                {"type": "Bogus"},
            ],
        }});
        let m = messages(&hpa);
        for expected in [
            "spec.scaleTargetRef.kind: Required value",
            "spec.scaleTargetRef.name: Invalid value: \"a/b\": may not contain '/'",
            "spec.maxReplicas: Invalid value: 2: must be greater than or equal to `minReplicas`",
            "spec.metrics[0].resource.target.averageUtilization: Required value: must set averageUtilization when metric target type is Utilization",
            "spec.metrics[1].pods.target.type: Invalid value: \"Utilization\": must be either Value or AverageValue for metric types other than Resource and ContainerResource",
            "spec.metrics[2].type: Unsupported value: \"Bogus\"",
        ] {
            assert!(m.iter().any(|x| x.starts_with(expected)), "{expected} not in {m:#?}");
        }
        let zero = messages(
            &json!({"spec": {"scaleTargetRef": {"kind": "Deployment", "name": "w"}, "minReplicas": 0, "maxReplicas": 0}}),
        );
        assert!(
            zero.contains(&"spec.minReplicas: Invalid value: 0: must be greater than or equal to 1".to_string()),
            "{zero:?}"
        );
        assert!(
            zero.contains(&"spec.maxReplicas: Invalid value: 0: must be greater than 0".to_string()),
            "{zero:?}"
        );
    }
}
