//! A volumeMount's `subPath`, resolved so that no symlink leads out of the volume (the
//! CVE-2017-1002101 class), as upstream's `pkg/volume/util/subpath` does on Linux:
//!
//! - a missing subPath is created one directory at a time with `mkdirat` under descriptors opened
//!   with `O_NOFOLLOW` (`safe_make_dir`), after the part that exists resolved inside the volume;
//! - the subPath is resolved, checked to lie inside the volume, then opened component by component
//!   from the volume's root with `O_PATH | O_NOFOLLOW`, refusing any symlink met on the way, and the
//!   open descriptor is bind-mounted onto `POD_DIR/volume-subpaths/VOLUME/CONTAINER/INDEX`
//!   (`prepare`). The runtime is given that mount point, so a container that swaps a directory of
//!   the volume for a symlink after the check changes nothing: the mount holds the inode that was
//!   checked.
//!
//! The mounts live until the pod is cleaned up (`cleanup`), which unmounts them before the pod's
//! directory is removed, so that removing it never reaches through a mount into a volume's data.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, bail};
use rustix::fs::{CWD, FileType, Mode, OFlags, fstat, mkdirat, openat};
use rustix::mount::{UnmountFlags, mount_bind, unmount};

/// Where a pod's subPath mounts live, under the pod's directory.
const SUBPATHS_DIR: &str = "volume-subpaths";

/// The error of upstream's `ValidatePathNoBacksteps`, or of an absolute subPath, for a subPath the
/// API server should have refused (it may come from another API server, or be a `subPathExpr`'s
/// expansion).
pub fn check_relative(sub: &str) -> Result<(), String> {
    if Path::new(sub).is_absolute() {
        return Err(format!("error SubPath `{sub}` must not be an absolute path"));
    }
    if sub.split('/').any(|c| c == "..") {
        return Err(format!("unable to provision SubPath `{sub}`: must not contain '..'"));
    }
    Ok(())
}

/// The normal components of a checked relative path (`.` and empty ones dropped).
fn components(sub: &Path) -> anyhow::Result<Vec<&std::ffi::OsStr>> {
    sub.components()
        .filter_map(|c| match c {
            Component::Normal(c) => Some(Ok(c)),
            Component::CurDir => None,
            other => Some(Err(anyhow::anyhow!("unexpected path component {other:?}"))),
        })
        .collect()
}

/// Opens `path`, which must lie inside `base` and hold no symlink below it, one component at a time
/// from `base` with `O_NOFOLLOW`: a component that is (or has become) a symlink is refused, as
/// upstream's `doSafeOpen`. Both paths are already resolved.
fn safe_open(base: &Path, path: &Path) -> anyhow::Result<OwnedFd> {
    let rel = path
        .strip_prefix(base)
        .with_context(|| format!("path {} is outside of allowed base {}", path.display(), base.display()))?;
    let mut fd = openat(
        CWD,
        base,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .with_context(|| format!("opening {}", base.display()))?;
    let mut current = base.to_path_buf();
    for c in components(rel)? {
        current.push(c);
        let child = openat(&fd, c, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
            .with_context(|| format!("cannot open {}", current.display()))?;
        let st = fstat(&child).with_context(|| format!("running fstat on {}", current.display()))?;
        if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
            bail!("unexpected symlink found {}", current.display());
        }
        fd = child;
    }
    Ok(fd)
}

/// Creates `base/sub` as upstream's `SafeMakeDir`: the longest part that exists must resolve inside
/// `base`, and every directory after it is made with `mkdirat` under a descriptor opened without
/// following symlinks, then given `mode` (the volume's own, which the umask would narrow).
pub fn safe_make_dir(base: &Path, sub: &str, mode: u32) -> anyhow::Result<()> {
    let base = base
        .canonicalize()
        .with_context(|| format!("resolving {}", base.display()))?;
    let parts = components(Path::new(sub))?;
    let mut existing = base.clone();
    let mut made = 0;
    for c in &parts {
        let next = existing.join(c);
        if std::fs::symlink_metadata(&next).is_err() {
            break;
        }
        existing = next;
        made += 1;
    }
    let resolved = existing
        .canonicalize()
        .with_context(|| format!("resolving {}", existing.display()))?;
    if !resolved.starts_with(&base) {
        bail!("pathname {} is not within {}", resolved.display(), base.display());
    }
    let mut fd = safe_open(&base, &resolved)?;
    let mut current = resolved;
    for c in &parts[made..] {
        current.push(c);
        match mkdirat(&fd, *c, Mode::from_raw_mode(mode)) {
            Ok(()) => {}
            Err(e) if e == rustix::io::Errno::EXIST => {}
            Err(e) => return Err(io::Error::from(e)).with_context(|| format!("creating {}", current.display())),
        }
        let child = openat(
            &fd,
            *c,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .with_context(|| format!("cannot open {}", current.display()))?;
        rustix::fs::fchmod(&child, Mode::from_raw_mode(mode))
            .with_context(|| format!("setting the mode of {}", current.display()))?;
        fd = child;
    }
    Ok(())
}

/// The mount point of a container's subPath mount.
pub fn target(pod_dir: &Path, volume: &str, container: &str, index: usize) -> PathBuf {
    pod_dir
        .join(SUBPATHS_DIR)
        .join(volume)
        .join(container)
        .join(index.to_string())
}

/// Resolves `volume/sub`, checks it lies inside the volume, opens it without following symlinks
/// and bind-mounts what was opened onto `target`, as upstream's `doBindSubPath`. Returns the
/// mount point, which is what the runtime mounts into the container.
pub fn prepare(volume: &Path, sub: &str, target: &Path) -> anyhow::Result<PathBuf> {
    let volume = volume
        .canonicalize()
        .with_context(|| format!("resolving {}", volume.display()))?;
    let joined = volume.join(sub);
    let path = joined
        .canonicalize()
        .with_context(|| format!("resolving {}", joined.display()))?;
    if !path.starts_with(&volume) {
        bail!("subpath {} not within volume path {}", path.display(), volume.display());
    }
    let fd = safe_open(&volume, &path)?;
    let st = fstat(&fd).context("running fstat on the subpath")?;
    let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;

    let parent = target.parent().context("a subpath target has a parent")?;
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    // A mount left by an earlier start of the container (or an earlier agent) is replaced: the
    // new one is made from what was checked just now.
    unmount_all(target)?;
    match std::fs::symlink_metadata(target) {
        Ok(m) if m.is_dir() == is_dir && !m.file_type().is_symlink() => {}
        Ok(m) => {
            if m.is_dir() {
                std::fs::remove_dir(target)
            } else {
                std::fs::remove_file(target)
            }
            .with_context(|| format!("removing {}", target.display()))?;
            make_target(target, is_dir)?;
        }
        Err(_) => make_target(target, is_dir)?,
    }
    let source = format!("/proc/self/fd/{}", fd.as_raw_fd());
    mount_bind(source.as_str(), target)
        .map_err(io::Error::from)
        .with_context(|| {
            format!(
                "bind-mounting the subpath onto {} (the node agent needs CAP_SYS_ADMIN)",
                target.display()
            )
        })?;
    // What is mounted is what was opened (the mount followed the descriptor, not a path).
    let mounted = std::fs::symlink_metadata(target).with_context(|| format!("checking {}", target.display()))?;
    if std::os::unix::fs::MetadataExt::ino(&mounted) != st.st_ino {
        let _ = unmount_all(target);
        bail!("the mount at {} is not the subpath that was opened", target.display());
    }
    Ok(target.to_path_buf())
}

fn make_target(target: &Path, is_dir: bool) -> anyhow::Result<()> {
    if is_dir {
        std::fs::create_dir(target)
    } else {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(target)
            .map(drop)
    }
    .with_context(|| format!("creating {}", target.display()))
}

/// Unmounts everything mounted at `path` (lazily, so a busy mount does not keep it): mounts may be
/// stacked there by earlier starts. A path that is not a mount point, or is missing, is done.
fn unmount_all(path: &Path) -> anyhow::Result<()> {
    for _ in 0..64 {
        match unmount(path, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW) {
            Ok(()) => {}
            Err(e) if e == rustix::io::Errno::INVAL || e == rustix::io::Errno::NOENT => return Ok(()),
            Err(e) => {
                return Err(io::Error::from(e)).with_context(|| format!("unmounting {}", path.display()));
            }
        }
    }
    bail!("{} stays mounted after 64 unmounts", path.display())
}

/// Unmounts every subPath mount of a pod, as upstream's `CleanSubPaths`, so its directory can be
/// removed without reaching into a volume through one of them. An error leaves the pod's directory
/// to be removed later, never removed through a mount.
pub fn cleanup(pod_dir: &Path) -> anyhow::Result<()> {
    let root = pod_dir.join(SUBPATHS_DIR);
    let volumes = match std::fs::read_dir(&root) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", root.display())),
    };
    for volume in volumes {
        let volume = volume?.path();
        for container in std::fs::read_dir(&volume).with_context(|| format!("reading {}", volume.display()))? {
            let container = container?.path();
            for mount in std::fs::read_dir(&container).with_context(|| format!("reading {}", container.display()))? {
                unmount_all(&mount?.path())?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn absolute_and_backstepping_subpaths_are_refused_in_upstream_words() {
        assert_eq!(
            check_relative("/etc"),
            Err("error SubPath `/etc` must not be an absolute path".to_string())
        );
        assert_eq!(
            check_relative("a/../../b"),
            Err("unable to provision SubPath `a/../../b`: must not contain '..'".to_string())
        );
        assert_eq!(check_relative("a/..b/c"), Ok(()));
    }

    #[test]
    fn safe_make_dir_stays_inside_the_volume() {
        let dir = tempfile::tempdir().unwrap();
        let vol = dir.path().join("vol");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&vol).unwrap();
        std::fs::create_dir_all(&outside).unwrap();

        safe_make_dir(&vol, "a/b/c", 0o777).unwrap();
        assert!(vol.join("a/b/c").is_dir());
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(vol.join("a/b")).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o777, "the umask does not narrow the volume's mode");

        // A symlink leading out: nothing is created outside.
        symlink(&outside, vol.join("out")).unwrap();
        assert!(safe_make_dir(&vol, "out/x", 0o755).is_err());
        assert!(!outside.join("x").exists());
        symlink("/", vol.join("root")).unwrap();
        assert!(safe_make_dir(&vol, "root/skiff-subpath-test", 0o755).is_err());
        assert!(!Path::new("/skiff-subpath-test").exists());

        // A symlink that stays inside is followed, as upstream does.
        symlink("a/b", vol.join("inside")).unwrap();
        safe_make_dir(&vol, "inside/d", 0o755).unwrap();
        assert!(vol.join("a/b/d").is_dir());
    }

    #[test]
    fn prepare_refuses_symlinks_out_of_the_volume() {
        let dir = tempfile::tempdir().unwrap();
        let vol = dir.path().join("vol");
        std::fs::create_dir_all(&vol).unwrap();
        let pod = dir.path().join("pod");
        symlink("/", vol.join("x")).unwrap();
        symlink("/etc/hostname", vol.join("f")).unwrap();
        symlink("x/etc", vol.join("y")).unwrap();
        for sub in ["x", "f", "y", "x/etc"] {
            let err = prepare(&vol, sub, &target(&pod, "vol", "c", 0)).unwrap_err();
            assert!(format!("{err:#}").contains("not within volume path"), "{sub}: {err:#}");
        }
        assert!(
            !target(&pod, "vol", "c", 0).exists(),
            "no mount point is made for a refused subpath"
        );
    }

    #[test]
    fn safe_open_refuses_a_symlink_on_the_way() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(base.join("a")).unwrap();
        symlink("a", base.join("l")).unwrap();
        assert!(safe_open(&base, &base.join("a")).is_ok());
        // As if `l` had been swapped in after the path was resolved.
        let err = safe_open(&base, &base.join("l")).unwrap_err();
        assert!(format!("{err:#}").contains("unexpected symlink found"), "{err:#}");
        assert!(safe_open(&base, Path::new("/etc")).is_err());
    }

    /// Needs CAP_SYS_ADMIN, as the node agent does for subPath mounts.
    #[test]
    fn prepare_pins_what_it_checked_and_cleanup_unmounts() {
        let dir = tempfile::tempdir().unwrap();
        let vol = dir.path().join("vol");
        std::fs::create_dir_all(vol.join("data")).unwrap();
        std::fs::write(vol.join("data/file"), "inside").unwrap();
        std::fs::write(vol.join("conf"), "c").unwrap();
        symlink("data", vol.join("link")).unwrap();
        let pod = dir.path().join("pod");

        let t0 = prepare(&vol, "link", &target(&pod, "vol", "c", 0)).unwrap();
        assert_eq!(std::fs::read_to_string(t0.join("file")).unwrap(), "inside");
        // Swapping the checked directory for a symlink out changes nothing for the mount.
        std::fs::rename(vol.join("data"), vol.join("moved")).unwrap();
        symlink("/", vol.join("data")).unwrap();
        assert_eq!(std::fs::read_to_string(t0.join("file")).unwrap(), "inside");
        assert!(!t0.join("etc").exists());

        let t1 = prepare(&vol, "conf", &target(&pod, "vol", "c", 1)).unwrap();
        assert_eq!(std::fs::read_to_string(&t1).unwrap(), "c");
        // A second start replaces the mount rather than stacking another.
        prepare(&vol, "conf", &target(&pod, "vol", "c", 1)).unwrap();

        cleanup(&pod).unwrap();
        assert!(std::fs::read_dir(&t0).unwrap().next().is_none(), "unmounted");
        assert_eq!(std::fs::read_to_string(&t1).unwrap(), "", "unmounted");
        std::fs::remove_dir_all(&pod).unwrap();
        assert_eq!(std::fs::read_to_string(vol.join("moved/file")).unwrap(), "inside");
    }
}
