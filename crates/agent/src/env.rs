//! Container environment: `env` (value, fieldRef, resourceFieldRef, secretKeyRef, configMapKeyRef),
//! `envFrom`, and `$(VAR)` expansion in values, command and args.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret, Service};
use kube::Api;

use crate::quantity;

/// Why a container's configuration could not be built (reported as `CreateContainerConfigError`).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// What fieldRef and resourceFieldRef read besides the pod itself.
pub struct EnvContext<'a> {
    pub pod_ip: &'a str,
    pub host_ip: &'a str,
    pub node_allocatable_cpu_milli: i128,
    pub node_allocatable_memory: i128,
    pub node_allocatable_storage: i128,
}

/// Fetches and caches Secrets and ConfigMaps of one namespace for one sync.
pub struct ObjectCache {
    secrets: Api<Secret>,
    config_maps: Api<ConfigMap>,
    secret_cache: HashMap<String, Option<BTreeMap<String, String>>>,
    cm_cache: HashMap<String, Option<BTreeMap<String, String>>>,
}

impl ObjectCache {
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        Self {
            secrets: Api::namespaced(client.clone(), namespace),
            config_maps: Api::namespaced(client, namespace),
            secret_cache: HashMap::new(),
            cm_cache: HashMap::new(),
        }
    }

    /// A Secret's data decoded to strings (bytes are kept as lossy UTF-8); `None` when absent.
    pub async fn secret(&mut self, name: &str) -> anyhow::Result<Option<BTreeMap<String, Vec<u8>>>> {
        let secret = self.secrets.get_opt(name).await?;
        let data = secret.map(|s| {
            let mut out: BTreeMap<String, Vec<u8>> = BTreeMap::new();
            for (k, v) in s.data.unwrap_or_default() {
                out.insert(k, v.0);
            }
            for (k, v) in s.string_data.unwrap_or_default() {
                out.insert(k, v.into_bytes());
            }
            out
        });
        self.secret_cache.insert(
            name.to_string(),
            data.as_ref().map(|d| {
                d.iter()
                    .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
                    .collect()
            }),
        );
        Ok(data)
    }

    /// A ConfigMap's data and binaryData; `None` when absent.
    pub async fn config_map(&mut self, name: &str) -> anyhow::Result<Option<BTreeMap<String, Vec<u8>>>> {
        let cm = self.config_maps.get_opt(name).await?;
        let data = cm.map(|c| {
            let mut out: BTreeMap<String, Vec<u8>> = BTreeMap::new();
            for (k, v) in c.binary_data.unwrap_or_default() {
                out.insert(k, v.0);
            }
            for (k, v) in c.data.unwrap_or_default() {
                out.insert(k, v.into_bytes());
            }
            out
        });
        self.cm_cache.insert(
            name.to_string(),
            data.as_ref().map(|d| {
                d.iter()
                    .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
                    .collect()
            }),
        );
        Ok(data)
    }

    /// The services whose variables a container sees: the namespace's (with service links) and the
    /// `kubernetes` service of `default`. A failed list yields none.
    pub async fn services(&mut self, namespace: &str, links: bool) -> Vec<Service> {
        let client = self.secrets.clone().into_client();
        let mut out = Vec::new();
        if links {
            let api: Api<Service> = Api::namespaced(client.clone(), namespace);
            if let Ok(list) = api.list(&Default::default()).await {
                out.extend(list.items);
            }
        }
        if !links || namespace != "default" {
            let api: Api<Service> = Api::namespaced(client, "default");
            if let Ok(Some(svc)) = api.get_opt("kubernetes").await {
                out.retain(|s| s.metadata.name.as_deref() != Some("kubernetes"));
                out.push(svc);
            }
        }
        out
    }

    async fn secret_strings(&mut self, name: &str) -> anyhow::Result<Option<BTreeMap<String, String>>> {
        if let Some(cached) = self.secret_cache.get(name) {
            return Ok(cached.clone());
        }
        self.secret(name).await?;
        Ok(self.secret_cache.get(name).cloned().flatten())
    }

    async fn cm_strings(&mut self, name: &str) -> anyhow::Result<Option<BTreeMap<String, String>>> {
        if let Some(cached) = self.cm_cache.get(name) {
            return Ok(cached.clone());
        }
        self.config_map(name).await?;
        Ok(self.cm_cache.get(name).cloned().flatten())
    }
}

/// Builds a container's environment as ordered `NAME=value` pairs, as upstream's makeEnvironmentVariables.
pub async fn container_env(
    pod: &Pod,
    container: &Container,
    ctx: &EnvContext<'_>,
    objects: &mut ObjectCache,
) -> anyhow::Result<Result<Vec<(String, String)>, ConfigError>> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut vars: Vec<(String, String)> = Vec::new();
    let links = pod.spec.as_ref().and_then(|s| s.enable_service_links).unwrap_or(true);
    vars.extend(service_env(&objects.services(namespace, links).await));
    let set = |vars: &mut Vec<(String, String)>, k: String, v: String| {
        if let Some(slot) = vars.iter_mut().find(|(n, _)| *n == k) {
            slot.1 = v;
        } else {
            vars.push((k, v));
        }
    };
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        if let Some(cm_ref) = &from.config_map_ref {
            match objects.cm_strings(&cm_ref.name).await? {
                Some(data) => {
                    for (k, v) in data {
                        set(&mut vars, format!("{prefix}{k}"), v);
                    }
                }
                None if cm_ref.optional == Some(true) => {}
                None => {
                    return Ok(Err(ConfigError(format!("configmap \"{}\" not found", cm_ref.name))));
                }
            }
        }
        if let Some(s_ref) = &from.secret_ref {
            match objects.secret_strings(&s_ref.name).await? {
                Some(data) => {
                    for (k, v) in data {
                        set(&mut vars, format!("{prefix}{k}"), v);
                    }
                }
                None if s_ref.optional == Some(true) => {}
                None => {
                    return Ok(Err(ConfigError(format!("secret \"{}\" not found", s_ref.name))));
                }
            }
        }
    }
    for env in container.env.iter().flatten() {
        let value = if let Some(value) = &env.value {
            let lookup: HashMap<&str, &str> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            expand(value, &lookup)
        } else if let Some(source) = &env.value_from {
            if let Some(field) = &source.field_ref {
                match field_ref_value(pod, &field.field_path, ctx) {
                    Some(v) => v,
                    None => {
                        return Ok(Err(ConfigError(format!("unsupported fieldPath: {}", field.field_path))));
                    }
                }
            } else if let Some(res) = &source.resource_field_ref {
                let target = match &res.container_name {
                    Some(name) if !name.is_empty() => pod
                        .spec
                        .as_ref()
                        .and_then(|s| s.containers.iter().find(|c| &c.name == name))
                        .unwrap_or(container),
                    _ => container,
                };
                let divisor = res.divisor.as_ref().map(|d| d.0.as_str());
                match resource_field_value(target, &res.resource, divisor, ctx) {
                    Some(v) => v,
                    None => {
                        return Ok(Err(ConfigError(format!(
                            "unsupported container resource: {}",
                            res.resource
                        ))));
                    }
                }
            } else if let Some(key_ref) = &source.config_map_key_ref {
                let optional = key_ref.optional == Some(true);
                match objects.cm_strings(&key_ref.name).await? {
                    Some(data) => match data.get(&key_ref.key) {
                        Some(v) => v.clone(),
                        None if optional => continue,
                        None => {
                            return Ok(Err(ConfigError(format!(
                                "couldn't find key {} in ConfigMap {namespace}/{}",
                                key_ref.key, key_ref.name
                            ))));
                        }
                    },
                    None if optional => continue,
                    None => {
                        return Ok(Err(ConfigError(format!("configmap \"{}\" not found", key_ref.name))));
                    }
                }
            } else if let Some(key_ref) = &source.secret_key_ref {
                let optional = key_ref.optional == Some(true);
                match objects.secret_strings(&key_ref.name).await? {
                    Some(data) => match data.get(&key_ref.key) {
                        Some(v) => v.clone(),
                        None if optional => continue,
                        None => {
                            return Ok(Err(ConfigError(format!(
                                "couldn't find key {} in Secret {namespace}/{}",
                                key_ref.key, key_ref.name
                            ))));
                        }
                    },
                    None if optional => continue,
                    None => {
                        return Ok(Err(ConfigError(format!("secret \"{}\" not found", key_ref.name))));
                    }
                }
            } else {
                String::new()
            }
        } else {
            String::new()
        };
        set(&mut vars, env.name.clone(), value);
    }
    Ok(Ok(vars))
}

/// Service environment variables as upstream's kubelet makes them (`FOO_SERVICE_HOST`, Docker-link
/// style `FOO_PORT_80_TCP_ADDR`, ...), for services with a cluster IP.
pub fn service_env(services: &[Service]) -> Vec<(String, String)> {
    let mut services: Vec<&Service> = services.iter().collect();
    services.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut out = Vec::new();
    for svc in services {
        let Some(spec) = svc.spec.as_ref() else { continue };
        let Some(ip) = spec.cluster_ip.as_deref().filter(|ip| !ip.is_empty() && *ip != "None") else {
            continue;
        };
        let ports = spec.ports.clone().unwrap_or_default();
        let Some(first) = ports.first() else { continue };
        let name = svc
            .metadata
            .name
            .clone()
            .unwrap_or_default()
            .to_uppercase()
            .replace('-', "_");
        out.push((format!("{name}_SERVICE_HOST"), ip.to_string()));
        out.push((format!("{name}_SERVICE_PORT"), first.port.to_string()));
        for p in &ports {
            if let Some(port_name) = p.name.as_deref().filter(|n| !n.is_empty()) {
                out.push((
                    format!("{name}_SERVICE_PORT_{}", port_name.to_uppercase().replace('-', "_")),
                    p.port.to_string(),
                ));
            }
        }
        let proto = |p: &k8s_openapi::api::core::v1::ServicePort| p.protocol.clone().unwrap_or_else(|| "TCP".into());
        out.push((
            format!("{name}_PORT"),
            format!("{}://{ip}:{}", proto(first).to_lowercase(), first.port),
        ));
        for p in &ports {
            let proto = proto(p);
            let prefix = format!("{name}_PORT_{}_{}", p.port, proto.to_uppercase());
            out.push((prefix.clone(), format!("{}://{ip}:{}", proto.to_lowercase(), p.port)));
            out.push((format!("{prefix}_PROTO"), proto.to_lowercase()));
            out.push((format!("{prefix}_PORT"), p.port.to_string()));
            out.push((format!("{prefix}_ADDR"), ip.to_string()));
        }
    }
    out
}

/// Expands `$(VAR)` references; `$$` escapes a `$`; unknown references stay as written.
pub fn expand(input: &str, vars: &HashMap<&str, &str>) -> String {
    expand_with(input, vars, |_| {})
}

/// `$(VAR)` expanded as a `subPathExpr` is (upstream's `ExpandContainerVolumeMounts`): every
/// variable must have a non-empty value, or the error names those that have none.
pub fn expand_required(input: &str, vars: &HashMap<&str, &str>) -> Result<String, String> {
    let set: HashMap<&str, &str> = vars
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (*k, *v))
        .collect();
    let mut missing = std::collections::BTreeSet::new();
    let out = expand_with(input, &set, |name| {
        missing.insert(name.to_string());
    });
    let missing: Vec<String> = missing.into_iter().collect();
    if missing.is_empty() {
        Ok(out)
    } else {
        Err(format!("missing value for {}", missing.join(", ")))
    }
}

fn expand_with(input: &str, vars: &HashMap<&str, &str>, mut missing: impl FnMut(&str)) -> String {
    let mut out = String::with_capacity(input.len());
    let bytes = input.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'$' && i + 1 < bytes.len() {
            if bytes[i + 1] == b'$' {
                out.push('$');
                i += 2;
                continue;
            }
            if bytes[i + 1] == b'('
                && let Some(end) = input[i + 2..].find(')')
            {
                let name = &input[i + 2..i + 2 + end];
                match vars.get(name) {
                    Some(v) => out.push_str(v),
                    None => {
                        missing(name);
                        out.push_str(&input[i..i + 3 + end]);
                    }
                }
                i += 3 + end;
                continue;
            }
        }
        let ch = input[i..].chars().next().unwrap_or('$');
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// The value of a downward-API field path.
pub fn field_ref_value(pod: &Pod, path: &str, ctx: &EnvContext<'_>) -> Option<String> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let subscript =
        |prefix: &str| -> Option<String> { path.strip_prefix(prefix)?.strip_suffix("']").map(str::to_string) };
    if let Some(key) = subscript("metadata.labels['") {
        return Some(
            meta.labels
                .as_ref()
                .and_then(|l| l.get(&key).cloned())
                .unwrap_or_default(),
        );
    }
    if let Some(key) = subscript("metadata.annotations['") {
        return Some(
            meta.annotations
                .as_ref()
                .and_then(|l| l.get(&key).cloned())
                .unwrap_or_default(),
        );
    }
    let format_map = |m: Option<&BTreeMap<String, String>>| {
        m.map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}=\"{v}\""))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
    };
    Some(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" => format_map(meta.labels.as_ref()),
        "metadata.annotations" => format_map(meta.annotations.as_ref()),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()).unwrap_or_default(),
        "status.hostIP" | "status.hostIPs" => ctx.host_ip.to_string(),
        "status.podIP" | "status.podIPs" => ctx.pod_ip.to_string(),
        _ => return None,
    })
}

/// The value of a resourceFieldRef: limits default to the node's allocatable; rounded up by the divisor.
pub fn resource_field_value(
    container: &Container,
    resource: &str,
    divisor: Option<&str>,
    ctx: &EnvContext<'_>,
) -> Option<String> {
    let res = container.resources.as_ref();
    let get = |limits: bool, name: &str| -> Option<i128> {
        let map = if limits {
            res.and_then(|r| r.limits.as_ref())
        } else {
            res.and_then(|r| r.requests.as_ref())
        };
        map.and_then(|m| m.get(name)).and_then(|q| quantity::parse_milli(&q.0))
    };
    let (milli, default_divisor) = match resource {
        "limits.cpu" => (get(true, "cpu").unwrap_or(ctx.node_allocatable_cpu_milli), "1"),
        "requests.cpu" => (get(false, "cpu").unwrap_or(0), "1"),
        "limits.memory" => (get(true, "memory").unwrap_or(ctx.node_allocatable_memory * 1000), "1"),
        "requests.memory" => (get(false, "memory").unwrap_or(0), "1"),
        "limits.ephemeral-storage" => (
            get(true, "ephemeral-storage").unwrap_or(ctx.node_allocatable_storage * 1000),
            "1",
        ),
        "requests.ephemeral-storage" => (get(false, "ephemeral-storage").unwrap_or(0), "1"),
        _ => return None,
    };
    let div = quantity::parse_milli(divisor.unwrap_or(default_divisor))
        .filter(|d| *d > 0)
        .unwrap_or(1000);
    let value = (milli + div - 1).div_euclid(div);
    Some(value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn ctx() -> EnvContext<'static> {
        EnvContext {
            pod_ip: "10.0.0.5",
            host_ip: "192.168.1.2",
            node_allocatable_cpu_milli: 2000,
            node_allocatable_memory: 1 << 30,
            node_allocatable_storage: 1 << 34,
        }
    }

    #[test]
    fn service_links_follow_upstream_names() {
        let svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "redis-primary"},
            "spec": {"clusterIP": "10.0.0.11", "ports": [{"name": "db", "port": 6379, "protocol": "TCP"}]}
        }))
        .unwrap();
        let headless: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "h"}, "spec": {"clusterIP": "None", "ports": [{"port": 80}]}
        }))
        .unwrap();
        let env: HashMap<String, String> = service_env(&[svc, headless]).into_iter().collect();
        assert_eq!(env["REDIS_PRIMARY_SERVICE_HOST"], "10.0.0.11");
        assert_eq!(env["REDIS_PRIMARY_SERVICE_PORT"], "6379");
        assert_eq!(env["REDIS_PRIMARY_SERVICE_PORT_DB"], "6379");
        assert_eq!(env["REDIS_PRIMARY_PORT"], "tcp://10.0.0.11:6379");
        assert_eq!(env["REDIS_PRIMARY_PORT_6379_TCP_ADDR"], "10.0.0.11");
        assert_eq!(env["REDIS_PRIMARY_PORT_6379_TCP_PROTO"], "tcp");
        assert!(!env.keys().any(|k| k.starts_with("H_")));
    }

    #[test]
    fn expands_references_and_escapes() {
        let vars = HashMap::from([("A", "x"), ("B", "y")]);
        assert_eq!(expand("$(A)-$(B)", &vars), "x-y");
        assert_eq!(expand("$$(A)", &vars), "$(A)");
        assert_eq!(expand("$(C) $A", &vars), "$(C) $A");
        assert_eq!(expand("ünï $(A)", &vars), "ünï x");
        assert_eq!(expand_required("logs/$(A)", &vars), Ok("logs/x".to_string()));
        assert_eq!(
            expand_required("$(C)/$(A)/$(E)/$(C)", &vars),
            Err("missing value for C, E".to_string())
        );
        let empty = HashMap::from([("A", "")]);
        assert_eq!(expand_required("$(A)", &empty), Err("missing value for A".to_string()));
    }

    #[test]
    fn field_refs_read_pod_metadata() {
        let mut pod = Pod::default();
        pod.metadata.name = Some("p".into());
        pod.metadata.namespace = Some("ns".into());
        pod.metadata.labels = Some(BTreeMap::from([("app".into(), "web".into())]));
        pod.spec = Some(PodSpec {
            node_name: Some("n1".into()),
            ..Default::default()
        });
        let c = ctx();
        assert_eq!(field_ref_value(&pod, "metadata.name", &c).as_deref(), Some("p"));
        assert_eq!(
            field_ref_value(&pod, "metadata.labels['app']", &c).as_deref(),
            Some("web")
        );
        assert_eq!(
            field_ref_value(&pod, "metadata.labels", &c).as_deref(),
            Some("app=\"web\"")
        );
        assert_eq!(field_ref_value(&pod, "spec.nodeName", &c).as_deref(), Some("n1"));
        assert_eq!(field_ref_value(&pod, "status.podIP", &c).as_deref(), Some("10.0.0.5"));
        assert_eq!(field_ref_value(&pod, "spec.bogus", &c), None);
    }

    #[test]
    fn resource_refs_round_up_and_default_to_allocatable() {
        let container = Container {
            resources: Some(ResourceRequirements {
                limits: Some(BTreeMap::from([
                    ("cpu".into(), Quantity("250m".into())),
                    ("memory".into(), Quantity("64Mi".into())),
                ])),
                ..Default::default()
            }),
            ..Default::default()
        };
        let c = ctx();
        assert_eq!(
            resource_field_value(&container, "limits.cpu", None, &c).as_deref(),
            Some("1")
        );
        assert_eq!(
            resource_field_value(&container, "limits.cpu", Some("1m"), &c).as_deref(),
            Some("250")
        );
        assert_eq!(
            resource_field_value(&container, "limits.memory", Some("1Mi"), &c).as_deref(),
            Some("64")
        );
        assert_eq!(
            resource_field_value(&container, "requests.cpu", None, &c).as_deref(),
            Some("0")
        );
        let empty = Container::default();
        assert_eq!(
            resource_field_value(&empty, "limits.cpu", None, &c).as_deref(),
            Some("2")
        );
    }
}
