//! Faults on a real 3-member etcd under two real `skiff server` replicas sharing its prefix,
//! checked from recorded histories (skiff_testkit::history): writers through both replicas
//! record every create and update with its invocation and completion time, its outcome
//! (acknowledged with a resourceVersion, refused, or unknown) and read the object back on the
//! other replica; watchers on both replicas record every event. Whatever the fault, no
//! acknowledged write is lost, resourceVersions follow real time, reads see what was
//! acknowledged before them, and every watch delivers each change once, in order.
//!
//! Budget: the four tests run at once in about a minute and a half (each starts 3 etcd members
//! and 2 servers); the whole file stays under three minutes on a loaded 2-core machine.

#![cfg(test)]

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{free_port, skiff_bin, tail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use skiff_testkit::EtcdCluster;
use skiff_testkit::history::{History, OpKind, Outcome, Recorder, Segment, SegmentEnd, Watch, WatchEvent as Seen};

/// How long one request may go unanswered before its outcome is unknown.
const OP_TIMEOUT: Duration = Duration::from_secs(5);
/// The keys every writer writes (shared, so writes through both replicas race on them).
const KEYS: usize = 6;
const NAMESPACE: &str = "default";

/// splitmix64: a seeded, printed source of choices, so a failing run can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

/// The seed of a test: `SKIFF_FAULT_SEED`, else the clock; printed either way.
fn seed(test: &str) -> u64 {
    let seed = std::env::var("SKIFF_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("{test}: SKIFF_FAULT_SEED={seed}");
    seed
}

/// One `skiff server` replica on the shared etcd prefix, killed when dropped.
struct Replica {
    name: &'static str,
    dir: tempfile::TempDir,
    home: tempfile::TempDir,
    port: u16,
    args: Vec<String>,
    child: Option<Child>,
}

impl Replica {
    /// The first replica: it makes the cluster's keys and certificates.
    fn first(name: &'static str, etcd: &EtcdCluster, extra: &[&str]) -> Replica {
        let mut args: Vec<String> = vec![
            "--no-agent".into(),
            "--etcd-servers".into(),
            etcd.endpoints_arg(),
            "--etcd-prefix".into(),
            "/registry".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let port = free_port();
        // Replicas of one cluster share its service range (each would otherwise reconcile the
        // default ServiceCIDR to its own at every start).
        args.extend(["--service-cluster-ip-range".into(), common::own_service_range(port)]);
        let mut r = Replica {
            name,
            dir: tempfile::tempdir().unwrap(),
            home: tempfile::tempdir().unwrap(),
            port,
            args,
            child: None,
        };
        r.spawn();
        r.wait_ready(Duration::from_secs(60));
        r
    }

    /// Another replica, on a copy of `first`'s data dir (the same CA and keys).
    fn second(name: &'static str, first: &Replica) -> Replica {
        let dir = tempfile::tempdir().unwrap();
        let copied = Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", first.dir.path().display()))
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(copied.success());
        for stale in ["kubeconfig", "server.log", "audit"] {
            let p = dir.path().join(stale);
            let _ = std::fs::remove_file(&p);
            let _ = std::fs::remove_dir_all(&p);
        }
        let mut r = Replica {
            name,
            dir,
            home: tempfile::tempdir().unwrap(),
            port: free_port(),
            args: first.args.clone(),
            child: None,
        };
        r.spawn();
        r.wait_ready(Duration::from_secs(60));
        r
    }

    fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("server.log"))
            .unwrap();
        let child = Command::new(skiff_bin())
            .arg("server")
            .arg("--data-dir")
            .arg(self.dir.path())
            .args(["--port", &self.port.to_string()])
            .args(&self.args)
            .env("HOME", self.home.path())
            .env("SKIFF_LOG", "info")
            // A replica that exits says why in the log's last lines, not under a backtrace.
            .env("RUST_LIB_BACKTRACE", "0")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    fn ready(&self) -> bool {
        self.kubeconfig().exists()
            && Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(self.kubeconfig())
                .args(["--request-timeout", "5s", "get", "--raw", "/readyz"])
                .env("HOME", self.home.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false)
    }

    fn wait_ready(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.ready() {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                panic!("{} exited ({status}):\n{}", self.name, tail(&self.log(), 40));
            }
            assert!(
                Instant::now() < deadline,
                "{} not ready:\n{}",
                self.name,
                tail(&self.log(), 40)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap()
    }

    async fn client(&self) -> kube::Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let kubeconfig = kube::config::Kubeconfig::read_from(self.kubeconfig()).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap();
        kube::Client::try_from(config).unwrap()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// An outcome from a request's result: refusals (4xx but 408 and 429's retry) did not happen;
/// timeouts, lost connections and 5xx may have.
fn outcome<T>(res: Result<kube::Result<T>, tokio::time::error::Elapsed>) -> Result<T, Outcome> {
    match res {
        Err(_) => Err(Outcome::Unknown("timeout".into())),
        Ok(Ok(v)) => Ok(v),
        Ok(Err(kube::Error::Api(s))) if (400..500).contains(&s.code) && s.code != 408 => {
            Err(Outcome::Failed(format!("{} {}", s.code, s.reason)))
        }
        Ok(Err(e)) => Err(Outcome::Unknown(e.to_string())),
    }
}

fn rv_of(cm: &ConfigMap) -> u64 {
    cm.metadata
        .resource_version
        .as_deref()
        .and_then(|r| r.parse().ok())
        .expect("a numeric resourceVersion")
}

fn value_of(cm: &ConfigMap) -> String {
    cm.data.as_ref().and_then(|d| d.get("v")).cloned().unwrap_or_default()
}

fn key(i: usize) -> String {
    format!("h-{i}")
}

fn is_ours(cm: &ConfigMap) -> bool {
    cm.metadata.name.as_deref().is_some_and(|n| n.starts_with("h-"))
}

/// A writer: merge-patches a random key with a value of its own (creating the key when the patch
/// finds none), then reads it back through `reader`; until `stop`.
async fn writer(
    rec: Recorder,
    name: String,
    api: Api<ConfigMap>,
    reader: Api<ConfigMap>,
    stop: Arc<AtomicBool>,
    seed: u64,
) {
    let mut rng = Rng(seed);
    let mut seq = 0u64;
    let me = name.clone();
    while !stop.load(Ordering::Relaxed) {
        let k = key(rng.below(KEYS));
        seq += 1;
        let value = format!("{name}-{seq}");
        let invoked = rec.now();
        let patch = serde_json::json!({"data": {"v": value}});
        let res = outcome(
            tokio::time::timeout(
                OP_TIMEOUT,
                api.patch(&k, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await,
        );
        let mut acked = None;
        match res {
            Ok(cm) => {
                rec.write(&me, OpKind::Update, &k, &value, invoked, Outcome::Ok(rv_of(&cm)));
                acked = Some(k.clone());
            }
            Err(Outcome::Failed(why)) if why.starts_with("404") => {
                rec.write(&me, OpKind::Update, &k, &value, invoked, Outcome::Failed(why));
                // A NotFound is a read that found nothing: never after an acknowledged create.
                rec.read(&me, &k, invoked, Ok(None));
                seq += 1;
                let value = format!("{name}-{seq}");
                let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": k},
                    "data": {"v": value},
                }))
                .unwrap();
                let invoked = rec.now();
                let res = outcome(tokio::time::timeout(OP_TIMEOUT, api.create(&PostParams::default(), &cm)).await);
                match res {
                    Ok(cm) => {
                        rec.write(&me, OpKind::Create, &k, &value, invoked, Outcome::Ok(rv_of(&cm)));
                        acked = Some(k.clone());
                    }
                    Err(o) => rec.write(&me, OpKind::Create, &k, &value, invoked, o),
                }
            }
            Err(o) => {
                let unknown = matches!(o, Outcome::Unknown(_));
                rec.write(&me, OpKind::Update, &k, &value, invoked, o);
                if unknown {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        if let Some(k) = acked {
            let invoked = rec.now();
            let res = outcome(tokio::time::timeout(OP_TIMEOUT, reader.get_opt(&k)).await);
            rec.read(
                &format!("{me}-reader"),
                &k,
                invoked,
                res.map(|cm| cm.map(|cm| (value_of(&cm), rv_of(&cm)))),
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Lists our keys (recording each as a read): the list's resourceVersion.
async fn list(rec: &Recorder, who: &str, api: &Api<ConfigMap>) -> Option<u64> {
    let invoked = rec.now();
    let res = outcome(tokio::time::timeout(OP_TIMEOUT, api.list(&ListParams::default())).await);
    let list = res.ok()?;
    let mut found = BTreeMap::new();
    for cm in list.items.iter().filter(|c| is_ours(c)) {
        found.insert(cm.metadata.name.clone().unwrap(), (value_of(cm), rv_of(cm)));
    }
    for i in 0..KEYS {
        let k = key(i);
        rec.read(who, &k, invoked, Ok(found.remove(&k)));
    }
    list.metadata.resource_version.and_then(|r| r.parse().ok())
}

/// A watcher: lists, then watches from the list's resourceVersion, watching again from the last
/// one it saw when a stream ends or breaks and relisting on 410 Gone; once `target` is set (the
/// final resourceVersion), until it has seen it (or 30 s pass).
async fn watcher(rec: Recorder, name: String, api: Api<ConfigMap>, target: Arc<AtomicU64>) {
    let mut watch = Watch {
        name: name.clone(),
        segments: Vec::new(),
    };
    let start = loop {
        if let Some(rv) = list(&rec, &name, &api).await {
            break rv;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut seg = Segment {
        start,
        events: Vec::new(),
        end: SegmentEnd::Open,
    };
    let mut last = start;
    let mut give_up: Option<Instant> = None;
    'outer: loop {
        let t = target.load(Ordering::Acquire);
        if t > 0 {
            let deadline = *give_up.get_or_insert_with(|| Instant::now() + Duration::from_secs(30));
            if last >= t || Instant::now() > deadline {
                break;
            }
        }
        let wp = WatchParams::default().timeout(5);
        let stream = match tokio::time::timeout(OP_TIMEOUT, api.watch(&wp, &last.to_string())).await {
            Ok(Ok(s)) => s,
            Ok(Err(kube::Error::Api(s))) if s.code == 410 => {
                seg.end = SegmentEnd::Gone;
                watch.segments.push(std::mem::replace(
                    &mut seg,
                    Segment {
                        start: 0,
                        events: vec![],
                        end: SegmentEnd::Open,
                    },
                ));
                last = loop {
                    if let Some(rv) = list(&rec, &name, &api).await {
                        break rv;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                };
                seg.start = last;
                continue;
            }
            _ => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let mut stream = std::pin::pin!(stream);
        loop {
            let item = match tokio::time::timeout(Duration::from_secs(1), stream.next()).await {
                Err(_) => {
                    let t = target.load(Ordering::Acquire);
                    if t > 0 && last >= t {
                        break 'outer;
                    }
                    continue;
                }
                Ok(item) => item,
            };
            let (kind, cm) = match item {
                Some(Ok(WatchEvent::Added(cm))) => ("ADDED", cm),
                Some(Ok(WatchEvent::Modified(cm))) => ("MODIFIED", cm),
                Some(Ok(WatchEvent::Deleted(cm))) => ("DELETED", cm),
                Some(Ok(WatchEvent::Bookmark(_))) => continue,
                Some(Ok(WatchEvent::Error(s))) if s.code == 410 => {
                    seg.end = SegmentEnd::Gone;
                    watch.segments.push(std::mem::replace(
                        &mut seg,
                        Segment {
                            start: 0,
                            events: vec![],
                            end: SegmentEnd::Open,
                        },
                    ));
                    last = loop {
                        if let Some(rv) = list(&rec, &name, &api).await {
                            break rv;
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    };
                    seg.start = last;
                    continue 'outer;
                }
                // Broken, ended or an error: watch again from the last resourceVersion.
                _ => break,
            };
            let rv = rv_of(&cm);
            last = last.max(rv);
            seg.events.push(Seen {
                kind: kind.into(),
                key: cm.metadata.name.clone().unwrap_or_default(),
                value: value_of(&cm),
                rv,
            });
        }
        seg.end = SegmentEnd::Broken;
        watch.segments.push(std::mem::replace(
            &mut seg,
            Segment {
                start: last,
                events: vec![],
                end: SegmentEnd::Open,
            },
        ));
    }
    watch.segments.push(seg);
    rec.watch(watch);
}

/// Writers and watchers on both replicas.
struct Workload {
    rec: Recorder,
    stop: Arc<AtomicBool>,
    target: Arc<AtomicU64>,
    writers: Vec<tokio::task::JoinHandle<()>>,
    watchers: Vec<tokio::task::JoinHandle<()>>,
    clients: Vec<kube::Client>,
}

impl Workload {
    /// `per_replica` writers through each replica, each reading back through the other; a
    /// watcher on each.
    async fn start(replicas: &[&Replica], per_replica: usize, seed: u64) -> Workload {
        let rec = Recorder::new();
        let stop = Arc::new(AtomicBool::new(false));
        let target = Arc::new(AtomicU64::new(0));
        let mut clients = Vec::new();
        for r in replicas {
            clients.push(r.client().await);
        }
        let mut writers = Vec::new();
        let mut watchers = Vec::new();
        for (i, r) in replicas.iter().enumerate() {
            let api: Api<ConfigMap> = Api::namespaced(clients[i].clone(), NAMESPACE);
            let other: Api<ConfigMap> = Api::namespaced(clients[(i + 1) % clients.len()].clone(), NAMESPACE);
            for w in 0..per_replica {
                writers.push(tokio::spawn(writer(
                    rec.clone(),
                    format!("{}w{w}", r.name),
                    api.clone(),
                    other.clone(),
                    stop.clone(),
                    seed ^ ((i * 16 + w) as u64 + 1),
                )));
            }
            watchers.push(tokio::spawn(watcher(
                rec.clone(),
                format!("{}-watch", r.name),
                api,
                target.clone(),
            )));
        }
        Workload {
            rec,
            stop,
            target,
            writers,
            watchers,
            clients,
        }
    }

    /// Acknowledged writes so far.
    fn acknowledged(&self) -> usize {
        self.rec.history(BTreeMap::new()).summary().acknowledged
    }

    /// Stops the writers, reads the final state (a list through replica 0, retried until it
    /// answers), lets the watchers catch up with it, reads every key through every replica and
    /// returns the history.
    async fn finish(self) -> History {
        self.stop.store(true, Ordering::Release);
        for w in self.writers {
            w.await.unwrap();
        }
        let api: Api<ConfigMap> = Api::namespaced(self.clients[0].clone(), NAMESPACE);
        let deadline = Instant::now() + Duration::from_secs(30);
        let items = loop {
            match outcome(tokio::time::timeout(OP_TIMEOUT, api.list(&ListParams::default())).await) {
                Ok(list) => break list.items,
                Err(e) => assert!(Instant::now() < deadline, "the final list fails: {e:?}"),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let final_state: BTreeMap<String, (String, u64)> = items
            .iter()
            .filter(|c| is_ours(c))
            .map(|c| (c.metadata.name.clone().unwrap(), (value_of(c), rv_of(c))))
            .collect();
        let max = final_state.values().map(|(_, r)| *r).max().unwrap_or(1);
        self.target.store(max, Ordering::Release);
        for w in self.watchers {
            w.await.unwrap();
        }
        // Everything acknowledged can be read back through every replica.
        for (i, client) in self.clients.iter().enumerate() {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
            for k in 0..KEYS {
                let k = key(k);
                let invoked = self.rec.now();
                let res = outcome(tokio::time::timeout(OP_TIMEOUT, api.get_opt(&k)).await);
                let res = res.map(|cm| cm.map(|cm| (value_of(&cm), rv_of(&cm))));
                assert!(res.is_ok(), "final read of {k} through replica {i}: {res:?}");
                self.rec.read(&format!("final-{i}"), &k, invoked, res);
            }
        }
        self.rec.history(final_state)
    }
}

/// Checks the history, printing its summary; fails with every violation.
fn check(test: &str, h: &History) {
    let s = h.summary();
    eprintln!("{test}: {s:?}");
    let bad = h.check();
    assert!(bad.is_empty(), "{test}: {} violations:\n{}", bad.len(), bad.join("\n"));
    assert!(
        s.acknowledged >= 20,
        "{test}: too few writes acknowledged to tell anything: {s:?}"
    );
    assert!(s.watch_events > 0, "{test}: the watches saw nothing: {s:?}");
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Waits `d` while the workload runs.
async fn run_for(d: Duration) {
    tokio::time::sleep(d).await;
}

/// Waits until the workload has `n` more acknowledged writes than `since` (or fails after `t`).
async fn progress(w: &Workload, since: usize, n: usize, t: Duration, what: &str) -> usize {
    let deadline = Instant::now() + t;
    loop {
        let now = w.acknowledged();
        if now >= since + n {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "no progress {what}: {now} acknowledged, was {since}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// kill -9 of etcd's leader under writes through both replicas; it comes back; the history holds.
#[test]
fn killing_the_etcd_leader_under_writes() {
    let seed = seed("killing_the_etcd_leader_under_writes");
    let mut etcd = EtcdCluster::start(3);
    let a = Replica::first("a", &etcd, &PLAIN);
    let b = Replica::second("b", &a);
    let rt = runtime();
    let w = rt.block_on(Workload::start(&[&a, &b], 2, seed));
    rt.block_on(progress(&w, 0, 20, Duration::from_secs(30), "before the fault"));
    // Twice: the second time the leader is the one elected after the first kill.
    for round in 0..2 {
        let leader = etcd.leader();
        eprintln!("round {round}: killing etcd member {leader} (the leader)");
        etcd.kill(leader);
        let before = w.acknowledged();
        // The other two elect a leader and the writes go on.
        rt.block_on(progress(
            &w,
            before,
            20,
            Duration::from_secs(30),
            "without the old leader",
        ));
        rt.block_on(run_for(Duration::from_secs(1)));
        etcd.restart(leader);
        etcd.wait_healthy(Duration::from_secs(30));
        let back = w.acknowledged();
        rt.block_on(progress(&w, back, 20, Duration::from_secs(30), "with it back"));
    }
    let h = rt.block_on(w.finish());
    check("killing_the_etcd_leader_under_writes", &h);
}

/// kill -9 of one replica under writes through both: the survivor's writers go on; the killed one
/// comes back on its data dir; the history holds.
#[test]
fn killing_a_replica_under_writes() {
    let seed = seed("killing_a_replica_under_writes");
    let etcd = EtcdCluster::start(3);
    let a = Replica::first("a", &etcd, &PLAIN);
    let mut b = Replica::second("b", &a);
    let rt = runtime();
    let w = rt.block_on(Workload::start(&[&a, &b], 2, seed));
    rt.block_on(progress(&w, 0, 20, Duration::from_secs(30), "before the fault"));
    b.kill9();
    let before = w.acknowledged();
    rt.block_on(progress(
        &w,
        before,
        30,
        Duration::from_secs(30),
        "through the survivor",
    ));
    // Down for more than two compaction intervals: its watcher, resuming from where it was,
    // finds that compacted and relists.
    rt.block_on(run_for(Duration::from_secs(5)));
    b.spawn();
    b.wait_ready(Duration::from_secs(60));
    let back = w.acknowledged();
    rt.block_on(progress(&w, back, 20, Duration::from_secs(30), "with both again"));
    let h = rt.block_on(w.finish());
    check("killing_a_replica_under_writes", &h);
    assert!(
        h.summary().gone > 0,
        "no watch was resumed past a compaction: {:?}",
        h.summary()
    );
}

/// Every process (3 etcd members, 2 servers) killed and started again, each in a seeded random
/// order, under writes: afterwards everything acknowledged is read back and the history holds.
#[test]
fn restarting_everything_in_random_order() {
    let seed = seed("restarting_everything_in_random_order");
    let mut rng = Rng(seed);
    let mut etcd = EtcdCluster::start(3);
    let a = Replica::first("a", &etcd, &PLAIN);
    let b = Replica::second("b", &a);
    let mut replicas = [a, b];
    let rt = runtime();
    let w = rt.block_on(Workload::start(&[&replicas[0], &replicas[1]], 2, seed));
    rt.block_on(progress(&w, 0, 20, Duration::from_secs(30), "before the restart"));
    // 0..3: etcd members, 3..5: replicas.
    let mut order: Vec<usize> = (0..5).collect();
    rng.shuffle(&mut order);
    eprintln!("stopping in order {order:?} (0-2 etcd, 3-4 servers)");
    for &p in &order {
        match p {
            0..3 => etcd.kill(p),
            _ => replicas[p - 3].kill9(),
        }
        std::thread::sleep(Duration::from_millis(200 + rng.below(300) as u64));
    }
    rng.shuffle(&mut order);
    eprintln!("starting in order {order:?}");
    for &p in &order {
        match p {
            0..3 => etcd.restart(p),
            _ => replicas[p - 3].spawn(),
        }
        std::thread::sleep(Duration::from_millis(200 + rng.below(300) as u64));
    }
    etcd.wait_healthy(Duration::from_secs(60));
    for r in &mut replicas {
        r.wait_ready(Duration::from_secs(60));
    }
    let back = w.acknowledged();
    rt.block_on(progress(&w, back, 20, Duration::from_secs(30), "after the restart"));
    let h = rt.block_on(w.finish());
    check("restarting_everything_in_random_order", &h);
}

/// Servers without the elected parts, compacting etcd every 2 s so that a watch resumed from
/// before a fault can get 410 Gone and relist.
const PLAIN: [&str; 4] = ["--no-scheduler", "--no-controllers", "--etcd-compaction-interval", "2s"];

const ELECTION: [&str; 9] = [
    "--sim-nodes",
    "2",
    "--leader-elect",
    "--leader-elect-lease-duration",
    "4s",
    "--leader-elect-renew-deadline",
    "3s",
    "--leader-elect-retry-period",
    "500ms",
];

/// (holder, renewTime) of a Lease in kube-system.
async fn lease(client: &kube::Client, name: &str) -> Option<(String, String)> {
    use k8s_openapi::api::coordination::v1::Lease;
    let api: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let l = tokio::time::timeout(OP_TIMEOUT, api.get_opt(name)).await.ok()?.ok()??;
    let spec = l.spec?;
    Some((
        spec.holder_identity.unwrap_or_default(),
        spec.renew_time.map(|t| format!("{:?}", t.0)).unwrap_or_default(),
    ))
}

/// The pods of `rs`: (name, nodeName, terminating).
async fn rs_pods(client: &kube::Client) -> Option<Vec<(String, String, bool)>> {
    use k8s_openapi::api::core::v1::Pod;
    let api: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let list = tokio::time::timeout(OP_TIMEOUT, api.list(&ListParams::default().labels("app=rs")))
        .await
        .ok()?
        .ok()?;
    Some(
        list.items
            .iter()
            .map(|p| {
                (
                    p.metadata.name.clone().unwrap_or_default(),
                    p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default(),
                    p.metadata.deletion_timestamp.is_some(),
                )
            })
            .collect(),
    )
}

/// Polls `f` every 200 ms until it gives Some, for at most `t`.
async fn until<T, F: std::future::Future<Output = Option<T>>>(t: Duration, mut f: impl FnMut() -> F) -> Option<T> {
    let deadline = Instant::now() + t;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every pod event of the namespace from `from`: (type, name, nodeName, resourceVersion), watched
/// again from the last one when a stream ends; until `stop`.
async fn pod_watch(client: kube::Client, from: String, stop: Arc<AtomicBool>) -> Vec<(String, String, String, u64)> {
    use k8s_openapi::api::core::v1::Pod;
    let api: Api<Pod> = Api::namespaced(client, NAMESPACE);
    let mut seen = Vec::new();
    let mut last = from;
    while !stop.load(Ordering::Acquire) {
        let wp = WatchParams::default().timeout(5);
        let Ok(Ok(stream)) = tokio::time::timeout(OP_TIMEOUT, api.watch(&wp, &last)).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let mut stream = std::pin::pin!(stream);
        while let Ok(Some(item)) = tokio::time::timeout(Duration::from_secs(6), stream.next()).await {
            let (kind, p) = match item {
                Ok(WatchEvent::Added(p)) => ("ADDED", p),
                Ok(WatchEvent::Modified(p)) => ("MODIFIED", p),
                Ok(WatchEvent::Deleted(p)) => ("DELETED", p),
                Ok(WatchEvent::Error(s)) => panic!("pod watch from {last}: {s:?}"),
                _ => continue,
            };
            let rv = p.metadata.resource_version.clone().unwrap_or_default();
            last = rv.clone();
            seen.push((
                kind.to_string(),
                p.metadata.name.clone().unwrap_or_default(),
                p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default(),
                rv.parse().unwrap_or(0),
            ));
        }
    }
    seen
}

/// The writes of the elected components (controllers, scheduler, simulated nodes) in a
/// replica's audit log received after `after` (all of them if None): "verb resource name".
fn component_writes(r: &Replica, after: Option<jiff::Timestamp>) -> Vec<String> {
    let text = std::fs::read_to_string(r.dir.path().join("audit").join("audit.log")).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["stage"] == "ResponseComplete")
        .filter(|e| matches!(e["verb"].as_str(), Some("create" | "update" | "patch" | "delete")))
        .filter(|e| e["responseStatus"]["code"].as_u64().is_some_and(|c| c < 300))
        .filter(|e| {
            let user = e["user"]["username"].as_str().unwrap_or_default();
            matches!(
                user,
                "system:kube-controller-manager" | "system:kube-scheduler" | "skiff:node-simulator"
            ) || user.starts_with("system:serviceaccount:kube-system:")
        })
        .filter(|e| !matches!(e["objectRef"]["resource"].as_str(), Some("leases" | "events")))
        .filter(|e| {
            let Some(after) = after else { return true };
            e["requestReceivedTimestamp"]
                .as_str()
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                .is_some_and(|t| t > after)
        })
        .map(|e| {
            format!(
                "{} {} {}/{} by {} at {}",
                e["verb"].as_str().unwrap_or_default(),
                e["objectRef"]["resource"].as_str().unwrap_or_default(),
                e["objectRef"]["subresource"].as_str().unwrap_or_default(),
                e["objectRef"]["name"].as_str().unwrap_or_default(),
                e["user"]["username"].as_str().unwrap_or_default(),
                e["requestReceivedTimestamp"].as_str().unwrap_or_default(),
            )
        })
        .collect()
}

/// SIGSTOP of the replica leading the controllers (and the scheduler and the simulated nodes)
/// for longer than the lease: the standby takes over and scales a ReplicaSet to 10; resumed, the
/// old leader writes nothing (its audit log) and the ReplicaSet ends with exactly 10 pods, each
/// created once and bound once.
#[test]
fn stopping_the_leading_controller_manager() {
    let etcd = EtcdCluster::start(3);
    let a = Replica::first("a", &etcd, &ELECTION);
    let b = Replica::second("b", &a);
    let rt = runtime();
    let (ca, cb) = rt.block_on(async { (a.client().await, b.client().await) });
    let leader_of = |c: &kube::Client, name: &'static str| {
        let c = c.clone();
        rt.block_on(until(Duration::from_secs(20), move || {
            let c = c.clone();
            async move { lease(&c, name).await.filter(|(h, _)| !h.is_empty()) }
        }))
        .unwrap_or_else(|| panic!("nobody holds {name}"))
    };
    let (a_id, _) = leader_of(&cb, "kube-controller-manager");
    for name in ["kube-scheduler", "skiff-sim"] {
        assert_eq!(
            leader_of(&cb, name).0,
            a_id,
            "{name}: the first replica leads everything"
        );
    }
    // Four pods, made, bound and run by the first replica.
    let rs: k8s_openapi::api::apps::v1::ReplicaSet = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "rs"},
        "spec": {
            "replicas": 4,
            "selector": {"matchLabels": {"app": "rs"}},
            "template": {
                "metadata": {"labels": {"app": "rs"}},
                "spec": {"containers": [{"name": "c", "image": "nginx"}]},
            },
        },
    }))
    .unwrap();
    let rss: Api<k8s_openapi::api::apps::v1::ReplicaSet> = Api::namespaced(ca.clone(), NAMESPACE);
    rt.block_on(rss.create(&PostParams::default(), &rs)).unwrap();
    let bound = |c: &kube::Client, n: usize| {
        let c = c.clone();
        rt.block_on(until(Duration::from_secs(40), move || {
            let c = c.clone();
            async move {
                let pods = rs_pods(&c).await?;
                (pods.len() == n && pods.iter().all(|(_, node, gone)| !node.is_empty() && !gone)).then_some(pods)
            }
        }))
    };
    let first = bound(&ca, 4).unwrap_or_else(|| panic!("4 pods not bound: {:?}", rt.block_on(rs_pods(&ca))));
    assert!(
        !component_writes(&a, None).is_empty(),
        "the audit log shows the components' writes (or the check below proves nothing)"
    );
    // Record every pod event from here on, through the standby.
    let from = rt
        .block_on(
            Api::<k8s_openapi::api::core::v1::Pod>::namespaced(cb.clone(), NAMESPACE).list(&ListParams::default()),
        )
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let stop_watch = Arc::new(AtomicBool::new(false));
    let pod_events = rt.spawn(pod_watch(cb.clone(), from, stop_watch.clone()));

    // Stop the leader just after a renewal, so that none is in flight.
    let (_, renewed) = leader_of(&cb, "kube-controller-manager");
    let cb2 = cb.clone();
    rt.block_on(until(Duration::from_secs(5), move || {
        let (cb2, renewed) = (cb2.clone(), renewed.clone());
        async move {
            lease(&cb2, "kube-controller-manager")
                .await
                .filter(|(_, r)| *r != renewed)
        }
    }))
    .expect("a renewal");
    // SAFETY: kill(2) on a process this test started.
    assert_eq!(unsafe { libc::kill(a.pid(), libc::SIGSTOP) }, 0);
    let stopped = Instant::now();

    // Through the standby: ten replicas, and two of the first pods deleted.
    let rsb: Api<k8s_openapi::api::apps::v1::ReplicaSet> = Api::namespaced(cb.clone(), NAMESPACE);
    rt.block_on(rsb.patch(
        "rs",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 10}})),
    ))
    .unwrap();
    let podsb: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(cb.clone(), NAMESPACE);
    for (name, _, _) in &first[..2] {
        rt.block_on(podsb.delete(name, &Default::default())).unwrap();
    }
    let (b_id, _) = rt
        .block_on(until(Duration::from_secs(20), || {
            let cb = cb.clone();
            let a_id = a_id.clone();
            async move {
                lease(&cb, "kube-controller-manager")
                    .await
                    .filter(|(h, _)| !h.is_empty() && *h != a_id)
            }
        }))
        .expect("the standby takes the controllers' Lease");
    eprintln!("standby {b_id} took over {:?} after the stop", stopped.elapsed());
    let ten = bound(&cb, 10).unwrap_or_else(|| {
        panic!(
            "not 10 bound pods: {:?}\n{}",
            rt.block_on(rs_pods(&cb)),
            tail(&b.log(), 30)
        )
    });
    assert!(
        stopped.elapsed() > Duration::from_secs(4),
        "stopped for longer than the lease"
    );

    // Resume the old leader: it finds it lost every Lease and writes nothing.
    let resumed = jiff::Timestamp::now();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(a.pid(), libc::SIGCONT) }, 0);
    std::thread::sleep(Duration::from_secs(6));
    let late = component_writes(&a, Some(resumed));
    assert!(
        late.is_empty(),
        "the old leader wrote after it lost its Leases:\n{}",
        late.join("\n")
    );
    let log = a.log();
    assert!(
        log.contains("leader election lost") && log.contains("kube-system/kube-controller-manager"),
        "{}",
        tail(&log, 30)
    );
    for name in ["kube-controller-manager", "kube-scheduler", "skiff-sim"] {
        assert_eq!(leader_of(&cb, name).0, b_id, "{name} stays with the standby");
    }
    // Still exactly ten, the same ten, each bound once.
    let after = bound(&ca, 10).unwrap_or_else(|| panic!("not 10 bound pods: {:?}", rt.block_on(rs_pods(&ca))));
    let names = |v: &[(String, String, bool)]| {
        v.iter()
            .map(|(n, node, _)| (n.clone(), node.clone()))
            .collect::<BTreeMap<_, _>>()
    };
    assert_eq!(
        names(&after),
        names(&ten),
        "the pods changed after the old leader resumed"
    );
    stop_watch.store(true, Ordering::Release);
    let events = rt.block_on(pod_events).unwrap();
    let mut created = Vec::new();
    let mut node_of: BTreeMap<String, String> = BTreeMap::new();
    for (kind, name, node, _) in &events {
        if kind == "ADDED" {
            created.push(name.clone());
        }
        if node.is_empty() {
            continue;
        }
        if let Some(was) = node_of.insert(name.clone(), node.clone()) {
            assert_eq!(&was, node, "{name} bound twice: {events:?}");
        }
    }
    assert_eq!(
        created.len(),
        8,
        "8 pods made after the stop (10 less 4 plus the 2 deleted): {events:?}"
    );
    for (name, node) in names(&after) {
        if created.contains(&name) {
            assert_eq!(node_of.get(&name), Some(&node), "{name}: {events:?}");
        }
    }
}
