//! The scheduler's metrics, as upstream's `pkg/scheduler/metrics`, in the process's one
//! registry (`skiff_metrics`). A profile's series are resolved once ([`ProfileMetrics`]).

use std::sync::LazyLock;
use std::time::Instant;

use skiff_metrics::{Counter, EncodeLabelSet, Family, Gauge, Histogram, HistogramFamily, exponential_buckets};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
    profile: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AttemptsLabels {
    attempts: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    queue: &'static str,
}

struct SchedulerMetrics {
    attempts: Family<ResultLabels, Counter>,
    attempt_duration: HistogramFamily<ResultLabels>,
    sli_duration: HistogramFamily<AttemptsLabels>,
    pending: Family<QueueLabels, Gauge>,
}

fn attempt_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

fn sli_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 20))
}

static METRICS: LazyLock<SchedulerMetrics> = LazyLock::new(|| {
    let m = SchedulerMetrics {
        attempts: Family::default(),
        attempt_duration: Family::new_with_constructor(attempt_histogram),
        sli_duration: Family::new_with_constructor(sli_histogram),
        pending: Family::default(),
    };
    skiff_metrics::register(
        "scheduler_schedule_attempts",
        "Number of attempts to schedule pods, by the result. 'unschedulable' means a pod could not be scheduled, while 'error' means an internal scheduler problem.",
        m.attempts.clone(),
    );
    skiff_metrics::register(
        "scheduler_scheduling_attempt_duration_seconds",
        "Scheduling attempt latency in seconds (scheduling algorithm + binding)",
        m.attempt_duration.clone(),
    );
    skiff_metrics::register(
        "scheduler_pod_scheduling_sli_duration_seconds",
        "E2e latency for a pod being scheduled, from the time the pod enters the scheduling queue and might involve multiple scheduling attempts.",
        m.sli_duration.clone(),
    );
    skiff_metrics::register(
        "scheduler_pending_pods",
        "Number of pending pods, by the queue type. 'active' means number of pods in activeQ; 'backoff' means number of pods in backoffQ; 'unschedulable' means number of pods in unschedulablePods that the scheduler attempted to schedule and failed.",
        m.pending.clone(),
    );
    m
});

/// One profile's series of the attempt metrics, resolved once.
#[derive(Clone)]
pub struct ProfileMetrics {
    pub profile: String,
    scheduled: (Counter, Histogram),
    unschedulable: (Counter, Histogram),
    error: (Counter, Histogram),
}

/// How an attempt ended (upstream's `result` label).
#[derive(Clone, Copy, Debug)]
pub enum AttemptResult {
    Scheduled,
    Unschedulable,
    Error,
}

impl ProfileMetrics {
    pub fn new(profile: &str) -> ProfileMetrics {
        let m = &*METRICS;
        let series = |result: &'static str| {
            let l = ResultLabels {
                result,
                profile: profile.to_string(),
            };
            (
                m.attempts.get_or_create_owned(&l),
                m.attempt_duration.get_or_create_owned(&l),
            )
        };
        ProfileMetrics {
            profile: profile.to_string(),
            scheduled: series("scheduled"),
            unschedulable: series("unschedulable"),
            error: series("error"),
        }
    }

    /// An attempt that began at `start` ended with `result`.
    pub fn attempt(&self, result: AttemptResult, start: Instant) {
        let (count, duration) = match result {
            AttemptResult::Scheduled => &self.scheduled,
            AttemptResult::Unschedulable => &self.unschedulable,
            AttemptResult::Error => &self.error,
        };
        count.inc();
        duration.observe(skiff_metrics::seconds_since(start));
    }
}

/// A pod bound after `attempts` attempts, `queued` being when it first entered the queue.
pub fn pod_scheduled(attempts: u32, queued: Instant) {
    METRICS
        .sli_duration
        .get_or_create(&AttemptsLabels { attempts })
        .observe(skiff_metrics::seconds_since(queued));
}

/// `scheduler_pending_pods` per queue.
/// (Gated pods never enter this queue: they wait outside it, so no `gated` series is reported.)
pub fn pending(active: usize, backoff: usize, unschedulable: usize) {
    let m = &*METRICS;
    for (queue, n) in [
        ("active", active),
        ("backoff", backoff),
        ("unschedulable", unschedulable),
    ] {
        m.pending.get_or_create(&QueueLabels { queue }).set(n as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_and_pending_in_the_exposition() {
        let p = ProfileMetrics::new("metrics-test-profile");
        let start = Instant::now();
        p.attempt(AttemptResult::Scheduled, start);
        p.attempt(AttemptResult::Scheduled, start);
        p.attempt(AttemptResult::Unschedulable, start);
        pod_scheduled(1, start);
        pending(3, 1, 2);
        let text = skiff_metrics::encode();
        assert!(
            text.contains(
                "scheduler_schedule_attempts_total{result=\"scheduled\",profile=\"metrics-test-profile\"} 2\n"
            ),
            "{text}"
        );
        assert!(text.contains(
            "scheduler_schedule_attempts_total{result=\"unschedulable\",profile=\"metrics-test-profile\"} 1\n"
        ));
        assert!(text.contains("scheduler_scheduling_attempt_duration_seconds_bucket{result=\"scheduled\",profile=\"metrics-test-profile\",le=\"0.001\"}"));
        assert!(text.contains("scheduler_pod_scheduling_sli_duration_seconds_count{attempts=\"1\"} 1\n"));
        assert!(text.contains("scheduler_pending_pods{queue=\"active\"} 3\n"));
        assert!(text.contains("scheduler_pending_pods{queue=\"unschedulable\"} 2\n"));
    }
}
