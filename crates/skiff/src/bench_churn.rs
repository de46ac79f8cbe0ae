//! `skiff bench churn`: the API server's memory while objects are created and deleted in rounds,
//! and after the history they left is compacted. Nothing is stored at the end, so a server that
//! gives its memory back returns to about its idle size.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;

use crate::bench::{ChildServer, anon_rss_mb, print_result, rss_mb, wait_ready};

#[derive(clap::Args)]
pub struct ChurnBench {
    /// ConfigMaps created and deleted in all.
    #[arg(long, default_value_t = 100_000)]
    objects: usize,
    /// ConfigMaps stored at once: each round creates this many, then deletes them.
    #[arg(long, default_value_t = 10_000)]
    round: usize,
    /// Concurrent writers.
    #[arg(long, default_value_t = 16)]
    writers: usize,
    /// The measured server's `--etcd-compaction-interval`: the figure after the churn is taken
    /// once a compaction has covered all of it (two intervals later).
    #[arg(long, default_value = "10s")]
    compaction_interval: String,
    /// Run the measured server from this executable instead of this binary: an earlier build to
    /// compare, or a wrapper that runs one under a heap profiler (it must `exec` the server, so that
    /// the RSS read is the server's).
    #[arg(long)]
    server_binary: Option<PathBuf>,
    /// A flag for the measured server, as `skiff server` takes it (repeatable).
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    server_args: Vec<String>,
}

pub async fn bench_churn(opts: ChurnBench, as_json: bool) -> anyhow::Result<()> {
    let interval = crate::parse_duration(&opts.compaction_interval).map_err(anyhow::Error::msg)?;
    let compaction_flag = format!("--etcd-compaction-interval={}", opts.compaction_interval);
    let mut flags = vec![
        "--no-agent",
        "--no-scheduler",
        "--no-controllers",
        compaction_flag.as_str(),
    ];
    flags.extend(opts.server_args.iter().map(String::as_str));
    let server = ChildServer::start_from(opts.server_binary.as_deref(), &flags).await?;
    let client = server.client().await?;
    wait_ready(&client).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = rss_mb(server.pid());
    let idle_anon = anon_rss_mb(server.pid());
    let round = opts.round.max(1);
    let mut rounds = Vec::new();
    let mut done = 0;
    let started = Instant::now();
    while done < opts.objects {
        let n = round.min(opts.objects - done);
        let names: Arc<Vec<String>> = Arc::new((done..done + n).map(|i| format!("churn-{i}")).collect());
        run_writers(&client, &names, opts.writers, Verb::Create).await?;
        let stored = rss_mb(server.pid());
        run_writers(&client, &names, opts.writers, Verb::Delete).await?;
        let deleted = rss_mb(server.pid());
        done += n;
        rounds.push(json!({"objects": done, "rss_stored_mb": round2(stored), "rss_deleted_mb": round2(deleted)}));
    }
    let churn_s = started.elapsed().as_secs_f64();
    let after_churn = rss_mb(server.pid());
    // The tick after the churn records its last revision; the one after compacts to it.
    tokio::time::sleep(interval * 2 + Duration::from_secs(2)).await;
    let compacted = rss_mb(server.pid());
    let compacted_anon = anon_rss_mb(server.pid());
    let result = json!({
        "objects": opts.objects,
        "round": round,
        "writers": opts.writers,
        "writes_per_second": ((2 * opts.objects) as f64 / churn_s).round(),
        "idle_rss_mb": round2(idle),
        "after_churn_rss_mb": round2(after_churn),
        "after_compaction_rss_mb": round2(compacted),
        "above_idle_mb": round2(compacted - idle),
        // The process's own memory (heap, stacks), without the binary's code pages that the
        // churn's code paths brought in (shared with every process running the binary).
        "idle_anon_rss_mb": round2(idle_anon),
        "after_compaction_anon_rss_mb": round2(compacted_anon),
        "anon_above_idle_mb": round2(compacted_anon - idle_anon),
        "server_binary": ChildServer::binary_label(opts.server_binary.as_deref()),
        "rounds": rounds,
    });
    print_result(&result, as_json);
    Ok(())
}

#[derive(Clone, Copy)]
enum Verb {
    Create,
    Delete,
}

/// Creates or deletes every ConfigMap of `names` from `writers` concurrent clients.
async fn run_writers(
    client: &kube::Client,
    names: &Arc<Vec<String>>,
    writers: usize,
    verb: Verb,
) -> anyhow::Result<()> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..writers.max(1) {
        let (client, names, next) = (client.clone(), names.clone(), next.clone());
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(name) = names.get(i) else {
                    return anyhow::Ok(());
                };
                let req = match verb {
                    Verb::Create => http::Request::post("/api/v1/namespaces/default/configmaps")
                        .header(http::header::CONTENT_TYPE, "application/json")
                        .body(serde_json::to_vec(&configmap(name))?)?,
                    Verb::Delete => http::Request::delete(format!("/api/v1/namespaces/default/configmaps/{name}"))
                        .body(Vec::new())?,
                };
                client
                    .request_text(req)
                    .await
                    .with_context(|| format!("writing ConfigMap {name}"))?;
            }
        });
    }
    while let Some(res) = tasks.join_next().await {
        res.context("writer task")??;
    }
    Ok(())
}

/// A ConfigMap of about 400 bytes, as small application configuration is.
fn configmap(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"app": "churn"}},
        "data": {"config.yaml": "x".repeat(256), "mode": "churn"},
    })
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}
