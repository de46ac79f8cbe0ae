//! The node agent's metrics, as upstream's `pkg/kubelet/metrics` names them, in the process's
//! one registry; served at the agent endpoint's `/metrics` (and, in `skiff server`, which runs
//! the agent in-process, at the API server's too).

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Instant;

use parking_lot::Mutex;
use skiff_metrics::{EncodeLabelSet, Family, Gauge, Histogram, HistogramFamily};

use crate::docker::{PodRuntime, RunState};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    container_state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation: &'static str,
}

/// What one pod has in the engine: a running sandbox, and its containers per state.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct PodCounts {
    running_sandbox: bool,
    created: i64,
    running: i64,
    exited: i64,
}

struct AgentMetrics {
    running_pods: Gauge,
    running_containers: Family<StateLabels, Gauge>,
    pod_start: Histogram,
    pod_worker: HistogramFamily<OperationLabels>,
    pods: Mutex<HashMap<String, PodCounts>>,
}

/// Upstream's buckets of `kubelet_pod_start_duration_seconds`.
const POD_START_BUCKETS: [f64; 25] = [
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 480.0,
    600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
];

fn worker_histogram() -> Histogram {
    Histogram::new(skiff_metrics::DEFAULT_BUCKETS)
}

static METRICS: LazyLock<AgentMetrics> = LazyLock::new(|| {
    let m = AgentMetrics {
        running_pods: Gauge::default(),
        running_containers: Family::default(),
        pod_start: Histogram::new(POD_START_BUCKETS),
        pod_worker: Family::new_with_constructor(worker_histogram),
        pods: Mutex::new(HashMap::new()),
    };
    skiff_metrics::register(
        "kubelet_running_pods",
        "Number of pods that have a running pod sandbox",
        m.running_pods.clone(),
    );
    skiff_metrics::register(
        "kubelet_running_containers",
        "Number of containers currently running",
        m.running_containers.clone(),
    );
    skiff_metrics::register(
        "kubelet_pod_start_duration_seconds",
        "Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run",
        m.pod_start.clone(),
    );
    skiff_metrics::register(
        "kubelet_pod_worker_duration_seconds",
        "Duration in seconds to sync a single pod. Broken down by operation type: create, update, or sync",
        m.pod_worker.clone(),
    );
    for container_state in ["created", "running", "exited"] {
        m.running_containers
            .get_or_create(&StateLabels { container_state })
            .set(0);
    }
    m
});

/// Registers the agent's metrics (idempotent), so a scrape shows them before any pod.
pub fn init() {
    LazyLock::force(&METRICS);
}

fn publish(m: &AgentMetrics, pods: &HashMap<String, PodCounts>) {
    let mut total = PodCounts::default();
    let mut running_pods = 0;
    for c in pods.values() {
        running_pods += i64::from(c.running_sandbox);
        total.created += c.created;
        total.running += c.running;
        total.exited += c.exited;
    }
    m.running_pods.set(running_pods);
    for (container_state, n) in [
        ("created", total.created),
        ("running", total.running),
        ("exited", total.exited),
    ] {
        m.running_containers
            .get_or_create(&StateLabels { container_state })
            .set(n);
    }
}

/// What the engine has of pod `uid` after a sync.
pub fn pod_runtime(uid: &str, rt: &PodRuntime) {
    let mut counts = PodCounts {
        running_sandbox: rt.running_sandbox().is_some(),
        ..Default::default()
    };
    for c in &rt.containers {
        match c.state {
            RunState::Created => counts.created += 1,
            RunState::Running => counts.running += 1,
            RunState::Exited => counts.exited += 1,
        }
    }
    let m = &*METRICS;
    let mut pods = m.pods.lock();
    if pods.get(uid) == Some(&counts) {
        return;
    }
    pods.insert(uid.to_string(), counts);
    publish(m, &pods);
}

/// Pod `uid` is gone from the engine.
pub fn pod_removed(uid: &str) {
    let m = &*METRICS;
    let mut pods = m.pods.lock();
    if pods.remove(uid).is_some() {
        publish(m, &pods);
    }
}

/// A pod first seen at `seen` runs.
pub fn pod_started(seen: Instant) {
    METRICS.pod_start.observe(skiff_metrics::seconds_since(seen));
}

/// One sync of a pod's worker (`create`: its first, `update`: after the pod changed, `sync`: a
/// resync or a runtime event, `kill`: its termination).
pub fn pod_worker(operation: &'static str, start: Instant) {
    METRICS
        .pod_worker
        .get_or_create(&OperationLabels { operation })
        .observe(skiff_metrics::seconds_since(start));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_pods_and_containers_add_up_over_pods() {
        let m = &*METRICS;
        let mut pods = HashMap::new();
        pods.insert(
            "a".to_string(),
            PodCounts {
                running_sandbox: true,
                running: 2,
                exited: 1,
                ..Default::default()
            },
        );
        pods.insert(
            "b".to_string(),
            PodCounts {
                running_sandbox: false,
                exited: 1,
                created: 1,
                ..Default::default()
            },
        );
        publish(m, &pods);
        pod_started(Instant::now());
        pod_worker("create", Instant::now());
        let text = skiff_metrics::encode();
        assert!(text.contains("\nkubelet_running_pods 1\n"), "{text}");
        assert!(
            text.contains("kubelet_running_containers{container_state=\"running\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("kubelet_running_containers{container_state=\"exited\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("kubelet_running_containers{container_state=\"created\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("kubelet_pod_start_duration_seconds_bucket{le=\"0.5\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("kubelet_pod_worker_duration_seconds_count{operation=\"create\"} 1\n"),
            "{text}"
        );
    }
}
