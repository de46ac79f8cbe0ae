//! `skiff bench scheduler`: upstream's scheduler_perf shapes against a live API server.
//! Creates the nodes, starts a scheduler of its own (a distinct schedulerName, so a running
//! default scheduler leaves the pods alone), creates and waits for the workload's initial pods
//! (scheduler_perf's `initPods`, not measured), then creates the measured pods through the API.
//! It measures creation -> bound for each measured pod, SchedulingThroughput as scheduler_perf
//! samples it (bound pods counted every second, the first sample skipped, the mean of the rest),
//! and the overall rate from the first measured creation to the last bind.

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

use skiff_scheduler::scheduler::{BoundObserver, SchedulerConfig, run_with_signal};

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
    /// scheduler_perf's `initPods` for the workload's 5,000-node shape (SchedulingBasic 1,000,
    /// SchedulingNodeAffinity 5,000, TopologySpreading 5,000, SchedulingPodAntiAffinity 1,000;
    /// the taints shape has no upstream twin and takes SchedulingBasic's).
    fn upstream_init_pods(self) -> usize {
        match self {
            Workload::Basic | Workload::Taints | Workload::PodAntiAffinity => 1000,
            Workload::NodeAffinity | Workload::TopologySpread => 5000,
        }
    }

    /// The initial pods for a cluster of `nodes`: upstream's count at 5,000 nodes, in
    /// proportion for other sizes.
    pub fn default_init_pods(self, nodes: usize) -> usize {
        self.upstream_init_pods() * nodes / 5000
    }

    /// The template of the initial pods: the workload's own, but plain pods for
    /// topology-spread (as TopologySpreading creates them from pod-default).
    fn init_template(self) -> Workload {
        match self {
            Workload::TopologySpread => Workload::Basic,
            w => w,
        }
    }

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
    /// Pods created and bound before the measured ones (None: the workload's default).
    pub init_pods: Option<usize>,
    /// Events the benchmark's scheduler writes at once (None: the scheduler's default).
    pub event_writes: Option<usize>,
    /// Give up waiting for binds after this long.
    pub timeout: Duration,
}

impl BenchConfig {
    fn init_pods(&self) -> usize {
        self.init_pods
            .unwrap_or_else(|| self.workload.default_init_pods(self.nodes))
    }
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            nodes: 5000,
            pods: 10_000,
            workload: Workload::Basic,
            scheduler_name: None,
            clients: CONCURRENCY,
            init_pods: None,
            event_writes: None,
            timeout: Duration::from_secs(300),
        }
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BenchResult {
    pub workload: String,
    pub nodes: usize,
    /// Initial pods, created and bound before the measured ones.
    pub init_pods: usize,
    /// Measured pods.
    pub pods: usize,
    /// SchedulingThroughput's average: the mean of the per-second samples (the overall rate
    /// when the run was too short for one).
    pub pods_per_second: f64,
    /// The per-second samples, as scheduler_perf's throughput collector takes them.
    pub samples: Vec<f64>,
    /// Measured pods over the time from their first creation to their last bind.
    pub overall_pods_per_second: f64,
    /// Creation -> bound latency percentiles of the measured pods.
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// `Scheduled` events of the measured pods already stored when the last of them was seen
    /// bound; the scheduler writes events behind its binds (as upstream's broadcaster does), so
    /// the rest are written after the measured window.
    pub scheduled_events: usize,
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

/// scheduler_perf's throughput collector: every second, the number of bound pods. The first
/// sample with any pod bound only starts the count (it is an outlier: sampling and creating
/// start independently); an interval in which no pod was bound is folded into the next one,
/// whose rate then stands for each of them; the interval cut short by the end of the run is
/// not sampled.
#[derive(Debug, Default)]
pub struct ThroughputCollector {
    last: Option<(Instant, usize)>,
    skipped: usize,
    samples: Vec<f64>,
}

impl ThroughputCollector {
    /// The interval between samples.
    pub const INTERVAL: Duration = Duration::from_secs(1);

    /// Records that `scheduled` pods were bound at `now`.
    pub fn sample(&mut self, now: Instant, scheduled: usize) {
        if scheduled == 0 {
            return;
        }
        let Some((at, count)) = self.last else {
            self.last = Some((now, scheduled));
            return;
        };
        let new = scheduled.saturating_sub(count);
        if new == 0 {
            self.skipped += 1;
            return;
        }
        let secs = now.saturating_duration_since(at).as_secs_f64();
        if secs > 0.0 {
            let rate = new as f64 / secs;
            self.samples.extend(std::iter::repeat_n(rate, self.skipped + 1));
        }
        self.skipped = 0;
        self.last = Some((now, scheduled));
    }

    pub fn samples(&self) -> &[f64] {
        &self.samples
    }
}

/// Computes the result from per-pod creation and bind instants of the measured pods and the
/// collector's samples.
pub fn summarize(
    workload: Workload,
    nodes: usize,
    init_pods: usize,
    created: &HashMap<String, Instant>,
    bound: &HashMap<String, Instant>,
    samples: &[f64],
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
    let overall = match (first, last) {
        (Some(f), Some(l)) if l > f => bound.len() as f64 / l.duration_since(f).as_secs_f64(),
        _ => 0.0,
    };
    let pods_per_second = if samples.is_empty() {
        overall
    } else {
        samples.iter().sum::<f64>() / samples.len() as f64
    };
    let round = |v: f64| (v * 10.0).round() / 10.0;
    BenchResult {
        workload: workload.to_string(),
        nodes,
        init_pods,
        pods: bound.len(),
        pods_per_second: round(pods_per_second),
        samples: samples.iter().map(|v| round(*v)).collect(),
        overall_pods_per_second: round(overall),
        p50_ms: percentile(&lat, 50.0),
        p99_ms: percentile(&lat, 99.0),
        scheduled_events: 0,
    }
}

/// Refuses a run that could never finish.
fn check_config(cfg: &BenchConfig) -> anyhow::Result<()> {
    if cfg.workload == Workload::PodAntiAffinity && cfg.pods.max(cfg.init_pods()) > cfg.nodes {
        anyhow::bail!(
            "the pod-anti-affinity workload places at most one pod per node: {} pods cannot fit on {} nodes \
             (scheduler_perf runs 1,000 pods on 5,000 nodes)",
            cfg.pods.max(cfg.init_pods()),
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
    // As scheduler_perf, the initial and the measured pods live in namespaces of their own.
    let ns = format!("skiff-bench-{run_id}");
    let init_ns = format!("skiff-bench-{run_id}-init");
    let node_prefix = format!("bench-{run_id}");
    let ns_api: Api<Namespace> = Api::all(client.clone());
    for name in [&ns, &init_ns] {
        let ns_obj: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
        ns_api
            .create(&PostParams::default(), &ns_obj)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
    }
    let namespaces = Namespaces {
        measured: &ns,
        init: &init_ns,
    };
    let result = run_bench(&client, &cfg, namespaces, &node_prefix, &run_id).await;
    cleanup(&client, &[&ns, &init_ns], &node_prefix, cfg.nodes).await;
    result
}

#[derive(Clone, Copy)]
struct Namespaces<'a> {
    measured: &'a str,
    init: &'a str,
}

/// When each pod of a namespace was created, or first seen bound.
type PodTimes = Arc<Mutex<HashMap<String, Instant>>>;

async fn run_bench(
    client: &Client,
    cfg: &BenchConfig,
    ns: Namespaces<'_>,
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
    // scheduler's binds are seen through watches of the benchmark's own.
    let bound: PodTimes = Arc::new(Mutex::new(HashMap::new()));
    let init_bound: PodTimes = Arc::new(Mutex::new(HashMap::new()));
    let (scheduler_name, scheduler_task, watch_tasks) = match &cfg.scheduler_name {
        Some(n) => (
            n.clone(),
            None,
            vec![
                spawn_bind_watch(client.clone(), ns.measured, bound.clone()),
                spawn_bind_watch(client.clone(), ns.init, init_bound.clone()),
            ],
        ),
        None => {
            let name = format!("skiff-bench-scheduler-{run_id}");
            let (measured, init) = (bound.clone(), init_bound.clone());
            let (measured_ns, init_ns) = (ns.measured.to_string(), ns.init.to_string());
            let mut sc = SchedulerConfig {
                scheduler_names: vec![name.clone()],
                on_bound: Some(BoundObserver(Arc::new(move |pod_ns: &str, pod: &str| {
                    let times = if pod_ns == measured_ns {
                        &measured
                    } else if pod_ns == init_ns {
                        &init
                    } else {
                        return;
                    };
                    times.lock().entry(pod.to_string()).or_insert_with(Instant::now);
                }))),
                ..Default::default()
            };
            if let Some(n) = cfg.event_writes {
                sc.max_concurrent_events = n;
            }
            let c = client.clone();
            let (tx, rx) = tokio::sync::oneshot::channel();
            let task = tokio::spawn(async move { run_with_signal(c, sc, Some(tx)).await });
            tokio::time::timeout(Duration::from_secs(120), rx)
                .await
                .context("the scheduler did not sync its caches within 120s")?
                .context("the scheduler stopped before syncing")?;
            (name, Some(task), Vec::new())
        }
    };
    if !watch_tasks.is_empty() {
        // Let the benchmark's own watches be established before the first create (the
        // scheduler's is, once it reports its caches synced).
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    let deadline = Instant::now() + cfg.timeout;
    let init_pods = cfg.init_pods();
    let outcome = async {
        // The initial pods: created and bound before anything is measured.
        let init_template = PodTemplate::new(&scheduler_name, cfg.workload.init_template())?;
        create_pods(client, cfg, ns.init, &init_template, init_pods, None).await?;
        wait_bound(&init_bound, init_pods, deadline).await?;
        tracing::info!(pods = init_pods, "bench initial pods bound");

        // The measured pods, with the throughput collector sampling from the start.
        let template = PodTemplate::new(&scheduler_name, cfg.workload)?;
        let created: PodTimes = Arc::new(Mutex::new(HashMap::new()));
        let collector = Arc::new(Mutex::new(ThroughputCollector::default()));
        let sampler = {
            let (bound, collector) = (bound.clone(), collector.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(ThroughputCollector::INTERVAL);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    let scheduled = bound.lock().len();
                    collector.lock().sample(Instant::now(), scheduled);
                }
            })
        };
        let measured = async {
            create_pods(client, cfg, ns.measured, &template, cfg.pods, Some(&created)).await?;
            wait_bound(&bound, cfg.pods, deadline).await
        }
        .await;
        sampler.abort();
        measured?;
        let scheduled_events = count_events(client, ns.measured, "Scheduled").await?;
        let samples = collector.lock().samples().to_vec();
        let created = created.lock().clone();
        let bound = bound.lock().clone();
        let mut result = summarize(cfg.workload, cfg.nodes, init_pods, &created, &bound, &samples);
        result.scheduled_events = scheduled_events;
        anyhow::Ok(result)
    }
    .await;
    for t in watch_tasks {
        t.abort();
    }
    if let Some(t) = scheduler_task {
        t.abort();
    }
    outcome
}

/// Creates `count` pods named `pod-N` in `ns` from `template`, `cfg.clients` at a time,
/// recording when each creation was sent.
async fn create_pods(
    client: &Client,
    cfg: &BenchConfig,
    ns: &str,
    template: &PodTemplate,
    count: usize,
    created: Option<&PodTimes>,
) -> anyhow::Result<()> {
    let path = format!("/api/v1/namespaces/{ns}/pods");
    stream::iter(0..count)
        .map(|i| {
            let name = format!("pod-{i}");
            let body = template.body(&name);
            let path = path.as_str();
            async move {
                // A raw create whose reply is not decoded (scheduler_perf's client decodes
                // protobuf).
                let req = kube::core::Request::new(path).create(&PostParams::default(), body)?;
                if let Some(created) = created {
                    created.lock().insert(name.clone(), Instant::now());
                }
                client
                    .request_text(req)
                    .await
                    .with_context(|| format!("creating pod {ns}/{name}"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(cfg.clients.max(1))
        .try_collect::<Vec<()>>()
        .await
        .map(|_| ())
}

/// Waits until `count` pods are seen bound.
async fn wait_bound(bound: &PodTimes, count: usize, deadline: Instant) -> anyhow::Result<()> {
    loop {
        let n = bound.lock().len();
        if n >= count {
            return Ok(());
        }
        if Instant::now() >= deadline {
            anyhow::bail!("only {n} of {count} pods were bound in time");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The events in `ns` with `reason`, counted from one list that decodes only their reasons.
async fn count_events(client: &Client, ns: &str, reason: &str) -> anyhow::Result<usize> {
    #[derive(serde::Deserialize)]
    struct Reason {
        reason: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct EventList {
        items: Vec<Reason>,
    }
    let req = http::Request::get(format!("/api/v1/namespaces/{ns}/events")).body(Vec::new())?;
    let list: EventList = client.request(req).await.context("listing the benchmark's events")?;
    Ok(list
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .count())
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

async fn cleanup(client: &Client, namespaces: &[&str], node_prefix: &str, nodes: usize) {
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    for ns in namespaces {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        if let Err(e) = pods.delete_collection(&dp, &ListParams::default()).await {
            tracing::warn!(error = %e, "deleting bench pods failed");
        }
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
    for ns in namespaces {
        if let Err(e) = ns_api.delete(ns, &DeleteParams::default()).await {
            tracing::debug!(error = %e, "deleting bench namespace failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_scheduler::cache::Cache;
    use skiff_scheduler::framework::Framework;
    use skiff_scheduler::types::PodInfo;

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
        // Too short for a sample: the overall rate stands in.
        let r = summarize(Workload::Basic, 10, 2, &created, &bound, &[]);
        assert_eq!((r.pods, r.init_pods), (100, 2));
        // Last bind at 99 + 10 + 9 = 118 ms.
        assert!((r.pods_per_second - 100.0 / 0.118).abs() < 1.0);
        assert_eq!(r.pods_per_second, r.overall_pods_per_second);
        assert!((r.p50_ms - 14.0).abs() < 1.0);
        assert!((r.p99_ms - 19.0).abs() < 1.0);
        let r = summarize(Workload::Basic, 10, 2, &created, &bound, &[900.0, 1100.0]);
        assert_eq!(r.pods_per_second, 1000.0);
        assert_eq!(r.samples, vec![900.0, 1100.0]);
        assert!((r.overall_pods_per_second - 100.0 / 0.118).abs() < 1.0);
    }

    #[test]
    fn throughput_collector_samples_as_scheduler_perf() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_millis(s);
        let mut c = ThroughputCollector::default();
        // Nothing bound yet: no sample, the count has not started.
        c.sample(at(1000), 0);
        // The first sample with pods bound starts the count and is skipped.
        c.sample(at(2000), 700);
        assert!(c.samples().is_empty());
        c.sample(at(3000), 5700);
        assert_eq!(c.samples(), &[5000.0]);
        // An interval without a bind is folded into the next: 2 s for 3000 pods, twice.
        c.sample(at(4000), 5700);
        c.sample(at(5000), 8700);
        assert_eq!(c.samples(), &[5000.0, 1500.0, 1500.0]);
        // A late tick counts its real interval.
        c.sample(at(6500), 11700);
        assert_eq!(c.samples(), &[5000.0, 1500.0, 1500.0, 2000.0]);
    }

    #[test]
    fn initial_pods_follow_upstream_at_5000_nodes() {
        assert_eq!(Workload::Basic.default_init_pods(5000), 1000);
        assert_eq!(Workload::NodeAffinity.default_init_pods(5000), 5000);
        assert_eq!(Workload::TopologySpread.default_init_pods(5000), 5000);
        assert_eq!(Workload::PodAntiAffinity.default_init_pods(5000), 1000);
        assert_eq!(Workload::Basic.default_init_pods(20), 4);
        let cfg = BenchConfig {
            init_pods: Some(0),
            ..Default::default()
        };
        assert_eq!(cfg.init_pods(), 0);
        assert_eq!(BenchConfig::default().init_pods(), 1000);
        // Initial anti-affinity pods need a node each too.
        let crowded = BenchConfig {
            workload: Workload::PodAntiAffinity,
            pods: 10,
            nodes: 10,
            init_pods: Some(11),
            ..Default::default()
        };
        assert!(check_config(&crowded).is_err());
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
