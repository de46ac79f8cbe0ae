//! `skiff bench density`: upstream's density test on simulated nodes. A `skiff server` child runs
//! the API server, the scheduler, every controller and `--sim-nodes N` simulated nodes in one
//! process; once the nodes are Ready, Deployments of `--replicas-per-deployment` replicas are
//! created until they ask for `--pods` pods, and a watch of the pods counts them Running.
//! Reported: time to every pod Running and pods Running per second, the server's peak resident
//! memory, and the CPU each process (the server, this driver) used.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::{StreamExt, TryStreamExt};
use kube::api::WatchEvent;
use serde::Deserialize;
use serde_json::json;

use crate::bench::{ChildServer, cpu_seconds, peak_rss_mb, print_result, round2, rss_mb, wait_ready};

#[derive(clap::Args)]
pub struct DensityBench {
    /// Simulated nodes.
    #[arg(long, default_value_t = 5000)]
    nodes: usize,
    /// Pods in all (Deployments of `--replicas-per-deployment`, the last one smaller).
    #[arg(long, default_value_t = 150_000)]
    pods: usize,
    #[arg(long, default_value_t = 1000)]
    replicas_per_deployment: usize,
    /// Give up (and report what was reached) after this long from the first Deployment.
    #[arg(long, default_value = "600s")]
    timeout: String,
    /// Run the measured server from this skiff binary (an earlier build, to compare) instead of
    /// this one.
    #[arg(long)]
    server_binary: Option<PathBuf>,
    /// A flag for the measured server, as `skiff server` takes it (repeatable).
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    server_args: Vec<String>,
}

/// What the driver decodes of a pod: its name and phase (the rest is skipped unread).
#[derive(Deserialize, Clone)]
struct PodLite {
    metadata: MetaLite,
    #[serde(default)]
    status: Option<StatusLite>,
}

#[derive(Deserialize, Clone)]
struct MetaLite {
    #[serde(default)]
    name: Option<String>,
    #[serde(default, rename = "resourceVersion")]
    resource_version: Option<String>,
}

#[derive(Deserialize, Clone)]
struct StatusLite {
    #[serde(default)]
    phase: Option<String>,
    #[serde(default)]
    conditions: Option<Vec<ConditionLite>>,
}

#[derive(Deserialize, Clone)]
struct ConditionLite {
    #[serde(rename = "type")]
    type_: String,
    status: String,
}

#[derive(Deserialize)]
struct ListLite<T> {
    metadata: ListMeta,
    items: Vec<T>,
}

#[derive(Deserialize)]
struct ListMeta {
    #[serde(default, rename = "resourceVersion")]
    resource_version: Option<String>,
}

#[derive(Deserialize)]
struct NodeLite {
    #[serde(default)]
    status: Option<StatusLite>,
}

const NAMESPACE: &str = "default";

async fn ready_nodes(client: &kube::Client) -> anyhow::Result<usize> {
    let req = http::Request::get("/api/v1/nodes").body(Vec::new())?;
    let text = client.request_text(req).await.context("listing nodes")?;
    let list: ListLite<NodeLite> = serde_json::from_str(&text).context("decoding the node list")?;
    Ok(list
        .items
        .iter()
        .filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .count())
}

/// Counts the namespace's pods Running, from one watch (resumed where it ended if the server
/// closes it), into `tx`: the count and when it last changed.
async fn count_running(
    client: kube::Client,
    mut resource_version: String,
    tx: tokio::sync::watch::Sender<usize>,
) -> anyhow::Result<()> {
    let mut running: HashSet<String> = HashSet::new();
    loop {
        let uri = format!(
            "/api/v1/namespaces/{NAMESPACE}/pods?watch=true&allowWatchBookmarks=true&timeoutSeconds=3600&resourceVersion={resource_version}"
        );
        let req = http::Request::get(uri).body(Vec::new())?;
        let mut stream = client
            .request_events::<PodLite>(req)
            .await
            .context("watching pods")?
            .boxed();
        while let Some(ev) = stream.try_next().await.context("reading the pod watch")? {
            let (pod, deleted) = match ev {
                WatchEvent::Added(p) | WatchEvent::Modified(p) => (p, false),
                WatchEvent::Deleted(p) => (p, true),
                WatchEvent::Bookmark(b) => {
                    resource_version = b.metadata.resource_version;
                    continue;
                }
                WatchEvent::Error(e) => anyhow::bail!("the pod watch failed: {}", e.message),
            };
            if let Some(rv) = pod.metadata.resource_version {
                resource_version = rv;
            }
            let Some(name) = pod.metadata.name else { continue };
            let is_running = !deleted && pod.status.and_then(|s| s.phase).as_deref() == Some("Running");
            let changed = if is_running {
                running.insert(name)
            } else {
                running.remove(&name)
            };
            if changed {
                tx.send_replace(running.len());
            }
        }
    }
}

fn deployment(name: &str, replicas: usize) -> serde_json::Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [{
                        "name": "app",
                        "image": "busybox:latest",
                        "command": ["sleep", "3600"],
                        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                    }],
                },
            },
        },
    })
}

pub async fn bench_density(opts: DensityBench, as_json: bool) -> anyhow::Result<()> {
    let timeout = crate::parse_duration(&opts.timeout).map_err(anyhow::Error::msg)?;
    let nodes_flag = opts.nodes.to_string();
    let mut flags = vec!["--no-agent", "--sim-nodes", nodes_flag.as_str()];
    flags.extend(opts.server_args.iter().map(String::as_str));
    let server = ChildServer::start_from(opts.server_binary.as_deref(), &flags).await?;
    let pid = server.pid();
    let client = crate::client::kube_client_h2(&server.kubeconfig).await?;
    wait_ready(&client).await?;
    let started = Instant::now();

    // Every simulated node Ready.
    loop {
        if ready_nodes(&client).await? >= opts.nodes {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < timeout,
            "the simulated nodes were not Ready in time"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let nodes_ready_s = started.elapsed().as_secs_f64();
    // The default ServiceAccount the pods name (the controllers make it).
    let sa: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> = kube::Api::namespaced(client.clone(), NAMESPACE);
    while sa.get_opt("default").await?.is_none() {
        anyhow::ensure!(started.elapsed() < timeout, "no default ServiceAccount");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let idle_rss = rss_mb(pid);

    let req = http::Request::get(format!("/api/v1/namespaces/{NAMESPACE}/pods")).body(Vec::new())?;
    let list: ListLite<PodLite> = serde_json::from_str(&client.request_text(req).await.context("listing pods")?)
        .context("decoding the pod list")?;
    anyhow::ensure!(list.items.is_empty(), "the namespace already has pods");
    let (tx, mut rx) = tokio::sync::watch::channel(0usize);
    let watcher = tokio::spawn(count_running(
        client.clone(),
        list.metadata.resource_version.unwrap_or_default(),
        tx,
    ));

    let server_cpu_0 = cpu_seconds(pid);
    let self_cpu_0 = cpu_seconds(std::process::id());
    let t0 = Instant::now();
    let per = opts.replicas_per_deployment.max(1);
    let deployments: kube::Api<k8s_openapi::api::apps::v1::Deployment> =
        kube::Api::namespaced(client.clone(), NAMESPACE);
    let mut left = opts.pods;
    let mut count = 0;
    while left > 0 {
        let n = per.min(left);
        let d = serde_json::from_value(deployment(&format!("density-{count}"), n))?;
        deployments
            .create(&Default::default(), &d)
            .await
            .with_context(|| format!("creating Deployment density-{count}"))?;
        left -= n;
        count += 1;
    }
    let created_s = t0.elapsed().as_secs_f64();

    // Milestones: when 10%, 50%, 90%, 99% and all of the pods were Running.
    let marks = [0.1, 0.5, 0.9, 0.99, 1.0];
    let mut reached: Vec<Option<f64>> = vec![None; marks.len()];
    let mut peak_rate = 0.0f64;
    let mut last = (0usize, Instant::now());
    let deadline = t0 + timeout;
    let complete = loop {
        let running = *rx.borrow_and_update();
        for (i, m) in marks.iter().enumerate() {
            if reached[i].is_none() && running as f64 >= (opts.pods as f64 * m).ceil() {
                reached[i] = Some(t0.elapsed().as_secs_f64());
            }
        }
        let since = last.1.elapsed().as_secs_f64();
        if since >= 1.0 {
            peak_rate = peak_rate.max((running - last.0.min(running)) as f64 / since);
            last = (running, Instant::now());
        }
        if running >= opts.pods {
            break true;
        }
        if Instant::now() >= deadline || watcher.is_finished() {
            break false;
        }
        let _ = tokio::time::timeout(Duration::from_millis(250), rx.changed()).await;
    };
    let elapsed = t0.elapsed().as_secs_f64();
    let running = *rx.borrow();
    let server_cpu = cpu_seconds(pid) - server_cpu_0;
    let self_cpu = cpu_seconds(std::process::id()) - self_cpu_0;
    let peak = peak_rss_mb(pid);
    let end_rss = rss_mb(pid);
    watcher.abort();
    let mark = |i: usize| reached[i].map(round2);
    let result = json!({
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
        "server_binary": ChildServer::binary_label(opts.server_binary.as_deref()),
        "nodes": opts.nodes,
        "pods": opts.pods,
        "deployments": count,
        "replicas_per_deployment": per,
        "complete": complete,
        "pods_running": running,
        "nodes_ready_s": round2(nodes_ready_s),
        "deployments_created_s": round2(created_s),
        "running_10pct_s": mark(0),
        "running_50pct_s": mark(1),
        "running_90pct_s": mark(2),
        "running_99pct_s": mark(3),
        "all_running_s": mark(4),
        "elapsed_s": round2(elapsed),
        "pods_running_per_s": (running as f64 / if complete { reached[4].unwrap_or(elapsed) } else { elapsed }).round(),
        "peak_pods_running_per_s": peak_rate.round(),
        "server_rss_mb_idle_with_nodes": round2(idle_rss),
        "server_rss_mb_end": round2(end_rss),
        "server_peak_rss_mb": round2(peak),
        "server_cpu_s": round2(server_cpu),
        "server_cpu_cores": round2(server_cpu / elapsed.max(1e-9)),
        "driver_cpu_s": round2(self_cpu),
    });
    print_result(&result, as_json);
    drop(server);
    anyhow::ensure!(complete, "{running} of {} pods Running after {elapsed:.1} s", opts.pods);
    Ok(())
}
