//! The API Priority and Fairness configuration objects, kept as upstream's configuration
//! producer (`pkg/registry/flowcontrol/ensurer`, run by the
//! `priority-and-fairness-config-producer` post-start hook) keeps them: at start and every
//! minute after, each mandatory and suggested FlowSchema and PriorityLevelConfiguration
//! (`skiff_api::flowcontrol`) is created when missing. A mandatory object always gets its
//! spec back and `apf.kubernetes.io/autoupdate-spec: "true"`; a suggested one gets its spec back
//! only while that annotation is `true` (or, when it is missing or not a boolean, while the
//! object is at generation 1, i.e. its spec was never changed).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use skiff_api::Resource;
use skiff_api::flowcontrol::{self, AUTO_UPDATE_ANNOTATION};
use skiff_store::{Store, StoreError};

use crate::objects;
use crate::server::ApiState;

/// How often the configuration is ensured after the start.
const PERIOD: Duration = Duration::from_secs(60);

fn resource(plural: &str) -> anyhow::Result<&'static Resource> {
    skiff_api::registry::lookup("flowcontrol.apiserver.k8s.io", "v1", plural)
        .ok_or_else(|| anyhow::anyhow!("{plural} is not registered"))
}

/// What to do with one configuration object.
#[derive(Debug, PartialEq)]
pub enum Action {
    Nothing,
    Create(Value),
    Update(Value),
}

fn annotation(obj: &Value) -> Option<&str> {
    obj.pointer("/metadata/annotations")
        .and_then(|a| a.get(AUTO_UPDATE_ANNOTATION))
        .and_then(Value::as_str)
}

/// upstream's `shouldUpdateSpec` for suggested objects: the annotation when it is a boolean
/// (Go's `strconv.ParseBool`), else whether the spec is the one first created.
fn auto_update(obj: &Value) -> bool {
    match annotation(obj) {
        Some("1" | "t" | "T" | "true" | "TRUE" | "True") => true,
        Some("0" | "f" | "F" | "false" | "FALSE" | "False") => false,
        _ => obj.pointer("/metadata/generation").and_then(Value::as_i64) == Some(1),
    }
}

/// The action for the bootstrap object `desired` given what is stored.
pub fn decide(desired: &Value, current: Option<&Value>, mandatory: bool) -> Action {
    let Some(current) = current else {
        return Action::Create(desired.clone());
    };
    if !mandatory && !auto_update(current) {
        return Action::Nothing;
    }
    let spec_differs = current.get("spec") != desired.get("spec");
    if !spec_differs && annotation(current) == Some("true") {
        return Action::Nothing;
    }
    let mut updated = current.clone();
    if let Some(m) = updated.as_object_mut() {
        m.insert("spec".into(), desired.get("spec").cloned().unwrap_or(Value::Null));
    }
    let md = objects::metadata_mut(&mut updated);
    let annotations = md.entry("annotations").or_insert_with(|| json!({}));
    if !annotations.is_object() {
        *annotations = json!({});
    }
    if let Some(a) = annotations.as_object_mut() {
        a.insert(AUTO_UPDATE_ANNOTATION.into(), json!("true"));
    }
    if spec_differs {
        let generation = md.get("generation").and_then(Value::as_i64).unwrap_or(0);
        md.insert("generation".into(), json!(generation + 1));
    }
    Action::Update(updated)
}

async fn ensure_one(store: &dyn Store, res: &Resource, desired: &Value, mandatory: bool) -> anyhow::Result<()> {
    let name = objects::name(desired).to_string();
    let key = objects::key(res, "", &name);
    let current = store.get(&key).await?;
    let decoded = current.as_ref().and_then(objects::decode_kv);
    match decide(desired, decoded.as_ref(), mandatory) {
        Action::Nothing => Ok(()),
        Action::Create(mut obj) => {
            tracing::info!(kind = res.kind, name, "creating a flow control configuration object");
            let md = objects::metadata_mut(&mut obj);
            md.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
            md.insert("creationTimestamp".into(), json!(objects::now_rfc3339()));
            md.insert("generation".into(), json!(1));
            skiff_api::written::fill(res, &mut obj);
            match store.create(&key, objects::encode_for_store(&obj)).await {
                Ok(_) | Err(StoreError::AlreadyExists(_)) => Ok(()),
                Err(e) => Err(e.into()),
            }
        }
        Action::Update(obj) => {
            tracing::info!(
                kind = res.kind,
                name,
                "restoring a flow control configuration object's spec"
            );
            let rev = current.map(|kv| kv.mod_revision).unwrap_or_default();
            match store.update(&key, objects::encode_for_store(&obj), rev).await {
                // Changed meanwhile: the next round looks again.
                Ok(_) | Err(StoreError::Conflict { .. }) | Err(StoreError::NotFound(_)) => Ok(()),
                Err(e) => Err(e.into()),
            }
        }
    }
}

/// One round over every bootstrap object, priority levels first.
pub async fn ensure(store: &dyn Store) -> anyhow::Result<()> {
    let levels = resource("prioritylevelconfigurations")?;
    let schemas = resource("flowschemas")?;
    let rounds = [
        (levels, flowcontrol::mandatory_priority_levels(), true),
        (levels, flowcontrol::suggested_priority_levels(), false),
        (schemas, flowcontrol::mandatory_flow_schemas(), true),
        (schemas, flowcontrol::suggested_flow_schemas(), false),
    ];
    for (res, objects, mandatory) in rounds {
        for desired in &objects {
            ensure_one(store, res, desired, mandatory).await?;
        }
    }
    Ok(())
}

/// Ensure the configuration again every minute, and at once after a change to a schema or a
/// level (so a deleted mandatory object is back within moments rather than within the minute).
pub fn spawn(state: Arc<ApiState>) {
    tokio::spawn(async move {
        let store = state.store.clone();
        let prefixes: Vec<String> = ["flowschemas", "prioritylevelconfigurations"]
            .iter()
            .filter_map(|p| resource(p).ok())
            .map(|r| objects::prefix(r, ""))
            .collect();
        let mut triggers =
            crate::resync::Triggers::new(store.clone(), prefixes.to_vec(), PERIOD, "flow control configuration");
        loop {
            triggers.next().await;
            if let Err(e) = ensure(&*store).await {
                tracing::warn!(error = %e, "ensuring the flow control configuration failed");
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(spec: Value, annotation: Option<&str>, generation: i64) -> Value {
        let mut md = json!({"name": "x", "generation": generation});
        if let Some(a) = annotation {
            md["annotations"] = json!({AUTO_UPDATE_ANNOTATION: a});
        }
        json!({"metadata": md, "spec": spec})
    }

    #[test]
    fn missing_objects_are_created() {
        let desired = json!({"metadata": {"name": "x"}, "spec": {"a": 1}});
        assert_eq!(decide(&desired, None, false), Action::Create(desired.clone()));
    }

    #[test]
    fn mandatory_specs_always_come_back() {
        let desired = json!({"metadata": {"name": "x"}, "spec": {"a": 1}});
        let changed = stored(json!({"a": 2}), Some("false"), 2);
        match decide(&desired, Some(&changed), true) {
            Action::Update(u) => {
                assert_eq!(u["spec"], json!({"a": 1}));
                assert_eq!(u["metadata"]["annotations"][AUTO_UPDATE_ANNOTATION], "true");
                assert_eq!(u["metadata"]["generation"], 3);
            }
            a => panic!("{a:?}"),
        }
        let same = stored(json!({"a": 1}), Some("true"), 1);
        assert_eq!(decide(&desired, Some(&same), true), Action::Nothing);
    }

    #[test]
    fn suggested_specs_follow_the_annotation() {
        let desired = json!({"metadata": {"name": "x"}, "spec": {"a": 1}});
        let kept = stored(json!({"a": 2}), Some("false"), 2);
        assert_eq!(decide(&desired, Some(&kept), false), Action::Nothing);
        let auto = stored(json!({"a": 2}), Some("true"), 2);
        assert!(matches!(decide(&desired, Some(&auto), false), Action::Update(_)));
        // No annotation: updated only while never changed.
        let untouched = stored(json!({"a": 1}), None, 1);
        match decide(&desired, Some(&untouched), false) {
            Action::Update(u) => {
                assert_eq!(u["metadata"]["annotations"][AUTO_UPDATE_ANNOTATION], "true");
                assert_eq!(u["metadata"]["generation"], 1);
            }
            a => panic!("{a:?}"),
        }
        let edited = stored(json!({"a": 2}), None, 2);
        assert_eq!(decide(&desired, Some(&edited), false), Action::Nothing);
    }
}
