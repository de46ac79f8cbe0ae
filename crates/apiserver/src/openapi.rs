//! OpenAPI v3 documents (`/openapi/v3` and `/openapi/v3/<path>`), laid out as upstream's:
//! one document per group-version with the REST paths of every served resource and the
//! component schemas reachable from its kinds (from [`skiff_api::schema::definitions`]).
//!
//! kubectl relies on three things here: the `patch` operation of a kind carries a
//! `fieldValidation` parameter and accepts `application/strategic-merge-patch+json`
//! (strict server-side validation and strategic merge in `apply`), and every kind's schema
//! carries `x-kubernetes-group-version-kind` (`explain`, patch metadata lookup).
//! Documents are built once and cached; their hash changes whenever their content does.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha512};
use skiff_api::Resource;
use skiff_api::registry::{self, RESOURCES};
use skiff_api::schema::{self, REF_PREFIX};

use crate::discovery::{self, GIT_VERSION, Gvk};

const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1";
const GVK_EXT: &str = "x-kubernetes-group-version-kind";
const ACTION_EXT: &str = "x-kubernetes-action";

const PATCH_TYPES: &[&str] = &[
    "application/apply-patch+yaml",
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
];

/// One built document: its value, its serialized bytes and their hash.
struct Doc {
    value: Arc<Value>,
    bytes: Bytes,
    hash: String,
}

fn docs() -> &'static BTreeMap<String, Doc> {
    static DOCS: OnceLock<BTreeMap<String, Doc>> = OnceLock::new();
    DOCS.get_or_init(build_all)
}

/// The definition name of a kind: the built-in schema's, or for a custom kind upstream's
/// `<reversed group>.<version>.<Kind>` (`com.example.v1.Widget`).
fn def_of(group: &str, version: &str, kind: &str) -> Option<String> {
    if let Some(d) = schema::definition_for(group, version, kind) {
        return Some(d.to_string());
    }
    let r = registry::lookup_kind(group, kind)?;
    skiff_api::apiextensions::definition(r)?;
    Some(custom_def_name(group, version, kind))
}

fn custom_def_name(group: &str, version: &str, kind: &str) -> String {
    let reversed: Vec<&str> = group.split('.').rev().collect();
    format!("{}.{version}.{kind}", reversed.join("."))
}

/// The document of a custom resource's group-version, built from its definition as it is
/// now (served while the definition is).
fn custom_doc(path: &str) -> Option<Doc> {
    let rest = normalize(path).strip_prefix("apis/")?;
    let (group, version) = rest.split_once('/')?;
    let r = registry::custom()
        .into_iter()
        .find(|r| r.group == group && r.version == version)?;
    skiff_api::apiextensions::definition(r)?;
    Some(finish(custom_group_version_document(group, version)))
}

fn custom_group_version_document(group: &str, version: &str) -> Value {
    let prefix = format!("/apis/{group}/{version}");
    let mut set = PathSet {
        tag: tag(group, version),
        custom: true,
        paths: BTreeMap::new(),
    };
    let mut roots: Vec<String> = vec![format!("{META}.Status"), format!("{META}.DeleteOptions")];
    let mut extra: BTreeMap<String, Value> = synthetic_definitions().into_iter().collect();
    let mut gvks: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for r in registry::custom()
        .into_iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let Some(d) = skiff_api::apiextensions::definition(r) else {
            continue;
        };
        let Some(v) = d.version(version) else { continue };
        let def = custom_def_name(group, version, r.kind);
        let mut root = match &v.schema_json {
            Value::Object(m) => Value::Object(m.clone()),
            _ => json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
        };
        if let Some(props) = root
            .as_object_mut()
            .map(|m| m.entry("properties").or_insert_with(|| json!({})))
            .and_then(Value::as_object_mut)
        {
            props.insert(
                "apiVersion".into(),
                json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources"}),
            );
            props.insert(
                "kind".into(),
                json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds"}),
            );
            props.insert(
                "metadata".into(),
                json!({"description": "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata", "allOf": [reference(&format!("{META}.ObjectMeta"))]}),
            );
        }
        extra.insert(def.clone(), root);
        roots.push(def.clone());
        gvks.insert(def.clone(), vec![gvk_value(discovery::response_kind(r))]);
        let list_name = format!("{def}List");
        extra.insert(
            list_name.clone(),
            json!({
                "description": format!("{} is a list of {}", r.list_kind(), r.kind),
                "type": "object",
                "required": ["items"],
                "properties": {
                    "apiVersion": {"type": "string"},
                    "items": {"type": "array", "items": reference(&def)},
                    "kind": {"type": "string"},
                    "metadata": {"allOf": [reference(&format!("{META}.ListMeta"))]},
                },
            }),
        );
        roots.push(list_name.clone());
        gvks.insert(
            list_name,
            vec![json!({"group": r.group, "kind": r.list_kind(), "version": r.version})],
        );
        resource_paths(&mut set, r, &prefix);
    }
    for item in set.paths.values() {
        let mut refs = Vec::new();
        collect_refs(&Value::Object(item.clone()), &mut refs);
        roots.extend(refs);
    }
    let schemas = components(&roots, &extra, &gvks);
    document(set.paths, schemas)
}

fn normalize(path: &str) -> &str {
    path.trim_matches('/')
}

/// `GET /openapi/v3`: every document's path and its hash-qualified URL.
pub fn v3_index() -> Value {
    let mut paths = Map::new();
    for (path, doc) in docs() {
        paths.insert(
            path.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{path}?hash={}", doc.hash)}),
        );
    }
    for r in registry::custom() {
        let path = doc_path(r.group, r.version);
        if paths.contains_key(&path) {
            continue;
        }
        if let Some(doc) = custom_doc(&path) {
            paths.insert(
                path.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{path}?hash={}", doc.hash)}),
            );
        }
    }
    json!({ "paths": paths })
}

/// The document at `path` (`api/v1`, `apis/apps/v1`, `api`, `apis`, `apis/apps`).
pub fn v3_document(path: &str) -> Option<Arc<Value>> {
    docs()
        .get(normalize(path))
        .map(|d| d.value.clone())
        .or_else(|| custom_doc(path).map(|d| d.value))
}

/// The serialized JSON of the document at `path`, ready to send (what [`hash_of`] hashes).
pub fn v3_document_bytes(path: &str) -> Option<Bytes> {
    docs()
        .get(normalize(path))
        .map(|d| d.bytes.clone())
        .or_else(|| custom_doc(path).map(|d| d.bytes))
}

/// The hash of the document at `path` (upper-case hex SHA-512 of its JSON, as upstream).
pub fn hash_of(path: &str) -> Option<String> {
    docs()
        .get(normalize(path))
        .map(|d| d.hash.clone())
        .or_else(|| custom_doc(path).map(|d| d.hash))
}

/// `/openapi/v2` as JSON and as gnostic protobuf, converted from every v3 document served now
/// (the custom resources' included); rebuilt only when the custom resources served change.
pub fn v2_document() -> (Bytes, Bytes) {
    type Cached = (Vec<usize>, Bytes, Bytes);
    static CACHE: std::sync::Mutex<Option<Cached>> = std::sync::Mutex::new(None);
    let customs = registry::custom();
    let key: Vec<usize> = customs.iter().map(|r| std::ptr::from_ref(*r) as usize).collect();
    let mut cache = match CACHE.lock() {
        Ok(c) => c,
        Err(p) => p.into_inner(),
    };
    if let Some((k, json, pb)) = cache.as_ref()
        && *k == key
    {
        return (json.clone(), pb.clone());
    }
    let mut custom_gvs: Vec<(&str, &str)> = Vec::new();
    for r in &customs {
        if skiff_api::apiextensions::definition(r).is_some() && !custom_gvs.contains(&(r.group, r.version)) {
            custom_gvs.push((r.group, r.version));
        }
    }
    let custom_docs: Vec<Value> = custom_gvs
        .into_iter()
        .map(|(g, v)| custom_group_version_document(g, v))
        .collect();
    let v3 = docs().values().map(|d| d.value.as_ref()).chain(custom_docs.iter());
    let doc = crate::openapi_v2::document(v3);
    let json = Bytes::from(serde_json::to_vec(&doc).unwrap_or_default());
    let pb = Bytes::from(crate::openapi_v2::protobuf(&doc));
    *cache = Some((key, json.clone(), pb.clone()));
    (json, pb)
}

/// The group-versions served, in registry order.
fn group_versions() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&'static str, &'static str)> = Vec::new();
    for r in RESOURCES {
        if !out.contains(&(r.group, r.version)) {
            out.push((r.group, r.version));
        }
    }
    out
}

fn doc_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

fn build_all() -> BTreeMap<String, Doc> {
    let mut out = BTreeMap::new();
    for (group, version) in group_versions() {
        out.insert(doc_path(group, version), finish(group_version_document(group, version)));
    }
    out.insert("api".into(), finish(root_document(true)));
    out.insert("apis".into(), finish(root_document(false)));
    for group in registry::groups() {
        out.insert(format!("apis/{group}"), finish(group_document(group)));
    }
    out
}

fn finish(value: Value) -> Doc {
    let bytes = match serde_json::to_vec(&value) {
        Ok(b) => b,
        Err(e) => {
            // Serializing a `Value` cannot fail; keep the server up regardless.
            tracing::error!(error = %e, "serializing an OpenAPI document failed");
            Vec::new()
        }
    };
    let hash = hex::encode_upper(Sha512::digest(&bytes));
    Doc {
        value: Arc::new(value),
        bytes: Bytes::from(bytes),
        hash,
    }
}

fn reference(name: &str) -> Value {
    json!({ "$ref": format!("{REF_PREFIX}{name}") })
}

fn gvk_value(g: Gvk) -> Value {
    json!({"group": g.group, "kind": g.kind, "version": g.version})
}

/// "apps" -> "Apps", "coordination.k8s.io" -> "Coordination", "" -> "Core",
/// "rbac.authorization.k8s.io" -> "RbacAuthorization" (upstream's operation ids).
fn group_camel(group: &str) -> String {
    if group.is_empty() {
        return "Core".into();
    }
    let trimmed = group.strip_suffix(".k8s.io").unwrap_or(group);
    trimmed
        .split('.')
        .map(|part| {
            let mut c = part.chars();
            match c.next() {
                Some(f) => f.to_uppercase().chain(c).collect::<String>(),
                None => String::new(),
            }
        })
        .collect()
}

/// The operation tag: "core_v1", "apps_v1", "rbacAuthorization_v1".
fn tag(group: &str, version: &str) -> String {
    let camel = group_camel(group);
    let mut c = camel.chars();
    let lower: String = match c.next() {
        Some(f) => f.to_lowercase().chain(c).collect(),
        None => String::new(),
    };
    format!("{lower}_{version}")
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

// ---- parameters -------------------------------------------------------------------

fn param(name: &str, location: &str, ty: &str, description: &str) -> Value {
    let mut p = json!({
        "name": name,
        "in": location,
        "description": description,
        "schema": {"type": ty, "uniqueItems": true},
    });
    if location == "path" {
        p["required"] = json!(true);
    }
    p
}

fn p_pretty() -> Value {
    param(
        "pretty",
        "query",
        "string",
        "If 'true', then the output is pretty printed.",
    )
}

fn p_name(kind: &str) -> Value {
    param("name", "path", "string", &format!("name of the {kind}"))
}

fn p_namespace() -> Value {
    param(
        "namespace",
        "path",
        "string",
        "object name and auth scope, such as for teams and projects",
    )
}

fn p_dry_run() -> Value {
    param(
        "dryRun",
        "query",
        "string",
        "When present, indicates that modifications should not be persisted. Valid values: All (process every stage without persisting).",
    )
}

fn p_field_manager() -> Value {
    param(
        "fieldManager",
        "query",
        "string",
        "The name of the actor or entity making these changes, recorded in managedFields.",
    )
}

fn p_field_validation() -> Value {
    param(
        "fieldValidation",
        "query",
        "string",
        "How the server handles unknown or duplicate fields in the request body: Ignore (drop them silently), Warn (drop them and answer with a warning per field) or Strict (fail the request with a BadRequest error).",
    )
}

fn p_force() -> Value {
    param(
        "force",
        "query",
        "boolean",
        "Force an apply request: take over fields owned by other managers instead of failing with a conflict. Only valid for apply patches.",
    )
}

fn list_params() -> Vec<Value> {
    vec![
        param(
            "allowWatchBookmarks",
            "query",
            "boolean",
            "Ask for BOOKMARK watch events; the server may send them at any time.",
        ),
        param(
            "continue",
            "query",
            "string",
            "The continue token of a previous paged list, to fetch the next page.",
        ),
        param(
            "fieldSelector",
            "query",
            "string",
            "Restrict the returned objects by their fields. Defaults to everything.",
        ),
        param(
            "labelSelector",
            "query",
            "string",
            "Restrict the returned objects by their labels. Defaults to everything.",
        ),
        param(
            "limit",
            "query",
            "integer",
            "The maximum number of objects to return in one page; the list's metadata.continue fetches the next.",
        ),
        param(
            "resourceVersion",
            "query",
            "string",
            "Which resource versions the request may be served from; see resourceVersionMatch.",
        ),
        param(
            "resourceVersionMatch",
            "query",
            "string",
            "How resourceVersion applies to list calls: Exact or NotOlderThan.",
        ),
        param(
            "sendInitialEvents",
            "query",
            "boolean",
            "With watch=true, start the watch with synthetic ADDED events for the current state, then a bookmark annotated k8s.io/initial-events-end.",
        ),
        param(
            "timeoutSeconds",
            "query",
            "integer",
            "Timeout for the list/watch call, regardless of activity.",
        ),
        param(
            "watch",
            "query",
            "boolean",
            "Watch for changes to the described resources and return them as a stream of add, update and remove notifications.",
        ),
    ]
}

fn delete_params() -> Vec<Value> {
    vec![
        p_dry_run(),
        param(
            "gracePeriodSeconds",
            "query",
            "integer",
            "Seconds before the object is deleted; zero means delete immediately.",
        ),
        param(
            "ignoreStoreReadErrorWithClusterBreakingPotential",
            "query",
            "boolean",
            "Delete an object whose stored data cannot be read. Dangerous.",
        ),
        param(
            "orphanDependents",
            "query",
            "boolean",
            "Deprecated: use propagationPolicy. Whether dependents are orphaned.",
        ),
        param(
            "propagationPolicy",
            "query",
            "string",
            "Whether and how garbage collection is performed: Orphan, Background or Foreground.",
        ),
    ]
}

fn delete_collection_params() -> Vec<Value> {
    let mut out = delete_params();
    out.extend(
        list_params()
            .into_iter()
            .filter(|p| !matches!(p["name"].as_str(), Some("watch" | "allowWatchBookmarks"))),
    );
    out.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    out
}

fn write_params() -> Vec<Value> {
    vec![p_dry_run(), p_field_manager(), p_field_validation()]
}

fn patch_params() -> Vec<Value> {
    vec![p_dry_run(), p_field_manager(), p_field_validation(), p_force()]
}

// ---- operations -------------------------------------------------------------------

fn json_content(schema: Value) -> Value {
    json!({ "application/json": {"schema": schema} })
}

fn ok(description: &str, schema: Value) -> Value {
    json!({"description": description, "content": json_content(schema)})
}

fn unauthorized() -> Value {
    json!({"description": "Unauthorized"})
}

struct Op {
    description: String,
    operation_id: String,
    parameters: Vec<Value>,
    request_body: Option<Value>,
    responses: Vec<(&'static str, Value)>,
    action: &'static str,
    gvk: Gvk,
}

impl Op {
    fn to_value(&self, tag: &str) -> Value {
        let mut m = Map::new();
        m.insert("tags".into(), json!([tag]));
        m.insert("description".into(), json!(self.description));
        m.insert("operationId".into(), json!(self.operation_id));
        if !self.parameters.is_empty() {
            m.insert("parameters".into(), Value::Array(self.parameters.clone()));
        }
        if let Some(b) = &self.request_body {
            m.insert("requestBody".into(), b.clone());
        }
        let mut responses = Map::new();
        for (code, r) in &self.responses {
            responses.insert((*code).to_string(), r.clone());
        }
        responses.insert("401".into(), unauthorized());
        m.insert("responses".into(), Value::Object(responses));
        m.insert(ACTION_EXT.into(), json!(self.action));
        m.insert(GVK_EXT.into(), gvk_value(self.gvk));
        Value::Object(m)
    }
}

fn body_of(schema_name: &str) -> Value {
    json!({"content": {"*/*": {"schema": reference(schema_name)}}, "required": true})
}

/// The patch types a resource takes: custom resources take no strategic merge patch, as
/// upstream's (kubectl then sends a JSON merge patch for `apply`).
fn patch_body(custom: bool) -> Value {
    let mut content = Map::new();
    for t in PATCH_TYPES.iter().filter(|t| !custom || !t.contains("strategic")) {
        content.insert((*t).to_string(), json!({"schema": reference(&format!("{META}.Patch"))}));
    }
    json!({"content": content, "required": true})
}

fn delete_body() -> Value {
    json!({"content": {"*/*": {"schema": reference(&format!("{META}.DeleteOptions"))}}})
}

/// The paths of one group-version document, as they are being assembled.
struct PathSet {
    tag: String,
    /// The group-version is a custom resource's.
    custom: bool,
    paths: BTreeMap<String, Map<String, Value>>,
}

impl PathSet {
    fn add(&mut self, path: &str, params: &[Value], method: &str, op: Op) {
        let item = self.paths.entry(path.to_string()).or_default();
        item.insert(method.to_string(), op.to_value(&self.tag));
        item.insert("parameters".into(), Value::Array(params.to_vec()));
    }
}

/// Names used in the operations of one resource.
struct Names {
    /// "CoreV1", "AppsV1"
    gv: String,
    /// "NamespacedPod" or "Node"
    scoped: String,
    kind: &'static str,
    def: String,
    list_def: String,
}

fn resource_paths(set: &mut PathSet, r: &Resource, prefix: &str) {
    let Some(def) = def_of(r.group, r.version, r.kind) else {
        tracing::warn!(kind = r.kind, group = r.group, "no schema for a served kind");
        return;
    };
    let n = Names {
        gv: format!("{}{}", group_camel(r.group), capitalize(r.version)),
        scoped: if r.namespaced {
            format!("Namespaced{}", r.kind)
        } else {
            r.kind.to_string()
        },
        kind: r.kind,
        def: def.to_string(),
        list_def: format!("{def}List"),
    };
    let gvk = discovery::response_kind(r);
    let verbs = discovery::verbs(r);
    let can = |v: &str| verbs.contains(&v);
    let (collection, item_params_ns): (String, Vec<Value>) = if r.namespaced {
        (
            format!("{prefix}/namespaces/{{namespace}}/{}", r.plural),
            vec![p_namespace()],
        )
    } else {
        (format!("{prefix}/{}", r.plural), vec![])
    };
    let item = format!("{collection}/{{name}}");
    let mut collection_params = item_params_ns.clone();
    collection_params.push(p_pretty());
    let mut item_params = vec![p_name(r.kind)];
    item_params.extend(item_params_ns.iter().cloned());
    item_params.push(p_pretty());
    let kind = n.kind;

    if can("list") {
        set.add(
            &collection,
            &collection_params,
            "get",
            Op {
                description: format!("list or watch objects of kind {kind}"),
                operation_id: format!("list{}{}", n.gv, n.scoped),
                parameters: list_params(),
                request_body: None,
                responses: vec![("200", ok("OK", reference(&n.list_def)))],
                action: "list",
                gvk,
            },
        );
    }
    if can("create") {
        set.add(
            &collection,
            &collection_params,
            "post",
            Op {
                description: format!("create a {kind}"),
                operation_id: format!("create{}{}", n.gv, n.scoped),
                parameters: write_params(),
                request_body: Some(body_of(&n.def)),
                responses: vec![
                    ("200", ok("OK", reference(&n.def))),
                    ("201", ok("Created", reference(&n.def))),
                    ("202", ok("Accepted", reference(&n.def))),
                ],
                action: "post",
                gvk,
            },
        );
    }
    if can("deletecollection") {
        set.add(
            &collection,
            &collection_params,
            "delete",
            Op {
                description: format!("delete collection of {kind}"),
                operation_id: format!("delete{}Collection{}", n.gv, n.scoped),
                parameters: delete_collection_params(),
                request_body: Some(delete_body()),
                responses: vec![("200", ok("OK", reference(&format!("{META}.Status"))))],
                action: "deletecollection",
                gvk,
            },
        );
    }
    if can("get") {
        set.add(
            &item,
            &item_params,
            "get",
            Op {
                description: format!("read the specified {kind}"),
                operation_id: format!("read{}{}", n.gv, n.scoped),
                parameters: vec![],
                request_body: None,
                responses: vec![("200", ok("OK", reference(&n.def)))],
                action: "get",
                gvk,
            },
        );
    }
    if can("update") {
        set.add(
            &item,
            &item_params,
            "put",
            Op {
                description: format!("replace the specified {kind}"),
                operation_id: format!("replace{}{}", n.gv, n.scoped),
                parameters: write_params(),
                request_body: Some(body_of(&n.def)),
                responses: vec![
                    ("200", ok("OK", reference(&n.def))),
                    ("201", ok("Created", reference(&n.def))),
                ],
                action: "put",
                gvk,
            },
        );
    }
    if can("patch") {
        set.add(
            &item,
            &item_params,
            "patch",
            Op {
                description: format!("partially update the specified {kind}"),
                operation_id: format!("patch{}{}", n.gv, n.scoped),
                parameters: patch_params(),
                request_body: Some(patch_body(set.custom)),
                responses: vec![
                    ("200", ok("OK", reference(&n.def))),
                    ("201", ok("Created", reference(&n.def))),
                ],
                action: "patch",
                gvk,
            },
        );
    }
    if can("delete") {
        set.add(
            &item,
            &item_params,
            "delete",
            Op {
                description: format!("delete a {kind}"),
                operation_id: format!("delete{}{}", n.gv, n.scoped),
                parameters: delete_params(),
                request_body: Some(delete_body()),
                responses: vec![
                    ("200", ok("OK", reference(&format!("{META}.Status")))),
                    ("202", ok("Accepted", reference(&format!("{META}.Status")))),
                ],
                action: "delete",
                gvk,
            },
        );
    }
    if can("watch") {
        watch_paths(set, r, prefix, &n, gvk);
    }
    if r.namespaced && can("list") {
        let all = format!("{prefix}/{}", r.plural);
        set.add(
            &all,
            &[p_pretty()],
            "get",
            Op {
                description: format!("list or watch objects of kind {kind}"),
                operation_id: format!("list{}{}ForAllNamespaces", n.gv, kind),
                parameters: list_params(),
                request_body: None,
                responses: vec![("200", ok("OK", reference(&n.list_def)))],
                action: "list",
                gvk,
            },
        );
    }
    for sub in discovery::subresources(r) {
        subresource_paths(set, r, &n, &item, &item_params, &sub);
    }
}

fn watch_event_response() -> Value {
    let schema = reference(&format!("{META}.WatchEvent"));
    json!({
        "description": "OK",
        "content": {
            "application/json": {"schema": schema.clone()},
            "application/json;stream=watch": {"schema": schema},
        }
    })
}

fn watch_paths(set: &mut PathSet, r: &Resource, prefix: &str, n: &Names, gvk: Gvk) {
    let kind = n.kind;
    let (base, ns_params): (String, Vec<Value>) = if r.namespaced {
        (
            format!("{prefix}/watch/namespaces/{{namespace}}/{}", r.plural),
            vec![p_namespace()],
        )
    } else {
        (format!("{prefix}/watch/{}", r.plural), vec![])
    };
    let mut list_level = ns_params.clone();
    list_level.push(p_pretty());
    let mut item_level = vec![p_name(kind)];
    item_level.extend(ns_params);
    item_level.push(p_pretty());
    let watch = |description: String, operation_id: String, action: &'static str| Op {
        description,
        operation_id,
        parameters: list_params(),
        request_body: None,
        responses: vec![("200", watch_event_response())],
        action,
        gvk,
    };
    set.add(
        &base,
        &list_level,
        "get",
        watch(
            format!("watch individual changes to a list of {kind}. deprecated: use the 'watch' parameter with a list operation instead."),
            format!("watch{}{}List", n.gv, n.scoped),
            "watchlist",
        ),
    );
    set.add(
        &format!("{base}/{{name}}"),
        &item_level,
        "get",
        watch(
            format!("watch changes to an object of kind {kind}. deprecated: use the 'watch' parameter with a list operation instead, filtered to a single item with the 'fieldSelector' parameter."),
            format!("watch{}{}", n.gv, n.scoped),
            "watch",
        ),
    );
    if r.namespaced {
        set.add(
            &format!("{prefix}/watch/{}", r.plural),
            &[p_pretty()],
            "get",
            watch(
                format!("watch individual changes to a list of {kind}. deprecated: use the 'watch' parameter with a list operation instead."),
                format!("watch{}{}ListForAllNamespaces", n.gv, kind),
                "watchlist",
            ),
        );
    }
}

fn string_response() -> Value {
    json!({"description": "OK", "content": {"*/*": {"schema": {"type": "string"}}}})
}

fn subresource_paths(
    set: &mut PathSet,
    r: &Resource,
    n: &Names,
    item: &str,
    item_params: &[Value],
    sub: &discovery::Subresource,
) {
    let path = format!("{item}/{}", sub.name);
    let suffix = capitalize(sub.name);
    let rk = sub.response_kind;
    let kind = n.kind;
    let rk_def = def_of(rk.group, rk.version, rk.kind);
    let id = |verb: &str| format!("{verb}{}{}{}", n.gv, n.scoped, suffix);
    match sub.name {
        "status" | "approval" | "scale" | "ephemeralcontainers" | "resize" => {
            let Some(def) = rk_def else { return };
            let what = match sub.name {
                "status" => "status of",
                "approval" => "approval of",
                "scale" => "scale of",
                "resize" => "resize of",
                _ => "ephemeralcontainers of",
            };
            let read = Op {
                description: format!("read {what} the specified {kind}"),
                operation_id: id("read"),
                parameters: vec![],
                request_body: None,
                responses: vec![("200", ok("OK", reference(&def)))],
                action: "get",
                gvk: rk,
            };
            set.add(&path, item_params, "get", read);
            let replace = Op {
                description: format!("replace {what} the specified {kind}"),
                operation_id: id("replace"),
                parameters: write_params(),
                request_body: Some(body_of(&def)),
                responses: vec![
                    ("200", ok("OK", reference(&def))),
                    ("201", ok("Created", reference(&def))),
                ],
                action: "put",
                gvk: rk,
            };
            set.add(&path, item_params, "put", replace);
            let patch = Op {
                description: format!("partially update {what} the specified {kind}"),
                operation_id: id("patch"),
                parameters: patch_params(),
                request_body: Some(patch_body(set.custom)),
                responses: vec![
                    ("200", ok("OK", reference(&def))),
                    ("201", ok("Created", reference(&def))),
                ],
                action: "patch",
                gvk: rk,
            };
            set.add(&path, item_params, "patch", patch);
        }
        "finalize" => {
            let Some(def) = rk_def else { return };
            // Upstream's finalize path has no pretty parameter on the operation but keeps the path ones.
            let op = Op {
                description: format!("replace finalize of the specified {kind}"),
                operation_id: id("replace"),
                parameters: write_params(),
                request_body: Some(body_of(&def)),
                responses: vec![
                    ("200", ok("OK", reference(&def))),
                    ("201", ok("Created", reference(&def))),
                ],
                action: "put",
                gvk: rk,
            };
            set.add(&path, item_params, "put", op);
        }
        "binding" | "eviction" | "token" => {
            let Some(def) = rk_def else { return };
            let op = Op {
                description: format!("create {} of a {kind}", sub.name),
                operation_id: id("create"),
                parameters: write_params(),
                request_body: Some(body_of(&def)),
                responses: vec![
                    ("200", ok("OK", reference(&def))),
                    ("201", ok("Created", reference(&def))),
                    ("202", ok("Accepted", reference(&def))),
                ],
                action: "post",
                gvk: rk,
            };
            set.add(&path, item_params, "post", op);
        }
        "log" => {
            let op = Op {
                description: format!("read log of the specified {kind}"),
                operation_id: id("read"),
                parameters: log_params(),
                request_body: None,
                responses: vec![("200", string_response())],
                action: "get",
                gvk: rk,
            };
            set.add(&path, item_params, "get", op);
        }
        "exec" | "attach" | "portforward" => {
            let params = connect_params(sub.name);
            for method in ["get", "post"] {
                let op = Op {
                    description: format!("connect {} requests to {} of {kind}", method.to_uppercase(), sub.name),
                    operation_id: format!("connect{}{}{}{}", capitalize(method), n.gv, n.scoped, suffix),
                    parameters: params.clone(),
                    request_body: None,
                    responses: vec![("200", string_response())],
                    action: "connect",
                    gvk: rk,
                };
                set.add(&path, item_params, method, op);
            }
        }
        "proxy" => {
            let mut with_path = item_params.to_vec();
            with_path.insert(1, param("path", "path", "string", "path to the resource"));
            for (p, params) in [
                (path.clone(), item_params.to_vec()),
                (format!("{path}/{{path}}"), with_path),
            ] {
                for method in ["get", "post", "put", "patch", "delete"] {
                    let with_sub_path = p.ends_with("{path}");
                    let op = Op {
                        description: format!("connect {} requests to proxy of {kind}", method.to_uppercase()),
                        operation_id: format!(
                            "connect{}{}{}Proxy{}",
                            capitalize(method),
                            n.gv,
                            n.scoped,
                            if with_sub_path { "WithPath" } else { "" }
                        ),
                        parameters: vec![param(
                            "path",
                            "query",
                            "string",
                            "Path is the URL path to use for the current proxy request.",
                        )],
                        request_body: None,
                        responses: vec![("200", string_response())],
                        action: "connect",
                        gvk: rk,
                    };
                    set.add(&p, &params, method, op);
                }
            }
        }
        other => {
            tracing::debug!(
                subresource = other,
                resource = r.plural,
                "subresource without OpenAPI paths"
            );
        }
    }
}

fn log_params() -> Vec<Value> {
    vec![
        param(
            "container",
            "query",
            "string",
            "The container for which to stream logs. Defaults to the only container if there is one.",
        ),
        param(
            "follow",
            "query",
            "boolean",
            "Follow the log stream of the pod. Defaults to false.",
        ),
        param(
            "insecureSkipTLSVerifyBackend",
            "query",
            "boolean",
            "Do not verify the serving certificate of the node when fetching the logs.",
        ),
        param(
            "limitBytes",
            "query",
            "integer",
            "The number of bytes to read from the server before terminating the log output.",
        ),
        param(
            "previous",
            "query",
            "boolean",
            "Return the logs of the previous terminated container. Defaults to false.",
        ),
        param(
            "sinceSeconds",
            "query",
            "integer",
            "A relative time in seconds before now from which to show logs.",
        ),
        param(
            "sinceTime",
            "query",
            "string",
            "An RFC3339 timestamp from which to show logs.",
        ),
        param(
            "stream",
            "query",
            "string",
            "Which container log stream to return: All, Stdout or Stderr. Defaults to All.",
        ),
        param(
            "tailLines",
            "query",
            "integer",
            "The number of lines from the end of the logs to show.",
        ),
        param(
            "timestamps",
            "query",
            "boolean",
            "Prefix every line of log output with an RFC3339 timestamp. Defaults to false.",
        ),
    ]
}

fn connect_params(sub: &str) -> Vec<Value> {
    let stream = |name: &str, what: &str| param(name, "query", "boolean", what);
    match sub {
        "exec" => vec![
            param(
                "command",
                "query",
                "string",
                "Command is the remote command to execute. argv array. Not executed within a shell.",
            ),
            param(
                "container",
                "query",
                "string",
                "Container in which to execute the command. Defaults to only container if there is only one container in the pod.",
            ),
            stream("stderr", "Redirect the standard error stream of the pod for this call."),
            stream(
                "stdin",
                "Redirect the standard input stream of the pod for this call. Defaults to false.",
            ),
            stream(
                "stdout",
                "Redirect the standard output stream of the pod for this call.",
            ),
            stream(
                "tty",
                "TTY if true indicates that a tty will be allocated for the exec call. Defaults to false.",
            ),
        ],
        "attach" => vec![
            param(
                "container",
                "query",
                "string",
                "The container in which to execute the command. Defaults to only container if there is only one container in the pod.",
            ),
            stream(
                "stderr",
                "Stderr if true indicates that stderr is to be redirected for the attach call. Defaults to true.",
            ),
            stream(
                "stdin",
                "Stdin if true, redirects the standard input stream of the pod for this call. Defaults to false.",
            ),
            stream(
                "stdout",
                "Stdout if true indicates that stdout is to be redirected for the attach call. Defaults to true.",
            ),
            stream(
                "tty",
                "TTY if true indicates that a tty will be allocated for the attach call.",
            ),
        ],
        _ => vec![param("ports", "query", "integer", "List of ports to forward.")],
    }
}

// ---- schemas -----------------------------------------------------------------------

/// Extra definitions every group-version document may refer to, which are not Go kinds of
/// their own in the project's schema set.
fn synthetic_definitions() -> Vec<(String, Value)> {
    vec![
        (
            format!("{META}.Patch"),
            json!({
                "description": "Patch is provided to give a concrete name and type to the Kubernetes PATCH request body.",
                "type": "object",
            }),
        ),
        (
            format!("{META}.WatchEvent"),
            json!({
                "description": "Event represents a single event to a watched resource.",
                "type": "object",
                "required": ["type", "object"],
                "properties": {
                    "object": {
                        "description": "Object is:\n * If Type is Added or Modified: the new state of the object.\n * If Type is Deleted: the state of the object immediately before deletion.\n * If Type is Error: *Status is recommended; other types may make sense\n   depending on context.",
                        "allOf": [reference("io.k8s.apimachinery.pkg.runtime.RawExtension")],
                    },
                    "type": {"type": "string", "default": ""},
                },
            }),
        ),
        (
            "io.k8s.apimachinery.pkg.runtime.RawExtension".to_string(),
            json!({
                "description": "RawExtension is used to hold extensions in external versions.",
                "type": "object",
            }),
        ),
    ]
}

/// The schema of `XList` for a kind whose definition is `def`.
fn list_definition(r: &Resource, def: &str) -> Value {
    let item = schema::definitions().get(def);
    let prop = |name: &str| {
        item.and_then(|d| d.get("properties"))
            .and_then(|p| p.get(name))
            .cloned()
            .unwrap_or_else(|| json!({"type": "string"}))
    };
    json!({
        "description": format!("{} is a list of {} objects.", r.list_kind(), r.kind),
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": prop("apiVersion"),
            "items": {
                "description": format!("List of {}.", r.plural),
                "type": "array",
                "items": reference(def),
            },
            "kind": prop("kind"),
            "metadata": {
                "description": "Standard list metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds",
                "allOf": [reference(&format!("{META}.ListMeta"))],
            },
        },
    })
}

/// Every `$ref` target named inside `v`.
fn collect_refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == "$ref" {
                    if let Some(name) = x.as_str().and_then(|s| s.strip_prefix(REF_PREFIX)) {
                        out.push(name.to_string());
                    }
                } else {
                    collect_refs(x, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| collect_refs(x, out)),
        _ => {}
    }
}

/// Set the GVK extension of a root kind's schema, as upstream; the root's `metadata` is
/// optional upstream (clients may omit it, e.g. with generateName).
fn mark_root(schema: &mut Value, gvks: &[Value]) {
    let Some(m) = schema.as_object_mut() else {
        return;
    };
    let mut list: Vec<Value> = m.get(GVK_EXT).and_then(Value::as_array).cloned().unwrap_or_default();
    for v in gvks {
        if !list.contains(v) {
            list.push(v.clone());
        }
    }
    m.insert(GVK_EXT.into(), Value::Array(list));
    let drop_required = match m.get_mut("required").and_then(Value::as_array_mut) {
        Some(req) => {
            req.retain(|x| x != "metadata");
            req.is_empty()
        }
        None => false,
    };
    if drop_required {
        m.remove("required");
    }
}

/// The component schemas of a document: the closure of `roots` over `$ref`, with GVK
/// extensions on the kinds in `gvks`.
fn components(
    roots: &[String],
    extra: &BTreeMap<String, Value>,
    gvks: &BTreeMap<String, Vec<Value>>,
) -> Map<String, Value> {
    let defs = schema::definitions();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut out: BTreeMap<String, Value> = BTreeMap::new();
    let mut queue: Vec<String> = roots.to_vec();
    while let Some(name) = queue.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        let Some(def) = extra.get(&name).or_else(|| defs.get(&name)) else {
            tracing::warn!(definition = %name, "OpenAPI reference to a missing definition");
            continue;
        };
        let mut def = def.clone();
        let mut refs = Vec::new();
        collect_refs(&def, &mut refs);
        queue.extend(refs);
        if let Some(g) = gvks.get(&name) {
            mark_root(&mut def, g);
        }
        out.insert(name, def);
    }
    out.into_iter().collect()
}

fn security() -> (Value, Value) {
    (
        json!({"BearerToken": {"type": "apiKey", "description": "Bearer Token authentication", "name": "authorization", "in": "header"}}),
        json!([{"BearerToken": []}]),
    )
}

fn document(paths: BTreeMap<String, Map<String, Value>>, schemas: Map<String, Value>) -> Value {
    let (schemes, security) = security();
    let paths: Map<String, Value> = paths.into_iter().map(|(k, v)| (k, Value::Object(v))).collect();
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": GIT_VERSION},
        "paths": paths,
        "components": {"schemas": schemas, "securitySchemes": schemes},
        "security": security,
    })
}

/// The document of one served group-version.
fn group_version_document(group: &str, version: &str) -> Value {
    let prefix = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    let mut set = PathSet {
        tag: tag(group, version),
        custom: false,
        paths: BTreeMap::new(),
    };
    let mut roots: Vec<String> = vec![format!("{META}.Status"), format!("{META}.DeleteOptions")];
    let mut extra: BTreeMap<String, Value> = synthetic_definitions().into_iter().collect();
    let mut gvks: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    gvks.insert(
        format!("{META}.Status"),
        vec![json!({"group": "", "kind": "Status", "version": "v1"})],
    );
    // Upstream lists DeleteOptions and WatchEvent under every group-version.
    let shared = |kind: &str| -> Vec<Value> {
        let mut gvs = group_versions();
        gvs.sort();
        gvs.into_iter()
            .map(|(g, ver)| json!({"group": g, "kind": kind, "version": ver}))
            .collect()
    };
    gvks.insert(format!("{META}.DeleteOptions"), shared("DeleteOptions"));
    gvks.insert(format!("{META}.WatchEvent"), shared("WatchEvent"));

    for r in RESOURCES.iter().filter(|r| r.group == group && r.version == version) {
        resource_paths(&mut set, r, &prefix);
        let Some(def) = schema::definition_for(r.group, r.version, r.kind) else {
            continue;
        };
        roots.push(def.to_string());
        gvks.entry(def.to_string())
            .or_default()
            .push(gvk_value(discovery::response_kind(r)));
        if discovery::verbs(r).contains(&"list") {
            let list_name = format!("{def}List");
            extra.insert(list_name.clone(), list_definition(r, def));
            roots.push(list_name.clone());
            gvks.insert(
                list_name,
                vec![json!({"group": r.group, "kind": r.list_kind(), "version": r.version})],
            );
        }
        for sub in discovery::subresources(r) {
            let rk = sub.response_kind;
            if let Some(d) = schema::definition_for(rk.group, rk.version, rk.kind) {
                roots.push(d.to_string());
                let entry = gvks.entry(d.to_string()).or_default();
                let v = gvk_value(rk);
                if !entry.contains(&v) {
                    entry.push(v);
                }
            }
        }
    }
    for item in set.paths.values() {
        let mut refs = Vec::new();
        collect_refs(&Value::Object(item.clone()), &mut refs);
        roots.extend(refs);
    }
    let schemas = components(&roots, &extra, &gvks);
    document(set.paths, schemas)
}

/// A minimal object schema for discovery kinds (`APIVersions`, `APIGroupList`, `APIGroup`).
fn discovery_kind_schema(kind: &str, description: &str) -> Value {
    json!({
        "description": description,
        "type": "object",
        "x-kubernetes-group-version-kind": [{"group": "", "kind": kind, "version": "v1"}],
    })
}

/// The `api` or `apis` document: the discovery endpoint itself.
fn root_document(core: bool) -> Value {
    let (path, id, kind, description, tag) = if core {
        (
            "/api/",
            "getCoreAPIVersions",
            "APIVersions",
            "APIVersions lists the versions that are available, to allow clients to discover the API at /api, which is the root path of the legacy v1 API.",
            "core",
        )
    } else {
        (
            "/apis/",
            "getAPIVersions",
            "APIGroupList",
            "APIGroupList is a list of APIGroup, to allow clients to discover the API at /apis.",
            "apis",
        )
    };
    let name = format!("{META}.{kind}");
    let mut paths = BTreeMap::new();
    let mut item = Map::new();
    item.insert(
        "get".into(),
        json!({
            "tags": [tag],
            "description": "get available API versions",
            "operationId": id,
            "responses": {"200": ok("OK", reference(&name)), "401": unauthorized()},
        }),
    );
    paths.insert(path.to_string(), item);
    let mut schemas = Map::new();
    schemas.insert(name, discovery_kind_schema(kind, description));
    document(paths, schemas)
}

/// The `apis/<group>` document.
fn group_document(group: &str) -> Value {
    let name = format!("{META}.APIGroup");
    let camel = group_camel(group);
    let mut paths = BTreeMap::new();
    let mut item = Map::new();
    let mut lower = camel.clone();
    if let Some(first) = lower.get(..1).map(str::to_lowercase) {
        lower.replace_range(..1, &first);
    }
    item.insert(
        "get".into(),
        json!({
            "tags": [lower],
            "description": "get information of a group",
            "operationId": format!("get{camel}APIGroup"),
            "responses": {"200": ok("OK", reference(&name)), "401": unauthorized()},
        }),
    );
    paths.insert(format!("/apis/{group}/"), item);
    let mut schemas = Map::new();
    schemas.insert(
        name,
        discovery_kind_schema(
            "APIGroup",
            "APIGroup contains the name, the supported versions, and the preferred version of a group.",
        ),
    );
    document(paths, schemas)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc_of(r: &Resource) -> Arc<Value> {
        v3_document(&doc_path(r.group, r.version)).expect("document")
    }

    /// The operations of a document whose GVK is `gvk` and whose method is `method`.
    fn ops<'a>(doc: &'a Value, method: &str, gvk: Gvk) -> Vec<(&'a String, &'a Value)> {
        doc["paths"]
            .as_object()
            .expect("paths")
            .iter()
            .filter_map(|(p, item)| item.get(method).map(|op| (p, op)))
            .filter(|(_, op)| op[GVK_EXT] == gvk_value(gvk))
            .collect()
    }

    fn param_names(op: &Value) -> Vec<&str> {
        op["parameters"]
            .as_array()
            .map(|a| a.iter().filter_map(|p| p["name"].as_str()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn index_lists_every_document_with_its_hash() {
        let index = v3_index();
        let paths = index["paths"].as_object().expect("paths");
        for (g, v) in group_versions() {
            let p = doc_path(g, v);
            let url = paths[&p]["serverRelativeURL"].as_str().expect("url");
            let hash = hash_of(&p).expect("hash");
            assert_eq!(url, format!("/openapi/v3/{p}?hash={hash}"));
            assert_eq!(hash.len(), 128);
        }
        assert!(paths.contains_key("api"));
        assert!(paths.contains_key("apis"));
        assert!(paths.contains_key("apis/apps"));
        assert!(v3_document("apis/nope/v1").is_none());
        assert!(v3_document("/api/v1/").is_some());
    }

    #[test]
    fn hash_is_stable_and_follows_content() {
        let a = hash_of("api/v1").expect("hash");
        assert_eq!(hash_of("api/v1"), Some(a.clone()));
        let bytes = v3_document_bytes("api/v1").expect("bytes");
        assert_eq!(a, hex::encode_upper(Sha512::digest(&bytes)));
        // Rebuilding gives the same content, so the same hash.
        let rebuilt = finish(group_version_document("", "v1"));
        assert_eq!(rebuilt.hash, a);
        // Different content, different hash.
        assert_ne!(hash_of("apis/apps/v1"), Some(a.clone()));
        let mut changed = (*rebuilt.value).clone();
        changed["info"]["title"] = json!("other");
        assert_ne!(finish(changed).hash, a);
        let parsed: Value = serde_json::from_slice(&bytes).expect("json");
        assert_eq!(&parsed, &*v3_document("api/v1").expect("doc"));
    }

    #[test]
    fn every_served_kind_has_a_schema_with_its_gvk() {
        for r in RESOURCES {
            let doc = doc_of(r);
            let def = schema::definition_for(r.group, r.version, r.kind).expect("definition");
            let s = &doc["components"]["schemas"][def];
            let gvk = gvk_value(discovery::response_kind(r));
            assert!(
                s[GVK_EXT].as_array().expect("gvk list").contains(&gvk),
                "{} lacks its GVK",
                r.kind
            );
            assert!(s["description"].is_string(), "{} has a description", r.kind);
            let list = &doc["components"]["schemas"][format!("{def}List")];
            if discovery::verbs(r).contains(&"list") {
                assert_eq!(list[GVK_EXT][0]["kind"], r.list_kind());
            }
            // explain finds the kind through a GET operation on its collection or item path.
            let get = ops(&doc, "get", discovery::response_kind(r));
            // Create-only resources (bindings, the reviews) have nothing to read.
            assert!(!get.is_empty() || r.is_create_only(), "{} has no get", r.kind);
        }
    }

    #[test]
    fn rbac_and_review_documents() {
        let rbac = v3_document("apis/rbac.authorization.k8s.io/v1").expect("rbac");
        let item = &rbac["paths"]["/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings/{name}"];
        assert_eq!(
            item["patch"]["operationId"],
            "patchRbacAuthorizationV1NamespacedRoleBinding"
        );
        assert_eq!(
            item["put"]["operationId"],
            "replaceRbacAuthorizationV1NamespacedRoleBinding"
        );
        let crb = &rbac["paths"]["/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"];
        assert_eq!(crb["get"]["operationId"], "listRbacAuthorizationV1ClusterRoleBinding");
        let schemas = &rbac["components"]["schemas"];
        for def in [
            "io.k8s.api.rbac.v1.Role",
            "io.k8s.api.rbac.v1.RoleList",
            "io.k8s.api.rbac.v1.ClusterRoleBindingList",
            "io.k8s.api.rbac.v1.Subject",
            "io.k8s.api.rbac.v1.PolicyRule",
            "io.k8s.api.rbac.v1.AggregationRule",
        ] {
            assert!(schemas.get(def).is_some(), "{def}");
        }

        // The reviews are created and nothing else: one POST each, no list, no item path.
        let authz = v3_document("apis/authorization.k8s.io/v1").expect("authorization");
        let paths = authz["paths"].as_object().expect("paths");
        for (path, id) in [
            (
                "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                "createAuthorizationV1SubjectAccessReview",
            ),
            (
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                "createAuthorizationV1SelfSubjectAccessReview",
            ),
            (
                "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
                "createAuthorizationV1SelfSubjectRulesReview",
            ),
            (
                "/apis/authorization.k8s.io/v1/namespaces/{namespace}/localsubjectaccessreviews",
                "createAuthorizationV1NamespacedLocalSubjectAccessReview",
            ),
        ] {
            let item = paths.get(path).unwrap_or_else(|| panic!("{path}"));
            assert_eq!(item["post"]["operationId"], id);
            for method in ["get", "put", "patch", "delete"] {
                assert!(item.get(method).is_none(), "{path} {method}");
            }
        }
        assert!(paths.keys().all(|p| !p.ends_with("{name}")), "no item paths");
        assert!(
            authz["components"]["schemas"]
                .get("io.k8s.api.authorization.v1.SubjectAccessReviewList")
                .is_none()
        );
        let authn = v3_document("apis/authentication.k8s.io/v1").expect("authentication");
        for (path, id) in [
            (
                "/apis/authentication.k8s.io/v1/tokenreviews",
                "createAuthenticationV1TokenReview",
            ),
            (
                "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                "createAuthenticationV1SelfSubjectReview",
            ),
        ] {
            assert_eq!(authn["paths"][path]["post"]["operationId"], id);
        }
        assert!(
            authn["components"]["schemas"]
                .get("io.k8s.api.authentication.v1.TokenReview")
                .is_some()
        );
    }

    #[test]
    fn every_reference_resolves_inside_its_document() {
        for path in docs().keys() {
            let doc = v3_document(path).expect("doc");
            let mut refs = Vec::new();
            collect_refs(&doc, &mut refs);
            let schemas = doc["components"]["schemas"].as_object().expect("schemas");
            for r in refs {
                assert!(schemas.contains_key(&r), "{path}: dangling reference {r}");
            }
        }
    }

    #[test]
    fn patch_operations_carry_field_validation() {
        for r in RESOURCES.iter().filter(|r| discovery::verbs(r).contains(&"patch")) {
            let doc = doc_of(r);
            let patches = ops(&doc, "patch", discovery::response_kind(r));
            assert!(!patches.is_empty(), "{} has no patch", r.kind);
            for (path, op) in patches {
                assert!(param_names(op).contains(&"fieldValidation"), "{path}");
                assert!(
                    op["requestBody"]["content"]
                        .get("application/strategic-merge-patch+json")
                        .is_some(),
                    "{path}"
                );
                assert_eq!(op[ACTION_EXT], "patch");
            }
        }
        let pods = v3_document("api/v1").expect("core");
        let op = &pods["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]["patch"];
        assert_eq!(op["operationId"], "patchCoreV1NamespacedPod");
        assert_eq!(
            param_names(op),
            vec!["dryRun", "fieldManager", "fieldValidation", "force"]
        );
        assert_eq!(op[GVK_EXT], json!({"group": "", "kind": "Pod", "version": "v1"}));
    }

    #[test]
    fn paths_follow_upstream_layout() {
        let core = v3_document("api/v1").expect("core");
        let paths = core["paths"].as_object().expect("paths");
        let list = &paths["/api/v1/namespaces/{namespace}/pods"];
        assert_eq!(list["get"]["operationId"], "listCoreV1NamespacedPod");
        assert_eq!(list["get"][ACTION_EXT], "list");
        assert_eq!(list["post"][ACTION_EXT], "post");
        assert_eq!(list["delete"][ACTION_EXT], "deletecollection");
        assert_eq!(
            list["get"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/io.k8s.api.core.v1.PodList"
        );
        assert_eq!(
            paths["/api/v1/pods"]["get"]["operationId"],
            "listCoreV1PodForAllNamespaces"
        );
        assert_eq!(
            paths["/api/v1/watch/namespaces/{namespace}/pods/{name}"]["get"][ACTION_EXT],
            "watch"
        );
        assert_eq!(paths["/api/v1/watch/pods"]["get"][ACTION_EXT], "watchlist");
        assert_eq!(paths["/api/v1/nodes/{name}"]["get"]["operationId"], "readCoreV1Node");
        assert!(paths.get("/api/v1/namespaces/{namespace}/nodes").is_none());
        // Namespaces have no deletecollection; bindings are create-only.
        assert!(paths["/api/v1/namespaces"].get("delete").is_none());
        let bindings = &paths["/api/v1/namespaces/{namespace}/bindings"];
        assert!(bindings.get("post").is_some() && bindings.get("get").is_none());
        let eviction = &paths["/api/v1/namespaces/{namespace}/pods/{name}/eviction"]["post"];
        assert_eq!(
            eviction[GVK_EXT],
            json!({"group": "policy", "kind": "Eviction", "version": "v1"})
        );
        assert!(core["components"]["schemas"]["io.k8s.api.policy.v1.Eviction"][GVK_EXT].is_array());
        let exec = &paths["/api/v1/namespaces/{namespace}/pods/{name}/exec"];
        assert_eq!(exec["get"][ACTION_EXT], "connect");
        assert!(param_names(&exec["post"]).contains(&"command"));
        let log = &paths["/api/v1/namespaces/{namespace}/pods/{name}/log"]["get"];
        assert!(param_names(log).contains(&"tailLines"));
        let item_params = param_names(&paths["/api/v1/namespaces/{namespace}/pods/{name}"]);
        assert_eq!(item_params, vec!["name", "namespace", "pretty"]);

        let apps = v3_document("apis/apps/v1").expect("apps");
        let scale = &apps["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale"];
        assert_eq!(
            scale["patch"][GVK_EXT],
            json!({"group": "autoscaling", "kind": "Scale", "version": "v1"})
        );
        assert!(param_names(&scale["patch"]).contains(&"fieldValidation"));
        assert_eq!(scale["get"]["operationId"], "readAppsV1NamespacedDeploymentScale");
        assert!(apps["components"]["schemas"]["io.k8s.api.autoscaling.v1.Scale"][GVK_EXT].is_array());
        assert_eq!(apps["openapi"], "3.0.0");

        let lease = v3_document("apis/coordination.k8s.io/v1").expect("coordination");
        assert_eq!(
            lease["paths"]["/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"]["get"]["tags"],
            json!(["coordination_v1"])
        );
    }

    #[test]
    fn root_kinds_do_not_require_metadata() {
        let core = v3_document("api/v1").expect("core");
        let pod = &core["components"]["schemas"]["io.k8s.api.core.v1.Pod"];
        let required = pod
            .get("required")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        assert!(!required.contains(&json!("metadata")));
        // Definitions that are not roots keep their required lists.
        let container = &core["components"]["schemas"]["io.k8s.api.core.v1.Container"];
        assert!(
            container["required"]
                .as_array()
                .expect("required")
                .contains(&json!("name"))
        );
    }

    #[test]
    fn status_and_delete_options_are_documented() {
        let core = v3_document("api/v1").expect("core");
        let schemas = &core["components"]["schemas"];
        assert_eq!(
            schemas[format!("{META}.Status")][GVK_EXT],
            json!([{"group": "", "kind": "Status", "version": "v1"}])
        );
        let del = schemas[format!("{META}.DeleteOptions")][GVK_EXT]
            .as_array()
            .expect("list");
        assert!(del.contains(&json!({"group": "apps", "kind": "DeleteOptions", "version": "v1"})));
        assert!(schemas[format!("{META}.WatchEvent")].is_object());
    }

    #[test]
    fn names() {
        assert_eq!(group_camel(""), "Core");
        assert_eq!(group_camel("coordination.k8s.io"), "Coordination");
        assert_eq!(group_camel("rbac.authorization.k8s.io"), "RbacAuthorization");
        assert_eq!(tag("rbac.authorization.k8s.io", "v1"), "rbacAuthorization_v1");
        assert_eq!(tag("", "v1"), "core_v1");
    }
}
