//! certificates.k8s.io: the signer names, key usages and the PKCS#10 request checks upstream
//! keeps in `pkg/apis/certificates` (`ParseCSR`, `ValidateKubeletClientCSR`,
//! `IsKubeletClientCSR`) and the condition helpers of `pkg/controller/certificates`. Shared by
//! validation, the approver, the signer and the node agent's bootstrap.

use std::collections::BTreeSet;

use serde_json::Value;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::FromDer;

/// Client certificates for the API server, any user (upstream's `KubeAPIServerClientSignerName`).
pub const KUBE_APISERVER_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client";
/// Node client certificates (`KubeAPIServerClientKubeletSignerName`).
pub const KUBE_APISERVER_CLIENT_KUBELET_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// Kubelet serving certificates (`KubeletServingSignerName`).
pub const KUBELET_SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
/// The v1beta1-only signer, refused by v1 (`LegacyUnknownSignerName`).
pub const LEGACY_UNKNOWN_SIGNER: &str = "kubernetes.io/legacy-unknown";

/// The group every node is in.
pub const NODES_GROUP: &str = "system:nodes";
/// Every node's user name starts so.
pub const NODE_USER_PREFIX: &str = "system:node:";

/// Condition types.
pub const APPROVED: &str = "Approved";
pub const DENIED: &str = "Denied";
pub const FAILED: &str = "Failed";

/// Every key usage upstream knows (`allValidUsages`), sorted as its `sets.List()`.
pub const ALL_USAGES: &[&str] = &[
    "any",
    "cert sign",
    "client auth",
    "code signing",
    "content commitment",
    "crl sign",
    "data encipherment",
    "decipher only",
    "digital signature",
    "email protection",
    "encipher only",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "key agreement",
    "key encipherment",
    "microsoft sgc",
    "netscape sgc",
    "ocsp signing",
    "s/mime",
    "server auth",
    "signing",
    "timestamping",
];

/// What of a PKCS#10 request the checks look at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedCsr {
    pub common_name: String,
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub ip_addresses: usize,
    pub email_addresses: usize,
    pub uris: usize,
    /// The DER of the request (signature verified).
    pub der: Vec<u8>,
}

/// upstream's `ParseCSR` plus `CheckSignature`: the first PEM block must be a
/// `CERTIFICATE REQUEST` whose PKCS#10 content parses and whose signature verifies.
pub fn parse_csr(pem: &[u8]) -> Result<ParsedCsr, String> {
    let block = x509_parser::pem::Pem::iter_from_buffer(pem)
        .next()
        .and_then(Result::ok)
        .filter(|p| p.label == "CERTIFICATE REQUEST")
        .ok_or_else(|| "PEM block type must be CERTIFICATE REQUEST".to_string())?;
    let (_, csr) = X509CertificationRequest::from_der(&block.contents)
        .map_err(|e| format!("x509: malformed certificate request: {e}"))?;
    csr.verify_signature()
        .map_err(|_| "x509: ECDSA verification failure".to_string())?;
    let info = &csr.certification_request_info;
    let mut out = ParsedCsr {
        common_name: info
            .subject
            .iter_common_name()
            .next()
            .and_then(|a| a.as_str().ok())
            .unwrap_or("")
            .to_string(),
        organizations: info
            .subject
            .iter_organization()
            .filter_map(|a| a.as_str().ok())
            .map(str::to_string)
            .collect(),
        der: block.contents.clone(),
        ..Default::default()
    };
    if let Some(exts) = csr.requested_extensions() {
        for ext in exts {
            if let ParsedExtension::SubjectAlternativeName(san) = ext {
                for name in &san.general_names {
                    match name {
                        GeneralName::DNSName(d) => out.dns_names.push(d.to_string()),
                        GeneralName::IPAddress(_) => out.ip_addresses += 1,
                        GeneralName::RFC822Name(_) => out.email_addresses += 1,
                        GeneralName::URI(_) => out.uris += 1,
                        _ => {}
                    }
                }
            }
        }
    }
    Ok(out)
}

/// The request of a CSR object: `spec.request` is base64 in JSON.
pub fn request_pem(csr: &Value) -> Result<Vec<u8>, String> {
    use base64::Engine;
    let text = csr.pointer("/spec/request").and_then(Value::as_str).unwrap_or("");
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| format!("illegal base64 data: {e}"))
}

/// The usages of a CSR object.
pub fn usages(csr: &Value) -> BTreeSet<String> {
    csr.pointer("/spec/usages")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// upstream's `ValidateKubeletClientCSR`: `O=system:nodes` exactly, no SANs,
/// `CN=system:node:...`, usages digital signature + client auth (+ key encipherment).
pub fn validate_kubelet_client_csr(req: &ParsedCsr, usages: &BTreeSet<String>) -> Result<(), String> {
    if req.organizations != [NODES_GROUP] {
        return Err("subject organization is not system:nodes".into());
    }
    if !req.dns_names.is_empty() {
        return Err("DNS subjectAltNames are not allowed".into());
    }
    if req.email_addresses > 0 {
        return Err("Email subjectAltNames are not allowed".into());
    }
    if req.ip_addresses > 0 {
        return Err("IP subjectAltNames are not allowed".into());
    }
    if req.uris > 0 {
        return Err("URI subjectAltNames are not allowed".into());
    }
    if !req.common_name.starts_with(NODE_USER_PREFIX) {
        return Err("subject common name does not begin with system:node:".into());
    }
    let required = set(&["client auth", "digital signature", "key encipherment"]);
    let required_no_rsa = set(&["client auth", "digital signature"]);
    if *usages != required && *usages != required_no_rsa {
        return Err("usages did not match [client auth digital signature key encipherment]".into());
    }
    Ok(())
}

/// upstream's `IsKubeletClientCSR`.
pub fn is_kubelet_client_csr(req: &ParsedCsr, usages: &BTreeSet<String>) -> bool {
    validate_kubelet_client_csr(req, usages).is_ok()
}

/// The signer's check for `kubernetes.io/kube-apiserver-client` (upstream's
/// `isKubeAPIServerClient`): client usages only.
pub fn validate_apiserver_client_csr(usages: &BTreeSet<String>) -> Result<(), String> {
    let valid = set(&["client auth", "digital signature", "key encipherment"]);
    for u in usages {
        if !valid.contains(u) {
            return Err(format!("invalid usage for client certificate: {u}"));
        }
    }
    Ok(())
}

/// Whether a condition of `kind` with status True is present.
pub fn has_true_condition(csr: &Value, kind: &str) -> bool {
    csr.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some(kind)
                    && c.get("status").and_then(Value::as_str).unwrap_or("True") == "True"
            })
        })
}

/// upstream's `GetCertApprovalCondition`: (approved, denied).
pub fn approval(csr: &Value) -> (bool, bool) {
    (has_true_condition(csr, APPROVED), has_true_condition(csr, DENIED))
}

/// upstream's `IsCertificateRequestApproved`: approved and not denied.
pub fn is_approved(csr: &Value) -> bool {
    let (approved, denied) = approval(csr);
    approved && !denied
}

/// The issued certificate (base64 in JSON), if any.
pub fn issued_certificate(csr: &Value) -> Option<Vec<u8>> {
    use base64::Engine;
    let text = csr.pointer("/status/certificate").and_then(Value::as_str)?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(text).ok()?;
    (!bytes.is_empty()).then_some(bytes)
}

#[cfg(test)]
pub(crate) mod test_csr {
    //! PKCS#10 requests made with the same library the node agent uses.

    /// A PEM request `CN=cn, O=orgs...` with DNS SANs.
    pub fn pem(cn: &str, orgs: &[&str], dns: &[&str]) -> String {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        let mut params =
            rcgen::CertificateParams::new(dns.iter().map(|s| s.to_string()).collect::<Vec<_>>()).expect("params");
        let mut dn = rcgen::DistinguishedName::new();
        dn.push(rcgen::DnType::CommonName, cn);
        for o in orgs {
            dn.push(rcgen::DnType::OrganizationName, *o);
        }
        params.distinguished_name = dn;
        params.serialize_request(&key).expect("csr").pem().expect("pem")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usages(list: &[&str]) -> BTreeSet<String> {
        set(list)
    }

    #[test]
    fn parses_a_request_and_refuses_other_pem() {
        let pem = test_csr::pem("system:node:n1", &["system:nodes"], &[]);
        let parsed = parse_csr(pem.as_bytes()).expect("parses");
        assert_eq!(parsed.common_name, "system:node:n1");
        assert_eq!(parsed.organizations, ["system:nodes"]);
        assert_eq!(
            parse_csr(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n").unwrap_err(),
            "PEM block type must be CERTIFICATE REQUEST"
        );
        assert!(parse_csr(b"not pem").is_err());
        // A flipped byte in the signature or body fails.
        let block = x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes())
            .next()
            .unwrap()
            .unwrap();
        let mut der = block.contents.clone();
        let last = der.len() - 3;
        der[last] ^= 0x55;
        use base64::Engine;
        let body = base64::engine::general_purpose::STANDARD.encode(&der);
        let tampered = format!("-----BEGIN CERTIFICATE REQUEST-----\n{body}\n-----END CERTIFICATE REQUEST-----\n");
        assert!(parse_csr(tampered.as_bytes()).is_err());
    }

    #[test]
    fn kubelet_client_rules() {
        let ok = parse_csr(test_csr::pem("system:node:n1", &["system:nodes"], &[]).as_bytes()).unwrap();
        let u = usages(&["digital signature", "client auth"]);
        assert!(validate_kubelet_client_csr(&ok, &u).is_ok());
        assert!(is_kubelet_client_csr(
            &ok,
            &usages(&["digital signature", "key encipherment", "client auth"])
        ));
        assert_eq!(
            validate_kubelet_client_csr(&ok, &usages(&["client auth"])).unwrap_err(),
            "usages did not match [client auth digital signature key encipherment]"
        );
        let not_node = parse_csr(test_csr::pem("alice", &["system:nodes"], &[]).as_bytes()).unwrap();
        assert_eq!(
            validate_kubelet_client_csr(&not_node, &u).unwrap_err(),
            "subject common name does not begin with system:node:"
        );
        let other_org = parse_csr(test_csr::pem("system:node:n1", &["system:masters"], &[]).as_bytes()).unwrap();
        assert_eq!(
            validate_kubelet_client_csr(&other_org, &u).unwrap_err(),
            "subject organization is not system:nodes"
        );
        let two_orgs = parse_csr(test_csr::pem("system:node:n1", &["system:nodes", "x"], &[]).as_bytes());
        // rcgen keeps one value per attribute type; either way the request is not a node's.
        if let Ok(two) = two_orgs {
            assert!(validate_kubelet_client_csr(&two, &u).is_err() || two.organizations == ["system:nodes"]);
        }
        let with_dns =
            parse_csr(test_csr::pem("system:node:n1", &["system:nodes"], &["n1.example"]).as_bytes()).unwrap();
        assert_eq!(
            validate_kubelet_client_csr(&with_dns, &u).unwrap_err(),
            "DNS subjectAltNames are not allowed"
        );
    }

    #[test]
    fn apiserver_client_usages() {
        assert!(validate_apiserver_client_csr(&usages(&["client auth", "digital signature"])).is_ok());
        assert_eq!(
            validate_apiserver_client_csr(&usages(&["client auth", "server auth"])).unwrap_err(),
            "invalid usage for client certificate: server auth"
        );
    }

    #[test]
    fn conditions() {
        let csr = serde_json::json!({"status": {"conditions": [{"type": "Approved", "status": "True"}]}});
        assert!(is_approved(&csr));
        assert_eq!(approval(&csr), (true, false));
        let both = serde_json::json!({"status": {"conditions": [{"type": "Approved", "status": "True"}, {"type": "Denied", "status": "True"}]}});
        assert!(!is_approved(&both));
        assert!(!is_approved(&serde_json::json!({})));
    }
}
