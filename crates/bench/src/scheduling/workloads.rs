//! The scheduler_perf workload shapes: upstream's nodes, initial pods, measured pods and pod
//! templates (kubernetes/kubernetes `test/integration/scheduler_perf`: the
//! `performance-config.yaml` of each area and `templates/`), and the SchedulingThroughput
//! threshold upstream publishes for the shape's 5,000-node workload labelled `performance`.

use std::str::FromStr;

use anyhow::Context;
use serde_json::{Value, json};

pub const ZONE: &str = "topology.kubernetes.io/zone";
pub const HOSTNAME: &str = "kubernetes.io/hostname";
pub(crate) const TAINT_KEY: &str = "bench.skiff.dev/dedicated";
/// The label of the namespaces the namespace-selector shapes select (namespace-with-labels.yaml).
pub const TEAM_LABEL: (&str, &str) = ("team", "devops");
/// The CSI driver of SchedulingCSIPVs (pv-csi.yaml) and its per-node volume limit.
pub const CSI_DRIVER: &str = "ebs.csi.aws.com";
const CSI_LIMIT: u32 = 39;
/// The priority of PreemptionBasic's measured pods (pod-high-priority.yaml's `priority: 10`).
pub const HIGH_PRIORITY: i32 = 10;

/// The scheduler_perf workload shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Workload {
    /// SchedulingBasic: pod-default on node-default.
    Basic,
    /// SchedulingNodeAffinity: nodes in zone1, pods requiring zone In [zone1, zone2].
    NodeAffinity,
    /// Tainted nodes (NoSchedule on all, PreferNoSchedule on half), tolerating pods (no upstream
    /// twin).
    Taints,
    /// TopologySpreading: nodes over three zones, pods spread by zone (maxSkew 5, DoNotSchedule).
    TopologySpread,
    /// PreferredTopologySpreading: the same constraint, ScheduleAnyway.
    PreferredTopologySpread,
    /// DefaultTopologySpreading: pods without constraints of their own that a Service selects, so
    /// the system default constraints (hostname maxSkew 3, zone maxSkew 5, ScheduleAnyway) apply.
    DefaultTopologySpread,
    /// SchedulingWithNodeInclusionPolicy: a fifth of the nodes tainted, pods spread by hostname
    /// (maxSkew 1, DoNotSchedule) honoring node affinity and taints.
    NodeInclusionPolicy,
    /// SchedulingPodAntiAffinity: pods repel each other by hostname.
    PodAntiAffinity,
    /// SchedulingPodAffinity: nodes in zone1, pods attracted to each other by zone.
    PodAffinity,
    /// SchedulingPreferredPodAffinity: preferred affinity by hostname.
    PreferredPodAffinity,
    /// SchedulingPreferredPodAntiAffinity: preferred anti-affinity by hostname.
    PreferredPodAntiAffinity,
    /// MixedSchedulingBasePod: initial pods of five templates (plain, affinity, anti-affinity,
    /// preferred affinity, preferred anti-affinity), plain measured pods.
    Mixed,
    /// SchedulingRequiredPodAffinityWithNSSelector: affinity by zone to pods of the namespaces
    /// labelled team=devops.
    PodAffinityNsSelector,
    /// SchedulingRequiredPodAntiAffinityWithNSSelector: anti-affinity by hostname to pods of the
    /// namespaces labelled team=devops.
    PodAntiAffinityNsSelector,
    /// SchedulingPreferredAffinityWithNSSelector.
    PreferredAffinityNsSelector,
    /// SchedulingPreferredAntiAffinityWithNSSelector.
    PreferredAntiAffinityNsSelector,
    /// PreemptionBasic: low-priority initial pods fill the nodes (4 x 900m of 4 CPUs), each
    /// high-priority measured pod (3 CPUs) preempts three of them.
    Preemption,
    /// SchedulingSecrets: pods with a secret volume.
    Secrets,
    /// SchedulingInTreePVs: each pod with a claim pre-bound to an AWS EBS volume.
    InTreePvs,
    /// SchedulingCSIPVs: each pod with a claim pre-bound to a CSI volume; nodes with CSINodes
    /// allowing 39 volumes of the driver.
    CsiPvs,
}

/// Upstream's numbers for a shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Upstream {
    /// The test case and workload whose threshold is given.
    pub name: &'static str,
    /// SchedulingThroughput's threshold in pods/s, when upstream publishes one at 5,000 nodes.
    pub threshold: Option<f64>,
    /// Nodes of that workload.
    pub nodes: usize,
    /// Its initial pods, per template of `init_kinds`.
    pub init_pods: usize,
    /// Its measured pods.
    pub measure_pods: usize,
}

/// Upstream's pod templates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PodKind {
    /// pod-default.yaml
    Default,
    /// pod-with-node-affinity.yaml
    NodeAffinity,
    /// pod-default tolerating the taints shape's NoSchedule taint.
    Tolerating,
    /// pod-with-topology-spreading.yaml
    TopologySpread,
    /// pod-with-preferred-topology-spreading.yaml
    PreferredTopologySpread,
    /// pod-with-label.yaml: app=scheduler-perf, no requests.
    WithLabel,
    /// pod-with-node-inclusion-policy.yaml
    NodeInclusionPolicy,
    /// pod-with-pod-affinity.yaml
    PodAffinity,
    /// pod-with-pod-anti-affinity.yaml
    PodAntiAffinity,
    /// pod-with-preferred-pod-affinity.yaml
    PreferredPodAffinity,
    /// pod-with-preferred-pod-anti-affinity.yaml
    PreferredPodAntiAffinity,
    /// pod-affinity-ns-selector.yaml
    AffinityNsSelector,
    /// pod-anti-affinity-ns-selector.yaml
    AntiAffinityNsSelector,
    /// pod-preferred-affinity-ns-selector.yaml
    PreferredAffinityNsSelector,
    /// pod-preferred-anti-affinity-ns-selector.yaml
    PreferredAntiAffinityNsSelector,
    /// pod-low-priority.yaml
    LowPriority,
    /// pod-high-priority.yaml (its priority from a PriorityClass: the API server's Priority
    /// admission refuses a bare `priority`).
    HighPriority,
    /// pod-with-secret-volume.yaml
    SecretVolume,
    /// pod-default with the claim `pvc-N` (scheduler_perf's persistentVolumeClaimTemplatePath).
    WithClaim,
}

impl Workload {
    pub const ALL: [Workload; 20] = [
        Workload::Basic,
        Workload::NodeAffinity,
        Workload::Taints,
        Workload::TopologySpread,
        Workload::PreferredTopologySpread,
        Workload::DefaultTopologySpread,
        Workload::NodeInclusionPolicy,
        Workload::PodAntiAffinity,
        Workload::PodAffinity,
        Workload::PreferredPodAffinity,
        Workload::PreferredPodAntiAffinity,
        Workload::Mixed,
        Workload::PodAffinityNsSelector,
        Workload::PodAntiAffinityNsSelector,
        Workload::PreferredAffinityNsSelector,
        Workload::PreferredAntiAffinityNsSelector,
        Workload::Preemption,
        Workload::Secrets,
        Workload::InTreePvs,
        Workload::CsiPvs,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            Workload::Basic => "basic",
            Workload::NodeAffinity => "node-affinity",
            Workload::Taints => "taints",
            Workload::TopologySpread => "topology-spread",
            Workload::PreferredTopologySpread => "preferred-topology-spread",
            Workload::DefaultTopologySpread => "default-topology-spread",
            Workload::NodeInclusionPolicy => "node-inclusion-policy",
            Workload::PodAntiAffinity => "pod-anti-affinity",
            Workload::PodAffinity => "pod-affinity",
            Workload::PreferredPodAffinity => "preferred-pod-affinity",
            Workload::PreferredPodAntiAffinity => "preferred-pod-anti-affinity",
            Workload::Mixed => "mixed",
            Workload::PodAffinityNsSelector => "pod-affinity-ns-selector",
            Workload::PodAntiAffinityNsSelector => "pod-anti-affinity-ns-selector",
            Workload::PreferredAffinityNsSelector => "preferred-pod-affinity-ns-selector",
            Workload::PreferredAntiAffinityNsSelector => "preferred-pod-anti-affinity-ns-selector",
            Workload::Preemption => "preemption",
            Workload::Secrets => "secrets",
            Workload::InTreePvs => "in-tree-pvs",
            Workload::CsiPvs => "csi-pvs",
        }
    }

    /// Upstream's shape: the workload of the test case that carries the threshold at 5,000
    /// nodes (the one with SchedulerQueueingHints on where both are listed; their thresholds are
    /// the same but for SchedulingPodMatchingAntiAffinity, not covered here).
    pub fn upstream(self) -> Upstream {
        let u = |name, threshold: Option<f64>, nodes, init_pods, measure_pods| Upstream {
            name,
            threshold,
            nodes,
            init_pods,
            measure_pods,
        };
        match self {
            // misc/performance-config.yaml
            Workload::Basic => u("SchedulingBasic/5000Nodes_10000Pods", Some(680.0), 5000, 1000, 10_000),
            // affinity/performance-config.yaml
            Workload::NodeAffinity => u(
                "SchedulingNodeAffinity/5000Nodes_10000Pods",
                Some(220.0),
                5000,
                5000,
                10_000,
            ),
            Workload::Taints => u("(none: SchedulingBasic's counts)", None, 5000, 1000, 10_000),
            // topology_spreading/performance-config.yaml
            Workload::TopologySpread => u("TopologySpreading/5000Nodes_5000Pods", Some(460.0), 5000, 5000, 5000),
            Workload::PreferredTopologySpread => u(
                "PreferredTopologySpreading/5000Nodes_5000Pods",
                Some(340.0),
                5000,
                5000,
                5000,
            ),
            Workload::DefaultTopologySpread => u(
                "DefaultTopologySpreading/5000Nodes_50000Pods",
                Some(160.0),
                5000,
                5000,
                50_000,
            ),
            // 4,000 untainted and 1,000 tainted nodes, no initial pods.
            Workload::NodeInclusionPolicy => u(
                "SchedulingWithNodeInclusionPolicy/5000Nodes",
                Some(270.0),
                5000,
                0,
                4000,
            ),
            // affinity/performance-config.yaml
            Workload::PodAntiAffinity => u(
                "SchedulingPodAntiAffinity/5000Nodes_2000Pods",
                Some(60.0),
                5000,
                1000,
                2000,
            ),
            Workload::PodAffinity => u("SchedulingPodAffinity/5000Nodes_5000Pods", Some(35.0), 5000, 5000, 5000),
            Workload::PreferredPodAffinity => u(
                "SchedulingPreferredPodAffinity/5000Nodes_5000Pods",
                Some(90.0),
                5000,
                5000,
                5000,
            ),
            Workload::PreferredPodAntiAffinity => u(
                "SchedulingPreferredPodAntiAffinity/5000Nodes_5000Pods",
                Some(90.0),
                5000,
                5000,
                5000,
            ),
            // 2,000 initial pods of each of the five templates.
            Workload::Mixed => u(
                "MixedSchedulingBasePod/5000Nodes_5000Pods",
                Some(140.0),
                5000,
                2000,
                5000,
            ),
            // 100 namespaces of 50 initial pods.
            Workload::PodAffinityNsSelector => u(
                "SchedulingRequiredPodAffinityWithNSSelector/5000Nodes_2000Pods",
                Some(35.0),
                5000,
                5000,
                2000,
            ),
            // 100 namespaces of 40 initial pods, on 6,000 nodes (one pod a node).
            Workload::PodAntiAffinityNsSelector => u(
                "SchedulingRequiredPodAntiAffinityWithNSSelector/5000Nodes_2000Pods",
                Some(24.0),
                6000,
                4000,
                2000,
            ),
            Workload::PreferredAffinityNsSelector => u(
                "SchedulingPreferredAffinityWithNSSelector/5000Nodes_5000Pods",
                Some(90.0),
                5000,
                5000,
                5000,
            ),
            Workload::PreferredAntiAffinityNsSelector => u(
                "SchedulingPreferredAntiAffinityWithNSSelector/5000Nodes_2000Pods",
                Some(55.0),
                5000,
                4000,
                2000,
            ),
            // misc/performance-config.yaml: upstream's 5000Nodes workload is commented out ("always
            // seems to fail", kubernetes#108308) and its 1000Nodes one has no threshold.
            Workload::Preemption => u("PreemptionBasic/1000Nodes (no threshold)", None, 1000, 4000, 1000),
            // volumes/performance-config.yaml
            Workload::Secrets => u("SchedulingSecrets/5000Nodes_10000Pods", Some(790.0), 5000, 1000, 10_000),
            Workload::InTreePvs => u("SchedulingInTreePVs/5000Nodes_2000Pods", Some(290.0), 5000, 1000, 2000),
            Workload::CsiPvs => u("SchedulingCSIPVs/5000Nodes_5000Pods", Some(100.0), 5000, 5000, 5000),
        }
    }

    /// The templates of the initial pods, `init_pods` of each, in order.
    pub fn init_kinds(self) -> &'static [PodKind] {
        match self {
            Workload::Basic
            | Workload::TopologySpread
            | Workload::PreferredTopologySpread
            | Workload::DefaultTopologySpread => &[PodKind::Default],
            Workload::NodeInclusionPolicy => &[],
            Workload::Mixed => &[
                PodKind::Default,
                PodKind::PodAffinity,
                PodKind::PodAntiAffinity,
                PodKind::PreferredPodAffinity,
                PodKind::PreferredPodAntiAffinity,
            ],
            Workload::Preemption => &[PodKind::LowPriority],
            Workload::NodeAffinity => &[PodKind::NodeAffinity],
            Workload::Taints => &[PodKind::Tolerating],
            Workload::PodAntiAffinity => &[PodKind::PodAntiAffinity],
            Workload::PodAffinity => &[PodKind::PodAffinity],
            Workload::PreferredPodAffinity => &[PodKind::PreferredPodAffinity],
            Workload::PreferredPodAntiAffinity => &[PodKind::PreferredPodAntiAffinity],
            Workload::PodAffinityNsSelector => &[PodKind::AffinityNsSelector],
            Workload::PodAntiAffinityNsSelector => &[PodKind::AntiAffinityNsSelector],
            Workload::PreferredAffinityNsSelector => &[PodKind::PreferredAffinityNsSelector],
            Workload::PreferredAntiAffinityNsSelector => &[PodKind::PreferredAntiAffinityNsSelector],
            Workload::Secrets => &[PodKind::SecretVolume],
            Workload::InTreePvs | Workload::CsiPvs => &[PodKind::WithClaim],
        }
    }

    /// The template of the measured pods.
    pub fn measured_kind(self) -> PodKind {
        match self {
            Workload::Basic | Workload::Mixed => PodKind::Default,
            Workload::TopologySpread => PodKind::TopologySpread,
            Workload::PreferredTopologySpread => PodKind::PreferredTopologySpread,
            Workload::DefaultTopologySpread => PodKind::WithLabel,
            Workload::NodeInclusionPolicy => PodKind::NodeInclusionPolicy,
            Workload::Preemption => PodKind::HighPriority,
            w => w.init_kinds()[0],
        }
    }

    /// The initial pods per template for a cluster of `nodes`: upstream's count, in proportion
    /// to the nodes.
    pub fn default_init_pods(self, nodes: usize) -> usize {
        let u = self.upstream();
        u.init_pods * nodes / u.nodes
    }

    /// Initial pods per namespace for the shapes whose initial pods live in many namespaces
    /// (scheduler_perf's createPodSets with `initPodsPerNamespace`).
    pub fn init_pods_per_namespace(self) -> Option<usize> {
        match self {
            Workload::PodAffinityNsSelector | Workload::PreferredAffinityNsSelector => Some(50),
            Workload::PodAntiAffinityNsSelector | Workload::PreferredAntiAffinityNsSelector => Some(40),
            _ => None,
        }
    }

    /// Whether the benchmark's namespaces carry team=devops (namespace-with-labels.yaml).
    pub fn labelled_namespaces(self) -> bool {
        self.init_pods_per_namespace().is_some()
    }

    /// Whether each pod comes with a PersistentVolume and a claim bound to it.
    pub fn volumes(self) -> Option<VolumeKind> {
        match self {
            Workload::InTreePvs => Some(VolumeKind::AwsEbs),
            Workload::CsiPvs => Some(VolumeKind::Csi),
            _ => None,
        }
    }

    /// The most pods the workload can place on `nodes`, when it is limited by more than
    /// resources: (initial, measured) counts checked against it, and why.
    pub fn refuse(self, nodes: usize, init_per_kind: usize, pods: usize) -> Option<String> {
        match self {
            Workload::PodAntiAffinity | Workload::PodAntiAffinityNsSelector if init_per_kind + pods > nodes => {
                Some(format!(
                    "the {self} workload places at most one pod per node, initial pods included: \
                     {init_per_kind} + {pods} pods cannot fit on {nodes} nodes (upstream runs {} + {} on {})",
                    self.upstream().init_pods,
                    self.upstream().measure_pods,
                    self.upstream().nodes
                ))
            }
            Workload::Mixed if init_per_kind > nodes => Some(format!(
                "the mixed workload's {init_per_kind} initial anti-affinity pods need a node each: \
                 they cannot fit on {nodes} nodes"
            )),
            Workload::Preemption if pods > nodes || init_per_kind > 4 * nodes => Some(format!(
                "the preemption workload places one high-priority pod per node and four low-priority \
                 pods per node: {pods} pods and {init_per_kind} initial pods cannot fit on {nodes} nodes \
                 (upstream runs 1,000 over 4,000 on 1,000)"
            )),
            _ => None,
        }
    }
}

impl FromStr for Workload {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        Workload::ALL.into_iter().find(|w| w.as_str() == s).with_context(|| {
            let names: Vec<&str> = Workload::ALL.iter().map(Workload::as_str).collect();
            format!("unknown workload {s:?}; known: {}", names.join(", "))
        })
    }
}

impl std::fmt::Display for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The volume source of the PVC shapes' PersistentVolumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeKind {
    /// pv-aws.yaml
    AwsEbs,
    /// pv-csi.yaml
    Csi,
}

/// scheduler_perf's node-default (4 CPUs, 32Gi, 110 pods), labelled and tainted per workload.
/// Node `i` of `nodes`.
pub fn bench_node(prefix: &str, i: usize, nodes: usize, workload: Workload) -> Value {
    let name = format!("{prefix}-{i}");
    let mut labels = json!({HOSTNAME: name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"});
    let mut taints = Vec::new();
    let mut res = json!({"cpu": "4", "memory": "32Gi", "pods": "110"});
    match workload {
        // labelNodePrepareStrategy: zone1 on every node.
        Workload::NodeAffinity | Workload::PodAffinity | Workload::Mixed | Workload::PodAffinityNsSelector => {
            labels[ZONE] = json!("zone1")
        }
        // labelNodePrepareStrategy: moon-1, moon-2, moon-3 in turn.
        Workload::TopologySpread | Workload::PreferredTopologySpread | Workload::DefaultTopologySpread => {
            labels[ZONE] = json!(format!("moon-{}", i % 3 + 1))
        }
        Workload::Taints => {
            taints.push(json!({"key": TAINT_KEY, "value": "bench", "effect": "NoSchedule"}));
            if i % 2 == 1 {
                taints.push(json!({"key": "bench.skiff.dev/busy", "value": "true", "effect": "PreferNoSchedule"}));
            }
        }
        // The untainted nodes first, then a fifth of them with node-with-taint.yaml's taint.
        Workload::NodeInclusionPolicy if i >= nodes - nodes / 5 => {
            taints.push(json!({"key": "foo", "effect": "NoSchedule"}));
        }
        // nodeAllocatableStrategy: 39 volumes of the CSI driver.
        Workload::CsiPvs => res[format!("attachable-volumes-csi-{CSI_DRIVER}")] = json!(CSI_LIMIT.to_string()),
        _ => {}
    }
    let mut node = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {},
        "status": {
            "capacity": res, "allocatable": res, "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kubelet is posting ready status"}],
        },
    });
    if !taints.is_empty() {
        node["spec"]["taints"] = Value::Array(taints);
    }
    node
}

/// The CSINode of a node of the csi-pvs workload (nodeAllocatableStrategy's csiNodeAllocatable).
pub fn bench_csinode(node: &str) -> Value {
    json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSINode",
        "metadata": {"name": node},
        "spec": {"drivers": [{"name": CSI_DRIVER, "nodeID": node, "allocatable": {"count": CSI_LIMIT}}]},
    })
}

/// What a pod template refers to besides the pod's own index.
#[derive(Debug, Clone)]
pub struct PodContext {
    pub scheduler: String,
    /// The namespaces the affinity templates name (upstream's ["sched-1", "sched-0"]): the
    /// measured pods' and the initial pods'.
    pub measured_namespace: String,
    pub init_namespace: String,
    /// The PriorityClass of the high-priority pods.
    pub priority_class: String,
}

fn term(selector: Value, key: &str, scope: (&str, Value)) -> Value {
    let mut t = json!({"labelSelector": {"matchLabels": selector}, "topologyKey": key});
    t[scope.0] = scope.1;
    t
}

/// Upstream's pod template `kind`, named `pod-{index}` (its claim, if any, `pvc-{index}`).
pub fn bench_pod(index: &str, kind: PodKind, ctx: &PodContext) -> Value {
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": format!("pod-{index}")},
        "spec": {
            "schedulerName": ctx.scheduler,
            "containers": [{
                "name": "pause",
                "image": "registry.k8s.io/pause:3.10",
                "ports": [{"containerPort": 80}],
                "resources": {
                    "requests": {"cpu": "100m", "memory": "500Mi"},
                    "limits": {"cpu": "100m", "memory": "500Mi"},
                },
            }],
        },
    });
    let namespaces = ("namespaces", json!([ctx.measured_namespace, ctx.init_namespace]));
    let team = || {
        (
            "namespaceSelector",
            json!({"matchLabels": {TEAM_LABEL.0: TEAM_LABEL.1}}),
        )
    };
    let (labels, spec_key, value): (Value, &str, Value) = match kind {
        PodKind::Default | PodKind::WithClaim => (Value::Null, "", Value::Null),
        PodKind::NodeAffinity => (
            Value::Null,
            "affinity",
            json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": ZONE, "operator": "In", "values": ["zone1", "zone2"]}]}]}}}),
        ),
        PodKind::Tolerating => (
            Value::Null,
            "tolerations",
            json!([{"key": TAINT_KEY, "operator": "Equal", "value": "bench", "effect": "NoSchedule"}]),
        ),
        PodKind::TopologySpread | PodKind::PreferredTopologySpread => {
            let when = if kind == PodKind::TopologySpread {
                "DoNotSchedule"
            } else {
                "ScheduleAnyway"
            };
            (
                json!({"color": "blue"}),
                "topologySpreadConstraints",
                json!([{"maxSkew": 5, "topologyKey": ZONE, "whenUnsatisfiable": when,
                        "labelSelector": {"matchLabels": {"color": "blue"}}}]),
            )
        }
        PodKind::WithLabel => {
            pod["spec"]["containers"] = json!([{"name": "pause", "image": "registry.k8s.io/pause:3.10"}]);
            (json!({"app": "scheduler-perf"}), "", Value::Null)
        }
        PodKind::NodeInclusionPolicy => (
            json!({"foo": "bar"}),
            "topologySpreadConstraints",
            json!([{"maxSkew": 1, "topologyKey": HOSTNAME, "whenUnsatisfiable": "DoNotSchedule",
                    "nodeAffinityPolicy": "Honor", "nodeTaintsPolicy": "Honor",
                    "labelSelector": {"matchLabels": {"foo": "bar"}}}]),
        ),
        PodKind::PodAffinity | PodKind::AffinityNsSelector => {
            let scope = if kind == PodKind::PodAffinity {
                namespaces
            } else {
                team()
            };
            (
                json!({"color": "blue"}),
                "affinity",
                json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    term(json!({"color": "blue"}), ZONE, scope)]}}),
            )
        }
        PodKind::PodAntiAffinity | PodKind::AntiAffinityNsSelector => {
            let scope = if kind == PodKind::PodAntiAffinity {
                namespaces
            } else {
                team()
            };
            (
                json!({"color": "green"}),
                "affinity",
                json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    term(json!({"color": "green"}), HOSTNAME, scope)]}}),
            )
        }
        PodKind::PreferredPodAffinity | PodKind::PreferredAffinityNsSelector => {
            let scope = if kind == PodKind::PreferredPodAffinity {
                namespaces
            } else {
                team()
            };
            (
                json!({"color": "red"}),
                "affinity",
                json!({"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                    {"podAffinityTerm": term(json!({"color": "red"}), HOSTNAME, scope), "weight": 1}]}}),
            )
        }
        PodKind::PreferredPodAntiAffinity | PodKind::PreferredAntiAffinityNsSelector => {
            let (color, scope) = if kind == PodKind::PreferredPodAntiAffinity {
                ("yellow", namespaces)
            } else {
                ("green", team())
            };
            (
                json!({"color": color}),
                "affinity",
                json!({"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                    {"podAffinityTerm": term(json!({"color": color}), HOSTNAME, scope), "weight": 1}]}}),
            )
        }
        PodKind::LowPriority => {
            pod["spec"]["containers"][0]["resources"] = json!({
                "requests": {"cpu": "900m", "memory": "500Mi"}, "limits": {"cpu": "900m", "memory": "500Mi"}});
            (Value::Null, "terminationGracePeriodSeconds", json!(0))
        }
        PodKind::HighPriority => {
            pod["spec"]["containers"][0]["resources"] = json!({
                "requests": {"cpu": "3000m", "memory": "500Mi"}, "limits": {"cpu": "3000m", "memory": "500Mi"}});
            (Value::Null, "priorityClassName", json!(ctx.priority_class))
        }
        PodKind::SecretVolume => (
            Value::Null,
            "volumes",
            json!([{"name": "secret", "secret": {"secretName": "secret"}}]),
        ),
    };
    if kind == PodKind::WithClaim {
        pod["spec"]["volumes"] =
            json!([{"name": "vol", "persistentVolumeClaim": {"claimName": format!("pvc-{index}")}}]);
    }
    if !labels.is_null() {
        pod["metadata"]["labels"] = labels;
    }
    if !spec_key.is_empty() {
        pod["spec"][spec_key] = value;
    }
    pod
}

/// The PersistentVolume of pod `index` in `ns`, pre-bound to its claim (scheduler_perf's
/// CreatePodWithPersistentVolume with bindVolume: the volume named after the namespace, its
/// claimRef set, phase Bound).
pub fn bench_pv(ns: &str, index: usize, kind: VolumeKind) -> Value {
    let mut pv = json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": format!("{ns}-vol-{index}")},
        "spec": {
            "accessModes": ["ReadOnlyMany"],
            "capacity": {"storage": "1Gi"},
            "persistentVolumeReclaimPolicy": "Retain",
            "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": ns,
                         "name": format!("pvc-{index}")},
        },
    });
    match kind {
        VolumeKind::AwsEbs => pv["spec"]["awsElasticBlockStore"] = json!({"volumeID": format!("vol-{index}")}),
        VolumeKind::Csi => {
            pv["spec"]["csi"] = json!({"driver": CSI_DRIVER, "volumeHandle": format!("vol-{index}")});
        }
    }
    pv
}

/// The claim of pod `index` in `ns` (pvc.yaml), bound to its volume.
pub fn bench_pvc(ns: &str, index: usize) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": format!("pvc-{index}"),
            "namespace": ns,
            "annotations": {"pv.kubernetes.io/bind-completed": "true"},
        },
        "spec": {
            "accessModes": ["ReadOnlyMany"],
            "resources": {"requests": {"storage": "1Gi"}},
            "volumeName": format!("{ns}-vol-{index}"),
        },
    })
}

/// DefaultTopologySpreading's Service (service.yaml), selecting the measured pods.
pub fn bench_service() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "service-0"},
        "spec": {"selector": {"app": "scheduler-perf"},
                 "ports": [{"protocol": "TCP", "port": 80, "targetPort": 8000}]},
    })
}

/// The PriorityClass of PreemptionBasic's measured pods.
pub fn bench_priority_class(name: &str) -> Value {
    json!({
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": HIGH_PRIORITY,
        "description": "the preemption benchmark's measured pods",
    })
}
