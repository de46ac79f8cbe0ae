//! CEL in the API, driven by the real kubectl: CustomResourceDefinition
//! `x-kubernetes-validations` rules (a rule refusing objects with upstream's message, a
//! transition rule making a field immutable, a rule that does not compile refusing the
//! definition), and ValidatingAdmissionPolicies with their bindings (a "replicas <= 5" policy
//! refusing `kubectl create deployment`, a Warn binding, a policy parameterized by a
//! ConfigMap, table columns, and a policy that does not compile).

#![cfg(test)]

mod common;

use common::Cluster;

const CONTROL_PLANE: &[&str] = &["--no-agent", "--no-scheduler"];

const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            x-kubernetes-validations:
            - rule: self.replicas <= 5
              message: replicas must be <= 5
            - rule: self.size == oldSelf.size
              message: size is immutable
            - rule: "!has(self.name) || self.name.lowerAscii() == self.name"
            properties:
              replicas: {type: integer}
              size: {type: string}
              name: {type: string}
"#;

fn widget(name: &str, replicas: i64, size: &str) -> String {
    format!(
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {{name: {name}, namespace: default}}\nspec: {{replicas: {replicas}, size: {size}}}\n"
    )
}

fn install(c: &Cluster) {
    c.apply(CRD, &[]);
    c.k(&[
        "wait",
        "--for=condition=Established",
        "crd/widgets.example.com",
        "--timeout=30s",
    ]);
}

#[test]
fn crd_validation_rules() {
    let c = Cluster::start(CONTROL_PLANE);
    install(&c);

    // A rule refuses with its message, as upstream's 422.
    let err = c.stdin_kubectl_err(&["create", "-f", "-"], &widget("w", 6, "small"));
    assert!(
        err.contains("The Widget \"w\" is invalid: spec: Invalid value: \"object\": replicas must be <= 5"),
        "{err}"
    );
    // A rule without a message names itself.
    let err = c.stdin_kubectl_err(
        &["create", "-f", "-"],
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: u, namespace: default}\nspec: {replicas: 1, size: s, name: Upper}\n",
    );
    assert!(
        err.contains(
            "spec: Invalid value: \"object\": failed rule: !has(self.name) || self.name.lowerAscii() == self.name"
        ),
        "{err}"
    );

    // Valid objects go in; the transition rule does not run on create.
    c.stdin_kubectl(&["create", "-f", "-"], &widget("w", 5, "small"));
    c.k(&[
        "patch",
        "widget",
        "w",
        "--type=merge",
        "-p",
        r#"{"spec":{"replicas":2}}"#,
    ]);
    assert_eq!(c.k(&["get", "widget", "w", "-o", "jsonpath={.spec.replicas}"]), "2");

    // oldSelf: the size may not change, and the rules run on updates too.
    let out = c.kubectl(&[
        "patch",
        "widget",
        "w",
        "--type=merge",
        "-p",
        r#"{"spec":{"size":"large"}}"#,
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("The Widget \"w\" is invalid: spec: Invalid value: \"object\": size is immutable"),
        "{err}"
    );
    let out = c.kubectl(&[
        "patch",
        "widget",
        "w",
        "--type=merge",
        "-p",
        r#"{"spec":{"replicas":9}}"#,
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("replicas must be <= 5"));
    assert_eq!(c.k(&["get", "widget", "w", "-o", "jsonpath={.spec.size}"]), "small");
}

#[test]
fn a_rule_that_does_not_compile_refuses_the_definition() {
    let c = Cluster::start(CONTROL_PLANE);
    let bad = CRD.replace("rule: self.replicas <= 5", "rule: self.replicas <<= 5");
    let err = c.stdin_kubectl_err(&["apply", "-f", "-"], &bad);
    assert!(
        err.contains(
            "The CustomResourceDefinition \"widgets.example.com\" is invalid: spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule: Invalid value: apiextensions.ValidationRule{Rule:\"self.replicas <<= 5\", Message:\"replicas must be <= 5\""
        ),
        "{err}"
    );
    assert!(err.contains("compilation failed: ERROR: <input>:1:"), "{err}");
    let undeclared = CRD.replace("rule: self.replicas <= 5", "rule: spec.replicas <= 5");
    let err = c.stdin_kubectl_err(&["apply", "-f", "-"], &undeclared);
    assert!(
        err.contains("compilation failed: ERROR: <input>:1:1: undeclared reference to 'spec' (in container '')"),
        "{err}"
    );
    // Nothing was stored.
    let out = c.kubectl(&["get", "crd", "widgets.example.com"]);
    assert!(!out.status.success());
}

const REPLICAS_POLICY: &str = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: replicas-limit
spec:
  matchConstraints:
    resourceRules:
    - apiGroups: ["apps"]
      apiVersions: ["v1"]
      operations: ["CREATE", "UPDATE"]
      resources: ["deployments"]
  validations:
  - expression: "object.spec.replicas <= 5"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: replicas-limit-binding
spec:
  policyName: replicas-limit
  validationActions: [Deny]
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: team-label
spec:
  matchConstraints:
    resourceRules:
    - apiGroups: [""]
      apiVersions: ["v1"]
      operations: ["CREATE"]
      resources: ["configmaps"]
  variables:
  - name: labels
    expression: "has(object.metadata.labels) ? object.metadata.labels : {}"
  validations:
  - expression: "'team' in variables.labels"
    messageExpression: "'configmap ' + object.metadata.name + ' has no team label'"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: team-label-warn
spec:
  policyName: team-label
  validationActions: [Warn]
  matchResources:
    namespaceSelector:
      matchLabels:
        kubernetes.io/metadata.name: default
"#;

const PARAMS_POLICY: &str = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: replicas-from-params
spec:
  failurePolicy: Fail
  paramKind:
    apiVersion: v1
    kind: ConfigMap
  matchConstraints:
    resourceRules:
    - apiGroups: ["apps"]
      apiVersions: ["v1"]
      operations: ["CREATE"]
      resources: ["deployments"]
  matchConditions:
  - name: team-a-only
    expression: "has(namespaceObject.metadata.labels) && namespaceObject.metadata.labels.?team == optional.of('a')"
  validations:
  - expression: "object.spec.replicas <= int(params.data.maxReplicas)"
    messageExpression: "'at most ' + params.data.maxReplicas + ' replicas in ' + request.namespace"
    reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: replicas-from-params-binding
spec:
  policyName: replicas-from-params
  validationActions: [Deny]
  paramRef:
    name: limits
    namespace: default
    parameterNotFoundAction: Deny
"#;

#[test]
fn validating_admission_policies() {
    let c = Cluster::start(CONTROL_PLANE);
    c.apply(REPLICAS_POLICY, &[]);

    // Deny: upstream's message and 422 Invalid.
    let err = c.k_err(&["create", "deployment", "web", "--image=nginx", "--replicas=6"]);
    assert!(
        err.contains("deployments.apps \"web\" is forbidden: ValidatingAdmissionPolicy 'replicas-limit' with binding 'replicas-limit-binding' denied request: failed expression: object.spec.replicas <= 5"),
        "{err}"
    );
    let out = c.k(&[
        "create",
        "deployment",
        "web",
        "--image=nginx",
        "--replicas=5",
        "--dry-run=server",
        "-o",
        "name",
    ]);
    assert_eq!(out.trim(), "deployment.apps/web");
    c.k(&["create", "deployment", "web", "--image=nginx", "--replicas=2"]);
    // Updates are checked as well (the scale subresource is not: the rule names deployments).
    let err = c.k_err(&["patch", "deployment", "web", "-p", r#"{"spec":{"replicas":7}}"#]);
    assert!(
        err.contains("denied request: failed expression: object.spec.replicas <= 5"),
        "{err}"
    );
    let status = c.kubectl(&["create", "deployment", "big", "--image=nginx", "--replicas=9", "-v=6"]);
    assert!(String::from_utf8_lossy(&status.stderr).contains("422"));

    // Warn: the write goes through with a Warning header.
    let out = c.kubectl(&["create", "configmap", "untagged", "--from-literal=a=b"]);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Warning: Validation failed for ValidatingAdmissionPolicy 'team-label' with binding 'team-label-warn': configmap untagged has no team label"),
        "{stderr}"
    );
    // The binding's namespaceSelector narrows the policy: kube-public gets no warning.
    let out = c.kubectl(&["create", "configmap", "untagged", "-n", "kube-public"]);
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("Warning"));

    // Table columns as upstream's.
    let policies = c.k(&["get", "validatingadmissionpolicies"]);
    let header: Vec<&str> = policies.lines().next().unwrap_or("").split_whitespace().collect();
    assert_eq!(header, ["NAME", "VALIDATIONS", "PARAMKIND", "AGE"]);
    assert!(
        policies
            .lines()
            .any(|l| l.split_whitespace().take(3).collect::<Vec<_>>() == ["replicas-limit", "1", "<unset>"]),
        "{policies}"
    );
    let bindings = c.k(&["get", "validatingadmissionpolicybindings"]);
    let header: Vec<&str> = bindings.lines().next().unwrap_or("").split_whitespace().collect();
    assert_eq!(header, ["NAME", "POLICYNAME", "PARAMREF", "AGE"]);

    // Params: a ConfigMap sets the limit for namespaces labelled team=a.
    c.apply(PARAMS_POLICY, &[]);
    c.k(&["create", "namespace", "team-a"]);
    c.k(&["label", "namespace", "team-a", "team=a"]);
    // No params yet, and parameterNotFoundAction Deny.
    let err = c.k_err(&[
        "create",
        "deployment",
        "one",
        "-n",
        "team-a",
        "--image=nginx",
        "--replicas=1",
    ]);
    assert!(
        err.contains("ValidatingAdmissionPolicy 'replicas-from-params' with binding 'replicas-from-params-binding' denied request: no params found for policy binding with `Deny` parameterNotFoundAction"),
        "{err}"
    );
    c.k(&[
        "create",
        "configmap",
        "limits",
        "-n",
        "default",
        "--from-literal=maxReplicas=2",
        "--from-literal=team=x",
    ]);
    let err = c.k_err(&[
        "create",
        "deployment",
        "three",
        "-n",
        "team-a",
        "--image=nginx",
        "--replicas=3",
    ]);
    assert!(
        err.contains("deployments.apps \"three\" is forbidden: ValidatingAdmissionPolicy 'replicas-from-params' with binding 'replicas-from-params-binding' denied request: at most 2 replicas in team-a"),
        "{err}"
    );
    c.k(&[
        "create",
        "deployment",
        "two",
        "-n",
        "team-a",
        "--image=nginx",
        "--replicas=2",
    ]);
    // Namespaces without the label are not matched.
    c.k(&[
        "create",
        "deployment",
        "three",
        "-n",
        "default",
        "--image=nginx",
        "--replicas=3",
    ]);
    let bindings = c.k(&[
        "get",
        "validatingadmissionpolicybindings",
        "replicas-from-params-binding",
        "--no-headers",
    ]);
    assert!(
        bindings.contains("replicas-from-params") && bindings.contains("default/limits"),
        "{bindings}"
    );
    let policies = c.k(&[
        "get",
        "validatingadmissionpolicy",
        "replicas-from-params",
        "--no-headers",
    ]);
    assert!(policies.contains("v1/ConfigMap"), "{policies}");

    // Deleting the binding stops the enforcement.
    c.k(&["delete", "validatingadmissionpolicybinding", "replicas-limit-binding"]);
    c.k(&["create", "deployment", "many", "--image=nginx", "--replicas=8"]);
}

#[test]
fn admission_policies_that_do_not_compile_are_refused() {
    let c = Cluster::start(CONTROL_PLANE);
    let bad = REPLICAS_POLICY.replace("object.spec.replicas <= 5", "object.spec.replicas <<= 5");
    let err = c.stdin_kubectl_err(&["apply", "-f", "-"], &bad);
    assert!(
        err.contains("The ValidatingAdmissionPolicy \"replicas-limit\" is invalid: spec.validations[0].expression: Invalid value: \"object.spec.replicas <<= 5\": compilation failed: ERROR: <input>:1:"),
        "{err}"
    );
    let err = c.stdin_kubectl_err(
        &["apply", "-f", "-"],
        "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicyBinding\nmetadata: {name: b}\nspec: {policyName: p}\n",
    );
    assert!(
        err.contains("spec.validationActions: Required value: at least one validation action is required"),
        "{err}"
    );
}
