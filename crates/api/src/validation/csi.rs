//! CSIDriver, VolumeAttachment and CSIStorageCapacity (`storage.k8s.io/v1`), as upstream's
//! `pkg/apis/storage/validation` (`ValidateCSIDriver`, `ValidateCSIDriverUpdate`,
//! `ValidateVolumeAttachment` with `ValidateVolumeAttachmentV1`, `ValidateVolumeAttachmentUpdate`,
//! `ValidateCSIStorageCapacity`, `ValidateCSIStorageCapacityUpdate`) with 1.33's default gates.

use std::collections::HashSet;

use serde_json::Value;

use super::meta::{is_dns1123_subdomain, name_is_dns_subdomain, validate_label_selector};
use super::{
    Path, arr_at, duplicate, field, go_label_selector, go_string_slice, invalid, invalid_raw, invalid_str,
    not_supported, required, semantic_eq, str_at,
};
use crate::quantity::Quantity;
use crate::status::FieldError;

const FS_GROUP_POLICIES: &[&str] = &["File", "None", "ReadWriteOnceWithFSType"];
const LIFECYCLE_MODES: &[&str] = &["Persistent", "Ephemeral"];
/// `maxAttachedVolumeMetadataSize` and `maxVolumeErrorMessageSize`.
const MAX_ATTACHED_VOLUME_METADATA_SIZE: usize = 256 * (1 << 10);
const MAX_VOLUME_ERROR_MESSAGE_SIZE: usize = 1024;

/// `ValidateCSIDriver`, and on update `ValidateCSIDriverUpdate`'s immutable fields.
pub(crate) fn validate_csi_driver(obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let spec = field(Some(obj), "spec");
    let p = Path::new("spec");
    // upstream names the attachRequired field `attachedRequired` in its paths.
    for (key, path) in [
        ("attachRequired", "attachedRequired"),
        ("podInfoOnMount", "podInfoOnMount"),
        ("storageCapacity", "storageCapacity"),
    ] {
        if field(spec, key).is_none() {
            errs.push(required(&p.child(path), ""));
        }
    }
    if let Some(policy) = field(spec, "fsGroupPolicy")
        && !FS_GROUP_POLICIES.contains(&policy.as_str().unwrap_or(""))
    {
        errs.push(not_supported(&p.child("fsGroupPolicy"), policy, FS_GROUP_POLICIES));
    }
    let mut audiences = HashSet::new();
    for (i, t) in arr_at(spec, "tokenRequests").iter().enumerate() {
        let tp = p.child("tokenRequests").index(i);
        let audience = str_at(Some(t), "audience");
        if !audiences.insert(audience) {
            errs.push(duplicate(&tp.child("audience"), &Value::String(audience.to_string())));
            continue;
        }
        if let Some(secs) = field(Some(t), "expirationSeconds") {
            let n = secs.as_i64().unwrap_or(0);
            if n < 600 {
                errs.push(invalid(
                    &tp.child("expirationSeconds"),
                    secs,
                    "may not specify a duration less than 10 minutes",
                ));
            }
            if n > 1 << 32 {
                errs.push(invalid(
                    &tp.child("expirationSeconds"),
                    secs,
                    "may not specify a duration larger than 2^32 seconds",
                ));
            }
        }
    }
    for mode in arr_at(spec, "volumeLifecycleModes") {
        if !LIFECYCLE_MODES.contains(&mode.as_str().unwrap_or("")) {
            errs.push(not_supported(&p.child("volumeLifecycleModes"), mode, LIFECYCLE_MODES));
        }
    }
    if field(spec, "seLinuxMount").is_none() {
        errs.push(required(&p.child("seLinuxMount"), ""));
    }
    if let Some(period) = field(spec, "nodeAllocatableUpdatePeriodSeconds")
        && period.as_i64().unwrap_or(0) < 10
    {
        errs.push(invalid(
            &p.child("nodeAllocatableUpdatePeriodSeconds"),
            period,
            "must be greater than or equal to 10 seconds",
        ));
    }
    let Some(old) = old else { return };
    let old_spec = field(Some(old), "spec");
    if field(spec, "attachRequired") != field(old_spec, "attachRequired") {
        let v = field(spec, "attachRequired").cloned().unwrap_or(Value::Null);
        errs.push(invalid(&p.child("attachedRequired"), &v, "field is immutable"));
    }
    let modes = |s: Option<&Value>| field(s, "volumeLifecycleModes").cloned();
    if modes(spec) != modes(old_spec) {
        let rendered = go_string_slice(field(spec, "volumeLifecycleModes")).replacen(
            "[]string",
            "[]storage.VolumeLifecycleMode",
            1,
        );
        errs.push(invalid_raw(
            &p.child("volumeLifecycleModes"),
            rendered,
            "field is immutable",
        ));
    }
}

/// upstream's `ValidateCSIDriverName` (a driver's name: at most 63 characters, a DNS
/// subdomain once lower-cased).
fn validate_csi_driver_name(name: &str, p: &Path, errs: &mut Vec<FieldError>) {
    if name.is_empty() {
        errs.push(required(p, ""));
    }
    if name.len() > 63 {
        errs.push(FieldError::too_long(p.as_str(), 63));
    }
    for m in is_dns1123_subdomain(&name.to_lowercase()) {
        errs.push(invalid_str(p, name, &m));
    }
}

/// `ValidateVolumeAttachment` and `ValidateVolumeAttachmentV1`, and on update
/// `ValidateVolumeAttachmentUpdate`'s read-only spec.
pub(crate) fn validate_volume_attachment(obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let spec = field(Some(obj), "spec");
    let p = Path::new("spec");
    let attacher = str_at(spec, "attacher");
    if attacher.is_empty() {
        errs.push(required(&p.child("attacher"), ""));
    }
    let source = field(spec, "source");
    let sp = p.child("source");
    let pv = field(source, "persistentVolumeName");
    let inline = field(source, "inlineVolumeSpec");
    let both = "must specify exactly one of inlineVolumeSpec and persistentVolumeName";
    match (pv, inline) {
        (None, None) => errs.push(required(&sp, both)),
        (Some(_), Some(_)) => errs.push(super::forbidden(&sp, both)),
        (Some(name), None) => {
            if name.as_str().unwrap_or("").is_empty() {
                errs.push(required(
                    &sp.child("persistentVolumeName"),
                    "must specify non empty persistentVolumeName",
                ));
            }
        }
        (None, Some(_)) => {}
    }
    let node = str_at(spec, "nodeName");
    for m in name_is_dns_subdomain(node, false) {
        errs.push(invalid_str(&p.child("nodeName"), node, &m));
    }
    let status = field(Some(obj), "status");
    let stp = Path::new("status");
    let metadata_size: usize = field(status, "attachmentMetadata")
        .and_then(Value::as_object)
        .map(|m| m.iter().map(|(k, v)| k.len() + v.as_str().map_or(0, str::len)).sum())
        .unwrap_or(0);
    if metadata_size > MAX_ATTACHED_VOLUME_METADATA_SIZE {
        errs.push(FieldError::too_long(
            stp.child("attachmentMetadata").as_str(),
            MAX_ATTACHED_VOLUME_METADATA_SIZE,
        ));
    }
    for key in ["attachError", "detachError"] {
        let Some(e) = field(status, key) else { continue };
        if str_at(Some(e), "message").len() > MAX_VOLUME_ERROR_MESSAGE_SIZE {
            // upstream reports the metadata's limit here.
            errs.push(FieldError::too_long(
                stp.child(key).child("message").as_str(),
                MAX_ATTACHED_VOLUME_METADATA_SIZE,
            ));
        }
        if let Some(code) = field(Some(e), "errorCode")
            && code.as_i64().unwrap_or(0) < 0
        {
            errs.push(invalid(
                &stp.child(key).child("errorCode"),
                code,
                "must be between 0 and 2147483647, inclusive",
            ));
        }
    }
    // v1's extra checks.
    validate_csi_driver_name(attacher, &p.child("attacher"), errs);
    if let Some(name) = pv.and_then(Value::as_str) {
        for m in name_is_dns_subdomain(name, false) {
            errs.push(invalid_str(&sp.child("persistentVolumeName"), name, &m));
        }
    }
    if let Some(old) = old {
        let old_spec = field(Some(old), "spec").unwrap_or(&Value::Null);
        if !semantic_eq(spec.unwrap_or(&Value::Null), old_spec) {
            errs.push(invalid_raw(&p, go_volume_attachment_spec(spec), "field is immutable"));
        }
    }
}

/// Go's `%#v` of a `storage.VolumeAttachmentSpec` (a pointer shown by what it points at).
fn go_volume_attachment_spec(spec: Option<&Value>) -> String {
    let source = field(spec, "source");
    let pv = match field(source, "persistentVolumeName").and_then(Value::as_str) {
        Some(n) => format!("&{n:?}"),
        None => "(*string)(nil)".to_string(),
    };
    let inline = if field(source, "inlineVolumeSpec").is_some() {
        "&core.PersistentVolumeSpec{...}"
    } else {
        "(*core.PersistentVolumeSpec)(nil)"
    };
    format!(
        "storage.VolumeAttachmentSpec{{Attacher:{:?}, Source:storage.VolumeAttachmentSource{{PersistentVolumeName:{pv}, InlineVolumeSpec:{inline}}}, NodeName:{:?}}}",
        str_at(spec, "attacher"),
        str_at(spec, "nodeName"),
    )
}

/// `ValidateCSIStorageCapacity`, and on update `ValidateCSIStorageCapacityUpdate`.
pub(crate) fn validate_csi_storage_capacity(obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let topology = field(Some(obj), "nodeTopology");
    if topology.is_some() {
        validate_label_selector(topology, &Path::new("nodeTopology"), errs);
    }
    let class = str_at(Some(obj), "storageClassName");
    for m in name_is_dns_subdomain(class, false) {
        errs.push(invalid_str(&Path::new("storageClassName"), class, &m));
    }
    if let Some(c) = field(Some(obj), "capacity") {
        match Quantity::from_json(c) {
            Ok(q) if q.is_negative() => errs.push(invalid_str(
                &Path::new("capacity"),
                &q.to_string(),
                "must be greater than or equal to 0",
            )),
            Ok(_) => {}
            Err(e) => errs.push(invalid(&Path::new("capacity"), c, &e.to_string())),
        }
    }
    let Some(old) = old else { return };
    let old_topology = field(Some(old), "nodeTopology");
    if !semantic_eq(topology.unwrap_or(&Value::Null), old_topology.unwrap_or(&Value::Null)) {
        let rendered = match topology {
            None => "null".to_string(),
            Some(t) => go_label_selector(Some(t)),
        };
        errs.push(invalid_raw(&Path::new("nodeTopology"), rendered, "field is immutable"));
    }
    if class != str_at(Some(old), "storageClassName") {
        errs.push(invalid_str(&Path::new("storageClassName"), class, "field is immutable"));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::registry::lookup_kind;

    fn errors(kind: &str, obj: serde_json::Value, old: Option<serde_json::Value>) -> Vec<String> {
        let res = lookup_kind("storage.k8s.io", kind).expect("served");
        let mut obj = obj;
        crate::defaults::apply_defaults(res, &mut obj);
        super::super::validate(res, &obj, old.as_ref())
            .iter()
            .map(|e| format!("{}: {}", e.field, e.body()))
            .collect()
    }

    #[test]
    fn csi_driver_defaults_pass_and_bad_values_are_refused() {
        let d = json!({"metadata": {"name": "hostpath.csi.k8s.io"}, "spec": {}});
        assert_eq!(errors("CSIDriver", d, None), Vec::<String>::new());
        let d = json!({"metadata": {"name": "d"}, "spec": {
            "fsGroupPolicy": "Always",
            "volumeLifecycleModes": ["Persistent", "Forever"],
            "tokenRequests": [{"audience": "a", "expirationSeconds": 60}, {"audience": "a"}],
            "nodeAllocatableUpdatePeriodSeconds": 5
        }});
        assert_eq!(
            errors("CSIDriver", d, None),
            [
                "spec.fsGroupPolicy: Unsupported value: \"Always\": supported values: \"File\", \"None\", \"ReadWriteOnceWithFSType\"",
                "spec.tokenRequests[0].expirationSeconds: Invalid value: 60: may not specify a duration less than 10 minutes",
                "spec.tokenRequests[1].audience: Duplicate value: \"a\"",
                "spec.volumeLifecycleModes: Unsupported value: \"Forever\": supported values: \"Persistent\", \"Ephemeral\"",
                "spec.nodeAllocatableUpdatePeriodSeconds: Invalid value: 5: must be greater than or equal to 10 seconds",
            ]
        );
    }

    #[test]
    fn csi_driver_attach_required_and_modes_are_immutable() {
        let old = json!({"metadata": {"name": "d", "resourceVersion": "1"}, "spec": {"attachRequired": true}});
        let new = json!({"metadata": {"name": "d", "resourceVersion": "1"}, "spec": {"attachRequired": false, "volumeLifecycleModes": ["Ephemeral"], "podInfoOnMount": true}});
        assert_eq!(
            errors("CSIDriver", new, Some(old)),
            [
                "spec.attachedRequired: Invalid value: false: field is immutable",
                "spec.volumeLifecycleModes: Invalid value: []storage.VolumeLifecycleMode{\"Ephemeral\"}: field is immutable",
            ]
        );
    }

    fn attachment(spec: serde_json::Value) -> serde_json::Value {
        json!({"metadata": {"name": "va"}, "spec": spec})
    }

    #[test]
    fn volume_attachments_name_an_attacher_one_source_and_a_node() {
        let ok = attachment(
            json!({"attacher": "hostpath.csi.k8s.io", "source": {"persistentVolumeName": "pv1"}, "nodeName": "n1"}),
        );
        assert_eq!(errors("VolumeAttachment", ok.clone(), None), Vec::<String>::new());
        // The attacher is checked twice (the v1 checks again as a driver name), as upstream does.
        let errs = errors(
            "VolumeAttachment",
            attachment(json!({"source": {}, "nodeName": "n1"})),
            None,
        );
        assert_eq!(
            errs[..3],
            [
                "spec.attacher: Required value",
                "spec.source: Required value: must specify exactly one of inlineVolumeSpec and persistentVolumeName",
                "spec.attacher: Required value",
            ]
        );
        assert!(
            errs[3].starts_with("spec.attacher: Invalid value: \"\": a lowercase RFC 1123 subdomain"),
            "{errs:?}"
        );
        let both = attachment(
            json!({"attacher": "a.io", "source": {"persistentVolumeName": "pv", "inlineVolumeSpec": {}}, "nodeName": "Bad_Node"}),
        );
        let errs = errors("VolumeAttachment", both, None);
        assert_eq!(
            errs[0],
            "spec.source: Forbidden: must specify exactly one of inlineVolumeSpec and persistentVolumeName"
        );
        assert!(
            errs[1].starts_with("spec.nodeName: Invalid value: \"Bad_Node\": a lowercase RFC 1123 subdomain"),
            "{errs:?}"
        );
        // The spec is read-only.
        let mut changed = ok.clone();
        changed["spec"]["nodeName"] = json!("n2");
        let errs = errors("VolumeAttachment", changed, Some(ok));
        assert_eq!(
            errs,
            [
                "spec: Invalid value: storage.VolumeAttachmentSpec{Attacher:\"hostpath.csi.k8s.io\", Source:storage.VolumeAttachmentSource{PersistentVolumeName:&\"pv1\", InlineVolumeSpec:(*core.PersistentVolumeSpec)(nil)}, NodeName:\"n2\"}: field is immutable"
            ]
        );
    }

    #[test]
    fn storage_capacities() {
        let c = json!({"metadata": {"name": "c", "namespace": "default"}, "storageClassName": "standard", "capacity": "10Gi",
            "nodeTopology": {"matchLabels": {"topology.hostpath.csi/node": "n1"}}});
        assert_eq!(errors("CSIStorageCapacity", c.clone(), None), Vec::<String>::new());
        let bad = json!({"metadata": {"name": "c", "namespace": "default"}, "storageClassName": "", "capacity": "-1"});
        assert_eq!(
            errors("CSIStorageCapacity", bad, None),
            [
                "storageClassName: Invalid value: \"\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
                "capacity: Invalid value: \"-1\": must be greater than or equal to 0",
            ]
        );
        let mut changed = c.clone();
        changed["storageClassName"] = json!("fast");
        changed["capacity"] = json!("20Gi");
        assert_eq!(
            errors("CSIStorageCapacity", changed, Some(c)),
            ["storageClassName: Invalid value: \"fast\": field is immutable"]
        );
    }
}
