//! What a request asks for, read once off its method, path and query (upstream's
//! `RequestInfoFactory`). The one [`RequestInfo`] a request gets drives routing, authorization,
//! admission, audit, flow control and metrics: nothing else reads the path, so no two of them
//! can read the same path two ways (`/api/v1/namespaces//secrets` was authorized as the
//! namespace `secrets` and served as every Secret of the cluster).
//!
//! As upstream: the path is percent-decoded once (Go's `URL.Path`), leading and trailing
//! slashes are trimmed and the rest split on `/`, empty segments kept (so `namespaces//secrets`
//! is the namespace `""`, that is the cluster scope); `/api/VERSION/...` and
//! `/apis/GROUP/VERSION/...` are resource requests, everything else a non-resource request whose
//! verb is the lower-case method. What is authorized is then exactly what is routed: a route the
//! parse cannot serve answers 404, 405 or 400, never another object.

use http::Method;
use skiff_api::StatusError;
use skiff_api::registry::{self, Resource};
use skiff_rbac::Attributes;

use crate::handlers::Params;

/// Subresources of a namespace (`/api/v1/namespaces/NAME/SUB`), not resources inside it.
const NAMESPACE_SUBRESOURCES: &[&str] = &["status", "finalize"];

/// Verbs a path may carry before the resource (`/api/v1/watch/...`).
const SPECIAL_VERBS: &[&str] = &["proxy", "watch"];

/// A request read off its method, path and query (upstream's `RequestInfo`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestInfo {
    /// The path, percent-decoded: what non-resource rules match and what is routed.
    pub path: String,
    /// Whether the path is under `/api/VERSION` or `/apis/GROUP/VERSION` with a resource.
    pub resource_request: bool,
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`, or a
    /// verb the path carried (`watch`, `proxy`); the lower-case method for non-resource paths.
    pub verb: String,
    pub api_group: String,
    pub api_version: String,
    /// The namespace the path names (empty for the cluster scope, and for `namespaces//...`).
    pub namespace: String,
    pub resource: String,
    pub name: String,
    pub subresource: String,
    /// The segments from the resource on: `RESOURCE/NAME/SUBRESOURCE/...` (a proxy's path).
    pub parts: Vec<String>,
    /// The field selector of a list or watch, as given (the Node authorizer reads it).
    pub field_selector: String,
    /// The request's method.
    method: Method,
    /// `api` or `apis`, for resource requests.
    api_prefix: String,
    /// The verb came from the path (`/watch/...`), not from the method.
    verb_in_path: bool,
    /// `namespaces/NS/` was consumed before the resource.
    namespace_prefix: bool,
    /// The name came from a `metadata.name` field selector, not from the path.
    name_from_selector: bool,
    /// The path carried a verb and nothing after it (upstream cannot tell the resource).
    incomplete: bool,
}

/// A request for a resource (as opposed to discovery, OpenAPI or health).
#[derive(Clone, Debug)]
pub struct ResourceRequest {
    pub resource: &'static Resource,
    /// The namespace of the URL (empty for cluster-scoped, and for lists across namespaces).
    pub namespace: String,
    /// The object name (empty for collections).
    pub name: String,
    /// Subresource ("status", "scale", "binding", ...), empty for the main resource.
    pub subresource: String,
    /// A watch: the verb the request was authorized with is `watch` (the `/watch/` path, or a
    /// list with `?watch=true`).
    pub watch: bool,
    /// What follows `proxy/` in a node's proxy path (`/` when nothing does), decoded.
    pub proxy_path: String,
}

/// Where a path leads.
#[derive(Clone, Debug)]
pub enum Route {
    Version,
    /// `/metrics`: the process's metrics in the Prometheus text format.
    Metrics,
    Health(&'static str),
    /// `/api` (legacy core discovery).
    CoreDiscovery,
    /// `/apis`.
    GroupsDiscovery,
    /// `/apis/GROUP`.
    Group(String),
    /// `/api/v1` or `/apis/GROUP/VERSION`.
    GroupVersion(String, String),
    OpenApiIndex,
    /// `/openapi/v2`: the whole API as one Swagger 2.0 document.
    OpenApiV2,
    OpenApiDocument(String),
    /// `/skiff/secrets-encrypt/OP` (Skiff's own, as k3s's `secrets-encrypt`).
    SecretsEncrypt(String),
    Resource(ResourceRequest),
    /// A path under a known group-version whose resource does not exist.
    UnknownResource(String),
    /// A resource path that no handler serves with this method (a write to a `/watch/` path).
    MethodNotAllowed,
    /// A resource path that names its object badly (an empty namespace, a name `..`).
    Invalid(StatusError),
    NotFound,
}

/// A boolean query parameter's truth, as upstream's parameter codec reads it.
pub fn is_true(v: &str) -> bool {
    matches!(v, "1" | "t" | "T" | "true" | "TRUE" | "True")
}

/// The value a field selector requires `field` to equal (`field=x` or `field==x`).
pub fn field_value<'a>(selector: &'a str, field: &str) -> Option<&'a str> {
    selector.split(',').find_map(|term| {
        let v = term.trim().strip_prefix(field)?;
        v.strip_prefix("==").or_else(|| v.strip_prefix('='))
    })
}

/// Why `name` cannot be one segment of a path (upstream's `IsValidPathSegmentName`).
pub fn invalid_path_segment(name: &str) -> Vec<String> {
    let mut why = Vec::new();
    if name == "." || name == ".." {
        why.push(format!("may not be '{name}'"));
    }
    for c in ["/", "%"] {
        if name.contains(c) {
            why.push(format!("may not contain '{c}'"));
        }
    }
    why
}

/// The path with its percent-escapes decoded, as Go's `url.PathUnescape` (a bad escape, or
/// bytes that are no UTF-8, is a 400: Go's server refuses such a request line).
fn decode_path(raw: &str) -> Result<String, StatusError> {
    if !raw.contains('%') {
        return Ok(raw.to_string());
    }
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
            let Some(byte) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) else {
                return Err(StatusError::bad_request(format!("invalid URL escape in path {raw:?}")));
            };
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| StatusError::bad_request(format!("invalid UTF-8 in path {raw:?}")))
}

/// `path` with what a URI path may not carry percent-encoded (the inverse of [`decode_path`]
/// for a path relayed onward).
pub fn encode_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/!$&'()*+,;=:@".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Reads a request once: `raw_path` as the URI carries it, `params` the decoded query.
pub fn parse(method: &Method, raw_path: &str, params: &Params) -> Result<RequestInfo, StatusError> {
    let path = decode_path(raw_path)?;
    let mut info = RequestInfo {
        verb: method.as_str().to_ascii_lowercase(),
        method: method.clone(),
        ..Default::default()
    };
    let segments: Vec<String> = path.trim_matches('/').split('/').map(str::to_string).collect();
    info.path = path;
    if segments.len() < 3 || !matches!(segments[0].as_str(), "api" | "apis") {
        return Ok(info);
    }
    let mut rest = &segments[1..];
    if segments[0] == "apis" {
        if rest.len() < 3 {
            return Ok(info);
        }
        info.api_group = rest[0].clone();
        rest = &rest[1..];
    }
    info.resource_request = true;
    info.api_prefix = segments[0].clone();
    info.api_version = rest[0].clone();
    rest = &rest[1..];
    if SPECIAL_VERBS.contains(&rest[0].as_str()) {
        info.verb = rest[0].clone();
        info.verb_in_path = true;
        if rest.len() < 2 {
            info.incomplete = true;
            return Ok(info);
        }
        rest = &rest[1..];
    } else {
        info.verb = match *method {
            Method::POST => "create",
            Method::GET | Method::HEAD => "get",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE => "delete",
            _ => "",
        }
        .to_string();
    }
    if rest[0] == "namespaces" && rest.len() > 1 {
        info.namespace = rest[1].clone();
        if rest.len() > 2 && !NAMESPACE_SUBRESOURCES.contains(&rest[2].as_str()) {
            rest = &rest[2..];
            info.namespace_prefix = true;
        }
    }
    info.parts = rest.to_vec();
    if let Some(r) = rest.first() {
        info.resource = r.clone();
    }
    if let Some(n) = rest.get(1) {
        info.name = n.clone();
    }
    if info.verb != "proxy"
        && let Some(s) = rest.get(2)
    {
        info.subresource = s.clone();
    }
    if let Some(f) = params.get("fieldSelector") {
        info.field_selector = f.clone();
    }
    if info.name.is_empty() && info.verb == "get" {
        info.verb = if params.get("watch").is_some_and(|w| is_true(w)) {
            "watch".into()
        } else {
            "list".into()
        };
        // `kubectl get pod NAME -w` lists with `metadata.name=NAME`: authorized as that name.
        if let Some(name) = field_value(&info.field_selector, "metadata.name")
            .filter(|n| !n.is_empty() && invalid_path_segment(n).is_empty())
        {
            info.name = name.to_string();
            info.name_from_selector = true;
        }
    }
    if info.name.is_empty() && info.verb == "delete" {
        info.verb = "deletecollection".into();
    }
    Ok(info)
}

impl RequestInfo {
    /// What the authorizers are asked (upstream's `authorizer.Attributes` of this request).
    pub fn attributes(&self) -> Attributes {
        if !self.resource_request {
            return Attributes::non_resource(&self.verb, &self.path);
        }
        Attributes {
            verb: self.verb.clone(),
            resource_request: true,
            namespace: self.namespace.clone(),
            api_group: self.api_group.clone(),
            api_version: self.api_version.clone(),
            resource: self.resource.clone(),
            subresource: self.subresource.clone(),
            name: self.name.clone(),
            path: self.path.clone(),
            field_selector: self.field_selector.clone(),
        }
    }

    /// A request that holds its connection open (upstream's `BasicLongRunningRequestCheck`:
    /// watches, proxies, and the streaming subresources), plus Skiff's re-encryption.
    pub fn is_long_running(&self) -> bool {
        if matches!(self.verb.as_str(), "watch" | "proxy") {
            return true;
        }
        if self.resource_request {
            return matches!(
                self.subresource.as_str(),
                "attach" | "exec" | "proxy" | "log" | "portforward"
            );
        }
        self.verb == "post" && self.path.starts_with(crate::encryption::API_PATH)
    }

    /// Where the request leads: exactly the object it was authorized for, or no object.
    pub fn route(&self) -> Route {
        if self.resource_request {
            return self.resource_route();
        }
        let trimmed = self.path.trim_end_matches('/');
        match trimmed {
            "/version" => return Route::Version,
            "/readyz" => return Route::Health("readyz"),
            "/livez" => return Route::Health("livez"),
            "/healthz" => return Route::Health("healthz"),
            "/openapi/v2" => return Route::OpenApiV2,
            "/openapi/v3" => return Route::OpenApiIndex,
            _ => {}
        }
        if self.path == "/metrics" {
            return Route::Metrics;
        }
        if ["/readyz/", "/livez/", "/healthz/"]
            .iter()
            .any(|p| trimmed.starts_with(p))
        {
            return Route::Health("check");
        }
        if let Some(rest) = trimmed.strip_prefix("/openapi/v3/") {
            return Route::OpenApiDocument(rest.to_string());
        }
        if let Some(op) = trimmed.strip_prefix(crate::encryption::API_PATH) {
            return Route::SecretsEncrypt(op.to_string());
        }
        let segs: Vec<&str> = self.path.trim_matches('/').split('/').collect();
        match segs.as_slice() {
            ["api"] => Route::CoreDiscovery,
            ["apis"] => Route::GroupsDiscovery,
            ["api", "v1"] => Route::GroupVersion(String::new(), "v1".into()),
            ["apis", g] if !g.is_empty() => Route::Group(g.to_string()),
            ["apis", g, v] if !g.is_empty() && !v.is_empty() => Route::GroupVersion(g.to_string(), v.to_string()),
            _ => Route::NotFound,
        }
    }

    fn resource_route(&self) -> Route {
        if self.incomplete
            || self.resource.is_empty()
            || self.api_version.is_empty()
            || (self.api_prefix == "apis" && self.api_group.is_empty())
        {
            return Route::NotFound;
        }
        // The legacy `/proxy/` paths upstream no longer serves.
        if self.verb == "proxy" {
            return Route::NotFound;
        }
        let Some(r) = registry::lookup(&self.api_group, &self.api_version, &self.resource) else {
            return Route::UnknownResource(self.resource.clone());
        };
        if self.verb_in_path && self.verb == "watch" {
            // Upstream serves `/watch/` paths for collections and objects, with GET alone.
            if !self.subresource.is_empty() {
                return Route::NotFound;
            }
            if self.method != Method::GET {
                return Route::MethodNotAllowed;
            }
        }
        let path_name = if self.name_from_selector {
            ""
        } else {
            self.name.as_str()
        };
        // Beyond RESOURCE/NAME/SUBRESOURCE only a node's proxy carries the agent's path.
        if self.parts.len() > 3 && !(self.subresource == "proxy" && r.has_subresource("proxy")) {
            return Route::NotFound;
        }
        let namespace = if r.namespaced {
            if self.namespace.is_empty() && !path_name.is_empty() {
                // `/namespaces//pods/NAME`, or `/pods/NAME` without a namespace.
                return if self.namespace_prefix {
                    Route::Invalid(StatusError::bad_request("Namespace parameter required."))
                } else {
                    Route::NotFound
                };
            }
            self.namespace.clone()
        } else {
            // A cluster-scoped resource has no path under a namespace (the namespace object's own
            // path names itself: `/namespaces/NAME`).
            if self.namespace_prefix {
                return Route::NotFound;
            }
            String::new()
        };
        if !namespace.is_empty() {
            let why = invalid_path_segment(&namespace);
            if !why.is_empty() {
                return Route::Invalid(StatusError::bad_request(format!(
                    "Namespace parameter invalid: {namespace:?}: {}",
                    why.join(";")
                )));
            }
        }
        if !path_name.is_empty() {
            let why = invalid_path_segment(path_name);
            if !why.is_empty() {
                return Route::Invalid(StatusError::bad_request(format!(
                    "Name parameter invalid: {path_name:?}: {}",
                    why.join(";")
                )));
            }
        }
        let watch = self.verb == "watch";
        let mut proxy_path = String::new();
        if self.subresource == "proxy" {
            proxy_path = format!("/{}", self.parts.get(3..).unwrap_or_default().join("/"));
            if self.parts.len() > 3 && self.path.ends_with('/') {
                proxy_path.push('/');
            }
        }
        Route::Resource(ResourceRequest {
            resource: r,
            namespace,
            name: path_name.to_string(),
            subresource: self.subresource.clone(),
            watch,
            proxy_path,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(method: Method, uri: &str) -> RequestInfo {
        let (path, query) = uri.split_once('?').unwrap_or((uri, ""));
        let params: Params = query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        parse(&method, path, &params).unwrap()
    }

    fn res(path: &str) -> ResourceRequest {
        match info(Method::GET, path).route() {
            Route::Resource(r) => r,
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn routes() {
        let r = res("/api/v1/namespaces/default/pods/web/status");
        assert_eq!(
            (r.resource.plural, r.namespace.as_str(), r.name.as_str()),
            ("pods", "default", "web")
        );
        assert_eq!(r.subresource, "status");
        let r = res("/api/v1/namespaces/kube-system");
        assert_eq!(
            (r.resource.plural, r.name.as_str(), r.namespace.as_str()),
            ("namespaces", "kube-system", "")
        );
        let r = res("/api/v1/namespaces/x/finalize");
        assert_eq!(
            (r.resource.plural, r.name.as_str(), r.subresource.as_str()),
            ("namespaces", "x", "finalize")
        );
        let r = res("/apis/apps/v1/deployments");
        assert_eq!((r.resource.plural, r.namespace.as_str()), ("deployments", ""));
        let r = res("/api/v1/watch/namespaces/default/pods");
        assert!(r.watch);
        let r = res("/api/v1/namespaces/default/pods?watch=true");
        assert!(r.watch);
        let r = res("/api/v1/nodes/n1/status");
        assert_eq!((r.name.as_str(), r.subresource.as_str()), ("n1", "status"));
        let r = res("/api/v1/nodes/n1/proxy/stats/summary");
        assert_eq!(
            (r.name.as_str(), r.subresource.as_str(), r.proxy_path.as_str()),
            ("n1", "proxy", "/stats/summary")
        );
        assert_eq!(res("/api/v1/nodes/n1/proxy").proxy_path, "/");
        assert_eq!(res("/api/v1/nodes/n1/proxy/logs/").proxy_path, "/logs/");
        let at = |p: &str| info(Method::GET, p).route();
        assert!(matches!(at("/apis"), Route::GroupsDiscovery));
        assert!(matches!(at("/apis/apps/v1"), Route::GroupVersion(..)));
        assert!(matches!(at("/apis/apps/v1/"), Route::GroupVersion(..)));
        assert!(matches!(at("/api/v1/foos"), Route::UnknownResource(_)));
        assert!(matches!(at("/healthz"), Route::Health("healthz")));
        assert!(matches!(at("/readyz/etcd"), Route::Health("check")));
        assert!(matches!(at("/version/"), Route::Version));
    }

    #[test]
    fn request_info_as_upstream() {
        let a = info(Method::GET, "/api/v1/namespaces/default/pods").attributes();
        assert_eq!(
            (
                a.verb.as_str(),
                a.resource.as_str(),
                a.namespace.as_str(),
                a.resource_request
            ),
            ("list", "pods", "default", true)
        );
        let a = info(Method::GET, "/api/v1/namespaces/default/pods?watch=true").attributes();
        assert_eq!(a.verb, "watch");
        let a = info(Method::GET, "/api/v1/watch/namespaces/default/pods/web").attributes();
        assert_eq!((a.verb.as_str(), a.name.as_str()), ("watch", "web"));
        // The handler decodes the query; these tests pass it decoded.
        let a = info(
            Method::GET,
            "/api/v1/namespaces/default/pods?fieldSelector=metadata.name%3Dweb",
        )
        .attributes();
        assert_eq!(a.name, "");
        let a = info(
            Method::GET,
            "/api/v1/namespaces/default/pods?fieldSelector=metadata.name=web&watch=1",
        )
        .attributes();
        assert_eq!((a.verb.as_str(), a.name.as_str()), ("watch", "web"));
        let a = info(Method::POST, "/api/v1/namespaces/default/pods/web/exec").attributes();
        assert_eq!(
            (a.verb.as_str(), a.combined_resource().as_str(), a.name.as_str()),
            ("create", "pods/exec", "web")
        );
        let a = info(Method::DELETE, "/apis/apps/v1/namespaces/default/deployments").attributes();
        assert_eq!(
            (a.verb.as_str(), a.api_group.as_str(), a.api_version.as_str()),
            ("deletecollection", "apps", "v1")
        );
        let a = info(Method::GET, "/api/v1/namespaces/kube-system").attributes();
        assert_eq!(
            (a.resource.as_str(), a.name.as_str(), a.namespace.as_str()),
            ("namespaces", "kube-system", "kube-system")
        );
        let a = info(Method::PUT, "/api/v1/namespaces/gone/finalize").attributes();
        assert_eq!(
            (a.resource.as_str(), a.name.as_str(), a.subresource.as_str()),
            ("namespaces", "gone", "finalize")
        );
        let a = info(Method::GET, "/api/v1/nodes").attributes();
        assert_eq!((a.verb.as_str(), a.namespace.as_str()), ("list", ""));
        for p in [
            "/api",
            "/apis",
            "/apis/apps",
            "/api/v1",
            "/healthz",
            "/openapi/v3",
            "/version",
        ] {
            let a = info(Method::GET, p).attributes();
            assert!(!a.resource_request, "{p}");
            assert_eq!((a.verb.as_str(), a.path.as_str()), ("get", p));
        }
    }

    /// The attributes and the route of every odd path agree: whatever the authorizer was asked
    /// about is the object served, or nothing is.
    #[test]
    fn odd_paths_are_authorized_as_they_are_routed() {
        // An empty namespace is the cluster scope, for the authorizer and for the route alike.
        let i = info(Method::GET, "/api/v1/namespaces//secrets");
        let a = i.attributes();
        assert_eq!(
            (
                a.verb.as_str(),
                a.resource.as_str(),
                a.namespace.as_str(),
                a.name.as_str()
            ),
            ("list", "secrets", "", "")
        );
        match i.route() {
            Route::Resource(r) => assert_eq!((r.resource.plural, r.namespace.as_str()), ("secrets", "")),
            other => panic!("{other:?}"),
        }
        // A name under an empty namespace is upstream's 400.
        for m in [Method::GET, Method::PUT, Method::PATCH, Method::DELETE] {
            let i = info(m.clone(), "/api/v1/namespaces//secrets/s");
            assert_eq!(i.attributes().namespace, "");
            match i.route() {
                Route::Invalid(e) => assert_eq!((e.code, e.message.as_str()), (400, "Namespace parameter required.")),
                other => panic!("{m}: {other:?}"),
            }
        }
        // Leading, doubled and trailing slashes are trimmed as upstream trims them.
        for p in [
            "//api/v1/namespaces/default/secrets",
            "/api/v1/namespaces/default/secrets/",
            "/api/v1/namespaces/default/secrets//",
        ] {
            let a = info(Method::GET, p).attributes();
            assert_eq!(
                (a.resource.as_str(), a.namespace.as_str(), a.verb.as_str()),
                ("secrets", "default", "list"),
                "{p}"
            );
            assert!(matches!(info(Method::GET, p).route(), Route::Resource(_)), "{p}");
        }
        // An empty segment inside is a resource nobody has.
        let i = info(Method::GET, "/api/v1/namespaces/default//secrets");
        assert_eq!((i.resource.as_str(), i.name.as_str()), ("", "secrets"));
        assert!(matches!(i.route(), Route::NotFound));
        // Percent-encoded slashes are slashes, to the authorizer and the route alike.
        let i = info(Method::GET, "/api/v1/namespaces/default%2Fsecrets");
        assert_eq!((i.resource.as_str(), i.namespace.as_str()), ("secrets", "default"));
        assert!(matches!(i.route(), Route::Resource(ref r) if r.resource.plural == "secrets"));
        let i = info(Method::GET, "/api/v1/namespaces%2F%2Fsecrets");
        assert_eq!(
            (i.resource.as_str(), i.namespace.as_str(), i.verb.as_str()),
            ("secrets", "", "list")
        );
        // `..` is a name no object has.
        let i = info(Method::GET, "/api/v1/namespaces/default/pods/..");
        assert_eq!(i.attributes().name, "..");
        match i.route() {
            Route::Invalid(e) => assert_eq!(e.message, "Name parameter invalid: \"..\": may not be '..'"),
            other => panic!("{other:?}"),
        }
        let i = info(Method::GET, "/api/v1/namespaces/../secrets");
        assert_eq!(i.attributes().namespace, "..");
        assert!(matches!(i.route(), Route::Invalid(_)));
        let i = info(Method::GET, "/api/v1/namespaces/default/pods/../../secrets");
        assert!(matches!(i.route(), Route::NotFound));
        // A cluster-scoped resource under a namespace is no route.
        for p in [
            "/api/v1/namespaces/default/nodes",
            "/api/v1/namespaces/default/nodes/n1",
            "/api/v1/namespaces/default/namespaces",
            "/apis/rbac.authorization.k8s.io/v1/namespaces/default/clusterroles/admin",
        ] {
            assert!(matches!(info(Method::GET, p).route(), Route::NotFound), "{p}");
        }
        // A namespaced object needs its namespace.
        assert!(matches!(
            info(Method::GET, "/api/v1/secrets/s").route(),
            Route::NotFound
        ));
        // A `/watch/` path is read only, and watched as authorized.
        let i = info(Method::POST, "/api/v1/watch/namespaces/default/pods");
        assert_eq!(i.verb, "watch");
        assert!(matches!(i.route(), Route::MethodNotAllowed));
        let i = info(Method::GET, "/api/v1/watch");
        assert!(matches!(i.route(), Route::NotFound));
        // A named GET with `?watch=true` is a get, as upstream authorizes and serves it.
        let i = info(Method::GET, "/api/v1/namespaces/default/pods/p?watch=true");
        assert_eq!(i.verb, "get");
        assert!(matches!(i.route(), Route::Resource(ref r) if !r.watch));
        // The legacy proxy verb is served by nothing.
        assert!(matches!(
            info(Method::GET, "/api/v1/proxy/nodes/n1/pods").route(),
            Route::NotFound
        ));
        // Groups under `/apis` are named.
        let i = info(Method::GET, "/apis//v1/secrets");
        assert_eq!(i.api_group, "");
        assert!(matches!(i.route(), Route::NotFound));
        assert_eq!(encode_path("/a b/%/ü"), "/a%20b/%25/%C3%BC");
        assert_eq!(decode_path(&encode_path("/a b/%/ü")).unwrap(), "/a b/%/ü");
        // Bad escapes are refused before anything else reads the path.
        let params = Params::new();
        assert_eq!(parse(&Method::GET, "/api/v1/%zz", &params).unwrap_err().code, 400);
        assert_eq!(parse(&Method::GET, "/api/v1/%ff", &params).unwrap_err().code, 400);
    }
}
