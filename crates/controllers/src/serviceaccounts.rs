//! The ServiceAccounts controller (upstream's `pkg/controller/serviceaccount`,
//! `serviceaccounts_controller.go`): every namespace that is not being deleted has a `default`
//! ServiceAccount, created with the namespace and created again when it is deleted, so pods
//! (whose `serviceAccountName` defaults to it) and `kubectl create token default` find it.

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::watcher;

use crate::controller_utils::{WorkQueue, is_already_exists, spawn_watch, spawn_watch_config};

/// The account every namespace has.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";

pub async fn run(client: kube::Client) -> anyhow::Result<()> {
    let queue = WorkQueue::new();
    // Keys are namespace names: every namespace seen, and the namespace of a deleted account.
    spawn_watch(
        Api::<Namespace>::all(client.clone()),
        queue.clone(),
        |ns: &Namespace| match (&ns.metadata.name, &ns.metadata.deletion_timestamp) {
            (Some(name), None) => vec![name.clone()],
            _ => Vec::new(),
        },
    );
    spawn_watch_config(
        Api::<ServiceAccount>::all(client.clone()),
        watcher::Config::default().fields(&format!("metadata.name={DEFAULT_SERVICE_ACCOUNT}")),
        queue.clone(),
        |sa: &ServiceAccount, deleted| match (&sa.metadata.namespace, deleted) {
            (Some(ns), true) => vec![ns.clone()],
            _ => Vec::new(),
        },
    );
    queue
        .run("serviceaccounts", |ns| {
            let client = client.clone();
            async move { sync(&client, &ns).await.map(|()| None) }
        })
        .await
}

/// Creates the namespace's `default` account when the namespace is active and has none.
async fn sync(client: &kube::Client, namespace: &str) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    match namespaces.get_opt(namespace).await? {
        Some(ns) if ns.metadata.deletion_timestamp.is_none() => {}
        // Gone, or being deleted: the namespace controller is emptying it.
        _ => return Ok(()),
    }
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    if api.get_opt(DEFAULT_SERVICE_ACCOUNT).await?.is_some() {
        return Ok(());
    }
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(DEFAULT_SERVICE_ACCOUNT.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    match api.create(&PostParams::default(), &sa).await {
        Ok(_) => {
            tracing::debug!(namespace, "created the default service account");
            Ok(())
        }
        Err(e) if is_already_exists(&e) => Ok(()),
        // The namespace began terminating meanwhile: nothing new may be created in it.
        Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("is being terminated") => Ok(()),
        Err(e) => Err(e.into()),
    }
}
