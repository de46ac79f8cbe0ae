//! A node trying to get out of its box, through the real kubectl as `system:node:n1` in
//! `system:nodes` (impersonated, as a joined agent's certificate names it): mirror pods that
//! would make the Node authorizer grant it other objects, status writes that relabel a pod, and
//! cluster DNS EndpointSlices that would steer another node's or another Service's traffic.
//! Every escape is refused with upstream's words, and the objects it aimed at stay out of reach.

#![cfg(test)]

mod common;

use std::process::Output;

use common::Cluster;

const CONTROL_PLANE: &[&str] = &["--no-agent", "--no-scheduler"];
const N1: &[&str] = &["--as", "system:node:n1", "--as-group", "system:nodes"];

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

/// A mirror pod of n1 (owned by its Node, as the kubelet makes one) with `extra` spec lines.
fn mirror_pod(name: &str, node_uid: &str, extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  annotations: {{kubernetes.io/config.mirror: x}}\n  \
         ownerReferences: [{{apiVersion: v1, kind: Node, name: n1, uid: {node_uid}, controller: true}}]\n\
         spec:\n  nodeName: n1\n  containers:\n  - name: c\n    image: busybox:latest\n{extra}"
    )
}

#[test]
fn a_node_cannot_mint_itself_access_through_a_mirror_pod() {
    let c = Cluster::start(CONTROL_PLANE);
    c.apply("apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n", &[]);
    c.apply("apiVersion: v1\nkind: Node\nmetadata: {name: n2}\n", &[]);
    let uid = c.k(&["get", "node", "n1", "-o", "jsonpath={.metadata.uid}"]);
    c.k(&["create", "secret", "generic", "theirs", "--from-literal=k=v"]);
    c.k(&["create", "configmap", "theirs", "--from-literal=k=v"]);
    c.k(&["create", "serviceaccount", "robot"]);
    let create = |yaml: &str| c.stdin_kubectl_err(&[&["create", "-f", "-"], N1].concat(), yaml);

    let refused = [
        (
            "  serviceAccountName: robot\n",
            "a mirror pod may not reference service accounts",
        ),
        (
            "  volumes: [{name: s, secret: {secretName: theirs}}]\n",
            "a mirror pod may not reference secrets",
        ),
        (
            "  imagePullSecrets: [{name: theirs}]\n",
            "a mirror pod may not reference secrets",
        ),
        (
            "  volumes: [{name: t, projected: {sources: [{serviceAccountToken: {path: token}}]}}]\n",
            "a mirror pod may not use ServiceAccountToken volume projections",
        ),
        (
            "  volumes: [{name: m, configMap: {name: theirs}}]\n",
            "node \"n1\" can not create pods that reference configmaps",
        ),
        (
            "  volumes: [{name: p, persistentVolumeClaim: {claimName: data}}]\n",
            "node \"n1\" can not create pods that reference persistentvolumeclaims",
        ),
        (
            "  volumes: [{name: e, ephemeral: {volumeClaimTemplate: {spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}}}}]\n",
            "node \"n1\" can not create pods that reference persistentvolumeclaims",
        ),
    ];
    for (i, (extra, message)) in refused.iter().enumerate() {
        let out = create(&mirror_pod(&format!("m{i}"), &uid, extra));
        assert!(out.contains(message), "{extra}: {out}");
        assert!(out.contains("Forbidden") || out.contains("forbidden"), "{out}");
    }
    // Owned by another node, by nothing, or with a made-up UID: refused too.
    let out = create(&mirror_pod("stolen", &uid, "").replace("name: n1, uid", "name: n2, uid"));
    assert!(
        out.contains("node \"n1\" can only create pods with an owner reference set to itself"),
        "{out}"
    );
    let out = create(&mirror_pod("fake", "00000000-0000-0000-0000-000000000000", ""));
    assert!(out.contains("node n1 UID mismatch"), "{out}");
    let out = create(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: orphan\n  annotations: {kubernetes.io/config.mirror: x}\n\
         spec:\n  nodeName: n1\n  containers: [{name: c, image: busybox:latest}]\n",
    );
    assert!(
        out.contains("node \"n1\" can only create pods with an owner reference set to itself"),
        "{out}"
    );
    // None of them exists, and the Secret is as far away as before.
    let pods = c.k(&["get", "pods", "-o", "name"]);
    assert_eq!(pods.trim(), "", "{pods}");
    let out = c.kubectl(&[&["get", "secret", "theirs"], N1].concat());
    assert!(
        stderr(&out).contains("no relationship found between node 'n1' and this object"),
        "{}",
        stderr(&out)
    );

    // A mirror pod that references nothing is the node's to make, and to report on.
    let out = c.stdin_kubectl(&[&["create", "-f", "-"], N1].concat(), &mirror_pod("static", &uid, ""));
    assert!(out.contains("pod/static created"), "{out}");
    // Not through its status may it relabel the pod (the labels select Services and policies).
    let mut pod = c.get_json(&["pod", "static"]);
    pod["metadata"]["labels"] = serde_json::json!({"app": "db"});
    let out = c.stdin_kubectl_err(
        &[&["replace", "--subresource=status", "-f", "-"], N1].concat(),
        &pod.to_string(),
    );
    assert!(
        out.contains("node \"n1\" cannot update labels through pod status"),
        "{out}"
    );
    // Its status it may write.
    if let Some(md) = pod["metadata"].as_object_mut() {
        md.remove("labels");
    }
    pod["status"]["message"] = "reported by n1".into();
    let out = c.stdin_kubectl(
        &[&["replace", "--subresource=status", "-f", "-"], N1].concat(),
        &pod.to_string(),
    );
    assert!(out.contains("pod/static replaced"), "{out}");
}

/// n1's cluster DNS EndpointSlice as the agent writes it, changed by `f`.
fn dns_slice(node_uid: &str, node_name: &str, address: &str, service: &str) -> String {
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: kube-dns-n1\n  namespace: kube-system\n  \
         labels: {{kubernetes.io/service-name: {service}, endpointslice.kubernetes.io/managed-by: node-agent.skiff.io, k8s-app: kube-dns}}\n  \
         ownerReferences: [{{apiVersion: v1, kind: Node, name: n1, uid: {node_uid}}}]\n\
         addressType: IPv4\nendpoints:\n- addresses: [\"{address}\"]\n  nodeName: {node_name}\n  conditions: {{ready: true}}\n\
         ports: [{{name: dns, port: 53, protocol: UDP}}]\n"
    )
}

#[test]
fn a_node_cannot_steer_another_nodes_dns_or_another_service() {
    let c = Cluster::start(CONTROL_PLANE);
    c.apply(
        "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\nspec: {podCIDR: 10.250.1.0/24, podCIDRs: [10.250.1.0/24]}\n",
        &[],
    );
    let uid = c.k(&["get", "node", "n1", "-o", "jsonpath={.metadata.uid}"]);
    let apply = |yaml: &str| c.stdin_kubectl_err(&[&["create", "-f", "-"], N1].concat(), yaml);

    let out = apply(&dns_slice(&uid, "n2", "10.250.1.1", "kube-dns"));
    assert!(
        out.contains("node \"n1\" can only write endpoints with nodeName set to itself"),
        "{out}"
    );
    let out = apply(&dns_slice(&uid, "n1", "10.250.2.1", "kube-dns"));
    assert!(
        out.contains("can only write endpoints at its own addresses or podCIDR"),
        "{out}"
    );
    let out = apply(&dns_slice(&uid, "n1", "10.250.1.1", "kubernetes"));
    assert!(out.contains("can only label its cluster DNS EndpointSlice"), "{out}");
    assert_eq!(
        c.k(&["get", "endpointslices", "-n", "kube-system", "-o", "name"])
            .matches("kube-dns-n1")
            .count(),
        0
    );
    // Another name is refused whatever it holds.
    let out = apply(&dns_slice(&uid, "n1", "10.250.1.1", "kube-dns").replace("name: kube-dns-n1", "name: kube-dns-n2"));
    assert!(
        out.contains("node \"n1\" can only write the EndpointSlice kube-system/kube-dns-n1"),
        "{out}"
    );
    // What the agent writes is accepted.
    let out = c.stdin_kubectl(
        &[&["create", "-f", "-"], N1].concat(),
        &dns_slice(&uid, "n1", "10.250.1.1", "kube-dns"),
    );
    assert!(out.contains("kube-dns-n1 created"), "{out}");
}

/// A copy of the cluster's kubeconfig whose user presents `token` and nothing else.
fn token_kubeconfig(c: &Cluster, token: &str, file: &str) -> String {
    let mut kc: serde_json::Value =
        serde_json::from_str(&c.k(&["config", "view", "--raw", "--minify", "-o", "json"])).expect("kubeconfig json");
    kc["users"][0]["user"] = serde_json::json!({"token": token});
    let path = c.path().join(file);
    std::fs::write(&path, kc.to_string()).expect("write the kubeconfig");
    path.to_string_lossy().into_owned()
}

/// A node lists and watches only its own Node and its own pods (upstream's Node authorizer with
/// selectors); what the agent's proxy, DNS and provisioner read needs their service accounts'
/// tokens, which a node gets only bound to itself.
#[test]
fn a_node_reads_only_its_own_and_its_parts_tokens_are_bound_to_it() {
    let c = Cluster::start(CONTROL_PLANE);
    for n in ["n1", "n2"] {
        c.apply(&format!("apiVersion: v1\nkind: Node\nmetadata: {{name: {n}}}\n"), &[]);
    }
    let as_n1 = |args: &[&str]| c.kubectl(&[args, N1].concat());
    for (args, refusal) in [
        (
            &["get", "nodes"][..],
            "cannot list resource \"nodes\" in API group \"\" at the cluster scope: node 'n1' cannot read all nodes, only its own Node object",
        ),
        (
            &["get", "node", "n2"][..],
            "node 'n1' cannot read 'n2', only its own Node object",
        ),
        (
            &["get", "endpointslices", "-A"][..],
            "cannot list resource \"endpointslices\"",
        ),
        (
            &["get", "endpointslices", "-n", "kube-system", "kube-dns-n2"][..],
            "can only access the endpointslice kube-dns-n1",
        ),
        (
            &["get", "persistentvolumeclaims", "-A"][..],
            "cannot list resource \"persistentvolumeclaims\"",
        ),
        (
            &["get", "persistentvolumes"][..],
            "cannot list resource \"persistentvolumes\"",
        ),
        (&["get", "namespaces"][..], "cannot list resource \"namespaces\""),
        (
            &["get", "pods", "-A"][..],
            "can only list/watch pods with spec.nodeName field selector",
        ),
    ] {
        let out = as_n1(args);
        assert!(!out.status.success(), "{args:?} was allowed");
        assert!(stderr(&out).contains(refusal), "{args:?}: {}", stderr(&out));
    }
    // Its own, through the selectors the agent uses.
    let own = c.k(&[
        &["get", "nodes", "--field-selector", "metadata.name=n1", "-o", "name"],
        N1,
    ]
    .concat());
    assert_eq!(own.trim(), "node/n1");
    c.k(&[&["get", "pods", "-A", "--field-selector", "spec.nodeName=n1"], N1].concat());
    c.k(&[&["get", "namespace", "kube-system"], N1].concat());

    // The network's token: only bound to n1 itself.
    let token =
        |extra: &[&str]| as_n1(&[&["create", "token", "skiff-node-network", "-n", "kube-system"], extra].concat());
    let out = token(&[]);
    assert!(
        stderr(&out).contains("node requested token for skiff-node-network not bound to its own node"),
        "{}",
        stderr(&out)
    );
    let out = token(&["--bound-object-kind", "Node", "--bound-object-name", "n2"]);
    assert!(
        stderr(&out).contains("node requested token for skiff-node-network bound to a different node"),
        "{}",
        stderr(&out)
    );
    let out = as_n1(&[
        "create",
        "token",
        "default",
        "-n",
        "kube-system",
        "--bound-object-kind",
        "Node",
        "--bound-object-name",
        "n1",
    ]);
    assert!(stderr(&out).contains("forbidden"), "{}", stderr(&out));
    let out = token(&["--bound-object-kind", "Node", "--bound-object-name", "n1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let network = token_kubeconfig(&c, String::from_utf8_lossy(&out.stdout).trim(), "network.kubeconfig");
    let with = |args: &[&str]| c.kubectl(&[args, &["--kubeconfig", &network]].concat());
    let who = with(&["auth", "whoami", "-o", "json"]);
    let who: serde_json::Value = serde_json::from_slice(&who.stdout).expect("whoami json");
    assert_eq!(
        who["status"]["userInfo"]["username"],
        "system:serviceaccount:kube-system:skiff-node-network"
    );
    assert_eq!(
        who["status"]["userInfo"]["extra"]["authentication.kubernetes.io/node-name"][0],
        "n1"
    );
    // It reads what a proxy and DNS read, and nothing else.
    let nodes = with(&["get", "nodes", "-o", "name"]);
    assert_eq!(
        String::from_utf8_lossy(&nodes.stdout).lines().count(),
        2,
        "{}",
        stderr(&nodes)
    );
    assert!(with(&["get", "endpointslices", "-A"]).status.success());
    assert!(!with(&["get", "secrets", "-A"]).status.success());
    assert!(!with(&["get", "pods", "-A"]).status.success());
    // The token ends with its node.
    c.k(&["delete", "node", "n1"]);
    let out = with(&["get", "nodes"]);
    assert!(!out.status.success(), "a token of a deleted node still works");
    assert!(stderr(&out).contains("Unauthorized"), "{}", stderr(&out));
}

/// `GET URL` with `curl -k` (the agent's serving certificate is its own), optionally with a
/// bearer token: the status code and the body.
fn curl(url: &str, token: Option<&str>) -> (u16, String) {
    let mut cmd = std::process::Command::new("curl");
    cmd.args(["-sk", "-o", "-", "-w", "\n%{http_code}", url]);
    if let Some(t) = token {
        cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
    }
    let out = cmd.output().expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

#[test]
fn the_agent_authorizes_every_caller_through_the_api_server() {
    let n = common::node::Node::start("agentauthz", &["--no-scheduler"]);
    let c = &n.c;
    let port = c.k(&[
        "get",
        "node",
        &n.name,
        "-o",
        "jsonpath={.status.daemonEndpoints.kubeletEndpoint.Port}",
    ]);
    let base = format!("https://127.0.0.1:{}", port.trim());
    // No credentials: 401, as upstream's kubelet answers.
    let (code, body) = curl(&format!("{base}/healthz"), None);
    assert_eq!((code, body.as_str()), (401, "Unauthorized"));
    // A service account RBAC grants nothing on nodes: its token is vouched for, its request refused.
    c.k(&["create", "serviceaccount", "nosy"]);
    let nosy = c.k(&["create", "token", "nosy"]);
    let (code, body) = curl(&format!("{base}/pods"), Some(nosy.trim()));
    assert_eq!(code, 403, "{body}");
    assert_eq!(
        body,
        "Forbidden (user=system:serviceaccount:default:nosy, verb=get, resource=nodes, subresource=proxy)"
    );
    let (code, _) = curl(&format!("{base}/healthz"), Some("forged.token"));
    assert_eq!(code, 401);
    // Granted nodes/healthz alone (fine-grained, as upstream 1.36): its health, nothing else.
    c.k(&[
        "create",
        "clusterrole",
        "node-health",
        "--verb=get",
        "--resource=nodes/healthz",
    ]);
    c.k(&["create", "serviceaccount", "checker"]);
    c.k(&[
        "create",
        "clusterrolebinding",
        "checker-health",
        "--clusterrole=node-health",
        "--serviceaccount=default:checker",
    ]);
    let checker = c.k(&["create", "token", "checker"]);
    let (code, body) = curl(&format!("{base}/healthz"), Some(checker.trim()));
    assert_eq!((code, body.as_str()), (200, "ok"));
    let (code, body) = curl(&format!("{base}/containerLogs/default/x/y"), Some(checker.trim()));
    assert_eq!(code, 403, "{body}");
    // The API server's own calls are authorized the same way, by the binding that names its
    // certificate.
    let health = c.k(&["get", "--raw", &format!("/api/v1/nodes/{}/proxy/healthz", n.name)]);
    assert_eq!(health, "ok");
}

#[test]
fn no_signer_issues_the_names_reserved_to_skiffs_own_parts() {
    use base64::Engine;
    let c = Cluster::start(CONTROL_PLANE);
    for cn in ["kube-apiserver-kubelet-client", "skiff-super-admin"] {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let csr = params.serialize_request(&key).expect("csr").pem().expect("pem");
        let request = base64::engine::general_purpose::STANDARD.encode(csr);
        let err = c.stdin_kubectl_err(
            &["create", "-f", "-"],
            &format!(
                "apiVersion: certificates.k8s.io/v1\nkind: CertificateSigningRequest\nmetadata: {{name: steal}}\n\
                 spec:\n  signerName: kubernetes.io/kube-apiserver-client\n  usages: [client auth]\n  request: {request}\n"
            ),
        );
        assert!(
            err.contains(&format!(
                "use of kubernetes.io/kube-apiserver-client signer with the reserved name \"{cn}\" is not allowed"
            )),
            "{err}"
        );
    }
}
