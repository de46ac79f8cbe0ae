//! create, update, patch, delete and deletecollection, with admission (defaulting,
//! validation, strict field validation) and managedFields bookkeeping.

use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;
use http::{StatusCode, header};
use k8s_openapi::api::storage::v1::StorageClass;
use serde_json::{Value, json};
use skiff_api::patch::PatchType;
use skiff_api::volume::default_class;
use skiff_api::{Resource, StatusError};
use skiff_store::{Op, Revision, StoreError};

use crate::allocator;
use crate::body::{self, Output};
use crate::handlers::{Ctx, render_one};
use crate::objects::{self, metadata_mut};
use crate::read::Filter;
use crate::webhook::{self, Operation};

const GENERATE_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// Resources whose main endpoint ignores status changes (they have a status subresource).
fn has_status(res: &Resource) -> bool {
    res.has_subresource("status")
}

/// Resources whose spec changes bump metadata.generation (every custom resource, and
/// definitions, as upstream's strategies).
fn tracks_generation(res: &Resource) -> bool {
    is_crd(res)
        || skiff_api::registry::is_custom(res)
        || matches!(
            res.plural,
            "deployments"
                | "replicasets"
                | "replicationcontrollers"
                | "statefulsets"
                | "daemonsets"
                | "jobs"
                | "cronjobs"
                | "poddisruptionbudgets"
                | "ingresses"
                | "networkpolicies"
                | "services"
                | "persistentvolumeclaims"
                | "pods"
                | "flowschemas"
                | "prioritylevelconfigurations"
        )
}

impl Ctx {
    /// The field manager of a write: `fieldManager`, else the user agent's program name.
    pub fn manager(&self) -> String {
        if let Some(m) = self.param("fieldManager").filter(|m| !m.is_empty()) {
            return m.to_string();
        }
        self.headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .and_then(|ua| ua.split('/').next())
            .filter(|s| !s.is_empty())
            .unwrap_or("unknown")
            .to_string()
    }
}

/// Fill or check kind and apiVersion against the URL.
fn check_type(res: &Resource, obj: &mut Value) -> Result<(), StatusError> {
    check_kind(res.kind, &res.api_version(), obj)
}

/// Fill or check an object's kind and apiVersion against the ones an endpoint takes.
pub fn check_kind(kind: &str, want_api: &str, obj: &mut Value) -> Result<(), StatusError> {
    let Some(m) = obj.as_object_mut() else {
        return Err(StatusError::bad_request(
            "Object 'Kind' is missing in request body; expected an object",
        ));
    };
    match m.get("kind").and_then(Value::as_str) {
        None | Some("") => {
            m.insert("kind".into(), json!(kind));
        }
        Some(k) if k == kind => {}
        Some(k) => {
            return Err(StatusError::bad_request(format!(
                "the API version in the data ({}) does not match the expected API version ({want_api}) or kind {k} does not match {kind}",
                m.get("apiVersion").and_then(Value::as_str).unwrap_or(""),
            )));
        }
    }
    match m.get("apiVersion").and_then(Value::as_str) {
        None | Some("") => {
            m.insert("apiVersion".into(), json!(want_api));
        }
        Some(v) if v == want_api => {}
        Some(v) => {
            return Err(StatusError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({want_api})"
            )));
        }
    }
    Ok(())
}

/// Passed skeletons a thread remembers.
const PASSED_SHAPES_KEPT: usize = 256;

thread_local! {
    /// Skeletons (see `skiff_api::skeleton`), with their group, version and kind, that passed
    /// both checks of [`check_shape`] on this thread.
    static PASSED_SHAPES: std::cell::RefCell<std::collections::HashSet<Vec<u8>>> =
        std::cell::RefCell::new(std::collections::HashSet::new());
}

/// The JSON type check and field validation of a written object. Both depend only on the
/// object's skeleton, so a skeleton that passed them before (objects written alike: a
/// ReplicaSet's pods, a scheduler's events) passes again without a walk.
pub(crate) fn check_shape(ctx: &Ctx, obj: &Value) -> Result<Vec<String>, StatusError> {
    let res = ctx.rr.resource;
    if let Some(def) = skiff_api::apiextensions::definition(res) {
        return custom_field_validation(ctx, &def, obj);
    }
    let key = skiff_api::skeleton::key(&[res.group, res.version, res.kind], obj);
    if PASSED_SHAPES.with_borrow(|s| s.contains(&key)) {
        return Ok(Vec::new());
    }
    check_json_types(res, obj)?;
    let warnings = field_validation(ctx, obj)?;
    // With fieldValidation=Ignore, unknown fields were not looked for.
    if warnings.is_empty() && !ignores_unknown_fields(ctx) {
        PASSED_SHAPES.with_borrow_mut(|s| {
            if s.len() >= PASSED_SHAPES_KEPT {
                s.clear();
            }
            s.insert(key);
        });
    }
    Ok(warnings)
}

/// Upstream decodes a body into its Go type before anything else: a field of the wrong JSON
/// type is a 400 that names it, and nothing is stored.
fn check_json_types(res: &Resource, obj: &Value) -> Result<(), StatusError> {
    let Some(def) = skiff_api::schema::definition_for(res.group, res.version, res.kind) else {
        return Ok(());
    };
    match objects::type_mismatch(def, obj) {
        None => Ok(()),
        Some(m) => Err(StatusError::bad_request(format!(
            "{} in version \"{}\" cannot be handled as a {}: {}",
            res.kind,
            res.version,
            res.kind,
            m.message()
        ))),
    }
}

/// A patch whose result does not decode: upstream's 422 on the field `patch`, quoting the
/// patched object.
/// A patched object whose field has the wrong JSON type, refused as upstream's patcher refuses
/// it: a JSON or merge patch's result is decoded from its JSON (the decoder's text, the
/// patched object as the value), a strategic merge patch's result goes through the
/// unstructured converter (its text, the patch as Go prints it as the value).
fn check_patched_json_types(
    res: &Resource,
    patched: &Value,
    ptype: PatchType,
    patch: &Value,
) -> Result<(), StatusError> {
    let Some(def) = skiff_api::schema::definition_for(res.group, res.version, res.kind) else {
        return Ok(());
    };
    match objects::type_mismatch(def, patched) {
        None => Ok(()),
        Some(m) => {
            let (value, detail) = match ptype {
                PatchType::Strategic => (objects::go_text(patch), m.converter.clone()),
                _ => (serde_json::to_string(patched).unwrap_or_default(), m.message()),
            };
            let errs = [skiff_api::FieldError::invalid("patch", &json!(value), detail)];
            Err(StatusError::invalid("", "", "", &errs))
        }
    }
}

/// upstream's `ValidateCreateOptions` / `ValidateUpdateOptions` / `ValidatePatchOptions` on a
/// write's query parameters (`kind` is `CreateOptions`, `UpdateOptions` or `PatchOptions`):
/// `dryRun` may only be `All`, `fieldValidation` only `Ignore`, `Warn` or `Strict`, a
/// `fieldManager` is at most 128 printable characters, and `force` belongs to apply patches
/// only. Checked before anything is written, so an unknown `dryRun` value is refused instead
/// of being taken for a real write or a dry run.
pub fn validate_write_options(ctx: &Ctx, kind: &str, patch_type: Option<PatchType>) -> Result<(), StatusError> {
    use skiff_api::FieldError;
    let mut errs = Vec::new();
    if kind == "PatchOptions" && patch_type != Some(PatchType::Apply) && ctx.param("force").is_some() {
        errs.push(FieldError::forbidden(
            "force",
            "may not be specified for non-apply patch",
        ));
    }
    if let Some(manager) = ctx.param("fieldManager") {
        if manager.len() > FIELD_MANAGER_MAX_LENGTH {
            errs.push(FieldError::too_long("fieldManager", FIELD_MANAGER_MAX_LENGTH));
        }
        for (i, c) in manager.char_indices() {
            // Go's unicode.IsPrint: graphic characters and the ASCII space.
            if c.is_control() || (c.is_whitespace() && c != ' ') {
                errs.push(FieldError::invalid(
                    "fieldManager",
                    &json!(manager),
                    format!("invalid character U+{:04X} (at position {i})", u32::from(c)),
                ));
            }
        }
    }
    if let Some(dry_run) = ctx.param("dryRun")
        && dry_run != "All"
    {
        errs.push(skiff_api::FieldError {
            kind: skiff_api::status::FieldErrorKind::NotSupported {
                value: format!("[]string{{{dry_run:?}}}"),
                supported: vec!["\"All\"".to_string()],
            },
            field: "dryRun".to_string(),
            detail: String::new(),
        });
    }
    if let Some(mode) = ctx.param("fieldValidation")
        && !["", "Ignore", "Strict", "Warn"].contains(&mode)
    {
        errs.push(FieldError::not_supported(
            "fieldValidation",
            &json!(mode),
            &["", "Ignore", "Strict", "Warn"],
        ));
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(StatusError::invalid("meta.k8s.io", kind, "", &errs))
    }
}

/// upstream's `FieldManagerMaxLength`.
const FIELD_MANAGER_MAX_LENGTH: usize = 128;

/// `fieldValidation`: Strict rejects unknown fields, Warn (the default) warns, Ignore ignores.
fn ignores_unknown_fields(ctx: &Ctx) -> bool {
    ctx.param("fieldValidation")
        .is_some_and(|m| m.eq_ignore_ascii_case("Ignore"))
}

fn field_validation(ctx: &Ctx, obj: &Value) -> Result<Vec<String>, StatusError> {
    if ignores_unknown_fields(ctx) {
        return Ok(Vec::new());
    }
    let mode = ctx.param("fieldValidation").unwrap_or("Warn");
    let res = ctx.rr.resource;
    let Some(def) = skiff_api::schema::definition_for(res.group, res.version, res.kind) else {
        return Ok(Vec::new());
    };
    let unknown = skiff_api::schema::unknown_fields(def, obj);
    if unknown.is_empty() {
        return Ok(Vec::new());
    }
    let msgs: Vec<String> = unknown.iter().map(|f| format!("unknown field \"{f}\"")).collect();
    if mode.eq_ignore_ascii_case("Strict") {
        // What the create and update handlers' transformDecodeError makes of the strict
        // decoder's error, the body's kind being known.
        return Err(StatusError::bad_request(format!(
            "{} in version \"{}\" cannot be handled as a {}: strict decoding error: {}",
            res.kind,
            res.version,
            res.kind,
            msgs.join(", ")
        )));
    }
    Ok(msgs)
}

/// Whether `res` is `customresourcedefinitions.apiextensions.k8s.io`.
pub fn is_crd(res: &Resource) -> bool {
    res.group == "apiextensions.k8s.io" && res.plural == "customresourcedefinitions"
}

/// Field validation of a custom object: the fields its schema would prune are its unknown
/// fields (a warning each, or the error under `fieldValidation=Strict`).
fn custom_field_validation(
    ctx: &Ctx,
    def: &skiff_api::apiextensions::Definition,
    obj: &Value,
) -> Result<Vec<String>, StatusError> {
    if ignores_unknown_fields(ctx) {
        return Ok(Vec::new());
    }
    let Some(schema) = def.version(ctx.rr.resource.version).and_then(|v| v.schema.as_ref()) else {
        return Ok(Vec::new());
    };
    let mut copy = obj.clone();
    let unknown = skiff_api::apiextensions::pruning::prune(schema, &mut copy);
    if unknown.is_empty() {
        return Ok(Vec::new());
    }
    let msgs: Vec<String> = unknown.iter().map(|f| format!("unknown field \"{f}\"")).collect();
    if ctx
        .param("fieldValidation")
        .is_some_and(|m| m.eq_ignore_ascii_case("Strict"))
    {
        let res = ctx.rr.resource;
        return Err(StatusError::bad_request(format!(
            "{} in version \"{}\" cannot be handled as a {}: strict decoding error: {}",
            res.kind,
            res.version,
            res.kind,
            msgs.join(", ")
        )));
    }
    Ok(msgs)
}

fn random_suffix() -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..5)
        .map(|_| GENERATE_ALPHABET[rng.random_range(0..GENERATE_ALPHABET.len())] as char)
        .collect()
}

/// Upstream's longest generated name (63) less the random suffix.
const MAX_GENERATED_BASE: usize = 63 - 5;

/// A name from `generateName`: the prefix, cut to leave room for the suffix, as upstream's
/// SimpleNameGenerator does, then five random characters.
fn generated_name(base: &str) -> String {
    let mut end = base.len().min(MAX_GENERATED_BASE);
    while !base.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{}", &base[..end], random_suffix())
}

/// An update may leave metadata.uid out (the stored one stays) but not change it.
fn changed_uid(old: &Value, new: &Value) -> Option<skiff_api::FieldError> {
    let uid = objects::uid(new);
    (!uid.is_empty() && uid != objects::uid(old))
        .then(|| skiff_api::FieldError::invalid("metadata.uid", &json!(uid), "field is immutable"))
}

/// Upstream's ValidateNoNewFinalizers: once deletion has started, finalizers may only go.
fn no_new_finalizers(old: &Value, new: &Value) -> Option<skiff_api::FieldError> {
    objects::deletion_timestamp(old)?;
    let before = objects::finalizers(old);
    let mut extra: Vec<String> = objects::finalizers(new)
        .into_iter()
        .filter(|f| !before.contains(f))
        .collect();
    if extra.is_empty() {
        return None;
    }
    extra.sort();
    extra.dedup();
    let list = extra.iter().map(|f| format!("{f:?}")).collect::<Vec<_>>().join(", ");
    Some(skiff_api::FieldError::forbidden(
        "metadata.finalizers",
        format!(
            "no new finalizers can be added if the object is being deleted, found new finalizers []string{{{list}}}"
        ),
    ))
}

/// Upstream's shouldDeleteDuringUpdate: an update removes the object when deletion was
/// requested, no finalizer is left and no grace period is pending (a pod on a node keeps
/// its deletionGracePeriodSeconds until the node confirms).
fn delete_during_update(res: &Resource, old: &Value, new: &Value) -> bool {
    if objects::deletion_timestamp(old).is_none() || !objects::finalizers(new).is_empty() || namespace_pending(res, new)
    {
        return false;
    }
    objects::metadata(old)
        .and_then(|m| m.get("deletionGracePeriodSeconds"))
        .and_then(Value::as_i64)
        .is_none_or(|g| g == 0)
}

/// Namespaced writes need an existing namespace that is not terminating.
async fn check_namespace(ctx: &Ctx, name: &str) -> Result<(), StatusError> {
    let res = ctx.rr.resource;
    if !res.namespaced {
        return Ok(());
    }
    let ns_res =
        skiff_api::registry::lookup("", "v1", "namespaces").ok_or_else(|| StatusError::internal("no namespaces"))?;
    // Upstream's NamespaceLifecycle reads its informer's cache, and asks the store itself only
    // for a namespace the cache does not hold (one created a moment ago on another replica).
    let key = objects::key(ns_res, "", &ctx.rr.namespace);
    let store = &ctx.state.store;
    let cached = store.get_cached(&key).await.map_err(|e| ctx.store_err(e))?;
    let kv = match cached {
        Some(kv) => kv,
        None => store
            .get(&key)
            .await
            .map_err(|e| ctx.store_err(e))?
            .ok_or_else(|| StatusError::not_found("", "namespaces", &ctx.rr.namespace))?,
    };
    // Every namespaced create passes here: the namespace is parsed only when it may be terminating.
    const DELETION: &[u8] = b"\"deletionTimestamp\"";
    if kv.value.windows(DELETION.len()).any(|w| w == DELETION)
        && let Some(ns) = objects::decode_kv(&kv)
        && objects::deletion_timestamp(&ns).is_some()
    {
        let mut e = StatusError::forbidden(format!(
            "{} \"{}\" is forbidden: unable to create new content in namespace {} because it is being terminated",
            res.qualified_plural(),
            name,
            ctx.rr.namespace
        ));
        e.details.kind = Some(res.plural.to_string());
        e.details.name = Some(name.to_string());
        // Upstream's NamespaceLifecycle names the reason as a cause clients branch on.
        e.details.causes.push(skiff_api::status::Cause {
            reason: "NamespaceTerminating".into(),
            message: format!("namespace {} is being terminated", ctx.rr.namespace),
            field: "metadata.namespace".into(),
        });
        return Err(e);
    }
    Ok(())
}

/// Defaulting then validation (of a write through `subresource`, "" for the main resource).
fn admit(res: &Resource, subresource: &str, obj: &mut Value, old: Option<&Value>) -> Result<(), StatusError> {
    if let Some(def) = skiff_api::apiextensions::definition(res) {
        // A custom object: pruned, defaulted, then checked against its schema and as any
        // object's metadata is.
        let (_, mut errs) = skiff_api::apiextensions::admit(&def, res, obj, old);
        let mut all = skiff_api::validation::validate_write(res, subresource, obj, old);
        all.append(&mut errs);
        if all.is_empty() {
            return Ok(());
        }
        return Err(StatusError::invalid(res.group, res.kind, objects::name(obj), &all));
    }
    skiff_api::defaults::apply_defaults(res, obj);
    if is_crd(res) {
        skiff_api::apiextensions::apply_definition_defaults(obj);
    }
    // What upstream's Go types always write, present as its encoder writes it.
    skiff_api::written::fill(res, obj);
    let mut errs = skiff_api::validation::validate_write(res, subresource, obj, old);
    if is_crd(res) && subresource.is_empty() {
        errs.extend(skiff_api::apiextensions::validate_definition(obj, old));
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(StatusError::invalid(res.group, res.kind, objects::name(obj), &errs))
    }
}

/// The admission webhooks of a create or update, after the built-in mutating admission (as
/// upstream orders its plugins): the mutating webhooks, the object defaulted and validated
/// again when they changed it (upstream's strategy validates what admission produced), then
/// the ValidatingAdmissionPolicies and the validating webhooks.
async fn admit_webhooks(
    ctx: &Ctx,
    operation: Operation,
    obj: &mut Value,
    old: Option<&Value>,
) -> Result<(), StatusError> {
    if webhook::mutate(ctx, operation, Some(obj), old).await? {
        let res = ctx.rr.resource;
        check_type(res, obj)?;
        admit(res, &ctx.rr.subresource, obj, old)?;
    }
    crate::validatingadmissionpolicy::validate(ctx, operation, Some(obj), old).await?;
    webhook::validate(ctx, operation, Some(obj), old).await
}

/// Record the writer's fields in managedFields, as upstream does for every write.
fn manage_fields(ctx: &Ctx, old: Option<&Value>, new: &mut Value, operation: &str) {
    let res = ctx.rr.resource;
    let manager = ctx.manager();
    let def = skiff_api::apiextensions::patch_definition(res);
    let def = def.as_str();
    let sub = ctx.rr.subresource.as_str();
    if operation == "Apply" {
        // apply() already recorded the applier's fields.
        return;
    }
    skiff_api::patch::apply::record_update(old, new, &manager, sub, def, &objects::now_rfc3339());
}

pub async fn create(ctx: &Ctx, bytes: Bytes) -> Result<Response, StatusError> {
    validate_write_options(ctx, "CreateOptions", None)?;
    let mut obj = body::decode_object(&ctx.headers, &bytes, ctx.rr.resource.kind)?;
    ctx.audit_annotations.object_name(objects::name(&obj));
    // As upstream: a create names no version to compare against.
    if !objects::resource_version(&obj).is_empty() {
        return Err(StatusError::bad_request(
            "resourceVersion should not be set on objects to be created",
        ));
    }
    let (obj, warnings, stored) = create_stored(ctx, &mut obj, "Update").await?;
    // The stored bytes with their resourceVersion are the object as created: the reply reuses
    // them instead of encoding the object a second time.
    let mut r = match stored {
        Some((bytes, rev)) if ctx.output() == Output::Object => body::object_response(
            StatusCode::CREATED,
            objects::served_bytes(ctx.rr.resource, objects::with_resource_version(&bytes, rev)),
        ),
        _ => render_one(ctx, StatusCode::CREATED, &obj),
    };
    body::add_warnings(&mut r, &warnings);
    Ok(r)
}

/// Create `obj` (already decoded) in the request's resource; returns the stored object
/// (taken out of `obj`).
/// `operation` is "Update" for ordinary creates, "Apply" when server-side apply already
/// recorded the applier's managedFields.
pub async fn create_object(ctx: &Ctx, obj: &mut Value, operation: &str) -> Result<(Value, Vec<String>), StatusError> {
    create_stored(ctx, obj, operation).await.map(|(o, w, _)| (o, w))
}

/// The stored form of a created object and its revision (none on a dry run).
type Stored = Option<(Vec<u8>, Revision)>;

/// As [`create_object`], also returning what was stored.
async fn create_stored(
    ctx: &Ctx,
    obj: &mut Value,
    operation: &str,
) -> Result<(Value, Vec<String>, Stored), StatusError> {
    let res = ctx.rr.resource;
    check_type(res, obj)?;
    let mut warnings = check_shape(ctx, obj)?;
    warnings.extend(crate::defaultingressclass::warnings_on_create(ctx, obj));
    {
        let md = metadata_mut(obj);
        let ns_in_body = md.get("namespace").and_then(Value::as_str).unwrap_or("").to_string();
        if res.namespaced {
            if !ns_in_body.is_empty() && ns_in_body != ctx.rr.namespace {
                return Err(StatusError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            md.insert("namespace".into(), json!(ctx.rr.namespace));
        } else {
            md.remove("namespace");
        }
        let name = md.get("name").and_then(Value::as_str).unwrap_or("").to_string();
        if name.is_empty()
            && let Some(g) = md.get("generateName").and_then(Value::as_str).filter(|g| !g.is_empty())
        {
            let n = generated_name(g);
            md.insert("name".into(), json!(n));
        }
        md.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
        md.insert("creationTimestamp".into(), json!(objects::now_rfc3339()));
        md.remove("deletionTimestamp");
        md.remove("deletionGracePeriodSeconds");
        md.remove("resourceVersion");
        md.remove("selfLink");
        if operation != "Apply" {
            md.remove("managedFields");
        }
        if tracks_generation(res) || md.contains_key("generation") {
            md.insert("generation".into(), json!(1));
        }
    }
    let name = objects::name(obj).to_string();
    if name.is_empty() {
        let errs = [skiff_api::FieldError::required(
            "metadata.name",
            "name or generateName is required",
        )];
        return Err(StatusError::invalid(res.group, res.kind, "", &errs));
    }
    check_namespace(ctx, &name).await?;
    if res.plural == "pods" {
        admit_priority(ctx, obj).await?;
        crate::runtimeclass::admit(ctx, obj).await?;
    }
    if res.plural == "persistentvolumeclaims" && res.group.is_empty() {
        admit_default_storage_class(ctx, obj).await?;
    }
    crate::defaultingressclass::admit(ctx, obj).await?;
    reset_status_on_create(res, obj);
    if crate::certificates::is_csr(res) {
        crate::certificates::prepare_create(&ctx.user, obj);
    }
    if res.group.is_empty() && res.plural == "pods" {
        // Mutating admission sees the defaulted object, as upstream's decoding defaults it
        // before admission runs (so a container's limit already gave it a request).
        skiff_api::defaults::apply_defaults(res, obj);
        crate::limitranger::mutate(ctx, obj).await?;
        crate::serviceaccount_admission::mutate(ctx, obj).await?;
        // The QoS class is the system's, computed from the admitted containers (upstream's
        // PrepareForCreate runs after mutating admission).
        if let Some(status) = obj.get_mut("status").and_then(Value::as_object_mut) {
            status.remove("qosClass");
        }
    }
    admit(res, "", obj, None)?;
    if crate::certificates::is_csr(res) {
        crate::certificates::admit(ctx, obj, None).await?;
    }
    crate::escalation::admit(ctx, obj, None).await?;
    crate::serviceaccount_admission::admit_mirror_pod_create(res, obj)?;
    crate::noderestriction::admit(ctx, obj, None).await?;
    manage_fields(ctx, None, obj, operation);
    // Mutating admission runs after the creator's fields are recorded, as upstream's create
    // handler orders them: the finalizer is the system's, not the creator's.
    crate::storageobjectinuseprotection::admit(res, &ctx.rr.subresource, obj);
    admit_webhooks(ctx, Operation::Create, obj, None).await?;
    let name = objects::name(obj).to_string();
    // Validating admission, ResourceQuota last: the quota is charged only for a write every
    // other check let through.
    crate::podsecurity::admit(ctx, obj, None).await?;
    crate::limitranger::validate(ctx, obj, None).await?;
    crate::resourcequota::admit(ctx, obj, None).await?;
    let key = objects::key(res, &ctx.rr.namespace, &name);
    if ctx.dry_run() {
        return Ok((std::mem::take(obj), warnings, None));
    }
    if is_service(res) {
        return create_service(ctx, obj, &key, &name, warnings).await;
    }
    let bytes = objects::encode_for_storage(res, obj);
    let kv = ctx
        .state
        .store
        .create(&key, bytes.clone())
        .await
        .map_err(|e| crate::read::store_error(res.group, res.plural, &name, e))?;
    objects::set_resource_version(obj, kv.mod_revision);
    Ok((std::mem::take(obj), warnings, Some((bytes, kv.mod_revision))))
}

fn is_service(res: &Resource) -> bool {
    res.group.is_empty() && res.plural == "services"
}

/// A Service is created in one transaction with its ClusterIP and NodePorts; a random pick that
/// another write took meanwhile is drawn again.
async fn create_service(
    ctx: &Ctx,
    obj: &mut Value,
    key: &str,
    name: &str,
    warnings: Vec<String>,
) -> Result<(Value, Vec<String>, Stored), StatusError> {
    let res = ctx.rr.resource;
    let requested = obj.clone();
    for _ in 0..8 {
        *obj = requested.clone();
        let alloc = allocator::allocate(&*ctx.state.store, &ctx.state.service_ranges, None, obj).await?;
        if ctx.dry_run() {
            return Ok((std::mem::take(obj), warnings, None));
        }
        let bytes = objects::encode_for_store(obj);
        let mut ops = vec![Op::Create {
            key: key.to_string(),
            value: bytes.clone(),
        }];
        ops.extend(alloc.ops);
        match ctx.state.store.txn(ops).await {
            Ok(kvs) => {
                let rev = kvs.first().map_or(0, |kv| kv.mod_revision);
                objects::set_resource_version(obj, rev);
                return Ok((std::mem::take(obj), warnings, Some((bytes, rev))));
            }
            // A random pick that another write took meanwhile, or a static request taken between
            // the check and the commit (the next check reports it).
            Err(StoreError::AlreadyExists(k)) if k != key => continue,
            Err(e) => return Err(crate::read::store_error(res.group, res.plural, name, e)),
        }
    }
    Err(StatusError::modified(res.group, res.plural, name))
}

/// Deletes the stored object at `rev`, a Service with what it holds.
async fn delete_stored(ctx: &Ctx, old: &Value, rev: Revision) -> Result<(), StoreError> {
    let key = ctx.key();
    if is_service(ctx.rr.resource) {
        let released = allocator::release(&*ctx.state.store, old)
            .await
            .map_err(|e| StoreError::Backend(anyhow::anyhow!("{}", e.message)))?;
        let mut ops = vec![Op::Delete {
            key,
            expected: Some(rev),
        }];
        ops.extend(released);
        return ctx.state.store.txn(ops).await.map(drop);
    }
    ctx.state.store.delete(&key, Some(rev)).await.map(drop)
}

const GLOBAL_DEFAULT: &[u8] = b"\"globalDefault\":true";

/// Every stored object of a cluster-scoped resource, as the store holds it (admission plugins
/// look through them for a default).
/// Every object of a cluster-scoped kind, as admission plugins read them: from the replica's
/// memory, as upstream's plugins read their informers' caches.
async fn stored_cluster_objects(ctx: &Ctx, res: &Resource) -> Result<Vec<skiff_store::KeyValue>, StatusError> {
    ctx.state
        .store
        .list_cached(&objects::prefix(res, ""))
        .await
        .map_err(|e| ctx.store_err(e))
}

/// The DefaultStorageClass admission plugin: a claim created without a class (neither
/// `spec.storageClassName`, even empty, nor the beta annotation) gets the default
/// StorageClass; with several defaults, the newest (then the first by name).
async fn admit_default_storage_class(ctx: &Ctx, pvc: &mut Value) -> Result<(), StatusError> {
    let has_class = pvc.pointer("/spec/storageClassName").is_some_and(|v| !v.is_null())
        || pvc
            .pointer("/metadata/annotations/volume.beta.kubernetes.io~1storage-class")
            .is_some();
    if has_class {
        return Ok(());
    }
    let Some(classes) = skiff_api::registry::lookup("storage.k8s.io", "v1", "storageclasses") else {
        return Ok(());
    };
    // Only classes that mention the annotation need decoding (this runs for every claim).
    let candidates: Vec<StorageClass> = stored_cluster_objects(ctx, classes)
        .await?
        .iter()
        .filter(|kv| {
            kv.value
                .windows(b"is-default-class".len())
                .any(|w| w == b"is-default-class")
        })
        .filter_map(objects::decode_kv)
        .filter_map(|v| serde_json::from_value(v).ok())
        .collect();
    if let Some(class) = default_class(&candidates).and_then(|c| c.metadata.name.as_deref())
        && let Some(spec) = pvc.get_mut("spec").and_then(Value::as_object_mut)
    {
        spec.insert("storageClassName".into(), json!(class));
    }
    Ok(())
}

/// The Priority admission plugin: resolve `priorityClassName` (or the global default class)
/// into `spec.priority` and `spec.preemptionPolicy`.
async fn admit_priority(ctx: &Ctx, pod: &mut Value) -> Result<(), StatusError> {
    let pcs = skiff_api::registry::lookup("scheduling.k8s.io", "v1", "priorityclasses")
        .ok_or_else(|| StatusError::internal("no priorityclasses"))?;
    let class_name = pod
        .pointer("/spec/priorityClassName")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let class = if class_name.is_empty() {
        // Only a class marked as the global default needs parsing (this runs for every pod).
        stored_cluster_objects(ctx, pcs)
            .await?
            .iter()
            .filter(|kv| kv.value.windows(GLOBAL_DEFAULT.len()).any(|w| w == GLOBAL_DEFAULT))
            .filter_map(objects::decode_kv)
            .find(|pc| pc.get("globalDefault").and_then(Value::as_bool) == Some(true))
    } else {
        // From memory, and from the store itself when memory does not hold the class yet.
        let key = objects::key(pcs, "", &class_name);
        let store = &ctx.state.store;
        let kv = match store.get_cached(&key).await.map_err(|e| ctx.store_err(e))? {
            Some(kv) => Some(kv),
            None => store.get(&key).await.map_err(|e| ctx.store_err(e))?,
        };
        match kv.and_then(|kv| objects::decode_kv(&kv)) {
            Some(pc) => Some(pc),
            None => {
                let mut e = StatusError::forbidden(format!(
                    "pods \"{}\" is forbidden: no PriorityClass with name {class_name} was found",
                    objects::name(pod)
                ));
                e.details.kind = Some("pods".into());
                e.details.name = Some(objects::name(pod).to_string());
                return Err(e);
            }
        }
    };
    let (value, policy) = match &class {
        Some(pc) => (
            pc.get("value").and_then(Value::as_i64).unwrap_or(0),
            pc.get("preemptionPolicy")
                .and_then(Value::as_str)
                .unwrap_or("PreemptLowerPriority")
                .to_string(),
        ),
        None => (0, "PreemptLowerPriority".to_string()),
    };
    if let Some(given) = pod.pointer("/spec/priority").and_then(Value::as_i64)
        && given != value
    {
        let errs = [skiff_api::FieldError::forbidden(
            "spec.priority",
            "the integer value of priority must not be provided in pod spec; priority admission controller computed the priority from the given PriorityClass name",
        )];
        return Err(StatusError::invalid("", "Pod", objects::name(pod), &errs));
    }
    if let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) {
        spec.insert("priority".into(), json!(value));
        if let Some(pc) = &class
            && class_name.is_empty()
        {
            spec.insert("priorityClassName".into(), json!(objects::name(pc)));
        }
        spec.entry("preemptionPolicy").or_insert_with(|| json!(policy));
    }
    Ok(())
}

/// As upstream's PrepareForCreate: status is the system's, not the creator's.
fn reset_status_on_create(res: &Resource, obj: &mut Value) {
    let Some(m) = obj.as_object_mut() else { return };
    match res.plural {
        "pods" => {
            // Defaulting computes qosClass from the spec; the client's status is not kept.
            m.insert("status".into(), json!({"phase": "Pending"}));
        }
        // Upstream's empty ReplicationControllerStatus: `replicas` is not omitted when zero.
        "replicationcontrollers" => {
            m.insert("status".into(), json!({"replicas": 0}));
        }
        "deployments"
        | "replicasets"
        | "statefulsets"
        | "daemonsets"
        | "jobs"
        | "cronjobs"
        | "poddisruptionbudgets"
        | "ingresses"
        | "volumeattachments"
        | "resourcequotas"
        | "apiservices"
        | "flowschemas"
        | "prioritylevelconfigurations" => {
            m.remove("status");
        }
        "namespaces" => {
            m.insert("status".into(), json!({"phase": "Active"}));
        }
        // Upstream's empty ServiceStatus: its `loadBalancer` struct is always written.
        "services" if res.group.is_empty() => {
            m.insert("status".into(), json!({"loadBalancer": {}}));
        }
        "customresourcedefinitions" if is_crd(res) => {
            m.insert(
                "status".into(),
                json!({"conditions": [], "acceptedNames": {"plural": "", "kind": ""}, "storedVersions": []}),
            );
            // As upstream's strategy: the definition's objects are deleted before it is.
            let md = metadata_mut(obj);
            let mut finalizers: Vec<Value> = md
                .get("finalizers")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let f = json!(skiff_api::apiextensions::CLEANUP_FINALIZER);
            if !finalizers.contains(&f) {
                finalizers.push(f);
            }
            md.insert("finalizers".into(), Value::Array(finalizers));
        }
        _ if res.has_subresource("status") && skiff_api::registry::is_custom(res) => {
            m.remove("status");
        }
        _ => {}
    }
}

/// How an update treats the parts of the object.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum UpdateScope {
    /// The main resource: status changes are ignored where a status subresource exists.
    Main,
    /// The status subresource: only status changes (a CertificateSigningRequest's `approval`
    /// subresource too, whose strategy then keeps only the conditions).
    Status,
    /// A pod's `ephemeralcontainers` subresource: only `spec.ephemeralContainers` changes.
    EphemeralContainers,
}

/// Outcome of a write to an existing object.
pub enum Written {
    Updated(Value),
    /// Finalization finished: the object is gone.
    Deleted(Value),
}

impl Written {
    pub fn object(&self) -> &Value {
        match self {
            Written::Updated(v) | Written::Deleted(v) => v,
        }
    }
}

/// Turn `new` (the desired object) into the stored successor of `old` (at `rev`).
pub async fn finish_update(
    ctx: &Ctx,
    old: &Value,
    mut new: Value,
    rev: Revision,
    scope: UpdateScope,
    operation: &str,
) -> Result<Written, StatusError> {
    let res = ctx.rr.resource;
    check_type(res, &mut new)?;
    let old_md = objects::metadata(old).cloned().unwrap_or_default();
    if let Some(e) = changed_uid(old, &new) {
        return Err(StatusError::invalid(res.group, res.kind, objects::name(old), &[e]));
    }
    if crate::certificates::is_csr(res) {
        // Each of the three writes changes its own part (metadata comes below).
        new = crate::certificates::prepare_update(&ctx.rr.subresource, old, new);
    } else if scope == UpdateScope::Status {
        crate::noderestriction::admit_pod_status_labels(ctx, &new, old)?;
        // Only status (and nothing else) changes through the status subresource.
        let status = new.get("status").cloned();
        let mut merged = old.clone();
        if let Some(m) = merged.as_object_mut() {
            match status {
                Some(s) => m.insert("status".into(), s),
                None => m.remove("status"),
            };
        }
        new = merged;
    } else if scope == UpdateScope::EphemeralContainers {
        // upstream's dropNonEphemeralContainerUpdates: everything else stays as stored.
        let ephemeral = new.pointer("/spec/ephemeralContainers").cloned();
        let mut merged = old.clone();
        if let Some(spec) = merged.get_mut("spec").and_then(Value::as_object_mut) {
            match ephemeral {
                Some(e) => spec.insert("ephemeralContainers".into(), e),
                None => spec.remove("ephemeralContainers"),
            };
        }
        new = merged;
    } else if has_status(res)
        && let (Some(m), Some(old_status)) = (new.as_object_mut(), old.get("status"))
    {
        m.insert("status".into(), old_status.clone());
    }
    {
        let md = metadata_mut(&mut new);
        for k in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "namespace",
            "generation",
        ] {
            match old_md.get(k) {
                Some(v) => md.insert(k.to_string(), v.clone()),
                None => md.remove(k),
            };
        }
        md.remove("resourceVersion");
        md.remove("selfLink");
        if md.get("name").and_then(Value::as_str).unwrap_or("").is_empty() {
            md.insert("name".into(), old_md.get("name").cloned().unwrap_or(json!("")));
        }
    }
    if let Some(e) = no_new_finalizers(old, &new) {
        return Err(StatusError::invalid(res.group, res.kind, objects::name(&new), &[e]));
    }
    admit(res, &ctx.rr.subresource, &mut new, Some(old))?;
    // The spec is compared defaulted, as upstream's strategies compare decoded objects: a
    // field the writer left for the defaults to fill is no change.
    if scope == UpdateScope::Main
        && spec_changed(old, &new)
        && objects::metadata(old).and_then(|m| m.get("generation")).is_some()
    {
        let g = old_md.get("generation").and_then(Value::as_i64).unwrap_or(1);
        metadata_mut(&mut new).insert("generation".into(), json!(g + 1));
    }
    if crate::certificates::is_csr(res) {
        crate::certificates::admit(ctx, &new, Some(old)).await?;
    }
    if scope == UpdateScope::Main && res.group.is_empty() && res.plural == "persistentvolumeclaims" {
        crate::persistentvolumeclaimresize::admit(ctx, &new, old).await?;
    }
    crate::escalation::admit(ctx, &new, Some(old)).await?;
    crate::noderestriction::admit(ctx, &new, Some(old)).await?;
    manage_fields(ctx, Some(old), &mut new, operation);
    admit_webhooks(ctx, Operation::Update, &mut new, Some(old)).await?;
    let key = ctx.key();
    if delete_during_update(res, old, &new) {
        if ctx.dry_run() {
            return Ok(Written::Deleted(new));
        }
        delete_stored(ctx, old, rev).await.map_err(|e| ctx.store_err(e))?;
        return Ok(Written::Deleted(new));
    }
    if matches!(scope, UpdateScope::Main | UpdateScope::EphemeralContainers) {
        crate::podsecurity::admit(ctx, &new, Some(old)).await?;
    }
    if scope == UpdateScope::Main {
        crate::limitranger::validate(ctx, &new, Some(old)).await?;
        crate::resourcequota::admit(ctx, &new, Some(old)).await?;
    }
    let alloc = if is_service(res) && scope == UpdateScope::Main {
        allocator::allocate(&*ctx.state.store, &ctx.state.service_ranges, Some(old), &mut new).await?
    } else {
        allocator::Allocation::default()
    };
    let bytes = objects::encode_for_storage(res, &new);
    let mut old_cmp = old.clone();
    if let Some(m) = old_cmp.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
    }
    if bytes == objects::encode_for_storage(res, &old_cmp) {
        objects::set_resource_version(&mut new, rev);
        return Ok(Written::Updated(new));
    }
    if ctx.dry_run() {
        // Upstream's dry-run storage updates the object it read: the answer carries its
        // resourceVersion (what `kubectl diff --server-side` compares against).
        objects::set_resource_version(&mut new, rev);
        return Ok(Written::Updated(new));
    }
    let kv = if alloc.ops.is_empty() {
        ctx.state.store.update(&key, bytes, rev).await
    } else {
        let mut ops = vec![Op::Update {
            key: key.clone(),
            value: bytes,
            expected: rev,
        }];
        ops.extend(alloc.ops);
        ctx.state.store.txn(ops).await.and_then(|kvs| {
            kvs.into_iter()
                .next()
                .ok_or_else(|| StoreError::Backend(anyhow::anyhow!("an empty transaction result")))
        })
    }
    .map_err(|e| match e {
        // Another write took an allocation meanwhile: the client retries, as on any conflict.
        StoreError::AlreadyExists(k) if k != key => StatusError::modified(res.group, res.plural, objects::name(old)),
        e => ctx.store_err(e),
    })?;
    objects::set_resource_version(&mut new, kv.mod_revision);
    Ok(Written::Updated(new))
}

/// A namespace being deleted stays until its spec.finalizers are empty too.
fn namespace_pending(res: &Resource, obj: &Value) -> bool {
    res.plural == "namespaces"
        && obj
            .pointer("/spec/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
}

fn spec_changed(old: &Value, new: &Value) -> bool {
    let strip = |v: &Value| -> Value {
        let mut v = v.clone();
        if let Some(m) = v.as_object_mut() {
            m.remove("metadata");
            m.remove("status");
        }
        v
    };
    strip(old) != strip(new)
}

fn written_response(ctx: &Ctx, w: &Written, warnings: &[String]) -> Response {
    let mut r = render_one(ctx, StatusCode::OK, w.object());
    body::add_warnings(&mut r, warnings);
    r
}

pub async fn update(ctx: &Ctx, bytes: Bytes) -> Result<Response, StatusError> {
    let obj = body::decode_object(&ctx.headers, &bytes, ctx.rr.resource.kind)?;
    let (w, warnings) = update_object(ctx, obj, UpdateScope::Main).await?;
    Ok(written_response(ctx, &w, &warnings))
}

/// PUT: replace the object, honouring a resourceVersion precondition.
pub async fn update_object(
    ctx: &Ctx,
    mut obj: Value,
    scope: UpdateScope,
) -> Result<(Written, Vec<String>), StatusError> {
    validate_write_options(ctx, "UpdateOptions", None)?;
    let res = ctx.rr.resource;
    check_type(res, &mut obj)?;
    let body_name = objects::name(&obj).to_string();
    if !body_name.is_empty() && body_name != ctx.rr.name {
        return Err(StatusError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({})",
            ctx.rr.name
        )));
    }
    let warnings = check_shape(ctx, &obj)?;
    let precondition = objects::resource_version(&obj).to_string();
    let (old, rev) = ctx.current().await?;
    if !precondition.is_empty() && precondition != rev.to_string() {
        return Err(StatusError::modified(res.group, res.plural, &ctx.rr.name));
    }
    let w = finish_update(ctx, &old, obj, rev, scope, "Update").await?;
    Ok((w, warnings))
}

pub async fn patch(ctx: &Ctx, bytes: Bytes) -> Result<Response, StatusError> {
    let (w, code) = patch_object(ctx, bytes, UpdateScope::Main).await?;
    Ok(render_one(ctx, code, w.object()))
}

/// Parse the patch document of a request.
pub(crate) fn patch_document(ctx: &Ctx, bytes: &Bytes) -> Result<(PatchType, Value), StatusError> {
    let ct = ctx
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let ptype = PatchType::from_content_type(ct).ok_or_else(|| {
        StatusError::unsupported_media_type(
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json",
        )
    })?;
    if bytes.len() > body::MAX_BODY_BYTES {
        return Err(StatusError::too_large(format!(
            "Request entity too large: limit is {}",
            body::MAX_BODY_BYTES
        )));
    }
    let doc = match ptype {
        PatchType::Apply => body::decode_yaml(bytes)?,
        _ => serde_json::from_slice(bytes).map_err(|e| {
            // As upstream's patchers word it: json-patch's merge says only that the patch is
            // bad; the strategic patcher and json-patch's decoder give Go's decoder's error.
            let go = skiff_api::gojson::syntax_error(bytes).unwrap_or_else(|| e.to_string());
            match ptype {
                PatchType::Merge => StatusError::bad_request("Invalid JSON Patch"),
                _ => StatusError::bad_request(go),
            }
        })?,
    };
    if ptype == PatchType::Json {
        let kind = match &doc {
            // Go decodes null as an empty patch.
            Value::Null => return Ok((ptype, json!([]))),
            Value::Array(_) => return Ok((ptype, doc)),
            Value::Object(_) => "object",
            Value::String(_) => "string",
            Value::Number(_) => "number",
            Value::Bool(_) => "bool",
        };
        return Err(StatusError::bad_request(format!(
            "json: cannot unmarshal {kind} into Go value of type jsonpatch.Patch"
        )));
    }
    Ok((ptype, doc))
}

pub async fn patch_object(ctx: &Ctx, bytes: Bytes, scope: UpdateScope) -> Result<(Written, StatusCode), StatusError> {
    let res = ctx.rr.resource;
    let (ptype, doc) = patch_document(ctx, &bytes)?;
    if ptype == PatchType::Strategic && skiff_api::registry::is_custom(res) {
        // As upstream: custom resources take no strategic merge patch.
        return Err(StatusError::unsupported_media_type(
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        ));
    }
    validate_write_options(ctx, "PatchOptions", Some(ptype))?;
    let def = skiff_api::apiextensions::patch_definition(res);
    let def = def.as_str();
    let force = ctx.flag("force");
    let manager = ctx.manager();
    if ptype == PatchType::Apply && ctx.param("fieldManager").is_none_or(str::is_empty) {
        return Err(StatusError::bad_request(
            "PATCH /apply requests require a fieldManager parameter",
        ));
    }
    for _ in 0..8 {
        let current = match ctx.current().await {
            Ok(c) => Some(c),
            Err(e) if e.code == 404 && ptype == PatchType::Apply && scope == UpdateScope::Main => None,
            Err(e) => return Err(e),
        };
        let Some((old, rev)) = current else {
            // Server-side apply creates what does not exist.
            let mut applied = skiff_api::patch::apply::apply(None, &doc, &manager, force, def, &objects::now_rfc3339())
                .map_err(|e| apply_error(ctx, e))?;
            metadata_mut(&mut applied).insert("name".into(), json!(ctx.rr.name));
            let (obj, _) = create_object(ctx, &mut applied, "Apply").await?;
            return Ok((Written::Updated(obj), StatusCode::CREATED));
        };
        let new = match ptype {
            PatchType::Json => skiff_api::patch::json::json_patch(&old, &doc).map_err(patch_error)?,
            PatchType::Merge => skiff_api::patch::merge::merge_patch(&old, &doc).map_err(patch_error)?,
            PatchType::Strategic => {
                skiff_api::patch::strategic::strategic_merge(&old, &doc, def).map_err(patch_error)?
            }
            PatchType::Apply => {
                skiff_api::patch::apply::apply(Some(&old), &doc, &manager, force, def, &objects::now_rfc3339())
                    .map_err(|e| apply_error(ctx, e))?
            }
        };
        if ptype == PatchType::Apply {
            check_json_types(res, &new)?;
        } else {
            check_patched_json_types(res, &new, ptype, &doc)?;
        }
        let precondition = objects::resource_version(&new).to_string();
        if !precondition.is_empty() && precondition != rev.to_string() {
            return Err(StatusError::modified(res.group, res.plural, &ctx.rr.name));
        }
        let operation = if ptype == PatchType::Apply { "Apply" } else { "Update" };
        // A conflict with a concurrent writer: patch the fresh object again. A resourceVersion the
        // patch itself sets fails the check above on the next round.
        match finish_update(ctx, &old, new, rev, scope, operation).await {
            Err(e) if e.reason == "Conflict" => continue,
            other => return other.map(|w| (w, StatusCode::OK)),
        }
    }
    Err(StatusError::modified(res.group, res.plural, &ctx.rr.name))
}

fn patch_error(e: skiff_api::patch::PatchError) -> StatusError {
    e.to_status()
}

fn apply_error(_ctx: &Ctx, e: skiff_api::patch::apply::ApplyError) -> StatusError {
    skiff_api::patch::PatchError::from(e).to_status()
}

/// DeleteOptions from the body or the query.
#[derive(Clone, Default, Debug)]
pub struct DeleteOpts {
    pub grace: Option<i64>,
    pub propagation: Option<String>,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    /// `dryRun` in the body (kubectl's `delete --dry-run=server` sends it there, not in the query).
    pub dry_run: bool,
}

pub fn delete_options(ctx: &Ctx, bytes: &Bytes) -> Result<DeleteOpts, StatusError> {
    let mut o = DeleteOpts::default();
    if !bytes.is_empty() {
        let v = body::decode(&ctx.headers, bytes)?;
        o.grace = v.get("gracePeriodSeconds").and_then(Value::as_i64);
        o.propagation = v.get("propagationPolicy").and_then(Value::as_str).map(str::to_string);
        if o.propagation.is_none() {
            match v.get("orphanDependents").and_then(Value::as_bool) {
                Some(true) => o.propagation = Some("Orphan".into()),
                Some(false) => o.propagation = Some("Background".into()),
                None => {}
            }
        }
        o.uid = v
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(str::to_string);
        o.resource_version = v
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string);
        o.dry_run = dry_run_values(v.get("dryRun"))?;
    }
    if let Some(g) = ctx.param("gracePeriodSeconds") {
        o.grace = Some(
            g.parse()
                .map_err(|_| StatusError::bad_request(format!("invalid gracePeriodSeconds: {g}")))?,
        );
    }
    if let Some(p) = ctx.param("propagationPolicy") {
        o.propagation = Some(p.to_string());
    }
    if let Some(p) = &o.propagation
        && !matches!(p.as_str(), "Orphan" | "Background" | "Foreground")
    {
        let errs = [skiff_api::FieldError::not_supported(
            "propagationPolicy",
            &json!(p),
            &["Foreground", "Background", "Orphan", "nil"],
        )];
        return Err(StatusError::invalid("meta.k8s.io", "DeleteOptions", "", &errs));
    }
    Ok(o)
}

/// The NamespaceLifecycle admission plugin: default, kube-system and kube-public stay.
fn immortal_namespace(res: &Resource, name: &str) -> Option<StatusError> {
    if res.plural != "namespaces" || !matches!(name, "default" | "kube-system" | "kube-public") {
        return None;
    }
    let mut e = StatusError::forbidden(format!(
        "namespaces \"{name}\" is forbidden: this namespace may not be deleted"
    ));
    e.details.kind = Some("namespaces".into());
    e.details.name = Some(name.to_string());
    Some(e)
}

/// DeleteOptions.dryRun: upstream accepts only "All".
pub fn dry_run_values(v: Option<&Value>) -> Result<bool, StatusError> {
    let Some(list) = v.and_then(Value::as_array) else {
        return Ok(false);
    };
    for item in list {
        if item.as_str() != Some("All") {
            let errs = [skiff_api::FieldError::not_supported("dryRun", item, &["All"])];
            return Err(StatusError::invalid("meta.k8s.io", "DeleteOptions", "", &errs));
        }
    }
    Ok(!list.is_empty())
}

pub async fn delete(ctx: &Ctx, bytes: Bytes) -> Result<Response, StatusError> {
    let opts = delete_options(ctx, &bytes)?;
    let (w, code) = delete_object(ctx, &opts).await?;
    match &w {
        Written::Deleted(obj) if !returns_deleted_object(ctx.rr.resource) => {
            Ok(body::value_response(code, &deleted_status(ctx.rr.resource, obj)))
        }
        _ => Ok(render_one(ctx, code, w.object())),
    }
}

/// Whether a delete that removed the object answers with it, as upstream's registries with
/// `ReturnDeletedObject` do; the others answer a `Status`. An object a finalizer or a grace
/// period keeps is answered with itself either way.
fn returns_deleted_object(res: &Resource) -> bool {
    res.group.is_empty()
        && matches!(
            res.plural,
            "pods"
                | "services"
                | "serviceaccounts"
                | "persistentvolumes"
                | "persistentvolumeclaims"
                | "resourcequotas"
                | "namespaces"
        )
        || (res.group, res.plural) == ("storage.k8s.io", "storageclasses")
}

/// Upstream's answer to a delete that removed the object: `status: Success`, with the name,
/// group, resource (as `kind`) and uid of what went.
fn deleted_status(res: &Resource, obj: &Value) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {
            "name": objects::name(obj),
            "group": res.group,
            "kind": res.plural,
            "uid": objects::uid(obj),
        }
    })
}

/// The grace period a pod deletion gets (None: not a graceful kind).
fn pod_grace(obj: &Value, requested: Option<i64>) -> i64 {
    let bound = obj
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    let phase = obj.pointer("/status/phase").and_then(Value::as_str).unwrap_or("");
    if !bound || phase == "Succeeded" || phase == "Failed" {
        return 0;
    }
    let g = requested
        .or_else(|| {
            obj.pointer("/spec/terminationGracePeriodSeconds")
                .and_then(Value::as_i64)
        })
        .unwrap_or(30);
    // Upstream turns a requested 0 into 1 unless the deletion is forced by the node.
    g.max(0)
}

pub async fn delete_object(ctx: &Ctx, opts: &DeleteOpts) -> Result<(Written, StatusCode), StatusError> {
    let res = ctx.rr.resource;
    let dry = ctx.dry_run() || opts.dry_run;
    if let Some(e) = immortal_namespace(res, &ctx.rr.name) {
        return Err(e);
    }
    let mut admitted = false;
    for _ in 0..8 {
        let (obj, rev) = ctx.current().await?;
        crate::noderestriction::admit_delete(ctx, &obj).await?;
        if !admitted {
            // Mutating webhooks see no object to change on a delete; then the validating ones.
            webhook::mutate(ctx, Operation::Delete, None, Some(&obj)).await?;
            crate::validatingadmissionpolicy::validate(ctx, Operation::Delete, None, Some(&obj)).await?;
            webhook::validate(ctx, Operation::Delete, None, Some(&obj)).await?;
            admitted = true;
        }
        if let Some(uid) = &opts.uid
            && uid != objects::uid(&obj)
        {
            return Err(StatusError::conflict(
                res.group,
                res.plural,
                &ctx.rr.name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    objects::uid(&obj)
                ),
            ));
        }
        if let Some(rv) = &opts.resource_version
            && *rv != rev.to_string()
        {
            return Err(StatusError::conflict(
                res.group,
                res.plural,
                &ctx.rr.name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {rev}"
                ),
            ));
        }
        let mut new = obj.clone();
        let mut changed = false;
        let now = jiff::Timestamp::now();
        // Graceful deletion of pods on nodes: the node confirms with a zero-grace delete.
        let mut grace_pending = false;
        if res.plural == "pods" {
            let grace = pod_grace(&obj, opts.grace);
            let current_grace = objects::metadata(&obj)
                .and_then(|m| m.get("deletionGracePeriodSeconds"))
                .and_then(Value::as_i64);
            if grace == 0 && current_grace.is_some_and(|g| g > 0) {
                // The node's confirmation (or a forced delete) of a pod that finalizers still
                // hold: its grace period ends now, so removing the last finalizer deletes it.
                let md = metadata_mut(&mut new);
                md.insert("deletionTimestamp".into(), json!(objects::now_rfc3339()));
                md.insert("deletionGracePeriodSeconds".into(), json!(0));
                changed = true;
            }
            if grace > 0 {
                if current_grace.is_none_or(|g| grace < g) {
                    let at = now + jiff::SignedDuration::from_secs(grace);
                    let md = metadata_mut(&mut new);
                    md.insert(
                        "deletionTimestamp".into(),
                        json!(at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()),
                    );
                    md.insert("deletionGracePeriodSeconds".into(), json!(grace));
                    changed = true;
                }
                grace_pending = true;
            }
        }
        if res.plural == "namespaces" {
            if let Some(m) = new.as_object_mut() {
                m.insert("status".into(), json!({"phase": "Terminating"}));
            }
            changed = true;
        }
        // Propagation through finalizers.
        let propagation = opts.propagation.as_deref().unwrap_or("Background");
        let mut fins = objects::finalizers(&new);
        let want = match propagation {
            "Orphan" => Some("orphan"),
            "Foreground" => Some("foregroundDeletion"),
            _ => None,
        };
        if objects::deletion_timestamp(&obj).is_none()
            && let Some(f) = want
            && !fins.iter().any(|x| x == f)
        {
            fins.push(f.to_string());
            metadata_mut(&mut new).insert("finalizers".into(), json!(fins));
            changed = true;
        }
        let keep = grace_pending || !fins.is_empty() || namespace_pending(res, &new);
        if keep {
            if objects::deletion_timestamp(&new).is_none() {
                let md = metadata_mut(&mut new);
                md.insert("deletionTimestamp".into(), json!(objects::now_rfc3339()));
                md.insert("deletionGracePeriodSeconds".into(), json!(0));
                changed = true;
            }
            if !changed {
                return Ok((Written::Updated(obj), StatusCode::OK));
            }
            if dry {
                return Ok((Written::Updated(new), StatusCode::OK));
            }
            let bytes = objects::encode_for_storage(ctx.rr.resource, &new);
            match ctx.state.store.update(&ctx.key(), bytes, rev).await {
                Ok(kv) => {
                    objects::set_resource_version(&mut new, kv.mod_revision);
                    return Ok((Written::Updated(new), StatusCode::OK));
                }
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(ctx.store_err(e)),
            }
        }
        if dry {
            return Ok((Written::Deleted(obj), StatusCode::OK));
        }
        match delete_stored(ctx, &obj, rev).await {
            Ok(()) => return Ok((Written::Deleted(obj), StatusCode::OK)),
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(ctx.store_err(e)),
        }
    }
    Err(StatusError::modified(res.group, res.plural, &ctx.rr.name))
}

/// Deletes a collection's members with this many deletes in flight.
const DELETE_COLLECTION_WORKERS: usize = 16;

pub async fn delete_collection(ctx: &Ctx, bytes: Bytes) -> Result<Response, StatusError> {
    let res = ctx.rr.resource;
    let opts = delete_options(ctx, &bytes)?;
    let filter = Filter::from_ctx(ctx)?;
    let prefix = objects::prefix(res, &ctx.rr.namespace);
    let page = ctx
        .state
        .store
        .list(&prefix, Default::default())
        .await
        .map_err(|e| ctx.store_err(e))?;
    let targets: Vec<Ctx> = page
        .items
        .iter()
        .filter_map(objects::decode_kv)
        .filter(|obj| filter.matches(obj))
        .map(|obj| {
            let mut rr = ctx.rr.clone();
            rr.name = objects::name(&obj).to_string();
            rr.namespace = objects::namespace(&obj).to_string();
            ctx.for_object(rr)
        })
        .collect();
    // Several deletes in flight, so that their writes share the store's commits instead of
    // each waiting for a commit of its own; the list keeps the order of the items.
    // Each future owns what it reads: the server's handler future must be Send for any lifetime.
    let mut results = futures::stream::iter(targets.into_iter().map(|one| {
        let opts = opts.clone();
        async move { delete_object(&one, &opts).await }
    }))
    .buffered(DELETE_COLLECTION_WORKERS);
    // The list answered holds each deleted object as it is written out, not decoded: ten
    // thousand decoded pods take several hundred megabytes.
    let head = json!({
        "kind": res.list_kind(),
        "apiVersion": res.api_version(),
        "metadata": {"resourceVersion": page.revision.to_string()},
        "items": [],
    });
    let head = serde_json::to_vec(&head).map_err(|e| StatusError::internal(e.to_string()))?;
    // `items` is the last member: its objects go between the brackets of `[]}`.
    let Some(open) = head.strip_suffix(b"]}") else {
        return Err(StatusError::internal("the list head does not end with its items"));
    };
    let mut out = open.to_vec();
    let mut first = true;
    while let Some(result) = results.next().await {
        match result {
            Ok((w, _)) => {
                if !first {
                    out.push(b',');
                }
                first = false;
                serde_json::to_writer(&mut out, w.object()).map_err(|e| StatusError::internal(e.to_string()))?;
            }
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    out.extend_from_slice(b"]}");
    Ok(body::object_response(StatusCode::OK, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods() -> &'static Resource {
        skiff_api::registry::lookup("", "v1", "pods").expect("pods")
    }

    #[test]
    fn wrong_json_types_are_refused_as_upstream_decoding_refuses_them() {
        let deploy = skiff_api::registry::lookup("apps", "v1", "deployments").expect("deployments");
        let bad = json!({"kind": "Deployment", "apiVersion": "apps/v1", "metadata": {"name": "d"}, "spec": {"replicas": "x"}});
        let e = check_json_types(deploy, &bad).unwrap_err();
        assert_eq!(e.code, 400);
        assert_eq!(
            e.message,
            "Deployment in version \"v1\" cannot be handled as a Deployment: json: cannot unmarshal string into Go struct field DeploymentSpec.spec.replicas of type int32"
        );
        let e = check_patched_json_types(deploy, &bad, PatchType::Merge, &bad).unwrap_err();
        assert_eq!(e.code, 422);
        assert_eq!(e.details.causes[0].field, "patch");
        assert!(
            e.message.ends_with(
                "json: cannot unmarshal string into Go struct field DeploymentSpec.spec.replicas of type int32"
            ),
            "{}",
            e.message
        );
        let good =
            json!({"kind": "Deployment", "apiVersion": "apps/v1", "metadata": {"name": "d"}, "spec": {"replicas": 2}});
        assert!(check_json_types(deploy, &good).is_ok());
        assert!(check_patched_json_types(deploy, &good, PatchType::Merge, &good).is_ok());
        let patch = json!({"spec": {"replicas": "x"}});
        let e = check_patched_json_types(deploy, &bad, PatchType::Strategic, &patch).unwrap_err();
        assert_eq!(
            e.message,
            " \"\" is invalid: patch: Invalid value: \"map[spec:map[replicas:x]]\": unrecognized type: int32"
        );
    }

    #[test]
    fn system_namespaces_may_not_be_deleted() {
        let ns = skiff_api::registry::lookup("", "v1", "namespaces").expect("namespaces");
        for name in ["default", "kube-system", "kube-public"] {
            let e = immortal_namespace(ns, name).expect("forbidden");
            assert_eq!(e.code, 403);
            assert_eq!(
                e.message,
                format!("namespaces \"{name}\" is forbidden: this namespace may not be deleted")
            );
        }
        assert!(immortal_namespace(ns, "kube-node-lease").is_none());
        assert!(immortal_namespace(ns, "team").is_none());
        assert!(immortal_namespace(pods(), "default").is_none());
    }

    #[test]
    fn uid_is_immutable() {
        let old = json!({"metadata": {"name": "x", "uid": "u1"}});
        assert!(changed_uid(&old, &json!({"metadata": {"name": "x"}})).is_none());
        assert!(changed_uid(&old, &json!({"metadata": {"name": "x", "uid": "u1"}})).is_none());
        let e = changed_uid(&old, &json!({"metadata": {"name": "x", "uid": "zzz"}})).expect("immutable");
        assert_eq!(
            e.to_string(),
            "metadata.uid: Invalid value: \"zzz\": field is immutable"
        );
    }

    #[test]
    fn dry_run_in_delete_options() {
        assert!(!dry_run_values(None).expect("none"));
        assert!(!dry_run_values(Some(&json!([]))).expect("empty"));
        assert!(dry_run_values(Some(&json!(["All"]))).expect("all"));
        let e = dry_run_values(Some(&json!(["Some"]))).unwrap_err();
        assert_eq!(e.code, 422);
        assert!(
            e.message.contains("dryRun: Unsupported value: \"Some\""),
            "{}",
            e.message
        );
    }

    #[test]
    fn generated_names_fit_in_63_characters() {
        let short = generated_name("gen-");
        assert!(short.starts_with("gen-") && short.len() == 9, "{short}");
        assert!(short[4..].bytes().all(|b| GENERATE_ALPHABET.contains(&b)));
        let long = generated_name(&"a".repeat(70));
        assert_eq!(long.len(), 63);
        assert!(long.starts_with(&"a".repeat(58)));
        // Never cut inside a character.
        let multi = generated_name(&"é".repeat(40));
        assert!(multi.len() <= 63);
    }

    #[test]
    fn finalizers_can_only_go_once_deletion_started() {
        let old = json!({"metadata": {"name": "x", "deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["a"]}});
        let added = json!({"metadata": {"name": "x", "finalizers": ["a", "b"]}});
        let e = no_new_finalizers(&old, &added).expect("forbidden");
        assert_eq!(
            e.to_string(),
            "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{\"b\"}"
        );
        let removed = json!({"metadata": {"name": "x", "finalizers": []}});
        assert!(no_new_finalizers(&old, &removed).is_none());
        let alive = json!({"metadata": {"name": "x", "finalizers": ["a"]}});
        assert!(no_new_finalizers(&alive, &added).is_none());
    }

    /// Create, read and update RoleBindings through the router, as kubectl does.
    #[tokio::test]
    async fn created_claims_and_volumes_are_protected_by_a_finalizer_of_the_system() {
        let dir = tempfile::tempdir().expect("dir");
        let (state, token) = crate::server::ApiState::for_tests(dir.path());
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}});
        let (code, v) = state
            .call_for_tests(&token, "POST", "/api/v1/namespaces", &ns.to_string())
            .await;
        assert_eq!(code, 201, "{v}");
        let pvc = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data", "finalizers": ["example.com/keep"]},
            "spec": {"storageClassName": "", "accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "1Gi"}}}});
        const CLAIMS: &str = "/api/v1/namespaces/default/persistentvolumeclaims";
        let (code, dry) = state
            .call_for_tests(&token, "POST", &format!("{CLAIMS}?dryRun=All"), &pvc.to_string())
            .await;
        assert_eq!(code, 201, "{dry}");
        assert_eq!(
            dry["metadata"]["finalizers"],
            json!(["example.com/keep", "kubernetes.io/pvc-protection"])
        );
        let (code, created) = state.call_for_tests(&token, "POST", CLAIMS, &pvc.to_string()).await;
        assert_eq!(code, 201, "{created}");
        assert_eq!(
            created["metadata"]["finalizers"],
            json!(["example.com/keep", "kubernetes.io/pvc-protection"])
        );
        // The creator's managed fields hold the finalizer it sent, not the system's.
        let fields = created["metadata"]["managedFields"][0]["fieldsV1"].to_string();
        assert!(fields.contains("example.com/keep"), "{fields}");
        assert!(!fields.contains("pvc-protection"), "{fields}");

        let pv = json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv1"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "hostPath": {"path": "/tmp/pv1"}}});
        let (code, created) = state
            .call_for_tests(&token, "POST", "/api/v1/persistentvolumes", &pv.to_string())
            .await;
        assert_eq!(code, 201, "{created}");
        assert_eq!(
            created["metadata"]["finalizers"],
            json!(["kubernetes.io/pv-protection"])
        );

        // Deleting marks it; the finalizers hold it until they are removed.
        let (code, deleting) = state
            .call_for_tests(&token, "DELETE", "/api/v1/persistentvolumes/pv1", "")
            .await;
        assert_eq!(code, 200, "{deleting}");
        assert!(deleting["metadata"]["deletionTimestamp"].is_string(), "{deleting}");
        let (code, _) = state
            .call_for_tests(&token, "GET", "/api/v1/persistentvolumes/pv1", "")
            .await;
        assert_eq!(code, 200);
    }

    #[tokio::test]
    async fn role_bindings_are_defaulted_and_keep_their_role_ref() {
        use axum::body::Body;
        use http::Request;
        use http_body_util::BodyExt;
        use tower::ServiceExt;

        let dir = tempfile::tempdir().expect("dir");
        let (state, token) = crate::server::ApiState::for_tests(dir.path());
        let call = |method: &'static str, uri: &'static str, content_type: &'static str, body: String| {
            let state = state.clone();
            let token = token.clone();
            async move {
                let req = Request::builder()
                    .method(method)
                    .uri(uri)
                    .header("authorization", format!("Bearer {token}"))
                    .header("content-type", content_type)
                    .body(Body::from(body))
                    .expect("request");
                let resp = crate::server::router(state).oneshot(req).await.expect("response");
                let code = resp.status().as_u16();
                let bytes = resp.into_body().collect().await.expect("body").to_bytes();
                (code, serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null))
            }
        };
        const JSON: &str = "application/json";
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}});
        let (code, v) = call("POST", "/api/v1/namespaces", JSON, ns.to_string()).await;
        assert_eq!(code, 201, "{v}");

        const BINDINGS: &str = "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings";
        const READERS: &str = "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings/readers";
        // What `kubectl create rolebinding readers --clusterrole=view --user=alice` sends.
        let binding = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "readers"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "User", "name": "alice"}, {"kind": "ServiceAccount", "name": "bot", "namespace": "ci"}]
        });
        let (code, created) = call("POST", BINDINGS, JSON, binding.to_string()).await;
        assert_eq!(code, 201, "{created}");
        assert_eq!(created["subjects"][0]["apiGroup"], "rbac.authorization.k8s.io");
        assert!(created["subjects"][1].get("apiGroup").is_none());
        assert_eq!(created["metadata"]["namespace"], "default");

        let (code, got) = call("GET", READERS, JSON, String::new()).await;
        assert_eq!(code, 200, "{got}");
        assert_eq!(got["roleRef"]["name"], "view");
        let (code, list) = call("GET", BINDINGS, JSON, String::new()).await;
        assert_eq!(code, 200, "{list}");
        assert_eq!(list["kind"], "RoleBindingList");
        assert_eq!(list["items"].as_array().map(Vec::len), Some(1));

        // Subjects may change; the role reference may not.
        let mut edited = got.clone();
        edited["subjects"] = json!([{"kind": "Group", "name": "devs"}]);
        let (code, v) = call("PUT", READERS, JSON, edited.to_string()).await;
        assert_eq!(code, 200, "{v}");
        assert_eq!(v["subjects"][0]["apiGroup"], "rbac.authorization.k8s.io");

        let mut changed = v.clone();
        changed["roleRef"]["name"] = json!("edit");
        let (code, e) = call("PUT", READERS, JSON, changed.to_string()).await;
        assert_eq!(code, 422, "{e}");
        assert_eq!(e["reason"], "Invalid");
        assert_eq!(
            e["message"],
            "RoleBinding.rbac.authorization.k8s.io \"readers\" is invalid: roleRef: Invalid value: rbac.RoleRef{APIGroup:\"rbac.authorization.k8s.io\", Kind:\"ClusterRole\", Name:\"edit\"}: cannot change roleRef"
        );
        // kubectl prints `The RoleBinding "readers" is invalid: roleRef: ...` from these details.
        assert_eq!(e["details"]["kind"], "RoleBinding");
        assert_eq!(e["details"]["group"], "rbac.authorization.k8s.io");
        assert_eq!(e["details"]["name"], "readers");
        assert_eq!(e["details"]["causes"][0]["field"], "roleRef");
        assert_eq!(e["details"]["causes"][0]["reason"], "FieldValueInvalid");
        let patch = json!({"roleRef": {"kind": "Role", "name": "view"}}).to_string();
        let (code, e) = call("PATCH", READERS, "application/merge-patch+json", patch).await;
        assert_eq!(code, 422, "{e}");
        assert!(
            e["message"]
                .as_str()
                .unwrap_or("")
                .ends_with("Kind:\"Role\", Name:\"view\"}: cannot change roleRef"),
            "{e}"
        );
        let (_, still) = call("GET", READERS, JSON, String::new()).await;
        assert_eq!(still["roleRef"]["name"], "view");

        // A ClusterRoleBinding takes only ClusterRoles, and namespaced service accounts.
        let crb = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "admins"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "admin"},
            "subjects": [{"kind": "ServiceAccount", "name": "bot"}]
        });
        let (code, e) = call(
            "POST",
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            JSON,
            crb.to_string(),
        )
        .await;
        assert_eq!(code, 422, "{e}");
        assert_eq!(
            e["message"],
            "ClusterRoleBinding.rbac.authorization.k8s.io \"admins\" is invalid: [roleRef.kind: Unsupported value: \"Role\": supported values: \"ClusterRole\", subjects[0].namespace: Required value]"
        );

        // Roles list as the default table: the name and when it was created.
        let role = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "pod-reader"},
            "rules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}]
        });
        let (code, v) = call(
            "POST",
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            JSON,
            role.to_string(),
        )
        .await;
        assert_eq!(code, 201, "{v}");
        let req = Request::builder()
            .uri("/apis/rbac.authorization.k8s.io/v1/clusterroles")
            .header("authorization", format!("Bearer {token}"))
            .header(
                "accept",
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
            )
            .body(Body::empty())
            .expect("request");
        let resp = crate::server::router(state.clone())
            .oneshot(req)
            .await
            .expect("response");
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        let table: Value = serde_json::from_slice(&bytes).expect("table");
        assert_eq!(table["columnDefinitions"][1]["name"], "Created At");
        assert_eq!(table["rows"][0]["cells"][0], "pod-reader");
        assert_eq!(table["rows"][0]["cells"][1], v["metadata"]["creationTimestamp"]);
    }

    #[test]
    fn updates_finish_a_deletion_only_without_pending_grace() {
        let res = pods();
        let new = json!({"metadata": {"name": "p"}});
        let graceful = json!({"metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:30Z", "deletionGracePeriodSeconds": 30}});
        assert!(
            !delete_during_update(res, &graceful, &new),
            "a pod on a node waits for its node"
        );
        let zero = json!({"metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z", "deletionGracePeriodSeconds": 0}});
        assert!(delete_during_update(res, &zero, &new));
        let no_grace = json!({"metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"}});
        assert!(delete_during_update(res, &no_grace, &new));
        let held = json!({"metadata": {"name": "p", "finalizers": ["f"]}});
        assert!(!delete_during_update(res, &zero, &held));
        assert!(!delete_during_update(res, &new, &new), "not being deleted");
    }

    /// Found by fuzzing: `?dryRun=bogus` was taken for a dry run (201, nothing stored) where
    /// upstream refuses the options; the other write options are checked as upstream does too.
    #[tokio::test]
    async fn unsupported_write_options_are_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().expect("dir");
        let (state, token) = crate::server::ApiState::for_tests(dir.path());
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}});
        let (code, _) = state
            .call_for_tests(&token, "POST", "/api/v1/namespaces", &ns.to_string())
            .await;
        assert_eq!(code, 201);
        const CMS: &str = "/api/v1/namespaces/default/configmaps";
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}});
        let (code, v) = state
            .call_for_tests(&token, "POST", &format!("{CMS}?dryRun=bogus"), &cm.to_string())
            .await;
        assert_eq!(code, 422, "{v}");
        assert_eq!(
            v["message"],
            "CreateOptions.meta.k8s.io \"\" is invalid: dryRun: Unsupported value: []string{\"bogus\"}: supported values: \"All\""
        );
        let (code, _) = state.call_for_tests(&token, "GET", &format!("{CMS}/cm"), "").await;
        assert_eq!(code, 404, "nothing was written");
        let (code, v) = state
            .call_for_tests(
                &token,
                "POST",
                &format!("{CMS}?fieldValidation=strict-ish"),
                &cm.to_string(),
            )
            .await;
        assert_eq!(code, 422, "{v}");
        assert_eq!(
            v["message"],
            "CreateOptions.meta.k8s.io \"\" is invalid: fieldValidation: Unsupported value: \"strict-ish\": supported values: \"\", \"Ignore\", \"Strict\", \"Warn\""
        );
        let (code, v) = state
            .call_for_tests(&token, "POST", &format!("{CMS}?fieldManager=a%09b"), &cm.to_string())
            .await;
        assert_eq!(code, 422, "{v}");
        assert_eq!(
            v["message"],
            "CreateOptions.meta.k8s.io \"\" is invalid: fieldManager: Invalid value: \"a\\tb\": invalid character U+0009 (at position 1)"
        );
        let (code, v) = state
            .call_for_tests(&token, "POST", &format!("{CMS}?dryRun=All"), &cm.to_string())
            .await;
        assert_eq!(code, 201, "{v}");
        let (code, _) = state.call_for_tests(&token, "POST", CMS, &cm.to_string()).await;
        assert_eq!(code, 201);
        let (code, v) = state
            .call_for_tests(&token, "PUT", &format!("{CMS}/cm?dryRun=x"), &cm.to_string())
            .await;
        assert_eq!(code, 422, "{v}");
        assert!(
            v["message"].as_str().unwrap().starts_with("UpdateOptions.meta.k8s.io"),
            "{v}"
        );
        let (code, v) = state
            .call_for_tests(&token, "PATCH", &format!("{CMS}/cm?force=true"), "{}")
            .await;
        // call_for_tests sends application/json, which is no patch type: 415 comes first.
        assert_eq!(code, 415, "{v}");
    }
}
