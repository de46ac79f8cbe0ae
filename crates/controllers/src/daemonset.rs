//! The DaemonSet controller (upstream's `pkg/controller/daemon`): one pod on every node the
//! template fits (node name, required node affinity and node selector, taints), created with a
//! required node affinity `matchFields metadata.name In [node]` for the scheduler to bind and
//! the daemon tolerations; failed and surplus pods are deleted; RollingUpdate replaces old pods
//! within maxUnavailable; ControllerRevisions keep the history.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{
    Affinity, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSpec,
    PodTemplateSpec, Taint, Toleration,
};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use skiff_api::nodeaffinity::{RequiredNodeAffinity, find_matching_untolerated_taint};

use crate::controller_utils::{self as cu, Recorder, WorkQueue};
use crate::history;

pub const COMPONENT: &str = "daemonset-controller";
pub const TEMPLATE_GENERATION_LABEL: &str = "pod-template-generation";

struct Ctx {
    client: kube::Client,
    recorder: Recorder,
}

pub async fn run(client: kube::Client, informers: crate::informers::SharedInformerFactory) -> anyhow::Result<()> {
    let queue = WorkQueue::new();
    let store = cu::spawn_owner_watch(Api::<DaemonSet>::all(client.clone()), queue.clone());
    let s = store.clone();
    // Pod events come from the process's shared pod informer (one watch for every controller).
    cu::on_changes(&informers.informer::<Pod>(), queue.clone(), move |p: &Pod| {
        cu::owner_keys(&s, &p.metadata, "DaemonSet", |d: &DaemonSet| {
            d.spec.as_ref().map(|s| &s.selector)
        })
    });
    // Node changes matter only when they can change where daemons run: heartbeats do not
    // (upstream's `nodeInSameCondition`).
    let s = store.clone();
    let mut seen: HashMap<String, String> = HashMap::new();
    cu::spawn_watch_events(
        Api::<Node>::all(client.clone()),
        queue.clone(),
        move |n: &Node, deleted| {
            let name = n.metadata.name.clone().unwrap_or_default();
            if deleted {
                seen.remove(&name);
            } else {
                let fp = node_fingerprint(n);
                if seen.get(&name) == Some(&fp) {
                    return Vec::new();
                }
                seen.insert(name, fp);
            }
            s.state().iter().flat_map(|d| cu::self_key(d.as_ref())).collect()
        },
    );
    let ctx = Ctx {
        recorder: Recorder::for_component(client.clone(), COMPONENT),
        client,
    };
    queue.run("daemonset", |key| sync(&ctx, key)).await
}

// ---- predicates ----

/// What of a node decides whether daemons run there: labels, taints, unschedulable and the
/// condition statuses (not their heartbeat times).
fn node_fingerprint(n: &Node) -> String {
    let conditions: Vec<(String, String)> = n
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|cs| cs.iter().map(|c| (c.type_.clone(), c.status.clone())).collect())
        .unwrap_or_default();
    serde_json::json!({
        "labels": n.metadata.labels,
        "taints": n.spec.as_ref().and_then(|s| s.taints.as_ref()),
        "unschedulable": n.spec.as_ref().and_then(|s| s.unschedulable),
        "conditions": conditions,
    })
    .to_string()
}

/// The tolerations every daemon pod gets (upstream's `AddOrUpdateDaemonPodTolerations`).
pub fn add_daemon_tolerations(spec: &mut PodSpec) {
    let mut wanted = vec![
        ("node.kubernetes.io/not-ready", "NoExecute"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"),
        ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"),
        ("node.kubernetes.io/unschedulable", "NoSchedule"),
    ];
    if spec.host_network == Some(true) {
        wanted.push(("node.kubernetes.io/network-unavailable", "NoSchedule"));
    }
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    for (key, effect) in wanted {
        let t = Toleration {
            key: Some(key.to_string()),
            operator: Some("Exists".into()),
            effect: Some(effect.to_string()),
            value: None,
            toleration_seconds: None,
        };
        if !tolerations.contains(&t) {
            tolerations.push(t);
        }
    }
}

fn untolerated(taints: &[Taint], tolerations: &[Toleration], effect: impl Fn(&str) -> bool) -> bool {
    find_matching_untolerated_taint(taints, tolerations, |t| effect(&t.effect)).is_some()
}

/// The pod's required node affinity and node selector hold on the node (upstream's
/// `RequiredNodeAffinity.Match`).
pub fn fits_node_affinity(spec: &PodSpec, node: &Node) -> bool {
    let empty = BTreeMap::new();
    RequiredNodeAffinity::new(Some(spec)).matches(
        node.metadata.name.as_deref().unwrap_or_default(),
        node.metadata.labels.as_ref().unwrap_or(&empty),
    )
}

/// Upstream's `NodeShouldRunDaemonPod`: (should run, should continue running).
pub fn node_should_run(template: &PodTemplateSpec, node: &Node) -> (bool, bool) {
    let mut spec = template.spec.clone().unwrap_or_default();
    add_daemon_tolerations(&mut spec);
    let node_name = node.metadata.name.clone().unwrap_or_default();
    if let Some(n) = spec.node_name.as_deref()
        && !n.is_empty()
        && n != node_name
    {
        return (false, false);
    }
    if !fits_node_affinity(&spec, node) {
        return (false, false);
    }
    let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
    let tolerations = spec.tolerations.clone().unwrap_or_default();
    if untolerated(&taints, &tolerations, |e| e == "NoSchedule" || e == "NoExecute") {
        let keeps = !untolerated(&taints, &tolerations, |e| e == "NoExecute");
        return (false, keeps);
    }
    (true, true)
}

/// Upstream's `ReplaceDaemonSetPodNodeNameNodeAffinity`.
pub fn replace_node_name_affinity(affinity: Option<Affinity>, node: &str) -> Affinity {
    let term = NodeSelectorTerm {
        match_expressions: None,
        match_fields: Some(vec![NodeSelectorRequirement {
            key: "metadata.name".into(),
            operator: "In".into(),
            values: Some(vec![node.to_string()]),
        }]),
    };
    let mut a = affinity.unwrap_or_default();
    let na = a.node_affinity.get_or_insert_with(NodeAffinity::default);
    match na.required_during_scheduling_ignored_during_execution.as_mut() {
        Some(r) => r.node_selector_terms = vec![term],
        None => {
            na.required_during_scheduling_ignored_during_execution = Some(NodeSelector {
                node_selector_terms: vec![term],
            })
        }
    }
    a
}

/// The node a daemon pod is for: its node name, else the node its affinity names.
pub fn target_node(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if let Some(n) = spec.node_name.as_ref().filter(|n| !n.is_empty()) {
        return Some(n.clone());
    }
    let terms = &spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    for t in terms {
        for f in t.match_fields.iter().flatten() {
            if f.key == "metadata.name" && f.operator == "In" {
                let vs = f.values.clone().unwrap_or_default();
                if vs.len() == 1 {
                    return vs.into_iter().next();
                }
            }
        }
    }
    None
}

fn pod_hash(p: &Pod) -> Option<&str> {
    p.metadata
        .labels
        .as_ref()?
        .get(history::CONTROLLER_REVISION_HASH_LABEL)
        .map(String::as_str)
}

fn created(p: &Pod) -> Option<jiff::Timestamp> {
    p.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

// ---- the sync ----

async fn sync(ctx: &Ctx, key: String) -> anyhow::Result<Option<Duration>> {
    let (ns, name) = cu::split_key(&key);
    let ds_api: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), ns);
    let Some(mut ds) = ds_api.get_opt(name).await? else {
        return Ok(None);
    };
    let Some(spec) = ds.spec.clone() else {
        return Ok(None);
    };
    let selector = cu::selector_of(Some(&spec.selector));
    if selector.is_empty() {
        ctx.recorder.event(
            &ds,
            "Warning",
            "SelectingAll",
            "This daemon set is selecting all pods. A non-empty selector is required.",
        );
        return Ok(None);
    }
    let nodes = Api::<Node>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let pods = pods_api.list(&ListParams::default()).await?.items;
    let pods = cu::claim(&pods_api, &ds.metadata, "apps/v1", "DaemonSet", &selector, pods)
        .await?
        .owned;

    // History: the current revision and the old ones.
    let cr_api: Api<ControllerRevision> = Api::namespaced(ctx.client.clone(), ns);
    let revs = cr_api.list(&ListParams::default()).await?.items;
    let revs = cu::claim(&cr_api, &ds.metadata, "apps/v1", "DaemonSet", &selector, revs)
        .await?
        .owned;
    if ds.metadata.deletion_timestamp.is_some() {
        return Ok(None);
    }
    let (cur, old) = construct_history(ctx, &mut ds, &cr_api, revs).await?;
    let hash = cur
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(history::CONTROLLER_REVISION_HASH_LABEL).cloned())
        .unwrap_or_else(|| cur.metadata.name.clone().unwrap_or_default());

    let mut by_node: HashMap<String, Vec<&Pod>> = HashMap::new();
    let mut unscheduled_nowhere: Vec<&Pod> = Vec::new();
    for p in &pods {
        match target_node(p) {
            Some(n) => by_node.entry(n).or_default().push(p),
            None => unscheduled_nowhere.push(p),
        }
    }
    for list in by_node.values_mut() {
        // Running first, then oldest.
        list.sort_by(|a, b| {
            let ra = cu::pod_phase(a) == "Running";
            let rb = cu::pod_phase(b) == "Running";
            rb.cmp(&ra).then_with(|| created(a).cmp(&created(b)))
        });
    }

    let rolling = spec
        .update_strategy
        .as_ref()
        .and_then(|s| s.type_.as_deref())
        .is_none_or(|t| t == "RollingUpdate");
    let desired = nodes.iter().filter(|n| node_should_run(&spec.template, n).0).count() as i32;
    let rolling_params = spec.update_strategy.as_ref().and_then(|s| s.rolling_update.as_ref());
    let max_surge = if rolling {
        cu::scaled_value(rolling_params.and_then(|r| r.max_surge.as_ref()), desired, true)?
    } else {
        0
    };

    // manage: which nodes need a pod, which pods must go.
    let mut create_on: Vec<String> = Vec::new();
    let mut delete: Vec<&Pod> = Vec::new();
    let node_names: std::collections::HashSet<String> = nodes.iter().filter_map(|n| n.metadata.name.clone()).collect();
    for node in &nodes {
        let nname = node.metadata.name.clone().unwrap_or_default();
        let (should_run, should_continue) = node_should_run(&spec.template, node);
        let here: Vec<&Pod> = by_node.get(&nname).cloned().unwrap_or_default();
        if should_run && here.is_empty() {
            create_on.push(nname);
        } else if should_run {
            let mut alive: Vec<&Pod> = Vec::new();
            for p in here {
                if p.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                if cu::pod_phase(p) == "Failed" {
                    let msg = format!(
                        "Found failed daemon pod {}/{} on node {nname}, will try to kill it",
                        ns,
                        p.metadata.name.clone().unwrap_or_default()
                    );
                    ctx.recorder.event(&ds, "Warning", "FailedDaemonPod", &msg);
                    delete.push(p);
                    continue;
                }
                alive.push(p);
            }
            // Keep the first (running, oldest); the rest are surplus. While surging, a node
            // may hold one pod of the current revision besides.
            if max_surge > 0 {
                let (new, old): (Vec<&Pod>, Vec<&Pod>) =
                    alive.into_iter().partition(|p| pod_hash(p) == Some(hash.as_str()));
                delete.extend(new.into_iter().skip(1));
                delete.extend(old.into_iter().skip(1));
            } else if alive.len() > 1 {
                delete.extend(alive.into_iter().skip(1));
            }
        } else if !should_continue {
            delete.extend(here.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()));
        }
    }
    // Unscheduled pods for nodes that are gone.
    for (n, list) in &by_node {
        if !node_names.contains(n) {
            delete.extend(
                list.iter()
                    .filter(|p| {
                        p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none()
                            && p.metadata.deletion_timestamp.is_none()
                    })
                    .copied(),
            );
        }
    }
    let changed = !create_on.is_empty() || !delete.is_empty();
    sync_nodes(ctx, &ds, &pods_api, &create_on, &delete, &hash).await?;

    // Rolling update once the pod set is settled.
    let now = jiff::Timestamp::now();
    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    if !changed && rolling && max_surge > 0 {
        let (to_delete, to_create) = surge_update(&nodes, &spec.template, &by_node, &hash, max_surge, min_ready, now);
        sync_nodes(ctx, &ds, &pods_api, &to_create, &to_delete, &hash).await?;
    } else if !changed && rolling {
        let max_unavailable = cu::scaled_value(
            spec.update_strategy
                .as_ref()
                .and_then(|s| s.rolling_update.as_ref())
                .and_then(|r| r.max_unavailable.as_ref())
                .or(Some(&k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1))),
            desired,
            true,
        )?;
        // Neither surge nor unavailability configured: accept one unavailable, as upstream.
        let max_unavailable = if desired > 0 && max_unavailable == 0 {
            1
        } else {
            max_unavailable
        };
        let to_delete =
            rolling_update_victims(&nodes, &spec.template, &by_node, &hash, max_unavailable, min_ready, now);
        sync_nodes(ctx, &ds, &pods_api, &[], &to_delete, &hash).await?;
    }

    cleanup_history(&cr_api, &ds, &pods, &old).await?;
    update_status(&ds_api, &ds, &nodes, &by_node, &hash, now).await?;
    let again = pods.iter().filter_map(|p| cu::available_after(p, min_ready, now)).min();
    Ok(again)
}

/// Upstream's `rollingUpdate` with maxSurge > 0: a new pod goes next to an old one (at once
/// where the old one is not available, else up to maxSurge nodes at a time), and the old pod
/// goes once the new one is available. Returns (pods to delete, nodes to create a pod on).
fn surge_update<'a>(
    nodes: &[Node],
    template: &PodTemplateSpec,
    by_node: &HashMap<String, Vec<&'a Pod>>,
    hash: &str,
    max_surge: i32,
    min_ready: i32,
    now: jiff::Timestamp,
) -> (Vec<&'a Pod>, Vec<String>) {
    let mut delete: Vec<&Pod> = Vec::new();
    let mut allowed: Vec<String> = Vec::new();
    let mut candidates: Vec<String> = Vec::new();
    let mut surging = 0;
    let mut names: Vec<&String> = by_node.keys().collect();
    names.sort();
    for n in names {
        let pods: Vec<&Pod> = by_node[n]
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .copied()
            .collect();
        let new: Vec<&Pod> = pods.iter().filter(|p| pod_hash(p) == Some(hash)).copied().collect();
        let old: Vec<&Pod> = pods.iter().filter(|p| pod_hash(p) != Some(hash)).copied().collect();
        if new.len() > 1 || old.len() > 1 {
            surging += 1;
            continue;
        }
        match (new.first(), old.first()) {
            (_, None) => {}
            (None, Some(o)) => {
                if cu::is_pod_available(o, min_ready, now) {
                    candidates.push(n.clone());
                } else {
                    let runs = nodes
                        .iter()
                        .find(|x| x.metadata.name.as_ref() == Some(n))
                        .is_some_and(|x| node_should_run(template, x).0);
                    if runs {
                        allowed.push(n.clone());
                    } else {
                        delete.push(o);
                    }
                }
            }
            (Some(nw), Some(o)) => {
                if cu::is_pod_available(nw, min_ready, now) {
                    delete.push(o);
                } else {
                    surging += 1;
                }
            }
        }
    }
    let remaining = (max_surge - surging).max(0) as usize;
    allowed.extend(candidates.into_iter().take(remaining));
    (delete, allowed)
}

/// Upstream's `rollingUpdate` with maxSurge 0: old pods that are not available go at once,
/// available ones only while fewer than maxUnavailable pods are unavailable.
fn rolling_update_victims<'a>(
    nodes: &[Node],
    template: &PodTemplateSpec,
    by_node: &HashMap<String, Vec<&'a Pod>>,
    hash: &str,
    max_unavailable: i32,
    min_ready: i32,
    now: jiff::Timestamp,
) -> Vec<&'a Pod> {
    let mut unavailable = 0;
    let mut allowed: Vec<&Pod> = Vec::new();
    let mut candidates: Vec<&Pod> = Vec::new();
    let mut names: Vec<&String> = by_node.keys().collect();
    names.sort();
    for n in names {
        let Some(node) = nodes.iter().find(|x| x.metadata.name.as_ref() == Some(n)) else {
            continue;
        };
        if !node_should_run(template, node).0 {
            continue;
        }
        let pods: Vec<&Pod> = by_node[n]
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .copied()
            .collect();
        let new: Vec<&Pod> = pods.iter().filter(|p| pod_hash(p) == Some(hash)).copied().collect();
        let old: Vec<&Pod> = pods.iter().filter(|p| pod_hash(p) != Some(hash)).copied().collect();
        if new.len() > 1 || old.len() > 1 {
            unavailable += 1;
            continue;
        }
        match (new.first(), old.first()) {
            (None, None) | (Some(_), Some(_)) => unavailable += 1,
            (Some(p), None) => {
                if !cu::is_pod_available(p, min_ready, now) {
                    unavailable += 1;
                }
            }
            (None, Some(p)) => {
                if !cu::is_pod_available(p, min_ready, now) {
                    allowed.push(p);
                    unavailable += 1;
                } else if unavailable < max_unavailable {
                    candidates.push(p);
                }
            }
        }
    }
    let remaining = (max_unavailable - unavailable).max(0) as usize;
    allowed.extend(candidates.into_iter().take(remaining));
    allowed
}

async fn sync_nodes(
    ctx: &Ctx,
    ds: &DaemonSet,
    pods_api: &Api<Pod>,
    create_on: &[String],
    delete: &[&Pod],
    hash: &str,
) -> anyhow::Result<()> {
    let Some(spec) = ds.spec.as_ref() else {
        return Ok(());
    };
    let name = ds.metadata.name.clone().unwrap_or_default();
    let ns = ds.metadata.namespace.clone().unwrap_or_default();
    let mut template = spec.template.clone();
    let labels = template
        .metadata
        .get_or_insert_with(Default::default)
        .labels
        .get_or_insert_with(BTreeMap::new);
    labels.insert(
        TEMPLATE_GENERATION_LABEL.into(),
        ds.metadata.generation.unwrap_or(0).to_string(),
    );
    labels.insert(history::CONTROLLER_REVISION_HASH_LABEL.into(), hash.to_string());
    if let Some(s) = template.spec.as_mut() {
        add_daemon_tolerations(s);
    }
    let owner = cu::new_controller_ref(&ds.metadata, "apps/v1", "DaemonSet");
    let mut first_err = None;
    for node in create_on {
        let mut t = template.clone();
        if let Some(s) = t.spec.as_mut() {
            s.affinity = Some(replace_node_name_affinity(s.affinity.take(), node));
        }
        let pod = cu::pod_from_template(&t, &cu::pod_name_prefix(&name), Some(owner.clone()), &ns);
        match pods_api.create(&PostParams::default(), &pod).await {
            Ok(p) => {
                let msg = format!("Created pod: {}", p.metadata.name.unwrap_or_default());
                ctx.recorder.event(ds, "Normal", "SuccessfulCreate", &msg);
            }
            Err(e) => {
                let msg = format!("Error creating: {}", crate::replicaset::api_message(&e));
                ctx.recorder.event(ds, "Warning", "FailedCreate", &msg);
                first_err.get_or_insert(e);
            }
        }
    }
    for p in delete {
        let pname = p.metadata.name.clone().unwrap_or_default();
        match pods_api.delete(&pname, &DeleteParams::default()).await {
            Ok(_) => {
                ctx.recorder
                    .event(ds, "Normal", "SuccessfulDelete", format!("Deleted pod: {pname}"));
            }
            Err(e) if cu::is_not_found(&e) => {}
            Err(e) => {
                let msg = format!("Error deleting: {}", crate::replicaset::api_message(&e));
                ctx.recorder.event(ds, "Warning", "FailedDelete", &msg);
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

/// Upstream's `constructHistory`: find or snapshot the revision of the current template and
/// give it the highest revision number.
async fn construct_history(
    ctx: &Ctx,
    ds: &mut DaemonSet,
    cr_api: &Api<ControllerRevision>,
    revs: Vec<ControllerRevision>,
) -> anyhow::Result<(ControllerRevision, Vec<ControllerRevision>)> {
    let template = ds.spec.as_ref().map(|s| s.template.clone()).unwrap_or_default();
    let (mut current, old): (Vec<ControllerRevision>, Vec<ControllerRevision>) =
        revs.into_iter().partition(|r| history::matches(r, &template));
    let next = history::max_revision(&old) + 1;
    current.sort_by_key(|r| std::cmp::Reverse(r.revision));
    let cur = match current.into_iter().next() {
        Some(mut cur) => {
            if cur.revision < next {
                cur.revision = next;
                let name = cur.metadata.name.clone().unwrap_or_default();
                cur = cr_api.replace(&name, &PostParams::default(), &cur).await?;
            }
            cur
        }
        None => {
            let collision = ds.status.as_ref().and_then(|s| s.collision_count);
            let hash = cu::compute_hash(&template, collision);
            let name = format!("{}-{}", ds.metadata.name.clone().unwrap_or_default(), hash);
            let mut rev = history::new_revision(&ds.metadata, "DaemonSet", name.clone(), &hash, &template, next);
            if let Some(l) = rev.metadata.labels.as_mut() {
                l.remove(history::REVISION_HASH_LABEL);
                l.insert(history::CONTROLLER_REVISION_HASH_LABEL.into(), hash.clone());
            }
            rev.metadata.annotations = ds.metadata.annotations.clone();
            match cr_api.create(&PostParams::default(), &rev).await {
                Ok(r) => r,
                Err(e) if cu::is_already_exists(&e) => {
                    let existing = cr_api.get(&name).await?;
                    if history::matches(&existing, &template) {
                        existing
                    } else {
                        let st = ds.status.get_or_insert_with(Default::default);
                        st.collision_count = Some(st.collision_count.unwrap_or(0) + 1);
                        let ds_api: Api<DaemonSet> =
                            Api::namespaced(ctx.client.clone(), ds.metadata.namespace.as_deref().unwrap_or_default());
                        ds_api
                            .replace_status(
                                ds.metadata.name.as_deref().unwrap_or_default(),
                                &PostParams::default(),
                                ds,
                            )
                            .await?;
                        anyhow::bail!("hash collision for controller revision {name}");
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    };
    Ok((cur, old))
}

/// Upstream's `cleanupHistory`: old revisions no live pod uses, beyond revisionHistoryLimit.
async fn cleanup_history(
    cr_api: &Api<ControllerRevision>,
    ds: &DaemonSet,
    pods: &[Pod],
    old: &[ControllerRevision],
) -> anyhow::Result<()> {
    let limit = ds
        .spec
        .as_ref()
        .and_then(|s| s.revision_history_limit)
        .unwrap_or(10)
        .max(0) as usize;
    if old.len() <= limit {
        return Ok(());
    }
    let live: std::collections::HashSet<&str> = pods.iter().filter_map(pod_hash).collect();
    let mut unused: Vec<&ControllerRevision> = old
        .iter()
        .filter(|r| {
            let h = r
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(history::CONTROLLER_REVISION_HASH_LABEL))
                .map(String::as_str)
                .or(r.metadata.name.as_deref());
            !h.is_some_and(|h| live.contains(h))
        })
        .collect();
    unused.sort_by_key(|r| r.revision);
    let excess = old.len() - limit;
    for r in unused.into_iter().take(excess) {
        let name = r.metadata.name.clone().unwrap_or_default();
        cu::delete_ignoring_missing(cr_api, &name, &DeleteParams::default()).await?;
    }
    Ok(())
}

async fn update_status(
    ds_api: &Api<DaemonSet>,
    ds: &DaemonSet,
    nodes: &[Node],
    by_node: &HashMap<String, Vec<&Pod>>,
    hash: &str,
    now: jiff::Timestamp,
) -> anyhow::Result<()> {
    let spec = ds.spec.clone().unwrap_or_default();
    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    let (mut desired, mut current, mut misscheduled, mut ready, mut available, mut updated) = (0, 0, 0, 0, 0, 0);
    for node in nodes {
        let nname = node.metadata.name.clone().unwrap_or_default();
        let (should_run, _) = node_should_run(&spec.template, node);
        let pods = by_node.get(&nname).map(Vec::as_slice).unwrap_or_default();
        let scheduled = !pods.is_empty();
        if should_run {
            desired += 1;
            if !scheduled {
                continue;
            }
            current += 1;
            let p = pods[0];
            if cu::is_pod_ready(p) {
                ready += 1;
                if cu::is_pod_available(p, min_ready, now) {
                    available += 1;
                }
            }
            if pod_hash(p) == Some(hash) {
                updated += 1;
            }
        } else if scheduled {
            misscheduled += 1;
        }
    }
    let old = ds.status.clone().unwrap_or_default();
    let nz = |v: i32| (v != 0).then_some(v);
    let status = DaemonSetStatus {
        desired_number_scheduled: desired,
        current_number_scheduled: current,
        number_misscheduled: misscheduled,
        number_ready: ready,
        number_available: nz(available),
        number_unavailable: nz(desired - available),
        updated_number_scheduled: nz(updated),
        observed_generation: ds.metadata.generation,
        collision_count: old.collision_count,
        conditions: old.conditions.clone(),
    };
    if ds.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let mut updated_ds = ds.clone();
    updated_ds.status = Some(status);
    ds_api
        .replace_status(
            ds.metadata.name.as_deref().unwrap_or_default(),
            &PostParams::default(),
            &updated_ds,
        )
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn node(name: &str, labels: &[(&str, &str)], taints: Vec<Taint>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(taints),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn template(spec: PodSpec) -> PodTemplateSpec {
        PodTemplateSpec {
            metadata: None,
            spec: Some(spec),
        }
    }

    fn taint(key: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: effect.into(),
            value: None,
            time_added: None,
        }
    }

    #[test]
    fn node_selector_and_taints_decide() {
        let t = template(PodSpec {
            node_selector: Some([("disk".to_string(), "ssd".to_string())].into()),
            ..Default::default()
        });
        assert_eq!(
            node_should_run(&t, &node("a", &[("disk", "ssd")], vec![])),
            (true, true)
        );
        assert_eq!(node_should_run(&t, &node("b", &[], vec![])), (false, false));
        let plain = template(PodSpec::default());
        let master = node("m", &[], vec![taint("node-role.kubernetes.io/master", "NoSchedule")]);
        assert_eq!(node_should_run(&plain, &master), (false, true));
        let evicting = node("e", &[], vec![taint("dedicated", "NoExecute")]);
        assert_eq!(node_should_run(&plain, &evicting), (false, false));
        // The daemon tolerations cover unschedulable and not-ready nodes.
        let cordoned = node("c", &[], vec![taint("node.kubernetes.io/unschedulable", "NoSchedule")]);
        assert_eq!(node_should_run(&plain, &cordoned), (true, true));
        let tolerating = template(PodSpec {
            tolerations: Some(vec![Toleration {
                key: Some("node-role.kubernetes.io/master".into()),
                effect: Some("NoSchedule".into()),
                ..Default::default()
            }]),
            ..Default::default()
        });
        // Operator defaults to Equal with an empty value.
        assert_eq!(node_should_run(&tolerating, &master), (true, true));
    }

    #[test]
    fn affinity_names_the_node() {
        let a = replace_node_name_affinity(None, "n1");
        let pod = Pod {
            spec: Some(PodSpec {
                affinity: Some(a),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(target_node(&pod).as_deref(), Some("n1"));
        let spec = pod.spec.clone().unwrap_or_default();
        assert!(fits_node_affinity(&spec, &node("n1", &[], vec![])));
        assert!(!fits_node_affinity(&spec, &node("n2", &[], vec![])));
    }

    fn daemon_pod(name: &str, node: &str, hash: &str, ready: bool) -> Pod {
        use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some([(history::CONTROLLER_REVISION_HASH_LABEL.to_string(), hash.to_string())].into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn rolling_update_respects_max_unavailable_and_surge() {
        let nodes: Vec<Node> = ["n1", "n2", "n3"].iter().map(|n| node(n, &[], vec![])).collect();
        let t = template(PodSpec::default());
        let now = jiff::Timestamp::now();
        let p1 = daemon_pod("a", "n1", "old", true);
        let p2 = daemon_pod("b", "n2", "old", true);
        let p3 = daemon_pod("c", "n3", "old", false);
        let by_node: HashMap<String, Vec<&Pod>> = [
            ("n1".to_string(), vec![&p1]),
            ("n2".to_string(), vec![&p2]),
            ("n3".to_string(), vec![&p3]),
        ]
        .into();
        // The unavailable old pod goes at once and uses up the one allowed unavailability.
        let victims = rolling_update_victims(&nodes, &t, &by_node, "new", 1, 0, now);
        let names: Vec<&str> = victims.iter().filter_map(|p| p.metadata.name.as_deref()).collect();
        assert_eq!(names, ["c"]);
        let victims = rolling_update_victims(&nodes, &t, &by_node, "new", 2, 0, now);
        assert_eq!(victims.len(), 2);
        // Surge: a new pod next to the unavailable old one, and one more within maxSurge.
        let (delete, create) = surge_update(&nodes, &t, &by_node, "new", 1, 0, now);
        assert!(delete.is_empty());
        assert_eq!(create, ["n3", "n1"]);
        // Once the new pod is available the old one goes.
        let n1 = daemon_pod("d", "n1", "new", true);
        let by_node: HashMap<String, Vec<&Pod>> = [("n1".to_string(), vec![&p1, &n1])].into();
        let (delete, create) = surge_update(&nodes, &t, &by_node, "new", 1, 0, now);
        assert_eq!(delete.len(), 1);
        assert_eq!(delete[0].metadata.name.as_deref(), Some("a"));
        assert!(create.is_empty());
    }

    #[test]
    fn tolerations_added_once() {
        let mut s = PodSpec::default();
        add_daemon_tolerations(&mut s);
        add_daemon_tolerations(&mut s);
        assert_eq!(s.tolerations.map(|t| t.len()), Some(6));
    }
}
