//! Upstream's RuntimeClass admission plugin, on pod creates: the pod's RuntimeClass must exist,
//! its `overhead.podFixed` becomes the pod's `spec.overhead` (a pod giving another overhead, or
//! one without a class that defines it, is refused), and its `scheduling` joins the pod's node
//! selector (a conflicting label refuses the pod) and tolerations.

use serde_json::{Map, Value, json};
use skiff_api::StatusError;
use skiff_api::quantity::Quantity;

use crate::handlers::Ctx;
use crate::objects;

/// Whether the plugin looks at this write: creates of pods, not of their subresources.
fn applies(ctx: &Ctx) -> bool {
    let res = ctx.rr.resource;
    res.group.is_empty() && res.plural == "pods" && ctx.rr.subresource.is_empty()
}

/// Admits a pod being created (mutation, then upstream's validation of the overhead).
pub async fn admit(ctx: &Ctx, pod: &mut Value) -> Result<(), StatusError> {
    if !applies(ctx) {
        return Ok(());
    }
    let forbidden = |pod: &Value, msg: &str| StatusError::forbidden_resource("", "pods", objects::name(pod), msg);
    let class = match pod.pointer("/spec/runtimeClassName").and_then(Value::as_str) {
        None => None,
        Some(name) => {
            let res = skiff_api::registry::lookup("node.k8s.io", "v1", "runtimeclasses")
                .ok_or_else(|| StatusError::internal("no runtimeclasses"))?;
            let kv = ctx
                .state
                .store
                .get(&objects::key(res, "", name))
                .await
                .map_err(|e| ctx.store_err(e))?;
            match kv.and_then(|kv| objects::decode_kv(&kv)) {
                Some(c) => Some(c),
                None => {
                    return Err(forbidden(
                        pod,
                        &format!("pod rejected: RuntimeClass {name:?} not found"),
                    ));
                }
            }
        }
    };
    apply(pod, class.as_ref()).map_err(|msg| forbidden(pod, &msg))
}

/// upstream's `setOverhead`, `setScheduling` and `validateOverhead` on a pod given its class;
/// the error is the reason the pod is refused.
pub fn apply(pod: &mut Value, class: Option<&Value>) -> Result<(), String> {
    let fixed = class
        .and_then(|c| c.pointer("/overhead/podFixed"))
        .filter(|v| !v.is_null())
        .cloned();
    let class_overhead = class.and_then(|c| c.get("overhead")).is_some_and(|o| !o.is_null());
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return Ok(());
    };
    let pod_overhead = spec.get("overhead").filter(|v| !v.is_null()).cloned();
    if class_overhead {
        if let Some(given) = &pod_overhead
            && !same_resources(given, fixed.as_ref())
        {
            return Err("pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead".into());
        }
        match fixed {
            Some(f) => {
                spec.insert("overhead".into(), f);
            }
            None => {
                spec.remove("overhead");
            }
        }
    } else if pod_overhead.is_some() {
        return Err("pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead".into());
    }
    let Some(scheduling) = class.and_then(|c| c.get("scheduling")).filter(|s| s.is_object()) else {
        return Ok(());
    };
    if let Some(selector) = scheduling.get("nodeSelector").and_then(Value::as_object) {
        match spec.get_mut("nodeSelector").and_then(Value::as_object_mut) {
            None => {
                spec.insert("nodeSelector".into(), Value::Object(selector.clone()));
            }
            Some(own) => {
                let mut keys: Vec<&String> = selector.keys().collect();
                keys.sort();
                for key in keys {
                    let want = selector.get(key).and_then(Value::as_str).unwrap_or("");
                    if let Some(have) = own.get(key).and_then(Value::as_str)
                        && have != want
                    {
                        return Err(format!(
                            "conflict: runtimeClass.scheduling.nodeSelector[{key}] = {want}; pod.spec.nodeSelector[{key}] = {have}"
                        ));
                    }
                    own.insert(key.clone(), json!(want));
                }
            }
        }
    }
    let extra = scheduling
        .get("tolerations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let own = spec
        .get("tolerations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if !extra.is_empty() || !own.is_empty() {
        spec.insert("tolerations".into(), Value::Array(merge_tolerations(own, extra)));
    }
    Ok(())
}

/// Two resource lists with the same names and equal quantities.
fn same_resources(a: &Value, b: Option<&Value>) -> bool {
    let empty = Map::new();
    let a = a.as_object().unwrap_or(&empty);
    let b = b.and_then(Value::as_object).unwrap_or(&empty);
    a.len() == b.len()
        && a.iter().all(|(k, v)| {
            b.get(k)
                .is_some_and(|w| match (Quantity::from_json(v), Quantity::from_json(w)) {
                    (Ok(x), Ok(y)) => x == y,
                    _ => v == w,
                })
        })
}

/// upstream's `tolerations.MergeTolerations`: both lists, without a toleration another one
/// already covers (of equal ones, the first stays).
fn merge_tolerations(first: Vec<Value>, second: Vec<Value>) -> Vec<Value> {
    let all: Vec<Value> = first.into_iter().chain(second).collect();
    let mut merged: Vec<Value> = Vec::new();
    'next: for (i, t) in all.iter().enumerate() {
        if merged.iter().any(|m| is_superset(m, t)) {
            continue;
        }
        for t2 in &all[i + 1..] {
            if t2 != t && is_superset(t2, t) {
                continue 'next;
            }
        }
        merged.push(t.clone());
    }
    merged
}

/// upstream's `isSuperset`: whether `ss` tolerates everything `t` does.
fn is_superset(ss: &Value, t: &Value) -> bool {
    if ss == t {
        return true;
    }
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let (ss_key, ss_op, ss_effect) = (s(ss, "key"), s(ss, "operator"), s(ss, "effect"));
    if s(t, "key") != ss_key && (!ss_key.is_empty() || ss_op != "Exists") {
        return false;
    }
    if s(t, "effect") != ss_effect && !ss_effect.is_empty() {
        return false;
    }
    if ss_effect == "NoExecute"
        && let Some(limit) = ss.get("tolerationSeconds").and_then(Value::as_i64)
    {
        match t.get("tolerationSeconds").and_then(Value::as_i64) {
            Some(secs) if secs <= limit => {}
            _ => return false,
        }
    }
    match ss_op.as_str() {
        "Equal" | "" => s(t, "operator") == "Equal" && s(t, "value") == s(ss, "value"),
        "Exists" => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class() -> Value {
        json!({"metadata": {"name": "gvisor"}, "handler": "runsc",
            "overhead": {"podFixed": {"cpu": "250m", "memory": "120Mi"}},
            "scheduling": {"nodeSelector": {"runtime": "gvisor"},
                "tolerations": [{"key": "runtime", "operator": "Equal", "value": "gvisor", "effect": "NoSchedule"}]}})
    }

    #[test]
    fn overhead_and_scheduling_are_copied_into_the_pod() {
        let mut pod = json!({"spec": {"runtimeClassName": "gvisor", "nodeSelector": {"disk": "ssd"},
            "tolerations": [{"key": "a", "operator": "Exists"}]}});
        apply(&mut pod, Some(&class())).expect("admitted");
        assert_eq!(pod["spec"]["overhead"], json!({"cpu": "250m", "memory": "120Mi"}));
        assert_eq!(pod["spec"]["nodeSelector"], json!({"disk": "ssd", "runtime": "gvisor"}));
        assert_eq!(
            pod["spec"]["tolerations"],
            json!([{"key": "a", "operator": "Exists"},
                {"key": "runtime", "operator": "Equal", "value": "gvisor", "effect": "NoSchedule"}])
        );
        // The same overhead given by the pod (in another spelling) is accepted.
        let mut pod = json!({"spec": {"overhead": {"cpu": "0.25", "memory": "120Mi"}}});
        apply(&mut pod, Some(&class())).expect("admitted");
    }

    #[test]
    fn conflicts_are_refused_with_upstreams_messages() {
        let mut pod = json!({"spec": {"overhead": {"cpu": "1"}}});
        assert_eq!(
            apply(&mut pod, Some(&class())),
            Err("pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead".to_string())
        );
        let mut pod = json!({"spec": {"overhead": {"cpu": "1"}}});
        assert_eq!(
            apply(&mut pod, None),
            Err("pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead".to_string())
        );
        let mut pod = json!({"spec": {"nodeSelector": {"runtime": "runc"}}});
        assert_eq!(
            apply(&mut pod, Some(&class())),
            Err("conflict: runtimeClass.scheduling.nodeSelector[runtime] = gvisor; pod.spec.nodeSelector[runtime] = runc".to_string())
        );
    }

    #[test]
    fn covered_tolerations_are_not_repeated() {
        let all = json!({"operator": "Exists"});
        let specific = json!({"key": "k", "operator": "Equal", "value": "v"});
        assert_eq!(
            merge_tolerations(vec![all.clone()], vec![specific.clone()]),
            vec![all.clone()]
        );
        assert_eq!(
            merge_tolerations(vec![specific.clone()], vec![specific.clone()]),
            vec![specific.clone()]
        );
        let no_exec =
            |secs: i64| json!({"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": secs});
        assert_eq!(
            merge_tolerations(vec![no_exec(10)], vec![no_exec(20)]),
            vec![no_exec(20)]
        );
    }
}
