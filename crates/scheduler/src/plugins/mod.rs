//! The default plugins, one file each, named as upstream's.

pub mod default_preemption;
pub mod inter_pod_affinity;
pub mod node_affinity;
pub mod node_name;
pub mod node_ports;
pub mod node_resources_balanced_allocation;
pub mod node_resources_fit;
pub mod node_unschedulable;
pub mod node_volume_limits;
pub mod pod_topology_spread;
pub mod taint_toleration;
pub mod volume_binding;
pub mod volume_restrictions;
pub mod volume_zone;

use std::time::Duration;

use crate::framework::Plugin;

/// Upstream's default profile, in its Filter order, with its Score weights.
pub fn default_plugins() -> Vec<Box<dyn Plugin>> {
    profile(volume_binding::DEFAULT_BIND_TIMEOUT)
}

/// The default profile with VolumeBinding's bind timeout (upstream's `bindTimeoutSeconds`).
/// Upstream's in-tree EBS, GCE PD and Azure Disk limits plugins are not here: their volumes
/// count through NodeVolumeLimits only once migrated to CSI, which nothing here does.
pub fn profile(bind_timeout: Duration) -> Vec<Box<dyn Plugin>> {
    vec![
        Box::new(node_unschedulable::NodeUnschedulable),
        Box::new(node_name::NodeName),
        Box::new(taint_toleration::TaintToleration),
        Box::new(node_affinity::NodeAffinity),
        Box::new(node_ports::NodePorts),
        Box::new(node_resources_fit::NodeResourcesFit),
        Box::new(volume_restrictions::VolumeRestrictions),
        Box::new(node_volume_limits::NodeVolumeLimits::new()),
        Box::new(volume_binding::VolumeBinding::new(bind_timeout)),
        Box::new(volume_zone::VolumeZone),
        Box::new(pod_topology_spread::PodTopologySpread),
        Box::new(inter_pod_affinity::InterPodAffinity),
        Box::new(node_resources_balanced_allocation::NodeResourcesBalancedAllocation),
    ]
}

#[cfg(test)]
pub(crate) mod testutil {
    //! Builders of storage objects for the volume plugins' tests.
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use k8s_openapi::api::core::v1::{
        CSIPersistentVolumeSource, HostPathVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
        PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
        PersistentVolumeClaimVolumeSource, PersistentVolumeSpec, PersistentVolumeStatus, Pod, Volume,
        VolumeNodeAffinity, VolumeResourceRequirements,
    };
    use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, StorageClass, VolumeNodeResources};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use crate::cache::Cache;
    use crate::types::testutil::node;

    static VERSION: AtomicU64 = AtomicU64::new(1);

    fn next_version() -> Option<String> {
        Some(VERSION.fetch_add(1, Ordering::Relaxed).to_string())
    }

    pub fn cache_with_nodes(names: &[&str]) -> Cache {
        let mut c = Cache::new();
        for n in names {
            c.upsert_node(Arc::new(node(n, "4", "8Gi", "110")));
        }
        c
    }

    /// A claim of 1Gi in `default`; with `volume`, bound to it.
    pub fn claim(name: &str, modes: &[&str], class: &str, volume: Option<&str>) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(format!("uid-{name}")),
                annotations: volume
                    .map(|_| [("pv.kubernetes.io/bind-completed".to_string(), "yes".to_string())].into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(modes.iter().map(|m| m.to_string()).collect()),
                resources: Some(VolumeResourceRequirements {
                    requests: Some([("storage".to_string(), Quantity("1Gi".into()))].into()),
                    limits: None,
                }),
                storage_class_name: (!class.is_empty()).then(|| class.to_string()),
                volume_name: volume.map(str::to_string),
                ..Default::default()
            }),
            status: Some(PersistentVolumeClaimStatus {
                phase: Some(if volume.is_some() { "Bound" } else { "Pending" }.into()),
                ..Default::default()
            }),
        }
    }

    /// An Available hostPath volume; with `node`, only for the node of that hostname.
    pub fn pv(name: &str, class: &str, size: &str, modes: &[&str], node: Option<&str>) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                capacity: Some([("storage".to_string(), Quantity(size.into()))].into()),
                access_modes: Some(modes.iter().map(|m| m.to_string()).collect()),
                storage_class_name: (!class.is_empty()).then(|| class.to_string()),
                host_path: Some(HostPathVolumeSource {
                    path: format!("/data/{name}"),
                    type_: None,
                }),
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

    /// A CSI volume of `driver`.
    pub fn csi_pv(name: &str, driver: &str, handle: &str) -> PersistentVolume {
        let mut v = pv(name, "", "1Gi", &["ReadWriteOnce"], None);
        let spec = v.spec.as_mut().unwrap();
        spec.host_path = None;
        spec.csi = Some(CSIPersistentVolumeSource {
            driver: driver.into(),
            volume_handle: handle.into(),
            ..Default::default()
        });
        v
    }

    pub fn class(name: &str, mode: &str, provisioner: &str) -> StorageClass {
        StorageClass {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            provisioner: provisioner.into(),
            volume_binding_mode: Some(mode.into()),
            ..Default::default()
        }
    }

    pub fn csi_node(name: &str, drivers: &[(&str, i32)]) -> CSINode {
        CSINode {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: CSINodeSpec {
                drivers: drivers
                    .iter()
                    .map(|(d, n)| CSINodeDriver {
                        name: d.to_string(),
                        node_id: name.into(),
                        allocatable: Some(VolumeNodeResources { count: Some(*n) }),
                        topology_keys: None,
                    })
                    .collect(),
            },
        }
    }

    /// Stores a claim as the watch would, newer than any before.
    pub fn add_claim(c: &mut Cache, mut pvc: PersistentVolumeClaim) {
        pvc.metadata.resource_version = next_version();
        c.volumes.pvcs.update(Arc::new(pvc));
    }

    pub fn add_pv(c: &mut Cache, mut pv: PersistentVolume) {
        pv.metadata.resource_version = next_version();
        c.volumes.pvs.update(Arc::new(pv));
    }

    pub fn add_class(c: &mut Cache, sc: StorageClass) {
        c.volumes
            .classes
            .insert(sc.metadata.name.clone().unwrap_or_default(), Arc::new(sc));
    }

    /// The pod with one more volume using `claim`.
    pub fn with_claim(mut p: Pod, claim: &str) -> Pod {
        let volumes = p.spec.as_mut().unwrap().volumes.get_or_insert_with(Vec::new);
        volumes.push(Volume {
            name: format!("v{}", volumes.len()),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.into(),
                read_only: None,
            }),
            ..Default::default()
        });
        p
    }

    pub fn prio(mut p: Pod, prio: i32) -> Pod {
        p.spec.as_mut().unwrap().priority = Some(prio);
        p
    }
}
