//! The one way a pod's containers go: [`stop_pod`] stops what runs (app and init containers
//! within their grace period, then the sandbox), [`remove_pod`] also removes the containers, then
//! the sandboxes, the pod's Docker volumes (tmpfs emptyDirs), its subPath bind mounts and last its
//! directory. The worker's deletion and teardown, the removal of orphans after a restart and the
//! eviction manager all call these.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;
use bollard::Docker;

use crate::docker::{self, PodRuntime, RunState};
use crate::volumes;

/// How long a container gets between SIGTERM and SIGKILL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grace {
    /// The pod's grace period, in seconds.
    Seconds(i64),
    /// The grace period each container was created with (its label), 30 s without one: the pod's
    /// spec is no longer known.
    Labelled,
    /// SIGKILL at once (eviction).
    Kill,
}

impl Grace {
    fn seconds(self, c: &docker::ContainerRecord) -> i64 {
        match self {
            Grace::Seconds(s) => s,
            Grace::Labelled => c
                .labels
                .get(docker::LABEL_GRACE)
                .and_then(|g| g.parse().ok())
                .unwrap_or(30),
            Grace::Kill => 0,
        }
    }
}

/// Stops the pod's running containers, then kills its sandboxes. Every container is tried; the
/// first error is returned at the end.
pub async fn stop_pod(docker: &Docker, rt: &PodRuntime, grace: Grace) -> anyhow::Result<()> {
    let mut first_error = None;
    for c in rt.containers.iter().filter(|c| c.state == RunState::Running) {
        let stopped = match grace {
            Grace::Kill => docker::kill(docker, &c.id).await,
            _ => docker::stop(docker, &c.id, grace.seconds(c)).await,
        };
        if let Err(e) = stopped {
            first_error.get_or_insert(e);
        }
    }
    if let Err(e) = kill_sandboxes(docker, rt).await {
        first_error.get_or_insert(e);
    }
    first_error.map_or(Ok(()), Err)
}

/// Kills the pod's running sandboxes (its containers already stopped).
pub async fn kill_sandboxes(docker: &Docker, rt: &PodRuntime) -> anyhow::Result<()> {
    for s in rt.sandboxes.iter().filter(|s| s.state == RunState::Running) {
        docker::kill(docker, &s.id).await?;
    }
    Ok(())
}

/// Stops everything the pod runs (see [`stop_pod`]) and removes it all: containers, sandboxes,
/// volumes, subPath mounts and the pod's directory.
pub async fn remove_pod(
    docker: &Docker,
    owner: docker::Owner<'_>,
    data_dir: &Path,
    uid: &str,
    grace: Grace,
) -> anyhow::Result<()> {
    let rt = docker::pod_runtime(docker, owner, uid).await?;
    stop_pod(docker, &rt, grace).await?;
    for c in rt.containers.iter().chain(&rt.sandboxes) {
        docker::remove(docker, &c.id).await?;
    }
    let filters = HashMap::from([("label".to_string(), vec![format!("{}={uid}", docker::LABEL_POD_UID)])]);
    let options = bollard::query_parameters::ListVolumesOptionsBuilder::default()
        .filters(&filters)
        .build();
    if let Ok(list) = docker.list_volumes(Some(options)).await {
        for v in list.volumes.unwrap_or_default() {
            let _ = docker
                .remove_volume(&v.name, None::<bollard::query_parameters::RemoveVolumeOptions>)
                .await;
        }
    }
    let dir = volumes::pod_dir(data_dir, uid);
    // Removing the directory must never reach through a subPath mount into a volume's data.
    let subpaths = dir.clone();
    tokio::task::spawn_blocking(move || crate::subpath::cleanup(&subpaths))
        .await
        .context("unmounting subPath mounts")??;
    match tokio::fs::remove_dir_all(&dir).await {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", dir.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grace_comes_from_the_pod_the_label_or_nothing() {
        let mut c = docker::ContainerRecord {
            id: "c".into(),
            name: "a".into(),
            restart_count: 0,
            init: false,
            hash: String::new(),
            image: String::new(),
            image_id: String::new(),
            state: RunState::Running,
            exit_code: 0,
            oom_killed: false,
            error: String::new(),
            started_at: None,
            finished_at: None,
            ip: None,
            labels: HashMap::new(),
        };
        assert_eq!(Grace::Seconds(5).seconds(&c), 5);
        assert_eq!(Grace::Labelled.seconds(&c), 30);
        c.labels.insert(docker::LABEL_GRACE.into(), "12".into());
        assert_eq!(Grace::Labelled.seconds(&c), 12);
        assert_eq!(Grace::Kill.seconds(&c), 0);
    }
}
