//! The garbage collector (upstream's `pkg/controller/garbagecollector`): keeps a graph of
//! ownerReferences from metadata watches of every resource and
//! - deletes dependents whose owners are all gone (background cascading deletion),
//! - removes dangling ownerReferences when some owner remains,
//! - for an owner being deleted with the `orphan` finalizer, removes its ownerReference from
//!   every dependent, then the finalizer,
//! - for an owner being deleted with `foregroundDeletion`, deletes its dependents and removes
//!   the finalizer once none is left.
//!
//! Before deleting anything it confirms the owner's absence with a live read (by name, then uid),
//! so a lagging watch never causes a wrong deletion.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{DeleteParams, DynamicObject, PartialObjectMeta, Patch, PatchParams, PropagationPolicy};
use kube::runtime::watcher;
use serde_json::{Value, json};
use skiff_api::Resource;
use tokio::sync::mpsc;

use crate::resources;

const ORPHAN: &str = "orphan";
const FOREGROUND: &str = "foregroundDeletion";

#[derive(Clone, Debug)]
struct OwnerRef {
    api_version: String,
    kind: String,
    name: String,
    uid: String,
}

#[derive(Clone, Debug)]
struct GraphNode {
    res: &'static Resource,
    namespace: String,
    name: String,
    owners: Vec<OwnerRef>,
    deleting: bool,
    finalizers: Vec<String>,
}

enum Change {
    Upsert(String, GraphNode),
    Remove(String),
}

fn to_node(res: &'static Resource, meta: &kube::api::ObjectMeta) -> Option<(String, GraphNode)> {
    let uid = meta.uid.clone()?;
    let owners = meta
        .owner_references
        .as_ref()
        .map(|refs| {
            refs.iter()
                .map(|o| OwnerRef {
                    api_version: o.api_version.clone(),
                    kind: o.kind.clone(),
                    name: o.name.clone(),
                    uid: o.uid.clone(),
                })
                .collect()
        })
        .unwrap_or_default();
    Some((
        uid,
        GraphNode {
            res,
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            owners,
            deleting: meta.deletion_timestamp.is_some(),
            finalizers: meta.finalizers.clone().unwrap_or_default(),
        },
    ))
}

/// Watch the metadata of one resource into the change channel.
async fn watch_resource(client: kube::Client, res: &'static Resource, tx: mpsc::UnboundedSender<Change>) {
    let ar = resources::api_resource(res);
    let api: kube::Api<PartialObjectMeta<DynamicObject>> = kube::Api::all_with(client, &ar);
    let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
    while let Some(ev) = stream.next().await {
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => {
                tracing::debug!(resource = res.plural, error = %e, "garbage collector watch error");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let change = match ev {
            watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
                to_node(res, &o.metadata).map(|(uid, n)| Change::Upsert(uid, n))
            }
            watcher::Event::Delete(o) => o.metadata.uid.clone().map(Change::Remove),
            watcher::Event::Init | watcher::Event::InitDone => None,
        };
        if let Some(c) = change
            && tx.send(c).is_err()
        {
            return;
        }
    }
}

pub async fn run(client: kube::Client) -> anyhow::Result<()> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    for res in resources::stored_resources() {
        tokio::spawn(watch_resource(client.clone(), res, tx.clone()));
    }
    drop(tx);
    let mut graph: HashMap<String, GraphNode> = HashMap::new();
    // uid -> uids of its dependents
    let mut dependents: HashMap<String, HashSet<String>> = HashMap::new();
    let mut dirty: HashSet<String> = HashSet::new();
    let mut retry = tokio::time::interval(Duration::from_secs(2));
    loop {
        tokio::select! {
            change = rx.recv() => {
                let Some(change) = change else { return Ok(()) };
                apply_change(change, &mut graph, &mut dependents, &mut dirty);
                // Take everything already queued before acting.
                while let Ok(c) = rx.try_recv() {
                    apply_change(c, &mut graph, &mut dependents, &mut dirty);
                }
            }
            _ = retry.tick() => {}
        }
        let work: Vec<String> = dirty.drain().collect();
        for uid in work {
            if let Err(e) = process(&client, &uid, &graph, &dependents).await {
                tracing::debug!(uid, error = %e, "garbage collection will be retried");
                dirty.insert(uid);
            }
        }
    }
}

fn apply_change(
    change: Change,
    graph: &mut HashMap<String, GraphNode>,
    dependents: &mut HashMap<String, HashSet<String>>,
    dirty: &mut HashSet<String>,
) {
    match change {
        Change::Upsert(uid, node) => {
            if let Some(old) = graph.get(&uid) {
                for o in &old.owners {
                    if let Some(set) = dependents.get_mut(&o.uid) {
                        set.remove(&uid);
                    }
                }
            }
            for o in &node.owners {
                dependents.entry(o.uid.clone()).or_default().insert(uid.clone());
                // An owner we have never seen may be gone: check this dependent.
                if !graph.contains_key(&o.uid) {
                    dirty.insert(uid.clone());
                }
            }
            if node.deleting && (node.finalizers.iter().any(|f| f == ORPHAN || f == FOREGROUND)) {
                dirty.insert(uid.clone());
            }
            graph.insert(uid, node);
        }
        Change::Remove(uid) => {
            if let Some(old) = graph.remove(&uid) {
                for o in &old.owners {
                    if let Some(set) = dependents.get_mut(&o.uid) {
                        set.remove(&uid);
                    }
                    // An owner waiting in foreground deletion may now be free.
                    dirty.insert(o.uid.clone());
                }
            }
            if let Some(deps) = dependents.get(&uid) {
                dirty.extend(deps.iter().cloned());
            }
        }
    }
}

/// Does the owner still exist (same uid)? Asked live, not from the graph.
async fn owner_exists(client: &kube::Client, namespace: &str, owner: &OwnerRef) -> anyhow::Result<bool> {
    let (group, _version) = match owner.api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", owner.api_version.as_str()),
    };
    let Some(res) = skiff_api::registry::lookup_kind(group, &owner.kind) else {
        // An owner of a kind this server does not serve cannot exist.
        return Ok(false);
    };
    let api = resources::api(client, res, Some(namespace));
    match api.get_metadata_opt(&owner.name).await? {
        Some(m) => Ok(m.metadata.uid.as_deref() == Some(owner.uid.as_str())),
        None => Ok(false),
    }
}

async fn process(
    client: &kube::Client,
    uid: &str,
    graph: &HashMap<String, GraphNode>,
    dependents: &HashMap<String, HashSet<String>>,
) -> anyhow::Result<()> {
    let Some(node) = graph.get(uid) else {
        // Gone: its dependents were queued by the removal.
        return Ok(());
    };
    let deps: Vec<(&String, &GraphNode)> = dependents
        .get(uid)
        .map(|s| s.iter().filter_map(|d| graph.get(d).map(|n| (d, n))).collect())
        .unwrap_or_default();
    if node.deleting && node.finalizers.iter().any(|f| f == ORPHAN) {
        for (_, dep) in &deps {
            let remaining: Vec<&OwnerRef> = dep.owners.iter().filter(|o| o.uid != uid).collect();
            set_owner_refs(client, dep, &remaining, uid).await?;
        }
        remove_finalizer(client, node, ORPHAN).await?;
        return Ok(());
    }
    if node.deleting && node.finalizers.iter().any(|f| f == FOREGROUND) {
        let mut waiting = false;
        for (_, dep) in &deps {
            waiting = true;
            if !dep.deleting {
                let api = resources::api(client, dep.res, Some(&dep.namespace));
                let dp = DeleteParams {
                    propagation_policy: Some(PropagationPolicy::Foreground),
                    ..Default::default()
                };
                match api.delete(&dep.name, &dp).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        if !waiting {
            remove_finalizer(client, node, FOREGROUND).await?;
        }
        return Ok(());
    }
    // A dependent: are its owners gone?
    if node.owners.is_empty() {
        return Ok(());
    }
    let mut alive = Vec::new();
    let mut dangling = false;
    for o in &node.owners {
        if owner_exists(client, &node.namespace, o).await? {
            alive.push(o);
        } else {
            dangling = true;
        }
    }
    if !dangling {
        return Ok(());
    }
    if alive.is_empty() {
        if node.deleting {
            return Ok(());
        }
        tracing::info!(
            resource = node.res.plural,
            namespace = node.namespace,
            name = node.name,
            "deleting object whose owners are gone"
        );
        let api = resources::api(client, node.res, Some(&node.namespace));
        let dp = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            preconditions: Some(kube::api::Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&node.name, &dp).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    } else {
        set_owner_refs(client, node, &alive, uid).await?;
    }
    Ok(())
}

/// Replace a dependent's ownerReferences with `keep` (a strategic merge on the list would
/// need the uid key; a JSON merge patch replaces the whole list).
async fn set_owner_refs(
    client: &kube::Client,
    dep: &GraphNode,
    keep: &[&OwnerRef],
    _removed: &str,
) -> anyhow::Result<()> {
    let api = resources::api(client, dep.res, Some(&dep.namespace));
    let current = match api.get_opt(&dep.name).await? {
        Some(o) => o,
        None => return Ok(()),
    };
    let keep_uids: HashSet<&str> = keep.iter().map(|o| o.uid.as_str()).collect();
    let refs: Vec<Value> = current
        .metadata
        .owner_references
        .unwrap_or_default()
        .into_iter()
        .filter(|o| keep_uids.contains(o.uid.as_str()))
        .map(|o| serde_json::to_value(o).unwrap_or(Value::Null))
        .collect();
    let patch = json!({"metadata": {"ownerReferences": if refs.is_empty() { Value::Null } else { Value::Array(refs) },
        "resourceVersion": current.metadata.resource_version}});
    api.patch(&dep.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

async fn remove_finalizer(client: &kube::Client, node: &GraphNode, finalizer: &str) -> anyhow::Result<()> {
    let api = resources::api(client, node.res, Some(&node.namespace));
    let Some(current) = api.get_opt(&node.name).await? else {
        return Ok(());
    };
    let fins: Vec<String> = current
        .metadata
        .finalizers
        .unwrap_or_default()
        .into_iter()
        .filter(|f| f != finalizer)
        .collect();
    let patch = json!({"metadata": {"finalizers": fins, "resourceVersion": current.metadata.resource_version}});
    api.patch(&node.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}
