//! Upstream's NodeRestriction admission plugin: what the Node authorizer lets every node do, this
//! limits to the node's own objects, with upstream's messages. A node creates only mirror pods
//! bound to itself, updates the status of and deletes only its own pods, modifies only its own
//! Node (not its taints, not `node-restriction.kubernetes.io/` labels) and Lease, and requests
//! service account tokens only bound to its own pods, and changes of claims only the status
//! fields volume expansion reports. Skiff's additions: a node writes only its own cluster DNS
//! EndpointSlice, `kube-system/kube-dns-NODE`, and only the PersistentVolumes its local-path
//! provisioner makes (`pv.kubernetes.io/provisioned-by: skiff.dev/local-path`, required node
//! affinity to itself alone).

use std::collections::BTreeSet;

use serde_json::Value;
use skiff_api::StatusError;
use skiff_api::volume::{ANN_DYNAMICALLY_PROVISIONED, LOCAL_PATH_PROVISIONER};

use crate::handlers::Ctx;
use crate::node_authorizer;

const NODE_RESTRICTION_DOMAIN: &str = "node-restriction.kubernetes.io";

fn forbidden(msg: String) -> StatusError {
    StatusError::forbidden(msg)
}

fn is_empty_map(v: &Value) -> bool {
    v.as_object().is_some_and(|m| m.is_empty())
}

/// The requesting node's own Node object (NodeRestriction reads it to check what refers to it).
async fn own_node(ctx: &Ctx, node: &str) -> Result<Value, StatusError> {
    let nodes = skiff_api::registry::lookup("", "v1", "nodes")
        .ok_or_else(|| StatusError::internal("the registry has no nodes"))?;
    let key = crate::objects::key(nodes, "", node);
    let kv = ctx
        .state
        .store
        .get(&key)
        .await
        .map_err(|e| forbidden(format!("error looking up node {node}: {e}")))?
        .ok_or_else(|| StatusError::not_found("", "nodes", node))?;
    crate::objects::decode_kv(&kv).ok_or_else(|| forbidden(format!("error reading node {node}")))
}

/// Upstream's `admitPodCreate`: a node creates only mirror pods bound to itself, owned by its
/// Node alone (as controller, its UID, no `blockOwnerDeletion`), that reference no other API
/// object: the Node authorizer grants a node what its pods reference, so a pod a node could
/// make naming a Secret would hand it that Secret.
async fn admit_mirror_pod(ctx: &Ctx, node: &str, pod: &Value) -> Result<(), StatusError> {
    let refuse = |msg: String| Err(crate::serviceaccount_admission::forbidden(pod, &msg));
    if !crate::serviceaccount_admission::is_mirror_pod(pod) {
        return refuse(format!(
            "pod does not have \"{}\" annotation, node \"{node}\" can only create mirror pods",
            crate::serviceaccount_admission::MIRROR_ANNOTATION
        ));
    }
    if node_name_of_pod(pod) != node {
        return refuse(format!(
            "node \"{node}\" can only create pods with spec.nodeName set to itself"
        ));
    }
    let owners = pod
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let owner = match owners {
        [] => {
            return refuse(format!(
                "node \"{node}\" can only create pods with an owner reference set to itself"
            ));
        }
        [owner] => owner,
        _ => {
            return refuse(format!(
                "node \"{node}\" can only create pods with a single owner reference set to itself"
            ));
        }
    };
    let field = |k: &str| owner.get(k).and_then(Value::as_str).unwrap_or("");
    if field("apiVersion") != "v1" || field("kind") != "Node" || field("name") != node {
        return refuse(format!(
            "node \"{node}\" can only create pods with an owner reference set to itself"
        ));
    }
    if owner.get("controller").and_then(Value::as_bool) != Some(true) {
        return refuse(format!(
            "node \"{node}\" can only create pods with a controller owner reference set to itself"
        ));
    }
    if owner.get("blockOwnerDeletion").and_then(Value::as_bool) == Some(true) {
        return refuse(format!(
            "node \"{node}\" must not set blockOwnerDeletion on an owner reference"
        ));
    }
    let node_obj = own_node(ctx, node).await?;
    let uid = node_obj.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or("");
    if field("uid") != uid {
        return refuse(format!("node {node} UID mismatch: expected {uid} got {}", field("uid")));
    }
    // Don't allow a node to create a pod that references any other API objects.
    if pod
        .pointer("/spec/serviceAccountName")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty())
    {
        return refuse(format!(
            "node \"{node}\" can not create pods that reference a service account"
        ));
    }
    if !node_authorizer::references(pod, node_authorizer::Kind::Secret).is_empty() {
        return refuse(format!("node \"{node}\" can not create pods that reference secrets"));
    }
    if !node_authorizer::references(pod, node_authorizer::Kind::ConfigMap).is_empty() {
        return refuse(format!("node \"{node}\" can not create pods that reference configmaps"));
    }
    if crate::serviceaccount_admission::has_projection(pod, "clusterTrustBundle") {
        return refuse(format!(
            "node \"{node}\" can not create pods that reference clustertrustbundles"
        ));
    }
    // Claims named by the pod, and the claims its ephemeral volumes make.
    if !node_authorizer::references(pod, node_authorizer::Kind::Claim).is_empty() {
        return refuse(format!(
            "node \"{node}\" can not create pods that reference persistentvolumeclaims"
        ));
    }
    if pod
        .pointer("/spec/resourceClaims")
        .and_then(Value::as_array)
        .is_some_and(|c| !c.is_empty())
    {
        return refuse(format!(
            "node \"{node}\" can not create pods that reference resourceclaims"
        ));
    }
    Ok(())
}

/// Skiff's cluster DNS EndpointSlice of `node` (`kube-system/kube-dns-NODE`): it serves the
/// kube-dns Service alone (its labels are the agent's, exactly), owned by the Node alone, and its
/// endpoints are on `node` at the node's own addresses (its `status.addresses`, or inside its
/// podCIDRs, where the pod network's gateway is). A node cannot so steer another node's traffic,
/// nor any other Service's.
fn admit_dns_slice(node: &str, slice: &Value, node_obj: &Value) -> Result<(), StatusError> {
    let refuse = |what: String| {
        Err(StatusError::forbidden_resource(
            "discovery.k8s.io",
            "endpointslices",
            crate::objects::name(slice),
            &format!("node \"{node}\" {what}"),
        ))
    };
    let expected = serde_json::json!({
        "kubernetes.io/service-name": "kube-dns",
        "endpointslice.kubernetes.io/managed-by": "node-agent.skiff.io",
        "k8s-app": "kube-dns",
    });
    if slice.pointer("/metadata/labels") != Some(&expected) {
        return refuse(format!(
            "can only label its cluster DNS EndpointSlice with exactly {expected}"
        ));
    }
    let uid = node_obj.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or("");
    if let Some(owners) = slice.pointer("/metadata/ownerReferences").and_then(Value::as_array) {
        let own = |o: &Value| {
            o.get("apiVersion").and_then(Value::as_str) == Some("v1")
                && o.get("kind").and_then(Value::as_str) == Some("Node")
                && o.get("name").and_then(Value::as_str) == Some(node)
                && o.get("uid").and_then(Value::as_str) == Some(uid)
        };
        if !owners.iter().all(own) {
            return refuse("can only set an owner reference to itself".into());
        }
    }
    let addresses: Vec<&str> = node_obj
        .pointer("/status/addresses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|a| a.get("address").and_then(Value::as_str))
        .collect();
    let cidrs: Vec<skiff_api::cidr::Ipv4Cidr> = node_obj
        .pointer("/spec/podCIDRs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .chain(node_obj.pointer("/spec/podCIDR"))
        .filter_map(|c| c.as_str()?.parse().ok())
        .collect();
    let own_address = |a: &str| {
        addresses.contains(&a)
            || a.parse::<std::net::Ipv4Addr>()
                .is_ok_and(|ip| cidrs.iter().any(|c| c.contains(ip)))
    };
    for e in slice.get("endpoints").and_then(Value::as_array).into_iter().flatten() {
        if e.get("nodeName").and_then(Value::as_str) != Some(node) {
            return refuse("can only write endpoints with nodeName set to itself".into());
        }
        for a in e.get("addresses").and_then(Value::as_array).into_iter().flatten() {
            let a = a.as_str().unwrap_or("");
            if !own_address(a) {
                return refuse(format!(
                    "can only write endpoints at its own addresses or podCIDR, not {a:?}"
                ));
            }
        }
    }
    Ok(())
}

fn node_name_of_pod(pod: &Value) -> &str {
    pod.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or("")
}

/// Checks a create (`old` None) or update of `obj` by a node.
pub async fn admit(ctx: &Ctx, obj: &Value, old: Option<&Value>) -> Result<(), StatusError> {
    let Some(node) = node_authorizer::node_name(&ctx.user) else {
        return Ok(());
    };
    let res = ctx.rr.resource;
    let sub = ctx.rr.subresource.as_str();
    let name = crate::objects::name(obj);
    match (res.group, res.plural, sub) {
        ("", "pods", "") if old.is_none() => admit_mirror_pod(ctx, node, obj).await,
        ("", "pods", "status") => {
            let bound = old.map(node_name_of_pod).unwrap_or_else(|| node_name_of_pod(obj));
            if bound != node {
                return Err(forbidden(format!(
                    "node \"{node}\" can only update pod status for pods with spec.nodeName set to itself"
                )));
            }
            Ok(())
        }
        ("", "nodes", _) => {
            if name != node {
                return Err(forbidden(format!(
                    "node \"{node}\" is not allowed to modify node \"{name}\""
                )));
            }
            let labels = |o: Option<&Value>| -> Vec<(String, String)> {
                o.and_then(|o| o.pointer("/metadata/labels"))
                    .and_then(Value::as_object)
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                            .collect()
                    })
                    .unwrap_or_default()
            };
            let old_labels = labels(old);
            let forbidden_labels: BTreeSet<String> = labels(Some(obj))
                .into_iter()
                .filter(|(k, v)| {
                    let changed = !old_labels.iter().any(|(ok, ov)| ok == k && ov == v);
                    restricted_domain(k) || (changed && is_kubernetes_label(k) && !is_kubelet_label(k))
                })
                .map(|(k, _)| k)
                .collect();
            if !forbidden_labels.is_empty() {
                let list: Vec<String> = forbidden_labels.into_iter().collect();
                let verb = if old.is_none() {
                    "set the following labels"
                } else {
                    "modify labels"
                };
                return Err(forbidden(format!(
                    "node \"{node}\" is not allowed to {verb}: {}",
                    list.join(", ")
                )));
            }
            if let Some(old) = old
                && old.pointer("/spec/taints") != obj.pointer("/spec/taints")
                && !(taints_empty(old) && taints_empty(obj))
            {
                return Err(forbidden(format!("node \"{node}\" is not allowed to modify taints")));
            }
            Ok(())
        }
        ("", "persistentvolumeclaims", "status") => match old {
            Some(old) => admit_claim_status(node, obj, old),
            None => Err(StatusError::forbidden_resource(
                "",
                "persistentvolumeclaims",
                name,
                "unexpected operation \"CREATE\"",
            )),
        },
        ("", "persistentvolumeclaims", _) => Err(StatusError::forbidden_resource(
            "",
            "persistentvolumeclaims",
            name,
            "may only update PVC status",
        )),
        ("", "persistentvolumes", _) => {
            if old.is_some_and(|o| !local_path_volume_of(node, o)) || !local_path_volume_of(node, obj) {
                return Err(local_path_refusal(node, name));
            }
            Ok(())
        }
        ("coordination.k8s.io", "leases", _) => {
            if name != node {
                return Err(forbidden(
                    "can only access node lease with the same name as the requesting node".into(),
                ));
            }
            Ok(())
        }
        ("discovery.k8s.io", "endpointslices", _) => {
            let own = format!("kube-dns-{node}");
            if ctx.rr.namespace != "kube-system" || name != own {
                return Err(forbidden(format!(
                    "node \"{node}\" can only write the EndpointSlice kube-system/{own}"
                )));
            }
            if old.is_some_and(|o| std::ptr::eq(o, obj)) {
                // A delete of its own slice.
                return Ok(());
            }
            let node_obj = own_node(ctx, node).await?;
            admit_dns_slice(node, obj, &node_obj)
        }
        _ => Ok(()),
    }
}

/// Upstream's `admitPodStatus` on what a node sent to a pod's `status`, before the write keeps
/// only the status of it: a node may not relabel a pod (labels select Services and policies).
pub fn admit_pod_status_labels(ctx: &Ctx, sent: &Value, old: &Value) -> Result<(), StatusError> {
    let Some(node) = node_authorizer::node_name(&ctx.user) else {
        return Ok(());
    };
    let res = ctx.rr.resource;
    if !(res.group.is_empty() && res.plural == "pods" && ctx.rr.subresource == "status") {
        return Ok(());
    }
    let labels = |v: &Value| {
        v.pointer("/metadata/labels")
            .filter(|l| !l.is_null() && !is_empty_map(l))
            .cloned()
    };
    if labels(sent) != labels(old) {
        return Err(StatusError::forbidden_resource(
            "",
            "pods",
            crate::objects::name(old),
            &format!("node \"{node}\" cannot update labels through pod status"),
        ));
    }
    Ok(())
}

/// Checks a node's delete of a pod or EndpointSlice.
pub async fn admit_delete(ctx: &Ctx, obj: &Value) -> Result<(), StatusError> {
    let Some(node) = node_authorizer::node_name(&ctx.user) else {
        return Ok(());
    };
    match (ctx.rr.resource.group, ctx.rr.resource.plural) {
        ("", "pods") if node_name_of_pod(obj) != node => Err(forbidden(format!(
            "node \"{node}\" can only delete pods with spec.nodeName set to itself"
        ))),
        ("discovery.k8s.io", "endpointslices") | ("", "nodes") | ("coordination.k8s.io", "leases") => {
            Box::pin(admit(ctx, obj, Some(obj))).await
        }
        ("", "persistentvolumeclaims") => Err(StatusError::forbidden_resource(
            "",
            "persistentvolumeclaims",
            crate::objects::name(obj),
            "may only update PVC status",
        )),
        ("", "persistentvolumes") if !local_path_volume_of(node, obj) => {
            Err(local_path_refusal(node, crate::objects::name(obj)))
        }
        _ => Ok(()),
    }
}

/// Checks a node's eviction of a pod.
pub fn admit_eviction(ctx: &Ctx, pod: &Value) -> Result<(), StatusError> {
    match node_authorizer::node_name(&ctx.user) {
        Some(node) if node_name_of_pod(pod) != node => Err(forbidden(format!(
            "node \"{node}\" can only evict pods with spec.nodeName set to itself"
        ))),
        _ => Ok(()),
    }
}

/// What a node's TokenRequest binds its token to.
pub enum TokenBinding<'a> {
    Nothing,
    /// A pod, and the node it is scheduled to.
    Pod(Option<&'a str>),
    Node(&'a str),
    Other(&'a str),
}

/// Checks a node's TokenRequest for `service_account` (in `ctx.rr.namespace`): upstream's rule
/// is a token bound to a pod on this node; Skiff adds the service accounts of the agent's own
/// parts ([`skiff_rbac::skiff_policy::NODE_COMPONENT_SERVICE_ACCOUNTS`]), whose tokens a node
/// gets only bound to its own Node, so they name the node and end with it.
pub fn admit_token(ctx: &Ctx, service_account: &str, binding: TokenBinding<'_>) -> Result<(), StatusError> {
    let Some(node) = node_authorizer::node_name(&ctx.user) else {
        return Ok(());
    };
    let component = ctx.rr.namespace == "kube-system"
        && skiff_rbac::skiff_policy::NODE_COMPONENT_SERVICE_ACCOUNTS.contains(&service_account);
    match binding {
        TokenBinding::Node(bound) if component && bound == node => Ok(()),
        TokenBinding::Node(_) if component => Err(forbidden(format!(
            "node requested token for {service_account} bound to a different node"
        ))),
        _ if component => Err(forbidden(format!(
            "node requested token for {service_account} not bound to its own node"
        ))),
        TokenBinding::Nothing => Err(forbidden("node requested token not bound to a pod".to_string())),
        TokenBinding::Node(_) => Err(forbidden(
            "node requested token bound to an object of kind Node, not a pod".to_string(),
        )),
        TokenBinding::Other(kind) => Err(forbidden(format!(
            "node requested token bound to an object of kind {kind}, not a pod"
        ))),
        TokenBinding::Pod(on) if on != Some(node) => Err(forbidden(
            "node requested token bound to a pod scheduled on a different node".to_string(),
        )),
        TokenBinding::Pod(_) => Ok(()),
    }
}

/// Upstream's `admitPVCStatus`: a node changes only the capacity, conditions and allocated
/// resources of a claim's status (what volume expansion reports).
fn admit_claim_status(node: &str, new: &Value, old: &Value) -> Result<(), StatusError> {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(md) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            md.remove("resourceVersion");
            md.remove("managedFields");
        }
        if let Some(status) = v.get_mut("status").and_then(Value::as_object_mut) {
            for k in [
                "capacity",
                "conditions",
                "allocatedResourceStatuses",
                "allocatedResources",
            ] {
                status.remove(k);
            }
        }
        v
    };
    let (o, n) = (strip(old), strip(new));
    let mut diff = Vec::new();
    let null = Value::Null;
    let keys: BTreeSet<&String> = [&o, &n]
        .iter()
        .filter_map(|v| v.as_object())
        .flat_map(|m| m.keys())
        .collect();
    for k in keys {
        skiff_api::validation::diff_paths(k, o.get(k).unwrap_or(&null), n.get(k).unwrap_or(&null), &mut diff);
    }
    if diff.is_empty() {
        return Ok(());
    }
    Err(StatusError::forbidden_resource(
        "",
        "persistentvolumeclaims",
        crate::objects::name(new),
        &format!(
            "node \"{node}\" is not allowed to update fields other than status.capacity and status.conditions: {}",
            diff.join("\n")
        ),
    ))
}

/// Whether a PersistentVolume is one the local-path provisioner of `node` makes: annotated as
/// provisioned by it, and usable on `node` alone (one required term, one `kubernetes.io/hostname
/// In [node]` requirement).
fn local_path_volume_of(node: &str, pv: &Value) -> bool {
    let provisioner = pv
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(ANN_DYNAMICALLY_PROVISIONED))
        .and_then(Value::as_str);
    let terms = pv
        .pointer("/spec/nodeAffinity/required/nodeSelectorTerms")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let only_here = match terms {
        [term] => {
            let fields = term
                .get("matchFields")
                .and_then(Value::as_array)
                .is_some_and(|f| !f.is_empty());
            match term
                .get("matchExpressions")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
            {
                Some([expr]) => {
                    !fields
                        && expr.get("key").and_then(Value::as_str) == Some("kubernetes.io/hostname")
                        && expr.get("operator").and_then(Value::as_str) == Some("In")
                        && expr.get("values") == Some(&serde_json::json!([node]))
                }
                _ => false,
            }
        }
        _ => false,
    };
    provisioner == Some(LOCAL_PATH_PROVISIONER) && only_here
}

fn local_path_refusal(node: &str, name: &str) -> StatusError {
    StatusError::forbidden_resource(
        "",
        "persistentvolumes",
        name,
        &format!(
            "node \"{node}\" can only write PersistentVolumes provisioned by {LOCAL_PATH_PROVISIONER} with node affinity to itself"
        ),
    )
}

fn taints_empty(node: &Value) -> bool {
    node.pointer("/spec/taints")
        .and_then(Value::as_array)
        .is_none_or(|t| t.is_empty())
}

fn domain(label: &str) -> &str {
    label.split_once('/').map(|(d, _)| d).unwrap_or("")
}

fn restricted_domain(label: &str) -> bool {
    let d = domain(label);
    d == NODE_RESTRICTION_DOMAIN || d.ends_with(&format!(".{NODE_RESTRICTION_DOMAIN}"))
}

fn is_kubernetes_label(label: &str) -> bool {
    let d = domain(label);
    d == "kubernetes.io" || d.ends_with(".kubernetes.io") || d == "k8s.io" || d.ends_with(".k8s.io")
}

/// The labels a kubelet may set on its Node (upstream's `kubeletapis.IsKubeletLabel`).
fn is_kubelet_label(label: &str) -> bool {
    const LABELS: &[&str] = &[
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "kubernetes.io/os",
        "kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/arch",
    ];
    if LABELS.contains(&label) {
        return true;
    }
    let d = domain(label);
    ["kubelet.kubernetes.io", "node.kubernetes.io"]
        .iter()
        .any(|ns| d == *ns || d.ends_with(&format!(".{ns}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_write_only_their_own_local_path_volumes() {
        let pv = |node: &str| {
            serde_json::json!({
                "metadata": {"name": "pvc-1", "annotations": {ANN_DYNAMICALLY_PROVISIONED: LOCAL_PATH_PROVISIONER}},
                "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}
                ]}}},
            })
        };
        assert!(local_path_volume_of("n1", &pv("n1")));
        assert!(!local_path_volume_of("n2", &pv("n1")));
        let mut other = pv("n1");
        other["metadata"]["annotations"][ANN_DYNAMICALLY_PROVISIONED] = "rancher.io/local-path".into();
        assert!(!local_path_volume_of("n1", &other));
        // Usable elsewhere too: refused.
        let mut wider = pv("n1");
        wider["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] =
            serde_json::json!(["n1", "n2"]);
        assert!(!local_path_volume_of("n1", &wider));
        let mut two_terms = pv("n1");
        two_terms["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"] = serde_json::json!([pv("n1")["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0], {"matchExpressions": []}]);
        assert!(!local_path_volume_of("n1", &two_terms));
        let mut unpinned = pv("n1");
        unpinned["spec"].as_object_mut().unwrap().remove("nodeAffinity");
        assert!(!local_path_volume_of("n1", &unpinned));
    }

    #[test]
    fn nodes_change_only_what_expansion_reports_in_a_claim_status() {
        let old = serde_json::json!({
            "metadata": {"name": "data", "resourceVersion": "5"},
            "spec": {"volumeName": "pvc-1"},
            "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}},
        });
        let mut grown = old.clone();
        grown["metadata"]["resourceVersion"] = "6".into();
        grown["status"]["capacity"]["storage"] = "2Gi".into();
        grown["status"]["allocatedResources"] = serde_json::json!({"storage": "2Gi"});
        grown["status"]["allocatedResourceStatuses"] = serde_json::json!({"storage": "ControllerResizeInProgress"});
        grown["status"]["conditions"] = serde_json::json!([{"type": "Resizing", "status": "True"}]);
        assert!(admit_claim_status("n1", &grown, &old).is_ok());
        let mut lost = old.clone();
        lost["status"]["phase"] = "Lost".into();
        let err = admit_claim_status("n1", &lost, &old).unwrap_err();
        assert!(
            err.message.starts_with(
                "persistentvolumeclaims \"data\" is forbidden: node \"n1\" is not allowed to update fields other \
                 than status.capacity and status.conditions: "
            ),
            "{}",
            err.message
        );
        assert!(err.message.contains("status.phase"), "{}", err.message);
    }

    #[test]
    fn a_node_dns_slice_names_only_itself_and_its_own_addresses() {
        let node = serde_json::json!({
            "metadata": {"name": "n1", "uid": "u1"},
            "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]},
            "status": {"addresses": [{"type": "InternalIP", "address": "192.168.5.10"}]},
        });
        let slice = |node_name: &str, address: &str| {
            serde_json::json!({
                "metadata": {
                    "name": "kube-dns-n1", "namespace": "kube-system",
                    "labels": {
                        "kubernetes.io/service-name": "kube-dns",
                        "endpointslice.kubernetes.io/managed-by": "node-agent.skiff.io",
                        "k8s-app": "kube-dns",
                    },
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u1"}],
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": [address], "nodeName": node_name}],
            })
        };
        assert!(admit_dns_slice("n1", &slice("n1", "10.244.1.1"), &node).is_ok());
        assert!(admit_dns_slice("n1", &slice("n1", "192.168.5.10"), &node).is_ok());
        let e = admit_dns_slice("n1", &slice("n2", "10.244.1.1"), &node).unwrap_err();
        assert_eq!(e.code, 403);
        assert!(
            e.message
                .contains("can only write endpoints with nodeName set to itself"),
            "{}",
            e.message
        );
        let e = admit_dns_slice("n1", &slice("n1", "10.244.2.1"), &node).unwrap_err();
        assert!(e.message.contains("not \"10.244.2.1\""), "{}", e.message);
        // Another Service's label would send that Service's traffic here.
        let mut other = slice("n1", "10.244.1.1");
        other["metadata"]["labels"]["kubernetes.io/service-name"] = "web".into();
        assert!(admit_dns_slice("n1", &other, &node).is_err());
        let mut extra = slice("n1", "10.244.1.1");
        extra["metadata"]["labels"]["x"] = "y".into();
        assert!(admit_dns_slice("n1", &extra, &node).is_err());
        let mut owned = slice("n1", "10.244.1.1");
        owned["metadata"]["ownerReferences"][0]["name"] = "n2".into();
        assert!(admit_dns_slice("n1", &owned, &node).is_err());
    }

    #[test]
    fn kubelet_labels() {
        assert!(is_kubelet_label("kubernetes.io/hostname"));
        assert!(is_kubelet_label(
            "node.kubernetes.io/exclude-from-external-load-balancers"
        ));
        assert!(!is_kubelet_label("node-role.kubernetes.io/control-plane"));
        assert!(restricted_domain("node-restriction.kubernetes.io/pool"));
        assert!(restricted_domain("x.node-restriction.kubernetes.io/pool"));
        assert!(!restricted_domain("example.com/pool"));
        assert!(is_kubernetes_label("node-role.kubernetes.io/worker"));
        assert!(!is_kubernetes_label("example.com/x"));
    }
}
