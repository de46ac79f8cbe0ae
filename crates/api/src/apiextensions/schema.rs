//! A version's `openAPIV3Schema` read into the parts that validation, pruning and defaulting
//! use (upstream's structural schema), and the structural checks a definition must pass.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::status::FieldError;

/// One node of a structural schema.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Schema {
    /// `type`: "object", "array", "string", "integer", "number", "boolean", or "" (unset).
    pub ty: String,
    pub format: String,
    pub description: String,
    pub nullable: bool,
    pub properties: BTreeMap<String, Schema>,
    /// `additionalProperties` given as a schema (maps).
    pub additional_properties: Option<Box<Schema>>,
    /// `additionalProperties: true`: any value under any key.
    pub additional_properties_allowed: bool,
    pub items: Option<Box<Schema>>,
    pub required: Vec<String>,
    pub enum_values: Vec<Value>,
    pub minimum: Option<f64>,
    pub exclusive_minimum: bool,
    pub maximum: Option<f64>,
    pub exclusive_maximum: bool,
    pub multiple_of: Option<f64>,
    pub min_length: Option<u64>,
    pub max_length: Option<u64>,
    pub pattern: Option<String>,
    pub min_items: Option<u64>,
    pub max_items: Option<u64>,
    pub unique_items: bool,
    pub min_properties: Option<u64>,
    pub max_properties: Option<u64>,
    pub default: Option<Value>,
    /// `x-kubernetes-preserve-unknown-fields: true`.
    pub preserve_unknown_fields: bool,
    /// `x-kubernetes-int-or-string: true`.
    pub int_or_string: bool,
    /// `x-kubernetes-embedded-resource: true`.
    pub embedded_resource: bool,
    /// `x-kubernetes-list-type`: "atomic", "set", "map" or "".
    pub list_type: String,
    pub list_map_keys: Vec<String>,
    /// `x-kubernetes-validations`: CEL rules checked against the value at this node.
    pub validations: Vec<ValidationRule>,
    /// `allOf`, `anyOf`, `oneOf` and `not`: value validations the value must pass all of, at
    /// least one of, exactly one of, or must not pass.
    pub all_of: Vec<Schema>,
    pub any_of: Vec<Schema>,
    pub one_of: Vec<Schema>,
    pub not: Option<Box<Schema>>,
}

/// One `x-kubernetes-validations` entry.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ValidationRule {
    pub rule: String,
    pub message: String,
    pub message_expression: String,
    /// `FieldValueInvalid` (the default), `FieldValueForbidden`, `FieldValueRequired` or
    /// `FieldValueDuplicate`.
    pub reason: Option<String>,
    pub field_path: String,
    pub optional_old_self: Option<bool>,
}

impl ValidationRule {
    fn parse(v: &Value) -> ValidationRule {
        ValidationRule {
            rule: str_of(v, "rule"),
            message: str_of(v, "message"),
            message_expression: str_of(v, "messageExpression"),
            reason: v.get("reason").and_then(Value::as_str).map(String::from),
            field_path: str_of(v, "fieldPath"),
            optional_old_self: v.get("optionalOldSelf").and_then(Value::as_bool),
        }
    }

    /// The rule as upstream's field errors print it (Go's `%#v` of the internal type).
    pub fn go_repr(&self) -> String {
        let reason = match &self.reason {
            None => "(*apiextensions.FieldValueErrorReason)(nil)".to_string(),
            Some(r) => format!("&\"{r}\""),
        };
        let oos = match self.optional_old_self {
            None => "(*bool)(nil)".to_string(),
            Some(b) => format!("&{b}"),
        };
        format!(
            "apiextensions.ValidationRule{{Rule:{:?}, Message:{:?}, MessageExpression:{:?}, Reason:{reason}, FieldPath:{:?}, OptionalOldSelf:{oos}}}",
            self.rule, self.message, self.message_expression, self.field_path
        )
    }
}

fn u64_of(v: &Value, key: &str) -> Option<u64> {
    v.get(key).and_then(Value::as_u64)
}

fn str_of(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or("").to_string()
}

fn schemas(v: &Value, key: &str) -> Vec<Schema> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter(|s| s.is_object()).map(Schema::parse).collect())
        .unwrap_or_default()
}

fn bool_of(v: &Value, key: &str) -> bool {
    v.get(key).and_then(Value::as_bool).unwrap_or(false)
}

impl Schema {
    /// Read a `JSONSchemaProps` document. Unknown or malformed parts are left out: the
    /// definition was checked by [`structural_errors`] when it was written.
    pub fn parse(v: &Value) -> Schema {
        let properties = v
            .get("properties")
            .and_then(Value::as_object)
            .map(|m| m.iter().map(|(k, s)| (k.clone(), Schema::parse(s))).collect())
            .unwrap_or_default();
        let (additional_properties, additional_properties_allowed) = match v.get("additionalProperties") {
            Some(Value::Bool(b)) => (None, *b),
            Some(s @ Value::Object(_)) => (Some(Box::new(Schema::parse(s))), false),
            _ => (None, false),
        };
        Schema {
            ty: str_of(v, "type"),
            format: str_of(v, "format"),
            description: str_of(v, "description"),
            nullable: bool_of(v, "nullable"),
            properties,
            additional_properties,
            additional_properties_allowed,
            items: v
                .get("items")
                .filter(|i| i.is_object())
                .map(|i| Box::new(Schema::parse(i))),
            required: v
                .get("required")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).map(String::from).collect())
                .unwrap_or_default(),
            enum_values: v.get("enum").and_then(Value::as_array).cloned().unwrap_or_default(),
            minimum: v.get("minimum").and_then(Value::as_f64),
            exclusive_minimum: bool_of(v, "exclusiveMinimum"),
            maximum: v.get("maximum").and_then(Value::as_f64),
            exclusive_maximum: bool_of(v, "exclusiveMaximum"),
            multiple_of: v.get("multipleOf").and_then(Value::as_f64),
            min_length: u64_of(v, "minLength"),
            max_length: u64_of(v, "maxLength"),
            pattern: v.get("pattern").and_then(Value::as_str).map(String::from),
            min_items: u64_of(v, "minItems"),
            max_items: u64_of(v, "maxItems"),
            unique_items: bool_of(v, "uniqueItems"),
            min_properties: u64_of(v, "minProperties"),
            max_properties: u64_of(v, "maxProperties"),
            default: v.get("default").cloned(),
            preserve_unknown_fields: bool_of(v, "x-kubernetes-preserve-unknown-fields"),
            int_or_string: bool_of(v, "x-kubernetes-int-or-string"),
            embedded_resource: bool_of(v, "x-kubernetes-embedded-resource"),
            list_type: str_of(v, "x-kubernetes-list-type"),
            list_map_keys: v
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).map(String::from).collect())
                .unwrap_or_default(),
            validations: v
                .get("x-kubernetes-validations")
                .and_then(Value::as_array)
                .map(|a| a.iter().map(ValidationRule::parse).collect())
                .unwrap_or_default(),
            all_of: schemas(v, "allOf"),
            any_of: schemas(v, "anyOf"),
            one_of: schemas(v, "oneOf"),
            not: v
                .get("not")
                .filter(|n| n.is_object())
                .map(|n| Box::new(Schema::parse(n))),
        }
    }

    /// The schema of a property of this object node (a named property, else
    /// `additionalProperties`).
    pub fn property(&self, key: &str) -> Option<&Schema> {
        self.properties.get(key).or(self.additional_properties.as_deref())
    }
}

const TYPES: &[&str] = &["array", "boolean", "integer", "number", "object", "string"];

/// Upstream's structural schema checks (`ValidateStructural` and the v1 rules of
/// `ValidateCustomResourceDefinitionOpenAPISchema`) on the schema at `path`, which is the
/// root of a version's `openAPIV3Schema`.
pub fn structural_errors(schema: &Value, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if !schema.is_object() {
        errs.push(FieldError::required(path, "schemas are required"));
        return errs;
    }
    let ty = str_of(schema, "type");
    if ty.is_empty() {
        errs.push(FieldError::required(
            format!("{path}.type"),
            "must not be empty at the root",
        ));
    } else if ty != "object" {
        errs.push(FieldError::invalid(
            format!("{path}.type"),
            &Value::String(ty),
            "must be object at the root",
        ));
    }
    check_node(schema, path, true, &mut errs);
    errs
}

fn check_node(s: &Value, path: &str, root: bool, errs: &mut Vec<FieldError>) {
    let ty = str_of(s, "type");
    if !ty.is_empty() && !TYPES.contains(&ty.as_str()) {
        errs.push(FieldError::not_supported(
            format!("{path}.type"),
            &Value::String(ty.clone()),
            TYPES,
        ));
    }
    for forbidden in [
        "$ref",
        "definitions",
        "dependencies",
        "patternProperties",
        "additionalItems",
        "id",
        "$schema",
    ] {
        if s.get(forbidden).is_some() {
            errs.push(FieldError::forbidden(
                format!("{path}.{forbidden}"),
                format!("{forbidden} is not supported"),
            ));
        }
    }
    if bool_of(s, "x-kubernetes-int-or-string") && !ty.is_empty() {
        errs.push(FieldError::invalid(
            format!("{path}.type"),
            &Value::String(ty.clone()),
            "must be empty if x-kubernetes-int-or-string is true",
        ));
    }
    if s.get("properties").is_some() && s.get("additionalProperties").is_some_and(|a| a != &Value::Bool(false)) {
        errs.push(FieldError::forbidden(
            format!("{path}.additionalProperties"),
            "additionalProperties and properties are mutual exclusive",
        ));
    }
    if let Some(items) = s.get("items") {
        if items.is_array() {
            errs.push(FieldError::forbidden(
                format!("{path}.items"),
                "items must be a schema object and not an array",
            ));
        } else {
            needs_type(
                items,
                &format!("{path}.items"),
                "must not be empty for specified array items",
                errs,
            );
            check_node(items, &format!("{path}.items"), false, errs);
        }
    } else if ty == "array" {
        errs.push(FieldError::required(format!("{path}.items"), "must be specified"));
    }
    if let Some(props) = s.get("properties").and_then(Value::as_object) {
        for (k, p) in props {
            let p_path = format!("{path}.properties[{k}]");
            if root && k == "metadata" {
                continue;
            }
            needs_type(p, &p_path, "must not be empty for specified object fields", errs);
            check_node(p, &p_path, false, errs);
        }
    }
    if let Some(a) = s.get("additionalProperties").filter(|a| a.is_object()) {
        let a_path = format!("{path}.additionalProperties");
        needs_type(a, &a_path, "must not be empty for specified object fields", errs);
        check_node(a, &a_path, false, errs);
    }
    errs.extend(super::cel::rule_errors(s, path));
    if let Some(pattern) = s.get("pattern").and_then(Value::as_str)
        && let Err(e) = regex::Regex::new(pattern)
    {
        errs.push(FieldError::invalid(
            format!("{path}.pattern"),
            &Value::String(pattern.to_string()),
            format!("must be a valid regular expression, but isn't: {e}"),
        ));
    }
}

/// A specified node needs a type, unless it is an int-or-string, an embedded resource or
/// preserves unknown fields.
fn needs_type(s: &Value, path: &str, detail: &str, errs: &mut Vec<FieldError>) {
    if str_of(s, "type").is_empty()
        && !bool_of(s, "x-kubernetes-int-or-string")
        && !bool_of(s, "x-kubernetes-embedded-resource")
        && !bool_of(s, "x-kubernetes-preserve-unknown-fields")
    {
        errs.push(FieldError::required(format!("{path}.type"), detail));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn structural_checks_use_upstream_paths_and_messages() {
        let p = "spec.versions[0].schema.openAPIV3Schema";
        let errs = structural_errors(
            &json!({"type": "object", "properties": {"spec": {"properties": {"x": {"type": "string"}}}}}),
            p,
        );
        let msgs: Vec<String> = errs.iter().map(ToString::to_string).collect();
        assert_eq!(
            msgs,
            [
                "spec.versions[0].schema.openAPIV3Schema.properties[spec].type: Required value: must not be empty for specified object fields"
            ]
        );
        let errs = structural_errors(&json!({"type": "string"}), p);
        assert_eq!(
            errs[0].to_string(),
            "spec.versions[0].schema.openAPIV3Schema.type: Invalid value: \"string\": must be object at the root"
        );
        assert!(
            structural_errors(
                &json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
                p
            )
            .is_empty()
        );
        let errs = structural_errors(&json!({"type": "object", "properties": {"a": {"type": "array"}}}), p);
        assert_eq!(
            errs[0].to_string(),
            "spec.versions[0].schema.openAPIV3Schema.properties[a].items: Required value: must be specified"
        );
    }

    #[test]
    fn parse_reads_extensions() {
        let s = Schema::parse(&json!({
            "type": "object",
            "properties": {"port": {"x-kubernetes-int-or-string": true}, "m": {"type": "object", "additionalProperties": {"type": "string"}}},
            "x-kubernetes-preserve-unknown-fields": true,
        }));
        assert!(s.preserve_unknown_fields);
        assert!(s.properties["port"].int_or_string);
        assert_eq!(
            s.properties["m"].property("anything").map(|p| p.ty.as_str()),
            Some("string")
        );
    }
}
