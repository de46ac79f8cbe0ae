//! Upstream's `assumecache` for PersistentVolumes and claims: the objects as the watch last
//! brought them, and over them the versions the scheduler assumed for pods it has placed (a
//! volume pre-bound to a claim, a claim with a selected node) until the API confirms or the
//! binding fails. Pods scheduled meanwhile see the assumed versions, so two pods never pick one
//! volume. A newer object from the watch replaces an assumed one.

use std::collections::HashMap;
use std::sync::Arc;

use kube::Resource;

/// Why an object cannot be assumed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssumeError {
    #[error("{0} {1:?} not found")]
    NotFound(&'static str, String),
    #[error("{0} {1:?} is out of sync (stored: {2}, assume: {3})")]
    OutOfSync(&'static str, String, u64, u64),
}

/// What a watch event did to the cache.
#[derive(Debug)]
pub enum Updated<T> {
    Added,
    /// Replaced this (the API's previous version).
    Replaced(Arc<T>),
    /// Not newer than what is held.
    Ignored,
}

#[derive(Debug)]
struct Entry<T> {
    /// As the API last reported it.
    api: Arc<T>,
    /// The assumed version, or the API's.
    latest: Arc<T>,
}

/// Objects by key (`namespace/name`, or the name of cluster-scoped ones).
#[derive(Debug)]
pub struct AssumeCache<T> {
    description: &'static str,
    objects: HashMap<String, Entry<T>>,
}

/// An object's resourceVersion as a number (upstream's `APIObjectVersioner`); 0 when unset.
fn version<T: Resource>(obj: &T) -> u64 {
    obj.meta()
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The cache key of an object.
pub fn key_of<T: Resource>(obj: &T) -> String {
    let m = obj.meta();
    let name = m.name.as_deref().unwrap_or_default();
    match m.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    }
}

impl<T: Resource> AssumeCache<T> {
    pub fn new(description: &'static str) -> Self {
        AssumeCache {
            description,
            objects: HashMap::new(),
        }
    }

    /// The object as pods are scheduled against it: the assumed version if any.
    pub fn get(&self, key: &str) -> Option<&Arc<T>> {
        self.objects.get(key).map(|e| &e.latest)
    }

    /// The object as the API last reported it.
    pub fn get_api(&self, key: &str) -> Option<&Arc<T>> {
        self.objects.get(key).map(|e| &e.api)
    }

    /// Every object, assumed versions first.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<T>> {
        self.objects.values().map(|e| &e.latest)
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// An object from the watch. One not newer than what is held (the assumed version
    /// included) is ignored; a newer one replaces both.
    pub fn update(&mut self, obj: Arc<T>) -> Updated<T> {
        let key = key_of(obj.as_ref());
        if let Some(e) = self.objects.get(&key)
            && version(obj.as_ref()) <= version(e.latest.as_ref())
        {
            return Updated::Ignored;
        }
        let entry = Entry {
            api: obj.clone(),
            latest: obj,
        };
        match self.objects.insert(key, entry) {
            Some(old) => Updated::Replaced(old.api),
            None => Updated::Added,
        }
    }

    /// The object was deleted; returns it.
    pub fn delete(&mut self, key: &str) -> Option<Arc<T>> {
        self.objects.remove(key).map(|e| e.api)
    }

    /// Keeps only the objects whose key `keep` accepts (after a relist: those the list held).
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.objects.retain(|k, _| keep(k));
    }

    /// Makes `obj` the version pods are scheduled against, until the watch brings a newer
    /// one or it is restored. It must be of the version held.
    pub fn assume(&mut self, obj: T) -> Result<(), AssumeError> {
        let key = key_of(&obj);
        let Some(e) = self.objects.get_mut(&key) else {
            return Err(AssumeError::NotFound(self.description, key));
        };
        let (stored, new) = (version(e.latest.as_ref()), version(&obj));
        if new < stored {
            return Err(AssumeError::OutOfSync(self.description, key, stored, new));
        }
        e.latest = Arc::new(obj);
        Ok(())
    }

    /// Drops an assumed version: the API's is used again.
    pub fn restore(&mut self, key: &str) {
        if let Some(e) = self.objects.get_mut(key) {
            e.latest = e.api.clone();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pv(name: &str, rv: &str, claim: Option<&str>) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                claim_ref: claim.map(|c| ObjectReference {
                    name: Some(c.into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn claim_of(c: &AssumeCache<PersistentVolume>, key: &str) -> Option<String> {
        c.get(key)
            .and_then(|p| p.spec.as_ref())
            .and_then(|s| s.claim_ref.as_ref())
            .and_then(|r| r.name.clone())
    }

    #[test]
    fn assume_restore_and_newer_api_versions() {
        let mut c = AssumeCache::new("v1.PersistentVolume");
        c.update(Arc::new(pv("a", "5", None)));
        c.assume(pv("a", "5", Some("data"))).unwrap();
        assert_eq!(claim_of(&c, "a").as_deref(), Some("data"));
        assert!(c.get_api("a").unwrap().spec.as_ref().unwrap().claim_ref.is_none());
        c.restore("a");
        assert_eq!(claim_of(&c, "a"), None);

        // An older version cannot be assumed; an unknown object neither.
        c.update(Arc::new(pv("a", "7", None)));
        assert_eq!(
            c.assume(pv("a", "5", Some("x"))).unwrap_err().to_string(),
            "v1.PersistentVolume \"a\" is out of sync (stored: 7, assume: 5)"
        );
        assert!(matches!(c.assume(pv("b", "1", None)), Err(AssumeError::NotFound(_, _))));

        // The watch's same or older version keeps the assumption; a newer one ends it.
        c.assume(pv("a", "7", Some("data"))).unwrap();
        assert!(matches!(c.update(Arc::new(pv("a", "7", None))), Updated::Ignored));
        assert_eq!(claim_of(&c, "a").as_deref(), Some("data"));
        c.update(Arc::new(pv("a", "8", Some("other"))));
        assert_eq!(claim_of(&c, "a").as_deref(), Some("other"));
        c.restore("a");
        assert_eq!(claim_of(&c, "a").as_deref(), Some("other"));
        assert!(c.delete("a").is_some());
        assert!(c.is_empty());
    }

    #[test]
    fn retain_keeps_what_a_relist_held() {
        let mut c = AssumeCache::new("v1.PersistentVolume");
        c.update(Arc::new(pv("a", "1", None)));
        c.update(Arc::new(pv("b", "1", None)));
        c.assume(pv("a", "1", Some("data"))).unwrap();
        c.retain(|k| k == "b");
        assert!(c.get("a").is_none());
        assert!(c.get("b").is_some());
        assert_eq!(c.len(), 1);
    }
}
