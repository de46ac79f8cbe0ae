//! Admission webhooks: Mutating and ValidatingWebhookConfigurations created with kubectl, called
//! by `skiff server` over HTTPS on a webhook server this test runs on 127.0.0.1 (its certificate
//! signed by a CA of the test's own, given in `caBundle`). A mutating webhook labels pods with a
//! JSONPatch; a validating webhook refuses ConfigMaps holding a `forbidden` key with upstream's
//! message; failure policies, a namespace selector and timeouts are honoured.

#![cfg(test)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use common::Cluster;
use serde_json::{Value, json};

/// A CA and a serving certificate for 127.0.0.1 signed by it (PEM).
struct Certs {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

fn certs() -> Certs {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.distinguished_name.push(DnType::CommonName, "webhook test CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).expect("CA");
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().expect("key");
    let params = CertificateParams::new(vec!["127.0.0.1".to_string(), "webhook.test.svc".to_string()]).expect("params");
    let cert = params.signed_by(&key, &issuer).expect("serving certificate");
    Certs {
        ca_pem: ca_cert.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

/// A self-signed CA certificate for 127.0.0.1 that serves as its own end entity, as operator
/// frameworks generate it: the `caBundle` is the serving certificate itself.
fn self_signed_ca_certs() -> Certs {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_string()]).expect("params");
    params.distinguished_name.push(DnType::CommonName, "webhook.test.svc");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).expect("self-signed");
    Certs {
        ca_pem: cert.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

/// What the test's webhooks answer to one AdmissionReview, by path.
fn answer(path: &str, review: &Value) -> Value {
    let req = &review["request"];
    let uid = req["uid"].clone();
    let mut response = json!({"uid": uid, "allowed": true});
    match path {
        "/mutate" | "/mutate2" => {
            let label = if path == "/mutate" { "webhook-added" } else { "second" };
            let patch = if req["object"]["metadata"]["labels"].is_object() {
                json!([{"op": "add", "path": format!("/metadata/labels/{label}"), "value": "yes"}])
            } else {
                json!([{"op": "add", "path": "/metadata/labels", "value": {label: "yes"}}])
            };
            response["patchType"] = json!("JSONPatch");
            response["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(patch.to_string()));
        }
        "/validate" => {
            response["warnings"] = json!(["checked by the test webhook"]);
            if req["object"]["data"].get("forbidden").is_some() {
                response["allowed"] = json!(false);
                response["status"] = json!({"message": "the key \"forbidden\" is not allowed"});
            }
        }
        "/slow" => std::thread::sleep(Duration::from_secs(4)),
        "/deny-subresources" => {
            response["allowed"] = json!(false);
            response["status"] =
                json!({"message": format!("{} refused by the test", req["kind"]["kind"].as_str().unwrap_or(""))});
        }
        _ => {}
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
}

/// One HTTPS exchange: read the request, answer it.
fn serve_one(tcp: TcpStream, config: Arc<rustls::ServerConfig>, seen: &std::sync::Mutex<Vec<Value>>) {
    let Ok(conn) = rustls::ServerConnection::new(config) else {
        return;
    };
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let mut reader = BufReader::new(&mut tls);
    let mut first = String::new();
    if reader.read_line(&mut first).is_err() {
        return;
    }
    let path = first
        .split_whitespace()
        .nth(1)
        .unwrap_or("/")
        .split('?')
        .next()
        .unwrap_or("/")
        .to_string();
    let mut len = 0;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).is_err() || line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            len = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; len];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let review: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    seen.lock().expect("seen").push(json!({"path": path, "review": review}));
    let out = answer(&path, &review).to_string();
    let resp = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{out}",
        out.len()
    );
    let _ = tls.write_all(resp.as_bytes());
    let _ = tls.flush();
    tls.conn.send_close_notify();
    let _ = tls.flush();
}

/// The webhook server: every request on its own thread (the slow webhook must not hold others).
struct WebhookServer {
    port: u16,
    seen: Arc<std::sync::Mutex<Vec<Value>>>,
}

impl WebhookServer {
    fn start(certs: &Certs) -> WebhookServer {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = vec![CertificateDer::from_pem_slice(certs.cert_pem.as_bytes()).expect("cert")];
        let key = PrivateKeyDer::from_pem_slice(certs.key_pem.as_bytes()).expect("key");
        let config = Arc::new(
            rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_no_client_auth()
                .with_single_cert(chain, key)
                .expect("server config"),
        );
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let s = seen.clone();
        std::thread::spawn(move || {
            for tcp in listener.incoming().flatten() {
                let config = config.clone();
                let s = s.clone();
                std::thread::spawn(move || serve_one(tcp, config, &s));
            }
        });
        WebhookServer { port, seen }
    }

    /// The reviews received so far on `path`.
    fn reviews(&self, path: &str) -> Vec<Value> {
        self.seen
            .lock()
            .expect("seen")
            .iter()
            .filter(|r| r["path"] == path)
            .map(|r| r["review"].clone())
            .collect()
    }
}

fn stderr_of(c: &Cluster, args: &[&str]) -> (bool, String) {
    let out = c.kubectl(args);
    (out.status.success(), String::from_utf8_lossy(&out.stderr).to_string())
}

#[test]
fn webhooks_mutate_and_validate_as_upstream_calls_them() {
    let c = Cluster::start(&["--no-agent", "--no-scheduler"]);
    let certs = certs();
    let server = WebhookServer::start(&certs);
    let ca = base64::engine::general_purpose::STANDARD.encode(&certs.ca_pem);
    let url = |path: &str| format!("https://127.0.0.1:{}{path}", server.port);

    c.apply(
        &format!(
            r#"
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: pod-labeler
webhooks:
- name: label.pods.skiff.test
  clientConfig:
    url: {}
    caBundle: {ca}
  rules:
  - operations: ["CREATE"]
    apiGroups: [""]
    apiVersions: ["v1"]
    resources: ["pods"]
  namespaceSelector:
    matchExpressions:
    - {{key: webhooks, operator: NotIn, values: [skip]}}
  sideEffects: None
  admissionReviewVersions: ["v1"]
"#,
            url("/mutate")
        ),
        &[],
    );
    c.apply(
        &format!(
            r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: configmap-guard
webhooks:
- name: deny.configmaps.skiff.test
  clientConfig:
    url: {}
    caBundle: {ca}
  rules:
  - operations: ["CREATE", "UPDATE"]
    apiGroups: [""]
    apiVersions: ["v1"]
    resources: ["configmaps"]
  sideEffects: None
  admissionReviewVersions: ["v1", "v1beta1"]
"#,
            url("/validate")
        ),
        &[],
    );

    // Served with upstream's defaults and columns.
    let v = c.get_json(&["validatingwebhookconfiguration", "configmap-guard"]);
    let hook = &v["webhooks"][0];
    assert_eq!(hook["failurePolicy"], "Fail", "{v}");
    assert_eq!(hook["matchPolicy"], "Equivalent", "{v}");
    assert_eq!(hook["timeoutSeconds"], 10, "{v}");
    assert_eq!(hook["namespaceSelector"], json!({}), "{v}");
    assert_eq!(hook["objectSelector"], json!({}), "{v}");
    assert_eq!(hook["rules"][0]["scope"], "*", "{v}");
    let m = c.get_json(&["mutatingwebhookconfiguration", "pod-labeler"]);
    assert_eq!(m["webhooks"][0]["reinvocationPolicy"], "Never", "{m}");
    let listed = c.k(&["get", "validatingwebhookconfigurations"]);
    let rows = common::table(&listed);
    assert_eq!(rows[0][..3], ["NAME", "WEBHOOKS", "AGE"], "{listed}");
    assert_eq!(rows[1][..2], ["configmap-guard", "1"], "{listed}");

    // Refused as upstream refuses them: no sideEffects, a plain http URL, a condition name that
    // is not a qualified name.
    let bad = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: bad
webhooks:
- name: bad.skiff.test
  clientConfig:
    url: http://127.0.0.1:1/x
  matchConditions:
  - {name: always, expression: "true"}
  - {name: Not_Qualified!, expression: "true"}
  admissionReviewVersions: ["v1"]
"#;
    let err = c.stdin_kubectl_err(&["apply", "-f", "-"], bad);
    assert!(
        err.contains("webhooks[0].sideEffects: Required value: must specify one of None, NoneOnDryRun"),
        "{err}"
    );
    assert!(
        err.contains("webhooks[0].clientConfig.url: Invalid value: \"http\": 'https' is the only allowed URL scheme"),
        "{err}"
    );
    assert!(
        err.contains("webhooks[0].matchConditions[1].name: Invalid value: \"Not_Qualified!\""),
        "{err}"
    );

    // The mutating webhook labels pods, and is sent an AdmissionReview as upstream sends it.
    c.k(&["run", "labelled", "--image=busybox:latest", "--restart=Never"]);
    let pod = c.get_json(&["pod", "labelled"]);
    assert_eq!(pod["metadata"]["labels"]["webhook-added"], "yes", "{pod}");
    assert_eq!(pod["metadata"]["labels"]["run"], "labelled", "{pod}");
    let review = server.reviews("/mutate").pop().expect("a review");
    let req = &review["request"];
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(req["operation"], "CREATE", "{review}");
    assert_eq!(
        req["kind"],
        json!({"group": "", "version": "v1", "kind": "Pod"}),
        "{review}"
    );
    assert_eq!(
        req["resource"],
        json!({"group": "", "version": "v1", "resource": "pods"}),
        "{review}"
    );
    assert_eq!(req["requestResource"], req["resource"], "{review}");
    assert_eq!(req["namespace"], "default", "{review}");
    assert_eq!(req["name"], "labelled", "{review}");
    assert_eq!(req["object"]["metadata"]["name"], "labelled", "{review}");
    assert!(req["oldObject"].is_null(), "{review}");
    assert_eq!(req["dryRun"], false, "{review}");
    assert_eq!(req["options"]["kind"], "CreateOptions", "{review}");
    assert!(
        req["userInfo"]["username"].as_str().is_some_and(|u| !u.is_empty()),
        "{review}"
    );

    // A namespace the selector leaves out: no call, no label.
    c.k(&["create", "namespace", "skipped"]);
    c.k(&["label", "namespace", "skipped", "webhooks=skip"]);
    let before = server.reviews("/mutate").len();
    c.k(&[
        "-n",
        "skipped",
        "run",
        "plain",
        "--image=busybox:latest",
        "--restart=Never",
    ]);
    let pod = c.get_json(&["-n", "skipped", "pod", "plain"]);
    assert!(pod["metadata"]["labels"].get("webhook-added").is_none(), "{pod}");
    assert_eq!(server.reviews("/mutate").len(), before);

    // The validating webhook: upstream's denial, and its warnings as kubectl prints them.
    let (ok, err) = stderr_of(&c, &["create", "configmap", "bad", "--from-literal=forbidden=1"]);
    assert!(!ok, "{err}");
    assert!(
        err.contains(
            "admission webhook \"deny.configmaps.skiff.test\" denied the request: the key \"forbidden\" is not allowed"
        ),
        "{err}"
    );
    assert!(err.contains("Warning: checked by the test webhook"), "{err}");
    assert!(c.get_opt(&["configmap", "bad"]).is_none());
    let (ok, err) = stderr_of(&c, &["create", "configmap", "good", "--from-literal=fine=1"]);
    assert!(ok, "{err}");
    assert!(err.contains("Warning: checked by the test webhook"), "{err}");
    // An update is judged too, with the old object.
    let (ok, err) = stderr_of(
        &c,
        &[
            "patch",
            "configmap",
            "good",
            "--type=merge",
            "-p",
            r#"{"data":{"forbidden":"x"}}"#,
        ],
    );
    assert!(!ok && err.contains("denied the request"), "{err}");
    let review = server.reviews("/validate").pop().expect("a review");
    assert_eq!(review["request"]["operation"], "UPDATE", "{review}");
    assert_eq!(review["request"]["oldObject"]["data"], json!({"fine": "1"}), "{review}");

    // A webhook whose server is down: Fail refuses with upstream's 500, Ignore lets it through.
    let down = {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let down_config = |policy: &str| {
        format!(
            r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: down
webhooks:
- name: down.secrets.skiff.test
  clientConfig:
    url: https://127.0.0.1:{down}/validate
    caBundle: {ca}
  rules:
  - operations: ["CREATE"]
    apiGroups: [""]
    apiVersions: ["v1"]
    resources: ["secrets"]
  failurePolicy: {policy}
  sideEffects: None
  admissionReviewVersions: ["v1"]
"#
        )
    };
    c.apply(&down_config("Fail"), &[]);
    let (ok, err) = stderr_of(&c, &["create", "secret", "generic", "s1", "--from-literal=a=b"]);
    assert!(!ok, "{err}");
    let want = format!(
        "Internal error occurred: failed calling webhook \"down.secrets.skiff.test\": failed to call webhook: Post \"https://127.0.0.1:{down}/validate?timeout=10s\": dial tcp 127.0.0.1:{down}: connect: connection refused"
    );
    assert!(err.contains(&want), "{err}\nwanted: {want}");
    c.apply(&down_config("Ignore"), &[]);
    c.k(&["create", "secret", "generic", "s1", "--from-literal=a=b"]);

    // A webhook slower than its timeoutSeconds: refused after about a second, or let through.
    let slow_config = |policy: &str| {
        format!(
            r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: slow
webhooks:
- name: slow.serviceaccounts.skiff.test
  clientConfig:
    url: {}
    caBundle: {ca}
  rules:
  - operations: ["CREATE"]
    apiGroups: [""]
    apiVersions: ["v1"]
    resources: ["serviceaccounts"]
  failurePolicy: {policy}
  timeoutSeconds: 1
  sideEffects: None
  admissionReviewVersions: ["v1"]
"#,
            url("/slow")
        )
    };
    c.apply(&slow_config("Fail"), &[]);
    let started = Instant::now();
    let (ok, err) = stderr_of(&c, &["create", "serviceaccount", "sa1"]);
    let took = started.elapsed();
    assert!(!ok, "{err}");
    assert!(
        err.contains(&format!(
            "failed calling webhook \"slow.serviceaccounts.skiff.test\": failed to call webhook: Post \"{}?timeout=1s\": context deadline exceeded",
            url("/slow")
        )),
        "{err}"
    );
    assert!(took < Duration::from_secs(3), "the timeout was not honoured: {took:?}");
    c.apply(&slow_config("Ignore"), &[]);
    let started = Instant::now();
    c.k(&["create", "serviceaccount", "sa2"]);
    assert!(started.elapsed() < Duration::from_secs(3));

    // reinvocationPolicy IfNeeded: the labeller is called again once a later webhook (by
    // configuration name) changed the pod, and then sees that webhook's label.
    c.k(&[
        "patch",
        "mutatingwebhookconfiguration",
        "pod-labeler",
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/webhooks/0/reinvocationPolicy","value":"IfNeeded"}]"#,
    ]);
    c.apply(
        &format!(
            r#"
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: zz-second
webhooks:
- name: second.pods.skiff.test
  clientConfig:
    url: {}
    caBundle: {ca}
  rules:
  - operations: ["CREATE"]
    apiGroups: [""]
    apiVersions: ["v1"]
    resources: ["pods"]
  sideEffects: None
  admissionReviewVersions: ["v1"]
"#,
            url("/mutate2")
        ),
        &[],
    );
    let before = server.reviews("/mutate").len();
    c.k(&["run", "twice", "--image=busybox:latest", "--restart=Never"]);
    let pod = c.get_json(&["pod", "twice"]);
    assert_eq!(pod["metadata"]["labels"]["webhook-added"], "yes", "{pod}");
    assert_eq!(pod["metadata"]["labels"]["second"], "yes", "{pod}");
    let calls = server.reviews("/mutate");
    assert_eq!(calls.len(), before + 2, "the labeller was not called again");
    let again = calls.last().expect("a review");
    assert_eq!(
        again["request"]["object"]["metadata"]["labels"]["second"], "yes",
        "{again}"
    );

    // The configurations themselves are never judged by webhooks, and deleting them stops the calls.
    c.k(&[
        "delete",
        "validatingwebhookconfiguration",
        "configmap-guard",
        "down",
        "slow",
    ]);
    c.k(&["create", "configmap", "now-fine", "--from-literal=forbidden=1"]);
}

#[test]
fn match_conditions_decide_whether_a_webhook_is_called() {
    let c = Cluster::start(&["--no-agent", "--no-scheduler"]);
    let certs = certs();
    let server = WebhookServer::start(&certs);
    let ca = base64::engine::general_purpose::STANDARD.encode(&certs.ca_pem);
    c.apply(
        &format!(
            r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: checked-configmaps
webhooks:
- name: checked.configmaps.skiff.test
  clientConfig:
    url: https://127.0.0.1:{}/validate
    caBundle: {ca}
  rules:
  - operations: ["CREATE"]
    apiGroups: [""]
    apiVersions: ["v1"]
    resources: ["configmaps"]
  matchConditions:
  - name: checked
    expression: "has(object.metadata.labels) && object.metadata.labels['checked'] == 'yes'"
  - name: not-the-admin-namespace
    expression: "request.namespace != 'kube-system'"
  sideEffects: None
  admissionReviewVersions: ["v1"]
"#,
            server.port
        ),
        &[],
    );
    // Not matched: the webhook is not called, and the ConfigMap goes in.
    c.k(&["create", "configmap", "plain", "--from-literal=forbidden=1"]);
    assert!(server.reviews("/validate").is_empty());
    // Matched: the webhook is called and refuses.
    let cm = |name: &str, ns: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: {ns}, labels: {{checked: 'yes'}}}}\ndata: {{forbidden: '1'}}\n"
        )
    };
    let err = c.stdin_kubectl_err(&["create", "-f", "-"], &cm("checked", "default"));
    assert!(
        err.contains("admission webhook \"checked.configmaps.skiff.test\" denied the request: the key \"forbidden\" is not allowed"),
        "{err}"
    );
    assert_eq!(server.reviews("/validate").len(), 1);
    // The second condition is false in kube-system.
    c.stdin_kubectl(&["create", "-f", "-"], &cm("checked", "kube-system"));
    assert_eq!(server.reviews("/validate").len(), 1);

    // A condition that does not compile refuses the configuration.
    let bad = c.stdin_kubectl_err(
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\nmetadata: {{name: bad}}\nwebhooks:\n- name: bad.skiff.test\n  clientConfig: {{url: 'https://127.0.0.1:{}/validate'}}\n  sideEffects: None\n  admissionReviewVersions: [v1]\n  matchConditions:\n  - {{name: broken, expression: 'object.metadata.name =='}}\n",
            server.port
        ),
    );
    assert!(
        bad.contains("webhooks[0].matchConditions[0].expression: Invalid value: \"object.metadata.name ==\": compilation failed: ERROR: <input>:1:"),
        "{bad}"
    );
}

/// Exec, attach and port-forward (CONNECT), evictions, bindings and token requests reach the
/// validating webhooks and ValidatingAdmissionPolicies with their own kinds, as upstream admits
/// them; a caBundle that is no certificate is refused when written.
#[test]
fn connects_and_subresource_writes_are_admitted_too() {
    let c = Cluster::start(&["--no-agent", "--no-scheduler"]);
    let certs = certs();
    let server = WebhookServer::start(&certs);
    let ca = base64::engine::general_purpose::STANDARD.encode(&certs.ca_pem);
    c.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: c, image: busybox:latest}]\n",
        &[],
    );
    c.apply(
        &format!(
            r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: subresource-guard
webhooks:
- name: deny.subresources.skiff.test
  clientConfig:
    url: https://127.0.0.1:{}/deny-subresources
    caBundle: {ca}
  rules:
  - operations: ["CONNECT"]
    apiGroups: [""]
    apiVersions: ["v1"]
    resources: ["pods/exec", "pods/attach", "pods/portforward"]
  - operations: ["CREATE"]
    apiGroups: [""]
    apiVersions: ["v1"]
    resources: ["pods/eviction", "pods/binding", "serviceaccounts/token"]
  sideEffects: None
  admissionReviewVersions: ["v1"]
"#,
            server.port
        ),
        &[],
    );
    let (ok, err) = stderr_of(&c, &["exec", "p", "--", "echo", "hi"]);
    assert!(!ok);
    assert!(
        err.contains(
            "admission webhook \"deny.subresources.skiff.test\" denied the request: PodExecOptions refused by the test"
        ),
        "{err}"
    );
    let review = server
        .reviews("/deny-subresources")
        .pop()
        .expect("the exec was reviewed");
    let req = &review["request"];
    assert_eq!(req["operation"], "CONNECT", "{review}");
    assert_eq!(
        req["kind"],
        json!({"group": "", "version": "v1", "kind": "PodExecOptions"}),
        "{review}"
    );
    assert_eq!(req["subResource"], "exec", "{review}");
    assert_eq!(req["object"]["command"], json!(["echo", "hi"]), "{review}");
    assert_eq!(req["name"], "p", "{review}");

    let (ok, err) = stderr_of(&c, &["create", "token", "default"]);
    assert!(!ok);
    assert!(err.contains("TokenRequest refused by the test"), "{err}");
    let eviction = r#"{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":"p","namespace":"default"}}"#;
    let err = c.stdin_kubectl_err(
        &[
            "create",
            "--raw",
            "/api/v1/namespaces/default/pods/p/eviction",
            "-f",
            "-",
        ],
        eviction,
    );
    assert!(err.contains("Eviction refused by the test"), "{err}");
    let binding =
        r#"{"apiVersion":"v1","kind":"Binding","metadata":{"name":"p"},"target":{"kind":"Node","name":"n1"}}"#;
    let err = c.stdin_kubectl_err(
        &[
            "create",
            "--raw",
            "/api/v1/namespaces/default/pods/p/binding",
            "-f",
            "-",
        ],
        binding,
    );
    assert!(err.contains("Binding refused by the test"), "{err}");
    // None of them happened.
    let pod = c.get_json(&["pod", "p"]);
    assert!(pod["spec"].get("nodeName").is_none(), "{pod}");
    assert!(pod["metadata"].get("deletionTimestamp").is_none(), "{pod}");
    c.k(&["delete", "validatingwebhookconfiguration", "subresource-guard"]);

    // A ValidatingAdmissionPolicy sees the exec's options too.
    c.apply(
        r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: no-rm}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - operations: ["CONNECT"]
      apiGroups: [""]
      apiVersions: ["v1"]
      resources: ["pods/exec"]
  validations:
  - expression: "object.command[0] != 'rm'"
    message: "no rm in exec"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: no-rm}
spec:
  policyName: no-rm
  validationActions: [Deny]
"#,
        &[],
    );
    let err = common::eventually(Duration::from_secs(5), || {
        let (ok, err) = stderr_of(&c, &["exec", "p", "--", "rm", "-rf", "/"]);
        (!ok && err.contains("no rm in exec")).then_some(err)
    })
    .expect("the policy refuses the exec");
    assert!(
        err.contains("ValidatingAdmissionPolicy 'no-rm' with binding 'no-rm' denied request"),
        "{err}"
    );

    // A caBundle that holds no certificate is refused when written.
    let bogus = base64::engine::general_purpose::STANDARD.encode("not a certificate");
    let err = c.stdin_kubectl_err(
        &["apply", "-f", "-"],
        &format!(
            r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {{name: bogus-ca}}
webhooks:
- name: bogus.skiff.test
  clientConfig: {{url: "https://127.0.0.1:1/x", caBundle: {bogus}}}
  rules: [{{operations: ["CREATE"], apiGroups: [""], apiVersions: ["v1"], resources: ["configmaps"]}}]
  sideEffects: None
  admissionReviewVersions: ["v1"]
"#
        ),
    );
    assert!(
        err.contains("webhooks[0].clientConfig.caBundle: Invalid value: \"(bytes)\": must be a PEM bundle of one or more X.509 certificates"),
        "{err}"
    );
}

/// A webhook whose serving certificate is a self-signed CA certificate given as its own
/// `caBundle` is called, as upstream's Go client trusts a certificate found in its roots; a
/// bundle of another self-signed certificate is still refused.
#[test]
fn a_self_signed_ca_certificate_serves_as_its_own_bundle() {
    let c = Cluster::start(&["--no-agent", "--no-scheduler"]);
    let certs = self_signed_ca_certs();
    let server = WebhookServer::start(&certs);
    let hook = |name: &str, bundle: &str| {
        format!(
            "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\nmetadata: {{name: {name}}}\nwebhooks:\n- name: {name}.skiff.test\n  clientConfig: {{url: 'https://127.0.0.1:{}/validate', caBundle: {}}}\n  rules:\n  - {{operations: [CREATE], apiGroups: [''], apiVersions: [v1], resources: [configmaps]}}\n  namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {name}}}}}\n  sideEffects: None\n  admissionReviewVersions: [v1]\n",
            server.port,
            base64::engine::general_purpose::STANDARD.encode(bundle)
        )
    };
    c.k(&["create", "namespace", "own"]);
    c.apply(&hook("own", &certs.ca_pem), &[]);
    let err = c.k_err(&[
        "create",
        "configmap",
        "refused",
        "-n",
        "own",
        "--from-literal=forbidden=1",
    ]);
    assert!(
        err.contains("admission webhook \"own.skiff.test\" denied the request: the key \"forbidden\" is not allowed"),
        "{err}"
    );
    assert_eq!(server.reviews("/validate").len(), 1);

    c.k(&["create", "namespace", "other"]);
    c.apply(&hook("other", &self_signed_ca_certs().ca_pem), &[]);
    let err = c.k_err(&["create", "configmap", "unverified", "-n", "other", "--from-literal=a=b"]);
    assert!(err.contains("failed calling webhook \"other.skiff.test\""), "{err}");
    assert_eq!(server.reviews("/validate").len(), 1);
}
