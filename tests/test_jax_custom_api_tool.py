"""tools/jax_custom_api.py, which runs JAX's tests of its decorators with
hijax's: its substitution, and its list of the tests hijax deliberately does
not pass, which must be the list the porting page gives (by name). Running
JAX's tests needs a checkout of JAX and is not part of these tests."""
import re

from tools_loader import ROOT, load_tool


def _tool():
  return load_tool("jax_custom_api")


def test_substitution_replaces_the_decorators_only():
  tool = _tool()
  source = ("import jax\nfrom jax._src import hijax\n"
            "f = jax.custom_vjp(g)\n@jax.custom_jvp\ndef h(x): ...\n"
            "z = jax.custom_derivatives.SymbolicZero\n"
            "y = my.jax.custom_vjp\n")
  new, n = tool.substitute(source)
  assert n == 2
  assert f"import hijax as {tool.ALIAS}\nimport jax\n" in new
  assert f"f = {tool.ALIAS}.custom_vjp(g)" in new
  assert f"@{tool.ALIAS}.custom_jvp" in new
  assert "jax.custom_derivatives.SymbolicZero" in new
  assert "my.jax.custom_vjp" in new


def test_the_deliberate_tests_are_those_the_porting_page_lists():
  page = (ROOT / "docs" / "porting-custom-vjp.md").read_text()
  section = page[page.index("## JAX's own tests that hijax does not pass"):]
  table = [line for line in section.splitlines() if line.startswith("| `")]
  listed = {name for line in table
            for name in re.findall(r"`((?:\w+\.)?test_\w+)`",
                                   line.split(" | ")[0])}
  # (the page names a class of a pair once; the tool names its Remat3 twin)
  twins = {n.replace("3Test.", "3Remat3Test.") for n in listed if "." in n}
  assert set(_tool().DELIBERATE) == listed | twins


def test_the_deliberate_reason_is_found_by_method_or_class():
  tool = _tool()
  assert tool.deliberate_reason("CustomVJPTest.test_jvp_error")
  assert tool.deliberate_reason("CustomJVP3Test.test_hard_stuff2")
  assert not tool.deliberate_reason("CustomJVPTest.test_hard_stuff2")
  assert not tool.deliberate_reason("CustomVJPTest.test_basic")
