//! CertificateSigningRequests: upstream's registry strategy
//! (`pkg/registry/certificates/certificates/strategy.go`) and its three admission plugins
//! (`plugin/pkg/admission/certificates`: CertificateApproval, CertificateSigning,
//! CertificateSubjectRestriction).
//!
//! - On create the requestor is the caller: `spec.username`, `uid`, `groups` and `extra` are
//!   set from the authenticated user, and the status is emptied (no pre-approved requests).
//! - The main resource changes metadata only; `status` changes the status but not the approval
//!   conditions; `approval` changes the conditions only.
//! - Approving needs `approve` on `signers` named after the signer (or `DOMAIN/*`), issuing
//!   needs `sign`; `kubernetes.io/kube-apiserver-client` never issues for `system:masters`.

use serde_json::{Value, json};
use skiff_api::StatusError;
use skiff_api::certificates::{KUBE_APISERVER_CLIENT_SIGNER, parse_csr, request_pem};
use skiff_rbac::{Attributes, Decision};

use crate::handlers::Ctx;
use crate::tls::Identity;

/// Whether the resource is `certificatesigningrequests.certificates.k8s.io`.
pub fn is_csr(res: &skiff_api::Resource) -> bool {
    res.group == "certificates.k8s.io" && res.plural == "certificatesigningrequests"
}

/// `PrepareForCreate`: the requestor from the caller, an empty status.
pub fn prepare_create(user: &Identity, obj: &mut Value) {
    let Some(m) = obj.as_object_mut() else { return };
    let spec = m.entry("spec").or_insert_with(|| json!({}));
    if let Some(spec) = spec.as_object_mut() {
        for k in ["username", "uid", "groups", "extra"] {
            spec.remove(k);
        }
        if !user.user.is_empty() {
            spec.insert("username".into(), json!(user.user));
        }
        if !user.uid.is_empty() {
            spec.insert("uid".into(), json!(user.uid));
        }
        if !user.groups.is_empty() {
            spec.insert("groups".into(), json!(user.groups));
        }
        if !user.extra.is_empty() {
            spec.insert("extra".into(), json!(user.extra));
        }
    }
    m.insert("status".into(), json!({}));
}

/// The successor of `old` a write through `subresource` may make from `new`
/// (`PrepareForUpdate` of the strategy, the status strategy and the approval strategy).
pub fn prepare_update(subresource: &str, old: &Value, mut new: Value) -> Value {
    let Some(m) = new.as_object_mut() else { return new };
    let old_status = old.get("status").cloned().unwrap_or_else(|| json!({}));
    match old.get("spec") {
        Some(spec) => m.insert("spec".into(), spec.clone()),
        None => m.remove("spec"),
    };
    match subresource {
        "status" => {
            let status = m.entry("status").or_insert_with(|| json!({}));
            if let Some(s) = status.as_object_mut() {
                match old_status.get("conditions") {
                    Some(c) => s.insert("conditions".into(), c.clone()),
                    None => s.remove("conditions"),
                };
            }
        }
        "approval" => {
            let conditions = m.get("status").and_then(|s| s.get("conditions")).cloned();
            let mut status = old_status;
            if let Some(s) = status.as_object_mut() {
                match conditions {
                    Some(c) => s.insert("conditions".into(), c),
                    None => s.remove("conditions"),
                };
            }
            m.insert("status".into(), status);
        }
        _ => {
            m.insert("status".into(), old_status);
        }
    }
    new
}

/// upstream's `IsAuthorizedForSignerName`: `VERB` on `signers` named the signer, or its
/// `DOMAIN/*` wildcard.
async fn authorized_for_signer(ctx: &Ctx, verb: &str, signer: &str) -> bool {
    let store = &*ctx.state.store;
    let mut names = vec![signer.to_string()];
    if let Some((domain, _)) = signer.split_once('/') {
        names.push(format!("{domain}/*"));
    }
    for name in names {
        let a = Attributes::resource(verb, "certificates.k8s.io", "signers", "", &name);
        if ctx.state.authz.authorize(store, &ctx.user, &a).await.0 == Decision::Allow {
            return true;
        }
    }
    false
}

fn forbidden(ctx: &Ctx, name: &str, msg: String) -> StatusError {
    StatusError::forbidden_resource("certificates.k8s.io", ctx.rr.resource.plural, name, &msg)
}

/// The admission plugins, after the strategy and validation.
pub async fn admit(ctx: &Ctx, obj: &Value, old: Option<&Value>) -> Result<(), StatusError> {
    let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    let signer = obj.pointer("/spec/signerName").and_then(Value::as_str).unwrap_or("");
    match (old, ctx.rr.subresource.as_str()) {
        // CertificateSubjectRestriction.
        (None, _) if signer == KUBE_APISERVER_CLIENT_SIGNER => {
            let parsed = request_pem(obj).and_then(|pem| parse_csr(&pem));
            if let Ok(csr) = &parsed
                && csr.organizations.iter().any(|o| o == crate::pki::SUPER_ADMIN_GROUP)
            {
                return Err(forbidden(
                    ctx,
                    name,
                    format!("use of {KUBE_APISERVER_CLIENT_SIGNER} signer with system:masters group is not allowed"),
                ));
            }
            // Skiff's own parts' names: the certificate node agents let the API server in with,
            // and the break-glass one, are never issued to anyone else.
            if let Ok(csr) = &parsed
                && [crate::pki::KUBELET_CLIENT_USER, crate::pki::SUPER_ADMIN_USER].contains(&csr.common_name.as_str())
            {
                return Err(forbidden(
                    ctx,
                    name,
                    format!(
                        "use of {KUBE_APISERVER_CLIENT_SIGNER} signer with the reserved name {:?} is not allowed",
                        csr.common_name
                    ),
                ));
            }
            Ok(())
        }
        // CertificateApproval.
        (Some(_), "approval") => {
            if !authorized_for_signer(ctx, "approve", signer).await {
                return Err(forbidden(
                    ctx,
                    name,
                    format!("user not permitted to approve requests with signerName {signer:?}"),
                ));
            }
            Ok(())
        }
        // CertificateSigning: only a change of the certificate needs `sign`.
        (Some(old), "status") => {
            let cert = |v: &Value| v.pointer("/status/certificate").cloned();
            if cert(old) != cert(obj) && !authorized_for_signer(ctx, "sign", signer).await {
                return Err(forbidden(
                    ctx,
                    name,
                    format!("user not permitted to sign requests with signerName {signer:?}"),
                ));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_requestor_is_the_caller() {
        let mut id = Identity::new(
            "system:bootstrap:abcdef",
            &["system:bootstrappers", "system:authenticated"],
        );
        id.extra.insert("k".into(), vec!["v".into()]);
        let mut obj = json!({
            "spec": {"username": "system:admin", "groups": ["system:masters"], "uid": "x", "request": "AA"},
            "status": {"conditions": [{"type": "Approved", "status": "True"}]}
        });
        prepare_create(&id, &mut obj);
        assert_eq!(obj["spec"]["username"], "system:bootstrap:abcdef");
        assert_eq!(
            obj["spec"]["groups"],
            json!(["system:bootstrappers", "system:authenticated"])
        );
        assert!(obj["spec"].get("uid").is_none());
        assert_eq!(obj["spec"]["extra"], json!({"k": ["v"]}));
        assert_eq!(obj["status"], json!({}));
    }

    #[test]
    fn each_write_changes_its_own_part() {
        let old = json!({
            "metadata": {"name": "c"},
            "spec": {"username": "u", "usages": ["client auth"]},
            "status": {"conditions": [{"type": "Approved", "status": "True"}]}
        });
        let new = json!({
            "metadata": {"name": "c", "labels": {"a": "b"}},
            "spec": {"username": "evil"},
            "status": {"conditions": [], "certificate": "Q0VSVA=="}
        });
        let main = prepare_update("", &old, new.clone());
        assert_eq!(main["spec"], old["spec"]);
        assert_eq!(main["status"], old["status"]);
        assert_eq!(main["metadata"]["labels"]["a"], "b");
        let status = prepare_update("status", &old, new.clone());
        assert_eq!(status["spec"], old["spec"]);
        assert_eq!(status["status"]["certificate"], "Q0VSVA==");
        assert_eq!(status["status"]["conditions"], old["status"]["conditions"]);
        let approval = prepare_update("approval", &old, new);
        assert_eq!(approval["status"]["conditions"], json!([]));
        assert!(approval["status"].get("certificate").is_none());
    }
}
