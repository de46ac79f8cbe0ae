//! Cluster DNS, answered inside the node agent from its own watch caches: no DNS pod, no image, no
//! loop through the host's resolver.
//!
//! The behaviour is CoreDNS's `kubernetes` plugin with kubeadm's Corefile:
//!
//! ```text
//! kubernetes cluster.local in-addr.arpa ip6.arpa {
//!     pods insecure
//!     fallthrough in-addr.arpa ip6.arpa
//!     ttl 5
//! }
//! forward . /etc/resolv.conf
//! ```
//!
//! - `SVC.NS.svc.cluster.local`: A / AAAA for the ClusterIPs; for a headless Service (clusterIP
//!   `None`) the addresses of its ready endpoints (every endpoint with `publishNotReadyAddresses`).
//!   `HOST.SVC.NS.svc.cluster.local` is one endpoint, HOST being its `hostname` or its dashed
//!   address (`10-244-0-5`). `_PORT._PROTO.SVC.NS.svc.cluster.local` SRV for named ports, targets in
//!   the additional section. ExternalName Services are a CNAME to `spec.externalName`.
//! - `A-B-C-D.NS.pod.cluster.local`: A A.B.C.D when the namespace exists (`pods insecure`).
//! - PTR under in-addr.arpa / ip6.arpa for ClusterIPs and endpoint addresses; other reverse names
//!   fall through to the upstreams.
//! - Names that do not exist are NXDOMAIN, names that exist without records of the asked type are
//!   NOERROR without answers (NODATA); both carry the zone's SOA in the authority section. Until
//!   the first lists are in ([`ClusterDns::mark_synced`]) NXDOMAIN is SERVFAIL, as CoreDNS answers
//!   before its informers have synced.
//! - Every other name is forwarded to the upstreams (UDP, over TCP again when the answer is
//!   truncated and the client asked over TCP), SERVFAIL when none answers in time.
//!
//! Pieces: [`ClusterDns`] is the index and the answer path (synchronous, read-locked, nothing
//! awaited); [`run`] feeds it from watches; [`serve`] answers on UDP and TCP; `Forwarder` asks the
//! upstreams. Names follow CoreDNS's (`parse_request`, `find_services`, `find_pods`,
//! `endpoint_hostname`, `name_error`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::Hash;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use futures::StreamExt;
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, CNAME, NS, PTR, SOA, SRV, TXT};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use hickory_proto::serialize::binary::{BinEncodable, BinEncoder};
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use parking_lot::RwLock;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;

/// The plugin's `ttl 5`: the TTL of every record and the SOA's minimum.
const TTL: u32 = 5;
/// `dns-version.ZONE` TXT: the Kubernetes DNS specification's schema version, and its TTL.
const DNS_SCHEMA_VERSION: &str = "1.1.0";
const DNS_SCHEMA_TTL: u32 = 28800;
/// The label naming an EndpointSlice's Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// CNAME chains (ExternalName to ExternalName) longer than this are not followed.
const MAX_CNAME_CHAIN: usize = 10;
const SVC: &str = "svc";
const POD: &str = "pod";
/// A UDP reply's size without EDNS, and the largest EDNS payload size this server honours.
const MIN_UDP_PAYLOAD: u16 = 512;
const MAX_UDP_PAYLOAD: u16 = 4096;
/// How long one upstream has to answer, and how long a forwarded query may take in all.
const UPSTREAM_TRY_TIMEOUT: Duration = Duration::from_secs(2);
const FORWARD_DEADLINE: Duration = Duration::from_secs(5);
/// Forwarded queries under way at once; past that, SERVFAIL at once.
const MAX_FORWARDS: usize = 1024;
/// TCP connections served at once (further ones wait in the listen queue), and how long one may
/// stay idle between queries.
const MAX_TCP_CONNECTIONS: usize = 1024;
const TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// The index.

/// A port of a Service or an EndpointSlice as the SRV lookup matches it (name and protocol
/// lowercased; `port` -1 is CoreDNS's sentinel for an object without ports: no SRV record).
#[derive(Debug, Clone, PartialEq)]
struct PortInfo {
    name: String,
    protocol: String,
    port: i32,
}

impl PortInfo {
    fn sentinel() -> Vec<PortInfo> {
        vec![PortInfo {
            name: String::new(),
            protocol: String::new(),
            port: -1,
        }]
    }

    /// CoreDNS's `matchPortAndProtocol`: empty request fields match anything.
    fn matches(&self, port: &str, protocol: &str) -> bool {
        (port.is_empty() || self.name.eq_ignore_ascii_case(port))
            && (protocol.is_empty() || self.protocol.eq_ignore_ascii_case(protocol))
    }
}

/// What a Service is for DNS.
#[derive(Debug)]
enum ServiceKind {
    /// Its ClusterIPs (any type but ExternalName with a clusterIP other than `None`).
    ClusterIp(Vec<IpAddr>),
    /// clusterIP `None`: answered from its endpoints.
    Headless,
    /// The CNAME target; `None` when `spec.externalName` is empty, not a name, or an address
    /// (CoreDNS answers those NXDOMAIN).
    ExternalName(Option<Name>),
}

/// The part of a Service that DNS answers from.
#[derive(Debug)]
struct ServiceInfo {
    kind: ServiceKind,
    ports: Vec<PortInfo>,
    publish_not_ready: bool,
}

impl ServiceInfo {
    fn from_service(svc: &Service) -> Self {
        let spec = svc.spec.as_ref();
        let mut ports: Vec<PortInfo> = spec
            .and_then(|s| s.ports.as_ref())
            .map(|ports| {
                ports
                    .iter()
                    .map(|p| PortInfo {
                        name: p.name.as_deref().unwrap_or_default().to_ascii_lowercase(),
                        protocol: p.protocol.as_deref().unwrap_or("TCP").to_ascii_lowercase(),
                        port: p.port,
                    })
                    .collect()
            })
            .unwrap_or_default();
        if ports.is_empty() {
            ports = PortInfo::sentinel();
        }
        let kind = if spec.and_then(|s| s.type_.as_deref()) == Some("ExternalName") {
            ServiceKind::ExternalName(spec.and_then(|s| s.external_name.as_deref()).and_then(external_target))
        } else {
            let ips: Vec<&str> = match spec.and_then(|s| s.cluster_ips.as_ref()) {
                Some(ips) if !ips.is_empty() => ips.iter().map(String::as_str).collect(),
                _ => vec![spec.and_then(|s| s.cluster_ip.as_deref()).unwrap_or_default()],
            };
            if ips.first() == Some(&"None") {
                ServiceKind::Headless
            } else {
                ServiceKind::ClusterIp(ips.iter().filter_map(|ip| ip.parse().ok()).collect())
            }
        };
        ServiceInfo {
            kind,
            ports,
            publish_not_ready: spec.and_then(|s| s.publish_not_ready_addresses).unwrap_or(false),
        }
    }
}

/// An ExternalName's CNAME target: a name, never an address.
fn external_target(name: &str) -> Option<Name> {
    if name.is_empty() || name.parse::<IpAddr>().is_ok() {
        return None;
    }
    let mut name = Name::from_ascii(name).ok()?;
    name.set_fqdn(true);
    Some(name)
}

/// One address of an EndpointSlice's endpoint.
#[derive(Debug)]
struct EndpointAddr {
    ip: IpAddr,
    /// CoreDNS's `endpointHostname`: the endpoint's `hostname`, else the dashed address.
    label: String,
    /// `conditions.ready`, unset counting as ready.
    ready: bool,
}

/// The part of an EndpointSlice that DNS answers from.
#[derive(Debug)]
struct SliceInfo {
    service: String,
    ports: Vec<PortInfo>,
    addresses: Vec<EndpointAddr>,
}

impl SliceInfo {
    /// `None` for a slice without the `kubernetes.io/service-name` label.
    fn from_slice(slice: &EndpointSlice) -> Option<Self> {
        let service = slice
            .metadata
            .labels
            .as_ref()?
            .get(SERVICE_NAME_LABEL)?
            .to_ascii_lowercase();
        let mut ports: Vec<PortInfo> = slice
            .ports
            .iter()
            .flatten()
            .map(|p| PortInfo {
                name: p.name.as_deref().unwrap_or_default().to_ascii_lowercase(),
                protocol: p.protocol.as_deref().unwrap_or("TCP").to_ascii_lowercase(),
                port: p.port.unwrap_or(-1),
            })
            .collect();
        if ports.is_empty() {
            ports = PortInfo::sentinel();
        }
        let mut addresses = Vec::new();
        for endpoint in &slice.endpoints {
            let ready = endpoint.conditions.as_ref().and_then(|c| c.ready) != Some(false);
            let hostname = endpoint.hostname.as_deref().filter(|h| !h.is_empty());
            for address in &endpoint.addresses {
                // FQDN slices and garbage carry no address DNS can give.
                let Ok(ip) = address.parse::<IpAddr>() else {
                    continue;
                };
                let label = match hostname {
                    Some(h) => h.to_ascii_lowercase(),
                    None => endpoint_hostname(ip),
                };
                addresses.push(EndpointAddr { ip, label, ready });
            }
        }
        Some(SliceInfo {
            service,
            ports,
            addresses,
        })
    }
}

/// The dashed form of an address, as CoreDNS names endpoints without a hostname: `10-244-0-5`,
/// `fd00--5` (a trailing dash gets a `0`).
fn endpoint_hostname(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string().replace('.', "-"),
        IpAddr::V6(v6) => {
            let mut s = v6.to_string().replace(':', "-");
            if s.ends_with('-') {
                s.push('0');
            }
            s
        }
    }
}

/// A Service's name and what belongs to it: the Service (once seen) and its EndpointSlices by name.
#[derive(Default)]
struct ServiceEntry {
    service: Option<ServiceInfo>,
    slices: BTreeMap<String, SliceInfo>,
}

/// One namespace. It exists for DNS while its Namespace object does or while anything lives in it.
#[derive(Default)]
struct NamespaceEntry {
    listed: bool,
    services: HashMap<String, ServiceEntry>,
    /// Slice name to the Service it belongs to.
    slice_service: HashMap<String, String>,
}

/// Everything DNS answers from, behind one lock.
#[derive(Default)]
struct Index {
    namespaces: HashMap<String, NamespaceEntry>,
    /// ClusterIP to the Services (namespace, name) that have it.
    reverse_services: HashMap<IpAddr, Vec<(String, String)>>,
    /// Endpoint address to the EndpointSlices (namespace, slice name) that hold it.
    reverse_endpoints: HashMap<IpAddr, Vec<(String, String)>>,
}

fn reverse_add(map: &mut HashMap<IpAddr, Vec<(String, String)>>, ip: IpAddr, ns: &str, name: &str) {
    let keys = map.entry(ip).or_default();
    if !keys.iter().any(|(n, m)| n == ns && m == name) {
        keys.push((ns.to_string(), name.to_string()));
        keys.sort();
    }
}

fn reverse_remove(map: &mut HashMap<IpAddr, Vec<(String, String)>>, ip: IpAddr, ns: &str, name: &str) {
    if let Some(keys) = map.get_mut(&ip) {
        keys.retain(|(n, m)| !(n == ns && m == name));
        if keys.is_empty() {
            map.remove(&ip);
        }
    }
}

impl Index {
    fn namespace_exists(&self, ns: &str) -> bool {
        self.namespaces.contains_key(ns)
    }

    /// Drops a namespace entry that no longer holds anything and whose Namespace is not listed.
    fn prune(&mut self, ns: &str) {
        if let Some(entry) = self.namespaces.get(ns)
            && !entry.listed
            && entry.services.is_empty()
        {
            self.namespaces.remove(ns);
        }
    }

    fn set_service(&mut self, ns: &str, name: &str, info: Option<ServiceInfo>) {
        if info.is_none() && !self.namespaces.get(ns).is_some_and(|e| e.services.contains_key(name)) {
            return;
        }
        let entry = self.namespaces.entry(ns.to_string()).or_default();
        let service = entry.services.entry(name.to_string()).or_default();
        if let Some(old) = service.service.take()
            && let ServiceKind::ClusterIp(ips) = &old.kind
        {
            for ip in ips {
                reverse_remove(&mut self.reverse_services, *ip, ns, name);
            }
        }
        if let Some(info) = info {
            if let ServiceKind::ClusterIp(ips) = &info.kind {
                for ip in ips {
                    reverse_add(&mut self.reverse_services, *ip, ns, name);
                }
            }
            service.service = Some(info);
        }
        if service.service.is_none() && service.slices.is_empty() {
            entry.services.remove(name);
        }
        self.prune(ns);
    }

    fn set_slice(&mut self, ns: &str, name: &str, info: Option<SliceInfo>) {
        let Some(entry) = self.namespaces.get_mut(ns) else {
            if info.is_none() {
                return;
            }
            self.namespaces.insert(ns.to_string(), NamespaceEntry::default());
            return self.set_slice(ns, name, info);
        };
        if let Some(owner) = entry.slice_service.remove(name)
            && let Some(service) = entry.services.get_mut(&owner)
        {
            if let Some(old) = service.slices.remove(name) {
                for address in &old.addresses {
                    reverse_remove(&mut self.reverse_endpoints, address.ip, ns, name);
                }
            }
            if service.service.is_none() && service.slices.is_empty() {
                entry.services.remove(&owner);
            }
        }
        if let Some(info) = info {
            for address in &info.addresses {
                reverse_add(&mut self.reverse_endpoints, address.ip, ns, name);
            }
            entry.slice_service.insert(name.to_string(), info.service.clone());
            entry
                .services
                .entry(info.service.clone())
                .or_default()
                .slices
                .insert(name.to_string(), info);
        }
        self.prune(ns);
    }

    fn set_namespace(&mut self, ns: &str, listed: bool) {
        if listed {
            self.namespaces.entry(ns.to_string()).or_default().listed = true;
        } else if let Some(entry) = self.namespaces.get_mut(ns) {
            entry.listed = false;
            self.prune(ns);
        }
    }

    fn service_keys(&self) -> Vec<(String, String)> {
        let mut keys = Vec::new();
        for (ns, entry) in &self.namespaces {
            for (name, service) in &entry.services {
                if service.service.is_some() {
                    keys.push((ns.clone(), name.clone()));
                }
            }
        }
        keys
    }

    fn slice_keys(&self) -> Vec<(String, String)> {
        let mut keys = Vec::new();
        for (ns, entry) in &self.namespaces {
            for name in entry.slice_service.keys() {
                keys.push((ns.clone(), name.clone()));
            }
        }
        keys
    }
}

/// An object's namespace and name (namespace `default` when unset); `None` without a name.
fn object_key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<(String, String)> {
    let name = meta.name.as_deref()?.to_ascii_lowercase();
    let ns = meta.namespace.as_deref().unwrap_or("default").to_ascii_lowercase();
    Some((ns, name))
}

// ---------------------------------------------------------------------------------------------
// Zones and answers.

/// One zone the plugin is authoritative for, with the names of its SOA.
struct Zone {
    name: Name,
    /// The zone's labels, lowercased, leftmost first.
    labels: Vec<Vec<u8>>,
    /// `ns.dns.ZONE` (the SOA's mname and the NS target) and `hostmaster.ZONE` (its rname).
    ns: Name,
    hostmaster: Name,
}

impl Zone {
    fn new(name: Name) -> Self {
        let name = name.to_lowercase();
        let labels = name.iter().map(<[u8]>::to_vec).collect();
        let prefixed = |labels: &[&str]| {
            labels
                .iter()
                .try_fold(Name::new(), |n, l| n.append_label(*l))
                .and_then(|n| n.append_domain(&name))
                .unwrap_or_else(|_| name.clone())
        };
        Zone {
            ns: prefixed(&["ns", "dns"]),
            hostmaster: prefixed(&["hostmaster"]),
            labels,
            name,
        }
    }

    /// The labels of `labels` (lowercased, leftmost first) before this zone, when in it.
    fn strip<'l, 'q>(&self, labels: &'l [&'q [u8]]) -> Option<&'l [&'q [u8]]> {
        let base = labels.len().checked_sub(self.labels.len())?;
        labels[base..]
            .iter()
            .zip(&self.labels)
            .all(|(a, b)| *a == b.as_slice())
            .then(|| &labels[..base])
    }

    /// CoreDNS's SOA for the zone: serial the time of the last change, TTL and minimum the ttl option.
    fn soa(&self, serial: u32) -> Record {
        let soa = SOA::new(self.ns.clone(), self.hostmaster.clone(), serial, 7200, 1800, 86400, TTL);
        Record::from_rdata(self.name.clone(), TTL.min(300), RData::SOA(soa))
    }
}

/// The name error of CoreDNS's `IsNameError`: the name does not exist (NXDOMAIN, or fall through).
#[derive(Debug, PartialEq)]
struct NameError;

/// CoreDNS's `recordRequest`: the parts of a name under the cluster zone.
#[derive(Default, Debug, PartialEq)]
struct RecordRequest<'q> {
    port: &'q str,
    protocol: &'q str,
    endpoint: &'q str,
    service: &'q str,
    namespace: &'q str,
    pod_or_svc: &'q str,
}

/// CoreDNS's `parseRequest` (neither multicluster nor zonal): `_port._protocol.service.namespace.
/// pod|svc`, `endpoint.service.namespace.pod|svc`, `service.namespace.pod|svc`, `namespace.pod|svc`.
/// The zone's apex, `svc` and `pod` give an empty request (NODATA).
fn parse_request<'q>(base: &[&'q str]) -> Result<RecordRequest<'q>, NameError> {
    let mut r = RecordRequest::default();
    if base.is_empty() || base == [SVC] || base == [POD] {
        return Ok(r);
    }
    let mut rest = base;
    let take = |rest: &mut &[&'q str]| -> Option<&'q str> {
        let (last, init) = rest.split_last()?;
        *rest = init;
        Some(*last)
    };
    r.pod_or_svc = take(&mut rest).unwrap_or_default();
    if r.pod_or_svc != POD && r.pod_or_svc != SVC {
        return Err(NameError);
    }
    let Some(namespace) = take(&mut rest) else {
        return Ok(r);
    };
    r.namespace = namespace;
    let Some(service) = take(&mut rest) else {
        return Ok(r);
    };
    r.service = service;
    match rest {
        [] => {}
        [endpoint] => r.endpoint = endpoint,
        [port, protocol] => {
            r.port = port.strip_prefix('_').unwrap_or(port);
            r.protocol = protocol.strip_prefix('_').unwrap_or(protocol);
        }
        _ => return Err(NameError),
    }
    Ok(r)
}

/// Where a found record points: an address, or a name (an ExternalName's target).
#[derive(Debug, Clone, Copy)]
enum HitHost<'a> {
    Ip(IpAddr),
    Name(&'a Name),
}

/// Whose record it is; names the SRV target and the additional records (CoreDNS's `msg.Service` key).
#[derive(Debug, Clone, Copy)]
enum HitKey<'a> {
    Service { ns: &'a str, svc: &'a str },
    Endpoint { label: &'a str, ns: &'a str, svc: &'a str },
    Pod { ns: &'a str, pod: &'a str },
    NameServer,
}

/// One found record, as CoreDNS's `msg.Service`.
#[derive(Debug, Clone, Copy)]
struct Hit<'a> {
    host: HitHost<'a>,
    port: i32,
    key: HitKey<'a>,
}

/// An authoritative answer from the index.
struct Answer<'z> {
    rcode: ResponseCode,
    answers: Vec<Record>,
    additionals: Vec<Record>,
    /// The zone whose SOA goes in the authority section (negative answers).
    soa: Option<&'z Zone>,
}

impl Answer<'_> {
    fn records(answers: Vec<Record>, additionals: Vec<Record>) -> Self {
        Answer {
            rcode: ResponseCode::NoError,
            answers,
            additionals,
            soa: None,
        }
    }
}

/// How a query is answered.
enum Resolution<'z> {
    Local(Answer<'z>),
    /// A CNAME chain (ExternalName Services) whose last target is outside the cluster: the target's
    /// records come from the upstreams and follow the chain.
    Chase {
        chain: Vec<Record>,
        target: Name,
    },
    /// Zone transfers.
    Refused,
    /// Not a name the plugin answers: the query goes to the upstreams as it is.
    Forward,
}

/// The A / AAAA answer for a name: records, or a chain to be completed upstream.
enum Addresses {
    Records(Vec<Record>),
    Chase { chain: Vec<Record>, target: Name },
}

/// First-seen filter for dedup (a scan while small, a set when large).
struct Seen<T> {
    small: Vec<T>,
    large: Option<HashSet<T>>,
}

impl<T: Eq + Hash + Clone> Seen<T> {
    fn new() -> Self {
        Seen {
            small: Vec::new(),
            large: None,
        }
    }

    /// Whether `item` is new (it is remembered).
    fn insert(&mut self, item: T) -> bool {
        if let Some(set) = &mut self.large {
            return set.insert(item);
        }
        if self.small.contains(&item) {
            return false;
        }
        self.small.push(item);
        if self.small.len() > 16 {
            self.large = Some(self.small.drain(..).collect());
        }
        true
    }
}

fn address_record(name: Name, ip: IpAddr) -> Record {
    match ip {
        IpAddr::V4(v4) => Record::from_rdata(name, TTL, RData::A(A(v4))),
        IpAddr::V6(v6) => Record::from_rdata(name, TTL, RData::AAAA(AAAA(v6))),
    }
}

/// `labels` (leftmost first) followed by `zone`.
fn name_under(labels: &[&str], zone: &Name) -> Option<Name> {
    labels
        .iter()
        .try_fold(Name::new(), |n, l| n.append_label(l.as_bytes()))
        .and_then(|n| n.append_domain(zone))
        .ok()
}

/// The address of a reverse name's labels (before `in-addr.arpa` / `ip6.arpa`), when they are a
/// whole address (CoreDNS's `ExtractAddressFromReverse`).
fn reverse_address(base: &[&[u8]], v6: bool) -> Option<IpAddr> {
    if !v6 {
        if base.len() != 4 {
            return None;
        }
        let text: Vec<&str> = base
            .iter()
            .rev()
            .map(|l| std::str::from_utf8(l).ok())
            .collect::<Option<_>>()?;
        return text.join(".").parse::<Ipv4Addr>().ok().map(IpAddr::V4);
    }
    if base.len() != 32 {
        return None;
    }
    let mut bits: u128 = 0;
    for label in base.iter().rev() {
        let [digit] = label else {
            return None;
        };
        let nibble = (*digit as char).to_digit(16)?;
        bits = (bits << 4) | u128::from(nibble);
    }
    Some(IpAddr::V6(Ipv6Addr::from(bits)))
}

/// The pod address of a `pods insecure` name: `1-2-3-4` or `fd00--1` (CoreDNS's `findPods`).
fn pod_address(podname: &str) -> Option<IpAddr> {
    if podname.matches('-').count() == 3 && !podname.contains("--") {
        podname.replace('-', ".").parse::<Ipv4Addr>().ok().map(IpAddr::V4)
    } else {
        podname.replace('-', ":").parse::<Ipv6Addr>().ok().map(IpAddr::V6)
    }
}

fn unix_seconds() -> u32 {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    // The SOA serial is 32 bits wide, as CoreDNS's (which truncates the same way).
    secs as u32
}

/// The cluster DNS: an index of Services, EndpointSlices and Namespaces, readable while it is
/// written, and the answer path over it. Fed by [`run`] (or the `apply_*` / `delete_*` calls),
/// served by [`serve`].
pub struct ClusterDns {
    cluster: Zone,
    reverse_v4: Zone,
    reverse_v6: Zone,
    index: RwLock<Index>,
    synced: AtomicBool,
    /// Unix time of the last change: the SOA serial.
    serial: AtomicU32,
    /// This server's own addresses, for `ns.dns.ZONE` and the zone's NS records.
    ns_addrs: RwLock<Vec<IpAddr>>,
}

impl ClusterDns {
    /// An empty index for the cluster domain (`cluster.local`). A domain that is not a DNS name is
    /// logged and `cluster.local` is used.
    pub fn new(domain: &str) -> Arc<ClusterDns> {
        let parsed = Name::from_ascii(domain.trim().trim_end_matches('.'))
            .ok()
            .filter(|n| !n.is_root() && !domain.trim().is_empty());
        let mut name = match parsed {
            Some(name) => name,
            None => {
                tracing::error!(domain, "cluster domain is not a DNS name; using cluster.local");
                Name::from_labels(["cluster", "local"]).unwrap_or_else(|_| Name::root())
            }
        };
        name.set_fqdn(true);
        let arpa = |labels: [&str; 2]| Name::from_labels(labels).unwrap_or_else(|_| Name::root());
        Arc::new(ClusterDns {
            cluster: Zone::new(name),
            reverse_v4: Zone::new(arpa(["in-addr", "arpa"])),
            reverse_v6: Zone::new(arpa(["ip6", "arpa"])),
            index: RwLock::new(Index::default()),
            synced: AtomicBool::new(false),
            serial: AtomicU32::new(unix_seconds()),
            ns_addrs: RwLock::new(Vec::new()),
        })
    }

    /// Says the index holds the cluster's objects (the first lists are in): from now on names that
    /// do not exist are NXDOMAIN rather than SERVFAIL. [`run`] calls it.
    pub fn mark_synced(&self) {
        self.synced.store(true, Ordering::Release);
    }

    fn changed(&self) {
        self.serial.store(unix_seconds(), Ordering::Relaxed);
    }

    /// Adds or replaces a Service.
    pub fn apply_service(&self, svc: &Service) {
        let Some((ns, name)) = object_key(&svc.metadata) else {
            return;
        };
        let info = ServiceInfo::from_service(svc);
        self.index.write().set_service(&ns, &name, Some(info));
        self.changed();
    }

    /// Removes a Service (its EndpointSlices stay until they are deleted themselves).
    pub fn delete_service(&self, namespace: &str, name: &str) {
        let (ns, name) = (namespace.to_ascii_lowercase(), name.to_ascii_lowercase());
        self.index.write().set_service(&ns, &name, None);
        self.changed();
    }

    /// Adds or replaces an EndpointSlice (one without the `kubernetes.io/service-name` label
    /// belongs to no Service and is dropped).
    pub fn apply_endpoint_slice(&self, slice: &EndpointSlice) {
        let Some((ns, name)) = object_key(&slice.metadata) else {
            return;
        };
        let info = SliceInfo::from_slice(slice);
        self.index.write().set_slice(&ns, &name, info);
        self.changed();
    }

    /// Removes an EndpointSlice.
    pub fn delete_endpoint_slice(&self, namespace: &str, name: &str) {
        let (ns, name) = (namespace.to_ascii_lowercase(), name.to_ascii_lowercase());
        self.index.write().set_slice(&ns, &name, None);
        self.changed();
    }

    /// Records that a Namespace exists (`NS.svc.ZONE` is NODATA, pod names in it resolve, even
    /// while it holds no Service).
    pub fn apply_namespace(&self, namespace: &Namespace) {
        if let Some(name) = namespace.metadata.name.as_deref() {
            self.index.write().set_namespace(&name.to_ascii_lowercase(), true);
            self.changed();
        }
    }

    /// Records that a Namespace is gone.
    pub fn delete_namespace(&self, name: &str) {
        self.index.write().set_namespace(&name.to_ascii_lowercase(), false);
        self.changed();
    }

    /// Replaces every Service with `services` (a relist: what it lacks was deleted).
    fn replace_services(&self, services: &[Service]) {
        let infos: Vec<_> = services
            .iter()
            .filter_map(|s| object_key(&s.metadata).map(|k| (k, ServiceInfo::from_service(s))))
            .collect();
        let listed: HashSet<&(String, String)> = infos.iter().map(|(k, _)| k).collect();
        let mut index = self.index.write();
        for (ns, name) in index.service_keys() {
            if !listed.contains(&(ns.clone(), name.clone())) {
                index.set_service(&ns, &name, None);
            }
        }
        for ((ns, name), info) in infos {
            index.set_service(&ns, &name, Some(info));
        }
        drop(index);
        self.changed();
    }

    /// Replaces every EndpointSlice with `slices` (a relist).
    fn replace_endpoint_slices(&self, slices: &[EndpointSlice]) {
        let infos: Vec<_> = slices
            .iter()
            .filter_map(|s| object_key(&s.metadata).map(|k| (k, SliceInfo::from_slice(s))))
            .collect();
        let listed: HashSet<&(String, String)> = infos.iter().map(|(k, _)| k).collect();
        let mut index = self.index.write();
        for (ns, name) in index.slice_keys() {
            if !listed.contains(&(ns.clone(), name.clone())) {
                index.set_slice(&ns, &name, None);
            }
        }
        for ((ns, name), info) in infos {
            index.set_slice(&ns, &name, info);
        }
        drop(index);
        self.changed();
    }

    /// Replaces the set of Namespaces (a relist).
    fn replace_namespaces(&self, namespaces: &[Namespace]) {
        let listed: HashSet<String> = namespaces
            .iter()
            .filter_map(|n| n.metadata.name.as_deref().map(str::to_ascii_lowercase))
            .collect();
        let mut index = self.index.write();
        let known: Vec<String> = index
            .namespaces
            .iter()
            .filter(|(_, e)| e.listed)
            .map(|(n, _)| n.clone())
            .collect();
        for ns in known {
            if !listed.contains(&ns) {
                index.set_namespace(&ns, false);
            }
        }
        for ns in &listed {
            index.set_namespace(ns, true);
        }
        drop(index);
        self.changed();
    }

    // --- the answer path -----------------------------------------------------------------------

    /// Answers `qname` / `qtype` from the index, or says where the answer must come from.
    fn resolve(&self, qname: &Name, qtype: RecordType) -> Resolution<'_> {
        let lower = qname.to_lowercase();
        let labels: Vec<&[u8]> = lower.iter().collect();
        if let Some(base) = self.cluster.strip(&labels) {
            let Some(base) = base
                .iter()
                .map(|l| std::str::from_utf8(l).ok())
                .collect::<Option<Vec<&str>>>()
            else {
                return self.name_error(&self.cluster);
            };
            let index = self.index.read();
            return self.resolve_cluster(&index, qname, &base, qtype);
        }
        for (zone, v6) in [(&self.reverse_v4, false), (&self.reverse_v6, true)] {
            if let Some(base) = zone.strip(&labels) {
                return self.resolve_reverse(zone, v6, qname, base, qtype);
            }
        }
        Resolution::Forward
    }

    /// NXDOMAIN with the zone's SOA (SERVFAIL until the index has synced).
    fn name_error<'z>(&'z self, zone: &'z Zone) -> Resolution<'z> {
        let rcode = if self.synced.load(Ordering::Acquire) {
            ResponseCode::NXDomain
        } else {
            ResponseCode::ServFail
        };
        Resolution::Local(Answer {
            rcode,
            answers: Vec::new(),
            additionals: Vec::new(),
            soa: Some(zone),
        })
    }

    /// NOERROR without answers, with the zone's SOA.
    fn no_data<'z>(&'z self, zone: &'z Zone) -> Resolution<'z> {
        Resolution::Local(Answer {
            rcode: ResponseCode::NoError,
            answers: Vec::new(),
            additionals: Vec::new(),
            soa: Some(zone),
        })
    }

    /// Records, or NODATA when there are none.
    fn records_or_no_data<'z>(
        &'z self,
        zone: &'z Zone,
        answers: Vec<Record>,
        additionals: Vec<Record>,
    ) -> Resolution<'z> {
        if answers.is_empty() {
            self.no_data(zone)
        } else {
            Resolution::Local(Answer::records(answers, additionals))
        }
    }

    /// The zone's NS records (`ns.dns.ZONE`, its addresses in the additional section).
    fn name_servers<'z>(&'z self, zone: &'z Zone, qname: &Name) -> Resolution<'z> {
        let addrs = self.ns_addrs.read().clone();
        if addrs.is_empty() {
            return self.no_data(zone);
        }
        let answers = vec![Record::from_rdata(qname.clone(), TTL, RData::NS(NS(zone.ns.clone())))];
        let additionals = addrs
            .into_iter()
            .map(|ip| address_record(zone.ns.clone(), ip))
            .collect();
        Resolution::Local(Answer::records(answers, additionals))
    }

    fn resolve_cluster<'z>(&'z self, index: &Index, qname: &Name, base: &[&str], qtype: RecordType) -> Resolution<'z> {
        let zone = &self.cluster;
        let apex = base.is_empty();
        match qtype {
            RecordType::AXFR | RecordType::IXFR => Resolution::Refused,
            RecordType::A | RecordType::AAAA => match self.addresses(index, qname, base, qtype, &[]) {
                Err(NameError) => self.name_error(zone),
                Ok(Addresses::Records(records)) => self.records_or_no_data(zone, records, Vec::new()),
                Ok(Addresses::Chase { chain, target }) => Resolution::Chase { chain, target },
            },
            RecordType::SRV => self.srv(index, qname, base),
            RecordType::TXT => {
                if base == ["dns-version"] {
                    let txt = TXT::new(vec![DNS_SCHEMA_VERSION.to_string()]);
                    let record = Record::from_rdata(qname.clone(), DNS_SCHEMA_TTL, RData::TXT(txt));
                    return Resolution::Local(Answer::records(vec![record], Vec::new()));
                }
                // As CoreDNS: NODATA where records of another type exist, else NXDOMAIN.
                match self.records(index, base) {
                    Ok(hits) if !hits.is_empty() => self.no_data(zone),
                    _ => self.name_error(zone),
                }
            }
            RecordType::CNAME => match self.services(index, base, qtype) {
                Err(NameError) => self.name_error(zone),
                Ok(hits) => match hits.first().map(|h| h.host) {
                    Some(HitHost::Name(target)) => {
                        let record = Record::from_rdata(qname.clone(), TTL, RData::CNAME(CNAME(target.clone())));
                        Resolution::Local(Answer::records(vec![record], Vec::new()))
                    }
                    _ => self.no_data(zone),
                },
            },
            RecordType::PTR => match self.records(index, base) {
                Err(NameError) => self.name_error(zone),
                Ok(_) => self.no_data(zone),
            },
            RecordType::SOA if apex => {
                let soa = zone.soa(self.serial.load(Ordering::Relaxed));
                Resolution::Local(Answer::records(vec![soa], Vec::new()))
            }
            RecordType::SOA => self.no_data(zone),
            RecordType::NS if apex => self.name_servers(zone, qname),
            // Anything else: NODATA where an A lookup finds the name, else NXDOMAIN.
            _ => match self.services(index, base, RecordType::A) {
                Err(NameError) => self.name_error(zone),
                Ok(_) => self.no_data(zone),
            },
        }
    }

    fn resolve_reverse<'z>(
        &'z self,
        zone: &'z Zone,
        v6: bool,
        qname: &Name,
        base: &[&[u8]],
        qtype: RecordType,
    ) -> Resolution<'z> {
        match qtype {
            RecordType::AXFR | RecordType::IXFR => return Resolution::Refused,
            RecordType::SOA if base.is_empty() => {
                let soa = zone.soa(self.serial.load(Ordering::Relaxed));
                return Resolution::Local(Answer::records(vec![soa], Vec::new()));
            }
            RecordType::NS if base.is_empty() => return self.name_servers(zone, qname),
            RecordType::SOA => return self.no_data(zone),
            _ if base.is_empty() => return self.no_data(zone),
            RecordType::PTR => {}
            // Other types under a reverse zone are name errors, which fall through.
            _ => return Resolution::Forward,
        }
        let Some(ip) = reverse_address(base, v6) else {
            return Resolution::Forward;
        };
        let index = self.index.read();
        let targets = self.ptr_targets(&index, ip);
        drop(index);
        if targets.is_empty() {
            return Resolution::Forward;
        }
        let answers = targets
            .into_iter()
            .map(|t| Record::from_rdata(qname.clone(), TTL, RData::PTR(PTR(t))))
            .collect();
        Resolution::Local(Answer::records(answers, Vec::new()))
    }

    /// CoreDNS's `serviceRecordForIP`: the first Service with the ClusterIP, else every endpoint
    /// with the address (`HOST.SVC.NS.svc.ZONE`).
    fn ptr_targets(&self, index: &Index, ip: IpAddr) -> Vec<Name> {
        let zone = &self.cluster.name;
        if let Some((ns, svc)) = index.reverse_services.get(&ip).and_then(|keys| keys.first()) {
            return name_under(&[svc, ns, SVC], zone).into_iter().collect();
        }
        let mut targets: Vec<Name> = Vec::new();
        for (ns, slice_name) in index.reverse_endpoints.get(&ip).into_iter().flatten() {
            let Some(entry) = index.namespaces.get(ns) else {
                continue;
            };
            let Some(owner) = entry.slice_service.get(slice_name) else {
                continue;
            };
            let Some(service) = entry.services.get(owner) else {
                continue;
            };
            let Some(slice) = service.slices.get(slice_name) else {
                continue;
            };
            let publish = service.service.as_ref().is_some_and(|s| s.publish_not_ready);
            for address in &slice.addresses {
                if address.ip != ip || !(address.ready || publish) {
                    continue;
                }
                if let Some(target) = name_under(&[&address.label, owner, ns, SVC], zone)
                    && !targets.contains(&target)
                {
                    targets.push(target);
                }
            }
        }
        targets
    }

    /// CoreDNS's `Services`: `ns.dns.ZONE` is this server, everything else [`Self::records`].
    fn services<'a>(&self, index: &'a Index, base: &[&'a str], qtype: RecordType) -> Result<Vec<Hit<'a>>, NameError> {
        if base == ["ns", "dns"] {
            let addrs = self.ns_addrs.read();
            return Ok(addrs
                .iter()
                .filter(|ip| (ip.is_ipv4() && qtype == RecordType::A) || (ip.is_ipv6() && qtype == RecordType::AAAA))
                .map(|ip| Hit {
                    host: HitHost::Ip(*ip),
                    port: 0,
                    key: HitKey::NameServer,
                })
                .collect());
        }
        self.records(index, base)
    }

    /// CoreDNS's `Records`: what a name under the cluster zone holds.
    fn records<'a>(&self, index: &'a Index, base: &[&'a str]) -> Result<Vec<Hit<'a>>, NameError> {
        let r = parse_request(base)?;
        if r.pod_or_svc.is_empty() {
            return Ok(Vec::new());
        }
        if !index.namespace_exists(r.namespace) {
            return Err(NameError);
        }
        if r.pod_or_svc == POD {
            find_pods(&r)
        } else {
            find_services(index, &r)
        }
    }

    /// CoreDNS's `plugin.A` / `plugin.AAAA`: address records of the asked family, following
    /// ExternalName CNAMEs inside the zone and handing those leaving it to the upstreams.
    fn addresses(
        &self,
        index: &Index,
        qname: &Name,
        base: &[&str],
        qtype: RecordType,
        chain: &[Record],
    ) -> Result<Addresses, NameError> {
        let hits = self.services(index, base, qtype)?;
        let mut records = Vec::new();
        let mut seen = Seen::new();
        for hit in hits {
            match hit.host {
                HitHost::Ip(ip) => {
                    let wanted = match ip {
                        IpAddr::V4(_) => qtype == RecordType::A,
                        IpAddr::V6(_) => qtype == RecordType::AAAA,
                    };
                    if wanted && seen.insert(ip) {
                        records.push(address_record(qname.clone(), ip));
                    }
                }
                HitHost::Name(target) => {
                    // x CNAME x is a loop; so are repeated links and over-long chains.
                    if target == qname || chain.len() > MAX_CNAME_CHAIN {
                        continue;
                    }
                    let cname = Record::from_rdata(qname.clone(), TTL, RData::CNAME(CNAME(target.clone())));
                    if chain.contains(&cname) {
                        continue;
                    }
                    if !self.cluster.name.zone_of(target) {
                        records.push(cname);
                        return Ok(Addresses::Chase {
                            chain: records,
                            target: target.clone(),
                        });
                    }
                    let lower = target.to_lowercase();
                    let labels: Vec<&[u8]> = lower.iter().collect();
                    let Some(next_base) = self.cluster.strip(&labels).and_then(|b| {
                        b.iter()
                            .map(|l| std::str::from_utf8(l).ok())
                            .collect::<Option<Vec<&str>>>()
                    }) else {
                        continue;
                    };
                    let mut next_chain = chain.to_vec();
                    next_chain.push(cname.clone());
                    match self.addresses(index, target, &next_base, qtype, &next_chain) {
                        Ok(Addresses::Records(next)) if !next.is_empty() => {
                            records.push(cname);
                            records.extend(next);
                        }
                        Ok(Addresses::Chase { chain: rest, target }) => {
                            records.push(cname);
                            records.extend(rest);
                            return Ok(Addresses::Chase { chain: records, target });
                        }
                        _ => {}
                    }
                }
            }
        }
        Ok(Addresses::Records(records))
    }

    /// The SRV target (and additional record owner) of a hit.
    fn target_name(&self, key: HitKey<'_>) -> Option<Name> {
        let zone = &self.cluster.name;
        match key {
            HitKey::Service { ns, svc } => name_under(&[svc, ns, SVC], zone),
            HitKey::Endpoint { label, ns, svc } => name_under(&[label, svc, ns, SVC], zone),
            HitKey::Pod { ns, pod } => name_under(&[pod, ns, POD], zone),
            HitKey::NameServer => Some(self.cluster.ns.clone()),
        }
    }

    /// CoreDNS's `plugin.SRV`: one record per (target, port), weights shared out equally, the
    /// targets' addresses in the additional section. ExternalName Services have none.
    fn srv<'z>(&'z self, index: &Index, qname: &Name, base: &[&str]) -> Resolution<'z> {
        let zone = &self.cluster;
        let mut hits = match self.services(index, base, RecordType::SRV) {
            Err(NameError) => return self.name_error(zone),
            Ok(hits) => hits,
        };
        hits.retain(|h| matches!(h.host, HitHost::Ip(_)));
        let weight = u16::try_from(100 / hits.len().max(1)).unwrap_or(1).max(1);
        let mut answers = Vec::new();
        let mut additionals = Vec::new();
        let mut seen_srv = Seen::new();
        let mut seen_addr = Seen::new();
        for hit in &hits {
            let HitHost::Ip(ip) = hit.host else {
                continue;
            };
            let Ok(port) = u16::try_from(hit.port) else {
                continue;
            };
            let Some(target) = self.target_name(hit.key) else {
                continue;
            };
            if seen_srv.insert((target.clone(), port)) {
                let srv = SRV::new(0, weight, port, target.clone());
                answers.push(Record::from_rdata(qname.clone(), TTL, RData::SRV(srv)));
            }
            if seen_addr.insert((target.clone(), ip)) {
                additionals.push(address_record(target, ip));
            }
        }
        self.records_or_no_data(zone, answers, additionals)
    }
}

/// CoreDNS's `findPods` with `pods insecure`: any address in an existing namespace.
fn find_pods<'a>(r: &RecordRequest<'a>) -> Result<Vec<Hit<'a>>, NameError> {
    if r.service.is_empty() {
        return Ok(Vec::new());
    }
    let ip = pod_address(r.service).ok_or(NameError)?;
    Ok(vec![Hit {
        host: HitHost::Ip(ip),
        port: 0,
        key: HitKey::Pod {
            ns: r.namespace,
            pod: r.service,
        },
    }])
}

/// CoreDNS's `findServices`: the records of one Service name (with an endpoint, port or protocol
/// when the name has them).
fn find_services<'a>(index: &'a Index, r: &RecordRequest<'a>) -> Result<Vec<Hit<'a>>, NameError> {
    if r.service.is_empty() {
        return Ok(Vec::new());
    }
    let entry = index
        .namespaces
        .get(r.namespace)
        .and_then(|ns| ns.services.get(r.service))
        .ok_or(NameError)?;
    let svc = entry.service.as_ref().ok_or(NameError)?;
    let mut hits = Vec::new();
    let mut found = false;
    match &svc.kind {
        ServiceKind::ExternalName(target) => {
            if !r.endpoint.is_empty() || !r.port.is_empty() || !r.protocol.is_empty() {
                return Err(NameError);
            }
            let target = target.as_ref().ok_or(NameError)?;
            found = true;
            hits.push(Hit {
                host: HitHost::Name(target),
                port: 0,
                key: HitKey::Service {
                    ns: r.namespace,
                    svc: r.service,
                },
            });
        }
        kind if matches!(kind, ServiceKind::Headless) || !r.endpoint.is_empty() => {
            for slice in entry.slices.values() {
                for address in &slice.addresses {
                    if !(address.ready || svc.publish_not_ready) {
                        continue;
                    }
                    if !r.endpoint.is_empty() && !address.label.eq_ignore_ascii_case(r.endpoint) {
                        continue;
                    }
                    for port in &slice.ports {
                        if !port.matches(r.port, r.protocol) {
                            continue;
                        }
                        found = true;
                        hits.push(Hit {
                            host: HitHost::Ip(address.ip),
                            port: port.port,
                            key: HitKey::Endpoint {
                                label: &address.label,
                                ns: r.namespace,
                                svc: r.service,
                            },
                        });
                    }
                }
            }
        }
        ServiceKind::ClusterIp(ips) => {
            for port in &svc.ports {
                if !port.matches(r.port, r.protocol) {
                    continue;
                }
                found = true;
                for ip in ips {
                    hits.push(Hit {
                        host: HitHost::Ip(*ip),
                        port: port.port,
                        key: HitKey::Service {
                            ns: r.namespace,
                            svc: r.service,
                        },
                    });
                }
            }
        }
        ServiceKind::Headless => {}
    }
    if found { Ok(hits) } else { Err(NameError) }
}

// ---------------------------------------------------------------------------------------------
// Messages.

/// How a query came in: it bounds the reply's size.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Transport {
    Udp,
    Tcp,
}

/// What the server does with one packet.
enum Handled {
    /// The reply is in the output buffer.
    Reply,
    /// Nothing is sent (not a query, or not even a header).
    Drop,
    /// The reply needs the upstreams.
    Upstream(Box<UpstreamJob>),
}

/// A query whose answer comes (in part) from the upstreams.
struct UpstreamJob {
    request: Message,
    /// The query as received, forwarded as it is.
    packet: Vec<u8>,
    transport: Transport,
    /// The reply's size limit.
    limit: usize,
    kind: UpstreamKind,
}

enum UpstreamKind {
    /// Not a cluster name: the upstream's reply is relayed.
    Forward,
    /// An ExternalName chain: the target's records of `qtype` are asked for and follow the chain.
    Chase {
        chain: Vec<Record>,
        target: Name,
        qtype: RecordType,
    },
}

/// The largest reply a query may get: 512 bytes over UDP without EDNS, its EDNS payload size
/// (up to 4096) with; 65535 over TCP.
fn reply_limit(request: &Message, transport: Transport) -> usize {
    match transport {
        Transport::Tcp => usize::from(u16::MAX),
        Transport::Udp => usize::from(request.edns.as_ref().map_or(MIN_UDP_PAYLOAD, |e| {
            e.max_payload().clamp(MIN_UDP_PAYLOAD, MAX_UDP_PAYLOAD)
        })),
    }
}

/// A reply to `request` (its id, opcode, question, RD and CD flags; EDNS when it had EDNS).
fn reply_to(request: &Message, rcode: ResponseCode, authoritative: bool) -> Message {
    let mut msg = Message::response(request.metadata.id, request.metadata.op_code);
    msg.metadata.authoritative = authoritative;
    msg.metadata.recursion_desired = request.metadata.recursion_desired;
    msg.metadata.checking_disabled = request.metadata.checking_disabled;
    msg.metadata.response_code = rcode;
    msg.queries = request.queries.clone();
    if let Some(edns) = &request.edns {
        let mut ours = Edns::new();
        ours.set_max_payload(edns.max_payload().clamp(MIN_UDP_PAYLOAD, MAX_UDP_PAYLOAD));
        msg.edns = Some(ours);
    }
    msg
}

fn emit(msg: &Message, out: &mut Vec<u8>, max: Option<u16>) -> bool {
    out.clear();
    let mut encoder = BinEncoder::new(out);
    if let Some(max) = max {
        encoder.set_max_size(max);
    }
    msg.emit(&mut encoder).is_ok()
}

/// Encodes `msg` into `out` within `limit` bytes: whole if it fits, else without the additional
/// section, else with the answers that fit and TC set. False when it cannot be encoded at all.
fn encode(msg: &mut Message, limit: usize, out: &mut Vec<u8>) -> bool {
    if emit(msg, out, None) && out.len() <= limit {
        return true;
    }
    msg.additionals.clear();
    if emit(msg, out, None) && out.len() <= limit {
        return true;
    }
    emit(msg, out, Some(u16::try_from(limit).unwrap_or(u16::MAX))) && out.len() <= limit
}

/// A header-only reply to a packet that did not parse: its id, opcode and RD, `rcode`. False
/// (nothing to send) when the packet is shorter than a header or is itself a response.
fn header_reply(packet: &[u8], rcode: u8, out: &mut Vec<u8>) -> bool {
    if packet.len() < 12 || packet[2] & 0x80 != 0 {
        return false;
    }
    out.clear();
    out.extend_from_slice(&packet[..2]);
    out.push(0x80 | (packet[2] & 0x79));
    out.push(rcode & 0x0f);
    out.extend_from_slice(&[0; 8]);
    true
}

/// Encodes `msg`, falling back to a header-only SERVFAIL.
fn encode_or_servfail(msg: &mut Message, limit: usize, packet: &[u8], out: &mut Vec<u8>) -> bool {
    if encode(msg, limit, out) {
        return true;
    }
    tracing::warn!(id = msg.metadata.id, "encoding a DNS reply failed; answering SERVFAIL");
    header_reply(packet, 2, out)
}

impl ClusterDns {
    /// Handles one packet: a reply in `out`, nothing, or a job for the upstreams. Never panics on
    /// input: what does not parse is answered FORMERR (or dropped when it is not even a header).
    fn handle(&self, packet: &[u8], transport: Transport, out: &mut Vec<u8>) -> Handled {
        let request = match Message::from_vec(packet) {
            Ok(request) => request,
            Err(e) => {
                tracing::debug!(error = %e, "malformed DNS query");
                return if header_reply(packet, 1, out) {
                    Handled::Reply
                } else {
                    Handled::Drop
                };
            }
        };
        if request.metadata.message_type != MessageType::Query {
            return Handled::Drop;
        }
        let limit = reply_limit(&request, transport);
        let error = |rcode, out: &mut Vec<u8>| {
            let mut msg = reply_to(&request, rcode, false);
            if encode_or_servfail(&mut msg, limit, packet, out) {
                Handled::Reply
            } else {
                Handled::Drop
            }
        };
        if request.metadata.op_code != OpCode::Query {
            return error(ResponseCode::NotImp, out);
        }
        let [query] = request.queries.as_slice() else {
            return error(ResponseCode::FormErr, out);
        };
        let qtype = query.query_type();
        match self.resolve(query.name(), qtype) {
            Resolution::Local(answer) => {
                let mut msg = reply_to(&request, answer.rcode, true);
                msg.answers = answer.answers;
                msg.additionals = answer.additionals;
                if let Some(zone) = answer.soa {
                    msg.authorities.push(zone.soa(self.serial.load(Ordering::Relaxed)));
                }
                if encode_or_servfail(&mut msg, limit, packet, out) {
                    Handled::Reply
                } else {
                    Handled::Drop
                }
            }
            Resolution::Refused => error(ResponseCode::Refused, out),
            Resolution::Forward => Handled::Upstream(Box::new(UpstreamJob {
                packet: packet.to_vec(),
                request,
                transport,
                limit,
                kind: UpstreamKind::Forward,
            })),
            Resolution::Chase { chain, target } => Handled::Upstream(Box::new(UpstreamJob {
                packet: packet.to_vec(),
                request,
                transport,
                limit,
                kind: UpstreamKind::Chase { chain, target, qtype },
            })),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Forwarding.

/// The upstream name servers (CoreDNS's `forward . /etc/resolv.conf`): asked in turn, starting
/// from the next one each query, each with [`UPSTREAM_TRY_TIMEOUT`], all within
/// [`FORWARD_DEADLINE`]. Each query goes out from a fresh socket with a fresh id.
struct Forwarder {
    upstreams: Vec<SocketAddr>,
    next: AtomicUsize,
    try_timeout: Duration,
    deadline: Duration,
    in_flight: Arc<Semaphore>,
}

/// Whether a DNS message has TC set.
fn truncated(packet: &[u8]) -> bool {
    packet.len() > 2 && packet[2] & 0x02 != 0
}

/// `packet` with a fresh random id, and that id.
fn with_fresh_id(packet: &[u8]) -> (Vec<u8>, [u8; 2]) {
    let id = rand::random::<u16>().to_be_bytes();
    let mut query = packet.to_vec();
    if query.len() >= 2 {
        query[..2].copy_from_slice(&id);
    }
    (query, id)
}

/// Whether `reply` answers a query with `id`.
fn answers_id(reply: &[u8], id: [u8; 2]) -> bool {
    reply.len() >= 12 && reply[..2] == id && reply[2] & 0x80 != 0
}

async fn exchange_udp(upstream: SocketAddr, packet: &[u8]) -> anyhow::Result<Vec<u8>> {
    let local: SocketAddr = if upstream.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(local).await.context("binding a UDP socket")?;
    socket.connect(upstream).await.context("connecting")?;
    let (query, id) = with_fresh_id(packet);
    socket.send(&query).await.context("sending")?;
    let mut buf = vec![0u8; usize::from(u16::MAX)];
    loop {
        let n = socket.recv(&mut buf).await.context("receiving")?;
        if answers_id(&buf[..n], id) {
            buf.truncate(n);
            buf[..2].copy_from_slice(&packet[..2]);
            return Ok(buf);
        }
    }
}

async fn exchange_tcp(upstream: SocketAddr, packet: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(upstream).await.context("connecting")?;
    let (query, id) = with_fresh_id(packet);
    let len = u16::try_from(query.len()).context("query too long")?;
    let mut frame = Vec::with_capacity(query.len() + 2);
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&query);
    stream.write_all(&frame).await.context("sending")?;
    loop {
        let mut len = [0u8; 2];
        stream.read_exact(&mut len).await.context("reading the length")?;
        let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
        stream.read_exact(&mut buf).await.context("reading the reply")?;
        if answers_id(&buf, id) {
            buf[..2].copy_from_slice(&packet[..2]);
            return Ok(buf);
        }
    }
}

impl Forwarder {
    fn new(upstreams: Vec<SocketAddr>) -> Self {
        Forwarder {
            upstreams,
            next: AtomicUsize::new(0),
            try_timeout: UPSTREAM_TRY_TIMEOUT,
            deadline: FORWARD_DEADLINE,
            in_flight: Arc::new(Semaphore::new(MAX_FORWARDS)),
        }
    }

    /// An upstream's reply to `packet` (id restored), asked over UDP and, when `full` and the
    /// reply is truncated, again over TCP. `None` when no upstream answered in time.
    async fn exchange(&self, packet: &[u8], full: bool) -> Option<Vec<u8>> {
        let n = self.upstreams.len();
        if n == 0 || packet.len() < 12 {
            return None;
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let deadline = tokio::time::Instant::now() + self.deadline;
        for i in 0..n {
            let upstream = self.upstreams[(start + i) % n];
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                break;
            }
            let budget = self.try_timeout.min(left);
            let reply = match tokio::time::timeout(budget, exchange_udp(upstream, packet)).await {
                Ok(Ok(reply)) => reply,
                Ok(Err(e)) => {
                    tracing::debug!(%upstream, error = %format!("{e:#}"), "upstream DNS over UDP failed");
                    continue;
                }
                Err(_) => {
                    tracing::debug!(%upstream, "upstream DNS did not answer in time");
                    continue;
                }
            };
            if !(full && truncated(&reply)) {
                return Some(reply);
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match tokio::time::timeout(self.try_timeout.min(left), exchange_tcp(upstream, packet)).await {
                Ok(Ok(reply)) => return Some(reply),
                Ok(Err(e)) => tracing::debug!(%upstream, error = %format!("{e:#}"), "upstream DNS over TCP failed"),
                Err(_) => tracing::debug!(%upstream, "upstream DNS over TCP did not answer in time"),
            }
        }
        None
    }

    /// The reply to a job, in `out`. False when there is nothing to send.
    async fn answer(&self, dns: &ClusterDns, job: UpstreamJob, out: &mut Vec<u8>) -> bool {
        let Ok(_permit) = self.in_flight.clone().try_acquire_owned() else {
            tracing::debug!("too many forwarded DNS queries under way; answering SERVFAIL");
            let mut msg = reply_to(&job.request, ResponseCode::ServFail, false);
            return encode_or_servfail(&mut msg, job.limit, &job.packet, out);
        };
        match job.kind {
            UpstreamKind::Forward => {
                // A UDP client gets a truncated reply as it is (it asks again over TCP itself).
                match self.exchange(&job.packet, job.transport == Transport::Tcp).await {
                    Some(reply) => {
                        out.clear();
                        out.extend_from_slice(&reply);
                        true
                    }
                    None => {
                        let mut msg = reply_to(&job.request, ResponseCode::ServFail, false);
                        encode_or_servfail(&mut msg, job.limit, &job.packet, out)
                    }
                }
            }
            UpstreamKind::Chase { chain, target, qtype } => {
                let mut query = Message::query();
                query.metadata.recursion_desired = true;
                query.add_query(Query::query(target, qtype));
                let mut edns = Edns::new();
                edns.set_max_payload(MAX_UDP_PAYLOAD);
                query.edns = Some(edns);
                let upstream = match query.to_vec() {
                    Ok(bytes) => self.exchange(&bytes, true).await,
                    Err(e) => {
                        tracing::debug!(error = %e, "encoding an upstream query failed");
                        None
                    }
                };
                let answers = upstream
                    .and_then(|bytes| Message::from_vec(&bytes).ok())
                    .map(|m| m.answers);
                let mut msg = reply_to(&job.request, ResponseCode::NoError, true);
                match answers {
                    Some(answers) => {
                        msg.answers = chain;
                        msg.answers.extend(answers);
                    }
                    // As CoreDNS: a target the upstreams do not answer leaves the name without records.
                    None => msg
                        .authorities
                        .push(dns.cluster.soa(dns.serial.load(Ordering::Relaxed))),
                }
                encode_or_servfail(&mut msg, job.limit, &job.packet, out)
            }
        }
    }
}

/// What [`ClusterDns::lookup`] found: the response code and the answer records, as `dig` prints
/// them, or `None` for a name the cluster DNS forwards to the node's resolvers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    pub response_code: String,
    pub answers: Vec<String>,
}

impl ClusterDns {
    /// Asks the index what a pod asking `name` (type `record_type`) gets, through the same path as
    /// a query over the network; `None` when the name would be forwarded.
    pub fn lookup(&self, name: &str, record_type: RecordType) -> Option<Lookup> {
        let mut name = Name::from_ascii(name).ok()?;
        name.set_fqdn(true);
        let mut request = Message::query();
        request.metadata.id = 1;
        request.metadata.recursion_desired = true;
        request.queries.push(Query::query(name, record_type));
        let packet = request.to_vec().ok()?;
        let mut out = Vec::new();
        match self.handle(&packet, Transport::Tcp, &mut out) {
            Handled::Reply => {}
            Handled::Drop | Handled::Upstream(_) => return None,
        }
        let reply = Message::from_vec(&out).ok()?;
        // As dig names them.
        let response_code = match reply.metadata.response_code {
            ResponseCode::NoError if reply.answers.is_empty() => "NOERROR, no records (NODATA)".to_string(),
            ResponseCode::NoError => "NOERROR".to_string(),
            ResponseCode::NXDomain => "NXDOMAIN".to_string(),
            ResponseCode::ServFail => "SERVFAIL".to_string(),
            other => other.to_string(),
        };
        let answers = reply
            .answers
            .iter()
            .map(|r| format!("{} {} {}", r.name, r.record_type(), r.data))
            .collect();
        Some(Lookup { response_code, answers })
    }
}

/// What cluster DNS answers for a Service (from the Service and its EndpointSlices alone): its
/// name, SRV records of its named ports and, for a headless Service, each endpoint's hostname.
pub fn explain_service(svc: &Service, slices: &[EndpointSlice], domain: &str) -> String {
    use std::fmt::Write as _;
    let index = ClusterDns::new(domain);
    let ns = svc.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let name = svc.metadata.name.clone().unwrap_or_default();
    let namespace: Namespace = Namespace {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(ns.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    index.apply_namespace(&namespace);
    index.apply_service(svc);
    for slice in slices {
        index.apply_endpoint_slice(slice);
    }
    index.mark_synced();
    let zone = domain.trim_end_matches('.');
    let fqdn = format!("{name}.{ns}.svc.{zone}");
    let mut questions = vec![(fqdn.clone(), RecordType::A)];
    let spec = svc.spec.clone().unwrap_or_default();
    if spec.type_.as_deref() == Some("ExternalName") {
        questions = vec![(fqdn.clone(), RecordType::CNAME)];
    }
    for port in spec.ports.iter().flatten() {
        if let Some(port_name) = port.name.as_deref().filter(|n| !n.is_empty()) {
            let proto = port.protocol.as_deref().unwrap_or("TCP").to_ascii_lowercase();
            questions.push((format!("_{port_name}._{proto}.{fqdn}"), RecordType::SRV));
        }
    }
    if spec.cluster_ip.as_deref() == Some("None") {
        let mut hosts: Vec<String> = slices
            .iter()
            .flat_map(|s| s.endpoints.iter())
            .filter_map(|e| e.hostname.clone())
            .collect();
        hosts.sort();
        hosts.dedup();
        for host in hosts {
            questions.push((format!("{host}.{fqdn}"), RecordType::A));
        }
    }
    let mut out = String::from("  DNS (what the cluster DNS answers from these objects):\n");
    for (question, record_type) in questions {
        match index.lookup(&question, record_type) {
            Some(found) if found.answers.is_empty() => {
                let _ = writeln!(out, "    {question} {record_type}: {}", found.response_code);
            }
            Some(found) => {
                let _ = writeln!(out, "    {question} {record_type}:");
                for answer in found.answers {
                    let _ = writeln!(out, "      {answer}");
                }
            }
            None => {
                let _ = writeln!(out, "    {question} {record_type}: forwarded to the node's resolvers");
            }
        }
    }
    out
}

/// The name servers of a resolv.conf, port 53, in order, each once: the upstreams for [`serve`].
/// Loopback servers (systemd-resolved's 127.0.0.53) are kept: the agent runs in the host's network
/// namespace, where they answer. A link-local IPv6 server keeps a numeric zone (`%2`) as its scope
/// and is skipped with a named one (`%eth0`).
pub fn upstreams_from_resolv_conf(text: &str) -> Vec<SocketAddr> {
    let mut upstreams = Vec::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("nameserver") {
            continue;
        }
        let Some(address) = words.next() else {
            continue;
        };
        let (address, zone) = match address.split_once('%') {
            Some((a, z)) => (a, Some(z)),
            None => (address, None),
        };
        let upstream = match (address.parse::<IpAddr>(), zone) {
            (Ok(IpAddr::V4(v4)), None) => SocketAddr::from((v4, 53)),
            (Ok(IpAddr::V6(v6)), None) => SocketAddr::from((v6, 53)),
            (Ok(IpAddr::V6(v6)), Some(zone)) => match zone.parse::<u32>() {
                Ok(scope) => SocketAddr::V6(std::net::SocketAddrV6::new(v6, 53, 0, scope)),
                Err(_) => continue,
            },
            _ => continue,
        };
        if !upstreams.contains(&upstream) {
            upstreams.push(upstream);
        }
    }
    upstreams
}

// ---------------------------------------------------------------------------------------------
// Serving.

/// A UDP socket and a TCP listener on one address, for [`serve_sockets`].
#[derive(Debug)]
pub struct DnsSockets {
    udp: UdpSocket,
    tcp: TcpListener,
}

impl DnsSockets {
    /// Binds UDP and TCP at `addr`. With a port of 0, UDP picks one and TCP takes the same (tried
    /// a few times, as another process may hold that TCP port).
    pub async fn bind(addr: SocketAddr) -> anyhow::Result<DnsSockets> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let udp = UdpSocket::bind(addr)
                .await
                .with_context(|| format!("binding DNS on UDP {addr}"))?;
            let bound = udp.local_addr().context("reading the bound UDP address")?;
            match TcpListener::bind(bound).await {
                Ok(tcp) => return Ok(DnsSockets { udp, tcp }),
                Err(e) if addr.port() == 0 && attempt < 8 => {
                    tracing::debug!(%bound, error = %e, "DNS: TCP port taken; picking another");
                }
                Err(e) => return Err(e).with_context(|| format!("binding DNS on TCP {bound}")),
            }
        }
    }

    /// The address both are bound to.
    pub fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        self.udp.local_addr().context("reading the bound UDP address")
    }
}

/// Answers DNS at `addr` on UDP and TCP (the same port; a port of 0 picks one for UDP and TCP
/// takes the same), from `dns`, forwarding other names to `upstreams` (without `addr` itself).
/// Returns only when binding fails or a socket breaks.
pub async fn serve(dns: Arc<ClusterDns>, addr: SocketAddr, upstreams: Vec<SocketAddr>) -> anyhow::Result<()> {
    let sockets = DnsSockets::bind(addr).await?;
    serve_sockets(dns, sockets, upstreams).await
}

/// [`serve`] on sockets already bound.
pub async fn serve_sockets(
    dns: Arc<ClusterDns>,
    sockets: DnsSockets,
    upstreams: Vec<SocketAddr>,
) -> anyhow::Result<()> {
    let bound = sockets.local_addr()?;
    let upstreams: Vec<SocketAddr> = upstreams.into_iter().filter(|u| *u != bound).collect();
    if upstreams.is_empty() {
        tracing::warn!("cluster DNS has no upstream name servers: names outside the cluster get SERVFAIL");
    }
    tracing::info!(%bound, ?upstreams, "serving cluster DNS");
    serve_on(dns, sockets.udp, sockets.tcp, Forwarder::new(upstreams)).await
}

/// Serves bound sockets: one UDP loop per core (up to 4), all on the one socket, each answering in
/// place (only queries for the upstreams become tasks), and a TCP accept loop. Two loops on two
/// cores answer about 65,000 queries/s; one loop about 41,000.
async fn serve_on(dns: Arc<ClusterDns>, udp: UdpSocket, tcp: TcpListener, forwarder: Forwarder) -> anyhow::Result<()> {
    let ip = udp.local_addr().context("reading the bound UDP address")?.ip();
    if !ip.is_unspecified() {
        let mut addrs = dns.ns_addrs.write();
        if !addrs.contains(&ip) {
            addrs.push(ip);
        }
    }
    let udp = Arc::new(udp);
    let forwarder = Arc::new(forwarder);
    let loops = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 4);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..loops {
        tasks.spawn(udp_loop(dns.clone(), udp.clone(), forwarder.clone()));
    }
    tasks.spawn(tcp_loop(dns, tcp, forwarder));
    let result = match tasks.join_next().await {
        Some(Ok(result)) => result,
        Some(Err(e)) => Err(anyhow::anyhow!("a DNS serving task failed: {e}")),
        None => Ok(()),
    };
    tasks.abort_all();
    result
}

async fn udp_loop(dns: Arc<ClusterDns>, socket: Arc<UdpSocket>, forwarder: Arc<Forwarder>) -> anyhow::Result<()> {
    let mut buf = vec![0u8; usize::from(u16::MAX)];
    let mut out = Vec::with_capacity(usize::from(MAX_UDP_PAYLOAD));
    loop {
        let (n, peer) = match socket.recv_from(&mut buf).await {
            Ok(received) => received,
            // ICMP errors of earlier sends surface here on Linux; they concern one peer only.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionRefused
                        | std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::Interrupted
                        | std::io::ErrorKind::WouldBlock
                ) =>
            {
                continue;
            }
            Err(e) => return Err(e).context("receiving DNS over UDP"),
        };
        match dns.handle(&buf[..n], Transport::Udp, &mut out) {
            Handled::Reply => {
                if let Err(e) = socket.send_to(&out, peer).await {
                    tracing::debug!(%peer, error = %e, "sending a DNS reply");
                }
            }
            Handled::Drop => {}
            Handled::Upstream(job) => {
                let (dns, socket, forwarder) = (dns.clone(), socket.clone(), forwarder.clone());
                tokio::spawn(async move {
                    let mut out = Vec::new();
                    if forwarder.answer(&dns, *job, &mut out).await
                        && let Err(e) = socket.send_to(&out, peer).await
                    {
                        tracing::debug!(%peer, error = %e, "sending a DNS reply");
                    }
                });
            }
        }
    }
}

async fn tcp_loop(dns: Arc<ClusterDns>, listener: TcpListener, forwarder: Arc<Forwarder>) -> anyhow::Result<()> {
    let connections = Arc::new(Semaphore::new(MAX_TCP_CONNECTIONS));
    loop {
        let permit = connections
            .clone()
            .acquire_owned()
            .await
            .context("the connection limit closed")?;
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors and the like: wait a little rather than spin.
                tracing::warn!(error = %e, "accepting a DNS connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (dns, forwarder) = (dns.clone(), forwarder.clone());
        tokio::spawn(async move {
            if let Err(e) = tcp_connection(&dns, stream, &forwarder).await {
                tracing::debug!(%peer, error = %format!("{e:#}"), "DNS connection ended");
            }
            drop(permit);
        });
    }
}

/// Answers the queries of one TCP connection in order, until it closes or idles.
async fn tcp_connection(dns: &ClusterDns, mut stream: TcpStream, forwarder: &Forwarder) -> anyhow::Result<()> {
    let _ = stream.set_nodelay(true);
    let mut out = Vec::new();
    let mut frame = Vec::new();
    loop {
        let mut len = [0u8; 2];
        match tokio::time::timeout(TCP_IDLE_TIMEOUT, stream.read_exact(&mut len)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Ok(Err(e)) => return Err(e).context("reading a query's length"),
            Err(_) => return Ok(()),
        }
        let mut packet = vec![0u8; usize::from(u16::from_be_bytes(len))];
        tokio::time::timeout(TCP_IDLE_TIMEOUT, stream.read_exact(&mut packet))
            .await
            .context("reading a query timed out")?
            .context("reading a query")?;
        let send = match dns.handle(&packet, Transport::Tcp, &mut out) {
            Handled::Reply => true,
            Handled::Drop => false,
            Handled::Upstream(job) => forwarder.answer(dns, *job, &mut out).await,
        };
        if !send {
            continue;
        }
        let Ok(len) = u16::try_from(out.len()) else {
            continue;
        };
        frame.clear();
        frame.extend_from_slice(&len.to_be_bytes());
        frame.extend_from_slice(&out);
        tokio::time::timeout(TCP_IDLE_TIMEOUT, stream.write_all(&frame))
            .await
            .context("writing a reply timed out")?
            .context("writing a reply")?;
    }
}

// ---------------------------------------------------------------------------------------------
// Feeding the index.

/// The kinds of objects [`run`] watches, and how each goes into the index.
trait Fed:
    kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static
{
    const KIND: &'static str;
    fn apply(dns: &ClusterDns, obj: &Self);
    fn delete(dns: &ClusterDns, obj: &Self);
    fn replace(dns: &ClusterDns, objs: &[Self]);
}

fn meta_key<K: kube::Resource>(obj: &K) -> (&str, &str) {
    let meta = obj.meta();
    (
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref().unwrap_or_default(),
    )
}

impl Fed for Service {
    const KIND: &'static str = "Service";
    fn apply(dns: &ClusterDns, obj: &Self) {
        dns.apply_service(obj);
    }
    fn delete(dns: &ClusterDns, obj: &Self) {
        let (ns, name) = meta_key(obj);
        dns.delete_service(ns, name);
    }
    fn replace(dns: &ClusterDns, objs: &[Self]) {
        dns.replace_services(objs);
    }
}

impl Fed for EndpointSlice {
    const KIND: &'static str = "EndpointSlice";
    fn apply(dns: &ClusterDns, obj: &Self) {
        dns.apply_endpoint_slice(obj);
    }
    fn delete(dns: &ClusterDns, obj: &Self) {
        let (ns, name) = meta_key(obj);
        dns.delete_endpoint_slice(ns, name);
    }
    fn replace(dns: &ClusterDns, objs: &[Self]) {
        dns.replace_endpoint_slices(objs);
    }
}

impl Fed for Namespace {
    const KIND: &'static str = "Namespace";
    fn apply(dns: &ClusterDns, obj: &Self) {
        dns.apply_namespace(obj);
    }
    fn delete(dns: &ClusterDns, obj: &Self) {
        if let Some(name) = obj.metadata.name.as_deref() {
            dns.delete_namespace(name);
        }
    }
    fn replace(dns: &ClusterDns, objs: &[Self]) {
        dns.replace_namespaces(objs);
    }
}

/// Keeps the index in step with one watch. A (re)list is buffered and replaces that kind whole at
/// its end, so objects deleted while the watch was down disappear.
async fn feed<K: Fed>(api: Api<K>, dns: Arc<ClusterDns>, unsynced: Arc<AtomicUsize>) {
    let mut stream = watcher(api, watcher::Config::default()).default_backoff().boxed();
    let mut relist: Option<Vec<K>> = None;
    let mut synced = false;
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Init) => relist = Some(Vec::new()),
            Ok(watcher::Event::InitApply(obj)) => match &mut relist {
                Some(objs) => objs.push(obj),
                None => K::apply(&dns, &obj),
            },
            Ok(watcher::Event::InitDone) => {
                let objs = relist.take().unwrap_or_default();
                tracing::debug!(kind = K::KIND, count = objs.len(), "cluster DNS listed");
                K::replace(&dns, &objs);
                if !synced {
                    synced = true;
                    if unsynced.fetch_sub(1, Ordering::AcqRel) == 1 {
                        tracing::info!("cluster DNS has synced");
                        dns.mark_synced();
                    }
                }
            }
            Ok(watcher::Event::Apply(obj)) => K::apply(&dns, &obj),
            Ok(watcher::Event::Delete(obj)) => K::delete(&dns, &obj),
            Err(e) => tracing::warn!(kind = K::KIND, error = %e, "cluster DNS watch failed; retrying"),
        }
    }
}

/// Feeds `dns` from watches on Services, EndpointSlices and Namespaces in all namespaces, and marks
/// it synced once all three have listed. Runs until the watches end (they normally never do).
pub async fn run(client: kube::Client, dns: Arc<ClusterDns>) {
    let unsynced = Arc::new(AtomicUsize::new(3));
    tokio::join!(
        feed(Api::<Service>::all(client.clone()), dns.clone(), unsynced.clone()),
        feed(Api::<EndpointSlice>::all(client.clone()), dns.clone(), unsynced.clone()),
        feed(Api::<Namespace>::all(client), dns, unsynced),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn service(value: serde_json::Value) -> Service {
        serde_json::from_value(value).expect("a Service")
    }

    fn slice(value: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(value).expect("an EndpointSlice")
    }

    fn cluster_ip(ns: &str, name: &str, ips: &[&str], ports: serde_json::Value) -> Service {
        service(json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"type": "ClusterIP", "clusterIP": ips[0], "clusterIPs": ips, "ports": ports}
        }))
    }

    #[test]
    fn explain_service_shows_what_pods_get() {
        let nginx = service(json!({
            "metadata": {"name": "nginx", "namespace": "default"},
            "spec": {"clusterIP": "None", "clusterIPs": ["None"], "ports": [{"name": "web", "port": 80}]}
        }));
        let slices = [slice(json!({
            "metadata": {"name": "nginx-abc", "namespace": "default",
                         "labels": {"kubernetes.io/service-name": "nginx"}},
            "addressType": "IPv4",
            "ports": [{"name": "web", "port": 80, "protocol": "TCP"}],
            "endpoints": [{"addresses": ["10.244.0.5"], "hostname": "web-0", "conditions": {"ready": true}}]
        }))];
        let text = explain_service(&nginx, &slices, "cluster.local");
        assert!(
            text.contains(
                "    nginx.default.svc.cluster.local A:\n      nginx.default.svc.cluster.local. A 10.244.0.5"
            ),
            "{text}"
        );
        assert!(text.contains("    web-0.nginx.default.svc.cluster.local A:\n      web-0.nginx.default.svc.cluster.local. A 10.244.0.5"), "{text}");
        assert!(text.contains("_web._tcp.nginx.default.svc.cluster.local SRV:\n      _web._tcp.nginx.default.svc.cluster.local. SRV 0 100 80 web-0.nginx.default.svc.cluster.local."), "{text}");
        // Without ready endpoints a headless name has no records.
        let text = explain_service(&nginx, &[], "cluster.local");
        assert!(
            text.contains("nginx.default.svc.cluster.local A: NXDOMAIN")
                || text.contains("nginx.default.svc.cluster.local A: NOERROR"),
            "{text}"
        );
        assert_eq!(fixture().lookup("example.test", RecordType::A), None);
    }

    /// A cluster: `web` (ClusterIP, dual-stack, ports http/80 and dns/53 UDP), `nginx` (headless,
    /// StatefulSet endpoints web-0, web-1, and one without hostname, one not ready), `db`
    /// (ExternalName outside), `alias` (ExternalName to web), namespace `empty`.
    fn fixture() -> Arc<ClusterDns> {
        let dns = ClusterDns::new("cluster.local");
        dns.apply_service(&cluster_ip(
            "default",
            "web",
            &["10.96.0.20", "fd00:10:96::20"],
            json!([{"name": "http", "port": 80, "protocol": "TCP"}, {"name": "dns", "port": 53, "protocol": "UDP"}]),
        ));
        dns.apply_service(&service(json!({
            "metadata": {"name": "nginx", "namespace": "default"},
            "spec": {"clusterIP": "None", "clusterIPs": ["None"], "ports": [{"name": "web", "port": 80}]}
        })));
        dns.apply_endpoint_slice(&slice(json!({
            "metadata": {"name": "nginx-abc", "namespace": "default",
                         "labels": {"kubernetes.io/service-name": "nginx"}},
            "addressType": "IPv4",
            "ports": [{"name": "web", "port": 80, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": ["10.244.0.5"], "hostname": "web-0", "conditions": {"ready": true}},
                {"addresses": ["10.244.0.6"], "hostname": "web-1"},
                {"addresses": ["10.244.0.7"], "conditions": {"ready": true}},
                {"addresses": ["10.244.0.8"], "hostname": "web-3", "conditions": {"ready": false}}
            ]
        })));
        dns.apply_service(&service(json!({
            "metadata": {"name": "db", "namespace": "default"},
            "spec": {"type": "ExternalName", "externalName": "db.example.test"}
        })));
        dns.apply_service(&service(json!({
            "metadata": {"name": "alias", "namespace": "default"},
            "spec": {"type": "ExternalName", "externalName": "web.default.svc.cluster.local"}
        })));
        dns.apply_namespace(&serde_json::from_value(json!({"metadata": {"name": "empty"}})).expect("a Namespace"));
        dns.mark_synced();
        dns
    }

    fn query_packet(name: &str, qtype: RecordType, edns: Option<u16>) -> Vec<u8> {
        let mut msg = Message::query();
        msg.metadata.recursion_desired = true;
        msg.add_query(Query::query(Name::from_ascii(name).expect("a name"), qtype));
        if let Some(size) = edns {
            let mut e = Edns::new();
            e.set_max_payload(size);
            msg.edns = Some(e);
        }
        msg.to_vec().expect("encoding a query")
    }

    /// The local reply to a query over `transport`; panics when the query would be forwarded.
    fn ask_over(dns: &ClusterDns, name: &str, qtype: RecordType, transport: Transport, edns: Option<u16>) -> Message {
        let packet = query_packet(name, qtype, edns);
        let mut out = Vec::new();
        match dns.handle(&packet, transport, &mut out) {
            Handled::Reply => {
                let reply = Message::from_vec(&out).expect("a parsable reply");
                assert_eq!(reply.metadata.id, u16::from_be_bytes([packet[0], packet[1]]));
                reply
            }
            Handled::Drop => panic!("{name} {qtype}: dropped"),
            Handled::Upstream(_) => panic!("{name} {qtype}: sent upstream"),
        }
    }

    fn ask(dns: &ClusterDns, name: &str, qtype: RecordType) -> Message {
        ask_over(dns, name, qtype, Transport::Udp, None)
    }

    fn goes_upstream(dns: &ClusterDns, name: &str, qtype: RecordType) -> Option<Box<UpstreamJob>> {
        let mut out = Vec::new();
        match dns.handle(&query_packet(name, qtype, None), Transport::Udp, &mut out) {
            Handled::Upstream(job) => Some(job),
            _ => None,
        }
    }

    fn rdata(records: &[Record]) -> Vec<String> {
        records.iter().map(|r| r.data.to_string()).collect()
    }

    fn assert_negative(reply: &Message, rcode: ResponseCode, zone: &str) {
        assert_eq!(reply.metadata.response_code, rcode, "{reply}");
        assert!(reply.answers.is_empty(), "{reply}");
        assert!(reply.metadata.authoritative);
        assert_eq!(reply.authorities.len(), 1, "{reply}");
        let soa = &reply.authorities[0];
        assert_eq!(soa.name.to_ascii(), zone);
        let RData::SOA(soa_data) = &soa.data else {
            panic!("not a SOA: {soa}");
        };
        assert_eq!(soa_data.mname.to_ascii(), format!("ns.dns.{zone}"));
        assert_eq!(soa_data.rname.to_ascii(), format!("hostmaster.{zone}"));
        assert_eq!(soa_data.minimum, 5);
        assert_eq!(soa.ttl, 5);
    }

    #[test]
    fn cluster_ip_services_answer_their_addresses() {
        let dns = fixture();
        let reply = ask(&dns, "web.default.svc.cluster.local.", RecordType::A);
        assert_eq!(reply.metadata.response_code, ResponseCode::NoError);
        assert!(reply.metadata.authoritative);
        assert_eq!(rdata(&reply.answers), ["10.96.0.20"]);
        assert_eq!(reply.answers[0].ttl, 5);
        assert_eq!(reply.answers[0].name.to_ascii(), "web.default.svc.cluster.local.");
        let reply = ask(&dns, "web.default.svc.cluster.local.", RecordType::AAAA);
        assert_eq!(rdata(&reply.answers), ["fd00:10:96::20"]);
        // Case is kept in the answer, ignored in the lookup.
        let reply = ask(&dns, "WEB.Default.svc.Cluster.Local.", RecordType::A);
        assert_eq!(rdata(&reply.answers), ["10.96.0.20"]);
        assert_eq!(reply.answers[0].name.to_ascii(), "WEB.Default.svc.Cluster.Local.");
    }

    #[test]
    fn missing_names_are_nxdomain_and_empty_ones_nodata() {
        let dns = fixture();
        let v4_only = ClusterDns::new("cluster.local.");
        v4_only.apply_service(&cluster_ip(
            "default",
            "api",
            &["10.96.0.1"],
            json!([{"name": "https", "port": 443}]),
        ));
        v4_only.mark_synced();
        assert_negative(
            &ask(&v4_only, "api.default.svc.cluster.local.", RecordType::AAAA),
            ResponseCode::NoError,
            "cluster.local.",
        );
        for name in [
            "nope.default.svc.cluster.local.",
            "web.nowhere.svc.cluster.local.",
            "nowhere.svc.cluster.local.",
            "web.default.foo.cluster.local.",
            "a.b.c.web.default.svc.cluster.local.",
            "_http._udp.web.default.svc.cluster.local.",
        ] {
            assert_negative(
                &ask(&dns, name, RecordType::A),
                ResponseCode::NXDomain,
                "cluster.local.",
            );
        }
        for name in [
            "default.svc.cluster.local.",
            "empty.svc.cluster.local.",
            "svc.cluster.local.",
            "pod.cluster.local.",
            "cluster.local.",
        ] {
            assert_negative(&ask(&dns, name, RecordType::A), ResponseCode::NoError, "cluster.local.");
        }
        // Other types: NODATA where the name exists.
        assert_negative(
            &ask(&dns, "web.default.svc.cluster.local.", RecordType::MX),
            ResponseCode::NoError,
            "cluster.local.",
        );
        assert_negative(
            &ask(&dns, "nope.default.svc.cluster.local.", RecordType::MX),
            ResponseCode::NXDomain,
            "cluster.local.",
        );
        assert_negative(
            &ask(&dns, "web.default.svc.cluster.local.", RecordType::TXT),
            ResponseCode::NoError,
            "cluster.local.",
        );
        assert_negative(
            &ask(&dns, "nope.default.svc.cluster.local.", RecordType::TXT),
            ResponseCode::NXDomain,
            "cluster.local.",
        );
        assert_negative(
            &ask(&dns, "web.default.svc.cluster.local.", RecordType::CNAME),
            ResponseCode::NoError,
            "cluster.local.",
        );
    }

    #[test]
    fn unsynced_index_answers_servfail_for_missing_names() {
        let dns = ClusterDns::new("cluster.local");
        dns.apply_service(&cluster_ip("default", "web", &["10.96.0.20"], json!([])));
        assert_negative(
            &ask(&dns, "nope.default.svc.cluster.local.", RecordType::A),
            ResponseCode::ServFail,
            "cluster.local.",
        );
        assert_eq!(
            rdata(&ask(&dns, "web.default.svc.cluster.local.", RecordType::A).answers),
            ["10.96.0.20"]
        );
        dns.mark_synced();
        assert_negative(
            &ask(&dns, "nope.default.svc.cluster.local.", RecordType::A),
            ResponseCode::NXDomain,
            "cluster.local.",
        );
    }

    #[test]
    fn headless_services_answer_ready_endpoints() {
        let dns = fixture();
        let reply = ask(&dns, "nginx.default.svc.cluster.local.", RecordType::A);
        assert_eq!(rdata(&reply.answers), ["10.244.0.5", "10.244.0.6", "10.244.0.7"]);
        // StatefulSet pods by hostname, others by dashed address.
        let reply = ask(&dns, "web-0.nginx.default.svc.cluster.local.", RecordType::A);
        assert_eq!(rdata(&reply.answers), ["10.244.0.5"]);
        let reply = ask(&dns, "10-244-0-7.nginx.default.svc.cluster.local.", RecordType::A);
        assert_eq!(rdata(&reply.answers), ["10.244.0.7"]);
        // Not ready: not there.
        assert_negative(
            &ask(&dns, "web-3.nginx.default.svc.cluster.local.", RecordType::A),
            ResponseCode::NXDomain,
            "cluster.local.",
        );
        // An endpoint name works for ClusterIP Services too, as in CoreDNS.
        dns.apply_endpoint_slice(&slice(json!({
            "metadata": {"name": "web-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080}],
            "endpoints": [{"addresses": ["10.244.1.9"]}]
        })));
        let reply = ask(&dns, "10-244-1-9.web.default.svc.cluster.local.", RecordType::A);
        assert_eq!(rdata(&reply.answers), ["10.244.1.9"]);
        // A headless Service without endpoints is NXDOMAIN (CoreDNS finds no record for it).
        dns.apply_service(&service(json!({
            "metadata": {"name": "lonely", "namespace": "default"},
            "spec": {"clusterIP": "None"}
        })));
        assert_negative(
            &ask(&dns, "lonely.default.svc.cluster.local.", RecordType::A),
            ResponseCode::NXDomain,
            "cluster.local.",
        );
    }

    #[test]
    fn publish_not_ready_addresses_includes_every_endpoint() {
        let dns = fixture();
        dns.apply_service(&service(json!({
            "metadata": {"name": "nginx", "namespace": "default"},
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": true, "ports": [{"name": "web", "port": 80}]}
        })));
        let reply = ask(&dns, "nginx.default.svc.cluster.local.", RecordType::A);
        assert_eq!(
            rdata(&reply.answers),
            ["10.244.0.5", "10.244.0.6", "10.244.0.7", "10.244.0.8"]
        );
        let reply = ask(&dns, "web-3.nginx.default.svc.cluster.local.", RecordType::A);
        assert_eq!(rdata(&reply.answers), ["10.244.0.8"]);
    }

    #[test]
    fn srv_records_name_the_service_or_each_endpoint() {
        let dns = fixture();
        let reply = ask(&dns, "_http._tcp.web.default.svc.cluster.local.", RecordType::SRV);
        // Two ClusterIPs (dual-stack) are two records of CoreDNS's, one SRV after dedup: weight 50.
        assert_eq!(rdata(&reply.answers), ["0 50 80 web.default.svc.cluster.local."]);
        assert_eq!(rdata(&reply.additionals), ["10.96.0.20", "fd00:10:96::20"]);
        assert!(
            reply
                .additionals
                .iter()
                .all(|r| r.name.to_ascii() == "web.default.svc.cluster.local.")
        );
        let reply = ask(&dns, "_dns._udp.web.default.svc.cluster.local.", RecordType::SRV);
        assert_eq!(rdata(&reply.answers), ["0 50 53 web.default.svc.cluster.local."]);
        // Every port without a port name.
        let reply = ask(&dns, "web.default.svc.cluster.local.", RecordType::SRV);
        assert_eq!(reply.answers.len(), 2);

        let reply = ask(&dns, "_web._tcp.nginx.default.svc.cluster.local.", RecordType::SRV);
        assert_eq!(
            rdata(&reply.answers),
            [
                "0 33 80 web-0.nginx.default.svc.cluster.local.",
                "0 33 80 web-1.nginx.default.svc.cluster.local.",
                "0 33 80 10-244-0-7.nginx.default.svc.cluster.local.",
            ]
        );
        let extra: Vec<String> = reply
            .additionals
            .iter()
            .map(|r| format!("{} {}", r.name, r.data))
            .collect();
        assert_eq!(
            extra,
            [
                "web-0.nginx.default.svc.cluster.local. 10.244.0.5",
                "web-1.nginx.default.svc.cluster.local. 10.244.0.6",
                "10-244-0-7.nginx.default.svc.cluster.local. 10.244.0.7",
            ]
        );
        // ExternalName Services have no SRV records; a missing port name is NXDOMAIN.
        assert_negative(
            &ask(&dns, "db.default.svc.cluster.local.", RecordType::SRV),
            ResponseCode::NoError,
            "cluster.local.",
        );
        assert_negative(
            &ask(&dns, "_nope._tcp.web.default.svc.cluster.local.", RecordType::SRV),
            ResponseCode::NXDomain,
            "cluster.local.",
        );
    }

    #[test]
    fn external_name_services_are_cnames() {
        let dns = fixture();
        let reply = ask(&dns, "db.default.svc.cluster.local.", RecordType::CNAME);
        assert_eq!(rdata(&reply.answers), ["db.example.test."]);
        // The target's addresses come from the upstreams, after the CNAME.
        let job = goes_upstream(&dns, "db.default.svc.cluster.local.", RecordType::A).expect("an upstream job");
        let UpstreamKind::Chase { chain, target, qtype } = &job.kind else {
            panic!("not a chase");
        };
        assert_eq!(rdata(chain), ["db.example.test."]);
        assert_eq!(target.to_ascii(), "db.example.test.");
        assert_eq!(*qtype, RecordType::A);
        // A target inside the cluster is followed locally.
        let reply = ask(&dns, "alias.default.svc.cluster.local.", RecordType::A);
        assert_eq!(rdata(&reply.answers), ["web.default.svc.cluster.local.", "10.96.0.20"]);
        // Port names do not apply to ExternalName Services.
        assert_negative(
            &ask(&dns, "_http._tcp.db.default.svc.cluster.local.", RecordType::A),
            ResponseCode::NXDomain,
            "cluster.local.",
        );
        // A loop ends.
        dns.apply_service(&service(json!({
            "metadata": {"name": "loop", "namespace": "default"},
            "spec": {"type": "ExternalName", "externalName": "loop.default.svc.cluster.local"}
        })));
        assert_negative(
            &ask(&dns, "loop.default.svc.cluster.local.", RecordType::A),
            ResponseCode::NoError,
            "cluster.local.",
        );
    }

    #[test]
    fn reverse_names_of_cluster_ips_and_endpoints_are_answered() {
        let dns = fixture();
        let reply = ask(&dns, "20.0.96.10.in-addr.arpa.", RecordType::PTR);
        assert_eq!(rdata(&reply.answers), ["web.default.svc.cluster.local."]);
        assert!(reply.metadata.authoritative);
        let reply = ask(&dns, "5.0.244.10.in-addr.arpa.", RecordType::PTR);
        assert_eq!(rdata(&reply.answers), ["web-0.nginx.default.svc.cluster.local."]);
        let reply = ask(&dns, "7.0.244.10.in-addr.arpa.", RecordType::PTR);
        assert_eq!(rdata(&reply.answers), ["10-244-0-7.nginx.default.svc.cluster.local."]);
        let v6: String = "fd00:0010:0096:0000:0000:0000:0000:0020"
            .chars()
            .filter(|c| *c != ':')
            .rev()
            .map(|c| format!("{c}."))
            .collect();
        let reply = ask(&dns, &format!("{v6}ip6.arpa."), RecordType::PTR);
        assert_eq!(rdata(&reply.answers), ["web.default.svc.cluster.local."]);
        // Unknown addresses, partial names and other types fall through to the upstreams.
        assert!(goes_upstream(&dns, "8.8.8.8.in-addr.arpa.", RecordType::PTR).is_some());
        assert!(goes_upstream(&dns, "8.0.244.10.in-addr.arpa.", RecordType::PTR).is_some());
        assert!(goes_upstream(&dns, "10.in-addr.arpa.", RecordType::PTR).is_some());
        assert!(goes_upstream(&dns, "20.0.96.10.in-addr.arpa.", RecordType::A).is_some());
    }

    #[test]
    fn pod_names_resolve_to_their_address() {
        let dns = fixture();
        let reply = ask(&dns, "10-244-1-7.default.pod.cluster.local.", RecordType::A);
        assert_eq!(rdata(&reply.answers), ["10.244.1.7"]);
        let reply = ask(&dns, "fd00--7.empty.pod.cluster.local.", RecordType::AAAA);
        assert_eq!(rdata(&reply.answers), ["fd00::7"]);
        assert_negative(
            &ask(&dns, "fd00--7.empty.pod.cluster.local.", RecordType::A),
            ResponseCode::NoError,
            "cluster.local.",
        );
        assert_negative(
            &ask(&dns, "default.pod.cluster.local.", RecordType::A),
            ResponseCode::NoError,
            "cluster.local.",
        );
        assert_negative(
            &ask(&dns, "not-an-ip.default.pod.cluster.local.", RecordType::A),
            ResponseCode::NXDomain,
            "cluster.local.",
        );
        assert_negative(
            &ask(&dns, "10-244-1-7.nowhere.pod.cluster.local.", RecordType::A),
            ResponseCode::NXDomain,
            "cluster.local.",
        );
    }

    #[test]
    fn deleted_and_relisted_objects_disappear() {
        let dns = fixture();
        dns.delete_endpoint_slice("default", "nginx-abc");
        assert_negative(
            &ask(&dns, "nginx.default.svc.cluster.local.", RecordType::A),
            ResponseCode::NXDomain,
            "cluster.local.",
        );
        assert_negative(
            &ask(&dns, "web-0.nginx.default.svc.cluster.local.", RecordType::A),
            ResponseCode::NXDomain,
            "cluster.local.",
        );
        assert!(goes_upstream(&dns, "5.0.244.10.in-addr.arpa.", RecordType::PTR).is_some());

        // A relist without `web` removes it and its reverse name; `nginx` stays.
        let nginx = service(json!({
            "metadata": {"name": "nginx", "namespace": "default"},
            "spec": {"clusterIP": "None"}
        }));
        dns.replace_services(&[nginx]);
        assert_negative(
            &ask(&dns, "web.default.svc.cluster.local.", RecordType::A),
            ResponseCode::NXDomain,
            "cluster.local.",
        );
        assert!(goes_upstream(&dns, "20.0.96.10.in-addr.arpa.", RecordType::PTR).is_some());
        dns.replace_endpoint_slices(&[slice(json!({
            "metadata": {"name": "nginx-new", "namespace": "default", "labels": {"kubernetes.io/service-name": "nginx"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.244.0.9"]}]
        }))]);
        assert_eq!(
            rdata(&ask(&dns, "nginx.default.svc.cluster.local.", RecordType::A).answers),
            ["10.244.0.9"]
        );
        // A slice moved to another Service leaves the first.
        dns.apply_endpoint_slice(&slice(json!({
            "metadata": {"name": "nginx-new", "namespace": "default", "labels": {"kubernetes.io/service-name": "other"}},
            "endpoints": [{"addresses": ["10.244.0.9"]}]
        })));
        assert_negative(
            &ask(&dns, "nginx.default.svc.cluster.local.", RecordType::A),
            ResponseCode::NXDomain,
            "cluster.local.",
        );
        // A namespace whose last object goes, and whose Namespace is gone, stops existing.
        dns.replace_namespaces(&[]);
        dns.delete_service("default", "nginx");
        dns.delete_endpoint_slice("default", "nginx-new");
        dns.delete_service("default", "db");
        dns.delete_service("default", "alias");
        assert_negative(
            &ask(&dns, "default.svc.cluster.local.", RecordType::A),
            ResponseCode::NXDomain,
            "cluster.local.",
        );
        assert_negative(
            &ask(&dns, "empty.svc.cluster.local.", RecordType::A),
            ResponseCode::NXDomain,
            "cluster.local.",
        );
        assert!(dns.index.read().namespaces.is_empty());
        assert!(dns.index.read().reverse_endpoints.is_empty());
        assert!(dns.index.read().reverse_services.is_empty());
    }

    #[test]
    fn zone_apex_soa_ns_and_schema_version() {
        let dns = fixture();
        let reply = ask(&dns, "cluster.local.", RecordType::SOA);
        assert_eq!(reply.answers.len(), 1);
        assert!(matches!(reply.answers[0].data, RData::SOA(_)));
        // No NS addresses until the server is bound to one.
        assert_negative(
            &ask(&dns, "cluster.local.", RecordType::NS),
            ResponseCode::NoError,
            "cluster.local.",
        );
        dns.ns_addrs.write().push("10.96.0.10".parse().expect("an address"));
        let reply = ask(&dns, "cluster.local.", RecordType::NS);
        assert_eq!(rdata(&reply.answers), ["ns.dns.cluster.local."]);
        assert_eq!(rdata(&reply.additionals), ["10.96.0.10"]);
        assert_eq!(
            rdata(&ask(&dns, "ns.dns.cluster.local.", RecordType::A).answers),
            ["10.96.0.10"]
        );
        let reply = ask(&dns, "dns-version.cluster.local.", RecordType::TXT);
        assert_eq!(rdata(&reply.answers), ["1.1.0"]);
        let reply = ask(&dns, "in-addr.arpa.", RecordType::SOA);
        assert_eq!(reply.answers[0].name.to_ascii(), "in-addr.arpa.");
        let reply = ask(&dns, "cluster.local.", RecordType::AXFR);
        assert_eq!(reply.metadata.response_code, ResponseCode::Refused);
    }

    #[test]
    fn other_names_are_forwarded_and_bad_packets_refused() {
        let dns = fixture();
        let job = goes_upstream(&dns, "example.test.", RecordType::A).expect("forwarded");
        assert!(matches!(job.kind, UpstreamKind::Forward));
        assert!(goes_upstream(&dns, "local.", RecordType::A).is_some());
        assert!(goes_upstream(&dns, "xcluster.local.", RecordType::A).is_some());

        let mut out = Vec::new();
        // Garbage after a header: FORMERR with the id.
        let mut packet = vec![0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0xff];
        assert!(matches!(dns.handle(&packet, Transport::Udp, &mut out), Handled::Reply));
        let reply = Message::from_vec(&out).expect("a reply");
        assert_eq!(reply.metadata.id, 0xabcd);
        assert_eq!(reply.metadata.response_code, ResponseCode::FormErr);
        // Less than a header, or a response: nothing.
        assert!(matches!(
            dns.handle(&packet[..5], Transport::Udp, &mut out),
            Handled::Drop
        ));
        packet[2] |= 0x80;
        assert!(matches!(dns.handle(&packet, Transport::Udp, &mut out), Handled::Drop));
        assert!(matches!(dns.handle(&[], Transport::Udp, &mut out), Handled::Drop));
        // No question: FORMERR.
        let mut msg = Message::query();
        msg.metadata.id = 7;
        assert!(matches!(
            dns.handle(&msg.to_vec().expect("encoding"), Transport::Udp, &mut out),
            Handled::Reply
        ));
        assert_eq!(
            Message::from_vec(&out).expect("a reply").metadata.response_code,
            ResponseCode::FormErr
        );
        // Random bytes never panic.
        for seed in 0u32..2000 {
            let len = (seed % 64) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|i| (seed.wrapping_mul(2654435761).wrapping_add(i as u32 * 40503) >> 7) as u8)
                .collect();
            let _ = dns.handle(&bytes, Transport::Udp, &mut out);
        }
    }

    #[test]
    fn large_answers_are_truncated_over_udp_only() {
        let dns = fixture();
        let endpoints: Vec<serde_json::Value> = (0..100)
            .map(|i| json!({"addresses": [format!("10.245.{}.{}", i / 200, i % 200 + 1)]}))
            .collect();
        dns.apply_service(&service(json!({
            "metadata": {"name": "big", "namespace": "default"},
            "spec": {"clusterIP": "None", "ports": [{"name": "p", "port": 1}]}
        })));
        dns.apply_endpoint_slice(&slice(json!({
            "metadata": {"name": "big-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "big"}},
            "ports": [{"name": "p", "port": 1}],
            "endpoints": endpoints
        })));
        let udp = ask(&dns, "big.default.svc.cluster.local.", RecordType::A);
        assert!(udp.metadata.truncation);
        assert!(!udp.answers.is_empty() && udp.answers.len() < 100);
        let edns = ask_over(
            &dns,
            "big.default.svc.cluster.local.",
            RecordType::A,
            Transport::Udp,
            Some(4096),
        );
        assert!(!edns.metadata.truncation);
        assert_eq!(edns.answers.len(), 100);
        assert!(edns.edns.is_some());
        let tcp = ask_over(
            &dns,
            "big.default.svc.cluster.local.",
            RecordType::A,
            Transport::Tcp,
            None,
        );
        assert!(!tcp.metadata.truncation);
        assert_eq!(tcp.answers.len(), 100);
        // SRV over UDP: the additional section goes first, without TC while the answers fit
        // (60 uncompressed targets fit in 4096 bytes, their addresses do not as well)...
        let endpoints: Vec<serde_json::Value> = (0..60)
            .map(|i| json!({"addresses": [format!("10.246.0.{}", i + 1)]}))
            .collect();
        dns.apply_service(&service(json!({
            "metadata": {"name": "mid", "namespace": "default"},
            "spec": {"clusterIP": "None", "ports": [{"name": "p", "port": 1}]}
        })));
        dns.apply_endpoint_slice(&slice(json!({
            "metadata": {"name": "mid-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "mid"}},
            "ports": [{"name": "p", "port": 1}],
            "endpoints": endpoints
        })));
        let srv = ask_over(
            &dns,
            "_p._tcp.mid.default.svc.cluster.local.",
            RecordType::SRV,
            Transport::Udp,
            Some(4096),
        );
        assert_eq!(srv.answers.len(), 60);
        assert!(srv.additionals.is_empty());
        assert!(!srv.metadata.truncation);
        // ... then the answers that fit, with TC; over TCP everything.
        let srv = ask_over(
            &dns,
            "_p._tcp.big.default.svc.cluster.local.",
            RecordType::SRV,
            Transport::Udp,
            Some(4096),
        );
        assert!(srv.metadata.truncation);
        assert!(srv.answers.len() < 100);
        let srv = ask_over(
            &dns,
            "_p._tcp.big.default.svc.cluster.local.",
            RecordType::SRV,
            Transport::Tcp,
            None,
        );
        assert_eq!((srv.answers.len(), srv.additionals.len()), (100, 100));
    }

    #[test]
    fn parse_request_splits_names_as_coredns() {
        assert_eq!(
            parse_request(&["_http", "_tcp", "web", "default", "svc"]),
            Ok(RecordRequest {
                port: "http",
                protocol: "tcp",
                service: "web",
                namespace: "default",
                pod_or_svc: "svc",
                ..Default::default()
            })
        );
        assert_eq!(
            parse_request(&["web-0", "nginx", "default", "svc"]).map(|r| r.endpoint),
            Ok("web-0")
        );
        assert_eq!(parse_request(&["svc"]), Ok(RecordRequest::default()));
        assert_eq!(parse_request(&["x", "dns"]), Err(NameError));
        assert_eq!(parse_request(&["a", "b", "c", "d", "e", "svc"]), Err(NameError));
    }

    #[test]
    fn resolv_conf_nameservers_become_upstreams() {
        let text = "# comment\nsearch example.test\nnameserver 10.0.0.2\nnameserver 127.0.0.53 # local\n\
                    nameserver fe80::1%2\nnameserver fe80::2%eth0\nnameserver 2001:db8::1\nnameserver 10.0.0.2\n\
                    nameserver bogus\noptions edns0\n";
        let upstreams = upstreams_from_resolv_conf(text);
        assert_eq!(
            upstreams,
            vec![
                "10.0.0.2:53".parse::<SocketAddr>().expect("an address"),
                "127.0.0.53:53".parse().expect("an address"),
                SocketAddr::V6(std::net::SocketAddrV6::new(
                    "fe80::1".parse().expect("an address"),
                    53,
                    0,
                    2
                )),
                "[2001:db8::1]:53".parse().expect("an address"),
            ]
        );
        assert!(upstreams_from_resolv_conf("").is_empty());
    }

    // --- over the network (127.0.0.1 only) ---------------------------------------------------

    /// An upstream stub on 127.0.0.1 (UDP and TCP, one port): `example.test` A 192.0.2.1,
    /// `db.example.test` A 192.0.2.7, `big.test` TXT truncated over UDP and whole over TCP,
    /// NXDOMAIN otherwise.
    async fn start_stub() -> SocketAddr {
        let (udp, tcp) = bind_pair().await;
        let addr = udp.local_addr().expect("an address");
        fn answer(packet: &[u8], tcp: bool) -> Option<Vec<u8>> {
            let request = Message::from_vec(packet).ok()?;
            let query = request.queries.first()?.clone();
            let mut reply = Message::response(request.metadata.id, OpCode::Query);
            reply.metadata.recursion_available = true;
            reply.queries.push(query.clone());
            let name = query.name().to_ascii();
            match name.as_str() {
                "example.test." => reply.answers.push(Record::from_rdata(
                    query.name().clone(),
                    60,
                    RData::A(A(Ipv4Addr::new(192, 0, 2, 1))),
                )),
                "db.example.test." => reply.answers.push(Record::from_rdata(
                    query.name().clone(),
                    60,
                    RData::A(A(Ipv4Addr::new(192, 0, 2, 7))),
                )),
                "big.test." if !tcp => reply.metadata.truncation = true,
                "big.test." => reply.answers.push(Record::from_rdata(
                    query.name().clone(),
                    60,
                    RData::TXT(TXT::new(vec!["x".repeat(200); 5])),
                )),
                _ => reply.metadata.response_code = ResponseCode::NXDomain,
            }
            reply.to_vec().ok()
        }
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            while let Ok((n, peer)) = udp.recv_from(&mut buf).await {
                if let Some(reply) = answer(&buf[..n], false) {
                    let _ = udp.send_to(&reply, peer).await;
                }
            }
        });
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = tcp.accept().await {
                tokio::spawn(async move {
                    let mut len = [0u8; 2];
                    while stream.read_exact(&mut len).await.is_ok() {
                        let mut packet = vec![0u8; usize::from(u16::from_be_bytes(len))];
                        if stream.read_exact(&mut packet).await.is_err() {
                            return;
                        }
                        let Some(reply) = answer(&packet, true) else { return };
                        let mut frame = (reply.len() as u16).to_be_bytes().to_vec();
                        frame.extend_from_slice(&reply);
                        if stream.write_all(&frame).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    /// A UDP socket and a TCP listener on the same free 127.0.0.1 port.
    async fn bind_pair() -> (UdpSocket, TcpListener) {
        for _ in 0..50 {
            let udp = UdpSocket::bind("127.0.0.1:0").await.expect("binding UDP");
            let addr = udp.local_addr().expect("an address");
            if let Ok(tcp) = TcpListener::bind(addr).await {
                return (udp, tcp);
            }
        }
        panic!("no free port pair on 127.0.0.1");
    }

    async fn udp_query(server: SocketAddr, name: &str, qtype: RecordType) -> Message {
        let socket = UdpSocket::bind("127.0.0.1:0").await.expect("binding");
        let packet = query_packet(name, qtype, None);
        let mut buf = vec![0u8; 65535];
        for _ in 0..50 {
            socket.send_to(&packet, server).await.expect("sending");
            if let Ok(Ok((n, _))) = tokio::time::timeout(Duration::from_millis(200), socket.recv_from(&mut buf)).await {
                let reply = Message::from_vec(&buf[..n]).expect("a reply");
                assert_eq!(reply.metadata.id, u16::from_be_bytes([packet[0], packet[1]]));
                return reply;
            }
        }
        panic!("no UDP reply for {name}");
    }

    async fn tcp_queries(server: SocketAddr, queries: &[(&str, RecordType)]) -> Vec<Message> {
        let mut stream = TcpStream::connect(server).await.expect("connecting");
        let mut replies = Vec::new();
        for (name, qtype) in queries {
            let packet = query_packet(name, *qtype, None);
            let mut frame = (packet.len() as u16).to_be_bytes().to_vec();
            frame.extend_from_slice(&packet);
            stream.write_all(&frame).await.expect("writing");
            let mut len = [0u8; 2];
            stream.read_exact(&mut len).await.expect("reading a length");
            let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
            stream.read_exact(&mut buf).await.expect("reading a reply");
            replies.push(Message::from_vec(&buf).expect("a reply"));
        }
        replies
    }

    #[tokio::test]
    async fn serves_cluster_names_and_forwards_the_rest_over_udp_and_tcp() {
        let stub = start_stub().await;
        let dns = fixture();
        let port = {
            let (udp, tcp) = bind_pair().await;
            let port = udp.local_addr().expect("an address").port();
            drop((udp, tcp));
            port
        };
        let server = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let serving = tokio::spawn(serve(dns.clone(), server, vec![stub, server]));

        let reply = udp_query(server, "web.default.svc.cluster.local.", RecordType::A).await;
        assert_eq!(rdata(&reply.answers), ["10.96.0.20"]);
        assert!(reply.metadata.authoritative);
        let reply = udp_query(server, "example.test.", RecordType::A).await;
        assert_eq!(rdata(&reply.answers), ["192.0.2.1"]);
        assert!(reply.metadata.recursion_available);
        let reply = udp_query(server, "missing.test.", RecordType::A).await;
        assert_eq!(reply.metadata.response_code, ResponseCode::NXDomain);
        // A UDP client gets the upstream's truncated reply; over TCP the forwarder asks again over TCP.
        let reply = udp_query(server, "big.test.", RecordType::TXT).await;
        assert!(reply.metadata.truncation);
        // ExternalName: the CNAME, then the target's address from the upstream.
        let reply = udp_query(server, "db.default.svc.cluster.local.", RecordType::A).await;
        assert_eq!(rdata(&reply.answers), ["db.example.test.", "192.0.2.7"]);
        let reply = udp_query(server, "20.0.96.10.in-addr.arpa.", RecordType::PTR).await;
        assert_eq!(rdata(&reply.answers), ["web.default.svc.cluster.local."]);
        // The server's own address is its name server.
        let reply = udp_query(server, "ns.dns.cluster.local.", RecordType::A).await;
        assert_eq!(rdata(&reply.answers), ["127.0.0.1"]);

        let replies = tcp_queries(
            server,
            &[
                ("web-0.nginx.default.svc.cluster.local.", RecordType::A),
                ("example.test.", RecordType::A),
                ("big.test.", RecordType::TXT),
                ("nope.default.svc.cluster.local.", RecordType::A),
            ],
        )
        .await;
        assert_eq!(rdata(&replies[0].answers), ["10.244.0.5"]);
        assert_eq!(rdata(&replies[1].answers), ["192.0.2.1"]);
        assert!(!replies[2].metadata.truncation);
        assert_eq!(replies[2].answers.len(), 1);
        assert_eq!(replies[3].metadata.response_code, ResponseCode::NXDomain);
        assert!(!serving.is_finished());
        serving.abort();
    }

    #[tokio::test]
    async fn no_answering_upstream_is_servfail() {
        let dns = fixture();
        // An upstream that never answers.
        let silent = UdpSocket::bind("127.0.0.1:0").await.expect("binding");
        let (udp, tcp) = bind_pair().await;
        let server = udp.local_addr().expect("an address");
        let mut forwarder = Forwarder::new(vec![silent.local_addr().expect("an address")]);
        forwarder.try_timeout = Duration::from_millis(100);
        forwarder.deadline = Duration::from_millis(300);
        let serving = tokio::spawn(serve_on(dns, udp, tcp, forwarder));
        let reply = udp_query(server, "example.test.", RecordType::A).await;
        assert_eq!(reply.metadata.response_code, ResponseCode::ServFail);
        assert_eq!(reply.queries.len(), 1);
        // Cluster names still answer.
        let reply = udp_query(server, "web.default.svc.cluster.local.", RecordType::A).await;
        assert_eq!(rdata(&reply.answers), ["10.96.0.20"]);
        serving.abort();
    }
}
