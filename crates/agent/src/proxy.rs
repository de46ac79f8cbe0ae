//! The node agent's service proxy: kube-proxy's nftables mode (upstream's
//! `pkg/proxy/nftables/proxier.go`), rebuilt for Skiff.
//!
//! [`Ruleset::build`] turns Services and EndpointSlices into the contents of one nftables table of
//! Skiff's own, `table ip skiff`, and [`Ruleset::transaction`] into the text of one `nft -f -`
//! transaction, which the kernel applies all or nothing. [`Proxier`] keeps the Services and
//! EndpointSlices it is told of and syncs in the background, one sync at a time; [`run`] feeds it
//! from watches on the API.
//!
//! The table has upstream's shape and names:
//! - base chains `filter-prerouting`, `filter-input`, `filter-forward`, `filter-output` at priority
//!   -110 (before DNAT), `filter-output-post-dnat` at -90, `nat-prerouting` and `nat-output` at -100
//!   jumping to `services`, `nat-postrouting` at 100 jumping to `masquerading`;
//! - `services`: `ip daddr . meta l4proto . th dport vmap @service-ips` (ClusterIPs, external IPs,
//!   LoadBalancer addresses), then NodePorts on every local address (`fib daddr type local`);
//! - per service port, `service-HASH-NS/NAME/PROTO/PORT` (endpoints for the Cluster traffic policy),
//!   `local-…` (for the Local policy) and `external-…` (NodePort, LoadBalancer and external IP
//!   traffic), which pick an endpoint with `numgen random mod N vmap` and go to its
//!   `endpoint-HASH-NS/NAME/PROTO/PORT__IP/PORT` chain, which DNATs;
//! - service ports without a usable endpoint are in `no-endpoint-services` and
//!   `no-endpoint-nodeports`, rejected from the filter chains by `reject-chain` (a TCP reset, an
//!   ICMP port unreachable for other protocols); `cluster-ips-check` rejects the other ports of
//!   ClusterIPs and every address of the service CIDR that is no ClusterIP;
//! - `mark-for-masquerade` sets a mark that `masquerading` turns into `masquerade fully-random`.
//!
//! Decisions, where Skiff differs from upstream:
//! - The service CIDR has a `local` route ([`ensure_service_cidr_route`]), so none of its addresses
//!   is ever routed off the machine, with or without this table. An `unreachable` or `blackhole`
//!   route would not do: a connect from the node itself looks its route up before the output hook
//!   DNATs it, and would fail. A local route makes the kernel pick the ClusterIP itself as the
//!   source of such a connection, so the `services` chain masquerades every connection whose source
//!   is in the service CIDR (otherwise the endpoint would answer to a ClusterIP). Because pod
//!   traffic to the range is now delivered locally instead of forwarded, `cluster-ips-check` is also
//!   hooked into `filter-input` (after DNAT there), and unallocated addresses are rejected rather
//!   than dropped (upstream drops them), so a connect fails at once instead of timing out; without
//!   the table (no Skiff process ever ran) they reach whatever listens on the wildcard address of
//!   the node, which still never leaves the machine.
//! - NodePorts answer on 127.0.0.1 too (upstream's nftables mode does not; its iptables mode does).
//!   That needs `net.ipv4.conf.all.route_localnet=1` (set by the [`Proxier`] before its first sync,
//!   [`enable_route_localnet`]) so a packet from 127.0.0.1 may be DNATed to a pod, and masquerade,
//!   which every NodePort connection already gets. With route_localnet the kernel would also accept
//!   packets to 127.0.0.0/8 from other machines, so `filter-input` drops those unless they belong to
//!   a DNATed or established connection, as kube-proxy's iptables mode does (CVE-2020-8558). A
//!   listener in the agent would have needed a userspace copy loop per connection (and per UDP
//!   flow) for no gain in correctness. [`ProxyOptions::localhost_nodeports`] turns this off.
//! - `type: LoadBalancer` Services are answered on the node's own addresses ([`NodeInfo`]) and on
//!   their `status.loadBalancer.ingress` IPs, at their service ports, as k3s' ServiceLB does; both
//!   are treated as upstream treats load balancer IPs (the external chain,
//!   `loadBalancerSourceRanges`).
//! - A sync is full (delete the table and create it again, in the same transaction) at the first
//!   sync of a process, after a failed sync and when the table is found missing; otherwise it is
//!   the difference from the last applied [`Ruleset`]: the chains that changed are flushed and
//!   written again, map elements are deleted and added, affinity sets that did not change keep
//!   their members. Only Services whose object or EndpointSlices changed (resourceVersion) are
//!   built again ([`FragmentCache`]); the others keep their rules, compared by pointer. Chains no
//!   longer used are flushed at once and deleted by the next sync a second or more later, or by a
//!   sync of their own after two seconds (kernels before 6.2 still count a reference from a
//!   just-deleted map element), as upstream does. ClientIP affinity lives in per-endpoint sets
//!   with a timeout of `timeoutSeconds`, as upstream's, so a full sync (a restart of the agent)
//!   forgets it. At 1,000 Services of 3 endpoints a full sync takes about a second of nft, an
//!   update after one EndpointSlice change 30 to 50 ms of nft (the kernel checks the whole table
//!   on every commit) plus the build (`kernel_sync_time_at_1000_services`).
//!
//! - After a sync, the conntrack entries of UDP flows DNATed to an endpoint that the rules no longer
//!   use are deleted with `conntrack -D` (upstream's conntrack clean-up), or a client's datagrams
//!   would keep going to it (a DNS client reusing its source port, say).
//!
//! Not done: IPv6 (`table ip6`), topology-aware hints, health check node ports, `nodePortAddresses`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::{self, Write as _};
use std::net::Ipv4Addr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;
use tokio::sync::{Notify, watch};

pub use skiff_api::cidr::Ipv4Cidr;

/// The name of Skiff's nftables table (family `ip`) for the default service CIDR.
pub const TABLE: &str = "skiff";
/// The default service CIDR (the API server's `--service-cluster-ip-range`).
pub const DEFAULT_SERVICE_CIDR: Ipv4Cidr = Ipv4Cidr::from_network(Ipv4Addr::new(10, 96, 0, 0), 12);
const FAMILY: &str = "ip";

/// The label naming an EndpointSlice's Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

// Base chains, named `TYPE-HOOK` as upstream's.
const FILTER_PREROUTING: &str = "filter-prerouting";
const FILTER_INPUT: &str = "filter-input";
const FILTER_FORWARD: &str = "filter-forward";
const FILTER_OUTPUT: &str = "filter-output";
const FILTER_OUTPUT_POST_DNAT: &str = "filter-output-post-dnat";
const NAT_PREROUTING: &str = "nat-prerouting";
const NAT_OUTPUT: &str = "nat-output";
const NAT_POSTROUTING: &str = "nat-postrouting";

// Service dispatch.
const SERVICES_CHAIN: &str = "services";
const SERVICE_IPS_MAP: &str = "service-ips";
const SERVICE_NODEPORTS_MAP: &str = "service-nodeports";
const CLUSTER_IPS_SET: &str = "cluster-ips";

// Service ports without endpoints, and addresses of the service CIDR that are no service port.
const SERVICE_ENDPOINTS_CHECK_CHAIN: &str = "service-endpoints-check";
const NODEPORT_ENDPOINTS_CHECK_CHAIN: &str = "nodeport-endpoints-check";
const NO_ENDPOINT_SERVICES_MAP: &str = "no-endpoint-services";
const NO_ENDPOINT_NODEPORTS_MAP: &str = "no-endpoint-nodeports";
const REJECT_CHAIN: &str = "reject-chain";
const CLUSTER_IPS_CHECK_CHAIN: &str = "cluster-ips-check";

// loadBalancerSourceRanges.
const FIREWALL_IPS_MAP: &str = "firewall-ips";
const FIREWALL_CHECK_CHAIN: &str = "firewall-check";

// Masquerading.
const MARK_MASQ_CHAIN: &str = "mark-for-masquerade";
const MASQUERADING_CHAIN: &str = "masquerading";

// Per service port and per endpoint.
const SERVICE_CHAIN_PREFIX: &str = "service-";
const LOCAL_CHAIN_PREFIX: &str = "local-";
const EXTERNAL_CHAIN_PREFIX: &str = "external-";
const ENDPOINT_CHAIN_PREFIX: &str = "endpoint-";
const AFFINITY_SET_PREFIX: &str = "affinity-";
const FIREWALL_CHAIN_PREFIX: &str = "firewall-";

/// nftables names are at most 256 bytes; 16 are left for the prefixes above.
const CHAIN_NAME_BASE_MAX: usize = 256 - 16;
/// nftables comments are at most 128 bytes.
const COMMENT_MAX: usize = 128;
/// ClientIP affinity's timeout when a Service names none (upstream's default, 3 hours).
const DEFAULT_AFFINITY_TIMEOUT_SECONDS: u32 = 10_800;
/// How long a chain no longer used stays (flushed) before a sync deletes it.
const STALE_CHAIN_DELAY: Duration = Duration::from_secs(1);
/// How long stale chains wait for a sync to ride along with before one runs for them alone (a
/// sync of its own would hold up a change arriving meanwhile).
const STALE_CHAIN_SWEEP: Duration = Duration::from_secs(2);
/// Map elements per `add element` / `delete element` command.
const ELEMENTS_PER_COMMAND: usize = 1_000;

/// What the proxy needs to know of its node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// The Node's name: endpoints whose `nodeName` is this one are local (traffic policy `Local`).
    pub name: String,
    /// The node's own IPv4 addresses: `type: LoadBalancer` Services are answered on them at their
    /// service ports. NodePorts answer on every local address whatever this lists.
    pub addresses: Vec<Ipv4Addr>,
}

/// How the rules are made, independent of the Services.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyOptions {
    /// The nftables table (family `ip`) the rules live in: [`table_name`] of the service CIDR.
    pub table: String,
    /// The service CIDR: its addresses that are no ClusterIP are rejected.
    pub service_cidr: Ipv4Cidr,
    /// The cluster (pod) CIDR, when known: traffic to a ClusterIP from outside it is masqueraded
    /// (upstream's local traffic detector), and pod traffic to a Local-policy NodePort is
    /// short-circuited to any endpoint.
    pub cluster_cidr: Option<Ipv4Cidr>,
    /// The bit of the packet mark that asks for masquerade (upstream's `--masquerade-bit`, 14).
    pub masquerade_bit: u8,
    /// Whether NodePorts answer on 127.0.0.1 (needs `route_localnet`, see the module's doc).
    pub localhost_nodeports: bool,
}

impl Default for ProxyOptions {
    fn default() -> Self {
        Self {
            table: TABLE.to_string(),
            service_cidr: DEFAULT_SERVICE_CIDR,
            cluster_cidr: None,
            masquerade_bit: 14,
            localhost_nodeports: true,
        }
    }
}

/// The table of the proxy of a cluster whose service CIDR is `cidr`: [`TABLE`] for the default
/// range, `skiff-A-B-C-D-LEN` for another. Two clusters on one host with different ranges keep
/// apart (each table rejects the unallocated addresses of its own range only); a cluster started
/// again on the same range, after its data was removed, takes over the table it left.
pub fn table_name(cidr: Ipv4Cidr) -> String {
    if cidr == DEFAULT_SERVICE_CIDR {
        return TABLE.to_string();
    }
    let [a, b, c, d] = cidr.network().octets();
    format!("{TABLE}-{a}-{b}-{c}-{d}-{}", cidr.prefix_len())
}

impl ProxyOptions {
    /// Options for the service CIDR `cidr`, its table named after it.
    pub fn for_service_cidr(cidr: Ipv4Cidr) -> Self {
        Self {
            table: table_name(cidr),
            service_cidr: cidr,
            ..Self::default()
        }
    }

    fn masquerade_mark(&self) -> String {
        format!("{:#010x}", 1u32 << self.masquerade_bit.min(31))
    }
}

/// One port of a Service, as the rules need it (upstream's `servicePortInfo`).
#[derive(Debug)]
struct ServicePortInfo<'a> {
    namespace: &'a str,
    name: &'a str,
    port_name: &'a str,
    /// `TCP`, `UDP` or `SCTP`, as in the API.
    api_protocol: &'static str,
    /// `tcp`, `udp` or `sctp`, as nftables spells them.
    protocol: &'static str,
    port: u16,
    cluster_ip: Ipv4Addr,
    node_port: Option<u16>,
    external_ips: Vec<Ipv4Addr>,
    load_balancer_ips: Vec<Ipv4Addr>,
    source_ranges: Vec<Ipv4Cidr>,
    affinity_timeout: Option<u32>,
    external_policy_local: bool,
    internal_policy_local: bool,
}

impl ServicePortInfo<'_> {
    fn externally_accessible(&self) -> bool {
        self.node_port.is_some() || !self.external_ips.is_empty() || !self.load_balancer_ips.is_empty()
    }

    /// Whether some traffic uses the endpoints of every node.
    fn uses_cluster_endpoints(&self) -> bool {
        !self.internal_policy_local || (self.externally_accessible() && !self.external_policy_local)
    }

    /// Whether some traffic uses only this node's endpoints.
    fn uses_local_endpoints(&self) -> bool {
        self.internal_policy_local || (self.externally_accessible() && self.external_policy_local)
    }
}

/// One endpoint of a service port (upstream's `BaseEndpointInfo`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct EndpointInfo {
    ip: Ipv4Addr,
    port: u16,
    ready: bool,
    serving: bool,
    terminating: bool,
    local: bool,
}

/// The first IPv4 ClusterIP of a Service that has one (not headless, not ExternalName).
fn cluster_ip(service: &Service) -> Option<Ipv4Addr> {
    let spec = service.spec.as_ref()?;
    if spec.type_.as_deref() == Some("ExternalName") {
        return None;
    }
    let ips = spec.cluster_ips.iter().flatten().chain(spec.cluster_ip.iter());
    ips.filter(|ip| !ip.is_empty() && ip.as_str() != "None")
        .find_map(|ip| ip.parse::<Ipv4Addr>().ok())
}

fn parse_ips<'a>(ips: impl IntoIterator<Item = &'a String>) -> Vec<Ipv4Addr> {
    let mut out: Vec<Ipv4Addr> = Vec::new();
    for ip in ips {
        if let Ok(ip) = ip.parse::<Ipv4Addr>()
            && !out.contains(&ip)
        {
            out.push(ip);
        }
    }
    out
}

fn protocol(api: Option<&str>) -> Option<(&'static str, &'static str)> {
    match api.unwrap_or("TCP") {
        "TCP" => Some(("TCP", "tcp")),
        "UDP" => Some(("UDP", "udp")),
        "SCTP" => Some(("SCTP", "sctp")),
        _ => None,
    }
}

fn port_number(port: Option<i32>) -> Option<u16> {
    port.and_then(|p| u16::try_from(p).ok()).filter(|p| *p != 0)
}

/// The ports of a Service the proxy serves; none for headless and ExternalName Services.
fn service_ports<'a>(service: &'a Service, node: &NodeInfo) -> Vec<ServicePortInfo<'a>> {
    let (Some(spec), Some(name)) = (service.spec.as_ref(), service.metadata.name.as_deref()) else {
        return Vec::new();
    };
    let namespace = service.metadata.namespace.as_deref().unwrap_or("default");
    let Some(cluster_ip) = cluster_ip(service) else {
        tracing::trace!(namespace, name, "no IPv4 ClusterIP: not proxied");
        return Vec::new();
    };
    let external_ips = parse_ips(spec.external_ips.iter().flatten());
    let mut load_balancer_ips = Vec::new();
    let mut source_ranges = Vec::new();
    if spec.type_.as_deref() == Some("LoadBalancer") {
        let ingress = service
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref());
        // An ingress of ipMode Proxy is a load balancer that proxies: its address is not ours.
        let ingress_ips = ingress
            .into_iter()
            .flatten()
            .filter(|i| i.ip_mode.as_deref() != Some("Proxy"))
            .filter_map(|i| i.ip.as_ref());
        load_balancer_ips = parse_ips(ingress_ips);
        for ip in &node.addresses {
            if !load_balancer_ips.contains(ip) {
                load_balancer_ips.push(*ip);
            }
        }
        for range in spec.load_balancer_source_ranges.iter().flatten() {
            match range.parse::<Ipv4Cidr>() {
                Ok(cidr) => source_ranges.push(cidr),
                Err(e) => tracing::debug!(namespace, name, range, error = %e, "ignoring a source range"),
            }
        }
    }
    let affinity_timeout = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        spec.session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .and_then(|t| u32::try_from(t).ok())
            .filter(|t| *t > 0)
            .unwrap_or(DEFAULT_AFFINITY_TIMEOUT_SECONDS)
    });
    let mut out: Vec<ServicePortInfo<'a>> = Vec::new();
    for port in spec.ports.iter().flatten() {
        let Some((api_protocol, protocol)) = protocol(port.protocol.as_deref()) else {
            continue;
        };
        let Some(number) = port_number(Some(port.port)) else {
            continue;
        };
        let port_name = port.name.as_deref().unwrap_or("");
        // Port names are unique per protocol (validation); a duplicate would share chains.
        if out.iter().any(|p| p.port_name == port_name && p.protocol == protocol) {
            continue;
        }
        let node_port = match spec.type_.as_deref() {
            Some("NodePort" | "LoadBalancer") => port_number(port.node_port),
            _ => None,
        };
        let mut info = ServicePortInfo {
            namespace,
            name,
            port_name,
            api_protocol,
            protocol,
            port: number,
            cluster_ip,
            node_port,
            external_ips: external_ips.clone(),
            load_balancer_ips: load_balancer_ips.clone(),
            source_ranges: source_ranges.clone(),
            affinity_timeout,
            external_policy_local: false,
            internal_policy_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
        };
        info.external_policy_local =
            info.externally_accessible() && spec.external_traffic_policy.as_deref() == Some("Local");
        out.push(info);
    }
    out
}

/// The endpoints of a service port in its Service's slices: each slice's port of the same name and
/// protocol gives the target port. An address in several slices counts once (a ready one wins).
fn endpoints_for(slices: &[&EndpointSlice], port: &ServicePortInfo<'_>, node: &str) -> Vec<EndpointInfo> {
    let mut by_address: BTreeMap<(Ipv4Addr, u16), EndpointInfo> = BTreeMap::new();
    for slice in slices {
        if slice.address_type != "IPv4" {
            continue;
        }
        let target = slice.ports.iter().flatten().find(|p| {
            p.name.as_deref().unwrap_or("") == port.port_name
                && p.protocol.as_deref().unwrap_or("TCP") == port.api_protocol
        });
        let Some(target) = target.and_then(|p| port_number(p.port)) else {
            continue;
        };
        for endpoint in &slice.endpoints {
            let Some(ip) = endpoint.addresses.first().and_then(|a| a.parse::<Ipv4Addr>().ok()) else {
                continue;
            };
            let conditions = endpoint.conditions.as_ref();
            let info = EndpointInfo {
                ip,
                port: target,
                ready: conditions.and_then(|c| c.ready).unwrap_or(true),
                serving: conditions.and_then(|c| c.serving).unwrap_or(true),
                terminating: conditions.and_then(|c| c.terminating).unwrap_or(false),
                local: !node.is_empty() && endpoint.node_name.as_deref() == Some(node),
            };
            match by_address.entry((ip, target)) {
                std::collections::btree_map::Entry::Vacant(e) => {
                    e.insert(info);
                }
                std::collections::btree_map::Entry::Occupied(mut e) => {
                    if !e.get().ready && info.ready {
                        e.insert(info);
                    }
                }
            }
        }
    }
    by_address.into_values().collect()
}

/// Upstream's `CategorizeEndpoints` without topology: indexes into `endpoints`.
#[derive(Debug, Default)]
struct Categorized {
    cluster: Vec<usize>,
    local: Vec<usize>,
    reachable: Vec<usize>,
    has_any: bool,
}

fn categorize(endpoints: &[EndpointInfo], port: &ServicePortInfo<'_>) -> Categorized {
    let mut out = Categorized::default();
    let pick = |f: &dyn Fn(&EndpointInfo) -> bool| -> Vec<usize> {
        (0..endpoints.len()).filter(|i| f(&endpoints[*i])).collect()
    };
    if port.uses_cluster_endpoints() {
        out.cluster = pick(&|e| e.ready);
        // With no ready endpoint anywhere, the serving terminating ones, not to drop connections.
        if out.cluster.is_empty() {
            out.cluster = pick(&|e| e.serving && e.terminating);
        }
        out.has_any = !out.cluster.is_empty();
    }
    if !port.uses_local_endpoints() {
        out.reachable = out.cluster.clone();
        return out;
    }
    let usable = |e: &EndpointInfo| e.ready || (e.serving && e.terminating);
    out.has_any |= endpoints.iter().any(usable);
    out.local = pick(&|e| e.local && e.ready);
    if out.local.is_empty() {
        out.local = pick(&|e| e.local && e.serving && e.terminating);
    }
    if !port.uses_cluster_endpoints() {
        out.reachable = out.local.clone();
        return out;
    }
    let mut reachable: BTreeSet<usize> = out.cluster.iter().copied().collect();
    reachable.extend(out.local.iter().copied());
    out.reachable = reachable.into_iter().collect();
    out
}

/// Upstream's `hashAndTruncate`: eight base32 characters of the name's SHA-256, a dash and the
/// name, at most [`CHAIN_NAME_BASE_MAX`] bytes. Characters nftables does not take in a name are
/// replaced (names from the API never have any); the hash keeps names distinct anyway.
fn hash_and_truncate(name: &str) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let digest = Sha256::digest(name.as_bytes());
    let bits = digest.iter().take(5).fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
    let mut out = String::with_capacity(name.len() + 9);
    for i in (0..8).rev() {
        out.push(char::from(ALPHABET[((bits >> (i * 5)) & 31) as usize]));
    }
    out.push('-');
    out.extend(name.chars().map(|c| {
        if c.is_ascii_alphanumeric() || matches!(c, '/' | '-' | '_' | '.') {
            c
        } else {
            '_'
        }
    }));
    if out.len() > CHAIN_NAME_BASE_MAX {
        out.truncate(CHAIN_NAME_BASE_MAX - 3);
        out.push_str("...");
    }
    out
}

/// A comment nftables takes: no quotes or control characters, at most [`COMMENT_MAX`] bytes.
fn comment(text: &str) -> String {
    let mut out: String = text
        .chars()
        .map(|c| {
            if c == '"' || c == '\\' || c.is_control() || !c.is_ascii() {
                '_'
            } else {
                c
            }
        })
        .collect();
    out.truncate(COMMENT_MAX);
    out
}

type Text = Arc<str>;

/// A Service, by namespace and name.
type Key = (String, String);

/// One Service's part of a ruleset: the chains, affinity sets and map elements of its ports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Fragment {
    /// Service, endpoint and firewall chains: name to rules.
    chains: BTreeMap<String, Vec<String>>,
    /// ClientIP affinity sets: name to timeout in seconds.
    affinity_sets: BTreeMap<String, u32>,
    /// Elements of the top-level maps and sets, in the order claimed: container, key, and what
    /// follows the key (`: VERDICT`, or nothing for a set).
    elements: Vec<(&'static str, Text, Text)>,
    service_ports: usize,
    endpoint_chains: usize,
    /// Where UDP traffic to this Service can be DNATed to: destination and endpoint address.
    udp_flows: BTreeSet<(UdpDestination, Ipv4Addr)>,
}

/// A destination of UDP traffic the proxy DNATs (for upstream's conntrack clean-up).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum UdpDestination {
    /// A ClusterIP, external or load balancer address and its port.
    Address(Ipv4Addr, u16),
    /// A NodePort, on any local address.
    NodePort(u16),
}

impl UdpDestination {
    /// The `conntrack` arguments selecting the flows of this destination DNATed to `endpoint`.
    fn conntrack_args(&self, endpoint: Ipv4Addr) -> Vec<String> {
        let mut args: Vec<String> = ["-D", "-p", "udp"].iter().map(|s| s.to_string()).collect();
        match self {
            UdpDestination::Address(ip, port) => {
                args.extend([
                    "--orig-dst".into(),
                    ip.to_string(),
                    "--orig-port-dst".into(),
                    port.to_string(),
                ]);
            }
            UdpDestination::NodePort(port) => {
                args.extend(["--orig-port-dst".into(), port.to_string()]);
            }
        }
        args.extend(["--dst-nat".into(), endpoint.to_string()]);
        args
    }
}

/// What a fragment was built from: the uid and resourceVersion of the Service and of its slices.
#[derive(Debug, PartialEq, Eq)]
struct Fingerprint {
    service: (String, String),
    slices: Vec<(String, String, String)>,
}

fn version(meta: &ObjectMeta) -> Option<(&str, &str)> {
    Some((meta.uid.as_deref().unwrap_or(""), meta.resource_version.as_deref()?))
}

impl Fingerprint {
    /// `None` when an object has no resourceVersion (it cannot be told from another version).
    fn of(service: &Service, slices: &[&EndpointSlice]) -> Option<Fingerprint> {
        let (uid, rv) = version(&service.metadata)?;
        let mut out = Fingerprint {
            service: (uid.to_string(), rv.to_string()),
            slices: Vec::with_capacity(slices.len()),
        };
        for slice in slices {
            let (uid, rv) = version(&slice.metadata)?;
            let name = slice.metadata.name.clone().unwrap_or_default();
            out.slices.push((name, uid.to_string(), rv.to_string()));
        }
        Some(out)
    }

    fn matches(&self, service: &Service, slices: &[&EndpointSlice]) -> bool {
        version(&service.metadata) == Some((self.service.0.as_str(), self.service.1.as_str()))
            && self.slices.len() == slices.len()
            && self.slices.iter().zip(slices).all(|((name, uid, rv), slice)| {
                slice.metadata.name.as_deref().unwrap_or("") == name
                    && version(&slice.metadata) == Some((uid.as_str(), rv.as_str()))
            })
    }
}

/// The fragments of earlier builds, reused for Services whose object and EndpointSlices have the
/// same resourceVersions (for the same node and options), so a sync after one EndpointSlice
/// change builds the rules of one Service.
#[derive(Debug, Default)]
pub struct FragmentCache {
    context: Option<(NodeInfo, ProxyOptions)>,
    entries: HashMap<Key, (Fingerprint, Arc<Fragment>)>,
}

/// The contents of Skiff's table for one state of the Services and EndpointSlices.
///
/// Two rulesets built from the same input are equal, whatever the order of the input.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ruleset {
    /// The table's name ([`ProxyOptions::table`]).
    table: Arc<str>,
    /// Commands declaring the base and top-level chains, maps and sets (from the options only).
    base_declarations: Arc<Vec<String>>,
    /// Commands adding the rules of those chains (from the options only).
    base_rules: Arc<Vec<String>>,
    /// Per Service.
    fragments: BTreeMap<Key, Arc<Fragment>>,
    /// The elements of every fragment: container to key to what follows the key. Where two
    /// Services claim a key (two LoadBalancers on one port), the first by namespace and name has it.
    elements: BTreeMap<&'static str, BTreeMap<Text, Text>>,
}

/// What a sync has to send to `nft -f -`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transaction {
    /// Deletes the table and creates it again with everything in it.
    Full(String),
    /// Changes the table from the previous ruleset to this one.
    Update {
        /// The transaction's text.
        text: String,
        /// Chains the transaction flushed because no rule uses them any more: delete them in a
        /// later transaction, [`STALE_CHAIN_DELAY`] or more after this one.
        stale_chains: Vec<String>,
    },
    /// Nothing to do.
    Unchanged,
}

/// The parts of an update transaction, in the order they must run.
#[derive(Default)]
struct UpdateText {
    /// The table the commands act on.
    table: Arc<str>,
    /// Elements first: they may point at chains flushed or deleted below.
    delete_elements: String,
    chains: String,
    delete_sets: String,
    delete_chains: String,
    add_sets: String,
    rules: String,
    add_elements: String,
    stale_chains: Vec<String>,
}

impl UpdateText {
    /// The changes of one Service's fragment but its elements.
    fn fragment(&mut self, old: &Fragment, new: &Fragment) {
        let table = self.table.clone();
        let sets_gone: HashSet<&str> = old
            .affinity_sets
            .iter()
            .filter(|(name, timeout)| new.affinity_sets.get(*name) != Some(*timeout))
            .map(|(name, _)| name.as_str())
            .collect();
        let mut rewrite: Vec<(&str, &[String])> = Vec::new();
        for (name, rules) in &new.chains {
            match old.chains.get(name) {
                None => {
                    // It may exist still, flushed, as a stale chain of an earlier transaction.
                    line(&mut self.chains, format_args!("add chain {FAMILY} {table} {name}"));
                    line(&mut self.chains, format_args!("flush chain {FAMILY} {table} {name}"));
                    rewrite.push((name, rules));
                }
                Some(before) if before != rules || references_any(rules, &sets_gone) => {
                    line(&mut self.chains, format_args!("flush chain {FAMILY} {table} {name}"));
                    rewrite.push((name, rules));
                }
                Some(_) => {}
            }
        }
        for name in old.chains.keys() {
            if !new.chains.contains_key(name) {
                line(&mut self.chains, format_args!("flush chain {FAMILY} {table} {name}"));
                self.stale_chains.push(name.clone());
            }
        }
        let mut sets_gone: Vec<&str> = sets_gone.into_iter().collect();
        sets_gone.sort_unstable();
        for name in sets_gone {
            line(
                &mut self.delete_sets,
                format_args!("delete set {FAMILY} {table} {name}"),
            );
        }
        for (name, timeout) in &new.affinity_sets {
            if old.affinity_sets.get(name) != Some(timeout) {
                add_affinity_set(&mut self.add_sets, &table, name, *timeout);
            }
        }
        for (name, rules) in rewrite {
            for rule in rules {
                line(&mut self.rules, format_args!("add rule {FAMILY} {table} {name} {rule}"));
            }
        }
    }
}

impl Ruleset {
    /// The ruleset for `services` and their EndpointSlices (a slice belongs to the Service its
    /// `kubernetes.io/service-name` label names, in its namespace) on the node `node`.
    pub fn build<'a>(
        services: impl IntoIterator<Item = &'a Service>,
        slices: impl IntoIterator<Item = &'a EndpointSlice>,
        node: &NodeInfo,
        options: &ProxyOptions,
    ) -> Ruleset {
        Self::build_cached(services, slices, node, options, &mut FragmentCache::default())
    }

    /// [`Ruleset::build`], reusing the rules of the Services `cache` has seen unchanged.
    pub fn build_cached<'a>(
        services: impl IntoIterator<Item = &'a Service>,
        slices: impl IntoIterator<Item = &'a EndpointSlice>,
        node: &NodeInfo,
        options: &ProxyOptions,
        cache: &mut FragmentCache,
    ) -> Ruleset {
        match &cache.context {
            Some((n, o)) if n == node && o == options => {}
            _ => {
                cache.entries.clear();
                cache.context = Some((node.clone(), options.clone()));
            }
        }
        let mut by_service: HashMap<(&str, &str), Vec<&EndpointSlice>> = HashMap::new();
        for slice in slices {
            let labels = slice.metadata.labels.as_ref();
            let Some(service) = labels.and_then(|l| l.get(SERVICE_NAME_LABEL)) else {
                continue;
            };
            let namespace = slice.metadata.namespace.as_deref().unwrap_or("default");
            by_service.entry((namespace, service)).or_default().push(slice);
        }
        for list in by_service.values_mut() {
            list.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        }
        let mut services: Vec<((&str, &str), &Service)> = services
            .into_iter()
            .filter_map(|s| {
                let name = s.metadata.name.as_deref()?;
                Some(((s.metadata.namespace.as_deref().unwrap_or("default"), name), s))
            })
            .collect();
        services.sort_by(|a, b| a.0.cmp(&b.0));
        let (base_declarations, base_rules) = base(options);
        let mut fragments: BTreeMap<Key, Arc<Fragment>> = BTreeMap::new();
        let mut fresh: HashSet<Key> = HashSet::new();
        for ((namespace, name), service) in services {
            let key = (namespace.to_string(), name.to_string());
            if fragments.contains_key(&key) {
                continue;
            }
            let slices = by_service
                .get(&(namespace, name))
                .map(Vec::as_slice)
                .unwrap_or_default();
            let fragment = match cache.entries.get(&key) {
                Some((fingerprint, fragment)) if fingerprint.matches(service, slices) => fragment.clone(),
                _ => {
                    let fragment = Arc::new(build_fragment(service, slices, node, options));
                    match Fingerprint::of(service, slices) {
                        Some(fingerprint) => {
                            cache.entries.insert(key.clone(), (fingerprint, fragment.clone()));
                        }
                        None => {
                            cache.entries.remove(&key);
                        }
                    }
                    fresh.insert(key.clone());
                    fragment
                }
            };
            fragments.insert(key, fragment);
        }
        cache.entries.retain(|key, _| fragments.contains_key(key));
        let mut elements: BTreeMap<&'static str, BTreeMap<Text, Text>> = BTreeMap::new();
        for (key, fragment) in &fragments {
            for (container, element, value) in &fragment.elements {
                let map = elements.entry(*container).or_default();
                match map.get(element) {
                    None => {
                        map.insert(element.clone(), value.clone());
                    }
                    Some(existing) if existing != value && fresh.contains(key) => tracing::warn!(
                        container,
                        key = %element,
                        service = %format_args!("{}/{}", key.0, key.1),
                        "another Service has this address and port"
                    ),
                    Some(_) => {}
                }
            }
        }
        Ruleset {
            table: Arc::from(options.table.as_str()),
            base_declarations: Arc::new(base_declarations),
            base_rules: Arc::new(base_rules),
            fragments,
            elements,
        }
    }

    /// The UDP destinations and endpoints `previous` DNATed to that this ruleset no longer does:
    /// the conntrack entries of those flows would keep sending a client's datagrams to an endpoint
    /// that is gone (upstream's `conntrack.CleanStaleEntries`).
    pub fn stale_udp_flows(&self, previous: &Ruleset) -> Vec<(UdpDestination, Ipv4Addr)> {
        let mut stale = Vec::new();
        for (key, old) in &previous.fragments {
            if old.udp_flows.is_empty() {
                continue;
            }
            match self.fragments.get(key) {
                Some(new) if Arc::ptr_eq(old, new) => {}
                Some(new) => stale.extend(old.udp_flows.difference(&new.udp_flows).copied()),
                None => stale.extend(old.udp_flows.iter().copied()),
            }
        }
        stale
    }

    /// How many service ports have rules.
    pub fn service_ports(&self) -> usize {
        self.fragments.values().map(|f| f.service_ports).sum()
    }

    /// How many endpoint chains there are.
    pub fn endpoint_chains(&self) -> usize {
        self.fragments.values().map(|f| f.endpoint_chains).sum()
    }

    /// The names of the service, endpoint and firewall chains.
    pub fn chain_names(&self) -> impl Iterator<Item = &str> {
        self.fragments
            .values()
            .flat_map(|f| f.chains.keys().map(String::as_str))
    }

    /// The rules of one service, endpoint or firewall chain.
    pub fn chain(&self, name: &str) -> Option<&[String]> {
        self.fragments
            .values()
            .find_map(|f| f.chains.get(name).map(Vec::as_slice))
    }

    /// The transaction that deletes Skiff's table and creates it with this ruleset: what a sync
    /// sends when it does not know what the kernel has.
    pub fn full_transaction(&self) -> String {
        let chains = self.fragments.values().flat_map(|f| f.chains.iter());
        let size: usize = chains
            .clone()
            .map(|(name, rules)| 40 + rules.iter().map(|r| r.len() + name.len() + 20).sum::<usize>())
            .sum();
        let table = &*self.table;
        let mut out = String::with_capacity(size + 16_384);
        for verb in ["add", "delete", "add"] {
            line(&mut out, format_args!("{verb} table {FAMILY} {table}"));
        }
        for declaration in self.base_declarations.iter() {
            line(&mut out, format_args!("{declaration}"));
        }
        for (name, _) in chains.clone() {
            line(&mut out, format_args!("add chain {FAMILY} {table} {name}"));
        }
        for (name, timeout) in self.fragments.values().flat_map(|f| f.affinity_sets.iter()) {
            add_affinity_set(&mut out, table, name, *timeout);
        }
        for rule in self.base_rules.iter() {
            line(&mut out, format_args!("{rule}"));
        }
        for (name, rules) in chains {
            for rule in rules {
                line(&mut out, format_args!("add rule {FAMILY} {table} {name} {rule}"));
            }
        }
        for (container, elements) in &self.elements {
            add_elements(&mut out, table, container, elements.iter());
        }
        out
    }

    /// The transaction from `previous` (what the kernel has, `None` when unknown) to this ruleset,
    /// deleting as well the stale chains `delete_chains` left by earlier transactions (a chain
    /// either ruleset has is not deleted).
    pub fn transaction(&self, previous: Option<&Ruleset>, delete_chains: &[String]) -> Transaction {
        let Some(previous) = previous else {
            return Transaction::Full(self.full_transaction());
        };
        if previous.table != self.table
            || previous.base_declarations != self.base_declarations
            || previous.base_rules != self.base_rules
        {
            return Transaction::Full(self.full_transaction());
        }
        let table = &*self.table;
        let mut update = UpdateText {
            table: self.table.clone(),
            ..UpdateText::default()
        };
        for (container, elements) in &previous.elements {
            let now = self.elements.get(container);
            let gone: Vec<&Text> = elements
                .iter()
                .filter(|(key, value)| now.and_then(|n| n.get(*key)) != Some(*value))
                .map(|(key, _)| key)
                .collect();
            delete_elements(&mut update.delete_elements, table, container, &gone);
        }
        let empty = Fragment::default();
        let keys: BTreeSet<&Key> = previous.fragments.keys().chain(self.fragments.keys()).collect();
        for key in keys {
            let (old, new) = (previous.fragments.get(key), self.fragments.get(key));
            if let (Some(old), Some(new)) = (old, new)
                && (Arc::ptr_eq(old, new) || old == new)
            {
                continue;
            }
            update.fragment(old.map_or(&empty, |f| &**f), new.map_or(&empty, |f| &**f));
        }
        if !delete_chains.is_empty() {
            let in_use: HashSet<&str> = self.chain_names().chain(previous.chain_names()).collect();
            for name in delete_chains {
                if !in_use.contains(name.as_str()) {
                    line(
                        &mut update.delete_chains,
                        format_args!("delete chain {FAMILY} {table} {name}"),
                    );
                }
            }
        }
        for (container, elements) in &self.elements {
            let before = previous.elements.get(container);
            let mut new = elements
                .iter()
                .filter(|(key, value)| before.and_then(|b| b.get(*key)) != Some(*value))
                .peekable();
            if new.peek().is_some() {
                add_elements(&mut update.add_elements, table, container, new);
            }
        }
        let parts = [
            &update.delete_elements,
            &update.chains,
            &update.delete_sets,
            &update.delete_chains,
            &update.add_sets,
            &update.rules,
            &update.add_elements,
        ];
        if parts.iter().all(|p| p.is_empty()) {
            return Transaction::Unchanged;
        }
        let mut text = String::with_capacity(parts.iter().map(|p| p.len()).sum::<usize>() + 32);
        line(&mut text, format_args!("add table {FAMILY} {table}"));
        for part in parts {
            text.push_str(part);
        }
        Transaction::Update {
            text,
            stale_chains: update.stale_chains,
        }
    }
}

/// The rules of one Service's ports.
fn build_fragment(service: &Service, slices: &[&EndpointSlice], node: &NodeInfo, options: &ProxyOptions) -> Fragment {
    let mut builder = Builder {
        options,
        node,
        fragment: Fragment::default(),
    };
    for port in service_ports(service, node) {
        let endpoints = endpoints_for(slices, &port, &node.name);
        builder.add_service_port(&port, &endpoints);
    }
    builder.fragment
}

fn line(out: &mut String, args: fmt::Arguments<'_>) {
    // Writing to a String cannot fail.
    let _ = out.write_fmt(args);
    out.push('\n');
}

fn add_affinity_set(out: &mut String, table: &str, name: &str, timeout: u32) {
    line(
        out,
        format_args!(
            "add set {FAMILY} {table} {name} {{ type ipv4_addr ; flags dynamic,timeout ; timeout {timeout}s ; }}"
        ),
    );
}

fn add_elements<'a>(
    out: &mut String,
    table: &str,
    container: &str,
    elements: impl Iterator<Item = (&'a Text, &'a Text)>,
) {
    let mut in_command = 0;
    for (key, value) in elements {
        if in_command == 0 {
            let _ = write!(out, "add element {FAMILY} {table} {container} {{ ");
        } else {
            out.push_str(", ");
        }
        out.push_str(key);
        if !value.is_empty() {
            out.push(' ');
            out.push_str(value);
        }
        in_command += 1;
        if in_command == ELEMENTS_PER_COMMAND {
            out.push_str(" }\n");
            in_command = 0;
        }
    }
    if in_command > 0 {
        out.push_str(" }\n");
    }
}

fn delete_elements(out: &mut String, table: &str, container: &str, keys: &[&Text]) {
    for chunk in keys.chunks(ELEMENTS_PER_COMMAND) {
        let _ = write!(out, "delete element {FAMILY} {table} {container} {{ ");
        for (i, key) in chunk.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            out.push_str(key);
        }
        out.push_str(" }\n");
    }
}

/// Whether a rule of `rules` names one of the sets `sets` (`@NAME `).
fn references_any(rules: &[String], sets: &HashSet<&str>) -> bool {
    !sets.is_empty()
        && rules.iter().any(|rule| {
            rule.split_whitespace()
                .filter_map(|word| word.strip_prefix('@'))
                .any(|set| sets.contains(set))
        })
}

/// The declarations and rules that depend on the options only (upstream's `setupNFTables`).
fn base(options: &ProxyOptions) -> (Vec<String>, Vec<String>) {
    let table = options.table.as_str();
    let chain = |name: &str| format!("add chain {FAMILY} {table} {name}");
    let base_chain = |name: &str, kind: &str, hook: &str, priority: i32| {
        format!("add chain {FAMILY} {table} {name} {{ type {kind} hook {hook} priority {priority} ; }}")
    };
    let map = |name: &str, key: &str, what: &str| {
        format!("add map {FAMILY} {table} {name} {{ type {key} : verdict ; comment \"{what}\" ; }}")
    };
    let rule = |chain: &str, rule: &str| format!("add rule {FAMILY} {table} {chain} {rule}");
    let service_key = "ipv4_addr . inet_proto . inet_service";
    let port_key = "inet_proto . inet_service";
    // DNAT is at priority -100 and SNAT at 100; filter chains see addresses before DNAT.
    let mut declarations = vec![
        base_chain(FILTER_PREROUTING, "filter", "prerouting", -110),
        base_chain(FILTER_INPUT, "filter", "input", -110),
        base_chain(FILTER_FORWARD, "filter", "forward", -110),
        base_chain(FILTER_OUTPUT, "filter", "output", -110),
        base_chain(FILTER_OUTPUT_POST_DNAT, "filter", "output", -90),
        base_chain(NAT_PREROUTING, "nat", "prerouting", -100),
        base_chain(NAT_OUTPUT, "nat", "output", -100),
        base_chain(NAT_POSTROUTING, "nat", "postrouting", 100),
    ];
    for name in [
        SERVICES_CHAIN,
        MASQUERADING_CHAIN,
        MARK_MASQ_CHAIN,
        REJECT_CHAIN,
        SERVICE_ENDPOINTS_CHECK_CHAIN,
        NODEPORT_ENDPOINTS_CHECK_CHAIN,
        CLUSTER_IPS_CHECK_CHAIN,
        FIREWALL_CHECK_CHAIN,
    ] {
        declarations.push(chain(name));
    }
    declarations.extend([
        map(
            SERVICE_IPS_MAP,
            service_key,
            "ClusterIP, ExternalIP and LoadBalancer IP traffic",
        ),
        map(SERVICE_NODEPORTS_MAP, port_key, "NodePort traffic"),
        map(
            NO_ENDPOINT_SERVICES_MAP,
            service_key,
            "vmap to drop or reject packets to services with no endpoints",
        ),
        map(
            NO_ENDPOINT_NODEPORTS_MAP,
            port_key,
            "vmap to drop or reject packets to service nodeports with no endpoints",
        ),
        map(
            FIREWALL_IPS_MAP,
            service_key,
            "destinations that are subject to LoadBalancerSourceRanges",
        ),
        format!("add set {FAMILY} {table} {CLUSTER_IPS_SET} {{ type ipv4_addr ; comment \"Active ClusterIPs\" ; }}"),
    ]);

    let mark = options.masquerade_mark();
    let service_cidr = options.service_cidr;
    // NodePorts: every local address but the service CIDR's (it is routed locally) and, unless
    // enabled, 127.0.0.0/8.
    let mut local_destinations = format!("ip daddr != {service_cidr} ");
    if !options.localhost_nodeports {
        local_destinations.push_str("ip daddr != 127.0.0.0/8 ");
    }
    local_destinations.push_str("fib daddr type local");
    let mut rules = Vec::new();
    if options.localhost_nodeports {
        rules.push(rule(
            FILTER_INPUT,
            "ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8 ct state & (established | related) == 0 \
             ct status & dnat == 0 drop comment \"route_localnet: no outside access to localhost\"",
        ));
    }
    for (from, to, condition) in [
        (FILTER_INPUT, NODEPORT_ENDPOINTS_CHECK_CHAIN, "ct state new "),
        (FILTER_INPUT, SERVICE_ENDPOINTS_CHECK_CHAIN, "ct state new "),
        (FILTER_FORWARD, SERVICE_ENDPOINTS_CHECK_CHAIN, "ct state new "),
        (FILTER_OUTPUT, SERVICE_ENDPOINTS_CHECK_CHAIN, "ct state new "),
        (FILTER_PREROUTING, FIREWALL_CHECK_CHAIN, "ct state new "),
        (FILTER_OUTPUT, FIREWALL_CHECK_CHAIN, "ct state new "),
        (NAT_OUTPUT, SERVICES_CHAIN, ""),
        (NAT_PREROUTING, SERVICES_CHAIN, ""),
        (NAT_POSTROUTING, MASQUERADING_CHAIN, ""),
        (FILTER_FORWARD, CLUSTER_IPS_CHECK_CHAIN, "ct state new "),
        (FILTER_OUTPUT_POST_DNAT, CLUSTER_IPS_CHECK_CHAIN, "ct state new "),
        // Skiff routes the service CIDR locally: pod traffic to it arrives at input, after DNAT.
        (FILTER_INPUT, CLUSTER_IPS_CHECK_CHAIN, "ct state new "),
    ] {
        rules.push(rule(from, &format!("{condition}jump {to}")));
    }
    rules.extend([
        rule(MARK_MASQ_CHAIN, &format!("mark set mark or {mark}")),
        rule(MASQUERADING_CHAIN, &format!("mark and {mark} == 0 return")),
        rule(MASQUERADING_CHAIN, &format!("mark set mark xor {mark}")),
        rule(MASQUERADING_CHAIN, "masquerade fully-random"),
        rule(REJECT_CHAIN, "meta l4proto tcp reject with tcp reset"),
        rule(REJECT_CHAIN, "reject"),
        rule(
            CLUSTER_IPS_CHECK_CHAIN,
            &format!(
                "ip daddr @{CLUSTER_IPS_SET} goto {REJECT_CHAIN} comment \"Reject traffic to invalid ports of ClusterIPs\""
            ),
        ),
        rule(
            CLUSTER_IPS_CHECK_CHAIN,
            &format!("ip daddr {service_cidr} goto {REJECT_CHAIN} comment \"Reject traffic to unallocated ClusterIPs\""),
        ),
        rule(
            SERVICE_ENDPOINTS_CHECK_CHAIN,
            &format!("ip daddr . meta l4proto . th dport vmap @{NO_ENDPOINT_SERVICES_MAP}"),
        ),
        rule(
            NODEPORT_ENDPOINTS_CHECK_CHAIN,
            &format!("{local_destinations} meta l4proto . th dport vmap @{NO_ENDPOINT_NODEPORTS_MAP}"),
        ),
        rule(
            FIREWALL_CHECK_CHAIN,
            &format!("ip daddr . meta l4proto . th dport vmap @{FIREWALL_IPS_MAP}"),
        ),
        rule(
            SERVICES_CHAIN,
            &format!(
                "ip saddr {service_cidr} jump {MARK_MASQ_CHAIN} comment \"the node's own connections to a ClusterIP come from it\""
            ),
        ),
        rule(
            SERVICES_CHAIN,
            &format!("ip daddr . meta l4proto . th dport vmap @{SERVICE_IPS_MAP}"),
        ),
        rule(
            SERVICES_CHAIN,
            &format!("{local_destinations} meta l4proto . th dport vmap @{SERVICE_NODEPORTS_MAP}"),
        ),
    ]);
    (declarations, rules)
}

/// The names of one endpoint's chain and affinity set.
struct EndpointNames {
    chain: String,
    affinity_set: String,
}

struct Builder<'a> {
    options: &'a ProxyOptions,
    node: &'a NodeInfo,
    fragment: Fragment,
}

impl Builder<'_> {
    fn ensure_chain(&mut self, name: &str) {
        if !self.fragment.chains.contains_key(name) {
            self.fragment.chains.insert(name.to_string(), Vec::new());
        }
    }

    fn rule(&mut self, chain: &str, rule: String) {
        match self.fragment.chains.get_mut(chain) {
            Some(rules) => rules.push(rule),
            None => {
                self.fragment.chains.insert(chain.to_string(), vec![rule]);
            }
        }
    }

    /// Adds an element, unless this Service claimed the key already (an external IP that is also a
    /// node address, say).
    fn element(&mut self, container: &'static str, key: String, value: String) {
        let elements = &mut self.fragment.elements;
        if !elements.iter().any(|(c, k, _)| *c == container && **k == *key) {
            elements.push((container, Text::from(key), Text::from(value)));
        }
    }

    /// Upstream's loop body of `syncProxyRules` for one service port.
    fn add_service_port(&mut self, port: &ServicePortInfo<'_>, endpoints: &[EndpointInfo]) {
        let protocol = port.protocol;
        let number = port.port;
        let name = format!("{}/{}/{}/{}", port.namespace, port.name, protocol, port.port_name);
        let owner = format!("{}/{}:{}", port.namespace, port.name, port.port_name);
        let base = hash_and_truncate(&name);
        let cluster_chain = format!("{SERVICE_CHAIN_PREFIX}{base}");
        let local_chain = format!("{LOCAL_CHAIN_PREFIX}{base}");
        let external_chain = format!("{EXTERNAL_CHAIN_PREFIX}{base}");
        let firewall_chain = format!("{FIREWALL_CHAIN_PREFIX}{base}");
        let names: Vec<EndpointNames> = endpoints
            .iter()
            .map(|e| {
                let base = hash_and_truncate(&format!("{name}__{}/{}", e.ip, e.port));
                EndpointNames {
                    chain: format!("{ENDPOINT_CHAIN_PREFIX}{base}"),
                    affinity_set: format!("{AFFINITY_SET_PREFIX}{base}"),
                }
            })
            .collect();
        self.fragment.service_ports += 1;

        let cat = categorize(endpoints, port);
        self.fragment.endpoint_chains += cat.reachable.len();
        if protocol == "udp" {
            let mut destinations = vec![UdpDestination::Address(port.cluster_ip, number)];
            destinations.extend(port.external_ips.iter().map(|ip| UdpDestination::Address(*ip, number)));
            destinations.extend(
                port.load_balancer_ips
                    .iter()
                    .map(|ip| UdpDestination::Address(*ip, number)),
            );
            destinations.extend(port.node_port.map(UdpDestination::NodePort));
            for destination in destinations {
                for &i in &cat.reachable {
                    self.fragment.udp_flows.insert((destination, endpoints[i].ip));
                }
            }
        }
        for &i in &cat.reachable {
            self.ensure_chain(&names[i].chain);
        }
        let uses_cluster_chain = !cat.cluster.is_empty() && port.uses_cluster_endpoints();
        if uses_cluster_chain {
            self.ensure_chain(&cluster_chain);
        }
        let uses_local_chain = !cat.local.is_empty() && port.uses_local_endpoints();
        if uses_local_chain {
            self.ensure_chain(&local_chain);
        }
        let (internal_chain, has_internal) = if port.internal_policy_local {
            (&local_chain, cat.has_any && !cat.local.is_empty())
        } else {
            (&cluster_chain, cat.has_any)
        };
        let (external_policy_chain, has_external) = if port.external_policy_local {
            (&local_chain, cat.has_any && !cat.local.is_empty())
        } else {
            (&cluster_chain, cat.has_any)
        };
        let uses_external_chain = cat.has_any && port.externally_accessible();
        if uses_external_chain {
            self.ensure_chain(&external_chain);
        }
        // No endpoint at all: reject. No endpoint for a Local policy: drop, as upstream (the
        // traffic may be meant for another node).
        let no_endpoint_verdict = if cat.has_any {
            "drop".to_string()
        } else {
            format!("goto {REJECT_CHAIN}")
        };
        let no_endpoint_value = format!("comment \"{}\" : {no_endpoint_verdict}", comment(&owner));
        let key = |ip: Ipv4Addr| format!("{ip} . {protocol} . {number}");

        // The ClusterIP.
        self.element(CLUSTER_IPS_SET, port.cluster_ip.to_string(), String::new());
        if has_internal {
            self.element(
                SERVICE_IPS_MAP,
                key(port.cluster_ip),
                format!(": goto {internal_chain}"),
            );
        } else {
            self.element(
                NO_ENDPOINT_SERVICES_MAP,
                key(port.cluster_ip),
                no_endpoint_value.clone(),
            );
        }

        // External IPs and load balancer addresses (the node's own, for type LoadBalancer).
        let mut external_ips = port.external_ips.clone();
        for ip in &port.load_balancer_ips {
            if !external_ips.contains(ip) {
                external_ips.push(*ip);
            }
        }
        for &ip in &external_ips {
            if cat.has_any {
                self.element(SERVICE_IPS_MAP, key(ip), format!(": goto {external_chain}"));
            }
            if !has_external {
                self.element(NO_ENDPOINT_SERVICES_MAP, key(ip), no_endpoint_value.clone());
            }
        }

        // loadBalancerSourceRanges, for the load balancer addresses.
        if !port.load_balancer_ips.is_empty() && !port.source_ranges.is_empty() {
            let mut sources: Vec<String> = port.source_ranges.iter().map(ToString::to_string).collect();
            // A node's connection to its own load balancer address comes from that address.
            let from_node = port
                .source_ranges
                .iter()
                .any(|r| self.node.addresses.iter().any(|a| r.contains(*a)));
            if from_node {
                sources.extend(port.load_balancer_ips.iter().map(ToString::to_string));
            }
            self.rule(
                &firewall_chain,
                format!("ip saddr != {{ {} }} drop", sources.join(", ")),
            );
            for &ip in &port.load_balancer_ips {
                self.element(FIREWALL_IPS_MAP, key(ip), format!(": goto {firewall_chain}"));
            }
        }

        // NodePort.
        if let Some(node_port) = port.node_port {
            let key = format!("{protocol} . {node_port}");
            if cat.has_any {
                self.element(SERVICE_NODEPORTS_MAP, key.clone(), format!(": goto {external_chain}"));
            }
            if !has_external {
                self.element(NO_ENDPOINT_NODEPORTS_MAP, key, no_endpoint_value.clone());
            }
        }

        // Internal traffic from outside the cluster is masqueraded: it may come back from a pod
        // of another node.
        if has_internal && let Some(cluster_cidr) = self.options.cluster_cidr {
            self.rule(
                internal_chain,
                format!(
                    "ip daddr {} {protocol} dport {number} ip saddr != {cluster_cidr} jump {MARK_MASQ_CHAIN}",
                    port.cluster_ip
                ),
            );
        }

        // External traffic.
        if uses_external_chain {
            if !port.external_policy_local {
                // It may go to another node.
                self.rule(&external_chain, format!("jump {MARK_MASQ_CHAIN}"));
            } else {
                if let Some(cluster_cidr) = self.options.cluster_cidr
                    && uses_cluster_chain
                {
                    self.rule(
                        &external_chain,
                        format!("ip saddr {cluster_cidr} goto {cluster_chain} comment \"short-circuit pod traffic\""),
                    );
                }
                // The node's own connections come from a local address, which cannot stay.
                self.rule(
                    &external_chain,
                    format!("fib saddr type local jump {MARK_MASQ_CHAIN} comment \"masquerade local traffic\""),
                );
                if uses_cluster_chain {
                    self.rule(
                        &external_chain,
                        format!("fib saddr type local goto {cluster_chain} comment \"short-circuit local traffic\""),
                    );
                }
            }
            if has_external {
                self.rule(&external_chain, format!("goto {external_policy_chain}"));
            }
        }

        // ClientIP affinity: one set per endpoint of the client addresses sent there.
        if let Some(timeout) = port.affinity_timeout {
            for &i in &cat.reachable {
                self.fragment
                    .affinity_sets
                    .insert(names[i].affinity_set.clone(), timeout);
            }
        }
        let affinity = port.affinity_timeout.is_some();
        if uses_cluster_chain {
            self.service_to_endpoints(&cluster_chain, affinity, &cat.cluster, &names);
        }
        if uses_local_chain {
            self.service_to_endpoints(&local_chain, affinity, &cat.local, &names);
        }

        // The endpoint chains.
        for &i in &cat.reachable {
            let endpoint = &endpoints[i];
            let names = &names[i];
            // Hairpin: an endpoint reaching itself through its Service.
            self.rule(&names.chain, format!("ip saddr {} jump {MARK_MASQ_CHAIN}", endpoint.ip));
            if affinity {
                self.rule(&names.chain, format!("update @{} {{ ip saddr }}", names.affinity_set));
            }
            self.rule(
                &names.chain,
                format!("meta l4proto {protocol} dnat to {}:{}", endpoint.ip, endpoint.port),
            );
        }
    }

    /// Upstream's `writeServiceToEndpointRules`.
    fn service_to_endpoints(&mut self, chain: &str, affinity: bool, endpoints: &[usize], names: &[EndpointNames]) {
        if affinity {
            for &i in endpoints {
                self.rule(
                    chain,
                    format!("ip saddr @{} goto {}", names[i].affinity_set, names[i].chain),
                );
            }
        }
        let mut vmap = String::new();
        for (n, &i) in endpoints.iter().enumerate() {
            if n > 0 {
                vmap.push_str(", ");
            }
            let _ = write!(vmap, "{n} : goto {}", names[i].chain);
        }
        self.rule(
            chain,
            format!("numgen random mod {} vmap {{ {vmap} }}", endpoints.len()),
        );
    }
}

/// The text of one full transaction for these Services and EndpointSlices: see [`Ruleset::build`]
/// and [`Ruleset::full_transaction`].
pub fn ruleset_text(services: &[Service], slices: &[EndpointSlice], node: &NodeInfo, options: &ProxyOptions) -> String {
    Ruleset::build(services, slices, node, options).full_transaction()
}

/// The network namespace the proxy's commands act on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NetworkNamespace {
    /// The agent's own (the node's).
    #[default]
    Current,
    /// A named namespace (`ip netns exec NAME …`): tests, and nodes simulated in namespaces.
    Named(String),
}

impl NetworkNamespace {
    pub(crate) fn command(&self, program: &str) -> tokio::process::Command {
        match self {
            NetworkNamespace::Current => tokio::process::Command::new(program),
            NetworkNamespace::Named(name) => {
                let mut command = tokio::process::Command::new("ip");
                command.args(["netns", "exec", name.as_str(), program]);
                command
            }
        }
    }
}

/// Runs `command`, with `input` on its standard input; its standard output, or an error with its
/// standard error.
pub(crate) async fn run_command(
    mut command: tokio::process::Command,
    input: Option<&str>,
    what: &str,
) -> anyhow::Result<String> {
    command
        .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().with_context(|| format!("starting {what}"))?;
    if let Some(input) = input {
        let mut stdin = child.stdin.take().context("no standard input")?;
        stdin
            .write_all(input.as_bytes())
            .await
            .with_context(|| format!("writing to {what}"))?;
        drop(stdin);
    }
    let output = child
        .wait_with_output()
        .await
        .with_context(|| format!("waiting for {what}"))?;
    if !output.status.success() {
        let mut stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        if stderr.len() > 4_000 {
            let mut end = 4_000;
            while !stderr.is_char_boundary(end) {
                end -= 1;
            }
            stderr.truncate(end);
            stderr.push('…');
        }
        bail!("{what} failed ({}): {}", output.status, stderr.trim());
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Runs one nft transaction (`nft -f -`).
pub async fn run_nft(netns: &NetworkNamespace, transaction: &str) -> anyhow::Result<()> {
    let mut command = netns.command("nft");
    command.args(["-f", "-"]);
    run_command(command, Some(transaction), "nft -f -").await.map(drop)
}

/// Removes Skiff's table, if there is one.
pub async fn cleanup(netns: &NetworkNamespace, table: &str) -> anyhow::Result<()> {
    run_nft(
        netns,
        &format!("add table {FAMILY} {table}\ndelete table {FAMILY} {table}\n"),
    )
    .await
    .context("deleting the proxy's nftables table")
}

/// Routes the whole service CIDR to this machine (`ip route replace local CIDR dev lo table
/// local`), so no address of it leaves the machine even when no Skiff process runs: the
/// ClusterIPs are DNATed before that route matters, and the others are rejected by the table (or
/// answered by the node itself when there is no table).
pub async fn ensure_service_cidr_route(netns: &NetworkNamespace, cidr: Ipv4Cidr) -> anyhow::Result<()> {
    let mut command = netns.command("ip");
    command.args([
        "route",
        "replace",
        "local",
        &cidr.to_string(),
        "dev",
        "lo",
        "table",
        "local",
    ]);
    run_command(command, None, "ip route replace local")
        .await
        .with_context(|| format!("routing the service CIDR {cidr} locally"))
        .map(drop)
}

/// Sets `net.ipv4.conf.all.route_localnet=1`, which NodePorts on 127.0.0.1 need.
pub async fn enable_route_localnet(netns: &NetworkNamespace) -> anyhow::Result<()> {
    const SYSCTL: &str = "net.ipv4.conf.all.route_localnet";
    match netns {
        NetworkNamespace::Current => tokio::fs::write("/proc/sys/net/ipv4/conf/all/route_localnet", "1")
            .await
            .with_context(|| format!("setting {SYSCTL}")),
        NetworkNamespace::Named(_) => {
            let mut command = netns.command("sysctl");
            command.args(["-qw", &format!("{SYSCTL}=1")]);
            run_command(command, None, "sysctl").await.map(drop)
        }
    }
}

/// How a [`Proxier`] runs.
#[derive(Clone, Debug)]
pub struct ProxierConfig {
    /// The node.
    pub node: NodeInfo,
    /// How rules are made.
    pub options: ProxyOptions,
    /// Where the rules go.
    pub netns: NetworkNamespace,
    /// How often the table is checked to still be there (someone's `nft flush ruleset`, such as
    /// a restart of Debian's nftables service, removes it); it is rebuilt when it is not.
    pub probe_period: Duration,
}

impl ProxierConfig {
    /// A configuration for the agent's own network namespace.
    pub fn new(node: NodeInfo, options: ProxyOptions) -> Self {
        Self {
            node,
            options,
            netns: NetworkNamespace::Current,
            probe_period: Duration::from_secs(60),
        }
    }
}

/// Figures of the last sync that ran nft.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncStats {
    /// Whether it rebuilt the whole table.
    pub full: bool,
    /// The generation of the Services and EndpointSlices it put in force.
    pub generation: u64,
    /// Service ports and endpoint chains in the ruleset.
    pub service_ports: usize,
    /// Endpoint chains in the ruleset.
    pub endpoint_chains: usize,
    /// Time to build the ruleset and the transaction.
    pub build: Duration,
    /// Time nft took.
    pub nft: Duration,
    /// Size of the transaction's text.
    pub transaction_bytes: usize,
}

#[derive(Debug)]
struct State {
    services: BTreeMap<Key, Arc<Service>>,
    slices: BTreeMap<Key, Arc<EndpointSlice>>,
    services_synced: bool,
    slices_synced: bool,
    /// Bumped on every change; a sync puts one generation in force.
    generation: u64,
    nft_runs: u64,
    last_sync: Option<SyncStats>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    wake: Notify,
    /// The generation in force.
    applied: watch::Sender<u64>,
}

#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// kube-proxy's role for this node: keeps the Services and EndpointSlices it is told of and keeps
/// Skiff's table in step with them, from a background task. Syncs coalesce: one runs at a time,
/// and every change made while it runs goes into the next, which starts as soon as it ends. No
/// sync runs before both the Services and the EndpointSlices were listed once
/// ([`Proxier::replace_services`], [`Proxier::replace_endpoint_slices`]), so a restart never puts
/// a table without endpoints in force.
///
/// Clones share the proxier; the task stops when the last clone is dropped (the table stays).
#[derive(Clone, Debug)]
pub struct Proxier {
    shared: Arc<Shared>,
    _task: Arc<AbortOnDrop>,
}

fn key(metadata: &ObjectMeta) -> Option<Key> {
    let name = metadata.name.clone()?;
    Some((metadata.namespace.clone().unwrap_or_else(|| "default".into()), name))
}

/// Whether two versions of an object are the same (the same resourceVersion).
fn same_version(a: &ObjectMeta, b: &ObjectMeta) -> bool {
    a.resource_version.is_some() && a.resource_version == b.resource_version && a.uid == b.uid
}

impl Proxier {
    /// Starts the proxier's sync task (inside a Tokio runtime).
    pub fn start(config: ProxierConfig) -> Proxier {
        let (applied, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                services: BTreeMap::new(),
                slices: BTreeMap::new(),
                services_synced: false,
                slices_synced: false,
                generation: 1,
                nft_runs: 0,
                last_sync: None,
            }),
            wake: Notify::new(),
            applied,
        });
        let task = tokio::spawn(sync_loop(shared.clone(), config));
        Proxier {
            shared,
            _task: Arc::new(AbortOnDrop(task)),
        }
    }

    fn changed(&self, state: &mut State) {
        state.generation += 1;
        self.shared.wake.notify_one();
    }

    /// A Service was created or changed.
    pub fn apply_service(&self, service: Service) {
        let Some(key) = key(&service.metadata) else {
            tracing::warn!("ignoring a Service without a name");
            return;
        };
        let mut state = self.shared.state.lock();
        if let Some(old) = state.services.get(&key)
            && same_version(&old.metadata, &service.metadata)
        {
            return;
        }
        state.services.insert(key, Arc::new(service));
        self.changed(&mut state);
    }

    /// A Service was deleted.
    pub fn delete_service(&self, namespace: &str, name: &str) {
        let mut state = self.shared.state.lock();
        if state
            .services
            .remove(&(namespace.to_string(), name.to_string()))
            .is_some()
        {
            self.changed(&mut state);
        }
    }

    /// All Services, as a list returned them: those not in it are gone. The first call lets syncs
    /// begin (with the first [`Proxier::replace_endpoint_slices`]).
    pub fn replace_services(&self, services: Vec<Service>) {
        let services = services
            .into_iter()
            .filter_map(|s| Some((key(&s.metadata)?, Arc::new(s))))
            .collect();
        let mut state = self.shared.state.lock();
        state.services = services;
        state.services_synced = true;
        self.changed(&mut state);
    }

    /// An EndpointSlice was created or changed.
    pub fn apply_endpoint_slice(&self, slice: EndpointSlice) {
        let Some(key) = key(&slice.metadata) else {
            tracing::warn!("ignoring an EndpointSlice without a name");
            return;
        };
        let mut state = self.shared.state.lock();
        if let Some(old) = state.slices.get(&key)
            && same_version(&old.metadata, &slice.metadata)
        {
            return;
        }
        state.slices.insert(key, Arc::new(slice));
        self.changed(&mut state);
    }

    /// An EndpointSlice was deleted.
    pub fn delete_endpoint_slice(&self, namespace: &str, name: &str) {
        let mut state = self.shared.state.lock();
        if state
            .slices
            .remove(&(namespace.to_string(), name.to_string()))
            .is_some()
        {
            self.changed(&mut state);
        }
    }

    /// All EndpointSlices, as a list returned them. The first call lets syncs begin (with the
    /// first [`Proxier::replace_services`]).
    pub fn replace_endpoint_slices(&self, slices: Vec<EndpointSlice>) {
        let slices = slices
            .into_iter()
            .filter_map(|s| Some((key(&s.metadata)?, Arc::new(s))))
            .collect();
        let mut state = self.shared.state.lock();
        state.slices = slices;
        state.slices_synced = true;
        self.changed(&mut state);
    }

    /// Waits until every change told before the call is in force (forever while syncs fail or
    /// before the first lists).
    pub async fn synced(&self) {
        let target = self.shared.state.lock().generation;
        let mut applied = self.shared.applied.subscribe();
        // The sender lives as long as `self`.
        let _ = applied.wait_for(|g| *g >= target).await;
    }

    /// The resourceVersion of the EndpointSlice the proxier holds as `namespace/name`.
    pub fn endpoint_slice_version(&self, namespace: &str, name: &str) -> Option<String> {
        let state = self.shared.state.lock();
        let slice = state.slices.get(&(namespace.to_string(), name.to_string()))?;
        slice.metadata.resource_version.clone()
    }

    /// How many times a sync ran nft.
    pub fn nft_runs(&self) -> u64 {
        self.shared.state.lock().nft_runs
    }

    /// Figures of the last sync that ran nft.
    pub fn last_sync(&self) -> Option<SyncStats> {
        self.shared.state.lock().last_sync.clone()
    }
}

/// The sync task's own state.
struct Syncer {
    config: ProxierConfig,
    /// What the kernel has, when known.
    applied: Option<Arc<Ruleset>>,
    applied_generation: u64,
    /// Flushed chains to delete, and when they were flushed.
    stale: BTreeMap<String, Instant>,
    /// The rules of unchanged Services, from earlier syncs (`None` while a build has it).
    cache: Option<FragmentCache>,
    /// Whether the service CIDR route and route_localnet are in place.
    prepared: bool,
    failures: u32,
    retry_at: Option<Instant>,
    next_probe: Instant,
    /// Whether a failed conntrack clean-up was reported (once is enough).
    conntrack_warned: bool,
}

async fn sync_loop(shared: Arc<Shared>, config: ProxierConfig) {
    let mut syncer = Syncer {
        next_probe: Instant::now() + config.probe_period,
        config,
        applied: None,
        applied_generation: 0,
        stale: BTreeMap::new(),
        cache: Some(FragmentCache::default()),
        prepared: false,
        failures: 0,
        retry_at: None,
        conntrack_warned: false,
    };
    loop {
        let now = Instant::now();
        let (ready, generation) = {
            let state = shared.state.lock();
            (state.services_synced && state.slices_synced, state.generation)
        };
        let dirty = syncer.applied.is_none() || syncer.applied_generation != generation;
        let stale_due = syncer.stale.values().any(|t| now >= *t + STALE_CHAIN_SWEEP);
        let may_retry = syncer.retry_at.is_none_or(|t| now >= t);
        if ready && may_retry && (dirty || stale_due) {
            syncer.sync(&shared).await;
            continue;
        }
        if ready && syncer.applied.is_some() && now >= syncer.next_probe {
            syncer.next_probe = now + syncer.config.probe_period;
            syncer.probe().await;
            continue;
        }
        let mut deadline = syncer.next_probe;
        if dirty && let Some(t) = syncer.retry_at {
            deadline = deadline.min(t);
        }
        if let Some(t) = syncer.stale.values().min() {
            deadline = deadline.min(*t + STALE_CHAIN_SWEEP);
        }
        tokio::select! {
            _ = shared.wake.notified() => {}
            _ = tokio::time::sleep_until(deadline.into()) => {}
        }
    }
}

impl Syncer {
    fn backoff(&mut self) {
        self.failures = self.failures.saturating_add(1);
        let delay = Duration::from_secs(1 << self.failures.min(5)).min(Duration::from_secs(30));
        self.retry_at = Some(Instant::now() + delay);
    }

    async fn prepare(&self) -> anyhow::Result<()> {
        let netns = &self.config.netns;
        ensure_service_cidr_route(netns, self.config.options.service_cidr).await?;
        if self.config.options.localhost_nodeports {
            enable_route_localnet(netns).await?;
        }
        Ok(())
    }

    async fn probe(&mut self) {
        let mut command = self.config.netns.command("nft");
        command.args(["list", "chain", FAMILY, &self.config.options.table, SERVICES_CHAIN]);
        if let Err(e) = run_command(command, None, "nft list chain").await {
            tracing::warn!(error = %format!("{e:#}"), "the proxy's nftables table is gone; rebuilding it");
            self.applied = None;
        }
    }

    async fn sync(&mut self, shared: &Shared) {
        if !self.prepared {
            match self.prepare().await {
                Ok(()) => self.prepared = true,
                Err(e) => {
                    tracing::error!(error = %format!("{e:#}"), "preparing the node for the service proxy");
                    self.backoff();
                    return;
                }
            }
        }
        let now = Instant::now();
        let due: Vec<String> = self
            .stale
            .iter()
            .filter(|(_, t)| now >= **t + STALE_CHAIN_DELAY)
            .map(|(name, _)| name.clone())
            .collect();
        if self.applied.is_some() && shared.state.lock().generation == self.applied_generation {
            // Only stale chains to delete: no ruleset to build (none of them is in use, or it
            // would have left `stale`).
            self.delete_stale_chains(shared, due).await;
            return;
        }
        let (generation, services, slices) = {
            let state = shared.state.lock();
            (
                state.generation,
                state.services.values().cloned().collect::<Vec<_>>(),
                state.slices.values().cloned().collect::<Vec<_>>(),
            )
        };
        let previous = self.applied.clone();
        let node = self.config.node.clone();
        let options = self.config.options.clone();
        let mut cache = self.cache.take().unwrap_or_default();
        let built = tokio::task::spawn_blocking(move || {
            let start = Instant::now();
            let ruleset = Ruleset::build_cached(
                services.iter().map(|s| &**s),
                slices.iter().map(|s| &**s),
                &node,
                &options,
                &mut cache,
            );
            let transaction = ruleset.transaction(previous.as_deref(), &due);
            let stale_flows = previous
                .as_deref()
                .map(|p| ruleset.stale_udp_flows(p))
                .unwrap_or_default();
            let elapsed = start.elapsed();
            // The snapshot is dropped here, off the async threads.
            drop((services, slices, previous));
            (ruleset, transaction, due, cache, elapsed, stale_flows)
        })
        .await;
        let (ruleset, transaction, due, build, stale_flows) = match built {
            Ok((ruleset, transaction, due, cache, build, stale_flows)) => {
                self.cache = Some(cache);
                (ruleset, transaction, due, build, stale_flows)
            }
            Err(e) => {
                tracing::error!(error = %e, "building the proxy's ruleset");
                self.backoff();
                return;
            }
        };
        // Chains in use again are no longer stale.
        if !self.stale.is_empty() {
            let in_use: HashSet<&str> = ruleset.chain_names().collect();
            self.stale.retain(|name, _| !in_use.contains(name.as_str()));
        }
        let (text, full, stale_chains) = match transaction {
            Transaction::Unchanged => {
                self.applied = Some(Arc::new(ruleset));
                self.put_in_force(shared, generation);
                return;
            }
            Transaction::Full(text) => (text, true, Vec::new()),
            Transaction::Update { text, stale_chains } => (text, false, stale_chains),
        };
        let start = Instant::now();
        let result = run_nft(&self.config.netns, &text).await;
        let nft = start.elapsed();
        shared.state.lock().nft_runs += 1;
        match result {
            Ok(()) => {
                if full {
                    self.stale.clear();
                } else {
                    for name in &due {
                        self.stale.remove(name);
                    }
                    let now = Instant::now();
                    for name in stale_chains {
                        self.stale.insert(name, now);
                    }
                }
                let stats = SyncStats {
                    full,
                    generation,
                    service_ports: ruleset.service_ports(),
                    endpoint_chains: ruleset.endpoint_chains(),
                    build,
                    nft,
                    transaction_bytes: text.len(),
                };
                if full {
                    tracing::info!(?stats, "synced the service proxy's rules (full)");
                } else {
                    tracing::debug!(?stats, "synced the service proxy's rules");
                }
                self.applied = Some(Arc::new(ruleset));
                self.failures = 0;
                self.retry_at = None;
                shared.state.lock().last_sync = Some(stats);
                self.put_in_force(shared, generation);
                self.clear_conntrack(stale_flows).await;
            }
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), full, "syncing the service proxy's nftables rules");
                // What the kernel has is unknown now: the next sync is a full one, at once after
                // a failed update, after a back-off after a failed full sync.
                self.applied = None;
                if full {
                    self.backoff();
                }
            }
        }
    }

    /// Deletes the conntrack entries of UDP flows DNATed to endpoints no longer used, after the
    /// rules changed (so no new entry to them can be made meanwhile).
    async fn clear_conntrack(&mut self, flows: Vec<(UdpDestination, Ipv4Addr)>) {
        for (destination, endpoint) in flows {
            let mut command = self.config.netns.command("conntrack");
            command.args(destination.conntrack_args(endpoint));
            match run_command(command, None, "conntrack -D").await {
                Ok(_) => {}
                // conntrack exits 1 when nothing matched.
                Err(e) if format!("{e:#}").contains("0 flow entries") => {}
                Err(e) => {
                    if !self.conntrack_warned {
                        tracing::warn!(error = %format!("{e:#}"), "clearing stale UDP conntrack entries (is conntrack installed?)");
                        self.conntrack_warned = true;
                    }
                    return;
                }
            }
        }
    }

    async fn delete_stale_chains(&mut self, shared: &Shared, due: Vec<String>) {
        if due.is_empty() {
            return;
        }
        let table = &self.config.options.table;
        let mut text = String::new();
        line(&mut text, format_args!("add table {FAMILY} {table}"));
        for name in &due {
            line(&mut text, format_args!("delete chain {FAMILY} {table} {name}"));
        }
        let result = run_nft(&self.config.netns, &text).await;
        shared.state.lock().nft_runs += 1;
        match result {
            Ok(()) => {
                for name in &due {
                    self.stale.remove(name);
                }
                tracing::debug!(chains = due.len(), "deleted stale chains");
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "deleting stale chains; rebuilding the table");
                self.applied = None;
            }
        }
    }

    fn put_in_force(&mut self, shared: &Shared, generation: u64) {
        self.applied_generation = generation;
        shared.applied.send_replace(generation);
    }
}

/// A change seen by a watch.
enum Feed<K> {
    Apply(K),
    Delete(K),
    Replace(Vec<K>),
}

/// Follows a watch, turning its events into [`Feed`]s; a relist (after the watch's history was
/// compacted, say) becomes one `Replace`, so deletions missed meanwhile are not missed for good.
async fn feed<K>(api: Api<K>, what: &'static str, mut on: impl FnMut(Feed<K>))
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + fmt::Debug + Send + 'static,
{
    let mut stream = watcher(api, watcher::Config::default()).default_backoff().boxed();
    let mut listing: Vec<K> = Vec::new();
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Init) => listing.clear(),
            Ok(watcher::Event::InitApply(object)) => listing.push(object),
            Ok(watcher::Event::InitDone) => on(Feed::Replace(std::mem::take(&mut listing))),
            Ok(watcher::Event::Apply(object)) => on(Feed::Apply(object)),
            Ok(watcher::Event::Delete(object)) => on(Feed::Delete(object)),
            Err(e) => tracing::warn!(error = %e, what, "watching for the service proxy"),
        }
    }
}

/// Feeds `proxier` from watches on all Services and EndpointSlices until they end (they normally
/// never do: the watcher retries with a back-off).
pub async fn run(client: kube::Client, proxier: Proxier) -> anyhow::Result<()> {
    let services = {
        let proxier = proxier.clone();
        feed(
            Api::<Service>::all(client.clone()),
            "services",
            move |change| match change {
                Feed::Apply(service) => proxier.apply_service(service),
                Feed::Delete(service) => {
                    if let Some((namespace, name)) = key(&service.metadata) {
                        proxier.delete_service(&namespace, &name);
                    }
                }
                Feed::Replace(services) => proxier.replace_services(services),
            },
        )
    };
    let slices = feed(
        Api::<EndpointSlice>::all(client),
        "endpointslices",
        move |change| match change {
            Feed::Apply(slice) => proxier.apply_endpoint_slice(slice),
            Feed::Delete(slice) => {
                if let Some((namespace, name)) = key(&slice.metadata) {
                    proxier.delete_endpoint_slice(&namespace, &name);
                }
            }
            Feed::Replace(slices) => proxier.replace_endpoint_slices(slices),
        },
    );
    tokio::join!(services, slices);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use std::process::{Child, Command};

    fn node() -> NodeInfo {
        NodeInfo {
            name: "node-a".into(),
            addresses: vec![Ipv4Addr::new(192, 0, 2, 10)],
        }
    }

    fn options() -> ProxyOptions {
        ProxyOptions {
            cluster_cidr: Some("10.244.0.0/16".parse().expect("cidr")),
            ..ProxyOptions::default()
        }
    }

    /// A Service in `default` with ClusterIP `ip` and port `http` 80 -> 8080, `spec` merged over.
    fn service(name: &str, ip: &str, spec: Value) -> Service {
        let mut full = json!({
            "clusterIP": ip,
            "clusterIPs": [ip],
            "type": "ClusterIP",
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}],
        });
        if let (Some(full), Value::Object(spec)) = (full.as_object_mut(), spec) {
            full.extend(spec);
        }
        serde_json::from_value(json!({
            "metadata": {"namespace": "default", "name": name, "resourceVersion": "1", "uid": name},
            "spec": full,
        }))
        .expect("a Service")
    }

    fn slice(service: &str, name: &str, ports: Value, endpoints: Value) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {
                "namespace": "default",
                "name": name,
                "resourceVersion": "1",
                "labels": {SERVICE_NAME_LABEL: service},
            },
            "addressType": "IPv4",
            "ports": ports,
            "endpoints": endpoints,
        }))
        .expect("an EndpointSlice")
    }

    fn http_port() -> Value {
        json!([{"name": "http", "port": 8080, "protocol": "TCP"}])
    }

    fn endpoint(ip: &str, node: &str) -> Value {
        json!({"addresses": [ip], "conditions": {"ready": true}, "nodeName": node})
    }

    fn build(services: &[Service], slices: &[EndpointSlice]) -> Ruleset {
        let ruleset = Ruleset::build(services, slices, &node(), &options());
        check_references(&ruleset);
        ruleset
    }

    fn chain_base(name: &str) -> String {
        hash_and_truncate(name)
    }

    /// Every chain a rule or element jumps to is declared, and every `@set` too.
    fn check_references(ruleset: &Ruleset) {
        let text = ruleset.full_transaction();
        let mut chains = HashSet::new();
        let mut sets = HashSet::new();
        for line in text.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            if words.len() >= 5 && words[0] == "add" && words[2] == "ip" && words[3] == "skiff" {
                match words[1] {
                    "chain" => chains.insert(words[4].to_string()),
                    "set" | "map" => sets.insert(words[4].to_string()),
                    _ => false,
                };
            }
        }
        for line in text.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            for pair in words.windows(2) {
                if pair[0] == "goto" || pair[0] == "jump" {
                    let target = pair[1].trim_end_matches([',', '}']);
                    assert!(chains.contains(target), "{line}: no chain {target}");
                }
            }
            for word in &words {
                if let Some(set) = word.strip_prefix('@') {
                    assert!(sets.contains(set), "{line}: no set {set}");
                }
            }
        }
    }

    #[test]
    fn each_service_cidr_has_a_table_of_its_own() {
        assert_eq!(table_name(DEFAULT_SERVICE_CIDR), "skiff");
        let other: Ipv4Cidr = "10.200.3.64/26".parse().expect("cidr");
        assert_eq!(table_name(other), "skiff-10-200-3-64-26");
        let options = ProxyOptions::for_service_cidr(other);
        let ruleset = Ruleset::build(&[service("web", "10.200.3.70", json!({}))], &[], &node(), &options);
        let text = ruleset.full_transaction();
        assert!(text.starts_with("add table ip skiff-10-200-3-64-26\n"), "{text}");
        assert!(text.lines().all(|l| !l.contains(" ip skiff ")), "{text}");
        // A ruleset for another table is never applied as an update of this one.
        let default = Ruleset::build(
            &[service("web", "10.96.0.70", json!({}))],
            &[],
            &node(),
            &ProxyOptions::default(),
        );
        assert!(matches!(ruleset.transaction(Some(&default), &[]), Transaction::Full(_)));
    }

    #[test]
    fn chain_names_are_hashed_as_upstreams() {
        let base = hash_and_truncate("ns1/svc1/tcp/p80");
        assert_eq!(base.len(), 8 + 1 + "ns1/svc1/tcp/p80".len());
        assert!(
            base[..8]
                .bytes()
                .all(|b| b.is_ascii_uppercase() || (b'2'..=b'7').contains(&b))
        );
        assert!(base.ends_with("-ns1/svc1/tcp/p80"));
        assert_ne!(base[..8], hash_and_truncate("ns1/svc1/tcp/p81")[..8]);
        let long = hash_and_truncate(&"x".repeat(400));
        assert_eq!(long.len(), CHAIN_NAME_BASE_MAX);
        assert!(long.ends_with("..."));
        assert!(hash_and_truncate("a b\"c").ends_with("-a_b_c"));
    }

    #[test]
    fn cluster_ip_with_three_endpoints_picks_one_at_random() {
        let services = [service("web", "10.96.0.10", json!({}))];
        let slices = [slice(
            "web",
            "web-1",
            http_port(),
            json!([
                endpoint("10.244.1.3", "node-b"),
                endpoint("10.244.1.1", "node-b"),
                endpoint("10.244.1.2", "node-a"),
            ]),
        )];
        let ruleset = build(&services, &slices);
        let text = ruleset.full_transaction();
        let service_chain = format!("service-{}", chain_base("default/web/tcp/http"));
        assert!(
            text.contains(&format!(
                "add element ip skiff service-ips {{ 10.96.0.10 . tcp . 80 : goto {service_chain} }}"
            )),
            "{text}"
        );
        assert!(text.contains("add element ip skiff cluster-ips { 10.96.0.10 }"));
        let endpoints: Vec<String> = ["10.244.1.1", "10.244.1.2", "10.244.1.3"]
            .iter()
            .map(|ip| format!("endpoint-{}", chain_base(&format!("default/web/tcp/http__{ip}/8080"))))
            .collect();
        assert!(text.contains(&format!(
            "add rule ip skiff {service_chain} numgen random mod 3 vmap {{ 0 : goto {}, 1 : goto {}, 2 : goto {} }}",
            endpoints[0], endpoints[1], endpoints[2]
        )));
        // Traffic from outside the cluster CIDR is masqueraded, before the endpoint is picked.
        let rules = ruleset.chain(&service_chain).expect("the chain");
        assert_eq!(
            rules[0],
            "ip daddr 10.96.0.10 tcp dport 80 ip saddr != 10.244.0.0/16 jump mark-for-masquerade"
        );
        for (chain, ip) in endpoints.iter().zip(["10.244.1.1", "10.244.1.2", "10.244.1.3"]) {
            assert_eq!(
                ruleset.chain(chain).expect("the chain"),
                vec![
                    format!("ip saddr {ip} jump mark-for-masquerade"),
                    format!("meta l4proto tcp dnat to {ip}:8080"),
                ]
            );
        }
        assert_eq!(ruleset.service_ports(), 1);
        assert_eq!(ruleset.endpoint_chains(), 3);
        assert!(!text.contains("add element ip skiff no-endpoint-services"));
        // The table is replaced in the same transaction.
        assert!(text.starts_with("add table ip skiff\ndelete table ip skiff\nadd table ip skiff\n"));
    }

    #[test]
    fn service_without_endpoints_is_rejected() {
        let services = [service("empty", "10.96.0.11", json!({}))];
        let not_ready = [slice(
            "empty",
            "empty-1",
            http_port(),
            json!([{"addresses": ["10.244.1.9"], "conditions": {"ready": false}}]),
        )];
        for slices in [&[][..], &not_ready[..]] {
            let ruleset = build(&services, slices);
            let text = ruleset.full_transaction();
            assert!(
                text.contains(
                    "add element ip skiff no-endpoint-services { 10.96.0.11 . tcp . 80 comment \"default/empty:http\" : goto reject-chain }"
                ),
                "{text}"
            );
            assert!(text.contains("add element ip skiff cluster-ips { 10.96.0.11 }"));
            assert!(!text.contains("add element ip skiff service-ips"));
            assert_eq!(ruleset.chain_names().count(), 0);
        }
        // Reject means a reset for TCP, an ICMP error otherwise; addresses of the service CIDR that
        // are no ClusterIP are rejected too.
        let text = build(&services, &[]).full_transaction();
        assert!(text.contains("add rule ip skiff reject-chain meta l4proto tcp reject with tcp reset\n"));
        assert!(text.contains("add rule ip skiff reject-chain reject\n"));
        assert!(text.contains("add rule ip skiff cluster-ips-check ip daddr 10.96.0.0/12 goto reject-chain"));
        assert!(text.contains("add rule ip skiff filter-input ct state new jump cluster-ips-check"));
        assert!(text.contains("add rule ip skiff filter-output ct state new jump service-endpoints-check"));
    }

    #[test]
    fn named_target_ports_come_from_the_slice_port_of_the_same_name() {
        let services = [service(
            "app",
            "10.96.0.12",
            json!({"ports": [
                {"name": "http", "port": 80, "targetPort": "web"},
                {"name": "metrics", "port": 9100, "targetPort": "prom"},
                {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353},
            ]}),
        )];
        let slices = [
            slice(
                "app",
                "app-a",
                json!([
                    {"name": "metrics", "port": 9090, "protocol": "TCP"},
                    {"name": "http", "port": 8080, "protocol": "TCP"},
                    {"name": "dns", "port": 5353, "protocol": "UDP"},
                ]),
                json!([endpoint("10.244.1.1", "node-b")]),
            ),
            // Another slice of the same Service, whose pods use another port number.
            slice(
                "app",
                "app-b",
                json!([{"name": "http", "port": 8081, "protocol": "TCP"}]),
                json!([endpoint("10.244.2.1", "node-c")]),
            ),
        ];
        let text = build(&services, &slices).full_transaction();
        for expected in [
            "meta l4proto tcp dnat to 10.244.1.1:8080",
            "meta l4proto tcp dnat to 10.244.2.1:8081",
            "meta l4proto tcp dnat to 10.244.1.1:9090",
            "meta l4proto udp dnat to 10.244.1.1:5353",
            "10.96.0.12 . udp . 53 : goto service-",
            "10.96.0.12 . tcp . 9100 : goto service-",
        ] {
            assert!(text.contains(expected), "{expected} in {text}");
        }
        assert!(!text.contains("10.244.2.1:9090"));
        assert!(text.contains("numgen random mod 2 vmap"));
    }

    #[test]
    fn client_ip_affinity_uses_per_endpoint_sets_with_the_timeout() {
        let services = [service(
            "sticky",
            "10.96.0.13",
            json!({"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}}}),
        )];
        let slices = [slice(
            "sticky",
            "sticky-1",
            http_port(),
            json!([endpoint("10.244.1.1", "node-b"), endpoint("10.244.1.2", "node-b")]),
        )];
        let ruleset = build(&services, &slices);
        let text = ruleset.full_transaction();
        let service_chain = format!("service-{}", chain_base("default/sticky/tcp/http"));
        for ip in ["10.244.1.1", "10.244.1.2"] {
            let base = chain_base(&format!("default/sticky/tcp/http__{ip}/8080"));
            assert!(text.contains(&format!(
                "add set ip skiff affinity-{base} {{ type ipv4_addr ; flags dynamic,timeout ; timeout 600s ; }}"
            )));
            assert!(text.contains(&format!(
                "add rule ip skiff {service_chain} ip saddr @affinity-{base} goto endpoint-{base}"
            )));
            assert_eq!(
                ruleset.chain(&format!("endpoint-{base}")).expect("the chain"),
                vec![
                    format!("ip saddr {ip} jump mark-for-masquerade"),
                    format!("update @affinity-{base} {{ ip saddr }}"),
                    format!("meta l4proto tcp dnat to {ip}:8080"),
                ]
            );
        }
        // The affinity rules come before the random pick.
        let rules = ruleset.chain(&service_chain).expect("the chain");
        assert!(rules.last().is_some_and(|r| r.starts_with("numgen random mod 2")));
        // Without a timeout, upstream's default of three hours.
        let services = [service("sticky", "10.96.0.13", json!({"sessionAffinity": "ClientIP"}))];
        assert!(build(&services, &slices).full_transaction().contains("timeout 10800s"));
    }

    #[test]
    fn node_port_masquerades_and_answers_on_every_local_address() {
        let services = [service(
            "np",
            "10.96.0.14",
            json!({"type": "NodePort", "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}),
        )];
        let slices = [slice(
            "np",
            "np-1",
            http_port(),
            json!([endpoint("10.244.1.1", "node-b")]),
        )];
        let ruleset = build(&services, &slices);
        let text = ruleset.full_transaction();
        let base = chain_base("default/np/tcp/http");
        assert!(text.contains(&format!(
            "add element ip skiff service-nodeports {{ tcp . 30080 : goto external-{base} }}"
        )));
        assert_eq!(
            ruleset.chain(&format!("external-{base}")).expect("the chain"),
            vec!["jump mark-for-masquerade".to_string(), format!("goto service-{base}")]
        );
        // Every local address but the service CIDR's, 127.0.0.1 included, and the martian guard.
        assert!(text.contains(
            "add rule ip skiff services ip daddr != 10.96.0.0/12 fib daddr type local meta l4proto . th dport vmap @service-nodeports"
        ));
        assert!(text.contains("add rule ip skiff filter-input ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8"));
        // Without localhost NodePorts, as upstream's nftables mode.
        let options = ProxyOptions {
            localhost_nodeports: false,
            ..options()
        };
        let text = Ruleset::build(&services, &slices, &node(), &options).full_transaction();
        assert!(text.contains("ip daddr != 10.96.0.0/12 ip daddr != 127.0.0.0/8 fib daddr type local"));
        assert!(!text.contains("route_localnet"));
        // No endpoints: the NodePort is rejected too.
        let text = build(&services, &[]).full_transaction();
        assert!(text.contains(
            "add element ip skiff no-endpoint-nodeports { tcp . 30080 comment \"default/np:http\" : goto reject-chain }"
        ));
        // A ClusterIP Service with a stray nodePort has none.
        let services = [service(
            "np",
            "10.96.0.14",
            json!({"ports": [{"name": "http", "port": 80, "nodePort": 30080}]}),
        )];
        assert!(!build(&services, &slices).full_transaction().contains("30080"));
    }

    #[test]
    fn headless_and_external_name_services_are_ignored() {
        let services = [
            service("headless", "None", json!({})),
            service(
                "ext",
                "",
                json!({"type": "ExternalName", "externalName": "example.com", "clusterIP": null, "clusterIPs": null}),
            ),
            service("v6", "fd00::1", json!({})),
        ];
        let slices = [slice(
            "headless",
            "headless-1",
            http_port(),
            json!([endpoint("10.244.1.1", "node-b")]),
        )];
        let ruleset = build(&services, &slices);
        assert_eq!(ruleset.service_ports(), 0);
        assert_eq!(ruleset.chain_names().count(), 0);
        assert!(ruleset.elements.is_empty() && ruleset.fragments.values().all(|f| f.elements.is_empty()));
        let text = ruleset.full_transaction();
        assert!(!text.contains("headless") && !text.contains("ext") && !text.contains("10.244.1.1"));
    }

    #[test]
    fn not_ready_endpoints_are_left_out_and_terminating_ones_are_a_fallback() {
        let services = [service("web", "10.96.0.15", json!({}))];
        let slices = [slice(
            "web",
            "web-1",
            http_port(),
            json!([
                {"addresses": ["10.244.1.1"]},
                {"addresses": ["10.244.1.2"], "conditions": {"ready": false}},
                {"addresses": ["10.244.1.3"], "conditions": {"ready": false, "serving": true, "terminating": true}},
            ]),
        )];
        let text = build(&services, &slices).full_transaction();
        assert!(text.contains("dnat to 10.244.1.1:8080"), "ready when unset");
        assert!(!text.contains("10.244.1.2") && !text.contains("10.244.1.3"));
        assert!(text.contains("numgen random mod 1 vmap"));
        let slices = [slice(
            "web",
            "web-1",
            http_port(),
            json!([
                {"addresses": ["10.244.1.2"], "conditions": {"ready": false}},
                {"addresses": ["10.244.1.3"], "conditions": {"ready": false, "serving": true, "terminating": true}},
            ]),
        )];
        let text = build(&services, &slices).full_transaction();
        assert!(text.contains("dnat to 10.244.1.3:8080"));
        assert!(!text.contains("10.244.1.2"));
    }

    #[test]
    fn traffic_policy_local_uses_this_nodes_endpoints() {
        let services = [service(
            "local",
            "10.96.0.16",
            json!({
                "type": "NodePort",
                "externalTrafficPolicy": "Local",
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30081}],
            }),
        )];
        let slices = [slice(
            "local",
            "local-1",
            http_port(),
            json!([endpoint("10.244.1.1", "node-a"), endpoint("10.244.2.1", "node-b")]),
        )];
        let ruleset = build(&services, &slices);
        let base = chain_base("default/local/tcp/http");
        let local_rules = ruleset.chain(&format!("local-{base}")).expect("the chain");
        assert_eq!(local_rules.len(), 1);
        assert!(local_rules[0].starts_with("numgen random mod 1 vmap"));
        assert!(
            ruleset
                .chain(&format!("service-{base}"))
                .expect("the chain")
                .iter()
                .any(|r| r.contains("mod 2"))
        );
        assert_eq!(
            ruleset.chain(&format!("external-{base}")).expect("the chain"),
            vec![
                format!("ip saddr 10.244.0.0/16 goto service-{base} comment \"short-circuit pod traffic\""),
                "fib saddr type local jump mark-for-masquerade comment \"masquerade local traffic\"".to_string(),
                format!("fib saddr type local goto service-{base} comment \"short-circuit local traffic\""),
                format!("goto local-{base}"),
            ]
        );
        // No local endpoint: external traffic from elsewhere is dropped, not rejected.
        let slices = [slice(
            "local",
            "local-1",
            http_port(),
            json!([endpoint("10.244.2.1", "node-b")]),
        )];
        let text = build(&services, &slices).full_transaction();
        assert!(text.contains("no-endpoint-nodeports { tcp . 30081 comment \"default/local:http\" : drop }"));
        // internalTrafficPolicy Local without a local endpoint: the ClusterIP drops.
        let services = [service(
            "local",
            "10.96.0.16",
            json!({"internalTrafficPolicy": "Local"}),
        )];
        let text = build(&services, &slices).full_transaction();
        assert!(text.contains("no-endpoint-services { 10.96.0.16 . tcp . 80 comment \"default/local:http\" : drop }"));
        assert!(!text.contains("add element ip skiff service-ips"));
    }

    #[test]
    fn load_balancers_answer_on_node_and_ingress_addresses() {
        let mut lb = service(
            "lb",
            "10.96.0.17",
            json!({
                "type": "LoadBalancer",
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30082}],
                "loadBalancerSourceRanges": ["203.0.113.0/24"],
                "externalIPs": ["198.51.100.7"],
            }),
        );
        lb.status = serde_json::from_value(json!({"loadBalancer": {"ingress": [
            {"ip": "198.51.100.1"},
            {"ip": "198.51.100.2", "ipMode": "Proxy"},
        ]}}))
        .expect("status");
        let services = [lb];
        let slices = [slice(
            "lb",
            "lb-1",
            http_port(),
            json!([endpoint("10.244.1.1", "node-b")]),
        )];
        let text = build(&services, &slices).full_transaction();
        let base = chain_base("default/lb/tcp/http");
        for ip in ["198.51.100.1", "192.0.2.10", "198.51.100.7"] {
            assert!(
                text.contains(&format!("{ip} . tcp . 80 : goto external-{base}")),
                "{ip}"
            );
        }
        assert!(!text.contains("198.51.100.2"));
        assert!(text.contains(&format!("tcp . 30082 : goto external-{base}")));
        assert!(text.contains(&format!(
            "add rule ip skiff firewall-{base} ip saddr != {{ 203.0.113.0/24 }} drop"
        )));
        assert!(text.contains(&format!("198.51.100.1 . tcp . 80 : goto firewall-{base}")));
        assert!(!text.contains(&format!("198.51.100.7 . tcp . 80 : goto firewall-{base}")));
    }

    #[test]
    fn the_ruleset_does_not_depend_on_the_order_of_its_input() {
        let services = vec![
            service("b", "10.96.0.21", json!({})),
            service("a", "10.96.0.20", json!({"sessionAffinity": "ClientIP"})),
        ];
        let slices = vec![
            slice("a", "a-2", http_port(), json!([endpoint("10.244.1.2", "node-b")])),
            slice("a", "a-1", http_port(), json!([endpoint("10.244.1.1", "node-b")])),
            slice("b", "b-1", http_port(), json!([endpoint("10.244.1.3", "node-b")])),
        ];
        let one = build(&services, &slices);
        let reversed_services: Vec<Service> = services.iter().rev().cloned().collect();
        let reversed_slices: Vec<EndpointSlice> = slices.iter().rev().cloned().collect();
        let other = build(&reversed_services, &reversed_slices);
        assert_eq!(one, other);
        assert_eq!(one.full_transaction(), other.full_transaction());
        assert_eq!(other.transaction(Some(&one), &[]), Transaction::Unchanged);
        assert!(matches!(one.transaction(None, &[]), Transaction::Full(_)));
    }

    #[test]
    fn the_cache_reuses_the_rules_of_unchanged_services() {
        let services: Vec<Service> = (0..3)
            .map(|i| service(&format!("s{i}"), &format!("10.96.0.{}", 70 + i), json!({})))
            .collect();
        let slices: Vec<EndpointSlice> = (0..3)
            .map(|i| {
                slice(
                    &format!("s{i}"),
                    &format!("s{i}-1"),
                    http_port(),
                    json!([endpoint(&format!("10.244.1.{i}"), "node-b")]),
                )
            })
            .collect();
        let mut cache = FragmentCache::default();
        let one = Ruleset::build_cached(&services, &slices, &node(), &options(), &mut cache);
        let mut changed = slices.clone();
        changed[1] = slice("s1", "s1-1", http_port(), json!([endpoint("10.244.1.99", "node-b")]));
        changed[1].metadata.resource_version = Some("2".into());
        let two = Ruleset::build_cached(&services, &changed, &node(), &options(), &mut cache);
        let key = |i: usize| ("default".to_string(), format!("s{i}"));
        assert!(Arc::ptr_eq(&one.fragments[&key(0)], &two.fragments[&key(0)]));
        assert!(Arc::ptr_eq(&one.fragments[&key(2)], &two.fragments[&key(2)]));
        assert!(!Arc::ptr_eq(&one.fragments[&key(1)], &two.fragments[&key(1)]));
        // The same as without the cache.
        assert_eq!(two, build(&services, &changed));
        // Other options: nothing is reused.
        let other = ProxyOptions {
            masquerade_bit: 15,
            ..options()
        };
        let three = Ruleset::build_cached(&services, &changed, &node(), &other, &mut cache);
        assert!(!Arc::ptr_eq(&two.fragments[&key(0)], &three.fragments[&key(0)]));
        assert!(three.full_transaction().contains("mark set mark or 0x00008000"));
    }

    #[test]
    fn an_update_rewrites_only_what_changed() {
        let services = vec![
            service("a", "10.96.0.30", json!({})),
            service("b", "10.96.0.31", json!({})),
        ];
        let before_slices = vec![
            slice("a", "a-1", http_port(), json!([endpoint("10.244.1.1", "node-b")])),
            slice("b", "b-1", http_port(), json!([endpoint("10.244.1.2", "node-b")])),
        ];
        let before = build(&services, &before_slices);
        let after_slices = vec![
            slice("a", "a-1", http_port(), json!([endpoint("10.244.1.9", "node-b")])),
            before_slices[1].clone(),
        ];
        let after = build(&services, &after_slices);
        let Transaction::Update { text, stale_chains } = after.transaction(Some(&before), &[]) else {
            panic!("an update");
        };
        let a = chain_base("default/a/tcp/http");
        let old = format!("endpoint-{}", chain_base("default/a/tcp/http__10.244.1.1/8080"));
        let new = format!("endpoint-{}", chain_base("default/a/tcp/http__10.244.1.9/8080"));
        assert_eq!(stale_chains, vec![old.clone()]);
        assert!(text.contains(&format!("flush chain ip skiff service-{a}\n")));
        assert!(text.contains(&format!("flush chain ip skiff {old}\n")));
        assert!(text.contains(&format!("add chain ip skiff {new}\n")));
        assert!(text.contains(&format!(
            "add rule ip skiff {new} meta l4proto tcp dnat to 10.244.1.9:8080\n"
        )));
        assert!(!text.contains("default/b"), "b did not change: {text}");
        assert!(!text.contains("delete chain") && !text.contains("element"), "{text}");
        // The stale chain is deleted by a later transaction.
        let Transaction::Update { text, stale_chains } = after.transaction(Some(&after), std::slice::from_ref(&old))
        else {
            panic!("an update");
        };
        assert_eq!(text, format!("add table ip skiff\ndelete chain ip skiff {old}\n"));
        assert!(stale_chains.is_empty());
        // A chain in use again is not deleted.
        assert_eq!(before.transaction(Some(&before), &[old]), Transaction::Unchanged);

        // A Service removed: its elements go first, its chains are flushed.
        let gone = build(&services[..1], &after_slices);
        let Transaction::Update { text, stale_chains } = gone.transaction(Some(&after), &[]) else {
            panic!("an update");
        };
        let b = chain_base("default/b/tcp/http");
        let delete = text.find("delete element ip skiff service-ips { 10.96.0.31 . tcp . 80 }");
        let flush = text.find(&format!("flush chain ip skiff service-{b}"));
        assert!(delete.is_some() && flush.is_some() && delete < flush, "{text}");
        assert!(text.contains("delete element ip skiff cluster-ips { 10.96.0.31 }"));
        assert_eq!(stale_chains.len(), 2);
        assert!(!text.contains("default/a"));

        // Endpoints gone: the element moves from service-ips to no-endpoint-services.
        let empty = build(&services, &before_slices[1..]);
        let Transaction::Update { text, .. } = empty.transaction(Some(&before), &[]) else {
            panic!("an update");
        };
        assert!(text.contains("delete element ip skiff service-ips { 10.96.0.30 . tcp . 80 }"));
        assert!(text.contains(
            "add element ip skiff no-endpoint-services { 10.96.0.30 . tcp . 80 comment \"default/a:http\" : goto reject-chain }"
        ));
    }

    #[test]
    fn an_update_keeps_affinity_sets_unless_their_timeout_changes() {
        let slices = vec![slice(
            "s",
            "s-1",
            http_port(),
            json!([endpoint("10.244.1.1", "node-b")]),
        )];
        let sticky = |timeout: i32| {
            vec![service(
                "s",
                "10.96.0.40",
                json!({"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": timeout}}}),
            )]
        };
        let before = build(&sticky(60), &slices);
        let more = vec![
            slices[0].clone(),
            slice("s", "s-2", http_port(), json!([endpoint("10.244.1.2", "node-b")])),
        ];
        let Transaction::Update { text, .. } = build(&sticky(60), &more).transaction(Some(&before), &[]) else {
            panic!("an update");
        };
        let kept = chain_base("default/s/tcp/http__10.244.1.1/8080");
        assert!(!text.contains(&format!("set ip skiff affinity-{kept}")), "{text}");
        assert!(text.contains(&format!(
            "add set ip skiff affinity-{}",
            chain_base("default/s/tcp/http__10.244.1.2/8080")
        )));
        let Transaction::Update { text, .. } = build(&sticky(120), &slices).transaction(Some(&before), &[]) else {
            panic!("an update");
        };
        let flush = text.find(&format!("flush chain ip skiff endpoint-{kept}"));
        let delete = text.find(&format!("delete set ip skiff affinity-{kept}\n"));
        let add = text.find(&format!(
            "add set ip skiff affinity-{kept} {{ type ipv4_addr ; flags dynamic,timeout ; timeout 120s ; }}"
        ));
        assert!(flush.is_some() && flush < delete && delete < add, "{text}");
        assert!(text.contains(&format!(
            "flush chain ip skiff service-{}",
            chain_base("default/s/tcp/http")
        )));
    }

    // Kernel tests: inside network namespaces of their own, never the host's.

    const RANGES_STAY_LOCAL: &str = "/work/shared/tools/ranges-stay-local.sh";

    /// A network namespace, deleted when dropped.
    struct TestNetns {
        name: String,
    }

    impl TestNetns {
        /// `None` when `ip netns add` is not permitted here.
        fn create(tag: &str) -> Option<TestNetns> {
            let name = format!("skiff-px-{tag}-{:08x}", rand::random::<u32>());
            let status = Command::new("ip").args(["netns", "add", &name]).status();
            match status {
                Ok(status) if status.success() => {
                    let netns = TestNetns { name };
                    netns.run(&["ip", "link", "set", "lo", "up"]);
                    Some(netns)
                }
                _ => None,
            }
        }

        fn netns(&self) -> NetworkNamespace {
            NetworkNamespace::Named(self.name.clone())
        }

        fn output(&self, args: &[&str]) -> std::process::Output {
            Command::new("ip")
                .args(["netns", "exec", &self.name])
                .args(args)
                .stdin(Stdio::null())
                .output()
                .expect("running ip netns exec")
        }

        fn run(&self, args: &[&str]) -> String {
            let output = self.output(args);
            assert!(
                output.status.success(),
                "{args:?} in {}: {}",
                self.name,
                String::from_utf8_lossy(&output.stderr)
            );
            String::from_utf8_lossy(&output.stdout).into_owned()
        }

        fn list_table(&self) -> Option<String> {
            let output = self.output(&["nft", "list", "table", "ip", TABLE]);
            output
                .status
                .success()
                .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
        }

        /// Connects to `ip:port` with busybox nc: what the server said, or nc's error.
        fn connect(&self, ip: &str, port: u16) -> (Result<String, String>, Duration) {
            let start = Instant::now();
            let output = self.output(&["busybox", "nc", "-w", "2", ip, &port.to_string()]);
            let elapsed = start.elapsed();
            let stdout = String::from_utf8_lossy(&output.stdout).trim().to_string();
            if stdout.is_empty() {
                (Err(String::from_utf8_lossy(&output.stderr).trim().to_string()), elapsed)
            } else {
                (Ok(stdout), elapsed)
            }
        }

        fn assert_answers(&self, ip: &str, port: u16) {
            let (reply, _) = self.connect(ip, port);
            assert_eq!(reply, Ok("hi".to_string()), "{ip}:{port} from {}", self.name);
        }

        fn assert_refused(&self, ip: &str, port: u16) {
            let (reply, elapsed) = self.connect(ip, port);
            let refused = reply.as_ref().is_err_and(|e| e.contains("refused"));
            assert!(refused, "{ip}:{port} from {}: {reply:?}", self.name);
            assert!(
                elapsed < Duration::from_millis(900),
                "{ip}:{port} refused after {elapsed:?}"
            );
        }

        /// No address of the service or cluster range is routed through a gateway.
        fn assert_ranges_stay_local(&self) {
            let route = self.run(&["ip", "route", "get", "10.96.200.200"]);
            assert!(route.starts_with("local ") && !route.contains(" via "), "{route}");
            if std::path::Path::new(RANGES_STAY_LOCAL).exists() {
                let output = self.output(&[RANGES_STAY_LOCAL]);
                assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stdout));
            }
        }
    }

    impl Drop for TestNetns {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
        }
    }

    /// A "node" namespace (10.244.0.1) and an "endpoint" namespace (10.244.0.2, a TCP server on
    /// 8080 answering `hi`) joined by a veth.
    struct Lab {
        server: Option<Child>,
        endpoint: TestNetns,
        node: TestNetns,
    }

    impl Lab {
        fn create() -> Option<Lab> {
            let Some(node) = TestNetns::create("node") else {
                eprintln!("SKIPPED: `ip netns add` is not permitted here");
                return None;
            };
            let endpoint = TestNetns::create("ep").expect("a second network namespace");
            // Created inside the namespaces: nothing is added to the host's.
            node.run(&[
                "ip",
                "link",
                "add",
                "vn",
                "type",
                "veth",
                "peer",
                "name",
                "ve",
                "netns",
                &endpoint.name,
            ]);
            node.run(&["ip", "addr", "add", "10.244.0.1/24", "dev", "vn"]);
            node.run(&["ip", "link", "set", "vn", "up"]);
            node.run(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
            endpoint.run(&["ip", "addr", "add", "10.244.0.2/24", "dev", "ve"]);
            endpoint.run(&["ip", "link", "set", "ve", "up"]);
            endpoint.run(&["ip", "route", "add", "default", "via", "10.244.0.1"]);
            let server = Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &endpoint.name,
                    "busybox",
                    "nc",
                    "-ll",
                    "-p",
                    "8080",
                    "-e",
                    "echo",
                    "hi",
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("starting busybox nc");
            let lab = Lab {
                server: Some(server),
                endpoint,
                node,
            };
            let deadline = Instant::now() + Duration::from_secs(5);
            while lab.node.connect("10.244.0.2", 8080).0 != Ok("hi".into()) {
                assert!(Instant::now() < deadline, "the endpoint's server does not answer");
                std::thread::sleep(Duration::from_millis(50));
            }
            Some(lab)
        }
    }

    impl Drop for Lab {
        fn drop(&mut self) {
            if let Some(mut server) = self.server.take() {
                let _ = server.kill();
                let _ = server.wait();
            }
        }
    }

    fn lab_config(node: &TestNetns) -> ProxierConfig {
        ProxierConfig {
            netns: node.netns(),
            ..ProxierConfig::new(
                NodeInfo {
                    name: "node-a".into(),
                    addresses: vec![Ipv4Addr::new(10, 244, 0, 1)],
                },
                options(),
            )
        }
    }

    async fn synced(proxier: &Proxier) {
        tokio::time::timeout(Duration::from_secs(30), proxier.synced())
            .await
            .expect("the proxier syncs");
    }

    /// Waits until `check` holds of the table's listing.
    async fn until_table(netns: &TestNetns, what: &str, check: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let listing = netns.list_table().unwrap_or_default();
            if check(&listing) {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: {listing}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A listing with its chains, sets and maps sorted, and the elements of each sorted.
    fn normalize(listing: &str) -> Vec<String> {
        let mut blocks = Vec::new();
        let mut current: Vec<String> = Vec::new();
        for line in listing.lines() {
            if ["\tchain ", "\tset ", "\tmap "].iter().any(|p| line.starts_with(p)) {
                current = vec![line.trim().to_string()];
            } else if line == "\t}" {
                let block = current.join(" ");
                let block = match block.split_once("elements = { ") {
                    Some((head, rest)) => {
                        let (elements, tail) = rest.rsplit_once(" }").unwrap_or((rest, ""));
                        let mut elements: Vec<&str> = elements.split(',').map(str::trim).collect();
                        elements.sort_unstable();
                        format!("{head}elements = {{ {} }}{tail}", elements.join(", "))
                    }
                    None => block,
                };
                blocks.push(block);
                current.clear();
            } else if !current.is_empty() {
                current.push(line.trim().to_string());
            }
        }
        blocks.sort();
        blocks
    }

    fn dns_service() -> Service {
        service(
            "dns",
            "10.96.0.53",
            json!({"type": "NodePort", "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353, "nodePort": 30053}]}),
        )
    }

    fn dns_slice(ips: &[&str], rv: &str) -> EndpointSlice {
        let endpoints: Vec<Value> = ips.iter().map(|ip| endpoint(ip, "node-a")).collect();
        let mut s = slice(
            "dns",
            "dns-1",
            json!([{"name": "dns", "port": 5353, "protocol": "UDP"}]),
            json!(endpoints),
        );
        s.metadata.resource_version = Some(rv.into());
        s
    }

    #[test]
    fn udp_flows_to_endpoints_no_longer_used_are_stale() {
        let before = build(&[dns_service()], &[dns_slice(&["10.244.0.2", "10.244.0.3"], "1")]);
        let after = build(&[dns_service()], &[dns_slice(&["10.244.0.3"], "2")]);
        let mut stale = after.stale_udp_flows(&before);
        stale.sort();
        let gone = Ipv4Addr::new(10, 244, 0, 2);
        assert_eq!(
            stale,
            [
                (UdpDestination::Address(Ipv4Addr::new(10, 96, 0, 53), 53), gone),
                (UdpDestination::NodePort(30053), gone),
            ]
        );
        // TCP Services and unchanged ones have none.
        assert!(after.stale_udp_flows(&after).is_empty());
        let web = build(
            &[service("web", "10.96.0.10", json!({}))],
            &[slice(
                "web",
                "web-1",
                http_port(),
                json!([endpoint("10.244.0.2", "node-a")]),
            )],
        );
        assert!(
            build(&[service("web", "10.96.0.10", json!({}))], &[])
                .stale_udp_flows(&web)
                .is_empty()
        );
        assert_eq!(
            UdpDestination::Address(Ipv4Addr::new(10, 96, 0, 53), 53)
                .conntrack_args(gone)
                .join(" "),
            "-D -p udp --orig-dst 10.96.0.53 --orig-port-dst 53 --dst-nat 10.244.0.2"
        );
        assert_eq!(
            UdpDestination::NodePort(30053).conntrack_args(gone).join(" "),
            "-D -p udp --orig-port-dst 30053 --dst-nat 10.244.0.2"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kernel_udp_flows_to_a_removed_endpoint_are_forgotten() {
        let Some(lab) = Lab::create() else { return };
        let node = &lab.node;
        let proxier = Proxier::start(lab_config(node));
        proxier.replace_services(vec![dns_service()]);
        proxier.replace_endpoint_slices(vec![dns_slice(&["10.244.0.2"], "1")]);
        synced(&proxier).await;
        node.assert_ranges_stay_local();
        // A datagram to the ClusterIP: conntrack remembers its DNAT to 10.244.0.2.
        node.output(&["bash", "-c", "echo q > /dev/udp/10.96.0.53/53"]);
        let flows = || node.run(&["conntrack", "-L", "-p", "udp"]);
        let listed = flows();
        assert!(
            listed.contains("dst=10.96.0.53") && listed.contains("src=10.244.0.2"),
            "{listed}"
        );
        // The endpoint goes: so does the flow, or the client's next datagrams would follow it.
        proxier.apply_endpoint_slice(dns_slice(&["10.244.0.3"], "2"));
        synced(&proxier).await;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let listed = flows();
            if !listed.contains("src=10.244.0.2") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the flow to the removed endpoint stays: {listed}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        drop(proxier);
        cleanup(&node.netns(), TABLE).await.expect("cleanup");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kernel_proxier_serves_and_rejects_inside_network_namespaces() {
        let Some(lab) = Lab::create() else { return };
        let (node, pod) = (&lab.node, &lab.endpoint);

        // The local route alone: an unallocated service address stays here and is refused.
        ensure_service_cidr_route(&node.netns(), options().service_cidr)
            .await
            .expect("the service CIDR route");
        node.assert_ranges_stay_local();
        node.assert_refused("10.96.200.200", 80);

        let services = vec![
            service(
                "web",
                "10.96.0.10",
                json!({"type": "NodePort", "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}),
            ),
            service("empty", "10.96.0.11", json!({})),
        ];
        let web_slice = slice("web", "web-1", http_port(), json!([endpoint("10.244.0.2", "node-a")]));
        let proxier = Proxier::start(lab_config(node));
        proxier.replace_services(services.clone());
        proxier.replace_endpoint_slices(vec![web_slice.clone()]);
        synced(&proxier).await;
        assert_eq!(proxier.last_sync().map(|s| s.full), Some(true));

        node.assert_ranges_stay_local();
        node.assert_answers("10.96.0.10", 80);
        node.assert_answers("10.244.0.1", 30080);
        node.assert_answers("127.0.0.1", 30080);
        pod.assert_answers("10.96.0.10", 80); // hairpin: the endpoint reaches itself
        pod.assert_answers("10.244.0.1", 30080);
        node.assert_refused("10.96.0.11", 80); // no endpoints
        pod.assert_refused("10.96.0.11", 80);
        node.assert_refused("10.96.0.200", 80); // no ClusterIP
        pod.assert_refused("10.96.0.200", 80);
        node.assert_refused("10.96.0.10", 81); // no such port

        // A restart rebuilds the same table.
        let listing = node.list_table().expect("the table");
        drop(proxier);
        let proxier = Proxier::start(lab_config(node));
        proxier.replace_services(services.clone());
        proxier.replace_endpoint_slices(vec![web_slice.clone()]);
        synced(&proxier).await;
        assert!(normalize(&listing).len() > 20);
        assert_eq!(normalize(&node.list_table().expect("the table")), normalize(&listing));

        // A burst of EndpointSlice changes coalesces into few syncs.
        let runs = proxier.nft_runs();
        for i in 0..50 {
            let mut changed = slice(
                "web",
                "web-1",
                http_port(),
                json!([
                    endpoint("10.244.0.2", "node-a"),
                    endpoint(&format!("10.244.9.{i}"), "node-b")
                ]),
            );
            changed.metadata.resource_version = Some(format!("{}", i + 2));
            proxier.apply_endpoint_slice(changed);
        }
        let mut last = web_slice.clone();
        last.metadata.resource_version = Some("100".into());
        proxier.apply_endpoint_slice(last);
        synced(&proxier).await;
        // None at all when the burst ended before the sync task ran: it ends where it began.
        let burst = proxier.nft_runs() - runs;
        assert!(burst <= 4, "{burst} syncs for 51 changes");
        if burst > 0 {
            assert_eq!(proxier.last_sync().map(|s| s.full), Some(false));
        }
        node.assert_answers("10.96.0.10", 80);
        until_table(node, "stale endpoint chains are deleted", |t| {
            t.contains("10.244.0.2") && !t.contains("10.244.9.")
        })
        .await;

        // Removing the Service leaves no trace of it.
        proxier.delete_service("default", "web");
        proxier.delete_endpoint_slice("default", "web-1");
        synced(&proxier).await;
        until_table(node, "the Service is gone", |t| {
            t.contains("default/empty") && !t.contains("default/web") && !t.contains("10.96.0.10")
        })
        .await;
        node.assert_refused("10.96.0.10", 80);
        node.assert_refused("10.244.0.1", 30080);

        drop(proxier);
        cleanup(&node.netns(), TABLE).await.expect("cleanup");
        assert!(node.list_table().is_none(), "the table is gone");
        cleanup(&node.netns(), TABLE).await.expect("cleanup without a table");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kernel_run_follows_the_api() {
        let Some(node) = TestNetns::create("run") else {
            eprintln!("SKIPPED: `ip netns add` is not permitted here");
            return;
        };
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut server = skiff_apiserver::ServerOptions::new(dir.path().join("server"), 0);
        server.bind = "127.0.0.1".parse().expect("an address");
        let running = skiff_apiserver::start(server).await.expect("the API server");
        let client = skiff_apiserver::client(running.state.clone());
        let proxier = Proxier::start(lab_config(&node));
        let feeding = tokio::spawn(run(client.clone(), proxier.clone()));

        let services: Api<Service> = Api::namespaced(client.clone(), "default");
        let mut web_service = service("web", "10.96.0.99", json!({}));
        web_service.metadata.resource_version = None;
        web_service.metadata.uid = None;
        if let Some(spec) = web_service.spec.as_mut() {
            // Allocated by the API server.
            spec.cluster_ip = None;
            spec.cluster_ips = None;
        }
        let created = services
            .create(&Default::default(), &web_service)
            .await
            .expect("creating the Service");
        let ip = cluster_ip(&created).expect("a ClusterIP").to_string();
        let slices: Api<EndpointSlice> = Api::namespaced(client, "default");
        let mut web = slice("web", "web-1", http_port(), json!([endpoint("10.244.0.2", "node-a")]));
        web.metadata.resource_version = None;
        slices
            .create(&Default::default(), &web)
            .await
            .expect("creating the EndpointSlice");
        let element = format!("{ip} . tcp . 80 : goto service-");
        until_table(&node, "the Service is proxied", |t| {
            t.contains(&element) && t.contains("10.244.0.2:8080")
        })
        .await;

        services
            .delete("web", &Default::default())
            .await
            .expect("deleting the Service");
        until_table(&node, "the Service is gone", |t| {
            !t.is_empty() && !t.contains(&format!("{ip} "))
        })
        .await;
        feeding.abort();
    }

    /// Services of every kind, before and after a round of changes.
    fn varied(after: bool) -> (Vec<Service>, Vec<EndpointSlice>) {
        let mut lb = service(
            "lb",
            "10.96.0.17",
            json!({
                "type": "LoadBalancer",
                "externalTrafficPolicy": "Local",
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30082}],
                "loadBalancerSourceRanges": ["203.0.113.0/24"],
            }),
        );
        lb.status = serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "198.51.100.1"}]}})).ok();
        let timeout = if after { 60 } else { 30 };
        let mut services = vec![
            service("web", "10.96.0.10", json!({})),
            service(
                "sticky",
                "10.96.0.13",
                json!({"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": timeout}}}),
            ),
            service(
                "dns",
                "10.96.0.53",
                json!({"ports": [{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53}]}),
            ),
            service("empty", "10.96.0.11", json!({})),
            lb,
        ];
        let three = json!([
            endpoint("10.244.1.1", "node-a"),
            endpoint("10.244.1.2", "node-b"),
            endpoint("10.244.1.3", "node-b"),
        ]);
        let mut slices = vec![
            slice("web", "web-1", http_port(), three.clone()),
            slice("sticky", "sticky-1", http_port(), three.clone()),
            slice(
                "dns",
                "dns-1",
                json!([{"name": "dns", "port": 5353, "protocol": "UDP"}, {"name": "dns-tcp", "port": 5353}]),
                three.clone(),
            ),
            slice("lb", "lb-1", http_port(), three),
        ];
        if after {
            services.retain(|s| s.metadata.name.as_deref() != Some("dns"));
            services.push(service(
                "new",
                "10.96.0.60",
                json!({"type": "NodePort", "ports": [{"name": "http", "port": 80, "nodePort": 30090}]}),
            ));
            slices[0] = slice(
                "web",
                "web-1",
                http_port(),
                json!([endpoint("10.244.1.1", "node-a"), endpoint("10.244.1.9", "node-b")]),
            );
            slices.push(slice(
                "empty",
                "empty-1",
                http_port(),
                json!([endpoint("10.244.1.4", "node-b")]),
            ));
            slices.push(slice(
                "new",
                "new-1",
                http_port(),
                json!([endpoint("10.244.1.5", "node-b")]),
            ));
        }
        (services, slices)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kernel_updates_reach_the_state_of_a_full_sync() {
        let Some(updated) = TestNetns::create("upd") else {
            eprintln!("SKIPPED: `ip netns add` is not permitted here");
            return;
        };
        let full = TestNetns::create("full").expect("a second network namespace");
        let (services, slices) = varied(false);
        let before = build(&services, &slices);
        let (services, slices) = varied(true);
        let after = build(&services, &slices);
        run_nft(&updated.netns(), &before.full_transaction())
            .await
            .expect("the full transaction of the first state");
        let Transaction::Update { text, stale_chains } = after.transaction(Some(&before), &[]) else {
            panic!("an update");
        };
        run_nft(&updated.netns(), &text).await.expect("the update");
        assert!(!stale_chains.is_empty());
        let Transaction::Update { text, .. } = after.transaction(Some(&after), &stale_chains) else {
            panic!("deleting the stale chains");
        };
        run_nft(&updated.netns(), &text)
            .await
            .expect("deleting the stale chains");
        run_nft(&full.netns(), &after.full_transaction())
            .await
            .expect("the full transaction of the second state");
        let listing = updated.list_table().expect("the table");
        let blocks = normalize(&listing);
        assert!(blocks.len() > 30, "{blocks:?}");
        assert!(
            blocks
                .iter()
                .any(|b| b.starts_with("map service-ips") && b.contains("10.96.0.60 . tcp . 80"))
        );
        assert_eq!(blocks, normalize(&full.list_table().expect("the table")));
        // The same full transaction again replaces the table with an identical one.
        run_nft(&full.netns(), &after.full_transaction()).await.expect("again");
        assert_eq!(normalize(&listing), normalize(&full.list_table().expect("the table")));
    }

    fn many(count: usize, generation: usize) -> (Vec<Service>, Vec<EndpointSlice>) {
        let mut services = Vec::with_capacity(count);
        let mut slices = Vec::with_capacity(count);
        for i in 0..count {
            let ip = format!("10.96.{}.{}", i / 250, i % 250 + 1);
            services.push(service(&format!("svc-{i}"), &ip, json!({})));
            let endpoints: Vec<Value> = (0..3)
                .map(|j| {
                    let n = i * 3 + j + generation * 7;
                    endpoint(&format!("10.244.{}.{}", (n / 250) % 250, n % 250 + 1), "node-b")
                })
                .collect();
            slices.push(slice(
                &format!("svc-{i}"),
                &format!("svc-{i}-1"),
                http_port(),
                json!(endpoints),
            ));
        }
        (services, slices)
    }

    /// The sync time at 1,000 Services of 3 endpoints: a benchmark, not a timed test (run it with
    /// `--run-ignored all --no-capture`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore]
    async fn kernel_sync_time_at_1000_services() {
        let Some(node) = TestNetns::create("bench") else {
            eprintln!("SKIPPED: `ip netns add` is not permitted here");
            return;
        };
        let (services, slices) = many(1000, 0);
        let start = Instant::now();
        let rounds = 5;
        for _ in 0..rounds {
            let ruleset = Ruleset::build(&services, &slices, &node_info(), &options());
            std::hint::black_box(ruleset.full_transaction());
        }
        eprintln!(
            "build + full text, 1,000 Services x 3 endpoints: {:?}",
            start.elapsed() / rounds
        );
        let mut cache = FragmentCache::default();
        let before = Ruleset::build_cached(&services, &slices, &node_info(), &options(), &mut cache);
        let mut one_changed = slices.clone();
        one_changed[5] = many(1000, 1).1[5].clone();
        one_changed[5].metadata.resource_version = Some("2".into());
        let start = Instant::now();
        let after = Ruleset::build_cached(&services, &one_changed, &node_info(), &options(), &mut cache);
        let transaction = after.transaction(Some(&before), &[]);
        eprintln!(
            "one EndpointSlice changed: cached build + update text {:?}, {} bytes",
            start.elapsed(),
            match &transaction {
                Transaction::Update { text, .. } => text.len(),
                _ => 0,
            }
        );

        let proxier = Proxier::start(ProxierConfig {
            netns: node.netns(),
            ..ProxierConfig::new(node_info(), options())
        });
        let start = Instant::now();
        proxier.replace_services(services);
        proxier.replace_endpoint_slices(slices.clone());
        synced(&proxier).await;
        eprintln!("first (full) sync: {:?}, {:?}", start.elapsed(), proxier.last_sync());

        let (_, changed) = many(1000, 1);
        let mut latencies = Vec::new();
        let mut updates = Vec::new();
        for round in 0..200 {
            let i = (round * 37) % 1000;
            let mut slice = if round % 2 == 0 {
                changed[i].clone()
            } else {
                slices[i].clone()
            };
            slice.metadata.resource_version = Some(format!("{}", round + 10));
            let start = Instant::now();
            proxier.apply_endpoint_slice(slice);
            synced(&proxier).await;
            latencies.push(start.elapsed());
            if let Some(stats) = proxier.last_sync() {
                updates.push(stats);
            }
            // Changes a few milliseconds apart, as a rollout makes them.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        latencies.sort();
        let pick = |q: f64| latencies[((latencies.len() as f64 - 1.0) * q) as usize];
        eprintln!(
            "EndpointSlice change to rules in force, {} changes: p50 {:?}, p99 {:?}, max {:?}",
            latencies.len(),
            pick(0.5),
            pick(0.99),
            pick(1.0)
        );
        if let Some(last) = updates.last() {
            eprintln!("last update: {last:?}");
        }
    }

    fn node_info() -> NodeInfo {
        NodeInfo {
            name: "node-a".into(),
            addresses: vec![],
        }
    }
}
