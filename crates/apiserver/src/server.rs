//! Starting the API server: store, certificates, kubeconfig, HTTPS listener, and the
//! in-process client other components use.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use http::HeaderMap;
use serde_json::json;
use skiff_store::Store;

use crate::allocator::ServiceRanges;
use crate::authz::{self, Authorizer};
use crate::encryption::{self, Encryption};
use crate::filters::{Filters, InProcess, Limits};
use crate::pki::{self, Pki};
use crate::serviceaccount::{self, TokenError, TokenSigner};
use crate::serving::{Serving, ServingOptions};
use crate::tls::{self, Identity, TokenAuth};

/// Shared state of every request.
pub struct ApiState {
    /// The store: only the API server reads and writes it (the field is private to this crate,
    /// and no other crate depends on skiff-store).
    pub(crate) store: Arc<dyn Store>,
    pub tokens: TokenAuth,
    pub pki: Pki,
    /// Signs service account tokens (TokenRequest) and authenticates them.
    pub service_accounts: TokenSigner,
    /// Where Services' ClusterIPs and NodePorts come from.
    pub service_ranges: ServiceRanges,
    /// The authorizer chain and its RBAC snapshot.
    pub authz: Authorizer,
    /// The audit policy and log.
    pub audit: crate::audit::Auditor,
    /// Encryption at rest of Secrets (`skiff secrets-encrypt`); `store` already encrypts.
    pub encryption: Option<Arc<Encryption>>,
    /// Upstream's request filters: deadlines, max in flight, the requests shutdown waits for.
    pub filters: Filters,
    /// The Mutating and ValidatingWebhookConfigurations, kept current by a watch.
    pub webhooks: crate::webhook::Webhooks,
    /// The PodSecurity admission plugin's defaults and exemptions.
    pub pod_security: crate::podsecurity::PodSecurity,
    /// The control-plane parts this process runs, as `componentstatuses` reports them.
    pub components: crate::componentstatus::LocalComponents,
}

impl ApiState {
    /// The state over `store`, with the service account signer made from the PKI's key.
    pub fn new(store: Arc<dyn Store>, tokens: TokenAuth, pki: Pki) -> anyhow::Result<ApiState> {
        let service_accounts = TokenSigner::from_pem(&pki.service_account_key_pem, serviceaccount::DEFAULT_ISSUER)?;
        crate::metrics::init();
        Ok(ApiState {
            store: crate::metrics::StoreMetrics::wrap(store),
            tokens,
            pki,
            service_accounts,
            service_ranges: ServiceRanges::default(),
            authz: Authorizer::default(),
            audit: crate::audit::Auditor::disabled(),
            encryption: None,
            filters: Filters::default(),
            webhooks: Default::default(),
            pod_security: Default::default(),
            components: Default::default(),
        })
    }

    /// A state over a memory store with fresh certificates in `dir`, and a bearer token of
    /// `system:masters` (for the router's tests, which exercise what follows authorization).
    #[cfg(test)]
    pub fn for_tests(dir: &std::path::Path) -> (Arc<ApiState>, String) {
        let token = format!("{}", uuid::Uuid::new_v4().simple());
        let tokens = TokenAuth::parse(&format!("{token},skiff-super-admin,1,\"system:masters\"\n")).expect("tokens");
        let state = Arc::new(
            ApiState::new(
                skiff_store::MemoryStore::new(),
                tokens,
                pki::load_or_create(dir, &[]).expect("pki"),
            )
            .expect("state"),
        );
        (state, token)
    }

    /// `METHOD URI` with `body` through the router as the bearer of `token`: the status and the
    /// JSON answer (for the router's tests).
    #[cfg(test)]
    pub async fn call_for_tests(
        self: &Arc<ApiState>,
        token: &str,
        method: &str,
        uri: &str,
        body: &str,
    ) -> (u16, serde_json::Value) {
        use http_body_util::BodyExt;
        use tower::ServiceExt;
        let req = http::Request::builder()
            .method(method)
            .uri(uri)
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body.to_string()))
            .expect("request");
        let resp = router(self.clone()).oneshot(req).await.expect("response");
        let code = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        (code, serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null))
    }

    /// The caller: a verified client certificate (set by the TLS layer or the in-process
    /// client), else a bearer token: a static one, a bootstrap token (`ID.SECRET`), or a
    /// service account token this server issued. A request without credentials is `system:anonymous`; one whose token is not
    /// accepted is `None` (401), as upstream's authenticator chain. Every authenticated user is
    /// in `system:authenticated`.
    pub async fn authenticate(&self, headers: &HeaderMap, ext: &http::Extensions) -> Option<Identity> {
        let mut id = self.authenticate_credentials(headers, ext).await?;
        if id.user != authz::ANONYMOUS && !id.groups.iter().any(|g| g == authz::AUTHENTICATED) {
            id.groups.push(authz::AUTHENTICATED.to_string());
        }
        Some(id)
    }

    async fn authenticate_credentials(&self, headers: &HeaderMap, ext: &http::Extensions) -> Option<Identity> {
        if let Some(Some(id)) = ext.get::<Option<Identity>>() {
            return Some(id.clone());
        }
        let Some(auth) = headers.get(http::header::AUTHORIZATION) else {
            return Some(Identity::new(authz::ANONYMOUS, &[authz::UNAUTHENTICATED]));
        };
        let token = tls::bearer_token(auth.to_str().ok()?)?;
        if let Some(id) = self.tokens.authenticate(token) {
            return Some(id);
        }
        if let Some(answer) = crate::bootstraptoken::authenticate(&*self.store, token, jiff::Timestamp::now()).await {
            return answer;
        }
        let now = jiff::Timestamp::now().as_second();
        match self.service_accounts.authenticate(&*self.store, token, now).await {
            Ok(id) => Some(id),
            Err(TokenError::NotOurs) => None,
            Err(e) => {
                tracing::info!(error = %e, "refused a service account token");
                None
            }
        }
    }
}

/// How to start the server.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    pub data_dir: PathBuf,
    /// Keep objects in etcd (upstream's `--etcd-*` flags) instead of SQLite in the data dir.
    pub etcd: Option<EtcdConfig>,
    pub port: u16,
    pub bind: IpAddr,
    /// Where to write the admin kubeconfig (default: DATA_DIR/kubeconfig).
    pub kubeconfig: Option<PathBuf>,
    /// Extra names for the serving certificate.
    pub hostnames: Vec<String>,
    /// `--service-cluster-ip-range` and `--service-node-port-range`.
    pub service_ranges: ServiceRanges,
    /// Where nodes reach the API server (the `kubernetes` Service's endpoint); 127.0.0.1 if unset.
    pub advertise_address: Option<IpAddr>,
    /// The audit policy and log; `log_path` unset means DATA_DIR/audit/audit.log.
    pub audit: crate::audit::AuditOptions,
    /// `--encryption-provider-config`: upstream's EncryptionConfiguration for Secrets. Without
    /// it the server generates one under the data dir at first start.
    pub encryption_provider_config: Option<PathBuf>,
    /// `--admission-control-config-file`: upstream's AdmissionConfiguration (the PodSecurity
    /// plugin's defaults and exemptions).
    pub admission_control_config_file: Option<PathBuf>,
    /// Whether the default `local-path` StorageClass is created at start when absent (off with
    /// `--disable-local-storage`).
    pub local_storage: bool,
    /// `--request-timeout`, `--max-requests-inflight`, `--max-mutating-requests-inflight`.
    pub limits: Limits,
    /// Connections: how many, how long headers and idleness may take, header sizes.
    pub serving: ServingOptions,
    /// `--etcd-compaction-interval`: how often history is compacted (zero: never).
    pub compaction_interval: Duration,
    /// `--endpoint-reconciler-type`, `--master-endpoint-reconcile-ttl`: how the `kubernetes`
    /// Service's endpoints are kept.
    pub endpoint_reconciler: crate::reconcilers::ReconcilerOptions,
}

impl ServerOptions {
    pub fn new(data_dir: PathBuf, port: u16) -> Self {
        ServerOptions {
            data_dir,
            etcd: None,
            port,
            bind: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            kubeconfig: None,
            hostnames: Vec::new(),
            service_ranges: ServiceRanges::default(),
            advertise_address: None,
            audit: crate::audit::AuditOptions {
                policy_file: None,
                log_path: None,
                max_age_days: 0,
                max_backups: 5,
                max_size_mb: 100,
            },
            encryption_provider_config: None,
            admission_control_config_file: None,
            local_storage: true,
            limits: Limits::default(),
            serving: ServingOptions::default(),
            compaction_interval: DEFAULT_COMPACTION_INTERVAL,
            endpoint_reconciler: Default::default(),
        }
    }
}

/// A started server.
pub struct Running {
    pub state: Arc<ApiState>,
    pub addr: SocketAddr,
    pub kubeconfig: PathBuf,
    /// The `system:masters` kubeconfig (mode 0600).
    pub super_admin_kubeconfig: PathBuf,
    pub url: String,
    /// The HTTPS listener and its connections, for shutdown.
    pub serving: Serving,
    /// Where other machines reach the API server (the advertised address).
    pub join_url: String,
    /// The join token (`DATA_DIR/server/token`) for `skiff agent --token`.
    pub join_token: skiff_api::bootstraptoken::JoinToken,
    /// Keeps the `kubernetes` Service's endpoints; removes this server from them at shutdown.
    pub endpoints: Arc<crate::reconcilers::EndpointReconciler>,
}

impl Running {
    /// Shutdown, first step: the listener is closed and every connection is asked to close once
    /// its requests are answered (HTTP/2 GOAWAY; HTTP/1.1 closes after the current response).
    pub fn stop_accepting(&self) {
        self.serving.stop_accepting();
    }

    /// Waits until no non-long-running request (HTTPS or in-process) is being handled, or
    /// `deadline`; whether they all finished. Their writes are committed before they answer.
    pub async fn drain(&self, deadline: tokio::time::Instant) -> bool {
        self.state.filters.drained(deadline).await
    }

    /// Shutdown: this server leaves the `kubernetes` Service's endpoints (upstream's
    /// `RemoveEndpoints`; with the `lease` reconciler its identity Lease is deleted), at once
    /// rather than after its TTL.
    pub async fn remove_endpoints(&self) {
        if let Err(e) = self.endpoints.remove().await {
            tracing::warn!(
                error = format!("{e:#}"),
                "removing this server from the kubernetes Service's endpoints"
            );
        }
    }

    /// Shutdown, last step: every connection still open (watches, streams) is closed.
    pub fn close_connections(&self) {
        self.serving.close();
    }
}

/// The namespaces every cluster starts with.
const INITIAL_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

pub fn router(state: Arc<ApiState>) -> Router {
    Router::new().fallback(crate::handlers::handle).with_state(state)
}

/// Open the store, make sure certificates and initial namespaces exist, and serve HTTPS.
/// Where the objects live when they are in etcd.
#[derive(Clone, Debug)]
pub struct EtcdConfig {
    pub endpoints: Vec<String>,
    pub prefix: String,
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

pub async fn start(opts: ServerOptions) -> anyhow::Result<Running> {
    std::fs::create_dir_all(&opts.data_dir)
        .with_context(|| format!("creating data dir {}", opts.data_dir.display()))?;
    if let Some(etcd) = &opts.etcd {
        let store: Arc<dyn Store> = skiff_store::EtcdStore::open(skiff_store::EtcdOptions {
            endpoints: etcd.endpoints.clone(),
            prefix: etcd.prefix.clone(),
            ca_file: etcd.ca_file.clone(),
            cert_file: etcd.cert_file.clone(),
            key_file: etcd.key_file.clone(),
            // etcd's compactor coordinates the replicas through compact_rev_key; the server's
            // own compactor is for a store only this process writes.
            compaction_interval: opts.compaction_interval,
            ..Default::default()
        })
        .await?;
        return start_with_store(
            ServerOptions {
                compaction_interval: Duration::ZERO,
                ..opts
            },
            store,
        )
        .await;
    }
    let store_path = opts.data_dir.join("state.db");
    let store: Arc<dyn Store> = skiff_store::sqlite::SqliteStore::open(&store_path)
        .with_context(|| format!("opening store {}", store_path.display()))?;
    start_with_store(opts, store).await
}

/// Serve over `store`, whose Secrets are encrypted at rest as the encryption configuration says.
pub async fn start_with_store(opts: ServerOptions, store: Arc<dyn Store>) -> anyhow::Result<Running> {
    // Other API servers may share the store (etcd): they must agree on the CA, the keys and
    // what start-up writes.
    let shared = opts.etcd.is_some();
    // An invalid configuration stops the start with upstream's error.
    let loaded = encryption::load(&opts.data_dir, opts.encryption_provider_config.as_deref())?;
    let generated_now = loaded.generated_now;
    let (encryption, store) = Encryption::wrap(loaded, store);
    let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    if let Ok(h) = hostname() {
        names.push(h);
    }
    names.extend(opts.hostnames.iter().cloned());
    // In-cluster clients reach the API server as the `kubernetes` Service and verify it.
    let advertise = opts.advertise_address.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    names.push(opts.service_ranges.nth(1).to_string());
    names.push(advertise.to_string());
    if !opts.bind.is_unspecified() {
        names.push(opts.bind.to_string());
    }
    for name in [
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ] {
        names.push(name.to_string());
    }
    let pki = pki::load_or_create(&opts.data_dir, &names).context("preparing certificates")?;
    let tokens = TokenAuth::load_or_create(&opts.data_dir).context("preparing tokens")?;
    let tls_config = tls::server_config(&pki).context("configuring TLS")?;
    let mut state = ApiState::new(store, tokens, pki).context("preparing the service account token signer")?;
    state.service_ranges = opts.service_ranges;
    let mut audit = opts.audit.clone();
    if audit.log_path.is_none() {
        audit.log_path = Some(opts.data_dir.join("audit").join("audit.log"));
    }
    state.audit = crate::audit::Auditor::start(&audit).context("starting the audit log")?;
    state.encryption = Some(encryption.clone());
    state.filters = Filters::new(&opts.limits);
    if let Some(file) = &opts.admission_control_config_file {
        state.pod_security = crate::podsecurity::PodSecurity::from_admission_config(file)
            .context("reading --admission-control-config-file")?;
    }
    let state = Arc::new(state);
    if shared {
        crate::join::check_cluster_ca(&state, &opts.data_dir).await?;
        encryption.check_shared(generated_now, &opts.data_dir).await?;
    }
    encryption
        .start(generated_now)
        .await
        .context("encrypting the Secrets stored before encryption at rest was on")?;
    ensure_namespaces(&state).await.context("creating initial namespaces")?;
    if opts.local_storage {
        ensure_local_storage_class(&state)
            .await
            .context("creating the local-path StorageClass")?;
    }
    crate::bootstrap::reconcile(&state)
        .await
        .context("reconciling the bootstrap RBAC policy")?;
    crate::customresourcedefinitions::load(&state)
        .await
        .context("serving the stored CustomResourceDefinitions")?;
    crate::customresourcedefinitions::spawn(state.clone());
    let registration = crate::autoregister::start(&state)
        .await
        .context("registering the server's APIServices")?;
    crate::autoregister::spawn(state.clone(), registration);
    crate::available_controller::sync(&*state.store)
        .await
        .context("checking the APIServices' availability")?;
    crate::available_controller::spawn(state.clone());
    crate::flowcontrol_ensurer::ensure(&*state.store)
        .await
        .context("creating the flow control configuration")?;
    crate::flowcontrol_ensurer::spawn(state.clone());
    crate::apf_controller::sync(&*state.store)
        .await
        .context("checking the flow schemas' priority levels")?;
    crate::apf_controller::spawn(state.clone());
    crate::webhook::load(&state)
        .await
        .context("reading the webhook configurations")?;
    crate::webhook::spawn(state.clone());
    crate::authz::spawn_sync(state.clone());

    let listener = tokio::net::TcpListener::bind(SocketAddr::new(opts.bind, opts.port))
        .await
        .with_context(|| format!("binding {}", SocketAddr::new(opts.bind, opts.port)))?;
    let addr = listener.local_addr().context("reading the bound address")?;
    crate::kubernetesservice::reconcile_all(&state, addr.port())
        .await
        .context("reconciling the cluster's own Services")?;
    let kind = opts.endpoint_reconciler.kind.unwrap_or(if shared {
        crate::reconcilers::ReconcilerType::Lease
    } else {
        crate::reconcilers::ReconcilerType::MasterCount
    });
    let endpoints = crate::reconcilers::EndpointReconciler::new(
        state.clone(),
        kind,
        SocketAddr::new(advertise, addr.port()),
        &hostname().unwrap_or_default(),
        &opts.endpoint_reconciler,
    );
    endpoints
        .reconcile()
        .await
        .context("reconciling the kubernetes Service's endpoints")?;
    // Clients on this machine reach the listener where it is bound.
    let local = if opts.bind.is_unspecified() {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        opts.bind
    };
    let url = format!("https://{}", SocketAddr::new(local, addr.port()));
    let kubeconfig = opts
        .kubeconfig
        .clone()
        .unwrap_or_else(|| opts.data_dir.join("kubeconfig"));
    state
        .pki
        .write_kubeconfig(&kubeconfig, &url, &state.pki.admin_cert_pem, &state.pki.admin_key_pem)
        .context("writing kubeconfig")?;
    // The break-glass kubeconfig: `system:masters`, which no authorizer is asked about.
    let super_admin_kubeconfig = opts.data_dir.join("super-admin.kubeconfig");
    state
        .pki
        .write_kubeconfig(
            &super_admin_kubeconfig,
            &url,
            &state.pki.super_admin_cert_pem,
            &state.pki.super_admin_key_pem,
        )
        .context("writing the super-admin kubeconfig")?;
    let join_url = format!("https://{}", SocketAddr::new(advertise, addr.port()));
    crate::join::ensure_cluster_info(&state, &join_url, shared)
        .await
        .context("publishing kube-public/cluster-info")?;
    let join_token = crate::join::ensure_join_token(&state, &opts.data_dir, shared)
        .await
        .context("preparing the join token")?;
    let serving = Serving::start(listener, tls_config, router(state.clone()), &opts.serving);
    if !opts.compaction_interval.is_zero() {
        tokio::spawn(compactor(state.store.clone(), opts.compaction_interval));
    }
    tokio::spawn(crate::metrics::storage_objects_loop(state.store.clone()));
    tokio::spawn(endpoints.clone().run());
    // The OpenAPI documents are built on first use: an idle server does not hold them.
    Ok(Running {
        state,
        addr,
        kubeconfig,
        super_admin_kubeconfig,
        url,
        serving,
        join_url,
        join_token,
        endpoints,
    })
}

fn hostname() -> anyhow::Result<String> {
    let h = std::fs::read_to_string("/proc/sys/kernel/hostname").context("reading host name")?;
    Ok(h.trim().to_string())
}

async fn ensure_namespaces(state: &ApiState) -> anyhow::Result<()> {
    let ns = skiff_api::registry::lookup("", "v1", "namespaces").context("namespaces resource")?;
    for name in INITIAL_NAMESPACES {
        let key = crate::objects::key(ns, "", name);
        if state.store.get(&key).await?.is_some() {
            continue;
        }
        let obj = json!({
            "kind": "Namespace",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "uid": uuid::Uuid::new_v4().to_string(),
                "creationTimestamp": crate::objects::now_rfc3339(),
                "labels": {"kubernetes.io/metadata.name": name},
            },
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        });
        match state.store.create(&key, crate::objects::encode_for_store(&obj)).await {
            Ok(_) | Err(skiff_store::StoreError::AlreadyExists(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    // The system priority classes upstream's API server creates.
    let pcs = skiff_api::registry::lookup("scheduling.k8s.io", "v1", "priorityclasses").context("priorityclasses")?;
    for (name, value, desc) in [
        (
            "system-node-critical",
            2_000_001_000i64,
            "Used for system critical pods that must not be moved from their current node.",
        ),
        (
            "system-cluster-critical",
            2_000_000_000i64,
            "Used for system critical pods that must run in the cluster, but can be moved to another node if necessary.",
        ),
    ] {
        let key = crate::objects::key(pcs, "", name);
        if state.store.get(&key).await?.is_some() {
            continue;
        }
        let obj = json!({
            "kind": "PriorityClass",
            "apiVersion": "scheduling.k8s.io/v1",
            "metadata": {
                "name": name,
                "uid": uuid::Uuid::new_v4().to_string(),
                "creationTimestamp": crate::objects::now_rfc3339(),
            },
            "value": value,
            "globalDefault": false,
            "description": desc,
            "preemptionPolicy": "PreemptLowerPriority",
        });
        match state.store.create(&key, crate::objects::encode_for_store(&obj)).await {
            Ok(_) | Err(skiff_store::StoreError::AlreadyExists(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The default StorageClass, as k3s ships its `local-path`: volumes are directories on the node
/// the first pod using them is scheduled to, made by that node's agent (its `local_path`
/// provisioner), deleted with their claims, and may grow.
pub const LOCAL_PATH_CLASS: &str = "local-path";

/// Creates the `local-path` StorageClass unless one of that name exists: an administrator's edits
/// of it (or a class of that name of their own) are kept.
async fn ensure_local_storage_class(state: &ApiState) -> anyhow::Result<()> {
    let classes = skiff_api::registry::lookup("storage.k8s.io", "v1", "storageclasses").context("storageclasses")?;
    let key = crate::objects::key(classes, "", LOCAL_PATH_CLASS);
    if state.store.get(&key).await?.is_some() {
        return Ok(());
    }
    let obj = json!({
        "kind": "StorageClass",
        "apiVersion": "storage.k8s.io/v1",
        "metadata": {
            "name": LOCAL_PATH_CLASS,
            "uid": uuid::Uuid::new_v4().to_string(),
            "creationTimestamp": crate::objects::now_rfc3339(),
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        "provisioner": skiff_api::volume::LOCAL_PATH_PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer",
        "allowVolumeExpansion": true,
    });
    match state.store.create(&key, crate::objects::encode_for_store(&obj)).await {
        Ok(_) | Err(skiff_store::StoreError::AlreadyExists(_)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Upstream's `--etcd-compaction-interval` default.
pub const DEFAULT_COMPACTION_INTERVAL: Duration = Duration::from_secs(5 * 60);

/// Compacts history as upstream's API server asks etcd to (`storage/etcd3/compact.go`): at each
/// tick, up to the revision seen at the tick before, so at least one interval of history stays
/// for watches to resume from and paginated lists to finish, and nothing older is kept (neither
/// rows on disk nor events in memory).
async fn compactor(store: Arc<dyn Store>, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick completes at once: it only records where the next compaction goes.
    let mut previous = 0;
    loop {
        tick.tick().await;
        if previous > 0
            && let Err(e) = store.compact(previous).await
        {
            tracing::warn!(error = %e, revision = previous, "compaction failed");
        }
        match store.current_revision().await {
            Ok(r) => previous = r,
            Err(e) => tracing::warn!(error = %e, "reading the current revision for compaction"),
        }
    }
}

/// A kube client that calls this server in-process (no sockets) as a member of
/// `system:masters`, for start-up work and tests. Skiff's own parts use [`client_as`] with
/// their upstream identities.
pub fn client(state: Arc<ApiState>) -> kube::Client {
    client_as(state, Identity::new("system:skiff", &[authz::MASTERS]))
}

/// The in-process service [`client_as`] and [`controller_client`] wrap: requests go to the router
/// with their caller's identity attached, no sockets between. A caller that must gate them (the
/// leader election fence) wraps this service before making its client.
pub trait InProcessService:
    tower::Service<
        http::Request<kube::client::Body>,
        Response = http::Response<axum::body::Body>,
        Error = std::convert::Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> InProcessService for S where
    S: tower::Service<
            http::Request<kube::client::Body>,
            Response = http::Response<axum::body::Body>,
            Error = std::convert::Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + Sync
        + 'static
{
}

/// A kube client that calls this server in-process (no sockets) as `identity`.
pub fn client_as(state: Arc<ApiState>, identity: Identity) -> kube::Client {
    kube::Client::new(service_as(state, identity), "default")
}

/// The service under [`client_as`].
pub fn service_as(state: Arc<ApiState>, identity: Identity) -> impl InProcessService {
    let router = router(state);
    tower::ServiceBuilder::new()
        .map_request(move |mut req: http::Request<kube::client::Body>| {
            req.extensions_mut().insert(Some(identity.clone()));
            req.extensions_mut().insert(InProcess);
            req.map(axum::body::Body::new)
        })
        .service(router)
}

/// A kube client for one controller, calling in-process as upstream's controller manager does
/// with `--use-service-account-credentials`: its reads (upstream's shared informers and the
/// listers on them) as `system:kube-controller-manager`, its writes as the controller's own
/// service account `kube-system/NAME`, whose role the bootstrap policy binds.
pub fn controller_client(state: Arc<ApiState>, name: &str) -> kube::Client {
    kube::Client::new(controller_service(state, name), "default")
}

/// The service under [`controller_client`].
pub fn controller_service(state: Arc<ApiState>, name: &str) -> impl InProcessService {
    let informers = identities::controller_manager();
    let own = identities::controller(name);
    let router = router(state);
    tower::ServiceBuilder::new()
        .map_request(move |mut req: http::Request<kube::client::Body>| {
            // get, list and watch are exactly the GETs.
            let identity = if matches!(*req.method(), http::Method::GET | http::Method::HEAD) {
                informers.clone()
            } else {
                own.clone()
            };
            req.extensions_mut().insert(Some(identity));
            req.extensions_mut().insert(InProcess);
            req.map(axum::body::Body::new)
        })
        .service(router)
}

/// Upstream's identities of the control plane's parts.
pub mod identities {
    use crate::serviceaccount;
    use crate::tls::Identity;

    /// The scheduler: `system:kube-scheduler`.
    pub fn scheduler() -> Identity {
        Identity::new("system:kube-scheduler", &[])
    }

    /// A controller: the service account `kube-system/NAME`, as upstream's controller manager
    /// with `--use-service-account-credentials`.
    pub fn controller(name: &str) -> Identity {
        Identity {
            user: serviceaccount::user_name("kube-system", name),
            groups: serviceaccount::groups("kube-system"),
            ..Default::default()
        }
    }

    /// The controller manager itself (its shared informers list and watch everything).
    pub fn controller_manager() -> Identity {
        Identity::new("system:kube-controller-manager", &[])
    }

    /// A node agent: `system:node:NAME` in `system:nodes`.
    pub fn node(name: &str) -> Identity {
        Identity::new(&format!("system:node:{name}"), &["system:nodes"])
    }

    /// A part of node `node`'s agent: its service account `kube-system/ACCOUNT`, with the node
    /// named as a token bound to the Node names it (what an agent elsewhere is issued).
    pub fn node_part(node: &str, account: &str) -> Identity {
        let mut id = controller(account);
        id.extra
            .insert("authentication.kubernetes.io/node-name".into(), vec![node.to_string()]);
        id
    }

    /// The simulator of many nodes (as kwok, which runs as one client for all its nodes).
    pub fn node_simulator() -> Identity {
        Identity::new("skiff:node-simulator", &[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn wait_compacted(store: &Arc<dyn Store>, revision: i64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while store.compacted_revision().await.unwrap() < revision {
            assert!(tokio::time::Instant::now() < deadline, "never compacted to {revision}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Each compaction goes up to the revision of the tick before: history one interval old
    /// stays, what is older goes.
    #[tokio::test]
    async fn the_compactor_keeps_one_interval_of_history() {
        let store: Arc<dyn Store> = skiff_store::MemoryStore::new();
        for i in 0..3 {
            store.create(&format!("/a/{i}"), b"x".to_vec()).await.unwrap();
        }
        tokio::spawn(compactor(store.clone(), Duration::from_secs(1)));
        // The first tick, at once, only records revision 3.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(store.compacted_revision().await.unwrap(), 0);
        store.create("/a/3", b"x".to_vec()).await.unwrap();
        wait_compacted(&store, 3).await;
        assert_eq!(
            store.compacted_revision().await.unwrap(),
            3,
            "revision 4 is less than an interval old"
        );
        assert!(
            store.watch("/a/", 3).await.is_ok(),
            "the last interval's events are kept"
        );
        wait_compacted(&store, 4).await;
        assert!(store.watch("/a/", 3).await.is_err());
    }
}
