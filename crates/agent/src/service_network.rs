//! What makes Services work on this node: the proxy (kube-proxy's role, [`crate::proxy`]) and
//! cluster DNS (CoreDNS's, [`crate::dns`]), started by the agent once its Node is registered.
//!
//! - The service CIDR comes from the cluster's `kubernetes` ServiceCIDR (upstream's proxier reads
//!   ServiceCIDRs too); the proxy's table is named after it ([`proxy::table_name`]).
//! - Pods sit on the node's pod network ([`crate::pod_network`]): the cluster CIDR (or, on
//!   Docker's default `bridge` network, that network's subnet) is the proxy's cluster CIDR
//!   (traffic from elsewhere to a ClusterIP is masqueraded) and its gateway, the node's own
//!   address on that network, is where cluster DNS listens (port 53, or any free port when 53 is taken, such as by
//!   a second cluster's agent on the same host). Listening there rather than on every address keeps
//!   the forwarding resolver away from other machines.
//! - The agent publishes where its DNS listens as the EndpointSlice `kube-dns-NODE` of
//!   `kube-system/kube-dns` (owned by the Node, so it goes with it), and kube-dns has
//!   `internalTrafficPolicy: Local`: every node's pods ask their own node's agent.
//! - Pods get the kube-dns ClusterIP as their name server ([`ServiceNetwork::cluster_dns`]).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use anyhow::Context;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Api;
use kube::api::{Patch, PatchParams};

use crate::dns::{self, ClusterDns, DnsSockets};
use crate::pod_network::PodNetwork;
use crate::proxy::{self, Ipv4Cidr, NodeInfo, Proxier, ProxierConfig, ProxyOptions};

/// The namespace and name of the cluster DNS Service.
pub const DNS_NAMESPACE: &str = "kube-system";
pub const DNS_SERVICE: &str = "kube-dns";
/// Who writes the kube-dns EndpointSlices (`endpointslice.kubernetes.io/managed-by`).
pub const DNS_SLICE_MANAGER: &str = "node-agent.skiff.io";
/// The port cluster DNS tries first.
const DNS_PORT: u16 = 53;

/// Which of the two roles run (both by default; `--disable-kube-proxy`, `--disable-cluster-dns`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceNetworkConfig {
    pub proxy: bool,
    pub dns: bool,
}

impl Default for ServiceNetworkConfig {
    fn default() -> Self {
        Self { proxy: true, dns: true }
    }
}

/// The running roles. Dropping it stops the proxier's sync task (the table stays, as kube-proxy's).
pub struct ServiceNetwork {
    /// The name servers pods are given (the kube-dns ClusterIP), empty when cluster DNS does not run.
    pub cluster_dns: Vec<IpAddr>,
    /// The proxier, when it runs.
    pub proxier: Option<Proxier>,
    /// Where cluster DNS listens, when it runs.
    pub dns_addr: Option<SocketAddr>,
    /// The pod bridge, whose ports the agent puts in hairpin mode when the proxy runs.
    pub hairpin_bridge: Option<String>,
    /// The service CIDR and the nftables table the proxy keeps for it, when it runs.
    pub proxied: Option<(Ipv4Cidr, String)>,
}

/// Puts every port of the Linux bridge `bridge` in hairpin mode, as the kubelet's
/// `--hairpin-mode=hairpin-veth` does for its pods' veths: a pod's connection to its own Service
/// that the proxy sends back to the pod itself leaves the bridge through the port it came in by,
/// which the bridge otherwise refuses (the SYN is dropped, and its retransmission picks another
/// endpoint a second later).
pub fn set_hairpin_mode(bridge: &str) -> anyhow::Result<()> {
    let ports = std::path::Path::new("/sys/class/net").join(bridge).join("brif");
    let entries = std::fs::read_dir(&ports).with_context(|| format!("listing {}", ports.display()))?;
    for entry in entries {
        let path = entry.context("listing the bridge's ports")?.path().join("hairpin_mode");
        if std::fs::read_to_string(&path).is_ok_and(|v| v.trim() == "1") {
            continue;
        }
        if let Err(e) = std::fs::write(&path, "1") {
            // A port that went away meanwhile: nothing to do for it.
            if e.kind() != std::io::ErrorKind::NotFound {
                return Err(e).with_context(|| format!("writing {}", path.display()));
            }
        }
    }
    Ok(())
}

/// The cluster's service CIDR: the first IPv4 range of the `kubernetes` ServiceCIDR, or the
/// default when the API server has none.
pub async fn service_cidr(client: &kube::Client) -> anyhow::Result<Ipv4Cidr> {
    let cidrs = Api::<ServiceCIDR>::all(client.clone())
        .get_opt("kubernetes")
        .await
        .context("getting the kubernetes ServiceCIDR")?
        .and_then(|c| c.spec)
        .and_then(|s| s.cidrs)
        .unwrap_or_default();
    Ok(cidrs
        .iter()
        .find_map(|c| c.parse::<Ipv4Cidr>().ok())
        .unwrap_or(proxy::DEFAULT_SERVICE_CIDR))
}

/// The kube-dns Service's ClusterIPs, when it exists.
async fn dns_service_ips(client: &kube::Client) -> anyhow::Result<Vec<IpAddr>> {
    let service = Api::<Service>::namespaced(client.clone(), DNS_NAMESPACE)
        .get_opt(DNS_SERVICE)
        .await
        .context("getting the kube-dns Service")?;
    let spec = service.and_then(|s| s.spec);
    let ips = spec.as_ref().and_then(|s| s.cluster_ips.clone()).unwrap_or_default();
    Ok(ips.iter().filter_map(|ip| ip.parse().ok()).collect())
}

/// The EndpointSlice saying where `node`'s cluster DNS listens.
pub fn dns_endpoint_slice(node: &Node, addr: SocketAddr) -> EndpointSlice {
    let node_name = node.metadata.name.clone().unwrap_or_default();
    let labels = BTreeMap::from([
        (proxy::SERVICE_NAME_LABEL.to_string(), DNS_SERVICE.to_string()),
        (
            "endpointslice.kubernetes.io/managed-by".to_string(),
            DNS_SLICE_MANAGER.to_string(),
        ),
        ("k8s-app".to_string(), DNS_SERVICE.to_string()),
    ]);
    let owner = OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node_name.clone(),
        uid: node.metadata.uid.clone().unwrap_or_default(),
        ..Default::default()
    };
    let port = |name: &str, protocol: &str| EndpointPort {
        name: Some(name.into()),
        port: Some(i32::from(addr.port())),
        protocol: Some(protocol.into()),
        app_protocol: None,
    };
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(dns_slice_name(&node_name)),
            namespace: Some(DNS_NAMESPACE.into()),
            labels: Some(labels),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        address_type: if addr.is_ipv4() { "IPv4" } else { "IPv6" }.into(),
        endpoints: vec![Endpoint {
            addresses: vec![addr.ip().to_string()],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                serving: Some(true),
                terminating: Some(false),
            }),
            node_name: Some(node_name),
            ..Default::default()
        }],
        ports: Some(vec![port("dns", "UDP"), port("dns-tcp", "TCP")]),
    }
}

/// `kube-dns-NODE`, cut to the 253 characters a name may have.
fn dns_slice_name(node: &str) -> String {
    let mut name = format!("{DNS_SERVICE}-{node}");
    name.truncate(253);
    name.trim_end_matches(['-', '.']).to_string()
}

/// Writes (server-side apply) the kube-dns EndpointSlice of this node.
async fn publish_dns_endpoint(client: &kube::Client, node: &Node, addr: SocketAddr) -> anyhow::Result<()> {
    let slice = dns_endpoint_slice(node, addr);
    let name = slice.metadata.name.clone().unwrap_or_default();
    let mut value = serde_json::to_value(&slice).context("encoding the kube-dns EndpointSlice")?;
    value["apiVersion"] = "discovery.k8s.io/v1".into();
    value["kind"] = "EndpointSlice".into();
    Api::<EndpointSlice>::namespaced(client.clone(), DNS_NAMESPACE)
        .patch(
            &name,
            &PatchParams::apply(DNS_SLICE_MANAGER).force(),
            &Patch::Apply(value),
        )
        .await
        .with_context(|| format!("writing the EndpointSlice {DNS_NAMESPACE}/{name}"))?;
    Ok(())
}

/// Binds cluster DNS on `ip`, port 53 when free, another port otherwise.
async fn bind_dns(ip: IpAddr) -> anyhow::Result<DnsSockets> {
    match DnsSockets::bind(SocketAddr::new(ip, DNS_PORT)).await {
        Ok(sockets) => Ok(sockets),
        Err(e) => {
            tracing::info!(error = %format!("{e:#}"), "cluster DNS: port 53 is taken; using another");
            DnsSockets::bind(SocketAddr::new(ip, 0)).await
        }
    }
}

/// Starts what `config` asks for on this node (registered as `node`, reachable at `node_ip`)
/// reading through `client` (the network's identity, [`crate::parts`]) and writing its DNS
/// EndpointSlice through `node_client` (the node's own), in
/// tasks of its own: it returns once DNS listens and its EndpointSlice is written. A role that
/// cannot start is logged and left out; the pods still run.
pub async fn start(
    node_client: &kube::Client,
    client: &kube::Client,
    pods: &PodNetwork,
    node: &Node,
    node_ip: IpAddr,
    cluster_domain: &str,
    config: ServiceNetworkConfig,
) -> ServiceNetwork {
    let mut running = ServiceNetwork {
        cluster_dns: Vec::new(),
        proxier: None,
        dns_addr: None,
        hairpin_bridge: None,
        proxied: None,
    };
    if !config.proxy && !config.dns {
        return running;
    }
    if config.proxy {
        match service_cidr(client).await {
            Ok(cidr) => {
                let node_info = NodeInfo {
                    name: node.metadata.name.clone().unwrap_or_default(),
                    addresses: match node_ip {
                        IpAddr::V4(v4) => vec![v4],
                        IpAddr::V6(_) => Vec::new(),
                    },
                };
                let options = ProxyOptions {
                    cluster_cidr: pods.cluster_cidr.or(pods.subnet),
                    ..ProxyOptions::for_service_cidr(cidr)
                };
                tracing::info!(service_cidr = %cidr, table = %options.table, "starting the service proxy");
                running.proxied = Some((cidr, options.table.clone()));
                let proxier = Proxier::start(ProxierConfig::new(node_info, options));
                let feed = proxier.clone();
                let c = client.clone();
                tokio::spawn(async move {
                    if let Err(e) = proxy::run(c, feed).await {
                        tracing::error!(error = %format!("{e:#}"), "the service proxy stopped");
                    }
                });
                running.proxier = Some(proxier);
                running.hairpin_bridge = pods.bridge.clone();
            }
            Err(e) => tracing::error!(error = %format!("{e:#}"), "no service proxy"),
        }
    }
    if config.dns {
        match start_dns(node_client, client, node, pods, cluster_domain).await {
            Ok((addr, ips)) => {
                running.dns_addr = Some(addr);
                running.cluster_dns = ips;
            }
            Err(e) => tracing::error!(error = %format!("{e:#}"), "no cluster DNS on this node"),
        }
    }
    running
}

async fn start_dns(
    node_client: &kube::Client,
    client: &kube::Client,
    node: &Node,
    pods: &PodNetwork,
    cluster_domain: &str,
) -> anyhow::Result<(SocketAddr, Vec<IpAddr>)> {
    let ip = pods
        .gateway
        .context("the pod network has no gateway address to serve DNS on")?;
    let ips = dns_service_ips(client).await?;
    anyhow::ensure!(!ips.is_empty(), "the kube-dns Service has no ClusterIP");
    let sockets = bind_dns(IpAddr::V4(ip)).await?;
    let addr = sockets.local_addr()?;
    let resolv = tokio::fs::read_to_string("/etc/resolv.conf").await.unwrap_or_default();
    let upstreams = dns::upstreams_from_resolv_conf(&resolv);
    let index: Arc<ClusterDns> = ClusterDns::new(cluster_domain);
    tokio::spawn(dns::run(client.clone(), index.clone()));
    tokio::spawn(async move {
        if let Err(e) = dns::serve_sockets(index, sockets, upstreams).await {
            tracing::error!(error = %format!("{e:#}"), "cluster DNS stopped");
        }
    });
    publish_dns_endpoint(node_client, node, addr).await?;
    Ok((addr, ips))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dns_slice_names_its_service_node_and_port() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "uid": "u-1"}
        }))
        .expect("a Node");
        let slice = dns_endpoint_slice(&node, "172.17.0.1:10053".parse().expect("an address"));
        assert_eq!(slice.metadata.name.as_deref(), Some("kube-dns-n1"));
        let labels = slice.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels[proxy::SERVICE_NAME_LABEL], "kube-dns");
        assert_eq!(
            slice.metadata.owner_references.as_ref().map(|o| o[0].uid.as_str()),
            Some("u-1")
        );
        assert_eq!(slice.endpoints[0].addresses, ["172.17.0.1"]);
        assert_eq!(slice.endpoints[0].node_name.as_deref(), Some("n1"));
        let ports = slice.ports.unwrap_or_default();
        let ports: Vec<_> = ports
            .iter()
            .map(|p| (p.name.as_deref(), p.protocol.as_deref(), p.port))
            .collect();
        assert_eq!(
            ports,
            [
                (Some("dns"), Some("UDP"), Some(10053)),
                (Some("dns-tcp"), Some("TCP"), Some(10053))
            ]
        );
        assert_eq!(dns_slice_name(&"x".repeat(300)).len(), 253);
    }
}
