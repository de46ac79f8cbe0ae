//! Dynamic admission: Mutating and ValidatingWebhookConfigurations called during admission, as
//! upstream's `apiserver/pkg/admission/plugin/webhook` calls them.
//!
//! The configurations are read from a snapshot kept by a watch inside the API server (never a
//! store read per request); with none configured, admission costs one read lock. Webhooks are
//! ordered by configuration name, then as their configuration lists them. Mutating webhooks run
//! one after another, each answering an `admission.k8s.io` AdmissionReview with an optional
//! JSONPatch; those with `reinvocationPolicy: IfNeeded` run once more when a later webhook
//! changed the object. Validating webhooks run in parallel after validation. A webhook's rules,
//! `matchPolicy`, namespace and object selectors decide whether it is called; its client
//! configuration is a URL or a Service (its ready endpoints, else its ClusterIP), verified
//! against `caBundle`. Failures follow `failurePolicy` with upstream's messages.
//! `matchConditions` (CEL over `object`, `oldObject` and `request`) must all hold for a webhook
//! to be called.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use parking_lot::{Mutex, RwLock};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use skiff_api::selector::LabelSelector;
use skiff_api::{Resource, StatusError};
use skiff_store::ListOptions;

use crate::handlers::Ctx;
use crate::objects;
use crate::server::ApiState;

const GROUP: &str = "admissionregistration.k8s.io";
/// The largest AdmissionReview answer read (upstream's limit on webhook responses).
const MAX_RESPONSE_BYTES: usize = 3 * 1024 * 1024;

/// Warnings gathered while a request is admitted, sent as `Warning:` headers with its answer
/// (upstream's `warning.AddWarning`), refused or not.
#[derive(Clone, Default)]
pub struct Warnings(Arc<Mutex<Vec<String>>>);

impl Warnings {
    pub fn add(&self, w: impl Into<String>) {
        self.0.lock().push(w.into());
    }
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock())
    }
}

/// The admission operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        }
    }
    fn options_kind(self) -> &'static str {
        match self {
            Operation::Create => "CreateOptions",
            Operation::Update => "UpdateOptions",
            Operation::Delete => "DeleteOptions",
            Operation::Connect => "",
        }
    }
}

/// One rule of a webhook (`RuleWithOperations`, scope defaulted to `*`).
#[derive(Clone, Debug, Default)]
pub struct Rule {
    pub operations: Vec<String>,
    pub groups: Vec<String>,
    pub versions: Vec<String>,
    pub resources: Vec<String>,
    pub scope: String,
}

/// What a request is, as the rules see it.
#[derive(Clone, Debug)]
pub struct RequestAttrs<'a> {
    pub operation: Operation,
    pub group: &'a str,
    pub version: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    /// For a Namespace object, its own name (upstream's attributes).
    pub namespace: &'a str,
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default()
}

impl Rule {
    pub(crate) fn from_json(v: &Value) -> Rule {
        Rule {
            operations: strings(v.get("operations")),
            groups: strings(v.get("apiGroups")),
            versions: strings(v.get("apiVersions")),
            resources: strings(v.get("resources")),
            scope: v.get("scope").and_then(Value::as_str).unwrap_or("*").to_string(),
        }
    }

    /// upstream's `rules.Matcher.Matches`.
    pub fn matches(&self, a: &RequestAttrs) -> bool {
        let any = |list: &[String], v: &str| list.iter().any(|x| x == "*" || x == v);
        any(&self.operations, a.operation.as_str())
            && any(&self.groups, a.group)
            && any(&self.versions, a.version)
            && self.resource_matches(a.resource, a.subresource)
            && self.scope_matches(a)
    }

    fn resource_matches(&self, resource: &str, subresource: &str) -> bool {
        self.resources.iter().any(|r| {
            if r == "*/*" {
                return true;
            }
            match r.split_once('/') {
                Some((res, sub)) => (res == "*" || res == resource) && (sub == "*" || sub == subresource),
                None => subresource.is_empty() && (r == "*" || r == resource),
            }
        })
    }

    fn scope_matches(&self, a: &RequestAttrs) -> bool {
        let is_namespace = a.group.is_empty() && a.version == "v1" && a.resource == "namespaces";
        match self.scope.as_str() {
            "*" | "" => true,
            "Namespaced" => !is_namespace && !a.namespace.is_empty(),
            "Cluster" => is_namespace || a.namespace.is_empty(),
            _ => false,
        }
    }
}

/// Where a webhook is reached.
#[derive(Clone, Debug)]
enum Client {
    Url(String),
    Service {
        namespace: String,
        name: String,
        port: u16,
        path: String,
    },
}

/// One webhook of a configuration, ready to be matched and called.
struct Hook {
    name: String,
    rules: Vec<Rule>,
    ignore_failures: bool,
    exact: bool,
    namespace_selector: LabelSelector,
    object_selector: LabelSelector,
    timeout: Duration,
    client: Client,
    tls: Arc<rustls::ClientConfig>,
    review_version: &'static str,
    reinvoke: bool,
    /// `matchConditions`: the webhook is called only when all are true.
    match_conditions: Vec<(String, Arc<skiff_api::cel::Program>)>,
    /// Why this webhook cannot be called (a `caBundle` that is no certificate, a match condition
    /// that no longer compiles, a selector that does not parse): every call to it fails, and
    /// its `failurePolicy` decides, as upstream's client errors do. It matches as widely as
    /// what of it could be read says.
    broken: Option<String>,
}

/// The webhooks configured now, mutating and validating, in the order they run.
#[derive(Default)]
struct Snapshot {
    mutating: Vec<Arc<Hook>>,
    validating: Vec<Arc<Hook>>,
}

/// The configured webhooks (kept current by [`spawn`]).
#[derive(Default)]
pub struct Webhooks {
    snapshot: RwLock<Arc<Snapshot>>,
    /// The ValidatingAdmissionPolicies with their bindings.
    pub(crate) policies: RwLock<Arc<crate::validatingadmissionpolicy::Snapshot>>,
    /// Reloads one at a time, so the last snapshot swapped in is the last one read.
    reloading: tokio::sync::Mutex<()>,
}

fn config_resource(kind: &str) -> Option<&'static Resource> {
    skiff_api::registry::lookup_kind(GROUP, kind)
}

/// Read every configuration into the snapshot.
async fn reload(state: &ApiState) -> anyhow::Result<()> {
    let _one = state.webhooks.reloading.lock().await;
    let mut snap = Snapshot::default();
    for (kind, mutating) in [
        ("MutatingWebhookConfiguration", true),
        ("ValidatingWebhookConfiguration", false),
    ] {
        let Some(res) = config_resource(kind) else { continue };
        let list = state
            .store
            .list(&objects::prefix(res, ""), ListOptions::default())
            .await?;
        let mut configs: Vec<Value> = list.items.iter().filter_map(objects::decode_kv).collect();
        configs.sort_by(|a, b| objects::name(a).cmp(objects::name(b)));
        let hooks = configs
            .iter()
            .flat_map(|c| c.get("webhooks").and_then(Value::as_array).cloned().unwrap_or_default())
            .map(|h| {
                let hook = build_hook(&h);
                if let Some(why) = &hook.broken {
                    tracing::warn!(webhook = %hook.name, error = %why, "a webhook cannot be called; its failurePolicy decides");
                }
                Arc::new(hook)
            });
        if mutating {
            snap.mutating = hooks.collect();
        } else {
            snap.validating = hooks.collect();
        }
    }
    *state.webhooks.snapshot.write() = Arc::new(snap);
    let policies = crate::validatingadmissionpolicy::load(state).await?;
    *state.webhooks.policies.write() = Arc::new(policies);
    Ok(())
}

fn build_hook(h: &Value) -> Hook {
    let mut broken: Vec<String> = Vec::new();
    let cc = h.get("clientConfig").cloned().unwrap_or_else(|| json!({}));
    let client = match (cc.get("url").and_then(Value::as_str), cc.get("service")) {
        (Some(url), _) => Client::Url(url.to_string()),
        (None, Some(svc)) => Client::Service {
            namespace: svc.get("namespace").and_then(Value::as_str).unwrap_or("").to_string(),
            name: svc.get("name").and_then(Value::as_str).unwrap_or("").to_string(),
            port: svc
                .get("port")
                .and_then(Value::as_u64)
                .and_then(|p| u16::try_from(p).ok())
                .unwrap_or(443),
            path: svc.get("path").and_then(Value::as_str).unwrap_or("").to_string(),
        },
        (None, None) => {
            broken.push("no url or service".into());
            Client::Url(String::new())
        }
    };
    let ca = cc.get("caBundle").and_then(Value::as_str).unwrap_or("");
    let mut selector = |k: &str| match h.get(k).map(LabelSelector::from_label_selector_json).transpose() {
        Ok(s) => s.unwrap_or_else(LabelSelector::everything),
        Err(e) => {
            broken.push(format!("{k}: {e}"));
            LabelSelector::everything()
        }
    };
    let namespace_selector = selector("namespaceSelector");
    let object_selector = selector("objectSelector");
    let versions = strings(h.get("admissionReviewVersions"));
    let review_version = if versions.iter().any(|v| v == "v1") || versions.is_empty() {
        "v1"
    } else {
        "v1beta1"
    };
    let tls = match tls_config(ca) {
        Ok(c) => c,
        Err(e) => {
            broken.push(format!("clientConfig.caBundle: {e:#}"));
            // No root at all: nothing is trusted, nothing is called.
            empty_tls()
        }
    };
    let mut match_conditions = Vec::new();
    for c in h
        .get("matchConditions")
        .and_then(Value::as_array)
        .map(|a| a.as_slice())
        .unwrap_or_default()
    {
        let expr = c.get("expression").and_then(Value::as_str).unwrap_or("");
        let name = c.get("name").and_then(Value::as_str).unwrap_or("").to_string();
        match skiff_api::cel::compile(expr, skiff_api::validation::admissionregistration::WEBHOOK_VARS) {
            Ok(program) => match_conditions.push((name, program)),
            Err(e) => broken.push(format!("matchConditions[{name}]: compilation failed: {e}")),
        }
    }
    if !broken.is_empty() {
        // What could not be read narrows nothing: the webhook then matches whatever its rules
        // match, and fails (or is ignored) as its failurePolicy says.
        match_conditions.clear();
    }
    Hook {
        name: h.get("name").and_then(Value::as_str).unwrap_or("").to_string(),
        rules: h
            .get("rules")
            .and_then(Value::as_array)
            .map(|rs| rs.iter().map(Rule::from_json).collect())
            .unwrap_or_default(),
        ignore_failures: h.get("failurePolicy").and_then(Value::as_str) == Some("Ignore"),
        exact: h.get("matchPolicy").and_then(Value::as_str) == Some("Exact"),
        namespace_selector,
        object_selector,
        timeout: Duration::from_secs(
            h.get("timeoutSeconds")
                .and_then(Value::as_u64)
                .unwrap_or(10)
                .clamp(1, 30),
        ),
        client,
        tls: Arc::new(tls),
        review_version,
        reinvoke: h.get("reinvocationPolicy").and_then(Value::as_str) == Some("IfNeeded"),
        match_conditions,
        broken: (!broken.is_empty()).then(|| broken.join("; ")),
    }
}

/// A TLS client that trusts nothing (a webhook whose `caBundle` cannot be read).
fn empty_tls() -> rustls::ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    match rustls::ClientConfig::builder_with_provider(provider).with_safe_default_protocol_versions() {
        Ok(b) => b
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth(),
        Err(_) => rustls::ClientConfig::builder()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth(),
    }
}

/// A TLS client trusting `caBundle` (base64 of PEM), or the system's roots without one.
fn tls_config(ca_bundle_b64: &str) -> anyhow::Result<rustls::ClientConfig> {
    let Some(verifier) = BundleVerifier::new(ca_bundle_b64)? else {
        // No system roots on this host: nothing is trusted, as with an empty bundle.
        let mut config = empty_tls();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        return Ok(config);
    };
    let mut config = rustls::ClientConfig::builder_with_provider(verifier.provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Verifies a webhook's serving certificate as upstream's Go client does: a chain to a
/// `caBundle` certificate, or the served certificate being one of the bundle's own. Go trusts
/// a certificate found in its root pool as it is (its validity period and names still
/// checked), so a self-signed CA certificate serving as its own end entity, which operator
/// frameworks generate, is accepted where a chain verifier alone refuses a CA as end entity.
#[derive(Debug)]
struct BundleVerifier {
    webpki: Arc<rustls::client::WebPkiServerVerifier>,
    bundle: Vec<CertificateDer<'static>>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl BundleVerifier {
    /// The verifier for `caBundle` (base64 of PEM), or the system's roots without one; `None`
    /// when there is no root at all.
    fn new(ca_bundle_b64: &str) -> anyhow::Result<Option<BundleVerifier>> {
        let pem = if ca_bundle_b64.is_empty() {
            std::fs::read("/etc/ssl/certs/ca-certificates.crt").unwrap_or_default()
        } else {
            base64::engine::general_purpose::STANDARD.decode(ca_bundle_b64)?
        };
        let bundle: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem).flatten().collect();
        let mut roots = rustls::RootCertStore::empty();
        for cert in &bundle {
            let _ = roots.add(cert.clone());
        }
        if roots.is_empty() {
            if !ca_bundle_b64.is_empty() {
                anyhow::bail!("no PEM certificate in it");
            }
            return Ok(None);
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let webpki =
            rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone()).build()?;
        Ok(Some(BundleVerifier {
            webpki,
            // Only a bundle's own certificates stand for themselves, never the system's roots.
            bundle: if ca_bundle_b64.is_empty() { Vec::new() } else { bundle },
            provider,
        }))
    }
}

impl rustls::client::danger::ServerCertVerifier for BundleVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let chained = self
            .webpki
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now);
        if chained.is_ok() || !self.bundle.iter().any(|c| c.as_ref() == end_entity.as_ref()) {
            return chained;
        }
        let parsed = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_name(&parsed, server_name)?;
        let in_period = x509_parser::parse_x509_certificate(end_entity.as_ref())
            .ok()
            .and_then(|(_, c)| {
                let at = x509_parser::time::ASN1Time::from_timestamp(i64::try_from(now.as_secs()).ok()?).ok()?;
                Some(c.validity().is_valid_at(at))
            })
            .unwrap_or(false);
        if !in_period {
            return Err(rustls::Error::InvalidCertificate(rustls::CertificateError::Expired));
        }
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    // Signatures are checked as the chain verifier checks them.
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// Whether `res` is one of the webhook configurations.
pub fn is_configuration(res: &Resource) -> bool {
    res.group == GROUP
        && matches!(
            res.plural,
            "validatingwebhookconfigurations"
                | "mutatingwebhookconfigurations"
                | "validatingadmissionpolicies"
                | "validatingadmissionpolicybindings"
        )
}

/// Read the configurations again now (after a write to one through this server).
pub async fn refresh(state: &ApiState) {
    if let Err(e) = reload(state).await {
        tracing::warn!(error = %e, "reading webhook configurations failed");
    }
}

/// Keep the snapshot current: read at start (before the server answers), then after every
/// change to a configuration.
pub async fn load(state: &ApiState) -> anyhow::Result<()> {
    reload(state).await
}

pub fn spawn(state: Arc<ApiState>) {
    tokio::spawn(async move {
        let store = state.store.clone();
        let Some(m) = config_resource("MutatingWebhookConfiguration") else {
            return;
        };
        let Some(v) = config_resource("ValidatingWebhookConfiguration") else {
            return;
        };
        let Some(p) = config_resource("ValidatingAdmissionPolicy") else {
            return;
        };
        let Some(b) = config_resource("ValidatingAdmissionPolicyBinding") else {
            return;
        };
        loop {
            let from = match store.current_revision().await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the revision for webhook configurations failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            if let Err(e) = reload(&state).await {
                tracing::warn!(error = %e, "reading webhook configurations failed");
            }
            let watches = futures::future::try_join4(
                store.watch(&objects::prefix(m, ""), from),
                store.watch(&objects::prefix(v, ""), from),
                store.watch(&objects::prefix(p, ""), from),
                store.watch(&objects::prefix(b, ""), from),
            )
            .await;
            let mut events = match watches {
                Ok((a, b, c, d)) => futures::stream::select_all([a, b, c, d]),
                Err(e) => {
                    tracing::warn!(error = %e, "watching webhook configurations failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            while events.next().await.is_some() {
                if let Err(e) = reload(&state).await {
                    tracing::warn!(error = %e, "reading webhook configurations failed");
                }
            }
        }
    });
}

/// upstream's `IsExemptAdmissionConfigurationResource`: webhooks never judge the objects that
/// configure admission.
pub(crate) fn exempt(res: &Resource) -> bool {
    res.group == GROUP
        && matches!(
            res.plural,
            "validatingwebhookconfigurations"
                | "mutatingwebhookconfigurations"
                | "validatingadmissionpolicies"
                | "validatingadmissionpolicybindings"
                | "mutatingadmissionpolicies"
                | "mutatingadmissionpolicybindings"
        )
}

/// A request under admission.
pub struct Attributes<'a> {
    pub operation: Operation,
    pub object: Option<&'a Value>,
    pub old: Option<&'a Value>,
    /// The kind of `object` when it is not the resource's own (a subresource's: an Eviction,
    /// a Binding, a TokenRequest, a connect request's PodExecOptions).
    pub kind: Option<Gvk<'a>>,
}

/// A group, version and kind.
#[derive(Clone, Copy, Debug)]
pub struct Gvk<'a> {
    pub group: &'a str,
    pub version: &'a str,
    pub kind: &'a str,
}

impl Webhooks {
    fn current(&self) -> Arc<Snapshot> {
        self.snapshot.read().clone()
    }
}

/// The namespace of the request as admission sees it (a Namespace's own name).
pub(crate) fn attr_namespace(ctx: &Ctx, obj: Option<&Value>) -> String {
    let res = ctx.rr.resource;
    if res.group.is_empty() && res.plural == "namespaces" {
        if !ctx.rr.name.is_empty() {
            return ctx.rr.name.clone();
        }
        return obj.map(objects::name).unwrap_or("").to_string();
    }
    ctx.rr.namespace.clone()
}

/// Which version of the resource a webhook is called with: the request's own when a rule
/// matches it, else (matchPolicy Equivalent) another served version of the same resource.
fn matching_resource(hook: &Hook, ctx: &Ctx, op: Operation, ns: &str) -> Option<&'static Resource> {
    rules_match(&hook.rules, hook.exact, ctx, op, ns)
}

/// The resource (the request's own, else under `matchPolicy: Equivalent` another served
/// version of it) that one of `rules` matches.
pub(crate) fn rules_match(
    rules: &[Rule],
    exact: bool,
    ctx: &Ctx,
    op: Operation,
    ns: &str,
) -> Option<&'static Resource> {
    let res = ctx.rr.resource;
    let attrs = |r: &'static Resource| RequestAttrs {
        operation: op,
        group: r.group,
        version: r.version,
        resource: r.plural,
        subresource: &ctx.rr.subresource,
        namespace: ns,
    };
    if rules.iter().any(|rule| rule.matches(&attrs(res))) {
        return Some(res);
    }
    if exact {
        return None;
    }
    skiff_api::registry::all()
        .into_iter()
        .filter(|r| r.group == res.group && r.plural == res.plural && r.version != res.version)
        .find(|r| rules.iter().any(|rule| rule.matches(&attrs(r))))
}

fn labels_match(sel: &LabelSelector, obj: Option<&Value>) -> bool {
    obj.is_some_and(|o| sel.matches_object(o))
}

/// Whether a webhook's selectors let the request through (upstream's `ShouldCallHook`).
async fn selectors_match(ctx: &Ctx, hook: &Hook, ns: &str, a: &Attributes<'_>) -> Result<bool, StatusError> {
    selectors_allow(ctx, &hook.namespace_selector, &hook.object_selector, ns, a).await
}

/// Whether a namespace and an object selector let the request through.
pub(crate) async fn selectors_allow(
    ctx: &Ctx,
    namespace_selector: &LabelSelector,
    object_selector: &LabelSelector,
    ns: &str,
    a: &Attributes<'_>,
) -> Result<bool, StatusError> {
    if !object_selector.is_empty() && !labels_match(object_selector, a.object) && !labels_match(object_selector, a.old)
    {
        return Ok(false);
    }
    if namespace_selector.is_empty() {
        return Ok(true);
    }
    let res = ctx.rr.resource;
    let is_namespace = res.group.is_empty() && res.plural == "namespaces";
    if is_namespace {
        // A Namespace is judged by its own labels.
        return Ok(labels_match(namespace_selector, a.object.or(a.old)));
    }
    if ns.is_empty() {
        // Cluster-scoped objects always match a namespace selector.
        return Ok(true);
    }
    let Some(namespaces) = skiff_api::registry::lookup("", "v1", "namespaces") else {
        return Ok(true);
    };
    let kv = ctx
        .state
        .store
        .get(&objects::key(namespaces, "", ns))
        .await
        .map_err(|e| ctx.store_err(e))?;
    match kv.and_then(|kv| objects::decode_kv(&kv)) {
        Some(n) => Ok(namespace_selector.matches_object(&n)),
        None => Err(StatusError::not_found("", "namespaces", ns)),
    }
}

/// The webhooks of `list` that apply to this request, with the resource each is called with.
async fn matching(
    ctx: &Ctx,
    list: &[Arc<Hook>],
    a: &Attributes<'_>,
) -> Result<Vec<(Arc<Hook>, &'static Resource)>, StatusError> {
    let ns = attr_namespace(ctx, a.object.or(a.old));
    let mut out = Vec::new();
    for hook in list {
        let Some(res) = matching_resource(hook, ctx, a.operation, &ns) else {
            continue;
        };
        if selectors_match(ctx, hook, &ns, a).await? && conditions_match(ctx, hook, res, a)? {
            out.push((hook.clone(), res));
        }
    }
    Ok(out)
}

/// upstream's match conditions: every condition true calls the webhook, any false skips it,
/// and an evaluation error follows the webhook's failure policy.
fn conditions_match(ctx: &Ctx, hook: &Hook, res: &Resource, a: &Attributes<'_>) -> Result<bool, StatusError> {
    if hook.match_conditions.is_empty() {
        return Ok(true);
    }
    let object = as_version(a.object, res);
    let old = as_version(a.old, res);
    let request = admission_request(ctx, res, a, "");
    let vars = [("object", &object), ("oldObject", &old), ("request", &request)];
    for (name, cond) in &hook.match_conditions {
        match cond.eval_bool(&vars) {
            Ok(true) => {}
            Ok(false) => return Ok(false),
            Err(e) => {
                let e = CallError(format!("failed to evaluate match condition '{name}': {e}"));
                return match failed(hook, e) {
                    None => Ok(false),
                    Some(err) => Err(err),
                };
            }
        }
    }
    Ok(true)
}

/// An object as the version `res` serves it (versions of one kind here differ only in
/// `apiVersion`, as custom resources without conversion do).
fn as_version(obj: Option<&Value>, res: &Resource) -> Value {
    match obj {
        None => Value::Null,
        Some(o) => {
            let mut o = o.clone();
            if let Some(m) = o.as_object_mut()
                && m.contains_key("apiVersion")
            {
                m.insert("apiVersion".into(), json!(res.api_version()));
            }
            o
        }
    }
}

fn review(ctx: &Ctx, hook: &Hook, res: &Resource, a: &Attributes<'_>, uid: &str) -> Value {
    json!({
        "kind": "AdmissionReview",
        "apiVersion": format!("admission.k8s.io/{}", hook.review_version),
        "request": admission_request(ctx, res, a, uid),
    })
}

/// The `admission.k8s.io` AdmissionRequest of a request, as webhooks receive it and CEL's
/// `request` variable shows it.
pub(crate) fn admission_request(ctx: &Ctx, res: &Resource, a: &Attributes<'_>, uid: &str) -> Value {
    let req = ctx.rr.resource;
    let gvk = |r: &Resource| json!({"group": r.group, "version": r.version, "kind": r.kind});
    let gvr = |r: &Resource| json!({"group": r.group, "version": r.version, "resource": r.plural});
    let name = if ctx.rr.name.is_empty() {
        a.object.map(objects::name).unwrap_or("").to_string()
    } else {
        ctx.rr.name.clone()
    };
    let mut r = serde_json::Map::new();
    r.insert("uid".into(), json!(uid));
    match a.kind {
        Some(k) => r.insert(
            "kind".into(),
            json!({"group": k.group, "version": k.version, "kind": k.kind}),
        ),
        None => r.insert("kind".into(), gvk(res)),
    };
    r.insert("resource".into(), gvr(res));
    if !ctx.rr.subresource.is_empty() {
        r.insert("subResource".into(), json!(ctx.rr.subresource));
        r.insert("requestSubResource".into(), json!(ctx.rr.subresource));
    }
    match a.kind {
        Some(k) => r.insert(
            "requestKind".into(),
            json!({"group": k.group, "version": k.version, "kind": k.kind}),
        ),
        None => r.insert("requestKind".into(), gvk(req)),
    };
    r.insert("requestResource".into(), gvr(req));
    if !name.is_empty() {
        r.insert("name".into(), json!(name));
    }
    let ns = attr_namespace(ctx, a.object.or(a.old));
    if !ns.is_empty() {
        r.insert("namespace".into(), json!(ns));
    }
    r.insert("operation".into(), json!(a.operation.as_str()));
    let mut user = serde_json::Map::new();
    user.insert("username".into(), json!(ctx.user.user));
    if !ctx.user.uid.is_empty() {
        user.insert("uid".into(), json!(ctx.user.uid));
    }
    if !ctx.user.groups.is_empty() {
        user.insert("groups".into(), json!(ctx.user.groups));
    }
    if !ctx.user.extra.is_empty() {
        user.insert("extra".into(), json!(ctx.user.extra));
    }
    r.insert("userInfo".into(), Value::Object(user));
    if a.kind.is_some() {
        // A subresource's own object is sent as it came.
        r.insert("object".into(), a.object.cloned().unwrap_or(Value::Null));
        r.insert("oldObject".into(), a.old.cloned().unwrap_or(Value::Null));
    } else {
        r.insert("object".into(), as_version(a.object, res));
        r.insert("oldObject".into(), as_version(a.old, res));
    }
    r.insert("dryRun".into(), json!(ctx.dry_run()));
    let kind = a.operation.options_kind();
    if !kind.is_empty() {
        let mut o = serde_json::Map::new();
        o.insert("kind".into(), json!(kind));
        o.insert("apiVersion".into(), json!("meta.k8s.io/v1"));
        if ctx.dry_run() {
            o.insert("dryRun".into(), json!(["All"]));
        }
        if let Some(m) = ctx.param("fieldManager").filter(|m| !m.is_empty())
            && a.operation != Operation::Delete
        {
            o.insert("fieldManager".into(), json!(m));
        }
        r.insert("options".into(), Value::Object(o));
    }
    Value::Object(r)
}

/// What a webhook answered.
#[derive(Debug)]
struct Answer {
    allowed: bool,
    status: Option<Value>,
    patch: Option<Vec<u8>>,
    warnings: Vec<String>,
}

/// A call that did not produce an answer (upstream's `ErrCallingWebhook`): the text after
/// `failed calling webhook "NAME": `.
#[derive(Debug)]
struct CallError(String);

/// Where a call goes: the address dialled, the TLS server name, the request path, and the URL
/// as upstream's messages show it (with its `?timeout=`).
struct Endpoint {
    host: String,
    port: u16,
    server_name: String,
    path: String,
    shown: String,
}

async fn endpoint(ctx: &Ctx, hook: &Hook) -> Result<Endpoint, CallError> {
    let timeout = hook.timeout.as_secs();
    match &hook.client {
        Client::Url(url) => {
            let uri: http::Uri = url
                .parse()
                .map_err(|e| CallError(format!("failed to call webhook: parse {url:?}: {e}")))?;
            let host = uri
                .host()
                .unwrap_or("")
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            Ok(Endpoint {
                server_name: host.clone(),
                host,
                port: uri.port_u16().unwrap_or(443),
                path: uri.path().to_string(),
                shown: format!("{url}?timeout={timeout}s"),
            })
        }
        Client::Service {
            namespace,
            name,
            port,
            path,
        } => {
            let server_name = format!("{name}.{namespace}.svc");
            let path = if path.is_empty() { "/".to_string() } else { path.clone() };
            let shown = format!("https://{server_name}:{port}{path}?timeout={timeout}s");
            let (host, p) = resolve_service(ctx, namespace, name, *port)
                .await
                .map_err(|e| CallError(format!("failed to call webhook: Post {shown:?}: {e}")))?;
            Ok(Endpoint {
                host,
                port: p,
                server_name,
                path,
                shown,
            })
        }
    }
}

/// A Service's port reached through one of its ready endpoints (the pod's address and target
/// port), else its ClusterIP.
async fn resolve_service(ctx: &Ctx, ns: &str, name: &str, port: u16) -> Result<(String, u16), String> {
    let store = &ctx.state.store;
    let services = skiff_api::registry::lookup("", "v1", "services").ok_or("no services")?;
    let svc = store
        .get(&objects::key(services, ns, name))
        .await
        .map_err(|e| e.to_string())?
        .and_then(|kv| objects::decode_kv(&kv))
        .ok_or_else(|| format!("service \"{name}\" not found"))?;
    let ports = svc
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let sp = ports
        .iter()
        .find(|p| p.get("port").and_then(Value::as_u64) == Some(u64::from(port)))
        .ok_or_else(|| format!("no service port {port} found for service \"{name}\""))?;
    let port_name = sp.get("name").and_then(Value::as_str).unwrap_or("");
    if let Some(slices) = skiff_api::registry::lookup("discovery.k8s.io", "v1", "endpointslices") {
        let list = store
            .list(&objects::prefix(slices, ns), ListOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        for s in list.items.iter().filter_map(objects::decode_kv) {
            if s.pointer("/metadata/labels/kubernetes.io~1service-name")
                .and_then(Value::as_str)
                != Some(name)
            {
                continue;
            }
            let target = s.get("ports").and_then(Value::as_array).and_then(|ps| {
                ps.iter()
                    .find(|p| p.get("name").and_then(Value::as_str).unwrap_or("") == port_name)
                    .and_then(|p| p.get("port").and_then(Value::as_u64))
                    .and_then(|p| u16::try_from(p).ok())
            });
            let Some(target) = target else { continue };
            let ready = s.get("endpoints").and_then(Value::as_array).and_then(|eps| {
                eps.iter()
                    .filter(|e| e.pointer("/conditions/ready").and_then(Value::as_bool) != Some(false))
                    .find_map(|e| e.pointer("/addresses/0").and_then(Value::as_str))
            });
            if let Some(addr) = ready {
                return Ok((addr.to_string(), target));
            }
        }
    }
    match svc.pointer("/spec/clusterIP").and_then(Value::as_str) {
        Some(ip) if !ip.is_empty() && ip != "None" => Ok((ip.to_string(), port)),
        _ => Err(format!("service \"{name}\" has no ready endpoints and no cluster IP")),
    }
}

/// Go's wording of a failed dial.
fn dial_error(host: &str, port: u16, e: &std::io::Error) -> String {
    let addr = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let why = match e.kind() {
        std::io::ErrorKind::ConnectionRefused => "connect: connection refused".to_string(),
        _ => e.to_string(),
    };
    format!("dial tcp {addr}: {why}")
}

/// POST the review to the webhook and read its answer.
async fn call(ctx: &Ctx, hook: &Hook, body: Value, uid: &str) -> Result<Answer, CallError> {
    if let Some(why) = &hook.broken {
        return Err(CallError(format!("failed to call webhook: {why}")));
    }
    let Endpoint {
        host,
        port,
        server_name,
        path,
        shown,
    } = endpoint(ctx, hook).await?;
    let fail = |why: String| CallError(format!("failed to call webhook: Post {shown:?}: {why}"));
    let path = if path.is_empty() { "/" } else { path.as_str() };
    let target = format!("{path}?timeout={}s", hook.timeout.as_secs());
    let bytes = serde_json::to_vec(&body).map_err(|e| fail(e.to_string()))?;
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| dial_error(&host, port, &e))?;
        let name = ServerName::try_from(server_name.clone()).map_err(|e| e.to_string())?;
        let tls = tokio_rustls::TlsConnector::from(hook.tls.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| format!("tls: failed to verify certificate: {e}"))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let authority = if port == 443 {
            server_name.clone()
        } else {
            format!("{server_name}:{port}")
        };
        let req = http::Request::post(&target)
            .header(http::header::HOST, authority)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json, */*")
            .body(Full::new(Bytes::from(bytes)))
            .map_err(|e| e.to_string())?;
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok::<_, String>((status, body))
    };
    let (status, body) = match tokio::time::timeout(hook.timeout, exchange).await {
        Err(_) => return Err(fail("context deadline exceeded".into())),
        Ok(Err(e)) => return Err(fail(e)),
        Ok(Ok(r)) => r,
    };
    if !status.is_success() {
        return Err(CallError(format!(
            "failed to call webhook: an error on the server ({:?}) has prevented the request from succeeding",
            String::from_utf8_lossy(&body).trim()
        )));
    }
    let review: Value = serde_json::from_slice(&body).map_err(|e| CallError(format!("failed to call webhook: {e}")))?;
    parse_answer(&review, hook.review_version, uid)
        .map_err(|e| CallError(format!("received invalid webhook response: {e}")))
}

/// upstream's `VerifyAdmissionResponse`.
fn parse_answer(review: &Value, version: &str, uid: &str) -> Result<Answer, String> {
    let api = review.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = review.get("kind").and_then(Value::as_str).unwrap_or("");
    let want = format!("admission.k8s.io/{version}");
    if api != want || kind != "AdmissionReview" {
        return Err(format!(
            "expected webhook response of {want}, Kind=AdmissionReview, got {api}, Kind={kind}"
        ));
    }
    let r = review
        .get("response")
        .filter(|r| r.is_object())
        .ok_or("webhook response was absent")?;
    let got = r.get("uid").and_then(Value::as_str).unwrap_or("");
    if got != uid {
        return Err(format!("expected response.uid={uid:?}, got {got:?}"));
    }
    let patch = match r.get("patch").and_then(Value::as_str) {
        None | Some("") => None,
        Some(p) => {
            let pt = r.get("patchType").and_then(Value::as_str).unwrap_or("");
            if pt != "JSONPatch" {
                return Err(format!(
                    "webhook returned response.patch but not response.patchType; expected JSONPatch, got {pt:?}"
                ));
            }
            Some(
                base64::engine::general_purpose::STANDARD
                    .decode(p)
                    .map_err(|e| format!("illegal base64 in response.patch: {e}"))?,
            )
        }
    };
    Ok(Answer {
        allowed: r.get("allowed").and_then(Value::as_bool).unwrap_or(false),
        status: r.get("status").cloned(),
        patch,
        warnings: strings(r.get("warnings")),
    })
}

/// upstream's `webhookerrors.ToStatusErr`: a denial with the webhook's code (at least 400).
fn denied(name: &str, status: Option<&Value>) -> StatusError {
    let by = format!("admission webhook {name:?} denied the request");
    let s = status.cloned().unwrap_or_else(|| json!({}));
    let code = s.get("code").and_then(Value::as_u64).unwrap_or(0);
    let code = if code < 400 {
        400
    } else {
        u16::try_from(code).unwrap_or(400)
    };
    let message = s.get("message").and_then(Value::as_str).unwrap_or("");
    let reason = s.get("reason").and_then(Value::as_str).unwrap_or("");
    let text = if !message.is_empty() {
        format!("{by}: {message}")
    } else if !reason.is_empty() {
        format!("{by}: {reason}")
    } else {
        format!("{by} without explanation")
    };
    StatusError::new(code, reason, text)
}

/// A call failure under the webhook's failure policy: `None` when it is ignored.
fn failed(hook: &Hook, e: CallError) -> Option<StatusError> {
    let text = format!("failed calling webhook {:?}: {}", hook.name, e.0);
    if hook.ignore_failures {
        tracing::warn!(webhook = %hook.name, error = %text, "failed calling webhook, failing open");
        return None;
    }
    tracing::warn!(webhook = %hook.name, error = %text, "failed calling webhook, failing closed");
    Some(StatusError::internal(text))
}

/// The mutating webhooks: `obj` is patched in place. Returns whether any webhook changed it.
pub async fn mutate(
    ctx: &Ctx,
    operation: Operation,
    obj: Option<&mut Value>,
    old: Option<&Value>,
) -> Result<bool, StatusError> {
    mutate_as(ctx, operation, obj, old, None).await
}

async fn mutate_as(
    ctx: &Ctx,
    operation: Operation,
    obj: Option<&mut Value>,
    old: Option<&Value>,
    kind: Option<Gvk<'_>>,
) -> Result<bool, StatusError> {
    if exempt(ctx.rr.resource) {
        return Ok(false);
    }
    let snap = ctx.state.webhooks.current();
    if snap.mutating.is_empty() {
        return Ok(false);
    }
    let mut empty = None;
    let obj = match obj {
        Some(o) => o,
        None => empty.get_or_insert(Value::Null),
    };
    let has_object = !obj.is_null();
    let hooks = {
        let a = Attributes {
            operation,
            object: has_object.then_some(&*obj),
            old,
            kind,
        };
        matching(ctx, &snap.mutating, &a).await?
    };
    let mut changed = false;
    // Which webhooks ran, and the index of the last one that changed the object.
    let mut last_change = None;
    let m = Mutation {
        operation,
        old,
        has_object,
        kind,
    };
    for (i, (hook, res)) in hooks.iter().enumerate() {
        if call_mutating(ctx, hook, res, obj, m).await? {
            changed = true;
            last_change = Some(i);
        }
    }
    // reinvocationPolicy IfNeeded: once more when a later webhook changed the object.
    if let Some(last) = last_change {
        for (hook, res) in hooks[..last].iter().filter(|(h, _)| h.reinvoke) {
            if call_mutating(ctx, hook, res, obj, m).await? {
                changed = true;
            }
        }
    }
    Ok(changed)
}

/// What a mutating call is about, besides the object it may change.
#[derive(Clone, Copy)]
struct Mutation<'a> {
    operation: Operation,
    old: Option<&'a Value>,
    has_object: bool,
    kind: Option<Gvk<'a>>,
}

async fn call_mutating(
    ctx: &Ctx,
    hook: &Hook,
    res: &Resource,
    obj: &mut Value,
    m: Mutation<'_>,
) -> Result<bool, StatusError> {
    let Mutation {
        operation,
        old,
        has_object,
        kind,
    } = m;
    let uid = uuid::Uuid::new_v4().to_string();
    let a = Attributes {
        operation,
        object: has_object.then_some(&*obj),
        old,
        kind,
    };
    let body = review(ctx, hook, res, &a, &uid);
    let answer = match call(ctx, hook, body, &uid).await {
        Ok(a) => a,
        Err(e) => return failed(hook, e).map_or(Ok(false), Err),
    };
    for w in &answer.warnings {
        ctx.warnings.add(w.clone());
    }
    if !answer.allowed {
        return Err(denied(&hook.name, answer.status.as_ref()));
    }
    let Some(patch) = answer.patch else { return Ok(false) };
    if !has_object {
        return Err(StatusError::internal(format!(
            "admission webhook {:?} attempted to modify the object, which is not supported for this operation",
            hook.name
        )));
    }
    let patch: Value = serde_json::from_slice(&patch).map_err(|e| StatusError::internal(e.to_string()))?;
    let versioned = as_version(Some(obj), res);
    let mut patched =
        skiff_api::patch::json_patch(&versioned, &patch).map_err(|e| StatusError::internal(e.to_string()))?;
    if let Some(m) = patched.as_object_mut()
        && obj.get("apiVersion").is_some()
    {
        m.insert(
            "apiVersion".into(),
            obj.get("apiVersion").cloned().unwrap_or(Value::Null),
        );
    }
    if patched == *obj {
        return Ok(false);
    }
    *obj = patched;
    Ok(true)
}

/// The validating webhooks, called in parallel; the first refusal (in webhook order) wins.
pub async fn validate(
    ctx: &Ctx,
    operation: Operation,
    obj: Option<&Value>,
    old: Option<&Value>,
) -> Result<(), StatusError> {
    validate_as(ctx, operation, obj, old, None).await
}

/// Admission of a write to a subresource whose object is of a kind of its own (an Eviction, a
/// Binding, a TokenRequest), or of a connect request (exec, attach, port-forward, with its
/// options as the object), as upstream admits them: the mutating webhooks (whose patches to
/// such an object are not applied), the ValidatingAdmissionPolicies, then the validating
/// webhooks.
pub async fn admit_subresource(ctx: &Ctx, operation: Operation, obj: &Value, kind: Gvk<'_>) -> Result<(), StatusError> {
    if !any(&ctx.state) || exempt(ctx.rr.resource) {
        return Ok(());
    }
    let mut copy = obj.clone();
    mutate_as(ctx, operation, Some(&mut copy), None, Some(kind)).await?;
    crate::validatingadmissionpolicy::validate_as(ctx, operation, Some(obj), None, Some(kind)).await?;
    validate_as(ctx, operation, Some(obj), None, Some(kind)).await
}

async fn validate_as(
    ctx: &Ctx,
    operation: Operation,
    obj: Option<&Value>,
    old: Option<&Value>,
    kind: Option<Gvk<'_>>,
) -> Result<(), StatusError> {
    if exempt(ctx.rr.resource) {
        return Ok(());
    }
    let snap = ctx.state.webhooks.current();
    if snap.validating.is_empty() {
        return Ok(());
    }
    let a = Attributes {
        operation,
        object: obj,
        old,
        kind,
    };
    let hooks = matching(ctx, &snap.validating, &a).await?;
    let calls = hooks.iter().map(|(hook, res)| {
        let a = &a;
        async move {
            let uid = uuid::Uuid::new_v4().to_string();
            let body = review(ctx, hook, res, a, &uid);
            match call(ctx, hook, body, &uid).await {
                Err(e) => failed(hook, e),
                Ok(answer) => {
                    for w in &answer.warnings {
                        ctx.warnings.add(w.clone());
                    }
                    (!answer.allowed).then(|| denied(&hook.name, answer.status.as_ref()))
                }
            }
        }
    });
    let results = futures::future::join_all(calls).await;
    match results.into_iter().flatten().next() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Whether any webhook is configured (callers skip preparing what only webhooks need).
pub fn any(state: &ApiState) -> bool {
    let s = state.webhooks.current();
    !s.mutating.is_empty() || !s.validating.is_empty() || !state.webhooks.policies.read().is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed CA certificate for `names`, valid until `until` (year).
    fn self_signed_ca(names: &[&str], until: i32) -> String {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let key = KeyPair::generate().expect("key");
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(until, 1, 1);
        params.self_signed(&key).expect("certificate").pem()
    }

    fn verify(bundle: &str, served: &str, name: &str) -> Result<(), rustls::Error> {
        use rustls::client::danger::ServerCertVerifier;
        let b64 = base64::engine::general_purpose::STANDARD.encode(bundle);
        let verifier = BundleVerifier::new(&b64).expect("bundle").expect("roots");
        let served = CertificateDer::from_pem_slice(served.as_bytes()).expect("served");
        let name = ServerName::try_from(name.to_string()).expect("name");
        verifier
            .verify_server_cert(&served, &[], &name, &[], rustls::pki_types::UnixTime::now())
            .map(|_| ())
    }

    #[test]
    fn a_bundles_own_certificate_is_trusted_for_its_names_and_period() {
        let own = self_signed_ca(&["127.0.0.1", "hook.ns.svc"], 2200);
        verify(&own, &own, "127.0.0.1").expect("its own bundle");
        verify(&own, &own, "hook.ns.svc").expect("its DNS name");
        assert!(verify(&own, &own, "other.ns.svc").is_err(), "another name");
        let expired = self_signed_ca(&["127.0.0.1"], 2021);
        assert!(verify(&expired, &expired, "127.0.0.1").is_err(), "expired");
        let stranger = self_signed_ca(&["127.0.0.1"], 2200);
        assert!(verify(&own, &stranger, "127.0.0.1").is_err(), "not in the bundle");
    }

    fn rule(ops: &[&str], groups: &[&str], versions: &[&str], resources: &[&str], scope: &str) -> Rule {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect();
        Rule {
            operations: v(ops),
            groups: v(groups),
            versions: v(versions),
            resources: v(resources),
            scope: scope.to_string(),
        }
    }

    fn attrs<'a>(
        op: Operation,
        group: &'a str,
        version: &'a str,
        resource: &'a str,
        sub: &'a str,
        ns: &'a str,
    ) -> RequestAttrs<'a> {
        RequestAttrs {
            operation: op,
            group,
            version,
            resource,
            subresource: sub,
            namespace: ns,
        }
    }

    #[test]
    fn a_webhook_that_cannot_be_built_fails_by_its_policy_not_open() {
        use base64::Engine;
        let bogus = base64::engine::general_purpose::STANDARD.encode("not a certificate");
        let hook = build_hook(&json!({
            "name": "broken.skiff.test",
            "clientConfig": {"url": "https://127.0.0.1:1/x", "caBundle": bogus},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]}],
            "matchConditions": [{"name": "never", "expression": "false"}],
        }));
        let why = hook.broken.clone().expect("broken");
        assert!(why.contains("caBundle"), "{why}");
        // What could not be read narrows nothing: the condition that would skip it is dropped.
        assert!(hook.match_conditions.is_empty());
        let e = failed(&hook, CallError(format!("failed to call webhook: {why}"))).expect("fails closed");
        assert_eq!(e.code, 500);
        assert!(
            e.message.contains("failed calling webhook \"broken.skiff.test\""),
            "{}",
            e.message
        );
        let mut ignoring = hook;
        ignoring.ignore_failures = true;
        assert!(failed(&ignoring, CallError("x".into())).is_none());
    }

    #[test]
    fn operations_groups_and_versions() {
        let r = rule(&["CREATE"], &[""], &["v1"], &["pods"], "*");
        assert!(r.matches(&attrs(Operation::Create, "", "v1", "pods", "", "default")));
        assert!(!r.matches(&attrs(Operation::Update, "", "v1", "pods", "", "default")));
        assert!(!r.matches(&attrs(Operation::Create, "apps", "v1", "pods", "", "default")));
        assert!(!r.matches(&attrs(Operation::Create, "", "v2", "pods", "", "default")));
        assert!(!r.matches(&attrs(Operation::Create, "", "v1", "configmaps", "", "default")));
        let any = rule(&["*"], &["*"], &["*"], &["*"], "*");
        assert!(any.matches(&attrs(Operation::Delete, "apps", "v1", "deployments", "", "x")));
        let two = rule(
            &["CREATE", "UPDATE"],
            &["apps", ""],
            &["v1"],
            &["deployments", "pods"],
            "*",
        );
        assert!(two.matches(&attrs(Operation::Update, "", "v1", "pods", "", "x")));
        assert!(!two.matches(&attrs(Operation::Delete, "", "v1", "pods", "", "x")));
    }

    #[test]
    fn resources_and_subresources() {
        let star = rule(&["*"], &["*"], &["*"], &["*"], "*");
        assert!(star.matches(&attrs(Operation::Update, "", "v1", "pods", "", "ns")));
        // `*` is every resource, but no subresource.
        assert!(!star.matches(&attrs(Operation::Update, "", "v1", "pods", "status", "ns")));
        let all = rule(&["*"], &["*"], &["*"], &["*/*"], "*");
        assert!(all.matches(&attrs(Operation::Update, "", "v1", "pods", "status", "ns")));
        assert!(all.matches(&attrs(Operation::Update, "", "v1", "pods", "", "ns")));
        let status = rule(&["*"], &[""], &["v1"], &["pods/status"], "*");
        assert!(status.matches(&attrs(Operation::Update, "", "v1", "pods", "status", "ns")));
        assert!(!status.matches(&attrs(Operation::Update, "", "v1", "pods", "", "ns")));
        assert!(!status.matches(&attrs(Operation::Update, "", "v1", "pods", "binding", "ns")));
        let any_status = rule(&["*"], &["*"], &["*"], &["*/status"], "*");
        assert!(any_status.matches(&attrs(Operation::Update, "apps", "v1", "deployments", "status", "ns")));
        assert!(!any_status.matches(&attrs(Operation::Update, "apps", "v1", "deployments", "scale", "ns")));
        let pod_subs = rule(&["*"], &[""], &["v1"], &["pods/*"], "*");
        assert!(pod_subs.matches(&attrs(Operation::Create, "", "v1", "pods", "eviction", "ns")));
        // As upstream's matcher: `x/*` covers the resource itself too.
        assert!(pod_subs.matches(&attrs(Operation::Create, "", "v1", "pods", "", "ns")));
        assert!(!pod_subs.matches(&attrs(Operation::Create, "", "v1", "nodes", "status", "ns")));
    }

    #[test]
    fn scopes() {
        let ns = rule(&["*"], &["*"], &["*"], &["*"], "Namespaced");
        let cluster = rule(&["*"], &["*"], &["*"], &["*"], "Cluster");
        let pod = attrs(Operation::Create, "", "v1", "pods", "", "default");
        let node = attrs(Operation::Create, "", "v1", "nodes", "", "");
        // A Namespace object carries its own name as namespace, yet is cluster-scoped.
        let namespace = attrs(Operation::Create, "", "v1", "namespaces", "", "team-a");
        assert!(ns.matches(&pod) && !ns.matches(&node) && !ns.matches(&namespace));
        assert!(!cluster.matches(&pod) && cluster.matches(&node) && cluster.matches(&namespace));
    }

    #[test]
    fn answers_are_checked_as_upstream_checks_them() {
        let ok = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": "u1", "allowed": true, "patchType": "JSONPatch",
                "patch": base64::engine::general_purpose::STANDARD.encode(b"[]"), "warnings": ["careful"]}});
        let a = parse_answer(&ok, "v1", "u1").expect("valid");
        assert!(a.allowed && a.patch.as_deref() == Some(b"[]".as_slice()) && a.warnings == ["careful"]);
        let e = parse_answer(&ok, "v1", "u2").expect_err("uid");
        assert_eq!(e, "expected response.uid=\"u2\", got \"u1\"");
        let e = parse_answer(&json!({"apiVersion": "v1", "kind": "Status"}), "v1", "u1").expect_err("kind");
        assert!(e.starts_with("expected webhook response of admission.k8s.io/v1"), "{e}");
    }

    #[test]
    fn denials_keep_the_webhooks_code_and_message() {
        let e = denied(
            "deny.example.com",
            Some(&json!({"code": 403, "message": "no way", "reason": "Forbidden"})),
        );
        assert_eq!(e.code, 403);
        assert_eq!(
            e.message,
            "admission webhook \"deny.example.com\" denied the request: no way"
        );
        let e = denied("deny.example.com", None);
        assert_eq!(e.code, 400);
        assert_eq!(
            e.message,
            "admission webhook \"deny.example.com\" denied the request without explanation"
        );
        let e = denied("d.e.f", Some(&json!({"code": 200, "reason": "NotAllowed"})));
        assert_eq!(
            (e.code, e.message.as_str()),
            (400, "admission webhook \"d.e.f\" denied the request: NotAllowed")
        );
    }

    #[test]
    fn configuration_objects_are_exempt() {
        let v = skiff_api::registry::lookup_kind(GROUP, "ValidatingWebhookConfiguration").expect("served");
        let m = skiff_api::registry::lookup_kind(GROUP, "MutatingWebhookConfiguration").expect("served");
        assert!(exempt(v) && exempt(m));
        let pods = skiff_api::registry::lookup("", "v1", "pods").expect("pods");
        assert!(!exempt(pods));
    }
}
