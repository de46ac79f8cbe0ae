//! PersistentVolume and claim rules shared by the PV binder controller and the scheduler, as
//! upstream's `k8s.io/component-helpers/storage/volume` (`pv_helpers.go`, `helpers.go`): the
//! storage annotations, class and mode checks, `FindMatchingVolume` (the controller's path
//! without a node, the scheduler's with one), `CheckNodeAffinity` (on `nodeaffinity.rs`'s node
//! selectors), `GetBindVolumeToClaim`, and the topology term matching they need (upstream's
//! `v1helper.MatchTopologySelectorTerms`).
//! Also the small getters every storage component reads objects with (phases, claim key, volume
//! name, quantities, reclaim policy). Pure functions over the typed objects; no I/O.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim, TopologySelectorTerm};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use crate::quantity::Quantity;
use crate::selector::LabelSelector;

/// On a claim: binding has completed once (the claim is no longer new).
pub const ANN_BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
/// On a volume or claim: the binding was made by a controller (or the scheduler), not
/// pre-bound by the user.
pub const ANN_BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
/// On a volume: the plugin that provisioned it.
pub const ANN_DYNAMICALLY_PROVISIONED: &str = "pv.kubernetes.io/provisioned-by";
/// On a claim: the node the scheduler chose, asking for provisioning there.
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// On a claim: the provisioner expected to create its volume.
pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
pub const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// The storage class as an annotation, which wins over `storageClassName`.
pub const ANN_BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";
/// On a StorageClass: it is the cluster's default class (upstream's
/// `IsDefaultStorageClassAnnotation`), and its beta predecessor, still honoured.
pub const ANN_IS_DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";
pub const ANN_BETA_IS_DEFAULT_CLASS: &str = "storageclass.beta.kubernetes.io/is-default-class";
/// A class's provisioner that says the class cannot provision (static volumes only).
pub const NOT_SUPPORTED_PROVISIONER: &str = "kubernetes.io/no-provisioner";
/// The provisioner of the default `local-path` class: each node agent provisions the claims
/// scheduled to its node.
pub const LOCAL_PATH_PROVISIONER: &str = "skiff.dev/local-path";

/// A volume's phases (`status.phase`).
pub const VOLUME_AVAILABLE: &str = "Available";
pub const VOLUME_BOUND: &str = "Bound";
pub const VOLUME_RELEASED: &str = "Released";
pub const VOLUME_FAILED: &str = "Failed";
/// A claim's phases (`status.phase`).
pub const CLAIM_PENDING: &str = "Pending";
pub const CLAIM_BOUND: &str = "Bound";
pub const CLAIM_LOST: &str = "Lost";

/// An annotation's value.
pub fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// Upstream's `GetPersistentVolumeClaimClass`: the beta annotation, else `storageClassName`,
/// else "" (no class).
pub fn claim_class(claim: &PersistentVolumeClaim) -> &str {
    if let Some(c) = annotation(&claim.metadata, ANN_BETA_STORAGE_CLASS) {
        return c;
    }
    claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .unwrap_or_default()
}

/// Upstream's `PersistentVolumeClaimHasClass`: the beta annotation or `storageClassName` is set,
/// even to "" (which asks for no class).
pub fn claim_has_class(claim: &PersistentVolumeClaim) -> bool {
    annotation(&claim.metadata, ANN_BETA_STORAGE_CLASS).is_some()
        || claim.spec.as_ref().is_some_and(|s| s.storage_class_name.is_some())
}

/// Upstream's `IsDefaultAnnotation`: either default-class annotation set to "true".
pub fn is_default_class(meta: &ObjectMeta) -> bool {
    [ANN_IS_DEFAULT_CLASS, ANN_BETA_IS_DEFAULT_CLASS]
        .iter()
        .any(|a| annotation(meta, a) == Some("true"))
}

/// Upstream's `GetDefaultClass`: of the classes annotated as default, the newest, then the first
/// by name.
pub fn default_class(classes: &[StorageClass]) -> Option<&StorageClass> {
    classes.iter().filter(|c| is_default_class(&c.metadata)).min_by(|a, b| {
        let created = |c: &StorageClass| c.metadata.creation_timestamp.as_ref().map(|t| t.0);
        created(b)
            .cmp(&created(a))
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    })
}

/// Upstream's `GetPersistentVolumeClass`.
pub fn volume_class(pv: &PersistentVolume) -> &str {
    if let Some(c) = annotation(&pv.metadata, ANN_BETA_STORAGE_CLASS) {
        return c;
    }
    pv.spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .unwrap_or_default()
}

/// The getter of an object as JSON (as the admission plugins and printers see it) matching
/// [`claim_class`] and [`volume_class`]: the beta annotation, else `spec.storageClassName`, else "".
pub fn class_of(obj: &Value) -> &str {
    obj.pointer("/metadata/annotations")
        .and_then(|a| a.get(ANN_BETA_STORAGE_CLASS))
        .and_then(Value::as_str)
        .or_else(|| obj.pointer("/spec/storageClassName").and_then(Value::as_str))
        .unwrap_or_default()
}

/// The claim's `spec.volumeName`, when it names a volume.
pub fn claim_volume_name(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim.spec.as_ref()?.volume_name.as_deref().filter(|n| !n.is_empty())
}

/// The claim's phase ("" before the binder has set one).
pub fn claim_phase(claim: &PersistentVolumeClaim) -> &str {
    claim
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

/// The volume's phase ("" before the binder has set one).
pub fn volume_phase(pv: &PersistentVolume) -> &str {
    pv.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default()
}

/// The volume's `persistentVolumeReclaimPolicy`; unset is the API's default, Retain.
pub fn reclaim_policy(pv: &PersistentVolume) -> &str {
    pv.spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        .unwrap_or("Retain")
}

/// A quantity as the matching compares it; a missing or unparsable one counts as zero.
pub fn storage(q: Option<&K8sQuantity>) -> Quantity {
    q.and_then(|q| Quantity::parse(&q.0).ok()).unwrap_or_default()
}

/// The claim's `resources.requests.storage`, as written.
pub fn claim_request(claim: &PersistentVolumeClaim) -> Option<&K8sQuantity> {
    claim
        .spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")
}

/// The claim's `status.capacity.storage`, as written.
pub fn claim_capacity(claim: &PersistentVolumeClaim) -> Option<&K8sQuantity> {
    claim.status.as_ref()?.capacity.as_ref()?.get("storage")
}

/// The volume's `capacity.storage`, as written.
pub fn volume_capacity(pv: &PersistentVolume) -> Option<&K8sQuantity> {
    pv.spec.as_ref()?.capacity.as_ref()?.get("storage")
}

/// The claim's `resources.requests.storage`.
pub fn requested_storage(claim: &PersistentVolumeClaim) -> Quantity {
    storage(claim_request(claim))
}

/// The volume's `capacity.storage`.
pub fn volume_storage(pv: &PersistentVolume) -> Quantity {
    storage(volume_capacity(pv))
}

/// The claim's access modes.
pub fn claim_access_modes(claim: &PersistentVolumeClaim) -> &[String] {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.access_modes.as_deref())
        .unwrap_or_default()
}

/// The volume's access modes.
pub fn volume_access_modes(pv: &PersistentVolume) -> &[String] {
    pv.spec
        .as_ref()
        .and_then(|s| s.access_modes.as_deref())
        .unwrap_or_default()
}

/// Upstream's `CheckVolumeModeMismatches`: an unset mode is Filesystem.
pub fn volume_mode_mismatch(claim: &PersistentVolumeClaim, pv: &PersistentVolume) -> bool {
    let claim_mode = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_mode.as_deref())
        .unwrap_or("Filesystem");
    let pv_mode = pv
        .spec
        .as_ref()
        .and_then(|s| s.volume_mode.as_deref())
        .unwrap_or("Filesystem");
    claim_mode != pv_mode
}

/// Upstream's `CheckAccessModes`: the volume offers every mode the claim asks for.
pub fn check_access_modes(claim: &PersistentVolumeClaim, pv: &PersistentVolume) -> bool {
    let offered = volume_access_modes(pv);
    claim_access_modes(claim).iter().all(|m| offered.contains(m))
}

/// Upstream's `IsVolumeBoundToClaim`: the volume's claimRef names the claim (and its uid, when
/// the claimRef has one).
pub fn is_volume_bound_to_claim(pv: &PersistentVolume, claim: &PersistentVolumeClaim) -> bool {
    let Some(r) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return false;
    };
    if r.name.as_deref().unwrap_or_default() != claim.metadata.name.as_deref().unwrap_or_default()
        || r.namespace.as_deref().unwrap_or_default() != claim.metadata.namespace.as_deref().unwrap_or_default()
    {
        return false;
    }
    match r.uid.as_deref().filter(|u| !u.is_empty()) {
        Some(uid) => claim.metadata.uid.as_deref() == Some(uid),
        None => true,
    }
}

/// Upstream's `claimToClaimKey`: `namespace/name`.
pub fn claim_key(claim: &PersistentVolumeClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Upstream's `FindMatchingVolume`: a volume pre-bound to the claim wins (when its node affinity
/// allows the node), else the smallest volume that is Available, large enough, of the claim's
/// class and volume mode, matching its selector and not being deleted.
///
/// `node_labels` is set only on the scheduler's path: then each volume's node affinity must
/// match the node and the access modes must fit (the controller groups volumes by access modes
/// before). `excluded` names volumes already chosen for the pod's other claims. With
/// `delay_binding` on the controller's path only pre-bound volumes are returned (the scheduler
/// binds the rest). Err when the claim's selector is invalid.
pub fn find_matching_volume<'a>(
    claim: &PersistentVolumeClaim,
    volumes: impl IntoIterator<Item = &'a PersistentVolume>,
    node_labels: Option<&BTreeMap<String, String>>,
    excluded: &[&str],
    delay_binding: bool,
) -> Result<Option<&'a PersistentVolume>, String> {
    let requested = requested_storage(claim);
    let class = claim_class(claim);
    let selector = match claim.spec.as_ref().and_then(|s| s.selector.as_ref()) {
        Some(s) => Some(LabelSelector::from_k8s(Some(s)).map_err(|e| {
            format!(
                "error creating internal label selector for claim: {}: {e}",
                claim_key(claim)
            )
        })?),
        None => None,
    };
    let mut smallest: Option<(&PersistentVolume, Quantity)> = None;
    for pv in volumes {
        if excluded.contains(&pv.metadata.name.as_deref().unwrap_or_default()) {
            continue;
        }
        let bound_here = is_volume_bound_to_claim(pv, claim);
        if pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).is_some() && !bound_here {
            continue;
        }
        let size = volume_storage(pv);
        if size < requested || volume_mode_mismatch(claim, pv) || pv.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let affinity_ok = node_labels.is_none_or(|labels| check_node_affinity(pv, labels).is_ok());
        if bound_here {
            // A pre-bound volume that does not suit the node means no match on this node.
            return Ok(affinity_ok.then_some(pv));
        }
        if node_labels.is_none() && delay_binding {
            continue;
        }
        // Volumes not yet Available are skipped: their sync makes them Available first.
        if volume_phase(pv) != VOLUME_AVAILABLE {
            continue;
        }
        if let Some(sel) = &selector {
            let matched = match &pv.metadata.labels {
                Some(l) => sel.matches(l),
                None => sel.matches(&BTreeMap::<String, String>::new()),
            };
            if !matched {
                continue;
            }
        }
        if volume_class(pv) != class || !affinity_ok {
            continue;
        }
        if node_labels.is_some() && !check_access_modes(claim, pv) {
            continue;
        }
        if smallest.as_ref().is_none_or(|(_, q)| *q > size) {
            smallest = Some((pv, size));
        }
    }
    Ok(smallest.map(|(pv, _)| pv))
}

/// Upstream's `CheckNodeAffinity`: the volume's required node affinity against a node's labels
/// (the node is known by its labels only, so `matchFields` terms are not checked).
pub fn check_node_affinity(pv: &PersistentVolume, node_labels: &BTreeMap<String, String>) -> Result<(), String> {
    let required = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref());
    match required {
        None => Ok(()),
        Some(sel) if crate::nodeaffinity::match_node_selector_terms(sel, None, node_labels) => Ok(()),
        Some(_) => Err("no matching NodeSelectorTerms".to_string()),
    }
}

/// The reference to a claim a volume's `claimRef` holds (upstream's `GetReference`).
pub fn claim_reference(claim: &PersistentVolumeClaim) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        name: claim.metadata.name.clone(),
        namespace: claim.metadata.namespace.clone(),
        uid: claim.metadata.uid.clone(),
        resource_version: claim.metadata.resource_version.clone(),
        field_path: None,
    }
}

/// Upstream's `GetBindVolumeToClaim`: the volume with its claimRef pointing at the claim (and
/// bound-by-controller when the user had not pre-bound it); `None` when nothing changes.
pub fn volume_bound_to_claim(pv: &PersistentVolume, claim: &PersistentVolumeClaim) -> Option<PersistentVolume> {
    let mut dirty = false;
    let set_by_controller = !is_volume_bound_to_claim(pv, claim);
    let mut out = pv.clone();
    let current = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    let same = current.is_some_and(|r| {
        r.name == claim.metadata.name
            && r.namespace.as_deref().unwrap_or_default() == claim.metadata.namespace.as_deref().unwrap_or_default()
            && r.uid.as_deref().unwrap_or_default() == claim.metadata.uid.as_deref().unwrap_or_default()
    });
    if !same {
        out.spec.get_or_insert_with(Default::default).claim_ref = Some(claim_reference(claim));
        dirty = true;
    }
    if set_by_controller && annotation(&out.metadata, ANN_BOUND_BY_CONTROLLER).is_none() {
        out.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(ANN_BOUND_BY_CONTROLLER.to_string(), "yes".to_string());
        dirty = true;
    }
    dirty.then_some(out)
}

/// Upstream's `MatchTopologySelectorTerms`: no terms match every node; otherwise some term's
/// expressions must all hold (the label present with one of the values).
pub fn match_topology_selector_terms(
    terms: Option<&[TopologySelectorTerm]>,
    labels: &BTreeMap<String, String>,
) -> bool {
    let terms = terms.unwrap_or_default();
    if terms.is_empty() {
        return true;
    }
    terms.iter().any(|t| {
        t.match_label_expressions
            .iter()
            .flatten()
            .all(|e| labels.get(&e.key).is_some_and(|v| e.values.iter().any(|x| x == v)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolumeClaimSpec, PersistentVolumeSpec,
        PersistentVolumeStatus, TopologySelectorLabelRequirement, VolumeNodeAffinity, VolumeResourceRequirements,
    };

    fn pv(name: &str, size: &str, class: &str, node: Option<&str>) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                capacity: Some([("storage".to_string(), K8sQuantity(size.into()))].into()),
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                storage_class_name: Some(class.into()),
                node_affinity: node.map(|n| VolumeNodeAffinity {
                    required: Some(NodeSelector {
                        node_selector_terms: vec![NodeSelectorTerm {
                            match_expressions: Some(vec![NodeSelectorRequirement {
                                key: "kubernetes.io/hostname".into(),
                                operator: "In".into(),
                                values: Some(vec![n.into()]),
                            }]),
                            match_fields: None,
                        }],
                    }),
                }),
                ..Default::default()
            }),
            status: Some(PersistentVolumeStatus {
                phase: Some("Available".into()),
                ..Default::default()
            }),
        }
    }

    fn pvc(name: &str, size: &str, modes: &[&str]) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(modes.iter().map(|m| m.to_string()).collect()),
                resources: Some(VolumeResourceRequirements {
                    requests: Some([("storage".to_string(), K8sQuantity(size.into()))].into()),
                    limits: None,
                }),
                storage_class_name: Some("local".into()),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn labels(host: &str) -> BTreeMap<String, String> {
        [("kubernetes.io/hostname".to_string(), host.to_string())].into()
    }

    fn name(v: Option<&PersistentVolume>) -> Option<&str> {
        v.and_then(|v| v.metadata.name.as_deref())
    }

    #[test]
    fn scheduler_path_checks_node_affinity_access_modes_and_exclusions() {
        let vols = [
            pv("a-small", "1Gi", "local", Some("a")),
            pv("b-small", "1Gi", "local", Some("b")),
            pv("a-big", "5Gi", "local", Some("a")),
            pv("anywhere", "10Gi", "local", None),
        ];
        let claim = pvc("c", "1Gi", &["ReadWriteOnce"]);
        let find = |node: &str, excluded: &[&str]| {
            name(find_matching_volume(&claim, &vols, Some(&labels(node)), excluded, true).unwrap()).map(str::to_string)
        };
        assert_eq!(find("a", &[]).as_deref(), Some("a-small"));
        assert_eq!(find("b", &[]).as_deref(), Some("b-small"));
        assert_eq!(find("c", &[]).as_deref(), Some("anywhere"));
        assert_eq!(find("a", &["a-small"]).as_deref(), Some("a-big"));
        // The scheduler checks access modes itself.
        let rwop = pvc("c", "1Gi", &["ReadWriteOncePod"]);
        assert!(
            find_matching_volume(&rwop, &vols, Some(&labels("a")), &[], true)
                .unwrap()
                .is_none()
        );
        // The controller's path with delayed binding returns only pre-bound volumes.
        assert!(find_matching_volume(&claim, &vols, None, &[], true).unwrap().is_none());
    }

    #[test]
    fn pre_bound_volume_on_another_node_is_no_match() {
        let mut reserved = pv("reserved", "1Gi", "other", Some("b"));
        reserved.spec.as_mut().unwrap().claim_ref = Some(ObjectReference {
            name: Some("c".into()),
            namespace: Some("default".into()),
            ..Default::default()
        });
        let vols = [pv("free", "1Gi", "local", Some("a")), reserved];
        let claim = pvc("c", "1Gi", &["ReadWriteOnce"]);
        assert!(
            find_matching_volume(&claim, &vols, Some(&labels("a")), &[], true)
                .unwrap()
                .is_none()
        );
        assert_eq!(
            name(find_matching_volume(&claim, &vols, Some(&labels("b")), &[], true).unwrap()),
            Some("reserved")
        );
    }

    #[test]
    fn volume_node_affinity_is_checked_on_labels() {
        let pv_a = pv("x", "1Gi", "local", Some("a"));
        assert!(check_node_affinity(&pv_a, &labels("a")).is_ok());
        assert_eq!(
            check_node_affinity(&pv_a, &labels("b")).unwrap_err(),
            "no matching NodeSelectorTerms"
        );
    }

    #[test]
    fn topology_terms() {
        let term = |key: &str, values: &[&str]| TopologySelectorTerm {
            match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
                key: key.into(),
                values: values.iter().map(|v| v.to_string()).collect(),
            }]),
        };
        let l = labels("a");
        assert!(match_topology_selector_terms(None, &l));
        assert!(match_topology_selector_terms(Some(&[]), &l));
        assert!(match_topology_selector_terms(
            Some(&[
                term("kubernetes.io/hostname", &["b"]),
                term("kubernetes.io/hostname", &["a"])
            ]),
            &l
        ));
        assert!(!match_topology_selector_terms(Some(&[term("zone", &["a"])]), &l));
    }

    #[test]
    fn binding_a_volume_to_a_claim() {
        let claim = pvc("data", "1Gi", &["ReadWriteOnce"]);
        let vol = pv("pv1", "1Gi", "local", None);
        let bound = volume_bound_to_claim(&vol, &claim).expect("changed");
        let r = bound.spec.as_ref().unwrap().claim_ref.as_ref().unwrap();
        assert_eq!(r.name.as_deref(), Some("data"));
        assert_eq!(r.uid.as_deref(), Some("uid-data"));
        assert_eq!(annotation(&bound.metadata, ANN_BOUND_BY_CONTROLLER), Some("yes"));
        assert!(volume_bound_to_claim(&bound, &claim).is_none());
        assert!(is_volume_bound_to_claim(&bound, &claim));
    }

    #[test]
    fn the_newest_default_class_and_claims_without_a_class() {
        let class = |name: &str, ann: Option<(&str, &str)>, created: i64| StorageClass {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations: ann.map(|(k, v)| [(k.to_string(), v.to_string())].into()),
                creation_timestamp: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    jiff::Timestamp::from_second(created).unwrap(),
                )),
                ..Default::default()
            },
            provisioner: "example.com/p".into(),
            ..Default::default()
        };
        let name = |c: Option<&StorageClass>| c.and_then(|c| c.metadata.name.clone());
        assert_eq!(name(default_class(&[class("plain", None, 10)])), None);
        let classes = [
            class("old", Some((ANN_IS_DEFAULT_CLASS, "true")), 10),
            class("not", Some((ANN_IS_DEFAULT_CLASS, "false")), 30),
            class("beta", Some((ANN_BETA_IS_DEFAULT_CLASS, "true")), 20),
            class("plain", None, 40),
        ];
        assert_eq!(name(default_class(&classes)).as_deref(), Some("beta"));
        // Equally new: the first by name.
        let tie = [
            class("b", Some((ANN_IS_DEFAULT_CLASS, "true")), 10),
            class("a", Some((ANN_IS_DEFAULT_CLASS, "true")), 10),
        ];
        assert_eq!(name(default_class(&tie)).as_deref(), Some("a"));

        let with_class = |class: Option<&str>| {
            let mut c = pvc("c", "1Gi", &["ReadWriteOnce"]);
            c.spec.as_mut().unwrap().storage_class_name = class.map(str::to_string);
            c
        };
        assert!(!claim_has_class(&with_class(None)));
        assert!(claim_has_class(&with_class(Some(""))));
        assert!(claim_has_class(&with_class(Some("fast"))));
        let mut annotated = with_class(None);
        annotated.metadata.annotations = Some([(ANN_BETA_STORAGE_CLASS.to_string(), String::new())].into());
        assert!(claim_has_class(&annotated));
    }

    #[test]
    fn getters_of_json_objects_and_quantities() {
        let annotated = serde_json::json!({
            "metadata": {"annotations": {ANN_BETA_STORAGE_CLASS: "beta"}},
            "spec": {"storageClassName": "fast"},
        });
        assert_eq!(class_of(&annotated), "beta");
        assert_eq!(
            class_of(&serde_json::json!({"spec": {"storageClassName": "fast"}})),
            "fast"
        );
        assert_eq!(class_of(&serde_json::json!({"spec": {}})), "");
        let claim = pvc("c", "2Gi", &["ReadWriteOnce"]);
        assert_eq!(claim_request(&claim).map(|q| q.0.as_str()), Some("2Gi"));
        assert_eq!(requested_storage(&claim), storage(Some(&K8sQuantity("2048Mi".into()))));
        assert_eq!(claim_capacity(&claim), None);
        assert_eq!(claim_volume_name(&claim), None);
        assert_eq!(claim_phase(&claim), "");
        let vol = pv("v", "1Gi", "local", None);
        assert_eq!(volume_phase(&vol), VOLUME_AVAILABLE);
        assert_eq!(reclaim_policy(&vol), "Retain");
        assert_eq!(claim_key(&claim), "default/c");
    }
}
