//! NodeResourcesFit: the pod's requests must fit the node's allocatable minus what is
//! requested there; scores with the LeastAllocated strategy (cpu and memory, weight 1 each).

use std::borrow::Cow;

use crate::cache::Cache;
use crate::framework::{Code, CycleState, MAX_NODE_SCORE, Plugin, Status};
use crate::types::{NodeInfo, PodInfo};

pub const NAME: &str = "NodeResourcesFit";

/// One resource the pod does not get on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InsufficientResource {
    pub resource: Cow<'static, str>,
    pub reason: Cow<'static, str>,
    pub requested: i64,
    pub used: i64,
    pub capacity: i64,
    /// Even an empty node would not fit the pod: preemption cannot help.
    pub unresolvable: bool,
}

/// Upstream's fitsRequest.
pub fn fits_request(pod: &PodInfo, node: &NodeInfo) -> Vec<InsufficientResource> {
    let mut out = Vec::new();
    let alloc = &node.allocatable;
    let used = &node.requested;
    let pods = node.pods.len() as i64;
    if pods + 1 > alloc.allowed_pods {
        out.push(InsufficientResource {
            resource: "pods".into(),
            reason: "Too many pods".into(),
            requested: 1,
            used: pods,
            capacity: alloc.allowed_pods,
            unresolvable: false,
        });
    }
    let req = &pod.requests;
    if req.is_zero() {
        return out;
    }
    // The reasons of the built-in resources are constants: a full cluster rejects many nodes
    // per cycle, and none of them should cost a formatted message.
    let mut check = |name: &str, want: i64, have: i64, used: i64| {
        if want > 0 && want > have - used {
            let (resource, reason) = match name {
                "cpu" => (Cow::Borrowed("cpu"), Cow::Borrowed("Insufficient cpu")),
                "memory" => (Cow::Borrowed("memory"), Cow::Borrowed("Insufficient memory")),
                "ephemeral-storage" => (
                    Cow::Borrowed("ephemeral-storage"),
                    Cow::Borrowed("Insufficient ephemeral-storage"),
                ),
                other => (
                    Cow::Owned(other.to_string()),
                    Cow::Owned(format!("Insufficient {other}")),
                ),
            };
            out.push(InsufficientResource {
                resource,
                reason,
                requested: want,
                used,
                capacity: have,
                unresolvable: want > have,
            });
        }
    };
    check("cpu", req.milli_cpu, alloc.milli_cpu, used.milli_cpu);
    check("memory", req.memory, alloc.memory, used.memory);
    check(
        "ephemeral-storage",
        req.ephemeral_storage,
        alloc.ephemeral_storage,
        used.ephemeral_storage,
    );
    for (name, want) in &req.scalar {
        check(name, *want, alloc.scalar(name), used.scalar(name));
    }
    out
}

/// Whether [`fits_request`] finds nothing missing, without building its answer: the filter's
/// common case on every node it passes.
fn fits(pod: &PodInfo, node: &NodeInfo) -> bool {
    let alloc = &node.allocatable;
    let used = &node.requested;
    if node.pods.len() as i64 + 1 > alloc.allowed_pods {
        return false;
    }
    let req = &pod.requests;
    let ok = |want: i64, have: i64, used: i64| want <= 0 || want <= have - used;
    ok(req.milli_cpu, alloc.milli_cpu, used.milli_cpu)
        && ok(req.memory, alloc.memory, used.memory)
        && ok(req.ephemeral_storage, alloc.ephemeral_storage, used.ephemeral_storage)
        && req
            .scalar
            .iter()
            .all(|(name, want)| ok(*want, alloc.scalar(name), used.scalar(name)))
}

fn least_requested(requested: i64, capacity: i64) -> i64 {
    if capacity == 0 || requested > capacity {
        return 0;
    }
    (capacity - requested) * MAX_NODE_SCORE / capacity
}

pub struct NodeResourcesFit;

impl Plugin for NodeResourcesFit {
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
        if fits(pod, node) {
            return Status::success();
        }
        let insufficient = fits_request(pod, node);
        if insufficient.is_empty() {
            return Status::success();
        }
        let code = if insufficient.iter().any(|r| r.unresolvable) {
            Code::UnschedulableAndUnresolvable
        } else {
            Code::Unschedulable
        };
        Status {
            code,
            reasons: insufficient.into_iter().map(|r| r.reason).collect(),
            plugin: "",
        }
    }

    fn score_weight(&self) -> i64 {
        1
    }

    fn score(&self, _s: &CycleState, pod: &PodInfo, node: &NodeInfo) -> i64 {
        let mut total = 0;
        let mut weights = 0;
        for (req, cap) in [
            (node.non_zero_cpu + pod.non_zero_cpu, node.allocatable.milli_cpu),
            (node.non_zero_mem + pod.non_zero_mem, node.allocatable.memory),
        ] {
            if cap == 0 {
                continue;
            }
            total += least_requested(req, cap);
            weights += 1;
        }
        if weights == 0 { 0 } else { total / weights }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::testutil::*;
    use std::sync::Arc;

    fn filter(p: &PodInfo, n: &NodeInfo) -> Status {
        NodeResourcesFit.filter(&CycleState::default(), p, n)
    }

    #[test]
    fn fast_check_agrees_with_fits_request() {
        let mut ni = node_info(node("n", "10", "20", "3"));
        ni.add_pod(Arc::new(PodInfo::new(pod("e", "5", "19"))));
        for (cpu, mem) in [("", ""), ("5", "1"), ("6", "1"), ("1", "2"), ("11", ""), ("0", "0")] {
            let p = PodInfo::new(pod("p", cpu, mem));
            assert_eq!(fits(&p, &ni), fits_request(&p, &ni).is_empty(), "{cpu} {mem}");
        }
        ni.add_pod(Arc::new(PodInfo::new(pod("f", "", ""))));
        ni.add_pod(Arc::new(PodInfo::new(pod("g", "", ""))));
        let p = PodInfo::new(pod("p", "", ""));
        assert!(!fits(&p, &ni) && !fits_request(&p, &ni).is_empty());
    }

    #[test]
    fn insufficient_cpu_and_memory() {
        let mut ni = node_info(node("n", "10", "20", "32"));
        ni.add_pod(Arc::new(PodInfo::new(pod("e", "5", "19"))));
        let st = filter(&PodInfo::new(pod("p", "8", "10")), &ni);
        assert_eq!(st.code, Code::Unschedulable);
        assert_eq!(st.reasons, vec!["Insufficient cpu", "Insufficient memory"]);
        assert!(filter(&PodInfo::new(pod("p", "5", "1")), &ni).is_success());
    }

    #[test]
    fn larger_than_node_is_unresolvable() {
        let ni = node_info(node("n", "4", "16Gi", "110"));
        let st = filter(&PodInfo::new(pod("p", "5", "")), &ni);
        assert_eq!(st.code, Code::UnschedulableAndUnresolvable);
        assert_eq!(st.reasons, vec!["Insufficient cpu"]);
    }

    #[test]
    fn too_many_pods_even_without_requests() {
        let mut ni = node_info(node("n", "4", "16Gi", "1"));
        ni.add_pod(Arc::new(PodInfo::new(pod("e", "", ""))));
        let st = filter(&PodInfo::new(pod("p", "", "")), &ni);
        assert_eq!(st.reasons, vec!["Too many pods"]);
        assert_eq!(st.code, Code::Unschedulable);
    }

    #[test]
    fn no_requests_take_no_share() {
        let mut ni = node_info(node("n", "1", "1Gi", "110"));
        ni.add_pod(Arc::new(PodInfo::new(pod("e", "1", "1Gi"))));
        assert!(filter(&PodInfo::new(pod("p", "", "")), &ni).is_success());
    }

    #[test]
    fn extended_resources() {
        let mut n = node("n", "4", "16Gi", "110");
        n.status
            .as_mut()
            .unwrap()
            .allocatable
            .as_mut()
            .unwrap()
            .insert("nvidia.com/gpu".into(), q("1"));
        let ni = node_info(n);
        let mut p = pod("p", "", "");
        p.spec.as_mut().unwrap().containers[0]
            .resources
            .as_mut()
            .unwrap()
            .requests = Some([("nvidia.com/gpu".to_string(), q("2"))].into());
        let st = filter(&PodInfo::new(p.clone()), &ni);
        assert_eq!(st.reasons, vec!["Insufficient nvidia.com/gpu"]);
        let plain = node_info(node("m", "4", "16Gi", "110"));
        assert_eq!(
            filter(&PodInfo::new(p), &plain).reasons,
            vec!["Insufficient nvidia.com/gpu"]
        );
    }

    #[test]
    fn least_allocated_score() {
        // Upstream case: node 4000m/10000, pod 3000m/5000 (non-zero) on an empty node:
        // cpu (4000-3000)*100/4000 = 25, memory (10000-5000)*100/10000 = 50 -> 37.
        let ni = node_info(node("n", "4", "10000", "110"));
        let p = PodInfo::new(pod("p", "3", "5000"));
        assert_eq!(NodeResourcesFit.score(&CycleState::default(), &p, &ni), 37);
    }
}
