//! CertificateSigningRequest, as upstream's `pkg/apis/certificates/validation`
//! (`ValidateCertificateSigningRequestCreate`, `...Update`, `...StatusUpdate`,
//! `...ApprovalUpdate`, `ValidateCertificateSigningRequestSignerName`), with its compatibility
//! options for what an already stored object carries.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::meta::{is_dns1123_label, is_dns1123_subdomain};
use super::{Path, arr_at, duplicate, forbidden, invalid, invalid_raw, invalid_str, not_supported, required, str_at};
use crate::certificates::{ALL_USAGES, APPROVED, DENIED, FAILED, LEGACY_UNKNOWN_SIGNER, parse_csr, request_pem};
use crate::status::FieldError;

/// Which write the object comes through: the main resource, `status` (may set the certificate)
/// or `approval` (may set Approved and Denied).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CsrWrite {
    Main,
    Status,
    Approval,
}

#[derive(Default)]
struct Options {
    allow_setting_approval_conditions: bool,
    allow_setting_certificate: bool,
    allow_both_approved_and_denied: bool,
    allow_legacy_signer_name: bool,
    allow_duplicate_condition_types: bool,
    allow_empty_condition_type: bool,
    allow_arbitrary_certificate: bool,
    allow_unknown_usages: bool,
    allow_duplicate_usages: bool,
}

fn conditions(csr: &Value) -> &[Value] {
    arr_at(csr.get("status"), "conditions")
}

fn certificate(csr: &Value) -> &str {
    str_at(csr.get("status"), "certificate")
}

fn usages_of(csr: &Value) -> Vec<&str> {
    arr_at(csr.get("spec"), "usages")
        .iter()
        .filter_map(Value::as_str)
        .collect()
}

/// upstream's `getValidationOptions`: what a stored object already carries is tolerated.
fn options(new: &Value, old: Option<&Value>, write: CsrWrite) -> Options {
    let types = |c: &Value| {
        conditions(c)
            .iter()
            .map(|c| str_at(Some(c), "type").to_string())
            .collect::<Vec<_>>()
    };
    let mut o = Options {
        allow_setting_approval_conditions: write == CsrWrite::Approval,
        allow_setting_certificate: write == CsrWrite::Status,
        ..Default::default()
    };
    if let Some(old) = old {
        let t = types(old);
        o.allow_both_approved_and_denied = t.iter().any(|x| x == APPROVED) && t.iter().any(|x| x == DENIED);
        o.allow_legacy_signer_name = str_at(old.get("spec"), "signerName") == LEGACY_UNKNOWN_SIGNER;
        let unique: BTreeSet<&String> = t.iter().collect();
        o.allow_duplicate_condition_types = unique.len() != t.len();
        o.allow_empty_condition_type = t.iter().any(String::is_empty);
        o.allow_arbitrary_certificate =
            certificate(new) == certificate(old) || validate_certificate(certificate(old)).is_err();
        let u = usages_of(old);
        o.allow_unknown_usages = u.iter().any(|x| !ALL_USAGES.contains(x));
        let unique: BTreeSet<&&str> = u.iter().collect();
        o.allow_duplicate_usages = unique.len() != u.len();
    }
    o
}

/// `status.certificate` (base64 of PEM in JSON): empty, or only CERTIFICATE blocks that parse.
fn validate_certificate(b64: &str) -> Result<(), String> {
    use base64::Engine;
    if b64.is_empty() {
        return Ok(());
    }
    let data = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| format!("illegal base64 data: {e}"))?;
    let mut blocks = 0;
    for pem in x509_parser::pem::Pem::iter_from_buffer(&data) {
        let Ok(pem) = pem else { break };
        if pem.label != "CERTIFICATE" {
            return Err(format!(
                "only CERTIFICATE PEM blocks are allowed, found {:?}",
                pem.label
            ));
        }
        blocks += 1;
        x509_parser::parse_x509_certificate(&pem.contents).map_err(|e| format!("x509: malformed certificate: {e}"))?;
    }
    if blocks == 0 {
        return Err("must contain at least one CERTIFICATE PEM block".into());
    }
    Ok(())
}

/// upstream's `ValidateCertificateSigningRequestSignerName`.
pub(crate) fn validate_signer_name(p: &Path, signer: &str, errs: &mut Vec<FieldError>) {
    if signer.is_empty() {
        errs.push(required(p, "signerName must be provided"));
        return;
    }
    let segments: Vec<&str> = signer.split('/').collect();
    if segments.len() != 2 {
        errs.push(invalid_str(
            p,
            signer,
            "must be a fully qualified domain and path of the form 'example.com/signer-name'",
        ));
        return;
    }
    if segments[0].len() > 253 {
        errs.push(FieldError::too_long(p.as_str(), 253));
    }
    let domain: Vec<&str> = segments[0].split('.').collect();
    for label in &domain {
        let msgs = is_dns1123_label(label);
        if !msgs.is_empty() {
            for m in msgs {
                errs.push(invalid_str(p, segments[0], &format!("validating label {label:?}: {m}")));
            }
            break;
        }
    }
    if domain.len() < 2 {
        errs.push(invalid_str(
            p,
            segments[0],
            "should be a domain with at least two segments separated by dots",
        ));
    }
    for label in segments[1].split('.') {
        let msgs = is_dns1123_subdomain(label);
        if !msgs.is_empty() {
            for m in msgs {
                errs.push(invalid_str(p, segments[1], &format!("validating label {label:?}: {m}")));
            }
            break;
        }
    }
    let max = 253 + (253 + 63 + 1) + 1;
    if signer.len() > max {
        errs.push(FieldError::too_long(p.as_str(), max));
    }
}

fn validate_one(csr: &Value, o: &Options, errs: &mut Vec<FieldError>) {
    let spec = Path::new("spec");
    if let Err(e) = request_pem(csr).and_then(|pem| parse_csr(&pem)) {
        let v = csr.pointer("/spec/request").cloned().unwrap_or(json!(""));
        errs.push(invalid(&spec.child("request"), &v, &e));
    }
    let usages = usages_of(csr);
    if usages.is_empty() {
        errs.push(required(&spec.child("usages"), "usages must be provided"));
    }
    if !o.allow_unknown_usages {
        for (i, u) in usages.iter().enumerate() {
            if !ALL_USAGES.contains(u) {
                errs.push(not_supported(&spec.child("usages").index(i), &json!(u), ALL_USAGES));
            }
        }
    }
    if !o.allow_duplicate_usages {
        let mut seen = BTreeSet::new();
        for (i, u) in usages.iter().enumerate() {
            if !seen.insert(*u) {
                errs.push(duplicate(&spec.child("usages").index(i), &json!(u)));
            }
        }
    }
    let signer = str_at(csr.get("spec"), "signerName");
    if !o.allow_legacy_signer_name && signer == LEGACY_UNKNOWN_SIGNER {
        errs.push(invalid_str(
            &spec.child("signerName"),
            signer,
            "the legacy signerName is not allowed via this API version",
        ));
    } else {
        validate_signer_name(&spec.child("signerName"), signer, errs);
    }
    if let Some(secs) = csr.pointer("/spec/expirationSeconds").and_then(Value::as_i64)
        && secs < 600
    {
        errs.push(invalid(
            &spec.child("expirationSeconds"),
            &json!(secs),
            "may not specify a duration less than 600 seconds (10 minutes)",
        ));
    }
    validate_conditions(csr, o, errs);
    if !o.allow_arbitrary_certificate
        && let Err(e) = validate_certificate(certificate(csr))
    {
        errs.push(invalid_raw(
            &Path::new("status").child("certificate"),
            "\"<certificate data>\"".into(),
            &e,
        ));
    }
}

fn validate_conditions(csr: &Value, o: &Options, errs: &mut Vec<FieldError>) {
    let p = Path::new("status").child("conditions");
    let mut seen = BTreeSet::new();
    let (mut has_approved, mut has_denied) = (false, false);
    for (i, c) in conditions(csr).iter().enumerate() {
        let kind = str_at(Some(c), "type");
        let status = str_at(Some(c), "status");
        if !o.allow_empty_condition_type && kind.is_empty() {
            errs.push(required(&p.index(i).child("type"), ""));
        }
        let allowed: &[&str] = if [APPROVED, DENIED, FAILED].contains(&kind) {
            &["True"]
        } else {
            &["False", "True", "Unknown"]
        };
        if status.is_empty() {
            errs.push(required(&p.index(i).child("status"), ""));
        } else if !allowed.contains(&status) {
            errs.push(not_supported(&p.index(i).child("status"), &json!(status), allowed));
        }
        if !o.allow_both_approved_and_denied {
            let exclusive = "Approved and Denied conditions are mutually exclusive";
            if kind == APPROVED {
                has_approved = true;
                if has_denied {
                    errs.push(invalid_str(&p.index(i).child("type"), kind, exclusive));
                }
            } else if kind == DENIED {
                has_denied = true;
                if has_approved {
                    errs.push(invalid_str(&p.index(i).child("type"), kind, exclusive));
                }
            }
        }
        if !o.allow_duplicate_condition_types && !seen.insert(kind) {
            errs.push(duplicate(&p.index(i).child("type"), &json!(kind)));
        }
    }
}

fn of_type(csr: &Value, kind: &str) -> Vec<Value> {
    conditions(csr)
        .iter()
        .filter(|c| str_at(Some(c), "type") == kind)
        .cloned()
        .collect()
}

/// Create (`old` none) or an update through `write`; the metadata is validated by the caller.
pub(crate) fn validate_csr(obj: &Value, old: Option<&Value>, write: CsrWrite, errs: &mut Vec<FieldError>) {
    let o = options(obj, old, write);
    validate_one(obj, &o, errs);
    let Some(old) = old else { return };
    let cp = Path::new("status").child("conditions");
    for t in [APPROVED, DENIED, FAILED] {
        if of_type(obj, t).len() < of_type(old, t).len() {
            errs.push(forbidden(
                &cp,
                &format!("updates may not remove a condition of type {t:?}"),
            ));
        }
    }
    if !o.allow_setting_approval_conditions {
        for t in [APPROVED, DENIED] {
            let (before, after) = (of_type(old, t), of_type(obj, t));
            if after.len() > before.len() {
                errs.push(forbidden(
                    &cp,
                    &format!("updates may not add a condition of type {t:?}"),
                ));
            } else if after.len() == before.len() && after != before {
                errs.push(forbidden(
                    &cp,
                    &format!("updates may not modify a condition of type {t:?}"),
                ));
            }
        }
    }
    if certificate(obj) != certificate(old) {
        let cert = Path::new("status").child("certificate");
        if !o.allow_setting_certificate {
            errs.push(forbidden(&cert, "updates may not set certificate content"));
        } else if !certificate(old).is_empty() {
            errs.push(forbidden(&cert, "updates may not modify existing certificate content"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certificates::test_csr;

    fn csr(signer: &str, usages: &[&str]) -> Value {
        use base64::Engine;
        let pem = test_csr::pem("system:node:n1", &["system:nodes"], &[]);
        json!({
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "CertificateSigningRequest",
            "metadata": {"name": "c1"},
            "spec": {
                "request": base64::engine::general_purpose::STANDARD.encode(pem),
                "signerName": signer,
                "usages": usages,
            }
        })
    }

    fn errors(obj: &Value, old: Option<&Value>, write: CsrWrite) -> Vec<String> {
        let mut errs = Vec::new();
        validate_csr(obj, old, write, &mut errs);
        errs.iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn create_rules() {
        let good = csr(
            "kubernetes.io/kube-apiserver-client-kubelet",
            &["digital signature", "client auth"],
        );
        assert!(errors(&good, None, CsrWrite::Main).is_empty());
        let mut bad = good.clone();
        bad["spec"]["request"] = json!("bm90IHBlbQ==");
        assert_eq!(
            errors(&bad, None, CsrWrite::Main),
            ["spec.request: Invalid value: \"bm90IHBlbQ==\": PEM block type must be CERTIFICATE REQUEST"]
        );
        let none = csr("example.com/x", &[]);
        assert_eq!(
            errors(&none, None, CsrWrite::Main),
            ["spec.usages: Required value: usages must be provided"]
        );
        let dup = csr("example.com/x", &["client auth", "client auth", "fly"]);
        let e = errors(&dup, None, CsrWrite::Main);
        assert!(
            e.iter()
                .any(|m| m.starts_with("spec.usages[2]: Unsupported value: \"fly\"")),
            "{e:?}"
        );
        assert!(
            e.contains(&"spec.usages[1]: Duplicate value: \"client auth\"".to_string()),
            "{e:?}"
        );
        assert_eq!(
            errors(&csr("", &["client auth"]), None, CsrWrite::Main),
            ["spec.signerName: Required value: signerName must be provided"]
        );
        assert_eq!(
            errors(&csr("nodomain", &["client auth"]), None, CsrWrite::Main),
            [
                "spec.signerName: Invalid value: \"nodomain\": must be a fully qualified domain and path of the form 'example.com/signer-name'"
            ]
        );
        assert_eq!(
            errors(&csr("example/x", &["client auth"]), None, CsrWrite::Main),
            [
                "spec.signerName: Invalid value: \"example\": should be a domain with at least two segments separated by dots"
            ]
        );
        assert_eq!(
            errors(&csr(LEGACY_UNKNOWN_SIGNER, &["client auth"]), None, CsrWrite::Main),
            [
                "spec.signerName: Invalid value: \"kubernetes.io/legacy-unknown\": the legacy signerName is not allowed via this API version"
            ]
        );
        let mut short = good.clone();
        short["spec"]["expirationSeconds"] = json!(599);
        assert_eq!(
            errors(&short, None, CsrWrite::Main),
            [
                "spec.expirationSeconds: Invalid value: 599: may not specify a duration less than 600 seconds (10 minutes)"
            ]
        );
    }

    #[test]
    fn approval_conditions_only_through_approval() {
        let old = csr("example.com/x", &["client auth"]);
        let mut approved = old.clone();
        approved["status"] = json!({"conditions": [{"type": "Approved", "status": "True", "reason": "r"}]});
        assert_eq!(
            errors(&approved, Some(&old), CsrWrite::Status),
            ["status.conditions: Forbidden: updates may not add a condition of type \"Approved\""]
        );
        assert!(errors(&approved, Some(&old), CsrWrite::Approval).is_empty());
        // Removing it again is refused everywhere.
        assert_eq!(
            errors(&old, Some(&approved), CsrWrite::Approval),
            ["status.conditions: Forbidden: updates may not remove a condition of type \"Approved\""]
        );
        let mut both = approved.clone();
        both["status"]["conditions"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "Denied", "status": "True"}));
        assert_eq!(
            errors(&both, Some(&approved), CsrWrite::Approval),
            [
                "status.conditions[1].type: Invalid value: \"Denied\": Approved and Denied conditions are mutually exclusive"
            ]
        );
        let mut failed_false = approved.clone();
        failed_false["status"]["conditions"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "Failed", "status": "False"}));
        assert_eq!(
            errors(&failed_false, Some(&approved), CsrWrite::Status),
            ["status.conditions[1].status: Unsupported value: \"False\": supported values: \"True\""]
        );
    }

    #[test]
    fn certificate_only_through_status_and_once() {
        use base64::Engine;
        let old = csr("example.com/x", &["client auth"]);
        let mut issued = old.clone();
        issued["status"] = json!({"certificate": base64::engine::general_purpose::STANDARD.encode("junk")});
        assert_eq!(
            errors(&issued, Some(&old), CsrWrite::Approval),
            [
                "status.certificate: Invalid value: \"<certificate data>\": must contain at least one CERTIFICATE PEM block",
                "status.certificate: Forbidden: updates may not set certificate content"
            ]
        );
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["a".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        issued["status"]["certificate"] = json!(base64::engine::general_purpose::STANDARD.encode(cert.pem()));
        assert!(errors(&issued, Some(&old), CsrWrite::Status).is_empty());
        let mut again = issued.clone();
        let cert2 = rcgen::CertificateParams::new(vec!["b".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        again["status"]["certificate"] = json!(base64::engine::general_purpose::STANDARD.encode(cert2.pem()));
        assert_eq!(
            errors(&again, Some(&issued), CsrWrite::Status),
            ["status.certificate: Forbidden: updates may not modify existing certificate content"]
        );
    }
}
