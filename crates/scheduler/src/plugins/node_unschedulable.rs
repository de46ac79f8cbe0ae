//! NodeUnschedulable: rejects cordoned nodes unless the pod tolerates the unschedulable taint.

use k8s_openapi::api::core::v1::Taint;

use crate::cache::Cache;
use crate::framework::{CycleState, Plugin, Status};
use crate::types::{NodeInfo, PodInfo};
use skiff_api::nodeaffinity::tolerates;

pub const NAME: &str = "NodeUnschedulable";
pub const ERR_REASON_UNSCHEDULABLE: &str = "node(s) were unschedulable";
pub const TAINT_NODE_UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";

pub struct NodeUnschedulable;

impl Plugin for NodeUnschedulable {
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
        if !node.unschedulable {
            return Status::success();
        }
        let taint = Taint {
            key: TAINT_NODE_UNSCHEDULABLE.to_string(),
            effect: "NoSchedule".to_string(),
            ..Default::default()
        };
        if pod.tolerations.iter().any(|t| tolerates(t, &taint)) {
            return Status::success();
        }
        Status::unresolvable(ERR_REASON_UNSCHEDULABLE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::Code;
    use crate::types::testutil::*;
    use k8s_openapi::api::core::v1::Toleration;

    #[test]
    fn cordoned_node_rejected_unless_tolerated() {
        let mut n = node("n", "1", "1Gi", "10");
        n.spec.as_mut().unwrap().unschedulable = Some(true);
        let ni = node_info(n);
        let p = PodInfo::new(pod("p", "", ""));
        let st = NodeUnschedulable.filter(&CycleState::default(), &p, &ni);
        assert_eq!(st.code, Code::UnschedulableAndUnresolvable);
        assert_eq!(st.reasons, vec![ERR_REASON_UNSCHEDULABLE]);
        let mut tp = pod("p", "", "");
        tp.spec.as_mut().unwrap().tolerations = Some(vec![Toleration {
            key: Some(TAINT_NODE_UNSCHEDULABLE.into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        }]);
        let st = NodeUnschedulable.filter(&CycleState::default(), &PodInfo::new(tp), &ni);
        assert!(st.is_success());
    }
}
