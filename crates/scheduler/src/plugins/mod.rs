//! The default plugins, one file each, named as upstream's.

pub mod default_preemption;
pub mod inter_pod_affinity;
pub mod node_affinity;
pub mod node_name;
pub mod node_ports;
pub mod node_resources_balanced_allocation;
pub mod node_resources_fit;
pub mod node_unschedulable;
pub mod pod_topology_spread;
pub mod taint_toleration;

use crate::framework::Plugin;

/// Upstream's default profile, in its Filter order, with its Score weights.
pub fn default_plugins() -> Vec<Box<dyn Plugin>> {
    vec![
        Box::new(node_unschedulable::NodeUnschedulable),
        Box::new(node_name::NodeName),
        Box::new(taint_toleration::TaintToleration),
        Box::new(node_affinity::NodeAffinity),
        Box::new(node_ports::NodePorts),
        Box::new(node_resources_fit::NodeResourcesFit),
        Box::new(pod_topology_spread::PodTopologySpread),
        Box::new(inter_pod_affinity::InterPodAffinity),
        Box::new(node_resources_balanced_allocation::NodeResourcesBalancedAllocation),
    ]
}
