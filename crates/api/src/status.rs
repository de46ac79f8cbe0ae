//! `Status` errors in upstream's form (reason, code, message, details and causes),
//! and field errors as `k8s.io/apimachinery/pkg/util/validation/field` prints them.

use serde_json::{Value, json};

/// One cause of an error: `{reason, message, field}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    pub reason: String,
    pub message: String,
    pub field: String,
}

/// An error the API answers with. Callers branch on `reason`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct StatusError {
    pub code: u16,
    /// Upstream's `StatusReason`: NotFound, AlreadyExists, Conflict, Invalid, BadRequest, ...
    pub reason: String,
    pub message: String,
    /// `details.name`, `details.group`, `details.kind` (the resource plural, as upstream).
    pub details: Box<Details>,
}

/// `details` of a Status: boxed, so the error stays small on every `Result` it travels in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Details {
    pub name: Option<String>,
    pub group: Option<String>,
    pub kind: Option<String>,
    pub causes: Vec<Cause>,
    /// `details.retryAfterSeconds` (429, 500 "try again").
    pub retry_after_seconds: Option<u32>,
}

impl StatusError {
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        StatusError {
            code,
            reason: reason.to_string(),
            message: message.into(),
            details: Box::default(),
        }
    }

    fn with_details(mut self, group: &str, plural: &str, name: &str) -> Self {
        if !group.is_empty() {
            self.details.group = Some(group.to_string());
        }
        self.details.kind = Some(plural.to_string());
        if !name.is_empty() {
            self.details.name = Some(name.to_string());
        }
        self
    }

    /// `pods "x" not found` (qualified: `deployments.apps "x" not found`).
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        let q = qualified(group, plural);
        StatusError::new(404, "NotFound", format!("{q} \"{name}\" not found")).with_details(group, plural, name)
    }

    /// `pods "x" already exists`.
    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        let q = qualified(group, plural);
        StatusError::new(409, "AlreadyExists", format!("{q} \"{name}\" already exists"))
            .with_details(group, plural, name)
    }

    /// `Operation cannot be fulfilled on pods "x": <detail>`.
    pub fn conflict(group: &str, plural: &str, name: &str, detail: &str) -> Self {
        let q = qualified(group, plural);
        StatusError::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {q} \"{name}\": {detail}"),
        )
        .with_details(group, plural, name)
    }

    /// The optimistic-concurrency conflict message upstream sends.
    pub fn modified(group: &str, plural: &str, name: &str) -> Self {
        Self::conflict(
            group,
            plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422: `Pod "x" is invalid: <errors>`; `kind` is the Kind ("Pod"), as upstream. The
    /// message names each distinct error once (upstream's `ErrorList.ToAggregate`), the causes
    /// list every one.
    pub fn invalid(group: &str, kind: &str, name: &str, errs: &[FieldError]) -> Self {
        let qualified_kind = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let mut messages: Vec<String> = Vec::with_capacity(errs.len());
        for e in errs {
            let m = e.to_string();
            if !messages.contains(&m) {
                messages.push(m);
            }
        }
        let list = if messages.len() == 1 {
            messages.swap_remove(0)
        } else {
            format!("[{}]", messages.join(", "))
        };
        let mut e = StatusError::new(
            422,
            "Invalid",
            format!("{qualified_kind} \"{name}\" is invalid: {list}"),
        );
        if !group.is_empty() {
            e.details.group = Some(group.to_string());
        }
        e.details.kind = Some(kind.to_string());
        e.details.name = Some(name.to_string());
        e.details.causes = errs
            .iter()
            .map(|f| Cause {
                reason: f.kind.reason().to_string(),
                message: f.body(),
                field: f.field.clone(),
            })
            .collect();
        e
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        StatusError::new(400, "BadRequest", message)
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        StatusError::new(405, "MethodNotAllowed", message)
    }

    pub fn unauthorized() -> Self {
        StatusError::new(401, "Unauthorized", "Unauthorized")
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        StatusError::new(403, "Forbidden", message)
    }

    /// Upstream's `NewForbidden`: `pods "x" is forbidden: ERR`, `pods is forbidden: ERR` without
    /// a name, `forbidden: ERR` without a resource.
    pub fn forbidden_resource(group: &str, resource: &str, name: &str, err: &str) -> Self {
        if resource.is_empty() && group.is_empty() {
            return StatusError::forbidden(format!("forbidden: {err}"));
        }
        let q = qualified(group, resource);
        let message = if name.is_empty() {
            format!("{q} is forbidden: {err}")
        } else {
            format!("{q} \"{name}\" is forbidden: {err}")
        };
        StatusError::forbidden(message).with_details(group, resource, name)
    }

    /// 410 for a resourceVersion or continue token that is too old.
    pub fn expired(message: impl Into<String>) -> Self {
        StatusError::new(410, "Expired", message)
    }

    /// 410 Gone, used by watch for a compacted resourceVersion.
    pub fn gone(message: impl Into<String>) -> Self {
        StatusError::new(410, "Expired", message)
    }

    pub fn too_large(message: impl Into<String>) -> Self {
        StatusError::new(413, "RequestEntityTooLarge", message)
    }

    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        StatusError::new(415, "UnsupportedMediaType", message)
    }

    pub fn too_many_requests(message: impl Into<String>) -> Self {
        StatusError::new(429, "TooManyRequests", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        StatusError::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
        )
    }

    pub fn timeout(message: impl Into<String>) -> Self {
        StatusError::new(504, "Timeout", message)
    }

    /// The `Status` object sent on the wire.
    pub fn to_json(&self) -> Value {
        let mut details = serde_json::Map::new();
        if let Some(n) = &self.details.name {
            details.insert("name".into(), json!(n));
        }
        if let Some(g) = &self.details.group {
            details.insert("group".into(), json!(g));
        }
        if let Some(k) = &self.details.kind {
            details.insert("kind".into(), json!(k));
        }
        if !self.details.causes.is_empty() {
            details.insert(
                "causes".into(),
                Value::Array(
                    self.details
                        .causes
                        .iter()
                        .map(|c| {
                            let mut m = serde_json::Map::new();
                            m.insert("reason".into(), json!(c.reason));
                            m.insert("message".into(), json!(c.message));
                            if !c.field.is_empty() {
                                m.insert("field".into(), json!(c.field));
                            }
                            Value::Object(m)
                        })
                        .collect(),
                ),
            );
        }
        if let Some(r) = self.details.retry_after_seconds {
            details.insert("retryAfterSeconds".into(), json!(r));
        }
        let mut m = serde_json::Map::new();
        m.insert("kind".into(), json!("Status"));
        m.insert("apiVersion".into(), json!("v1"));
        m.insert("metadata".into(), json!({}));
        m.insert("status".into(), json!("Failure"));
        m.insert("message".into(), json!(self.message));
        m.insert("reason".into(), json!(self.reason));
        if !details.is_empty() {
            m.insert("details".into(), Value::Object(details));
        }
        m.insert("code".into(), json!(self.code));
        Value::Object(m)
    }
}

fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

/// The kinds of field error upstream distinguishes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FieldErrorKind {
    Required,
    /// The offending value, already rendered as upstream renders it (strings quoted).
    Invalid(String),
    NotSupported {
        value: String,
        supported: Vec<String>,
    },
    Forbidden,
    Duplicate(String),
    NotFound(String),
    TooLong(usize),
    TypeInvalid(String),
    /// `Too many: N: must have at most MAX items`: the count found and the most allowed.
    TooMany(usize, usize),
}

impl FieldErrorKind {
    pub fn reason(&self) -> &'static str {
        match self {
            FieldErrorKind::Required => "FieldValueRequired",
            FieldErrorKind::Invalid(_) => "FieldValueInvalid",
            FieldErrorKind::NotSupported { .. } => "FieldValueNotSupported",
            FieldErrorKind::Forbidden => "FieldValueForbidden",
            FieldErrorKind::Duplicate(_) => "FieldValueDuplicate",
            FieldErrorKind::NotFound(_) => "FieldValueNotFound",
            FieldErrorKind::TooLong(_) => "FieldValueTooLong",
            FieldErrorKind::TypeInvalid(_) => "FieldValueTypeInvalid",
            FieldErrorKind::TooMany(..) => "FieldValueTooMany",
        }
    }
}

/// A validation error at a field path such as `spec.containers[0].image`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub kind: FieldErrorKind,
    pub field: String,
    pub detail: String,
}

/// Render a JSON value as upstream's field errors do (`"x"` for strings, `2` for numbers).
pub fn render_value(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Null => "null".to_string(),
        other => other.to_string(),
    }
}

impl FieldError {
    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            kind: FieldErrorKind::Required,
            field: field.into(),
            detail: detail.into(),
        }
    }
    pub fn invalid(field: impl Into<String>, value: &Value, detail: impl Into<String>) -> Self {
        FieldError {
            kind: FieldErrorKind::Invalid(render_value(value)),
            field: field.into(),
            detail: detail.into(),
        }
    }
    pub fn not_supported(field: impl Into<String>, value: &Value, supported: &[&str]) -> Self {
        FieldError {
            kind: FieldErrorKind::NotSupported {
                value: render_value(value),
                supported: supported.iter().map(|s| format!("{s:?}")).collect(),
            },
            field: field.into(),
            detail: String::new(),
        }
    }
    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            kind: FieldErrorKind::Forbidden,
            field: field.into(),
            detail: detail.into(),
        }
    }
    pub fn duplicate(field: impl Into<String>, value: &Value) -> Self {
        FieldError {
            kind: FieldErrorKind::Duplicate(render_value(value)),
            field: field.into(),
            detail: String::new(),
        }
    }
    pub fn not_found(field: impl Into<String>, value: &Value) -> Self {
        FieldError {
            kind: FieldErrorKind::NotFound(render_value(value)),
            field: field.into(),
            detail: String::new(),
        }
    }
    pub fn too_long(field: impl Into<String>, max: usize) -> Self {
        FieldError {
            kind: FieldErrorKind::TooLong(max),
            field: field.into(),
            detail: String::new(),
        }
    }

    /// The message without the field path (what `details.causes[].message` carries).
    pub fn body(&self) -> String {
        let head = match &self.kind {
            FieldErrorKind::Required => "Required value".to_string(),
            FieldErrorKind::Invalid(v) => format!("Invalid value: {v}"),
            FieldErrorKind::NotSupported { value, supported } => {
                if supported.is_empty() {
                    format!("Unsupported value: {value}")
                } else {
                    format!("Unsupported value: {value}: supported values: {}", supported.join(", "))
                }
            }
            FieldErrorKind::Forbidden => "Forbidden".to_string(),
            FieldErrorKind::Duplicate(v) => format!("Duplicate value: {v}"),
            FieldErrorKind::NotFound(v) => format!("Not found: {v}"),
            FieldErrorKind::TooLong(max) => format!("Too long: may not be more than {max} bytes"),
            FieldErrorKind::TypeInvalid(v) => format!("Invalid value: {v}"),
            FieldErrorKind::TooMany(n, max) => format!("Too many: {n}: must have at most {max} items"),
        };
        if self.detail.is_empty() {
            head
        } else {
            format!("{head}: {}", self.detail)
        }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_message_matches_upstream() {
        let e = StatusError::invalid(
            "",
            "Pod",
            "x",
            &[FieldError::invalid(
                "spec.containers[0].resources.requests",
                &json!("2"),
                "must be less than or equal to cpu limit of 1",
            )],
        );
        assert_eq!(
            e.message,
            "Pod \"x\" is invalid: spec.containers[0].resources.requests: Invalid value: \"2\": must be less than or equal to cpu limit of 1"
        );
        let j = e.to_json();
        assert_eq!(j["code"], 422);
        assert_eq!(j["details"]["causes"][0]["reason"], "FieldValueInvalid");
        assert_eq!(
            j["details"]["causes"][0]["field"],
            "spec.containers[0].resources.requests"
        );
    }

    #[test]
    fn invalid_message_names_repeated_errors_once() {
        let twice = FieldError::required("subjects[0].name", "");
        let other = FieldError::invalid("roleRef", &json!("x"), "cannot change roleRef");
        let e = StatusError::invalid(
            "rbac.authorization.k8s.io",
            "RoleBinding",
            "b",
            &[twice.clone(), twice.clone()],
        );
        assert_eq!(
            e.message,
            "RoleBinding.rbac.authorization.k8s.io \"b\" is invalid: subjects[0].name: Required value"
        );
        assert_eq!(e.details.causes.len(), 2, "every error is a cause");
        let e = StatusError::invalid("", "Pod", "p", &[twice.clone(), other, twice]);
        assert_eq!(
            e.message,
            "Pod \"p\" is invalid: [subjects[0].name: Required value, roleRef: Invalid value: \"x\": cannot change roleRef]"
        );
        assert_eq!(e.details.causes.len(), 3);
    }

    #[test]
    fn not_found_qualified() {
        let e = StatusError::not_found("apps", "deployments", "web");
        assert_eq!(e.message, "deployments.apps \"web\" not found");
        assert_eq!(e.to_json()["details"]["group"], "apps");
        let c = StatusError::modified("", "pods", "p1");
        assert_eq!(
            c.message,
            "Operation cannot be fulfilled on pods \"p1\": the object has been modified; please apply your changes to the latest version and try again"
        );
    }
}
