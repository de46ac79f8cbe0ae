//! `skiff bench scheduler`: upstream's scheduler_perf shapes against a live API server.
//! Creates the nodes, starts a scheduler of its own (a distinct schedulerName, so a running
//! default scheduler leaves the pods alone), creates the pods through the API, and measures
//! creation -> bound for each pod and the throughput from the first creation to the last bind.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::scheduler::{BoundObserver, SchedulerConfig, run_with_signal};

/// The part of a pod the benchmark's bind observer reads.
#[derive(Clone, Debug, serde::Deserialize)]
struct BoundPod {
    metadata: BoundMeta,
    spec: Option<BoundSpec>,
}

#[derive(Clone, Debug, serde::Deserialize)]
struct BoundMeta {
    name: Option<String>,
}

#[derive(Clone, Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct BoundSpec {
    node_name: Option<String>,
}

const CONCURRENCY: usize = 64;

/// The scheduler_perf workload shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// SchedulingBasic: pod-default on node-default.
    Basic,
    /// SchedulingNodeAffinity: nodes in zone1, pods requiring zone In [zone1, zone2].
    NodeAffinity,
    /// Tainted nodes (NoSchedule on all, PreferNoSchedule on half), tolerating pods.
    Taints,
    /// TopologySpreading: nodes over three zones, pods spread by zone (maxSkew 5, DoNotSchedule).
    TopologySpread,
    /// SchedulingPodAntiAffinity: pods repel each other by hostname.
    PodAntiAffinity,
}

impl Workload {
    pub const ALL: [Workload; 5] = [
        Workload::Basic,
        Workload::NodeAffinity,
        Workload::Taints,
        Workload::TopologySpread,
        Workload::PodAntiAffinity,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            Workload::Basic => "basic",
            Workload::NodeAffinity => "node-affinity",
            Workload::Taints => "taints",
            Workload::TopologySpread => "topology-spread",
            Workload::PodAntiAffinity => "pod-anti-affinity",
        }
    }
}

impl FromStr for Workload {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        Workload::ALL.into_iter().find(|w| w.as_str() == s).with_context(|| {
            let names: Vec<&str> = Workload::ALL.iter().map(Workload::as_str).collect();
            format!("unknown workload {s:?}; known: {}", names.join(", "))
        })
    }
}

impl std::fmt::Display for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone)]
pub struct BenchConfig {
    pub nodes: usize,
    pub pods: usize,
    pub workload: Workload,
    /// None: start a scheduler for the run. Some(name): pods go to that running scheduler.
    pub scheduler_name: Option<String>,
    /// Pod creations in flight at once.
    pub clients: usize,
    /// Give up waiting for binds after this long.
    pub timeout: Duration,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            nodes: 5000,
            pods: 10_000,
            workload: Workload::Basic,
            scheduler_name: None,
            clients: CONCURRENCY,
            timeout: Duration::from_secs(300),
        }
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BenchResult {
    pub workload: String,
    pub nodes: usize,
    pub pods: usize,
    /// Pods bound per second, first pod creation to last bind (SchedulingThroughput).
    pub pods_per_second: f64,
    /// Creation -> bound latency percentiles.
    pub p50_ms: f64,
    pub p99_ms: f64,
}

const TAINT_KEY: &str = "bench.skiff.dev/dedicated";
const ZONE: &str = "topology.kubernetes.io/zone";

/// scheduler_perf's node-default, labelled and tainted per workload.
pub fn bench_node(prefix: &str, i: usize, workload: Workload) -> Value {
    let name = format!("{prefix}-{i}");
    let mut labels =
        json!({"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"});
    let mut taints = Vec::new();
    match workload {
        Workload::NodeAffinity => labels[ZONE] = json!("zone1"),
        Workload::TopologySpread => labels[ZONE] = json!(format!("moon-{}", i % 3 + 1)),
        Workload::Taints => {
            taints.push(json!({"key": TAINT_KEY, "value": "bench", "effect": "NoSchedule"}));
            if i % 2 == 1 {
                taints.push(json!({"key": "bench.skiff.dev/busy", "value": "true", "effect": "PreferNoSchedule"}));
            }
        }
        _ => {}
    }
    let res = json!({"cpu": "4", "memory": "32Gi", "pods": "110"});
    let mut node = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {},
        "status": {
            "capacity": res, "allocatable": res, "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kubelet is posting ready status"}],
        },
    });
    if !taints.is_empty() {
        node["spec"]["taints"] = Value::Array(taints);
    }
    node
}

/// scheduler_perf's pod templates per workload.
pub fn bench_pod(name: &str, scheduler: &str, workload: Workload) -> Value {
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "skiff-bench"}},
        "spec": {
            "schedulerName": scheduler,
            "containers": [{
                "name": "pause",
                "image": "registry.k8s.io/pause:3.10",
                "ports": [{"containerPort": 80}],
                "resources": {
                    "requests": {"cpu": "100m", "memory": "500Mi"},
                    "limits": {"cpu": "100m", "memory": "500Mi"},
                },
            }],
        },
    });
    let spec = &mut pod["spec"];
    match workload {
        Workload::Basic => {}
        Workload::NodeAffinity => {
            spec["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": ZONE, "operator": "In", "values": ["zone1", "zone2"]}]}]}}});
        }
        Workload::Taints => {
            spec["tolerations"] =
                json!([{"key": TAINT_KEY, "operator": "Equal", "value": "bench", "effect": "NoSchedule"}]);
        }
        Workload::TopologySpread => {
            pod["metadata"]["labels"]["color"] = json!("blue");
            pod["spec"]["topologySpreadConstraints"] = json!([{
                "maxSkew": 5, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"color": "blue"}}}]);
        }
        Workload::PodAntiAffinity => {
            pod["metadata"]["labels"]["color"] = json!("green");
            pod["spec"]["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchLabels": {"color": "green"}},
                "topologyKey": "kubernetes.io/hostname"}]}});
        }
    }
    pod
}

/// A workload's pod encoded once, with the place of its name: `body` splices a name in.
struct PodTemplate {
    head: Vec<u8>,
    tail: Vec<u8>,
}

impl PodTemplate {
    const MARK: &'static str = "skiff-bench-pod-name";

    fn new(scheduler: &str, workload: Workload) -> anyhow::Result<PodTemplate> {
        let bytes = serde_json::to_vec(&bench_pod(Self::MARK, scheduler, workload))?;
        let at = bytes
            .windows(Self::MARK.len())
            .position(|w| w == Self::MARK.as_bytes())
            .context("the pod template has no name")?;
        Ok(PodTemplate {
            head: bytes[..at].to_vec(),
            tail: bytes[at + Self::MARK.len()..].to_vec(),
        })
    }

    /// The pod named `name`, which must need no escaping in JSON (the benchmark's `pod-N`).
    fn body(&self, name: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.head.len() + name.len() + self.tail.len());
        out.extend_from_slice(&self.head);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&self.tail);
        out
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Computes the result from per-pod creation and bind instants.
pub fn summarize(
    workload: Workload,
    nodes: usize,
    created: &HashMap<String, Instant>,
    bound: &HashMap<String, Instant>,
) -> BenchResult {
    let first = created.values().min().copied();
    let last = bound.values().max().copied();
    let mut lat: Vec<f64> = bound
        .iter()
        .filter_map(|(n, b)| {
            created
                .get(n)
                .map(|c| b.saturating_duration_since(*c).as_secs_f64() * 1000.0)
        })
        .collect();
    lat.sort_by(f64::total_cmp);
    let pods_per_second = match (first, last) {
        (Some(f), Some(l)) if l > f => bound.len() as f64 / l.duration_since(f).as_secs_f64(),
        _ => 0.0,
    };
    BenchResult {
        workload: workload.to_string(),
        nodes,
        pods: bound.len(),
        pods_per_second,
        p50_ms: percentile(&lat, 50.0),
        p99_ms: percentile(&lat, 99.0),
    }
}

/// Refuses a run that could never finish.
fn check_config(cfg: &BenchConfig) -> anyhow::Result<()> {
    if cfg.workload == Workload::PodAntiAffinity && cfg.pods > cfg.nodes {
        anyhow::bail!(
            "the pod-anti-affinity workload places at most one pod per node: {} pods cannot fit on {} nodes \
             (scheduler_perf runs 1,000 pods on 5,000 nodes)",
            cfg.pods,
            cfg.nodes
        );
    }
    Ok(())
}

/// Runs one workload and cleans up after it.
pub async fn bench(client: Client, cfg: BenchConfig) -> anyhow::Result<BenchResult> {
    check_config(&cfg)?;
    let run_id = format!(
        "{:08x}",
        std::process::id() ^ (jiff::Timestamp::now().subsec_nanosecond() as u32)
    );
    let ns = format!("skiff-bench-{run_id}");
    let node_prefix = format!("bench-{run_id}");
    let ns_api: Api<Namespace> = Api::all(client.clone());
    let ns_obj: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
    ns_api
        .create(&PostParams::default(), &ns_obj)
        .await
        .with_context(|| format!("creating namespace {ns}"))?;
    let result = run_bench(&client, &cfg, &ns, &node_prefix, &run_id).await;
    cleanup(&client, &ns, &node_prefix, cfg.nodes).await;
    result
}

async fn run_bench(
    client: &Client,
    cfg: &BenchConfig,
    ns: &str,
    node_prefix: &str,
    run_id: &str,
) -> anyhow::Result<BenchResult> {
    // Nodes first.
    let nodes_api: Api<Node> = Api::all(client.clone());
    let t = Instant::now();
    stream::iter(0..cfg.nodes)
        .map(|i| {
            let api = nodes_api.clone();
            let obj = bench_node(node_prefix, i, cfg.workload);
            async move {
                let node: Node = serde_json::from_value(obj.clone())?;
                let created = api
                    .create(&PostParams::default(), &node)
                    .await
                    .context("creating node")?;
                let has_alloc = created
                    .status
                    .as_ref()
                    .and_then(|s| s.allocatable.as_ref())
                    .is_some_and(|a| !a.is_empty());
                if !has_alloc {
                    let name = created.metadata.name.unwrap_or_default();
                    api.patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(&json!({"status": obj["status"]})),
                    )
                    .await
                    .context("writing node status")?;
                }
                anyhow::Ok(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    tracing::info!(
        nodes = cfg.nodes,
        elapsed_ms = t.elapsed().as_millis() as u64,
        "bench nodes created"
    );

    // Binds are observed as scheduler_perf observes them: a scheduler started here reports each
    // pod its own pod watch brings bound (one watch, as upstream's shared informer); a running
    // scheduler's binds are seen through a watch of the benchmark's own.
    let created: Arc<Mutex<HashMap<String, Instant>>> = Arc::new(Mutex::new(HashMap::new()));
    let bound: Arc<Mutex<HashMap<String, Instant>>> = Arc::new(Mutex::new(HashMap::new()));
    let (scheduler_name, scheduler_task, watch_task) = match &cfg.scheduler_name {
        Some(n) => (
            n.clone(),
            None,
            Some(spawn_bind_watch(client.clone(), ns, bound.clone())),
        ),
        None => {
            let name = format!("skiff-bench-scheduler-{run_id}");
            let observed = bound.clone();
            let bench_ns = ns.to_string();
            let sc = SchedulerConfig {
                scheduler_names: vec![name.clone()],
                on_bound: Some(BoundObserver(Arc::new(move |pod_ns: &str, pod: &str| {
                    if pod_ns == bench_ns {
                        observed.lock().entry(pod.to_string()).or_insert_with(Instant::now);
                    }
                }))),
                ..Default::default()
            };
            let c = client.clone();
            let (tx, rx) = tokio::sync::oneshot::channel();
            let task = tokio::spawn(async move { run_with_signal(c, sc, Some(tx)).await });
            tokio::time::timeout(Duration::from_secs(120), rx)
                .await
                .context("the scheduler did not sync its caches within 120s")?
                .context("the scheduler stopped before syncing")?;
            (name, Some(task), None)
        }
    };
    if watch_task.is_some() {
        // Let the benchmark's own watch be established before the first create (the
        // scheduler's is, once it reports its caches synced).
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // Every pod of a run is the same but for its name: the body is encoded once and the name
    // spliced in, so the client's own work stays out of the scheduler's way.
    let template = PodTemplate::new(&scheduler_name, cfg.workload)?;
    let path = format!("/api/v1/namespaces/{ns}/pods");
    let create_result = stream::iter(0..cfg.pods)
        .map(|i| {
            let client = client.clone();
            let created = created.clone();
            let name = format!("pod-{i}");
            let body = template.body(&name);
            let path = path.as_str();
            async move {
                // A raw create whose reply is not decoded (scheduler_perf's client decodes
                // protobuf).
                let req = kube::core::Request::new(path).create(&PostParams::default(), body)?;
                created.lock().insert(name.clone(), Instant::now());
                client
                    .request_text(req)
                    .await
                    .with_context(|| format!("creating pod {name}"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(cfg.clients.max(1))
        .try_collect::<Vec<()>>()
        .await;
    let deadline = Instant::now() + cfg.timeout;
    let mut outcome = create_result.map(|_| ());
    if outcome.is_ok() {
        loop {
            let n = bound.lock().len();
            if n >= cfg.pods {
                break;
            }
            if Instant::now() >= deadline {
                outcome = Err(anyhow::anyhow!(
                    "only {n} of {} pods were bound within {:?}",
                    cfg.pods,
                    cfg.timeout
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    if let Some(t) = watch_task {
        t.abort();
    }
    if let Some(t) = scheduler_task {
        t.abort();
    }
    outcome?;
    let created = created.lock().clone();
    let bound = bound.lock().clone();
    Ok(summarize(cfg.workload, cfg.nodes, &created, &bound))
}

/// Records when each pod of `ns` is first seen bound, through a watch that decodes only the
/// name and spec.nodeName (the observer's own decoding stays out of the scheduler's way).
fn spawn_bind_watch(
    client: Client,
    ns: &str,
    bound: Arc<Mutex<HashMap<String, Instant>>>,
) -> tokio::task::JoinHandle<()> {
    let watch_path = format!("/api/v1/namespaces/{ns}/pods?watch=true&resourceVersion=0&timeoutSeconds=3600");
    tokio::spawn(async move {
        let req = match http::Request::get(watch_path).body(Vec::new()) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "bench watch request");
                return;
            }
        };
        let mut events = match client.request_events::<BoundPod>(req).await {
            Ok(s) => s.boxed(),
            Err(e) => {
                tracing::warn!(error = %e, "bench watch failed");
                return;
            }
        };
        while let Some(ev) = events.next().await {
            match ev {
                Ok(kube::api::WatchEvent::Added(p)) | Ok(kube::api::WatchEvent::Modified(p)) => {
                    if p.spec.and_then(|s| s.node_name).is_some()
                        && let Some(name) = p.metadata.name
                    {
                        bound.lock().entry(name).or_insert_with(Instant::now);
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "bench watch failed"),
            }
        }
    })
}

async fn cleanup(client: &Client, ns: &str, node_prefix: &str, nodes: usize) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    if let Err(e) = pods.delete_collection(&dp, &ListParams::default()).await {
        tracing::warn!(error = %e, "deleting bench pods failed");
    }
    let nodes_api: Api<Node> = Api::all(client.clone());
    stream::iter(0..nodes)
        .for_each_concurrent(CONCURRENCY, |i| {
            let api = nodes_api.clone();
            let name = format!("{node_prefix}-{i}");
            async move {
                if let Err(e) = api.delete(&name, &DeleteParams::default()).await {
                    tracing::debug!(error = %e, node = %name, "deleting bench node failed");
                }
            }
        })
        .await;
    let ns_api: Api<Namespace> = Api::all(client.clone());
    if let Err(e) = ns_api.delete(ns, &DeleteParams::default()).await {
        tracing::debug!(error = %e, "deleting bench namespace failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Cache;
    use crate::framework::Framework;
    use crate::types::PodInfo;

    #[test]
    fn workload_names_round_trip() {
        for w in Workload::ALL {
            assert_eq!(w.as_str().parse::<Workload>().unwrap(), w);
        }
        assert!("nope".parse::<Workload>().is_err());
    }

    #[test]
    fn anti_affinity_runs_that_cannot_finish_are_refused() {
        let cfg = BenchConfig {
            workload: Workload::PodAntiAffinity,
            ..Default::default()
        };
        let err = check_config(&cfg).unwrap_err().to_string();
        assert!(err.contains("10000 pods cannot fit on 5000 nodes"), "{err}");
        let fits = BenchConfig {
            pods: 1000,
            ..cfg.clone()
        };
        assert!(check_config(&fits).is_ok());
        assert!(check_config(&BenchConfig::default()).is_ok());
    }

    #[test]
    fn pod_template_splices_the_name() {
        for w in Workload::ALL {
            let t = PodTemplate::new("sched", w).unwrap();
            let spliced: Value = serde_json::from_slice(&t.body("pod-7")).unwrap();
            assert_eq!(spliced, bench_pod("pod-7", "sched", w));
        }
    }

    #[test]
    fn summarize_throughput_and_percentiles() {
        let t0 = Instant::now();
        let mut created = HashMap::new();
        let mut bound = HashMap::new();
        for i in 0..100u64 {
            created.insert(format!("p{i}"), t0 + Duration::from_millis(i));
            bound.insert(format!("p{i}"), t0 + Duration::from_millis(i + 10 + i / 10));
        }
        let r = summarize(Workload::Basic, 10, &created, &bound);
        assert_eq!(r.pods, 100);
        // Last bind at 99 + 10 + 9 = 118 ms.
        assert!((r.pods_per_second - 100.0 / 0.118).abs() < 1.0);
        assert!((r.p50_ms - 14.0).abs() < 1.0);
        assert!((r.p99_ms - 19.0).abs() < 1.0);
    }

    /// Every workload's pods fit on its nodes through the real plugins, and the in-memory
    /// cycle is fast enough to matter (pods scheduled without any API round trip).
    #[test]
    fn workloads_schedule_in_memory() {
        for w in Workload::ALL {
            let mut cache = Cache::new();
            for i in 0..300 {
                let n: Node = serde_json::from_value(bench_node("n", i, w)).unwrap();
                cache.upsert_node(Arc::new(n));
            }
            let mut fw = Framework::with_default_plugins(0);
            for i in 0..200 {
                let mut p: Pod = serde_json::from_value(bench_pod(&format!("p{i}"), "s", w)).unwrap();
                p.metadata.namespace = Some("default".into());
                p.metadata.uid = Some(format!("u{i}"));
                let info = Arc::new(PodInfo::new(p));
                let (res, _) = fw
                    .schedule(&info, &cache)
                    .unwrap_or_else(|f| panic!("{w}: {}", f.0.message()));
                let node = cache.node_name(res.node).to_string();
                if w == Workload::NodeAffinity {
                    assert_eq!(cache.node(&node).unwrap().labels[ZONE], "zone1");
                }
                cache.assume_pod(info, &node);
            }
            if w == Workload::PodAntiAffinity {
                assert!(cache.nodes().iter().all(|n| n.pods.len() <= 1));
            }
        }
    }
}
