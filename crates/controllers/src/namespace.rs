//! The namespace controller (upstream's `pkg/controller/namespace`): when a namespace is
//! being deleted, delete everything in it, wait until it is all gone, then clear the
//! namespace's `kubernetes` finalizer so the API server removes it.

use std::collections::HashSet;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use tokio::sync::mpsc;

use crate::resources;

pub async fn run(client: kube::Client) -> anyhow::Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    let watch_tx = tx.clone();
    tokio::spawn(async move {
        let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(watcher::Event::Apply(ns)) | Ok(watcher::Event::InitApply(ns)) => {
                    if ns.metadata.deletion_timestamp.is_some()
                        && let Some(name) = ns.metadata.name
                        && watch_tx.send(name).is_err()
                    {
                        return;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "namespace watch error");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    });
    let mut in_progress: HashSet<String> = HashSet::new();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<String>();
    loop {
        tokio::select! {
            Some(name) = rx.recv() => {
                if in_progress.insert(name.clone()) {
                    let client = client.clone();
                    let done = done_tx.clone();
                    let again = tx.clone();
                    tokio::spawn(async move {
                        if let Err(e) = finalize(&client, &name).await {
                            tracing::warn!(namespace = name, error = %e, "namespace cleanup failed; retrying");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            let _ = again.send(name.clone());
                        }
                        let _ = done.send(name);
                    });
                }
            }
            Some(name) = done_rx.recv() => {
                in_progress.remove(&name);
            }
        }
    }
}

/// Delete the namespace's content, wait for it to go, then finalize the namespace.
async fn finalize(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    loop {
        let mut remaining = 0usize;
        for res in resources::stored_resources().filter(|r| r.namespaced) {
            let api = resources::api(client, res, Some(name));
            let list = api.list_metadata(&ListParams::default()).await?;
            if list.items.is_empty() {
                continue;
            }
            remaining += list.items.len();
            let dp = DeleteParams::background();
            api.delete_collection(&dp, &ListParams::default()).await?;
        }
        if remaining == 0 {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "namespace {name} still has {remaining} objects"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let api: Api<Namespace> = Api::all(client.clone());
    let Some(mut ns) = api.get_opt(name).await? else {
        return Ok(());
    };
    if let Some(spec) = ns.spec.as_mut() {
        spec.finalizers = Some(Vec::new());
    }
    match api
        .replace_subresource("finalize", name, &PostParams::default(), &ns)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
