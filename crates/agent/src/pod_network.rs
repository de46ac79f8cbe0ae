//! The pod network of a node: its pods on a bridge holding the node's podCIDR, routes to every
//! other node's podCIDR through that node (host-gw, as flannel's and kindnet's), masquerade for
//! traffic leaving the cluster network, and the whole cluster CIDR kept on this machine.
//!
//! - When the Node has a podCIDR (the node IPAM controller's), pods go on a Docker bridge network
//!   of Skiff's own with that subnet, named after it (`skiff-10.244.0.0-24`), its gateway the
//!   subnet's first address, Docker's own masquerade off. A network of that name with that subnet
//!   is reused as it is: clusters sharing one engine may all have been given the same podCIDR,
//!   and Docker refuses overlapping subnets. The agent never removes it (containers of another
//!   agent, or of this one before a restart, may be on it). Without a podCIDR (IPAM off) pods stay
//!   on Docker's default `bridge` network.
//! - Routes: for every other node with a podCIDR whose InternalIP is on a directly connected
//!   subnet, `ip route replace PODCIDR via INTERNALIP proto 83`; routes of that protocol inside
//!   the cluster CIDR that no node wants any longer are deleted. A node reached only through a
//!   gateway is reached through VXLAN in the kernel instead, as flannel's `vxlan` backend: the
//!   device `skiff.vxlan` (VNI 1, UDP 8472, MTU 1450, no learning) from this node's InternalIP,
//!   the route `PODCIDR via PODCIDR-NETWORK dev skiff.vxlan onlink proto 83`, a permanent
//!   neighbour entry for that gateway and a forwarding entry to the node's InternalIP. Each
//!   device's MAC is `0a:58:` and its node's address, so no node has to publish its own.
//!   Simulated nodes are left out.
//! - Safety: before any pod starts, the whole cluster CIDR gets an `unreachable` route (protocol
//!   83), which the more specific routes (the local bridge's, other nodes') override, so an
//!   address of it that no node owns is refused here and never handed to a default gateway. The
//!   route stays when the agent stops, as the proxy's for the service range.
//! - Masquerade: `table ip skiff-pods` (`skiff-pods-A-B-C-D-LEN` for another cluster CIDR),
//!   applied with `nft -f -` all or nothing, masquerades what comes from the cluster CIDR and goes
//!   outside it; pod-to-pod traffic across nodes keeps its source address.
//! - Docker's FORWARD chain drops what it did not publish (its policy is DROP), which includes
//!   traffic routed in from other nodes, and what crosses from one of its networks to another:
//!   rules in `DOCKER-USER` accept what goes into the pod bridge for its subnet and what its pods
//!   send (Docker 20.10 has no routed gateway mode).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::time::Duration;

use anyhow::Context;
use bollard::Docker;
use bollard::models::{Ipam, IpamConfig, NetworkCreateRequest};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::watcher;

use crate::proxy::{Ipv4Cidr, NetworkNamespace, run_command, run_nft};

/// The routing protocol number Skiff marks its routes with (`proto 83`), so they are found again.
pub const ROUTE_PROTOCOL: u8 = 83;
/// The default cluster CIDR (`--cluster-cidr`), kubeadm's and flannel's.
pub const DEFAULT_CLUSTER_CIDR: Ipv4Cidr = Ipv4Cidr::from_network(Ipv4Addr::new(10, 244, 0, 0), 16);
/// The name of the masquerade table for the default cluster CIDR.
pub const TABLE: &str = "skiff-pods";
/// Docker's default network, where pods go when their node has no podCIDR.
pub const DOCKER_DEFAULT_NETWORK: &str = "bridge";
/// The annotation on nodes that `skiff sim` registers.
const SIMULATED_ANNOTATION: &str = "skiff.dev/simulated";
/// How often the routes are put back even when no Node changed.
const RESYNC: Duration = Duration::from_secs(60);

/// The Docker network pods are attached to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodNetwork {
    /// The Docker network's name (`bridge`, or `skiff-A.B.C.D-LEN`).
    pub name: String,
    pub subnet: Option<Ipv4Cidr>,
    pub gateway: Option<Ipv4Addr>,
    /// The Linux bridge behind it (`docker0`, `br-ID`).
    pub bridge: Option<String>,
    /// The cluster CIDR when the network holds the node's podCIDR; `None` on Docker's default.
    pub cluster_cidr: Option<Ipv4Cidr>,
}

/// The Docker network of the podCIDR `subnet`: `skiff-10.244.0.0-24`.
pub fn network_name(subnet: Ipv4Cidr) -> String {
    format!("skiff-{}-{}", subnet.network(), subnet.prefix_len())
}

/// The masquerade table of the cluster CIDR `cidr`: [`TABLE`] for the default,
/// `skiff-pods-A-B-C-D-LEN` otherwise.
pub fn table_name(cidr: Ipv4Cidr) -> String {
    if cidr == DEFAULT_CLUSTER_CIDR {
        return TABLE.to_string();
    }
    let [a, b, c, d] = cidr.network().octets();
    format!("{TABLE}-{a}-{b}-{c}-{d}-{}", cidr.prefix_len())
}

/// The first IPv4 podCIDR of a Node.
pub fn node_pod_cidr(node: &Node) -> Option<Ipv4Cidr> {
    let spec = node.spec.as_ref()?;
    let list = spec.pod_cidrs.iter().flatten();
    list.chain(spec.pod_cidr.iter()).find_map(|c| c.parse().ok())
}

fn internal_ip(node: &Node) -> Option<Ipv4Addr> {
    let addresses = node.status.as_ref()?.addresses.as_ref()?;
    addresses
        .iter()
        .filter(|a| a.type_ == "InternalIP")
        .find_map(|a| a.address.parse().ok())
}

fn is_simulated(node: &Node) -> bool {
    node.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.get(SIMULATED_ANNOTATION).is_some_and(|v| v == "true"))
}

/// Reads a Docker network: its IPv4 subnet and gateway, and its Linux bridge.
pub async fn inspect(docker: &Docker, name: &str) -> anyhow::Result<Option<PodNetwork>> {
    let network = match docker.inspect_network(name, None).await {
        Ok(n) => n,
        Err(e) if crate::docker::is_not_found(&e) => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("inspecting the Docker network {name:?}")),
    };
    let config = network.ipam.and_then(|i| i.config).unwrap_or_default();
    // Docker's default network names no gateway in its IPAM configuration: the bridge has the
    // subnet's first address, as Docker gives it.
    let v4 = config.iter().find_map(|c| {
        let subnet: Ipv4Cidr = c.subnet.as_deref()?.parse().ok()?;
        let gateway = c.gateway.as_deref().and_then(|g| g.parse::<Ipv4Addr>().ok());
        Some((subnet, gateway.unwrap_or(subnet.nth(1))))
    });
    let named = network
        .options
        .as_ref()
        .and_then(|o| o.get("com.docker.network.bridge.name").cloned());
    // A bridge network without a name of its own gets `br-` and the first 12 digits of its id.
    let bridge = named.or_else(|| {
        let id = network.id.as_deref()?;
        (network.driver.as_deref() == Some("bridge") && id.len() >= 12).then(|| format!("br-{}", &id[..12]))
    });
    Ok(Some(PodNetwork {
        name: name.to_string(),
        subnet: v4.map(|(s, _)| s),
        gateway: v4.map(|(_, g)| g),
        bridge,
        cluster_cidr: None,
    }))
}

/// The Docker network for the podCIDR `subnet`, created unless one of its name exists with that
/// subnet (another agent's on this engine, or this one's before a restart).
pub async fn ensure_docker_network(docker: &Docker, subnet: Ipv4Cidr) -> anyhow::Result<PodNetwork> {
    let name = network_name(subnet);
    if let Some(existing) = inspect(docker, &name).await? {
        anyhow::ensure!(
            existing.subnet == Some(subnet),
            "the Docker network {name} exists with the subnet {:?}, not {subnet}",
            existing.subnet.map(|s| s.to_string())
        );
        return Ok(existing);
    }
    let request = NetworkCreateRequest {
        name: name.clone(),
        driver: Some("bridge".into()),
        ipam: Some(Ipam {
            config: Some(vec![IpamConfig {
                subnet: Some(subnet.to_string()),
                gateway: Some(subnet.nth(1).to_string()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        options: Some(HashMap::from([(
            "com.docker.network.bridge.enable_ip_masquerade".to_string(),
            "false".to_string(),
        )])),
        labels: Some(HashMap::from([("io.skiff.pod-cidr".to_string(), subnet.to_string())])),
        ..Default::default()
    };
    if let Err(e) = docker.create_network(request).await {
        // Another agent may have made it meanwhile: take it if it is as wanted.
        tracing::debug!(network = %name, error = %e, "creating the pod network");
        let made = inspect(docker, &name).await?;
        return match made {
            Some(n) if n.subnet == Some(subnet) => Ok(n),
            _ => Err(e).with_context(|| format!("creating the Docker network {name} ({subnet})")),
        };
    }
    tracing::info!(network = %name, subnet = %subnet, "created the pod network");
    inspect(docker, &name)
        .await?
        .with_context(|| format!("the Docker network {name} is gone just after its creation"))
}

/// Routes the whole cluster CIDR here: `ip route replace unreachable CIDR proto 83`. More
/// specific routes (the pod bridge's, other nodes') win; any other address of the range is
/// refused at once instead of going to a default gateway.
pub async fn ensure_cluster_cidr_route(netns: &NetworkNamespace, cidr: Ipv4Cidr) -> anyhow::Result<()> {
    let mut command = netns.command("ip");
    command.args([
        "-4",
        "route",
        "replace",
        "unreachable",
        &cidr.to_string(),
        "proto",
        &ROUTE_PROTOCOL.to_string(),
    ]);
    run_command(command, None, "ip route replace unreachable")
        .await
        .with_context(|| format!("routing the cluster CIDR {cidr} locally"))
        .map(drop)
}

/// The masquerade table's transaction: created afresh, all or nothing.
pub fn masquerade_ruleset(cluster_cidr: Ipv4Cidr) -> String {
    let table = table_name(cluster_cidr);
    format!(
        "add table ip {table}\n\
         delete table ip {table}\n\
         add table ip {table}\n\
         add chain ip {table} nat-postrouting {{ type nat hook postrouting priority 100 ; policy accept ; }}\n\
         add rule ip {table} nat-postrouting ip saddr {cluster_cidr} ip daddr != {cluster_cidr} masquerade comment \"pod traffic leaving the cluster network\"\n"
    )
}

/// Writes the masquerade table.
pub async fn apply_masquerade(netns: &NetworkNamespace, cluster_cidr: Ipv4Cidr) -> anyhow::Result<()> {
    run_nft(netns, &masquerade_ruleset(cluster_cidr))
        .await
        .context("writing the pod network's masquerade table")
}

/// The `DOCKER-USER` rules of a pod bridge: what is routed into it for its subnet (from other
/// nodes, or pods left on another Docker network) is accepted, and so is what its pods send, past
/// Docker's isolation of its networks from each other (pods that ran on Docker's default network
/// before the node had a podCIDR keep reaching the new ones, and these them).
fn forwarding_rules(bridge: &str, subnet: Ipv4Cidr) -> [Vec<String>; 2] {
    let rule = |direction: &str, address: &str, comment: &str| {
        [
            direction,
            bridge,
            address,
            &subnet.to_string(),
            "-m",
            "comment",
            "--comment",
            comment,
            "-j",
            "ACCEPT",
        ]
        .map(str::to_string)
        .to_vec()
    };
    [
        rule("-o", "-d", "skiff: traffic to the node's pods"),
        rule("-i", "-s", "skiff: traffic from the node's pods"),
    ]
}

/// Lets traffic into and out of the pod bridge past Docker's FORWARD chain (policy DROP, and its
/// isolation of networks from each other): [`forwarding_rules`] at the head of `DOCKER-USER`,
/// each added once. Without Docker's chains (no Docker, or `iptables: false`) there is nothing to
/// let past.
pub async fn allow_forwarding(netns: &NetworkNamespace, bridge: &str, subnet: Ipv4Cidr) -> anyhow::Result<()> {
    let mut list = netns.command("iptables");
    list.args(["-w", "-S", "DOCKER-USER"]);
    if run_command(list, None, "iptables -S DOCKER-USER").await.is_err() {
        tracing::debug!("no DOCKER-USER chain: nothing to let past");
        return Ok(());
    }
    for rule in forwarding_rules(bridge, subnet) {
        let mut check = netns.command("iptables");
        check.args(["-w", "-C", "DOCKER-USER"]).args(&rule);
        if run_command(check, None, "iptables -C").await.is_ok() {
            continue;
        }
        let mut insert = netns.command("iptables");
        insert.args(["-w", "-I", "DOCKER-USER", "1"]).args(&rule);
        run_command(insert, None, "iptables -I DOCKER-USER")
            .await
            .context("accepting pod traffic in DOCKER-USER")?;
    }
    Ok(())
}

/// Removes [`forwarding_rules`] of `bridge` from `DOCKER-USER` (each as often as it is there);
/// returns how many went.
pub async fn disallow_forwarding(netns: &NetworkNamespace, bridge: &str, subnet: Ipv4Cidr) -> anyhow::Result<usize> {
    let mut list = netns.command("iptables");
    list.args(["-w", "-S", "DOCKER-USER"]);
    if run_command(list, None, "iptables -S DOCKER-USER").await.is_err() {
        return Ok(0);
    }
    let mut removed = 0;
    for rule in forwarding_rules(bridge, subnet) {
        loop {
            let mut delete = netns.command("iptables");
            delete.args(["-w", "-D", "DOCKER-USER"]).args(&rule);
            if run_command(delete, None, "iptables -D DOCKER-USER").await.is_err() {
                break;
            }
            removed += 1;
        }
    }
    Ok(removed)
}

/// Sets up the pod network for a node whose podCIDR is `pod_cidr`: the cluster CIDR's route, the
/// Docker network, masquerade, and forwarding into the bridge. Only the network itself is
/// required; the rest is logged when it fails.
pub async fn setup(docker: &Docker, pod_cidr: Ipv4Cidr, cluster_cidr: Ipv4Cidr) -> anyhow::Result<PodNetwork> {
    let netns = NetworkNamespace::Current;
    if let Err(e) = ensure_cluster_cidr_route(&netns, cluster_cidr).await {
        tracing::error!(error = %format!("{e:#}"), "the cluster CIDR is not routed locally");
    }
    let mut network = ensure_docker_network(docker, pod_cidr).await?;
    network.cluster_cidr = Some(cluster_cidr);
    if let Err(e) = apply_masquerade(&netns, cluster_cidr).await {
        tracing::error!(error = %format!("{e:#}"), "pod traffic leaving the cluster is not masqueraded");
    }
    if let Some(bridge) = &network.bridge
        && let Err(e) = allow_forwarding(&netns, bridge, pod_cidr).await
    {
        tracing::warn!(error = %format!("{e:#}"), "traffic from other nodes' pods may be dropped by Docker's FORWARD chain");
    }
    tracing::info!(network = %network.name, subnet = %pod_cidr, cluster_cidr = %cluster_cidr, "pods go on the node's podCIDR");
    Ok(network)
}

/// Waits up to `wait` for the Node `name` to have a podCIDR.
pub async fn wait_for_pod_cidr(client: &kube::Client, name: &str, wait: Duration) -> Option<Ipv4Cidr> {
    let api = Api::<Node>::all(client.clone());
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match api.get_opt(name).await {
            Ok(Some(node)) => {
                if let Some(cidr) = node_pod_cidr(&node) {
                    return Some(cidr);
                }
            }
            Ok(None) => {}
            Err(e) => tracing::debug!(error = %e, "reading the node's podCIDR"),
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The routes this node wants: every other node's podCIDR (inside the cluster CIDR) through its
/// InternalIP.
pub fn desired_routes<'a>(
    nodes: impl IntoIterator<Item = &'a Node>,
    self_name: &str,
    cluster_cidr: Ipv4Cidr,
) -> BTreeMap<Ipv4Cidr, Ipv4Addr> {
    nodes
        .into_iter()
        .filter(|n| n.metadata.name.as_deref() != Some(self_name) && !is_simulated(n))
        .filter_map(|n| {
            let cidr = node_pod_cidr(n)?;
            (cluster_cidr.covers(&cidr) && cidr != cluster_cidr).then_some((cidr, internal_ip(n)?))
        })
        .collect()
}

/// Skiff's routes now in the main table: destination and gateway (`None` for the cluster
/// CIDR's `unreachable` route).
async fn current_routes(netns: &NetworkNamespace) -> anyhow::Result<Vec<(Ipv4Cidr, Option<Ipv4Addr>)>> {
    let mut command = netns.command("ip");
    command.args(["-4", "route", "show", "proto", &ROUTE_PROTOCOL.to_string()]);
    let text = run_command(command, None, "ip route show").await?;
    Ok(parse_routes(&text))
}

fn parse_routes(text: &str) -> Vec<(Ipv4Cidr, Option<Ipv4Addr>)> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace().peekable();
            if matches!(words.peek(), Some(&("unreachable" | "blackhole" | "prohibit"))) {
                words.next();
            }
            let dst: Ipv4Cidr = words.next()?.parse().ok()?;
            let rest: Vec<&str> = words.collect();
            let via = rest
                .iter()
                .position(|w| *w == "via")
                .and_then(|i| rest.get(i + 1))
                .and_then(|g| g.parse().ok());
            Some((dst, via))
        })
        .collect()
}

/// Whether `ip` is on a subnet this namespace is directly connected to (not local, no gateway).
/// Whether `ip` is an address of this machine (its route is `local`).
async fn is_local_address(netns: &NetworkNamespace, ip: Ipv4Addr) -> bool {
    let mut command = netns.command("ip");
    command.args(["-4", "route", "get", &ip.to_string()]);
    match run_command(command, None, "ip route get").await {
        Ok(route) => route.lines().next().unwrap_or_default().starts_with("local "),
        Err(_) => false,
    }
}

/// Whether the main table holds a route for exactly `cidr` that is not Skiff's (protocol 83).
async fn has_foreign_route(netns: &NetworkNamespace, cidr: Ipv4Cidr) -> bool {
    let mut command = netns.command("ip");
    command.args(["-4", "route", "show", "exact", &cidr.to_string()]);
    match run_command(command, None, "ip route show exact").await {
        Ok(routes) => routes
            .lines()
            .any(|l| !l.trim().is_empty() && !l.contains(&format!(" proto {ROUTE_PROTOCOL}"))),
        Err(_) => false,
    }
}

async fn directly_connected(netns: &NetworkNamespace, ip: Ipv4Addr) -> bool {
    let mut command = netns.command("ip");
    command.args(["-4", "route", "get", &ip.to_string()]);
    match run_command(command, None, "ip route get").await {
        Ok(route) => {
            let first = route.lines().next().unwrap_or_default();
            !first.starts_with("local ") && !first.contains(" via ") && first.contains(" dev ")
        }
        Err(_) => false,
    }
}

/// The VXLAN device carrying pod traffic to nodes reached through a gateway.
pub const VXLAN_DEVICE: &str = "skiff.vxlan";
/// Its VNI and UDP port (flannel's defaults).
const VXLAN_ID: &str = "1";
const VXLAN_PORT: &str = "8472";

/// The VXLAN device's MAC address on the node whose InternalIP is `ip`: `0a:58:` and the address,
/// so every node knows every other's without publishing it.
pub fn vtep_mac(ip: Ipv4Addr) -> String {
    let [a, b, c, d] = ip.octets();
    format!("0a:58:{a:02x}:{b:02x}:{c:02x}:{d:02x}")
}

async fn run_ip(netns: &NetworkNamespace, program: &str, args: &[&str], what: &str) -> anyhow::Result<String> {
    let mut command = netns.command(program);
    command.args(args);
    run_command(command, None, what).await
}

/// Makes the VXLAN device (VNI 1, UDP 8472, from `local`, no learning: the agent writes its
/// forwarding and neighbour entries), unless it is there.
async fn ensure_vxlan(netns: &NetworkNamespace, local: Ipv4Addr) -> anyhow::Result<()> {
    if run_ip(netns, "ip", &["link", "show", VXLAN_DEVICE], "ip link show")
        .await
        .is_ok()
    {
        return Ok(());
    }
    let mac = vtep_mac(local);
    let local = local.to_string();
    run_ip(
        netns,
        "ip",
        &[
            "link",
            "add",
            VXLAN_DEVICE,
            "type",
            "vxlan",
            "id",
            VXLAN_ID,
            "local",
            &local,
            "dstport",
            VXLAN_PORT,
            "nolearning",
        ],
        "ip link add vxlan",
    )
    .await?;
    run_ip(
        netns,
        "ip",
        &["link", "set", VXLAN_DEVICE, "address", &mac, "mtu", "1450", "up"],
        "ip link set vxlan",
    )
    .await
    .map(drop)
}

/// Routes `cidr` into the VXLAN towards the node at `remote`: its gateway is the podCIDR's network
/// address, whose neighbour entry is the remote device's MAC, forwarded to `remote`.
async fn route_through_vxlan(netns: &NetworkNamespace, cidr: Ipv4Cidr, remote: Ipv4Addr) -> anyhow::Result<()> {
    let gateway = cidr.network().to_string();
    let mac = vtep_mac(remote);
    let remote = remote.to_string();
    run_ip(
        netns,
        "ip",
        &[
            "neigh",
            "replace",
            &gateway,
            "lladdr",
            &mac,
            "dev",
            VXLAN_DEVICE,
            "nud",
            "permanent",
        ],
        "ip neigh replace",
    )
    .await?;
    run_ip(
        netns,
        "bridge",
        &[
            "fdb",
            "replace",
            &mac,
            "dev",
            VXLAN_DEVICE,
            "dst",
            &remote,
            "self",
            "permanent",
        ],
        "bridge fdb replace",
    )
    .await?;
    run_ip(
        netns,
        "ip",
        &[
            "-4",
            "route",
            "replace",
            &cidr.to_string(),
            "via",
            &gateway,
            "dev",
            VXLAN_DEVICE,
            "onlink",
            "proto",
            &ROUTE_PROTOCOL.to_string(),
        ],
        "ip route replace",
    )
    .await
    .map(drop)
}

/// Makes Skiff's routes inside `cluster_cidr` those of `desired`: through the node's InternalIP
/// when it is on a directly connected subnet, else through VXLAN from `local` (this node's
/// InternalIP; without it such nodes get no route). Returns the podCIDRs left without a route.
pub async fn sync_routes(
    netns: &NetworkNamespace,
    cluster_cidr: Ipv4Cidr,
    desired: &BTreeMap<Ipv4Cidr, Ipv4Addr>,
    local: Option<Ipv4Addr>,
) -> anyhow::Result<Vec<Ipv4Cidr>> {
    let mut unrouted = Vec::new();
    let mut wanted = BTreeSet::new();
    for (cidr, via) in desired {
        // A node on this very machine (its InternalIP is one of ours: several agents on one
        // host) has its podCIDR on a bridge here already; and a route Skiff did not make (a
        // local bridge's) is never replaced, or this machine would lose its own pods.
        if is_local_address(netns, *via).await || has_foreign_route(netns, *cidr).await {
            continue;
        }
        if !directly_connected(netns, *via).await {
            let Some(local) = local else {
                unrouted.push(*cidr);
                continue;
            };
            ensure_vxlan(netns, local).await.context("making the VXLAN device")?;
            route_through_vxlan(netns, *cidr, *via)
                .await
                .with_context(|| format!("routing {cidr} through VXLAN to {via}"))?;
            wanted.insert(*cidr);
            continue;
        }
        let mut command = netns.command("ip");
        command.args([
            "-4",
            "route",
            "replace",
            &cidr.to_string(),
            "via",
            &via.to_string(),
            "proto",
            &ROUTE_PROTOCOL.to_string(),
        ]);
        run_command(command, None, "ip route replace")
            .await
            .with_context(|| format!("routing {cidr} via {via}"))?;
        wanted.insert(*cidr);
    }
    for (dst, via) in current_routes(netns).await? {
        // The cluster CIDR's own route stays; so does anything outside the cluster CIDR.
        if via.is_none() || dst == cluster_cidr || !cluster_cidr.covers(&dst) || wanted.contains(&dst) {
            continue;
        }
        let dst_text = dst.to_string();
        let proto = ROUTE_PROTOCOL.to_string();
        let del = ["-4", "route", "del", dst_text.as_str(), "proto", proto.as_str()];
        if let Err(e) = run_ip(netns, "ip", &del, "ip route del").await {
            tracing::warn!(route = %dst, error = %format!("{e:#}"), "removing a route of a node that is gone");
        }
        // A VXLAN route's neighbour entry goes with it (its forwarding entry is replaced when the
        // address is used again).
        if via == Some(dst.network()) {
            let gateway = dst.network().to_string();
            let _ = run_ip(
                netns,
                "ip",
                &["neigh", "del", &gateway, "dev", VXLAN_DEVICE],
                "ip neigh del",
            )
            .await;
        }
    }
    Ok(unrouted)
}

/// Keeps this node's routes to the other nodes' podCIDRs as the Nodes change (a watch on all
/// Nodes), checking them again every minute.
pub async fn run_routes(
    client: kube::Client,
    self_name: String,
    cluster_cidr: Ipv4Cidr,
    local: Option<Ipv4Addr>,
    netns: NetworkNamespace,
) {
    let mut stream = watcher::watcher(Api::<Node>::all(client), watcher::Config::default()).boxed();
    let mut nodes: HashMap<String, Node> = HashMap::new();
    let mut listing: HashMap<String, Node> = HashMap::new();
    let mut synced = false;
    let mut applied: Option<BTreeMap<Ipv4Cidr, Ipv4Addr>> = None;
    let mut unrouted_logged: BTreeSet<Ipv4Cidr> = BTreeSet::new();
    let mut resync = tokio::time::interval(RESYNC);
    loop {
        let event = tokio::select! {
            event = stream.next() => match event {
                Some(event) => Some(event),
                None => return,
            },
            _ = resync.tick() => None,
        };
        match event {
            Some(Ok(watcher::Event::Init)) => listing.clear(),
            Some(Ok(watcher::Event::InitApply(node))) => {
                if let Some(name) = node.metadata.name.clone() {
                    listing.insert(name, node);
                }
                continue;
            }
            Some(Ok(watcher::Event::InitDone)) => {
                nodes = std::mem::take(&mut listing);
                synced = true;
            }
            Some(Ok(watcher::Event::Apply(node))) => {
                if let Some(name) = node.metadata.name.clone() {
                    nodes.insert(name, node);
                }
            }
            Some(Ok(watcher::Event::Delete(node))) => {
                if let Some(name) = &node.metadata.name {
                    nodes.remove(name);
                }
            }
            Some(Err(e)) => {
                tracing::debug!(error = %e, "pod network: node watch error");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            // The periodic check: apply again even if nothing changed.
            None => applied = None,
        }
        if !synced {
            continue;
        }
        let desired = desired_routes(nodes.values(), &self_name, cluster_cidr);
        if applied.as_ref() == Some(&desired) {
            continue;
        }
        match sync_routes(&netns, cluster_cidr, &desired, local).await {
            Ok(unrouted) => {
                for cidr in &unrouted {
                    if unrouted_logged.insert(*cidr) {
                        tracing::warn!(pod_cidr = %cidr, via = %desired[cidr], "a node's InternalIP is not on a directly connected subnet and this node has no IPv4 InternalIP for VXLAN: its pods are not reachable from here");
                    }
                }
                applied = Some(desired);
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "syncing the routes to other nodes' pods");
                applied = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, cidr: Option<&str>, ip: &str, simulated: bool) -> Node {
        let mut v = json!({
            "metadata": {"name": name},
            "spec": {},
            "status": {"addresses": [{"type": "Hostname", "address": name}, {"type": "InternalIP", "address": ip}]}
        });
        if let Some(c) = cidr {
            v["spec"] = json!({"podCIDR": c, "podCIDRs": [c]});
        }
        if simulated {
            v["metadata"]["annotations"] = json!({SIMULATED_ANNOTATION: "true"});
        }
        serde_json::from_value(v).expect("a Node")
    }

    #[test]
    fn names_follow_the_subnet_and_the_cluster_cidr() {
        assert_eq!(
            network_name("10.244.0.0/24".parse().expect("cidr")),
            "skiff-10.244.0.0-24"
        );
        assert_eq!(table_name(DEFAULT_CLUSTER_CIDR), "skiff-pods");
        assert_eq!(
            table_name("10.200.0.0/16".parse().expect("cidr")),
            "skiff-pods-10-200-0-0-16"
        );
        let text = masquerade_ruleset(DEFAULT_CLUSTER_CIDR);
        assert!(
            text.contains("ip saddr 10.244.0.0/16 ip daddr != 10.244.0.0/16 masquerade"),
            "{text}"
        );
        assert!(
            text.starts_with("add table ip skiff-pods\ndelete table ip skiff-pods\n"),
            "{text}"
        );
    }

    #[test]
    fn routes_go_to_every_other_real_node_with_a_pod_cidr() {
        let nodes = [
            node("me", Some("10.244.0.0/24"), "192.168.1.1", false),
            node("b", Some("10.244.1.0/24"), "192.168.1.2", false),
            node("sim", Some("10.244.2.0/24"), "192.168.1.3", true),
            node("new", None, "192.168.1.4", false),
            node("elsewhere", Some("10.99.0.0/24"), "192.168.1.5", false),
        ];
        let routes = desired_routes(&nodes, "me", DEFAULT_CLUSTER_CIDR);
        assert_eq!(
            routes,
            BTreeMap::from([("10.244.1.0/24".parse().expect("cidr"), Ipv4Addr::new(192, 168, 1, 2))])
        );
    }

    #[test]
    fn route_listings_parse() {
        let routes =
            parse_routes("unreachable 10.244.0.0/16 proto 83 \n10.244.1.0/24 via 192.168.1.2 dev eth0 proto 83 \n");
        assert_eq!(
            routes,
            [
                ("10.244.0.0/16".parse().expect("cidr"), None),
                (
                    "10.244.1.0/24".parse().expect("cidr"),
                    Some(Ipv4Addr::new(192, 168, 1, 2))
                )
            ]
        );
    }

    // Kernel tests: inside network namespaces of their own, never the host's.

    use std::process::{Child, Command, Stdio};
    use std::time::Instant;

    const RANGES_STAY_LOCAL: &str = "/work/shared/tools/ranges-stay-local.sh";

    /// A network namespace, deleted when dropped.
    struct Netns(String);

    impl Netns {
        fn create(tag: &str) -> Option<Netns> {
            let name = format!("skiff-pn-{tag}-{:08x}", rand::random::<u32>());
            let ok = Command::new("ip")
                .args(["netns", "add", &name])
                .status()
                .ok()?
                .success();
            ok.then(|| {
                let ns = Netns(name);
                ns.run(&["ip", "link", "set", "lo", "up"]);
                ns
            })
        }

        fn netns(&self) -> NetworkNamespace {
            NetworkNamespace::Named(self.0.clone())
        }

        fn output(&self, args: &[&str]) -> std::process::Output {
            Command::new("ip")
                .args(["netns", "exec", &self.0])
                .args(args)
                .stdin(Stdio::null())
                .output()
                .expect("running ip netns exec")
        }

        fn run(&self, args: &[&str]) -> String {
            let out = self.output(args);
            assert!(
                out.status.success(),
                "{args:?} in {}: {}",
                self.0,
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        }

        /// A TCP server on 8080 answering each connection with the client's address.
        fn serve_peer_address(&self) -> Child {
            let program = "import socket\n\
                s = socket.socket()\n\
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
                s.bind(('0.0.0.0', 8080))\n\
                s.listen(16)\n\
                while True:\n    c, a = s.accept()\n    c.sendall(a[0].encode() + b'\\n')\n    c.close()\n";
            Command::new("ip")
                .args(["netns", "exec", &self.0, "python3", "-c", program])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("starting python3")
        }

        /// What `ip:8080` answers (the address it saw), or the client's error.
        fn ask(&self, ip: &str) -> Result<String, String> {
            let program = format!(
                "import socket\ns = socket.create_connection(('{ip}', 8080), timeout=2)\nprint(s.recv(64).decode().strip())\n"
            );
            let out = self.output(&["python3", "-c", &program]);
            if out.status.success() {
                Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
            } else {
                Err(String::from_utf8_lossy(&out.stderr)
                    .trim()
                    .lines()
                    .last()
                    .unwrap_or_default()
                    .to_string())
            }
        }

        fn ask_until(&self, ip: &str, want: &str) {
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                let got = self.ask(ip);
                if got.as_deref() == Ok(want) {
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "{ip} from {}: {got:?}, wanted {want}",
                    self.0
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    impl Drop for Netns {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }

    /// A node namespace with a bridge holding `gateway/24` and one pod namespace on it at `pod`.
    fn pod_on_bridge(node: &Netns, pod: &Netns, gateway: &str, pod_ip: &str) {
        node.run(&["ip", "link", "add", "cbr0", "type", "bridge"]);
        node.run(&["ip", "addr", "add", &format!("{gateway}/24"), "dev", "cbr0"]);
        node.run(&["ip", "link", "set", "cbr0", "up"]);
        node.run(&[
            "ip", "link", "add", "vpod", "type", "veth", "peer", "name", "eth0", "netns", &pod.0,
        ]);
        node.run(&["ip", "link", "set", "vpod", "master", "cbr0", "up"]);
        node.run(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        pod.run(&["ip", "addr", "add", &format!("{pod_ip}/24"), "dev", "eth0"]);
        pod.run(&["ip", "link", "set", "eth0", "up"]);
        pod.run(&["ip", "route", "add", "default", "via", gateway]);
    }

    /// Two nodes joined by a veth (192.168.77.1 and .2), each with a pod on its podCIDR
    /// (10.244.1.0/24, 10.244.2.0/24), and an outside host (198.51.100.2) behind node a that
    /// knows no route to the pods: the route sync from Node objects carries pod traffic across
    /// with its source kept, and only traffic leaving the cluster CIDR is masqueraded.
    #[tokio::test]
    async fn kernel_routes_carry_pod_traffic_between_nodes_and_masquerade_only_leaving_it() {
        let Some(a) = Netns::create("a") else {
            eprintln!("SKIPPED: `ip netns add` is not permitted here");
            return;
        };
        let b = Netns::create("b").expect("a namespace");
        let pod_a = Netns::create("pa").expect("a namespace");
        let pod_b = Netns::create("pb").expect("a namespace");
        let out = Netns::create("out").expect("a namespace");
        a.run(&[
            "ip", "link", "add", "eth-ab", "type", "veth", "peer", "name", "eth-ba", "netns", &b.0,
        ]);
        a.run(&["ip", "addr", "add", "192.168.77.1/24", "dev", "eth-ab"]);
        a.run(&["ip", "link", "set", "eth-ab", "up"]);
        b.run(&["ip", "addr", "add", "192.168.77.2/24", "dev", "eth-ba"]);
        b.run(&["ip", "link", "set", "eth-ba", "up"]);
        a.run(&[
            "ip", "link", "add", "uplink", "type", "veth", "peer", "name", "eth0", "netns", &out.0,
        ]);
        a.run(&["ip", "addr", "add", "198.51.100.1/24", "dev", "uplink"]);
        a.run(&["ip", "link", "set", "uplink", "up"]);
        out.run(&["ip", "addr", "add", "198.51.100.2/24", "dev", "eth0"]);
        out.run(&["ip", "link", "set", "eth0", "up"]);
        pod_on_bridge(&a, &pod_a, "10.244.1.1", "10.244.1.2");
        pod_on_bridge(&b, &pod_b, "10.244.2.1", "10.244.2.2");
        let _servers = Servers(vec![pod_b.serve_peer_address(), out.serve_peer_address()]);

        let nodes = vec![
            node("a", Some("10.244.1.0/24"), "192.168.77.1", false),
            node("b", Some("10.244.2.0/24"), "192.168.77.2", false),
            // Reached only through a gateway, and no local address for VXLAN: no route.
            node("far", Some("10.244.3.0/24"), "203.0.113.9", false),
        ];
        for (me, ns) in [("a", &a), ("b", &b)] {
            ensure_cluster_cidr_route(&ns.netns(), DEFAULT_CLUSTER_CIDR)
                .await
                .expect("the cluster CIDR's route");
            apply_masquerade(&ns.netns(), DEFAULT_CLUSTER_CIDR)
                .await
                .expect("the masquerade table");
            let desired = desired_routes(&nodes, me, DEFAULT_CLUSTER_CIDR);
            let unrouted = sync_routes(&ns.netns(), DEFAULT_CLUSTER_CIDR, &desired, None)
                .await
                .expect("the routes");
            assert_eq!(unrouted, ["10.244.3.0/24".parse::<Ipv4Cidr>().expect("cidr")]);
        }
        let routes = a.run(&["ip", "-4", "route", "show", "proto", "83"]);
        assert!(routes.contains("unreachable 10.244.0.0/16"), "{routes}");
        assert!(routes.contains("10.244.2.0/24 via 192.168.77.2 dev eth-ab"), "{routes}");

        // Pod to pod across the nodes: the source is the pod's own address.
        pod_a.ask_until("10.244.2.2", "10.244.1.2");
        // Pod to outside the cluster CIDR: masqueraded to node a's address.
        pod_a.ask_until("198.51.100.2", "198.51.100.1");
        // An address of the range that no node owns is refused here, routed nowhere.
        let route = a.output(&["ip", "route", "get", "10.244.99.9"]);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&route.stdout),
            String::from_utf8_lossy(&route.stderr)
        );
        assert!(!text.contains(" via "), "{text}");
        let refused = pod_a.ask("10.244.99.9");
        assert!(
            refused.as_ref().is_err_and(|e| e.contains("No route to host")),
            "{refused:?}"
        );
        if std::path::Path::new(RANGES_STAY_LOCAL).exists() {
            let check = a.output(&[RANGES_STAY_LOCAL, "10.244.0.0/16"]);
            assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stdout));
        }

        // Node b goes: its route goes with it, and its pods' addresses are refused.
        let desired = desired_routes(&nodes[..1], "a", DEFAULT_CLUSTER_CIDR);
        sync_routes(&a.netns(), DEFAULT_CLUSTER_CIDR, &desired, None)
            .await
            .expect("the routes");
        let routes = a.run(&["ip", "-4", "route", "show", "proto", "83"]);
        assert_eq!(routes.trim(), "unreachable 10.244.0.0/16", "{routes}");
        let refused = pod_a.ask("10.244.2.2");
        assert!(
            refused.as_ref().is_err_and(|e| e.contains("No route to host")),
            "{refused:?}"
        );
    }

    /// Two nodes on different subnets joined by a router that knows nothing of the pods: the
    /// route sync carries pod traffic through VXLAN, the source kept.
    /// Several agents on one machine: a node whose InternalIP is this machine's own gets no
    /// route (its podCIDR is on a bridge here), and a route Skiff did not make (that bridge's) is
    /// never replaced, whoever claims its podCIDR.
    #[tokio::test]
    async fn kernel_nodes_on_this_machine_never_take_a_local_bridges_route() {
        let Some(host) = Netns::create("lh") else {
            eprintln!("SKIPPED: `ip netns add` is not permitted here");
            return;
        };
        let pod = Netns::create("lp").expect("a namespace");
        pod_on_bridge(&host, &pod, "10.244.0.1", "10.244.0.2");
        host.run(&["ip", "link", "add", "up0", "type", "veth", "peer", "name", "up0p"]);
        host.run(&["ip", "addr", "add", "192.168.78.1/24", "dev", "up0"]);
        host.run(&["ip", "link", "set", "up0p", "up"]);
        host.run(&["ip", "link", "set", "up0", "up"]);
        let bridge_route = || host.run(&["ip", "-4", "route", "show", "exact", "10.244.0.0/24"]);
        let before = bridge_route();
        assert!(
            before.contains("dev cbr0") && before.contains("proto kernel"),
            "{before}"
        );
        for via in ["192.168.78.1", "192.168.78.2"] {
            let desired = BTreeMap::from([("10.244.0.0/24".parse().expect("cidr"), via.parse().expect("address"))]);
            sync_routes(&host.netns(), DEFAULT_CLUSTER_CIDR, &desired, None)
                .await
                .expect("route sync");
            assert_eq!(bridge_route(), before, "through {via}");
        }
        // A node on this machine with a podCIDR of its own gets no route through itself.
        let desired = BTreeMap::from([(
            "10.244.1.0/24".parse().expect("cidr"),
            "192.168.78.1".parse().expect("address"),
        )]);
        sync_routes(
            &host.netns(),
            DEFAULT_CLUSTER_CIDR,
            &desired,
            Some("192.168.78.1".parse().expect("address")),
        )
        .await
        .expect("route sync");
        let routes = host.run(&["ip", "-4", "route", "show", "proto", "83"]);
        assert!(!routes.contains("10.244.1.0/24"), "{routes}");
    }

    #[tokio::test]
    async fn kernel_nodes_behind_a_router_reach_each_others_pods_through_vxlan() {
        let Some(a) = Netns::create("va") else {
            eprintln!("SKIPPED: `ip netns add` is not permitted here");
            return;
        };
        let b = Netns::create("vb").expect("a namespace");
        let router = Netns::create("vr").expect("a namespace");
        let pod_a = Netns::create("vpa").expect("a namespace");
        let pod_b = Netns::create("vpb").expect("a namespace");
        for (node, net) in [(&a, "10"), (&b, "20")] {
            router.run(&[
                "ip",
                "link",
                "add",
                &format!("r{net}"),
                "type",
                "veth",
                "peer",
                "name",
                "up0",
                "netns",
                &node.0,
            ]);
            router.run(&[
                "ip",
                "addr",
                "add",
                &format!("192.168.{net}.1/24"),
                "dev",
                &format!("r{net}"),
            ]);
            router.run(&["ip", "link", "set", &format!("r{net}"), "up"]);
            node.run(&["ip", "addr", "add", &format!("192.168.{net}.2/24"), "dev", "up0"]);
            node.run(&["ip", "link", "set", "up0", "up"]);
            node.run(&["ip", "route", "add", "default", "via", &format!("192.168.{net}.1")]);
        }
        router.run(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        pod_on_bridge(&a, &pod_a, "10.244.1.1", "10.244.1.2");
        pod_on_bridge(&b, &pod_b, "10.244.2.1", "10.244.2.2");
        let _servers = Servers(vec![pod_b.serve_peer_address()]);

        let nodes = vec![
            node("a", Some("10.244.1.0/24"), "192.168.10.2", false),
            node("b", Some("10.244.2.0/24"), "192.168.20.2", false),
        ];
        for (me, ns, ip) in [("a", &a, "192.168.10.2"), ("b", &b, "192.168.20.2")] {
            ensure_cluster_cidr_route(&ns.netns(), DEFAULT_CLUSTER_CIDR)
                .await
                .expect("the cluster CIDR's route");
            let desired = desired_routes(&nodes, me, DEFAULT_CLUSTER_CIDR);
            let local = ip.parse().ok();
            let unrouted = sync_routes(&ns.netns(), DEFAULT_CLUSTER_CIDR, &desired, local)
                .await
                .expect("the routes");
            assert!(unrouted.is_empty(), "{unrouted:?}");
            // Applying again changes nothing and fails nothing.
            sync_routes(&ns.netns(), DEFAULT_CLUSTER_CIDR, &desired, local)
                .await
                .expect("again");
        }
        let routes = a.run(&["ip", "-4", "route", "show", "proto", "83"]);
        assert!(
            routes.contains("10.244.2.0/24 via 10.244.2.0 dev skiff.vxlan"),
            "{routes}"
        );
        // The router has no route to the pods: only the overlay carries them.
        let route = router.output(&["ip", "route", "get", "10.244.2.2"]);
        assert!(!route.status.success(), "{}", String::from_utf8_lossy(&route.stdout));

        pod_a.ask_until("10.244.2.2", "10.244.1.2");

        // Node b goes: the VXLAN route goes with it.
        let desired = desired_routes(&nodes[..1], "a", DEFAULT_CLUSTER_CIDR);
        sync_routes(
            &a.netns(),
            DEFAULT_CLUSTER_CIDR,
            &desired,
            Some(Ipv4Addr::new(192, 168, 10, 2)),
        )
        .await
        .expect("the routes");
        let routes = a.run(&["ip", "-4", "route", "show", "proto", "83"]);
        assert_eq!(routes.trim(), "unreachable 10.244.0.0/16", "{routes}");
    }

    #[test]
    fn vtep_macs_follow_the_address() {
        assert_eq!(vtep_mac(Ipv4Addr::new(192, 168, 10, 2)), "0a:58:c0:a8:0a:02");
    }

    /// Processes killed when dropped (before the namespaces they run in are deleted).
    struct Servers(Vec<Child>);

    impl Drop for Servers {
        fn drop(&mut self) {
            for server in &mut self.0 {
                let _ = server.kill();
                let _ = server.wait();
            }
        }
    }
}
