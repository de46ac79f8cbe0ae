//! The process's one metrics registry, served as Prometheus text (0.0.4) at `/metrics` by the
//! API server and by the node agent.
//!
//! Every component registers its metric families here once, under upstream's names, types,
//! labels and buckets (each crate's `metrics.rs`); counters and gauges are atomics, so recording
//! costs a label-set lookup at most. The process metrics (`process_*`) are read from `/proc` at
//! each scrape, as client_golang's process collector.

use std::sync::LazyLock;

use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Metric, Registry};

pub use prometheus_client;
pub use prometheus_client::encoding::EncodeLabelSet;
pub use prometheus_client::metrics::counter::Counter;
pub use prometheus_client::metrics::family::Family;
pub use prometheus_client::metrics::gauge::Gauge;
pub use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

/// The `Content-Type` of the exposition.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Upstream's buckets of `apiserver_request_duration_seconds` and `etcd_request_duration_seconds`.
pub const REQUEST_DURATION_BUCKETS: [f64; 23] = [
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0, 30.0,
    45.0, 60.0,
];

/// client_golang's `DefBuckets`.
pub const DEFAULT_BUCKETS: [f64; 11] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(|| {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(ProcessCollector));
    Mutex::new(registry)
});

/// Register `metric` in the process's registry. A counter's name is given without `_total`
/// (the exposition adds it).
pub fn register(name: &str, help: &str, metric: impl Metric) {
    // The exposition ends every help text with a full stop of its own.
    REGISTRY.lock().register(name, help.trim_end_matches('.'), metric);
}

/// A histogram family whose every series has `buckets`.
pub type HistogramFamily<S> = Family<S, Histogram, fn() -> Histogram>;

/// Everything registered, in the Prometheus text format.
pub fn encode() -> String {
    let mut out = String::with_capacity(64 * 1024);
    let registry = REGISTRY.lock();
    if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry) {
        // Writing to a String does not fail; a metric whose encoding does is left out.
        out.push_str(&format!("# encoding stopped: {e}\n"));
    }
    out
}

/// Seconds since `start`, as histograms take them.
pub fn seconds_since(start: std::time::Instant) -> f64 {
    start.elapsed().as_secs_f64()
}

/// client_golang's process collector: CPU time, memory, file descriptors and start time of this
/// process, read from `/proc/self` at each scrape.
#[derive(Debug)]
struct ProcessCollector;

/// What `/proc/self` says.
#[derive(Debug, Default, PartialEq)]
struct ProcessStats {
    cpu_seconds: f64,
    virtual_bytes: u64,
    resident_bytes: u64,
    start_time_seconds: f64,
    open_fds: u64,
    max_fds: Option<u64>,
}

fn sysconf(name: libc::c_int) -> Option<f64> {
    // SAFETY: sysconf only reads a configuration value.
    let v = unsafe { libc::sysconf(name) };
    (v > 0).then_some(v as f64)
}

/// `/proc/PID/stat`'s fields after the command (which may hold spaces and parentheses).
fn parse_stat(stat: &str, boot_time: f64, ticks: f64, page: f64) -> Option<ProcessStats> {
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Field 3 of stat(5) (state) is f[0]: utime is field 14, stime 15, starttime 22, vsize 23, rss 24.
    let field = |n: usize| f.get(n - 3).and_then(|v| v.parse::<f64>().ok());
    Some(ProcessStats {
        cpu_seconds: (field(14)? + field(15)?) / ticks,
        start_time_seconds: boot_time + field(22)? / ticks,
        virtual_bytes: field(23)? as u64,
        resident_bytes: (field(24)? * page) as u64,
        ..Default::default()
    })
}

fn boot_time() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines().find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())
}

fn max_fds() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

fn process_stats() -> Option<ProcessStats> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let ticks = sysconf(libc::_SC_CLK_TCK)?;
    let page = sysconf(libc::_SC_PAGESIZE)?;
    let mut s = parse_stat(&stat, boot_time()?, ticks, page)?;
    s.open_fds = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count() as u64)
        .unwrap_or(0);
    s.max_fds = max_fds();
    Some(s)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(s) = process_stats() else {
            return Ok(());
        };
        let counter = |encoder: &mut DescriptorEncoder, name: &str, help: &str, v: f64| {
            let c = ConstCounter::new(v);
            c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)
        };
        let gauge = |encoder: &mut DescriptorEncoder, name: &str, help: &str, v: f64| {
            let g = ConstGauge::new(v);
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)
        };
        counter(
            &mut encoder,
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            s.cpu_seconds,
        )?;
        gauge(
            &mut encoder,
            "process_open_fds",
            "Number of open file descriptors",
            s.open_fds as f64,
        )?;
        if let Some(max) = s.max_fds {
            gauge(
                &mut encoder,
                "process_max_fds",
                "Maximum number of open file descriptors",
                max as f64,
            )?;
        }
        gauge(
            &mut encoder,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes",
            s.virtual_bytes as f64,
        )?;
        gauge(
            &mut encoder,
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            s.resident_bytes as f64,
        )?;
        gauge(
            &mut encoder,
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds",
            s.start_time_seconds,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_a_command_with_spaces() {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
        // cutime cstime priority nice threads itrealvalue starttime vsize rss ...
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 4 0 1000 123456789 2048 0 0";
        let s = parse_stat(stat, 1_700_000_000.0, 100.0, 4096.0).unwrap();
        assert_eq!(s.cpu_seconds, 3.0);
        assert_eq!(s.start_time_seconds, 1_700_000_010.0);
        assert_eq!(s.virtual_bytes, 123_456_789);
        assert_eq!(s.resident_bytes, 2048 * 4096);
    }

    #[test]
    fn exposition_has_the_process_metrics_and_what_was_registered() {
        let c: Family<Vec<(String, String)>, Counter> = Family::default();
        register("skiff_test_things", "Things.", c.clone());
        c.get_or_create(&vec![("kind".into(), "a".into())]).inc_by(3);
        let text = encode();
        assert!(text.contains("# TYPE skiff_test_things_total counter\n"), "{text}");
        assert!(text.contains("skiff_test_things_total{kind=\"a\"} 3\n"), "{text}");
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(text.lines().any(|l| l.starts_with(name)), "{name} missing: {text}");
        }
        let rss: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
            .unwrap()
            .parse()
            .unwrap();
        assert!(rss > 1e6, "{rss}");
    }
}
