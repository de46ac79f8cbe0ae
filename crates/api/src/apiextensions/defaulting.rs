//! Defaulting of custom objects from their schema's `default`s (upstream's
//! `structuraldefaulting.Default`): a property missing from an object that is present gets
//! its default, then the defaulted value is walked in turn.

use serde_json::Value;

use super::schema::Schema;

/// Apply the defaults of `schema` (the root of `openAPIV3Schema`) to `obj`.
pub fn apply(schema: &Schema, obj: &mut Value) {
    walk(schema, obj);
}

fn walk(s: &Schema, v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, ps) in &s.properties {
                if let Some(d) = &ps.default {
                    let missing = match m.get(k) {
                        None => true,
                        // A null for a non-nullable field with a default takes the default.
                        Some(Value::Null) => !ps.nullable,
                        Some(_) => false,
                    };
                    if missing {
                        m.insert(k.clone(), d.clone());
                    }
                }
            }
            for (k, child) in m.iter_mut() {
                if let Some(cs) = s.property(k) {
                    walk(cs, child);
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = &s.items {
                for item in items.iter_mut() {
                    walk(is, item);
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
    fn missing_fields_take_their_defaults_at_every_level() {
        let s = Schema::parse(&json!({
            "type": "object",
            "properties": {
                "spec": {"type": "object", "default": {}, "properties": {
                    "replicas": {"type": "integer", "default": 1},
                    "mode": {"type": "string", "default": "fast"},
                    "items": {"type": "array", "items": {"type": "object", "properties": {
                        "weight": {"type": "integer", "default": 10}
                    }}},
                }},
            }
        }));
        let mut obj = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {}});
        apply(&s, &mut obj);
        assert_eq!(obj["spec"], json!({"replicas": 1, "mode": "fast"}));
        let mut obj = json!({"spec": {"replicas": 3, "mode": null, "items": [{}, {"weight": 2}]}});
        apply(&s, &mut obj);
        assert_eq!(
            obj["spec"],
            json!({"replicas": 3, "mode": "fast", "items": [{"weight": 10}, {"weight": 2}]})
        );
    }
}
