//! The API server's own controllers for CustomResourceDefinitions, as upstream's
//! apiextensions-apiserver runs them in its process: the naming controller
//! (`NamesAccepted`, `acceptedNames`), the establishing controller (`Established`, after the
//! resources are served), and the finalizer (`customresourcecleanup.apiextensions.k8s.io`:
//! a deleted definition's objects go first, then the definition, and it stops being served).
//!
//! The served set lives in `skiff_api::apiextensions` (and so in the registry); it is rebuilt
//! from the stored definitions at start, before the server answers, and after every change.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use skiff_api::apiextensions::{self, CLEANUP_FINALIZER, Definition};
use skiff_store::{KeyValue, ListOptions, Store};

use crate::objects;
use crate::server::ApiState;

/// Where definitions are stored.
pub const PREFIX: &str = "/registry/apiextensions.k8s.io/customresourcedefinitions/";

/// Reconcile every definition once and serve the established ones: at start, before the
/// server answers, so a restarted server serves what it served before.
pub async fn load(state: &ApiState) -> anyhow::Result<()> {
    reconcile_all(&*state.store).await.map(|_| ())
}

/// Keep definitions reconciled: after each change to one, and every second while one is being
/// deleted (its objects may wait on finalizers).
pub fn spawn(state: Arc<ApiState>) {
    tokio::spawn(async move {
        let store = state.store.clone();
        loop {
            let from = match store.current_revision().await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the revision for definitions failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            let mut pending = reconcile_all(&*store).await.unwrap_or_else(|e| {
                tracing::warn!(error = %e, "reconciling CustomResourceDefinitions failed");
                true
            });
            let mut events = match store.watch(PREFIX, from).await {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(error = %e, "watching CustomResourceDefinitions failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            loop {
                let wait = if pending {
                    Duration::from_millis(500)
                } else {
                    Duration::from_secs(60)
                };
                if let Ok(None) = tokio::time::timeout(wait, events.next()).await {
                    break;
                }
                pending = reconcile_all(&*store).await.unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "reconciling CustomResourceDefinitions failed");
                    true
                });
            }
        }
    });
}

fn condition(ty: &str, status: &str, reason: &str, message: &str, old: Option<&Value>) -> Value {
    // The transition time moves only when the status does.
    let since = old
        .and_then(|c| {
            c.get("status")
                .filter(|s| *s == status)
                .and(c.get("lastTransitionTime"))
        })
        .cloned()
        .unwrap_or_else(|| json!(objects::now_rfc3339()));
    json!({"type": ty, "status": status, "lastTransitionTime": since, "reason": reason, "message": message})
}

fn old_condition<'a>(crd: &'a Value, ty: &str) -> Option<&'a Value> {
    crd.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(ty))
}

/// One pass over every definition. Returns whether one is still being deleted.
async fn reconcile_all(store: &dyn Store) -> anyhow::Result<bool> {
    let list = store.list(PREFIX, ListOptions::default()).await?;
    let crds: Vec<(KeyValue, Value)> = list
        .items
        .into_iter()
        .filter_map(|kv| objects::decode_kv(&kv).map(|v| (kv, v)))
        .collect();
    let values: Vec<Value> = crds.iter().map(|(_, v)| v.clone()).collect();
    let mut serve = Vec::new();
    let mut status_writes = Vec::new();
    let mut terminating = Vec::new();
    for (kv, crd) in &crds {
        if objects::deletion_timestamp(crd).is_some() {
            terminating.push((kv.clone(), crd.clone()));
            continue;
        }
        let conflict = apiextensions::names_conflict(crd, &values);
        let mut conditions: Vec<Value> = Vec::new();
        let mut new = crd.clone();
        let status = new
            .as_object_mut()
            .map(|m| m.entry("status").or_insert_with(|| json!({})));
        let Some(status) = status.and_then(Value::as_object_mut) else {
            continue;
        };
        match &conflict {
            None => {
                conditions.push(condition(
                    "NamesAccepted",
                    "True",
                    "NoConflicts",
                    "no conflicts found",
                    old_condition(crd, "NamesAccepted"),
                ));
                conditions.push(condition(
                    "Established",
                    "True",
                    "InitialNamesAccepted",
                    "the initial names have been accepted",
                    old_condition(crd, "Established"),
                ));
                status.insert(
                    "acceptedNames".into(),
                    crd.pointer("/spec/names").cloned().unwrap_or(json!({})),
                );
            }
            Some((reason, message)) => {
                conditions.push(condition(
                    "NamesAccepted",
                    "False",
                    reason,
                    message,
                    old_condition(crd, "NamesAccepted"),
                ));
                conditions.push(condition(
                    "Established",
                    "False",
                    "NotAccepted",
                    "not all names are accepted",
                    old_condition(crd, "Established"),
                ));
            }
        }
        status.insert("conditions".into(), Value::Array(conditions));
        // Every version ever used for storage stays listed.
        let mut stored: Vec<Value> = status
            .get("storedVersions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let def = Definition::from_object(crd);
        if let Some(sv) = def.storage_version() {
            let v = json!(sv.name);
            if !stored.contains(&v) {
                stored.push(v);
            }
        }
        status.insert("storedVersions".into(), Value::Array(stored));
        if conflict.is_none() {
            serve.push(def);
        }
        if &new != crd {
            status_writes.push((kv.key.clone(), kv.mod_revision, new));
        }
    }
    // Served before `Established` is written: a client that sees it can use the resource.
    apiextensions::serve(serve);
    for (key, rev, new) in status_writes {
        if let Err(e) = store.update(&key, objects::encode_for_store(&new), rev).await {
            tracing::debug!(key, error = %e, "writing a definition's status failed; retried");
        }
    }
    let mut pending = false;
    for (kv, crd) in terminating {
        if !finalize(store, &kv, &crd).await? {
            pending = true;
        }
    }
    Ok(pending)
}

/// The deletion of a definition: its objects are deleted (those with finalizers are marked
/// and waited for), then the cleanup finalizer goes. Returns whether it is done.
async fn finalize(store: &dyn Store, kv: &KeyValue, crd: &Value) -> anyhow::Result<bool> {
    let finalizers = objects::finalizers(crd);
    if finalizers.iter().any(|f| f == CLEANUP_FINALIZER) {
        let def = Definition::from_object(crd);
        let prefix = format!("/registry/{}/{}/", def.group, def.plural);
        let objs = store.list(&prefix, ListOptions::default()).await?;
        let mut remaining = 0;
        for o in &objs.items {
            let Some(v) = objects::decode_kv(o) else { continue };
            if objects::finalizers(&v).is_empty() {
                if let Err(e) = store.delete(&o.key, Some(o.mod_revision)).await {
                    tracing::debug!(key = o.key, error = %e, "deleting a custom object failed; retried");
                    remaining += 1;
                }
            } else {
                remaining += 1;
                if objects::deletion_timestamp(&v).is_none() {
                    let mut v = v;
                    objects::metadata_mut(&mut v).insert("deletionTimestamp".into(), json!(objects::now_rfc3339()));
                    objects::metadata_mut(&mut v).insert("deletionGracePeriodSeconds".into(), json!(0));
                    let _ = store
                        .update(&o.key, objects::encode_for_store(&v), o.mod_revision)
                        .await;
                }
            }
        }
        let mut new = crd.clone();
        if let Some(status) = new.get_mut("status").and_then(Value::as_object_mut) {
            let mut conditions: Vec<Value> = status
                .get("conditions")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            conditions.retain(|c| c.get("type").and_then(Value::as_str) != Some("Terminating"));
            let (st, reason, message) = if remaining > 0 {
                (
                    "True",
                    "InstanceDeletionInProgress",
                    "CustomResource deletion is in progress".to_string(),
                )
            } else {
                (
                    "False",
                    "InstanceDeletionCompleted",
                    "removed all instances".to_string(),
                )
            };
            conditions.push(condition(
                "Terminating",
                st,
                reason,
                &message,
                old_condition(crd, "Terminating"),
            ));
            status.insert("conditions".into(), Value::Array(conditions));
        }
        if remaining > 0 {
            if &new != crd {
                let _ = store
                    .update(&kv.key, objects::encode_for_store(&new), kv.mod_revision)
                    .await;
            }
            return Ok(false);
        }
        let rest: Vec<String> = finalizers.into_iter().filter(|f| f != CLEANUP_FINALIZER).collect();
        if rest.is_empty() {
            store.delete(&kv.key, Some(kv.mod_revision)).await?;
        } else {
            objects::metadata_mut(&mut new).insert("finalizers".into(), json!(rest));
            store
                .update(&kv.key, objects::encode_for_store(&new), kv.mod_revision)
                .await?;
        }
        return Ok(true);
    }
    if finalizers.is_empty() {
        store.delete(&kv.key, Some(kv.mod_revision)).await?;
        return Ok(true);
    }
    Ok(false)
}
