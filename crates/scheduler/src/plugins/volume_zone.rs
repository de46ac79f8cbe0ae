//! VolumeZone: a pod's bound PersistentVolumes labelled with a zone or region
//! (`topology.kubernetes.io/zone|region` or the deprecated `failure-domain.beta.kubernetes.io`
//! ones) fit only nodes in that zone or region, as upstream's `volumezone` plugin. Claims of a
//! WaitForFirstConsumer class that are not bound yet are left to VolumeBinding.

use crate::cache::Cache;
use crate::framework::{CycleState, Plugin, Status};
use crate::types::{NodeInfo, PodInfo};

pub const NAME: &str = "VolumeZone";
pub const ERR_REASON_CONFLICT: &str = "node(s) had no available volume zone";

const LABEL_FAILURE_DOMAIN_BETA_ZONE: &str = "failure-domain.beta.kubernetes.io/zone";
const LABEL_FAILURE_DOMAIN_BETA_REGION: &str = "failure-domain.beta.kubernetes.io/region";
const LABEL_TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";
const LABEL_TOPOLOGY_REGION: &str = "topology.kubernetes.io/region";

/// The labels looked at, in upstream's order.
const TOPOLOGY_LABELS: [&str; 4] = [
    LABEL_FAILURE_DOMAIN_BETA_ZONE,
    LABEL_FAILURE_DOMAIN_BETA_REGION,
    LABEL_TOPOLOGY_ZONE,
    LABEL_TOPOLOGY_REGION,
];

/// One topology label of a pod's volume: the key and the zones its value lists.
#[derive(Debug, Clone)]
struct PvTopology {
    key: &'static str,
    values: Vec<String>,
}

/// What PreFilter found for Filter.
#[derive(Debug, Clone, Default)]
pub struct StateData {
    topologies: Vec<PvTopology>,
}

fn translate_to_ga_label(label: &str) -> &str {
    match label {
        LABEL_FAILURE_DOMAIN_BETA_REGION => LABEL_TOPOLOGY_REGION,
        LABEL_FAILURE_DOMAIN_BETA_ZONE => LABEL_TOPOLOGY_ZONE,
        other => other,
    }
}

/// Upstream's `LabelZonesToSet`: zones separated by `__`, none of them empty.
fn label_zones_to_set(value: &str) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for z in value.split("__").flat_map(|part| part.split(',')) {
        let z = z.trim();
        if z.is_empty() {
            return Err(format!(
                "\",\" separated list ({value:?}) must not contain an empty string"
            ));
        }
        if !out.iter().any(|x| x == z) {
            out.push(z.to_string());
        }
    }
    Ok(out)
}

pub struct VolumeZone;

impl Plugin for VolumeZone {
    fn name(&self) -> &'static str {
        NAME
    }

    fn has_filter(&self) -> bool {
        true
    }

    fn pre_filter(&self, state: &mut CycleState, pod: &PodInfo, cache: &Cache) -> Status {
        if pod.claims.is_empty() {
            return Status::skip();
        }
        let mut topologies = Vec::new();
        for c in pod.claims.iter().filter(|c| !c.ephemeral) {
            if c.name.is_empty() {
                return Status::unresolvable("PersistentVolumeClaim had no name");
            }
            let Some(pvc) = cache.volumes.pvcs.get_api(&format!("{}/{}", pod.namespace, c.name)) else {
                return Status::unresolvable(format!("persistentvolumeclaim {:?} not found", c.name));
            };
            let Some(pv_name) = skiff_api::volume::claim_volume_name(pvc) else {
                let class = skiff_api::volume::claim_class(pvc);
                if class.is_empty() {
                    return Status::unresolvable("PersistentVolumeClaim had no pv name and storageClass name");
                }
                let Some(sc) = cache.volumes.classes.get(class) else {
                    return Status::unresolvable(format!("storageclass.storage.k8s.io {class:?} not found"));
                };
                match sc.volume_binding_mode.as_deref() {
                    None => {
                        return Status::unresolvable(format!("VolumeBindingMode not set for StorageClass {class:?}"));
                    }
                    // Not bound yet: VolumeBinding picks a volume that fits the node.
                    Some("WaitForFirstConsumer") => continue,
                    Some(_) => return Status::unresolvable("PersistentVolume had no name"),
                }
            };
            let Some(pv) = cache.volumes.pvs.get_api(pv_name) else {
                return Status::unresolvable(format!("persistentvolume {pv_name:?} not found"));
            };
            let Some(labels) = pv.metadata.labels.as_ref() else {
                continue;
            };
            for key in TOPOLOGY_LABELS {
                if let Some(value) = labels.get(key) {
                    match label_zones_to_set(value) {
                        Ok(values) => topologies.push(PvTopology { key, values }),
                        Err(e) => {
                            tracing::info!(label = %format!("{key}:{value}"), err = %e, "Failed to parse label, ignoring the label")
                        }
                    }
                }
            }
        }
        if topologies.is_empty() {
            return Status::skip();
        }
        state.volume_zone = Some(StateData { topologies });
        Status::success()
    }

    fn filter(&self, state: &CycleState, _pod: &PodInfo, node: &NodeInfo) -> Status {
        let Some(s) = &state.volume_zone else {
            return Status::success();
        };
        // A node without any zone label is fine (single-zone clusters label nothing).
        if !TOPOLOGY_LABELS.iter().any(|k| node.labels.contains_key(*k)) {
            return Status::success();
        }
        for t in &s.topologies {
            let v = node
                .labels
                .get(t.key)
                .or_else(|| node.labels.get(translate_to_ga_label(t.key)));
            if !v.is_some_and(|v| t.values.contains(v)) {
                return Status::unresolvable(ERR_REASON_CONFLICT);
            }
        }
        Status::success()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::{Code, Framework};
    use crate::plugins::testutil::*;
    use crate::types::testutil::*;
    use std::sync::Arc;

    fn zoned_cache() -> Cache {
        let mut c = Cache::new();
        for (name, zone) in [("a1", Some("zone-a")), ("b1", Some("zone-b")), ("plain", None)] {
            let mut n = node(name, "4", "8Gi", "110");
            if let Some(z) = zone {
                n.metadata
                    .labels
                    .as_mut()
                    .unwrap()
                    .insert(LABEL_TOPOLOGY_ZONE.into(), z.into());
                n.metadata
                    .labels
                    .as_mut()
                    .unwrap()
                    .insert(LABEL_TOPOLOGY_REGION.into(), "region-1".into());
            }
            c.upsert_node(Arc::new(n));
        }
        c
    }

    fn labelled_pv(name: &str, labels: &[(&str, &str)]) -> k8s_openapi::api::core::v1::PersistentVolume {
        let mut v = pv(name, "", "10Gi", &["ReadWriteOnce"], None);
        v.metadata.labels = Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        v
    }

    #[test]
    fn zone_labels_of_bound_volumes_pick_nodes() {
        let mut c = zoned_cache();
        add_pv(&mut c, labelled_pv("pv-a", &[(LABEL_TOPOLOGY_ZONE, "zone-a")]));
        add_claim(&mut c, claim("data", &["ReadWriteOnce"], "", Some("pv-a")));
        let mut fw = Framework::with_default_plugins(0);
        let p = PodInfo::new(with_claim(pod("p", "", ""), "data"));
        let (res, _) = fw.schedule(&p, &c).unwrap();
        // zone-a, or the node that has no zone at all.
        assert_ne!(c.node_name(res.node), "b1");
        assert_eq!(res.rejected.len(), 1);
        assert_eq!(res.rejected[0].1.code, Code::UnschedulableAndUnresolvable);
        assert_eq!(res.rejected[0].1.reasons, vec![ERR_REASON_CONFLICT]);

        // The deprecated label on the volume matches the GA label on the node; `__` lists zones.
        add_pv(
            &mut c,
            labelled_pv("pv-old", &[(LABEL_FAILURE_DOMAIN_BETA_ZONE, "zone-x__zone-b")]),
        );
        add_claim(&mut c, claim("old", &["ReadWriteOnce"], "", Some("pv-old")));
        let mut s = CycleState::default();
        let p = PodInfo::new(with_claim(pod("q", "", ""), "old"));
        assert!(VolumeZone.pre_filter(&mut s, &p, &c).is_success());
        assert!(VolumeZone.filter(&s, &p, c.node("b1").unwrap()).is_success());
        assert!(!VolumeZone.filter(&s, &p, c.node("a1").unwrap()).is_success());
        assert!(VolumeZone.filter(&s, &p, c.node("plain").unwrap()).is_success());
    }

    #[test]
    fn unbound_claims() {
        let mut c = zoned_cache();
        add_class(
            &mut c,
            class("wait", "WaitForFirstConsumer", "kubernetes.io/no-provisioner"),
        );
        add_class(&mut c, class("now", "Immediate", "kubernetes.io/no-provisioner"));
        add_claim(&mut c, claim("later", &["ReadWriteOnce"], "wait", None));
        add_claim(&mut c, claim("pending", &["ReadWriteOnce"], "now", None));
        add_claim(&mut c, claim("nowhere", &["ReadWriteOnce"], "gone", None));
        let mut s = CycleState::default();
        // WaitForFirstConsumer: skipped.
        let p = PodInfo::new(with_claim(pod("p", "", ""), "later"));
        assert!(VolumeZone.pre_filter(&mut s, &p, &c).is_skip());
        let st = VolumeZone.pre_filter(&mut s, &PodInfo::new(with_claim(pod("p", "", ""), "pending")), &c);
        assert_eq!(st.code, Code::UnschedulableAndUnresolvable);
        assert_eq!(st.reasons, vec!["PersistentVolume had no name"]);
        let st = VolumeZone.pre_filter(&mut s, &PodInfo::new(with_claim(pod("p", "", ""), "nowhere")), &c);
        assert_eq!(st.reasons, vec!["storageclass.storage.k8s.io \"gone\" not found"]);
        assert_eq!(label_zones_to_set("a__b").unwrap(), vec!["a", "b"]);
        assert!(label_zones_to_set("a____b").is_err());
    }
}
