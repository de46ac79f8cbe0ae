//! Upstream's ResourceQuota admission plugin (`k8s.io/apiserver/pkg/admission/plugin/resourcequota`):
//! a create (or an update that charges: a service's type, a claim's size) in a namespace with
//! quotas is measured by the resource's evaluator (`skiff_api::quota`), refused with upstream's
//! 403 when it does not fit, and otherwise charged to every quota that tracks it: their
//! `status.used` is written with compare-on-revision BEFORE the object is, so two writes racing
//! for the last unit cannot both pass. Writes of one namespace are checked one at a time in this
//! process (upstream's evaluator works a namespace on one worker); across replicas the
//! compare-on-revision decides, and a quota written meanwhile is read again and the check redone.
//! What a refused or failed write was charged is given back by the resource quota controller's
//! next recalculation, as upstream's.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use parking_lot::Mutex;
use serde_json::Value;
use skiff_api::StatusError;
use skiff_api::quota::{Evaluator, Operation, check_request, list_to_json};
use skiff_store::{Op, StoreError};

use crate::handlers::Ctx;
use crate::objects;

/// How many times a check is redone when a quota changed under it.
const RETRIES: usize = 10;

/// The resources never charged (upstream's `DefaultIgnoredResources`).
fn ignored(group: &str, plural: &str) -> bool {
    (group.is_empty() || group == "events.k8s.io") && plural == "events"
}

type NamespaceLocks = Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>;

static LOCKS: LazyLock<NamespaceLocks> = LazyLock::new(Default::default);

fn namespace_lock(ns: &str) -> Arc<tokio::sync::Mutex<()>> {
    LOCKS.lock().entry(ns.to_string()).or_default().clone()
}

/// Forget a namespace's lock nobody holds or waits for.
fn release_lock(ns: &str, lock: Arc<tokio::sync::Mutex<()>>) {
    let mut locks = LOCKS.lock();
    drop(lock);
    if locks.get(ns).is_some_and(|l| Arc::strong_count(l) == 1) {
        locks.remove(ns);
    }
}

/// Whether writes skip the namespace's lock (a test's way to race as replicas do).
#[cfg(test)]
fn unlocked() -> bool {
    tests::unlocked()
}

#[cfg(not(test))]
fn unlocked() -> bool {
    false
}

/// Checks and charges a write of `obj` (`old` on an update) to the request's namespace's quotas.
pub async fn admit(ctx: &Ctx, obj: &Value, old: Option<&Value>) -> Result<(), StatusError> {
    let res = ctx.rr.resource;
    let ns = ctx.rr.namespace.as_str();
    if !res.namespaced || ns.is_empty() || !ctx.rr.subresource.is_empty() || ignored(res.group, res.plural) {
        return Ok(());
    }
    let op = if old.is_some() {
        Operation::Update
    } else {
        Operation::Create
    };
    let evaluator = Evaluator::new(res.group, res.plural);
    if !evaluator.handles(op) {
        return Ok(());
    }
    let Some(quotas_res) = skiff_api::registry::lookup("", "v1", "resourcequotas") else {
        return Ok(());
    };
    let prefix = objects::prefix(quotas_res, ns);
    // Most namespaces have no quota: that costs one look into the replica's memory (upstream's
    // plugin reads its informer's cache); charging reads the quotas from the store itself.
    let cached = ctx
        .state
        .store
        .list_cached(&prefix)
        .await
        .map_err(|e| ctx.store_err(e))?;
    if cached.is_empty() {
        return Ok(());
    }
    let lock = namespace_lock(ns);
    let outcome = {
        let _held = if unlocked() { None } else { Some(lock.lock().await) };
        charge(ctx, &prefix, &evaluator, op, obj, old).await
    };
    release_lock(ns, lock);
    outcome
}

async fn list_quotas(ctx: &Ctx, prefix: &str) -> Result<Vec<(String, Value, skiff_store::Revision)>, StatusError> {
    let page = ctx
        .state
        .store
        .list(prefix, Default::default())
        .await
        .map_err(|e| ctx.store_err(e))?;
    Ok(page
        .items
        .iter()
        .filter_map(|kv| objects::decode_kv(kv).map(|v| (kv.key.clone(), v, kv.mod_revision)))
        .collect())
}

async fn charge(
    ctx: &Ctx,
    prefix: &str,
    evaluator: &Evaluator,
    op: Operation,
    obj: &Value,
    old: Option<&Value>,
) -> Result<(), StatusError> {
    let res = ctx.rr.resource;
    let name = objects::name(obj);
    let mut last = None;
    for _ in 0..RETRIES {
        let quotas = list_quotas(ctx, prefix).await?;
        let values: Vec<Value> = quotas.iter().map(|(_, v, _)| v.clone()).collect();
        let charged = check_request(&values, evaluator, op, obj, old, jiff::Timestamp::now())
            .map_err(|refused| StatusError::forbidden_resource(res.group, res.plural, name, &refused.0))?;
        if charged.is_empty() || ctx.dry_run() {
            return Ok(());
        }
        // Every quota charged moves together, or none does.
        let mut ops = Vec::with_capacity(charged.len());
        for (i, used) in charged {
            let Some((key, quota, rev)) = quotas.get(i) else {
                continue;
            };
            let mut quota = quota.clone();
            if let Some(status) = quota.get_mut("status").and_then(Value::as_object_mut) {
                status.insert("used".into(), list_to_json(&used));
            }
            ops.push(Op::Update {
                key: key.clone(),
                value: objects::encode_for_store(&quota),
                expected: *rev,
            });
        }
        match ctx.state.store.txn(ops).await {
            Ok(_) => return Ok(()),
            Err(e @ (StoreError::Conflict { .. } | StoreError::NotFound(_))) => {
                tracing::debug!(error = %e, "a quota changed while charging it; checking again");
                last = Some(e);
            }
            Err(e) => return Err(ctx.store_err(e)),
        }
    }
    let detail = last.map_or_else(String::new, |e| e.to_string());
    Err(StatusError::forbidden_resource(
        res.group,
        res.plural,
        name,
        &format!("unable to update status of quotas: {detail}"),
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use serde_json::json;

    /// Set by a test that checks what compare-on-revision alone guarantees (as between
    /// replicas, which share no lock).
    static UNLOCKED: AtomicBool = AtomicBool::new(false);

    pub(super) fn unlocked() -> bool {
        UNLOCKED.load(Ordering::Relaxed)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn racing_creates_without_the_lock_never_pass_a_quota() {
        UNLOCKED.store(true, Ordering::Relaxed);
        let dir = tempfile::tempdir().expect("dir");
        let (state, token) = crate::server::ApiState::for_tests(dir.path());
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}});
        let (code, v) = state
            .call_for_tests(&token, "POST", "/api/v1/namespaces", &ns.to_string())
            .await;
        assert_eq!(code, 201, "{v}");
        const QUOTAS: &str = "/api/v1/namespaces/default/resourcequotas";
        let quota = json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q"},
            "spec": {"hard": {"configmaps": "3"}}});
        let (code, mut created) = state.call_for_tests(&token, "POST", QUOTAS, &quota.to_string()).await;
        assert_eq!(code, 201, "{created}");
        created["status"] = json!({"hard": {"configmaps": "3"}, "used": {"configmaps": "0"}});
        let (code, v) = state
            .call_for_tests(&token, "PUT", &format!("{QUOTAS}/q/status"), &created.to_string())
            .await;
        assert_eq!(code, 200, "{v}");

        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..12 {
            let (state, token) = (state.clone(), token.clone());
            tasks.spawn(async move {
                let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("c{i}")}});
                state
                    .call_for_tests(&token, "POST", "/api/v1/namespaces/default/configmaps", &cm.to_string())
                    .await
            });
        }
        let mut created = 0;
        while let Some(r) = tasks.join_next().await {
            let (code, v) = r.expect("task");
            match code {
                201 => created += 1,
                403 => {
                    let m = v["message"].as_str().unwrap_or_default();
                    assert!(
                        m.contains(
                            "exceeded quota: q, requested: configmaps=1, used: configmaps=3, limited: configmaps=3"
                        ) || m.contains("unable to update status of quotas"),
                        "{v}"
                    );
                }
                _ => panic!("{code}: {v}"),
            }
        }
        assert!(created <= 3, "{created} configmaps passed a quota of 3");
        let (_, q) = state.call_for_tests(&token, "GET", &format!("{QUOTAS}/q"), "").await;
        assert_eq!(q["status"]["used"]["configmaps"], json!(created.to_string()), "{q}");
    }
}
