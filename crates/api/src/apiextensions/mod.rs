//! CustomResourceDefinitions (`apiextensions.k8s.io/v1`), as upstream's
//! apiextensions-apiserver: the definitions being served (their resources join the registry at
//! run time), the checks a definition must pass, and what a custom object goes through on
//! every write (pruning, defaulting, validation against its version's structural schema).
//!
//! - `schema`: structural schemas and their checks at definition time.
//! - `validation`: objects against schemas, with upstream's field errors.
//! - `pruning`, `defaulting`: unknown fields dropped, defaults filled.
//! - `cel`: `x-kubernetes-validations` rules, compiled with the definition and run on writes.
//! - `columns`: `additionalPrinterColumns` and their simple JSONPaths.

pub mod cel;
pub mod columns;
pub mod defaulting;
pub mod pruning;
pub mod schema;
pub mod validation;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use serde_json::{Value, json};

use crate::registry::{self, Resource};
use crate::status::{FieldError, FieldErrorKind};
pub use columns::PrinterColumn;
pub use schema::Schema;

/// The finalizer upstream puts on every definition: its objects go before it does.
pub const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

/// A version's `subresources.scale`.
#[derive(Clone, Debug, PartialEq)]
pub struct ScaleSpec {
    pub spec_replicas_path: String,
    pub status_replicas_path: String,
    pub label_selector_path: Option<String>,
}

/// One version of a definition.
#[derive(Clone, Debug)]
pub struct Version {
    pub name: String,
    pub served: bool,
    pub storage: bool,
    pub schema: Option<Schema>,
    /// The schema as written, for OpenAPI.
    pub schema_json: Value,
    pub columns: Vec<PrinterColumn>,
    pub status: bool,
    pub scale: Option<ScaleSpec>,
}

/// A definition, read from its object.
#[derive(Clone, Debug)]
pub struct Definition {
    pub name: String,
    pub group: String,
    pub kind: String,
    pub list_kind: String,
    pub plural: String,
    pub singular: String,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub namespaced: bool,
    pub versions: Vec<Version>,
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(String::from).collect())
        .unwrap_or_default()
}

fn text(v: &Value, pointer: &str) -> String {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("").to_string()
}

impl Definition {
    /// Read a (valid, stored) definition.
    pub fn from_object(crd: &Value) -> Definition {
        let kind = text(crd, "/spec/names/kind");
        let plural = text(crd, "/spec/names/plural");
        let singular = match text(crd, "/spec/names/singular") {
            s if s.is_empty() => kind.to_lowercase(),
            s => s,
        };
        let list_kind = match text(crd, "/spec/names/listKind") {
            s if s.is_empty() => format!("{kind}List"),
            s => s,
        };
        let versions = crd
            .pointer("/spec/versions")
            .and_then(Value::as_array)
            .map(|vs| {
                vs.iter()
                    .map(|v| {
                        let schema_json = v.pointer("/schema/openAPIV3Schema").cloned().unwrap_or(Value::Null);
                        let schema = schema_json.is_object().then(|| Schema::parse(&schema_json));
                        let scale = v.pointer("/subresources/scale").map(|s| ScaleSpec {
                            spec_replicas_path: text(s, "/specReplicasPath"),
                            status_replicas_path: text(s, "/statusReplicasPath"),
                            label_selector_path: s.get("labelSelectorPath").and_then(Value::as_str).map(String::from),
                        });
                        let columns = columns::from_version(v, schema.as_ref());
                        Version {
                            name: text(v, "/name"),
                            served: v.get("served").and_then(Value::as_bool).unwrap_or(false),
                            storage: v.get("storage").and_then(Value::as_bool).unwrap_or(false),
                            schema,
                            schema_json,
                            columns,
                            status: v.pointer("/subresources/status").is_some(),
                            scale,
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        Definition {
            name: text(crd, "/metadata/name"),
            group: text(crd, "/spec/group"),
            kind,
            list_kind,
            plural,
            singular,
            short_names: strings(crd.pointer("/spec/names/shortNames")),
            categories: strings(crd.pointer("/spec/names/categories")),
            namespaced: text(crd, "/spec/scope") == "Namespaced",
            versions,
        }
    }

    /// The version objects are stored in.
    pub fn storage_version(&self) -> Option<&Version> {
        self.versions.iter().find(|v| v.storage)
    }

    /// The version of this name.
    pub fn version(&self, name: &str) -> Option<&Version> {
        self.versions.iter().find(|v| v.name == name)
    }

    /// The registry entries of the served versions.
    pub fn resources(&self) -> Vec<Resource> {
        self.versions
            .iter()
            .filter(|v| v.served)
            .map(|v| {
                let mut subs = Vec::new();
                if v.status {
                    subs.push("status".to_string());
                }
                if v.scale.is_some() {
                    subs.push("scale".to_string());
                }
                Resource {
                    group: registry::intern(&self.group),
                    version: registry::intern(&v.name),
                    kind: registry::intern(&self.kind),
                    plural: registry::intern(&self.plural),
                    singular: registry::intern(&self.singular),
                    namespaced: self.namespaced,
                    short_names: registry::intern_list(&self.short_names),
                    categories: registry::intern_list(&self.categories),
                    subresources: registry::intern_list(&subs),
                }
            })
            .collect()
    }
}

type ServedMap = HashMap<(String, String), Arc<Definition>>;

/// The definitions being served, by `(group, plural)`.
static SERVED: RwLock<Option<ServedMap>> = RwLock::new(None);

/// Serve exactly these definitions (those whose names were accepted and that are established):
/// their resources replace the registry's custom ones.
pub fn serve(defs: Vec<Definition>) {
    let mut resources = Vec::new();
    let mut map = HashMap::new();
    for d in defs {
        resources.extend(d.resources());
        for v in d.versions.iter().filter(|v| v.served) {
            crate::schema::register_custom(
                &definition_name(&d.group, &v.name, &d.kind),
                apply_schema(&v.schema_json),
            );
        }
        map.insert((d.group.clone(), d.plural.clone()), Arc::new(d));
    }
    match SERVED.write() {
        Ok(mut s) => *s = Some(map),
        Err(p) => *p.into_inner() = Some(map),
    }
    registry::set_custom(resources);
}

/// Upstream's OpenAPI definition name of a custom kind: `<reversed group>.<version>.<Kind>`
/// (`com.example.v1.Widget`).
pub fn definition_name(group: &str, version: &str, kind: &str) -> String {
    let reversed: Vec<&str> = group.split('.').rev().collect();
    format!("{}.{version}.{kind}", reversed.join("."))
}

/// A version's schema as strategic merge and server-side apply navigate it: the object's
/// metadata is an ObjectMeta.
fn apply_schema(schema: &Value) -> Value {
    let mut root = match schema {
        Value::Object(m) => Value::Object(m.clone()),
        _ => json!({"type": "object"}),
    };
    if let Some(props) = root
        .as_object_mut()
        .map(|m| m.entry("properties").or_insert_with(|| json!({})))
        .and_then(Value::as_object_mut)
    {
        props.insert(
            "metadata".into(),
            json!({"$ref": format!("{}io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", crate::schema::REF_PREFIX)}),
        );
        props.insert("apiVersion".into(), json!({"type": "string"}));
        props.insert("kind".into(), json!({"type": "string"}));
    }
    root
}

/// The schema name strategic merge and server-side apply use for `res`: a built-in kind's
/// definition, or the registered schema of a custom kind ("" when there is none).
pub fn patch_definition(res: &Resource) -> String {
    if let Some(d) = crate::schema::definition_for(res.group, res.version, res.kind) {
        return d.to_string();
    }
    let name = definition_name(res.group, res.version, res.kind);
    if crate::schema::lookup_definition(&name).is_some() {
        name
    } else {
        String::new()
    }
}

/// The definition serving `res`, if it is a custom resource.
pub fn definition(res: &Resource) -> Option<Arc<Definition>> {
    if !registry::is_custom(res) {
        return None;
    }
    let guard = match SERVED.read() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    guard
        .as_ref()?
        .get(&(res.group.to_string(), res.plural.to_string()))
        .cloned()
}

/// A custom object written through `res`: pruned, defaulted and validated against the
/// version's schema and its `x-kubernetes-validations` rules (`old` is the object an update
/// replaces). Returns the pruned paths (unknown fields) and the errors.
pub fn admit(def: &Definition, res: &Resource, obj: &mut Value, old: Option<&Value>) -> (Vec<String>, Vec<FieldError>) {
    let Some(version) = def.version(res.version) else {
        return (Vec::new(), Vec::new());
    };
    let Some(schema) = &version.schema else {
        return (Vec::new(), Vec::new());
    };
    let pruned = pruning::prune(schema, obj);
    defaulting::apply(schema, obj);
    let mut errs = validation::validate(schema, obj);
    if cel::has_rules(schema) {
        // As upstream: rules are not run over a value of the wrong shape.
        let blocking = errs.iter().any(|e| {
            matches!(
                e.kind,
                FieldErrorKind::TypeInvalid(_) | FieldErrorKind::NotSupported { .. }
            )
        });
        if blocking {
            errs.push(FieldError::invalid(
                "<nil>",
                &Value::String("null".into()),
                "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation",
            ));
        } else {
            errs.extend(cel::validate(schema, obj, old));
        }
    }
    (pruned, errs)
}

/// Upstream's `ValidateCustomResourceDefinition` for the rules users meet, with its paths
/// and messages.
pub fn validate_definition(crd: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let name = text(crd, "/metadata/name");
    let group = text(crd, "/spec/group");
    let plural = text(crd, "/spec/names/plural");
    if name != format!("{plural}.{group}") {
        errs.push(FieldError::invalid(
            "metadata.name",
            &json!(name),
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    if group.is_empty() {
        errs.push(FieldError::required("spec.group", ""));
    } else if !group.contains('.') {
        errs.push(FieldError::invalid(
            "spec.group",
            &json!(group),
            "should be a domain with at least one dot",
        ));
    } else if !crate::validation::is_dns1123_subdomain(&group).is_empty() {
        errs.push(FieldError::invalid(
            "spec.group",
            &json!(group),
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
        ));
    }
    // upstream's protected groups: a definition there needs the API review's approval.
    let protected = ["k8s.io", "kubernetes.io"]
        .iter()
        .any(|p| group == *p || group.ends_with(&format!(".{p}")));
    if protected
        && crd
            .pointer("/metadata/annotations/api-approved.kubernetes.io")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
    {
        errs.push(FieldError::required(
            "metadata.annotations[api-approved.kubernetes.io]",
            "protected groups must have approval annotation \"api-approved.kubernetes.io\", see https://github.com/kubernetes/enhancements/pull/1111",
        ));
    }
    let scope = text(crd, "/spec/scope");
    if scope.is_empty() {
        errs.push(FieldError::required("spec.scope", ""));
    } else if scope != "Cluster" && scope != "Namespaced" {
        errs.push(FieldError::not_supported(
            "spec.scope",
            &json!(scope),
            &["Cluster", "Namespaced"],
        ));
    }
    let label_msg = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
    for (field, value, required) in [
        ("plural", plural.clone(), true),
        ("singular", text(crd, "/spec/names/singular"), false),
    ] {
        if value.is_empty() {
            if required {
                errs.push(FieldError::required(format!("spec.names.{field}"), ""));
            }
        } else if !crate::validation::is_dns1123_label(&value).is_empty() {
            errs.push(FieldError::invalid(
                format!("spec.names.{field}"),
                &json!(value),
                label_msg,
            ));
        }
    }
    for (i, s) in strings(crd.pointer("/spec/names/shortNames")).iter().enumerate() {
        if !crate::validation::is_dns1123_label(s).is_empty() {
            errs.push(FieldError::invalid(
                format!("spec.names.shortNames[{i}]"),
                &json!(s),
                label_msg,
            ));
        }
    }
    let kind = text(crd, "/spec/names/kind");
    if kind.is_empty() {
        errs.push(FieldError::required("spec.names.kind", ""));
    } else if !kind_ok(&kind) {
        errs.push(FieldError::invalid(
            "spec.names.kind",
            &json!(kind),
            "may have mixed case, but should otherwise match: [a-z]([-a-z0-9]*[a-z0-9])?",
        ));
    }
    let versions = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if versions.is_empty() {
        errs.push(FieldError::invalid(
            "spec.versions",
            &json!([]),
            "must have exactly one version marked as storage version",
        ));
    } else {
        let storage = versions
            .iter()
            .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
            .count();
        if storage != 1 {
            errs.push(FieldError::invalid(
                "spec.versions",
                &Value::Array(versions.clone()),
                "must have exactly one version marked as storage version",
            ));
        }
        if !versions
            .iter()
            .any(|v| v.get("served").and_then(Value::as_bool) == Some(true))
        {
            errs.push(FieldError::invalid(
                "spec.versions",
                &Value::Array(versions.clone()),
                "must have at least one version marked as served",
            ));
        }
    }
    // Conversion: upstream's strategies; this server converts between versions only as
    // `None` does (the apiVersion alone), so a definition whose versions would need its
    // webhook is refused rather than served unconverted.
    match crd.pointer("/spec/conversion/strategy").and_then(Value::as_str) {
        None | Some("None") => {}
        Some("Webhook") => {
            if crd.pointer("/spec/conversion/webhook/clientConfig").is_none() {
                errs.push(FieldError::required(
                    "spec.conversion.webhook",
                    "required when strategy is set to Webhook",
                ));
            }
            if versions.len() > 1 {
                errs.push(FieldError::forbidden(
                    "spec.conversion.strategy",
                    "webhook conversion between versions is not supported by this server: serve one version, or convert with strategy None",
                ));
            }
        }
        Some(other) => errs.push(FieldError::not_supported(
            "spec.conversion.strategy",
            &json!(other),
            &["None", "Webhook"],
        )),
    }
    // Upstream's internal form keeps one schema for all versions when they are identical, and
    // reports its problems under spec.validation.
    let first_schema = versions.first().and_then(|v| v.pointer("/schema/openAPIV3Schema"));
    let shared_schema = first_schema.is_some()
        && versions
            .iter()
            .all(|v| v.pointer("/schema/openAPIV3Schema") == first_schema);
    if shared_schema && let Some(s) = first_schema {
        errs.extend(schema::structural_errors(s, "spec.validation.openAPIV3Schema"));
    }
    for (i, v) in versions.iter().enumerate() {
        let vname = text(v, "/name");
        if !crate::validation::is_dns1035_label(&vname).is_empty() {
            errs.push(FieldError::invalid(
                format!("spec.versions[{i}].name"),
                &json!(vname),
                "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')",
            ));
        }
        if versions[..i].iter().any(|o| text(o, "/name") == vname) {
            errs.push(FieldError::invalid(
                format!("spec.versions[{i}].name"),
                &json!(vname),
                "must be unique",
            ));
        }
        let path = format!("spec.versions[{i}].schema.openAPIV3Schema");
        match v.pointer("/schema/openAPIV3Schema") {
            None => errs.push(FieldError::required(path, "schemas are required")),
            Some(_) if shared_schema => {}
            Some(s) => errs.extend(schema::structural_errors(s, &path)),
        }
        if let Some(scale) = v.pointer("/subresources/scale") {
            for field in ["specReplicasPath", "statusReplicasPath"] {
                let p = text(scale, &format!("/{field}"));
                let fp = format!("spec.versions[{i}].subresources.scale.{field}");
                if p.is_empty() {
                    errs.push(FieldError::required(fp, ""));
                } else if !p.starts_with(if field == "specReplicasPath" {
                    ".spec."
                } else {
                    ".status."
                }) {
                    let want = if field == "specReplicasPath" {
                        ".spec"
                    } else {
                        ".status"
                    };
                    errs.push(FieldError::invalid(
                        fp,
                        &json!(p),
                        format!("should be a json path under {want}"),
                    ));
                }
            }
        }
        if let Some(cols) = v.get("additionalPrinterColumns").and_then(Value::as_array) {
            for (j, c) in cols.iter().enumerate() {
                let cp = format!("spec.versions[{i}].additionalPrinterColumns[{j}]");
                if text(c, "/name").is_empty() {
                    errs.push(FieldError::required(format!("{cp}.name"), ""));
                }
                let ty = text(c, "/type");
                let types = ["integer", "number", "string", "boolean", "date"];
                if ty.is_empty() {
                    errs.push(FieldError::required(format!("{cp}.type"), ""));
                } else if !types.contains(&ty.as_str()) {
                    errs.push(FieldError::not_supported(format!("{cp}.type"), &json!(ty), &types));
                }
                if text(c, "/jsonPath").is_empty() {
                    errs.push(FieldError::required(format!("{cp}.jsonPath"), ""));
                }
            }
        }
    }
    if let Some(old) = old {
        if text(old, "/spec/scope") != scope && !scope.is_empty() {
            errs.push(FieldError::invalid("spec.scope", &json!(scope), "field is immutable"));
        }
        if text(old, "/spec/group") != group {
            errs.push(FieldError::invalid("spec.group", &json!(group), "field is immutable"));
        }
    }
    errs
}

/// upstream's kind check: an upper-case start is allowed, otherwise a DNS-1035 label.
fn kind_ok(kind: &str) -> bool {
    crate::validation::is_dns1035_label(&kind.to_lowercase()).is_empty()
}

/// Upstream's names check against the other definitions of the group
/// (`NamingConditionController`): a plural, singular, short name, kind or list kind that a
/// built-in resource or another definition of the group already holds. `Some` is the
/// condition's reason (`PluralConflict`, ...) and message (`"x" is already in use`).
pub fn names_conflict(crd: &Value, others: &[Value]) -> Option<(&'static str, String)> {
    let group = text(crd, "/spec/group");
    let plural = text(crd, "/spec/names/plural");
    let singular = text(crd, "/spec/names/singular");
    let kind = text(crd, "/spec/names/kind");
    let list_kind = text(crd, "/spec/names/listKind");
    let shorts = strings(crd.pointer("/spec/names/shortNames"));
    let name = text(crd, "/metadata/name");
    let in_use = |s: &str| format!("\"{s}\" is already in use");
    // The resource names and kinds held in the group, by built-in resources and the others.
    let mut resource_names: Vec<String> = Vec::new();
    let mut kinds: Vec<String> = Vec::new();
    for r in registry::RESOURCES.iter().filter(|r| r.group == group) {
        resource_names.push(r.plural.to_string());
        resource_names.push(r.singular.to_string());
        resource_names.extend(r.short_names.iter().map(|s| s.to_string()));
        kinds.push(r.kind.to_string());
        kinds.push(r.list_kind());
    }
    for o in others {
        if text(o, "/metadata/name") == name || text(o, "/spec/group") != group {
            continue;
        }
        resource_names.push(text(o, "/spec/names/plural"));
        resource_names.push(text(o, "/spec/names/singular"));
        resource_names.extend(strings(o.pointer("/spec/names/shortNames")));
        kinds.push(text(o, "/spec/names/kind"));
        kinds.push(text(o, "/spec/names/listKind"));
    }
    let taken = |s: &str, set: &[String]| !s.is_empty() && set.iter().any(|x| x == s);
    if taken(&plural, &resource_names) {
        return Some(("PluralConflict", in_use(&plural)));
    }
    if taken(&singular, &resource_names) {
        return Some(("SingularConflict", in_use(&singular)));
    }
    for s in &shorts {
        if taken(s, &resource_names) {
            return Some(("ShortNamesConflict", in_use(s)));
        }
    }
    if taken(&kind, &kinds) {
        return Some(("KindConflict", in_use(&kind)));
    }
    if taken(&list_kind, &kinds) {
        return Some(("ListKindConflict", in_use(&list_kind)));
    }
    None
}

/// Upstream's defaults for a definition (`SetDefaults_CustomResourceDefinition*`):
/// singular and list kind from the kind, conversion `None`. A version without printer columns
/// is served with the Age column (`columns.rs`) but stored without it, as upstream's
/// `serveDefaultColumnsIfEmpty` leaves the object alone: a client that applies the same
/// definition again (server-side apply compares the stored list) must find it unchanged.
pub fn apply_definition_defaults(crd: &mut Value) {
    let kind = text(crd, "/spec/names/kind");
    if let Some(names) = crd.pointer_mut("/spec/names").and_then(Value::as_object_mut) {
        if names.get("singular").and_then(Value::as_str).unwrap_or("").is_empty() && !kind.is_empty() {
            names.insert("singular".into(), json!(kind.to_lowercase()));
        }
        if names.get("listKind").and_then(Value::as_str).unwrap_or("").is_empty() && !kind.is_empty() {
            names.insert("listKind".into(), json!(format!("{kind}List")));
        }
    }
    if let Some(spec) = crd.get_mut("spec").and_then(Value::as_object_mut)
        && !spec.contains_key("conversion")
    {
        spec.insert("conversion".into(), json!({"strategy": "None"}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd() -> Value {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com",
                "scope": "Namespaced",
                "names": {"plural": "widgets", "kind": "Widget", "shortNames": ["wd"]},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object"}}}},
                    "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}}}]
            }
        })
    }

    #[test]
    fn a_valid_definition_passes_and_gives_its_resources() {
        assert!(validate_definition(&crd(), None).is_empty());
        let mut c = crd();
        apply_definition_defaults(&mut c);
        let d = Definition::from_object(&c);
        assert_eq!((d.singular.as_str(), d.list_kind.as_str()), ("widget", "WidgetList"));
        let rs = d.resources();
        assert_eq!(rs.len(), 1);
        assert_eq!(rs[0].subresources, ["status", "scale"]);
        assert_eq!(rs[0].short_names, ["wd"]);
        assert_eq!(d.versions[0].columns[0].name, "Age");
    }

    #[test]
    fn webhook_conversion_between_versions_is_refused_not_served_unconverted() {
        let webhook = json!({"strategy": "Webhook", "webhook": {"conversionReviewVersions": ["v1"],
            "clientConfig": {"url": "https://conv.example.com/convert"}}});
        let mut one = crd();
        one["spec"]["conversion"] = webhook.clone();
        assert!(
            validate_definition(&one, None).is_empty(),
            "one version needs no conversion"
        );
        let mut two = one.clone();
        let mut v2 = two["spec"]["versions"][0].clone();
        v2["name"] = json!("v2");
        v2["storage"] = json!(false);
        two["spec"]["versions"].as_array_mut().unwrap().push(v2);
        let msgs: Vec<String> = validate_definition(&two, None)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            msgs,
            [
                "spec.conversion.strategy: Forbidden: webhook conversion between versions is not supported by this server: serve one version, or convert with strategy None"
            ]
        );
        let mut unknown = crd();
        unknown["spec"]["conversion"] = json!({"strategy": "Magic"});
        let msgs: Vec<String> = validate_definition(&unknown, None)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            msgs,
            ["spec.conversion.strategy: Unsupported value: \"Magic\": supported values: \"None\", \"Webhook\""]
        );
    }

    /// The Age column is served, never stored: the stored versions stay as applied, so applying
    /// the same definition again finds nothing changed.
    #[test]
    fn defaults_leave_the_versions_as_written() {
        let mut c = crd();
        let versions = c["spec"]["versions"].clone();
        apply_definition_defaults(&mut c);
        assert_eq!(c["spec"]["versions"], versions);
        assert_eq!(c["spec"]["conversion"], json!({"strategy": "None"}));
    }

    #[test]
    fn invalid_definitions_are_refused_with_upstream_messages() {
        let mut c = crd();
        c["metadata"]["name"] = json!("wrong");
        c["spec"]["scope"] = json!("Global");
        c["spec"]["versions"][0]["schema"]["openAPIV3Schema"] =
            json!({"type": "object", "properties": {"spec": {"properties": {}}}});
        let msgs: Vec<String> = validate_definition(&c, None).iter().map(ToString::to_string).collect();
        assert_eq!(
            msgs,
            [
                "metadata.name: Invalid value: \"wrong\": must be spec.names.plural+\".\"+spec.group",
                "spec.scope: Unsupported value: \"Global\": supported values: \"Cluster\", \"Namespaced\"",
                "spec.validation.openAPIV3Schema.properties[spec].type: Required value: must not be empty for specified object fields",
            ]
        );
    }

    #[test]
    fn protected_groups_need_the_approval_annotation() {
        let mut c = crd();
        c["metadata"]["name"] = json!("widgets.apps.k8s.io");
        c["spec"]["group"] = json!("apps.k8s.io");
        let msgs: Vec<String> = validate_definition(&c, None).iter().map(ToString::to_string).collect();
        assert_eq!(
            msgs,
            [
                "metadata.annotations[api-approved.kubernetes.io]: Required value: protected groups must have approval annotation \"api-approved.kubernetes.io\", see https://github.com/kubernetes/enhancements/pull/1111"
            ]
        );
        c["metadata"]["annotations"] =
            json!({"api-approved.kubernetes.io": "https://github.com/kubernetes/kubernetes/pull/1"});
        assert!(validate_definition(&c, None).is_empty());
    }

    #[test]
    fn names_held_by_another_definition_or_a_built_in_are_refused() {
        let mut other = crd();
        other["metadata"]["name"] = json!("gadgets.example.com");
        other["spec"]["names"] = json!({"plural": "gadgets", "kind": "Gadget", "shortNames": ["wd"]});
        assert_eq!(
            names_conflict(&crd(), &[other]),
            Some(("ShortNamesConflict", "\"wd\" is already in use".to_string()))
        );
        let mut apps = crd();
        apps["spec"]["group"] = json!("apps");
        apps["spec"]["names"]["plural"] = json!("deployments");
        assert!(names_conflict(&apps, &[]).is_some());
    }
}

#[cfg(test)]
mod schema_tests {
    use serde_json::json;

    #[test]
    fn a_definition_passes_the_type_check_of_its_own_schema() {
        let def = crate::schema::definition_for("apiextensions.k8s.io", "v1", "CustomResourceDefinition").expect("def");
        let crd = json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                "names": {"plural": "widgets", "kind": "Widget", "shortNames": ["wd"], "categories": ["all"]},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "additionalPrinterColumns": [{"name": "R", "type": "integer", "jsonPath": ".spec.r"}],
                    "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.r", "statusReplicasPath": ".status.r"}},
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object",
                        "x-kubernetes-preserve-unknown-fields": true,
                        "properties": {"r": {"type": "integer", "default": 1, "enum": [1, "x"], "minimum": 0},
                            "p": {"x-kubernetes-int-or-string": true}, "l": {"type": "array", "items": {"type": "string"}},
                            "m": {"type": "object", "additionalProperties": {"type": "string"}},
                            "b": {"type": "object", "additionalProperties": true}}}}}}}]}
        });
        assert_eq!(crate::schema::unknown_fields(def, &crd), Vec::<String>::new());
    }
}
