"""The point a check runs at, its settings, and the bookkeeping every check
shares: functions of a subset of the inputs, random directions, finite
differences, comparisons that write failures into the report."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hijax.testing._discovery import defined_rules
from hijax.testing._finite_diff import (FDEstimate, estimate, low_precision,
                                        scaled_tangents)
from hijax.testing._numerics import (Tol, check_arrays, compare_leaf,
                                     describe_tol, fmt_array, is_float,
                                     real_or_int, type_str)
from hijax.testing._report import RuleFailure, RuleReport, first_lines


def _widened(f, xs, ts, out_dtypes, eps):
  """Finite differences of ``f`` on ``xs`` converted to float32 (exact),
  if ``f`` accepts them and returns float32 where it returned a low
  precision; else None."""
  wide = [np.asarray(x).astype(np.float32) if low_precision(np.asarray(
      x).dtype) else np.asarray(x) for x in xs]
  try:
    f_wide = f(*[jnp.asarray(x) for x in wide])
  except Exception:  # pylint: disable=broad-except  (types fixed by the primitive)
    return None
  got = [np.asarray(y).dtype for y in f_wide]
  want = [np.dtype(np.float32) if low_precision(d) else np.dtype(d)
          for d in out_dtypes]
  if got != want:
    return None
  est = estimate(f, wide, [np.asarray(t).astype(w.dtype)
                           for t, w in zip(ts, wide)],
                 want, f_wide, eps, cast_to=out_dtypes)
  est.tangents = [jnp.asarray(t) for t in ts]  # exact in the inputs' dtypes
  return est


@dataclasses.dataclass(frozen=True)
class Settings:
  """The options of one run of the checks (see `check_rules`)."""
  tol: Tol
  eps: float | None = None  # a fixed finite-difference step (else searched)
  batch_size: int = 3
  batch_in_axes: Sequence[Any] | None = None
  linear_argnums: Sequence[int | Sequence[int]] | None = None
  order: int = 2
  jit: bool = True
  per_leaf: bool = True  # also differentiate each input alone


@dataclasses.dataclass
class CheckContext:
  """One function of a flat list of leaves, checked at one point.

  ``label`` prefixes the checks of a sub-function (the second-order checks);
  ``requested`` are the modes the user asked for, which the second-order
  checks follow.
  """
  prim_fn: Callable
  args: tuple
  leaf_names: list[str]
  settings: Settings
  rng: np.random.Generator
  report: RuleReport
  prims: list
  label: str = ""
  requested: tuple[str, ...] = ()

  def __post_init__(self):
    self.fn = jax.jit(self.prim_fn) if self.settings.jit else self.prim_fn
    self.leaves, self.in_tree = jax.tree.flatten(self.args)
    self.rules = [defined_rules(p) for p in self.prims]
    self.float_idx = [i for i, x in enumerate(self.leaves) if is_float(x)]
    out_shape = jax.eval_shape(self.prim_fn, *self.args)
    out_paths, self.out_tree = jax.tree_util.tree_flatten_with_path(out_shape)
    check_arrays("output", "out", out_paths,
                 lambda a: isinstance(a, jax.ShapeDtypeStruct)
                 and real_or_int(a.dtype))
    self.out_names = ["out" + jax.tree_util.keystr(p) for p, _ in out_paths]
    self.out_avals = [a for _, a in out_paths]
    self.out_float_idx = [i for i, a in enumerate(self.out_avals)
                          if jnp.issubdtype(a.dtype, jnp.floating)]
    self._ref_out = None
    self.jvp_ok = {}  # direction -> whether the jvp check passed there
    self._fd = {}  # direction -> FDEstimate

  def sub(self, prim_fn, args, leaf_names, prims, **changes) -> CheckContext:
    """A context for another function, with the same settings except
    ``changes`` (settings fields, or ``report`` / ``label``)."""
    own = {k: changes.pop(k) for k in ("report", "label") if k in changes}
    return CheckContext(
        prim_fn, tuple(args), leaf_names,
        dataclasses.replace(self.settings, **changes), self.rng,
        own.get("report", self.report), prims, own.get("label", self.label),
        self.requested)

  # -- bookkeeping --

  def has(self, mode) -> bool:
    """Whether every primitive found defines the rule of ``mode``."""
    return all(mode in r for r in self.rules)

  @property
  def fd_of(self) -> str:
    """What finite differences are taken of: ``expand`` for hijax
    primitives, ``the function`` for jax.custom_jvp / custom_vjp ones."""
    return ("expand" if all(hasattr(p, "in_avals") for p in self.prims)
            else "the function")

  def rule_name(self, mode) -> str:
    names = [r[mode] for r in self.rules if mode in r]
    if not names:  # not a rule's own check: name the primitives
      names = [r["expand"].split(".")[0] for r in self.rules]
    return ", ".join(names)

  def ran(self, mode, what):
    if self.label:  # a sub-check of the second-order mode
      what, mode = f"{self.label}{mode}: {what}", "second_order"
    self.report.ran.append(f"{mode}: {what}")

  def skip(self, mode, why):
    self.report.skipped.append((mode, self.label + why))

  def fail(self, mode, check, inputs, detail, max_error=None, rule=None):
    self.report.failures.append(RuleFailure(
        rule=rule or self.rule_name(mode), check=self.label + check,
        inputs=inputs, detail=detail, max_error=max_error))

  def fail_raised(self, mode, check, inputs, exc, rule=None):
    detail = f"raised {type(exc).__name__}: {first_lines(str(exc))}"
    self.fail(mode, check, inputs, detail, float("inf"), rule=rule)

  def describe_inputs(self, direction=None, extra=None) -> str:
    lines = [f"input {n} = {fmt_array(x)}"
             for n, x in zip(self.leaf_names, self.leaves)]
    if direction is not None:
      lines.append("tangent/cotangent on " + self.describe_direction(direction))
    if extra:
      lines.append(extra)
    return "\n".join(lines)

  def describe_direction(self, direction) -> str:
    if len(direction) == len(self.float_idx) and len(direction) > 1:
      return "all floating-point inputs"
    return ", ".join(self.leaf_names[i] for i in direction) + (
        " only (the others get symbolic zeros)" if len(self.float_idx) > 1
        else "")

  def compare(self, mode, check, inputs, got, want, tol, names=None,
              got_label="rule", want_label="reference", rule=None,
              bounds=None) -> bool:
    """Compares lists of arrays leaf by leaf; records the worst difference as
    a failure. ``names`` default to the floating-point outputs'; ``bounds``
    are the reference's error bounds (finite differences)."""
    names = names or [self.out_names[i] for i in self.out_float_idx]
    bounds = bounds or [None] * len(want)
    worst = None
    for name, g, w, b in zip(names, got, want, bounds):
      res = compare_leaf(g, w, tol, b)
      if res is not None and (worst is None or res[0] > worst[1][0]):
        worst = (name, res)
    if worst is None:
      return True
    name, (err, idx, gv, wv) = worst
    if gv is None:
      detail = f"{name}: {got_label} has {idx}"
    else:
      where = f" at index {tuple(int(i) for i in idx)}" if idx != () else ""
      detail = (f"{name}: max abs error {err:.3g}{where} ({got_label} gives "
                f"{gv:.8g}, {want_label} gives {wv:.8g}; {describe_tol(tol)}"
                + (" plus the finite differences' error bound"
                   if bounds[0] is not None else "") + ")")
    self.fail(mode, check, inputs, detail, err, rule=rule)
    return False

  def check_types(self, mode, check, inputs, got, like, names,
                  got_label) -> bool:
    """Checks that each of ``got`` has the shape and dtype of the matching
    array of ``like`` (a cotangent has the type of its input); records the
    first mismatch as a failure."""
    for name, g, x in zip(names, got, like):
      if type_str(g) != type_str(x):
        self.fail(mode, check, inputs,
                  f"{name}: {got_label} gives {type_str(g)}, but the input is "
                  f"{type_str(x)} (a cotangent has the shape and dtype of "
                  "its input)", float("inf"))
        return False
    return True

  # -- functions of subsets of the leaves --

  def restrict(self, direction, evaluate=False) -> Callable:
    """``prim_fn`` as a function of the leaves in ``direction`` (others fixed),
    returning the tuple of its floating-point output leaves.

    With ``evaluate``, it calls the jitted ``prim_fn`` (for plain evaluations,
    which then compile once); otherwise ``prim_fn`` itself (to be transformed).
    """
    base = list(self.leaves)
    fn = self.fn if evaluate else self.prim_fn

    def f(*xs):
      full = list(base)
      for i, x in zip(direction, xs):
        full[i] = x
      out = jax.tree.leaves(fn(*jax.tree.unflatten(self.in_tree, full)))
      return tuple(out[i] for i in self.out_float_idx)
    return f

  def ref_out(self):
    """The floating-point outputs at the point (computed once)."""
    if self._ref_out is None:
      self._ref_out = self.restrict([], evaluate=True)()
    return self._ref_out

  def random_like(self, x):
    x = np.asarray(x)
    return jnp.asarray(self.rng.standard_normal(x.shape).astype(x.dtype))

  def directions(self) -> list[tuple[int, ...]]:
    """All floating-point leaves together, then (if ``per_leaf``) each alone."""
    dirs = [tuple(self.float_idx)]
    if self.settings.per_leaf and len(self.float_idx) > 1:
      dirs += [(i,) for i in self.float_idx]
    return dirs

  def fd(self, direction) -> FDEstimate:
    """Central differences of the floating-point outputs along random
    tangents scaled with the inputs (computed once per direction); see
    `hijax.testing._finite_diff` for the step and the error bound."""
    if direction not in self._fd:
      xs = [self.leaves[i] for i in direction]
      ts = scaled_tangents(self.rng, xs)
      out_dtypes = [self.out_avals[i].dtype for i in self.out_float_idx]
      f = self.restrict(direction, evaluate=True)
      est = None
      if any(low_precision(np.asarray(x).dtype) for x in xs):
        est = _widened(f, xs, ts, out_dtypes, self.settings.eps)
      if est is None:
        est = estimate(f, xs, ts, out_dtypes, self.ref_out(),
                       self.settings.eps)
      self._fd[direction] = est
      if est.unresolved:
        where = self.describe_direction(direction)
        self.report.inconclusive.append(
            f"{self.label}finite differences ({where}): "
            f"{est.unresolved} output element(s) not resolved "
            "in this dtype at this point (not compared with finite "
            "differences)")
    return self._fd[direction]

  def tangents_for(self, direction):
    """The tangents of ``direction``'s finite differences (so that the jvp
    rule and finite differences are compared along the same tangents)."""
    return list(self.fd(direction).tangents)

  def tangent_reference(self, direction, tangents):
    """J ṫ from the jvp rule when it is defined and passed its own check,
    else from finite differences (along their own tangents, which then
    replace ``tangents``). Returns (values, label, bounds, tangents), where
    bounds are the error bounds of the values (None for the jvp rule)."""
    if self.has("jvp") and self.jvp_ok.get(direction, True):
      try:
        _, t_out = jax.jvp(self.restrict(direction),
                           tuple(self.leaves[i] for i in direction),
                           tuple(tangents))
        return list(t_out), "the jvp rule", None, tangents
      except Exception:  # pylint: disable=broad-except  (the jvp check reports it)
        pass
    est = self.fd(direction)
    return (est.values, f"finite differences of {self.fd_of}", est.bounds,
            list(est.tangents))
