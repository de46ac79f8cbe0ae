//! `/openapi/v2`: the whole API in one Swagger 2.0 document, as upstream still serves it beside
//! the per-group-version OpenAPI v3 documents. It is converted from those documents (built-in
//! and custom): `#/components/schemas/X` becomes `#/definitions/X`, a single `allOf` reference
//! becomes a plain `$ref`, `nullable`/`anyOf`/`oneOf` (not in Swagger 2.0) are left out, request
//! bodies become `in: body` parameters and response contents `produces` plus a schema.
//! Definitions shared by several group-versions (`DeleteOptions`, `WatchEvent`, ...) carry the
//! union of their `x-kubernetes-group-version-kind`s.
//!
//! kubectl reads it (as protobuf, gnostic's `openapi.v2.Document`) when the v3 documents do not
//! know an object's kind: its validation then skips the object and the REST mapping answers
//! `no matches for kind`, as against upstream. `kubectl explain --output plaintext-openapiv2`
//! reads the definitions.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::discovery::GIT_VERSION;

/// The protobuf media type clients ask for, and the one upstream answers with (Go's
/// `mime.ParseMediaType`, which client-go applies to every answer, refuses the `@`).
const PROTOBUF_ASKED: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
pub const PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

const V3_REF: &str = "#/components/schemas/";
const V2_REF: &str = "#/definitions/";
const GVK_EXT: &str = "x-kubernetes-group-version-kind";
const OPERATIONS: &[&str] = &["get", "put", "post", "delete", "options", "head", "patch"];

/// Whether the request's Accept header asks for the protobuf form.
pub fn wants_protobuf(accept: &str) -> bool {
    accept.split(',').any(|part| {
        let media = part.split(';').next().unwrap_or("").trim();
        media == PROTOBUF_ASKED || media == PROTOBUF
    })
}

/// The Swagger 2.0 document of everything served now, from the v3 documents given as
/// (path, document).
pub fn document<'a>(v3: impl IntoIterator<Item = &'a Value>) -> Value {
    let mut paths: BTreeMap<String, Value> = BTreeMap::new();
    let mut definitions: BTreeMap<String, Value> = BTreeMap::new();
    for doc in v3 {
        if let Some(p) = doc.get("paths").and_then(Value::as_object) {
            for (path, item) in p {
                paths.entry(path.clone()).or_insert_with(|| path_item(item));
            }
        }
        if let Some(s) = doc.pointer("/components/schemas").and_then(Value::as_object) {
            for (name, schema) in s {
                let converted = schema_v2(schema);
                match definitions.get_mut(name) {
                    Some(existing) => merge_gvks(existing, &converted),
                    None => {
                        definitions.insert(name.clone(), converted);
                    }
                }
            }
        }
    }
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": GIT_VERSION},
        "paths": paths,
        "definitions": definitions,
        "securityDefinitions": {"BearerToken": {"type": "apiKey", "description": "Bearer Token authentication", "name": "authorization", "in": "header"}},
        "security": [{"BearerToken": []}],
    })
}

/// Adds to `into`'s group-version-kinds those of `from` it lacks.
fn merge_gvks(into: &mut Value, from: &Value) {
    let Some(more) = from.get(GVK_EXT).and_then(Value::as_array) else {
        return;
    };
    let Some(m) = into.as_object_mut() else { return };
    let list = m.entry(GVK_EXT).or_insert_with(|| json!([]));
    if let Some(list) = list.as_array_mut() {
        for g in more {
            if !list.contains(g) {
                list.push(g.clone());
            }
        }
    }
}

/// A v3 schema as Swagger 2.0 has it.
fn schema_v2(s: &Value) -> Value {
    let Some(m) = s.as_object() else {
        return s.clone();
    };
    let mut out = Map::new();
    for (k, v) in m {
        match k.as_str() {
            "nullable" | "anyOf" | "oneOf" | "not" => {}
            "$ref" => {
                let r = v.as_str().unwrap_or("");
                out.insert(k.clone(), json!(r.replacen(V3_REF, V2_REF, 1)));
            }
            "allOf" => match v.as_array().map(Vec::as_slice) {
                // upstream's v3 wraps a reference that carries a description or default
                Some([only]) if only.get("$ref").is_some() && only.as_object().is_some_and(|o| o.len() == 1) => {
                    if let Some(r) = only.get("$ref").and_then(Value::as_str) {
                        out.insert("$ref".into(), json!(r.replacen(V3_REF, V2_REF, 1)));
                    }
                }
                Some(all) => {
                    out.insert(k.clone(), Value::Array(all.iter().map(schema_v2).collect()));
                }
                None => {}
            },
            "properties" => {
                let props: Map<String, Value> = v
                    .as_object()
                    .map(|p| p.iter().map(|(n, s)| (n.clone(), schema_v2(s))).collect())
                    .unwrap_or_default();
                out.insert(k.clone(), Value::Object(props));
            }
            "items" | "additionalProperties" if v.is_object() => {
                out.insert(k.clone(), schema_v2(v));
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Value::Object(out)
}

/// A v3 parameter as Swagger 2.0 has it: its schema's type inline.
fn parameter_v2(p: &Value) -> Value {
    let Some(m) = p.as_object() else {
        return p.clone();
    };
    let mut out = Map::new();
    for (k, v) in m {
        if k == "schema" {
            if let Some(s) = v.as_object() {
                for (sk, sv) in s {
                    if matches!(sk.as_str(), "type" | "format" | "uniqueItems" | "items") {
                        out.insert(sk.clone(), sv.clone());
                    }
                }
            }
        } else {
            out.insert(k.clone(), v.clone());
        }
    }
    Value::Object(out)
}

fn path_item(item: &Value) -> Value {
    let Some(m) = item.as_object() else {
        return item.clone();
    };
    let mut out = Map::new();
    for (k, v) in m {
        if OPERATIONS.contains(&k.as_str()) {
            out.insert(k.clone(), operation(v));
        } else if k == "parameters" {
            out.insert(k.clone(), parameters(v));
        } else if k.starts_with("x-") {
            out.insert(k.clone(), v.clone());
        }
    }
    Value::Object(out)
}

fn parameters(v: &Value) -> Value {
    Value::Array(
        v.as_array()
            .map(|ps| ps.iter().map(parameter_v2).collect())
            .unwrap_or_default(),
    )
}

fn operation(op: &Value) -> Value {
    let Some(m) = op.as_object() else {
        return op.clone();
    };
    let mut out = Map::new();
    let mut params: Vec<Value> = m
        .get("parameters")
        .and_then(Value::as_array)
        .map(|ps| ps.iter().map(parameter_v2).collect())
        .unwrap_or_default();
    for (k, v) in m {
        match k.as_str() {
            "tags" | "summary" | "description" | "operationId" | "deprecated" => {
                out.insert(k.clone(), v.clone());
            }
            "requestBody" => {
                let content = v.get("content").and_then(Value::as_object);
                let consumes: Vec<Value> = content
                    .map(|c| c.keys().map(|t| json!(t)).collect())
                    .unwrap_or_default();
                let schema = content
                    .and_then(|c| c.values().next())
                    .and_then(|c| c.get("schema"))
                    .map(schema_v2)
                    .unwrap_or_else(|| json!({}));
                params.insert(
                    0,
                    json!({"name": "body", "in": "body", "required": true, "schema": schema}),
                );
                out.insert("consumes".into(), Value::Array(consumes));
            }
            "responses" => {
                let mut produces: Vec<Value> = Vec::new();
                let mut responses = Map::new();
                for (code, r) in v.as_object().into_iter().flatten() {
                    let mut resp = Map::new();
                    resp.insert(
                        "description".into(),
                        r.get("description").cloned().unwrap_or_else(|| json!("")),
                    );
                    if let Some(content) = r.get("content").and_then(Value::as_object) {
                        for t in content.keys() {
                            if !produces.contains(&json!(t)) {
                                produces.push(json!(t));
                            }
                        }
                        if let Some(s) = content.values().next().and_then(|c| c.get("schema")) {
                            resp.insert("schema".into(), schema_v2(s));
                        }
                    }
                    responses.insert(code.clone(), Value::Object(resp));
                }
                out.insert("produces".into(), Value::Array(produces));
                out.insert("responses".into(), Value::Object(responses));
            }
            _ if k.starts_with("x-") => {
                out.insert(k.clone(), v.clone());
            }
            _ => {}
        }
    }
    if !params.is_empty() {
        out.insert("parameters".into(), Value::Array(params));
    }
    out.insert("schemes".into(), json!(["https"]));
    Value::Object(out)
}

/// gnostic's `openapi.v2.Document` in protobuf, what client-go's `OpenAPISchema()` decodes.
pub fn protobuf(doc: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    put_str(&mut out, 1, str_of(doc, "swagger"));
    if let Some(info) = doc.get("info") {
        let mut i = Vec::new();
        put_str(&mut i, 1, str_of(info, "title"));
        put_str(&mut i, 2, str_of(info, "version"));
        put_msg(&mut out, 2, &i);
    }
    let mut paths = Vec::new();
    for (name, item) in doc.get("paths").and_then(Value::as_object).into_iter().flatten() {
        let mut named = Vec::new();
        put_str(&mut named, 1, name);
        put_msg(&mut named, 2, &path_item_pb(item));
        put_msg(&mut paths, 2, &named);
    }
    put_msg(&mut out, 8, &paths);
    let mut defs = Vec::new();
    for (name, schema) in doc.get("definitions").and_then(Value::as_object).into_iter().flatten() {
        put_msg(&mut defs, 1, &named_schema(name, schema));
    }
    put_msg(&mut out, 9, &defs);
    out
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

fn named_schema(name: &str, schema: &Value) -> Vec<u8> {
    let mut n = Vec::new();
    put_str(&mut n, 1, name);
    put_msg(&mut n, 2, &schema_pb(schema));
    n
}

/// gnostic's `Any`: the value as YAML (JSON is YAML).
fn any_pb(v: &Value) -> Vec<u8> {
    let mut a = Vec::new();
    put_str(&mut a, 2, &format!("{v}\n"));
    a
}

fn vendor_extensions(out: &mut Vec<u8>, field: u32, m: &Map<String, Value>) {
    for (k, v) in m.iter().filter(|(k, _)| k.starts_with("x-")) {
        let mut named = Vec::new();
        put_str(&mut named, 1, k);
        put_msg(&mut named, 2, &any_pb(v));
        put_msg(out, field, &named);
    }
}

fn schema_pb(s: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    let Some(m) = s.as_object() else {
        return out;
    };
    put_str(&mut out, 1, str_of(s, "$ref"));
    put_str(&mut out, 2, str_of(s, "format"));
    put_str(&mut out, 3, str_of(s, "title"));
    put_str(&mut out, 4, str_of(s, "description"));
    if let Some(d) = m.get("default") {
        put_msg(&mut out, 5, &any_pb(d));
    }
    for (key, field) in [("multipleOf", 6), ("maximum", 7)] {
        if let Some(n) = m.get(key).and_then(Value::as_f64) {
            put_double(&mut out, field, n);
        }
    }
    put_bool(
        &mut out,
        8,
        m.get("exclusiveMaximum").and_then(Value::as_bool) == Some(true),
    );
    if let Some(n) = m.get("minimum").and_then(Value::as_f64) {
        put_double(&mut out, 9, n);
    }
    put_bool(
        &mut out,
        10,
        m.get("exclusiveMinimum").and_then(Value::as_bool) == Some(true),
    );
    for (key, field) in [("maxLength", 11), ("minLength", 12)] {
        if let Some(n) = m.get(key).and_then(Value::as_i64) {
            put_int(&mut out, field, n);
        }
    }
    put_str(&mut out, 13, str_of(s, "pattern"));
    for (key, field) in [("maxItems", 14), ("minItems", 15)] {
        if let Some(n) = m.get(key).and_then(Value::as_i64) {
            put_int(&mut out, field, n);
        }
    }
    put_bool(
        &mut out,
        16,
        m.get("uniqueItems").and_then(Value::as_bool) == Some(true),
    );
    for (key, field) in [("maxProperties", 17), ("minProperties", 18)] {
        if let Some(n) = m.get(key).and_then(Value::as_i64) {
            put_int(&mut out, field, n);
        }
    }
    for r in m.get("required").and_then(Value::as_array).into_iter().flatten() {
        put_str(&mut out, 19, r.as_str().unwrap_or(""));
    }
    for e in m.get("enum").and_then(Value::as_array).into_iter().flatten() {
        put_msg(&mut out, 20, &any_pb(e));
    }
    match m.get("additionalProperties") {
        Some(Value::Bool(b)) => {
            let mut item = Vec::new();
            // A oneof member is written even when false.
            put_key(&mut item, 2, 0);
            put_varint(&mut item, u64::from(*b));
            put_msg(&mut out, 21, &item);
        }
        Some(v @ Value::Object(_)) => {
            let mut item = Vec::new();
            put_msg(&mut item, 1, &schema_pb(v));
            put_msg(&mut out, 21, &item);
        }
        _ => {}
    }
    if let Some(t) = m.get("type") {
        let mut item = Vec::new();
        match t {
            Value::Array(ts) => ts.iter().for_each(|t| put_str(&mut item, 1, t.as_str().unwrap_or(""))),
            t => put_str(&mut item, 1, t.as_str().unwrap_or("")),
        }
        put_msg(&mut out, 22, &item);
    }
    match m.get("items") {
        Some(Value::Array(items)) => {
            let mut item = Vec::new();
            items.iter().for_each(|i| put_msg(&mut item, 1, &schema_pb(i)));
            put_msg(&mut out, 23, &item);
        }
        Some(i @ Value::Object(_)) => {
            let mut item = Vec::new();
            put_msg(&mut item, 1, &schema_pb(i));
            put_msg(&mut out, 23, &item);
        }
        _ => {}
    }
    for a in m.get("allOf").and_then(Value::as_array).into_iter().flatten() {
        put_msg(&mut out, 24, &schema_pb(a));
    }
    if let Some(props) = m.get("properties").and_then(Value::as_object) {
        let mut p = Vec::new();
        for (name, schema) in props {
            put_msg(&mut p, 1, &named_schema(name, schema));
        }
        put_msg(&mut out, 25, &p);
    }
    put_str(&mut out, 26, str_of(s, "discriminator"));
    put_bool(&mut out, 27, m.get("readOnly").and_then(Value::as_bool) == Some(true));
    if let Some(e) = m.get("example") {
        put_msg(&mut out, 30, &any_pb(e));
    }
    vendor_extensions(&mut out, 31, m);
    out
}

fn path_item_pb(item: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    let Some(m) = item.as_object() else {
        return out;
    };
    for (field, op) in [
        ("get", 2),
        ("put", 3),
        ("post", 4),
        ("delete", 5),
        ("options", 6),
        ("head", 7),
        ("patch", 8),
    ] {
        if let Some(o) = m.get(field) {
            put_msg(&mut out, op, &operation_pb(o));
        }
    }
    for p in m.get("parameters").and_then(Value::as_array).into_iter().flatten() {
        put_msg(&mut out, 9, &parameters_item_pb(p));
    }
    vendor_extensions(&mut out, 10, m);
    out
}

fn operation_pb(op: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    let Some(m) = op.as_object() else {
        return out;
    };
    for t in m.get("tags").and_then(Value::as_array).into_iter().flatten() {
        put_str(&mut out, 1, t.as_str().unwrap_or(""));
    }
    put_str(&mut out, 2, str_of(op, "summary"));
    put_str(&mut out, 3, str_of(op, "description"));
    put_str(&mut out, 5, str_of(op, "operationId"));
    for t in m.get("produces").and_then(Value::as_array).into_iter().flatten() {
        put_str(&mut out, 6, t.as_str().unwrap_or(""));
    }
    for t in m.get("consumes").and_then(Value::as_array).into_iter().flatten() {
        put_str(&mut out, 7, t.as_str().unwrap_or(""));
    }
    for p in m.get("parameters").and_then(Value::as_array).into_iter().flatten() {
        put_msg(&mut out, 8, &parameters_item_pb(p));
    }
    if let Some(rs) = m.get("responses").and_then(Value::as_object) {
        let mut responses = Vec::new();
        for (code, r) in rs {
            let mut resp = Vec::new();
            put_str(&mut resp, 1, str_of(r, "description"));
            if let Some(s) = r.get("schema") {
                let mut item = Vec::new();
                put_msg(&mut item, 1, &schema_pb(s));
                put_msg(&mut resp, 2, &item);
            }
            let mut value = Vec::new();
            put_msg(&mut value, 1, &resp);
            let mut named = Vec::new();
            put_str(&mut named, 1, code);
            put_msg(&mut named, 2, &value);
            put_msg(&mut responses, 1, &named);
        }
        put_msg(&mut out, 9, &responses);
    }
    for t in m.get("schemes").and_then(Value::as_array).into_iter().flatten() {
        put_str(&mut out, 10, t.as_str().unwrap_or(""));
    }
    put_bool(&mut out, 11, m.get("deprecated").and_then(Value::as_bool) == Some(true));
    vendor_extensions(&mut out, 13, m);
    out
}

/// gnostic's `ParametersItem` -> `Parameter` -> a body parameter or a non-body one
/// (query, path or header sub-schema).
fn parameters_item_pb(p: &Value) -> Vec<u8> {
    let mut parameter = Vec::new();
    let location = str_of(p, "in");
    if location == "body" {
        let mut body = Vec::new();
        put_str(&mut body, 1, str_of(p, "description"));
        put_str(&mut body, 2, str_of(p, "name"));
        put_str(&mut body, 3, location);
        put_bool(&mut body, 4, p.get("required").and_then(Value::as_bool) == Some(true));
        if let Some(s) = p.get("schema") {
            put_msg(&mut body, 5, &schema_pb(s));
        }
        put_msg(&mut parameter, 1, &body);
    } else {
        // Query parameters number their fields one past path and header ones
        // (`allowEmptyValue` is field 5).
        let shift = u32::from(location == "query");
        let mut sub = Vec::new();
        put_bool(&mut sub, 1, p.get("required").and_then(Value::as_bool) == Some(true));
        put_str(&mut sub, 2, location);
        put_str(&mut sub, 3, str_of(p, "description"));
        put_str(&mut sub, 4, str_of(p, "name"));
        put_str(&mut sub, 5 + shift, str_of(p, "type"));
        put_str(&mut sub, 6 + shift, str_of(p, "format"));
        put_bool(
            &mut sub,
            19 + shift,
            p.get("uniqueItems").and_then(Value::as_bool) == Some(true),
        );
        let which = match location {
            "header" => 1,
            "formData" => 2,
            "query" => 3,
            _ => 4,
        };
        let mut non_body = Vec::new();
        put_msg(&mut non_body, which, &sub);
        put_msg(&mut parameter, 2, &non_body);
    }
    let mut item = Vec::new();
    put_msg(&mut item, 1, &parameter);
    item
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_key(out: &mut Vec<u8>, field: u32, wire: u8) {
    put_varint(out, (u64::from(field) << 3) | u64::from(wire));
}

/// A proto3 string: left out when empty.
fn put_str(out: &mut Vec<u8>, field: u32, s: &str) {
    if s.is_empty() {
        return;
    }
    put_msg(out, field, s.as_bytes());
}

/// A length-delimited field (an embedded message is written even when empty: its presence
/// counts).
fn put_msg(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_key(out, field, 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn put_bool(out: &mut Vec<u8>, field: u32, b: bool) {
    if b {
        put_key(out, field, 0);
        put_varint(out, 1);
    }
}

fn put_int(out: &mut Vec<u8>, field: u32, n: i64) {
    put_key(out, field, 0);
    put_varint(out, n as u64);
}

fn put_double(out: &mut Vec<u8>, field: u32, n: f64) {
    put_key(out, field, 1);
    out.extend_from_slice(&n.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_lose_what_swagger_2_lacks_and_refs_point_at_definitions() {
        let v3 = json!({
            "paths": {},
            "components": {"schemas": {
                "a.B": {"type": "object", "properties": {
                    "meta": {"allOf": [{"$ref": "#/components/schemas/a.Meta"}], "description": "m"},
                    "n": {"type": "string", "nullable": true},
                    "l": {"type": "array", "items": {"$ref": "#/components/schemas/a.Meta"}},
                }, "x-kubernetes-group-version-kind": [{"group": "a", "kind": "B", "version": "v1"}]},
            }}
        });
        let other = json!({"components": {"schemas": {
            "a.B": {"x-kubernetes-group-version-kind": [{"group": "b", "kind": "B", "version": "v1"}]},
        }}});
        let doc = document([&v3, &other]);
        let b = &doc["definitions"]["a.B"];
        assert_eq!(
            b["properties"]["meta"],
            json!({"$ref": "#/definitions/a.Meta", "description": "m"})
        );
        assert_eq!(b["properties"]["n"], json!({"type": "string"}));
        assert_eq!(b["properties"]["l"]["items"], json!({"$ref": "#/definitions/a.Meta"}));
        assert_eq!(b[GVK_EXT].as_array().map(Vec::len), Some(2));
        assert_eq!(doc["swagger"], "2.0");
    }

    #[test]
    fn operations_get_body_parameters_consumes_and_produces() {
        let op = json!({
            "operationId": "createX",
            "parameters": [{"name": "pretty", "in": "query", "schema": {"type": "string", "uniqueItems": true}}],
            "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/X"}}}},
            "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/X"}}, "application/yaml": {}}}},
            "x-kubernetes-action": "post",
        });
        let v2 = operation(&op);
        assert_eq!(
            v2["parameters"][0],
            json!({"name": "body", "in": "body", "required": true, "schema": {"$ref": "#/definitions/X"}})
        );
        assert_eq!(
            v2["parameters"][1],
            json!({"name": "pretty", "in": "query", "type": "string", "uniqueItems": true})
        );
        assert_eq!(v2["consumes"], json!(["application/json"]));
        assert_eq!(v2["produces"], json!(["application/json", "application/yaml"]));
        assert_eq!(v2["responses"]["200"]["schema"], json!({"$ref": "#/definitions/X"}));
        assert_eq!(v2["x-kubernetes-action"], "post");
    }

    #[test]
    fn protobuf_fields_are_gnostics() {
        let doc = json!({"swagger": "2.0", "info": {"title": "T", "version": "v"}, "paths": {},
            "definitions": {"D": {"type": "object", "required": ["r"], "additionalProperties": false}}});
        let pb = protobuf(&doc);
        // swagger (1), info (2: title 1, version 2), paths (8, empty), definitions (9).
        assert_eq!(&pb[..5], b"\x0a\x032.0");
        assert_eq!(&pb[5..13], b"\x12\x06\x0a\x01T\x12\x01v");
        assert_eq!(&pb[13..15], b"\x42\x00");
        // NamedSchema{name "D", Schema{required "r" (19), additionalProperties{boolean false}
        // (21), type {"object"} (22)}}.
        let schema: &[u8] = b"\x9a\x01\x01r\xaa\x01\x02\x10\x00\xb2\x01\x08\x0a\x06object";
        let mut named = b"\x0a\x01D\x12".to_vec();
        named.push(schema.len() as u8);
        named.extend_from_slice(schema);
        let mut defs = vec![0x0a, named.len() as u8];
        defs.extend_from_slice(&named);
        assert_eq!(&pb[15..17], &[0x4a, defs.len() as u8]);
        assert_eq!(&pb[17..], &defs[..]);
    }

    #[test]
    fn accept_negotiation() {
        assert!(wants_protobuf(PROTOBUF_ASKED));
        assert!(wants_protobuf(&format!("{PROTOBUF}, application/json")));
        assert!(!wants_protobuf("application/json"));
        assert!(!wants_protobuf("*/*"));
    }
}
