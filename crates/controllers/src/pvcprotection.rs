//! The PVC protection controller (upstream's `pkg/controller/volume/pvcprotection`): a
//! PersistentVolumeClaim being deleted keeps its `kubernetes.io/pvc-protection` finalizer while a
//! scheduled pod uses it, directly (`persistentVolumeClaim.claimName`) or as the claim of a
//! generic ephemeral volume (`<pod>-<volume>`, controlled by the pod, until the pod is shut down).
//! The decision looks at the cached pods first and, when none uses the claim, at a live list of
//! the namespace's pods, so a pod the cache has not seen yet still protects the claim. Claims are
//! processed by namespace, one live list shared by a namespace's claims (upstream's
//! `pvcProcessingStore`). Claims lacking the finalizer and not being deleted (created before the
//! admission plugin added it) get it.
//!
//! A pod that is deleted, terminated (Succeeded, Failed, or being deleted with no container
//! running) or not scheduled queues the claims it names, so their finalizers are looked at again.
//! As upstream, a pod that still exists and is scheduled uses the claims it names directly, in
//! whatever phase.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, PersistentVolumeClaim, Pod};
use kube::Api;
use kube::api::{ListParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};

use crate::controller_utils::{self as cu, WorkQueue};
use crate::informers::{Change, Informer, SharedInformerFactory};
use crate::protectionutil;

/// The finalizer this controller owns (upstream's `PVCProtectionFinalizer`).
pub const FINALIZER: &str = "kubernetes.io/pvc-protection";

/// Claims waiting to be processed, by namespace.
#[derive(Clone, Default)]
struct Pending(Arc<parking_lot::Mutex<HashMap<String, BTreeSet<String>>>>);

impl Pending {
    /// Remembers the claim and returns its namespace, the work queue's key.
    fn add(&self, namespace: &str, claim: &str) -> String {
        self.0
            .lock()
            .entry(namespace.to_string())
            .or_default()
            .insert(claim.to_string());
        namespace.to_string()
    }

    fn take(&self, namespace: &str) -> BTreeSet<String> {
        self.0.lock().remove(namespace).unwrap_or_default()
    }
}

struct Ctx {
    client: kube::Client,
    claims: Store<PersistentVolumeClaim>,
    pods: Informer<Pod>,
    pending: Pending,
}

pub async fn run(client: kube::Client, informers: SharedInformerFactory) -> anyhow::Result<()> {
    let queue = WorkQueue::new();
    let pending = Pending::default();
    let p = pending.clone();
    let claims = cu::spawn_store_watch(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        queue.clone(),
        move |pvc: &PersistentVolumeClaim| {
            let meta = &pvc.metadata;
            let concerned = protectionutil::need_to_add_finalizer(meta, FINALIZER)
                || protectionutil::is_deletion_candidate(meta, FINALIZER);
            match (&meta.namespace, &meta.name) {
                (Some(ns), Some(name)) if concerned => vec![p.add(ns, name)],
                _ => Vec::new(),
            }
        },
    );
    let pods = informers.informer::<Pod>();
    watch_pods(&pods, queue.clone(), pending.clone());
    pods.wait_synced().await;
    let ctx = Ctx {
        client,
        claims,
        pods,
        pending,
    };
    queue.run("pvcprotection", |ns| process_namespace(&ctx, ns)).await
}

// ---- pods ----

/// The claim a generic ephemeral volume of the pod gets (upstream's `ephemeral.VolumeClaimName`).
fn ephemeral_claim_name(pod: &Pod, volume: &str) -> String {
    format!("{}-{volume}", pod.metadata.name.as_deref().unwrap_or_default())
}

/// Every claim the pod names, directly or through a generic ephemeral volume.
pub fn claims_of(pod: &Pod) -> Vec<String> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| match (&v.persistent_volume_claim, &v.ephemeral) {
            (Some(c), _) => Some(c.claim_name.clone()),
            (None, Some(_)) => Some(ephemeral_claim_name(pod, &v.name)),
            _ => None,
        })
        .collect()
}

/// Upstream's `notRunning`: every status is terminated or waiting (or there are none).
fn not_running(statuses: Option<&Vec<ContainerStatus>>) -> bool {
    statuses.into_iter().flatten().all(|s| {
        s.state
            .as_ref()
            .is_some_and(|st| st.terminated.is_some() || st.waiting.is_some())
    })
}

/// Upstream's `volumeutil.IsPodTerminated`.
pub fn is_pod_terminated(pod: &Pod) -> bool {
    let phase = cu::pod_phase(pod);
    if phase == "Failed" || phase == "Succeeded" {
        return true;
    }
    let status = pod.status.as_ref();
    pod.metadata.deletion_timestamp.is_some()
        && not_running(status.and_then(|s| s.init_container_statuses.as_ref()))
        && not_running(status.and_then(|s| s.container_statuses.as_ref()))
        && not_running(status.and_then(|s| s.ephemeral_container_statuses.as_ref()))
}

fn node_name(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default()
}

/// Upstream's `enqueuePVCs`: the claims a pod event makes worth looking at again. A pod that is
/// running on its node cannot help a finalizer go; a deleted, terminated or unscheduled one can.
pub fn claims_to_queue(pod: &Pod, deleted: bool) -> Vec<String> {
    if !deleted && !is_pod_terminated(pod) && !node_name(pod).is_empty() {
        return Vec::new();
    }
    claims_of(pod)
}

/// Upstream's `podIsShutDown`: the kubelet is done with the pod (it confirmed the deletion with
/// a zero grace period) or the pod was force-deleted.
fn pod_is_shut_down(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some() && pod.metadata.deletion_grace_period_seconds == Some(0)
}

/// Upstream's `ephemeral.VolumeIsForPod`: the claim is in the pod's namespace and controlled by it.
fn volume_is_for_pod(pod: &Pod, pvc: &PersistentVolumeClaim) -> bool {
    pvc.metadata.namespace == pod.metadata.namespace
        && cu::controller_ref(&pvc.metadata).is_some_and(|r| Some(&r.uid) == pod.metadata.uid.as_ref())
}

/// Upstream's `podUsesPVC`. Only scheduled pods count: the node agent does not start a pod
/// whose claim is being deleted, and the scheduler does not place one.
pub fn pod_uses_pvc(pod: &Pod, pvc: &PersistentVolumeClaim) -> bool {
    if node_name(pod).is_empty() || pod.metadata.namespace != pvc.metadata.namespace {
        return false;
    }
    let claim = pvc.metadata.name.as_deref().unwrap_or_default();
    pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()).any(|v| {
        v.persistent_volume_claim
            .as_ref()
            .is_some_and(|c| c.claim_name == claim)
            || (!pod_is_shut_down(pod)
                && v.ephemeral.is_some()
                && ephemeral_claim_name(pod, &v.name) == claim
                && volume_is_for_pod(pod, pvc))
    })
}

/// Queues, for every pod change the shared pod informer reports, the claims it may free. A pod
/// replaced by another of the same name queues the first one's claims too; a pod that a re-list
/// no longer returns arrives as deleted.
fn watch_pods(pods: &Informer<Pod>, queue: WorkQueue, pending: Pending) {
    pods.add_handler(move |change| {
        let mut claims: Vec<(String, Vec<String>)> = Vec::new();
        let ns_of = |p: &Pod| p.metadata.namespace.clone().unwrap_or_default();
        match change {
            Change::Added(pod) => claims.push((ns_of(pod), claims_to_queue(pod, false))),
            Change::Updated { old, new } => {
                if old.metadata.uid != new.metadata.uid {
                    claims.push((ns_of(old), claims_of(old)));
                }
                claims.push((ns_of(new), claims_to_queue(new, false)));
            }
            Change::Deleted(pod) => claims.push((ns_of(pod), claims_to_queue(pod, true))),
        }
        for (ns, names) in claims {
            for name in names {
                queue.add(pending.add(&ns, &name));
            }
        }
    });
}

// ---- claims ----

/// The pods one namespace batch looks at: those of the cache and, once needed, of a live list.
#[derive(Default)]
struct Batch {
    cached: Option<Vec<Arc<Pod>>>,
    live: Option<Vec<Pod>>,
}

/// Upstream's `processPVCsByNamespace`: the namespace's waiting claims, sharing one live list.
/// Claims that fail wait for the namespace's next (rate-limited) turn.
async fn process_namespace(ctx: &Ctx, ns: String) -> anyhow::Result<Option<Duration>> {
    let mut batch = Batch::default();
    let mut failed: Vec<String> = Vec::new();
    for name in ctx.pending.take(&ns) {
        if let Err(e) = process_pvc(ctx, &ns, &name, &mut batch).await {
            tracing::debug!(namespace = %ns, claim = %name, error = format!("{e:#}"), "PVC protection failed");
            failed.push(name);
        }
    }
    if failed.is_empty() {
        return Ok(None);
    }
    for name in &failed {
        ctx.pending.add(&ns, name);
    }
    anyhow::bail!("PVCs {failed:?} in namespace {ns} will be retried")
}

/// Upstream's `processPVC`, on the cached claim.
async fn process_pvc(ctx: &Ctx, ns: &str, name: &str, batch: &mut Batch) -> anyhow::Result<()> {
    let Some(pvc) = ctx.claims.get(&ObjectRef::new(name).within(ns)) else {
        tracing::debug!(namespace = ns, claim = name, "PVC not found, ignoring");
        return Ok(());
    };
    if protectionutil::is_deletion_candidate(&pvc.metadata, FINALIZER) {
        if !is_being_used(ctx, &pvc, batch).await? {
            let mut updated = (*pvc).clone();
            updated.metadata.finalizers = protectionutil::without(pvc.metadata.finalizers.as_ref(), FINALIZER);
            claims_api(ctx, ns)
                .replace(name, &PostParams::default(), &updated)
                .await?;
            tracing::info!(namespace = ns, claim = name, "removed protection finalizer from PVC");
            return Ok(());
        }
        tracing::info!(namespace = ns, claim = name, "keeping PVC because it is being used");
    }
    if protectionutil::need_to_add_finalizer(&pvc.metadata, FINALIZER) {
        let mut updated = (*pvc).clone();
        updated
            .metadata
            .finalizers
            .get_or_insert_with(Vec::new)
            .push(FINALIZER.to_string());
        claims_api(ctx, ns)
            .replace(name, &PostParams::default(), &updated)
            .await?;
        tracing::debug!(namespace = ns, claim = name, "added protection finalizer to PVC");
    }
    Ok(())
}

fn claims_api(ctx: &Ctx, ns: &str) -> Api<PersistentVolumeClaim> {
    Api::namespaced(ctx.client.clone(), ns)
}

/// Upstream's `isBeingUsed`: a pod in the cache that uses the claim settles it; otherwise the
/// pods of a live list decide (the list is made once per namespace batch).
async fn is_being_used(ctx: &Ctx, pvc: &PersistentVolumeClaim, batch: &mut Batch) -> anyhow::Result<bool> {
    let ns = pvc.metadata.namespace.as_deref().unwrap_or_default();
    let cached = batch.cached.get_or_insert_with(|| ctx.pods.list_namespace(ns));
    if cached.iter().any(|p| pod_uses_pvc(p, pvc)) {
        return Ok(true);
    }
    let live = &mut batch.live;
    if live.is_none() {
        let list = Api::<Pod>::namespaced(ctx.client.clone(), ns)
            .list(&ListParams::default())
            .await
            .map_err(|e| anyhow::anyhow!("live list of pods failed: {e}"))?;
        *live = Some(list.items);
    }
    let used = live.iter().flatten().any(|p| pod_uses_pvc(p, pvc));
    if !used {
        tracing::debug!(
            namespace = ns,
            claim = pvc.metadata.name.as_deref().unwrap_or_default(),
            "PVC is unused"
        );
    }
    Ok(used)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated, EphemeralVolumeSource,
        PersistentVolumeClaimVolumeSource, PodSpec, PodStatus, Volume,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};

    fn claim(name: &str) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn pod(name: &str, node: &str, volumes: Vec<Volume>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: (!node.is_empty()).then(|| node.to_string()),
                volumes: Some(volumes),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                ..Default::default()
            }),
        }
    }

    fn pvc_volume(name: &str, claim: &str) -> Volume {
        Volume {
            name: name.into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.into(),
                read_only: None,
            }),
            ..Default::default()
        }
    }

    fn ephemeral_volume(name: &str) -> Volume {
        Volume {
            name: name.into(),
            ephemeral: Some(EphemeralVolumeSource::default()),
            ..Default::default()
        }
    }

    #[test]
    fn a_scheduled_pod_naming_the_claim_uses_it() {
        let data = claim("data");
        assert!(pod_uses_pvc(&pod("p", "n1", vec![pvc_volume("v", "data")]), &data));
        assert!(!pod_uses_pvc(&pod("p", "n1", vec![pvc_volume("v", "other")]), &data));
        // Not scheduled: the node will not start it while the claim is being deleted.
        assert!(!pod_uses_pvc(&pod("p", "", vec![pvc_volume("v", "data")]), &data));
        // Another namespace's claim of the same name.
        let mut elsewhere = claim("data");
        elsewhere.metadata.namespace = Some("other".into());
        assert!(!pod_uses_pvc(
            &pod("p", "n1", vec![pvc_volume("v", "data")]),
            &elsewhere
        ));
        // As upstream, a terminated pod that still exists keeps naming (and protecting) it.
        let mut done = pod("p", "n1", vec![pvc_volume("v", "data")]);
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        assert!(pod_uses_pvc(&done, &data));
    }

    #[test]
    fn an_ephemeral_claim_is_used_by_its_own_pod_until_shut_down() {
        let p = pod("web", "n1", vec![ephemeral_volume("scratch")]);
        let mut c = claim("web-scratch");
        // Not controlled by the pod: some other claim of that name.
        assert!(!pod_uses_pvc(&p, &c));
        c.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: "web".into(),
            uid: "uid-web".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
        assert!(pod_uses_pvc(&p, &c));
        let mut shut_down = p.clone();
        shut_down.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::now()));
        shut_down.metadata.deletion_grace_period_seconds = Some(0);
        assert!(!pod_uses_pvc(&shut_down, &c));
        // Still in its grace period: in use.
        shut_down.metadata.deletion_grace_period_seconds = Some(30);
        assert!(pod_uses_pvc(&shut_down, &c));
    }

    #[test]
    fn pods_that_may_free_a_claim_queue_it() {
        let running = pod("p", "n1", vec![pvc_volume("a", "data"), ephemeral_volume("tmp")]);
        assert_eq!(claims_of(&running), ["data", "p-tmp"]);
        assert!(claims_to_queue(&running, false).is_empty());
        assert_eq!(claims_to_queue(&running, true), ["data", "p-tmp"]);
        let unscheduled = pod("p", "", vec![pvc_volume("a", "data")]);
        assert_eq!(claims_to_queue(&unscheduled, false), ["data"]);
        let mut failed = running.clone();
        failed.status.as_mut().unwrap().phase = Some("Failed".into());
        assert_eq!(claims_to_queue(&failed, false).len(), 2);
    }

    #[test]
    fn a_deleted_pod_is_terminated_once_no_container_runs() {
        let mut p = pod("p", "n1", vec![]);
        assert!(!is_pod_terminated(&p));
        p.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::now()));
        // No statuses at all: nothing runs.
        assert!(is_pod_terminated(&p));
        let state = |running: bool| ContainerStatus {
            name: "c".into(),
            state: Some(if running {
                ContainerState {
                    running: Some(ContainerStateRunning::default()),
                    ..Default::default()
                }
            } else {
                ContainerState {
                    terminated: Some(ContainerStateTerminated::default()),
                    ..Default::default()
                }
            }),
            ..Default::default()
        };
        p.status.as_mut().unwrap().container_statuses = Some(vec![state(true)]);
        assert!(!is_pod_terminated(&p));
        p.status.as_mut().unwrap().container_statuses = Some(vec![state(false)]);
        assert!(is_pod_terminated(&p));
    }
}
