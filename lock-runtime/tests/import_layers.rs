//! The runtime's modules import only downwards: no module reaches, through
//! `crate::` or `super::` paths (re-exports at the root followed to their
//! module), back to itself. A module may use the submodules it declares
//! (a directory's `mod.rs` dispatching to its parts: those parts are what
//! it is made of), and `#[cfg(test)]` modules may import anything.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module path (`backend::node`) → its source with comment lines and
/// `#[cfg(test)]` modules removed.
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
            while let Some(at) = test_module(&code) {
                code.replace_range(at, "");
            }
            out.insert(name, code);
        }
    }
}

/// Where the first `#[cfg(test)]` module of `code` is, attribute to its
/// closing brace.
fn test_module(code: &str) -> Option<std::ops::Range<usize>> {
    let mut from = 0;
    while let Some(found) = code[from..].find("#[cfg(test)]") {
        let at = from + found;
        let rest = code[at + "#[cfg(test)]".len()..].trim_start();
        let is_mod = ["mod ", "pub mod ", "pub(crate) mod "]
            .iter()
            .any(|m| rest.starts_with(m));
        let open = code[at..].find('{').map(|o| at + o);
        let semi = code[at..].find(';').map(|o| at + o);
        if let (true, Some(semi)) = (is_mod, semi) {
            // `mod x;`: the file is read on its own.
            if open.is_none_or(|open| semi < open) {
                return Some(at..semi + 1);
            }
        }
        if let (true, Some(open)) = (is_mod, open) {
            return Some(at..closing(code, open).map_or(code.len(), |c| c + 1));
        }
        from = at + 1;
    }
    None
}

/// Where the brace that `code[open]` opens closes.
fn closing(code: &str, open: usize) -> Option<usize> {
    let mut depth = 0;
    for (i, ch) in code[open..].char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ => {}
        }
        if depth == 0 {
            return Some(open + i);
        }
    }
    None
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
        if after.starts_with('{') {
            let end = closing(after, 0).unwrap_or(after.len());
            flatten("", &after[1..end], &mut out);
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
    if !modules.contains(parts[0]) {
        return root.get(parts[0]).cloned();
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
