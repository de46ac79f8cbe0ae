//! Request bodies in (JSON, YAML, protobuf; size limit) and responses out (JSON, Table,
//! PartialObjectMetadata; Status errors).

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde_json::Value;
use skiff_api::StatusError;

/// Upstream's limit on request bodies (3 MiB).
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

pub const JSON: &str = "application/json";

/// How the client wants objects back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Object,
    Table,
    PartialMetadata,
}

/// Read the Accept header as the API server's content negotiation does.
pub fn negotiate(headers: &HeaderMap) -> Output {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    // The first acceptable entry wins; kubectl lists Table first and plain JSON last.
    for part in accept.split(',') {
        let p = part.trim();
        if p.contains("as=Table") && p.contains("g=meta.k8s.io") {
            return Output::Table;
        }
        if (p.contains("as=PartialObjectMetadataList") || p.contains("as=PartialObjectMetadata"))
            && p.contains("g=meta.k8s.io")
        {
            return Output::PartialMetadata;
        }
        if p.starts_with("application/json") || p.starts_with("*/*") || p.is_empty() {
            return Output::Object;
        }
    }
    Output::Object
}

/// How much of an oversized body is read (and dropped) before answering 413, so that a client
/// still sending gets the answer instead of a reset connection.
const DRAIN_LIMIT: usize = 64 * 1024 * 1024;

/// Read a request body of at most [`MAX_BODY_BYTES`]; a larger one is a 413.
pub async fn read_limited(body: Body) -> Result<Bytes, StatusError> {
    use http_body_util::BodyExt;
    let mut body = body;
    let mut buf = bytes::BytesMut::new();
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| StatusError::bad_request(format!("reading the request body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            seen += data.len();
            if seen <= MAX_BODY_BYTES {
                buf.extend_from_slice(&data);
            } else if seen > DRAIN_LIMIT {
                break;
            }
        }
    }
    if seen > MAX_BODY_BYTES {
        return Err(StatusError::too_large(format!(
            "Request entity too large: limit is {MAX_BODY_BYTES}"
        )));
    }
    Ok(buf.freeze())
}

/// Decode a body to JSON according to its content type.
pub fn decode(headers: &HeaderMap, body: &Bytes) -> Result<Value, StatusError> {
    if body.len() > MAX_BODY_BYTES {
        return Err(StatusError::too_large(format!(
            "Request entity too large: limit is {MAX_BODY_BYTES}"
        )));
    }
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or(JSON)
        .to_ascii_lowercase();
    let media = ct.split(';').next().unwrap_or("").trim().to_string();
    if body.is_empty() {
        return Err(StatusError::bad_request(
            "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf",
        ));
    }
    let v = match media.as_str() {
        "application/vnd.kubernetes.protobuf" => crate::protobuf::decode(body)
            .map_err(|e| StatusError::bad_request(format!("failed to decode protobuf body: {e}")))?,
        m if m.ends_with("yaml") => decode_yaml(body)?,
        _ => serde_json::from_slice(body).map_err(|e| {
            // Go's scanner's words where the body is no JSON at all.
            let why = skiff_api::gojson::syntax_error(body).unwrap_or_else(|| e.to_string().replace('\n', " "));
            StatusError::bad_request(format!("couldn't get version/kind; json parse error: {why}"))
        })?,
    };
    Ok(v)
}

/// The object a create or an update sends, decoded: a body that does not decode is refused as
/// upstream's `transformDecodeError` words it, naming the kind expected and showing the
/// body's start (as it is when it starts as an object, else in hex).
pub fn decode_object(headers: &HeaderMap, body: &Bytes, kind: &str) -> Result<Value, StatusError> {
    decode(headers, body).map_err(|e| {
        if e.code != 400 || body.is_empty() {
            return e;
        }
        StatusError::bad_request(format!(
            "the object provided is unrecognized (must be of type {kind}): {} ({})",
            e.message,
            summarize(body, 30)
        ))
    })
}

/// Upstream's `summarizeData`.
fn summarize(body: &[u8], max: usize) -> String {
    let cut = &body[..body.len().min(max)];
    let more = if body.len() > max { " ..." } else { "" };
    if body.first() == Some(&b'{') {
        format!("{}{more}", String::from_utf8_lossy(cut))
    } else {
        format!("{}{more}", hex::encode(cut))
    }
}

pub fn decode_yaml(body: &[u8]) -> Result<Value, StatusError> {
    let text = std::str::from_utf8(body).map_err(|_| StatusError::bad_request("yaml body is not valid UTF-8"))?;
    serde_saphyr::from_str::<Value>(text)
        .map_err(|e| StatusError::bad_request(format!("error converting YAML to JSON: {e}")))
}

/// A JSON response of these bytes as they are (the OpenAPI documents, which upstream writes
/// without a final newline); API objects go through [`object_response`].
pub fn json_response(code: StatusCode, body: impl Into<Body>) -> Response {
    let mut r = Response::new(body.into());
    *r.status_mut() = code;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(JSON));
    r
}

/// An API object's JSON (an object, a list, a Table, a `Status`, discovery): ended by a
/// newline, as upstream's encoder (`json.Encoder.Encode`) ends every one it writes.
pub fn object_response(code: StatusCode, mut json: Vec<u8>) -> Response {
    json.push(b'\n');
    json_response(code, json)
}

pub fn value_response(code: StatusCode, v: &Value) -> Response {
    object_response(code, serde_json::to_vec(v).unwrap_or_default())
}

/// A `Status` error response.
pub fn error_response(e: &StatusError) -> Response {
    let code = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = value_response(code, &e.to_json());
    if let Some(s) = e.details.retry_after_seconds
        && let Ok(v) = HeaderValue::from_str(&s.to_string())
    {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

/// Whether the answer is indented, as upstream's `isPrettyPrint` decides: `pretty` when given,
/// else for browsers and command-line HTTP tools (a User-Agent starting `curl`, `Wget` or
/// `Mozilla/5.0`).
pub fn wants_pretty(pretty: Option<&str>, headers: &HeaderMap) -> bool {
    if let Some(p) = pretty.filter(|p| !p.is_empty()) {
        return matches!(p, "1" | "t" | "T" | "true" | "TRUE" | "True");
    }
    let agent = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    ["curl", "Wget", "Mozilla/5.0"].iter().any(|p| agent.starts_with(p))
}

/// The answer indented with two spaces and without the final newline, as upstream's pretty
/// encoder (`json.MarshalIndent`) writes it; answers that are not JSON objects stay as they are.
pub async fn prettify(r: Response) -> Response {
    let is_json = r
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with(JSON));
    if !is_json {
        return r;
    }
    let (mut parts, b) = r.into_parts();
    let bytes = match http_body_util::BodyExt::collect(b).await {
        Ok(c) => c.to_bytes(),
        Err(e) => {
            tracing::warn!(error = %e, "reading an answer to indent");
            return error_response(&StatusError::internal("reading the answer failed"));
        }
    };
    let out = match serde_json::from_slice::<Value>(&bytes) {
        Ok(v) => Bytes::from(serde_json::to_vec_pretty(&v).unwrap_or_default()),
        Err(_) => bytes,
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(out))
}

/// Add `Warning: 299 - "msg"` headers (kubectl prints them).
pub fn add_warnings(r: &mut Response, warnings: &[String]) {
    for w in warnings {
        let text = format!("299 - {:?}", w);
        if let Ok(v) = HeaderValue::from_str(&text) {
            r.headers_mut().append(header::WARNING, v);
        }
    }
}

/// What a Table's rows carry of their objects, by `includeObject` (upstream's
/// `TableOptions`): `Metadata` (the default) a `PartialObjectMetadata`, `Object` the whole
/// object (what `kubectl get --sort-by` sorts by), `None` nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

impl IncludeObject {
    pub fn from_param(value: Option<&str>) -> IncludeObject {
        match value {
            Some("None") => IncludeObject::None,
            Some("Object") => IncludeObject::Object,
            _ => IncludeObject::Metadata,
        }
    }

    /// `table`'s rows (one per object of `objs`, in order) with what this asks of each object.
    pub fn apply(self, mut table: Value, objs: &[&Value]) -> Value {
        if self == IncludeObject::Metadata {
            return table;
        }
        if let Some(rows) = table.get_mut("rows").and_then(Value::as_array_mut) {
            for (row, obj) in rows.iter_mut().zip(objs) {
                let Some(row) = row.as_object_mut() else { continue };
                match self {
                    IncludeObject::None => {
                        row.remove("object");
                    }
                    IncludeObject::Object => {
                        row.insert("object".into(), (*obj).clone());
                    }
                    IncludeObject::Metadata => {}
                }
            }
        }
        table
    }
}

/// The `PartialObjectMetadata` form of an object.
pub fn partial_metadata(obj: &Value) -> Value {
    serde_json::json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| serde_json::json!({})),
    })
}

#[cfg(test)]
mod tests {

    #[test]
    fn table_rows_carry_what_include_object_asks_for() {
        let obj = serde_json::json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "p"}, "spec": {}});
        let table = serde_json::json!({"kind": "Table", "rows": [{"cells": ["p"], "object": partial_metadata(&obj)}]});
        let whole = IncludeObject::from_param(Some("Object")).apply(table.clone(), &[&obj]);
        assert_eq!(whole["rows"][0]["object"], obj);
        let none = IncludeObject::from_param(Some("None")).apply(table.clone(), &[&obj]);
        assert!(none["rows"][0].get("object").is_none());
        assert_eq!(IncludeObject::from_param(None).apply(table.clone(), &[&obj]), table);
    }

    use super::*;

    #[test]
    fn negotiation() {
        let mut h = HeaderMap::new();
        assert_eq!(negotiate(&h), Output::Object);
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static(
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json",
            ),
        );
        assert_eq!(negotiate(&h), Output::Table);
        h.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/vnd.kubernetes.protobuf, */*"),
        );
        assert_eq!(negotiate(&h), Output::Object);
    }

    #[test]
    fn bad_bodies_are_400() {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        assert_eq!(decode(&h, &Bytes::from_static(b"{not json")).unwrap_err().code, 400);
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/yaml"));
        assert_eq!(decode(&h, &Bytes::from_static(b"a: [")).unwrap_err().code, 400);
        let big = Bytes::from(vec![b' '; MAX_BODY_BYTES + 1]);
        assert_eq!(decode(&h, &big).unwrap_err().code, 413);
    }
}
