//! Resource usage of the node and its pods' containers, served as the kubelet's Summary API
//! (`/stats/summary`), which the API server reads to answer `metrics.k8s.io` as metrics-server
//! does (`kubectl top`). Every [`INTERVAL`] the sampler asks Docker for each running container's
//! stats (one shot: cumulative CPU time and memory) and reads the machine's `/proc/stat` and
//! `/proc/meminfo`; a CPU rate is the difference of two samples over the time between them, as
//! cAdvisor's `usageNanoCores`, so a container has CPU usage from its second sample on. A
//! container that has no rate yet is read every [`NEWCOMER_INTERVAL`] until it has one. Memory is
//! the working set as the kubelet counts it: usage less inactive file pages.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bollard::Docker;
use bollard::query_parameters::{ListContainersOptionsBuilder, StatsOptionsBuilder};
use futures::StreamExt;
use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::docker::{
    LABEL_CONTAINER_NAME, LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID, LABEL_TYPE, Owner, TYPE_CONTAINER, label,
};

/// How often usage is sampled (the kubelet's cAdvisor housekeeping is 10 to 15 s; metrics-server
/// resolves at 15 s).
pub const INTERVAL: Duration = Duration::from_secs(10);

/// How often containers without a CPU rate yet are looked for and read: a container started
/// since the last full sample has its first reading within this, and its rate one more later,
/// so a new pod's metrics are served about two seconds after it starts rather than twenty.
pub const NEWCOMER_INTERVAL: Duration = Duration::from_secs(1);

/// Stats calls to the engine in flight at once.
const PARALLEL: usize = 8;

/// One reading of a cumulative CPU counter and a memory gauge.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reading {
    /// When it was read (monotonic, for the rate) ...
    pub at: Instant,
    /// ... and by the wall clock (what the Summary reports as `time`).
    pub time: jiff::Timestamp,
    /// CPU time used since start, in nanoseconds.
    pub cpu_ns: u64,
    /// Working set in bytes.
    pub memory: u64,
}

/// Usage derived from two readings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Usage {
    pub time: jiff::Timestamp,
    /// Cores used on average between the two readings, in billionths.
    pub nano_cores: Option<u64>,
    pub core_ns: u64,
    pub memory: u64,
}

/// The usage between `prev` and `last`: no CPU rate without an earlier reading, or when the
/// counter went back (the container restarted).
pub fn usage(prev: Option<&Reading>, last: &Reading) -> Usage {
    let nano_cores = prev.and_then(|p| {
        let elapsed = last.at.checked_duration_since(p.at)?.as_nanos();
        let used = u128::from(last.cpu_ns.checked_sub(p.cpu_ns)?);
        (elapsed > 0).then(|| (used * 1_000_000_000 / elapsed) as u64)
    });
    Usage {
        time: last.time,
        nano_cores,
        core_ns: last.cpu_ns,
        memory: last.memory,
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct ContainerRef {
    namespace: String,
    pod: String,
    uid: String,
    container: String,
}

#[derive(Default)]
struct Samples {
    node: Option<(Option<Reading>, Reading)>,
    /// By container id: whose it is, and its last two readings.
    containers: HashMap<String, (ContainerRef, Option<Reading>, Reading)>,
}

/// The node's latest usage samples, shared between the sampler and the endpoint.
#[derive(Clone, Default)]
pub struct Sampler {
    samples: Arc<Mutex<Samples>>,
}

impl Sampler {
    /// Samples forever: everything every [`INTERVAL`], and in between, every
    /// [`NEWCOMER_INTERVAL`], the containers that have no CPU rate yet. One task does both, so
    /// two readings of a container are never taken a moment apart.
    pub async fn run(self, docker: Docker, node: String, cluster: String) {
        let mut tick = tokio::time::interval(NEWCOMER_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_full: Option<Instant> = None;
        loop {
            tick.tick().await;
            let owner = Owner {
                node: &node,
                cluster: &cluster,
            };
            let full = last_full.is_none_or(|t| t.elapsed() + NEWCOMER_INTERVAL / 2 >= INTERVAL);
            if full {
                last_full = Some(Instant::now());
            }
            if let Err(e) = self.sample(&docker, owner, full).await {
                tracing::warn!(error = format!("{e:#}"), "sampling resource usage");
            }
        }
    }

    /// Read the node and every running container (`full`), or only the containers with no
    /// CPU rate yet (the others keep their readings).
    async fn sample(&self, docker: &Docker, owner: Owner<'_>, full: bool) -> anyhow::Result<()> {
        if full {
            match node_reading() {
                Ok(reading) => {
                    let mut samples = self.samples.lock();
                    let prev = samples.node.map(|(_, last)| last);
                    samples.node = Some((prev, reading));
                }
                Err(e) => tracing::warn!(error = format!("{e:#}"), "reading the node's usage"),
            }
        }
        let mut filters = owner.filters([label(LABEL_TYPE, TYPE_CONTAINER)]);
        filters.insert("status".into(), vec!["running".into()]);
        let options = ListContainersOptionsBuilder::default().filters(&filters).build();
        let running = docker
            .list_containers(Some(options))
            .await
            .context("listing running containers")?;
        let targets: Vec<(String, ContainerRef)> = running
            .into_iter()
            .filter_map(|c| {
                let labels = c.labels?;
                let get = |k: &str| labels.get(k).cloned();
                Some((
                    c.id?,
                    ContainerRef {
                        namespace: get(LABEL_POD_NAMESPACE)?,
                        pod: get(LABEL_POD_NAME)?,
                        uid: get(LABEL_POD_UID)?,
                        container: get(LABEL_CONTAINER_NAME)?,
                    },
                ))
            })
            .collect();
        let targets: Vec<(String, ContainerRef)> = if full {
            targets
        } else {
            let samples = self.samples.lock();
            targets
                .into_iter()
                .filter(|(id, _)| samples.containers.get(id).is_none_or(|(_, prev, _)| prev.is_none()))
                .collect()
        };
        if targets.is_empty() {
            return Ok(());
        }
        let readings: Vec<(String, ContainerRef, Option<Reading>)> = futures::stream::iter(targets)
            .map(|(id, who)| async move {
                let reading = container_reading(docker, &id).await;
                if let Err(e) = &reading {
                    tracing::debug!(container = id, error = format!("{e:#}"), "container stats");
                }
                (id, who, reading.ok().flatten())
            })
            .buffer_unordered(PARALLEL)
            .collect()
            .await;
        let mut samples = self.samples.lock();
        let mut next = HashMap::with_capacity(readings.len());
        for (id, who, reading) in readings {
            let Some(reading) = reading else { continue };
            let prev = samples.containers.remove(&id).map(|(_, _, last)| last);
            next.insert(id, (who, prev, reading));
        }
        if full {
            // Containers no longer running are dropped with their readings.
            samples.containers = next;
        } else {
            samples.containers.extend(next);
        }
        Ok(())
    }

    /// The Summary API's document: the node's usage and each pod's containers'.
    pub fn summary(&self, node_name: &str) -> Value {
        let samples = self.samples.lock();
        let mut node = json!({ "nodeName": node_name });
        if let Some((prev, last)) = &samples.node {
            let u = usage(prev.as_ref(), last);
            node["cpu"] = cpu_json(&u);
            node["memory"] = memory_json(&u);
        }
        let mut by_pod: Vec<(&str, &str, &str, Vec<Value>)> = Vec::new();
        let mut index: HashMap<(&str, &str, &str), usize> = HashMap::new();
        let mut ids: Vec<&String> = samples.containers.keys().collect();
        ids.sort();
        for id in ids {
            let (who, prev, last) = &samples.containers[id];
            let u = usage(prev.as_ref(), last);
            let container = json!({
                "name": who.container,
                "cpu": cpu_json(&u),
                "memory": memory_json(&u),
            });
            let key = (who.namespace.as_str(), who.pod.as_str(), who.uid.as_str());
            match index.get(&key) {
                Some(&i) => by_pod[i].3.push(container),
                None => {
                    index.insert(key, by_pod.len());
                    by_pod.push((key.0, key.1, key.2, vec![container]));
                }
            }
        }
        let pods: Vec<Value> = by_pod
            .into_iter()
            .map(|(namespace, name, uid, mut containers)| {
                containers.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
                json!({
                    "podRef": { "name": name, "namespace": namespace, "uid": uid },
                    "containers": containers,
                })
            })
            .collect();
        json!({ "node": node, "pods": pods })
    }
}

fn cpu_json(u: &Usage) -> Value {
    let mut cpu = json!({ "time": u.time.to_string(), "usageCoreNanoSeconds": u.core_ns });
    if let Some(n) = u.nano_cores {
        cpu["usageNanoCores"] = json!(n);
    }
    cpu
}

fn memory_json(u: &Usage) -> Value {
    json!({ "time": u.time.to_string(), "workingSetBytes": u.memory })
}

/// One container's reading from the engine (`None` when it reports no CPU counter: it stopped).
async fn container_reading(docker: &Docker, id: &str) -> anyhow::Result<Option<Reading>> {
    let options = StatsOptionsBuilder::default().stream(false).one_shot(true).build();
    let mut stream = docker.stats(id, Some(options));
    let Some(stats) = stream.next().await.transpose().context("container stats")? else {
        return Ok(None);
    };
    let at = Instant::now();
    let Some(cpu_ns) = stats
        .cpu_stats
        .as_ref()
        .and_then(|c| c.cpu_usage.as_ref())
        .and_then(|u| u.total_usage)
    else {
        return Ok(None);
    };
    let memory = stats.memory_stats.as_ref().map_or(0, |m| {
        let usage = m.usage.unwrap_or(0);
        let inactive = m.stats.as_ref().and_then(|s| {
            // cgroup v2 names it `inactive_file`, v1 `total_inactive_file`.
            s.get("inactive_file").or_else(|| s.get("total_inactive_file")).copied()
        });
        usage.saturating_sub(inactive.unwrap_or(0))
    });
    Ok(Some(Reading {
        at,
        time: jiff::Timestamp::now(),
        cpu_ns,
        memory,
    }))
}

/// The machine's reading: CPU time spent outside idle and iowait over all CPUs (`/proc/stat`),
/// memory in use (`MemTotal - MemAvailable`).
fn node_reading() -> anyhow::Result<Reading> {
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let meminfo = std::fs::read_to_string("/proc/meminfo").context("reading /proc/meminfo")?;
    let cpu_ns = busy_cpu_ns(&stat, ticks_per_second()).context("parsing /proc/stat")?;
    let memory = used_memory(&meminfo).context("parsing /proc/meminfo")?;
    Ok(Reading {
        at: Instant::now(),
        time: jiff::Timestamp::now(),
        cpu_ns,
        memory,
    })
}

fn ticks_per_second() -> u64 {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).ok().filter(|&t| t > 0).unwrap_or(100)
}

/// Busy CPU time in nanoseconds from `/proc/stat`'s aggregate `cpu` line: every field but idle
/// (4th) and iowait (5th); guest time is already inside user and nice.
pub fn busy_cpu_ns(stat: &str, ticks_per_second: u64) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    let busy: u64 = fields
        .iter()
        .take(8)
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, v)| *v)
        .sum();
    Some(busy.saturating_mul(1_000_000_000) / ticks_per_second.max(1))
}

/// `MemTotal - MemAvailable` in bytes from `/proc/meminfo`.
pub fn used_memory(meminfo: &str) -> Option<u64> {
    let field = |name: &str| {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
    };
    Some(field("MemTotal")?.saturating_sub(field("MemAvailable")?) * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(at: Instant, cpu_ns: u64) -> Reading {
        Reading {
            at,
            time: jiff::Timestamp::UNIX_EPOCH,
            cpu_ns,
            memory: 42,
        }
    }

    #[test]
    fn cpu_rate_is_the_counter_difference_over_the_elapsed_time() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(10);
        // 2.5 s of CPU in 10 s: a quarter of a core.
        let u = usage(Some(&reading(t0, 1_000_000_000)), &reading(t1, 3_500_000_000));
        assert_eq!(u.nano_cores, Some(250_000_000));
        assert_eq!(u.core_ns, 3_500_000_000);
        assert_eq!(u.memory, 42);
    }

    #[test]
    fn no_rate_from_one_reading_or_a_counter_that_went_back() {
        let t0 = Instant::now();
        assert_eq!(usage(None, &reading(t0, 5)).nano_cores, None);
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(usage(Some(&reading(t0, 10)), &reading(t1, 5)).nano_cores, None);
        assert_eq!(usage(Some(&reading(t0, 10)), &reading(t0, 20)).nano_cores, None);
    }

    #[test]
    fn proc_stat_busy_time_leaves_out_idle_and_iowait() {
        let stat = "cpu  100 20 30 1000 50 5 5 0 0 0\ncpu0 50 10 15 500 25 2 3 0 0 0\nintr 1\n";
        // user + nice + system + irq + softirq + steal = 160 ticks = 1.6 s at 100 Hz.
        assert_eq!(busy_cpu_ns(stat, 100), Some(1_600_000_000));
        assert_eq!(busy_cpu_ns("cpu0 1 2 3\n", 100), None);
        assert_eq!(busy_cpu_ns("cpu  a b\n", 100), None);
    }

    #[test]
    fn meminfo_used_is_total_less_available() {
        let meminfo = "MemTotal:       2048 kB\nMemFree:         100 kB\nMemAvailable:    1024 kB\n";
        assert_eq!(used_memory(meminfo), Some(1024 * 1024));
        assert_eq!(used_memory("MemTotal: 5 kB\n"), None);
    }

    #[test]
    fn summary_groups_containers_by_pod() {
        let sampler = Sampler::default();
        let t0 = Instant::now();
        let who = |pod: &str, c: &str| ContainerRef {
            namespace: "ns".into(),
            pod: pod.into(),
            uid: format!("uid-{pod}"),
            container: c.into(),
        };
        {
            let mut s = sampler.samples.lock();
            s.containers.insert(
                "a".into(),
                (
                    who("p", "web"),
                    Some(reading(t0, 0)),
                    reading(t0 + Duration::from_secs(2), 1_000_000_000),
                ),
            );
            s.containers
                .insert("b".into(), (who("p", "side"), None, reading(t0, 7)));
            s.containers.insert("c".into(), (who("q", "web"), None, reading(t0, 7)));
        }
        let summary = sampler.summary("n1");
        assert_eq!(summary["node"]["nodeName"], "n1");
        assert!(summary["node"].get("cpu").is_none());
        let pods = summary["pods"].as_array().unwrap();
        assert_eq!(pods.len(), 2);
        let p = pods.iter().find(|p| p["podRef"]["name"] == "p").unwrap();
        assert_eq!(p["podRef"]["uid"], "uid-p");
        let names: Vec<&str> = p["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["side", "web"]);
        assert_eq!(p["containers"][1]["cpu"]["usageNanoCores"], 500_000_000);
        assert!(p["containers"][0]["cpu"].get("usageNanoCores").is_none());
        assert_eq!(p["containers"][0]["memory"]["workingSetBytes"], 42);
    }
}
