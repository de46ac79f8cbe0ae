//! certificates.k8s.io: CertificateSigningRequest, as upstream's
//! `printCertificateSigningRequest` and `extractCSRStatus`.

use jiff::Timestamp;
use serde_json::{Value, json};

use super::format::{age, human_duration, name};
use super::{AGE, Column, NAME};

pub(crate) const CSR_COLUMNS: &[Column] = &[
    NAME,
    AGE,
    Column::new(
        "SignerName",
        "string",
        "signerName indicates the requested signer, and is a qualified name.",
    ),
    Column::new("Requestor", "string", "Base64-encoded PKCS#10 CSR data"),
    Column::new(
        "RequestedDuration",
        "string",
        "expirationSeconds is the requested duration of validity of the issued certificate.",
    ),
    Column::new(
        "Condition",
        "string",
        "Conditions applied to the request, such as approval or denial.",
    ),
];

/// `Approved`, `Denied` or `Pending`, then `,Failed` and `,Issued` as they apply.
fn condition(obj: &Value) -> String {
    let (mut approved, mut denied, mut failed) = (false, false, false);
    for c in obj
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
    {
        match c.get("type").and_then(Value::as_str) {
            Some("Approved") => approved = true,
            Some("Denied") => denied = true,
            Some("Failed") => failed = true,
            _ => {}
        }
    }
    let mut s = String::from(if denied {
        "Denied"
    } else if approved {
        "Approved"
    } else {
        "Pending"
    });
    if failed {
        s.push_str(",Failed");
    }
    if obj
        .pointer("/status/certificate")
        .and_then(Value::as_str)
        .is_some_and(|c| !c.is_empty())
    {
        s.push_str(",Issued");
    }
    s
}

pub(crate) fn csr(obj: &Value, now: Timestamp) -> Vec<Value> {
    let signer = obj
        .pointer("/spec/signerName")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or("<none>");
    let requestor = obj.pointer("/spec/username").and_then(Value::as_str).unwrap_or("");
    let duration = obj
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_i64)
        .map_or_else(
            || "<none>".to_string(),
            |s| human_duration(i128::from(s) * 1_000_000_000),
        );
    vec![
        json!(name(obj)),
        json!(age(obj, now)),
        json!(signer),
        json!(requestor),
        json!(duration),
        json!(condition(obj)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::printers::{column_definitions, row_cells};
    use crate::registry::lookup;

    #[test]
    fn csr_rows() {
        let r = lookup("certificates.k8s.io", "v1", "certificatesigningrequests").expect("csr");
        let names: Vec<String> = column_definitions(r)
            .iter()
            .filter_map(|c| c["name"].as_str().map(str::to_string))
            .collect();
        assert_eq!(
            names,
            [
                "Name",
                "Age",
                "SignerName",
                "Requestor",
                "RequestedDuration",
                "Condition"
            ]
        );
        let now = "2024-05-01T12:00:00Z".parse().expect("time");
        let pending = json!({
            "metadata": {"name": "node-csr-1", "creationTimestamp": "2024-05-01T11:59:00Z"},
            "spec": {"signerName": "kubernetes.io/kube-apiserver-client-kubelet", "username": "system:bootstrap:abcdef"}
        });
        assert_eq!(
            row_cells(r, &pending, now),
            vec![
                json!("node-csr-1"),
                json!("60s"),
                json!("kubernetes.io/kube-apiserver-client-kubelet"),
                json!("system:bootstrap:abcdef"),
                json!("<none>"),
                json!("Pending")
            ]
        );
        let issued = json!({
            "metadata": {"name": "c", "creationTimestamp": "2024-05-01T11:59:00Z"},
            "spec": {"signerName": "example.com/x", "username": "u", "expirationSeconds": 3600},
            "status": {"conditions": [{"type": "Approved"}, {"type": "Failed"}], "certificate": "AAAA"}
        });
        let cells = row_cells(r, &issued, now);
        assert_eq!(cells[4], json!("60m"));
        assert_eq!(cells[5], json!("Approved,Failed,Issued"));
        let denied =
            json!({"metadata": {"name": "d"}, "status": {"conditions": [{"type": "Approved"}, {"type": "Denied"}]}});
        assert_eq!(row_cells(r, &denied, now)[5], json!("Denied"));
    }
}
