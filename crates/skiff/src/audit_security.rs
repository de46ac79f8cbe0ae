//! `skiff audit security`: what a reviewer checks first on a running cluster, read from its live
//! state (in the spirit of kube-bench, for this cluster's own objects): anonymous access, grants
//! to `system:masters` and of cluster-wide Secret reads, namespaces without a Pod Security level,
//! pods the `baseline` level would refuse, and node agents that answer a caller without
//! credentials. Each finding comes with the kubectl command that fixes it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding};
use kube::Api;
use kube::api::ListParams;
use skiff_api::podsecurity::{self, Level, LevelVersion, Version};
use skiff_rbac::{Attributes, PolicyRule};

/// One thing a reviewer should look at.
pub struct Finding {
    pub title: String,
    pub details: Vec<String>,
    pub fixes: Vec<String>,
}

/// Whether an object is one of the system's default roles or bindings (upstream's and Skiff's
/// bootstrap policy, reconciled at every start): what they grant is Kubernetes' own design, not
/// a finding.
fn is_default(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(skiff_rbac::bootstrap::BOOTSTRAPPING_LABEL))
        .is_some_and(|v| v == skiff_rbac::bootstrap::BOOTSTRAPPING_VALUE)
}

/// Namespaces of the system's own, which a Pod Security level is not expected on.
const SYSTEM_NAMESPACES: &[&str] = &["kube-system", "kube-public", "kube-node-lease"];

fn subjects(s: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>) -> Vec<(String, String)> {
    s.iter().flatten().map(|s| (s.kind.clone(), s.name.clone())).collect()
}

fn rules_of(role: &ClusterRole) -> Vec<PolicyRule> {
    role.rules
        .iter()
        .flatten()
        .filter_map(|r| serde_json::to_value(r).ok())
        .filter_map(|v| serde_json::from_value(v).ok())
        .collect()
}

pub async fn run(client: kube::Client) -> anyhow::Result<Vec<Finding>> {
    let mut findings = Vec::new();
    let crbs = Api::<ClusterRoleBinding>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing ClusterRoleBindings")?;
    let rbs = Api::<RoleBinding>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing RoleBindings")?;
    let roles: BTreeMap<String, ClusterRole> = Api::<ClusterRole>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing ClusterRoles")?
        .items
        .into_iter()
        .map(|r| (r.metadata.name.clone().unwrap_or_default(), r))
        .collect();

    // Anonymous access.
    let anonymous = |s: &(String, String)| {
        (s.0 == "Group" && s.1 == "system:unauthenticated") || (s.0 == "User" && s.1 == "system:anonymous")
    };
    let mut f = Finding {
        title: "Bindings that grant unauthenticated callers".into(),
        details: Vec::new(),
        fixes: Vec::new(),
    };
    for b in &crbs.items {
        let name = b.metadata.name.clone().unwrap_or_default();
        if !is_default(&b.metadata) && subjects(&b.subjects).iter().any(anonymous) {
            f.details
                .push(format!("ClusterRoleBinding {name} -> ClusterRole {}", b.role_ref.name));
            f.fixes.push(format!("kubectl delete clusterrolebinding {name}"));
        }
    }
    for b in &rbs.items {
        let name = b.metadata.name.clone().unwrap_or_default();
        let ns = b.metadata.namespace.clone().unwrap_or_default();
        if !is_default(&b.metadata) && subjects(&b.subjects).iter().any(anonymous) {
            f.details.push(format!(
                "RoleBinding {ns}/{name} -> {} {}",
                b.role_ref.kind, b.role_ref.name
            ));
            f.fixes.push(format!("kubectl delete rolebinding {name} -n {ns}"));
        }
    }
    findings.push(f);

    // system:masters is trusted without any authorizer: only certificates should carry it.
    let mut f = Finding {
        title: "Bindings naming system:masters (trusted by certificate alone; the break-glass kubeconfig is DATA_DIR/super-admin.kubeconfig)".into(),
        details: Vec::new(),
        fixes: Vec::new(),
    };
    for b in &crbs.items {
        let name = b.metadata.name.clone().unwrap_or_default();
        if !is_default(&b.metadata) && subjects(&b.subjects).iter().any(|s| s.1 == "system:masters") {
            f.details
                .push(format!("ClusterRoleBinding {name} -> ClusterRole {}", b.role_ref.name));
            f.fixes.push(format!("kubectl delete clusterrolebinding {name}"));
        }
    }
    findings.push(f);

    // Who may read every Secret.
    let read_secrets = Attributes::resource("list", "", "secrets", "", "");
    let mut f = Finding {
        title: "Subjects that may read Secrets in every namespace (besides the system's own default bindings)".into(),
        details: Vec::new(),
        fixes: Vec::new(),
    };
    for b in &crbs.items {
        let name = b.metadata.name.clone().unwrap_or_default();
        if is_default(&b.metadata) {
            continue;
        }
        let Some(role) = roles.get(&b.role_ref.name) else {
            continue;
        };
        if !rules_of(role).iter().any(|r| r.allows(&read_secrets)) {
            continue;
        }
        let who: Vec<String> = subjects(&b.subjects)
            .into_iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        if who.is_empty() {
            continue;
        }
        f.details.push(format!(
            "ClusterRoleBinding {name} -> ClusterRole {}: {}",
            b.role_ref.name,
            who.join(", ")
        ));
        f.fixes.push(format!(
            "kubectl delete clusterrolebinding {name}   # grant what is needed per namespace with a RoleBinding instead"
        ));
    }
    findings.push(f);

    // Namespaces without a Pod Security level, and pods baseline would refuse.
    let namespaces = Api::<Namespace>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing Namespaces")?;
    let mut f = Finding {
        title: "Namespaces without a Pod Security enforce level".into(),
        details: Vec::new(),
        fixes: Vec::new(),
    };
    for ns in &namespaces.items {
        let name = ns.metadata.name.clone().unwrap_or_default();
        let labelled = ns
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(podsecurity::ENFORCE_LABEL));
        if !labelled && !SYSTEM_NAMESPACES.contains(&name.as_str()) {
            f.details.push(name.clone());
            f.fixes.push(format!(
                "kubectl label namespace {name} {}=baseline",
                podsecurity::ENFORCE_LABEL
            ));
        }
    }
    findings.push(f);
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing Pods")?;
    let baseline = LevelVersion {
        level: Level::Baseline,
        version: Version::Latest,
    };
    let mut f = Finding {
        title: "Pods the baseline Pod Security level would refuse (privileged, host namespaces, host paths, ...)"
            .into(),
        details: Vec::new(),
        fixes: Vec::new(),
    };
    for pod in &pods.items {
        let value = serde_json::to_value(pod)?;
        let Some(view) = podsecurity::pod_view(&value) else {
            continue;
        };
        let verdict = podsecurity::evaluate(baseline, &view);
        if verdict.allowed() {
            continue;
        }
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        f.details.push(format!("{ns}/{name}: {}", verdict.details()));
        f.fixes.push(format!(
            "kubectl get pod {name} -n {ns} -o yaml   # drop what baseline refuses, then: kubectl label namespace {ns} {}=baseline",
            podsecurity::ENFORCE_LABEL
        ));
    }
    findings.push(f);

    // Node agents that answer a caller without credentials.
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing Nodes")?;
    let mut f = Finding {
        title: "Node agents that answer a caller without credentials".into(),
        details: Vec::new(),
        fixes: Vec::new(),
    };
    for node in &nodes.items {
        let name = node.metadata.name.clone().unwrap_or_default();
        let status = node.status.as_ref();
        let port = status
            .and_then(|s| s.daemon_endpoints.as_ref())
            .and_then(|d| d.kubelet_endpoint.as_ref())
            .map(|k| k.port)
            .unwrap_or(0);
        let address = status
            .and_then(|s| s.addresses.as_ref())
            .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
            .map(|a| a.address.clone());
        let (Some(address), Ok(port)) = (address, u16::try_from(port)) else {
            continue;
        };
        if port == 0 {
            continue;
        }
        match unauthenticated_status(&address, port).await {
            Ok(code) if code == 401 || code == 403 => {}
            Ok(code) => {
                f.details.push(format!(
                    "{name} ({address}:{port}) answered {code} to a request without credentials"
                ));
                f.fixes.push(format!("upgrade the agent on {name}: every agent of this release authorizes each caller through the API server"));
            }
            Err(e) => {
                tracing::debug!(node = %name, error = %format!("{e:#}"), "the agent could not be reached from here")
            }
        }
    }
    findings.push(f);
    Ok(findings)
}

/// The status a node agent answers to `GET /healthz` without credentials.
async fn unauthenticated_status(address: &str, port: u16) -> anyhow::Result<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(skiff_agent::probes::AnyCertificate(provider)))
        .with_no_client_auth();
    let tcp = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect((address, port)))
        .await
        .context("connecting")??;
    let name = rustls::pki_types::ServerName::try_from("node-agent")?.to_owned();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await?;
    tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: node-agent\r\nConnection: close\r\n\r\n")
        .await?;
    let mut head = vec![0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(2), tls.read(&mut head))
        .await
        .context("reading the answer")??;
    let line = String::from_utf8_lossy(&head[..n]).to_string();
    line.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("an answer that is no HTTP status line: {line:?}"))
}

/// Prints the findings, each with its fixes; the number of findings.
pub fn print(findings: &[Finding]) -> usize {
    let mut count = 0;
    for f in findings {
        if f.details.is_empty() {
            println!("[ok] {}: none", f.title);
            continue;
        }
        count += f.details.len();
        println!("[!!] {}: {}", f.title, f.details.len());
        for d in &f.details {
            println!("     {d}");
        }
        let mut fixes = f.fixes.clone();
        fixes.dedup();
        for fix in fixes {
            println!("     fix: {fix}");
        }
    }
    println!("{count} finding(s)");
    count
}
