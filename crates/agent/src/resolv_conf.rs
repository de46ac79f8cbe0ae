//! A pod's `/etc/resolv.conf`, by the kubelet's rules (`pkg/kubelet/network/dns`): `dnsPolicy`
//! ClusterFirst (the cluster DNS Service as the only name server, the pod's namespace, `svc` and
//! the cluster domain searched first, `ndots:5`), ClusterFirstWithHostNet, Default (the node's
//! own resolver configuration) and None, then the pod's `dnsConfig` merged in, within the
//! resolver's limits (3 name servers, 32 search domains of 2048 characters in all).

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;

/// The resolver's limits, as the kubelet applies them.
const MAX_NAMESERVERS: usize = 3;
const MAX_SEARCHES: usize = 32;
const MAX_SEARCH_CHARS: usize = 2048;

/// The node's DNS settings (the kubelet's `--cluster-dns`, `--cluster-domain`, `--resolv-conf`).
#[derive(Clone, Debug, Default)]
pub struct NodeDns {
    /// The cluster DNS Service's addresses; empty when the node has none.
    pub cluster_dns: Vec<IpAddr>,
    pub cluster_domain: String,
    /// The node's own resolver configuration (the text of its resolv.conf).
    pub host_resolv_conf: String,
}

impl NodeDns {
    /// The node's settings with its own resolver configuration read from `/etc/resolv.conf`, or,
    /// when that names only a loopback resolver (systemd-resolved's 127.0.0.53, which a pod cannot
    /// reach), from `/run/systemd/resolve/resolv.conf`, as kubeadm points the kubelet there.
    pub fn for_host(cluster_dns: Vec<IpAddr>, cluster_domain: &str) -> NodeDns {
        let etc = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
        let loopback_only = {
            let servers = ResolvConf::parse(&etc).nameservers;
            !servers.is_empty()
                && servers
                    .iter()
                    .all(|s| s.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback()))
        };
        let host_resolv_conf = if loopback_only {
            std::fs::read_to_string("/run/systemd/resolve/resolv.conf").unwrap_or(etc)
        } else {
            etc
        };
        NodeDns {
            cluster_dns,
            cluster_domain: cluster_domain.to_string(),
            host_resolv_conf,
        }
    }
}

/// A resolver configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResolvConf {
    pub nameservers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

impl ResolvConf {
    /// Parses the lines a resolv.conf may hold that matter here (the last `search` wins, as in
    /// glibc; `domain` is taken as a one-entry search).
    pub fn parse(text: &str) -> ResolvConf {
        let mut out = ResolvConf::default();
        for line in text.lines() {
            let line = line.split(['#', ';']).next().unwrap_or("");
            let mut words = line.split_whitespace();
            match words.next() {
                Some("nameserver") => out.nameservers.extend(words.next().map(str::to_string)),
                Some("search") | Some("domain") => out.searches = words.map(str::to_string).collect(),
                Some("options") => out.options.extend(words.map(str::to_string)),
                _ => {}
            }
        }
        out
    }

    /// The file's text, as container runtimes write it.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if !self.searches.is_empty() {
            out.push_str(&format!("search {}\n", self.searches.join(" ")));
        }
        for ns in &self.nameservers {
            out.push_str(&format!("nameserver {ns}\n"));
        }
        if !self.options.is_empty() {
            out.push_str(&format!("options {}\n", self.options.join(" ")));
        }
        out
    }
}

fn omit_duplicates(list: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    list.into_iter().filter(|s| seen.insert(s.clone())).collect()
}

/// Upstream's `mergeDNSOptions`: the pod's options replace the same-named base ones.
fn merge_options(base: &[String], pod: &[(String, Option<String>)]) -> Vec<String> {
    let mut merged: Vec<(String, Option<String>)> = Vec::new();
    let mut set = |name: &str, value: Option<String>| match merged.iter_mut().find(|(n, _)| n == name) {
        Some(entry) => entry.1 = value,
        None => merged.push((name.to_string(), value)),
    };
    for op in base {
        match op.split_once(':') {
            Some((n, v)) => set(n, Some(v.to_string())),
            None => set(op, None),
        }
    }
    for (n, v) in pod {
        set(n, v.clone());
    }
    merged
        .into_iter()
        .map(|(n, v)| match v.filter(|v| !v.is_empty()) {
            Some(v) => format!("{n}:{v}"),
            None => n,
        })
        .collect()
}

/// What the pod's resolv.conf holds, and the warnings the kubelet would record as events (reason,
/// message), e.g. `MissingClusterDNS` when ClusterFirst is asked of a node without cluster DNS.
pub fn pod_dns(pod: &Pod, node: &NodeDns) -> (ResolvConf, Vec<(&'static str, String)>) {
    let spec = pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    let policy = spec.and_then(|s| s.dns_policy.as_deref()).unwrap_or("ClusterFirst");
    let mut warnings = Vec::new();
    let host = ResolvConf::parse(&node.host_resolv_conf);
    let cluster = match policy {
        "None" => None,
        "ClusterFirstWithHostNet" => Some(true),
        "ClusterFirst" if !host_network => Some(true),
        _ => Some(false),
    };
    let mut conf = match cluster {
        None => ResolvConf::default(),
        Some(true) if !node.cluster_dns.is_empty() => {
            let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
            let domain = &node.cluster_domain;
            let mut searches = vec![format!("{ns}.svc.{domain}"), format!("svc.{domain}"), domain.clone()];
            searches.extend(host.searches.clone());
            ResolvConf {
                nameservers: node.cluster_dns.iter().map(IpAddr::to_string).collect(),
                searches: omit_duplicates(searches),
                options: vec!["ndots:5".to_string()],
            }
        }
        Some(true) => {
            warnings.push((
                "MissingClusterDNS",
                "kubelet does not have ClusterDNS IP configured and cannot create Pod using \"ClusterFirst\" policy. \
                 Falling back to \"Default\" policy."
                    .to_string(),
            ));
            host
        }
        Some(false) => host,
    };
    if let Some(dc) = spec.and_then(|s| s.dns_config.as_ref()) {
        let mut servers = std::mem::take(&mut conf.nameservers);
        servers.extend(dc.nameservers.clone().unwrap_or_default());
        conf.nameservers = omit_duplicates(servers);
        let mut searches = std::mem::take(&mut conf.searches);
        searches.extend(dc.searches.clone().unwrap_or_default());
        conf.searches = omit_duplicates(searches);
        let pod_options: Vec<(String, Option<String>)> = dc
            .options
            .iter()
            .flatten()
            .filter_map(|o| o.name.clone().map(|n| (n, o.value.clone())))
            .collect();
        conf.options = merge_options(&conf.options, &pod_options);
    }
    // Upstream's formDNSConfigFitsLimits.
    if conf.nameservers.len() > MAX_NAMESERVERS {
        conf.nameservers.truncate(MAX_NAMESERVERS);
        warnings.push((
            "DNSConfigForming",
            format!(
                "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: {}",
                conf.nameservers.join(" ")
            ),
        ));
    }
    let mut chars = 0;
    let mut kept = 0;
    for s in &conf.searches {
        if kept == MAX_SEARCHES || chars + s.len() + usize::from(kept > 0) > MAX_SEARCH_CHARS {
            break;
        }
        chars += s.len() + usize::from(kept > 0);
        kept += 1;
    }
    if kept < conf.searches.len() {
        conf.searches.truncate(kept);
        warnings.push((
            "DNSConfigForming",
            format!(
                "Search Line limits were exceeded, some search paths have been omitted, the applied search line is: {}",
                conf.searches.join(" ")
            ),
        ));
    }
    (conf, warnings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "shop"}, "spec": spec})).unwrap()
    }

    fn node(cluster: bool) -> NodeDns {
        NodeDns {
            cluster_dns: if cluster {
                vec!["10.96.0.10".parse().unwrap()]
            } else {
                Vec::new()
            },
            cluster_domain: "cluster.local".into(),
            host_resolv_conf: "# host\nnameserver 192.0.2.53\nsearch corp.example\noptions timeout:2\n".into(),
        }
    }

    #[test]
    fn cluster_first_searches_the_namespace_first() {
        let (conf, warnings) = pod_dns(&pod(json!({"containers": []})), &node(true));
        assert!(warnings.is_empty());
        assert_eq!(
            conf.render(),
            "search shop.svc.cluster.local svc.cluster.local cluster.local corp.example\nnameserver 10.96.0.10\noptions ndots:5\n"
        );
        // A host-network pod asks for the cluster explicitly or gets the node's resolver.
        let host = pod(json!({"hostNetwork": true, "containers": []}));
        assert_eq!(pod_dns(&host, &node(true)).0.nameservers, ["192.0.2.53"]);
        let with = pod(json!({"hostNetwork": true, "dnsPolicy": "ClusterFirstWithHostNet", "containers": []}));
        assert_eq!(pod_dns(&with, &node(true)).0.nameservers, ["10.96.0.10"]);
    }

    #[test]
    fn default_none_and_dns_config() {
        let (conf, _) = pod_dns(&pod(json!({"dnsPolicy": "Default", "containers": []})), &node(true));
        assert_eq!(
            conf.render(),
            "search corp.example\nnameserver 192.0.2.53\noptions timeout:2\n"
        );
        let none = pod(json!({"dnsPolicy": "None", "containers": [], "dnsConfig": {
            "nameservers": ["1.2.3.4"], "searches": ["ns1.svc.cluster-domain.example", "my.dns.search.suffix"],
            "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}]}}));
        assert_eq!(
            pod_dns(&none, &node(true)).0.render(),
            "search ns1.svc.cluster-domain.example my.dns.search.suffix\nnameserver 1.2.3.4\noptions ndots:2 edns0\n"
        );
        let merged = pod(
            json!({"containers": [], "dnsConfig": {"nameservers": ["10.96.0.10", "9.9.9.9"],
            "options": [{"name": "ndots", "value": "1"}]}}),
        );
        let (conf, _) = pod_dns(&merged, &node(true));
        assert_eq!(conf.nameservers, ["10.96.0.10", "9.9.9.9"]);
        assert_eq!(conf.options, ["ndots:1"]);
    }

    #[test]
    fn missing_cluster_dns_falls_back_with_upstream_warning_and_limits_hold() {
        let (conf, warnings) = pod_dns(&pod(json!({"containers": []})), &node(false));
        assert_eq!(conf.nameservers, ["192.0.2.53"]);
        assert_eq!(warnings[0].0, "MissingClusterDNS");
        let many = pod(json!({"dnsPolicy": "None", "containers": [], "dnsConfig": {
            "nameservers": ["1.1.1.1", "2.2.2.2", "3.3.3.3", "4.4.4.4"]}}));
        let (conf, warnings) = pod_dns(&many, &node(true));
        assert_eq!(conf.nameservers.len(), 3);
        assert_eq!(
            warnings[0].1,
            "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: 1.1.1.1 2.2.2.2 3.3.3.3"
        );
    }
}
