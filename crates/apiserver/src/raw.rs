//! A JSON object whose members stay unparsed, for writes that change a few fields of a large
//! stored object (a binding sets `spec.nodeName` and one condition of a pod) without building
//! the whole tree. Member order is kept, so the result is what the generic path would store.

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;

/// An object's members, in order, each as its JSON text.
#[derive(Debug, Default)]
pub struct RawObject(Vec<(String, Box<RawValue>)>);

impl RawObject {
    pub fn parse(bytes: &[u8]) -> serde_json::Result<RawObject> {
        serde_json::from_slice(bytes)
    }

    pub fn get(&self, key: &str) -> Option<&RawValue> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| &**v)
    }

    /// The member if it is a string; `None` when it is missing, null or not a string.
    pub fn get_str(&self, key: &str) -> Option<String> {
        self.get(key)
            .and_then(|v| serde_json::from_str::<Option<String>>(v.get()).ok().flatten())
    }

    /// Whether the member is present and not null.
    pub fn has(&self, key: &str) -> bool {
        self.get(key).is_some_and(|v| v.get() != "null")
    }

    /// The member if it is an object (`None` when missing or of another type).
    pub fn object(&self, key: &str) -> Option<RawObject> {
        self.get(key).and_then(|v| serde_json::from_str(v.get()).ok())
    }

    /// The member decoded as a generic value.
    pub fn value(&self, key: &str) -> Option<serde_json::Value> {
        self.get(key).and_then(|v| serde_json::from_str(v.get()).ok())
    }

    /// Sets a member: in place when present, last otherwise (as an ordered map's insert).
    pub fn insert<T: Serialize + ?Sized>(&mut self, key: &str, value: &T) -> serde_json::Result<()> {
        let raw = serde_json::value::to_raw_value(value)?;
        match self.0.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = raw,
            None => self.0.push((key.to_string(), raw)),
        }
        Ok(())
    }

    /// Removes a member, keeping the others' order.
    pub fn remove(&mut self, key: &str) {
        self.0.retain(|(k, _)| k != key);
    }

    pub fn to_vec(&self) -> serde_json::Result<Vec<u8>> {
        serde_json::to_vec(self)
    }
}

impl Serialize for RawObject {
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        let mut map = ser.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for RawObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> Visitor<'de> for Members {
            type Value = RawObject;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<RawObject, A::Error> {
                let mut members = Vec::with_capacity(access.size_hint().unwrap_or(8));
                while let Some((k, v)) = access.next_entry::<String, Box<RawValue>>()? {
                    // A repeated key counts once, the last one winning, as in a decoded map.
                    match members
                        .iter_mut()
                        .find(|(old, _): &&mut (String, Box<RawValue>)| *old == k)
                    {
                        Some((_, old)) => *old = v,
                        None => members.push((k, v)),
                    }
                }
                Ok(RawObject(members))
            }
        }
        d.deserialize_map(Members)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn members_keep_their_text_and_order() {
        let text = br#"{"kind":"Pod","metadata":{"name":"a","uid":"u"},"spec":{"containers":[{"name":"c"}]},"n":null}"#;
        let mut o = RawObject::parse(text).unwrap();
        assert_eq!(o.to_vec().unwrap(), text.to_vec());
        assert_eq!(o.object("metadata").unwrap().get_str("uid").as_deref(), Some("u"));
        assert_eq!(o.get_str("n"), None);
        assert!(!o.has("n") && o.has("kind") && !o.has("missing"));
        assert!(o.object("kind").is_none());
        let mut spec = o.object("spec").unwrap();
        spec.insert("nodeName", "n1").unwrap();
        o.insert("spec", &spec).unwrap();
        o.insert("status", &json!({"phase": "Pending"})).unwrap();
        o.remove("n");
        let back: Value = serde_json::from_slice(&o.to_vec().unwrap()).unwrap();
        let want = json!({"kind": "Pod", "metadata": {"name": "a", "uid": "u"},
            "spec": {"containers": [{"name": "c"}], "nodeName": "n1"}, "status": {"phase": "Pending"}});
        assert_eq!(back, want);
        let keys: Vec<&String> = back.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["kind", "metadata", "spec", "status"]);
    }

    #[test]
    fn not_an_object_is_an_error() {
        assert!(RawObject::parse(b"[1]").is_err());
        assert!(RawObject::parse(b"{\"a\":").is_err());
        assert!(RawObject::parse(b"\"x\"").is_err());
    }
}
