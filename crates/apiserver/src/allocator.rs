//! ClusterIPs and NodePorts of Services, allocated in the same store transaction as the Service
//! write, as upstream's Service storage does (`pkg/registry/core/service/storage/alloc.go`):
//!
//! - a ClusterIP is an `networking.k8s.io/v1` IPAddress object named by the address, whose
//!   `parentRef` is the Service (upstream 1.33's IPAddress allocator); the Service write and the
//!   IPAddress create commit together or not at all, so two Services never hold one address and a
//!   failed write leaves no allocation behind;
//! - a NodePort is a key `/allocations/nodeports/PORT` holding its Service's name (upstream keeps a
//!   bitmap in one RangeAllocation object; a key per port lets concurrent writes not conflict);
//! - a static request is checked (in range, free) with upstream's 422 messages; a dynamic one is
//!   drawn at random, ClusterIPs above upstream's static band first;
//! - allocations are released in the transaction that deletes the Service or stops it needing them
//!   (a change to ExternalName, to ClusterIP for NodePorts); `clusterIP: None` never allocates.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use rand::Rng;
use serde_json::{Value, json};
use skiff_api::status::FieldErrorKind;
use skiff_api::{FieldError, StatusError};
use skiff_store::{Op, Store};

/// Where NodePort keys live: outside `/registry/`, so no list of a resource ever sees them.
const NODEPORT_PREFIX: &str = "/allocations/nodeports/";
/// Upstream's labels on the IPAddress objects its allocator creates.
const LABEL_IP_FAMILY: &str = "ipaddress.kubernetes.io/ip-family";
const LABEL_MANAGED_BY: &str = "ipaddress.kubernetes.io/managed-by";
const MANAGED_BY: &str = "ipallocator.k8s.io";

/// The Service ranges of the API server (`--service-cluster-ip-range`, `--service-node-port-range`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceRanges {
    /// The network address of the ClusterIP range.
    pub network: Ipv4Addr,
    pub prefix: u8,
    /// The NodePort range, inclusive.
    pub node_ports: (u16, u16),
}

impl Default for ServiceRanges {
    fn default() -> Self {
        ServiceRanges {
            network: Ipv4Addr::new(10, 96, 0, 0),
            prefix: 12,
            node_ports: (30000, 32767),
        }
    }
}

impl ServiceRanges {
    /// Parses upstream's flag values: `10.96.0.0/12` and `30000-32767`.
    pub fn parse(cidr: &str, node_ports: &str) -> anyhow::Result<Self> {
        let (ip, prefix) = cidr
            .split_once('/')
            .ok_or_else(|| anyhow::anyhow!("service cluster IP range {cidr:?} is not a CIDR"))?;
        let ip: Ipv4Addr = ip
            .parse()
            .map_err(|_| anyhow::anyhow!("service cluster IP range {cidr:?}: only IPv4 ranges are supported"))?;
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| (8..=30).contains(p))
            .ok_or_else(|| anyhow::anyhow!("service cluster IP range {cidr:?}: the prefix must be /8 to /30"))?;
        let mask = u32::MAX << (32 - prefix);
        let (low, high) = node_ports
            .split_once('-')
            .and_then(|(a, b)| Some((a.trim().parse::<u16>().ok()?, b.trim().parse::<u16>().ok()?)))
            .filter(|(a, b)| a <= b && *a > 0)
            .ok_or_else(|| anyhow::anyhow!("service node port range {node_ports:?} is not of the form 30000-32767"))?;
        Ok(ServiceRanges {
            network: Ipv4Addr::from(u32::from(ip) & mask),
            prefix,
            node_ports: (low, high),
        })
    }

    pub fn cidr(&self) -> String {
        format!("{}/{}", self.network, self.prefix)
    }

    /// The `n`th address of the range (1 is the `kubernetes` Service's, 10 is kube-dns's).
    pub fn nth(&self, n: u32) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.network) + n)
    }

    fn size(&self) -> u32 {
        1u32 << (32 - self.prefix)
    }

    /// Usable addresses are those between the network and the broadcast address.
    fn contains(&self, ip: Ipv4Addr) -> bool {
        let offset = u32::from(ip).wrapping_sub(u32::from(self.network));
        offset > 0 && offset < self.size() - 1
    }

    fn node_port_range(&self) -> String {
        format!("{}-{}", self.node_ports.0, self.node_ports.1)
    }
}

pub fn ip_key(ip: &str) -> String {
    format!("/registry/ipaddresses.networking.k8s.io/{ip}")
}

fn node_port_key(port: i64) -> String {
    format!("{NODEPORT_PREFIX}{port}")
}

fn spec(svc: &Value) -> Option<&serde_json::Map<String, Value>> {
    svc.get("spec").and_then(Value::as_object)
}

fn str_of<'a>(v: Option<&'a serde_json::Map<String, Value>>, k: &str) -> &'a str {
    v.and_then(|m| m.get(k)).and_then(Value::as_str).unwrap_or("")
}

/// The ClusterIPs a Service holds (none for headless and ExternalName Services).
fn held_ips(svc: &Value) -> Vec<String> {
    let s = spec(svc);
    if str_of(s, "type") == "ExternalName" {
        return Vec::new();
    }
    let mut ips: Vec<String> = s
        .and_then(|m| m.get("clusterIPs"))
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default();
    let single = str_of(s, "clusterIP");
    if ips.is_empty() && !single.is_empty() {
        ips.push(single.to_string());
    }
    ips.retain(|ip| !ip.is_empty() && ip != "None");
    ips
}

fn needs_node_ports(svc: &Value) -> bool {
    let s = spec(svc);
    match str_of(s, "type") {
        "NodePort" => true,
        "LoadBalancer" => s
            .and_then(|m| m.get("allocateLoadBalancerNodePorts"))
            .and_then(Value::as_bool)
            .unwrap_or(true),
        _ => false,
    }
}

fn needs_health_check_port(svc: &Value) -> bool {
    let s = spec(svc);
    str_of(s, "type") == "LoadBalancer" && str_of(s, "externalTrafficPolicy") == "Local"
}

/// The NodePorts a Service holds, the health check port included.
fn held_ports(svc: &Value) -> BTreeSet<i64> {
    let s = spec(svc);
    let mut out: BTreeSet<i64> = s
        .and_then(|m| m.get("ports"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|p| p.get("nodePort").and_then(Value::as_i64))
        .filter(|p| *p != 0)
        .collect();
    if let Some(p) = s.and_then(|m| m.get("healthCheckNodePort")).and_then(Value::as_i64)
        && p != 0
    {
        out.insert(p);
    }
    out
}

fn service_ref(svc: &Value) -> (String, String) {
    let md = svc.get("metadata");
    let get = |k| {
        md.and_then(|m| m.get(k))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    (get("namespace"), get("name"))
}

fn ip_address_object(ip: &str, svc: &Value) -> Value {
    let (namespace, name) = service_ref(svc);
    json!({
        "kind": "IPAddress",
        "apiVersion": "networking.k8s.io/v1",
        "metadata": {
            "name": ip,
            "uid": uuid::Uuid::new_v4().to_string(),
            "creationTimestamp": crate::objects::now_rfc3339(),
            "labels": {LABEL_IP_FAMILY: "IPv4", LABEL_MANAGED_BY: MANAGED_BY},
        },
        "spec": {"parentRef": {"group": "", "resource": "services", "namespace": namespace, "name": name}},
    })
}

fn invalid(svc: &Value, field: &str, rendered: String, detail: String) -> StatusError {
    let (_, name) = service_ref(svc);
    let err = FieldError {
        kind: FieldErrorKind::Invalid(rendered),
        field: field.to_string(),
        detail,
    };
    StatusError::invalid("", "Service", &name, &[err])
}

/// What allocating for a Service write adds to its transaction, and whether a conflict on it may
/// be retried with new random picks.
#[derive(Debug, Default)]
pub struct Allocation {
    pub ops: Vec<Op>,
    /// Keys chosen at random: a conflict on one of them means another write took it meanwhile.
    pub random: BTreeSet<String>,
}

impl Allocation {
    fn add(&mut self, key: String, value: Vec<u8>, random: bool) {
        if random {
            self.random.insert(key.clone());
        }
        self.ops.push(Op::Create { key, value });
    }
}

/// Allocates what `new` (defaulted and validated) needs beyond what `old` (its stored
/// predecessor, if any) holds, and releases what it no longer needs. Fills the allocated fields
/// of `new`; on an update, a ClusterIP or NodePort left empty keeps the old one, as upstream's
/// `patchAllocatedValues` does for clients that do not send them back (`kubectl apply`).
pub async fn allocate(
    store: &dyn Store,
    ranges: &ServiceRanges,
    old: Option<&Value>,
    new: &mut Value,
) -> Result<Allocation, StatusError> {
    let mut alloc = Allocation::default();
    if let Some(old) = old {
        keep_allocated_values(old, new);
    }
    allocate_ips(store, ranges, old, new, &mut alloc).await?;
    allocate_node_ports(store, ranges, old, new, &mut alloc).await?;
    Ok(alloc)
}

fn keep_allocated_values(old: &Value, new: &mut Value) {
    let new_type = str_of(spec(new), "type").to_string();
    let old_ips = held_ips(old);
    let old_headless = str_of(spec(old), "clusterIP") == "None";
    let old_ports: Vec<(String, i64)> = spec(old)
        .and_then(|m| m.get("ports"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|p| {
            (
                p.get("name").and_then(Value::as_str).unwrap_or("").to_string(),
                p.get("nodePort").and_then(Value::as_i64).unwrap_or(0),
            )
        })
        .collect();
    let keep_ports = needs_node_ports(old) && needs_node_ports(new);
    let used: BTreeSet<i64> = held_ports(new);
    let old_health = spec(old).and_then(|m| m.get("healthCheckNodePort")).cloned();
    let keep_health = needs_health_check_port(old) && needs_health_check_port(new);
    let Some(s) = new.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    if new_type != "ExternalName" {
        let unset = s.get("clusterIP").and_then(Value::as_str).unwrap_or("").is_empty();
        if unset && !old_ips.is_empty() {
            s.insert("clusterIP".into(), json!(old_ips[0]));
            s.insert("clusterIPs".into(), json!(old_ips));
        } else if unset && old_headless {
            s.insert("clusterIP".into(), json!("None"));
            s.insert("clusterIPs".into(), json!(["None"]));
        }
    }
    if keep_ports && let Some(ports) = s.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports.iter_mut().filter_map(Value::as_object_mut) {
            if p.get("nodePort").and_then(Value::as_i64).unwrap_or(0) != 0 {
                continue;
            }
            let name = p.get("name").and_then(Value::as_str).unwrap_or("");
            if let Some((_, np)) = old_ports.iter().find(|(n, np)| n == name && *np != 0)
                && !used.contains(np)
            {
                p.insert("nodePort".into(), json!(np));
            }
        }
    }
    if keep_health
        && s.get("healthCheckNodePort").and_then(Value::as_i64).unwrap_or(0) == 0
        && let Some(h) = old_health
    {
        s.insert("healthCheckNodePort".into(), h);
    }
}

async fn allocate_ips(
    store: &dyn Store,
    ranges: &ServiceRanges,
    old: Option<&Value>,
    new: &mut Value,
    alloc: &mut Allocation,
) -> Result<(), StatusError> {
    let old_ips = old.map(held_ips).unwrap_or_default();
    let ty = str_of(spec(new), "type").to_string();
    let headless = str_of(spec(new), "clusterIP") == "None";
    if ty == "ExternalName" || headless {
        if let Some(s) = new.get_mut("spec").and_then(Value::as_object_mut) {
            if ty == "ExternalName" {
                s.remove("clusterIP");
                s.remove("clusterIPs");
            } else {
                s.insert("clusterIPs".into(), json!(["None"]));
            }
        }
        release_ips(store, old, &old_ips, alloc).await?;
        return Ok(());
    }
    let requested = held_ips(new);
    if !requested.is_empty() && requested == old_ips {
        return Ok(());
    }
    let ip = match requested.first() {
        Some(ip) => {
            let parsed: Ipv4Addr = ip.parse().map_err(|_| {
                invalid(
                    new,
                    "spec.clusterIPs[0]",
                    format!("{ip:?}"),
                    "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)".into(),
                )
            })?;
            let fail = |why: String| {
                invalid(
                    new,
                    "spec.clusterIPs",
                    format!("[]string{{{ip:?}}}"),
                    format!("failed to allocate IP {ip}: {why}"),
                )
            };
            if !ranges.contains(parsed) {
                return Err(fail(format!(
                    "the provided IP ({ip}) is not in the valid range. The range of valid IPs is {}",
                    ranges.cidr()
                )));
            }
            if store_has(store, &ip_key(ip)).await? {
                return Err(fail("provided IP is already allocated".into()));
            }
            alloc.add(ip_key(ip), encode(&ip_address_object(ip, new)), false);
            ip.clone()
        }
        None => {
            let ip = random_ip(store, ranges).await?;
            alloc.add(ip_key(&ip), encode(&ip_address_object(&ip, new)), true);
            ip
        }
    };
    if let Some(s) = new.get_mut("spec").and_then(Value::as_object_mut) {
        s.insert("clusterIP".into(), json!(ip));
        s.insert("clusterIPs".into(), json!([ip]));
    }
    release_ips(store, old, &old_ips, alloc).await
}

/// Deletes the IPAddress objects of `ips` that `old` holds.
async fn release_ips(
    store: &dyn Store,
    old: Option<&Value>,
    ips: &[String],
    alloc: &mut Allocation,
) -> Result<(), StatusError> {
    let Some(old) = old else { return Ok(()) };
    let owner = service_ref(old);
    for ip in ips {
        let key = ip_key(ip);
        let Some(kv) = store.get(&key).await.map_err(store_failed)? else {
            continue;
        };
        let parent: Value = serde_json::from_slice(&kv.value).unwrap_or(Value::Null);
        let held_by = (
            parent
                .pointer("/spec/parentRef/namespace")
                .and_then(Value::as_str)
                .unwrap_or(""),
            parent
                .pointer("/spec/parentRef/name")
                .and_then(Value::as_str)
                .unwrap_or(""),
        );
        if held_by == (owner.0.as_str(), owner.1.as_str()) {
            alloc.ops.push(Op::Delete {
                key,
                expected: Some(kv.mod_revision),
            });
        }
    }
    Ok(())
}

async fn allocate_node_ports(
    store: &dyn Store,
    ranges: &ServiceRanges,
    old: Option<&Value>,
    new: &mut Value,
    alloc: &mut Allocation,
) -> Result<(), StatusError> {
    let old_held = old.map(held_ports).unwrap_or_default();
    let wants = needs_node_ports(new);
    let health = needs_health_check_port(new);
    let owner = {
        let (ns, name) = service_ref(new);
        encode(&json!({"namespace": ns, "name": name}))
    };
    if let Some(s) = new.get_mut("spec").and_then(Value::as_object_mut) {
        if !wants && let Some(ports) = s.get_mut("ports").and_then(Value::as_array_mut) {
            for p in ports.iter_mut().filter_map(Value::as_object_mut) {
                p.remove("nodePort");
            }
        }
        if !health {
            s.remove("healthCheckNodePort");
        }
    }
    let mut taken: BTreeSet<i64> = BTreeSet::new();
    let port_count = spec(new)
        .and_then(|m| m.get("ports"))
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let field = |i: Option<usize>| match i {
        Some(i) => format!("spec.ports[{i}].nodePort"),
        None => "spec.healthCheckNodePort".to_string(),
    };
    let allocated = |i: Option<usize>, port: i64| {
        invalid(
            new,
            &field(i),
            port.to_string(),
            "provided port is already allocated".into(),
        )
    };
    let check = |i: Option<usize>, port: i64, taken: &BTreeSet<i64>| {
        let field = field(i);
        let (low, high) = ranges.node_ports;
        if port < i64::from(low) || port > i64::from(high) {
            return Err(invalid(
                new,
                &field,
                port.to_string(),
                format!(
                    "provided port is not in the valid range. The range of valid ports is {}",
                    ranges.node_port_range()
                ),
            ));
        }
        if taken.contains(&port) {
            return Err(allocated(i, port));
        }
        Ok(())
    };
    // Ports asked for by number first, then the ones to draw.
    let mut draws: Vec<Option<usize>> = Vec::new();
    if wants {
        for i in 0..port_count {
            let np = new
                .pointer(&format!("/spec/ports/{i}/nodePort"))
                .and_then(Value::as_i64)
                .unwrap_or(0);
            if np == 0 {
                draws.push(Some(i));
                continue;
            }
            if !old_held.contains(&np) {
                check(Some(i), np, &taken)?;
                if store_has(store, &node_port_key(np)).await? {
                    return Err(allocated(Some(i), np));
                }
                alloc.add(node_port_key(np), owner.clone(), false);
            }
            taken.insert(np);
        }
    }
    if health {
        let hc = new
            .pointer("/spec/healthCheckNodePort")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        if hc == 0 {
            draws.push(None);
        } else {
            if !old_held.contains(&hc) {
                check(None, hc, &taken)?;
                if store_has(store, &node_port_key(hc)).await? {
                    return Err(allocated(None, hc));
                }
                alloc.add(node_port_key(hc), owner.clone(), false);
            }
            taken.insert(hc);
        }
    }
    for slot in draws {
        let port = random_port(store, ranges, &taken).await?;
        taken.insert(port);
        alloc.add(node_port_key(port), owner.clone(), true);
        if let Some(s) = new.get_mut("spec").and_then(Value::as_object_mut) {
            match slot {
                Some(i) => {
                    if let Some(p) = s
                        .get_mut("ports")
                        .and_then(Value::as_array_mut)
                        .and_then(|a| a.get_mut(i))
                        .and_then(Value::as_object_mut)
                    {
                        p.insert("nodePort".into(), json!(port));
                    }
                }
                None => {
                    s.insert("healthCheckNodePort".into(), json!(port));
                }
            }
        }
    }
    for gone in old_held.difference(&taken) {
        let key = node_port_key(*gone);
        if let Some(kv) = store.get(&key).await.map_err(store_failed)? {
            alloc.ops.push(Op::Delete {
                key,
                expected: Some(kv.mod_revision),
            });
        }
    }
    Ok(())
}

/// What deleting `old` releases: its IPAddress objects and NodePort keys.
pub async fn release(store: &dyn Store, old: &Value) -> Result<Vec<Op>, StatusError> {
    let mut alloc = Allocation::default();
    release_ips(store, Some(old), &held_ips(old), &mut alloc).await?;
    for port in held_ports(old) {
        let key = node_port_key(port);
        if let Some(kv) = store.get(&key).await.map_err(store_failed)? {
            alloc.ops.push(Op::Delete {
                key,
                expected: Some(kv.mod_revision),
            });
        }
    }
    Ok(alloc.ops)
}

fn encode(v: &Value) -> Vec<u8> {
    crate::objects::encode_for_store(v)
}

fn store_failed(e: skiff_store::StoreError) -> StatusError {
    StatusError::internal(format!("reading allocations: {e}"))
}

async fn store_has(store: &dyn Store, key: &str) -> Result<bool, StatusError> {
    Ok(store.get(key).await.map_err(store_failed)?.is_some())
}

/// Upstream's `calculateRangeOffset`: the first addresses are kept for static requests, and
/// dynamic ones come from above them while any is free there.
fn static_band(ranges: &ServiceRanges) -> u32 {
    (ranges.size() / 16).clamp(16, 256)
}

async fn random_ip(store: &dyn Store, ranges: &ServiceRanges) -> Result<String, StatusError> {
    let size = ranges.size();
    let band = static_band(ranges).min(size - 2);
    let base = u32::from(ranges.network);
    for (low, high) in [(band + 1, size - 2), (1, band)] {
        if low > high {
            continue;
        }
        for _ in 0..64 {
            let offset = rand::rng().random_range(low..=high);
            let ip = Ipv4Addr::from(base + offset).to_string();
            if !store_has(store, &ip_key(&ip)).await? {
                return Ok(ip);
            }
        }
        // A crowded part: look through it in order from a random start.
        let span = high - low + 1;
        let start = rand::rng().random_range(0..span);
        for i in 0..span {
            let ip = Ipv4Addr::from(base + low + (start + i) % span).to_string();
            if !store_has(store, &ip_key(&ip)).await? {
                return Ok(ip);
            }
        }
    }
    Err(StatusError::internal("failed to allocate a serviceIP: range is full"))
}

async fn random_port(store: &dyn Store, ranges: &ServiceRanges, taken: &BTreeSet<i64>) -> Result<i64, StatusError> {
    let (low, high) = (i64::from(ranges.node_ports.0), i64::from(ranges.node_ports.1));
    let free = async |p: i64| -> Result<bool, StatusError> {
        Ok(!taken.contains(&p) && !store_has(store, &node_port_key(p)).await?)
    };
    for _ in 0..64 {
        let p = rand::rng().random_range(low..=high);
        if free(p).await? {
            return Ok(p);
        }
    }
    let span = high - low + 1;
    let start = rand::rng().random_range(0..span);
    for i in 0..span {
        let p = low + (start + i) % span;
        if free(p).await? {
            return Ok(p);
        }
    }
    Err(StatusError::internal("failed to allocate a nodePort: range is full"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_as_upstream_flags() {
        let r = ServiceRanges::parse("10.96.0.0/12", "30000-32767").unwrap();
        assert_eq!(r, ServiceRanges::default());
        assert_eq!(r.nth(1), Ipv4Addr::new(10, 96, 0, 1));
        assert_eq!(r.nth(10), Ipv4Addr::new(10, 96, 0, 10));
        assert!(r.contains(Ipv4Addr::new(10, 111, 255, 254)));
        assert!(!r.contains(Ipv4Addr::new(10, 112, 0, 1)));
        assert!(!r.contains(Ipv4Addr::new(10, 96, 0, 0)));
        assert!(!r.contains(Ipv4Addr::new(10, 111, 255, 255)));
        assert_eq!(static_band(&r), 256);
        assert!(ServiceRanges::parse("10.96.0.0", "30000-32767").is_err());
        assert!(ServiceRanges::parse("10.96.0.0/12", "32767-30000").is_err());
        assert_eq!(
            ServiceRanges::parse("10.0.0.7/24", "1-2").unwrap().network,
            Ipv4Addr::new(10, 0, 0, 0)
        );
    }

    fn svc(spec: Value) -> Value {
        json!({"kind": "Service", "apiVersion": "v1", "metadata": {"name": "web", "namespace": "default"}, "spec": spec})
    }

    async fn commit(store: &dyn Store, key: &str, svc: &Value, alloc: Allocation) {
        let mut ops = vec![Op::Create {
            key: key.into(),
            value: encode(svc),
        }];
        ops.extend(alloc.ops);
        store.txn(ops).await.unwrap();
    }

    #[tokio::test]
    async fn cluster_ips_and_node_ports_are_allocated_checked_and_released() {
        let store = skiff_store::MemoryStore::new();
        let r = ServiceRanges::default();
        let mut a = svc(json!({"type": "NodePort", "ports": [{"port": 80}, {"port": 443, "nodePort": 30443}]}));
        let alloc = allocate(&*store, &r, None, &mut a).await.unwrap();
        let ip: Ipv4Addr = a["spec"]["clusterIP"].as_str().unwrap().parse().unwrap();
        assert!(
            r.contains(ip) && u32::from(ip) - u32::from(r.network) > 256,
            "{ip} above the static band"
        );
        assert_eq!(a["spec"]["clusterIPs"], json!([ip.to_string()]));
        let np = a["spec"]["ports"][0]["nodePort"].as_i64().unwrap();
        assert!((30000..=32767).contains(&np));
        assert_eq!(alloc.random.len(), 2, "the IP and the first port were drawn");
        commit(&*store, "/registry/services/default/web", &a, alloc).await;
        let ipa: Value =
            serde_json::from_slice(&store.get(&ip_key(&ip.to_string())).await.unwrap().unwrap().value).unwrap();
        assert_eq!(ipa["spec"]["parentRef"]["name"], "web");
        assert_eq!(ipa["metadata"]["labels"][LABEL_MANAGED_BY], MANAGED_BY);

        // Taken, out of range, not an IP, a taken port, a port out of range.
        let cases = [
            (json!({"clusterIP": ip.to_string(), "ports": [{"port": 80}]}),
             format!("spec.clusterIPs: Invalid value: []string{{\"{ip}\"}}: failed to allocate IP {ip}: provided IP is already allocated")),
            (json!({"clusterIP": "10.0.0.5", "ports": [{"port": 80}]}),
             "spec.clusterIPs: Invalid value: []string{\"10.0.0.5\"}: failed to allocate IP 10.0.0.5: the provided IP (10.0.0.5) is not in the valid range. The range of valid IPs is 10.96.0.0/12".to_string()),
            (json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 30443}]}),
             "spec.ports[0].nodePort: Invalid value: 30443: provided port is already allocated".to_string()),
            (json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 8080}]}),
             "spec.ports[0].nodePort: Invalid value: 8080: provided port is not in the valid range. The range of valid ports is 30000-32767".to_string()),
            (json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 30001}, {"port": 81, "nodePort": 30001}]}),
             "spec.ports[1].nodePort: Invalid value: 30001: provided port is already allocated".to_string()),
        ];
        for (spec, want) in cases {
            let mut b = svc(spec);
            b["metadata"]["name"] = json!("other");
            let err = allocate(&*store, &r, None, &mut b).await.unwrap_err();
            assert_eq!(err.code, 422);
            assert_eq!(err.message, format!("Service \"other\" is invalid: {want}"));
        }

        // An update without the allocated fields keeps them (kubectl apply); a change to
        // ClusterIP releases the NodePorts; ExternalName releases the IP; headless never allocates.
        let mut applied = svc(json!({"type": "NodePort", "ports": [{"port": 80}, {"port": 443, "nodePort": 30443}]}));
        let alloc = allocate(&*store, &r, Some(&a), &mut applied).await.unwrap();
        assert!(alloc.ops.is_empty(), "{:?}", alloc.ops);
        assert_eq!(applied["spec"]["clusterIP"], a["spec"]["clusterIP"]);
        assert_eq!(applied["spec"]["ports"][0]["nodePort"], json!(np));
        let mut cluster = svc(json!({"type": "ClusterIP", "ports": [{"port": 80}, {"port": 443}]}));
        let alloc = allocate(&*store, &r, Some(&a), &mut cluster).await.unwrap();
        let deleted: BTreeSet<String> = alloc.ops.iter().map(|o| o.key().to_string()).collect();
        assert_eq!(deleted, BTreeSet::from([node_port_key(np), node_port_key(30443)]));
        assert!(cluster["spec"]["ports"][1].get("nodePort").is_none());
        let mut external = svc(json!({"type": "ExternalName", "externalName": "example.com"}));
        let alloc = allocate(&*store, &r, Some(&a), &mut external).await.unwrap();
        assert_eq!(alloc.ops.len(), 3, "the IP and both ports go");
        assert!(external["spec"].get("clusterIP").is_none());
        let mut headless = svc(json!({"clusterIP": "None", "ports": [{"port": 80}]}));
        let alloc = allocate(&*store, &r, None, &mut headless).await.unwrap();
        assert!(alloc.ops.is_empty());
        assert_eq!(headless["spec"]["clusterIPs"], json!(["None"]));

        let ops = release(&*store, &a).await.unwrap();
        assert_eq!(ops.len(), 3);
        store.txn(ops).await.unwrap();
        assert!(store.get(&ip_key(&ip.to_string())).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_static_request_may_take_the_static_band_and_a_tiny_range_fills() {
        let store = skiff_store::MemoryStore::new();
        let r = ServiceRanges::parse("10.0.0.0/29", "30000-30001").unwrap();
        let mut first = svc(json!({"clusterIP": "10.0.0.1", "ports": [{"port": 80}]}));
        let alloc = allocate(&*store, &r, None, &mut first).await.unwrap();
        commit(&*store, "/s/first", &first, alloc).await;
        for i in 0..5 {
            let mut s = svc(json!({"ports": [{"port": 80}]}));
            s["metadata"]["name"] = json!(format!("s{i}"));
            let alloc = allocate(&*store, &r, None, &mut s).await.unwrap();
            commit(&*store, &format!("/s/{i}"), &s, alloc).await;
        }
        let mut full = svc(json!({"ports": [{"port": 80}]}));
        let err = allocate(&*store, &r, None, &mut full).await.unwrap_err();
        assert_eq!(err.code, 500);
        assert!(err.message.contains("range is full"), "{}", err.message);
    }
}
