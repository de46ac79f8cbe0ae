//! The Deployment controller (upstream's `pkg/controller/deployment`): one ReplicaSet per pod
//! template (`<deployment>-<pod-template-hash>`), rolled out with RollingUpdate (maxSurge /
//! maxUnavailable) or Recreate, proportional scaling of every active ReplicaSet, pause/resume,
//! revision annotations for `kubectl rollout history/undo`, old ReplicaSet cleanup, and the
//! Available / Progressing conditions with the progress deadline.

use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus, ReplicaSet, ReplicaSetSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DeleteParams, PostParams};

use crate::controller_utils::{self as cu, Recorder, WorkQueue};
use crate::informers::{Change, Informer, SharedInformerFactory, object_key};

pub const COMPONENT: &str = "deployment-controller";

pub const REVISION: &str = "deployment.kubernetes.io/revision";
pub const REVISION_HISTORY: &str = "deployment.kubernetes.io/revision-history";
pub const DESIRED_REPLICAS: &str = "deployment.kubernetes.io/desired-replicas";
pub const MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";
pub const HASH_LABEL: &str = "pod-template-hash";
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
const ROLLBACK_TO: &str = "deprecated.deployment.rollback.to";
const MAX_REV_HISTORY_CHARS: usize = 2000;

// Condition reasons (upstream's deployment util).
const NEW_RS_REASON: &str = "NewReplicaSetCreated";
const FOUND_NEW_RS_REASON: &str = "FoundNewReplicaSet";
const NEW_RS_AVAILABLE_REASON: &str = "NewReplicaSetAvailable";
const RS_UPDATED_REASON: &str = "ReplicaSetUpdated";
const TIMED_OUT_REASON: &str = "ProgressDeadlineExceeded";
const FAILED_RS_CREATE_REASON: &str = "ReplicaSetCreateError";
const PAUSED_REASON: &str = "DeploymentPaused";
const RESUMED_REASON: &str = "DeploymentResumed";
const MIN_AVAILABLE_REASON: &str = "MinimumReplicasAvailable";
const MIN_UNAVAILABLE_REASON: &str = "MinimumReplicasUnavailable";

struct Ctx {
    client: kube::Client,
    recorder: Recorder,
    deployments: Informer<Deployment>,
    replicasets: Informer<ReplicaSet>,
    pods: Informer<Pod>,
}

/// The Deployments of a namespace whose selector matches an orphan ReplicaSet.
fn matching_deployments(deployments: &Informer<Deployment>, rs: &ReplicaSet) -> Vec<String> {
    let ns = rs.metadata.namespace.as_deref().unwrap_or_default();
    deployments
        .list_namespace(ns)
        .iter()
        .filter(|d| {
            let sel = cu::selector_of(d.spec.as_ref().map(|s| &s.selector));
            !sel.is_empty() && cu::labels_match(&sel, &rs.metadata)
        })
        .map(|d| object_key(&d.metadata))
        .collect()
}

pub async fn run(client: kube::Client, informers: SharedInformerFactory) -> anyhow::Result<()> {
    let queue = WorkQueue::new();
    let deployments = informers.informer::<Deployment>();
    let replicasets = informers.informer::<ReplicaSet>();
    let pods = informers.informer::<Pod>();
    {
        let queue = queue.clone();
        deployments.add_handler(move |c| {
            let (Change::Added(d) | Change::Updated { new: d, .. } | Change::Deleted(d)) = c;
            queue.add(object_key(&d.metadata));
        });
    }
    {
        let queue = queue.clone();
        let ds = deployments.clone();
        replicasets.add_handler(move |c| {
            let keys = |rs: &ReplicaSet| match cu::controller_ref(&rs.metadata) {
                Some(_) => cu::controller_key(&rs.metadata, "Deployment").into_iter().collect(),
                None => matching_deployments(&ds, rs),
            };
            match c {
                Change::Added(rs) | Change::Deleted(rs) => keys(rs).into_iter().for_each(|k| queue.add(k)),
                Change::Updated { old, new } => {
                    let mut all: Vec<String> = keys(old);
                    all.extend(keys(new));
                    all.sort();
                    all.dedup();
                    all.into_iter().for_each(|k| queue.add(k));
                }
            }
        });
    }
    // Pod deletions matter for Recreate: the new ReplicaSet waits until the old pods are gone.
    {
        let queue = queue.clone();
        let sets = replicasets.clone();
        pods.add_handler(move |c| {
            let Change::Deleted(p) = c else { return };
            let Some(c) = cu::controller_ref(&p.metadata) else {
                return;
            };
            if c.kind != "ReplicaSet" {
                return;
            }
            let ns = p.metadata.namespace.as_deref().unwrap_or_default();
            if let Some(rs) = sets.get(ns, &c.name)
                && rs.metadata.uid.as_deref() == Some(c.uid.as_str())
                && let Some(k) = cu::controller_key(&rs.metadata, "Deployment")
            {
                queue.add(k);
            }
        });
    }
    deployments.wait_synced().await;
    replicasets.wait_synced().await;
    pods.wait_synced().await;
    let ctx = Ctx {
        recorder: Recorder::for_component(client.clone(), COMPONENT),
        client,
        deployments,
        replicasets,
        pods,
    };
    queue.run("deployment", |key| sync(&ctx, key)).await
}

// ---- pure helpers ----

fn replicas(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0)
}

fn status_replicas(rs: &ReplicaSet) -> i32 {
    rs.status.as_ref().map(|s| s.replicas).unwrap_or(0)
}

fn available(rs: &ReplicaSet) -> i32 {
    rs.status.as_ref().and_then(|s| s.available_replicas).unwrap_or(0)
}

fn ready(rs: &ReplicaSet) -> i32 {
    rs.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0)
}

fn d_replicas(d: &Deployment) -> i32 {
    d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

fn is_rolling_update(d: &Deployment) -> bool {
    d.spec
        .as_ref()
        .and_then(|s| s.strategy.as_ref())
        .and_then(|s| s.type_.as_deref())
        .is_none_or(|t| t == "RollingUpdate")
}

fn annotation<'a>(meta: &'a ObjectMeta, k: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(k).map(String::as_str)
}

fn int_annotation(meta: &ObjectMeta, k: &str) -> Option<i32> {
    annotation(meta, k)?.parse().ok()
}

/// The revision of a ReplicaSet (0 when unset or bad).
pub fn revision(meta: &ObjectMeta) -> i64 {
    annotation(meta, REVISION).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Upstream's `ResolveFenceposts`: (maxSurge, maxUnavailable) for `desired` replicas; surge
/// rounds up, unavailability down, and both zero means one may be unavailable.
pub fn resolve_fenceposts(
    max_surge: Option<&k8s_openapi::apimachinery::pkg::util::intstr::IntOrString>,
    max_unavailable: Option<&k8s_openapi::apimachinery::pkg::util::intstr::IntOrString>,
    desired: i32,
) -> anyhow::Result<(i32, i32)> {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let quarter = IntOrString::String("25%".into());
    let surge = cu::scaled_value(Some(max_surge.unwrap_or(&quarter)), desired, true)?;
    let unavailable = cu::scaled_value(Some(max_unavailable.unwrap_or(&quarter)), desired, false)?;
    if surge == 0 && unavailable == 0 {
        return Ok((0, 1));
    }
    Ok((surge, unavailable))
}

fn fenceposts(d: &Deployment) -> (i32, i32) {
    let ru = d
        .spec
        .as_ref()
        .and_then(|s| s.strategy.as_ref())
        .and_then(|s| s.rolling_update.as_ref());
    resolve_fenceposts(
        ru.and_then(|r| r.max_surge.as_ref()),
        ru.and_then(|r| r.max_unavailable.as_ref()),
        d_replicas(d),
    )
    .unwrap_or((0, 1))
}

/// Upstream's `MaxSurge`.
pub fn max_surge(d: &Deployment) -> i32 {
    if !is_rolling_update(d) {
        return 0;
    }
    fenceposts(d).0
}

/// Upstream's `MaxUnavailable`.
pub fn max_unavailable(d: &Deployment) -> i32 {
    if !is_rolling_update(d) || d_replicas(d) == 0 {
        return 0;
    }
    fenceposts(d).1.min(d_replicas(d))
}

/// Upstream's `NewRSNewReplicas`: how far the new ReplicaSet may grow now.
pub fn new_rs_new_replicas(d: &Deployment, all: &[&ReplicaSet], new_rs: &ReplicaSet) -> i32 {
    if !is_rolling_update(d) {
        return d_replicas(d);
    }
    let current: i32 = all.iter().map(|rs| replicas(rs)).sum();
    let max_total = d_replicas(d) + max_surge(d);
    if current >= max_total {
        return replicas(new_rs);
    }
    let scale_up = max_total - current;
    replicas(new_rs) + scale_up.min(d_replicas(d) - replicas(new_rs)).max(0)
}

/// Templates equal when the pod-template-hash label is ignored.
fn equal_ignore_hash(
    a: Option<&k8s_openapi::api::core::v1::PodTemplateSpec>,
    b: Option<&k8s_openapi::api::core::v1::PodTemplateSpec>,
) -> bool {
    let strip = |t: Option<&k8s_openapi::api::core::v1::PodTemplateSpec>| {
        let mut t = t.cloned().unwrap_or_default();
        if let Some(l) = t.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
            l.remove(HASH_LABEL);
        }
        // Upstream compares Go values, where a container's resources are a struct: absent and
        // empty are the same.
        if let Some(spec) = t.spec.as_mut() {
            for c in spec
                .containers
                .iter_mut()
                .chain(spec.init_containers.iter_mut().flatten())
            {
                c.resources.get_or_insert_with(Default::default);
            }
        }
        serde_json::to_value(t).unwrap_or_default()
    };
    strip(a) == strip(b)
}

fn by_creation(a: &ReplicaSet, b: &ReplicaSet) -> std::cmp::Ordering {
    let t = |r: &ReplicaSet| r.metadata.creation_timestamp.as_ref().map(|t| t.0);
    t(a).cmp(&t(b)).then_with(|| a.metadata.name.cmp(&b.metadata.name))
}

fn has_progress_deadline(d: &Deployment) -> bool {
    d.spec
        .as_ref()
        .and_then(|s| s.progress_deadline_seconds)
        .is_some_and(|v| v != i32::MAX)
}

fn get_condition<'a>(s: &'a DeploymentStatus, t: &str) -> Option<&'a DeploymentCondition> {
    s.conditions.as_ref()?.iter().find(|c| c.type_ == t)
}

fn new_condition(t: &str, status: &str, reason: &str, message: String) -> DeploymentCondition {
    let now = cu::now();
    DeploymentCondition {
        type_: t.to_string(),
        status: status.to_string(),
        reason: Some(reason.to_string()),
        message: Some(message),
        last_update_time: Some(now.clone()),
        last_transition_time: Some(now),
    }
}

/// Upstream's `SetDeploymentCondition`: no change for the same status and reason; the
/// transition time survives a reason change with the same status.
fn set_condition(s: &mut DeploymentStatus, mut c: DeploymentCondition) {
    if let Some(cur) = get_condition(s, &c.type_) {
        if cur.status == c.status && cur.reason == c.reason {
            return;
        }
        if cur.status == c.status {
            c.last_transition_time = cur.last_transition_time.clone();
        }
    }
    remove_condition(s, &c.type_);
    s.conditions.get_or_insert_with(Vec::new).push(c);
}

fn remove_condition(s: &mut DeploymentStatus, t: &str) {
    if let Some(cs) = s.conditions.as_mut() {
        cs.retain(|c| c.type_ != t);
        if cs.is_empty() {
            s.conditions = None;
        }
    }
}

fn nz(v: i32) -> Option<i32> {
    (v != 0).then_some(v)
}

/// Upstream's `calculateStatus`.
fn calculate_status(all: &[&ReplicaSet], new_rs: Option<&ReplicaSet>, d: &Deployment) -> DeploymentStatus {
    let avail: i32 = all.iter().map(|r| available(r)).sum();
    let total = d_replicas(d);
    let unavailable = (total - avail).max(0);
    let old = d.status.clone().unwrap_or_default();
    let mut s = DeploymentStatus {
        observed_generation: d.metadata.generation,
        replicas: nz(all.iter().map(|r| status_replicas(r)).sum()),
        updated_replicas: nz(new_rs.map(status_replicas).unwrap_or(0)),
        ready_replicas: nz(all.iter().map(|r| ready(r)).sum()),
        available_replicas: nz(avail),
        unavailable_replicas: nz(unavailable),
        collision_count: old.collision_count,
        conditions: old.conditions.clone(),
        terminating_replicas: None,
    };
    if avail >= total - max_unavailable(d) {
        set_condition(
            &mut s,
            new_condition(
                "Available",
                "True",
                MIN_AVAILABLE_REASON,
                "Deployment has minimum availability.".into(),
            ),
        );
    } else {
        set_condition(
            &mut s,
            new_condition(
                "Available",
                "False",
                MIN_UNAVAILABLE_REASON,
                "Deployment does not have minimum availability.".into(),
            ),
        );
    }
    s
}

fn num(v: Option<i32>) -> i32 {
    v.unwrap_or(0)
}

/// Upstream's `DeploymentComplete`.
fn deployment_complete(d: &Deployment, s: &DeploymentStatus) -> bool {
    let r = d_replicas(d);
    num(s.updated_replicas) == r
        && num(s.replicas) == r
        && num(s.available_replicas) == r
        && s.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0)
}

/// Upstream's `DeploymentProgressing`.
fn deployment_progressing(d: &Deployment, new: &DeploymentStatus) -> bool {
    let old = d.status.clone().unwrap_or_default();
    let new_old = num(new.replicas) - num(new.updated_replicas);
    let old_old = num(old.replicas) - num(old.updated_replicas);
    num(new.updated_replicas) > num(old.updated_replicas)
        || new_old < old_old
        || num(new.ready_replicas) > num(old.ready_replicas)
        || num(new.available_replicas) > num(old.available_replicas)
}

fn deadline(d: &Deployment) -> jiff::SignedDuration {
    jiff::SignedDuration::from_secs(i64::from(
        d.spec.as_ref().and_then(|s| s.progress_deadline_seconds).unwrap_or(600),
    ))
}

/// Upstream's `DeploymentTimedOut`.
fn deployment_timed_out(d: &Deployment, new: &DeploymentStatus, now: jiff::Timestamp) -> bool {
    if !has_progress_deadline(d) {
        return false;
    }
    let Some(c) = get_condition(new, "Progressing") else {
        return false;
    };
    match c.reason.as_deref() {
        Some(NEW_RS_AVAILABLE_REASON) => false,
        Some(TIMED_OUT_REASON) => true,
        _ => c.last_update_time.as_ref().is_some_and(|t| t.0 + deadline(d) < now),
    }
}

/// Upstream's `requeueStuckDeployment`: when to look again for the progress deadline.
fn requeue_stuck(d: &Deployment, new: &DeploymentStatus, now: jiff::Timestamp) -> Option<Duration> {
    if !has_progress_deadline(d) || deployment_complete(d, new) {
        return None;
    }
    let c = get_condition(new, "Progressing")?;
    if matches!(
        c.reason.as_deref(),
        Some(NEW_RS_AVAILABLE_REASON) | Some(TIMED_OUT_REASON)
    ) {
        return None;
    }
    let at = c.last_update_time.as_ref()?.0 + deadline(d);
    let after = at.duration_since(now);
    Some(Duration::from_millis(after.as_millis().max(1000) as u64))
}

/// Copy the deployment's own annotations (not the controller's) onto a ReplicaSet.
fn copy_annotations(d: &Deployment, rs: &mut ReplicaSet) -> bool {
    let mut changed = false;
    let ann = rs.metadata.annotations.get_or_insert_with(Default::default);
    for (k, v) in d.metadata.annotations.iter().flatten() {
        if [
            LAST_APPLIED,
            REVISION,
            REVISION_HISTORY,
            DESIRED_REPLICAS,
            MAX_REPLICAS,
            ROLLBACK_TO,
        ]
        .contains(&k.as_str())
        {
            continue;
        }
        if ann.get(k) != Some(v) {
            ann.insert(k.clone(), v.clone());
            changed = true;
        }
    }
    changed
}

/// Upstream's `SetReplicasAnnotations`.
fn set_replicas_annotations(rs: &mut ReplicaSet, desired: i32, max: i32) -> bool {
    let ann = rs.metadata.annotations.get_or_insert_with(Default::default);
    let mut changed = false;
    for (k, v) in [(DESIRED_REPLICAS, desired), (MAX_REPLICAS, max)] {
        let v = v.to_string();
        if ann.get(k) != Some(&v) {
            ann.insert(k.to_string(), v);
            changed = true;
        }
    }
    changed
}

/// Upstream's `SetNewReplicaSetAnnotations`.
fn set_new_rs_annotations(d: &Deployment, rs: &mut ReplicaSet, new_revision: i64, exists: bool) -> bool {
    let mut changed = copy_annotations(d, rs);
    let ann = rs.metadata.annotations.get_or_insert_with(Default::default);
    let old = ann.get(REVISION).cloned().unwrap_or_default();
    let old_num: i64 = if old.is_empty() {
        0
    } else {
        match old.parse() {
            Ok(n) => n,
            Err(_) => return false,
        }
    };
    if old_num < new_revision {
        ann.insert(REVISION.to_string(), new_revision.to_string());
        changed = true;
        if !old.is_empty() {
            let history = match ann.get(REVISION_HISTORY) {
                Some(h) if !h.is_empty() => format!("{h},{old}"),
                _ => old.clone(),
            };
            let mut parts: Vec<&str> = history.split(',').collect();
            while parts.join(",").len() > MAX_REV_HISTORY_CHARS && parts.len() > 1 {
                parts.remove(0);
            }
            ann.insert(REVISION_HISTORY.to_string(), parts.join(","));
        }
    }
    if !exists && set_replicas_annotations(rs, d_replicas(d), d_replicas(d) + max_surge(d)) {
        changed = true;
    }
    changed
}

// ---- the sync ----

struct Sets {
    new: Option<ReplicaSet>,
    old: Vec<ReplicaSet>,
}

impl Sets {
    fn all(&self) -> Vec<&ReplicaSet> {
        let mut v: Vec<&ReplicaSet> = self.old.iter().collect();
        if let Some(n) = &self.new {
            v.push(n);
        }
        v
    }
}

struct Syncer<'a> {
    ctx: &'a Ctx,
    d: Deployment,
    d_api: Api<Deployment>,
    rs_api: Api<ReplicaSet>,
    ns: String,
    name: String,
}

async fn sync(ctx: &Ctx, key: String) -> anyhow::Result<Option<Duration>> {
    let (ns, name) = cu::split_key(&key);
    let d_api: Api<Deployment> = Api::namespaced(ctx.client.clone(), ns);
    let Some(d) = ctx.deployments.get_key(&key) else {
        return Ok(None);
    };
    let mut s = Syncer {
        ctx,
        rs_api: Api::namespaced(ctx.client.clone(), ns),
        d_api,
        d: (*d).clone(),
        ns: ns.to_string(),
        name: name.to_string(),
    };
    s.sync().await
}

impl Syncer<'_> {
    async fn sync(&mut self) -> anyhow::Result<Option<Duration>> {
        let spec = self.d.spec.clone().unwrap_or_default();
        let selector = cu::selector_of(Some(&spec.selector));
        if selector.is_empty() {
            self.ctx.recorder.event(
                &self.d,
                "Warning",
                "SelectingAll",
                "This deployment is selecting all pods. A non-empty selector is required.",
            );
            if self.d.status.as_ref().and_then(|s| s.observed_generation) < self.d.metadata.generation {
                self.d.status.get_or_insert_with(Default::default).observed_generation = self.d.metadata.generation;
                self.update_status().await?;
            }
            return Ok(None);
        }
        let uid = self.d.metadata.uid.clone().unwrap_or_default();
        let list = self.ctx.replicasets.list_claimable(&self.ns, &uid, &selector);
        let rs_list: Vec<ReplicaSet> =
            cu::claim(&self.rs_api, &self.d.metadata, "apps/v1", "Deployment", &selector, list)
                .await?
                .owned
                .iter()
                .map(|rs| (**rs).clone())
                .collect();

        if self.d.metadata.deletion_timestamp.is_some() {
            let sets = self.get_all(&rs_list, false).await?;
            self.sync_deployment_status(&sets).await?;
            return Ok(None);
        }
        self.check_paused_conditions().await?;
        if spec.paused == Some(true) {
            return self.sync_scaling(&rs_list).await;
        }
        if self.is_scaling_event(&rs_list).await? {
            return self.sync_scaling(&rs_list).await;
        }
        if is_rolling_update(&self.d) {
            self.rollout_rolling(&rs_list).await
        } else {
            self.rollout_recreate(&rs_list, &selector).await
        }
    }

    async fn update_status(&mut self) -> anyhow::Result<()> {
        let updated = self
            .d_api
            .replace_status(&self.name, &PostParams::default(), &self.d)
            .await?;
        self.d = updated;
        Ok(())
    }

    /// Set the deployment's revision annotation (a metadata write), as upstream's
    /// `SetDeploymentRevision`.
    async fn set_deployment_revision(&mut self, revision: &str) -> anyhow::Result<()> {
        if annotation(&self.d.metadata, REVISION) == Some(revision) {
            return Ok(());
        }
        // An update, as upstream's (its role may update deployments, not patch them).
        let mut copy = self.d.clone();
        copy.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(REVISION.to_string(), revision.to_string());
        let updated = self.d_api.replace(&self.name, &PostParams::default(), &copy).await?;
        self.d.metadata = updated.metadata;
        Ok(())
    }

    async fn check_paused_conditions(&mut self) -> anyhow::Result<()> {
        if !has_progress_deadline(&self.d) {
            return Ok(());
        }
        let status = self.d.status.clone().unwrap_or_default();
        let cond = get_condition(&status, "Progressing");
        let reason = cond.and_then(|c| c.reason.clone());
        if reason.as_deref() == Some(TIMED_OUT_REASON) {
            return Ok(());
        }
        let paused = self.d.spec.as_ref().and_then(|s| s.paused) == Some(true);
        let c = if paused && reason.as_deref() != Some(PAUSED_REASON) {
            new_condition("Progressing", "Unknown", PAUSED_REASON, "Deployment is paused".into())
        } else if !paused && reason.as_deref() == Some(PAUSED_REASON) {
            new_condition("Progressing", "Unknown", RESUMED_REASON, "Deployment is resumed".into())
        } else {
            return Ok(());
        };
        set_condition(self.d.status.get_or_insert_with(Default::default), c);
        self.update_status().await
    }

    /// Upstream's `getAllReplicaSetsAndSyncRevision`.
    async fn get_all(&mut self, rs_list: &[ReplicaSet], create: bool) -> anyhow::Result<Sets> {
        let template = self.d.spec.as_ref().map(|s| s.template.clone());
        let mut sorted: Vec<&ReplicaSet> = rs_list.iter().collect();
        sorted.sort_by(|a, b| by_creation(a, b));
        let existing = sorted
            .iter()
            .find(|rs| equal_ignore_hash(rs.spec.as_ref().and_then(|s| s.template.as_ref()), template.as_ref()))
            .map(|rs| (*rs).clone());
        let old: Vec<ReplicaSet> = rs_list
            .iter()
            .filter(|rs| existing.as_ref().is_none_or(|e| e.metadata.uid != rs.metadata.uid))
            .cloned()
            .collect();
        let max_old = old.iter().map(|rs| revision(&rs.metadata)).max().unwrap_or(0);
        let new_revision = max_old + 1;
        let new = match existing {
            Some(rs) => Some(self.sync_existing_new_rs(rs, new_revision).await?),
            None if create => self.create_new_rs(&old, new_revision).await?,
            None => None,
        };
        Ok(Sets { new, old })
    }

    async fn sync_existing_new_rs(&mut self, rs: ReplicaSet, new_revision: i64) -> anyhow::Result<ReplicaSet> {
        let mut copy = rs.clone();
        let annotations_updated = set_new_rs_annotations(&self.d, &mut copy, new_revision, true);
        let min_ready = self.d.spec.as_ref().and_then(|s| s.min_ready_seconds);
        let min_ready_changed = copy.spec.as_ref().and_then(|s| s.min_ready_seconds) != min_ready;
        let mut rs = rs;
        if annotations_updated || min_ready_changed {
            if let Some(s) = copy.spec.as_mut() {
                s.min_ready_seconds = min_ready;
            }
            let name = copy.metadata.name.clone().unwrap_or_default();
            rs = self.rs_api.replace(&name, &PostParams::default(), &copy).await?;
        }
        let rev = annotation(&rs.metadata, REVISION).unwrap_or_default().to_string();
        self.set_deployment_revision(&rev).await?;
        let status = self.d.status.clone().unwrap_or_default();
        if has_progress_deadline(&self.d) && get_condition(&status, "Progressing").is_none() {
            let msg = format!(
                "Found new replica set \"{}\"",
                rs.metadata.name.clone().unwrap_or_default()
            );
            set_condition(
                self.d.status.get_or_insert_with(Default::default),
                new_condition("Progressing", "True", FOUND_NEW_RS_REASON, msg),
            );
            self.update_status().await?;
        }
        Ok(rs)
    }

    async fn create_new_rs(&mut self, old: &[ReplicaSet], new_revision: i64) -> anyhow::Result<Option<ReplicaSet>> {
        let spec = self.d.spec.clone().unwrap_or_default();
        let collision = self.d.status.as_ref().and_then(|s| s.collision_count);
        let hash = cu::compute_hash(&spec.template, collision);
        let mut template = spec.template.clone();
        template
            .metadata
            .get_or_insert_with(Default::default)
            .labels
            .get_or_insert_with(Default::default)
            .insert(HASH_LABEL.to_string(), hash.clone());
        let mut selector = spec.selector.clone();
        selector
            .match_labels
            .get_or_insert_with(Default::default)
            .insert(HASH_LABEL.to_string(), hash.clone());
        let rs_name = format!("{}-{}", self.name, hash);
        let mut new_rs = ReplicaSet {
            metadata: ObjectMeta {
                name: Some(rs_name.clone()),
                namespace: Some(self.ns.clone()),
                owner_references: Some(vec![cu::new_controller_ref(&self.d.metadata, "apps/v1", "Deployment")]),
                labels: template.metadata.as_ref().and_then(|m| m.labels.clone()),
                ..Default::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(0),
                min_ready_seconds: spec.min_ready_seconds,
                selector,
                template: Some(template),
            }),
            status: None,
        };
        let mut all: Vec<&ReplicaSet> = old.iter().collect();
        all.push(&new_rs);
        let new_replicas = new_rs_new_replicas(&self.d, &all, &new_rs);
        if let Some(s) = new_rs.spec.as_mut() {
            s.replicas = Some(new_replicas);
        }
        set_new_rs_annotations(&self.d, &mut new_rs, new_revision, false);
        let created = match self.rs_api.create(&PostParams::default(), &new_rs).await {
            Ok(rs) => rs,
            Err(e) if cu::is_already_exists(&e) => {
                let Some(existing) = self.rs_api.get_opt(&rs_name).await? else {
                    anyhow::bail!("replica set {rs_name} exists and then does not");
                };
                let ours = cu::controller_ref(&existing.metadata)
                    .is_some_and(|c| Some(&c.uid) == self.d.metadata.uid.as_ref());
                if ours
                    && equal_ignore_hash(
                        existing.spec.as_ref().and_then(|s| s.template.as_ref()),
                        Some(&spec.template),
                    )
                {
                    return Ok(Some(existing));
                }
                // A hash collision: count it so the next hash differs.
                let st = self.d.status.get_or_insert_with(Default::default);
                st.collision_count = Some(st.collision_count.unwrap_or(0) + 1);
                self.update_status().await?;
                anyhow::bail!("hash collision for replica set {rs_name}");
            }
            Err(e) => {
                if has_progress_deadline(&self.d) {
                    let msg = format!(
                        "Failed to create new replica set \"{rs_name}\": {}",
                        crate::replicaset::api_message(&e)
                    );
                    set_condition(
                        self.d.status.get_or_insert_with(Default::default),
                        new_condition("Progressing", "False", FAILED_RS_CREATE_REASON, msg.clone()),
                    );
                    self.ctx
                        .recorder
                        .event(&self.d, "Warning", FAILED_RS_CREATE_REASON, &msg);
                    self.update_status().await?;
                }
                return Err(e.into());
            }
        };
        if new_replicas > 0 {
            let msg = format!("Scaled up replica set {rs_name} from 0 to {new_replicas}");
            self.ctx.recorder.event(&self.d, "Normal", "ScalingReplicaSet", &msg);
        }
        self.set_deployment_revision(&new_revision.to_string()).await?;
        if has_progress_deadline(&self.d) {
            let msg = format!("Created new replica set \"{rs_name}\"");
            set_condition(
                self.d.status.get_or_insert_with(Default::default),
                new_condition("Progressing", "True", NEW_RS_REASON, msg),
            );
            self.update_status().await?;
        }
        Ok(Some(created))
    }

    /// Scale a ReplicaSet (and refresh its replica annotations), with a ScalingReplicaSet
    /// event when the size changes. Returns whether the size changed.
    async fn scale(&mut self, rs: &mut ReplicaSet, new_scale: i32) -> anyhow::Result<bool> {
        let old_scale = replicas(rs);
        let mut copy = rs.clone();
        let size_changed = old_scale != new_scale;
        let ann_changed =
            set_replicas_annotations(&mut copy, d_replicas(&self.d), d_replicas(&self.d) + max_surge(&self.d));
        if !size_changed && !ann_changed {
            return Ok(false);
        }
        if let Some(s) = copy.spec.as_mut() {
            s.replicas = Some(new_scale);
        }
        let name = copy.metadata.name.clone().unwrap_or_default();
        *rs = self.rs_api.replace(&name, &PostParams::default(), &copy).await?;
        if size_changed {
            let op = if old_scale < new_scale { "up" } else { "down" };
            let msg = format!("Scaled {op} replica set {name} from {old_scale} to {new_scale}");
            self.ctx.recorder.event(&self.d, "Normal", "ScalingReplicaSet", &msg);
        }
        Ok(size_changed)
    }

    async fn scale_if_needed(&mut self, rs: &mut ReplicaSet, new_scale: i32) -> anyhow::Result<bool> {
        if replicas(rs) == new_scale {
            return Ok(false);
        }
        self.scale(rs, new_scale).await
    }

    async fn is_scaling_event(&mut self, rs_list: &[ReplicaSet]) -> anyhow::Result<bool> {
        let sets = self.get_all(rs_list, false).await?;
        let want = d_replicas(&self.d);
        Ok(sets
            .all()
            .iter()
            .filter(|rs| replicas(rs) > 0)
            .any(|rs| int_annotation(&rs.metadata, DESIRED_REPLICAS).is_some_and(|v| v != want)))
    }

    /// Upstream's `sync`: scaling and paused deployments.
    async fn sync_scaling(&mut self, rs_list: &[ReplicaSet]) -> anyhow::Result<Option<Duration>> {
        let mut sets = self.get_all(rs_list, false).await?;
        self.scale_all(&mut sets).await?;
        if self.d.spec.as_ref().and_then(|s| s.paused) == Some(true) {
            self.cleanup(&sets).await?;
        }
        self.sync_deployment_status(&sets).await?;
        Ok(None)
    }

    /// Upstream's `scale`: proportional scaling across the active ReplicaSets.
    async fn scale_all(&mut self, sets: &mut Sets) -> anyhow::Result<()> {
        let want = d_replicas(&self.d);
        // The one active (or latest) ReplicaSet takes the whole size.
        sets.old.sort_by(|a, b| by_creation(b, a));
        let active: Vec<usize> = (0..sets.old.len()).filter(|i| replicas(&sets.old[*i]) > 0).collect();
        let new_active = sets.new.as_ref().is_some_and(|n| replicas(n) > 0);
        let n_active = active.len() + usize::from(new_active);
        if n_active <= 1 {
            if n_active == 1 {
                if new_active {
                    if let Some(mut n) = sets.new.take() {
                        let r = self.scale_if_needed(&mut n, want).await;
                        sets.new = Some(n);
                        r?;
                    }
                } else {
                    let i = active[0];
                    let mut rs = sets.old[i].clone();
                    self.scale_if_needed(&mut rs, want).await?;
                    sets.old[i] = rs;
                }
                return Ok(());
            }
            if let Some(mut n) = sets.new.take() {
                let r = self.scale_if_needed(&mut n, want).await;
                sets.new = Some(n);
                r?;
                return Ok(());
            }
            if !sets.old.is_empty() {
                let mut rs = sets.old[0].clone();
                self.scale_if_needed(&mut rs, want).await?;
                sets.old[0] = rs;
            }
            return Ok(());
        }
        // Saturated new ReplicaSet: the old ones go to zero.
        if let Some(n) = &sets.new
            && replicas(n) == want
            && int_annotation(&n.metadata, DESIRED_REPLICAS) == Some(want)
            && available(n) == want
        {
            for i in active {
                let mut rs = sets.old[i].clone();
                self.scale_if_needed(&mut rs, 0).await?;
                sets.old[i] = rs;
            }
            return Ok(());
        }
        if !is_rolling_update(&self.d) {
            return Ok(());
        }
        let mut all: Vec<ReplicaSet> = active.iter().map(|i| sets.old[*i].clone()).collect();
        if let Some(n) = &sets.new
            && new_active
        {
            all.push(n.clone());
        }
        let total: i32 = all.iter().map(replicas).sum();
        let allowed = if want > 0 { want + max_surge(&self.d) } else { 0 };
        let to_add = allowed - total;
        let sizes = proportional_sizes(&self.d, &mut all, to_add);
        for (mut rs, size) in all.into_iter().zip(sizes) {
            self.scale(&mut rs, size).await?;
            let uid = rs.metadata.uid.clone();
            if sets.new.as_ref().is_some_and(|n| n.metadata.uid == uid) {
                sets.new = Some(rs);
            } else if let Some(slot) = sets.old.iter_mut().find(|o| o.metadata.uid == uid) {
                *slot = rs;
            }
        }
        Ok(())
    }

    async fn sync_deployment_status(&mut self, sets: &Sets) -> anyhow::Result<()> {
        let new_status = calculate_status(&sets.all(), sets.new.as_ref(), &self.d);
        if self.d.status.as_ref() == Some(&new_status) {
            return Ok(());
        }
        self.d.status = Some(new_status);
        self.update_status().await
    }

    /// Upstream's `cleanupDeployment`: old ReplicaSets beyond revisionHistoryLimit go.
    async fn cleanup(&mut self, sets: &Sets) -> anyhow::Result<()> {
        let Some(limit) = self.d.spec.as_ref().and_then(|s| s.revision_history_limit) else {
            return Ok(());
        };
        let mut cleanable: Vec<&ReplicaSet> = sets
            .old
            .iter()
            .filter(|rs| status_replicas(rs) == 0 && replicas(rs) == 0 && rs.metadata.deletion_timestamp.is_none())
            .collect();
        let diff = cleanable.len() as i64 - i64::from(limit);
        if diff <= 0 {
            return Ok(());
        }
        cleanable.sort_by(|a, b| {
            revision(&a.metadata)
                .cmp(&revision(&b.metadata))
                .then_with(|| by_creation(a, b))
        });
        for rs in cleanable.into_iter().take(diff as usize) {
            let observed = rs.status.as_ref().and_then(|s| s.observed_generation).unwrap_or(0);
            if rs.metadata.generation.unwrap_or(0) > observed {
                continue;
            }
            let name = rs.metadata.name.clone().unwrap_or_default();
            cu::delete_ignoring_missing(&self.rs_api, &name, &DeleteParams::default()).await?;
        }
        Ok(())
    }

    async fn rollout_rolling(&mut self, rs_list: &[ReplicaSet]) -> anyhow::Result<Option<Duration>> {
        let mut sets = self.get_all(rs_list, true).await?;
        // Reconcile the new ReplicaSet.
        if let Some(mut n) = sets.new.take() {
            let want = d_replicas(&self.d);
            let all: Vec<&ReplicaSet> = sets.old.iter().chain(std::iter::once(&n)).collect();
            let target = if replicas(&n) > want {
                Some(want)
            } else if replicas(&n) < want {
                Some(new_rs_new_replicas(&self.d, &all, &n))
            } else {
                None
            };
            let scaled = match target {
                Some(t) => self.scale_if_needed(&mut n, t).await,
                None => Ok(false),
            };
            sets.new = Some(n);
            if scaled? {
                return self.sync_rollout_status(&sets).await;
            }
        }
        if self.reconcile_old(&mut sets).await? {
            return self.sync_rollout_status(&sets).await;
        }
        if deployment_complete(&self.d, &self.d.status.clone().unwrap_or_default()) {
            self.cleanup(&sets).await?;
        }
        self.sync_rollout_status(&sets).await
    }

    /// Upstream's `reconcileOldReplicaSets`.
    async fn reconcile_old(&mut self, sets: &mut Sets) -> anyhow::Result<bool> {
        let old_count: i32 = sets.old.iter().map(replicas).sum();
        if old_count == 0 {
            return Ok(false);
        }
        let all_count: i32 = sets.all().iter().map(|r| replicas(r)).sum();
        let min_available = d_replicas(&self.d) - max_unavailable(&self.d);
        let new_unavailable = sets.new.as_ref().map(|n| replicas(n) - available(n)).unwrap_or(0);
        let max_scaled_down = all_count - min_available - new_unavailable;
        if max_scaled_down <= 0 {
            return Ok(false);
        }
        sets.old.sort_by(by_creation);
        // Unhealthy old replicas first.
        let mut cleaned = 0;
        for i in 0..sets.old.len() {
            if cleaned >= max_scaled_down {
                break;
            }
            let rs = &sets.old[i];
            if replicas(rs) == 0 {
                continue;
            }
            let unhealthy = replicas(rs) - available(rs);
            if unhealthy <= 0 {
                continue;
            }
            let count = (max_scaled_down - cleaned).min(unhealthy);
            let mut rs = rs.clone();
            let target = replicas(&rs) - count;
            self.scale_if_needed(&mut rs, target).await?;
            sets.old[i] = rs;
            cleaned += count;
        }
        // Then as many available ones as minAvailable allows.
        let available_count: i32 = sets.all().iter().map(|r| available(r)).sum();
        let mut scaled = 0;
        if available_count > min_available {
            let total = available_count - min_available;
            for i in 0..sets.old.len() {
                if scaled >= total {
                    break;
                }
                if replicas(&sets.old[i]) == 0 {
                    continue;
                }
                let count = replicas(&sets.old[i]).min(total - scaled);
                let mut rs = sets.old[i].clone();
                let target = replicas(&rs) - count;
                self.scale_if_needed(&mut rs, target).await?;
                sets.old[i] = rs;
                scaled += count;
            }
        }
        Ok(cleaned + scaled > 0)
    }

    async fn rollout_recreate(
        &mut self,
        rs_list: &[ReplicaSet],
        selector: &skiff_api::selector::LabelSelector,
    ) -> anyhow::Result<Option<Duration>> {
        let mut sets = self.get_all(rs_list, false).await?;
        let mut scaled_down = false;
        for i in 0..sets.old.len() {
            if replicas(&sets.old[i]) > 0 {
                let mut rs = sets.old[i].clone();
                scaled_down |= self.scale_if_needed(&mut rs, 0).await?;
                sets.old[i] = rs;
            }
        }
        if scaled_down {
            return self.sync_rollout_status(&sets).await;
        }
        if self.old_pods_running(&sets, selector).await? {
            return self.sync_rollout_status(&sets).await;
        }
        if sets.new.is_none() {
            sets = self.get_all(rs_list, true).await?;
        }
        if let Some(mut n) = sets.new.take() {
            let r = self.scale_if_needed(&mut n, d_replicas(&self.d)).await;
            sets.new = Some(n);
            r?;
        }
        if deployment_complete(&self.d, &self.d.status.clone().unwrap_or_default()) {
            self.cleanup(&sets).await?;
        }
        self.sync_rollout_status(&sets).await
    }

    /// Upstream's `oldPodsRunning`.
    async fn old_pods_running(
        &self,
        sets: &Sets,
        selector: &skiff_api::selector::LabelSelector,
    ) -> anyhow::Result<bool> {
        if sets.old.iter().map(status_replicas).sum::<i32>() > 0 {
            return Ok(true);
        }
        // The old sets' pods, from the pod informer's owner index.
        Ok(sets
            .old
            .iter()
            .filter_map(|rs| rs.metadata.uid.as_deref())
            .flat_map(|uid| self.ctx.pods.list_controlled_by(uid))
            .filter(|p| cu::labels_match(selector, &p.metadata))
            .any(|p| !matches!(cu::pod_phase(&p), "Failed" | "Succeeded")))
    }

    /// Upstream's `syncRolloutStatus`.
    async fn sync_rollout_status(&mut self, sets: &Sets) -> anyhow::Result<Option<Duration>> {
        let now = jiff::Timestamp::now();
        let mut new_status = calculate_status(&sets.all(), sets.new.as_ref(), &self.d);
        if !has_progress_deadline(&self.d) {
            remove_condition(&mut new_status, "Progressing");
        }
        let current = get_condition(&new_status, "Progressing").cloned();
        let complete = deployment_complete(&self.d, &new_status);
        let rs_name = sets.new.as_ref().and_then(|n| n.metadata.name.clone());
        if has_progress_deadline(&self.d)
            && current.as_ref().and_then(|c| c.reason.as_deref()) != Some(TIMED_OUT_REASON)
        {
            if complete {
                let msg = match &rs_name {
                    Some(n) => format!("ReplicaSet \"{n}\" has successfully progressed."),
                    None => format!("Deployment \"{}\" has successfully progressed.", self.name),
                };
                set_condition(
                    &mut new_status,
                    new_condition("Progressing", "True", NEW_RS_AVAILABLE_REASON, msg),
                );
            } else if deployment_progressing(&self.d, &new_status) {
                let msg = match &rs_name {
                    Some(n) => format!("ReplicaSet \"{n}\" is progressing."),
                    None => format!("Deployment \"{}\" is progressing.", self.name),
                };
                let mut c = new_condition("Progressing", "True", RS_UPDATED_REASON, msg);
                if let Some(cur) = &current
                    && cur.status == "True"
                {
                    c.last_transition_time = cur.last_transition_time.clone();
                }
                remove_condition(&mut new_status, "Progressing");
                set_condition(&mut new_status, c);
            } else if deployment_timed_out(&self.d, &new_status, now) {
                let msg = match &rs_name {
                    Some(n) => format!("ReplicaSet \"{n}\" has timed out progressing."),
                    None => format!("Deployment \"{}\" has timed out progressing.", self.name),
                };
                set_condition(
                    &mut new_status,
                    new_condition("Progressing", "False", TIMED_OUT_REASON, msg),
                );
            }
        }
        // ReplicaFailure mirrors the new ReplicaSet's.
        let failure = sets
            .new
            .as_ref()
            .and_then(|n| n.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "ReplicaFailure"))
            .cloned();
        match failure {
            Some(f) => set_condition(
                &mut new_status,
                DeploymentCondition {
                    type_: "ReplicaFailure".into(),
                    status: f.status,
                    reason: f.reason,
                    message: f.message,
                    last_update_time: f.last_transition_time.clone(),
                    last_transition_time: f.last_transition_time,
                },
            ),
            None => remove_condition(&mut new_status, "ReplicaFailure"),
        }
        let again = requeue_stuck(&self.d, &new_status, now);
        if self.d.status.as_ref() == Some(&new_status) {
            return Ok(again);
        }
        self.d.status = Some(new_status);
        self.update_status().await?;
        Ok(again)
    }
}

/// Upstream's proportional scaling: the sizes of `all` (the active ReplicaSets) after adding
/// `to_add` replicas (negative to remove), spread by each one's share of the
/// `max-replicas` annotation, the leftover going to the first.
pub fn proportional_sizes(d: &Deployment, all: &mut [ReplicaSet], to_add: i32) -> Vec<i32> {
    let newer_first = |a: &ReplicaSet, b: &ReplicaSet| by_creation(b, a);
    if to_add > 0 {
        all.sort_by(|a, b| replicas(b).cmp(&replicas(a)).then_with(|| newer_first(a, b)));
    } else {
        all.sort_by(|a, b| replicas(b).cmp(&replicas(a)).then_with(|| by_creation(a, b)));
    }
    let mut sizes: Vec<i32> = all.iter().map(replicas).collect();
    if to_add == 0 {
        return sizes;
    }
    let mut added = 0;
    for (i, rs) in all.iter().enumerate() {
        let p = proportion(d, rs, to_add, added);
        sizes[i] += p;
        added += p;
    }
    if let Some(first) = sizes.first_mut() {
        *first = (*first + to_add - added).max(0);
    }
    sizes
}

/// Upstream's `GetProportion`.
fn proportion(d: &Deployment, rs: &ReplicaSet, to_add: i32, added: i32) -> i32 {
    if replicas(rs) == 0 || to_add == 0 || to_add == added {
        return 0;
    }
    let fraction = rs_fraction(d, rs);
    let allowed = to_add - added;
    if to_add > 0 {
        fraction.min(allowed)
    } else {
        fraction.max(allowed)
    }
}

/// Upstream's `getReplicaSetFraction`.
fn rs_fraction(d: &Deployment, rs: &ReplicaSet) -> i32 {
    if d_replicas(d) == 0 {
        return -replicas(rs);
    }
    let deployment_replicas = d_replicas(d) + max_surge(d);
    let annotated = int_annotation(&rs.metadata, MAX_REPLICAS)
        .unwrap_or_else(|| d.status.as_ref().and_then(|s| s.replicas).unwrap_or(0));
    if annotated == 0 {
        return 0;
    }
    let size = f64::from(replicas(rs)) * f64::from(deployment_replicas) / f64::from(annotated);
    size.round() as i32 - replicas(rs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::{DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    fn deploy(replicas: i32, surge: IntOrString, unavailable: IntOrString) -> Deployment {
        Deployment {
            metadata: ObjectMeta::default(),
            spec: Some(DeploymentSpec {
                replicas: Some(replicas),
                strategy: Some(DeploymentStrategy {
                    type_: Some("RollingUpdate".into()),
                    rolling_update: Some(RollingUpdateDeployment {
                        max_surge: Some(surge),
                        max_unavailable: Some(unavailable),
                    }),
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn rs(name: &str, replicas: i32, max_replicas: Option<i32>) -> ReplicaSet {
        ReplicaSet {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations: max_replicas.map(|m| [(MAX_REPLICAS.to_string(), m.to_string())].into()),
                ..Default::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(replicas),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn fenceposts_round_surge_up_and_unavailable_down() {
        let pct = |s: &str| IntOrString::String(s.into());
        assert_eq!(
            resolve_fenceposts(Some(&pct("25%")), Some(&pct("25%")), 10).unwrap(),
            (3, 2)
        );
        assert_eq!(
            resolve_fenceposts(Some(&pct("25%")), Some(&pct("25%")), 1).unwrap(),
            (1, 0)
        );
        assert_eq!(
            resolve_fenceposts(Some(&IntOrString::Int(0)), Some(&pct("10%")), 5).unwrap(),
            (0, 1)
        );
        assert_eq!(resolve_fenceposts(None, None, 4).unwrap(), (1, 1));
    }

    #[test]
    fn max_unavailable_is_capped_and_zero_for_recreate() {
        let d = deploy(2, IntOrString::Int(1), IntOrString::Int(5));
        assert_eq!(max_unavailable(&d), 2);
        assert_eq!(max_surge(&d), 1);
        let mut r = d.clone();
        if let Some(s) = r.spec.as_mut() {
            s.strategy = Some(DeploymentStrategy {
                type_: Some("Recreate".into()),
                rolling_update: None,
            });
        }
        assert_eq!(max_unavailable(&r), 0);
        assert_eq!(max_surge(&r), 0);
    }

    #[test]
    fn new_replica_set_grows_within_surge() {
        let d = deploy(3, IntOrString::Int(1), IntOrString::Int(0));
        let old = rs("old", 3, None);
        let new = rs("new", 0, None);
        assert_eq!(new_rs_new_replicas(&d, &[&old, &new], &new), 1);
        let new2 = rs("new", 1, None);
        assert_eq!(new_rs_new_replicas(&d, &[&old, &new2], &new2), 1);
        let old2 = rs("old", 2, None);
        assert_eq!(new_rs_new_replicas(&d, &[&old2, &new2], &new2), 2);
    }

    #[test]
    fn proportional_scaling_spreads_by_share() {
        // 10 replicas, surge 3: sets of 8 and 5 (max 13) scaled to 15+3=18 total.
        let mut d = deploy(15, IntOrString::Int(3), IntOrString::Int(2));
        d.status = Some(DeploymentStatus::default());
        let mut all = vec![rs("a", 8, Some(13)), rs("b", 5, Some(13))];
        let sizes = proportional_sizes(&d, &mut all, 18 - 13);
        assert_eq!(sizes.iter().sum::<i32>(), 18);
        assert_eq!(sizes, vec![11, 7]);
    }

    #[test]
    fn hash_label_is_ignored_when_comparing_templates() {
        use k8s_openapi::api::core::v1::PodTemplateSpec;
        let t = |labels: &[(&str, &str)]| PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                ..Default::default()
            }),
            spec: None,
        };
        assert!(equal_ignore_hash(
            Some(&t(&[("app", "web"), (HASH_LABEL, "abc")])),
            Some(&t(&[("app", "web")]))
        ));
        assert!(!equal_ignore_hash(
            Some(&t(&[("app", "api")])),
            Some(&t(&[("app", "web")]))
        ));
    }

    #[test]
    fn revision_annotations_track_history() {
        let d = deploy(3, IntOrString::Int(1), IntOrString::Int(0));
        let mut r = rs("a", 1, None);
        assert!(set_new_rs_annotations(&d, &mut r, 1, false));
        assert_eq!(revision(&r.metadata), 1);
        assert_eq!(int_annotation(&r.metadata, MAX_REPLICAS), Some(4));
        assert!(set_new_rs_annotations(&d, &mut r, 3, true));
        assert_eq!(revision(&r.metadata), 3);
        assert_eq!(annotation(&r.metadata, REVISION_HISTORY), Some("1"));
        assert!(!set_new_rs_annotations(&d, &mut r, 2, true));
    }
}
