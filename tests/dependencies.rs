//! The `qkv` library needs no network: nothing it links, directly or through another crate,
//! opens sockets, runs an async runtime or parses command lines. Those belong to the programs:
//! qkv-cli (`decode`) and qkv-server.
//! Read from the manifests and Cargo.lock, so a dependency that pulls one in fails here.

use std::collections::{BTreeMap, BTreeSet};

/// Crates that mean networking, an async runtime or argument parsing.
const REFUSED: &[&str] = &[
    "axum",
    "clap",
    "futures-util",
    "h2",
    "hyper",
    "mio",
    "reqwest",
    "socket2",
    "tokio",
    "ureq",
];

/// Each package of the lock file with the names of its dependencies.
fn lock_graph() -> BTreeMap<String, Vec<String>> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock");
    let text = std::fs::read_to_string(path).unwrap();
    let mut graph = BTreeMap::new();
    for block in text.split("[[package]]").skip(1) {
        let mut name = None;
        let mut deps = Vec::new();
        let mut in_deps = false;
        for line in block.lines().map(str::trim) {
            if let Some(v) = line.strip_prefix("name = ") {
                name = Some(v.trim_matches('"').to_owned());
            } else if line == "dependencies = [" {
                in_deps = true;
            } else if in_deps && line == "]" {
                in_deps = false;
            } else if in_deps {
                // `"name"` or `"name version"`.
                let dep = line.trim_end_matches(',').trim_matches('"');
                deps.push(dep.split(' ').next().unwrap().to_owned());
            }
        }
        let name = name.expect("every package has a name");
        graph.entry(name).or_insert_with(Vec::new).extend(deps);
    }
    graph
}

/// The `[dependencies]` of a workspace member's manifest (`dir` relative to the workspace
/// root): the lock file lists members' dev-dependencies beside them, which are not linked.
fn manifest_dependencies(dir: &str) -> Vec<String> {
    section_dependencies(dir, "[dependencies]")
}

/// Everything the library `qkv` links: its manifest's dependencies, then theirs, from the
/// manifest for workspace members and from the lock file for the rest.
fn linked_by_qkv(graph: &BTreeMap<String, Vec<String>>) -> BTreeSet<String> {
    let members = [("qkv", "."), ("qkv-kernels", "kernels")];
    let mut seen = BTreeSet::new();
    let mut todo = vec!["qkv".to_owned()];
    while let Some(p) = todo.pop() {
        let deps = match members.iter().find(|(name, _)| *name == p) {
            Some((_, dir)) => manifest_dependencies(dir),
            None => graph.get(&p).cloned().unwrap_or_default(),
        };
        for d in deps {
            if seen.insert(d.clone()) {
                todo.push(d);
            }
        }
    }
    seen
}

#[test]
fn the_library_links_no_network_runtime_or_argument_parser() {
    let graph = lock_graph();
    let linked = linked_by_qkv(&graph);
    assert!(
        linked.contains("qkv-kernels") && linked.contains("memmap2") && linked.contains("gemm")
    );
    assert!(
        graph.contains_key("tokio") && graph.contains_key("clap"),
        "the lock lists them"
    );
    let found: Vec<&&str> = REFUSED.iter().filter(|c| linked.contains(**c)).collect();
    assert!(found.is_empty(), "qkv links {found:?}");
    // They are where they belong: the server's manifest, and the command line's parser in
    // qkv-cli's.
    let server = manifest_dependencies("server");
    for c in ["axum", "clap", "tokio"] {
        assert!(server.iter().any(|d| d == c), "{c}");
    }
    assert!(manifest_dependencies("cli").iter().any(|d| d == "clap"));
}

/// The dependency names of `section` (`[dependencies]`, `[dev-dependencies]`, …) in the
/// manifest of the workspace member in `dir`.
fn section_dependencies(dir: &str, section: &str) -> Vec<String> {
    let path = format!("{}/{dir}/Cargo.toml", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(path).unwrap();
    let mut current = "";
    let mut deps = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            current = line;
        } else if current == section && !line.is_empty() && !line.starts_with('#') {
            deps.push(line.split(['=', '.', ' ']).next().unwrap().to_owned());
        }
    }
    deps
}

#[test]
fn no_dependency_cycle_runs_through_the_programs_or_the_fetch() {
    let sections = [
        "[dependencies]",
        "[dev-dependencies]",
        "[build-dependencies]",
    ];
    // qkv reaches neither program's crate through any dependency, not even one of its
    // tests'; and neither program's crate depends on the other.
    for (dir, refused) in [
        (".", &["qkv-cli", "qkv-server"][..]),
        ("cli", &["qkv-server"]),
        ("server", &["qkv-cli"]),
    ] {
        for section in sections {
            let deps = section_dependencies(dir, section);
            let found: Vec<_> = deps
                .iter()
                .filter(|d| refused.contains(&d.as_str()))
                .collect();
            assert!(found.is_empty(), "{dir} {section}: {found:?}");
        }
    }
    // The default model's fetch, which qkv's tests use, depends on nothing of qkv.
    let fetch = section_dependencies("fetch", "[dependencies]");
    assert!(fetch.iter().all(|d| !d.starts_with("qkv")), "{fetch:?}");
    assert!(section_dependencies(".", "[dev-dependencies]").contains(&"qkv-fetch".to_owned()));
}
