//! Requests for a built-in version stored as another version of its kind
//! (`skiff_api::conversion`: autoscaling/v1 HorizontalPodAutoscalers, stored as autoscaling/v2;
//! the removed workload versions, stored as their replacements, each answer with upstream's
//! deprecation warning).
//! The request is served by the storage version's handlers: the object it sends is checked
//! against its own version's schema and converted on the way in, a patch is applied to the
//! object as its version shows it, and every object of the answer (one, a list, a watch
//! stream's events, a Table's rows) is converted on the way out.

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderValue, Method, StatusCode, header};
use serde_json::Value;
use skiff_api::conversion::{from_storage, to_storage};
use skiff_api::patch::PatchType;
use skiff_api::{Resource, StatusError};

use crate::body;
use crate::handlers::{Ctx, render_one};
use crate::objects::{self, metadata_mut};
use crate::write::{self, UpdateScope};

/// Serves a request for `ctx.rr.resource`, which is stored as `storage`.
pub async fn serve(ctx: Ctx, bytes: Bytes, storage: &'static Resource) -> Result<Response, StatusError> {
    let served = ctx.rr.resource;
    let mut rr = ctx.rr.clone();
    rr.resource = storage;
    let mut inner = ctx.for_object(rr);
    // Answers come back as JSON, to be converted.
    if let Some(accept) = inner.headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) {
        let json = accept
            .replace(crate::protobuf::MEDIA_TYPE, body::JSON)
            .replace("application/yaml", body::JSON);
        if let Ok(v) = HeaderValue::from_str(&json) {
            inner.headers.insert(header::ACCEPT, v);
        }
    }
    let sub = ctx.rr.subresource.as_str();
    let object_write = matches!(sub, "" | "status");
    let mut warnings = Vec::new();
    if let Some(w) = skiff_api::conversion::removed::warning(served) {
        warnings.push(w);
    }
    let response = if ctx.method == Method::PATCH && object_write {
        patch(&ctx, &inner, &bytes, storage).await?
    } else if matches!(ctx.method, Method::POST | Method::PUT) && object_write && !bytes.is_empty() {
        let mut obj = body::decode(&ctx.headers, &bytes)?;
        let stored_version = storage.api_version();
        if obj.get("apiVersion").and_then(Value::as_str) != Some(stored_version.as_str()) {
            write::check_kind(served.kind, &served.api_version(), &mut obj)?;
            warnings.extend(write::check_shape(&ctx, &obj)?);
            obj = to_storage(served, &obj);
        }
        inner
            .headers
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(body::JSON));
        let bytes = Bytes::from(serde_json::to_vec(&obj).unwrap_or_default());
        crate::handlers::dispatch(inner, bytes).await?
    } else {
        crate::handlers::dispatch(inner, bytes).await?
    };
    let watching = ctx.rr.watch;
    let mut r = convert_response(served, response, watching).await;
    body::add_warnings(&mut r, &warnings);
    Ok(r)
}

/// A patch of the object as `served` shows it: the stored object converted, patched (JSON,
/// merge, strategic merge, or server-side apply against the served version's schema), and
/// converted back.
async fn patch(ctx: &Ctx, inner: &Ctx, bytes: &Bytes, storage: &Resource) -> Result<Response, StatusError> {
    let served = ctx.rr.resource;
    let (ptype, doc) = write::patch_document(ctx, bytes)?;
    write::validate_write_options(ctx, "PatchOptions", Some(ptype))?;
    // A removed version has no schema of its own: its fields are its replacement's.
    let mut def = skiff_api::apiextensions::patch_definition(served);
    if def.is_empty() {
        def = skiff_api::apiextensions::patch_definition(storage);
    }
    let def = def.as_str();
    let scope = if ctx.rr.subresource == "status" {
        UpdateScope::Status
    } else {
        UpdateScope::Main
    };
    let manager = ctx.manager();
    let force = ctx.flag("force");
    if ptype == PatchType::Apply && ctx.param("fieldManager").is_none_or(str::is_empty) {
        return Err(StatusError::bad_request(
            "PATCH /apply requests require a fieldManager parameter",
        ));
    }
    let now = objects::now_rfc3339();
    for _ in 0..8 {
        let current = match inner.current().await {
            Ok(c) => Some(c),
            Err(e) if e.code == 404 && ptype == PatchType::Apply && scope == UpdateScope::Main => None,
            Err(e) => return Err(e),
        };
        let Some((old, rev)) = current else {
            // Server-side apply creates what does not exist.
            let mut applied = skiff_api::patch::apply::apply(None, &doc, &manager, force, def, &now)
                .map_err(|e| skiff_api::patch::PatchError::from(e).to_status())?;
            metadata_mut(&mut applied).insert("name".into(), serde_json::json!(ctx.rr.name));
            let mut obj = to_storage(served, &applied);
            let (created, _) = write::create_object(inner, &mut obj, "Apply").await?;
            return Ok(render_one(inner, StatusCode::CREATED, &created));
        };
        let old_served = from_storage(served, &old);
        let new_served = match ptype {
            PatchType::Apply => skiff_api::patch::apply::apply(Some(&old_served), &doc, &manager, force, def, &now)
                .map_err(|e| skiff_api::patch::PatchError::from(e).to_status())?,
            other => skiff_api::patch::patch(other, &old_served, &doc, def).map_err(|e| e.to_status())?,
        };
        let precondition = objects::resource_version(&new_served).to_string();
        if !precondition.is_empty() && precondition != rev.to_string() {
            return Err(StatusError::modified(served.group, served.plural, &ctx.rr.name));
        }
        let new = to_storage(served, &new_served);
        let operation = if ptype == PatchType::Apply { "Apply" } else { "Update" };
        match write::finish_update(inner, &old, new, rev, scope, operation).await {
            Err(e) if e.reason == "Conflict" => continue,
            Err(e) => return Err(e),
            Ok(w) => return Ok(render_one(inner, StatusCode::OK, w.object())),
        }
    }
    Err(StatusError::modified(served.group, served.plural, &ctx.rr.name))
}

/// The answer with its objects as `served` shows them. Only JSON answers hold objects (the
/// request asked for JSON); a watch is converted event by event, one line each.
async fn convert_response(served: &'static Resource, response: Response, watching: bool) -> Response {
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with(body::JSON));
    if !is_json {
        return response;
    }
    let (mut parts, b) = response.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    if watching && parts.status == StatusCode::OK {
        return Response::from_parts(parts, convert_stream(served, b));
    }
    let bytes = match http_body_util::BodyExt::collect(b).await {
        Ok(c) => c.to_bytes(),
        Err(e) => {
            tracing::warn!(error = %e, "reading an answer to convert");
            return body::error_response(&StatusError::internal("reading the answer failed"));
        }
    };
    let out = match serde_json::from_slice::<Value>(&bytes) {
        Ok(v) => {
            let mut out = serde_json::to_vec(&convert_value(served, v)).unwrap_or_default();
            out.push(b'\n');
            Bytes::from(out)
        }
        Err(_) => bytes,
    };
    Response::from_parts(parts, Body::from(out))
}

/// A watch stream's events converted as they come; events are lines.
fn convert_stream(served: &'static Resource, b: Body) -> Body {
    let mut pending: Vec<u8> = Vec::new();
    let stream = b
        .into_data_stream()
        .map(move |chunk| {
            let chunk = chunk?;
            pending.extend_from_slice(&chunk);
            let mut out = Vec::new();
            while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                out.extend_from_slice(&convert_line(served, &line));
            }
            Ok::<Bytes, axum::Error>(Bytes::from(out))
        })
        .filter(|r| futures::future::ready(!matches!(r, Ok(b) if b.is_empty())));
    Body::from_stream(stream)
}

/// One watch event line (`{"type":...,"object":...}\n`) converted.
fn convert_line(served: &'static Resource, line: &[u8]) -> Vec<u8> {
    let Ok(mut event) = serde_json::from_slice::<Value>(line) else {
        return line.to_vec();
    };
    if let Some(obj) = event.get_mut("object") {
        *obj = convert_value(served, obj.take());
    }
    let mut out = serde_json::to_vec(&event).unwrap_or_default();
    out.push(b'\n');
    out
}

/// An answer's value converted: an object of the kind, a list of them, a Table's row objects.
pub fn convert_value(served: &'static Resource, mut v: Value) -> Value {
    let kind = v.get("kind").and_then(Value::as_str).unwrap_or_default().to_string();
    if kind == served.kind {
        return from_storage(served, &v);
    }
    if kind == served.list_kind() {
        if let Some(m) = v.as_object_mut() {
            m.insert("apiVersion".into(), Value::String(served.api_version()));
        }
        if let Some(items) = v.get_mut("items").and_then(Value::as_array_mut) {
            for item in items.iter_mut() {
                let had_kind = item.get("kind").is_some();
                if let (false, Some(m)) = (had_kind, item.as_object_mut()) {
                    m.insert("kind".into(), Value::String(served.kind.to_string()));
                }
                let mut converted = from_storage(served, item);
                if !had_kind && let Some(m) = converted.as_object_mut() {
                    m.remove("kind");
                    m.remove("apiVersion");
                }
                *item = converted;
            }
        }
        return v;
    }
    if kind == "Table"
        && let Some(rows) = v.get_mut("rows").and_then(Value::as_array_mut)
    {
        for row in rows.iter_mut() {
            if let Some(obj) = row.get_mut("object")
                && obj.get("kind").and_then(Value::as_str) == Some(served.kind)
            {
                *obj = from_storage(served, obj);
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn v1() -> &'static Resource {
        skiff_api::registry::lookup("autoscaling", "v1", "horizontalpodautoscalers").expect("served")
    }

    fn stored() -> Value {
        json!({"kind": "HorizontalPodAutoscaler", "apiVersion": "autoscaling/v2",
               "metadata": {"name": "web", "resourceVersion": "7"},
               "spec": {"maxReplicas": 4, "metrics": [{"type": "Resource", "resource": {"name": "cpu",
                        "target": {"type": "Utilization", "averageUtilization": 55}}}]}})
    }

    #[test]
    fn objects_lists_and_events_are_converted() {
        let one = convert_value(v1(), stored());
        assert_eq!(one["apiVersion"], "autoscaling/v1");
        assert_eq!(one["spec"]["targetCPUUtilizationPercentage"], 55);
        assert_eq!(one["metadata"]["resourceVersion"], "7");

        let list = json!({"kind": "HorizontalPodAutoscalerList", "apiVersion": "autoscaling/v2",
                          "metadata": {"resourceVersion": "9"}, "items": [stored()]});
        let list = convert_value(v1(), list);
        assert_eq!(list["apiVersion"], "autoscaling/v1");
        assert_eq!(list["items"][0]["spec"]["targetCPUUtilizationPercentage"], 55);

        let mut line = serde_json::to_vec(&json!({"type": "ADDED", "object": stored()})).expect("json");
        line.push(b'\n');
        let event: Value = serde_json::from_slice(&convert_line(v1(), &line)).expect("json");
        assert_eq!(event["type"], "ADDED");
        assert_eq!(event["object"]["apiVersion"], "autoscaling/v1");

        let status = json!({"kind": "Status", "code": 404});
        assert_eq!(convert_value(v1(), status.clone()), status);
    }

    #[tokio::test]
    async fn a_watch_stream_split_anywhere_is_converted_line_by_line() {
        let mut text = serde_json::to_vec(&json!({"type": "ADDED", "object": stored()})).expect("json");
        text.push(b'\n');
        let (a, b) = text.split_at(20);
        let chunks: Vec<Result<Bytes, std::io::Error>> =
            vec![Ok(Bytes::copy_from_slice(a)), Ok(Bytes::copy_from_slice(b))];
        let body = Body::from_stream(futures::stream::iter(chunks));
        let out = http_body_util::BodyExt::collect(convert_stream(v1(), body))
            .await
            .expect("body")
            .to_bytes();
        let event: Value = serde_json::from_slice(&out).expect("one event");
        assert_eq!(event["object"]["spec"]["targetCPUUtilizationPercentage"], 55);
        assert!(out.ends_with(b"\n"));
    }
}
