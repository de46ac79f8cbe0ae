//! DefaultPreemption (PostFilter): when a pod fits nowhere, find a node where evicting
//! lower-priority pods makes it fit, with as little harm as possible, as upstream does.

use std::sync::Arc;

use crate::cache::Cache;
use crate::framework::{Code, CycleState, Diagnosis, Framework, Status, fit_error_message};
use crate::types::{NodeInfo, PodInfo};

pub const NAME: &str = "DefaultPreemption";
pub const REASON_NOT_HELPFUL: &str = "Preemption is not helpful for scheduling";
pub const REASON_NO_VICTIMS: &str = "No preemption victims found for incoming pod";
/// Upstream's minCandidateNodesPercentage / minCandidateNodesAbsolute.
const MIN_CANDIDATE_NODES_PERCENTAGE: usize = 10;
const MIN_CANDIDATE_NODES_ABSOLUTE: usize = 100;

/// A node where preemption makes the pod fit, and the pods to evict there.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub node: usize,
    pub victims: Vec<Arc<PodInfo>>,
    /// Victims whose eviction a PodDisruptionBudget does not allow.
    pub pdb_violations: usize,
}

/// A PodDisruptionBudget as preemption sees it.
#[derive(Debug, Clone)]
pub struct Pdb {
    pub namespace: String,
    pub selector: crate::labels::Selector,
    pub disruptions_allowed: i32,
}

/// Upstream's filterPodsWithPDBViolation: splits pods (most important first) into those whose
/// eviction would violate a budget and those that would not.
fn split_by_pdb(pods: Vec<Arc<PodInfo>>, pdbs: &[Pdb]) -> (Vec<Arc<PodInfo>>, Vec<Arc<PodInfo>>) {
    let mut allowed: Vec<i32> = pdbs.iter().map(|p| p.disruptions_allowed).collect();
    let mut violating = Vec::new();
    let mut fine = Vec::new();
    for p in pods {
        let mut violated = false;
        for (i, pdb) in pdbs.iter().enumerate() {
            if pdb.namespace != p.namespace || pdb.selector.is_empty_match_all() || !pdb.selector.matches(&p.labels) {
                continue;
            }
            if allowed[i] <= 0 {
                violated = true;
            } else {
                allowed[i] -= 1;
            }
        }
        if violated {
            violating.push(p);
        } else {
            fine.push(p);
        }
    }
    (violating, fine)
}

/// Upstream's PodEligibleToPreemptOthers; Err carries the message.
pub fn eligible(pod: &PodInfo, cache: &Cache) -> Result<(), String> {
    if pod.preemption_policy_never() {
        return Err("not eligible due to preemptionPolicy=Never.".into());
    }
    if let Some(nominated) = pod.nominated_node()
        && let Some(ni) = cache.node(nominated)
        && ni.pods.iter().any(|p| p.deleting && p.priority < pod.priority)
    {
        return Err("not eligible due to a terminating pod on the nominated node.".into());
    }
    Ok(())
}

/// Removes lower-priority pods until the pod fits, then re-adds as many as possible (most
/// important first). Returns the victims, or the status explaining why the node cannot help.
/// The pods nominated to the node with at least the pod's priority count as placed there (as
/// upstream's RunFilterPluginsWithNominatedPods), so that two preemptors do not both count on
/// the room one eviction makes.
fn select_victims_on_node(
    fw: &Framework,
    state: &CycleState,
    pod: &PodInfo,
    node: &NodeInfo,
    cache: &Cache,
) -> Result<(Vec<Arc<PodInfo>>, usize), Status> {
    let pdbs = &cache.pdbs;
    let mut potential: Vec<Arc<PodInfo>> = node
        .pods
        .iter()
        .filter(|p| p.priority < pod.priority)
        .cloned()
        .collect();
    if potential.is_empty() {
        return Err(Status::unresolvable(REASON_NO_VICTIMS));
    }
    // The dry run works on a copy, made only for a node with something to evict.
    let mut sim = node.clone();
    for n in cache.nominated_on(&node.name) {
        if n.uid != pod.uid && n.priority >= pod.priority {
            sim.add_pod(n.clone());
        }
    }
    for v in &potential {
        sim.remove_pod(&v.uid);
    }
    let (st, _) = fw.run_filters(state, pod, cache, &sim);
    if !st.is_success() {
        return Err(st);
    }
    // Most important first: higher priority, then earlier start.
    potential.sort_by(|a, b| {
        b.priority.cmp(&a.priority).then_with(|| {
            let sa = a.pod.status.as_ref().and_then(|s| s.start_time.as_ref()).map(|t| t.0);
            let sb = b.pod.status.as_ref().and_then(|s| s.start_time.as_ref()).map(|t| t.0);
            sa.cmp(&sb)
        })
    });
    // Try to keep the pods protected by a budget first, then the others.
    let (violating, fine) = split_by_pdb(potential, pdbs);
    let mut victims = Vec::new();
    let mut violations = 0;
    for (protected, group) in [(true, violating), (false, fine)] {
        for v in group {
            sim.add_pod(v.clone());
            let (st, _) = fw.run_filters(state, pod, cache, &sim);
            if !st.is_success() {
                sim.remove_pod(&v.uid);
                victims.push(v);
                if protected {
                    violations += 1;
                }
            }
        }
    }
    Ok((victims, violations))
}

/// Runs preemption for a pod that failed Filter. Ok: the chosen candidate. Err: the
/// PostFilter message without the "preemption: " prefix.
pub fn preempt(
    fw: &Framework,
    state: Option<&CycleState>,
    pod: &PodInfo,
    cache: &Cache,
    diag: &Diagnosis,
) -> Result<Candidate, String> {
    eligible(pod, cache)?;
    let num_all = cache.num_nodes();
    let not_helpful = Status::unresolvable(REASON_NOT_HELPFUL);
    let mut statuses: Vec<Status> = Vec::new();
    let mut potential = Vec::new();
    for (idx, st) in &diag.node_statuses {
        if st.code == Code::Unschedulable {
            potential.push(*idx);
        } else {
            statuses.push(not_helpful.clone());
        }
    }
    let Some(state) = state.filter(|_| !potential.is_empty()) else {
        return Err(fit_error_message(
            num_all,
            None,
            std::iter::repeat_n(&not_helpful, num_all),
            None,
        ));
    };
    let want = (num_all * MIN_CANDIDATE_NODES_PERCENTAGE / 100)
        .max(MIN_CANDIDATE_NODES_ABSOLUTE)
        .min(num_all.max(1));
    let mut candidates = Vec::new();
    for idx in potential {
        if candidates.len() >= want {
            break;
        }
        match select_victims_on_node(fw, state, pod, &cache.nodes()[idx], cache) {
            Ok((victims, pdb_violations)) => candidates.push(Candidate {
                node: idx,
                victims,
                pdb_violations,
            }),
            Err(st) => statuses.push(st),
        }
    }
    if candidates.is_empty() {
        // Nodes not examined count as "not helpful", as upstream's absent nodes.
        let absent = num_all.saturating_sub(statuses.len());
        let all: Vec<&Status> = statuses
            .iter()
            .chain(std::iter::repeat_n(&not_helpful, absent))
            .collect();
        return Err(fit_error_message(num_all, None, all.into_iter(), None));
    }
    Ok(pick_one(candidates))
}

/// Upstream's pickOneNodeForPreemption: fewest budget violations, then lowest highest-victim
/// priority, then lowest priority sum, then fewest victims, then first found.
fn pick_one(mut candidates: Vec<Candidate>) -> Candidate {
    let key = |c: &Candidate| {
        let highest = c.victims.iter().map(|v| v.priority).max().unwrap_or(i32::MIN);
        let sum: i64 = c
            .victims
            .iter()
            .map(|v| i64::from(v.priority) + i64::from(i32::MAX) + 1)
            .sum();
        (c.pdb_violations, highest, sum, c.victims.len())
    };
    let mut best = 0;
    for i in 1..candidates.len() {
        if key(&candidates[i]) < key(&candidates[best]) {
            best = i;
        }
    }
    candidates.swap_remove(best)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::testutil::*;
    use k8s_openapi::api::core::v1::Pod;

    fn prio(mut p: Pod, prio: i32) -> Pod {
        p.spec.as_mut().unwrap().priority = Some(prio);
        p
    }

    fn bound(p: Pod, node: &str) -> Arc<PodInfo> {
        let mut p = p;
        p.spec.as_mut().unwrap().node_name = Some(node.into());
        Arc::new(PodInfo::new(p))
    }

    fn attempt(c: &Cache, p: &PodInfo) -> Result<(usize, Vec<String>), String> {
        let mut fw = Framework::with_default_plugins(0);
        let (diag, state) = match fw.schedule(p, c) {
            Ok(_) => panic!("pod should not fit"),
            Err(e) => *e,
        };
        preempt(&fw, state.as_ref(), p, c, &diag)
            .map(|cand| (cand.node, cand.victims.iter().map(|v| v.name.clone()).collect()))
    }

    #[test]
    fn evicts_fewest_lowest_priority() {
        let mut c = Cache::new();
        c.upsert_node(Arc::new(node("n1", "2", "8Gi", "110")));
        c.upsert_node(Arc::new(node("n2", "2", "8Gi", "110")));
        c.upsert_bound_pod(bound(prio(pod("low1", "1", ""), 1), "n1"));
        c.upsert_bound_pod(bound(prio(pod("low2", "1", ""), 1), "n1"));
        c.upsert_bound_pod(bound(prio(pod("mid", "2", ""), 5), "n2"));
        let p = PodInfo::new(prio(pod("high", "1", ""), 10));
        let (node, victims) = attempt(&c, &p).unwrap();
        assert_eq!(c.node_name(node), "n1");
        assert_eq!(victims.len(), 1);
    }

    #[test]
    fn nominated_preemptors_keep_their_room() {
        let mut c = Cache::new();
        c.upsert_node(Arc::new(node("n1", "2", "8Gi", "110")));
        c.upsert_node(Arc::new(node("n2", "2", "8Gi", "110")));
        c.upsert_bound_pod(bound(prio(pod("low1", "2", ""), 1), "n1"));
        c.upsert_bound_pod(bound(prio(pod("low2", "2", ""), 5), "n2"));
        // n1 would be chosen (its victim has the lower priority)...
        let first = Arc::new(PodInfo::new(prio(pod("high1", "2", ""), 10)));
        let (chosen, _) = attempt(&c, &first).unwrap();
        assert_eq!(c.node_name(chosen), "n1");
        // ...but once a pod of the same priority is nominated there, the next preemptor
        // finds no room on n1 even without low1, and evicts on n2.
        c.set_nominated(&first, Some("n1"));
        let second = PodInfo::new(prio(pod("high2", "2", ""), 10));
        let (chosen, victims) = attempt(&c, &second).unwrap();
        assert_eq!((c.node_name(chosen), victims), ("n2", vec!["low2".to_string()]));
        // A lower-priority nomination does not hold the room.
        let mut c2 = Cache::new();
        c2.upsert_node(Arc::new(node("n1", "2", "8Gi", "110")));
        c2.upsert_bound_pod(bound(prio(pod("low1", "2", ""), 1), "n1"));
        c2.set_nominated(&Arc::new(PodInfo::new(prio(pod("mid", "2", ""), 3))), Some("n1"));
        let (chosen, _) = attempt(&c2, &second).unwrap();
        assert_eq!(c2.node_name(chosen), "n1");
    }

    #[test]
    fn prefers_nodes_without_budget_violations() {
        let mut c = Cache::new();
        c.upsert_node(Arc::new(node("n1", "2", "8Gi", "110")));
        c.upsert_node(Arc::new(node("n2", "2", "8Gi", "110")));
        let mut guarded = prio(pod("guarded", "2", ""), 1);
        guarded.metadata.labels = Some([("app".to_string(), "db".to_string())].into());
        c.upsert_bound_pod(bound(guarded, "n1"));
        // n2's victim has a higher priority, but evicting it breaks no budget.
        c.upsert_bound_pod(bound(prio(pod("free", "2", ""), 5), "n2"));
        c.pdbs.push(Pdb {
            namespace: "default".into(),
            selector: crate::labels::Selector::from_map(&[("app".to_string(), "db".to_string())].into()),
            disruptions_allowed: 0,
        });
        let p = PodInfo::new(prio(pod("high", "1", ""), 10));
        let (node, victims) = attempt(&c, &p).unwrap();
        assert_eq!(c.node_name(node), "n2");
        assert_eq!(victims, vec!["free"]);
        c.pdbs.clear();
        let (node, _) = attempt(&c, &p).unwrap();
        assert_eq!(c.node_name(node), "n1");
    }

    #[test]
    fn not_helpful_and_no_victims_messages() {
        let mut c = Cache::new();
        c.upsert_node(Arc::new(node("n1", "2", "8Gi", "110")));
        c.upsert_node(Arc::new(node("n2", "2", "8Gi", "110")));
        c.upsert_bound_pod(bound(prio(pod("a", "2", ""), 100), "n1"));
        c.upsert_bound_pod(bound(prio(pod("b", "2", ""), 100), "n2"));
        let p = PodInfo::new(prio(pod("p", "1", ""), 10));
        assert_eq!(
            attempt(&c, &p).unwrap_err(),
            "0/2 nodes are available: 2 No preemption victims found for incoming pod."
        );
        let big = PodInfo::new(prio(pod("big", "3", ""), 1000));
        assert_eq!(
            attempt(&c, &big).unwrap_err(),
            "0/2 nodes are available: 2 Preemption is not helpful for scheduling."
        );
        let mut never = prio(pod("n", "1", ""), 1000);
        never.spec.as_mut().unwrap().preemption_policy = Some("Never".into());
        assert_eq!(
            attempt(&c, &PodInfo::new(never)).unwrap_err(),
            "not eligible due to preemptionPolicy=Never."
        );
    }
}
