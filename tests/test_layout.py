"""The shape of the package: imports point one way, and modules stay small.

Reads the sources with `ast` (no JAX import): every ``import hijax...`` and
``from hijax... import``, at the top of a module or inside a function, and
every relative import, is an edge of the import graph of ``hijax/``. A cycle
would mean some module imports a module that imports it back, which a
function-level import can hide at run time but not from this graph.

JAX's internals (``jax._src``) are imported only by ``hijax/_internals/``, one
module per JAX module adapted, each naming in its docstring every internal it
takes and why no public API serves.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "hijax"
MAX_LINES = 500
INTERNALS = "hijax._internals"


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, pathlib.Path]:
  return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
  """The absolute module name a ``from ... import`` names."""
  if not node.level:
    return node.module or ""
  base = importer.split(".")
  base = base if is_package else base[:-1]
  base = base[:len(base) - (node.level - 1)]
  return ".".join(base + ([node.module] if node.module else []))


def _imports(name: str, path: pathlib.Path, modules) -> set[str]:
  """The hijax modules that module ``name`` imports, anywhere in its source."""
  found = set()
  tree = ast.parse(path.read_text(), str(path))
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      targets = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = _resolve(name, path.name == "__init__.py", node)
      submodules = [f"{base}.{alias.name}" for alias in node.names]
      # `from hijax import autodiff` imports a submodule (the package's
      # __init__ runs anyway, and is not a choice of this module); `from hijax
      # import HiPrim` takes a name from the package's __init__ itself.
      targets = ([t for t in submodules if t in modules]
                 + ([base] if any(t not in modules for t in submodules) else []))
    else:
      continue
    for target in targets:
      while target and target not in modules:
        target = target.rpartition(".")[0]  # `import hijax.a.b` runs hijax.a
      if target and target != name:
        found.add(target)
  return found


def import_graph() -> dict[str, set[str]]:
  """Module -> the hijax modules it imports.

  ``import hijax.x`` also runs ``hijax/__init__.py`` first, which imports
  every submodule: that is the package's doing, not an edge of ``hijax.x``.
  """
  modules = _modules()
  return {name: _imports(name, path, modules) for name, path in modules.items()}


def _find_cycle(graph) -> list[str] | None:
  state = {}  # 1: on the current path, 2: done

  def visit(node, path):
    state[node] = 1
    for nxt in sorted(graph[node]):
      if state.get(nxt) == 1:
        return path + [node, nxt]
      if nxt not in state:
        cycle = visit(nxt, path + [node])
        if cycle:
          return cycle
    state[node] = 2
    return None

  for node in sorted(graph):
    if node not in state:
      cycle = visit(node, [])
      if cycle:
        return cycle[cycle.index(cycle[-1]):]
  return None


def test_the_graph_is_read():
  graph = import_graph()
  assert "hijax.primitive" in graph["hijax.autodiff"]
  assert "hijax._core_rules" in graph["hijax.primitive"]
  assert "hijax.testing._report" in graph["hijax.testing._api"]
  assert "hijax._internals.ad" in graph["hijax.autodiff"]
  # a relative import is resolved like an absolute one
  tree = ast.parse("from ._x import f\nfrom . import y\nfrom .. import z")
  assert [_resolve("hijax.pkg.mod", False, n) for n in tree.body] == [
      "hijax.pkg._x", "hijax.pkg", "hijax"]
  assert _resolve("hijax.pkg", True, tree.body[0]) == "hijax.pkg._x"
  # a name taken from a package's __init__ is an edge to the package
  modules = {"hijax": None, "hijax.a": None}
  assert _imports_of("from hijax import a", modules) == {"hijax.a"}
  assert _imports_of("from hijax import HiPrim", modules) == {"hijax"}
  assert _imports_of("def f():\n  import hijax.a.b", modules) == {"hijax.a"}


def _imports_of(source, modules):
  return _imports("hijax.mod", _Source(source), modules)


class _Source:
  """Stands in for a path: `_imports` reads ``.name`` and ``read_text()``."""
  name = "mod.py"

  def __init__(self, text):
    self.text = text

  def read_text(self):
    return self.text

  def __str__(self):
    return "<test>"


def test_a_cycle_is_found():
  assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_imports_are_acyclic():
  cycle = _find_cycle(import_graph())
  assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_primitive_imports_no_rule_module():
  rule_modules = {"hijax.autodiff", "hijax.batching", "hijax.derived",
                  "hijax.remat", "hijax.hitypes", "hijax.testing",
                  "hijax.implicit"}
  assert not import_graph()["hijax.primitive"] & rule_modules


@pytest.mark.parametrize("name", sorted(_modules()))
def test_module_size(name):
  lines = len(_modules()[name].read_text().splitlines())
  assert lines <= MAX_LINES, (
      f"{name} has {lines} lines (more than {MAX_LINES}): split it by concern")


def _jax_src_imports(tree: ast.AST) -> list[tuple[int, str]]:
  """(line, what) for each import of ``jax._src`` in a module's syntax tree."""
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found += [(node.lineno, a.name) for a in node.names
                if a.name == "jax._src" or a.name.startswith("jax._src.")]
    elif isinstance(node, ast.ImportFrom) and not node.level:
      module = node.module or ""
      if module == "jax._src" or module.startswith("jax._src."):
        found.append((node.lineno, module))
      elif module == "jax" and any(a.name == "_src" for a in node.names):
        found.append((node.lineno, "jax._src"))
  return found


def test_jax_src_imports_are_found():
  source = ("import jax._src.core\nfrom jax._src import core\n"
            "from jax import _src\nfrom jax import core\nimport jax.core\n"
            "def f():\n  from jax._src.interpreters import ad\n")
  assert [line for line, _ in _jax_src_imports(ast.parse(source))] == [
      1, 2, 3, 7]


def test_only_the_internals_door_imports_jax_src():
  offenders = [
      f"{name} line {line}: {what}"
      for name, path in _modules().items()
      if name != INTERNALS and not name.startswith(INTERNALS + ".")
      for line, what in _jax_src_imports(ast.parse(path.read_text()))]
  assert not offenders, (
      "import JAX internals through hijax._internals (add the name there, "
      "with why no public API serves): " + "; ".join(offenders))


def _adapters() -> dict[str, pathlib.Path]:
  return {name: path for name, path in _modules().items()
          if name.startswith(INTERNALS + ".")}


def test_the_internals_door_imports_no_hijax_module():
  graph = import_graph()
  assert _adapters()
  for name in _adapters():
    assert not graph[name], f"{name} imports {sorted(graph[name])}"


@pytest.mark.parametrize("name", sorted(_adapters()))
def test_each_internal_is_named_with_why(name):
  """The docstring table lists exactly the names taken from ``jax._src``, and
  the module exports exactly what it imports."""
  path = _adapters()[name]
  tree = ast.parse(path.read_text())
  internal, imported = set(), set()
  for node in tree.body:
    if isinstance(node, ast.ImportFrom):
      names = {a.asname or a.name for a in node.names}
      imported |= names
      if (node.module or "").startswith("jax._src"):
        internal |= names
  doc = ast.get_docstring(tree) or ""
  rows = {line.split("``")[1] for line in doc.splitlines()
          if line.startswith("| ``")}
  assert rows == internal, (
      f"{name}: the docstring table names {sorted(rows)}, the module takes "
      f"{sorted(internal)} from jax._src")
  for line in doc.splitlines():
    if line.startswith("| ``"):
      assert len(line.split("|")[2].strip()) > 10, f"{name}: no why in {line}"
  exported = next(ast.literal_eval(node.value) for node in tree.body
                  if isinstance(node, ast.Assign)
                  and getattr(node.targets[0], "id", "") == "__all__")
  assert set(exported) == imported


def test_the_plugin_reaches_the_checker_only_through_its_public_names():
  """hijax.testing._plugin imports hijax.testing itself, never one of the
  checker's private modules; and the checker does not import the plugin."""
  graph = import_graph()
  plugin = {m for m in graph if m.startswith("hijax.testing._plugin")}
  assert plugin, sorted(graph)
  for name in plugin:
    private = {m for m in graph[name] if m.startswith("hijax.testing.")
               and m not in plugin}
    assert not private, (name, private)
  for name in set(graph) - plugin:
    assert not graph[name] & plugin, name
