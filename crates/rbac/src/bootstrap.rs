//! The default roles and bindings every cluster starts with, as upstream's `bootstrappolicy`
//! (Kubernetes 1.33 with its feature gates at their defaults), the start-up reconciliation that
//! brings stored copies of them up to date (`pkg/registry/rbac/reconciliation`), and the
//! coverage check of one rule set by another it rests on (`validation.Covers`, see [`covers`]).
//!
//! Every object is a `serde_json::Value` in the form the API serves (`rbac.authorization.k8s.io/v1`),
//! without `uid`, `resourceVersion` or `creationTimestamp`: the caller adds those when it stores
//! them. As upstream's rule builder does, each rule's verbs, groups, resources, names and URLs are
//! sorted, while the rules themselves keep upstream's order. The aggregated `admin`, `edit` and
//! `view` carry `"rules": null`, as upstream creates them; the aggregation controller fills them.
//! The policy tables are laid out by hand (`rustfmt::skip`) so that a rule reads as one line.
//!
//! Parts of upstream's policy that its 1.33 defaults switch off are left out: the rules and roles
//! behind `DynamicResourceAllocation`, `ClusterTrustBundle`,
//! `KubeletServiceAccountTokenForCredentialProviders`, `VolumeAttributesClass`,
//! `StorageVersionAPI` and `StorageVersionMigrator`.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

/// The `apiVersion` of every object here.
pub const API_VERSION: &str = "rbac.authorization.k8s.io/v1";
/// The annotation by which a stored object opts out of reconciliation (value `"false"`).
pub const AUTO_UPDATE_ANNOTATION: &str = "rbac.authorization.kubernetes.io/autoupdate";
/// The label every bootstrap object carries, with the value [`BOOTSTRAPPING_VALUE`].
pub const BOOTSTRAPPING_LABEL: &str = "kubernetes.io/bootstrapping";
/// The value of [`BOOTSTRAPPING_LABEL`].
pub const BOOTSTRAPPING_VALUE: &str = "rbac-defaults";
/// The prefix of the roles (and name suffix of the kube-system service accounts) of controllers.
pub const CONTROLLER_PREFIX: &str = "system:controller:";

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["create", "update", "patch", "delete", "deletecollection"];
const READ_WRITE: &[&str] = &[
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
];
const READ_UPDATE: &[&str] = &["get", "list", "watch", "update", "patch"];

const CORE: &str = "";
const APPS: &str = "apps";
const AUTHN: &str = "authentication.k8s.io";
const AUTHZ: &str = "authorization.k8s.io";
const AUTOSCALING: &str = "autoscaling";
const BATCH: &str = "batch";
const CERTIFICATES: &str = "certificates.k8s.io";
const COORDINATION: &str = "coordination.k8s.io";
const DISCOVERY: &str = "discovery.k8s.io";
const EXTENSIONS: &str = "extensions";
const POLICY: &str = "policy";
const STORAGE: &str = "storage.k8s.io";
const NETWORKING: &str = "networking.k8s.io";
const EVENTS: &str = "events.k8s.io";
const ADMISSION: &str = "admissionregistration.k8s.io";

const LEGACY_UNKNOWN_SIGNER: &str = "kubernetes.io/legacy-unknown";
const KUBELET_SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
const APISERVER_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client";
const APISERVER_CLIENT_KUBELET_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";

const AGGREGATE_TO_ADMIN: &str = "rbac.authorization.k8s.io/aggregate-to-admin";
const AGGREGATE_TO_EDIT: &str = "rbac.authorization.k8s.io/aggregate-to-edit";
const AGGREGATE_TO_VIEW: &str = "rbac.authorization.k8s.io/aggregate-to-view";

const KUBE_SYSTEM: &str = "kube-system";
const KUBE_PUBLIC: &str = "kube-public";

/// A policy rule under construction: `rule().verbs(&["get"]).groups(&[""]).resources(&["pods"])`.
#[derive(Debug, Clone, Default)]
pub struct Rule {
    verbs: Vec<String>,
    groups: Vec<String>,
    resources: Vec<String>,
    names: Vec<String>,
    urls: Vec<String>,
}

/// Starts a [`Rule`].
pub fn rule() -> Rule {
    Rule::default()
}

fn extend(list: &mut Vec<String>, items: &[&str]) {
    list.extend(items.iter().map(|s| s.to_string()));
}

impl Rule {
    /// Adds verbs.
    pub fn verbs(mut self, verbs: &[&str]) -> Self {
        extend(&mut self.verbs, verbs);
        self
    }
    /// Adds API groups (`""` is the core group).
    pub fn groups(mut self, groups: &[&str]) -> Self {
        extend(&mut self.groups, groups);
        self
    }
    /// Adds resources (`pods`, `pods/status`, `*/scale`, `*`).
    pub fn resources(mut self, resources: &[&str]) -> Self {
        extend(&mut self.resources, resources);
        self
    }
    /// Adds resource names.
    pub fn names(mut self, names: &[&str]) -> Self {
        extend(&mut self.names, names);
        self
    }
    /// Adds non-resource URLs.
    pub fn urls(mut self, urls: &[&str]) -> Self {
        extend(&mut self.urls, urls);
        self
    }
    /// The rule as the API serves it: every list sorted, empty lists other than `verbs` omitted.
    pub fn build(self) -> Value {
        let fields = [
            ("verbs", self.verbs),
            ("apiGroups", self.groups),
            ("resources", self.resources),
            ("resourceNames", self.names),
            ("nonResourceURLs", self.urls),
        ];
        let mut out = Map::new();
        for (key, mut list) in fields {
            if list.is_empty() && key != "verbs" {
                continue;
            }
            list.sort();
            out.insert(key.to_string(), json!(list));
        }
        Value::Object(out)
    }
}

/// Upstream's `eventsRule`: recording events in both event groups.
fn events() -> Rule {
    rule()
        .verbs(&["create", "update", "patch"])
        .groups(&[CORE, EVENTS])
        .resources(&["events"])
}

fn core(verbs: &[&str], resources: &[&str]) -> Rule {
    rule().verbs(verbs).groups(&[CORE]).resources(resources)
}

fn metadata(name: &str, namespace: Option<&str>, labels: &[(&str, &str)]) -> Value {
    let mut all: BTreeMap<&str, &str> = labels.iter().copied().collect();
    all.insert(BOOTSTRAPPING_LABEL, BOOTSTRAPPING_VALUE);
    let mut meta = Map::new();
    meta.insert("name".into(), json!(name));
    if let Some(namespace) = namespace {
        meta.insert("namespace".into(), json!(namespace));
    }
    meta.insert("labels".into(), json!(all));
    meta.insert("annotations".into(), json!({ AUTO_UPDATE_ANNOTATION: "true" }));
    Value::Object(meta)
}

fn role_object(kind: &str, name: &str, namespace: Option<&str>, labels: &[(&str, &str)], rules: Vec<Rule>) -> Value {
    json!({
        "apiVersion": API_VERSION,
        "kind": kind,
        "metadata": metadata(name, namespace, labels),
        "rules": rules.into_iter().map(Rule::build).collect::<Vec<_>>(),
    })
}

fn cluster_role(name: &str, rules: Vec<Rule>) -> Value {
    role_object("ClusterRole", name, None, &[], rules)
}

/// A role whose rules the aggregation controller writes from the roles labelled `aggregate_from`;
/// upstream creates it with `rules: null`.
fn aggregated_role(name: &str, labels: &[(&str, &str)], aggregate_from: &str) -> Value {
    let mut role = role_object("ClusterRole", name, None, labels, vec![]);
    role["rules"] = Value::Null;
    role["aggregationRule"] = json!({ "clusterRoleSelectors": [{ "matchLabels": { aggregate_from: "true" } }] });
    role
}

/// A role whose rules the roles aggregated by `label` take in.
fn aggregated_into(name: &str, label: &str, rules: Vec<Rule>) -> Value {
    role_object("ClusterRole", name, None, &[(label, "true")], rules)
}

/// The subject of a binding.
#[derive(Debug, Clone, Copy)]
enum Subject {
    User(&'static str),
    Group(&'static str),
    ServiceAccount(&'static str, &'static str),
}

impl Subject {
    fn to_json(self) -> Value {
        match self {
            Subject::User(name) => json!({ "kind": "User", "apiGroup": RBAC_GROUP, "name": name }),
            Subject::Group(name) => json!({ "kind": "Group", "apiGroup": RBAC_GROUP, "name": name }),
            Subject::ServiceAccount(namespace, name) => {
                json!({ "kind": "ServiceAccount", "name": name, "namespace": namespace })
            }
        }
    }
}

use Subject::{Group, ServiceAccount as Sa, User};

fn binding(
    kind: &str,
    name: &str,
    namespace: Option<&str>,
    role_kind: &str,
    role: &str,
    subjects: &[Subject],
) -> Value {
    let mut out = json!({
        "apiVersion": API_VERSION,
        "kind": kind,
        "metadata": metadata(name, namespace, &[]),
        "roleRef": { "apiGroup": RBAC_GROUP, "kind": role_kind, "name": role },
    });
    if !subjects.is_empty() {
        out["subjects"] = subjects.iter().map(|s| s.to_json()).collect();
    }
    out
}

fn cluster_binding(role: &str, subjects: &[Subject]) -> Value {
    binding("ClusterRoleBinding", role, None, "ClusterRole", role, subjects)
}

/// The rules of `system:node` (upstream's `NodeRules`).
#[rustfmt::skip]
fn node_rules() -> Vec<Rule> {
    vec![
        // Checking API access; these creates do not mutate anything.
        rule().verbs(&["create"]).groups(&[AUTHN]).resources(&["tokenreviews"]),
        rule().verbs(&["create"]).groups(&[AUTHZ]).resources(&["subjectaccessreviews", "localsubjectaccessreviews"]),
        // Service environment variables.
        core(READ, &["services"]),
        // Registering and reporting on its own Node (limited by NodeRestriction).
        core(&["create", "get", "list", "watch"], &["nodes"]),
        core(&["update", "patch"], &["nodes/status"]),
        core(&["update", "patch"], &["nodes"]),
        core(&["create", "update", "patch"], &["events"]),
        core(READ, &["pods"]),
        // Mirror pods, pod status and evictions of its own pods.
        core(&["create", "delete"], &["pods"]),
        core(&["update", "patch"], &["pods/status"]),
        core(&["create"], &["pods/eviction"]),
        // Volumes and environment of its pods (limited by the Node authorizer).
        core(&["get", "list", "watch"], &["secrets", "configmaps"]),
        core(&["get"], &["persistentvolumeclaims", "persistentvolumes"]),
        core(&["get"], &["endpoints"]),
        // Rotating its own client certificate.
        rule().verbs(&["create", "get", "list", "watch"]).groups(&[CERTIFICATES])
            .resources(&["certificatesigningrequests"]),
        rule().verbs(&["get", "create", "update", "patch", "delete"]).groups(&[COORDINATION]).resources(&["leases"]),
        rule().verbs(&["get"]).groups(&[STORAGE]).resources(&["volumeattachments"]),
        core(&["create"], &["serviceaccounts/token"]),
        core(&["get", "update", "patch"], &["persistentvolumeclaims/status"]),
        rule().verbs(&["get", "watch", "list"]).groups(&[STORAGE]).resources(&["csidrivers"]),
        rule().verbs(&["get", "create", "update", "patch", "delete"]).groups(&[STORAGE]).resources(&["csinodes"]),
        rule().verbs(&["get", "list", "watch"]).groups(&["node.k8s.io"]).resources(&["runtimeclasses"]),
    ]
}

/// The rules `edit` (and so `admin`) aggregate from `system:aggregate-to-edit`.
#[rustfmt::skip]
fn aggregate_to_edit_rules() -> Vec<Rule> {
    vec![
        // Read access to escalating resources.
        core(READ, &["pods/attach", "pods/proxy", "pods/exec", "pods/portforward", "secrets", "services/proxy"]),
        core(&["impersonate"], &["serviceaccounts"]),
        core(WRITE, &["pods", "pods/attach", "pods/proxy", "pods/exec", "pods/portforward"]),
        core(&["create"], &["pods/eviction"]),
        core(
            WRITE,
            &[
                "replicationcontrollers",
                "replicationcontrollers/scale",
                "serviceaccounts",
                "services",
                "services/proxy",
                "persistentvolumeclaims",
                "configmaps",
                "secrets",
                "events",
            ],
        ),
        core(&["create"], &["serviceaccounts/token"]),
        rule().verbs(WRITE).groups(&[APPS]).resources(&[
            "statefulsets",
            "statefulsets/scale",
            "daemonsets",
            "deployments",
            "deployments/scale",
            "deployments/rollback",
            "replicasets",
            "replicasets/scale",
        ]),
        rule().verbs(WRITE).groups(&[AUTOSCALING]).resources(&["horizontalpodautoscalers"]),
        rule().verbs(WRITE).groups(&[BATCH]).resources(&["jobs", "cronjobs"]),
        rule().verbs(WRITE).groups(&[EXTENSIONS]).resources(&[
            "daemonsets",
            "deployments",
            "deployments/scale",
            "deployments/rollback",
            "ingresses",
            "replicasets",
            "replicasets/scale",
            "replicationcontrollers/scale",
            "networkpolicies",
        ]),
        rule().verbs(WRITE).groups(&[POLICY]).resources(&["poddisruptionbudgets"]),
        rule().verbs(WRITE).groups(&[NETWORKING]).resources(&["networkpolicies", "ingresses"]),
        rule().verbs(READ_WRITE).groups(&[COORDINATION]).resources(&["leases"]),
    ]
}

/// The rules `view` (and so `edit` and `admin`) aggregate from `system:aggregate-to-view`.
#[rustfmt::skip]
fn aggregate_to_view_rules() -> Vec<Rule> {
    vec![
        core(
            READ,
            &[
                "pods",
                "replicationcontrollers",
                "replicationcontrollers/scale",
                "serviceaccounts",
                "services",
                "services/status",
                "endpoints",
                "persistentvolumeclaims",
                "persistentvolumeclaims/status",
                "configmaps",
            ],
        ),
        core(
            READ,
            &[
                "limitranges",
                "resourcequotas",
                "bindings",
                "events",
                "pods/status",
                "resourcequotas/status",
                "namespaces/status",
                "replicationcontrollers/status",
                "pods/log",
            ],
        ),
        // Reading namespaces at namespace scope reads only that namespace.
        core(READ, &["namespaces"]),
        rule().verbs(READ).groups(&[DISCOVERY]).resources(&["endpointslices"]),
        rule().verbs(READ).groups(&[APPS]).resources(&[
            "controllerrevisions",
            "statefulsets",
            "statefulsets/status",
            "statefulsets/scale",
            "daemonsets",
            "daemonsets/status",
            "deployments",
            "deployments/status",
            "deployments/scale",
            "replicasets",
            "replicasets/status",
            "replicasets/scale",
        ]),
        rule().verbs(READ).groups(&[AUTOSCALING])
            .resources(&["horizontalpodautoscalers", "horizontalpodautoscalers/status"]),
        rule().verbs(READ).groups(&[BATCH]).resources(&["jobs", "cronjobs", "cronjobs/status", "jobs/status"]),
        rule().verbs(READ).groups(&[EXTENSIONS]).resources(&[
            "daemonsets",
            "daemonsets/status",
            "deployments",
            "deployments/scale",
            "deployments/status",
            "ingresses",
            "ingresses/status",
            "replicasets",
            "replicasets/scale",
            "replicasets/status",
            "replicationcontrollers/scale",
            "networkpolicies",
        ]),
        rule().verbs(READ).groups(&[POLICY]).resources(&["poddisruptionbudgets", "poddisruptionbudgets/status"]),
        rule().verbs(READ).groups(&[NETWORKING]).resources(&["networkpolicies", "ingresses", "ingresses/status"]),
    ]
}

#[rustfmt::skip]
fn kube_scheduler_rules() -> Vec<Rule> {
    vec![
        events(),
        // Leader election.
        rule().verbs(&["create"]).groups(&[COORDINATION]).resources(&["leases"]),
        rule().verbs(&["get", "update", "list", "watch"]).groups(&[COORDINATION]).resources(&["leases"])
            .names(&["kube-scheduler"]),
        rule().verbs(READ_WRITE).groups(&[COORDINATION]).resources(&["leasecandidates"]),
        // Fundamental resources.
        core(READ, &["nodes"]),
        core(&["get", "list", "watch", "delete"], &["pods"]),
        core(&["create"], &["pods/binding", "bindings"]),
        core(&["patch", "update"], &["pods/status"]),
        // What selects pods.
        core(READ, &["services", "replicationcontrollers"]),
        rule().verbs(READ).groups(&[APPS, EXTENSIONS]).resources(&["replicasets"]),
        rule().verbs(READ).groups(&[APPS]).resources(&["statefulsets"]),
        // What pods use or what applies to them.
        rule().verbs(READ).groups(&[POLICY]).resources(&["poddisruptionbudgets"]),
        core(READ, &["persistentvolumeclaims", "persistentvolumes"]),
        rule().verbs(&["create"]).groups(&[AUTHN]).resources(&["tokenreviews"]),
        rule().verbs(&["create"]).groups(&[AUTHZ]).resources(&["subjectaccessreviews"]),
        // Volume limits.
        rule().verbs(READ).groups(&[STORAGE]).resources(&["csinodes"]),
        rule().verbs(&["get", "list", "watch"]).groups(&[STORAGE]).resources(&["volumeattachments"]),
        // namespaceSelector of pod affinity.
        core(READ, &["namespaces"]),
        rule().verbs(READ).groups(&[STORAGE]).resources(&["csidrivers"]),
        rule().verbs(READ).groups(&[STORAGE]).resources(&["csistoragecapacities"]),
    ]
}

fn approver(name: &str, signer: &str) -> Value {
    cluster_role(
        name,
        vec![
            rule()
                .verbs(&["approve"])
                .groups(&[CERTIFICATES])
                .resources(&["signers"])
                .names(&[signer]),
        ],
    )
}

/// The cluster roles of upstream's `policy.go`, in its order.
#[rustfmt::skip]
fn policy_cluster_roles() -> Vec<Value> {
    vec![
        // A "root" role which can do absolutely anything.
        cluster_role(
            "cluster-admin",
            vec![rule().verbs(&["*"]).groups(&["*"]).resources(&["*"]), rule().verbs(&["*"]).urls(&["*"])],
        ),
        // Just enough to tell whether the server is ready and to discover API versions.
        cluster_role(
            "system:discovery",
            vec![rule().verbs(&["get"]).urls(&[
                "/livez", "/readyz", "/healthz", "/version", "/version/", "/openapi", "/openapi/*", "/api", "/api/*",
                "/apis", "/apis/*",
            ])],
        ),
        // The monitoring endpoints, the individual health checks included.
        cluster_role(
            "system:monitoring",
            vec![rule().verbs(&["get"]).urls(&[
                "/metrics", "/metrics/slis", "/livez", "/readyz", "/healthz", "/livez/*", "/readyz/*", "/healthz/*",
            ])],
        ),
        // What a user needs to learn about themselves.
        cluster_role(
            "system:basic-user",
            vec![
                rule().verbs(&["create"]).groups(&[AUTHZ])
                    .resources(&["selfsubjectaccessreviews", "selfsubjectrulesreviews"]),
                rule().verbs(&["create"]).groups(&[AUTHN]).resources(&["selfsubjectreviews"]),
            ],
        ),
        // Insensitive cluster information.
        cluster_role(
            "system:public-info-viewer",
            vec![rule().verbs(&["get"]).urls(&["/livez", "/readyz", "/healthz", "/version", "/version/"])],
        ),
        aggregated_role("admin", &[], AGGREGATE_TO_ADMIN),
        aggregated_role("edit", &[(AGGREGATE_TO_ADMIN, "true")], AGGREGATE_TO_EDIT),
        aggregated_role("view", &[(AGGREGATE_TO_EDIT, "true")], AGGREGATE_TO_VIEW),
        aggregated_into(
            "system:aggregate-to-admin",
            AGGREGATE_TO_ADMIN,
            vec![
                rule().verbs(&["create"]).groups(&[AUTHZ]).resources(&["localsubjectaccessreviews"]),
                rule().verbs(READ_WRITE).groups(&[RBAC_GROUP]).resources(&["roles", "rolebindings"]),
            ],
        ),
        aggregated_into("system:aggregate-to-edit", AGGREGATE_TO_EDIT, aggregate_to_edit_rules()),
        aggregated_into("system:aggregate-to-view", AGGREGATE_TO_VIEW, aggregate_to_view_rules()),
        cluster_role(
            "system:heapster",
            vec![
                core(READ, &["events", "pods", "nodes", "namespaces"]),
                rule().verbs(READ).groups(&[EXTENSIONS]).resources(&["deployments"]),
            ],
        ),
        cluster_role("system:node", node_rules()),
        // Not bound by default: where node-problem-detector runs varies.
        cluster_role(
            "system:node-problem-detector",
            vec![core(&["get"], &["nodes"]), core(&["patch"], &["nodes/status"]), events()],
        ),
        cluster_role(
            "system:node-bootstrapper",
            vec![
                rule().verbs(&["create", "get", "list", "watch"]).groups(&[CERTIFICATES])
                    .resources(&["certificatesigningrequests"]),
            ],
        ),
        cluster_role(
            "system:auth-delegator",
            vec![
                rule().verbs(&["create"]).groups(&[AUTHN]).resources(&["tokenreviews"]),
                rule().verbs(&["create"]).groups(&[AUTHZ]).resources(&["subjectaccessreviews"]),
            ],
        ),
        cluster_role("system:kube-aggregator", vec![core(READ, &["services", "endpoints"])]),
        cluster_role(
            "system:kube-controller-manager",
            vec![
                events(),
                rule().verbs(&["create"]).groups(&[COORDINATION]).resources(&["leases"]),
                rule().verbs(&["get", "update"]).groups(&[COORDINATION]).resources(&["leases"])
                    .names(&["kube-controller-manager"]),
                core(&["create"], &["secrets", "serviceaccounts"]),
                core(&["delete"], &["secrets"]),
                core(&["get"], &["namespaces", "secrets", "serviceaccounts", "configmaps"]),
                core(&["update"], &["secrets", "serviceaccounts"]),
                rule().verbs(&["create"]).groups(&[AUTHN]).resources(&["tokenreviews"]),
                rule().verbs(&["create"]).groups(&[AUTHZ]).resources(&["subjectaccessreviews"]),
                // Every shared informer.
                rule().verbs(&["list", "watch"]).groups(&["*"]).resources(&["*"]),
                core(&["create"], &["serviceaccounts/token"]),
            ],
        ),
        cluster_role("system:kube-dns", vec![core(&["list", "watch"], &["endpoints", "services"])]),
        cluster_role(
            "system:persistent-volume-provisioner",
            vec![
                core(&["get", "list", "watch", "create", "delete"], &["persistentvolumes"]),
                core(&["get", "list", "watch", "update"], &["persistentvolumeclaims"]),
                rule().verbs(READ).groups(&[STORAGE]).resources(&["storageclasses"]),
                core(&["watch"], &["events"]),
                events(),
            ],
        ),
        cluster_role(
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            vec![rule().verbs(&["create"]).groups(&[CERTIFICATES])
                .resources(&["certificatesigningrequests/nodeclient"])],
        ),
        cluster_role(
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            vec![rule().verbs(&["create"]).groups(&[CERTIFICATES])
                .resources(&["certificatesigningrequests/selfnodeclient"])],
        ),
        cluster_role(
            "system:volume-scheduler",
            vec![
                core(READ_UPDATE, &["persistentvolumes"]),
                rule().verbs(READ).groups(&[STORAGE]).resources(&["storageclasses"]),
                core(READ_UPDATE, &["persistentvolumeclaims"]),
            ],
        ),
        approver("system:certificates.k8s.io:legacy-unknown-approver", LEGACY_UNKNOWN_SIGNER),
        approver("system:certificates.k8s.io:kubelet-serving-approver", KUBELET_SERVING_SIGNER),
        approver("system:certificates.k8s.io:kube-apiserver-client-approver", APISERVER_CLIENT_SIGNER),
        approver("system:certificates.k8s.io:kube-apiserver-client-kubelet-approver", APISERVER_CLIENT_KUBELET_SIGNER),
        // The service account issuer's discovery documents, with and without a trailing slash.
        cluster_role(
            "system:service-account-issuer-discovery",
            vec![rule().verbs(&["get"]).urls(&[
                "/.well-known/openid-configuration",
                "/.well-known/openid-configuration/",
                "/openid/v1/jwks",
                "/openid/v1/jwks/",
            ])],
        ),
        // Full access to the kubelet API; the last rule is KubeletFineGrainedAuthz's (beta, on).
        cluster_role(
            "system:kubelet-api-admin",
            vec![
                core(&["get", "list", "watch"], &["nodes"]),
                core(&["proxy"], &["nodes"]),
                core(&["*"], &["nodes/proxy", "nodes/metrics", "nodes/stats", "nodes/log"]),
                core(&["*"], &["nodes/pods", "nodes/healthz", "nodes/configz"]),
            ],
        ),
        // kube-proxy; the servicecidrs rule is MultiCIDRServiceAllocator's (GA).
        cluster_role(
            "system:node-proxier",
            vec![
                core(&["list", "watch"], &["services", "endpoints"]),
                core(&["get", "list", "watch"], &["nodes"]),
                events(),
                rule().verbs(&["list", "watch"]).groups(&[NETWORKING]).resources(&["servicecidrs"]),
                rule().verbs(&["list", "watch"]).groups(&[DISCOVERY]).resources(&["endpointslices"]),
            ],
        ),
        cluster_role("system:kube-scheduler", kube_scheduler_rules()),
    ]
}

/// The controller roles of upstream's `controller_policy.go`, in its order, as `(name suffix, rules)`.
#[rustfmt::skip]
fn controller_rules() -> Vec<(&'static str, Vec<Rule>)> {
    let ext_apps = &[EXTENSIONS, APPS];
    let apps_ext = &[APPS, EXTENSIONS];
    vec![
        (
            "attachdetach-controller",
            vec![
                core(&["list", "watch"], &["persistentvolumes", "persistentvolumeclaims"]),
                core(&["get", "list", "watch"], &["nodes"]),
                core(&["patch", "update"], &["nodes/status"]),
                core(&["list", "watch"], &["pods"]),
                events(),
                rule().verbs(&["get", "create", "delete", "list", "watch"]).groups(&[STORAGE])
                    .resources(&["volumeattachments"]),
                rule().verbs(&["get", "watch", "list"]).groups(&[STORAGE]).resources(&["csidrivers"]),
                rule().verbs(&["get", "watch", "list"]).groups(&[STORAGE]).resources(&["csinodes"]),
            ],
        ),
        (
            // Full power over cluster roles, to rewrite aggregated ones in any way.
            "clusterrole-aggregation-controller",
            vec![
                rule()
                    .verbs(&["escalate", "get", "list", "watch", "update", "patch"])
                    .groups(&[RBAC_GROUP])
                    .resources(&["clusterroles"]),
            ],
        ),
        (
            "cronjob-controller",
            vec![
                rule().verbs(&["get", "list", "watch", "update"]).groups(&[BATCH]).resources(&["cronjobs"]),
                rule()
                    .verbs(&["get", "list", "watch", "create", "update", "delete", "patch"])
                    .groups(&[BATCH])
                    .resources(&["jobs"]),
                rule().verbs(&["update"]).groups(&[BATCH]).resources(&["cronjobs/status"]),
                rule().verbs(&["update"]).groups(&[BATCH]).resources(&["cronjobs/finalizers"]),
                core(&["list", "delete"], &["pods"]),
                events(),
            ],
        ),
        (
            "daemon-set-controller",
            vec![
                rule().verbs(READ).groups(ext_apps).resources(&["daemonsets"]),
                rule().verbs(&["update"]).groups(ext_apps).resources(&["daemonsets/status"]),
                rule().verbs(&["update"]).groups(ext_apps).resources(&["daemonsets/finalizers"]),
                core(&["list", "watch"], &["nodes"]),
                core(&["list", "watch", "create", "delete", "patch"], &["pods"]),
                core(&["create"], &["pods/binding"]),
                rule()
                    .verbs(&["get", "list", "watch", "create", "delete", "update", "patch"])
                    .groups(&[APPS])
                    .resources(&["controllerrevisions"]),
                events(),
            ],
        ),
        (
            "deployment-controller",
            vec![
                rule().verbs(&["get", "list", "watch", "update"]).groups(ext_apps).resources(&["deployments"]),
                rule().verbs(&["update"]).groups(ext_apps).resources(&["deployments/status"]),
                rule().verbs(&["update"]).groups(ext_apps).resources(&["deployments/finalizers"]),
                rule()
                    .verbs(&["get", "list", "watch", "create", "update", "patch", "delete"])
                    .groups(apps_ext)
                    .resources(&["replicasets"]),
                core(&["get", "list", "watch", "update"], &["pods"]),
                events(),
            ],
        ),
        (
            "disruption-controller",
            vec![
                rule().verbs(READ).groups(ext_apps).resources(&["deployments"]),
                rule().verbs(READ).groups(apps_ext).resources(&["replicasets"]),
                core(READ, &["replicationcontrollers"]),
                rule().verbs(READ).groups(&[POLICY]).resources(&["poddisruptionbudgets"]),
                rule().verbs(READ).groups(&[APPS]).resources(&["statefulsets"]),
                rule().verbs(&["update"]).groups(&[POLICY]).resources(&["poddisruptionbudgets/status"]),
                core(&["patch", "update"], &["pods/status"]),
                rule().verbs(&["get"]).groups(&["*"]).resources(&["*/scale"]),
                events(),
            ],
        ),
        (
            "endpoint-controller",
            vec![
                core(READ, &["services", "pods"]),
                core(&["get", "list", "create", "update", "delete"], &["endpoints"]),
                core(&["create"], &["endpoints/restricted"]),
                events(),
            ],
        ),
        (
            "endpointslice-controller",
            vec![
                core(READ, &["services", "pods", "nodes"]),
                // Owning an EndpointSlice with blockOwnerDeletion needs the service's finalizers.
                core(&["update"], &["services/finalizers"]),
                rule()
                    .verbs(&["get", "list", "create", "update", "delete"])
                    .groups(&[DISCOVERY])
                    .resources(&["endpointslices"]),
                events(),
            ],
        ),
        (
            "endpointslicemirroring-controller",
            vec![
                core(READ, &["services", "endpoints"]),
                core(&["update"], &["services/finalizers"]),
                core(&["update"], &["endpoints/finalizers"]),
                rule()
                    .verbs(&["get", "list", "create", "update", "delete"])
                    .groups(&[DISCOVERY])
                    .resources(&["endpointslices"]),
                events(),
            ],
        ),
        (
            "expand-controller",
            vec![
                core(&["get", "list", "watch", "update", "patch"], &["persistentvolumes"]),
                core(&["update", "patch"], &["persistentvolumeclaims/status"]),
                core(READ, &["persistentvolumeclaims"]),
                events(),
                core(&["get"], &["services"]),
            ],
        ),
        (
            "ephemeral-volume-controller",
            vec![
                core(READ, &["pods"]),
                core(&["update"], &["pods/finalizers"]),
                core(&["get", "list", "watch", "create"], &["persistentvolumeclaims"]),
                events(),
            ],
        ),
        (
            // Lists, watches, selective gets and updates of any resource.
            "generic-garbage-collector",
            vec![rule().verbs(&["get", "list", "watch", "patch", "update", "delete"]).groups(&["*"])
                .resources(&["*"]), events()],
        ),
        (
            "horizontal-pod-autoscaler",
            vec![
                rule().verbs(READ).groups(&[AUTOSCALING]).resources(&["horizontalpodautoscalers"]),
                rule().verbs(&["update"]).groups(&[AUTOSCALING]).resources(&["horizontalpodautoscalers/status"]),
                rule().verbs(&["get", "update"]).groups(&["*"]).resources(&["*/scale"]),
                core(&["list"], &["pods"]),
                // Resource, custom and external metrics.
                rule().verbs(&["list"]).groups(&["metrics.k8s.io"]).resources(&["pods"]),
                rule().verbs(&["get", "list"]).groups(&["custom.metrics.k8s.io"]).resources(&["*"]),
                rule().verbs(&["get", "list"]).groups(&["external.metrics.k8s.io"]).resources(&["*"]),
                events(),
            ],
        ),
        (
            "job-controller",
            vec![
                rule().verbs(&["get", "list", "watch", "update", "patch"]).groups(&[BATCH]).resources(&["jobs"]),
                rule().verbs(&["update"]).groups(&[BATCH]).resources(&["jobs/status"]),
                rule().verbs(&["update"]).groups(&[BATCH]).resources(&["jobs/finalizers"]),
                core(&["list", "watch", "create", "delete", "patch"], &["pods"]),
                events(),
            ],
        ),
        (
            "namespace-controller",
            vec![
                core(&["get", "list", "watch", "delete"], &["namespaces"]),
                core(&["update"], &["namespaces/finalize", "namespaces/status"]),
                rule().verbs(&["get", "list", "delete", "deletecollection"]).groups(&["*"]).resources(&["*"]),
            ],
        ),
        (
            "node-controller",
            vec![
                core(&["get", "list", "update", "delete", "patch"], &["nodes"]),
                core(&["patch", "update"], &["nodes/status"]),
                // Deleting pods.
                core(&["patch", "update"], &["pods/status"]),
                core(&["list", "get", "delete"], &["pods"]),
                events(),
            ],
        ),
        (
            "persistent-volume-binder",
            vec![
                core(&["get", "list", "watch", "update", "create", "delete"], &["persistentvolumes"]),
                core(&["update"], &["persistentvolumes/status"]),
                core(&["get", "list", "watch", "update"], &["persistentvolumeclaims"]),
                core(&["update"], &["persistentvolumeclaims/status"]),
                core(&["list", "watch", "get", "create", "delete"], &["pods"]),
                rule().verbs(READ).groups(&[STORAGE]).resources(&["storageclasses"]),
                core(&["list", "watch"], &["nodes"]),
                events(),
                // The recycler watches its pod's events.
                core(&["watch"], &["events"]),
                core(&["get"], &["services"]),
            ],
        ),
        (
            "pod-garbage-collector",
            vec![
                core(&["list", "watch", "delete"], &["pods"]),
                core(&["get", "list"], &["nodes"]),
                core(&["patch"], &["pods/status"]),
            ],
        ),
        (
            "replicaset-controller",
            vec![
                rule().verbs(&["get", "list", "watch", "update"]).groups(apps_ext).resources(&["replicasets"]),
                rule().verbs(&["update"]).groups(apps_ext).resources(&["replicasets/status"]),
                rule().verbs(&["update"]).groups(apps_ext).resources(&["replicasets/finalizers"]),
                core(&["list", "watch", "patch", "create", "delete"], &["pods"]),
                events(),
            ],
        ),
        (
            "replication-controller",
            vec![
                // 1.0 controllers needed get and update, so old controllers keep working.
                core(&["get", "list", "watch", "update"], &["replicationcontrollers"]),
                core(&["update"], &["replicationcontrollers/status"]),
                core(&["update"], &["replicationcontrollers/finalizers"]),
                core(&["list", "watch", "patch", "create", "delete"], &["pods"]),
                events(),
            ],
        ),
        (
            // Quota counts anything, so it reads everything.
            "resourcequota-controller",
            vec![
                rule().verbs(&["list", "watch"]).groups(&["*"]).resources(&["*"]),
                core(&["update"], &["resourcequotas/status"]),
                events(),
            ],
        ),
        ("route-controller", vec![core(&["list", "watch"], &["nodes"]), core(&["patch"], &["nodes/status"]), events()]),
        ("service-account-controller", vec![core(&["create"], &["serviceaccounts"]), events()]),
        (
            "service-controller",
            vec![
                core(READ, &["services"]),
                core(&["patch", "update"], &["services/status"]),
                core(&["list", "watch"], &["nodes"]),
                events(),
            ],
        ),
        (
            // MultiCIDRServiceAllocator (GA).
            "service-cidrs-controller",
            vec![
                rule().verbs(&["get", "list", "watch", "patch", "update"]).groups(&[NETWORKING])
                    .resources(&["servicecidrs"]),
                rule().verbs(&["patch", "update"]).groups(&[NETWORKING]).resources(&["servicecidrs/finalizers"]),
                rule().verbs(&["patch", "update"]).groups(&[NETWORKING]).resources(&["servicecidrs/status"]),
                rule().verbs(READ).groups(&[NETWORKING]).resources(&["ipaddresses"]),
                events(),
            ],
        ),
        (
            "statefulset-controller",
            vec![
                core(&["list", "watch"], &["pods"]),
                rule().verbs(READ).groups(&[APPS]).resources(&["statefulsets"]),
                rule().verbs(&["update"]).groups(&[APPS]).resources(&["statefulsets/status"]),
                rule().verbs(&["update"]).groups(&[APPS]).resources(&["statefulsets/finalizers"]),
                core(&["get", "create", "delete", "update", "patch"], &["pods"]),
                rule()
                    .verbs(&["get", "create", "delete", "update", "patch", "list", "watch"])
                    .groups(&[APPS])
                    .resources(&["controllerrevisions"]),
                core(&["get", "create", "list", "watch"], &["persistentvolumeclaims"]),
                events(),
                core(&["update", "delete"], &["persistentvolumeclaims"]),
                core(&["update"], &["pods/finalizers"]),
            ],
        ),
        ("ttl-controller", vec![core(&["update", "patch", "list", "watch"], &["nodes"]), events()]),
        (
            "certificate-controller",
            vec![
                rule().verbs(&["get", "list", "watch", "delete"]).groups(&[CERTIFICATES])
                    .resources(&["certificatesigningrequests"]),
                rule()
                    .verbs(&["update"])
                    .groups(&[CERTIFICATES])
                    .resources(&["certificatesigningrequests/status", "certificatesigningrequests/approval"]),
                rule()
                    .verbs(&["approve"])
                    .groups(&[CERTIFICATES])
                    .resources(&["signers"])
                    .names(&[APISERVER_CLIENT_KUBELET_SIGNER]),
                rule().verbs(&["sign"]).groups(&[CERTIFICATES]).resources(&["signers"]).names(&[
                    LEGACY_UNKNOWN_SIGNER,
                    APISERVER_CLIENT_SIGNER,
                    APISERVER_CLIENT_KUBELET_SIGNER,
                    KUBELET_SERVING_SIGNER,
                ]),
                rule().verbs(&["create"]).groups(&[AUTHZ]).resources(&["subjectaccessreviews"]),
                events(),
            ],
        ),
        (
            "pvc-protection-controller",
            vec![
                core(&["get", "list", "watch", "update"], &["persistentvolumeclaims"]),
                core(&["list", "watch", "get"], &["pods"]),
                events(),
            ],
        ),
        ("pv-protection-controller", vec![core(&["get", "list", "watch", "update"], &["persistentvolumes"]), events()]),
        (
            "ttl-after-finished-controller",
            vec![rule().verbs(&["get", "list", "watch", "delete"]).groups(&[BATCH]).resources(&["jobs"]), events()],
        ),
        ("root-ca-cert-publisher", vec![core(&["create", "update"], &["configmaps"]), events()]),
        (
            "validatingadmissionpolicy-status-controller",
            vec![
                rule().verbs(READ).groups(&[ADMISSION]).resources(&["validatingadmissionpolicies"]),
                rule().verbs(&["get", "patch", "update"]).groups(&[ADMISSION])
                    .resources(&["validatingadmissionpolicies/status"]),
                events(),
            ],
        ),
        (
            "legacy-service-account-token-cleaner",
            vec![
                core(&["get"], &["configmaps"]).names(&["kube-apiserver-legacy-service-account-token-tracking"]),
                core(&["patch", "delete"], &["secrets"]),
            ],
        ),
        (
            // SELinuxChangePolicy (beta, on).
            "selinux-warning-controller",
            vec![
                events(),
                core(READ, &["persistentvolumes"]),
                core(READ, &["persistentvolumeclaims"]),
                core(READ, &["pods"]),
                rule().verbs(READ).groups(&[STORAGE]).resources(&["csidrivers"]),
            ],
        ),
    ]
}

/// Every bootstrap cluster role: `policy.go`'s, then the `system:controller:*` roles, in
/// upstream's order (the order in which the API server reconciles them).
pub fn cluster_roles() -> Vec<Value> {
    let mut roles = policy_cluster_roles();
    for (suffix, rules) in controller_rules() {
        roles.push(cluster_role(&format!("{CONTROLLER_PREFIX}{suffix}"), rules));
    }
    roles
}

/// Every bootstrap cluster role binding: `policy.go`'s, then one per controller role binding it to
/// the controller's service account in kube-system.
#[rustfmt::skip]
pub fn cluster_role_bindings() -> Vec<Value> {
    let mut bindings = vec![
        cluster_binding("cluster-admin", &[Group("system:masters")]),
        cluster_binding("system:monitoring", &[Group("system:monitoring")]),
        cluster_binding("system:discovery", &[Group("system:authenticated")]),
        cluster_binding("system:basic-user", &[Group("system:authenticated")]),
        cluster_binding("system:public-info-viewer", &[Group("system:authenticated"), Group("system:unauthenticated")]),
        cluster_binding("system:node-proxier", &[User("system:kube-proxy")]),
        cluster_binding("system:kube-controller-manager", &[User("system:kube-controller-manager")]),
        cluster_binding("system:kube-dns", &[Sa(KUBE_SYSTEM, "kube-dns")]),
        cluster_binding("system:kube-scheduler", &[User("system:kube-scheduler")]),
        cluster_binding("system:volume-scheduler", &[User("system:kube-scheduler")]),
        // Kept without subjects since the Node authorizer replaced it, so that tightening
        // reconciliation can drop the system:nodes group from old clusters.
        cluster_binding("system:node", &[]),
        // Every workload may read the service account issuer's discovery documents.
        cluster_binding("system:service-account-issuer-discovery", &[Group("system:serviceaccounts")]),
    ];
    for (suffix, _) in controller_rules() {
        bindings.push(cluster_binding(&format!("{CONTROLLER_PREFIX}{suffix}"), &[Sa(KUBE_SYSTEM, suffix)]));
    }
    bindings
}

fn leader_locking_rules(lock: &str) -> Vec<Rule> {
    let lease_verbs = &["get", "watch", "list", "create", "update"];
    vec![
        core(&["watch"], &["configmaps"]),
        core(&["get", "update"], &["configmaps"]).names(&[lock]),
        rule().verbs(lease_verbs).groups(&[COORDINATION]).resources(&["leases"]),
        rule()
            .verbs(lease_verbs)
            .groups(&[COORDINATION])
            .resources(&["leasecandidates"]),
    ]
}

/// The bootstrap Roles of upstream's `namespace_policy.go`: kube-system's, then kube-public's.
#[rustfmt::skip]
pub fn roles() -> Vec<Value> {
    let system = |name: &str, rules| role_object("Role", name, Some(KUBE_SYSTEM), &[], rules);
    vec![
        // Finding the authentication configuration a delegating server starts from.
        system(
            "extension-apiserver-authentication-reader",
            vec![core(READ, &["configmaps"]).names(&["extension-apiserver-authentication"])],
        ),
        // The bootstrap signer inspects kube-system's secrets.
        system("system:controller:bootstrap-signer", vec![core(READ, &["secrets"])]),
        // Deprecated since 1.10.
        system("system:controller:cloud-provider", vec![core(&["create", "get", "list", "watch"], &["configmaps"])]),
        system(
            "system:controller:token-cleaner",
            vec![core(&["get", "list", "watch", "delete"], &["secrets"]), events()],
        ),
        system("system::leader-locking-kube-controller-manager", leader_locking_rules("kube-controller-manager")),
        system("system::leader-locking-kube-scheduler", leader_locking_rules("kube-scheduler")),
        // The bootstrap signer writes the cluster-info config map.
        role_object(
            "Role",
            "system:controller:bootstrap-signer",
            Some(KUBE_PUBLIC),
            &[],
            vec![core(READ, &["configmaps"]), core(&["update"], &["configmaps"]).names(&["cluster-info"]), events()],
        ),
    ]
}

/// The bootstrap RoleBindings of upstream's `namespace_policy.go`: kube-system's, then kube-public's.
#[rustfmt::skip]
pub fn role_bindings() -> Vec<Value> {
    let bind = |namespace, name, role, subjects: &[Subject]| {
        binding("RoleBinding", name, Some(namespace), "Role", role, subjects)
    };
    let kcm = "system:kube-controller-manager";
    let scheduler = "system:kube-scheduler";
    vec![
        bind(
            KUBE_SYSTEM,
            "system::extension-apiserver-authentication-reader",
            "extension-apiserver-authentication-reader",
            &[User(kcm), User(scheduler)],
        ),
        bind(
            KUBE_SYSTEM,
            "system::leader-locking-kube-controller-manager",
            "system::leader-locking-kube-controller-manager",
            &[User(kcm), Sa(KUBE_SYSTEM, "kube-controller-manager"), Sa(KUBE_SYSTEM, "leader-election-controller")],
        ),
        bind(
            KUBE_SYSTEM,
            "system::leader-locking-kube-scheduler",
            "system::leader-locking-kube-scheduler",
            &[User(scheduler), Sa(KUBE_SYSTEM, "kube-scheduler")],
        ),
        bind(
            KUBE_SYSTEM,
            "system:controller:bootstrap-signer",
            "system:controller:bootstrap-signer",
            &[Sa(KUBE_SYSTEM, "bootstrap-signer")],
        ),
        bind(
            KUBE_SYSTEM,
            "system:controller:cloud-provider",
            "system:controller:cloud-provider",
            &[Sa(KUBE_SYSTEM, "cloud-provider")],
        ),
        bind(
            KUBE_SYSTEM,
            "system:controller:token-cleaner",
            "system:controller:token-cleaner",
            &[Sa(KUBE_SYSTEM, "token-cleaner")],
        ),
        bind(
            KUBE_PUBLIC,
            "system:controller:bootstrap-signer",
            "system:controller:bootstrap-signer",
            &[Sa(KUBE_SYSTEM, "bootstrap-signer")],
        ),
    ]
}

// ---------------------------------------------------------------------------------------------
// Coverage of one rule set by another (upstream's `validation.Covers`).

/// A rule's lists, as borrowed strings.
#[derive(Debug, Default)]
struct Parsed<'a> {
    verbs: Vec<&'a str>,
    groups: Vec<&'a str>,
    resources: Vec<&'a str>,
    names: Vec<&'a str>,
    urls: Vec<&'a str>,
}

fn strings<'a>(rule: &'a Value, key: &str) -> Vec<&'a str> {
    rule.get(key)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

impl<'a> Parsed<'a> {
    fn of(rule: &'a Value) -> Self {
        Parsed {
            verbs: strings(rule, "verbs"),
            groups: strings(rule, "apiGroups"),
            resources: strings(rule, "resources"),
            names: strings(rule, "resourceNames"),
            urls: strings(rule, "nonResourceURLs"),
        }
    }
}

/// Breaks a rule into rules of one verb, group, resource and (if any) resource name each, and
/// rules of one verb and one non-resource URL each.
fn breakdown(rule: &Value) -> Vec<Value> {
    let p = Parsed::of(rule);
    let mut out = vec![];
    for group in &p.groups {
        for resource in &p.resources {
            for verb in &p.verbs {
                let one = || json!({ "verbs": [verb], "apiGroups": [group], "resources": [resource] });
                if p.names.is_empty() {
                    out.push(one());
                }
                for name in &p.names {
                    let mut r = one();
                    r["resourceNames"] = json!([name]);
                    out.push(r);
                }
            }
        }
    }
    for url in &p.urls {
        for verb in &p.verbs {
            out.push(json!({ "verbs": [verb], "nonResourceURLs": [url] }));
        }
    }
    out
}

fn has_all(set: &[&str], wanted: &[&str]) -> bool {
    wanted.iter().all(|w| set.contains(w))
}

/// Whether `owned` resources cover `wanted` ones, `*` covering all and `*/x` every `r/x`.
fn resources_cover(owned: &[&str], wanted: &[&str]) -> bool {
    if owned.contains(&"*") || has_all(owned, wanted) {
        return true;
    }
    wanted.iter().all(|path| {
        owned.contains(path)
            || path
                .split_once('/')
                .is_some_and(|(_, sub)| owned.iter().any(|o| o.strip_prefix("*/") == Some(sub)))
    })
}

/// Whether one owned URL covers a wanted one: equal, or a prefix ending in `*`.
fn url_covers(owned: &str, wanted: &str) -> bool {
    owned == wanted || (owned.ends_with('*') && wanted.starts_with(owned.trim_end_matches('*')))
}

/// Whether an owner rule covers a broken-down rule (upstream's `ruleCovers`).
fn rule_covers(owner: &Parsed, sub: &Parsed) -> bool {
    let verbs = owner.verbs.contains(&"*") || has_all(&owner.verbs, &sub.verbs);
    let groups = owner.groups.contains(&"*") || has_all(&owner.groups, &sub.groups);
    let resources = resources_cover(&owner.resources, &sub.resources);
    let urls = sub.urls.iter().all(|u| owner.urls.iter().any(|o| url_covers(o, u)));
    let names = owner.names.is_empty() || (!sub.names.is_empty() && has_all(&owner.names, &sub.names));
    verbs && groups && resources && names && urls
}

/// Whether the `owner` rules allow everything the `requested` rules allow, as upstream's
/// `validation.Covers`: each requested rule is broken down into rules of one verb, group,
/// resource and resource name (or one verb and non-resource URL), and the broken-down rules no
/// single owner rule covers are returned.
pub fn covers(owner: &[Value], requested: &[Value]) -> (bool, Vec<Value>) {
    let owners: Vec<Parsed> = owner.iter().map(Parsed::of).collect();
    let uncovered: Vec<Value> = requested
        .iter()
        .flat_map(breakdown)
        .filter(|sub| {
            let sub = Parsed::of(sub);
            !owners.iter().any(|o| rule_covers(o, &sub))
        })
        .collect();
    (uncovered.is_empty(), uncovered)
}

// ---------------------------------------------------------------------------------------------
// Reconciliation (upstream's `pkg/registry/rbac/reconciliation`, as the API server runs it at
// start-up: writes confirmed, extra permissions and subjects kept).

/// What reconciling one bootstrap object against the stored one calls for.
#[derive(Debug, Clone, PartialEq)]
pub enum Reconcile {
    /// Nothing to write: up to date, or opted out with `autoupdate: "false"`.
    Unchanged,
    /// Nothing is stored: create this object.
    Create(Value),
    /// Write this object: the stored one (its uid, resourceVersion and creationTimestamp kept)
    /// with the missing labels, annotations, rules, selectors or subjects added.
    Update(Value),
    /// A binding whose roleRef differs, which the API does not let change: delete the stored one,
    /// then create this one.
    Recreate(Value),
}

fn meta_map<'a>(obj: &'a Value, key: &str) -> Option<&'a Map<String, Value>> {
    obj.get("metadata")?.get(key)?.as_object()
}

fn protected(existing: &Value) -> bool {
    meta_map(existing, "annotations").and_then(|a| a.get(AUTO_UPDATE_ANNOTATION)) == Some(&json!("false"))
}

/// Adds to `result` the labels and annotations of `expected` that `existing` lacks; a key both
/// set keeps the stored value (upstream's `merge(expected, existing)`). Returns whether any was added.
fn merge_metadata(result: &mut Value, existing: &Value, expected: &Value) -> bool {
    let mut changed = false;
    for key in ["annotations", "labels"] {
        let Some(wanted) = meta_map(expected, key) else {
            continue;
        };
        let mut merged = meta_map(existing, key).cloned().unwrap_or_default();
        let before = merged.len();
        for (k, v) in wanted {
            merged.entry(k.clone()).or_insert_with(|| v.clone());
        }
        if merged.len() != before || meta_map(existing, key).is_none() {
            result["metadata"][key] = Value::Object(merged);
            changed = true;
        }
    }
    changed
}

fn array<'a>(obj: &'a Value, key: &str) -> &'a [Value] {
    obj.get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// A label selector with empty or null parts dropped, for comparisons that treat those as absent.
fn normalized_selector(selector: &Value) -> Value {
    let mut out = Map::new();
    for key in ["matchLabels", "matchExpressions"] {
        match selector.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) if m.is_empty() => {}
            Some(Value::Array(a)) if a.is_empty() => {}
            Some(v) => {
                out.insert(key.into(), v.clone());
            }
        }
    }
    Value::Object(out)
}

/// Upstream's reconciliation of a Role or ClusterRole with the stored one: missing labels and
/// annotations are added (stored values win), expected rules not [`covers`]-ed by the stored
/// rules are appended as broken-down rules, and missing aggregation selectors are appended. A
/// stored role opted out with `autoupdate: "false"` is left alone. The rules of an aggregated
/// role are the aggregation controller's to write, so none are added to one; an aggregation rule
/// the expected role lacks is removed, as upstream does.
pub fn reconcile_role(existing: Option<&Value>, expected: &Value) -> Reconcile {
    let Some(existing) = existing else {
        return Reconcile::Create(expected.clone());
    };
    if protected(existing) {
        return Reconcile::Unchanged;
    }
    let mut result = existing.clone();
    let mut changed = merge_metadata(&mut result, existing, expected);

    let expected_aggregation = expected.get("aggregationRule").filter(|v| !v.is_null());
    if expected_aggregation.is_none() {
        let (_, missing) = covers(array(existing, "rules"), array(expected, "rules"));
        if !missing.is_empty() {
            let mut rules = array(existing, "rules").to_vec();
            rules.extend(missing);
            result["rules"] = Value::Array(rules);
            changed = true;
        }
    }

    let existing_aggregation = existing.get("aggregationRule").filter(|v| !v.is_null());
    match (expected_aggregation, existing_aggregation) {
        (None, Some(_)) => {
            if let Some(role) = result.as_object_mut() {
                role.remove("aggregationRule");
                changed = true;
            }
        }
        (Some(wanted), _) => {
            let have: Vec<Value> = existing_aggregation
                .map(|a| {
                    array(a, "clusterRoleSelectors")
                        .iter()
                        .map(normalized_selector)
                        .collect()
                })
                .unwrap_or_default();
            let missing: Vec<Value> = array(wanted, "clusterRoleSelectors")
                .iter()
                .filter(|s| !have.contains(&normalized_selector(s)))
                .cloned()
                .collect();
            if !missing.is_empty() {
                let mut selectors = existing_aggregation
                    .map(|a| array(a, "clusterRoleSelectors").to_vec())
                    .unwrap_or_default();
                selectors.extend(missing);
                result["aggregationRule"] = json!({ "clusterRoleSelectors": selectors });
                changed = true;
            }
        }
        (None, None) => {}
    }

    if changed {
        Reconcile::Update(result)
    } else {
        Reconcile::Unchanged
    }
}

/// A subject as upstream compares them: all four fields, a missing one being empty.
fn subject_key(subject: &Value) -> [&str; 4] {
    ["kind", "apiGroup", "name", "namespace"].map(|k| subject.get(k).and_then(Value::as_str).unwrap_or(""))
}

fn role_ref_key(binding: &Value) -> [&str; 3] {
    ["apiGroup", "kind", "name"].map(|k| {
        binding
            .get("roleRef")
            .and_then(|r| r.get(k))
            .and_then(Value::as_str)
            .unwrap_or("")
    })
}

/// Upstream's reconciliation of a RoleBinding or ClusterRoleBinding with the stored one: a
/// differing roleRef (immutable in the API) calls for [`Reconcile::Recreate`]; otherwise missing
/// labels and annotations (stored values win) and missing subjects are added. A stored binding
/// opted out with `autoupdate: "false"` is left alone.
pub fn reconcile_binding(existing: Option<&Value>, expected: &Value) -> Reconcile {
    let Some(existing) = existing else {
        return Reconcile::Create(expected.clone());
    };
    if protected(existing) {
        return Reconcile::Unchanged;
    }
    if role_ref_key(existing) != role_ref_key(expected) {
        return Reconcile::Recreate(expected.clone());
    }
    let mut result = existing.clone();
    let mut changed = merge_metadata(&mut result, existing, expected);

    let have: Vec<[&str; 4]> = array(existing, "subjects").iter().map(subject_key).collect();
    let mut missing: Vec<Value> = vec![];
    for subject in array(expected, "subjects") {
        let key = subject_key(subject);
        if !have.contains(&key) && !missing.iter().any(|m| subject_key(m) == key) {
            missing.push(subject.clone());
        }
    }
    if !missing.is_empty() {
        let mut subjects = array(existing, "subjects").to_vec();
        subjects.extend(missing);
        result["subjects"] = Value::Array(subjects);
        changed = true;
    }

    if changed {
        Reconcile::Update(result)
    } else {
        Reconcile::Unchanged
    }
}
