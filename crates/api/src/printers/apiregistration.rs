//! apiregistration.k8s.io: APIService, as the kube-aggregator's table convertor prints it.

use jiff::Timestamp;
use serde_json::{Value, json};

use super::format::{age, array_at, name, str_at};
use super::{AGE, Column, NAME};

pub(crate) const APISERVICE_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Service",
        "string",
        "The reference to the service that hosts this API endpoint.",
    ),
    Column::new("Available", "string", "Whether this service is available."),
    AGE,
];

/// SERVICE is `Local` or `namespace/name`; AVAILABLE the `Available` condition: `True`,
/// `False (Reason)` when it has a reason, `Unknown` when there is none.
pub(crate) fn apiservice(obj: &Value, now: Timestamp) -> Vec<Value> {
    let service = match obj.pointer("/spec/service").filter(|s| !s.is_null()) {
        Some(s) => format!("{}/{}", str_at(s, "/namespace"), str_at(s, "/name")),
        None => "Local".to_string(),
    };
    let available = array_at(obj, "/status/conditions")
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some("Available"))
        .map_or_else(
            || "Unknown".to_string(),
            |c| {
                let status = str_at(c, "/status");
                let reason = str_at(c, "/reason");
                if status == "True" || reason.is_empty() {
                    status.to_string()
                } else {
                    format!("{status} ({reason})")
                }
            },
        );
    vec![json!(name(obj)), json!(service), json!(available), json!(age(obj, now))]
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::printers::{column_definitions, row_cells};
    use crate::registry::lookup;

    #[test]
    fn api_service_rows() {
        let r = lookup("apiregistration.k8s.io", "v1", "apiservices").expect("served");
        let names: Vec<String> = column_definitions(r)
            .iter()
            .map(|c| c["name"].as_str().unwrap_or("").to_string())
            .collect();
        assert_eq!(names, ["Name", "Service", "Available", "Age"]);
        let now = "2024-05-01T12:00:00Z".parse().expect("time");
        let local = json!({"metadata": {"name": "v1.apps", "creationTimestamp": "2024-05-01T11:00:00Z"},
            "spec": {"group": "apps", "version": "v1"},
            "status": {"conditions": [{"type": "Available", "status": "True", "reason": "Local"}]}});
        assert_eq!(
            row_cells(r, &local, now),
            [json!("v1.apps"), json!("Local"), json!("True"), json!("60m")]
        );
        let remote = json!({"metadata": {"name": "v1beta1.metrics.k8s.io", "creationTimestamp": "2024-05-01T11:00:00Z"},
            "spec": {"service": {"namespace": "kube-system", "name": "metrics-server"}},
            "status": {"conditions": [{"type": "Available", "status": "False", "reason": "ServiceNotFound"}]}});
        assert_eq!(
            row_cells(r, &remote, now)[1..3],
            [json!("kube-system/metrics-server"), json!("False (ServiceNotFound)")]
        );
        let fresh = json!({"metadata": {"name": "v1.x"}, "spec": {}});
        assert_eq!(row_cells(r, &fresh, now)[2], json!("Unknown"));
    }
}
