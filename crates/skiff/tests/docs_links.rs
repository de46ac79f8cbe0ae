//! The front page and the pages under `docs/` link to each other and to files of the
//! repository: every relative link must name a file that exists, and every `#anchor` a heading
//! of the page it points to (GitHub's slugs), so a page moved or renamed cannot leave a reader
//! at a dead end. The front page must also stay a front page: two screens at most.

#![cfg(test)]

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The pages checked: the README, ARCHITECTURE.md, BENCHMARKS.md and every page of `docs/`.
fn pages() -> Vec<PathBuf> {
    let root = root();
    let mut pages: Vec<PathBuf> = ["README.md", "ARCHITECTURE.md", "BENCHMARKS.md"]
        .iter()
        .map(|p| root.join(p))
        .collect();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The targets of the markdown links `[text](target)` of `text`, outside code blocks and spans.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Code spans hold no links.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            if let Some(end) = rest.find(')') {
                out.push(rest[..end].trim().to_string());
                rest = &rest[end..];
            }
        }
    }
    out
}

/// GitHub's anchor of a heading: lower case, punctuation dropped but `-` and `_`, spaces as `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.push(slug(line.trim_start_matches('#')));
        }
    }
    out
}

#[test]
fn every_relative_link_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("page");
        let dir = page.parent().expect("dir");
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (file, anchor) = link.split_once('#').unwrap_or((link.as_str(), ""));
            let target = if file.is_empty() { page.clone() } else { dir.join(file) };
            if !target.exists() {
                broken.push(format!("{}: {link} (no such file)", page.display()));
                continue;
            }
            if !anchor.is_empty() {
                let text = std::fs::read_to_string(&target).unwrap_or_default();
                if !anchors(&text).iter().any(|a| a == anchor) {
                    broken.push(format!("{}: {link} (no such heading)", page.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(checked >= 10, "only {checked} links found: the parser lost them");
}

#[test]
fn every_page_of_docs_is_linked_from_the_front_page() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let linked = links(&readme);
    for page in pages()
        .iter()
        .filter(|p| p.parent().is_some_and(|d| d.ends_with("docs")))
    {
        let name = format!("docs/{}", page.file_name().and_then(|n| n.to_str()).unwrap_or(""));
        assert!(linked.iter().any(|l| l == &name), "{name} is not linked from README.md");
    }
}

/// Two screens of a terminal: the front page says what Skiff is, how to start and where to read
/// on, and leaves the rest to `docs/`.
#[test]
fn the_front_page_fits_on_two_screens() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(lines <= 100, "README.md has {lines} lines");
}

#[test]
fn links_and_slugs_are_read_as_github_reads_them() {
    assert_eq!(
        links("see [a](docs/a.md) and `[not](a link)`\n```\n[x](y)\n```\n[b](#the-top)"),
        ["docs/a.md", "#the-top"]
    );
    assert_eq!(
        slug(" A highly available control plane"),
        "a-highly-available-control-plane"
    );
    assert_eq!(
        slug("CEL: validation rules and admission policies"),
        "cel-validation-rules-and-admission-policies"
    );
    assert_eq!(slug("`kubectl top`"), "kubectl-top");
}
