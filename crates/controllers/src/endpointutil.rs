//! What the EndpointSlice and Endpoints controllers share, as upstream's
//! `pkg/controller/util/endpoint`: which pods a Service selects, whether a pod belongs in its
//! endpoints, a Service port's target port on a pod, and the caches both watch.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ObjectReference, Pod, Service, ServicePort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Api;
use kube::runtime::reflector::Store;

use crate::controller_utils::{self as cu, WorkQueue};
use crate::informers::{Informer, SharedInformerFactory};

/// The caches a controller of Service endpoints keeps, and the queue of Service keys they feed.
/// The pods are the process's shared pod informer.
pub struct Caches {
    pub services: Store<Service>,
    pub pods: Informer<Pod>,
}

/// Watches Services (each queued under its own key) and takes the pods' events from the shared
/// pod informer (queueing every Service of the pod's namespace that has a selector: a pod whose
/// labels changed may have left a Service, which only a look at all of them finds).
pub fn watch(client: &kube::Client, queue: &WorkQueue, informers: &SharedInformerFactory) -> Caches {
    let services = cu::spawn_owner_watch(Api::<Service>::all(client.clone()), queue.clone());
    let s = services.clone();
    let pods = informers.informer::<Pod>();
    cu::on_changes(&pods, queue.clone(), move |p: &Pod| {
        let ns = p.metadata.namespace.as_deref().unwrap_or_default();
        s.state()
            .iter()
            .filter(|svc| svc.metadata.namespace.as_deref() == Some(ns) && selector(svc).is_some())
            .map(|svc| cu::key(ns, svc.metadata.name.as_deref().unwrap_or_default()))
            .collect()
    });
    Caches { services, pods }
}

/// The Service's selector, if it has one (upstream manages endpoints only for those).
pub fn selector(svc: &Service) -> Option<&BTreeMap<String, String>> {
    svc.spec.as_ref()?.selector.as_ref().filter(|s| !s.is_empty())
}

/// The pods of the Service's namespace its selector matches.
pub fn selected_pods(caches: &Caches, svc: &Service) -> Vec<std::sync::Arc<Pod>> {
    let Some(sel) = selector(svc) else {
        return Vec::new();
    };
    let ns = svc.metadata.namespace.as_deref().unwrap_or_default();
    caches
        .pods
        .list_namespace(ns)
        .into_iter()
        .filter(|p| {
            let labels = p.metadata.labels.as_ref();
            sel.iter().all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
        })
        .collect()
}

/// Upstream's `ShouldPodBeInEndpoints`: a pod with an IP that has not finished (a pod of
/// `restartPolicy: Always` is never finished); terminating pods only when `include_terminating`.
pub fn should_pod_be_in_endpoints(pod: &Pod, include_terminating: bool) -> bool {
    let status = pod.status.as_ref();
    let ip = status.and_then(|s| s.pod_ip.as_deref()).unwrap_or("");
    if ip.is_empty() {
        return false;
    }
    if !include_terminating && pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let restart = pod
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always");
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("");
    match restart {
        "Never" => phase != "Failed" && phase != "Succeeded",
        "OnFailure" => phase != "Succeeded",
        _ => true,
    }
}

/// Upstream's `ShouldSetHostname`: a pod named in its Service's subdomain (StatefulSet pods).
pub fn should_set_hostname(pod: &Pod, svc: &Service) -> bool {
    let spec = pod.spec.as_ref();
    let hostname = spec.and_then(|s| s.hostname.as_deref()).unwrap_or("");
    !hostname.is_empty()
        && spec.and_then(|s| s.subdomain.as_deref()) == svc.metadata.name.as_deref()
        && pod.metadata.namespace == svc.metadata.namespace
}

/// The reference to a pod an endpoint carries (`targetRef`).
pub fn pod_reference(pod: &Pod) -> ObjectReference {
    ObjectReference {
        kind: Some("Pod".into()),
        namespace: pod.metadata.namespace.clone(),
        name: pod.metadata.name.clone(),
        uid: pod.metadata.uid.clone(),
        ..Default::default()
    }
}

/// The hostname an endpoint of `pod` carries for `svc` (see [`should_set_hostname`]).
pub fn endpoint_hostname(pod: &Pod, svc: &Service) -> Option<String> {
    should_set_hostname(pod, svc)
        .then(|| pod.spec.as_ref().and_then(|s| s.hostname.clone()))
        .flatten()
}

/// The node an endpoint of `pod` names, if the pod is bound.
pub fn node_name(pod: &Pod) -> Option<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty())
}

/// Upstream's `podutil.FindPort`: a Service port's target port on the pod (a number as is, a name
/// looked up among the pod's container ports of the same protocol).
pub fn find_port(pod: &Pod, port: &ServicePort) -> Option<i32> {
    let protocol = port.protocol.as_deref().unwrap_or("TCP");
    match &port.target_port {
        None => Some(port.port),
        Some(IntOrString::Int(n)) => Some(if *n == 0 { port.port } else { *n }),
        Some(IntOrString::String(name)) => {
            if let Ok(n) = name.parse::<i32>() {
                return Some(n);
            }
            pod.spec
                .as_ref()?
                .containers
                .iter()
                .flat_map(|c| c.ports.iter().flatten())
                .find(|p| {
                    p.name.as_deref() == Some(name.as_str()) && p.protocol.as_deref().unwrap_or("TCP") == protocol
                })
                .map(|p| p.container_port)
        }
    }
}

/// The Service's labels that its endpoints objects carry (upstream copies them all but the
/// headless marker, which it sets itself).
pub fn service_labels(svc: &Service) -> BTreeMap<String, String> {
    let mut labels = svc.metadata.labels.clone().unwrap_or_default();
    labels.remove("service.kubernetes.io/headless");
    if svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None") {
        labels.insert("service.kubernetes.io/headless".into(), String::new());
    }
    labels
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn pods_in_endpoints_as_upstream() {
        let running = pod(
            serde_json::json!({"metadata": {"name": "a"}, "spec": {"containers": []},
            "status": {"podIP": "10.0.0.1", "phase": "Running"}}),
        );
        assert!(should_pod_be_in_endpoints(&running, false));
        let no_ip = pod(serde_json::json!({"metadata": {"name": "a"}, "status": {"phase": "Running"}}));
        assert!(!should_pod_be_in_endpoints(&no_ip, true));
        let done = pod(
            serde_json::json!({"metadata": {"name": "a"}, "spec": {"restartPolicy": "Never", "containers": []},
            "status": {"podIP": "10.0.0.1", "phase": "Succeeded"}}),
        );
        assert!(!should_pod_be_in_endpoints(&done, true));
        let failed_always = pod(
            serde_json::json!({"metadata": {"name": "a"}, "spec": {"containers": []},
            "status": {"podIP": "10.0.0.1", "phase": "Failed"}}),
        );
        assert!(should_pod_be_in_endpoints(&failed_always, true));
        let terminating = pod(
            serde_json::json!({"metadata": {"name": "a", "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"containers": []}, "status": {"podIP": "10.0.0.1", "phase": "Running"}}),
        );
        assert!(!should_pod_be_in_endpoints(&terminating, false));
        assert!(should_pod_be_in_endpoints(&terminating, true));
    }

    #[test]
    fn named_target_ports_resolve_per_pod() {
        let p = pod(serde_json::json!({"metadata": {"name": "a"}, "spec": {"containers": [
            {"name": "c", "ports": [{"name": "http", "containerPort": 8080}, {"name": "dns", "containerPort": 5353, "protocol": "UDP"}]}]}}));
        let port = |v: serde_json::Value| -> ServicePort { serde_json::from_value(v).unwrap() };
        assert_eq!(
            find_port(&p, &port(serde_json::json!({"port": 80, "targetPort": "http"}))),
            Some(8080)
        );
        assert_eq!(
            find_port(&p, &port(serde_json::json!({"port": 80, "targetPort": 9090}))),
            Some(9090)
        );
        assert_eq!(find_port(&p, &port(serde_json::json!({"port": 80}))), Some(80));
        assert_eq!(
            find_port(&p, &port(serde_json::json!({"port": 53, "targetPort": "dns"}))),
            None,
            "TCP has no dns port"
        );
        assert_eq!(
            find_port(
                &p,
                &port(serde_json::json!({"port": 53, "protocol": "UDP", "targetPort": "dns"}))
            ),
            Some(5353)
        );
        assert_eq!(
            find_port(&p, &port(serde_json::json!({"port": 80, "targetPort": "missing"}))),
            None
        );
    }
}
