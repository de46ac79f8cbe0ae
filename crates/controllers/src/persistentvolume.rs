//! The PersistentVolume binder controller (upstream's `pkg/controller/volume/persistentvolume`:
//! `pv_controller.go`, and `index.go` for the matching): binds every Pending claim to the smallest
//! Available volume that satisfies it, honours volumes pre-bound through `spec.claimRef` and
//! claims naming a volume in `spec.volumeName`, keeps both sides' phases, and releases a volume
//! whose claim is gone. Claims of a class whose `volumeBindingMode` is WaitForFirstConsumer are
//! left to the scheduler. Nothing is provisioned here: a claim of a class without a matching
//! volume waits for one to be created.
//!
//! As upstream, binding is a sequence of writes (volume spec, volume status, claim spec, claim
//! status), each guarded by the object's resourceVersion; any step may fail and the next sync
//! picks up where the objects are. Claims are synced one at a time so two claims never race for
//! one volume.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimStatus, PersistentVolumeStatus, Pod,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{ListParams, PostParams};
use kube::runtime::reflector::Store;

use crate::controller_utils::{self as cu, Recorder, WorkQueue};

pub const COMPONENT: &str = "persistentvolume-controller";

pub use skiff_api::volume::{
    ANN_BETA_STORAGE_CLASS, ANN_BETA_STORAGE_PROVISIONER, ANN_BIND_COMPLETED, ANN_BOUND_BY_CONTROLLER,
    ANN_DYNAMICALLY_PROVISIONED, ANN_SELECTED_NODE, ANN_STORAGE_PROVISIONER, check_access_modes, claim_class,
    claim_has_class, default_class, is_volume_bound_to_claim, volume_bound_to_claim, volume_class,
    volume_mode_mismatch,
};
use skiff_api::volume::{
    CLAIM_BOUND, CLAIM_LOST, CLAIM_PENDING, VOLUME_AVAILABLE, VOLUME_BOUND, VOLUME_FAILED, VOLUME_RELEASED, annotation,
    claim_access_modes, claim_key, claim_phase, claim_volume_name, reclaim_policy, requested_storage, storage,
    volume_access_modes, volume_phase, volume_storage,
};

/// How often claims that are not bound are looked at again (upstream's `--pvclaimbinder-sync-period`).
const RESYNC: Duration = Duration::from_secs(15);

struct Ctx {
    client: kube::Client,
    recorder: Recorder,
    claims: Store<PersistentVolumeClaim>,
    claim_queue: WorkQueue,
    /// Claim syncs run one at a time (upstream runs one claim worker): two claims synced at
    /// once could both pick the same volume.
    claim_sync: tokio::sync::Mutex<()>,
}

pub async fn run(client: kube::Client) -> anyhow::Result<()> {
    let claim_queue = WorkQueue::new();
    let volume_queue = WorkQueue::new();
    let cq = claim_queue.clone();
    let volumes = cu::spawn_store_watch(
        Api::<PersistentVolume>::all(client.clone()),
        volume_queue.clone(),
        move |pv: &PersistentVolume| {
            // A deleted or changed volume concerns the claim it points at.
            if let Some(key) = claim_ref_key(pv) {
                cq.add(key);
            }
            pv.metadata.name.clone().into_iter().collect()
        },
    );
    let vq = volume_queue.clone();
    let claims = cu::spawn_store_watch(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        claim_queue.clone(),
        move |claim: &PersistentVolumeClaim| {
            // The volumes a claim names or that point at it: a deleted claim releases them.
            let key = claim_key(claim);
            if let Some(v) = claim_volume_name(claim) {
                vq.add(v.to_string());
            }
            for pv in volumes.state() {
                if claim_ref_key(&pv).as_deref() == Some(key.as_str())
                    && let Some(name) = &pv.metadata.name
                {
                    vq.add(name.clone());
                }
            }
            vec![key]
        },
    );
    let ctx = Ctx {
        recorder: Recorder::for_component(client.clone(), COMPONENT),
        client,
        claims,
        claim_queue: claim_queue.clone(),
        claim_sync: tokio::sync::Mutex::new(()),
    };
    tokio::try_join!(
        claim_queue.run("persistentvolume-claim", |key| sync_claim(&ctx, key)),
        volume_queue.run("persistentvolume-volume", |key| sync_volume(&ctx, key)),
    )
    .map(|_| ())
}

// ---- helpers on the objects (upstream's storage helpers) ----

fn has_annotation(meta: &ObjectMeta, key: &str) -> bool {
    annotation(meta, key).is_some()
}

fn set_annotation(meta: &mut ObjectMeta, key: &str, value: &str) {
    meta.annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(key.to_string(), value.to_string());
}

fn claim_ref_key(pv: &PersistentVolume) -> Option<String> {
    let r = pv.spec.as_ref()?.claim_ref.as_ref()?;
    Some(cu::key(r.namespace.as_deref().unwrap_or_default(), r.name.as_deref()?))
}

fn volume_name(pv: &PersistentVolume) -> &str {
    pv.metadata.name.as_deref().unwrap_or_default()
}

/// Upstream's `checkVolumeSatisfyClaim`, for a claim that names its volume.
pub fn check_volume_satisfy_claim(pv: &PersistentVolume, claim: &PersistentVolumeClaim) -> Result<(), String> {
    if pv.metadata.deletion_timestamp.is_some() {
        return Err(format!("the volume is marked for deletion {:?}", volume_name(pv)));
    }
    if volume_storage(pv).value() < requested_storage(claim).value() {
        return Err("requested PV is too small".into());
    }
    if volume_class(pv) != claim_class(claim) {
        return Err("storageClassName does not match".into());
    }
    if volume_mode_mismatch(claim, pv) {
        return Err("incompatible volumeMode".into());
    }
    if !check_access_modes(claim, pv) {
        return Err("incompatible accessMode".into());
    }
    Ok(())
}

/// Upstream's `findBestMatchForClaim`: among the volumes whose access modes include the claim's,
/// try the groups with the fewest modes first (what is closest to what was asked); in a group, a
/// volume pre-bound to the claim wins, else the smallest Available volume of the claim's class,
/// matching its selector and volume mode, large enough. With `delay_binding` only pre-bound
/// volumes are returned (the scheduler binds the rest).
pub fn find_best_match<'a>(
    claim: &PersistentVolumeClaim,
    volumes: &'a [PersistentVolume],
    delay_binding: bool,
) -> Result<Option<&'a PersistentVolume>, String> {
    let wanted: BTreeSet<&str> = claim_access_modes(claim).iter().map(String::as_str).collect();
    let mut groups: BTreeMap<(usize, Vec<&str>), Vec<&PersistentVolume>> = BTreeMap::new();
    for pv in volumes {
        let modes: BTreeSet<&str> = volume_access_modes(pv).iter().map(String::as_str).collect();
        if wanted.is_subset(&modes) {
            groups
                .entry((modes.len(), modes.into_iter().collect()))
                .or_default()
                .push(pv);
        }
    }
    for group in groups.values() {
        if let Some(pv) =
            skiff_api::volume::find_matching_volume(claim, group.iter().copied(), None, &[], delay_binding)?
        {
            return Ok(Some(pv));
        }
    }
    Ok(None)
}

/// Upstream's `bindClaimToVolume` without the write: the claim naming the volume, with
/// bound-by-controller when the controller chose the volume and bind-completed; `None` when
/// nothing changes.
pub fn claim_bound_to_volume(claim: &PersistentVolumeClaim, pv: &PersistentVolume) -> Option<PersistentVolumeClaim> {
    let mut dirty = false;
    let mut out = claim.clone();
    if claim_volume_name(claim) != Some(volume_name(pv)) {
        out.spec.get_or_insert_with(Default::default).volume_name = Some(volume_name(pv).to_string());
        if !has_annotation(&out.metadata, ANN_BOUND_BY_CONTROLLER) {
            set_annotation(&mut out.metadata, ANN_BOUND_BY_CONTROLLER, "yes");
        }
        dirty = true;
    }
    if !has_annotation(&out.metadata, ANN_BIND_COMPLETED) {
        set_annotation(&mut out.metadata, ANN_BIND_COMPLETED, "yes");
        dirty = true;
    }
    dirty.then_some(out)
}

/// Upstream's `updateClaimStatus` without the write: the phase, and the volume's access modes
/// and (when becoming bound) capacity, or none of them without a volume; `None` when nothing
/// changes.
pub fn claim_status(
    claim: &PersistentVolumeClaim,
    phase: &str,
    pv: Option<&PersistentVolume>,
) -> Result<Option<PersistentVolumeClaimStatus>, String> {
    let old = claim.status.clone().unwrap_or_default();
    let mut status = old.clone();
    let mut dirty = false;
    if old.phase.as_deref() != Some(phase) {
        status.phase = Some(phase.to_string());
        dirty = true;
    }
    match pv {
        None => {
            if old.access_modes.is_some() {
                status.access_modes = None;
                dirty = true;
            }
            if old.capacity.is_some() {
                status.capacity = None;
                dirty = true;
            }
        }
        Some(pv) => {
            let spec = pv.spec.clone().unwrap_or_default();
            if old.access_modes != spec.access_modes {
                status.access_modes = spec.access_modes.clone();
                dirty = true;
            }
            // Capacity is set when the claim becomes bound, not overwritten afterwards (a
            // different filesystem size may be intended).
            if old.phase.as_deref() != Some(phase) {
                let Some(cap) = spec.capacity.as_ref().and_then(|c| c.get("storage")) else {
                    return Err(format!(
                        "PersistentVolume {:?} is without a storage capacity",
                        volume_name(pv)
                    ));
                };
                let old_cap = old.capacity.as_ref().and_then(|c| c.get("storage"));
                if old_cap.is_none_or(|o| storage(Some(o)) != storage(Some(cap))) {
                    status.capacity = spec.capacity.clone();
                    dirty = true;
                }
            }
        }
    }
    Ok(dirty.then_some(status))
}

// ---- claims ----

/// Upstream's `syncClaim`.
async fn sync_claim(ctx: &Ctx, key: String) -> anyhow::Result<Option<Duration>> {
    let _one_at_a_time = ctx.claim_sync.lock().await;
    let (ns, name) = cu::split_key(&key);
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
    let Some(claim) = api.get_opt(name).await? else {
        return Ok(None);
    };
    if has_annotation(&claim.metadata, ANN_BIND_COMPLETED) {
        sync_bound_claim(ctx, claim).await?;
        Ok(None)
    } else {
        sync_unbound_claim(ctx, claim).await
    }
}

/// Upstream's `syncUnboundClaim`; returns when to look again while the claim stays Pending.
async fn sync_unbound_claim(ctx: &Ctx, claim: PersistentVolumeClaim) -> anyhow::Result<Option<Duration>> {
    let volumes_api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let Some(wanted) = claim_volume_name(&claim).map(str::to_string) else {
        // Any volume will do.
        let delay_binding = is_delay_binding_mode(ctx, &claim).await?;
        let volumes = volumes_api.list(&ListParams::default()).await?.items;
        let best = find_best_match(&claim, &volumes, delay_binding)
            .map_err(|e| anyhow::anyhow!("error finding PV for claim {:?}: {e}", claim_key(&claim)))?;
        if let Some(pv) = best {
            bind(ctx, pv.clone(), claim).await?;
            return Ok(None);
        }
        // No volume: a claim without a class gets the default one, if there is one now. Its
        // update brings the claim back (its watch), to be synced with the class.
        if assign_default_storage_class(ctx, &claim)
            .await
            .map_err(|e| anyhow::anyhow!("can't update PersistentVolumeClaim[{:?}]: {e:#}", claim_key(&claim)))?
        {
            return Ok(None);
        }
        let class = claim_class(&claim).to_string();
        if delay_binding && !has_annotation(&claim.metadata, ANN_SELECTED_NODE) {
            emit_event_for_unbound_delay_binding_claim(ctx, &claim).await?;
        } else if !class.is_empty() {
            // A volume of this class has to come from a provisioner (or an administrator);
            // the claim stays as it is until then.
            provision_claim(ctx, claim, &class).await?;
            return Ok(Some(RESYNC));
        } else {
            let msg = "no persistent volumes available for this claim and no storage class is set";
            ctx.recorder.event(&claim, "Normal", "FailedBinding", msg);
        }
        update_claim_status(ctx, claim, CLAIM_PENDING, None).await?;
        return Ok(Some(RESYNC));
    };
    // The user asked for a specific volume.
    let Some(pv) = volumes_api.get_opt(&wanted).await? else {
        // It does not exist (yet): try again later.
        update_claim_status(ctx, claim, CLAIM_PENDING, None).await?;
        return Ok(Some(RESYNC));
    };
    if pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).is_none() {
        if let Err(e) = check_volume_satisfy_claim(&pv, &claim) {
            let msg = format!("Cannot bind to requested volume {wanted:?}: {e}");
            ctx.recorder.event(&claim, "Warning", "VolumeMismatch", &msg);
            update_claim_status(ctx, claim, CLAIM_PENDING, None).await?;
            return Ok(Some(RESYNC));
        }
        bind(ctx, pv, claim).await?;
        return Ok(None);
    }
    if is_volume_bound_to_claim(&pv, &claim) {
        // Pre-bound to this claim: finish the binding.
        bind(ctx, pv, claim).await?;
        return Ok(None);
    }
    // Claimed by someone else.
    let msg = format!("volume {wanted:?} already bound to a different claim.");
    ctx.recorder.event(&claim, "Warning", "FailedBinding", &msg);
    if has_annotation(&claim.metadata, ANN_BOUND_BY_CONTROLLER) {
        // Someone removed bind-completed from a claim this controller bound.
        anyhow::bail!(
            "invalid binding of claim {:?} to volume {wanted:?}: volume already claimed by {:?}",
            claim_key(&claim),
            claim_ref_key(&pv).unwrap_or_default()
        );
    }
    update_claim_status(ctx, claim, CLAIM_PENDING, None).await?;
    Ok(Some(RESYNC))
}

/// Upstream's `syncBoundClaim`.
async fn sync_bound_claim(ctx: &Ctx, claim: PersistentVolumeClaim) -> anyhow::Result<()> {
    let Some(wanted) = claim_volume_name(&claim).map(str::to_string) else {
        let msg = "Bound claim has lost reference to PersistentVolume. Data on the volume is lost!";
        return update_claim_status_with_event(ctx, claim, CLAIM_LOST, "ClaimLost", msg).await;
    };
    let volumes_api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let Some(pv) = volumes_api.get_opt(&wanted).await? else {
        let msg = "Bound claim has lost its PersistentVolume. Data on the volume is lost!";
        return update_claim_status_with_event(ctx, claim, CLAIM_LOST, "ClaimLost", msg).await;
    };
    let ref_uid = pv
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .map(|r| r.uid.clone().unwrap_or_default());
    match ref_uid {
        // Unbound volume (or one whose update has not been seen): bind it again. Correctly
        // bound: bind() writes nothing unless something is missing.
        None => bind(ctx, pv, claim).await,
        Some(uid) if Some(uid.as_str()) == claim.metadata.uid.as_deref() => bind(ctx, pv, claim).await,
        Some(_) => {
            let msg = "Two claims are bound to the same volume, this one is bound incorrectly";
            update_claim_status_with_event(ctx, claim, CLAIM_LOST, "ClaimMisbound", msg).await
        }
    }
}

/// Upstream's `assignDefaultStorageClass` (the retroactive default StorageClass): an unbound
/// claim created without a class, while no class was the default, gets the default class once
/// there is one. Returns whether the claim was updated.
async fn assign_default_storage_class(ctx: &Ctx, claim: &PersistentVolumeClaim) -> anyhow::Result<bool> {
    if claim_has_class(claim) {
        return Ok(false);
    }
    let classes = Api::<StorageClass>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let Some(class) = default_class(&classes).and_then(|c| c.metadata.name.clone()) else {
        tracing::debug!(claim = %claim_key(claim), "can not assign storage class to claim: default storage class not found");
        return Ok(false);
    };
    let mut updated = claim.clone();
    updated.spec.get_or_insert_with(Default::default).storage_class_name = Some(class.clone());
    claims_api(ctx, &updated)
        .replace(
            updated.metadata.name.as_deref().unwrap_or_default(),
            &PostParams::default(),
            &updated,
        )
        .await?;
    tracing::info!(claim = %claim_key(claim), class, "assigned the default storage class to claim");
    Ok(true)
}

/// Upstream's `IsDelayBindingMode`: the claim's class exists and waits for the first consumer.
async fn is_delay_binding_mode(ctx: &Ctx, claim: &PersistentVolumeClaim) -> anyhow::Result<bool> {
    let class = claim_class(claim);
    if class.is_empty() {
        return Ok(false);
    }
    let Some(sc) = Api::<StorageClass>::all(ctx.client.clone()).get_opt(class).await? else {
        return Ok(false);
    };
    match sc.volume_binding_mode.as_deref() {
        Some(mode) => Ok(mode == "WaitForFirstConsumer"),
        None => anyhow::bail!("VolumeBindingMode not set for StorageClass {class:?}"),
    }
}

/// Upstream's `emitEventForUnboundDelayBindingClaim`: what the claim waits for.
async fn emit_event_for_unbound_delay_binding_claim(ctx: &Ctx, claim: &PersistentVolumeClaim) -> anyhow::Result<()> {
    let ns = claim.metadata.namespace.as_deref().unwrap_or_default();
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), ns)
        .list(&ListParams::default())
        .await?
        .items;
    let waiting: Vec<String> = pods
        .iter()
        .filter(|p| {
            let spec = p.spec.as_ref();
            spec.and_then(|s| s.node_name.as_deref()).unwrap_or_default().is_empty()
                && spec
                    .and_then(|s| s.volumes.as_ref())
                    .into_iter()
                    .flatten()
                    .any(|v| v.persistent_volume_claim.as_ref().is_some_and(|c| c.claim_name == name))
        })
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    let (reason, msg) = match waiting.as_slice() {
        [] => (
            "WaitForFirstConsumer",
            "waiting for first consumer to be created before binding".to_string(),
        ),
        [one] => ("WaitForPodScheduled", format!("waiting for pod {one} to be scheduled")),
        many => (
            "WaitForPodScheduled",
            format!("waiting for pods {} to be scheduled", many.join(",")),
        ),
    };
    ctx.recorder.event(claim, "Normal", reason, &msg);
    Ok(())
}

/// Upstream's `provisionClaim`, up to handing the claim to its provisioner: nothing in this
/// process provisions volumes, so the claim waits for an external provisioner or an
/// administrator to create a volume it matches.
async fn provision_claim(ctx: &Ctx, claim: PersistentVolumeClaim, class: &str) -> anyhow::Result<()> {
    let Some(sc) = Api::<StorageClass>::all(ctx.client.clone()).get_opt(class).await? else {
        let msg = format!("storageclass.storage.k8s.io {class:?} not found");
        ctx.recorder.event(&claim, "Warning", "ProvisioningFailed", &msg);
        return Ok(());
    };
    let provisioner = sc.provisioner;
    if provisioner.starts_with("kubernetes.io/") {
        // In-tree provisioner names: none is built in here.
        let msg = format!("no volume plugin matched name: {provisioner}");
        ctx.recorder.event(&claim, "Warning", "ProvisioningFailed", &msg);
        return Ok(());
    }
    let mut claim = claim;
    if annotation(&claim.metadata, ANN_STORAGE_PROVISIONER) != Some(provisioner.as_str())
        || annotation(&claim.metadata, ANN_BETA_STORAGE_PROVISIONER) != Some(provisioner.as_str())
    {
        set_annotation(&mut claim.metadata, ANN_STORAGE_PROVISIONER, &provisioner);
        set_annotation(&mut claim.metadata, ANN_BETA_STORAGE_PROVISIONER, &provisioner);
        claim = claims_api(ctx, &claim)
            .replace(
                claim.metadata.name.as_deref().unwrap_or_default(),
                &PostParams::default(),
                &claim,
            )
            .await?;
    }
    let msg = format!(
        "Waiting for a volume to be created either by the external provisioner '{provisioner}' or manually by the \
         system administrator. If volume creation is delayed, please verify that the provisioner is running and \
         correctly registered."
    );
    ctx.recorder.event(&claim, "Normal", "ExternalProvisioning", &msg);
    Ok(())
}

fn claims_api(ctx: &Ctx, claim: &PersistentVolumeClaim) -> Api<PersistentVolumeClaim> {
    Api::namespaced(
        ctx.client.clone(),
        claim.metadata.namespace.as_deref().unwrap_or_default(),
    )
}

/// Upstream's `bind`: the volume first (claimRef, then phase Bound), then the claim
/// (volumeName and annotations, then phase Bound with capacity and access modes). Each step
/// writes only when something changes.
async fn bind(ctx: &Ctx, pv: PersistentVolume, claim: PersistentVolumeClaim) -> anyhow::Result<()> {
    let volumes_api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let name = volume_name(&pv).to_string();
    let pv = match volume_bound_to_claim(&pv, &claim) {
        Some(updated) => {
            tracing::info!(volume = %name, claim = %claim_key(&claim), "claim bound to volume");
            volumes_api.replace(&name, &PostParams::default(), &updated).await?
        }
        None => pv,
    };
    let pv = update_volume_phase(ctx, pv, VOLUME_BOUND, "").await?;
    let claim = match claim_bound_to_volume(&claim, &pv) {
        Some(updated) => {
            tracing::info!(volume = %name, claim = %claim_key(&claim), "volume bound to claim");
            claims_api(ctx, &updated)
                .replace(
                    updated.metadata.name.as_deref().unwrap_or_default(),
                    &PostParams::default(),
                    &updated,
                )
                .await?
        }
        None => claim,
    };
    update_claim_status(ctx, claim, CLAIM_BOUND, Some(&pv)).await?;
    Ok(())
}

async fn update_claim_status(
    ctx: &Ctx,
    claim: PersistentVolumeClaim,
    phase: &str,
    pv: Option<&PersistentVolume>,
) -> anyhow::Result<PersistentVolumeClaim> {
    let Some(status) = claim_status(&claim, phase, pv).map_err(anyhow::Error::msg)? else {
        return Ok(claim);
    };
    let mut updated = claim;
    updated.status = Some(status);
    let name = updated.metadata.name.clone().unwrap_or_default();
    let saved = claims_api(ctx, &updated)
        .replace_status(&name, &PostParams::default(), &updated)
        .await?;
    tracing::debug!(claim = %claim_key(&saved), phase, "claim entered phase");
    Ok(saved)
}

/// Upstream's `updateClaimStatusWithEvent`: the event only when the phase changes.
async fn update_claim_status_with_event(
    ctx: &Ctx,
    claim: PersistentVolumeClaim,
    phase: &str,
    reason: &str,
    message: &str,
) -> anyhow::Result<()> {
    if claim_phase(&claim) == phase {
        return Ok(());
    }
    let saved = update_claim_status(ctx, claim, phase, None).await?;
    ctx.recorder.event(&saved, "Warning", reason, message);
    Ok(())
}

// ---- volumes ----

/// Upstream's `syncVolume`.
async fn sync_volume(ctx: &Ctx, name: String) -> anyhow::Result<Option<Duration>> {
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let Some(pv) = api.get_opt(&name).await? else {
        return Ok(None);
    };
    let Some(claim_ref) = pv.spec.as_ref().and_then(|s| s.claim_ref.clone()) else {
        // Unused.
        let pv = update_volume_phase(ctx, pv, VOLUME_AVAILABLE, "").await?;
        queue_claims_for(ctx, &pv);
        return Ok(None);
    };
    let ref_uid = claim_ref.uid.clone().unwrap_or_default();
    if ref_uid.is_empty() {
        // Reserved for a claim that has not been bound to it yet: the claim's sync binds it.
        let pv = update_volume_phase(ctx, pv, VOLUME_AVAILABLE, "").await?;
        queue_claims_for(ctx, &pv);
        return Ok(None);
    }
    let ns = claim_ref.namespace.clone().unwrap_or_default();
    let claim_name = claim_ref.name.clone().unwrap_or_default();
    let claim = if ns.is_empty() || claim_name.is_empty() {
        None
    } else {
        Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &ns)
            .get_opt(&claim_name)
            .await?
            // A claim of the same name but another uid: the one bound was deleted.
            .filter(|c| c.metadata.uid.as_deref() == Some(ref_uid.as_str()))
    };
    let Some(claim) = claim else {
        // The claim is gone: release the volume (keep Failed visible) and apply its policy.
        let mut pv = pv;
        if volume_phase(&pv) != VOLUME_RELEASED && volume_phase(&pv) != VOLUME_FAILED {
            tracing::info!(volume = %name, policy = reclaim_policy(&pv), "volume is released and reclaim policy will be executed");
            pv = update_volume_phase(ctx, pv, VOLUME_RELEASED, "").await?;
        }
        reclaim_volume(ctx, pv).await?;
        return Ok(None);
    };
    match claim_volume_name(&claim) {
        None => {
            if volume_mode_mismatch(&claim, &pv) {
                let volume_msg = format!(
                    "Cannot bind PersistentVolume to requested PersistentVolumeClaim {:?} due to incompatible volumeMode.",
                    claim_name
                );
                ctx.recorder.event(&pv, "Warning", "VolumeMismatch", &volume_msg);
                let claim_msg = format!(
                    "Cannot bind PersistentVolume {name:?} to requested PersistentVolumeClaim due to incompatible volumeMode."
                );
                ctx.recorder.event(&claim, "Warning", "VolumeMismatch", &claim_msg);
                return Ok(None);
            }
            // Bound on this side only: the claim's sync finishes it.
            ctx.claim_queue.add(claim_key(&claim));
        }
        Some(v) if v == name => {
            update_volume_phase(ctx, pv, VOLUME_BOUND, "").await?;
        }
        Some(_) => {
            // The claim is bound to another volume.
            if has_annotation(&pv.metadata, ANN_DYNAMICALLY_PROVISIONED) && reclaim_policy(&pv) == "Delete" {
                let mut pv = pv;
                if volume_phase(&pv) != VOLUME_RELEASED && volume_phase(&pv) != VOLUME_FAILED {
                    pv = update_volume_phase(ctx, pv, VOLUME_RELEASED, "").await?;
                }
                reclaim_volume(ctx, pv).await?;
            } else {
                // Bound by this controller: roll back. Pre-bound by the user: keep the claimRef
                // but forget the claim's uid, until the claim is unbound.
                unbind_volume(ctx, pv).await?;
            }
        }
    }
    Ok(None)
}

/// A volume that can be bound may be what Pending claims wait for: queue the claim it is
/// reserved for, or every claim not bound yet.
fn queue_claims_for(ctx: &Ctx, pv: &PersistentVolume) {
    if let Some(key) = claim_ref_key(pv) {
        ctx.claim_queue.add(key);
        return;
    }
    for claim in ctx.claims.state() {
        if !has_annotation(&claim.metadata, ANN_BIND_COMPLETED) {
            ctx.claim_queue.add(claim_key(&claim));
        }
    }
}

/// Upstream's `updateVolumePhase`: writes the status only when the phase changes.
async fn update_volume_phase(
    ctx: &Ctx,
    pv: PersistentVolume,
    phase: &str,
    message: &str,
) -> anyhow::Result<PersistentVolume> {
    if volume_phase(&pv) == phase {
        return Ok(pv);
    }
    let mut updated = pv;
    let status = updated.status.get_or_insert_with(PersistentVolumeStatus::default);
    status.phase = Some(phase.to_string());
    status.message = (!message.is_empty()).then(|| message.to_string());
    let name = volume_name(&updated).to_string();
    let saved = Api::<PersistentVolume>::all(ctx.client.clone())
        .replace_status(&name, &PostParams::default(), &updated)
        .await?;
    tracing::debug!(volume = %name, phase, "volume entered phase");
    Ok(saved)
}

/// Upstream's `unbindVolume`: undo a binding this controller made, or drop only the claim's uid
/// from a user's pre-binding; the volume is Available again.
async fn unbind_volume(ctx: &Ctx, pv: PersistentVolume) -> anyhow::Result<()> {
    let mut updated = pv;
    if has_annotation(&updated.metadata, ANN_BOUND_BY_CONTROLLER) {
        if let Some(spec) = updated.spec.as_mut() {
            spec.claim_ref = None;
        }
        if let Some(a) = updated.metadata.annotations.as_mut() {
            a.remove(ANN_BOUND_BY_CONTROLLER);
            if a.is_empty() {
                updated.metadata.annotations = None;
            }
        }
    } else if let Some(r) = updated.spec.as_mut().and_then(|s| s.claim_ref.as_mut()) {
        r.uid = None;
    }
    let name = volume_name(&updated).to_string();
    let saved = Api::<PersistentVolume>::all(ctx.client.clone())
        .replace(&name, &PostParams::default(), &updated)
        .await?;
    update_volume_phase(ctx, saved, VOLUME_AVAILABLE, "").await?;
    Ok(())
}

/// Upstream's `reclaimVolume`. A volume an external provisioner made (its
/// `pv.kubernetes.io/provisioned-by` names no `kubernetes.io/` plugin) is that provisioner's to
/// delete: nothing is done here, as upstream's `doDeleteVolume` does nothing for an external
/// deleter. No other volume is deleted or recycled by a plugin of this process, and hostPath and
/// local volumes hold the user's data: they stay as they are, Released, until an administrator
/// deletes or re-binds them.
async fn reclaim_volume(ctx: &Ctx, pv: PersistentVolume) -> anyhow::Result<()> {
    match reclaim_policy(&pv) {
        "Retain" => {}
        "Delete" if has_external_deleter(&pv) => {
            tracing::debug!(
                volume = volume_name(&pv),
                provisioner = annotation(&pv.metadata, ANN_DYNAMICALLY_PROVISIONED).unwrap_or_default(),
                "External deleter for volume requested, ignoring"
            );
        }
        "Delete" | "Recycle" => {
            tracing::info!(
                volume = volume_name(&pv),
                policy = reclaim_policy(&pv),
                "no plugin here deletes or recycles this volume; it is kept Released"
            );
        }
        _ => {
            if volume_phase(&pv) != VOLUME_FAILED {
                let saved = update_volume_phase(ctx, pv, VOLUME_FAILED, "").await?;
                let msg = "Volume has unrecognized PersistentVolumeReclaimPolicy";
                ctx.recorder.event(&saved, "Warning", "VolumeUnknownReclaimPolicy", msg);
            }
        }
    }
    Ok(())
}

/// Upstream's `findDeletablePlugin` answering "external": the volume was provisioned by a
/// provisioner outside this process.
fn has_external_deleter(pv: &PersistentVolume) -> bool {
    annotation(&pv.metadata, ANN_DYNAMICALLY_PROVISIONED)
        .is_some_and(|p| !p.is_empty() && !p.starts_with("kubernetes.io/"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        HostPathVolumeSource, ObjectReference, PersistentVolumeClaimSpec, PersistentVolumeSpec,
        VolumeResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector as K8sSelector, Time};

    fn pv(name: &str, size: &str, modes: &[&str], class: &str) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                capacity: Some([("storage".to_string(), K8sQuantity(size.into()))].into()),
                access_modes: Some(modes.iter().map(|m| m.to_string()).collect()),
                storage_class_name: (!class.is_empty()).then(|| class.to_string()),
                host_path: Some(HostPathVolumeSource {
                    path: format!("/data/{name}"),
                    type_: None,
                }),
                persistent_volume_reclaim_policy: Some("Retain".into()),
                volume_mode: Some("Filesystem".into()),
                ..Default::default()
            }),
            status: Some(PersistentVolumeStatus {
                phase: Some("Available".into()),
                ..Default::default()
            }),
        }
    }

    fn pvc(name: &str, size: &str, modes: &[&str], class: Option<&str>) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(format!("uid-{name}")),
                resource_version: Some("7".into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(modes.iter().map(|m| m.to_string()).collect()),
                resources: Some(VolumeResourceRequirements {
                    requests: Some([("storage".to_string(), K8sQuantity(size.into()))].into()),
                    limits: None,
                }),
                storage_class_name: class.map(str::to_string),
                volume_mode: Some("Filesystem".into()),
                ..Default::default()
            }),
            status: Some(PersistentVolumeClaimStatus {
                phase: Some("Pending".into()),
                ..Default::default()
            }),
        }
    }

    fn best<'a>(claim: &PersistentVolumeClaim, volumes: &'a [PersistentVolume]) -> Option<&'a str> {
        find_best_match(claim, volumes, false)
            .unwrap()
            .and_then(|v| v.metadata.name.as_deref())
    }

    #[test]
    fn smallest_volume_that_is_large_enough_wins() {
        let vols = [
            pv("big", "10Gi", &["ReadWriteOnce"], "manual"),
            pv("small", "100Mi", &["ReadWriteOnce"], "manual"),
            pv("fits", "1Gi", &["ReadWriteOnce"], "manual"),
            pv("exact", "500Mi", &["ReadWriteOnce"], "manual"),
        ];
        assert_eq!(
            best(&pvc("c", "500Mi", &["ReadWriteOnce"], Some("manual")), &vols),
            Some("exact")
        );
        assert_eq!(
            best(&pvc("c", "600Mi", &["ReadWriteOnce"], Some("manual")), &vols),
            Some("fits")
        );
        assert_eq!(best(&pvc("c", "20Gi", &["ReadWriteOnce"], Some("manual")), &vols), None);
    }

    #[test]
    fn class_must_be_equal_and_empty_matches_only_empty() {
        let vols = [
            pv("fast", "1Gi", &["ReadWriteOnce"], "fast"),
            pv("none", "5Gi", &["ReadWriteOnce"], ""),
        ];
        assert_eq!(
            best(&pvc("c", "1Gi", &["ReadWriteOnce"], Some("fast")), &vols),
            Some("fast")
        );
        assert_eq!(
            best(&pvc("c", "1Gi", &["ReadWriteOnce"], Some("")), &vols),
            Some("none")
        );
        assert_eq!(best(&pvc("c", "1Gi", &["ReadWriteOnce"], None), &vols), Some("none"));
        assert_eq!(best(&pvc("c", "1Gi", &["ReadWriteOnce"], Some("slow")), &vols), None);
        // The beta annotation wins over the field, on both sides.
        let mut annotated = pvc("c", "1Gi", &["ReadWriteOnce"], Some("slow"));
        set_annotation(&mut annotated.metadata, ANN_BETA_STORAGE_CLASS, "fast");
        assert_eq!(best(&annotated, &vols), Some("fast"));
    }

    #[test]
    fn access_modes_must_be_a_superset_and_fewest_modes_come_first() {
        let vols = [
            pv(
                "rwo-rox-rwx",
                "1Gi",
                &["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany"],
                "",
            ),
            pv("rwo-rox", "5Gi", &["ReadOnlyMany", "ReadWriteOnce"], ""),
            pv("rox", "1Gi", &["ReadOnlyMany"], ""),
        ];
        // A larger volume with fewer extra modes is preferred to a smaller one with more.
        assert_eq!(best(&pvc("c", "1Gi", &["ReadWriteOnce"], None), &vols), Some("rwo-rox"));
        assert_eq!(best(&pvc("c", "1Gi", &["ReadOnlyMany"], None), &vols), Some("rox"));
        assert_eq!(
            best(&pvc("c", "1Gi", &["ReadWriteMany"], None), &vols),
            Some("rwo-rox-rwx")
        );
        assert_eq!(best(&pvc("c", "1Gi", &["ReadWriteOncePod"], None), &vols), None);
        // Within a group, it falls through to the next group when nothing fits.
        assert_eq!(best(&pvc("c", "2Gi", &["ReadOnlyMany"], None), &vols), Some("rwo-rox"));
    }

    #[test]
    fn volume_mode_phase_deletion_and_claim_refs_filter() {
        let mut block = pv("block", "1Gi", &["ReadWriteOnce"], "");
        block.spec.as_mut().unwrap().volume_mode = Some("Block".into());
        let mut pending = pv("pending", "1Gi", &["ReadWriteOnce"], "");
        pending.status.as_mut().unwrap().phase = Some("Pending".into());
        let mut deleting = pv("deleting", "1Gi", &["ReadWriteOnce"], "");
        deleting.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::now()));
        let mut taken = pv("taken", "1Gi", &["ReadWriteOnce"], "");
        taken.spec.as_mut().unwrap().claim_ref = Some(ObjectReference {
            name: Some("other".into()),
            namespace: Some("default".into()),
            ..Default::default()
        });
        let vols = [block, pending, deleting, taken];
        assert_eq!(best(&pvc("c", "1Gi", &["ReadWriteOnce"], None), &vols), None);
        let mut block_claim = pvc("c", "1Gi", &["ReadWriteOnce"], None);
        block_claim.spec.as_mut().unwrap().volume_mode = Some("Block".into());
        assert_eq!(best(&block_claim, &vols), Some("block"));
    }

    #[test]
    fn selector_filters_volumes_by_label() {
        let mut ssd = pv("ssd", "5Gi", &["ReadWriteOnce"], "");
        ssd.metadata.labels = Some([("disk".to_string(), "ssd".to_string())].into());
        let hdd = pv("hdd", "1Gi", &["ReadWriteOnce"], "");
        let vols = [ssd, hdd];
        let mut claim = pvc("c", "1Gi", &["ReadWriteOnce"], None);
        claim.spec.as_mut().unwrap().selector = Some(K8sSelector {
            match_labels: Some([("disk".to_string(), "ssd".to_string())].into()),
            match_expressions: None,
        });
        assert_eq!(best(&claim, &vols), Some("ssd"));
        claim.spec.as_mut().unwrap().selector = Some(K8sSelector {
            match_labels: Some([("disk".to_string(), "nvme".to_string())].into()),
            match_expressions: None,
        });
        assert_eq!(best(&claim, &vols), None);
    }

    #[test]
    fn pre_bound_volume_wins_even_when_larger_or_not_available() {
        let small = pv("small", "1Gi", &["ReadWriteOnce"], "");
        let mut reserved = pv("reserved", "10Gi", &["ReadWriteOnce"], "other-class");
        reserved.spec.as_mut().unwrap().claim_ref = Some(ObjectReference {
            name: Some("c".into()),
            namespace: Some("default".into()),
            ..Default::default()
        });
        reserved.status.as_mut().unwrap().phase = Some("Pending".into());
        let vols = [small, reserved];
        let claim = pvc("c", "1Gi", &["ReadWriteOnce"], None);
        assert_eq!(best(&claim, &vols), Some("reserved"));
        // With delayed binding only the pre-bound volume is returned.
        assert_eq!(
            find_best_match(&claim, &vols, true)
                .unwrap()
                .and_then(|v| v.metadata.name.as_deref()),
            Some("reserved")
        );
        assert!(
            find_best_match(&pvc("d", "1Gi", &["ReadWriteOnce"], None), &vols, true)
                .unwrap()
                .is_none()
        );
        // A claimRef with another uid is another claim of the same name.
        let mut other_uid = vols[1].clone();
        other_uid.spec.as_mut().unwrap().claim_ref.as_mut().unwrap().uid = Some("old".into());
        assert!(!is_volume_bound_to_claim(&other_uid, &claim));
        assert_eq!(best(&claim, &[vols[0].clone(), other_uid]), Some("small"));
    }

    #[test]
    fn named_volume_is_checked_as_upstream() {
        let claim = pvc("c", "2Gi", &["ReadWriteMany"], Some("manual"));
        let mut v = pv("v", "1Gi", &["ReadWriteOnce"], "other");
        assert_eq!(
            check_volume_satisfy_claim(&v, &claim).unwrap_err(),
            "requested PV is too small"
        );
        v.spec.as_mut().unwrap().capacity = Some([("storage".to_string(), K8sQuantity("2Gi".into()))].into());
        assert_eq!(
            check_volume_satisfy_claim(&v, &claim).unwrap_err(),
            "storageClassName does not match"
        );
        v.spec.as_mut().unwrap().storage_class_name = Some("manual".into());
        assert_eq!(
            check_volume_satisfy_claim(&v, &claim).unwrap_err(),
            "incompatible accessMode"
        );
        v.spec.as_mut().unwrap().access_modes = Some(vec!["ReadWriteMany".into()]);
        assert!(check_volume_satisfy_claim(&v, &claim).is_ok());
    }

    #[test]
    fn binding_sets_claim_ref_annotations_and_status() {
        let claim = pvc("data", "500Mi", &["ReadWriteOnce"], Some("manual"));
        let vol = pv("pv1", "1Gi", &["ReadWriteOnce"], "manual");
        let bound = volume_bound_to_claim(&vol, &claim).expect("changed");
        let r = bound.spec.as_ref().unwrap().claim_ref.as_ref().unwrap();
        assert_eq!(r.kind.as_deref(), Some("PersistentVolumeClaim"));
        assert_eq!(r.namespace.as_deref(), Some("default"));
        assert_eq!(r.name.as_deref(), Some("data"));
        assert_eq!(r.uid.as_deref(), Some("uid-data"));
        assert_eq!(annotation(&bound.metadata, ANN_BOUND_BY_CONTROLLER), Some("yes"));
        assert!(
            volume_bound_to_claim(&bound, &claim).is_none(),
            "binding twice changes nothing"
        );

        // A user's pre-binding (name only) gets the uid but no bound-by-controller.
        let mut pre = vol.clone();
        pre.spec.as_mut().unwrap().claim_ref = Some(ObjectReference {
            name: Some("data".into()),
            namespace: Some("default".into()),
            ..Default::default()
        });
        let finished = volume_bound_to_claim(&pre, &claim).expect("uid added");
        assert_eq!(
            finished
                .spec
                .as_ref()
                .unwrap()
                .claim_ref
                .as_ref()
                .unwrap()
                .uid
                .as_deref(),
            Some("uid-data")
        );
        assert!(!has_annotation(&finished.metadata, ANN_BOUND_BY_CONTROLLER));

        let c = claim_bound_to_volume(&claim, &bound).expect("changed");
        assert_eq!(claim_volume_name(&c), Some("pv1"));
        assert_eq!(annotation(&c.metadata, ANN_BIND_COMPLETED), Some("yes"));
        assert_eq!(annotation(&c.metadata, ANN_BOUND_BY_CONTROLLER), Some("yes"));
        assert!(claim_bound_to_volume(&c, &bound).is_none());
        // A claim that named its volume is not marked bound-by-controller.
        let mut named = claim.clone();
        named.spec.as_mut().unwrap().volume_name = Some("pv1".into());
        let c = claim_bound_to_volume(&named, &bound).expect("bind-completed added");
        assert!(!has_annotation(&c.metadata, ANN_BOUND_BY_CONTROLLER));

        let s = claim_status(&c, "Bound", Some(&bound)).unwrap().expect("changed");
        assert_eq!(s.phase.as_deref(), Some("Bound"));
        assert_eq!(s.capacity.unwrap()["storage"].0, "1Gi");
        assert_eq!(s.access_modes.unwrap(), vec!["ReadWriteOnce".to_string()]);
        let mut now_bound = c.clone();
        now_bound.status = claim_status(&c, "Bound", Some(&bound)).unwrap();
        assert!(claim_status(&now_bound, "Bound", Some(&bound)).unwrap().is_none());
        // Back to Pending without a volume clears what the volume gave.
        let pending = claim_status(&now_bound, "Pending", None).unwrap().expect("changed");
        assert!(pending.capacity.is_none() && pending.access_modes.is_none());
        // A volume without capacity cannot complete a binding.
        let mut no_cap = bound.clone();
        no_cap.spec.as_mut().unwrap().capacity = None;
        assert!(claim_status(&c, "Bound", Some(&no_cap)).is_err());
    }

    #[test]
    fn externally_provisioned_volumes_are_left_to_their_provisioner() {
        let mut v = pv("v", "1Gi", &["ReadWriteOnce"], "local-path");
        assert!(!has_external_deleter(&v));
        set_annotation(&mut v.metadata, ANN_DYNAMICALLY_PROVISIONED, "skiff.dev/local-path");
        assert!(has_external_deleter(&v));
        set_annotation(&mut v.metadata, ANN_DYNAMICALLY_PROVISIONED, "kubernetes.io/host-path");
        assert!(!has_external_deleter(&v));
    }

    #[test]
    fn a_bad_selector_is_an_error_not_a_match() {
        let mut claim = pvc("c", "1Gi", &["ReadWriteOnce"], None);
        claim.spec.as_mut().unwrap().selector = Some(K8sSelector {
            match_labels: Some([("bad key!".to_string(), "x".to_string())].into()),
            match_expressions: None,
        });
        let vols = [pv("v", "1Gi", &["ReadWriteOnce"], "")];
        assert!(find_best_match(&claim, &vols, false).is_err());
    }
}
