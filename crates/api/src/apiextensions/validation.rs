//! A custom object checked against its version's schema, with the field errors upstream's
//! apiextensions-apiserver makes of kube-openapi's validation results
//! (`kubeOpenAPIResultToFieldErrors`): `Required value`, `Unsupported value`, `Too long`,
//! `Too many`, and `Invalid value: V: PATH in body must be of type T: "U"` and friends.

use serde_json::Value;

use super::schema::Schema;
use crate::status::{FieldError, FieldErrorKind, render_value};

/// Every problem of `obj` under `schema` (the root of `openAPIV3Schema`). The root's
/// `apiVersion`, `kind` and `metadata` are the API machinery's and are not walked.
pub fn validate(schema: &Schema, obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let Some(m) = obj.as_object() else {
        return errs;
    };
    for key in &schema.required {
        if !m.contains_key(key) {
            errs.push(FieldError::required(key.clone(), ""));
        }
    }
    for (k, v) in m {
        if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        if let Some(s) = schema.property(k) {
            walk(s, v, k, &mut errs);
        }
    }
    errs
}

/// go-openapi's name for the JSON type of a value.
fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) => {
            if n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0) {
                "integer"
            } else {
                "number"
            }
        }
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_ok(s: &Schema, v: &Value) -> Result<(), String> {
    let actual = json_type(v);
    if s.int_or_string {
        return if matches!(actual, "integer" | "string") {
            Ok(())
        } else {
            Err("integer,string".to_string())
        };
    }
    if s.ty.is_empty() {
        return Ok(());
    }
    let ok = s.ty == actual || (s.ty == "number" && actual == "integer");
    if ok { Ok(()) } else { Err(s.ty.clone()) }
}

/// Go's `%v` of a float64 bound.
fn go_number(f: f64) -> String {
    if f.fract() == 0.0 && f.abs() < 1e21 {
        format!("{}", f as i64)
    } else {
        format!("{f}")
    }
}

/// Compiled `pattern`s, per thread: a definition's patterns are compiled once, not on every
/// validated value (compiling was most of a custom resource create's cost). A pattern that does
/// not compile checks nothing, as before (the definition's own validation reports it).
fn compiled(pattern: &str) -> Option<regex::Regex> {
    /// Distinct patterns kept; past it the cache starts again (definitions change rarely).
    const KEPT: usize = 1024;
    thread_local! {
        static PATTERNS: std::cell::RefCell<std::collections::HashMap<String, Option<regex::Regex>>> =
            Default::default();
    }
    PATTERNS.with_borrow_mut(|patterns| {
        if let Some(re) = patterns.get(pattern) {
            return re.clone();
        }
        if patterns.len() >= KEPT {
            patterns.clear();
        }
        let re = regex::Regex::new(pattern).ok();
        patterns.insert(pattern.to_owned(), re.clone());
        re
    })
}

fn invalid(path: &str, v: &Value, detail: String) -> FieldError {
    FieldError::invalid(path, v, detail)
}

fn walk(s: &Schema, v: &Value, path: &str, errs: &mut Vec<FieldError>) {
    if v.is_null() && s.nullable {
        return;
    }
    if let Err(want) = type_ok(s, v) {
        let actual = json_type(v);
        errs.push(FieldError {
            kind: FieldErrorKind::TypeInvalid(render_value(&Value::String(actual.to_string()))),
            field: path.to_string(),
            detail: format!("{path} in body must be of type {want}: \"{actual}\""),
        });
        return;
    }
    match v {
        Value::String(st) => {
            let len = st.chars().count() as u64;
            if let Some(max) = s.max_length
                && len > max
            {
                errs.push(FieldError::too_long(path, max as usize));
            }
            if let Some(min) = s.min_length
                && len < min
            {
                errs.push(invalid(
                    path,
                    v,
                    format!("{path} in body should be at least {min} chars long"),
                ));
            }
            if let Some(p) = &s.pattern
                && let Some(re) = compiled(p)
                && !re.is_match(st)
            {
                errs.push(invalid(path, v, format!("{path} in body should match '{p}'")));
            }
        }
        Value::Number(n) => {
            let f = n.as_f64().unwrap_or(0.0);
            if let Some(max) = s.maximum {
                if s.exclusive_maximum && f >= max {
                    errs.push(invalid(
                        path,
                        v,
                        format!("{path} in body should be less than {}", go_number(max)),
                    ));
                } else if f > max {
                    errs.push(invalid(
                        path,
                        v,
                        format!("{path} in body should be less than or equal to {}", go_number(max)),
                    ));
                }
            }
            if let Some(min) = s.minimum {
                if s.exclusive_minimum && f <= min {
                    errs.push(invalid(
                        path,
                        v,
                        format!("{path} in body should be greater than {}", go_number(min)),
                    ));
                } else if f < min {
                    errs.push(invalid(
                        path,
                        v,
                        format!("{path} in body should be greater than or equal to {}", go_number(min)),
                    ));
                }
            }
            if let Some(m) = s.multiple_of
                && m > 0.0
                && (f / m).fract() != 0.0
            {
                errs.push(invalid(
                    path,
                    v,
                    format!("{path} in body should be a multiple of {}", go_number(m)),
                ));
            }
        }
        Value::Array(items) => {
            if let Some(max) = s.max_items
                && items.len() as u64 > max
            {
                errs.push(FieldError {
                    kind: FieldErrorKind::TooMany(items.len(), max as usize),
                    field: path.to_string(),
                    detail: String::new(),
                });
            }
            if let Some(min) = s.min_items
                && (items.len() as u64) < min
            {
                errs.push(invalid(
                    path,
                    v,
                    format!("{path} in body should have at least {min} items"),
                ));
            }
            if s.unique_items || s.list_type == "set" {
                for (i, item) in items.iter().enumerate() {
                    if items[..i].contains(item) {
                        errs.push(FieldError::duplicate(format!("{path}[{i}]"), item));
                    }
                }
            }
            if s.list_type == "map" && !s.list_map_keys.is_empty() {
                for (i, item) in items.iter().enumerate() {
                    let key: Vec<Option<&Value>> = s.list_map_keys.iter().map(|k| item.get(k)).collect();
                    if items[..i]
                        .iter()
                        .any(|o| s.list_map_keys.iter().map(|k| o.get(k)).collect::<Vec<_>>() == key)
                    {
                        errs.push(FieldError::duplicate(format!("{path}[{i}]"), item));
                    }
                }
            }
            if let Some(item_schema) = &s.items {
                for (i, item) in items.iter().enumerate() {
                    walk(item_schema, item, &format!("{path}[{i}]"), errs);
                }
            }
        }
        Value::Object(m) => {
            if let Some(max) = s.max_properties
                && m.len() as u64 > max
            {
                errs.push(FieldError {
                    kind: FieldErrorKind::TooMany(m.len(), max as usize),
                    field: path.to_string(),
                    detail: String::new(),
                });
            }
            if let Some(min) = s.min_properties
                && (m.len() as u64) < min
            {
                errs.push(invalid(
                    path,
                    v,
                    format!("{path} in body should have at least {min} properties"),
                ));
            }
            for key in &s.required {
                if !m.contains_key(key) {
                    errs.push(FieldError::required(format!("{path}.{key}"), ""));
                }
            }
            if s.embedded_resource {
                // upstream's `validateEmbeddedResource`: an embedded object says what it is.
                for key in ["apiVersion", "kind"] {
                    if m.get(key).and_then(Value::as_str).is_none_or(str::is_empty) {
                        errs.push(FieldError::required(format!("{path}.{key}"), "must not be empty"));
                    }
                }
            }
            for (k, child) in m {
                if s.embedded_resource
                    && matches!(k.as_str(), "apiVersion" | "kind" | "metadata")
                    && !s.properties.contains_key(k)
                {
                    continue;
                }
                if let Some(cs) = s.property(k) {
                    walk(cs, child, &format!("{path}.{k}"), errs);
                }
            }
        }
        _ => {}
    }
    if let Value::String(st) = v
        && !s.format.is_empty()
        && !format_ok(&s.format, st)
    {
        errs.push(FieldError {
            kind: FieldErrorKind::TypeInvalid(render_value(v)),
            field: path.to_string(),
            detail: format!("{path} in body must be of type {}: {st:?}", s.format),
        });
    }
    composites(s, v, path, errs);
    if !s.enum_values.is_empty() && !s.enum_values.contains(v) {
        let supported: Vec<String> = s
            .enum_values
            .iter()
            .map(|e| match e {
                Value::String(st) => format!("{st:?}"),
                other => format!("{:?}", other.to_string()),
            })
            .collect();
        errs.push(FieldError {
            kind: FieldErrorKind::NotSupported {
                value: render_value(v),
                supported,
            },
            field: path.to_string(),
            detail: String::new(),
        });
    }
}

/// `allOf`, `anyOf`, `oneOf` and `not`, as kube-openapi's validator words them.
fn composites(s: &Schema, v: &Value, path: &str, errs: &mut Vec<FieldError>) {
    let passes = |sub: &Schema| {
        let mut sub_errs = Vec::new();
        walk(sub, v, path, &mut sub_errs);
        sub_errs.is_empty()
    };
    for sub in &s.all_of {
        walk(sub, v, path, errs);
    }
    if !s.any_of.is_empty() && !s.any_of.iter().any(passes) {
        errs.push(invalid(
            path,
            v,
            format!("{path} must validate at least one schema (anyOf)"),
        ));
    }
    if !s.one_of.is_empty() {
        let valid = s.one_of.iter().filter(|sub| passes(sub)).count();
        if valid != 1 {
            let found = if valid == 0 {
                "Found none valid".to_string()
            } else {
                format!("Found {valid} valid alternatives")
            };
            errs.push(invalid(
                path,
                v,
                format!("{path} must validate one and only one schema (oneOf). {found}"),
            ));
        }
    }
    if let Some(not) = &s.not
        && passes(not)
    {
        errs.push(invalid(path, v, format!("{path} must not validate the schema (not)")));
    }
}

/// Whether `s` is a string of `format`, for the formats upstream's CRD validation knows
/// (others are not checked, as upstream).
fn format_ok(format: &str, s: &str) -> bool {
    let hex = |t: &str| t.bytes().all(|b| b.is_ascii_hexdigit());
    let uuid = |s: &str, version: Option<char>| {
        let parts: Vec<&str> = s.split('-').collect();
        parts.len() == 5
            && [8, 4, 4, 4, 12]
                .iter()
                .zip(&parts)
                .all(|(n, p)| p.len() == *n && hex(p))
            && version.is_none_or(|v| parts[2].starts_with(v))
    };
    match format {
        "uuid" => uuid(s, None),
        "uuid3" => uuid(s, Some('3')),
        "uuid4" => uuid(s, Some('4')),
        "uuid5" => uuid(s, Some('5')),
        "ipv4" => s.parse::<std::net::Ipv4Addr>().is_ok(),
        "ipv6" => s.parse::<std::net::Ipv6Addr>().is_ok(),
        "cidr" => s.split_once('/').is_some_and(|(ip, len)| {
            let max = if ip.parse::<std::net::Ipv4Addr>().is_ok() {
                32
            } else if ip.parse::<std::net::Ipv6Addr>().is_ok() {
                128
            } else {
                return false;
            };
            len.parse::<u8>().is_ok_and(|l| l <= max) && !len.starts_with('+')
        }),
        "mac" => {
            let parts: Vec<&str> = s.split([':', '-']).collect();
            matches!(parts.len(), 6 | 8 | 20) && parts.iter().all(|p| p.len() == 2 && hex(p))
        }
        "hostname" => {
            !s.is_empty()
                && s.len() <= 253
                && s.split('.').all(|l| {
                    !l.is_empty()
                        && l.len() <= 63
                        && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                        && !l.starts_with('-')
                        && !l.ends_with('-')
                })
        }
        "email" => s
            .rsplit_once('@')
            .is_some_and(|(local, domain)| !local.is_empty() && domain.contains('.') && !domain.starts_with('.')),
        "uri" => s.split_once(':').is_some_and(|(scheme, _)| {
            !scheme.is_empty()
                && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme.bytes().all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
        }),
        "byte" => {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.decode(s).is_ok()
        }
        "date" => s.parse::<jiff::civil::Date>().is_ok() && s.len() == 10,
        "date-time" | "datetime" => s.parse::<jiff::Timestamp>().is_ok(),
        "duration" => !s.is_empty() && go_duration(s),
        "hexcolor" => s
            .strip_prefix('#')
            .is_some_and(|h| (h.len() == 3 || h.len() == 6) && hex(h)),
        _ => true,
    }
}

/// A Go `time.ParseDuration` string (`1h30m`, `250ms`, `-1.5s`, `0`).
fn go_duration(s: &str) -> bool {
    let s = s.strip_prefix(['-', '+']).unwrap_or(s);
    if s == "0" {
        return true;
    }
    let mut rest = s;
    if rest.is_empty() {
        return false;
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if digits == 0 || rest[..digits].chars().filter(|c| *c == '.').count() > 1 {
            return false;
        }
        rest = &rest[digits..];
        let unit = ["ns", "us", "µs", "μs", "ms", "s", "m", "h"]
            .iter()
            .filter(|u| rest.starts_with(*u))
            .max_by_key(|u| u.len());
        match unit {
            Some(u) => rest = &rest[u.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Schema {
        Schema::parse(&json!({
            "type": "object",
            "required": ["spec"],
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["image"],
                    "properties": {
                        "image": {"type": "string", "maxLength": 10, "pattern": "^[a-z]+$"},
                        "replicas": {"type": "integer", "minimum": 1, "maximum": 5},
                        "color": {"type": "string", "enum": ["red", "green"]},
                        "ports": {"type": "array", "maxItems": 2, "items": {"x-kubernetes-int-or-string": true}},
                        "ratio": {"type": "number", "exclusiveMinimum": true, "minimum": 0},
                        "note": {"type": "string", "nullable": true},
                    }
                }
            }
        }))
    }

    fn messages(obj: Value) -> Vec<String> {
        validate(&schema(), &obj).iter().map(ToString::to_string).collect()
    }

    #[test]
    fn composite_keywords_and_formats_are_checked() {
        let s = Schema::parse(&json!({
            "type": "object",
            "properties": {"spec": {"type": "object",
                "oneOf": [{"required": ["url"]}, {"required": ["file"]}],
                "properties": {
                    "url": {"type": "string", "format": "uri"},
                    "file": {"type": "string"},
                    "id": {"type": "string", "format": "uuid"},
                    "at": {"type": "string", "format": "date-time"},
                    "every": {"type": "string", "format": "duration"},
                    "port": {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": "^[a-z]+$"}]},
                    "mode": {"type": "string", "not": {"enum": ["forbidden"]}},
                    "size": {"type": "integer", "allOf": [{"minimum": 1}, {"maximum": 10}]},
                }}}
        }));
        let errors = |spec: Value| -> Vec<String> {
            validate(&s, &json!({"spec": spec}))
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        assert!(
            errors(json!({"url": "https://x", "id": "123e4567-e89b-12d3-a456-426614174000",
            "at": "2026-12-07T10:00:00Z", "every": "1h30m", "port": "http", "mode": "fine", "size": 3}))
            .is_empty()
        );
        let e = errors(json!({"url": "https://x", "file": "f"}));
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].ends_with("spec must validate one and only one schema (oneOf). Found 2 valid alternatives"),
            "{e:?}"
        );
        let e = errors(json!({}));
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].ends_with("spec must validate one and only one schema (oneOf). Found none valid"),
            "{e:?}"
        );
        let e = errors(json!({"file": "f", "id": "nope", "at": "yesterday", "every": "5 days", "url": "no scheme"}));
        assert!(
            e.contains(&"spec.id: Invalid value: \"nope\": spec.id in body must be of type uuid: \"nope\"".to_string()),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|m| m.contains("spec.at in body must be of type date-time")),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|m| m.contains("spec.every in body must be of type duration")),
            "{e:?}"
        );
        assert!(
            e.iter().any(|m| m.contains("spec.url in body must be of type uri")),
            "{e:?}"
        );
        let e = errors(json!({"file": "f", "port": "HTTP", "mode": "forbidden", "size": 11}));
        assert!(
            e.iter()
                .any(|m| m.contains("spec.port must validate at least one schema (anyOf)")),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|m| m.contains("spec.mode must not validate the schema (not)")),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|m| m.contains("spec.size in body should be less than or equal to 10")),
            "{e:?}"
        );
    }

    #[test]
    fn a_valid_object_has_no_errors() {
        assert!(messages(json!({"apiVersion": "x/v1", "kind": "K", "metadata": {}, "spec": {"image": "abc", "replicas": 3, "color": "red", "ports": [80, "http"], "ratio": 0.5, "note": null}})).is_empty());
    }

    #[test]
    fn embedded_resources_need_api_version_and_kind() {
        let s = Schema::parse(
            &json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
                "template": {"type": "object", "x-kubernetes-embedded-resource": true, "x-kubernetes-preserve-unknown-fields": true}
            }}}}),
        );
        let msgs: Vec<String> = validate(&s, &json!({"spec": {"template": {"kind": "Pod"}}}))
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(msgs, ["spec.template.apiVersion: Required value: must not be empty"]);
        assert!(
            validate(
                &s,
                &json!({"spec": {"template": {"apiVersion": "v1", "kind": "Pod", "metadata": {}}}})
            )
            .is_empty()
        );
    }

    #[test]
    fn errors_read_as_upstream() {
        assert_eq!(messages(json!({})), ["spec: Required value"]);
        assert_eq!(messages(json!({"spec": {}})), ["spec.image: Required value"]);
        assert_eq!(
            messages(json!({"spec": {"image": "a", "replicas": "three"}})),
            ["spec.replicas: Invalid value: \"string\": spec.replicas in body must be of type integer: \"string\""]
        );
        assert_eq!(
            messages(json!({"spec": {"image": "a", "replicas": 0}})),
            ["spec.replicas: Invalid value: 0: spec.replicas in body should be greater than or equal to 1"]
        );
        assert_eq!(
            messages(json!({"spec": {"image": "a", "replicas": 6}})),
            ["spec.replicas: Invalid value: 6: spec.replicas in body should be less than or equal to 5"]
        );
        assert_eq!(
            messages(json!({"spec": {"image": "a", "color": "blue"}})),
            ["spec.color: Unsupported value: \"blue\": supported values: \"red\", \"green\""]
        );
        assert_eq!(
            messages(json!({"spec": {"image": "abcdefghijkl"}})),
            ["spec.image: Too long: may not be more than 10 bytes"]
        );
        assert_eq!(
            messages(json!({"spec": {"image": "A1"}})),
            ["spec.image: Invalid value: \"A1\": spec.image in body should match '^[a-z]+$'"]
        );
        assert_eq!(
            messages(json!({"spec": {"image": "a", "ports": [1, 2, 3]}})),
            ["spec.ports: Too many: 3: must have at most 2 items"]
        );
        assert_eq!(
            messages(json!({"spec": {"image": "a", "ports": [true]}})),
            [
                "spec.ports[0]: Invalid value: \"boolean\": spec.ports[0] in body must be of type integer,string: \"boolean\""
            ]
        );
        assert_eq!(
            messages(json!({"spec": {"image": "a", "ratio": 0}})),
            ["spec.ratio: Invalid value: 0: spec.ratio in body should be greater than 0"]
        );
    }
}
