//! Upstream's DefaultIngressClass admission plugin: an Ingress created without a class (neither
//! `spec.ingressClassName` nor the `kubernetes.io/ingress.class` annotation) gets the
//! IngressClass annotated `ingressclass.kubernetes.io/is-default-class: "true"`. More than one
//! default refuses the Ingress, as upstream does. Creates of the main resource only. Also the
//! Ingress strategy's warning on create about that deprecated annotation.

use serde_json::{Value, json};
use skiff_api::StatusError;

use crate::handlers::Ctx;
use crate::objects;

const IS_DEFAULT_CLASS: &str = "ingressclass.kubernetes.io/is-default-class";
const INGRESS_CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";

/// Whether the plugin looks at this write.
pub fn applies(ctx: &Ctx) -> bool {
    let res = ctx.rr.resource;
    res.group == "networking.k8s.io" && res.plural == "ingresses" && ctx.rr.subresource.is_empty()
}

/// upstream's Ingress `WarningsOnCreate`: the class annotation is deprecated.
pub fn warnings_on_create(ctx: &Ctx, ingress: &Value) -> Vec<String> {
    let annotated = ingress
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(INGRESS_CLASS_ANNOTATION))
        .is_some();
    if applies(ctx) && annotated {
        vec![format!(
            "annotation {INGRESS_CLASS_ANNOTATION:?} is deprecated, please use 'spec.ingressClassName' instead"
        )]
    } else {
        Vec::new()
    }
}

/// Whether the Ingress names its class already.
fn has_class(ingress: &Value) -> bool {
    ingress.pointer("/spec/ingressClassName").is_some_and(|v| !v.is_null())
        || ingress
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(INGRESS_CLASS_ANNOTATION))
            .is_some()
}

/// upstream's `getDefaultClass`: the one class marked default, none, or an error naming how
/// many are.
fn default_class(classes: &[Value]) -> Result<Option<String>, String> {
    let defaults: Vec<&Value> = classes
        .iter()
        .filter(|c| {
            c.pointer("/metadata/annotations")
                .and_then(|a| a.get(IS_DEFAULT_CLASS))
                .and_then(Value::as_str)
                == Some("true")
        })
        .collect();
    match defaults.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(objects::name(one).to_string())),
        many => Err(format!(
            "{} default IngressClasses were found, only 1 allowed",
            many.len()
        )),
    }
}

/// Sets `spec.ingressClassName` of an Ingress created without a class to the default class.
pub async fn admit(ctx: &Ctx, ingress: &mut Value) -> Result<(), StatusError> {
    if !applies(ctx) || has_class(ingress) {
        return Ok(());
    }
    let Some(classes) = skiff_api::registry::lookup("networking.k8s.io", "v1", "ingressclasses") else {
        return Ok(());
    };
    let page = ctx
        .state
        .store
        .list(&objects::prefix(classes, ""), Default::default())
        .await
        .map_err(|e| ctx.store_err(e))?;
    // Only classes that mention the annotation need decoding (this runs for every Ingress).
    let candidates: Vec<Value> = page
        .items
        .iter()
        .filter(|kv| {
            kv.value
                .windows(IS_DEFAULT_CLASS.len())
                .any(|w| w == IS_DEFAULT_CLASS.as_bytes())
        })
        .filter_map(objects::decode_kv)
        .collect();
    match default_class(&candidates) {
        Ok(None) => Ok(()),
        Ok(Some(class)) => {
            if let Some(m) = ingress.as_object_mut() {
                let spec = m.entry("spec").or_insert_with(|| json!({}));
                if let Some(spec) = spec.as_object_mut() {
                    spec.insert("ingressClassName".into(), json!(class));
                }
            }
            Ok(())
        }
        Err(e) => Err(StatusError::forbidden_resource(
            "networking.k8s.io",
            "ingresses",
            objects::name(ingress),
            &format!("Internal error occurred: {e}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(name: &str, default: Option<&str>) -> Value {
        let mut c = json!({"metadata": {"name": name}, "spec": {"controller": "a.io/b"}});
        if let Some(d) = default {
            c["metadata"]["annotations"] = json!({IS_DEFAULT_CLASS: d});
        }
        c
    }

    #[test]
    fn the_one_default_class_is_chosen() {
        assert_eq!(default_class(&[]), Ok(None));
        assert_eq!(default_class(&[class("a", None), class("b", Some("false"))]), Ok(None));
        assert_eq!(
            default_class(&[class("a", None), class("b", Some("true"))]),
            Ok(Some("b".to_string()))
        );
        assert_eq!(
            default_class(&[class("a", Some("true")), class("b", Some("true"))]),
            Err("2 default IngressClasses were found, only 1 allowed".to_string())
        );
    }

    #[test]
    fn a_class_or_the_annotation_keeps_the_ingress_as_it_is() {
        assert!(!has_class(&json!({"spec": {}})));
        assert!(!has_class(&json!({"spec": {"ingressClassName": null}})));
        assert!(has_class(&json!({"spec": {"ingressClassName": "x"}})));
        assert!(has_class(
            &json!({"metadata": {"annotations": {"kubernetes.io/ingress.class": "nginx"}}, "spec": {}})
        ));
    }
}
