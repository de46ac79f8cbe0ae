//! The endpoint reconcilers of the `kubernetes` Service, as upstream's
//! `pkg/controlplane/reconcilers` (`--endpoint-reconciler-type`): what `default/kubernetes`'s
//! Endpoints and EndpointSlice list, kept so every `--endpoint-reconcile-interval`.
//!
//! - `lease` (the default on a shared store, as upstream's default): each replica keeps a record
//!   of its own with a TTL (`--master-endpoint-reconcile-ttl`, 15 s): a coordination Lease in
//!   `kube-system` labelled `apiserver.kubernetes.io/identity: kube-apiserver`, named as
//!   upstream's API server identity leases (`apiserver-` and a hash), whose annotation
//!   `skiff.dev/endpoint` holds the replica's advertised `IP:PORT`, renewed at every
//!   reconciliation. The Endpoints and the EndpointSlice list exactly the replicas whose Lease is
//!   live (renewed within its `leaseDurationSeconds`), sorted, and are written together in one
//!   store transaction. A replica that stops cleanly deletes its Lease and reconciles at once
//!   (upstream's `RemoveEndpoints`); one killed drops out once its TTL has passed, when the next
//!   reconciliation of any replica deletes its expired Lease. Liveness is judged by the reading
//!   replica's clock against the writer's `renewTime` (upstream's etcd TTL has no such need), so
//!   the replicas' clocks must agree to well within the TTL (NTP).
//! - `master-count` (the default of the embedded store, which only one server uses): the
//!   Endpoints and EndpointSlice list this server alone, as upstream's with `--apiserver-count 1`.
//! - `none`: nothing is written.
//!
//! The addresses are grouped by port: the Endpoints have one subset per port, and the
//! EndpointSlice (one port list per slice) holds the group of the lowest port. Replicas are
//! expected to share their secure port, as upstream's reconcilers assume.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};
use sha2::Digest;
use skiff_store::{Op, StoreError};

use crate::objects;
use crate::server::ApiState;

/// Upstream's `DefaultEndpointReconcilerInterval`.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
/// Upstream's `DefaultEndpointReconcilerTTL` (`--master-endpoint-reconcile-ttl`).
pub const DEFAULT_TTL: Duration = Duration::from_secs(15);
/// Upstream's `IdentityLeaseComponentLabelKey` and its value for the API server.
pub const IDENTITY_LABEL: &str = "apiserver.kubernetes.io/identity";
pub const IDENTITY_VALUE: &str = "kube-apiserver";
/// The annotation of a replica's Lease that holds its advertised `IP:PORT`.
pub const ENDPOINT_ANNOTATION: &str = "skiff.dev/endpoint";
const NAMESPACE: &str = "kube-system";

/// `--endpoint-reconciler-type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReconcilerType {
    Lease,
    MasterCount,
    None,
}

impl std::str::FromStr for ReconcilerType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "lease" => Ok(ReconcilerType::Lease),
            "master-count" => Ok(ReconcilerType::MasterCount),
            "none" => Ok(ReconcilerType::None),
            other => Err(format!(
                "unknown endpoint reconciler type {other:?}: one of lease, master-count, none"
            )),
        }
    }
}

/// How the `kubernetes` Service's endpoints are kept.
#[derive(Clone, Copy, Debug)]
pub struct ReconcilerOptions {
    /// Unset: `lease` on a shared store (etcd), `master-count` on the embedded one.
    pub kind: Option<ReconcilerType>,
    /// `--master-endpoint-reconcile-ttl`.
    pub ttl: Duration,
    /// `--endpoint-reconcile-interval`: at most the TTL's two thirds, so a live replica is
    /// never taken for gone between two of its renewals.
    pub interval: Duration,
}

impl Default for ReconcilerOptions {
    fn default() -> Self {
        ReconcilerOptions {
            kind: None,
            ttl: DEFAULT_TTL,
            interval: DEFAULT_INTERVAL,
        }
    }
}

/// The name of a replica's identity Lease: upstream's `apiserver-` and the lowercase base32 of
/// the first 16 bytes of a SHA-256, here of the host name and the advertised endpoint (so
/// replicas on one machine differ).
pub fn lease_name(hostname: &str, endpoint: SocketAddr) -> String {
    let hash = sha2::Sha256::digest(format!("{hostname}_{endpoint}").as_bytes());
    format!("apiserver-{}", base32_lower(&hash[..16]))
}

fn base32_lower(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut out = String::new();
    let (mut buffer, mut bits) = (0u32, 0u32);
    for &b in bytes {
        buffer = (buffer << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(char::from(ALPHABET[((buffer >> bits) & 31) as usize]));
        }
    }
    if bits > 0 {
        out.push(char::from(ALPHABET[((buffer << (5 - bits)) & 31) as usize]));
    }
    out
}

/// The endpoint reconciler of one API server.
pub struct EndpointReconciler {
    state: Arc<ApiState>,
    kind: ReconcilerType,
    endpoint: SocketAddr,
    ttl: Duration,
    interval: Duration,
    lease_name: String,
    hostname: String,
    /// Held by each reconciliation; `true` once the endpoints were removed at shutdown, after
    /// which nothing is written again.
    removed: tokio::sync::Mutex<bool>,
}

impl EndpointReconciler {
    pub fn new(
        state: Arc<ApiState>,
        kind: ReconcilerType,
        endpoint: SocketAddr,
        hostname: &str,
        opts: &ReconcilerOptions,
    ) -> Arc<Self> {
        let interval = opts.interval.min(opts.ttl * 2 / 3).max(Duration::from_millis(100));
        Arc::new(EndpointReconciler {
            state,
            kind,
            endpoint,
            ttl: opts.ttl,
            interval,
            lease_name: lease_name(hostname, endpoint),
            hostname: hostname.to_string(),
            removed: tokio::sync::Mutex::new(false),
        })
    }

    pub fn kind(&self) -> ReconcilerType {
        self.kind
    }

    /// This replica's identity Lease (`lease` reconciler).
    pub fn lease_name(&self) -> &str {
        &self.lease_name
    }

    /// Upstream's `ReconcileEndpoints`: renews this replica's record and writes the endpoints
    /// of every live one.
    pub async fn reconcile(&self) -> anyhow::Result<()> {
        let removed = self.removed.lock().await;
        if *removed {
            return Ok(());
        }
        match self.kind {
            ReconcilerType::None => Ok(()),
            ReconcilerType::MasterCount => write_endpoints(&self.state, &[self.endpoint]).await,
            ReconcilerType::Lease => {
                self.renew_lease()
                    .await
                    .context("renewing this server's identity Lease")?;
                let live = self.live_endpoints().await?;
                write_endpoints(&self.state, &live).await
            }
        }
    }

    /// Upstream's `RemoveEndpoints`, at shutdown: this replica's record goes and the endpoints
    /// list the others; nothing is reconciled afterwards.
    pub async fn remove(&self) -> anyhow::Result<()> {
        let mut removed = self.removed.lock().await;
        if *removed || self.kind != ReconcilerType::Lease {
            *removed = true;
            return Ok(());
        }
        *removed = true;
        let key = lease_key(&self.lease_name)?;
        match self.state.store.delete(&key, None).await {
            Ok(_) | Err(StoreError::NotFound(_)) => {}
            Err(e) => return Err(e).context("deleting this server's identity Lease"),
        }
        let live = self.live_endpoints().await?;
        write_endpoints(&self.state, &live).await
    }

    /// Reconciles every interval until [`remove`](Self::remove) was called.
    pub async fn run(self: Arc<Self>) {
        if self.kind == ReconcilerType::None {
            return;
        }
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            if *self.removed.lock().await {
                return;
            }
            if let Err(e) = self.reconcile().await {
                tracing::warn!(
                    error = format!("{e:#}"),
                    "reconciling the kubernetes Service's endpoints"
                );
            }
        }
    }

    async fn renew_lease(&self) -> anyhow::Result<()> {
        let key = lease_key(&self.lease_name)?;
        let duration = self.ttl.as_secs().max(1);
        for _ in 0..3 {
            let now = objects::now_micro();
            let current = self.state.store.get(&key).await?;
            let result = match current {
                None => {
                    let lease = json!({
                        "kind": "Lease",
                        "apiVersion": "coordination.k8s.io/v1",
                        "metadata": {
                            "name": self.lease_name,
                            "namespace": NAMESPACE,
                            "uid": uuid::Uuid::new_v4().to_string(),
                            "creationTimestamp": objects::now_rfc3339(),
                            "labels": {
                                IDENTITY_LABEL: IDENTITY_VALUE,
                                "kubernetes.io/hostname": self.hostname,
                            },
                            "annotations": {ENDPOINT_ANNOTATION: self.endpoint.to_string()},
                        },
                        "spec": {
                            "holderIdentity": self.lease_name,
                            "leaseDurationSeconds": duration,
                            "acquireTime": now,
                            "renewTime": now,
                        },
                    });
                    self.state.store.create(&key, objects::encode_for_store(&lease)).await
                }
                Some(kv) => {
                    let mut lease: Value = serde_json::from_slice(&kv.value).context("decoding a stored Lease")?;
                    lease["metadata"]["labels"][IDENTITY_LABEL] = json!(IDENTITY_VALUE);
                    lease["metadata"]["annotations"][ENDPOINT_ANNOTATION] = json!(self.endpoint.to_string());
                    lease["spec"]["holderIdentity"] = json!(self.lease_name);
                    lease["spec"]["leaseDurationSeconds"] = json!(duration);
                    lease["spec"]["renewTime"] = json!(now);
                    self.state
                        .store
                        .update(&key, objects::encode_for_store(&lease), kv.mod_revision)
                        .await
                }
            };
            match result {
                Ok(_) => return Ok(()),
                Err(StoreError::Conflict { .. } | StoreError::AlreadyExists(_)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        anyhow::bail!("the Lease kept changing under this server")
    }

    /// The endpoints of the identity Leases still live; expired ones are deleted (upstream's
    /// lease garbage collection of API server identities).
    async fn live_endpoints(&self) -> anyhow::Result<Vec<SocketAddr>> {
        let prefix = lease_key("")?;
        let listed = self
            .state
            .store
            .list(&prefix, Default::default())
            .await
            .context("listing identity Leases")?;
        let now = jiff::Timestamp::now();
        let mut live = Vec::new();
        for kv in &listed.items {
            let Ok(lease) = serde_json::from_slice::<Value>(&kv.value) else {
                continue;
            };
            if lease.pointer(&format!("/metadata/labels/{}", IDENTITY_LABEL.replace('/', "~1")))
                != Some(&json!(IDENTITY_VALUE))
            {
                continue;
            }
            let Some(endpoint) = lease
                .pointer(&format!(
                    "/metadata/annotations/{}",
                    ENDPOINT_ANNOTATION.replace('/', "~1")
                ))
                .and_then(Value::as_str)
                .and_then(|s| s.parse::<SocketAddr>().ok())
            else {
                continue;
            };
            if lease_is_live(&lease, now) {
                live.push(endpoint);
            } else {
                match self.state.store.delete(&kv.key, Some(kv.mod_revision)).await {
                    Ok(_) => tracing::info!(key = %kv.key, %endpoint, "removed an expired API server identity Lease"),
                    Err(StoreError::NotFound(_) | StoreError::Conflict { .. }) => {}
                    Err(e) => tracing::warn!(error = %e, key = %kv.key, "deleting an expired identity Lease"),
                }
            }
        }
        Ok(live)
    }
}

fn lease_key(name: &str) -> anyhow::Result<String> {
    let res = skiff_api::registry::lookup("coordination.k8s.io", "v1", "leases").context("the leases resource")?;
    Ok(objects::key(res, NAMESPACE, name))
}

/// Renewed within its duration, by this machine's clock.
fn lease_is_live(lease: &Value, now: jiff::Timestamp) -> bool {
    let Some(renewed) = lease
        .pointer("/spec/renewTime")
        .and_then(Value::as_str)
        .and_then(|s| s.parse::<jiff::Timestamp>().ok())
    else {
        return false;
    };
    let seconds = lease
        .pointer("/spec/leaseDurationSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    renewed
        .checked_add(jiff::SignedDuration::from_secs(seconds))
        .is_ok_and(|until| until > now)
}

/// The Endpoints' `subsets` and the EndpointSlice's `endpoints` and `ports` for `endpoints`.
fn desired(endpoints: &[SocketAddr]) -> (Value, Value, Value, &'static str) {
    let mut by_port: BTreeMap<u16, Vec<IpAddr>> = BTreeMap::new();
    for e in endpoints {
        by_port.entry(e.port()).or_default().push(e.ip());
    }
    for ips in by_port.values_mut() {
        ips.sort();
        ips.dedup();
    }
    let port = |p: u16| json!([{"name": "https", "port": p, "protocol": "TCP"}]);
    let subsets: Vec<Value> = by_port
        .iter()
        .map(|(p, ips)| {
            json!({
                "addresses": ips.iter().map(|ip| json!({"ip": ip.to_string()})).collect::<Vec<_>>(),
                "ports": port(*p),
            })
        })
        .collect();
    let (slice_endpoints, slice_ports) = match by_port.iter().next() {
        Some((p, ips)) => (
            ips.iter()
                .map(|ip| json!({"addresses": [ip.to_string()], "conditions": {"ready": true}}))
                .collect::<Vec<_>>(),
            port(*p),
        ),
        None => (Vec::new(), json!([])),
    };
    let v6 = !endpoints.is_empty() && endpoints.iter().all(SocketAddr::is_ipv6);
    (
        json!(subsets),
        json!(slice_endpoints),
        slice_ports,
        if v6 { "IPv6" } else { "IPv4" },
    )
}

fn metadata(labels: Value) -> Value {
    json!({
        "name": "kubernetes",
        "namespace": "default",
        "uid": uuid::Uuid::new_v4().to_string(),
        "creationTimestamp": objects::now_rfc3339(),
        "labels": labels,
    })
}

/// Writes `default/kubernetes`'s Endpoints and EndpointSlice to list `endpoints` (sorted), in
/// one transaction, unless they already do.
pub async fn write_endpoints(state: &ApiState, endpoints: &[SocketAddr]) -> anyhow::Result<()> {
    let (subsets, slice_endpoints, slice_ports, address_type) = desired(endpoints);
    let endpoints_res = skiff_api::registry::lookup("", "v1", "endpoints").context("the endpoints resource")?;
    let slices_res = skiff_api::registry::lookup("discovery.k8s.io", "v1", "endpointslices")
        .context("the endpointslices resource")?;
    let endpoints_key = objects::key(endpoints_res, "default", "kubernetes");
    let slice_key = objects::key(slices_res, "default", "kubernetes");
    let mut wanted_endpoints = json!({
        "kind": "Endpoints",
        "apiVersion": "v1",
        "metadata": metadata(json!({"endpointslice.kubernetes.io/skip-mirror": "true"})),
    });
    if subsets.as_array().is_some_and(|s| !s.is_empty()) {
        wanted_endpoints["subsets"] = subsets;
    }
    let wanted_slice = json!({
        "kind": "EndpointSlice",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": metadata(json!({"kubernetes.io/service-name": "kubernetes"})),
        "addressType": address_type,
        "endpoints": slice_endpoints,
        "ports": slice_ports,
    });
    for _ in 0..3 {
        let mut ops = Vec::new();
        for (key, wanted, owned) in [
            (&endpoints_key, &wanted_endpoints, &["/subsets"][..]),
            (&slice_key, &wanted_slice, &["/addressType", "/endpoints", "/ports"][..]),
        ] {
            match state.store.get(key).await? {
                None => ops.push(Op::Create {
                    key: key.clone(),
                    value: objects::encode_for_store(wanted),
                }),
                Some(kv) => {
                    let stored: Value = serde_json::from_slice(&kv.value).context("decoding a stored object")?;
                    if owned.iter().all(|p| stored.pointer(p) == wanted.pointer(p)) {
                        continue;
                    }
                    let mut updated = stored;
                    if let Some(obj) = updated.as_object_mut() {
                        for p in owned {
                            let field = p.trim_start_matches('/');
                            match wanted.pointer(p) {
                                Some(v) => obj.insert(field.to_string(), v.clone()),
                                None => obj.remove(field),
                            };
                        }
                    }
                    ops.push(Op::Update {
                        key: key.clone(),
                        value: objects::encode_for_store(&updated),
                        expected: kv.mod_revision,
                    });
                }
            }
        }
        if ops.is_empty() {
            return Ok(());
        }
        match state.store.txn(ops).await {
            Ok(_) => {
                tracing::info!(endpoints = ?endpoints, "the kubernetes Service's endpoints changed");
                return Ok(());
            }
            Err(StoreError::Conflict { .. } | StoreError::AlreadyExists(_)) => continue,
            Err(e) => return Err(e).context("writing the kubernetes Service's endpoints"),
        }
    }
    anyhow::bail!("the kubernetes Service's endpoints kept changing under this server")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reconciler(state: &Arc<ApiState>, endpoint: &str, ttl: Duration) -> Arc<EndpointReconciler> {
        EndpointReconciler::new(
            state.clone(),
            ReconcilerType::Lease,
            endpoint.parse().unwrap(),
            "host",
            &ReconcilerOptions {
                kind: None,
                ttl,
                interval: DEFAULT_INTERVAL,
            },
        )
    }

    async fn listed(state: &ApiState) -> (Value, Value) {
        let e = state
            .store
            .get("/registry/endpoints/default/kubernetes")
            .await
            .unwrap()
            .unwrap();
        let s = state
            .store
            .get("/registry/endpointslices.discovery.k8s.io/default/kubernetes")
            .await
            .unwrap()
            .unwrap();
        (
            serde_json::from_slice(&e.value).unwrap(),
            serde_json::from_slice(&s.value).unwrap(),
        )
    }

    fn slice_ips(slice: &Value) -> Vec<String> {
        slice["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["addresses"][0].as_str().unwrap().to_string())
            .collect()
    }

    #[test]
    fn lease_names_are_upstreams_shape_and_differ_per_endpoint() {
        let a = lease_name("host", "10.0.0.2:6443".parse().unwrap());
        let b = lease_name("host", "10.0.0.3:6443".parse().unwrap());
        assert_ne!(a, b);
        assert!(a.starts_with("apiserver-"));
        // 16 bytes of base32 without padding: 26 characters.
        assert_eq!(a.len(), "apiserver-".len() + 26);
        assert!(
            a["apiserver-".len()..]
                .chars()
                .all(|c| c.is_ascii_lowercase() || ('2'..='7').contains(&c))
        );
        assert_eq!(base32_lower(b"foobar"), "mzxw6ytboi");
    }

    /// Two replicas: both listed, sorted; one removed at shutdown leaves; one that stops renewing
    /// leaves once its TTL has passed.
    #[tokio::test]
    async fn live_replicas_are_the_endpoints() {
        let dir = tempfile::tempdir().unwrap();
        let (state, _) = ApiState::for_tests(dir.path());
        let b = reconciler(&state, "10.0.0.3:6443", Duration::from_secs(1));
        let a = reconciler(&state, "10.0.0.2:6443", Duration::from_secs(30));
        b.reconcile().await.unwrap();
        a.reconcile().await.unwrap();
        let (endpoints, slice) = listed(&state).await;
        assert_eq!(
            endpoints["subsets"],
            json!([{"addresses": [{"ip": "10.0.0.2"}, {"ip": "10.0.0.3"}],
                    "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}]}])
        );
        assert_eq!(slice_ips(&slice), ["10.0.0.2", "10.0.0.3"]);
        assert_eq!(slice["ports"][0]["port"], 6443);
        let lease = state
            .store
            .get(&lease_key(a.lease_name()).unwrap())
            .await
            .unwrap()
            .unwrap();
        let lease: Value = serde_json::from_slice(&lease.value).unwrap();
        assert_eq!(lease["metadata"]["labels"][IDENTITY_LABEL], IDENTITY_VALUE);
        assert_eq!(lease["metadata"]["annotations"][ENDPOINT_ANNOTATION], "10.0.0.2:6443");

        // b stops renewing: gone after its TTL, its Lease deleted.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        a.reconcile().await.unwrap();
        let (endpoints, slice) = listed(&state).await;
        assert_eq!(endpoints["subsets"][0]["addresses"], json!([{"ip": "10.0.0.2"}]));
        assert_eq!(slice_ips(&slice), ["10.0.0.2"]);
        assert!(
            state
                .store
                .get(&lease_key(b.lease_name()).unwrap())
                .await
                .unwrap()
                .is_none()
        );

        // b back, then a removed at shutdown: only b, and a writes nothing again.
        b.reconcile().await.unwrap();
        a.remove().await.unwrap();
        a.reconcile().await.unwrap();
        let (_, slice) = listed(&state).await;
        assert_eq!(slice_ips(&slice), ["10.0.0.3"]);
        b.remove().await.unwrap();
        let (endpoints, slice) = listed(&state).await;
        assert!(endpoints.get("subsets").is_none(), "{endpoints}");
        assert_eq!(slice["endpoints"], json!([]));
    }

    #[tokio::test]
    async fn master_count_lists_this_server_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (state, _) = ApiState::for_tests(dir.path());
        write_endpoints(
            &state,
            &["10.0.0.9:6443".parse().unwrap(), "10.0.0.8:6443".parse().unwrap()],
        )
        .await
        .unwrap();
        let r = EndpointReconciler::new(
            state.clone(),
            ReconcilerType::MasterCount,
            "10.0.0.2:6443".parse().unwrap(),
            "host",
            &ReconcilerOptions::default(),
        );
        r.reconcile().await.unwrap();
        r.remove().await.unwrap();
        let (endpoints, slice) = listed(&state).await;
        assert_eq!(endpoints["subsets"][0]["addresses"], json!([{"ip": "10.0.0.2"}]));
        assert_eq!(slice_ips(&slice), ["10.0.0.2"]);
        // No identity Lease for the embedded store.
        let leases = state
            .store
            .list(&lease_key("").unwrap(), Default::default())
            .await
            .unwrap();
        assert!(leases.items.is_empty());
    }

    #[test]
    fn ports_group_the_addresses() {
        let (subsets, slice, ports, family) =
            desired(&["10.0.0.2:7000".parse().unwrap(), "10.0.0.3:6443".parse().unwrap()]);
        assert_eq!(subsets.as_array().unwrap().len(), 2);
        assert_eq!(subsets[0]["ports"][0]["port"], 6443);
        assert_eq!(slice.as_array().unwrap().len(), 1);
        assert_eq!(ports[0]["port"], 6443);
        assert_eq!(family, "IPv4");
    }
}
