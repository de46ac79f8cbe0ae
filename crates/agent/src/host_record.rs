//! What the node agent has put on its host, written down as it goes (`DATA_DIR/host.json`):
//! the cluster its containers are labelled with, the node, the ranges it routes, its nftables
//! tables and its Docker network. `skiff uninstall` removes exactly these, so it touches nothing
//! of another cluster on the same machine. The agent leaves them in place when it stops (the
//! pods keep their network and Services keep answering, as kube-proxy's rules stay).

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// The record's file name in the agent's data dir.
pub const FILE: &str = "host.json";

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HostRecord {
    /// The uid of the cluster's `kube-system` Namespace: the `io.skiff.cluster` label of every
    /// container the agent made.
    pub cluster: String,
    pub node: String,
    /// Routed here (`unreachable CIDR proto 83`), with the routes to other nodes' podCIDRs
    /// inside it.
    pub cluster_cidr: Option<String>,
    /// Routed to loopback (`local CIDR dev lo table local`).
    pub service_cidr: Option<String>,
    /// `ip` family tables.
    pub nft_tables: Vec<String>,
    /// The Docker network of the node's podCIDR and its Linux bridge.
    pub docker_network: Option<String>,
    pub bridge: Option<String>,
    /// The node's podCIDR, the subnet of its `DOCKER-USER` rules.
    pub pod_cidr: Option<String>,
}

impl HostRecord {
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(FILE)
    }

    /// The record in `dir`; `None` when the agent never wrote one there.
    pub fn read(dir: &Path) -> anyhow::Result<Option<HostRecord>> {
        let path = Self::path(dir);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .with_context(|| format!("reading {}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Changes the record in `dir` with `change` and writes it whole (a new file renamed over
    /// the old, so a crash leaves one or the other).
    pub fn update(dir: &Path, change: impl FnOnce(&mut HostRecord)) -> anyhow::Result<()> {
        let mut record = Self::read(dir)?.unwrap_or_default();
        let before = record.clone();
        change(&mut record);
        if record == before && Self::path(dir).exists() {
            return Ok(());
        }
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let tmp = dir.join(format!("{FILE}.tmp"));
        let bytes = serde_json::to_vec_pretty(&record).context("encoding the host record")?;
        std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, Self::path(dir)).with_context(|| format!("writing {}", Self::path(dir).display()))
    }

    /// [`HostRecord::update`], logged instead of returned: the record must not stop a node.
    pub fn note(dir: &Path, change: impl FnOnce(&mut HostRecord)) {
        if let Err(e) = Self::update(dir, change) {
            tracing::warn!(error = %format!("{e:#}"), "recording what the agent put on the host; `skiff uninstall` will miss it");
        }
    }

    /// Adds an nftables table, once.
    pub fn add_table(&mut self, table: &str) {
        if !self.nft_tables.iter().any(|t| t == table) {
            self.nft_tables.push(table.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn updates_accumulate_and_survive_a_reread() {
        let dir = tempfile::tempdir().expect("dir");
        assert_eq!(HostRecord::read(dir.path()).expect("read"), None);
        HostRecord::update(dir.path(), |r| {
            r.cluster = "uid-1".into();
            r.add_table("skiff");
        })
        .expect("write");
        HostRecord::update(dir.path(), |r| {
            r.add_table("skiff");
            r.add_table("skiff-pods");
            r.cluster_cidr = Some("10.244.0.0/16".into());
        })
        .expect("write");
        let r = HostRecord::read(dir.path()).expect("read").expect("a record");
        assert_eq!(r.cluster, "uid-1");
        assert_eq!(r.nft_tables, ["skiff", "skiff-pods"]);
        assert_eq!(r.cluster_cidr.as_deref(), Some("10.244.0.0/16"));
        assert!(!dir.path().join("host.json.tmp").exists());
    }

    #[test]
    fn a_damaged_record_is_an_error_not_an_empty_one() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join(FILE), b"{not json").expect("write");
        assert!(HostRecord::read(dir.path()).is_err());
    }
}
