//! Upstream's LimitRanger admission rules (`plugin/pkg/admission/limitranger`) without I/O: the
//! default requests and limits a namespace's LimitRanges give containers, and the min, max and
//! maxLimitRequestRatio checks for containers, pods and claims, with upstream's messages.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::quantity::Quantity;
use crate::quota::{ResourceList, list_from, pod_limits, pod_requests};

/// The annotation naming what the plugin set.
pub const ANNOTATION: &str = "kubernetes.io/limit-ranger";

fn items<'a>(lr: &'a Value, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    lr.pointer("/spec/limits")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(move |i| i.get("type").and_then(Value::as_str) == Some(kind))
}

/// Upstream's `defaultContainerResourceRequirements`: the Container items' `defaultRequest`
/// and `default`, later items winning.
fn container_defaults(lr: &Value) -> (ResourceList, ResourceList) {
    let mut requests = ResourceList::new();
    let mut limits = ResourceList::new();
    for item in items(lr, "Container") {
        requests.extend(list_from(item.get("defaultRequest")));
        limits.extend(list_from(item.get("default")));
    }
    (requests, limits)
}

/// Upstream's `mergeContainerResources`: what the container lacks is set from the defaults;
/// returns the annotation's part for it.
fn merge_container(c: &mut Value, requests: &ResourceList, limits: &ResourceList, prefix: &str) -> Vec<String> {
    let name = c.get("name").and_then(Value::as_str).unwrap_or("").to_string();
    let Some(m) = c.as_object_mut() else {
        return Vec::new();
    };
    let res = m.entry("resources").or_insert_with(|| json!({})).as_object_mut();
    let Some(res) = res else { return Vec::new() };
    let mut set = |field: &str, defaults: &ResourceList| -> Vec<String> {
        let mut set = Vec::new();
        if defaults.is_empty() {
            return set;
        }
        let Some(list) = res
            .entry(field)
            .or_insert_with(|| Value::Object(Map::new()))
            .as_object_mut()
        else {
            return set;
        };
        for (k, v) in defaults {
            if !list.contains_key(k) {
                list.insert(k.clone(), json!(v.canonical()));
                set.push(k.clone());
            }
        }
        set
    };
    let set_limits = set("limits", limits);
    let set_requests = set("requests", requests);
    let mut out = Vec::new();
    if !set_requests.is_empty() {
        out.push(format!("{} request for {prefix} {name}", set_requests.join(", ")));
    }
    if !set_limits.is_empty() {
        out.push(format!("{} limit for {prefix} {name}", set_limits.join(", ")));
    }
    out
}

/// Upstream's `PodMutateLimitFunc` for one LimitRange: containers and init containers get the
/// defaults they lack, and the pod the `kubernetes.io/limit-ranger` annotation saying so.
pub fn default_pod(lr: &Value, pod: &mut Value) {
    let (requests, limits) = container_defaults(lr);
    if requests.is_empty() && limits.is_empty() {
        return;
    }
    let mut notes = Vec::new();
    for (field, prefix) in [("containers", "container"), ("initContainers", "init container")] {
        if let Some(cs) = pod.pointer_mut(&format!("/spec/{field}")).and_then(Value::as_array_mut) {
            for c in cs {
                notes.extend(merge_container(c, &requests, &limits, prefix));
            }
        }
    }
    if notes.is_empty() {
        return;
    }
    if let Some(md) = pod.get_mut("metadata").and_then(Value::as_object_mut) {
        let ann = md.entry("annotations").or_insert_with(|| json!({}));
        if let Some(ann) = ann.as_object_mut() {
            ann.insert(
                ANNOTATION.into(),
                json!(format!("LimitRanger plugin set: {}", notes.join("; "))),
            );
        }
    }
}

/// Compare in milli-units when every quantity fits them, in units otherwise, as upstream's
/// `requestLimitEnforcedValues`.
fn scaled(req: Option<&Quantity>, lim: Option<&Quantity>, enforced: &Quantity) -> (i128, i128, i128) {
    let all = [
        req.copied().unwrap_or_default(),
        lim.copied().unwrap_or_default(),
        *enforced,
    ];
    let milli = all.iter().all(|q| q.value() <= i64::MAX / 1000);
    let v = |q: &Quantity| {
        if milli {
            i128::from(q.milli_value())
        } else {
            i128::from(q.value())
        }
    };
    (v(&all[0]), v(&all[1]), v(&all[2]))
}

fn min_constraint(kind: &str, r: &str, enforced: &Quantity, req: &ResourceList, lim: &ResourceList) -> Option<String> {
    let (rq, lq) = (req.get(r), lim.get(r));
    let (rv, lv, ev) = scaled(rq, lq, enforced);
    let Some(rq) = rq else {
        return Some(format!(
            "minimum {r} usage per {kind} is {enforced}.  No request is specified"
        ));
    };
    if rv < ev {
        return Some(format!(
            "minimum {r} usage per {kind} is {enforced}, but request is {rq}"
        ));
    }
    match lq {
        Some(lq) if lv < ev => Some(format!("minimum {r} usage per {kind} is {enforced}, but limit is {lq}")),
        _ => None,
    }
}

fn max_request_constraint(kind: &str, r: &str, enforced: &Quantity, req: &ResourceList) -> Option<String> {
    let rq = req.get(r);
    let (rv, _, ev) = scaled(rq, None, enforced);
    let Some(rq) = rq else {
        return Some(format!(
            "maximum {r} usage per {kind} is {enforced}.  No request is specified"
        ));
    };
    (rv > ev).then(|| format!("maximum {r} usage per {kind} is {enforced}, but request is {rq}"))
}

fn max_constraint(kind: &str, r: &str, enforced: &Quantity, req: &ResourceList, lim: &ResourceList) -> Option<String> {
    let (rq, lq) = (req.get(r), lim.get(r));
    let (rv, lv, ev) = scaled(rq, lq, enforced);
    let Some(lq) = lq else {
        return Some(format!(
            "maximum {r} usage per {kind} is {enforced}.  No limit is specified"
        ));
    };
    if lv > ev {
        return Some(format!("maximum {r} usage per {kind} is {enforced}, but limit is {lq}"));
    }
    match rq {
        Some(rq) if rv > ev => Some(format!(
            "maximum {r} usage per {kind} is {enforced}, but request is {rq}"
        )),
        _ => None,
    }
}

fn ratio_constraint(
    kind: &str,
    r: &str,
    enforced: &Quantity,
    req: &ResourceList,
    lim: &ResourceList,
) -> Option<String> {
    let (rq, lq) = (req.get(r), lim.get(r));
    let (rv, lv, _) = scaled(rq, lq, enforced);
    if rq.is_none() || rv == 0 {
        return Some(format!(
            "{r} max limit to request ratio per {kind} is {enforced}, but no request is specified or request is 0"
        ));
    }
    if lq.is_none() || lv == 0 {
        return Some(format!(
            "{r} max limit to request ratio per {kind} is {enforced}, but no limit is specified or limit is 0"
        ));
    }
    #[allow(clippy::cast_precision_loss)]
    let observed = lv as f64 / rv as f64;
    #[allow(clippy::cast_precision_loss)]
    let allowed = enforced.milli_value() as f64 / 1000.0;
    (observed > allowed).then(|| {
        format!("{r} max limit to request ratio per {kind} is {enforced}, but provided ratio is {observed:.6}")
    })
}

fn check(item: &Value, kind: &str, req: &ResourceList, lim: &ResourceList, errs: &mut Vec<String>) {
    let by_name = |f: &str| -> BTreeMap<String, Quantity> { list_from(item.get(f)) };
    for (r, v) in by_name("min") {
        errs.extend(min_constraint(kind, &r, &v, req, lim));
    }
    for (r, v) in by_name("max") {
        errs.extend(max_constraint(kind, &r, &v, req, lim));
    }
    for (r, v) in by_name("maxLimitRequestRatio") {
        errs.extend(ratio_constraint(kind, &r, &v, req, lim));
    }
}

/// Upstream's `utilerrors.NewAggregate(errs).Error()`: nothing without errors, one message
/// alone, several (each once) in brackets.
pub fn aggregate(errs: Vec<String>) -> Option<String> {
    let mut seen = std::collections::HashSet::new();
    let errs: Vec<String> = errs.into_iter().filter(|e| seen.insert(e.clone())).collect();
    match errs.len() {
        0 => None,
        1 => errs.into_iter().next(),
        _ => Some(format!("[{}]", errs.join(", "))),
    }
}

/// Upstream's `PodValidateLimitFunc`: each container against the Container items, the pod's
/// effective requests and limits against the Pod items.
pub fn validate_pod(lr: &Value, pod: &Value) -> Vec<String> {
    let mut errs = Vec::new();
    for item in lr
        .pointer("/spec/limits")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match item.get("type").and_then(Value::as_str) {
            Some("Container") => {
                for field in ["containers", "initContainers"] {
                    for c in pod
                        .pointer(&format!("/spec/{field}"))
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                    {
                        let req = list_from(c.pointer("/resources/requests"));
                        let lim = list_from(c.pointer("/resources/limits"));
                        check(item, "Container", &req, &lim, &mut errs);
                    }
                }
            }
            Some("Pod") => check(item, "Pod", &pod_requests(pod), &pod_limits(pod), &mut errs),
            _ => {}
        }
    }
    errs
}

/// Upstream's `PersistentVolumeClaimValidateLimitFunc`: the claim's request against the
/// PersistentVolumeClaim items' min and max.
pub fn validate_pvc(lr: &Value, pvc: &Value) -> Vec<String> {
    let mut errs = Vec::new();
    let req = list_from(pvc.pointer("/spec/resources/requests"));
    for item in items(lr, "PersistentVolumeClaim") {
        for (r, v) in list_from(item.get("min")) {
            errs.extend(min_constraint(
                "PersistentVolumeClaim",
                &r,
                &v,
                &req,
                &ResourceList::new(),
            ));
        }
        for (r, v) in list_from(item.get("max")) {
            errs.extend(max_request_constraint("PersistentVolumeClaim", &r, &v, &req));
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lr(limits: Value) -> Value {
        json!({"metadata": {"name": "lr"}, "spec": {"limits": limits}})
    }

    #[test]
    fn containers_get_the_defaults_they_lack_and_the_annotation_says_which() {
        let lr = lr(
            json!([{"type": "Container", "default": {"cpu": "500m", "memory": "256Mi"},
            "defaultRequest": {"cpu": "100m", "memory": "128Mi"}}]),
        );
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "a"}, {"name": "b", "resources": {"limits": {"cpu": "1"}, "requests": {"cpu": "1"}}}]}});
        default_pod(&lr, &mut pod);
        assert_eq!(pod["spec"]["containers"][0]["resources"]["requests"]["cpu"], "100m");
        assert_eq!(pod["spec"]["containers"][0]["resources"]["limits"]["memory"], "256Mi");
        assert_eq!(pod["spec"]["containers"][1]["resources"]["limits"]["cpu"], "1");
        assert_eq!(
            pod["metadata"]["annotations"][ANNOTATION],
            "LimitRanger plugin set: cpu, memory request for container a; cpu, memory limit for container a; memory request for container b; memory limit for container b"
        );
    }

    #[test]
    fn min_max_and_ratio_are_enforced_with_upstream_messages() {
        let lr = lr(
            json!([{"type": "Container", "min": {"cpu": "100m"}, "max": {"memory": "1Gi"},
            "maxLimitRequestRatio": {"cpu": "2"}}]),
        );
        let check = |req: Value, lim: Value| {
            let pod = json!({"spec": {"containers": [{"name": "a", "resources": {"requests": req, "limits": lim}}]}});
            aggregate(validate_pod(&lr, &pod))
        };
        assert_eq!(
            check(json!({"cpu": "50m"}), json!({"cpu": "100m", "memory": "1Gi"})).as_deref(),
            Some("minimum cpu usage per Container is 100m, but request is 50m")
        );
        assert_eq!(
            check(json!({"cpu": "100m"}), json!({"cpu": "300m", "memory": "1Gi"})).as_deref(),
            Some("cpu max limit to request ratio per Container is 2, but provided ratio is 3.000000")
        );
        assert_eq!(
            check(json!({"cpu": "100m"}), json!({"cpu": "200m"})).as_deref(),
            Some("maximum memory usage per Container is 1Gi.  No limit is specified")
        );
        assert_eq!(
            check(json!({"cpu": "50m"}), json!({"cpu": "200m"})).as_deref(),
            Some(
                "[minimum cpu usage per Container is 100m, but request is 50m, maximum memory usage per Container is 1Gi.  No limit is specified, cpu max limit to request ratio per Container is 2, but provided ratio is 4.000000]"
            )
        );
        assert_eq!(
            check(json!({"cpu": "100m"}), json!({"cpu": "200m", "memory": "512Mi"})),
            None
        );
        let pvc_lr =
            self::lr(json!([{"type": "PersistentVolumeClaim", "min": {"storage": "1Gi"}, "max": {"storage": "2Gi"}}]));
        let pvc = |s: &str| {
            aggregate(validate_pvc(
                &pvc_lr,
                &json!({"spec": {"resources": {"requests": {"storage": s}}}}),
            ))
        };
        assert_eq!(
            pvc("3Gi").as_deref(),
            Some("maximum storage usage per PersistentVolumeClaim is 2Gi, but request is 3Gi")
        );
        assert_eq!(
            pvc("500Mi").as_deref(),
            Some("minimum storage usage per PersistentVolumeClaim is 1Gi, but request is 500Mi")
        );
    }
}
