//! Objects as the server stores them: JSON with `metadata.resourceVersion` left out (the store's
//! revision is the resourceVersion, spliced in when an object leaves the server), under keys
//! `/registry/<plural[.group]>/<namespace>/<name>`.

use serde_json::{Map, Value};
use skiff_api::Resource;
use skiff_store::{KeyValue, Revision};

/// The segment of a resource's keys after `/registry/`: `<group>/<plural>` for custom
/// resources and definitions themselves, as upstream's apiextensions-apiserver stores them.
fn resource_segment(res: &Resource) -> String {
    if res.group == "apiextensions.k8s.io" || skiff_api::registry::is_custom(res) {
        format!("{}/{}", res.group, res.plural)
    } else {
        res.qualified_plural()
    }
}

/// The key prefix of a resource, optionally within one namespace.
pub fn prefix(res: &Resource, namespace: &str) -> String {
    if res.namespaced && !namespace.is_empty() {
        format!("/registry/{}/{}/", resource_segment(res), namespace)
    } else {
        format!("/registry/{}/", resource_segment(res))
    }
}

/// The key of one object.
pub fn key(res: &Resource, namespace: &str, name: &str) -> String {
    if res.namespaced {
        format!("/registry/{}/{}/{}", resource_segment(res), namespace, name)
    } else {
        format!("/registry/{}/{}", resource_segment(res), name)
    }
}

/// A custom object's stored bytes as the version `res` serves them: conversion strategy
/// `None` rewrites only the top-level `apiVersion` (the first one: stored objects begin with
/// `kind` and `apiVersion`). Other resources' bytes are returned as they are.
pub fn served_bytes(res: &Resource, value: Vec<u8>) -> Vec<u8> {
    if !skiff_api::registry::is_custom(res) {
        return value;
    }
    const FIELD: &[u8] = b"\"apiVersion\":\"";
    let Some(start) = value
        .windows(FIELD.len())
        .position(|w| w == FIELD)
        .map(|p| p + FIELD.len())
    else {
        return value;
    };
    let Some(len) = value[start..].iter().position(|b| *b == b'"') else {
        return value;
    };
    let want = res.api_version();
    if &value[start..start + len] == want.as_bytes() {
        return value;
    }
    let mut out = Vec::with_capacity(value.len() + want.len());
    out.extend_from_slice(&value[..start]);
    out.extend_from_slice(want.as_bytes());
    out.extend_from_slice(&value[start + len..]);
    out
}

/// A key-value whose value is served through `res` (see [`served_bytes`]).
pub fn served_kv(res: &Resource, mut kv: KeyValue) -> KeyValue {
    if skiff_api::registry::is_custom(res) {
        let served = served_bytes(res, kv.value.to_vec());
        if served[..] != kv.value[..] {
            kv.value = served.into();
        }
    }
    kv
}

/// Set a custom object's `apiVersion` to `version` of its group (the storage version when
/// stored, the requested one when served).
pub fn set_custom_version(res: &Resource, obj: &mut Value, version: &str) {
    if let Some(m) = obj.as_object_mut() {
        m.insert("apiVersion".into(), Value::String(format!("{}/{version}", res.group)));
    }
}

/// The bytes stored for an object of `res`: a custom object in its definition's storage
/// version.
pub fn encode_for_storage(res: &Resource, obj: &Value) -> Vec<u8> {
    if let Some(def) = skiff_api::apiextensions::definition(res)
        && let Some(storage) = def.storage_version()
        && storage.name != res.version
    {
        let mut copy = obj.clone();
        set_custom_version(res, &mut copy, &storage.name);
        return encode_for_store(&copy);
    }
    encode_for_store(obj)
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
    serde_json::to_vec(&StoredForm(obj)).unwrap_or_default()
}

/// Serializes an object in its stored form without copying it: `kind`, `apiVersion` and
/// `metadata` first, and no `metadata.resourceVersion` / `selfLink`.
struct StoredForm<'a>(&'a Value);

/// Metadata without the fields the store derives.
struct StoredMeta<'a>(&'a Map<String, Value>);

const HEAD: [&str; 3] = ["kind", "apiVersion", "metadata"];

impl serde::Serialize for StoredForm<'_> {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let Some(m) = self.0.as_object() else {
            return ser.serialize_map(Some(0))?.end();
        };
        let mut out = ser.serialize_map(Some(m.len()))?;
        for k in HEAD {
            match (k, m.get(k)) {
                ("metadata", Some(Value::Object(md))) => out.serialize_entry(k, &StoredMeta(md))?,
                (_, Some(v)) => out.serialize_entry(k, v)?,
                (_, None) => {}
            }
        }
        for (k, v) in m {
            if !HEAD.contains(&k.as_str()) {
                out.serialize_entry(k, v)?;
            }
        }
        out.end()
    }
}

impl serde::Serialize for StoredMeta<'_> {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut out = ser.serialize_map(None)?;
        for (k, v) in self.0 {
            if k != "resourceVersion" && k != "selfLink" {
                out.serialize_entry(k, v)?;
            }
        }
        out.end()
    }
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

/// A value whose JSON type the field's Go type cannot take: what upstream's decoder
/// reports as `json: cannot unmarshal <json> into Go struct field <Struct>.<path> of type <go>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeMismatch {
    /// The JSON path of the field from the object's root, without list indexes (as Go names it).
    pub path: String,
    /// The Go struct holding the field ("DeploymentSpec").
    pub struct_name: String,
    /// What the JSON had: "string", "number", "number 1.5", "bool", "object", "array".
    pub json: String,
    /// The Go type of the field ("int32", "[]v1.Container", "map[string]string").
    pub go_type: String,
    /// What upstream's unstructured converter (`FromUnstructured`, which a strategic merge
    /// patch's result goes through) says of the same value: "cannot restore map from string".
    pub converter: String,
}

impl TypeMismatch {
    /// Go's UnmarshalTypeError text.
    pub fn message(&self) -> String {
        format!(
            "json: cannot unmarshal {} into Go struct field {}.{} of type {}",
            self.json, self.struct_name, self.path, self.go_type
        )
    }
}

/// The first field of `obj` whose JSON type definition `def` does not allow. `null` is
/// always allowed (Go leaves the zero value); quantities take numbers too, IntOrString
/// integers and strings.
pub fn type_mismatch(def: &str, obj: &Value) -> Option<TypeMismatch> {
    let schema = skiff_api::schema::definitions().get(def)?;
    check_type(schema, short_name(def), obj, &mut String::new())
}

fn short_name(def: &str) -> &str {
    def.rsplit('.').next().unwrap_or(def)
}

/// `v1.PodSpec` for `io.k8s.api.core.v1.PodSpec`.
fn go_name(def: &str) -> String {
    let mut parts = def.rsplit('.');
    let name = parts.next().unwrap_or(def);
    match parts.next() {
        Some(pkg) => format!("{pkg}.{name}"),
        None => name.to_string(),
    }
}

fn json_kind(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(_) => "bool".into(),
        Value::Number(_) => "number".into(),
        Value::String(_) => "string".into(),
        Value::Array(_) => "array".into(),
        Value::Object(_) => "object".into(),
    }
}

/// The Go type a schema stands for, for messages.
fn go_type(schema: &Value) -> String {
    if let Some((name, _)) = skiff_api::schema::resolve(schema) {
        return match short_name(name) {
            "Quantity" => "resource.Quantity".into(),
            "IntOrString" => "intstr.IntOrString".into(),
            "Time" | "MicroTime" => format!("v1.{}", short_name(name)),
            _ => go_name(name),
        };
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("integer") => schema
            .get("format")
            .and_then(Value::as_str)
            .filter(|f| *f == "int32" || *f == "int64")
            .unwrap_or("int64")
            .to_string(),
        Some("number") => "float64".into(),
        Some("boolean") => "bool".into(),
        Some("string") if schema.get("format").and_then(Value::as_str) == Some("byte") => "[]uint8".into(),
        Some("string") => "string".into(),
        Some("array") => format!("[]{}", schema.get("items").map(go_type).unwrap_or_default()),
        Some("object") => match schema.get("additionalProperties").filter(|a| a.is_object()) {
            Some(ap) => format!("map[string]{}", go_type(ap)),
            None => "map[string]interface {}".into(),
        },
        _ => "interface {}".into(),
    }
}

/// The reflect kind of a decoded JSON value as Go holds it in an unstructured map (integers
/// are kept as int64).
fn go_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "invalid",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_i64() || n.is_u64() => "int64",
        Value::Number(_) => "float64",
        Value::String(_) => "string",
        Value::Array(_) => "slice",
        Value::Object(_) => "map",
    }
}

/// Upstream's `fromUnstructured` error for `v` into a field of `schema`'s Go type: maps,
/// slices and structs are "restored", simple types converted only within JSON's groups, and
/// the types with their own JSON decoding (quantities, IntOrString, times) answer as it does.
fn converter_text(schema: &Value, v: &Value, json: &str) -> String {
    let kind = go_kind(v);
    let resolved = skiff_api::schema::resolve(schema);
    if let Some((name, _)) = resolved {
        return match short_name(name) {
            "Quantity" => {
                "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'".into()
            }
            "IntOrString" => format!("json: cannot unmarshal {json} into Go value of type int32"),
            "Time" | "MicroTime" => format!("json: cannot unmarshal {json} into Go value of type string"),
            _ => format!("cannot restore struct from: {kind}"),
        };
    }
    let simple = |target: &str| match (kind, target) {
        // Integers convert to strings in Go, which the converter refuses by name.
        ("int64", "string") | ("float64", "int32" | "int64") => format!("cannot convert {kind} to {target}"),
        _ => format!("unrecognized type: {target}"),
    };
    match schema.get("type").and_then(Value::as_str) {
        Some("object") if schema.get("properties").is_some() => format!("cannot restore struct from: {kind}"),
        Some("object") => format!("cannot restore map from {kind}"),
        Some("array") => format!("cannot restore slice from {kind}"),
        Some("string") if schema.get("format").and_then(Value::as_str) == Some("byte") => {
            format!("cannot restore slice from {kind}")
        }
        Some("string") => simple("string"),
        Some("boolean") => simple("bool"),
        Some("number") => simple("float64"),
        Some("integer") => simple(
            schema
                .get("format")
                .and_then(Value::as_str)
                .filter(|f| *f == "int32")
                .unwrap_or("int64"),
        ),
        _ => format!("unrecognized type: {kind}"),
    }
}

/// A decoded JSON value as Go's `%+v` prints it: `map[k:v]` with sorted keys, `[a b]`,
/// strings bare, `<nil>`, and floats in `%v`'s shortest form.
pub fn go_text(v: &Value) -> String {
    let mut out = String::new();
    write_go_text(v, &mut out);
    out
}

fn write_go_text(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("<nil>"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) if n.is_i64() || n.is_u64() => out.push_str(&n.to_string()),
        Value::Number(n) => out.push_str(&go_float(n.as_f64().unwrap_or(0.0))),
        Value::String(s) => out.push_str(s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                write_go_text(item, out);
            }
            out.push(']');
        }
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push_str("map[");
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                out.push_str(k);
                out.push(':');
                write_go_text(&m[k], out);
            }
            out.push(']');
        }
    }
}

/// Go's `%v` of a float64: the shortest digits, with an exponent (two digits at least) below
/// 1e-4 and from 1e21 up.
fn go_float(f: f64) -> String {
    if f == 0.0 || !f.is_finite() {
        return format!("{f}");
    }
    let exp = f.abs().log10().floor() as i32;
    if (-4..21).contains(&exp) {
        return format!("{f}");
    }
    let sci = format!("{f:e}");
    match sci.split_once('e') {
        Some((mantissa, e)) => {
            let (sign, digits) = match e.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', e),
            };
            format!("{mantissa}e{sign}{digits:0>2}")
        }
        None => sci,
    }
}

/// `path` is the holder's path; each level appends to it and truncates back, so a field of the
/// right type costs no allocation.
fn check_type(schema: &Value, owner: &str, v: &Value, path: &mut String) -> Option<TypeMismatch> {
    if v.is_null() {
        return None;
    }
    let mismatch = |path: &str, json: String| {
        Some(TypeMismatch {
            path: path.to_string(),
            struct_name: owner.to_string(),
            converter: converter_text(schema, v, &json),
            json,
            go_type: go_type(schema),
        })
    };
    let (def_name, schema) = match skiff_api::schema::resolve(schema) {
        Some((name, s)) => (Some(name), s),
        None => (None, schema),
    };
    match def_name.map(short_name) {
        Some("Quantity") => {
            return (!v.is_string() && !v.is_number())
                .then(|| mismatch(path, json_kind(v)))
                .flatten();
        }
        Some("IntOrString") => {
            return match v {
                Value::String(_) => None,
                Value::Number(n) if n.is_i64() || n.is_u64() => None,
                Value::Number(n) => mismatch(path, format!("number {n}")),
                other => mismatch(path, json_kind(other)),
            };
        }
        _ => {}
    }
    if schema.get("x-kubernetes-int-or-string").is_some()
        || schema.get("x-kubernetes-preserve-unknown-fields").is_some()
    {
        return None;
    }
    // Fields inside a definition are named after it; inside a map or list, after the holder.
    let holder = def_name.map(short_name).unwrap_or(owner);
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => {
            let Value::Object(m) = v else {
                return mismatch(path, json_kind(v));
            };
            let props = schema.get("properties").and_then(Value::as_object);
            let extra = schema.get("additionalProperties").filter(|a| a.is_object());
            let len = path.len();
            for (k, child) in m {
                // Go's error names struct fields only: a map's keys are not in the path.
                let sub = match props.and_then(|ps| ps.get(k)) {
                    Some(sub) => {
                        if !path.is_empty() {
                            path.push('.');
                        }
                        path.push_str(k);
                        Some(sub)
                    }
                    None => extra,
                };
                let found = sub.and_then(|sub| check_type(sub, holder, child, path));
                path.truncate(len);
                if found.is_some() {
                    return found;
                }
            }
            None
        }
        Some("array") => {
            let Value::Array(items) = v else {
                return mismatch(path, json_kind(v));
            };
            let item_schema = schema.get("items")?;
            items
                .iter()
                .find_map(|child| check_type(item_schema, holder, child, path))
        }
        Some("string") => (!v.is_string()).then(|| mismatch(path, json_kind(v))).flatten(),
        Some("boolean") => (!v.is_boolean()).then(|| mismatch(path, json_kind(v))).flatten(),
        Some("number") => (!v.is_number()).then(|| mismatch(path, json_kind(v))).flatten(),
        Some("integer") => match v {
            Value::Number(n) if n.is_i64() || n.is_u64() => None,
            Value::Number(n) => match n.as_f64() {
                Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => None,
                _ => mismatch(path, format!("number {n}")),
            },
            other => mismatch(path, json_kind(other)),
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_print_as_go_prints_them() {
        let v = json!({"spec": {"b": [1, 1.5, "x", null, true], "a": {}}, "e": 1e-5, "f": 1e21, "g": 0.25});
        assert_eq!(
            go_text(&v),
            "map[e:1e-05 f:1e+21 g:0.25 spec:map[a:map[] b:[1 1.5 x <nil> true]]]"
        );
    }

    #[test]
    fn the_converter_words_each_mismatch_as_upstream() {
        let pod = "io.k8s.api.core.v1.Pod";
        let text = |obj: Value| type_mismatch(pod, &obj).expect("a mismatch").converter;
        assert_eq!(
            text(json!({"metadata": {"labels": "x"}})),
            "cannot restore map from string"
        );
        assert_eq!(
            text(json!({"spec": {"containers": "x"}})),
            "cannot restore slice from string"
        );
        assert_eq!(text(json!({"spec": "x"})), "cannot restore struct from: string");
        assert_eq!(
            text(json!({"spec": {"containers": [{"image": 5}]}})),
            "cannot convert int64 to string"
        );
        assert_eq!(
            text(json!({"spec": {"containers": [{"image": true}]}})),
            "unrecognized type: string"
        );
        assert_eq!(text(json!({"spec": {"priority": "high"}})), "unrecognized type: int32");
        assert_eq!(
            text(json!({"spec": {"priority": 1.5}})),
            "cannot convert float64 to int32"
        );
        assert_eq!(text(json!({"spec": {"hostNetwork": "yes"}})), "unrecognized type: bool");
    }

    #[test]
    fn custom_resources_and_definitions_are_keyed_as_upstream() {
        let widgets = Resource {
            group: "example.com",
            version: "v1",
            kind: "Widget",
            plural: "widgets",
            singular: "widget",
            namespaced: true,
            short_names: &[],
            categories: &[],
            subresources: &[],
        };
        assert_eq!(key(&widgets, "ns", "w"), "/registry/example.com/widgets/ns/w");
        assert_eq!(prefix(&widgets, ""), "/registry/example.com/widgets/");
        let crds = skiff_api::registry::lookup("apiextensions.k8s.io", "v1", "customresourcedefinitions").unwrap();
        assert_eq!(
            key(crds, "", "widgets.example.com"),
            "/registry/apiextensions.k8s.io/customresourcedefinitions/widgets.example.com"
        );
        let deploy = skiff_api::registry::lookup("apps", "v1", "deployments").unwrap();
        assert_eq!(key(deploy, "ns", "d"), "/registry/deployments.apps/ns/d");
        let v2 = Resource {
            version: "v2",
            ..widgets
        };
        let served = served_bytes(
            &v2,
            br#"{"kind":"Widget","apiVersion":"example.com/v1","metadata":{}}"#.to_vec(),
        );
        assert_eq!(
            served,
            br#"{"kind":"Widget","apiVersion":"example.com/v2","metadata":{}}"#.to_vec()
        );
    }
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

    #[test]
    fn wrong_json_types_are_found_as_go_reports_them() {
        let deploy = skiff_api::schema::definition_for("apps", "v1", "Deployment").expect("deployment");
        let ok = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "labels": {"a": "b"}, "deletionTimestamp": null},
            "spec": {"replicas": 2, "strategy": {"rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 1}},
                "template": {"spec": {"containers": [{"name": "c", "image": "i",
                    "resources": {"limits": {"cpu": 1, "memory": "1Gi"}}}]}}}
        });
        assert_eq!(type_mismatch(deploy, &ok), None);
        let bad = json!({"spec": {"replicas": "x"}});
        let m = type_mismatch(deploy, &bad).expect("mismatch");
        assert_eq!(
            m.message(),
            "json: cannot unmarshal string into Go struct field DeploymentSpec.spec.replicas of type int32"
        );
        let bad = json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": 5}]}}}});
        assert_eq!(
            type_mismatch(deploy, &bad).expect("mismatch").message(),
            "json: cannot unmarshal number into Go struct field Container.spec.template.spec.containers.image of type string"
        );
        let bad = json!({"spec": {"template": {"spec": {"containers": "nope"}}}});
        assert_eq!(
            type_mismatch(deploy, &bad).expect("mismatch").message(),
            "json: cannot unmarshal string into Go struct field PodSpec.spec.template.spec.containers of type []v1.Container"
        );
        let bad = json!({"metadata": {"labels": {"a": 1}}});
        assert_eq!(
            type_mismatch(deploy, &bad).expect("mismatch").message(),
            "json: cannot unmarshal number into Go struct field ObjectMeta.metadata.labels of type string"
        );
        let bad = json!({"spec": {"replicas": 1.5}});
        assert_eq!(type_mismatch(deploy, &bad).expect("mismatch").json, "number 1.5");
        let bad = json!({"spec": {"paused": "yes"}});
        assert_eq!(type_mismatch(deploy, &bad).expect("mismatch").go_type, "bool");
        let bad = json!({"spec": {"strategy": {"rollingUpdate": {"maxSurge": true}}}});
        assert_eq!(
            type_mismatch(deploy, &bad).expect("mismatch").go_type,
            "intstr.IntOrString"
        );
        let cm = skiff_api::schema::definition_for("", "v1", "ConfigMap").expect("configmap");
        assert_eq!(
            type_mismatch(cm, &json!({"data": {"a": true}}))
                .expect("mismatch")
                .go_type,
            "string"
        );
        assert_eq!(
            type_mismatch(cm, &json!({"data": ["a"]})).expect("mismatch").go_type,
            "map[string]string"
        );
    }
}
