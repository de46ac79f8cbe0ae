//! Watch: a chunked stream of `{"type":..,"object":..}` lines, from the store's watch,
//! filtered by selectors (an object leaving the selection is DELETED for this watcher,
//! one entering it ADDED), with bookmarks, initial events and Table rendering.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderValue, StatusCode, header};
use serde_json::{Value, json};
use skiff_api::{Resource, StatusError};
use skiff_store::{Event, Revision, StoreError};
use tokio::sync::mpsc;

use crate::body::Output;
use crate::handlers::Ctx;
use crate::objects;
use crate::read::Filter;

const BOOKMARK_EVERY: Duration = Duration::from_secs(60);

struct Encoder {
    res: &'static Resource,
    output: Output,
    include: crate::body::IncludeObject,
    sent_columns: bool,
}

impl Encoder {
    fn event(&mut self, kind: &str, obj: &Value) -> Bytes {
        let object = match self.output {
            Output::Object => obj.clone(),
            Output::PartialMetadata => crate::body::partial_metadata(obj),
            Output::Table if kind == "BOOKMARK" || kind == "ERROR" => obj.clone(),
            Output::Table => {
                let t = skiff_api::printers::table(
                    self.res,
                    &[obj],
                    jiff::Timestamp::now(),
                    !self.sent_columns,
                    objects::resource_version(obj),
                    None,
                );
                self.sent_columns = true;
                self.include.apply(t, &[obj])
            }
        };
        let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
        line.push(b'\n');
        Bytes::from(line)
    }
}

fn bookmark(res: &Resource, rev: Revision, initial_end: bool) -> Value {
    let mut md = json!({"resourceVersion": rev.to_string()});
    if initial_end {
        md["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    json!({"kind": res.kind, "apiVersion": res.api_version(), "metadata": md})
}

pub async fn serve(ctx: Ctx, _name: Option<String>) -> Result<Response, StatusError> {
    crate::read::validate_list_options(&ctx, true)?;
    let res = ctx.rr.resource;
    let filter = Filter::from_ctx(&ctx)?;
    let bookmarks = ctx.flag("allowWatchBookmarks");
    let send_initial = ctx.flag("sendInitialEvents");
    // sendInitialEvents=false: no synthetic ADDED events, whatever the resourceVersion.
    let no_initial = ctx.param("sendInitialEvents").is_some() && !send_initial;
    let timeout = ctx
        .param("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|t| *t > 0)
        .map(Duration::from_secs);
    let rv_param = ctx.param("resourceVersion").unwrap_or("").to_string();
    let prefix = objects::prefix(res, &ctx.rr.namespace);
    let store = ctx.state.store.clone();

    // Where to start: "" / "0" (or sendInitialEvents) replay the current state as ADDED first.
    let mut initial: Vec<Value> = Vec::new();
    let start: Revision;
    if no_initial && (rv_param.is_empty() || rv_param == "0") {
        // From now on: the store's current revision, nothing replayed.
        start = store.current_revision().await.map_err(|e| ctx.store_err(e))?;
    } else if rv_param.is_empty() || rv_param == "0" || send_initial {
        let page = store
            .list(&prefix, Default::default())
            .await
            .map_err(|e| ctx.store_err(e))?;
        for kv in page.items {
            let kv = objects::served_kv(res, kv);
            if let Some(v) = objects::decode_kv(&kv)
                && filter.matches(&v)
            {
                initial.push(v);
            }
        }
        start = page.revision;
    } else {
        start = rv_param
            .parse()
            .map_err(|_| StatusError::bad_request(format!("invalid resource version: {rv_param}")))?;
    }
    let mut encoder = Encoder {
        res,
        output: ctx.output(),
        include: crate::body::IncludeObject::from_param(ctx.param("includeObject")),
        sent_columns: false,
    };
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(512);
    let watch = store.watch(&prefix, start).await;
    let sent = crate::metrics::watch_events(res);
    tokio::spawn(async move {
        let mut events = match watch {
            Ok(s) => s,
            Err(e) => {
                let status = match e {
                    StoreError::Compacted { requested, compacted } => {
                        StatusError::gone(format!("too old resource version: {requested} ({compacted})"))
                    }
                    other => crate::read::store_error(res.group, res.plural, "", other),
                };
                let _ = tx.send(Ok(encoder.event("ERROR", &status.to_json()))).await;
                return;
            }
        };
        for obj in &initial {
            if tx.send(Ok(encoder.event("ADDED", obj))).await.is_err() {
                return;
            }
            sent.inc();
        }
        if send_initial && bookmarks {
            let b = bookmark(res, start, true);
            if tx.send(Ok(encoder.event("BOOKMARK", &b))).await.is_err() {
                return;
            }
        }
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let mut last_rev = start;
        let mut tick = tokio::time::interval(BOOKMARK_EVERY);
        tick.tick().await;
        loop {
            let next = tokio::select! {
                ev = events.next() => ev,
                _ = tick.tick() => {
                    if bookmarks {
                        let b = bookmark(res, last_rev, false);
                        if tx.send(Ok(encoder.event("BOOKMARK", &b))).await.is_err() {
                            return;
                        }
                    }
                    continue;
                }
                _ = sleep_until(deadline) => return,
                _ = tx.closed() => return,
            };
            let Some(ev) = next else { return };
            let ev = served_event(res, ev);
            last_rev = ev.revision();
            // Unfiltered JSON watches splice the stored bytes without parsing them.
            if filter.is_empty() && encoder.output == Output::Object {
                if tx.send(Ok(raw_event(&ev))).await.is_err() {
                    return;
                }
                sent.inc();
                continue;
            }
            let Some((kind, obj)) = translate(&ev, &filter) else {
                continue;
            };
            if tx.send(Ok(encoder.event(kind, &obj))).await.is_err() {
                return;
            }
            sent.inc();
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let mut r = Response::new(Body::from_stream(stream));
    *r.status_mut() = StatusCode::OK;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
    Ok(r)
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => futures::future::pending().await,
    }
}

/// A watch event line built from the stored bytes, with the resourceVersion spliced in.
/// A store event with its values as `res` serves them (a custom resource's version).
fn served_event(res: &Resource, ev: Event) -> Event {
    if !skiff_api::registry::is_custom(res) {
        return ev;
    }
    match ev {
        Event::Put { kv, prev } => Event::Put {
            kv: objects::served_kv(res, kv),
            prev: prev.map(|p| objects::served_kv(res, p)),
        },
        Event::Delete { prev, revision } => Event::Delete {
            prev: objects::served_kv(res, prev),
            revision,
        },
    }
}

fn raw_event(ev: &Event) -> Bytes {
    let (kind, kv, rev) = match ev {
        Event::Put { kv, prev } => (if prev.is_some() { "MODIFIED" } else { "ADDED" }, kv, kv.mod_revision),
        Event::Delete { prev, revision } => ("DELETED", prev, *revision),
    };
    let obj = objects::with_resource_version(&kv.value, rev);
    let mut line = Vec::with_capacity(obj.len() + 40);
    line.extend_from_slice(b"{\"type\":\"");
    line.extend_from_slice(kind.as_bytes());
    line.extend_from_slice(b"\",\"object\":");
    line.extend_from_slice(&obj);
    line.extend_from_slice(b"}\n");
    Bytes::from(line)
}

/// A store event as this watcher sees it, or nothing if it concerns no selected object.
fn translate(ev: &Event, filter: &Filter) -> Option<(&'static str, Value)> {
    match ev {
        Event::Put { kv, prev } => {
            let new = objects::decode_kv(kv)?;
            let now_in = filter.matches(&new);
            let was_in = match prev {
                Some(p) if !filter.is_empty() => objects::decode_kv(p).is_some_and(|o| filter.matches(&o)),
                Some(_) => true,
                None => false,
            };
            match (was_in, now_in) {
                (false, true) => Some(("ADDED", new)),
                (true, true) => Some(("MODIFIED", new)),
                (true, false) => {
                    // It left the selection: the watcher sees it deleted, at this revision.
                    Some(("DELETED", new))
                }
                (false, false) => None,
            }
        }
        Event::Delete { prev, revision } => {
            let mut old = objects::decode_kv(prev)?;
            if !filter.matches(&old) {
                return None;
            }
            objects::set_resource_version(&mut old, *revision);
            Some(("DELETED", old))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::body::Body;
    use base64::Engine;
    use http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use crate::server::{ApiState, router};

    async fn server() -> (Arc<ApiState>, String, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("dir");
        let (state, token) = ApiState::for_tests(dir.path());
        (state, token, dir)
    }

    async fn get(state: &Arc<ApiState>, token: &str, uri: &str) -> (u16, String) {
        get_as(state, token, uri, "application/json").await
    }

    async fn get_as(state: &Arc<ApiState>, token: &str, uri: &str, accept: &str) -> (u16, String) {
        let req = Request::get(uri)
            .header("authorization", format!("Bearer {token}"))
            .header("accept", accept)
            .body(Body::empty())
            .expect("request");
        let resp = router(state.clone()).oneshot(req).await.expect("response");
        let code = resp.status().as_u16();
        let body = tokio::time::timeout(std::time::Duration::from_secs(10), resp.into_body().collect())
            .await
            .expect("the stream ends")
            .expect("body")
            .to_bytes();
        (code, String::from_utf8_lossy(&body).to_string())
    }

    async fn fill(state: &ApiState, n: usize) {
        let cms = skiff_api::registry::lookup("", "v1", "configmaps").expect("configmaps");
        for i in 0..n {
            let name = format!("cm{i}");
            let obj = serde_json::json!({"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": name, "namespace": "default"}});
            state
                .store
                .create(
                    &crate::objects::key(cms, "default", &name),
                    crate::objects::encode_for_store(&obj),
                )
                .await
                .expect("create");
        }
    }

    #[tokio::test]
    async fn a_compacted_resource_version_is_an_expired_error_event() {
        let (state, token, _dir) = server().await;
        fill(&state, 6).await;
        state.store.compact(4).await.expect("compact");
        let (code, body) = get(
            &state,
            &token,
            "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=1",
        )
        .await;
        assert_eq!(code, 200, "{body}");
        let lines: Vec<serde_json::Value> = body
            .lines()
            .map(|l| serde_json::from_str(l).expect("json line"))
            .collect();
        assert_eq!(lines.len(), 1, "{body}");
        assert_eq!(lines[0]["type"], "ERROR");
        assert_eq!(lines[0]["object"]["kind"], "Status");
        assert_eq!(lines[0]["object"]["code"], 410);
        assert_eq!(lines[0]["object"]["reason"], "Expired");
        assert!(
            lines[0]["object"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("too old resource version: 1")),
            "{body}"
        );
        // From a revision still kept, the later events come.
        let (code, body) = get(
            &state,
            &token,
            "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=4&timeoutSeconds=1",
        )
        .await;
        assert_eq!(code, 200);
        let names: Vec<String> = body
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json line"))
            .map(|v| {
                format!(
                    "{} {}",
                    v["type"].as_str().unwrap_or(""),
                    v["object"]["metadata"]["name"].as_str().unwrap_or("")
                )
            })
            .collect();
        assert_eq!(names, ["ADDED cm4", "ADDED cm5"]);
    }

    #[tokio::test]
    async fn an_expired_continue_token_is_410() {
        let (state, token, _dir) = server().await;
        fill(&state, 6).await;
        let (code, body) = get(&state, &token, "/api/v1/namespaces/default/configmaps?limit=2").await;
        assert_eq!(code, 200, "{body}");
        let page: serde_json::Value = serde_json::from_str(&body).expect("list");
        let cont = page["metadata"]["continue"].as_str().expect("continue").to_string();
        let cms = skiff_api::registry::lookup("", "v1", "configmaps").expect("configmaps");
        for name in ["cm0", "cm1"] {
            state
                .store
                .delete(&crate::objects::key(cms, "default", name), None)
                .await
                .expect("delete");
        }
        state.store.compact(8).await.expect("compact");
        let (code, body) = get(
            &state,
            &token,
            &format!("/api/v1/namespaces/default/configmaps?limit=2&continue={cont}"),
        )
        .await;
        assert_eq!(code, 410, "{body}");
        let st: serde_json::Value = serde_json::from_str(&body).expect("status");
        assert_eq!(st["reason"], "Expired");
        assert_eq!(
            st["message"],
            "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter."
        );
        // A token that is not one of ours is a 400.
        let bogus = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b"{}");
        let (code, _) = get(
            &state,
            &token,
            &format!("/api/v1/namespaces/default/configmaps?continue={bogus}"),
        )
        .await;
        assert_eq!(code, 400);
    }

    #[tokio::test]
    async fn selector_errors_and_metadata_lists() {
        let (state, token, _dir) = server().await;
        fill(&state, 3).await;
        for uri in [
            "/api/v1/namespaces/default/configmaps?labelSelector=a%20in%20((",
            "/api/v1/namespaces/default/configmaps?watch=1&labelSelector=a%20in%20((",
        ] {
            let (code, body) = get(&state, &token, uri).await;
            assert_eq!(code, 400, "{body}");
            let st: serde_json::Value = serde_json::from_str(&body).expect("status");
            let msg = st["message"].as_str().expect("message");
            assert!(msg.starts_with("unable to parse requirement: "), "{msg}");
            assert_eq!(msg.matches("unable to parse requirement").count(), 1, "{msg}");
        }
        let accept = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io";
        let (code, body) = get_as(&state, &token, "/api/v1/namespaces/default/configmaps", accept).await;
        assert_eq!(code, 200, "{body}");
        let list: serde_json::Value = serde_json::from_str(&body).expect("list");
        assert_eq!(list["kind"], "PartialObjectMetadataList");
        assert!(list["metadata"].get("continue").is_none(), "{body}");
        assert_eq!(list["items"].as_array().map(Vec::len), Some(3));
        let (_, body) = get_as(&state, &token, "/api/v1/namespaces/default/configmaps?limit=2", accept).await;
        let list: serde_json::Value = serde_json::from_str(&body).expect("list");
        assert!(list["metadata"]["continue"].is_string(), "{body}");
    }
}
