//! The scheduler cache: nodes with the pods on them (bound and assumed), kept current from
//! watch events and read in place by the scheduling cycle (one owner, no per-pod copies).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};

use crate::assume_cache::AssumeCache;
use crate::counts::{Counts, Domains, Matcher, TermKind};
use crate::types::{NodeInfo, PodInfo};

#[derive(Debug, Default)]
pub struct Cache {
    nodes: Vec<NodeInfo>,
    index: HashMap<String, usize>,
    /// uid -> node name for every pod counted on a node.
    pod_nodes: HashMap<String, String>,
    assumed: HashSet<String>,
    num_nodes: usize,
    /// node -> pending pods nominated to it by preemption.
    nominated: HashMap<String, Vec<Arc<PodInfo>>>,
    nominated_node_of: HashMap<String, String>,
    /// Pods in the cache with any pod (anti-)affinity term / with required anti-affinity.
    pods_with_affinity: usize,
    pods_with_required_anti_affinity: usize,
    /// Namespace name -> labels (for affinity terms' namespace selectors).
    namespaces: HashMap<String, std::collections::BTreeMap<String, String>>,
    /// What upstream's DefaultSelector reads: services' selectors and controllers' selectors.
    pub spread_sources: SpreadSources,
    /// PodDisruptionBudgets, for choosing preemption victims.
    pub pdbs: Vec<crate::plugins::default_preemption::Pdb>,
    /// Claims, volumes, classes and CSI nodes, for the volume plugins.
    pub volumes: Volumes,
    /// `namespace/claim` -> how many pods counted here use it (upstream's PVC reference counts).
    pvc_refs: HashMap<String, usize>,
    /// Matching-pod counts per node and topology domain, kept current here; behind a lock
    /// because a scheduling cycle (reading the cache) may start counting a new selector.
    counts: Mutex<Counts>,
}

/// The storage objects the volume plugins read, kept from watches.
#[derive(Debug)]
pub struct Volumes {
    pub pvcs: AssumeCache<PersistentVolumeClaim>,
    pub pvs: AssumeCache<PersistentVolume>,
    pub classes: HashMap<String, Arc<StorageClass>>,
    /// By node name.
    pub csi_nodes: HashMap<String, Arc<CSINode>>,
}

impl Default for Volumes {
    fn default() -> Self {
        Volumes {
            pvcs: AssumeCache::new("v1.PersistentVolumeClaim"),
            pvs: AssumeCache::new("v1.PersistentVolume"),
            classes: HashMap::new(),
            csi_nodes: HashMap::new(),
        }
    }
}

/// Services (by namespace) and ReplicaSets / StatefulSets / ReplicationControllers (by
/// namespace and name), as selectors, for system-default topology spreading.
#[derive(Debug, Default)]
pub struct SpreadSources {
    pub services: HashMap<String, HashMap<String, std::collections::BTreeMap<String, String>>>,
    /// (kind, namespace, name) -> selector.
    pub controllers: HashMap<(&'static str, String, String), crate::labels::Selector>,
}

impl SpreadSources {
    /// Upstream's DefaultSelector: the union of the selectors of the services selecting the
    /// pod and of its controller. None when that is empty (no default spreading).
    pub fn default_selector(&self, pod: &PodInfo) -> Option<crate::labels::Selector> {
        let mut merged = std::collections::BTreeMap::new();
        if let Some(svcs) = self.services.get(&pod.namespace) {
            for sel in svcs.values() {
                if !sel.is_empty() && sel.iter().all(|(k, v)| pod.labels.get(k) == Some(v)) {
                    merged.extend(sel.iter().map(|(k, v)| (k.clone(), v.clone())));
                }
            }
        }
        let mut selector = crate::labels::Selector::from_map(&merged);
        let owner = pod
            .pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true));
        if let Some(o) = owner {
            let kind = match (o.api_version.as_str(), o.kind.as_str()) {
                ("v1", "ReplicationController") => Some("ReplicationController"),
                ("apps/v1", "ReplicaSet") => Some("ReplicaSet"),
                ("apps/v1", "StatefulSet") => Some("StatefulSet"),
                _ => None,
            };
            if let Some(kind) = kind
                && let Some(sel) = self.controllers.get(&(kind, pod.namespace.clone(), o.name.clone()))
            {
                selector.and(sel);
            }
        }
        (!selector.is_empty_match_all()).then_some(selector)
    }
}

/// What changed in a node update, for moving unschedulable pods.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeChange {
    pub added: bool,
    pub labels: bool,
    pub taints: bool,
    pub allocatable: bool,
    pub schedulable: bool,
}

impl NodeChange {
    pub fn any(&self) -> bool {
        self.added || self.labels || self.taints || self.allocatable || self.schedulable
    }
}

impl Cache {
    pub fn new() -> Self {
        Self::default()
    }

    /// All node slots; slots whose `node` is None are placeholders for pods bound to nodes
    /// not (yet) known, and are never scheduled onto.
    pub fn nodes(&self) -> &[NodeInfo] {
        &self.nodes
    }

    pub fn num_nodes(&self) -> usize {
        self.num_nodes
    }

    pub fn node_indices(&self) -> impl Iterator<Item = usize> + '_ {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.node.is_some())
            .map(|(i, _)| i)
    }

    pub fn node_index(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }

    pub fn node(&self, name: &str) -> Option<&NodeInfo> {
        self.node_index(name).map(|i| &self.nodes[i])
    }

    pub fn node_name(&self, idx: usize) -> &str {
        self.nodes.get(idx).map(|n| n.name.as_str()).unwrap_or("")
    }

    fn slot(&mut self, name: &str) -> usize {
        if let Some(i) = self.index.get(name) {
            return *i;
        }
        let i = self.nodes.len();
        self.nodes.push(NodeInfo {
            name: name.to_string(),
            ..Default::default()
        });
        self.index.insert(name.to_string(), i);
        self.counts_mut().add_slot();
        i
    }

    /// Adds or updates a node; reports what changed.
    pub fn upsert_node(&mut self, node: Arc<Node>) -> NodeChange {
        let name = node.metadata.name.clone().unwrap_or_default();
        let i = self.slot(&name);
        let mut change = NodeChange::default();
        match &self.nodes[i].node {
            None => {
                change.added = true;
                self.num_nodes += 1;
            }
            Some(old) => {
                let spec_old = old.spec.as_ref();
                let spec_new = node.spec.as_ref();
                change.labels = old.metadata.labels != node.metadata.labels;
                change.taints = spec_old.and_then(|s| s.taints.as_ref()) != spec_new.and_then(|s| s.taints.as_ref());
                change.schedulable = spec_old.and_then(|s| s.unschedulable) != spec_new.and_then(|s| s.unschedulable);
                change.allocatable = old.status.as_ref().and_then(|s| s.allocatable.as_ref())
                    != node.status.as_ref().and_then(|s| s.allocatable.as_ref());
            }
        }
        if change.labels {
            self.counts
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .node_changed(&self.nodes, i, -1);
        }
        self.nodes[i].set_node(node);
        if change.labels || change.added {
            self.counts
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .node_changed(&self.nodes, i, 1);
        }
        change
    }

    fn counts_mut(&mut self) -> &mut Counts {
        self.counts.get_mut().unwrap_or_else(PoisonError::into_inner)
    }

    fn counts(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Pods `m` selects per value of `key`, over the nodes that have every `required` key
    /// (a node without `key` counts under ""), with each domain's number of such nodes.
    pub fn domains(&self, m: &Matcher, required: &[String], key: &str) -> Arc<Domains> {
        self.counts().domains(&self.nodes, &self.namespaces, m, required, key)
    }

    /// Runs `f` with the number of pods `m` selects on each node slot (indexed as `nodes()`).
    pub fn with_per_node<R>(&self, m: &Matcher, f: impl FnOnce(&[i64]) -> R) -> R {
        let mut counts = self.counts();
        f(counts.per_node(&self.nodes, &self.namespaces, m))
    }

    /// The distinct terms of `kind` the pods here carry, each with how many pods carry it per
    /// value of its topology key.
    pub fn carried_terms(&self, kind: TermKind) -> Vec<(crate::types::AffinityTerm, Arc<Domains>)> {
        self.counts().carried(kind)
    }

    pub fn remove_node(&mut self, name: &str) {
        let Some(&i) = self.index.get(name) else {
            return;
        };
        if self.nodes[i].node.is_some() {
            self.counts
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .node_changed(&self.nodes, i, -1);
            self.nodes[i].node = None;
            self.num_nodes -= 1;
        }
        if self.nodes[i].pods.is_empty() {
            self.drop_slot(i);
        }
    }

    fn drop_slot(&mut self, i: usize) {
        self.counts_mut().drop_slot(i);
        let removed = self.nodes.swap_remove(i);
        self.index.remove(&removed.name);
        if i < self.nodes.len() {
            let moved = self.nodes[i].name.clone();
            self.index.insert(moved, i);
        }
    }

    pub fn is_assumed(&self, uid: &str) -> bool {
        self.assumed.contains(uid)
    }

    pub fn has_pod(&self, uid: &str) -> bool {
        self.pod_nodes.contains_key(uid)
    }

    pub fn pod_node(&self, uid: &str) -> Option<&str> {
        self.pod_nodes.get(uid).map(|s| s.as_str())
    }

    fn place(&mut self, pod: Arc<PodInfo>, node: &str) {
        let i = self.slot(node);
        self.pod_nodes.insert(pod.uid.clone(), node.to_string());
        if pod.has_affinity_terms() {
            self.pods_with_affinity += 1;
        }
        if !pod.required_anti_affinity.is_empty() {
            self.pods_with_required_anti_affinity += 1;
        }
        for key in pod.pvc_keys() {
            *self.pvc_refs.entry(key).or_default() += 1;
        }
        self.counts
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .pod_changed(&self.nodes, i, &pod, &self.namespaces, 1);
        self.nodes[i].add_pod(pod);
    }

    /// Adds or updates a pod bound to a node (confirms an assumed pod).
    pub fn upsert_bound_pod(&mut self, pod: Arc<PodInfo>) {
        let Some(node) = pod.node_name.clone() else {
            return;
        };
        self.remove_pod(&pod.uid);
        self.place(pod, &node);
    }

    /// Counts a pod on `node` before its binding is confirmed.
    pub fn assume_pod(&mut self, pod: Arc<PodInfo>, node: &str) {
        self.remove_pod(&pod.uid);
        self.assumed.insert(pod.uid.clone());
        self.place(pod, node);
    }

    /// Drops an assumed pod whose binding failed.
    pub fn forget_pod(&mut self, uid: &str) {
        if self.assumed.contains(uid) {
            self.remove_pod(uid);
        }
    }

    /// Removes a pod wherever it is counted; returns it.
    pub fn remove_pod(&mut self, uid: &str) -> Option<Arc<PodInfo>> {
        self.assumed.remove(uid);
        let node = self.pod_nodes.remove(uid)?;
        let i = *self.index.get(&node)?;
        let pod = self.nodes[i].remove_pod(uid);
        if let Some(p) = &pod {
            self.counts
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .pod_changed(&self.nodes, i, p, &self.namespaces, -1);
            if p.has_affinity_terms() {
                self.pods_with_affinity -= 1;
            }
            if !p.required_anti_affinity.is_empty() {
                self.pods_with_required_anti_affinity -= 1;
            }
            for key in p.pvc_keys() {
                if let Some(n) = self.pvc_refs.get_mut(&key) {
                    *n -= 1;
                    if *n == 0 {
                        self.pvc_refs.remove(&key);
                    }
                }
            }
        }
        if self.nodes[i].node.is_none() && self.nodes[i].pods.is_empty() {
            self.drop_slot(i);
        }
        pod
    }

    /// Iterates every pod counted in the cache.
    pub fn all_pods(&self) -> impl Iterator<Item = (&NodeInfo, &Arc<PodInfo>)> {
        self.nodes.iter().flat_map(|n| n.pods.iter().map(move |p| (n, p)))
    }

    /// Records (or clears, with None) the node a pending pod was nominated to.
    pub fn set_nominated(&mut self, pod: &Arc<PodInfo>, node: Option<&str>) {
        if let Some(old) = self.nominated_node_of.remove(&pod.uid)
            && let Some(list) = self.nominated.get_mut(&old)
        {
            list.retain(|p| p.uid != pod.uid);
            if list.is_empty() {
                self.nominated.remove(&old);
            }
        }
        if let Some(node) = node {
            self.nominated_node_of.insert(pod.uid.clone(), node.to_string());
            self.nominated.entry(node.to_string()).or_default().push(pod.clone());
        }
    }

    /// Records a namespace's labels; returns whether they changed.
    pub fn set_namespace(&mut self, name: &str, labels: std::collections::BTreeMap<String, String>) -> bool {
        if self.namespaces.get(name) == Some(&labels) {
            return false;
        }
        self.namespaces.insert(name.to_string(), labels);
        self.counts_mut().namespaces_changed();
        true
    }

    pub fn remove_namespace(&mut self, name: &str) {
        if self.namespaces.remove(name).is_some() {
            self.counts_mut().namespaces_changed();
        }
    }

    pub fn namespace_labels(&self, name: &str) -> Option<&std::collections::BTreeMap<String, String>> {
        self.namespaces.get(name)
    }

    /// Whether any pod in the cache has pod (anti-)affinity terms.
    pub fn any_pod_with_affinity(&self) -> bool {
        self.pods_with_affinity > 0
    }

    /// Whether any pod in the cache has required anti-affinity terms.
    pub fn any_pod_with_required_anti_affinity(&self) -> bool {
        self.pods_with_required_anti_affinity > 0
    }

    /// Whether a pod counted here (bound or assumed) uses the claim `namespace/name`.
    pub fn pvc_in_use(&self, key: &str) -> bool {
        self.pvc_refs.contains_key(key)
    }

    pub fn has_nominated(&self) -> bool {
        !self.nominated.is_empty()
    }

    pub fn nominated_on(&self, node: &str) -> &[Arc<PodInfo>] {
        self.nominated.get(node).map(|v| v.as_slice()).unwrap_or(&[])
    }

    /// Mutable access to one node's info (preemption simulates on a copy instead).
    pub fn node_at(&self, idx: usize) -> &NodeInfo {
        &self.nodes[idx]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::testutil::*;

    #[test]
    fn assume_confirm_forget() {
        let mut c = Cache::new();
        c.upsert_node(Arc::new(node("n1", "4", "8Gi", "110")));
        let p = Arc::new(PodInfo::new(pod("a", "1", "1Gi")));
        c.assume_pod(p.clone(), "n1");
        assert!(c.is_assumed("uid-a"));
        assert_eq!(c.node("n1").unwrap().requested.milli_cpu, 1000);
        c.forget_pod("uid-a");
        assert_eq!(c.node("n1").unwrap().requested.milli_cpu, 0);
        c.assume_pod(p, "n1");
        let mut bound = pod("a", "1", "1Gi");
        bound.spec.as_mut().unwrap().node_name = Some("n1".into());
        c.upsert_bound_pod(Arc::new(PodInfo::new(bound)));
        assert!(!c.is_assumed("uid-a"));
        assert_eq!(c.node("n1").unwrap().pods.len(), 1);
    }

    #[test]
    fn pods_on_unknown_nodes_and_node_removal() {
        let mut c = Cache::new();
        let mut bound = pod("a", "1", "1Gi");
        bound.spec.as_mut().unwrap().node_name = Some("ghost".into());
        c.upsert_bound_pod(Arc::new(PodInfo::new(bound)));
        assert_eq!(c.num_nodes(), 0);
        let ch = c.upsert_node(Arc::new(node("ghost", "4", "8Gi", "110")));
        assert!(ch.added);
        assert_eq!(c.num_nodes(), 1);
        assert_eq!(c.node("ghost").unwrap().requested.milli_cpu, 1000);
        c.upsert_node(Arc::new(node("other", "4", "8Gi", "110")));
        c.remove_node("ghost");
        assert_eq!(c.num_nodes(), 1);
        c.remove_pod("uid-a");
        assert!(c.node("ghost").is_none());
        assert_eq!(c.node_indices().count(), 1);
        assert_eq!(c.node("other").unwrap().name, "other");
    }

    #[test]
    fn node_change_detection() {
        let mut c = Cache::new();
        c.upsert_node(Arc::new(node("n1", "4", "8Gi", "110")));
        let mut n = node("n1", "4", "8Gi", "110");
        n.spec.as_mut().unwrap().unschedulable = Some(true);
        let ch = c.upsert_node(Arc::new(n));
        assert!(ch.schedulable && !ch.labels && !ch.added);
    }
}
