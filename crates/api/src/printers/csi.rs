//! storage.k8s.io: CSIDriver, VolumeAttachment and CSIStorageCapacity, as upstream's
//! `printCSIDriver`, `printVolumeAttachment` and `printCSIStorageCapacity`.

use jiff::Timestamp;
use serde_json::{Value, json};

use super::format::{age, array_at, name, str_at};
use super::{AGE, Column, NAME};

const ATTACH_REQUIRED_DESC: &str = "attachRequired indicates this CSI volume driver requires an attach operation (because it implements the CSI ControllerPublishVolume() method), and that the Kubernetes attach detach controller should call the attach volume interface which checks the volumeattachment status and waits until the volume is attached before proceeding to mounting. The CSI external-attacher coordinates with CSI volume driver and updates the volumeattachment status when the attach operation is complete. If the CSIDriverRegistry feature gate is enabled and the value is specified to false, the attach operation will be skipped. Otherwise the attach operation will be called.\n\nThis field is immutable.";
const POD_INFO_ON_MOUNT_DESC: &str = "podInfoOnMount indicates this CSI volume driver requires additional pod information (like podName, podUID, etc.) during mount operations, if set to true. If set to false, pod information will not be passed on mount. Default is false.\n\nThe CSI driver specifies podInfoOnMount as part of driver deployment. If true, Kubelet will pass pod information as VolumeContext in the CSI NodePublishVolume() calls. The CSI driver is responsible for parsing and validating the information passed in as VolumeContext.\n\nThe following VolumeContext will be passed if podInfoOnMount is set to true. This list might grow, but the prefix will be used. \"csi.storage.k8s.io/pod.name\": pod.Name \"csi.storage.k8s.io/pod.namespace\": pod.Namespace \"csi.storage.k8s.io/pod.uid\": string(pod.UID) \"csi.storage.k8s.io/ephemeral\": \"true\" if the volume is an ephemeral inline volume\n                                defined by a CSIVolumeSource, otherwise \"false\"\n\n\"csi.storage.k8s.io/ephemeral\" is a new feature in Kubernetes 1.16. It is only required for drivers which support both the \"Persistent\" and \"Ephemeral\" VolumeLifecycleMode. Other drivers can leave pod info disabled and/or ignore this field. As Kubernetes 1.15 doesn't support this field, drivers can only support one mode when deployed on such a cluster and the deployment determines which mode that is, for example via a command line parameter of the driver.\n\nThis field was immutable in Kubernetes < 1.29 and now is mutable.";
const STORAGE_CAPACITY_DESC: &str = "storageCapacity indicates that the CSI volume driver wants pod scheduling to consider the storage capacity that the driver deployment will report by creating CSIStorageCapacity objects with capacity information, if set to true.\n\nThe check can be enabled immediately when deploying a driver. In that case, provisioning new volumes with late binding will pause until the driver deployment has published some suitable CSIStorageCapacity object.\n\nAlternatively, the driver can be deployed with the field unset or false and it can be flipped later when storage capacity information has been published.\n\nThis field was immutable in Kubernetes <= 1.22 and now is mutable.";
const TOKEN_REQUESTS_DESC: &str = "tokenRequests indicates the CSI driver needs pods' service account tokens it is mounting volume for to do necessary authentication. Kubelet will pass the tokens in VolumeContext in the CSI NodePublishVolume calls. The CSI driver should parse and validate the following VolumeContext: \"csi.storage.k8s.io/serviceAccount.tokens\": {\n  \"<audience>\": {\n    \"token\": <token>,\n    \"expirationTimestamp\": <expiration timestamp in RFC3339>,\n  },\n  ...\n}\n\nNote: Audience in each TokenRequest should be different and at most one token is empty string. To receive a new token after expiry, RequiresRepublish can be used to trigger NodePublishVolume periodically.";
const REQUIRES_REPUBLISH_DESC: &str = "requiresRepublish indicates the CSI driver wants `NodePublishVolume` being periodically called to reflect any possible change in the mounted volume. This field defaults to false.\n\nNote: After a successful initial NodePublishVolume call, subsequent calls to NodePublishVolume should only update the contents of the volume. New mount points will not be seen by a running container.";
const MODES_DESC: &str = "volumeLifecycleModes defines what kind of volumes this CSI volume driver supports. The default if the list is empty is \"Persistent\", which is the usage defined by the CSI specification and implemented in Kubernetes via the usual PV/PVC mechanism.\n\nThe other mode is \"Ephemeral\". In this mode, volumes are defined inline inside the pod spec with CSIVolumeSource and their lifecycle is tied to the lifecycle of that pod. A driver has to be aware of this because it is only going to get a NodePublishVolume call for such a volume.\n\nFor more information about implementing this mode, see https://kubernetes-csi.github.io/docs/ephemeral-local-volumes.html A driver can support one or more of these modes and more modes may be added in the future.\n\nThis field is beta. This field is immutable.";

pub(crate) const CSIDRIVER_COLUMNS: &[Column] = &[
    NAME,
    Column::new("AttachRequired", "boolean", ATTACH_REQUIRED_DESC),
    Column::new("PodInfoOnMount", "boolean", POD_INFO_ON_MOUNT_DESC),
    Column::new("StorageCapacity", "boolean", STORAGE_CAPACITY_DESC),
    Column::new("TokenRequests", "string", TOKEN_REQUESTS_DESC),
    Column::new("RequiresRepublish", "boolean", REQUIRES_REPUBLISH_DESC),
    Column::new("Modes", "string", MODES_DESC),
    AGE,
];

fn bool_or(obj: &Value, pointer: &str, default: bool) -> bool {
    obj.pointer(pointer).and_then(Value::as_bool).unwrap_or(default)
}

/// Upstream's `printCSIDriver`: token requests' audiences (`<unset>` without a list), modes
/// (`<none>` without any).
pub(crate) fn csidriver(obj: &Value, now: Timestamp) -> Vec<Value> {
    let modes: Vec<&str> = array_at(obj, "/spec/volumeLifecycleModes")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let modes = if modes.is_empty() {
        "<none>".to_string()
    } else {
        modes.join(",")
    };
    let tokens = match obj.pointer("/spec/tokenRequests").and_then(Value::as_array) {
        None => "<unset>".to_string(),
        Some(list) => list
            .iter()
            .map(|t| str_at(t, "/audience"))
            .collect::<Vec<_>>()
            .join(","),
    };
    vec![
        json!(name(obj)),
        json!(bool_or(obj, "/spec/attachRequired", true)),
        json!(bool_or(obj, "/spec/podInfoOnMount", false)),
        json!(bool_or(obj, "/spec/storageCapacity", false)),
        json!(tokens),
        json!(bool_or(obj, "/spec/requiresRepublish", false)),
        json!(modes),
        json!(age(obj, now)),
    ]
}

pub(crate) const VOLUMEATTACHMENT_COLUMNS: &[Column] = &[
    NAME,
    Column {
        name: "Attacher",
        ty: "string",
        format: "name",
        description: "attacher indicates the name of the volume driver that MUST handle this request. This is the name returned by GetPluginName().",
        priority: 0,
    },
    Column::new(
        "PV",
        "string",
        "persistentVolumeName represents the name of the persistent volume to attach.",
    ),
    Column::new(
        "Node",
        "string",
        "nodeName represents the node that the volume should be attached to.",
    ),
    Column::new(
        "Attached",
        "boolean",
        "attached indicates the volume is successfully attached. This field must only be set by the entity completing the attach operation, i.e. the external-attacher.",
    ),
    AGE,
];

/// Upstream's `printVolumeAttachment`.
pub(crate) fn volumeattachment(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![
        json!(name(obj)),
        json!(str_at(obj, "/spec/attacher")),
        json!(str_at(obj, "/spec/source/persistentVolumeName")),
        json!(str_at(obj, "/spec/nodeName")),
        json!(bool_or(obj, "/status/attached", false)),
        json!(age(obj, now)),
    ]
}

/// Upstream's columns have no Age.
pub(crate) const CSISTORAGECAPACITY_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "StorageClassName",
        "string",
        "storageClassName represents the name of the StorageClass that the reported capacity applies to. It must meet the same requirements as the name of a StorageClass object (non-empty, DNS subdomain). If that object no longer exists, the CSIStorageCapacity object is obsolete and should be removed by its creator. This field is immutable.",
    ),
    Column::new(
        "Capacity",
        "string",
        "capacity is the value reported by the CSI driver in its GetCapacityResponse for a GetCapacityRequest with topology and parameters that match the previous fields.\n\nThe semantic is currently (CSI spec 1.2) defined as: The available capacity, in bytes, of the storage that can be used to provision volumes. If not set, that information is currently unavailable.",
    ),
];

/// Upstream's `printCSIStorageCapacity`: the capacity as its canonical quantity, `<unset>`.
pub(crate) fn csistoragecapacity(obj: &Value) -> Vec<Value> {
    let capacity = match obj.get("capacity").filter(|v| !v.is_null()) {
        None => "<unset>".to_string(),
        Some(c) => super::format::quantity(Some(c)),
    };
    vec![
        json!(name(obj)),
        json!(str_at(obj, "/storageClassName")),
        json!(capacity),
    ]
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use crate::printers::{column_definitions, row_cells};
    use crate::registry::lookup;

    fn cells(plural: &str, obj: &Value) -> (Vec<String>, Vec<Value>) {
        let r = lookup("storage.k8s.io", "v1", plural).expect("served");
        let now = "2024-05-01T12:00:00Z".parse().expect("time");
        let names: Vec<String> = column_definitions(r)
            .iter()
            .map(|c| c["name"].as_str().unwrap_or("").to_string())
            .collect();
        let cells = row_cells(r, obj, now);
        assert_eq!(cells.len(), names.len());
        (names, cells)
    }

    const CREATED: &str = "2024-05-01T11:00:00Z";

    #[test]
    fn csi_driver_rows() {
        let d = json!({"metadata": {"name": "hostpath.csi.k8s.io", "creationTimestamp": CREATED}, "spec": {
            "attachRequired": true, "podInfoOnMount": true, "volumeLifecycleModes": ["Persistent", "Ephemeral"]}});
        let (names, row) = cells("csidrivers", &d);
        assert_eq!(
            names,
            [
                "Name",
                "AttachRequired",
                "PodInfoOnMount",
                "StorageCapacity",
                "TokenRequests",
                "RequiresRepublish",
                "Modes",
                "Age"
            ]
        );
        assert_eq!(
            row,
            [
                json!("hostpath.csi.k8s.io"),
                json!(true),
                json!(true),
                json!(false),
                json!("<unset>"),
                json!(false),
                json!("Persistent,Ephemeral"),
                json!("60m")
            ]
        );
        let d = json!({"metadata": {"name": "d"}, "spec": {"attachRequired": false,
            "tokenRequests": [{"audience": "vault"}, {"audience": "gcp"}]}});
        let (_, row) = cells("csidrivers", &d);
        assert_eq!(row[1], json!(false));
        assert_eq!(row[4], json!("vault,gcp"));
        assert_eq!(row[6], json!("<none>"));
    }

    #[test]
    fn volume_attachment_rows() {
        let va = json!({"metadata": {"name": "csi-123", "creationTimestamp": CREATED},
            "spec": {"attacher": "hostpath.csi.k8s.io", "source": {"persistentVolumeName": "pv1"}, "nodeName": "n1"},
            "status": {"attached": true}});
        let (names, row) = cells("volumeattachments", &va);
        assert_eq!(names, ["Name", "Attacher", "PV", "Node", "Attached", "Age"]);
        assert_eq!(
            row,
            [
                json!("csi-123"),
                json!("hostpath.csi.k8s.io"),
                json!("pv1"),
                json!("n1"),
                json!(true),
                json!("60m")
            ]
        );
    }

    #[test]
    fn storage_capacity_rows() {
        let c = json!({"metadata": {"name": "c"}, "storageClassName": "standard", "capacity": "1024Mi"});
        let (names, row) = cells("csistoragecapacities", &c);
        assert_eq!(names, ["Name", "StorageClassName", "Capacity"]);
        assert_eq!(row, [json!("c"), json!("standard"), json!("1Gi")]);
        let c = json!({"metadata": {"name": "c"}, "storageClassName": "standard"});
        assert_eq!(cells("csistoragecapacities", &c).1[2], json!("<unset>"));
    }
}
