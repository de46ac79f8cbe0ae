//! The workload versions upstream removed (`registry::REMOVED`), converted to and from their
//! replacements as upstream's conversions did while it served them. The fields are the same
//! but for two a later version dropped, kept as the annotations upstream kept them in, and the
//! defaults differ: an old version's defaults are applied on the way in (a selector and labels
//! taken from the pod template, `extensions/v1beta1`'s one-pod rolling updates, `OnDelete`
//! updates), so an object written in an old version behaves as it did there.

use serde_json::{Map, Value, json};

use crate::registry::Resource;

/// Upstream's `math.MaxInt32`, `extensions/v1beta1`'s "keep every old ReplicaSet" and "never
/// time out" defaults.
const MAX_INT32: i64 = 2_147_483_647;

/// Where `extensions/v1beta1` DaemonSets' `spec.templateGeneration` is kept.
pub const TEMPLATE_GENERATION_ANNOTATION: &str = "deprecated.daemonset.template.generation";

/// Where `spec.rollbackTo` of `extensions/v1beta1` and `apps/v1beta1` Deployments is kept.
pub const ROLLBACK_TO_ANNOTATION: &str = "deprecated.deployment.rollback.to";

/// The release a removed version was deprecated in, the one it was removed in, and its
/// replacement (upstream's prerelease lifecycle of each type).
struct Lifecycle {
    deprecated: &'static str,
    removed: &'static str,
    replacement: &'static str,
}

fn lifecycle(res: &Resource) -> Option<Lifecycle> {
    let (deprecated, removed, replacement) = match (res.group, res.version) {
        ("extensions", "v1beta1") | ("apps", "v1beta1") => ("1.8", "1.16", "apps/v1"),
        ("apps", "v1beta2") => ("1.9", "1.16", "apps/v1"),
        ("batch", "v1beta1") => ("1.21", "1.25", "batch/v1"),
        _ => return None,
    };
    Some(Lifecycle {
        deprecated,
        removed,
        replacement,
    })
}

/// The version `res` is stored as: its kind in the replacement's group and version.
pub fn replacement(res: &Resource) -> Option<(&'static str, &'static str)> {
    let l = lifecycle(res)?;
    l.replacement.split_once('/')
}

/// Upstream's deprecation warning for every answer of a removed version ("extensions/v1beta1
/// Deployment is deprecated in v1.8+, unavailable in v1.16+; use apps/v1 Deployment").
pub fn warning(res: &Resource) -> Option<String> {
    let l = lifecycle(res)?;
    Some(format!(
        "{} {} is deprecated in v{}+, unavailable in v{}+; use {} {}",
        res.api_version(),
        res.kind,
        l.deprecated,
        l.removed,
        l.replacement,
        res.kind
    ))
}

fn object_mut<'a>(parent: &'a mut Map<String, Value>, key: &str) -> &'a mut Map<String, Value> {
    let slot = parent.entry(key.to_string()).or_insert_with(|| json!({}));
    if !slot.is_object() {
        *slot = json!({});
    }
    match slot {
        Value::Object(m) => m,
        _ => unreachable!("made an object above"),
    }
}

fn set_default(m: &mut Map<String, Value>, key: &str, value: Value) {
    if m.get(key).is_none_or(Value::is_null) {
        m.insert(key.to_string(), value);
    }
}

/// The old versions' shared default: with no selector, the pod template's labels select; with
/// no labels, the object takes the template's.
fn default_selector_and_labels(obj: &mut Map<String, Value>) {
    let template_labels = obj
        .get("spec")
        .and_then(|s| s.pointer("/template/metadata/labels"))
        .filter(|l| l.as_object().is_some_and(|m| !m.is_empty()))
        .cloned();
    let Some(labels) = template_labels else {
        return;
    };
    set_default(object_mut(obj, "spec"), "selector", json!({"matchLabels": labels}));
    let metadata = object_mut(obj, "metadata");
    if metadata
        .get("labels")
        .and_then(Value::as_object)
        .is_none_or(Map::is_empty)
    {
        metadata.insert("labels".into(), labels);
    }
}

/// A rolling update's `maxUnavailable` and `maxSurge` defaults.
fn default_rolling_update(spec: &mut Map<String, Value>, unavailable: &Value, surge: Option<&Value>) {
    let strategy = object_mut(spec, "strategy");
    set_default(strategy, "type", json!("RollingUpdate"));
    let rolling = strategy.get("type").and_then(Value::as_str) == Some("RollingUpdate");
    if !rolling && strategy.get("rollingUpdate").is_none() {
        return;
    }
    let ru = object_mut(strategy, "rollingUpdate");
    set_default(ru, "maxUnavailable", unavailable.clone());
    if let Some(surge) = surge {
        set_default(ru, "maxSurge", surge.clone());
    }
}

/// A field a later version dropped, moved into the annotation it is kept in there (`text`
/// writes the annotation's value; `None` drops a value that has none).
fn field_to_annotation(obj: &mut Map<String, Value>, field: &str, annotation: &str, text: fn(&Value) -> Option<i64>) {
    let Some(value) = obj
        .get_mut("spec")
        .and_then(Value::as_object_mut)
        .and_then(|s| s.remove(field))
    else {
        return;
    };
    let Some(text) = text(&value) else {
        return;
    };
    let annotations = object_mut(object_mut(obj, "metadata"), "annotations");
    annotations.insert(annotation.to_string(), Value::String(text.to_string()));
}

fn annotation_to_field(obj: &mut Map<String, Value>, annotation: &str, field: &str, parse: fn(&str) -> Option<Value>) {
    let Some(text) = obj
        .get_mut("metadata")
        .and_then(|m| m.get_mut("annotations"))
        .and_then(Value::as_object_mut)
        .and_then(|a| a.remove(annotation))
    else {
        return;
    };
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut)
        && meta
            .get("annotations")
            .and_then(Value::as_object)
            .is_some_and(Map::is_empty)
    {
        meta.remove("annotations");
    }
    if let Some(value) = text.as_str().and_then(parse) {
        object_mut(obj, "spec").insert(field.to_string(), value);
    }
}

/// An object written in a removed version, with that version's defaults, as its replacement
/// stores it.
pub fn to_storage(res: &Resource, obj: &Value) -> Value {
    let Some((group, version)) = replacement(res) else {
        return obj.clone();
    };
    let mut out = obj.clone();
    let Some(m) = out.as_object_mut() else {
        return out;
    };
    m.insert("apiVersion".into(), json!(format!("{group}/{version}")));
    let old_defaults = (res.group, res.version) != ("apps", "v1beta2");
    match res.kind {
        "Deployment" => {
            if old_defaults {
                default_selector_and_labels(m);
            }
            let spec = object_mut(m, "spec");
            set_default(spec, "replicas", json!(1));
            if res.group == "extensions" {
                default_rolling_update(spec, &json!(1), Some(&json!(1)));
                set_default(spec, "revisionHistoryLimit", json!(MAX_INT32));
                set_default(spec, "progressDeadlineSeconds", json!(MAX_INT32));
            } else if res.version == "v1beta1" {
                default_rolling_update(spec, &json!("25%"), Some(&json!("25%")));
                set_default(spec, "revisionHistoryLimit", json!(2));
                set_default(spec, "progressDeadlineSeconds", json!(600));
            }
            field_to_annotation(m, "rollbackTo", ROLLBACK_TO_ANNOTATION, |v| {
                v.get("revision").map_or(Some(0), Value::as_i64)
            });
        }
        "DaemonSet" => {
            if old_defaults {
                default_selector_and_labels(m);
                let spec = object_mut(m, "spec");
                let strategy = object_mut(spec, "updateStrategy");
                set_default(strategy, "type", json!("OnDelete"));
                set_default(spec, "revisionHistoryLimit", json!(10));
            }
            field_to_annotation(m, "templateGeneration", TEMPLATE_GENERATION_ANNOTATION, Value::as_i64);
        }
        "ReplicaSet" if old_defaults => {
            default_selector_and_labels(m);
            set_default(object_mut(m, "spec"), "replicas", json!(1));
        }
        "StatefulSet" if old_defaults => {
            default_selector_and_labels(m);
            let spec = object_mut(m, "spec");
            let strategy = object_mut(spec, "updateStrategy");
            set_default(strategy, "type", json!("OnDelete"));
        }
        _ => {}
    }
    out
}

/// A stored object as the removed version `res` shows it.
pub fn from_storage(res: &Resource, obj: &Value) -> Value {
    if replacement(res).is_none() {
        return obj.clone();
    }
    let mut out = obj.clone();
    let Some(m) = out.as_object_mut() else {
        return out;
    };
    m.insert("apiVersion".into(), json!(res.api_version()));
    match res.kind {
        "Deployment" if res.version == "v1beta1" => {
            annotation_to_field(m, ROLLBACK_TO_ANNOTATION, "rollbackTo", |t| {
                Some(json!({"revision": t.trim().parse::<i64>().ok()?}))
            });
        }
        "DaemonSet" if res.group == "extensions" => {
            annotation_to_field(m, TEMPLATE_GENERATION_ANNOTATION, "templateGeneration", |t| {
                t.trim().parse::<i64>().ok().map(Value::from)
            });
        }
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::REMOVED;

    fn removed(group: &str, version: &str, kind: &str) -> &'static Resource {
        REMOVED
            .iter()
            .find(|r| r.group == group && r.version == version && r.kind == kind)
            .expect("a removed version")
    }

    #[test]
    fn an_extensions_deployment_without_a_selector_gets_its_templates_labels_and_old_defaults() {
        let res = removed("extensions", "v1beta1", "Deployment");
        let obj = json!({"apiVersion": "extensions/v1beta1", "kind": "Deployment",
            "metadata": {"name": "nginx"},
            "spec": {"replicas": 3, "rollbackTo": {"revision": 2},
                     "template": {"metadata": {"labels": {"app": "nginx"}},
                                  "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}});
        let stored = to_storage(res, &obj);
        assert_eq!(stored["apiVersion"], "apps/v1");
        assert_eq!(stored["spec"]["selector"], json!({"matchLabels": {"app": "nginx"}}));
        assert_eq!(stored["metadata"]["labels"], json!({"app": "nginx"}));
        assert_eq!(
            stored["spec"]["strategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 1}})
        );
        assert_eq!(stored["spec"]["revisionHistoryLimit"], MAX_INT32);
        assert_eq!(stored["spec"]["progressDeadlineSeconds"], MAX_INT32);
        assert!(stored["spec"].get("rollbackTo").is_none());
        assert_eq!(stored["metadata"]["annotations"][ROLLBACK_TO_ANNOTATION], "2");

        let shown = from_storage(res, &stored);
        assert_eq!(shown["apiVersion"], "extensions/v1beta1");
        assert_eq!(shown["spec"]["selector"], stored["spec"]["selector"]);
        assert_eq!(shown["spec"]["rollbackTo"], json!({"revision": 2}));
        assert!(shown["metadata"].get("annotations").is_none());
    }

    #[test]
    fn a_selector_and_labels_given_are_kept_and_v1beta2_has_the_current_defaults() {
        let res = removed("extensions", "v1beta1", "ReplicaSet");
        let obj = json!({"metadata": {"name": "r", "labels": {"tier": "web"}},
            "spec": {"selector": {"matchLabels": {"x": "1"}},
                     "template": {"metadata": {"labels": {"x": "1", "y": "2"}}}}});
        let stored = to_storage(res, &obj);
        assert_eq!(stored["spec"]["selector"], json!({"matchLabels": {"x": "1"}}));
        assert_eq!(stored["metadata"]["labels"], json!({"tier": "web"}));
        assert_eq!(stored["spec"]["replicas"], 1);

        let v1beta2 = removed("apps", "v1beta2", "Deployment");
        let stored = to_storage(
            v1beta2,
            &json!({"spec": {"template": {"metadata": {"labels": {"a": "b"}}}}}),
        );
        assert_eq!(stored["apiVersion"], "apps/v1");
        assert!(
            stored["spec"].get("selector").is_none(),
            "v1beta2 requires a selector, as apps/v1"
        );
        assert!(stored["spec"].get("strategy").is_none());
    }

    #[test]
    fn old_daemon_sets_and_stateful_sets_update_on_delete_and_keep_their_template_generation() {
        let ds = removed("extensions", "v1beta1", "DaemonSet");
        let stored = to_storage(
            ds,
            &json!({"spec": {"templateGeneration": 3, "template": {"metadata": {"labels": {"a": "b"}}}}}),
        );
        assert_eq!(stored["spec"]["updateStrategy"]["type"], "OnDelete");
        assert_eq!(stored["spec"]["revisionHistoryLimit"], 10);
        assert_eq!(stored["metadata"]["annotations"][TEMPLATE_GENERATION_ANNOTATION], "3");
        let shown = from_storage(ds, &stored);
        assert_eq!(shown["spec"]["templateGeneration"], 3);
        assert!(shown["metadata"].get("annotations").is_none());

        let sts = removed("apps", "v1beta1", "StatefulSet");
        let stored = to_storage(sts, &json!({"spec": {"updateStrategy": {"type": "RollingUpdate"}}}));
        assert_eq!(stored["spec"]["updateStrategy"]["type"], "RollingUpdate");
        let stored = to_storage(sts, &json!({"spec": {}}));
        assert_eq!(stored["spec"]["updateStrategy"]["type"], "OnDelete");
    }

    #[test]
    fn warnings_name_the_release_and_the_replacement() {
        assert_eq!(
            warning(removed("extensions", "v1beta1", "Deployment")).as_deref(),
            Some("extensions/v1beta1 Deployment is deprecated in v1.8+, unavailable in v1.16+; use apps/v1 Deployment")
        );
        assert_eq!(
            warning(removed("batch", "v1beta1", "CronJob")).as_deref(),
            Some("batch/v1beta1 CronJob is deprecated in v1.21+, unavailable in v1.25+; use batch/v1 CronJob")
        );
        assert_eq!(
            warning(removed("apps", "v1beta2", "StatefulSet")).as_deref(),
            Some("apps/v1beta2 StatefulSet is deprecated in v1.9+, unavailable in v1.16+; use apps/v1 StatefulSet")
        );
        for r in REMOVED {
            let (group, version) = replacement(r).expect("every removed version has a replacement");
            assert!(
                crate::registry::RESOURCES
                    .iter()
                    .any(|c| c.group == group && c.version == version && c.kind == r.kind && c.plural == r.plural)
            );
        }
    }
}
