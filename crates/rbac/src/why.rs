//! `skiff auth why`: what allows a request, or the smallest grant that would, as the kubectl
//! commands that make it.

use crate::rule::{Attributes, PolicyRule};

/// Go's `%q` of a string slice: `["a" "b"]`.
pub fn go_quoted(items: &[String]) -> String {
    let q: Vec<String> = items.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", q.join(" "))
}

/// Upstream's `CompactRules`: simple rules (one group, one resource, no names) that differ only
/// in their verbs are merged into one, in the order they first appear.
pub fn compact(rules: &[PolicyRule]) -> Vec<PolicyRule> {
    let simple = |r: &PolicyRule| {
        r.api_groups.len() == 1
            && r.resources.len() == 1
            && r.resource_names.is_empty()
            && r.non_resource_urls.is_empty()
    };
    let mut out: Vec<PolicyRule> = Vec::new();
    for r in rules {
        let same = out
            .iter_mut()
            .find(|o| simple(r) && simple(o) && o.api_groups == r.api_groups && o.resources == r.resources);
        match same {
            Some(o) => {
                for v in &r.verbs {
                    if !o.verbs.contains(v) {
                        o.verbs.push(v.clone());
                    }
                }
            }
            None => out.push(r.clone()),
        }
    }
    out
}

/// Upstream's `CompactString` of a rule: `{APIGroups:["apps"], Resources:["deployments"], Verbs:["get"]}`.
pub fn describe_rule(r: &PolicyRule) -> String {
    let quoted = go_quoted;
    let mut parts = Vec::new();
    for (label, items) in [
        ("APIGroups", &r.api_groups),
        ("Resources", &r.resources),
        ("NonResourceURLs", &r.non_resource_urls),
        ("ResourceNames", &r.resource_names),
        ("Verbs", &r.verbs),
    ] {
        if !items.is_empty() {
            parts.push(format!("{label}:{}", quoted(items)));
        }
    }
    format!("{{{}}}", parts.join(", "))
}

/// Who a grant is for, as kubectl's binding flags name them.
pub fn subject_flag(user: &str, group: Option<&str>) -> String {
    if let Some(g) = group {
        return format!("--group={g}");
    }
    match user
        .strip_prefix("system:serviceaccount:")
        .and_then(|r| r.split_once(':'))
    {
        Some((ns, name)) => format!("--serviceaccount={ns}:{name}"),
        None => format!("--user={user}"),
    }
}

/// A name for a role made for this request: `USER-VERB-RESOURCE`, lower-case and safe.
fn role_name(user: &str, a: &Attributes) -> String {
    let who = user.rsplit(':').next().unwrap_or(user);
    let what = if a.resource_request {
        a.combined_resource().replace('/', "-")
    } else {
        a.path.trim_matches('/').replace('/', "-")
    };
    let raw = format!("{who}-{}-{what}", a.verb);
    raw.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}

/// The kubectl commands that grant exactly this request and nothing more: a Role and
/// RoleBinding in the request's namespace, or a ClusterRole and ClusterRoleBinding for
/// cluster-scoped requests and non-resource paths.
pub fn smallest_grant(user: &str, group: Option<&str>, a: &Attributes) -> Vec<String> {
    let name = role_name(user, a);
    let subject = subject_flag(user, group);
    if !a.resource_request {
        return vec![
            format!(
                "kubectl create clusterrole {name} --verb={} --non-resource-url={}",
                a.verb, a.path
            ),
            format!("kubectl create clusterrolebinding {name} --clusterrole={name} {subject}"),
        ];
    }
    let mut resource = a.combined_resource();
    if !a.api_group.is_empty() {
        // kubectl takes RESOURCE.GROUP (a subresource after the group: deployments.apps/scale).
        resource = match a.subresource.as_str() {
            "" => format!("{}.{}", a.resource, a.api_group),
            sub => format!("{}.{}/{sub}", a.resource, a.api_group),
        };
    }
    let names = if a.name.is_empty() || matches!(a.verb.as_str(), "create" | "list" | "watch" | "deletecollection") {
        String::new()
    } else {
        format!(" --resource-name={}", a.name)
    };
    if a.namespace.is_empty() {
        vec![
            format!(
                "kubectl create clusterrole {name} --verb={} --resource={resource}{names}",
                a.verb
            ),
            format!("kubectl create clusterrolebinding {name} --clusterrole={name} {subject}"),
        ]
    } else {
        let ns = &a.namespace;
        vec![
            format!(
                "kubectl create role {name} --verb={} --resource={resource}{names} -n {ns}",
                a.verb
            ),
            format!("kubectl create rolebinding {name} --role={name} {subject} -n {ns}"),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_as_kubectl_commands() {
        let a = Attributes::resource("list", "", "pods", "team", "");
        assert_eq!(
            smallest_grant("jane", None, &a),
            vec![
                "kubectl create role jane-list-pods --verb=list --resource=pods -n team",
                "kubectl create rolebinding jane-list-pods --role=jane-list-pods --user=jane -n team",
            ]
        );
        let a = Attributes::resource("get", "apps", "deployments", "", "web").with_subresource("scale");
        assert_eq!(
            smallest_grant("system:serviceaccount:ci:deployer", None, &a),
            vec![
                "kubectl create clusterrole deployer-get-deployments-scale --verb=get --resource=deployments.apps/scale --resource-name=web",
                "kubectl create clusterrolebinding deployer-get-deployments-scale --clusterrole=deployer-get-deployments-scale --serviceaccount=ci:deployer",
            ]
        );
        let a = Attributes::non_resource("get", "/metrics");
        assert_eq!(
            smallest_grant("prom", Some("monitoring"), &a)[0],
            "kubectl create clusterrole prom-get-metrics --verb=get --non-resource-url=/metrics"
        );
        let rule = PolicyRule {
            verbs: vec!["get".into(), "list".into()],
            api_groups: vec!["".into()],
            resources: vec!["pods".into()],
            ..Default::default()
        };
        assert_eq!(
            describe_rule(&rule),
            "{APIGroups:[\"\"], Resources:[\"pods\"], Verbs:[\"get\" \"list\"]}"
        );
    }

    #[test]
    fn compact_as_upstream() {
        let rule = |verb: &str, res: &[&str], urls: &[&str]| PolicyRule {
            verbs: vec![verb.into()],
            api_groups: if res.is_empty() { vec![] } else { vec!["".into()] },
            resources: res.iter().map(|s| s.to_string()).collect(),
            non_resource_urls: urls.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let rules = [
            rule("get", &["pods"], &[]),
            rule("list", &["pods"], &[]),
            rule("get", &[], &["/metrics"]),
        ];
        let lines: Vec<String> = compact(&rules).iter().map(describe_rule).collect();
        assert_eq!(
            lines,
            vec![
                "{APIGroups:[\"\"], Resources:[\"pods\"], Verbs:[\"get\" \"list\"]}",
                "{NonResourceURLs:[\"/metrics\"], Verbs:[\"get\"]}",
            ]
        );
    }
}
