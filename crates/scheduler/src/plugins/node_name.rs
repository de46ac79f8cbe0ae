//! NodeName: a pod naming a node fits only that node.

use crate::cache::Cache;
use crate::framework::{CycleState, Plugin, Status};
use crate::types::{NodeInfo, PodInfo};

pub const NAME: &str = "NodeName";
pub const ERR_REASON: &str = "node(s) didn't match the requested node name";

pub struct NodeName;

impl Plugin for NodeName {
    fn name(&self) -> &'static str {
        NAME
    }

    fn has_filter(&self) -> bool {
        true
    }

    fn pre_filter(&self, _s: &mut CycleState, pod: &PodInfo, _c: &Cache) -> Status {
        if pod.node_name.is_some() {
            Status::success()
        } else {
            Status::skip()
        }
    }

    fn filter(&self, _s: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        match &pod.node_name {
            Some(n) if *n != node.name => Status::unresolvable(ERR_REASON),
            _ => Status::success(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::testutil::*;

    #[test]
    fn matches_only_named_node() {
        let mut p = pod("p", "", "");
        p.spec.as_mut().unwrap().node_name = Some("a".into());
        let p = PodInfo::new(p);
        let s = CycleState::default();
        assert!(
            NodeName
                .filter(&s, &p, &node_info(node("a", "1", "1", "1")))
                .is_success()
        );
        let st = NodeName.filter(&s, &p, &node_info(node("b", "1", "1", "1")));
        assert_eq!(st.reasons, vec![ERR_REASON]);
    }
}
