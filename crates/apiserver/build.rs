//! Stamps the build with its source: the git commit, whether the tree had uncommitted changes, and
//! the build date, for `/version` (upstream's `gitCommit`, `gitTreeState` and `buildDate`). The date
//! is `SOURCE_DATE_EPOCH` when set (reproducible builds), else the commit's own time, so that
//! rebuilding one commit gives one binary. Without git (a source archive) nothing is stamped and
//! `/version` says so.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    // Look again when HEAD moves, a branch is committed to, or the index changes.
    for dir in [
        git(&["rev-parse", "--git-dir"]),
        git(&["rev-parse", "--git-common-dir"]),
    ]
    .into_iter()
    .flatten()
    {
        for file in ["HEAD", "index", "packed-refs"] {
            println!("cargo:rerun-if-changed={dir}/{file}");
        }
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"])
        && let Some(common) = git(&["rev-parse", "--git-common-dir"])
    {
        println!("cargo:rerun-if-changed={common}/{branch}");
    }
    let Some(commit) = git(&["rev-parse", "HEAD"]) else {
        return;
    };
    println!("cargo:rustc-env=SKIFF_GIT_COMMIT={commit}");
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_none_or(|s| !s.is_empty());
    println!(
        "cargo:rustc-env=SKIFF_GIT_TREE_STATE={}",
        if dirty { "dirty" } else { "clean" }
    );
    let epoch = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .or_else(|| git(&["log", "-1", "--format=%ct", "HEAD"]))
        .and_then(|s| s.trim().parse::<i64>().ok());
    if let Some(date) = epoch.and_then(|e| jiff::Timestamp::from_second(e).ok()) {
        println!(
            "cargo:rustc-env=SKIFF_BUILD_DATE={}",
            date.strftime("%Y-%m-%dT%H:%M:%SZ")
        );
    }
}
