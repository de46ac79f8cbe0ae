//! get and list.

use axum::response::Response;
use base64::Engine;
use http::StatusCode;
use serde_json::{Value, json};
use skiff_api::StatusError;
use skiff_api::selector::{FieldSelector, LabelSelector};
use skiff_store::{KeyValue, ListOptions, Revision, StoreError};

use crate::body::{self, Output};
use crate::handlers::{Ctx, render_one};
use crate::objects;

/// Map a store error to the Status the client sees.
pub fn store_error(ctx_group: &str, plural: &str, name: &str, e: StoreError) -> StatusError {
    match e {
        StoreError::NotFound(_) => StatusError::not_found(ctx_group, plural, name),
        StoreError::AlreadyExists(_) => StatusError::already_exists(ctx_group, plural, name),
        StoreError::Conflict { .. } => StatusError::modified(ctx_group, plural, name),
        StoreError::Compacted { requested, compacted } => {
            StatusError::expired(format!("too old resource version: {requested} ({compacted})"))
        }
        StoreError::FutureRevision(rev) => {
            let mut e = StatusError::timeout(format!("Too large resource version: {rev}, current: unknown"));
            e.details.retry_after_seconds = Some(1);
            e
        }
        StoreError::Backend(e) => StatusError::internal(format!("{e:#}")),
    }
}

impl Ctx {
    pub fn store_err(&self, e: StoreError) -> StatusError {
        store_error(self.rr.resource.group, self.rr.resource.plural, &self.rr.name, e)
    }
    pub fn not_found(&self) -> StatusError {
        StatusError::not_found(self.rr.resource.group, self.rr.resource.plural, &self.rr.name)
    }
    pub fn key(&self) -> String {
        objects::key(self.rr.resource, &self.rr.namespace, &self.rr.name)
    }

    /// The request's object as the store holds it; 404 when there is none.
    pub async fn stored(&self) -> Result<KeyValue, StatusError> {
        self.state
            .store
            .get(&self.key())
            .await
            .map_err(|e| self.store_err(e))?
            .map(|kv| objects::served_kv(self.rr.resource, kv))
            .ok_or_else(|| self.not_found())
    }

    /// The current object, with its resourceVersion.
    pub async fn current(&self) -> Result<(Value, Revision), StatusError> {
        let kv = self.stored().await?;
        let v = objects::decode_kv(&kv).ok_or_else(|| StatusError::internal("stored object is not valid JSON"))?;
        Ok((v, kv.mod_revision))
    }
}

pub async fn get(ctx: &Ctx) -> Result<Response, StatusError> {
    let kv = ctx.stored().await?;
    if ctx.output() == Output::Object {
        return Ok(body::object_response(
            StatusCode::OK,
            objects::with_resource_version(&kv.value, kv.mod_revision),
        ));
    }
    let v = objects::decode_kv(&kv).ok_or_else(|| StatusError::internal("stored object is not valid JSON"))?;
    Ok(render_one(ctx, StatusCode::OK, &v))
}

/// A continue token: the revision the list started at and the last key returned.
fn encode_continue(rev: Revision, key: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(serde_json::to_vec(&json!({"v": "meta.k8s.io/v1", "rv": rev, "start": key})).unwrap_or_default())
}

fn decode_continue(token: &str) -> Result<(Revision, String), StatusError> {
    let bad = || StatusError::bad_request(format!("continue key is not valid: {token}"));
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rev = v.get("rv").and_then(Value::as_i64).ok_or_else(bad)?;
    let start = v.get("start").and_then(Value::as_str).ok_or_else(bad)?.to_string();
    Ok((rev, start))
}

/// Selectors of a list or watch request.
pub struct Filter {
    pub labels: Option<LabelSelector>,
    pub fields: Option<FieldSelector>,
}

impl Filter {
    pub fn from_ctx(ctx: &Ctx) -> Result<Filter, StatusError> {
        let labels = match ctx.param("labelSelector").filter(|s| !s.trim().is_empty()) {
            Some(s) => Some(LabelSelector::parse(s).map_err(|e| StatusError::bad_request(e.to_string()))?),
            None => None,
        };
        let mut field_text = ctx.param("fieldSelector").unwrap_or("").trim().to_string();
        if !ctx.rr.name.is_empty() {
            // A watch on one object is a list with metadata.name.
            let n = format!("metadata.name={}", ctx.rr.name);
            field_text = if field_text.is_empty() {
                n
            } else {
                format!("{field_text},{n}")
            };
        }
        let fields = if field_text.is_empty() {
            None
        } else {
            Some(
                FieldSelector::parse(ctx.rr.resource, &field_text)
                    .map_err(|e| StatusError::bad_request(e.to_string()))?,
            )
        };
        Ok(Filter { labels, fields })
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_none() && self.fields.is_none()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        if let Some(l) = &self.labels {
            let empty = serde_json::Map::new();
            if !l.matches(objects::labels(obj).unwrap_or(&empty)) {
                return false;
            }
        }
        if let Some(f) = &self.fields
            && !f.matches(obj)
        {
            return false;
        }
        true
    }
}

/// Upstream's ValidateListOptions (and, for watches, validateWatchOptions): a 422 for
/// ListOptions.meta.k8s.io naming every bad combination of the query parameters.
pub fn validate_list_options(ctx: &Ctx, watch: bool) -> Result<(), StatusError> {
    let errs = list_option_errors(&ctx.params, watch);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(StatusError::invalid("meta.k8s.io", "ListOptions", "", &errs))
    }
}

fn list_option_errors(params: &crate::handlers::Params, watch: bool) -> Vec<skiff_api::FieldError> {
    use skiff_api::FieldError;
    let get = |k: &str| params.get(k).map(String::as_str).unwrap_or("");
    let matched = get("resourceVersionMatch");
    let rv = get("resourceVersion");
    let cont = get("continue");
    let send_initial = params.contains_key("sendInitialEvents");
    let rvm = "resourceVersionMatch";
    let mut errs = Vec::new();
    if watch {
        if send_initial && matched != "NotOlderThan" {
            errs.push(FieldError::forbidden(
                rvm,
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
        if !matched.is_empty() {
            if !send_initial {
                errs.push(FieldError::forbidden(
                    rvm,
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                ));
            }
            if matched != "NotOlderThan" {
                errs.push(FieldError::not_supported(rvm, &json!(matched), &["NotOlderThan"]));
            }
            if !cont.is_empty() {
                errs.push(FieldError::forbidden(
                    rvm,
                    "resourceVersionMatch is forbidden when continue is provided",
                ));
            }
        }
    } else {
        if !matched.is_empty() {
            if rv.is_empty() {
                errs.push(FieldError::forbidden(
                    rvm,
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                ));
            }
            if !cont.is_empty() {
                errs.push(FieldError::forbidden(
                    rvm,
                    "resourceVersionMatch is forbidden when continue is provided",
                ));
            }
            if matched != "Exact" && matched != "NotOlderThan" {
                errs.push(FieldError::not_supported(
                    rvm,
                    &json!(matched),
                    &["Exact", "NotOlderThan", ""],
                ));
            }
            if matched == "Exact" && rv == "0" {
                errs.push(FieldError::forbidden(
                    rvm,
                    "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                ));
            }
        }
        if send_initial {
            errs.push(FieldError::forbidden(
                "sendInitialEvents",
                "sendInitialEvents is forbidden for list",
            ));
        }
    }
    errs
}

/// The page size a list asks for: 0 (absent, zero or negative) means all of it. As upstream, a
/// value that is not an integer is a bad request, with Go's conversion error as the message.
fn list_limit(v: Option<&str>) -> Result<usize, StatusError> {
    let Some(v) = v else { return Ok(0) };
    match v.parse::<i64>() {
        Ok(n) => Ok(usize::try_from(n).unwrap_or(0)),
        Err(e) => {
            let why = match e.kind() {
                std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow => "value out of range",
                _ => "invalid syntax",
            };
            Err(StatusError::bad_request(format!(
                "strconv.ParseInt: parsing {v:?}: {why}"
            )))
        }
    }
}

pub async fn list(ctx: &Ctx) -> Result<Response, StatusError> {
    validate_list_options(ctx, false)?;
    let res = ctx.rr.resource;
    let filter = Filter::from_ctx(ctx)?;
    let limit = list_limit(ctx.param("limit"))?;
    let mut opts = ListOptions::default();
    if let Some(token) = ctx.param("continue").filter(|t| !t.is_empty()) {
        let (rev, start) = decode_continue(token)?;
        opts.revision = Some(rev);
        opts.start_after = Some(start);
    } else if let Some(rv) = ctx.param("resourceVersion").filter(|v| !v.is_empty() && *v != "0")
        && ctx.param("resourceVersionMatch") == Some("Exact")
    {
        opts.revision = Some(
            rv.parse()
                .map_err(|_| StatusError::bad_request(format!("invalid resource version: {rv}")))?,
        );
    }
    let prefix = objects::prefix(res, &ctx.rr.namespace);
    // Without selectors the store's limit is the page size; with selectors we scan and filter.
    opts.limit = if filter.is_empty() { limit } else { 0 };
    let mut page = ctx.state.store.list(&prefix, opts.clone()).await.map_err(|e| match e {
        StoreError::Compacted { .. } if ctx.param("continue").is_some() => StatusError::expired(
            "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
        ),
        other => ctx.store_err(other),
    })?;
    if skiff_api::registry::is_custom(res) {
        page.items = page.items.into_iter().map(|kv| objects::served_kv(res, kv)).collect();
    }
    let rev = page.revision;
    let mut items: Vec<&KeyValue> = Vec::new();
    let mut parsed: Vec<Value> = Vec::new();
    let mut more = page.more;
    let need_parse = !filter.is_empty() || ctx.output() != Output::Object;
    for kv in &page.items {
        if need_parse {
            let Some(v) = objects::decode_kv(kv) else { continue };
            if !filter.matches(&v) {
                continue;
            }
            if limit > 0 && items.len() == limit {
                more = true;
                break;
            }
            parsed.push(v);
        }
        items.push(kv);
    }
    let cont = if more {
        items.last().map(|kv| encode_continue(rev, &kv.key))
    } else {
        None
    };
    let rv = rev.to_string();
    match ctx.output() {
        Output::Object => {
            let mut out = Vec::with_capacity(items.iter().map(|kv| kv.value.len() + 32).sum::<usize>() + 256);
            out.extend_from_slice(
                format!(
                    "{{\"kind\":\"{}\",\"apiVersion\":\"{}\",\"metadata\":{{\"resourceVersion\":\"{}\"{}}},\"items\":[",
                    res.list_kind(),
                    res.api_version(),
                    rv,
                    cont.as_deref()
                        .map(|c| format!(",\"continue\":\"{c}\""))
                        .unwrap_or_default()
                )
                .as_bytes(),
            );
            for (i, kv) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(&objects::with_resource_version(&kv.value, kv.mod_revision));
            }
            out.extend_from_slice(b"]}");
            Ok(body::object_response(StatusCode::OK, out))
        }
        Output::PartialMetadata => {
            let mut list = json!({
                "kind": "PartialObjectMetadataList",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": {"resourceVersion": rv},
                "items": parsed.iter().map(body::partial_metadata).collect::<Vec<_>>(),
            });
            if let Some(c) = cont {
                list["metadata"]["continue"] = json!(c);
            }
            Ok(body::value_response(StatusCode::OK, &list))
        }
        Output::Table => {
            let refs: Vec<&Value> = parsed.iter().collect();
            let t = skiff_api::printers::table(res, &refs, jiff::Timestamp::now(), true, &rv, cont.as_deref());
            let t = body::IncludeObject::from_param(ctx.param("includeObject")).apply(t, &refs);
            Ok(body::value_response(StatusCode::OK, &t))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_limits_parse_as_upstream() {
        assert_eq!(list_limit(None).unwrap(), 0);
        assert_eq!(list_limit(Some("500")).unwrap(), 500);
        assert_eq!(list_limit(Some("+7")).unwrap(), 7);
        assert_eq!(list_limit(Some("-1")).unwrap(), 0);
        for (v, message) in [
            ("abc", "strconv.ParseInt: parsing \"abc\": invalid syntax"),
            ("", "strconv.ParseInt: parsing \"\": invalid syntax"),
            ("1.5", "strconv.ParseInt: parsing \"1.5\": invalid syntax"),
            (
                "99999999999999999999",
                "strconv.ParseInt: parsing \"99999999999999999999\": value out of range",
            ),
        ] {
            let e = list_limit(Some(v)).unwrap_err();
            assert_eq!((e.code, e.message.as_str()), (400, message), "{v}");
        }
    }

    #[test]
    fn continue_round_trip() {
        let t = encode_continue(42, "/registry/pods/default/a");
        assert_eq!(
            decode_continue(&t).expect("token"),
            (42, "/registry/pods/default/a".to_string())
        );
        assert_eq!(decode_continue("!!").unwrap_err().code, 400);
    }

    fn params(pairs: &[(&str, &str)]) -> crate::handlers::Params {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn messages(pairs: &[(&str, &str)], watch: bool) -> Vec<String> {
        list_option_errors(&params(pairs), watch)
            .iter()
            .map(|e| e.to_string())
            .collect()
    }

    #[test]
    fn list_and_watch_options_as_upstream_validates_them() {
        assert!(
            messages(
                &[("resourceVersion", "0"), ("resourceVersionMatch", "NotOlderThan")],
                false
            )
            .is_empty()
        );
        assert!(
            messages(
                &[
                    ("sendInitialEvents", "true"),
                    ("resourceVersionMatch", "NotOlderThan"),
                    ("allowWatchBookmarks", "true")
                ],
                true
            )
            .is_empty()
        );
        assert_eq!(
            messages(&[("sendInitialEvents", "true")], true),
            [
                "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"
            ]
        );
        assert_eq!(
            messages(&[("sendInitialEvents", "false")], false),
            ["sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list"]
        );
        assert_eq!(
            messages(&[("resourceVersionMatch", "Exact")], true),
            [
                "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                "resourceVersionMatch: Unsupported value: \"Exact\": supported values: \"NotOlderThan\""
            ]
        );
        assert_eq!(
            messages(&[("resourceVersionMatch", "Exact"), ("resourceVersion", "0")], false),
            ["resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\""]
        );
        assert_eq!(
            messages(&[("resourceVersionMatch", "Exact")], false),
            ["resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided"]
        );
    }
}
