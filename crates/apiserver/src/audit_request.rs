//! One request's audit trail, as upstream's `WithAudit` filter: the level by the policy once the
//! caller is known, the authorizer's decision as annotations, and the events of its stages
//! (long-running requests, watches and streams, have `ResponseStarted` when their headers go
//! out and `ResponseComplete` when they end). Every response carries its `Audit-Id`.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderValue, Request};
use http_body_util::BodyExt;
use skiff_rbac::Attributes;

use crate::ApiState;
use crate::audit::{Level, Record, Stage};
use crate::tls::Identity;

const AUDIT_ID: &str = "audit-id";

pub struct AuditCtx {
    audit_id: HeaderValue,
    received: jiff::Timestamp,
    request_uri: http::Uri,
    source_ip: Option<std::net::IpAddr>,
    user_agent: Option<HeaderValue>,
    level: Level,
    omit: u8,
    user: Identity,
    impersonated: Option<Identity>,
    attributes: Option<Attributes>,
    annotations: Vec<(&'static str, String)>,
    request_body: Option<Bytes>,
    long_running: bool,
}

/// What the request's handlers add to its audit event, shared by them and written when the
/// event is: admission's annotations (PodSecurity's), and the name of the object a create
/// sent (upstream's `LogRequestObject` fills `objectRef.name` from it).
#[derive(Clone, Default)]
pub struct AdmissionAnnotations(std::sync::Arc<parking_lot::Mutex<Handled>>);

#[derive(Default)]
struct Handled {
    annotations: Vec<(&'static str, String)>,
    object_name: String,
}

impl AdmissionAnnotations {
    pub fn add(&self, key: &'static str, value: String) {
        self.0.lock().annotations.push((key, value));
    }
    /// The name of the object the request sent (empty for a `generateName`).
    pub fn object_name(&self, name: &str) {
        name.clone_into(&mut self.0.lock().object_name);
    }
    pub fn take(&self) -> (Vec<(&'static str, String)>, String) {
        let mut handled = self.0.lock();
        (
            std::mem::take(&mut handled.annotations),
            std::mem::take(&mut handled.object_name),
        )
    }
}

impl AuditCtx {
    /// What the handlers added: admission's annotations, and the name of the object sent when
    /// the path named none (a create).
    pub fn handled(&mut self, (annotations, object_name): (Vec<(&'static str, String)>, String)) {
        self.admission_annotations(annotations);
        if let Some(a) = self.attributes.as_mut().filter(|a| a.name.is_empty()) {
            a.name = object_name;
        }
    }

    /// Annotations admission added (kept when the event is written at all).
    pub fn admission_annotations(&mut self, annotations: Vec<(&'static str, String)>) {
        if self.level > Level::None {
            self.annotations.extend(annotations);
        }
    }

    /// What an event needs of the request, kept as the request holds it (shared, not copied):
    /// the writer turns it into text.
    pub fn new(req: &Request<Body>) -> AuditCtx {
        // A client's own Audit-Id is kept, as upstream keeps it.
        let audit_id = req
            .headers()
            .get(AUDIT_ID)
            .filter(|v| !v.is_empty() && v.len() <= 128 && v.to_str().is_ok())
            .cloned()
            .unwrap_or_else(|| {
                // A v4 uuid from the thread's generator: no system call per request.
                let bytes: [u8; 16] = rand::random();
                let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
                let id = uuid::Builder::from_random_bytes(bytes).into_uuid();
                HeaderValue::from_bytes(id.hyphenated().encode_lower(&mut text).as_bytes())
                    .unwrap_or(HeaderValue::from_static("00000000-0000-0000-0000-000000000000"))
            });
        AuditCtx {
            audit_id,
            received: jiff::Timestamp::now(),
            request_uri: req.uri().clone(),
            source_ip: req
                .extensions()
                .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
                .map(|c| c.0.ip()),
            user_agent: req.headers().get(http::header::USER_AGENT).cloned(),
            level: Level::None,
            omit: 0,
            user: Identity::default(),
            impersonated: None,
            attributes: None,
            annotations: Vec::new(),
            request_body: None,
            long_running: false,
        }
    }

    /// The request's `Audit-Id`.
    pub fn audit_id(&self) -> &HeaderValue {
        &self.audit_id
    }

    /// The caller is known: the policy decides the level.
    pub fn begin(&mut self, state: &ApiState, user: &Identity, attributes: &Attributes) {
        if !state.audit.enabled() {
            return;
        }
        let (level, omit) = state.audit.policy().level(user, attributes);
        self.level = level;
        if level == Level::None {
            return;
        }
        self.omit = omit;
        self.long_running = attributes.verb == "watch"
            || (attributes.resource == "pods"
                && matches!(
                    attributes.subresource.as_str(),
                    "exec" | "attach" | "portforward" | "log"
                ));
        self.user = user.clone();
        if self.omit & Stage::RequestReceived.bit() == 0 {
            let mut record = self.record(Stage::RequestReceived, 0, None, None);
            record.attributes = Some(attributes.clone());
            state.audit.emit(record);
        }
    }

    /// The request's attributes, once the authorizers are done with them.
    pub fn attributes(&mut self, attributes: Attributes) {
        if self.level > Level::None {
            self.attributes = Some(attributes);
        }
    }

    pub fn impersonating(&mut self, user: &Identity) {
        if self.level > Level::None && *user != self.user {
            self.impersonated = Some(user.clone());
        }
    }

    pub fn decision(&mut self, allowed: bool, reason: &str) {
        if self.level > Level::None {
            self.annotations.push((
                "authorization.k8s.io/decision",
                if allowed { "allow" } else { "forbid" }.to_string(),
            ));
            self.annotations
                .push(("authorization.k8s.io/reason", reason.to_string()));
        }
    }

    pub fn request_body(&mut self, bytes: &Bytes) {
        if self.level >= Level::Request {
            self.request_body = Some(bytes.clone());
        }
    }

    fn record(&self, stage: Stage, code: u16, failure: Option<(String, String)>, response: Option<Bytes>) -> Record {
        Record {
            level: self.level,
            stage,
            audit_id: self.audit_id.clone(),
            request_uri: self.request_uri.clone(),
            verb: self.attributes.as_ref().map(|a| a.verb.clone()).unwrap_or_default(),
            user: self.user.clone(),
            impersonated: self.impersonated.clone(),
            source_ip: self.source_ip,
            user_agent: self.user_agent.clone(),
            attributes: self.attributes.clone(),
            code,
            failure,
            received: self.received,
            stage_time: jiff::Timestamp::now(),
            annotations: self.annotations.clone(),
            request_body: self.request_body.clone(),
            response_body: response,
        }
    }

    /// The last record of a request, taking what the context holds.
    fn into_record(
        self,
        stage: Stage,
        code: u16,
        failure: Option<(String, String)>,
        response: Option<Bytes>,
    ) -> Record {
        Record {
            level: self.level,
            stage,
            audit_id: self.audit_id,
            request_uri: self.request_uri,
            verb: self.attributes.as_ref().map(|a| a.verb.clone()).unwrap_or_default(),
            user: self.user,
            impersonated: self.impersonated,
            source_ip: self.source_ip,
            user_agent: self.user_agent,
            attributes: self.attributes,
            code,
            failure,
            received: self.received,
            stage_time: jiff::Timestamp::now(),
            annotations: self.annotations,
            request_body: self.request_body,
            response_body: response,
        }
    }

    fn emit(&self, state: &ApiState, record: Record) {
        if self.omit & record.stage.bit() == 0 {
            state.audit.emit(record);
        }
    }

    /// Records the response and returns it with its `Audit-Id`.
    pub async fn finish(self, state: &Arc<ApiState>, response: Response) -> Response {
        let (mut parts, body) = response.into_parts();
        parts.headers.insert(AUDIT_ID, self.audit_id.clone());
        if self.level == Level::None {
            return Response::from_parts(parts, body);
        }
        let code = parts.status.as_u16();
        let keep_body = code >= 400 || (self.level == Level::RequestResponse && !self.long_running);
        let (body, bytes) = if keep_body {
            match body.collect().await {
                Ok(collected) => {
                    let bytes = collected.to_bytes();
                    (Body::from(bytes.clone()), Some(bytes))
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reading a response for the audit log failed");
                    (Body::empty(), None)
                }
            }
        } else {
            (body, None)
        };
        let failure = (code >= 400)
            .then(|| {
                bytes
                    .as_ref()
                    .and_then(|b| serde_json::from_slice::<serde_json::Value>(b).ok())
            })
            .flatten()
            .map(|status| {
                let field = |k: &str| status.get(k).and_then(|v| v.as_str()).unwrap_or("").to_string();
                (field("reason"), field("message"))
            });
        let response_body = bytes.filter(|_| self.level == Level::RequestResponse);
        if self.long_running && code < 400 {
            let started = self.record(Stage::ResponseStarted, code, None, None);
            self.emit(state, started);
            let complete = self.record(Stage::ResponseComplete, code, None, None);
            let guard = (self.omit & Stage::ResponseComplete.bit() == 0).then(|| (state.clone(), complete));
            return Response::from_parts(
                parts,
                Body::new(Audited {
                    inner: body,
                    on_end: guard,
                }),
            );
        }
        if self.omit & Stage::ResponseComplete.bit() == 0 {
            state
                .audit
                .emit(self.into_record(Stage::ResponseComplete, code, failure, response_body));
        }
        Response::from_parts(parts, body)
    }
}

/// A long-running response's body: its `ResponseComplete` event is written when it ends.
struct Audited {
    inner: Body,
    on_end: Option<(Arc<ApiState>, Record)>,
}

impl http_body::Body for Audited {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Audited {
    fn drop(&mut self) {
        if let Some((state, mut record)) = self.on_end.take() {
            record.stage_time = jiff::Timestamp::now();
            state.audit.emit(record);
        }
    }
}
