//! Leader election end to end: `skiff server --leader-elect` holds kube-system's
//! kube-scheduler, kube-controller-manager and skiff-sim Leases as this process, its parts work,
//! and a standby elector (another identity, over HTTPS with the admin kubeconfig) cannot take the
//! scheduler's Lease while the server renews it, takes it once the server was stopped (SIGSTOP)
//! longer than the lease, while the server, resumed, schedules nothing; the server takes it back
//! when the standby releases it.

#![cfg(test)]

mod common;

use std::time::{Duration, Instant};

use common::{Cluster, eventually};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use skiff_leaderelection::{Config, LeaderElector, Record};

const LEASES: [&str; 3] = ["kube-scheduler", "kube-controller-manager", "skiff-sim"];

/// Short timings, so that the test waits seconds rather than upstream's 15 s.
fn timing() -> Config {
    Config {
        lease_duration: Duration::from_secs(4),
        renew_deadline: Duration::from_secs(3),
        retry_period: Duration::from_millis(500),
    }
}

fn start() -> Cluster {
    Cluster::start(&[
        "--no-agent",
        "--sim-nodes",
        "2",
        "--leader-elect",
        "--leader-elect-lease-duration",
        "4s",
        "--leader-elect-renew-deadline",
        "3s",
        "--leader-elect-retry-period",
        "500ms",
    ])
}

/// `HOST_UUID`, as upstream's components name themselves.
fn is_process_identity(id: &str) -> bool {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let Some(uuid) = id.strip_prefix(&format!("{}_", host.trim())) else {
        return false;
    };
    uuid.len() == 36
        && uuid.char_indices().all(|(i, ch)| {
            if [8, 13, 18, 23].contains(&i) {
                ch == '-'
            } else {
                ch.is_ascii_hexdigit()
            }
        })
}

struct Standby {
    rt: tokio::runtime::Runtime,
    leases: Api<Lease>,
    elector: LeaderElector,
}

impl Standby {
    fn new(c: &Cluster) -> Standby {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let client = rt.block_on(async {
            let kubeconfig = kube::config::Kubeconfig::read_from(&c.kubeconfig).unwrap();
            let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .unwrap();
            kube::Client::try_from(config).unwrap()
        });
        let elector = LeaderElector::new(
            client.clone(),
            "kube-system",
            "kube-scheduler",
            "standby_00000000-0000-0000-0000-000000000001",
            timing(),
        )
        .unwrap();
        Standby {
            leases: Api::namespaced(client, "kube-system"),
            rt,
            elector,
        }
    }

    fn try_acquire_or_renew(&mut self) -> bool {
        self.rt.block_on(self.elector.try_acquire_or_renew())
    }

    fn record(&self, name: &str) -> Option<(Record, String)> {
        let lease = self.rt.block_on(self.leases.get_opt(name)).unwrap()?;
        let rv = lease.metadata.resource_version.clone().unwrap_or_default();
        Some((Record::from_lease(&lease), rv))
    }
}

fn signal(c: &Cluster, sig: i32) {
    // SAFETY: kill(2) on the server this test started.
    let rc = unsafe { libc::kill(c.pid() as i32, sig) };
    assert_eq!(rc, 0, "kill({}, {sig})", c.pid());
}

fn running_pods(c: &Cluster, selector: &str) -> Vec<(String, String)> {
    let out = c.k(&[
        "get",
        "pods",
        "-l",
        selector,
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.phase}{\"\\n\"}{end}",
    ]);
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && f[2] == "Running").then(|| (f[0].to_string(), f[1].to_string()))
        })
        .collect()
}

#[test]
fn server_leads_while_it_renews_and_a_standby_takes_over_after_a_stop() {
    let mut c = start();
    let mut standby = Standby::new(&c);

    // Every elected part's Lease, held by this process under one identity, as upstream writes it.
    let server_id = eventually(Duration::from_secs(20), || {
        let records: Vec<Record> = LEASES
            .iter()
            .filter_map(|n| standby.record(n))
            .map(|(r, _)| r)
            .collect();
        (records.len() == 3 && records.iter().all(|r| r.holder_identity == records[0].holder_identity))
            .then(|| records[0].holder_identity.clone())
    })
    .expect("the three Leases held by the server");
    assert!(is_process_identity(&server_id), "{server_id}");
    for name in LEASES {
        let (r, _) = standby.record(name).unwrap();
        assert_eq!(r.lease_duration_seconds, 4, "{name}");
        assert_eq!(r.leader_transitions, 0, "{name}");
        assert!(
            r.acquire_time.is_some() && r.renew_time >= r.acquire_time,
            "{name}: {r:?}"
        );
    }
    let (before, _) = standby.record("kube-scheduler").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let (after, _) = standby.record("kube-scheduler").unwrap();
    assert!(
        after.renew_time > before.renew_time,
        "renewed: {before:?} then {after:?}"
    );
    assert_eq!(after.acquire_time, before.acquire_time);

    // The controllers, the scheduler and the simulated nodes work.
    c.k(&["create", "deployment", "web", "--image=nginx", "--replicas=2"]);
    let pods = eventually(Duration::from_secs(60), || {
        let pods = running_pods(&c, "app=web");
        (pods.len() == 2).then_some(pods)
    })
    .unwrap_or_else(|| panic!("web not Running: {}", c.k(&["get", "pods", "-o", "wide"])));
    assert!(pods.iter().all(|(_, node)| node.starts_with("sim-node-")), "{pods:?}");

    // While the server renews, the standby cannot take the Lease.
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        assert!(!standby.try_acquire_or_renew(), "taken from a renewing server");
        assert_eq!(standby.elector.leader(), server_id);
        std::thread::sleep(Duration::from_millis(200));
    }

    // Stop the server just after a renewal (so none is in flight), for longer than the lease.
    let (last, _) = standby.record("kube-scheduler").unwrap();
    eventually(Duration::from_secs(3), || {
        (standby.record("kube-scheduler").unwrap().0.renew_time != last.renew_time).then_some(())
    })
    .expect("a renewal");
    assert!(!standby.try_acquire_or_renew(), "the standby saw the last renewal");
    signal(&c, libc::SIGSTOP);
    let stopped = Instant::now();
    std::thread::sleep(Duration::from_secs(5));
    signal(&c, libc::SIGCONT);
    assert!(stopped.elapsed() > timing().lease_duration);

    // Resumed, the server's renewal deadline is long past: the standby, which has seen the
    // record stand still for the lease, takes it at its next attempt.
    let resumed = Instant::now();
    let took = eventually(Duration::from_secs(3), || {
        standby.try_acquire_or_renew().then(Instant::now)
    })
    .expect("the standby took the Lease over");
    assert!(took - resumed < Duration::from_secs(3));
    let (taken, _) = standby.record("kube-scheduler").unwrap();
    assert_eq!(taken.holder_identity, standby.elector.identity());
    assert_eq!(taken.leader_transitions, 1);

    // While the standby holds it, the server writes nothing as its holder and schedules nothing.
    c.k(&["run", "lonely", "--image=nginx", "--labels=app=lonely"]);
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        assert!(
            standby.try_acquire_or_renew(),
            "the server took the Lease back from a renewing holder"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let (held, _) = standby.record("kube-scheduler").unwrap();
    assert_eq!(held.holder_identity, standby.elector.identity());
    assert_eq!(held.leader_transitions, 1);
    let node = c.k(&["get", "pod", "lonely", "-o", "jsonpath={.spec.nodeName}"]);
    assert_eq!(node, "", "a pod was bound while the server did not lead the scheduler");
    let log = c.log();
    assert!(
        log.contains("leader election lost") && log.contains("kube-system/kube-scheduler"),
        "{}",
        common::tail(&log, 30)
    );
    // Upstream's events on the Lease tell the story.
    let events = c.k(&[
        "get",
        "events",
        "-n",
        "kube-system",
        "--field-selector",
        "reason=LeaderElection,involvedObject.name=kube-scheduler",
        "-o",
        "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}",
    ]);
    for said in ["became leader", "stopped leading"] {
        assert!(
            events.lines().any(|m| m == format!("{server_id} {said}")),
            "no '{said}' event: {events}"
        );
    }
    // The Leases nobody else wanted are the server's again (a new term each).
    for name in ["kube-controller-manager", "skiff-sim"] {
        let back = eventually(Duration::from_secs(15), || {
            let (r, _) = standby.record(name).unwrap();
            (r.holder_identity == server_id).then_some(r)
        })
        .unwrap_or_else(|| panic!("{name} not taken back: {:?}", standby.record(name)));
        assert_eq!(back.leader_transitions, 1, "{name}");
    }

    // The standby releases; the server takes the Lease at once and its restarted scheduler
    // binds the pod.
    assert!(standby.rt.block_on(standby.elector.release()));
    let back = eventually(Duration::from_secs(5), || {
        let (r, _) = standby.record("kube-scheduler").unwrap();
        (r.holder_identity == server_id).then_some(r)
    })
    .expect("the server took the scheduler's Lease back");
    assert_eq!(back.leader_transitions, 2);
    eventually(Duration::from_secs(30), || {
        (running_pods(&c, "app=lonely").len() == 1).then_some(())
    })
    .unwrap_or_else(|| panic!("lonely not Running: {}", c.k(&["get", "pods", "-o", "wide"])));
    c.k(&["scale", "deployment", "web", "--replicas=3"]);
    eventually(Duration::from_secs(30), || {
        (running_pods(&c, "app=web").len() == 3).then_some(())
    })
    .unwrap_or_else(|| panic!("web not scaled: {}", c.k(&["get", "pods", "-o", "wide"])));

    // A clean stop releases every Lease.
    signal(&c, libc::SIGTERM);
    let exited = eventually(Duration::from_secs(10), || {
        c.child.as_mut().and_then(|ch| ch.try_wait().ok().flatten())
    });
    assert!(exited.is_some(), "the server did not stop");
    c.child = None;
    let log = c.log();
    for name in LEASES {
        assert!(
            log.lines()
                .any(|l| l.contains("released the lease") && l.contains(&format!("kube-system/{name}"))),
            "{name} not released: {}",
            common::tail(&log, 20)
        );
    }
}
