//! The cluster's certificate authority and the certificates issued from it.
//!
//! On first start [`Pki::load_or_create`] creates, under `DIR/pki/`:
//! - `ca.crt` / `ca.key`: a self-signed CA (10 years), the root every component trusts;
//! - `apiserver.crt` / `apiserver.key`: the serving certificate for `127.0.0.1`, `::1`,
//!   `localhost`, the host name and any extra names given;
//! - `admin.crt` / `admin.key`: the administrator's client certificate
//!   `CN=skiff-admin, O=skiff:cluster-admins`, a group the bootstrap policy binds to
//!   `cluster-admin` (as kubeadm's `admin.conf`), so RBAC governs it like any user;
//! - `super-admin.crt` / `super-admin.key`: the break-glass certificate
//!   `CN=skiff-super-admin, O=system:masters`, which no authorizer is asked about (kubeadm's
//!   `super-admin.conf`);
//! - `apiserver-kubelet-client.crt` / `.key`: `CN=kube-apiserver-kubelet-client`, the certificate
//!   the API server calls node agents with (logs, exec, attach, port-forward); agents answer no
//!   other, so no user reaches a pod through an agent without the API server's authorization;
//! - `sa.key`: the ECDSA P-256 key (PKCS#8) that signs service account tokens (kubeadm's
//!   `sa.key`), independent of the CA: a new CA does not invalidate issued tokens.
//!
//! Later starts reuse them. Leaf certificates are issued again when they are not signed by
//! the current CA, expire within 30 days, or (serving certificate) lack a requested name.
//! Private keys are written with mode 0600.

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use x509_parser::extensions::GeneralName;

/// Validity of the CA, in days.
const CA_DAYS: i64 = 3650;
/// Validity of leaf (serving and client) certificates, in days.
const LEAF_DAYS: i64 = 365;
/// Leaf certificates closer than this to expiry are issued again on start.
const RENEW_BEFORE_SECONDS: i64 = 30 * 24 * 3600;

/// User name of the administrator's client certificate.
pub const ADMIN_USER: &str = "skiff-admin";
/// Group of the administrator, bound to `cluster-admin` by the bootstrap policy.
pub const ADMIN_GROUP: &str = "skiff:cluster-admins";
/// User name of the break-glass certificate.
pub const SUPER_ADMIN_USER: &str = "skiff-super-admin";
/// The group no authorizer is asked about.
pub const SUPER_ADMIN_GROUP: &str = "system:masters";
/// The user of the certificate the API server calls node agents with (the only one they serve).
pub const KUBELET_CLIENT_USER: &str = "kube-apiserver-kubelet-client";

/// The CA and the certificates the API server needs, all PEM encoded.
#[derive(Clone)]
pub struct Pki {
    pub ca_cert_pem: String,
    pub ca_key_pem: String,
    pub serving_cert_pem: String,
    pub serving_key_pem: String,
    pub admin_cert_pem: String,
    pub admin_key_pem: String,
    pub super_admin_cert_pem: String,
    pub super_admin_key_pem: String,
    pub kubelet_client_cert_pem: String,
    pub kubelet_client_key_pem: String,
    /// The service account token signing key (PKCS#8 PEM).
    pub service_account_key_pem: String,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Keys stay out of logs.
        f.debug_struct("Pki").finish_non_exhaustive()
    }
}

struct Paths {
    ca_cert: PathBuf,
    ca_key: PathBuf,
    serving_cert: PathBuf,
    serving_key: PathBuf,
    admin_cert: PathBuf,
    admin_key: PathBuf,
    super_admin_cert: PathBuf,
    super_admin_key: PathBuf,
    kubelet_client_cert: PathBuf,
    kubelet_client_key: PathBuf,
    service_account_key: PathBuf,
}

impl Paths {
    fn new(dir: &Path) -> Self {
        let pki = dir.join("pki");
        Paths {
            ca_cert: pki.join("ca.crt"),
            ca_key: pki.join("ca.key"),
            serving_cert: pki.join("apiserver.crt"),
            serving_key: pki.join("apiserver.key"),
            admin_cert: pki.join("admin.crt"),
            admin_key: pki.join("admin.key"),
            super_admin_cert: pki.join("super-admin.crt"),
            super_admin_key: pki.join("super-admin.key"),
            kubelet_client_cert: pki.join("apiserver-kubelet-client.crt"),
            kubelet_client_key: pki.join("apiserver-kubelet-client.key"),
            service_account_key: pki.join("sa.key"),
        }
    }
}

/// Loads the PKI from `dir/pki`, creating or renewing what is missing.
///
/// `hostnames` are extra DNS names or IP addresses for the serving certificate.
pub fn load_or_create(dir: &Path, hostnames: &[String]) -> anyhow::Result<Pki> {
    let paths = Paths::new(dir);
    let pki_dir = dir.join("pki");
    fs::create_dir_all(&pki_dir).with_context(|| format!("creating {}", pki_dir.display()))?;

    let (ca_cert_pem, ca_key_pem, ca_created) = match (read_opt(&paths.ca_cert)?, read_opt(&paths.ca_key)?) {
        (Some(cert), Some(key)) => (cert, key, false),
        (None, None) => {
            let (cert, key) = generate_ca()?;
            write_file(&paths.ca_key, key.as_bytes(), 0o600)?;
            write_file(&paths.ca_cert, cert.as_bytes(), 0o644)?;
            tracing::info!(path = %paths.ca_cert.display(), "created cluster CA");
            (cert, key, true)
        }
        _ => bail!(
            "only one of {} and {} exists; restore the other or remove both to create a new CA",
            paths.ca_cert.display(),
            paths.ca_key.display()
        ),
    };
    let ca_key = KeyPair::from_pem(&ca_key_pem).context("parsing the CA key")?;
    let issuer = Issuer::from_ca_cert_pem(&ca_cert_pem, ca_key).context("parsing the CA certificate")?;
    let ca_subject = subject_raw(&ca_cert_pem).context("parsing the CA certificate")?;

    let names = serving_names(hostnames);
    let (serving_cert_pem, serving_key_pem) = load_or_issue(
        &paths.serving_cert,
        &paths.serving_key,
        ca_created,
        &ca_subject,
        |cert| covers_names(cert, &names),
        || issue_serving(&issuer, &names),
    )?;
    let (admin_cert_pem, admin_key_pem) = load_or_issue(
        &paths.admin_cert,
        &paths.admin_key,
        ca_created,
        &ca_subject,
        |cert| names_user(cert, ADMIN_USER, ADMIN_GROUP),
        || issue_client(&issuer, ADMIN_USER, &[ADMIN_GROUP]),
    )?;
    let (super_admin_cert_pem, super_admin_key_pem) = load_or_issue(
        &paths.super_admin_cert,
        &paths.super_admin_key,
        ca_created,
        &ca_subject,
        |cert| names_user(cert, SUPER_ADMIN_USER, SUPER_ADMIN_GROUP),
        || issue_client(&issuer, SUPER_ADMIN_USER, &[SUPER_ADMIN_GROUP]),
    )?;
    let (kubelet_client_cert_pem, kubelet_client_key_pem) = load_or_issue(
        &paths.kubelet_client_cert,
        &paths.kubelet_client_key,
        ca_created,
        &ca_subject,
        |cert| names_user(cert, KUBELET_CLIENT_USER, ADMIN_GROUP),
        || issue_client(&issuer, KUBELET_CLIENT_USER, &[ADMIN_GROUP]),
    )?;
    let service_account_key_pem = match read_opt(&paths.service_account_key)? {
        Some(key) => key,
        None => {
            let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
                .context("generating the service account key")?
                .serialize_pem();
            write_file(&paths.service_account_key, key.as_bytes(), 0o600)?;
            tracing::info!(path = %paths.service_account_key.display(), "created the service account signing key");
            key
        }
    };

    Ok(Pki {
        ca_cert_pem,
        ca_key_pem,
        serving_cert_pem,
        serving_key_pem,
        admin_cert_pem,
        admin_key_pem,
        super_admin_cert_pem,
        super_admin_key_pem,
        kubelet_client_cert_pem,
        kubelet_client_key_pem,
        service_account_key_pem,
    })
}

impl Pki {
    /// Issues a client certificate signed by the CA, e.g. `CN=system:node:NAME, O=system:nodes`
    /// for a node agent. Returns `(cert_pem, key_pem)`.
    ///
    /// At most one organization is supported (the certificate library keeps one value per
    /// attribute type).
    pub fn issue_client_cert(&self, cn: &str, orgs: &[&str]) -> anyhow::Result<(String, String)> {
        let issuer = self.issuer()?;
        issue_client(&issuer, cn, orgs)
    }

    /// Writes a kubeconfig (mode 0600) with cluster, user and context all named `skiff`, the CA
    /// and the user's certificate and key embedded as base64.
    pub fn write_kubeconfig(
        &self,
        path: &Path,
        server_url: &str,
        user_cert_pem: &str,
        user_key_pem: &str,
    ) -> anyhow::Result<()> {
        let text = kubeconfig_yaml(&self.ca_cert_pem, server_url, user_cert_pem, user_key_pem)?;
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        write_file(path, text.as_bytes(), 0o600)
    }

    fn issuer(&self) -> anyhow::Result<Issuer<'static, KeyPair>> {
        let key = KeyPair::from_pem(&self.ca_key_pem).context("parsing the CA key")?;
        Issuer::from_ca_cert_pem(&self.ca_cert_pem, key).context("parsing the CA certificate")
    }
}

/// The kubeconfig text for `write_kubeconfig`.
/// A kubeconfig for a new client certificate `CN=user, O=group` from the CA under `dir`, for the
/// server at `server_url` (default: the one in `dir/kubeconfig`). Names only the API server or
/// the break-glass certificate may carry are refused, and `system:masters` with them.
pub fn user_kubeconfig(
    dir: &Path,
    server_url: Option<&str>,
    user: &str,
    group: Option<&str>,
) -> anyhow::Result<String> {
    if user.is_empty() {
        bail!("a user name is required");
    }
    if [KUBELET_CLIENT_USER, SUPER_ADMIN_USER].contains(&user) {
        bail!("{user:?} is reserved for the API server's own certificates");
    }
    if group == Some(SUPER_ADMIN_GROUP) {
        bail!(
            "{SUPER_ADMIN_GROUP} is never authorized, only trusted: use {} for break-glass access",
            dir.join("super-admin.kubeconfig").display()
        );
    }
    if user.starts_with("system:node:") && group != Some("system:nodes") {
        bail!("{user:?} is a node's name: use `skiff kubeconfig node NAME`");
    }
    let paths = Paths::new(dir);
    let ca_cert_pem =
        fs::read_to_string(&paths.ca_cert).with_context(|| format!("reading {}", paths.ca_cert.display()))?;
    let ca_key_pem =
        fs::read_to_string(&paths.ca_key).with_context(|| format!("reading {}", paths.ca_key.display()))?;
    let ca_key = KeyPair::from_pem(&ca_key_pem).context("parsing the CA key")?;
    let issuer = Issuer::from_ca_cert_pem(&ca_cert_pem, ca_key).context("parsing the CA certificate")?;
    let groups: Vec<&str> = group.into_iter().collect();
    let (cert, key) = issue_client(&issuer, user, &groups)?;
    let server = match server_url {
        Some(s) => s.to_string(),
        None => server_of(&dir.join("kubeconfig"))?,
    };
    kubeconfig_yaml(&ca_cert_pem, &server, &cert, &key)
}

/// The `server:` of a kubeconfig this module wrote.
fn server_of(kubeconfig: &Path) -> anyhow::Result<String> {
    let text = fs::read_to_string(kubeconfig)
        .with_context(|| format!("reading {} (or give --server)", kubeconfig.display()))?;
    let line = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server:"))
        .with_context(|| format!("no server in {}", kubeconfig.display()))?;
    let v: String = serde_json::from_str(line.trim()).unwrap_or_else(|_| line.trim().to_string());
    Ok(v)
}

fn kubeconfig_yaml(
    ca_cert_pem: &str,
    server_url: &str,
    user_cert_pem: &str,
    user_key_pem: &str,
) -> anyhow::Result<String> {
    // A JSON string is a valid YAML scalar, so quoting the URL this way is always safe.
    let server = serde_json::to_string(server_url).context("quoting the server URL")?;
    Ok(format!(
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
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: skiff
  context:
    cluster: skiff
    user: skiff
current-context: skiff
preferences: {{}}
",
        ca = BASE64.encode(ca_cert_pem),
        cert = BASE64.encode(user_cert_pem),
        key = BASE64.encode(user_key_pem),
    ))
}

/// The serving certificate's names: loopback addresses, localhost, the host name, extras.
fn serving_names(extra: &[String]) -> Vec<String> {
    let mut names: Vec<String> = vec!["127.0.0.1".into(), "::1".into(), "localhost".into()];
    if let Some(host) = host_name() {
        names.push(host);
    }
    names.extend(extra.iter().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()));
    let mut seen = BTreeSet::new();
    names.retain(|n| seen.insert(n.to_ascii_lowercase()));
    names
}

fn host_name() -> Option<String> {
    let raw = fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| fs::read_to_string("/etc/hostname"))
        .ok()?;
    let name = raw.trim();
    (!name.is_empty()).then(|| name.to_string())
}

fn read_opt(path: &Path) -> anyhow::Result<Option<String>> {
    match fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Writes `data` to `path` through a temporary file and a rename, with `mode`.
pub(crate) fn write_file(path: &Path, data: &[u8], mode: u32) -> anyhow::Result<()> {
    let file_name = path
        .file_name()
        .with_context(|| format!("{} has no file name", path.display()))?;
    let mut tmp_name = file_name.to_os_string();
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    let _ = fs::remove_file(&tmp);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    file.write_all(data)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}

/// Reuses the certificate at `cert_path` when it is signed by the CA, not about to expire and
/// accepted by `fits`; otherwise issues and writes a new one.
fn load_or_issue(
    cert_path: &Path,
    key_path: &Path,
    ca_created: bool,
    ca_subject: &[u8],
    fits: impl Fn(&x509_parser::certificate::X509Certificate<'_>) -> bool,
    issue: impl FnOnce() -> anyhow::Result<(String, String)>,
) -> anyhow::Result<(String, String)> {
    if !ca_created && let (Some(cert), Some(key)) = (read_opt(cert_path)?, read_opt(key_path)?) {
        let reusable = match parse_pem_cert(&cert) {
            Ok(der) => match x509_parser::parse_x509_certificate(&der) {
                Ok((_, x509)) => {
                    let now = jiff::Timestamp::now().as_second();
                    x509.issuer().as_raw() == ca_subject
                        && x509.validity().not_after.timestamp() - now > RENEW_BEFORE_SECONDS
                        && fits(&x509)
                }
                Err(_) => false,
            },
            Err(_) => false,
        };
        if reusable && KeyPair::from_pem(&key).is_ok() {
            return Ok((cert, key));
        }
    }
    let (cert, key) = issue()?;
    write_file(key_path, key.as_bytes(), 0o600)?;
    write_file(cert_path, cert.as_bytes(), 0o644)?;
    tracing::info!(path = %cert_path.display(), "issued certificate");
    Ok((cert, key))
}

/// Whether a client certificate is `CN=user, O=group` (an administrator certificate of an
/// earlier version, in another group, is issued again).
fn names_user(cert: &x509_parser::certificate::X509Certificate<'_>, user: &str, group: &str) -> bool {
    let subject = cert.subject();
    let cn: Vec<&str> = subject.iter_common_name().filter_map(|a| a.as_str().ok()).collect();
    let o: Vec<&str> = subject.iter_organization().filter_map(|a| a.as_str().ok()).collect();
    cn == [user] && o == [group]
}

fn covers_names(cert: &x509_parser::certificate::X509Certificate<'_>, names: &[String]) -> bool {
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return false;
    };
    let mut dns = BTreeSet::new();
    let mut ips = BTreeSet::new();
    for name in &san.value.general_names {
        match name {
            GeneralName::DNSName(d) => {
                dns.insert(d.to_ascii_lowercase());
            }
            GeneralName::IPAddress(raw) => {
                let ip = match raw.len() {
                    4 => <[u8; 4]>::try_from(*raw).ok().map(IpAddr::from),
                    16 => <[u8; 16]>::try_from(*raw).ok().map(IpAddr::from),
                    _ => None,
                };
                ips.extend(ip);
            }
            _ => {}
        }
    }
    names.iter().all(|n| match n.parse::<IpAddr>() {
        Ok(ip) => ips.contains(&ip),
        Err(_) => dns.contains(&n.to_ascii_lowercase()),
    })
}

fn parse_pem_cert(pem: &str) -> anyhow::Result<Vec<u8>> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let der = CertificateDer::from_pem_slice(pem.as_bytes()).context("parsing PEM certificate")?;
    Ok(der.to_vec())
}

fn subject_raw(cert_pem: &str) -> anyhow::Result<Vec<u8>> {
    let der = parse_pem_cert(cert_pem)?;
    let (_, x509) = x509_parser::parse_x509_certificate(&der).context("parsing X.509 certificate")?;
    Ok(x509.subject().as_raw().to_vec())
}

/// Makes `params` valid for `days` from yesterday (to tolerate clock skew).
fn set_validity(params: &mut CertificateParams, days: i64) -> anyhow::Result<()> {
    let today = jiff::Zoned::now().with_time_zone(jiff::tz::TimeZone::UTC).date();
    let start = today
        .checked_sub(jiff::Span::new().days(1))
        .context("computing the start of validity")?;
    let end = today
        .checked_add(jiff::Span::new().days(days))
        .context("computing the end of validity")?;
    let to_dt = |d: jiff::civil::Date| {
        // jiff months and days are always positive.
        rcgen::date_time_ymd(i32::from(d.year()), d.month().unsigned_abs(), d.day().unsigned_abs())
    };
    params.not_before = to_dt(start);
    params.not_after = to_dt(end);
    Ok(())
}

fn random_serial() -> rcgen::SerialNumber {
    let mut bytes = uuid::Uuid::new_v4().into_bytes().to_vec();
    // A positive, non-zero serial number.
    if let Some(first) = bytes.first_mut() {
        *first = (*first & 0x7f) | 0x01;
    }
    rcgen::SerialNumber::from_slice(&bytes)
}

fn generate_ca() -> anyhow::Result<(String, String)> {
    let key = KeyPair::generate().context("generating the CA key")?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        format!("skiff-ca@{}", jiff::Timestamp::now().as_second()),
    );
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    set_validity(&mut params, CA_DAYS)?;
    params.serial_number = Some(random_serial());
    let cert = params.self_signed(&key).context("signing the CA certificate")?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn issue_serving(issuer: &Issuer<'_, KeyPair>, names: &[String]) -> anyhow::Result<(String, String)> {
    let key = KeyPair::generate().context("generating the serving key")?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "skiff-apiserver");
    params.distinguished_name = dn;
    params.subject_alt_names = names
        .iter()
        .map(|n| match n.parse::<IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => Ok(SanType::DnsName(
                n.clone()
                    .try_into()
                    .with_context(|| format!("invalid DNS name {n:?}"))?,
            )),
        })
        .collect::<anyhow::Result<_>>()?;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    set_validity(&mut params, LEAF_DAYS)?;
    params.serial_number = Some(random_serial());
    let cert = params
        .signed_by(&key, issuer)
        .context("signing the serving certificate")?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn issue_client(issuer: &Issuer<'_, KeyPair>, cn: &str, orgs: &[&str]) -> anyhow::Result<(String, String)> {
    if cn.is_empty() {
        bail!("a client certificate needs a common name");
    }
    if orgs.len() > 1 {
        bail!("client certificates carry at most one organization, got {orgs:?}");
    }
    let key = KeyPair::generate().context("generating a client key")?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    for org in orgs {
        dn.push(DnType::OrganizationName, *org);
    }
    params.distinguished_name = dn;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    set_validity(&mut params, LEAF_DAYS)?;
    params.serial_number = Some(random_serial());
    let cert = params.signed_by(&key, issuer).context("signing a client certificate")?;
    Ok((cert.pem(), key.serialize_pem()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x509_names(pem: &str) -> (Vec<String>, Vec<String>) {
        let der = parse_pem_cert(pem).unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let cn = cert
            .subject()
            .iter_common_name()
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        let o = cert
            .subject()
            .iter_organization()
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        (cn, o)
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn creates_then_reuses() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create(dir.path(), &["api.example.com".into()]).unwrap();
        let paths = Paths::new(dir.path());
        for key in [
            &paths.ca_key,
            &paths.serving_key,
            &paths.admin_key,
            &paths.super_admin_key,
            &paths.kubelet_client_key,
            &paths.service_account_key,
        ] {
            assert_eq!(mode(key), 0o600, "{}", key.display());
        }
        assert_eq!(
            x509_names(&first.admin_cert_pem),
            (vec!["skiff-admin".into()], vec!["skiff:cluster-admins".into()])
        );
        assert_eq!(
            x509_names(&first.super_admin_cert_pem),
            (vec!["skiff-super-admin".into()], vec!["system:masters".into()])
        );

        let der = parse_pem_cert(&first.serving_cert_pem).unwrap();
        let (_, serving) = x509_parser::parse_x509_certificate(&der).unwrap();
        assert!(covers_names(&serving, &serving_names(&["api.example.com".into()])));
        assert!(covers_names(
            &serving,
            &["127.0.0.1".into(), "::1".into(), "localhost".into()]
        ));
        assert!(!covers_names(&serving, &["other.example.com".into()]));
        let ca_der = parse_pem_cert(&first.ca_cert_pem).unwrap();
        let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
        assert!(ca.is_ca());
        assert_eq!(serving.issuer().as_raw(), ca.subject().as_raw());

        // A second start reuses everything.
        let second = load_or_create(dir.path(), &["api.example.com".into()]).unwrap();
        assert_eq!(first.ca_cert_pem, second.ca_cert_pem);
        assert_eq!(first.ca_key_pem, second.ca_key_pem);
        assert_eq!(first.serving_cert_pem, second.serving_cert_pem);
        assert_eq!(first.admin_cert_pem, second.admin_cert_pem);
        assert_eq!(first.service_account_key_pem, second.service_account_key_pem);

        // A new name issues a new serving certificate from the same CA.
        let third = load_or_create(dir.path(), &["10.1.2.3".into()]).unwrap();
        assert_eq!(first.ca_cert_pem, third.ca_cert_pem);
        assert_ne!(first.serving_cert_pem, third.serving_cert_pem);
        assert_eq!(first.admin_cert_pem, third.admin_cert_pem);
        let der = parse_pem_cert(&third.serving_cert_pem).unwrap();
        let (_, serving) = x509_parser::parse_x509_certificate(&der).unwrap();
        assert!(covers_names(&serving, &["10.1.2.3".into(), "localhost".into()]));
    }

    #[test]
    fn half_a_ca_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        load_or_create(dir.path(), &[]).unwrap();
        fs::remove_file(dir.path().join("pki/ca.key")).unwrap();
        assert!(load_or_create(dir.path(), &[]).is_err());
    }

    #[test]
    fn new_ca_reissues_leaves() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create(dir.path(), &[]).unwrap();
        fs::remove_file(dir.path().join("pki/ca.key")).unwrap();
        fs::remove_file(dir.path().join("pki/ca.crt")).unwrap();
        let second = load_or_create(dir.path(), &[]).unwrap();
        assert_ne!(first.ca_cert_pem, second.ca_cert_pem);
        assert_ne!(first.admin_cert_pem, second.admin_cert_pem);
        assert_ne!(first.serving_cert_pem, second.serving_cert_pem);
        // Tokens signed before stay valid: the signing key is not the CA's.
        assert_eq!(first.service_account_key_pem, second.service_account_key_pem);
    }

    #[test]
    fn node_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let pki = load_or_create(dir.path(), &[]).unwrap();
        let (cert, key) = pki.issue_client_cert("system:node:n1", &["system:nodes"]).unwrap();
        assert_eq!(
            x509_names(&cert),
            (vec!["system:node:n1".into()], vec!["system:nodes".into()])
        );
        assert!(KeyPair::from_pem(&key).is_ok());
        assert!(pki.issue_client_cert("", &[]).is_err());
        assert!(pki.issue_client_cert("x", &["a", "b"]).is_err());
    }

    #[test]
    fn kubeconfig() {
        let dir = tempfile::tempdir().unwrap();
        let pki = load_or_create(dir.path(), &[]).unwrap();
        let path = dir.path().join("sub/kubeconfig");
        pki.write_kubeconfig(&path, "https://127.0.0.1:6443", &pki.admin_cert_pem, &pki.admin_key_pem)
            .unwrap();
        assert_eq!(mode(&path), 0o600);
        let value: serde_json::Value = serde_saphyr::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(value["current-context"], "skiff");
        assert_eq!(value["clusters"][0]["name"], "skiff");
        assert_eq!(value["clusters"][0]["cluster"]["server"], "https://127.0.0.1:6443");
        assert_eq!(value["contexts"][0]["context"]["user"], "skiff");
        let decode = |v: &serde_json::Value| String::from_utf8(BASE64.decode(v.as_str().unwrap()).unwrap()).unwrap();
        assert_eq!(
            decode(&value["clusters"][0]["cluster"]["certificate-authority-data"]),
            pki.ca_cert_pem
        );
        assert_eq!(
            decode(&value["users"][0]["user"]["client-certificate-data"]),
            pki.admin_cert_pem
        );
        assert_eq!(decode(&value["users"][0]["user"]["client-key-data"]), pki.admin_key_pem);
    }
}
