//! `x-kubernetes-validations`: CEL rules on a schema node, as upstream's
//! `apiextensions-apiserver/pkg/apiserver/schema/cel`: compiled when the definition is written
//! (a rule that does not compile refuses the definition), and evaluated on every create and
//! update with `self` the value at the node and `oldSelf` its previous value. A transition
//! rule (one that uses `oldSelf`) runs only when there is a previous value to compare with
//! (an update, and the node correlates with the old object: object properties by name,
//! `map` lists by their keys, `set` lists by value), unless `optionalOldSelf` is set.

use serde_json::{Map, Value};

use super::schema::{Schema, ValidationRule};
use crate::cel::{self, EvalError};
use crate::status::{FieldError, FieldErrorKind, render_value};

/// The variables a rule sees.
const VARS: &[&str] = &["self", "oldSelf"];

const REASONS: &[&str] = &[
    "FieldValueInvalid",
    "FieldValueForbidden",
    "FieldValueRequired",
    "FieldValueDuplicate",
];

/// The definition-time problems of the rules on the schema node `s` (JSON) at `path`.
pub fn rule_errors(s: &Value, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let Some(rules) = s.get("x-kubernetes-validations").and_then(Value::as_array) else {
        return errs;
    };
    let schema = Schema::parse(s);
    for (i, (raw, rule)) in rules.iter().zip(&schema.validations).enumerate() {
        let at = format!("{path}.x-kubernetes-validations[{i}]");
        if !raw.is_object() {
            continue;
        }
        if rule.rule.trim().is_empty() {
            errs.push(FieldError::required(format!("{at}.rule"), "rule is not specified"));
        } else if let Err(e) = cel::compile(&rule.rule, VARS) {
            errs.push(FieldError {
                kind: FieldErrorKind::Invalid(rule.go_repr()),
                field: format!("{at}.rule"),
                detail: format!("compilation failed: {e}"),
            });
        }
        if rule.message.contains('\n') || rule.message.contains('\r') {
            errs.push(FieldError::invalid(
                format!("{at}.message"),
                &Value::String(rule.message.clone()),
                "message must not contain line breaks",
            ));
        }
        if !rule.message_expression.is_empty()
            && let Err(e) = cel::compile(&rule.message_expression, VARS)
        {
            errs.push(FieldError::invalid(
                format!("{at}.messageExpression"),
                &Value::String(rule.message_expression.clone()),
                format!("messageExpression compilation failed: {e}"),
            ));
        }
        if let Some(r) = &rule.reason
            && !REASONS.contains(&r.as_str())
        {
            errs.push(FieldError::not_supported(
                format!("{at}.reason"),
                &Value::String(r.clone()),
                REASONS,
            ));
        }
        if !rule.field_path.is_empty()
            && let Err(e) = field_path(&schema, &rule.field_path)
        {
            errs.push(FieldError::invalid(
                format!("{at}.fieldPath"),
                &Value::String(rule.field_path.clone()),
                format!("fieldPath must be a valid path: {e}"),
            ));
        }
    }
    errs
}

/// A rule's `fieldPath` (`.spec.x`, `.m['key']`) checked against the schema, as the field
/// path its errors are reported at (`spec.x`, `m[key]`).
fn field_path(schema: &Schema, p: &str) -> Result<String, &'static str> {
    let mut out = String::new();
    let mut s = schema;
    let mut rest = p;
    while !rest.is_empty() {
        let (name, named, next) = if let Some(r) = rest.strip_prefix("['") {
            let end = r.find("']").ok_or("unexpected end of JSON path")?;
            (&r[..end], !s.properties.is_empty(), &r[end + 2..])
        } else if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            if end == 0 {
                return Err("unexpected end of JSON path");
            }
            (&r[..end], true, &r[end..])
        } else {
            return Err("expected . or [");
        };
        if named && s.properties.contains_key(name) {
            s = &s.properties[name];
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(name);
        } else if let Some(ap) = s.additional_properties.as_deref() {
            s = ap;
            out.push_str(&format!("[{name}]"));
        } else {
            return Err("does not refer to a valid field");
        }
        rest = next;
    }
    Ok(out)
}

/// Every rule of `schema` (the root of `openAPIV3Schema`) evaluated over `obj`, with `old`
/// the object before an update.
pub fn validate(schema: &Schema, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if !has_rules(schema) {
        return errs;
    }
    // At the root, metadata shows only its name and generateName, as upstream's.
    let root = |o: &Value| -> Value {
        let mut o = o.clone();
        if let Some(m) = o.as_object_mut()
            && let Some(md) = m.get("metadata").and_then(Value::as_object)
        {
            let kept: Map<String, Value> = md
                .iter()
                .filter(|(k, _)| matches!(k.as_str(), "name" | "generateName"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            m.insert("metadata".into(), Value::Object(kept));
        }
        o
    };
    let obj = root(obj);
    let old = old.map(root);
    walk(schema, &obj, old.as_ref(), "", &mut errs);
    errs
}

/// Whether any node of the schema has rules (most have none: nothing is walked then).
pub fn has_rules(s: &Schema) -> bool {
    !s.validations.is_empty()
        || s.properties.values().any(has_rules)
        || s.additional_properties.as_deref().is_some_and(has_rules)
        || s.items.as_deref().is_some_and(has_rules)
}

fn child_path(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

fn walk(s: &Schema, v: &Value, old: Option<&Value>, path: &str, errs: &mut Vec<FieldError>) {
    if v.is_null() {
        return;
    }
    if !s.validations.is_empty() {
        check_rules(s, v, old, path, errs);
    }
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                let (cs, cp) = match s.properties.get(k) {
                    Some(cs) => (cs, child_path(path, k)),
                    None => match s.additional_properties.as_deref() {
                        Some(cs) => (cs, format!("{path}[{k}]")),
                        None => continue,
                    },
                };
                if !has_rules(cs) {
                    continue;
                }
                let old_child = old.and_then(|o| o.get(k));
                walk(cs, child, old_child, &cp, errs);
            }
        }
        Value::Array(items) => {
            let Some(is) = s.items.as_deref() else { return };
            if !has_rules(is) {
                return;
            }
            let old_items = old.and_then(Value::as_array);
            for (i, item) in items.iter().enumerate() {
                let old_item = old_items.and_then(|o| correlate(s, item, o));
                walk(is, item, old_item, &format!("{path}[{i}]"), errs);
            }
        }
        _ => {}
    }
}

/// The old element an element of a list corresponds to: by keys for `map` lists, by value
/// for `set` lists; atomic lists have no correlation.
fn correlate<'a>(s: &Schema, item: &Value, old: &'a [Value]) -> Option<&'a Value> {
    match s.list_type.as_str() {
        "map" if !s.list_map_keys.is_empty() => old
            .iter()
            .find(|o| s.list_map_keys.iter().all(|k| o.get(k) == item.get(k))),
        "set" => old.iter().find(|o| *o == item),
        _ => None,
    }
}

/// upstream's `ruleErrorString`: the message if there is one, else the rule.
fn rule_string(r: &ValidationRule) -> String {
    if r.message.trim().is_empty() {
        r.rule.trim().to_string()
    } else {
        r.message.trim().to_string()
    }
}

fn check_rules(s: &Schema, v: &Value, old: Option<&Value>, path: &str, errs: &mut Vec<FieldError>) {
    let shown_path = if path.is_empty() { "<nil>" } else { path };
    let ty = if s.ty.is_empty() { "object" } else { s.ty.as_str() };
    let ty_value = render_value(&Value::String(ty.to_string()));
    let invalid = |field: &str, detail: String| FieldError {
        kind: FieldErrorKind::Invalid(ty_value.clone()),
        field: field.to_string(),
        detail,
    };
    for rule in &s.validations {
        let Ok(program) = cel::compile(&rule.rule, VARS) else {
            errs.push(invalid(shown_path, "rule compile error".to_string()));
            continue;
        };
        let optional_old = rule.optional_old_self == Some(true);
        if program.uses("oldSelf") && old.is_none() && !optional_old {
            continue;
        }
        let null = Value::Null;
        let vars = [("self", v), ("oldSelf", old.unwrap_or(&null))];
        match program.eval_bool(&vars) {
            Ok(true) => {}
            Ok(false) => {
                let field = if rule.field_path.is_empty() {
                    shown_path.to_string()
                } else {
                    let sub = field_path(s, &rule.field_path).unwrap_or_default();
                    match (path.is_empty(), sub.starts_with('[')) {
                        (true, _) => sub,
                        (false, true) => format!("{path}{sub}"),
                        (false, false) => format!("{path}.{sub}"),
                    }
                };
                let mut detail = None;
                if !rule.message_expression.is_empty()
                    && let Ok(p) = cel::compile(&rule.message_expression, VARS)
                    && let Ok(::cel::Value::String(m)) = p.eval(&vars)
                    && !m.trim().is_empty()
                    && !m.contains('\n')
                {
                    detail = Some(m.trim().to_string());
                }
                let detail = detail.unwrap_or_else(|| {
                    if rule.message.trim().is_empty() {
                        format!("failed rule: {}", rule_string(rule))
                    } else {
                        rule.message.trim().to_string()
                    }
                });
                errs.push(match rule.reason.as_deref() {
                    Some("FieldValueForbidden") => FieldError::forbidden(field, detail),
                    Some("FieldValueRequired") => FieldError::required(field, detail),
                    Some("FieldValueDuplicate") => FieldError {
                        kind: FieldErrorKind::Duplicate(ty_value.clone()),
                        field,
                        detail: String::new(),
                    },
                    _ => invalid(&field, detail),
                });
            }
            Err(EvalError::NoSuchOverload) => errs.push(invalid(
                shown_path,
                format!(
                    "'no such overload': call arguments did not match a supported operator, function or macro signature for rule: {}",
                    rule_string(rule)
                ),
            )),
            Err(e @ EvalError::CostLimit) => {
                errs.push(invalid(
                    shown_path,
                    format!(
                        "'{e}': no further validation rules will be run due to call cost exceeds limit for rule: {}",
                        rule_string(rule)
                    ),
                ));
                return;
            }
            Err(e) => errs.push(invalid(
                shown_path,
                format!("{e} evaluating rule: {}", rule_string(rule)),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "properties": {"spec": {
            "type": "object",
            "x-kubernetes-validations": [
                {"rule": "self.replicas <= 5", "message": "replicas must be <= 5"},
                {"rule": "self.mode == oldSelf.mode", "message": "mode is immutable"},
                {"rule": "!has(self.name) || self.name.startsWith('w')"},
                {"rule": "self.replicas != 4", "messageExpression": "'replicas ' + string(self.replicas) + ' is unlucky'", "fieldPath": ".replicas", "reason": "FieldValueForbidden"},
            ],
            "properties": {
                "replicas": {"type": "integer"},
                "mode": {"type": "string"},
                "name": {"type": "string"},
                "items": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["k"],
                    "items": {"type": "object", "properties": {"k": {"type": "string"}, "v": {"type": "integer",
                        "x-kubernetes-validations": [{"rule": "self >= oldSelf", "message": "v may only grow"}]}}}},
            },
        }}})
    }

    fn msgs(obj: &Value, old: Option<&Value>) -> Vec<String> {
        let s = Schema::parse(&schema());
        validate(&s, obj, old).iter().map(ToString::to_string).collect()
    }

    #[test]
    fn rules_refuse_with_upstream_messages() {
        let ok = json!({"spec": {"replicas": 3, "mode": "a"}});
        assert!(msgs(&ok, None).is_empty());
        let bad = json!({"spec": {"replicas": 6, "mode": "a", "name": "x"}});
        assert_eq!(
            msgs(&bad, None),
            [
                "spec: Invalid value: \"object\": replicas must be <= 5",
                "spec: Invalid value: \"object\": failed rule: !has(self.name) || self.name.startsWith('w')",
            ]
        );
        let four = json!({"spec": {"replicas": 4, "mode": "a"}});
        assert_eq!(msgs(&four, None), ["spec.replicas: Forbidden: replicas 4 is unlucky"]);
        let missing = json!({"spec": {"mode": "a"}});
        assert_eq!(
            msgs(&missing, None)[0],
            "spec: Invalid value: \"object\": no such key: replicas evaluating rule: replicas must be <= 5"
        );
    }

    #[test]
    fn transition_rules_run_only_against_an_old_value() {
        let old = json!({"spec": {"replicas": 1, "mode": "a", "items": [{"k": "x", "v": 2}]}});
        let new = json!({"spec": {"replicas": 1, "mode": "b", "items": [{"k": "y", "v": 0}, {"k": "x", "v": 1}]}});
        assert!(msgs(&new, None).is_empty());
        assert_eq!(
            msgs(&new, Some(&old)),
            [
                "spec: Invalid value: \"object\": mode is immutable",
                "spec.items[1].v: Invalid value: \"integer\": v may only grow",
            ]
        );
    }

    #[test]
    fn rules_that_do_not_compile_refuse_the_definition() {
        let s = json!({"type": "object", "x-kubernetes-validations": [
            {"rule": "self.replicas <<= 5"}, {"rule": "nope > 1"}, {"rule": "true", "reason": "Bad", "fieldPath": ".x"},
        ]});
        let errs: Vec<String> = rule_errors(&s, "spec.validation.openAPIV3Schema.properties[spec]")
            .iter()
            .map(ToString::to_string)
            .collect();
        assert!(errs[0].starts_with(
            "spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule: Invalid value: apiextensions.ValidationRule{Rule:\"self.replicas <<= 5\", Message:\"\", MessageExpression:\"\", Reason:(*apiextensions.FieldValueErrorReason)(nil), FieldPath:\"\", OptionalOldSelf:(*bool)(nil)}: compilation failed: ERROR: <input>:1:"
        ), "{}", errs[0]);
        assert!(
            errs[1]
                .ends_with("compilation failed: ERROR: <input>:1:1: undeclared reference to 'nope' (in container '')"),
            "{}",
            errs[1]
        );
        assert!(
            errs[2].contains("x-kubernetes-validations[2].reason: Unsupported value: \"Bad\""),
            "{}",
            errs[2]
        );
        assert!(errs[3].contains("x-kubernetes-validations[2].fieldPath: Invalid value: \".x\": fieldPath must be a valid path: does not refer to a valid field"), "{}", errs[3]);
    }
}
