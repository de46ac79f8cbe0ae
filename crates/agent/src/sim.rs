//! Simulated nodes, as kwok does: register N Ready nodes, keep their Leases fresh, move pods
//! bound to them to Running, and finish their graceful deletions. No containers run.
//!
//! One process holds thousands of nodes: the nodes share one pod watch, lease renewals are
//! batched with bounded concurrency, and all writes go through the API.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

/// Annotation marking a node as simulated.
pub const SIMULATED_ANNOTATION: &str = "skiff.dev/simulated";
/// Namespace of node heartbeats.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
/// How often each node's Lease is renewed (upstream kubelet: 10s, lease duration 40s).
const LEASE_RENEW_INTERVAL: Duration = Duration::from_secs(10);
const LEASE_DURATION_SECONDS: i32 = 40;
/// How often the Ready condition's heartbeat is refreshed (upstream: nodeStatusReportFrequency).
const NODE_STATUS_INTERVAL: Duration = Duration::from_secs(300);
/// Writes in flight at once.
const CONCURRENCY: usize = 64;

/// What to simulate.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub nodes: usize,
    /// Capacity (= allocatable) per node.
    pub cpu: String,
    pub memory: String,
    pub pods: u32,
    /// Nodes are named `{name_prefix}{index}`.
    pub name_prefix: String,
    /// Extra labels on every node.
    pub labels: BTreeMap<String, String>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            nodes: 1,
            cpu: "4".to_string(),
            memory: "16Gi".to_string(),
            pods: 110,
            name_prefix: "sim-node-".to_string(),
            labels: BTreeMap::new(),
        }
    }
}

fn now() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn now_micro() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string()
}

/// The node's InternalIP: 172.16.0.0/12, one address per node index.
fn node_ip(index: usize) -> String {
    let i = index + 1;
    format!("172.{}.{}.{}", 16 + (i >> 16) % 16, (i >> 8) & 0xff, i & 0xff)
}

/// The node's pod range: 10.64.0.0/10 carved into /24s.
fn pod_cidr(index: usize) -> (u8, u8) {
    ((64 + (index >> 8) % 64) as u8, (index & 0xff) as u8)
}

fn node_name(cfg: &SimConfig, index: usize) -> String {
    format!("{}{}", cfg.name_prefix, index)
}

fn conditions(ts: &str) -> Value {
    json!([
        {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory",
         "message": "kubelet has sufficient memory available", "lastHeartbeatTime": ts, "lastTransitionTime": ts},
        {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure",
         "message": "kubelet has no disk pressure", "lastHeartbeatTime": ts, "lastTransitionTime": ts},
        {"type": "PIDPressure", "status": "False", "reason": "KubeletHasSufficientPID",
         "message": "kubelet has sufficient PID available", "lastHeartbeatTime": ts, "lastTransitionTime": ts},
        {"type": "Ready", "status": "True", "reason": "KubeletReady",
         "message": "kubelet is posting ready status", "lastHeartbeatTime": ts, "lastTransitionTime": ts},
    ])
}

/// The Node object a simulated node registers.
pub fn node_object(cfg: &SimConfig, index: usize) -> Value {
    let name = node_name(cfg, index);
    let mut labels = json!({
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64",
        "type": "skiff-sim",
    });
    for (k, v) in &cfg.labels {
        labels[k] = Value::String(v.clone());
    }
    let (a, b) = pod_cidr(index);
    let cidr = format!("10.{a}.{b}.0/24");
    let ts = now();
    let resources = json!({
        "cpu": cfg.cpu, "memory": cfg.memory, "pods": cfg.pods.to_string(),
        "ephemeral-storage": "100Gi",
    });
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {SIMULATED_ANNOTATION: "true", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
        "status": node_status(&name, index, &resources, &ts),
    })
}

fn node_status(name: &str, index: usize, resources: &Value, ts: &str) -> Value {
    json!({
        "capacity": resources,
        "allocatable": resources,
        "conditions": conditions(ts),
        "addresses": [
            {"type": "InternalIP", "address": node_ip(index)},
            {"type": "Hostname", "address": name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {
            "machineID": format!("sim-{index}"), "systemUUID": format!("sim-{index}"),
            "bootID": format!("sim-{index}"), "kernelVersion": "simulated",
            "osImage": "Skiff simulated node", "containerRuntimeVersion": "sim://1.0.0",
            "kubeletVersion": "v1.33.0", "kubeProxyVersion": "v1.33.0",
            "operatingSystem": "linux", "architecture": "amd64",
        },
        "phase": "Running",
    })
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Creates (or refreshes) one node and makes sure its status says Ready. Returns its uid.
async fn register_node(api: &Api<Node>, cfg: &SimConfig, index: usize) -> anyhow::Result<String> {
    let obj = node_object(cfg, index);
    let name = node_name(cfg, index);
    let node: Node = serde_json::from_value(obj.clone()).context("building node")?;
    let created = match api.create(&PostParams::default(), &node).await {
        Ok(n) => n,
        Err(e) if is_conflict(&e) => {
            let patch = json!({"metadata": {"labels": obj["metadata"]["labels"], "annotations": obj["metadata"]["annotations"]}});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .with_context(|| format!("updating node {name}"))?
        }
        Err(e) => return Err(e).with_context(|| format!("creating node {name}")),
    };
    let ready = created
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let has_alloc = created
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .is_some_and(|a| !a.is_empty());
    if !ready || !has_alloc {
        let patch = json!({"status": obj["status"]});
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("writing status of node {name}"))?;
    }
    Ok(created.metadata.uid.unwrap_or_default())
}

async fn ensure_lease_namespace(client: &Client) {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Result<Namespace, _> = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NODE_LEASE_NAMESPACE}}),
    );
    if let Ok(ns) = ns
        && let Err(e) = api.create(&PostParams::default(), &ns).await
        && !is_conflict(&e)
    {
        tracing::debug!(error = %e, "creating the node lease namespace failed");
    }
}

/// Creates (first round) or renews one node's Lease; falls back to the other call when the
/// lease turns out to exist / to be gone.
async fn renew_lease(api: &Api<Lease>, name: &str, uid: &str, first: bool) -> Result<(), kube::Error> {
    if first {
        match create_lease(api, name, uid).await {
            Err(e) if is_conflict(&e) => {}
            other => return other,
        }
    }
    let patch = json!({"spec": {"renewTime": now_micro(), "holderIdentity": name}});
    match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => create_lease(api, name, uid).await,
        Err(e) => Err(e),
    }
}

async fn create_lease(api: &Api<Lease>, name: &str, uid: &str) -> Result<(), kube::Error> {
    let lease: Lease = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": NODE_LEASE_NAMESPACE,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}],
        },
        "spec": {"holderIdentity": name, "leaseDurationSeconds": LEASE_DURATION_SECONDS, "renewTime": now_micro()},
    }))
    .map_err(kube::Error::SerdeError)?;
    api.create(&PostParams::default(), &lease).await.map(|_| ())
}

/// Per-node pod IP allocation.
#[derive(Default)]
struct PodIps {
    next: HashMap<String, u32>,
}

impl PodIps {
    fn allocate(&mut self, node_index: usize, node: &str) -> String {
        let n = self.next.entry(node.to_string()).or_insert(0);
        let host = 2 + (*n % 253);
        *n += 1;
        let (a, b) = pod_cidr(node_index);
        format!("10.{a}.{b}.{host}")
    }
}

/// The status a running simulated pod reports.
pub fn running_status(pod: &Pod, host_ip: &str, pod_ip: &str) -> Value {
    let ts = now();
    let spec = pod.spec.as_ref();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let containers: Vec<Value> = spec
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|c| {
            let image = c.image.clone().unwrap_or_default();
            json!({
                "name": c.name, "image": image, "imageID": format!("sim://{image}"),
                "containerID": format!("sim://{uid}-{}", c.name),
                "ready": true, "started": true, "restartCount": 0,
                "state": {"running": {"startedAt": ts}},
            })
        })
        .collect();
    let init: Vec<Value> = spec
        .and_then(|s| s.init_containers.as_ref())
        .map(|v| v.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|c| {
            let image = c.image.clone().unwrap_or_default();
            let sidecar = c.restart_policy.as_deref() == Some("Always");
            let state = if sidecar {
                json!({"running": {"startedAt": ts}})
            } else {
                json!({"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": ts, "finishedAt": ts}})
            };
            json!({
                "name": c.name, "image": image, "imageID": format!("sim://{image}"),
                "containerID": format!("sim://{uid}-{}", c.name),
                "ready": true, "started": sidecar, "restartCount": 0, "state": state,
            })
        })
        .collect();
    let cond = |t: &str| json!({"type": t, "status": "True", "lastProbeTime": null, "lastTransitionTime": ts});
    let mut status = json!({
        "phase": "Running",
        "conditions": [cond("PodReadyToStartContainers"), cond("Initialized"), cond("Ready"),
                       cond("ContainersReady"), cond("PodScheduled")],
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": ts,
        "containerStatuses": containers,
    });
    if !init.is_empty() {
        status["initContainerStatuses"] = Value::Array(init);
    }
    json!({ "status": status })
}

fn is_running_here(pod: &Pod) -> bool {
    let st = pod.status.as_ref();
    st.and_then(|s| s.phase.as_deref()) == Some("Running")
        && st.and_then(|s| s.pod_ip.as_deref()).is_some_and(|ip| !ip.is_empty())
}

/// Registers the nodes, then keeps them alive and runs their pods until an error ends it.
pub async fn run(client: Client, cfg: SimConfig) -> anyhow::Result<()> {
    let cfg = Arc::new(cfg);
    let nodes_api: Api<Node> = Api::all(client.clone());
    ensure_lease_namespace(&client).await;
    let started = std::time::Instant::now();
    let uids: Vec<(usize, String)> = stream::iter(0..cfg.nodes)
        .map(|i| {
            let api = nodes_api.clone();
            let cfg = cfg.clone();
            async move { register_node(&api, &cfg, i).await.map(|uid| (i, uid)) }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await?;
    tracing::info!(
        nodes = cfg.nodes,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "simulated nodes registered"
    );

    let index: Arc<HashMap<String, usize>> = Arc::new((0..cfg.nodes).map(|i| (node_name(&cfg, i), i)).collect());
    let named: Arc<Vec<(String, String)>> =
        Arc::new(uids.into_iter().map(|(i, uid)| (node_name(&cfg, i), uid)).collect());

    // Leases: renew every node's lease every interval, with bounded concurrency.
    let leases_api: Api<Lease> = Api::namespaced(client.clone(), NODE_LEASE_NAMESPACE);
    let lease_nodes = named.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(LEASE_RENEW_INTERVAL);
        let mut first = true;
        loop {
            tick.tick().await;
            stream::iter(lease_nodes.iter())
                .for_each_concurrent(CONCURRENCY, |(name, uid)| {
                    let api = leases_api.clone();
                    async move {
                        if let Err(e) = renew_lease(&api, name, uid, first).await {
                            tracing::debug!(node = %name, error = %e, "renewing lease failed");
                        }
                    }
                })
                .await;
            first = false;
        }
    });

    // Node status heartbeat.
    let status_nodes = named.clone();
    let status_api = nodes_api.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(NODE_STATUS_INTERVAL);
        tick.tick().await;
        loop {
            tick.tick().await;
            let ts = now();
            stream::iter(status_nodes.iter())
                .for_each_concurrent(CONCURRENCY, |(name, _)| {
                    let api = status_api.clone();
                    let patch = json!({"status": {"conditions": conditions(&ts)}});
                    async move {
                        if let Err(e) = api
                            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                            .await
                        {
                            tracing::debug!(node = %name, error = %e, "node heartbeat failed");
                        }
                    }
                })
                .await;
        }
    });

    run_pods(client, index).await
}

/// Watches pods and drives those bound to simulated nodes.
async fn run_pods(client: Client, index: Arc<HashMap<String, usize>>) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::all(client.clone());
    let ips = Arc::new(Mutex::new(PodIps::default()));
    let limit = Arc::new(Semaphore::new(CONCURRENCY));
    let in_progress: Arc<Mutex<HashSet<String>>> = Arc::new(Mutex::new(HashSet::new()));
    let mut stream = watcher::watcher(pods, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(ev) = stream.next().await {
        let pod = match ev {
            Ok(Event::Apply(p)) | Ok(Event::InitApply(p)) => p,
            Ok(Event::Delete(p)) => {
                if let Some(uid) = &p.metadata.uid {
                    in_progress.lock().remove(uid);
                }
                continue;
            }
            Ok(_) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "pod watch failed; retrying");
                continue;
            }
        };
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            continue;
        };
        let Some(&node_index) = index.get(&node) else {
            continue;
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        if pod.metadata.deletion_timestamp.is_some() {
            // Finish the graceful deletion: nothing runs, so nothing to stop.
            if !in_progress.lock().insert(format!("delete/{uid}")) {
                continue;
            }
            let limit = limit.clone();
            tokio::spawn(async move {
                let Ok(_permit) = limit.acquire().await else {
                    return;
                };
                let dp = DeleteParams {
                    grace_period_seconds: Some(0),
                    preconditions: Some(Preconditions {
                        uid: Some(uid),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                if let Err(e) = api.delete(&name, &dp).await
                    && !is_not_found(&e)
                {
                    tracing::warn!(pod = %name, error = %e, "finishing pod deletion failed");
                }
            });
            continue;
        }
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if is_running_here(&pod) || matches!(phase, Some("Succeeded") | Some("Failed")) {
            continue;
        }
        if !in_progress.lock().insert(uid.clone()) {
            continue;
        }
        let pod_ip = ips.lock().allocate(node_index, &node);
        let patch = running_status(&pod, &node_ip(node_index), &pod_ip);
        let limit = limit.clone();
        let in_progress = in_progress.clone();
        tokio::spawn(async move {
            let Ok(_permit) = limit.acquire().await else {
                return;
            };
            if let Err(e) = api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                tracing::debug!(pod = %name, error = %e, "marking pod running failed");
                in_progress.lock().remove(&uid);
            }
        });
    }
    anyhow::bail!("pod watch ended")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_object_is_ready_with_capacity() {
        let mut cfg = SimConfig {
            nodes: 3,
            ..Default::default()
        };
        cfg.labels.insert("zone".into(), "z1".into());
        let v = node_object(&cfg, 2);
        let n: Node = serde_json::from_value(v).unwrap();
        assert_eq!(n.metadata.name.as_deref(), Some("sim-node-2"));
        let labels = n.metadata.labels.unwrap();
        assert_eq!(labels["kubernetes.io/hostname"], "sim-node-2");
        assert_eq!(labels["zone"], "z1");
        assert_eq!(n.metadata.annotations.unwrap()[SIMULATED_ANNOTATION], "true");
        let st = n.status.unwrap();
        assert_eq!(st.allocatable, st.capacity);
        assert_eq!(st.allocatable.unwrap()["memory"].0, "16Gi");
        assert!(
            st.conditions
                .unwrap()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        );
    }

    #[test]
    fn addresses_are_distinct_for_many_nodes() {
        let ips: HashSet<String> = (0..5000).map(node_ip).collect();
        assert_eq!(ips.len(), 5000);
        let cidrs: HashSet<(u8, u8)> = (0..5000).map(pod_cidr).collect();
        assert_eq!(cidrs.len(), 5000);
        let mut p = PodIps::default();
        assert_eq!(p.allocate(0, "a"), "10.64.0.2");
        assert_eq!(p.allocate(0, "a"), "10.64.0.3");
        assert_eq!(p.allocate(257, "b"), "10.65.1.2");
    }

    #[test]
    fn running_status_shape() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "uid": "u1"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}],
                     "initContainers": [{"name": "i", "image": "busybox"}]},
        }))
        .unwrap();
        let v = running_status(&pod, "172.16.0.1", "10.64.0.2");
        let st: k8s_openapi::api::core::v1::PodStatus = serde_json::from_value(v["status"].clone()).unwrap();
        assert_eq!(st.phase.as_deref(), Some("Running"));
        assert_eq!(st.pod_ip.as_deref(), Some("10.64.0.2"));
        let cs = st.container_statuses.unwrap();
        assert!(cs[0].ready && cs[0].state.as_ref().unwrap().running.is_some());
        assert!(
            st.init_container_statuses.unwrap()[0]
                .state
                .as_ref()
                .unwrap()
                .terminated
                .is_some()
        );
        let conds = st.conditions.unwrap();
        for t in ["Ready", "ContainersReady", "Initialized", "PodScheduled"] {
            assert!(conds.iter().any(|c| c.type_ == t && c.status == "True"));
        }
    }
}
