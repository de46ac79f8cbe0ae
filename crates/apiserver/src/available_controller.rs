//! The `Available` condition of every APIService, as upstream's kube-aggregator availability
//! controllers (`pkg/controllers/status/local` and `.../remote`) set it:
//!
//! - a local APIService (no `spec.service`) is `True`, reason `Local`;
//! - one whose Service does not exist is `False`, `ServiceNotFound`;
//! - one whose ClusterIP Service has no port `spec.service.port` is `False`, `ServicePortError`;
//! - one whose Service has no Endpoints object is `False`, `EndpointsNotFound`, and one whose
//!   Endpoints have no address with the port's name `False`, `MissingEndpoints`;
//! - one whose discovery document (`GET /apis/GROUP/VERSION`, `/api/v1` for `v1.`) cannot be
//!   read over HTTPS from a ready endpoint of the Service (upstream's
//!   `--enable-aggregator-routing` path; certificates are not verified, as upstream does not
//!   verify them here) is `False`, `FailedDiscoveryCheck`;
//! - otherwise `True`, `Passed`.
//!
//! Skiff does not proxy requests to aggregated API servers: the condition is all it reports.

use std::sync::Arc;
use std::time::Duration;

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

/// Where the discovery check goes: the first ready address of the Endpoints with the port
/// named as the Service port `spec.service.port` is, and that port's number.
pub fn discovery_target(api_service: &Value, service: &Value, endpoints: &Value) -> Option<(String, u16)> {
    let port = api_service
        .pointer("/spec/service/port")
        .and_then(Value::as_i64)
        .unwrap_or(443);
    let port_name = service
        .pointer("/spec/ports")
        .and_then(Value::as_array)?
        .iter()
        .find(|p| p.get("port").and_then(Value::as_i64) == Some(port))?
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("");
    endpoints
        .get("subsets")
        .and_then(Value::as_array)?
        .iter()
        .find_map(|s| {
            let ip = s.pointer("/addresses/0/ip").and_then(Value::as_str)?;
            let target = s
                .get("ports")
                .and_then(Value::as_array)?
                .iter()
                .find(|p| p.get("name").and_then(Value::as_str).unwrap_or("") == port_name)?
                .get("port")
                .and_then(Value::as_u64)
                .and_then(|p| u16::try_from(p).ok())?;
            Some((ip.to_string(), target))
        })
}

/// upstream's discovery check: a GET of the group version's discovery document that must
/// answer 2xx or 3xx within five seconds. The error is upstream's condition message.
pub async fn discovery_check(api_service: &Value, host: &str, port: u16) -> Result<(), String> {
    let path = if objects::name(api_service) == "v1." {
        format!(
            "/api/{}",
            api_service
                .pointer("/spec/version")
                .and_then(Value::as_str)
                .unwrap_or("")
        )
    } else {
        format!(
            "/apis/{}/{}",
            api_service.pointer("/spec/group").and_then(Value::as_str).unwrap_or(""),
            api_service
                .pointer("/spec/version")
                .and_then(Value::as_str)
                .unwrap_or("")
        )
    };
    let addr = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let url = format!("https://{addr}{path}");
    let failing = |why: String| format!("failing or missing response from {url}: Get {url:?}: {why}");
    let attempt = async {
        let tcp = tokio::net::TcpStream::connect((host, port)).await.map_err(|e| {
            let why = match e.kind() {
                std::io::ErrorKind::ConnectionRefused => "connect: connection refused".to_string(),
                _ => e.to_string(),
            };
            failing(format!("dial tcp {addr}: {why}"))
        })?;
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| failing(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(std::sync::Arc::new(crate::proxy::PinVerifier::any(provider)))
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let name = rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|e| failing(e.to_string()))?;
        let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
            .connect(name, tcp)
            .await
            .map_err(|e| failing(e.to_string()))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| failing(e.to_string()))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "discovery check connection ended");
            }
        });
        let req = http::Request::builder()
            .method("GET")
            .uri(&path)
            .header(http::header::HOST, &addr)
            .header(http::header::ACCEPT, "application/json")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .map_err(|e| failing(e.to_string()))?;
        let resp = sender.send_request(req).await.map_err(|e| failing(e.to_string()))?;
        let code = resp.status().as_u16();
        if !(200..400).contains(&code) {
            return Err(format!("bad status from {url}: {code}"));
        }
        Ok(())
    };
    match tokio::time::timeout(Duration::from_secs(5), attempt).await {
        Ok(r) => r,
        Err(_) => Err(format!("timed out waiting for {url}")),
    }
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
        let mut a = availability(&api_service, svc.as_ref(), eps.as_ref());
        if a.reason == "Passed"
            && let (Some(svc), Some(eps)) = (svc.as_ref(), eps.as_ref())
            && let Some((host, port)) = discovery_target(&api_service, svc, eps)
            && let Err(message) = discovery_check(&api_service, &host, port).await
        {
            a = Availability::new("False", "FailedDiscoveryCheck", message);
        }
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
        let mut triggers = crate::resync::Triggers::new(
            store.clone(),
            prefixes.to_vec(),
            Duration::from_secs(30),
            "APIService availability",
        );
        loop {
            triggers.next().await;
            if let Err(e) = sync(&*store).await {
                tracing::warn!(error = %e, "checking APIService availability failed");
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
    fn the_discovery_check_goes_to_a_ready_endpoint_of_the_named_port() {
        let svc = json!({"spec": {"ports": [{"name": "https", "port": 443, "targetPort": 4443}]}});
        let eps = json!({"subsets": [
            {"notReadyAddresses": [{"ip": "10.0.0.9"}], "ports": [{"name": "https", "port": 4443}]},
            {"addresses": [{"ip": "10.0.0.1"}], "ports": [{"name": "metrics", "port": 9090}, {"name": "https", "port": 4443}]}]});
        assert_eq!(
            discovery_target(&remote(), &svc, &eps),
            Some(("10.0.0.1".to_string(), 4443))
        );
    }

    /// A TLS server with a self-signed certificate answering `code` for `path`, 404 otherwise.
    async fn discovery_server(path: &'static str, code: u16) -> u16 {
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .expect("params")
            .self_signed(&key)
            .expect("cert");
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).expect("key der"),
            )
            .expect("config");
        let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else { return };
                    let service =
                        hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| async move {
                            let status = if req.uri().path() == path { code } else { 404 };
                            http::Response::builder()
                                .status(status)
                                .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
                        });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        port
    }

    #[tokio::test]
    async fn the_discovery_check_in_upstream_words() {
        let ok = discovery_server("/apis/metrics.k8s.io/v1beta1", 200).await;
        assert_eq!(discovery_check(&remote(), "127.0.0.1", ok).await, Ok(()));
        let failing = discovery_server("/apis/metrics.k8s.io/v1beta1", 503).await;
        assert_eq!(
            discovery_check(&remote(), "127.0.0.1", failing).await,
            Err(format!(
                "bad status from https://127.0.0.1:{failing}/apis/metrics.k8s.io/v1beta1: 503"
            ))
        );
        // Nothing listening.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let url = format!("https://127.0.0.1:{closed}/apis/metrics.k8s.io/v1beta1");
        assert_eq!(
            discovery_check(&remote(), "127.0.0.1", closed).await,
            Err(format!(
                "failing or missing response from {url}: Get {url:?}: dial tcp 127.0.0.1:{closed}: connect: connection refused"
            ))
        );
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
