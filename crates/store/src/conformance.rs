//! One test suite every backend runs (see `suite!`).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;

use crate::{Event, ListOptions, Store, StoreError};

/// Generates one `#[tokio::test]` per conformance check; `$make` evaluates to
/// `(Arc<dyn Store>, guard)`, the guard living as long as the test.
macro_rules! suite {
    ($make:expr) => {
        $crate::conformance::suite!(@tests $make;
            create_and_already_exists,
            update_checks_revision,
            delete_with_and_without_precondition,
            list_prefix_limit_start_after,
            list_at_old_revision,
            watch_from_zero,
            watch_from_middle_and_prefix,
            watch_live,
            watch_after_compaction,
            concurrent_creates,
            contended_keys_lose_no_update,
            revisions_are_global_and_increasing,
            transactions_write_all_or_nothing,
            erase_history_keeps_the_present,
        );
    };
    (@tests $make:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let (store, _guard) = $make;
                $crate::conformance::$name(store).await;
            }
        )*
    };
}
pub(crate) use suite;

pub(crate) async fn next_event(stream: &mut BoxStream<'static, Event>) -> Event {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("timed out waiting for an event")
        .expect("watch stream ended")
}

pub(crate) async fn take_events(stream: &mut BoxStream<'static, Event>, n: usize) -> Vec<Event> {
    let mut events = Vec::with_capacity(n);
    for _ in 0..n {
        events.push(next_event(stream).await);
    }
    events
}

/// Asserts nothing more arrives soon.
pub(crate) async fn assert_quiet(stream: &mut BoxStream<'static, Event>) {
    if let Ok(Some(event)) = tokio::time::timeout(Duration::from_millis(100), stream.next()).await {
        panic!("unexpected event {event:?}");
    }
}

fn keys(items: &[crate::KeyValue]) -> Vec<&str> {
    items.iter().map(|kv| kv.key.as_str()).collect()
}

fn summary(events: &[Event]) -> Vec<(i64, String, &'static str)> {
    events
        .iter()
        .map(|e| {
            let kind = match e {
                Event::Put { prev: None, .. } => "create",
                Event::Put { prev: Some(_), .. } => "update",
                Event::Delete { .. } => "delete",
            };
            (e.revision(), e.key().to_owned(), kind)
        })
        .collect()
}

pub(crate) async fn create_and_already_exists(store: Arc<dyn Store>) {
    assert_eq!(store.current_revision().await.unwrap(), 0);
    let kv = store
        .create("/registry/pods/default/web-1", b"{\"a\":1}".to_vec())
        .await
        .unwrap();
    assert_eq!(kv.key, "/registry/pods/default/web-1");
    assert_eq!(&kv.value[..], b"{\"a\":1}");
    assert_eq!(kv.create_revision, 1);
    assert_eq!(kv.mod_revision, 1);
    assert_eq!(store.current_revision().await.unwrap(), 1);
    let err = store
        .create("/registry/pods/default/web-1", b"{}".to_vec())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::AlreadyExists(k) if k == "/registry/pods/default/web-1"),
        "{err:?}"
    );
    // A failed write does not consume a revision.
    assert_eq!(store.current_revision().await.unwrap(), 1);
    let got = store.get("/registry/pods/default/web-1").await.unwrap();
    assert_eq!(got, Some(kv));
    assert_eq!(store.get("/registry/pods/default/web-2").await.unwrap(), None);
}

pub(crate) async fn update_checks_revision(store: Arc<dyn Store>) {
    let key = "/registry/pods/default/web-1";
    let created = store.create(key, b"v1".to_vec()).await.unwrap();
    store.create("/other", b"x".to_vec()).await.unwrap();
    let updated = store.update(key, b"v2".to_vec(), created.mod_revision).await.unwrap();
    assert_eq!(updated.create_revision, created.create_revision);
    assert_eq!(updated.mod_revision, 3);
    assert_eq!(&updated.value[..], b"v2");
    let err = store
        .update(key, b"v3".to_vec(), created.mod_revision)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Conflict { key: k, expected: 1, actual: 3 } if k == key),
        "{err:?}"
    );
    let err = store.update("/missing", b"v".to_vec(), 1).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound(ref k) if k == "/missing"), "{err:?}");
    assert_eq!(store.get(key).await.unwrap(), Some(updated));
    assert_eq!(store.current_revision().await.unwrap(), 3);
}

pub(crate) async fn delete_with_and_without_precondition(store: Arc<dyn Store>) {
    let a = store.create("/k/a", b"a".to_vec()).await.unwrap();
    let b = store.create("/k/b", b"b".to_vec()).await.unwrap();
    let err = store.delete("/k/a", Some(a.mod_revision + 7)).await.unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Conflict {
                expected: 8,
                actual: 1,
                ..
            }
        ),
        "{err:?}"
    );
    let deleted = store.delete("/k/a", Some(a.mod_revision)).await.unwrap();
    assert_eq!(deleted.mod_revision, 3);
    assert_eq!(deleted.create_revision, a.create_revision);
    assert_eq!(&deleted.value[..], b"a");
    assert_eq!(store.get("/k/a").await.unwrap(), None);
    let deleted = store.delete("/k/b", None).await.unwrap();
    assert_eq!(deleted.mod_revision, 4);
    assert_eq!(deleted.create_revision, b.create_revision);
    let err = store.delete("/k/b", None).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound(_)), "{err:?}");
    // Recreating starts a new life.
    let again = store.create("/k/a", b"a2".to_vec()).await.unwrap();
    assert_eq!(again.create_revision, 5);
    assert!(store.list("/k/", ListOptions::default()).await.unwrap().items == vec![again]);
}

pub(crate) async fn list_prefix_limit_start_after(store: Arc<dyn Store>) {
    for ns in ["default", "kube-system"] {
        for i in 1..=3 {
            store
                .create(&format!("/registry/pods/{ns}/web-{i}"), b"{}".to_vec())
                .await
                .unwrap();
        }
    }
    store.create("/registry/podsx/a", b"{}".to_vec()).await.unwrap();
    store.create("/registry/pods", b"{}".to_vec()).await.unwrap();
    let all = store.list("/registry/pods/", ListOptions::default()).await.unwrap();
    assert_eq!(all.items.len(), 6);
    assert!(!all.more);
    assert_eq!(all.revision, 8);
    let ns = store
        .list("/registry/pods/default/", ListOptions::default())
        .await
        .unwrap();
    assert_eq!(
        keys(&ns.items),
        [
            "/registry/pods/default/web-1",
            "/registry/pods/default/web-2",
            "/registry/pods/default/web-3"
        ]
    );
    let page1 = store
        .list(
            "/registry/pods/",
            ListOptions {
                limit: 4,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(page1.items.len(), 4);
    assert!(page1.more);
    let page2 = store
        .list(
            "/registry/pods/",
            ListOptions {
                limit: 4,
                start_after: Some(page1.items[3].key.clone()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        keys(&page2.items),
        ["/registry/pods/kube-system/web-2", "/registry/pods/kube-system/web-3"]
    );
    assert!(!page2.more);
    // Exactly `limit` items left: no more.
    let exact = store
        .list(
            "/registry/pods/",
            ListOptions {
                limit: 2,
                start_after: Some("/registry/pods/kube-system/web-1".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(exact.items.len(), 2);
    assert!(!exact.more);
    // start_after before the prefix starts at the prefix.
    let before = store
        .list(
            "/registry/pods/kube-system/",
            ListOptions {
                start_after: Some("/a".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(before.items.len(), 3);
    let everything = store.list("", ListOptions::default()).await.unwrap();
    assert_eq!(everything.items.len(), 8);
    assert_eq!(everything.items[0].key, "/registry/pods");
}

pub(crate) async fn list_at_old_revision(store: Arc<dyn Store>) {
    let a = store.create("/r/a", b"a1".to_vec()).await.unwrap();
    let b = store.create("/r/b", b"b1".to_vec()).await.unwrap();
    let c = store.create("/r/c", b"c1".to_vec()).await.unwrap();
    let at = store.current_revision().await.unwrap();
    store.update("/r/a", b"a2".to_vec(), a.mod_revision).await.unwrap();
    store.delete("/r/b", None).await.unwrap();
    store.create("/r/d", b"d1".to_vec()).await.unwrap();
    store.create("/r/b", b"b2".to_vec()).await.unwrap();
    let old = store
        .list(
            "/r/",
            ListOptions {
                revision: Some(at),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(old.revision, at);
    assert_eq!(old.items, vec![a.clone(), b.clone(), c.clone()]);
    assert!(!old.more);
    let paged = store
        .list(
            "/r/",
            ListOptions {
                revision: Some(at),
                limit: 1,
                start_after: Some("/r/a".into()),
            },
        )
        .await
        .unwrap();
    assert_eq!(paged.items, vec![b.clone()]);
    assert!(paged.more);
    // Between the update and the delete.
    let mid = store
        .list(
            "/r/",
            ListOptions {
                revision: Some(at + 2),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(keys(&mid.items), ["/r/a", "/r/c"]);
    assert_eq!(&mid.items[0].value[..], b"a2");
    let first = store
        .list(
            "/r/",
            ListOptions {
                revision: Some(1),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(first.items, vec![a]);
    let now = store.current_revision().await.unwrap();
    let current = store
        .list(
            "/r/",
            ListOptions {
                revision: Some(now),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(keys(&current.items), ["/r/a", "/r/b", "/r/c", "/r/d"]);
    assert_eq!(&current.items[1].value[..], b"b2");
    let err = store
        .list(
            "/r/",
            ListOptions {
                revision: Some(now + 1),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::FutureRevision(r) if r == now + 1), "{err:?}");
}

/// A fixed history: 1 create /w/a, 2 create /w/b, 3 update /w/a,
/// 4 create /x/c, 5 delete /w/b, 6 update /x/c.
pub(crate) async fn write_history(store: &Arc<dyn Store>) {
    let a = store.create("/w/a", b"a1".to_vec()).await.unwrap();
    store.create("/w/b", b"b1".to_vec()).await.unwrap();
    store.update("/w/a", b"a2".to_vec(), a.mod_revision).await.unwrap();
    let c = store.create("/x/c", b"c1".to_vec()).await.unwrap();
    store.delete("/w/b", None).await.unwrap();
    store.update("/x/c", b"c2".to_vec(), c.mod_revision).await.unwrap();
}

pub(crate) async fn watch_from_zero(store: Arc<dyn Store>) {
    write_history(&store).await;
    let mut stream = store.watch("", 0).await.unwrap();
    let events = take_events(&mut stream, 6).await;
    assert_eq!(
        summary(&events),
        [
            (1, "/w/a".into(), "create"),
            (2, "/w/b".into(), "create"),
            (3, "/w/a".into(), "update"),
            (4, "/x/c".into(), "create"),
            (5, "/w/b".into(), "delete"),
            (6, "/x/c".into(), "update"),
        ]
    );
    match &events[2] {
        Event::Put { kv, prev: Some(prev) } => {
            assert_eq!(&kv.value[..], b"a2");
            assert_eq!(kv.create_revision, 1);
            assert_eq!(&prev.value[..], b"a1");
            assert_eq!(prev.mod_revision, 1);
        }
        other => panic!("{other:?}"),
    }
    match &events[4] {
        Event::Delete { prev, revision } => {
            assert_eq!(*revision, 5);
            assert_eq!(&prev.value[..], b"b1");
            assert_eq!(prev.mod_revision, 2);
            assert_eq!(prev.create_revision, 2);
        }
        other => panic!("{other:?}"),
    }
    assert_quiet(&mut stream).await;
    store.create("/w/z", b"z".to_vec()).await.unwrap();
    assert_eq!(next_event(&mut stream).await.revision(), 7);
}

pub(crate) async fn watch_from_middle_and_prefix(store: Arc<dyn Store>) {
    write_history(&store).await;
    let mut w = store.watch("/w/", 2).await.unwrap();
    let events = take_events(&mut w, 2).await;
    assert_eq!(
        summary(&events),
        [(3, "/w/a".into(), "update"), (5, "/w/b".into(), "delete")]
    );
    let mut x = store.watch("/x/", 4).await.unwrap();
    assert_eq!(summary(&take_events(&mut x, 1).await), [(6, "/x/c".into(), "update")]);
    store.create("/x/d", b"d".to_vec()).await.unwrap();
    store.create("/w/e", b"e".to_vec()).await.unwrap();
    assert_eq!(summary(&take_events(&mut x, 1).await), [(7, "/x/d".into(), "create")]);
    assert_eq!(summary(&take_events(&mut w, 1).await), [(8, "/w/e".into(), "create")]);
    assert_quiet(&mut w).await;
    assert_quiet(&mut x).await;
    // From the current revision: nothing old.
    let mut now = store.watch("", 8).await.unwrap();
    assert_quiet(&mut now).await;
}

pub(crate) async fn watch_live(store: Arc<dyn Store>) {
    let mut stream = store.watch("/live/", 0).await.unwrap();
    // From a future revision: only what comes after it.
    let mut future = store.watch("/live/", 3).await.unwrap();
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            for i in 0..50 {
                store.create(&format!("/live/{i:02}"), b"{}".to_vec()).await.unwrap();
                store.create(&format!("/dead/{i:02}"), b"{}".to_vec()).await.unwrap();
            }
        })
    };
    let events = take_events(&mut stream, 50).await;
    writer.await.unwrap();
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event.key(), format!("/live/{i:02}"));
        assert_eq!(event.revision(), 2 * i as i64 + 1);
    }
    assert_quiet(&mut stream).await;
    assert_eq!(next_event(&mut future).await.revision(), 5);
    // A dropped watcher does not disturb writers.
    drop(stream);
    store.create("/live/after", b"{}".to_vec()).await.unwrap();
}

pub(crate) async fn watch_after_compaction(store: Arc<dyn Store>) {
    write_history(&store).await;
    store.compact(4).await.unwrap();
    assert_eq!(store.compacted_revision().await.unwrap(), 4);
    let err = store.watch("", 2).await.err().expect("watch below the compaction");
    assert!(
        matches!(
            err,
            StoreError::Compacted {
                requested: 2,
                compacted: 4
            }
        ),
        "{err:?}"
    );
    let err = store
        .list(
            "/w/",
            ListOptions {
                revision: Some(3),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Compacted { .. }), "{err:?}");
    // The state at the compaction point and everything after survive.
    let at = store
        .list(
            "",
            ListOptions {
                revision: Some(4),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(keys(&at.items), ["/w/a", "/w/b", "/x/c"]);
    let mut stream = store.watch("", 4).await.unwrap();
    let events = take_events(&mut stream, 2).await;
    assert_eq!(
        summary(&events),
        [(5, "/w/b".into(), "delete"), (6, "/x/c".into(), "update")]
    );
    match &events[1] {
        Event::Put { prev: Some(prev), .. } => assert_eq!(&prev.value[..], b"c1"),
        other => panic!("{other:?}"),
    }
    let now = store.list("", ListOptions::default()).await.unwrap();
    assert_eq!(keys(&now.items), ["/w/a", "/x/c"]);
    // Compacting again to an older revision changes nothing; the future is refused.
    store.compact(3).await.unwrap();
    assert_eq!(store.compacted_revision().await.unwrap(), 4);
    let err = store.compact(7).await.unwrap_err();
    assert!(matches!(err, StoreError::FutureRevision(7)), "{err:?}");
    store.compact(6).await.unwrap();
    let at = store
        .list(
            "",
            ListOptions {
                revision: Some(6),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(keys(&at.items), ["/w/a", "/x/c"]);
    // Writes continue after compaction with increasing revisions.
    assert_eq!(store.create("/w/b", b"b".to_vec()).await.unwrap().mod_revision, 7);
    assert_eq!(next_event(&mut stream).await.revision(), 7);
}

pub(crate) async fn concurrent_creates(store: Arc<dyn Store>) {
    let tasks: Vec<_> = (0..64)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut revisions = Vec::new();
                for i in 0..20 {
                    let kv = store
                        .create(&format!("/registry/pods/ns/p-{t:02}-{i:02}"), b"{}".to_vec())
                        .await
                        .unwrap();
                    revisions.push(kv.mod_revision);
                }
                revisions
            })
        })
        .collect();
    let mut revisions = Vec::new();
    for task in tasks {
        let mine = task.await.unwrap();
        assert!(mine.windows(2).all(|w| w[0] < w[1]), "a client's writes are ordered");
        revisions.extend(mine);
    }
    revisions.sort_unstable();
    assert_eq!(revisions, (1..=1280).collect::<Vec<_>>());
    let all = store.list("/registry/pods/", ListOptions::default()).await.unwrap();
    assert_eq!(all.items.len(), 1280);
    assert_eq!(all.revision, 1280);
}

/// Many clients race on the same few keys: one create of each wins, and read-modify-write
/// loops (update with the revision read, retry on conflict) lose no increment, however
/// the writes fall into batches.
pub(crate) async fn contended_keys_lose_no_update(store: Arc<dyn Store>) {
    const KEYS: usize = 4;
    const CLIENTS: usize = 32;
    const INCREMENTS: u64 = 25;
    let creates: Vec<_> = (0..CLIENTS)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move { store.create(&format!("/c/{}", t % KEYS), b"0".to_vec()).await })
        })
        .collect();
    let mut won = 0;
    for task in creates {
        match task.await.unwrap() {
            Ok(_) => won += 1,
            Err(StoreError::AlreadyExists(_)) => {}
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    assert_eq!(won, KEYS, "exactly one create per key wins");
    let bumps: Vec<_> = (0..CLIENTS)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                let key = format!("/c/{}", t % KEYS);
                for _ in 0..INCREMENTS {
                    loop {
                        let kv = store.get(&key).await.unwrap().expect("created");
                        let n: u64 = std::str::from_utf8(&kv.value).unwrap().parse().unwrap();
                        match store
                            .update(&key, (n + 1).to_string().into_bytes(), kv.mod_revision)
                            .await
                        {
                            Ok(_) => break,
                            Err(StoreError::Conflict { .. }) => continue,
                            Err(e) => panic!("unexpected error: {e}"),
                        }
                    }
                }
            })
        })
        .collect();
    for task in bumps {
        task.await.unwrap();
    }
    for k in 0..KEYS {
        let kv = store.get(&format!("/c/{k}")).await.unwrap().expect("created");
        let per_key = (CLIENTS / KEYS) as u64 * INCREMENTS;
        assert_eq!(std::str::from_utf8(&kv.value).unwrap(), per_key.to_string());
    }
    let total = KEYS as u64 + CLIENTS as u64 * INCREMENTS;
    assert_eq!(store.current_revision().await.unwrap(), total as crate::Revision);
}

pub(crate) async fn revisions_are_global_and_increasing(store: Arc<dyn Store>) {
    let mut last = 0;
    for i in 0..10 {
        let kv = store.create(&format!("/g/{i}"), vec![i]).await.unwrap();
        assert!(kv.mod_revision > last);
        last = kv.mod_revision;
        let kv = store
            .update(&format!("/g/{i}"), vec![i, i], kv.mod_revision)
            .await
            .unwrap();
        assert_eq!(kv.mod_revision, last + 1);
        last = kv.mod_revision;
    }
    assert_eq!(store.current_revision().await.unwrap(), last);
}

pub(crate) async fn transactions_write_all_or_nothing(store: Arc<dyn Store>) {
    use crate::Op;
    let mut watch = store.watch("/", 0).await.unwrap();
    let svc = store.create("/s/a", b"v1".to_vec()).await.unwrap();
    let kvs = store
        .txn(vec![
            Op::Update {
                key: "/s/a".into(),
                value: b"v2".to_vec(),
                expected: svc.mod_revision,
            },
            Op::Create {
                key: "/ip/1".into(),
                value: b"a".to_vec(),
            },
            Op::Create {
                key: "/ip/2".into(),
                value: b"b".to_vec(),
            },
        ])
        .await
        .unwrap();
    let revs: Vec<_> = kvs.iter().map(|kv| kv.mod_revision).collect();
    // One revision for all (etcd) or consecutive ones (SQLite, memory), after every earlier write.
    assert!(revs == [2, 2, 2] || revs == [2, 3, 4], "{revs:?}");
    let last = revs[2];
    assert_eq!(kvs[1].create_revision, revs[1]);
    assert_eq!(kvs[0].create_revision, 1);
    assert_eq!(&store.get("/ip/1").await.unwrap().unwrap().value[..], b"a");
    assert_eq!(store.get("/s/a").await.unwrap().unwrap().mod_revision, revs[0]);
    assert_eq!(store.current_revision().await.unwrap(), last);

    // One op that does not hold: its error, and nothing written.
    let err = store
        .txn(vec![
            Op::Create {
                key: "/s/b".into(),
                value: b"b".to_vec(),
            },
            Op::Create {
                key: "/ip/1".into(),
                value: b"taken".to_vec(),
            },
        ])
        .await
        .unwrap_err();
    assert!(matches!(&err, StoreError::AlreadyExists(k) if k == "/ip/1"), "{err:?}");
    assert_eq!(store.get("/s/b").await.unwrap(), None);
    assert_eq!(store.current_revision().await.unwrap(), last);
    let err = store
        .txn(vec![
            Op::Delete {
                key: "/s/a".into(),
                expected: None,
            },
            Op::Delete {
                key: "/ip/1".into(),
                expected: Some(1),
            },
        ])
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Conflict { actual, .. } if actual == revs[1]),
        "{err:?}"
    );
    assert!(store.get("/s/a").await.unwrap().is_some());

    let done = store
        .txn(vec![
            Op::Delete {
                key: "/s/a".into(),
                expected: Some(revs[0]),
            },
            Op::Delete {
                key: "/ip/1".into(),
                expected: Some(revs[1]),
            },
        ])
        .await
        .unwrap();
    assert_eq!(done.len(), 2);
    assert!(done[0].mod_revision > last);
    assert_eq!(store.get("/s/a").await.unwrap(), None);
    assert_eq!(store.get("/ip/1").await.unwrap(), None);
    // Watchers see each write of a transaction, in order, and nothing of a failed one.
    let seen: Vec<_> = take_events(&mut watch, 6)
        .await
        .iter()
        .map(|e| (e.key().to_string(), e.revision()))
        .collect();
    assert_eq!(
        seen,
        [
            ("/s/a".to_string(), 1),
            ("/s/a".to_string(), revs[0]),
            ("/ip/1".to_string(), revs[1]),
            ("/ip/2".to_string(), revs[2]),
            ("/s/a".to_string(), done[0].mod_revision),
            ("/ip/1".to_string(), done[1].mod_revision),
        ]
    );
    assert_quiet(&mut watch).await;
}

/// Erasing history keeps every current value and the revision counter; only reads before the
/// erased point fail, and a watch from it sees what comes next.
pub(crate) async fn erase_history_keeps_the_present(store: Arc<dyn Store>) {
    write_history(&store).await;
    let err = store.erase_history(7).await.unwrap_err();
    assert!(matches!(err, StoreError::FutureRevision(7)), "{err:?}");
    let mut live = store.watch("", 6).await.unwrap();
    store.erase_history(6).await.unwrap();
    assert_eq!(store.compacted_revision().await.unwrap(), 6);
    assert_eq!(store.current_revision().await.unwrap(), 6);
    let now = store.list("", ListOptions::default()).await.unwrap();
    let values: Vec<_> = now.items.iter().map(|kv| (kv.key.as_str(), &kv.value[..])).collect();
    assert_eq!(values, [("/w/a", &b"a2"[..]), ("/x/c", &b"c2"[..])]);
    let err = store.watch("", 5).await.err().expect("watch below the erased point");
    assert!(matches!(err, StoreError::Compacted { compacted: 6, .. }), "{err:?}");
    let mut stream = store.watch("", 6).await.unwrap();
    let c = store.get("/x/c").await.unwrap().unwrap();
    store.update("/x/c", b"c3".to_vec(), c.mod_revision).await.unwrap();
    for stream in [&mut stream, &mut live] {
        match next_event(stream).await {
            Event::Put { kv, prev: Some(prev) } => {
                assert_eq!((kv.mod_revision, &kv.value[..]), (7, &b"c3"[..]));
                assert_eq!(&prev.value[..], b"c2");
            }
            other => panic!("{other:?}"),
        }
    }
    // Erasing again at the same point changes nothing.
    store.erase_history(6).await.unwrap();
    assert_eq!(store.get("/x/c").await.unwrap().unwrap().mod_revision, 7);
}
