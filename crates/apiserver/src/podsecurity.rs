//! Upstream's PodSecurity admission plugin (`k8s.io/pod-security-admission/admission`), built in
//! and on: a namespace's `pod-security.kubernetes.io/enforce|audit|warn` labels (and their
//! `-version`s), over the cluster's defaults, decide what a pod there may ask for
//! ([`skiff_api::podsecurity`] evaluates it).
//!
//! - Pods (created, updated in a way that matters, or given ephemeral containers) are refused
//!   by the enforce level (`pods "x" is forbidden: violates PodSecurity "restricted:latest":
//!   ...`), answered with a warning by the warn level, and annotated in the audit log by the
//!   audit level.
//! - Workloads with a pod template (Deployments, Jobs, ...) are warned about and audited, never
//!   refused: the pods they make are.
//! - Namespaces: the labels must parse (422); a stricter enforce level warns about the pods
//!   already there that it would refuse.
//! - Exemptions and defaults come from the `PodSecurity` plugin of the
//!   `--admission-control-config-file` (upstream's `PodSecurityConfiguration`).

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use anyhow::Context as _;
use serde_json::Value;
use skiff_api::StatusError;
use skiff_api::podsecurity::{self as policy, Level, LevelVersion, PodView, Policy, Version};
use skiff_api::status::FieldError;

use crate::handlers::Ctx;
use crate::objects;

/// Annotations this plugin puts on audit events.
pub const ENFORCE_POLICY_ANNOTATION: &str = "pod-security.kubernetes.io/enforce-policy";
pub const AUDIT_VIOLATIONS_ANNOTATION: &str = "pod-security.kubernetes.io/audit-violations";
pub const EXEMPT_ANNOTATION: &str = "pod-security.kubernetes.io/exempt";

/// How many existing pods a namespace's new enforce level is checked against (upstream's).
const NAMESPACE_MAX_PODS_TO_CHECK: usize = 3000;

/// The plugin's configuration: the cluster's default policy and who is exempt.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodSecurity {
    pub defaults: Policy,
    pub exempt_usernames: Vec<String>,
    pub exempt_runtime_classes: Vec<String>,
    pub exempt_namespaces: Vec<String>,
}

impl PodSecurity {
    /// The `PodSecurity` plugin's configuration in an `AdmissionConfiguration` file (inline,
    /// or in the file its `path` names); the default (everything privileged, nothing exempt)
    /// when the file configures no such plugin.
    pub fn from_admission_config(file: &Path) -> anyhow::Result<PodSecurity> {
        let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let doc: Value = serde_saphyr::from_str(&text).with_context(|| format!("parsing {}", file.display()))?;
        if doc.get("kind").and_then(Value::as_str) != Some("AdmissionConfiguration") {
            anyhow::bail!("{}: expected kind AdmissionConfiguration", file.display());
        }
        let Some(plugin) = doc
            .get("plugins")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|p| p.get("name").and_then(Value::as_str) == Some("PodSecurity"))
        else {
            return Ok(PodSecurity::default());
        };
        let config = match (plugin.get("configuration"), plugin.get("path").and_then(Value::as_str)) {
            (Some(c), _) => c.clone(),
            (None, Some(path)) => {
                let path = file.parent().unwrap_or(Path::new(".")).join(path);
                let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
                serde_saphyr::from_str(&text).with_context(|| format!("parsing {}", path.display()))?
            }
            (None, None) => return Ok(PodSecurity::default()),
        };
        PodSecurity::from_configuration(&config)
    }

    /// Upstream's `PodSecurityConfiguration` (`defaults`, `exemptions`).
    pub fn from_configuration(config: &Value) -> anyhow::Result<PodSecurity> {
        if config.get("kind").and_then(Value::as_str) != Some("PodSecurityConfiguration") {
            anyhow::bail!("the PodSecurity plugin's configuration must be of kind PodSecurityConfiguration");
        }
        let defaults = config.get("defaults");
        let field = |k: &str, fallback: &str| -> String {
            defaults
                .and_then(|d| d.get(k))
                .and_then(Value::as_str)
                .unwrap_or(fallback)
                .to_string()
        };
        let level_version = |level: &str, version: &str| -> anyhow::Result<LevelVersion> {
            Ok(LevelVersion {
                level: Level::parse(&field(level, "privileged"))
                    .map_err(|e| anyhow::anyhow!("defaults.{level}: {e}"))?,
                version: Version::parse(&field(version, "latest"))
                    .map_err(|e| anyhow::anyhow!("defaults.{version}: {e}"))?,
            })
        };
        let list = |k: &str| -> Vec<String> {
            config
                .pointer(&format!("/exemptions/{k}"))
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        };
        Ok(PodSecurity {
            defaults: Policy {
                enforce: level_version("enforce", "enforce-version")?,
                audit: level_version("audit", "audit-version")?,
                warn: level_version("warn", "warn-version")?,
            },
            exempt_usernames: list("usernames"),
            exempt_runtime_classes: list("runtimeClasses"),
            exempt_namespaces: list("namespaces"),
        })
    }

    fn exempt_namespace(&self, ns: &str) -> bool {
        !ns.is_empty() && self.exempt_namespaces.iter().any(|n| n == ns)
    }

    fn exempt_user(&self, user: &str) -> bool {
        !user.is_empty() && self.exempt_usernames.iter().any(|u| u == user)
    }

    fn exempt_runtime_class(&self, spec: &Value) -> bool {
        spec.get("runtimeClassName")
            .and_then(Value::as_str)
            .is_some_and(|rc| !rc.is_empty() && self.exempt_runtime_classes.iter().any(|c| c == rc))
    }
}

/// The workloads with a pod template, as upstream's `PodSpecExtractor` knows them.
fn pod_controller_kind(group: &str, plural: &str) -> Option<&'static str> {
    Some(match (group, plural) {
        ("", "podtemplates") => "PodTemplate",
        ("", "replicationcontrollers") => "ReplicationController",
        ("apps", "replicasets") => "ReplicaSet",
        ("apps", "deployments") => "Deployment",
        ("apps", "statefulsets") => "StatefulSet",
        ("apps", "daemonsets") => "DaemonSet",
        ("batch", "jobs") => "Job",
        ("batch", "cronjobs") => "CronJob",
        _ => return None,
    })
}

fn labels_of(obj: &Value) -> BTreeMap<String, String> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default()
}

fn has_policy_labels(labels: &BTreeMap<String, String>) -> bool {
    labels.keys().any(|k| k.starts_with("pod-security.kubernetes.io/"))
}

/// The admission check of a create (`old` None) or update of `obj` at the validating stage.
pub async fn admit(ctx: &Ctx, obj: &Value, old: Option<&Value>) -> Result<(), StatusError> {
    let res = ctx.rr.resource;
    let sub = ctx.rr.subresource.as_str();
    match (res.group, res.plural) {
        ("", "pods") if matches!(sub, "" | "ephemeralcontainers") => admit_pod(ctx, obj, old).await,
        ("", "namespaces") if sub.is_empty() => admit_namespace(ctx, obj, old).await,
        (group, plural) if sub.is_empty() => match pod_controller_kind(group, plural) {
            Some(kind) => admit_pod_controller(ctx, kind, obj).await,
            None => Ok(()),
        },
        _ => Ok(()),
    }
}

/// The policy of the request's namespace, with what did not parse.
async fn namespace_policy(ctx: &Ctx) -> Result<Option<(Policy, Vec<policy::LabelError>)>, StatusError> {
    let config = &ctx.state.pod_security;
    let ns_res = skiff_api::registry::lookup("", "v1", "namespaces")
        .ok_or_else(|| StatusError::internal("the registry has no namespaces"))?;
    let key = objects::key(ns_res, "", &ctx.rr.namespace);
    let store = &ctx.state.store;
    let kv = match store.get_cached(&key).await.map_err(|e| ctx.store_err(e))? {
        Some(kv) => Some(kv),
        None => store.get(&key).await.map_err(|e| ctx.store_err(e))?,
    };
    let Some(kv) = kv else {
        return Err(StatusError::internal(format!(
            "failed to lookup namespace {:?}",
            ctx.rr.namespace
        )));
    };
    // Most namespaces carry no policy: their bytes tell, before anything is parsed.
    const LABEL: &[u8] = b"pod-security.kubernetes.io/";
    if !kv.value.windows(LABEL.len()).any(|w| w == LABEL) {
        return Ok((!config.defaults.fully_privileged()).then(|| (config.defaults, Vec::new())));
    }
    let ns = objects::decode_kv(&kv).ok_or_else(|| StatusError::internal("decoding the namespace"))?;
    Ok(Some(policy::policy_for(&labels_of(&ns), config.defaults)))
}

fn annotate(ctx: &Ctx, key: &'static str, value: String) {
    ctx.audit_annotations.add(key, value);
}

/// Upstream's `ValidatePod`.
async fn admit_pod(ctx: &Ctx, pod: &Value, old: Option<&Value>) -> Result<(), StatusError> {
    let config = &ctx.state.pod_security;
    if config.exempt_namespace(&ctx.rr.namespace) {
        annotate(ctx, EXEMPT_ANNOTATION, "namespace".into());
        return Ok(());
    }
    if config.exempt_user(&ctx.user.user) {
        annotate(ctx, EXEMPT_ANNOTATION, "user".into());
        return Ok(());
    }
    let Some((policy, errs)) = namespace_policy(ctx).await? else {
        return Ok(());
    };
    if errs.is_empty() && policy.fully_privileged() {
        annotate(ctx, ENFORCE_POLICY_ANNOTATION, LevelVersion::PRIVILEGED.to_string());
        return Ok(());
    }
    if let Some(old) = old
        && !significant_update(pod, old)
    {
        return Ok(());
    }
    let Some(view) = policy::pod_view(pod) else {
        return Ok(());
    };
    evaluate(ctx, policy, &errs, &view, true)
}

/// Upstream's `ValidatePodController`: warnings and audit annotations, never a refusal.
async fn admit_pod_controller(ctx: &Ctx, kind: &str, obj: &Value) -> Result<(), StatusError> {
    let config = &ctx.state.pod_security;
    if config.exempt_namespace(&ctx.rr.namespace) || config.exempt_user(&ctx.user.user) {
        return Ok(());
    }
    let Some((policy, errs)) = namespace_policy(ctx).await? else {
        return Ok(());
    };
    if errs.is_empty() && policy.fully_privileged() {
        return Ok(());
    }
    let Some(view) = policy::template_of(kind, obj) else {
        return Ok(());
    };
    evaluate(ctx, policy, &errs, &view, false)
}

/// Upstream's `EvaluatePod`: enforce (when `enforce`), audit, then warn, reusing a result when
/// two modes ask for the same level and version.
fn evaluate(
    ctx: &Ctx,
    policy: Policy,
    errs: &[policy::LabelError],
    pod: &PodView,
    enforce: bool,
) -> Result<(), StatusError> {
    if ctx.state.pod_security.exempt_runtime_class(pod.spec) {
        annotate(ctx, EXEMPT_ANNOTATION, "runtimeClass".into());
        return Ok(());
    }
    if !errs.is_empty() {
        let why: Vec<String> = errs
            .iter()
            .map(|(label, value, why)| format!("metadata.labels[{label}]: Invalid value: {value:?}: {why}"))
            .collect();
        annotate(ctx, "error", format!("Failed to parse policy: {}", why.join(", ")));
    }
    let mut cache: Vec<(LevelVersion, policy::Verdict)> = Vec::new();
    let mut verdict = |lv: LevelVersion| -> policy::Verdict {
        if let Some((_, v)) = cache.iter().find(|(k, _)| *k == lv) {
            return v.clone();
        }
        let v = policy::evaluate(lv, pod);
        cache.push((lv, v.clone()));
        v
    };
    let mut refusal = None;
    if enforce {
        annotate(ctx, ENFORCE_POLICY_ANNOTATION, policy.enforce.to_string());
        let v = verdict(policy.enforce);
        if !v.allowed() {
            let name = pod.metadata.get("name").and_then(Value::as_str).unwrap_or("");
            refusal = Some(StatusError::forbidden_resource(
                ctx.rr.resource.group,
                ctx.rr.resource.plural,
                name,
                &format!("violates PodSecurity {:?}: {}", policy.enforce.to_string(), v.details()),
            ));
        }
    }
    let audit = verdict(policy.audit);
    if !audit.allowed() {
        annotate(
            ctx,
            AUDIT_VIOLATIONS_ANNOTATION,
            format!(
                "would violate PodSecurity {:?}: {}",
                policy.audit.to_string(),
                audit.details()
            ),
        );
    }
    if let Some(e) = refusal {
        return Err(e);
    }
    let warn = verdict(policy.warn);
    if !warn.allowed() {
        ctx.warnings.add(format!(
            "would violate PodSecurity {:?}: {}",
            policy.warn.to_string(),
            warn.details()
        ));
    }
    Ok(())
}

/// Upstream's `isSignificantPodUpdate`: only a change of containers (their count, an image, an
/// ephemeral container added or changed) is evaluated again.
fn significant_update(pod: &Value, old: &Value) -> bool {
    let list = |v: &Value, k: &str| -> Vec<Value> {
        v.pointer(&format!("/spec/{k}"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let image = |c: &Value| c.get("image").cloned();
    for k in ["containers", "initContainers"] {
        let (new, old) = (list(pod, k), list(old, k));
        if new.len() != old.len() || new.iter().zip(&old).any(|(n, o)| image(n) != image(o)) {
            return true;
        }
    }
    let old_ephemeral = list(old, "ephemeralContainers");
    list(pod, "ephemeralContainers").iter().any(|c| {
        match old_ephemeral.iter().find(|o| o.get("name") == c.get("name")) {
            None => true,
            Some(o) => image(o) != image(c),
        }
    })
}

/// Upstream's `ValidateNamespace`.
async fn admit_namespace(ctx: &Ctx, ns: &Value, old: Option<&Value>) -> Result<(), StatusError> {
    let config = &ctx.state.pod_security;
    let labels = labels_of(ns);
    let name = objects::name(ns);
    let (new_policy, new_errs) = policy::policy_for(&labels, config.defaults);
    let invalid = |errs: &[policy::LabelError]| {
        let errs: Vec<FieldError> = errs
            .iter()
            .map(|(label, value, why)| {
                FieldError::invalid(
                    format!("metadata.labels[{label}]"),
                    &Value::String(value.clone()),
                    why.clone(),
                )
            })
            .collect();
        StatusError::invalid("", "Namespace", name, &errs)
    };
    let Some(old) = old else {
        if !new_errs.is_empty() {
            return Err(invalid(&new_errs));
        }
        if config.exempt_namespace(name) && has_policy_labels(&labels) {
            ctx.warnings.add(exempt_warning(name, &new_policy));
        }
        return Ok(());
    };
    let (old_policy, old_errs) = policy::policy_for(&labels_of(old), config.defaults);
    if !new_errs.is_empty() && (old_errs.is_empty() || old_errs != new_errs) {
        return Err(invalid(&new_errs));
    }
    if new_policy.enforce == old_policy.enforce
        || new_policy.enforce.level == Level::Privileged
        || (new_policy.enforce.version == old_policy.enforce.version
            && new_policy.enforce.level <= old_policy.enforce.level)
    {
        return Ok(());
    }
    if config.exempt_namespace(name) {
        if has_policy_labels(&labels) {
            ctx.warnings.add(exempt_warning(name, &new_policy));
        }
        return Ok(());
    }
    for w in existing_pod_warnings(ctx, name, new_policy.enforce).await {
        ctx.warnings.add(w);
    }
    Ok(())
}

fn exempt_warning(name: &str, p: &Policy) -> String {
    format!(
        "namespace {name:?} is exempt from Pod Security, and the policy (enforce={}, audit={}, warn={}) will be ignored",
        p.enforce, p.audit, p.warn
    )
}

/// Upstream's `EvaluatePodsInNamespace`: the pods already in `namespace` the new enforce level
/// would refuse, one warning per distinct reason, prefixed with the first pod's name.
async fn existing_pod_warnings(ctx: &Ctx, namespace: &str, enforce: LevelVersion) -> Vec<String> {
    let Some(pods_res) = skiff_api::registry::lookup("", "v1", "pods") else {
        return vec!["failed to list pods while checking new PodSecurity enforce level".into()];
    };
    let listed = match ctx.state.store.list_cached(&objects::prefix(pods_res, namespace)).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, namespace, "listing pods for a new PodSecurity level failed");
            return vec!["failed to list pods while checking new PodSecurity enforce level".into()];
        }
    };
    let config = &ctx.state.pod_security;
    let pods: Vec<Value> = listed.iter().filter_map(objects::decode_kv).collect();
    // One pod per controller first, then the rest (upstream's prioritizePods).
    let mut seen = HashSet::new();
    let (mut first, mut rest) = (Vec::new(), Vec::new());
    for pod in &pods {
        let Some(spec) = pod.get("spec") else { continue };
        if config.exempt_runtime_class(spec) {
            continue;
        }
        let controller = pod
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|o| o.get("controller").and_then(Value::as_bool) == Some(true))
            .and_then(|o| o.get("uid").and_then(Value::as_str));
        match controller {
            Some(uid) if !seen.insert(uid.to_string()) => rest.push(pod),
            _ => first.push(pod),
        }
    }
    first.extend(rest);
    let total = first.len();
    let checked = total.min(NAMESPACE_MAX_PODS_TO_CHECK);
    let mut by_reason: Vec<(String, String, usize)> = Vec::new();
    for pod in first.into_iter().take(checked) {
        let Some(view) = policy::pod_view(pod) else { continue };
        let v = policy::evaluate(enforce, &view);
        if v.allowed() {
            continue;
        }
        let reason = v.reasons();
        let pod_name = objects::name(pod).to_string();
        match by_reason.iter_mut().find(|(r, _, _)| *r == reason) {
            Some((_, first_name, count)) => {
                *count += 1;
                if pod_name < *first_name {
                    *first_name = pod_name;
                }
            }
            None => by_reason.push((reason, pod_name, 1)),
        }
    }
    let mut warnings = Vec::new();
    if checked < total {
        warnings.push(format!(
            "new PodSecurity enforce level only checked against the first {checked} of {total} existing pods"
        ));
    }
    if !by_reason.is_empty() {
        warnings.push(format!(
            "existing pods in namespace {namespace:?} violate the new PodSecurity enforce level {:?}",
            enforce.to_string()
        ));
    }
    let mut pod_warnings: Vec<String> = by_reason
        .into_iter()
        .map(|(reason, name, count)| match count {
            1 => format!("{name}: {reason}"),
            2 => format!("{name} (and 1 other pod): {reason}"),
            n => format!("{name} (and {} other pods): {reason}", n - 1),
        })
        .collect();
    pod_warnings.sort();
    warnings.extend(pod_warnings);
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn configuration_as_upstream_writes_it() {
        let config = json!({
            "apiVersion": "pod-security.admission.config.k8s.io/v1",
            "kind": "PodSecurityConfiguration",
            "defaults": {"enforce": "baseline", "enforce-version": "v1.30", "warn": "restricted"},
            "exemptions": {"usernames": ["ci"], "runtimeClasses": ["kata"], "namespaces": ["kube-system"]},
        });
        let ps = PodSecurity::from_configuration(&config).unwrap();
        assert_eq!(ps.defaults.enforce.to_string(), "baseline:v1.30");
        assert_eq!(ps.defaults.warn.to_string(), "restricted:latest");
        assert_eq!(ps.defaults.audit.to_string(), "privileged:latest");
        assert!(ps.exempt_namespace("kube-system") && !ps.exempt_namespace(""));
        assert!(ps.exempt_user("ci"));
        assert!(ps.exempt_runtime_class(&json!({"runtimeClassName": "kata"})));
        let bad = json!({"kind": "PodSecurityConfiguration", "defaults": {"enforce": "strict"}});
        assert!(PodSecurity::from_configuration(&bad).is_err());
    }

    #[test]
    fn only_container_changes_are_evaluated_again() {
        let pod = json!({"spec": {"containers": [{"name": "c", "image": "a"}]}});
        let mut relabeled = pod.clone();
        relabeled["metadata"] = json!({"labels": {"x": "y"}});
        assert!(!significant_update(&relabeled, &pod));
        let mut image = pod.clone();
        image["spec"]["containers"][0]["image"] = "b".into();
        assert!(significant_update(&image, &pod));
        let mut debug = pod.clone();
        debug["spec"]["ephemeralContainers"] = json!([{"name": "d", "image": "busybox"}]);
        assert!(significant_update(&debug, &pod));
    }
}
