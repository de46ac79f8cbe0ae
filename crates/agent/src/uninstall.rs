//! `skiff uninstall`: removes what a node agent put on its host, as its [`HostRecord`] lists it:
//! the pod containers and their volumes, the Docker network, the `DOCKER-USER` rules, the
//! nftables tables, the routes of the cluster and service ranges and the VXLAN device. Each
//! step is tried and reported; what is already gone is not an error, so it can run again.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use anyhow::Context;
use bollard::query_parameters::ListContainersOptionsBuilder;

use crate::cleanup::{self, Grace};
use crate::docker::{self, Owner};
use crate::host_record::HostRecord;
use crate::pod_network::{self, ROUTE_PROTOCOL, VXLAN_DEVICE};
use crate::proxy::{Ipv4Cidr, NetworkNamespace, run_command};

/// What one uninstall did: a line for each thing removed, and the steps that failed.
#[derive(Debug, Default)]
pub struct Report {
    pub removed: Vec<String>,
    pub failed: Vec<String>,
}

impl Report {
    fn done(&mut self, what: String) {
        tracing::info!(what = %what, "removed");
        self.removed.push(what);
    }

    fn failed(&mut self, what: &str, e: &anyhow::Error) {
        let line = format!("{what}: {e:#}");
        tracing::warn!(error = %line, "uninstall step failed");
        self.failed.push(line);
    }
}

/// Removes what the agent whose data dir is `agent_dir` recorded. The agent must not be running
/// (it would put it all back).
pub async fn uninstall(agent_dir: &Path) -> anyhow::Result<Report> {
    let record = HostRecord::read(agent_dir)?.unwrap_or_default();
    let mut report = Report::default();
    let netns = NetworkNamespace::Current;
    if !record.cluster.is_empty() && !record.node.is_empty() {
        match docker::connect().await {
            Ok(d) => {
                remove_containers(&d, &record, agent_dir, &mut report).await;
                if let Some(network) = &record.docker_network {
                    match d.remove_network(network).await {
                        Ok(()) => report.done(format!("Docker network {network}")),
                        Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {}
                        Err(e) => report.failed(&format!("Docker network {network}"), &e.into()),
                    }
                }
            }
            Err(e) => report.failed("connecting to Docker", &e),
        }
    }
    if let (Some(bridge), Some(pod_cidr)) = (&record.bridge, parse(record.pod_cidr.as_deref())) {
        match pod_network::disallow_forwarding(&netns, bridge, pod_cidr).await {
            Ok(0) => {}
            Ok(n) => report.done(format!("{n} DOCKER-USER rules of {bridge}")),
            Err(e) => report.failed("DOCKER-USER rules", &e),
        }
    }
    for table in &record.nft_tables {
        match crate::proxy::cleanup(&netns, table).await {
            Ok(_) => report.done(format!("nftables table ip {table}")),
            Err(e) => report.failed(&format!("nftables table ip {table}"), &e),
        }
    }
    if let Some(cidr) = parse(record.cluster_cidr.as_deref()) {
        match remove_routes_within(&netns, cidr).await {
            Ok(routes) => {
                for r in routes {
                    report.done(format!("route {r}"));
                }
            }
            Err(e) => report.failed("routes of the cluster CIDR", &e),
        }
        remove_idle_vxlan(&netns, &mut report).await;
    }
    if let Some(cidr) = parse(record.service_cidr.as_deref()) {
        let mut ip = netns.command("ip");
        let range = cidr.to_string();
        ip.args(["route", "del", "local", &range, "dev", "lo", "table", "local"]);
        if run_command(ip, None, "ip route del local").await.is_ok() {
            report.done(format!("route local {range} dev lo table local"));
        }
    }
    Ok(report)
}

fn parse(text: Option<&str>) -> Option<Ipv4Cidr> {
    text.and_then(|t| t.parse().ok())
}

/// Every pod of the recorded node and cluster: containers killed and removed with their
/// volumes and directories.
async fn remove_containers(d: &bollard::Docker, record: &HostRecord, agent_dir: &Path, report: &mut Report) {
    let filters = HashMap::from([(
        "label".to_string(),
        vec![
            format!("{}={}", docker::LABEL_CLUSTER, record.cluster),
            format!("{}={}", docker::LABEL_NODE, record.node),
        ],
    )]);
    let options = ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    let list = match d.list_containers(Some(options)).await {
        Ok(l) => l,
        Err(e) => return report.failed("listing the pod containers", &e.into()),
    };
    let uids: BTreeSet<String> = list
        .iter()
        .filter_map(|c| c.labels.as_ref()?.get(docker::LABEL_POD_UID).cloned())
        .collect();
    let owner = Owner {
        node: &record.node,
        cluster: &record.cluster,
    };
    for uid in uids {
        let what = format!("the containers of pod {uid}");
        match cleanup::remove_pod(d, owner, agent_dir, &uid, Grace::Kill).await {
            Ok(()) => report.done(what),
            Err(e) => report.failed(&what, &e),
        }
    }
}

/// Deletes the routes Skiff made (protocol 83) whose destination lies in `cidr`, the cluster
/// CIDR's own route included; returns them.
async fn remove_routes_within(netns: &NetworkNamespace, cidr: Ipv4Cidr) -> anyhow::Result<Vec<String>> {
    let mut show = netns.command("ip");
    show.args(["-4", "route", "show", "proto", &ROUTE_PROTOCOL.to_string()]);
    let text = run_command(show, None, "ip route show").await?;
    let mut removed = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or_default();
        let (kind, dst) = match first {
            "unreachable" | "blackhole" | "prohibit" | "local" => (Some(first), words.next().unwrap_or_default()),
            _ => (None, first),
        };
        let Ok(dst_cidr) = dst.parse::<Ipv4Cidr>() else {
            continue;
        };
        if !cidr.covers(&dst_cidr) {
            continue;
        }
        let mut del = netns.command("ip");
        del.args(["-4", "route", "del"]);
        if let Some(kind) = kind {
            del.arg(kind);
        }
        del.args([dst, "proto", &ROUTE_PROTOCOL.to_string()]);
        run_command(del, None, "ip route del")
            .await
            .with_context(|| format!("deleting the route {line}"))?;
        removed.push(line.to_string());
    }
    Ok(removed)
}

/// The VXLAN device goes once no route uses it (another cluster on this host may).
async fn remove_idle_vxlan(netns: &NetworkNamespace, report: &mut Report) {
    let mut show = netns.command("ip");
    show.args(["link", "show", VXLAN_DEVICE]);
    if run_command(show, None, "ip link show").await.is_err() {
        return;
    }
    let mut routes = netns.command("ip");
    routes.args(["-4", "route", "show", "dev", VXLAN_DEVICE]);
    match run_command(routes, None, "ip route show dev").await {
        Ok(text) if text.trim().is_empty() => {
            let mut del = netns.command("ip");
            del.args(["link", "del", VXLAN_DEVICE]);
            match run_command(del, None, "ip link del").await {
                Ok(_) => report.done(format!("device {VXLAN_DEVICE}")),
                Err(e) => report.failed(&format!("device {VXLAN_DEVICE}"), &e),
            }
        }
        Ok(_) => tracing::info!("{VXLAN_DEVICE} still carries routes of another cluster: kept"),
        Err(e) => report.failed(&format!("routes of {VXLAN_DEVICE}"), &e),
    }
}

/// The mount points at or under `dir` (`/proc/self/mountinfo`), deepest first.
fn mounts_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let unique: BTreeSet<std::path::PathBuf> = info
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        // mountinfo escapes spaces and other octal characters as \NNN.
        .map(|p| std::path::PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(dir))
        .collect();
    let mut points: Vec<std::path::PathBuf> = unique.into_iter().collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points
}

/// Deletes the data dir, after unmounting what is mounted under it (memory-backed emptyDirs,
/// subPath binds), so nothing is deleted through a mount.
pub fn remove_data_dir(dir: &Path) -> anyhow::Result<()> {
    use rustix::mount::{UnmountFlags, unmount};
    for point in mounts_under(dir) {
        match unmount(&point, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW) {
            Ok(()) => {}
            Err(e) if e == rustix::io::Errno::INVAL || e == rustix::io::Errno::NOENT => {}
            Err(e) => {
                return Err(std::io::Error::from(e)).with_context(|| format!("unmounting {}", point.display()));
            }
        }
    }
    anyhow::ensure!(
        mounts_under(dir).is_empty(),
        "{} still has mounts under it",
        dir.display()
    );
    std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_are_found_deepest_first_only_under_the_dir() {
        let root = mounts_under(Path::new("/"));
        assert!(root.last().is_some_and(|p| p == Path::new("/")), "{root:?}");
        assert!(mounts_under(Path::new("/nonexistent-skiff-dir")).is_empty());
    }

    #[test]
    fn a_data_dir_without_mounts_is_removed() {
        let dir = tempfile::tempdir().expect("dir");
        let data = dir.path().join("data");
        std::fs::create_dir_all(data.join("agent/pods")).expect("mkdir");
        std::fs::write(data.join("agent/host.json"), "{}").expect("write");
        remove_data_dir(&data).expect("removed");
        assert!(!data.exists());
    }

    #[tokio::test]
    async fn with_nothing_recorded_nothing_is_touched() {
        let dir = tempfile::tempdir().expect("dir");
        let report = uninstall(dir.path()).await.expect("uninstall");
        assert!(report.removed.is_empty() && report.failed.is_empty(), "{report:?}");
    }
}
