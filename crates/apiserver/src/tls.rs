//! HTTPS serving and authentication of callers.
//!
//! - [`server_config`]: rustls with the cluster CA as client-certificate root. Anonymous
//!   connections are accepted (so `/readyz`, `/version` and 401 answers work) but any
//!   certificate a client presents must chain to the CA, or the handshake fails.
//! - [`identity_from_cert`]: the user a client certificate names; `serving` puts it on each
//!   request as an `Option<Identity>` extension.
//! - [`TokenAuth`]: static bearer tokens from `DIR/tokens.csv`, in the format of upstream's
//!   `--token-auth-file`. Service account tokens are checked by `serviceaccount`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

use crate::pki::{ADMIN_GROUP, ADMIN_USER, Pki};

/// An authenticated user, as upstream's `user.Info`: the certificate's CN (or token's user),
/// its uid, its groups (a certificate's O) and extra attributes (a service account token's
/// pod and credential id).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Identity {
    pub user: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
}

impl Identity {
    /// A user with groups and no uid or extra.
    pub fn new(user: &str, groups: &[&str]) -> Identity {
        Identity {
            user: user.to_string(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..Default::default()
        }
    }
}

impl skiff_rbac::Subject for Identity {
    fn name(&self) -> &str {
        &self.user
    }
    fn groups(&self) -> &[String] {
        &self.groups
    }
}

/// The rustls configuration for the API server's HTTPS port.
pub fn server_config(pki: &Pki) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());

    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pki.ca_cert_pem.as_bytes()) {
        roots
            .add(cert.context("parsing the CA certificate")?)
            .context("adding the CA certificate to the client roots")?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .context("building the client certificate verifier")?;

    let chain = CertificateDer::pem_slice_iter(pki.serving_cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .context("parsing the serving certificate")?;
    let key = PrivateKeyDer::from_pem_slice(pki.serving_key_pem.as_bytes()).context("parsing the serving key")?;

    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("choosing TLS versions")?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .context("loading the serving certificate")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The identity a client certificate asserts: CN is the user, each O a group.
/// `None` when the DER does not parse or has no CN.
pub fn identity_from_cert(der: &[u8]) -> Option<Identity> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let user = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .filter(|cn| !cn.is_empty())?
        .to_string();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .map(str::to_string)
        .collect();
    Some(Identity {
        user,
        groups,
        ..Default::default()
    })
}

/// Static bearer tokens, as upstream's `--token-auth-file`: CSV lines
/// `token,user,uid[,"group1,group2"]`.
#[derive(Clone, Default)]
pub struct TokenAuth {
    tokens: HashMap<String, Identity>,
    admin_token: Option<String>,
}

impl std::fmt::Debug for TokenAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Tokens are secrets: only their number is shown.
        f.debug_struct("TokenAuth").field("tokens", &self.tokens.len()).finish()
    }
}

impl TokenAuth {
    /// Loads `dir/tokens.csv`; on first start writes it (mode 0600) with one administrator
    /// token (user `skiff-admin`, group `skiff:cluster-admins`).
    pub fn load_or_create(dir: &Path) -> anyhow::Result<TokenAuth> {
        let path = dir.join("tokens.csv");
        if !path.exists() {
            let token = format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
            let line = format!("{token},{ADMIN_USER},{ADMIN_USER},\"{ADMIN_GROUP}\"\n");
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            crate::pki::write_file(&path, line.as_bytes(), 0o600)?;
            tracing::info!(path = %path.display(), "created the static token file");
        }
        Self::load(&path)
    }

    /// Loads a token file.
    pub fn load(path: &Path) -> anyhow::Result<TokenAuth> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("parsing token file {}", path.display()))
    }

    /// Parses the CSV text of a token file.
    pub fn parse(text: &str) -> anyhow::Result<TokenAuth> {
        let mut auth = TokenAuth::default();
        for (index, line) in text.lines().enumerate() {
            let line_no = index + 1;
            if line.trim().is_empty() {
                continue;
            }
            let record = parse_csv_line(line).with_context(|| format!("line {line_no}"))?;
            if record.len() < 3 {
                bail!(
                    "token file must have at least 3 columns (token, user name, user uid), found {} on line {line_no}",
                    record.len()
                );
            }
            let token = record[0].clone();
            if token.is_empty() {
                tracing::warn!(line = line_no, "skipping a token file line with an empty token");
                continue;
            }
            let groups = record
                .get(3)
                .map(|g| {
                    g.split(',')
                        .map(str::trim)
                        .filter(|g| !g.is_empty())
                        .map(str::to_string)
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            let identity = Identity {
                user: record[1].clone(),
                uid: record[2].clone(),
                groups,
                ..Default::default()
            };
            if auth.tokens.contains_key(&token) {
                tracing::warn!(line = line_no, "duplicate token in token file");
            }
            if auth.admin_token.is_none() && identity.groups.iter().any(|g| g == ADMIN_GROUP) {
                auth.admin_token = Some(token.clone());
            }
            auth.tokens.insert(token, identity);
        }
        Ok(auth)
    }

    /// The identity of `token`, if it is known.
    pub fn authenticate(&self, token: &str) -> Option<Identity> {
        self.tokens.get(token).cloned()
    }

    /// The identity of an `Authorization: Bearer TOKEN` header value, as upstream parses it.
    pub fn authenticate_header(&self, authorization: &str) -> Option<Identity> {
        self.authenticate(bearer_token(authorization)?)
    }

    /// The first token whose user is in the administrators' group.
    pub fn admin_token(&self) -> Option<&str> {
        self.admin_token.as_deref()
    }
}

/// The token of an `Authorization: Bearer TOKEN` header value, as upstream parses it.
pub fn bearer_token(authorization: &str) -> Option<&str> {
    let mut parts = authorization.trim().splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return None;
    }
    Some(token)
}

/// Splits one CSV record (RFC 4180 quoting; leading spaces of fields are trimmed as Go's
/// `csv.Reader{TrimLeadingSpace: true}` does).
fn parse_csv_line(line: &str) -> anyhow::Result<Vec<String>> {
    let mut fields = Vec::new();
    let mut chars = line.trim_end_matches('\r').chars().peekable();
    loop {
        while chars.next_if(|c| *c == ' ' || *c == '\t').is_some() {}
        let mut field = String::new();
        if chars.next_if_eq(&'"').is_some() {
            loop {
                match chars.next() {
                    Some('"') if chars.next_if_eq(&'"').is_some() => field.push('"'),
                    Some('"') => break,
                    Some(c) => field.push(c),
                    None => bail!("unterminated quoted field"),
                }
            }
            match chars.next() {
                None => {
                    fields.push(field);
                    return Ok(fields);
                }
                Some(',') => fields.push(field),
                Some(c) => bail!("unexpected {c:?} after a quoted field"),
            }
        } else {
            loop {
                match chars.next() {
                    None => {
                        fields.push(field);
                        return Ok(fields);
                    }
                    Some(',') => break,
                    Some('"') => bail!("bare \" in a non-quoted field"),
                    Some(c) => field.push(c),
                }
            }
            fields.push(field);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki;
    use std::net::SocketAddr;

    /// Serves `router` on `listener` for the rest of the test.
    fn serve_tls(listener: tokio::net::TcpListener, config: Arc<rustls::ServerConfig>, router: axum::Router) {
        drop(crate::serving::Serving::start(
            listener,
            config,
            router,
            &crate::serving::ServingOptions::default(),
        ));
    }

    #[test]
    fn csv_lines() {
        assert_eq!(
            parse_csv_line(r#"tok,user,uid,"a,b""#).unwrap(),
            vec!["tok", "user", "uid", "a,b"]
        );
        assert_eq!(
            parse_csv_line(r#"tok, user ,uid, "x""y""#).unwrap(),
            vec!["tok", "user ", "uid", "x\"y"]
        );
        assert_eq!(parse_csv_line("a,,c,").unwrap(), vec!["a", "", "c", ""]);
        assert!(parse_csv_line(r#"a,"b"#).is_err());
        assert!(parse_csv_line(r#"a,b"c"#).is_err());
    }

    #[test]
    fn token_file() {
        let auth =
            TokenAuth::parse("t1,alice,1,\"dev, ops\"\nt2,bob,2\n\n,nobody,3\nt3,root,4,\"skiff:cluster-admins\"\n")
                .unwrap();
        assert_eq!(
            auth.authenticate("t1"),
            Some(Identity {
                user: "alice".into(),
                uid: "1".into(),
                groups: vec!["dev".into(), "ops".into()],
                ..Default::default()
            })
        );
        assert_eq!(auth.authenticate("t2").unwrap().groups, Vec::<String>::new());
        assert_eq!(auth.authenticate(""), None);
        assert_eq!(auth.authenticate("nope"), None);
        assert_eq!(auth.admin_token(), Some("t3"));
        assert_eq!(auth.authenticate_header("Bearer t2").unwrap().user, "bob");
        assert_eq!(auth.authenticate_header("  bearer t2 ").unwrap().user, "bob");
        assert_eq!(auth.authenticate_header("Basic t2"), None);
        assert_eq!(auth.authenticate_header("Bearer"), None);
        assert!(TokenAuth::parse("only,two\n").is_err());
    }

    #[test]
    fn token_file_created_once() {
        let dir = tempfile::tempdir().unwrap();
        let first = TokenAuth::load_or_create(dir.path()).unwrap();
        let token = first.admin_token().unwrap().to_string();
        assert_eq!(token.len(), 64);
        let id = first.authenticate(&token).unwrap();
        assert_eq!(id.user, "skiff-admin");
        assert_eq!(id.groups, vec!["skiff:cluster-admins"]);
        let second = TokenAuth::load_or_create(dir.path()).unwrap();
        assert_eq!(second.admin_token(), Some(token.as_str()));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("tokens.csv"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    fn der_of(pem: &str) -> Vec<u8> {
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap().to_vec()
    }

    #[test]
    fn identity_of_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let pki = pki::load_or_create(dir.path(), &[]).unwrap();
        assert_eq!(
            identity_from_cert(&der_of(&pki.admin_cert_pem)),
            Some(Identity::new("skiff-admin", &["skiff:cluster-admins"]))
        );
        let (node_cert, _) = pki.issue_client_cert("system:node:n1", &["system:nodes"]).unwrap();
        assert_eq!(
            identity_from_cert(&der_of(&node_cert)),
            Some(Identity::new("system:node:n1", &["system:nodes"]))
        );
        let (plain, _) = pki.issue_client_cert("jane", &[]).unwrap();
        assert_eq!(
            identity_from_cert(&der_of(&plain)).unwrap().groups,
            Vec::<String>::new()
        );
        assert_eq!(identity_from_cert(b"not a certificate"), None);
    }

    // ---- end-to-end over a real socket ----

    use http_body_util::{BodyExt, Empty};

    async fn start_server(pki: &Pki) -> SocketAddr {
        let router =
            axum::Router::new().fallback(|axum::Extension(id): axum::Extension<Option<Identity>>| async move {
                match id {
                    Some(id) => format!("{}|{}", id.user, id.groups.join(",")),
                    None => "anonymous".to_string(),
                }
            });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let config = server_config(pki).unwrap();
        serve_tls(listener, config, router);
        addr
    }

    fn client_config(ca_pem: &str, client: Option<(&str, &str)>, alpn: &[&[u8]]) -> rustls::ClientConfig {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
            .unwrap();
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let mut config = match client {
            Some((cert, key)) => builder
                .with_client_auth_cert(
                    vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()],
                    PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
                )
                .unwrap(),
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        config
    }

    /// GETs `/whoami` over TLS with the given client config; returns the negotiated ALPN
    /// protocol and the body.
    async fn get(addr: SocketAddr, config: rustls::ClientConfig) -> anyhow::Result<(Vec<u8>, String)> {
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let name = rustls::pki_types::ServerName::try_from("localhost")?;
        let tls = connector.connect(name, tcp).await?;
        let alpn = tls.get_ref().1.alpn_protocol().unwrap_or_default().to_vec();
        let io = hyper_util::rt::TokioIo::new(tls);
        let req = http::Request::builder()
            .uri(format!("https://localhost:{}/whoami", addr.port()))
            .body(Empty::<bytes::Bytes>::new())?;
        let resp = if alpn == b"h2" {
            let (mut sender, conn) =
                hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io).await?;
            tokio::spawn(conn);
            sender.send_request(req).await?
        } else {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await?;
            tokio::spawn(conn);
            sender.send_request(req).await?
        };
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((alpn, String::from_utf8(body.to_vec())?))
    }

    #[tokio::test]
    async fn serve_tls_identifies_clients() {
        let dir = tempfile::tempdir().unwrap();
        let pki = pki::load_or_create(dir.path(), &[]).unwrap();
        let addr = start_server(&pki).await;

        // The admin certificate, over HTTP/2.
        let admin = client_config(
            &pki.ca_cert_pem,
            Some((&pki.admin_cert_pem, &pki.admin_key_pem)),
            &[b"h2", b"http/1.1"],
        );
        let (alpn, body) = get(addr, admin).await.unwrap();
        assert_eq!(alpn, b"h2");
        assert_eq!(body, "skiff-admin|skiff:cluster-admins");

        // A node certificate, over HTTP/1.1.
        let (cert, key) = pki.issue_client_cert("system:node:n1", &["system:nodes"]).unwrap();
        let node = client_config(&pki.ca_cert_pem, Some((&cert, &key)), &[b"http/1.1"]);
        let (alpn, body) = get(addr, node).await.unwrap();
        assert_eq!(alpn, b"http/1.1");
        assert_eq!(body, "system:node:n1|system:nodes");

        // No certificate and no ALPN at all: anonymous HTTP/1.1.
        let anonymous = client_config(&pki.ca_cert_pem, None, &[]);
        let (alpn, body) = get(addr, anonymous).await.unwrap();
        assert_eq!(alpn, b"");
        assert_eq!(body, "anonymous");

        // A certificate from another CA is refused during the handshake.
        let other_dir = tempfile::tempdir().unwrap();
        let other = pki::load_or_create(other_dir.path(), &[]).unwrap();
        let foreign = client_config(
            &pki.ca_cert_pem,
            Some((&other.admin_cert_pem, &other.admin_key_pem)),
            &[b"h2"],
        );
        assert!(get(addr, foreign).await.is_err());

        // The server survives all of that, and garbage on the socket.
        let mut raw = tokio::net::TcpStream::connect(addr).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut raw, b"GET / HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        drop(raw);
        let again = client_config(&pki.ca_cert_pem, None, &[b"h2"]);
        assert_eq!(get(addr, again).await.unwrap().1, "anonymous");
    }

    /// Runs the real kubectl against a test server.
    #[tokio::test]
    async fn kubectl_talks_to_serve_tls() {
        let dir = tempfile::tempdir().unwrap();
        let pki = pki::load_or_create(dir.path(), &[]).unwrap();
        let router = axum::Router::new()
            .route(
                "/version",
                axum::routing::get(|| async {
                    axum::Json(serde_json::json!({
                        "major": "1", "minor": "33", "gitVersion": "v1.33.0",
                        "platform": "linux/amd64"
                    }))
                }),
            )
            .fallback(
                |axum::Extension(id): axum::Extension<Option<Identity>>, req: axum::extract::Request| async move {
                    format!(
                        "{} {:?} {}",
                        id.map(|i| format!("{}|{}", i.user, i.groups.join(",")))
                            .unwrap_or_default(),
                        req.version(),
                        req.uri().path()
                    )
                },
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        serve_tls(listener, server_config(&pki).unwrap(), router);

        let kubeconfig = dir.path().join("kubeconfig");
        pki.write_kubeconfig(
            &kubeconfig,
            &format!("https://127.0.0.1:{}", addr.port()),
            &pki.admin_cert_pem,
            &pki.admin_key_pem,
        )
        .unwrap();
        let home = tempfile::tempdir().unwrap();
        let out = tokio::process::Command::new("kubectl")
            .env("HOME", home.path())
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["get", "--raw", "/anything"])
            .output()
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "kubectl failed: {stderr}");
        assert_eq!(
            stdout.trim(),
            "skiff-admin|skiff:cluster-admins HTTP/2.0 /anything",
            "{stderr}"
        );
    }

    /// `kubectl exec` opens a WebSocket (`v5.channel.k8s.io`); it must come over HTTP/1.1 with
    /// an upgrade.
    #[tokio::test]
    async fn kubectl_exec_websocket() {
        use axum::extract::ws::{Message, WebSocketUpgrade};
        let dir = tempfile::tempdir().unwrap();
        let pki = pki::load_or_create(dir.path(), &[]).unwrap();
        let versions = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let seen = versions.clone();
        let router = axum::Router::new()
            .route(
                "/version",
                axum::routing::get(|| async {
                    axum::Json(serde_json::json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0"}))
                }),
            )
            .route(
                "/api",
                axum::routing::get(|| async {
                    axum::Json(serde_json::json!({"kind": "APIVersions", "versions": ["v1"],
                        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}))
                }),
            )
            .route(
                "/apis",
                axum::routing::get(|| async {
                    axum::Json(serde_json::json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []}))
                }),
            )
            .route(
                "/api/v1",
                axum::routing::get(|| async {
                    axum::Json(
                        serde_json::json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
                            {"name": "pods", "singularName": "pod", "namespaced": true, "kind": "Pod",
                             "verbs": ["get", "list"], "shortNames": ["po"]},
                            {"name": "pods/exec", "singularName": "", "namespaced": true, "kind": "PodExecOptions",
                             "verbs": ["create", "get"]}
                        ]}),
                    )
                }),
            )
            .route(
                "/api/v1/namespaces/default/pods/p1",
                axum::routing::get(|| async {
                    axum::Json(serde_json::json!({
                        "kind": "Pod", "apiVersion": "v1",
                        "metadata": {"name": "p1", "namespace": "default"},
                        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
                        "status": {"phase": "Running"}
                    }))
                }),
            )
            .route(
                "/api/v1/namespaces/default/pods/p1/exec",
                axum::routing::get(move |req: axum::extract::Request| async move {
                    seen.lock().push(req.version());
                    let (mut parts, _) = req.into_parts();
                    let ws = match <WebSocketUpgrade as axum::extract::FromRequestParts<()>>::from_request_parts(
                        &mut parts,
                        &(),
                    )
                    .await
                    {
                        Ok(ws) => ws,
                        Err(rejection) => return axum::response::IntoResponse::into_response(rejection),
                    };
                    ws.protocols(["v5.channel.k8s.io"]).on_upgrade(|mut socket| async move {
                        let _ = socket.send(Message::Binary(b"\x01hello\n".to_vec().into())).await;
                        let status = br#"{"metadata":{},"status":"Success"}"#;
                        let mut frame = vec![3u8];
                        frame.extend_from_slice(status);
                        let _ = socket.send(Message::Binary(frame.into())).await;
                        // A close without a status code (1005) is an error to kubectl.
                        let close = axum::extract::ws::CloseFrame {
                            code: axum::extract::ws::close_code::NORMAL,
                            reason: "".into(),
                        };
                        let _ = socket.send(Message::Close(Some(close))).await;
                    })
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        serve_tls(listener, server_config(&pki).unwrap(), router);

        let kubeconfig = dir.path().join("kubeconfig");
        pki.write_kubeconfig(
            &kubeconfig,
            &format!("https://127.0.0.1:{}", addr.port()),
            &pki.admin_cert_pem,
            &pki.admin_key_pem,
        )
        .unwrap();
        let home = tempfile::tempdir().unwrap();
        let out = tokio::process::Command::new("kubectl")
            .env("HOME", home.path())
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["exec", "p1", "--", "echo", "hello"])
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "kubectl failed: {stderr}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n", "{stderr}");
        assert_eq!(*versions.lock(), vec![http::Version::HTTP_11]);
    }
}
