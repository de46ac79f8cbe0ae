//! The resource quota controller (upstream's `pkg/controller/resourcequota`): every
//! ResourceQuota's `status.hard` follows its `spec.hard`, and `status.used` is recalculated from
//! the live objects of its namespace (`skiff_api::quota::calculate_usage`, the evaluators the
//! API server's admission charges with) when the quota is created or its hard limits change,
//! when a counted object goes away (a pod deleted or terminated, a service deleted or changing
//! type, a claim deleted or resized: upstream's replenishment), and at every full resync
//! (upstream's `--resource-quota-sync-period`, 5 minutes; shorter here by default).
//!
//! Pods, services, claims and quotas are read from the shared informers; other counted
//! resources (`configmaps`, `secrets`, `count/<resource>.<group>`) are listed (metadata only)
//! when a quota that names them is synced.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, ResourceQuota, Service};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, ListParams, PostParams};
use serde::Serialize;
use serde_json::{Value, json};
use skiff_api::quota::{self, Evaluator, ResourceList};

use crate::controller_utils::{self as cu, WorkQueue};
use crate::informers::{Change, Informer, SharedInformerFactory};

/// The controller's name (its service account and role, `system:controller:NAME`).
pub const CONTROLLER_NAME: &str = "resourcequota-controller";

#[derive(Clone, Debug)]
pub struct ResourceQuotaConfig {
    /// How often every quota is recalculated (upstream's `--resource-quota-sync-period`).
    pub resync: Duration,
}

impl Default for ResourceQuotaConfig {
    fn default() -> Self {
        ResourceQuotaConfig {
            resync: Duration::from_secs(30),
        }
    }
}

struct Ctx {
    client: kube::Client,
    quotas: Informer<ResourceQuota>,
    pods: Informer<Pod>,
    services: Informer<Service>,
    claims: Informer<PersistentVolumeClaim>,
}

fn to_value<T: Serialize>(o: &T) -> Value {
    serde_json::to_value(o).unwrap_or(Value::Null)
}

fn hard_of(q: &ResourceQuota) -> ResourceList {
    quota::list_from(to_value(q).pointer("/spec/hard"))
}

/// Queue the namespace's quotas that track a resource of `evaluator` (upstream's
/// `replenishQuota`).
fn replenish(quotas: &Informer<ResourceQuota>, queue: &WorkQueue, namespace: &str, evaluator: &Evaluator) {
    for q in quotas.list_namespace(namespace) {
        let status_hard = quota::list_from(to_value(&*q).pointer("/status/hard"));
        if !evaluator.matching_resources(status_hard.keys()).is_empty() {
            queue.add(crate::informers::object_key(&q.metadata));
        }
    }
}

fn namespace_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> &str {
    meta.namespace.as_deref().unwrap_or("")
}

pub async fn run(
    client: kube::Client,
    informers: SharedInformerFactory,
    cfg: ResourceQuotaConfig,
) -> anyhow::Result<()> {
    let queue = WorkQueue::new();
    let quotas = informers.informer::<ResourceQuota>();
    let pods = informers.informer::<Pod>();
    let services = informers.informer::<Service>();
    let claims = informers.informer::<PersistentVolumeClaim>();
    {
        let queue = queue.clone();
        // Only changes of the hard limits: the status is this controller's and admission's.
        quotas.add_handler(move |c| match c {
            Change::Added(q) => queue.add(crate::informers::object_key(&q.metadata)),
            Change::Updated { old, new } => {
                let status_hard = quota::list_from(to_value(&**new).pointer("/status/hard"));
                if !quota::equals(&hard_of(old), &hard_of(new)) || !quota::equals(&hard_of(new), &status_hard) {
                    queue.add(crate::informers::object_key(&new.metadata));
                }
            }
            Change::Deleted(_) => {}
        });
    }
    {
        let (queue, quotas) = (queue.clone(), quotas.clone());
        let evaluator = Evaluator::new("", "pods");
        pods.add_handler(move |c| {
            let now = jiff::Timestamp::now();
            let counts = |p: &Pod| evaluator.usage(&to_value(p), now).contains_key("pods");
            let ns = match c {
                Change::Deleted(p) => namespace_of(&p.metadata),
                // A pod that stops using compute resources (terminal, or past its grace).
                Change::Updated { old, new } if counts(old) && !counts(new) => namespace_of(&new.metadata),
                _ => return,
            };
            replenish(&quotas, &queue, ns, &evaluator);
        });
    }
    {
        let (queue, quotas) = (queue.clone(), quotas.clone());
        let evaluator = Evaluator::new("", "services");
        services.add_handler(move |c| {
            let ty = |s: &Service| s.spec.as_ref().and_then(|s| s.type_.clone());
            let ns = match c {
                Change::Deleted(s) => namespace_of(&s.metadata),
                Change::Updated { old, new } if ty(old) != ty(new) => namespace_of(&new.metadata),
                _ => return,
            };
            replenish(&quotas, &queue, ns, &evaluator);
        });
    }
    {
        let (queue, quotas) = (queue.clone(), quotas.clone());
        let evaluator = Evaluator::new("", "persistentvolumeclaims");
        claims.add_handler(move |c| {
            let now = jiff::Timestamp::now();
            let usage = |p: &PersistentVolumeClaim| evaluator.usage(&to_value(p), now);
            let ns = match c {
                Change::Deleted(p) => namespace_of(&p.metadata),
                Change::Updated { old, new } if !quota::equals(&usage(old), &usage(new)) => namespace_of(&new.metadata),
                _ => return,
            };
            replenish(&quotas, &queue, ns, &evaluator);
        });
    }
    quotas.wait_synced().await;
    pods.wait_synced().await;
    services.wait_synced().await;
    claims.wait_synced().await;
    // The full resync (upstream's `enqueueAll` every sync period).
    {
        let (queue, quotas) = (queue.clone(), quotas.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(cfg.resync).await;
                for q in quotas.list() {
                    queue.add(crate::informers::object_key(&q.metadata));
                }
            }
        });
    }
    let ctx = Arc::new(Ctx {
        client,
        quotas,
        pods,
        services,
        claims,
    });
    queue
        .run("resourcequota", |key| {
            let ctx = ctx.clone();
            async move { sync(&ctx, &key).await.map(|()| None) }
        })
        .await
}

/// The evaluators a quota's hard resources call for: pods, services and claims, the legacy
/// counted resources, and every `count/<resource>.<group>`.
fn evaluators_for(hard: &ResourceList) -> Vec<Evaluator> {
    let mut wanted: BTreeSet<(String, String)> = BTreeSet::new();
    for plural in [
        "pods",
        "services",
        "persistentvolumeclaims",
        "configmaps",
        "secrets",
        "replicationcontrollers",
        "resourcequotas",
    ] {
        if !Evaluator::new("", plural).matching_resources(hard.keys()).is_empty() {
            wanted.insert((String::new(), plural.to_string()));
        }
    }
    for name in hard.keys() {
        if let Some(gr) = name.strip_prefix("count/") {
            let (resource, group) = gr.split_once('.').unwrap_or((gr, ""));
            wanted.insert((group.to_string(), resource.to_string()));
        }
    }
    wanted.iter().map(|(g, r)| Evaluator::new(g, r)).collect()
}

fn values<K: Serialize>(items: Vec<Arc<K>>) -> Vec<Value> {
    items.iter().map(|o| to_value(&**o)).collect()
}

/// The objects of the namespace an evaluator counts, as JSON.
async fn objects_of(ctx: &Ctx, namespace: &str, e: &Evaluator) -> anyhow::Result<Vec<Value>> {
    Ok(match (e.group(), e.resource()) {
        ("", "pods") => values(ctx.pods.list_namespace(namespace)),
        ("", "services") => values(ctx.services.list_namespace(namespace)),
        ("", "persistentvolumeclaims") => values(ctx.claims.list_namespace(namespace)),
        ("", "resourcequotas") => values(ctx.quotas.list_namespace(namespace)),
        (group, plural) => {
            // Only the number of objects matters: their metadata is enough.
            let Some(res) = skiff_api::registry::all()
                .into_iter()
                .find(|r| r.group == group && r.plural == plural && r.namespaced)
            else {
                return Ok(Vec::new());
            };
            let api_version = if group.is_empty() {
                res.version.to_string()
            } else {
                format!("{group}/{}", res.version)
            };
            let ar = ApiResource {
                group: group.to_string(),
                version: res.version.to_string(),
                api_version,
                kind: res.kind.to_string(),
                plural: plural.to_string(),
            };
            let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), namespace, &ar);
            let list = api.list_metadata(&ListParams::default()).await?;
            list.items
                .iter()
                .map(|o| json!({"metadata": to_value(&o.metadata)}))
                .collect()
        }
    })
}

/// Upstream's `syncResourceQuota`.
async fn sync(ctx: &Ctx, key: &str) -> anyhow::Result<()> {
    let (namespace, name) = cu::split_key(key);
    let Some(current) = ctx.quotas.get(namespace, name) else {
        return Ok(());
    };
    let current_json = to_value(&*current);
    let hard = hard_of(&current);
    let status_hard = quota::list_from(current_json.pointer("/status/hard"));
    let old_used = current_json.pointer("/status/used").map(|u| quota::list_from(Some(u)));
    let mut dirty =
        !quota::equals(&hard, &status_hard) || current_json.pointer("/status/hard").is_none() || old_used.is_none();
    let old_used = old_used.unwrap_or_default();
    let mut used = old_used.clone();
    let now = jiff::Timestamp::now();
    for e in evaluators_for(&hard) {
        let objects = objects_of(ctx, namespace, &e).await?;
        if let Some(u) = quota::calculate_usage(&current_json, &hard, &e, objects.iter(), now) {
            used.extend(u);
        }
    }
    let used = quota::mask(&used, hard.keys());
    dirty = dirty || !quota::equals(&used, &old_used);
    if !dirty {
        return Ok(());
    }
    let mut updated: Value = current_json;
    if let Some(m) = updated.as_object_mut() {
        m.insert(
            "status".into(),
            json!({"hard": quota::list_to_json(&hard), "used": quota::list_to_json(&used)}),
        );
    }
    let updated: ResourceQuota = serde_json::from_value(updated)?;
    // On the cached resourceVersion: a quota admission charged meanwhile makes this a conflict,
    // and the retry reads it again.
    Api::<ResourceQuota>::namespaced(ctx.client.clone(), namespace)
        .replace_status(name, &PostParams::default(), &updated)
        .await?;
    tracing::debug!(quota = key, "resource quota status updated");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::quantity::Quantity;

    #[test]
    fn a_quota_calls_for_the_evaluators_of_what_it_limits() {
        let hard: ResourceList = [
            "pods",
            "requests.cpu",
            "count/deployments.apps",
            "secrets",
            "count/widgets.example.com",
        ]
        .iter()
        .map(|k| (k.to_string(), Quantity::parse("1").unwrap()))
        .collect();
        let names: Vec<(String, String)> = evaluators_for(&hard)
            .iter()
            .map(|e| (e.group().to_string(), e.resource().to_string()))
            .collect();
        assert_eq!(
            names,
            [
                ("".to_string(), "pods".to_string()),
                ("".into(), "secrets".into()),
                ("apps".into(), "deployments".into()),
                ("example.com".into(), "widgets".into()),
            ]
        );
    }
}
