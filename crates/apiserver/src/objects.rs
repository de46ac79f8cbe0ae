//! Objects as the server stores them: JSON with `metadata.resourceVersion` left out (the store's
//! revision is the resourceVersion, spliced in when an object leaves the server), under keys
//! `/registry/<plural[.group]>/<namespace>/<name>`.

use serde_json::{Map, Value};
use skiff_api::Resource;
use skiff_store::{KeyValue, Revision};

/// The key prefix of a resource, optionally within one namespace.
pub fn prefix(res: &Resource, namespace: &str) -> String {
    if res.namespaced && !namespace.is_empty() {
        format!("/registry/{}/{}/", res.qualified_plural(), namespace)
    } else {
        format!("/registry/{}/", res.qualified_plural())
    }
}

/// The key of one object.
pub fn key(res: &Resource, namespace: &str, name: &str) -> String {
    if res.namespaced {
        format!("/registry/{}/{}/{}", res.qualified_plural(), namespace, name)
    } else {
        format!("/registry/{}/{}", res.qualified_plural(), name)
    }
}

/// The stored bytes with `"resourceVersion":"N"` inserted into the top-level metadata.
/// Stored objects are serialized by this server with `kind`, `apiVersion` then `metadata`
/// first, so the first `"metadata":{` is the top-level one.
pub fn with_resource_version(value: &[u8], rev: Revision) -> Vec<u8> {
    const NEEDLE: &[u8] = b"\"metadata\":{";
    let rv = format!("\"resourceVersion\":\"{rev}\"");
    let mut out = Vec::with_capacity(value.len() + rv.len() + 1);
    match value.windows(NEEDLE.len()).position(|w| w == NEEDLE) {
        Some(pos) => {
            let at = pos + NEEDLE.len();
            out.extend_from_slice(&value[..at]);
            out.extend_from_slice(rv.as_bytes());
            if value.get(at) != Some(&b'}') {
                out.push(b',');
            }
            out.extend_from_slice(&value[at..]);
        }
        None => out.extend_from_slice(value),
    }
    out
}

/// Parse a stored value into an object carrying its resourceVersion.
pub fn decode_kv(kv: &KeyValue) -> Option<Value> {
    let mut v: Value = serde_json::from_slice(&kv.value).ok()?;
    set_resource_version(&mut v, kv.mod_revision);
    Some(v)
}

/// Serialize an object for storage: `kind`, `apiVersion`, `metadata` first, no resourceVersion.
pub fn encode_for_store(obj: &Value) -> Vec<u8> {
    let mut ordered = Map::new();
    if let Some(m) = obj.as_object() {
        for k in ["kind", "apiVersion", "metadata"] {
            if let Some(v) = m.get(k) {
                ordered.insert(k.to_string(), v.clone());
            }
        }
        for (k, v) in m {
            if !ordered.contains_key(k) {
                ordered.insert(k.clone(), v.clone());
            }
        }
    }
    if let Some(md) = ordered.get_mut("metadata").and_then(Value::as_object_mut) {
        md.remove("resourceVersion");
        md.remove("selfLink");
    }
    serde_json::to_vec(&Value::Object(ordered)).unwrap_or_default()
}

pub fn metadata(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata").and_then(Value::as_object)
}

/// The metadata map, created if missing.
pub fn metadata_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = Value::Object(Map::new());
    }
    let Value::Object(m) = obj else {
        unreachable!("made an object above")
    };
    let md = m.entry("metadata").or_insert_with(|| Value::Object(Map::new()));
    if !md.is_object() {
        *md = Value::Object(Map::new());
    }
    match md {
        Value::Object(md) => md,
        _ => unreachable!("made an object above"),
    }
}

pub fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    metadata(obj)
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

pub fn name(obj: &Value) -> &str {
    meta_str(obj, "name")
}

pub fn namespace(obj: &Value) -> &str {
    meta_str(obj, "namespace")
}

pub fn uid(obj: &Value) -> &str {
    meta_str(obj, "uid")
}

pub fn resource_version(obj: &Value) -> &str {
    meta_str(obj, "resourceVersion")
}

pub fn set_resource_version(obj: &mut Value, rev: Revision) {
    metadata_mut(obj).insert("resourceVersion".into(), Value::String(rev.to_string()));
}

pub fn labels(obj: &Value) -> Option<&Map<String, Value>> {
    metadata(obj).and_then(|m| m.get("labels")).and_then(Value::as_object)
}

pub fn finalizers(obj: &Value) -> Vec<String> {
    metadata(obj)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

pub fn deletion_timestamp(obj: &Value) -> Option<&str> {
    metadata(obj)
        .and_then(|m| m.get("deletionTimestamp"))
        .and_then(Value::as_str)
}

/// RFC 3339 with seconds, as upstream's metav1.Time.
pub fn now_rfc3339() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// RFC 3339 with microseconds, as upstream's metav1.MicroTime.
pub fn now_micro() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn splice_resource_version() {
        let obj = json!({"kind":"Pod","apiVersion":"v1","metadata":{"name":"a","resourceVersion":"9"},"spec":{}});
        let bytes = encode_for_store(&obj);
        let out: Value = serde_json::from_slice(&with_resource_version(&bytes, 42)).expect("json");
        assert_eq!(out["metadata"]["resourceVersion"], "42");
        assert_eq!(out["metadata"]["name"], "a");
        let empty = encode_for_store(&json!({"kind":"X","metadata":{}}));
        let out: Value = serde_json::from_slice(&with_resource_version(&empty, 7)).expect("json");
        assert_eq!(out["metadata"]["resourceVersion"], "7");
    }

    #[test]
    fn keys() {
        let pods = skiff_api::registry::lookup("", "v1", "pods").expect("pods");
        assert_eq!(key(pods, "default", "a"), "/registry/pods/default/a");
        let deploy = skiff_api::registry::lookup("apps", "v1", "deployments").expect("deploy");
        assert_eq!(prefix(deploy, ""), "/registry/deployments.apps/");
    }
}
