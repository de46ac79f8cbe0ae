//! Watches the pods bound to this node (`spec.nodeName=NODE`) and runs one worker per pod. After the
//! first list, containers of pods that no longer exist are stopped and removed; containers of pods that
//! do exist are adopted by their workers (the agent never stops containers just because it restarted).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::docker;
use crate::worker::{self, Ctx};

struct Handle {
    tx: watch::Sender<Option<Pod>>,
    task: JoinHandle<()>,
}

/// Runs until the watch stream ends (it normally never does).
pub async fn run(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let api: Api<Pod> = Api::all(ctx.client.clone());
    let config = watcher::Config::default().fields(&format!("spec.nodeName={}", ctx.node));
    let mut stream = watcher(api, config).default_backoff().boxed();
    let mut workers: HashMap<String, Handle> = HashMap::new();
    let mut listed: HashSet<String> = HashSet::new();
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Init) => listed.clear(),
            Ok(watcher::Event::InitApply(pod)) => {
                if let Some(uid) = pod.metadata.uid.clone() {
                    listed.insert(uid);
                }
                upsert(&ctx, &mut workers, pod);
            }
            Ok(watcher::Event::InitDone) => {
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
            Ok(watcher::Event::Apply(pod)) => upsert(&ctx, &mut workers, pod),
            Ok(watcher::Event::Delete(pod)) => {
                if let Some(handle) = pod.metadata.uid.as_ref().and_then(|uid| workers.get(uid)) {
                    handle.tx.send_replace(None);
                }
            }
            Err(e) => tracing::warn!(error = %e, "watching pods"),
        }
        workers.retain(|_, h| !h.task.is_finished());
    }
    Ok(())
}

fn upsert(ctx: &Arc<Ctx>, workers: &mut HashMap<String, Handle>, pod: Pod) {
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
    let task = tokio::spawn(worker::run(ctx.clone(), uid.clone(), rx));
    workers.insert(uid, Handle { tx, task });
}

/// Stops (within the grace period they were created with) and removes containers of pods the API no
/// longer has.
async fn remove_orphans(ctx: &Ctx, known: &HashSet<String>) -> anyhow::Result<()> {
    let pods = docker::list_node_containers(&ctx.docker, &ctx.node).await?;
    for (uid, rt) in pods {
        if known.contains(&uid) {
            continue;
        }
        tracing::info!(%uid, "removing containers of a pod that no longer exists");
        for c in rt
            .containers
            .iter()
            .filter(|c| c.state == docker::RunState::Running)
        {
            let grace = c
                .labels
                .get(docker::LABEL_GRACE)
                .and_then(|g| g.parse().ok())
                .unwrap_or(30);
            docker::stop(&ctx.docker, &c.id, grace).await?;
        }
        worker::cleanup_pod(&ctx.docker, &ctx.node, &ctx.data_dir, &uid).await?;
    }
    Ok(())
}
