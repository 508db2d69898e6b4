"""Sphinx helpers for the API reference page (docs/api.md), loaded by conf.py.

* The default role. hijax docstrings write names in single backticks
  (`HiPrim`, `expand`, `check_rules`). In docstrings (reStructuredText; MyST
  pages are not affected: there single backticks are code) such a name links
  to the documented hijax object it names, found by Python-domain suffix
  search (```expand``` finds ``hijax.HiPrim.expand``); text that names no
  documented object (```jvp = jvp_from_lin```, a parameter) is shown as code.
  A name that matches several objects still warns, and so fails the build.
* Docstrings of re-exported values. ``hijax.linearize_from_jvp`` (an instance)
  and ``hijax.aval_method`` (JAX's class) have their documentation as an
  attribute docstring in the hijax module that defines the name
  (``hijax/derived.py``, ``hijax/hitypes.py``); autodoc, documenting them as
  members of ``hijax``, would not find it. We substitute that docstring.
  JAX's own objects without a docstring get a one-line summary
  (`JAX_SUMMARIES`).
* The summary table's row of another name for a class (``VJPHiPrimitive``)
  says whose name it is (`ALIAS_SUMMARIES`): autosummary leaves it empty.
"""
from __future__ import annotations

import importlib
import pkgutil

from docutils import nodes
from sphinx.domains.python import PyXRefRole
from sphinx.pycode import ModuleAnalyzer

_pyobj = PyXRefRole()
_MARK = "hijax_default_role"


def default_role(name, rawtext, text, lineno, inliner, options=None, content=()):
  """```name```: a link to the hijax object called ``name``, else code."""
  result, messages = _pyobj("py:obj", rawtext, "." + text, lineno, inliner,
                            options or {}, content)
  for node in result:
    node[_MARK] = True
  return result, messages


def _unresolved_default_role(app, env, node, contnode):
  if node.get(_MARK):
    return contnode  # the code literal, unlinked
  return None


def _attribute_docs(name, obj):
  """The attribute docstring of ``name`` in the hijax submodule that binds it to ``obj``."""
  import hijax
  for info in pkgutil.iter_modules(hijax.__path__, "hijax."):
    module = importlib.import_module(info.name)
    if getattr(module, name, None) is not obj:
      continue
    docs = ModuleAnalyzer.for_module(info.name).find_attr_docs()
    if ("", name) in docs:
      return list(docs[("", name)])
  return None


JAX_SUMMARIES = {
    "Zero": "A symbolic zero tangent or cotangent (JAX's class).",
    "instantiate_zeros": "An array of zeros for a `Zero`; other tangents unchanged.",
    "GradAccum": "Base class of the gradient accumulators of `vjp_bwd` (JAX's class).",
    "ValAccum": "Accumulator whose gradient is returned as a value.",
    "RefAccum": "Accumulator adding into a caller's mutable gradient buffer.",
    "NullAccum": "Accumulator for a gradient nobody wants: adding does nothing.",
    "ShapedArray": "The type of a JAX array (JAX's class).",
    # JAX's own functions with jax 0.12 (no docstring there); hijax's with 0.11.2
    "bdims_at_front": "The arguments of a `batch` rule with each batch axis moved "
                      "to the front, unbatched ones broadcast.",
    "unmap_avals": "The batched types: each type with the batch axis inserted at "
                   "its batch dimension.",
}
# Another name for a class, and what its row of the summary table says
# (autosummary shows no docstring for a class found under another name, and
# autodoc fires no event for it that could supply one).
ALIAS_SUMMARIES = {
    "VJPHiPrimitive": ("HiPrim", " under its name in JAX's development API until "
                                 "jax 0.11.1: the same class."),
}


def _reexported_docstring(app, what, name, obj, options, lines):
  module, _, attr = name.rpartition(".")
  if module != "hijax":
    return
  import hijax
  if getattr(hijax, attr, None) is not obj:
    return
  if what in ("data", "class", "attribute"):
    docs = _attribute_docs(attr, obj)
    if docs:
      lines[:] = docs
      return
  if not any(l.strip() for l in lines) and attr in JAX_SUMMARIES:
    lines[:] = [JAX_SUMMARIES[attr], ""]


def _fill_alias_summaries(app, doctree):
  """Fills the empty description of each `ALIAS_SUMMARIES` row of an
  autosummary table."""
  for table in doctree.findall(nodes.table):
    if "autosummary" not in table.get("classes", []):
      continue
    for row in table.findall(nodes.row):
      entries = list(row.findall(nodes.entry))
      if len(entries) != 2 or entries[1].astext().strip():
        continue
      name = entries[0].astext().strip()
      if name in ALIAS_SUMMARIES:
        code, rest = ALIAS_SUMMARIES[name]
        entries[1].clear()
        entries[1] += nodes.paragraph("", "", nodes.literal(code, code), nodes.Text(rest))


def setup(app):
  app.connect("doctree-read", _fill_alias_summaries)
  app.add_role("hijax-obj", default_role)
  app.connect("missing-reference", _unresolved_default_role)
  app.connect("autodoc-process-docstring", _reexported_docstring)
  return {"parallel_read_safe": True, "parallel_write_safe": True}
