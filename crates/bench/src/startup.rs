//! `skiff bench startup`: pod startup latency, from the create call to the pod's Ready condition as seen
//! through a watch (upstream's pod startup SLO, image already present).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};

/// What to measure.
#[derive(Clone, Debug)]
pub struct StartupBench {
    pub pods: usize,
    pub namespace: String,
    /// Bind the pods straight to this node (skipping the scheduler); `None` lets the scheduler place them.
    pub node_name: Option<String>,
    /// The pods' `nodeSelector`: the scheduler places them only on nodes with these labels.
    pub node_selector: BTreeMap<String, String>,
    pub image: String,
    /// Give up after this long.
    pub timeout: Duration,
}

impl Default for StartupBench {
    fn default() -> Self {
        Self {
            pods: 30,
            namespace: "default".into(),
            node_name: None,
            node_selector: BTreeMap::new(),
            image: skiff_agent::images::BUSYBOX_IMAGE.into(),
            timeout: Duration::from_secs(300),
        }
    }
}

/// Latencies in milliseconds.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StartupReport {
    pub pods: usize,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// From the first create to the last pod Ready.
    pub total_ms: f64,
}

/// The value at a percentile of sorted samples (nearest rank).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Creates the pods, waits until each is Ready, reports the latencies and deletes the pods.
pub async fn bench_startup(client: kube::Client, opts: StartupBench) -> anyhow::Result<StartupReport> {
    Ok(bench_startup_with(client, opts, || ()).await?.0)
}

/// As [`bench_startup`], and calls `at_ready` once every pod is Ready, before the pods are deleted
/// (to take measurements of the node while it runs them).
pub async fn bench_startup_with<T>(
    client: kube::Client,
    opts: StartupBench,
    at_ready: impl FnOnce() -> T,
) -> anyhow::Result<(StartupReport, T)> {
    let api: Api<Pod> = Api::namespaced(client, &opts.namespace);
    let run = format!("{:x}", jiff::Timestamp::now().as_millisecond());
    let selector = format!("skiff-bench=startup-{run}");
    let mut stream = watcher(api.clone(), watcher::Config::default().labels(&selector))
        .applied_objects()
        .boxed();
    // The watch must be established before the first create.
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::unbounded_channel::<(String, Instant)>();
    let watch_task = tokio::spawn(async move {
        while let Some(item) = stream.next().await {
            if let Ok(pod) = item
                && is_ready(&pod)
                && ready_tx
                    .send((pod.metadata.name.clone().unwrap_or_default(), Instant::now()))
                    .is_err()
            {
                break;
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;

    let started = Instant::now();
    let mut created: HashMap<String, Instant> = HashMap::new();
    let result = async {
        for i in 0..opts.pods {
            let name = format!("startup-{run}-{i}");
            let pod: Pod = serde_json::from_value(serde_json::json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "labels": {"skiff-bench": format!("startup-{run}")}},
                "spec": {
                    "nodeName": opts.node_name,
                    "nodeSelector": opts.node_selector,
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{
                        "name": "c", "image": opts.image, "imagePullPolicy": "IfNotPresent",
                        "command": ["sleep", "3600"]
                    }]
                }
            }))?;
            let at = Instant::now();
            api.create(&PostParams::default(), &pod)
                .await
                .with_context(|| format!("creating pod {name}"))?;
            created.insert(name, at);
        }
        let mut latencies = Vec::with_capacity(opts.pods);
        let mut done: HashMap<String, ()> = HashMap::new();
        let deadline = tokio::time::Instant::now() + opts.timeout;
        while done.len() < opts.pods {
            let next = tokio::time::timeout_at(deadline, ready_rx.recv())
                .await
                .map_err(|_| anyhow::anyhow!("{} of {} pods Ready before the timeout", done.len(), opts.pods))?;
            let Some((name, at)) = next else {
                anyhow::bail!("the pod watch ended")
            };
            if let Some(created_at) = created.get(&name)
                && done.insert(name, ()).is_none()
            {
                latencies.push(at.duration_since(*created_at).as_secs_f64() * 1000.0);
            }
        }
        let total_ms = started.elapsed().as_secs_f64() * 1000.0;
        let measured = at_ready();
        latencies.sort_by(f64::total_cmp);
        let report = StartupReport {
            pods: opts.pods,
            p50_ms: percentile(&latencies, 50.0),
            p90_ms: percentile(&latencies, 90.0),
            p99_ms: percentile(&latencies, 99.0),
            max_ms: latencies.last().copied().unwrap_or(0.0),
            total_ms,
        };
        Ok((report, measured))
    }
    .await;
    watch_task.abort();
    for name in created.keys() {
        if let Err(e) = api.delete(name, &DeleteParams::default().grace_period(0)).await {
            tracing::warn!(pod = %name, error = %e, "deleting a benchmark pod");
        }
    }
    result
}

/// The physical limit: the same work done directly through the Docker Engine API, with no
/// Skiff in between. Per pod a pause container and an app container in its network and IPC
/// namespaces, all pods started at once; latency is from the first call to the app container
/// running. Every container is removed afterwards.
pub async fn bench_docker_direct(docker: &bollard::Docker, pods: usize, image: &str) -> anyhow::Result<StartupReport> {
    use bollard::models::{ContainerCreateBody, HostConfig};
    use bollard::query_parameters::{CreateContainerOptionsBuilder, RemoveContainerOptionsBuilder};
    let run = format!("{:x}", jiff::Timestamp::now().as_millisecond());
    let started = Instant::now();
    let one = |i: usize| {
        let docker = docker.clone();
        let image = image.to_string();
        let run = run.clone();
        async move {
            let t = Instant::now();
            let sandbox = format!("skiff-bench-{run}-{i}-pause");
            let app = format!("skiff-bench-{run}-{i}-app");
            let labels = std::collections::HashMap::from([("skiff.bench".to_string(), run.clone())]);
            docker
                .create_container(
                    Some(CreateContainerOptionsBuilder::default().name(&sandbox).build()),
                    ContainerCreateBody {
                        image: Some(skiff_agent::images::PAUSE_IMAGE.to_string()),
                        labels: Some(labels.clone()),
                        host_config: Some(HostConfig {
                            ipc_mode: Some("shareable".into()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                )
                .await
                .context("creating the pause container")?;
            docker
                .start_container(&sandbox, None::<bollard::query_parameters::StartContainerOptions>)
                .await
                .context("starting the pause container")?;
            docker
                .create_container(
                    Some(CreateContainerOptionsBuilder::default().name(&app).build()),
                    ContainerCreateBody {
                        image: Some(image),
                        cmd: Some(vec!["sleep".into(), "3600".into()]),
                        labels: Some(labels),
                        host_config: Some(HostConfig {
                            network_mode: Some(format!("container:{sandbox}")),
                            ipc_mode: Some(format!("container:{sandbox}")),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                )
                .await
                .context("creating the app container")?;
            docker
                .start_container(&app, None::<bollard::query_parameters::StartContainerOptions>)
                .await
                .context("starting the app container")?;
            anyhow::Ok((t.elapsed().as_secs_f64() * 1000.0, [sandbox, app]))
        }
    };
    let results = futures::future::join_all((0..pods).map(one)).await;
    let total_ms = started.elapsed().as_secs_f64() * 1000.0;
    let mut latencies = Vec::new();
    let mut first_error = None;
    for r in &results {
        match r {
            Ok((ms, _)) => latencies.push(*ms),
            Err(e) if first_error.is_none() => first_error = Some(format!("{e:#}")),
            Err(_) => {}
        }
    }
    // Remove everything this run created, whatever happened.
    let filters = std::collections::HashMap::from([("label".to_string(), vec![format!("skiff.bench={run}")])]);
    let listed = docker
        .list_containers(Some(
            bollard::query_parameters::ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
        .unwrap_or_default();
    for c in listed {
        if let Some(id) = c.id {
            let opts = RemoveContainerOptionsBuilder::default().force(true).build();
            if let Err(e) = docker.remove_container(&id, Some(opts)).await {
                tracing::warn!(container = %id, error = %e, "removing a benchmark container");
            }
        }
    }
    if let Some(e) = first_error {
        anyhow::bail!("direct Docker run failed: {e}");
    }
    latencies.sort_by(f64::total_cmp);
    Ok(StartupReport {
        pods,
        p50_ms: percentile(&latencies, 50.0),
        p90_ms: percentile(&latencies, 90.0),
        p99_ms: percentile(&latencies, 99.0),
        max_ms: latencies.last().copied().unwrap_or(0.0),
        total_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }
}
