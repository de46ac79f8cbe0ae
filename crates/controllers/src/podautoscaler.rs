//! The horizontal pod autoscaler (upstream's `pkg/controller/podautoscaler`, kube-controller-
//! manager's `horizontal-pod-autoscaler`). Every sync period (15 s) each HorizontalPodAutoscaler's
//! target is read through its `scale` subresource, its pods' usage through the resource metrics
//! API (`metrics.k8s.io`, which the API server serves from the node agents), and the replica
//! count it recommends is upstream's:
//! - per metric, `ceil(ratio * ready pods)` where the ratio is the pods' mean utilization of
//!   their requests (or mean value) over the target, left alone within a 10% tolerance; pods
//!   being deleted or failed are ignored, pending ones and (for CPU) those not yet ready are
//!   counted as using nothing when scaling up and left out otherwise, and pods without metrics
//!   count as using nothing (scaling up) or all of their request (scaling down)
//!   (`replica_calculator.go`);
//! - the largest over all metrics, then stabilized (the lowest recommendation of the scale-up
//!   window and the highest of the scale-down window, 5 minutes by default), limited by the
//!   behavior's rate policies (by default up to 4 pods or 100% more per 15 s), and bounded by
//!   `minReplicas`/`maxReplicas` (`horizontal.go`).
//!
//! The target is rescaled when the count differs (a `SuccessfulRescale` event), and the status
//! gets the current and desired replicas, the current metrics and upstream's conditions
//! (`AbleToScale`, `ScalingActive`, `ScalingLimited`). Only resource metrics (CPU and memory, of
//! pods or of one container) are served here; a Pods, Object or External metric is reported as
//! unavailable (`FailedGetPodsMetric` and friends), as upstream reports a missing custom metrics API.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::autoscaling::v2::{
    ContainerResourceMetricStatus, HPAScalingRules, HorizontalPodAutoscaler, HorizontalPodAutoscalerCondition,
    HorizontalPodAutoscalerStatus, MetricSpec, MetricStatus, MetricValueStatus, ResourceMetricStatus,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, ListParams, PostParams};
use serde_json::Value;

use skiff_api::selector::LabelSelector;

use crate::controller_utils::Recorder;
use crate::informers::{Informer, SharedInformerFactory};

pub const CONTROLLER_NAME: &str = "horizontal-pod-autoscaler";

/// `--horizontal-pod-autoscaler-tolerance`.
const TOLERANCE: f64 = 0.1;
/// `--horizontal-pod-autoscaler-cpu-initialization-period`.
const CPU_INITIALIZATION_PERIOD: Duration = Duration::from_secs(300);
/// `--horizontal-pod-autoscaler-initial-readiness-delay`.
const INITIAL_READINESS_DELAY: Duration = Duration::from_secs(30);

#[derive(Clone, Debug, PartialEq)]
pub struct PodAutoscalerConfig {
    /// `--horizontal-pod-autoscaler-sync-period` (15 s).
    pub sync_period: Duration,
}

impl Default for PodAutoscalerConfig {
    fn default() -> Self {
        PodAutoscalerConfig {
            sync_period: Duration::from_secs(15),
        }
    }
}

/// What one autoscaler remembers between syncs: its recent recommendations (for the
/// stabilization windows) and its recent rescales (for the rate policies).
#[derive(Default)]
struct Memory {
    recommendations: Vec<(Instant, i32)>,
    /// (when, replicas added (positive) or removed (negative)).
    scale_events: Vec<(Instant, i32)>,
}

pub async fn run(
    client: kube::Client,
    informers: SharedInformerFactory,
    config: PodAutoscalerConfig,
) -> anyhow::Result<()> {
    let recorder = Recorder::for_component(client.clone(), CONTROLLER_NAME);
    // The targets' pods come from the process's shared pod cache, not a list per sync.
    let pods = informers.informer::<Pod>();
    pods.wait_synced().await;
    let mut memory: HashMap<String, Memory> = HashMap::new();
    let mut tick = tokio::time::interval(config.sync_period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let all: Api<HorizontalPodAutoscaler> = Api::all(client.clone());
        let list = match all.list(&ListParams::default()).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "listing HorizontalPodAutoscalers");
                continue;
            }
        };
        let mut live = HashSet::new();
        for hpa in list.items {
            let key = format!(
                "{}/{}",
                hpa.metadata.namespace.as_deref().unwrap_or_default(),
                hpa.metadata.name.as_deref().unwrap_or_default()
            );
            live.insert(key.clone());
            let mem = memory.entry(key.clone()).or_default();
            if let Err(e) = reconcile(&client, &recorder, &pods, hpa, mem).await {
                tracing::warn!(hpa = key, error = format!("{e:#}"), "autoscaling");
            }
        }
        memory.retain(|k, _| live.contains(k));
    }
}

/// Conditions as the sync decides them: (type, status, reason, message).
type Cond = (&'static str, &'static str, &'static str, String);

async fn reconcile(
    client: &kube::Client,
    recorder: &Recorder,
    pod_cache: &Informer<Pod>,
    hpa: HorizontalPodAutoscaler,
    mem: &mut Memory,
) -> anyhow::Result<()> {
    let ns = hpa.metadata.namespace.clone().unwrap_or_default();
    let spec = hpa.spec.clone().unwrap_or_default();
    let target = &spec.scale_target_ref;
    let mut conditions: Vec<Cond> = Vec::new();
    let (group, version) = match target.api_version.as_deref().unwrap_or("").split_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (String::new(), target.api_version.clone().unwrap_or_default()),
    };
    let Some(res) = skiff_api::registry::lookup_kind(&group, &target.kind).filter(|r| r.has_subresource("scale"))
    else {
        let message = format!(
            "the HPA controller was unable to get the target's current scale: no matches for kind \"{}\" in group \"{group}\"",
            target.kind
        );
        recorder.event(&hpa, "Warning", "FailedGetScale", &message);
        conditions.push(("AbleToScale", "False", "FailedGetScale", message));
        return write_status(client, &hpa, None, None, Vec::new(), conditions, None).await;
    };
    let ar = ApiResource {
        group: res.group.to_string(),
        version: if version.is_empty() {
            res.version.to_string()
        } else {
            version
        },
        api_version: res.api_version(),
        kind: res.kind.to_string(),
        plural: res.plural.to_string(),
    };
    let scales: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
    let scale = match scales.get_scale(&target.name).await {
        Ok(s) => s,
        Err(e) => {
            let message = format!("the HPA controller was unable to get the target's current scale: {e}");
            recorder.event(&hpa, "Warning", "FailedGetScale", &message);
            conditions.push(("AbleToScale", "False", "FailedGetScale", message));
            return write_status(client, &hpa, None, None, Vec::new(), conditions, None).await;
        }
    };
    let current = scale.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
    let selector = scale
        .status
        .as_ref()
        .and_then(|s| s.selector.clone())
        .unwrap_or_default();
    conditions.push((
        "AbleToScale",
        "True",
        "SucceededGetScale",
        "the HPA controller was able to get the target's current scale".into(),
    ));
    let min = spec.min_replicas.unwrap_or(1);
    let max = spec.max_replicas;
    let now = Instant::now();
    let mut metric_statuses = Vec::new();
    let (desired, reason) = if current == 0 && min != 0 {
        conditions.push((
            "ScalingActive",
            "False",
            "ScalingDisabled",
            "scaling is disabled since the replica count of the target is zero".into(),
        ));
        (0, String::new())
    } else if current > max {
        (max, "Current number of replicas above Spec.MaxReplicas".to_string())
    } else if current < min {
        (min, "Current number of replicas below Spec.MinReplicas".to_string())
    } else if selector.is_empty() {
        let message = "selector is required".to_string();
        recorder.event(&hpa, "Warning", "SelectorRequired", &message);
        conditions.push((
            "ScalingActive",
            "False",
            "InvalidSelector",
            "the HPA target's scale is missing a selector".into(),
        ));
        return write_status(client, &hpa, Some(current), None, Vec::new(), conditions, None).await;
    } else {
        let Ok(parsed) = LabelSelector::parse(&selector) else {
            conditions.push((
                "ScalingActive",
                "False",
                "InvalidSelector",
                format!("the HPA target's scale has an invalid selector {selector:?}"),
            ));
            return write_status(client, &hpa, Some(current), None, Vec::new(), conditions, None).await;
        };
        let pods: Vec<Arc<Pod>> = pod_cache
            .list_namespace(&ns)
            .into_iter()
            .filter(|p| parsed.matches(&p.metadata.labels))
            .collect();
        let usage = pod_usage(client, &ns, &selector).await;
        let mut proposal: Option<(i32, String)> = None;
        let mut first_error: Option<(&'static str, String)> = None;
        for m in spec.metrics.iter().flatten() {
            match metric_replicas(m, current, &pods, usage.as_ref()) {
                Ok((replicas, status, name)) => {
                    metric_statuses.push(status);
                    if proposal.as_ref().is_none_or(|(r, _)| replicas > *r) {
                        proposal = Some((replicas, name));
                    }
                }
                Err((reason, message)) => {
                    recorder.event(&hpa, "Warning", reason, &message);
                    first_error.get_or_insert((reason, message));
                }
            }
        }
        match proposal {
            Some((replicas, name)) => {
                conditions.push((
                    "ScalingActive",
                    "True",
                    "ValidMetricFound",
                    format!("the HPA was able to successfully calculate a replica count from {name}"),
                ));
                let reason = if replicas > current {
                    format!("{name} above target")
                } else {
                    "All metrics below target".to_string()
                };
                let (bounded, limited) = normalize(replicas, current, min, max, spec.behavior.as_ref(), mem, now);
                conditions.push(limited);
                (bounded, reason)
            }
            None => {
                let (reason, message) = first_error.unwrap_or(("FailedGetResourceMetric", "no metrics".into()));
                conditions.push(("ScalingActive", "False", reason, message));
                return write_status(
                    client,
                    &hpa,
                    Some(current),
                    Some(current),
                    metric_statuses,
                    conditions,
                    None,
                )
                .await;
            }
        }
    };
    let mut last_scale = None;
    if desired != current {
        let mut s = scale.clone();
        if let Some(spec) = s.spec.as_mut() {
            spec.replicas = Some(desired);
        }
        match scales.replace_scale(&target.name, &PostParams::default(), &s).await {
            Ok(_) => {
                let message = format!("New size: {desired}; reason: {reason}");
                recorder.event(&hpa, "Normal", "SuccessfulRescale", &message);
                mem.scale_events.push((now, desired - current));
                conditions[0] = (
                    "AbleToScale",
                    "True",
                    "SucceededRescale",
                    format!("the HPA controller was able to update the target scale to {desired}"),
                );
                last_scale = Some(Time(jiff::Timestamp::now()));
            }
            Err(e) => {
                let message = format!("New size: {desired}; reason: {reason}; error: {e}");
                recorder.event(&hpa, "Warning", "FailedRescale", &message);
                conditions[0] = (
                    "AbleToScale",
                    "False",
                    "FailedUpdateScale",
                    format!("the HPA controller was unable to update the target scale: {e}"),
                );
            }
        }
    } else if conditions[0].2 == "SucceededGetScale" {
        conditions[0] = (
            "AbleToScale",
            "True",
            "ReadyForNewScale",
            "recommended size matches current size".into(),
        );
    }
    write_status(
        client,
        &hpa,
        Some(current),
        Some(desired),
        metric_statuses,
        conditions,
        last_scale,
    )
    .await
}

/// Each pod's usage by name: container name -> (cpu millicores, memory bytes), with the time
/// the sample was taken. `None` when the resource metrics API does not answer.
type Usage = HashMap<String, (Option<jiff::Timestamp>, HashMap<String, (i64, i64)>)>;

async fn pod_usage(client: &kube::Client, ns: &str, selector: &str) -> Option<Usage> {
    let ar = ApiResource {
        group: "metrics.k8s.io".into(),
        version: "v1beta1".into(),
        api_version: "metrics.k8s.io/v1beta1".into(),
        kind: "PodMetrics".into(),
        plural: "pods".into(),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
    let list = match api.list(&ListParams::default().labels(selector)).await {
        Ok(l) => l,
        Err(e) => {
            tracing::debug!(error = %e, "resource metrics");
            return None;
        }
    };
    let mut out = Usage::new();
    for m in list.items {
        let Some(name) = m.metadata.name.clone() else { continue };
        let when = m
            .data
            .get("timestamp")
            .and_then(Value::as_str)
            .and_then(|t| t.parse().ok());
        let mut containers = HashMap::new();
        for c in m.data.get("containers").and_then(Value::as_array).into_iter().flatten() {
            let cname = c.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
            let q = |r: &str| {
                c.pointer(&format!("/usage/{r}"))
                    .and_then(Value::as_str)
                    .and_then(|s| skiff_api::quantity::Quantity::parse(s).ok())
            };
            let cpu = q("cpu").map_or(0, |q| q.milli_value());
            let memory = q("memory").map_or(0, |q| q.value());
            containers.insert(cname, (cpu, memory));
        }
        out.insert(name, (when, containers));
    }
    Some(out)
}

/// The replicas one metric asks for, its status, and how upstream names it in messages.
fn metric_replicas(
    m: &MetricSpec,
    current: i32,
    pods: &[Arc<Pod>],
    usage: Option<&Usage>,
) -> Result<(i32, MetricStatus, String), (&'static str, String)> {
    let (resource, container, target) = match m.type_.as_str() {
        "Resource" => {
            let Some(r) = &m.resource else {
                return Err(("FailedGetResourceMetric", "missing resource metric source".into()));
            };
            (r.name.clone(), None, &r.target)
        }
        "ContainerResource" => {
            let Some(r) = &m.container_resource else {
                return Err((
                    "FailedGetContainerResourceMetric",
                    "missing container resource metric source".into(),
                ));
            };
            (r.name.clone(), Some(r.container.clone()), &r.target)
        }
        "Pods" => {
            return Err((
                "FailedGetPodsMetric",
                "unable to get metric: the custom metrics API (custom.metrics.k8s.io) is not served".into(),
            ));
        }
        "Object" => {
            return Err((
                "FailedGetObjectMetric",
                "unable to get metric: the custom metrics API (custom.metrics.k8s.io) is not served".into(),
            ));
        }
        "External" => {
            return Err((
                "FailedGetExternalMetric",
                "unable to get external metric: the external metrics API (external.metrics.k8s.io) is not served"
                    .into(),
            ));
        }
        other => {
            return Err((
                "InvalidMetricSourceType",
                format!("unknown metric source type {other:?}"),
            ));
        }
    };
    let failed = if container.is_some() {
        "FailedGetContainerResourceMetric"
    } else {
        "FailedGetResourceMetric"
    };
    let Some(usage) = usage.filter(|u| !u.is_empty()) else {
        return Err((
            failed,
            format!(
                "failed to get {resource} utilization: unable to get metrics for resource {resource}: no metrics returned from resource metrics API"
            ),
        ));
    };
    let input = pod_samples(pods, usage, &resource, container.as_deref());
    let name = match &container {
        Some(c) => format!("{resource} container resource utilization (percentage of request) of container {c}"),
        None => format!("{resource} resource utilization (percentage of request)"),
    };
    let utilization_target = target.average_utilization;
    let (replicas, utilization, average) = match utilization_target {
        Some(t) => {
            let r = resource_replicas(current, &input, t, &resource, container.as_deref())
                .map_err(|e| (failed, format!("failed to get {resource} utilization: {e}")))?;
            (r.0, Some(r.1), r.2)
        }
        None => {
            let target_value = target
                .average_value
                .as_ref()
                .and_then(|q| skiff_api::quantity::Quantity::parse(&q.0).ok())
                .map(|q| if resource == "cpu" { q.milli_value() } else { q.value() })
                .ok_or_else(|| (failed, format!("invalid metric target for {resource}")))?;
            let r = raw_replicas(current, &input, target_value)
                .map_err(|e| (failed, format!("failed to get {resource} usage: {e}")))?;
            (r.0, None, r.1)
        }
    };
    let avg_quantity = if resource == "cpu" {
        Quantity(format!("{average}m"))
    } else {
        Quantity(average.to_string())
    };
    let current_value = MetricValueStatus {
        average_utilization: utilization,
        average_value: Some(avg_quantity),
        value: None,
    };
    let status = match container {
        Some(c) => MetricStatus {
            type_: "ContainerResource".into(),
            container_resource: Some(ContainerResourceMetricStatus {
                name: resource,
                container: c,
                current: current_value,
            }),
            ..Default::default()
        },
        None => MetricStatus {
            type_: "Resource".into(),
            resource: Some(ResourceMetricStatus {
                name: resource,
                current: current_value,
            }),
            ..Default::default()
        },
    };
    let display = match utilization_target {
        Some(_) => name,
        None => name.replace(" utilization (percentage of request)", ""),
    };
    Ok((replicas, status, display))
}

/// One pod as the replica calculator sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct PodSample {
    pub name: String,
    pub state: PodState,
    /// The usage of the resource (millicores for CPU, bytes otherwise), if metrics have it.
    pub usage: Option<i64>,
    /// The sum of the containers' requests of the resource, if every container has one.
    pub request: Result<i64, String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodState {
    Ready,
    /// Pending, or (for CPU) not ready yet within its initialization period.
    Unready,
    /// Being deleted or failed.
    Ignored,
}

fn pod_samples(pods: &[Arc<Pod>], usage: &Usage, resource: &str, container: Option<&str>) -> Vec<PodSample> {
    let now = jiff::Timestamp::now();
    pods.iter()
        .map(|pod| {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let status = pod.status.as_ref();
            let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
            let sample = usage.get(&name);
            let used = sample.map(|(_, containers)| {
                containers
                    .iter()
                    .filter(|(c, _)| container.is_none_or(|want| want == c.as_str()))
                    .map(|(_, (cpu, mem))| if resource == "cpu" { *cpu } else { *mem })
                    .sum::<i64>()
            });
            let state = if pod.metadata.deletion_timestamp.is_some() || phase == "Failed" {
                PodState::Ignored
            } else if phase == "Pending" {
                PodState::Unready
            } else if resource == "cpu" && sample.is_some() {
                let ready = status
                    .and_then(|s| s.conditions.as_ref())
                    .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
                let start = status.and_then(|s| s.start_time.as_ref()).map(|t| t.0);
                let unready = match (ready, start) {
                    (Some(cond), Some(start)) => {
                        let transition = cond.last_transition_time.as_ref().map(|t| t.0).unwrap_or(start);
                        let initializing =
                            start + jiff::SignedDuration::try_from(CPU_INITIALIZATION_PERIOD).unwrap_or_default() > now;
                        if initializing {
                            let window = jiff::SignedDuration::from_secs(10);
                            let sampled = sample.and_then(|(t, _)| *t).unwrap_or(now);
                            cond.status == "False" || sampled < transition + window
                        } else {
                            let delay = jiff::SignedDuration::try_from(INITIAL_READINESS_DELAY).unwrap_or_default();
                            cond.status == "False" && start + delay > transition
                        }
                    }
                    _ => true,
                };
                if unready { PodState::Unready } else { PodState::Ready }
            } else {
                PodState::Ready
            };
            PodSample {
                name,
                state,
                usage: used,
                request: requests(pod, resource, container),
            }
        })
        .collect()
}

/// The sum of the pod's containers' requests of `resource` (milli-units for CPU).
fn requests(pod: &Pod, resource: &str, container: Option<&str>) -> Result<i64, String> {
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    let mut total = 0;
    for c in pod.spec.iter().flat_map(|s| s.containers.iter()) {
        if container.is_some_and(|want| want != c.name) {
            continue;
        }
        let q = c
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get(resource))
            .and_then(|q| skiff_api::quantity::Quantity::parse(&q.0).ok())
            .ok_or_else(|| {
                format!(
                    "missing request for {resource} in container {} of Pod {pod_name}",
                    c.name
                )
            })?;
        total += if resource == "cpu" { q.milli_value() } else { q.value() };
    }
    Ok(total)
}

/// Upstream's `GetResourceReplicas`: (replicas, utilization %, mean usage).
pub fn resource_replicas(
    current: i32,
    pods: &[PodSample],
    target_utilization: i32,
    resource: &str,
    container: Option<&str>,
) -> Result<(i32, i32, i64), String> {
    if pods.is_empty() {
        return Err("no pods returned by selector while calculating replica count".into());
    }
    let mut metrics: HashMap<&str, i64> = HashMap::new();
    let mut ready = 0usize;
    let mut unready: Vec<&PodSample> = Vec::new();
    let mut missing: Vec<&PodSample> = Vec::new();
    for p in pods {
        match (p.state, p.usage) {
            (PodState::Ignored, _) => {}
            (PodState::Unready, _) => unready.push(p),
            (PodState::Ready, None) => missing.push(p),
            (PodState::Ready, Some(u)) => {
                ready += 1;
                metrics.insert(&p.name, u);
            }
        }
    }
    if metrics.is_empty() {
        return Err(format!(
            "did not receive metrics for targeted pods (pods might be unready){}",
            container.map(|c| format!(" for container {c}")).unwrap_or_default()
        ));
    }
    let mut requests: HashMap<&str, i64> = HashMap::new();
    for p in pods {
        match &p.request {
            Ok(r) => {
                requests.insert(&p.name, *r);
            }
            Err(e) if p.state != PodState::Ignored => return Err(e.clone()),
            Err(_) => {}
        }
    }
    let ratio_of = |metrics: &HashMap<&str, i64>| -> Result<(f64, i32, i64), String> {
        let (mut used, mut requested, mut n) = (0i64, 0i64, 0i64);
        for (name, u) in metrics {
            if let Some(r) = requests.get(name) {
                used += u;
                requested += r;
                n += 1;
            }
        }
        if requested == 0 {
            return Err(format!("no metrics returned matched known pods for {resource}"));
        }
        let utilization = (used * 100 / requested) as i32;
        Ok((
            f64::from(utilization) / f64::from(target_utilization),
            utilization,
            used / n.max(1),
        ))
    };
    let (ratio, utilization, average) = ratio_of(&metrics)?;
    let scale_up_with_unready = !unready.is_empty() && ratio > 1.0;
    if !scale_up_with_unready && missing.is_empty() {
        if (1.0 - ratio).abs() <= TOLERANCE {
            return Ok((current, utilization, average));
        }
        return Ok(((ratio * ready as f64).ceil() as i32, utilization, average));
    }
    if !missing.is_empty() {
        if ratio < 1.0 {
            let fallback = i64::from(target_utilization.max(100));
            for p in &missing {
                metrics.insert(
                    &p.name,
                    requests.get(p.name.as_str()).copied().unwrap_or(0) * fallback / 100,
                );
            }
        } else if ratio > 1.0 {
            for p in &missing {
                metrics.insert(&p.name, 0);
            }
        }
    }
    if scale_up_with_unready {
        for p in &unready {
            metrics.insert(&p.name, 0);
        }
    }
    let (new_ratio, _, _) = ratio_of(&metrics)?;
    if (1.0 - new_ratio).abs() <= TOLERANCE || (ratio < 1.0 && new_ratio > 1.0) || (ratio > 1.0 && new_ratio < 1.0) {
        return Ok((current, utilization, average));
    }
    let replicas = (new_ratio * metrics.len() as f64).ceil() as i32;
    if (new_ratio < 1.0 && replicas > current) || (new_ratio > 1.0 && replicas < current) {
        return Ok((current, utilization, average));
    }
    Ok((replicas, utilization, average))
}

/// Upstream's `GetRawResourceReplicas` (an AverageValue target): (replicas, mean usage).
pub fn raw_replicas(current: i32, pods: &[PodSample], target: i64) -> Result<(i32, i64), String> {
    let used: Vec<i64> = pods
        .iter()
        .filter(|p| p.state == PodState::Ready)
        .filter_map(|p| p.usage)
        .collect();
    if used.is_empty() || target <= 0 {
        return Err("did not receive metrics for targeted pods (pods might be unready)".into());
    }
    let total: i64 = used.iter().sum();
    let ratio = total as f64 / (target as f64 * used.len() as f64);
    let average = total / used.len() as i64;
    if (1.0 - ratio).abs() <= TOLERANCE {
        return Ok((current, average));
    }
    Ok(((ratio * used.len() as f64).ceil() as i32, average))
}

fn default_rules(up: bool) -> HPAScalingRules {
    use k8s_openapi::api::autoscaling::v2::HPAScalingPolicy;
    let policy = |type_: &str, value: i32| HPAScalingPolicy {
        type_: type_.into(),
        value,
        period_seconds: 15,
    };
    if up {
        HPAScalingRules {
            stabilization_window_seconds: Some(0),
            select_policy: Some("Max".into()),
            policies: Some(vec![policy("Pods", 4), policy("Percent", 100)]),
            ..Default::default()
        }
    } else {
        HPAScalingRules {
            stabilization_window_seconds: Some(300),
            select_policy: Some("Max".into()),
            policies: Some(vec![policy("Percent", 100)]),
            ..Default::default()
        }
    }
}

/// Upstream's `normalizeDesiredReplicasWithBehaviors`: stabilized, rate-limited and bounded,
/// with the `ScalingLimited` condition saying which (if any) applied.
fn normalize(
    desired: i32,
    current: i32,
    min: i32,
    max: i32,
    behavior: Option<&k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscalerBehavior>,
    mem: &mut Memory,
    now: Instant,
) -> (i32, Cond) {
    let up = behavior
        .and_then(|b| b.scale_up.clone())
        .unwrap_or_else(|| default_rules(true));
    let down = behavior
        .and_then(|b| b.scale_down.clone())
        .unwrap_or_else(|| default_rules(false));
    let window = |r: &HPAScalingRules| Duration::from_secs(r.stabilization_window_seconds.unwrap_or(0).max(0) as u64);
    // Stabilization.
    let (mut up_rec, mut down_rec) = (desired, desired);
    for (at, replicas) in &mem.recommendations {
        let age = now.saturating_duration_since(*at);
        if age < window(&up) {
            up_rec = up_rec.min(*replicas);
        }
        if age < window(&down) {
            down_rec = down_rec.max(*replicas);
        }
    }
    let longest = window(&up).max(window(&down));
    mem.recommendations
        .retain(|(at, _)| now.saturating_duration_since(*at) < longest);
    mem.recommendations.push((now, desired));
    let mut stabilized = current;
    if stabilized < up_rec {
        stabilized = up_rec;
    }
    if stabilized > down_rec {
        stabilized = down_rec;
    }
    let mut limited: Cond = (
        "ScalingLimited",
        "False",
        "DesiredWithinRange",
        "the desired count is within the acceptable range".into(),
    );
    if stabilized != desired {
        limited = (
            "ScalingLimited",
            "True",
            "ScaleDownStabilized",
            "recent recommendations were higher than current one, applying the highest recent recommendation".into(),
        );
        if stabilized < desired {
            limited.2 = "ScaleUpStabilized";
            limited.3 =
                "recent recommendations were lower than current one, applying the lowest recent recommendation".into();
        }
    }
    // Rates.
    let longest_period = [&up, &down]
        .iter()
        .flat_map(|r| r.policies.iter().flatten())
        .map(|p| p.period_seconds.max(0) as u64)
        .max()
        .unwrap_or(0);
    mem.scale_events
        .retain(|(at, _)| now.saturating_duration_since(*at) < Duration::from_secs(longest_period));
    let changed_in = |period: i32, sign: i32| -> i32 {
        mem.scale_events
            .iter()
            .filter(|(at, delta)| {
                now.saturating_duration_since(*at) < Duration::from_secs(period.max(0) as u64) && delta.signum() == sign
            })
            .map(|(_, d)| d.abs())
            .sum()
    };
    let mut result = stabilized;
    if stabilized > current {
        let limits: Vec<i32> = up
            .policies
            .iter()
            .flatten()
            .map(|p| {
                let start = current - changed_in(p.period_seconds, 1);
                match p.type_.as_str() {
                    "Pods" => start + p.value,
                    _ => (f64::from(start) * (1.0 + f64::from(p.value) / 100.0)).ceil() as i32,
                }
            })
            .collect();
        let limit = match up.select_policy.as_deref() {
            Some("Disabled") => current,
            Some("Min") => limits.iter().copied().min().unwrap_or(current),
            _ => limits.iter().copied().max().unwrap_or(current),
        };
        if result > limit {
            result = limit;
            limited = (
                "ScalingLimited",
                "True",
                "ScaleUpLimit",
                "the desired replica count is increasing faster than the maximum scale rate".into(),
            );
        }
    } else if stabilized < current {
        let limits: Vec<i32> = down
            .policies
            .iter()
            .flatten()
            .map(|p| {
                let start = current + changed_in(p.period_seconds, -1);
                match p.type_.as_str() {
                    "Pods" => start - p.value,
                    _ => (f64::from(start) * (1.0 - f64::from(p.value) / 100.0)) as i32,
                }
            })
            .collect();
        let limit = match down.select_policy.as_deref() {
            Some("Disabled") => current,
            Some("Min") => limits.iter().copied().max().unwrap_or(current),
            _ => limits.iter().copied().min().unwrap_or(current),
        };
        if result < limit {
            result = limit;
            limited = (
                "ScalingLimited",
                "True",
                "ScaleDownLimit",
                "the desired replica count is decreasing faster than the maximum scale rate".into(),
            );
        }
    }
    if result > max {
        result = max;
        limited = (
            "ScalingLimited",
            "True",
            "TooManyReplicas",
            "the desired replica count is more than the maximum replica count".into(),
        );
    } else if result < min {
        result = min;
        limited = (
            "ScalingLimited",
            "True",
            "TooFewReplicas",
            "the desired replica count is less than the minimum replica count".into(),
        );
    }
    (result, limited)
}

async fn write_status(
    client: &kube::Client,
    hpa: &HorizontalPodAutoscaler,
    current: Option<i32>,
    desired: Option<i32>,
    metrics: Vec<MetricStatus>,
    conditions: Vec<Cond>,
    last_scale: Option<Time>,
) -> anyhow::Result<()> {
    let ns = hpa.metadata.namespace.clone().unwrap_or_default();
    let name = hpa.metadata.name.clone().unwrap_or_default();
    let old = hpa.status.clone().unwrap_or_default();
    let now = Time(jiff::Timestamp::now());
    let old_conditions = old.conditions.clone().unwrap_or_default();
    let conditions: Vec<HorizontalPodAutoscalerCondition> = conditions
        .into_iter()
        .map(|(type_, status, reason, message)| {
            let previous = old_conditions.iter().find(|c| c.type_ == type_);
            let transition = match previous {
                Some(p) if p.status == status => p.last_transition_time.clone(),
                _ => Some(now.clone()),
            };
            HorizontalPodAutoscalerCondition {
                type_: type_.into(),
                status: status.into(),
                reason: Some(reason.into()),
                message: Some(message),
                last_transition_time: transition,
            }
        })
        .collect();
    let status = HorizontalPodAutoscalerStatus {
        current_replicas: current.or(old.current_replicas),
        desired_replicas: desired.or(current).unwrap_or(old.desired_replicas),
        current_metrics: (!metrics.is_empty()).then_some(metrics),
        conditions: Some(conditions),
        last_scale_time: last_scale.or(old.last_scale_time.clone()),
        observed_generation: hpa.metadata.generation,
    };
    if hpa.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let mut updated = hpa.clone();
    updated.status = Some(status);
    let api: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), &ns);
    api.replace_status(&name, &PostParams::default(), &updated).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, state: PodState, usage: Option<i64>, request: i64) -> PodSample {
        PodSample {
            name: name.into(),
            state,
            usage,
            request: Ok(request),
        }
    }

    #[test]
    fn replicas_follow_the_utilization_ratio() {
        // Two pods at 90% of a 100m request against a 50% target: ceil(1.8 * 2) = 4.
        let pods = [
            pod("a", PodState::Ready, Some(90), 100),
            pod("b", PodState::Ready, Some(90), 100),
        ];
        assert_eq!(resource_replicas(2, &pods, 50, "cpu", None), Ok((4, 90, 90)));
        // Within the 10% tolerance nothing changes.
        let near = [
            pod("a", PodState::Ready, Some(52), 100),
            pod("b", PodState::Ready, Some(52), 100),
        ];
        assert_eq!(resource_replicas(2, &near, 50, "cpu", None).map(|r| r.0), Ok(2));
        // Scaling down: ceil(0.2 * 2) = 1.
        let low = [
            pod("a", PodState::Ready, Some(10), 100),
            pod("b", PodState::Ready, Some(10), 100),
        ];
        assert_eq!(resource_replicas(2, &low, 50, "cpu", None).map(|r| r.0), Ok(1));
    }

    #[test]
    fn missing_and_unready_pods_damp_the_change() {
        // Scaling up, a pod without metrics counts as using nothing: (200 + 0) / 200 = 100% of
        // the request, ratio 2 over 2 pods = 4 (instead of ceil(4 * 1) = 4 from the ready pod
        // alone, or 8 if the missing one were taken to use as much).
        let pods = [
            pod("a", PodState::Ready, Some(200), 100),
            pod("b", PodState::Ready, None, 100),
        ];
        assert_eq!(resource_replicas(2, &pods, 50, "cpu", None).map(|r| r.0), Ok(4));
        let pods = [
            pod("a", PodState::Ready, Some(200), 100),
            pod("b", PodState::Ready, None, 100),
            pod("c", PodState::Ready, None, 100),
        ];
        // Ratio (200 + 0 + 0) / 300 = 67% / 50% over 3 pods: 4, where the ready pod alone says 4
        // of 1 and taking the missing ones as busy would say 12.
        assert_eq!(resource_replicas(3, &pods, 50, "cpu", None).map(|r| r.0), Ok(4));
        // Scaling down, a pod without metrics counts as using all its request: no scale down
        // past what the ready pods alone would ask.
        let down = [
            pod("a", PodState::Ready, Some(10), 100),
            pod("b", PodState::Ready, None, 100),
        ];
        assert_eq!(resource_replicas(2, &down, 50, "cpu", None).map(|r| r.0), Ok(2));
        // An unready pod holds a scale up back when it would cross the target.
        let unready = [
            pod("a", PodState::Ready, Some(60), 100),
            pod("b", PodState::Unready, None, 100),
        ];
        assert_eq!(resource_replicas(2, &unready, 50, "cpu", None).map(|r| r.0), Ok(2));
        // Ignored pods are left out; only ignored ones: no metrics.
        let gone = [pod("a", PodState::Ignored, Some(500), 100)];
        assert!(resource_replicas(1, &gone, 50, "cpu", None).is_err());
    }

    #[test]
    fn a_missing_request_is_upstreams_error() {
        let mut p = pod("a", PodState::Ready, Some(50), 0);
        p.request = Err("missing request for cpu in container app of Pod a".into());
        assert_eq!(
            resource_replicas(1, &[p], 50, "cpu", None),
            Err("missing request for cpu in container app of Pod a".into())
        );
    }

    #[test]
    fn average_value_targets() {
        let pods = [
            pod("a", PodState::Ready, Some(300), 0),
            pod("b", PodState::Ready, Some(100), 0),
        ];
        // Mean 200 against 100: twice the pods.
        assert_eq!(raw_replicas(2, &pods, 100), Ok((4, 200)));
    }

    #[test]
    fn rate_limits_stabilization_and_bounds() {
        let now = Instant::now();
        let mut mem = Memory::default();
        // From 1 to 20: the default scale-up allows max(1 + 4, 1 * 2) = 5.
        let (r, c) = normalize(20, 1, 1, 10, None, &mut mem, now);
        assert_eq!((r, c.2), (5, "ScaleUpLimit"));
        // Bounded by maxReplicas.
        let mut mem = Memory::default();
        let (r, c) = normalize(20, 8, 1, 10, None, &mut mem, now);
        assert_eq!((r, c.2), (10, "TooManyReplicas"));
        // Scaling down is stabilized over 5 minutes: a recommendation of 6 a minute ago holds 6.
        let mut mem = Memory::default();
        mem.recommendations.push((now - Duration::from_secs(60), 6));
        let (r, c) = normalize(2, 6, 1, 10, None, &mut mem, now);
        assert_eq!((r, c.2), (6, "ScaleDownStabilized"));
        // ... and once the window has passed, it goes down.
        let later = now + Duration::from_secs(301);
        let (r, _) = normalize(2, 6, 1, 10, None, &mut mem, later);
        assert_eq!(r, 2);
        // Bounded by minReplicas.
        let mut mem = Memory::default();
        let (r, c) = normalize(1, 3, 2, 10, Some(&Default::default()), &mut mem, now);
        assert_eq!((r, c.2), (2, "TooFewReplicas"));
        let mut mem = Memory::default();
        let (r, c) = normalize(5, 1, 6, 10, None, &mut mem, now);
        assert_eq!((r, c.2), (6, "TooFewReplicas"));
    }
}
