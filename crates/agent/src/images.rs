//! Local test images: `busybox:latest` from the host's static busybox and the project's own pause image.
//!
//! No registry is reachable on the machines this runs on, so both images are imported from tarballs built
//! in memory (`docker import`).

use anyhow::{Context, bail};
use bollard::Docker;
use bollard::query_parameters::CreateImageOptionsBuilder;
use bytes::Bytes;
use futures::StreamExt;

/// The sandbox image every pod's first container runs.
/// (3.10.1: pause reaps its children.)
pub const PAUSE_IMAGE: &str = "skiff/pause:3.10.1";
/// The busybox image tests use.
pub const BUSYBOX_IMAGE: &str = "busybox:latest";

const BUSYBOX_PATHS: [&str; 2] = ["/bin/busybox", "/usr/bin/busybox"];

/// Builds `busybox:latest` from the host's static busybox and `skiff/pause:3.10.1`, a static binary that
/// sleeps until SIGTERM or SIGINT and then exits 0 (as upstream's pause does).
pub async fn build_local_images(docker: &Docker) -> anyhow::Result<()> {
    let step = crate::progress::Progress::start(format!("building the local images {PAUSE_IMAGE} and busybox:latest"));
    build_pause_image(docker).await?;

    let busybox_path = BUSYBOX_PATHS
        .iter()
        .find(|p| std::path::Path::new(p).exists())
        .context("finding a static busybox (apt-get install busybox-static)")?;
    let busybox = tokio::fs::read(busybox_path)
        .await
        .with_context(|| format!("reading {busybox_path}"))?;
    let list = tokio::process::Command::new(busybox_path)
        .arg("--list-full")
        .output()
        .await
        .context("listing busybox applets")?;
    if !list.status.success() {
        bail!("busybox --list-full failed");
    }
    let applets = String::from_utf8_lossy(&list.stdout).into_owned();
    import(docker, busybox_tar(&busybox, &applets), "busybox", "latest", "[\"sh\"]").await?;
    step.done(&format!("busybox from {busybox_path}"));
    Ok(())
}

/// Builds only the pause image (the agent does this itself when it is missing).
pub async fn build_pause_image(docker: &Docker) -> anyhow::Result<()> {
    let arch = engine_arch(docker).await?;
    let mut pause = TarBuilder::default();
    pause.file("pause", 0o755, &pause_elf(arch));
    import(docker, pause.finish(), "skiff/pause", "3.10.1", "[\"/pause\"]").await
}

fn busybox_tar(busybox: &[u8], applets: &str) -> Vec<u8> {
    let mut tar = TarBuilder::default();
    for dir in [
        "bin", "sbin", "usr", "usr/bin", "usr/sbin", "etc", "root", "var", "var/www",
    ] {
        tar.dir(dir, 0o755);
    }
    tar.dir("tmp", 0o1777);
    tar.file("bin/busybox", 0o755, busybox);
    tar.file(
        "etc/passwd",
        0o644,
        b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n",
    );
    tar.file("etc/group", 0o644, b"root:x:0:\nnogroup:x:65534:\n");
    for applet in applets.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if applet == "bin/busybox" {
            continue;
        }
        let depth = applet.matches('/').count();
        let target = format!("{}bin/busybox", "../".repeat(depth));
        tar.symlink(applet, &target);
    }
    tar.finish()
}

async fn import(docker: &Docker, tar: Vec<u8>, repo: &str, tag: &str, cmd: &str) -> anyhow::Result<()> {
    let options = CreateImageOptionsBuilder::default()
        .from_src("-")
        .repo(repo)
        .tag(tag)
        .changes(vec![format!("CMD {cmd}")])
        .build();
    let mut stream = docker.create_image(Some(options), Some(bollard::body_full(Bytes::from(tar))), None);
    while let Some(item) = stream.next().await {
        item.with_context(|| format!("importing {repo}:{tag}"))?;
    }
    tracing::info!(image = %format!("{repo}:{tag}"), "imported image");
    Ok(())
}

/// The machines the pause binary is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PauseArch {
    X86_64,
    Aarch64,
}

impl PauseArch {
    /// The architecture the Docker engine reports (`docker info`'s Architecture: `x86_64`,
    /// `aarch64`, or Go's `arm64`); `None` for one there is no pause binary for.
    pub fn from_engine(architecture: &str) -> Option<Self> {
        match architecture {
            "x86_64" | "amd64" => Some(PauseArch::X86_64),
            "aarch64" | "arm64" => Some(PauseArch::Aarch64),
            _ => None,
        }
    }
}

/// The engine's architecture, as `docker info` reports it.
async fn engine_arch(docker: &Docker) -> anyhow::Result<PauseArch> {
    let info = docker
        .info()
        .await
        .context("asking the Docker engine for its architecture")?;
    let architecture = info.architecture.unwrap_or_default();
    PauseArch::from_engine(&architecture)
        .with_context(|| format!("no pause binary for the engine's architecture {architecture:?}"))
}

/// The pause binary for `arch`: a static ELF executable that installs a SIGTERM and SIGINT
/// handler calling exit_group(0), ignores SIGCHLD (so its children, the orphans of a shared PID
/// namespace included, are reaped by the kernel and never stay zombies), then waits for signals
/// forever.
pub fn pause_elf(arch: PauseArch) -> Vec<u8> {
    match arch {
        PauseArch::X86_64 => elf(0x3e, &PAUSE_X86_64),
        PauseArch::Aarch64 => elf(0xb7, &pause_aarch64()),
    }
}

/// x86-64 machine code (Intel syntax):
///
/// ```text
/// sub rsp, 32 ; lea rax, [rip+handler] ; mov [rsp], rax          ; sa_handler
/// mov [rsp+16], rax                                               ; sa_restorer (never returns)
/// mov eax, 0x04000000 ; mov [rsp+8], rax                          ; sa_flags = SA_RESTORER
/// xor eax, eax ; mov [rsp+24], rax                                ; sa_mask = 0
/// rt_sigaction(15, rsp, 0, 8) ; rt_sigaction(2, rsp, 0, 8)
/// mov qword [rsp], 1 ; rt_sigaction(17, rsp, 0, 8)                ; SIGCHLD = SIG_IGN
/// loop: pause() ; jmp loop
/// handler: exit_group(0)
/// ```
const PAUSE_X86_64: [u8; 132] = [
    0x48, 0x83, 0xec, 0x20, 0x48, 0x8d, 0x05, 0x70, 0x00, 0x00, 0x00, 0x48, 0x89, 0x04, 0x24, 0x48, 0x89, 0x44, 0x24,
    0x10, 0xb8, 0x00, 0x00, 0x00, 0x04, 0x48, 0x89, 0x44, 0x24, 0x08, 0x31, 0xc0, 0x48, 0x89, 0x44, 0x24, 0x18, 0xbf,
    0x0f, 0x00, 0x00, 0x00, 0x48, 0x89, 0xe6, 0x31, 0xd2, 0x41, 0xba, 0x08, 0x00, 0x00, 0x00, 0xb8, 0x0d, 0x00, 0x00,
    0x00, 0x0f, 0x05, 0xbf, 0x02, 0x00, 0x00, 0x00, 0x48, 0x89, 0xe6, 0x31, 0xd2, 0x41, 0xba, 0x08, 0x00, 0x00, 0x00,
    0xb8, 0x0d, 0x00, 0x00, 0x00, 0x0f, 0x05, // rt_sigaction(SIGINT)
    0x48, 0xc7, 0x04, 0x24, 0x01, 0x00, 0x00, 0x00, // mov qword [rsp], SIG_IGN
    0xbf, 0x11, 0x00, 0x00, 0x00, 0x48, 0x89, 0xe6, 0x31, 0xd2, 0x41, 0xba, 0x08, 0x00, 0x00, 0x00, 0xb8, 0x0d, 0x00,
    0x00, 0x00, 0x0f, 0x05, // rt_sigaction(SIGCHLD)
    0xb8, 0x22, 0x00, 0x00, 0x00, 0x0f, 0x05, 0xeb, 0xf7, // pause loop
    0x31, 0xff, 0xb8, 0xe7, 0x00, 0x00, 0x00, 0x0f, 0x05, // exit_group(0)
];

/// aarch64 machine code. The kernel's `struct sigaction` is {handler, flags, restorer, mask}
/// as on x86-64; aarch64 has no pause(2), so the loop is ppoll(NULL, 0, NULL, NULL), which
/// returns only when a signal is delivered (an ignored SIGCHLD is not).
///
/// ```text
///  0  sub sp, sp, #32 ; adr x1, handler ; str x1, [sp]            ; sa_handler
/// 12  stp xzr, xzr, [sp, #8] ; str xzr, [sp, #24]                 ; flags, restorer, mask = 0
/// 20  rt_sigaction(15, sp, 0, 8)     (x8 = 134, svc #0)
/// 44  rt_sigaction(2, sp, 0, 8)
/// 68  mov x1, #1 ; str x1, [sp] ; rt_sigaction(17, sp, 0, 8)      ; SIGCHLD = SIG_IGN
/// 100 loop: ppoll(0, 0, 0, 0, 8)     (x8 = 73) ; b loop
/// 132 handler: exit_group(0)         (x8 = 94)
/// ```
fn pause_aarch64() -> Vec<u8> {
    // The rest of rt_sigaction(x0, x1, NULL, 8).
    const SIGACTION: [u32; 4] = [
        0xd280_0002, // mov x2, #0
        0xd280_0103, // mov x3, #8
        0xd280_10c8, // mov x8, #134 (rt_sigaction)
        0xd400_0001, // svc #0
    ];
    let mut code: Vec<u32> = vec![
        0xd100_83ff, // sub sp, sp, #32
        0x1000_0401, // adr x1, .+128 (handler)
        0xf900_03e1, // str x1, [sp]
        0xa900_ffff, // stp xzr, xzr, [sp, #8]
        0xf900_0fff, // str xzr, [sp, #24]
    ];
    for signal_mov_x0 in [
        0xd280_01e0, // mov x0, #15 (SIGTERM)
        0xd280_0040, // mov x0, #2 (SIGINT)
    ] {
        code.push(signal_mov_x0);
        code.push(0x9100_03e1); // mov x1, sp
        code.extend_from_slice(&SIGACTION);
    }
    code.extend_from_slice(&[
        0xd280_0021, // mov x1, #1 (SIG_IGN)
        0xf900_03e1, // str x1, [sp]
        0xd280_0220, // mov x0, #17 (SIGCHLD)
        0x9100_03e1, // mov x1, sp
    ]);
    code.extend_from_slice(&SIGACTION);
    code.extend_from_slice(&[
        0xd280_0000, // loop: mov x0, #0
        0xd280_0001, // mov x1, #0
        0xd280_0002, // mov x2, #0
        0xd280_0003, // mov x3, #0
        0xd280_0104, // mov x4, #8
        0xd280_0928, // mov x8, #73 (ppoll)
        0xd400_0001, // svc #0
        0x17ff_fff9, // b loop
        0xd280_0000, // handler: mov x0, #0
        0xd280_0bc8, // mov x8, #94 (exit_group)
        0xd400_0001, // svc #0
    ]);
    code.iter().flat_map(|i| i.to_le_bytes()).collect()
}

/// A static little-endian 64-bit ELF executable of `machine` whose one segment (the whole file,
/// read + execute) is loaded at 0x400000 and starts at `code`.
fn elf(machine: u16, code: &[u8]) -> Vec<u8> {
    const BASE: u64 = 0x40_0000;
    const HEADERS: u64 = 64 + 56;
    let total = HEADERS + code.len() as u64;
    let mut elf = Vec::with_capacity(total as usize);
    // ELF header.
    elf.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]);
    elf.extend_from_slice(&[0; 8]);
    elf.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    elf.extend_from_slice(&machine.to_le_bytes());
    elf.extend_from_slice(&1u32.to_le_bytes());
    elf.extend_from_slice(&(BASE + HEADERS).to_le_bytes()); // entry
    elf.extend_from_slice(&64u64.to_le_bytes()); // program headers offset
    elf.extend_from_slice(&0u64.to_le_bytes()); // section headers offset
    elf.extend_from_slice(&0u32.to_le_bytes()); // flags
    elf.extend_from_slice(&64u16.to_le_bytes()); // header size
    elf.extend_from_slice(&56u16.to_le_bytes()); // program header size
    elf.extend_from_slice(&1u16.to_le_bytes()); // one program header
    elf.extend_from_slice(&64u16.to_le_bytes());
    elf.extend_from_slice(&0u16.to_le_bytes());
    elf.extend_from_slice(&0u16.to_le_bytes());
    // PT_LOAD, read + execute, the whole file at BASE (aligned for 64 KiB pages too).
    elf.extend_from_slice(&1u32.to_le_bytes());
    elf.extend_from_slice(&5u32.to_le_bytes());
    elf.extend_from_slice(&0u64.to_le_bytes());
    elf.extend_from_slice(&BASE.to_le_bytes());
    elf.extend_from_slice(&BASE.to_le_bytes());
    elf.extend_from_slice(&total.to_le_bytes());
    elf.extend_from_slice(&total.to_le_bytes());
    elf.extend_from_slice(&0x1_0000u64.to_le_bytes());
    elf.extend_from_slice(code);
    elf
}

/// A minimal ustar writer: directories, regular files and symlinks owned by root.
#[derive(Default)]
pub(crate) struct TarBuilder {
    out: Vec<u8>,
}

impl TarBuilder {
    pub(crate) fn dir(&mut self, path: &str, mode: u32) {
        self.header(&format!("{path}/"), mode, 0, b'5', "");
    }

    pub(crate) fn file(&mut self, path: &str, mode: u32, data: &[u8]) {
        self.header(path, mode, data.len() as u64, b'0', "");
        self.out.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        self.out.extend(std::iter::repeat_n(0u8, pad));
    }

    pub(crate) fn symlink(&mut self, path: &str, target: &str) {
        self.header(path, 0o777, 0, b'2', target);
    }

    pub(crate) fn finish(mut self) -> Vec<u8> {
        self.out.extend(std::iter::repeat_n(0u8, 1024));
        self.out
    }

    fn header(&mut self, path: &str, mode: u32, size: u64, kind: u8, link: &str) {
        let mut h = [0u8; 512];
        let (prefix, name) = split_ustar_name(path);
        put(&mut h[0..100], name.as_bytes());
        put(&mut h[100..108], format!("{mode:07o}").as_bytes());
        put(&mut h[108..116], b"0000000");
        put(&mut h[116..124], b"0000000");
        put(&mut h[124..136], format!("{size:011o}").as_bytes());
        put(&mut h[136..148], b"00000000000");
        h[148..156].copy_from_slice(b"        ");
        h[156] = kind;
        put(&mut h[157..257], link.as_bytes());
        put(&mut h[257..263], b"ustar\0");
        put(&mut h[263..265], b"00");
        put(&mut h[345..500], prefix.as_bytes());
        let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
        put(&mut h[148..156], format!("{sum:06o}\0 ").as_bytes());
        self.out.extend_from_slice(&h);
    }
}

fn split_ustar_name(path: &str) -> (&str, &str) {
    if path.len() <= 100 {
        return ("", path);
    }
    match path[..path.len().min(155)].rfind('/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => ("", path),
    }
}

fn put(field: &mut [u8], value: &[u8]) {
    let n = value.len().min(field.len());
    field[..n].copy_from_slice(&value[..n]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tar_headers_have_valid_checksums() {
        let mut t = TarBuilder::default();
        t.file("a/b.txt", 0o644, b"hello");
        t.symlink("bin/sh", "busybox");
        let out = t.finish();
        assert_eq!(out.len(), 512 + 512 + 512 + 1024);
        let h = &out[..512];
        let stored = u32::from_str_radix(std::str::from_utf8(&h[148..154]).unwrap(), 8).unwrap();
        let mut copy = h.to_vec();
        copy[148..156].copy_from_slice(b"        ");
        assert_eq!(stored, copy.iter().map(|b| u32::from(*b)).sum::<u32>());
        assert_eq!(&out[512..517], b"hello");
        assert_eq!(out[1024 + 156], b'2');
    }

    /// Runs a pause binary (through `runner` when given), checks it stays alive, sends SIGTERM
    /// and checks it exits 0.
    fn runs_until_sigterm(elf: &[u8], runner: Option<&str>, name: &str) {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("skiff-pause-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pause");
        std::fs::write(&path, elf).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut child = match runner {
            Some(runner) => std::process::Command::new(runner).arg(&path).spawn().unwrap(),
            None => std::process::Command::new(&path).spawn().unwrap(),
        };
        // qemu takes a moment to start; the binary must still be waiting after it.
        std::thread::sleep(std::time::Duration::from_millis(if runner.is_some() {
            1000
        } else {
            200
        }));
        assert!(child.try_wait().unwrap().is_none(), "pause exited early");
        std::process::Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        let status = child.wait().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(status.code(), Some(0), "{status:?}");
    }

    #[test]
    fn pause_binary_runs_and_exits_on_sigterm() {
        runs_until_sigterm(&pause_elf(PauseArch::X86_64), None, "x86_64");
    }

    #[test]
    fn aarch64_pause_binary_runs_and_exits_on_sigterm_under_qemu() {
        let qemu = "qemu-aarch64-static";
        let found = std::process::Command::new(qemu)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            println!("skipped: {qemu} is not installed (apt-get install qemu-user-static)");
            return;
        }
        runs_until_sigterm(&pause_elf(PauseArch::Aarch64), Some(qemu), "aarch64");
    }

    #[test]
    fn aarch64_pause_binary_is_well_formed() {
        let elf = pause_elf(PauseArch::Aarch64);
        assert_eq!(&elf[..4], b"\x7fELF");
        assert_eq!(u16::from_le_bytes([elf[18], elf[19]]), 0xb7);
        // 36 instructions; the branch back and the handler's address line up.
        assert_eq!(elf.len(), 120 + 36 * 4);
        let word = |i: usize| u32::from_le_bytes(elf[120 + i * 4..124 + i * 4].try_into().unwrap());
        assert_eq!(word(25), 0xd280_0000, "the loop starts at instruction 25");
        assert_eq!(word(32), 0x17ff_fff9, "b -28 goes back to the loop");
        assert_eq!(word(33), 0xd280_0000, "adr +128 from instruction 1 is the handler");
    }

    #[test]
    fn engine_architectures_map_to_pause_binaries() {
        assert_eq!(PauseArch::from_engine("x86_64"), Some(PauseArch::X86_64));
        assert_eq!(PauseArch::from_engine("aarch64"), Some(PauseArch::Aarch64));
        assert_eq!(PauseArch::from_engine("arm64"), Some(PauseArch::Aarch64));
        assert_eq!(PauseArch::from_engine("s390x"), None);
    }
}
