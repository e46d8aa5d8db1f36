//! The layering of `qkv` and `qkv-kernels`, checked from their sources: every module imports
//! only downward, and no modules import each other in a circle.
//!
//! The check reads `src/` and `kernels/src/` as text (comments, strings and `#[cfg(test)]`
//! items left out), builds the module tree from the `mod` declarations, and resolves every
//! `crate::…`, `super::…` and `self::…` path (in `use` trees and in code) to the module that
//! defines the item, following `use` re-exports. A reference from module `a` to module `b`
//! is then an edge between the two children of their closest common ancestor that hold
//! them. The rules:
//!
//! - at the top of each crate, the modules form the layers declared below (`SRC_LAYERS`,
//!   `KERNEL_LAYERS`, lowest first), and an edge may only go to a lower layer;
//! - below the top, the edges among the children of any one module have no cycle;
//! - nothing imports an item defined in `lib.rs` itself (lib.rs only declares and
//!   re-exports); a module may use its ancestors' items and its descendants'.
//!
//! The tests at the end run the check on small made-up crates, to show that it fails on an
//! upward import, on a cycle and on an item taken from lib.rs.

#[path = "layering/text.rs"]
mod text;
use text::{blank_literals, blank_tests, find_word, ident_at, line_of, matching, skip_ws};

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// `qkv`'s top modules, lowest layer first (lib.rs says the same in prose).
const SRC_LAYERS: &[&str] = &[
    "error",
    "alloc",
    "weights",
    "nn",
    "tokenizer",
    "models",
    "sample",
    "load",
    "session",
    "engine",
    "perplexity",
    "testing",
];

/// `qkv-kernels`' top modules, lowest layer first (lib.rs says the same in prose).
const KERNEL_LAYERS: &[&str] = &[
    "macros",
    "error",
    "pages",
    "simd",
    "par",
    "convert",
    "probe",
    "quant",
    "matmul",
    "norm",
    "activation",
    "rope",
    "position",
    "attention",
];

#[test]
fn qkv_imports_only_downward_without_cycles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    assert_layered(&root.join("src"), SRC_LAYERS);
}

#[test]
fn kernels_import_only_downward_without_cycles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    assert_layered(&root.join("kernels/src"), KERNEL_LAYERS);
}

fn assert_layered(src: &Path, layers: &[&str]) {
    let problems = check(src, layers);
    assert!(
        problems.is_empty(),
        "{}: the layering is broken:\n{}",
        src.display(),
        problems.join("\n")
    );
}

/// The module path given to names that a `use` brings in from another crate.
const EXTERN: &str = "<another crate>";

/// A module's path below the crate root (empty for the root).
type ModPath = Vec<String>;

/// One file (or inline module) read for the check.
struct Module {
    /// Its file, for messages.
    file: PathBuf,
    /// Its text with comments, literals and test-only items blanked out.
    text: String,
    /// The names this module's `use` declarations bring in, with the path they name.
    imports: BTreeMap<String, (ModPath, Vec<String>)>,
}

/// The crate read from its root file: the modules by path, and for each its children.
struct Tree {
    modules: BTreeMap<ModPath, Module>,
    children: BTreeMap<ModPath, BTreeSet<String>>,
}

/// Every problem found in the crate under `src` (whose root is `lib.rs`), as a line each.
fn check(src: &Path, layers: &[&str]) -> Vec<String> {
    let mut tree = Tree {
        modules: BTreeMap::new(),
        children: BTreeMap::new(),
    };
    let mut problems = Vec::new();
    load(
        &mut tree,
        &src.join("lib.rs"),
        Vec::new(),
        true,
        &mut problems,
    );
    for m in tree.modules.keys().cloned().collect::<Vec<_>>() {
        let imports = {
            let module = &tree.modules[&m];
            use_paths(&module.text)
                .into_iter()
                .filter_map(|(_, segs)| {
                    let name = segs.last()?.clone();
                    let abs = absolute(&tree, &m, without_alias(&segs));
                    (name != "*").then_some((name, abs))
                })
                .collect::<Vec<_>>()
        };
        let module = tree.modules.get_mut(&m).unwrap();
        for (name, abs) in imports {
            let entry = match abs {
                Some(segs) => split_module(&tree.children, &segs),
                // Another crate (`pub use qkv_kernels as kernels;`): nothing of this one.
                None => (vec![EXTERN.to_string()], Vec::new()),
            };
            module.imports.insert(name, entry);
        }
    }

    // Edges among siblings, with a witness each: parent → (from, to) → "file:line: path".
    let mut edges: BTreeMap<ModPath, BTreeMap<(String, String), String>> = BTreeMap::new();
    for (m, module) in &tree.modules {
        let mut refs = use_paths(&module.text);
        refs.extend(code_paths(&module.text));
        for (at, segs) in refs {
            let segs = without_alias(&segs).to_vec();
            let Some(abs) = absolute(&tree, m, &segs) else {
                continue;
            };
            let target = home(&tree, &abs);
            if target.first().is_some_and(|t| t == EXTERN) {
                continue;
            }
            let witness = format!(
                "{}:{}: {}",
                module.file.display(),
                line_of(&module.text, at),
                segs.join("::")
            );
            if target.is_empty() && !m.is_empty() {
                problems.push(format!(
                    "{witness}: takes an item defined in lib.rs (move it into a module)"
                ));
                continue;
            }
            let common = m.iter().zip(&target).take_while(|(a, b)| a == b).count();
            if common == m.len() || common == target.len() {
                continue; // an ancestor's item or a descendant's
            }
            edges
                .entry(m[..common].to_vec())
                .or_default()
                .entry((m[common].clone(), target[common].clone()))
                .or_insert(witness);
        }
    }

    let rank = |name: &str| layers.iter().position(|l| *l == name);
    let top = tree.children.get(&Vec::new()).cloned().unwrap_or_default();
    for name in &top {
        if rank(name).is_none() {
            problems.push(format!(
                "module `{name}` is in no declared layer (add it to the list in tests/layering.rs and lib.rs)"
            ));
        }
    }
    for name in layers {
        if !top.contains(*name) {
            problems.push(format!(
                "declared layer `{name}` is not a module of the crate"
            ));
        }
    }
    for (parent, pairs) in &edges {
        if parent.is_empty() {
            for ((from, to), witness) in pairs {
                if let (Some(f), Some(t)) = (rank(from), rank(to)) {
                    if t >= f {
                        problems.push(format!(
                            "{witness}: `{from}` imports from `{to}`, which is not a lower layer"
                        ));
                    }
                }
            }
        }
        for cycle in cycles(pairs) {
            let mut msg = format!(
                "a cycle among the children of `crate{}`:",
                parent.iter().map(|p| format!("::{p}")).collect::<String>()
            );
            for pair in cycle.windows(2) {
                let witness = &pairs[&(pair[0].clone(), pair[1].clone())];
                write!(msg, "\n    {} → {} ({witness})", pair[0], pair[1]).unwrap();
            }
            problems.push(msg);
        }
    }
    problems
}

/// Reads the module `path` from `file` and, recursively, its children.
fn load(tree: &mut Tree, file: &Path, path: ModPath, owns_dir: bool, problems: &mut Vec<String>) {
    let raw = match std::fs::read_to_string(file) {
        Ok(raw) => raw,
        Err(e) => {
            problems.push(format!("{}: {e}", file.display()));
            return;
        }
    };
    let path_attrs = path_attributes(&raw);
    let text = blank_tests(&blank_literals(&raw));
    // Where this file's children live: beside it for lib.rs and mod.rs, else in a folder of
    // its name.
    let dir = if owns_dir {
        file.parent().unwrap().to_path_buf()
    } else {
        file.with_extension("")
    };
    tree.children.entry(path.clone()).or_default();
    let mut inline = Vec::new();
    for decl in mod_decls(&text) {
        let mut child = path.clone();
        child.push(decl.name.clone());
        tree.children
            .get_mut(&path)
            .unwrap()
            .insert(decl.name.clone());
        match decl.body {
            Some(range) => inline.push((child, range)),
            None => {
                let attr = path_attrs
                    .iter()
                    .rev()
                    .find(|(end, _)| {
                        *end <= decl.at && !text[*end..decl.at].contains([';', '{', '}'])
                    })
                    .map(|(_, p)| p.clone());
                let (child_file, child_owns) = match attr {
                    Some(p) => (file.parent().unwrap().join(&p), p.ends_with("mod.rs")),
                    None => {
                        let flat = dir.join(format!("{}.rs", decl.name));
                        if flat.exists() {
                            (flat, false)
                        } else {
                            (dir.join(&decl.name).join("mod.rs"), true)
                        }
                    }
                };
                load(tree, &child_file, child, child_owns, problems);
            }
        }
    }
    // An inline module's text is taken out of its parent's and checked as its own module.
    let mut outer = text.clone().into_bytes();
    for (child, range) in inline {
        let body = text[range.clone()].to_string();
        outer[range].iter_mut().for_each(|b| {
            if *b != b'\n' {
                *b = b' '
            }
        });
        tree.children.entry(child.clone()).or_default();
        tree.modules.insert(
            child,
            Module {
                file: file.to_path_buf(),
                text: body,
                imports: BTreeMap::new(),
            },
        );
    }
    tree.modules.insert(
        path,
        Module {
            file: file.to_path_buf(),
            text: String::from_utf8(outer).unwrap(),
            imports: BTreeMap::new(),
        },
    );
}

/// A `mod name;` or `mod name { … }` declaration: where it starts, and its body's byte range.
struct ModDecl {
    name: String,
    at: usize,
    body: Option<std::ops::Range<usize>>,
}

fn mod_decls(text: &str) -> Vec<ModDecl> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(at) = find_word(text, "mod", i) {
        i = at + 3;
        let (name, after) = ident_at(text, skip_ws(b, i));
        if name.is_empty() {
            continue;
        }
        let j = skip_ws(b, after);
        match b.get(j) {
            Some(b';') => out.push(ModDecl {
                name,
                at,
                body: None,
            }),
            Some(b'{') => {
                let end = matching(b, j);
                out.push(ModDecl {
                    name,
                    at,
                    body: Some(j + 1..end),
                });
                i = end;
            }
            _ => {}
        }
    }
    out
}

/// `#[path = "…"]` attributes: where each ends, and the path.
fn path_attributes(raw: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(k) = raw[i..].find("#[path") {
        let start = i + k;
        let Some(end) = raw[start..].find(']').map(|e| start + e + 1) else {
            break;
        };
        let attr = &raw[start..end];
        if let (Some(q0), Some(q1)) = (attr.find('"'), attr.rfind('"')) {
            if q1 > q0 {
                out.push((end, attr[q0 + 1..q1].to_string()));
            }
        }
        i = end;
    }
    out
}

/// The `use` trees of `text`: where each starts, and each path it names, as segments.
fn use_paths(text: &str) -> Vec<(usize, Vec<String>)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(at) = find_word(text, "use", i) {
        let Some(end) = text[at..].find(';').map(|e| at + e) else {
            break;
        };
        i = end;
        if !b.get(at + 3).is_some_and(|c| c.is_ascii_whitespace()) {
            continue;
        }
        let tokens = tokenize(&text[at + 3..end]);
        for path in expand(&tokens) {
            out.push((at, path));
        }
    }
    out
}

/// `crate::…`, `super::…` and `self::…` paths written in code, outside `use` declarations.
fn code_paths(text: &str) -> Vec<(usize, Vec<String>)> {
    let mut without_uses = text.as_bytes().to_vec();
    let mut i = 0;
    while let Some(at) = find_word(text, "use", i) {
        let end = text[at..].find(';').map_or(text.len(), |e| at + e);
        without_uses[at..end].iter_mut().for_each(|c| {
            if *c != b'\n' {
                *c = b' '
            }
        });
        i = end.max(at + 3);
    }
    let text = String::from_utf8(without_uses).unwrap();
    let b = text.as_bytes();
    let mut out = Vec::new();
    for head in ["crate", "super", "self"] {
        let mut i = 0;
        while let Some(at) = find_word(&text, head, i) {
            i = at + head.len();
            if at > 0 && b[at - 1] == b'$' {
                continue; // `$crate` in a macro
            }
            if text[..at].trim_end().ends_with(" in") || text[..at].trim_end().ends_with("(in") {
                continue; // `pub(in crate::…)`
            }
            let mut segs = vec![head.to_string()];
            let mut j = i;
            loop {
                let k = skip_ws(b, j);
                if !text[k..].starts_with("::") {
                    break;
                }
                let (name, after) = ident_at(&text, skip_ws(b, k + 2));
                if name.is_empty() {
                    break;
                }
                segs.push(name);
                j = after;
            }
            if segs.len() > 1 {
                out.push((at, segs));
            }
        }
    }
    out
}

/// Tokens of a `use` tree: identifiers and `::`, `{`, `}`, `,`, `*`.
fn tokenize(s: &str) -> Vec<String> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_whitespace() {
            i += 1;
        } else if s[i..].starts_with("::") {
            out.push("::".into());
            i += 2;
        } else if b"{},*".contains(&b[i]) {
            out.push((b[i] as char).to_string());
            i += 1;
        } else {
            let (name, after) = ident_at(s, i);
            if name.is_empty() {
                i += 1;
            } else {
                out.push(name);
                i = after;
            }
        }
    }
    out
}

/// The paths a `use` tree names (`a::{b, c::d as e}` → `a::b`, `a::c::d`).
fn expand(tokens: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for part in split_top(tokens) {
        let mut prefix = Vec::new();
        let mut k = 0;
        while k < part.len() {
            match part[k].as_str() {
                "::" => k += 1,
                "{" => {
                    let inner = &part[k + 1..part.len() - 1];
                    for mut sub in expand(inner) {
                        if sub == ["self"] {
                            sub.clear();
                        }
                        let mut p = prefix.clone();
                        p.append(&mut sub);
                        out.push(p);
                    }
                    prefix.clear();
                    break;
                }
                "as" => {
                    // `path as alias`: the alias is kept as the path's last two segments.
                    if let Some(alias) = part.get(k + 1) {
                        prefix.push("as".to_string());
                        prefix.push(alias.clone());
                    }
                    break;
                }
                seg => {
                    prefix.push(seg.to_string());
                    k += 1;
                }
            }
        }
        if !prefix.is_empty() {
            out.push(prefix);
        }
    }
    out.retain(|p| !p.is_empty());
    out
}

/// A `use` path without its `as alias` ending.
fn without_alias(segs: &[String]) -> &[String] {
    match segs.len() {
        n if n >= 2 && segs[n - 2] == "as" => &segs[..n - 2],
        _ => segs,
    }
}

/// Splits tokens at the commas outside braces.
fn split_top(tokens: &[String]) -> Vec<&[String]> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (k, t) in tokens.iter().enumerate() {
        match t.as_str() {
            "{" => depth += 1,
            "}" => depth -= 1,
            "," if depth == 0 => {
                out.push(&tokens[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    out.push(&tokens[start..]);
    out
}

/// A path from module `m` made absolute (from the crate root), or `None` when it names
/// another crate.
fn absolute(tree: &Tree, m: &ModPath, segs: &[String]) -> Option<Vec<String>> {
    let mut base = m.clone();
    let mut k = 0;
    match segs.first()?.as_str() {
        "crate" => {
            base.clear();
            k = 1;
        }
        "self" => k = 1,
        "super" => {
            while segs.get(k).map(String::as_str) == Some("super") {
                base.pop()?;
                k += 1;
            }
        }
        first if tree.children.get(m).is_some_and(|c| c.contains(first)) => {}
        _ => return None,
    }
    base.extend(segs[k..].iter().cloned());
    Some(base)
}

/// The longest module path at the front of `segs`, and the rest.
fn split_module(
    children: &BTreeMap<ModPath, BTreeSet<String>>,
    segs: &[String],
) -> (ModPath, Vec<String>) {
    let mut base = Vec::new();
    for (k, s) in segs.iter().enumerate() {
        if children.get(&base).is_some_and(|c| c.contains(s)) {
            base.push(s.clone());
        } else {
            return (base, segs[k..].to_vec());
        }
    }
    (base, Vec::new())
}

/// The module that defines the item an absolute path names, following `use` re-exports.
fn home(tree: &Tree, abs: &[String]) -> ModPath {
    let (mut base, mut rest) = split_module(&tree.children, abs);
    for _ in 0..32 {
        let Some(name) = rest.first() else {
            return base;
        };
        match tree.modules.get(&base).and_then(|m| m.imports.get(name)) {
            Some((next, next_rest)) => {
                let mut r = next_rest.clone();
                r.extend(rest[1..].iter().cloned());
                if r.is_empty() {
                    return next.clone(); // `use a::b;` of a module
                }
                (base, rest) = (next.clone(), r);
            }
            None => return base,
        }
    }
    base
}

/// The cycles of a directed graph given by its edges, each as a closed walk of names.
fn cycles(edges: &BTreeMap<(String, String), String>) -> Vec<Vec<String>> {
    let mut adj: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        adj.entry(a).or_default().push(b);
    }
    let mut out: Vec<Vec<String>> = Vec::new();
    let mut seen_sets: BTreeSet<BTreeSet<String>> = BTreeSet::new();
    // Depth-first search from every node; each back edge closes a cycle.
    fn dfs<'a>(
        n: &'a str,
        adj: &BTreeMap<&'a str, Vec<&'a str>>,
        stack: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
        found: &mut Vec<Vec<String>>,
    ) {
        stack.push(n);
        for &next in adj.get(n).map(Vec::as_slice).unwrap_or(&[]) {
            if let Some(pos) = stack.iter().position(|s| *s == next) {
                let mut cyc: Vec<String> = stack[pos..].iter().map(|s| s.to_string()).collect();
                cyc.push(next.to_string());
                found.push(cyc);
            } else if !done.contains(next) {
                dfs(next, adj, stack, done, found);
            }
        }
        stack.pop();
        done.insert(n);
    }
    let mut done = BTreeSet::new();
    let mut found = Vec::new();
    for &n in adj.keys() {
        if !done.contains(n) {
            dfs(n, &adj, &mut Vec::new(), &mut done, &mut found);
        }
    }
    for cyc in found {
        if seen_sets.insert(cyc.iter().cloned().collect()) {
            out.push(cyc);
        }
    }
    out
}

/// A made-up crate in a fresh temporary folder: `(file, contents)` pairs under `src/`.
fn scratch_crate(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("qkv-layering-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (file, contents) in files {
        let path = dir.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, contents).unwrap();
    }
    dir
}

const LIB: &str = "pub mod low;\npub mod high;\npub use std::collections as other;\n";

#[test]
fn a_downward_crate_passes() {
    let dir = scratch_crate(
        "down",
        &[
            ("lib.rs", LIB),
            ("low.rs", "pub fn f() -> crate::other::BTreeSet<u8> { Default::default() }\n"),
            (
                "high/mod.rs",
                "mod a;\nmod b;\nuse crate::low::f;\npub fn g() { f(); b::h() }\n",
            ),
            ("high/a.rs", "pub(crate) fn x() { super::g() }\n"),
            (
                "high/b.rs",
                "use super::a::x;\n// crate::high::a is fine, and so is this comment: crate::high::g\npub fn h() { x() }\n#[cfg(test)]\nmod tests { use crate::high::g; }\n",
            ),
        ],
    );
    assert_eq!(check(&dir, &["low", "high"]), Vec::<String>::new());
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn an_upward_import_fails() {
    let dir = scratch_crate(
        "up",
        &[
            ("lib.rs", LIB),
            ("low.rs", "pub fn f() { crate::high::g() }\n"),
            ("high.rs", "pub fn g() {}\n"),
        ],
    );
    let problems = check(&dir, &["low", "high"]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("`low` imports from `high`"),
        "{problems:?}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_cycle_below_the_top_fails_even_through_a_reexport() {
    let dir = scratch_crate(
        "cycle",
        &[
            ("lib.rs", LIB),
            ("low.rs", "pub fn f() {}\n"),
            ("high/mod.rs", "mod a;\nmod b;\npub(crate) use b::Frame;\n"),
            (
                "high/a.rs",
                "use super::Frame;\npub(crate) fn x(_: Frame) {}\n",
            ),
            (
                "high/b.rs",
                "pub(crate) struct Frame;\npub fn h() { super::a::x(Frame) }\n",
            ),
        ],
    );
    let problems = check(&dir, &["low", "high"]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("a cycle among the children of `crate::high`"),
        "{problems:?}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn an_item_of_lib_rs_fails() {
    let dir = scratch_crate(
        "librs",
        &[
            (
                "lib.rs",
                "pub mod low;\npub mod high;\npub(crate) fn helper() {}\n",
            ),
            ("low.rs", "pub fn f() { crate::helper() }\n"),
            ("high.rs", "pub use crate::low::f;\n"),
        ],
    );
    let problems = check(&dir, &["low", "high"]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("defined in lib.rs"), "{problems:?}");
    std::fs::remove_dir_all(dir).unwrap();
}
