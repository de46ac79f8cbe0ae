//! `skiff bench services`: the node agent's Service roles against a real `skiff server` child.
//!
//! The whole benchmark runs in a network namespace of its own (`main` unshares it before the
//! runtime starts, see [`enter_private_network`]), so the proxy's table, the service CIDR's route
//! and the DNS listener never touch the host's network; only loopback is used there.
//!
//! 1. Creates `--services` ClusterIP Services and one EndpointSlice of `--endpoints` ready
//!    endpoints for each (no controllers run: the slices are the benchmark's own).
//! 2. Starts the proxy ([`skiff_agent::proxy`]) fed by watches over HTTPS, as a node agent runs
//!    it, and times its first full sync.
//! 3. Changes one EndpointSlice at a time (a random Service, one endpoint's address) and times
//!    from the API write to the rule being in force (the proxier holds the new resourceVersion and
//!    a sync put it in the kernel): kube-proxy's `network_programming_duration`, end to end.
//! 4. Serves cluster DNS ([`skiff_agent::dns`]) from the same API on 127.0.0.1 and loads it with
//!    A queries for the Services' names: as fast as `--dns-in-flight` outstanding queries allow,
//!    then paced at `--dns-rate` queries/s for latency.

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use skiff_agent::dns::{ClusterDns, DnsSockets};
use skiff_agent::proxy::{NodeInfo, Proxier, ProxierConfig, ProxyOptions};

use crate::bench::{ChildServer, percentile, print_result, wait_ready};

/// `skiff bench services` options.
#[derive(clap::Args, Clone, Debug)]
pub struct ServicesBench {
    #[arg(long, default_value_t = 1000)]
    pub services: usize,
    #[arg(long, default_value_t = 3)]
    pub endpoints: usize,
    /// EndpointSlice changes timed, one at a time.
    #[arg(long, default_value_t = 200)]
    pub changes: usize,
    /// Seconds of each DNS load.
    #[arg(long, default_value_t = 5)]
    pub dns_seconds: u64,
    /// Outstanding queries of the saturating DNS load.
    #[arg(long, default_value_t = 64)]
    pub dns_in_flight: usize,
    /// Queries per second of the paced DNS load (its latency is the figure).
    #[arg(long, default_value_t = 30_000)]
    pub dns_rate: u64,
}

/// Moves this process into a new network namespace with loopback up. Must run before any thread
/// starts: threads and child processes created afterwards inherit it.
pub fn enter_private_network() -> anyhow::Result<()> {
    // SAFETY: unshare takes flags only; no other thread exists yet.
    let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("entering a network namespace of its own (needs root)");
    }
    let status = std::process::Command::new("ip")
        .args(["link", "set", "lo", "up"])
        .status()
        .context("running ip link set lo up")?;
    anyhow::ensure!(status.success(), "ip link set lo up failed");
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn slice_for(i: usize, endpoints: usize, generation: usize) -> serde_json::Value {
    let eps: Vec<_> = (0..endpoints)
        .map(|e| {
            // 10.244.0.0/16 and up: distinct per Service, endpoint and generation.
            let n = (i * endpoints + e) as u32 + (generation as u32) * 1_000_003;
            let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + (n % (1 << 22)));
            json!({"addresses": [ip.to_string()], "conditions": {"ready": true, "serving": true, "terminating": false}})
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": format!("svc-{i}"), "namespace": "default",
                     "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": eps,
    })
}

async fn create_objects(client: &kube::Client, cfg: &ServicesBench) -> anyhow::Result<()> {
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(0..cfg.services)
        .map(|i| {
            let (services, slices, pp) = (services.clone(), slices.clone(), pp.clone());
            async move {
                let svc: Service = serde_json::from_value(json!({
                    "metadata": {"name": format!("svc-{i}")},
                    "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
                }))?;
                services.create(&pp, &svc).await.context("creating a Service")?;
                let slice: EndpointSlice = serde_json::from_value(slice_for(i, cfg.endpoints, 0))?;
                slices.create(&pp, &slice).await.context("creating an EndpointSlice")?;
                Ok(())
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Rule programming latency: `changes` EndpointSlice updates, one at a time.
async fn programming(
    client: &kube::Client,
    proxier: &Proxier,
    cfg: &ServicesBench,
) -> anyhow::Result<(Vec<f64>, serde_json::Value)> {
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let mut latencies = Vec::with_capacity(cfg.changes);
    for change in 0..cfg.changes {
        let i = rand::random_range(0..cfg.services);
        let name = format!("svc-{i}");
        let mut current = slices.get(&name).await.context("getting an EndpointSlice")?;
        let wanted: EndpointSlice = serde_json::from_value(slice_for(i, cfg.endpoints, change + 1))?;
        current.endpoints = wanted.endpoints;
        let start = Instant::now();
        let written = slices
            .replace(&name, &PostParams::default(), &current)
            .await
            .context("updating an EndpointSlice")?;
        let rv = written.metadata.resource_version.unwrap_or_default();
        let deadline = start + Duration::from_secs(30);
        while proxier.endpoint_slice_version("default", &name).as_deref() != Some(rv.as_str()) {
            anyhow::ensure!(Instant::now() < deadline, "the proxy never saw the change of {name}");
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        tokio::time::timeout(Duration::from_secs(30), proxier.synced())
            .await
            .context("the proxy never put the change in force")?;
        latencies.push(ms(start.elapsed()));
        // Changes arrive apart, as single Services' endpoints change in a cluster.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let last = proxier.last_sync();
    let detail = json!({
        "last_sync_build_ms": last.as_ref().map(|s| ms(s.build)),
        "last_sync_nft_ms": last.as_ref().map(|s| ms(s.nft)),
        "last_sync_bytes": last.as_ref().map(|s| s.transaction_bytes),
    });
    latencies.sort_by(f64::total_cmp);
    Ok((latencies, detail))
}

/// An A query for `name` with `id`.
fn query(id: u16, name: &str) -> Vec<u8> {
    let mut q = Vec::with_capacity(64);
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.').filter(|l| !l.is_empty()) {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

struct DnsLoad {
    answered: u64,
    errors: u64,
    latencies_ms: Vec<f64>,
    seconds: f64,
}

/// Sends A queries for the Services' names to `server` from one socket: `in_flight` outstanding
/// at most (closed loop) or, with `rate`, paced at that many per second (open loop). Every reply
/// must be NOERROR with an answer.
fn dns_load(
    server: SocketAddr,
    services: usize,
    seconds: u64,
    in_flight: usize,
    rate: Option<u64>,
) -> anyhow::Result<DnsLoad> {
    let socket = UdpSocket::bind("127.0.0.1:0").context("binding the load generator's socket")?;
    socket.connect(server).context("connecting to the DNS server")?;
    socket.set_read_timeout(Some(Duration::from_millis(200)))?;
    let receiver = socket.try_clone()?;
    let epoch = Instant::now();
    // Send time of each query id, in ns since `epoch` (0: none outstanding).
    let sent: Arc<Vec<AtomicU64>> = Arc::new((0..65_536).map(|_| AtomicU64::new(0)).collect());
    let outstanding = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let queries: Vec<Vec<u8>> = (0..services.max(1))
        .map(|i| query(0, &format!("svc-{i}.default.svc.cluster.local")))
        .collect();
    let recv = {
        let (sent, outstanding, done) = (sent.clone(), outstanding.clone(), done.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            let mut latencies = Vec::new();
            let (mut answered, mut errors) = (0u64, 0u64);
            loop {
                match receiver.recv(&mut buf) {
                    Ok(n) if n >= 12 => {
                        let id = u16::from_be_bytes([buf[0], buf[1]]);
                        let at = sent[usize::from(id)].swap(0, Ordering::AcqRel);
                        if at == 0 {
                            continue;
                        }
                        outstanding.fetch_sub(1, Ordering::AcqRel);
                        let now = epoch.elapsed().as_nanos() as u64;
                        latencies.push((now.saturating_sub(at)) as f64 / 1e6);
                        let rcode = buf[3] & 0x0f;
                        let answers = u16::from_be_bytes([buf[6], buf[7]]);
                        if rcode == 0 && answers > 0 {
                            answered += 1;
                        } else {
                            errors += 1;
                        }
                    }
                    Ok(_) => errors += 1,
                    Err(_) if done.load(Ordering::Acquire) => break,
                    Err(_) => {}
                }
            }
            (latencies, answered, errors)
        })
    };
    let end = epoch + Duration::from_secs(seconds);
    let mut id: u16 = 1;
    let mut n: u64 = 0;
    while Instant::now() < end {
        if let Some(rate) = rate {
            let due = epoch + Duration::from_nanos(n * 1_000_000_000 / rate.max(1));
            let now = Instant::now();
            if due > now {
                std::thread::sleep((due - now).min(Duration::from_micros(500)));
                continue;
            }
        } else if outstanding.load(Ordering::Acquire) >= in_flight as u64 {
            std::hint::spin_loop();
            std::thread::yield_now();
            continue;
        }
        id = id.wrapping_add(1).max(1);
        let slot = &sent[usize::from(id)];
        if slot.load(Ordering::Acquire) != 0 {
            // Still outstanding after 65,535 others: counted lost below.
            continue;
        }
        let mut q = queries[(n as usize) % queries.len()].clone();
        q[0..2].copy_from_slice(&id.to_be_bytes());
        slot.store((epoch.elapsed().as_nanos() as u64).max(1), Ordering::Release);
        outstanding.fetch_add(1, Ordering::AcqRel);
        if socket.send(&q).is_err() {
            slot.store(0, Ordering::Release);
            outstanding.fetch_sub(1, Ordering::AcqRel);
        }
        n += 1;
    }
    let seconds = epoch.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(300));
    done.store(true, Ordering::Release);
    let (mut latencies, answered, errors) = recv.join().map_err(|_| anyhow::anyhow!("the receiver panicked"))?;
    let lost = outstanding.load(Ordering::Acquire);
    latencies.sort_by(f64::total_cmp);
    Ok(DnsLoad {
        answered,
        errors: errors + lost,
        latencies_ms: latencies,
        seconds,
    })
}

fn load_json(load: &DnsLoad) -> serde_json::Value {
    json!({
        "queries_per_second": (load.answered as f64 / load.seconds).round(),
        "answered": load.answered,
        "errors_or_lost": load.errors,
        "p50_ms": percentile(&load.latencies_ms, 0.50),
        "p99_ms": percentile(&load.latencies_ms, 0.99),
        "max_ms": load.latencies_ms.last().copied().unwrap_or(0.0),
    })
}

pub async fn bench_services(cfg: ServicesBench, as_json: bool) -> anyhow::Result<()> {
    anyhow::ensure!(
        cfg.services > 0 && cfg.endpoints > 0,
        "--services and --endpoints must be positive"
    );
    let server = ChildServer::start(&["--no-agent", "--no-scheduler", "--no-controllers"]).await?;
    let client = server.client().await?;
    wait_ready(&client).await?;
    let start = Instant::now();
    create_objects(&client, &cfg).await?;
    let create_s = start.elapsed().as_secs_f64();

    // The proxy, fed by watches as in an agent.
    let node = NodeInfo {
        name: "bench-node".into(),
        addresses: Vec::new(),
    };
    let proxier = Proxier::start(ProxierConfig::new(node, ProxyOptions::default()));
    let feed = proxier.clone();
    let watch_client = client.clone();
    let feeding = tokio::spawn(async move { skiff_agent::proxy::run(watch_client, feed).await });
    let start = Instant::now();
    while proxier.last_sync().is_none_or(|s| s.service_ports < cfg.services) {
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(120),
            "the proxy's first sync never completed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let first = proxier.last_sync();
    let first_sync_ms = ms(start.elapsed());
    let (latencies, detail) = programming(&client, &proxier, &cfg).await?;
    feeding.abort();
    drop(proxier);

    // Cluster DNS from the same API, on loopback.
    let index = ClusterDns::new("cluster.local");
    let feeding = tokio::spawn(skiff_agent::dns::run(client.clone(), index.clone()));
    let sockets = DnsSockets::bind("127.0.0.1:0".parse()?).await?;
    let addr = sockets.local_addr()?;
    let serving = tokio::spawn(skiff_agent::dns::serve_sockets(index.clone(), sockets, Vec::new()));
    // Until every Service answers.
    let last = format!("svc-{}.default.svc.cluster.local", cfg.services - 1);
    let probe_deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ok = tokio::task::spawn_blocking({
            let last = last.clone();
            move || dns_load_probe(addr, &last)
        })
        .await
        .unwrap_or(false);
        if ok {
            break;
        }
        anyhow::ensure!(Instant::now() < probe_deadline, "cluster DNS never answered {last}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let services = cfg.services;
    let (seconds, in_flight, rate) = (cfg.dns_seconds, cfg.dns_in_flight, cfg.dns_rate);
    let saturated = tokio::task::spawn_blocking(move || dns_load(addr, services, seconds, in_flight, None)).await??;
    let paced = tokio::task::spawn_blocking(move || dns_load(addr, services, seconds, in_flight, Some(rate))).await??;
    feeding.abort();
    serving.abort();

    let result = json!({
        "services": cfg.services,
        "endpoints_per_service": cfg.endpoints,
        "objects_created_s": create_s,
        "proxy_first_full_sync_ms": first_sync_ms,
        "proxy_first_full_sync_nft_ms": first.as_ref().map(|s| ms(s.nft)),
        "rule_programming": {
            "changes": latencies.len(),
            "p50_ms": percentile(&latencies, 0.50),
            "p99_ms": percentile(&latencies, 0.99),
            "max_ms": latencies.last().copied().unwrap_or(0.0),
            "target_p99_ms": 100,
            "last_sync": detail,
        },
        "dns_saturated": load_json(&saturated),
        "dns_paced": {"rate": cfg.dns_rate, "result": load_json(&paced)},
        "dns_target": {"queries_per_second": 30_000, "p99_ms": 1.0},
    });
    print_result(&result, as_json);
    Ok(())
}

/// One query for `name`, answered NOERROR with an answer within a second.
fn dns_load_probe(server: SocketAddr, name: &str) -> bool {
    let Ok(socket) = UdpSocket::bind("127.0.0.1:0") else {
        return false;
    };
    if socket.set_read_timeout(Some(Duration::from_secs(1))).is_err() || socket.connect(server).is_err() {
        return false;
    }
    if socket.send(&query(7, name)).is_err() {
        return false;
    }
    let mut buf = [0u8; 1500];
    match socket.recv(&mut buf) {
        Ok(n) if n >= 12 => buf[3] & 0x0f == 0 && u16::from_be_bytes([buf[6], buf[7]]) > 0,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_names_its_id_and_question() {
        let q = query(0x1234, "svc-1.default.svc.cluster.local");
        let msg = hickory_proto::op::Message::from_vec(&q).expect("a DNS message");
        assert_eq!(msg.metadata.id, 0x1234);
        assert_eq!(msg.queries[0].name().to_ascii(), "svc-1.default.svc.cluster.local.");
        assert_eq!(msg.queries[0].query_type(), hickory_proto::rr::RecordType::A);
    }

    #[test]
    fn slices_of_each_generation_have_other_addresses() {
        let a = slice_for(3, 3, 0);
        let b = slice_for(3, 3, 1);
        assert_ne!(a["endpoints"], b["endpoints"]);
        assert_eq!(a["endpoints"].as_array().map(Vec::len), Some(3));
    }
}
