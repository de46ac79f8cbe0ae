//! The ServiceAccounts controller (upstream's `pkg/controller/serviceaccount`,
//! `serviceaccounts_controller.go`): every namespace that is not being deleted has a `default`
//! ServiceAccount, created with the namespace and created again when it is deleted, so pods
//! (whose `serviceAccountName` defaults to it) and `kubectl create token default` find it.

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;

use crate::controller_utils::{is_already_exists, is_namespace_terminating, run_per_namespace};

/// The account every namespace has.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";

pub async fn run(client: kube::Client) -> anyhow::Result<()> {
    let c = client.clone();
    run_per_namespace::<ServiceAccount, _, _>(client, "serviceaccounts", DEFAULT_SERVICE_ACCOUNT, false, move |ns| {
        sync(c.clone(), ns)
    })
    .await
}

/// Creates the namespace's `default` account when it has none.
async fn sync(client: kube::Client, namespace: String) -> anyhow::Result<()> {
    let api: Api<ServiceAccount> = Api::namespaced(client, &namespace);
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
        // Created meanwhile, or the namespace began terminating.
        Err(e) if is_already_exists(&e) || is_namespace_terminating(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
