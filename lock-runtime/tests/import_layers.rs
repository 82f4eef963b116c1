//! The runtime's modules import only downwards: no module reaches, through
//! `crate::` or `super::` paths (re-exports at the root followed to their
//! module), back to itself. Unit-test modules may import anything.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module path (`backend::node`) → its source with comments and the
/// trailing `#[cfg(test)] mod tests` removed.
fn sources(dir: &Path, prefix: &str, out: &mut BTreeMap<String, String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().unwrap().to_str().unwrap().to_string();
        let join = |name: &str| {
            if prefix.is_empty() {
                name.to_string()
            } else if name.is_empty() {
                prefix.to_string()
            } else {
                format!("{prefix}::{name}")
            }
        };
        if path.is_dir() {
            sources(&path, &join(&stem), out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let name = match stem.as_str() {
                "mod" => join(""),
                "lib" if prefix.is_empty() => "crate".to_string(),
                _ => join(&stem),
            };
            let text = std::fs::read_to_string(&path).unwrap();
            let mut code: String = text
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            if let Some(at) = code.find("#[cfg(test)]\nmod tests") {
                code.truncate(at);
            }
            out.insert(name, code);
        }
    }
}

/// `a::{b, c::{D, E}}` → `a::b`, `a::c::D`, `a::c::E`.
fn flatten(prefix: &str, group: &str, out: &mut Vec<String>) {
    let (mut depth, mut start) = (0, 0);
    let mut items = Vec::new();
    for (i, ch) in group.char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&group[start..]);
    for item in items.into_iter().map(str::trim).filter(|i| !i.is_empty()) {
        match item.find('{') {
            Some(open) => flatten(
                &format!("{prefix}{}", &item[..open]),
                &item[open + 1..item.len() - 1],
                out,
            ),
            None => out.push(format!("{prefix}{item}")),
        }
    }
}

/// Every path a source names after `crate::` (groups flattened).
fn crate_paths(code: &str, anchor: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(anchor) {
        let after = &rest[at + anchor.len()..];
        if let Some(group) = after.strip_prefix('{') {
            let (mut depth, mut end) = (1, 0);
            for (i, ch) in group.char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth == 0 {
                    end = i;
                    break;
                }
            }
            flatten("", &group[..end], &mut out);
        } else {
            let end = after
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(after.len());
            out.push(after[..end].trim_end_matches(':').to_string());
        }
        rest = after;
    }
    out
}

/// The longest known module that `path` starts with, re-exports at the
/// root followed.
fn module_of(
    path: &str,
    modules: &BTreeSet<String>,
    root: &BTreeMap<String, String>,
) -> Option<String> {
    let parts: Vec<&str> = path.split("::").collect();
    if let Some(m) = root.get(parts[0]) {
        return Some(m.clone());
    }
    (1..=parts.len())
        .rev()
        .map(|n| parts[..n].join("::"))
        .find(|m| modules.contains(m))
}

#[test]
fn modules_import_only_downwards() {
    let mut src = BTreeMap::new();
    sources(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        "",
        &mut src,
    );
    let lib = src.remove("crate").expect("lib.rs");
    let modules: BTreeSet<String> = src.keys().cloned().collect();
    // `pub use client::LockClient;` → LockClient lives in `client`.
    let mut root = BTreeMap::new();
    for line in lib.lines().filter(|l| l.starts_with("pub use ")) {
        let mut names = Vec::new();
        flatten(
            "",
            line["pub use ".len()..].trim_end_matches(';'),
            &mut names,
        );
        for name in names {
            if let Some((module, item)) = name.rsplit_once("::") {
                if modules.contains(module) {
                    root.insert(item.to_string(), module.to_string());
                }
            }
        }
    }
    assert!(root.contains_key("LockClient"), "re-exports read: {root:?}");

    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, code) in &src {
        let parent = module.rsplit_once("::").map_or("", |(p, _)| p);
        let mut paths = crate_paths(code, "crate::");
        for p in crate_paths(code, "super::") {
            paths.push(if parent.is_empty() {
                p
            } else {
                format!("{parent}::{p}")
            });
        }
        let deps = edges.entry(module.clone()).or_default();
        for path in paths {
            if let Some(dep) = module_of(&path, &modules, &root) {
                if &dep != module {
                    deps.insert(dep);
                }
            }
        }
    }
    assert!(
        edges["request"].contains("client"),
        "imports read: {edges:?}"
    );

    // A path back to the start from any module is a cycle.
    for start in edges.keys() {
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((at, trail)) = stack.pop() {
            for next in &edges[&at] {
                assert!(
                    next != start,
                    "imports go round: {} -> {start}",
                    trail.join(" -> ")
                );
                if seen.insert(next.clone()) && edges.contains_key(next) {
                    let mut t = trail.clone();
                    t.push(next.clone());
                    stack.push((next.clone(), t));
                }
            }
        }
    }
}
