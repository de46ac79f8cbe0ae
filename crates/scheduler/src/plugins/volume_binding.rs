//! VolumeBinding: a pod's PersistentVolumeClaims decide where it may run, as upstream's
//! `volumebinding` plugin and its scheduler volume binder.
//!
//! - PreFilter: every claim must exist and not be being deleted or lost; a claim not bound yet
//!   whose class binds immediately (or that has no class) must wait for the PV binder, so the
//!   pod is unschedulable until then. Claims of a WaitForFirstConsumer class wait for the
//!   scheduler.
//! - Filter: a bound claim's volume must allow the node (its `nodeAffinity`); each unbound
//!   WaitForFirstConsumer claim needs an Available volume that fits it on the node
//!   (`FindMatchingVolume`, smallest claims first, one volume per claim) or a class that can
//!   provision there (a provisioner other than `kubernetes.io/no-provisioner`, and
//!   `allowedTopologies` matching the node). A claim that already names a selected node fits
//!   only that node.
//! - Reserve: the volumes chosen are assumed bound to their claims and the claims to provision
//!   assumed to carry `volume.kubernetes.io/selected-node`, in the scheduler's cache, so the
//!   next pod does not take them (undone if the binding fails).
//! - PreBind, on the binding task: the volumes are bound (claimRef) and the claims annotated
//!   through the API, then every claim is waited for until it is bound, with its volume still
//!   allowing the node, for at most the bind timeout (upstream's 600 s).
//!
//! There is no Score: upstream scores only with the alpha StorageCapacityScoring /
//! VolumeCapacityPriority gates, off by default in 1.33. There is no CSIStorageCapacity check
//! either: it applies only to CSIDriver objects that ask for it, and no CSIDriver is served.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::api::PostParams;
use skiff_api::volume::{
    ANN_BIND_COMPLETED, ANN_SELECTED_NODE, CLAIM_LOST, NOT_SUPPORTED_PROVISIONER, annotation, check_node_affinity,
    claim_class, claim_key, claim_phase, claim_volume_name, find_matching_volume, match_topology_selector_terms,
    requested_storage, volume_bound_to_claim,
};

use crate::assume_cache::key_of;
use crate::cache::Cache;
use crate::framework::{CycleState, Plugin, Reserved, Status};
use crate::types::{NodeInfo, PodInfo};

pub const NAME: &str = "VolumeBinding";
pub const ERR_REASON_BIND_CONFLICT: &str = "node(s) didn't find available persistent volumes to bind";
pub const ERR_REASON_NODE_CONFLICT: &str = "node(s) had volume node affinity conflict";
pub const ERR_REASON_NOT_ENOUGH_SPACE: &str = "node(s) did not have enough free storage";
pub const ERR_REASON_PV_NOT_EXIST: &str = "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)";
pub const ERR_UNBOUND_IMMEDIATE: &str = "pod has unbound immediate PersistentVolumeClaims";
/// Upstream's default `bindTimeoutSeconds`.
pub const DEFAULT_BIND_TIMEOUT: Duration = Duration::from_secs(600);
/// How often PreBind looks at the claims (upstream polls every second).
const POLL_INTERVAL: Duration = Duration::from_secs(1);

const WAIT_FOR_FIRST_CONSUMER: &str = "WaitForFirstConsumer";

/// The pod's claims as PreFilter found them, for Filter and Reserve.
#[derive(Debug, Clone, Default)]
pub struct StateData {
    /// Bound claims with their volumes (None: the volume does not exist).
    bound: Vec<(Arc<PersistentVolumeClaim>, Option<Arc<PersistentVolume>>)>,
    /// Claims of WaitForFirstConsumer classes not bound yet, smallest request first.
    delay: Vec<Arc<PersistentVolumeClaim>>,
    /// The volumes of those claims' classes.
    pvs_by_class: HashMap<String, Vec<Arc<PersistentVolume>>>,
    /// Those claims' classes.
    classes: HashMap<String, Option<Arc<StorageClass>>>,
}

/// What a node would need done for the pod: volumes to bind and claims to provision.
#[derive(Debug, Clone, Default)]
struct PodVolumes {
    static_bindings: Vec<(Arc<PersistentVolumeClaim>, Arc<PersistentVolume>)>,
    dynamic_provisions: Vec<Arc<PersistentVolumeClaim>>,
}

pub struct VolumeBinding {
    bind_timeout: Duration,
}

impl Default for VolumeBinding {
    fn default() -> Self {
        VolumeBinding::new(DEFAULT_BIND_TIMEOUT)
    }
}

/// Upstream's `isPVCFullyBound`: it names its volume and the binding completed.
fn is_fully_bound(pvc: &PersistentVolumeClaim) -> bool {
    claim_volume_name(pvc).is_some() && annotation(&pvc.metadata, ANN_BIND_COMPLETED).is_some()
}

/// Upstream's `IsDelayBindingMode`: the claim's class exists and waits for the first consumer.
fn is_delay_binding_mode(pvc: &PersistentVolumeClaim, cache: &Cache) -> Result<bool, String> {
    let class = claim_class(pvc);
    if class.is_empty() {
        return Ok(false);
    }
    let Some(sc) = cache.volumes.classes.get(class) else {
        return Ok(false);
    };
    match sc.volume_binding_mode.as_deref() {
        None => Err(format!("VolumeBindingMode not set for StorageClass {class:?}")),
        Some(mode) => Ok(mode == WAIT_FOR_FIRST_CONSUMER),
    }
}

/// Upstream's `ephemeral.VolumeIsForPod`: the claim of a generic ephemeral volume is owned by
/// the pod.
fn volume_is_for_pod(pod: &PodInfo, pvc: &PersistentVolumeClaim) -> Result<(), String> {
    let owned = pvc
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == pod.uid);
    if owned {
        Ok(())
    } else {
        Err(format!(
            "PVC {}/{} was not created for pod {}/{} (pod is not owner)",
            pvc.metadata.namespace.as_deref().unwrap_or_default(),
            pvc.metadata.name.as_deref().unwrap_or_default(),
            pod.namespace,
            pod.name
        ))
    }
}

impl VolumeBinding {
    pub fn new(bind_timeout: Duration) -> Self {
        VolumeBinding { bind_timeout }
    }
}

/// Upstream's `FindPodVolumes`: what the pod needs on this node, or why the node does not do.
fn find_pod_volumes(s: &StateData, node: &NodeInfo) -> Result<(PodVolumes, Vec<&'static str>), String> {
    let mut out = PodVolumes::default();
    let mut bound_satisfied = true;
    let mut bound_pvs_found = true;
    let mut unbound_satisfied = true;
    let reasons = |bound_satisfied: bool, unbound_satisfied: bool, bound_pvs_found: bool| {
        let mut r = Vec::new();
        if !bound_satisfied {
            r.push(ERR_REASON_NODE_CONFLICT);
        }
        if !unbound_satisfied {
            r.push(ERR_REASON_BIND_CONFLICT);
        }
        if !bound_pvs_found {
            r.push(ERR_REASON_PV_NOT_EXIST);
        }
        r
    };
    // Upstream's checkBoundClaims: stops at the first volume missing or not allowing the node.
    for (_, pv) in &s.bound {
        let Some(pv) = pv else {
            bound_pvs_found = false;
            break;
        };
        if check_node_affinity(pv, &node.labels).is_err() {
            bound_satisfied = false;
            break;
        }
    }
    if !s.delay.is_empty() {
        let mut to_match: Vec<&Arc<PersistentVolumeClaim>> = Vec::new();
        let mut to_provision: Vec<&Arc<PersistentVolumeClaim>> = Vec::new();
        for claim in &s.delay {
            match annotation(&claim.metadata, ANN_SELECTED_NODE) {
                // Provisioning was already asked for on another node.
                Some(selected) if selected != node.name => {
                    return Ok((out, reasons(bound_satisfied, false, bound_pvs_found)));
                }
                Some(_) => to_provision.push(claim),
                None => to_match.push(claim),
            }
        }
        // Upstream's findMatchingVolumes: the smallest claims first, each volume once.
        let mut chosen: Vec<&str> = Vec::new();
        for claim in to_match {
            let pvs = s
                .pvs_by_class
                .get(claim_class(claim))
                .map(Vec::as_slice)
                .unwrap_or_default();
            match find_matching_volume(claim, pvs.iter().map(Arc::as_ref), Some(&node.labels), &chosen, true)? {
                Some(pv) => {
                    chosen.push(pv.metadata.name.as_deref().unwrap_or_default());
                    let pv = pvs
                        .iter()
                        .find(|p| p.metadata.name == pv.metadata.name)
                        .cloned()
                        .ok_or_else(|| "matched volume vanished".to_string())?;
                    out.static_bindings.push((claim.clone(), pv));
                }
                None => {
                    unbound_satisfied = false;
                    to_provision.push(claim);
                }
            }
        }
        // Upstream's checkVolumeProvisions.
        if !to_provision.is_empty() {
            unbound_satisfied = true;
            for claim in to_provision {
                let class = claim_class(claim);
                if class.is_empty() {
                    return Err(format!("no class for claim {:?}", claim_key(claim)));
                }
                let Some(Some(sc)) = s.classes.get(class) else {
                    return Err(format!("failed to find storage class {class:?}"));
                };
                if sc.provisioner.is_empty()
                    || sc.provisioner == NOT_SUPPORTED_PROVISIONER
                    || !match_topology_selector_terms(sc.allowed_topologies.as_deref(), &node.labels)
                {
                    unbound_satisfied = false;
                    out.dynamic_provisions.clear();
                    break;
                }
                out.dynamic_provisions.push(claim.clone());
            }
        }
    }
    Ok((out, reasons(bound_satisfied, unbound_satisfied, bound_pvs_found)))
}

impl Plugin for VolumeBinding {
    fn name(&self) -> &'static str {
        NAME
    }

    fn has_filter(&self) -> bool {
        true
    }

    fn has_reserve(&self) -> bool {
        true
    }

    fn pre_filter(&self, state: &mut CycleState, pod: &PodInfo, cache: &Cache) -> Status {
        if pod.claims.is_empty() {
            return Status::skip();
        }
        // Upstream's podHasPVCs, on the claims as the API has them.
        for c in &pod.claims {
            let Some(pvc) = cache.volumes.pvcs.get_api(&format!("{}/{}", pod.namespace, c.name)) else {
                return Status::unresolvable(if c.ephemeral {
                    format!(
                        "waiting for ephemeral volume controller to create the persistentvolumeclaim {:?}",
                        c.name
                    )
                } else {
                    format!("persistentvolumeclaim {:?} not found", c.name)
                });
            };
            if claim_phase(pvc) == CLAIM_LOST {
                return Status::unresolvable(format!(
                    "persistentvolumeclaim {:?} bound to non-existent persistentvolume {:?}",
                    c.name,
                    claim_volume_name(pvc).unwrap_or_default()
                ));
            }
            if pvc.metadata.deletion_timestamp.is_some() {
                return Status::unresolvable(format!("persistentvolumeclaim {:?} is being deleted", c.name));
            }
            if c.ephemeral
                && let Err(e) = volume_is_for_pod(pod, pvc)
            {
                return Status::unresolvable(e);
            }
        }
        // Upstream's GetPodVolumeClaims, on the claims as assumed.
        let mut s = StateData::default();
        let mut immediate = 0;
        for c in &pod.claims {
            let Some(pvc) = cache.volumes.pvcs.get(&format!("{}/{}", pod.namespace, c.name)) else {
                return Status::error(format!("error getting PVC \"{}/{}\": not found", pod.namespace, c.name));
            };
            if is_fully_bound(pvc) {
                let pv = cache
                    .volumes
                    .pvs
                    .get(claim_volume_name(pvc).unwrap_or_default())
                    .cloned();
                s.bound.push((pvc.clone(), pv));
                continue;
            }
            match is_delay_binding_mode(pvc, cache) {
                Err(e) => return Status::error(e),
                // A claim naming its volume is the PV binder's to complete.
                Ok(true) if claim_volume_name(pvc).is_none() => s.delay.push(pvc.clone()),
                Ok(_) => immediate += 1,
            }
        }
        if immediate > 0 {
            return Status::unresolvable(ERR_UNBOUND_IMMEDIATE);
        }
        s.delay.sort_by_key(|c| requested_storage(c));
        for claim in &s.delay {
            let class = claim_class(claim);
            if !s.pvs_by_class.contains_key(class) {
                let pvs: Vec<Arc<PersistentVolume>> = cache
                    .volumes
                    .pvs
                    .iter()
                    .filter(|pv| skiff_api::volume::volume_class(pv) == class)
                    .cloned()
                    .collect();
                s.pvs_by_class.insert(class.to_string(), pvs);
                s.classes
                    .insert(class.to_string(), cache.volumes.classes.get(class).cloned());
            }
        }
        state.volume_binding = Some(Box::new(s));
        Status::success()
    }

    fn filter(&self, state: &CycleState, _pod: &PodInfo, node: &NodeInfo) -> Status {
        let Some(s) = &state.volume_binding else {
            return Status::success();
        };
        match find_pod_volumes(s, node) {
            Err(e) => Status::error(e),
            Ok((_, reasons)) if reasons.is_empty() => Status::success(),
            Ok((_, reasons)) => {
                let mut st = Status::unresolvable(reasons[0]);
                st.reasons = reasons.into_iter().collect();
                st
            }
        }
    }

    /// Upstream's Reserve (AssumePodVolumes) and what its PreBind (BindPodVolumes) does.
    fn reserve(
        &self,
        state: &mut CycleState,
        pod: &Arc<PodInfo>,
        node: &str,
        cache: &mut Cache,
    ) -> Result<Reserved, Status> {
        let Some(s) = &state.volume_binding else {
            return Ok(Reserved::default());
        };
        let Some(ni) = cache.node(node) else {
            return Err(Status::error(format!("node {node:?} not found")));
        };
        let (volumes, reasons) = find_pod_volumes(s, ni).map_err(Status::error)?;
        if !reasons.is_empty() {
            return Err(Status::error(reasons.join(", ")));
        }
        // Upstream's arePodVolumesBound: nothing to do when every claim is bound.
        let all_bound = pod.claims.iter().all(|c| {
            cache
                .volumes
                .pvcs
                .get(&format!("{}/{}", pod.namespace, c.name))
                .is_some_and(|pvc| is_fully_bound(pvc))
        });
        if all_bound {
            return Ok(Reserved::default());
        }
        let mut assumed_pvs: Vec<String> = Vec::new();
        let mut assumed_pvcs: Vec<String> = Vec::new();
        let revert = |cache: &mut Cache, pvs: &[String], pvcs: &[String]| {
            for k in pvs {
                cache.volumes.pvs.restore(k);
            }
            for k in pvcs {
                cache.volumes.pvcs.restore(k);
            }
        };
        let mut bindings: Vec<(Arc<PersistentVolumeClaim>, PersistentVolume)> = Vec::new();
        for (pvc, pv) in &volumes.static_bindings {
            let new_pv = match volume_bound_to_claim(pv, pvc) {
                Some(bound) => {
                    if let Err(e) = cache.volumes.pvs.assume(bound.clone()) {
                        revert(cache, &assumed_pvs, &assumed_pvcs);
                        return Err(Status::error(e.to_string()));
                    }
                    assumed_pvs.push(key_of(&bound));
                    bound
                }
                None => (**pv).clone(),
            };
            bindings.push((pvc.clone(), new_pv));
        }
        let mut provisions: Vec<PersistentVolumeClaim> = Vec::new();
        for claim in &volumes.dynamic_provisions {
            let mut c = (**claim).clone();
            c.metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(ANN_SELECTED_NODE.to_string(), node.to_string());
            if let Err(e) = cache.volumes.pvcs.assume(c.clone()) {
                revert(cache, &assumed_pvs, &assumed_pvcs);
                return Err(Status::error(e.to_string()));
            }
            assumed_pvcs.push(key_of(&c));
            provisions.push(c);
        }
        let undo_pvs = assumed_pvs.clone();
        let undo_pvcs = assumed_pvcs.clone();
        let job = BindJob {
            pod: pod.clone(),
            node: node.to_string(),
            bindings,
            provisions,
            timeout: self.bind_timeout,
        };
        Ok(Reserved {
            unreserve: Some(Box::new(move |cache: &mut Cache| revert(cache, &undo_pvs, &undo_pvcs))),
            pre_bind: Some(Box::new(move |client| Box::pin(job.run(client)))),
        })
    }
}

/// Upstream's BindPodVolumes for one pod: the API writes, then the wait.
struct BindJob {
    pod: Arc<PodInfo>,
    node: String,
    bindings: Vec<(Arc<PersistentVolumeClaim>, PersistentVolume)>,
    provisions: Vec<PersistentVolumeClaim>,
    timeout: Duration,
}

/// A failed request's message as upstream's error prints it.
fn api_error(e: kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message,
        other => other.to_string(),
    }
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

impl BindJob {
    async fn run(mut self, client: kube::Client) -> Result<(), String> {
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        // Upstream's bindAPIUpdate: the volumes first, then the claims to provision.
        for (pvc, pv) in &mut self.bindings {
            let name = pv.metadata.name.clone().unwrap_or_default();
            tracing::debug!(pod = %self.pod.key(), volume = %name, claim = %claim_key(pvc), "binding volume to claim");
            *pv = pvs
                .replace(&name, &PostParams::default(), pv)
                .await
                .map_err(api_error)?;
        }
        for claim in &mut self.provisions {
            let ns = claim.metadata.namespace.clone().unwrap_or_default();
            let name = claim.metadata.name.clone().unwrap_or_default();
            tracing::debug!(pod = %self.pod.key(), claim = %format!("{ns}/{name}"), node = %self.node, "asking for provisioning");
            *claim = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns)
                .replace(&name, &PostParams::default(), claim)
                .await
                .map_err(api_error)?;
        }
        // Upstream's PollUntilContextTimeout: the first look after one interval.
        let wait = async {
            loop {
                tokio::time::sleep(POLL_INTERVAL).await;
                match self.check_bindings(&client).await {
                    Ok(true) => return Ok(()),
                    Ok(false) => {}
                    Err(e) => return Err(e),
                }
            }
        };
        match tokio::time::timeout(self.timeout, wait).await {
            Ok(Ok(())) => {
                tracing::debug!(pod = %self.pod.key(), "all PVCs for pod are bound");
                Ok(())
            }
            Ok(Err(e)) => Err(format!("binding volumes: {e}")),
            Err(_) => Err("binding volumes: context deadline exceeded".to_string()),
        }
    }

    /// Upstream's checkBindings on the API's objects: Ok(true) once every claim is bound,
    /// Err when the binding cannot complete and the pod must be scheduled again.
    async fn check_bindings(&self, client: &kube::Client) -> Result<bool, String> {
        let node = match Api::<Node>::all(client.clone()).get(&self.node).await {
            Ok(n) => n,
            Err(e) if is_not_found(&e) => {
                return Err(format!(
                    "failed to get node {:?}: node {:?} not found",
                    self.node, self.node
                ));
            }
            Err(e) => {
                tracing::debug!(error = %e, node = %self.node, "reading node failed; retrying");
                return Ok(false);
            }
        };
        let labels = node.metadata.labels.unwrap_or_default();
        match Api::<Pod>::namespaced(client.clone(), &self.pod.namespace)
            .get(&self.pod.name)
            .await
        {
            Ok(p) if p.metadata.uid.as_deref() == Some(self.pod.uid.as_str()) => {}
            Ok(_) => {
                return Err(format!(
                    "pod does not exist any more: pod {:?} not found",
                    self.pod.name
                ));
            }
            Err(e) if is_not_found(&e) => {
                return Err(format!(
                    "pod does not exist any more: pod {:?} not found",
                    self.pod.name
                ));
            }
            Err(e) => tracing::debug!(error = %e, pod = %self.pod.key(), "reading pod failed"),
        }
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        for (claim, bound) in &self.bindings {
            let name = bound.metadata.name.clone().unwrap_or_default();
            let pv = match pvs.get(&name).await {
                Ok(pv) => pv,
                Err(e) if is_not_found(&e) => {
                    return Err(format!("failed to check binding: persistentvolume {name:?} not found"));
                }
                Err(_) => return Ok(false),
            };
            let pvc = match self.get_claim(client, claim).await {
                Ok(c) => c,
                Err(Some(e)) => return Err(format!("failed to check binding: {e}")),
                Err(None) => return Ok(false),
            };
            if let Err(e) = check_node_affinity(&pv, &labels) {
                return Err(format!(
                    "pv {name:?} node affinity doesn't match node {:?}: {e}",
                    self.node
                ));
            }
            let uid = pv
                .spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .and_then(|r| r.uid.as_deref())
                .unwrap_or_default();
            if uid.is_empty() {
                return Err(format!("ClaimRef got reset for pv {name:?}"));
            }
            if !is_fully_bound(&pvc) {
                return Ok(false);
            }
        }
        for claim in &self.provisions {
            let pvc = match self.get_claim(client, claim).await {
                Ok(c) => c,
                Err(Some(e)) => return Err(format!("failed to check provisioning pvc: {e}")),
                Err(None) => return Ok(false),
            };
            let name = pvc.metadata.name.as_deref().unwrap_or_default();
            if pvc.metadata.annotations.is_none() {
                return Err(format!("selectedNode annotation reset for PVC {name:?}"));
            }
            if annotation(&pvc.metadata, ANN_SELECTED_NODE) != Some(self.node.as_str()) {
                // A provisioner that fails removes the annotation to ask for another try.
                return Err(format!("provisioning failed for PVC {name:?}"));
            }
            if let Some(volume) = claim_volume_name(&pvc) {
                let pv = match pvs.get(volume).await {
                    Ok(pv) => pv,
                    // Not seen yet, or deleted (then the claim is unbound in time).
                    Err(_) => return Ok(false),
                };
                if let Err(e) = check_node_affinity(&pv, &labels) {
                    return Err(format!(
                        "pv {volume:?} node affinity doesn't match node {:?}: {e}",
                        self.node
                    ));
                }
            }
            if !is_fully_bound(&pvc) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The claim from the API: Err(Some) when it is gone, Err(None) when it could not be read.
    async fn get_claim(
        &self,
        client: &kube::Client,
        claim: &PersistentVolumeClaim,
    ) -> Result<PersistentVolumeClaim, Option<String>> {
        let ns = claim.metadata.namespace.as_deref().unwrap_or_default();
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        match Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
            .get(name)
            .await
        {
            Ok(c) => Ok(c),
            Err(e) if is_not_found(&e) => Err(Some(format!("persistentvolumeclaim {name:?} not found"))),
            Err(e) => {
                tracing::debug!(error = %e, claim = %format!("{ns}/{name}"), "reading claim failed; retrying");
                Err(None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::{Code, Framework};
    use crate::plugins::default_preemption::preempt;
    use crate::plugins::testutil::*;
    use crate::types::testutil::*;

    fn schedule_err(c: &Cache, p: &PodInfo) -> String {
        let mut fw = Framework::with_default_plugins(0);
        let (mut diag, state) = *fw.schedule(p, c).unwrap_err();
        let msg = preempt(&fw, state.as_ref(), p, c, &diag).unwrap_err();
        diag.post_filter_msg = Some(format!("preemption: {msg}"));
        diag.message()
    }

    #[test]
    fn pre_filter_messages() {
        let mut c = cache_with_nodes(&["n1"]);
        let p = PodInfo::new(with_claim(pod("p", "", ""), "data"));
        // VolumeRestrictions comes first and says the same for a plain claim.
        assert_eq!(
            schedule_err(&c, &p),
            "0/1 nodes are available: persistentvolumeclaim \"data\" not found. preemption: 0/1 nodes are \
             available: 1 Preemption is not helpful for scheduling."
        );
        let mut s = CycleState::default();
        let st = VolumeBinding::default().pre_filter(&mut s, &p, &c);
        assert_eq!(st.code, Code::UnschedulableAndUnresolvable);
        assert_eq!(st.reasons, vec!["persistentvolumeclaim \"data\" not found"]);

        // Pending, no class: waits for the PV binder.
        add_claim(&mut c, claim("data", &["ReadWriteOnce"], "", None));
        assert_eq!(
            schedule_err(&c, &p),
            "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/1 nodes \
             are available: 1 Preemption is not helpful for scheduling."
        );
        // An Immediate class: the same.
        add_class(&mut c, class("now", "Immediate", "kubernetes.io/no-provisioner"));
        add_claim(&mut c, claim("data", &["ReadWriteOnce"], "now", None));
        let st = VolumeBinding::default().pre_filter(&mut s, &p, &c);
        assert_eq!(st.reasons, vec![ERR_UNBOUND_IMMEDIATE]);
        // Being deleted.
        let mut deleting = claim("data", &["ReadWriteOnce"], "now", None);
        deleting.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::now(),
        ));
        add_claim(&mut c, deleting);
        let st = VolumeBinding::default().pre_filter(&mut s, &p, &c);
        assert_eq!(st.reasons, vec!["persistentvolumeclaim \"data\" is being deleted"]);
        // An ephemeral volume's claim not made yet.
        let mut eph = pod("e", "", "");
        eph.spec.as_mut().unwrap().volumes = Some(vec![k8s_openapi::api::core::v1::Volume {
            name: "scratch".into(),
            ephemeral: Some(Default::default()),
            ..Default::default()
        }]);
        let st = VolumeBinding::default().pre_filter(&mut s, &PodInfo::new(eph), &c);
        assert_eq!(
            st.reasons,
            vec!["waiting for ephemeral volume controller to create the persistentvolumeclaim \"e-scratch\""]
        );
        // Pods without claims skip the plugin.
        assert!(
            VolumeBinding::default()
                .pre_filter(&mut s, &PodInfo::new(pod("x", "", "")), &c)
                .is_skip()
        );
    }

    #[test]
    fn bound_claims_need_their_volume_to_allow_the_node() {
        let mut c = cache_with_nodes(&["n1", "n2"]);
        add_pv(&mut c, pv("local-n1", "", "1Gi", &["ReadWriteOnce"], Some("n1")));
        add_claim(&mut c, claim("data", &["ReadWriteOnce"], "", Some("local-n1")));
        let p = PodInfo::new(with_claim(pod("p", "", ""), "data"));
        let mut fw = Framework::with_default_plugins(0);
        let (res, _) = fw.schedule(&p, &c).unwrap();
        assert_eq!(c.node_name(res.node), "n1");
        assert_eq!(res.rejected[0].1.reasons, vec![ERR_REASON_NODE_CONFLICT]);
        assert_eq!(res.rejected[0].1.code, Code::UnschedulableAndUnresolvable);
        // On a node nothing allows, the pod waits.
        let mut only_n2 = cache_with_nodes(&["n2"]);
        add_pv(&mut only_n2, pv("local-n1", "", "1Gi", &["ReadWriteOnce"], Some("n1")));
        add_claim(&mut only_n2, claim("data", &["ReadWriteOnce"], "", Some("local-n1")));
        assert_eq!(
            schedule_err(&only_n2, &p),
            "0/1 nodes are available: 1 node(s) had volume node affinity conflict. preemption: 0/1 nodes are \
             available: 1 Preemption is not helpful for scheduling."
        );
        // A bound claim whose volume is gone.
        let mut gone = cache_with_nodes(&["n1"]);
        add_claim(&mut gone, claim("data", &["ReadWriteOnce"], "", Some("missing")));
        let mut s = CycleState::default();
        assert!(VolumeBinding::default().pre_filter(&mut s, &p, &gone).is_success());
        let st = VolumeBinding::default().filter(&s, &p, gone.node("n1").unwrap());
        assert_eq!(st.reasons, vec![ERR_REASON_PV_NOT_EXIST]);
    }

    #[test]
    fn wait_for_first_consumer_claims_find_volumes_on_the_node_or_a_provisioner() {
        let mut c = cache_with_nodes(&["n1", "n2"]);
        add_class(
            &mut c,
            class("local", "WaitForFirstConsumer", "kubernetes.io/no-provisioner"),
        );
        add_pv(&mut c, pv("small-n2", "local", "1Gi", &["ReadWriteOnce"], Some("n2")));
        add_pv(&mut c, pv("big-n2", "local", "10Gi", &["ReadWriteOnce"], Some("n2")));
        add_claim(&mut c, claim("data", &["ReadWriteOnce"], "local", None));
        let p = PodInfo::new(with_claim(pod("p", "", ""), "data"));
        let mut fw = Framework::with_default_plugins(0);
        let (res, mut state) = fw.schedule(&p, &c).unwrap();
        assert_eq!(c.node_name(res.node), "n2");
        assert_eq!(res.rejected[0].1.reasons, vec![ERR_REASON_BIND_CONFLICT]);

        // Reserve assumes the smallest fitting volume for this pod; the next pod takes the other.
        let p = Arc::new(p);
        let r = fw.run_reserve(&mut state, &p, "n2", &mut c).unwrap();
        assert_eq!(r.pre_bind.len(), 1);
        assert_eq!(r.pre_bind[0].0, NAME);
        let claim_ref = |c: &Cache, name: &str| {
            c.volumes
                .pvs
                .get(name)
                .and_then(|v| v.spec.as_ref())
                .and_then(|s| s.claim_ref.as_ref())
                .and_then(|r| r.name.clone())
        };
        assert_eq!(claim_ref(&c, "small-n2").as_deref(), Some("data"));
        assert_eq!(
            annotation(
                &c.volumes.pvs.get("small-n2").unwrap().metadata,
                "pv.kubernetes.io/bound-by-controller"
            ),
            Some("yes")
        );
        c.assume_pod(p.clone(), "n2");
        add_claim(&mut c, claim("more", &["ReadWriteOnce"], "local", None));
        let q = Arc::new(PodInfo::new(with_claim(pod("q", "", ""), "more")));
        let (res, mut state) = fw.schedule(&q, &c).unwrap();
        assert_eq!(c.node_name(res.node), "n2");
        let r2 = fw.run_reserve(&mut state, &q, "n2", &mut c).unwrap();
        assert_eq!(claim_ref(&c, "big-n2").as_deref(), Some("more"));
        // A third finds nothing: no volume left and the class cannot provision.
        add_claim(&mut c, claim("third", &["ReadWriteOnce"], "local", None));
        let t = PodInfo::new(with_claim(pod("t", "", ""), "third"));
        assert_eq!(
            schedule_err(&c, &t),
            "0/2 nodes are available: 2 node(s) didn't find available persistent volumes to bind. preemption: \
             0/2 nodes are available: 2 Preemption is not helpful for scheduling."
        );
        // Unreserve gives the volumes back.
        r2.unreserve(&mut c);
        r.unreserve(&mut c);
        assert_eq!(claim_ref(&c, "small-n2"), None);
        assert_eq!(claim_ref(&c, "big-n2"), None);
    }

    #[test]
    fn provisioning_classes_and_selected_nodes() {
        let mut c = cache_with_nodes(&["n1", "n2"]);
        let mut sc = class("dyn", "WaitForFirstConsumer", "skiff.dev/local-path");
        sc.allowed_topologies = Some(vec![k8s_openapi::api::core::v1::TopologySelectorTerm {
            match_label_expressions: Some(vec![k8s_openapi::api::core::v1::TopologySelectorLabelRequirement {
                key: "kubernetes.io/hostname".into(),
                values: vec!["n1".into()],
            }]),
        }]);
        add_class(&mut c, sc);
        add_claim(&mut c, claim("data", &["ReadWriteOnce"], "dyn", None));
        let p = Arc::new(PodInfo::new(with_claim(pod("p", "", ""), "data")));
        let mut fw = Framework::with_default_plugins(0);
        let (res, mut state) = fw.schedule(&p, &c).unwrap();
        assert_eq!(c.node_name(res.node), "n1");
        assert_eq!(res.rejected[0].1.reasons, vec![ERR_REASON_BIND_CONFLICT]);
        let r = fw.run_reserve(&mut state, &p, "n1", &mut c).unwrap();
        assert_eq!(r.pre_bind.len(), 1);
        let assumed = c.volumes.pvcs.get("default/data").unwrap().clone();
        assert_eq!(annotation(&assumed.metadata, ANN_SELECTED_NODE), Some("n1"));
        assert!(
            annotation(
                &c.volumes.pvcs.get_api("default/data").unwrap().metadata,
                ANN_SELECTED_NODE
            )
            .is_none()
        );
        r.unreserve(&mut c);
        assert!(annotation(&c.volumes.pvcs.get("default/data").unwrap().metadata, ANN_SELECTED_NODE).is_none());

        // A retried pod whose claim already names a node fits only that node.
        let mut selected = claim("data", &["ReadWriteOnce"], "dyn", None);
        selected.metadata.resource_version = Some("2".into());
        selected
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(ANN_SELECTED_NODE.into(), "n2".into());
        add_claim(&mut c, selected);
        let mut s = CycleState::default();
        assert!(VolumeBinding::default().pre_filter(&mut s, &p, &c).is_success());
        assert_eq!(
            VolumeBinding::default().filter(&s, &p, c.node("n1").unwrap()).reasons,
            vec![ERR_REASON_BIND_CONFLICT]
        );
        // ... and there the class must still allow provisioning.
        assert_eq!(
            VolumeBinding::default().filter(&s, &p, c.node("n2").unwrap()).reasons,
            vec![ERR_REASON_BIND_CONFLICT]
        );
    }

    #[test]
    fn all_bound_pods_have_nothing_to_bind() {
        let mut c = cache_with_nodes(&["n1"]);
        add_pv(&mut c, pv("v", "", "1Gi", &["ReadWriteOnce"], None));
        add_claim(&mut c, claim("data", &["ReadWriteOnce"], "", Some("v")));
        let p = Arc::new(PodInfo::new(with_claim(pod("p", "", ""), "data")));
        let mut fw = Framework::with_default_plugins(0);
        let (_, mut state) = fw.schedule(&p, &c).unwrap();
        let r = fw.run_reserve(&mut state, &p, "n1", &mut c).unwrap();
        assert!(r.pre_bind.is_empty());
        assert!(r.unreserve.is_empty());
    }
}
