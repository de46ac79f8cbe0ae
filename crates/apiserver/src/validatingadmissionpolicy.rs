//! ValidatingAdmissionPolicies enforced in admission, as upstream's
//! `apiserver/pkg/admission/plugin/policy/validating`: every binding of a policy whose match
//! constraints (and the binding's own `matchResources`) select the request evaluates the
//! policy's CEL expressions, once per parameter object the binding selects (`paramKind` and
//! `paramRef`, by name or selector, with `parameterNotFoundAction`). `matchConditions` decide
//! whether it applies, `variables` are evaluated in order and seen as `variables.NAME`, and each
//! validation that is false gives a decision: `Deny` refuses the request with upstream's
//! `ValidatingAdmissionPolicy 'P' with binding 'B' denied request: MESSAGE` (422 Invalid, or the
//! code of the validation's `reason`), `Warn` adds a `Warning:` header, `Audit` is not recorded
//! here. An expression that fails to evaluate follows the policy's `failurePolicy`.
//!
//! Expressions see `object`, `oldObject`, `request`, `params`, `namespaceObject` and
//! `variables`; `authorizer` is not offered (an expression naming it does not compile).
//! Policies and bindings come from the snapshot the webhook watch keeps (see `webhook`).
//! Policies' `status` (type checking) is not written.

use std::sync::Arc;

use serde_json::{Value, json};
use skiff_api::cel::{self, EvalError, Program};
use skiff_api::selector::LabelSelector;
use skiff_api::validation::admissionregistration::POLICY_VARS;
use skiff_api::{Resource, StatusError};
use skiff_store::ListOptions;

use crate::handlers::Ctx;
use crate::objects;
use crate::server::ApiState;
use crate::webhook::{self, Attributes, Operation, Rule};

const GROUP: &str = "admissionregistration.k8s.io";

/// A policy's or binding's resource match.
struct Match {
    rules: Vec<(Rule, Vec<String>)>,
    exclude: Vec<(Rule, Vec<String>)>,
    exact: bool,
    namespace_selector: LabelSelector,
    object_selector: LabelSelector,
}

struct Validation {
    expression: Arc<Program>,
    message: String,
    message_expression: Option<Arc<Program>>,
    reason: String,
}

struct Policy {
    name: String,
    constraints: Match,
    ignore_failures: bool,
    /// `paramKind`: apiVersion and kind.
    param_kind: Option<(String, String)>,
    match_conditions: Vec<(String, Arc<Program>)>,
    variables: Vec<(String, Arc<Program>)>,
    validations: Vec<Validation>,
    /// Why the policy's expressions cannot be evaluated (one no longer compiles): every request
    /// it matches then fails, and its `failurePolicy` decides, as upstream's compile errors do.
    broken: Option<String>,
}

struct ParamRef {
    name: String,
    namespace: String,
    selector: Option<LabelSelector>,
    deny_when_missing: bool,
}

struct Binding {
    name: String,
    resources: Option<Match>,
    param_ref: Option<ParamRef>,
    deny: bool,
    warn: bool,
}

/// The policies with their bindings, in name order.
#[derive(Default)]
pub struct Snapshot(Vec<(Arc<Policy>, Vec<Binding>)>);

impl Snapshot {
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|(_, b)| b.is_empty())
    }
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default()
}

fn text(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or("").to_string()
}

fn build_match(v: &Value) -> anyhow::Result<Match> {
    let rules = |key: &str| -> Vec<(Rule, Vec<String>)> {
        v.get(key)
            .and_then(Value::as_array)
            .map(|rs| {
                rs.iter()
                    .map(|r| (Rule::from_json(r), strings(r.get("resourceNames"))))
                    .collect()
            })
            .unwrap_or_default()
    };
    let selector = |k: &str| {
        v.get(k)
            .map(LabelSelector::from_label_selector_json)
            .transpose()
            .map(|s| s.unwrap_or_else(LabelSelector::everything))
            .map_err(|e| anyhow::anyhow!("{k}: {e}"))
    };
    Ok(Match {
        rules: rules("resourceRules"),
        exclude: rules("excludeResourceRules"),
        exact: v.get("matchPolicy").and_then(Value::as_str) == Some("Exact"),
        namespace_selector: selector("namespaceSelector")?,
        object_selector: selector("objectSelector")?,
    })
}

fn compile(expr: &str) -> anyhow::Result<Arc<Program>> {
    cel::compile(expr, POLICY_VARS).map_err(|e| anyhow::anyhow!("compilation failed: {e}"))
}

fn build_policy(p: &Value) -> anyhow::Result<Policy> {
    let spec = p.get("spec").cloned().unwrap_or_else(|| json!({}));
    let named = |key: &str| -> anyhow::Result<Vec<(String, Arc<Program>)>> {
        spec.get(key)
            .and_then(Value::as_array)
            .map(|a| a.as_slice())
            .unwrap_or_default()
            .iter()
            .map(|c| Ok((text(c, "name"), compile(&text(c, "expression"))?)))
            .collect()
    };
    let validations = spec
        .get("validations")
        .and_then(Value::as_array)
        .map(|a| a.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|v| {
            let me = text(v, "messageExpression");
            Ok(Validation {
                expression: compile(&text(v, "expression"))?,
                message: text(v, "message"),
                message_expression: if me.trim().is_empty() {
                    None
                } else {
                    Some(compile(&me)?)
                },
                reason: text(v, "reason"),
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Policy {
        name: objects::name(p).to_string(),
        constraints: build_match(spec.get("matchConstraints").unwrap_or(&json!({})))?,
        ignore_failures: spec.get("failurePolicy").and_then(Value::as_str) == Some("Ignore"),
        param_kind: spec
            .get("paramKind")
            .filter(|k| k.is_object())
            .map(|k| (text(k, "apiVersion"), text(k, "kind"))),
        match_conditions: named("matchConditions")?,
        variables: named("variables")?,
        validations,
        broken: None,
    })
}

/// A policy whose expressions could not be compiled: it matches what its constraints match and
/// fails every request it matches.
fn broken_policy(p: &Value, why: String) -> anyhow::Result<Policy> {
    let spec = p.get("spec").cloned().unwrap_or_else(|| json!({}));
    Ok(Policy {
        name: objects::name(p).to_string(),
        constraints: build_match(spec.get("matchConstraints").unwrap_or(&json!({})))?,
        ignore_failures: spec.get("failurePolicy").and_then(Value::as_str) == Some("Ignore"),
        param_kind: None,
        match_conditions: Vec::new(),
        variables: Vec::new(),
        validations: Vec::new(),
        broken: Some(why),
    })
}

fn build_binding(b: &Value) -> anyhow::Result<Binding> {
    let spec = b.get("spec").cloned().unwrap_or_else(|| json!({}));
    let actions = strings(spec.get("validationActions"));
    let param_ref = match spec.get("paramRef").filter(|p| p.is_object()) {
        None => None,
        Some(pr) => Some(ParamRef {
            name: text(pr, "name"),
            namespace: text(pr, "namespace"),
            selector: pr
                .get("selector")
                .map(LabelSelector::from_label_selector_json)
                .transpose()
                .map_err(|e| anyhow::anyhow!("paramRef.selector: {e}"))?,
            deny_when_missing: pr.get("parameterNotFoundAction").and_then(Value::as_str) == Some("Deny"),
        }),
    };
    Ok(Binding {
        name: objects::name(b).to_string(),
        resources: spec
            .get("matchResources")
            .filter(|m| m.is_object())
            .map(build_match)
            .transpose()?,
        param_ref,
        deny: actions.iter().any(|a| a == "Deny"),
        warn: actions.iter().any(|a| a == "Warn"),
    })
}

/// Read every policy and binding.
pub(crate) async fn load(state: &ApiState) -> anyhow::Result<Snapshot> {
    let (Some(pr), Some(br)) = (
        skiff_api::registry::lookup_kind(GROUP, "ValidatingAdmissionPolicy"),
        skiff_api::registry::lookup_kind(GROUP, "ValidatingAdmissionPolicyBinding"),
    ) else {
        return Ok(Snapshot::default());
    };
    let read = |res: &'static Resource| {
        let store = state.store.clone();
        async move {
            let list = store.list(&objects::prefix(res, ""), ListOptions::default()).await?;
            let mut items: Vec<Value> = list.items.iter().filter_map(objects::decode_kv).collect();
            items.sort_by(|a, b| objects::name(a).cmp(objects::name(b)));
            anyhow::Ok(items)
        }
    };
    let bindings = read(br).await?;
    if bindings.is_empty() {
        return Ok(Snapshot::default());
    }
    let mut out = Vec::new();
    for p in read(pr).await? {
        let policy = match build_policy(&p).or_else(|e| {
            tracing::warn!(policy = objects::name(&p), error = %e, "a ValidatingAdmissionPolicy cannot be evaluated; its failurePolicy decides");
            broken_policy(&p, format!("{e:#}"))
        }) {
            Ok(policy) => Arc::new(policy),
            Err(e) => {
                tracing::warn!(policy = objects::name(&p), error = %e, "a ValidatingAdmissionPolicy's constraints could not be read; it is not enforced");
                continue;
            }
        };
        let mine = bindings
            .iter()
            .filter(|b| b.pointer("/spec/policyName").and_then(Value::as_str) == Some(policy.name.as_str()))
            .filter_map(|b| match build_binding(b) {
                Ok(b) => Some(b),
                Err(e) => {
                    tracing::warn!(binding = objects::name(b), error = %e, "a ValidatingAdmissionPolicyBinding could not be prepared and is not enforced");
                    None
                }
            })
            .collect();
        out.push((policy, mine));
    }
    Ok(Snapshot(out))
}

/// Whether a match selects the request.
async fn matches(ctx: &Ctx, m: &Match, op: Operation, ns: &str, a: &Attributes<'_>) -> Result<bool, StatusError> {
    let name = if ctx.rr.name.is_empty() {
        a.object.or(a.old).map(objects::name).unwrap_or("")
    } else {
        ctx.rr.name.as_str()
    };
    let named = |rules: &[(Rule, Vec<String>)]| -> Vec<Rule> {
        rules
            .iter()
            .filter(|(_, names)| names.is_empty() || names.iter().any(|n| n == name))
            .map(|(r, _)| r.clone())
            .collect()
    };
    // A binding without resourceRules does not narrow what its policy matched.
    if !m.rules.is_empty() && webhook::rules_match(&named(&m.rules), m.exact, ctx, op, ns).is_none() {
        return Ok(false);
    }
    if webhook::rules_match(&named(&m.exclude), m.exact, ctx, op, ns).is_some() {
        return Ok(false);
    }
    webhook::selectors_allow(ctx, &m.namespace_selector, &m.object_selector, ns, a).await
}

/// A decision against the request.
struct Denial {
    policy: String,
    binding: String,
    message: String,
    reason: String,
}

/// What one evaluation of a policy concluded.
enum Outcome {
    Pass,
    Fail { message: String, reason: String },
}

/// The parameter objects a binding selects (`None`: the binding is skipped).
async fn params(ctx: &Ctx, policy: &Policy, binding: &Binding, ns: &str) -> Result<Option<Vec<Value>>, String> {
    let Some((api_version, kind)) = &policy.param_kind else {
        return Ok(Some(vec![Value::Null]));
    };
    let Some(pr) = &binding.param_ref else {
        return Err("failed to configure binding: paramRef is required when paramKind is set".to_string());
    };
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version.as_str()));
    let Some(res) = skiff_api::registry::all()
        .into_iter()
        .find(|r| r.group == group && r.version == version && r.kind == kind.as_str())
    else {
        return Err(format!(
            "failed to configure policy: failed to find resource referenced by paramKind: '{api_version}, Kind={kind}'"
        ));
    };
    let namespace = if !res.namespaced {
        String::new()
    } else if !pr.namespace.is_empty() {
        pr.namespace.clone()
    } else if !ns.is_empty() {
        ns.to_string()
    } else {
        return Err(
            "failed to configure binding: cannot use namespaced paramRef in policy binding that matches cluster-scoped resources"
                .to_string(),
        );
    };
    let store = &ctx.state.store;
    let found: Vec<Value> = if !pr.name.is_empty() {
        store
            .get(&objects::key(res, &namespace, &pr.name))
            .await
            .map_err(|e| e.to_string())?
            .and_then(|kv| objects::decode_kv(&kv))
            .into_iter()
            .collect()
    } else {
        let list = store
            .list(&objects::prefix(res, &namespace), ListOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        let sel = pr.selector.clone().unwrap_or_else(LabelSelector::everything);
        list.items
            .iter()
            .filter_map(objects::decode_kv)
            .filter(|o| sel.matches_object(o))
            .collect()
    };
    if found.is_empty() {
        if pr.deny_when_missing {
            return Err("no params found for policy binding with `Deny` parameterNotFoundAction".to_string());
        }
        return Ok(None);
    }
    Ok(Some(found))
}

/// One evaluation of a policy with one parameter object.
fn evaluate(policy: &Policy, vars: &[(&str, &Value)]) -> Outcome {
    let fail = |message: String| {
        if policy.ignore_failures {
            Outcome::Pass
        } else {
            Outcome::Fail {
                message,
                reason: String::new(),
            }
        }
    };
    if let Some(why) = &policy.broken {
        return fail(why.clone());
    }
    let mut variables = std::collections::HashMap::new();
    let variables_value = |m: &std::collections::HashMap<String, ::cel::Value>| {
        let map: std::collections::HashMap<::cel::objects::Key, ::cel::Value> = m
            .iter()
            .map(|(k, v)| (::cel::objects::Key::String(Arc::new(k.clone())), v.clone()))
            .collect();
        ::cel::Value::Map(::cel::objects::Map { map: Arc::new(map) })
    };
    for (name, cond) in &policy.match_conditions {
        let vv = variables_value(&variables);
        match cond.eval_bool_with(vars, &[("variables", &vv)]) {
            Ok(true) => {}
            Ok(false) => return Outcome::Pass,
            Err(e) => return fail(format!("failed to evaluate matchCondition '{name}': {e}")),
        }
    }
    for (name, expr) in &policy.variables {
        let vv = variables_value(&variables);
        if let Ok(v) = expr.eval_with(vars, &[("variables", &vv)]) {
            variables.insert(name.clone(), v);
        }
    }
    let vv = variables_value(&variables);
    let cel_vars = [("variables", &vv)];
    for v in &policy.validations {
        match v.expression.eval_bool_with(vars, &cel_vars) {
            Ok(true) => {}
            Ok(false) => {
                let from_expression = v
                    .message_expression
                    .as_ref()
                    .and_then(|me| me.eval_with(vars, &cel_vars).ok())
                    .and_then(|m| match m {
                        ::cel::Value::String(s) if !s.trim().is_empty() && !s.contains('\n') => {
                            Some(s.trim().to_string())
                        }
                        _ => None,
                    });
                let message = from_expression.unwrap_or_else(|| {
                    if v.message.trim().is_empty() {
                        format!("failed expression: {}", v.expression.source().trim())
                    } else {
                        v.message.trim().to_string()
                    }
                });
                return Outcome::Fail {
                    message,
                    reason: v.reason.clone(),
                };
            }
            Err(e) => {
                let e = match e {
                    EvalError::NoSuchOverload => "no such overload".to_string(),
                    other => other.to_string(),
                };
                return fail(format!(
                    "expression '{}' resulted in error: {e}",
                    v.expression.source().trim()
                ));
            }
        }
    }
    Outcome::Pass
}

/// upstream's `reasonToCode`.
fn reason_code(reason: &str) -> u16 {
    match reason {
        "Unauthorized" => 401,
        "Forbidden" => 403,
        "RequestEntityTooLarge" => 413,
        _ => 422,
    }
}

/// The policies of a create, update or delete: refuses with the first denial.
pub async fn validate(
    ctx: &Ctx,
    operation: Operation,
    obj: Option<&Value>,
    old: Option<&Value>,
) -> Result<(), StatusError> {
    validate_as(ctx, operation, obj, old, None).await
}

/// [`validate`] of an object of a kind of its own (a subresource's, a connect request's).
pub async fn validate_as(
    ctx: &Ctx,
    operation: Operation,
    obj: Option<&Value>,
    old: Option<&Value>,
    kind: Option<webhook::Gvk<'_>>,
) -> Result<(), StatusError> {
    let res = ctx.rr.resource;
    if webhook::exempt(res) {
        return Ok(());
    }
    let snap = ctx.state.webhooks.policies.read().clone();
    if snap.is_empty() {
        return Ok(());
    }
    let a = Attributes {
        operation,
        object: obj,
        old,
        kind,
    };
    let ns = webhook::attr_namespace(ctx, obj.or(old));
    // What the expressions see, built once the first policy applies.
    let mut bound: Option<(Value, Value)> = None;
    let mut denials: Vec<Denial> = Vec::new();
    for (policy, bindings) in &snap.0 {
        if bindings.is_empty() || !matches(ctx, &policy.constraints, operation, &ns, &a).await? {
            continue;
        }
        for binding in bindings {
            if let Some(m) = &binding.resources
                && !matches(ctx, m, operation, &ns, &a).await?
            {
                continue;
            }
            if bound.is_none() {
                let uid = uuid::Uuid::new_v4().to_string();
                let request = webhook::admission_request(ctx, res, &a, &uid);
                bound = Some((request, namespace_object(ctx, &ns).await?));
            }
            let Some((request, namespace_object)) = &bound else {
                continue;
            };
            let null = Value::Null;
            let mut decide = |message: String, reason: String| {
                if binding.warn {
                    ctx.warnings.add(format!(
                        "Validation failed for ValidatingAdmissionPolicy '{}' with binding '{}': {message}",
                        policy.name, binding.name
                    ));
                }
                if binding.deny {
                    denials.push(Denial {
                        policy: policy.name.clone(),
                        binding: binding.name.clone(),
                        message,
                        reason,
                    });
                }
            };
            let params = match params(ctx, policy, binding, &ns).await {
                Ok(Some(p)) => p,
                Ok(None) => continue,
                Err(message) => {
                    if !policy.ignore_failures {
                        decide(message, String::new());
                    }
                    continue;
                }
            };
            for param in &params {
                let vars = [
                    ("object", obj.unwrap_or(&null)),
                    ("oldObject", old.unwrap_or(&null)),
                    ("request", request),
                    ("params", param),
                    ("namespaceObject", namespace_object),
                ];
                if let Outcome::Fail { message, reason } = evaluate(policy, &vars) {
                    decide(message, reason);
                }
            }
        }
    }
    let Some(d) = denials.into_iter().next() else {
        return Ok(());
    };
    let message = format!(
        "ValidatingAdmissionPolicy '{}' with binding '{}' denied request: {}",
        d.policy, d.binding, d.message
    );
    let name = if ctx.rr.name.is_empty() {
        obj.or(old).map(objects::name).unwrap_or("")
    } else {
        ctx.rr.name.as_str()
    };
    let mut e = StatusError::forbidden_resource(res.group, res.plural, name, &message);
    let reason = if d.reason.is_empty() {
        "Invalid".to_string()
    } else {
        d.reason
    };
    e.code = reason_code(&reason);
    e.reason = reason;
    e.details.causes.push(skiff_api::status::Cause {
        reason: String::new(),
        message,
        field: String::new(),
    });
    Err(e)
}

/// The request's Namespace (null for cluster-scoped requests).
async fn namespace_object(ctx: &Ctx, ns: &str) -> Result<Value, StatusError> {
    if ns.is_empty() {
        return Ok(Value::Null);
    }
    let Some(namespaces) = skiff_api::registry::lookup("", "v1", "namespaces") else {
        return Ok(Value::Null);
    };
    let kv = ctx
        .state
        .store
        .get(&objects::key(namespaces, "", ns))
        .await
        .map_err(|e| ctx.store_err(e))?;
    Ok(kv.and_then(|kv| objects::decode_kv(&kv)).unwrap_or(Value::Null))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(spec: Value) -> Policy {
        build_policy(&json!({"metadata": {"name": "p"}, "spec": spec})).expect("policy")
    }

    fn outcome(p: &Policy, object: &Value, params: &Value) -> Option<(String, String)> {
        let null = Value::Null;
        let vars = [
            ("object", object),
            ("oldObject", &null),
            ("request", &null),
            ("params", params),
            ("namespaceObject", &null),
        ];
        match evaluate(p, &vars) {
            Outcome::Pass => None,
            Outcome::Fail { message, reason } => Some((message, reason)),
        }
    }

    #[test]
    fn validations_give_upstream_messages() {
        let p = policy(json!({"validations": [
            {"expression": "object.spec.replicas <= 5"},
            {"expression": "object.spec.replicas != 4", "message": "four is unlucky", "reason": "Forbidden"},
            {"expression": "object.spec.replicas != 3", "messageExpression": "'got ' + string(object.spec.replicas)"},
        ]}));
        let d = |r: i64| json!({"spec": {"replicas": r}});
        assert_eq!(outcome(&p, &d(1), &Value::Null), None);
        assert_eq!(
            outcome(&p, &d(6), &Value::Null),
            Some(("failed expression: object.spec.replicas <= 5".into(), String::new()))
        );
        assert_eq!(
            outcome(&p, &d(4), &Value::Null),
            Some(("four is unlucky".into(), "Forbidden".into()))
        );
        assert_eq!(outcome(&p, &d(3), &Value::Null), Some(("got 3".into(), String::new())));
        assert_eq!(
            outcome(&p, &json!({"spec": {}}), &Value::Null),
            Some((
                "expression 'object.spec.replicas <= 5' resulted in error: no such key: replicas".into(),
                String::new()
            ))
        );
    }

    #[test]
    fn conditions_variables_params_and_failure_policy() {
        let p = policy(json!({
            "failurePolicy": "Ignore",
            "matchConditions": [{"name": "labelled", "expression": "has(object.metadata.labels) && 'checked' in object.metadata.labels"}],
            "variables": [{"name": "max", "expression": "int(params.data.max)"}, {"name": "twice", "expression": "variables.max * 2"}],
            "validations": [{"expression": "object.spec.replicas <= variables.max && variables.twice > 0"}],
        }));
        let params = json!({"data": {"max": "2"}});
        let labelled = |r: i64| json!({"metadata": {"labels": {"checked": "y"}}, "spec": {"replicas": r}});
        assert_eq!(outcome(&p, &labelled(2), &params), None);
        assert!(outcome(&p, &labelled(3), &params).is_some());
        // Not matched: the condition is false.
        assert_eq!(
            outcome(&p, &json!({"metadata": {}, "spec": {"replicas": 9}}), &params),
            None
        );
        // An error under failurePolicy Ignore lets the request through.
        assert_eq!(
            outcome(&p, &json!({"metadata": {"labels": {"checked": "y"}}}), &params),
            None
        );
    }
}
