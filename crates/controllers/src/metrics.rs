//! The controllers' work queue metrics, as upstream's `component-base/metrics/prometheus/workqueue`
//! names them (label `name`: the controller's queue), in the process's one registry.

use std::sync::LazyLock;

use skiff_metrics::{Counter, EncodeLabelSet, Family, Gauge, Histogram, HistogramFamily, exponential_buckets};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NameLabels {
    name: &'static str,
}

struct Families {
    depth: Family<NameLabels, Gauge>,
    adds: Family<NameLabels, Counter>,
    queue_duration: HistogramFamily<NameLabels>,
    work_duration: HistogramFamily<NameLabels>,
    retries: Family<NameLabels, Counter>,
}

fn latency_histogram() -> Histogram {
    // Upstream's buckets: 10 ns to 10 s.
    Histogram::new(exponential_buckets(10e-9, 10.0, 10))
}

static FAMILIES: LazyLock<Families> = LazyLock::new(|| {
    let f = Families {
        depth: Family::default(),
        adds: Family::default(),
        queue_duration: Family::new_with_constructor(latency_histogram),
        work_duration: Family::new_with_constructor(latency_histogram),
        retries: Family::default(),
    };
    skiff_metrics::register("workqueue_depth", "Current depth of workqueue", f.depth.clone());
    skiff_metrics::register(
        "workqueue_adds",
        "Total number of adds handled by workqueue",
        f.adds.clone(),
    );
    skiff_metrics::register(
        "workqueue_queue_duration_seconds",
        "How long in seconds an item stays in workqueue before being requested.",
        f.queue_duration.clone(),
    );
    skiff_metrics::register(
        "workqueue_work_duration_seconds",
        "How long in seconds processing an item from workqueue takes.",
        f.work_duration.clone(),
    );
    skiff_metrics::register(
        "workqueue_retries",
        "Total number of retries handled by workqueue",
        f.retries.clone(),
    );
    f
});

/// One queue's series, resolved once when its controller starts.
#[derive(Clone, Debug)]
pub struct QueueMetrics {
    pub depth: Gauge,
    pub adds: Counter,
    pub queue_duration: Histogram,
    pub work_duration: Histogram,
    pub retries: Counter,
}

impl QueueMetrics {
    pub fn new(name: &'static str) -> QueueMetrics {
        let f = &*FAMILIES;
        let l = NameLabels { name };
        QueueMetrics {
            depth: f.depth.get_or_create_owned(&l),
            adds: f.adds.get_or_create_owned(&l),
            queue_duration: f.queue_duration.get_or_create_owned(&l),
            work_duration: f.work_duration.get_or_create_owned(&l),
            retries: f.retries.get_or_create_owned(&l),
        }
    }
}
