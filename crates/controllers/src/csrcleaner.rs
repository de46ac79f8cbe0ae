//! The CSR cleaner (upstream's `pkg/controller/certificates/cleaner`): every hour, requests
//! that are done with are deleted: approved or denied or failed ones an hour after they were
//! decided (approved ones whether or not a certificate was issued), pending ones after a day,
//! and any whose issued certificate has expired.

use std::time::Duration;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use skiff_api::certificates as capi;

use crate::controller_utils as cu;

const POLLING_INTERVAL: Duration = Duration::from_secs(3600);
const APPROVED_EXPIRATION: i64 = 3600;
const DENIED_EXPIRATION: i64 = 3600;
const PENDING_EXPIRATION: i64 = 24 * 3600;

pub async fn run(client: kube::Client) -> anyhow::Result<()> {
    let api = Api::<CertificateSigningRequest>::all(client);
    loop {
        match api.list(&ListParams::default()).await {
            Ok(list) => {
                let now = jiff::Timestamp::now();
                for csr in list.items {
                    if let Some(why) = done_with(&csr, now) {
                        let name = csr.metadata.name.clone().unwrap_or_default();
                        tracing::info!(csr = %name, why, "deleting a certificate signing request");
                        if let Err(e) = api.delete(&name, &DeleteParams::default()).await
                            && !cu::is_not_found(&e)
                        {
                            tracing::warn!(csr = %name, error = %e, "deleting a certificate signing request");
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "listing certificate signing requests"),
        }
        tokio::time::sleep(POLLING_INTERVAL).await;
    }
}

fn seconds_since(t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>, now: jiff::Timestamp) -> i64 {
    t.map_or(0, |t| now.as_second() - t.0.as_second())
}

/// Why the request is to go, if it is.
fn done_with(csr: &CertificateSigningRequest, now: jiff::Timestamp) -> Option<&'static str> {
    let conditions = csr.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or(&[]);
    let created = csr.metadata.creation_timestamp.as_ref();
    for c in conditions {
        let when = c.last_update_time.as_ref().or(created);
        let age = seconds_since(when, now);
        match c.type_.as_str() {
            capi::APPROVED if age > APPROVED_EXPIRATION => return Some("approved an hour ago"),
            capi::DENIED if age > DENIED_EXPIRATION => return Some("denied an hour ago"),
            capi::FAILED if age > DENIED_EXPIRATION => return Some("failed an hour ago"),
            _ => {}
        }
    }
    if conditions.is_empty() && seconds_since(created, now) > PENDING_EXPIRATION {
        return Some("pending for a day");
    }
    if let Some(cert) = csr.status.as_ref().and_then(|s| s.certificate.as_ref())
        && let Some(Ok(block)) = x509_parser::pem::Pem::iter_from_buffer(&cert.0).next()
        && let Ok((_, x509)) = x509_parser::parse_x509_certificate(&block.contents)
        && x509.validity().not_after.timestamp() < now.as_second()
    {
        return Some("its certificate expired");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::certificates::v1::{CertificateSigningRequestCondition, CertificateSigningRequestStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn at(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn ages() {
        let now = at("2026-01-02T12:00:00Z");
        let mut csr = CertificateSigningRequest::default();
        csr.metadata.creation_timestamp = Some(Time(at("2026-01-02T11:00:00Z")));
        assert_eq!(done_with(&csr, now), None);
        csr.metadata.creation_timestamp = Some(Time(at("2026-01-01T11:00:00Z")));
        assert_eq!(done_with(&csr, now), Some("pending for a day"));
        csr.status = Some(CertificateSigningRequestStatus {
            conditions: Some(vec![CertificateSigningRequestCondition {
                type_: "Approved".into(),
                status: "True".into(),
                last_update_time: Some(Time(at("2026-01-02T11:30:00Z"))),
                ..Default::default()
            }]),
            ..Default::default()
        });
        assert_eq!(done_with(&csr, now), None);
        assert_eq!(
            done_with(&csr, at("2026-01-02T12:31:00Z")),
            Some("approved an hour ago")
        );
    }
}
