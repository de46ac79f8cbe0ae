//! The authorization matrix: every resource and subresource the server's discovery lists, every
//! verb, in the caller's namespace, another namespace and at the cluster scope, plus odd spellings
//! of the same paths, sent as identities with no role, `view`, `edit`, a namespace `admin`, a
//! service account, an anonymous caller and a node. What each may do comes from an oracle written
//! here from upstream's default roles (`plugin/pkg/auth/authorizer/rbac/bootstrappolicy`), not
//! from the server's authorizer: a 2xx the oracle does not allow fails the test, and so does a
//! 403 where it allows (for the identities whose rights it knows in full). Writes are dry runs,
//! so nothing the matrix is allowed to do changes what it tests next.
//!
//! A seeded fuzz round then sends random paths (segments, escapes, slashes, verbs) as the
//! `view` user with the same oracle.

#![cfg(test)]

mod common;

use std::collections::BTreeSet;

use common::Cluster;
use http::{Method, Request};

const CONTROL_PLANE: &[&str] = &["--no-agent", "--no-scheduler"];
const TEAM: &str = "team";
const OTHER: &str = "other";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Id {
    Nobody,
    Anonymous,
    View,
    Edit,
    Admin,
    ServiceAccount,
    Node,
}

impl Id {
    fn user(self) -> (&'static str, &'static [&'static str]) {
        match self {
            Id::Nobody => ("mallory", &["system:authenticated"]),
            Id::Anonymous => ("system:anonymous", &["system:unauthenticated"]),
            Id::View => ("vera", &["system:authenticated"]),
            Id::Edit => ("ed", &["system:authenticated"]),
            Id::Admin => ("ada", &["system:authenticated"]),
            Id::ServiceAccount => (
                "system:serviceaccount:team:robot",
                &[
                    "system:serviceaccounts",
                    "system:serviceaccounts:team",
                    "system:authenticated",
                ],
            ),
            Id::Node => ("system:node:n1", &["system:nodes", "system:authenticated"]),
        }
    }
}

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["create", "update", "patch", "delete", "deletecollection"];

/// Upstream's `view` (aggregate-to-view), with metrics-server's reader aggregated into it.
const VIEW: &[(&str, &[&str])] = &[
    (
        "",
        &[
            "pods",
            "replicationcontrollers",
            "replicationcontrollers/scale",
            "serviceaccounts",
            "services",
            "services/status",
            "endpoints",
            "persistentvolumeclaims",
            "persistentvolumeclaims/status",
            "configmaps",
            "bindings",
            "events",
            "limitranges",
            "namespaces/status",
            "pods/log",
            "pods/status",
            "replicationcontrollers/status",
            "resourcequotas",
            "resourcequotas/status",
            "namespaces",
        ],
    ),
    (
        "apps",
        &[
            "controllerrevisions",
            "daemonsets",
            "daemonsets/status",
            "deployments",
            "deployments/scale",
            "deployments/status",
            "replicasets",
            "replicasets/scale",
            "replicasets/status",
            "statefulsets",
            "statefulsets/scale",
            "statefulsets/status",
        ],
    ),
    (
        "autoscaling",
        &["horizontalpodautoscalers", "horizontalpodautoscalers/status"],
    ),
    ("batch", &["cronjobs", "cronjobs/status", "jobs", "jobs/status"]),
    ("policy", &["poddisruptionbudgets", "poddisruptionbudgets/status"]),
    (
        "networking.k8s.io",
        &["ingresses", "ingresses/status", "networkpolicies"],
    ),
    ("discovery.k8s.io", &["endpointslices"]),
    ("metrics.k8s.io", &["pods", "nodes"]),
];

/// What upstream's `edit` adds: reads of the escalating resources, and writes.
const EDIT_READ: &[(&str, &[&str])] = &[(
    "",
    &[
        "pods/attach",
        "pods/proxy",
        "pods/exec",
        "pods/portforward",
        "secrets",
        "services/proxy",
    ],
)];
const EDIT_WRITE: &[(&str, &[&str])] = &[
    (
        "",
        &[
            "pods",
            "pods/attach",
            "pods/proxy",
            "pods/exec",
            "pods/portforward",
            "replicationcontrollers",
            "replicationcontrollers/scale",
            "serviceaccounts",
            "services",
            "services/proxy",
            "persistentvolumeclaims",
            "configmaps",
            "secrets",
            "events",
        ],
    ),
    (
        "apps",
        &[
            "statefulsets",
            "statefulsets/scale",
            "daemonsets",
            "deployments",
            "deployments/scale",
            "deployments/rollback",
            "replicasets",
            "replicasets/scale",
        ],
    ),
    ("autoscaling", &["horizontalpodautoscalers"]),
    ("batch", &["jobs", "cronjobs"]),
    ("policy", &["poddisruptionbudgets"]),
    ("networking.k8s.io", &["networkpolicies", "ingresses"]),
    ("coordination.k8s.io", &["leases"]),
];
const EDIT_CREATE: &[(&str, &[&str])] = &[("", &["pods/eviction", "serviceaccounts/token"])];
const EDIT_READ_WRITE: &[(&str, &[&str])] = &[("coordination.k8s.io", &["leases"])];

/// What upstream's `admin` adds.
const ADMIN_READ_WRITE: &[(&str, &[&str])] = &[("rbac.authorization.k8s.io", &["roles", "rolebindings"])];
const ADMIN_CREATE: &[(&str, &[&str])] = &[("authorization.k8s.io", &["localsubjectaccessreviews"])];

/// What every authenticated user may create (`system:basic-user`).
const BASIC_CREATE: &[(&str, &[&str])] = &[
    (
        "authorization.k8s.io",
        &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
    ),
    ("authentication.k8s.io", &["selfsubjectreviews"]),
];

fn listed(table: &[(&str, &[&str])], group: &str, resource: &str) -> bool {
    table
        .iter()
        .any(|(g, resources)| *g == group && resources.contains(&resource))
}

/// One request of the matrix: who, what, where.
#[derive(Clone, Debug)]
struct Probe {
    id: Id,
    method: Method,
    path: String,
    verb: &'static str,
    group: String,
    resource: String,
    /// The namespace the request's attributes carry (a namespace's own name for `namespaces`).
    namespace: Option<String>,
}

/// The oracle: `Some(allowed)`, or `None` where it does not know the identity's rights in full
/// (a node's, which depend on what is bound to it): then it only forbids what a node must never
/// do.
fn oracle(p: &Probe) -> Option<bool> {
    let (g, r, verb) = (p.group.as_str(), p.resource.as_str(), p.verb);
    let in_team = p.namespace.as_deref() == Some(TEAM);
    let basic = verb == "create" && listed(BASIC_CREATE, g, r);
    match p.id {
        Id::Anonymous => Some(false),
        Id::Nobody | Id::ServiceAccount => Some(basic),
        Id::View => Some(basic || (READ.contains(&verb) && listed(VIEW, g, r))),
        Id::Edit | Id::Admin => {
            let view = READ.contains(&verb) && listed(VIEW, g, r);
            let edit = (READ.contains(&verb) && listed(EDIT_READ, g, r))
                || (WRITE.contains(&verb) && listed(EDIT_WRITE, g, r))
                || (verb == "create" && listed(EDIT_CREATE, g, r))
                || ((READ.contains(&verb) || WRITE.contains(&verb)) && listed(EDIT_READ_WRITE, g, r));
            let admin = p.id == Id::Admin
                && (((READ.contains(&verb) || WRITE.contains(&verb)) && listed(ADMIN_READ_WRITE, g, r))
                    || (verb == "create" && listed(ADMIN_CREATE, g, r)));
            Some(basic || (in_team && (view || edit || admin)))
        }
        Id::Node => {
            // What no node may ever do, whatever is bound to it: read what no pod of it uses,
            // reach another node's Node or any EndpointSlice but its own DNS one, or list what
            // is not its own (its proxy, DNS and provisioner read under service accounts).
            let never = matches!(
                (g, r),
                (
                    "",
                    "secrets" | "configmaps" | "persistentvolumeclaims" | "serviceaccounts/token" | "namespaces"
                ) | ("rbac.authorization.k8s.io", _)
                    | ("admissionregistration.k8s.io", _)
                    | ("apiextensions.k8s.io", _)
                    | ("discovery.k8s.io", "endpointslices")
                    | ("", "pods/exec" | "pods/attach" | "pods/portforward")
            ) || (g.is_empty() && r == "nodes" && verb != "create")
                || (g.is_empty() && matches!(r, "persistentvolumes" | "pods") && READ.contains(&verb));
            if never { Some(false) } else { None }
        }
    }
}

/// A served resource as discovery lists it.
#[derive(Clone, Debug)]
struct Served {
    group: String,
    version: String,
    name: String,
    namespaced: bool,
}

async fn get_json(client: &kube::Client, path: &str) -> serde_json::Value {
    let req = Request::get(path).body(Vec::new()).expect("request");
    let text = client.request_text(req).await.expect("discovery");
    serde_json::from_str(&text).expect("json")
}

async fn served(client: &kube::Client) -> Vec<Served> {
    let mut group_versions = vec![(String::new(), "v1".to_string())];
    let groups = get_json(client, "/apis").await;
    for g in groups["groups"].as_array().into_iter().flatten() {
        let name = g["name"].as_str().unwrap_or("").to_string();
        let version = g["preferredVersion"]["version"].as_str().unwrap_or("").to_string();
        group_versions.push((name, version));
    }
    let mut out = Vec::new();
    for (group, version) in group_versions {
        let path = if group.is_empty() {
            "/api/v1".to_string()
        } else {
            format!("/apis/{group}/{version}")
        };
        let list = get_json(client, &path).await;
        for r in list["resources"].as_array().into_iter().flatten() {
            out.push(Served {
                group: group.clone(),
                version: version.clone(),
                name: r["name"].as_str().unwrap_or("").to_string(),
                namespaced: r["namespaced"].as_bool().unwrap_or(false),
            });
        }
    }
    out
}

/// The method, path and authorization verb of `verb` on `res` (name `probe`) in `namespace`.
fn request_for(res: &Served, verb: &'static str, namespace: Option<&str>) -> Option<(Method, String)> {
    let (base, sub) = res
        .name
        .split_once('/')
        .map_or((res.name.as_str(), None), |(b, s)| (b, Some(s)));
    let prefix = if res.group.is_empty() {
        format!("/api/{}", res.version)
    } else {
        format!("/apis/{}/{}", res.group, res.version)
    };
    let scope = match namespace {
        Some(ns) if res.namespaced => format!("{prefix}/namespaces/{ns}"),
        Some(_) => return None,
        None => prefix,
    };
    let object = format!("{scope}/{base}/probe");
    let collection = format!("{scope}/{base}");
    let dry = "dryRun=All";
    Some(match (verb, sub) {
        ("get", None) => (Method::GET, object),
        ("get", Some(s)) => (Method::GET, format!("{object}/{s}")),
        ("list", None) => (Method::GET, collection),
        ("watch", None) => (Method::GET, format!("{collection}?watch=true&timeoutSeconds=1")),
        ("create", None) => (Method::POST, format!("{collection}?{dry}")),
        ("create", Some(s)) => (Method::POST, format!("{object}/{s}?{dry}")),
        ("update", None) => (Method::PUT, format!("{object}?{dry}")),
        ("update", Some(s)) => (Method::PUT, format!("{object}/{s}?{dry}")),
        ("patch", None) => (Method::PATCH, format!("{object}?{dry}")),
        ("patch", Some(s)) => (Method::PATCH, format!("{object}/{s}?{dry}")),
        ("delete", None) => (Method::DELETE, format!("{object}?{dry}")),
        ("deletecollection", None) => (Method::DELETE, format!("{collection}?{dry}")),
        _ => return None,
    })
}

/// Sends `probe`'s request as its identity: the status code.
async fn send(client: &kube::Client, probe: &Probe) -> u16 {
    let (user, groups) = probe.id.user();
    let mut req = Request::builder()
        .method(probe.method.clone())
        .uri(probe.path.as_str())
        .header("Impersonate-User", user);
    for g in groups {
        req = req.header("Impersonate-Group", *g);
    }
    let content_type = if probe.method == Method::PATCH {
        "application/merge-patch+json"
    } else {
        "application/json"
    };
    let body = if matches!(probe.method, Method::POST | Method::PUT | Method::PATCH) {
        b"{}".to_vec()
    } else {
        Vec::new()
    };
    let req = req
        .header(http::header::CONTENT_TYPE, content_type)
        .body(kube::client::Body::from(body))
        .expect("request");
    match client.send(req).await {
        Ok(resp) => resp.status().as_u16(),
        Err(e) => panic!("{} {}: {e}", probe.method, probe.path),
    }
}

/// Checks one answer against the oracle; the failures are collected, not panicked on, so one
/// run reports them all.
fn judge(probe: &Probe, code: u16, failures: &mut Vec<String>) {
    let ok = (200..300).contains(&code);
    match oracle(probe) {
        Some(false) if ok => failures.push(format!("{probe:?}: {code}, the oracle forbids it")),
        Some(false) if probe.id != Id::Node && code != 403 && code != 401 => {
            failures.push(format!("{probe:?}: {code}, the oracle forbids it (403 expected)"))
        }
        Some(true) if code == 403 || code == 401 => failures.push(format!("{probe:?}: {code}, the oracle allows it")),
        _ => {}
    }
}

/// The objects the matrix's identities are bound by, written with `kubectl ARGS` (whatever
/// server `kubectl` runs against).
fn setup(k: Kubectl) {
    for ns in [TEAM, OTHER] {
        k(&["create", "namespace", ns]);
        k(&["create", "secret", "generic", "probe", "-n", ns, "--from-literal=k=v"]);
    }
    k(&[
        "create",
        "clusterrolebinding",
        "vera-view",
        "--clusterrole=view",
        "--user=vera",
    ]);
    k(&[
        "create",
        "rolebinding",
        "ed-edit",
        "-n",
        TEAM,
        "--clusterrole=edit",
        "--user=ed",
    ]);
    k(&[
        "create",
        "rolebinding",
        "ada-admin",
        "-n",
        TEAM,
        "--clusterrole=admin",
        "--user=ada",
    ]);
    k(&["create", "serviceaccount", "robot", "-n", TEAM]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_identity_gets_what_upstream_gives_it_and_nothing_more() {
    let c = Cluster::start(CONTROL_PLANE);
    setup(&|args| {
        c.k(args);
    });
    let client = c.kube_client().await;
    matrix(&[client]).await;
}

/// Sends every probe, in turn to each of `clients` (replicas of one cluster), and checks each
/// answer against the oracle.
async fn matrix(clients: &[kube::Client]) {
    let client = &clients[0];
    let resources = served(client).await;
    assert!(resources.len() > 60, "discovery lists {} resources", resources.len());

    let ids = [
        Id::Nobody,
        Id::Anonymous,
        Id::View,
        Id::Edit,
        Id::Admin,
        Id::ServiceAccount,
        Id::Node,
    ];
    let verbs: &[&'static str] = &[
        "get",
        "list",
        "watch",
        "create",
        "update",
        "patch",
        "delete",
        "deletecollection",
    ];
    let mut probes = Vec::new();
    for res in &resources {
        for &verb in verbs {
            for namespace in [Some(TEAM), Some(OTHER), None] {
                let Some((method, path)) = request_for(res, verb, namespace) else {
                    continue;
                };
                // A namespace's own path names it as the request's namespace too.
                let attr_ns = if res.group.is_empty() && res.name.split('/').next() == Some("namespaces") {
                    path.contains("/namespaces/probe").then(|| "probe".to_string())
                } else {
                    namespace.map(str::to_string)
                };
                for &id in &ids {
                    let probe = Probe {
                        id,
                        method: method.clone(),
                        path: path.clone(),
                        verb,
                        group: res.group.clone(),
                        resource: res.name.clone(),
                        namespace: attr_ns.clone(),
                    };
                    // An allowed watch is held open; only refusals are sent for watches.
                    if verb == "watch" && oracle(&probe) != Some(false) {
                        continue;
                    }
                    probes.push(probe);
                }
            }
        }
    }
    let mut failures = Vec::new();
    let mut codes = std::collections::BTreeMap::<u16, usize>::new();
    for (n, chunk) in probes.chunks(32).enumerate() {
        let client = &clients[n % clients.len()];
        let answers = futures::future::join_all(chunk.iter().map(|p| send(client, p))).await;
        for (p, code) in chunk.iter().zip(answers) {
            *codes.entry(code).or_default() += 1;
            judge(p, code, &mut failures);
        }
    }
    eprintln!(
        "authorization matrix: {} requests to {} server(s), {} identities, {} resources; answers {codes:?}",
        probes.len(),
        clients.len(),
        ids.len(),
        resources.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} answers disagree with the oracle:\n{}",
        failures.len(),
        probes.len(),
        failures.join("\n")
    );
    // The matrix is only worth something if both answers happened.
    assert!(codes.get(&403).copied().unwrap_or(0) > 1000, "{codes:?}");
    assert!(
        codes.iter().filter(|(c, _)| (200..300).contains(*c)).count() > 0,
        "{codes:?}"
    );
}

/// A small deterministic generator (xorshift), so a failure names the seed that found it.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[(self.next() % items.len() as u64) as usize]
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuzzed_paths_as_view_never_reach_a_secret_or_a_write() {
    let c = Cluster::start(CONTROL_PLANE);
    fuzz_setup(&|args| {
        c.k(args);
    });
    fuzz(&[c.kube_client().await], 3000).await;
}

/// The same fuzz against two API servers on one etcd, alternating between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuzzed_paths_on_two_replicas_over_etcd() {
    let etcd = skiff_testkit::EtcdCluster::start(1);
    let (a, b) = two_replicas(&etcd, fuzz_setup, &["list", "pods", "-n", TEAM, "--as", "vera"]);
    fuzz(&[a.client().await, b.client().await], 1500).await;
}

/// A namespace with a Secret whose value the fuzz looks for in every answer, and `vera` bound
/// to `view`.
fn fuzz_setup(k: Kubectl) {
    k(&["create", "namespace", TEAM]);
    k(&[
        "create",
        "secret",
        "generic",
        "probe",
        "-n",
        TEAM,
        "--from-literal=password=fuzz-s3cr3t",
    ]);
    k(&[
        "create",
        "clusterrolebinding",
        "vera-view",
        "--clusterrole=view",
        "--user=vera",
    ]);
}

/// `rounds` fuzzed requests as `view`, in turn to each of `clients`.
async fn fuzz(clients: &[kube::Client], rounds: usize) {
    let seed: u64 = std::env::var("SKIFF_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_cafe_f00d);
    let mut rng = Rng(seed);
    // Paths are built from the parts of a resource path, each spelled rightly or oddly (empty,
    // doubled, escaped, dotted), and half of them then get a random segment spliced in.
    let prefixes = [
        "/api/v1",
        "/apis/apps/v1",
        "/apis/rbac.authorization.k8s.io/v1",
        "//api/v1",
        "/api//v1",
        "/apis//v1",
        "/api/v1/",
    ];
    let watches = ["", "", "/watch", "/proxy"];
    let namespaces = [
        "",
        "/namespaces/team",
        "/namespaces/",
        "/namespaces//",
        "/namespaces/%2F",
        "/namespaces/..",
        "/namespaces/team%2F",
        "/namespaces/default",
        "/namespaces%2Fteam",
        "/namespaces/%74eam",
    ];
    let resources = [
        "/secrets",
        "/secrets/",
        "/configmaps",
        "/roles",
        "/pods",
        "/%73ecrets",
        "/Secrets",
        "/secrets%2F",
        "//secrets",
        "",
    ];
    let names = [
        "",
        "",
        "/probe",
        "/probe/",
        "/..",
        "/%2E%2E",
        "//probe",
        "/probe%2Fstatus",
        "/.",
    ];
    let subs = ["", "", "/status", "/log", "/proxy/x", "/exec", "/token", "/finalize"];
    let segments = [
        "",
        "..",
        ".",
        "%2F",
        "%2f",
        "%2E%2E",
        "watch",
        "namespaces",
        "team",
        "secrets",
        "%00",
        "%zz",
        ";",
        "%252F",
        "api",
        "v1",
    ];
    let queries = [
        "",
        "?watch=true&timeoutSeconds=1",
        "?fieldSelector=metadata.name%3Dprobe",
        "?dryRun=All",
        "?watch=1&fieldSelector=metadata.name%3Dprobe&timeoutSeconds=1",
        "?labelSelector=x",
    ];
    let methods = [Method::GET, Method::POST, Method::PUT, Method::PATCH, Method::DELETE];
    let mut failures = Vec::new();
    let mut codes = std::collections::BTreeMap::<u16, usize>::new();
    let mut distinct = BTreeSet::new();
    for round in 0..rounds {
        let client = &clients[round % clients.len()];
        let mut parts: Vec<String> = [
            rng.pick(&prefixes),
            rng.pick(&watches),
            rng.pick(&namespaces),
            rng.pick(&resources),
            rng.pick(&names),
            rng.pick(&subs),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if rng.next().is_multiple_of(2) {
            let at = (rng.next() % parts.len() as u64) as usize;
            parts.insert(at, format!("/{}", rng.pick(&segments)));
        }
        let path = parts.concat();
        let method = methods[(rng.next() % methods.len() as u64) as usize].clone();
        let query = rng.pick(&queries);
        let uri = format!("{path}{query}");
        if uri.parse::<http::Uri>().is_err() {
            continue;
        }
        distinct.insert(format!("{method} {uri}"));
        let (user, groups) = Id::View.user();
        let mut req = Request::builder()
            .method(method.clone())
            .uri(uri.as_str())
            .header("Impersonate-User", user)
            .header(http::header::CONTENT_TYPE, "application/merge-patch+json");
        for g in groups {
            req = req.header("Impersonate-Group", *g);
        }
        let body = if method == Method::GET || method == Method::DELETE {
            Vec::new()
        } else {
            b"{\"metadata\":{\"name\":\"probe\"}}".to_vec()
        };
        let req = req.body(kube::client::Body::from(body)).expect("request");
        let resp = match client.send(req).await {
            Ok(r) => r,
            Err(e) => panic!("seed {seed:#x}: {method} {uri}: {e}"),
        };
        let code = resp.status().as_u16();
        *codes.entry(code).or_default() += 1;
        let bytes = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes);
        // `view` reads no Secret and writes nothing: the oracle's whole answer for these.
        if (200..300).contains(&code) && method != Method::GET {
            failures.push(format!("{method} {uri}: {code}, view may not write"));
        }
        if text.contains("ZnV6ei1zM2NyM3Q") || text.contains("fuzz-s3cr3t") || text.contains("\"SecretList\"") {
            failures.push(format!("{method} {uri}: {code}, a Secret answered"));
        }
        if code >= 500 {
            failures.push(format!("{method} {uri}: {code} {text}"));
        }
    }
    eprintln!(
        "path fuzz (seed {seed:#x}): {rounds} rounds, {} distinct requests as view; answers {codes:?}",
        distinct.len()
    );
    assert!(failures.is_empty(), "seed {seed:#x}:\n{}", failures.join("\n"));
    assert!(distinct.len() > rounds / 3, "{}", distinct.len());
}

/// A way to run kubectl that must succeed.
type Kubectl<'a> = &'a dyn Fn(&[&str]);

/// Two API servers on `etcd`, set up through the first by `setup`, returned once the second
/// answers yes to `kubectl auth can-i CAN_I` (what was written reached it).
fn two_replicas(etcd: &skiff_testkit::EtcdCluster, setup: fn(Kubectl), can_i: &[&str]) -> (Replica, Replica) {
    let a = Replica::start(etcd, common::free_port(), None);
    let b = Replica::start(etcd, common::free_port(), Some(&a));
    setup(&|args| {
        let out = a.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
    let held = common::eventually(std::time::Duration::from_secs(10), || {
        let out = b.kubectl(&[&["auth", "can-i"], can_i].concat());
        (String::from_utf8_lossy(&out.stdout).trim() == "yes").then_some(())
    });
    assert!(
        held.is_some(),
        "what was written through one replica never reached the other"
    );
    (a, b)
}

/// One `skiff server` on etcd, killed when dropped.
struct Replica {
    dir: tempfile::TempDir,
    home: tempfile::TempDir,
    child: std::process::Child,
}

impl Replica {
    /// Starts a replica on `port` of loopback over `etcd`, with `pki/` and the encryption
    /// configuration of `from` (replicas of one cluster share them), and waits until it is ready.
    fn start(etcd: &skiff_testkit::EtcdCluster, port: u16, from: Option<&Replica>) -> Replica {
        let dir = tempfile::tempdir().expect("dir");
        let home = tempfile::tempdir().expect("home");
        if let Some(from) = from {
            let copied = std::process::Command::new("cp")
                .arg("-a")
                .arg(from.dir.path().join("pki"))
                .arg(dir.path())
                .status()
                .expect("cp");
            assert!(copied.success());
            std::fs::copy(
                from.dir.path().join("encryption-config.yaml"),
                dir.path().join("encryption-config.yaml"),
            )
            .expect("copy the encryption configuration");
        }
        let log = std::fs::File::create(dir.path().join("server.log")).expect("log");
        let child = std::process::Command::new(common::skiff_bin())
            .arg("server")
            .arg("--data-dir")
            .arg(dir.path())
            .args([
                "--no-agent",
                "--no-scheduler",
                "--bind-address",
                "127.0.0.1",
                "--advertise-address",
                "127.0.0.1",
            ])
            .args(["--port", &port.to_string()])
            .args(["--service-cluster-ip-range", &common::own_service_range(port)])
            .args(["--etcd-servers", &etcd.endpoints_arg()])
            .env("HOME", home.path())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start skiff server");
        let r = Replica { dir, home, child };
        let ready = common::eventually(std::time::Duration::from_secs(30), || {
            (r.kubeconfig().exists() && r.kubectl(&["get", "--raw", "/readyz"]).status.success()).then_some(())
        });
        assert!(
            ready.is_some(),
            "replica on {port} not ready:\n{}",
            std::fs::read_to_string(r.dir.path().join("server.log")).unwrap_or_default()
        );
        r
    }

    fn kubeconfig(&self) -> std::path::PathBuf {
        self.dir.path().join("kubeconfig")
    }

    fn kubectl(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(args)
            .env("HOME", self.home.path())
            .env_remove("KUBECONFIG")
            .output()
            .expect("kubectl")
    }

    async fn client(&self) -> kube::Client {
        let kc = kube::config::Kubeconfig::read_from(self.kubeconfig()).expect("kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .expect("config");
        kube::Client::try_from(config).expect("client")
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The same matrix against two API servers on one etcd: the bindings are written through the
/// first, and the probes alternate between both, so each replica's view of RBAC is tested.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_matrix_holds_on_two_replicas_over_etcd() {
    let etcd = skiff_testkit::EtcdCluster::start(1);
    // The last binding written through a holds on b before the matrix starts.
    let (a, b) = two_replicas(&etcd, setup, &["create", "roles", "-n", TEAM, "--as", "ada"]);
    matrix(&[a.client().await, b.client().await]).await;
}
