//! Objects as upstream's Go encoder writes them: every field its types always write (a field
//! without `omitempty`, or of a struct type) is present, with what Go writes when it is unset
//! (`{}`, `null`, `""`, `0`, `false`). The fields are upstream's, generated into
//! [`crate::go_emitted`]; the object's parts are found through the OpenAPI definitions.

use std::collections::HashMap;
use std::sync::OnceLock;

use serde_json::{Map, Value, json};

use crate::go_emitted::{ALWAYS_WRITTEN, Zero};
use crate::registry::Resource;

fn index() -> &'static HashMap<&'static str, &'static [(&'static str, Zero)]> {
    static INDEX: OnceLock<HashMap<&'static str, &'static [(&'static str, Zero)]>> = OnceLock::new();
    INDEX.get_or_init(|| ALWAYS_WRITTEN.iter().map(|(d, f)| (*d, *f)).collect())
}

/// Add to `obj` (an object of `res`) every field upstream always writes that it lacks, in it
/// and in each of its parts.
pub fn fill(res: &Resource, obj: &mut Value) {
    if let Some(def) = crate::schema::definition_for(res.group, res.version, res.kind) {
        fill_definition(def, obj);
    }
}

fn zero(z: Zero) -> Value {
    match z {
        Zero::Object => json!({}),
        Zero::Null => Value::Null,
        Zero::EmptyString => json!(""),
        Zero::Zero => json!(0),
        Zero::False => json!(false),
        Zero::ZeroQuantity => json!("0"),
        Zero::ZeroDuration => json!("0s"),
    }
}

fn fill_definition(def: &str, v: &mut Value) {
    let Value::Object(m) = v else { return };
    if let Some(fields) = index().get(def) {
        for (field, z) in *fields {
            if !m.contains_key(*field) {
                m.insert((*field).to_string(), zero(*z));
            }
        }
    }
    let Some(props) = crate::schema::definitions()
        .get(def)
        .and_then(|d| d.get("properties"))
        .and_then(Value::as_object)
    else {
        return;
    };
    fill_parts(props, m);
}

/// Descend into the parts of `m` whose schema names a definition: fields, list items, map values.
fn fill_parts(props: &'static Map<String, Value>, m: &mut Map<String, Value>) {
    for (k, child) in m.iter_mut() {
        let Some(schema) = props.get(k) else { continue };
        if let Some((name, _)) = crate::schema::resolve(schema) {
            fill_definition(name, child);
        } else if let Some((name, _)) = schema.get("items").and_then(crate::schema::resolve) {
            for item in child.as_array_mut().into_iter().flatten() {
                fill_definition(name, item);
            }
        } else if let Some((name, _)) = schema.get("additionalProperties").and_then(crate::schema::resolve) {
            for value in child.as_object_mut().into_iter().flat_map(|o| o.values_mut()) {
                fill_definition(name, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deployment_gets_what_go_writes() {
        let res = crate::registry::lookup("apps", "v1", "deployments").expect("deployments");
        let mut d = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"selector": {}, "template": {"metadata": {"labels": {"a": "b"}},
                "spec": {"containers": [{"name": "c", "image": "i"}]}}}
        });
        fill(res, &mut d);
        assert_eq!(d["status"], json!({}));
        assert_eq!(d["metadata"]["creationTimestamp"], "2026-01-01T00:00:00Z");
        assert_eq!(d["spec"]["template"]["metadata"]["creationTimestamp"], Value::Null);
        assert!(d["spec"]["template"]["metadata"].get("creationTimestamp").is_some());
        assert_eq!(d["spec"]["template"]["spec"]["containers"][0]["resources"], json!({}));
    }

    #[test]
    fn a_service_status_has_its_load_balancer() {
        let res = crate::registry::lookup("", "v1", "services").expect("services");
        let mut s = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {}});
        fill(res, &mut s);
        assert_eq!(s["status"], json!({"loadBalancer": {}}));
    }
}
