//! NodeVolumeLimits: the CSI volumes a node has attached, per driver, stay within what its
//! CSINode says the driver can attach (`spec.drivers[].allocatable.count`, or the deprecated
//! node allocatable `attachable-volumes-csi-DRIVER`), as upstream's `nodevolumelimits` CSI
//! plugin. A volume is counted once per node however many pods use it. Claims not bound yet
//! count as a volume of their class's provisioner. In-tree volumes are not translated to CSI
//! (no CSI migration here), so only CSI volumes count.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use crate::cache::Cache;
use crate::framework::{CycleState, Plugin, Status};
use crate::types::{NodeInfo, PodInfo};

pub const NAME: &str = "NodeVolumeLimits";
pub const ERR_REASON_MAX_VOLUME_COUNT_EXCEEDED: &str = "node(s) exceed max volume count";
/// Upstream's `CSIAttachLimitPrefix`: node allocatable resources of attachable CSI volumes.
pub const CSI_ATTACH_LIMIT_PREFIX: &str = "attachable-volumes-csi-";

/// (unique volume name `DRIVER/HANDLE`, driver).
type CsiVolume = (String, String);

/// What PreFilter resolved for Filter: only the pod's own volumes. What each node has attached
/// is counted by Filter for the nodes a cycle visits, so a cycle never walks every placed pod.
#[derive(Debug, Clone, Default)]
pub struct PreFilterState {
    /// A claim of the pod that does not exist: every node rejects the pod with this.
    missing: Option<String>,
    /// The pod's CSI volumes.
    new_volumes: Vec<CsiVolume>,
    /// Their drivers, sorted and distinct.
    drivers: Vec<String>,
}

pub struct NodeVolumeLimits {
    /// Upstream's randomVolumeIDPrefix: names the volume a claim not bound yet will get, so it
    /// never equals a real volume's handle.
    random_prefix: String,
}

impl Default for NodeVolumeLimits {
    fn default() -> Self {
        Self::new()
    }
}

impl NodeVolumeLimits {
    pub fn new() -> Self {
        use std::hash::{BuildHasher, Hasher};
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let mut prefix = String::with_capacity(32);
        while prefix.len() < 32 {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_usize(prefix.len());
            let mut x = h.finish();
            for _ in 0..8 {
                prefix.push(ALPHABET[(x % ALPHABET.len() as u64) as usize] as char);
                x /= ALPHABET.len() as u64;
            }
        }
        NodeVolumeLimits { random_prefix: prefix }
    }

    /// Upstream's getCSIDriverInfo: the driver and volume handle of a claim's volume, from its
    /// bound PersistentVolume, else (not bound, or the volume not known) from its class.
    fn claim_volume(&self, cache: &Cache, pvc: &PersistentVolumeClaim) -> Option<CsiVolume> {
        if let Some(pv_name) = skiff_api::volume::claim_volume_name(pvc)
            && let Some(pv) = cache.volumes.pvs.get_api(pv_name)
        {
            let csi = pv.spec.as_ref()?.csi.as_ref()?;
            return Some((format!("{}/{}", csi.driver, csi.volume_handle), csi.driver.clone()));
        }
        // Upstream's getCSIDriverInfoFromSC.
        let class = skiff_api::volume::claim_class(pvc);
        if class.is_empty() {
            return None;
        }
        let sc = cache.volumes.classes.get(class)?;
        let handle = format!(
            "{}-{}/{}",
            self.random_prefix,
            pvc.metadata.namespace.as_deref().unwrap_or_default(),
            pvc.metadata.name.as_deref().unwrap_or_default()
        );
        Some((format!("{}/{handle}", sc.provisioner), sc.provisioner.clone()))
    }
}

/// The node's limits on `drivers`: its CSINode's allocatable counts, over the deprecated node
/// allocatable ones (upstream's getVolumeLimits).
fn node_limits(cache: &Cache, node: &NodeInfo, drivers: &[&str]) -> Vec<(String, i64)> {
    let mut out: Vec<(String, i64)> = Vec::new();
    for d in drivers {
        let v = node.allocatable.scalar(&format!("{CSI_ATTACH_LIMIT_PREFIX}{d}"));
        if v > 0 {
            out.push((d.to_string(), v));
        }
    }
    if let Some(csi) = cache.volumes.csi_nodes.get(&node.name) {
        for d in csi.spec.drivers.iter().filter(|d| drivers.contains(&d.name.as_str())) {
            if let Some(count) = d.allocatable.as_ref().and_then(|a| a.count) {
                out.retain(|(name, _)| *name != d.name);
                out.push((d.name.clone(), i64::from(count)));
            }
        }
    }
    out
}

impl Plugin for NodeVolumeLimits {
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
        let mut s = PreFilterState::default();
        for c in &pod.claims {
            let key = format!("{}/{}", pod.namespace, c.name);
            let Some(pvc) = cache.volumes.pvcs.get_api(&key) else {
                s.missing = Some(format!(
                    "looking up PVC {key}: persistentvolumeclaim {:?} not found",
                    c.name
                ));
                state.node_volume_limits = Some(Box::new(s));
                return Status::success();
            };
            if let Some(v) = self.claim_volume(cache, pvc)
                && !s.new_volumes.contains(&v)
            {
                s.new_volumes.push(v);
            }
        }
        if s.new_volumes.is_empty() {
            return Status::skip();
        }
        let mut drivers: Vec<String> = s.new_volumes.iter().map(|(_, d)| d.clone()).collect();
        drivers.sort_unstable();
        drivers.dedup();
        s.drivers = drivers;
        state.node_volume_limits = Some(Box::new(s));
        Status::success()
    }

    fn filter_with_cache(&self, state: &CycleState, _pod: &PodInfo, cache: &Cache, node: &NodeInfo) -> Status {
        let Some(s) = &state.node_volume_limits else {
            return Status::success();
        };
        if let Some(msg) = &s.missing {
            return Status::unresolvable(msg.clone());
        }
        let drivers: Vec<&str> = s.drivers.iter().map(String::as_str).collect();
        let limits = node_limits(cache, node, &drivers);
        if limits.is_empty() {
            return Status::success();
        }
        // What the pods there use (the nominated ones too, when the framework added them).
        let mut attached: Vec<CsiVolume> = Vec::new();
        for p in &node.pods {
            for c in &p.claims {
                let key = format!("{}/{}", p.namespace, c.name);
                if let Some(v) = cache
                    .volumes
                    .pvcs
                    .get_api(&key)
                    .and_then(|pvc| self.claim_volume(cache, pvc))
                    && !attached.contains(&v)
                {
                    attached.push(v);
                }
            }
        }
        for (driver, limit) in &limits {
            let current = attached.iter().filter(|(_, d)| d == driver).count() as i64;
            let new = s
                .new_volumes
                .iter()
                .filter(|v| v.1 == *driver && !attached.contains(v))
                .count() as i64;
            if new > 0 && current + new > *limit {
                return Status::unschedulable(ERR_REASON_MAX_VOLUME_COUNT_EXCEEDED);
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

    #[test]
    fn counts_unique_csi_volumes_per_driver_against_the_csinode() {
        let mut c = cache_with_nodes(&["n1", "n2"]);
        c.volumes
            .csi_nodes
            .insert("n1".into(), Arc::new(csi_node("n1", &[("ebs.csi.example.com", 2)])));
        for i in 0..3 {
            add_pv(
                &mut c,
                csi_pv(&format!("pv-{i}"), "ebs.csi.example.com", &format!("vol-{i}")),
            );
            add_claim(
                &mut c,
                claim(&format!("c{i}"), &["ReadWriteOnce"], "", Some(&format!("pv-{i}"))),
            );
        }
        add_pv(&mut c, csi_pv("other", "nfs.csi.example.com", "x"));
        add_claim(&mut c, claim("nfs", &["ReadWriteMany"], "", Some("other")));
        // Two pods on n1 use c0 (counted once) and c1: n1 is full for the driver.
        c.assume_pod(Arc::new(PodInfo::new(with_claim(pod("a", "", ""), "c0"))), "n1");
        c.assume_pod(
            Arc::new(PodInfo::new(with_claim(with_claim(pod("b", "", ""), "c0"), "c1"))),
            "n1",
        );
        let mut fw = Framework::with_default_plugins(0);
        let (res, _) = fw
            .schedule(&PodInfo::new(with_claim(pod("new", "", ""), "c2")), &c)
            .unwrap();
        assert_eq!(c.node_name(res.node), "n2");
        assert_eq!(res.rejected.len(), 1);
        assert_eq!(res.rejected[0].1.reasons, vec![ERR_REASON_MAX_VOLUME_COUNT_EXCEEDED]);
        assert_eq!(res.rejected[0].1.code, Code::Unschedulable);
        // A volume already attached there adds nothing; another driver is not limited.
        let mut s = CycleState::default();
        let p = PodInfo::new(with_claim(pod("again", "", ""), "c1"));
        assert!(NodeVolumeLimits::new().pre_filter(&mut s, &p, &c).is_success());
        assert!(
            NodeVolumeLimits::new()
                .filter_with_cache(&s, &p, &c, c.node("n1").unwrap())
                .is_success()
        );
        // A driver no node limits passes everywhere.
        let p = PodInfo::new(with_claim(pod("nfs", "", ""), "nfs"));
        let mut s = CycleState::default();
        assert!(NodeVolumeLimits::new().pre_filter(&mut s, &p, &c).is_success());
        assert!(
            NodeVolumeLimits::new()
                .filter_with_cache(&s, &p, &c, c.node("n1").unwrap())
                .is_success()
        );
        // Pods without claims never get here.
        assert!(
            NodeVolumeLimits::new()
                .pre_filter(&mut s, &PodInfo::new(pod("x", "", "")), &c)
                .is_skip()
        );
    }

    #[test]
    fn unbound_claims_count_as_their_provisioners_volumes() {
        let mut c = cache_with_nodes(&["n1"]);
        c.volumes
            .csi_nodes
            .insert("n1".into(), Arc::new(csi_node("n1", &[("disk.csi.example.com", 1)])));
        add_class(&mut c, class("fast", "WaitForFirstConsumer", "disk.csi.example.com"));
        add_claim(&mut c, claim("one", &["ReadWriteOnce"], "fast", None));
        add_claim(&mut c, claim("two", &["ReadWriteOnce"], "fast", None));
        c.assume_pod(Arc::new(PodInfo::new(with_claim(pod("a", "", ""), "one"))), "n1");
        let plugin = NodeVolumeLimits::new();
        let mut s = CycleState::default();
        let p = PodInfo::new(with_claim(pod("b", "", ""), "two"));
        assert!(plugin.pre_filter(&mut s, &p, &c).is_success());
        let st = plugin.filter_with_cache(&s, &p, &c, c.node("n1").unwrap());
        assert_eq!(st.reasons, vec![ERR_REASON_MAX_VOLUME_COUNT_EXCEEDED]);
        // A claim that does not exist rejects every node, for good.
        let p = PodInfo::new(with_claim(pod("c", "", ""), "nope"));
        let mut s = CycleState::default();
        assert!(plugin.pre_filter(&mut s, &p, &c).is_success());
        let st = plugin.filter_with_cache(&s, &p, &c, c.node("n1").unwrap());
        assert_eq!(st.code, Code::UnschedulableAndUnresolvable);
        assert_eq!(
            st.reasons,
            vec!["looking up PVC default/nope: persistentvolumeclaim \"nope\" not found"]
        );
    }
}
