//! Upstream's `pkg/controller/volume/protectionutil`: when the storage protection controllers add
//! or consider removing their finalizer.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

fn has_finalizer(meta: &ObjectMeta, finalizer: &str) -> bool {
    meta.finalizers.iter().flatten().any(|f| f == finalizer)
}

/// Being deleted and still holding `finalizer`: the controller decides whether it may go.
pub fn is_deletion_candidate(meta: &ObjectMeta, finalizer: &str) -> bool {
    meta.deletion_timestamp.is_some() && has_finalizer(meta, finalizer)
}

/// Not being deleted and without `finalizer` (created before the admission plugin added it).
pub fn need_to_add_finalizer(meta: &ObjectMeta, finalizer: &str) -> bool {
    meta.deletion_timestamp.is_none() && !has_finalizer(meta, finalizer)
}

/// `finalizers` without every `finalizer` (upstream's `slice.RemoveString`); `None` when empty.
pub fn without(finalizers: Option<&Vec<String>>, finalizer: &str) -> Option<Vec<String>> {
    let rest: Vec<String> = finalizers
        .into_iter()
        .flatten()
        .filter(|f| *f != finalizer)
        .cloned()
        .collect();
    (!rest.is_empty()).then_some(rest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn candidates_and_missing_finalizers() {
        let f = "kubernetes.io/pvc-protection";
        let mut meta = ObjectMeta::default();
        assert!(need_to_add_finalizer(&meta, f));
        assert!(!is_deletion_candidate(&meta, f));
        meta.finalizers = Some(vec![f.to_string()]);
        assert!(!need_to_add_finalizer(&meta, f));
        assert!(!is_deletion_candidate(&meta, f));
        meta.deletion_timestamp = Some(Time(jiff::Timestamp::now()));
        assert!(is_deletion_candidate(&meta, f));
        meta.finalizers = Some(vec!["other".to_string()]);
        assert!(!is_deletion_candidate(&meta, f));
        // Being deleted without it: nothing to add.
        assert!(!need_to_add_finalizer(&meta, f));
    }

    #[test]
    fn without_removes_every_copy() {
        let f = "kubernetes.io/pv-protection";
        let list = vec![f.to_string(), "a".to_string(), f.to_string()];
        assert_eq!(without(Some(&list), f), Some(vec!["a".to_string()]));
        assert_eq!(without(Some(&vec![f.to_string()]), f), None);
        assert_eq!(without(None, f), None);
    }
}
