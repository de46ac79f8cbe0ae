//! A node's processes: started detached inside the node's network namespace, with a hostname of
//! their own (a UTS namespace per process, named after the node), in the node's cgroup. The
//! engine puts its containers under the same cgroup (`--cgroup-parent`), so the cgroup holds
//! everything that runs on the node, and killing it is the node losing power.
//!
//! The engine starts a mount namespace of its own, where `/sys` is a sysfs of the node's network
//! namespace (so `/sys/class/net` lists the node's interfaces, not the host's: `ip netns exec`
//! does the same) with the host's cgroup mounts moved back onto `/sys/fs/cgroup` (which `ip netns
//! exec` loses, and an engine cannot run without). The agent joins that mount namespace, so the
//! mounts it makes for pods (subPath) are the ones the engine's containers get. Mounts the engine
//! makes stay in it (propagation from the host is one way) and go with it when the node stops.

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

const CGROUP_FS: &str = "/sys/fs/cgroup";

/// The cgroup hierarchy whose membership tells a node's processes: the unified one (cgroup v2),
/// or v1's `pids` controller (every process is in exactly one cgroup of it).
fn tracking_root() -> anyhow::Result<PathBuf> {
    let root = Path::new(CGROUP_FS);
    if root.join("cgroup.controllers").exists() {
        return Ok(root.to_path_buf());
    }
    for v1 in ["pids", "systemd", "memory"] {
        let p = root.join(v1);
        if p.join("cgroup.procs").exists() {
            return Ok(p);
        }
    }
    anyhow::bail!("no cgroup hierarchy found under {CGROUP_FS}")
}

/// Every cgroup hierarchy mounted on this machine (runc makes a container's cgroup in each).
fn hierarchies() -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fstype = right.split_whitespace().next()?;
            let point = left.split_whitespace().nth(4)?;
            (fstype == "cgroup" || fstype == "cgroup2").then(|| PathBuf::from(unescape(point)))
        })
        .collect()
}

/// The cgroup the node's own processes (agent, engine) are started in: a leaf, as cgroup v2
/// wants processes only in leaves.
pub fn processes_cgroup(node_cgroup: &Path) -> PathBuf {
    node_cgroup.join("node")
}

/// The cgroup parent the node's engine puts its containers under.
pub fn containers_cgroup(node_cgroup: &Path) -> PathBuf {
    Path::new("/").join(node_cgroup).join("containers")
}

/// The pids of every process in `cgroup` (relative to a hierarchy's root) and below it.
pub fn processes(cgroup: &Path) -> Vec<i32> {
    let Ok(root) = tracking_root() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut dirs = vec![root.join(cgroup)];
    while let Some(dir) = dirs.pop() {
        if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            out.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
        }
        if let Ok(entries) = std::fs::read_dir(&dir) {
            dirs.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
        }
    }
    out
}

/// Kills every process of the cgroup tree with SIGKILL, until none is left (a process forking
/// meanwhile is caught on the next round).
pub async fn kill_all(cgroup: &Path) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let pids = processes(cgroup);
        if pids.is_empty() {
            return Ok(());
        }
        for pid in &pids {
            // SAFETY: kill takes plain integers; the pid is one the cgroup listed.
            unsafe { libc::kill(*pid, libc::SIGKILL) };
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "processes {pids:?} of cgroup {} survive SIGKILL",
            cgroup.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Removes the cgroup tree from every hierarchy (the engine's containers' cgroups included).
/// Run once its processes are gone.
pub fn remove_cgroups(cgroup: &Path) {
    for root in hierarchies() {
        let top = root.join(cgroup);
        let mut dirs = Vec::new();
        let mut stack = vec![top];
        while let Some(dir) = stack.pop() {
            if let Ok(entries) = std::fs::read_dir(&dir) {
                stack.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
            }
            dirs.push(dir);
        }
        // Children before parents.
        for dir in dirs.iter().rev() {
            if let Err(e) = std::fs::remove_dir(dir)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(error = %e, dir = %dir.display(), "removing a cgroup");
            }
        }
    }
}

/// Removes `parent` from every hierarchy when nothing is left in it (another cluster may still
/// have its cgroups there).
pub fn remove_empty_cgroup(parent: &Path) {
    for root in hierarchies() {
        let _ = std::fs::remove_dir(root.join(parent));
    }
}

/// A process to start on a node.
pub struct Spawn<'a> {
    pub program: &'a Path,
    pub args: Vec<String>,
    pub env: Vec<(&'static str, String)>,
    /// The network namespace (`/run/netns/NAME`).
    pub netns: &'a str,
    pub hostname: &'a str,
    /// The cgroup (relative to each hierarchy's root) it starts in.
    pub cgroup: &'a Path,
    /// Standard output and error go here (appended).
    pub log: &'a Path,
    /// Its pid is written here.
    pub pidfile: &'a Path,
    pub mounts: MountNamespace<'a>,
}

/// The mount namespace a node's process runs in.
pub enum MountNamespace<'a> {
    /// A new one with the node's own `/sys`; `stash` is an empty directory the cgroup mounts
    /// pass through while sysfs is mounted over them.
    New { stash: &'a Path },
    /// The one of this process (the node's engine).
    Join { pid: u32 },
}

/// Starts the process detached (a session of its own, no terminal, not waited for): it keeps
/// running after `skiff cluster` exits.
pub fn spawn(s: Spawn<'_>) -> anyhow::Result<u32> {
    use std::os::unix::process::CommandExt;
    let netns_path = Path::new("/run/netns").join(s.netns);
    let netns = std::fs::File::open(&netns_path).with_context(|| format!("opening {}", netns_path.display()))?;
    let root = tracking_root()?;
    let cgroup_dir = root.join(s.cgroup);
    std::fs::create_dir_all(&cgroup_dir).with_context(|| format!("creating cgroup {}", cgroup_dir.display()))?;
    let procs_path = cgroup_dir.join("cgroup.procs");
    let procs = std::fs::OpenOptions::new()
        .write(true)
        .open(&procs_path)
        .with_context(|| format!("opening {}", procs_path.display()))?;
    let hostname = CString::new(s.hostname).context("a hostname without NUL bytes")?;
    let c = |p: &str| CString::new(p).context("a path without NUL bytes");
    let (root, sys, cgroups, sysfs) = (c("/")?, c("/sys")?, c("/sys/fs/cgroup")?, c("sysfs")?);
    let (stash, join) = match s.mounts {
        MountNamespace::New { stash } => {
            std::fs::create_dir_all(stash).with_context(|| format!("creating {}", stash.display()))?;
            (
                Some(CString::new(stash.as_os_str().as_encoded_bytes()).context("a path without NUL bytes")?),
                None,
            )
        }
        MountNamespace::Join { pid } => {
            let path = format!("/proc/{pid}/ns/mnt");
            let f = std::fs::File::open(&path)
                .with_context(|| format!("opening {path} (is the node's engine running?)"))?;
            (None, Some(f))
        }
    };
    let join_fd = join.as_ref().map(|f| f.as_raw_fd());
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(s.log)
        .with_context(|| format!("opening {}", s.log.display()))?;
    let log2 = log.try_clone().context("duplicating the log's descriptor")?;
    let mut cmd = std::process::Command::new(s.program);
    cmd.args(&s.args)
        .envs(s.env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(log2);
    let (netns_fd, procs_fd) = (netns.as_raw_fd(), procs.as_raw_fd());
    // SAFETY: between fork and exec the closure makes only system calls (no allocation, no
    // locks): its CString and descriptors were prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let check = |rc: libc::c_int| {
                if rc < 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    Ok(())
                }
            };
            check(libc::setsid())?;
            // Into the cgroup first, so that nothing it starts escapes it.
            check(libc::write(procs_fd, b"0".as_ptr().cast(), 1) as libc::c_int)?;
            check(libc::setns(netns_fd, libc::CLONE_NEWNET))?;
            check(libc::unshare(libc::CLONE_NEWUTS))?;
            check(libc::sethostname(hostname.as_ptr(), hostname.as_bytes().len()))?;
            if let Some(fd) = join_fd {
                check(libc::setns(fd, libc::CLONE_NEWNS))?;
            }
            if let Some(stash) = &stash {
                let none = std::ptr::null::<libc::c_char>();
                check(libc::unshare(libc::CLONE_NEWNS))?;
                // Nothing mounted here reaches the host; the host's mounts still reach here.
                check(libc::mount(
                    none,
                    root.as_ptr(),
                    none,
                    libc::MS_REC | libc::MS_SLAVE,
                    std::ptr::null(),
                ))?;
                check(libc::mount(
                    cgroups.as_ptr(),
                    stash.as_ptr(),
                    none,
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ))?;
                let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
                check(libc::mount(
                    sysfs.as_ptr(),
                    sys.as_ptr(),
                    sysfs.as_ptr(),
                    flags,
                    std::ptr::null(),
                ))?;
                check(libc::mount(
                    stash.as_ptr(),
                    cgroups.as_ptr(),
                    none,
                    libc::MS_MOVE,
                    std::ptr::null(),
                ))?;
            }
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {} in {}", s.program.display(), s.netns))?;
    let pid = child.id();
    std::fs::write(s.pidfile, format!("{pid}\n")).with_context(|| format!("writing {}", s.pidfile.display()))?;
    drop((netns, procs, join));
    Ok(pid)
}

/// Whether a process of this pid is alive (a zombie counts as gone).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}

/// `\040`-style escapes of /proc/self/mountinfo.
fn unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8)
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Mount points at or under any of `roots`, deepest first.
pub fn mounts_under(roots: &[PathBuf]) -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = info
        .lines()
        .filter_map(|line| line.split_whitespace().nth(4))
        .map(|p| PathBuf::from(unescape(p)))
        .filter(|p| roots.iter().any(|r| p.starts_with(r)))
        .collect();
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out.dedup();
    out
}

/// Unmounts everything mounted under `roots` (what an engine killed mid-run leaves: its
/// containers' shm, network namespace files, a pod's subPath mounts).
pub fn unmount_under(roots: &[PathBuf]) -> anyhow::Result<()> {
    // A mount point may be stacked several times over.
    for _ in 0..8 {
        let mounts = mounts_under(roots);
        if mounts.is_empty() {
            return Ok(());
        }
        for m in &mounts {
            let Ok(c) = CString::new(m.as_os_str().as_encoded_bytes()) else {
                continue;
            };
            // SAFETY: a NUL-terminated path; MNT_DETACH so a busy mount goes once unused.
            let rc = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            if rc != 0 {
                let e = std::io::Error::last_os_error();
                tracing::debug!(error = %e, mount = %m.display(), "unmounting");
            }
        }
    }
    let left = mounts_under(roots);
    anyhow::ensure!(left.is_empty(), "could not unmount {left:?}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape(r"/tmp/a\040b"), "/tmp/a b");
        assert_eq!(unescape(r"/x\134y"), r"/x\y");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape(r"/odd\04"), r"/odd\04");
    }

    #[test]
    fn this_process_is_alive_and_an_unused_pid_is_not() {
        assert!(alive(std::process::id()));
        assert!(!alive(u32::MAX - 1));
    }

    #[test]
    fn containers_go_beside_the_node_processes() {
        let node = Path::new("skiff-clusters/skiff3/2");
        assert_eq!(processes_cgroup(node), Path::new("skiff-clusters/skiff3/2/node"));
        assert_eq!(
            containers_cgroup(node),
            Path::new("/skiff-clusters/skiff3/2/containers")
        );
    }
}
