//! TaintToleration: NoSchedule/NoExecute taints must be tolerated; PreferNoSchedule taints
//! lower the score.

use k8s_openapi::api::core::v1::{Taint, Toleration};
use skiff_api::nodeaffinity::{does_not_allow_scheduling, find_matching_untolerated_taint, tolerates};

use crate::cache::Cache;
use crate::framework::{CycleState, Plugin, Status, default_normalize};
use crate::types::{NodeInfo, PodInfo};

pub const NAME: &str = "TaintToleration";

pub struct TaintToleration;

/// The first NoSchedule/NoExecute taint not tolerated, if any.
pub fn find_untolerated<'a>(taints: &'a [Taint], tolerations: &[Toleration]) -> Option<&'a Taint> {
    find_matching_untolerated_taint(taints, tolerations, does_not_allow_scheduling)
}

impl Plugin for TaintToleration {
    fn name(&self) -> &'static str {
        NAME
    }

    fn has_filter(&self) -> bool {
        true
    }

    fn pre_filter(&self, _s: &mut CycleState, _pod: &PodInfo, _c: &Cache) -> Status {
        Status::success()
    }

    fn filter(&self, _s: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        match find_untolerated(&node.taints, &pod.tolerations) {
            None => Status::success(),
            Some(taint) => Status::unresolvable(format!(
                "node(s) had untolerated taint {{{}: {}}}",
                taint.key,
                taint.value.as_deref().unwrap_or("")
            )),
        }
    }

    fn score_weight(&self) -> i64 {
        3
    }

    fn score(&self, _s: &CycleState, pod: &PodInfo, node: &NodeInfo) -> i64 {
        let mut n = 0;
        for taint in &node.taints {
            if taint.effect != "PreferNoSchedule" {
                continue;
            }
            let tolerated = pod.tolerations.iter().any(|t| {
                matches!(t.effect.as_deref(), None | Some("") | Some("PreferNoSchedule")) && tolerates(t, taint)
            });
            if !tolerated {
                n += 1;
            }
        }
        n
    }

    fn normalize(&self, _s: &CycleState, scores: &mut [i64]) {
        default_normalize(scores, true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::Code;
    use crate::types::testutil::*;

    fn taint(k: &str, v: &str, e: &str) -> Taint {
        Taint {
            key: k.into(),
            value: Some(v.into()),
            effect: e.into(),
            ..Default::default()
        }
    }

    fn tol(k: &str, op: &str, v: &str, e: &str) -> Toleration {
        Toleration {
            key: Some(k.into()),
            operator: Some(op.into()),
            value: Some(v.into()),
            effect: Some(e.into()),
            ..Default::default()
        }
    }

    #[test]
    fn filter_reason_names_taint() {
        let mut n = node("n", "1", "1Gi", "10");
        n.spec.as_mut().unwrap().taints = Some(vec![
            taint("soft", "x", "PreferNoSchedule"),
            taint("dedicated", "gpu", "NoSchedule"),
        ]);
        let ni = node_info(n);
        let p = PodInfo::new(pod("p", "", ""));
        let st = TaintToleration.filter(&CycleState::default(), &p, &ni);
        assert_eq!(st.code, Code::UnschedulableAndUnresolvable);
        assert_eq!(st.reasons, vec!["node(s) had untolerated taint {dedicated: gpu}"]);
        let mut tp = pod("p", "", "");
        tp.spec.as_mut().unwrap().tolerations = Some(vec![tol("", "Exists", "", "")]);
        assert!(
            TaintToleration
                .filter(&CycleState::default(), &PodInfo::new(tp), &ni)
                .is_success()
        );
    }

    #[test]
    fn prefer_no_schedule_scored() {
        let mut n = node("n", "1", "1Gi", "10");
        n.spec.as_mut().unwrap().taints = Some(vec![
            taint("a", "1", "PreferNoSchedule"),
            taint("b", "1", "PreferNoSchedule"),
        ]);
        let tainted = node_info(n);
        let clean = node_info(node("m", "1", "1Gi", "10"));
        let mut p = pod("p", "", "");
        p.spec.as_mut().unwrap().tolerations = Some(vec![tol("a", "Equal", "1", "PreferNoSchedule")]);
        let p = PodInfo::new(p);
        let s = CycleState::default();
        let mut scores = vec![
            TaintToleration.score(&s, &p, &tainted),
            TaintToleration.score(&s, &p, &clean),
        ];
        assert_eq!(scores, vec![1, 0]);
        TaintToleration.normalize(&s, &mut scores);
        assert_eq!(scores, vec![0, 100]);
    }
}
