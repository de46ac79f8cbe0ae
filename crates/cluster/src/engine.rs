//! Each node's container engine: a `dockerd` of its own inside the node's namespace, with its own
//! configuration file (so the host's `/etc/docker/daemon.json` does not apply), data root, exec
//! root, socket, pid file and the `vfs` storage driver (overlay mounts need more than a nested
//! engine is allowed here). It spawns its own containerd, whose state sits under the same roots.
//! Its bridge is `cbr0` (kubenet's name), made by [`crate::network`] with the node's pod subnet
//! before the engine starts, rather than a `docker0` the engine makes: a name the host never has,
//! so a tool that looks it up in the host's `/sys` rather than the node's finds nothing instead of
//! the host's own bridge. Images come from the host's engine (`docker save`, then `docker load`
//! into each node's), never from a registry.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;

use crate::network::run;
use crate::process::{self, Spawn};
use crate::state::{ClusterState, NodeState};

/// The images every node gets: what `skiff images build` makes.
pub fn default_images() -> Vec<String> {
    vec![
        skiff_agent::images::BUSYBOX_IMAGE.to_string(),
        skiff_agent::images::PAUSE_IMAGE.to_string(),
    ]
}

/// Saves `images` from the host's engine into one archive, for every node to load.
pub async fn save_images(images: &[String], archive: &Path) -> anyhow::Result<()> {
    let path = archive.to_string_lossy().into_owned();
    let mut args = vec!["save", "-o", path.as_str()];
    args.extend(images.iter().map(String::as_str));
    run("docker", &args)
        .await
        .context("saving the local images from the host's engine (build them with `skiff images build`)")?;
    Ok(())
}

/// Starts the node's engine (detached, in the node's cgroup) and waits until it answers.
pub async fn start(c: &ClusterState, node: &NodeState) -> anyhow::Result<()> {
    let dir = c.node_dir(node);
    let run_dir = c.node_runtime_dir(node);
    for d in [&dir, &run_dir] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let config = dir.join("daemon.json");
    std::fs::write(&config, "{}\n").with_context(|| format!("writing {}", config.display()))?;
    let cgroup = c.cgroup(node);
    let args = vec![
        "--config-file".to_string(),
        config.display().to_string(),
        "--data-root".into(),
        c.data_root(node).display().to_string(),
        "--exec-root".into(),
        run_dir.join("engine").display().to_string(),
        "--host".into(),
        c.docker_host(node),
        "--pidfile".into(),
        run_dir.join("dockerd.pid").display().to_string(),
        "--bridge".into(),
        "cbr0".into(),
        "--storage-driver".into(),
        "vfs".into(),
        "--cgroup-parent".into(),
        process::containers_cgroup(&cgroup).display().to_string(),
    ];
    process::spawn(Spawn {
        program: Path::new("dockerd"),
        args,
        env: vec![],
        netns: &c.netns(node),
        hostname: &node.name,
        cgroup: &process::processes_cgroup(&cgroup),
        log: &dir.join("dockerd.log"),
        pidfile: &dir.join("dockerd.pid"),
        mounts: process::MountNamespace::New {
            stash: &run_dir.join("cgroup"),
        },
    })?;
    wait_ready(c, node).await
}

async fn wait_ready(c: &ClusterState, node: &NodeState) -> anyhow::Result<()> {
    let socket = c.docker_socket(node);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut last = String::new();
    while tokio::time::Instant::now() < deadline {
        if socket.exists() {
            match bollard::Docker::connect_with_unix(&socket.to_string_lossy(), 5, bollard::API_DEFAULT_VERSION) {
                Ok(d) => match d.ping().await {
                    Ok(_) => return Ok(()),
                    Err(e) => last = e.to_string(),
                },
                Err(e) => last = e.to_string(),
            }
        }
        let pid = std::fs::read_to_string(c.node_dir(node).join("dockerd.pid")).unwrap_or_default();
        if pid.trim().parse().is_ok_and(|p| !process::alive(p)) {
            anyhow::bail!(
                "the engine of node {} exited:\n{}",
                node.name,
                tail(&c.node_dir(node).join("dockerd.log"), 20)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::bail!(
        "the engine of node {} did not answer within 60 s ({last}):\n{}",
        node.name,
        tail(&c.node_dir(node).join("dockerd.log"), 20)
    )
}

/// Loads the archive of images into the node's engine.
pub async fn load_images(c: &ClusterState, node: &NodeState, archive: &Path) -> anyhow::Result<()> {
    run(
        "docker",
        &[
            "--host",
            &c.docker_host(node),
            "load",
            "--quiet",
            "--input",
            &archive.to_string_lossy(),
        ],
    )
    .await
    .with_context(|| format!("loading the images into node {}", node.name))?;
    Ok(())
}

/// The last `n` lines of a log file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
