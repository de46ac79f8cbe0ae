//! `skiff bench scheduling`: upstream's scheduler_perf shapes against a live API server.
//! Creates the nodes (and what the workload needs besides: a Service, a PriorityClass, labelled
//! namespaces, CSINodes, volumes and their claims), starts a scheduler of its own (a distinct
//! schedulerName, so a running default scheduler leaves the pods alone), creates and waits for
//! the workload's initial pods (scheduler_perf's `initPods`, not measured), then creates the
//! measured pods through the API. It measures creation -> bound for each measured pod,
//! SchedulingThroughput as scheduler_perf samples it (bound pods counted every second, the first
//! sample skipped, the mean of the rest), and the overall rate from the first measured creation
//! to the last bind; then it reads every pod back and checks the placement against the pods'
//! constraints (`check`), and fails when one is violated.
//!
//! - `workloads`: the shapes, upstream's templates and thresholds.
//! - `check`: the placement check.

pub mod check;
pub mod workloads;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use parking_lot::Mutex;
use serde_json::json;

use skiff_scheduler::scheduler::{BoundObserver, SchedulerConfig, run_with_signal};

pub use check::{CheckReport, Placement, check};
pub use workloads::{
    PodContext, PodKind, VolumeKind, Workload, bench_csinode, bench_node, bench_pod, bench_priority_class, bench_pv,
    bench_pvc, bench_service,
};

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

#[derive(Debug, Clone)]
pub struct BenchConfig {
    pub nodes: usize,
    pub pods: usize,
    pub workload: Workload,
    /// None: start a scheduler for the run. Some(name): pods go to that running scheduler.
    pub scheduler_name: Option<String>,
    /// Pod creations in flight at once.
    pub clients: usize,
    /// Pods created and bound before the measured ones, per template of the workload's initial
    /// pods (None: the workload's default).
    pub init_pods: Option<usize>,
    /// Events the benchmark's scheduler writes at once (None: the scheduler's default).
    pub event_writes: Option<usize>,
    /// Give up waiting for binds after this long.
    pub timeout: Duration,
}

impl BenchConfig {
    /// Initial pods per template.
    fn init_pods(&self) -> usize {
        self.init_pods
            .unwrap_or_else(|| self.workload.default_init_pods(self.nodes))
    }

    /// Initial pods over every template.
    fn init_total(&self) -> usize {
        self.init_pods() * self.workload.init_kinds().len()
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
    /// Upstream's test case and workload the threshold comes from.
    pub upstream: String,
    /// The SchedulingThroughput threshold upstream sets for the shape at 5,000 nodes (pods/s).
    pub upstream_threshold: Option<f64>,
    /// `pods_per_second` over `upstream_threshold`.
    pub ratio: Option<f64>,
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
    /// The placement check's verdict.
    pub check: CheckReport,
}

/// A workload's pod encoded once, with the places of its index: `body` splices one in.
struct PodTemplate {
    parts: Vec<Vec<u8>>,
}

impl PodTemplate {
    const MARK: &'static str = "skiff-bench-index";

    fn new(kind: PodKind, ctx: &PodContext) -> anyhow::Result<PodTemplate> {
        let bytes = serde_json::to_vec(&bench_pod(Self::MARK, kind, ctx))?;
        let mark = Self::MARK.as_bytes();
        let mut parts = Vec::new();
        let mut start = 0;
        let mut i = 0;
        while i + mark.len() <= bytes.len() {
            if &bytes[i..i + mark.len()] == mark {
                parts.push(bytes[start..i].to_vec());
                i += mark.len();
                start = i;
            } else {
                i += 1;
            }
        }
        parts.push(bytes[start..].to_vec());
        anyhow::ensure!(parts.len() > 1, "the pod template has no name");
        Ok(PodTemplate { parts })
    }

    /// The pod of index `i`.
    fn body(&self, i: usize) -> Vec<u8> {
        let index = i.to_string();
        let mut out = Vec::with_capacity(self.parts.iter().map(Vec::len).sum::<usize>() + 2 * index.len());
        for (k, part) in self.parts.iter().enumerate() {
            if k > 0 {
                out.extend_from_slice(index.as_bytes());
            }
            out.extend_from_slice(part);
        }
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
    let upstream = workload.upstream();
    let pods_per_second = round(pods_per_second);
    BenchResult {
        workload: workload.to_string(),
        upstream: upstream.name.to_string(),
        upstream_threshold: upstream.threshold,
        ratio: upstream
            .threshold
            .map(|t| (pods_per_second / t * 100.0).round() / 100.0),
        nodes,
        init_pods,
        pods: bound.len(),
        pods_per_second,
        samples: samples.iter().map(|v| round(*v)).collect(),
        overall_pods_per_second: round(overall),
        p50_ms: percentile(&lat, 50.0),
        p99_ms: percentile(&lat, 99.0),
        scheduled_events: 0,
        check: CheckReport::default(),
    }
}

/// Refuses a run that could never finish.
fn check_config(cfg: &BenchConfig) -> anyhow::Result<()> {
    if let Some(why) = cfg.workload.refuse(cfg.nodes, cfg.init_pods(), cfg.pods) {
        anyhow::bail!(why);
    }
    Ok(())
}

/// The namespaces and cluster-wide objects of one run.
struct RunObjects {
    measured: String,
    init: Vec<String>,
    node_prefix: String,
    priority_class: String,
}

impl RunObjects {
    fn all_namespaces(&self) -> impl Iterator<Item = &String> {
        std::iter::once(&self.measured).chain(self.init.iter())
    }

    /// The namespace of initial pod `i`: upstream's createPodSets puts a fixed number in each
    /// of many namespaces; otherwise they share one.
    fn init_namespace(&self, workload: Workload, i: usize) -> &str {
        let k = workload.init_pods_per_namespace().map_or(0, |per| i / per.max(1));
        &self.init[k.min(self.init.len() - 1)]
    }
}

/// Runs one workload and cleans up after it.
pub async fn bench(client: Client, cfg: BenchConfig) -> anyhow::Result<BenchResult> {
    check_config(&cfg)?;
    let run_id = format!(
        "{:08x}",
        std::process::id() ^ (jiff::Timestamp::now().subsec_nanosecond() as u32)
    );
    // As scheduler_perf, the initial and the measured pods live in namespaces of their own.
    let init = match cfg.workload.init_pods_per_namespace() {
        Some(per) => (0..cfg.init_total().div_ceil(per.max(1)).max(1))
            .map(|k| format!("skiff-bench-{run_id}-init-{k}"))
            .collect(),
        None => vec![format!("skiff-bench-{run_id}-init")],
    };
    let objects = RunObjects {
        measured: format!("skiff-bench-{run_id}"),
        init,
        node_prefix: format!("bench-{run_id}"),
        priority_class: format!("skiff-bench-{run_id}-high"),
    };
    let result = async {
        let ns_api: Api<Namespace> = Api::all(client.clone());
        let (team, devops) = workloads::TEAM_LABEL;
        let labels = if cfg.workload.labelled_namespaces() {
            json!({team: devops})
        } else {
            json!({})
        };
        for name in objects.all_namespaces() {
            let ns_obj: Namespace = serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))?;
            ns_api
                .create(&PostParams::default(), &ns_obj)
                .await
                .with_context(|| format!("creating namespace {name}"))?;
            default_service_account(&client, name).await?;
        }
        run_bench(&client, &cfg, &objects).await
    }
    .await;
    cleanup(&client, &cfg, &objects).await;
    result
}

/// The namespace's `default` ServiceAccount, which the ServiceAccount admission plugin requires
/// of its pods: made here as the service account controller would, since the bench server runs
/// no controllers (one that does has made it already).
pub async fn default_service_account(client: &Client, namespace: &str) -> anyhow::Result<()> {
    let api: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let sa: k8s_openapi::api::core::v1::ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "default"}}))?;
    match api.create(&PostParams::default(), &sa).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("creating the default service account of {namespace}")),
    }
}

/// When each pod of a namespace was created, or first seen bound.
type PodTimes = Arc<Mutex<HashMap<String, Instant>>>;

async fn create_nodes(client: &Client, cfg: &BenchConfig, prefix: &str) -> anyhow::Result<()> {
    let nodes_api: Api<Node> = Api::all(client.clone());
    let csinodes: Api<CSINode> = Api::all(client.clone());
    let with_csinode = cfg.workload == Workload::CsiPvs;
    stream::iter(0..cfg.nodes)
        .map(|i| {
            let (api, csinodes) = (nodes_api.clone(), csinodes.clone());
            let obj = bench_node(prefix, i, cfg.nodes, cfg.workload);
            async move {
                let node: Node = serde_json::from_value(obj.clone())?;
                let created = api
                    .create(&PostParams::default(), &node)
                    .await
                    .context("creating node")?;
                let name = created.metadata.name.clone().unwrap_or_default();
                let has_alloc = created
                    .status
                    .as_ref()
                    .and_then(|s| s.allocatable.as_ref())
                    .is_some_and(|a| !a.is_empty());
                if !has_alloc {
                    api.patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(&json!({"status": obj["status"]})),
                    )
                    .await
                    .context("writing node status")?;
                }
                if with_csinode {
                    let c: CSINode = serde_json::from_value(bench_csinode(&name))?;
                    csinodes
                        .create(&PostParams::default(), &c)
                        .await
                        .context("creating CSINode")?;
                }
                anyhow::Ok(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// The claim of each pod `(namespace, index)` and its volume, bound to each other as
/// scheduler_perf binds them (created before the pods; upstream creates each pair right before
/// its pod, inside the measured window).
async fn create_volumes(client: &Client, kind: VolumeKind, pods: &[(String, usize)]) -> anyhow::Result<()> {
    let pv_api: Api<PersistentVolume> = Api::all(client.clone());
    stream::iter(pods)
        .map(|(ns, i)| {
            let pv_api = pv_api.clone();
            let pvc_api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
            async move {
                let pvc: PersistentVolumeClaim = serde_json::from_value(bench_pvc(ns, *i))?;
                let pvc_name = pvc.metadata.name.clone().unwrap_or_default();
                pvc_api
                    .create(&PostParams::default(), &pvc)
                    .await
                    .with_context(|| format!("creating claim {ns}/{pvc_name}"))?;
                let status = json!({"status": {"phase": "Bound", "accessModes": ["ReadOnlyMany"],
                                               "capacity": {"storage": "1Gi"}}});
                pvc_api
                    .patch_status(&pvc_name, &PatchParams::default(), &Patch::Merge(&status))
                    .await
                    .with_context(|| format!("writing the status of claim {ns}/{pvc_name}"))?;
                let pv: PersistentVolume = serde_json::from_value(bench_pv(ns, *i, kind))?;
                let pv_name = pv.metadata.name.clone().unwrap_or_default();
                pv_api
                    .create(&PostParams::default(), &pv)
                    .await
                    .with_context(|| format!("creating volume {pv_name}"))?;
                pv_api
                    .patch_status(
                        &pv_name,
                        &PatchParams::default(),
                        &Patch::Merge(&json!({"status": {"phase": "Bound"}})),
                    )
                    .await
                    .with_context(|| format!("writing the status of volume {pv_name}"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

async fn run_bench(client: &Client, cfg: &BenchConfig, objects: &RunObjects) -> anyhow::Result<BenchResult> {
    let workload = cfg.workload;
    if workload == Workload::Preemption {
        let pc: PriorityClass = serde_json::from_value(bench_priority_class(&objects.priority_class))?;
        Api::<PriorityClass>::all(client.clone())
            .create(&PostParams::default(), &pc)
            .await
            .context("creating the PriorityClass")?;
    }
    if workload == Workload::DefaultTopologySpread {
        let svc: Service = serde_json::from_value(bench_service())?;
        Api::<Service>::namespaced(client.clone(), &objects.measured)
            .create(&PostParams::default(), &svc)
            .await
            .context("creating the Service")?;
    }
    let t = Instant::now();
    create_nodes(client, cfg, &objects.node_prefix).await?;
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
        Some(n) => {
            let mut tasks = vec![spawn_bind_watch(client.clone(), &objects.measured, bound.clone())];
            for ns in &objects.init {
                tasks.push(spawn_bind_watch(client.clone(), ns, init_bound.clone()));
            }
            (n.clone(), None, tasks)
        }
        None => {
            let name = format!("skiff-bench-scheduler-{}", objects.node_prefix);
            let (measured, init) = (bound.clone(), init_bound.clone());
            let measured_ns = objects.measured.clone();
            let init_ns: HashSet<String> = objects.init.iter().cloned().collect();
            let mut sc = SchedulerConfig {
                scheduler_names: vec![name.clone()],
                on_bound: Some(BoundObserver(Arc::new(move |pod_ns: &str, pod: &str| {
                    let times = if pod_ns == measured_ns {
                        &measured
                    } else if init_ns.contains(pod_ns) {
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
    let ctx = PodContext {
        scheduler: scheduler_name,
        measured_namespace: objects.measured.clone(),
        init_namespace: objects.init[0].clone(),
        priority_class: objects.priority_class.clone(),
    };
    let init_total = cfg.init_total();
    let outcome = async {
        // The initial pods of each template in turn, numbered on: created and bound before
        // anything is measured.
        let per_kind = cfg.init_pods();
        for (k, kind) in workload.init_kinds().iter().enumerate() {
            let pods: Vec<(String, usize)> = (k * per_kind..(k + 1) * per_kind)
                .map(|i| (objects.init_namespace(workload, i).to_string(), i))
                .collect();
            if let Some(v) = workload.volumes() {
                create_volumes(client, v, &pods).await?;
            }
            let template = PodTemplate::new(*kind, &ctx)?;
            create_pods(client, cfg.clients, &template, pods, None).await?;
            wait_bound(&init_bound, (k + 1) * per_kind, deadline).await?;
        }
        tracing::info!(pods = init_total, "bench initial pods bound");

        // The measured pods, with the throughput collector sampling from the start.
        let pods: Vec<(String, usize)> = (0..cfg.pods).map(|i| (objects.measured.clone(), i)).collect();
        if let Some(v) = workload.volumes() {
            create_volumes(client, v, &pods).await?;
        }
        let template = PodTemplate::new(workload.measured_kind(), &ctx)?;
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
            create_pods(client, cfg.clients, &template, pods, Some(&created)).await?;
            wait_bound(&bound, cfg.pods, deadline).await
        }
        .await;
        sampler.abort();
        measured?;
        let scheduled_events = count_events(client, &objects.measured, "Scheduled").await?;
        let samples = collector.lock().samples().to_vec();
        let created = created.lock().clone();
        let bound = bound.lock().clone();
        let mut result = summarize(workload, cfg.nodes, init_total, &created, &bound, &samples);
        result.scheduled_events = scheduled_events;

        // Every pod read back, and the placement checked against the pods' constraints.
        let placement = read_placement(client, objects).await?;
        let init_left = placement
            .pods
            .iter()
            .filter(|p| p.metadata.namespace.as_deref() != Some(objects.measured.as_str()))
            .count();
        let mut report = check(&placement, cfg.pods);
        report.init_pods_gone = init_total.saturating_sub(init_left);
        result.check = report;
        anyhow::Ok(result)
    }
    .await;
    for t in watch_tasks {
        t.abort();
    }
    if let Some(t) = scheduler_task {
        t.abort();
    }
    let result = outcome?;
    result.check.ensure_passed(workload.as_str())?;
    Ok(result)
}

/// The benchmark's nodes, the pods of its namespaces, and every namespace's labels.
async fn read_placement(client: &Client, objects: &RunObjects) -> anyhow::Result<Placement> {
    let prefix = format!("{}-", objects.node_prefix);
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing nodes")?
        .items
        .into_iter()
        .filter(|n| n.metadata.name.as_deref().is_some_and(|name| name.starts_with(&prefix)))
        .collect();
    let mut pods = Vec::new();
    for ns in objects.all_namespaces() {
        let list = Api::<Pod>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .with_context(|| format!("listing the pods of {ns}"))?;
        pods.extend(list.items);
    }
    let namespace_labels = Api::<Namespace>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing namespaces")?
        .items
        .into_iter()
        .filter_map(|n| Some((n.metadata.name?, n.metadata.labels.unwrap_or_default())))
        .collect();
    Ok(Placement {
        nodes,
        pods,
        namespace_labels,
        measured_namespace: objects.measured.clone(),
    })
}

/// Creates the pods `(namespace, index)` named `pod-INDEX` from `template`, `clients` at a
/// time, recording when each creation was sent.
async fn create_pods(
    client: &Client,
    clients: usize,
    template: &PodTemplate,
    pods: Vec<(String, usize)>,
    created: Option<&PodTimes>,
) -> anyhow::Result<()> {
    stream::iter(pods)
        .map(|(ns, i)| {
            let body = template.body(i);
            async move {
                let name = format!("pod-{i}");
                let path = format!("/api/v1/namespaces/{ns}/pods");
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
        .buffer_unordered(clients.max(1))
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

async fn cleanup(client: &Client, cfg: &BenchConfig, objects: &RunObjects) {
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    for ns in objects.all_namespaces() {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        if let Err(e) = pods.delete_collection(&dp, &ListParams::default()).await {
            tracing::warn!(error = %e, "deleting bench pods failed");
        }
    }
    if cfg.workload.volumes().is_some() {
        let pv_api: Api<PersistentVolume> = Api::all(client.clone());
        let mut names: Vec<String> = (0..cfg.pods).map(|i| format!("{}-vol-{i}", objects.measured)).collect();
        names.extend((0..cfg.init_total()).map(|i| format!("{}-vol-{i}", objects.init_namespace(cfg.workload, i))));
        stream::iter(names)
            .for_each_concurrent(CONCURRENCY, |name| {
                let api = pv_api.clone();
                async move {
                    if let Err(e) = api.delete(&name, &DeleteParams::default()).await {
                        tracing::debug!(error = %e, volume = %name, "deleting bench volume failed");
                    }
                }
            })
            .await;
        for ns in objects.all_namespaces() {
            let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
            if let Err(e) = claims.delete_collection(&dp, &ListParams::default()).await {
                tracing::debug!(error = %e, "deleting bench claims failed");
            }
        }
    }
    if cfg.workload == Workload::Preemption
        && let Err(e) = Api::<PriorityClass>::all(client.clone())
            .delete(&objects.priority_class, &DeleteParams::default())
            .await
    {
        tracing::debug!(error = %e, "deleting the bench PriorityClass failed");
    }
    let nodes_api: Api<Node> = Api::all(client.clone());
    let csinodes: Api<CSINode> = Api::all(client.clone());
    let with_csinode = cfg.workload == Workload::CsiPvs;
    stream::iter(0..cfg.nodes)
        .for_each_concurrent(CONCURRENCY, |i| {
            let (api, csinodes) = (nodes_api.clone(), csinodes.clone());
            let name = format!("{}-{i}", objects.node_prefix);
            async move {
                if let Err(e) = api.delete(&name, &DeleteParams::default()).await {
                    tracing::debug!(error = %e, node = %name, "deleting bench node failed");
                }
                if with_csinode && let Err(e) = csinodes.delete(&name, &DeleteParams::default()).await {
                    tracing::debug!(error = %e, node = %name, "deleting bench CSINode failed");
                }
            }
        })
        .await;
    let ns_api: Api<Namespace> = Api::all(client.clone());
    for ns in objects.all_namespaces() {
        if let Err(e) = ns_api.delete(ns, &DeleteParams::default()).await {
            tracing::debug!(error = %e, "deleting bench namespace failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use skiff_scheduler::cache::Cache;
    use skiff_scheduler::framework::Framework;
    use skiff_scheduler::plugins::default_preemption;
    use skiff_scheduler::types::PodInfo;

    fn ctx() -> PodContext {
        PodContext {
            scheduler: "s".into(),
            measured_namespace: "m".into(),
            init_namespace: "i-0".into(),
            priority_class: "high".into(),
        }
    }

    #[test]
    fn workload_names_round_trip() {
        for w in Workload::ALL {
            assert_eq!(w.as_str().parse::<Workload>().unwrap(), w);
        }
        assert!("nope".parse::<Workload>().is_err());
    }

    #[test]
    fn runs_that_cannot_finish_are_refused() {
        let cfg = BenchConfig {
            workload: Workload::PodAntiAffinity,
            ..Default::default()
        };
        let err = check_config(&cfg).unwrap_err().to_string();
        assert!(err.contains("1000 + 10000 pods cannot fit on 5000 nodes"), "{err}");
        let fits = BenchConfig {
            pods: 2000,
            ..cfg.clone()
        };
        assert!(check_config(&fits).is_ok());
        assert!(check_config(&BenchConfig::default()).is_ok());
        let preempt = BenchConfig {
            workload: Workload::Preemption,
            ..Default::default()
        };
        assert!(check_config(&preempt).is_err());
        assert!(check_config(&BenchConfig { pods: 5000, ..preempt }).is_ok());
        let ns = BenchConfig {
            workload: Workload::PodAntiAffinityNsSelector,
            pods: 2000,
            ..Default::default()
        };
        // 4,000 initial pods at 6,000 nodes, 3,333 at 5,000: 1,667 measured ones fit.
        assert!(check_config(&ns).is_err());
        assert!(check_config(&BenchConfig { pods: 1667, ..ns }).is_ok());
    }

    #[test]
    fn pod_template_splices_the_index() {
        for w in Workload::ALL {
            for kind in w.init_kinds().iter().chain([&w.measured_kind()]) {
                let t = PodTemplate::new(*kind, &ctx()).unwrap();
                let spliced: Value = serde_json::from_slice(&t.body(7)).unwrap();
                assert_eq!(spliced, bench_pod("7", *kind, &ctx()), "{w}");
            }
        }
        let claim: Value =
            serde_json::from_slice(&PodTemplate::new(PodKind::WithClaim, &ctx()).unwrap().body(42)).unwrap();
        assert_eq!(claim["metadata"]["name"], "pod-42");
        assert_eq!(
            claim["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
            "pvc-42"
        );
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
        // Upstream's threshold beside the figure.
        assert_eq!(r.upstream, "SchedulingBasic/5000Nodes_10000Pods");
        assert_eq!(r.upstream_threshold, Some(680.0));
        assert_eq!(r.ratio, Some(1.47));
        let r = summarize(Workload::Preemption, 10, 2, &created, &bound, &[900.0]);
        assert_eq!((r.upstream_threshold, r.ratio), (None, None));
    }

    #[test]
    fn upstream_thresholds_are_named_for_every_shape() {
        for w in Workload::ALL {
            let u = w.upstream();
            assert!(u.nodes >= 1000 && u.measure_pods > 0, "{w}");
            assert_eq!(
                u.threshold.is_none(),
                matches!(w, Workload::Taints | Workload::Preemption),
                "{w}"
            );
        }
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
        assert_eq!(Workload::Mixed.default_init_pods(5000), 2000);
        assert_eq!(Workload::NodeInclusionPolicy.default_init_pods(5000), 0);
        assert_eq!(Workload::PodAntiAffinityNsSelector.default_init_pods(6000), 4000);
        assert_eq!(Workload::Preemption.default_init_pods(5000), 20_000);
        assert_eq!(Workload::Basic.default_init_pods(20), 4);
        let cfg = BenchConfig {
            init_pods: Some(0),
            ..Default::default()
        };
        assert_eq!(cfg.init_pods(), 0);
        assert_eq!(BenchConfig::default().init_pods(), 1000);
        // Five templates of 2,000 initial pods each.
        let mixed = BenchConfig {
            workload: Workload::Mixed,
            ..Default::default()
        };
        assert_eq!(mixed.init_total(), 10_000);
        // Initial anti-affinity pods need a node each too.
        let crowded = BenchConfig {
            workload: Workload::PodAntiAffinity,
            pods: 10,
            nodes: 10,
            init_pods: Some(1),
            ..Default::default()
        };
        assert!(check_config(&crowded).is_err());
    }

    /// Schedules one pod through the real plugins (preempting when the cycle fails and
    /// preemption finds victims, whom it removes) and assumes it on its node.
    fn place(w: Workload, fw: &mut Framework, cache: &mut Cache, ns: &str, i: usize, kind: PodKind) {
        if let Some(v) = w.volumes() {
            let mut pvc: PersistentVolumeClaim = serde_json::from_value(bench_pvc(ns, i)).unwrap();
            pvc.status = Some(serde_json::from_value(json!({"phase": "Bound"})).unwrap());
            cache.volumes.pvcs.update(Arc::new(pvc));
            let mut pv: PersistentVolume = serde_json::from_value(bench_pv(ns, i, v)).unwrap();
            pv.status = Some(serde_json::from_value(json!({"phase": "Bound"})).unwrap());
            cache.volumes.pvs.update(Arc::new(pv));
        }
        let mut p: Pod = serde_json::from_value(bench_pod(&i.to_string(), kind, &ctx())).unwrap();
        p.metadata.namespace = Some(ns.into());
        p.metadata.uid = Some(format!("{ns}/{i}"));
        if kind == PodKind::HighPriority {
            // What the API server's Priority admission writes from the PriorityClass.
            p.spec.as_mut().unwrap().priority = Some(workloads::HIGH_PRIORITY);
        }
        let info = Arc::new(PodInfo::new(p));
        let res = match fw.schedule(&info, cache) {
            Ok((res, _)) => res,
            Err(f) => {
                let (diag, state) = *f;
                let c = default_preemption::preempt(fw, state.as_ref(), &info, cache, &diag)
                    .unwrap_or_else(|e| panic!("{w}: {ns}/pod-{i}: {} ({e})", diag.message()));
                for v in &c.victims {
                    cache.remove_pod(&v.uid);
                }
                fw.schedule(&info, cache)
                    .unwrap_or_else(|f| panic!("{w}: {ns}/pod-{i} after preemption: {}", f.0.message()))
                    .0
            }
        };
        let node = cache.node_name(res.node).to_string();
        cache.assume_pod(info, &node);
    }

    /// Every workload's initial and measured pods fit on its nodes through the real plugins (no
    /// API round trip), and the final placement passes the workload's check.
    #[test]
    fn workloads_schedule_in_memory() {
        let nodes = 100;
        for w in Workload::ALL {
            let mut pods = 100;
            let per_kind = w.default_init_pods(nodes);
            while w.refuse(nodes, per_kind, pods).is_some() {
                pods -= 1;
            }
            let mut cache = Cache::new();
            let node_objs: Vec<Node> = (0..nodes)
                .map(|i| serde_json::from_value(bench_node("n", i, nodes, w)).unwrap())
                .collect();
            for n in &node_objs {
                let name = n.metadata.name.clone().unwrap();
                if w == Workload::CsiPvs {
                    let c: CSINode = serde_json::from_value(bench_csinode(&name)).unwrap();
                    cache.volumes.csi_nodes.insert(name, Arc::new(c));
                }
                cache.upsert_node(Arc::new(n.clone()));
            }
            let init_ns = |i: usize| format!("i-{}", w.init_pods_per_namespace().map_or(0, |per| i / per));
            let labels: std::collections::BTreeMap<String, String> = if w.labelled_namespaces() {
                [("team".to_string(), "devops".to_string())].into()
            } else {
                Default::default()
            };
            let total_init = per_kind * w.init_kinds().len();
            let mut namespace_labels = HashMap::new();
            for ns in std::iter::once("m".to_string()).chain((0..total_init.max(1)).map(init_ns)) {
                cache.set_namespace(&ns, labels.clone());
                namespace_labels.insert(ns, labels.clone());
            }
            if w == Workload::DefaultTopologySpread {
                let sel = [("app".to_string(), "scheduler-perf".to_string())].into();
                cache
                    .spread_sources
                    .services
                    .entry("m".into())
                    .or_default()
                    .insert("service-0".into(), sel);
            }
            let mut fw = Framework::with_default_plugins(0);
            for (k, kind) in w.init_kinds().iter().enumerate() {
                for i in k * per_kind..(k + 1) * per_kind {
                    place(w, &mut fw, &mut cache, &init_ns(i), i, *kind);
                }
            }
            for i in 0..pods {
                place(w, &mut fw, &mut cache, "m", i, w.measured_kind());
            }
            let placed: Vec<Pod> = cache
                .all_pods()
                .map(|(n, p)| {
                    let mut pod = (*p.pod).clone();
                    pod.spec.as_mut().unwrap().node_name = Some(n.name.clone());
                    pod
                })
                .collect();
            let placement = Placement {
                nodes: node_objs,
                pods: placed,
                namespace_labels,
                measured_namespace: "m".into(),
            };
            let report = check(&placement, pods);
            assert!(report.passed, "{w}: {:?}", report.violations);
            assert_eq!(report.measured_bound, pods, "{w}");
            let gone = total_init + pods - placement.pods.len();
            match w {
                // Each measured pod (3 CPUs) preempted three of its node's four 900m pods.
                Workload::Preemption => assert_eq!(gone, 3 * pods, "{w}"),
                _ => assert_eq!(gone, 0, "{w}"),
            }
            let expect: &[&str] = match w {
                Workload::NodeAffinity => &["node-affinity"],
                Workload::Taints => &["taints"],
                Workload::TopologySpread | Workload::NodeInclusionPolicy => &["topology-spread"],
                Workload::PodAffinity | Workload::PodAffinityNsSelector => &["pod-affinity"],
                Workload::PodAntiAffinity | Workload::PodAntiAffinityNsSelector => &["pod-anti-affinity"],
                Workload::Mixed => &["pod-affinity", "pod-anti-affinity"],
                _ => &[],
            };
            for rule in expect {
                assert!(report.rules.contains(rule), "{w}: {:?}", report.rules);
            }
        }
    }
}
