//! Strategic merge patch, driven by the served schemas and their list metadata
//! ([`super::meta`]), with upstream's semantics (`k8s.io/apimachinery/pkg/util/strategicpatch`,
//! merging with `MergeParallelList` and `IgnoreUnmatchedNulls` as the API server does):
//!
//! - maps merge recursively; a `null` value deletes the key;
//! - lists whose field has patch strategy `merge` and a merge key merge item by item on that
//!   key; an item `{"$patch": "delete", KEY: V}` removes the item, `{"$patch": "replace"}`
//!   makes the list exactly the other patch items;
//! - lists of primitives with strategy `merge` become the union of both lists;
//! - every other list is replaced by the patch's list;
//! - `{"$patch": "replace"}` in a map replaces the map, `{"$patch": "delete"}` removes it;
//! - `$setElementOrder/FIELD` orders the merged list, `$retainKeys` drops the original's
//!   keys it does not name, `$deleteFromPrimitiveList/FIELD` removes values from a list.

use serde_json::{Map, Value};

use super::PatchError;
use super::typed::{FieldMeta, Ty, json_eq};

const DIRECTIVE: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const SET_ELEMENT_ORDER: &str = "$setElementOrder/";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList/";

fn bad(msg: impl Into<String>) -> PatchError {
    PatchError::BadRequest(msg.into())
}

/// Apply strategic merge patch `patch` to `original`, whose schema is definition
/// `definition` ("io.k8s.api.apps.v1.Deployment"). An unknown definition merges maps and
/// replaces every list.
pub fn strategic_merge(original: &Value, patch: &Value, definition: &str) -> Result<Value, PatchError> {
    merge_typed(original, patch, Ty::root(definition))
}

fn merge_typed(original: &Value, patch: &Value, ty: Ty) -> Result<Value, PatchError> {
    let Value::Object(p) = patch else {
        return Err(bad("invalid JSON document"));
    };
    let o = match original {
        Value::Object(o) => o.clone(),
        Value::Null => Map::new(),
        _ => return Err(bad("invalid JSON document")),
    };
    merge_map(o, p.clone(), ty).map(Value::Object)
}

fn merge_map(
    mut original: Map<String, Value>,
    mut patch: Map<String, Value>,
    ty: Ty,
) -> Result<Map<String, Value>, PatchError> {
    if let Some(directive) = patch.get(DIRECTIVE) {
        match directive.as_str() {
            Some("replace") => {
                patch.shift_remove(DIRECTIVE);
                // The map becomes the patch; directives inside it still apply.
                return merge_map(Map::new(), patch, ty);
            }
            Some("delete") => return Ok(Map::new()),
            Some("merge") => {
                patch.shift_remove(DIRECTIVE);
            }
            _ => {
                return Err(bad(format!(
                    "unknown patch type: {directive} in map: {}",
                    Value::Object(patch.clone())
                )));
            }
        }
    }
    apply_retain_keys(&mut original, &mut patch)?;
    merge_ordered_lists(&mut original, &mut patch, ty)?;

    for (k, patch_v) in patch {
        let (key, delete_list) = match k.strip_prefix(DELETE_FROM_PRIMITIVE_LIST) {
            Some(field) => (field.to_string(), true),
            None => (k, false),
        };
        if patch_v.is_null() {
            original.shift_remove(&key);
            continue;
        }
        let (field_ty, meta) = ty.field(&key);
        let Some(orig_v) = original.get_mut(&key) else {
            if !delete_list && let Some(v) = fresh_value(patch_v, field_ty, &meta)? {
                original.insert(key, v);
            }
            continue;
        };
        match (orig_v, patch_v) {
            (Value::Object(o), Value::Object(p)) => {
                let o = std::mem::take(o);
                let merged = if meta.has_strategy("replace") {
                    discard_nulls_map(p)
                } else {
                    merge_map(o, p, field_ty)?
                };
                original.insert(key, Value::Object(merged));
            }
            (Value::Array(o), Value::Array(p)) => {
                let o = std::mem::take(o);
                let merged = merge_list(o, p, field_ty, &meta, delete_list)?;
                original.insert(key, Value::Array(merged));
            }
            (slot, patch_v) => {
                // Different kinds (or scalars): the patch's value wins, its directives
                // applied to nothing.
                if !delete_list {
                    match fresh_value(patch_v, field_ty, &meta)? {
                        Some(v) => *slot = v,
                        None => {
                            original.shift_remove(&key);
                        }
                    }
                }
            }
        }
    }
    Ok(original)
}

/// The value a patch sets for a field the original lacks: the patch's value with its
/// nulls dropped and its directives applied to nothing (None: nothing to set).
fn fresh_value(patch_v: Value, ty: Ty, meta: &FieldMeta) -> Result<Option<Value>, PatchError> {
    match patch_v {
        Value::Object(p) => {
            if p.get(DIRECTIVE).and_then(Value::as_str) == Some("delete") {
                return Ok(None);
            }
            Ok(Some(Value::Object(merge_map(Map::new(), p, ty)?)))
        }
        Value::Array(p) => Ok(Some(Value::Array(merge_list(Vec::new(), p, ty, meta, false)?))),
        other => Ok(Some(other)),
    }
}

fn discard_nulls(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(discard_nulls_map(m)),
        Value::Array(a) => Value::Array(a.into_iter().map(discard_nulls).collect()),
        other => other,
    }
}

fn discard_nulls_map(m: Map<String, Value>) -> Map<String, Value> {
    m.into_iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| (k, discard_nulls(v)))
        .collect()
}

/// `$retainKeys`: drop the original's keys that the list does not name.
fn apply_retain_keys(original: &mut Map<String, Value>, patch: &mut Map<String, Value>) -> Result<(), PatchError> {
    let Some(retain) = patch.shift_remove(RETAIN_KEYS) else {
        return Ok(());
    };
    let Value::Array(keys) = retain else {
        return Err(bad("invalid patch format of retainKeys"));
    };
    let mut names = Vec::with_capacity(keys.len());
    for k in &keys {
        match k.as_str() {
            Some(s) => names.push(s.to_string()),
            None => return Err(bad("invalid patch format of retainKeys")),
        }
    }
    // Every field the patch sets must be one the directive keeps.
    let outside = patch.iter().any(|(k, v)| {
        !v.is_null()
            && !k.starts_with(DELETE_FROM_PRIMITIVE_LIST)
            && !k.starts_with(SET_ELEMENT_ORDER)
            && !names.iter().any(|n| n == k)
    });
    if outside {
        return Err(bad("invalid patch format of retainKeys"));
    }
    original.retain(|k, _| names.iter().any(|n| n == k));
    Ok(())
}

/// Upstream's `validatePatchWithSetOrderList`: the patch's items (deletions aside) must
/// appear in the `$setElementOrder` list, in the same relative order.
fn validate_order(patch_list: &[Value], order: &[Value], key: Option<&str>) -> Result<(), PatchError> {
    if patch_list.is_empty() || order.is_empty() {
        return Ok(());
    }
    let items: Vec<&Value> = patch_list.iter().filter(|v| v.get(DIRECTIVE).is_none()).collect();
    let same = |a: &Value, b: &Value| match key {
        Some(k) => match (a.get(k), b.get(k)) {
            (Some(x), Some(y)) => json_eq(x, y),
            _ => false,
        },
        None => json_eq(a, b),
    };
    let (mut pi, mut oi) = (0, 0);
    while pi < items.len() && oi < order.len() {
        if same(items[pi], &order[oi]) {
            pi += 1;
        }
        oi += 1;
    }
    if pi < items.len() {
        return Err(bad(format!(
            "The order in patch list:\n{}\n doesn't match {SET_ELEMENT_ORDER} list:\n{}\n",
            Value::Array(patch_list.to_vec()),
            Value::Array(order.to_vec())
        )));
    }
    Ok(())
}

/// Process every `$setElementOrder/FIELD`: merge the patch's FIELD list (if any) into the
/// original and order the result as the directive says, the patch's order and the live
/// order settling the rest. Both the directive and the FIELD list leave the patch.
fn merge_ordered_lists(
    original: &mut Map<String, Value>,
    patch: &mut Map<String, Value>,
    ty: Ty,
) -> Result<(), PatchError> {
    let directives: Vec<String> = patch
        .keys()
        .filter(|k| k.starts_with(SET_ELEMENT_ORDER))
        .cloned()
        .collect();
    for directive in directives {
        let field = directive[SET_ELEMENT_ORDER.len()..].to_string();
        let Some(Value::Array(order)) = patch.shift_remove(&directive) else {
            return Err(bad("invalid patch format of setElementOrder list"));
        };
        let (field_ty, meta) = ty.field(&field);
        let orig_list = match original.get(&field) {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a.clone(),
            Some(other) => {
                return Err(bad(format!(
                    "invalid type for {field}: expected a list, got {}",
                    super::typed::kind_name(other)
                )));
            }
        };
        let patch_list = match patch.shift_remove(&field) {
            None => Vec::new(),
            Some(Value::Null) => {
                original.shift_remove(&field);
                continue;
            }
            Some(Value::Array(a)) => a,
            Some(other) => {
                return Err(bad(format!(
                    "invalid type for {field}: expected a list, got {}",
                    super::typed::kind_name(&other)
                )));
            }
        };
        if orig_list.is_empty() && patch_list.is_empty() && order.is_empty() {
            continue;
        }
        let key = meta.merge_key;
        if key.is_some() && order.iter().any(|o| !o.is_object()) {
            return Err(bad("invalid patch format of setElementOrder list"));
        }
        validate_order(&patch_list, &order, key)?;
        let merged = merge_list(orig_list.clone(), patch_list, field_ty, &meta, false)?;
        let (in_order, server_only) = partition(merged, &order, key);
        let both = normalize_element_order(in_order, server_only, &order, &orig_list, key);
        if both.is_empty() && !original.contains_key(&field) {
            continue;
        }
        original.insert(field, Value::Array(both));
    }
    Ok(())
}

fn merge_list(
    original: Vec<Value>,
    patch: Vec<Value>,
    ty: Ty,
    meta: &FieldMeta,
    delete_list: bool,
) -> Result<Vec<Value>, PatchError> {
    if delete_list {
        return Ok(original
            .into_iter()
            .filter(|o| !patch.iter().any(|p| json_eq(o, p)))
            .collect());
    }
    if !meta.has_strategy("merge") {
        return Ok(patch);
    }
    merge_slice(original, patch, ty.items(), meta.merge_key)
}

/// Upstream's `mergeSlice` for lists with strategy merge.
fn merge_slice(
    original: Vec<Value>,
    patch: Vec<Value>,
    item_ty: Ty,
    merge_key: Option<&str>,
) -> Result<Vec<Value>, PatchError> {
    if original.is_empty() && patch.is_empty() {
        return Ok(original);
    }
    let maps = element_kind_is_map(&original, &patch)?;
    if !maps {
        let mut merged: Vec<Value> = Vec::with_capacity(original.len() + patch.len());
        for v in original.iter().chain(patch.iter()) {
            if !merged.iter().any(|m| json_eq(m, v)) {
                merged.push(v.clone());
            }
        }
        let (in_patch, server_only) = partition(merged, &patch, None);
        return Ok(normalize_element_order(in_patch, server_only, &patch, &original, None));
    }
    let Some(key) = merge_key else {
        return Err(bad(format!(
            "cannot merge lists without merge key for {}",
            item_ty.name().unwrap_or("type")
        )));
    };
    // Items with a $patch directive.
    let mut original = original;
    let mut plain = Vec::with_capacity(patch.len());
    let mut replace = false;
    for item in patch {
        let Value::Object(m) = &item else {
            return Err(bad("lists of maps and non-maps cannot be merged"));
        };
        match m.get(DIRECTIVE).and_then(Value::as_str) {
            Some("delete") => {
                let Some(kv) = m.get(key) else {
                    return Err(bad(format!("map: {item} does not contain declared merge key: {key}")));
                };
                original.retain(|o| !o.get(key).is_some_and(|ov| json_eq(ov, kv)));
            }
            Some("replace") => replace = true,
            Some("merge") => return Err(bad("merging lists cannot yet be specified in the patch")),
            Some(other) => return Err(bad(format!("unknown patch type: {other} in map: {item}"))),
            None => plain.push(item),
        }
    }
    if replace {
        return plain
            .into_iter()
            .map(|item| match item {
                Value::Object(m) => merge_map(Map::new(), m, item_ty).map(Value::Object),
                other => Ok(other),
            })
            .collect();
    }
    let mut merged = original.clone();
    for item in &plain {
        let Some(kv) = item.get(key) else {
            return Err(bad(format!("map: {item} does not contain declared merge key: {key}")));
        };
        let Value::Object(pm) = item else { continue };
        match merged.iter().position(|o| o.get(key).is_some_and(|ov| json_eq(ov, kv))) {
            Some(i) => {
                let om = match std::mem::take(&mut merged[i]) {
                    Value::Object(m) => m,
                    _ => Map::new(),
                };
                merged[i] = Value::Object(merge_map(om, pm.clone(), item_ty)?);
            }
            None => merged.push(Value::Object(merge_map(Map::new(), pm.clone(), item_ty)?)),
        }
    }
    let (in_patch, server_only) = partition(merged, &plain, Some(key));
    Ok(normalize_element_order(
        in_patch,
        server_only,
        &plain,
        &original,
        Some(key),
    ))
}

/// Whether the lists hold maps (true) or primitives (false); mixed lists and lists of
/// lists are errors, as upstream.
fn element_kind_is_map(a: &[Value], b: &[Value]) -> Result<bool, PatchError> {
    let mut kind: Option<bool> = None;
    for v in a.iter().chain(b) {
        if v.is_array() {
            return Err(bad("lists of lists are not supported"));
        }
        let is_map = v.is_object();
        match kind {
            None => kind = Some(is_map),
            Some(k) if k != is_map => {
                return Err(bad("lists of maps and non-maps cannot be merged"));
            }
            _ => {}
        }
    }
    Ok(kind.unwrap_or(false))
}

/// Position of `item` in `list`: by merge key for maps, by value for primitives.
fn index_of(list: &[Value], item: &Value, key: Option<&str>) -> Option<usize> {
    match key {
        Some(k) => {
            let kv = item.get(k)?;
            list.iter().position(|v| v.get(k).is_some_and(|x| json_eq(x, kv)))
        }
        None => list.iter().position(|v| json_eq(v, item)),
    }
}

/// Split `merged` into the items present in `list` and the rest, keeping order.
fn partition(merged: Vec<Value>, list: &[Value], key: Option<&str>) -> (Vec<Value>, Vec<Value>) {
    merged.into_iter().partition(|v| index_of(list, v, key).is_some())
}

/// Sort the patch items by the patch order and the server-only items by the live order,
/// then interleave them, keeping the live order between the two where both are known.
fn normalize_element_order(
    mut patch_items: Vec<Value>,
    mut server_only: Vec<Value>,
    patch_order: &[Value],
    server_order: &[Value],
    key: Option<&str>,
) -> Vec<Value> {
    let rank = |order: &[Value], v: &Value| index_of(order, v, key).unwrap_or(usize::MAX);
    patch_items.sort_by_key(|v| rank(patch_order, v));
    server_only.sort_by_key(|v| rank(server_order, v));
    merge_sorted(server_only, patch_items, server_order, key)
}

/// Upstream's `mergeSortedSlice`: insert each `left` item before the first `right` item that
/// comes after it in the live order.
fn merge_sorted(left: Vec<Value>, right: Vec<Value>, server_order: &[Value], key: Option<&str>) -> Vec<Value> {
    let mut out = Vec::with_capacity(left.len() + right.len());
    let mut l = left.into_iter().peekable();
    let mut r = right.into_iter().peekable();
    loop {
        match (l.peek(), r.peek()) {
            (None, None) => break,
            (Some(_), None) => out.extend(l.next()),
            (None, Some(_)) => out.extend(r.next()),
            (Some(lv), Some(rv)) => {
                let li = index_of(server_order, lv, key);
                let ri = index_of(server_order, rv, key);
                match (li, ri) {
                    (Some(a), Some(b)) if a < b => out.extend(l.next()),
                    _ => out.extend(r.next()),
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const POD: &str = "io.k8s.api.core.v1.Pod";
    const NODE: &str = "io.k8s.api.core.v1.Node";
    const DEPLOYMENT: &str = "io.k8s.api.apps.v1.Deployment";
    const DAEMONSET: &str = "io.k8s.api.apps.v1.DaemonSet";

    fn smp(original: Value, patch: Value, def: &str) -> Value {
        strategic_merge(&original, &patch, def).expect("patch applies")
    }

    fn deployment() -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "labels": {"app": "web"}},
            "spec": {
                "replicas": 1,
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {
                        "containers": [
                            {"name": "nginx", "image": "nginx:1.24", "ports": [{"containerPort": 80, "protocol": "TCP"}],
                             "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
                            {"name": "sidecar", "image": "busybox"}
                        ],
                        "volumes": [{"name": "data", "emptyDir": {}}]
                    }
                }
            }
        })
    }

    #[test]
    fn cordon_and_uncordon() {
        let node = json!({"metadata": {"name": "n1"}, "spec": {"podCIDR": "10.0.0.0/24"}});
        let cordoned = smp(node.clone(), json!({"spec": {"unschedulable": true}}), NODE);
        assert_eq!(
            cordoned["spec"],
            json!({"podCIDR": "10.0.0.0/24", "unschedulable": true})
        );
        let uncordoned = smp(cordoned, json!({"spec": {"unschedulable": null}}), NODE);
        assert_eq!(uncordoned, node);
    }

    #[test]
    fn label_removal_with_null() {
        let pod = json!({"metadata": {"name": "p", "labels": {"k": "v", "a": "b"}}});
        let out = smp(pod, json!({"metadata": {"labels": {"k": null}}}), POD);
        assert_eq!(out["metadata"]["labels"], json!({"a": "b"}));
    }

    #[test]
    fn taints_are_replaced() {
        let node = json!({"spec": {"taints": [
            {"key": "a", "effect": "NoSchedule"},
            {"key": "b", "value": "1", "effect": "NoExecute"}
        ]}});
        let out = smp(
            node.clone(),
            json!({"spec": {"taints": [{"key": "c", "effect": "NoSchedule"}]}}),
            NODE,
        );
        assert_eq!(out["spec"]["taints"], json!([{"key": "c", "effect": "NoSchedule"}]));
        let out = smp(node, json!({"spec": {"taints": null}}), NODE);
        assert_eq!(out["spec"], json!({}));
    }

    #[test]
    fn kubectl_apply_image_change_with_set_element_order() {
        let patch = json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "nginx"}, {"name": "sidecar"}],
            "containers": [{"image": "nginx:1.25", "name": "nginx"}]
        }}}});
        let out = smp(deployment(), patch, DEPLOYMENT);
        let containers = &out["spec"]["template"]["spec"]["containers"];
        assert_eq!(containers.as_array().map(Vec::len), Some(2));
        assert_eq!(containers[0]["name"], "nginx");
        assert_eq!(containers[0]["image"], "nginx:1.25");
        // The rest of the container is kept.
        assert_eq!(
            containers[0]["ports"],
            json!([{"containerPort": 80, "protocol": "TCP"}])
        );
        assert_eq!(containers[1], json!({"name": "sidecar", "image": "busybox"}));
        // No directive leaks into the object.
        assert!(!out.to_string().contains('$'));
    }

    #[test]
    fn set_element_order_reorders() {
        let patch = json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "sidecar"}, {"name": "nginx"}]
        }}}});
        let out = smp(deployment(), patch, DEPLOYMENT);
        let names: Vec<&str> = out["spec"]["template"]["spec"]["containers"]
            .as_array()
            .expect("list")
            .iter()
            .filter_map(|c| c["name"].as_str())
            .collect();
        assert_eq!(names, ["sidecar", "nginx"]);
    }

    #[test]
    fn env_merges_by_name() {
        let patch = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "nginx", "env": [{"name": "B", "value": "20"}, {"name": "C", "value": "3"}, {"name": "A", "$patch": "delete"}]}
        ]}}}});
        let out = smp(deployment(), patch, DEPLOYMENT);
        let env = &out["spec"]["template"]["spec"]["containers"][0]["env"];
        assert_eq!(env, &json!([{"name": "B", "value": "20"}, {"name": "C", "value": "3"}]));
    }

    #[test]
    fn container_delete_directive_and_addition() {
        let patch = json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "nginx"}, {"name": "logger"}],
            "containers": [{"name": "sidecar", "$patch": "delete"}, {"name": "logger", "image": "fluentd"}]
        }}}});
        let out = smp(deployment(), patch, DEPLOYMENT);
        let names: Vec<&str> = out["spec"]["template"]["spec"]["containers"]
            .as_array()
            .expect("list")
            .iter()
            .filter_map(|c| c["name"].as_str())
            .collect();
        assert_eq!(names, ["nginx", "logger"]);
    }

    #[test]
    fn daemonset_rollout_undo_replaces_template() {
        let ds = json!({
            "metadata": {"name": "ds"},
            "spec": {"selector": {"matchLabels": {"app": "d"}}, "template": {
                "metadata": {"labels": {"app": "d"}, "annotations": {"x": "1"}},
                "spec": {"containers": [{"name": "c", "image": "v2", "args": ["--new"]}], "nodeSelector": {"a": "b"}}
            }}
        });
        let patch = json!({"spec": {"template": {
            "$patch": "replace",
            "metadata": {"labels": {"app": "d"}},
            "spec": {"containers": [{"name": "c", "image": "v1"}]}
        }}});
        let out = smp(ds, patch, DAEMONSET);
        assert_eq!(
            out["spec"]["template"],
            json!({"metadata": {"labels": {"app": "d"}}, "spec": {"containers": [{"name": "c", "image": "v1"}]}})
        );
        assert_eq!(out["spec"]["selector"], json!({"matchLabels": {"app": "d"}}));
    }

    #[test]
    fn list_replace_directive() {
        let patch = json!({"spec": {"template": {"spec": {"containers": [
            {"$patch": "replace"}, {"name": "only", "image": "x"}
        ]}}}});
        let out = smp(deployment(), patch, DEPLOYMENT);
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"],
            json!([{"name": "only", "image": "x"}])
        );
    }

    #[test]
    fn map_delete_directive() {
        let patch = json!({"spec": {"strategy": {"rollingUpdate": {"$patch": "delete"}}}});
        let out = smp(deployment(), patch, DEPLOYMENT);
        assert_eq!(
            out["spec"]["strategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {}})
        );
    }

    #[test]
    fn retain_keys_clears_other_union_members() {
        let patch = json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate", "rollingUpdate": null}}});
        let out = smp(deployment(), patch, DEPLOYMENT);
        assert_eq!(out["spec"]["strategy"], json!({"type": "Recreate"}));
        // Volumes: merge,retainKeys. Changing the source of a volume.
        let patch = json!({"spec": {"template": {"spec": {"volumes": [
            {"name": "data", "$retainKeys": ["name", "hostPath"], "hostPath": {"path": "/d"}}
        ]}}}});
        let out = smp(deployment(), patch, DEPLOYMENT);
        assert_eq!(
            out["spec"]["template"]["spec"]["volumes"],
            json!([{"name": "data", "hostPath": {"path": "/d"}}])
        );
    }

    #[test]
    fn primitive_lists() {
        let pod = json!({"metadata": {"finalizers": ["a", "b"]}, "spec": {"containers": [{"name": "c", "args": ["x", "y"]}]}});
        // finalizers: strategy merge, union.
        let out = smp(pod.clone(), json!({"metadata": {"finalizers": ["c", "a"]}}), POD);
        assert_eq!(out["metadata"]["finalizers"], json!(["c", "a", "b"]));
        // $deleteFromPrimitiveList removes values.
        let out = smp(
            pod.clone(),
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
            POD,
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["b"]));
        // With order and a new value.
        let out = smp(
            pod.clone(),
            json!({"metadata": {"$setElementOrder/finalizers": ["b", "z"], "$deleteFromPrimitiveList/finalizers": ["a"], "finalizers": ["z"]}}),
            POD,
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["b", "z"]));
        // args: no strategy, replaced.
        let out = smp(
            pod,
            json!({"spec": {"containers": [{"name": "c", "args": ["z"]}]}}),
            POD,
        );
        assert_eq!(out["spec"]["containers"][0]["args"], json!(["z"]));
    }

    #[test]
    fn ports_merge_by_container_port() {
        let patch = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "nginx", "ports": [{"containerPort": 443}]}
        ]}}}});
        let out = smp(deployment(), patch, DEPLOYMENT);
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"][0]["ports"],
            // As upstream: patch items whose place in the live list is unknown come first.
            json!([{"containerPort": 443}, {"containerPort": 80, "protocol": "TCP"}])
        );
    }

    #[test]
    fn new_fields_drop_nulls_and_directives() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {}});
        let patch = json!({"metadata": {"annotations": {"a": "1", "b": null}}, "spec": {"containers": [
            {"name": "a", "image": "x"}, {"name": "gone", "$patch": "delete"}
        ]}});
        let out = smp(pod, patch, POD);
        assert_eq!(out["metadata"]["annotations"], json!({"a": "1"}));
        assert_eq!(out["spec"]["containers"], json!([{"name": "a", "image": "x"}]));
    }

    #[test]
    fn conditions_merge_by_type() {
        let node = json!({"status": {"conditions": [
            {"type": "Ready", "status": "False"}, {"type": "MemoryPressure", "status": "False"}
        ], "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}});
        let out = smp(
            node,
            json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
            NODE,
        );
        assert_eq!(
            out["status"]["conditions"][0],
            json!({"type": "Ready", "status": "True"})
        );
        assert_eq!(out["status"]["conditions"][1]["type"], "MemoryPressure");
        assert_eq!(out["status"]["addresses"][0]["address"], "10.0.0.1");
    }

    #[test]
    fn rollout_restart_annotation() {
        let patch = json!({"spec": {"template": {"metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": "2025-01-01T00:00:00Z"}}}}});
        let out = smp(deployment(), patch, DEPLOYMENT);
        assert_eq!(
            out["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"],
            "2025-01-01T00:00:00Z"
        );
        assert_eq!(out["spec"]["template"]["metadata"]["labels"]["app"], "web");
    }

    /// A schema in the shape of upstream's test type: merging and non-merging lists of
    /// items and of integers, a map, a retainKeys struct and a retainKeys merging list.
    fn item_schema(depth: usize) -> Value {
        let item = if depth == 0 {
            json!({"type": "object", "properties": {"name": {"type": "string"}}})
        } else {
            item_schema(depth - 1)
        };
        let scalar = json!({"type": "string"});
        let retain = json!({
            "x-kubernetes-patch-strategy": "retainKeys",
            "type": "object",
            "properties": {
                "name": scalar, "value": scalar, "other": scalar,
                "simpleMap": {"type": "object", "additionalProperties": scalar},
                "mergingIntList": {"type": "array", "items": {"type": "integer"}, "x-kubernetes-patch-strategy": "merge"},
                "mergingList": {"type": "array", "items": item, "x-kubernetes-patch-strategy": "merge", "x-kubernetes-patch-merge-key": "name"}
            }
        });
        json!({
            "type": "object",
            "properties": {
                "name": scalar, "value": scalar, "other": scalar,
                "mergingList": {"type": "array", "items": item, "x-kubernetes-patch-strategy": "merge", "x-kubernetes-patch-merge-key": "name"},
                "nonMergingList": {"type": "array", "items": item},
                "mergingIntList": {"type": "array", "items": {"type": "integer"}, "x-kubernetes-patch-strategy": "merge"},
                "nonMergingIntList": {"type": "array", "items": {"type": "integer"}},
                "simpleMap": {"type": "object", "additionalProperties": scalar},
                "retainKeysMap": retain,
                "retainKeysMergingList": {"type": "array", "items": item, "x-kubernetes-patch-strategy": "merge,retainKeys", "x-kubernetes-patch-merge-key": "name"}
            }
        })
    }

    fn item_ty() -> Ty {
        static SCHEMA: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
        Ty::inline(SCHEMA.get_or_init(|| item_schema(2)))
    }

    /// (description, current, patch, result) in the spirit of upstream's table tests.
    #[test]
    fn upstream_style_cases() {
        let cases = [
            (
                "add field to map",
                json!({"name": "1", "other": "a"}),
                json!({"value": "1"}),
                json!({"name": "1", "other": "a", "value": "1"}),
            ),
            (
                "delete and add",
                json!({"name": "1", "other": "a"}),
                json!({"name": null, "value": "1"}),
                json!({"other": "a", "value": "1"}),
            ),
            (
                "delete from nested map",
                json!({"simpleMap": {"key1": "1", "key2": "1", "other": "a"}}),
                json!({"simpleMap": {"key2": null}}),
                json!({"simpleMap": {"key1": "1", "other": "a"}}),
            ),
            (
                "null for an absent field",
                json!({"name": "a", "other": "a"}),
                json!({"name": "1", "value": "1", "other": null}),
                json!({"name": "1", "value": "1"}),
            ),
            (
                "replace list of scalars",
                json!({"nonMergingIntList": [1, 4]}),
                json!({"nonMergingIntList": [2, 3]}),
                json!({"nonMergingIntList": [2, 3]}),
            ),
            (
                "unique scalars",
                json!({"mergingIntList": [1, 2]}),
                json!({"mergingIntList": [2, 3]}),
                json!({"mergingIntList": [1, 2, 3]}),
            ),
            (
                "patch order of scalars",
                json!({"mergingIntList": [1, 2, 3]}),
                json!({"mergingIntList": [3, 1, 2]}),
                json!({"mergingIntList": [3, 1, 2]}),
            ),
            (
                "patch order of scalars 2",
                json!({"mergingIntList": [1, 2, 3]}),
                json!({"mergingIntList": [3, 1]}),
                json!({"mergingIntList": [2, 3, 1]}),
            ),
            (
                "delete all maps",
                json!({"mergingList": [{"name": "1", "other": "a"}, {"name": "2"}]}),
                json!({"mergingList": [{"name": "1", "$patch": "delete"}, {"name": "2", "$patch": "delete"}]}),
                json!({"mergingList": []}),
            ),
            (
                "delete all duplicates",
                json!({"mergingList": [{"name": "1"}, {"name": "1"}, {"name": "2"}]}),
                json!({"mergingList": [{"name": "1", "$patch": "delete"}]}),
                json!({"mergingList": [{"name": "2"}]}),
            ),
            (
                "replace merging list",
                json!({"mergingList": [{"name": "1"}, {"name": "2"}]}),
                json!({"mergingList": [{"$patch": "replace"}]}),
                json!({"mergingList": []}),
            ),
            (
                "replace whole map",
                json!({"name": "1", "value": "1"}),
                json!({"$patch": "replace", "other": "a"}),
                json!({"other": "a"}),
            ),
            (
                "patch order of maps",
                json!({"mergingList": [{"name": "1"}, {"name": "2", "value": "b"}, {"name": "3"}]}),
                json!({"mergingList": [{"name": "3", "value": "c"}, {"name": "1", "value": "a"}, {"name": "2", "other": "x"}]}),
                json!({"mergingList": [{"name": "3", "value": "c"}, {"name": "1", "value": "a"}, {"name": "2", "value": "b", "other": "x"}]}),
            ),
            (
                "patch order of maps 2",
                json!({"mergingList": [{"name": "1"}, {"name": "2", "value": "b"}, {"name": "3"}]}),
                json!({"mergingList": [{"name": "3", "value": "c"}, {"name": "1", "value": "a"}]}),
                json!({"mergingList": [{"name": "2", "value": "b"}, {"name": "3", "value": "c"}, {"name": "1", "value": "a"}]}),
            ),
            (
                "order names an absent item",
                json!({"mergingList": [{"name": "1"}, {"name": "3"}]}),
                json!({"$setElementOrder/mergingList": [{"name": "3"}, {"name": "2"}, {"name": "1"}], "mergingList": [{"name": "3", "value": "3"}, {"name": "1", "value": "1"}]}),
                json!({"mergingList": [{"name": "3", "value": "3"}, {"name": "1", "value": "1"}]}),
            ),
            (
                "order of ints alone",
                json!({"mergingIntList": [1, 3]}),
                json!({"$setElementOrder/mergingIntList": [3, 2, 1]}),
                json!({"mergingIntList": [3, 1]}),
            ),
            (
                "delete from primitive list",
                json!({"mergingIntList": [1, 2, 3, 3, 4]}),
                json!({"$setElementOrder/mergingIntList": [1, 2], "$deleteFromPrimitiveList/mergingIntList": [3]}),
                json!({"mergingIntList": [1, 2, 4]}),
            ),
            (
                "merge maps with order",
                json!({"mergingList": [{"name": "1", "other": "a"}, {"name": "2", "value": "2", "other": "b"}]}),
                json!({"$setElementOrder/mergingList": [{"name": "4"}, {"name": "1"}, {"name": "2"}, {"name": "3"}], "mergingList": [{"name": "4", "value": "4"}, {"name": "3", "value": "3"}]}),
                json!({"mergingList": [{"name": "4", "value": "4"}, {"name": "1", "other": "a"}, {"name": "2", "value": "2", "other": "b"}, {"name": "3", "value": "3"}]}),
            ),
            (
                "nested merging list",
                json!({"mergingList": [{"name": "1", "mergingList": [{"name": "a"}, {"name": "b"}]}]}),
                json!({"mergingList": [{"name": "1", "mergingList": [{"name": "c"}, {"name": "a", "$patch": "delete"}]}]}),
                json!({"mergingList": [{"name": "1", "mergingList": [{"name": "c"}, {"name": "b"}]}]}),
            ),
            (
                "retainKeys map without directive",
                json!({"retainKeysMap": {"name": "foo", "value": "a"}}),
                json!({"retainKeysMap": {"value": "b"}}),
                json!({"retainKeysMap": {"name": "foo", "value": "b"}}),
            ),
            (
                "retainKeys map with directive",
                json!({"retainKeysMap": {"name": "foo", "value": "a", "other": "x"}}),
                json!({"retainKeysMap": {"$retainKeys": ["name", "simpleMap"], "simpleMap": {"k": "v"}}}),
                json!({"retainKeysMap": {"name": "foo", "simpleMap": {"k": "v"}}}),
            ),
            (
                "retainKeys list item",
                json!({"retainKeysMergingList": [{"name": "bar"}, {"name": "foo", "value": "a"}]}),
                json!({"retainKeysMergingList": [{"name": "foo", "$retainKeys": ["name", "other"], "other": "b"}]}),
                json!({"retainKeysMergingList": [{"name": "bar"}, {"name": "foo", "other": "b"}]}),
            ),
        ];
        for (desc, current, patch, want) in cases {
            let got = merge_typed(&current, &patch, item_ty()).unwrap_or_else(|e| panic!("{desc}: {e}"));
            assert_eq!(got, want, "{desc}");
        }
    }

    #[test]
    fn upstream_style_errors() {
        let cases = [
            (
                "order mismatch",
                json!({"mergingList": [{"name": "1"}, {"name": "3"}, {"name": "2"}]}),
                json!({"$setElementOrder/mergingList": [{"name": "1"}, {"name": "2"}, {"name": "3"}], "mergingList": [{"name": "3", "value": "3"}, {"name": "1", "value": "1"}]}),
                "doesn't match",
            ),
            (
                "int order mismatch",
                json!({"mergingIntList": [1, 3, 2]}),
                json!({"$setElementOrder/mergingIntList": [1, 2, 3], "mergingIntList": [3, 1]}),
                "doesn't match",
            ),
            (
                "missing merge key",
                json!({"mergingList": [{"name": "1", "value": "a"}]}),
                json!({"mergingList": [{"value": "b"}]}),
                "does not contain declared merge key",
            ),
            (
                "list of lists",
                json!({"mergingIntList": [1]}),
                json!({"mergingIntList": [[2]]}),
                "lists of lists",
            ),
        ];
        for (desc, current, patch, want) in cases {
            let err = merge_typed(&current, &patch, item_ty()).expect_err(desc);
            assert!(err.to_string().contains(want), "{desc}: {err}");
            assert_eq!(err.code(), 400, "{desc}");
        }
    }

    #[test]
    fn set_element_order_must_match_the_patch() {
        let patch = json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "nginx"}],
            "containers": [{"name": "other", "image": "x"}]
        }}}});
        let err = strategic_merge(&deployment(), &patch, DEPLOYMENT).expect_err("mismatch");
        assert_eq!(err.code(), 400);
        assert!(
            err.to_string().contains("doesn't match $setElementOrder/ list"),
            "{err}"
        );
    }

    #[test]
    fn retain_keys_must_cover_the_patch() {
        let patch = json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate", "rollingUpdate": {"maxSurge": 1}}}});
        let err = strategic_merge(&deployment(), &patch, DEPLOYMENT).expect_err("outside");
        assert_eq!(err, PatchError::BadRequest("invalid patch format of retainKeys".into()));
    }

    #[test]
    fn patch_list_over_null_drops_directives() {
        let pod = json!({"spec": {"containers": null, "nodeName": "n"}});
        let patch = json!({"spec": {"containers": [{"name": "a"}, {"name": "b", "$patch": "delete"}], "nodeName": {"$patch": "delete"}}});
        let out = smp(pod, patch, POD);
        assert_eq!(out["spec"], json!({"containers": [{"name": "a"}]}));
    }

    #[test]
    fn service_ports_and_owner_references() {
        let svc = json!({"spec": {"ports": [
            {"name": "http", "port": 80, "protocol": "TCP", "targetPort": 80},
            {"name": "https", "port": 443, "protocol": "TCP", "targetPort": 443}
        ]}});
        let patch = json!({"spec": {
            "$setElementOrder/ports": [{"port": 80}, {"port": 443}],
            "ports": [{"port": 80, "targetPort": 8080}]
        }});
        let out = smp(svc, patch, "io.k8s.api.core.v1.Service");
        assert_eq!(
            out["spec"]["ports"][0],
            json!({"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080})
        );
        assert_eq!(out["spec"]["ports"][1]["port"], 443);

        let rs = json!({"metadata": {"ownerReferences": [{"uid": "a", "name": "d1", "controller": true}]}});
        let patch =
            json!({"metadata": {"ownerReferences": [{"uid": "a", "controller": null}, {"uid": "b", "name": "d2"}]}});
        let out = smp(rs, patch, "io.k8s.api.apps.v1.ReplicaSet");
        assert_eq!(
            out["metadata"]["ownerReferences"],
            json!([{"uid": "a", "name": "d1"}, {"uid": "b", "name": "d2"}])
        );
    }

    #[test]
    fn errors() {
        let err = strategic_merge(&deployment(), &json!([1]), DEPLOYMENT).expect_err("not a map");
        assert_eq!(err.code(), 400);
        let err = strategic_merge(&deployment(), &json!({"spec": {"$patch": "frob"}}), DEPLOYMENT)
            .expect_err("bad directive");
        assert_eq!(err.code(), 400);
        let err = strategic_merge(
            &deployment(),
            &json!({"spec": {"template": {"spec": {"containers": [{"image": "no-name"}]}}}}),
            DEPLOYMENT,
        )
        .expect_err("missing merge key");
        assert!(
            err.to_string().contains("does not contain declared merge key: name"),
            "{err}"
        );
    }

    #[test]
    fn upstream_merge_order_cases() {
        // From upstream's tests: patch order wins for patched items, server-only items keep
        // their place relative to the live list.
        let pod = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}, {"name": "d"}]}});
        let out = smp(
            pod,
            json!({"spec": {"containers": [{"name": "d", "image": "x"}, {"name": "b", "image": "y"}]}}),
            POD,
        );
        let names: Vec<&str> = out["spec"]["containers"]
            .as_array()
            .expect("list")
            .iter()
            .filter_map(|c| c["name"].as_str())
            .collect();
        assert_eq!(names, ["a", "c", "d", "b"]);
    }
}
