//! Policy rules and the request attributes they are matched against, as upstream's
//! `rbac.RuleAllows` and the `rbacv1helpers` matchers.

use serde::{Deserialize, Serialize};

/// One rule of a Role or ClusterRole.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRule {
    #[serde(default)]
    pub verbs: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub api_groups: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_names: Vec<String>,
    #[serde(default, rename = "nonResourceURLs", skip_serializing_if = "Vec::is_empty")]
    pub non_resource_urls: Vec<String>,
}

/// What a request asks to do, as upstream's `authorizer.Attributes`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attributes {
    /// `get`, `list`, `watch`, `create`, ... for resources; the lower-case method for other paths.
    pub verb: String,
    /// Whether the request is for an API resource (else a non-resource path such as `/healthz`).
    pub resource_request: bool,
    pub namespace: String,
    pub api_group: String,
    pub api_version: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
    /// The request path (what non-resource rules match).
    pub path: String,
    /// The field selector of a list or watch, as given (the Node authorizer allows a node to
    /// list the pods with `spec.nodeName` its own).
    pub field_selector: String,
}

impl Attributes {
    /// A resource request.
    pub fn resource(verb: &str, api_group: &str, resource: &str, namespace: &str, name: &str) -> Attributes {
        Attributes {
            verb: verb.to_string(),
            resource_request: true,
            api_group: api_group.to_string(),
            resource: resource.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
            ..Default::default()
        }
    }

    /// A request for a path that is not an API resource.
    pub fn non_resource(verb: &str, path: &str) -> Attributes {
        Attributes {
            verb: verb.to_string(),
            path: path.to_string(),
            ..Default::default()
        }
    }

    pub fn with_subresource(mut self, subresource: &str) -> Attributes {
        self.subresource = subresource.to_string();
        self
    }

    /// `pods` or `pods/log`.
    pub fn combined_resource(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }
}

impl PolicyRule {
    /// Whether this rule allows the request.
    pub fn allows(&self, a: &Attributes) -> bool {
        if !self.verb_matches(&a.verb) {
            return false;
        }
        if !a.resource_request {
            return self.non_resource_url_matches(&a.path);
        }
        self.api_group_matches(&a.api_group)
            && self.resource_matches(&a.resource, &a.subresource)
            && self.resource_name_matches(&a.name)
    }

    pub fn verb_matches(&self, verb: &str) -> bool {
        self.verbs.iter().any(|v| v == "*" || v == verb)
    }

    pub fn api_group_matches(&self, group: &str) -> bool {
        self.api_groups.iter().any(|g| g == "*" || g == group)
    }

    /// `*` matches everything, `*/SUB` every resource's subresource SUB, otherwise the rule's
    /// entry must be the resource, or `resource/subresource`, exactly.
    pub fn resource_matches(&self, resource: &str, subresource: &str) -> bool {
        self.resources.iter().any(|r| {
            if r == "*" {
                return true;
            }
            if subresource.is_empty() {
                return r == resource;
            }
            match r.split_once('/') {
                Some(("*", sub)) => sub == subresource,
                Some((res, sub)) => res == resource && sub == subresource,
                None => false,
            }
        })
    }

    pub fn resource_name_matches(&self, name: &str) -> bool {
        self.resource_names.is_empty() || self.resource_names.iter().any(|n| n == name)
    }

    /// `*` matches every path, `PREFIX*` every path under it, otherwise the path exactly.
    pub fn non_resource_url_matches(&self, path: &str) -> bool {
        self.non_resource_urls
            .iter()
            .any(|u| u == "*" || u == path || u.strip_suffix('*').is_some_and(|prefix| path.starts_with(prefix)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(verbs: &[&str], groups: &[&str], resources: &[&str]) -> PolicyRule {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        PolicyRule {
            verbs: s(verbs),
            api_groups: s(groups),
            resources: s(resources),
            ..Default::default()
        }
    }

    #[test]
    fn resource_rules() {
        let r = rule(&["get", "list"], &[""], &["pods"]);
        assert!(r.allows(&Attributes::resource("get", "", "pods", "default", "web")));
        assert!(r.allows(&Attributes::resource("list", "", "pods", "", "")));
        assert!(!r.allows(&Attributes::resource("delete", "", "pods", "default", "web")));
        assert!(!r.allows(&Attributes::resource("get", "apps", "pods", "default", "web")));
        // A subresource needs its own entry.
        assert!(!r.allows(&Attributes::resource("get", "", "pods", "default", "web").with_subresource("log")));
        let log = rule(&["get"], &[""], &["pods/log"]);
        assert!(log.allows(&Attributes::resource("get", "", "pods", "default", "web").with_subresource("log")));
        assert!(!log.allows(&Attributes::resource("get", "", "pods", "default", "web")));
        let any_status = rule(&["update"], &["*"], &["*/status"]);
        assert!(
            any_status
                .allows(&Attributes::resource("update", "apps", "deployments", "d", "x").with_subresource("status"))
        );
        assert!(!any_status.allows(&Attributes::resource("update", "apps", "deployments", "d", "x")));
        let all = rule(&["*"], &["*"], &["*"]);
        assert!(all.allows(
            &Attributes::resource("escalate", "rbac.authorization.k8s.io", "roles", "d", "x").with_subresource("s")
        ));
        let mut named = rule(&["get"], &[""], &["configmaps"]);
        named.resource_names = vec!["one".into()];
        assert!(named.allows(&Attributes::resource("get", "", "configmaps", "d", "one")));
        assert!(!named.allows(&Attributes::resource("get", "", "configmaps", "d", "two")));
        assert!(!named.allows(&Attributes::resource("list", "", "configmaps", "d", "")));
    }

    #[test]
    fn non_resource_rules() {
        let r = PolicyRule {
            verbs: vec!["get".into()],
            non_resource_urls: vec!["/healthz".into(), "/apis/*".into()],
            ..Default::default()
        };
        assert!(r.allows(&Attributes::non_resource("get", "/healthz")));
        assert!(r.allows(&Attributes::non_resource("get", "/apis/apps/v1")));
        assert!(!r.allows(&Attributes::non_resource("get", "/apis")));
        assert!(!r.allows(&Attributes::non_resource("post", "/healthz")));
        // A non-resource rule never allows a resource request.
        assert!(!r.allows(&Attributes::resource("get", "", "pods", "", "")));
    }
}
