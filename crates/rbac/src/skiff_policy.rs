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
        // The agent reads its cluster's identity, the uid of the `kube-system` Namespace. Its proxy
        // reads Services, their EndpointSlices and the service range (what kube-proxy reads); its
        // cluster DNS reads what CoreDNS reads and publishes where it listens as the EndpointSlice
        // `kube-system/kube-dns-NODE` (NodeRestriction holds each node to its own). Its pod
        // network lists and watches every Node for their podCIDRs and addresses, as flannel's
        // role does (a get of another Node stays refused).
        cluster_role(
            "skiff:node",
            json!([
                {"verbs": ["list", "watch"], "apiGroups": [""], "resources": ["services", "namespaces", "nodes"]},
                // The cluster's identity, labelled on every container the agent makes.
                {"verbs": ["get"], "apiGroups": [""], "resources": ["namespaces"], "resourceNames": ["kube-system"]},
                {"verbs": ["list", "watch"], "apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"]},
                {"verbs": ["get", "create", "update", "patch", "delete"], "apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"]},
                // The proxy reads the service range from the `kubernetes` ServiceCIDR.
                {"verbs": ["get"], "apiGroups": ["networking.k8s.io"], "resources": ["servicecidrs"]},
            ]),
        ),
        // The agent's local-path provisioner, as local-path-provisioner's role, for its own node:
        // it watches claims and volumes, reads classes, creates and deletes the volumes it makes
        // (NodeRestriction holds a node to those of its own node), grows them and reports it in
        // the claim's status. Its events are written under the Node authorizer's `system:node` rules.
        cluster_role(
            "skiff:local-path-provisioner",
            json!([
                {"verbs": READ, "apiGroups": [""], "resources": ["persistentvolumeclaims"]},
                {"verbs": ["update", "patch"], "apiGroups": [""], "resources": ["persistentvolumeclaims/status"]},
                {"verbs": ["get", "list", "watch", "create", "update", "patch", "delete"], "apiGroups": [""], "resources": ["persistentvolumes"]},
                {"verbs": READ, "apiGroups": ["storage.k8s.io"], "resources": ["storageclasses"]},
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
        // Each agent is also its node's service proxy and DNS server.
        binding("skiff:node", "skiff:node", group("system:nodes")),
        // And its node's volume provisioner.
        binding(
            "skiff:local-path-provisioner",
            "skiff:local-path-provisioner",
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
