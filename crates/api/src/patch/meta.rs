//! Upstream's list metadata (struct tags `patchStrategy`, `patchMergeKey`, `listType`,
//! `listMapKeys`) for the served types, keyed by schema definition and property.
//!
//! The table follows the Go struct tags and `+listType` / `+listMapKey` markers of
//! `k8s.io/api/{core,apps,batch,policy,rbac}/v1` and `k8s.io/apimachinery/pkg/apis/meta/v1`.
//! Lists that are not named here have no patch strategy (a strategic merge patch replaces
//! them) and are atomic for server-side apply.

/// How a list property merges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListMeta {
    /// "merge", "replace", "retainKeys" or "merge,retainKeys".
    pub patch_strategy: Option<&'static str>,
    pub patch_merge_key: Option<&'static str>,
    /// "atomic", "set" or "map".
    pub list_type: Option<&'static str>,
    pub list_map_keys: &'static [&'static str],
}

const CORE: &str = "io.k8s.api.core.v1.";
const APPS: &str = "io.k8s.api.apps.v1.";
const BATCH: &str = "io.k8s.api.batch.v1.";
const POLICY: &str = "io.k8s.api.policy.v1.";
const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.";
const RBAC: &str = "io.k8s.api.rbac.v1.";

/// `patchStrategy:"merge" patchMergeKey:KEY` with `+listType=map +listMapKey=KEYS`.
const fn merge_map(key: &'static str, keys: &'static [&'static str]) -> ListMeta {
    ListMeta {
        patch_strategy: Some("merge"),
        patch_merge_key: Some(key),
        list_type: Some("map"),
        list_map_keys: keys,
    }
}

/// `patchStrategy:"merge,retainKeys" patchMergeKey:KEY` with `+listType=map +listMapKey=KEY`.
const fn merge_retain_map(key: &'static str, keys: &'static [&'static str]) -> ListMeta {
    ListMeta {
        patch_strategy: Some("merge,retainKeys"),
        patch_merge_key: Some(key),
        list_type: Some("map"),
        list_map_keys: keys,
    }
}

/// `patchStrategy:"merge" patchMergeKey:KEY` with `+listType=atomic`.
const fn merge_atomic(key: &'static str) -> ListMeta {
    ListMeta {
        patch_strategy: Some("merge"),
        patch_merge_key: Some(key),
        list_type: Some("atomic"),
        list_map_keys: &[],
    }
}

/// `patchStrategy:"merge" patchMergeKey:KEY` and no list type (server-side apply keys on KEY).
const fn merge_only(key: &'static str) -> ListMeta {
    ListMeta {
        patch_strategy: Some("merge"),
        patch_merge_key: Some(key),
        list_type: None,
        list_map_keys: &[],
    }
}

/// `patchStrategy:"merge"` with `+listType=set`: a set of primitives, unioned by a patch.
const MERGE_SET: ListMeta = ListMeta {
    patch_strategy: Some("merge"),
    patch_merge_key: None,
    list_type: Some("set"),
    list_map_keys: &[],
};

/// `+listType=atomic`: replaced as a whole.
const ATOMIC: ListMeta = ListMeta {
    patch_strategy: None,
    patch_merge_key: None,
    list_type: Some("atomic"),
    list_map_keys: &[],
};

/// `+listType=set` without a patch strategy.
const SET: ListMeta = ListMeta {
    patch_strategy: None,
    patch_merge_key: None,
    list_type: Some("set"),
    list_map_keys: &[],
};

/// `+listType=map` without a patch strategy.
const fn map_only(keys: &'static [&'static str]) -> ListMeta {
    ListMeta {
        patch_strategy: None,
        patch_merge_key: None,
        list_type: Some("map"),
        list_map_keys: keys,
    }
}

/// `patchStrategy:"retainKeys"` on a struct field (a union whose other members a patch clears).
const RETAIN_KEYS: ListMeta = ListMeta {
    patch_strategy: Some("retainKeys"),
    patch_merge_key: None,
    list_type: None,
    list_map_keys: &[],
};

const BY_NAME: &[&str] = &["name"];
const BY_TYPE: &[&str] = &["type"];
const CONDITIONS: ListMeta = merge_map("type", BY_TYPE);

fn core(ty: &str, prop: &str) -> Option<ListMeta> {
    let meta = match (ty, prop) {
        // Pod
        ("PodSpec", "volumes") => merge_retain_map("name", BY_NAME),
        ("PodSpec", "initContainers" | "containers" | "ephemeralContainers") => merge_map("name", BY_NAME),
        ("PodSpec", "imagePullSecrets") => merge_map("name", BY_NAME),
        ("PodSpec", "hostAliases") => merge_map("ip", &["ip"]),
        ("PodSpec", "topologySpreadConstraints") => merge_map("topologyKey", &["topologyKey", "whenUnsatisfiable"]),
        ("PodSpec", "schedulingGates") => merge_map("name", BY_NAME),
        ("PodSpec", "resourceClaims") => merge_retain_map("name", BY_NAME),
        ("PodSpec", "tolerations" | "readinessGates") => ATOMIC,
        ("Container" | "EphemeralContainer", "ports") => merge_map("containerPort", &["containerPort", "protocol"]),
        ("Container" | "EphemeralContainer", "env") => merge_map("name", BY_NAME),
        ("Container" | "EphemeralContainer", "volumeMounts") => merge_map("mountPath", &["mountPath"]),
        ("Container" | "EphemeralContainer", "volumeDevices") => merge_map("devicePath", &["devicePath"]),
        ("Container" | "EphemeralContainer", "command" | "args" | "envFrom" | "resizePolicy") => ATOMIC,
        ("ResourceRequirements", "claims") => map_only(BY_NAME),
        ("Capabilities", "add" | "drop") => ATOMIC,
        ("PodSecurityContext", "supplementalGroups" | "sysctls") => ATOMIC,
        ("LinuxContainerUser", "supplementalGroups") => ATOMIC,
        ("PodDNSConfig", "nameservers" | "searches" | "options") => ATOMIC,
        ("HostAlias", "hostnames") => ATOMIC,
        ("ExecAction", "command") => ATOMIC,
        ("HTTPGetAction", "httpHeaders") => ATOMIC,
        ("TopologySpreadConstraint", "matchLabelKeys") => ATOMIC,
        ("NodeAffinity", "preferredDuringSchedulingIgnoredDuringExecution") => ATOMIC,
        ("NodeSelector", "nodeSelectorTerms") => ATOMIC,
        ("NodeSelectorTerm", "matchExpressions" | "matchFields") => ATOMIC,
        ("NodeSelectorRequirement", "values") => ATOMIC,
        (
            "PodAffinity" | "PodAntiAffinity",
            "requiredDuringSchedulingIgnoredDuringExecution" | "preferredDuringSchedulingIgnoredDuringExecution",
        ) => ATOMIC,
        ("PodAffinityTerm", "namespaces" | "matchLabelKeys" | "mismatchLabelKeys") => ATOMIC,
        (
            "ConfigMapVolumeSource"
            | "SecretVolumeSource"
            | "DownwardAPIVolumeSource"
            | "ConfigMapProjection"
            | "SecretProjection"
            | "DownwardAPIProjection",
            "items",
        ) => ATOMIC,
        ("ProjectedVolumeSource", "sources") => ATOMIC,
        (
            "CephFSVolumeSource" | "CephFSPersistentVolumeSource" | "RBDVolumeSource" | "RBDPersistentVolumeSource",
            "monitors",
        ) => ATOMIC,
        ("ISCSIVolumeSource" | "ISCSIPersistentVolumeSource", "portals") => ATOMIC,
        ("FCVolumeSource", "targetWWNs" | "wwids") => ATOMIC,
        ("PodStatus", "conditions") => CONDITIONS,
        ("PodStatus", "podIPs") => merge_map("ip", &["ip"]),
        ("PodStatus", "hostIPs") => merge_atomic("ip"),
        ("PodStatus", "containerStatuses" | "initContainerStatuses" | "ephemeralContainerStatuses") => ATOMIC,
        ("PodStatus", "resourceClaimStatuses") => merge_retain_map("name", BY_NAME),
        ("ContainerStatus", "volumeMounts") => merge_map("mountPath", &["mountPath"]),
        ("ContainerStatus", "allocatedResourcesStatus") => map_only(BY_NAME),
        ("ResourceStatus", "resources") => map_only(&["resourceID"]),
        // Node
        ("NodeSpec", "podCIDRs") => MERGE_SET,
        ("NodeSpec", "taints") => ATOMIC,
        ("NodeStatus", "conditions") => CONDITIONS,
        ("NodeStatus", "addresses") => merge_map("type", BY_TYPE),
        ("NodeStatus", "images" | "volumesInUse" | "volumesAttached" | "runtimeHandlers") => ATOMIC,
        ("ContainerImage", "names") => ATOMIC,
        // Namespace
        ("NamespaceSpec", "finalizers") => ATOMIC,
        ("NamespaceStatus", "conditions") => CONDITIONS,
        // Service and Endpoints
        ("ServiceSpec", "ports") => merge_map("port", &["port", "protocol"]),
        ("ServiceSpec", "clusterIPs" | "externalIPs" | "loadBalancerSourceRanges" | "ipFamilies") => ATOMIC,
        ("ServiceStatus", "conditions") => CONDITIONS,
        ("LoadBalancerStatus", "ingress") => ATOMIC,
        ("LoadBalancerIngress", "ports") => ATOMIC,
        ("Endpoints", "subsets") => ATOMIC,
        ("EndpointSubset", "addresses" | "notReadyAddresses" | "ports") => ATOMIC,
        // ServiceAccount
        ("ServiceAccount", "secrets") => merge_only("name"),
        ("ServiceAccount", "imagePullSecrets") => ATOMIC,
        // Persistent volumes
        ("PersistentVolumeSpec", "accessModes" | "mountOptions") => ATOMIC,
        ("PersistentVolumeClaimSpec", "accessModes") => ATOMIC,
        ("PersistentVolumeClaimStatus", "accessModes") => ATOMIC,
        ("PersistentVolumeClaimStatus", "conditions") => CONDITIONS,
        _ => return None,
    };
    Some(meta)
}

fn apps(ty: &str, prop: &str) -> Option<ListMeta> {
    let meta = match (ty, prop) {
        ("DeploymentSpec", "strategy") => RETAIN_KEYS,
        ("DeploymentStatus", "conditions") => CONDITIONS,
        ("ReplicaSetStatus", "conditions") => CONDITIONS,
        ("StatefulSetSpec", "volumeClaimTemplates") => ATOMIC,
        ("StatefulSetStatus", "conditions") => CONDITIONS,
        ("DaemonSetStatus", "conditions") => CONDITIONS,
        _ => return None,
    };
    Some(meta)
}

fn batch(ty: &str, prop: &str) -> Option<ListMeta> {
    let meta = match (ty, prop) {
        ("JobStatus", "conditions") => merge_atomic("type"),
        ("PodFailurePolicy", "rules") => ATOMIC,
        ("PodFailurePolicyRule", "onPodConditions") => ATOMIC,
        ("PodFailurePolicyOnExitCodesRequirement", "values") => SET,
        ("SuccessPolicy", "rules") => ATOMIC,
        ("UncountedTerminatedPods", "succeeded" | "failed") => SET,
        ("CronJobStatus", "active") => ATOMIC,
        _ => return None,
    };
    Some(meta)
}

/// Every list of rbac/v1 is `+listType=atomic`, without a patch strategy.
fn rbac(ty: &str, prop: &str) -> Option<ListMeta> {
    match (ty, prop) {
        ("Role" | "ClusterRole", "rules")
        | ("RoleBinding" | "ClusterRoleBinding", "subjects")
        | ("AggregationRule", "clusterRoleSelectors")
        | ("PolicyRule", "verbs" | "apiGroups" | "resources" | "resourceNames" | "nonResourceURLs") => Some(ATOMIC),
        _ => None,
    }
}

fn meta_v1(ty: &str, prop: &str) -> Option<ListMeta> {
    let meta = match (ty, prop) {
        ("ObjectMeta", "finalizers") => MERGE_SET,
        ("ObjectMeta", "ownerReferences") => merge_map("uid", &["uid"]),
        ("ObjectMeta", "managedFields") => ATOMIC,
        ("LabelSelector", "matchExpressions") => ATOMIC,
        ("LabelSelectorRequirement", "values") => ATOMIC,
        ("StatusDetails", "causes") => ATOMIC,
        ("DeleteOptions", "dryRun") => ATOMIC,
        _ => return None,
    };
    Some(meta)
}

/// The metadata of property `prop` of definition `def` ("io.k8s.api.core.v1.PodSpec", "containers").
pub fn list_meta(def: &str, prop: &str) -> Option<ListMeta> {
    if let Some(ty) = def.strip_prefix(CORE) {
        core(ty, prop)
    } else if let Some(ty) = def.strip_prefix(APPS) {
        apps(ty, prop)
    } else if let Some(ty) = def.strip_prefix(BATCH) {
        batch(ty, prop)
    } else if let Some(ty) = def.strip_prefix(POLICY) {
        match (ty, prop) {
            ("PodDisruptionBudgetStatus", "conditions") => Some(CONDITIONS),
            _ => None,
        }
    } else if let Some(ty) = def.strip_prefix(RBAC) {
        rbac(ty, prop)
    } else if let Some(ty) = def.strip_prefix(META) {
        meta_v1(ty, prop)
    } else {
        None
    }
}

/// Whether a struct is `+structType=atomic` upstream: server-side apply owns and replaces
/// it as a whole.
pub fn is_atomic_struct(def: &str) -> bool {
    if let Some(ty) = def.strip_prefix(META) {
        return ty == "LabelSelector";
    }
    if let Some(ty) = def.strip_prefix(RBAC) {
        return matches!(ty, "RoleRef" | "Subject");
    }
    let Some(ty) = def.strip_prefix(CORE) else {
        return false;
    };
    matches!(
        ty,
        "NodeSelector"
            | "NodeSelectorTerm"
            | "ObjectReference"
            | "LocalObjectReference"
            | "TypedLocalObjectReference"
            | "ConfigMapKeySelector"
            | "SecretKeySelector"
            | "ObjectFieldSelector"
            | "ResourceFieldSelector"
            | "ConfigMapEnvSource"
            | "SecretEnvSource"
            | "TopologySelectorTerm"
    )
}

/// Whether map property `prop` of `def` is `+mapType=atomic` upstream.
pub fn is_atomic_map(def: &str, prop: &str) -> bool {
    def == "io.k8s.api.core.v1.PodSpec" && prop == "nodeSelector"
}

/// The value server-side apply assumes for a list-map key the object leaves out
/// (upstream's schemas default `protocol` to "TCP").
pub fn key_default(key: &str) -> Option<&'static str> {
    match key {
        "protocol" => Some("TCP"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_lists() {
        let c = list_meta("io.k8s.api.core.v1.PodSpec", "containers").expect("containers");
        assert_eq!(c.patch_strategy, Some("merge"));
        assert_eq!(c.patch_merge_key, Some("name"));
        let v = list_meta("io.k8s.api.core.v1.PodSpec", "volumes").expect("volumes");
        assert_eq!(v.patch_strategy, Some("merge,retainKeys"));
        let p = list_meta("io.k8s.api.core.v1.Container", "ports").expect("ports");
        assert_eq!(p.patch_merge_key, Some("containerPort"));
        assert_eq!(p.list_map_keys, &["containerPort", "protocol"]);
        let t = list_meta("io.k8s.api.core.v1.PodSpec", "tolerations").expect("tolerations");
        assert_eq!(t.patch_strategy, None);
        let taints = list_meta("io.k8s.api.core.v1.NodeSpec", "taints").expect("taints");
        assert_eq!(taints.patch_strategy, None);
    }

    #[test]
    fn meta_lists() {
        let f = list_meta("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", "finalizers").expect("finalizers");
        assert_eq!(f.patch_strategy, Some("merge"));
        assert_eq!(f.patch_merge_key, None);
        let o =
            list_meta("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", "ownerReferences").expect("ownerReferences");
        assert_eq!(o.patch_merge_key, Some("uid"));
    }

    #[test]
    fn rbac_references_are_atomic() {
        // `+structType=atomic` on rbac/v1 RoleRef and Subject: an applier owns them whole.
        assert!(is_atomic_struct("io.k8s.api.rbac.v1.RoleRef"));
        assert!(is_atomic_struct("io.k8s.api.rbac.v1.Subject"));
        assert!(!is_atomic_struct("io.k8s.api.rbac.v1.PolicyRule"));
        // Their lists are atomic with no patch strategy: a patch replaces them, apply owns them whole.
        for (def, prop) in [
            ("io.k8s.api.rbac.v1.RoleBinding", "subjects"),
            ("io.k8s.api.rbac.v1.ClusterRoleBinding", "subjects"),
            ("io.k8s.api.rbac.v1.Role", "rules"),
            ("io.k8s.api.rbac.v1.ClusterRole", "rules"),
            ("io.k8s.api.rbac.v1.AggregationRule", "clusterRoleSelectors"),
            ("io.k8s.api.rbac.v1.PolicyRule", "nonResourceURLs"),
        ] {
            assert_eq!(list_meta(def, prop), Some(ATOMIC), "{def} {prop}");
        }
        let subjects = crate::schema::property("io.k8s.api.rbac.v1.RoleBinding", "subjects").expect("subjects");
        assert_eq!(subjects["x-kubernetes-list-type"], "atomic");
        assert!(subjects.get("x-kubernetes-patch-strategy").is_none());
    }

    #[test]
    fn every_entry_names_an_existing_property() {
        // Guards against typos: each (definition, property) in the table must exist.
        let mut found = 0;
        for (name, def) in crate::schema::definitions() {
            let Some(props) = def.get("properties").and_then(serde_json::Value::as_object) else {
                continue;
            };
            for prop in props.keys() {
                if list_meta(name, prop).is_some() {
                    found += 1;
                }
            }
        }
        assert!(found > 80, "only {found} list properties carry metadata");
        let spec = crate::schema::property("io.k8s.api.core.v1.PodSpec", "containers").expect("containers");
        assert_eq!(spec["x-kubernetes-patch-merge-key"], "name");
    }
}
