//! `skiff bench ...`: measured against a real `skiff server` child process over HTTPS.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Subcommand;
use serde_json::json;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Pod creates from many clients, a full list, and the server's memory.
    Api {
        #[arg(long, default_value_t = 10_000)]
        pods: usize,
        #[arg(long, default_value_t = 64)]
        clients: usize,
        #[arg(long)]
        json: bool,
        /// Create the pods as this user, allowed by a Role and RoleBinding in the namespace
        /// (default: the administrator, bound to cluster-admin by a ClusterRoleBinding).
        #[arg(long)]
        as_user: Option<String>,
        /// A flag for the measured server, as `skiff server` takes it (repeatable), e.g.
        /// `--server-arg=--audit-log-path=` to measure without the audit log.
        #[arg(long = "server-arg", allow_hyphen_values = true)]
        server_args: Vec<String>,
        /// Measure a server whose objects are in this etcd (`skiff server --etcd-servers`).
        #[arg(long)]
        etcd_servers: Option<String>,
        /// What to create: `Pod`, or any other kind name, which the benchmark defines first as a
        /// namespaced custom resource (group `bench.skiff.io`) whose structural schema validates
        /// the same body the pods carry.
        #[arg(long, default_value = "Pod")]
        kind: String,
        /// Label the namespace with this Pod Security level (enforce, audit and warn), so every
        /// create is evaluated; at `restricted` the pods carry what that level asks for.
        #[arg(long)]
        pod_security: Option<String>,
    },
    /// Scheduling throughput on upstream's scheduler_perf shapes.
    Scheduling {
        #[arg(long, default_value_t = 5000)]
        nodes: usize,
        #[arg(long, default_value_t = 10_000)]
        pods: usize,
        /// The scheduler_perf shape: basic, node-affinity, taints, topology-spread,
        /// preferred-topology-spread, default-topology-spread, node-inclusion-policy,
        /// pod-anti-affinity, pod-affinity, preferred-pod-affinity, preferred-pod-anti-affinity,
        /// mixed, pod-affinity-ns-selector, pod-anti-affinity-ns-selector,
        /// preferred-pod-affinity-ns-selector, preferred-pod-anti-affinity-ns-selector,
        /// preemption, secrets, in-tree-pvs, csi-pvs. The run fails when the final placement
        /// violates the pods' constraints.
        #[arg(long, default_value = "basic")]
        workload: String,
        /// Pod creations in flight at once.
        #[arg(long, default_value_t = 64)]
        clients: usize,
        /// Pods created and bound before the measured ones, per template of the workload's
        /// initial pods (scheduler_perf's initPods); the default is upstream's count for the
        /// workload's 5,000-node shape, in proportion to --nodes.
        #[arg(long)]
        init_pods: Option<usize>,
        /// Events the benchmark's scheduler writes at once (default: the scheduler's 8).
        #[arg(long)]
        event_writes: Option<usize>,
        /// Run against this cluster (for example one started under a profiler) instead of
        /// a fresh `skiff server` child; its nodes and pods are left alone.
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// Measure a fresh server whose objects are in this etcd (`skiff server --etcd-servers`).
        #[arg(long, conflicts_with = "kubeconfig")]
        etcd_servers: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// The node agent's Service roles: EndpointSlice change to rule in force at N Services, and
    /// cluster DNS answers per second and latency. Runs in a network namespace of its own (root).
    Services {
        #[command(flatten)]
        options: crate::bench_services::ServicesBench,
        #[arg(long)]
        json: bool,
    },
    /// `skiff cluster create` to every node Ready, then pod startup on a worker node (the
    /// cluster in a directory of its own, deleted afterwards; root).
    Cluster {
        #[arg(long, default_value_t = 3)]
        nodes: u8,
        #[arg(long, default_value_t = 30)]
        pods: usize,
        #[arg(long)]
        json: bool,
    },
    /// The API server's memory over rounds of ConfigMap creates and deletes, and after the
    /// compaction of their history.
    Churn {
        #[command(flatten)]
        options: crate::bench_churn::ChurnBench,
        #[arg(long)]
        json: bool,
    },
    /// Density with every controller running: Deployments of many replicas on simulated nodes
    /// (an in-process `skiff server --sim-nodes N`), until every pod is Running.
    Density {
        #[command(flatten)]
        options: crate::bench_density::DensityBench,
        #[arg(long)]
        json: bool,
    },
    /// Pod startup latency on this machine's node, next to the same work done directly in Docker.
    Startup {
        #[arg(long, default_value_t = 30)]
        pods: usize,
        #[arg(long, default_value = "busybox:latest")]
        image: String,
        #[arg(long)]
        json: bool,
    },
}

/// A `skiff server` child process on a free port with a temporary data dir.
pub struct ChildServer {
    child: std::process::Child,
    pub kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

impl ChildServer {
    pub async fn start(extra: &[&str]) -> anyhow::Result<ChildServer> {
        let exe = std::env::current_exe().context("locating the skiff binary")?;
        Self::start_binary(&exe, extra).await
    }

    /// A server run from `exe` when given (`--server-binary`: an earlier build, or a wrapper
    /// that runs one under a profiler), else from this binary.
    pub async fn start_from(exe: Option<&std::path::Path>, extra: &[&str]) -> anyhow::Result<ChildServer> {
        match exe {
            Some(exe) => Self::start_binary(exe, extra).await,
            None => Self::start(extra).await,
        }
    }

    /// How a report names the server's binary (`--server-binary`, or this one).
    pub fn binary_label(exe: Option<&std::path::Path>) -> String {
        exe.map(|p| p.display().to_string())
            .unwrap_or_else(|| "this binary".into())
    }

    /// A server run from another skiff binary (say, an earlier build, to compare).
    pub async fn start_binary(exe: &std::path::Path, extra: &[&str]) -> anyhow::Result<ChildServer> {
        let dir = tempfile::tempdir().context("creating a temp dir")?;
        let port = free_port()?;
        let kubeconfig = dir.path().join("kubeconfig");
        let child = std::process::Command::new(exe)
            .arg("server")
            .arg("--data-dir")
            .arg(dir.path())
            .arg("--port")
            .arg(port.to_string())
            .args(extra)
            .env("SKIFF_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting skiff server")?;
        let server = ChildServer {
            child,
            kubeconfig,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !server.kubeconfig.exists() {
            anyhow::ensure!(Instant::now() < deadline, "server did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(server)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        crate::client::kube_client(&self.kubeconfig).await
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client of `user`, whom a Role and RoleBinding in `default` allow to create and list pods
/// there (the bench server runs no controllers, so aggregated roles such as `edit` have no rules).
async fn user_client(
    server: &ChildServer,
    admin: &kube::Client,
    user: &str,
    target: &ApiTarget,
) -> anyhow::Result<kube::Client> {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "pod-writer"},
        "rules": [{"apiGroups": [target.group], "resources": [target.plural], "verbs": ["create", "get", "list"]}],
    }))?;
    kube::Api::<Role>::namespaced(admin.clone(), "default")
        .create(&Default::default(), &role)
        .await
        .context("creating the bench user's role")?;
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("{user}-pod-writer")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-writer"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }))?;
    kube::Api::<RoleBinding>::namespaced(admin.clone(), "default")
        .create(&Default::default(), &binding)
        .await
        .context("binding the bench user's role")?;
    let dir = server.kubeconfig.parent().context("the server's data dir")?;
    let text = skiff_apiserver::pki::user_kubeconfig(dir, None, user, None)?;
    let path = dir.join(format!("{user}.kubeconfig"));
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    crate::client::kube_client(&path).await
}

/// A `skiff agent` child process joining the cluster of a kubeconfig as node `node`, with a
/// temporary data dir. Killed on drop; its containers keep running (the agent never stops
/// containers when it exits), so whoever starts it removes them.
pub struct ChildAgent {
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl ChildAgent {
    pub fn start(kubeconfig: &std::path::Path, node: &str) -> anyhow::Result<ChildAgent> {
        let dir = tempfile::tempdir().context("creating a temp dir")?;
        let exe = std::env::current_exe().context("locating the skiff binary")?;
        let child = std::process::Command::new(exe)
            .arg("agent")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--node-name")
            .arg(node)
            .arg("--data-dir")
            .arg(dir.path())
            .env("SKIFF_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting skiff agent")?;
        Ok(ChildAgent { child, _dir: dir })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ChildAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

/// Resident memory of a process in MiB.
pub fn rss_mb(pid: u32) -> f64 {
    status_mb(pid, "VmRSS:")
}

/// The anonymous part of a process's resident memory in MiB (heap, stacks): what it holds of its own.
/// The rest is pages mapped from files, mostly the binary's code, shared by every process running it.
pub fn anon_rss_mb(pid: u32) -> f64 {
    status_mb(pid, "RssAnon:")
}

/// The peak of a process's resident memory in MiB (`VmHWM`).
pub fn peak_rss_mb(pid: u32) -> f64 {
    status_mb(pid, "VmHWM:")
}

/// The CPU time a process has used so far, user and system, in seconds (0 when unreadable).
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command's closing parenthesis: state is the first, utime the 12th,
    // stime the 13th; both in clock ticks (100 per second on Linux).
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// A `kB` field of `/proc/PID/status` in MiB (0 when unreadable).
fn status_mb(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

pub async fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Startup { pods, image, json } => bench_startup(pods, &image, json).await,
        BenchCommand::Cluster { nodes, pods, json } => bench_cluster(nodes, pods, json).await,
        BenchCommand::Api {
            pods,
            clients,
            json,
            as_user,
            mut server_args,
            etcd_servers,
            kind,
            pod_security,
        } => {
            if let Some(etcd) = etcd_servers {
                server_args.push(format!("--etcd-servers={etcd}"));
            }
            let mut target = ApiTarget::new(&kind)?;
            if let Some(level) = pod_security {
                skiff_api::podsecurity::Level::parse(&level)
                    .map_err(|e| anyhow::anyhow!("--pod-security {level:?}: {e}"))?;
                target.pod_security = Some(level);
            }
            bench_api(pods, clients, json, as_user, &server_args, &target).await
        }
        BenchCommand::Services { options, json } => crate::bench_services::bench_services(options, json).await,
        BenchCommand::Churn { options, json } => crate::bench_churn::bench_churn(options, json).await,
        BenchCommand::Density { options, json } => crate::bench_density::bench_density(options, json).await,
        BenchCommand::Scheduling {
            nodes,
            pods,
            workload,
            clients,
            init_pods,
            event_writes,
            kubeconfig,
            etcd_servers,
            json,
        } => {
            let (_server, client) = match kubeconfig {
                Some(path) => (None, crate::client::kube_client_h2(&path).await?),
                None => {
                    let etcd_flag = etcd_servers.map(|e| format!("--etcd-servers={e}"));
                    let mut flags = vec!["--no-agent", "--no-scheduler", "--no-controllers"];
                    flags.extend(etcd_flag.as_deref());
                    let server = ChildServer::start(&flags).await?;
                    let client = crate::client::kube_client_h2(&server.kubeconfig).await?;
                    (Some(server), client)
                }
            };
            wait_ready(&client).await?;
            let result = skiff_bench::bench(
                client,
                skiff_bench::BenchConfig {
                    nodes,
                    pods,
                    workload: workload.parse()?,
                    clients,
                    init_pods,
                    event_writes,
                    ..Default::default()
                },
            )
            .await?;
            print_result(&serde_json::to_value(&result)?, json);
            Ok(())
        }
    }
}

pub(crate) async fn wait_ready(client: &kube::Client) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let req = http::Request::get("/readyz").body(Vec::new())?;
        if client.request_text(req).await.is_ok() {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "server never became ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Most bench servers run no controllers: namespace `default`'s account is made as its
    // controller would.
    skiff_bench::scheduling::default_service_account(client, "default").await
}

pub(crate) fn print_result(v: &serde_json::Value, as_json: bool) {
    if as_json {
        println!("{v}");
    } else if let Some(m) = v.as_object() {
        for (k, val) in m {
            println!("{k:>20}: {val}");
        }
    }
}

async fn bench_api(
    pods: usize,
    clients: usize,
    as_json: bool,
    as_user: Option<String>,
    server_args: &[String],
    target: &ApiTarget,
) -> anyhow::Result<()> {
    let mut flags = vec!["--no-agent", "--no-scheduler", "--no-controllers"];
    flags.extend(server_args.iter().map(String::as_str));
    let server = ChildServer::start(&flags).await?;
    let client = server.client().await?;
    wait_ready(&client).await?;
    target.install(&client).await?;
    let client = match &as_user {
        Some(user) => user_client(&server, &client, user, target).await?,
        None => client,
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle_rss = rss_mb(server.pid());
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..clients.max(1) {
        let client = client.clone();
        let next = next.clone();
        let target = target.clone();
        handles.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= pods {
                    break;
                }
                // Bodies are prepared JSON and answers are read as bytes: the client's own
                // serialization stays out of the server's figures.
                let body = serde_json::to_vec(&target.object(i))?;
                let req = http::Request::post(target.path.as_str())
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(body)?;
                let t = Instant::now();
                client
                    .request_text(req)
                    .await
                    .with_context(|| format!("creating {} {i}", target.kind))?;
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            anyhow::Ok(lat)
        }));
    }
    let mut lat = Vec::with_capacity(pods);
    for h in handles {
        lat.extend(h.await.context("client task")??);
    }
    let elapsed = start.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    // A full list without paging: the time until the last byte has arrived (decoding the
    // objects into typed values is the client's cost, not the server's). The median of five.
    let mut list_times = Vec::new();
    let mut listed = 0;
    for _ in 0..5 {
        let t = Instant::now();
        let req = http::Request::get(target.path.as_str()).body(Vec::new())?;
        let text = client.request_text(req).await.context("listing")?;
        list_times.push(t.elapsed().as_secs_f64() * 1000.0);
        let list: serde_json::Value = serde_json::from_str(&text).context("decoding the list")?;
        listed = list["items"].as_array().map(Vec::len).unwrap_or(0);
    }
    list_times.sort_by(f64::total_cmp);
    let list_ms = list_times[list_times.len() / 2];
    anyhow::ensure!(listed == pods, "listed {listed} objects, created {pods}");
    let rss = rss_mb(server.pid());
    let result = json!({
        "kind": target.kind,
        "pods": pods,
        "clients": clients,
        "user": as_user.as_deref().unwrap_or("skiff-admin"),
        "pod_security": target.pod_security.as_deref().unwrap_or("privileged"),
        "creates_per_second": (pods as f64 / elapsed).round(),
        "p50_ms": round2(percentile(&lat, 0.50)),
        "p99_ms": round2(percentile(&lat, 0.99)),
        "list_ms": round2(list_ms),
        "rss_mb": round2(rss),
        "idle_rss_mb": round2(idle_rss),
    });
    print_result(&result, as_json);
    Ok(())
}

/// Wait until the agent's node reports Ready; fails at once if the agent process exits.
async fn wait_node_ready(client: &kube::Client, name: &str, agent: &mut ChildAgent) -> anyhow::Result<()> {
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = agent.child.try_wait().context("checking the agent process")? {
            anyhow::bail!("skiff agent exited before its node was Ready: {status}");
        }
        if let Ok(Some(n)) = nodes.get_opt(name).await {
            let ready = n
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            if ready {
                return Ok(());
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "node {name} did not become Ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Wait (bounded) until the benchmark's pods are gone, so the agent has stopped their containers.
async fn wait_no_pods(client: &kube::Client) {
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(client.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        match pods.list(&Default::default()).await {
            Ok(l) if l.items.is_empty() => return,
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Remove whatever containers the benchmark's node left (the agent never stops containers
/// when it exits).
async fn remove_node_containers(docker: &bollard::Docker, node: &str) {
    let filters = std::collections::HashMap::from([(
        "label".to_string(),
        vec![skiff_agent::docker::label(skiff_agent::docker::LABEL_NODE, node)],
    )]);
    let opts = bollard::query_parameters::ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    for c in docker.list_containers(Some(opts)).await.unwrap_or_default() {
        if let Some(id) = c.id {
            let rm = bollard::query_parameters::RemoveContainerOptionsBuilder::default()
                .force(true)
                .build();
            if let Err(e) = docker.remove_container(&id, Some(rm)).await {
                tracing::warn!(container = %id, error = %e, "removing a benchmark container");
            }
        }
    }
}

async fn bench_cluster(nodes: u8, pods: usize, as_json: bool) -> anyhow::Result<()> {
    anyhow::ensure!(nodes >= 2, "--nodes: a cluster with a worker node takes at least 2");
    let dir = tempfile::tempdir().context("a directory for the cluster")?;
    let name = "bench".to_string();
    let opts = skiff_cluster::CreateOptions {
        name: name.clone(),
        nodes,
        server_args: vec![],
        // No eviction on this machine's disk while measuring (kind's thresholds).
        agent_args: vec!["--eviction-hard=memory.available<1Mi,nodefs.available<1Mi,imagefs.available<1Mi".into()],
        images: vec![],
        skiff: std::env::current_exe().context("finding this binary")?,
        timeout: Duration::from_secs(120),
    };
    let started = Instant::now();
    let created = skiff_cluster::create(dir.path(), opts).await;
    let create_s = started.elapsed().as_secs_f64();
    let measured = async {
        let c = created?;
        let client = crate::client::kube_client(&c.kubeconfig()).await?;
        let worker = format!("{name}-worker");
        let opts = |n: usize| skiff_bench::StartupBench {
            pods: n,
            node_selector: [("kubernetes.io/hostname".to_string(), worker.clone())].into(),
            ..Default::default()
        };
        let single = skiff_bench::bench_startup(client.clone(), opts(1)).await?;
        let many = skiff_bench::bench_startup(client, opts(pods)).await?;
        anyhow::Ok((single, many))
    }
    .await;
    // Whatever happened, nothing of the cluster stays.
    if let Err(e) = skiff_cluster::delete(dir.path(), &name).await {
        tracing::warn!(error = %e, "deleting the benchmark's cluster");
    }
    let (single, many) = measured?;
    let result = json!({
        "nodes": nodes,
        "create_to_ready_s": round2(create_s),
        "pods": pods,
        "single_ms": round2(single.p50_ms),
        "p50_ms": round2(many.p50_ms),
        "p99_ms": round2(many.p99_ms),
    });
    print_result(&result, as_json);
    Ok(())
}

async fn bench_startup(pods: usize, image: &str, as_json: bool) -> anyhow::Result<()> {
    let docker = skiff_agent::docker::connect().await?;
    // A node of its own, so that nothing else's containers are touched. The agent runs as its own
    // process, as on a real node, so that its memory is measured apart from the control plane's.
    let node = format!("skiff-bench-{:x}", jiff::Timestamp::now().as_millisecond());
    let server = ChildServer::start(&["--no-agent", "--no-controllers"]).await?;
    let client = server.client().await?;
    wait_ready(&client).await?;
    let mut agent = ChildAgent::start(&server.kubeconfig, &node)?;
    let measured = async {
        wait_node_ready(&client, &node, &mut agent).await?;
        // Through the scheduler, as any pod, onto the agent's node (the only one there is).
        let opts = |n: usize| skiff_bench::StartupBench {
            pods: n,
            namespace: "default".into(),
            node_name: None,
            node_selector: [("kubernetes.io/hostname".to_string(), node.clone())].into(),
            image: image.to_string(),
            timeout: Duration::from_secs(300),
        };
        let single = skiff_bench::bench_startup(client.clone(), opts(1)).await?;
        let docker_single = skiff_bench::startup::bench_docker_direct(&docker, 1, image).await?;
        let (many, memory) = skiff_bench::startup::bench_startup_with(client.clone(), opts(pods), || {
            (rss_mb(agent.pid()), anon_rss_mb(agent.pid()), rss_mb(server.pid()))
        })
        .await?;
        anyhow::Ok((single, docker_single, many, memory))
    }
    .await;
    // Whatever happened: the pods are deleted (bench_startup does that), the agent removes their
    // containers, and whatever it left is removed here, since the agent never stops containers when
    // it exits.
    wait_no_pods(&client).await;
    drop(agent);
    drop(server);
    remove_node_containers(&docker, &node).await;
    let (single, docker_single, many, (agent_rss, agent_anon, server_rss)) = measured?;
    let docker_many = skiff_bench::startup::bench_docker_direct(&docker, pods, image).await?;
    let result = json!({
        "node": node,
        "pods": pods,
        "single_ms": round2(single.p50_ms),
        "docker_single_ms": round2(docker_single.p50_ms),
        "p50_ms": round2(many.p50_ms),
        "p99_ms": round2(many.p99_ms),
        "docker_p50_ms": round2(docker_many.p50_ms),
        "docker_p99_ms": round2(docker_many.p99_ms),
        "agent_rss_mb_with_pods": round2(agent_rss),
        "agent_anon_rss_mb_with_pods": round2(agent_anon),
        "server_rss_mb_with_pods": round2(server_rss),
    });
    print_result(&result, as_json);
    Ok(())
}

pub(crate) fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// What `skiff bench api` creates: pods, or a custom kind the benchmark defines.
#[derive(Clone)]
struct ApiTarget {
    kind: String,
    group: String,
    plural: String,
    /// The collection in namespace `default`.
    path: String,
    /// The Pod Security level namespace `default` is labelled with.
    pod_security: Option<String>,
}

/// The custom kinds' API group.
const BENCH_GROUP: &str = "bench.skiff.io";

impl ApiTarget {
    fn new(kind: &str) -> anyhow::Result<ApiTarget> {
        if kind == "Pod" {
            return Ok(ApiTarget {
                kind: kind.into(),
                group: String::new(),
                plural: "pods".into(),
                path: "/api/v1/namespaces/default/pods".into(),
                pod_security: None,
            });
        }
        anyhow::ensure!(
            kind.chars().next().is_some_and(|c| c.is_ascii_uppercase())
                && kind.chars().all(|c| c.is_ascii_alphanumeric()),
            "--kind {kind:?}: a kind is an upper-case letter followed by letters and digits"
        );
        let plural = format!("{}s", kind.to_ascii_lowercase());
        Ok(ApiTarget {
            kind: kind.into(),
            group: BENCH_GROUP.into(),
            path: format!("/apis/{BENCH_GROUP}/v1/namespaces/default/{plural}"),
            plural,
            pod_security: None,
        })
    }

    /// Defines the custom kind (nothing for pods) and waits until it is served; labels the
    /// namespace with the Pod Security level asked for.
    async fn install(&self, client: &kube::Client) -> anyhow::Result<()> {
        if let Some(level) = &self.pod_security {
            let labels: serde_json::Map<String, serde_json::Value> = ["enforce", "audit", "warn"]
                .iter()
                .map(|mode| (format!("pod-security.kubernetes.io/{mode}"), json!(level)))
                .collect();
            kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
                .patch(
                    "default",
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(json!({"metadata": {"labels": labels}})),
                )
                .await
                .context("labelling namespace default with its Pod Security level")?;
        }
        if self.group.is_empty() {
            return Ok(());
        }
        let crd = bench_crd(&self.kind, &self.plural);
        let req = http::Request::post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(serde_json::to_vec(&crd)?)?;
        client
            .request_text(req)
            .await
            .with_context(|| format!("defining the custom kind {}", self.kind))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let req = http::Request::get(self.path.as_str()).body(Vec::new())?;
            match client.request_text(req).await {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!(error = %e, "the custom kind is not served yet");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e).context("the custom kind was never served"),
            }
        }
    }

    fn object(&self, i: usize) -> serde_json::Value {
        let mut object = bench_pod(i);
        if !self.group.is_empty() {
            object["apiVersion"] = json!(format!("{BENCH_GROUP}/v1"));
            object["kind"] = json!(self.kind);
        }
        if self.pod_security.as_deref() == Some("restricted") {
            object["spec"]["securityContext"] =
                json!({"runAsNonRoot": true, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}});
            object["spec"]["containers"][0]["securityContext"] =
                json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}});
        }
        object
    }
}

/// A CustomResourceDefinition whose structural schema checks every field of [`bench_pod`]'s
/// body, with the kind of constraints pods' own validation applies (required fields, name
/// formats, lengths, a quantity's pattern), so its creates pay for schema validation.
fn bench_crd(kind: &str, plural: &str) -> serde_json::Value {
    let quantity = json!({
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "x-kubernetes-int-or-string": true,
        "pattern": "^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))))?$",
    });
    let container = json!({
        "type": "object",
        "required": ["name", "image"],
        "properties": {
            "name": {"type": "string", "maxLength": 63, "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
            "image": {"type": "string", "minLength": 1},
            "command": {"type": "array", "items": {"type": "string"}},
            "resources": {
                "type": "object",
                "properties": {
                    "requests": {"type": "object", "additionalProperties": quantity},
                    "limits": {"type": "object", "additionalProperties": quantity},
                },
            },
        },
    });
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{BENCH_GROUP}")},
        "spec": {
            "group": BENCH_GROUP,
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.to_ascii_lowercase(), "listKind": format!("{kind}List")},
            "versions": [{
                "name": "v1",
                "served": true,
                "storage": true,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "required": ["containers"],
                            "properties": {
                                "schedulerName": {"type": "string", "maxLength": 253},
                                "containers": {
                                    "type": "array",
                                    "minItems": 1,
                                    "items": container,
                                    "x-kubernetes-list-type": "map",
                                    "x-kubernetes-list-map-keys": ["name"],
                                },
                            },
                        },
                    },
                }},
            }],
        },
    })
}

fn bench_pod(i: usize) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": format!("bench-{i:06}"), "labels": {"app": "bench", "shard": (i % 16).to_string()}},
        "spec": {
            "schedulerName": "bench-no-scheduler",
            "containers": [{
                "name": "app",
                "image": "busybox:latest",
                "command": ["sleep", "3600"],
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
            }],
        },
    })
}
