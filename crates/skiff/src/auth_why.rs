//! `skiff auth why`: asks the API server whether a user may do something (a
//! SubjectAccessReview, so every authorizer has its say), then names the binding and rule that
//! allow it, or the smallest grant that would, as kubectl commands.

use anyhow::{Context, bail};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};
use skiff_rbac::{Attributes, Objects, Policy, Subject};

pub struct Query {
    pub user: String,
    pub groups: Vec<String>,
    pub verb: String,
    pub resource: String,
    pub name: Option<String>,
    pub namespace: String,
}

struct Who(String, Vec<String>);

impl Subject for Who {
    fn name(&self) -> &str {
        &self.0
    }
    fn groups(&self) -> &[String] {
        &self.1
    }
}

/// The attributes of `VERB RESOURCE[.GROUP][/SUB] [NAME]` (or `VERB /path`), with the
/// resource's group and scope from the registry.
fn attributes(q: &Query) -> anyhow::Result<Attributes> {
    if q.resource.starts_with('/') {
        return Ok(Attributes::non_resource(&q.verb, &q.resource));
    }
    let (resource, sub) = q.resource.split_once('/').unwrap_or((q.resource.as_str(), ""));
    let (name, group) = resource
        .split_once('.')
        .map(|(r, g)| (r, Some(g)))
        .unwrap_or((resource, None));
    let found = skiff_api::registry::RESOURCES.iter().find(|r| {
        group.is_none_or(|g| r.group == g)
            && (r.plural == name
                || r.singular == name
                || r.short_names.contains(&name)
                || r.kind.eq_ignore_ascii_case(name))
    });
    let Some(r) = found else {
        bail!("the server doesn't have a resource type {:?}", q.resource);
    };
    let namespace = if r.namespaced { q.namespace.as_str() } else { "" };
    let mut a = Attributes::resource(&q.verb, r.group, r.plural, namespace, q.name.as_deref().unwrap_or(""))
        .with_subresource(sub);
    a.api_version = r.version.to_string();
    Ok(a)
}

fn to_values<T: serde::Serialize>(items: Vec<T>) -> Vec<Value> {
    items.into_iter().filter_map(|i| serde_json::to_value(i).ok()).collect()
}

pub async fn run(client: kube::Client, mut q: Query) -> anyhow::Result<()> {
    let a = attributes(&q)?;
    if q.groups.is_empty()
        && let Some((ns, _)) = q
            .user
            .strip_prefix("system:serviceaccount:")
            .and_then(|r| r.split_once(':'))
    {
        q.groups = vec!["system:serviceaccounts".into(), format!("system:serviceaccounts:{ns}")];
    }
    if !q.groups.iter().any(|g| g == "system:authenticated") {
        q.groups.push("system:authenticated".into());
    }
    let spec = if a.resource_request {
        json!({"user": q.user, "groups": q.groups, "resourceAttributes": {
            "verb": a.verb, "group": a.api_group, "resource": a.resource, "subresource": a.subresource,
            "namespace": a.namespace, "name": a.name}})
    } else {
        json!({"user": q.user, "groups": q.groups, "nonResourceAttributes": {"verb": a.verb, "path": a.path}})
    };
    let review = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec});
    let request = http::Request::post("/apis/authorization.k8s.io/v1/subjectaccessreviews")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&review)?)
        .context("building the SubjectAccessReview")?;
    let answer: Value = client.request(request).await.context("asking the API server")?;
    let allowed = answer
        .pointer("/status/allowed")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let reason = answer.pointer("/status/reason").and_then(Value::as_str).unwrap_or("");

    let lp = ListParams::default();
    let cluster_roles = Api::<ClusterRole>::all(client.clone())
        .list(&lp)
        .await
        .context("listing ClusterRoles")?
        .items;
    let roles = Api::<Role>::all(client.clone())
        .list(&lp)
        .await
        .context("listing Roles")?
        .items;
    let crbs = Api::<ClusterRoleBinding>::all(client.clone())
        .list(&lp)
        .await
        .context("listing ClusterRoleBindings")?
        .items;
    let rbs = Api::<RoleBinding>::all(client.clone())
        .list(&lp)
        .await
        .context("listing RoleBindings")?
        .items;
    let (cr, r, crb, rb) = (
        to_values(cluster_roles.clone()),
        to_values(roles),
        to_values(crbs),
        to_values(rbs),
    );
    let policy = Policy::build(&Objects {
        cluster_roles: cr.iter().collect(),
        roles: r.iter().collect(),
        cluster_role_bindings: crb.iter().collect(),
        role_bindings: rb.iter().collect(),
    });
    let who = Who(q.user.clone(), q.groups.clone());
    let asked = describe(&q.user, &a);

    if allowed {
        println!("yes: {asked}");
        match policy.allowing_rule(&who, &a) {
            Some((source, rule)) => {
                println!("  allowed by {source}");
                println!("  through the rule {}", skiff_rbac::why::describe_rule(&rule));
            }
            None if q.groups.iter().any(|g| g == "system:masters") => {
                println!("  system:masters is allowed everything, without any authorizer being asked")
            }
            None if q.user.starts_with("system:node:") => {
                println!("  the Node authorizer allows it (the object is related to the node's pods)")
            }
            None => println!("  {reason}"),
        }
        return Ok(());
    }
    println!("no: {asked}");
    if !reason.is_empty() {
        println!("  the authorizers said: {reason}");
    }
    println!("The smallest grant that allows it:");
    for cmd in skiff_rbac::why::smallest_grant(&q.user, None, &a) {
        println!("  {cmd}");
    }
    // The narrowest existing ClusterRole meant for binding that allows it, to bind instead.
    let smallest = cluster_roles
        .iter()
        .filter(|c| c.metadata.name.as_deref().is_some_and(meant_for_binding))
        .filter(|c| {
            c.rules.iter().flatten().any(|rule| {
                serde_json::to_value(rule)
                    .ok()
                    .and_then(|v| serde_json::from_value::<skiff_rbac::PolicyRule>(v).ok())
                    .is_some_and(|r| r.allows(&a))
            })
        })
        .min_by_key(|c| (breadth(c), c.metadata.name.clone()));
    if let Some(role) = smallest.and_then(|c| c.metadata.name.clone()) {
        let subject = skiff_rbac::why::subject_flag(&q.user, None);
        let binding = format!(
            "{}-{}",
            q.user.rsplit(':').next().unwrap_or(&q.user),
            role.replace(':', "-")
        );
        println!("Or bind the smallest existing ClusterRole that allows it ({role}):");
        if a.namespace.is_empty() {
            println!("  kubectl create clusterrolebinding {binding} --clusterrole={role} {subject}");
        } else {
            println!(
                "  kubectl create rolebinding {binding} --clusterrole={role} {subject} -n {}",
                a.namespace
            );
        }
    }
    Ok(())
}

/// Roles made to be bound: the user-facing ones and the few system roles upstream binds to
/// users (not the parts aggregated into others, nor the control plane's own).
fn meant_for_binding(name: &str) -> bool {
    !name.starts_with("system:")
        || matches!(
            name,
            "system:monitoring"
                | "system:discovery"
                | "system:basic-user"
                | "system:public-info-viewer"
                | "system:auth-delegator"
        )
}

/// How much a role allows: each rule's verbs times its resources (or paths), a wildcard
/// counting as a thousand.
fn breadth(role: &ClusterRole) -> usize {
    let count = |items: &[String]| {
        items
            .iter()
            .map(|i| if i.contains('*') { 1000 } else { 1 })
            .sum::<usize>()
    };
    role.rules
        .iter()
        .flatten()
        .map(|r| {
            let verbs = count(&r.verbs);
            let things = count(r.resources.as_deref().unwrap_or_default())
                + count(r.non_resource_urls.as_deref().unwrap_or_default());
            let groups = count(r.api_groups.as_deref().unwrap_or_default()).max(1);
            verbs * things.max(1) * groups
        })
        .sum()
}

fn describe(user: &str, a: &Attributes) -> String {
    if !a.resource_request {
        return format!("User {user:?} {} path {:?}", a.verb, a.path);
    }
    let group = if a.api_group.is_empty() {
        "the core group".to_string()
    } else {
        format!("API group {:?}", a.api_group)
    };
    let scope = if a.namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace {:?}", a.namespace)
    };
    let name = if a.name.is_empty() {
        String::new()
    } else {
        format!(" {:?}", a.name)
    };
    format!(
        "User {user:?} {} {}{name} in {group} {scope}",
        a.verb,
        a.combined_resource()
    )
}
