//! Errors as upstream words them: each malformed body, wrong type, conflict and invalid field
//! sent as a client sends it, and the `Status` (code, reason, message) held against what
//! upstream's code produces for the same input: the decoders (`transformDecodeError`, Go's
//! JSON scanner), the patchers (json-patch's merge and decode, the strategic patcher), the
//! registry's conflict and existence errors, and the validation texts.

#![cfg(test)]

mod common;

use common::Cluster;
use serde_json::Value;

/// One request as a program sends it: the answer's code and its `Status`.
fn send(c: &Cluster, method: &str, path: &str, content_type: &str, body: &str) -> (u16, Value) {
    let (code, answer) = c.admin_curl(method, path, content_type, body.as_bytes());
    let status = serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {answer}"));
    (code, status)
}

const JSON: &str = "application/json";
const STRATEGIC: &str = "application/strategic-merge-patch+json";
const MERGE: &str = "application/merge-patch+json";
const JSON_PATCH: &str = "application/json-patch+json";

/// What is sent (a name for the case, method, path, content type, body) and what upstream
/// answers (code, reason, message).
type Case<'a> = (&'a str, &'a str, &'a str, &'a str, String, u16, &'a str, String);

const CMS: &str = "/api/v1/namespaces/default/configmaps";
const CM: &str = "/api/v1/namespaces/default/configmaps/c";

#[test]
fn every_error_is_worded_as_upstreams_code_words_it() {
    let c = Cluster::start(&["--no-agent", "--no-scheduler"]);
    c.k(&["create", "configmap", "c", "--from-literal=a=b"]);
    let rv = c.k(&["get", "configmap", "c", "-o", "jsonpath={.metadata.resourceVersion}"]);
    c.k(&["label", "configmap", "c", "changed=yes"]);
    let stale =
        format!(r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"c","resourceVersion":"{rv}"}}}}"#);
    let strict = format!("{CMS}?fieldValidation=Strict");
    let rfc1123 = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
    let cases: Vec<Case> = vec![
        // transformDecodeError over the JSON serializer's Interpret.
        (
            "a truncated body",
            "POST",
            CMS,
            JSON,
            r#"{"kind":"ConfigMap","#.into(),
            400,
            "BadRequest",
            r#"the object provided is unrecognized (must be of type ConfigMap): couldn't get version/kind; json parse error: unexpected end of JSON input ({"kind":"ConfigMap",)"#.into(),
        ),
        (
            "YAML sent as JSON",
            "POST",
            CMS,
            JSON,
            "kind: ConfigMap\n".into(),
            400,
            "BadRequest",
            "the object provided is unrecognized (must be of type ConfigMap): couldn't get version/kind; json parse error: invalid character 'k' looking for beginning of value (6b696e643a20436f6e6669674d61700a)".into(),
        ),
        // The decoder's type error and strict decoding.
        (
            "a number for a map",
            "POST",
            CMS,
            JSON,
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"n"},"data":5}"#.into(),
            400,
            "BadRequest",
            "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: json: cannot unmarshal number into Go struct field ConfigMap.data of type map[string]string".into(),
        ),
        (
            "an unknown field, strictly",
            "POST",
            &strict,
            JSON,
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"s"},"bogus":1}"#.into(),
            400,
            "BadRequest",
            "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: strict decoding error: unknown field \"bogus\"".into(),
        ),
        // The registry.
        (
            "a name taken",
            "POST",
            CMS,
            JSON,
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"}}"#.into(),
            409,
            "AlreadyExists",
            "configmaps \"c\" already exists".into(),
        ),
        (
            "nothing by that name",
            "GET",
            "/api/v1/namespaces/default/configmaps/missing",
            JSON,
            String::new(),
            404,
            "NotFound",
            "configmaps \"missing\" not found".into(),
        ),
        (
            "a stale resourceVersion",
            "PUT",
            CM,
            JSON,
            stale,
            409,
            "Conflict",
            "Operation cannot be fulfilled on configmaps \"c\": the object has been modified; please apply your changes to the latest version and try again".into(),
        ),
        (
            "another name than the URL's",
            "PUT",
            CM,
            JSON,
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"other"}}"#.into(),
            400,
            "BadRequest",
            "the name of the object (other) does not match the name on the URL (c)".into(),
        ),
        (
            "a write to the collection",
            "PUT",
            CMS,
            JSON,
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"}}"#.into(),
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource".into(),
        ),
        // Validation.
        (
            "no name",
            "POST",
            CMS,
            JSON,
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{}}"#.into(),
            422,
            "Invalid",
            "ConfigMap \"\" is invalid: metadata.name: Required value: name or generateName is required".into(),
        ),
        (
            "a name that is no DNS subdomain",
            "POST",
            CMS,
            JSON,
            r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"Bad_Name"}}"#.into(),
            422,
            "Invalid",
            format!("ConfigMap \"Bad_Name\" is invalid: metadata.name: Invalid value: \"Bad_Name\": {rfc1123}"),
        ),
        // The patchers: the strategic patcher's decoder, json-patch's merge and decode.
        (
            "a strategic patch that is no JSON",
            "PATCH",
            CM,
            STRATEGIC,
            "{".into(),
            400,
            "BadRequest",
            "unexpected end of JSON input".into(),
        ),
        (
            "a merge patch that is no JSON",
            "PATCH",
            CM,
            MERGE,
            "{".into(),
            400,
            "BadRequest",
            "Invalid JSON Patch".into(),
        ),
        (
            "a JSON patch that is no JSON",
            "PATCH",
            CM,
            JSON_PATCH,
            r#"[{"op":"add"}"#.into(),
            400,
            "BadRequest",
            "unexpected end of JSON input".into(),
        ),
        (
            "a JSON patch that is no list",
            "PATCH",
            CM,
            JSON_PATCH,
            "{}".into(),
            400,
            "BadRequest",
            "json: cannot unmarshal object into Go value of type jsonpatch.Patch".into(),
        ),
        (
            "a strategic patch giving a map a string",
            "PATCH",
            CM,
            STRATEGIC,
            r#"{"metadata":{"labels":"invalid"}}"#.into(),
            422,
            "Invalid",
            " \"\" is invalid: patch: Invalid value: \"map[metadata:map[labels:invalid]]\": cannot restore map from string".into(),
        ),
    ];
    let mut wrong = Vec::new();
    for (what, method, path, content_type, body, code, reason, message) in &cases {
        let (got, status) = send(&c, method, path, content_type, body);
        let want = (*code, *reason, message.as_str());
        let seen = (
            got,
            status["reason"].as_str().unwrap_or(""),
            status["message"].as_str().unwrap_or(""),
        );
        if seen != want || status["kind"] != "Status" || status["status"] != "Failure" {
            wrong.push(format!("{what}:\n  want {want:?}\n  got  {seen:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // Nothing any of them sent was written.
    let cm = c.get_json(&["configmap", "c"]);
    assert_eq!(cm["data"], serde_json::json!({"a": "b"}));
    assert_eq!(cm["metadata"]["labels"], serde_json::json!({"changed": "yes"}));
    let names = c.k(&["get", "configmaps", "-o", "name"]);
    assert!(
        !names.contains("configmap/n") && !names.contains("configmap/s"),
        "{names}"
    );
}
