//! The elector's decisions and the fence, against a real API server (in-process clients with
//! the scheduler's identity, so RBAC's leader election rules are exercised too).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::api::{Api, ListParams, PostParams};
use skiff_apiserver::{Running, identities};

use crate::{Config, FenceError, LeaderElector, Record, Term};

const NS: &str = "kube-system";
const NAME: &str = "kube-scheduler";

/// Short timings, valid by upstream's rules: a 2 s lease, 1.5 s renew deadline, 0.25 s retry.
fn fast() -> Config {
    Config {
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1500),
        retry_period: Duration::from_millis(250),
    }
}

async fn server() -> (tempfile::TempDir, Running) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let mut opts = skiff_apiserver::ServerOptions::new(dir.path().join("server"), 0);
    opts.bind = "127.0.0.1".parse().unwrap();
    let running = skiff_apiserver::start(opts).await.unwrap();
    (dir, running)
}

fn candidate(running: &Running, id: &str) -> LeaderElector {
    let client = skiff_apiserver::client_as(running.state.clone(), identities::scheduler());
    LeaderElector::new(client, NS, NAME, id, fast()).unwrap()
}

fn admin(running: &Running) -> kube::Client {
    skiff_apiserver::client(running.state.clone())
}

async fn record(running: &Running) -> (Record, Lease) {
    let lease = Api::<Lease>::namespaced(admin(running), NS).get(NAME).await.unwrap();
    (Record::from_lease(&lease), lease)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_an_absent_lease_renews_it_and_others_wait_out_the_lease_before_taking_over() {
    let (_dir, running) = server().await;
    let mut a = candidate(&running, "host-a_1");
    let mut b = candidate(&running, "host-b_2");

    // Nobody holds it: created with a's record.
    assert!(a.try_acquire_or_renew().await);
    assert!(a.is_leader());
    let (first, lease) = record(&running).await;
    assert_eq!(first.holder_identity, "host-a_1");
    assert_eq!(first.lease_duration_seconds, 2);
    assert_eq!(first.leader_transitions, 0);
    assert!(first.acquire_time.is_some());
    assert_eq!(first.acquire_time, first.renew_time);
    let spec = serde_json::to_value(lease.spec.as_ref().unwrap()).unwrap();
    for field in [
        "holderIdentity",
        "leaseDurationSeconds",
        "acquireTime",
        "renewTime",
        "leaseTransitions",
    ] {
        assert!(spec.get(field).is_some(), "{field} written: {spec}");
    }

    // b sees it held and not expired.
    assert!(!b.try_acquire_or_renew().await);
    assert_eq!(b.leader(), "host-a_1");
    assert!(!b.is_leader());

    // a renews: the same acquisition, a later renewal, no transition.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(a.try_acquire_or_renew().await);
    let (renewed, _) = record(&running).await;
    assert_eq!(renewed.holder_identity, "host-a_1");
    assert_eq!(renewed.acquire_time, first.acquire_time);
    assert!(renewed.renew_time > first.renew_time);
    assert_eq!(renewed.leader_transitions, 0);

    // b saw a change just now: its lease runs from here, by b's clock. a stops renewing.
    assert!(!b.try_acquire_or_renew().await);
    let seen = Instant::now();
    while seen.elapsed() < Duration::from_millis(1700) {
        assert!(!b.try_acquire_or_renew().await, "taken before the lease ran out");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep_until((seen + Duration::from_millis(2100)).into()).await;
    assert!(
        b.try_acquire_or_renew().await,
        "taken once the record stood still for the lease"
    );
    let (taken, _) = record(&running).await;
    assert_eq!(taken.holder_identity, "host-b_2");
    assert_eq!(taken.leader_transitions, 1);
    assert!(taken.acquire_time > renewed.acquire_time);

    // a finds it taken: its fast path conflicts, its slow path sees b's fresh record.
    assert!(!a.try_acquire_or_renew().await);
    assert_eq!(a.leader(), "host-b_2");
    assert!(!a.is_leader());
    assert!(a.release().await);
    assert_eq!(
        record(&running).await.0.holder_identity,
        "host-b_2",
        "a non-holder releases nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewing_holder_keeps_the_lease_for_as_long_as_it_renews() {
    let (_dir, running) = server().await;
    let mut a = candidate(&running, "host-a_1");
    let mut b = candidate(&running, "host-b_2");
    let fence = a.acquire().await;
    let renewing = tokio::spawn(async move {
        a.renew(&fence).await;
    });
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        assert!(!b.try_acquire_or_renew().await, "taken from a renewing holder");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(!renewing.is_finished(), "the holder still leads");
    let (held, _) = record(&running).await;
    assert_eq!(held.holder_identity, "host-a_1");
    assert_eq!(held.leader_transitions, 0);
    renewing.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_releases_the_lease_and_a_standby_takes_it_at_once() {
    let (_dir, running) = server().await;
    let a = candidate(&running, "host-a_1").with_events("kube-scheduler");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (led, mut leading) = tokio::sync::mpsc::unbounded_channel::<()>();
    let run = tokio::spawn(crate::run(
        a,
        1,
        async move {
            let _ = stopped.await;
        },
        move |_term| {
            let led = led.clone();
            async move {
                let _ = led.send(());
                std::future::pending::<anyhow::Result<()>>().await
            }
        },
    ));
    leading.recv().await.unwrap();
    assert_eq!(record(&running).await.0.holder_identity, "host-a_1");
    stop.send(()).unwrap();
    run.await.unwrap().unwrap();
    let (released, lease) = record(&running).await;
    assert_eq!(released.holder_identity, "");
    assert_eq!(released.lease_duration_seconds, 1);
    assert_eq!(released.leader_transitions, 0);
    let spec = serde_json::to_value(lease.spec.as_ref().unwrap()).unwrap();
    assert_eq!(spec["holderIdentity"], "", "released as upstream writes it: {spec}");

    // A standby that never saw a's record takes it at its first attempt.
    let mut b = candidate(&running, "host-b_2");
    assert!(b.try_acquire_or_renew().await);
    let (taken, _) = record(&running).await;
    assert_eq!(taken.holder_identity, "host-b_2");
    assert_eq!(taken.leader_transitions, 1);

    // Upstream's events on the Lease.
    let events = Api::<Event>::namespaced(admin(&running), NS);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let messages: Vec<String> = events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("LeaderElection"))
            .filter_map(|e| e.message)
            .collect();
        if messages.iter().any(|m| m == "host-a_1 became leader") {
            break;
        }
        assert!(Instant::now() < deadline, "no leader election event: {messages:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The fence: a client of the term writes while the lease is renewed in time, and once the
/// holder has not renewed within the renew deadline (its renewals held back, as in a paused
/// process) every write is refused before it is sent; reads still pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_client_refuses_writes_once_the_lease_was_not_renewed_in_time() {
    let (_dir, running) = server().await;
    let mut a = candidate(&running, "host-a_1");
    let fence = a.acquire().await;
    let term = Term::new(fence.clone(), tokio::runtime::Handle::current());
    let admin_service = skiff_apiserver::service_as(
        running.state.clone(),
        skiff_apiserver::tls::Identity::new("system:skiff", &[skiff_apiserver::authz::MASTERS]),
    );
    let fenced: Api<ConfigMap> = Api::namespaced(term.client(admin_service), "default");
    let plain: Api<ConfigMap> = Api::namespaced(admin(&running), "default");
    let cm = |name: &str| ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };

    // Renewing: writes pass, well past one renew deadline.
    let stop = tokio::sync::oneshot::channel::<()>();
    let (stop_renewing, renewing_stopped) = stop;
    let renewing = tokio::spawn(async move {
        tokio::select! {
            _ = a.renew(&fence) => {}
            _ = renewing_stopped => {}
        }
        a
    });
    fenced.create(&PostParams::default(), &cm("before")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    fenced
        .create(&PostParams::default(), &cm("while-renewed"))
        .await
        .unwrap();

    // The renew loop is held: the fence closes at the last renewal plus the renew deadline.
    stop_renewing.send(()).unwrap();
    let mut a = renewing.await.unwrap();
    let held_back = Instant::now();
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert!(!term.fence().holds());
    let refused = fenced.create(&PostParams::default(), &cm("after")).await.unwrap_err();
    let kube::Error::Service(e) = &refused else {
        panic!("not refused by the fence: {refused:?}");
    };
    assert_eq!(
        e.downcast_ref::<FenceError>(),
        Some(&FenceError {
            lease: "kube-system/kube-scheduler".into()
        }),
        "{e}"
    );
    assert!(
        plain.get_opt("after").await.unwrap().is_none(),
        "the refused write was never sent"
    );
    assert!(
        fenced.get_opt("while-renewed").await.unwrap().is_some(),
        "reads still pass"
    );
    assert!(
        held_back.elapsed() < fast().lease_duration,
        "refused before anyone could take over"
    );

    // The lease itself is untouched: the holder, on its own clock, may get it back (a new term).
    let again = a.acquire().await;
    assert!(again.holds());
    assert!(!term.fence().holds(), "an ended term's fence never reopens");
}

/// Losing the Lease stops the term's components with every task they spawned; winning it again
/// starts them afresh with a new fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_term_stops_its_tasks_and_the_next_term_starts_clean() {
    let (_dir, running) = server().await;
    let a = candidate(&running, "host-a_1");
    let terms = Arc::new(AtomicUsize::new(0));
    let ticks = Arc::new(AtomicUsize::new(0));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = {
        let (terms, ticks) = (terms.clone(), ticks.clone());
        tokio::spawn(crate::run(
            a,
            1,
            async move {
                let _ = stopped.await;
            },
            move |_term| {
                terms.fetch_add(1, Ordering::SeqCst);
                let ticks = ticks.clone();
                async move {
                    // Detached, as components' watch loops are: only the term's runtime ends it.
                    tokio::spawn(async move {
                        loop {
                            ticks.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    });
                    std::future::pending::<anyhow::Result<()>>().await
                }
            },
        ))
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while ticks.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Another candidate takes the Lease (as after an expiry): a sees it at its next renewal.
    let leases = Api::<Lease>::namespaced(admin(&running), NS);
    let mut lease = leases.get(NAME).await.unwrap();
    let spec = lease.spec.as_mut().unwrap();
    spec.holder_identity = Some("host-b_2".into());
    spec.lease_duration_seconds = Some(2);
    spec.lease_transitions = Some(1);
    spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    leases.replace(NAME, &PostParams::default(), &lease).await.unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let after_loss = ticks.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        ticks.load(Ordering::SeqCst),
        after_loss,
        "the lost term's tasks are gone"
    );
    assert_eq!(terms.load(Ordering::SeqCst), 1);

    // b "releases" it; a, campaigning, wins a second term.
    let mut lease = leases.get(NAME).await.unwrap();
    let spec = lease.spec.as_mut().unwrap();
    spec.holder_identity = Some(String::new());
    spec.lease_duration_seconds = Some(1);
    leases.replace(NAME, &PostParams::default(), &lease).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while terms.load(Ordering::SeqCst) < 2 || ticks.load(Ordering::SeqCst) == after_loss {
        assert!(Instant::now() < deadline, "a second term did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (second, _) = record(&running).await;
    assert_eq!(second.holder_identity, "host-a_1");
    assert_eq!(second.leader_transitions, 2);
    stop.send(()).unwrap();
    run.await.unwrap().unwrap();
    assert_eq!(record(&running).await.0.holder_identity, "");
}

/// A holder whose renew loop stands still (a paused process): its fence closes at the renew
/// deadline, a standby takes the Lease once it has seen it unchanged for the lease duration, and
/// the holder, resumed, finds its deadline past and writes nothing; campaigning again, it waits
/// out the standby's record like any candidate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holder_loses_to_a_standby_and_writes_nothing_when_it_resumes() {
    let (_dir, running) = server().await;
    let mut a = candidate(&running, "host-a_1");
    let mut b = candidate(&running, "host-b_2");
    let paused = a.paused.clone();
    let fence = a.acquire().await;
    let term_fence = fence.clone();
    let (lost_tx, lost_rx) = tokio::sync::oneshot::channel::<LeaderElector>();
    tokio::spawn(async move {
        a.renew(&fence).await;
        let _ = lost_tx.send(a);
    });
    // Renewing: b cannot take it.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        assert!(!b.try_acquire_or_renew().await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (held, _) = record(&running).await;
    assert_eq!(held.holder_identity, "host-a_1");

    paused.store(true, Ordering::SeqCst);
    let paused_at = Instant::now();
    let taken_at = loop {
        if b.try_acquire_or_renew().await {
            break Instant::now();
        }
        assert!(!term_fence.holds() || paused_at.elapsed() < Duration::from_millis(1600));
        assert!(
            paused_at.elapsed() < Duration::from_secs(4),
            "b never took the lease over"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The last renewal was at most a retry period (and a request) before the pause.
    let waited = taken_at - paused_at;
    assert!(waited >= Duration::from_millis(1500), "taken after {waited:?}");
    assert!(!term_fence.holds(), "the fence closed before the standby took over");
    let (taken, lease) = record(&running).await;
    assert_eq!(taken.holder_identity, "host-b_2");
    assert_eq!(taken.leader_transitions, 1);

    // a resumes: its renew loop ends without a write.
    paused.store(false, Ordering::SeqCst);
    let mut a = tokio::time::timeout(Duration::from_secs(2), lost_rx)
        .await
        .unwrap()
        .unwrap();
    let (after, unchanged) = record(&running).await;
    assert_eq!(after, taken);
    assert_eq!(unchanged.metadata.resource_version, lease.metadata.resource_version);

    // Campaigning again, a waits out b's record while b renews, and takes it only once b stops.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        assert!(b.try_acquire_or_renew().await);
        assert!(!a.try_acquire_or_renew().await, "took the lease from a renewing holder");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let stopped = Instant::now();
    let _ = tokio::time::timeout(Duration::from_secs(4), a.acquire()).await.unwrap();
    assert!(
        stopped.elapsed() >= Duration::from_millis(1800),
        "{:?}",
        stopped.elapsed()
    );
    let (back, _) = record(&running).await;
    assert_eq!(back.holder_identity, "host-a_1");
    assert_eq!(back.leader_transitions, 2);
}

/// What the fence costs a component: the same writes (ConfigMap creates) and reads through the
/// plain in-process client and through a term's client. Run with `--ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a check"]
async fn fenced_client_overhead() {
    let (_dir, running) = server().await;
    let mut a = candidate(&running, "host-a_1");
    let fence = a.acquire().await;
    fence.extend(Instant::now() + Duration::from_secs(3600));
    let started = Instant::now();
    let mut held = 0usize;
    for _ in 0..1_000_000 {
        held += usize::from(std::hint::black_box(&fence).holds());
    }
    println!("fence check: {:?} each ({held} held)", started.elapsed() / 1_000_000);
    let term = Term::new(fence, tokio::runtime::Handle::current());
    let identity = || skiff_apiserver::tls::Identity::new("system:skiff", &[skiff_apiserver::authz::MASTERS]);
    let plain = kube::Client::new(
        skiff_apiserver::service_as(running.state.clone(), identity()),
        "default",
    );
    let fenced = term.client(skiff_apiserver::service_as(running.state.clone(), identity()));
    const N: usize = 1000;
    for round in 0..4 {
        let mut order = [("plain", &plain), ("fenced", &fenced)];
        if round % 2 == 1 {
            order.reverse();
        }
        for (label, client) in order {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
            let started = Instant::now();
            for i in 0..N {
                let cm = ConfigMap {
                    metadata: kube::api::ObjectMeta {
                        name: Some(format!("{label}-{round}-{i}")),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                api.create(&PostParams::default(), &cm).await.unwrap();
            }
            let writes = started.elapsed();
            let started = Instant::now();
            for i in 0..N {
                api.get(&format!("{label}-{round}-{i}")).await.unwrap();
            }
            let reads = started.elapsed();
            println!(
                "round {round} {label}: create {:?}/request, get {:?}/request",
                writes / N as u32,
                reads / N as u32
            );
        }
    }
}
