//! Discovery documents: the legacy `/api`, `/apis`, `/api/v1`, `/apis/G/V` answers, the
//! aggregated `apidiscovery.k8s.io/v2` lists and `/version`, all built from
//! [`skiff_api::registry::RESOURCES`]. Pure functions: the handlers set content types.

use base64::Engine as _;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use skiff_api::Resource;
use skiff_api::registry;

/// Content type of an aggregated discovery answer (`APIGroupDiscoveryList`).
pub const AGGREGATED_CONTENT_TYPE: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// The `apiVersion` of aggregated discovery documents.
pub const AGGREGATED_API_VERSION: &str = "apidiscovery.k8s.io/v2";

/// The Kubernetes release this server speaks (kubectl picks its own minor from it).
pub const KUBERNETES_MAJOR: &str = "1";
pub const KUBERNETES_MINOR: &str = "33";
pub const GIT_VERSION: &str = "v1.33.0+skiff";

/// Every verb of a fully served resource, in upstream's (sorted) order.
const ALL_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// Namespaces have no deletecollection upstream.
const NAMESPACE_VERBS: &[&str] = &["create", "delete", "get", "list", "patch", "update", "watch"];

const CREATE_ONLY: &[&str] = &["create"];

/// A group/version/kind as discovery writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gvk {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
}

impl Gvk {
    fn to_value(self) -> Value {
        json!({"group": self.group, "version": self.version, "kind": self.kind})
    }
}

/// One subresource as discovery lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subresource {
    /// "status", "scale", ...
    pub name: &'static str,
    /// The kind the subresource answers with.
    pub response_kind: Gvk,
    pub verbs: &'static [&'static str],
}

/// The verbs of a resource, as upstream serves them: bindings and the access and token
/// reviews only take creates.
pub fn verbs(r: &Resource) -> &'static [&'static str] {
    if r.is_create_only() {
        return CREATE_ONLY;
    }
    if r.is_computed() {
        return &["get", "list"];
    }
    match (r.group, r.plural) {
        ("", "namespaces") => NAMESPACE_VERBS,
        _ => ALL_VERBS,
    }
}

/// The kind a resource's objects have.
pub fn response_kind(r: &Resource) -> Gvk {
    Gvk {
        group: r.group,
        version: r.version,
        kind: r.kind,
    }
}

/// The subresource `sub` of `r` with its response kind and verbs, as upstream documents it;
/// `None` for a name this server does not know.
pub fn subresource(r: &Resource, sub: &'static str) -> Option<Subresource> {
    let own = response_kind(r);
    let core = |kind: &'static str| Gvk {
        group: "",
        version: "v1",
        kind,
    };
    let (response_kind, verbs): (Gvk, &'static [&'static str]) = match sub {
        "status" | "approval" => (own, &["get", "patch", "update"]),
        "scale" => (
            Gvk {
                group: "autoscaling",
                version: "v1",
                kind: "Scale",
            },
            &["get", "patch", "update"],
        ),
        "binding" => (core("Binding"), CREATE_ONLY),
        "eviction" => (
            Gvk {
                group: "policy",
                version: "v1",
                kind: "Eviction",
            },
            CREATE_ONLY,
        ),
        "log" => (own, &["get"]),
        "exec" => (core("PodExecOptions"), &["create", "get"]),
        "attach" => (core("PodAttachOptions"), &["create", "get"]),
        "portforward" => (core("PodPortForwardOptions"), &["create", "get"]),
        "proxy" => (
            core(match r.kind {
                "Node" => "NodeProxyOptions",
                "Service" => "ServiceProxyOptions",
                _ => "PodProxyOptions",
            }),
            &["create", "delete", "get", "patch", "update"],
        ),
        "ephemeralcontainers" | "resize" => (own, &["get", "patch", "update"]),
        "finalize" => (own, &["update"]),
        "token" => (
            Gvk {
                group: "authentication.k8s.io",
                version: "v1",
                kind: "TokenRequest",
            },
            CREATE_ONLY,
        ),
        _ => return None,
    };
    Some(Subresource {
        name: sub,
        response_kind,
        verbs,
    })
}

/// Every subresource of `r` that discovery lists, sorted by name as upstream lists them.
pub fn subresources(r: &Resource) -> Vec<Subresource> {
    let mut out: Vec<Subresource> = r.subresources.iter().filter_map(|s| subresource(r, s)).collect();
    out.sort_by(|a, b| a.name.cmp(b.name));
    out
}

/// Upstream's storage version hash: the first 8 bytes of sha256("group/version/kind"), base64.
pub fn storage_version_hash(group: &str, version: &str, kind: &str) -> String {
    let digest = Sha256::digest(format!("{group}/{version}/{kind}").as_bytes());
    base64::engine::general_purpose::STANDARD.encode(&digest[..8])
}

/// The served versions of a group ("" is the core group), in preference order.
fn versions_of(group: &str) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for r in registry::all().into_iter().filter(|r| r.group == group) {
        if !out.contains(&r.version) {
            out.push(r.version);
        }
    }
    out
}

/// Resources of one group-version, sorted by plural as upstream sorts them.
fn resources_of(group: &str, version: &str) -> Vec<&'static Resource> {
    let mut out: Vec<&'static Resource> = registry::all()
        .into_iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    out.sort_by(|a, b| a.plural.cmp(b.plural));
    out
}

fn strings(items: &[&str]) -> Value {
    Value::Array(items.iter().map(|s| Value::String((*s).to_string())).collect())
}

fn group_version(group: &str, version: &str) -> String {
    if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    }
}

/// `GET /api`: the legacy `APIVersions` of the core group.
pub fn api_versions() -> Value {
    api_versions_at("")
}

/// `GET /api` naming the address clients should use (`host:port`; empty when unknown).
pub fn api_versions_at(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": strings(&versions_of("")),
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    })
}

fn api_group(group: &str) -> Value {
    let versions: Vec<Value> = versions_of(group)
        .into_iter()
        .map(|v| json!({"groupVersion": group_version(group, v), "version": v}))
        .collect();
    let preferred = versions.first().cloned().unwrap_or(Value::Null);
    json!({
        "name": group,
        "versions": versions,
        "preferredVersion": preferred,
    })
}

/// `GET /apis`: the legacy `APIGroupList` of every named group.
pub fn api_group_list() -> Value {
    let groups: Vec<Value> = registry::groups().into_iter().map(api_group).collect();
    json!({
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": groups,
    })
}

/// `GET /apis/G`: the legacy `APIGroup` of one named group; `None` if not served.
pub fn api_group_doc(group: &str) -> Option<Value> {
    if group.is_empty() || !registry::groups().contains(&group) {
        return None;
    }
    let mut g = api_group(group);
    if let Some(m) = g.as_object_mut() {
        m.insert("kind".into(), json!("APIGroup"));
        m.insert("apiVersion".into(), json!("v1"));
    }
    Some(g)
}

/// One legacy `APIResource` entry for a resource.
fn legacy_resource(r: &Resource) -> Value {
    let mut m = Map::new();
    m.insert("name".into(), json!(r.plural));
    m.insert("singularName".into(), json!(r.singular));
    m.insert("namespaced".into(), json!(r.namespaced));
    m.insert("kind".into(), json!(r.kind));
    m.insert("verbs".into(), strings(verbs(r)));
    if !r.short_names.is_empty() {
        m.insert("shortNames".into(), strings(r.short_names));
    }
    if !r.categories.is_empty() {
        m.insert("categories".into(), strings(r.categories));
    }
    // Upstream hashes the storage version of stored resources only.
    if !r.is_create_only() {
        m.insert(
            "storageVersionHash".into(),
            json!(storage_version_hash(r.group, r.version, r.kind)),
        );
    }
    Value::Object(m)
}

/// One legacy `APIResource` entry for a subresource (`pods/status`); group and version only
/// when they differ from the parent's, as upstream writes them.
fn legacy_subresource(r: &Resource, s: &Subresource) -> Value {
    let mut m = Map::new();
    m.insert("name".into(), json!(format!("{}/{}", r.plural, s.name)));
    m.insert("singularName".into(), json!(""));
    m.insert("namespaced".into(), json!(r.namespaced));
    if s.response_kind.group != r.group || s.response_kind.version != r.version {
        m.insert("group".into(), json!(s.response_kind.group));
        m.insert("version".into(), json!(s.response_kind.version));
    }
    m.insert("kind".into(), json!(s.response_kind.kind));
    m.insert("verbs".into(), strings(s.verbs));
    Value::Object(m)
}

/// `GET /api/v1` or `/apis/G/V`: the legacy `APIResourceList`; `None` if not served.
pub fn api_resource_list(group: &str, version: &str) -> Option<Value> {
    let resources = resources_of(group, version);
    if resources.is_empty() {
        return None;
    }
    let mut entries = Vec::new();
    for r in resources {
        entries.push(legacy_resource(r));
        for s in subresources(r) {
            entries.push(legacy_subresource(r, &s));
        }
    }
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version(group, version),
        "resources": entries,
    }))
}

/// One `APIResourceDiscovery`.
fn aggregated_resource(r: &Resource) -> Value {
    let mut m = Map::new();
    m.insert("resource".into(), json!(r.plural));
    m.insert("responseKind".into(), response_kind(r).to_value());
    m.insert(
        "scope".into(),
        json!(if r.namespaced { "Namespaced" } else { "Cluster" }),
    );
    m.insert("singularResource".into(), json!(r.singular));
    m.insert("verbs".into(), strings(verbs(r)));
    if !r.short_names.is_empty() {
        m.insert("shortNames".into(), strings(r.short_names));
    }
    if !r.categories.is_empty() {
        m.insert("categories".into(), strings(r.categories));
    }
    let subs: Vec<Value> = subresources(r)
        .iter()
        .map(|s| {
            json!({
                "subresource": s.name,
                "responseKind": s.response_kind.to_value(),
                "verbs": strings(s.verbs),
            })
        })
        .collect();
    if !subs.is_empty() {
        m.insert("subresources".into(), Value::Array(subs));
    }
    Value::Object(m)
}

/// One `APIGroupDiscovery` (the core group has no name).
fn aggregated_group(group: &str) -> Value {
    let versions: Vec<Value> = versions_of(group)
        .into_iter()
        .map(|v| {
            let resources: Vec<Value> = resources_of(group, v).into_iter().map(aggregated_resource).collect();
            json!({"version": v, "resources": resources, "freshness": "Current"})
        })
        .collect();
    let metadata = if group.is_empty() {
        json!({})
    } else {
        json!({"name": group})
    };
    json!({"metadata": metadata, "versions": versions})
}

/// The aggregated `APIGroupDiscoveryList` for `/api` (`core`) or `/apis`.
pub fn aggregated_discovery(core: bool) -> Value {
    let items: Vec<Value> = if core {
        vec![aggregated_group("")]
    } else {
        registry::groups().into_iter().map(aggregated_group).collect()
    };
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": AGGREGATED_API_VERSION,
        "metadata": {},
        "items": items,
    })
}

/// Go's name for the platform this binary runs on ("linux/amd64").
fn platform() -> String {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    };
    format!("{}/{}", std::env::consts::OS, arch)
}

/// `GET /version`.
pub fn version_info() -> Value {
    json!({
        "major": KUBERNETES_MAJOR,
        "minor": KUBERNETES_MINOR,
        "emulationMajor": KUBERNETES_MAJOR,
        "emulationMinor": KUBERNETES_MINOR,
        "minCompatibilityMajor": KUBERNETES_MAJOR,
        "minCompatibilityMinor": "32",
        "gitVersion": GIT_VERSION,
        "gitCommit": option_env!("SKIFF_GIT_COMMIT").unwrap_or("unknown"),
        "gitTreeState": option_env!("SKIFF_GIT_TREE_STATE").unwrap_or(""),
        "buildDate": option_env!("SKIFF_BUILD_DATE").unwrap_or("1970-01-01T00:00:00Z"),
        "goVersion": concat!("skiff-", env!("CARGO_PKG_VERSION")),
        "compiler": "rustc",
        "platform": platform(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_api::registry::RESOURCES;

    fn names(list: &Value) -> Vec<String> {
        list["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .map(|r| r["name"].as_str().expect("name").to_string())
            .collect()
    }

    fn entry<'a>(list: &'a Value, name: &str) -> &'a Value {
        list["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("{name} missing"))
    }

    fn verb_list(v: &Value) -> Vec<&str> {
        v["verbs"]
            .as_array()
            .expect("verbs")
            .iter()
            .map(|s| s.as_str().expect("verb"))
            .collect()
    }

    #[test]
    fn every_resource_in_legacy_discovery() {
        for r in RESOURCES {
            let list = api_resource_list(r.group, r.version).expect("group version served");
            assert_eq!(list["groupVersion"], r.api_version());
            let e = entry(&list, r.plural);
            assert_eq!(e["kind"], r.kind);
            assert_eq!(e["singularName"], r.singular);
            assert_eq!(e["namespaced"], r.namespaced, "{}", r.plural);
            assert_eq!(verb_list(e), verbs(r).to_vec());
            if r.is_create_only() {
                assert!(e.get("storageVersionHash").is_none(), "{}", r.plural);
            } else {
                let hash = e["storageVersionHash"].as_str().expect("hash");
                assert_eq!(hash.len(), 12);
                assert_eq!(hash, storage_version_hash(r.group, r.version, r.kind));
            }
            for s in r.subresources {
                let sub = entry(&list, &format!("{}/{}", r.plural, s));
                assert_eq!(sub["namespaced"], r.namespaced);
                assert!(!verb_list(sub).is_empty());
            }
        }
        assert!(api_resource_list("apps", "v2").is_none());
        assert!(api_resource_list("nope", "v1").is_none());
    }

    #[test]
    fn legacy_entries_match_upstream() {
        let core = api_resource_list("", "v1").expect("core");
        let n = names(&core);
        let mut sorted = n.clone();
        sorted.sort();
        assert_eq!(n, sorted, "resources are sorted by name");

        assert_eq!(verb_list(entry(&core, "bindings")), vec!["create"]);
        assert!(!verb_list(entry(&core, "namespaces")).contains(&"deletecollection"));
        assert_eq!(verb_list(entry(&core, "pods")), ALL_VERBS.to_vec());
        assert_eq!(entry(&core, "pods")["shortNames"], json!(["po"]));
        assert_eq!(entry(&core, "pods")["categories"], json!(["all"]));
        assert!(entry(&core, "secrets").get("shortNames").is_none());

        let eviction = entry(&core, "pods/eviction");
        assert_eq!(eviction["group"], "policy");
        assert_eq!(eviction["version"], "v1");
        assert_eq!(eviction["kind"], "Eviction");
        assert_eq!(verb_list(eviction), vec!["create"]);

        let binding = entry(&core, "pods/binding");
        assert_eq!(binding["kind"], "Binding");
        assert!(binding.get("group").is_none());
        assert_eq!(verb_list(binding), vec!["create"]);

        let log = entry(&core, "pods/log");
        assert_eq!(log["kind"], "Pod");
        assert_eq!(verb_list(log), vec!["get"]);

        let exec = entry(&core, "pods/exec");
        assert_eq!(exec["kind"], "PodExecOptions");
        assert_eq!(verb_list(exec), vec!["create", "get"]);

        let status = entry(&core, "pods/status");
        assert_eq!(status["kind"], "Pod");
        assert_eq!(status["singularName"], "");
        assert_eq!(verb_list(status), vec!["get", "patch", "update"]);

        assert_eq!(entry(&core, "nodes/proxy")["kind"], "NodeProxyOptions");
        assert_eq!(verb_list(entry(&core, "namespaces/finalize")), vec!["update"]);
        assert_eq!(entry(&core, "nodes")["namespaced"], false);

        let apps = api_resource_list("apps", "v1").expect("apps");
        let scale = entry(&apps, "deployments/scale");
        assert_eq!(scale["group"], "autoscaling");
        assert_eq!(scale["version"], "v1");
        assert_eq!(scale["kind"], "Scale");
        assert_eq!(verb_list(scale), vec!["get", "patch", "update"]);
        assert_eq!(entry(&apps, "deployments")["shortNames"], json!(["deploy"]));
    }

    #[test]
    fn rbac_and_review_groups_as_upstream() {
        let rbac = api_resource_list("rbac.authorization.k8s.io", "v1").expect("rbac");
        assert_eq!(
            names(&rbac),
            ["clusterrolebindings", "clusterroles", "rolebindings", "roles"]
        );
        for (name, kind, namespaced) in [
            ("clusterrolebindings", "ClusterRoleBinding", false),
            ("clusterroles", "ClusterRole", false),
            ("rolebindings", "RoleBinding", true),
            ("roles", "Role", true),
        ] {
            let e = entry(&rbac, name);
            assert_eq!(e["kind"], kind);
            assert_eq!(e["namespaced"], namespaced);
            assert_eq!(verb_list(e), ALL_VERBS.to_vec());
            assert!(e.get("shortNames").is_none() && e.get("categories").is_none());
            assert_eq!(
                e["storageVersionHash"],
                storage_version_hash("rbac.authorization.k8s.io", "v1", kind)
            );
        }

        let authz = api_resource_list("authorization.k8s.io", "v1").expect("authorization");
        assert_eq!(
            names(&authz),
            [
                "localsubjectaccessreviews",
                "selfsubjectaccessreviews",
                "selfsubjectrulesreviews",
                "subjectaccessreviews"
            ]
        );
        assert_eq!(entry(&authz, "localsubjectaccessreviews")["namespaced"], true);
        let authn = api_resource_list("authentication.k8s.io", "v1").expect("authentication");
        assert_eq!(names(&authn), ["selfsubjectreviews", "tokenreviews"]);
        for list in [&authz, &authn] {
            for e in list["resources"].as_array().expect("resources") {
                assert_eq!(verb_list(e), vec!["create"], "{}", e["name"]);
                // Nothing is stored, so there is no storage version to hash.
                assert!(e.get("storageVersionHash").is_none(), "{}", e["name"]);
            }
        }
        let core = api_resource_list("", "v1").expect("core");
        assert!(entry(&core, "bindings").get("storageVersionHash").is_none());

        // /apis and the aggregated document list groups in upstream's priority order, each
        // preferring its only version.
        let legacy: Vec<Value> = api_group_list()["groups"].as_array().expect("groups").clone();
        let order: Vec<&str> = legacy.iter().map(|g| g["name"].as_str().expect("name")).collect();
        assert_eq!(order, registry::groups());
        let pos = |g: &str| order.iter().position(|x| *x == g).expect(g);
        assert!(pos("apps") < pos("events.k8s.io"));
        assert!(pos("events.k8s.io") < pos("authentication.k8s.io"));
        assert!(pos("authentication.k8s.io") < pos("authorization.k8s.io"));
        assert!(pos("authorization.k8s.io") < pos("batch"));
        assert!(pos("policy") < pos("rbac.authorization.k8s.io"));
        assert!(pos("rbac.authorization.k8s.io") < pos("storage.k8s.io"));
        let rbac_group = api_group_doc("rbac.authorization.k8s.io").expect("rbac group");
        assert_eq!(
            rbac_group["preferredVersion"],
            json!({"groupVersion": "rbac.authorization.k8s.io/v1", "version": "v1"})
        );
        let aggregated = aggregated_discovery(false);
        let agg_order: Vec<&str> = aggregated["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|g| g["metadata"]["name"].as_str().expect("name"))
            .collect();
        assert_eq!(agg_order, order);
        let sar = aggregated["items"]
            .as_array()
            .expect("items")
            .iter()
            .find(|g| g["metadata"]["name"] == "authorization.k8s.io")
            .and_then(|g| g["versions"][0]["resources"].as_array())
            .and_then(|rs| rs.iter().find(|r| r["resource"] == "subjectaccessreviews"))
            .expect("subjectaccessreviews");
        assert_eq!(sar["verbs"], json!(["create"]));
        assert_eq!(sar["scope"], "Cluster");
        assert_eq!(
            sar["responseKind"],
            json!({"group": "authorization.k8s.io", "version": "v1", "kind": "SubjectAccessReview"})
        );
    }

    #[test]
    fn storage_version_hash_is_upstreams() {
        // Upstream's value for core v1 pods.
        assert_eq!(storage_version_hash("", "v1", "Pod"), "xPOwRZ+Yhw8=");
        assert_eq!(storage_version_hash("apps", "v1", "Deployment"), "8aSe+NMegvE=");
    }

    #[test]
    fn api_versions_and_groups() {
        let v = api_versions();
        assert_eq!(v["kind"], "APIVersions");
        assert_eq!(v["versions"], json!(["v1"]));
        assert_eq!(v["serverAddressByClientCIDRs"][0]["clientCIDR"], "0.0.0.0/0");
        assert_eq!(
            api_versions_at("10.0.0.1:6443")["serverAddressByClientCIDRs"][0]["serverAddress"],
            "10.0.0.1:6443"
        );

        let g = api_group_list();
        assert_eq!(g["kind"], "APIGroupList");
        let groups = g["groups"].as_array().expect("groups");
        assert_eq!(groups.len(), registry::groups().len());
        let apps = groups.iter().find(|x| x["name"] == "apps").expect("apps");
        assert_eq!(apps["versions"], json!([{"groupVersion": "apps/v1", "version": "v1"}]));
        assert_eq!(
            apps["preferredVersion"],
            json!({"groupVersion": "apps/v1", "version": "v1"})
        );
        assert!(groups.iter().all(|x| x["name"] != ""));

        let batch = api_group_doc("batch").expect("batch");
        assert_eq!(batch["kind"], "APIGroup");
        assert!(api_group_doc("").is_none());
        assert!(api_group_doc("nope").is_none());
    }

    #[test]
    fn aggregated_documents() {
        let core = aggregated_discovery(true);
        assert_eq!(core["kind"], "APIGroupDiscoveryList");
        assert_eq!(core["apiVersion"], "apidiscovery.k8s.io/v2");
        let items = core["items"].as_array().expect("items");
        assert_eq!(items.len(), 1);
        assert!(items[0]["metadata"].get("name").is_none());
        let v1 = &items[0]["versions"][0];
        assert_eq!(v1["version"], "v1");
        assert_eq!(v1["freshness"], "Current");
        let pods = v1["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .find(|r| r["resource"] == "pods")
            .expect("pods");
        assert_eq!(
            pods["responseKind"],
            json!({"group": "", "version": "v1", "kind": "Pod"})
        );
        assert_eq!(pods["scope"], "Namespaced");
        assert_eq!(pods["singularResource"], "pod");
        assert_eq!(pods["shortNames"], json!(["po"]));
        assert_eq!(pods["categories"], json!(["all"]));
        let eviction = pods["subresources"]
            .as_array()
            .expect("subresources")
            .iter()
            .find(|s| s["subresource"] == "eviction")
            .expect("eviction");
        assert_eq!(
            eviction["responseKind"],
            json!({"group": "policy", "version": "v1", "kind": "Eviction"})
        );
        assert_eq!(eviction["verbs"], json!(["create"]));

        let named = aggregated_discovery(false);
        let groups = named["items"].as_array().expect("items");
        assert_eq!(groups.len(), registry::groups().len());
        // Every served resource appears once, with its scope and verbs.
        for r in RESOURCES {
            let doc = if r.group.is_empty() { &core } else { &named };
            let group = doc["items"]
                .as_array()
                .expect("items")
                .iter()
                .find(|g| g["metadata"]["name"].as_str().unwrap_or("") == r.group)
                .expect("group");
            let version = group["versions"]
                .as_array()
                .expect("versions")
                .iter()
                .find(|v| v["version"] == r.version)
                .expect("version");
            let res = version["resources"]
                .as_array()
                .expect("resources")
                .iter()
                .find(|x| x["resource"] == r.plural)
                .unwrap_or_else(|| panic!("{} missing", r.plural));
            let scope = if r.namespaced { "Namespaced" } else { "Cluster" };
            assert_eq!(res["scope"], scope);
            assert_eq!(verb_list(res), verbs(r).to_vec());
            assert_eq!(res["responseKind"]["kind"], r.kind);
            let subs = res.get("subresources").and_then(Value::as_array).map_or(0, Vec::len);
            assert_eq!(subs, r.subresources.len(), "{}", r.plural);
        }
        let scale = groups
            .iter()
            .find(|g| g["metadata"]["name"] == "apps")
            .and_then(|g| g["versions"][0]["resources"].as_array())
            .and_then(|rs| rs.iter().find(|r| r["resource"] == "deployments"))
            .and_then(|d| d["subresources"].as_array())
            .and_then(|s| s.iter().find(|x| x["subresource"] == "scale"))
            .expect("deployments/scale");
        assert_eq!(
            scale["responseKind"],
            json!({"group": "autoscaling", "version": "v1", "kind": "Scale"})
        );
        assert_eq!(scale["verbs"], json!(["get", "patch", "update"]));
    }

    #[test]
    fn version_picks_kubectl_1_33() {
        let v = version_info();
        assert_eq!(v["major"], "1");
        assert_eq!(v["minor"], "33");
        let git = v["gitVersion"].as_str().expect("gitVersion");
        assert!(git.starts_with("v1.33."));
        assert!(v["platform"].as_str().expect("platform").contains('/'));
        for k in ["gitCommit", "buildDate", "goVersion", "compiler"] {
            assert!(v[k].is_string(), "{k}");
        }
        // Stamped by the build script from git: the commit, the tree state and a real date.
        let commit = v["gitCommit"].as_str().expect("gitCommit");
        assert!(
            commit == "unknown" || (commit.len() == 40 && commit.bytes().all(|b| b.is_ascii_hexdigit())),
            "{commit}"
        );
        if commit != "unknown" {
            assert!(matches!(v["gitTreeState"].as_str(), Some("clean" | "dirty")));
            let date: jiff::Timestamp = v["buildDate"].as_str().expect("buildDate").parse().expect("a date");
            assert!(date > "2026-01-01T00:00:00Z".parse().expect("a date"), "{date}");
        }
    }
}
