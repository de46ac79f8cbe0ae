//! The Services every cluster has, reconciled at each start as upstream's API server reconciles
//! `default/kubernetes` (`pkg/controlplane/controller/kubernetesservice`): the API server's own
//! Service on the range's first address (443 to the API server's port; its Endpoints and
//! EndpointSlice are kept by the endpoint reconciler, `reconcilers.rs`), the default ServiceCIDR, and `kube-system/kube-dns` on the range's tenth address
//! (53/UDP, 53/TCP, `internalTrafficPolicy: Local`), which a kubeadm cluster gets from its CoreDNS
//! addon and Skiff's node agents answer themselves (each publishes its own EndpointSlice).

use anyhow::Context;
use serde_json::{Value, json};
use skiff_store::{Op, StoreError};

use crate::allocator;
use crate::objects;
use crate::server::ApiState;

fn metadata(name: &str, namespace: Option<&str>, labels: Value) -> Value {
    let mut md = json!({
        "name": name,
        "uid": uuid::Uuid::new_v4().to_string(),
        "creationTimestamp": objects::now_rfc3339(),
    });
    if let Some(ns) = namespace {
        md["namespace"] = json!(ns);
    }
    if labels.as_object().is_some_and(|l| !l.is_empty()) {
        md["labels"] = labels;
    }
    md
}

/// Writes `desired` at `key` unless what is stored already has the same `compare` parts; an
/// existing object keeps its metadata (uid, creation time).
async fn reconcile(state: &ApiState, key: &str, desired: Value, compare: &[&str]) -> anyhow::Result<()> {
    let current = state.store.get(key).await?;
    let Some(kv) = current else {
        match state.store.create(key, objects::encode_for_store(&desired)).await {
            Ok(_) | Err(StoreError::AlreadyExists(_)) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    };
    let stored: Value = serde_json::from_slice(&kv.value).context("decoding a stored object")?;
    if compare.iter().all(|p| stored.pointer(p) == desired.pointer(p)) {
        return Ok(());
    }
    let mut updated = stored.clone();
    for p in compare {
        let field = p.trim_start_matches('/');
        if let (Some(obj), Some(v)) = (updated.as_object_mut(), desired.pointer(p)) {
            obj.insert(field.to_string(), v.clone());
        }
    }
    match state
        .store
        .update(key, objects::encode_for_store(&updated), kv.mod_revision)
        .await
    {
        Ok(_) | Err(StoreError::Conflict { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A Service with a fixed ClusterIP, created with its IPAddress in one transaction; an existing
/// one gets the desired ports and type back, its ClusterIP kept.
async fn ensure_service(state: &ApiState, namespace: &str, name: &str, desired: Value) -> anyhow::Result<()> {
    let key = format!("/registry/services/{namespace}/{name}");
    let Some(kv) = state.store.get(&key).await? else {
        let mut svc = desired;
        let res = skiff_api::registry::lookup("", "v1", "services").context("the services resource")?;
        skiff_api::defaults::apply_defaults(res, &mut svc);
        skiff_api::written::fill(res, &mut svc);
        let alloc = allocator::allocate(&*state.store, &state.service_ranges, None, &mut svc)
            .await
            .map_err(|e| anyhow::anyhow!("allocating the {namespace}/{name} Service's address: {}", e.message))?;
        let mut ops = vec![Op::Create {
            key,
            value: objects::encode_for_store(&svc),
        }];
        ops.extend(alloc.ops);
        return match state.store.txn(ops).await {
            Ok(_) | Err(StoreError::AlreadyExists(_)) => Ok(()),
            Err(e) => Err(e.into()),
        };
    };
    let stored: Value = serde_json::from_slice(&kv.value).context("decoding a stored Service")?;
    let same = |p: &str| stored.pointer(p) == desired.pointer(p);
    let owned = ["/spec/ports", "/spec/type", "/spec/internalTrafficPolicy"];
    if owned.iter().all(|p| desired.pointer(p).is_none() || same(p)) {
        return Ok(());
    }
    let mut svc = stored.clone();
    for p in owned {
        if let Some(v) = desired.pointer(p) {
            let field = p.trim_start_matches("/spec/");
            svc["spec"][field] = v.clone();
        }
    }
    let alloc = allocator::allocate(&*state.store, &state.service_ranges, Some(&stored), &mut svc)
        .await
        .map_err(|e| anyhow::anyhow!("reconciling the {namespace}/{name} Service: {}", e.message))?;
    let mut ops = vec![Op::Update {
        key,
        value: objects::encode_for_store(&svc),
        expected: kv.mod_revision,
    }];
    ops.extend(alloc.ops);
    match state.store.txn(ops).await {
        Ok(_) | Err(StoreError::Conflict { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Reconciles the cluster's own Services; `port` is the API server's secure port. The
/// `kubernetes` Service's Endpoints and EndpointSlice are the endpoint reconciler's
/// (`reconcilers.rs`).
pub async fn reconcile_all(state: &ApiState, port: u16) -> anyhow::Result<()> {
    let ranges = state.service_ranges;
    let cidr = ranges.cidr();
    reconcile(
        state,
        "/registry/servicecidrs.networking.k8s.io/kubernetes",
        json!({
            "kind": "ServiceCIDR",
            "apiVersion": "networking.k8s.io/v1",
            "metadata": metadata("kubernetes", None, json!({})),
            "spec": {"cidrs": [cidr]},
            "status": {"conditions": [{
                "type": "Ready", "status": "True", "reason": "", "message": "",
                "lastTransitionTime": objects::now_rfc3339(),
            }]},
        }),
        &["/spec"],
    )
    .await
    .context("reconciling the default ServiceCIDR")?;

    let https = json!([{"name": "https", "port": 443, "protocol": "TCP", "targetPort": port}]);
    ensure_service(
        state,
        "default",
        "kubernetes",
        json!({
            "kind": "Service",
            "apiVersion": "v1",
            "metadata": metadata("kubernetes", Some("default"),
                json!({"component": "apiserver", "provider": "kubernetes"})),
            "spec": {"type": "ClusterIP", "clusterIP": ranges.nth(1).to_string(), "ports": https,
                     "sessionAffinity": "None"},
        }),
    )
    .await?;
    ensure_service(
        state,
        "kube-system",
        "kube-dns",
        json!({
            "kind": "Service",
            "apiVersion": "v1",
            "metadata": metadata("kube-dns", Some("kube-system"), json!({
                "k8s-app": "kube-dns",
                "kubernetes.io/cluster-service": "true",
                "kubernetes.io/name": "CoreDNS",
            })),
            // Every node's agent answers DNS itself: pods ask their own node's.
            "spec": {"type": "ClusterIP", "clusterIP": ranges.nth(10).to_string(), "sessionAffinity": "None",
                     "internalTrafficPolicy": "Local",
                     "ports": [
                         {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                         {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
                     ]},
        }),
    )
    .await
}
