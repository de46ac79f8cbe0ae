//! NodeResourcesBalancedAllocation: favours nodes whose cpu and memory use stay balanced.

use crate::cache::Cache;
use crate::framework::{CycleState, MAX_NODE_SCORE, Plugin};
use crate::types::{NodeInfo, PodInfo};

pub const NAME: &str = "NodeResourcesBalancedAllocation";

pub struct NodeResourcesBalancedAllocation;

/// Upstream's balancedResourceScorer: (1 - standard deviation of the fractions) * 100.
pub fn balanced_score(fractions: &[f64]) -> i64 {
    if fractions.is_empty() {
        return 0;
    }
    let n = fractions.len() as f64;
    let mean = fractions.iter().sum::<f64>() / n;
    let var = fractions.iter().map(|f| (f - mean) * (f - mean)).sum::<f64>() / n;
    let std = if fractions.len() == 2 {
        (fractions[0] - fractions[1]).abs() / 2.0
    } else {
        var.sqrt()
    };
    ((1.0 - std) * MAX_NODE_SCORE as f64) as i64
}

impl Plugin for NodeResourcesBalancedAllocation {
    fn name(&self) -> &'static str {
        NAME
    }

    fn score_weight(&self) -> i64 {
        1
    }

    /// As upstream: best-effort pods (no cpu or memory requests) are not scored, so they do
    /// not all pile onto one node.
    fn pre_score(&self, _s: &mut CycleState, pod: &PodInfo, _c: &Cache, _f: &[usize]) -> bool {
        pod.requests.milli_cpu != 0 || pod.requests.memory != 0
    }

    fn score(&self, _s: &CycleState, pod: &PodInfo, node: &NodeInfo) -> i64 {
        let mut fr = [0.0f64; 2];
        let mut n = 0;
        for (req, cap) in [
            (
                node.requested.milli_cpu + pod.requests.milli_cpu,
                node.allocatable.milli_cpu,
            ),
            (node.requested.memory + pod.requests.memory, node.allocatable.memory),
        ] {
            if cap == 0 {
                continue;
            }
            fr[n] = (req as f64 / cap as f64).min(1.0);
            n += 1;
        }
        balanced_score(&fr[..n])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::testutil::*;
    use std::sync::Arc;

    #[test]
    fn balanced() {
        // Upstream case: node 10000m/20000, requested 3000m/5000 + pod 0 -> fractions 0.3, 0.25
        // -> std 0.025 -> 97.
        let mut ni = node_info(node("n", "10", "20000", "110"));
        ni.add_pod(Arc::new(PodInfo::new(pod("a", "3", "5000"))));
        let p = PodInfo::new(pod("p", "", ""));
        assert_eq!(
            NodeResourcesBalancedAllocation.score(&CycleState::default(), &p, &ni),
            97
        );
        assert_eq!(balanced_score(&[0.5, 0.5]), 100);
        let mut s = CycleState::default();
        assert!(!NodeResourcesBalancedAllocation.pre_score(&mut s, &p, &crate::cache::Cache::new(), &[]));
        assert_eq!(balanced_score(&[1.0, 0.0]), 50);
    }
}
