//! The StatefulSet controller (upstream's `pkg/controller/statefulset`): pods `<set>-<ordinal>`
//! with stable identity (hostname, subdomain from serviceName, `statefulset.kubernetes.io/pod-name`
//! and `apps.kubernetes.io/pod-index` labels) and storage (a PVC `<claim>-<set>-<ordinal>` per
//! volumeClaimTemplate), created in order and removed in reverse (OrderedReady waits for each pod
//! to be Running and Ready; Parallel does not), ControllerRevisions for history, and
//! RollingUpdate from the highest ordinal down to the partition.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod, PodTemplateSpec, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};

use crate::controller_utils::{self as cu, Recorder, WorkQueue};
use crate::history;

pub const COMPONENT: &str = "statefulset-controller";
pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";

struct Ctx {
    client: kube::Client,
    recorder: Recorder,
    /// The claims, as upstream's PVC lister: what the sets' ordinals have and how they are owned.
    claims: Store<PersistentVolumeClaim>,
}

pub async fn run(client: kube::Client, informers: crate::informers::SharedInformerFactory) -> anyhow::Result<()> {
    let queue = WorkQueue::new();
    let store = cu::spawn_owner_watch(Api::<StatefulSet>::all(client.clone()), queue.clone());
    let s = store.clone();
    // Pod events come from the process's shared pod informer (one watch for every controller).
    cu::on_changes(&informers.informer::<Pod>(), queue.clone(), move |p: &Pod| {
        cu::owner_keys(&s, &p.metadata, "StatefulSet", |d: &StatefulSet| {
            d.spec.as_ref().map(|s| &s.selector)
        })
    });
    // A claim that goes away may be what an ordinal waits for (a stale or deleting claim blocks
    // its pod): its set looks again.
    let s = store.clone();
    let claims = cu::spawn_store_watch_events(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        queue.clone(),
        move |c: &PersistentVolumeClaim, deleted| {
            if !deleted {
                return Vec::new();
            }
            s.state()
                .iter()
                .filter(|set| set.metadata.namespace == c.metadata.namespace && claim_belongs_to(c, set))
                .flat_map(|set| cu::self_key(set.as_ref()))
                .collect()
        },
    );
    let ctx = Ctx {
        recorder: Recorder::for_component(client.clone(), COMPONENT),
        client,
        claims,
    };
    queue.run("statefulset", |key| sync(&ctx, key)).await
}

/// Whether the claim is named as one of the set's ordinals' claims (`<template>-<set>-<ordinal>`).
fn claim_belongs_to(claim: &PersistentVolumeClaim, set: &StatefulSet) -> bool {
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    let set_name = set.metadata.name.as_deref().unwrap_or_default();
    set.spec
        .iter()
        .flat_map(|s| s.volume_claim_templates.iter().flatten())
        .filter_map(|t| t.metadata.name.as_deref())
        .any(|t| {
            name.strip_prefix(t)
                .and_then(|rest| rest.strip_prefix('-'))
                .and_then(|rest| ordinal_of(set_name, rest))
                .is_some()
        })
}

/// The ordinal of a pod of `set`, from its name `<set>-<ordinal>`.
pub fn ordinal_of(set: &str, pod: &str) -> Option<i32> {
    let rest = pod.strip_prefix(set)?.strip_prefix('-')?;
    if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_digit()) || (rest.len() > 1 && rest.starts_with('0')) {
        return None;
    }
    rest.parse().ok()
}

/// `<claim>-<set>-<ordinal>`.
pub fn claim_name(claim: &str, set: &str, ordinal: i32) -> String {
    format!("{claim}-{set}-{ordinal}")
}

fn is_running_and_ready(p: &Pod) -> bool {
    cu::pod_phase(p) == "Running" && cu::is_pod_ready(p)
}

fn is_healthy(p: &Pod, min_ready: i32, now: jiff::Timestamp) -> bool {
    is_running_and_ready(p) && !cu::is_pod_terminating(p) && cu::is_pod_available(p, min_ready, now)
}

fn pod_revision(p: &Pod) -> Option<&str> {
    p.metadata
        .labels
        .as_ref()?
        .get(history::CONTROLLER_REVISION_HASH_LABEL)
        .map(String::as_str)
}

/// Upstream's `newStatefulSetPod` + `updateStorage`: the pod for an ordinal from a template.
pub fn new_pod(set: &StatefulSet, template: &PodTemplateSpec, ordinal: i32, revision: &str) -> Pod {
    let set_name = set.metadata.name.clone().unwrap_or_default();
    let ns = set.metadata.namespace.clone().unwrap_or_default();
    let name = format!("{set_name}-{ordinal}");
    let owner = cu::new_controller_ref(&set.metadata, "apps/v1", "StatefulSet");
    let mut pod = cu::pod_from_template(template, "", Some(owner), &ns);
    pod.metadata.generate_name = None;
    pod.metadata.name = Some(name.clone());
    let labels = pod.metadata.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(POD_NAME_LABEL.into(), name.clone());
    labels.insert(POD_INDEX_LABEL.into(), ordinal.to_string());
    labels.insert(history::CONTROLLER_REVISION_HASH_LABEL.into(), revision.to_string());
    let spec = set.spec.clone().unwrap_or_default();
    if let Some(ps) = pod.spec.as_mut() {
        ps.hostname = Some(name.clone());
        if !spec.service_name.clone().unwrap_or_default().is_empty() {
            ps.subdomain = spec.service_name.clone();
        }
        for claim in spec.volume_claim_templates.iter().flatten() {
            let cname = claim.metadata.name.clone().unwrap_or_default();
            let vol = Volume {
                name: cname.clone(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim_name(&cname, &set_name, ordinal),
                    read_only: None,
                }),
                ..Default::default()
            };
            let vols = ps.volumes.get_or_insert_with(Vec::new);
            vols.retain(|v| v.name != cname);
            vols.push(vol);
        }
    }
    pod
}

/// The revision a new pod at `ordinal` gets (upstream's `newVersionedStatefulSetPod`).
fn use_current_revision(set: &StatefulSet, ordinal: i32, start: i32) -> bool {
    let spec = set.spec.clone().unwrap_or_default();
    let strategy = spec.update_strategy.unwrap_or_default();
    let rolling = strategy.type_.as_deref().is_none_or(|t| t == "RollingUpdate");
    let current_replicas = set.status.as_ref().and_then(|s| s.current_replicas).unwrap_or(0);
    match strategy.rolling_update.and_then(|r| r.partition) {
        None => rolling && ordinal < start + current_replicas,
        Some(p) => ordinal < start + p,
    }
}

async fn sync(ctx: &Ctx, key: String) -> anyhow::Result<Option<Duration>> {
    let (ns, name) = cu::split_key(&key);
    let sets: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), ns);
    let Some(mut set) = sets.get_opt(name).await? else {
        return Ok(None);
    };
    let Some(spec) = set.spec.clone() else {
        return Ok(None);
    };
    let selector = cu::selector_of(Some(&spec.selector));
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let all = pods_api.list(&ListParams::default()).await?.items;
    let pods = cu::claim(&pods_api, &set.metadata, "apps/v1", "StatefulSet", &selector, all)
        .await?
        .owned;
    let cr_api: Api<ControllerRevision> = Api::namespaced(ctx.client.clone(), ns);
    let revs = cr_api.list(&ListParams::default()).await?.items;
    let mut revs = cu::claim(&cr_api, &set.metadata, "apps/v1", "StatefulSet", &selector, revs)
        .await?
        .owned;
    if set.metadata.deletion_timestamp.is_some() {
        return Ok(None);
    }
    revs.sort_by_key(|r| r.revision);
    let (current_rev, update_rev, collision) = revisions(&cr_api, &set, &revs).await?;
    let current_name = current_rev.metadata.name.clone().unwrap_or_default();
    let update_name = update_rev.metadata.name.clone().unwrap_or_default();
    let current_template = history::template_of(&current_rev).unwrap_or_else(|| spec.template.clone());

    let now = jiff::Timestamp::now();
    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    let replicas = spec.replicas.unwrap_or(1).max(0);
    let start = spec.ordinals.as_ref().and_then(|o| o.start).unwrap_or(0);
    let monotonic = spec.pod_management_policy.as_deref() != Some("Parallel");

    let mut slots: Vec<Option<&Pod>> = vec![None; replicas as usize];
    let mut condemned: Vec<(i32, &Pod)> = Vec::new();
    for p in &pods {
        let Some(ord) = p.metadata.name.as_deref().and_then(|n| ordinal_of(name, n)) else {
            continue;
        };
        if ord >= start && ord < start + replicas {
            slots[(ord - start) as usize] = Some(p);
        } else {
            condemned.push((ord, p));
        }
    }
    condemned.sort_by_key(|(o, _)| std::cmp::Reverse(*o));

    let result = act(
        ctx,
        &set,
        &pods_api,
        ActInput {
            slots: &slots,
            condemned: &condemned,
            current_template: &current_template,
            current_name: &current_name,
            update_name: &update_name,
            start,
            monotonic,
            min_ready,
            now,
        },
    )
    .await;

    // Status from the pods as they were.
    let mut status = StatefulSetStatus {
        observed_generation: set.metadata.generation,
        replicas: 0,
        collision_count: Some(collision),
        current_revision: Some(current_name.clone()),
        update_revision: Some(update_name.clone()),
        conditions: set.status.as_ref().and_then(|s| s.conditions.clone()),
        ..Default::default()
    };
    let (mut ready, mut available, mut current, mut updated) = (0, 0, 0, 0);
    for p in &pods {
        if cu::pod_phase(p).is_empty() {
            continue;
        }
        status.replicas += 1;
        if is_running_and_ready(p) {
            ready += 1;
            if cu::is_pod_available(p, min_ready, now) {
                available += 1;
            }
        }
        if !cu::is_pod_terminating(p) {
            match pod_revision(p) {
                Some(r) if r == current_name => current += 1,
                _ => {}
            }
            match pod_revision(p) {
                Some(r) if r == update_name => updated += 1,
                _ => {}
            }
        }
    }
    let nz = |v: i32| (v != 0).then_some(v);
    status.ready_replicas = nz(ready);
    status.available_replicas = Some(available);
    status.current_replicas = nz(current);
    status.updated_replicas = nz(updated);
    let rolling = spec
        .update_strategy
        .as_ref()
        .and_then(|s| s.type_.as_deref())
        .is_none_or(|t| t == "RollingUpdate");
    if rolling && updated == status.replicas && ready == status.replicas {
        status.current_replicas = status.updated_replicas;
        status.current_revision = status.update_revision.clone();
    }
    if set.status.as_ref() != Some(&status) {
        set.status = Some(status);
        sets.replace_status(name, &PostParams::default(), &set).await?;
    }
    // Drop revisions beyond the history limit that no pod uses.
    let limit = spec.revision_history_limit.unwrap_or(10).max(0) as usize;
    let live: std::collections::HashSet<&str> = pods.iter().filter_map(pod_revision).collect();
    let mut old: Vec<&ControllerRevision> = revs
        .iter()
        .filter(|r| {
            let n = r.metadata.name.as_deref().unwrap_or_default();
            n != current_name && n != update_name && !live.contains(n)
        })
        .collect();
    if old.len() > limit {
        old.sort_by_key(|r| r.revision);
        let excess = old.len() - limit;
        for r in old.into_iter().take(excess) {
            cu::delete_ignoring_missing(
                &cr_api,
                r.metadata.name.as_deref().unwrap_or_default(),
                &DeleteParams::default(),
            )
            .await?;
        }
    }
    result?;
    Ok(pods.iter().filter_map(|p| cu::available_after(p, min_ready, now)).min())
}

struct ActInput<'a> {
    slots: &'a [Option<&'a Pod>],
    condemned: &'a [(i32, &'a Pod)],
    current_template: &'a PodTemplateSpec,
    current_name: &'a str,
    update_name: &'a str,
    start: i32,
    monotonic: bool,
    min_ready: i32,
    now: jiff::Timestamp,
}

/// Upstream's `updateStatefulSet` core: create / replace, then the condemned pods' claims, then
/// scale down, then update. In monotonic mode (OrderedReady) the first replica that blocks ends
/// the pass; in Parallel mode every replica is processed and only errors end it.
async fn act(ctx: &Ctx, set: &StatefulSet, pods_api: &Api<Pod>, i: ActInput<'_>) -> anyhow::Result<()> {
    let spec = set.spec.clone().unwrap_or_default();
    let mut errors: Vec<anyhow::Error> = Vec::new();
    for (idx, slot) in i.slots.iter().enumerate() {
        let ord = i.start + idx as i32;
        let exit = match slot {
            None => {
                let (template, rev) = if use_current_revision(set, ord, i.start) {
                    (i.current_template, i.current_name)
                } else {
                    (&spec.template, i.update_name)
                };
                let mut versioned = set.clone();
                if let Some(s) = versioned.spec.as_mut() {
                    s.template = template.clone();
                }
                let pod = new_pod(&versioned, template, ord, rev);
                create_replica(ctx, set, pods_api, &pod, i.monotonic).await
            }
            Some(p) => process_replica(ctx, set, pods_api, p, &i).await,
        };
        match exit {
            Ok(true) if i.monotonic => return Ok(()),
            Ok(_) => {}
            Err(e) if i.monotonic => return Err(e),
            Err(e) => errors.push(e),
        }
    }
    if let Some(e) = errors.into_iter().next() {
        return Err(e);
    }
    // The condemned pods' claims follow the retention policy before the pods go (whenScaled
    // Delete: the pod becomes their owner, so they go with it).
    for (_, p) in i.condemned {
        if !claims_match_retention_policy(ctx, set, p) {
            update_pod_claim_for_retention_policy(ctx, set, p).await?;
        }
    }
    // Scale down, highest ordinal first.
    let first_unhealthy = i
        .slots
        .iter()
        .flatten()
        .chain(i.condemned.iter().rev().map(|(_, p)| p))
        .find(|p| !is_healthy_now(p))
        .and_then(|p| p.metadata.name.clone());
    let mut acted = false;
    for (_, p) in i.condemned {
        if cu::is_pod_terminating(p) {
            if i.monotonic {
                return Ok(());
            }
            continue;
        }
        if i.monotonic && !is_healthy(p, i.min_ready, i.now) && first_unhealthy != p.metadata.name {
            return Ok(());
        }
        delete_pod(ctx, set, pods_api, p).await?;
        acted = true;
        if i.monotonic {
            return Ok(());
        }
    }
    if acted {
        return Ok(());
    }
    // Rolling update: the highest ordinal not at the update revision goes first.
    let strategy = spec.update_strategy.unwrap_or_default();
    if strategy.type_.as_deref() == Some("OnDelete") {
        return Ok(());
    }
    let partition = strategy.rolling_update.and_then(|r| r.partition).unwrap_or(0).max(0) as usize;
    for idx in (partition..i.slots.len()).rev() {
        let Some(p) = i.slots[idx] else { return Ok(()) };
        if pod_revision(p) != Some(i.update_name) && !cu::is_pod_terminating(p) {
            delete_pod(ctx, set, pods_api, p).await?;
            return Ok(());
        }
        if !is_healthy(p, i.min_ready, i.now) {
            return Ok(());
        }
    }
    Ok(())
}

/// Upstream's `isHealthy` (running, ready, not terminating), used to find the first unhealthy pod.
fn is_healthy_now(p: &Pod) -> bool {
    is_running_and_ready(p) && !cu::is_pod_terminating(p)
}

/// The part of upstream's `processReplica` for an ordinal without a pod: unless a claim still
/// belongs to the ordinal's previous pod, create the claims, then the pod. Returns whether the
/// pass stops here (monotonic).
async fn create_replica(
    ctx: &Ctx,
    set: &StatefulSet,
    pods_api: &Api<Pod>,
    pod: &Pod,
    monotonic: bool,
) -> anyhow::Result<bool> {
    if pod_claim_is_stale(ctx, set, pod) {
        // A claim the condemned pod of this ordinal owned has not gone yet.
        tracing::debug!(
            pod = pod.metadata.name.as_deref().unwrap_or_default(),
            "waiting for a stale claim to go"
        );
        return Ok(true);
    }
    create_stateful_pod(ctx, set, pods_api, pod).await?;
    Ok(monotonic)
}

/// Upstream's `processReplica` for an existing pod; returns whether the pass stops here
/// (monotonic).
async fn process_replica(
    ctx: &Ctx,
    set: &StatefulSet,
    pods_api: &Api<Pod>,
    p: &Pod,
    i: &ActInput<'_>,
) -> anyhow::Result<bool> {
    // Failed or Succeeded: deleted, and created again on a later pass once gone.
    if matches!(cu::pod_phase(p), "Failed" | "Succeeded") {
        if !cu::is_pod_terminating(p) {
            let (ns, name) = (
                set.metadata.namespace.as_deref().unwrap_or_default(),
                set.metadata.name.as_deref().unwrap_or_default(),
            );
            let pod = p.metadata.name.as_deref().unwrap_or_default();
            match cu::pod_phase(p) {
                "Failed" => ctx.recorder.event(
                    set,
                    "Warning",
                    "RecreatingFailedPod",
                    format!("StatefulSet {ns}/{name} is recreating failed Pod {pod}"),
                ),
                _ => ctx.recorder.event(
                    set,
                    "Normal",
                    "RecreatingTerminatedPod",
                    format!("StatefulSet {ns}/{name} is recreating terminated Pod {pod}"),
                ),
            }
            delete_pod(ctx, set, pods_api, p).await?;
        }
        return Ok(true);
    }
    // A pending pod's missing claims (deleted meanwhile) are created again.
    if cu::pod_phase(p) == "Pending" {
        create_missing_persistent_volume_claims(ctx, set, p).await?;
    }
    if i.monotonic && (cu::is_pod_terminating(p) || !is_healthy(p, i.min_ready, i.now)) {
        return Ok(true);
    }
    if !claims_match_retention_policy(ctx, set, p) {
        update_stateful_pod(ctx, set, pods_api, p).await?;
    }
    Ok(false)
}

async fn delete_pod(ctx: &Ctx, set: &StatefulSet, pods_api: &Api<Pod>, p: &Pod) -> anyhow::Result<()> {
    let pname = p.metadata.name.clone().unwrap_or_default();
    match pods_api.delete(&pname, &DeleteParams::default()).await {
        Ok(_) => {
            record_pod_event(ctx, set, "delete", &pname, None).await;
            Ok(())
        }
        Err(e) if cu::is_not_found(&e) => Ok(()),
        Err(e) => {
            record_pod_event(ctx, set, "delete", &pname, Some(&crate::replicaset::api_message(&e))).await;
            Err(e.into())
        }
    }
}

/// Upstream's `recordPodEvent`: `Successful<Verb>` / `Failed<Verb>` on the set.
async fn record_pod_event(ctx: &Ctx, set: &StatefulSet, verb: &str, pod: &str, err: Option<&str>) {
    let set_name = set.metadata.name.as_deref().unwrap_or_default();
    let title = title(verb);
    match err {
        None => {
            let msg = format!("{verb} Pod {pod} in StatefulSet {set_name} successful");
            ctx.recorder.event(set, "Normal", &format!("Successful{title}"), &msg);
        }
        Some(e) => {
            let msg = format!("{verb} Pod {pod} in StatefulSet {set_name} failed error: {e}");
            ctx.recorder.event(set, "Warning", &format!("Failed{title}"), &msg);
        }
    }
}

/// Upstream's `recordClaimEvent`.
async fn record_claim_event(ctx: &Ctx, set: &StatefulSet, pod: &str, claim: &str, err: Option<&str>) {
    let set_name = set.metadata.name.as_deref().unwrap_or_default();
    match err {
        None => {
            let msg = format!("create Claim {claim} Pod {pod} in StatefulSet {set_name} success");
            ctx.recorder.event(set, "Normal", "SuccessfulCreate", &msg);
        }
        Some(e) => {
            let msg = format!("create Claim {claim} for Pod {pod} in StatefulSet {set_name} failed error: {e}");
            ctx.recorder.event(set, "Warning", "FailedCreate", &msg);
        }
    }
}

fn title(verb: &str) -> String {
    let mut c = verb.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

/// Upstream's `utilerrors.NewAggregate(...).Error()`: one message alone, several in brackets
/// (each once).
fn aggregate(errs: &[String]) -> String {
    let mut seen = std::collections::HashSet::new();
    let unique: Vec<&str> = errs.iter().map(String::as_str).filter(|e| seen.insert(*e)).collect();
    match unique.as_slice() {
        [one] => one.to_string(),
        many => format!("[{}]", many.join(", ")),
    }
}

/// Upstream's `CreateStatefulPod`: the claims first (none may be being deleted), then the pod,
/// then the claims' ownerReferences as the retention policy wants them.
async fn create_stateful_pod(ctx: &Ctx, set: &StatefulSet, pods_api: &Api<Pod>, pod: &Pod) -> anyhow::Result<()> {
    let pname = pod.metadata.name.clone().unwrap_or_default();
    if let Err(e) = create_persistent_volume_claims(ctx, set, pod).await {
        record_pod_event(ctx, set, "create", &pname, Some(&e)).await;
        anyhow::bail!(e);
    }
    match pods_api.create(&PostParams::default(), pod).await {
        Ok(_) => {}
        // Seen by a later pass (as upstream, no event).
        Err(e) if cu::is_already_exists(&e) => return Err(e.into()),
        Err(e) => {
            record_pod_event(ctx, set, "create", &pname, Some(&crate::replicaset::api_message(&e))).await;
            return Err(e.into());
        }
    }
    if let Err(e) = update_pod_claim_for_retention_policy(ctx, set, pod).await {
        record_pod_event(ctx, set, "update", &pname, Some(&format!("{e:#}"))).await;
        return Err(e);
    }
    record_pod_event(ctx, set, "create", &pname, None).await;
    Ok(())
}

/// Upstream's `createMissingPersistentVolumeClaims`: for a pending pod.
async fn create_missing_persistent_volume_claims(ctx: &Ctx, set: &StatefulSet, pod: &Pod) -> anyhow::Result<()> {
    create_persistent_volume_claims(ctx, set, pod)
        .await
        .map_err(anyhow::Error::msg)?;
    if let Err(e) = update_pod_claim_for_retention_policy(ctx, set, pod).await {
        let pname = pod.metadata.name.as_deref().unwrap_or_default();
        record_pod_event(ctx, set, "update", pname, Some(&format!("{e:#}"))).await;
        return Err(e);
    }
    Ok(())
}

/// Upstream's `UpdateStatefulPod`, for what this controller keeps up to date on a running pod:
/// its claims' ownerReferences; the pod is then written back as upstream does.
async fn update_stateful_pod(ctx: &Ctx, set: &StatefulSet, pods_api: &Api<Pod>, p: &Pod) -> anyhow::Result<()> {
    let pname = p.metadata.name.clone().unwrap_or_default();
    if let Err(e) = update_pod_claim_for_retention_policy(ctx, set, p).await {
        record_pod_event(ctx, set, "update", &pname, Some(&format!("{e:#}"))).await;
        return Err(e);
    }
    match pods_api.replace(&pname, &PostParams::default(), p).await {
        Ok(_) => {
            record_pod_event(ctx, set, "update", &pname, None).await;
            Ok(())
        }
        Err(e) => {
            record_pod_event(ctx, set, "update", &pname, Some(&crate::replicaset::api_message(&e))).await;
            Err(e.into())
        }
    }
}

/// The PVC retention policy: (whenDeleted, whenScaled), `Retain` by default (upstream's
/// `getPersistentVolumeClaimRetentionPolicy`).
fn retention(set: &StatefulSet) -> (String, String) {
    let p = set
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_claim_retention_policy.clone())
        .unwrap_or_default();
    (
        p.when_deleted.unwrap_or_else(|| RETAIN.into()),
        p.when_scaled.unwrap_or_else(|| RETAIN.into()),
    )
}

const RETAIN: &str = "Retain";
const DELETE: &str = "Delete";
const SET_API_VERSION: &str = "apps/v1";
const SET_KIND: &str = "StatefulSet";
const POD_API_VERSION: &str = "v1";
const POD_KIND: &str = "Pod";

/// An owner as the ownerReference checks see it: (apiVersion, kind, name, uid).
struct Owner<'a> {
    api_version: &'static str,
    kind: &'static str,
    name: &'a str,
    uid: &'a str,
}

impl<'a> Owner<'a> {
    fn set(set: &'a StatefulSet) -> Self {
        Owner {
            api_version: SET_API_VERSION,
            kind: SET_KIND,
            name: set.metadata.name.as_deref().unwrap_or_default(),
            uid: set.metadata.uid.as_deref().unwrap_or_default(),
        }
    }

    fn pod(pod: &'a Pod) -> Self {
        Owner {
            api_version: POD_API_VERSION,
            kind: POD_KIND,
            name: pod.metadata.name.as_deref().unwrap_or_default(),
            uid: pod.metadata.uid.as_deref().unwrap_or_default(),
        }
    }

    /// Upstream's `matchesRef`: same group/version, kind and name (not uid).
    fn matches(&self, r: &OwnerReference) -> bool {
        r.api_version == self.api_version && r.kind == self.kind && r.name == self.name
    }

    /// Upstream's `metav1.NewControllerRef`.
    fn controller_ref(&self) -> OwnerReference {
        OwnerReference {
            api_version: self.api_version.to_string(),
            kind: self.kind.to_string(),
            name: self.name.to_string(),
            uid: self.uid.to_string(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }
}

fn owner_refs(claim: &PersistentVolumeClaim) -> &[OwnerReference] {
    claim.metadata.owner_references.as_deref().unwrap_or_default()
}

/// Upstream's `hasOwnerRef`: a reference with the owner's uid, controller or not.
fn has_owner_ref(claim: &PersistentVolumeClaim, owner: &Owner) -> bool {
    owner_refs(claim).iter().any(|r| r.uid == owner.uid)
}

/// Upstream's `hasStaleOwnerRef`: the first reference naming the owner has another uid (a
/// previous set or pod of that name).
fn has_stale_owner_ref(claim: &PersistentVolumeClaim, owner: &Owner) -> bool {
    owner_refs(claim)
        .iter()
        .find(|r| owner.matches(r))
        .is_some_and(|r| r.uid != owner.uid)
}

/// Upstream's `hasUnexpectedController`: with a Delete policy, a controller of the claim that is
/// neither the set nor the pod (or a set or pod of the same name with another uid).
fn has_unexpected_controller(claim: &PersistentVolumeClaim, set: &StatefulSet, pod: &Pod) -> bool {
    let (when_deleted, when_scaled) = retention(set);
    if when_deleted == RETAIN && when_scaled == RETAIN {
        return false;
    }
    let (s, p) = (Owner::set(set), Owner::pod(pod));
    for r in owner_refs(claim) {
        if s.matches(r) {
            if r.uid != s.uid {
                return true;
            }
            continue;
        }
        if p.matches(r) {
            if r.uid != p.uid {
                return true;
            }
            continue;
        }
        if r.controller == Some(true) {
            return true;
        }
    }
    false
}

/// Upstream's `hasNonControllerOwner`: the set or pod owns the claim without controlling it.
fn has_non_controller_owner(claim: &PersistentVolumeClaim, set: &StatefulSet, pod: &Pod) -> bool {
    let (s, p) = (Owner::set(set), Owner::pod(pod));
    owner_refs(claim)
        .iter()
        .any(|r| (r.uid == s.uid || r.uid == p.uid) && r.controller != Some(true))
}

/// Upstream's `podInOrdinalRange`.
fn pod_in_ordinal_range(pod: &Pod, set: &StatefulSet) -> bool {
    let set_name = set.metadata.name.as_deref().unwrap_or_default();
    let Some(ord) = pod.metadata.name.as_deref().and_then(|n| ordinal_of(set_name, n)) else {
        return false;
    };
    let spec = set.spec.as_ref();
    let start = spec
        .and_then(|s| s.ordinals.as_ref())
        .and_then(|o| o.start)
        .unwrap_or(0);
    let replicas = spec.and_then(|s| s.replicas).unwrap_or(1);
    ord >= start && ord < start + replicas
}

/// Upstream's `isClaimOwnerUpToDate`: whether the claim's ownerReferences are what the retention
/// policy wants for this pod: no reference (Retain/Retain), the set's (whenDeleted Delete), the
/// pod's once it is scaled down (whenScaled Delete). Claims with stale references (a previous
/// set or pod of the same name) are left alone.
pub fn is_claim_owner_up_to_date(claim: &PersistentVolumeClaim, set: &StatefulSet, pod: &Pod) -> bool {
    let (s, p) = (Owner::set(set), Owner::pod(pod));
    if has_stale_owner_ref(claim, &s) || has_stale_owner_ref(claim, &p) {
        return true;
    }
    if has_unexpected_controller(claim, set, pod) {
        // Our own references are to be removed; otherwise nothing is to be added on top.
        return !(has_owner_ref(claim, &s) || has_owner_ref(claim, &p));
    }
    if has_non_controller_owner(claim, set, pod) {
        return false;
    }
    let scaled_down = !pod_in_ordinal_range(pod, set);
    match retention(set) {
        (d, w) if d == DELETE && w == RETAIN => has_owner_ref(claim, &s) && !has_owner_ref(claim, &p),
        (d, w) if d == RETAIN && w == DELETE => !has_owner_ref(claim, &s) && scaled_down == has_owner_ref(claim, &p),
        (d, w) if d == DELETE && w == DELETE => {
            scaled_down != has_owner_ref(claim, &s) && scaled_down == has_owner_ref(claim, &p)
        }
        // Retain/Retain (and any unknown value, treated as Retain).
        _ => !(has_owner_ref(claim, &s) || has_owner_ref(claim, &p)),
    }
}

/// Upstream's `updateClaimOwnerRefForSetAndPod`: the claim's references to the set and pod
/// replaced by what the retention policy wants (none at all when another controller owns it).
pub fn update_claim_owner_refs(claim: &mut PersistentVolumeClaim, set: &StatefulSet, pod: &Pod) {
    let unexpected = has_unexpected_controller(claim, set, pod);
    let (s, p) = (Owner::set(set), Owner::pod(pod));
    let mut refs: Vec<OwnerReference> = owner_refs(claim)
        .iter()
        .filter(|r| !s.matches(r) && !p.matches(r))
        .cloned()
        .collect();
    if !unexpected {
        let scaled_down = !pod_in_ordinal_range(pod, set);
        let mut add = |owner: &Owner| {
            if !refs.iter().any(|r| r.uid == owner.uid) {
                refs.push(owner.controller_ref());
            }
        };
        let (when_deleted, when_scaled) = retention(set);
        let (deletes, scales) = (when_deleted == DELETE, when_scaled == DELETE);
        // Retain/Retain (or an unknown value): no reference. Otherwise the pod owns the claim
        // once scaled down (whenScaled Delete), the set while the pod is in range (whenDeleted
        // Delete) or always (whenScaled Retain).
        let known = [&when_deleted, &when_scaled]
            .iter()
            .all(|v| *v == RETAIN || *v == DELETE);
        if !known {
            tracing::error!(?when_deleted, ?when_scaled, "unknown policy, treating as Retain");
        } else if scales && scaled_down {
            add(&p);
        } else if deletes && (when_scaled == RETAIN || (scales && !scaled_down)) {
            add(&s);
        }
    }
    claim.metadata.owner_references = (!refs.is_empty()).then_some(refs);
}

/// Upstream's `getPersistentVolumeClaims`: the pod's claims from the set's templates, named
/// `<template>-<set>-<ordinal>`, labelled with the set's selector labels; keyed by template name.
pub fn pod_claims(set: &StatefulSet, pod: &Pod) -> Vec<(String, PersistentVolumeClaim)> {
    let set_name = set.metadata.name.clone().unwrap_or_default();
    let Some(ord) = pod.metadata.name.as_deref().and_then(|n| ordinal_of(&set_name, n)) else {
        return Vec::new();
    };
    let spec = set.spec.clone().unwrap_or_default();
    let selector_labels = spec.selector.match_labels.clone().unwrap_or_default();
    spec.volume_claim_templates
        .unwrap_or_default()
        .into_iter()
        .map(|t| {
            let template = t.metadata.name.clone().unwrap_or_default();
            let mut claim = t;
            claim.metadata.name = Some(claim_name(&template, &set_name, ord));
            claim.metadata.namespace = set.metadata.namespace.clone();
            let labels = claim.metadata.labels.get_or_insert_with(BTreeMap::new);
            for (k, v) in &selector_labels {
                labels.insert(k.clone(), v.clone());
            }
            if labels.is_empty() {
                claim.metadata.labels = None;
            }
            claim.status = None;
            (template, claim)
        })
        .collect()
}

fn cached_claim(ctx: &Ctx, ns: &str, name: &str) -> Option<PersistentVolumeClaim> {
    ctx.claims.get(&ObjectRef::new(name).within(ns)).map(|c| (*c).clone())
}

/// Upstream's `ClaimsMatchRetentionPolicy`: every existing claim of the pod is up to date (a
/// missing one is picked up by a later pass).
fn claims_match_retention_policy(ctx: &Ctx, set: &StatefulSet, pod: &Pod) -> bool {
    let ns = set.metadata.namespace.as_deref().unwrap_or_default();
    pod_claims(set, pod).iter().all(|(_, c)| {
        cached_claim(ctx, ns, c.metadata.name.as_deref().unwrap_or_default())
            .is_none_or(|claim| is_claim_owner_up_to_date(&claim, set, pod))
    })
}

/// Upstream's `UpdatePodClaimForRetentionPolicy`: each of the pod's claims whose ownerReferences
/// are not what the policy wants is updated (a conflicting controller is reported).
async fn update_pod_claim_for_retention_policy(ctx: &Ctx, set: &StatefulSet, pod: &Pod) -> anyhow::Result<()> {
    let ns = set.metadata.namespace.as_deref().unwrap_or_default();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
    for (_, c) in pod_claims(set, pod) {
        let cname = c.metadata.name.clone().unwrap_or_default();
        let Some(mut claim) = cached_claim(ctx, ns, &cname) else {
            tracing::debug!(claim = %cname, "expected claim missing, continuing to pick up in next iteration");
            continue;
        };
        if has_unexpected_controller(&claim, set, pod) {
            let msg = format!(
                "PersistentVolumeClaim {cname} has a conflicting OwnerReference that acts as a manging controller, \
                 the retention policy is ignored for this claim"
            );
            ctx.recorder.event(set, "Warning", "ConflictingController", &msg);
        }
        if !is_claim_owner_up_to_date(&claim, set, pod) {
            update_claim_owner_refs(&mut claim, set, pod);
            // An update, as upstream's (its role may update claims, not patch them).
            api.replace(&cname, &PostParams::default(), &claim)
                .await
                .map_err(|e| anyhow::anyhow!("could not update claim {cname} for delete policy ownerRefs: {e}"))?;
        }
    }
    Ok(())
}

/// Upstream's `PodClaimIsStale`: with whenScaled Delete, a claim of the ordinal still referring
/// to a previous pod of that name (it goes with that pod) blocks the new pod.
fn pod_claim_is_stale(ctx: &Ctx, set: &StatefulSet, pod: &Pod) -> bool {
    if retention(set).1 == RETAIN {
        return false;
    }
    let ns = set.metadata.namespace.as_deref().unwrap_or_default();
    pod_claims(set, pod).iter().any(|(_, c)| {
        cached_claim(ctx, ns, c.metadata.name.as_deref().unwrap_or_default())
            .is_some_and(|claim| has_stale_owner_ref(&claim, &Owner::pod(pod)))
    })
}

/// Upstream's `createPersistentVolumeClaims`: each missing claim of the pod is created (with the
/// ownerReferences the retention policy wants, for a pod in range); one being deleted is an
/// error, so the pod waits for it to go. The error text is upstream's aggregate.
async fn create_persistent_volume_claims(ctx: &Ctx, set: &StatefulSet, pod: &Pod) -> Result<(), String> {
    let ns = set.metadata.namespace.clone().unwrap_or_default();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let pname = pod.metadata.name.clone().unwrap_or_default();
    let mut errs: Vec<String> = Vec::new();
    for (_, mut claim) in pod_claims(set, pod) {
        let cname = claim.metadata.name.clone().unwrap_or_default();
        match cached_claim(ctx, &ns, &cname) {
            Some(existing) => {
                if existing.metadata.deletion_timestamp.is_some() {
                    errs.push(format!("pvc {cname} is being deleted"));
                }
            }
            None => {
                update_claim_owner_refs(&mut claim, set, pod);
                match api.create(&PostParams::default(), &claim).await {
                    Ok(_) => record_claim_event(ctx, set, &pname, &cname, None).await,
                    Err(e) if cu::is_already_exists(&e) => {
                        errs.push(format!(
                            "failed to create PVC {cname}: {}",
                            crate::replicaset::api_message(&e)
                        ));
                    }
                    Err(e) => {
                        let msg = crate::replicaset::api_message(&e);
                        errs.push(format!("failed to create PVC {cname}: {msg}"));
                        record_claim_event(ctx, set, &pname, &cname, Some(&msg)).await;
                    }
                }
            }
        }
    }
    if errs.is_empty() { Ok(()) } else { Err(aggregate(&errs)) }
}

/// Upstream's `getStatefulSetRevisions`: (current, update, collision count).
async fn revisions(
    cr_api: &Api<ControllerRevision>,
    set: &StatefulSet,
    revs: &[ControllerRevision],
) -> anyhow::Result<(ControllerRevision, ControllerRevision, i32)> {
    let template = set.spec.as_ref().map(|s| s.template.clone()).unwrap_or_default();
    let mut collision = set.status.as_ref().and_then(|s| s.collision_count).unwrap_or(0);
    let next = history::max_revision(revs) + 1;
    let equal: Vec<&ControllerRevision> = revs.iter().filter(|r| history::matches(r, &template)).collect();
    let update = match (equal.last(), revs.last()) {
        (Some(e), Some(latest)) if e.metadata.name == latest.metadata.name => (*e).clone(),
        (Some(e), _) => {
            let mut r = (*e).clone();
            r.revision = next;
            cr_api
                .replace(
                    r.metadata.name.as_deref().unwrap_or_default(),
                    &PostParams::default(),
                    &r,
                )
                .await?
        }
        (None, _) => {
            let set_name = set.metadata.name.clone().unwrap_or_default();
            let data = history::template_patch(&template);
            let base_hash = history::hash_revision(&data, None);
            loop {
                let hash = history::hash_revision(&data, Some(collision));
                let name = history::revision_name(&set_name, &hash);
                let mut rev =
                    history::new_revision(&set.metadata, "StatefulSet", name.clone(), &base_hash, &template, next);
                // Upstream's newRevision copies the set's annotations (`kubernetes.io/change-cause`
                // among them, what `kubectl rollout history` prints).
                rev.metadata.annotations = set.metadata.annotations.clone();
                match cr_api.create(&PostParams::default(), &rev).await {
                    Ok(r) => break r,
                    Err(e) if cu::is_already_exists(&e) => {
                        let existing = cr_api.get(&name).await?;
                        if history::matches(&existing, &template) {
                            break existing;
                        }
                        collision += 1;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
    };
    let current_name = set.status.as_ref().and_then(|s| s.current_revision.clone());
    let current = revs
        .iter()
        .find(|r| r.metadata.name.is_some() && r.metadata.name == current_name)
        .cloned()
        .unwrap_or_else(|| update.clone());
    Ok((current, update, collision))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::{
        RollingUpdateStatefulSetStrategy, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
        StatefulSetUpdateStrategy,
    };
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    #[test]
    fn ordinals_parse_only_exact_names() {
        assert_eq!(ordinal_of("web", "web-0"), Some(0));
        assert_eq!(ordinal_of("web", "web-12"), Some(12));
        assert_eq!(ordinal_of("web", "web-01"), None);
        assert_eq!(ordinal_of("web", "web-x"), None);
        assert_eq!(ordinal_of("web", "webby-1"), None);
        assert_eq!(ordinal_of("web", "web-1-2"), None);
    }

    fn set(partition: Option<i32>) -> StatefulSet {
        let pvc = PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("www".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        StatefulSet {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            spec: Some(StatefulSetSpec {
                service_name: Some("nginx".into()),
                volume_claim_templates: Some(vec![pvc]),
                update_strategy: Some(StatefulSetUpdateStrategy {
                    type_: Some("RollingUpdate".into()),
                    rolling_update: Some(RollingUpdateStatefulSetStrategy {
                        partition,
                        max_unavailable: None,
                    }),
                }),
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some([("app".to_string(), "nginx".to_string())].into()),
                        ..Default::default()
                    }),
                    spec: Some(PodSpec::default()),
                },
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn pods_have_stable_identity_and_storage() {
        let s = set(None);
        let t = s.spec.as_ref().map(|s| s.template.clone()).unwrap_or_default();
        let p = new_pod(&s, &t, 1, "web-abc");
        assert_eq!(p.metadata.name.as_deref(), Some("web-1"));
        let labels = p.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get(POD_NAME_LABEL).map(String::as_str), Some("web-1"));
        assert_eq!(labels.get(POD_INDEX_LABEL).map(String::as_str), Some("1"));
        assert_eq!(
            labels.get("controller-revision-hash").map(String::as_str),
            Some("web-abc")
        );
        let spec = p.spec.unwrap_or_default();
        assert_eq!(spec.hostname.as_deref(), Some("web-1"));
        assert_eq!(spec.subdomain.as_deref(), Some("nginx"));
        let vols = spec.volumes.unwrap_or_default();
        assert_eq!(
            vols[0].persistent_volume_claim.as_ref().map(|c| c.claim_name.as_str()),
            Some("www-web-1")
        );
    }

    #[test]
    fn partition_keeps_low_ordinals_on_the_current_revision() {
        let s = set(Some(2));
        assert!(use_current_revision(&s, 0, 0));
        assert!(use_current_revision(&s, 1, 0));
        assert!(!use_current_revision(&s, 2, 0));
        let s0 = set(Some(0));
        assert!(!use_current_revision(&s0, 0, 0));
    }

    fn with_policy(when_deleted: &str, when_scaled: &str, replicas: i32) -> StatefulSet {
        let mut s = set(None);
        let spec = s.spec.as_mut().unwrap();
        spec.replicas = Some(replicas);
        spec.selector.match_labels = Some([("app".to_string(), "nginx".to_string())].into());
        spec.persistent_volume_claim_retention_policy = Some(StatefulSetPersistentVolumeClaimRetentionPolicy {
            when_deleted: Some(when_deleted.into()),
            when_scaled: Some(when_scaled.into()),
        });
        s
    }

    fn live_pod(name: &str, uid: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: (!uid.is_empty()).then(|| uid.to_string()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn claim_of(s: &StatefulSet, pod: &Pod) -> PersistentVolumeClaim {
        pod_claims(s, pod).remove(0).1
    }

    /// The claim's owners as (kind, uid, controller).
    fn owners(c: &PersistentVolumeClaim) -> Vec<(String, String, bool)> {
        owner_refs(c)
            .iter()
            .map(|r| (r.kind.clone(), r.uid.clone(), r.controller == Some(true)))
            .collect()
    }

    fn fixed(s: &StatefulSet, pod: &Pod, mut c: PersistentVolumeClaim) -> PersistentVolumeClaim {
        if !is_claim_owner_up_to_date(&c, s, pod) {
            update_claim_owner_refs(&mut c, s, pod);
        }
        assert!(is_claim_owner_up_to_date(&c, s, pod), "{:?}", owners(&c));
        c
    }

    #[test]
    fn claims_are_named_and_labelled_from_the_templates() {
        let mut s = with_policy("Retain", "Retain", 2);
        s.spec.as_mut().unwrap().volume_claim_templates.as_mut().unwrap()[0]
            .metadata
            .labels = Some([("tier".to_string(), "db".to_string())].into());
        let claims = pod_claims(&s, &live_pod("web-1", "p1"));
        assert_eq!(claims.len(), 1);
        let (template, c) = &claims[0];
        assert_eq!(template, "www");
        assert_eq!(c.metadata.name.as_deref(), Some("www-web-1"));
        assert_eq!(c.metadata.namespace.as_deref(), Some("default"));
        let labels = c.metadata.labels.clone().unwrap();
        assert_eq!(labels.get("tier").map(String::as_str), Some("db"));
        assert_eq!(labels.get("app").map(String::as_str), Some("nginx"));
        assert!(pod_claims(&s, &live_pod("other-1", "p")).is_empty());
        assert!(claim_belongs_to(c, &s));
        let mut stranger = c.clone();
        stranger.metadata.name = Some("www-webby-1".into());
        assert!(!claim_belongs_to(&stranger, &s));
    }

    #[test]
    fn owner_references_follow_each_policy() {
        let in_range = live_pod("web-0", "pod-0");
        let condemned = live_pod("web-2", "pod-2");
        let set_ref = ("StatefulSet".to_string(), "u1".to_string(), true);
        type Owners = Vec<(String, String, bool)>;
        let cases: [(&str, &str, Owners, Owners); 4] = [
            ("Retain", "Retain", vec![], vec![]),
            ("Delete", "Retain", vec![set_ref.clone()], vec![set_ref.clone()]),
            (
                "Retain",
                "Delete",
                vec![],
                vec![("Pod".to_string(), "pod-2".to_string(), true)],
            ),
            (
                "Delete",
                "Delete",
                vec![set_ref.clone()],
                vec![("Pod".to_string(), "pod-2".to_string(), true)],
            ),
        ];
        for (when_deleted, when_scaled, kept, scaled) in cases {
            let s = with_policy(when_deleted, when_scaled, 2);
            let c = fixed(&s, &in_range, claim_of(&s, &in_range));
            assert_eq!(owners(&c), kept, "{when_deleted}/{when_scaled} in range");
            let c = fixed(&s, &condemned, claim_of(&s, &condemned));
            assert_eq!(owners(&c), scaled, "{when_deleted}/{when_scaled} scaled down");
            if let Some(r) = c.metadata.owner_references.as_ref().and_then(|r| r.first()) {
                assert_eq!(r.block_owner_deletion, Some(true));
                assert_eq!(r.name, if r.kind == "Pod" { "web-2" } else { "web" });
            }
        }
    }

    #[test]
    fn a_policy_change_moves_existing_claims() {
        let pod = live_pod("web-0", "pod-0");
        let retain = with_policy("Retain", "Retain", 1);
        let c = fixed(&retain, &pod, claim_of(&retain, &pod));
        assert!(owners(&c).is_empty());
        // whenDeleted Delete: the set takes the claim.
        let delete = with_policy("Delete", "Retain", 1);
        assert!(!is_claim_owner_up_to_date(&c, &delete, &pod));
        let c = fixed(&delete, &pod, c);
        assert_eq!(owners(&c), [("StatefulSet".to_string(), "u1".to_string(), true)]);
        // Back to Retain: the reference goes.
        assert!(!is_claim_owner_up_to_date(&c, &retain, &pod));
        assert!(owners(&fixed(&retain, &pod, c)).is_empty());
    }

    #[test]
    fn scaling_back_up_takes_the_claim_back_from_the_pod() {
        let pod = live_pod("web-1", "pod-1");
        let scaled_down = with_policy("Delete", "Delete", 1);
        let c = fixed(&scaled_down, &pod, claim_of(&scaled_down, &pod));
        assert_eq!(owners(&c), [("Pod".to_string(), "pod-1".to_string(), true)]);
        // The pod is in range again before it was deleted: the set owns the claim again.
        let scaled_up = with_policy("Delete", "Delete", 2);
        assert!(!is_claim_owner_up_to_date(&c, &scaled_up, &pod));
        let c = fixed(&scaled_up, &pod, c);
        assert_eq!(owners(&c), [("StatefulSet".to_string(), "u1".to_string(), true)]);
    }

    #[test]
    fn claims_of_a_previous_pod_are_stale_and_left_alone() {
        let s = with_policy("Retain", "Delete", 1);
        let old = live_pod("web-1", "old-uid");
        let c = fixed(&s, &old, claim_of(&s, &old));
        // A new pod of that name (not created yet, no uid) must wait for the claim to go.
        let new = live_pod("web-1", "");
        assert!(has_stale_owner_ref(&c, &Owner::pod(&new)));
        let scaled_up = with_policy("Retain", "Delete", 2);
        assert!(is_claim_owner_up_to_date(&c, &scaled_up, &new));
        // Another controller's claim: our references are removed, none added.
        let mut foreign = claim_of(&s, &new);
        foreign.metadata.owner_references = Some(vec![
            OwnerReference {
                api_version: "example.com/v1".into(),
                kind: "Database".into(),
                name: "db".into(),
                uid: "db-uid".into(),
                controller: Some(true),
                block_owner_deletion: None,
            },
            Owner::set(&scaled_up).controller_ref(),
        ]);
        let pod = live_pod("web-0", "pod-0");
        assert!(has_unexpected_controller(&foreign, &scaled_up, &pod));
        let c = fixed(&scaled_up, &pod, foreign);
        assert_eq!(owners(&c), [("Database".to_string(), "db-uid".to_string(), true)]);
    }

    #[test]
    fn a_non_controller_reference_is_made_a_controller() {
        let s = with_policy("Delete", "Retain", 1);
        let pod = live_pod("web-0", "pod-0");
        let mut c = claim_of(&s, &pod);
        let mut r = Owner::set(&s).controller_ref();
        r.controller = None;
        c.metadata.owner_references = Some(vec![r]);
        assert!(!is_claim_owner_up_to_date(&c, &s, &pod));
        let c = fixed(&s, &pod, c);
        assert_eq!(owners(&c), [("StatefulSet".to_string(), "u1".to_string(), true)]);
    }

    #[test]
    fn errors_read_as_upstream_aggregates() {
        assert_eq!(aggregate(&["pvc a is being deleted".into()]), "pvc a is being deleted");
        assert_eq!(aggregate(&["x".into(), "y".into(), "x".into()]), "[x, y]");
        assert_eq!(title("create"), "Create");
    }
}
