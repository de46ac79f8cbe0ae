//! The disruption controller (upstream's `pkg/controller/disruption`): every
//! PodDisruptionBudget's status says how many of its pods may be disrupted now, which the
//! eviction subresource (`kubectl drain`) consumes. For a budget's pods (its selector in its
//! namespace):
//! - `expectedPods` and `desiredHealthy`: with an integer `minAvailable`, the pods selected and
//!   that number; with a percentage, or with `maxUnavailable`, the scale of the pods'
//!   controllers (a Deployment through its ReplicaSet, a ReplicaSet, a ReplicationController, a
//!   StatefulSet), the
//!   percentage rounded up;
//! - `currentHealthy`: the Ready pods not being deleted and not disrupted in the last two
//!   minutes (`disruptedPods`, written by evictions; an entry older than that is dropped);
//! - `disruptionsAllowed` = currentHealthy - desiredHealthy (never below 0, and 0 when no pod is
//!   expected), the `DisruptionAllowed` condition (`SufficientPods` / `InsufficientPods`, or
//!   `SyncFailed` when the expected count cannot be found) and `observedGeneration`.
//!
//! A budget is synced when it changes, when a pod it selects changes, and again when a
//! disrupted pod's two minutes run out.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Pod, ReplicationController};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

use crate::controller_utils::{self as cu, Recorder, WorkQueue};
use crate::informers::{Change, Informer, SharedInformerFactory};

/// The controller's name (its service account and role, `system:controller:NAME`).
pub const CONTROLLER_NAME: &str = "disruption-controller";

/// How long an evicted pod counts as disrupted before it must be gone (upstream's
/// `DeletionTimeout`).
const DELETION_TIMEOUT: Duration = Duration::from_secs(120);

struct Ctx {
    client: kube::Client,
    recorder: Recorder,
    pdbs: Informer<PodDisruptionBudget>,
    pods: Informer<Pod>,
    replicasets: Informer<ReplicaSet>,
    replication_controllers: Informer<ReplicationController>,
    deployments: Informer<Deployment>,
    statefulsets: Informer<StatefulSet>,
    queue: WorkQueue,
}

/// The budgets of a pod's namespace whose selector matches it.
fn budgets_for(pdbs: &Informer<PodDisruptionBudget>, pod: &Pod) -> Vec<String> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("");
    pdbs.list_namespace(ns)
        .into_iter()
        .filter(|b| {
            b.spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                .is_some_and(|sel| cu::labels_match(&cu::selector_of(Some(sel)), &pod.metadata))
        })
        .map(|b| crate::informers::object_key(&b.metadata))
        .collect()
}

pub async fn run(client: kube::Client, informers: SharedInformerFactory) -> anyhow::Result<()> {
    let queue = WorkQueue::new();
    let pdbs = informers.informer::<PodDisruptionBudget>();
    let pods = informers.informer::<Pod>();
    let replicasets = informers.informer::<ReplicaSet>();
    let replication_controllers = informers.informer::<ReplicationController>();
    let deployments = informers.informer::<Deployment>();
    let statefulsets = informers.informer::<StatefulSet>();
    {
        let queue = queue.clone();
        pdbs.add_handler(move |c| match c {
            Change::Added(b) | Change::Updated { new: b, .. } => queue.add(crate::informers::object_key(&b.metadata)),
            Change::Deleted(_) => {}
        });
    }
    {
        let (queue, pdbs) = (queue.clone(), pdbs.clone());
        pods.add_handler(move |c| {
            let mut keys: BTreeSet<String> = BTreeSet::new();
            match c {
                Change::Added(p) | Change::Deleted(p) => keys.extend(budgets_for(&pdbs, p)),
                Change::Updated { old, new } => {
                    keys.extend(budgets_for(&pdbs, old));
                    keys.extend(budgets_for(&pdbs, new));
                }
            }
            for k in keys {
                queue.add(k);
            }
        });
    }
    // A change of a controller's scale changes the expected count of percentage budgets.
    {
        let (queue, pdbs) = (queue.clone(), pdbs.clone());
        let requeue_namespace = move |ns: &str| {
            for b in pdbs.list_namespace(ns) {
                queue.add(crate::informers::object_key(&b.metadata));
            }
        };
        let r = requeue_namespace.clone();
        replicasets.add_handler(move |c| {
            if let Change::Updated { old, new } = c
                && old.spec.as_ref().and_then(|s| s.replicas) != new.spec.as_ref().and_then(|s| s.replicas)
            {
                r(new.metadata.namespace.as_deref().unwrap_or(""));
            }
        });
        let r = requeue_namespace.clone();
        replication_controllers.add_handler(move |c| {
            if let Change::Updated { old, new } = c
                && old.spec.as_ref().and_then(|s| s.replicas) != new.spec.as_ref().and_then(|s| s.replicas)
            {
                r(new.metadata.namespace.as_deref().unwrap_or(""));
            }
        });
        let r = requeue_namespace.clone();
        deployments.add_handler(move |c| {
            if let Change::Updated { old, new } = c
                && old.spec.as_ref().and_then(|s| s.replicas) != new.spec.as_ref().and_then(|s| s.replicas)
            {
                r(new.metadata.namespace.as_deref().unwrap_or(""));
            }
        });
        statefulsets.add_handler(move |c| {
            if let Change::Updated { old, new } = c
                && old.spec.as_ref().and_then(|s| s.replicas) != new.spec.as_ref().and_then(|s| s.replicas)
            {
                requeue_namespace(new.metadata.namespace.as_deref().unwrap_or(""));
            }
        });
    }
    pdbs.wait_synced().await;
    pods.wait_synced().await;
    replicasets.wait_synced().await;
    replication_controllers.wait_synced().await;
    deployments.wait_synced().await;
    statefulsets.wait_synced().await;
    let ctx = Arc::new(Ctx {
        recorder: Recorder::for_component(client.clone(), "controllermanager"),
        client,
        pdbs,
        pods,
        replicasets,
        replication_controllers,
        deployments,
        statefulsets,
        queue: queue.clone(),
    });
    queue
        .run("disruption", |key| {
            let ctx = ctx.clone();
            async move { sync(&ctx, &key).await.map(|()| None) }
        })
        .await
}

/// upstream's `GetScaledValueFromIntOrPercent` with rounding up.
fn scaled(v: &IntOrString, total: i32) -> Result<i32, String> {
    match v {
        IntOrString::Int(i) => Ok(*i),
        IntOrString::String(s) => {
            let pct: i64 = s
                .strip_suffix('%')
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| format!("invalid value for IntOrString: invalid value {s:?}"))?;
            Ok(((pct * i64::from(total)) as f64 / 100.0).ceil() as i32)
        }
    }
}

/// upstream's `getExpectedScale`: the sum of the scales of the pods' controllers, each counted
/// once. Pods without a controller are returned apart (upstream's unmanaged pods).
fn expected_scale(ctx: &Ctx, pods: &[Arc<Pod>]) -> Result<(i32, Vec<String>), String> {
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut unmanaged = Vec::new();
    let mut total = 0;
    for pod in pods {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("");
        let Some(owner) = cu::controller_ref(&pod.metadata) else {
            unmanaged.push(pod.metadata.name.clone().unwrap_or_default());
            continue;
        };
        if !seen.insert(owner.uid.clone()) {
            continue;
        }
        let scale = match (owner.api_version.split('/').next().unwrap_or(""), owner.kind.as_str()) {
            ("apps", "ReplicaSet") => {
                let rs = ctx
                    .replicasets
                    .get(ns, &owner.name)
                    .filter(|rs| rs.metadata.uid.as_deref() == Some(owner.uid.as_str()));
                match rs {
                    // A ReplicaSet of a Deployment: the Deployment's scale, once.
                    Some(rs) => match cu::controller_ref(&rs.metadata).filter(|o| o.kind == "Deployment") {
                        Some(d) => {
                            if !seen.insert(d.uid.clone()) {
                                continue;
                            }
                            ctx.deployments
                                .get(ns, &d.name)
                                .filter(|dep| dep.metadata.uid.as_deref() == Some(d.uid.as_str()))
                                .map(|dep| dep.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1))
                        }
                        None => Some(rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)),
                    },
                    None => None,
                }
            }
            ("v1", "ReplicationController") => ctx
                .replication_controllers
                .get(ns, &owner.name)
                .filter(|rc| rc.metadata.uid.as_deref() == Some(owner.uid.as_str()))
                .map(|rc| rc.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)),
            ("apps", "StatefulSet") => ctx
                .statefulsets
                .get(ns, &owner.name)
                .filter(|s| s.metadata.uid.as_deref() == Some(owner.uid.as_str()))
                .map(|s| s.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)),
            _ => None,
        };
        match scale {
            Some(s) => total += s,
            None => {
                return Err(format!(
                    "found no controllers for pod {:?}",
                    pod.metadata.name.as_deref().unwrap_or("")
                ));
            }
        }
    }
    Ok((total, unmanaged))
}

fn is_ready(pod: &Pod) -> bool {
    cu::is_pod_ready(pod)
}

async fn sync(ctx: &Ctx, key: &str) -> anyhow::Result<()> {
    let Some(pdb) = ctx.pdbs.get_key(key) else {
        return Ok(());
    };
    let ns = pdb.metadata.namespace.as_deref().unwrap_or("");
    let spec = pdb.spec.clone().unwrap_or_default();
    // A budget without a selector selects nothing (policy/v1: an empty one selects every pod).
    let pods: Vec<Arc<Pod>> = match &spec.selector {
        Some(sel) => ctx.pods.list_selected(ns, &cu::selector_of(Some(sel))),
        None => Vec::new(),
    };
    if pods.is_empty() {
        ctx.recorder.event(&*pdb, "Normal", "NoPods", "No matching pods found");
    }
    let expected = if let Some(max) = &spec.max_unavailable {
        expected_scale(ctx, &pods).and_then(|(count, unmanaged)| {
            let max = scaled(max, count)?;
            Ok((count, (count - max).max(0), unmanaged))
        })
    } else if let Some(min) = &spec.min_available {
        match min {
            IntOrString::Int(i) => Ok((pods.len() as i32, *i, Vec::new())),
            IntOrString::String(_) => expected_scale(ctx, &pods).and_then(|(count, unmanaged)| {
                let min = scaled(min, count)?;
                Ok((count, min, unmanaged))
            }),
        }
    } else {
        Ok((0, 0, Vec::new()))
    };
    let (expected_count, desired_healthy, unmanaged) = match expected {
        Ok(e) => e,
        Err(reason) => {
            ctx.recorder.event(
                &*pdb,
                "Warning",
                "CalculateExpectedPodCountFailed",
                format!("Failed to calculate the number of expected pods: {reason}"),
            );
            return write_status(ctx, &pdb, None).await;
        }
    };
    if !unmanaged.is_empty() {
        let selector = spec
            .selector
            .as_ref()
            .map(|s| serde_json::to_string(s).unwrap_or_default())
            .unwrap_or_default();
        ctx.recorder.event(
            &*pdb,
            "Normal",
            "UnmanagedPods",
            format!(
                "Pods selected by this PodDisruptionBudget (selector: {selector}) were found to be unmanaged. As a result, the status of the PDB cannot be calculated correctly, which may result in undefined behavior. To account for these pods please set \".spec.minAvailable\" field of the PDB to an integer value."
            ),
        );
    }
    // upstream's buildDisruptedPodMap and countHealthyPods.
    let now = jiff::Timestamp::now();
    let recorded: BTreeMap<String, String> = pdb
        .status
        .as_ref()
        .and_then(|s| s.disrupted_pods.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0.to_string()))
        .collect();
    let mut disrupted: BTreeMap<String, String> = BTreeMap::new();
    let mut recheck: Option<Duration> = None;
    let timeout = jiff::SignedDuration::try_from(DELETION_TIMEOUT).unwrap_or_default();
    for pod in &pods {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = pod.metadata.name.clone().unwrap_or_default();
        let Some(at) = recorded.get(&name) else { continue };
        let Ok(t) = at.parse::<jiff::Timestamp>() else { continue };
        let expires = t.checked_add(timeout).unwrap_or(t);
        if expires <= now {
            tracing::info!(pdb = key, pod = %name, "pod was expected to be deleted by now but was not");
            continue;
        }
        let left = Duration::try_from(expires.duration_since(now)).unwrap_or_default();
        recheck = Some(recheck.map_or(left, |r| r.min(left)));
        disrupted.insert(name, at.clone());
    }
    let current_healthy = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| !disrupted.contains_key(p.metadata.name.as_deref().unwrap_or("")))
        .filter(|p| is_ready(p))
        .count() as i32;
    if let Some(after) = recheck {
        ctx.queue.add_after(key.to_string(), after);
    }
    write_status(
        ctx,
        &pdb,
        Some(Counts {
            current_healthy,
            desired_healthy,
            expected_count,
            disrupted,
        }),
    )
    .await
}

struct Counts {
    current_healthy: i32,
    desired_healthy: i32,
    expected_count: i32,
    disrupted: BTreeMap<String, String>,
}

/// The budget's new status: from the counts, or upstream's `failSafe` (no disruption allowed,
/// reason `SyncFailed`) without them. Written only when it changes.
async fn write_status(ctx: &Ctx, pdb: &PodDisruptionBudget, counts: Option<Counts>) -> anyhow::Result<()> {
    let mut current = serde_json::to_value(pdb)?;
    let old_status = current.get("status").cloned().unwrap_or_else(|| json!({}));
    let generation = pdb.metadata.generation.unwrap_or(0);
    let mut status = old_status.clone();
    let (allowed, reason) = match &counts {
        Some(c) => {
            let mut allowed = c.current_healthy - c.desired_healthy;
            if c.expected_count <= 0 || allowed <= 0 {
                allowed = 0;
            }
            status["currentHealthy"] = json!(c.current_healthy);
            status["desiredHealthy"] = json!(c.desired_healthy);
            status["expectedPods"] = json!(c.expected_count);
            if c.disrupted.is_empty() {
                if let Some(m) = status.as_object_mut() {
                    m.remove("disruptedPods");
                }
            } else {
                status["disruptedPods"] = json!(c.disrupted);
            }
            (
                allowed,
                if allowed > 0 {
                    "SufficientPods"
                } else {
                    "InsufficientPods"
                },
            )
        }
        None => (0, "SyncFailed"),
    };
    status["disruptionsAllowed"] = json!(allowed);
    status["observedGeneration"] = json!(generation);
    set_condition(&mut status, allowed > 0, reason, generation);
    if status == old_status {
        return Ok(());
    }
    current["status"] = status;
    let updated: PodDisruptionBudget = serde_json::from_value(current)?;
    let ns = pdb.metadata.namespace.as_deref().unwrap_or("");
    let name = pdb.metadata.name.as_deref().unwrap_or("");
    Api::<PodDisruptionBudget>::namespaced(ctx.client.clone(), ns)
        .replace_status(name, &PostParams::default(), &updated)
        .await?;
    Ok(())
}

/// upstream's `UpdateDisruptionAllowedCondition`: the `DisruptionAllowed` condition, its
/// transition time moved only when its status changes.
fn set_condition(status: &mut Value, allowed: bool, reason: &str, generation: i64) {
    let want = if allowed { "True" } else { "False" };
    let conditions = status
        .as_object_mut()
        .map(|m| m.entry("conditions").or_insert_with(|| json!([])));
    let Some(Value::Array(conditions)) = conditions else {
        return;
    };
    let now = cu::now().0.to_string();
    match conditions
        .iter_mut()
        .find(|c| c.get("type").and_then(Value::as_str) == Some("DisruptionAllowed"))
    {
        Some(c) => {
            if c.get("status").and_then(Value::as_str) != Some(want) {
                c["lastTransitionTime"] = json!(now);
            }
            c["status"] = json!(want);
            c["reason"] = json!(reason);
            c["message"] = json!("");
            c["observedGeneration"] = json!(generation);
        }
        None => conditions.push(json!({
            "type": "DisruptionAllowed",
            "status": want,
            "reason": reason,
            "message": "",
            "observedGeneration": generation,
            "lastTransitionTime": now,
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages_round_up_as_upstream() {
        assert_eq!(scaled(&IntOrString::String("50%".into()), 3), Ok(2));
        assert_eq!(scaled(&IntOrString::String("10%".into()), 10), Ok(1));
        assert_eq!(scaled(&IntOrString::String("0%".into()), 10), Ok(0));
        assert_eq!(scaled(&IntOrString::Int(4), 10), Ok(4));
        assert!(scaled(&IntOrString::String("half".into()), 10).is_err());
    }

    #[test]
    fn the_condition_moves_its_transition_time_only_on_a_change() {
        let mut status = json!({});
        set_condition(&mut status, true, "SufficientPods", 1);
        let t = status["conditions"][0]["lastTransitionTime"].clone();
        assert_eq!(status["conditions"][0]["status"], "True");
        set_condition(&mut status, true, "SufficientPods", 2);
        assert_eq!(status["conditions"][0]["lastTransitionTime"], t);
        assert_eq!(status["conditions"][0]["observedGeneration"], 2);
        set_condition(&mut status, false, "InsufficientPods", 2);
        assert_eq!(status["conditions"].as_array().map(Vec::len), Some(1));
        assert_eq!(status["conditions"][0]["reason"], "InsufficientPods");
    }
}
