//! The CSR signing controller (upstream's `pkg/controller/certificates/signer`): approved
//! CertificateSigningRequests of the `kubernetes.io/kube-apiserver-client-kubelet`,
//! `kubernetes.io/kube-apiserver-client` and `kubernetes.io/kubelet-serving` signers are signed
//! with the cluster CA and the certificate written to `status.certificate`. A request the
//! signer's checks refuse gets the `Failed` condition (reason `SignerValidationFailure`).
//!
//! Validity as upstream's `PermissiveSigningPolicy`: from five minutes ago (clock skew) to
//! `spec.expirationSeconds` from now (at least ten minutes) but never beyond
//! `--cluster-signing-duration` nor the CA's own end; a long-lived certificate's end is
//! backdated by the same five minutes.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::reflector::{ObjectRef, Store};
use rcgen::{ExtendedKeyUsagePurpose as Eku, Issuer, KeyPair, KeyUsagePurpose as Ku};
use skiff_api::certificates as capi;

use crate::controller_utils::{self as cu, WorkQueue};

/// Clock skew tolerated at both ends (upstream's `Backdate`).
const BACKDATE: Duration = Duration::from_secs(5 * 60);
/// Certificates shorter than this keep their full end (upstream's `Short`).
const SHORT: Duration = Duration::from_secs(8 * 3600);
/// The shortest requested duration honoured (twice the skew).
const MIN_REQUESTED: Duration = Duration::from_secs(10 * 60);
/// kube-controller-manager's `--cluster-signing-duration` default: a year.
pub const DEFAULT_SIGNING_DURATION: Duration = Duration::from_secs(8760 * 3600);

/// The CA that signs, and for how long.
#[derive(Clone)]
pub struct SigningConfig {
    pub ca_cert_pem: String,
    pub ca_key_pem: String,
    /// `--cluster-signing-duration`.
    pub duration: Duration,
}

impl std::fmt::Debug for SigningConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key stays out of logs.
        f.debug_struct("SigningConfig")
            .field("duration", &self.duration)
            .finish_non_exhaustive()
    }
}

/// The signers this controller serves.
const SIGNERS: &[&str] = &[
    capi::KUBE_APISERVER_CLIENT_KUBELET_SIGNER,
    capi::KUBE_APISERVER_CLIENT_SIGNER,
    capi::KUBELET_SERVING_SIGNER,
];

struct Ctx {
    client: kube::Client,
    csrs: Store<CertificateSigningRequest>,
    issuer: Issuer<'static, KeyPair>,
    ca_not_after: jiff::Timestamp,
    duration: Duration,
}

pub async fn run(client: kube::Client, cfg: SigningConfig) -> anyhow::Result<()> {
    let key = KeyPair::from_pem(&cfg.ca_key_pem).context("parsing the CA key")?;
    let issuer = Issuer::from_ca_cert_pem(&cfg.ca_cert_pem, key).context("parsing the CA certificate")?;
    let ca_not_after = not_after(cfg.ca_cert_pem.as_bytes()).context("reading the CA's validity")?;
    let queue = WorkQueue::new();
    let csrs = cu::spawn_store_watch(
        Api::<CertificateSigningRequest>::all(client.clone()),
        queue.clone(),
        |csr: &CertificateSigningRequest| csr.metadata.name.clone().into_iter().collect(),
    );
    let ctx = Ctx {
        client,
        csrs,
        issuer,
        ca_not_after,
        duration: cfg.duration,
    };
    queue.run("csrsigning", |name| handle(&ctx, name)).await
}

fn not_after(pem: &[u8]) -> anyhow::Result<jiff::Timestamp> {
    let block = x509_parser::pem::Pem::iter_from_buffer(pem)
        .next()
        .context("no PEM block")?
        .context("parsing PEM")?;
    let (_, cert) = x509_parser::parse_x509_certificate(&block.contents).context("parsing the certificate")?;
    jiff::Timestamp::from_second(cert.validity().not_after.timestamp()).context("the certificate's end")
}

/// upstream's `signer.handle`.
async fn handle(ctx: &Ctx, name: String) -> anyhow::Result<Option<Duration>> {
    let Some(csr) = ctx.csrs.get(&ObjectRef::new(&name)) else {
        return Ok(None);
    };
    let json = serde_json::to_value(&*csr).context("encoding the request")?;
    if !capi::is_approved(&json)
        || capi::has_true_condition(&json, capi::FAILED)
        || capi::issued_certificate(&json).is_some()
    {
        return Ok(None);
    }
    let signer = csr.spec.signer_name.as_str();
    if !SIGNERS.contains(&signer) {
        return Ok(None);
    }
    let parsed =
        capi::parse_csr(&csr.spec.request.0).map_err(|e| anyhow::anyhow!("unable to parse csr {name:?}: {e}"))?;
    let usages = capi::usages(&json);
    if let Err(reason) = recognize(signer, &parsed, &usages) {
        let mut failed = (*csr).clone();
        failed
            .status
            .get_or_insert_with(Default::default)
            .conditions
            .get_or_insert_with(Vec::new)
            .push(CertificateSigningRequestCondition {
                type_: capi::FAILED.into(),
                status: "True".into(),
                reason: Some("SignerValidationFailure".into()),
                message: Some(reason.clone()),
                last_update_time: Some(Time(cu::now().0)),
                ..Default::default()
            });
        api(ctx)
            .replace_status(&name, &PostParams::default(), &failed)
            .await
            .context("error adding failure condition for csr")?;
        tracing::info!(csr = %name, %reason, "refused to sign a certificate request");
        return Ok(None);
    }
    let expiration = csr.spec.expiration_seconds;
    let now = jiff::Timestamp::now();
    let cert = sign(
        &ctx.issuer,
        ctx.ca_not_after,
        &String::from_utf8_lossy(&csr.spec.request.0),
        &usages,
        ttl(ctx.duration, expiration),
        now,
    )
    .map_err(|e| anyhow::anyhow!("error auto signing csr: {e}"))?;
    let mut issued = (*csr).clone();
    issued.status.get_or_insert_with(Default::default).certificate = Some(ByteString(cert.into_bytes()));
    api(ctx)
        .replace_status(&name, &PostParams::default(), &issued)
        .await
        .context("error updating signature for csr")?;
    tracing::info!(csr = %name, signer, "signed a certificate");
    Ok(None)
}

fn api(ctx: &Ctx) -> Api<CertificateSigningRequest> {
    Api::all(ctx.client.clone())
}

/// The signer-specific checks (upstream's `isKubeletClient`, `isKubeAPIServerClient`,
/// `isKubeletServing`).
fn recognize(signer: &str, req: &capi::ParsedCsr, usages: &BTreeSet<String>) -> Result<(), String> {
    match signer {
        capi::KUBE_APISERVER_CLIENT_KUBELET_SIGNER => capi::validate_kubelet_client_csr(req, usages),
        capi::KUBE_APISERVER_CLIENT_SIGNER => capi::validate_apiserver_client_csr(usages),
        capi::KUBELET_SERVING_SIGNER => validate_kubelet_serving_csr(req, usages),
        _ => Err(format!("signer {signer} is not served")),
    }
}

/// upstream's `ValidateKubeletServingCSR`.
fn validate_kubelet_serving_csr(req: &capi::ParsedCsr, usages: &BTreeSet<String>) -> Result<(), String> {
    let set = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    if *usages != set(&["digital signature", "key encipherment", "server auth"])
        && *usages != set(&["digital signature", "server auth"])
    {
        return Err("usages did not match [digital signature key encipherment server auth]".into());
    }
    if req.dns_names.is_empty() && req.ip_addresses == 0 {
        return Err("DNS or IP subjectAltName is required".into());
    }
    if req.email_addresses > 0 {
        return Err("Email subjectAltNames are not allowed".into());
    }
    if req.uris > 0 {
        return Err("URI subjectAltNames are not allowed".into());
    }
    if req.organizations != [capi::NODES_GROUP] {
        return Err("subject organization is not system:nodes".into());
    }
    if !req.common_name.starts_with(capi::NODE_USER_PREFIX) {
        return Err("subject common name does not begin with system:node:".into());
    }
    Ok(())
}

/// upstream's `signer.duration`: the signing duration, or the requested one when shorter (but
/// never under ten minutes).
fn ttl(signing: Duration, expiration_seconds: Option<i32>) -> Duration {
    let Some(secs) = expiration_seconds else {
        return signing;
    };
    let requested = Duration::from_secs(u64::try_from(secs).unwrap_or(0));
    if requested > signing {
        signing
    } else if requested < MIN_REQUESTED {
        MIN_REQUESTED
    } else {
        requested
    }
}

/// upstream's `keyUsagesFromStrings`.
fn key_usages(usages: &BTreeSet<String>) -> Result<(Vec<Ku>, Vec<Eku>), String> {
    let mut ku = Vec::new();
    let mut eku = Vec::new();
    for u in usages {
        match u.as_str() {
            "signing" | "digital signature" => ku.push(Ku::DigitalSignature),
            "content commitment" => ku.push(Ku::ContentCommitment),
            "key encipherment" => ku.push(Ku::KeyEncipherment),
            "key agreement" => ku.push(Ku::KeyAgreement),
            "data encipherment" => ku.push(Ku::DataEncipherment),
            "cert sign" => ku.push(Ku::KeyCertSign),
            "crl sign" => ku.push(Ku::CrlSign),
            "encipher only" => ku.push(Ku::EncipherOnly),
            "decipher only" => ku.push(Ku::DecipherOnly),
            "any" => eku.push(Eku::Any),
            "server auth" => eku.push(Eku::ServerAuth),
            "client auth" => eku.push(Eku::ClientAuth),
            "code signing" => eku.push(Eku::CodeSigning),
            "email protection" | "s/mime" => eku.push(Eku::EmailProtection),
            "timestamping" => eku.push(Eku::TimeStamping),
            "ocsp signing" => eku.push(Eku::OcspSigning),
            "ipsec end system" => eku.push(Eku::Other(vec![1, 3, 6, 1, 5, 5, 7, 3, 5])),
            "ipsec tunnel" => eku.push(Eku::Other(vec![1, 3, 6, 1, 5, 5, 7, 3, 6])),
            "ipsec user" => eku.push(Eku::Other(vec![1, 3, 6, 1, 5, 5, 7, 3, 7])),
            "microsoft sgc" => eku.push(Eku::Other(vec![1, 3, 6, 1, 4, 1, 311, 10, 3, 3])),
            "netscape sgc" => eku.push(Eku::Other(vec![2, 16, 840, 1, 113_730, 4, 1])),
            other => return Err(format!("unrecognized usage: {other}")),
        }
    }
    eku.dedup();
    Ok((ku, eku))
}

fn to_rcgen_time(t: jiff::Timestamp) -> Result<time::OffsetDateTime, String> {
    time::OffsetDateTime::from_unix_timestamp(t.as_second()).map_err(|e| e.to_string())
}

/// Signs the request's key and subject (and its SANs) with the CA for `ttl` (upstream's
/// `CertificateAuthority.Sign` with `PermissiveSigningPolicy`). Returns the PEM.
pub fn sign(
    issuer: &Issuer<'_, KeyPair>,
    ca_not_after: jiff::Timestamp,
    csr_pem: &str,
    usages: &BTreeSet<String>,
    ttl: Duration,
    now: jiff::Timestamp,
) -> Result<String, String> {
    let mut req = rcgen::CertificateSigningRequestParams::from_pem(csr_pem).map_err(|e| e.to_string())?;
    let (ku, eku) = key_usages(usages)?;
    let span = |d: Duration| jiff::SignedDuration::try_from(d).map_err(|e| e.to_string());
    let not_before = now.checked_sub(span(BACKDATE)?).map_err(|e| e.to_string())?;
    let mut end = if ttl < SHORT {
        now.checked_add(span(ttl)?)
    } else {
        now.checked_add(span(ttl)? - span(BACKDATE)?)
    }
    .map_err(|e| e.to_string())?;
    if end >= ca_not_after {
        end = ca_not_after;
    }
    if not_before >= ca_not_after {
        return Err(format!("the signer has expired: NotAfter={ca_not_after}"));
    }
    if now >= ca_not_after {
        return Err(format!(
            "refusing to sign a certificate that expired in the past: NotAfter={ca_not_after}"
        ));
    }
    let p = &mut req.params;
    p.key_usages = ku;
    p.extended_key_usages = eku;
    p.is_ca = rcgen::IsCa::ExplicitNoCa;
    p.not_before = to_rcgen_time(not_before)?;
    p.not_after = to_rcgen_time(end)?;
    p.use_authority_key_identifier_extension = true;
    p.serial_number = Some(random_serial());
    let cert = req.signed_by(issuer).map_err(|e| e.to_string())?;
    Ok(cert.pem())
}

fn random_serial() -> rcgen::SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    // A positive, non-zero serial number.
    bytes[0] = (bytes[0] & 0x7f) | 0x01;
    rcgen::SerialNumber::from_slice(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usages(l: &[&str]) -> BTreeSet<String> {
        l.iter().map(|s| s.to_string()).collect()
    }

    fn ca() -> (Issuer<'static, KeyPair>, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, "test-ca");
        let cert = params.self_signed(&key).unwrap();
        let pem = cert.pem();
        (Issuer::from_ca_cert_pem(&pem, key).unwrap(), pem)
    }

    fn request(cn: &str, o: &str) -> String {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        params.distinguished_name.push(rcgen::DnType::OrganizationName, o);
        params.serialize_request(&key).unwrap().pem().unwrap()
    }

    #[test]
    fn durations_as_upstream() {
        let year = DEFAULT_SIGNING_DURATION;
        assert_eq!(ttl(year, None), year);
        assert_eq!(ttl(year, Some(3600)), Duration::from_secs(3600));
        assert_eq!(ttl(year, Some(60)), MIN_REQUESTED);
        assert_eq!(ttl(Duration::from_secs(120), Some(3600)), Duration::from_secs(120));
        assert_eq!(ttl(Duration::from_secs(120), None), Duration::from_secs(120));
    }

    #[test]
    fn signs_a_node_client_certificate() {
        let (issuer, ca_pem) = ca();
        let ca_end = not_after(ca_pem.as_bytes()).unwrap();
        let now = jiff::Timestamp::now();
        let u = usages(&["digital signature", "client auth"]);
        let pem = sign(
            &issuer,
            ca_end,
            &request("system:node:n1", "system:nodes"),
            &u,
            Duration::from_secs(3600),
            now,
        )
        .unwrap();
        let block = x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes())
            .next()
            .unwrap()
            .unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(&block.contents).unwrap();
        let cn = cert.subject().iter_common_name().next().unwrap().as_str().unwrap();
        assert_eq!(cn, "system:node:n1");
        let o = cert.subject().iter_organization().next().unwrap().as_str().unwrap();
        assert_eq!(o, "system:nodes");
        let start = cert.validity().not_before.timestamp();
        let end = cert.validity().not_after.timestamp();
        assert_eq!(end - now.as_second(), 3600, "short certificates keep their full end");
        assert_eq!(now.as_second() - start, 300, "backdated five minutes");
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth);
        assert!(!cert.is_ca());
        // The end never passes the CA's.
        let pem = sign(
            &issuer,
            now.checked_add(jiff::SignedDuration::from_secs(60)).unwrap(),
            &request("u", "g"),
            &u,
            DEFAULT_SIGNING_DURATION,
            now,
        )
        .unwrap();
        let block = x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes())
            .next()
            .unwrap()
            .unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(&block.contents).unwrap();
        assert_eq!(cert.validity().not_after.timestamp(), now.as_second() + 60);
        assert!(sign(&issuer, now, &request("u", "g"), &u, DEFAULT_SIGNING_DURATION, now).is_err());
        assert_eq!(
            sign(
                &issuer,
                ca_end,
                &request("u", "g"),
                &usages(&["fly"]),
                DEFAULT_SIGNING_DURATION,
                now
            )
            .unwrap_err(),
            "unrecognized usage: fly"
        );
    }

    #[test]
    fn signer_checks() {
        let parse = |cn: &str, o: &str| capi::parse_csr(request(cn, o).as_bytes()).unwrap();
        let node = parse("system:node:n1", "system:nodes");
        let client = usages(&["digital signature", "client auth"]);
        assert!(recognize(capi::KUBE_APISERVER_CLIENT_KUBELET_SIGNER, &node, &client).is_ok());
        let user = parse("alice", "devs");
        assert_eq!(
            recognize(capi::KUBE_APISERVER_CLIENT_KUBELET_SIGNER, &user, &client).unwrap_err(),
            "subject organization is not system:nodes"
        );
        assert!(recognize(capi::KUBE_APISERVER_CLIENT_SIGNER, &user, &client).is_ok());
        assert_eq!(
            recognize(capi::KUBE_APISERVER_CLIENT_SIGNER, &user, &usages(&["server auth"])).unwrap_err(),
            "invalid usage for client certificate: server auth"
        );
        assert_eq!(
            recognize(
                capi::KUBELET_SERVING_SIGNER,
                &node,
                &usages(&["digital signature", "server auth"])
            )
            .unwrap_err(),
            "DNS or IP subjectAltName is required"
        );
    }
}
