//! `skiff explain service NAME`: why a Service has the endpoints it has, read with the same rules
//! the EndpointSlice controller applies (`endpointutil`): which pods its selector takes and which
//! nearly match, which of those are not ready and why, which target ports resolve on no pod, and
//! what its EndpointSlices hold now.

use std::collections::BTreeMap;
use std::fmt::Write;

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::controller_utils as cu;
use crate::endpointutil;

/// How far a pod's labels are from a selector: the selector's pairs it misses, as
/// `key=wanted (has: value|none)`.
fn label_misses(selector: &BTreeMap<String, String>, pod: &Pod) -> Vec<String> {
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    selector
        .iter()
        .filter(|(k, v)| labels.get(*k) != Some(*v))
        .map(|(k, v)| match labels.get(k) {
            Some(has) => format!("{k}={v} (the pod has {k}={has})"),
            None => format!("{k}={v} (the pod has no {k} label)"),
        })
        .collect()
}

/// Why a pod with an IP is not ready: its Ready condition and its containers' states.
fn not_ready_reason(pod: &Pod) -> String {
    let status = pod.status.as_ref();
    let mut why = Vec::new();
    for c in status.and_then(|s| s.conditions.as_ref()).into_iter().flatten() {
        if (c.type_ == "Ready" || c.type_ == "ContainersReady") && c.status != "True" {
            let detail = [c.reason.as_deref(), c.message.as_deref()]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(": ");
            if !detail.is_empty() {
                why.push(detail);
            }
            break;
        }
    }
    for cs in status.and_then(|s| s.container_statuses.as_ref()).into_iter().flatten() {
        if cs.ready {
            continue;
        }
        let state = cs.state.as_ref();
        let detail = if let Some(w) = state.and_then(|s| s.waiting.as_ref()) {
            format!("waiting: {}", w.reason.as_deref().unwrap_or("?"))
        } else if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
            format!(
                "terminated: {} (exit code {})",
                t.reason.as_deref().unwrap_or("?"),
                t.exit_code
            )
        } else if cs.started == Some(true) || state.and_then(|s| s.running.as_ref()).is_some() {
            "running, readiness probe not passing".to_string()
        } else {
            "not started".to_string()
        };
        why.push(format!("container {:?} {detail}", cs.name));
    }
    if why.is_empty() {
        "no Ready condition reported yet".to_string()
    } else {
        why.join("; ")
    }
}

fn port_label(p: &k8s_openapi::api::core::v1::ServicePort) -> String {
    let target = match &p.target_port {
        Some(IntOrString::String(s)) => format!("{s:?}"),
        Some(IntOrString::Int(n)) => n.to_string(),
        None => p.port.to_string(),
    };
    let name = p
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .map(|n| format!(" ({n})"))
        .unwrap_or_default();
    format!(
        "{}/{}{name} -> {target}",
        p.port,
        p.protocol.as_deref().unwrap_or("TCP")
    )
}

/// The explanation, as printed. `pods` are the pods of the Service's namespace.
pub fn explain(svc: &Service, pods: &[Pod], slices: &[EndpointSlice]) -> String {
    let mut out = String::new();
    let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
    let name = svc.metadata.name.as_deref().unwrap_or_default();
    let spec = svc.spec.clone().unwrap_or_default();
    let ty = spec.type_.as_deref().unwrap_or("ClusterIP");
    let ip = spec.cluster_ip.as_deref().unwrap_or("<none>");
    let _ = writeln!(out, "Service {ns}/{name}: {ty}, ClusterIP {ip}");
    if ty == "ExternalName" {
        let _ = writeln!(
            out,
            "  an ExternalName Service has no endpoints: its name is an alias (CNAME) of {}",
            spec.external_name.as_deref().unwrap_or("?")
        );
        return out;
    }
    let ports = spec.ports.clone().unwrap_or_default();
    let _ = writeln!(
        out,
        "  ports: {}",
        if ports.is_empty() {
            "none".to_string()
        } else {
            ports.iter().map(port_label).collect::<Vec<_>>().join(", ")
        }
    );
    let Some(selector) = endpointutil::selector(svc).cloned() else {
        let _ = writeln!(
            out,
            "  no selector: its EndpointSlices and Endpoints are written by whoever owns it, not by a controller"
        );
        write_slices(&mut out, slices);
        return out;
    };
    let sel: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let _ = writeln!(out, "  selector: {}", sel.join(","));

    let mut selected: Vec<&Pod> = Vec::new();
    let mut near: Vec<(&Pod, Vec<String>)> = Vec::new();
    for pod in pods {
        let misses = label_misses(&selector, pod);
        if misses.is_empty() {
            selected.push(pod);
        } else if misses.len() < selector.len() || selector.len() == 1 {
            near.push((pod, misses));
        }
    }
    selected.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let publish = spec.publish_not_ready_addresses.unwrap_or(false);
    let (mut ready, mut not_ready, mut left_out) = (Vec::new(), Vec::new(), Vec::new());
    for pod in &selected {
        let pname = pod.metadata.name.as_deref().unwrap_or_default();
        let pod_ip = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref()).unwrap_or("");
        if !endpointutil::should_pod_be_in_endpoints(pod, true) {
            let phase = pod
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .unwrap_or("Pending");
            let why = if pod_ip.is_empty() {
                let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or("");
                if node.is_empty() {
                    format!("{phase}, not scheduled yet (see `skiff explain pod {pname} -n {ns}`)")
                } else {
                    format!("{phase} on {node}, no IP yet")
                }
            } else {
                format!("{phase}: a finished pod serves nothing")
            };
            left_out.push(format!("{pname}: {why}"));
        } else if pod.metadata.deletion_timestamp.is_some() {
            not_ready.push(format!("{pname} {pod_ip}: terminating"));
        } else if publish || cu::is_pod_ready(pod) {
            ready.push(format!("{pname} {pod_ip}"));
        } else {
            not_ready.push(format!("{pname} {pod_ip}: {}", not_ready_reason(pod)));
        }
    }
    let _ = writeln!(
        out,
        "  selects {} pod(s): {} ready, {} not ready, {} without an address",
        selected.len(),
        ready.len(),
        not_ready.len(),
        left_out.len()
    );
    for (title, list) in [
        ("ready", &ready),
        ("not ready", &not_ready),
        ("not in endpoints", &left_out),
    ] {
        for line in list {
            let _ = writeln!(out, "    {title}: {line}");
        }
    }
    if publish && !selected.is_empty() {
        let _ = writeln!(
            out,
            "  publishNotReadyAddresses: every selected pod with an IP counts as ready"
        );
    }
    for p in &ports {
        let missing: Vec<&str> = selected
            .iter()
            .filter(|pod| endpointutil::find_port(pod, p).is_none())
            .filter_map(|pod| pod.metadata.name.as_deref())
            .collect();
        if !missing.is_empty() {
            let _ = writeln!(
                out,
                "  port {}: the target port resolves on no container port of {} (no such named port with this protocol)",
                port_label(p),
                missing.join(", ")
            );
        }
    }
    if selected.is_empty() {
        let _ = writeln!(out, "  no pod in {ns} has all of the selector's labels");
    }
    near.sort_by(|a, b| a.0.metadata.name.cmp(&b.0.metadata.name));
    for (pod, misses) in near.iter().take(10) {
        let _ = writeln!(
            out,
            "    nearly: {} lacks {}",
            pod.metadata.name.as_deref().unwrap_or_default(),
            misses.join(", ")
        );
    }
    write_slices(&mut out, slices);
    out
}

fn write_slices(out: &mut String, slices: &[EndpointSlice]) {
    if slices.is_empty() {
        let _ = writeln!(out, "  EndpointSlices: none");
        return;
    }
    for s in slices {
        let ready = s
            .endpoints
            .iter()
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
            .count();
        let _ = writeln!(
            out,
            "  EndpointSlice {}: {} endpoint(s), {ready} ready",
            s.metadata.name.as_deref().unwrap_or_default(),
            s.endpoints.len()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn explains_missing_endpoints() {
        let svc: Service = serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"type": "ClusterIP", "clusterIP": "10.96.3.4", "selector": {"app": "web", "tier": "front"},
                     "ports": [{"port": 80, "protocol": "TCP", "targetPort": "http"}]}}))
        .unwrap();
        let ports = json!([{"name": "http", "containerPort": 8080}]);
        let pods = vec![
            pod(
                json!({"metadata": {"name": "a", "labels": {"app": "web", "tier": "front"}},
                "spec": {"nodeName": "n1", "containers": [{"name": "c", "ports": ports}]},
                "status": {"podIP": "10.244.0.2", "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}),
            ),
            pod(
                json!({"metadata": {"name": "b", "labels": {"app": "web", "tier": "front"}},
                "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
                "status": {"podIP": "10.244.0.3", "phase": "Running",
                    "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady", "message": "containers with unready status: [c]"}],
                    "containerStatuses": [{"name": "c", "ready": false, "restartCount": 0, "image": "x", "imageID": "", "started": true,
                        "state": {"running": {}}}]}}),
            ),
            pod(
                json!({"metadata": {"name": "c", "labels": {"app": "web", "tier": "front"}},
                "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Pending"}}),
            ),
            pod(
                json!({"metadata": {"name": "d", "labels": {"app": "web", "tier": "back"}},
                "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Running", "podIP": "10.244.0.9"}}),
            ),
            pod(json!({"metadata": {"name": "e", "labels": {"other": "x"}}, "spec": {"containers": []}})),
        ];
        let text = explain(&svc, &pods, &[]);
        assert!(
            text.contains("selects 3 pod(s): 1 ready, 1 not ready, 1 without an address"),
            "{text}"
        );
        assert!(text.contains("ready: a 10.244.0.2"), "{text}");
        assert!(
            text.contains("not ready: b 10.244.0.3: ContainersNotReady: containers with unready status: [c]; container \"c\" running, readiness probe not passing"),
            "{text}"
        );
        assert!(
            text.contains("not in endpoints: c: Pending, not scheduled yet"),
            "{text}"
        );
        assert!(
            text.contains("the target port resolves on no container port of b, c"),
            "{text}"
        );
        assert!(
            text.contains("nearly: d lacks tier=front (the pod has tier=back)"),
            "{text}"
        );
        assert!(
            !text.contains("nearly: e"),
            "a pod that matches nothing is not near: {text}"
        );
        assert!(text.contains("EndpointSlices: none"), "{text}");
    }
}
