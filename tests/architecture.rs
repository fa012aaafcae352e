//! The shape of `src/`, held by a test (issue 27): the import graph between its files has no
//! circle through more than two files, and the modules at the bottom of the request path
//! (billing, routing, passthrough, config, the protocol layer) never import the proxy shell
//! or the steps of the request path above them.
//!
//! The graph is read from the code's own paths: every `crate::…`, `super::…` and `self::…`
//! path outside comments and `#[cfg(test)]` modules (grouped `use` trees expanded), resolved
//! to the longest prefix that is a file of `src/`. A file's test module may read what it
//! tests from anywhere, so tests are left out; so are the binaries (`src/main.rs`,
//! `src/bin/`), which sit above everything.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level modules that form the request path above the bottom layers.
const UPPER: [&str; 5] = ["proxy", "edge", "ingress", "engine", "stream"];
/// Bottom layers that must not import [`UPPER`].
const LOWER: [&str; 6] = [
    "billing",
    "routing",
    "passthrough",
    "config",
    "protocol",
    "outcome",
];

/// A module path (`["engine", "attempt"]`; empty for the crate root).
type ModPath = Vec<String>;

fn src_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("src/ is readable")
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            src_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The module a file defines, or `None` for files the check leaves out (binaries, tests).
fn module_of(src: &Path, file: &Path) -> Option<ModPath> {
    let rel = file.strip_prefix(src).ok()?;
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs")?.to_string();
    if parts.first().is_some_and(|p| p == "bin") || (parts.is_empty() && stem == "main") {
        return None;
    }
    if stem == "tests" || parts.iter().any(|p| p == "tests") {
        return None;
    }
    if stem != "mod" && !(parts.is_empty() && stem == "lib") {
        parts.push(stem);
    }
    Some(parts)
}

/// Removes comments (line and block) and string literals' contents, so that only code
/// remains; keeps line structure irrelevant (the result is only scanned for paths).
fn strip_comments_and_strings(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'r'
            && (b.get(i + 1) == Some(&b'#') || b.get(i + 1) == Some(&b'"'))
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))
        {
            // A raw string r"…" or r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push('r');
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == b'"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&b'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' {
            // A char literal ('x', '\n', '\'') or a lifetime ('a): skip a literal only.
            let lit = if b.get(i + 1) == Some(&b'\\') {
                b[i + 2..]
                    .iter()
                    .position(|&c| c == b'\'')
                    .map(|p| i + 3 + p)
            } else if b.get(i + 2) == Some(&b'\'') {
                Some(i + 3)
            } else {
                None
            };
            match lit {
                Some(end) => {
                    out.push_str("' '");
                    i = end;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            // Copy one whole UTF-8 character.
            let ch = s[i..]
                .chars()
                .next()
                .expect("a character at a char boundary");
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// Removes every `#[cfg(test)]` item (a test module with its braces, or a single item).
fn strip_test_items(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        // The item ends at its closing brace (a block item) or its `;` (a `mod x;`, a `use`).
        let b = after.as_bytes();
        let mut i = "#[cfg(test)]".len();
        let mut depth = 0usize;
        while i < b.len() {
            match b[i] {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        i += 1;
                        break;
                    }
                }
                b';' if depth == 0 => {
                    i += 1;
                    break;
                }
                _ => {}
            }
            i += 1;
        }
        rest = &after[i.min(after.len())..];
    }
    out.push_str(rest);
    out
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Parses the path (or `use` tree) that starts at `b[i]` into full paths, appended to `out`
/// with `prefix` before each.
fn parse_tree(b: &[u8], mut i: usize, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let mut cur = prefix.to_vec();
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if i < b.len() && b[i] == b'{' {
            i += 1;
            loop {
                while i < b.len() && (b[i].is_ascii_whitespace() || b[i] == b',') {
                    i += 1;
                }
                if i >= b.len() || b[i] == b'}' {
                    return i + 1;
                }
                i = parse_tree(b, i, &cur, out);
            }
        }
        let start = i;
        while i < b.len() && is_ident(b[i]) {
            i += 1;
        }
        if i > start {
            cur.push(String::from_utf8_lossy(&b[start..i]).into_owned());
        }
        if b.get(i) == Some(&b':') && b.get(i + 1) == Some(&b':') {
            i += 2;
            continue;
        }
        out.push(cur);
        // Skip `as name`, `*`, generics and the like up to the next separator.
        while i < b.len() && !matches!(b[i], b',' | b'}' | b';' | b'(' | b')' | b'\n') {
            if b[i] == b'{' {
                break;
            }
            i += 1;
        }
        return i;
    }
}

/// Every module path `code` (of module `me`) names, resolved against `modules`.
fn references(code: &str, me: &ModPath, modules: &BTreeSet<ModPath>) -> BTreeSet<ModPath> {
    let b = code.as_bytes();
    let mut found = BTreeSet::new();
    for kw in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(p) = code[from..].find(kw) {
            let at = from + p;
            from = at + kw.len();
            if at > 0 && (is_ident(b[at - 1]) || b[at - 1] == b':') {
                continue;
            }
            let base: ModPath = match kw {
                "crate::" => Vec::new(),
                "super::" => me[..me.len().saturating_sub(1)].to_vec(),
                _ => me.clone(),
            };
            let mut paths = Vec::new();
            parse_tree(b, at + kw.len(), &base, &mut paths);
            for mut path in paths {
                // `super::super::x`
                while let Some(k) = path.iter().position(|s| s == "super") {
                    path.remove(k);
                    if k > 0 {
                        path.remove(k - 1);
                    }
                }
                path.retain(|s| s != "self");
                for n in (1..=path.len()).rev() {
                    if modules.contains(&path[..n]) {
                        if path[..n] != me[..] {
                            found.insert(path[..n].to_vec());
                        }
                        break;
                    }
                }
            }
        }
    }
    found
}

/// The file graph of `src/`: module → the modules it names.
fn graph() -> BTreeMap<ModPath, BTreeSet<ModPath>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    src_files(&src, &mut files);
    let mut code = BTreeMap::new();
    for f in &files {
        if let Some(m) = module_of(&src, f) {
            let text = std::fs::read_to_string(f).expect("a source file is UTF-8");
            code.insert(m, strip_test_items(&strip_comments_and_strings(&text)));
        }
    }
    let modules: BTreeSet<ModPath> = code.keys().cloned().collect();
    code.iter()
        .map(|(m, c)| (m.clone(), references(c, m, &modules)))
        .collect()
}

/// Strongly connected components (Tarjan, iterative enough for a few hundred files).
fn sccs(g: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<Vec<ModPath>> {
    struct St<'a> {
        g: &'a BTreeMap<ModPath, BTreeSet<ModPath>>,
        index: BTreeMap<&'a ModPath, usize>,
        low: BTreeMap<&'a ModPath, usize>,
        stack: Vec<&'a ModPath>,
        on: BTreeSet<&'a ModPath>,
        next: usize,
        out: Vec<Vec<ModPath>>,
    }
    fn visit<'a>(s: &mut St<'a>, v: &'a ModPath) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on.insert(v);
        let g = s.g;
        for w in g.get(v).into_iter().flatten() {
            let Some((w, _)) = g.get_key_value(w) else {
                continue;
            };
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = s.stack.pop().expect("on the stack");
                s.on.remove(w);
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            s.out.push(comp);
        }
    }
    let mut s = St {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in g.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

fn name(m: &ModPath) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

/// The circles through more than two files: within a strongly connected component, every
/// import must be answered by one back (a pair) and the pairs must form a tree; anything
/// else closes a circle through three or more files.
fn long_circles(g: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<String> {
    let mut bad = Vec::new();
    for comp in sccs(g) {
        if comp.len() < 3 {
            continue;
        }
        let set: BTreeSet<&ModPath> = comp.iter().collect();
        let mut one_way = Vec::new();
        let mut pairs = 0;
        for a in &comp {
            for b in g[a].iter().filter(|b| set.contains(b)) {
                if g[b].contains(a) {
                    pairs += 1;
                } else {
                    one_way.push(format!("{} -> {}", name(a), name(b)));
                }
            }
        }
        // Each pair was counted from both ends.
        if !one_way.is_empty() || pairs / 2 != comp.len() - 1 {
            let mut names: Vec<String> = comp.iter().map(name).collect();
            names.sort();
            bad.push(format!(
                "circle through {} files: {} (imports with no import back: {})",
                comp.len(),
                names.join(", "),
                if one_way.is_empty() {
                    "none; the pairs close a loop".to_string()
                } else {
                    one_way.join(", ")
                }
            ));
        }
    }
    bad
}

#[test]
fn no_import_circle_goes_through_more_than_two_files() {
    let g = graph();
    assert!(
        g.len() > 50,
        "the scan found the files of src/ ({})",
        g.len()
    );
    let bad = long_circles(&g);
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_bottom_layers_never_import_the_request_path_above_them() {
    let g = graph();
    let mut bad = Vec::new();
    for (from, tos) in &g {
        let Some(top) = from.first() else { continue };
        if !LOWER.contains(&top.as_str()) {
            continue;
        }
        for to in tos {
            if to.first().is_some_and(|t| UPPER.contains(&t.as_str())) {
                bad.push(format!("{} -> {}", name(from), name(to)));
            }
        }
    }
    assert!(bad.is_empty(), "upward imports:\n{}", bad.join("\n"));
}

#[test]
fn the_checker_sees_grouped_relative_and_nested_paths() {
    let modules: BTreeSet<ModPath> = [
        vec![],
        vec!["a".to_string()],
        vec!["a".to_string(), "b".to_string()],
        vec!["c".to_string()],
        vec!["c".to_string(), "d".to_string()],
    ]
    .into_iter()
    .collect();
    let me = vec!["a".to_string(), "b".to_string()];
    let code = strip_test_items(&strip_comments_and_strings(
        "use crate::{c::{d::X, Y}, a};\nuse super::Z;\n// crate::q\nlet s = \"crate::c\";\n#[cfg(test)]\nmod tests { use crate::c::d; }\n",
    ));
    let refs = references(&code, &me, &modules);
    let names: Vec<String> = refs.iter().map(name).collect();
    assert_eq!(names, ["a", "c", "c::d"]);
    // A three-file loop is caught; a hub with two spokes (pairs only) is not.
    let p = |s: &str| -> ModPath { s.split("::").map(str::to_string).collect() };
    let mut g: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (a, b) in [("x", "y"), ("y", "z"), ("z", "x")] {
        g.entry(p(a)).or_default().insert(p(b));
    }
    assert_eq!(long_circles(&g).len(), 1);
    let mut hub: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (a, b) in [("h", "s1"), ("s1", "h"), ("h", "s2"), ("s2", "h")] {
        hub.entry(p(a)).or_default().insert(p(b));
    }
    assert!(long_circles(&hub).is_empty());
}
