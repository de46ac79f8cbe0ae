//! Node pressure, as the kubelet's eviction manager observes it (`pkg/kubelet/eviction`): every
//! 10 s the node's signals are measured against its hard eviction thresholds (`--eviction-hard`,
//! upstream's defaults `memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%,
//! imagefs.available<15%,imagefs.inodesFree<5%`), and the Node's `MemoryPressure`, `DiskPressure`
//! and `PIDPressure` conditions say which are crossed. A condition stays True for
//! `--eviction-pressure-transition-period` (5 min) after its last crossing, so it does not flap.
//!
//! Signals: `memory.available` is the host's `MemAvailable` (the kubelet subtracts the root
//! cgroup's working set from capacity, which comes to nearly the same on a host running only
//! containers); `nodefs` is the filesystem of the agent's data dir, `imagefs` the Docker Engine's
//! root dir; `pid.available` is `kernel.pid_max` less the processes running.
//!
//! Not done yet: evicting pods under pressure (the kubelet's ranking and its `Evicted` status).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::sync::watch;

/// How often the signals are measured (the kubelet's housekeeping interval).
pub const MONITORING_INTERVAL: Duration = Duration::from_secs(10);
/// Upstream's `--eviction-pressure-transition-period`.
pub const PRESSURE_TRANSITION_PERIOD: Duration = Duration::from_secs(300);
/// Upstream's `--eviction-hard` defaults on Linux.
pub const DEFAULT_EVICTION_HARD: &str =
    "memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%,imagefs.available<15%,imagefs.inodesFree<5%";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Signal {
    MemoryAvailable,
    NodeFsAvailable,
    NodeFsInodesFree,
    ImageFsAvailable,
    ImageFsInodesFree,
    PidAvailable,
}

impl Signal {
    fn parse(s: &str) -> anyhow::Result<Signal> {
        Ok(match s {
            "memory.available" => Signal::MemoryAvailable,
            "nodefs.available" => Signal::NodeFsAvailable,
            "nodefs.inodesFree" => Signal::NodeFsInodesFree,
            "imagefs.available" => Signal::ImageFsAvailable,
            "imagefs.inodesFree" => Signal::ImageFsInodesFree,
            "pid.available" => Signal::PidAvailable,
            other => bail!("unsupported eviction signal {other:?}"),
        })
    }

    pub fn name(&self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::NodeFsAvailable => "nodefs.available",
            Signal::NodeFsInodesFree => "nodefs.inodesFree",
            Signal::ImageFsAvailable => "imagefs.available",
            Signal::ImageFsInodesFree => "imagefs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }
}

/// A threshold's quantity: absolute (bytes, inodes, pids) or a share of the capacity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Quantity {
    Absolute(u64),
    Percent(f64),
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Threshold {
    pub signal: Signal,
    pub quantity: Quantity,
}

/// Parses `--eviction-hard` (`SIGNAL<QUANTITY` pairs separated by commas, as the kubelet).
pub fn parse_thresholds(s: &str) -> anyhow::Result<Vec<Threshold>> {
    let mut out: Vec<Threshold> = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (signal, quantity) = part
            .split_once('<')
            .with_context(|| format!("{part:?}: expected SIGNAL<QUANTITY"))?;
        let signal = Signal::parse(signal.trim())?;
        let quantity = quantity.trim();
        let quantity = match quantity.strip_suffix('%') {
            Some(p) => {
                let p: f64 = p.parse().with_context(|| format!("{part:?}: not a percentage"))?;
                anyhow::ensure!((0.0..=100.0).contains(&p), "{part:?}: a percentage is 0 to 100");
                Quantity::Percent(p / 100.0)
            }
            None => {
                let v = crate::quantity::parse_value(quantity).with_context(|| format!("{part:?}: not a quantity"))?;
                Quantity::Absolute(u64::try_from(v).with_context(|| format!("{part:?}: negative"))?)
            }
        };
        anyhow::ensure!(
            !out.iter().any(|t| t.signal == signal),
            "{part:?}: {} given twice",
            signal.name()
        );
        out.push(Threshold { signal, quantity });
    }
    Ok(out)
}

/// One measurement of a signal: what is available, out of what capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observation {
    pub available: u64,
    pub capacity: u64,
}

/// The node's signals as measured (a signal that could not be measured is absent).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observations(pub Vec<(Signal, Observation)>);

impl Observations {
    fn get(&self, signal: Signal) -> Option<Observation> {
        self.0.iter().find(|(s, _)| *s == signal).map(|(_, o)| *o)
    }
}

/// The thresholds `observations` cross (upstream's `thresholdsMet`).
pub fn crossed(thresholds: &[Threshold], observations: &Observations) -> Vec<Threshold> {
    thresholds
        .iter()
        .filter(|t| {
            let Some(o) = observations.get(t.signal) else {
                return false;
            };
            let limit = match t.quantity {
                Quantity::Absolute(v) => v as f64,
                Quantity::Percent(p) => o.capacity as f64 * p,
            };
            (o.available as f64) < limit
        })
        .copied()
        .collect()
}

/// Which of the Node's pressure conditions are True.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pressure {
    pub memory: bool,
    pub disk: bool,
    pub pid: bool,
}

fn pressure_of(crossed: &[Threshold]) -> Pressure {
    let mut p = Pressure::default();
    for t in crossed {
        match t.signal {
            Signal::MemoryAvailable => p.memory = true,
            Signal::NodeFsAvailable
            | Signal::NodeFsInodesFree
            | Signal::ImageFsAvailable
            | Signal::ImageFsInodesFree => p.disk = true,
            Signal::PidAvailable => p.pid = true,
        }
    }
    p
}

/// Keeps each condition True for the transition period after it was last observed.
#[derive(Debug)]
pub struct PressureTracker {
    period: Duration,
    last: [Option<Instant>; 3],
}

impl PressureTracker {
    pub fn new(period: Duration) -> Self {
        Self {
            period,
            last: [None; 3],
        }
    }

    /// The conditions in force after observing `now` the thresholds `crossed`.
    pub fn observe(&mut self, crossed: &[Threshold], now: Instant) -> Pressure {
        let seen = pressure_of(crossed);
        for (i, on) in [seen.memory, seen.disk, seen.pid].into_iter().enumerate() {
            if on {
                self.last[i] = Some(now);
            }
        }
        let held = |i: usize| self.last[i].is_some_and(|t| now.duration_since(t) < self.period);
        Pressure {
            memory: held(0),
            disk: held(1),
            pid: held(2),
        }
    }
}

fn statvfs_observations(path: &Path, bytes: Signal, inodes: Signal, out: &mut Vec<(Signal, Observation)>) {
    match rustix::fs::statvfs(path) {
        Ok(st) => {
            out.push((
                bytes,
                Observation {
                    available: st.f_bavail.saturating_mul(st.f_frsize),
                    capacity: st.f_blocks.saturating_mul(st.f_frsize),
                },
            ));
            if st.f_files > 0 {
                out.push((
                    inodes,
                    Observation {
                        available: st.f_favail,
                        capacity: st.f_files,
                    },
                ));
            }
        }
        Err(e) => tracing::debug!(path = %path.display(), error = %e, "measuring a filesystem"),
    }
}

/// `MemAvailable` and `MemTotal` of a `/proc/meminfo`, in bytes.
pub fn meminfo(text: &str) -> Option<Observation> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    Some(Observation {
        available: field("MemAvailable:")?,
        capacity: field("MemTotal:")?,
    })
}

/// Measures every signal (blocking: filesystem and /proc reads).
pub fn observe(nodefs: &Path, imagefs: Option<&Path>) -> Observations {
    let mut out = Vec::new();
    if let Some(memory) = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .as_deref()
        .and_then(meminfo)
    {
        out.push((Signal::MemoryAvailable, memory));
    }
    statvfs_observations(nodefs, Signal::NodeFsAvailable, Signal::NodeFsInodesFree, &mut out);
    let imagefs = imagefs.unwrap_or(nodefs);
    statvfs_observations(imagefs, Signal::ImageFsAvailable, Signal::ImageFsInodesFree, &mut out);
    let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    if let Some(pid_max) = pid_max {
        let running = std::fs::read_dir("/proc")
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| {
                        e.file_name()
                            .to_str()
                            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
                    })
                    .count() as u64
            })
            .unwrap_or(0);
        out.push((
            Signal::PidAvailable,
            Observation {
                available: pid_max.saturating_sub(running),
                capacity: pid_max,
            },
        ));
    }
    Observations(out)
}

/// Measures the node every [`MONITORING_INTERVAL`] and publishes its pressure conditions on
/// `pressure` (a change wakes the node status writer).
pub async fn run(
    thresholds: Vec<Threshold>,
    nodefs: PathBuf,
    imagefs: Option<PathBuf>,
    pressure: watch::Sender<Pressure>,
) {
    let mut tracker = PressureTracker::new(PRESSURE_TRANSITION_PERIOD);
    let mut tick = tokio::time::interval(MONITORING_INTERVAL);
    loop {
        tick.tick().await;
        let (nodefs_path, imagefs_path) = (nodefs.clone(), imagefs.clone());
        let observed = tokio::task::spawn_blocking(move || observe(&nodefs_path, imagefs_path.as_deref())).await;
        let Ok(observations) = observed else {
            continue;
        };
        let crossed = crossed(&thresholds, &observations);
        for t in &crossed {
            if let Some(o) = observations.get(t.signal) {
                tracing::warn!(
                    signal = t.signal.name(),
                    available = o.available,
                    capacity = o.capacity,
                    "eviction threshold crossed"
                );
            }
        }
        let now_in_force = tracker.observe(&crossed, Instant::now());
        pressure.send_if_modified(|p| {
            let changed = *p != now_in_force;
            *p = now_in_force;
            changed
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_thresholds_parse_as_upstreams() {
        let t = parse_thresholds(DEFAULT_EVICTION_HARD).expect("thresholds");
        assert_eq!(t.len(), 5);
        assert_eq!(
            t[0],
            Threshold {
                signal: Signal::MemoryAvailable,
                quantity: Quantity::Absolute(100 * 1024 * 1024)
            }
        );
        assert_eq!(t[1].quantity, Quantity::Percent(0.10));
        assert!(parse_thresholds("memory.available>1Gi").is_err());
        assert!(parse_thresholds("cpu.available<1").is_err());
        assert!(parse_thresholds("nodefs.available<120%").is_err());
        assert!(parse_thresholds("memory.available<1Gi,memory.available<2Gi").is_err());
    }

    #[test]
    fn crossed_thresholds_make_pressure_that_holds_for_the_transition_period() {
        let thresholds = parse_thresholds("memory.available<1Gi,nodefs.available<10%,pid.available<100").expect("t");
        let gib = 1 << 30;
        let obs = |mem: u64, disk: u64, pids: u64| {
            Observations(vec![
                (
                    Signal::MemoryAvailable,
                    Observation {
                        available: mem,
                        capacity: 8 * gib,
                    },
                ),
                (
                    Signal::NodeFsAvailable,
                    Observation {
                        available: disk,
                        capacity: 100,
                    },
                ),
                (
                    Signal::PidAvailable,
                    Observation {
                        available: pids,
                        capacity: 4_194_304,
                    },
                ),
            ])
        };
        assert!(crossed(&thresholds, &obs(2 * gib, 50, 1000)).is_empty());
        let hit = crossed(&thresholds, &obs(gib / 2, 5, 50));
        assert_eq!(hit.len(), 3);
        let start = Instant::now();
        let mut tracker = PressureTracker::new(Duration::from_secs(300));
        assert_eq!(
            tracker.observe(&hit, start),
            Pressure {
                memory: true,
                disk: true,
                pid: true
            }
        );
        // Cleared, but within the transition period: still True.
        let none = crossed(&thresholds, &obs(2 * gib, 50, 1000));
        assert!(tracker.observe(&none, start + Duration::from_secs(60)).memory);
        assert_eq!(
            tracker.observe(&none, start + Duration::from_secs(301)),
            Pressure::default()
        );
    }

    #[test]
    fn meminfo_gives_available_and_total() {
        let text = "MemTotal:       24000000 kB\nMemFree:         1000 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(
            meminfo(text),
            Some(Observation {
                available: 20_000_000 * 1024,
                capacity: 24_000_000 * 1024
            })
        );
        let real = observe(Path::new("/"), None);
        assert!(
            real.get(Signal::MemoryAvailable)
                .is_some_and(|o| o.available <= o.capacity)
        );
        assert!(real.get(Signal::NodeFsAvailable).is_some_and(|o| o.capacity > 0));
        assert!(real.get(Signal::PidAvailable).is_some_and(|o| o.available < o.capacity));
    }
}
