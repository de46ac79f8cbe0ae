//! Store write benchmark, run by each backend's ignored `bench_*` test.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::Store;

/// Figures of one [`bench_creates`] run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BenchResult {
    /// Acknowledged creates per second, over the whole run.
    pub creates_per_second: f64,
    /// Median latency of one create, in milliseconds.
    pub p50_ms: f64,
    /// 99th percentile latency of one create, in milliseconds.
    pub p99_ms: f64,
    /// Creates that failed (not counted in the throughput).
    pub errors: usize,
}

/// Creates `n` pod-sized objects under a fresh `/registry/bench/` prefix from
/// `clients` concurrent tasks, each waiting for its previous create to be
/// acknowledged before sending the next.
pub async fn bench_creates(store: Arc<dyn Store>, n: usize, clients: usize) -> BenchResult {
    let clients = clients.clamp(1, n.max(1));
    let run = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros();
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(clients);
    for client in 0..clients {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(n / clients + 1);
            let mut errors = 0;
            for i in (client..n).step_by(clients) {
                let name = format!("bench-{i:07}");
                let key = format!("/registry/bench/run-{run}/{name}");
                let value = pod_json(&name);
                let began = Instant::now();
                match store.create(&key, value).await {
                    Ok(_) => latencies.push(began.elapsed()),
                    Err(err) => {
                        errors += 1;
                        tracing::warn!(key, error = %err, "benchmark create failed");
                    }
                }
            }
            (latencies, errors)
        }));
    }
    let mut latencies: Vec<Duration> = Vec::with_capacity(n);
    let mut errors = 0;
    for task in tasks {
        match task.await {
            Ok((l, e)) => {
                latencies.extend(l);
                errors += e;
            }
            Err(err) => {
                tracing::error!(error = %err, "benchmark client failed");
                errors += n / clients;
            }
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    latencies.sort_unstable();
    BenchResult {
        creates_per_second: if elapsed > 0.0 {
            latencies.len() as f64 / elapsed
        } else {
            0.0
        },
        p50_ms: percentile_ms(&latencies, 0.50),
        p99_ms: percentile_ms(&latencies, 0.99),
        errors,
    }
}

/// Nearest-rank percentile of sorted latencies.
fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    let index = rank.clamp(1, sorted.len()) - 1;
    sorted[index].as_secs_f64() * 1000.0
}

/// A typical small pod, as the API server would store it.
fn pod_json(name: &str) -> Vec<u8> {
    format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","namespace":"default","uid":"6f1c2d3e-0000-4000-8000-{name:0>12.12}","creationTimestamp":"2026-01-01T00:00:00Z","labels":{{"app":"bench"}}}},"spec":{{"containers":[{{"name":"app","image":"busybox:latest","command":["sleep","3600"],"resources":{{"requests":{{"cpu":"10m","memory":"16Mi"}}}},"imagePullPolicy":"IfNotPresent","terminationMessagePath":"/dev/termination-log","terminationMessagePolicy":"File"}}],"restartPolicy":"Always","terminationGracePeriodSeconds":30,"dnsPolicy":"ClusterFirst","schedulerName":"default-scheduler","priority":0,"enableServiceLinks":true,"preemptionPolicy":"PreemptLowerPriority"}},"status":{{"phase":"Pending","qosClass":"Burstable"}}}}"#
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    #[test]
    fn percentiles_use_nearest_rank() {
        let sorted: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile_ms(&sorted, 0.50), 50.0);
        assert_eq!(percentile_ms(&sorted, 0.99), 99.0);
        assert_eq!(percentile_ms(&sorted[..1], 0.99), 1.0);
        assert_eq!(percentile_ms(&[], 0.5), 0.0);
    }

    #[tokio::test]
    async fn bench_creates_every_object() {
        let store = MemoryStore::new();
        let result = bench_creates(store.clone(), 1000, 8).await;
        assert_eq!(result.errors, 0);
        assert!(result.creates_per_second > 0.0);
        assert!(result.p50_ms <= result.p99_ms);
        let listed = store.list("/registry/bench/", Default::default()).await.unwrap();
        assert_eq!(listed.items.len(), 1000);
        assert!(serde_json::from_slice::<serde_json::Value>(&listed.items[0].value).is_ok());
    }
}
