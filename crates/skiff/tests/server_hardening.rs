//! Clients that misbehave cannot hurt the server: a slowloris client is dropped, 10,000 idle
//! connections leave kubectl working, oversized headers are a 431, a burst over
//! `--max-requests-inflight` gets 429 with `Retry-After`, a request past `--request-timeout` a
//! 504 that wrote nothing; SIGTERM stops `skiff server` at once with exit 0, its node's
//! containers still running and every acknowledged write there after a restart.
//!
//! Slow requests here are slow because their client sends their body slowly: nothing depends on
//! how fast the machine is.

#![cfg(test)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::node::Node;
use common::{Cluster, eventually, tail};

const CONTROL_PLANE: &[&str] = &["--no-agent", "--no-scheduler"];

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A TLS connection to the server (HTTP/1.1), verified against the cluster's CA.
fn connect(c: &Cluster) -> Tls {
    use rustls::pki_types::pem::PemObject;
    let ca = std::fs::read(c.path().join("pki/ca.crt")).expect("ca.crt");
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from_pem_slice(&ca).expect("CA certificate"))
        .expect("root");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let conn = rustls::ClientConnection::new(Arc::new(config), name).expect("TLS client");
    let tcp = TcpStream::connect(("127.0.0.1", c.port)).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock).expect("TLS handshake");
    }
    tls
}

/// Sends a request's line and headers (with the admin token) and `body`.
fn send(tls: &mut Tls, token: &str, method: &str, path: &str, content_length: usize, body: &[u8]) {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {content_length}\r\n\r\n"
    );
    tls.write_all(head.as_bytes()).expect("send the head");
    tls.write_all(body).expect("send the body");
    tls.flush().expect("flush");
}

/// A response's code, headers (lower-case names) and body.
type Answer = (u16, Vec<(String, String)>, String);

/// Reads one response.
fn read_response(tls: &mut Tls) -> std::io::Result<Answer> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if tls.read(&mut byte)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let mut lines = head.lines();
    let code = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    tls.read_exact(&mut body)?;
    Ok((code, headers, String::from_utf8_lossy(&body).into_owned()))
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// One request on a connection of its own.
fn request(c: &Cluster, method: &str, path: &str, body: &str) -> Answer {
    let mut tls = connect(c);
    send(&mut tls, &c.admin_token(), method, path, body.len(), body.as_bytes());
    read_response(&mut tls).expect("a response")
}

/// A request whose body never comes: it holds its slot of max in flight until the connection
/// closes or `--request-timeout` passes.
fn stalled(c: &Cluster, method: &str, path: &str) -> Tls {
    let mut tls = connect(c);
    send(&mut tls, &c.admin_token(), method, path, 100, b"{");
    tls
}

fn configmap(name: &str) -> String {
    format!(r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}"}},"data":{{"k":"v"}}}}"#)
}

#[test]
fn a_slowloris_client_is_dropped_while_others_are_served() {
    let c = Cluster::start(&[CONTROL_PLANE, &["--header-read-timeout", "2s"]].concat());
    let mut tls = connect(&c);
    tls.sock
        .set_read_timeout(Some(Duration::from_millis(100)))
        .expect("read timeout");
    let started = Instant::now();
    let dropped = Arc::new(AtomicBool::new(false));
    let slow = {
        let dropped = dropped.clone();
        std::thread::spawn(move || {
            // Headers that never end, a byte every 200 ms.
            let head = format!(
                "GET /api/v1/namespaces HTTP/1.1\r\nHost: localhost\r\nX-Slow: {}",
                "a".repeat(200)
            );
            for byte in head.bytes() {
                let written = tls.write_all(&[byte]).and_then(|()| tls.flush());
                let mut answer = [0u8; 256];
                let read = match written {
                    Err(_) => Some(String::new()),
                    Ok(()) => match tls.read(&mut answer) {
                        Ok(n) => Some(String::from_utf8_lossy(&answer[..n]).into_owned()),
                        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                            None
                        }
                        Err(_) => Some(String::new()),
                    },
                };
                if let Some(answer) = read {
                    dropped.store(true, Ordering::SeqCst);
                    return Some((started.elapsed(), answer));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            None
        })
    };
    // Other clients are served meanwhile.
    while !dropped.load(Ordering::SeqCst) && started.elapsed() < Duration::from_secs(30) {
        c.k(&["get", "namespaces"]);
    }
    let (after, answer) = slow
        .join()
        .expect("slow client")
        .expect("the slow client was never dropped");
    assert!(
        after >= Duration::from_millis(1900),
        "dropped after {after:?}, before the header read timeout"
    );
    assert!(!answer.contains("200 OK"), "the slow request was served: {answer}");
    c.k(&["get", "namespaces"]);
}

#[test]
fn ten_thousand_idle_connections_leave_kubectl_working() {
    const IDLE: usize = 10_000;
    // This process holds the client ends.
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct they are given.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        assert!(
            limit.rlim_max as usize > IDLE + 1000,
            "the hard open file limit ({}) is too low for this test",
            limit.rlim_max
        );
        limit.rlim_cur = limit.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
    let c = Cluster::start(CONTROL_PLANE);
    let idle: Vec<TcpStream> = (0..IDLE)
        .map(|i| {
            TcpStream::connect(("127.0.0.1", c.port))
                .unwrap_or_else(|e| panic!("idle connection {i}: {e}\n{}", tail(&c.log(), 20)))
        })
        .collect();
    c.k(&["get", "namespaces"]);
    c.k(&["create", "configmap", "while-idle", "--from-literal=k=v"]);
    assert_eq!(
        c.k(&["get", "configmap", "while-idle", "-o", "jsonpath={.data.k}"]),
        "v"
    );
    // The server closes connections that do not finish their TLS handshake in 10 s.
    for tcp in &idle {
        tcp.set_read_timeout(Some(Duration::from_secs(40)))
            .expect("read timeout");
    }
    let deadline = Instant::now() + Duration::from_secs(40);
    for (i, mut tcp) in idle.iter().enumerate() {
        let mut buf = [0u8; 16];
        let read = tcp.read(&mut buf);
        assert!(
            matches!(read, Ok(0)) || matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
            "idle connection {i} not closed: {read:?}"
        );
        assert!(Instant::now() < deadline, "idle connections closed too slowly");
    }
    drop(idle);
    c.k(&["get", "namespaces"]);
    assert!(
        !c.log().contains("accepting a connection failed"),
        "the server ran out of descriptors:\n{}",
        tail(&c.log(), 20)
    );
}

#[test]
fn at_max_connections_new_connections_wait_until_others_close() {
    let c = Cluster::start(&[CONTROL_PLANE, &["--max-connections", "4"]].concat());
    let idle: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(("127.0.0.1", c.port)).expect("connect"))
        .collect();
    // The server accepts no fifth connection: kubectl's handshake is never answered.
    let out = c.kubectl(&["--request-timeout", "2s", "get", "--raw", "/readyz"]);
    assert!(!out.status.success(), "served over --max-connections");
    drop(idle);
    c.k(&["get", "namespaces"]);
    assert!(c.log().contains("at --max-connections"), "{}", tail(&c.log(), 20));
}

#[test]
fn oversized_headers_are_a_431_and_oversized_bodies_a_413() {
    let c = Cluster::start(CONTROL_PLANE);
    let token = c.admin_token();
    // HTTP/1.1: fields of 60,000 bytes, `total` bytes of them.
    let http1 = |total: usize| -> u16 {
        let fields: String = (0..total.div_ceil(60_000))
            .map(|i| format!("X-Big-{i}: {}\r\n", "a".repeat(60_000.min(total - i * 60_000))))
            .collect();
        let mut tls = connect(&c);
        let head = format!(
            "GET /api/v1/namespaces HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\n{fields}\r\n"
        );
        // The server may answer and close before it has read it all.
        let _ = tls.write_all(head.as_bytes()).and_then(|()| tls.flush());
        read_response(&mut tls).map(|(code, _, _)| code).unwrap_or(0)
    };
    // Upstream's MaxHeaderBytes is 1 MiB: half of it is served, more is refused, also when the
    // whole head arrives at once.
    assert_eq!(http1(512 * 1024), 200);
    assert_eq!(http1(1100 * 1024), 431);
    // Far over it, the server answers and closes while the client still sends: the kernel may
    // then reset the connection before the client reads the 431. Either way it is refused.
    let far_over = http1(4 * 1024 * 1024);
    assert!(matches!(far_over, 431 | 0), "{far_over}");
    // HTTP/2 clients keep to the server's advertised limit themselves (curl to 64 KiB in all):
    // 60 KB is served, beyond the 16 KiB HTTP/2 libraries allow by default.
    let file = c.path().join("header-h2");
    std::fs::write(&file, format!("X-Big: {}\n", "a".repeat(60_000))).expect("header file");
    let out = Command::new("curl")
        .args([
            "-sk",
            "--http2",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{http_version}",
        ])
        .arg("-H")
        .arg(format!("Authorization: Bearer {token}"))
        .arg("-H")
        .arg(format!("@{}", file.display()))
        .arg(format!("https://127.0.0.1:{}/api/v1/namespaces", c.port))
        .output()
        .expect("curl");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200 2");
    let big = configmap(&"x".repeat(4 * 1024 * 1024));
    let (code, _, body) = request(&c, "POST", "/api/v1/namespaces/default/configmaps", &big);
    assert_eq!(code, 413, "{body}");
    c.k(&["get", "namespaces"]);
}

#[test]
fn over_max_in_flight_a_burst_gets_429_with_retry_after() {
    let c = Cluster::start(&[
        "--no-agent",
        "--no-scheduler",
        "--max-requests-inflight",
        "2",
        "--max-mutating-requests-inflight",
        "1",
    ]);
    // Two reads and a write whose bodies never come fill both pools.
    let readers: Vec<Tls> = (0..2)
        .map(|_| stalled(&c, "GET", "/api/v1/namespaces/default/configmaps"))
        .collect();
    let writer = stalled(&c, "POST", "/api/v1/namespaces/default/configmaps");
    let refused = eventually(Duration::from_secs(20), || {
        let (code, headers, body) = request(&c, "GET", "/api/v1/namespaces", "");
        (code == 429).then_some((headers, body))
    })
    .expect("reads over --max-requests-inflight were served");
    assert_eq!(header(&refused.0, "retry-after"), Some("1"));
    assert_eq!(refused.1, "Too many requests, please try again later.\n");
    let write_refused = eventually(Duration::from_secs(20), || {
        let (code, _, _) = request(&c, "POST", "/api/v1/namespaces/default/configmaps", &configmap("probe"));
        (code == 429).then_some(())
    });
    assert!(
        write_refused.is_some(),
        "writes over --max-mutating-requests-inflight were served"
    );
    // A burst: every read and write is refused while the pools are full.
    let burst: Vec<_> = (0..8)
        .map(|i| {
            let (method, path, body) = if i % 2 == 0 {
                ("GET", "/api/v1/namespaces/default/configmaps", String::new())
            } else {
                (
                    "POST",
                    "/api/v1/namespaces/default/configmaps",
                    configmap(&format!("burst-{i}")),
                )
            };
            let mut tls = connect(&c);
            send(&mut tls, &c.admin_token(), method, path, body.len(), body.as_bytes());
            tls
        })
        .collect();
    for mut tls in burst {
        let (code, headers, body) = read_response(&mut tls).expect("a response");
        assert_eq!(code, 429, "{body}");
        assert_eq!(header(&headers, "retry-after"), Some("1"));
    }
    // Watches are long-running, not counted.
    let mut watch = connect(&c);
    send(
        &mut watch,
        &c.admin_token(),
        "GET",
        "/api/v1/namespaces/default/configmaps?watch=1",
        0,
        b"",
    );
    let (code, _, _) = read_watch_head(&mut watch);
    assert_eq!(code, 200);
    // system:masters is served over the limit, and the controllers inside the server (in-process)
    // are not starved: a new namespace gets its default ServiceAccount.
    let masters = c.path().join("super-admin.kubeconfig");
    let masters = masters.to_str().expect("path");
    c.k(&["--kubeconfig", masters, "create", "namespace", "while-full"]);
    let account = eventually(Duration::from_secs(30), || {
        let out = c.kubectl(&[
            "--kubeconfig",
            masters,
            "get",
            "serviceaccount",
            "default",
            "-n",
            "while-full",
        ]);
        out.status.success().then_some(())
    });
    assert!(account.is_some(), "the serviceaccount controller was starved");
    // Once the slow requests are gone, the pools serve again.
    drop(readers);
    drop(writer);
    let served = eventually(Duration::from_secs(20), || {
        (request(&c, "GET", "/api/v1/namespaces", "").0 == 200).then_some(())
    });
    assert!(served.is_some(), "{}", tail(&c.log(), 20));
    c.k(&["create", "configmap", "after", "--from-literal=k=v"]);
    assert!(c.log().contains("too many requests in flight, answered 429"));
}

/// The status line and headers of a streamed response.
fn read_watch_head(tls: &mut Tls) -> (u16, String, ()) {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if tls.read(&mut byte).expect("watch response") == 0 {
            break;
        }
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, head, ())
}

#[test]
fn past_request_timeout_a_write_is_a_504_and_nothing_is_written() {
    let c = Cluster::start(&[CONTROL_PLANE, &["--request-timeout", "2s"]].concat());
    let body = configmap("too-slow");
    let (half, _) = body.split_at(body.len() / 2);
    let mut tls = connect(&c);
    let started = Instant::now();
    send(
        &mut tls,
        &c.admin_token(),
        "POST",
        "/api/v1/namespaces/default/configmaps",
        body.len(),
        half.as_bytes(),
    );
    let (code, headers, answer) = read_response(&mut tls).expect("a response");
    assert!(
        started.elapsed() >= Duration::from_millis(1900),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(code, 504, "{answer}");
    let status: serde_json::Value = serde_json::from_str(&answer).expect("a Status");
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["reason"], "Timeout");
    assert_eq!(
        status["message"],
        "Timeout: request did not complete within the allotted timeout"
    );
    assert!(header(&headers, "audit-id").is_some());
    // The rest of the body, too late: it is not applied.
    let _ = tls.write_all(&body.as_bytes()[body.len() / 2..]);
    std::thread::sleep(Duration::from_millis(500));
    let err = c.k_err(&["get", "configmap", "too-slow"]);
    assert!(err.contains("NotFound"), "{err}");
    // kubectl's --request-timeout is the request's ?timeout=; a request in time is served.
    c.k(&["--request-timeout", "1s", "get", "namespaces"]);
}

#[test]
fn sigterm_stops_the_server_keeping_containers_and_acknowledged_writes() {
    let mut n = Node::start("sigterm", &[]);
    n.c.apply(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: survivor
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: busybox:latest
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
"#,
        &[],
    );
    n.wait_running("survivor");
    let containers = docker(&["ps", "-q", "--filter", &format!("label=io.skiff.node={}", n.name)]);
    assert!(!containers.is_empty(), "no containers for node {}", n.name);

    // Writers create ConfigMaps as fast as they are answered; each 201 is an acknowledgement.
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let mut tls = connect(&n.c);
            let token = n.c.admin_token();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut acknowledged = Vec::new();
                for i in 0.. {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let name = format!("w{w}-{i}");
                    let body = configmap(&name);
                    let path = "/api/v1/namespaces/default/configmaps";
                    let head = format!(
                        "POST {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\n\
                         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if tls.write_all(head.as_bytes()).and_then(|()| tls.flush()).is_err() {
                        break;
                    }
                    match read_response(&mut tls) {
                        Ok((201, _, _)) => acknowledged.push(name),
                        _ => break,
                    }
                }
                acknowledged
            })
        })
        .collect();
    // Let the writes flow, then SIGTERM in the middle of them.
    std::thread::sleep(Duration::from_millis(1500));
    let mut child = n.c.child.take().expect("the server");
    let sent = Instant::now();
    // SAFETY: kill sends a signal to the server this test started.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = child.wait().expect("wait for the server");
    let took = sent.elapsed();
    stop.store(true, Ordering::SeqCst);
    let acknowledged: Vec<String> = writers.into_iter().flat_map(|w| w.join().expect("writer")).collect();
    assert!(status.success(), "exit {status:?}:\n{}", tail(&n.c.log(), 30));
    assert!(took < Duration::from_secs(5), "stopping took {took:?}");
    assert!(
        acknowledged.len() > 10,
        "only {} writes before SIGTERM",
        acknowledged.len()
    );
    let log = n.c.log();
    assert!(
        log.contains("terminated, shutting down") && log.contains("stopped"),
        "{}",
        tail(&log, 20)
    );

    // The node agent left its containers running.
    for id in &containers {
        assert_eq!(
            docker(&["inspect", "-f", "{{.State.Running}}", id]),
            vec!["true".to_string()],
            "container {id} stopped with the server"
        );
    }

    // Every acknowledged write is there after a restart, and the pod still runs.
    n.c.restart();
    let stored = n.c.k(&["get", "configmaps", "-o", "name"]);
    let stored: std::collections::HashSet<&str> = stored.lines().collect();
    for name in &acknowledged {
        assert!(
            stored.contains(format!("configmap/{name}").as_str()),
            "acknowledged {name} lost"
        );
    }
    n.wait_running("survivor");
    assert_eq!(
        docker(&["ps", "-q", "--filter", &format!("label=io.skiff.node={}", n.name)]),
        containers,
        "the restarted agent did not keep the running containers"
    );
}

fn docker(args: &[&str]) -> Vec<String> {
    let out = Command::new("docker").args(args).output().expect("docker");
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}
