//! What a request asks for, read off its path and method (upstream's RequestInfo).

use skiff_api::registry::{self, Resource};

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
    /// The legacy `/watch/` path prefix was used.
    pub watch_path: bool,
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
    NotFound,
}

fn is_health(p: &str) -> Option<&'static str> {
    match p {
        "/readyz" => Some("readyz"),
        "/livez" => Some("livez"),
        "/healthz" => Some("healthz"),
        _ => None,
    }
}

/// Route a request path (without query).
pub fn route(path: &str) -> Route {
    let trimmed = path.trim_end_matches('/');
    if trimmed == "/version" {
        return Route::Version;
    }
    if path == "/metrics" {
        return Route::Metrics;
    }
    if let Some(h) = is_health(trimmed) {
        return Route::Health(h);
    }
    if trimmed.starts_with("/readyz/") || trimmed.starts_with("/livez/") || trimmed.starts_with("/healthz/") {
        return Route::Health("check");
    }
    if trimmed == "/openapi/v2" {
        return Route::OpenApiV2;
    }
    if trimmed == "/openapi/v3" {
        return Route::OpenApiIndex;
    }
    if let Some(rest) = trimmed.strip_prefix("/openapi/v3/") {
        return Route::OpenApiDocument(rest.to_string());
    }
    if let Some(op) = trimmed.strip_prefix(crate::encryption::API_PATH) {
        return Route::SecretsEncrypt(op.to_string());
    }
    let segs: Vec<&str> = trimmed.split('/').skip(1).collect();
    match segs.as_slice() {
        ["api"] => Route::CoreDiscovery,
        ["apis"] => Route::GroupsDiscovery,
        ["api", "v1"] => Route::GroupVersion(String::new(), "v1".into()),
        ["apis", g] => Route::Group(g.to_string()),
        ["apis", g, v] => Route::GroupVersion(g.to_string(), v.to_string()),
        ["api", "v1", rest @ ..] => resource_route("", "v1", rest),
        ["apis", g, v, rest @ ..] => resource_route(g, v, rest),
        _ => Route::NotFound,
    }
}

fn resource_route(group: &str, version: &str, rest: &[&str]) -> Route {
    let (watch_path, rest) = match rest {
        ["watch", tail @ ..] => (true, tail),
        _ => (false, rest),
    };
    let lookup = |plural: &str| registry::lookup(group, version, plural);
    let mk = |resource: &'static Resource, namespace: &str, name: &str, sub: &str| {
        Route::Resource(ResourceRequest {
            resource,
            namespace: namespace.to_string(),
            name: name.to_string(),
            subresource: sub.to_string(),
            watch_path,
        })
    };
    // /namespaces/NS/PLURAL[/NAME[/SUB]] for namespaced resources; /namespaces/NAME[/SUB] is the
    // namespace object itself when the third segment is not a namespaced resource.
    if let ["namespaces", ns, plural, tail @ ..] = rest
        && let Some(r) = lookup(plural).filter(|r| r.namespaced)
    {
        return match tail {
            [] => mk(r, ns, "", ""),
            [name] => mk(r, ns, name, ""),
            [name, sub] => mk(r, ns, name, sub),
            _ => Route::NotFound,
        };
    }
    match rest {
        [plural] => match lookup(plural) {
            Some(r) => mk(r, "", "", ""),
            None => Route::UnknownResource(plural.to_string()),
        },
        [plural, name] => match lookup(plural) {
            Some(r) if !r.namespaced => mk(r, "", name, ""),
            Some(_) => Route::NotFound,
            None => Route::UnknownResource(plural.to_string()),
        },
        // A node's proxy carries the agent's path after it.
        [plural, name, "proxy", _, ..] => match lookup(plural) {
            Some(r) if !r.namespaced && r.has_subresource("proxy") => mk(r, "", name, "proxy"),
            _ => Route::NotFound,
        },
        [plural, name, sub] => match lookup(plural) {
            Some(r) if !r.namespaced => mk(r, "", name, sub),
            _ => Route::NotFound,
        },
        _ => Route::NotFound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(path: &str) -> ResourceRequest {
        match route(path) {
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
        assert_eq!((r.resource.plural, r.name.as_str()), ("namespaces", "kube-system"));
        let r = res("/api/v1/namespaces/x/finalize");
        assert_eq!(
            (r.resource.plural, r.name.as_str(), r.subresource.as_str()),
            ("namespaces", "x", "finalize")
        );
        let r = res("/apis/apps/v1/deployments");
        assert_eq!((r.resource.plural, r.namespace.as_str()), ("deployments", ""));
        let r = res("/api/v1/watch/namespaces/default/pods");
        assert!(r.watch_path);
        let r = res("/api/v1/nodes/n1/status");
        assert_eq!((r.name.as_str(), r.subresource.as_str()), ("n1", "status"));
        assert!(matches!(route("/apis"), Route::GroupsDiscovery));
        assert!(matches!(route("/apis/apps/v1"), Route::GroupVersion(..)));
        assert!(matches!(route("/api/v1/foos"), Route::UnknownResource(_)));
    }
}
