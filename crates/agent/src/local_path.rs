//! The node's volume provisioner for the `local-path` StorageClass: rancher's local-path-provisioner
//! as sig-storage-lib-external-provisioner runs it (its events, its finalizer, its volume names),
//! except that every node agent runs one for its own node, so directories are made and removed by
//! the agent of the node they live on rather than by helper pods.
//!
//! - Provisioning: a claim the PV binder handed to [`PROVISIONER`] (its
//!   `volume.kubernetes.io/storage-provisioner` annotation) whose selected node
//!   (`volume.kubernetes.io/selected-node`, set by the scheduler for WaitForFirstConsumer classes) is
//!   this node gets the directory `STORAGE/pvc-UID_NAMESPACE_NAME` (mode 0777) and the
//!   PersistentVolume `pvc-UID`: a `DirectoryOrCreate` hostPath with node affinity to this node,
//!   pre-bound to the claim, which the PV binder then binds.
//! - Deletion: a volume of this node that is Released with policy Delete loses its directory (only
//!   a real directory directly inside the storage path; never through a symlink), then the volume
//!   object is deleted and the provisioner's finalizer removed. Retain keeps both.
//! - Expansion (external-resizer and kubelet in one, for volumes that are directories and so have no
//!   size): a bound claim whose request grew gets its volume's capacity raised, then its
//!   `status.capacity`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    HostPathVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume,
    PersistentVolumeClaim, PersistentVolumeClaimCondition, PersistentVolumeClaimStatus, PersistentVolumeSpec,
    VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use parking_lot::Mutex;
use skiff_api::volume::{
    ANN_BETA_STORAGE_PROVISIONER, ANN_DYNAMICALLY_PROVISIONED, ANN_SELECTED_NODE, ANN_STORAGE_PROVISIONER, CLAIM_BOUND,
    LOCAL_PATH_PROVISIONER, VOLUME_BOUND, VOLUME_RELEASED, annotation, claim_capacity, claim_class, claim_key,
    claim_phase, claim_reference, claim_request, claim_volume_name, reclaim_policy, storage, volume_capacity,
    volume_phase,
};
use tokio::sync::mpsc;

use crate::events::{self, NORMAL, Recorder, WARNING};

/// The provisioner's name, in StorageClasses and on the volumes it made.
pub const PROVISIONER: &str = LOCAL_PATH_PROVISIONER;
/// The finalizer external provisioners put on the volumes they will delete.
pub const FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";

/// local-path-provisioner's default node affinity key; Skiff's nodes carry their name in it.
const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

const READ_WRITE_ONCE: &str = "ReadWriteOnce";
const READ_WRITE_ONCE_POD: &str = "ReadWriteOncePod";

/// The claim conditions resizing sets and clears (upstream's `knownResizeConditions`).
const RESIZE_CONDITIONS: [&str; 4] = [
    "Resizing",
    "FileSystemResizePending",
    "ControllerResizeError",
    "NodeResizeError",
];

/// Retries of a failed object start here and double up to `MAX_RETRY`.
const FIRST_RETRY: Duration = Duration::from_secs(2);
const MAX_RETRY: Duration = Duration::from_secs(300);

/// The name of the volume provisioned for a claim (the library's `getProvisionedVolumeNameForClaim`).
pub fn volume_name_for(claim: &PersistentVolumeClaim) -> String {
    format!("pvc-{}", claim.metadata.uid.as_deref().unwrap_or_default())
}

/// The directory of a claim's volume inside the storage path: `pvc-UID_NAMESPACE_NAME`, as
/// local-path-provisioner names its folders.
pub fn directory_name_for(claim: &PersistentVolumeClaim) -> String {
    [
        volume_name_for(claim).as_str(),
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default(),
    ]
    .join("_")
}

/// The provisioner the PV binder handed the claim to (the current annotation, else the beta one).
fn claim_provisioner(claim: &PersistentVolumeClaim) -> Option<&str> {
    annotation(&claim.metadata, ANN_STORAGE_PROVISIONER)
        .or_else(|| annotation(&claim.metadata, ANN_BETA_STORAGE_PROVISIONER))
}

fn selected_node(claim: &PersistentVolumeClaim) -> Option<&str> {
    annotation(&claim.metadata, ANN_SELECTED_NODE).filter(|n| !n.is_empty())
}

fn has_finalizer(pv: &PersistentVolume) -> bool {
    pv.metadata.finalizers.iter().flatten().any(|f| f == FINALIZER)
}

/// Whether the claim is one this node provisions, as the library's `shouldProvision` with the
/// selected node required to be this one: no volume yet, handed to this provisioner, and (for a
/// class that waits for its first consumer) a node selected. `None` when it is not this
/// provisioner's at all.
pub fn provisioning_node<'a>(claim: &'a PersistentVolumeClaim, class: &StorageClass) -> Option<Option<&'a str>> {
    if claim_volume_name(claim).is_some() || claim_provisioner(claim) != Some(PROVISIONER) {
        return None;
    }
    let node = selected_node(claim);
    if class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer") && node.is_none() {
        return None;
    }
    Some(node)
}

/// local-path-provisioner's checks of a claim before it makes a directory, with its messages.
pub fn check_claim(claim: &PersistentVolumeClaim, node: Option<&str>) -> Result<(), String> {
    let spec = claim.spec.clone().unwrap_or_default();
    if spec.selector.is_some() {
        return Err("claim.Spec.Selector is not supported".into());
    }
    if spec
        .access_modes
        .iter()
        .flatten()
        .any(|m| m != READ_WRITE_ONCE && m != READ_WRITE_ONCE_POD)
    {
        return Err("NodePath only supports ReadWriteOnce and ReadWriteOncePod (1.22+) access modes".into());
    }
    if node.is_none() {
        return Err("configuration error, no node was specified".into());
    }
    Ok(())
}

/// The volume provisioned for `claim` of `class` at `path` on node `node`: local-path's
/// PersistentVolume (a `DirectoryOrCreate` hostPath, required node affinity on the hostname,
/// the claim's size and access modes, the class's reclaim policy) completed as the library
/// completes it (pre-bound to the claim, the finalizer, `pv.kubernetes.io/provisioned-by`, the
/// claim's class).
pub fn provisioned_volume(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    node: &str,
    path: &Path,
) -> PersistentVolume {
    let spec = claim.spec.clone().unwrap_or_default();
    let capacity = claim_request(claim)
        .map(|q| BTreeMap::from([("storage".to_string(), q.clone())]))
        .unwrap_or_default();
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(volume_name_for(claim)),
            annotations: Some(BTreeMap::from([(
                ANN_DYNAMICALLY_PROVISIONED.to_string(),
                PROVISIONER.to_string(),
            )])),
            finalizers: Some(vec![FINALIZER.to_string()]),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            persistent_volume_reclaim_policy: Some(class.reclaim_policy.clone().unwrap_or_else(|| "Delete".into())),
            access_modes: spec.access_modes,
            volume_mode: Some("Filesystem".into()),
            capacity: Some(capacity),
            host_path: Some(HostPathVolumeSource {
                path: path.display().to_string(),
                type_: Some("DirectoryOrCreate".into()),
            }),
            node_affinity: Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: HOSTNAME_LABEL.into(),
                            operator: "In".into(),
                            values: Some(vec![node.to_string()]),
                        }]),
                        match_fields: None,
                    }],
                }),
            }),
            claim_ref: Some(claim_reference(claim)),
            storage_class_name: Some(claim_class(claim).to_string()),
            ..Default::default()
        }),
        status: None,
    }
}

/// The node and path of a volume this provisioner made, as local-path's `getPathAndNodeForPV`
/// finds them: the hostPath (or local) path and the single value of the first `In` requirement of
/// the required node affinity.
pub fn volume_node_and_path(pv: &PersistentVolume) -> Result<(String, String), String> {
    let spec = pv.spec.as_ref().ok_or("no path set")?;
    let path = match (&spec.host_path, &spec.local) {
        (Some(h), None) => h.path.clone(),
        (None, Some(l)) => l.path.clone(),
        _ => return Err("no path set".into()),
    };
    let affinity = spec.node_affinity.as_ref().ok_or("no NodeAffinity set")?;
    let required = affinity.required.as_ref().ok_or("no NodeAffinity.Required set")?;
    for term in &required.node_selector_terms {
        for expr in term.match_expressions.iter().flatten() {
            if expr.operator == "In" {
                return match expr.values.as_deref() {
                    Some([node]) => Ok((node.clone(), path)),
                    _ => Err("multiple values for the node affinity".into()),
                };
            }
        }
    }
    Err("cannot find affinited node".into())
}

/// The directory `path` names inside the storage path `root` (resolved), or why it is not one
/// this provisioner may remove: it must be a direct child of the root, given without `..`.
pub fn directory_in_root(root: &Path, path: &str) -> Result<PathBuf, String> {
    let p = Path::new(path);
    let plain = p.is_absolute()
        && p.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    match (plain, p.parent(), p.file_name()) {
        (true, Some(parent), Some(name)) if parent == root => Ok(root.join(name)),
        _ => Err(format!("{path} is outside the storage path {}", root.display())),
    }
}

/// Removes the volume directory `path` (checked with [`directory_in_root`]) and everything in it,
/// never following a symlink: the directory itself must be a real directory, and the removal
/// unlinks links below it rather than entering them. A directory already gone is removed.
pub fn remove_volume_directory(root: &Path, path: &str) -> Result<(), String> {
    let dir = directory_in_root(root, path)?;
    match std::fs::symlink_metadata(&dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("reading {}: {e}", dir.display())),
        Ok(m) if !m.file_type().is_dir() => {
            return Err(format!("{} is not a directory", dir.display()));
        }
        Ok(_) => {}
    }
    std::fs::remove_dir_all(&dir).map_err(|e| format!("removing {}: {e}", dir.display()))
}

/// Makes the storage path (mode 0700 when this makes it: volumes are for the pods that mount
/// them) and returns it resolved.
pub fn prepare_root(root: &Path) -> anyhow::Result<PathBuf> {
    if std::fs::symlink_metadata(root).is_err() {
        std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("setting the mode of {}", root.display()))?;
    }
    root.canonicalize()
        .with_context(|| format!("resolving {}", root.display()))
}

/// Makes a volume's directory `root/name` with mode 0777 (`mkdir -m 0777 -p`, as local-path's setup
/// script), refusing one that exists as anything but a real directory.
pub fn make_volume_directory(root: &Path, name: &str) -> Result<PathBuf, String> {
    crate::subpath::safe_make_dir(root, name, 0o777).map_err(|e| format!("{e:#}"))?;
    let dir = root.join(name);
    match std::fs::symlink_metadata(&dir) {
        Ok(m) if m.file_type().is_dir() => Ok(dir),
        Ok(_) => Err(format!("{} is not a directory", dir.display())),
        Err(e) => Err(format!("reading {}: {e}", dir.display())),
    }
}

/// Upstream's `MergeResizeConditionsOfPVC`: the resize conditions become `new` (an unchanged
/// status keeps its transition time), or stay when `keep_old`; other conditions stay.
fn merge_resize_conditions(
    old: &[PersistentVolumeClaimCondition],
    new: Vec<PersistentVolumeClaimCondition>,
    keep_old: bool,
) -> Option<Vec<PersistentVolumeClaimCondition>> {
    let mut pending: Vec<PersistentVolumeClaimCondition> = new;
    let mut out = Vec::new();
    for c in old {
        if !RESIZE_CONDITIONS.contains(&c.type_.as_str()) {
            out.push(c.clone());
            continue;
        }
        if let Some(i) = pending.iter().position(|n| n.type_ == c.type_) {
            let mut n = pending.remove(i);
            if n.status == c.status {
                n.last_transition_time = c.last_transition_time.clone();
            }
            out.push(n);
        } else if keep_old {
            out.push(c.clone());
        }
    }
    out.extend(pending);
    (!out.is_empty()).then_some(out)
}

/// The size a bound claim is to grow to, when its request exceeds its capacity (the resizer's
/// `pvcNeedResize`).
pub fn resize_wanted(claim: &PersistentVolumeClaim) -> Option<K8sQuantity> {
    if claim_phase(claim) != CLAIM_BOUND || claim_volume_name(claim).is_none() {
        return None;
    }
    let requested = claim_request(claim)?;
    (storage(Some(requested)) > storage(claim_capacity(claim))).then(|| requested.clone())
}

/// The claim's status while its volume grows to `size` (the resizer's
/// `markControllerResizeInProgress`): the `Resizing` condition, the storage's resource status
/// `ControllerResizeInProgress`, and `size` allocated.
pub fn status_resizing(claim: &PersistentVolumeClaim, size: &K8sQuantity) -> PersistentVolumeClaimStatus {
    let mut status = claim.status.clone().unwrap_or_default();
    let resizing = PersistentVolumeClaimCondition {
        type_: "Resizing".into(),
        status: "True".into(),
        last_transition_time: Some(Time(jiff::Timestamp::now())),
        ..Default::default()
    };
    status.conditions =
        merge_resize_conditions(status.conditions.as_deref().unwrap_or_default(), vec![resizing], false);
    status
        .allocated_resource_statuses
        .get_or_insert_with(BTreeMap::new)
        .insert("storage".into(), "ControllerResizeInProgress".into());
    status
        .allocated_resources
        .get_or_insert_with(BTreeMap::new)
        .insert("storage".into(), size.clone());
    status
}

/// The claim's status once its volume has grown to `size` (the resizer's
/// `markOverallExpansionAsFinished`; a directory needs no file system expansion on the node):
/// `size` as its capacity, no resize condition, no resource status for storage.
pub fn status_resized(claim: &PersistentVolumeClaim, size: &K8sQuantity) -> PersistentVolumeClaimStatus {
    let mut status = claim.status.clone().unwrap_or_default();
    status
        .capacity
        .get_or_insert_with(BTreeMap::new)
        .insert("storage".into(), size.clone());
    status.conditions = merge_resize_conditions(status.conditions.as_deref().unwrap_or_default(), Vec::new(), false);
    if let Some(statuses) = status.allocated_resource_statuses.as_mut() {
        statuses.remove("storage");
        if statuses.is_empty() {
            status.allocated_resource_statuses = None;
        }
    }
    status
}

/// What the provisioner works on.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    Claim { namespace: String, name: String },
    Volume(String),
}

/// Keys to sync, each queued once however often it is added.
#[derive(Clone)]
struct Queue {
    tx: mpsc::UnboundedSender<Key>,
    queued: Arc<Mutex<HashSet<Key>>>,
}

impl Queue {
    fn add(&self, key: Key) {
        if self.queued.lock().insert(key.clone()) {
            let _ = self.tx.send(key);
        }
    }

    fn add_after(&self, key: Key, delay: Duration) {
        let queue = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            queue.add(key);
        });
    }
}

/// A node's provisioner.
pub struct LocalPath {
    /// Reads, as the provisioner's service account ([`crate::parts`]).
    client: kube::Client,
    /// Writes, as the node (NodeRestriction holds it to the volumes of its own node).
    node_client: kube::Client,
    /// The node, also the value of its `kubernetes.io/hostname` label.
    node: String,
    /// The storage path, resolved.
    root: PathBuf,
    recorder: Recorder,
}

/// How a sync ended.
enum Outcome {
    Done,
    /// Try again later (a failure the user was told about, or one that may pass).
    Retry,
}

impl LocalPath {
    /// The provisioner of `node`, keeping volumes under `storage_path` (made if missing), reading
    /// through `client` and writing through `node_client`.
    pub fn new(
        client: kube::Client,
        node_client: kube::Client,
        node: &str,
        storage_path: &Path,
    ) -> anyhow::Result<LocalPath> {
        let root = prepare_root(storage_path)?;
        // As the library names its event source: the provisioner, then who runs it.
        let recorder = events::component(node_client.clone(), &format!("{PROVISIONER}_{node}"));
        Ok(LocalPath {
            client,
            node_client,
            node: node.to_string(),
            root,
            recorder,
        })
    }

    /// Watches claims and volumes and syncs those that concern this node, one at a time, until
    /// the watches end.
    pub async fn run(self) -> anyhow::Result<()> {
        tracing::info!(path = %self.root.display(), "local-path provisioner running");
        let (tx, mut rx) = mpsc::unbounded_channel();
        let queue = Queue {
            tx,
            queued: Default::default(),
        };
        let claims = tokio::spawn(watch_claims(self.client.clone(), queue.clone()));
        let volumes = tokio::spawn(watch_volumes(self.client.clone(), queue.clone()));
        let mut failures: HashMap<Key, u32> = HashMap::new();
        while let Some(key) = rx.recv().await {
            queue.queued.lock().remove(&key);
            let outcome = match &key {
                Key::Claim { namespace, name } => self.sync_claim(namespace, name).await,
                Key::Volume(name) => self.sync_volume(name).await,
            };
            let failed = match outcome {
                Ok(Outcome::Done) => {
                    failures.remove(&key);
                    continue;
                }
                Ok(Outcome::Retry) => None,
                Err(e) => Some(e),
            };
            let n = failures.entry(key.clone()).or_default();
            let delay = FIRST_RETRY.saturating_mul(1 << (*n).min(8)).min(MAX_RETRY);
            *n += 1;
            if let Some(e) = failed {
                tracing::warn!(?key, error = %format!("{e:#}"), retry_in = ?delay, "local-path provisioner");
            }
            queue.add_after(key, delay);
        }
        claims.abort();
        volumes.abort();
        Ok(())
    }

    async fn sync_claim(&self, namespace: &str, name: &str) -> anyhow::Result<Outcome> {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), namespace);
        let Some(claim) = claims.get_opt(name).await.context("reading the claim")? else {
            return Ok(Outcome::Done);
        };
        if claim_volume_name(&claim).is_none() {
            return self.provision(claim).await;
        }
        if let Some(size) = resize_wanted(&claim) {
            let statuses = Api::namespaced(self.node_client.clone(), namespace);
            return self.expand(statuses, claim, size).await;
        }
        Ok(Outcome::Done)
    }

    fn class_api(&self) -> Api<StorageClass> {
        Api::all(self.client.clone())
    }

    /// Volumes as the provisioner reads them.
    fn volume_reads(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    /// Volumes as the node writes them.
    fn volume_api(&self) -> Api<PersistentVolume> {
        Api::all(self.node_client.clone())
    }

    /// The library's `syncClaim` and `provisionClaimOperation` with local-path's `Provision`.
    async fn provision(&self, claim: PersistentVolumeClaim) -> anyhow::Result<Outcome> {
        if claim_provisioner(&claim) != Some(PROVISIONER) {
            return Ok(Outcome::Done);
        }
        let class_name = claim_class(&claim).to_string();
        let Some(class) = self
            .class_api()
            .get_opt(&class_name)
            .await
            .context("reading the class")?
        else {
            anyhow::bail!("storageClass {class_name:?} not found");
        };
        let Some(node) = provisioning_node(&claim, &class) else {
            return Ok(Outcome::Done);
        };
        if node.is_some_and(|n| n != self.node) {
            // Another node's agent provisions it.
            return Ok(Outcome::Done);
        }
        let pv_name = volume_name_for(&claim);
        if self
            .volume_reads()
            .get_opt(&pv_name)
            .await
            .context("reading the volume")?
            .is_some()
        {
            return Ok(Outcome::Done);
        }
        if claim.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block") {
            let msg = format!("{PROVISIONER} does not support block volume provisioning");
            self.recorder.event(&claim, WARNING, "ProvisioningFailed", msg);
            return Ok(Outcome::Done);
        }
        if class.provisioner != PROVISIONER {
            return Ok(Outcome::Done);
        }
        let key = claim_key(&claim);
        self.recorder.event(
            &claim,
            NORMAL,
            "Provisioning",
            format!("External provisioner is provisioning volume for claim {key:?}"),
        );
        if let Err(msg) = check_claim(&claim, node) {
            self.recorder.event(&claim, WARNING, "ProvisioningFailed", msg);
            return Ok(Outcome::Retry);
        }
        let root = self.root.clone();
        let dir_name = directory_name_for(&claim);
        let made = tokio::task::spawn_blocking(move || make_volume_directory(&root, &dir_name))
            .await
            .context("joining the directory maker")?;
        let path = match made {
            Ok(path) => path,
            Err(msg) => {
                self.recorder.event(&claim, WARNING, "ProvisioningFailed", msg);
                return Ok(Outcome::Retry);
            }
        };
        tracing::info!(volume = %pv_name, path = %path.display(), claim = %key, "creating volume");
        let pv = provisioned_volume(&claim, &class, &self.node, &path);
        match self.volume_api().create(&PostParams::default(), &pv).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e).context("creating the volume"),
        }
        self.recorder.event(
            &claim,
            NORMAL,
            "ProvisioningSucceeded",
            format!("Successfully provisioned volume {pv_name}"),
        );
        Ok(Outcome::Done)
    }

    /// A volume of this node that is this provisioner's: the library's `syncVolume`
    /// (`handleProtectionFinalizer`, `shouldDelete`, `deleteVolumeOperation`).
    async fn sync_volume(&self, name: &str) -> anyhow::Result<Outcome> {
        let Some(pv) = self.volume_reads().get_opt(name).await.context("reading the volume")? else {
            return Ok(Outcome::Done);
        };
        if annotation(&pv.metadata, ANN_DYNAMICALLY_PROVISIONED) != Some(PROVISIONER) {
            return Ok(Outcome::Done);
        }
        let Ok((node, path)) = volume_node_and_path(&pv) else {
            return Ok(Outcome::Done);
        };
        if node != self.node {
            return Ok(Outcome::Done);
        }
        let pv = self.protection_finalizer(pv).await?;
        if !should_delete(&pv) {
            return Ok(Outcome::Done);
        }
        let root = self.root.clone();
        let removed = tokio::task::spawn_blocking(move || remove_volume_directory(&root, &path))
            .await
            .context("joining the directory remover")?;
        if let Err(e) = removed {
            let msg = format!("failed to delete volume {name}: {e}");
            self.recorder.event(&pv, WARNING, "VolumeFailedDelete", msg);
            return Ok(Outcome::Retry);
        }
        tracing::info!(volume = %name, "deleted volume");
        match self.volume_api().delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Outcome::Done),
            Err(e) => return Err(e).context("deleting the volume"),
        }
        // The deletion waits for the finalizers: this one goes now.
        if let Some(pv) = self.volume_reads().get_opt(name).await.context("reading the volume")? {
            self.set_finalizer(&pv, false).await?;
        }
        Ok(Outcome::Done)
    }

    /// The library's `handleProtectionFinalizer`: a bound volume to be deleted carries the
    /// finalizer, one whose policy keeps it does not.
    async fn protection_finalizer(&self, pv: PersistentVolume) -> anyhow::Result<PersistentVolume> {
        let policy = reclaim_policy(&pv);
        let want =
            if policy == "Delete" && pv.metadata.deletion_timestamp.is_none() && volume_phase(&pv) == VOLUME_BOUND {
                true
            } else if policy == "Retain" || policy == "Recycle" {
                false
            } else {
                return Ok(pv);
            };
        if has_finalizer(&pv) == want {
            return Ok(pv);
        }
        self.set_finalizer(&pv, want).await
    }

    /// Adds or removes the finalizer, guarded by the volume's resourceVersion.
    async fn set_finalizer(&self, pv: &PersistentVolume, present: bool) -> anyhow::Result<PersistentVolume> {
        let mut finalizers: Vec<String> = pv
            .metadata
            .finalizers
            .iter()
            .flatten()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect();
        if present {
            finalizers.push(FINALIZER.to_string());
        }
        let patch = serde_json::json!({
            "metadata": {
                "finalizers": if finalizers.is_empty() { serde_json::Value::Null } else { finalizers.into() },
                "resourceVersion": pv.metadata.resource_version,
            }
        });
        let name = pv.metadata.name.as_deref().unwrap_or_default();
        match self
            .volume_api()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(pv) => Ok(pv),
            Err(kube::Error::Api(s)) if s.code == 404 && !present => Ok(pv.clone()),
            Err(e) => Err(e).with_context(|| format!("updating the finalizers of volume {name}")),
        }
    }

    /// The external resizer's `expandAndRecover` and `callResizeOnPlugin` for a directory: the
    /// claim is marked resizing, the volume's capacity raised, the claim's capacity set.
    async fn expand(
        &self,
        // The claims' statuses as the node writes them.
        claims: Api<PersistentVolumeClaim>,
        claim: PersistentVolumeClaim,
        size: K8sQuantity,
    ) -> anyhow::Result<Outcome> {
        let pv_name = claim_volume_name(&claim).unwrap_or_default().to_string();
        let Some(pv) = self
            .volume_reads()
            .get_opt(&pv_name)
            .await
            .context("reading the volume")?
        else {
            return Ok(Outcome::Done);
        };
        if annotation(&pv.metadata, ANN_DYNAMICALLY_PROVISIONED) != Some(PROVISIONER)
            || volume_node_and_path(&pv).ok().map(|(n, _)| n).as_deref() != Some(self.node.as_str())
        {
            return Ok(Outcome::Done);
        }
        // The resizer's `pvCanBeExpanded`: the volume is bound to this very claim.
        let bound =
            pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).is_some_and(|r| {
                r.namespace == claim.metadata.namespace && r.uid.is_some() && r.uid == claim.metadata.uid
            });
        if !bound {
            return Ok(Outcome::Done);
        }
        let name = claim.metadata.name.clone().unwrap_or_default();
        let mut marked = claim.clone();
        marked.status = Some(status_resizing(&claim, &size));
        let claim = claims
            .replace_status(&name, &PostParams::default(), &marked)
            .await
            .with_context(|| format!("marking pvc {name:?} as resizing"))?;
        self.recorder.event(
            &claim,
            NORMAL,
            "Resizing",
            format!("External resizer is resizing volume {pv_name}"),
        );
        // A directory has no size of its own: the volume's recorded capacity is all there is to grow.
        if storage(volume_capacity(&pv)) != storage(Some(&size)) {
            let mut grown = pv.clone();
            grown
                .spec
                .get_or_insert_with(Default::default)
                .capacity
                .get_or_insert_with(BTreeMap::new)
                .insert("storage".into(), size.clone());
            self.volume_api()
                .replace(&pv_name, &PostParams::default(), &grown)
                .await
                .with_context(|| format!("updating the capacity of volume {pv_name}"))?;
        }
        let mut finished = claim.clone();
        finished.status = Some(status_resized(&claim, &size));
        let claim = claims
            .replace_status(&name, &PostParams::default(), &finished)
            .await
            .with_context(|| format!("marking pvc {name:?} as resize finished"))?;
        tracing::info!(volume = %pv_name, size = %size.0, "volume expanded");
        self.recorder
            .event(&claim, NORMAL, "VolumeResizeSuccessful", "Resize volume succeeded");
        Ok(Outcome::Done)
    }
}

/// The library's `shouldDelete` (with its finalizer option on): Released, policy Delete, and not
/// already finished (the finalizer gone from a volume being deleted).
pub fn should_delete(pv: &PersistentVolume) -> bool {
    if !has_finalizer(pv) && pv.metadata.deletion_timestamp.is_some() {
        return false;
    }
    volume_phase(pv) == VOLUME_RELEASED && reclaim_policy(pv) == "Delete"
}

/// Claims that may need this provisioner: handed to it and without a volume, or bound and asking
/// for more than they have.
fn claim_concerns_provisioner(claim: &PersistentVolumeClaim) -> bool {
    (claim_volume_name(claim).is_none() && claim_provisioner(claim) == Some(PROVISIONER))
        || resize_wanted(claim).is_some()
}

async fn watch_claims(client: kube::Client, queue: Queue) {
    let api: Api<PersistentVolumeClaim> = Api::all(client);
    let mut stream = watcher(api, watcher::Config::default()).default_backoff().boxed();
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(claim) | watcher::Event::InitApply(claim)) => {
                if claim_concerns_provisioner(&claim) {
                    queue.add(Key::Claim {
                        namespace: claim.metadata.namespace.clone().unwrap_or_default(),
                        name: claim.metadata.name.clone().unwrap_or_default(),
                    });
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "local-path provisioner: watching claims"),
        }
    }
}

async fn watch_volumes(client: kube::Client, queue: Queue) {
    let api: Api<PersistentVolume> = Api::all(client);
    let mut stream = watcher(api, watcher::Config::default()).default_backoff().boxed();
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(pv) | watcher::Event::InitApply(pv)) => {
                if annotation(&pv.metadata, ANN_DYNAMICALLY_PROVISIONED) == Some(PROVISIONER)
                    && let Some(name) = pv.metadata.name.clone()
                {
                    queue.add(Key::Volume(name));
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "local-path provisioner: watching volumes"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PersistentVolumeClaimSpec, PersistentVolumeStatus, VolumeResourceRequirements};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    fn claim(modes: &[&str]) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("data".into()),
                namespace: Some("apps".into()),
                uid: Some("0b7c2c9e-2f4d-4c55-9a1e-6e1f4b7f0a11".into()),
                resource_version: Some("42".into()),
                annotations: Some(BTreeMap::from([
                    (ANN_STORAGE_PROVISIONER.to_string(), PROVISIONER.to_string()),
                    (ANN_SELECTED_NODE.to_string(), "node-a".to_string()),
                ])),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(modes.iter().map(|m| m.to_string()).collect()),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([("storage".to_string(), K8sQuantity("2Gi".into()))])),
                    limits: None,
                }),
                storage_class_name: Some("local-path".into()),
                volume_mode: Some("Filesystem".into()),
                ..Default::default()
            }),
            status: Some(PersistentVolumeClaimStatus {
                phase: Some("Pending".into()),
                ..Default::default()
            }),
        }
    }

    fn class(mode: &str, policy: &str) -> StorageClass {
        StorageClass {
            metadata: ObjectMeta {
                name: Some("local-path".into()),
                ..Default::default()
            },
            provisioner: PROVISIONER.into(),
            reclaim_policy: Some(policy.into()),
            volume_binding_mode: Some(mode.into()),
            allow_volume_expansion: Some(true),
            ..Default::default()
        }
    }

    #[test]
    fn names_follow_the_library_and_local_path() {
        let c = claim(&["ReadWriteOnce"]);
        assert_eq!(volume_name_for(&c), "pvc-0b7c2c9e-2f4d-4c55-9a1e-6e1f4b7f0a11");
        assert_eq!(
            directory_name_for(&c),
            "pvc-0b7c2c9e-2f4d-4c55-9a1e-6e1f4b7f0a11_apps_data"
        );
    }

    #[test]
    fn the_volume_is_built_from_the_claim_and_the_class() {
        let c = claim(&["ReadWriteOnce"]);
        let pv = provisioned_volume(
            &c,
            &class("WaitForFirstConsumer", "Retain"),
            "node-a",
            Path::new("/var/lib/skiff/storage/pvc-x_apps_data"),
        );
        assert_eq!(
            pv.metadata.name.as_deref(),
            Some("pvc-0b7c2c9e-2f4d-4c55-9a1e-6e1f4b7f0a11")
        );
        assert_eq!(annotation(&pv.metadata, ANN_DYNAMICALLY_PROVISIONED), Some(PROVISIONER));
        assert_eq!(pv.metadata.finalizers, Some(vec![FINALIZER.to_string()]));
        let spec = pv.spec.as_ref().expect("spec");
        assert_eq!(spec.persistent_volume_reclaim_policy.as_deref(), Some("Retain"));
        assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_string()]));
        assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
        assert_eq!(spec.storage_class_name.as_deref(), Some("local-path"));
        assert_eq!(spec.capacity.as_ref().expect("capacity")["storage"].0, "2Gi");
        let host = spec.host_path.as_ref().expect("hostPath");
        assert_eq!(host.path, "/var/lib/skiff/storage/pvc-x_apps_data");
        assert_eq!(host.type_.as_deref(), Some("DirectoryOrCreate"));
        let r = spec.claim_ref.as_ref().expect("claimRef");
        assert_eq!(r.kind.as_deref(), Some("PersistentVolumeClaim"));
        assert_eq!(r.api_version.as_deref(), Some("v1"));
        assert_eq!(
            (r.namespace.as_deref(), r.name.as_deref(), r.resource_version.as_deref()),
            (Some("apps"), Some("data"), Some("42"))
        );
        assert_eq!(r.uid, c.metadata.uid);
        // The affinity is what deletion reads back.
        assert_eq!(
            volume_node_and_path(&pv),
            Ok((
                "node-a".to_string(),
                "/var/lib/skiff/storage/pvc-x_apps_data".to_string()
            ))
        );
        let term = &spec
            .node_affinity
            .as_ref()
            .and_then(|a| a.required.as_ref())
            .expect("required")
            .node_selector_terms[0];
        let expr = &term.match_expressions.as_ref().expect("expressions")[0];
        assert_eq!(
            (expr.key.as_str(), expr.operator.as_str()),
            ("kubernetes.io/hostname", "In")
        );
        // A class without a policy deletes (the API's default).
        let mut no_policy = class("WaitForFirstConsumer", "Delete");
        no_policy.reclaim_policy = None;
        let pv = provisioned_volume(&c, &no_policy, "node-a", Path::new("/s/d"));
        assert_eq!(
            pv.spec.and_then(|s| s.persistent_volume_reclaim_policy).as_deref(),
            Some("Delete")
        );
    }

    #[test]
    fn only_claims_handed_to_this_provisioner_with_a_node_are_provisioned() {
        let wffc = class("WaitForFirstConsumer", "Delete");
        let c = claim(&["ReadWriteOnce"]);
        assert_eq!(provisioning_node(&c, &wffc), Some(Some("node-a")));
        let mut no_node = c.clone();
        no_node.metadata.annotations.as_mut().unwrap().remove(ANN_SELECTED_NODE);
        assert_eq!(provisioning_node(&no_node, &wffc), None);
        // An Immediate class is provisioned without a node, and then fails local-path's check.
        let immediate = class("Immediate", "Delete");
        assert_eq!(provisioning_node(&no_node, &immediate), Some(None));
        assert_eq!(
            check_claim(&no_node, None),
            Err("configuration error, no node was specified".to_string())
        );
        // The beta annotation names the provisioner too; another provisioner's claim is not ours.
        let mut beta = c.clone();
        let ann = beta.metadata.annotations.as_mut().unwrap();
        ann.remove(ANN_STORAGE_PROVISIONER);
        ann.insert(ANN_BETA_STORAGE_PROVISIONER.into(), PROVISIONER.into());
        assert_eq!(provisioning_node(&beta, &wffc), Some(Some("node-a")));
        let mut other = c.clone();
        other
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ANN_STORAGE_PROVISIONER.into(), "rancher.io/local-path".into());
        assert_eq!(provisioning_node(&other, &wffc), None);
        // A claim with a volume is done.
        let mut bound = c.clone();
        bound.spec.as_mut().unwrap().volume_name = Some("pvc-x".into());
        assert_eq!(provisioning_node(&bound, &wffc), None);
    }

    #[test]
    fn local_path_refuses_shared_modes_and_selectors() {
        assert_eq!(check_claim(&claim(&["ReadWriteOnce"]), Some("n")), Ok(()));
        assert_eq!(check_claim(&claim(&["ReadWriteOncePod"]), Some("n")), Ok(()));
        for modes in [&["ReadWriteMany"][..], &["ReadWriteOnce", "ReadOnlyMany"]] {
            assert_eq!(
                check_claim(&claim(modes), Some("n")),
                Err("NodePath only supports ReadWriteOnce and ReadWriteOncePod (1.22+) access modes".to_string())
            );
        }
        let mut selecting = claim(&["ReadWriteOnce"]);
        selecting.spec.as_mut().unwrap().selector = Some(LabelSelector::default());
        assert_eq!(
            check_claim(&selecting, Some("n")),
            Err("claim.Spec.Selector is not supported".to_string())
        );
    }

    #[test]
    fn deletion_stays_inside_the_storage_path() {
        let root = Path::new("/var/lib/skiff/storage");
        assert_eq!(
            directory_in_root(root, "/var/lib/skiff/storage/pvc-1_ns_c"),
            Ok(PathBuf::from("/var/lib/skiff/storage/pvc-1_ns_c"))
        );
        assert_eq!(
            directory_in_root(root, "/var/lib/skiff/storage/pvc-1_ns_c/"),
            Ok(PathBuf::from("/var/lib/skiff/storage/pvc-1_ns_c"))
        );
        for outside in [
            "/var/lib/skiff/storage",
            "/var/lib/skiff/storage/../etc",
            "/var/lib/skiff/storage/a/b",
            "/var/lib/skiff/other/pvc-1",
            "/etc",
            "/",
            "relative/pvc-1",
            "/var/lib/skiff/storage/./pvc-1/..",
        ] {
            assert!(directory_in_root(root, outside).is_err(), "{outside} accepted");
        }
        assert_eq!(
            directory_in_root(root, "/etc").unwrap_err(),
            "/etc is outside the storage path /var/lib/skiff/storage"
        );
    }

    #[test]
    fn removal_never_follows_a_symlink() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().expect("tmp");
        let root = prepare_root(&tmp.path().join("storage")).expect("root");
        assert_eq!(
            std::fs::metadata(&root).expect("root").permissions().mode() & 0o777,
            0o700
        );
        let outside = tmp.path().join("precious");
        std::fs::create_dir(&outside).expect("outside");
        std::fs::write(outside.join("keep"), "x").expect("keep");

        // A volume directory: made 0777, its content (a link out included) removed, the link's
        // target left alone.
        let dir = make_volume_directory(&root, "pvc-1_ns_c").expect("made");
        assert_eq!(
            std::fs::metadata(&dir).expect("dir").permissions().mode() & 0o777,
            0o777
        );
        std::fs::write(dir.join("data"), "d").expect("data");
        std::os::unix::fs::symlink(&outside, dir.join("escape")).expect("symlink");
        remove_volume_directory(&root, &dir.display().to_string()).expect("removed");
        assert!(!dir.exists());
        assert!(outside.join("keep").exists());
        // Gone already: nothing to do.
        remove_volume_directory(&root, &dir.display().to_string()).expect("idempotent");

        // A volume path that is itself a symlink is refused, and so is one outside the root.
        std::os::unix::fs::symlink(&outside, root.join("pvc-2_ns_c")).expect("symlink");
        let err = remove_volume_directory(&root, &root.join("pvc-2_ns_c").display().to_string()).unwrap_err();
        assert!(err.ends_with("is not a directory"), "{err}");
        assert!(make_volume_directory(&root, "pvc-2_ns_c").is_err());
        let err = remove_volume_directory(&root, &outside.display().to_string()).unwrap_err();
        assert!(err.contains("is outside the storage path"), "{err}");
        assert!(outside.join("keep").exists());
    }

    #[test]
    fn deletion_waits_for_release_and_policy_delete() {
        let c = claim(&["ReadWriteOnce"]);
        let mut pv = provisioned_volume(&c, &class("WaitForFirstConsumer", "Delete"), "n", Path::new("/s/d"));
        pv.status = Some(PersistentVolumeStatus {
            phase: Some("Bound".into()),
            ..Default::default()
        });
        assert!(!should_delete(&pv));
        pv.status.as_mut().unwrap().phase = Some("Released".into());
        assert!(should_delete(&pv));
        // Being deleted with the finalizer still on: not finished yet.
        pv.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::now()));
        assert!(should_delete(&pv));
        pv.metadata.finalizers = None;
        assert!(!should_delete(&pv));
        let mut retained = provisioned_volume(&c, &class("WaitForFirstConsumer", "Retain"), "n", Path::new("/s/d"));
        retained.status = pv.status.clone();
        assert!(!should_delete(&retained));
    }

    #[test]
    fn expansion_marks_then_finishes_the_claim_status() {
        let mut c = claim(&["ReadWriteOnce"]);
        c.spec.as_mut().unwrap().volume_name = Some("pvc-x".into());
        c.status = Some(PersistentVolumeClaimStatus {
            phase: Some("Bound".into()),
            capacity: Some(BTreeMap::from([("storage".to_string(), K8sQuantity("1Gi".into()))])),
            ..Default::default()
        });
        assert_eq!(resize_wanted(&c).map(|q| q.0), Some("2Gi".to_string()));
        let marked = status_resizing(&c, &K8sQuantity("2Gi".into()));
        let conditions = marked.conditions.clone().expect("conditions");
        assert_eq!(conditions.len(), 1);
        assert_eq!(
            (conditions[0].type_.as_str(), conditions[0].status.as_str()),
            ("Resizing", "True")
        );
        assert_eq!(
            marked.allocated_resource_statuses.as_ref().expect("statuses")["storage"],
            "ControllerResizeInProgress"
        );
        assert_eq!(
            marked.allocated_resources.as_ref().expect("allocated")["storage"].0,
            "2Gi"
        );
        assert_eq!(marked.capacity.as_ref().expect("capacity")["storage"].0, "1Gi");
        c.status = Some(marked);
        let done = status_resized(&c, &K8sQuantity("2Gi".into()));
        assert_eq!(done.capacity.as_ref().expect("capacity")["storage"].0, "2Gi");
        assert!(done.conditions.is_none());
        assert!(done.allocated_resource_statuses.is_none());
        assert_eq!(
            done.allocated_resources.as_ref().expect("allocated")["storage"].0,
            "2Gi"
        );
        c.status = Some(done);
        assert_eq!(resize_wanted(&c), None);
        // Equal quantities written differently need nothing.
        c.status.as_mut().unwrap().capacity =
            Some(BTreeMap::from([("storage".to_string(), K8sQuantity("2048Mi".into()))]));
        assert_eq!(resize_wanted(&c), None);
        // Only bound claims grow.
        c.status.as_mut().unwrap().capacity = None;
        c.status.as_mut().unwrap().phase = Some("Pending".into());
        assert_eq!(resize_wanted(&c), None);
    }

    #[test]
    fn resize_conditions_merge_as_upstream() {
        let cond = |t: &str, s: &str, at: i64| PersistentVolumeClaimCondition {
            type_: t.into(),
            status: s.into(),
            last_transition_time: Some(Time(jiff::Timestamp::from_second(at).unwrap())),
            ..Default::default()
        };
        let old = vec![cond("Resizing", "True", 1), cond("ModifyingVolume", "True", 2)];
        // An unchanged status keeps its transition time; other conditions stay.
        let merged = merge_resize_conditions(&old, vec![cond("Resizing", "True", 9)], false).unwrap();
        assert_eq!(
            merged,
            vec![cond("Resizing", "True", 1), cond("ModifyingVolume", "True", 2)]
        );
        // Resize conditions not given go, unless kept.
        assert_eq!(
            merge_resize_conditions(&old, Vec::new(), false).unwrap(),
            vec![cond("ModifyingVolume", "True", 2)]
        );
        assert_eq!(merge_resize_conditions(&old, Vec::new(), true).unwrap(), old);
        assert_eq!(merge_resize_conditions(&old[..1], Vec::new(), false), None);
    }
}
