//! The token cleaner (upstream's `pkg/controller/bootstrap/tokencleaner.go`): a bootstrap token
//! Secret in `kube-system` is deleted once its `expiration` has passed (on the deleted uid
//! only, so a Secret created again under the name stays), and looked at again when it expires.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{DeleteParams, Preconditions};
use kube::runtime::reflector::{ObjectRef, Store};
use skiff_api::bootstraptoken as bt;

use crate::controller_utils::{self as cu, WorkQueue};

struct Ctx {
    client: kube::Client,
    secrets: Store<Secret>,
}

pub async fn run(client: kube::Client) -> anyhow::Result<()> {
    let queue = WorkQueue::new();
    let secrets = cu::spawn_store_watch(
        Api::<Secret>::namespaced(client.clone(), bt::NAMESPACE),
        queue.clone(),
        |s: &Secret| match (&s.metadata.name, s.type_.as_deref()) {
            (Some(name), Some(bt::SECRET_TYPE)) => vec![name.clone()],
            _ => Vec::new(),
        },
    );
    let ctx = Ctx { client, secrets };
    queue.run("tokencleaner", |name| eval_secret(&ctx, name)).await
}

/// upstream's `evalSecret`.
async fn eval_secret(ctx: &Ctx, name: String) -> anyhow::Result<Option<Duration>> {
    let Some(secret) = ctx.secrets.get(&ObjectRef::new(&name).within(bt::NAMESPACE)) else {
        return Ok(None);
    };
    let json = serde_json::to_value(&*secret)?;
    let now = jiff::Timestamp::now();
    if bt::has_expired(&json, now) {
        tracing::info!(secret = %format!("{}/{name}", bt::NAMESPACE), "deleting expired bootstrap token Secret");
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: secret.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        let api = Api::<Secret>::namespaced(ctx.client.clone(), bt::NAMESPACE);
        match api.delete(&name, &dp).await {
            Ok(_) => {}
            Err(e) if cu::is_not_found(&e) || cu::is_conflict(&e) => {}
            Err(e) => return Err(e.into()),
        }
        return Ok(None);
    }
    Ok(bt::expiration(&json)
        .and_then(|t| Duration::try_from(now.duration_until(t)).ok())
        .map(|d| d + Duration::from_millis(100)))
}
