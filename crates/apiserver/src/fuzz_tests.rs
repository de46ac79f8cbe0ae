//! Fuzz targets for the API server's request path, end to end through the router in-process:
//! create, update, every patch type and server-side apply of several kinds, with JSON, YAML and
//! protobuf bodies mutated structurally and bytewise, odd query parameters, reads with odd
//! selectors, continue tokens and resourceVersions, and odd paths; plus the protobuf decoder on
//! its own. The invariants, for every request:
//! - no panic and no 5xx (but upstream's 504 for a resourceVersion from the future);
//! - an error answer is a `Status` (`kind: Status`, `status: Failure`, the HTTP code in `code`, a
//!   reason, a message);
//! - a refused write (or a dry run) leaves the store unchanged: same revision, same object;
//! - an accepted write is what a read then returns.

use crate::server::ApiState;
use bytes::Bytes;
use http_body_util::BodyExt;
use k8s_pb::api::core::v1 as core;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use prost::Message as _;
use serde_json::{Value, json};
use skiff_fuzz::proptest::prelude::*;
use skiff_fuzz::{ByteEdits, byte_edits, mutated_bytes, mutated_json, mutated_text, run, seeds};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tower::ServiceExt;

/// A server over a memory store with the namespace `default`, and a runtime to drive it.
struct Harness {
    rt: tokio::runtime::Runtime,
    state: Arc<ApiState>,
    token: String,
    _dir: tempfile::TempDir,
    next: AtomicUsize,
    /// How many answers of each code the fuzzed requests got (printed at the end: a target
    /// whose inputs all fail early tests little).
    codes: parking_lot::Mutex<std::collections::BTreeMap<u16, usize>>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        eprintln!("answers by code: {:?}", self.codes.lock());
    }
}

impl Harness {
    fn new() -> Harness {
        let dir = tempfile::tempdir().expect("dir");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let (state, token) = ApiState::for_tests(dir.path());
        let h = Harness {
            rt,
            state,
            token,
            _dir: dir,
            next: AtomicUsize::new(0),
            codes: Default::default(),
        };
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}});
        let (code, _) = h.call(
            "POST",
            "/api/v1/namespaces",
            "application/json",
            ns.to_string().into_bytes(),
        );
        assert_eq!(code, 201);
        // No controllers run here: the namespace's `default` service account, which the
        // ServiceAccount admission plugin requires of every pod, is made as its controller would.
        let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}});
        let (code, _) = h.call(
            "POST",
            "/api/v1/namespaces/default/serviceaccounts",
            "application/json",
            sa.to_string().into_bytes(),
        );
        assert_eq!(code, 201);
        h
    }

    /// `METHOD uri` with `body` of `content_type`: the status and the raw answer. None when the
    /// request cannot even be built (an URI `http` refuses never reaches a server).
    fn try_call(&self, method: &str, uri: &str, content_type: &str, body: Vec<u8>) -> Option<(u16, Bytes)> {
        let req = http::Request::builder()
            .method(method)
            .uri(uri)
            .header("authorization", format!("Bearer {}", self.token))
            .header("content-type", content_type)
            .header("accept", "application/json")
            .body(axum::body::Body::from(body))
            .ok()?;
        let router = crate::server::router(self.state.clone());
        self.rt.block_on(async move {
            let resp = router.oneshot(req).await.expect("infallible");
            let code = resp.status().as_u16();
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            Some((code, bytes))
        })
    }

    fn call(&self, method: &str, uri: &str, content_type: &str, body: Vec<u8>) -> (u16, Bytes) {
        self.try_call(method, uri, content_type, body).expect("request")
    }

    /// A fuzzed request: as [`Harness::try_call`], counted.
    fn fuzzed(&self, method: &str, uri: &str, content_type: &str, body: Vec<u8>) -> Option<(u16, Bytes)> {
        let answer = self.try_call(method, uri, content_type, body)?;
        *self.codes.lock().entry(answer.0).or_default() += 1;
        Some(answer)
    }

    fn revision(&self) -> i64 {
        self.rt.block_on(self.state.store.current_revision()).expect("revision")
    }

    fn get(&self, uri: &str) -> Option<Value> {
        let (code, body) = self.call("GET", uri, "application/json", Vec::new());
        (code == 200).then(|| serde_json::from_slice(&body).expect("json"))
    }

    fn fresh_name(&self) -> String {
        format!("f{}", self.next.fetch_add(1, Ordering::Relaxed))
    }
}

/// No 5xx, and an error answer is a proper `Status`.
fn check_answer(what: &str, code: u16, body: &[u8]) -> Result<(), String> {
    let text = String::from_utf8_lossy(body);
    // The one 5xx a client can cause: a resourceVersion (or continue token) from the future is
    // upstream's 504 `Too large resource version` (a Timeout the client retries after a second).
    let future_revision =
        code == 504 && text.contains("\"reason\":\"Timeout\"") && text.contains("Too large resource version");
    if code >= 500 && !future_revision {
        return Err(format!("{what}: {code} {text}"));
    }
    if code >= 400 {
        let status: Value =
            serde_json::from_slice(body).map_err(|e| format!("{what}: {code} answer is not JSON ({e}): {text}"))?;
        let ok = status["kind"] == "Status"
            && status["apiVersion"] == "v1"
            && status["status"] == "Failure"
            && status["code"] == code
            && status["reason"].as_str().is_some_and(|r| !r.is_empty())
            && status["message"].is_string();
        if !ok {
            return Err(format!("{what}: {code} answer is not a proper Status: {text}"));
        }
    }
    Ok(())
}

#[derive(Clone, Copy, Debug)]
enum Verb {
    Create,
    Update,
    Patch,
    Apply,
}

#[derive(Clone, Copy, Debug)]
enum Encoding {
    Json,
    Yaml,
    Protobuf,
}

#[derive(Clone, Debug)]
struct WriteCase {
    kind: usize,
    verb: Verb,
    encoding: Encoding,
    /// For a patch, its content type.
    patch_type: &'static str,
    body: Value,
    edits: ByteEdits,
    query: Vec<(&'static str, &'static str)>,
    /// Apply to an object that exists already.
    existing: bool,
}

const QUERY: &[(&str, &str)] = &[
    ("dryRun", "All"),
    ("dryRun", "bogus"),
    ("fieldValidation", "Strict"),
    ("fieldValidation", "Warn"),
    ("fieldValidation", "Ignore"),
    ("fieldValidation", "strict-ish"),
    ("fieldManager", "kubectl-client-side-apply"),
    ("fieldManager", ""),
    ("fieldManager", "%00%ff"),
    ("force", "true"),
    ("force", "maybe"),
    ("timeout", "10s"),
    ("timeout", "-1s"),
    ("timeout", "1x"),
    ("timeout", "999999999999h"),
    ("resourceVersion", "1"),
    ("resourceVersion", "abc"),
    ("pretty", "true"),
];

fn write_case() -> impl Strategy<Value = WriteCase> {
    let objects = seeds::objects();
    let patches = seeds::patches();
    let n_objects = objects.len();
    (
        0..n_objects,
        prop::sample::select(vec![Verb::Create, Verb::Update, Verb::Patch, Verb::Apply]),
        0..patches.len(),
    )
        .prop_flat_map(move |(kind, verb, p)| {
            let (_, _, obj) = objects[kind].clone();
            let (patch_type, patch) = patches[p].clone();
            let body = match verb {
                Verb::Patch => mutated_json(vec![patch], &[], 3).boxed(),
                _ => mutated_json(vec![obj], &[], 3).boxed(),
            };
            let encoding = match verb {
                Verb::Create | Verb::Update => {
                    prop::sample::select(vec![Encoding::Json, Encoding::Json, Encoding::Yaml, Encoding::Protobuf])
                        .boxed()
                }
                Verb::Apply => prop::sample::select(vec![Encoding::Yaml, Encoding::Json]).boxed(),
                Verb::Patch => Just(Encoding::Json).boxed(),
            };
            (
                Just(kind),
                Just(verb),
                encoding,
                Just(patch_type),
                body,
                byte_edits(3),
                prop::collection::vec(prop::sample::select(QUERY.to_vec()), 0..2),
                any::<bool>(),
            )
                .prop_map(
                    |(kind, verb, encoding, patch_type, body, edits, query, existing)| WriteCase {
                        kind,
                        verb,
                        encoding,
                        patch_type,
                        body,
                        edits,
                        query,
                        existing,
                    },
                )
        })
}

fn collection_uri(plural: &str, namespaced: bool) -> String {
    let prefix = match plural {
        "deployments" => "/apis/apps/v1",
        "cronjobs" => "/apis/batch/v1",
        "roles" => "/apis/rbac.authorization.k8s.io/v1",
        _ => "/api/v1",
    };
    if namespaced {
        format!("{prefix}/namespaces/default/{plural}")
    } else {
        format!("{prefix}/{plural}")
    }
}

/// The body as kubectl encodes it in protobuf, for the kinds kubectl sends that way (others: JSON).
fn protobuf_body(plural: &str, name: &str) -> Option<Vec<u8>> {
    let metadata = Some(meta::ObjectMeta {
        name: Some(name.into()),
        labels: [("app".to_string(), "web".to_string())].into(),
        creation_timestamp: Some(meta::Time::default()),
        ..Default::default()
    });
    let (kind, raw) = match plural {
        "configmaps" => (
            "ConfigMap",
            core::ConfigMap {
                metadata,
                data: [("key".to_string(), "value".to_string())].into(),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        "secrets" => (
            "Secret",
            core::Secret {
                metadata,
                data: [("password".to_string(), b"hunter2".to_vec())].into(),
                r#type: Some("Opaque".into()),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        _ => return None,
    };
    Some(envelope("v1", kind, raw))
}

fn envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
    let unknown = k8s_pb::apimachinery::pkg::runtime::Unknown {
        type_meta: Some(k8s_pb::apimachinery::pkg::runtime::TypeMeta {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
        }),
        raw: Some(raw),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    let mut body = b"k8s\0".to_vec();
    body.extend(unknown.encode_to_vec());
    body
}

/// Renames the seed object in `body` to `name` where the mutation left its name alone.
fn rename(body: &mut Value, seed_name: &str, name: &str) {
    if let Some(n) = body.pointer_mut("/metadata/name")
        && n == seed_name
    {
        *n = Value::String(name.to_string());
    }
}

fn run_write_case(h: &Harness, case: WriteCase) -> Result<(), String> {
    let (plural, namespaced, seed) = seeds::objects().swap_remove(case.kind);
    let seed_name = seed["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let name = h.fresh_name();
    let collection = collection_uri(plural, namespaced);
    let item = format!("{collection}/{name}");
    let exists = !matches!(case.verb, Verb::Create) && (case.existing || !matches!(case.verb, Verb::Apply));
    if exists {
        let mut pristine = seed.clone();
        rename(&mut pristine, &seed_name, &name);
        let (code, body) = h.call(
            "POST",
            &collection,
            "application/json",
            pristine.to_string().into_bytes(),
        );
        if code != 201 {
            return Err(format!(
                "seed {plural} not created: {code} {}",
                String::from_utf8_lossy(&body)
            ));
        }
    }
    let mut body = case.body.clone();
    rename(&mut body, &seed_name, &name);
    let (method, uri, content_type, mut bytes) = match case.verb {
        Verb::Create | Verb::Update => {
            let (method, uri) = if matches!(case.verb, Verb::Create) {
                ("POST", &collection)
            } else {
                ("PUT", &item)
            };
            match case.encoding {
                Encoding::Protobuf if protobuf_body(plural, &name).is_some() => (
                    method,
                    uri.clone(),
                    "application/vnd.kubernetes.protobuf",
                    protobuf_body(plural, &name).unwrap_or_default(),
                ),
                Encoding::Yaml => (
                    method,
                    uri.clone(),
                    "application/yaml",
                    serde_saphyr::to_string(&body).unwrap_or_default().into_bytes(),
                ),
                _ => (method, uri.clone(), "application/json", body.to_string().into_bytes()),
            }
        }
        Verb::Patch => ("PATCH", item.clone(), case.patch_type, body.to_string().into_bytes()),
        Verb::Apply => {
            let bytes = match case.encoding {
                Encoding::Yaml => serde_saphyr::to_string(&body).unwrap_or_default().into_bytes(),
                _ => body.to_string().into_bytes(),
            };
            ("PATCH", item.clone(), "application/apply-patch+yaml", bytes)
        }
    };
    case.edits.apply(&mut bytes);
    let mut query: Vec<String> = case.query.iter().map(|(k, v)| format!("{k}={v}")).collect();
    if matches!(case.verb, Verb::Apply) && !case.query.iter().any(|(k, _)| *k == "fieldManager") {
        query.push("fieldManager=kubectl".into());
    }
    let uri = if query.is_empty() {
        uri
    } else {
        format!("{uri}?{}", query.join("&"))
    };
    let dry_run = case.query.contains(&("dryRun", "All"));

    let rev_before = h.revision();
    let before = h.get(&item);
    let Some((code, answer)) = h.fuzzed(method, &uri, content_type, bytes) else {
        return Ok(());
    };
    let what = format!("{method} {uri} ({content_type})");
    check_answer(&what, code, &answer)?;
    let after = h.get(&item);
    if code >= 400 || dry_run {
        let rev_after = h.revision();
        if rev_after != rev_before || before != after {
            return Err(format!(
                "{what}: answered {code}{} but the store changed (revision {rev_before} -> {rev_after}): {}",
                if dry_run { " to a dry run" } else { "" },
                String::from_utf8_lossy(&answer)
            ));
        }
    } else {
        let answer: Value =
            serde_json::from_slice(&answer).map_err(|e| format!("{what}: {code} answer is not JSON: {e}"))?;
        let written_name = answer
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let stored = h.get(&format!("{collection}/{written_name}"));
        if stored.as_ref() != Some(&answer) {
            return Err(format!(
                "{what}: answered {code} with {answer} but a read returns {stored:?}"
            ));
        }
    }
    Ok(())
}

#[test]
fn fuzz_write_requests() {
    let h = Harness::new();
    run("fuzz_write_requests", 1000, write_case(), |case| {
        run_write_case(&h, case)
    });
}

/// Odd content types and raw bytes that are no encoding at all, on every write verb.
#[test]
fn fuzz_write_bodies_raw() {
    let h = Harness::new();
    let content_types = vec![
        "application/json",
        "application/yaml",
        "application/vnd.kubernetes.protobuf",
        "application/json-patch+json",
        "application/merge-patch+json",
        "application/strategic-merge-patch+json",
        "application/apply-patch+yaml",
        "application/apply-patch+cbor",
        "text/plain",
        "application/json; charset=utf-16",
        "",
        "application/vnd.kubernetes.protobuf;stream=watch",
    ];
    let bodies: Vec<Vec<u8>> = seeds::objects()
        .into_iter()
        .map(|(_, _, o)| o.to_string().into_bytes())
        .chain(seeds::patches().into_iter().map(|(_, p)| p.to_string().into_bytes()))
        .chain(protobuf_body("configmaps", "cm"))
        .collect();
    let strategy = (
        prop::sample::select(content_types),
        prop::sample::select(vec!["POST", "PUT", "PATCH"]),
        0..seeds::objects().len(),
        mutated_bytes(bodies, &[], 6),
    );
    run(
        "fuzz_write_bodies_raw",
        500,
        strategy,
        |(content_type, method, kind, body)| {
            let (plural, namespaced, seed) = seeds::objects().swap_remove(kind);
            let collection = collection_uri(plural, namespaced);
            let name = h.fresh_name();
            let mut pristine = seed.clone();
            pristine["metadata"]["name"] = Value::String(name.clone());
            let (code, _) = h.call(
                "POST",
                &collection,
                "application/json",
                pristine.to_string().into_bytes(),
            );
            if code != 201 {
                return Err(format!("seed {plural} not created: {code}"));
            }
            let uri = if method == "POST" {
                collection.clone()
            } else {
                format!("{collection}/{name}?fieldManager=m")
            };
            let rev_before = h.revision();
            let Some((code, answer)) = h.fuzzed(method, &uri, content_type, body.0.clone()) else {
                return Ok(());
            };
            check_answer(&format!("{method} {uri} ({content_type})"), code, &answer)?;
            if code >= 400 && h.revision() != rev_before {
                return Err(format!("{method} {uri}: answered {code} but the store changed"));
            }
            Ok(())
        },
    );
}

/// Reads with odd query parameters: selectors, limits, continue tokens, resourceVersions.
#[test]
fn fuzz_read_requests() {
    let h = Harness::new();
    for i in 0..3 {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("cm{i}"), "labels": {"app": "web", "i": i.to_string()}}});
        let (code, _) = h.call(
            "POST",
            "/api/v1/namespaces/default/configmaps",
            "application/json",
            cm.to_string().into_bytes(),
        );
        assert_eq!(code, 201);
    }
    // A real continue token, as the first page of a list hands it out.
    let (_, page) = h.call(
        "GET",
        "/api/v1/namespaces/default/configmaps?limit=1",
        "application/json",
        Vec::new(),
    );
    let page: Value = serde_json::from_slice(&page).expect("json");
    let token = page["metadata"]["continue"].as_str().expect("continue").to_string();
    let rv = page["metadata"]["resourceVersion"].as_str().expect("rv").to_string();
    let queries = [
        "limit=1".to_string(),
        format!("limit=1&continue={token}"),
        format!("resourceVersion={rv}&resourceVersionMatch=NotOlderThan"),
        format!("resourceVersion={rv}&resourceVersionMatch=Exact&limit=2"),
        "resourceVersion=0".to_string(),
        "labelSelector=app%3Dweb,i+in+(0,1)".to_string(),
        "fieldSelector=metadata.name%3Dcm1".to_string(),
        "fieldSelector=metadata.name!%3Dcm1&labelSelector=!x".to_string(),
        "timeoutSeconds=5&allowWatchBookmarks=true".to_string(),
        "timeout=5s&includeObject=Object".to_string(),
        "sendInitialEvents=false&resourceVersionMatch=".to_string(),
    ];
    let seeds: Vec<&str> = queries.iter().map(String::as_str).collect();
    let paths = vec![
        "/api/v1/namespaces/default/configmaps",
        "/api/v1/configmaps",
        "/api/v1/namespaces/default/configmaps/cm1",
        "/api/v1/namespaces/default/pods",
        "/api/v1/nodes",
        "/api/v1/events",
        "/apis/apps/v1/namespaces/default/deployments",
    ];
    let strategy = (
        prop::sample::select(paths),
        mutated_text(&seeds, &[b"&", b"%", b"%2", b"=", b"+", b"limit=", b"continue="], 5),
    );
    run("fuzz_read_requests", 800, strategy, |(path, query)| {
        // Only what an URI may carry reaches a server: escape the rest as a client would.
        let query: String = query
            .bytes()
            .map(|b| {
                if b.is_ascii_graphic() && b != b'#' {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        let uri = format!("{path}?{query}");
        let watch = query.to_ascii_lowercase().contains("watch");
        if watch {
            // A watch is a stream; it is fuzzed through its parameters on lists.
            return Ok(());
        }
        let rev_before = h.revision();
        let Some((code, answer)) = h.fuzzed("GET", &uri, "application/json", Vec::new()) else {
            return Ok(());
        };
        check_answer(&format!("GET {uri}"), code, &answer)?;
        if h.revision() != rev_before {
            return Err(format!("GET {uri} changed the store"));
        }
        Ok(())
    });
}

/// Request paths: mutated resource paths, subresources, groups and names.
#[test]
fn fuzz_request_paths() {
    let h = Harness::new();
    let seeds = [
        "/api/v1/namespaces/default/pods/p/status",
        "/api/v1/namespaces/default/pods/p/log",
        "/apis/apps/v1/namespaces/default/deployments/d/scale",
        "/api/v1/nodes/n1/proxy/healthz",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles/admin",
        "/api/v1/namespaces/default",
        "/apis/apps/v1",
        "/apis",
        "/openapi/v3/api/v1",
        "/livez/etcd",
        "/version",
        "/api/v1/namespaces/default/serviceaccounts/default/token",
        "/apis/batch/v1/namespaces/default/cronjobs/x",
    ];
    let strategy = (
        prop::sample::select(vec!["GET", "DELETE", "POST", "PUT", "PATCH", "HEAD", "OPTIONS"]),
        mutated_text(
            &seeds,
            &[b"/", b"//", b"..", b"%2F", b"%00", b"namespaces/", b"-", b":"],
            5,
        ),
    );
    run("fuzz_request_paths", 800, strategy, |(method, path)| {
        let path: String = path
            .bytes()
            .map(|b| {
                if b.is_ascii_graphic() && b != b'#' && b != b'?' {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        let path = if path.starts_with('/') {
            path
        } else {
            format!("/{path}")
        };
        let rev_before = h.revision();
        let Some((code, answer)) = h.fuzzed(method, &path, "application/json", b"{}".to_vec()) else {
            return Ok(());
        };
        let api = path.starts_with("/api/") || path.starts_with("/apis/");
        // Outside the API, an unknown path is Go's plain `404 page not found`, as upstream's
        // last handler answers (`http.NotFound`).
        let plain_not_found = !api && code == 404 && &answer[..] == b"404 page not found\n";
        if method != "HEAD" && !plain_not_found {
            check_answer(&format!("{method} {path}"), code, &answer)?;
        }
        if code >= 400 && h.revision() != rev_before {
            return Err(format!("{method} {path}: answered {code} but the store changed"));
        }
        Ok(())
    });
}

/// The protobuf decoder alone, on kubectl's bodies mutated bytewise (the envelope) and inside
/// the envelope (the object).
#[test]
fn fuzz_protobuf_decode() {
    let deployment = k8s_pb::api::apps::v1::Deployment {
        metadata: Some(meta::ObjectMeta {
            name: Some("d".into()),
            ..Default::default()
        }),
        spec: Some(k8s_pb::api::apps::v1::DeploymentSpec {
            replicas: Some(2),
            selector: Some(meta::LabelSelector {
                match_labels: [("app".to_string(), "web".to_string())].into(),
                ..Default::default()
            }),
            template: Some(core::PodTemplateSpec {
                metadata: Some(meta::ObjectMeta {
                    labels: [("app".to_string(), "web".to_string())].into(),
                    ..Default::default()
                }),
                spec: Some(core::PodSpec {
                    containers: vec![core::Container {
                        name: Some("c".into()),
                        image: Some("nginx".into()),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec();
    let inner = [
        (
            "v1",
            "ConfigMap",
            core::ConfigMap {
                data: [("k".to_string(), "v".to_string())].into(),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        ("apps/v1", "Deployment", deployment),
        (
            "v1",
            "Namespace",
            core::Namespace {
                metadata: Some(meta::ObjectMeta {
                    name: Some("ns".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
    ];
    let whole: Vec<Vec<u8>> = inner
        .iter()
        .map(|(v, k, raw)| envelope(v, k, raw.clone()))
        .chain(protobuf_body("secrets", "s"))
        .collect();
    let strategy = prop_oneof![
        mutated_bytes(
            whole,
            &[
                b"k8s\0",
                b"\x0a\x00",
                b"\x12\xff\xff\xff\xff\x0f",
                b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01"
            ],
            5
        )
        .prop_map(|b| b.0),
        (0..inner.len()).prop_flat_map(move |i| {
            let (v, k, raw) = inner[i].clone();
            mutated_bytes(
                vec![raw],
                &[
                    b"\x0a\x00",
                    b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",
                    b"\x22\x00",
                ],
                5,
            )
            .prop_map(move |raw| envelope(v, k, raw.0))
        }),
    ];
    run("fuzz_protobuf_decode", 3000, strategy, |body| {
        let _ = crate::protobuf::decode(&body);
        Ok(())
    });
}

/// Continue tokens built from JSON a client made up (any revision, any start key), on a list
/// of one namespace: never an item of another namespace, never a 5xx.
#[test]
fn fuzz_continue_tokens() {
    use base64::Engine;
    let h = Harness::new();
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}});
    assert_eq!(
        h.call(
            "POST",
            "/api/v1/namespaces",
            "application/json",
            ns.to_string().into_bytes()
        )
        .0,
        201
    );
    for ns in ["default", "other"] {
        for i in 0..3 {
            let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("cm{i}")}});
            let uri = format!("/api/v1/namespaces/{ns}/configmaps");
            assert_eq!(
                h.call("POST", &uri, "application/json", cm.to_string().into_bytes()).0,
                201
            );
        }
    }
    let rev = h.revision();
    let seeds = vec![
        json!({"v": "meta.k8s.io/v1", "rv": rev, "start": "/registry/configmaps/default/cm0"}),
        json!({"v": "meta.k8s.io/v1", "rv": rev, "start": "/registry/configmaps/other/cm0"}),
        json!({"v": "meta.k8s.io/v1", "rv": 1, "start": "/registry/configmaps/"}),
        json!({"v": "meta.k8s.io/v1", "rv": rev, "start": "/registry/secrets/default/x"}),
    ];
    let strategy = (mutated_json(seeds, &["v", "rv", "start"], 3), 0u32..4);
    run("fuzz_continue_tokens", 600, strategy, |(token, limit)| {
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token.to_string());
        let uri = format!("/api/v1/namespaces/default/configmaps?limit={limit}&continue={token}");
        let Some((code, answer)) = h.fuzzed("GET", &uri, "application/json", Vec::new()) else {
            return Ok(());
        };
        check_answer(&format!("GET {uri}"), code, &answer)?;
        if code == 200 {
            let list: Value = serde_json::from_slice(&answer).map_err(|e| e.to_string())?;
            for item in list["items"].as_array().into_iter().flatten() {
                if item["metadata"]["namespace"] != "default" || item["kind"] != "ConfigMap" {
                    return Err(format!("GET {uri} listed {}", item["metadata"]));
                }
            }
        }
        Ok(())
    });
}

/// The `--encryption-provider-config` file: any text refused with an error or accepted, and an
/// accepted one builds its transformer.
#[test]
fn fuzz_encryption_config() {
    let key32 = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    let config = |providers: &str| {
        format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n  - resources: [secrets, configmaps, \"*.apps\"]\n    providers:\n{providers}"
        )
    };
    let seeds = [
        config(&format!(
            "      - aescbc:\n          keys:\n            - name: k1\n              secret: {key32}\n      - identity: {{}}\n"
        )),
        config(&format!(
            "      - aesgcm:\n          keys:\n            - name: k1\n              secret: AAECAwQFBgcICQoLDA0ODw==\n      - secretbox:\n          keys:\n            - name: k2\n              secret: {key32}\n"
        )),
        config("      - identity: {}\n"),
        config(
            "      - kms:\n          apiVersion: v2\n          name: kms\n          endpoint: unix:///tmp/kms.sock\n          timeout: 3s\n",
        ),
    ];
    let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("config.yaml");
    run(
        "fuzz_encryption_config",
        400,
        mutated_text(&seeds, &[b"\n      - ", b"*.*", b"*", b"secret: ", b"name: "], 5),
        |text| {
            std::fs::write(&path, &text).map_err(|e| e.to_string())?;
            if let Ok(config) = crate::encryption::load_config(&path) {
                let _ = crate::encryption::build_transformer(&config);
            }
            Ok(())
        },
    );
}

/// The `--audit-policy-file`: any text refused or accepted; an accepted policy answers a level
/// for any request.
#[test]
fn fuzz_audit_policy() {
    let seeds = [
        crate::audit::DEFAULT_POLICY,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: RequestResponse\n  resources: [{group: \"\", resources: [\"pods/*\"], resourceNames: [a]}]\n- level: Request\n  namespaces: [team]\n  omitStages: [ResponseStarted]\n- level: None\n  users: [system:kube-proxy]\n",
    ];
    run(
        "fuzz_audit_policy",
        500,
        mutated_text(
            &seeds,
            &[b"\n- level: ", b"*", b"/*", b"nonResourceURLs: [", b"Metadata"],
            5,
        ),
        |text| {
            if let Ok(policy) = crate::audit::Policy::parse(&text) {
                let user = crate::tls::Identity::new("jane", &["system:authenticated"]);
                let _ = policy.level(&user, &skiff_rbac::Attributes::non_resource("get", "/healthz/x"));
                let _ = policy.level(&user, &skiff_rbac::Attributes::resource("get", "", "pods", "team", "a"));
            }
            Ok(())
        },
    );
}
