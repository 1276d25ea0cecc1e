#!/usr/bin/env python3
"""Self-test of scripts/check_circles.py: tiny fake crates in a temporary directory.

Usage:  python3 scripts/test_check_circles.py [-v]
"""
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "check_circles.py")
sys.dont_write_bytecode = True  # leave no __pycache__ in scripts/
sys.path.insert(0, HERE)
import check_circles  # noqa: E402


def make_workspace(root, crates):
    """crates: {crate dir name: {path under the crate: source}}."""
    for name, files in crates.items():
        d = os.path.join(root, "crates", name)
        os.makedirs(os.path.join(d, "src"), exist_ok=True)
        with open(os.path.join(d, "Cargo.toml"), "w") as f:
            f.write(f'[package]\nname = "{name}"\nversion = "0.1.0"\nedition = "2021"\n')
        for rel, text in files.items():
            p = os.path.join(d, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as f:
                f.write(textwrap.dedent(text).lstrip("\n"))


class CheckCircles(unittest.TestCase):
    def run_on(self, crates, *args):
        with tempfile.TemporaryDirectory() as root:
            make_workspace(root, crates)
            p = subprocess.run([sys.executable, SCRIPT, "--root", root, *args],
                               capture_output=True, text=True, timeout=60)
        return p.returncode, p.stdout, p.stderr

    def assert_circle(self, crates, files, edges=(), args=()):
        rc, out, err = self.run_on(crates, *args)
        self.assertEqual(rc, 1, f"expected a circle\n{out}{err}")
        header = [l for l in out.splitlines() if l.startswith("circle ")]
        self.assertEqual(len(header), 1, out)
        self.assertTrue(header[0].endswith(": " + ", ".join(sorted(files))), out)
        for e in edges:
            self.assertIn(e, out)
        return out

    def assert_clean(self, crates, args=()):
        rc, out, err = self.run_on(crates, *args)
        self.assertEqual(rc, 0, f"expected no circle\n{out}{err}")
        self.assertTrue(out.startswith("no import circles: "), out)
        self.assertEqual(len(out.strip().splitlines()), 1, out)
        return out

    # (a)
    def test_use_crate_two_files(self):
        self.assert_circle({"k": {
            "src/lib.rs": "pub mod a;\nmod b;\n",
            "src/a.rs": "use crate::b::B;\npub struct A(B);\n",
            "src/b.rs": "pub(crate) use crate::a::A as Alpha;\npub struct B;\n",
        }}, ["a.rs", "b.rs"], ["a.rs -> b.rs: B", "b.rs -> a.rs: A"])

    # (b)
    def test_inline_path(self):
        self.assert_circle({"k": {
            "src/lib.rs": "mod a;\nmod b;\n",
            "src/a.rs": "pub fn f() {}\npub fn g() -> u32 { crate::b::h() }\n",
            "src/b.rs": "pub fn h() -> u32 {\n    crate :: a :: f();\n    1\n}\n",
        }}, ["a.rs", "b.rs"], ["a.rs -> b.rs: h", "b.rs -> a.rs: f"])

    # (c)
    def test_super_from_child_to_parent_mod_rs(self):
        crates = {"k": {
            "src/lib.rs": "mod a;\nmod b;\n",
            "src/a/mod.rs": "mod child;\npub struct A;\npub fn go() { crate::b::g() }\n",
            "src/a/child.rs": "use super::A;\npub fn c() -> A { A }\n",
            "src/b.rs": "pub fn g() { crate::a::child::c(); }\n",
        }}
        self.assert_circle(crates, ["a/child.rs", "a/mod.rs", "b.rs"],
                           ["a/child.rs -> a/mod.rs: A", "a/mod.rs -> b.rs: g",
                            "b.rs -> a/child.rs: c"])
        # super::super from a grandchild, and super:: in a path in code
        crates = {"k": {
            "src/lib.rs": "mod a;\nmod b;\n",
            "src/a/mod.rs": "mod x;\npub struct A;\npub fn go() { crate::b::g() }\n",
            "src/a/x/mod.rs": "mod y;\n",
            "src/a/x/y.rs": "pub fn c() -> super::super::A { super::super::A }\n",
            "src/b.rs": "pub fn g() { crate::a::x::y::c(); }\n",
        }}
        self.assert_circle(crates, ["a/mod.rs", "a/x/y.rs", "b.rs"],
                           ["a/x/y.rs -> a/mod.rs: A"])

    def test_parent_and_child_alone_only_with_strict(self):
        crates = {"k": {
            "src/lib.rs": "mod a;\n",
            "src/a/mod.rs": "mod child;\npub struct A;\npub fn go() { child::c(); self::child::c(); }\n",
            "src/a/child.rs": "use super::A;\npub fn c() -> A { A }\n",
        }}
        self.assert_clean(crates)
        self.assert_circle(crates, ["a/child.rs", "a/mod.rs"],
                           ["a/mod.rs -> a/child.rs: c"], args=["--strict"])

    def test_facade_reexport_is_not_a_circle(self):
        # lib.rs re-exports, the modules use crate::Name: the usual layout, even with --strict.
        crates = {"k": {
            "src/lib.rs": "mod a;\nmod b;\npub use a::A;\npub use self::b::B;\n",
            "src/a.rs": "pub struct A(crate::B);\n",
            "src/b.rs": "use crate::A;\npub struct B;\n",
        }}
        self.assert_clean(crates)
        self.assert_clean(crates, args=["--strict"])

    def test_item_reexported_by_a_mod_rs_counts_for_the_mod_rs(self):
        self.assert_circle({"k": {
            "src/lib.rs": "mod m;\nmod user;\n",
            "src/m/mod.rs": "mod inner;\npub use inner::Thing;\npub fn f() { crate::user::u() }\n",
            "src/m/inner.rs": "pub struct Thing;\n",
            "src/user.rs": "use crate::m::Thing;\npub fn u() {}\n",
        }}, ["m/mod.rs", "user.rs"], ["user.rs -> m/mod.rs: Thing"])

    # (d)
    def test_nested_brace_groups(self):
        self.assert_circle({"k": {
            "src/lib.rs": "mod a;\nmod d;\nmod x;\n",
            "src/x.rs": "use crate::{a::{B, C}, d};\npub struct X;\npub fn f(_: d::E) {}\n",
            "src/a.rs": "pub struct B;\npub struct C;\nuse crate::x::X;\n",
            "src/d.rs": "pub struct E;\n",
        }}, ["a.rs", "x.rs"], ["x.rs -> a.rs: B, C", "a.rs -> x.rs: X"])
        # the module imported by name in the group, used as d::E, is an edge to d.rs
        self.assert_circle({"k": {
            "src/lib.rs": "mod a;\nmod d;\nmod x;\n",
            "src/x.rs": "pub use crate::{a::{self, B}, d as dd};\npub fn f(_: dd::E) {}\n",
            "src/a.rs": "pub struct B;\n",
            "src/d.rs": "pub struct E;\npub fn g() { crate::x::f(E) }\n",
        }}, ["d.rs", "x.rs"], ["x.rs -> d.rs: E", "d.rs -> x.rs: f"])

    # (e)
    def test_cfg_test_module_does_not_count(self):
        self.assert_clean({"k": {
            "src/lib.rs": "mod a;\nmod b;\n",
            "src/a.rs": "use crate::b::B;\npub struct A;\n",
            "src/b.rs": """
                pub struct B;

                #[cfg(test)]
                #[allow(clippy::all)]
                mod tests {
                    use crate::a::A;
                    #[test]
                    fn t() {
                        let _ = "}";
                        let _ = '}';
                        let _ = A;
                    }
                }

                #[cfg(all(test, feature = "x"))]
                mod more;

                #[cfg(test)]
                fn helper() -> crate::a::A { crate::a::A }

                pub fn after() -> B { B }
                """,
            "src/b/more.rs": "use crate::a::A;\n",
        }})
        # ... while the same edge outside the tests module does count
        self.assert_circle({"k": {
            "src/lib.rs": "mod a;\nmod b;\n",
            "src/a.rs": "use crate::b::B;\npub struct A;\n",
            "src/b.rs": """
                pub struct B;
                #[cfg(test)]
                mod tests { fn t() { let _ = "}"; } }
                #[cfg(not(test))]
                pub fn f() -> crate::a::A { crate::a::A }
                """,
        }}, ["a.rs", "b.rs"], ["b.rs -> a.rs: A"])

    # (f)
    def test_strings_and_comments_do_not_count(self):
        self.assert_clean({"k": {
            "src/lib.rs": "mod a;\nmod b;\n",
            "src/a.rs": "use crate::b::B;\npub fn f() {}\n",
            "src/b.rs": '''
                //! See [`crate::a::f`] for the other half.
                // use crate::a::f;
                /* crate::a::f() /* nested */ crate::a::f() */
                /// Calls nothing like `crate::a::f()`.
                pub struct B;
                pub fn s() -> (&'static str, &'static str, &'static [u8], char) {
                    let _q = "use crate::a::f; \\" crate::a::f()";
                    (r#"crate::a::f() "quoted" { "#, "mod x { crate::a::f() }", br"crate::a::f", '"')
                }
                #[doc = "crate::a::f"]
                pub fn t<'a>(x: &'a str) -> &'a str { x }
                ''',
        }})

    # (g)
    def test_dag_exits_zero(self):
        out = self.assert_clean({"k": {
            "src/lib.rs": "mod a;\nmod b;\nmod c;\npub use c::C;\n",
            "src/a.rs": "use crate::b::B;\nuse crate::c::C;\npub struct A(B, C);\n",
            "src/b.rs": "use crate::c::C;\npub struct B(C);\n",
            "src/c.rs": "pub struct C;\n",
        }, "other": {
            "src/main.rs": "mod x;\nfn main() { x::run() }\n",
            "src/x.rs": "pub fn run() {}\n",
        }})
        self.assertEqual(out.strip(), "no import circles: 6 files in 2 crates")

    # (h)
    def test_layouts_and_the_2018_rule(self):
        crates = {"k": {
            "src/lib.rs": "mod m;\nmod n;\n#[path = \"elsewhere/p_file.rs\"]\nmod p;\n",
            "src/m/mod.rs": "pub mod deep;\n",
            "src/m/deep.rs": "pub struct D;\nimpl D { pub fn i() -> crate::n::inner::I { todo!() } }\n",
            "src/n.rs": "pub mod inner;\n",
            "src/n/inner.rs": "pub struct I;\npub fn d() { let _ = crate::m::deep::D::i(); }\n",
            # decoys: where `mod inner;` of n.rs does NOT live
            "src/inner.rs": "pub fn never() { crate::p::q(); }\n",
            "src/m/inner.rs": "pub fn never() { crate::p::q(); }\n",
            "src/elsewhere/p_file.rs": "pub fn q() {}\n",
        }}
        self.assert_circle(crates, ["m/deep.rs", "n/inner.rs"],
                           ["m/deep.rs -> n/inner.rs: I", "n/inner.rs -> m/deep.rs: D"])
        rc, out, _ = self.run_on(crates, "--verbose")
        self.assertIn("(not in the module tree: inner.rs)", out)
        self.assertIn("(not in the module tree: m/inner.rs)", out)
        self.assertNotIn("(not in the module tree: elsewhere/p_file.rs)", out)

    def test_deepest_module_and_inline_modules(self):
        # crate::policy::saap::cells::Cell -> cells.rs when it exists, else saap.rs
        out = self.assert_circle({"k": {
            "src/lib.rs": "mod policy;\nmod user;\n",
            "src/policy/mod.rs": "pub mod saap;\n",
            "src/policy/saap.rs": """
                pub mod cells;
                pub mod inline {
                    pub struct Here;
                    pub fn back() { crate::user::u() }
                }
                """,
            "src/policy/saap/cells.rs": "pub struct Cell;\n",
            "src/user.rs": """
                pub fn u() {
                    let _ = crate::policy::saap::cells::Cell;
                    let _ = crate::policy::saap::inline::Here;
                }
                """,
        }}, ["policy/saap.rs", "user.rs"], ["user.rs -> policy/saap.rs: Here"])
        self.assertIn("user.rs -> policy/saap/cells.rs: Cell", self.run_on({"k": {
            "src/lib.rs": "mod policy;\nmod user;\n",
            "src/policy/mod.rs": "pub mod saap;\n",
            "src/policy/saap.rs": "pub mod cells;\n",
            "src/policy/saap/cells.rs": "pub struct Cell;\n",
            "src/user.rs": "use crate::policy::saap::cells::Cell;\n",
        }}, "--verbose")[1])

    def test_three_file_circle_and_crate_filter(self):
        crates = {"k": {
            "src/lib.rs": "mod a;\nmod b;\nmod c;\n",
            "src/a.rs": "use crate::b::B;\npub struct A;\n",
            "src/b.rs": "use super::c::C;\npub struct B;\n",
            "src/c.rs": "use crate::a::*;\npub struct C;\n",
        }, "clean": {
            "src/lib.rs": "mod a;\n",
            "src/a.rs": "pub struct A;\n",
        }}
        self.assert_circle(crates, ["a.rs", "b.rs", "c.rs"], ["c.rs -> a.rs: a::*"])
        out = self.assert_clean(crates, args=["--crate", "clean"])
        self.assertEqual(out.strip(), "no import circles: 2 files in 1 crates")
        rc, _, _ = self.run_on(crates, "--crate", "nope")
        self.assertEqual(rc, 2)


class Lexing(unittest.TestCase):
    def test_strip_keeps_offsets(self):
        src = 'a // x\nb /* y */ "s{" r#"t"}"# \'{\' c\n'
        code, strings = check_circles.strip_code(src)
        self.assertEqual(len(code), len(src))
        self.assertEqual(code.count("\n"), src.count("\n"))
        self.assertNotIn("{", code)
        self.assertNotIn("}", code)
        self.assertIn("s{", strings.values())
        self.assertIn('t"}', strings.values())

    def test_cfg_predicates(self):
        self.assertTrue(check_circles.cfg_is_test_only("test"))
        self.assertTrue(check_circles.cfg_is_test_only("all(test, feature = x)"))
        self.assertFalse(check_circles.cfg_is_test_only("any(test, feature = x)"))
        self.assertFalse(check_circles.cfg_is_test_only("not(test)"))


if __name__ == "__main__":
    unittest.main()
