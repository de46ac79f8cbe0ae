//! Resource quota accounting without I/O, as upstream's `k8s.io/apiserver/pkg/quota/v1`
//! (resource lists and their arithmetic), its `generic` object count evaluator and
//! `pkg/quota/v1/evaluator/core` (pods, services, persistent volume claims): what an object
//! uses, which quota resources an evaluator answers for, the scopes a quota selects objects by,
//! and upstream's `CheckRequest` (the admission decision and the usage it charges). The API
//! server's ResourceQuota admission and the resource quota controller both count with it.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use serde_json::{Map, Value, json};

use crate::quantity::{Format, Quantity};

/// A resource list (`spec.hard`, `status.used`), sorted by name as upstream prints it.
pub type ResourceList = BTreeMap<String, Quantity>;

/// A resource list read from JSON; values that are not quantities are left out.
pub fn list_from(v: Option<&Value>) -> ResourceList {
    v.and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Quantity::from_json(v).ok().map(|q| (k.clone(), q)))
                .collect()
        })
        .unwrap_or_default()
}

/// A resource list as JSON (each quantity in its canonical form).
pub fn list_to_json(l: &ResourceList) -> Value {
    Value::Object(
        l.iter()
            .map(|(k, v)| (k.clone(), json!(v.canonical())))
            .collect::<Map<_, _>>(),
    )
}

fn one() -> Quantity {
    Quantity::new(1, Format::DecimalSI)
}

/// Upstream's `quota.Add`.
pub fn add(a: &ResourceList, b: &ResourceList) -> ResourceList {
    let mut out = a.clone();
    for (k, v) in b {
        let sum = match out.get(k) {
            Some(q) => q.checked_add(v).unwrap_or(*q),
            None => *v,
        };
        out.insert(k.clone(), sum);
    }
    out
}

/// Upstream's `quota.SubtractWithNonNegativeResult`.
pub fn subtract_non_negative(a: &ResourceList, b: &ResourceList) -> ResourceList {
    let zero = Quantity::default();
    let mut out = ResourceList::new();
    for (k, v) in a {
        let d = match b.get(k) {
            Some(q) => v.checked_sub(q).unwrap_or(*v),
            None => *v,
        };
        out.insert(k.clone(), if d.is_negative() { zero } else { d });
    }
    for k in b.keys() {
        out.entry(k.clone()).or_insert(zero);
    }
    out
}

/// Upstream's `quota.Mask`: only the named resources.
pub fn mask<'a>(l: &ResourceList, names: impl IntoIterator<Item = &'a String>) -> ResourceList {
    names
        .into_iter()
        .filter_map(|n| l.get(n).map(|q| (n.clone(), *q)))
        .collect()
}

/// Upstream's `quota.LessThanOrEqual`: whether every resource of `a` that `b` names is within
/// it, and the ones that are not.
pub fn less_than_or_equal(a: &ResourceList, b: &ResourceList) -> (bool, Vec<String>) {
    let exceeded: Vec<String> = a
        .iter()
        .filter(|(k, v)| b.get(*k).is_some_and(|limit| *v > limit))
        .map(|(k, _)| k.clone())
        .collect();
    (exceeded.is_empty(), exceeded)
}

/// Upstream's `quota.Equals` (same names, same amounts).
pub fn equals(a: &ResourceList, b: &ResourceList) -> bool {
    a.len() == b.len() && a.iter().all(|(k, v)| b.get(k) == Some(v))
}

/// Upstream's `prettyPrint`: `a=1,b=2Gi`, sorted by name.
pub fn pretty_print(l: &ResourceList) -> String {
    l.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

/// The name under which every object of a resource is counted (`count/pods`,
/// `count/deployments.apps`), upstream's `ObjectCountQuotaResourceNameFor`.
pub fn object_count_name(group: &str, resource: &str) -> String {
    if group.is_empty() {
        format!("count/{resource}")
    } else {
        format!("count/{resource}.{group}")
    }
}

/// The operation being admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
}

const STORAGE_CLASS_SUFFIX: &str = ".storageclass.storage.k8s.io/";
const POD_RESOURCES: &[&str] = &[
    "cpu",
    "memory",
    "ephemeral-storage",
    "requests.cpu",
    "requests.memory",
    "requests.ephemeral-storage",
    "limits.cpu",
    "limits.memory",
    "limits.ephemeral-storage",
    "pods",
];
/// The resources each container must name when a quota limits them (upstream's
/// `validationSet`, kept for backward compatibility).
const VALIDATION_SET: &[&str] = &[
    "cpu",
    "memory",
    "requests.cpu",
    "requests.memory",
    "limits.cpu",
    "limits.memory",
];
const SERVICE_RESOURCES: &[&str] = &["services", "services.loadbalancers", "services.nodeports"];
const PVC_RESOURCES: &[&str] = &["persistentvolumeclaims", "requests.storage"];
/// Resources whose objects are also counted under their legacy name (`secrets`, `configmaps`).
const LEGACY_COUNTED: &[&str] = &["configmaps", "secrets", "replicationcontrollers", "resourcequotas"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Pods,
    Services,
    Claims,
    Count,
}

/// The evaluator of one group and resource (upstream's `quota.Evaluator`): pods, services and
/// claims have their own; every other resource is counted (`count/<resource>.<group>`).
#[derive(Clone, Debug)]
pub struct Evaluator {
    group: String,
    resource: String,
    kind: Kind,
}

impl Evaluator {
    pub fn new(group: &str, resource: &str) -> Evaluator {
        let kind = match (group, resource) {
            ("", "pods") => Kind::Pods,
            ("", "services") => Kind::Services,
            ("", "persistentvolumeclaims") => Kind::Claims,
            _ => Kind::Count,
        };
        Evaluator {
            group: group.to_string(),
            resource: resource.to_string(),
            kind,
        }
    }

    pub fn group(&self) -> &str {
        &self.group
    }

    pub fn resource(&self) -> &str {
        &self.resource
    }

    fn count_name(&self) -> String {
        object_count_name(&self.group, &self.resource)
    }

    fn legacy_name(&self) -> Option<&str> {
        (self.group.is_empty() && LEGACY_COUNTED.contains(&self.resource.as_str())).then_some(self.resource.as_str())
    }

    /// Whether the evaluator charges this operation: every evaluator charges creates; services
    /// (their type may change) and claims (they may grow) updates too. A pod's resources do
    /// not change through an update.
    pub fn handles(&self, op: Operation) -> bool {
        match op {
            Operation::Create => true,
            Operation::Update => matches!(self.kind, Kind::Services | Kind::Claims),
        }
    }

    /// Whether `name` is a quota resource this evaluator answers for.
    pub fn matches_resource(&self, name: &str) -> bool {
        if name == self.count_name() {
            return true;
        }
        match self.kind {
            Kind::Pods => {
                POD_RESOURCES.contains(&name)
                    || name.starts_with("hugepages-")
                    || name.starts_with("requests.hugepages-")
                    || name.strip_prefix("requests.").is_some_and(is_extended_resource_name)
            }
            Kind::Services => SERVICE_RESOURCES.contains(&name),
            Kind::Claims => {
                PVC_RESOURCES.contains(&name)
                    || PVC_RESOURCES
                        .iter()
                        .any(|r| name.ends_with(&format!("{STORAGE_CLASS_SUFFIX}{r}")))
            }
            Kind::Count => self.legacy_name() == Some(name),
        }
    }

    /// Upstream's `MatchingResources`: the names among `names` this evaluator answers for.
    pub fn matching_resources<'a>(&self, names: impl IntoIterator<Item = &'a String>) -> Vec<String> {
        names
            .into_iter()
            .filter(|n| self.matches_resource(n))
            .cloned()
            .collect()
    }

    /// What the object uses (upstream's `Usage`); `now` decides whether a deleted pod's grace
    /// period has passed.
    pub fn usage(&self, obj: &Value, now: Timestamp) -> ResourceList {
        let mut usage = ResourceList::new();
        usage.insert(self.count_name(), one());
        match self.kind {
            Kind::Pods => {
                if !pod_counts(obj, now) {
                    return usage;
                }
                usage = add(&usage, &pod_compute_usage(&pod_requests(obj), &pod_limits(obj)));
            }
            Kind::Services => {
                usage.insert("services".into(), one());
                let ports = obj.pointer("/spec/ports").and_then(Value::as_array).map_or(0, Vec::len);
                let n = |c: usize| Quantity::new(i64::try_from(c).unwrap_or(i64::MAX), Format::DecimalSI);
                match obj.pointer("/spec/type").and_then(Value::as_str) {
                    Some("NodePort") => {
                        usage.insert("services.nodeports".into(), n(ports));
                    }
                    Some("LoadBalancer") => {
                        let allocate = obj
                            .pointer("/spec/allocateLoadBalancerNodePorts")
                            .and_then(Value::as_bool)
                            != Some(false);
                        let node_ports = if allocate {
                            ports
                        } else {
                            obj.pointer("/spec/ports").and_then(Value::as_array).map_or(0, |ps| {
                                ps.iter()
                                    .filter(|p| p.get("nodePort").and_then(Value::as_i64).unwrap_or(0) != 0)
                                    .count()
                            })
                        };
                        usage.insert("services.nodeports".into(), n(node_ports));
                        usage.insert("services.loadbalancers".into(), one());
                    }
                    _ => {}
                }
            }
            Kind::Claims => {
                usage.insert("persistentvolumeclaims".into(), one());
                let class = crate::volume::class_of(obj);
                if !class.is_empty() {
                    usage.insert(format!("{class}{STORAGE_CLASS_SUFFIX}persistentvolumeclaims"), one());
                }
                if let Some(storage) = claim_storage(obj) {
                    usage.insert("requests.storage".into(), storage);
                    if !class.is_empty() {
                        usage.insert(format!("{class}{STORAGE_CLASS_SUFFIX}requests.storage"), storage);
                    }
                }
            }
            Kind::Count => {
                if let Some(legacy) = self.legacy_name() {
                    usage.insert(legacy.to_string(), one());
                }
            }
        }
        usage
    }

    /// Upstream's `Constraints`: a pod whose quota limits cpu or memory must name them in
    /// every container: `must specify limits.cpu for: app; must specify ...`.
    pub fn constraints(&self, required: &[String], obj: &Value) -> Result<(), String> {
        if self.kind != Kind::Pods {
            return Ok(());
        }
        let required: BTreeSet<&str> = required
            .iter()
            .map(String::as_str)
            .filter(|r| VALIDATION_SET.contains(r))
            .collect();
        if required.is_empty() {
            return Ok(());
        }
        let mut missing: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
        for c in containers(obj, "containers").chain(containers(obj, "initContainers")) {
            let usage = pod_compute_usage(
                &list_from(c.pointer("/resources/requests")),
                &list_from(c.pointer("/resources/limits")),
            );
            for r in &required {
                if !usage.contains_key(*r) {
                    let name = c.get("name").and_then(Value::as_str).unwrap_or("").to_string();
                    missing.entry(r).or_default().insert(name);
                }
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        Err(missing
            .iter()
            .map(|(r, names)| {
                format!(
                    "must specify {r} for: {}",
                    names.iter().cloned().collect::<Vec<_>>().join(",")
                )
            })
            .collect::<Vec<_>>()
            .join("; "))
    }

    /// Whether the object is selected by one scope requirement (upstream's
    /// `MatchesScopeFunc`): only pods have scopes; other objects match no scope.
    pub fn matches_scope(&self, req: &ScopeRequirement, obj: &Value) -> bool {
        if self.kind != Kind::Pods {
            return false;
        }
        match req.scope.as_str() {
            "Terminating" => is_terminating(obj),
            "NotTerminating" => !is_terminating(obj),
            "BestEffort" => is_best_effort(obj),
            "NotBestEffort" => !is_best_effort(obj),
            "PriorityClass" => {
                let class = obj
                    .pointer("/spec/priorityClassName")
                    .and_then(Value::as_str)
                    .filter(|c| !c.is_empty());
                match req.operator.as_str() {
                    "Exists" => class.is_some(),
                    "DoesNotExist" => class.is_none(),
                    "In" => class.is_some_and(|c| req.values.iter().any(|v| v == c)),
                    "NotIn" => class.is_none_or(|c| !req.values.iter().any(|v| v == c)),
                    _ => false,
                }
            }
            "CrossNamespacePodAffinity" => uses_cross_namespace_affinity(obj),
            _ => false,
        }
    }

    /// Upstream's `Matches`: the quota tracks a resource of this evaluator (in `status.hard`)
    /// and every scope of the quota selects the object.
    pub fn matches(&self, quota: &Value, obj: &Value) -> bool {
        let hard = list_from(quota.pointer("/status/hard"));
        if self.matching_resources(hard.keys()).is_empty() {
            return false;
        }
        scope_requirements(quota).iter().all(|s| self.matches_scope(s, obj))
    }
}

/// Whether the resource name (without `requests.`) is an extended resource: qualified by a
/// domain that is not `kubernetes.io`'s.
fn is_extended_resource_name(name: &str) -> bool {
    name.contains('/') && !name.contains("kubernetes.io/") && !name.starts_with("requests.")
}

/// One scope a quota selects objects by (`spec.scopes` are `Exists` requirements).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScopeRequirement {
    pub scope: String,
    pub operator: String,
    pub values: Vec<String>,
}

/// Upstream's `getScopeSelectorsFromQuota`.
pub fn scope_requirements(quota: &Value) -> Vec<ScopeRequirement> {
    let mut out: Vec<ScopeRequirement> = quota
        .pointer("/spec/scopes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|s| ScopeRequirement {
            scope: s.to_string(),
            operator: "Exists".into(),
            values: Vec::new(),
        })
        .collect();
    for e in quota
        .pointer("/spec/scopeSelector/matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        out.push(ScopeRequirement {
            scope: e.get("scopeName").and_then(Value::as_str).unwrap_or("").to_string(),
            operator: e.get("operator").and_then(Value::as_str).unwrap_or("").to_string(),
            values: e
                .get("values")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect(),
        });
    }
    out
}

fn containers<'a>(obj: &'a Value, field: &str) -> impl Iterator<Item = &'a Value> {
    obj.pointer(&format!("/spec/{field}"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

/// Upstream's `QuotaV1Pod`: terminal pods, and deleted pods past their grace period, no
/// longer use compute resources.
fn pod_counts(pod: &Value, now: Timestamp) -> bool {
    if matches!(
        pod.pointer("/status/phase").and_then(Value::as_str),
        Some("Succeeded" | "Failed")
    ) {
        return false;
    }
    let deleted = pod
        .pointer("/metadata/deletionTimestamp")
        .and_then(Value::as_str)
        .and_then(|t| t.parse::<Timestamp>().ok());
    let grace = pod
        .pointer("/metadata/deletionGracePeriodSeconds")
        .and_then(Value::as_i64);
    if let (Some(deleted), Some(grace)) = (deleted, grace)
        && let Ok(end) = deleted.checked_add(jiff::SignedDuration::from_secs(grace))
        && now > end
    {
        return false;
    }
    true
}

/// The pod's effective requests (upstream's `PodRequests`): the sum of its containers'
/// (sidecars included), or the largest init container's when larger, plus the overhead.
pub fn pod_requests(pod: &Value) -> ResourceList {
    pod_sum(pod, "requests")
}

/// The pod's effective limits, as [`pod_requests`].
pub fn pod_limits(pod: &Value) -> ResourceList {
    pod_sum(pod, "limits")
}

fn pod_sum(pod: &Value, which: &str) -> ResourceList {
    let of = |c: &Value| list_from(c.pointer(&format!("/resources/{which}")));
    let mut sum = ResourceList::new();
    for c in containers(pod, "containers") {
        sum = add(&sum, &of(c));
    }
    // Restartable init containers (sidecars) run beside the app containers; each regular init
    // container runs alone, after the sidecars declared before it.
    let mut sidecars = ResourceList::new();
    let mut init_max = ResourceList::new();
    for c in containers(pod, "initContainers") {
        let res = of(c);
        if c.get("restartPolicy").and_then(Value::as_str) == Some("Always") {
            sidecars = add(&sidecars, &res);
            init_max = max(&init_max, &sidecars);
        } else {
            init_max = max(&init_max, &add(&res, &sidecars));
        }
    }
    sum = add(&sum, &sidecars);
    sum = max(&sum, &init_max);
    if let Some(overhead) = pod.pointer("/spec/overhead") {
        sum = add(&sum, &list_from(Some(overhead)));
    }
    sum
}

fn max(a: &ResourceList, b: &ResourceList) -> ResourceList {
    let mut out = a.clone();
    for (k, v) in b {
        match out.get(k) {
            Some(q) if q >= v => {}
            _ => {
                out.insert(k.clone(), *v);
            }
        }
    }
    out
}

/// Upstream's `podComputeUsageHelper`.
fn pod_compute_usage(requests: &ResourceList, limits: &ResourceList) -> ResourceList {
    let mut out = ResourceList::new();
    out.insert("pods".into(), one());
    for r in ["cpu", "memory", "ephemeral-storage"] {
        if let Some(q) = requests.get(r) {
            out.insert(r.to_string(), *q);
            out.insert(format!("requests.{r}"), *q);
        }
        if let Some(q) = limits.get(r) {
            out.insert(format!("limits.{r}"), *q);
        }
    }
    for (r, q) in requests {
        if r.starts_with("hugepages-") {
            out.insert(r.clone(), *q);
            out.insert(format!("requests.{r}"), *q);
        }
        if is_extended_resource_name(r) {
            out.insert(format!("requests.{r}"), *q);
        }
    }
    out
}

fn is_terminating(pod: &Value) -> bool {
    pod.pointer("/spec/activeDeadlineSeconds")
        .and_then(Value::as_i64)
        .is_some_and(|s| s >= 0)
}

/// Upstream's `GetPodQOS` == BestEffort: no container requests or limits cpu or memory.
pub fn is_best_effort(pod: &Value) -> bool {
    let all = containers(pod, "containers").chain(containers(pod, "initContainers"));
    for c in all {
        for which in ["requests", "limits"] {
            let l = list_from(c.pointer(&format!("/resources/{which}")));
            if ["cpu", "memory"]
                .iter()
                .any(|r| l.get(*r).is_some_and(|q| q > &Quantity::default()))
            {
                return false;
            }
        }
    }
    true
}

fn uses_cross_namespace_affinity(pod: &Value) -> bool {
    ["podAffinity", "podAntiAffinity"].iter().any(|kind| {
        let Some(a) = pod.pointer(&format!("/spec/affinity/{kind}")) else {
            return false;
        };
        let terms = a
            .get("requiredDuringSchedulingIgnoredDuringExecution")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .chain(
                a.get("preferredDuringSchedulingIgnoredDuringExecution")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|w| w.get("podAffinityTerm")),
            );
        terms.into_iter().any(|t| {
            t.get("namespaceSelector").is_some()
                || t.get("namespaces")
                    .and_then(Value::as_array)
                    .is_some_and(|n| !n.is_empty())
        })
    })
}

/// A claim's storage: its request, or what the node already allocated when larger (a resize
/// that failed is charged for what is held).
fn claim_storage(pvc: &Value) -> Option<Quantity> {
    let request = pvc
        .pointer("/spec/resources/requests/storage")
        .and_then(|v| Quantity::from_json(v).ok());
    let allocated = pvc
        .pointer("/status/allocatedResources/storage")
        .and_then(|v| Quantity::from_json(v).ok());
    match (request, allocated) {
        (Some(r), Some(a)) if a > r => Some(a),
        (r, _) => r,
    }
}

/// A request refused by a quota: the message upstream wraps in `NewForbidden`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused(pub String);

/// Upstream's `CheckRequest`: whether `obj` (with `old` on an update) fits every quota in
/// `quotas` that tracks it; `Ok` holds the quotas' new `status.used` (by index) to persist,
/// only for the quotas whose usage changes.
pub fn check_request(
    quotas: &[Value],
    evaluator: &Evaluator,
    op: Operation,
    obj: &Value,
    old: Option<&Value>,
    now: Timestamp,
) -> Result<Vec<(usize, ResourceList)>, Refused> {
    if !evaluator.handles(op) {
        return Ok(Vec::new());
    }
    let mut interesting = Vec::new();
    for (i, q) in quotas.iter().enumerate() {
        if !evaluator.matches(q, obj) {
            continue;
        }
        let name = q.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
        let hard = list_from(q.pointer("/status/hard"));
        let restricted = evaluator.matching_resources(hard.keys());
        evaluator
            .constraints(&restricted, obj)
            .map_err(|e| Refused(format!("failed quota: {name}: {e}")))?;
        let used = list_from(q.pointer("/status/used"));
        let mut missing: Vec<&String> = restricted.iter().filter(|r| !used.contains_key(*r)).collect();
        if !missing.is_empty() {
            missing.sort();
            return Err(Refused(format!(
                "status unknown for quota: {name}, resources: {}",
                missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(",")
            )));
        }
        interesting.push(i);
    }
    let mut delta = evaluator.usage(obj, now);
    let negative: Vec<&str> = delta
        .iter()
        .filter(|(_, v)| v.is_negative())
        .map(|(k, _)| k.as_str())
        .collect();
    if !negative.is_empty() {
        return Err(Refused(format!(
            "quota usage is negative for resource(s): {}",
            negative.join(",")
        )));
    }
    if op == Operation::Update
        && let Some(old) = old
    {
        delta = subtract_non_negative(&delta, &evaluator.usage(old, now));
    }
    delta.retain(|_, v| !v.is_zero());
    if delta.is_empty() || interesting.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for i in interesting {
        let q = &quotas[i];
        let name = q.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
        let hard = list_from(q.pointer("/status/hard"));
        let used = list_from(q.pointer("/status/used"));
        let requested = mask(&delta, hard.keys());
        let new_usage = add(&used, &requested);
        let masked = mask(&new_usage, requested.keys());
        let (ok, exceeded) = less_than_or_equal(&masked, &hard);
        if !ok {
            return Err(Refused(format!(
                "exceeded quota: {name}, requested: {}, used: {}, limited: {}",
                pretty_print(&mask(&requested, exceeded.iter())),
                pretty_print(&mask(&used, exceeded.iter())),
                pretty_print(&mask(&hard, exceeded.iter())),
            )));
        }
        if !equals(&new_usage, &used) {
            out.push((i, new_usage));
        }
    }
    Ok(out)
}

/// Upstream's `CalculateUsage` for one quota: what `objects` (every live object of the
/// evaluator's resource in the quota's namespace) use of the quota's `hard` resources, zero
/// for the ones nothing uses. `None` when the evaluator tracks none of them.
pub fn calculate_usage<'a>(
    quota: &Value,
    hard: &ResourceList,
    evaluator: &Evaluator,
    objects: impl IntoIterator<Item = &'a Value>,
    now: Timestamp,
) -> Option<ResourceList> {
    let matched = evaluator.matching_resources(hard.keys());
    if matched.is_empty() {
        return None;
    }
    let scopes = scope_requirements(quota);
    let mut used: ResourceList = matched.iter().map(|r| (r.clone(), Quantity::default())).collect();
    for obj in objects {
        if !scopes.iter().all(|s| evaluator.matches_scope(s, obj)) {
            continue;
        }
        used = add(&used, &mask(&evaluator.usage(obj, now), matched.iter()));
    }
    Some(used)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    fn quota(hard: Value, used: Value) -> Value {
        json!({"metadata": {"name": "mem-cpu-demo"}, "spec": {"hard": hard}, "status": {"hard": hard, "used": used}})
    }

    fn pod(name: &str, requests: Value, limits: Value) -> Value {
        json!({"metadata": {"name": name}, "spec": {"containers": [
            {"name": "app", "resources": {"requests": requests, "limits": limits}}
        ]}})
    }

    #[test]
    fn exceeding_a_quota_names_what_was_requested_used_and_limited() {
        let pods = Evaluator::new("", "pods");
        let quotas = [quota(
            json!({"limits.memory": "1Gi", "pods": "2"}),
            json!({"limits.memory": "800Mi", "pods": "1"}),
        )];
        let p = pod("p", json!({"memory": "100Mi"}), json!({"memory": "300Mi"}));
        let err = check_request(&quotas, &pods, Operation::Create, &p, None, Timestamp::now()).unwrap_err();
        assert_eq!(
            err.0,
            "exceeded quota: mem-cpu-demo, requested: limits.memory=300Mi, used: limits.memory=800Mi, limited: limits.memory=1Gi"
        );
        let p = pod("p", json!({"memory": "100Mi"}), json!({"memory": "200Mi"}));
        let ok = check_request(&quotas, &pods, Operation::Create, &p, None, Timestamp::now()).unwrap();
        assert_eq!(ok.len(), 1);
        assert_eq!(ok[0].1["limits.memory"], q("1000Mi"));
        assert_eq!(ok[0].1["pods"], q("2"));
    }

    #[test]
    fn quota_on_compute_needs_every_container_to_name_it() {
        let pods = Evaluator::new("", "pods");
        let quotas = [quota(
            json!({"limits.cpu": "2", "requests.memory": "1Gi"}),
            json!({"limits.cpu": "0", "requests.memory": "0"}),
        )];
        let p = json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "a", "resources": {"limits": {"cpu": "1"}}},
            {"name": "b", "resources": {}},
        ]}});
        let err = check_request(&quotas, &pods, Operation::Create, &p, None, Timestamp::now()).unwrap_err();
        assert_eq!(
            err.0,
            "failed quota: mem-cpu-demo: must specify limits.cpu for: b; must specify requests.memory for: a,b"
        );
    }

    #[test]
    fn a_quota_without_status_does_not_match_and_one_without_usage_refuses() {
        let pods = Evaluator::new("", "pods");
        let fresh = json!({"metadata": {"name": "q"}, "spec": {"hard": {"pods": "1"}}});
        let p = pod("p", json!({}), json!({}));
        assert_eq!(
            check_request(&[fresh], &pods, Operation::Create, &p, None, Timestamp::now()),
            Ok(vec![])
        );
        let half = json!({"metadata": {"name": "q"}, "status": {"hard": {"pods": "1", "count/pods": "3"}, "used": {"pods": "0"}}});
        let err = check_request(&[half], &pods, Operation::Create, &p, None, Timestamp::now()).unwrap_err();
        assert_eq!(err.0, "status unknown for quota: q, resources: count/pods");
    }

    #[test]
    fn scopes_select_pods() {
        let pods = Evaluator::new("", "pods");
        let best_effort = json!({"metadata": {"name": "q"}, "spec": {"scopes": ["BestEffort"]},
            "status": {"hard": {"pods": "1"}, "used": {"pods": "1"}}});
        let guaranteed = pod("p", json!({"cpu": "1"}), json!({"cpu": "1"}));
        assert_eq!(
            check_request(
                std::slice::from_ref(&best_effort),
                &pods,
                Operation::Create,
                &guaranteed,
                None,
                Timestamp::now()
            ),
            Ok(vec![])
        );
        let be = pod("p", json!({}), json!({}));
        assert!(check_request(&[best_effort], &pods, Operation::Create, &be, None, Timestamp::now()).is_err());
        let by_class = json!({"metadata": {"name": "q"}, "spec": {"scopeSelector": {"matchExpressions": [
            {"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]}},
            "status": {"hard": {"pods": "0"}, "used": {"pods": "0"}}});
        let mut high = be.clone();
        high["spec"]["priorityClassName"] = json!("high");
        assert!(
            check_request(
                std::slice::from_ref(&by_class),
                &pods,
                Operation::Create,
                &high,
                None,
                Timestamp::now()
            )
            .is_err()
        );
        assert_eq!(
            check_request(&[by_class], &pods, Operation::Create, &be, None, Timestamp::now()),
            Ok(vec![])
        );
    }

    #[test]
    fn services_claims_and_counts() {
        let svc = Evaluator::new("", "services");
        let lb = json!({"spec": {"type": "LoadBalancer", "ports": [{"port": 80}, {"port": 443}]}});
        let u = svc.usage(&lb, Timestamp::now());
        assert_eq!(u["services.loadbalancers"], q("1"));
        assert_eq!(u["services.nodeports"], q("2"));
        assert_eq!(u["count/services"], q("1"));
        let pvc = Evaluator::new("", "persistentvolumeclaims");
        let claim = json!({"spec": {"storageClassName": "gold", "resources": {"requests": {"storage": "5Gi"}}}});
        let u = pvc.usage(&claim, Timestamp::now());
        assert_eq!(u["requests.storage"], q("5Gi"));
        assert_eq!(u["gold.storageclass.storage.k8s.io/requests.storage"], q("5Gi"));
        assert_eq!(u["gold.storageclass.storage.k8s.io/persistentvolumeclaims"], q("1"));
        // A resize is charged the growth only.
        let quotas = [quota(
            json!({"requests.storage": "8Gi"}),
            json!({"requests.storage": "5Gi"}),
        )];
        let grown = json!({"spec": {"storageClassName": "gold", "resources": {"requests": {"storage": "9Gi"}}}});
        let err = check_request(&quotas, &pvc, Operation::Update, &grown, Some(&claim), Timestamp::now()).unwrap_err();
        assert_eq!(
            err.0,
            "exceeded quota: mem-cpu-demo, requested: requests.storage=4Gi, used: requests.storage=5Gi, limited: requests.storage=8Gi"
        );
        let deploy = Evaluator::new("apps", "deployments");
        assert!(deploy.matches_resource("count/deployments.apps"));
        assert!(!deploy.matches_resource("pods"));
        let cm = Evaluator::new("", "configmaps");
        let u = cm.usage(&json!({}), Timestamp::now());
        assert_eq!(u.keys().collect::<Vec<_>>(), ["configmaps", "count/configmaps"]);
    }

    #[test]
    fn terminal_pods_use_no_compute() {
        let pods = Evaluator::new("", "pods");
        let mut p = pod("p", json!({"cpu": "1"}), json!({}));
        p["status"] = json!({"phase": "Succeeded"});
        let u = pods.usage(&p, Timestamp::now());
        assert_eq!(u.keys().collect::<Vec<_>>(), ["count/pods"]);
        let hard: ResourceList = [("pods".to_string(), q("5")), ("requests.cpu".to_string(), q("4"))].into();
        let running = pod("r", json!({"cpu": "500m"}), json!({}));
        let used = calculate_usage(&json!({}), &hard, &pods, [&p, &running], Timestamp::now()).unwrap();
        assert_eq!(pretty_print(&used), "pods=1,requests.cpu=500m");
    }
}
