//! Watches the pods bound to this node (`spec.nodeName=NODE`) and runs one worker per pod. After the
//! first list, containers of pods that no longer exist are stopped and removed; containers of pods that
//! do exist are adopted by their workers (the agent never stops containers just because it restarted).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;

use crate::cleanup::{self, Grace};
use crate::docker;
use crate::worker::{self, Ctx};

struct Handle {
    tx: watch::Sender<Option<Pod>>,
    wake: Arc<Notify>,
    task: JoinHandle<()>,
}

/// Runs until the watch stream ends (it normally never does).
pub async fn run(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let api: Api<Pod> = Api::all(ctx.client.clone());
    let config = watcher::Config::default().fields(&format!("spec.nodeName={}", ctx.node));
    let mut stream = watcher(api, config).default_backoff().boxed();
    let mut workers: HashMap<String, Handle> = HashMap::new();
    let mut listed: HashSet<String> = HashSet::new();
    // Until the first list is complete.
    let mut initial = true;
    tokio::spawn(report_unowned(ctx.clone()));
    let (exits_tx, mut exits) = mpsc::channel::<String>(1024);
    let events = tokio::spawn(container_events(ctx.clone(), exits_tx));
    let image_events = tokio::spawn(docker::invalidate_images_on_events(
        ctx.docker.clone(),
        ctx.images.clone(),
    ));
    loop {
        let event = tokio::select! {
            event = stream.next() => match event {
                Some(event) => event,
                None => break,
            },
            Some(uid) = exits.recv() => {
                if let Some(handle) = workers.get(&uid) {
                    handle.wake.notify_one();
                }
                continue;
            }
        };
        match event {
            Ok(watcher::Event::Init) => {
                listed.clear();
                initial = true;
            }
            Ok(watcher::Event::InitApply(pod)) => {
                if let Some(uid) = pod.metadata.uid.clone() {
                    listed.insert(uid);
                }
                upsert(&ctx, &mut workers, pod, false);
            }
            Ok(watcher::Event::InitDone) => {
                initial = false;
                for (uid, handle) in &workers {
                    if !listed.contains(uid) {
                        handle.tx.send_replace(None);
                    }
                }
                let known: HashSet<String> = listed.clone();
                let ctx = ctx.clone();
                tokio::spawn(async move {
                    if let Err(e) = remove_orphans(&ctx, &known).await {
                        tracing::warn!(error = %format!("{e:#}"), "removing containers of deleted pods");
                    }
                });
            }
            // A pod first seen after the initial list was bound to this node after the agent
            // started: no earlier run of the agent can have made containers for it.
            Ok(watcher::Event::Apply(pod)) => upsert(&ctx, &mut workers, pod, !initial),
            Ok(watcher::Event::Delete(pod)) => {
                if let Some(handle) = pod.metadata.uid.as_ref().and_then(|uid| workers.get(uid)) {
                    handle.tx.send_replace(None);
                }
            }
            Err(e) => tracing::warn!(error = %e, "watching pods"),
        }
        workers.retain(|_, h| !h.task.is_finished());
    }
    events.abort();
    image_events.abort();
    Ok(())
}

/// Forwards the pod UID of every container of this node that dies or is removed, so its worker
/// syncs at once instead of at its next resync. Starts are left out: the agent starts containers
/// itself and reports them in the same pass, so a start event would only cost a second pass over
/// the engine while it is busiest. Reconnects when the engine's stream ends.
pub async fn container_events(ctx: Arc<Ctx>, tx: mpsc::Sender<String>) {
    let filters = HashMap::from([
        ("type".to_string(), vec!["container".to_string()]),
        ("label".to_string(), ctx.owner().label_filter([])),
        (
            "event".to_string(),
            vec!["die".to_string(), "oom".to_string(), "destroy".to_string()],
        ),
    ]);
    loop {
        let options = bollard::query_parameters::EventsOptionsBuilder::default()
            .filters(&filters)
            .build();
        let mut stream = ctx.docker.events(Some(options));
        while let Some(item) = stream.next().await {
            let Ok(message) = item else { break };
            let uid = message
                .actor
                .and_then(|a| a.attributes)
                .and_then(|mut attrs| attrs.remove(docker::LABEL_POD_UID));
            if let Some(uid) = uid
                && tx.send(uid).await.is_err()
            {
                return;
            }
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

fn upsert(ctx: &Arc<Ctx>, workers: &mut HashMap<String, Handle>, pod: Pod, fresh: bool) {
    let Some(uid) = pod.metadata.uid.clone() else {
        return;
    };
    if let Some(handle) = workers.get(&uid)
        && !handle.task.is_finished()
    {
        handle.tx.send_replace(Some(pod));
        return;
    }
    let (tx, rx) = watch::channel(Some(pod));
    let wake = Arc::new(Notify::new());
    let task = tokio::spawn(worker::run_with_wake(ctx.clone(), uid.clone(), rx, wake.clone(), fresh));
    workers.insert(uid, Handle { tx, wake, task });
}

/// Says once that containers of this node's name without a cluster label (made by an agent that did
/// not label them) are never removed as orphans: they may be another cluster's. Those of this
/// cluster's pods are still found by their pod's uid and kept running as the pod's own.
async fn report_unowned(ctx: Arc<Ctx>) {
    match docker::unowned_node_containers(&ctx.docker, &ctx.node).await {
        Ok(ids) if !ids.is_empty() => tracing::info!(
            count = ids.len(),
            label = docker::LABEL_CLUSTER,
            "containers of this node without a cluster label are never removed as orphans; this cluster's pods keep theirs, remove the others by hand if no cluster runs them"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %format!("{e:#}"), "listing containers without a cluster label"),
    }
}

/// Stops (within the grace period they were created with) and removes containers of pods the API no
/// longer has. Only this node's containers of this cluster are candidates: a node of another cluster
/// on the same engine may carry the same name.
async fn remove_orphans(ctx: &Ctx, known: &HashSet<String>) -> anyhow::Result<()> {
    let pods = docker::list_node_containers(&ctx.docker, ctx.owner()).await?;
    for uid in pods.into_keys() {
        if known.contains(&uid) {
            continue;
        }
        tracing::info!(%uid, "removing containers of a pod that no longer exists");
        cleanup::remove_pod(&ctx.docker, ctx.owner(), &ctx.data_dir, &uid, Grace::Labelled).await?;
    }
    Ok(())
}
