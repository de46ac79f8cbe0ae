//! Pruning: fields a structural schema does not specify are dropped from custom objects
//! (upstream's `pruning.PruneWithOptions`), unless a node says
//! `x-kubernetes-preserve-unknown-fields`. The paths dropped are returned: they are the
//! `unknown field "PATH"` of strict field validation.

use serde_json::Value;

use super::schema::Schema;

/// Prune `obj` (a whole object) under its version's schema; returns the dropped paths.
pub fn prune(schema: &Schema, obj: &mut Value) -> Vec<String> {
    let mut dropped = Vec::new();
    let Some(m) = obj.as_object_mut() else {
        return dropped;
    };
    let keys: Vec<String> = m.keys().cloned().collect();
    for k in keys {
        // The API machinery's own fields stay at the root of a resource.
        if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        match schema.property(&k) {
            Some(s) => {
                if let Some(child) = m.get_mut(&k) {
                    walk(s, child, &k, &mut dropped);
                }
            }
            None if schema.preserve_unknown_fields || schema.additional_properties_allowed => {}
            None => {
                m.remove(&k);
                dropped.push(k);
            }
        }
    }
    dropped.sort();
    dropped
}

fn walk(s: &Schema, v: &mut Value, path: &str, dropped: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                if s.embedded_resource && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                let child_path = format!("{path}.{k}");
                match s.property(&k) {
                    Some(cs) => {
                        if let Some(child) = m.get_mut(&k) {
                            walk(cs, child, &child_path, dropped);
                        }
                    }
                    None if s.preserve_unknown_fields || s.additional_properties_allowed => {}
                    None => {
                        m.remove(&k);
                        dropped.push(child_path);
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = &s.items {
                for (i, item) in items.iter_mut().enumerate() {
                    walk(is, item, &format!("{path}[{i}]"), dropped);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_fields_go_unless_preserved() {
        let s = Schema::parse(&json!({
            "type": "object",
            "properties": {
                "spec": {"type": "object", "properties": {
                    "a": {"type": "string"},
                    "list": {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "integer"}}}},
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "template": {"type": "object", "x-kubernetes-embedded-resource": true, "properties": {"spec": {"type": "object"}}},
                }},
            }
        }));
        let mut obj = json!({
            "apiVersion": "x/v1", "kind": "K", "metadata": {"name": "n"},
            "spec": {
                "a": "1", "b": 2,
                "list": [{"x": 1, "y": 2}],
                "free": {"anything": {"goes": true}},
                "labels": {"k": "v"},
                "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}, "junk": 1},
            },
            "extra": true,
        });
        let dropped = prune(&s, &mut obj);
        assert_eq!(dropped, ["extra", "spec.b", "spec.list[0].y", "spec.template.junk"]);
        assert_eq!(
            obj,
            json!({
                "apiVersion": "x/v1", "kind": "K", "metadata": {"name": "n"},
                "spec": {
                    "a": "1",
                    "list": [{"x": 1}],
                    "free": {"anything": {"goes": true}},
                    "labels": {"k": "v"},
                    "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}},
                },
            })
        );
    }
}
