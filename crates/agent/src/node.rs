//! The Node object: registration with real capacity, node info, addresses and conditions; the Lease
//! in `kube-node-lease` renewed every 10 seconds; periodic status updates.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use bollard::Docker;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Namespace, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeStatus, NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};

pub const KUBELET_VERSION: &str = "v1.33.0";
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
const LEASE_DURATION_SECONDS: i32 = 40;
const LEASE_RENEW: Duration = Duration::from_secs(10);
const STATUS_EVERY: Duration = Duration::from_secs(60);
const MAX_PODS: i64 = 110;
/// Upstream's default hard eviction threshold for memory.available.
const EVICTION_MEMORY: i128 = 100 * 1024 * 1024;

/// What the node reports about itself.
#[derive(Clone, Debug)]
pub struct NodeFacts {
    pub name: String,
    pub hostname: String,
    pub internal_ip: String,
    pub cpus: i64,
    pub memory_bytes: i128,
    pub storage_bytes: i128,
    pub kernel: String,
    pub os_image: String,
    pub runtime_version: String,
    pub arch: String,
    pub machine_id: String,
    pub boot_id: String,
    pub kubelet_port: i32,
    pub labels: BTreeMap<String, String>,
    /// SHA-256 (hex) of the agent endpoint's certificate, published for the API server to pin.
    pub serving_cert_sha256: Option<String>,
}

/// The Node annotation carrying [`NodeFacts::serving_cert_sha256`].
pub const SERVING_CERT_ANNOTATION: &str = "skiff.dev/serving-cert-sha256";

impl NodeFacts {
    pub fn allocatable_memory(&self) -> i128 {
        (self.memory_bytes - EVICTION_MEMORY).max(0)
    }

    /// Upstream's nodefs.available hard eviction default is 10%.
    pub fn allocatable_storage(&self) -> i128 {
        self.storage_bytes * 9 / 10
    }
}

fn go_arch(arch: &str) -> String {
    match arch {
        "x86_64" => "amd64".into(),
        "aarch64" => "arm64".into(),
        "armv7l" => "arm".into(),
        other => other.into(),
    }
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The address other machines reach this host on: the source address of the default route.
pub fn detect_host_ip() -> IpAddr {
    let probe = || -> std::io::Result<IpAddr> {
        let socket = std::net::UdpSocket::bind("0.0.0.0:0")?;
        socket.connect("10.255.255.255:9")?;
        Ok(socket.local_addr()?.ip())
    };
    probe().unwrap_or(IpAddr::from([127, 0, 0, 1]))
}

fn disk_bytes(path: &Path) -> i128 {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return 0;
    };
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c_path is a valid NUL-terminated string and stat a properly sized out-parameter.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) };
    if rc != 0 {
        return 0;
    }
    i128::from(stat.f_blocks) * i128::from(stat.f_frsize)
}

/// Gathers the facts from the engine and the host.
pub async fn gather(
    docker: &Docker,
    name: &str,
    data_dir: &Path,
    ip: Option<IpAddr>,
    port: i32,
) -> anyhow::Result<NodeFacts> {
    let info = docker.info().await.context("reading the Docker Engine's info")?;
    let version = docker.version().await.context("reading the Docker Engine's version")?;
    tokio::fs::create_dir_all(data_dir)
        .await
        .with_context(|| format!("creating {}", data_dir.display()))?;
    let arch = go_arch(info.architecture.as_deref().unwrap_or(std::env::consts::ARCH));
    let hostname = read_trimmed("/proc/sys/kernel/hostname");
    let mut labels = BTreeMap::new();
    labels.insert("kubernetes.io/hostname".to_string(), name.to_string());
    labels.insert("kubernetes.io/os".to_string(), "linux".to_string());
    labels.insert("kubernetes.io/arch".to_string(), arch.clone());
    labels.insert("beta.kubernetes.io/os".to_string(), "linux".to_string());
    labels.insert("beta.kubernetes.io/arch".to_string(), arch.clone());
    Ok(NodeFacts {
        name: name.to_string(),
        hostname: if hostname.is_empty() {
            name.to_string()
        } else {
            hostname
        },
        internal_ip: ip.unwrap_or_else(detect_host_ip).to_string(),
        cpus: info.ncpu.unwrap_or(1),
        memory_bytes: i128::from(info.mem_total.unwrap_or(0)),
        storage_bytes: disk_bytes(data_dir),
        kernel: info.kernel_version.clone().unwrap_or_default(),
        os_image: info.operating_system.clone().unwrap_or_default(),
        runtime_version: format!("docker://{}", version.version.unwrap_or_default()),
        arch,
        machine_id: read_trimmed("/etc/machine-id"),
        boot_id: read_trimmed("/proc/sys/kernel/random/boot_id"),
        kubelet_port: port,
        serving_cert_sha256: None,
        labels,
    })
}

fn ki(bytes: i128) -> Quantity {
    Quantity(format!("{}Ki", bytes / 1024))
}

/// The Node's status as this agent reports it.
pub fn node_status(
    facts: &NodeFacts,
    now: jiff::Timestamp,
    previous: Option<&NodeStatus>,
    pressure: crate::eviction::Pressure,
) -> NodeStatus {
    let mut capacity = BTreeMap::new();
    capacity.insert("cpu".to_string(), Quantity(facts.cpus.to_string()));
    capacity.insert("memory".to_string(), ki(facts.memory_bytes));
    capacity.insert("ephemeral-storage".to_string(), ki(facts.storage_bytes));
    capacity.insert("pods".to_string(), Quantity(MAX_PODS.to_string()));
    capacity.insert("hugepages-1Gi".to_string(), Quantity("0".into()));
    capacity.insert("hugepages-2Mi".to_string(), Quantity("0".into()));
    let mut allocatable = capacity.clone();
    allocatable.insert("memory".to_string(), ki(facts.allocatable_memory()));
    allocatable.insert(
        "ephemeral-storage".to_string(),
        Quantity(facts.allocatable_storage().to_string()),
    );
    let condition = |type_: &str, status: &str, reason: &str, message: &str| {
        let transition = previous
            .and_then(|p| p.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == type_ && c.status == status))
            .and_then(|c| c.last_transition_time.clone())
            .unwrap_or(Time(now));
        NodeCondition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: Some(reason.to_string()),
            message: Some(message.to_string()),
            last_heartbeat_time: Some(Time(now)),
            last_transition_time: Some(transition),
        }
    };
    NodeStatus {
        capacity: Some(capacity),
        allocatable: Some(allocatable),
        conditions: Some(vec![
            if pressure.memory {
                condition(
                    "MemoryPressure",
                    "True",
                    "KubeletHasInsufficientMemory",
                    "kubelet has insufficient memory available",
                )
            } else {
                condition(
                    "MemoryPressure",
                    "False",
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                )
            },
            if pressure.disk {
                condition(
                    "DiskPressure",
                    "True",
                    "KubeletHasDiskPressure",
                    "kubelet has disk pressure",
                )
            } else {
                condition(
                    "DiskPressure",
                    "False",
                    "KubeletHasNoDiskPressure",
                    "kubelet has no disk pressure",
                )
            },
            if pressure.pid {
                condition(
                    "PIDPressure",
                    "True",
                    "KubeletHasInsufficientPID",
                    "kubelet has insufficient PID available",
                )
            } else {
                condition(
                    "PIDPressure",
                    "False",
                    "KubeletHasSufficientPID",
                    "kubelet has sufficient PID available",
                )
            },
            condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
        ]),
        addresses: Some(vec![
            NodeAddress {
                type_: "InternalIP".into(),
                address: facts.internal_ip.clone(),
            },
            NodeAddress {
                type_: "Hostname".into(),
                address: facts.hostname.clone(),
            },
        ]),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint {
                port: facts.kubelet_port,
            }),
        }),
        node_info: Some(NodeSystemInfo {
            machine_id: facts.machine_id.clone(),
            system_uuid: facts.machine_id.clone(),
            boot_id: facts.boot_id.clone(),
            kernel_version: facts.kernel.clone(),
            os_image: facts.os_image.clone(),
            container_runtime_version: facts.runtime_version.clone(),
            kubelet_version: KUBELET_VERSION.into(),
            kube_proxy_version: String::new(),
            operating_system: "linux".into(),
            architecture: facts.arch.clone(),
            swap: None,
        }),
        ..Default::default()
    }
}

/// Creates the Node or, when it exists, merges our labels in; then writes its status.
pub async fn register(client: &kube::Client, facts: &NodeFacts) -> anyhow::Result<Node> {
    let api: Api<Node> = Api::all(client.clone());
    let mut annotations = BTreeMap::from([
        ("node.alpha.kubernetes.io/ttl".to_string(), "0".to_string()),
        (
            "volumes.kubernetes.io/controller-managed-attach-detach".to_string(),
            "true".to_string(),
        ),
    ]);
    if let Some(hash) = &facts.serving_cert_sha256 {
        annotations.insert(SERVING_CERT_ANNOTATION.to_string(), hash.clone());
    }
    let node = Node {
        metadata: ObjectMeta {
            name: Some(facts.name.clone()),
            labels: Some(facts.labels.clone()),
            annotations: Some(annotations.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    match api.create(&PostParams::default(), &node).await {
        Ok(_) => tracing::info!(node = %facts.name, "registered node"),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            // The endpoint's certificate is new on every start: publish its hash again.
            let patch = serde_json::json!({ "metadata": { "labels": facts.labels, "annotations": annotations } });
            api.patch(&facts.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .context("updating the node's labels")?;
        }
        Err(e) => return Err(e).context("registering the node"),
    }
    update_status(client, facts, Default::default()).await
}

pub async fn update_status(
    client: &kube::Client,
    facts: &NodeFacts,
    pressure: crate::eviction::Pressure,
) -> anyhow::Result<Node> {
    let api: Api<Node> = Api::all(client.clone());
    let current = api.get(&facts.name).await.context("reading the node")?;
    let status = node_status(facts, jiff::Timestamp::now(), current.status.as_ref(), pressure);
    let patch = serde_json::json!({ "status": status });
    api.patch_status(&facts.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .context("updating the node status")
}

/// Creates or renews the node's Lease.
pub async fn renew_lease(client: &kube::Client, facts: &NodeFacts, node_uid: Option<&str>) -> anyhow::Result<()> {
    let api: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let now = MicroTime(jiff::Timestamp::now());
    match api.get_opt(&facts.name).await.context("reading the node lease")? {
        Some(mut lease) => {
            let spec = lease.spec.get_or_insert_with(Default::default);
            spec.holder_identity = Some(facts.name.clone());
            spec.lease_duration_seconds = Some(LEASE_DURATION_SECONDS);
            spec.renew_time = Some(now);
            api.replace(&facts.name, &PostParams::default(), &lease)
                .await
                .context("renewing the node lease")?;
        }
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(facts.name.clone()),
                    namespace: Some(LEASE_NAMESPACE.into()),
                    owner_references: node_uid.map(|uid| {
                        vec![OwnerReference {
                            api_version: "v1".into(),
                            kind: "Node".into(),
                            name: facts.name.clone(),
                            uid: uid.to_string(),
                            ..Default::default()
                        }]
                    }),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(facts.name.clone()),
                    lease_duration_seconds: Some(LEASE_DURATION_SECONDS),
                    renew_time: Some(now),
                    ..Default::default()
                }),
            };
            match api.create(&PostParams::default(), &lease).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    let ns: Api<Namespace> = Api::all(client.clone());
                    let namespace = Namespace {
                        metadata: ObjectMeta {
                            name: Some(LEASE_NAMESPACE.into()),
                            ..Default::default()
                        },
                        ..Default::default()
                    };
                    let _ = ns.create(&PostParams::default(), &namespace).await;
                    api.create(&PostParams::default(), &lease)
                        .await
                        .context("creating the node lease")?;
                }
                Err(e) => return Err(e).context("creating the node lease"),
            }
        }
    }
    Ok(())
}

/// Renews the lease every 10 s and refreshes the node status every minute, and at once when the
/// node's pressure conditions change, forever. When the Node object disappears (deleted by hand or
/// by a controller), it is registered again.
pub async fn heartbeat(
    client: kube::Client,
    facts: NodeFacts,
    node_uid: Option<String>,
    mut pressure: tokio::sync::watch::Receiver<crate::eviction::Pressure>,
) {
    let mut node_uid = node_uid;
    let mut lease_tick = tokio::time::interval(LEASE_RENEW);
    let mut last_status = tokio::time::Instant::now();
    let mut pressure_open = true;
    loop {
        let mut changed = false;
        tokio::select! {
            _ = lease_tick.tick() => {
                if let Err(e) = renew_lease(&client, &facts, node_uid.as_deref()).await {
                    tracing::warn!(error = %format!("{e:#}"), "renewing the node lease");
                }
            }
            result = pressure.changed(), if pressure_open => match result {
                Ok(()) => changed = true,
                Err(_) => pressure_open = false,
            },
        }
        if changed || last_status.elapsed() >= STATUS_EVERY {
            last_status = tokio::time::Instant::now();
            let now_pressure = *pressure.borrow_and_update();
            match update_status(&client, &facts, now_pressure).await {
                Ok(_) => {}
                Err(e) if is_not_found(&e) => match register(&client, &facts).await {
                    Ok(node) => {
                        tracing::info!(node = %facts.name, "the Node object was gone; registered again");
                        node_uid = node.metadata.uid;
                    }
                    Err(e) => {
                        tracing::warn!(error = %format!("{e:#}"), "registering the node again")
                    }
                },
                Err(e) => tracing::warn!(error = %format!("{e:#}"), "updating the node status"),
            }
        }
    }
}

fn is_not_found(e: &anyhow::Error) -> bool {
    e.chain()
        .any(|c| matches!(c.downcast_ref::<kube::Error>(), Some(kube::Error::Api(s)) if s.code == 404))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> NodeFacts {
        NodeFacts {
            name: "n1".into(),
            hostname: "host1".into(),
            internal_ip: "10.0.0.2".into(),
            cpus: 2,
            memory_bytes: 4 * 1024 * 1024 * 1024,
            storage_bytes: 100 * 1024 * 1024 * 1024,
            kernel: "6.1.0".into(),
            os_image: "Debian GNU/Linux 12 (bookworm)".into(),
            runtime_version: "docker://20.10.24".into(),
            arch: "amd64".into(),
            machine_id: "m".into(),
            boot_id: "b".into(),
            kubelet_port: 10250,
            serving_cert_sha256: None,
            labels: BTreeMap::new(),
        }
    }

    #[test]
    fn status_reports_capacity_and_ready() {
        let now = jiff::Timestamp::from_second(1000).unwrap();
        let s = node_status(&facts(), now, None, Default::default());
        let cap = s.capacity.as_ref().unwrap();
        assert_eq!(cap["cpu"].0, "2");
        assert_eq!(cap["memory"].0, "4194304Ki");
        assert_eq!(cap["pods"].0, "110");
        assert_eq!(
            s.allocatable.as_ref().unwrap()["memory"].0,
            format!("{}Ki", 4194304 - 102400)
        );
        let ready = s
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready.reason.as_deref(), Some("KubeletReady"));
        assert_eq!(ready.message.as_deref(), Some("kubelet is posting ready status"));
        assert_eq!(s.daemon_endpoints.unwrap().kubelet_endpoint.unwrap().port, 10250);
        let info = s.node_info.unwrap();
        assert_eq!(info.kubelet_version, "v1.33.0");
        assert_eq!(info.container_runtime_version, "docker://20.10.24");
        // Transition times survive a refresh.
        let later = jiff::Timestamp::from_second(2000).unwrap();
        let again = node_status(
            &facts(),
            later,
            Some(&node_status(&facts(), now, None, Default::default())),
            Default::default(),
        );
        let ready = again
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready.last_transition_time, Some(Time(now)));
        assert_eq!(ready.last_heartbeat_time, Some(Time(later)));
        assert_eq!(go_arch("x86_64"), "amd64");
    }
}
