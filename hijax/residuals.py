"""How many bytes reverse mode saves, where, and a test that bounds it.

`residual_report` reads `saved_residuals` (the residuals ``jax.grad`` and
``jax.vjp`` keep from the forward sweep to the backward one) and gives each
one's shape, dtype and bytes, what it is (an argument, the output of an
operation, a value named with ``checkpoint_name``) and the source line that
made it, summed per operation and per line. `assert_residual_bytes` fails a
test when a change makes a function save more than a budget.

Source lines are shown as ``file.py:line (function)``, with the file's base
name only (a notebook cell's file as ``cell``), so a report prints the same
on every machine.

Imports: `hijax._avals` only (and jax, numpy). The source lines it reports
skip hijax's own frames: `hijax.primitive` excludes hijax's directory from
JAX's source information, as JAX excludes its own.
"""
from __future__ import annotations

import dataclasses
import html
import os
import re
from typing import Any, Callable

import jax
import numpy as np

from hijax._avals import saved_residuals

__all__ = ["residual_report", "assert_residual_bytes", "ResidualReport",
           "Residual"]

_DESCRIPTION = re.compile(
    r"^(?:(?P<argument>from the argument (?P<arg>.*))"
    r"|(?:(?:output of (?P<prim>\S+))|(?:named '(?P<name>.*)'))"
    r"(?: from (?P<path>.+?):(?P<line>\d+)(?::\d+)? \((?P<func>.*)\))?)$")


@dataclasses.dataclass(frozen=True)
class Residual:
  """One saved array: its type, size and where it comes from."""

  shape: tuple[int, ...]
  dtype: str
  nbytes: int
  what: str
  """``argument x``, ``output of cos`` or ``named 'h'``."""
  where: str
  """``file.py:line (function)``, or ``""`` for an argument."""

  @property
  def is_argument(self) -> bool:
    return self.what.startswith("argument")


def _nbytes(aval) -> int:
  shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
  if shape is None or dtype is None:
    return sum(_nbytes(a) for a in jax.tree.leaves(
        getattr(aval, "lo_ty", lambda: [])()))
  return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _short_path(path: str) -> str:
  if "ipykernel_" in path:
    return "cell"
  return os.path.basename(path)


def _residual(aval, description: str) -> Residual:
  m = _DESCRIPTION.match(description)
  if m is None:
    what, where = description, ""
  elif m["argument"]:
    what, where = f"argument {m['arg']}", ""
  else:
    what = f"output of {m['prim']}" if m["prim"] else f"named '{m['name']}'"
    where = (f"{_short_path(m['path'])}:{m['line']} ({m['func']})"
             if m["path"] else "")
  return Residual(tuple(getattr(aval, "shape", ())),
                  str(getattr(aval, "dtype", type(aval).__name__)),
                  _nbytes(aval), what, where)


def _size(n: int) -> str:
  for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
    if n >= scale:
      return f"{n / scale:.1f} {unit}"
  return f"{n} B"


class ResidualReport:
  """The residuals of one function, as rows and sums; prints as a table.

  ``rows`` lists every `Residual`; `by_operation` and `by_line` sum the bytes
  per kind of value and per source line, biggest first. ``str(report)`` is a
  plain-text table, and a notebook shows it as an HTML table.
  """

  def __init__(self, rows: list[Residual], title: str):
    self.rows = rows
    self.title = title

  @property
  def total_bytes(self) -> int:
    """Bytes of all residuals, arguments included."""
    return sum(r.nbytes for r in self.rows)

  @property
  def saved_bytes(self) -> int:
    """Bytes of the residuals that are not arguments (which live anyway)."""
    return sum(r.nbytes for r in self.rows if not r.is_argument)

  def _grouped(self, key) -> list[tuple[str, int, int]]:
    sums: dict[str, list[int]] = {}
    for r in self.rows:
      if not r.is_argument:
        entry = sums.setdefault(key(r), [0, 0])
        entry[0] += 1
        entry[1] += r.nbytes
    return sorted(((k, n, b) for k, (n, b) in sums.items()),
                  key=lambda e: (-e[2], e[0]))

  def by_operation(self) -> list[tuple[str, int, int]]:
    """``(what, count, bytes)`` per kind of saved value, arguments left out."""
    return self._grouped(lambda r: r.what)

  def by_line(self) -> list[tuple[str, int, int]]:
    """``(where, count, bytes)`` per source line, arguments left out."""
    return self._grouped(lambda r: r.where or "?")

  def _table(self):
    header = ("shape", "dtype", "bytes", "saved value", "source line")
    body = [(str(list(r.shape)), r.dtype, _size(r.nbytes), r.what, r.where)
            for r in self.rows]
    return header, body

  def __str__(self) -> str:
    header, body = self._table()
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body)]
    fmt = lambda row: "  ".join(str(x).ljust(w) for x, w in
                                zip(row, widths)).rstrip()
    lines = [self.title, fmt(header), fmt(["-" * w for w in widths])]
    lines += [fmt(row) for row in body]
    lines.append(f"saved: {_size(self.saved_bytes)} in "
                 f"{sum(not r.is_argument for r in self.rows)} arrays "
                 f"(with the arguments: {_size(self.total_bytes)})")
    for where, n, b in self.by_line():
      lines.append(f"  {_size(b):>10}  {n} x  {where}")
    return "\n".join(lines)

  __repr__ = __str__

  def _repr_html_(self):
    header, body = self._table()
    esc = lambda x: html.escape(str(x))
    rows = "".join("<tr>" + "".join(f"<td>{esc(x)}</td>" for x in row)
                   + "</tr>" for row in body)
    by_line = "".join(f"<tr><td>{esc(w)}</td><td>{n}</td><td>{_size(b)}</td>"
                      "</tr>" for w, n, b in self.by_line())
    return (f"<p><b>{esc(self.title)}</b>: saves {_size(self.saved_bytes)} "
            f"(with the arguments: {_size(self.total_bytes)})</p>"
            "<table><tr>" + "".join(f"<th>{h}</th>" for h in header)
            + f"</tr>{rows}</table><p>Per source line:</p><table><tr>"
            f"<th>source line</th><th>arrays</th><th>bytes</th></tr>{by_line}"
            "</table>")


def residual_report(f: Callable, *args: Any,
                    policy: Any=None) -> ResidualReport:
  """What ``jax.grad(f)`` (``jax.vjp(f, *args)``) saves, as a `ResidualReport`.

  With ``policy``, the function is ``jax.checkpoint(f, policy=policy)``: the
  report shows what that checkpoint policy keeps (a primitive with
  reverse-mode rules only needs ``jax_remat3`` then: the classic
  ``jax.checkpoint`` differentiates in forward mode, and the error says
  so). Only ``f`` is traced;
  nothing is computed. An argument that is itself saved is listed, but left
  out of `ResidualReport.saved_bytes` (it is in memory anyway).
  """
  fn = f if policy is None else jax.checkpoint(f, policy=policy)
  try:
    found = saved_residuals(fn, *args)
  except NotImplementedError as e:
    if policy is None or getattr(jax.config, "jax_remat3", True):
      raise
    raise NotImplementedError(
        f"residual_report(..., policy=...) traces jax.checkpoint(f, "
        f"policy=...), and with jax_remat3 off jax.checkpoint differentiates "
        f"its body in forward mode, which a primitive with reverse-mode rules "
        f"only cannot do ({e}). Enable the new remat implementation, under "
        "which the primitive's reverse-mode rules (and its `remat` method) "
        "apply: jax.config.update('jax_remat3', True); or give the primitive "
        "a forward-mode rule, e.g. `jvp = jvp_from_vjp`") from e
  rows = [_residual(aval, desc) for aval, desc in found]
  name = getattr(f, "__qualname__", repr(f))
  # A policy object's repr, or a policy function's qualified name (a
  # function's repr would show its address).
  policy_name = (getattr(policy, "__qualname__", None)
                 if callable(policy) and hasattr(policy, "__code__")
                 else repr(policy))
  title = f"residuals of {name}" + (
      "" if policy is None else f" under {policy_name}")
  return ResidualReport(rows, title)


def assert_residual_bytes(f: Callable, *args: Any, max_bytes: int, policy: Any=None,
                          count_arguments: bool = False) -> ResidualReport:
  """Fails (AssertionError) if ``f`` saves more than ``max_bytes`` for ``grad``.

  Counts `ResidualReport.saved_bytes` (with ``count_arguments``, the saved
  arguments too). The message lists the source lines that save the most,
  then the whole report. Returns the report when within budget.
  """
  report = residual_report(f, *args, policy=policy)
  used = report.total_bytes if count_arguments else report.saved_bytes
  if used > max_bytes:
    biggest = "\n".join(f"  {_size(b):>10} in {n} array(s) at {w}"
                        for w, n, b in report.by_line()[:5])
    raise AssertionError(
        f"{report.title} saves {used} bytes ({_size(used)}) for the backward "
        f"pass, over the budget of {max_bytes} bytes ({_size(max_bytes)}). "
        f"The biggest savers:\n{biggest}\n\n{report}")
  return report
