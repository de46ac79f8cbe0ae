//! Skiff's own additions to the bootstrap policy, for what its parts do beyond upstream's:
//! the administrators' group, the scheduler's explanation annotation, ServiceLB, joining nodes
//! (kubeadm's bootstrap token and certificate auto-approval bindings, the anonymous read of
//! `kube-public/cluster-info`), and the node
//! agent's proxy, cluster DNS and local-path provisioner roles (which upstream runs as
//! kube-proxy, CoreDNS and local-path-provisioner).
//! Labelled and annotated as upstream's bootstrap objects, so they are reconciled the same way.

use serde_json::{Value, json};

fn meta(name: &str) -> Value {
    json!({
        "name": name,
        "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
        "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
    })
}

fn cluster_role(name: &str, rules: Value) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": meta(name),
        "rules": rules,
    })
}

fn binding(name: &str, role: &str, subject: Value) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": meta(name),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [subject],
    })
}

fn group(name: &str) -> Value {
    json!({"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": name})
}

fn user(name: &str) -> Value {
    json!({"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": name})
}

fn service_account(name: &str) -> Value {
    json!({"kind": "ServiceAccount", "name": name, "namespace": "kube-system"})
}

/// The administrators' group of the admin kubeconfig (kubeadm's `kubeadm:cluster-admins`).
pub const CLUSTER_ADMINS_GROUP: &str = "skiff:cluster-admins";
/// The simulated nodes' client (kwok's: one client acts for every simulated node).
pub const NODE_SIMULATOR_USER: &str = "skiff:node-simulator";
/// The ServiceLB controller's service account in kube-system.
pub const SERVICE_LB_CONTROLLER: &str = "service-lb-controller";
/// The service account in kube-system a node agent's proxy, DNS and pod network read under.
pub const NODE_NETWORK_SA: &str = "skiff-node-network";
/// The service account in kube-system a node agent's local-path provisioner reads under.
pub const LOCAL_PATH_PROVISIONER_SA: &str = "skiff-local-path-provisioner";
/// The service accounts of a node agent's parts: a node may ask for their tokens bound to its
/// own Node, and for no other (NodeRestriction).
pub const NODE_COMPONENT_SERVICE_ACCOUNTS: [&str; 2] = [NODE_NETWORK_SA, LOCAL_PATH_PROVISIONER_SA];

const EVENTS: [&str; 3] = ["create", "patch", "update"];
const READ: [&str; 3] = ["get", "list", "watch"];

pub fn cluster_roles() -> Vec<Value> {
    // metrics-server's reader role: the resource metrics API (`kubectl top`) is readable by
    // whoever holds view, edit or admin, into which the aggregation controller folds it.
    let mut metrics_reader = cluster_role(
        "system:aggregated-metrics-reader",
        json!([{"verbs": READ, "apiGroups": ["metrics.k8s.io"], "resources": ["pods", "nodes"]}]),
    );
    for to in ["view", "edit", "admin"] {
        metrics_reader["metadata"]["labels"][format!("rbac.authorization.k8s.io/aggregate-to-{to}")] = json!("true");
    }
    vec![
        metrics_reader,
        // The scheduler records each attempt's verdicts on the pod (`skiff explain pod`).
        // It also resolves priorities from PriorityClasses itself.
        cluster_role(
            "skiff:kube-scheduler",
            json!([
                {"verbs": ["patch"], "apiGroups": [""], "resources": ["pods"]},
                {"verbs": READ, "apiGroups": ["scheduling.k8s.io"], "resources": ["priorityclasses"]},
            ]),
        ),
        // Skiff's controllers read single objects where upstream's read their informers'
        // caches (which the controller manager lists and watches: it may already see all).
        cluster_role(
            "skiff:kube-controller-manager",
            json!([{"verbs": ["get"], "apiGroups": ["*"], "resources": ["*"]}]),
        ),
        // k3s' ServiceLB: a LoadBalancer Service's ingress is its nodes' addresses.
        cluster_role(
            "skiff:controller:service-lb-controller",
            json!([
                {"verbs": READ, "apiGroups": [""], "resources": ["services", "nodes"]},
                {"verbs": ["patch", "update"], "apiGroups": [""], "resources": ["services/status"]},
                {"verbs": EVENTS, "apiGroups": ["", "events.k8s.io"], "resources": ["events"]},
            ]),
        ),
        // A node reads its cluster's identity, the uid of the `kube-system` Namespace, which the
        // agent labels on every container it makes.
        cluster_role(
            "skiff:node:cluster-identity",
            json!([
                {"verbs": ["get"], "apiGroups": [""], "resources": ["namespaces"], "resourceNames": ["kube-system"]},
            ]),
        ),
        // The agent's service proxy, cluster DNS and pod network, under the service account
        // `kube-system/skiff-node-network` (as kube-proxy, CoreDNS and flannel run under their
        // own): the proxy reads Services, their EndpointSlices and the service range (what
        // `system:node-proxier` grants kube-proxy), DNS what CoreDNS's role reads, and the pod
        // network every Node's podCIDR and addresses (flannel's role). The node itself reads
        // none of these; it writes its DNS EndpointSlice `kube-system/kube-dns-NODE` under the
        // Node authorizer.
        cluster_role(
            "skiff:node:network",
            json!([
                {"verbs": ["list", "watch"], "apiGroups": [""], "resources": ["services", "namespaces", "nodes"]},
                {"verbs": ["get"], "apiGroups": [""], "resources": ["services"]},
                {"verbs": ["list", "watch"], "apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"]},
                {"verbs": ["get"], "apiGroups": ["networking.k8s.io"], "resources": ["servicecidrs"]},
            ]),
        ),
        // The agent's local-path provisioner reads under the service account
        // `kube-system/skiff-local-path-provisioner` what local-path-provisioner's role reads:
        // claims, volumes and classes...
        cluster_role(
            "skiff:node:local-path-provisioner",
            json!([
                {"verbs": READ, "apiGroups": [""], "resources": ["persistentvolumeclaims", "persistentvolumes"]},
                {"verbs": READ, "apiGroups": ["storage.k8s.io"], "resources": ["storageclasses"]},
            ]),
        ),
        // ... and writes as its node, which NodeRestriction holds to the volumes of its own node:
        // it creates and deletes them, grows them and reports it in the claim's status. Its events
        // are written under the Node authorizer's `system:node` rules.
        cluster_role(
            "skiff:node:local-path-volumes",
            json!([
                {"verbs": ["create", "update", "patch", "delete"], "apiGroups": [""], "resources": ["persistentvolumes"]},
                {"verbs": ["update", "patch"], "apiGroups": [""], "resources": ["persistentvolumeclaims/status"]},
            ]),
        ),
    ]
}

pub fn cluster_role_bindings() -> Vec<Value> {
    vec![
        binding("skiff:cluster-admins", "cluster-admin", group(CLUSTER_ADMINS_GROUP)),
        binding(
            "skiff:kube-scheduler",
            "skiff:kube-scheduler",
            user("system:kube-scheduler"),
        ),
        binding(
            "skiff:kube-controller-manager",
            "skiff:kube-controller-manager",
            user("system:kube-controller-manager"),
        ),
        binding(
            "skiff:controller:service-lb-controller",
            "skiff:controller:service-lb-controller",
            service_account(SERVICE_LB_CONTROLLER),
        ),
        // The API server calls node agents (logs, exec, the node proxy, metrics) with the
        // certificate kubeadm names `apiserver-kubelet-client`; each agent asks RBAC about it as
        // about any caller, and this binding is what allows it (kubeadm's binding to the same role).
        binding(
            "skiff:kube-apiserver-kubelet-client",
            "system:kubelet-api-admin",
            user(KUBE_APISERVER_KUBELET_CLIENT),
        ),
        binding(
            "skiff:node:cluster-identity",
            "skiff:node:cluster-identity",
            group("system:nodes"),
        ),
        binding(
            "skiff:node:network",
            "skiff:node:network",
            service_account(NODE_NETWORK_SA),
        ),
        binding(
            "skiff:node:local-path-provisioner",
            "skiff:node:local-path-provisioner",
            service_account(LOCAL_PATH_PROVISIONER_SA),
        ),
        binding(
            "skiff:node:local-path-volumes",
            "skiff:node:local-path-volumes",
            group("system:nodes"),
        ),
        // The node simulator acts for every simulated node with the nodes' role.
        binding("skiff:node-simulator", "system:node", user(NODE_SIMULATOR_USER)),
        // Joining nodes, as kubeadm binds them: a bootstrap token may ask for a node client
        // certificate, which the approver approves at once; a node may renew its own.
        binding(
            "skiff:kubelet-bootstrap",
            "system:node-bootstrapper",
            group(BOOTSTRAPPERS_GROUP),
        ),
        binding(
            "skiff:node-autoapprove-bootstrap",
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            group(BOOTSTRAPPERS_GROUP),
        ),
        binding(
            "skiff:node-autoapprove-certificate-rotation",
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            group("system:nodes"),
        ),
    ]
}

/// Bootstrap objects of earlier versions that granted what no longer belongs to their
/// subjects: the `system:nodes` group's reads of every Node, Service, Namespace, EndpointSlice
/// and claim, now held by the node agent's service accounts. Reconciling only adds, so these are
/// deleted (plural, name) unless their `autoupdate` annotation is `"false"`.
pub const RETIRED: [(&str, &str); 4] = [
    ("clusterrolebindings", "skiff:node"),
    ("clusterrolebindings", "skiff:local-path-provisioner"),
    ("clusterroles", "skiff:node"),
    ("clusterroles", "skiff:local-path-provisioner"),
];

/// The user of the certificate the API server calls node agents with.
pub const KUBE_APISERVER_KUBELET_CLIENT: &str = "kube-apiserver-kubelet-client";

/// Every bootstrap token's group.
pub const BOOTSTRAPPERS_GROUP: &str = "system:bootstrappers";

/// Roles of Skiff's own: anyone may read `kube-public/cluster-info` (kubeadm's
/// `kubeadm:bootstrap-signer-clusterinfo`), where a joining node finds the CA its join token pins.
pub fn roles() -> Vec<Value> {
    let mut meta = meta("skiff:bootstrap-signer-clusterinfo");
    meta["namespace"] = json!("kube-public");
    vec![json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": meta,
        "rules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["cluster-info"]}],
    })]
}

pub fn role_bindings() -> Vec<Value> {
    let mut meta = meta("skiff:bootstrap-signer-clusterinfo");
    meta["namespace"] = json!("kube-public");
    vec![json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "skiff:bootstrap-signer-clusterinfo"},
        "subjects": [user("system:anonymous")],
    })]
}
