//! The Pod Security Standards as upstream's `k8s.io/pod-security-admission/policy` evaluates
//! them: the `privileged`, `baseline` and `restricted` levels, each check in the versions it
//! changed in (a namespace may pin `v1.X`; `latest` is the newest), run in upstream's order with
//! upstream's reasons and details, so a refusal reads exactly as upstream's:
//! `violates PodSecurity "restricted:latest": privileged (container "c" must not set
//! securityContext.privileged=true), ...`. No I/O: the API server's admission and
//! `skiff audit security` share it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::Value;

/// The newest policy version this evaluator knows (what `latest` means).
pub const MAX_MINOR: u32 = 37;

pub const ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";
pub const ENFORCE_VERSION_LABEL: &str = "pod-security.kubernetes.io/enforce-version";
pub const AUDIT_LABEL: &str = "pod-security.kubernetes.io/audit";
pub const AUDIT_VERSION_LABEL: &str = "pod-security.kubernetes.io/audit-version";
pub const WARN_LABEL: &str = "pod-security.kubernetes.io/warn";
pub const WARN_VERSION_LABEL: &str = "pod-security.kubernetes.io/warn-version";

/// A policy level, from the least to the most strict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    Privileged,
    Baseline,
    Restricted,
}

impl Level {
    pub fn parse(s: &str) -> Result<Level, String> {
        match s {
            "privileged" => Ok(Level::Privileged),
            "baseline" => Ok(Level::Baseline),
            "restricted" => Ok(Level::Restricted),
            _ => Err("must be one of privileged, baseline, restricted".into()),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }
}

/// A policy version: `latest`, or `v1.MINOR`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Version {
    Latest,
    V1(u32),
}

impl Version {
    pub fn parse(s: &str) -> Result<Version, String> {
        if s == "latest" {
            return Ok(Version::Latest);
        }
        let minor = s
            .strip_prefix("v1.")
            .filter(|m| !m.is_empty() && m.bytes().all(|b| b.is_ascii_digit()) && (m.len() == 1 || !m.starts_with('0')))
            .and_then(|m| m.parse::<u32>().ok());
        match minor {
            Some(m) => Ok(Version::V1(m)),
            None => Err("must be \"latest\" or \"v1.x\"".into()),
        }
    }

    /// The minor version the checks are taken at (newer than known is the newest known).
    pub fn minor(self) -> u32 {
        match self {
            Version::Latest => MAX_MINOR,
            Version::V1(m) => m.min(MAX_MINOR),
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Version::Latest => f.write_str("latest"),
            Version::V1(m) => write!(f, "v1.{m}"),
        }
    }
}

/// A level at a version (`restricted:latest`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LevelVersion {
    pub level: Level,
    pub version: Version,
}

impl fmt::Display for LevelVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.level.as_str(), self.version)
    }
}

impl LevelVersion {
    pub const PRIVILEGED: LevelVersion = LevelVersion {
        level: Level::Privileged,
        version: Version::Latest,
    };
}

/// What a namespace enforces, audits and warns about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub enforce: LevelVersion,
    pub audit: LevelVersion,
    pub warn: LevelVersion,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            enforce: LevelVersion::PRIVILEGED,
            audit: LevelVersion::PRIVILEGED,
            warn: LevelVersion::PRIVILEGED,
        }
    }
}

impl Policy {
    pub fn fully_privileged(&self) -> bool {
        [self.enforce, self.audit, self.warn]
            .iter()
            .all(|lv| lv.level == Level::Privileged)
    }
}

/// A label that does not parse: `(label, value, why)`, reported at `metadata.labels[label]`.
pub type LabelError = (String, String, String);

/// Upstream's `PolicyToEvaluate`: the namespace's labels over the cluster's defaults. A label
/// that does not parse is an error and evaluates as `restricted` (enforce) or `privileged`
/// (audit, warn: they fail open); an enforce level stricter than the warn level also warns.
pub fn policy_for(labels: &BTreeMap<String, String>, defaults: Policy) -> (Policy, Vec<LabelError>) {
    let mut p = defaults;
    let mut errs = Vec::new();
    let mut err = |label: &str, value: &str, why: String| errs.push((label.to_string(), value.to_string(), why));
    let mut has_enforce_level = false;
    if let Some(v) = labels.get(ENFORCE_LABEL) {
        match Level::parse(v) {
            Ok(l) => {
                p.enforce.level = l;
                has_enforce_level = true;
            }
            Err(e) => {
                p.enforce.level = Level::Restricted;
                err(ENFORCE_LABEL, v, e);
            }
        }
    }
    if let Some(v) = labels.get(ENFORCE_VERSION_LABEL) {
        p.enforce.version = Version::parse(v).unwrap_or_else(|e| {
            err(ENFORCE_VERSION_LABEL, v, e);
            Version::Latest
        });
    }
    if let Some(v) = labels.get(AUDIT_LABEL) {
        p.audit.level = Level::parse(v).unwrap_or_else(|e| {
            err(AUDIT_LABEL, v, e);
            Level::Privileged
        });
    }
    if let Some(v) = labels.get(AUDIT_VERSION_LABEL) {
        p.audit.version = Version::parse(v).unwrap_or_else(|e| {
            err(AUDIT_VERSION_LABEL, v, e);
            Version::Latest
        });
    }
    let has_warn_level = labels.contains_key(WARN_LABEL);
    if let Some(v) = labels.get(WARN_LABEL) {
        p.warn.level = Level::parse(v).unwrap_or_else(|e| {
            err(WARN_LABEL, v, e);
            Level::Privileged
        });
    }
    let has_warn_version = labels.contains_key(WARN_VERSION_LABEL);
    if let Some(v) = labels.get(WARN_VERSION_LABEL) {
        p.warn.version = Version::parse(v).unwrap_or_else(|e| {
            err(WARN_VERSION_LABEL, v, e);
            Version::Latest
        });
    }
    if !has_warn_level && has_enforce_level && p.enforce.level > p.warn.level {
        p.warn.level = p.enforce.level;
        if !has_warn_version {
            p.warn.version = p.enforce.version;
        }
    }
    (p, errs)
}

/// One check's refusal: its reason and, when it has one, the detail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub reason: String,
    pub detail: String,
}

/// Every refusal of a pod at one level and version, in upstream's order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    pub violations: Vec<Violation>,
}

impl Verdict {
    pub fn allowed(&self) -> bool {
        self.violations.is_empty()
    }

    /// `privileged, host namespaces` (what the namespace warnings list).
    pub fn reasons(&self) -> String {
        self.violations
            .iter()
            .map(|v| v.reason.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `privileged (container "c" must not ...), host namespaces (hostNetwork=true)`.
    pub fn details(&self) -> String {
        self.violations
            .iter()
            .map(|v| {
                if v.detail.is_empty() {
                    v.reason.clone()
                } else {
                    format!("{} ({})", v.reason, v.detail)
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The pod's metadata and spec as the checks read them (a pod, or a workload's template).
pub struct PodView<'a> {
    pub metadata: &'a Value,
    pub spec: &'a Value,
}

/// Evaluates a pod at `lv` (no check at `privileged`).
pub fn evaluate(lv: LevelVersion, pod: &PodView) -> Verdict {
    let mut verdict = Verdict::default();
    if lv.level == Level::Privileged {
        return verdict;
    }
    let v = lv.version.minor();
    let restricted = lv.level == Level::Restricted;
    let checks: &[(&str, Check)] = &[
        // Baseline, ordered by their upstream IDs.
        ("appArmorProfile", app_armor_profile),
        ("capabilities_baseline", capabilities_baseline),
        ("hostNamespaces", host_namespaces),
        ("hostPathVolumes", host_path_volumes),
        ("hostPorts", host_ports),
        ("hostProbesAndHostLifecycle", host_probes_and_lifecycle),
        ("privileged", privileged),
        ("procMount", proc_mount_baseline),
        ("seLinuxOptions", se_linux_options),
        ("seccompProfile_baseline", seccomp_baseline),
        ("sysctls", sysctls),
        ("windowsHostProcess", windows_host_process),
        // Restricted.
        ("allowPrivilegeEscalation", allow_privilege_escalation),
        ("capabilities_restricted", capabilities_restricted),
        ("procMount_restricted", proc_mount_restricted),
        ("restrictedVolumes", restricted_volumes),
        ("runAsNonRoot", run_as_non_root),
        ("runAsUser", run_as_user),
        ("seccompProfile_restricted", seccomp_restricted),
    ];
    for (id, check) in checks {
        let applies = match *id {
            "hostProbesAndHostLifecycle" => v >= 34,
            // Restricted checks replace baseline ones from the version they start in.
            "capabilities_baseline" => !(restricted && v >= 22),
            "hostPathVolumes" => !restricted,
            "procMount" => !(restricted && v >= 35),
            "seccompProfile_baseline" => !(restricted && v >= 19),
            "allowPrivilegeEscalation" => restricted && v >= 8,
            "capabilities_restricted" => restricted && v >= 22,
            "procMount_restricted" => restricted && v >= 35,
            "restrictedVolumes" | "runAsNonRoot" => restricted,
            "runAsUser" => restricted && v >= 23,
            "seccompProfile_restricted" => restricted && v >= 19,
            _ => true,
        };
        if applies && let Some(violation) = check(pod, v) {
            verdict.violations.push(violation);
        }
    }
    verdict
}

type Check = fn(&PodView, u32) -> Option<Violation>;

fn violation(reason: &str, detail: String) -> Option<Violation> {
    Some(Violation {
        reason: reason.to_string(),
        detail,
    })
}

fn join_quote<S: AsRef<str>>(items: &[S]) -> String {
    if items.is_empty() {
        return String::new();
    }
    let inner: Vec<&str> = items.iter().map(AsRef::as_ref).collect();
    format!("\"{}\"", inner.join("\", \""))
}

fn pluralize<'a>(singular: &'a str, plural: &'a str, n: usize) -> &'a str {
    if n == 1 { singular } else { plural }
}

/// `container "a"` or `containers "a", "b"`.
fn containers_phrase(names: &[String]) -> String {
    format!(
        "{} {}",
        pluralize("container", "containers", names.len()),
        join_quote(names)
    )
}

/// Init containers, containers, then ephemeral containers (upstream's `visitContainers`).
fn containers(spec: &Value) -> impl Iterator<Item = &Value> {
    ["initContainers", "containers", "ephemeralContainers"]
        .into_iter()
        .flat_map(move |k| spec.get(k).and_then(Value::as_array).into_iter().flatten())
}

fn name(c: &Value) -> String {
    c.get("name").and_then(Value::as_str).unwrap_or("").to_string()
}

fn sc<'a>(c: &'a Value, field: &str) -> Option<&'a Value> {
    c.get("securityContext")?.get(field).filter(|v| !v.is_null())
}

fn pod_sc<'a>(spec: &'a Value, field: &str) -> Option<&'a Value> {
    sc(spec, field)
}

fn is_windows(spec: &Value) -> bool {
    spec.pointer("/os/name").and_then(Value::as_str) == Some("windows")
}

/// `hostUsers: false`: a user namespace relaxes the checks about root (1.35 and later).
fn user_namespaced(spec: &Value) -> bool {
    spec.get("hostUsers").and_then(Value::as_bool) == Some(false)
}

fn set_phrase(setters: &[String]) -> String {
    setters.join(" and ")
}

/// Who sets the profile `field` (`appArmorProfile`, `seccompProfile`) to a type `allowed` refuses:
/// `pod`, then `container(s) "..."`, and the types they set.
fn profile_setters(pod: &PodView, field: &str, allowed: impl Fn(&str) -> bool) -> (Vec<String>, BTreeSet<String>) {
    let ty = |v: &Value| v.get("type").and_then(Value::as_str).unwrap_or("").to_string();
    let mut setters = Vec::new();
    let mut values = BTreeSet::new();
    if let Some(p) = pod_sc(pod.spec, field)
        && !allowed(&ty(p))
    {
        setters.push("pod".to_string());
        values.insert(ty(p));
    }
    let mut bad = Vec::new();
    for c in containers(pod.spec) {
        if let Some(p) = sc(c, field)
            && !allowed(&ty(p))
        {
            bad.push(name(c));
            values.insert(ty(p));
        }
    }
    if !bad.is_empty() {
        setters.push(containers_phrase(&bad));
    }
    (setters, values)
}

fn app_armor_profile(pod: &PodView, _: u32) -> Option<Violation> {
    let (mut setters, values) =
        profile_setters(pod, "appArmorProfile", |t| matches!(t, "RuntimeDefault" | "Localhost"));
    let mut annotations: Vec<String> = pod
        .metadata
        .get("annotations")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.starts_with("container.apparmor.security.beta.kubernetes.io/"))
        .filter_map(|(k, v)| {
            let v = v.as_str().unwrap_or("");
            let ok = v.is_empty() || v == "runtime/default" || v.starts_with("localhost/");
            (!ok).then(|| format!("{k}={v:?}"))
        })
        .collect();
    let mut list: Vec<String> = values.into_iter().collect();
    if !annotations.is_empty() {
        annotations.sort();
        setters.push(pluralize("annotation", "annotations", annotations.len()).to_string());
        list.extend(annotations);
    }
    if setters.is_empty() {
        return None;
    }
    violation(
        pluralize("forbidden AppArmor profile", "forbidden AppArmor profiles", list.len()),
        format!(
            "{} must not set AppArmor profile type to {}",
            set_phrase(&setters),
            join_quote(&list)
        ),
    )
}

const BASELINE_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

fn added_capabilities(c: &Value) -> Vec<String> {
    sc(c, "capabilities")
        .and_then(|caps| caps.get("add"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect()
}

fn capabilities_baseline(pod: &PodView, _: u32) -> Option<Violation> {
    let mut bad = Vec::new();
    let mut caps = BTreeSet::new();
    for c in containers(pod.spec) {
        let extra: Vec<String> = added_capabilities(c)
            .into_iter()
            .filter(|cap| !BASELINE_CAPABILITIES.contains(&cap.as_str()))
            .collect();
        if !extra.is_empty() {
            bad.push(name(c));
            caps.extend(extra);
        }
    }
    if bad.is_empty() {
        return None;
    }
    let caps: Vec<String> = caps.into_iter().collect();
    violation(
        "non-default capabilities",
        format!(
            "{} must not include {} in securityContext.capabilities.add",
            containers_phrase(&bad),
            join_quote(&caps)
        ),
    )
}

fn host_namespaces(pod: &PodView, _: u32) -> Option<Violation> {
    let on = |k: &str| pod.spec.get(k).and_then(Value::as_bool) == Some(true);
    let set: Vec<String> = ["hostNetwork", "hostPID", "hostIPC"]
        .into_iter()
        .filter(|k| on(k))
        .map(|k| format!("{k}=true"))
        .collect();
    if set.is_empty() {
        return None;
    }
    violation("host namespaces", set.join(", "))
}

fn volumes(spec: &Value) -> impl Iterator<Item = &Value> {
    spec.get("volumes").and_then(Value::as_array).into_iter().flatten()
}

fn host_path_volumes(pod: &PodView, _: u32) -> Option<Violation> {
    let names: Vec<String> = volumes(pod.spec)
        .filter(|v| v.get("hostPath").is_some_and(|h| !h.is_null()))
        .map(name)
        .collect();
    if names.is_empty() {
        return None;
    }
    violation(
        "hostPath volumes",
        format!("{} {}", pluralize("volume", "volumes", names.len()), join_quote(&names)),
    )
}

fn host_ports(pod: &PodView, _: u32) -> Option<Violation> {
    let mut bad = Vec::new();
    let mut ports = BTreeSet::new();
    for c in containers(pod.spec) {
        let mut uses = false;
        for p in c.get("ports").and_then(Value::as_array).into_iter().flatten() {
            if let Some(hp) = p.get("hostPort").and_then(Value::as_i64).filter(|hp| *hp != 0) {
                uses = true;
                ports.insert(hp.to_string());
            }
        }
        if uses {
            bad.push(name(c));
        }
    }
    if bad.is_empty() {
        return None;
    }
    // Sorted as strings, as upstream's string set.
    let ports: Vec<String> = ports.into_iter().collect();
    violation(
        "hostPort",
        format!(
            "{} {} {} {}",
            containers_phrase(&bad),
            pluralize("uses", "use", bad.len()),
            pluralize("hostPort", "hostPorts", ports.len()),
            ports.join(", ")
        ),
    )
}

fn host_probes_and_lifecycle(pod: &PodView, _: u32) -> Option<Violation> {
    let mut bad = BTreeSet::new();
    let mut hosts = BTreeSet::new();
    for c in containers(pod.spec) {
        let handlers = ["livenessProbe", "readinessProbe", "startupProbe"]
            .into_iter()
            .filter_map(|p| c.get(p))
            .chain(
                ["postStart", "preStop"]
                    .into_iter()
                    .filter_map(|h| c.get("lifecycle")?.get(h)),
            );
        for h in handlers {
            for kind in ["httpGet", "tcpSocket"] {
                if let Some(host) = h
                    .get(kind)
                    .and_then(|k| k.get("host"))
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                {
                    bad.insert(name(c));
                    hosts.insert(host.to_string());
                }
            }
        }
    }
    if bad.is_empty() {
        return None;
    }
    let bad: Vec<String> = bad.into_iter().collect();
    let hosts: Vec<String> = hosts.into_iter().collect();
    violation(
        "probe or lifecycle host",
        format!(
            "{} {} {} {}",
            containers_phrase(&bad),
            pluralize("uses", "use", bad.len()),
            pluralize("probe or lifecycle host", "probe or lifecycle hosts", hosts.len()),
            join_quote(&hosts)
        ),
    )
}

fn privileged(pod: &PodView, _: u32) -> Option<Violation> {
    let bad: Vec<String> = containers(pod.spec)
        .filter(|c| sc(c, "privileged").and_then(Value::as_bool) == Some(true))
        .map(name)
        .collect();
    if bad.is_empty() {
        return None;
    }
    violation(
        "privileged",
        format!(
            "{} must not set securityContext.privileged=true",
            containers_phrase(&bad)
        ),
    )
}

fn proc_mount(pod: &PodView) -> Option<Violation> {
    let mut bad = Vec::new();
    let mut types = BTreeSet::new();
    for c in containers(pod.spec) {
        if let Some(t) = sc(c, "procMount").and_then(Value::as_str)
            && t != "Default"
        {
            bad.push(name(c));
            types.insert(t.to_string());
        }
    }
    if bad.is_empty() {
        return None;
    }
    let types: Vec<String> = types.into_iter().collect();
    violation(
        "procMount",
        format!(
            "{} must not set securityContext.procMount to {}",
            containers_phrase(&bad),
            join_quote(&types)
        ),
    )
}

fn proc_mount_baseline(pod: &PodView, v: u32) -> Option<Violation> {
    if v >= 35 && user_namespaced(pod.spec) {
        return None;
    }
    proc_mount(pod)
}

fn proc_mount_restricted(pod: &PodView, _: u32) -> Option<Violation> {
    proc_mount(pod)
}

fn se_linux_options(pod: &PodView, v: u32) -> Option<Violation> {
    let mut allowed = vec!["", "container_t", "container_init_t", "container_kvm_t"];
    if v >= 31 {
        allowed.push("container_engine_t");
    }
    let mut bad_types = BTreeSet::new();
    let (mut set_user, mut set_role) = (false, false);
    let mut valid = |o: &Value| {
        let mut ok = true;
        let ty = o.get("type").and_then(Value::as_str).unwrap_or("");
        if !allowed.contains(&ty) {
            ok = false;
            bad_types.insert(ty.to_string());
        }
        if o.get("user").and_then(Value::as_str).is_some_and(|s| !s.is_empty()) {
            ok = false;
            set_user = true;
        }
        if o.get("role").and_then(Value::as_str).is_some_and(|s| !s.is_empty()) {
            ok = false;
            set_role = true;
        }
        ok
    };
    let mut setters = Vec::new();
    if let Some(o) = pod_sc(pod.spec, "seLinuxOptions")
        && !valid(o)
    {
        setters.push("pod".to_string());
    }
    let bad: Vec<String> = containers(pod.spec)
        .filter(|c| sc(c, "seLinuxOptions").is_some_and(|o| !valid(o)))
        .map(name)
        .collect();
    if !bad.is_empty() {
        setters.push(containers_phrase(&bad));
    }
    if setters.is_empty() {
        return None;
    }
    let mut data = Vec::new();
    if !bad_types.is_empty() {
        let types: Vec<String> = bad_types.into_iter().collect();
        data.push(format!(
            "{} {}",
            pluralize("type", "types", types.len()),
            join_quote(&types)
        ));
    }
    if set_user {
        data.push("user may not be set".to_string());
    }
    if set_role {
        data.push("role may not be set".to_string());
    }
    violation(
        "seLinuxOptions",
        format!(
            "{} set forbidden securityContext.seLinuxOptions: {}",
            set_phrase(&setters),
            data.join("; ")
        ),
    )
}

fn valid_seccomp(t: &str) -> bool {
    matches!(t, "Localhost" | "RuntimeDefault")
}

fn seccomp_baseline(pod: &PodView, v: u32) -> Option<Violation> {
    if v < 19 {
        let annotations = pod.metadata.get("annotations").and_then(Value::as_object);
        let valid = |s: &str| s == "runtime/default" || s == "docker/default" || s.starts_with("localhost/");
        let mut bad = BTreeSet::new();
        let mut check = |key: String| {
            if let Some(val) = annotations.and_then(|a| a.get(&key)).and_then(Value::as_str)
                && !valid(val)
            {
                bad.insert(format!("{key}={val:?}"));
            }
        };
        check("seccomp.security.alpha.kubernetes.io/pod".to_string());
        for c in containers(pod.spec) {
            check(format!("container.seccomp.security.alpha.kubernetes.io/{}", name(c)));
        }
        if bad.is_empty() {
            return None;
        }
        let bad: Vec<String> = bad.into_iter().collect();
        return violation(
            "seccompProfile",
            format!(
                "forbidden {} {}",
                pluralize("annotation", "annotations", bad.len()),
                bad.join(", ")
            ),
        );
    }
    seccomp_set_badly(pod)
}

/// A pod or containers setting a seccomp profile type other than `RuntimeDefault` or `Localhost`.
fn seccomp_set_badly(pod: &PodView) -> Option<Violation> {
    let (setters, values) = profile_setters(pod, "seccompProfile", valid_seccomp);
    if setters.is_empty() {
        return None;
    }
    let values: Vec<String> = values.into_iter().collect();
    violation(
        "seccompProfile",
        format!(
            "{} must not set securityContext.seccompProfile.type to {}",
            set_phrase(&setters),
            join_quote(&values)
        ),
    )
}

fn seccomp_restricted(pod: &PodView, v: u32) -> Option<Violation> {
    if v >= 25 && is_windows(pod.spec) {
        return None;
    }
    if let Some(bad) = seccomp_set_badly(pod) {
        return Some(bad);
    }
    // Nothing set badly: every container needs a valid profile, its own or the pod's.
    if pod_sc(pod.spec, "seccompProfile").is_some() {
        return None;
    }
    let implicit: Vec<String> = containers(pod.spec)
        .filter(|c| sc(c, "seccompProfile").is_none())
        .map(name)
        .collect();
    if implicit.is_empty() {
        return None;
    }
    violation(
        "seccompProfile",
        format!(
            "pod or {} must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\"",
            containers_phrase(&implicit)
        ),
    )
}

fn allowed_sysctls(v: u32) -> Vec<&'static str> {
    let mut allowed = vec![
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_unprivileged_port_start",
    ];
    if v >= 27 {
        allowed.push("net.ipv4.ip_local_reserved_ports");
    }
    if v >= 29 {
        allowed.extend([
            "net.ipv4.tcp_keepalive_time",
            "net.ipv4.tcp_fin_timeout",
            "net.ipv4.tcp_keepalive_intvl",
            "net.ipv4.tcp_keepalive_probes",
        ]);
    }
    if v >= 32 {
        allowed.extend(["net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"]);
    }
    if v >= 37 {
        allowed.extend(["net.ipv4.tcp_slow_start_after_idle", "net.ipv4.tcp_notsent_lowat"]);
    }
    allowed
}

fn sysctls(pod: &PodView, v: u32) -> Option<Violation> {
    let allowed = allowed_sysctls(v);
    let bad: Vec<String> = pod_sc(pod.spec, "sysctls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|s| s.get("name").and_then(Value::as_str))
        .filter(|n| !allowed.contains(n))
        .map(str::to_string)
        .collect();
    if bad.is_empty() {
        return None;
    }
    violation("forbidden sysctls", bad.join(", "))
}

fn windows_host_process(pod: &PodView, _: u32) -> Option<Violation> {
    let host_process = |o: Option<&Value>| o.and_then(|w| w.get("hostProcess")).and_then(Value::as_bool) == Some(true);
    let mut setters = Vec::new();
    if host_process(pod_sc(pod.spec, "windowsOptions")) {
        setters.push("pod".to_string());
    }
    let bad: Vec<String> = containers(pod.spec)
        .filter(|c| host_process(sc(c, "windowsOptions")))
        .map(name)
        .collect();
    if !bad.is_empty() {
        setters.push(containers_phrase(&bad));
    }
    if setters.is_empty() {
        return None;
    }
    violation(
        "hostProcess",
        format!(
            "{} must not set securityContext.windowsOptions.hostProcess=true",
            set_phrase(&setters)
        ),
    )
}

fn allow_privilege_escalation(pod: &PodView, v: u32) -> Option<Violation> {
    if v >= 25 && is_windows(pod.spec) {
        return None;
    }
    let bad: Vec<String> = containers(pod.spec)
        .filter(|c| sc(c, "allowPrivilegeEscalation").and_then(Value::as_bool) != Some(false))
        .map(name)
        .collect();
    if bad.is_empty() {
        return None;
    }
    violation(
        "allowPrivilegeEscalation != false",
        format!(
            "{} must set securityContext.allowPrivilegeEscalation=false",
            containers_phrase(&bad)
        ),
    )
}

fn capabilities_restricted(pod: &PodView, v: u32) -> Option<Violation> {
    if v >= 25 && is_windows(pod.spec) {
        return None;
    }
    let (mut missing_drop, mut adding) = (Vec::new(), Vec::new());
    let mut caps = BTreeSet::new();
    for c in containers(pod.spec) {
        let Some(capabilities) = sc(c, "capabilities") else {
            missing_drop.push(name(c));
            continue;
        };
        let dropped_all = capabilities
            .get("drop")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|d| d.as_str() == Some("ALL"));
        if !dropped_all {
            missing_drop.push(name(c));
        }
        let extra: Vec<String> = added_capabilities(c)
            .into_iter()
            .filter(|cap| cap != "NET_BIND_SERVICE")
            .collect();
        if !extra.is_empty() {
            adding.push(name(c));
            caps.extend(extra);
        }
    }
    let mut details = Vec::new();
    if !missing_drop.is_empty() {
        details.push(format!(
            "{} must set securityContext.capabilities.drop=[\"ALL\"]",
            containers_phrase(&missing_drop)
        ));
    }
    if !adding.is_empty() {
        let caps: Vec<String> = caps.into_iter().collect();
        details.push(format!(
            "{} must not include {} in securityContext.capabilities.add",
            containers_phrase(&adding),
            join_quote(&caps)
        ));
    }
    if details.is_empty() {
        return None;
    }
    violation("unrestricted capabilities", details.join("; "))
}

/// The volume types the restricted level allows.
const RESTRICTED_VOLUME_TYPES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "image",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// Every volume source a pod spec may name, as upstream's switch names them.
const KNOWN_VOLUME_TYPES: &[&str] = &[
    "hostPath",
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "gitRepo",
    "nfs",
    "iscsi",
    "glusterfs",
    "rbd",
    "flexVolume",
    "cinder",
    "cephfs",
    "flocker",
    "fc",
    "azureFile",
    "vsphereVolume",
    "quobyte",
    "azureDisk",
    "photonPersistentDisk",
    "portworxVolume",
    "scaleIO",
    "storageos",
];

fn restricted_volumes(pod: &PodView, _: u32) -> Option<Violation> {
    let mut bad = Vec::new();
    let mut types = BTreeSet::new();
    for vol in volumes(pod.spec) {
        let has = |k: &str| vol.get(k).is_some_and(|v| !v.is_null());
        if RESTRICTED_VOLUME_TYPES.iter().any(|t| has(t)) {
            continue;
        }
        bad.push(name(vol));
        types.insert(
            KNOWN_VOLUME_TYPES
                .iter()
                .find(|t| has(t))
                .copied()
                .unwrap_or("unknown")
                .to_string(),
        );
    }
    if bad.is_empty() {
        return None;
    }
    let types: Vec<String> = types.into_iter().collect();
    violation(
        "restricted volume types",
        format!(
            "{} {} {} {} {}",
            pluralize("volume", "volumes", bad.len()),
            join_quote(&bad),
            pluralize("uses", "use", bad.len()),
            pluralize("restricted volume type", "restricted volume types", types.len()),
            join_quote(&types)
        ),
    )
}

fn run_as_non_root(pod: &PodView, v: u32) -> Option<Violation> {
    if v >= 35 && user_namespaced(pod.spec) {
        return None;
    }
    let mut setters = Vec::new();
    let mut pod_non_root = false;
    match pod_sc(pod.spec, "runAsNonRoot").and_then(Value::as_bool) {
        Some(false) => setters.push("pod".to_string()),
        Some(true) => pod_non_root = true,
        None => {}
    }
    let (mut explicit, mut implicit) = (Vec::new(), Vec::new());
    for c in containers(pod.spec) {
        match sc(c, "runAsNonRoot").and_then(Value::as_bool) {
            Some(false) => explicit.push(name(c)),
            Some(true) => {}
            None if !pod_non_root => implicit.push(name(c)),
            None => {}
        }
    }
    if !explicit.is_empty() {
        setters.push(containers_phrase(&explicit));
    }
    if !setters.is_empty() {
        return violation(
            "runAsNonRoot != true",
            format!(
                "{} must not set securityContext.runAsNonRoot=false",
                set_phrase(&setters)
            ),
        );
    }
    if !implicit.is_empty() {
        return violation(
            "runAsNonRoot != true",
            format!(
                "pod or {} must set securityContext.runAsNonRoot=true",
                containers_phrase(&implicit)
            ),
        );
    }
    None
}

fn run_as_user(pod: &PodView, v: u32) -> Option<Violation> {
    if v >= 35 && user_namespaced(pod.spec) {
        return None;
    }
    let root = |o: Option<&Value>| o.and_then(Value::as_i64) == Some(0);
    let mut setters = Vec::new();
    if root(pod_sc(pod.spec, "runAsUser")) {
        setters.push("pod".to_string());
    }
    let bad: Vec<String> = containers(pod.spec)
        .filter(|c| root(sc(c, "runAsUser")))
        .map(name)
        .collect();
    if !bad.is_empty() {
        setters.push(containers_phrase(&bad));
    }
    if setters.is_empty() {
        return None;
    }
    violation(
        "runAsUser=0",
        format!("{} must not set runAsUser=0", set_phrase(&setters)),
    )
}

/// The pod template of a workload object (what upstream's `PodSpecExtractor` reads), by kind.
pub fn template_of<'a>(kind: &str, obj: &'a Value) -> Option<PodView<'a>> {
    let template = match kind {
        "Pod" => return pod_view(obj),
        "PodTemplate" => obj.get("template")?,
        "CronJob" => obj.pointer("/spec/jobTemplate/spec/template")?,
        "ReplicationController" | "ReplicaSet" | "Deployment" | "StatefulSet" | "DaemonSet" | "Job" => {
            obj.pointer("/spec/template")?
        }
        _ => return None,
    };
    Some(PodView {
        metadata: template.get("metadata").unwrap_or(&Value::Null),
        spec: template.get("spec")?,
    })
}

/// A pod's metadata and spec.
pub fn pod_view(pod: &Value) -> Option<PodView<'_>> {
    Some(PodView {
        metadata: pod.get("metadata").unwrap_or(&Value::Null),
        spec: pod.get("spec")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lv(level: Level) -> LevelVersion {
        LevelVersion {
            level,
            version: Version::Latest,
        }
    }

    fn check(spec: Value, level: Level) -> Verdict {
        let pod = json!({"metadata": {"name": "p"}, "spec": spec});
        evaluate(lv(level), &pod_view(&pod).unwrap())
    }

    #[test]
    fn a_privileged_container_in_restricted_reads_as_upstream() {
        let v = check(
            json!({"containers": [{"name": "c", "image": "busybox", "securityContext": {"privileged": true}}]}),
            Level::Restricted,
        );
        assert_eq!(
            format!("violates PodSecurity \"{}\": {}", lv(Level::Restricted), v.details()),
            "violates PodSecurity \"restricted:latest\": privileged (container \"c\" must not set \
             securityContext.privileged=true), allowPrivilegeEscalation != false (container \"c\" must set \
             securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (container \"c\" must set \
             securityContext.capabilities.drop=[\"ALL\"]), runAsNonRoot != true (pod or container \"c\" must set \
             securityContext.runAsNonRoot=true), seccompProfile (pod or container \"c\" must set \
             securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")"
        );
        assert_eq!(
            v.reasons(),
            "privileged, allowPrivilegeEscalation != false, unrestricted capabilities, runAsNonRoot != true, seccompProfile"
        );
    }

    #[test]
    fn baseline_checks() {
        let v = check(
            json!({
                "hostNetwork": true, "hostPID": true,
                "securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}, {"name": "net.ipv4.tcp_syncookies", "value": "1"}]},
                "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
                "containers": [
                    {"name": "a", "image": "i", "ports": [{"containerPort": 80, "hostPort": 8080}, {"containerPort": 9, "hostPort": 10000}],
                     "securityContext": {"capabilities": {"add": ["NET_ADMIN", "CHOWN", "SYS_ADMIN"]}, "procMount": "Unmasked",
                                         "seccompProfile": {"type": "Unconfined"}, "seLinuxOptions": {"type": "spc_t", "user": "u"}}},
                    {"name": "b", "image": "i", "readinessProbe": {"httpGet": {"host": "10.0.0.1", "port": 80}},
                     "securityContext": {"appArmorProfile": {"type": "Unconfined"}}},
                ],
            }),
            Level::Baseline,
        );
        assert_eq!(
            v.details(),
            "forbidden AppArmor profile (container \"b\" must not set AppArmor profile type to \"Unconfined\"), \
             non-default capabilities (container \"a\" must not include \"NET_ADMIN\", \"SYS_ADMIN\" in securityContext.capabilities.add), \
             host namespaces (hostNetwork=true, hostPID=true), \
             hostPath volumes (volume \"root\"), \
             hostPort (container \"a\" uses hostPorts 10000, 8080), \
             probe or lifecycle host (container \"b\" uses probe or lifecycle host \"10.0.0.1\"), \
             procMount (container \"a\" must not set securityContext.procMount to \"Unmasked\"), \
             seLinuxOptions (container \"a\" set forbidden securityContext.seLinuxOptions: type \"spc_t\"; user may not be set), \
             seccompProfile (container \"a\" must not set securityContext.seccompProfile.type to \"Unconfined\"), \
             forbidden sysctls (kernel.msgmax)"
        );
        // The same pod at an older version: no probe host check before 1.34.
        let pod = json!({"metadata": {}, "spec": {"containers": [{"name": "b", "image": "i",
            "readinessProbe": {"httpGet": {"host": "10.0.0.1", "port": 80}}}]}});
        let old = LevelVersion {
            level: Level::Baseline,
            version: Version::V1(33),
        };
        assert!(evaluate(old, &pod_view(&pod).unwrap()).allowed());
        assert!(!evaluate(lv(Level::Baseline), &pod_view(&pod).unwrap()).allowed());
    }

    #[test]
    fn a_restricted_pod_passes_and_user_namespaces_relax_root() {
        let good = json!({
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "volumes": [{"name": "d", "emptyDir": {}}, {"name": "t", "projected": {"sources": []}}],
            "containers": [{"name": "c", "image": "i", "securityContext": {
                "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}}],
        });
        assert!(check(good.clone(), Level::Restricted).allowed());
        let mut root = good.clone();
        root["securityContext"] = json!({"runAsUser": 0, "seccompProfile": {"type": "RuntimeDefault"}});
        let v = check(root.clone(), Level::Restricted);
        assert_eq!(
            v.details(),
            "runAsNonRoot != true (pod or container \"c\" must set securityContext.runAsNonRoot=true), runAsUser=0 (pod must not set runAsUser=0)"
        );
        root["hostUsers"] = json!(false);
        assert!(check(root, Level::Restricted).allowed());
        let mut nfs = good;
        nfs["volumes"] =
            json!([{"name": "n", "nfs": {"server": "s", "path": "/"}}, {"name": "h", "hostPath": {"path": "/"}}]);
        assert_eq!(
            check(nfs, Level::Restricted).details(),
            "restricted volume types (volumes \"n\", \"h\" use restricted volume types \"hostPath\", \"nfs\")"
        );
    }

    #[test]
    fn labels_to_policy_as_upstream() {
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        let (p, errs) = policy_for(&labels(&[(ENFORCE_LABEL, "baseline")]), Policy::default());
        assert!(errs.is_empty());
        assert_eq!(p.enforce.to_string(), "baseline:latest");
        // Warn follows a stricter enforce.
        assert_eq!(p.warn.to_string(), "baseline:latest");
        assert_eq!(p.audit.to_string(), "privileged:latest");
        let (p, errs) = policy_for(
            &labels(&[(ENFORCE_LABEL, "strict"), (WARN_VERSION_LABEL, "1.2")]),
            Policy::default(),
        );
        assert_eq!(p.enforce.level, Level::Restricted, "a bad enforce level fails closed");
        assert_eq!(errs.len(), 2);
        assert_eq!(errs[0].2, "must be one of privileged, baseline, restricted");
        assert_eq!(errs[1].2, "must be \"latest\" or \"v1.x\"");
        assert_eq!(Version::parse("v1.30"), Ok(Version::V1(30)));
        assert!(Version::parse("v1.030").is_err());
        assert_eq!(Version::parse("v1.99").unwrap().minor(), MAX_MINOR);
    }
}
