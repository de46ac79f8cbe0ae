//! Pod volumes on the node: emptyDir (Memory as a tmpfs Docker volume), hostPath, secret, configMap,
//! downwardAPI and projected (secret, configMap, downwardAPI, serviceAccountToken), persistentVolumeClaim
//! (the bound PersistentVolume's hostPath or local path), plus the agent-managed `/etc/hosts`. Everything
//! but host paths lives under `DATA_DIR/pods/UID/`; host paths, and so a PersistentVolume's data, are never
//! removed by the agent.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use bollard::Docker;
use bollard::models::VolumeCreateRequest;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    Container, DownwardAPIVolumeFile, KeyToPath, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeClaimVolumeSource, Pod, ServiceAccount, Volume,
};
use kube::Api;
use kube::api::PostParams;

use crate::docker::{LABEL_NODE, LABEL_POD_UID};
use crate::env::{EnvContext, ObjectCache, field_ref_value, resource_field_value};

/// Where a pod volume lives on the host.
#[derive(Clone, Debug, PartialEq)]
pub enum HostVolume {
    /// A host directory or file bound into containers; `read_only` is forced for projected kinds.
    Path { path: PathBuf, read_only: bool },
    /// A named Docker volume (tmpfs-backed emptyDir).
    Docker(String),
}

/// A volume that could not be set up (reported as `FailedMount`), in the words of upstream's kubelet for
/// the step that failed.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// The volume plugin's SetUp failed (`volume` is the PersistentVolume's name for a claim).
    #[error("MountVolume.SetUp failed for volume \"{volume}\" : {message}")]
    SetUp { volume: String, message: String },
    /// The plugin could not even make a mounter (a local volume whose path is missing).
    #[error("MountVolume.NewMounter initialization failed for volume \"{volume}\" : {message}")]
    NewMounter { volume: String, message: String },
    /// The pod's volume could not be resolved to something to mount (a claim that is missing or not
    /// bound), as the volume manager reports it when the pod's volumes are not ready.
    #[error(
        "Unable to attach or mount volumes: unmounted volumes=[{volume}], unattached volumes=[], failed to process \
         volumes=[{volume}]: {message}"
    )]
    Process { volume: String, message: String },
}

pub fn pod_dir(data_dir: &Path, uid: &str) -> PathBuf {
    data_dir.join("pods").join(uid)
}

/// The Docker volume name of a Memory emptyDir.
pub fn tmpfs_volume_name(uid: &str, volume: &str) -> String {
    format!("skiff-{uid}-{volume}")
}

/// Whether this node has a plugin for the volume's source: emptyDir, hostPath, secret,
/// configMap, downwardAPI, projected and persistentVolumeClaim.
pub fn is_supported(volume: &Volume) -> bool {
    volume.empty_dir.is_some()
        || volume.host_path.is_some()
        || volume.secret.is_some()
        || volume.config_map.is_some()
        || volume.downward_api.is_some()
        || volume.projected.is_some()
        || volume.persistent_volume_claim.is_some()
}

/// The volume plugin manager's error for a volume no plugin serves.
fn no_volume_plugin(name: &str) -> String {
    format!("failed to get Plugin from volumeSpec for volume {name:?} err=no volume plugin matched")
}

/// Sets up (or refreshes) every volume of a pod.
pub async fn setup(
    pod: &Pod,
    data_dir: &Path,
    client: &kube::Client,
    docker: &Docker,
    objects: &mut ObjectCache,
    tokens: &mut TokenCache,
    ctx: &EnvContext<'_>,
) -> anyhow::Result<Result<HashMap<String, HostVolume>, MountError>> {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let base = pod_dir(data_dir, &uid).join("volumes");
    let mut out = HashMap::new();
    for volume in pod.spec.as_ref().and_then(|s| s.volumes.as_ref()).into_iter().flatten() {
        let set_up = match &volume.persistent_volume_claim {
            Some(source) => persistent_volume_claim(pod, volume, source, client).await?,
            // As the kubelet: a volume no plugin of this node serves is never mounted (the pod
            // waits in ContainerCreating with FailedMount), never replaced by an empty directory.
            None if !is_supported(volume) => Err(MountError::Process {
                volume: volume.name.clone(),
                message: no_volume_plugin(&volume.name),
            }),
            None => setup_one(pod, volume, &base, docker, objects, tokens, ctx)
                .await?
                .map_err(|message| MountError::SetUp {
                    volume: volume.name.clone(),
                    message,
                }),
        };
        match set_up {
            Ok(v) => {
                out.insert(volume.name.clone(), v);
            }
            Err(e) => return Ok(Err(e)),
        }
    }
    Ok(Ok(out))
}

/// A persistentVolumeClaim volume, as upstream's volume manager resolves it (`getPVCExtractPV`,
/// `getPVSpec`): the claim must exist, not be deleted, be Bound to a volume whose claimRef is this
/// claim; then the volume's hostPath or local path is bind-mounted, read-only when the claim source says
/// so. The claim is looked up again at every refresh, so a pod waiting for its claim starts once bound.
async fn persistent_volume_claim(
    pod: &Pod,
    volume: &Volume,
    source: &PersistentVolumeClaimVolumeSource,
    client: &kube::Client,
) -> anyhow::Result<Result<HostVolume, MountError>> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let processing = |message: String| MountError::Process {
        volume: volume.name.clone(),
        message: format!("error processing PVC {namespace}/{}: {message}", source.claim_name),
    };
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let claim = match claims.get(&source.claim_name).await {
        Ok(c) => c,
        Err(kube::Error::Api(s)) => {
            return Ok(Err(processing(format!(
                "failed to fetch PVC from API server: {}",
                s.message
            ))));
        }
        Err(e) => return Err(e).context("reading a PersistentVolumeClaim"),
    };
    let pv_name = match bound_volume_name(&claim) {
        Ok(name) => name.to_string(),
        Err(e) => return Ok(Err(processing(e))),
    };
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let pv = match volumes.get(&pv_name).await {
        Ok(pv) => pv,
        Err(kube::Error::Api(s)) => {
            return Ok(Err(processing(format!(
                "failed to fetch PV {pv_name} from API server: {}",
                s.message
            ))));
        }
        Err(e) => return Err(e).context("reading a PersistentVolume"),
    };
    if let Err(e) = check_claim_ref(&pv, claim.metadata.uid.as_deref().unwrap_or_default()) {
        return Ok(Err(processing(e)));
    }
    let mounted = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
        .flat_map(|c| c.volume_mounts.iter().flatten())
        .any(|m| m.name == volume.name);
    let mode = pv
        .spec
        .as_ref()
        .and_then(|s| s.volume_mode.as_deref())
        .unwrap_or("Filesystem");
    if mounted && mode != "Filesystem" {
        return Ok(Err(MountError::Process {
            volume: volume.name.clone(),
            message: format!(
                "volume {} has volumeMode {mode}, but is specified in volumeMounts",
                volume.name
            ),
        }));
    }
    persistent_volume_path(&pv, source.read_only == Some(true), &volume.name).await
}

/// The volume a claim is bound to, or why the pod cannot use the claim yet (upstream's `getPVCExtractPV`).
pub fn bound_volume_name(claim: &PersistentVolumeClaim) -> Result<&str, String> {
    if claim.metadata.deletion_timestamp.is_some() {
        return Err("PVC is being deleted".into());
    }
    if claim.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
        return Err("PVC is not bound".into());
    }
    match claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()) {
        Some(name) if !name.is_empty() => Ok(name),
        _ => Err("PVC has empty pvc.Spec.VolumeName".into()),
    }
}

/// That the volume is bound to the claim with this uid (upstream's `getPVSpec`).
pub fn check_claim_ref(pv: &PersistentVolume, claim_uid: &str) -> Result<(), String> {
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    let Some(claim_ref) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return Err(format!(
            "found PV object {name} but it has a nil pv.Spec.ClaimRef indicating it is not yet bound to the claim"
        ));
    };
    let uid = claim_ref.uid.as_deref().unwrap_or_default();
    if uid != claim_uid {
        return Err(format!(
            "found PV object {name} but its pv.Spec.ClaimRef.UID {uid} does not point to claim.UID {claim_uid}"
        ));
    }
    Ok(())
}

/// Where a bound PersistentVolume lives on this host: its hostPath (checked, or created, as an inline
/// hostPath volume of the same type; a path of no type is created as a directory when missing) or its
/// local path (which must exist). Errors name the PersistentVolume, as upstream's do.
pub async fn persistent_volume_path(
    pv: &PersistentVolume,
    read_only: bool,
    pod_volume: &str,
) -> anyhow::Result<Result<HostVolume, MountError>> {
    let name = pv.metadata.name.clone().unwrap_or_default();
    let spec = pv.spec.clone().unwrap_or_default();
    if let Some(host) = &spec.host_path {
        let kind = host
            .type_
            .as_deref()
            .filter(|k| !k.is_empty())
            .unwrap_or("DirectoryOrCreate");
        return Ok(match host_path(&host.path, kind).await? {
            Ok(path) => Ok(HostVolume::Path { path, read_only }),
            Err(message) => Err(MountError::SetUp { volume: name, message }),
        });
    }
    if let Some(local) = &spec.local {
        let path = PathBuf::from(&local.path);
        if tokio::fs::metadata(&path).await.is_err() {
            return Ok(Err(MountError::NewMounter {
                volume: name,
                message: format!("path {:?} does not exist", local.path),
            }));
        }
        return Ok(Ok(HostVolume::Path { path, read_only }));
    }
    Ok(Err(MountError::Process {
        volume: pod_volume.to_string(),
        message: format!("failed to get Plugin from volumeSpec for volume {name:?} err=no volume plugin matched"),
    }))
}

/// What a path on the host is, by upstream's `GetFileType` names (symlinks followed).
fn file_type(meta: &std::fs::Metadata) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        Some("Directory")
    } else if t.is_file() {
        Some("File")
    } else if t.is_socket() {
        Some("Socket")
    } else if t.is_char_device() {
        Some("CharDevice")
    } else if t.is_block_device() {
        Some("BlockDevice")
    } else {
        None
    }
}

/// A hostPath checked against its type as upstream's hostPath plugin (`checkType`) does,
/// creating what the `...OrCreate` types ask for (a file's parent directory must exist, as
/// there); the error is the plugin's message. No type (`""`) checks nothing.
async fn host_path(path: &str, kind: &str) -> anyhow::Result<Result<PathBuf, String>> {
    let p = PathBuf::from(path);
    if kind.is_empty() {
        return Ok(Ok(p));
    }
    let (expected, description) = match kind {
        "DirectoryOrCreate" | "Directory" => ("Directory", "directory"),
        "FileOrCreate" | "File" => ("File", "file"),
        "Socket" => ("Socket", "socket file"),
        "CharDevice" => ("CharDevice", "character device"),
        "BlockDevice" => ("BlockDevice", "block device"),
        other => return Ok(Err(format!("{other} is an invalid volume type"))),
    };
    if tokio::fs::metadata(&p).await.is_err() {
        match kind {
            "DirectoryOrCreate" => create_dir(&p, 0o755).await?,
            "FileOrCreate" => {
                let created = tokio::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .mode(0o644)
                    .open(&p)
                    .await;
                if let Err(e) = created {
                    return Ok(Err(format!("open {path}: {}", io_message(&e))));
                }
            }
            _ => {}
        }
    }
    let Ok(meta) = tokio::fs::metadata(&p).await else {
        return Ok(Err(format!("hostPath {path} doesn't exist")));
    };
    Ok(match file_type(&meta) {
        Some(t) if t == expected => Ok(p),
        Some(t) => Err(format!(
            "hostPath type check failed: {path} is not a {description}, it's a {t}"
        )),
        None => Err(format!(
            "hostPath type check failed, {path} is not a {description}, unable to determine its type: only \
             recognise file, directory, socket, block device and character device"
        )),
    })
}

/// An I/O error as Go's `os` package words it (`no such file or directory`).
fn io_message(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(code) => {
            let text = std::io::Error::from_raw_os_error(code).to_string();
            // "No such file or directory (os error 2)" -> "no such file or directory"
            let text = text.split(" (os error").next().unwrap_or(&text).to_string();
            let mut chars = text.chars();
            match chars.next() {
                Some(first) => first.to_lowercase().chain(chars).collect(),
                None => text,
            }
        }
        None => e.to_string(),
    }
}

async fn setup_one(
    pod: &Pod,
    volume: &Volume,
    base: &Path,
    docker: &Docker,
    objects: &mut ObjectCache,
    tokens: &mut TokenCache,
    ctx: &EnvContext<'_>,
) -> anyhow::Result<Result<HostVolume, String>> {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let name = &volume.name;
    if let Some(empty) = &volume.empty_dir {
        if empty.medium.as_deref() == Some("Memory") {
            let vol = tmpfs_volume_name(&uid, name);
            let mut opts = HashMap::from([
                ("type".to_string(), "tmpfs".to_string()),
                ("device".to_string(), "tmpfs".to_string()),
            ]);
            if let Some(size) = empty
                .size_limit
                .as_ref()
                .and_then(|q| crate::quantity::parse_value(&q.0))
            {
                opts.insert("o".to_string(), format!("size={size}"));
            }
            docker
                .create_volume(VolumeCreateRequest {
                    name: Some(vol.clone()),
                    driver: Some("local".into()),
                    driver_opts: Some(opts),
                    labels: Some(HashMap::from([
                        (LABEL_POD_UID.to_string(), uid.clone()),
                        (
                            LABEL_NODE.to_string(),
                            pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default(),
                        ),
                    ])),
                    ..Default::default()
                })
                .await
                .context("creating a tmpfs volume")?;
            return Ok(Ok(HostVolume::Docker(vol)));
        }
        let dir = base.join("kubernetes.io~empty-dir").join(name);
        create_dir(&dir, 0o777).await?;
        return Ok(Ok(HostVolume::Path {
            path: dir,
            read_only: false,
        }));
    }
    if let Some(host) = &volume.host_path {
        let checked = host_path(&host.path, host.type_.as_deref().unwrap_or("")).await?;
        return Ok(checked.map(|path| HostVolume::Path { path, read_only: false }));
    }
    let mut files: BTreeMap<String, (Vec<u8>, u32)> = BTreeMap::new();
    let dir;
    if let Some(secret) = &volume.secret {
        dir = base.join("kubernetes.io~secret").join(name);
        let secret_name = secret.secret_name.clone().unwrap_or_default();
        let mode = secret.default_mode.unwrap_or(0o644) as u32;
        match objects.secret(&secret_name).await? {
            Some(data) => {
                if let Err(e) = project_keys(
                    &data,
                    secret.items.as_deref(),
                    mode,
                    secret.optional == Some(true),
                    &mut files,
                ) {
                    return Ok(Err(format!("{e} in Secret {secret_name}")));
                }
            }
            None if secret.optional == Some(true) => {}
            None => return Ok(Err(format!("secret \"{secret_name}\" not found"))),
        }
    } else if let Some(cm) = &volume.config_map {
        dir = base.join("kubernetes.io~configmap").join(name);
        let mode = cm.default_mode.unwrap_or(0o644) as u32;
        match objects.config_map(&cm.name).await? {
            Some(data) => {
                if let Err(e) = project_keys(&data, cm.items.as_deref(), mode, cm.optional == Some(true), &mut files) {
                    return Ok(Err(format!("{e} in ConfigMap {}", cm.name)));
                }
            }
            None if cm.optional == Some(true) => {}
            None => return Ok(Err(format!("configmap \"{}\" not found", cm.name))),
        }
    } else if let Some(dapi) = &volume.downward_api {
        dir = base.join("kubernetes.io~downward-api").join(name);
        let mode = dapi.default_mode.unwrap_or(0o644) as u32;
        if let Err(e) = project_downward(pod, dapi.items.as_deref().unwrap_or_default(), mode, ctx, &mut files) {
            return Ok(Err(e));
        }
    } else if let Some(projected) = &volume.projected {
        dir = base.join("kubernetes.io~projected").join(name);
        let mode = projected.default_mode.unwrap_or(0o644) as u32;
        for source in projected.sources.iter().flatten() {
            if let Some(secret) = &source.secret {
                let optional = secret.optional == Some(true);
                match objects.secret(&secret.name).await? {
                    Some(data) => {
                        if let Err(e) = project_keys(&data, secret.items.as_deref(), mode, optional, &mut files) {
                            return Ok(Err(format!("{e} in Secret {}", secret.name)));
                        }
                    }
                    None if optional => {}
                    None => return Ok(Err(format!("secret \"{}\" not found", secret.name))),
                }
            }
            if let Some(cm) = &source.config_map {
                let optional = cm.optional == Some(true);
                match objects.config_map(&cm.name).await? {
                    Some(data) => {
                        if let Err(e) = project_keys(&data, cm.items.as_deref(), mode, optional, &mut files) {
                            return Ok(Err(format!("{e} in ConfigMap {}", cm.name)));
                        }
                    }
                    None if optional => {}
                    None => return Ok(Err(format!("configmap \"{}\" not found", cm.name))),
                }
            }
            if let Some(dapi) = &source.downward_api
                && let Err(e) = project_downward(pod, dapi.items.as_deref().unwrap_or_default(), mode, ctx, &mut files)
            {
                return Ok(Err(e));
            }
            if let Some(sat) = &source.service_account_token {
                // As the kubelet: a token that cannot be had fails the volume, and the pod waits.
                let token = match tokens.get(pod, sat.audience.clone(), sat.expiration_seconds).await {
                    Ok(t) => t,
                    Err(TokenError::Api(s)) => return Ok(Err(format!("failed to fetch token: {}", s.message))),
                    Err(TokenError::Expired(key, s)) => {
                        return Ok(Err(format!("token {key} expired and refresh failed: {}", s.message)));
                    }
                    Err(TokenError::Other(e)) => return Err(e).context("requesting a service account token"),
                };
                files.insert(sat.path.clone(), (token.into_bytes(), 0o600 & mode | 0o600));
            }
        }
    } else {
        // Volume kinds this node does not implement (nfs, csi, iscsi, ephemeral, image, ...):
        // `setup` answers them before they come here.
        return Ok(Err(no_volume_plugin(name)));
    }
    let target = dir.clone();
    tokio::task::spawn_blocking(move || write_atomic(&target, &files))
        .await
        .context("joining the volume writer")?
        .with_context(|| format!("writing volume {name}"))?;
    Ok(Ok(HostVolume::Path {
        path: dir,
        read_only: true,
    }))
}

async fn create_dir(dir: &Path, mode: u32) -> anyhow::Result<()> {
    tokio::fs::create_dir_all(dir)
        .await
        .with_context(|| format!("creating {}", dir.display()))?;
    tokio::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
        .await
        .with_context(|| format!("setting the mode of {}", dir.display()))
}

fn project_keys(
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
    default_mode: u32,
    optional: bool,
    files: &mut BTreeMap<String, (Vec<u8>, u32)>,
) -> Result<(), String> {
    match items {
        None => {
            for (k, v) in data {
                files.insert(k.clone(), (v.clone(), default_mode));
            }
        }
        Some(items) => {
            for item in items {
                match data.get(&item.key) {
                    Some(v) => {
                        let mode = item.mode.map(|m| m as u32).unwrap_or(default_mode);
                        files.insert(item.path.clone(), (v.clone(), mode));
                    }
                    None if optional => {}
                    None => {
                        return Err(format!("configured to use key {}, but it does not exist", item.key));
                    }
                }
            }
        }
    }
    Ok(())
}

fn project_downward(
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    default_mode: u32,
    ctx: &EnvContext<'_>,
    files: &mut BTreeMap<String, (Vec<u8>, u32)>,
) -> Result<(), String> {
    for item in items {
        let mode = item.mode.map(|m| m as u32).unwrap_or(default_mode);
        let value = if let Some(field) = &item.field_ref {
            field_ref_value(pod, &field.field_path, ctx)
                .ok_or_else(|| format!("unsupported fieldPath: {}", field.field_path))?
        } else if let Some(res) = &item.resource_field_ref {
            let containers = pod.spec.as_ref().map(|s| s.containers.as_slice()).unwrap_or_default();
            let name = res.container_name.as_deref().unwrap_or("");
            let default = Container::default();
            let container = containers.iter().find(|c| c.name == name).unwrap_or(&default);
            resource_field_value(
                container,
                &res.resource,
                res.divisor.as_ref().map(|d| d.0.as_str()),
                ctx,
            )
            .ok_or_else(|| format!("unsupported container resource: {}", res.resource))?
        } else {
            String::new()
        };
        files.insert(item.path.clone(), (value.into_bytes(), mode));
    }
    Ok(())
}

/// Service account tokens held for one pod's projected volumes, renewed as the kubelet's token
/// manager renews them: once 80% of a token's lifetime has passed, or after 24 hours, less a
/// jitter of up to 10 s; not at every refresh of the volumes. A token that cannot be renewed
/// while it is still valid is kept, as upstream keeps it.
pub struct TokenCache {
    client: kube::Client,
    held: HashMap<TokenKey, CachedToken>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct TokenKey {
    service_account: String,
    audiences: Vec<String>,
    expiration_seconds: i64,
}

impl std::fmt::Display for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "\"{}\"/{:?}/{}",
            self.service_account, self.audiences, self.expiration_seconds
        )
    }
}

struct CachedToken {
    token: String,
    refresh_at: Instant,
    expires_at: Instant,
}

/// Why no token could be had.
#[derive(Debug)]
pub enum TokenError {
    /// The API server refused the TokenRequest and no token is held.
    Api(Box<kube::core::Status>),
    /// The API server refused to renew a token that has expired.
    Expired(String, Box<kube::core::Status>),
    Other(kube::Error),
}

/// upstream's maxTTL and maxJitter (pkg/kubelet/token).
const TOKEN_MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);
const TOKEN_MAX_JITTER_MS: u64 = 10_000;
/// The lifetime the kubelet asks for when the volume names none.
const TOKEN_DEFAULT_SECONDS: i64 = 3607;

/// When a token of `lifetime` received at `received` is to be renewed.
fn token_refresh_at(received: Instant, lifetime: Duration, jitter: Duration) -> Instant {
    let renew = (lifetime / 5 * 4).min(TOKEN_MAX_TTL);
    received + renew.saturating_sub(jitter)
}

impl TokenCache {
    /// Tokens requested through `client`.
    pub fn new(client: kube::Client) -> TokenCache {
        TokenCache {
            client,
            held: HashMap::new(),
        }
    }

    /// The pod's token for `audience` and `expiration` (seconds), from the cache while it needs
    /// no renewal.
    pub async fn get(
        &mut self,
        pod: &Pod,
        audience: Option<String>,
        expiration: Option<i64>,
    ) -> Result<String, TokenError> {
        let key = TokenKey {
            service_account: pod_service_account(pod),
            audiences: audience.into_iter().filter(|a| !a.is_empty()).collect(),
            expiration_seconds: expiration.unwrap_or(TOKEN_DEFAULT_SECONDS),
        };
        let now = Instant::now();
        if let Some(t) = self.held.get(&key)
            && now < t.refresh_at
        {
            return Ok(t.token.clone());
        }
        match service_account_token(pod, &self.client, &key).await {
            Ok(token) => {
                let received = Instant::now();
                let lifetime = Duration::from_secs(key.expiration_seconds.max(0) as u64);
                // The jitter keeps a node's pods from renewing at once.
                let jitter = Duration::from_millis(rand::random_range(0..TOKEN_MAX_JITTER_MS));
                self.held.insert(
                    key,
                    CachedToken {
                        token: token.clone(),
                        refresh_at: token_refresh_at(received, lifetime, jitter),
                        expires_at: received + lifetime,
                    },
                );
                Ok(token)
            }
            Err(kube::Error::Api(status)) => match self.held.get(&key) {
                None => Err(TokenError::Api(status)),
                Some(t) if Instant::now() >= t.expires_at => Err(TokenError::Expired(key.to_string(), status)),
                Some(t) => {
                    tracing::warn!(token = %key, error = %status.message, "could not renew a service account token; keeping the one held");
                    Ok(t.token.clone())
                }
            },
            Err(e) => Err(TokenError::Other(e)),
        }
    }
}

fn pod_service_account(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".into())
}

/// A token for the pod's service account, bound to the pod, from the API server's TokenRequest.
async fn service_account_token(pod: &Pod, client: &kube::Client, key: &TokenKey) -> Result<String, kube::Error> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: key.audiences.clone(),
            expiration_seconds: Some(key.expiration_seconds),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
        },
        ..Default::default()
    };
    let response = api
        .create_token_request(&key.service_account, &PostParams::default(), &request)
        .await?;
    Ok(response.status.map(|s| s.token).unwrap_or_default())
}

/// Writes a projected volume as upstream's atomic writer does: the files go into a fresh timestamped
/// directory, `..data` is swapped to point at it, and each top-level name is a symlink through `..data`.
pub fn write_atomic(dir: &Path, files: &BTreeMap<String, (Vec<u8>, u32)>) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let stamp = jiff::Timestamp::now().strftime("..%Y_%m_%d_%H_%M_%S.%f").to_string();
    let fresh = dir.join(&stamp);
    std::fs::create_dir_all(&fresh)?;
    for (rel, (data, mode)) in files {
        let rel = rel.trim_start_matches('/');
        if rel.split('/').any(|c| c == "..") {
            continue;
        }
        let path = fresh.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, data)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(*mode & 0o7777))?;
    }
    std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(0o755))?;
    let tmp_link = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp_link);
    std::os::unix::fs::symlink(&stamp, &tmp_link)?;
    let old = std::fs::read_link(dir.join("..data")).ok();
    std::fs::rename(&tmp_link, dir.join("..data"))?;
    let top: std::collections::BTreeSet<String> = files
        .keys()
        .filter_map(|k| k.trim_start_matches('/').split('/').next().map(str::to_string))
        .collect();
    for name in &top {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(name), &link)?;
        }
    }
    // Drop names that are no longer projected, and the previous generation.
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("..") && !top.contains(&name) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    if let Some(old) = old
        && old != Path::new(&stamp)
    {
        let _ = std::fs::remove_dir_all(dir.join(old));
    }
    Ok(())
}

/// The `/etc/hosts` upstream's kubelet writes for pods not on the host network.
pub fn hosts_file(pod: &Pod, pod_ip: &str) -> String {
    let spec = pod.spec.as_ref();
    let mut out = String::from("# Kubernetes-managed hosts file.\n");
    out.push_str("127.0.0.1\tlocalhost\n");
    out.push_str("::1\tlocalhost ip6-localhost ip6-loopback\n");
    out.push_str("fe00::0\tip6-localnet\n");
    out.push_str("fe00::0\tip6-mcastprefix\n");
    out.push_str("fe00::1\tip6-allnodes\n");
    out.push_str("fe00::2\tip6-allrouters\n");
    let hostname = pod_hostname(pod);
    if !pod_ip.is_empty() {
        match spec.and_then(|s| s.subdomain.as_deref()).filter(|s| !s.is_empty()) {
            Some(sub) => {
                let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
                out.push_str(&format!(
                    "{pod_ip}\t{hostname}.{sub}.{ns}.svc.cluster.local\t{hostname}\n"
                ));
            }
            None => out.push_str(&format!("{pod_ip}\t{hostname}\n")),
        }
    }
    out.push_str(&host_aliases(pod));
    out
}

/// The "Entries added by HostAliases." block (also appended to the host's file for hostNetwork pods).
pub fn host_aliases(pod: &Pod) -> String {
    let aliases = pod.spec.as_ref().and_then(|s| s.host_aliases.as_ref());
    let Some(aliases) = aliases.filter(|a| !a.is_empty()) else {
        return String::new();
    };
    let mut out = String::from("\n# Entries added by HostAliases.\n");
    for alias in aliases {
        let names = alias.hostnames.clone().unwrap_or_default().join("\t");
        out.push_str(&format!("{}\t{}\n", alias.ip, names));
    }
    out
}

/// The pod's hostname: spec.hostname or the pod name, at most 63 characters.
pub fn pod_hostname(pod: &Pod) -> String {
    let name = pod
        .spec
        .as_ref()
        .and_then(|s| s.hostname.clone())
        .filter(|h| !h.is_empty())
        .or_else(|| pod.metadata.name.clone())
        .unwrap_or_default();
    let trimmed: String = name.chars().take(63).collect();
    trimmed.trim_end_matches(['-', '.']).to_string()
}

/// Docker bind strings for a container's volumeMounts. A `subPath` (or a `subPathExpr` expanded
/// with the container's environment `env`) is created and bind-mounted under `pod_dir` by
/// `subpath`, so that no symlink planted in the volume leads out of it; the errors are upstream's
/// kubelet's, which say no more of the host's filesystem than which mount failed (the cause is
/// logged).
pub fn binds(
    container: &Container,
    volumes: &HashMap<String, HostVolume>,
    pod_dir: &Path,
    env: &HashMap<&str, &str>,
) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for (index, mount) in container.volume_mounts.iter().flatten().enumerate() {
        let Some(volume) = volumes.get(&mount.name) else {
            return Err(format!(
                "cannot find volume \"{}\" to mount into container \"{}\"",
                mount.name, container.name
            ));
        };
        let ro = mount.read_only == Some(true);
        let expr = mount.sub_path_expr.as_deref().filter(|s| !s.is_empty());
        let sub = match expr {
            Some(expr) => Some(crate::env::expand_required(expr, env)?),
            None => mount.sub_path.clone().filter(|s| !s.is_empty()),
        };
        let failed = |what: &str, e: anyhow::Error| {
            tracing::warn!(
                container = %container.name, volume_mount = %mount.name, error = format!("{e:#}"),
                "{what} for a volumeMount of the container"
            );
            format!(
                "{what} for volumeMount \"{}\" of container \"{}\"",
                mount.name, container.name
            )
        };
        match volume {
            HostVolume::Path { path, read_only } => {
                let source = match sub.as_deref() {
                    Some(sub) => {
                        crate::subpath::check_relative(sub)?;
                        if std::fs::metadata(path.join(sub)).is_err() {
                            let mode = std::fs::metadata(path)
                                .map(|m| m.permissions().mode() & 0o7777)
                                .unwrap_or(0o755);
                            crate::subpath::safe_make_dir(path, sub, mode)
                                .map_err(|e| failed("failed to create subPath directory", e))?;
                        }
                        let target = crate::subpath::target(pod_dir, &mount.name, &container.name, index);
                        crate::subpath::prepare(path, sub, &target)
                            .map_err(|e| failed("failed to prepare subPath", e))?
                    }
                    None => path.clone(),
                };
                let mode = if ro || *read_only { "ro" } else { "rw" };
                out.push(format!("{}:{}:{mode}", source.display(), mount.mount_path));
            }
            HostVolume::Docker(name) => {
                if sub.is_some() {
                    // A Memory emptyDir is a Docker volume, which the engine mounts only whole.
                    return Err(failed(
                        "failed to prepare subPath",
                        anyhow::anyhow!("a subPath of a Memory emptyDir is not supported"),
                    ));
                }
                let mode = if ro { "ro" } else { "rw" };
                out.push(format!("{name}:{}:{mode}", mount.mount_path));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn host_path_types_are_checked_as_upstream() {
        let dir = tempfile::tempdir().expect("dir");
        let path = |name: &str| dir.path().join(name).display().to_string();
        std::fs::write(dir.path().join("file"), b"x").expect("file");
        std::fs::create_dir(dir.path().join("dir")).expect("dir");
        let _sock = std::os::unix::net::UnixListener::bind(dir.path().join("sock")).expect("socket");
        let check = |p: String, kind: &'static str| async move { host_path(&p, kind).await.expect("no I/O error") };
        assert!(check(path("file"), "File").await.is_ok());
        assert!(check(path("dir"), "Directory").await.is_ok());
        assert!(check(path("sock"), "Socket").await.is_ok());
        assert!(check("/dev/null".into(), "CharDevice").await.is_ok());
        assert!(check(path("anything"), "").await.is_ok(), "no type checks nothing");
        assert_eq!(
            check(path("file"), "Directory").await.unwrap_err(),
            format!(
                "hostPath type check failed: {} is not a directory, it's a File",
                path("file")
            )
        );
        assert_eq!(
            check(path("dir"), "FileOrCreate").await.unwrap_err(),
            format!(
                "hostPath type check failed: {} is not a file, it's a Directory",
                path("dir")
            )
        );
        assert_eq!(
            check(path("file"), "Socket").await.unwrap_err(),
            format!(
                "hostPath type check failed: {} is not a socket file, it's a File",
                path("file")
            )
        );
        assert_eq!(
            check(path("sock"), "BlockDevice").await.unwrap_err(),
            format!(
                "hostPath type check failed: {} is not a block device, it's a Socket",
                path("sock")
            )
        );
        assert_eq!(
            check(path("gone"), "CharDevice").await.unwrap_err(),
            format!("hostPath {} doesn't exist", path("gone"))
        );
        assert_eq!(
            check(path("x"), "Pipe").await.unwrap_err(),
            "Pipe is an invalid volume type"
        );
        // The ...OrCreate types create what is missing; a file's parent must exist.
        assert!(check(path("new-dir/sub"), "DirectoryOrCreate").await.is_ok());
        assert!(dir.path().join("new-dir/sub").is_dir());
        assert!(check(path("new-file"), "FileOrCreate").await.is_ok());
        assert!(dir.path().join("new-file").is_file());
        assert_eq!(
            check(path("no-parent/file"), "FileOrCreate").await.unwrap_err(),
            format!("open {}: no such file or directory", path("no-parent/file"))
        );
    }

    #[test]
    fn only_volume_kinds_with_a_plugin_here_are_supported() {
        let v = |json: serde_json::Value| -> Volume { serde_json::from_value(json).expect("a volume") };
        for supported in [
            serde_json::json!({"name": "v", "emptyDir": {}}),
            serde_json::json!({"name": "v", "hostPath": {"path": "/x"}}),
            serde_json::json!({"name": "v", "secret": {"secretName": "s"}}),
            serde_json::json!({"name": "v", "configMap": {"name": "c"}}),
            serde_json::json!({"name": "v", "downwardAPI": {}}),
            serde_json::json!({"name": "v", "projected": {"sources": []}}),
            serde_json::json!({"name": "v", "persistentVolumeClaim": {"claimName": "c"}}),
        ] {
            assert!(is_supported(&v(supported.clone())), "{supported}");
        }
        for unsupported in [
            serde_json::json!({"name": "v", "nfs": {"server": "s", "path": "/"}}),
            serde_json::json!({"name": "v", "csi": {"driver": "d"}}),
            serde_json::json!({"name": "v", "iscsi": {"targetPortal": "t", "iqn": "i", "lun": 0}}),
            serde_json::json!({"name": "v", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}),
            serde_json::json!({"name": "v", "image": {"reference": "busybox"}}),
            serde_json::json!({"name": "v"}),
        ] {
            assert!(!is_supported(&v(unsupported.clone())), "{unsupported}");
        }
        assert_eq!(
            no_volume_plugin("v"),
            "failed to get Plugin from volumeSpec for volume \"v\" err=no volume plugin matched"
        );
    }
    use k8s_openapi::api::core::v1::{
        HostAlias, HostPathVolumeSource, LocalVolumeSource, ObjectReference, PersistentVolumeClaimSpec,
        PersistentVolumeClaimStatus, PersistentVolumeSpec, PodSpec, VolumeMount,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    #[test]
    fn tokens_are_renewed_at_80_percent_of_their_lifetime_or_after_a_day() {
        let t0 = Instant::now();
        let hour = Duration::from_secs(3600);
        // The kubelet's default request (3607 s) is renewed after 2885.6 s, less the jitter.
        assert_eq!(
            token_refresh_at(t0, Duration::from_secs(3607), Duration::ZERO) - t0,
            Duration::from_millis(2_885_600)
        );
        assert_eq!(
            token_refresh_at(t0, Duration::from_secs(3607), Duration::from_secs(10)) - t0,
            Duration::from_millis(2_875_600)
        );
        // Long-lived tokens are renewed at least daily.
        assert_eq!(token_refresh_at(t0, 48 * hour, Duration::ZERO) - t0, 24 * hour);
        // A lifetime shorter than the jitter is renewed at once.
        assert_eq!(
            token_refresh_at(t0, Duration::from_secs(5), Duration::from_secs(10)),
            t0
        );
    }

    #[test]
    fn token_keys_default_as_the_kubelet_asks() {
        let mut pod = Pod::default();
        assert_eq!(pod_service_account(&pod), "default");
        pod.spec = Some(PodSpec {
            service_account_name: Some("builder".into()),
            ..Default::default()
        });
        assert_eq!(pod_service_account(&pod), "builder");
        let key = TokenKey {
            service_account: "builder".into(),
            audiences: vec!["vault".into()],
            expiration_seconds: TOKEN_DEFAULT_SECONDS,
        };
        assert_eq!(key.to_string(), r#""builder"/["vault"]/3607"#);
    }

    fn claim(phase: Option<&str>, volume: Option<&str>) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("data".into()),
                namespace: Some("default".into()),
                uid: Some("claim-uid".into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                volume_name: volume.map(str::to_string),
                ..Default::default()
            }),
            status: Some(PersistentVolumeClaimStatus {
                phase: phase.map(str::to_string),
                ..Default::default()
            }),
        }
    }

    fn volume(spec: PersistentVolumeSpec) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some("pv1".into()),
                ..Default::default()
            },
            spec: Some(spec),
            status: None,
        }
    }

    #[test]
    fn claims_must_be_bound_to_be_mounted() {
        assert_eq!(bound_volume_name(&claim(Some("Bound"), Some("pv1"))), Ok("pv1"));
        assert_eq!(
            bound_volume_name(&claim(Some("Pending"), None)).unwrap_err(),
            "PVC is not bound"
        );
        assert_eq!(
            bound_volume_name(&claim(Some("Bound"), None)).unwrap_err(),
            "PVC has empty pvc.Spec.VolumeName"
        );
        let mut deleting = claim(Some("Bound"), Some("pv1"));
        deleting.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::now()));
        assert_eq!(bound_volume_name(&deleting).unwrap_err(), "PVC is being deleted");
    }

    #[test]
    fn volume_must_point_back_at_the_claim() {
        let mut pv = volume(PersistentVolumeSpec::default());
        assert_eq!(
            check_claim_ref(&pv, "claim-uid").unwrap_err(),
            "found PV object pv1 but it has a nil pv.Spec.ClaimRef indicating it is not yet bound to the claim"
        );
        pv.spec.as_mut().unwrap().claim_ref = Some(ObjectReference {
            name: Some("data".into()),
            namespace: Some("default".into()),
            uid: Some("old-uid".into()),
            ..Default::default()
        });
        assert_eq!(
            check_claim_ref(&pv, "claim-uid").unwrap_err(),
            "found PV object pv1 but its pv.Spec.ClaimRef.UID old-uid does not point to claim.UID claim-uid"
        );
        pv.spec.as_mut().unwrap().claim_ref.as_mut().unwrap().uid = Some("claim-uid".into());
        assert!(check_claim_ref(&pv, "claim-uid").is_ok());
    }

    #[tokio::test]
    async fn persistent_volume_paths_follow_their_plugin() {
        let dir = tempfile::tempdir().unwrap();
        // hostPath without a type: created when missing, mounted read-only when the claim says so.
        let created = dir.path().join("a/b");
        let pv = volume(PersistentVolumeSpec {
            host_path: Some(HostPathVolumeSource {
                path: created.display().to_string(),
                type_: None,
            }),
            ..Default::default()
        });
        let got = persistent_volume_path(&pv, true, "data").await.unwrap().unwrap();
        assert_eq!(
            got,
            HostVolume::Path {
                path: created.clone(),
                read_only: true
            }
        );
        assert!(created.is_dir());
        // hostPath of type Directory that is missing: the plugin's type check, naming the volume.
        let missing = dir.path().join("missing");
        let pv = volume(PersistentVolumeSpec {
            host_path: Some(HostPathVolumeSource {
                path: missing.display().to_string(),
                type_: Some("Directory".into()),
            }),
            ..Default::default()
        });
        let e = persistent_volume_path(&pv, false, "data").await.unwrap().unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "MountVolume.SetUp failed for volume \"pv1\" : hostPath {} doesn't exist",
                missing.display()
            )
        );
        assert!(!missing.exists());
        // local: must exist, never created.
        let pv = volume(PersistentVolumeSpec {
            local: Some(LocalVolumeSource {
                path: missing.display().to_string(),
                fs_type: None,
            }),
            ..Default::default()
        });
        let e = persistent_volume_path(&pv, false, "data").await.unwrap().unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "MountVolume.NewMounter initialization failed for volume \"pv1\" : path \"{}\" does not exist",
                missing.display()
            )
        );
        let pv = volume(PersistentVolumeSpec {
            local: Some(LocalVolumeSource {
                path: created.display().to_string(),
                fs_type: None,
            }),
            ..Default::default()
        });
        assert_eq!(
            persistent_volume_path(&pv, false, "data").await.unwrap().unwrap(),
            HostVolume::Path {
                path: created,
                read_only: false
            }
        );
        // Anything else has no plugin on this node.
        let e = persistent_volume_path(&volume(PersistentVolumeSpec::default()), false, "data")
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "Unable to attach or mount volumes: unmounted volumes=[data], unattached volumes=[], failed to process \
             volumes=[data]: failed to get Plugin from volumeSpec for volume \"pv1\" err=no volume plugin matched"
        );
    }

    #[test]
    fn atomic_writer_swaps_generations() {
        let dir = std::env::temp_dir().join(format!("skiff-atomic-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut files = BTreeMap::new();
        files.insert("a".to_string(), (b"1".to_vec(), 0o644));
        files.insert("sub/b".to_string(), (b"2".to_vec(), 0o600));
        write_atomic(&dir, &files).unwrap();
        assert_eq!(std::fs::read(dir.join("a")).unwrap(), b"1");
        assert_eq!(std::fs::read(dir.join("sub/b")).unwrap(), b"2");
        let mode = std::fs::metadata(dir.join("sub/b")).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        std::thread::sleep(std::time::Duration::from_millis(5));
        let mut files = BTreeMap::new();
        files.insert("a".to_string(), (b"3".to_vec(), 0o644));
        write_atomic(&dir, &files).unwrap();
        assert_eq!(std::fs::read(dir.join("a")).unwrap(), b"3");
        assert!(std::fs::symlink_metadata(dir.join("sub")).is_err());
        let generations = std::fs::read_dir(&dir)
            .unwrap()
            .filter(|e| {
                let n = e.as_ref().unwrap().file_name().to_string_lossy().into_owned();
                n.starts_with("..") && n != "..data"
            })
            .count();
        assert_eq!(generations, 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn hosts_file_has_pod_entry_and_aliases() {
        let mut pod = Pod::default();
        pod.metadata.name = Some("web".into());
        pod.metadata.namespace = Some("default".into());
        pod.spec = Some(PodSpec {
            host_aliases: Some(vec![HostAlias {
                ip: "10.1.2.3".into(),
                hostnames: Some(vec!["foo.remote".into(), "bar.remote".into()]),
            }]),
            ..Default::default()
        });
        let hosts = hosts_file(&pod, "172.17.0.5");
        assert!(hosts.starts_with("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n"));
        assert!(hosts.contains("172.17.0.5\tweb\n"));
        assert!(hosts.ends_with("\n# Entries added by HostAliases.\n10.1.2.3\tfoo.remote\tbar.remote\n"));
    }

    #[test]
    fn binds_honour_read_only_and_subpath() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("vol");
        let pod_dir = tmp.path().join("pod");
        std::fs::create_dir_all(&dir).unwrap();
        let volumes = HashMap::from([
            (
                "data".to_string(),
                HostVolume::Path {
                    path: dir.clone(),
                    read_only: false,
                },
            ),
            (
                "cfg".to_string(),
                HostVolume::Path {
                    path: dir.clone(),
                    read_only: true,
                },
            ),
            ("mem".to_string(), HostVolume::Docker("skiff-u-mem".into())),
        ]);
        let mount = |name: &str, path: &str| VolumeMount {
            name: name.into(),
            mount_path: path.into(),
            ..Default::default()
        };
        let container = Container {
            name: "c".into(),
            volume_mounts: Some(vec![
                VolumeMount {
                    sub_path: Some("x".into()),
                    ..mount("data", "/data")
                },
                mount("cfg", "/cfg"),
                VolumeMount {
                    read_only: Some(true),
                    ..mount("mem", "/mem")
                },
                VolumeMount {
                    sub_path_expr: Some("logs/$(POD)".into()),
                    ..mount("data", "/logs")
                },
            ]),
            ..Default::default()
        };
        let env = HashMap::from([("POD", "web-0")]);
        let b = binds(&container, &volumes, &pod_dir, &env).unwrap();
        let target = |i| crate::subpath::target(&pod_dir, "data", "c", i);
        assert_eq!(b[0], format!("{}:/data:rw", target(0).display()));
        assert!(dir.join("x").is_dir(), "the subPath is created in the volume");
        assert_eq!(b[1], format!("{}:/cfg:ro", dir.display()));
        assert_eq!(b[2], "skiff-u-mem:/mem:ro");
        assert_eq!(b[3], format!("{}:/logs:rw", target(3).display()));
        assert!(dir.join("logs/web-0").is_dir());
        assert_eq!(
            binds(&container, &volumes, &pod_dir, &HashMap::new()),
            Err("missing value for POD".to_string())
        );
        crate::subpath::cleanup(&pod_dir).unwrap();

        let only = |m: VolumeMount| Container {
            name: "c".into(),
            volume_mounts: Some(vec![m]),
            ..Default::default()
        };
        assert!(binds(&only(mount("nope", "/x")), &volumes, &pod_dir, &env).is_err());
        std::os::unix::fs::symlink("/", dir.join("up")).unwrap();
        let escape = VolumeMount {
            sub_path: Some("up".into()),
            ..mount("data", "/host")
        };
        assert_eq!(
            binds(&only(escape), &volumes, &pod_dir, &env),
            Err("failed to prepare subPath for volumeMount \"data\" of container \"c\"".to_string())
        );
        let create_outside = VolumeMount {
            sub_path: Some("up/skiff-test-escape".into()),
            ..mount("data", "/host")
        };
        assert_eq!(
            binds(&only(create_outside), &volumes, &pod_dir, &env),
            Err("failed to create subPath directory for volumeMount \"data\" of container \"c\"".to_string())
        );
        assert!(!Path::new("/skiff-test-escape").exists());
        let memory = VolumeMount {
            sub_path: Some("x".into()),
            ..mount("mem", "/m")
        };
        assert!(binds(&only(memory), &volumes, &pod_dir, &env).is_err());
        crate::subpath::cleanup(&pod_dir).unwrap();
    }
}
