//! Patches: JSON patch (RFC 6902), merge patch (RFC 7386), strategic merge patch and
//! server-side apply.
//!
//! Every function works on `serde_json::Value` objects. Errors carry the HTTP status the
//! API server answers with ([`PatchError::code`], [`PatchError::to_status`]).
//!
//! How a write uses it (the definition comes from [`crate::schema::definition_for`]):
//! - PATCH: [`PatchType::from_content_type`] (None: 415); JSON, merge and strategic patches
//!   go through [`patch()`] on the stored object, then [`update_managed_fields`] records the
//!   request's field manager (`?fieldManager=`, else derived from the user agent as upstream).
//! - PATCH with `application/apply-patch+yaml`: [`decode_apply_body`], then [`apply()`]
//!   with `?fieldManager=` (required) and `?force=`; a missing object is created from the
//!   configuration (`live` None). [`ApplyError`] converts into [`PatchError`].
//! - POST / PUT: [`update_managed_fields`] with the stored object (None on create).
//!
//! Defaulting, validation and status resets run after these, on the returned object.

pub mod apply;
pub mod json;
pub mod merge;
pub mod meta;
pub mod strategic;
mod typed;

use serde_json::Value;

pub use apply::{ApplyError, Conflict, apply, decode_apply_body, update_managed_fields};
pub use json::json_patch;
pub use merge::merge_patch;
pub use strategic::strategic_merge;

use crate::status::{Cause, StatusError};

/// The patch formats the API server accepts, by request content type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    /// `application/json-patch+json` (RFC 6902)
    Json,
    /// `application/merge-patch+json` (RFC 7386)
    Merge,
    /// `application/strategic-merge-patch+json`
    Strategic,
    /// `application/apply-patch+yaml` (server-side apply)
    Apply,
}

impl PatchType {
    /// The patch type of a request's `Content-Type` (parameters such as `charset` ignored).
    pub fn from_content_type(content_type: &str) -> Option<PatchType> {
        let media = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        match media.as_str() {
            "application/json-patch+json" => Some(PatchType::Json),
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml" => Some(PatchType::Apply),
            _ => None,
        }
    }

    /// The content type of this patch format.
    pub fn content_type(self) -> &'static str {
        match self {
            PatchType::Json => "application/json-patch+json",
            PatchType::Merge => "application/merge-patch+json",
            PatchType::Strategic => "application/strategic-merge-patch+json",
            PatchType::Apply => "application/apply-patch+yaml",
        }
    }

    /// The content types the API server lists as accepted for PATCH (415 answers).
    pub fn accepted() -> [&'static str; 4] {
        [
            PatchType::Json.content_type(),
            PatchType::Merge.content_type(),
            PatchType::Strategic.content_type(),
            PatchType::Apply.content_type(),
        ]
    }
}

/// Why a patch could not be applied.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PatchError {
    /// The patch document itself is malformed (400 BadRequest).
    #[error("{0}")]
    BadRequest(String),
    /// The patch is well formed but does not apply to the object, e.g. a failed JSON patch
    /// `test` or a path that does not exist (422, upstream's generic 422 response).
    #[error("{0}")]
    Unprocessable(String),
    /// Server-side apply found fields owned by other managers (409 Conflict).
    #[error("{}", apply::conflict_message(.0))]
    Conflict(Vec<Conflict>),
}

impl PatchError {
    /// The HTTP status code the API server answers with.
    pub fn code(&self) -> u16 {
        match self {
            PatchError::BadRequest(_) => 400,
            PatchError::Unprocessable(_) => 422,
            PatchError::Conflict(_) => 409,
        }
    }

    /// The `Status` the API server answers with, as upstream builds it.
    pub fn to_status(&self) -> StatusError {
        match self {
            PatchError::BadRequest(m) => StatusError::bad_request(m.clone()),
            PatchError::Unprocessable(m) => StatusError::new(422, "Invalid", m.clone()),
            PatchError::Conflict(conflicts) => {
                let mut s = StatusError::new(409, "Conflict", apply::conflict_message(conflicts));
                s.details.causes = conflicts
                    .iter()
                    .map(|c| Cause {
                        reason: "FieldManagerConflict".to_string(),
                        message: c.cause_message(),
                        field: c.field.clone(),
                    })
                    .collect();
                s
            }
        }
    }
}

impl From<ApplyError> for PatchError {
    fn from(e: ApplyError) -> Self {
        match e {
            ApplyError::Conflict(c) => PatchError::Conflict(c),
            ApplyError::BadRequest(m) => PatchError::BadRequest(m),
            ApplyError::Invalid(m) => PatchError::Unprocessable(m),
        }
    }
}

/// Apply a JSON, merge or strategic merge patch (already parsed) to `original`.
/// `definition` names the object's schema ([`crate::schema::definition_for`]); strategic
/// merge patches need it. Server-side apply goes through [`apply()`] instead.
pub fn patch(patch_type: PatchType, original: &Value, patch: &Value, definition: &str) -> Result<Value, PatchError> {
    match patch_type {
        PatchType::Json => json_patch(original, patch),
        PatchType::Merge => merge_patch(original, patch),
        PatchType::Strategic => strategic_merge(original, patch, definition),
        PatchType::Apply => Err(PatchError::BadRequest(
            "server-side apply needs a field manager: use patch::apply".to_string(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn content_types() {
        assert_eq!(
            PatchType::from_content_type("application/json-patch+json"),
            Some(PatchType::Json)
        );
        assert_eq!(
            PatchType::from_content_type("application/merge-patch+json; charset=utf-8"),
            Some(PatchType::Merge)
        );
        assert_eq!(
            PatchType::from_content_type("application/strategic-merge-patch+json"),
            Some(PatchType::Strategic)
        );
        assert_eq!(
            PatchType::from_content_type("application/apply-patch+yaml"),
            Some(PatchType::Apply)
        );
        assert_eq!(PatchType::from_content_type("application/apply-patch+cbor"), None);
        assert_eq!(PatchType::from_content_type("application/json"), None);
    }

    #[test]
    fn dispatches_by_type() {
        let pod = json!({"metadata": {"name": "p", "labels": {"a": "1"}}});
        let out = patch(
            PatchType::Merge,
            &pod,
            &json!({"metadata": {"labels": {"a": null}}}),
            "io.k8s.api.core.v1.Pod",
        )
        .expect("merge");
        assert_eq!(out, json!({"metadata": {"name": "p", "labels": {}}}));
        let err = patch(
            PatchType::Json,
            &pod,
            &json!([{"op": "test", "path": "/metadata/name", "value": "q"}]),
            "io.k8s.api.core.v1.Pod",
        )
        .expect_err("test fails");
        assert_eq!(err.code(), 422);
        assert_eq!(err.to_status().code, 422);
    }
}
