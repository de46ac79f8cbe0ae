//! The container runtime: pods as Docker containers.
//!
//! Each pod is a sandbox container (the pause image) holding the network and IPC namespaces (and the PID
//! namespace with `shareProcessNamespace`); the pod's containers join them with `container:<sandbox>`
//! modes. Every container carries labels naming its pod, so a restarted agent finds and adopts them.

use std::collections::HashMap;

use anyhow::Context;
use bollard::Docker;
use bollard::query_parameters::{
    InspectContainerOptions, KillContainerOptionsBuilder, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
    StopContainerOptionsBuilder,
};
use jiff::Timestamp;

pub const LABEL_NODE: &str = "io.skiff.node";
/// The cluster a container belongs to: the uid of its `kube-system` Namespace.
pub const LABEL_CLUSTER: &str = "io.skiff.cluster";
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";
pub const LABEL_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
pub const LABEL_HASH: &str = "io.kubernetes.container.hash";
pub const LABEL_TYPE: &str = "io.kubernetes.docker.type";
pub const LABEL_INIT: &str = "io.skiff.container.init";
/// An ephemeral (debug) container, added through the pod's `ephemeralcontainers` subresource.
pub const LABEL_EPHEMERAL: &str = "io.skiff.container.ephemeral";
pub const LABEL_ATTEMPT: &str = "io.kubernetes.sandbox.attempt";
pub const LABEL_GRACE: &str = "io.kubernetes.pod.terminationGracePeriod";
pub const TYPE_SANDBOX: &str = "podsandbox";
pub const TYPE_CONTAINER: &str = "container";

/// Connects to the local engine and negotiates the API version it speaks.
pub async fn connect() -> anyhow::Result<Docker> {
    let docker = Docker::connect_with_local_defaults().context("connecting to the Docker Engine")?;
    docker
        .negotiate_version()
        .await
        .context("negotiating the Docker API version")
}

/// A Docker `label` filter term: the containers whose label `key` is `value`.
pub fn label(key: &str, value: &str) -> String {
    format!("{key}={value}")
}

/// Whose containers these are: one node of one cluster. Nodes of two clusters may share a name (both
/// named after the host) on one engine, so containers are matched by node and cluster together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner<'a> {
    pub node: &'a str,
    /// The cluster's identity, the uid of its `kube-system` Namespace.
    pub cluster: &'a str,
}

impl Owner<'_> {
    /// The labels every container of this owner carries.
    pub fn labels(&self) -> [(String, String); 2] {
        [
            (LABEL_NODE.to_string(), self.node.to_string()),
            (LABEL_CLUSTER.to_string(), self.cluster.to_string()),
        ]
    }

    /// Docker `label` filters selecting this owner's containers, narrowed by `more` (`key=value`s).
    pub fn label_filter(&self, more: impl IntoIterator<Item = String>) -> Vec<String> {
        self.labels()
            .into_iter()
            .map(|(k, v)| label(&k, &v))
            .chain(more)
            .collect()
    }

    /// Docker list filters selecting this owner's containers, narrowed by `more` labels.
    pub fn filters(&self, more: impl IntoIterator<Item = String>) -> HashMap<String, Vec<String>> {
        HashMap::from([("label".to_string(), self.label_filter(more))])
    }
}

/// What the agent knows about one Docker container of a pod.
#[derive(Clone, Debug, PartialEq)]
pub struct ContainerRecord {
    pub id: String,
    /// The Kubernetes container name (`POD` for the sandbox).
    pub name: String,
    pub restart_count: i32,
    pub init: bool,
    pub hash: String,
    pub image: String,
    pub image_id: String,
    pub state: RunState,
    pub exit_code: i64,
    pub oom_killed: bool,
    pub error: String,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    pub ip: Option<String>,
    pub labels: HashMap<String, String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunState {
    Created,
    Running,
    Exited,
}

/// All containers of one pod known to the engine.
#[derive(Clone, Debug, Default)]
pub struct PodRuntime {
    pub sandboxes: Vec<ContainerRecord>,
    pub containers: Vec<ContainerRecord>,
}

impl PodRuntime {
    /// The newest sandbox, if it is running.
    pub fn running_sandbox(&self) -> Option<&ContainerRecord> {
        self.sandboxes
            .iter()
            .max_by_key(|s| s.restart_count)
            .filter(|s| s.state == RunState::Running)
    }

    pub fn next_sandbox_attempt(&self) -> i32 {
        self.sandboxes.iter().map(|s| s.restart_count + 1).max().unwrap_or(0)
    }

    /// Instances of a container, newest first.
    pub fn instances(&self, name: &str, init: bool) -> Vec<&ContainerRecord> {
        let mut v: Vec<_> = self
            .containers
            .iter()
            .filter(|c| c.name == name && c.init == init)
            .collect();
        v.sort_by_key(|c| std::cmp::Reverse(c.restart_count));
        v
    }
}

fn parse_time(s: Option<&String>) -> Option<Timestamp> {
    let s = s?;
    let t: Timestamp = s.parse().ok()?;
    // Docker reports the zero time for "never".
    (t.as_second() > 0).then_some(t)
}

/// Lists every container this node's agent created (running or not), grouped by pod UID.
pub async fn list_node_containers(docker: &Docker, owner: Owner<'_>) -> anyhow::Result<HashMap<String, PodRuntime>> {
    let filters = owner.filters([]);
    let options = ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    let list = docker
        .list_containers(Some(options))
        .await
        .context("listing containers")?;
    let mut pods: HashMap<String, PodRuntime> = HashMap::new();
    for summary in list {
        let Some(id) = summary.id else { continue };
        let Some(record) = inspect(docker, &id).await? else {
            continue;
        };
        let Some(uid) = record.labels.get(LABEL_POD_UID).cloned() else {
            continue;
        };
        let entry = pods.entry(uid).or_default();
        if record.labels.get(LABEL_TYPE).map(String::as_str) == Some(TYPE_SANDBOX) {
            entry.sandboxes.push(record);
        } else {
            entry.containers.push(record);
        }
    }
    Ok(pods)
}

/// The label filter selecting one pod's containers on this node. A pod's uid is unique across
/// clusters, so the uid alone says whose they are: this also finds the containers an older agent
/// made without the cluster label, and a pod running across an upgrade keeps them instead of
/// getting a second set beside them.
fn pod_filters(owner: Owner<'_>, uid: &str) -> HashMap<String, Vec<String>> {
    HashMap::from([(
        "label".to_string(),
        vec![label(LABEL_NODE, owner.node), label(LABEL_POD_UID, uid)],
    )])
}

/// Ids of containers of node `node` without a cluster label: made by an agent that did not label
/// its cluster, so no cluster's orphan sweep takes them.
pub async fn unowned_node_containers(docker: &Docker, node: &str) -> anyhow::Result<Vec<String>> {
    let filters = HashMap::from([("label".to_string(), vec![label(LABEL_NODE, node)])]);
    let options = ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    let list = docker
        .list_containers(Some(options))
        .await
        .context("listing containers")?;
    Ok(list
        .into_iter()
        .filter(|c| c.labels.as_ref().is_none_or(|l| !l.contains_key(LABEL_CLUSTER)))
        .filter_map(|c| c.id)
        .collect())
}

/// The bytes the pod's containers wrote to their writable layers (the engine's `SizeRw`).
pub async fn pod_writable_layers(docker: &Docker, owner: Owner<'_>, uid: &str) -> anyhow::Result<u64> {
    let filters = pod_filters(owner, uid);
    let options = ListContainersOptionsBuilder::default()
        .all(true)
        .size(true)
        .filters(&filters)
        .build();
    let list = docker
        .list_containers(Some(options))
        .await
        .context("listing pod containers with their sizes")?;
    Ok(list
        .iter()
        .filter_map(|c| c.size_rw)
        .map(|s| u64::try_from(s).unwrap_or(0))
        .sum())
}

/// Lists the containers of one pod.
pub async fn pod_runtime(docker: &Docker, owner: Owner<'_>, uid: &str) -> anyhow::Result<PodRuntime> {
    let filters = pod_filters(owner, uid);
    let options = ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    let list = docker
        .list_containers(Some(options))
        .await
        .context("listing pod containers")?;
    let mut rt = PodRuntime::default();
    for summary in list {
        let Some(id) = summary.id else { continue };
        let Some(record) = inspect(docker, &id).await? else {
            continue;
        };
        if record.labels.get(LABEL_TYPE).map(String::as_str) == Some(TYPE_SANDBOX) {
            rt.sandboxes.push(record);
        } else {
            rt.containers.push(record);
        }
    }
    Ok(rt)
}

/// Inspects a container; `None` when it no longer exists.
pub async fn inspect(docker: &Docker, id: &str) -> anyhow::Result<Option<ContainerRecord>> {
    let info = match docker.inspect_container(id, None::<InspectContainerOptions>).await {
        Ok(info) => info,
        Err(e) if is_not_found(&e) => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("inspecting container {id}")),
    };
    let labels: HashMap<String, String> = info
        .config
        .as_ref()
        .and_then(|c| c.labels.clone())
        .unwrap_or_default()
        .into_iter()
        .collect();
    let state = info.state.clone().unwrap_or_default();
    let run_state = if state.running == Some(true) {
        RunState::Running
    } else if parse_time(state.started_at.as_ref()).is_some() || parse_time(state.finished_at.as_ref()).is_some() {
        RunState::Exited
    } else {
        RunState::Created
    };
    let is_sandbox = labels.get(LABEL_TYPE).map(String::as_str) == Some(TYPE_SANDBOX);
    let count_label = if is_sandbox { LABEL_ATTEMPT } else { LABEL_RESTART_COUNT };
    let ip = info
        .network_settings
        .as_ref()
        .and_then(|n| n.networks.as_ref())
        .and_then(|nets| {
            nets.values()
                .find_map(|e| e.ip_address.clone().filter(|ip| !ip.is_empty()))
        });
    Ok(Some(ContainerRecord {
        id: info.id.clone().unwrap_or_else(|| id.to_string()),
        name: labels
            .get(LABEL_CONTAINER_NAME)
            .cloned()
            .unwrap_or_else(|| "POD".to_string()),
        restart_count: labels.get(count_label).and_then(|v| v.parse().ok()).unwrap_or(0),
        init: labels.get(LABEL_INIT).map(String::as_str) == Some("true"),
        hash: labels.get(LABEL_HASH).cloned().unwrap_or_default(),
        image: info.config.as_ref().and_then(|c| c.image.clone()).unwrap_or_default(),
        image_id: info.image.clone().unwrap_or_default(),
        state: run_state,
        exit_code: state.exit_code.unwrap_or(0),
        oom_killed: state.oom_killed.unwrap_or(false),
        error: state.error.clone().unwrap_or_default(),
        started_at: parse_time(state.started_at.as_ref()),
        finished_at: parse_time(state.finished_at.as_ref()),
        ip,
        labels,
    }))
}

pub fn is_not_found(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }
    )
}

/// Stops a container: SIGTERM, then SIGKILL after `grace` seconds (the engine does the waiting).
pub async fn stop(docker: &Docker, id: &str, grace: i64) -> anyhow::Result<()> {
    let options = StopContainerOptionsBuilder::default()
        .t(grace.clamp(0, i32::MAX as i64) as i32)
        .build();
    match docker.stop_container(id, Some(options)).await {
        Ok(()) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(bollard::errors::Error::DockerResponseServerError { status_code: 304, .. }) => Ok(()),
        Err(e) => Err(e).with_context(|| format!("stopping container {id}")),
    }
}

/// Sends SIGKILL; a container that is not running is not an error.
pub async fn kill(docker: &Docker, id: &str) -> anyhow::Result<()> {
    let options = KillContainerOptionsBuilder::default().signal("SIGKILL").build();
    match docker.kill_container(id, Some(options)).await {
        Ok(()) => Ok(()),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404 | 409, ..
        }) => Ok(()),
        Err(e) => Err(e).with_context(|| format!("killing container {id}")),
    }
}

pub async fn remove(docker: &Docker, id: &str) -> anyhow::Result<()> {
    let options = RemoveContainerOptionsBuilder::default().force(true).v(true).build();
    match docker.remove_container(id, Some(options)).await {
        Ok(()) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing container {id}")),
    }
}

/// Whether an image is present locally; returns its ID.
pub async fn image_id(docker: &Docker, image: &str) -> anyhow::Result<Option<String>> {
    match docker.inspect_image(image).await {
        Ok(info) => Ok(info.id),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(e).with_context(|| format!("inspecting image {image}")),
    }
}

/// The IDs of local images by reference, as last inspected. Whatever the engine reports about
/// images (pulled, tagged, untagged, deleted, imported, loaded) empties it, so it never answers
/// for longer than the engine takes to say an image changed; a pod start then asks the engine
/// only about images it has not seen yet.
#[derive(Default)]
pub struct ImageCache {
    ids: parking_lot::Mutex<HashMap<String, String>>,
}

impl ImageCache {
    /// As [`image_id`], answered from the cache when the image was seen present.
    pub async fn image_id(&self, docker: &Docker, image: &str) -> anyhow::Result<Option<String>> {
        if let Some(id) = self.ids.lock().get(image) {
            return Ok(Some(id.clone()));
        }
        let id = image_id(docker, image).await?;
        if let Some(id) = &id {
            self.ids.lock().insert(image.to_string(), id.clone());
        }
        Ok(id)
    }

    pub fn clear(&self) {
        self.ids.lock().clear();
    }
}

/// Empties `cache` whenever the engine reports an image event, and each time its event stream
/// ends or is opened again, for as long as it runs.
pub async fn invalidate_images_on_events(docker: Docker, cache: std::sync::Arc<ImageCache>) {
    use futures::StreamExt;
    let filters = HashMap::from([("type".to_string(), vec!["image".to_string()])]);
    loop {
        let options = bollard::query_parameters::EventsOptionsBuilder::default()
            .filters(&filters)
            .build();
        let mut stream = docker.events(Some(options));
        cache.clear();
        while let Some(item) = stream.next().await {
            cache.clear();
            if item.is_err() {
                break;
            }
        }
        cache.clear();
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// The user an image runs as (`Config.User`, possibly empty).
pub async fn image_user(docker: &Docker, image: &str) -> anyhow::Result<String> {
    match docker.inspect_image(image).await {
        Ok(info) => Ok(info.config.and_then(|c| c.user).unwrap_or_default()),
        Err(e) if is_not_found(&e) => Ok(String::new()),
        Err(e) => Err(e).with_context(|| format!("inspecting image {image}")),
    }
}

/// A Docker container name, as dockershim named them.
pub fn container_name(kind: &str, pod_name: &str, namespace: &str, uid: &str, attempt: i32) -> String {
    let short: String = uid.chars().filter(|c| c.is_ascii_alphanumeric()).take(12).collect();
    format!("k8s_{kind}_{pod_name}_{namespace}_{short}_{attempt}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_owners_filter_matches_node_and_cluster() {
        let owner = super::Owner {
            node: "n1",
            cluster: "0b9c",
        };
        assert_eq!(
            owner.filters([super::label(super::LABEL_POD_UID, "u1")])["label"],
            ["io.skiff.node=n1", "io.skiff.cluster=0b9c", "io.kubernetes.pod.uid=u1"]
        );
    }

    use super::*;

    fn rec(name: &str, restart: i32, state: RunState) -> ContainerRecord {
        ContainerRecord {
            id: format!("{name}{restart}"),
            name: name.into(),
            restart_count: restart,
            init: false,
            hash: String::new(),
            image: String::new(),
            image_id: String::new(),
            state,
            exit_code: 0,
            oom_killed: false,
            error: String::new(),
            started_at: None,
            finished_at: None,
            ip: None,
            labels: HashMap::new(),
        }
    }

    #[test]
    fn instances_are_newest_first_and_sandbox_attempts_increase() {
        let rt = PodRuntime {
            sandboxes: vec![rec("POD", 0, RunState::Exited), rec("POD", 1, RunState::Running)],
            containers: vec![
                rec("a", 0, RunState::Exited),
                rec("a", 2, RunState::Running),
                rec("b", 0, RunState::Running),
            ],
        };
        assert_eq!(rt.running_sandbox().map(|s| s.id.as_str()), Some("POD1"));
        assert_eq!(rt.next_sandbox_attempt(), 2);
        let a: Vec<_> = rt.instances("a", false).iter().map(|c| c.restart_count).collect();
        assert_eq!(a, vec![2, 0]);
        assert!(rt.instances("a", true).is_empty());
        assert_eq!(
            container_name("POD", "web", "default", "1234-5678-9abc-def0", 1),
            "k8s_POD_web_default_123456789abc_1"
        );
    }
}
