//! The layering of the workspace's crates, checked from their sources: every module imports
//! only downward, and no modules import each other in a circle. Checked: `qkv` (`src/`),
//! `qkv-kernels` (`kernels/src/`), `qkv-server` (its library and its binary's modules) and
//! `qkv-cli` (its library and `decode`).
//!
//! The check reads a crate's sources as text from its root file (comments, strings and
//! `#[cfg(test)]` items left out), builds the module tree from the `mod` declarations, and
//! resolves every `crate::…`, `super::…` and `self::…` path (in `use` trees and in code) to
//! the module that defines the item, following `use` re-exports. A reference from module `a`
//! to module `b` is then an edge between the two children of their closest common ancestor
//! that hold them. The rules:
//!
//! - at the top of each crate, the modules form the layers declared below (`SRC_LAYERS`,
//!   `KERNEL_LAYERS`, …, lowest first), and an edge may only go to a lower layer;
//! - below the top, the edges among the children of any one module have no cycle;
//! - nothing imports an item defined in a library's `lib.rs` itself (lib.rs only declares
//!   and re-exports); a module may use its ancestors' items and its descendants'. A binary's
//!   `main.rs` is its program and holds the state its modules share, which they may use as an
//!   ancestor's items;
//! - no two modules of the server (its library and its binary together) have one name.
//!
//! The tests at the end run the check on small made-up crates, to show that it fails on an
//! upward import, on a cycle (in a library and in a binary), on an item taken from lib.rs and
//! on a module name used twice.

#[path = "layering/paths.rs"]
mod paths;
#[path = "layering/text.rs"]
mod text;
use paths::{code_paths, mod_decls, path_attributes, use_paths, without_alias};
use text::{blank_literals, blank_tests, line_of};

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
    "speculative",
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

/// `qkv-server`'s library modules, lowest layer first (its lib.rs says the same in prose).
const SERVER_LAYERS: &[&str] = &[
    "error",
    "body",
    "auth",
    "native_fields",
    "speculative",
    "request",
    "embedding",
    "structured",
    "tools",
    "tool_stream",
    "constraint",
    "strict_calls",
    "compat",
    "token_text",
    "chat_prompt",
];

/// The modules of the `qkv-server` binary (beside its main.rs), lowest layer first (main.rs
/// says the same in prose).
const SERVER_BIN_LAYERS: &[&str] = &[
    "llama_flags",
    "args",
    "cors",
    "listen",
    "named_templates",
    "metrics",
    "worker",
    "lora",
    "models",
    "chat",
    "generation",
    "openai",
    "native",
    "infill",
    "slot_files",
    "embed_decoder",
    "rerank",
    "translate",
    "anthropic",
    "responses",
    "embed",
    "routes",
    "router",
    "startup",
];

/// The workspace root.
fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn qkv_imports_only_downward_without_cycles() {
    assert_layered(&workspace().join("src/lib.rs"), SRC_LAYERS, Root::Library);
}

#[test]
fn kernels_import_only_downward_without_cycles() {
    assert_layered(
        &workspace().join("kernels/src/lib.rs"),
        KERNEL_LAYERS,
        Root::Library,
    );
}

#[test]
fn server_imports_only_downward_without_cycles() {
    let server = workspace().join("server/src");
    assert_layered(&server.join("lib.rs"), SERVER_LAYERS, Root::Library);
    let bin = server.join("bin/qkv-server/main.rs");
    assert_layered(&bin, SERVER_BIN_LAYERS, Root::Binary);
    let names = twice_named(&[&server.join("lib.rs"), &bin]);
    assert!(names.is_empty(), "server modules named alike: {names:?}");
}

#[test]
fn cli_imports_only_downward_without_cycles() {
    let decode = workspace().join("cli/src/bin/decode/main.rs");
    assert_layered(&decode, &["tools"], Root::Binary);
}

fn assert_layered(root: &Path, layers: &[&str], kind: Root) {
    let problems = check_crate(root, layers, kind);
    assert!(
        problems.is_empty(),
        "{}: the layering is broken:\n{}",
        root.display(),
        problems.join("\n")
    );
}

/// What a crate's root file is: a library's lib.rs only declares and re-exports, so an item
/// defined there is an error to take; a binary's main.rs is the program, whose modules may
/// use its items as any module uses its ancestors'.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Root {
    Library,
    Binary,
}

/// The names given to more than one module across the crates rooted at `roots` (one crate's
/// library and binary, say), each with the modules that bear it.
fn twice_named(roots: &[&Path]) -> BTreeMap<String, Vec<String>> {
    let mut by_name: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for root in roots {
        let mut tree = Tree {
            modules: BTreeMap::new(),
            children: BTreeMap::new(),
        };
        load(&mut tree, root, Vec::new(), true, &mut Vec::new());
        for path in tree.modules.keys() {
            if let Some(name) = path.last() {
                let at = format!("{}: {}", root.display(), path.join("::"));
                by_name.entry(name.clone()).or_default().push(at);
            }
        }
    }
    by_name.retain(|_, at| at.len() > 1);
    by_name
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

/// Every problem found in the library under `src` (whose root is `lib.rs`), as a line each.
fn check(src: &Path, layers: &[&str]) -> Vec<String> {
    check_crate(&src.join("lib.rs"), layers, Root::Library)
}

/// Every problem found in the crate whose root file is `root`, as a line each.
fn check_crate(root: &Path, layers: &[&str], kind: Root) -> Vec<String> {
    let mut tree = Tree {
        modules: BTreeMap::new(),
        children: BTreeMap::new(),
    };
    let mut problems = Vec::new();
    load(&mut tree, root, Vec::new(), true, &mut problems);
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
            if kind == Root::Library && target.is_empty() && !m.is_empty() {
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
                "module `{name}` is in no declared layer (add it to the list in tests/layering.rs and to the crate root's doc)"
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

#[test]
fn a_binary_may_use_items_of_main_rs_but_not_import_in_a_cycle() {
    let main = "mod a;\nmod b;\npub struct State;\nfn main() { a::f(&State) }\n";
    let dir = scratch_crate(
        "bin",
        &[
            ("main.rs", main),
            (
                "a.rs",
                "use crate::State;\npub fn f(_: &State) { crate::b::g() }\n",
            ),
            ("b.rs", "pub fn g() {}\n"),
        ],
    );
    let layered = check_crate(&dir.join("main.rs"), &["b", "a"], Root::Binary);
    assert_eq!(layered, Vec::<String>::new());
    std::fs::write(dir.join("b.rs"), "pub fn g() { let _ = crate::a::f; }\n").unwrap();
    // b now imports from a as well: a circle, whatever the layers.
    let problems = check_crate(&dir.join("main.rs"), &["a", "b"], Root::Binary);
    assert!(
        problems
            .iter()
            .any(|p| p.contains("a cycle among the children of `crate`")),
        "{problems:?}"
    );
    // As a library's root, the same State is an item taken from lib.rs.
    std::fs::rename(dir.join("main.rs"), dir.join("lib.rs")).unwrap();
    let problems = check(&dir, &["b", "a"]);
    assert!(
        problems.iter().any(|p| p.contains("defined in lib.rs")),
        "{problems:?}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_module_name_used_twice_is_found() {
    let dir = scratch_crate(
        "names",
        &[
            ("lib.rs", "pub mod native;\npub mod request;\n"),
            ("native.rs", "pub fn f() {}\n"),
            ("request.rs", "pub fn g() {}\n"),
            (
                "bin/app/main.rs",
                "mod native;\nmod routes;\nfn main() {}\n",
            ),
            ("bin/app/native.rs", "pub fn h() {}\n"),
            ("bin/app/routes.rs", "pub fn i() {}\n"),
        ],
    );
    let bin = dir.join("bin/app/main.rs");
    let twice = twice_named(&[&dir.join("lib.rs"), &bin]);
    assert_eq!(twice.keys().collect::<Vec<_>>(), ["native"], "{twice:?}");
    assert_eq!(twice["native"].len(), 2);
    assert!(twice_named(&[&dir.join("lib.rs")]).is_empty());
    std::fs::remove_dir_all(dir).unwrap();
}
