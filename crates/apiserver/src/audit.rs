//! Auditing as upstream's: an `audit.k8s.io/v1` Policy decides each request's level (None,
//! Metadata, Request, RequestResponse) by its first matching rule, and `audit.k8s.io/v1` Event
//! lines are written to a log that rotates by size, age and count (upstream's
//! `--audit-log-maxsize`, `--audit-log-maxage`, `--audit-log-maxbackup`).
//!
//! Requests only hand a record to a channel; one writer thread builds and writes the lines,
//! so auditing costs a request a uuid and a few copies.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Map, Value};
use skiff_rbac::Attributes;

use crate::tls::Identity;

/// How much of a request an event records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
pub enum Level {
    None,
    Metadata,
    Request,
    RequestResponse,
}

impl Level {
    fn as_str(self) -> &'static str {
        match self {
            Level::None => "None",
            Level::Metadata => "Metadata",
            Level::Request => "Request",
            Level::RequestResponse => "RequestResponse",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum Stage {
    RequestReceived,
    ResponseStarted,
    ResponseComplete,
    Panic,
}

impl Stage {
    /// The stage's bit in a set of stages.
    pub fn bit(self) -> u8 {
        1 << (self as u8)
    }

    fn as_str(self) -> &'static str {
        match self {
            Stage::RequestReceived => "RequestReceived",
            Stage::ResponseStarted => "ResponseStarted",
            Stage::ResponseComplete => "ResponseComplete",
            Stage::Panic => "Panic",
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GroupResources {
    #[serde(default)]
    group: String,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    resource_names: Vec<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Rule {
    level: Level,
    #[serde(default)]
    users: Vec<String>,
    #[serde(default)]
    user_groups: Vec<String>,
    #[serde(default)]
    verbs: Vec<String>,
    #[serde(default)]
    resources: Vec<GroupResources>,
    #[serde(default)]
    namespaces: Vec<String>,
    #[serde(default, rename = "nonResourceURLs")]
    non_resource_urls: Vec<String>,
    #[serde(default)]
    omit_stages: Vec<Stage>,
}

/// An `audit.k8s.io/v1` Policy.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Policy {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    rules: Vec<Rule>,
    #[serde(default)]
    omit_stages: Vec<Stage>,
}

/// The policy used when none is given: health checks and nodes' lease heartbeats are not
/// recorded; everything else is at Metadata, so no request or response body (a Secret's value
/// least of all) ever reaches the log.
pub const DEFAULT_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: None
  nonResourceURLs: ["/healthz*", "/livez*", "/readyz*", "/version"]
- level: None
  userGroups: ["system:nodes"]
  verbs: ["get", "update", "patch"]
  resources: [{group: "coordination.k8s.io", resources: ["leases"]}]
- level: Metadata
"#;

impl Policy {
    /// Parses and checks a policy file's text.
    pub fn parse(text: &str) -> anyhow::Result<Policy> {
        let p: Policy = serde_saphyr::from_str(text).context("parsing the audit policy")?;
        if p.kind != "Policy" {
            bail!("audit policy: kind must be Policy, got {:?}", p.kind);
        }
        if !matches!(p.api_version.as_str(), "audit.k8s.io/v1") {
            bail!(
                "audit policy: apiVersion must be audit.k8s.io/v1, got {:?}",
                p.api_version
            );
        }
        Ok(p)
    }

    /// The level and the stages left out (a set of [`Stage::bit`]s) for a request, by the first
    /// rule that matches it.
    pub fn level(&self, user: &Identity, a: &Attributes) -> (Level, u8) {
        let bits = |stages: &[Stage]| stages.iter().fold(0u8, |m, s| m | s.bit());
        for r in &self.rules {
            if rule_matches(r, user, a) {
                return (r.level, bits(&self.omit_stages) | bits(&r.omit_stages));
            }
        }
        (Level::None, 0)
    }
}

fn rule_matches(r: &Rule, user: &Identity, a: &Attributes) -> bool {
    if !r.users.is_empty() && !r.users.contains(&user.user) {
        return false;
    }
    if !r.user_groups.is_empty() && !user.groups.iter().any(|g| r.user_groups.contains(g)) {
        return false;
    }
    if !r.verbs.is_empty() && !r.verbs.contains(&a.verb) {
        return false;
    }
    if !r.namespaces.is_empty() || !r.resources.is_empty() {
        return resource_matches(r, a);
    }
    if !r.non_resource_urls.is_empty() {
        return !a.resource_request && r.non_resource_urls.iter().any(|spec| path_matches(&a.path, spec));
    }
    true
}

fn path_matches(path: &str, spec: &str) -> bool {
    spec == "*" || spec == path || spec.strip_suffix('*').is_some_and(|prefix| path.starts_with(prefix))
}

fn resource_matches(r: &Rule, a: &Attributes) -> bool {
    if !a.resource_request {
        return false;
    }
    if !r.namespaces.is_empty() && !r.namespaces.contains(&a.namespace) {
        return false;
    }
    if r.resources.is_empty() {
        return true;
    }
    let combined = a.combined_resource();
    r.resources.iter().filter(|gr| gr.group == a.api_group).any(|gr| {
        if gr.resources.is_empty() {
            return true;
        }
        if !gr.resource_names.is_empty() && !gr.resource_names.contains(&a.name) {
            return false;
        }
        gr.resources.iter().any(|res| {
            res == "*"
                || *res == combined
                || (!a.subresource.is_empty() && res.strip_prefix("*/") == Some(a.subresource.as_str()))
                || res.strip_suffix("/*") == Some(a.resource.as_str())
        })
    })
}

/// Where and how the log is written.
#[derive(Clone, Debug)]
pub struct AuditOptions {
    /// `--audit-policy-file`: the default policy when unset.
    pub policy_file: Option<PathBuf>,
    /// `--audit-log-path`: `-` for standard output; no log when unset.
    pub log_path: Option<PathBuf>,
    /// `--audit-log-maxage`: days to keep rotated files (0: no limit).
    pub max_age_days: u64,
    /// `--audit-log-maxbackup`: rotated files kept (0: no limit).
    pub max_backups: usize,
    /// `--audit-log-maxsize`: megabytes before the log is rotated (0: never).
    pub max_size_mb: u64,
}

/// One request's audit record, handed to the writer.
pub struct Record {
    pub level: Level,
    pub stage: Stage,
    pub audit_id: http::HeaderValue,
    pub request_uri: http::Uri,
    pub verb: String,
    pub user: Identity,
    pub impersonated: Option<Identity>,
    pub source_ip: Option<std::net::IpAddr>,
    pub user_agent: Option<http::HeaderValue>,
    pub attributes: Option<Attributes>,
    pub code: u16,
    /// The Status of a failed request: (reason, message).
    pub failure: Option<(String, String)>,
    pub received: jiff::Timestamp,
    pub stage_time: jiff::Timestamp,
    pub annotations: Vec<(&'static str, String)>,
    pub request_body: Option<Bytes>,
    pub response_body: Option<Bytes>,
}

/// Records waiting for the writer. Requests append without waking it; it drains the buffer
/// every [`FLUSH_EVERY`], or at once when [`WAKE_AT`] records wait.
#[derive(Default)]
struct Buffer {
    records: parking_lot::Mutex<Vec<Record>>,
    ready: parking_lot::Condvar,
}

const FLUSH_EVERY: Duration = Duration::from_millis(100);
const WAKE_AT: usize = 4096;

/// The audit backend: the policy and the writer thread's buffer.
pub struct Auditor {
    policy: Policy,
    buffer: Option<std::sync::Arc<Buffer>>,
}

impl Auditor {
    /// No auditing.
    pub fn disabled() -> Auditor {
        Auditor {
            policy: Policy::parse(DEFAULT_POLICY).unwrap_or(Policy {
                api_version: String::new(),
                kind: String::new(),
                rules: Vec::new(),
                omit_stages: Vec::new(),
            }),
            buffer: None,
        }
    }

    /// Reads the policy and starts the writer.
    pub fn start(opts: &AuditOptions) -> anyhow::Result<Auditor> {
        let policy = match &opts.policy_file {
            Some(path) => {
                let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
                Policy::parse(&text).with_context(|| format!("loading {}", path.display()))?
            }
            None => Policy::parse(DEFAULT_POLICY)?,
        };
        let Some(path) = opts.log_path.clone().filter(|p| !p.as_os_str().is_empty()) else {
            return Ok(Auditor { policy, buffer: None });
        };
        let mut log = LogFile::open(path, opts.clone())?;
        let buffer = std::sync::Arc::new(Buffer::default());
        let b = buffer.clone();
        std::thread::Builder::new()
            .name("audit-log".into())
            .spawn(move || {
                let mut batch = Vec::new();
                let mut line = Vec::with_capacity(4096);
                loop {
                    {
                        let mut records = b.records.lock();
                        if records.len() < WAKE_AT {
                            b.ready.wait_for(&mut records, FLUSH_EVERY);
                        }
                        std::mem::swap(&mut *records, &mut batch);
                    }
                    for record in batch.drain(..) {
                        line.clear();
                        match serde_json::to_writer(&mut line, &EventLine(&record)) {
                            Ok(()) => log.write(&mut line),
                            Err(e) => tracing::warn!(error = %e, "encoding an audit event failed"),
                        }
                    }
                    log.flush();
                }
            })
            .context("starting the audit log writer")?;
        Ok(Auditor {
            policy,
            buffer: Some(buffer),
        })
    }

    pub fn enabled(&self) -> bool {
        self.buffer.is_some()
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn emit(&self, record: Record) {
        if let Some(b) = &self.buffer {
            let mut records = b.records.lock();
            records.push(record);
            if records.len() == WAKE_AT {
                b.ready.notify_one();
            }
        }
    }
}

/// RFC 3339 with microseconds, as upstream's `MicroTime`.
fn timestamp(t: jiff::Timestamp) -> String {
    format!("{t:.6}")
}

/// A user as an Event's `user` or `impersonatedUser` (upstream's `UserInfo`).
pub struct UserInfo<'a>(pub &'a Identity);

impl serde::Serialize for UserInfo<'_> {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let u = self.0;
        let mut m = ser.serialize_map(None)?;
        m.serialize_entry("username", &u.user)?;
        if !u.uid.is_empty() {
            m.serialize_entry("uid", &u.uid)?;
        }
        if !u.groups.is_empty() {
            m.serialize_entry("groups", &u.groups)?;
        }
        if !u.extra.is_empty() {
            m.serialize_entry("extra", &u.extra)?;
        }
        m.end()
    }
}

/// An Event's `objectRef`.
struct ObjectRef<'a>(&'a Attributes);

impl serde::Serialize for ObjectRef<'_> {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let a = self.0;
        let mut m = ser.serialize_map(None)?;
        m.serialize_entry("resource", &a.resource)?;
        for (k, v) in [("namespace", &a.namespace), ("name", &a.name)] {
            if !v.is_empty() {
                m.serialize_entry(k, v)?;
            }
        }
        if !a.api_group.is_empty() {
            m.serialize_entry("apiGroup", &a.api_group)?;
        }
        m.serialize_entry("apiVersion", &a.api_version)?;
        if !a.subresource.is_empty() {
            m.serialize_entry("subresource", &a.subresource)?;
        }
        m.end()
    }
}

/// An Event's `responseStatus`.
struct ResponseStatus<'a>(&'a Record);

impl serde::Serialize for ResponseStatus<'_> {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = ser.serialize_map(None)?;
        m.serialize_entry("metadata", &Map::new())?;
        if let Some((reason, message)) = &self.0.failure {
            m.serialize_entry("status", "Failure")?;
            m.serialize_entry("message", message)?;
            m.serialize_entry("reason", reason)?;
        }
        m.serialize_entry("code", &self.0.code)?;
        m.end()
    }
}

/// Serializes a record as its `audit.k8s.io/v1` Event, straight into the line.
struct EventLine<'a>(&'a Record);

impl serde::Serialize for EventLine<'_> {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let r = self.0;
        let mut e = ser.serialize_map(None)?;
        e.serialize_entry("kind", "Event")?;
        e.serialize_entry("apiVersion", "audit.k8s.io/v1")?;
        e.serialize_entry("level", r.level.as_str())?;
        e.serialize_entry("auditID", r.audit_id.to_str().unwrap_or(""))?;
        e.serialize_entry("stage", r.stage.as_str())?;
        let uri = r.request_uri.path_and_query().map(|p| p.as_str()).unwrap_or("");
        e.serialize_entry("requestURI", uri)?;
        e.serialize_entry("verb", &r.verb)?;
        e.serialize_entry("user", &UserInfo(&r.user))?;
        if let Some(i) = &r.impersonated {
            e.serialize_entry("impersonatedUser", &UserInfo(i))?;
        }
        if let Some(ip) = &r.source_ip {
            e.serialize_entry("sourceIPs", &[ip.to_string()])?;
        }
        if let Some(ua) = r.user_agent.as_ref().and_then(|v| v.to_str().ok()) {
            e.serialize_entry("userAgent", ua)?;
        }
        if let Some(a) = r.attributes.as_ref().filter(|a| a.resource_request) {
            e.serialize_entry("objectRef", &ObjectRef(a))?;
        }
        if r.stage != Stage::RequestReceived {
            e.serialize_entry("responseStatus", &ResponseStatus(r))?;
        }
        let body = |b: &Option<Bytes>| b.as_ref().and_then(|b| serde_json::from_slice::<Value>(b).ok());
        if r.level >= Level::Request
            && let Some(v) = body(&r.request_body)
        {
            e.serialize_entry("requestObject", &v)?;
        }
        if r.level >= Level::RequestResponse
            && let Some(v) = body(&r.response_body)
        {
            e.serialize_entry("responseObject", &v)?;
        }
        e.serialize_entry("requestReceivedTimestamp", &timestamp(r.received))?;
        e.serialize_entry("stageTimestamp", &timestamp(r.stage_time))?;
        if !r.annotations.is_empty() {
            let a: std::collections::BTreeMap<&str, &str> =
                r.annotations.iter().map(|(k, v)| (*k, v.as_str())).collect();
            e.serialize_entry("annotations", &a)?;
        }
        e.end()
    }
}

/// The `audit.k8s.io/v1` Event of a record, as a value.
pub fn event(r: &Record) -> Value {
    serde_json::to_value(EventLine(r)).unwrap_or(Value::Null)
}

/// The log file with lumberjack's rotation, as upstream's log backend.
struct LogFile {
    path: PathBuf,
    opts: AuditOptions,
    out: Box<dyn Write + Send>,
    size: u64,
    stdout: bool,
}

impl LogFile {
    fn open(path: PathBuf, opts: AuditOptions) -> anyhow::Result<LogFile> {
        if path.as_os_str() == "-" {
            return Ok(LogFile {
                path,
                opts,
                out: Box::new(std::io::BufWriter::new(std::io::stdout())),
                size: 0,
                stdout: true,
            });
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let (out, size) = Self::open_file(&path)?;
        Ok(LogFile {
            path,
            opts,
            out,
            size,
            stdout: false,
        })
    }

    fn open_file(path: &Path) -> anyhow::Result<(Box<dyn Write + Send>, u64)> {
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("opening the audit log {}", path.display()))?;
        let size = f.metadata().map(|m| m.len()).unwrap_or(0);
        Ok((Box::new(std::io::BufWriter::new(f)), size))
    }

    /// Writes one encoded event and its newline.
    fn write(&mut self, line: &mut Vec<u8>) {
        line.push(b'\n');
        let max = self.opts.max_size_mb.saturating_mul(1024 * 1024);
        if !self.stdout
            && max > 0
            && self.size + line.len() as u64 > max
            && let Err(e) = self.rotate()
        {
            tracing::warn!(error = %format!("{e:#}"), "rotating the audit log failed");
        }
        match self.out.write_all(line) {
            Ok(()) => self.size += line.len() as u64,
            Err(e) => tracing::warn!(error = %e, "writing the audit log failed"),
        }
    }

    fn flush(&mut self) {
        if let Err(e) = self.out.flush() {
            tracing::warn!(error = %e, "flushing the audit log failed");
        }
    }

    /// Renames the log to `NAME-TIMESTAMP.EXT` (lumberjack's backup name), starts a new one and
    /// removes backups beyond the count and age limits.
    fn rotate(&mut self) -> anyhow::Result<()> {
        self.flush();
        let stem = self
            .path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("audit")
            .to_string();
        let ext = self
            .path
            .extension()
            .and_then(|s| s.to_str())
            .map(|e| format!(".{e}"))
            .unwrap_or_default();
        let now = jiff::Timestamp::now();
        let backup = self
            .path
            .with_file_name(format!("{stem}-{}{ext}", now.strftime("%Y-%m-%dT%H-%M-%S%.3f")));
        std::fs::rename(&self.path, &backup).with_context(|| format!("renaming {}", self.path.display()))?;
        let (out, size) = Self::open_file(&self.path)?;
        self.out = out;
        self.size = size;
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let prefix = format!("{stem}-");
        let mut backups: Vec<(PathBuf, std::time::SystemTime)> = std::fs::read_dir(dir)
            .with_context(|| format!("listing {}", dir.display()))?
            .flatten()
            .filter(|e| {
                let n = e.file_name();
                let n = n.to_string_lossy();
                n.starts_with(&prefix) && n.ends_with(&ext)
            })
            .filter_map(|e| Some((e.path(), e.metadata().ok()?.modified().ok()?)))
            .collect();
        backups.sort_by_key(|b| std::cmp::Reverse(b.1));
        let max_age = Duration::from_secs(self.opts.max_age_days * 24 * 3600);
        for (i, (path, modified)) in backups.iter().enumerate() {
            let too_many = self.opts.max_backups > 0 && i >= self.opts.max_backups;
            let too_old = self.opts.max_age_days > 0 && modified.elapsed().is_ok_and(|age| age > max_age);
            if too_many || too_old {
                let _ = std::fs::remove_file(path);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn attrs(verb: &str, group: &str, resource: &str, ns: &str) -> Attributes {
        let mut a = Attributes::resource(verb, group, resource, ns, "x");
        a.api_version = "v1".into();
        a
    }

    #[test]
    fn first_matching_rule_decides() {
        let p = Policy::parse(DEFAULT_POLICY).unwrap();
        let jane = Identity::new("jane", &["system:authenticated"]);
        assert_eq!(
            p.level(&jane, &Attributes::non_resource("get", "/readyz")).0,
            Level::None
        );
        assert_eq!(
            p.level(&jane, &attrs("get", "", "secrets", "default")).0,
            Level::Metadata
        );
        let node = Identity::new("system:node:n1", &["system:nodes"]);
        let lease = attrs("update", "coordination.k8s.io", "leases", "kube-node-lease");
        assert_eq!(p.level(&node, &lease).0, Level::None);
        assert_eq!(p.level(&jane, &lease).0, Level::Metadata);
        let (_, omit) = p.level(&jane, &attrs("list", "", "pods", "default"));
        assert_eq!(omit, Stage::RequestReceived.bit());

        let custom = Policy::parse(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: RequestResponse\n  resources: [{group: \"\", resources: [\"pods/*\"]}]\n- level: Request\n  namespaces: [team]\n",
        )
        .unwrap();
        let log = attrs("get", "", "pods", "default").with_subresource("log");
        assert_eq!(custom.level(&jane, &log).0, Level::RequestResponse);
        // `pods/*` covers the pods themselves too, as upstream's matcher.
        assert_eq!(
            custom.level(&jane, &attrs("get", "", "pods", "team")).0,
            Level::RequestResponse
        );
        assert_eq!(
            custom.level(&jane, &attrs("get", "", "services", "team")).0,
            Level::Request
        );
        assert_eq!(
            custom.level(&jane, &attrs("get", "", "services", "default")).0,
            Level::None
        );
        assert!(Policy::parse("apiVersion: audit.k8s.io/v1\nkind: Nope\n").is_err());
        assert!(Policy::parse("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: Loud}]\n").is_err());
    }

    #[test]
    fn events_in_upstream_form() {
        let mut a = attrs("list", "", "pods", "default");
        a.name.clear();
        let t = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let r = Record {
            level: Level::Metadata,
            stage: Stage::ResponseComplete,
            audit_id: http::HeaderValue::from_static("id-1"),
            request_uri: "/api/v1/namespaces/default/pods?limit=500".parse().unwrap(),
            verb: "list".into(),
            user: Identity::new("jane", &["system:authenticated"]),
            impersonated: None,
            source_ip: Some("127.0.0.1".parse().unwrap()),
            user_agent: Some(http::HeaderValue::from_static("kubectl")),
            attributes: Some(a),
            code: 403,
            failure: Some(("Forbidden".into(), "pods is forbidden".into())),
            received: t,
            stage_time: t,
            annotations: vec![("authorization.k8s.io/decision", "forbid".into())],
            request_body: Some(Bytes::from_static(b"{\"secret\":1}")),
            response_body: None,
        };
        let e = event(&r);
        assert_eq!(e["kind"], "Event");
        assert_eq!(
            e["objectRef"],
            json!({"resource": "pods", "namespace": "default", "apiVersion": "v1"})
        );
        assert_eq!(
            e["responseStatus"],
            json!({"metadata": {}, "status": "Failure", "message": "pods is forbidden", "reason": "Forbidden", "code": 403})
        );
        assert_eq!(e["requestReceivedTimestamp"], "2027-01-15T08:00:00.000000Z");
        // Metadata records no body.
        assert!(e.get("requestObject").is_none());
    }

    #[test]
    fn the_log_rotates_by_size_and_keeps_its_backups() {
        let dir = tempfile::tempdir().unwrap();
        let opts = AuditOptions {
            policy_file: None,
            log_path: Some(dir.path().join("audit.log")),
            max_age_days: 0,
            max_backups: 2,
            max_size_mb: 1,
        };
        let mut log = LogFile::open(dir.path().join("audit.log"), opts).unwrap();
        let big = serde_json::to_vec(&json!({"pad": "x".repeat(300 * 1024)})).unwrap();
        for _ in 0..12 {
            log.write(&mut big.clone());
            std::thread::sleep(Duration::from_millis(5));
        }
        log.flush();
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .collect();
        assert!(names.contains(&"audit.log".to_string()), "{names:?}");
        assert_eq!(names.len(), 3, "the log and two backups: {names:?}");
        for n in &names {
            let size = std::fs::metadata(dir.path().join(n)).unwrap().len();
            assert!(size <= 1024 * 1024, "{n}: {size}");
        }
    }
}
