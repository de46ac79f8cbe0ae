//! Joining a cluster with a token, as the kubelet's TLS bootstrap
//! (`pkg/kubelet/certificate/bootstrap`) with k3s's CA pinning:
//!
//! 1. the CA: `kube-public/cluster-info` is read anonymously without verifying TLS, and its CA
//!    (the kubeconfig's `certificate-authority-data`) must hash to the join token's SHA-256;
//!    from then on the API server is verified with that CA and nothing else;
//! 2. the identity: an ECDSA P-256 key, and a CertificateSigningRequest for
//!    `CN=system:node:NAME, O=system:nodes` (signer
//!    `kubernetes.io/kube-apiserver-client-kubelet`, usages digital signature and client auth)
//!    posted with the token's `ID.SECRET` as bearer token; the approver approves it for a valid
//!    token and the signer issues the certificate, which is waited for;
//! 3. the files, under the data dir: `pki/ca.crt`, `pki/kubelet-client-current.pem` (the
//!    certificate then the key, mode 0600, replaced atomically, as the kubelet's) and
//!    `kubelet.kubeconfig` (mode 0600) for the node's identity.
//!
//! A later start with a node certificate that is still valid for this node and CA uses it
//! without the token. [`crate::certificate_manager`] renews it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD as BASE64, URL_SAFE_NO_PAD};
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::PostParams;
use skiff_api::bootstraptoken::{self as bt, JoinToken};
use skiff_api::certificates as capi;

/// How long a certificate request may wait for its certificate.
const WAIT_FOR_CERTIFICATE: Duration = Duration::from_secs(15 * 60);

/// Where a joined node keeps its identity.
#[derive(Clone, Debug)]
pub struct Paths {
    pub ca: PathBuf,
    /// The certificate then the key (PEM), mode 0600.
    pub client_pem: PathBuf,
    pub kubeconfig: PathBuf,
}

impl Paths {
    pub fn new(data_dir: &Path) -> Paths {
        Paths {
            ca: data_dir.join("pki").join("ca.crt"),
            client_pem: data_dir.join("pki").join("kubelet-client-current.pem"),
            kubeconfig: data_dir.join("kubelet.kubeconfig"),
        }
    }
}

/// A joined node's identity: the server, the CA it verifies, and its client certificate.
#[derive(Clone)]
pub struct Identity {
    pub server: String,
    pub node_name: String,
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("server", &self.server)
            .field("node_name", &self.node_name)
            .finish_non_exhaustive()
    }
}

/// The validity of a PEM certificate (the first block), as Unix seconds.
pub fn validity(cert_pem: &str) -> anyhow::Result<(i64, i64)> {
    let block = x509_parser::pem::Pem::iter_from_buffer(cert_pem.as_bytes())
        .next()
        .context("no PEM block")?
        .context("parsing PEM")?;
    let (_, cert) = x509_parser::parse_x509_certificate(&block.contents).context("parsing the certificate")?;
    Ok((
        cert.validity().not_before.timestamp(),
        cert.validity().not_after.timestamp(),
    ))
}

/// The common name of a PEM certificate.
fn common_name(cert_pem: &str) -> Option<String> {
    let block = x509_parser::pem::Pem::iter_from_buffer(cert_pem.as_bytes())
        .next()?
        .ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&block.contents).ok()?;
    let cn = cert.subject().iter_common_name().next()?.as_str().ok()?.to_string();
    Some(cn)
}

impl Identity {
    /// The kubeconfig for this identity (CA, certificate and key embedded).
    pub fn kubeconfig_yaml(&self) -> String {
        kubeconfig_yaml(
            &self.server,
            &self.ca_pem,
            &format!(
                "client-certificate-data: {}\n    client-key-data: {}",
                BASE64.encode(&self.cert_pem),
                BASE64.encode(&self.key_pem)
            ),
        )
    }

    /// A client calling the API server as this node.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        client_from_yaml(&self.kubeconfig_yaml()).await
    }

    /// The client configuration of this node (its server, CA and certificate).
    pub async fn config(&self) -> anyhow::Result<kube::Config> {
        config_from_yaml(&self.kubeconfig_yaml()).await
    }

    /// Whether the certificate names this node and is valid for at least another minute.
    fn usable(&self, now: i64) -> bool {
        let for_node = common_name(&self.cert_pem).as_deref()
            == Some(format!("{}{}", capi::NODE_USER_PREFIX, self.node_name).as_str());
        for_node && validity(&self.cert_pem).is_ok_and(|(_, end)| end - now > 60)
    }

    /// Writes the certificate and key (one file, replaced atomically), the CA and the kubeconfig.
    pub fn save(&self, paths: &Paths) -> anyhow::Result<()> {
        if let Some(dir) = paths.client_pem.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        write_file(&paths.ca, self.ca_pem.as_bytes(), 0o644)?;
        let pem = format!("{}{}", ensure_newline(&self.cert_pem), ensure_newline(&self.key_pem));
        write_file(&paths.client_pem, pem.as_bytes(), 0o600)?;
        write_file(&paths.kubeconfig, self.kubeconfig_yaml().as_bytes(), 0o600)
    }

    /// The identity saved under `paths`, if its files are there and readable.
    pub fn load(paths: &Paths, server: &str, node_name: &str) -> Option<Identity> {
        let ca_pem = std::fs::read_to_string(&paths.ca).ok()?;
        let pem = std::fs::read_to_string(&paths.client_pem).ok()?;
        let (mut cert, mut key) = (String::new(), String::new());
        for block in x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes()) {
            let block = block.ok()?;
            let text = pem_block(&block.label, &block.contents);
            if block.label == "CERTIFICATE" {
                cert.push_str(&text);
            } else if block.label.ends_with("PRIVATE KEY") {
                key.push_str(&text);
            }
        }
        (!cert.is_empty() && !key.is_empty()).then(|| Identity {
            server: server.to_string(),
            node_name: node_name.to_string(),
            ca_pem,
            cert_pem: cert,
            key_pem: key,
        })
    }
}

fn ensure_newline(s: &str) -> String {
    if s.ends_with('\n') {
        s.to_string()
    } else {
        format!("{s}\n")
    }
}

fn pem_block(label: &str, der: &[u8]) -> String {
    let b64 = BASE64.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

fn kubeconfig_yaml(server: &str, ca_pem: &str, user: &str) -> String {
    // A JSON string is a valid YAML scalar.
    let server = serde_json::to_string(server).unwrap_or_default();
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: skiff
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: skiff
  user:
    {user}
contexts:
- name: skiff
  context:
    cluster: skiff
    user: skiff
current-context: skiff
",
        ca = BASE64.encode(ca_pem),
    )
}

async fn config_from_yaml(yaml: &str) -> anyhow::Result<kube::Config> {
    let kc = kube::config::Kubeconfig::from_yaml(yaml).context("reading the generated kubeconfig")?;
    kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .context("loading the generated kubeconfig")
}

async fn client_from_yaml(yaml: &str) -> anyhow::Result<kube::Client> {
    kube::Client::try_from(config_from_yaml(yaml).await?).context("building the API client")
}

/// Writes `data` to `path` through a temporary file and a rename, with `mode`.
pub fn write_file(path: &Path, data: &[u8], mode: u32) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut tmp = path.as_os_str().to_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    file.write_all(data)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}

/// What `skiff agent --server URL --token TOKEN` joins with.
#[derive(Clone, Debug)]
pub struct Join {
    pub server: String,
    pub token: Option<String>,
    pub node_name: String,
    pub data_dir: PathBuf,
}

/// The node's identity: the saved one while it is valid, else a new one through the token.
pub async fn join(j: &Join) -> anyhow::Result<Identity> {
    let paths = Paths::new(&j.data_dir);
    let now = jiff::Timestamp::now().as_second();
    if let Some(id) = Identity::load(&paths, &j.server, &j.node_name)
        && id.usable(now)
    {
        tracing::info!(path = %paths.client_pem.display(), "using the node certificate in the data dir");
        // The kubeconfig follows the server given now.
        id.save(&paths)?;
        return Ok(id);
    }
    let Some(token) = &j.token else {
        bail!(
            "no valid node certificate in {} and no --token to ask for one",
            paths.client_pem.display()
        );
    };
    let token = JoinToken::parse(token).map_err(|e| anyhow::anyhow!("--token: {e}"))?;
    let progress = crate::progress::Progress::start(format!("joining {} as node {}", j.server, j.node_name));
    let ca_pem = fetch_ca(&j.server, &token).await?;
    let bootstrap = client_from_yaml(&kubeconfig_yaml(
        &j.server,
        &ca_pem,
        &format!("token: {}", serde_json::to_string(&token.bearer()).unwrap_or_default()),
    ))
    .await?;
    let (cert_pem, key_pem) = request_certificate(&bootstrap, &j.node_name, true)
        .await
        .map_err(|e| match e.downcast_ref::<kube::Error>() {
            Some(kube::Error::Api(s)) if s.code == 401 => anyhow::anyhow!(
                "the server refused the join token ({} {}): it is wrong, expired or deleted",
                s.code,
                s.message
            ),
            _ => e,
        })?;
    let id = Identity {
        server: j.server.clone(),
        node_name: j.node_name.clone(),
        ca_pem,
        cert_pem,
        key_pem,
    };
    id.save(&paths)?;
    progress.done(&format!("node certificate in {}", paths.client_pem.display()));
    Ok(id)
}

/// The cluster CA from `kube-public/cluster-info`, read without verifying TLS and accepted only
/// when it hashes to the token's SHA-256.
pub async fn fetch_ca(server: &str, token: &JoinToken) -> anyhow::Result<String> {
    let url: http::Uri = server
        .parse()
        .with_context(|| format!("--server {server:?} is not a URL"))?;
    let mut config = kube::Config::new(url);
    config.accept_invalid_certs = true;
    let anonymous = kube::Client::try_from(config).context("building the anonymous client")?;
    let cm = Api::<ConfigMap>::namespaced(anonymous, bt::CLUSTER_INFO_NAMESPACE)
        .get(bt::CLUSTER_INFO_NAME)
        .await
        .with_context(|| {
            format!(
                "reading {}/{} from {server}",
                bt::CLUSTER_INFO_NAMESPACE,
                bt::CLUSTER_INFO_NAME
            )
        })?;
    let ca = cluster_info_ca(&cm)?;
    let hash = bt::ca_hash(&ca);
    if hash != token.ca_hash {
        bail!(
            "the server's CA (sha256 {hash}) is not the one the join token names ({}): refusing to trust {server}",
            token.ca_hash
        );
    }
    String::from_utf8(ca).context("cluster-info's CA is not text")
}

/// The CA (PEM bytes) the `cluster-info` ConfigMap's kubeconfig carries.
pub fn cluster_info_ca(cm: &ConfigMap) -> anyhow::Result<Vec<u8>> {
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get(bt::CLUSTER_INFO_KUBECONFIG_KEY))
        .context("cluster-info has no kubeconfig")?;
    let kc = kube::config::Kubeconfig::from_yaml(text).context("parsing cluster-info's kubeconfig")?;
    let data = kc
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.certificate_authority_data.clone())
        .context("cluster-info's kubeconfig has no certificate-authority-data")?;
    BASE64.decode(data.trim()).context("decoding cluster-info's CA")
}

/// upstream's `digestedName`: the bootstrap request's name follows from its key, subject and
/// usages, so a restarted bootstrap finds its own request again.
fn digested_name(public_key_der: &[u8], cn: &str, usages: &[String]) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha512::new();
    let mut field = |b: &[u8]| {
        h.update(b);
        h.update([b'|']);
    };
    field(public_key_der);
    field(cn.as_bytes());
    field(capi::NODES_GROUP.as_bytes());
    for u in usages {
        field(u.as_bytes());
    }
    format!("node-csr-{}", URL_SAFE_NO_PAD.encode(h.finalize()))
}

/// Posts a node client certificate request with `client` and waits for its certificate:
/// `(cert_pem, key_pem)`. The first request is named after its digest (as the kubelet's
/// bootstrap); renewals are `csr-XXXXX` (generateName, as its certificate manager).
pub async fn request_certificate(
    client: &kube::Client,
    node_name: &str,
    first: bool,
) -> anyhow::Result<(String, String)> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).context("generating a key")?;
    let cn = format!("{}{node_name}", capi::NODE_USER_PREFIX);
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name.push(rcgen::DnType::CommonName, cn.clone());
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, capi::NODES_GROUP);
    let request = params
        .serialize_request(&key)
        .context("making the certificate request")?
        .pem()
        .context("encoding the certificate request")?;
    let usages = vec!["digital signature".to_string(), "client auth".to_string()];
    let mut csr = CertificateSigningRequest {
        spec: CertificateSigningRequestSpec {
            request: ByteString(request.into_bytes()),
            signer_name: capi::KUBE_APISERVER_CLIENT_KUBELET_SIGNER.into(),
            usages: Some(usages.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    if first {
        csr.metadata.name = Some(digested_name(key.public_key_pem().as_bytes(), &cn, &usages));
    } else {
        csr.metadata.generate_name = Some("csr-".into());
    }
    let api = Api::<CertificateSigningRequest>::all(client.clone());
    let created = api
        .create(&PostParams::default(), &csr)
        .await
        .context("posting the certificate signing request")?;
    let name = created.metadata.name.clone().unwrap_or_default();
    let mut progress = crate::progress::Progress::start(format!(
        "posted certificate signing request {name}; waiting for its certificate"
    ));
    let deadline = tokio::time::Instant::now() + WAIT_FOR_CERTIFICATE;
    loop {
        progress.tick(|| format!("certificate signing request {name} is not approved and signed yet"));
        let csr = api
            .get(&name)
            .await
            .context("reading the certificate signing request")?;
        let json = serde_json::to_value(&csr).context("encoding the request")?;
        if capi::has_true_condition(&json, capi::DENIED) {
            bail!("certificate signing request {name} was denied");
        }
        if capi::has_true_condition(&json, capi::FAILED) {
            let why = csr
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .find(|c| c.type_ == capi::FAILED)
                .and_then(|c| c.message)
                .unwrap_or_default();
            bail!("certificate signing request {name} failed: {why}");
        }
        if let Some(cert) = capi::issued_certificate(&json) {
            let cert = String::from_utf8(cert).context("the issued certificate is not text")?;
            progress.done("issued");
            return Ok((cert, key.serialize_pem()));
        }
        if tokio::time::Instant::now() > deadline {
            bail!("certificate signing request {name} was not issued within {WAIT_FOR_CERTIFICATE:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn self_signed(cn: &str, days: i64) -> (String, String) {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let now = time_now();
        params.not_before = now - time::Duration::days(1);
        params.not_after = now + time::Duration::days(days);
        (params.self_signed(&key).unwrap().pem(), key.serialize_pem())
    }

    fn time_now() -> time::OffsetDateTime {
        time::OffsetDateTime::from_unix_timestamp(jiff::Timestamp::now().as_second()).unwrap()
    }

    #[test]
    fn a_saved_identity_is_reused_while_valid_for_its_node() {
        let dir = tempfile::tempdir().unwrap();
        let paths = Paths::new(dir.path());
        let (cert_pem, key_pem) = self_signed("system:node:n1", 10);
        let id = Identity {
            server: "https://127.0.0.1:6443".into(),
            node_name: "n1".into(),
            ca_pem: cert_pem.clone(),
            cert_pem,
            key_pem,
        };
        id.save(&paths).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&paths.client_pem), 0o600);
        assert_eq!(mode(&paths.kubeconfig), 0o600);
        let back = Identity::load(&paths, "https://127.0.0.1:6443", "n1").unwrap();
        assert_eq!(back.cert_pem, id.cert_pem);
        assert_eq!(back.key_pem.trim(), id.key_pem.trim());
        let now = jiff::Timestamp::now().as_second();
        assert!(back.usable(now));
        let other = Identity::load(&paths, "https://127.0.0.1:6443", "n2").unwrap();
        assert!(!other.usable(now), "another node's certificate");
        assert!(!back.usable(now + 11 * 86400), "expired");
        let kc = kube::config::Kubeconfig::from_yaml(&std::fs::read_to_string(&paths.kubeconfig).unwrap()).unwrap();
        assert_eq!(
            kc.clusters[0].cluster.as_ref().unwrap().server.as_deref(),
            Some("https://127.0.0.1:6443")
        );
    }

    #[test]
    fn bootstrap_requests_are_named_after_their_digest() {
        let a = digested_name(b"key", "system:node:n1", &["client auth".into()]);
        assert!(a.starts_with("node-csr-"));
        assert_eq!(a, digested_name(b"key", "system:node:n1", &["client auth".into()]));
        assert_ne!(a, digested_name(b"key2", "system:node:n1", &["client auth".into()]));
    }
}
