//! Progress of the long steps a person waits through (building images, a first pull, a join,
//! `skiff cluster create`): one log line when a step starts, one every few seconds while it
//! lasts saying what it is waiting for and for how long, and one when it is done. The lines go to
//! the log (info), so `--log-format json` carries them too.

use std::time::{Duration, Instant};

/// How often a step that is still going says so.
pub const EVERY: Duration = Duration::from_secs(5);

pub struct Progress {
    what: String,
    started: Instant,
    last: Instant,
    every: Duration,
}

impl Progress {
    /// Starts the step `what` ("creating cluster demo") and says so.
    pub fn start(what: impl Into<String>) -> Progress {
        let what = what.into();
        tracing::info!("{what}");
        let now = Instant::now();
        Progress {
            what,
            started: now,
            last: now,
            every: EVERY,
        }
    }

    /// The step's time so far.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// The line [`Progress::tick`] writes, if one is due (`EVERY` since the last).
    fn due(&mut self, now: Instant, waiting_for: impl FnOnce() -> String) -> Option<String> {
        if now.duration_since(self.last) < self.every {
            return None;
        }
        self.last = now;
        Some(format!(
            "{}: {} ({} s so far)",
            self.what,
            waiting_for(),
            now.duration_since(self.started).as_secs()
        ))
    }

    /// Says what the step is waiting for, at most once every [`EVERY`]; call it as often as
    /// convenient. `waiting_for` is only asked when a line is due.
    pub fn tick(&mut self, waiting_for: impl FnOnce() -> String) {
        if let Some(line) = self.due(Instant::now(), waiting_for) {
            tracing::info!("{line}");
        }
    }

    /// Ends the step: "WHAT: done in 3.2 s", with `detail` after it when not empty.
    pub fn done(self, detail: &str) {
        let secs = self.started.elapsed().as_secs_f64();
        if detail.is_empty() {
            tracing::info!("{}: done in {secs:.1} s", self.what);
        } else {
            tracing::info!("{}: done in {secs:.1} s: {detail}", self.what);
        }
    }
}

/// Bytes as a person reads them: "512 B", "3.4 MB", "1.2 GB" (powers of 1000, as Docker shows
/// pull sizes).
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["kB", "MB", "GB", "TB"];
    if n < 1000 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1000.0;
    let mut unit = 0;
    while value >= 1000.0 && unit < UNITS.len() - 1 {
        value /= 1000.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// A pull's downloaded and total bytes, from the engine's progress messages (one per layer
/// update: its id, status and `progressDetail`).
#[derive(Debug, Default)]
pub struct Pull {
    /// Per layer: bytes downloaded and its size.
    layers: std::collections::BTreeMap<String, (u64, u64)>,
}

impl Pull {
    pub fn update(&mut self, info: &bollard::models::CreateImageInfo) {
        let Some(id) = info.id.as_deref() else {
            return;
        };
        let entry = self.layers.entry(id.to_string()).or_default();
        match info.status.as_deref() {
            Some("Downloading") => {
                if let Some(d) = &info.progress_detail {
                    let current = d.current.and_then(|c| u64::try_from(c).ok()).unwrap_or(0);
                    let total = d.total.and_then(|t| u64::try_from(t).ok()).unwrap_or(0);
                    *entry = (current, total.max(current));
                }
            }
            Some("Download complete" | "Pull complete" | "Already exists") => entry.0 = entry.1,
            _ => {}
        }
    }

    /// "12.3 MB of 45.6 MB, 3 layers".
    pub fn summary(&self) -> String {
        let done: u64 = self.layers.values().map(|(c, _)| c).sum();
        let total: u64 = self.layers.values().map(|(_, t)| t).sum();
        let n = self.layers.len();
        let layers = if n == 1 { "layer" } else { "layers" };
        format!("{} of {}, {n} {layers}", bytes(done), bytes(total))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_due_once_every_period_and_names_the_wait_and_its_time() {
        let mut p = Progress::start("creating cluster demo");
        let t0 = p.started;
        assert_eq!(p.due(t0 + Duration::from_secs(1), || "never asked".into()), None);
        assert_eq!(
            p.due(t0 + Duration::from_secs(6), || "node demo-2 to be Ready".into())
                .as_deref(),
            Some("creating cluster demo: node demo-2 to be Ready (6 s so far)")
        );
        assert_eq!(p.due(t0 + Duration::from_secs(9), || "again".into()), None);
        assert!(p.due(t0 + Duration::from_secs(11), || "again".into()).is_some());
    }

    #[test]
    fn a_pull_adds_its_layers_progress() {
        use bollard::models::{CreateImageInfo, ProgressDetail};
        let msg = |id: &str, status: &str, current: i64, total: i64| CreateImageInfo {
            id: Some(id.into()),
            status: Some(status.into()),
            progress_detail: Some(ProgressDetail {
                current: Some(current),
                total: Some(total),
            }),
            ..Default::default()
        };
        let mut pull = Pull::default();
        pull.update(&msg("a", "Pulling fs layer", 0, 0));
        pull.update(&msg("a", "Downloading", 1_000_000, 30_000_000));
        pull.update(&msg("b", "Downloading", 2_500_000, 5_000_000));
        assert_eq!(pull.summary(), "3.5 MB of 35.0 MB, 2 layers");
        pull.update(&msg("b", "Download complete", 0, 0));
        assert_eq!(pull.summary(), "6.0 MB of 35.0 MB, 2 layers");
    }

    #[test]
    fn sizes_read_as_docker_shows_them() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3_400_000), "3.4 MB");
        assert_eq!(bytes(1_260_000_000), "1.3 GB");
    }
}
