//! The resources the API serves: group, version, kind, plural, scope, short names,
//! categories and subresources, as upstream's discovery documents them.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resource {
    /// API group ("" for the core group).
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    /// Lower-case plural, the URL segment ("pods").
    pub plural: &'static str,
    /// Lower-case singular ("pod").
    pub singular: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    /// Subresources served, e.g. "status", "scale", "binding", "eviction", "log", "exec".
    pub subresources: &'static [&'static str],
}

impl Resource {
    /// "v1" or "apps/v1".
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// "pods" or "deployments.apps": the name used in Status messages.
    pub fn qualified_plural(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// The kind of the list ("PodList").
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    pub fn has_subresource(&self, sub: &str) -> bool {
        self.subresources.contains(&sub)
    }

    /// Whether the resource is a view of resource usage (`metrics.k8s.io`): read from the node
    /// agents at each request, only got and listed, never stored.
    pub fn is_metrics(&self) -> bool {
        self.group == "metrics.k8s.io"
    }

    /// Whether the resource is made at each request from live state and never stored: the
    /// resource metrics and the deprecated `componentstatuses`; only got and listed.
    pub fn is_computed(&self) -> bool {
        self.is_metrics() || (self.group.is_empty() && self.plural == "componentstatuses")
    }

    /// Whether the resource only takes creates and stores nothing: the legacy `bindings` and
    /// the access and token reviews, which upstream answers and forgets.
    pub fn is_create_only(&self) -> bool {
        matches!(
            (self.group, self.plural),
            ("", "bindings")
                | ("authentication.k8s.io", "tokenreviews" | "selfsubjectreviews")
                | (
                    "authorization.k8s.io",
                    "subjectaccessreviews"
                        | "selfsubjectaccessreviews"
                        | "selfsubjectrulesreviews"
                        | "localsubjectaccessreviews"
                )
        )
    }
}

const ALL: &[&str] = &["all"];

macro_rules! res {
    ($group:expr, $version:expr, $kind:expr, $plural:expr, $singular:expr, $namespaced:expr, $short:expr, $cat:expr, $sub:expr) => {
        Resource {
            group: $group,
            version: $version,
            kind: $kind,
            plural: $plural,
            singular: $singular,
            namespaced: $namespaced,
            short_names: $short,
            categories: $cat,
            subresources: $sub,
        }
    };
}

/// Every built-in resource served, in discovery order (custom resources follow, see [`all`]).
pub static RESOURCES: &[Resource] = &[
    res!(
        "",
        "v1",
        "Namespace",
        "namespaces",
        "namespace",
        false,
        &["ns"],
        &[],
        &["status", "finalize"]
    ),
    res!(
        "",
        "v1",
        "Node",
        "nodes",
        "node",
        false,
        &["no"],
        &[],
        &["status", "proxy"]
    ),
    res!(
        "",
        "v1",
        "Pod",
        "pods",
        "pod",
        true,
        &["po"],
        ALL,
        &[
            "status",
            "binding",
            "eviction",
            "log",
            "exec",
            "attach",
            "portforward",
            "ephemeralcontainers"
        ]
    ),
    res!("", "v1", "Binding", "bindings", "binding", true, &[], &[], &[]),
    res!(
        "",
        "v1",
        "ComponentStatus",
        "componentstatuses",
        "componentstatus",
        false,
        &["cs"],
        &[],
        &[]
    ),
    res!("", "v1", "Event", "events", "event", true, &["ev"], &[], &[]),
    res!("", "v1", "Secret", "secrets", "secret", true, &[], &[], &[]),
    res!(
        "",
        "v1",
        "ConfigMap",
        "configmaps",
        "configmap",
        true,
        &["cm"],
        &[],
        &[]
    ),
    res!(
        "",
        "v1",
        "Service",
        "services",
        "service",
        true,
        &["svc"],
        ALL,
        &["status"]
    ),
    res!("", "v1", "Endpoints", "endpoints", "endpoints", true, &["ep"], &[], &[]),
    res!(
        "",
        "v1",
        "ServiceAccount",
        "serviceaccounts",
        "serviceaccount",
        true,
        &["sa"],
        &[],
        &["token"]
    ),
    res!(
        "",
        "v1",
        "PersistentVolume",
        "persistentvolumes",
        "persistentvolume",
        false,
        &["pv"],
        &[],
        &["status"]
    ),
    res!(
        "",
        "v1",
        "PersistentVolumeClaim",
        "persistentvolumeclaims",
        "persistentvolumeclaim",
        true,
        &["pvc"],
        &[],
        &["status"]
    ),
    res!(
        "",
        "v1",
        "ReplicationController",
        "replicationcontrollers",
        "replicationcontroller",
        true,
        &["rc"],
        ALL,
        &["status", "scale"]
    ),
    res!(
        "apps",
        "v1",
        "Deployment",
        "deployments",
        "deployment",
        true,
        &["deploy"],
        ALL,
        &["status", "scale"]
    ),
    res!(
        "apps",
        "v1",
        "ReplicaSet",
        "replicasets",
        "replicaset",
        true,
        &["rs"],
        ALL,
        &["status", "scale"]
    ),
    res!(
        "apps",
        "v1",
        "StatefulSet",
        "statefulsets",
        "statefulset",
        true,
        &["sts"],
        ALL,
        &["status", "scale"]
    ),
    res!(
        "apps",
        "v1",
        "DaemonSet",
        "daemonsets",
        "daemonset",
        true,
        &["ds"],
        ALL,
        &["status"]
    ),
    res!(
        "apps",
        "v1",
        "ControllerRevision",
        "controllerrevisions",
        "controllerrevision",
        true,
        &[],
        &[],
        &[]
    ),
    res!("batch", "v1", "Job", "jobs", "job", true, &[], ALL, &["status"]),
    res!(
        "batch",
        "v1",
        "CronJob",
        "cronjobs",
        "cronjob",
        true,
        &["cj"],
        ALL,
        &["status"]
    ),
    res!(
        "certificates.k8s.io",
        "v1",
        "CertificateSigningRequest",
        "certificatesigningrequests",
        "certificatesigningrequest",
        false,
        &["csr"],
        &[],
        &["approval", "status"]
    ),
    res!(
        "coordination.k8s.io",
        "v1",
        "Lease",
        "leases",
        "lease",
        true,
        &[],
        &[],
        &[]
    ),
    res!(
        "events.k8s.io",
        "v1",
        "Event",
        "events",
        "event",
        true,
        &["ev"],
        &[],
        &[]
    ),
    res!(
        "policy",
        "v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        "poddisruptionbudget",
        true,
        &["pdb"],
        &[],
        &["status"]
    ),
    res!(
        "authentication.k8s.io",
        "v1",
        "SelfSubjectReview",
        "selfsubjectreviews",
        "selfsubjectreview",
        false,
        &[],
        &[],
        &[]
    ),
    res!(
        "authentication.k8s.io",
        "v1",
        "TokenReview",
        "tokenreviews",
        "tokenreview",
        false,
        &[],
        &[],
        &[]
    ),
    res!(
        "authorization.k8s.io",
        "v1",
        "LocalSubjectAccessReview",
        "localsubjectaccessreviews",
        "localsubjectaccessreview",
        true,
        &[],
        &[],
        &[]
    ),
    res!(
        "authorization.k8s.io",
        "v1",
        "SelfSubjectAccessReview",
        "selfsubjectaccessreviews",
        "selfsubjectaccessreview",
        false,
        &[],
        &[],
        &[]
    ),
    res!(
        "authorization.k8s.io",
        "v1",
        "SelfSubjectRulesReview",
        "selfsubjectrulesreviews",
        "selfsubjectrulesreview",
        false,
        &[],
        &[],
        &[]
    ),
    res!(
        "authorization.k8s.io",
        "v1",
        "SubjectAccessReview",
        "subjectaccessreviews",
        "subjectaccessreview",
        false,
        &[],
        &[],
        &[]
    ),
    res!(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
        "clusterrolebinding",
        false,
        &[],
        &[],
        &[]
    ),
    res!(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRole",
        "clusterroles",
        "clusterrole",
        false,
        &[],
        &[],
        &[]
    ),
    res!(
        "rbac.authorization.k8s.io",
        "v1",
        "RoleBinding",
        "rolebindings",
        "rolebinding",
        true,
        &[],
        &[],
        &[]
    ),
    res!(
        "rbac.authorization.k8s.io",
        "v1",
        "Role",
        "roles",
        "role",
        true,
        &[],
        &[],
        &[]
    ),
    res!(
        "storage.k8s.io",
        "v1",
        "CSINode",
        "csinodes",
        "csinode",
        false,
        &[],
        &[],
        &[]
    ),
    res!(
        "storage.k8s.io",
        "v1",
        "StorageClass",
        "storageclasses",
        "storageclass",
        false,
        &["sc"],
        &[],
        &[]
    ),
    res!(
        "storage.k8s.io",
        "v1",
        "CSIDriver",
        "csidrivers",
        "csidriver",
        false,
        &[],
        &[],
        &[]
    ),
    res!(
        "storage.k8s.io",
        "v1",
        "CSIStorageCapacity",
        "csistoragecapacities",
        "csistoragecapacity",
        true,
        &[],
        &[],
        &[]
    ),
    res!(
        "storage.k8s.io",
        "v1",
        "VolumeAttachment",
        "volumeattachments",
        "volumeattachment",
        false,
        &[],
        &[],
        &["status"]
    ),
    res!(
        "discovery.k8s.io",
        "v1",
        "EndpointSlice",
        "endpointslices",
        "endpointslice",
        true,
        &[],
        &[],
        &[]
    ),
    res!(
        "networking.k8s.io",
        "v1",
        "IPAddress",
        "ipaddresses",
        "ipaddress",
        false,
        &["ip"],
        &[],
        &[]
    ),
    res!(
        "networking.k8s.io",
        "v1",
        "ServiceCIDR",
        "servicecidrs",
        "servicecidr",
        false,
        &[],
        &[],
        &["status"]
    ),
    res!(
        "admissionregistration.k8s.io",
        "v1",
        "MutatingWebhookConfiguration",
        "mutatingwebhookconfigurations",
        "mutatingwebhookconfiguration",
        false,
        &[],
        &["api-extensions"],
        &[]
    ),
    res!(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingWebhookConfiguration",
        "validatingwebhookconfigurations",
        "validatingwebhookconfiguration",
        false,
        &[],
        &["api-extensions"],
        &[]
    ),
    res!(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
        "validatingadmissionpolicy",
        false,
        &[],
        &["api-extensions"],
        &["status"]
    ),
    res!(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
        "validatingadmissionpolicybinding",
        false,
        &[],
        &["api-extensions"],
        &[]
    ),
    res!(
        "networking.k8s.io",
        "v1",
        "Ingress",
        "ingresses",
        "ingress",
        true,
        &["ing"],
        &[],
        &["status"]
    ),
    res!(
        "networking.k8s.io",
        "v1",
        "IngressClass",
        "ingressclasses",
        "ingressclass",
        false,
        &[],
        &[],
        &[]
    ),
    res!(
        "networking.k8s.io",
        "v1",
        "NetworkPolicy",
        "networkpolicies",
        "networkpolicy",
        true,
        &["netpol"],
        &[],
        &[]
    ),
    res!(
        "node.k8s.io",
        "v1",
        "RuntimeClass",
        "runtimeclasses",
        "runtimeclass",
        false,
        &[],
        &[],
        &[]
    ),
    res!(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        "customresourcedefinition",
        false,
        &["crd", "crds"],
        &["api-extensions"],
        &["status"]
    ),
    res!(
        "scheduling.k8s.io",
        "v1",
        "PriorityClass",
        "priorityclasses",
        "priorityclass",
        false,
        &["pc"],
        &[],
        &[]
    ),
    res!(
        "",
        "v1",
        "ResourceQuota",
        "resourcequotas",
        "resourcequota",
        true,
        &["quota"],
        &[],
        &["status"]
    ),
    res!(
        "",
        "v1",
        "LimitRange",
        "limitranges",
        "limitrange",
        true,
        &["limits"],
        &[],
        &[]
    ),
    res!(
        "",
        "v1",
        "PodTemplate",
        "podtemplates",
        "podtemplate",
        true,
        &[],
        &[],
        &[]
    ),
    res!(
        "autoscaling",
        "v2",
        "HorizontalPodAutoscaler",
        "horizontalpodautoscalers",
        "horizontalpodautoscaler",
        true,
        &["hpa"],
        ALL,
        &["status"]
    ),
    // Served beside v2, the preferred version it is stored as (`conversion`).
    res!(
        "autoscaling",
        "v1",
        "HorizontalPodAutoscaler",
        "horizontalpodautoscalers",
        "horizontalpodautoscaler",
        true,
        &["hpa"],
        ALL,
        &["status"]
    ),
    res!(
        "apiregistration.k8s.io",
        "v1",
        "APIService",
        "apiservices",
        "apiservice",
        false,
        &[],
        &["api-extensions"],
        &["status"]
    ),
    res!(
        "flowcontrol.apiserver.k8s.io",
        "v1",
        "FlowSchema",
        "flowschemas",
        "flowschema",
        false,
        &[],
        &[],
        &["status"]
    ),
    res!(
        "flowcontrol.apiserver.k8s.io",
        "v1",
        "PriorityLevelConfiguration",
        "prioritylevelconfigurations",
        "prioritylevelconfiguration",
        false,
        &[],
        &[],
        &["status"]
    ),
    res!(
        "metrics.k8s.io",
        "v1beta1",
        "NodeMetrics",
        "nodes",
        "",
        false,
        &[],
        &[],
        &[]
    ),
    res!(
        "metrics.k8s.io",
        "v1beta1",
        "PodMetrics",
        "pods",
        "",
        true,
        &[],
        &[],
        &[]
    ),
];

/// Workload versions upstream no longer serves (removed in 1.16 and 1.25), served only when
/// the server is started with `--serve-removed-apis` so that manifests written for them apply
/// as they are. Each is stored as its replacement (`conversion::removed`). They have neither
/// short names nor categories: `kubectl get deploy` and `kubectl get all` keep meaning the
/// current versions.
pub static REMOVED: &[Resource] = &[
    res!(
        "extensions",
        "v1beta1",
        "DaemonSet",
        "daemonsets",
        "daemonset",
        true,
        &[],
        &[],
        &["status"]
    ),
    res!(
        "extensions",
        "v1beta1",
        "Deployment",
        "deployments",
        "deployment",
        true,
        &[],
        &[],
        &["status"]
    ),
    res!(
        "extensions",
        "v1beta1",
        "ReplicaSet",
        "replicasets",
        "replicaset",
        true,
        &[],
        &[],
        &["status"]
    ),
    res!(
        "apps",
        "v1beta2",
        "ControllerRevision",
        "controllerrevisions",
        "controllerrevision",
        true,
        &[],
        &[],
        &[]
    ),
    res!(
        "apps",
        "v1beta2",
        "DaemonSet",
        "daemonsets",
        "daemonset",
        true,
        &[],
        &[],
        &["status"]
    ),
    res!(
        "apps",
        "v1beta2",
        "Deployment",
        "deployments",
        "deployment",
        true,
        &[],
        &[],
        &["status"]
    ),
    res!(
        "apps",
        "v1beta2",
        "ReplicaSet",
        "replicasets",
        "replicaset",
        true,
        &[],
        &[],
        &["status"]
    ),
    res!(
        "apps",
        "v1beta2",
        "StatefulSet",
        "statefulsets",
        "statefulset",
        true,
        &[],
        &[],
        &["status"]
    ),
    res!(
        "apps",
        "v1beta1",
        "ControllerRevision",
        "controllerrevisions",
        "controllerrevision",
        true,
        &[],
        &[],
        &[]
    ),
    res!(
        "apps",
        "v1beta1",
        "Deployment",
        "deployments",
        "deployment",
        true,
        &[],
        &[],
        &["status"]
    ),
    res!(
        "apps",
        "v1beta1",
        "StatefulSet",
        "statefulsets",
        "statefulset",
        true,
        &[],
        &[],
        &["status"]
    ),
    res!(
        "batch",
        "v1beta1",
        "CronJob",
        "cronjobs",
        "cronjob",
        true,
        &[],
        &[],
        &["status"]
    ),
];

/// Whether [`REMOVED`] is served (`--serve-removed-apis`); set once at start.
static SERVE_REMOVED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Serve the removed workload versions ([`REMOVED`]) or stop serving them.
pub fn serve_removed(on: bool) {
    SERVE_REMOVED.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// The removed versions served now: all of [`REMOVED`] or none.
fn removed() -> &'static [Resource] {
    if SERVE_REMOVED.load(std::sync::atomic::Ordering::Relaxed) {
        REMOVED
    } else {
        &[]
    }
}

/// Whether `res` is one of the removed versions ([`REMOVED`]).
pub fn is_removed(res: &Resource) -> bool {
    REMOVED.iter().any(|r| r == res)
}

/// Upstream's `GroupPriorityMinimum` of each named group kube-apiserver 1.33 serves (the
/// aggregator's `apiVersionPriorities`): `/apis` lists groups from the highest down.
const GROUP_PRIORITIES: &[(&str, u32)] = &[
    // The aggregator lists its own group first (20001, above any APIService's priority).
    ("apiregistration.k8s.io", 20001),
    ("apps", 17800),
    ("events.k8s.io", 17750),
    ("authentication.k8s.io", 17700),
    ("authorization.k8s.io", 17600),
    ("autoscaling", 17500),
    ("batch", 17400),
    ("certificates.k8s.io", 17300),
    ("networking.k8s.io", 17200),
    ("policy", 17100),
    ("rbac.authorization.k8s.io", 17000),
    ("storage.k8s.io", 16800),
    ("admissionregistration.k8s.io", 16700),
    ("apiextensions.k8s.io", 16700),
    ("scheduling.k8s.io", 16600),
    ("coordination.k8s.io", 16500),
    ("node.k8s.io", 16300),
    ("discovery.k8s.io", 16200),
    ("resource.k8s.io", 16200),
    ("flowcontrol.apiserver.k8s.io", 16100),
    // metrics-server's APIService.
    ("metrics.k8s.io", 100),
    ("extensions", 50),
];

/// Upstream's priorities of each group version kube-apiserver 1.33 serves (the aggregator's
/// `apiVersionPriorities`): the `groupPriorityMinimum` and `versionPriority` of the local
/// APIServices the server registers for itself. `metrics.k8s.io`, which Skiff serves itself,
/// has metrics-server's APIService priorities.
const API_VERSION_PRIORITIES: &[(&str, &str, i64, i64)] = &[
    ("", "v1", 18000, 1),
    ("apps", "v1", 17800, 15),
    ("apps", "v1beta2", 17800, 9),
    ("apps", "v1beta1", 17800, 1),
    ("events.k8s.io", "v1", 17750, 15),
    ("authentication.k8s.io", "v1", 17700, 15),
    ("authorization.k8s.io", "v1", 17600, 15),
    ("autoscaling", "v1", 17500, 15),
    ("autoscaling", "v2", 17500, 30),
    ("batch", "v1", 17400, 15),
    ("batch", "v1beta1", 17400, 9),
    ("certificates.k8s.io", "v1", 17300, 15),
    ("networking.k8s.io", "v1", 17200, 15),
    ("policy", "v1", 17100, 15),
    ("rbac.authorization.k8s.io", "v1", 17000, 15),
    ("storage.k8s.io", "v1", 16800, 15),
    ("apiextensions.k8s.io", "v1", 16700, 15),
    ("admissionregistration.k8s.io", "v1", 16700, 15),
    ("scheduling.k8s.io", "v1", 16600, 15),
    ("coordination.k8s.io", "v1", 16500, 15),
    ("node.k8s.io", "v1", 16300, 15),
    ("discovery.k8s.io", "v1", 16200, 15),
    ("flowcontrol.apiserver.k8s.io", "v1", 16100, 21),
    ("metrics.k8s.io", "v1beta1", 100, 100),
    // Served only with --serve-removed-apis, after every current group (upstream's 17900 put it
    // before apps, which made `kubectl get deployments` read the removed version).
    ("extensions", "v1beta1", 50, 1),
];

/// The `(groupPriorityMinimum, versionPriority)` of a built-in group version's APIService;
/// `None` for one upstream registers no APIService for.
pub fn api_version_priority(group: &str, version: &str) -> Option<(i64, i64)> {
    API_VERSION_PRIORITIES
        .iter()
        .find(|(g, v, _, _)| *g == group && *v == version)
        .map(|(_, _, gp, vp)| (*gp, *vp))
}

/// Every built-in group version served, core (`""`) first, each once.
pub fn builtin_group_versions() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&'static str, &'static str)> = Vec::new();
    for r in RESOURCES {
        if !out.contains(&(r.group, r.version)) {
            out.push((r.group, r.version));
        }
    }
    out
}

/// A group's priority; a group upstream does not list goes last.
fn group_priority(group: &str) -> u32 {
    GROUP_PRIORITIES
        .iter()
        .find(|(g, _)| *g == group)
        .map_or(0, |(_, p)| *p)
}

/// The named groups served, in upstream's discovery order: by priority, highest first, then
/// by name (the aggregator sorts its APIServices so). Groups of custom resources have no
/// priority of their own and follow the built-in ones, by name.
pub fn groups() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for r in all() {
        if !r.group.is_empty() && !out.contains(&r.group) {
            out.push(r.group);
        }
    }
    out.sort_by(|a, b| group_priority(b).cmp(&group_priority(a)).then(a.cmp(b)));
    out
}

/// The resources of CustomResourceDefinitions being served, one per served version: they
/// change at run time as definitions are created, changed and deleted.
static CUSTOM: std::sync::RwLock<Vec<&'static Resource>> = std::sync::RwLock::new(Vec::new());

/// Every resource served now: the built-in ones, the removed versions when served, then the
/// custom ones.
pub fn all() -> Vec<&'static Resource> {
    let mut out: Vec<&'static Resource> = RESOURCES.iter().chain(removed()).collect();
    out.extend(custom());
    out
}

/// The custom resources served now.
pub fn custom() -> Vec<&'static Resource> {
    match CUSTOM.read() {
        Ok(c) => c.clone(),
        Err(poisoned) => poisoned.into_inner().clone(),
    }
}

/// Whether `res` is a custom resource (served for a CustomResourceDefinition).
pub fn is_custom(res: &Resource) -> bool {
    // The built-in table's own entries (what handlers hold) are told apart by address alone.
    if RESOURCES.as_ptr_range().contains(&std::ptr::from_ref(res)) {
        return false;
    }
    !RESOURCES.iter().chain(REMOVED).any(|r| r == res)
}

/// Replace the custom resources served. Each is made `'static` once: the same description
/// registered again reuses its earlier copy, so definitions that come and go do not grow memory.
pub fn set_custom(resources: Vec<Resource>) {
    static INTERNED: std::sync::Mutex<Vec<&'static Resource>> = std::sync::Mutex::new(Vec::new());
    let mut interned = match INTERNED.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    let mut out = Vec::with_capacity(resources.len());
    for r in resources {
        let r = match interned.iter().find(|i| ***i == r) {
            Some(i) => *i,
            None => {
                let leaked: &'static Resource = Box::leak(Box::new(r));
                interned.push(leaked);
                leaked
            }
        };
        out.push(r);
    }
    drop(interned);
    match CUSTOM.write() {
        Ok(mut c) => *c = out,
        Err(p) => *p.into_inner() = out,
    }
}

/// A string made `'static`, each distinct value once (for [`Resource`]s built at run time).
pub fn intern(s: &str) -> &'static str {
    static STRINGS: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let mut strings = match STRINGS.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    if let Some(found) = strings.iter().find(|x| **x == s) {
        return found;
    }
    let leaked: &'static str = Box::leak(s.to_string().into_boxed_str());
    strings.push(leaked);
    leaked
}

/// A list of strings made `'static` (short names, categories, subresources).
pub fn intern_list(items: &[String]) -> &'static [&'static str] {
    static LISTS: std::sync::Mutex<Vec<&'static [&'static str]>> = std::sync::Mutex::new(Vec::new());
    let items: Vec<&'static str> = items.iter().map(|s| intern(s)).collect();
    let mut lists = match LISTS.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    if let Some(found) = lists.iter().find(|x| **x == items.as_slice()) {
        return found;
    }
    let leaked: &'static [&'static str] = Box::leak(items.into_boxed_slice());
    lists.push(leaked);
    leaked
}

/// The resource with this group, version and plural.
pub fn lookup(group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
    RESOURCES
        .iter()
        .chain(removed())
        .find(|r| r.group == group && r.version == version && r.plural == plural)
        .or_else(|| {
            custom()
                .into_iter()
                .find(|r| r.group == group && r.version == version && r.plural == plural)
        })
}

/// The resource of this kind in this group.
pub fn lookup_kind(group: &str, kind: &str) -> Option<&'static Resource> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.kind == kind)
        .or_else(|| custom().into_iter().find(|r| r.group == group && r.kind == kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups() {
        let d = lookup("apps", "v1", "deployments").expect("deployments");
        assert_eq!(d.kind, "Deployment");
        assert_eq!(d.api_version(), "apps/v1");
        assert_eq!(d.qualified_plural(), "deployments.apps");
        assert!(lookup("", "v1", "nope").is_none());
        assert_eq!(lookup_kind("", "Pod").map(|r| r.plural), Some("pods"));
        assert!(groups().contains(&"batch"));
    }

    #[test]
    fn custom_resources_join_and_leave_the_registry() {
        let pods = lookup("", "v1", "pods").expect("pods");
        assert!(!is_custom(pods));
        let copy = *pods;
        assert!(!is_custom(&copy));
        let widget = Resource {
            group: "example.com",
            version: "v1",
            kind: "Widget",
            plural: "widgets",
            singular: "widget",
            namespaced: true,
            short_names: &["wd"],
            categories: &[],
            subresources: &["status"],
        };
        set_custom(vec![widget]);
        let found = lookup("example.com", "v1", "widgets").expect("served");
        assert!(is_custom(found));
        assert_eq!(lookup_kind("example.com", "Widget").map(|r| r.plural), Some("widgets"));
        assert!(groups().contains(&"example.com"));
        // Registered again, the same description is the same static copy.
        set_custom(vec![widget]);
        assert!(std::ptr::eq(
            found,
            lookup("example.com", "v1", "widgets").expect("served")
        ));
        set_custom(Vec::new());
        assert!(lookup("example.com", "v1", "widgets").is_none());
        assert_eq!(
            intern_list(&["a".to_string()]).as_ptr(),
            intern_list(&["a".to_string()]).as_ptr()
        );
    }

    #[test]
    fn groups_in_upstream_order() {
        // As kube-apiserver 1.33 lists them under /apis (less the groups Skiff does not serve), with
        // metrics-server's group last.
        assert_eq!(
            groups(),
            [
                "apiregistration.k8s.io",
                "apps",
                "events.k8s.io",
                "authentication.k8s.io",
                "authorization.k8s.io",
                "autoscaling",
                "batch",
                "certificates.k8s.io",
                "networking.k8s.io",
                "policy",
                "rbac.authorization.k8s.io",
                "storage.k8s.io",
                "admissionregistration.k8s.io",
                "apiextensions.k8s.io",
                "scheduling.k8s.io",
                "coordination.k8s.io",
                "node.k8s.io",
                "discovery.k8s.io",
                "flowcontrol.apiserver.k8s.io",
                "metrics.k8s.io",
            ]
        );
    }

    #[test]
    fn rbac_and_review_resources() {
        for (plural, kind, namespaced) in [
            ("roles", "Role", true),
            ("rolebindings", "RoleBinding", true),
            ("clusterroles", "ClusterRole", false),
            ("clusterrolebindings", "ClusterRoleBinding", false),
        ] {
            let r = lookup("rbac.authorization.k8s.io", "v1", plural).expect(plural);
            assert_eq!((r.kind, r.namespaced), (kind, namespaced));
            assert!(r.short_names.is_empty() && r.categories.is_empty());
            assert!(!r.is_create_only());
        }
        for (group, plural, namespaced) in [
            ("authorization.k8s.io", "subjectaccessreviews", false),
            ("authorization.k8s.io", "selfsubjectaccessreviews", false),
            ("authorization.k8s.io", "selfsubjectrulesreviews", false),
            ("authorization.k8s.io", "localsubjectaccessreviews", true),
            ("authentication.k8s.io", "tokenreviews", false),
            ("authentication.k8s.io", "selfsubjectreviews", false),
            ("", "bindings", true),
        ] {
            let r = lookup(group, "v1", plural).expect(plural);
            assert_eq!(r.namespaced, namespaced, "{plural}");
            assert!(r.is_create_only(), "{plural}");
        }
        assert!(!lookup("", "v1", "pods").expect("pods").is_create_only());
    }
}
