#!/usr/bin/env python3
"""Fail when a crate has an import circle between its source files.

For every crate of the workspace (crates/* and fuzz/: a directory with a
Cargo.toml and a src/), the script builds the module tree from src/lib.rs,
src/main.rs and src/bin/*.rs by following `mod name;` declarations (`name.rs`
or `name/mod.rs`; the 2018 rule that `a.rs` declaring `mod b;` means `a/b.rs`;
`#[path = "..."]`). File A has an edge to file B when A names a path that
resolves into B's module: `use crate::...`, `use super::...`, `use self::...`
(brace groups, `pub use`, `as`), uses that start at a submodule or at a module
imported by name, and inline paths in code such as `crate::kv::bytes_of(x)` or
`super::foo::Bar`. A path goes to the deepest module of the crate that it names
(an item re-exported by a mod.rs counts as the mod.rs's: that is what the
source says). Comments, string literals and `#[cfg(test)]` items
(`mod tests { ... }`, test-only module files) are left out. Strongly connected
components of more than one file are the circles, printed with the names that
tie them.

A module's references to its own submodules (lib.rs, main.rs or a mod.rs
naming `child::f`, `self::child::X`, `pub use child::X`) are the direction of
the module tree, like the `mod` declaration, and are not edges; the way back
is: a child using `super::X` or `crate::X` from an ancestor has an edge to it.
So a circle always leaves a subtree and comes back into it. `--strict` also
counts the references to submodules (except `pub use` re-exports); a parent
file that defines what its children use and calls into them is then a circle.

Usage:  python3 scripts/check_circles.py [--root DIR] [--crate NAME] [--verbose] [--strict]
Exit status: 0 without circles, 1 with circles, 2 on a usage error.
"""
import argparse
import bisect
import os
import re
import sys

# ---------------------------------------------------------------- lexing

_LEX = re.compile(r"""//|/\*|\b[bc]?r(\#*)"|\b[bc]?"|"|'""")
_STR_BODY = re.compile(r'(?:[^"\\]|\\.)*"', re.S)
_CHAR = re.compile(r"""'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F_]*\}|.)|[^\\'\n])'""")


def _blank(s):
    """Spaces for every character of `s` except newlines (keeps offsets and lines)."""
    return re.sub(r"[^\n]", " ", s)


def strip_code(src):
    """Blank comments (incl. doc comments), string and char literals.

    Returns (code, strings): code has the same length and line structure as
    src; each string literal becomes `"   "` and its content is kept in
    strings[offset of the literal's first character].
    """
    out = []
    strings = {}
    i = 0
    n = len(src)
    while i < n:
        m = _LEX.search(src, i)
        if not m:
            out.append(src[i:])
            break
        s = m.start()
        out.append(src[i:s])
        tok = m.group(0)
        if tok == "//":
            e = src.find("\n", s)
            e = n if e < 0 else e
            out.append(" " * (e - s))
            i = e
        elif tok == "/*":
            depth = 0
            j = s
            while j < n:
                if src.startswith("/*", j):
                    depth += 1
                    j += 2
                elif src.startswith("*/", j):
                    depth -= 1
                    j += 2
                    if depth == 0:
                        break
                else:
                    j += 1
            out.append(_blank(src[s:j]))
            i = j
        elif tok == "'":
            cm = _CHAR.match(src, s)
            if cm:
                out.append("'" + " " * (cm.end() - s - 2) + "'")
                i = cm.end()
            else:  # a lifetime or a label
                out.append("'")
                i = s + 1
        elif m.group(1) is not None:  # raw string r#"..."#
            end = src.find('"' + m.group(1), m.end())
            e = n if end < 0 else end + 1 + len(m.group(1))
            strings[s] = src[m.end():end if end >= 0 else n]
            lit = _blank(src[s:e])
            out.append('"' + lit[1:-1] + '"' if e - s >= 2 else lit)
            i = e
        else:  # "..." or b"..."
            bm = _STR_BODY.match(src, m.end())
            e = bm.end() if bm else n
            strings[s] = src[m.end():e - 1]
            lit = _blank(src[s:e])
            out.append('"' + lit[1:-1] + '"' if e - s >= 2 else lit)
            i = e
    return "".join(out), strings


# ------------------------------------------------- brace / item utilities

_OPEN = {"{": "}", "(": ")", "[": "]"}
_CLOSE = set("})]")


def match_close(code, i):
    """Index just past the bracket matching the opening bracket at code[i]."""
    depth = 0
    n = len(code)
    j = i
    while j < n:
        c = code[j]
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return n


_ITEM_KW = re.compile(
    r"(?:pub\s*(?:\([^)]*\))?\s*)?(?:mod|fn|use|impl|struct|enum|union|const|static|trait|"
    r"type|extern|unsafe|async|macro_rules|default)\b"
)


def item_end(code, i):
    """End of the item / statement / field starting at code[i]."""
    n = len(code)
    comma_mode = not _ITEM_KW.match(code, i)
    depth = 0
    angle = 0
    j = i
    while j < n:
        c = code[j]
        if c == "{" and depth == 0:
            return match_close(code, j)
        if c in "([":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                return j  # the enclosing block ends: the item is everything before
            depth -= 1
        elif c == ";" and depth == 0:
            return j + 1
        elif comma_mode and depth == 0:
            if c == "<":
                angle += 1
            elif c == ">" and code[j - 1] not in "-=":
                angle = max(0, angle - 1)
            elif c == "," and angle == 0:
                return j + 1
        j += 1
    return n


_CFG = re.compile(r"#\s*(!?)\s*\[\s*cfg\s*\(")
_ATTR = re.compile(r"\s*#\s*\[")
_TEST_MOD_DECL = re.compile(r"\s*(?:pub\s*(?:\([^)]*\))?\s*)?(mod)\s+(?:r#)?\w+\s*;")


def _split_top(s):
    parts, depth, cur = [], 0, []
    for c in s:
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        if c == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def cfg_is_test_only(pred):
    """True for `test` and `all(..., test, ...)` (code that exists only under cargo test)."""
    pred = re.sub(r"\s+", "", pred)
    if pred == "test":
        return True
    if pred.startswith("all(") and pred.endswith(")"):
        return any(cfg_is_test_only(p) for p in _split_top(pred[4:-1]))
    return False


def blank_test_items(code):
    """Blank every `#[cfg(test)]` item; keep test-only `mod NAME;` declarations.

    Returns (code, test_mod_positions, file_is_test_only) where
    test_mod_positions holds the offsets of the `mod` keyword of test-only
    module declarations (their files are left out of the tree).
    """
    buf = list(code)
    test_mods = set()
    skip_to = 0
    for m in _CFG.finditer(code):
        if m.start() < skip_to:
            continue
        bracket = code.index("[", m.start())
        attr_end = match_close(code, bracket)
        pred_open = m.end() - 1
        pred = code[pred_open + 1:match_close(code, pred_open) - 1]
        if not cfg_is_test_only(pred):
            continue
        if m.group(1):  # inner attribute #![cfg(test)]
            if code.count("{", 0, m.start()) == code.count("}", 0, m.start()):
                return _blank(code), set(), True
            continue
        j = attr_end
        while True:  # further attributes of the same item
            a = _ATTR.match(code, j)
            if not a:
                break
            j = match_close(code, a.end() - 1)
        d = _TEST_MOD_DECL.match(code, j)
        if d:
            test_mods.add(d.start(1))
            skip_to = d.end()
            continue
        while j < len(code) and code[j].isspace():
            j += 1
        e = item_end(code, j)
        for k in range(m.start(), e):
            if buf[k] != "\n":
                buf[k] = " "
        skip_to = e
    return "".join(buf), test_mods, False


_PUB_IN = re.compile(r"\bpub\s*\(\s*in\s+[^)]*\)")


class SourceFile:
    """One .rs file, lexed once."""

    def __init__(self, path):
        self.path = path
        with open(path, encoding="utf-8", errors="replace") as f:
            src = f.read()
        code, self.strings = strip_code(src)
        code, self.test_mods, self.test_only = blank_test_items(code)
        # `pub(in crate::a)` names a module only to limit visibility.
        code = _PUB_IN.sub(lambda m: "pub" + " " * (len(m.group(0)) - 3), code)
        self.code = code
        self.line_starts = [0] + [i + 1 for i, c in enumerate(src) if c == "\n"]

    def line_of(self, pos):
        return bisect.bisect_right(self.line_starts, pos)


# ------------------------------------------------------- module tree

_INLINE_MOD = re.compile(r"(?<![\w$#:])mod\s+(?:r#)?(\w+)\s*\{")
_MOD_DECL = re.compile(r"(?<![\w$#:])(mod)\s+(?:r#)?(\w+)\s*;")
_ATTRS_BEFORE = re.compile(r"((?:#\s*\[[^\]]*\]\s*)*)(?:pub\s*(?:\([^)]*\))?\s*)?$")
_PATH_ATTR = re.compile(r"#\s*\[\s*path\s*=\s*")


class Scope:
    """The code of one module that is written in one file (a file or an inline block)."""

    def __init__(self, src, filemod, modpath, start, text):
        self.src = src
        self.filemod = filemod  # the module the file itself is
        self.modpath = modpath  # the module this code is in (deeper for inline blocks)
        self.start = start  # offset of text in src.code
        self.text = text  # src.code[start:end] with nested inline modules blanked


class ModuleTree:
    """The modules of one crate root (lib, main or a bin)."""

    def __init__(self, crate, root_file):
        self.crate = crate
        self.root_file = root_file
        self.modules = {}  # modpath tuple -> file path
        self.scopes = []
        self.problems = []
        self._open = set()  # files being added (a #[path] loop must not recurse forever)
        self._add_file(root_file, (), os.path.dirname(root_file))

    def _add_file(self, path, modpath, child_dir):
        src = self.crate.source(path)
        if src is None or path in self._open:
            return
        self.modules[modpath] = path
        if src.test_only:
            return
        self._open.add(path)
        self._add_region(src, modpath, 0, len(src.code), modpath, child_dir, os.path.dirname(path))
        self._open.discard(path)

    def _add_region(self, src, filemod, start, end, modpath, child_dir, path_attr_dir):
        code = src.code
        text = code[start:end]
        inline = []
        pos = 0
        while True:
            m = _INLINE_MOD.search(text, pos)
            if not m:
                break
            open_ = m.end() - 1
            close = match_close(text, open_)
            inline.append((m.group(1), start + open_ + 1, start + close - 1))
            text = text[:open_ + 1] + _blank(text[open_ + 1:close - 1]) + text[close - 1:]
            pos = close
        self.scopes.append(Scope(src, filemod, modpath, start, text))
        for name, s, e in inline:
            sub = os.path.join(child_dir, name)
            self.modules[modpath + (name,)] = src.path
            self._add_region(src, filemod, s, e, modpath + (name,), sub, sub)
        for m in _MOD_DECL.finditer(text):
            name = m.group(2)
            if start + m.start(1) in src.test_mods:
                continue
            am = _ATTRS_BEFORE.search(text, max(0, m.start() - 4000), m.start())
            target = None
            pa = _PATH_ATTR.search(am.group(1))
            if pa:
                lit = src.strings.get(start + am.start(1) + pa.end())
                if lit is not None:
                    target = os.path.normpath(os.path.join(path_attr_dir, lit))
                    sub = os.path.dirname(target)  # a #[path] file owns its directory
            if target is None:
                flat = os.path.join(child_dir, name + ".rs")
                nested = os.path.join(child_dir, name, "mod.rs")
                if os.path.isfile(flat):
                    target, sub = flat, os.path.join(child_dir, name)
                elif os.path.isfile(nested):
                    target, sub = nested, os.path.join(child_dir, name)
                else:
                    self.problems.append(
                        f"{self.crate.rel(src.path)}:{src.line_of(start + m.start())}: "
                        f"mod {name}; has no file ({self.crate.rel(flat)} or "
                        f"{self.crate.rel(nested)})")
                    continue
            if not self.crate.owns(target):
                continue  # outside src/: not this check's business
            self._add_file(target, modpath + (name,), sub)


# ------------------------------------------------------------- edges

_USE = re.compile(r"(?<![\w$#:.])use\s")
_USE_TOKEN = re.compile(r"\s*(::|\{|\}|,|\*|\$?(?:r#)?\w+)")
_PATH = re.compile(
    r"(?<![\w$:.'])(\$crate|(?:r#)?[A-Za-z_]\w*)((?:\s*::\s*(?:r#)?[A-Za-z_]\w*)+)")
_PUB_BEFORE = re.compile(r"\bpub\s*(?:\([^)]*\))?\s*$")
_ID = re.compile(r"(?:r#)?(\w+)")


def parse_use_tree(text):
    """Leaves of a use tree: (segments, local name or None for globs, is_glob)."""
    toks = [t for t in _USE_TOKEN.findall(text)]
    leaves = []
    pos = 0

    def tree(prefix):
        nonlocal pos
        segs = list(prefix)
        if pos < len(toks) and toks[pos] == "::":
            segs.append("::")
            pos += 1
        while pos < len(toks):
            t = toks[pos]
            if t == "{":
                pos += 1
                while pos < len(toks) and toks[pos] != "}":
                    if toks[pos] == ",":
                        pos += 1
                        continue
                    tree(segs)
                pos += 1
                return
            if t == "*":
                pos += 1
                leaves.append((segs, None, True))
                return
            if t in (",", "}", "::"):
                return
            segs.append(t[2:] if t.startswith("r#") else t)
            pos += 1
            if pos < len(toks) and toks[pos] == "::":
                pos += 1
                continue
            local = segs[-1] if segs[-1] != "self" else (segs[-2] if len(segs) > 1 else None)
            if pos < len(toks) and toks[pos] == "as":
                local = toks[pos + 1] if pos + 1 < len(toks) else None
                pos += 2
            leaves.append((segs, local, False))
            return

    while pos < len(toks):
        before = pos
        tree([])
        if pos == before:
            pos += 1
    return leaves


def below(mod, ancestor):
    """Whether module path `mod` is strictly inside module path `ancestor`."""
    return len(mod) > len(ancestor) and mod[:len(ancestor)] == ancestor


class Edge:
    def __init__(self):
        self.names = []
        self.lines = []

    def add(self, name, line):
        if name not in self.names:
            self.names.append(name)
        if line not in self.lines:
            self.lines.append(line)


class Crate:
    def __init__(self, root, directory, strict=False):
        self.strict = strict
        self.dir = directory
        self.src_dir = os.path.join(directory, "src")
        self.display = os.path.relpath(directory, root)
        self._sources = {}
        try:
            with open(os.path.join(directory, "Cargo.toml"), encoding="utf-8") as f:
                toml = f.read()
        except OSError:
            toml = ""
        self.name = crate_name(directory, toml)
        self.roots = self._roots(toml)
        self.trees = [ModuleTree(self, r) for r in self.roots]
        self.files = sorted({f for t in self.trees for f in t.modules.values()})
        self.edges = {}  # (from, to) -> Edge
        for t in self.trees:
            self._edges_of(t)

    def _roots(self, toml):
        roots = []
        for name in ("lib.rs", "main.rs"):
            roots.append(os.path.join(self.src_dir, name))
        bins = os.path.join(self.src_dir, "bin")
        if os.path.isdir(bins):
            for e in sorted(os.listdir(bins)):
                p = os.path.join(bins, e)
                roots.append(os.path.join(p, "main.rs") if os.path.isdir(p) else p)
        for section in re.finditer(r"^\[\[?(?:lib|bin)\]\]?([^\[]*)", toml, re.M):
            p = re.search(r"^path\s*=\s*\"([^\"]+)\"", section.group(1), re.M)
            if p:
                roots.append(os.path.normpath(os.path.join(self.dir, p.group(1))))
        seen, out = set(), []
        for r in roots:
            if r.endswith(".rs") and os.path.isfile(r) and self.owns(r) and r not in seen:
                seen.add(r)
                out.append(r)
        return out

    def owns(self, path):
        return os.path.abspath(path).startswith(os.path.abspath(self.src_dir) + os.sep)

    def rel(self, path):
        if self.owns(path):
            return os.path.relpath(path, self.src_dir).replace(os.sep, "/")
        return os.path.relpath(path, self.dir).replace(os.sep, "/")

    def source(self, path):
        if path not in self._sources:
            try:
                self._sources[path] = SourceFile(path)
            except OSError:
                self._sources[path] = None
        return self._sources[path]

    def _edges_of(self, tree):
        modules = tree.modules
        states = [_ScopeState(sc) for sc in tree.scopes]
        by_mod = {}
        for st in states:
            by_mod.setdefault(st.sc.modpath, st)
        used = set()  # (id of a scope state, local name) of imported modules named in paths

        def base_of(st, first):
            here = st.sc.modpath
            if first in ("crate", "$crate"):
                return ()
            if first == "self":
                return here
            if first == "super":
                return here[:-1] if here else None
            if first in st.aliases:
                used.add((id(st), first))
                return st.aliases[first]
            if here + (first,) in modules:
                return here + (first,)
            for g in st.globs:  # `use super::*;` and the like bring names too
                gs = by_mod.get(g)
                if gs is not None and first in gs.aliases:
                    used.add((id(gs), first))
                    return gs.aliases[first]
                if g + (first,) in modules:
                    return g + (first,)
            return None

        def resolve(st, segs):
            """(deepest module, the segments after it), or None for a path outside the crate."""
            if not segs or segs[0] == "::":
                return None
            base = base_of(st, segs[0])
            if base is None:
                return None
            i = 1
            while i < len(segs) and segs[i] == "super":
                if not base:
                    return None
                base = base[:-1]
                i += 1
            if i < len(segs) and segs[i] == "self":
                i += 1
            while i < len(segs) and base + (segs[i],) in modules:
                base = base + (segs[i],)
                i += 1
            return base, segs[i:]

        def edge(st, target_mod, name, pos):
            sc = st.sc
            to = modules[target_mod]
            if to == sc.src.path:
                return
            if not self.strict and below(target_mod, sc.filemod):
                return  # a module's reference to its own submodule: the tree's direction
            self.edges.setdefault((sc.src.path, to), Edge()).add(
                name, sc.src.line_of(sc.start + pos))

        # The names that use declarations bring (a use path may start at another's name).
        for _round in range(4):
            changed = False
            for st in states:
                for _, (segs, local, glob), _ in st.leaves:
                    r = resolve(st, segs)
                    if not r or r[1]:
                        continue  # outside the crate, or an item
                    if glob and r[0] not in st.globs:
                        st.globs.append(r[0])
                        changed = True
                    elif not glob and local is not None and st.aliases.get(local) != r[0]:
                        st.aliases[local] = r[0]  # a module imported by name
                        changed = True
            if not changed:
                break
        used.clear()

        module_imports = []
        for st in states:
            sc = st.sc
            for pos, (segs, local, glob), pub in st.leaves:
                r = resolve(st, segs)
                if r is None:
                    continue
                mod, rest = r
                if pub and below(mod, sc.filemod):
                    continue  # a façade re-export of a submodule's item, even with --strict
                if glob:
                    edge(st, mod, (mod[-1] if mod else "crate") + "::*", pos)
                elif rest:
                    edge(st, mod, rest[0], pos)
                elif local is not None:
                    module_imports.append((st, local, mod, pos))
            for m in _PATH.finditer(st.text):
                segs = [m.group(1)[2:] if m.group(1).startswith("r#") else m.group(1)]
                segs += [_ID.match(x.strip()).group(1) for x in m.group(2).split("::")[1:]]
                r = resolve(st, segs)
                if r is None:
                    continue
                mod, rest = r
                edge(st, mod, rest[0] if rest else (mod[-1] if mod else "crate"), m.start())
        # A module imported by name and never named at a path's start (a `pub use` of a
        # module, say) still ties the file to that module.
        for st, local, mod, pos in module_imports:
            if (id(st), local) not in used:
                edge(st, mod, mod[-1] if mod else "crate", pos)


class _ScopeState:
    """The use declarations of a scope, and the code without them."""

    def __init__(self, sc):
        self.sc = sc
        self.aliases = {}  # local name -> modpath of a module imported by name
        self.globs = []  # modpaths imported with `::*`
        self.leaves = []  # (offset, (segments, local name, is_glob), is_pub)
        text = sc.text
        spans = []
        for m in _USE.finditer(text):
            end = text.find(";", m.end())
            end = len(text) if end < 0 else end
            pub = bool(_PUB_BEFORE.search(text, max(0, m.start() - 40), m.start()))
            for segs, local, glob in parse_use_tree(text[m.end():end]):
                if segs and segs[-1] == "self":
                    segs = segs[:-1]
                self.leaves.append((m.start(), (segs, local, glob), pub))
            spans.append((m.start(), end))
        if spans:
            buf = list(text)
            for s, e in spans:
                for k in range(s, e):
                    if buf[k] != "\n":
                        buf[k] = " "
            text = "".join(buf)
        self.text = text


# ------------------------------------------------------------- graph

def strongly_connected(nodes, succ):
    """Tarjan's algorithm, iterative. Returns the components (lists of nodes)."""
    index = {}
    low = {}
    on_stack = set()
    stack = []
    comps = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(succ.get(root, ())))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(succ.get(w, ()))))
                    advanced = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                comps.append(comp)
    return comps


def crate_name(directory, toml=None):
    """The package name of Cargo.toml, else the directory's name."""
    if toml is None:
        try:
            with open(os.path.join(directory, "Cargo.toml"), encoding="utf-8") as f:
                toml = f.read()
        except OSError:
            toml = ""
    m = re.search(r"^\[package\][^\[]*?^name\s*=\s*\"([^\"]+)\"", toml, re.M | re.S)
    return m.group(1) if m else os.path.basename(directory)


def find_crates(root):
    dirs = []
    crates_dir = os.path.join(root, "crates")
    if os.path.isdir(crates_dir):
        dirs += [os.path.join(crates_dir, d) for d in sorted(os.listdir(crates_dir))]
    dirs.append(os.path.join(root, "fuzz"))
    return [d for d in dirs
            if os.path.isfile(os.path.join(d, "Cargo.toml")) and os.path.isdir(os.path.join(d, "src"))]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="workspace root (default: the repository of this script)")
    ap.add_argument("--crate", help="only this crate (package or directory name)")
    ap.add_argument("--verbose", "-v", action="store_true", help="print every edge")
    ap.add_argument("--strict", action="store_true",
                    help="also count a module's references to its own submodules")
    args = ap.parse_args(argv)

    root = os.path.abspath(args.root)
    dirs = find_crates(root)
    if args.crate:
        dirs = [d for d in dirs if os.path.basename(d) == args.crate]
        dirs = dirs or [d for d in find_crates(root) if crate_name(d) == args.crate]
        if not dirs:
            print(f"check_circles: no crate named {args.crate} under {root}", file=sys.stderr)
            return 2
    if not dirs:
        print(f"check_circles: no crates under {root}", file=sys.stderr)
        return 2

    n_files = 0
    circles = []  # (crate, component)
    for d in dirs:
        crate = Crate(root, d, strict=args.strict)
        n_files += len(crate.files)
        for t in crate.trees:
            for p in t.problems:
                print(f"check_circles: warning: {crate.display}/src/{p}", file=sys.stderr)
        succ = {}
        for (a, b) in crate.edges:
            succ.setdefault(a, []).append(b)
        for v in succ.values():
            v.sort()
        if args.verbose:
            print(f"{crate.name} ({crate.display}): {len(crate.files)} files, "
                  f"{len(crate.edges)} edges")
            for (a, b), e in sorted(crate.edges.items()):
                print(f"  {crate.rel(a)} -> {crate.rel(b)}: {', '.join(e.names)}"
                      f"  (line {', '.join(map(str, e.lines))})")
            on_disk = set()
            for dp, _, fs in os.walk(crate.src_dir):
                on_disk |= {os.path.join(dp, f) for f in fs if f.endswith(".rs")}
            for f in sorted(on_disk - set(crate.files)):
                print(f"  (not in the module tree: {crate.rel(f)})")
        for comp in strongly_connected(crate.files, succ):
            if len(comp) > 1:
                circles.append((crate, sorted(comp)))

    if not circles:
        print(f"no import circles: {n_files} files in {len(dirs)} crates")
        return 0
    for k, (crate, comp) in enumerate(circles, 1):
        print(f"circle {k} in {crate.name} ({crate.display}/src): "
              f"{', '.join(crate.rel(f) for f in comp)}")
        inside = set(comp)
        for (a, b), e in sorted(crate.edges.items()):
            if a in inside and b in inside:
                print(f"  {crate.rel(a)} -> {crate.rel(b)}: {', '.join(e.names)}"
                      f"  (line {', '.join(map(str, e.lines))})")
    crates_hit = len({c.dir for c, _ in circles})
    print(f"{len(circles)} import circle(s) in {crates_hit} crate(s) "
          f"({n_files} files in {len(dirs)} crates checked)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
