//! autoscaling/v1 HorizontalPodAutoscalers to and from autoscaling/v2, the version stored, as
//! upstream's `pkg/apis/autoscaling/v1/conversion.go`: `targetCPUUtilizationPercentage` is a
//! `Resource` cpu `Utilization` metric, `currentCPUUtilizationPercentage` its current value,
//! and what v1 cannot say travels in the `autoscaling.alpha.kubernetes.io/...` annotations
//! (the other metrics and current metrics in v1's own `MetricSpec`/`MetricStatus` form, the
//! conditions, and the behavior as upstream marshals its internal type: Go field names).

use serde_json::{Map, Value, json};

pub const METRIC_SPECS_ANNOTATION: &str = "autoscaling.alpha.kubernetes.io/metrics";
pub const METRIC_STATUSES_ANNOTATION: &str = "autoscaling.alpha.kubernetes.io/current-metrics";
pub const CONDITIONS_ANNOTATION: &str = "autoscaling.alpha.kubernetes.io/conditions";
pub const BEHAVIOR_SPECS_ANNOTATION: &str = "autoscaling.alpha.kubernetes.io/behavior";
/// The target v1 implied before v2 made it explicit.
const DEFAULT_CPU_UTILIZATION: i64 = 80;

const ROUND_TRIP_ANNOTATIONS: [&str; 4] = [
    METRIC_SPECS_ANNOTATION,
    METRIC_STATUSES_ANNOTATION,
    CONDITIONS_ANNOTATION,
    BEHAVIOR_SPECS_ANNOTATION,
];

fn obj(v: Option<&Value>) -> Map<String, Value> {
    v.and_then(Value::as_object).cloned().unwrap_or_default()
}

/// Copies the fields `keys` of `from` that are set into `to`.
fn copy(from: &Map<String, Value>, to: &mut Map<String, Value>, keys: &[&str]) {
    for k in keys {
        if let Some(v) = from.get(*k).filter(|v| !v.is_null()) {
            to.insert((*k).to_string(), v.clone());
        }
    }
}

/// Sets `key` when `v` is set.
fn put(to: &mut Map<String, Value>, key: &str, v: Option<&Value>) {
    if let Some(v) = v.filter(|v| !v.is_null()) {
        to.insert(key.to_string(), v.clone());
    }
}

/// A required Go `resource.Quantity`: its zero value marshals as "0".
fn quantity_or_zero(v: Option<&Value>) -> Value {
    v.filter(|v| !v.is_null()).cloned().unwrap_or_else(|| json!("0"))
}

/// The metadata with the round-trip annotations removed (an empty map dropped).
fn metadata_without_round_trip(obj: &Value) -> Map<String, Value> {
    let mut md = self::obj(obj.get("metadata"));
    if let Some(a) = md.get_mut("annotations").and_then(Value::as_object_mut) {
        for k in ROUND_TRIP_ANNOTATIONS {
            a.remove(k);
        }
        if a.is_empty() {
            md.remove("annotations");
        }
    }
    md
}

fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj.pointer("/metadata/annotations")
        .and_then(|a| a.get(key))
        .and_then(Value::as_str)
}

/// An annotation's JSON list, when it parses (upstream ignores what does not).
fn annotation_list(obj: &Value, key: &str) -> Option<Vec<Value>> {
    match serde_json::from_str::<Value>(annotation(obj, key)?) {
        Ok(Value::Array(items)) => Some(items),
        _ => None,
    }
}

fn is_cpu_utilization_target(m: &Value) -> bool {
    m.get("type").and_then(Value::as_str) == Some("Resource")
        && m.pointer("/resource/name").and_then(Value::as_str) == Some("cpu")
        && m.pointer("/resource/target/averageUtilization")
            .is_some_and(|v| !v.is_null())
}

// ---- v2 to v1 -------------------------------------------------------------------------------

/// An autoscaling/v2 HorizontalPodAutoscaler (or a partial one) as autoscaling/v1 serves it.
pub fn hpa_to_v1(v2: &Value) -> Value {
    let mut md = metadata_without_round_trip(v2);
    let spec2 = obj(v2.get("spec"));
    let status2 = obj(v2.get("status"));
    let metrics = spec2
        .get("metrics")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();

    let mut spec = Map::new();
    put(&mut spec, "scaleTargetRef", spec2.get("scaleTargetRef"));
    put(&mut spec, "minReplicas", spec2.get("minReplicas"));
    put(&mut spec, "maxReplicas", spec2.get("maxReplicas"));
    // The first cpu metric decides, whatever its target.
    if let Some(cpu) = metrics.iter().find(|m| {
        m.get("type").and_then(Value::as_str) == Some("Resource")
            && m.pointer("/resource/name").and_then(Value::as_str) == Some("cpu")
    }) {
        put(
            &mut spec,
            "targetCPUUtilizationPercentage",
            cpu.pointer("/resource/target/averageUtilization"),
        );
    }

    let mut status = Map::new();
    copy(
        &status2,
        &mut status,
        &[
            "observedGeneration",
            "lastScaleTime",
            "currentReplicas",
            "desiredReplicas",
        ],
    );
    let current = status2
        .get("currentMetrics")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for m in &current {
        if m.get("type").and_then(Value::as_str) == Some("Resource")
            && m.pointer("/resource/name").and_then(Value::as_str) == Some("cpu")
        {
            put(
                &mut status,
                "currentCPUUtilizationPercentage",
                m.pointer("/resource/current/averageUtilization"),
            );
        }
    }
    if v2.get("status").is_some() {
        // Required in v1: the zero values.
        status.entry("currentReplicas").or_insert(json!(0));
        status.entry("desiredReplicas").or_insert(json!(0));
    }

    let other: Vec<Value> = metrics
        .iter()
        .filter(|m| !is_cpu_utilization_target(m))
        .map(metric_spec_to_v1)
        .collect();
    let conditions = status2
        .get("conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut add = Vec::new();
    if !other.is_empty() {
        add.push((METRIC_SPECS_ANNOTATION, Value::Array(other)));
    }
    if !current.is_empty() {
        add.push((
            METRIC_STATUSES_ANNOTATION,
            Value::Array(current.iter().map(metric_status_to_v1).collect()),
        ));
    }
    if !conditions.is_empty() {
        add.push((CONDITIONS_ANNOTATION, Value::Array(conditions)));
    }
    if let Some(b) = spec2.get("behavior").filter(|b| b.is_object()) {
        add.push((BEHAVIOR_SPECS_ANNOTATION, behavior_to_go(b)));
    }
    if !add.is_empty() {
        let a = md.entry("annotations").or_insert_with(|| Value::Object(Map::new()));
        if let Some(a) = a.as_object_mut() {
            for (k, v) in add {
                a.insert(k.to_string(), Value::String(v.to_string()));
            }
        }
    }

    let mut out = Map::new();
    out.insert("kind".into(), json!("HorizontalPodAutoscaler"));
    out.insert("apiVersion".into(), json!("autoscaling/v1"));
    out.insert("metadata".into(), Value::Object(md));
    if v2.get("spec").is_some() {
        out.insert("spec".into(), Value::Object(spec));
    }
    if v2.get("status").is_some() {
        out.insert("status".into(), Value::Object(status));
    }
    Value::Object(out)
}

/// A v2 `MetricSpec` in v1's annotation form (upstream's v2beta1-like `autoscalingv1.MetricSpec`).
fn metric_spec_to_v1(m: &Value) -> Value {
    let ty = m.get("type").and_then(Value::as_str).unwrap_or_default();
    let mut out = Map::new();
    out.insert("type".into(), json!(ty));
    match ty {
        "Resource" | "ContainerResource" => {
            let key = if ty == "Resource" {
                "resource"
            } else {
                "containerResource"
            };
            let src = obj(m.get(key));
            let mut r = Map::new();
            copy(&src, &mut r, &["name", "container"]);
            put(
                &mut r,
                "targetAverageUtilization",
                src.get("target").and_then(|t| t.get("averageUtilization")),
            );
            put(
                &mut r,
                "targetAverageValue",
                src.get("target").and_then(|t| t.get("averageValue")),
            );
            out.insert(key.into(), Value::Object(r));
        }
        "Pods" => {
            let src = obj(m.get("pods"));
            let mut p = Map::new();
            put(&mut p, "metricName", src.get("metric").and_then(|x| x.get("name")));
            p.insert(
                "targetAverageValue".into(),
                quantity_or_zero(src.get("target").and_then(|t| t.get("averageValue"))),
            );
            put(&mut p, "selector", src.get("metric").and_then(|x| x.get("selector")));
            out.insert("pods".into(), Value::Object(p));
        }
        "Object" => {
            let src = obj(m.get("object"));
            let mut o = Map::new();
            o.insert("target".into(), json!(obj(src.get("describedObject"))));
            put(&mut o, "metricName", src.get("metric").and_then(|x| x.get("name")));
            o.insert(
                "targetValue".into(),
                quantity_or_zero(src.get("target").and_then(|t| t.get("value"))),
            );
            put(&mut o, "selector", src.get("metric").and_then(|x| x.get("selector")));
            put(
                &mut o,
                "averageValue",
                src.get("target").and_then(|t| t.get("averageValue")),
            );
            out.insert("object".into(), Value::Object(o));
        }
        "External" => {
            let src = obj(m.get("external"));
            let mut e = Map::new();
            put(&mut e, "metricName", src.get("metric").and_then(|x| x.get("name")));
            put(
                &mut e,
                "metricSelector",
                src.get("metric").and_then(|x| x.get("selector")),
            );
            put(&mut e, "targetValue", src.get("target").and_then(|t| t.get("value")));
            put(
                &mut e,
                "targetAverageValue",
                src.get("target").and_then(|t| t.get("averageValue")),
            );
            out.insert("external".into(), Value::Object(e));
        }
        _ => {}
    }
    Value::Object(out)
}

/// A v2 `MetricStatus` in v1's annotation form.
fn metric_status_to_v1(m: &Value) -> Value {
    let ty = m.get("type").and_then(Value::as_str).unwrap_or_default();
    let mut out = Map::new();
    out.insert("type".into(), json!(ty));
    let current = |src: &Map<String, Value>, k: &str| src.get("current").and_then(|c| c.get(k)).cloned();
    match ty {
        "Resource" | "ContainerResource" => {
            let key = if ty == "Resource" {
                "resource"
            } else {
                "containerResource"
            };
            let src = obj(m.get(key));
            let mut r = Map::new();
            copy(&src, &mut r, &["name", "container"]);
            put(
                &mut r,
                "currentAverageUtilization",
                current(&src, "averageUtilization").as_ref(),
            );
            r.insert(
                "currentAverageValue".into(),
                quantity_or_zero(current(&src, "averageValue").as_ref()),
            );
            out.insert(key.into(), Value::Object(r));
        }
        "Pods" => {
            let src = obj(m.get("pods"));
            let mut p = Map::new();
            put(&mut p, "metricName", src.get("metric").and_then(|x| x.get("name")));
            p.insert(
                "currentAverageValue".into(),
                quantity_or_zero(current(&src, "averageValue").as_ref()),
            );
            put(&mut p, "selector", src.get("metric").and_then(|x| x.get("selector")));
            out.insert("pods".into(), Value::Object(p));
        }
        "Object" => {
            let src = obj(m.get("object"));
            let mut o = Map::new();
            o.insert("target".into(), json!(obj(src.get("describedObject"))));
            put(&mut o, "metricName", src.get("metric").and_then(|x| x.get("name")));
            o.insert("currentValue".into(), quantity_or_zero(current(&src, "value").as_ref()));
            put(&mut o, "selector", src.get("metric").and_then(|x| x.get("selector")));
            put(&mut o, "averageValue", current(&src, "averageValue").as_ref());
            out.insert("object".into(), Value::Object(o));
        }
        "External" => {
            let src = obj(m.get("external"));
            let mut e = Map::new();
            put(&mut e, "metricName", src.get("metric").and_then(|x| x.get("name")));
            put(
                &mut e,
                "metricSelector",
                src.get("metric").and_then(|x| x.get("selector")),
            );
            e.insert("currentValue".into(), quantity_or_zero(current(&src, "value").as_ref()));
            put(&mut e, "currentAverageValue", current(&src, "averageValue").as_ref());
            out.insert("external".into(), Value::Object(e));
        }
        _ => {}
    }
    Value::Object(out)
}

/// The behavior as upstream's `json.Marshal` of its internal type writes it: Go field names,
/// nil pointers as `null`.
fn behavior_to_go(b: &Value) -> Value {
    let rules = |r: Option<&Value>| -> Value {
        let Some(r) = r.filter(|r| r.is_object()) else {
            return Value::Null;
        };
        let policies: Vec<Value> = r
            .get("policies")
            .and_then(Value::as_array)
            .map(|ps| {
                ps.iter()
                    .map(|p| {
                        json!({
                            "Type": p.get("type").cloned().unwrap_or(json!("")),
                            "Value": p.get("value").cloned().unwrap_or(json!(0)),
                            "PeriodSeconds": p.get("periodSeconds").cloned().unwrap_or(json!(0)),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        json!({
            "StabilizationWindowSeconds": r.get("stabilizationWindowSeconds").cloned().unwrap_or(Value::Null),
            "SelectPolicy": r.get("selectPolicy").cloned().unwrap_or(Value::Null),
            "Policies": if policies.is_empty() { Value::Null } else { Value::Array(policies) },
            "Tolerance": r.get("tolerance").cloned().unwrap_or(Value::Null),
        })
    };
    json!({"ScaleUp": rules(b.get("scaleUp")), "ScaleDown": rules(b.get("scaleDown"))})
}

// ---- v1 to v2 -------------------------------------------------------------------------------

/// An autoscaling/v1 HorizontalPodAutoscaler as autoscaling/v2 stores it.
pub fn hpa_to_v2(v1: &Value) -> Value {
    let md = metadata_without_round_trip(v1);
    let spec1 = obj(v1.get("spec"));
    let status1 = obj(v1.get("status"));

    let mut spec = Map::new();
    put(&mut spec, "scaleTargetRef", spec1.get("scaleTargetRef"));
    put(&mut spec, "minReplicas", spec1.get("minReplicas"));
    put(&mut spec, "maxReplicas", spec1.get("maxReplicas"));
    let mut metrics: Vec<Value> = Vec::new();
    if let Some(pct) = spec1.get("targetCPUUtilizationPercentage").filter(|v| !v.is_null()) {
        metrics.push(cpu_utilization_metric(pct.clone()));
    }
    if let Some(other) = annotation_list(v1, METRIC_SPECS_ANNOTATION) {
        // The metrics v1 cannot say come first, then the one it can.
        let mut all: Vec<Value> = other.iter().map(metric_spec_to_v2).collect();
        all.append(&mut metrics);
        metrics = all;
    }
    if metrics.is_empty() {
        metrics.push(cpu_utilization_metric(json!(DEFAULT_CPU_UTILIZATION)));
    }
    spec.insert("metrics".into(), Value::Array(metrics));
    if let Some(b) = annotation(v1, BEHAVIOR_SPECS_ANNOTATION).and_then(behavior_from_go) {
        spec.insert("behavior".into(), b);
    }

    let mut status = Map::new();
    copy(
        &status1,
        &mut status,
        &[
            "observedGeneration",
            "lastScaleTime",
            "currentReplicas",
            "desiredReplicas",
        ],
    );
    if let Some(pct) = status1.get("currentCPUUtilizationPercentage").filter(|v| !v.is_null()) {
        status.insert(
            "currentMetrics".into(),
            json!([{"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": pct}}}]),
        );
    }
    if let Some(current) = annotation_list(v1, METRIC_STATUSES_ANNOTATION).filter(|c| !c.is_empty()) {
        // The annotation says more than the percentage.
        status.insert(
            "currentMetrics".into(),
            Value::Array(current.iter().map(metric_status_to_v2).collect()),
        );
    }
    if let Some(conditions) = annotation_list(v1, CONDITIONS_ANNOTATION).filter(|c| !c.is_empty()) {
        status.insert("conditions".into(), Value::Array(conditions));
    }

    let mut out = Map::new();
    out.insert("kind".into(), json!("HorizontalPodAutoscaler"));
    out.insert("apiVersion".into(), json!("autoscaling/v2"));
    out.insert("metadata".into(), Value::Object(md));
    out.insert("spec".into(), Value::Object(spec));
    if v1.get("status").is_some() || !status.is_empty() {
        out.insert("status".into(), Value::Object(status));
    }
    Value::Object(out)
}

fn cpu_utilization_metric(pct: Value) -> Value {
    json!({"type": "Resource",
           "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": pct}}})
}

fn metric_spec_to_v2(m: &Value) -> Value {
    let ty = m.get("type").and_then(Value::as_str).unwrap_or_default();
    let mut out = Map::new();
    out.insert("type".into(), json!(ty));
    match ty {
        "Resource" | "ContainerResource" => {
            let key = if ty == "Resource" {
                "resource"
            } else {
                "containerResource"
            };
            let src = obj(m.get(key));
            let mut r = Map::new();
            copy(&src, &mut r, &["name", "container"]);
            let utilization = src.get("targetAverageUtilization").filter(|v| !v.is_null());
            let mut t = Map::new();
            t.insert(
                "type".into(),
                json!(if utilization.is_some() {
                    "Utilization"
                } else {
                    "AverageValue"
                }),
            );
            put(&mut t, "averageValue", src.get("targetAverageValue"));
            put(&mut t, "averageUtilization", utilization);
            r.insert("target".into(), Value::Object(t));
            out.insert(key.into(), Value::Object(r));
        }
        "Pods" => {
            let src = obj(m.get("pods"));
            out.insert(
                "pods".into(),
                json!({
                    "metric": identifier(src.get("metricName"), src.get("selector")),
                    "target": {"type": "AverageValue", "averageValue": quantity_or_zero(src.get("targetAverageValue"))},
                }),
            );
        }
        "Object" => {
            let src = obj(m.get("object"));
            let average = src.get("averageValue").filter(|v| !v.is_null());
            let mut t = Map::new();
            t.insert(
                "type".into(),
                json!(if average.is_some() { "AverageValue" } else { "Value" }),
            );
            t.insert("value".into(), quantity_or_zero(src.get("targetValue")));
            put(&mut t, "averageValue", average);
            out.insert(
                "object".into(),
                json!({
                    "describedObject": obj(src.get("target")),
                    "metric": identifier(src.get("metricName"), src.get("selector")),
                    "target": t,
                }),
            );
        }
        "External" => {
            let src = obj(m.get("external"));
            let value = src.get("targetValue").filter(|v| !v.is_null());
            let mut t = Map::new();
            t.insert(
                "type".into(),
                json!(if value.is_some() { "Value" } else { "AverageValue" }),
            );
            put(&mut t, "value", value);
            put(&mut t, "averageValue", src.get("targetAverageValue"));
            out.insert(
                "external".into(),
                json!({
                    "metric": identifier(src.get("metricName"), src.get("metricSelector")),
                    "target": t,
                }),
            );
        }
        _ => {}
    }
    Value::Object(out)
}

fn metric_status_to_v2(m: &Value) -> Value {
    let ty = m.get("type").and_then(Value::as_str).unwrap_or_default();
    let mut out = Map::new();
    out.insert("type".into(), json!(ty));
    match ty {
        "Resource" | "ContainerResource" => {
            let key = if ty == "Resource" {
                "resource"
            } else {
                "containerResource"
            };
            let src = obj(m.get(key));
            let mut r = Map::new();
            copy(&src, &mut r, &["name", "container"]);
            let mut c = Map::new();
            c.insert("averageValue".into(), quantity_or_zero(src.get("currentAverageValue")));
            put(&mut c, "averageUtilization", src.get("currentAverageUtilization"));
            r.insert("current".into(), Value::Object(c));
            out.insert(key.into(), Value::Object(r));
        }
        "Pods" => {
            let src = obj(m.get("pods"));
            out.insert(
                "pods".into(),
                json!({
                    "metric": identifier(src.get("metricName"), src.get("selector")),
                    "current": {"averageValue": quantity_or_zero(src.get("currentAverageValue"))},
                }),
            );
        }
        "Object" => {
            let src = obj(m.get("object"));
            let mut c = Map::new();
            c.insert("value".into(), quantity_or_zero(src.get("currentValue")));
            put(&mut c, "averageValue", src.get("averageValue"));
            out.insert(
                "object".into(),
                json!({
                    "describedObject": obj(src.get("target")),
                    "metric": identifier(src.get("metricName"), src.get("selector")),
                    "current": c,
                }),
            );
        }
        "External" => {
            let src = obj(m.get("external"));
            let mut c = Map::new();
            c.insert("value".into(), quantity_or_zero(src.get("currentValue")));
            put(&mut c, "averageValue", src.get("currentAverageValue"));
            out.insert(
                "external".into(),
                json!({
                    "metric": identifier(src.get("metricName"), src.get("metricSelector")),
                    "current": c,
                }),
            );
        }
        _ => {}
    }
    Value::Object(out)
}

/// A v2 `MetricIdentifier`.
fn identifier(name: Option<&Value>, selector: Option<&Value>) -> Value {
    let mut m = Map::new();
    m.insert("name".into(), name.cloned().unwrap_or(json!("")));
    put(&mut m, "selector", selector);
    Value::Object(m)
}

/// Go's `encoding/json` matches keys case-insensitively.
fn get_ci<'a>(m: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    m.get(key)
        .or_else(|| m.iter().find(|(k, _)| k.eq_ignore_ascii_case(key)).map(|(_, v)| v))
        .filter(|v| !v.is_null())
}

/// The behavior annotation read back; `None` when it does not parse or says nothing
/// (upstream keeps only a behavior other than the zero value).
fn behavior_from_go(raw: &str) -> Option<Value> {
    let v: Value = serde_json::from_str(raw).ok()?;
    let b = v.as_object()?;
    let rules = |key: &str| -> Option<Value> {
        let r = get_ci(b, key)?.as_object()?;
        let mut out = Map::new();
        put(
            &mut out,
            "stabilizationWindowSeconds",
            get_ci(r, "StabilizationWindowSeconds"),
        );
        put(&mut out, "selectPolicy", get_ci(r, "SelectPolicy"));
        if let Some(ps) = get_ci(r, "Policies").and_then(Value::as_array) {
            let policies: Vec<Value> = ps
                .iter()
                .filter_map(Value::as_object)
                .map(|p| {
                    json!({
                        "type": get_ci(p, "Type").cloned().unwrap_or(json!("")),
                        "value": get_ci(p, "Value").cloned().unwrap_or(json!(0)),
                        "periodSeconds": get_ci(p, "PeriodSeconds").cloned().unwrap_or(json!(0)),
                    })
                })
                .collect();
            out.insert("policies".into(), Value::Array(policies));
        }
        put(&mut out, "tolerance", get_ci(r, "Tolerance"));
        Some(Value::Object(out))
    };
    let mut out = Map::new();
    put(&mut out, "scaleUp", rules("ScaleUp").as_ref());
    put(&mut out, "scaleDown", rules("ScaleDown").as_ref());
    (!out.is_empty()).then_some(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v1(spec: Value) -> Value {
        json!({"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
               "metadata": {"name": "web", "namespace": "default"}, "spec": spec})
    }

    #[test]
    fn target_cpu_percentage_is_a_cpu_utilization_metric() {
        let v2 = hpa_to_v2(&v1(json!({
            "scaleTargetRef": {"kind": "Deployment", "name": "web", "apiVersion": "apps/v1"},
            "minReplicas": 1, "maxReplicas": 5, "targetCPUUtilizationPercentage": 60})));
        assert_eq!(v2["apiVersion"], "autoscaling/v2");
        assert_eq!(v2["spec"]["maxReplicas"], 5);
        assert_eq!(
            v2["spec"]["metrics"],
            json!([{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 60}}}])
        );
        let back = hpa_to_v1(&v2);
        assert_eq!(back["spec"]["targetCPUUtilizationPercentage"], 60);
        assert_eq!(back["spec"]["scaleTargetRef"]["name"], "web");
        assert!(back["metadata"].get("annotations").is_none(), "{back}");
    }

    #[test]
    fn no_target_is_the_implicit_eighty_percent() {
        let v2 = hpa_to_v2(&v1(json!({"maxReplicas": 3})));
        assert_eq!(v2["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"], 80);
    }

    #[test]
    fn v2_only_fields_survive_a_v1_round_trip() {
        let v2 = json!({
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web", "annotations": {"keep": "me"}},
            "spec": {
                "scaleTargetRef": {"kind": "Deployment", "name": "web", "apiVersion": "apps/v1"},
                "maxReplicas": 10,
                "metrics": [
                    {"type": "Resource", "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "100Mi"}}},
                    {"type": "Pods", "pods": {"metric": {"name": "qps"}, "target": {"type": "AverageValue", "averageValue": "10"}}},
                    {"type": "External", "external": {"metric": {"name": "queue", "selector": {"matchLabels": {"q": "a"}}},
                                                      "target": {"type": "Value", "value": "30"}}},
                    {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}},
                ],
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": 60, "selectPolicy": "Max",
                                           "policies": [{"type": "Pods", "value": 2, "periodSeconds": 30}]}},
            },
            "status": {
                "currentReplicas": 2, "desiredReplicas": 3,
                "currentMetrics": [{"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 40, "averageValue": "200m"}}}],
                "conditions": [{"type": "AbleToScale", "status": "True", "reason": "ReadyForNewScale"}],
            },
        });
        let v1 = hpa_to_v1(&v2);
        assert_eq!(v1["apiVersion"], "autoscaling/v1");
        assert_eq!(v1["spec"]["targetCPUUtilizationPercentage"], 50);
        assert_eq!(v1["status"]["currentCPUUtilizationPercentage"], 40);
        assert_eq!(v1["status"]["desiredReplicas"], 3);
        let ann = &v1["metadata"]["annotations"];
        assert_eq!(ann["keep"], "me");
        let metrics: Value =
            serde_json::from_str(ann[METRIC_SPECS_ANNOTATION].as_str().expect("metrics")).expect("json");
        assert_eq!(
            metrics,
            json!([
                {"type": "Resource", "resource": {"name": "memory", "targetAverageValue": "100Mi"}},
                {"type": "Pods", "pods": {"metricName": "qps", "targetAverageValue": "10"}},
                {"type": "External", "external": {"metricName": "queue", "metricSelector": {"matchLabels": {"q": "a"}}, "targetValue": "30"}},
            ])
        );
        let behavior: Value =
            serde_json::from_str(ann[BEHAVIOR_SPECS_ANNOTATION].as_str().expect("behavior")).expect("json");
        assert_eq!(behavior["ScaleDown"]["StabilizationWindowSeconds"], 60);
        assert_eq!(behavior["ScaleUp"], Value::Null);

        // Back to v2: the same spec and status, the annotations gone.
        let again = hpa_to_v2(&v1);
        assert_eq!(again["spec"], v2["spec"]);
        assert_eq!(again["status"], v2["status"]);
        assert_eq!(again["metadata"]["annotations"], json!({"keep": "me"}));
    }

    #[test]
    fn round_trip_annotations_a_client_sends_are_not_kept() {
        let mut hpa = v1(json!({"maxReplicas": 2, "targetCPUUtilizationPercentage": 70}));
        hpa["metadata"]["annotations"] = json!({METRIC_SPECS_ANNOTATION: "not json", CONDITIONS_ANNOTATION: "[]"});
        let v2 = hpa_to_v2(&hpa);
        assert!(v2["metadata"].get("annotations").is_none());
        assert_eq!(v2["spec"]["metrics"].as_array().map(Vec::len), Some(1));
        assert!(v2.get("status").is_none(), "{v2}");
    }
}
