//! CEL in the API, driven by the real kubectl: CustomResourceDefinition
//! `x-kubernetes-validations` rules (a rule refusing objects with upstream's message, a
//! transition rule making a field immutable, a rule that does not compile refusing the
//! definition).

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
