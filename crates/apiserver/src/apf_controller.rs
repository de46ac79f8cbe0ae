//! The `Dangling` condition of every FlowSchema, as upstream's API Priority and Fairness
//! configuration consumer (`k8s.io/apiserver/pkg/util/flowcontrol/apf_controller.go`) writes it:
//! `False`, reason `Found`, while the PriorityLevelConfiguration it names exists, `True`,
//! reason `NotFound`, while it does not (`kubectl get flowschemas` shows it as MISSINGPL).
//!
//! Skiff's own request limiter is max-in-flight (`filters.rs`): the configuration is served
//! and kept, but does not classify requests.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use skiff_store::{ListOptions, Store};

use crate::objects;
use crate::server::ApiState;

/// The `Dangling` condition's status, reason and message for a schema naming `level`.
pub fn dangling(level: &str, exists: bool) -> (&'static str, &'static str, String) {
    if exists {
        (
            "False",
            "Found",
            format!("This FlowSchema references the PriorityLevelConfiguration object named {level:?} and it exists"),
        )
    } else {
        (
            "True",
            "NotFound",
            format!(
                "This FlowSchema references the PriorityLevelConfiguration object named {level:?} but there is no such object"
            ),
        )
    }
}

/// `schema` with its `Dangling` condition as it should be; `None` when it already is.
pub fn with_dangling(schema: &Value, levels: &HashSet<String>, now: &str) -> Option<Value> {
    let level = schema
        .pointer("/spec/priorityLevelConfiguration/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let (status, reason, message) = dangling(level, levels.contains(level));
    let existing = schema
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.get("type").and_then(Value::as_str) == Some("Dangling"))
        });
    let same = existing.is_some_and(|c| {
        c.get("status").and_then(Value::as_str) == Some(status)
            && c.get("reason").and_then(Value::as_str) == Some(reason)
            && c.get("message").and_then(Value::as_str) == Some(message.as_str())
    });
    if same {
        return None;
    }
    let condition = json!({
        "type": "Dangling",
        "status": status,
        "lastTransitionTime": now,
        "reason": reason,
        "message": message,
    });
    let mut out = schema.clone();
    let m = out.as_object_mut()?;
    let st = m.entry("status").or_insert_with(|| json!({}));
    if !st.is_object() {
        *st = json!({});
    }
    let conditions = st.as_object_mut()?.entry("conditions").or_insert_with(|| json!([]));
    if !conditions.is_array() {
        *conditions = json!([]);
    }
    let list = conditions.as_array_mut()?;
    match list
        .iter_mut()
        .find(|c| c.get("type").and_then(Value::as_str) == Some("Dangling"))
    {
        Some(c) => *c = condition,
        None => list.push(condition),
    }
    Some(out)
}

/// One pass over every FlowSchema.
pub async fn sync(store: &dyn Store) -> anyhow::Result<()> {
    let lookup = |plural: &str| {
        skiff_api::registry::lookup("flowcontrol.apiserver.k8s.io", "v1", plural)
            .ok_or_else(|| anyhow::anyhow!("{plural} is not registered"))
    };
    let (schemas, levels) = (lookup("flowschemas")?, lookup("prioritylevelconfigurations")?);
    let names: HashSet<String> = store
        .list(&objects::prefix(levels, ""), ListOptions::default())
        .await?
        .items
        .iter()
        .filter_map(objects::decode_kv)
        .map(|l| objects::name(&l).to_string())
        .collect();
    let list = store
        .list(&objects::prefix(schemas, ""), ListOptions::default())
        .await?;
    let now = objects::now_rfc3339();
    for kv in &list.items {
        let Some(schema) = objects::decode_kv(kv) else { continue };
        let Some(updated) = with_dangling(&schema, &names, &now) else {
            continue;
        };
        if let Err(e) = store
            .update(&kv.key, objects::encode_for_store(&updated), kv.mod_revision)
            .await
        {
            tracing::debug!(key = kv.key, error = %e, "writing a FlowSchema's status failed; retried");
        }
    }
    Ok(())
}

/// Keep the conditions current: after each change to a schema or a level.
pub fn spawn(state: Arc<ApiState>) {
    tokio::spawn(async move {
        let store = state.store.clone();
        let prefixes: Vec<String> = ["flowschemas", "prioritylevelconfigurations"]
            .iter()
            .filter_map(|p| skiff_api::registry::lookup("flowcontrol.apiserver.k8s.io", "v1", p))
            .map(|r| objects::prefix(r, ""))
            .collect();
        let mut triggers = crate::resync::Triggers::new(
            store.clone(),
            prefixes.to_vec(),
            Duration::from_secs(60),
            "flow schema conditions",
        );
        loop {
            triggers.next().await;
            if let Err(e) = sync(&*store).await {
                tracing::warn!(error = %e, "checking flow schemas failed");
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dangling_follows_the_priority_level() {
        let fs = json!({"metadata": {"name": "mine"}, "spec": {"priorityLevelConfiguration": {"name": "gone"}}});
        let levels: HashSet<String> = ["exempt".to_string()].into();
        let updated = with_dangling(&fs, &levels, "2024-01-01T00:00:00Z").expect("changed");
        let c = &updated["status"]["conditions"][0];
        assert_eq!(
            (c["type"].as_str(), c["status"].as_str()),
            (Some("Dangling"), Some("True"))
        );
        assert_eq!(c["reason"], "NotFound");
        assert_eq!(
            c["message"],
            "This FlowSchema references the PriorityLevelConfiguration object named \"gone\" but there is no such object"
        );
        // Unchanged: nothing to write.
        assert!(with_dangling(&updated, &levels, "2024-01-02T00:00:00Z").is_none());
        let levels: HashSet<String> = ["gone".to_string()].into();
        let found = with_dangling(&updated, &levels, "2024-01-02T00:00:00Z").expect("changed");
        assert_eq!(found["status"]["conditions"][0]["status"], "False");
        assert_eq!(found["status"]["conditions"][0]["reason"], "Found");
        assert_eq!(found["status"]["conditions"].as_array().map(Vec::len), Some(1));
    }
}
