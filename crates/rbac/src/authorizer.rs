//! The RBAC authorizer over one snapshot of Roles, ClusterRoles and their bindings, as
//! upstream's `plugin/pkg/auth/authorizer/rbac`.
//!
//! A snapshot indexes every binding's grants by subject (user name, service account user name,
//! group), with the bound role's rules resolved, so a decision looks only at the grants of the
//! caller's own names: it costs the same with ten bindings or ten thousand.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use crate::rule::{Attributes, PolicyRule};

/// A caller: user name and groups.
pub trait Subject {
    fn name(&self) -> &str;
    fn groups(&self) -> &[String];
}

/// An authorizer's verdict, as upstream's `authorizer.Decision`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    Deny,
    NoOpinion,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Meta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
}

#[derive(Deserialize)]
struct RoleObject {
    #[serde(default)]
    metadata: Meta,
    #[serde(default)]
    rules: Option<Vec<PolicyRule>>,
}

#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
pub struct RoleRef {
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub name: String,
}

#[derive(Deserialize, Clone, Debug, Default)]
pub struct BindingSubject {
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BindingObject {
    #[serde(default)]
    metadata: Meta,
    #[serde(default)]
    role_ref: RoleRef,
    #[serde(default)]
    subjects: Option<Vec<BindingSubject>>,
}

/// What a binding grants one subject: the role's rules, or why they could not be found.
#[derive(Clone, Debug)]
struct Grant {
    /// `ClusterRoleBinding "b" of ClusterRole "r" to User "u"`, upstream's describer.
    source: Arc<str>,
    rules: Result<Arc<[PolicyRule]>, Arc<str>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Key {
    /// A user name (service accounts are matched by their user name).
    User(String),
    Group(String),
}

/// The grants of one scope (cluster-wide or one namespace), by subject: looked up by the
/// caller's names without allocating.
#[derive(Default, Debug)]
struct Index {
    by_user: HashMap<String, Vec<Grant>>,
    by_group: HashMap<String, Vec<Grant>>,
}

impl Index {
    fn grants<'a>(&'a self, user: &'a dyn Subject) -> impl Iterator<Item = &'a Grant> + 'a {
        let by_user = self.by_user.get(user.name());
        let by_groups = user.groups().iter().filter_map(|g| self.by_group.get(g.as_str()));
        by_user.into_iter().chain(by_groups).flatten()
    }

    fn add(&mut self, key: Key, grant: Grant) {
        let (map, name) = match key {
            Key::User(n) => (&mut self.by_user, n),
            Key::Group(n) => (&mut self.by_group, n),
        };
        map.entry(name).or_default().push(grant);
    }
}

/// One consistent view of every Role, ClusterRole and binding.
#[derive(Default, Debug)]
pub struct Policy {
    cluster: Index,
    namespaces: HashMap<String, Index>,
}

/// The objects a snapshot is built from, as the API serves them.
#[derive(Default)]
pub struct Objects<'a> {
    pub cluster_roles: Vec<&'a Value>,
    pub roles: Vec<&'a Value>,
    pub cluster_role_bindings: Vec<&'a Value>,
    pub role_bindings: Vec<&'a Value>,
}

fn parse<T: for<'de> Deserialize<'de>>(v: &Value) -> Option<T> {
    T::deserialize(v).ok()
}

fn describe_subject(s: &BindingSubject, binding_namespace: &str) -> String {
    match s.kind.as_str() {
        "ServiceAccount" => {
            let ns = if s.namespace.is_empty() {
                binding_namespace
            } else {
                &s.namespace
            };
            format!("ServiceAccount \"{}/{}\"", s.name, ns)
        }
        kind => format!("{kind} \"{}\"", s.name),
    }
}

/// The index key of a subject, as upstream's `appliesToUser` matches it.
fn subject_key(s: &BindingSubject, binding_namespace: &str) -> Option<Key> {
    match s.kind.as_str() {
        "User" => Some(Key::User(s.name.clone())),
        "Group" => Some(Key::Group(s.name.clone())),
        "ServiceAccount" => {
            let ns = if s.namespace.is_empty() {
                binding_namespace
            } else {
                &s.namespace
            };
            (!ns.is_empty()).then(|| Key::User(format!("system:serviceaccount:{ns}:{}", s.name)))
        }
        _ => None,
    }
}

impl Policy {
    /// Builds the snapshot. Objects that do not parse are skipped (they cannot be stored:
    /// validation refuses them).
    pub fn build(objects: &Objects) -> Policy {
        let rules_of = |v: &Value| -> Option<(Meta, Arc<[PolicyRule]>)> {
            let r: RoleObject = parse(v)?;
            Some((r.metadata, r.rules.unwrap_or_default().into()))
        };
        let cluster_roles: HashMap<String, Arc<[PolicyRule]>> = objects
            .cluster_roles
            .iter()
            .filter_map(|v| rules_of(v))
            .map(|(m, rules)| (m.name, rules))
            .collect();
        let roles: HashMap<(String, String), Arc<[PolicyRule]>> = objects
            .roles
            .iter()
            .filter_map(|v| rules_of(v))
            .map(|(m, rules)| ((m.namespace, m.name), rules))
            .collect();
        let resolve = |namespace: &str, r: &RoleRef| -> Result<Arc<[PolicyRule]>, Arc<str>> {
            match r.kind.as_str() {
                "ClusterRole" => cluster_roles
                    .get(&r.name)
                    .cloned()
                    .ok_or_else(|| format!("clusterrole.rbac.authorization.k8s.io \"{}\" not found", r.name).into()),
                "Role" if !namespace.is_empty() => roles
                    .get(&(namespace.to_string(), r.name.clone()))
                    .cloned()
                    .ok_or_else(|| format!("role.rbac.authorization.k8s.io \"{}\" not found", r.name).into()),
                kind => Err(format!("unsupported role reference kind: {kind:?}").into()),
            }
        };
        let mut policy = Policy::default();
        let add = |index: &mut Index, b: &BindingObject, kind: &str| {
            let ns = b.metadata.namespace.as_str();
            let rules = resolve(ns, &b.role_ref);
            let binding_name = if kind == "RoleBinding" {
                format!("{}/{}", b.metadata.name, ns)
            } else {
                b.metadata.name.clone()
            };
            for s in b.subjects.iter().flatten() {
                let Some(key) = subject_key(s, ns) else { continue };
                let source = format!(
                    "{kind} \"{binding_name}\" of {} \"{}\" to {}",
                    b.role_ref.kind,
                    b.role_ref.name,
                    describe_subject(s, ns)
                );
                index.add(
                    key,
                    Grant {
                        source: source.into(),
                        rules: rules.clone(),
                    },
                );
            }
        };
        for v in &objects.cluster_role_bindings {
            if let Some(b) = parse::<BindingObject>(v) {
                add(&mut policy.cluster, &b, "ClusterRoleBinding");
            }
        }
        for v in &objects.role_bindings {
            if let Some(b) = parse::<BindingObject>(v) {
                let index = policy.namespaces.entry(b.metadata.namespace.clone()).or_default();
                add(index, &b, "RoleBinding");
            }
        }
        policy
    }

    /// The grants that apply to `user` for a request in `namespace`: cluster-wide bindings
    /// first, then the namespace's RoleBindings, as upstream's `VisitRulesFor`.
    fn grants<'a>(&'a self, user: &'a dyn Subject, namespace: &str) -> impl Iterator<Item = &'a Grant> + 'a {
        let local = (!namespace.is_empty())
            .then(|| self.namespaces.get(namespace))
            .flatten()
            .map(|index| index.grants(user));
        self.cluster.grants(user).chain(local.into_iter().flatten())
    }

    /// Upstream's RBAC decision: Allow with the granting binding as reason, or NoOpinion with
    /// the bindings whose roles were missing (`RBAC: clusterrole... not found`).
    pub fn authorize(&self, user: &dyn Subject, a: &Attributes) -> (Decision, String) {
        let mut errors: Vec<&str> = Vec::new();
        for grant in self.grants(user, &a.namespace) {
            match &grant.rules {
                Ok(rules) => {
                    if rules.iter().any(|r| r.allows(a)) {
                        return (Decision::Allow, format!("RBAC: allowed by {}", grant.source));
                    }
                }
                Err(e) => errors.push(e),
            }
        }
        if errors.is_empty() {
            return (Decision::NoOpinion, String::new());
        }
        errors.dedup();
        (Decision::NoOpinion, format!("RBAC: {}", aggregate(&errors)))
    }

    /// The grant and the rule in it that allow the request, if RBAC allows it.
    pub fn allowing_rule(&self, user: &dyn Subject, a: &Attributes) -> Option<(String, PolicyRule)> {
        self.grants(user, &a.namespace).find_map(|grant| {
            let rules = grant.rules.as_ref().ok()?;
            let rule = rules.iter().find(|r| r.allows(a))?;
            Some((grant.source.to_string(), rule.clone()))
        })
    }

    /// Every rule that applies to `user` in `namespace` (cluster-wide ones included), and the
    /// errors met on the way, as upstream's `RulesFor`.
    pub fn rules_for(&self, user: &dyn Subject, namespace: &str) -> (Vec<PolicyRule>, Vec<String>) {
        let mut rules = Vec::new();
        let mut errors = Vec::new();
        for grant in self.grants(user, namespace) {
            match &grant.rules {
                Ok(r) => rules.extend(r.iter().cloned()),
                Err(e) => errors.push(e.to_string()),
            }
        }
        (rules, errors)
    }
}

/// Upstream's `utilerrors.NewAggregate(...).Error()`: one error alone, else `[a, b]`.
fn aggregate(errors: &[&str]) -> String {
    match errors {
        [one] => one.to_string(),
        many => format!("[{}]", many.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct U(&'static str, Vec<String>);
    impl Subject for U {
        fn name(&self) -> &str {
            self.0
        }
        fn groups(&self) -> &[String] {
            &self.1
        }
    }
    fn user(name: &'static str, groups: &[&str]) -> U {
        U(name, groups.iter().map(|g| g.to_string()).collect())
    }

    fn objects() -> (Vec<Value>, Vec<Value>, Vec<Value>, Vec<Value>) {
        let cluster_roles = vec![
            json!({"metadata": {"name": "view"}, "rules": [
                {"verbs": ["get", "list", "watch"], "apiGroups": [""], "resources": ["pods", "services"]}]}),
            json!({"metadata": {"name": "discovery"}, "rules": [
                {"verbs": ["get"], "nonResourceURLs": ["/api", "/api/*"]}]}),
        ];
        let roles = vec![json!({"metadata": {"name": "deployer", "namespace": "team"}, "rules": [
            {"verbs": ["create"], "apiGroups": ["apps"], "resources": ["deployments"]}]})];
        let cluster_role_bindings = vec![
            json!({"metadata": {"name": "discovery"}, "roleRef": {"kind": "ClusterRole", "name": "discovery"},
                "subjects": [{"kind": "Group", "name": "system:authenticated"}]}),
            json!({"metadata": {"name": "dangling"}, "roleRef": {"kind": "ClusterRole", "name": "gone"},
                "subjects": [{"kind": "User", "name": "bob"}]}),
        ];
        let role_bindings = vec![
            json!({"metadata": {"name": "jane-view", "namespace": "team"},
                "roleRef": {"kind": "ClusterRole", "name": "view"},
                "subjects": [{"kind": "User", "name": "jane"}, {"kind": "ServiceAccount", "name": "ci"}]}),
            json!({"metadata": {"name": "jane-deploy", "namespace": "team"},
                "roleRef": {"kind": "Role", "name": "deployer"},
                "subjects": [{"kind": "User", "name": "jane"}]}),
        ];
        (cluster_roles, roles, cluster_role_bindings, role_bindings)
    }

    fn policy() -> Policy {
        let (cr, r, crb, rb) = objects();
        Policy::build(&Objects {
            cluster_roles: cr.iter().collect(),
            roles: r.iter().collect(),
            cluster_role_bindings: crb.iter().collect(),
            role_bindings: rb.iter().collect(),
        })
    }

    #[test]
    fn decisions_name_the_binding() {
        let p = policy();
        let jane = user("jane", &["system:authenticated"]);
        let (d, reason) = p.authorize(&jane, &Attributes::resource("list", "", "pods", "team", ""));
        assert_eq!(d, Decision::Allow);
        assert_eq!(
            reason,
            "RBAC: allowed by RoleBinding \"jane-view/team\" of ClusterRole \"view\" to User \"jane\""
        );
        let create = Attributes::resource("create", "apps", "deployments", "team", "");
        assert_eq!(p.authorize(&jane, &create).0, Decision::Allow);
        // Namespaced grants hold only in their namespace.
        let elsewhere = Attributes::resource("list", "", "pods", "other", "");
        assert_eq!(p.authorize(&jane, &elsewhere), (Decision::NoOpinion, String::new()));
        let cluster = Attributes::resource("list", "", "pods", "", "");
        assert_eq!(p.authorize(&jane, &cluster).0, Decision::NoOpinion);
        // Groups and non-resource paths.
        let (d, reason) = p.authorize(&jane, &Attributes::non_resource("get", "/api/v1"));
        assert_eq!(d, Decision::Allow);
        assert!(reason.contains(
            "ClusterRoleBinding \"discovery\" of ClusterRole \"discovery\" to Group \"system:authenticated\""
        ));
    }

    #[test]
    fn service_accounts_default_to_the_binding_namespace() {
        let p = policy();
        let ci = user("system:serviceaccount:team:ci", &[]);
        let (d, reason) = p.authorize(&ci, &Attributes::resource("get", "", "services", "team", "web"));
        assert_eq!(d, Decision::Allow);
        assert!(reason.ends_with("to ServiceAccount \"ci/team\""), "{reason}");
        let other = user("system:serviceaccount:other:ci", &[]);
        assert_eq!(
            p.authorize(&other, &Attributes::resource("get", "", "services", "team", "web"))
                .0,
            Decision::NoOpinion
        );
    }

    #[test]
    fn missing_roles_are_the_reason() {
        let p = policy();
        let bob = user("bob", &[]);
        let (d, reason) = p.authorize(&bob, &Attributes::resource("get", "", "pods", "x", "y"));
        assert_eq!(d, Decision::NoOpinion);
        assert_eq!(reason, "RBAC: clusterrole.rbac.authorization.k8s.io \"gone\" not found");
        let (rules, errors) = p.rules_for(&bob, "x");
        assert!(rules.is_empty());
        assert_eq!(errors.len(), 1);
    }

    #[test]
    fn rules_for_lists_cluster_and_namespace_rules() {
        let p = policy();
        let jane = user("jane", &["system:authenticated"]);
        let (rules, errors) = p.rules_for(&jane, "team");
        assert!(errors.is_empty());
        assert_eq!(rules.len(), 3);
        assert_eq!(p.rules_for(&jane, "other").0.len(), 1);
    }
}
