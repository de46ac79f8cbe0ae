//! The PV protection controller (upstream's `pkg/controller/volume/pvprotection`): a
//! PersistentVolume being deleted keeps its `kubernetes.io/pv-protection` finalizer while it is
//! Bound to a claim, and loses it once the binder has moved it out of Bound (the claim is gone:
//! Released, or Available, Failed). Volumes that lack the finalizer and are not being deleted
//! (created before the admission plugin added it) get it.

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::controller_utils::{self as cu, WorkQueue};
use crate::protectionutil;

/// The finalizer this controller owns (upstream's `PVProtectionFinalizer`).
pub const FINALIZER: &str = "kubernetes.io/pv-protection";

struct Ctx {
    client: kube::Client,
    volumes: Store<PersistentVolume>,
}

pub async fn run(client: kube::Client) -> anyhow::Result<()> {
    let queue = WorkQueue::new();
    let volumes = cu::spawn_store_watch(
        Api::<PersistentVolume>::all(client.clone()),
        queue.clone(),
        |pv: &PersistentVolume| {
            let meta = &pv.metadata;
            let concerned = protectionutil::need_to_add_finalizer(meta, FINALIZER)
                || protectionutil::is_deletion_candidate(meta, FINALIZER);
            match &meta.name {
                Some(name) if concerned => vec![name.clone()],
                _ => Vec::new(),
            }
        },
    );
    let ctx = Ctx { client, volumes };
    queue.run("pvprotection", |name| process_pv(&ctx, name)).await
}

/// Upstream's `isBeingUsed`: the binder keeps the phase; Bound means a claim holds the volume.
pub fn is_being_used(pv: &PersistentVolume) -> bool {
    pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
}

/// Upstream's `processPV`, on the cached volume.
async fn process_pv(ctx: &Ctx, name: String) -> anyhow::Result<Option<Duration>> {
    let Some(pv) = ctx.volumes.get(&ObjectRef::new(&name)) else {
        tracing::debug!(volume = %name, "PV not found, ignoring");
        return Ok(None);
    };
    if protectionutil::is_deletion_candidate(&pv.metadata, FINALIZER) {
        if !is_being_used(&pv) {
            let mut updated = (*pv).clone();
            updated.metadata.finalizers = protectionutil::without(pv.metadata.finalizers.as_ref(), FINALIZER);
            api(ctx).replace(&name, &PostParams::default(), &updated).await?;
            tracing::info!(volume = %name, "removed protection finalizer from PV");
            return Ok(None);
        }
        tracing::debug!(volume = %name, "keeping PV because it is being used");
    }
    if protectionutil::need_to_add_finalizer(&pv.metadata, FINALIZER) {
        let mut updated = (*pv).clone();
        updated
            .metadata
            .finalizers
            .get_or_insert_with(Vec::new)
            .push(FINALIZER.to_string());
        api(ctx).replace(&name, &PostParams::default(), &updated).await?;
        tracing::debug!(volume = %name, "added protection finalizer to PV");
    }
    Ok(None)
}

fn api(ctx: &Ctx) -> Api<PersistentVolume> {
    Api::all(ctx.client.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PersistentVolumeStatus;

    #[test]
    fn only_bound_volumes_are_in_use() {
        let mut pv = PersistentVolume::default();
        assert!(!is_being_used(&pv));
        for (phase, used) in [
            ("Pending", false),
            ("Available", false),
            ("Bound", true),
            ("Released", false),
            ("Failed", false),
        ] {
            pv.status = Some(PersistentVolumeStatus {
                phase: Some(phase.into()),
                ..Default::default()
            });
            assert_eq!(is_being_used(&pv), used, "{phase}");
        }
    }
}
