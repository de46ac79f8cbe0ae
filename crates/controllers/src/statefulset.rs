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
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};

use crate::controller_utils::{self as cu, Recorder, WorkQueue};
use crate::history;

pub const COMPONENT: &str = "statefulset-controller";
pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";

struct Ctx {
    client: kube::Client,
    recorder: Recorder,
}

pub async fn run(client: kube::Client) -> anyhow::Result<()> {
    let queue = WorkQueue::new();
    let store = cu::spawn_owner_watch(Api::<StatefulSet>::all(client.clone()), queue.clone());
    let s = store.clone();
    cu::spawn_watch(Api::<Pod>::all(client.clone()), queue.clone(), move |p: &Pod| {
        cu::owner_keys(&s, &p.metadata, "StatefulSet", |d: &StatefulSet| {
            d.spec.as_ref().map(|s| &s.selector)
        })
    });
    let ctx = Ctx {
        recorder: Recorder::new(client.clone(), COMPONENT),
        client,
    };
    queue.run("statefulset", |key| sync(&ctx, key)).await
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

/// Upstream's `updateStatefulSet` core: create / replace, then scale down, then update.
async fn act(ctx: &Ctx, set: &StatefulSet, pods_api: &Api<Pod>, i: ActInput<'_>) -> anyhow::Result<()> {
    let spec = set.spec.clone().unwrap_or_default();
    let set_name = set.metadata.name.clone().unwrap_or_default();
    let mut acted = false;
    for (idx, slot) in i.slots.iter().enumerate() {
        let ord = i.start + idx as i32;
        match slot {
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
                create_claims(ctx, set, ord).await?;
                let pname = pod.metadata.name.clone().unwrap_or_default();
                match pods_api.create(&PostParams::default(), &pod).await {
                    Ok(_) => {
                        let msg = format!("create Pod {pname} in StatefulSet {set_name} successful");
                        ctx.recorder.event(set, "Normal", "SuccessfulCreate", &msg).await;
                    }
                    Err(e) if cu::is_already_exists(&e) => {}
                    Err(e) => {
                        let msg = format!(
                            "create Pod {pname} in StatefulSet {set_name} failed error: {}",
                            crate::replicaset::api_message(&e)
                        );
                        ctx.recorder.event(set, "Warning", "FailedCreate", &msg).await;
                        return Err(e.into());
                    }
                }
                acted = true;
                if i.monotonic {
                    return Ok(());
                }
            }
            Some(p) => {
                if matches!(cu::pod_phase(p), "Failed" | "Succeeded") && !cu::is_pod_terminating(p) {
                    delete_pod(ctx, set, pods_api, p).await?;
                    acted = true;
                    if i.monotonic {
                        return Ok(());
                    }
                    continue;
                }
                if i.monotonic && !is_healthy(p, i.min_ready, i.now) {
                    return Ok(());
                }
                create_claims(ctx, set, ord).await?;
            }
        }
    }
    if acted {
        return Ok(());
    }
    // Scale down, highest ordinal first.
    let first_unhealthy = i
        .slots
        .iter()
        .flatten()
        .chain(i.condemned.iter().map(|(_, p)| p))
        .find(|p| !is_healthy(p, i.min_ready, i.now))
        .and_then(|p| p.metadata.name.clone());
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
        if retention(set).1 == "Delete" {
            own_claims_by_pod(ctx, set, p).await?;
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

async fn delete_pod(ctx: &Ctx, set: &StatefulSet, pods_api: &Api<Pod>, p: &Pod) -> anyhow::Result<()> {
    let pname = p.metadata.name.clone().unwrap_or_default();
    let set_name = set.metadata.name.clone().unwrap_or_default();
    match pods_api.delete(&pname, &DeleteParams::default()).await {
        Ok(_) => {
            let msg = format!("delete Pod {pname} in StatefulSet {set_name} successful");
            ctx.recorder.event(set, "Normal", "SuccessfulDelete", &msg).await;
            Ok(())
        }
        Err(e) if cu::is_not_found(&e) => Ok(()),
        Err(e) => {
            let msg = format!(
                "delete Pod {pname} in StatefulSet {set_name} failed error: {}",
                crate::replicaset::api_message(&e)
            );
            ctx.recorder.event(set, "Warning", "FailedDelete", &msg).await;
            Err(e.into())
        }
    }
}

/// The PVC retention policy: (whenDeleted, whenScaled), `Retain` by default.
fn retention(set: &StatefulSet) -> (String, String) {
    let p = set
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_claim_retention_policy.clone())
        .unwrap_or_default();
    (
        p.when_deleted.unwrap_or_else(|| "Retain".into()),
        p.when_scaled.unwrap_or_else(|| "Retain".into()),
    )
}

/// whenScaled Delete: a condemned pod's claims get the pod as their owner instead of the set, so
/// they go with it.
async fn own_claims_by_pod(ctx: &Ctx, set: &StatefulSet, pod: &Pod) -> anyhow::Result<()> {
    let set_name = set.metadata.name.clone().unwrap_or_default();
    let Some(ord) = pod.metadata.name.as_deref().and_then(|n| ordinal_of(&set_name, n)) else {
        return Ok(());
    };
    let ns = set.metadata.namespace.clone().unwrap_or_default();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let owner = k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        controller: None,
        block_owner_deletion: None,
    };
    for t in set.spec.iter().flat_map(|s| s.volume_claim_templates.iter().flatten()) {
        let cname = claim_name(t.metadata.name.as_deref().unwrap_or_default(), &set_name, ord);
        let Some(claim) = api.get_opt(&cname).await? else {
            continue;
        };
        // The pod replaces the set as owner (upstream's `updateClaimOwnerRefForSetAndPod`).
        let mut refs = claim.metadata.owner_references.clone().unwrap_or_default();
        if refs.iter().any(|r| r.uid == owner.uid) {
            continue;
        }
        refs.retain(|r| Some(&r.uid) != set.metadata.uid.as_ref());
        refs.push(owner.clone());
        // An update, as upstream's (its role may update claims, not patch them).
        let mut updated = claim.clone();
        updated.metadata.owner_references = Some(refs);
        api.replace(&cname, &kube::api::PostParams::default(), &updated).await?;
    }
    Ok(())
}

/// Create the missing PVCs of an ordinal.
async fn create_claims(ctx: &Ctx, set: &StatefulSet, ordinal: i32) -> anyhow::Result<()> {
    let spec = set.spec.clone().unwrap_or_default();
    let Some(templates) = spec.volume_claim_templates else {
        return Ok(());
    };
    let set_name = set.metadata.name.clone().unwrap_or_default();
    let ns = set.metadata.namespace.clone().unwrap_or_default();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    for t in templates {
        let cname = claim_name(t.metadata.name.as_deref().unwrap_or_default(), &set_name, ordinal);
        if api.get_opt(&cname).await?.is_some() {
            continue;
        }
        let mut labels = t.metadata.labels.clone().unwrap_or_default();
        for (k, v) in spec.selector.match_labels.iter().flatten() {
            labels.insert(k.clone(), v.clone());
        }
        let claim = PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(cname.clone()),
                namespace: Some(ns.clone()),
                labels: Some(labels),
                annotations: t.metadata.annotations.clone(),
                owner_references: (retention(set).0 == "Delete")
                    .then(|| vec![cu::new_controller_ref(&set.metadata, "apps/v1", "StatefulSet")]),
                ..Default::default()
            },
            spec: t.spec.clone(),
            status: None,
        };
        let pod_name = format!("{set_name}-{ordinal}");
        match api.create(&PostParams::default(), &claim).await {
            Ok(_) => {
                let msg = format!("create Claim {cname} Pod {pod_name} in StatefulSet {set_name} success");
                ctx.recorder.event(set, "Normal", "SuccessfulCreate", &msg).await;
            }
            Err(e) if cu::is_already_exists(&e) => {}
            Err(e) => {
                let msg = format!(
                    "create Claim {cname} for Pod {pod_name} in StatefulSet {set_name} failed error: {}",
                    crate::replicaset::api_message(&e)
                );
                ctx.recorder.event(set, "Warning", "FailedCreate", &msg).await;
                return Err(e.into());
            }
        }
    }
    Ok(())
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
                let rev =
                    history::new_revision(&set.metadata, "StatefulSet", name.clone(), &base_hash, &template, next);
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
    use k8s_openapi::api::apps::v1::{RollingUpdateStatefulSetStrategy, StatefulSetSpec, StatefulSetUpdateStrategy};
    use k8s_openapi::api::core::v1::PodSpec;

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
}
