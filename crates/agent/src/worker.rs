//! One pod's worker: brings the pod's containers to what its spec asks (sandbox, volumes, init
//! containers in order, app containers with restart policy and back-off, probes, hooks), reports the
//! status through `pods/NAME/status`, and tears the pod down when it is deleted.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig, PortBinding};
use bollard::query_parameters::{CreateContainerOptionsBuilder, CreateImageOptionsBuilder, LogsOptionsBuilder};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use parking_lot::Mutex;
use tokio::sync::{Notify, watch};

use crate::actions::{
    self, BackoffState, INITIAL_BACKOFF, Key, KillPodReason, MAX_BACKOFF, Observed, PodActions, SandboxChange,
    container_hash, grace_seconds,
};
use crate::cleanup::{self, Grace};
use crate::docker::{self, ContainerRecord, PodRuntime, RunState};
use crate::env::{self, EnvContext, ObjectCache};
use crate::events::{self, NORMAL, Recorder, WARNING, container_field_path};
use crate::images::PAUSE_IMAGE;
use crate::probes::{self, ProbeKind, ProbeState, Target};
use crate::status::{self, ContainerNote, StatusInput};
use crate::volumes::{self, HostVolume};

const DEADLINE_MESSAGE: &str = "Pod was active on the node longer than the specified deadline";
const RESYNC: Duration = Duration::from_secs(1);
/// Pods whose containers all run and are ready (or that finished) are checked now and then; container
/// exits and probe changes wake their worker at once.
const SETTLED_RESYNC: Duration = Duration::from_secs(10);
const VOLUME_REFRESH: Duration = Duration::from_secs(60);

/// The RuntimeClass handler that means the engine's default runtime.
const DEFAULT_RUNTIME_HANDLER: &str = "runc";

/// What every pod worker shares.
pub struct Ctx {
    pub client: kube::Client,
    pub docker: Docker,
    pub node: String,
    /// The cluster's identity (the uid of its `kube-system` Namespace), labelled on every container.
    pub cluster: String,
    pub data_dir: PathBuf,
    pub host_ip: String,
    pub recorder: Recorder,
    pub allocatable_cpu_milli: i128,
    pub allocatable_memory: i128,
    pub allocatable_storage: i128,
    /// Local images already seen present.
    pub images: Arc<docker::ImageCache>,
    /// What pods' resolv.conf files are made from.
    pub dns: crate::resolv_conf::NodeDns,
    /// The pod bridge whose ports go in hairpin mode as sandboxes start (when the proxy runs).
    pub hairpin_bridge: Option<String>,
    /// The Docker network pods are attached to ([`crate::pod_network`]).
    pub pod_network: String,
    /// Pods the eviction manager evicted, with their message.
    pub evicted: crate::eviction::Evicted,
}

impl Ctx {
    /// This node's containers' owner.
    pub fn owner(&self) -> docker::Owner<'_> {
        docker::Owner {
            node: &self.node,
            cluster: &self.cluster,
        }
    }

    fn env_context<'a>(&self, pod_ip: &'a str, host_ip: &'a str) -> EnvContext<'a> {
        EnvContext {
            pod_ip,
            host_ip,
            node_allocatable_cpu_milli: self.allocatable_cpu_milli,
            node_allocatable_memory: self.allocatable_memory,
            node_allocatable_storage: self.allocatable_storage,
        }
    }
}

struct Backoff {
    duration: Duration,
    last_update: Instant,
}

struct ProbeRun {
    state: Arc<Mutex<ProbeState>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for ProbeRun {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

pub struct PodWorker {
    ctx: Arc<Ctx>,
    uid: String,
    notes: HashMap<Key, ContainerNote>,
    backoff: HashMap<Key, Backoff>,
    image_backoff: HashMap<String, Backoff>,
    probes: HashMap<String, ProbeRun>,
    wake: Arc<Notify>,
    volumes: Option<(HashMap<String, HostVolume>, Instant)>,
    /// The service account tokens its projected volumes hold.
    tokens: volumes::TokenCache,
    last_status: Option<serde_json::Value>,
    seen_exits: HashSet<String>,
    /// The sandbox's IP (the host's for hostNetwork pods) as of the last sync.
    pod_ip: String,
    /// Whether the last reported status had every container running and ready with nothing waiting.
    settled: bool,
    /// spec.activeDeadlineSeconds has passed: the pod fails and its containers stop.
    deadline_exceeded: bool,
    /// The pod reached this agent after it had listed the engine's containers, so none of its
    /// containers can exist yet: the first sync need not list them.
    fresh: bool,
    /// Containers created during the current sync.
    created: Vec<String>,
}

/// upstream's verifyRunAsNonRoot, with the image's configured user.
/// Where `Localhost` seccomp profiles are read from: `DATA_DIR/seccomp/` (the kubelet's
/// `/var/lib/kubelet/seccomp`).
pub fn seccomp_root(data_dir: &std::path::Path) -> PathBuf {
    data_dir.join("seccomp")
}

/// Whether the host's kernel enforces AppArmor profiles.
fn apparmor_enabled() -> bool {
    std::fs::read_to_string("/sys/module/apparmor/parameters/enabled").is_ok_and(|s| s.trim() == "Y")
}

/// Docker's security options for what the container's and pod's security contexts ask:
/// seccomp (`RuntimeDefault` is the engine's default profile, `Unconfined`, `Localhost` read
/// from [`seccomp_root`]), AppArmor (the field or upstream's deprecated annotation; `Localhost`
/// needs AppArmor on the host and the profile loaded), `procMount: Unmasked`. A request the node
/// cannot honour is an error naming it, never dropped; so is `hostUsers: false`, which needs
/// user namespaces Docker does not offer per container.
fn security_options(
    data_dir: &std::path::Path,
    pod: &Pod,
    c: &k8s_openapi::api::core::v1::Container,
    pod_sc: &k8s_openapi::api::core::v1::PodSecurityContext,
    sc: &k8s_openapi::api::core::v1::SecurityContext,
) -> Result<Vec<String>, String> {
    let mut opts = Vec::new();
    let spec = pod.spec.as_ref();
    if spec.and_then(|s| s.host_users) == Some(false) {
        return Err(
            "user namespaces (hostUsers: false) are not supported by this node's container runtime".to_string(),
        );
    }
    if let Some(profile) = sc.seccomp_profile.as_ref().or(pod_sc.seccomp_profile.as_ref()) {
        match profile.type_.as_str() {
            "RuntimeDefault" => {}
            "Unconfined" => opts.push("seccomp=unconfined".to_string()),
            "Localhost" => {
                let name = profile.localhost_profile.as_deref().unwrap_or("");
                let path = seccomp_root(data_dir).join(name);
                if name.is_empty() || name.split('/').any(|p| p == "..") {
                    return Err(format!("invalid seccomp localhost profile {name:?}"));
                }
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| format!("failed to load seccomp profile {:?}: {e}", path.display().to_string()))?;
                if serde_json::from_str::<serde_json::Value>(&text).is_err() {
                    return Err(format!("seccomp profile {:?} is not JSON", path.display().to_string()));
                }
                opts.push(format!("seccomp={text}"));
            }
            other => return Err(format!("unsupported seccomp profile type {other:?}")),
        }
    }
    let annotation = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(&format!("container.apparmor.security.beta.kubernetes.io/{}", c.name)));
    let apparmor: Option<(String, String)> = match (
        sc.app_armor_profile.as_ref().or(pod_sc.app_armor_profile.as_ref()),
        annotation,
    ) {
        (Some(p), _) => Some((p.type_.clone(), p.localhost_profile.clone().unwrap_or_default())),
        (None, Some(a)) if a == "runtime/default" => Some(("RuntimeDefault".into(), String::new())),
        (None, Some(a)) if a == "unconfined" => Some(("Unconfined".into(), String::new())),
        (None, Some(a)) => match a.strip_prefix("localhost/") {
            Some(name) => Some(("Localhost".into(), name.to_string())),
            None => return Err(format!("invalid AppArmor profile {a:?}")),
        },
        (None, None) => None,
    };
    match apparmor {
        None => {}
        Some((t, _)) if t == "RuntimeDefault" => {}
        Some((t, _)) if t == "Unconfined" => opts.push("apparmor=unconfined".to_string()),
        Some((t, name)) if t == "Localhost" => {
            if !apparmor_enabled() {
                return Err("Cannot enforce AppArmor: AppArmor is not enabled on the host".to_string());
            }
            opts.push(format!("apparmor={name}"));
        }
        Some((t, _)) => return Err(format!("unsupported AppArmor profile type {t:?}")),
    }
    match sc.proc_mount.as_deref() {
        None | Some("Default") => {}
        Some("Unmasked") => opts.push("systempaths=unconfined".to_string()),
        Some(other) => return Err(format!("unsupported procMount {other:?}")),
    }
    Ok(opts)
}

fn verify_non_root(run_as_user: Option<i64>, image_user: &str, pod: &Pod, container: &str) -> Result<(), String> {
    if let Some(uid) = run_as_user {
        if uid == 0 {
            return Err(format!(
                "container's runAsUser breaks non-root policy (pod: \"{}\", container: {container})",
                format_pod(pod)
            ));
        }
        return Ok(());
    }
    let name = image_user.split(':').next().unwrap_or("");
    match name {
        "" | "0" => Err(format!(
            "container has runAsNonRoot and image will run as root (pod: \"{}\", container: {container})",
            format_pod(pod)
        )),
        n if n.parse::<i64>().is_ok() => Ok(()),
        n => Err(format!(
            "container has runAsNonRoot and image has non-numeric user ({n}), cannot verify user is non-root (pod: \"{}\", container: {container})",
            format_pod(pod)
        )),
    }
}

/// Go's `time.Duration.String()` for whole seconds ("10s", "1m20s", "5m0s").
pub fn go_duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs < 60 {
        format!("{secs}s")
    } else if secs < 3600 {
        format!("{}m{}s", secs / 60, secs % 60)
    } else {
        format!("{}h{}m{}s", secs / 3600, (secs % 3600) / 60, secs % 60)
    }
}

/// upstream's `format.Pod`: `name_namespace(uid)`.
pub fn format_pod(pod: &Pod) -> String {
    format!(
        "{}_{}({})",
        pod.metadata.name.as_deref().unwrap_or(""),
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.uid.as_deref().unwrap_or("")
    )
}

fn default_pull_policy(image: &str) -> &'static str {
    let last = image.rsplit('/').next().unwrap_or(image);
    if image.contains('@') {
        "IfNotPresent"
    } else if !last.contains(':') || last.ends_with(":latest") {
        "Always"
    } else {
        "IfNotPresent"
    }
}

/// Runs a pod worker until the pod is gone. `pods` carries the latest object; `None` means the API
/// object no longer exists.
pub async fn run(ctx: Arc<Ctx>, uid: String, pods: watch::Receiver<Option<Pod>>) {
    run_with_wake(ctx, uid, pods, Arc::new(Notify::new()), false).await
}

/// As [`run`], with a handle others use to make the worker sync now (the runtime's container events).
/// `fresh`: the pod was first seen after the agent listed the engine's containers (none of its
/// containers can exist).
pub async fn run_with_wake(
    ctx: Arc<Ctx>,
    uid: String,
    mut pods: watch::Receiver<Option<Pod>>,
    wake: Arc<Notify>,
    fresh: bool,
) {
    let mut worker = PodWorker {
        tokens: volumes::TokenCache::new(ctx.client.clone()),
        ctx,
        uid,
        notes: HashMap::new(),
        backoff: HashMap::new(),
        image_backoff: HashMap::new(),
        probes: HashMap::new(),
        wake,
        volumes: None,
        last_status: None,
        seen_exits: HashSet::new(),
        pod_ip: String::new(),
        settled: false,
        deadline_exceeded: false,
        fresh,
        created: Vec::new(),
    };
    let mut resync = RESYNC;
    // For kubelet_pod_start_duration_seconds and kubelet_pod_worker_duration_seconds.
    let seen = std::time::Instant::now();
    let mut started = false;
    let mut operation = "create";
    loop {
        let pod = pods.borrow_and_update().clone();
        let synced = pod.clone();
        let sync_start = std::time::Instant::now();
        match pod {
            None => {
                if let Err(e) = worker.teardown().await {
                    tracing::warn!(uid = %worker.uid, error = %format!("{e:#}"), "tearing down a removed pod");
                }
                crate::metrics::pod_removed(&worker.uid);
                return;
            }
            Some(pod) if pod.metadata.deletion_timestamp.is_some() => match worker.delete(&pod).await {
                Ok(()) => {
                    crate::metrics::pod_worker("kill", sync_start);
                    crate::metrics::pod_removed(&worker.uid);
                    return;
                }
                Err(e) => {
                    tracing::warn!(uid = %worker.uid, error = %format!("{e:#}"), "terminating a pod")
                }
            },
            Some(pod) => match worker.sync(&pod).await {
                Ok(true) => resync = SETTLED_RESYNC,
                Ok(false) if worker.settled => resync = SETTLED_RESYNC,
                Ok(false) => resync = RESYNC,
                Err(e) => {
                    resync = RESYNC;
                    tracing::warn!(pod = %format_pod(&pod), error = %format!("{e:#}"), "syncing a pod");
                }
            },
        }
        if synced.as_ref().is_some_and(|p| p.metadata.deletion_timestamp.is_none()) {
            crate::metrics::pod_worker(operation, sync_start);
            if !started && worker.settled {
                started = true;
                crate::metrics::pod_started(seen);
            }
        }
        operation = "sync";
        let wake = worker.wake.clone();
        let next_resync = tokio::time::sleep(resync);
        tokio::pin!(next_resync);
        loop {
            tokio::select! {
                changed = pods.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    // The worker's own status writes come back through the watch: they change
                    // nothing it acts on, so they do not cost another pass over the engine.
                    if !status_only_change(synced.as_ref(), pods.borrow().as_ref()) {
                        operation = "update";
                        break;
                    }
                }
                _ = wake.notified() => break,
                _ = &mut next_resync => break,
            }
        }
    }
}

/// Whether `new` differs from `old` only in its status (and the bookkeeping every write changes).
fn status_only_change(old: Option<&Pod>, new: Option<&Pod>) -> bool {
    let (Some(old), Some(new)) = (old, new) else {
        return false;
    };
    let comparable = |p: &Pod| {
        let mut meta = p.metadata.clone();
        meta.resource_version = None;
        meta.managed_fields = None;
        meta
    };
    old.spec == new.spec && comparable(old) == comparable(new)
}

impl PodWorker {
    fn docker(&self) -> &Docker {
        &self.ctx.docker
    }

    fn event(&self, pod: &Pod, container: Option<(bool, &str)>, type_: &str, reason: &str, message: String) {
        let path = container.map(|(init, name)| container_field_path(init, name));
        self.ctx
            .recorder
            .record(events::pod_reference(pod, path), type_, reason, None, message);
    }

    async fn runtime(&self) -> anyhow::Result<PodRuntime> {
        docker::pod_runtime(self.docker(), self.ctx.owner(), &self.uid).await
    }

    /// The Docker runtime the pod's RuntimeClass names: `None` for the default (`runc`, or no
    /// class); an error, in the words upstream's kubelet and containerd use, when the class is
    /// missing or names a runtime the engine does not know.
    async fn docker_runtime(&self, spec: &PodSpec) -> Result<Option<String>, String> {
        let Some(class) = spec.runtime_class_name.as_deref() else {
            return Ok(None);
        };
        let api: Api<k8s_openapi::api::node::v1::RuntimeClass> = Api::all(self.ctx.client.clone());
        let handler = match api.get_opt(class).await {
            Ok(Some(rc)) => rc.handler,
            Ok(None) => return Err(format!("runtimeclasses.node.k8s.io {class:?} not found")),
            Err(e) => return Err(format!("failed to lookup RuntimeClass {class}: {e}")),
        };
        if handler == DEFAULT_RUNTIME_HANDLER {
            return Ok(None);
        }
        let known = match self.docker().info().await {
            Ok(info) => info.runtimes.is_some_and(|r| r.contains_key(&handler)),
            Err(e) => return Err(format!("reading the container runtime's handlers: {e}")),
        };
        if known {
            Ok(Some(handler))
        } else {
            Err(format!(
                "rpc error: code = Unknown desc = failed to get sandbox runtime: no runtime for {handler:?} is configured"
            ))
        }
    }

    /// One pass of the sync loop; `true` when the pod has reached a terminal phase.
    pub async fn sync(&mut self, pod: &Pod) -> anyhow::Result<bool> {
        let spec = pod.spec.clone().unwrap_or_default();
        let mut rt = if std::mem::take(&mut self.fresh) {
            PodRuntime::default()
        } else {
            self.runtime().await?
        };
        // A pod with nothing in the engine yet: everything it has at the end of this sync is what
        // this sync created, and is inspected alone rather than listed again.
        let started_empty = rt.sandboxes.is_empty() && rt.containers.is_empty();
        self.created.clear();
        self.observe_exits(pod, &rt).await;
        self.refresh_probe_notes(&rt);

        if !self.deadline_exceeded && Self::past_deadline(pod) {
            self.deadline_exceeded = true;
            self.event(pod, None, WARNING, "DeadlineExceeded", DEADLINE_MESSAGE.into());
        }
        let preview = self.compute_status(pod, &rt);
        let terminal = matches!(preview.phase.as_deref(), Some("Succeeded" | "Failed"));
        let actions = self.decide(pod, &rt, terminal);
        match actions.kill_pod {
            Some(KillPodReason::Terminal) => {
                // Nothing more will run: stop what is left (the sandbox), keep the containers for logs.
                cleanup::stop_pod(self.docker(), &rt, Grace::Seconds(grace_seconds(pod))).await?;
                self.probes.clear();
                let rt = self.runtime().await?;
                return self.report(pod, &rt).await.map(|()| true);
            }
            // The worker's loop sends a pod being deleted to `delete`; should one get here, it is
            // deleted all the same.
            Some(KillPodReason::Deleting) => return self.delete(pod).await.map(|()| true),
            None => {}
        }

        let sandbox = match (rt.running_sandbox(), &actions.create_sandbox) {
            (Some(s), _) => s.clone(),
            (None, change) => {
                let change = change.clone().unwrap_or_else(|| SandboxChange {
                    attempt: rt.next_sandbox_attempt(),
                    changed: false,
                    stop: Vec::new(),
                    remove: Vec::new(),
                });
                let id = self.create_sandbox(pod, &spec, &change).await?;
                // A new pod has nothing else in the engine: its runtime is the sandbox just made,
                // inspected alone instead of listing the node's containers again.
                rt = match docker::inspect(self.docker(), &id).await? {
                    Some(sandbox) if started_empty => PodRuntime {
                        sandboxes: vec![sandbox],
                        ..Default::default()
                    },
                    _ => self.runtime().await?,
                };
                match rt.running_sandbox() {
                    Some(s) => s.clone(),
                    None => anyhow::bail!("the pod sandbox did not start"),
                }
            }
        };
        let pod_ip = if spec.host_network == Some(true) {
            self.ctx.host_ip.clone()
        } else {
            sandbox.ip.clone().unwrap_or_default()
        };
        self.pod_ip = pod_ip.clone();

        // Volumes: set up once, then refreshed (secret, configMap, downwardAPI contents) every minute.
        let stale = self
            .volumes
            .as_ref()
            .is_none_or(|(_, at)| at.elapsed() > VOLUME_REFRESH);
        if stale {
            let mut objects = ObjectCache::new(
                self.ctx.client.clone(),
                pod.metadata.namespace.as_deref().unwrap_or("default"),
            );
            let host_ip = self.ctx.host_ip.clone();
            let env_ctx = self.ctx.env_context(&pod_ip, &host_ip);
            match volumes::setup(
                pod,
                &self.ctx.data_dir,
                &self.ctx.client,
                &self.ctx.docker,
                &mut objects,
                &mut self.tokens,
                &env_ctx,
            )
            .await?
            {
                Ok(v) => self.volumes = Some((v, Instant::now())),
                Err(e) => {
                    self.event(pod, None, WARNING, "FailedMount", e.to_string());
                    if self.volumes.is_none() {
                        return self.report(pod, &rt).await.map(|()| false);
                    }
                }
            }
        }
        self.write_hosts_file(pod, &spec, &pod_ip).await?;

        // The containers, decided again on the runtime the sandbox step left.
        let actions = self.decide(pod, &rt, false);
        self.apply(pod, &spec, &actions, &sandbox, &pod_ip).await?;
        let rt = if started_empty {
            let mut rt = PodRuntime {
                sandboxes: vec![sandbox],
                ..Default::default()
            };
            for id in std::mem::take(&mut self.created) {
                if let Some(c) = docker::inspect(self.docker(), &id).await? {
                    rt.containers.push(c);
                }
            }
            rt
        } else {
            self.runtime().await?
        };
        self.refresh_probe_notes(&rt);
        self.report(pod, &rt).await.map(|()| false)
    }

    fn compute_status(&self, pod: &Pod, rt: &PodRuntime) -> k8s_openapi::api::core::v1::PodStatus {
        let mut status = status::compute(&StatusInput {
            pod,
            runtime: rt,
            notes: &self.notes,
            host_ip: &self.ctx.host_ip,
            now: jiff::Timestamp::now(),
        });
        // A terminated pod keeps the IPs it had.
        if status.pod_ip.is_none()
            && let Some(old) = pod.status.as_ref()
        {
            status.pod_ip = old.pod_ip.clone();
            status.pod_ips = old.pod_ips.clone();
        }
        if self.deadline_exceeded {
            status.phase = Some("Failed".into());
            status.reason = Some("DeadlineExceeded".into());
            status.message = Some(DEADLINE_MESSAGE.into());
        }
        if let Some(message) = self.ctx.evicted.lock().get(&self.uid).cloned() {
            status.phase = Some("Failed".into());
            status.reason = Some("Evicted".into());
            status.message = Some(message.clone());
            let conditions = status.conditions.get_or_insert_with(Vec::new);
            if !conditions.iter().any(|c| c.type_ == "DisruptionTarget") {
                conditions.push(k8s_openapi::api::core::v1::PodCondition {
                    type_: "DisruptionTarget".into(),
                    status: "True".into(),
                    reason: Some("TerminationByKubelet".into()),
                    message: Some(message),
                    last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        jiff::Timestamp::now(),
                    )),
                    ..Default::default()
                });
            }
        }
        // A terminal phase never changes again (upstream refuses the transition).
        if let Some(old) = pod.status.as_ref()
            && matches!(old.phase.as_deref(), Some("Succeeded" | "Failed"))
        {
            status.phase = old.phase.clone();
            status.reason = old.reason.clone().or(status.reason);
            status.message = old.message.clone().or(status.message);
        }
        status
    }

    /// Whether spec.activeDeadlineSeconds has passed since the pod started.
    fn past_deadline(pod: &Pod) -> bool {
        let deadline = pod.spec.as_ref().and_then(|s| s.active_deadline_seconds);
        let start = pod.status.as_ref().and_then(|s| s.start_time.as_ref());
        match (deadline, start) {
            (Some(d), Some(start)) => jiff::Timestamp::now().duration_since(start.0).as_secs() >= d,
            _ => false,
        }
    }

    /// Writes the status if it changed since the last write.
    async fn report(&mut self, pod: &Pod, rt: &PodRuntime) -> anyhow::Result<()> {
        crate::metrics::pod_runtime(&self.uid, rt);
        let status = self.compute_status(pod, rt);
        self.settled = status.phase.as_deref() == Some("Running")
            && status
                .container_statuses
                .iter()
                .flatten()
                .all(|c| c.ready && c.state.as_ref().is_some_and(|s| s.running.is_some()));
        let mut value = serde_json::to_value(&status)?;
        // Compare without transition times so an unchanged status is not rewritten.
        let mut comparable = value.clone();
        if let Some(conds) = comparable.get_mut("conditions").and_then(|c| c.as_array_mut()) {
            for c in conds {
                if let Some(o) = c.as_object_mut() {
                    o.remove("lastTransitionTime");
                }
            }
        }
        let mut old = serde_json::to_value(pod.status.clone().unwrap_or_default())?;
        if let Some(conds) = old.get_mut("conditions").and_then(|c| c.as_array_mut()) {
            for c in conds {
                if let Some(o) = c.as_object_mut() {
                    o.remove("lastTransitionTime");
                }
            }
        }
        if self.last_status.as_ref() == Some(&comparable) && old == comparable {
            return Ok(());
        }
        // A merge patch replaces lists; nulls clear fields the runtime no longer reports.
        if let Some(obj) = value.as_object_mut() {
            for field in ["podIP", "podIPs", "initContainerStatuses"] {
                obj.entry(field).or_insert(serde_json::Value::Null);
            }
        }
        let api: Api<Pod> = Api::namespaced(
            self.ctx.client.clone(),
            pod.metadata.namespace.as_deref().unwrap_or("default"),
        );
        let name = pod.metadata.name.clone().unwrap_or_default();
        let patch = serde_json::json!({ "status": value });
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("updating the status of pod {name}"))?;
        self.last_status = Some(comparable);
        Ok(())
    }

    /// Reads termination messages of newly exited containers.
    async fn observe_exits(&mut self, pod: &Pod, rt: &PodRuntime) {
        let spec = pod.spec.clone().unwrap_or_default();
        for c in rt.containers.iter().filter(|c| c.state == RunState::Exited) {
            if !self.seen_exits.insert(c.id.clone()) {
                continue;
            }
            self.probes.remove(&c.id);
            let Some(def) = spec
                .containers
                .iter()
                .chain(spec.init_containers.iter().flatten())
                .find(|d| d.name == c.name)
            else {
                continue;
            };
            let path = self.termination_log_path(&c.name, c.init, c.restart_count);
            let mut message = tokio::fs::read(&path)
                .await
                .map(|b| String::from_utf8_lossy(&b[..b.len().min(4096)]).into_owned())
                .unwrap_or_default();
            if message.is_empty()
                && c.exit_code != 0
                && def.termination_message_policy.as_deref() == Some("FallbackToLogsOnError")
            {
                message = self.tail_logs(&c.id, 80).await;
                if message.len() > 2048 {
                    message = message[message.len() - 2048..].to_string();
                }
            }
            if !message.is_empty() {
                self.notes
                    .entry((c.init, c.name.clone()))
                    .or_default()
                    .messages
                    .insert(c.id.clone(), message);
            }
        }
    }

    async fn tail_logs(&self, id: &str, lines: usize) -> String {
        let options = LogsOptionsBuilder::default()
            .stdout(true)
            .stderr(true)
            .tail(&lines.to_string())
            .build();
        let mut stream = self.docker().logs(id, Some(options));
        let mut out = String::new();
        while let Some(Ok(chunk)) = stream.next().await {
            out.push_str(&chunk.to_string());
        }
        out
    }

    fn termination_log_path(&self, name: &str, init: bool, restart: i32) -> PathBuf {
        let kind = if init { "init" } else { "app" };
        volumes::pod_dir(&self.ctx.data_dir, &self.uid)
            .join("containers")
            .join(format!("{kind}-{name}-{restart}"))
    }

    /// Copies probe results of running containers into the notes used by the status.
    fn refresh_probe_notes(&mut self, rt: &PodRuntime) {
        for c in rt.containers.iter().filter(|c| c.state == RunState::Running) {
            let note = self.notes.entry((c.init, c.name.clone())).or_default();
            match self.probes.get(&c.id) {
                Some(run) => {
                    let s = run.state.lock();
                    note.ready = s.ready;
                    note.started = s.started;
                }
                None => {
                    note.ready = true;
                    note.started = true;
                }
            }
            note.waiting = None;
        }
        // Probe tasks of containers that stopped are dropped (and aborted).
        let running: HashSet<&str> = rt
            .containers
            .iter()
            .filter(|c| c.state == RunState::Running)
            .map(|c| c.id.as_str())
            .collect();
        self.probes.retain(|id, _| running.contains(id.as_str()));
    }

    async fn write_hosts_file(&self, pod: &Pod, spec: &PodSpec, pod_ip: &str) -> anyhow::Result<()> {
        let dir = volumes::pod_dir(&self.ctx.data_dir, &self.uid);
        tokio::fs::create_dir_all(dir.join("containers"))
            .await
            .context("creating the pod directory")?;
        let content = if spec.host_network == Some(true) {
            let host = tokio::fs::read_to_string("/etc/hosts").await.unwrap_or_default();
            format!("{host}{}", volumes::host_aliases(pod))
        } else {
            volumes::hosts_file(pod, pod_ip)
        };
        let path = dir.join("etc-hosts");
        if tokio::fs::read_to_string(&path).await.ok().as_deref() != Some(content.as_str()) {
            tokio::fs::write(&path, content)
                .await
                .context("writing the pod's hosts file")?;
        }
        let (resolv, warnings) = crate::resolv_conf::pod_dns(pod, &self.ctx.dns);
        let content = resolv.render();
        let path = dir.join("resolv.conf");
        if tokio::fs::read_to_string(&path).await.ok().as_deref() != Some(content.as_str()) {
            // Warnings are recorded when the file is first written or changes, not at every sync.
            for (reason, message) in warnings {
                self.event(pod, None, WARNING, reason, message);
            }
            tokio::fs::write(&path, content)
                .await
                .context("writing the pod's resolv.conf")?;
        }
        Ok(())
    }

    fn base_labels(&self, pod: &Pod, kind: &str) -> HashMap<String, String> {
        let mut labels: HashMap<String, String> = self.ctx.owner().labels().into();
        labels.extend([
            (docker::LABEL_POD_UID.to_string(), self.uid.clone()),
            (
                docker::LABEL_POD_NAME.to_string(),
                pod.metadata.name.clone().unwrap_or_default(),
            ),
            (
                docker::LABEL_POD_NAMESPACE.to_string(),
                pod.metadata.namespace.clone().unwrap_or_default(),
            ),
            (docker::LABEL_TYPE.to_string(), kind.to_string()),
            (docker::LABEL_GRACE.to_string(), grace_seconds(pod).to_string()),
        ]);
        labels
    }

    /// Creates and starts the pod's sandbox, after stopping what ran in the one it replaces;
    /// returns its container id.
    async fn create_sandbox(&mut self, pod: &Pod, spec: &PodSpec, change: &SandboxChange) -> anyhow::Result<String> {
        if change.changed {
            self.event(
                pod,
                None,
                NORMAL,
                "SandboxChanged",
                "Pod sandbox changed, it will be killed and re-created.".into(),
            );
            for id in &change.stop {
                docker::stop(self.docker(), id, grace_seconds(pod)).await?;
            }
            for id in &change.remove {
                docker::remove(self.docker(), id).await?;
            }
            self.probes.clear();
        }
        let runtime = match self.docker_runtime(spec).await {
            Ok(r) => r,
            Err(e) => {
                self.event(
                    pod,
                    None,
                    WARNING,
                    "FailedCreatePodSandBox",
                    format!("Failed to create pod sandbox: {e}"),
                );
                anyhow::bail!("creating the pod sandbox: {e}");
            }
        };
        let attempt = change.attempt;
        let name = pod.metadata.name.clone().unwrap_or_default();
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let mut labels = self.base_labels(pod, docker::TYPE_SANDBOX);
        labels.insert(docker::LABEL_ATTEMPT.into(), attempt.to_string());
        let host_network = spec.host_network == Some(true);
        let mut port_bindings: HashMap<String, Option<Vec<PortBinding>>> = HashMap::new();
        let mut exposed = Vec::new();
        for c in &spec.containers {
            for p in c.ports.iter().flatten() {
                let proto = p.protocol.as_deref().unwrap_or("TCP").to_lowercase();
                let key = format!("{}/{proto}", p.container_port);
                exposed.push(key.clone());
                if let Some(host_port) = p.host_port.filter(|h| *h > 0)
                    && !host_network
                {
                    port_bindings
                        .entry(key)
                        .or_insert_with(|| Some(Vec::new()))
                        .get_or_insert_with(Vec::new)
                        .push(PortBinding {
                            host_ip: p.host_ip.clone(),
                            host_port: Some(host_port.to_string()),
                        });
                }
            }
        }
        let dns = spec.dns_config.clone().unwrap_or_default();
        let host_config = HostConfig {
            network_mode: Some(if host_network {
                "host".into()
            } else {
                self.ctx.pod_network.clone()
            }),
            ipc_mode: Some(if spec.host_ipc == Some(true) {
                "host".into()
            } else {
                "shareable".into()
            }),
            pid_mode: (spec.host_pid == Some(true)).then(|| "host".to_string()),
            port_bindings: Some(port_bindings).filter(|p| !p.is_empty()),
            dns: dns.nameservers.clone(),
            dns_search: dns.searches.clone(),
            dns_options: dns.options.as_ref().map(|o| {
                o.iter()
                    .map(|o| match &o.value {
                        Some(v) => format!("{}:{v}", o.name.clone().unwrap_or_default()),
                        None => o.name.clone().unwrap_or_default(),
                    })
                    .collect()
            }),
            sysctls: spec
                .security_context
                .as_ref()
                .and_then(|s| s.sysctls.as_ref())
                .map(|s| s.iter().map(|s| (s.name.clone(), s.value.clone())).collect()),
            runtime,
            ..Default::default()
        };
        let config = ContainerCreateBody {
            image: Some(PAUSE_IMAGE.into()),
            hostname: (!host_network).then(|| volumes::pod_hostname(pod)),
            labels: Some(labels),
            exposed_ports: Some(exposed).filter(|e| !e.is_empty()),
            host_config: Some(host_config),
            ..Default::default()
        };
        let options = CreateContainerOptionsBuilder::default()
            .name(&docker::container_name("POD", &name, &namespace, &self.uid, attempt))
            .build();
        // The agent built the pause image when it started; should it have been removed since, the
        // engine says so (404) and it is built again, rather than asking the engine before every pod.
        let created = match self
            .docker()
            .create_container(Some(options.clone()), config.clone())
            .await
        {
            Err(e) if docker::is_not_found(&e) => {
                crate::images::build_pause_image(self.docker())
                    .await
                    .context("building the pause image")?;
                self.docker().create_container(Some(options), config).await
            }
            other => other,
        }
        .context("creating the pod sandbox")?;
        if let Err(e) = self.docker().start_container(&created.id, None).await {
            let _ = docker::remove(self.docker(), &created.id).await;
            self.event(
                pod,
                None,
                WARNING,
                "FailedCreatePodSandBox",
                format!("Failed to create pod sandbox: {e}"),
            );
            return Err(e).context("starting the pod sandbox");
        }
        if let Some(bridge) = self.ctx.hairpin_bridge.clone()
            && spec.host_network != Some(true)
        {
            let set = tokio::task::spawn_blocking(move || crate::service_network::set_hairpin_mode(&bridge)).await;
            match set {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %format!("{e:#}"), "setting hairpin mode on the pod bridge"),
                Err(e) => tracing::warn!(error = %e, "setting hairpin mode on the pod bridge"),
            }
        }
        Ok(created.id)
    }

    /// Decides this pass's actions from what was observed.
    fn decide(&self, pod: &Pod, rt: &PodRuntime, terminal: bool) -> PodActions {
        let probes: HashMap<String, Option<String>> = self
            .probes
            .iter()
            .map(|(id, run)| (id.clone(), run.state.lock().restart.clone()))
            .collect();
        let backoff: HashMap<Key, BackoffState> = self
            .backoff
            .iter()
            .map(|(k, b)| {
                (
                    k.clone(),
                    BackoffState {
                        duration: b.duration,
                        since_update: b.last_update.elapsed(),
                    },
                )
            })
            .collect();
        actions::compute_pod_actions(
            pod,
            &Observed {
                runtime: rt,
                probes: &probes,
                notes: &self.notes,
                backoff: &backoff,
                now: jiff::Timestamp::now(),
                terminal,
            },
        )
    }

    /// Carries out the containers' actions: kills first, then starts, as upstream.
    async fn apply(
        &mut self,
        pod: &Pod,
        spec: &PodSpec,
        actions: &PodActions,
        sandbox: &ContainerRecord,
        pod_ip: &str,
    ) -> anyhow::Result<()> {
        let def = |init: bool, index: usize| -> Option<&Container> {
            if init {
                spec.init_containers.as_ref()?.get(index)
            } else {
                spec.containers.get(index)
            }
        };
        for index in &actions.init_done {
            if let Some(c) = def(true, *index) {
                self.notes.entry((true, c.name.clone())).or_default().waiting = None;
            }
        }
        for (init, index, id) in &actions.start_probes {
            if let Some(c) = def(*init, *index) {
                // Adopted after an agent restart: probes start again from scratch.
                self.start_probes(pod, c, id, None);
            }
        }
        for kill in &actions.containers_to_kill {
            if let Some(c) = def(kill.init, kill.index) {
                self.kill_container(pod, c, kill.init, &kill.id, kill.grace_seconds, &kill.message)
                    .await?;
            }
        }
        for waiting in &actions.backing_off {
            let Some(c) = def(waiting.init, waiting.index) else {
                continue;
            };
            let key = (waiting.init, c.name.clone());
            let message = format!(
                "back-off {} restarting failed container={} pod={}",
                go_duration(waiting.duration),
                c.name,
                format_pod(pod)
            );
            let note = self.notes.entry(key.clone()).or_default();
            if note.waiting.as_ref().map(|w| w.0.as_str()) != Some("CrashLoopBackOff") {
                self.event(
                    pod,
                    Some((waiting.init, &c.name)),
                    WARNING,
                    "BackOff",
                    format!(
                        "Back-off restarting failed container {} in pod {}",
                        c.name,
                        format_pod(pod)
                    ),
                );
            }
            self.notes.entry(key).or_default().waiting = Some(("CrashLoopBackOff".into(), message));
        }
        for start in &actions.containers_to_start {
            let Some(c) = def(start.init, start.index) else {
                continue;
            };
            if let Some(duration) = start.backoff {
                self.backoff.insert(
                    (start.init, c.name.clone()),
                    Backoff {
                        duration,
                        last_update: Instant::now(),
                    },
                );
            }
            for id in &start.remove {
                docker::remove(self.docker(), id).await?;
            }
            self.start_container(pod, c, start.init, start.restart_count, sandbox, pod_ip)
                .await?;
        }
        for start in &actions.ephemeral_to_start {
            let Some(c) = spec
                .ephemeral_containers
                .as_ref()
                .and_then(|e| e.get(start.index))
                .and_then(actions::ephemeral_as_container)
            else {
                continue;
            };
            self.start_container_as(pod, &c, false, 0, sandbox, pod_ip, Some(start.target.as_deref()))
                .await?;
        }
        Ok(())
    }

    async fn kill_container(
        &mut self,
        pod: &Pod,
        c: &Container,
        init: bool,
        id: &str,
        grace: i64,
        message: &str,
    ) -> anyhow::Result<()> {
        self.event(pod, Some((init, &c.name)), NORMAL, "Killing", message.to_string());
        self.probes.remove(id);
        let started = Instant::now();
        if let Some(pre_stop) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()) {
            let target = self.target(pod, c, id);
            let hook = probes::run_handler(pre_stop, &target);
            match tokio::time::timeout(Duration::from_secs(grace.max(0) as u64), hook).await {
                Ok(Err(msg)) => self.event(
                    pod,
                    Some((init, &c.name)),
                    WARNING,
                    "FailedPreStopHook",
                    format!("PreStopHook failed: {msg}"),
                ),
                Err(_) => {
                    tracing::info!(container = %c.name, "preStop hook did not finish within the grace period")
                }
                Ok(Ok(())) => {}
            }
        }
        let remaining = grace - started.elapsed().as_secs() as i64;
        docker::stop(self.docker(), id, remaining.max(0)).await
    }

    fn target(&self, pod: &Pod, c: &Container, id: &str) -> Target {
        let pod_ip = if !self.pod_ip.is_empty() {
            self.pod_ip.clone()
        } else if pod.spec.as_ref().and_then(|s| s.host_network) == Some(true) {
            self.ctx.host_ip.clone()
        } else {
            pod.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap_or_default()
        };
        Target {
            docker: self.ctx.docker.clone(),
            container_id: id.to_string(),
            pod_ip,
            container: c.clone(),
        }
    }

    fn start_probes(&mut self, pod: &Pod, c: &Container, id: &str, pod_ip: Option<String>) {
        if c.liveness_probe.is_none() && c.readiness_probe.is_none() && c.startup_probe.is_none() {
            return;
        }
        let mut target = self.target(pod, c, id);
        if let Some(ip) = pod_ip.filter(|ip| !ip.is_empty()) {
            target.pod_ip = ip;
        }
        let state = Arc::new(Mutex::new(ProbeState::default()));
        let recorder = self.ctx.recorder.clone();
        let pod_for_events = pod.clone();
        let name = c.name.clone();
        let on_failure: probes::FailureHook = Arc::new(move |kind: ProbeKind, message: &str| {
            recorder.record(
                events::pod_reference(&pod_for_events, Some(container_field_path(false, &name))),
                WARNING,
                "Unhealthy",
                None,
                format!("{} probe failed: {message}", kind.name()),
            );
        });
        let tasks = probes::start(target, state.clone(), self.wake.clone(), on_failure);
        self.probes.insert(id.to_string(), ProbeRun { state, tasks });
    }

    /// Resolves the image per imagePullPolicy; `Ok(false)` means the container must wait.
    async fn ensure_image(&mut self, pod: &Pod, c: &Container, init: bool) -> anyhow::Result<bool> {
        let image = c.image.clone().unwrap_or_default();
        let key = (init, c.name.clone());
        let policy = c
            .image_pull_policy
            .clone()
            .unwrap_or_else(|| default_pull_policy(&image).to_string());
        let present = self.ctx.images.image_id(self.docker(), &image).await?.is_some();
        let field = Some((init, c.name.as_str()));
        if present {
            // With no registry reachable, `Always` uses the local copy as IfNotPresent does.
            self.event(
                pod,
                field,
                NORMAL,
                "Pulled",
                format!("Container image \"{image}\" already present on machine"),
            );
            return Ok(true);
        }
        if policy == "Never" {
            let message = format!("Container image \"{image}\" is not present with pull policy of Never");
            self.event(pod, field, WARNING, "ErrImageNeverPull", message.clone());
            self.notes.entry(key).or_default().waiting = Some(("ErrImageNeverPull".into(), message));
            return Ok(false);
        }
        if let Some(b) = self.image_backoff.get(&image)
            && b.last_update.elapsed() < b.duration
        {
            let message = format!("Back-off pulling image \"{image}\"");
            self.event(pod, field, NORMAL, "BackOff", message.clone());
            self.notes.entry(key).or_default().waiting = Some(("ImagePullBackOff".into(), message));
            return Ok(false);
        }
        self.event(pod, field, NORMAL, "Pulling", format!("Pulling image \"{image}\""));
        let started = Instant::now();
        let options = CreateImageOptionsBuilder::default().from_image(&image).build();
        let mut stream = self.docker().create_image(Some(options), None, None);
        let mut error = None;
        let pull = async {
            let mut progress = crate::progress::Progress::start(format!("pulling image {image}"));
            let mut layers = crate::progress::Pull::default();
            while let Some(item) = stream.next().await {
                match item {
                    Ok(info) => {
                        layers.update(&info);
                        progress.tick(|| layers.summary());
                    }
                    Err(e) => {
                        error = Some(e.to_string());
                        break;
                    }
                }
            }
            if error.is_none() {
                progress.done(&layers.summary());
            }
        };
        if tokio::time::timeout(Duration::from_secs(120), pull).await.is_err() {
            error = Some("pull timed out".into());
        }
        match error {
            None => {
                let secs = started.elapsed().as_secs_f64();
                self.image_backoff.remove(&image);
                self.event(
                    pod,
                    field,
                    NORMAL,
                    "Pulled",
                    format!("Successfully pulled image \"{image}\" in {secs:.3}s ({secs:.3}s including waiting)"),
                );
                Ok(true)
            }
            Some(err) => {
                let next = self
                    .image_backoff
                    .get(&image)
                    .map(|b| (b.duration * 2).min(MAX_BACKOFF))
                    .unwrap_or(INITIAL_BACKOFF);
                self.image_backoff.insert(
                    image.clone(),
                    Backoff {
                        duration: next,
                        last_update: Instant::now(),
                    },
                );
                let message = format!("Failed to pull image \"{image}\": {err}");
                self.event(pod, field, WARNING, "Failed", message.clone());
                self.event(pod, field, WARNING, "Failed", "Error: ErrImagePull".into());
                self.notes.entry(key).or_default().waiting = Some(("ErrImagePull".into(), message));
                Ok(false)
            }
        }
    }

    async fn start_container(
        &mut self,
        pod: &Pod,
        c: &Container,
        init: bool,
        restart_count: i32,
        sandbox: &ContainerRecord,
        pod_ip: &str,
    ) -> anyhow::Result<()> {
        self.start_container_as(pod, c, init, restart_count, sandbox, pod_ip, None)
            .await
    }

    /// Starts a container; `ephemeral` is `Some(target container id)` for an ephemeral container
    /// (`Some(None)` without a target).
    #[allow(clippy::too_many_arguments)]
    async fn start_container_as(
        &mut self,
        pod: &Pod,
        c: &Container,
        init: bool,
        restart_count: i32,
        sandbox: &ContainerRecord,
        pod_ip: &str,
        ephemeral: Option<Option<&str>>,
    ) -> anyhow::Result<()> {
        let key = (init, c.name.clone());
        let field = Some((init, c.name.as_str()));
        if !self.ensure_image(pod, c, init).await? {
            return Ok(());
        }
        let spec = pod.spec.clone().unwrap_or_default();
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let mut objects = ObjectCache::new(self.ctx.client.clone(), &namespace);
        let host_ip = self.ctx.host_ip.clone();
        let env_ctx = self.ctx.env_context(pod_ip, &host_ip);
        let env = match env::container_env(pod, c, &env_ctx, &mut objects).await? {
            Ok(env) => env,
            Err(e) => {
                self.event(pod, field, WARNING, "Failed", format!("Error: {e}"));
                self.notes.entry(key).or_default().waiting = Some(("CreateContainerConfigError".into(), e.to_string()));
                return Ok(());
            }
        };
        let lookup: HashMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let volumes = self.volumes.as_ref().map(|(v, _)| v.clone()).unwrap_or_default();
        let pod_dir = volumes::pod_dir(&self.ctx.data_dir, &self.uid);
        let mut binds = match volumes::binds(c, &volumes, &pod_dir, &lookup) {
            Ok(b) => b,
            Err(e) => {
                self.event(pod, field, WARNING, "Failed", format!("Error: {e}"));
                self.notes.entry(key).or_default().waiting = Some(("CreateContainerConfigError".into(), e));
                return Ok(());
            }
        };
        let mounted = |path: &str| c.volume_mounts.iter().flatten().any(|m| m.mount_path == path);
        if !mounted("/etc/hosts") {
            binds.push(format!("{}:/etc/hosts", pod_dir.join("etc-hosts").display()));
        }
        if !mounted("/etc/resolv.conf") {
            binds.push(format!("{}:/etc/resolv.conf", pod_dir.join("resolv.conf").display()));
        }
        let log_path = self.termination_log_path(&c.name, init, restart_count);
        tokio::fs::write(&log_path, b"")
            .await
            .with_context(|| format!("creating {}", log_path.display()))?;
        let message_path = c
            .termination_message_path
            .clone()
            .unwrap_or_else(|| "/dev/termination-log".into());
        if !mounted(&message_path) {
            binds.push(format!("{}:{message_path}", log_path.display()));
        }

        let expand = |v: &Option<Vec<String>>| {
            v.as_ref()
                .map(|v| v.iter().map(|s| env::expand(s, &lookup)).collect::<Vec<_>>())
        };
        let entrypoint = expand(&c.command);
        let mut cmd = expand(&c.args);
        if entrypoint.is_some() && cmd.is_none() {
            cmd = Some(Vec::new());
        }

        let pod_sc = spec.security_context.clone().unwrap_or_default();
        let sc = c.security_context.clone().unwrap_or_default();
        let run_as_user = sc.run_as_user.or(pod_sc.run_as_user);
        let run_as_group = sc.run_as_group.or(pod_sc.run_as_group);
        let run_as_non_root = sc.run_as_non_root.or(pod_sc.run_as_non_root) == Some(true);
        // The image's own user matters only to runAsNonRoot and to a group without a user: the
        // engine is asked only then (every call to it during a burst of starts delays the others).
        let image_user = if run_as_non_root || (run_as_user.is_none() && run_as_group.is_some()) {
            docker::image_user(self.docker(), c.image.as_deref().unwrap_or("")).await?
        } else {
            String::new()
        };
        if run_as_non_root && let Err(message) = verify_non_root(run_as_user, &image_user, pod, &c.name) {
            self.event(pod, field, WARNING, "Failed", format!("Error: {message}"));
            self.notes.entry(key).or_default().waiting = Some(("CreateContainerConfigError".into(), message));
            return Ok(());
        }
        let user = match (run_as_user, run_as_group) {
            (Some(u), Some(g)) => Some(format!("{u}:{g}")),
            (Some(u), None) => Some(u.to_string()),
            (None, Some(g)) => {
                let base = image_user.split(':').next().filter(|u| !u.is_empty()).unwrap_or("0");
                Some(format!("{base}:{g}"))
            }
            (None, None) => None,
        };
        let mut groups: Vec<String> = pod_sc
            .supplemental_groups
            .iter()
            .flatten()
            .map(|g| g.to_string())
            .collect();
        if let Some(fs) = pod_sc.fs_group {
            groups.push(fs.to_string());
        }
        let caps = sc.capabilities.clone().unwrap_or_default();
        let sandbox_mode = format!("container:{}", sandbox.id);
        let resources = c.resources.clone().unwrap_or_default();
        let limit = |name: &str| {
            resources
                .limits
                .as_ref()
                .and_then(|l| l.get(name))
                .and_then(|q| crate::quantity::parse_milli(&q.0))
        };
        let request = |name: &str| {
            resources
                .requests
                .as_ref()
                .and_then(|l| l.get(name))
                .and_then(|q| crate::quantity::parse_milli(&q.0))
        };
        let cpu_request = request("cpu").or(limit("cpu"));
        let mut security_opt = Vec::new();
        if sc.allow_privilege_escalation == Some(false) {
            security_opt.push("no-new-privileges".to_string());
        }
        // What the pod asks of the kernel is applied, or the container is not made.
        match security_options(&self.ctx.data_dir, pod, c, &pod_sc, &sc) {
            Ok(opts) => security_opt.extend(opts),
            Err(message) => {
                self.event(pod, field, WARNING, "Failed", format!("Error: {message}"));
                self.notes.entry(key).or_default().waiting = Some(("CreateContainerConfigError".into(), message));
                return Ok(());
            }
        }
        // The containers run on the sandbox's runtime (the class was checked when it was made).
        let runtime = self.docker_runtime(&spec).await.ok().flatten();
        let host_config = HostConfig {
            runtime,
            binds: Some(binds),
            network_mode: Some(sandbox_mode.clone()),
            ipc_mode: Some(if spec.host_ipc == Some(true) {
                "host".into()
            } else {
                sandbox_mode.clone()
            }),
            pid_mode: if spec.host_pid == Some(true) {
                Some("host".into())
            } else if let Some(Some(target)) = ephemeral {
                Some(format!("container:{target}"))
            } else if spec.share_process_namespace == Some(true) {
                Some(sandbox_mode.clone())
            } else {
                None
            },
            memory: limit("memory").map(|m| (m / 1000) as i64),
            cpu_shares: Some(cpu_request.map(|m| ((m * 1024) / 1000).max(2) as i64).unwrap_or(2)),
            cpu_quota: limit("cpu").map(|m| ((m * 100_000) / 1000).max(1000) as i64),
            cpu_period: limit("cpu").map(|_| 100_000),
            privileged: sc.privileged,
            readonly_rootfs: sc.read_only_root_filesystem,
            cap_add: caps.add.clone(),
            cap_drop: caps.drop.clone(),
            group_add: Some(groups).filter(|g| !g.is_empty()),
            security_opt: Some(security_opt).filter(|s| !s.is_empty()),
            // Upstream's containerLogMaxSize / containerLogMaxFiles defaults.
            log_config: Some(bollard::models::HostConfigLogConfig {
                typ: Some("json-file".into()),
                config: Some(HashMap::from([
                    ("max-size".to_string(), "10m".to_string()),
                    ("max-file".to_string(), "5".to_string()),
                ])),
            }),
            ..Default::default()
        };
        let mut labels = self.base_labels(pod, docker::TYPE_CONTAINER);
        labels.insert(docker::LABEL_CONTAINER_NAME.into(), c.name.clone());
        labels.insert(docker::LABEL_RESTART_COUNT.into(), restart_count.to_string());
        labels.insert(docker::LABEL_HASH.into(), container_hash(c));
        if init {
            labels.insert(docker::LABEL_INIT.into(), "true".into());
        }
        if ephemeral.is_some() {
            labels.insert(docker::LABEL_EPHEMERAL.into(), "true".into());
        }
        let config = ContainerCreateBody {
            image: c.image.clone(),
            entrypoint,
            cmd,
            working_dir: c.working_dir.clone().filter(|w| !w.is_empty()),
            env: Some(env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            labels: Some(labels),
            tty: c.tty,
            open_stdin: c.stdin,
            stdin_once: c.stdin_once,
            attach_stdin: c.stdin,
            user,
            host_config: Some(host_config),
            ..Default::default()
        };
        let kind = if init {
            format!("{}-init", c.name)
        } else {
            c.name.clone()
        };
        let name = docker::container_name(
            &kind,
            pod.metadata.name.as_deref().unwrap_or(""),
            &namespace,
            &self.uid,
            restart_count,
        );
        let options = CreateContainerOptionsBuilder::default().name(&name).build();
        let created = match self.docker().create_container(Some(options), config).await {
            Ok(created) => created,
            Err(e) => {
                let message = e.to_string();
                self.event(pod, field, WARNING, "Failed", format!("Error: {message}"));
                self.notes.entry(key).or_default().waiting = Some(("CreateContainerError".into(), message));
                return Ok(());
            }
        };
        self.created.push(created.id.clone());
        self.event(pod, field, NORMAL, "Created", format!("Created container: {}", c.name));
        if let Err(e) = self.docker().start_container(&created.id, None).await {
            let message = e.to_string();
            self.event(pod, field, WARNING, "Failed", format!("Error: {message}"));
            self.notes.entry(key).or_default().waiting = Some(("RunContainerError".into(), message));
            return Ok(());
        }
        self.event(pod, field, NORMAL, "Started", format!("Started container {}", c.name));
        self.notes.entry(key.clone()).or_default().waiting = None;
        let mut probe_pod = pod.clone();
        probe_pod.status.get_or_insert_with(Default::default).pod_ip = Some(pod_ip.to_string());
        if let Some(post_start) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) {
            let target = self.target(&probe_pod, c, &created.id);
            if let Err(msg) = probes::run_handler(post_start, &target).await {
                self.event(pod, field, WARNING, "FailedPostStartHook", msg.clone());
                self.kill_container(
                    pod,
                    c,
                    init,
                    &created.id,
                    grace_seconds(pod),
                    &format!("FailedPostStartHook: {msg}"),
                )
                .await?;
                return Ok(());
            }
        }
        self.start_probes(&probe_pod, c, &created.id, Some(pod_ip.to_string()));
        Ok(())
    }

    /// Graceful deletion: stop everything within the grace period, delete the API object with grace 0,
    /// then remove containers, volumes and the pod directory.
    async fn delete(&mut self, pod: &Pod) -> anyhow::Result<()> {
        self.stop_all(pod, grace_seconds(pod)).await?;
        let rt = self.runtime().await?;
        if let Err(e) = self.report(pod, &rt).await {
            tracing::debug!(error = %format!("{e:#}"), "reporting the final status");
        }
        let api: Api<Pod> = Api::namespaced(
            self.ctx.client.clone(),
            pod.metadata.namespace.as_deref().unwrap_or("default"),
        );
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(self.uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        let name = pod.metadata.name.clone().unwrap_or_default();
        match api.delete(&name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => return Err(e).with_context(|| format!("deleting pod {name}")),
        }
        self.cleanup().await
    }

    async fn stop_all(&mut self, pod: &Pod, grace: i64) -> anyhow::Result<()> {
        let rt = self.runtime().await?;
        let spec = pod.spec.clone().unwrap_or_default();
        let mut stops = Vec::new();
        for rec in rt.containers.iter().filter(|c| c.state == RunState::Running) {
            let def = spec
                .containers
                .iter()
                .chain(spec.init_containers.iter().flatten())
                .find(|d| d.name == rec.name)
                .cloned()
                .unwrap_or_else(|| Container {
                    name: rec.name.clone(),
                    ..Default::default()
                });
            stops.push((def, rec.init, rec.id.clone()));
        }
        let futures = stops.into_iter().map(|(def, init, id)| {
            let docker = self.ctx.docker.clone();
            let target = self.target(pod, &def, &id);
            self.event(
                pod,
                Some((init, &def.name)),
                NORMAL,
                "Killing",
                format!("Stopping container {}", def.name),
            );
            async move {
                let started = Instant::now();
                if let Some(pre_stop) = def.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()) {
                    let _ = tokio::time::timeout(
                        Duration::from_secs(grace as u64),
                        probes::run_handler(pre_stop, &target),
                    )
                    .await;
                }
                let remaining = grace - started.elapsed().as_secs() as i64;
                docker::stop(&docker, &id, remaining.max(0)).await
            }
        });
        for r in futures::future::join_all(futures).await {
            r?;
        }
        self.probes.clear();
        cleanup::kill_sandboxes(self.docker(), &rt).await
    }

    /// The API object is gone (force deletion): stop and remove everything.
    async fn teardown(&mut self) -> anyhow::Result<()> {
        self.cleanup().await
    }

    async fn cleanup(&mut self) -> anyhow::Result<()> {
        self.probes.clear();
        cleanup::remove_pod(
            &self.ctx.docker,
            self.ctx.owner(),
            &self.ctx.data_dir,
            &self.uid,
            Grace::Labelled,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn security_options_apply_what_is_asked_or_say_why_not() {
        let dir = tempfile::tempdir().unwrap();
        let pod = |spec: serde_json::Value, annotations: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "annotations": annotations},
                "spec": spec,
            }))
            .unwrap()
        };
        let container = |sc: serde_json::Value| -> k8s_openapi::api::core::v1::Container {
            serde_json::from_value(serde_json::json!({"name": "c", "securityContext": sc})).unwrap()
        };
        let opts = |p: &Pod, c: &k8s_openapi::api::core::v1::Container| {
            let pod_sc = p
                .spec
                .as_ref()
                .and_then(|s| s.security_context.clone())
                .unwrap_or_default();
            let sc = c.security_context.clone().unwrap_or_default();
            security_options(dir.path(), p, c, &pod_sc, &sc)
        };
        let plain = pod(serde_json::json!({"containers": []}), serde_json::json!({}));
        assert_eq!(opts(&plain, &container(serde_json::json!({}))), Ok(vec![]));
        assert_eq!(
            opts(
                &plain,
                &container(
                    serde_json::json!({"seccompProfile": {"type": "Unconfined"}, "procMount": "Unmasked",
                "appArmorProfile": {"type": "Unconfined"}})
                )
            ),
            Ok(vec![
                "seccomp=unconfined".to_string(),
                "apparmor=unconfined".to_string(),
                "systempaths=unconfined".to_string()
            ])
        );
        // The pod's profile holds where the container names none.
        let pod_level = pod(
            serde_json::json!({"containers": [], "securityContext": {"seccompProfile": {"type": "Unconfined"}}}),
            serde_json::json!({}),
        );
        assert_eq!(
            opts(&pod_level, &container(serde_json::json!({}))),
            Ok(vec!["seccomp=unconfined".to_string()])
        );
        // Upstream's deprecated annotation is read too.
        let annotated = pod(
            serde_json::json!({"containers": []}),
            serde_json::json!({"container.apparmor.security.beta.kubernetes.io/c": "unconfined"}),
        );
        assert_eq!(
            opts(&annotated, &container(serde_json::json!({}))),
            Ok(vec!["apparmor=unconfined".to_string()])
        );
        // What the node cannot do is refused, with the reason.
        let userns = pod(
            serde_json::json!({"containers": [], "hostUsers": false}),
            serde_json::json!({}),
        );
        assert!(
            opts(&userns, &container(serde_json::json!({})))
                .unwrap_err()
                .contains("hostUsers: false")
        );
        let missing =
            container(serde_json::json!({"seccompProfile": {"type": "Localhost", "localhostProfile": "nope.json"}}));
        assert!(
            opts(&plain, &missing)
                .unwrap_err()
                .starts_with("failed to load seccomp profile")
        );
        let escape = container(
            serde_json::json!({"seccompProfile": {"type": "Localhost", "localhostProfile": "../../etc/passwd"}}),
        );
        assert!(
            opts(&plain, &escape)
                .unwrap_err()
                .starts_with("invalid seccomp localhost profile")
        );
    }

    #[test]
    fn durations_print_as_go_does() {
        assert_eq!(go_duration(Duration::from_secs(10)), "10s");
        assert_eq!(go_duration(Duration::from_secs(80)), "1m20s");
        assert_eq!(go_duration(Duration::from_secs(300)), "5m0s");
    }

    #[test]
    fn pull_policy_defaults() {
        assert_eq!(default_pull_policy("busybox"), "Always");
        assert_eq!(default_pull_policy("busybox:latest"), "Always");
        assert_eq!(default_pull_policy("busybox:1.36"), "IfNotPresent");
        assert_eq!(default_pull_policy("localhost:5000/busybox"), "Always");
        assert_eq!(default_pull_policy("busybox@sha256:abc"), "IfNotPresent");
    }

    #[test]
    fn run_as_non_root_is_verified() {
        let mut pod = Pod::default();
        pod.metadata.name = Some("p".into());
        pod.metadata.namespace = Some("ns".into());
        pod.metadata.uid = Some("u".into());
        assert!(verify_non_root(Some(1000), "", &pod, "c").is_ok());
        assert!(verify_non_root(None, "1000:1000", &pod, "c").is_ok());
        assert_eq!(
            verify_non_root(None, "", &pod, "c").unwrap_err(),
            "container has runAsNonRoot and image will run as root (pod: \"p_ns(u)\", container: c)"
        );
        assert!(
            verify_non_root(Some(0), "1000", &pod, "c")
                .unwrap_err()
                .contains("breaks non-root policy")
        );
        assert!(
            verify_non_root(None, "nobody", &pod, "c")
                .unwrap_err()
                .contains("non-numeric user (nobody)")
        );
    }
}
