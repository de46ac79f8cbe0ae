//! Node pressure, as the kubelet's eviction manager observes it (`pkg/kubelet/eviction`): every
//! 10 s the node's signals are measured against its hard eviction thresholds (`--eviction-hard`,
//! upstream's defaults `memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%,
//! imagefs.available<15%,imagefs.inodesFree<5%`), and the Node's `MemoryPressure`, `DiskPressure`
//! and `PIDPressure` conditions say which are crossed. A condition stays True for
//! `--eviction-pressure-transition-period` (5 min) after its last crossing, so it does not flap.
//!
//! Signals: `memory.available` is the host's `MemAvailable` (the kubelet subtracts the root
//! cgroup's working set from capacity, which comes to nearly the same on a host running only
//! containers); `nodefs` is the filesystem of the agent's data dir, `imagefs` the Docker Engine's
//! root dir; `pid.available` is `kernel.pid_max` less the processes running.
//!
//! While a threshold is crossed, one pod is evicted per round (the kubelet's hard eviction, no
//! grace period), chosen as upstream ranks them: first the pods whose usage of the starved
//! resource exceeds their requests (BestEffort pods request nothing), then the lowest priority,
//! then the largest use above requests (memory from the engine's statistics; on disk pressure
//! a pod's ephemeral storage is its containers' writable layers and its disk-backed emptyDir volumes).
//! Pods of priority 2,000,000,000 and above (system-critical) are left alone. An evicted pod's
//! containers are killed and it ends `Failed` with reason `Evicted`, the kubelet's message and the
//! `DisruptionTarget` condition (`TerminationByKubelet`); its controller replaces it elsewhere.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use parking_lot::Mutex;
use tokio::sync::watch;

/// How often the signals are measured (the kubelet's housekeeping interval).
pub const MONITORING_INTERVAL: Duration = Duration::from_secs(10);
/// Upstream's `--eviction-pressure-transition-period`.
pub const PRESSURE_TRANSITION_PERIOD: Duration = Duration::from_secs(300);
/// Upstream's `--eviction-hard` defaults on Linux.
pub const DEFAULT_EVICTION_HARD: &str =
    "memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%,imagefs.available<15%,imagefs.inodesFree<5%";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Signal {
    MemoryAvailable,
    NodeFsAvailable,
    NodeFsInodesFree,
    ImageFsAvailable,
    ImageFsInodesFree,
    PidAvailable,
}

impl Signal {
    fn parse(s: &str) -> anyhow::Result<Signal> {
        Ok(match s {
            "memory.available" => Signal::MemoryAvailable,
            "nodefs.available" => Signal::NodeFsAvailable,
            "nodefs.inodesFree" => Signal::NodeFsInodesFree,
            "imagefs.available" => Signal::ImageFsAvailable,
            "imagefs.inodesFree" => Signal::ImageFsInodesFree,
            "pid.available" => Signal::PidAvailable,
            other => bail!("unsupported eviction signal {other:?}"),
        })
    }

    pub fn name(&self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::NodeFsAvailable => "nodefs.available",
            Signal::NodeFsInodesFree => "nodefs.inodesFree",
            Signal::ImageFsAvailable => "imagefs.available",
            Signal::ImageFsInodesFree => "imagefs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }
}

/// A threshold's quantity: absolute (bytes, inodes, pids) or a share of the capacity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Quantity {
    Absolute(u64),
    Percent(f64),
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Threshold {
    pub signal: Signal,
    pub quantity: Quantity,
}

/// Parses `--eviction-hard` (`SIGNAL<QUANTITY` pairs separated by commas, as the kubelet).
pub fn parse_thresholds(s: &str) -> anyhow::Result<Vec<Threshold>> {
    let mut out: Vec<Threshold> = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (signal, quantity) = part
            .split_once('<')
            .with_context(|| format!("{part:?}: expected SIGNAL<QUANTITY"))?;
        let signal = Signal::parse(signal.trim())?;
        let quantity = quantity.trim();
        let quantity = match quantity.strip_suffix('%') {
            Some(p) => {
                let p: f64 = p.parse().with_context(|| format!("{part:?}: not a percentage"))?;
                anyhow::ensure!((0.0..=100.0).contains(&p), "{part:?}: a percentage is 0 to 100");
                Quantity::Percent(p / 100.0)
            }
            None => {
                let v = crate::quantity::parse_value(quantity).with_context(|| format!("{part:?}: not a quantity"))?;
                Quantity::Absolute(u64::try_from(v).with_context(|| format!("{part:?}: negative"))?)
            }
        };
        anyhow::ensure!(
            !out.iter().any(|t| t.signal == signal),
            "{part:?}: {} given twice",
            signal.name()
        );
        out.push(Threshold { signal, quantity });
    }
    Ok(out)
}

/// One measurement of a signal: what is available, out of what capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observation {
    pub available: u64,
    pub capacity: u64,
}

/// The node's signals as measured (a signal that could not be measured is absent).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observations(pub Vec<(Signal, Observation)>);

impl Observations {
    fn get(&self, signal: Signal) -> Option<Observation> {
        self.0.iter().find(|(s, _)| *s == signal).map(|(_, o)| *o)
    }
}

/// The thresholds `observations` cross (upstream's `thresholdsMet`).
pub fn crossed(thresholds: &[Threshold], observations: &Observations) -> Vec<Threshold> {
    thresholds
        .iter()
        .filter(|t| {
            let Some(o) = observations.get(t.signal) else {
                return false;
            };
            let limit = match t.quantity {
                Quantity::Absolute(v) => v as f64,
                Quantity::Percent(p) => o.capacity as f64 * p,
            };
            (o.available as f64) < limit
        })
        .copied()
        .collect()
}

/// Which of the Node's pressure conditions are True.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pressure {
    pub memory: bool,
    pub disk: bool,
    pub pid: bool,
}

fn pressure_of(crossed: &[Threshold]) -> Pressure {
    let mut p = Pressure::default();
    for t in crossed {
        match t.signal {
            Signal::MemoryAvailable => p.memory = true,
            Signal::NodeFsAvailable
            | Signal::NodeFsInodesFree
            | Signal::ImageFsAvailable
            | Signal::ImageFsInodesFree => p.disk = true,
            Signal::PidAvailable => p.pid = true,
        }
    }
    p
}

/// Keeps each condition True for the transition period after it was last observed.
#[derive(Debug)]
pub struct PressureTracker {
    period: Duration,
    last: [Option<Instant>; 3],
}

impl PressureTracker {
    pub fn new(period: Duration) -> Self {
        Self {
            period,
            last: [None; 3],
        }
    }

    /// The conditions in force after observing `now` the thresholds `crossed`.
    pub fn observe(&mut self, crossed: &[Threshold], now: Instant) -> Pressure {
        let seen = pressure_of(crossed);
        for (i, on) in [seen.memory, seen.disk, seen.pid].into_iter().enumerate() {
            if on {
                self.last[i] = Some(now);
            }
        }
        let held = |i: usize| self.last[i].is_some_and(|t| now.duration_since(t) < self.period);
        Pressure {
            memory: held(0),
            disk: held(1),
            pid: held(2),
        }
    }
}

fn statvfs_observations(path: &Path, bytes: Signal, inodes: Signal, out: &mut Vec<(Signal, Observation)>) {
    match rustix::fs::statvfs(path) {
        Ok(st) => {
            out.push((
                bytes,
                Observation {
                    available: st.f_bavail.saturating_mul(st.f_frsize),
                    capacity: st.f_blocks.saturating_mul(st.f_frsize),
                },
            ));
            if st.f_files > 0 {
                out.push((
                    inodes,
                    Observation {
                        available: st.f_favail,
                        capacity: st.f_files,
                    },
                ));
            }
        }
        Err(e) => tracing::debug!(path = %path.display(), error = %e, "measuring a filesystem"),
    }
}

/// `MemAvailable` and `MemTotal` of a `/proc/meminfo`, in bytes.
pub fn meminfo(text: &str) -> Option<Observation> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    Some(Observation {
        available: field("MemAvailable:")?,
        capacity: field("MemTotal:")?,
    })
}

/// Measures every signal (blocking: filesystem and /proc reads).
pub fn observe(nodefs: &Path, imagefs: Option<&Path>) -> Observations {
    let mut out = Vec::new();
    if let Some(memory) = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .as_deref()
        .and_then(meminfo)
    {
        out.push((Signal::MemoryAvailable, memory));
    }
    statvfs_observations(nodefs, Signal::NodeFsAvailable, Signal::NodeFsInodesFree, &mut out);
    let imagefs = imagefs.unwrap_or(nodefs);
    statvfs_observations(imagefs, Signal::ImageFsAvailable, Signal::ImageFsInodesFree, &mut out);
    let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    if let Some(pid_max) = pid_max {
        let running = std::fs::read_dir("/proc")
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| {
                        e.file_name()
                            .to_str()
                            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
                    })
                    .count() as u64
            })
            .unwrap_or(0);
        out.push((
            Signal::PidAvailable,
            Observation {
                available: pid_max.saturating_sub(running),
                capacity: pid_max,
            },
        ));
    }
    Observations(out)
}

/// Pods evicted by this agent: uid to the message their status carries (the pod worker reports
/// them `Failed`, reason `Evicted`).
pub type Evicted = Arc<Mutex<HashMap<String, String>>>;

/// Pods at or above this priority are never evicted (`system-cluster-critical` and up).
const CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// What evicting needs of the node agent.
#[derive(Clone)]
pub struct Evictor {
    pub client: kube::Client,
    pub docker: bollard::Docker,
    pub node: String,
    /// The cluster's identity, which the node's containers are labelled with.
    pub cluster: String,
    pub recorder: crate::events::Recorder,
    pub evicted: Evicted,
    /// The agent's data dir (pods' emptyDir volumes live under it).
    pub data_dir: PathBuf,
}

/// The resource a signal starves, as the eviction message names it.
fn resource(signal: Signal) -> &'static str {
    match signal {
        Signal::MemoryAvailable => "memory",
        Signal::NodeFsAvailable | Signal::ImageFsAvailable => "ephemeral-storage",
        Signal::NodeFsInodesFree | Signal::ImageFsInodesFree => "inodes",
        Signal::PidAvailable => "pids",
    }
}

fn requests(pod: &Pod, resource: &str) -> u64 {
    pod.spec
        .as_ref()
        .map(|s| {
            s.containers
                .iter()
                .filter_map(|c| c.resources.as_ref()?.requests.as_ref()?.get(resource))
                .filter_map(|q| crate::quantity::parse_value(&q.0))
                .map(|v| u64::try_from(v).unwrap_or(0))
                .sum()
        })
        .unwrap_or(0)
}

/// A pod as ranked for eviction.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub pod: Pod,
    /// Its use of the starved resource, when measured.
    pub usage: Option<u64>,
}

/// Upstream's ranking (`rankMemoryPressure` and kin): candidates' indexes, the first to go first.
pub fn rank(candidates: &[Candidate], resource: &str) -> Vec<usize> {
    let key = |c: &Candidate| {
        let requested = requests(&c.pod, resource);
        let exceeds = match c.usage {
            Some(used) => used > requested,
            // Not measured: a pod that requested nothing counts as over its request.
            None => requested == 0,
        };
        let priority = c.pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
        let above = c.usage.unwrap_or(0).saturating_sub(requested);
        (!exceeds, priority, std::cmp::Reverse(above))
    };
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    order.sort_by_key(|i| key(&candidates[*i]));
    order
}

fn ki(bytes: u64) -> String {
    format!("{}Ki", bytes / 1024)
}

/// The kubelet's eviction message.
pub fn message(threshold: &Threshold, observed: Option<Observation>, candidate: &Candidate) -> String {
    let resource = resource(threshold.signal);
    let bytes = matches!(resource, "memory" | "ephemeral-storage");
    let show = |v: u64| if bytes { ki(v) } else { v.to_string() };
    let quantity = match (threshold.quantity, observed) {
        (Quantity::Absolute(v), _) => show(v),
        (Quantity::Percent(p), Some(o)) => show((o.capacity as f64 * p) as u64),
        (Quantity::Percent(p), None) => format!("{}%", p * 100.0),
    };
    let available = observed.map(|o| show(o.available)).unwrap_or_else(|| "unknown".into());
    let mut text =
        format!("The node was low on resource: {resource}. Threshold quantity: {quantity}, available: {available}. ");
    if let (Some(used), Some(spec)) = (candidate.usage, candidate.pod.spec.as_ref())
        && let Some(container) = spec.containers.first()
        && spec.containers.len() == 1
    {
        let requested = requests(&candidate.pod, resource);
        text.push_str(&format!(
            "Container {} was using {}, request is {}, has larger consumption of {resource}. ",
            container.name,
            show(used),
            if requested == 0 {
                "0".to_string()
            } else {
                show(requested)
            },
        ));
    }
    text
}

/// The bytes of the files under `dir`, not following symlinks nor entering other filesystems.
pub fn tree_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(root) = std::fs::symlink_metadata(dir) else {
        return 0;
    };
    let device = root.dev();
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&path) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.dev() != device {
                continue;
            }
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() {
                total += meta.blocks() * 512;
            }
        }
    }
    total
}

/// A container's memory working set (usage less inactive file pages, as cAdvisor counts it).
async fn memory_working_set(docker: &bollard::Docker, id: &str) -> Option<u64> {
    let options = bollard::query_parameters::StatsOptionsBuilder::new()
        .stream(false)
        .one_shot(true)
        .build();
    let stats = docker.stats(id, Some(options)).next().await?.ok()?;
    let memory = stats.memory_stats?;
    let usage = memory.usage?;
    let inactive = memory
        .stats
        .as_ref()
        .and_then(|s| s.get("inactive_file"))
        .copied()
        .unwrap_or(0);
    Some(usage.saturating_sub(inactive))
}

impl Evictor {
    fn owner(&self) -> crate::docker::Owner<'_> {
        crate::docker::Owner {
            node: &self.node,
            cluster: &self.cluster,
        }
    }

    /// Evicts one pod for the crossed `threshold`; `false` when none could be.
    async fn evict_one(&self, threshold: &Threshold, observed: Option<Observation>) -> anyhow::Result<bool> {
        let api: Api<Pod> = Api::all(self.client.clone());
        let pods = api
            .list(&ListParams::default().fields(&format!("spec.nodeName={}", self.node)))
            .await
            .context("listing this node's pods")?
            .items;
        let evicted = self.evicted.lock().clone();
        let resource = resource(threshold.signal);
        let mut candidates = Vec::new();
        for pod in pods {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let phase = pod
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .unwrap_or("Pending");
            let critical = pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0) >= CRITICAL_PRIORITY;
            if evicted.contains_key(&uid)
                || critical
                || pod.metadata.deletion_timestamp.is_some()
                || matches!(phase, "Succeeded" | "Failed")
            {
                continue;
            }
            let usage = match resource {
                "memory" => {
                    let runtime = crate::docker::pod_runtime(&self.docker, self.owner(), &uid).await?;
                    let mut total = None;
                    for c in &runtime.containers {
                        if let Some(ws) = memory_working_set(&self.docker, &c.id).await {
                            total = Some(total.unwrap_or(0) + ws);
                        }
                    }
                    total
                }
                // Writable layers and disk-backed emptyDir volumes, as the kubelet counts
                // ephemeral storage (the walk stays inside the volumes' own filesystem).
                "ephemeral-storage" => {
                    let layers = crate::docker::pod_writable_layers(&self.docker, self.owner(), &uid).await?;
                    let dir = crate::volumes::pod_dir(&self.data_dir, &uid)
                        .join("volumes")
                        .join("kubernetes.io~empty-dir");
                    let volumes = tokio::task::spawn_blocking(move || tree_bytes(&dir)).await.unwrap_or(0);
                    Some(layers + volumes)
                }
                _ => None,
            };
            candidates.push(Candidate { pod, usage });
        }
        let Some(&first) = rank(&candidates, resource).first() else {
            return Ok(false);
        };
        let chosen = &candidates[first];
        let text = message(threshold, observed, chosen);
        let uid = chosen.pod.metadata.uid.clone().unwrap_or_default();
        tracing::warn!(pod = ?chosen.pod.metadata.name, signal = threshold.signal.name(), "evicting a pod");
        self.evicted.lock().insert(uid.clone(), text.clone());
        self.recorder.record(
            crate::events::pod_reference(&chosen.pod, None),
            "Warning",
            "Evicted",
            None,
            text,
        );
        // Its worker wakes on the deaths and reports it Failed.
        let runtime = crate::docker::pod_runtime(&self.docker, self.owner(), &uid).await?;
        if let Err(e) = crate::cleanup::stop_pod(&self.docker, &runtime, crate::cleanup::Grace::Kill).await {
            tracing::debug!(error = %format!("{e:#}"), "killing an evicted pod's containers");
        }
        Ok(true)
    }
}

/// Measures the node every [`MONITORING_INTERVAL`], publishes its pressure conditions on
/// `pressure` (a change wakes the node status writer) and, with an `evictor`, evicts one pod per
/// round while a threshold is crossed.
pub async fn run(
    thresholds: Vec<Threshold>,
    nodefs: PathBuf,
    imagefs: Option<PathBuf>,
    pressure: watch::Sender<Pressure>,
    evictor: Option<Evictor>,
) {
    let mut tracker = PressureTracker::new(PRESSURE_TRANSITION_PERIOD);
    let mut tick = tokio::time::interval(MONITORING_INTERVAL);
    loop {
        tick.tick().await;
        let (nodefs_path, imagefs_path) = (nodefs.clone(), imagefs.clone());
        let observed = tokio::task::spawn_blocking(move || observe(&nodefs_path, imagefs_path.as_deref())).await;
        let Ok(observations) = observed else {
            continue;
        };
        let crossed = crossed(&thresholds, &observations);
        for t in &crossed {
            if let Some(o) = observations.get(t.signal) {
                tracing::warn!(
                    signal = t.signal.name(),
                    available = o.available,
                    capacity = o.capacity,
                    "eviction threshold crossed"
                );
            }
        }
        let now_in_force = tracker.observe(&crossed, Instant::now());
        pressure.send_if_modified(|p| {
            let changed = *p != now_in_force;
            *p = now_in_force;
            changed
        });
        if let (Some(evictor), Some(threshold)) = (&evictor, crossed.first()) {
            match evictor.evict_one(threshold, observations.get(threshold.signal)).await {
                Ok(true) => {}
                Ok(false) => tracing::warn!(signal = threshold.signal.name(), "no pod left to evict"),
                Err(e) => tracing::warn!(error = %format!("{e:#}"), "evicting a pod"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_thresholds_parse_as_upstreams() {
        let t = parse_thresholds(DEFAULT_EVICTION_HARD).expect("thresholds");
        assert_eq!(t.len(), 5);
        assert_eq!(
            t[0],
            Threshold {
                signal: Signal::MemoryAvailable,
                quantity: Quantity::Absolute(100 * 1024 * 1024)
            }
        );
        assert_eq!(t[1].quantity, Quantity::Percent(0.10));
        assert!(parse_thresholds("memory.available>1Gi").is_err());
        assert!(parse_thresholds("cpu.available<1").is_err());
        assert!(parse_thresholds("nodefs.available<120%").is_err());
        assert!(parse_thresholds("memory.available<1Gi,memory.available<2Gi").is_err());
    }

    #[test]
    fn crossed_thresholds_make_pressure_that_holds_for_the_transition_period() {
        let thresholds = parse_thresholds("memory.available<1Gi,nodefs.available<10%,pid.available<100").expect("t");
        let gib = 1 << 30;
        let obs = |mem: u64, disk: u64, pids: u64| {
            Observations(vec![
                (
                    Signal::MemoryAvailable,
                    Observation {
                        available: mem,
                        capacity: 8 * gib,
                    },
                ),
                (
                    Signal::NodeFsAvailable,
                    Observation {
                        available: disk,
                        capacity: 100,
                    },
                ),
                (
                    Signal::PidAvailable,
                    Observation {
                        available: pids,
                        capacity: 4_194_304,
                    },
                ),
            ])
        };
        assert!(crossed(&thresholds, &obs(2 * gib, 50, 1000)).is_empty());
        let hit = crossed(&thresholds, &obs(gib / 2, 5, 50));
        assert_eq!(hit.len(), 3);
        let start = Instant::now();
        let mut tracker = PressureTracker::new(Duration::from_secs(300));
        assert_eq!(
            tracker.observe(&hit, start),
            Pressure {
                memory: true,
                disk: true,
                pid: true
            }
        );
        // Cleared, but within the transition period: still True.
        let none = crossed(&thresholds, &obs(2 * gib, 50, 1000));
        assert!(tracker.observe(&none, start + Duration::from_secs(60)).memory);
        assert_eq!(
            tracker.observe(&none, start + Duration::from_secs(301)),
            Pressure::default()
        );
    }

    fn candidate(name: &str, requests_memory: Option<&str>, priority: i32, usage: Option<u64>) -> Candidate {
        let resources = match requests_memory {
            Some(m) => serde_json::json!({"requests": {"memory": m}}),
            None => serde_json::json!({}),
        };
        Candidate {
            pod: serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "uid": name},
                "spec": {"priority": priority, "containers": [{"name": "c", "resources": resources}]},
            }))
            .expect("a Pod"),
            usage,
        }
    }

    #[test]
    fn pods_are_ranked_as_upstream_ranks_them_under_memory_pressure() {
        let mib = 1 << 20;
        let pods = vec![
            candidate("burstable-under", Some("1Gi"), 0, Some(10 * mib)),
            candidate("besteffort-small", None, 0, Some(mib)),
            candidate("burstable-over", Some("1Mi"), 0, Some(50 * mib)),
            candidate("besteffort-important", None, 1000, Some(100 * mib)),
        ];
        let order: Vec<&str> = rank(&pods, "memory")
            .into_iter()
            .filter_map(|i| pods[i].pod.metadata.name.as_deref())
            .collect();
        // Over their requests first (lowest priority first, then the most above requests).
        assert_eq!(
            order,
            [
                "burstable-over",
                "besteffort-small",
                "besteffort-important",
                "burstable-under"
            ]
        );
        let threshold = parse_thresholds("memory.available<100Mi").expect("t")[0];
        let observed = Observation {
            available: 50 * mib,
            capacity: 1 << 34,
        };
        assert_eq!(
            message(&threshold, Some(observed), &pods[1]),
            "The node was low on resource: memory. Threshold quantity: 102400Ki, available: 51200Ki. \
             Container c was using 1024Ki, request is 0, has larger consumption of memory. "
        );
        // Unmeasured (disk): pods that requested nothing first.
        let disk = vec![
            candidate("requested", None, 0, None),
            candidate("nothing", None, 0, None),
        ];
        assert_eq!(rank(&disk, "ephemeral-storage").len(), 2);
    }

    #[test]
    fn tree_bytes_counts_files_below_a_directory() {
        let dir = tempfile::tempdir().expect("a dir");
        std::fs::create_dir_all(dir.path().join("a/b")).expect("dirs");
        std::fs::write(dir.path().join("a/b/f"), vec![1u8; 64 * 1024]).expect("a file");
        std::os::unix::fs::symlink("/", dir.path().join("a/root")).expect("a symlink");
        let bytes = tree_bytes(dir.path());
        assert!((64 * 1024..1024 * 1024).contains(&bytes), "{bytes}");
    }

    #[test]
    fn meminfo_gives_available_and_total() {
        let text = "MemTotal:       24000000 kB\nMemFree:         1000 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(
            meminfo(text),
            Some(Observation {
                available: 20_000_000 * 1024,
                capacity: 24_000_000 * 1024
            })
        );
        let real = observe(Path::new("/"), None);
        assert!(
            real.get(Signal::MemoryAvailable)
                .is_some_and(|o| o.available <= o.capacity)
        );
        assert!(real.get(Signal::NodeFsAvailable).is_some_and(|o| o.capacity > 0));
        assert!(real.get(Signal::PidAvailable).is_some_and(|o| o.available < o.capacity));
    }
}
