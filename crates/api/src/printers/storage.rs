//! storage.k8s.io: StorageClass and CSINode, as upstream's `printStorageClass` and
//! `printCSINode`.

use jiff::Timestamp;
use serde_json::{Value, json};

use super::format::{age, name};
use super::{AGE, Column, NAME};
use crate::volume::{ANN_BETA_IS_DEFAULT_CLASS, ANN_IS_DEFAULT_CLASS};

pub(crate) const STORAGECLASS_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Provisioner",
        "string",
        "provisioner indicates the type of the provisioner.",
    ),
    Column::new(
        "ReclaimPolicy",
        "string",
        "reclaimPolicy controls the reclaimPolicy for dynamically provisioned PersistentVolumes of this storage class. Defaults to Delete.",
    ),
    Column::new(
        "VolumeBindingMode",
        "string",
        "volumeBindingMode indicates how PersistentVolumeClaims should be provisioned and bound.  When unset, VolumeBindingImmediate is used. This field is only honored by servers that enable the VolumeScheduling feature.",
    ),
    Column::new(
        "AllowVolumeExpansion",
        "string",
        "allowVolumeExpansion shows whether the storage class allow volume expand.",
    ),
    AGE,
];

/// upstream's `IsDefaultAnnotation` (as [`crate::volume::is_default_class`], on the object as
/// JSON): either annotation set to "true".
fn is_default_class(obj: &Value) -> bool {
    let ann = |k: &str| {
        obj.pointer("/metadata/annotations")
            .and_then(|a| a.get(k))
            .and_then(Value::as_str)
    };
    [ANN_IS_DEFAULT_CLASS, ANN_BETA_IS_DEFAULT_CLASS]
        .iter()
        .any(|k| ann(k) == Some("true"))
}

pub(crate) fn storageclass(obj: &Value, now: Timestamp) -> Vec<Value> {
    let mut shown = name(obj).to_string();
    if is_default_class(obj) {
        shown.push_str(" (default)");
    }
    let text = |key: &str, unset: &str| -> String { obj.get(key).and_then(Value::as_str).unwrap_or(unset).to_string() };
    vec![
        json!(shown),
        json!(text("provisioner", "")),
        json!(text("reclaimPolicy", "Delete")),
        json!(text("volumeBindingMode", "Immediate")),
        json!(
            obj.get("allowVolumeExpansion")
                .and_then(Value::as_bool)
                .unwrap_or(false)
        ),
        json!(age(obj, now)),
    ]
}

pub(crate) const CSINODE_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Drivers",
        "integer",
        "Drivers indicates the number of CSI drivers registered on the node",
    ),
    AGE,
];

/// upstream's `printCSINode`: the number of drivers registered.
pub(crate) fn csinode(obj: &Value, now: Timestamp) -> Vec<Value> {
    let drivers = obj
        .pointer("/spec/drivers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    vec![json!(name(obj)), json!(drivers), json!(age(obj, now))]
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::printers::{column_definitions, row_cells};
    use crate::registry::lookup;

    #[test]
    fn storageclass_rows() {
        let r = lookup("storage.k8s.io", "v1", "storageclasses").expect("storageclasses");
        let defs = column_definitions(r);
        let names: Vec<&str> = defs.iter().filter_map(|c| c["name"].as_str()).collect();
        assert_eq!(
            names,
            [
                "Name",
                "Provisioner",
                "ReclaimPolicy",
                "VolumeBindingMode",
                "AllowVolumeExpansion",
                "Age"
            ]
        );
        let now = "2024-05-01T12:00:00Z".parse().expect("time");
        let sc = json!({
            "metadata": {"name": "local", "creationTimestamp": "2024-05-01T11:00:00Z"},
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "WaitForFirstConsumer"
        });
        assert_eq!(
            row_cells(r, &sc, now),
            vec![
                json!("local"),
                json!("kubernetes.io/no-provisioner"),
                json!("Delete"),
                json!("WaitForFirstConsumer"),
                json!(false),
                json!("60m"),
            ]
        );
        let mut default = sc.clone();
        default["metadata"]["annotations"] = json!({"storageclass.kubernetes.io/is-default-class": "true"});
        default["reclaimPolicy"] = json!("Retain");
        default["allowVolumeExpansion"] = json!(true);
        let cells = row_cells(r, &default, now);
        assert_eq!(cells[0], "local (default)");
        assert_eq!(cells[2], "Retain");
        assert_eq!(cells[4], true);
        let mut beta = sc.clone();
        beta["metadata"]["annotations"] = json!({"storageclass.beta.kubernetes.io/is-default-class": "true"});
        assert_eq!(row_cells(r, &beta, now)[0], "local (default)");
        let mut not_default = sc;
        not_default["metadata"]["annotations"] = json!({"storageclass.kubernetes.io/is-default-class": "false"});
        assert_eq!(row_cells(r, &not_default, now)[0], "local");
    }

    #[test]
    fn csinode_rows() {
        let r = lookup("storage.k8s.io", "v1", "csinodes").expect("csinodes");
        assert!(!r.namespaced);
        let defs = column_definitions(r);
        let names: Vec<&str> = defs.iter().filter_map(|c| c["name"].as_str()).collect();
        assert_eq!(names, ["Name", "Drivers", "Age"]);
        assert_eq!(defs[1]["type"], "integer");
        let now = "2024-05-01T12:00:00Z".parse().expect("time");
        let n = json!({
            "metadata": {"name": "node-1", "creationTimestamp": "2024-05-01T11:59:00Z"},
            "spec": {"drivers": [
                {"name": "a.csi.example.com", "nodeID": "node-1"},
                {"name": "b.csi.example.com", "nodeID": "node-1", "allocatable": {"count": 3}}
            ]}
        });
        assert_eq!(row_cells(r, &n, now), vec![json!("node-1"), json!(2), json!("60s")]);
        let empty = json!({"metadata": {"name": "node-2", "creationTimestamp": "2024-05-01T11:59:00Z"}, "spec": {}});
        assert_eq!(row_cells(r, &empty, now)[1], 0);
    }
}
