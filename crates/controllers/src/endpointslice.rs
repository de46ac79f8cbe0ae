//! The EndpointSlice controller (upstream's `pkg/controller/endpointslice`): for every Service
//! with a selector, EndpointSlices of at most 100 endpoints listing the selected pods that have
//! an IP, with upstream's conditions (ready, serving, terminating; `publishNotReadyAddresses`),
//! each pod's target ports resolved by name (pods whose ports resolve alike share slices), the
//! pod's node and, for StatefulSet pods in the Service's subdomain, its hostname. A Service that
//! selects nothing gets one placeholder slice, as upstream's. Slices are written only when they
//! change, and kept filled as they are so that a change touches as few of them as it can.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::reflector::Store;
use parking_lot::Mutex;

use crate::controller_utils::{self as cu, WorkQueue};
use crate::endpointutil::{self, Caches};

pub const CONTROLLER_NAME: &str = "endpointslice-controller.k8s.io";
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
pub const LABEL_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
/// Upstream's `--max-endpoints-per-slice` default.
pub const MAX_ENDPOINTS_PER_SLICE: usize = 100;

struct Ctx {
    client: kube::Client,
    caches: Caches,
    slices: Store<EndpointSlice>,
    /// Upstream's endpointSliceTracker: the resourceVersion of every slice this controller wrote
    /// (None: deleted), until its watch has caught up, so a sync never acts on a stale cache.
    written: Mutex<HashMap<String, HashMap<String, Option<u64>>>>,
}

pub async fn run(client: kube::Client, informers: crate::informers::SharedInformerFactory) -> anyhow::Result<()> {
    let queue = WorkQueue::new();
    let caches = endpointutil::watch(&client, &queue, &informers);
    let slices = cu::spawn_store_watch(
        Api::<EndpointSlice>::all(client.clone()),
        queue.clone(),
        |s: &EndpointSlice| {
            let labels = s.metadata.labels.as_ref();
            match (
                labels.and_then(|l| l.get(LABEL_SERVICE_NAME)),
                labels.and_then(|l| l.get(LABEL_MANAGED_BY)),
            ) {
                (Some(svc), Some(by)) if by == CONTROLLER_NAME => {
                    vec![cu::key(s.metadata.namespace.as_deref().unwrap_or_default(), svc)]
                }
                _ => Vec::new(),
            }
        },
    );
    let ctx = Ctx {
        client,
        caches,
        slices,
        written: Mutex::new(HashMap::new()),
    };
    queue.run("endpointslice", |key| sync(&ctx, key)).await
}

fn rv(meta: &ObjectMeta) -> u64 {
    meta.resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The managed slices of a Service in the cache, or None while the cache lags this controller's
/// own writes.
fn cached_slices(ctx: &Ctx, key: &str, ns: &str, name: &str) -> Option<Vec<Arc<EndpointSlice>>> {
    let slices: Vec<Arc<EndpointSlice>> = ctx
        .slices
        .state()
        .into_iter()
        .filter(|s| {
            let labels = s.metadata.labels.as_ref();
            s.metadata.namespace.as_deref() == Some(ns)
                && labels.and_then(|l| l.get(LABEL_SERVICE_NAME)).map(String::as_str) == Some(name)
                && labels.and_then(|l| l.get(LABEL_MANAGED_BY)).map(String::as_str) == Some(CONTROLLER_NAME)
        })
        .collect();
    let mut written = ctx.written.lock();
    if let Some(expected) = written.get_mut(key) {
        expected.retain(|slice, want| {
            let seen = slices
                .iter()
                .find(|s| s.metadata.name.as_deref() == Some(slice.as_str()));
            match (want, seen) {
                (Some(want), Some(s)) => rv(&s.metadata) < *want,
                (Some(_), None) => true,
                (None, Some(_)) => true,
                (None, None) => false,
            }
        });
        if !expected.is_empty() {
            return None;
        }
        written.remove(key);
    }
    Some(slices)
}

async fn sync(ctx: &Ctx, key: String) -> anyhow::Result<Option<Duration>> {
    let (ns, name) = cu::split_key(&key);
    let Some(existing) = cached_slices(ctx, &key, ns, name) else {
        return Ok(Some(Duration::from_millis(50)));
    };
    let api: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), ns);
    let svc = ctx
        .caches
        .services
        .state()
        .into_iter()
        .find(|s| s.metadata.namespace.as_deref() == Some(ns) && s.metadata.name.as_deref() == Some(name));
    let managed = svc.as_ref().filter(|s| {
        endpointutil::selector(s).is_some()
            && s.spec.as_ref().and_then(|sp| sp.type_.as_deref()) != Some("ExternalName")
            && s.metadata.deletion_timestamp.is_none()
    });
    let Some(svc) = managed else {
        // Gone, or no longer selecting: its slices go (the garbage collector would, too).
        for s in &existing {
            let slice = s.metadata.name.clone().unwrap_or_default();
            cu::delete_ignoring_missing(&api, &slice, &DeleteParams::default()).await?;
            note(ctx, &key, &slice, None);
        }
        return Ok(None);
    };
    let pods = endpointutil::selected_pods(&ctx.caches, svc);
    let desired = desired_endpoints(svc, &pods);
    let plan = reconcile(svc, &existing, desired);
    for s in plan.delete {
        cu::delete_ignoring_missing(&api, &s, &DeleteParams::default()).await?;
        note(ctx, &key, &s, None);
    }
    for s in plan.update {
        let name = s.metadata.name.clone().unwrap_or_default();
        match api.replace(&name, &PostParams::default(), &s).await {
            Ok(w) => note(ctx, &key, &name, Some(rv(&w.metadata))),
            Err(e) if cu::is_conflict(&e) || cu::is_not_found(&e) => return Ok(Some(Duration::from_millis(50))),
            Err(e) => return Err(e.into()),
        }
    }
    for s in plan.create {
        match api.create(&PostParams::default(), &s).await {
            Ok(w) => note(
                ctx,
                &key,
                w.metadata.name.as_deref().unwrap_or_default(),
                Some(rv(&w.metadata)),
            ),
            Err(e) if cu::is_namespace_terminating(&e) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(None)
}

fn note(ctx: &Ctx, key: &str, slice: &str, rv: Option<u64>) {
    ctx.written
        .lock()
        .entry(key.to_string())
        .or_default()
        .insert(slice.to_string(), rv);
}

/// The endpoints the Service's pods give, grouped by the ports they resolve to.
fn desired_endpoints(svc: &Service, pods: &[Arc<Pod>]) -> BTreeMap<Vec<PortKey>, Vec<Endpoint>> {
    let publish = svc
        .spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false);
    let mut out: BTreeMap<Vec<PortKey>, Vec<Endpoint>> = BTreeMap::new();
    let mut sorted: Vec<&Arc<Pod>> = pods
        .iter()
        .filter(|p| endpointutil::should_pod_be_in_endpoints(p, true))
        .collect();
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for pod in sorted {
        let ports: Vec<PortKey> = svc
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|sp| {
                endpointutil::find_port(pod, sp).map(|port| PortKey {
                    name: sp.name.clone().unwrap_or_default(),
                    protocol: sp.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    port,
                    app_protocol: sp.app_protocol.clone(),
                })
            })
            .collect();
        let serving = publish || cu::is_pod_ready(pod);
        let terminating = pod.metadata.deletion_timestamp.is_some();
        let ready = publish || (serving && !terminating);
        let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap_or_default();
        out.entry(ports).or_default().push(Endpoint {
            addresses: vec![ip],
            conditions: Some(EndpointConditions {
                ready: Some(ready),
                serving: Some(serving),
                terminating: Some(terminating),
            }),
            hostname: endpointutil::endpoint_hostname(pod, svc),
            node_name: endpointutil::node_name(pod),
            target_ref: Some(endpointutil::pod_reference(pod)),
            ..Default::default()
        });
    }
    out
}

/// A slice's port, ordered so that port sets compare alike.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct PortKey {
    name: String,
    protocol: String,
    port: i32,
    app_protocol: Option<String>,
}

fn endpoint_ports(ports: &[PortKey]) -> Option<Vec<EndpointPort>> {
    if ports.is_empty() {
        return None;
    }
    Some(
        ports
            .iter()
            .map(|p| EndpointPort {
                name: Some(p.name.clone()),
                protocol: Some(p.protocol.clone()),
                port: Some(p.port),
                app_protocol: p.app_protocol.clone(),
            })
            .collect(),
    )
}

fn slice_ports(s: &EndpointSlice) -> Vec<PortKey> {
    let mut out: Vec<PortKey> = s
        .ports
        .iter()
        .flatten()
        .map(|p| PortKey {
            name: p.name.clone().unwrap_or_default(),
            protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
            port: p.port.unwrap_or(0),
            app_protocol: p.app_protocol.clone(),
        })
        .collect();
    out.sort();
    out
}

#[derive(Default)]
struct Plan {
    create: Vec<EndpointSlice>,
    update: Vec<EndpointSlice>,
    delete: Vec<String>,
}

fn new_slice(svc: &Service, ports: &[PortKey], endpoints: Vec<Endpoint>) -> EndpointSlice {
    let name = svc.metadata.name.clone().unwrap_or_default();
    let mut labels = endpointutil::service_labels(svc);
    labels.insert(LABEL_SERVICE_NAME.into(), name.clone());
    labels.insert(LABEL_MANAGED_BY.into(), CONTROLLER_NAME.into());
    EndpointSlice {
        metadata: ObjectMeta {
            generate_name: Some(format!("{name}-")),
            namespace: svc.metadata.namespace.clone(),
            labels: Some(labels),
            owner_references: Some(vec![cu::new_controller_ref(&svc.metadata, "v1", "Service")]),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        endpoints,
        ports: endpoint_ports(ports),
    }
}

/// Upstream's reconciler, simplified: per port set, endpoints already in a slice stay in it (a
/// changed one is rewritten in place), new ones fill the slices that have room, then new slices;
/// slices left empty go, but one placeholder stays for a Service that selects nothing.
fn reconcile(svc: &Service, existing: &[Arc<EndpointSlice>], desired: BTreeMap<Vec<PortKey>, Vec<Endpoint>>) -> Plan {
    let mut plan = Plan::default();
    let labels = {
        let mut l = endpointutil::service_labels(svc);
        l.insert(LABEL_SERVICE_NAME.into(), svc.metadata.name.clone().unwrap_or_default());
        l.insert(LABEL_MANAGED_BY.into(), CONTROLLER_NAME.into());
        l
    };
    let mut by_ports: BTreeMap<Vec<PortKey>, Vec<&Arc<EndpointSlice>>> = BTreeMap::new();
    for s in existing {
        by_ports.entry(slice_ports(s)).or_default().push(s);
    }
    let mut kept_any = false;
    for (ports, endpoints) in &desired {
        let mut slices: Vec<EndpointSlice> = by_ports
            .remove(ports)
            .unwrap_or_default()
            .into_iter()
            .map(|s| (**s).clone())
            .collect();
        slices.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let originals = slices.clone();
        let by_ip: HashMap<&str, &Endpoint> = endpoints
            .iter()
            .filter_map(|e| e.addresses.first().map(|a| (a.as_str(), e)))
            .collect();
        let mut placed: std::collections::HashSet<&str> = std::collections::HashSet::new();
        for s in &mut slices {
            s.endpoints.retain(|e| {
                e.addresses
                    .first()
                    .is_some_and(|a| by_ip.contains_key(a.as_str()) && !placed.contains(a.as_str()))
            });
            for e in &mut s.endpoints {
                let ip = e.addresses.first().map(String::as_str).unwrap_or_default();
                if let Some((key, want)) = by_ip.get_key_value(ip) {
                    placed.insert(key);
                    *e = (*want).clone();
                }
            }
        }
        let mut rest = endpoints
            .iter()
            .filter(|e| e.addresses.first().is_some_and(|a| !placed.contains(a.as_str())));
        for s in &mut slices {
            while s.endpoints.len() < MAX_ENDPOINTS_PER_SLICE {
                match rest.next() {
                    Some(e) => s.endpoints.push(e.clone()),
                    None => break,
                }
            }
        }
        let rest: Vec<Endpoint> = rest.cloned().collect();
        for chunk in rest.chunks(MAX_ENDPOINTS_PER_SLICE) {
            plan.create.push(new_slice(svc, ports, chunk.to_vec()));
        }
        for (mut s, original) in slices.into_iter().zip(originals) {
            if s.endpoints.is_empty() {
                plan.delete.push(s.metadata.name.clone().unwrap_or_default());
                continue;
            }
            kept_any = true;
            s.metadata.labels = Some(labels.clone());
            if s != original {
                plan.update.push(s);
            }
        }
    }
    // Slices of port sets no pod resolves to any more.
    let mut leftovers: Vec<&Arc<EndpointSlice>> = by_ports.into_values().flatten().collect();
    leftovers.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let nothing = desired.is_empty();
    for (i, s) in leftovers.iter().enumerate() {
        if nothing && i == 0 && !kept_any && plan.create.is_empty() {
            // The placeholder: one empty slice with no ports.
            let mut placeholder = (***s).clone();
            placeholder.endpoints.clear();
            placeholder.ports = None;
            placeholder.metadata.labels = Some(labels.clone());
            if placeholder != ***s {
                plan.update.push(placeholder);
            }
            kept_any = true;
            continue;
        }
        plan.delete.push(s.metadata.name.clone().unwrap_or_default());
    }
    if nothing && !kept_any && plan.create.is_empty() {
        plan.create.push(new_slice(svc, &[], Vec::new()));
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(spec: serde_json::Value) -> Service {
        serde_json::from_value(
            serde_json::json!({"metadata": {"name": "web", "namespace": "default", "uid": "u1",
            "labels": {"app": "web"}}, "spec": spec}),
        )
        .unwrap()
    }

    fn pod(name: &str, ip: &str, ready: bool) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"), "labels": {"app": "web"}},
                "spec": {"nodeName": "n1", "containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]},
                "status": {"podIP": ip, "phase": "Running",
                    "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
            }))
            .unwrap(),
        )
    }

    fn with_name(mut s: EndpointSlice, name: &str) -> Arc<EndpointSlice> {
        s.metadata.name = Some(name.into());
        s.metadata.generate_name = None;
        Arc::new(s)
    }

    #[test]
    fn endpoints_carry_upstream_conditions_ports_and_references() {
        let s = svc(
            serde_json::json!({"selector": {"app": "web"}, "ports": [{"name": "web", "port": 80, "targetPort": "http", "protocol": "TCP"}]}),
        );
        let desired = desired_endpoints(&s, &[pod("b", "10.0.0.2", false), pod("a", "10.0.0.1", true)]);
        assert_eq!(desired.len(), 1);
        let (ports, eps) = desired.iter().next().unwrap();
        assert_eq!(ports[0].port, 8080, "the named target port resolved on the pod");
        assert_eq!(eps[0].addresses, ["10.0.0.1"]);
        let c = eps[1].conditions.clone().unwrap();
        assert_eq!(
            (c.ready, c.serving, c.terminating),
            (Some(false), Some(false), Some(false))
        );
        assert_eq!(eps[0].node_name.as_deref(), Some("n1"));
        assert_eq!(eps[0].target_ref.as_ref().unwrap().name.as_deref(), Some("a"));

        let plan = reconcile(&s, &[], desired);
        assert_eq!(plan.create.len(), 1);
        let slice = &plan.create[0];
        assert_eq!(slice.metadata.generate_name.as_deref(), Some("web-"));
        let labels = slice.metadata.labels.clone().unwrap();
        assert_eq!(labels[LABEL_SERVICE_NAME], "web");
        assert_eq!(labels[LABEL_MANAGED_BY], CONTROLLER_NAME);
        assert_eq!(labels["app"], "web");
        assert_eq!(slice.metadata.owner_references.as_ref().unwrap()[0].kind, "Service");

        // publishNotReadyAddresses: every endpoint is ready.
        let p = svc(
            serde_json::json!({"selector": {"app": "web"}, "publishNotReadyAddresses": true, "ports": [{"port": 80}]}),
        );
        let desired = desired_endpoints(&p, &[pod("b", "10.0.0.2", false)]);
        let c = desired.values().next().unwrap()[0].conditions.clone().unwrap();
        assert_eq!((c.ready, c.serving), (Some(true), Some(true)));
    }

    #[test]
    fn slices_hold_at_most_100_and_change_in_place() {
        let s = svc(serde_json::json!({"selector": {"app": "web"}, "ports": [{"port": 80}]}));
        let pods: Vec<Arc<Pod>> = (0..250)
            .map(|i| pod(&format!("p{i:03}"), &format!("10.0.{}.{}", i / 200, i % 200 + 1), true))
            .collect();
        let plan = reconcile(&s, &[], desired_endpoints(&s, &pods));
        let sizes: Vec<usize> = plan.create.iter().map(|s| s.endpoints.len()).collect();
        assert_eq!(sizes, [100, 100, 50]);
        let existing: Vec<Arc<EndpointSlice>> = plan
            .create
            .into_iter()
            .enumerate()
            .map(|(i, s)| with_name(s, &format!("web-{i}")))
            .collect();
        // Nothing changed: nothing written.
        let plan = reconcile(&s, &existing, desired_endpoints(&s, &pods));
        assert!(plan.create.is_empty() && plan.update.is_empty() && plan.delete.is_empty());
        // One pod gone, one new: only the slices holding them change.
        let mut changed = pods.clone();
        changed.remove(0);
        changed.push(pod("new", "10.9.9.9", true));
        let plan = reconcile(&s, &existing, desired_endpoints(&s, &changed));
        assert!(plan.create.is_empty() && plan.delete.is_empty());
        let updated: Vec<&str> = plan
            .update
            .iter()
            .map(|s| s.metadata.name.as_deref().unwrap())
            .collect();
        assert_eq!(updated, ["web-0"], "the gap left in web-0 takes the new pod");
    }

    #[test]
    fn a_service_selecting_nothing_keeps_one_placeholder() {
        let s = svc(serde_json::json!({"selector": {"app": "web"}, "ports": [{"port": 80}]}));
        let plan = reconcile(&s, &[], BTreeMap::new());
        assert_eq!(plan.create.len(), 1);
        assert!(plan.create[0].endpoints.is_empty() && plan.create[0].ports.is_none());
        let existing = vec![
            with_name(new_slice(&s, &[], Vec::new()), "web-a"),
            with_name(
                new_slice(
                    &s,
                    &[PortKey {
                        name: String::new(),
                        protocol: "TCP".into(),
                        port: 80,
                        app_protocol: None,
                    }],
                    Vec::new(),
                ),
                "web-b",
            ),
        ];
        let plan = reconcile(&s, &existing, BTreeMap::new());
        assert!(plan.create.is_empty() && plan.update.is_empty());
        assert_eq!(plan.delete, ["web-b"]);
    }
}
