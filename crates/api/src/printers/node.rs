//! node.k8s.io: RuntimeClass, as upstream's `printRuntimeClass`.

use jiff::Timestamp;
use serde_json::{Value, json};

use super::format::{age, name, str_at};
use super::{AGE, Column, NAME};

/// Upstream describes the Handler column with ObjectMeta's (absent) `handler` doc: empty.
pub(crate) const RUNTIMECLASS_COLUMNS: &[Column] = &[NAME, Column::new("Handler", "string", ""), AGE];

pub(crate) fn runtimeclass(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![json!(name(obj)), json!(str_at(obj, "/handler")), json!(age(obj, now))]
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::printers::{column_definitions, row_cells};
    use crate::registry::lookup;

    #[test]
    fn runtime_class_rows() {
        let r = lookup("node.k8s.io", "v1", "runtimeclasses").expect("served");
        let defs = column_definitions(r);
        let names: Vec<&str> = defs.iter().map(|c| c["name"].as_str().unwrap_or("")).collect();
        assert_eq!(names, ["Name", "Handler", "Age"]);
        let rc =
            json!({"metadata": {"name": "gvisor", "creationTimestamp": "2024-05-01T11:00:00Z"}, "handler": "runsc"});
        let now = "2024-05-01T12:00:00Z".parse().expect("time");
        assert_eq!(row_cells(r, &rc, now), [json!("gvisor"), json!("runsc"), json!("60m")]);
    }
}
