//! Precomputed per-pod and per-node state: what the plugins read on the hot path.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod, PodAffinityTerm, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::labels::Selector;
use crate::quantity::{parse_milli, parse_value};

/// Upstream's defaults for containers without requests, used only for scoring.
pub const DEFAULT_MILLI_CPU_REQUEST: i64 = 100;
pub const DEFAULT_MEMORY_REQUEST: i64 = 200 * 1024 * 1024;

/// A vector of compute resources (cpu in milli-units, everything else in units).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resource {
    pub milli_cpu: i64,
    pub memory: i64,
    pub ephemeral_storage: i64,
    pub allowed_pods: i64,
    /// Extended and hugepages resources, sorted by name.
    pub scalar: Vec<(String, i64)>,
}

/// Whether upstream counts the resource as a "scalar" one (extended resources, hugepages,
/// attachable volumes).
fn is_scalar_resource(name: &str) -> bool {
    if name.starts_with("hugepages-") || name.starts_with("attachable-volumes-") {
        return true;
    }
    // Extended resources: fully qualified names outside the kubernetes.io domain.
    match name.split_once('/') {
        Some((domain, _)) => {
            domain != "kubernetes.io" && !domain.ends_with(".kubernetes.io") && !name.starts_with("requests.")
        }
        None => false,
    }
}

impl Resource {
    pub fn scalar(&self, name: &str) -> i64 {
        self.scalar
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
            .unwrap_or(0)
    }

    fn scalar_mut(&mut self, name: &str) -> &mut i64 {
        let pos = match self.scalar.binary_search_by(|(n, _)| n.as_str().cmp(name)) {
            Ok(i) => i,
            Err(i) => {
                self.scalar.insert(i, (name.to_string(), 0));
                i
            }
        };
        &mut self.scalar[pos].1
    }

    pub fn from_list(list: Option<&BTreeMap<String, Quantity>>) -> Self {
        let mut r = Resource::default();
        r.add_list(list);
        r
    }

    pub fn add_list(&mut self, list: Option<&BTreeMap<String, Quantity>>) {
        let Some(list) = list else { return };
        for (name, q) in list {
            match name.as_str() {
                "cpu" => self.milli_cpu += parse_milli(&q.0).unwrap_or(0),
                "memory" => self.memory += parse_value(&q.0).unwrap_or(0),
                "ephemeral-storage" => self.ephemeral_storage += parse_value(&q.0).unwrap_or(0),
                "pods" => self.allowed_pods += parse_value(&q.0).unwrap_or(0),
                other if is_scalar_resource(other) => *self.scalar_mut(other) += parse_value(&q.0).unwrap_or(0),
                _ => {}
            }
        }
    }

    pub fn set_max_list(&mut self, list: Option<&BTreeMap<String, Quantity>>) {
        let Some(list) = list else { return };
        for (name, q) in list {
            match name.as_str() {
                "cpu" => self.milli_cpu = self.milli_cpu.max(parse_milli(&q.0).unwrap_or(0)),
                "memory" => self.memory = self.memory.max(parse_value(&q.0).unwrap_or(0)),
                "ephemeral-storage" => {
                    self.ephemeral_storage = self.ephemeral_storage.max(parse_value(&q.0).unwrap_or(0))
                }
                other if is_scalar_resource(other) => {
                    let v = parse_value(&q.0).unwrap_or(0);
                    let slot = self.scalar_mut(other);
                    *slot = (*slot).max(v);
                }
                _ => {}
            }
        }
    }

    pub fn add(&mut self, other: &Resource) {
        self.milli_cpu += other.milli_cpu;
        self.memory += other.memory;
        self.ephemeral_storage += other.ephemeral_storage;
        for (n, v) in &other.scalar {
            *self.scalar_mut(n) += v;
        }
    }

    pub fn sub(&mut self, other: &Resource) {
        self.milli_cpu -= other.milli_cpu;
        self.memory -= other.memory;
        self.ephemeral_storage -= other.ephemeral_storage;
        for (n, v) in &other.scalar {
            *self.scalar_mut(n) -= v;
        }
    }

    pub fn is_zero(&self) -> bool {
        self.milli_cpu == 0
            && self.memory == 0
            && self.ephemeral_storage == 0
            && self.scalar.iter().all(|(_, v)| *v == 0)
    }
}

/// A host port a pod asks for: (ip, protocol, port). An empty ip means 0.0.0.0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    pub ip: String,
    pub protocol: String,
    pub port: i32,
}

impl HostPort {
    pub fn conflicts(&self, other: &HostPort) -> bool {
        self.port == other.port
            && self.protocol == other.protocol
            && (self.ip == other.ip || self.ip == "0.0.0.0" || other.ip == "0.0.0.0")
    }
}

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// A pod (anti-)affinity term, compiled.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AffinityTerm {
    pub selector: Selector,
    /// Namespaces named by the term (the pod's own when it names none and has no selector).
    pub namespaces: Vec<String>,
    /// The namespace selector, if any (`{}` selects every namespace).
    pub namespace_selector: Option<Selector>,
    pub topology_key: String,
    pub weight: i64,
}

impl AffinityTerm {
    fn new(pod_ns: &str, t: &PodAffinityTerm, weight: i64) -> Self {
        // matchLabelKeys / mismatchLabelKeys are merged into the selector by the API server
        // upstream; nothing to do here. A missing selector matches nothing.
        let selector = Selector::from_label_selector(t.label_selector.as_ref());
        let mut namespaces = t.namespaces.clone().unwrap_or_default();
        let namespace_selector = t
            .namespace_selector
            .as_ref()
            .map(|s| Selector::from_label_selector(Some(s)));
        if namespaces.is_empty() && namespace_selector.is_none() {
            namespaces.push(pod_ns.to_string());
        }
        AffinityTerm {
            selector,
            namespaces,
            namespace_selector,
            topology_key: t.topology_key.clone(),
            weight,
        }
    }

    /// Whether `pod` is selected by this term; `ns_labels` are the labels of the pod's
    /// namespace (as upstream's AffinityTerm.Matches).
    pub fn matches(&self, pod: &PodInfo, ns_labels: Option<&BTreeMap<String, String>>) -> bool {
        let ns_ok = self.namespaces.contains(&pod.namespace)
            || self
                .namespace_selector
                .as_ref()
                .is_some_and(|s| s.matches(ns_labels.unwrap_or(&NO_LABELS)));
        ns_ok && self.selector.matches(&pod.labels)
    }
}

/// A claim one of a pod's volumes uses: a `persistentVolumeClaim`'s claim, or the claim the
/// ephemeral volume controller makes for a generic ephemeral volume (`POD-VOLUME`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodClaim {
    pub name: String,
    pub ephemeral: bool,
}

/// Everything the scheduler needs to know about a pod, computed once per pod version.
#[derive(Debug, Clone)]
pub struct PodInfo {
    pub pod: Arc<Pod>,
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub priority: i32,
    pub requests: Resource,
    /// cpu and memory requests with upstream's defaults for missing ones (scoring only).
    pub non_zero_cpu: i64,
    pub non_zero_mem: i64,
    pub host_ports: Vec<HostPort>,
    pub tolerations: Vec<Toleration>,
    pub required_affinity: Vec<AffinityTerm>,
    pub required_anti_affinity: Vec<AffinityTerm>,
    pub preferred_affinity: Vec<AffinityTerm>,
    pub preferred_anti_affinity: Vec<AffinityTerm>,
    pub node_name: Option<String>,
    pub scheduler_name: String,
    pub deleting: bool,
    pub terminal: bool,
    /// The claims the pod's volumes use, in volume order (empty for most pods).
    pub claims: Vec<PodClaim>,
    /// Whether the pod has GCE PD, AWS EBS, RBD or iSCSI volumes (VolumeRestrictions checks
    /// those against the pods on a node).
    pub has_disk_volumes: bool,
}

impl PodInfo {
    pub fn new(pod: Pod) -> Self {
        Self::from_arc(Arc::new(pod))
    }

    pub fn from_arc(pod: Arc<Pod>) -> Self {
        let meta = &pod.metadata;
        let spec = pod.spec.as_ref();
        let namespace = meta.namespace.clone().unwrap_or_default();
        let mut requests = Resource::default();
        let mut non_zero_cpu = 0;
        let mut non_zero_mem = 0;
        let mut host_ports = Vec::new();
        let mut tolerations = Vec::new();
        let mut required_affinity = Vec::new();
        let mut required_anti_affinity = Vec::new();
        let mut preferred_affinity = Vec::new();
        let mut preferred_anti_affinity = Vec::new();
        let mut priority = 0;
        let mut node_name = None;
        let mut scheduler_name = "default-scheduler".to_string();
        let mut claims = Vec::new();
        let mut has_disk_volumes = false;
        if let Some(spec) = spec {
            for v in spec.volumes.iter().flatten() {
                if let Some(c) = &v.persistent_volume_claim {
                    claims.push(PodClaim {
                        name: c.claim_name.clone(),
                        ephemeral: false,
                    });
                } else if v.ephemeral.is_some() {
                    // Upstream's `ephemeral.VolumeClaimName`.
                    claims.push(PodClaim {
                        name: format!("{}-{}", meta.name.as_deref().unwrap_or_default(), v.name),
                        ephemeral: true,
                    });
                }
                has_disk_volumes |= v.gce_persistent_disk.is_some()
                    || v.aws_elastic_block_store.is_some()
                    || v.rbd.is_some()
                    || v.iscsi.is_some();
            }
            for c in &spec.containers {
                let req = c.resources.as_ref().and_then(|r| r.requests.as_ref());
                requests.add_list(req);
                let r = Resource::from_list(req);
                let has = |k: &str| req.is_some_and(|m| m.contains_key(k));
                non_zero_cpu += if has("cpu") {
                    r.milli_cpu
                } else {
                    DEFAULT_MILLI_CPU_REQUEST
                };
                non_zero_mem += if has("memory") {
                    r.memory
                } else {
                    DEFAULT_MEMORY_REQUEST
                };
                for p in c.ports.iter().flatten() {
                    if let Some(hp) = p.host_port
                        && hp > 0
                    {
                        let ip = p.host_ip.clone().filter(|s| !s.is_empty());
                        host_ports.push(HostPort {
                            ip: ip.unwrap_or_else(|| "0.0.0.0".to_string()),
                            protocol: p.protocol.clone().unwrap_or_else(|| "TCP".to_string()),
                            port: hp,
                        });
                    }
                }
            }
            // Init containers (upstream's PodRequests): sidecars (restartPolicy Always) run
            // alongside the app containers; each other init container runs alone with the
            // sidecars started before it. The pod needs the larger of the two phases.
            let mut sidecars = Resource::default();
            let mut init_peak = Resource::default();
            for c in spec.init_containers.iter().flatten() {
                let req = c.resources.as_ref().and_then(|r| r.requests.as_ref());
                let r = Resource::from_list(req);
                if c.restart_policy.as_deref() == Some("Always") {
                    requests.add(&r);
                    non_zero_cpu += r.milli_cpu;
                    non_zero_mem += r.memory;
                    sidecars.add(&r);
                } else {
                    let mut with_sidecars = sidecars.clone();
                    with_sidecars.add(&r);
                    init_peak.set_max_resource(&with_sidecars);
                }
            }
            requests.set_max_resource(&init_peak);
            non_zero_cpu = non_zero_cpu.max(init_peak.milli_cpu);
            non_zero_mem = non_zero_mem.max(init_peak.memory);
            if let Some(oh) = &spec.overhead {
                let r = Resource::from_list(Some(oh));
                requests.add(&r);
                non_zero_cpu += r.milli_cpu;
                non_zero_mem += r.memory;
            }
            tolerations = spec.tolerations.clone().unwrap_or_default();
            priority = spec.priority.unwrap_or(0);
            node_name = spec.node_name.clone().filter(|n| !n.is_empty());
            if let Some(s) = &spec.scheduler_name {
                scheduler_name = s.clone();
            }
            if let Some(aff) = &spec.affinity {
                if let Some(pa) = &aff.pod_affinity {
                    for t in pa.required_during_scheduling_ignored_during_execution.iter().flatten() {
                        required_affinity.push(AffinityTerm::new(&namespace, t, 1));
                    }
                    for w in pa.preferred_during_scheduling_ignored_during_execution.iter().flatten() {
                        preferred_affinity.push(AffinityTerm::new(
                            &namespace,
                            &w.pod_affinity_term,
                            i64::from(w.weight),
                        ));
                    }
                }
                if let Some(pa) = &aff.pod_anti_affinity {
                    for t in pa.required_during_scheduling_ignored_during_execution.iter().flatten() {
                        required_anti_affinity.push(AffinityTerm::new(&namespace, t, 1));
                    }
                    for w in pa.preferred_during_scheduling_ignored_during_execution.iter().flatten() {
                        preferred_anti_affinity.push(AffinityTerm::new(
                            &namespace,
                            &w.pod_affinity_term,
                            i64::from(w.weight),
                        ));
                    }
                }
            }
        }
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        PodInfo {
            uid: meta.uid.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            labels: meta.labels.clone().unwrap_or_default(),
            deleting: meta.deletion_timestamp.is_some(),
            terminal: matches!(phase, Some("Succeeded") | Some("Failed")),
            namespace,
            priority,
            requests,
            non_zero_cpu,
            non_zero_mem,
            host_ports,
            tolerations,
            required_affinity,
            required_anti_affinity,
            preferred_affinity,
            preferred_anti_affinity,
            node_name,
            scheduler_name,
            claims,
            has_disk_volumes,
            pod,
        }
    }

    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The `namespace/name` keys of the claims the pod's `persistentVolumeClaim` volumes use
    /// (what upstream's NodeInfo counts in its PVC reference counts).
    pub fn pvc_keys(&self) -> impl Iterator<Item = String> + '_ {
        self.claims
            .iter()
            .filter(|c| !c.ephemeral)
            .map(|c| format!("{}/{}", self.namespace, c.name))
    }

    pub fn has_affinity_terms(&self) -> bool {
        !(self.required_affinity.is_empty()
            && self.required_anti_affinity.is_empty()
            && self.preferred_affinity.is_empty()
            && self.preferred_anti_affinity.is_empty())
    }

    pub fn preemption_policy_never(&self) -> bool {
        self.pod.spec.as_ref().and_then(|s| s.preemption_policy.as_deref()) == Some("Never")
    }

    pub fn nominated_node(&self) -> Option<&str> {
        self.pod
            .status
            .as_ref()
            .and_then(|s| s.nominated_node_name.as_deref())
            .filter(|s| !s.is_empty())
    }
}

impl Resource {
    fn set_max_resource(&mut self, other: &Resource) {
        self.milli_cpu = self.milli_cpu.max(other.milli_cpu);
        self.memory = self.memory.max(other.memory);
        self.ephemeral_storage = self.ephemeral_storage.max(other.ephemeral_storage);
        for (n, v) in &other.scalar {
            let slot = self.scalar_mut(n);
            *slot = (*slot).max(*v);
        }
    }
}

/// The scheduler's view of one node: the Node plus the sums over the pods on it.
#[derive(Debug, Clone, Default)]
pub struct NodeInfo {
    pub name: String,
    pub node: Option<Arc<Node>>,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub unschedulable: bool,
    pub allocatable: Resource,
    pub requested: Resource,
    pub non_zero_cpu: i64,
    pub non_zero_mem: i64,
    pub pods: Vec<Arc<PodInfo>>,
    pub used_ports: Vec<HostPort>,
    /// Number of pods here with any pod (anti-)affinity term.
    pub pods_with_affinity: usize,
    /// Number of pods here with required anti-affinity terms.
    pub pods_with_required_anti_affinity: usize,
    pub generation: u64,
}

impl NodeInfo {
    pub fn new(node: Arc<Node>) -> Self {
        let mut ni = NodeInfo::default();
        ni.set_node(node);
        ni
    }

    pub fn set_node(&mut self, node: Arc<Node>) {
        self.name = node.metadata.name.clone().unwrap_or_default();
        self.labels = node.metadata.labels.clone().unwrap_or_default();
        let spec = node.spec.as_ref();
        self.taints = spec.and_then(|s| s.taints.clone()).unwrap_or_default();
        self.unschedulable = spec.and_then(|s| s.unschedulable).unwrap_or(false);
        self.allocatable = Resource::from_list(
            node.status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref().or(s.capacity.as_ref())),
        );
        self.node = Some(node);
        self.generation += 1;
    }

    pub fn add_pod(&mut self, pod: Arc<PodInfo>) {
        self.requested.add(&pod.requests);
        self.non_zero_cpu += pod.non_zero_cpu;
        self.non_zero_mem += pod.non_zero_mem;
        self.used_ports.extend(pod.host_ports.iter().cloned());
        if pod.has_affinity_terms() {
            self.pods_with_affinity += 1;
        }
        if !pod.required_anti_affinity.is_empty() {
            self.pods_with_required_anti_affinity += 1;
        }
        self.pods.push(pod);
        self.generation += 1;
    }

    /// Removes the pod with this uid; returns it if it was here.
    pub fn remove_pod(&mut self, uid: &str) -> Option<Arc<PodInfo>> {
        let i = self.pods.iter().position(|p| p.uid == uid)?;
        let pod = self.pods.swap_remove(i);
        self.requested.sub(&pod.requests);
        self.non_zero_cpu -= pod.non_zero_cpu;
        self.non_zero_mem -= pod.non_zero_mem;
        for hp in &pod.host_ports {
            if let Some(j) = self.used_ports.iter().position(|u| u == hp) {
                self.used_ports.swap_remove(j);
            }
        }
        if pod.has_affinity_terms() {
            self.pods_with_affinity -= 1;
        }
        if !pod.required_anti_affinity.is_empty() {
            self.pods_with_required_anti_affinity -= 1;
        }
        self.generation += 1;
        Some(pod)
    }
}

#[cfg(test)]
pub(crate) mod testutil {
    //! Builders for tests.
    use super::*;
    use k8s_openapi::api::core::v1::{Container, NodeSpec, NodeStatus, PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    pub fn q(s: &str) -> Quantity {
        Quantity(s.to_string())
    }

    pub fn node(name: &str, cpu: &str, mem: &str, pods: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some([("kubernetes.io/hostname".to_string(), name.to_string())].into()),
                ..Default::default()
            },
            spec: Some(NodeSpec::default()),
            status: Some(NodeStatus {
                allocatable: Some(
                    [
                        ("cpu".to_string(), q(cpu)),
                        ("memory".to_string(), q(mem)),
                        ("pods".to_string(), q(pods)),
                    ]
                    .into(),
                ),
                ..Default::default()
            }),
        }
    }

    pub fn pod(name: &str, cpu: &str, mem: &str) -> Pod {
        let mut req = BTreeMap::new();
        if !cpu.is_empty() {
            req.insert("cpu".to_string(), q(cpu));
        }
        if !mem.is_empty() {
            req.insert("memory".to_string(), q(mem));
        }
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    resources: Some(ResourceRequirements {
                        requests: if req.is_empty() { None } else { Some(req) },
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: None,
        }
    }

    pub fn node_info(n: Node) -> NodeInfo {
        NodeInfo::new(Arc::new(n))
    }
}

#[cfg(test)]
mod tests {
    use super::testutil::*;
    use super::*;
    use k8s_openapi::api::core::v1::{Container, ResourceRequirements};

    #[test]
    fn pod_requests_with_init_containers_and_overhead() {
        let mut p = pod("p", "2", "1G");
        let spec = p.spec.as_mut().unwrap();
        spec.containers.push(Container {
            name: "c2".into(),
            resources: Some(ResourceRequirements {
                requests: Some([("cpu".to_string(), q("1")), ("memory".to_string(), q("1G"))].into()),
                ..Default::default()
            }),
            ..Default::default()
        });
        for (cpu, mem) in [("2", "1G"), ("2", "3G")] {
            spec.init_containers.get_or_insert_with(Vec::new).push(Container {
                name: "i".into(),
                resources: Some(ResourceRequirements {
                    requests: Some([("cpu".to_string(), q(cpu)), ("memory".to_string(), q(mem))].into()),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
        spec.overhead = Some([("cpu".to_string(), q("500m"))].into());
        let pi = PodInfo::new(p);
        assert_eq!(pi.requests.milli_cpu, 3500);
        assert_eq!(pi.requests.memory, 3_000_000_000);
    }

    #[test]
    fn sidecar_after_init_container() {
        // Upstream: max(containers + sidecars, init + sidecars started before it).
        let mut p = pod("p", "1", "");
        let spec = p.spec.as_mut().unwrap();
        let c = |name: &str, cpu: &str, always: bool| Container {
            name: name.into(),
            restart_policy: always.then(|| "Always".to_string()),
            resources: Some(ResourceRequirements {
                requests: Some([("cpu".to_string(), q(cpu))].into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        spec.init_containers = Some(vec![c("init", "5", false), c("sidecar", "2", true)]);
        assert_eq!(PodInfo::new(p.clone()).requests.milli_cpu, 5000);
        let spec = p.spec.as_mut().unwrap();
        spec.init_containers = Some(vec![c("sidecar", "2", true), c("init", "2", false)]);
        // app phase 1 + 2 = 3; init phase 2 + 2 = 4.
        assert_eq!(PodInfo::new(p).requests.milli_cpu, 4000);
    }

    #[test]
    fn no_requests_means_no_share_but_nonzero_for_scoring() {
        let pi = PodInfo::new(pod("p", "", ""));
        assert!(pi.requests.is_zero());
        assert_eq!(pi.non_zero_cpu, DEFAULT_MILLI_CPU_REQUEST);
        assert_eq!(pi.non_zero_mem, DEFAULT_MEMORY_REQUEST);
    }

    #[test]
    fn extended_resources_are_scalar() {
        let r = Resource::from_list(Some(
            &[
                ("nvidia.com/gpu".to_string(), q("2")),
                ("hugepages-2Mi".to_string(), q("4Mi")),
                ("kubernetes.io/foo".to_string(), q("1")),
            ]
            .into(),
        ));
        assert_eq!(r.scalar("nvidia.com/gpu"), 2);
        assert_eq!(r.scalar("hugepages-2Mi"), 4 * 1024 * 1024);
        assert_eq!(r.scalar("kubernetes.io/foo"), 0);
    }

    #[test]
    fn node_info_add_remove() {
        let mut ni = node_info(node("n", "4", "8Gi", "110"));
        let p = Arc::new(PodInfo::new(pod("a", "1", "1Gi")));
        ni.add_pod(p);
        assert_eq!(ni.requested.milli_cpu, 1000);
        assert!(ni.remove_pod("uid-a").is_some());
        assert_eq!(ni.requested.milli_cpu, 0);
        assert!(ni.pods.is_empty());
    }
}
