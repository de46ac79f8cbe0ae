//! The cluster's network, made with iproute2:
//!
//! ```text
//!   host: skiffI 172.29.I.254/24 ──veth──┐
//!   netns skiffI (the switch):          br0 ── nN ──veth── eth0 172.29.I.N/24  netns skiffI-N (node N)
//!                                                           cbr0 172.30.N.1/24 (its engine's pod bridge)
//! ```
//!
//! The bridge sits in a namespace of its own rather than on the host: bridged traffic between
//! nodes then never meets the host's firewall (where br_netfilter and Docker's `FORWARD` policy
//! `DROP` would drop it), and nothing of the cluster but one veth is visible on the host. Nodes
//! have no default route: they reach each other and the host, nothing else.

use std::path::Path;

use anyhow::Context;

use crate::state::{self, CLUSTER_NETWORKS, ClusterState, NodeState, RUNTIME_ROOT};

/// Runs a command to completion; its standard error is the error's text when it fails.
pub(crate) async fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .with_context(|| format!("running {program}"))?;
    anyhow::ensure!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn ip(args: &[&str]) -> anyhow::Result<String> {
    run("ip", args).await
}

pub fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

fn host_link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// An exclusive lock on this machine's cluster networks, held while one is chosen and claimed.
struct AllocationLock {
    _file: std::fs::File,
}

impl AllocationLock {
    fn take() -> anyhow::Result<AllocationLock> {
        use std::os::fd::AsRawFd;
        std::fs::create_dir_all(RUNTIME_ROOT).with_context(|| format!("creating {RUNTIME_ROOT}"))?;
        let path = Path::new(RUNTIME_ROOT).join("allocation.lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        // SAFETY: flock on a descriptor we own; blocks until the lock is ours.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error()).with_context(|| format!("locking {}", path.display()));
        }
        Ok(AllocationLock { _file: file })
    }
}

/// The IPv4 prefixes the host routes or has addresses in (`ip -4 route` and `ip -4 addr`).
async fn host_prefixes() -> anyhow::Result<Vec<(u32, u8)>> {
    let routes = ip(&["-4", "route", "show", "table", "main"]).await?;
    let addrs = ip(&["-4", "-o", "addr", "show"]).await?;
    let mut out = Vec::new();
    let words = routes
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .chain(addrs.lines().filter_map(|l| {
            let mut it = l.split_whitespace();
            it.position(|w| w == "inet")?;
            it.next()
        }));
    for word in words {
        if let Some(p) = parse_prefix(word) {
            out.push(p);
        }
    }
    Ok(out)
}

fn parse_prefix(word: &str) -> Option<(u32, u8)> {
    let (addr, len) = word.split_once('/').unwrap_or((word, "32"));
    let addr: std::net::Ipv4Addr = addr.parse().ok()?;
    let len: u8 = len.parse().ok().filter(|l| *l <= 32)?;
    Some((u32::from(addr), len))
}

fn overlaps(a: (u32, u8), b: (u32, u8)) -> bool {
    let len = a.1.min(b.1);
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    a.0 & mask == b.0 & mask
}

/// The first /24 of 172.29.0.0/16 nothing on this host uses: no cluster's switch namespace, no
/// interface of that name, no route or address overlapping it (a default route aside).
fn free_index(taken: impl Fn(u8) -> bool, prefixes: &[(u32, u8)]) -> Option<u8> {
    (1..=254u8).find(|&i| {
        let net = (
            u32::from(std::net::Ipv4Addr::new(CLUSTER_NETWORKS[0], CLUSTER_NETWORKS[1], i, 0)),
            24,
        );
        !taken(i) && !prefixes.iter().any(|p| p.1 > 0 && overlaps(*p, net))
    })
}

/// Chooses the cluster's /24 and claims it by making its switch namespace, under the machine's
/// allocation lock, so that clusters created at the same time never share one.
pub async fn allocate() -> anyhow::Result<u8> {
    let _lock = tokio::task::spawn_blocking(AllocationLock::take)
        .await
        .context("waiting for the allocation lock")??;
    let prefixes = host_prefixes().await?;
    let index = free_index(
        |i| netns_exists(&state::tag(i)) || host_link_exists(&state::tag(i)),
        &prefixes,
    )
    .context("no free /24 left in 172.29.0.0/16 for a cluster network")?;
    ip(&["netns", "add", &state::tag(index)]).await?;
    Ok(index)
}

/// The switch: a bridge in the cluster's namespace, and the host's veth into it.
pub async fn create_switch(c: &ClusterState) -> anyhow::Result<()> {
    let sw = c.tag();
    let host_addr = format!("{}/24", c.host_ip());
    ip(&["-n", &sw, "link", "set", "lo", "up"]).await?;
    ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"]).await?;
    ip(&["-n", &sw, "link", "set", "br0", "up"]).await?;
    ip(&["link", "add", &sw, "type", "veth", "peer", "name", "host", "netns", &sw]).await?;
    ip(&["-n", &sw, "link", "set", "host", "master", "br0", "up"]).await?;
    ip(&["addr", "add", &host_addr, "dev", &sw]).await?;
    ip(&["link", "set", &sw, "up"]).await?;
    Ok(())
}

/// A node's namespace, plugged into the switch, with its address and its engine's pod bridge.
pub async fn create_node(c: &ClusterState, node: &NodeState) -> anyhow::Result<()> {
    let sw = c.tag();
    let ns = c.netns(node);
    let port = format!("n{}", node.index);
    let addr = format!("{}/24", c.node_ip(node));
    let bridge = c.pod_bridge(node);
    ip(&["netns", "add", &ns]).await?;
    ip(&[
        "-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns,
    ])
    .await?;
    ip(&["-n", &sw, "link", "set", &port, "master", "br0", "up"]).await?;
    ip(&["-n", &ns, "link", "set", "lo", "up"]).await?;
    ip(&["-n", &ns, "addr", "add", &addr, "dev", "eth0"]).await?;
    ip(&["-n", &ns, "link", "set", "eth0", "up"]).await?;
    ip(&["-n", &ns, "link", "add", "cbr0", "type", "bridge"]).await?;
    ip(&["-n", &ns, "addr", "add", &bridge, "dev", "cbr0"]).await?;
    ip(&["-n", &ns, "link", "set", "cbr0", "up"]).await?;
    Ok(())
}

/// Removes the nodes' namespaces (their interfaces, routes and nftables tables go with them),
/// the switch and the host's veth. What is already gone is skipped.
pub async fn remove(c: &ClusterState) -> anyhow::Result<()> {
    for node in &c.nodes {
        let ns = c.netns(node);
        if netns_exists(&ns) {
            ip(&["netns", "del", &ns]).await?;
        }
    }
    let sw = c.tag();
    // The veth would go with the switch's namespace, but only once the kernel gets to it.
    if host_link_exists(&sw) {
        ip(&["link", "del", &sw]).await?;
    }
    if netns_exists(&sw) {
        ip(&["netns", "del", &sw]).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_used_or_routed_slash24_is_skipped() {
        let p = |s: &str| parse_prefix(s).unwrap();
        // Nothing in the way: the first.
        assert_eq!(free_index(|_| false, &[p("0.0.0.0/0"), p("192.0.2.0/24")]), Some(1));
        // A cluster holds .1; a Docker network holds 172.29.2.0/24; an address sits in .3.
        let prefixes = [p("172.29.2.0/24"), p("172.29.3.9")];
        assert_eq!(free_index(|i| i == 1, &prefixes), Some(4));
        // A route over the whole /16 leaves nothing.
        assert_eq!(free_index(|_| false, &[p("172.16.0.0/12")]), None);
    }

    #[test]
    fn prefixes_parse_as_ip_prints_them() {
        assert_eq!(parse_prefix("10.0.0.0/8"), Some((0x0a00_0000, 8)));
        assert_eq!(parse_prefix("10.1.2.3"), Some((0x0a01_0203, 32)));
        assert_eq!(parse_prefix("default"), None);
        assert_eq!(parse_prefix("10.0.0.0/33"), None);
    }
}
