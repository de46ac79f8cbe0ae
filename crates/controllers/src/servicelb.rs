//! ServiceLB, as k3s ships it (its `servicelb` controller): a `type: LoadBalancer` Service is
//! answered by every node's proxy on the node's own address at the Service's ports, so its
//! `status.loadBalancer.ingress` lists those addresses instead of staying `<pending>` forever.
//!
//! - Services with a `spec.loadBalancerClass` are left to the implementation that class names, as
//!   upstream's and k3s' controllers leave them.
//! - The addresses are the ExternalIP, else the InternalIP, of every Ready node that runs pods
//!   (simulated nodes answer nothing and are left out), sorted, `ipMode: VIP` (the proxy also
//!   answers the address inside the cluster).
//! - A Service that stops being a LoadBalancer has its ingress cleared, as upstream's service
//!   controller clears it.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{LoadBalancerIngress, Node, Service};
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::Store;

use crate::controller_utils::{self as cu, WorkQueue};

/// The annotation on nodes that `skiff sim` registers (no pods really run there).
pub const SIMULATED_ANNOTATION: &str = "skiff.dev/simulated";
const CONTROLLER_NAME: &str = "service-lb-controller";

pub async fn run(client: kube::Client) -> anyhow::Result<()> {
    let queue = WorkQueue::new();
    let services = cu::spawn_owner_watch(Api::<Service>::all(client.clone()), queue.clone());
    // Any node change may change every LoadBalancer's addresses.
    let s = services.clone();
    let nodes = cu::spawn_store_watch(Api::<Node>::all(client.clone()), queue.clone(), move |_: &Node| {
        s.state()
            .iter()
            .filter(|svc| is_load_balancer(svc))
            .flat_map(|svc| cu::self_key(&**svc))
            .collect()
    });
    queue
        .run(CONTROLLER_NAME, |key| sync(&client, &services, &nodes, key))
        .await
}

fn is_load_balancer(svc: &Service) -> bool {
    svc.spec.as_ref().is_some_and(|s| {
        s.type_.as_deref() == Some("LoadBalancer") && s.load_balancer_class.as_deref().unwrap_or("").is_empty()
    })
}

/// Whether a node answers LoadBalancer traffic: Ready and not simulated.
fn serves(node: &Node) -> bool {
    let simulated = node
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.get(SIMULATED_ANNOTATION).is_some_and(|v| v == "true"));
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    !simulated && ready
}

/// The address of a node a LoadBalancer is reached on: its ExternalIP, else its InternalIP.
fn node_address(node: &Node) -> Option<String> {
    let addresses = node.status.as_ref()?.addresses.as_ref()?;
    let of = |t: &str| addresses.iter().find(|a| a.type_ == t).map(|a| a.address.clone());
    of("ExternalIP").or_else(|| of("InternalIP"))
}

/// The ingress of a LoadBalancer Service, from the nodes.
pub fn ingress(nodes: &[std::sync::Arc<Node>]) -> Vec<LoadBalancerIngress> {
    let ips: BTreeSet<String> = nodes
        .iter()
        .filter(|n| serves(n))
        .filter_map(|n| node_address(n))
        .collect();
    ips.into_iter()
        .map(|ip| LoadBalancerIngress {
            ip: Some(ip),
            ip_mode: Some("VIP".into()),
            ..Default::default()
        })
        .collect()
}

async fn sync(
    client: &kube::Client,
    services: &Store<Service>,
    nodes: &Store<Node>,
    key: String,
) -> anyhow::Result<Option<Duration>> {
    let (ns, name) = cu::split_key(&key);
    let Some(svc) = services
        .state()
        .into_iter()
        .find(|s| s.metadata.namespace.as_deref() == Some(ns) && s.metadata.name.as_deref() == Some(name))
    else {
        return Ok(None);
    };
    let current = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.clone())
        .unwrap_or_default();
    let desired = if is_load_balancer(&svc) {
        ingress(&nodes.state())
    } else if svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer") {
        // Another implementation's (loadBalancerClass): not ours to write.
        return Ok(None);
    } else {
        Vec::new()
    };
    if current == desired {
        return Ok(None);
    }
    let patch = serde_json::json!({"status": {"loadBalancer": {"ingress": desired}}});
    let api: Api<Service> = Api::namespaced(client.clone(), ns);
    match api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(None),
        Err(e) if cu::is_not_found(&e) => Ok(None),
        Err(e) if cu::is_conflict(&e) => Ok(Some(Duration::from_millis(50))),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Arc;

    fn node(name: &str, ready: &str, simulated: bool, addresses: serde_json::Value) -> Arc<Node> {
        let annotations = if simulated {
            json!({SIMULATED_ANNOTATION: "true"})
        } else {
            json!({})
        };
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "annotations": annotations},
                "status": {"conditions": [{"type": "Ready", "status": ready}], "addresses": addresses},
            }))
            .expect("a Node"),
        )
    }

    #[test]
    fn ingress_lists_ready_real_nodes_external_address_first() {
        let nodes = vec![
            node(
                "b",
                "True",
                false,
                json!([{"type": "InternalIP", "address": "192.0.2.20"}]),
            ),
            node(
                "a",
                "True",
                false,
                json!([{"type": "InternalIP", "address": "192.0.2.10"}, {"type": "ExternalIP", "address": "198.51.100.1"}]),
            ),
            node(
                "down",
                "False",
                false,
                json!([{"type": "InternalIP", "address": "192.0.2.30"}]),
            ),
            node(
                "sim",
                "True",
                true,
                json!([{"type": "InternalIP", "address": "10.0.0.1"}]),
            ),
        ];
        let ips: Vec<_> = ingress(&nodes).into_iter().map(|i| (i.ip, i.ip_mode)).collect();
        assert_eq!(
            ips,
            [
                (Some("192.0.2.20".to_string()), Some("VIP".to_string())),
                (Some("198.51.100.1".to_string()), Some("VIP".to_string())),
            ]
        );
    }

    #[test]
    fn only_classless_load_balancers_are_served() {
        let svc = |spec: serde_json::Value| -> Service {
            serde_json::from_value(json!({"metadata": {"name": "s"}, "spec": spec})).expect("a Service")
        };
        assert!(is_load_balancer(&svc(json!({"type": "LoadBalancer"}))));
        assert!(!is_load_balancer(&svc(
            json!({"type": "LoadBalancer", "loadBalancerClass": "example.com/lb"})
        )));
        assert!(!is_load_balancer(&svc(json!({"type": "NodePort"}))));
    }
}
