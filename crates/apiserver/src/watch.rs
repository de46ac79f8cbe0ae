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
                t
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
        for kv in &page.items {
            if let Some(v) = objects::decode_kv(kv)
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
        sent_columns: false,
    };
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(512);
    let watch = store.watch(&prefix, start).await;
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
            last_rev = ev.revision();
            let Some((kind, obj)) = translate(&ev, &filter) else {
                continue;
            };
            if tx.send(Ok(encoder.event(kind, &obj))).await.is_err() {
                return;
            }
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
