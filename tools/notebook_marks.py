"""Cells the site hides, marked as such in the notebooks a reader runs.

A page hides some of its code cells: ``remove-cell`` (the checks that assert
what the prose claims, and setup a reader need not see) and ``remove-input``
(only the output is shown). Jupyter knows nothing of these tags, so in a
downloaded notebook they would sit unmarked among the cells the page shows.
`mark` therefore gives each hidden cell

* a first line saying so and what the cell is for, read from its code
  (`MARKS`): ``# Hidden on the site: checks the claims above.`` (it asserts
  something), ``...: defines names later cells use.`` (a later cell reads a
  name it binds before binding it anew), both, ``...: setup.`` (neither:
  settings such as ``jax.config.update``), or, for ``remove-input``, that the
  site shows only its output;
* ``metadata.jupyter.source_hidden``, which JupyterLab and Notebook 7 show as
  a collapsed input, so a reader skims past a run of hidden cells (and can
  click one open).

Cells the site folds (``hide-input``, ``hide-cell``) are collapsed the same way,
without a comment; ``remove-output`` and ``hide-output`` collapse the output.

Both the committed notebooks (tools/notebooks.py reads each page through
`mark`, so tests/test_docs.py compares marked with marked) and the site's
download menu (tools/sphinx_jax301.py) are marked. `unmark` undoes exactly
what `mark` does and gives back the page's own cells, on which the site
build's execution cache is keyed.
"""
from __future__ import annotations

import ast
import functools
import copy

PREFIX = "# Hidden on the site"
MARKS = {
    "checks": f"{PREFIX}: checks the claims above.",
    "defines": f"{PREFIX}: defines names later cells use.",
    "both": f"{PREFIX}: checks the claims above, and defines names later cells use.",
    "setup": f"{PREFIX}: setup.",
    "other": f"{PREFIX}.",
    "output": f"{PREFIX}, which shows only this cell's output.",
}
SOURCE_HIDDEN = {"remove-cell", "remove-input", "hide-input", "hide-cell"}
OUTPUTS_HIDDEN = {"remove-output", "hide-output"}


def _tags(cell) -> set[str]:
  return set(cell.get("metadata", {}).get("tags", []))


def _parse(source: str) -> ast.Module | None:
  # IPython syntax (%magic, !shell) is not Python; such a cell gets no analysis.
  try:
    return ast.parse(source)
  except SyntaxError:
    return None


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _stored(nodes) -> set[str]:
  return {n.id for node in nodes for n in ast.walk(node)
          if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _names(node, local=frozenset()):
  """``(name, Load or Store, (line, column))`` of each name ``node`` reads or
  binds in the cell's own scope: a name local to a function, lambda, class
  body or comprehension inside it is left out (a read of it there is not a
  read of the cell's name)."""
  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
    yield node.name, ast.Store, (node.lineno, node.col_offset)
  if isinstance(node, _FUNCTIONS + (ast.ClassDef,)):
    # Evaluated where it is defined: decorators, default values, base classes.
    outer = list(getattr(node, "decorator_list", []))
    if isinstance(node, ast.ClassDef):
      outer += node.bases + [k.value for k in node.keywords]
      inner = _stored(node.body)
    else:
      outer += node.args.defaults + [d for d in node.args.kw_defaults if d is not None]
      inner = {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
      if not isinstance(node, ast.Lambda):
        inner |= _stored(node.body)
    for child in outer:
      yield from _names(child, local)
    for child in node.body if isinstance(node.body, list) else [node.body]:
      yield from _names(child, local | inner)
    return
  if isinstance(node, _COMPREHENSIONS):
    local = local | _stored(g.target for g in node.generators)
  if isinstance(node, ast.Name) and node.id not in local:
    yield node.id, type(node.ctx), (node.lineno, node.col_offset)
  if isinstance(node, ast.alias):
    yield (node.asname or node.name).split(".")[0], ast.Store, (node.lineno, node.col_offset)
  for child in ast.iter_child_nodes(node):
    yield from _names(child, local)


def _bound(tree: ast.Module) -> set[str]:
  """Names a cell binds in its own scope (what a later cell could use)."""
  return {name for name, ctx, _ in _names(tree) if ctx is ast.Store}


@functools.lru_cache(maxsize=1024)
def _firsts(tree: ast.Module) -> dict[tuple[str, type], tuple[int, int]]:
  """Where ``tree`` first reads (ast.Load) or binds (ast.Store) each name it
  uses: one walk per cell, however many names earlier cells ask about."""
  out: dict[tuple[str, type], tuple[int, int]] = {}
  for name, ctx, at in _names(tree):
    if (name, ctx) not in out or at < out[name, ctx]:
      out[name, ctx] = at
  return out


def _first(tree: ast.Module, name: str, ctx: type) -> tuple[int, int] | None:
  """Where ``tree`` first reads (``ctx`` ast.Load) or binds (ast.Store) ``name``."""
  return _firsts(tree).get((name, ctx))


def _used_later(names: set[str], later: list[ast.Module | None]) -> bool:
  """Whether a later cell reads one of ``names`` before binding it anew.

  A cell that parses as no Python (IPython syntax) counts as reading them all.
  """
  names = set(names)
  for tree in later:
    if not names:
      return False
    if tree is None:
      return True
    for name in list(names):
      load, store = _first(tree, name, ast.Load), _first(tree, name, ast.Store)
      if load is not None and (store is None or load[0] <= store[0]):
        return True
      if store is not None:
        names.discard(name)  # rebound before any use: the hidden value is gone
  return False


def _checks(tree: ast.Module) -> bool:
  """The cell asserts something: an `assert`, a call of an ``assert*`` function,
  or a ``raise AssertionError``."""
  for node in ast.walk(tree):
    if isinstance(node, ast.Assert):
      return True
    if isinstance(node, ast.Call):
      f = node.func
      name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
      if name.startswith("assert"):
        return True
    if isinstance(node, ast.Raise) and node.exc is not None:
      exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
      if getattr(exc, "id", "") == "AssertionError":
        return True
  return False


def _purpose(i: int, trees: list[ast.Module | None]) -> str:
  tree = trees[i]
  if tree is None:
    return "other"
  defines = _used_later(_bound(tree), trees[i + 1:])
  checks = _checks(tree)
  return "both" if checks and defines else "checks" if checks else \
      "defines" if defines else "setup"


def mark(nb):
  """``nb`` with its hidden cells marked (in place; also returned). Idempotent."""
  code = [c for c in nb.cells if c.cell_type == "code"]
  trees = [_parse(_strip(c.source)) for c in code]
  for i, cell in enumerate(code):
    tags = _tags(cell)
    source = _strip(cell.source)
    if "remove-cell" in tags:
      source = f"{MARKS[_purpose(i, trees)]}\n{source}"
    elif "remove-input" in tags:
      source = f"{MARKS['output']}\n{source}"
    cell.source = source
    hidden = {}
    if tags & SOURCE_HIDDEN:
      hidden["source_hidden"] = True
    if tags & OUTPUTS_HIDDEN:
      hidden["outputs_hidden"] = True
    if hidden:
      cell.metadata["jupyter"] = hidden
  return nb


def _strip(source: str) -> str:
  """``source`` without a mark's first line."""
  first, _, rest = source.partition("\n")
  return rest if first in MARKS.values() else source


def unmark(nb):
  """A copy of ``nb`` without what `mark` added: the page's own cells."""
  nb = copy.deepcopy(nb)
  for cell in nb.cells:
    if cell.cell_type != "code":
      continue
    tags = _tags(cell)
    cell.source = _strip(cell.source)
    if tags & (SOURCE_HIDDEN | OUTPUTS_HIDDEN):
      cell.metadata.pop("jupyter", None)
  return nb
