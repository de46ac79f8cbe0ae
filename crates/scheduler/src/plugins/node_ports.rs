//! NodePorts: a pod's host ports must be free on the node.

use crate::cache::Cache;
use crate::framework::{CycleState, Plugin, Status};
use crate::types::{NodeInfo, PodInfo};

pub const NAME: &str = "NodePorts";
pub const ERR_REASON: &str = "node(s) didn't have free ports for the requested pod ports";

pub struct NodePorts;

impl Plugin for NodePorts {
    fn name(&self) -> &'static str {
        NAME
    }

    fn has_filter(&self) -> bool {
        true
    }

    fn pre_filter(&self, _s: &mut CycleState, pod: &PodInfo, _c: &Cache) -> Status {
        if pod.host_ports.is_empty() {
            Status::skip()
        } else {
            Status::success()
        }
    }

    fn filter(&self, _s: &CycleState, pod: &PodInfo, node: &NodeInfo) -> Status {
        let conflict = pod
            .host_ports
            .iter()
            .any(|want| node.used_ports.iter().any(|used| used.conflicts(want)));
        if conflict {
            Status::unschedulable(ERR_REASON)
        } else {
            Status::success()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::Code;
    use crate::types::testutil::*;
    use k8s_openapi::api::core::v1::{ContainerPort, Pod};
    use std::sync::Arc;

    fn with_port(name: &str, ip: Option<&str>, proto: &str, port: i32) -> Pod {
        let mut p = pod(name, "", "");
        p.spec.as_mut().unwrap().containers[0].ports = Some(vec![ContainerPort {
            container_port: 80,
            host_port: Some(port),
            host_ip: ip.map(str::to_string),
            protocol: Some(proto.into()),
            ..Default::default()
        }]);
        p
    }

    #[test]
    fn conflicts_as_upstream() {
        let s = CycleState::default();
        let mut ni = node_info(node("n", "1", "1Gi", "10"));
        ni.add_pod(Arc::new(PodInfo::new(with_port("a", Some("127.0.0.1"), "TCP", 8080))));
        // Same port, other protocol: fine.
        assert!(
            NodePorts
                .filter(&s, &PodInfo::new(with_port("b", None, "UDP", 8080)), &ni)
                .is_success()
        );
        // Other ip: fine.
        assert!(
            NodePorts
                .filter(&s, &PodInfo::new(with_port("b", Some("127.0.0.2"), "TCP", 8080)), &ni)
                .is_success()
        );
        // Wildcard ip conflicts with any ip.
        let st = NodePorts.filter(&s, &PodInfo::new(with_port("b", None, "TCP", 8080)), &ni);
        assert_eq!(st.code, Code::Unschedulable);
        assert_eq!(st.reasons, vec![ERR_REASON]);
    }
}
