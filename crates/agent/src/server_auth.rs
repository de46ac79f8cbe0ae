//! Who may call the agent's HTTPS endpoint, decided as upstream's kubelet decides it
//! (`pkg/kubelet/server/auth.go`, webhook authentication and authorization): a caller presents a
//! client certificate the cluster CA signed (its CN the user, its Os the groups) or a bearer
//! token the API server vouches for (TokenReview); what it asks is then put to the API server
//! as a SubjectAccessReview on the node's subresources (`nodes/stats`, `nodes/metrics`,
//! `nodes/log`, `nodes/pods`, `nodes/healthz`, `nodes/configz`, each falling back to
//! `nodes/proxy` where upstream's fine-grained authorization does, and `nodes/proxy` for
//! everything else). No certificate is trusted for its name alone: the API server's own is
//! allowed by the RBAC binding that names it. Decisions are cached as upstream's webhook
//! authorizer caches them (allowed 5 minutes, denied 30 seconds; tokens 2 minutes).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// An authenticated caller.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Caller {
    pub user: String,
    pub uid: String,
    pub groups: Vec<String>,
}

impl Caller {
    /// The caller a client certificate names: CN the user, each O a group.
    pub fn from_certificate(der: &[u8]) -> Option<Caller> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let subject = cert.subject();
        let user = subject.iter_common_name().next()?.as_str().ok()?.to_string();
        let mut groups: Vec<String> = subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok().map(str::to_string))
            .collect();
        groups.push("system:authenticated".into());
        Some(Caller {
            user,
            uid: String::new(),
            groups,
        })
    }
}

/// What a request asks of the node: the verb, then the subresources that may allow it, in the
/// order they are asked.
pub fn attributes(method: &http::Method, path: &str) -> (&'static str, &'static [&'static str]) {
    let first = path.trim_start_matches('/').split('/').next().unwrap_or("");
    // Streams into a container need `create` whatever method opens them: a WebSocket opens
    // with GET, and a `get` on nodes/proxy must not be an exec.
    let streaming = matches!(first, "exec" | "attach" | "portForward" | "run");
    let verb = if streaming {
        "create"
    } else {
        match *method {
            http::Method::GET | http::Method::HEAD => "get",
            http::Method::POST => "create",
            http::Method::PUT => "update",
            http::Method::PATCH => "patch",
            http::Method::DELETE => "delete",
            _ => "",
        }
    };
    let subresources: &'static [&'static str] = match first {
        "stats" => &["stats"],
        "metrics" => &["metrics"],
        "logs" => &["log"],
        "spec" => &["spec"],
        "checkpoint" => &["checkpoint"],
        "pods" => &["pods", "proxy"],
        "healthz" => &["healthz", "proxy"],
        "configz" => &["configz", "proxy"],
        _ => &["proxy"],
    };
    (verb, subresources)
}

/// A cache of decisions with their expiry.
struct Cache<K, V> {
    entries: HashMap<K, (V, Instant)>,
}

impl<K: std::hash::Hash + Eq, V: Clone> Cache<K, V> {
    const MAX: usize = 10_000;

    fn get(&mut self, k: &K) -> Option<V> {
        match self.entries.get(k) {
            Some((v, until)) if *until > Instant::now() => Some(v.clone()),
            Some(_) => {
                self.entries.remove(k);
                None
            }
            None => None,
        }
    }

    fn put(&mut self, k: K, v: V, ttl: Duration) {
        if self.entries.len() >= Self::MAX {
            self.entries.clear();
        }
        self.entries.insert(k, (v, Instant::now() + ttl));
    }
}

impl<K, V> Default for Cache<K, V> {
    fn default() -> Self {
        Cache {
            entries: HashMap::new(),
        }
    }
}

/// The endpoint's authenticator and authorizer: the API server, asked through `client`.
pub struct Authorizer {
    client: Option<kube::Client>,
    node: String,
    tokens: parking_lot::Mutex<Cache<[u8; 32], Option<Caller>>>,
    decisions: parking_lot::Mutex<Cache<(Caller, &'static str, &'static str), bool>>,
}

/// How long decisions are kept.
const ALLOWED_TTL: Duration = Duration::from_secs(300);
const DENIED_TTL: Duration = Duration::from_secs(30);
const TOKEN_TTL: Duration = Duration::from_secs(120);

impl Authorizer {
    /// Asks the API server through `client` (none: every request is refused, the agent having
    /// no one to ask).
    pub fn new(client: Option<kube::Client>, node: &str) -> Authorizer {
        Authorizer {
            client,
            node: node.to_string(),
            tokens: Default::default(),
            decisions: Default::default(),
        }
    }

    /// The caller a bearer token belongs to, as the API server's TokenReview says.
    pub async fn authenticate_token(&self, token: &str) -> Option<Caller> {
        let key: [u8; 32] = {
            use sha2::Digest;
            sha2::Sha256::digest(token.as_bytes()).into()
        };
        if let Some(cached) = self.tokens.lock().get(&key) {
            return cached;
        }
        let client = self.client.as_ref()?;
        let review = json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        });
        let answer = match post(client, "/apis/authentication.k8s.io/v1/tokenreviews", &review).await {
            Ok(a) => a,
            Err(e) => {
                // Not cached: the next request asks again.
                tracing::warn!(error = %format!("{e:#}"), "reviewing a bearer token failed");
                return None;
            }
        };
        let status = &answer["status"];
        let caller = (status["authenticated"] == true).then(|| Caller {
            user: status["user"]["username"].as_str().unwrap_or("").to_string(),
            uid: status["user"]["uid"].as_str().unwrap_or("").to_string(),
            groups: status["user"]["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|g| g.as_str().map(str::to_string))
                .collect(),
        });
        self.tokens.lock().put(key, caller.clone(), TOKEN_TTL);
        caller
    }

    /// Whether `caller` may `verb` the node's `subresource`, as the API server's
    /// SubjectAccessReview says. An API server that does not answer allows nothing.
    pub async fn allowed(&self, caller: &Caller, verb: &'static str, subresource: &'static str) -> bool {
        let key = (caller.clone(), verb, subresource);
        if let Some(d) = self.decisions.lock().get(&key) {
            return d;
        }
        let Some(client) = &self.client else {
            return false;
        };
        let review = json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": caller.user,
                "uid": caller.uid,
                "groups": caller.groups,
                "resourceAttributes": {
                    "verb": verb,
                    "group": "",
                    "version": "v1",
                    "resource": "nodes",
                    "subresource": subresource,
                    "name": self.node,
                },
            },
        });
        let allowed = match post(client, "/apis/authorization.k8s.io/v1/subjectaccessreviews", &review).await {
            Ok(a) => a["status"]["allowed"] == true,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "asking the API server's authorizer failed");
                return false;
            }
        };
        let ttl = if allowed { ALLOWED_TTL } else { DENIED_TTL };
        self.decisions.lock().put(key, allowed, ttl);
        allowed
    }
}

async fn post(client: &kube::Client, path: &str, body: &Value) -> anyhow::Result<Value> {
    let req = http::Request::post(path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(body)?)?;
    let text = client.request_text(req).await?;
    Ok(serde_json::from_str(&text)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_upstreams_node_subresources() {
        let get = http::Method::GET;
        assert_eq!(attributes(&get, "/stats/summary"), ("get", &["stats"][..]));
        assert_eq!(attributes(&get, "/metrics"), ("get", &["metrics"][..]));
        assert_eq!(attributes(&get, "/pods"), ("get", &["pods", "proxy"][..]));
        assert_eq!(attributes(&get, "/healthz"), ("get", &["healthz", "proxy"][..]));
        assert_eq!(attributes(&get, "/containerLogs/ns/p/c"), ("get", &["proxy"][..]));
        // A WebSocket exec opens with GET and still needs create.
        assert_eq!(attributes(&get, "/exec/ns/p/c"), ("create", &["proxy"][..]));
        assert_eq!(
            attributes(&http::Method::POST, "/portForward/ns/p"),
            ("create", &["proxy"][..])
        );
        assert_eq!(attributes(&get, "/attach/ns/p/c"), ("create", &["proxy"][..]));
    }

    #[test]
    fn a_certificate_names_its_caller() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, "jane");
        params.distinguished_name.push(rcgen::DnType::OrganizationName, "devs");
        let cert = params.self_signed(&key).unwrap();
        let caller = Caller::from_certificate(cert.der()).unwrap();
        assert_eq!(caller.user, "jane");
        assert_eq!(caller.groups, ["devs", "system:authenticated"]);
    }
}
