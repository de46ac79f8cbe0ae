//! The `Available` condition of every APIService, as upstream's kube-aggregator availability
//! controllers (`pkg/controllers/status/local` and `.../remote`) set it:
//!
//! - a local APIService (no `spec.service`) is `True`, reason `Local`;
//! - one whose Service does not exist is `False`, `ServiceNotFound`;
//! - one whose ClusterIP Service has no port `spec.service.port` is `False`, `ServicePortError`;
//! - one whose Service has no Endpoints object is `False`, `EndpointsNotFound`, and one whose
//!   Endpoints have no address with the port's name `False`, `MissingEndpoints`;
//! - otherwise `True`, `Passed`.
//!
//! Skiff does not proxy requests to aggregated API servers, so upstream's last check (a GET of
//! the group version's discovery document through the Service) is not made.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use skiff_store::{ListOptions, Store};

use crate::autoregister;
use crate::objects;
use crate::server::ApiState;

/// The condition's status, reason and message.
#[derive(Debug, PartialEq, Eq)]
pub struct Availability {
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
}

impl Availability {
    fn new(status: &'static str, reason: &'static str, message: String) -> Availability {
        Availability {
            status,
            reason,
            message,
        }
    }
}

/// The availability of `api_service`, given its Service and that Service's Endpoints as
/// stored (`None` when absent).
pub fn availability(api_service: &Value, service: Option<&Value>, endpoints: Option<&Value>) -> Availability {
    let Some(reference) = api_service.pointer("/spec/service").filter(|s| !s.is_null()) else {
        return Availability::new("True", "Local", "Local APIServices are always available".into());
    };
    let ns = reference.get("namespace").and_then(Value::as_str).unwrap_or("");
    let name = reference.get("name").and_then(Value::as_str).unwrap_or("");
    let Some(service) = service else {
        return Availability::new(
            "False",
            "ServiceNotFound",
            format!("service/{name} in {ns:?} is not present"),
        );
    };
    let ty = service
        .pointer("/spec/type")
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP");
    if ty == "ClusterIP" {
        let port = reference.get("port").and_then(Value::as_i64).unwrap_or(443);
        let found = service
            .pointer("/spec/ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|p| p.get("port").and_then(Value::as_i64) == Some(port));
        let Some(found) = found else {
            return Availability::new(
                "False",
                "ServicePortError",
                format!("service/{name} in {ns:?} is not listening on port {port}"),
            );
        };
        let port_name = found.get("name").and_then(Value::as_str).unwrap_or("");
        let Some(endpoints) = endpoints else {
            return Availability::new(
                "False",
                "EndpointsNotFound",
                format!("cannot find endpoints for service/{name} in {ns:?}"),
            );
        };
        let active = endpoints
            .get("subsets")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|s| {
                s.get("addresses")
                    .and_then(Value::as_array)
                    .is_some_and(|a| !a.is_empty())
            })
            .any(|s| {
                s.get("ports")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .any(|p| p.get("name").and_then(Value::as_str).unwrap_or("") == port_name)
            });
        if !active {
            return Availability::new(
                "False",
                "MissingEndpoints",
                format!("endpoints for service/{name} in {ns:?} have no addresses with port name {port_name:?}"),
            );
        }
    }
    Availability::new("True", "Passed", "all checks passed".into())
}

/// `api_service` with its `Available` condition set (upstream's `SetAPIServiceCondition`: the
/// transition time moves only when the status does).
pub fn with_condition(api_service: &Value, a: &Availability, now: &str) -> Value {
    let mut out = api_service.clone();
    let Some(m) = out.as_object_mut() else { return out };
    let status = m.entry("status").or_insert_with(|| json!({}));
    if !status.is_object() {
        *status = json!({});
    }
    let conditions = status
        .as_object_mut()
        .map(|s| s.entry("conditions").or_insert_with(|| json!([])));
    let Some(conditions) = conditions else { return out };
    if !conditions.is_array() {
        *conditions = json!([]);
    }
    let Some(list) = conditions.as_array_mut() else {
        return out;
    };
    match list
        .iter_mut()
        .find(|c| c.get("type").and_then(Value::as_str) == Some("Available"))
    {
        Some(c) => {
            if c.get("status").and_then(Value::as_str) != Some(a.status) {
                c["status"] = json!(a.status);
                c["lastTransitionTime"] = json!(now);
            }
            c["reason"] = json!(a.reason);
            c["message"] = json!(a.message);
        }
        None => list.push(json!({
            "type": "Available",
            "status": a.status,
            "lastTransitionTime": now,
            "reason": a.reason,
            "message": a.message,
        })),
    }
    out
}

/// One pass: every APIService's condition brought up to date (written only when it changed).
pub async fn sync(store: &dyn Store) -> anyhow::Result<()> {
    let res = autoregister::resource()?;
    let services = skiff_api::registry::lookup("", "v1", "services")
        .ok_or_else(|| anyhow::anyhow!("the services resource is not registered"))?;
    let endpoints = skiff_api::registry::lookup("", "v1", "endpoints")
        .ok_or_else(|| anyhow::anyhow!("the endpoints resource is not registered"))?;
    let list = store.list(&objects::prefix(res, ""), ListOptions::default()).await?;
    let now = objects::now_rfc3339();
    for kv in &list.items {
        let Some(api_service) = objects::decode_kv(kv) else {
            continue;
        };
        let (svc, eps) = match api_service.pointer("/spec/service").filter(|s| !s.is_null()) {
            None => (None, None),
            Some(r) => {
                let ns = r.get("namespace").and_then(Value::as_str).unwrap_or("");
                let name = r.get("name").and_then(Value::as_str).unwrap_or("");
                let get = |key: String| async move {
                    store.get(&key).await.map(|kv| kv.as_ref().and_then(objects::decode_kv))
                };
                (
                    get(objects::key(services, ns, name)).await?,
                    get(objects::key(endpoints, ns, name)).await?,
                )
            }
        };
        let a = availability(&api_service, svc.as_ref(), eps.as_ref());
        let updated = with_condition(&api_service, &a, &now);
        if updated.get("status") == api_service.get("status") {
            continue;
        }
        tracing::debug!(
            name = objects::name(&api_service),
            status = a.status,
            reason = a.reason,
            "changing APIService availability"
        );
        if let Err(e) = store
            .update(&kv.key, objects::encode_for_store(&updated), kv.mod_revision)
            .await
        {
            // Changed or deleted meanwhile: the next pass sees it.
            tracing::debug!(key = kv.key, error = %e, "writing an APIService's status failed");
        }
    }
    Ok(())
}

/// Keep the conditions current: after each change to an APIService, a Service or Endpoints,
/// and every 30 seconds (upstream's resync).
pub fn spawn(state: Arc<ApiState>) {
    tokio::spawn(async move {
        let store = state.store.clone();
        let mut prefixes = Vec::new();
        if let Ok(res) = autoregister::resource() {
            prefixes.push(objects::prefix(res, ""));
        }
        for plural in ["services", "endpoints"] {
            if let Some(r) = skiff_api::registry::lookup("", "v1", plural) {
                prefixes.push(objects::prefix(r, ""));
            }
        }
        loop {
            let from = match store.current_revision().await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the revision for APIService availability failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            if let Err(e) = sync(&*store).await {
                tracing::warn!(error = %e, "checking APIService availability failed");
            }
            let mut watches = Vec::new();
            for p in &prefixes {
                match store.watch(p, from).await {
                    Ok(w) => watches.push(w),
                    Err(e) => tracing::warn!(error = %e, "watching for APIService availability failed"),
                }
            }
            if watches.len() != prefixes.len() {
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            let mut events = futures::stream::select_all(watches);
            loop {
                if let Ok(None) = tokio::time::timeout(Duration::from_secs(30), events.next()).await {
                    break;
                }
                if let Err(e) = sync(&*store).await {
                    tracing::warn!(error = %e, "checking APIService availability failed");
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn remote() -> Value {
        json!({"metadata": {"name": "v1beta1.metrics.k8s.io"},
            "spec": {"group": "metrics.k8s.io", "version": "v1beta1",
                "service": {"namespace": "kube-system", "name": "metrics-server", "port": 443}}})
    }

    #[test]
    fn local_api_services_are_always_available() {
        let a = availability(&json!({"spec": {"group": "apps", "version": "v1"}}), None, None);
        assert_eq!((a.status, a.reason), ("True", "Local"));
        assert_eq!(a.message, "Local APIServices are always available");
    }

    #[test]
    fn remote_api_services_in_upstream_words() {
        let a = availability(&remote(), None, None);
        assert_eq!((a.status, a.reason), ("False", "ServiceNotFound"));
        assert_eq!(a.message, "service/metrics-server in \"kube-system\" is not present");

        let svc = json!({"spec": {"type": "ClusterIP", "ports": [{"name": "https", "port": 8443}]}});
        let a = availability(&remote(), Some(&svc), None);
        assert_eq!((a.status, a.reason), ("False", "ServicePortError"));
        assert_eq!(
            a.message,
            "service/metrics-server in \"kube-system\" is not listening on port 443"
        );

        let svc = json!({"spec": {"ports": [{"name": "https", "port": 443}]}});
        let a = availability(&remote(), Some(&svc), None);
        assert_eq!((a.status, a.reason), ("False", "EndpointsNotFound"));
        assert_eq!(
            a.message,
            "cannot find endpoints for service/metrics-server in \"kube-system\""
        );

        let empty = json!({"subsets": [{"notReadyAddresses": [{"ip": "10.0.0.1"}], "ports": [{"name": "https", "port": 4443}]}]});
        let a = availability(&remote(), Some(&svc), Some(&empty));
        assert_eq!((a.status, a.reason), ("False", "MissingEndpoints"));
        assert_eq!(
            a.message,
            "endpoints for service/metrics-server in \"kube-system\" have no addresses with port name \"https\""
        );

        let ready =
            json!({"subsets": [{"addresses": [{"ip": "10.0.0.1"}], "ports": [{"name": "https", "port": 4443}]}]});
        let a = availability(&remote(), Some(&svc), Some(&ready));
        assert_eq!((a.status, a.reason), ("True", "Passed"));

        // Only ClusterIP Services are checked for ports and endpoints.
        let external = json!({"spec": {"type": "ExternalName", "externalName": "api.example.com"}});
        assert_eq!(availability(&remote(), Some(&external), None).reason, "Passed");
    }

    #[test]
    fn the_transition_time_moves_with_the_status() {
        let a = availability(&remote(), None, None);
        let first = with_condition(&remote(), &a, "2024-01-01T00:00:00Z");
        let c = &first["status"]["conditions"][0];
        assert_eq!(c["type"], "Available");
        assert_eq!(c["lastTransitionTime"], "2024-01-01T00:00:00Z");
        // Same status, new reason: the time stays.
        let b = Availability::new("False", "EndpointsNotFound", "x".into());
        let second = with_condition(&first, &b, "2024-01-02T00:00:00Z");
        assert_eq!(
            second["status"]["conditions"][0]["lastTransitionTime"],
            "2024-01-01T00:00:00Z"
        );
        assert_eq!(second["status"]["conditions"][0]["reason"], "EndpointsNotFound");
        let t = Availability::new("True", "Passed", "all checks passed".into());
        let third = with_condition(&second, &t, "2024-01-03T00:00:00Z");
        assert_eq!(
            third["status"]["conditions"][0]["lastTransitionTime"],
            "2024-01-03T00:00:00Z"
        );
        assert_eq!(third["status"]["conditions"].as_array().map(Vec::len), Some(1));
    }
}
