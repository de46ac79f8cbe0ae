//! The CSR approving controller (upstream's `pkg/controller/certificates/approver`,
//! `sarapprove.go`): a pending node client request is approved when its requestor may create
//! `certificatesigningrequests/selfnodeclient` (a node renewing its own certificate: the
//! request's CN is the requestor) or `certificatesigningrequests/nodeclient` (a bootstrap
//! token's first request), asked of the authorizer through a SubjectAccessReview for the
//! requestor recorded in the request.

use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestCondition};
use kube::Api;
use kube::api::PostParams;
use kube::runtime::reflector::{ObjectRef, Store};
use skiff_api::certificates as capi;

use crate::controller_utils::{self as cu, WorkQueue};

/// One kind of request the approver knows and the permission it asks for.
struct Recognizer {
    recognize: fn(&CertificateSigningRequest, &capi::ParsedCsr) -> bool,
    subresource: &'static str,
    message: &'static str,
}

const RECOGNIZERS: &[Recognizer] = &[
    Recognizer {
        recognize: is_self_node_client_cert,
        subresource: "selfnodeclient",
        message: "Auto approving self kubelet client certificate after SubjectAccessReview.",
    },
    Recognizer {
        recognize: is_node_client_cert,
        subresource: "nodeclient",
        message: "Auto approving kubelet client certificate after SubjectAccessReview.",
    },
];

fn is_node_client_cert(csr: &CertificateSigningRequest, req: &capi::ParsedCsr) -> bool {
    if csr.spec.signer_name != capi::KUBE_APISERVER_CLIENT_KUBELET_SIGNER {
        return false;
    }
    let usages = csr.spec.usages.clone().unwrap_or_default().into_iter().collect();
    capi::is_kubelet_client_csr(req, &usages)
}

fn is_self_node_client_cert(csr: &CertificateSigningRequest, req: &capi::ParsedCsr) -> bool {
    csr.spec.username.as_deref() == Some(req.common_name.as_str()) && is_node_client_cert(csr, req)
}

struct Ctx {
    client: kube::Client,
    csrs: Store<CertificateSigningRequest>,
}

pub async fn run(client: kube::Client) -> anyhow::Result<()> {
    let queue = WorkQueue::new();
    let csrs = cu::spawn_store_watch(
        Api::<CertificateSigningRequest>::all(client.clone()),
        queue.clone(),
        |csr: &CertificateSigningRequest| csr.metadata.name.clone().into_iter().collect(),
    );
    let ctx = Ctx { client, csrs };
    queue.run("csrapproving", |name| handle(&ctx, name)).await
}

/// upstream's `sarApprover.handle`.
async fn handle(ctx: &Ctx, name: String) -> anyhow::Result<Option<Duration>> {
    let Some(csr) = ctx.csrs.get(&ObjectRef::new(&name)) else {
        return Ok(None);
    };
    let json = serde_json::to_value(&*csr).context("encoding the request")?;
    if capi::issued_certificate(&json).is_some() {
        return Ok(None);
    }
    let (approved, denied) = capi::approval(&json);
    if approved || denied {
        return Ok(None);
    }
    let req = capi::parse_csr(&csr.spec.request.0).map_err(|e| anyhow::anyhow!("unable to parse csr {name:?}: {e}"))?;
    let mut tried = Vec::new();
    for r in RECOGNIZERS {
        if !(r.recognize)(&csr, &req) {
            continue;
        }
        tried.push(r.subresource);
        if authorize(ctx, &csr, r.subresource).await? {
            let mut updated = (*csr).clone();
            updated
                .status
                .get_or_insert_with(Default::default)
                .conditions
                .get_or_insert_with(Vec::new)
                .push(CertificateSigningRequestCondition {
                    type_: capi::APPROVED.into(),
                    status: "True".into(),
                    reason: Some("AutoApproved".into()),
                    message: Some(r.message.into()),
                    ..Default::default()
                });
            Api::<CertificateSigningRequest>::all(ctx.client.clone())
                .replace_subresource("approval", &name, &PostParams::default(), &updated)
                .await
                .context("error updating approval for csr")?;
            tracing::info!(csr = %name, requestor = ?csr.spec.username, "approved a node client certificate request");
            return Ok(None);
        }
    }
    if !tried.is_empty() {
        // upstream's IgnorableError: logged, not retried.
        tracing::info!(csr = %name, ?tried, "recognized the request but the subject access review was not approved");
    }
    Ok(None)
}

/// Whether the requestor may create `certificatesigningrequests/SUBRESOURCE`.
async fn authorize(ctx: &Ctx, csr: &CertificateSigningRequest, subresource: &str) -> anyhow::Result<bool> {
    let sar = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: csr.spec.username.clone(),
            uid: csr.spec.uid.clone(),
            groups: csr.spec.groups.clone(),
            extra: csr.spec.extra.clone(),
            resource_attributes: Some(ResourceAttributes {
                group: Some("certificates.k8s.io".into()),
                resource: Some("certificatesigningrequests".into()),
                verb: Some("create".into()),
                subresource: Some(subresource.into()),
                version: Some("*".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SubjectAccessReview>::all(ctx.client.clone())
        .create(&PostParams::default(), &sar)
        .await
        .context("creating a subject access review")?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use k8s_openapi::api::certificates::v1::CertificateSigningRequestSpec;

    fn csr(username: &str, cn: &str, signer: &str) -> (CertificateSigningRequest, capi::ParsedCsr) {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:nodes");
        let pem = params.serialize_request(&key).unwrap().pem().unwrap();
        let parsed = capi::parse_csr(pem.as_bytes()).unwrap();
        let csr = CertificateSigningRequest {
            spec: CertificateSigningRequestSpec {
                request: ByteString(pem.into_bytes()),
                signer_name: signer.into(),
                usages: Some(vec!["digital signature".into(), "client auth".into()]),
                username: Some(username.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        (csr, parsed)
    }

    #[test]
    fn recognizes_first_and_renewal_requests() {
        let kubelet = capi::KUBE_APISERVER_CLIENT_KUBELET_SIGNER;
        let (first, req) = csr("system:bootstrap:abcdef", "system:node:n1", kubelet);
        assert!(is_node_client_cert(&first, &req));
        assert!(!is_self_node_client_cert(&first, &req));
        let (renew, req) = csr("system:node:n1", "system:node:n1", kubelet);
        assert!(is_self_node_client_cert(&renew, &req));
        let (other_node, req) = csr("system:node:n2", "system:node:n1", kubelet);
        assert!(!is_self_node_client_cert(&other_node, &req));
        let (client, req) = csr("alice", "system:node:n1", capi::KUBE_APISERVER_CLIENT_SIGNER);
        assert!(!is_node_client_cert(&client, &req));
    }
}
