//! StorageClass and CSINode, as upstream's `pkg/apis/storage/validation`
//! (`ValidateStorageClass`, `ValidateStorageClassUpdate`, `ValidateCSINode`,
//! `ValidateCSINodeUpdate`).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::meta::{is_dns1123_subdomain, is_qualified_name, validate_label_name};
use super::{
    Path, arr_at, duplicate, field, forbidden, go_string_slice, invalid, invalid_raw, invalid_str, nonnegative,
    not_supported, required, str_at,
};
use crate::status::FieldError;

/// Most parameters a class may carry (`maxProvisionerParameterLen`).
const MAX_PARAMETERS: usize = 512;
/// Largest total size of the parameters' keys and values (`maxProvisionerParameterSize`, 256 kB).
const MAX_PARAMETERS_SIZE: usize = 256 * (1 << 10);

const RECLAIM_POLICIES: &[&str] = &["Delete", "Retain"];
const VOLUME_BINDING_MODES: &[&str] = &["Immediate", "WaitForFirstConsumer"];

/// upstream's `ValidateStorageClass`, plus `ValidateStorageClassUpdate` when `old` is given.
/// Runs on defaulted objects (reclaimPolicy and volumeBindingMode are set unless null).
pub(crate) fn validate_storage_class(obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    validate_provisioner(obj, errs);
    validate_parameters(field(Some(obj), "parameters"), errs);
    if let Some(rp) = field(Some(obj), "reclaimPolicy") {
        // upstream checks only a non-empty policy.
        if rp.as_str() != Some("") && !RECLAIM_POLICIES.contains(&rp.as_str().unwrap_or("")) {
            errs.push(not_supported(&Path::new("reclaimPolicy"), rp, RECLAIM_POLICIES));
        }
    }
    match field(Some(obj), "volumeBindingMode") {
        None => errs.push(required(&Path::new("volumeBindingMode"), "")),
        Some(m) if !VOLUME_BINDING_MODES.contains(&m.as_str().unwrap_or("")) => {
            errs.push(not_supported(&Path::new("volumeBindingMode"), m, VOLUME_BINDING_MODES))
        }
        Some(_) => {}
    }
    validate_allowed_topologies(arr_at(Some(obj), "allowedTopologies"), errs);
    if let Some(old) = old {
        validate_storage_class_update(obj, old, errs);
    }
}

/// upstream's `validateProvisioner`: required, and a qualified name once lower-cased.
fn validate_provisioner(obj: &Value, errs: &mut Vec<FieldError>) {
    let p = Path::new("provisioner");
    match field(Some(obj), "provisioner") {
        None => errs.push(required(&p, "")),
        Some(Value::String(s)) if s.is_empty() => errs.push(required(&p, "")),
        Some(Value::String(s)) => {
            for m in is_qualified_name(&s.to_lowercase()) {
                errs.push(invalid_str(&p, s, &m));
            }
        }
        Some(other) => errs.push(invalid(&p, other, "must be a string")),
    }
}

/// upstream's `validateParameters`: at most 512 keys, no empty key, at most 256 kB in all.
fn validate_parameters(params: Option<&Value>, errs: &mut Vec<FieldError>) {
    let p = Path::new("parameters");
    let Some(params) = params.and_then(Value::as_object) else {
        return;
    };
    if params.len() > MAX_PARAMETERS {
        errs.push(FieldError::too_long(p.as_str(), MAX_PARAMETERS));
        return;
    }
    let mut total = 0usize;
    for (k, v) in params {
        if k.is_empty() {
            errs.push(invalid_str(&p, k, "field can not be empty."));
        }
        total += k.len() + v.as_str().map_or(0, str::len);
    }
    if total > MAX_PARAMETERS_SIZE {
        errs.push(FieldError::too_long(p.as_str(), MAX_PARAMETERS_SIZE));
    }
}

/// upstream's `validateAllowedTopologies`: each term as `ValidateTopologySelectorTerm`, and no
/// two terms with the same expressions.
fn validate_allowed_topologies(terms: &[Value], errs: &mut Vec<FieldError>) {
    let p = Path::new("allowedTopologies");
    // upstream seeds its list with one empty map per term, so an empty term always
    // counts as a duplicate; kept for the same answers.
    let mut seen: Vec<BTreeMap<String, BTreeSet<String>>> = vec![BTreeMap::new(); terms.len()];
    for (i, term) in terms.iter().enumerate() {
        let tp = p.index(i);
        let exprs = validate_topology_selector_term(term, &tp, errs);
        if seen.contains(&exprs) {
            errs.push(duplicate(
                &tp.child("matchLabelExpressions"),
                &Value::String(String::new()),
            ));
        }
        seen.push(exprs);
    }
}

/// upstream's `ValidateTopologySelectorTerm`: the key -> values map of the term's expressions.
fn validate_topology_selector_term(
    term: &Value,
    p: &Path,
    errs: &mut Vec<FieldError>,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut exprs = BTreeMap::new();
    let ep = p.child("matchLabelExpressions");
    for (i, req) in arr_at(Some(term), "matchLabelExpressions").iter().enumerate() {
        let ip = ep.index(i);
        let vp = ip.child("values");
        let values = arr_at(Some(req), "values");
        if values.is_empty() {
            errs.push(required(&vp, ""));
        }
        let mut set = BTreeSet::new();
        for (j, v) in values.iter().enumerate() {
            let v = v.as_str().unwrap_or("");
            if !set.insert(v.to_string()) {
                errs.push(duplicate(&vp.index(j), &Value::String(v.to_string())));
            }
        }
        let key = str_at(Some(req), "key");
        validate_label_name(key, &ip.child("key"), errs);
        if exprs.contains_key(key) {
            errs.push(duplicate(&ip.child("key"), &Value::String(key.to_string())));
        }
        exprs.insert(key.to_string(), set);
    }
    exprs
}

/// upstream's `ValidateStorageClassUpdate`: parameters, provisioner, reclaimPolicy and
/// volumeBindingMode are fixed at creation.
fn validate_storage_class_update(obj: &Value, old: &Value, errs: &mut Vec<FieldError>) {
    let empty = Map::new();
    let params = |o: &Value| -> Map<String, Value> {
        field(Some(o), "parameters")
            .and_then(Value::as_object)
            .unwrap_or(&empty)
            .clone()
    };
    if params(obj) != params(old) {
        errs.push(forbidden(
            &Path::new("parameters"),
            "updates to parameters are forbidden.",
        ));
    }
    if str_at(Some(obj), "provisioner") != str_at(Some(old), "provisioner") {
        errs.push(forbidden(
            &Path::new("provisioner"),
            "updates to provisioner are forbidden.",
        ));
    }
    if field(Some(obj), "reclaimPolicy") != field(Some(old), "reclaimPolicy") {
        errs.push(forbidden(
            &Path::new("reclaimPolicy"),
            "updates to reclaimPolicy are forbidden.",
        ));
    }
    let mode = field(Some(obj), "volumeBindingMode");
    if mode != field(Some(old), "volumeBindingMode") {
        errs.push(invalid(
            &Path::new("volumeBindingMode"),
            mode.unwrap_or(&Value::Null),
            "field is immutable",
        ));
    }
}

/// A CSI node ID's longest length (`csiNodeIDLongerMaxLength`: the CSINode strategy allows
/// long node IDs).
const CSI_NODE_ID_MAX_LENGTH: usize = 256;

/// upstream's `ValidateCSINode` (the metadata is validated by the caller), plus
/// `ValidateCSINodeUpdate` when `old` is given.
pub(crate) fn validate_csinode(obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let dp = Path::new("spec").child("drivers");
    let drivers = arr_at(field(Some(obj), "spec"), "drivers");
    let mut names: BTreeSet<&str> = BTreeSet::new();
    for (i, driver) in drivers.iter().enumerate() {
        let p = dp.index(i);
        let name = str_at(Some(driver), "name");
        // `ValidateCSIDriverName` is a DNS-1123 subdomain.
        for m in is_dns1123_subdomain(name) {
            errs.push(invalid_str(&p.child("name"), name, &m));
        }
        let node_id = str_at(Some(driver), "nodeID");
        if node_id.is_empty() {
            errs.push(required(&p.child("nodeID"), ""));
        }
        if node_id.len() > CSI_NODE_ID_MAX_LENGTH {
            errs.push(invalid_str(
                &p.child("nodeID"),
                node_id,
                &format!("must be {CSI_NODE_ID_MAX_LENGTH} characters or less"),
            ));
        }
        nonnegative(
            field(Some(driver), "allocatable"),
            "count",
            &p.child("allocatable"),
            errs,
        );
        if !names.insert(name) {
            errs.push(duplicate(&p.child("name"), &Value::String(name.to_string())));
        }
        let mut keys: BTreeSet<&str> = BTreeSet::new();
        for key in arr_at(Some(driver), "topologyKeys") {
            let key = key.as_str().unwrap_or("");
            if key.is_empty() {
                errs.push(required(&p, ""));
            }
            if !keys.insert(key) {
                errs.push(duplicate(&p, &Value::String(key.to_string())));
            }
            validate_label_name(key, &p, errs);
        }
    }
    let Some(old) = old else {
        return;
    };
    // A driver already registered stays as it was (the allocatable count included: its
    // mutability is an alpha feature, off by default).
    for old_driver in arr_at(field(Some(old), "spec"), "drivers") {
        for new_driver in drivers {
            if str_at(Some(old_driver), "name") == str_at(Some(new_driver), "name") && old_driver != new_driver {
                errs.push(invalid_raw(&dp, go_csinode_driver(new_driver), "field is immutable"));
            }
        }
    }
}

/// Go's `%#v` of an internal `storage.CSINodeDriver` (Go prints the address of a set
/// `Allocatable`; a fixed one stands in for it).
fn go_csinode_driver(d: &Value) -> String {
    let allocatable = if field(Some(d), "allocatable").is_some() {
        "(*storage.VolumeNodeResources)(0xc000000000)"
    } else {
        "(*storage.VolumeNodeResources)(nil)"
    };
    format!(
        "storage.CSINodeDriver{{Name:{:?}, NodeID:{:?}, TopologyKeys:{}, Allocatable:{allocatable}}}",
        str_at(Some(d), "name"),
        str_at(Some(d), "nodeID"),
        go_string_slice(field(Some(d), "topologyKeys")),
    )
}

#[cfg(test)]
mod tests {
    use crate::validation::test_util::errors_defaulted;
    use serde_json::{Map, Value, json};

    fn sc(extra: Value) -> Value {
        let mut o = json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "fast"}});
        if let (Some(m), Some(e)) = (o.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                m.insert(k.clone(), v.clone());
            }
        }
        o
    }

    fn errs(obj: &Value, old: Option<&Value>) -> Vec<String> {
        errors_defaulted("storage.k8s.io", "StorageClass", obj, old)
    }

    #[test]
    fn valid_classes() {
        assert!(errs(&sc(json!({"provisioner": "kubernetes.io/no-provisioner"})), None).is_empty());
        let full = sc(json!({
            "provisioner": "Example.COM/Fast",
            "parameters": {"type": "ssd"},
            "reclaimPolicy": "Retain",
            "volumeBindingMode": "WaitForFirstConsumer",
            "allowVolumeExpansion": true,
            "mountOptions": ["ro"],
            "allowedTopologies": [{"matchLabelExpressions": [{"key": "topology.kubernetes.io/zone", "values": ["a", "b"]}]}]
        }));
        assert!(errs(&full, None).is_empty(), "{:?}", errs(&full, None));
        // upstream only checks a non-empty reclaim policy
        assert!(errs(&sc(json!({"provisioner": "p", "reclaimPolicy": ""})), None).is_empty());
    }

    #[test]
    fn provisioner_is_a_required_qualified_name() {
        assert_eq!(errs(&sc(json!({})), None), vec!["provisioner: Required value"]);
        assert_eq!(
            errs(&sc(json!({"provisioner": ""})), None),
            vec!["provisioner: Required value"]
        );
        assert_eq!(
            errs(&sc(json!({"provisioner": "bad provisioner!"})), None),
            vec![
                "provisioner: Invalid value: \"bad provisioner!\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
            ]
        );
        assert_eq!(errs(&sc(json!({"provisioner": 5})), None).len(), 1);
    }

    #[test]
    fn enums() {
        assert_eq!(
            errs(
                &sc(json!({"provisioner": "p", "reclaimPolicy": "Recycle", "volumeBindingMode": "Later"})),
                None
            ),
            vec![
                "reclaimPolicy: Unsupported value: \"Recycle\": supported values: \"Delete\", \"Retain\"",
                "volumeBindingMode: Unsupported value: \"Later\": supported values: \"Immediate\", \"WaitForFirstConsumer\"",
            ]
        );
        assert_eq!(
            errs(&sc(json!({"provisioner": "p", "volumeBindingMode": ""})), None),
            vec![
                "volumeBindingMode: Unsupported value: \"\": supported values: \"Immediate\", \"WaitForFirstConsumer\""
            ]
        );
    }

    #[test]
    fn parameters() {
        let mut many = Map::new();
        for i in 0..513 {
            many.insert(format!("k{i}"), json!("v"));
        }
        assert_eq!(
            errs(&sc(json!({"provisioner": "p", "parameters": many})), None),
            vec!["parameters: Too long: may not be more than 512 bytes"]
        );
        many.remove("k0");
        assert!(errs(&sc(json!({"provisioner": "p", "parameters": many})), None).is_empty());
        assert_eq!(
            errs(&sc(json!({"provisioner": "p", "parameters": {"": "x"}})), None),
            vec!["parameters: Invalid value: \"\": field can not be empty."]
        );
        let big = "x".repeat(256 * 1024);
        assert_eq!(
            errs(&sc(json!({"provisioner": "p", "parameters": {"k": big}})), None),
            vec!["parameters: Too long: may not be more than 262144 bytes"]
        );
    }

    #[test]
    fn allowed_topologies() {
        let term = json!({"matchLabelExpressions": [{"key": "zone", "values": ["a"]}]});
        assert_eq!(
            errs(
                &sc(json!({"provisioner": "p", "allowedTopologies": [term.clone(), term]})),
                None
            ),
            vec!["allowedTopologies[1].matchLabelExpressions: Duplicate value: \"\""]
        );
        assert_eq!(
            errs(
                &sc(
                    json!({"provisioner": "p", "allowedTopologies": [{"matchLabelExpressions": [
                        {"key": "zone", "values": []},
                        {"key": "zone", "values": ["a", "a"]}
                    ]}]})
                ),
                None
            ),
            vec![
                "allowedTopologies[0].matchLabelExpressions[0].values: Required value",
                "allowedTopologies[0].matchLabelExpressions[1].values[1]: Duplicate value: \"a\"",
                "allowedTopologies[0].matchLabelExpressions[1].key: Duplicate value: \"zone\"",
            ]
        );
    }

    #[test]
    fn updates() {
        let old = sc(json!({
            "metadata": {"name": "fast", "resourceVersion": "1"},
            "provisioner": "kubernetes.io/no-provisioner",
            "parameters": {"a": "1"},
            "volumeBindingMode": "WaitForFirstConsumer"
        }));
        let mut same = old.clone();
        same["metadata"]["annotations"] = json!({"storageclass.kubernetes.io/is-default-class": "true"});
        same["allowVolumeExpansion"] = json!(true);
        assert!(errs(&same, Some(&old)).is_empty(), "{:?}", errs(&same, Some(&old)));

        let mut changed = old.clone();
        changed["provisioner"] = json!("example.com/other");
        changed["parameters"] = json!({"a": "2"});
        changed["reclaimPolicy"] = json!("Retain");
        changed["volumeBindingMode"] = json!("Immediate");
        assert_eq!(
            errs(&changed, Some(&old)),
            vec![
                "parameters: Forbidden: updates to parameters are forbidden.",
                "provisioner: Forbidden: updates to provisioner are forbidden.",
                "reclaimPolicy: Forbidden: updates to reclaimPolicy are forbidden.",
                "volumeBindingMode: Invalid value: \"Immediate\": field is immutable",
            ]
        );

        // an old object stored without defaults compares as defaulted
        let bare = sc(json!({"metadata": {"name": "fast", "resourceVersion": "1"}, "provisioner": "p"}));
        let mut newer = bare.clone();
        newer["reclaimPolicy"] = json!("Delete");
        newer["parameters"] = Value::Object(Map::new());
        assert!(errs(&newer, Some(&bare)).is_empty(), "{:?}", errs(&newer, Some(&bare)));
    }

    fn csinode_errors(obj: Value, old: Option<Value>) -> Vec<String> {
        errors_defaulted("storage.k8s.io", "CSINode", &obj, old.as_ref())
    }

    #[test]
    fn csinode_drivers_as_upstream() {
        let node = |drivers: Value| {
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": "node-1"},
                   "spec": {"drivers": drivers}})
        };
        let good = node(json!([
            {"name": "a.csi.example.com", "nodeID": "node-1", "topologyKeys": ["topology.example.com/zone"]},
            {"name": "b.csi.example.com", "nodeID": "n1", "allocatable": {"count": 8}}
        ]));
        assert!(csinode_errors(good.clone(), None).is_empty());
        let errs = csinode_errors(
            node(json!([
                {"name": "Bad_Name", "nodeID": ""},
                {"name": "dup.example.com", "nodeID": "x", "allocatable": {"count": -1}},
                {"name": "dup.example.com", "nodeID": "x", "topologyKeys": ["k", "k", "bad key"]}
            ])),
            None,
        );
        assert!(
            errs.iter()
                .any(|e| e
                    .starts_with("spec.drivers[0].name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain")),
            "{errs:?}"
        );
        assert!(
            errs.contains(&"spec.drivers[0].nodeID: Required value".to_string()),
            "{errs:?}"
        );
        assert!(
            errs.contains(
                &"spec.drivers[1].allocatable.count: Invalid value: -1: must be greater than or equal to 0".to_string()
            ),
            "{errs:?}"
        );
        assert!(
            errs.contains(&"spec.drivers[2].name: Duplicate value: \"dup.example.com\"".to_string()),
            "{errs:?}"
        );
        assert!(
            errs.contains(&"spec.drivers[2]: Duplicate value: \"k\"".to_string()),
            "{errs:?}"
        );
        assert!(
            errs.iter()
                .any(|e| e.starts_with("spec.drivers[2]: Invalid value: \"bad key\": name part must consist of")),
            "{errs:?}"
        );
        let long = "n".repeat(257);
        let errs = csinode_errors(node(json!([{"name": "a.example.com", "nodeID": long}])), None);
        assert_eq!(errs.len(), 1);
        assert!(errs[0].ends_with(": must be 256 characters or less"), "{errs:?}");

        // A registered driver cannot change; adding one is fine.
        let mut changed = good.clone();
        changed["spec"]["drivers"][1]["allocatable"]["count"] = json!(9);
        changed["spec"]["drivers"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "c.example.com", "nodeID": "n"}));
        changed["metadata"]["resourceVersion"] = json!("1");
        let mut old = good;
        old["metadata"]["resourceVersion"] = json!("1");
        let errs = csinode_errors(changed, Some(old));
        assert_eq!(
            errs,
            [
                "spec.drivers: Invalid value: storage.CSINodeDriver{Name:\"b.csi.example.com\", NodeID:\"n1\", \
              TopologyKeys:[]string(nil), Allocatable:(*storage.VolumeNodeResources)(0xc000000000)}: field is immutable"
            ]
        );
    }
}
