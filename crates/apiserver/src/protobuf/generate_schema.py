#!/usr/bin/env python3
"""Generates schema.rs: the protobuf field tables that protobuf.rs decodes with.

Field numbers and wire types come from k8s-pb (prost code generated from upstream's
generated.proto files); JSON names and required fields come from k8s-openapi (generated from
upstream's OpenAPI). Fields whose Go type is a pointer are listed in POINTER_FIELDS below: only
they (and required fields) keep zero values, as Go's `omitempty` would drop the others.

Go's embedded structs (e.g. `ProbeHandler` in `Probe`, `VolumeSource` in `Volume`) are a nested
message in protobuf but inlined in JSON: such fields are marked `I` (inline).

Usage: generate_schema.py K8S_PB_SRC K8S_OPENAPI_SRC > schema.rs && rustfmt --edition 2024 schema.rs
(K8S_OPENAPI_SRC is k8s-openapi's src/: v1_33 names win, newer versions fill in newer fields.)
"""
import os
import re
import sys

PB_SRC, OPENAPI_SRC = sys.argv[1], sys.argv[2]

# Stable API groups whose objects are decoded; everything they reference is included too.
ROOT_MODULES = [
    "api::admissionregistration::v1", "api::apps::v1", "api::authentication::v1",
    "api::authorization::v1", "api::autoscaling::v1", "api::autoscaling::v2", "api::batch::v1",
    "api::certificates::v1", "api::coordination::v1", "api::core::v1", "api::discovery::v1",
    "api::events::v1", "api::flowcontrol::v1", "api::networking::v1", "api::node::v1",
    "api::policy::v1", "api::rbac::v1", "api::scheduling::v1", "api::storage::v1",
]
EXTRA_ROOTS = [
    ("apimachinery::pkg::apis::meta::v1", "DeleteOptions", "v1", "DeleteOptions"),
    ("api::authentication::v1", "TokenRequest", "authentication.k8s.io/v1", "TokenRequest"),
    ("api::policy::v1", "Eviction", "policy/v1", "Eviction"),
    ("api::autoscaling::v1", "Scale", "autoscaling/v1", "Scale"),
]

SPECIAL = {
    "io.k8s.apimachinery.pkg.apis.meta.v1.Time": "Time",
    "io.k8s.apimachinery.pkg.apis.meta.v1.MicroTime": "MicroTime",
    "io.k8s.apimachinery.pkg.apis.meta.v1.Duration": "Duration",
    "io.k8s.apimachinery.pkg.apis.meta.v1.FieldsV1": "Raw",
    "io.k8s.apimachinery.pkg.runtime.RawExtension": "Raw",
    "io.k8s.apimachinery.pkg.api.resource.Quantity": "Quantity",
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": "IntOrString",
}

# Go pointer fields (`*T`): their zero values are meaningful and kept. Keyed "Definition.json".
POINTER_FIELDS = """
meta.v1.ObjectMeta.deletionGracePeriodSeconds
meta.v1.OwnerReference.controller meta.v1.OwnerReference.blockOwnerDeletion
meta.v1.DeleteOptions.gracePeriodSeconds meta.v1.DeleteOptions.orphanDependents
meta.v1.DeleteOptions.propagationPolicy
meta.v1.DeleteOptions.ignoreStoreReadErrorWithClusterBreakingPotential
meta.v1.Preconditions.uid meta.v1.Preconditions.resourceVersion
core.v1.PodSpec.terminationGracePeriodSeconds core.v1.PodSpec.activeDeadlineSeconds
core.v1.PodSpec.automountServiceAccountToken core.v1.PodSpec.shareProcessNamespace
core.v1.PodSpec.priority core.v1.PodSpec.enableServiceLinks core.v1.PodSpec.preemptionPolicy
core.v1.PodSpec.runtimeClassName core.v1.PodSpec.setHostnameAsFQDN core.v1.PodSpec.hostUsers
core.v1.Container.restartPolicy core.v1.EphemeralContainer.restartPolicy
core.v1.SecurityContext.privileged core.v1.SecurityContext.runAsUser
core.v1.SecurityContext.runAsGroup core.v1.SecurityContext.runAsNonRoot
core.v1.SecurityContext.readOnlyRootFilesystem core.v1.SecurityContext.allowPrivilegeEscalation
core.v1.SecurityContext.procMount
core.v1.PodSecurityContext.runAsUser core.v1.PodSecurityContext.runAsGroup
core.v1.PodSecurityContext.runAsNonRoot core.v1.PodSecurityContext.fsGroup
core.v1.PodSecurityContext.fsGroupChangePolicy core.v1.PodSecurityContext.supplementalGroupsPolicy
core.v1.PodSecurityContext.seLinuxChangePolicy
core.v1.WindowsSecurityContextOptions.gmsaCredentialSpecName
core.v1.WindowsSecurityContextOptions.gmsaCredentialSpec
core.v1.WindowsSecurityContextOptions.runAsUserName core.v1.WindowsSecurityContextOptions.hostProcess
core.v1.Probe.terminationGracePeriodSeconds core.v1.GRPCAction.service
core.v1.VolumeMount.mountPropagation core.v1.VolumeMount.recursiveReadOnly
core.v1.SecretKeySelector.optional core.v1.ConfigMapKeySelector.optional
core.v1.SecretEnvSource.optional core.v1.ConfigMapEnvSource.optional
core.v1.SecretVolumeSource.defaultMode core.v1.SecretVolumeSource.optional
core.v1.ConfigMapVolumeSource.defaultMode core.v1.ConfigMapVolumeSource.optional
core.v1.KeyToPath.mode core.v1.ProjectedVolumeSource.defaultMode
core.v1.DownwardAPIVolumeSource.defaultMode core.v1.DownwardAPIVolumeFile.mode
core.v1.ServiceAccountTokenProjection.expirationSeconds
core.v1.ConfigMapProjection.optional core.v1.SecretProjection.optional
core.v1.ClusterTrustBundleProjection.name core.v1.ClusterTrustBundleProjection.signerName
core.v1.ClusterTrustBundleProjection.optional
core.v1.HostPathVolumeSource.type core.v1.CSIVolumeSource.readOnly core.v1.CSIVolumeSource.fsType
core.v1.ISCSIVolumeSource.initiatorName core.v1.ISCSIPersistentVolumeSource.initiatorName
core.v1.AzureDiskVolumeSource.cachingMode core.v1.AzureDiskVolumeSource.fsType
core.v1.AzureDiskVolumeSource.readOnly core.v1.AzureDiskVolumeSource.kind
core.v1.AzureFilePersistentVolumeSource.secretNamespace
core.v1.PersistentVolumeClaimSpec.storageClassName core.v1.PersistentVolumeClaimSpec.volumeMode
core.v1.PersistentVolumeClaimSpec.volumeAttributesClassName
core.v1.PersistentVolumeClaimStatus.currentVolumeAttributesClassName
core.v1.PersistentVolumeSpec.volumeMode core.v1.PersistentVolumeSpec.volumeAttributesClassName
core.v1.PersistentVolumeStatus.lastPhaseTransitionTime
core.v1.ServiceSpec.allocateLoadBalancerNodePorts core.v1.ServiceSpec.ipFamilyPolicy
core.v1.ServiceSpec.loadBalancerClass core.v1.ServiceSpec.internalTrafficPolicy
core.v1.ServiceSpec.trafficDistribution core.v1.ClientIPConfig.timeoutSeconds
core.v1.ServicePort.appProtocol core.v1.EndpointPort.appProtocol
core.v1.EndpointAddress.nodeName core.v1.LoadBalancerIngress.ipMode
core.v1.ServiceAccount.automountServiceAccountToken
core.v1.Secret.immutable core.v1.ConfigMap.immutable
core.v1.Toleration.tolerationSeconds
core.v1.TopologySpreadConstraint.minDomains core.v1.TopologySpreadConstraint.nodeAffinityPolicy
core.v1.TopologySpreadConstraint.nodeTaintsPolicy
core.v1.PodResourceClaim.resourceClaimName core.v1.PodResourceClaim.resourceClaimTemplateName
core.v1.PodResourceClaimStatus.resourceClaimName
core.v1.ContainerStatus.started core.v1.ContainerStatus.stopSignal
core.v1.ReplicationControllerSpec.replicas
core.v1.TypedLocalObjectReference.apiGroup core.v1.TypedObjectReference.apiGroup
core.v1.TypedObjectReference.namespace
core.v1.NodeConfigSource.configMap core.v1.ContainerUser.linux
core.v1.SeccompProfile.localhostProfile core.v1.AppArmorProfile.localhostProfile
apps.v1.DeploymentSpec.replicas apps.v1.DeploymentSpec.revisionHistoryLimit
apps.v1.DeploymentSpec.progressDeadlineSeconds apps.v1.DeploymentStatus.collisionCount
apps.v1.RollingUpdateDeployment.maxUnavailable apps.v1.RollingUpdateDeployment.maxSurge
apps.v1.ReplicaSetSpec.replicas apps.v1.StatefulSetSpec.replicas
apps.v1.StatefulSetSpec.revisionHistoryLimit apps.v1.StatefulSetStatus.collisionCount
apps.v1.RollingUpdateStatefulSetStrategy.partition
apps.v1.RollingUpdateStatefulSetStrategy.maxUnavailable
apps.v1.DaemonSetSpec.revisionHistoryLimit apps.v1.DaemonSetStatus.collisionCount
apps.v1.RollingUpdateDaemonSet.maxUnavailable apps.v1.RollingUpdateDaemonSet.maxSurge
batch.v1.JobSpec.parallelism batch.v1.JobSpec.completions batch.v1.JobSpec.activeDeadlineSeconds
batch.v1.JobSpec.backoffLimit batch.v1.JobSpec.backoffLimitPerIndex
batch.v1.JobSpec.maxFailedIndexes batch.v1.JobSpec.manualSelector
batch.v1.JobSpec.ttlSecondsAfterFinished batch.v1.JobSpec.completionMode batch.v1.JobSpec.suspend
batch.v1.JobSpec.podReplacementPolicy batch.v1.JobSpec.managedBy
batch.v1.JobStatus.ready batch.v1.JobStatus.terminating batch.v1.JobStatus.failedIndexes
batch.v1.PodFailurePolicyOnExitCodesRequirement.containerName
batch.v1.SuccessPolicyRule.succeededIndexes batch.v1.SuccessPolicyRule.succeededCount
batch.v1.CronJobSpec.timeZone batch.v1.CronJobSpec.startingDeadlineSeconds
batch.v1.CronJobSpec.suspend batch.v1.CronJobSpec.successfulJobsHistoryLimit
batch.v1.CronJobSpec.failedJobsHistoryLimit
policy.v1.PodDisruptionBudgetSpec.minAvailable policy.v1.PodDisruptionBudgetSpec.maxUnavailable
policy.v1.PodDisruptionBudgetSpec.unhealthyPodEvictionPolicy
coordination.v1.LeaseSpec.holderIdentity coordination.v1.LeaseSpec.leaseDurationSeconds
coordination.v1.LeaseSpec.leaseTransitions coordination.v1.LeaseSpec.strategy
coordination.v1.LeaseSpec.preferredHolder
scheduling.v1.PriorityClass.preemptionPolicy
autoscaling.v1.HorizontalPodAutoscalerSpec.minReplicas
autoscaling.v1.HorizontalPodAutoscalerSpec.targetCPUUtilizationPercentage
autoscaling.v1.HorizontalPodAutoscalerStatus.observedGeneration
autoscaling.v1.HorizontalPodAutoscalerStatus.currentCPUUtilizationPercentage
autoscaling.v2.HorizontalPodAutoscalerSpec.minReplicas
autoscaling.v2.HorizontalPodAutoscalerStatus.observedGeneration
autoscaling.v2.HPAScalingRules.stabilizationWindowSeconds autoscaling.v2.HPAScalingRules.selectPolicy
autoscaling.v2.MetricValueStatus.averageUtilization autoscaling.v2.MetricTarget.averageUtilization
networking.v1.IngressSpec.ingressClassName networking.v1.HTTPIngressPath.pathType
networking.v1.NetworkPolicyPort.protocol networking.v1.NetworkPolicyPort.port
networking.v1.NetworkPolicyPort.endPort
networking.v1.IngressClassParametersReference.apiGroup
networking.v1.IngressClassParametersReference.scope
networking.v1.IngressClassParametersReference.namespace
discovery.v1.Endpoint.hostname discovery.v1.Endpoint.nodeName discovery.v1.Endpoint.zone
discovery.v1.EndpointConditions.ready discovery.v1.EndpointConditions.serving
discovery.v1.EndpointConditions.terminating
discovery.v1.EndpointPort.name discovery.v1.EndpointPort.protocol discovery.v1.EndpointPort.port
discovery.v1.EndpointPort.appProtocol
storage.v1.StorageClass.reclaimPolicy storage.v1.StorageClass.allowVolumeExpansion
storage.v1.StorageClass.volumeBindingMode
storage.v1.CSIDriverSpec.attachRequired storage.v1.CSIDriverSpec.podInfoOnMount
storage.v1.CSIDriverSpec.storageCapacity storage.v1.CSIDriverSpec.fsGroupPolicy
storage.v1.CSIDriverSpec.requiresRepublish storage.v1.CSIDriverSpec.seLinuxMount
storage.v1.CSIDriverSpec.nodeAllocatableUpdatePeriodSeconds
storage.v1.VolumeAttachmentSource.persistentVolumeName storage.v1.VolumeNodeResources.count
storage.v1.VolumeError.errorCode
authentication.v1.TokenRequestSpec.expirationSeconds
certificates.v1.CertificateSigningRequestSpec.expirationSeconds
admissionregistration.v1.ValidatingWebhook.failurePolicy
admissionregistration.v1.ValidatingWebhook.matchPolicy
admissionregistration.v1.ValidatingWebhook.sideEffects
admissionregistration.v1.ValidatingWebhook.timeoutSeconds
admissionregistration.v1.MutatingWebhook.failurePolicy
admissionregistration.v1.MutatingWebhook.matchPolicy
admissionregistration.v1.MutatingWebhook.sideEffects
admissionregistration.v1.MutatingWebhook.timeoutSeconds
admissionregistration.v1.MutatingWebhook.reinvocationPolicy
admissionregistration.v1.RuleWithOperations.scope admissionregistration.v1.Rule.scope
admissionregistration.v1.ServiceReference.path admissionregistration.v1.ServiceReference.port
admissionregistration.v1.WebhookClientConfig.url
admissionregistration.v1.ValidatingAdmissionPolicySpec.failurePolicy
admissionregistration.v1.MatchResources.matchPolicy
admissionregistration.v1.ParamRef.parameterNotFoundAction
admissionregistration.v1.Validation.reason
flowcontrol.v1.LimitedPriorityLevelConfiguration.nominalConcurrencyShares
flowcontrol.v1.LimitedPriorityLevelConfiguration.lendablePercent
flowcontrol.v1.LimitedPriorityLevelConfiguration.borrowingLimitPercent
flowcontrol.v1.ExemptPriorityLevelConfiguration.nominalConcurrencyShares
flowcontrol.v1.ExemptPriorityLevelConfiguration.lendablePercent
node.v1.Overhead.podFixed
"""
POINTERS = set()
for item in POINTER_FIELDS.split():
    group_version_type, _, field = item.rpartition(".")
    group, version, typ = group_version_type.split(".")
    prefix = "io.k8s.apimachinery.pkg.apis" if group == "meta" else "io.k8s.api"
    POINTERS.add(f"{prefix}.{group}.{version}.{typ}.{field}".lower())


def norm(name):
    return name.replace("_", "").lower()


# ---- k8s-pb: messages, field numbers, wire types ----

messages = {}  # definition -> list of fields
resources = []  # (module, name, apiVersion, kind)


def definition(module, name):
    return "io.k8s." + ".".join(module) + "." + name


def resolve(module, rust_type):
    parts = rust_type.strip().strip(",").split("::")
    parts = [p for p in parts if p]
    mod = list(module)
    if parts and parts[0] == "crate":
        return parts[1:-1], parts[-1]
    while parts and parts[0] == "super":
        mod.pop()
        parts.pop(0)
    return mod + parts[:-1], parts[-1]


def inner(t, wrapper):
    t = t.strip()
    i = t.index(wrapper + "<")
    return t[i + len(wrapper) + 1 : t.rindex(">")]


for root, _, files in os.walk(PB_SRC):
    for f in files:
        if f != "mod.rs":
            continue
        rel = os.path.relpath(root, PB_SRC)
        module = [] if rel == "." else rel.split(os.sep)
        text = open(os.path.join(root, f)).read()
        for m in re.finditer(r"::prost::Message\)\]\npub struct (\w+) \{\n(.*?)\n\}", text, re.S):
            name, body = m.group(1), m.group(2)
            fields = []
            for seg in re.split(r"\n\s*#\[prost\(", body)[1:]:
                attrs, rest = seg.split(")]", 1)
                rest = "\n".join(l for l in rest.split("\n") if not l.strip().startswith("///"))
                fm = re.match(r"\s*pub (?:r#)?(\w+):\s*(.*?),?\s*$", rest, re.S)
                rust_name, rust_type = fm.group(1), re.sub(r"\s+", "", fm.group(2))
                tag = int(re.search(r'tag = "(\d+)"', attrs).group(1))
                kind = attrs.split(",")[0].split("=")[0].strip()
                card = "R" if "repeated" in attrs else "O"
                value = kind
                if kind == "btree_map":
                    card = "M"
                    value = re.search(r'btree_map = "string, (\w+)"', attrs).group(1)
                    rust_type = inner(rust_type, "BTreeMap").split(",", 1)[1]
                elif card == "R":
                    rust_type = inner(rust_type, "Vec")
                elif rust_type.startswith("::core::option::Option<"):
                    rust_type = inner(rust_type, "Option")
                target = None
                if value == "message":
                    target = definition(*resolve(module, rust_type))
                fields.append((tag, rust_name, card, value, target))
            messages[definition(module, name)] = fields
        for m in re.finditer(
            r'impl crate::Resource for (\w+) \{\s*const API_VERSION: &\'static str = "([^"]*)";'
            r'.*?const KIND: &\'static str = "([^"]*)";',
            text,
            re.S,
        ):
            resources.append(("::".join(module), m.group(1), m.group(2), m.group(3)))

# ---- k8s-openapi: JSON names and required fields ----

openapi = {}  # lowercased definition -> {norm(json): (json, required)}
versions = sorted((d for d in os.listdir(OPENAPI_SRC) if d.startswith("v1_")),
                  key=lambda v: int(v[3:]), reverse=True)
versions.remove("v1_33")
versions.append("v1_33")
for root, _, files in (w for v in versions for w in os.walk(os.path.join(OPENAPI_SRC, v))):
    for f in files:
        if not f.endswith(".rs"):
            continue
        text = open(os.path.join(root, f)).read()
        h = re.match(r"// Generated from definition (\S+)", text)
        if not h:
            continue
        s = re.search(r"\npub struct \w+ \{\n(.*?)\n\}", text, re.S)
        if not s:
            continue
        rust_fields = dict(re.findall(r"^    pub (?:r#)?(\w+): (.*),$", s.group(1), re.M))
        keys = dict((k, j) for j, k in re.findall(r'"([^"]+)" => Field::Key_(\w+),', text))
        entry = {}
        for rust_name, ty in rust_fields.items():
            json = keys.get(rust_name)
            if json is None:
                continue
            entry[norm(json)] = (json, not ty.startswith("Option<"))
        old = openapi.get(h.group(1).lower(), {})
        old.update(entry)
        openapi[h.group(1).lower()] = old

# ---- roots and their closure ----

roots = []
for module, name, api_version, kind in resources:
    if module in ROOT_MODULES:
        d = definition(module.split("::"), name)
        if d.lower() in openapi and d in messages:
            roots.append((api_version, kind, d))
for module, name, api_version, kind in EXTRA_ROOTS:
    roots.append((api_version, kind, definition(module.split("::"), name)))

needed, stack = set(), [d for _, _, d in roots]
while stack:
    d = stack.pop()
    if d in needed or d in SPECIAL or d.endswith(".ExtraValue"):
        continue
    needed.add(d)
    for _, _, _, _, target in messages[d]:
        if target:
            stack.append(target)


def camel(snake):
    head, *rest = snake.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


def ident(d):
    short = d.removeprefix("io.k8s.").replace("-", "_")
    out = []
    for part in short.split("."):
        out.append(re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", part).upper())
    return "_".join(out)


idents = {}
for d in needed:
    i = ident(d)
    assert i not in idents.values(), i
    idents[d] = i

SCALARS = {"string": "Str", "bool": "Bool", "int32": "I32", "int64": "I64", "double": "F64",
           "bytes": "Bytes"}

def all_names_in(target, names):
    """Whether every field of `target` (through nested inlined messages) is a JSON key of `names`."""
    for _, n, _, _, t in messages[target]:
        if norm(n) not in names and not (t in messages and all_names_in(t, names)):
            return False
    return True


# JSON names of messages that exist only to be inlined come from the message that inlines them.
names_of = {d: openapi[d.lower()] for d in needed if d.lower() in openapi}
for _ in range(4):
    for d in sorted(needed):
        names = names_of.get(d)
        if names is None:
            continue
        for _, rust_name, _, _, target in messages[d]:
            if (target in messages and target not in names_of and norm(rust_name) not in names
                    and all_names_in(target, names)):
                names_of[target] = names

warnings = []
out = []
out.append("// @generated by generate_schema.py from k8s-pb 0.9.0 (field numbers) and k8s-openapi")
out.append("// 0.29.0 v1_33 (JSON names, required fields). Do not edit by hand.")
out.append("")
out.append("use super::Card::{Inline as I, Map as M, One as O, Repeated as R};")
TY_IMPORT = len(out)
out.append("")
out.append("use super::{Message, f};")
out.append("")
out.append("/// `(apiVersion, kind, message)` of every object protobuf bodies may carry.")
out.append("pub(super) static KINDS: &[(&str, &str, &Message)] = &[")
for api_version, kind, d in sorted(roots):
    out.append(f'    ("{api_version}", "{kind}", &{idents[d]}),')
out.append("];")
for d in sorted(needed):
    names = names_of.get(d)
    if names is None:
        warnings.append(f"no OpenAPI definition for {d}")
    out.append("")
    out.append(f"static {idents[d]}: Message = Message {{")
    out.append(f'    name: "{d}",')
    out.append("    fields: &[")
    for tag, rust_name, card, value, target in sorted(messages[d]):
        json, required = (camel(rust_name), False)
        if names is not None:
            if norm(rust_name) in names:
                json, required = names[norm(rust_name)]
            elif target in messages and all_names_in(target, names):
                json, card = "", "I"
            else:
                warnings.append(f"{d}: no JSON name for {rust_name}")
        if value == "message":
            if target.endswith(".ExtraValue"):
                ty = "StrList"
            else:
                ty = SPECIAL.get(target) or f"Msg(&{idents[target]})"
        else:
            ty = SCALARS[value]
        keep = required or f"{d}.{json}".lower() in POINTERS
        out.append(f'        f({tag}, "{json}", {card}, {ty}, {str(keep).lower()}),')
    out.append("    ],")
    out.append("};")

needed_lower = {d.lower() for d in needed}
names_lower = {d.lower(): n for d, n in names_of.items()}
used = set()
for line in out:
    m = re.match(r'        f\(\d+, "[^"]*", \w, (\w+)', line)
    if m:
        used.add(m.group(1))
out[TY_IMPORT] = "use super::Ty::{" + ", ".join(sorted(used)) + "};"
missing = [p for p in POINTERS if p.rsplit(".", 1)[0] not in needed_lower
           or norm(p.rsplit(".", 1)[1]) not in names_lower.get(p.rsplit(".", 1)[0], {})]
for p in sorted(missing):
    warnings.append(f"pointer field not in the schema: {p}")
for w in warnings:
    print("warning:", w, file=sys.stderr)
print("\n".join(out))
