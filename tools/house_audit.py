"""Checks the house rules of issue 47 that no compiler or test states, over the tree as text.

Usage: python3 tools/house_audit.py [ROOT]   (ROOT: the checkout, by default this script's)

Each finding is printed as `path:line: what`; the exit status is 1 when there is one, so the
script can run in CI. The rules:

- long-function: no Rust function (tests included) spans more than 150 lines, from its `fn`
  to its closing brace;
- many-parameters: no Rust function takes 8 or more parameters (`self` counted, as clippy
  counts them): such a list becomes a named struct;
- env-in-library: no `std::env` read in the library crates' sources (`src/`,
  `kernels/src/`) outside their tests, but for the one documented ISA override (`QKV_ISA`);
- figure-in-comment: no measured figure (a number in tok/s, GB/s, GMAC/s or GFLOP/s) and no
  "sitting" in a comment of Rust or Python code; the figures belong in BENCHMARKS.md;
- import-cycle: no circle of imports among the Python scripts of `tools/`.

Rust sources are read with their comments, strings and character literals blanked, so braces
and commas inside them do not count. The import circles of the Rust crates, and their layers,
are checked by tests/layering.rs.
"""

import ast
import os
import re
import sys

LONGEST = 150
MOST_PARAMS = 7
RUST_DIRS = ["src", "kernels", "server", "cli", "fetch", "python/src", "fuzz", "tests",
             "benches", "examples"]
LIBRARY_DIRS = ["src", "kernels/src"]
# The one environment variable a library reads: the documented ISA override.
ALLOWED_ENV = {("kernels/src/simd.rs", "QKV_ISA")}
# A measured figure: a number with a rate's unit, or the word the diary used for a session.
FIGURES = re.compile(
    r"\d\s*(?:tok(?:ens)?/s|t/s|[GMK]i?B/s|GMAC/s|G?FLOP/s|GOP/s)|\bsittings?\b", re.I
)


def rust_files(root):
    for top in RUST_DIRS:
        for folder, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = [d for d in dirs if d not in ("target", "third_party", "corpus")]
            for f in sorted(files):
                if f.endswith(".rs"):
                    yield os.path.join(folder, f)


SPECIAL = re.compile(r"""//|/\*|b?r#*"|"|'(?:\\[^']{1,10}|[^\\'])'""")


def blank(src):
    """`src` with comments, strings and character literals made spaces (newlines kept)."""
    out, i, n = [], 0, len(src)
    while (m := SPECIAL.search(src, i)) is not None:
        start, token = m.start(), m.group()
        if token.startswith(("r", "b")) and re.match(r"\w", src[start - 1:start]):
            out.append(src[i:m.end()])
            i = m.end()
            continue
        if token == "//":
            end = src.find("\n", start)
            end = n if end < 0 else end
        elif token == "/*":
            depth, end = 0, start
            while end < n:
                pair = src[end:end + 2]
                depth += {"/*": 1, "*/": -1}.get(pair, 0)
                end += 2 if pair in ("/*", "*/") else 1
                if depth == 0:
                    break
        elif token.endswith('"') and token != '"':
            hashes = token.lstrip("br")[:-1]
            close = src.find('"' + hashes, m.end())
            end = n if close < 0 else close + 1 + len(hashes)
        elif token == '"':
            end = m.end()
            while end < n and src[end] != '"':
                end += 2 if src[end] == "\\" else 1
            end += 1
        else:
            end = m.end()
        out.append(src[i:start])
        out.append(re.sub(r"[^\n]", " ", src[start:end]))
        i = end
    out.append(src[i:])
    return "".join(out)


def closing(text, i, opening, close):
    """The index just past the bracket that closes the one opened before `i`."""
    depth = 1
    while i < len(text) and depth:
        depth += (text[i] in opening) - (text[i] in close)
        i += 1
    return i


def functions(text):
    """(name, first line, lines spanned or 0 without a body, parameter count) per `fn`."""
    for m in re.finditer(r"\bfn\s+(\w+)\s*(?:<[^({]*?>)?\s*\(", text):
        end = closing(text, m.end(), "([", ")]")
        params = text[m.end():end - 1].replace("->", "  ")
        depth, count, item = 0, 0, ""
        for ch in params:
            depth += (ch in "(<[{") - (ch in ")>]}")
            if ch == "," and depth == 0:
                count, item = count + 1, ""
            else:
                item += ch
        count += bool(item.strip())
        body = re.search(r"[{;]", text[end:])
        first = text.count("\n", 0, m.start()) + 1
        if body is None or body.group() == ";":
            yield m.group(1), first, 0, count
            continue
        last = text.count("\n", 0, closing(text, end + body.end(), "{", "}")) + 1
        yield m.group(1), first, last - first + 1, count


def test_ranges(text):
    """The line ranges of `#[cfg(test)]` items (their tests)."""
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub\s+)?mod\s+\w+\s*\{", text):
        yield (text.count("\n", 0, m.start()) + 1,
               text.count("\n", 0, closing(text, m.end(), "{", "}")) + 1)


def audit_rust(root, findings):
    for path in rust_files(root):
        rel = os.path.relpath(path, root)
        src = open(path, encoding="utf-8").read()
        text = blank(src)
        for name, line, span, count in functions(text):
            if span > LONGEST:
                findings.append(f"{rel}:{line}: long-function: `{name}` spans {span} lines")
            if count > MOST_PARAMS:
                findings.append(f"{rel}:{line}: many-parameters: `{name}` takes {count}")
        for no, comment in comments(src, "//"):
            if FIGURES.search(comment):
                findings.append(f"{rel}:{no}: figure-in-comment: {comment.strip()[:80]}")
        library = any(rel.startswith(d + "/") for d in LIBRARY_DIRS)
        if library and not re.search(r"(^|/)tests?(\.rs|/)|_tests\.rs$|/testing", rel):
            tests = list(test_ranges(text))
            for m in re.finditer(r"\benv::(var|var_os|vars)\b", text):
                line = text.count("\n", 0, m.start()) + 1
                name = re.match(r'\w*\(\s*"(\w+)"', src[m.end():m.end() + 60] or "")
                allowed = (rel, name.group(1) if name else "") in ALLOWED_ENV
                if not allowed and not any(a <= line <= b for a, b in tests):
                    findings.append(f"{rel}:{line}: env-in-library: `env::{m.group(1)}`")


def comments(src, marker):
    """(line number, comment text) of every line comment in `src`."""
    for no, line in enumerate(src.splitlines(), 1):
        at = line.find(marker)
        if at >= 0 and line.count('"', 0, at) % 2 == 0:
            yield no, line[at + len(marker):]


def audit_tools(root, findings):
    tools = os.path.join(root, "tools")
    names = {f[:-3] for f in os.listdir(tools) if f.endswith(".py")}
    edges = {}
    for name in sorted(names):
        path = os.path.join(tools, name + ".py")
        src = open(path, encoding="utf-8").read()
        for no, comment in comments(src, "#"):
            if FIGURES.search(comment):
                findings.append(f"tools/{name}.py:{no}: figure-in-comment: {comment.strip()[:80]}")
        imported = set()
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.add(node.module.split(".")[0])
        edges[name] = sorted(imported & names - {name})
    for cycle in cycles(edges):
        findings.append(f"tools/{cycle[0]}.py:1: import-cycle: {' -> '.join(cycle + cycle[:1])}")


def cycles(edges):
    """One circle per strongly connected set of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(__file__))
    findings = []
    audit_rust(os.path.abspath(root), findings)
    audit_tools(os.path.abspath(root), findings)
    for f in findings:
        print(f)
    print(f"house_audit: {len(findings)} finding(s)", file=sys.stderr)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
