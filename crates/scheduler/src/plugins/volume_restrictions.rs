//! VolumeRestrictions: a claim with the ReadWriteOncePod access mode may be used by one pod in
//! the whole cluster, and GCE PD, AWS EBS, RBD and iSCSI disks may not be mounted by two pods
//! on a node (unless every mount is read-only where the disk allows that), as upstream's
//! `volumerestrictions` plugin.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Volume};

use crate::cache::Cache;
use crate::framework::{CycleState, Plugin, Status};
use crate::types::{NodeInfo, PodInfo};

pub const NAME: &str = "VolumeRestrictions";
pub const ERR_REASON_DISK_CONFLICT: &str = "node(s) had no available disk";
pub const ERR_REASON_READ_WRITE_ONCE_POD_CONFLICT: &str =
    "node has pod using PersistentVolumeClaim with the same name and ReadWriteOncePod access mode";

const READ_WRITE_ONCE_POD: &str = "ReadWriteOncePod";

/// What PreFilter found for Filter.
#[derive(Debug, Clone, Default)]
pub struct PreFilterState {
    /// The pod has disks whose mounts may conflict with other pods'.
    needs_disk_check: bool,
    /// Names of the pod's claims with the ReadWriteOncePod access mode.
    rwop_claims: Vec<String>,
    /// How many of them a scheduled pod already uses (upstream's conflictingPVCRefCount).
    conflicting: i64,
    /// Per node, how many references to them its pods hold: Filter compares a node's pods with
    /// this, so a node from which preemption removed the user is seen free (upstream's
    /// RemovePod), and nominated pods count (AddPod).
    refs_on_node: Vec<(String, i64)>,
}

pub struct VolumeRestrictions;

impl Plugin for VolumeRestrictions {
    fn name(&self) -> &'static str {
        NAME
    }

    fn has_filter(&self) -> bool {
        true
    }

    fn pre_filter(&self, state: &mut CycleState, pod: &PodInfo, cache: &Cache) -> Status {
        if pod.claims.is_empty() && !pod.has_disk_volumes {
            return Status::skip();
        }
        let mut rwop_claims = Vec::new();
        for c in pod.claims.iter().filter(|c| !c.ephemeral) {
            let key = format!("{}/{}", pod.namespace, c.name);
            let Some(pvc) = cache.volumes.pvcs.get_api(&key) else {
                return Status::unresolvable(format!("persistentvolumeclaim {:?} not found", c.name));
            };
            let modes = skiff_api::volume::claim_access_modes(pvc);
            if modes.iter().any(|m| m == READ_WRITE_ONCE_POD) && !rwop_claims.contains(&c.name) {
                rwop_claims.push(c.name.clone());
            }
        }
        let conflicting = rwop_claims
            .iter()
            .filter(|c| cache.pvc_in_use(&format!("{}/{}", pod.namespace, c)))
            .count() as i64;
        if !pod.has_disk_volumes && conflicting == 0 {
            return Status::skip();
        }
        let mut refs_on_node: Vec<(String, i64)> = Vec::new();
        if conflicting > 0 {
            for (node, p) in cache.all_pods() {
                let n = refs(&rwop_claims, &pod.namespace, p);
                if n == 0 {
                    continue;
                }
                match refs_on_node.iter_mut().find(|(name, _)| *name == node.name) {
                    Some((_, count)) => *count += n,
                    None => refs_on_node.push((node.name.clone(), n)),
                }
            }
        }
        state.volume_restrictions = Some(PreFilterState {
            needs_disk_check: pod.has_disk_volumes,
            rwop_claims,
            conflicting,
            refs_on_node,
        });
        Status::success()
    }

    fn filter(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let Some(s) = &state.volume_restrictions else {
            return Status::success();
        };
        if s.needs_disk_check && !satisfy_volume_conflicts(pod, node) {
            return Status::unschedulable(ERR_REASON_DISK_CONFLICT);
        }
        if s.conflicting > 0 {
            let before = s
                .refs_on_node
                .iter()
                .find(|(n, _)| *n == node.name)
                .map_or(0, |(_, c)| *c);
            let now: i64 = node.pods.iter().map(|p| refs(&s.rwop_claims, &pod.namespace, p)).sum();
            if s.conflicting - before + now > 0 {
                return Status::unschedulable(ERR_REASON_READ_WRITE_ONCE_POD_CONFLICT);
            }
        }
        Status::success()
    }
}

/// How many of `pod`'s volumes use one of the claims (upstream's conflictingPVCRefCountForPod).
fn refs(claims: &[String], namespace: &str, pod: &Arc<PodInfo>) -> i64 {
    if pod.namespace != namespace {
        return 0;
    }
    pod.claims
        .iter()
        .filter(|c| !c.ephemeral && claims.contains(&c.name))
        .count() as i64
}

/// Upstream's satisfyVolumeConflicts: none of the pod's disks conflicts with a pod on the node.
fn satisfy_volume_conflicts(pod: &PodInfo, node: &NodeInfo) -> bool {
    let volumes = pod
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_deref())
        .unwrap_or_default();
    for v in volumes.iter().filter(|v| needs_restrictions_check(v)) {
        for other in node.pods.iter().filter(|p| p.has_disk_volumes) {
            if is_volume_conflict(v, &other.pod) {
                return false;
            }
        }
    }
    true
}

fn needs_restrictions_check(v: &Volume) -> bool {
    v.gce_persistent_disk.is_some() || v.aws_elastic_block_store.is_some() || v.rbd.is_some() || v.iscsi.is_some()
}

/// Upstream's isVolumeConflict: the same GCE PD unless both mounts are read-only, the same EBS
/// volume, the same iSCSI IQN unless both are read-only, the same RBD image (a shared monitor,
/// the same pool and image) unless both are read-only.
pub fn is_volume_conflict(volume: &Volume, pod: &Pod) -> bool {
    let existing = pod.spec.as_ref().and_then(|s| s.volumes.as_deref()).unwrap_or_default();
    for ev in existing {
        if let (Some(d), Some(e)) = (&volume.gce_persistent_disk, &ev.gce_persistent_disk)
            && d.pd_name == e.pd_name
            && !(d.read_only.unwrap_or(false) && e.read_only.unwrap_or(false))
        {
            return true;
        }
        if let (Some(d), Some(e)) = (&volume.aws_elastic_block_store, &ev.aws_elastic_block_store)
            && d.volume_id == e.volume_id
        {
            return true;
        }
        if let (Some(d), Some(e)) = (&volume.iscsi, &ev.iscsi)
            && d.iqn == e.iqn
            && !(d.read_only.unwrap_or(false) && e.read_only.unwrap_or(false))
        {
            return true;
        }
        if let (Some(d), Some(e)) = (&volume.rbd, &ev.rbd) {
            let overlap = d.monitors.iter().any(|m| e.monitors.contains(m));
            let pool = |p: &Option<String>| p.clone().unwrap_or_else(|| "rbd".to_string());
            if overlap
                && pool(&d.pool) == pool(&e.pool)
                && d.image == e.image
                && !(d.read_only.unwrap_or(false) && e.read_only.unwrap_or(false))
            {
                return true;
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::{Code, Framework};
    use crate::plugins::default_preemption::preempt;
    use crate::plugins::testutil::*;
    use crate::types::testutil::*;
    use k8s_openapi::api::core::v1::{
        AWSElasticBlockStoreVolumeSource, GCEPersistentDiskVolumeSource, RBDVolumeSource,
    };

    fn with_volume(mut p: Pod, v: Volume) -> Pod {
        p.spec.as_mut().unwrap().volumes.get_or_insert_with(Vec::new).push(v);
        p
    }

    fn gce(name: &str, pd: &str, ro: bool) -> Volume {
        Volume {
            name: name.into(),
            gce_persistent_disk: Some(GCEPersistentDiskVolumeSource {
                pd_name: pd.into(),
                read_only: Some(ro),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn same_disks_conflict_as_upstream() {
        let existing = with_volume(pod("a", "", ""), gce("d", "disk-1", true));
        assert!(!is_volume_conflict(&gce("x", "disk-1", true), &existing));
        assert!(is_volume_conflict(&gce("x", "disk-1", false), &existing));
        assert!(!is_volume_conflict(&gce("x", "disk-2", false), &existing));
        let ebs = |id: &str| Volume {
            name: "e".into(),
            aws_elastic_block_store: Some(AWSElasticBlockStoreVolumeSource {
                volume_id: id.into(),
                read_only: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        };
        // EBS: any two mounts of one volume conflict, read-only or not.
        assert!(is_volume_conflict(
            &ebs("vol-1"),
            &with_volume(pod("b", "", ""), ebs("vol-1"))
        ));
        let rbd = |mons: &[&str], image: &str| Volume {
            name: "r".into(),
            rbd: Some(RBDVolumeSource {
                monitors: mons.iter().map(|m| m.to_string()).collect(),
                image: image.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let existing = with_volume(pod("c", "", ""), rbd(&["m1", "m2"], "img"));
        assert!(is_volume_conflict(&rbd(&["m2"], "img"), &existing));
        assert!(!is_volume_conflict(&rbd(&["m3"], "img"), &existing));
        assert!(!is_volume_conflict(&rbd(&["m1"], "other"), &existing));

        // Through the framework: only the node with the disk is refused.
        let mut c = cache_with_nodes(&["n1", "n2"]);
        c.assume_pod(
            Arc::new(PodInfo::new(with_volume(pod("a", "", ""), gce("d", "disk-1", false)))),
            "n1",
        );
        let mut fw = Framework::with_default_plugins(0);
        let p = PodInfo::new(with_volume(pod("b", "", ""), gce("d", "disk-1", false)));
        let (res, _) = fw.schedule(&p, &c).unwrap();
        assert_eq!(c.node_name(res.node), "n2");
        assert_eq!(res.rejected.len(), 1);
        assert_eq!(res.rejected[0].1.reasons, vec![ERR_REASON_DISK_CONFLICT]);
        assert_eq!(res.rejected[0].1.plugin, NAME);
    }

    #[test]
    fn missing_claim_and_pods_without_volumes() {
        let c = cache_with_nodes(&["n1"]);
        let mut s = CycleState::default();
        assert!(
            VolumeRestrictions
                .pre_filter(&mut s, &PodInfo::new(pod("plain", "", "")), &c)
                .is_skip()
        );
        let st = VolumeRestrictions.pre_filter(&mut s, &PodInfo::new(with_claim(pod("p", "", ""), "data")), &c);
        assert_eq!(st.code, Code::UnschedulableAndUnresolvable);
        assert_eq!(st.reasons, vec!["persistentvolumeclaim \"data\" not found"]);
    }

    #[test]
    fn read_write_once_pod_is_one_pod_in_the_cluster_and_preemption_frees_it() {
        let mut c = cache_with_nodes(&["n1", "n2"]);
        add_pv(&mut c, pv("pv-1", "", "1Gi", &["ReadWriteOncePod"], None));
        add_pv(&mut c, pv("pv-2", "", "1Gi", &["ReadWriteOnce"], None));
        add_claim(&mut c, claim("data", &["ReadWriteOncePod"], "", Some("pv-1")));
        add_claim(&mut c, claim("shared", &["ReadWriteOnce"], "", Some("pv-2")));
        let mut fw = Framework::with_default_plugins(0);
        // Unused: schedules, and a claim without ReadWriteOncePod never conflicts.
        let first = Arc::new(PodInfo::new(prio(with_claim(pod("first", "", ""), "data"), 0)));
        let mut s = CycleState::default();
        assert!(VolumeRestrictions.pre_filter(&mut s, &first, &c).is_skip());
        c.assume_pod(first.clone(), "n1");
        c.assume_pod(Arc::new(PodInfo::new(with_claim(pod("rwo", "", ""), "shared"))), "n2");
        let other = PodInfo::new(with_claim(pod("other", "", ""), "shared"));
        assert!(VolumeRestrictions.pre_filter(&mut s, &other, &c).is_skip());

        // In use: every node says so, and preemption is helpful only where the user runs.
        let second = PodInfo::new(prio(with_claim(pod("second", "", ""), "data"), 100));
        let (diag, state) = *fw.schedule(&second, &c).unwrap_err();
        assert!(
            diag.node_statuses
                .iter()
                .all(|(_, st)| st.code == Code::Unschedulable
                    && st.reasons == vec![ERR_REASON_READ_WRITE_ONCE_POD_CONFLICT]),
            "{:?}",
            diag.message()
        );
        let cand = preempt(&fw, state.as_ref(), &second, &c, &diag).expect("preempts the user");
        assert_eq!(c.node_name(cand.node), "n1");
        assert_eq!(cand.victims.len(), 1);
        assert_eq!(cand.victims[0].name, "first");
        // A pod of lower priority cannot preempt it.
        let low = PodInfo::new(prio(with_claim(pod("low", "", ""), "data"), -1));
        let (mut diag, state) = *fw.schedule(&low, &c).unwrap_err();
        let msg = preempt(&fw, state.as_ref(), &low, &c, &diag).unwrap_err();
        diag.post_filter_msg = Some(format!("preemption: {msg}"));
        assert_eq!(
            diag.message(),
            "0/2 nodes are available: 2 node has pod using PersistentVolumeClaim with the same name and \
             ReadWriteOncePod access mode. preemption: 0/2 nodes are available: 2 No preemption victims found \
             for incoming pod."
        );
        // Once the user is gone the claim is free again.
        c.remove_pod(&first.uid);
        assert!(fw.schedule(&second, &c).is_ok());
    }
}
