//! JSON merge patch (RFC 7386): objects merge key by key, `null` removes a key, anything
//! else (arrays included) replaces.

use serde_json::{Map, Value};

use super::PatchError;

/// Apply a merge patch to `original`. The patch must be a JSON object (an API object's
/// patch always is); anything else is a 400, as upstream answers.
pub fn merge_patch(original: &Value, patch: &Value) -> Result<Value, PatchError> {
    if !patch.is_object() {
        return Err(PatchError::BadRequest("Invalid JSON Patch".to_string()));
    }
    Ok(merge_value(original, patch))
}

/// RFC 7386 `MergePatch(Target, Patch)` for any JSON values.
pub fn merge_value(target: &Value, patch: &Value) -> Value {
    let Value::Object(p) = patch else {
        return patch.clone();
    };
    let mut out = match target {
        Value::Object(t) => t.clone(),
        _ => Map::new(),
    };
    for (k, v) in p {
        if v.is_null() {
            out.shift_remove(k);
        } else {
            let merged = merge_value(out.get(k).unwrap_or(&Value::Null), v);
            out.insert(k.clone(), merged);
        }
    }
    Value::Object(out)
}

/// The merge patch that turns `original` into `modified` (the inverse of [`merge_value`]
/// for objects): changed keys with their new value, removed keys as `null`.
pub fn create_merge_patch(original: &Value, modified: &Value) -> Value {
    match (original, modified) {
        (Value::Object(o), Value::Object(m)) => {
            let mut out = Map::new();
            for (k, ov) in o {
                match m.get(k) {
                    None => {
                        out.insert(k.clone(), Value::Null);
                    }
                    Some(mv) if mv != ov => {
                        let d = if ov.is_object() && mv.is_object() {
                            create_merge_patch(ov, mv)
                        } else {
                            mv.clone()
                        };
                        out.insert(k.clone(), d);
                    }
                    Some(_) => {}
                }
            }
            for (k, mv) in m {
                if !o.contains_key(k) {
                    out.insert(k.clone(), mv.clone());
                }
            }
            Value::Object(out)
        }
        _ => modified.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rfc7386_appendix_a() {
        let cases = [
            (json!({"a": "b"}), json!({"a": "c"}), json!({"a": "c"})),
            (json!({"a": "b"}), json!({"b": "c"}), json!({"a": "b", "b": "c"})),
            (json!({"a": "b"}), json!({"a": null}), json!({})),
            (json!({"a": "b", "b": "c"}), json!({"a": null}), json!({"b": "c"})),
            (json!({"a": ["b"]}), json!({"a": "c"}), json!({"a": "c"})),
            (json!({"a": "c"}), json!({"a": ["b"]}), json!({"a": ["b"]})),
            (
                json!({"a": {"b": "c"}}),
                json!({"a": {"b": "d", "c": null}}),
                json!({"a": {"b": "d"}}),
            ),
            (json!({"a": [{"b": "c"}]}), json!({"a": [1]}), json!({"a": [1]})),
            (json!({"e": null}), json!({"a": 1}), json!({"e": null, "a": 1})),
            (json!([1, 2]), json!({"a": "b", "c": null}), json!({"a": "b"})),
            (json!({}), json!({"a": {"bb": {"ccc": null}}}), json!({"a": {"bb": {}}})),
        ];
        for (target, patch, want) in cases {
            assert_eq!(merge_patch(&target, &patch).expect("merge"), want, "{target} + {patch}");
        }
        assert_eq!(merge_value(&json!({"a": "b"}), &json!(["c"])), json!(["c"]));
    }

    #[test]
    fn kubectl_label_patches() {
        let obj = json!({"metadata": {"name": "n", "labels": {"k": "v", "x": "y"}}});
        let out = merge_patch(&obj, &json!({"metadata": {"labels": {"k": null}}})).expect("unlabel");
        assert_eq!(out, json!({"metadata": {"name": "n", "labels": {"x": "y"}}}));
        let out = merge_patch(&obj, &json!({"metadata": {"labels": {"new": "1"}}})).expect("label");
        assert_eq!(out["metadata"]["labels"], json!({"k": "v", "x": "y", "new": "1"}));
        assert_eq!(merge_patch(&obj, &json!([1])).expect_err("array").code(), 400);
    }

    #[test]
    fn scale_patch() {
        let scale = json!({"kind": "Scale", "spec": {"replicas": 1}, "status": {"replicas": 1}});
        let out = merge_patch(&scale, &json!({"spec": {"replicas": 4}})).expect("scale");
        assert_eq!(out["spec"]["replicas"], 4);
        assert_eq!(out["status"]["replicas"], 1);
    }

    #[test]
    fn create_then_apply_round_trips() {
        let a = json!({"a": 1, "b": {"c": 2, "d": 3}, "e": [1]});
        let b = json!({"a": 1, "b": {"c": 5}, "e": [2], "f": "new"});
        let p = create_merge_patch(&a, &b);
        assert_eq!(p, json!({"b": {"c": 5, "d": null}, "e": [2], "f": "new"}));
        assert_eq!(merge_patch(&a, &p).expect("apply"), b);
    }
}
