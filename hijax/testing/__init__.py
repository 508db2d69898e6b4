"""Check a hijax primitive's rules against each other, against finite
differences of `expand`, and against loops.

Hand-written derivative and batching rules are easy to get subtly wrong: a
backward rule that is not the transpose of the forward rule, a batching rule
that puts the batch dimension in the wrong place, an ``nzs_out`` that declares
a tangent zero when it is not. Such rules often run without error and give
plausible numbers. `check_rules` exercises every rule a primitive defines and
compares the results with an independent reference:

==================  =========================================================
mode                what is compared
==================  =========================================================
``"expand"``        the eager call and the ``jit``-compiled call with `expand`
                    evaluated directly; `expand`'s output types with
                    ``out_aval``
``"jvp"``           ``jax.jvp`` (the `jvp` rule) with central finite
                    differences of `expand`, differentiating all inputs and
                    each input alone (the others then get symbolic zeros)
``"vjp"``           ``jax.vjp`` (`vjp_fwd` with `vjp_bwd_retval` or `vjp_bwd`)
                    with the `jvp` rule through the inner-product identity
                    ``<ȳ, J ṫ> = <Jᵀ ȳ, ṫ>`` on random vectors (finite
                    differences stand in for a missing or failing `jvp`);
                    the ``nzs_out`` that `vjp_fwd` returns
``"lin"``           ``jax.linearize`` (`lin` and `linearized`) with the `jvp`
                    rule (or finite differences); `lin`'s ``nzs_out``
``"transpose"``     ``jax.linear_transpose`` (the `transpose` rule) with the
                    linear map it transposes, through the same identity
``"batch"``         ``jax.vmap`` (`batch` or `batch_dim_rule`) with a Python
                    loop over the batch, for every combination of batched and
                    unbatched arguments, with the batch axis first and last;
                    ``vmap`` of ``jvp`` and of ``vjp`` with loops
``"second_order"``  the checks above, applied to the tangent map, the
                    backward pass and the linearized map of the function,
                    where those bind hijax primitives again (a `jvp` rule that
                    calls another primitive, a backward rule that calls the
                    primitive itself, ...)
==================  =========================================================

A rule counts as defined when the primitive's class overrides the `HiPrim`
method (derived rules such as ``vjp_fwd, vjp_bwd_retval = vjp_from_jvp``
count). Modes whose rules are not defined are skipped, and the returned
`RuleReport` says so.

Example::

    def log1pexp(x):
      return Log1pExp(jax.typeof(x))(x)

    check_rules(log1pexp, jnp.array([-2.0, 0.5, 3.0]))

A failing check raises `RuleCheckError`, an `AssertionError` that names the
rule, the input and the largest error. In a pytest suite, call
`assert_rules`, which keeps this module's frames out of the traceback.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import api as _api
from jax._src import core as _core
from jax._src.interpreters import partial_eval as _pe

__all__ = ["check_rules", "assert_rules", "defined_rules", "RuleCheckError",
           "RuleFailure", "RuleReport", "MODES"]

MODES = ("expand", "jvp", "vjp", "lin", "transpose", "batch", "second_order")
"""Every mode `check_rules` knows, in the order it runs them."""

_DERIVATIVE_MODES = ("jvp", "vjp", "lin")


# --- results ---------------------------------------------------------------------

@dataclasses.dataclass
class RuleFailure:
  """One failed check.

  Attributes:
    rule: the rule under suspicion, e.g. ``"Log1pExp.jvp"``.
    check: what was compared, e.g. ``"jvp vs central finite differences of
      expand"``.
    inputs: the input the check ran on (and the tangent direction or batch
      axes, where relevant).
    detail: where the results differ, and by how much.
    max_error: the largest absolute error found (``inf`` when a rule raised or
      returned the wrong type; None when not applicable).
  """
  rule: str
  check: str
  inputs: str
  detail: str
  max_error: float | None = None

  def __str__(self):
    lines = [f"{self.rule}: {self.check}"]
    lines += ["  " + line for line in self.inputs.splitlines()]
    lines += ["  " + line for line in self.detail.splitlines()]
    return "\n".join(lines)


@dataclasses.dataclass
class RuleReport:
  """What `check_rules` did.

  Attributes:
    primitives: the names of the hijax primitives ``prim_fn`` binds.
    dtype: the floating-point dtype the checks ran in.
    ran: one line per check that ran.
    skipped: ``(mode, reason)`` for each mode that did not run.
    failures: the `RuleFailure` of each failed check (empty when all passed).
  """
  primitives: list[str]
  dtype: str
  ran: list[str] = dataclasses.field(default_factory=list)
  skipped: list[tuple[str, str]] = dataclasses.field(default_factory=list)
  failures: list[RuleFailure] = dataclasses.field(default_factory=list)

  @property
  def passed(self) -> bool:
    return not self.failures

  @property
  def modes_run(self) -> list[str]:
    """The modes with at least one check run, in order."""
    return [m for m in MODES if any(r.startswith(m + ":") for r in self.ran)]

  def __str__(self):
    lines = [f"check_rules on {', '.join(self.primitives)} in {self.dtype}: "
             f"{len(self.ran)} checks, {len(self.failures)} failed"]
    lines += [f"  ran      {r}" for r in self.ran]
    lines += [f"  skipped  {m}: {why}" for m, why in self.skipped]
    return "\n".join(lines)


class RuleCheckError(AssertionError):
  """A primitive's rules failed `check_rules`.

  The message lists every failure. The attributes describe the first one:
  ``rule``, ``check``, ``inputs`` and ``max_error``; ``failures`` has them all
  and ``report`` is the full `RuleReport`.
  """

  def __init__(self, report: RuleReport):
    self.report = report
    self.failures = list(report.failures)
    first = self.failures[0]
    self.rule, self.check = first.rule, first.check
    self.inputs, self.max_error = first.inputs, first.max_error
    n = len(self.failures)
    head = (f"{n} rule check{'s' if n > 1 else ''} failed for "
            f"{', '.join(report.primitives)} (in {report.dtype}):")
    super().__init__("\n\n".join([head] + [str(f) for f in self.failures]))


# --- which rules a primitive defines ------------------------------------------------

def _hiprim_base(cls) -> type | None:
  for c in cls.__mro__:
    if c.__name__ == "HiPrim" and "expand" in c.__dict__:
      return c
  return None


def _is_hiprim(x) -> bool:
  return _hiprim_base(type(x)) is not None and hasattr(x, "in_avals")


def _overrides(cls, name) -> bool:
  base = _hiprim_base(cls)
  return getattr(cls, name, None) is not getattr(base, name, None)


def defined_rules(prim) -> dict[str, str]:
  """The rules a `HiPrim` (instance or class) defines, as ``{mode: rule name}``.

  For example ``{"expand": "Log1pExp.expand", "jvp": "Log1pExp.jvp", "vjp":
  "Log1pExp.vjp_fwd/vjp_bwd_retval", "batch": "Log1pExp.batch_dim_rule"}``.
  Derived rules (``lin, linearized = linearize_from_jvp`` and the like) count
  as defined, and their name says where they come from.
  """
  cls = prim if isinstance(prim, type) else type(prim)
  name = cls.__name__
  from hijax import derived
  rules = {"expand": f"{name}.expand"}
  if _overrides(cls, "jvp"):
    rules["jvp"] = f"{name}.jvp" + (
        " (jvp_from_lin)" if cls.jvp is derived.jvp_from_lin else "")
  if _overrides(cls, "vjp_fwd") and (_overrides(cls, "vjp_bwd")
                                      or _overrides(cls, "vjp_bwd_retval")):
    bwd = "vjp_bwd" if _overrides(cls, "vjp_bwd") else "vjp_bwd_retval"
    how = {derived.vjp_from_lin.first: " (vjp_from_lin)",
           derived.vjp_from_jvp.first: " (vjp_from_jvp)"}.get(cls.vjp_fwd, "")
    rules["vjp"] = f"{name}.vjp_fwd/{bwd}{how}"
  if _overrides(cls, "lin") and _overrides(cls, "linearized"):
    rules["lin"] = f"{name}.lin/linearized" + (
        " (linearize_from_jvp)" if cls.lin is derived.linearize_from_jvp.first
        else "")
  if _overrides(cls, "transpose"):
    rules["transpose"] = f"{name}.transpose"
  if _overrides(cls, "batch"):
    rules["batch"] = f"{name}.batch"
  elif _overrides(cls, "batch_dim_rule"):
    rules["batch"] = f"{name}.batch_dim_rule"
  return rules


# JAX 0.11 and 0.12 both give `Jaxpr` objects with `.jaxpr` and `.consts`;
# older code paths may still produce a separate `ClosedJaxpr`.
_JAXPR_TYPES = tuple(t for t in (getattr(_core, "ClosedJaxpr", None),
                                 _core.Jaxpr) if t is not None)


def _open_jaxpr(v):
  """(jaxpr, consts) of a closed or open jaxpr."""
  return getattr(v, "jaxpr", v), getattr(v, "consts", ())


def _sub_jaxprs(params):
  for val in params.values():
    for v in (val if isinstance(val, (tuple, list)) else (val,)):
      if isinstance(v, _JAXPR_TYPES):
        yield _open_jaxpr(v)[0]


def _find_hiprims(jaxpr, found: list) -> list:
  """Appends the distinct hijax primitive instances bound in ``jaxpr``."""
  for eqn in jaxpr.eqns:
    prim = eqn.params.get("_prim")
    if _is_hiprim(prim) and not any(prim is p for p in found):
      found.append(prim)
    for sub in _sub_jaxprs(eqn.params):
      _find_hiprims(sub, found)
  return found


_INLINED_CALLS = ("pjit", "jit", "closed_call", "core_call", "checkpoint",
                  "remat")


def _eval_expanded(jaxpr, consts, args, applications):
  """Evaluates ``jaxpr`` with each hijax primitive replaced by its `expand`.

  Records ``(prim, args, outs)`` for each top-level application in
  ``applications``.
  """
  env = {}

  def read(v):
    return v.val if isinstance(v, _core.Literal) else env[v]

  for v, x in zip(jaxpr.constvars, consts):
    env[v] = x
  for v, x in zip(jaxpr.invars, args):
    env[v] = x
  for eqn in jaxpr.eqns:
    invals = [read(v) for v in eqn.invars]
    prim = eqn.params.get("_prim")
    sub = eqn.params.get("jaxpr")
    if _is_hiprim(prim):
      p_args = jax.tree.unflatten(prim.in_tree, invals)
      out = prim.expand(*p_args)
      outs, tree = jax.tree.flatten(out)
      applications.append((prim, p_args, out, tree))
      if tree != prim.out_tree:
        raise _ExpandStructureError(prim, tree)
    elif (eqn.primitive.name in _INLINED_CALLS
          and isinstance(sub, _JAXPR_TYPES)):
      outs = _eval_expanded(*_open_jaxpr(sub), invals, [])
    else:
      subfuns, params = eqn.primitive.get_bind_params(eqn.params)
      outs = eqn.primitive.bind(*subfuns, *invals, **params)
      if not eqn.primitive.multiple_results:
        outs = [outs]
    for v, x in zip(eqn.outvars, outs):
      env[v] = x
  return [read(v) for v in jaxpr.outvars]


class _ExpandStructureError(Exception):
  def __init__(self, prim, tree):
    self.prim, self.tree = prim, tree
    super().__init__(f"{type(prim).__name__}.expand returned a value with "
                     f"structure {tree}, but out_aval has structure "
                     f"{prim.out_tree}")


# --- small numeric helpers ----------------------------------------------------------

def _is_float(x) -> bool:
  return jnp.issubdtype(jnp.result_type(x), jnp.floating)


def _fmt_array(x, limit=6) -> str:
  x = np.asarray(x)
  aval = f"{x.dtype.name}{list(x.shape)}".replace("float", "f").replace(
      "uint", "u").replace("int", "i")
  flat = x.ravel()
  vals = np.array2string(flat[:limit], precision=4, separator=", ",
                         max_line_width=200)
  if flat.size > limit:
    vals = vals[:-1] + ", ...]"
  return f"{aval} {vals}" if x.ndim else f"{aval} {flat[0]:.6g}" if _is_float(
      x) else f"{aval} {flat[0]}"


def _inner(xs, ys) -> tuple[float, float]:
  """Sum of elementwise products of two lists of arrays, and of their |.|."""
  total, scale = 0.0, 0.0
  for x, y in zip(xs, ys):
    p = np.asarray(x, np.float64) * np.asarray(y, np.float64)
    total += float(np.sum(p))
    scale += float(np.sum(np.abs(p)))
  return total, scale


@dataclasses.dataclass
class _Tol:
  atol: float
  rtol: float


def _compare_leaf(got, want, tol: _Tol):
  """Returns (max_abs_error, index, got_value, want_value) of the worst
  violation of ``|got - want| <= atol + rtol |want|``, or None."""
  got = np.asarray(got)
  want = np.asarray(want)
  if got.shape != want.shape:
    return (float("inf"), f"shape {got.shape} instead of {want.shape}", None,
            None)
  if not (_is_float(got) or _is_float(want)):
    bad = got != want
    if not np.any(bad):
      return None
    idx = np.unravel_index(np.argmax(bad), bad.shape) if bad.ndim else ()
    return float(np.max(np.abs(got.astype(np.int64) - want.astype(np.int64)))
                 ), idx, got[idx], want[idx]
  g = got.astype(np.float64)
  w = want.astype(np.float64)
  with np.errstate(invalid="ignore"):
    err = np.abs(g - w)
    err = np.where((g == w) | (np.isnan(g) & np.isnan(w)), 0.0, err)
    err = np.where(np.isnan(err), np.inf, err)
    scale = np.abs(np.where(np.isfinite(w), w, 0))
    excess = err - (tol.atol + tol.rtol * scale)
  if not np.any(excess > 0):
    return None
  idx = np.unravel_index(np.argmax(err), err.shape) if err.ndim else ()
  return float(err[idx]), idx, g[idx], w[idx]


# --- the checker ----------------------------------------------------------------------

class _Checker:
  """Runs the checks for one function of a flat list of leaves."""

  def __init__(self, prim_fn, args, *, leaf_names, tol, fd_tol, eps, rng,
               report, prims, label="", batch_size=3, batch_in_axes=None,
               linear_argnums=None, order=2, jit=True, per_leaf=True):
    self.prim_fn = prim_fn
    self.fn = jax.jit(prim_fn) if jit else prim_fn
    self.args = args
    self.leaves, self.in_tree = jax.tree.flatten(args)
    self.leaf_names = leaf_names
    self.tol, self.fd_tol, self.eps = tol, fd_tol, eps
    self.rng = rng
    self.report = report
    self.prims = prims
    self.label = label
    self.batch_size = batch_size
    self.batch_in_axes = batch_in_axes
    self.linear_argnums = linear_argnums
    self.order = order
    self.jit = jit
    self.per_leaf = per_leaf
    self.rules = [defined_rules(p) for p in prims]
    self.float_idx = [i for i, x in enumerate(self.leaves) if _is_float(x)]
    out_shape = jax.eval_shape(prim_fn, *args)
    out_paths, self.out_tree = jax.tree_util.tree_flatten_with_path(out_shape)
    _check_arrays("output", "out", out_paths,
                  lambda a: isinstance(a, jax.ShapeDtypeStruct)
                  and _real_or_int(a.dtype))
    self.out_names = ["out" + jax.tree_util.keystr(p) for p, _ in out_paths]
    self.out_avals = [a for _, a in out_paths]
    self.out_float_idx = [i for i, a in enumerate(self.out_avals)
                          if jnp.issubdtype(a.dtype, jnp.floating)]
    self._ref_out = None
    self._jvp_ok = {}  # direction -> bool (did the jvp check pass)

  # -- bookkeeping --

  def has(self, mode) -> bool:
    return all(mode in r for r in self.rules)

  def rule_name(self, mode) -> str:
    names = [r[mode] for r in self.rules if mode in r]
    if not names:  # not a rule's own check: name the primitives
      names = [r["expand"].split(".")[0] for r in self.rules]
    return ", ".join(names)

  def ran(self, mode, what):
    if self.label:  # a sub-check of the second-order mode
      what, mode = f"{self.label}{mode}: {what}", "second_order"
    self.report.ran.append(f"{mode}: {what}")

  def fail(self, mode, check, inputs, detail, max_error=None, rule=None):
    self.report.failures.append(RuleFailure(
        rule=rule or self.rule_name(mode), check=self.label + check,
        inputs=inputs, detail=detail, max_error=max_error))

  def fail_raised(self, mode, check, inputs, exc, rule=None):
    detail = f"raised {type(exc).__name__}: {_first_lines(str(exc))}"
    self.fail(mode, check, inputs, detail, float("inf"), rule=rule)

  def describe_inputs(self, direction=None, extra=None) -> str:
    lines = [f"input {n} = {_fmt_array(x)}"
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
              got_label="rule", want_label="reference", rule=None) -> bool:
    names = names or [self.out_names[i] for i in self.out_float_idx]
    worst = None
    for name, g, w in zip(names, got, want):
      res = _compare_leaf(g, w, tol)
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
                f"{gv:.8g}, {want_label} gives {wv:.8g}; tolerance atol="
                f"{tol.atol:g}, rtol={tol.rtol:g})")
    self.fail(mode, check, inputs, detail, err, rule=rule)
    return False

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
    if self._ref_out is None:
      self._ref_out = self.restrict([], evaluate=True)()
    return self._ref_out

  def random_like(self, x):
    x = np.asarray(x)
    return jnp.asarray(self.rng.standard_normal(x.shape).astype(x.dtype))

  def directions(self) -> list[tuple[int, ...]]:
    dirs = [tuple(self.float_idx)]
    if self.per_leaf and len(self.float_idx) > 1:
      dirs += [(i,) for i in self.float_idx]
    return dirs

  def finite_difference(self, direction, tangents):
    f = self.restrict(direction, evaluate=True)
    xs = [self.leaves[i] for i in direction]
    # numpy arithmetic: no compilation of small eager ops
    xs, tangents = map(_to_numpy, (xs, tangents))
    plus = f(*[jnp.asarray(x + self.eps * t) for x, t in zip(xs, tangents)])
    minus = f(*[jnp.asarray(x - self.eps * t) for x, t in zip(xs, tangents)])
    with np.errstate(invalid="ignore", over="ignore"):
      return [(np.asarray(p) - np.asarray(m)) / (2 * self.eps)
              for p, m in zip(plus, minus)]

  def tangent_reference(self, direction, tangents):
    """J ṫ from the jvp rule when it is defined and passed its own check,
    else from finite differences. Returns (values, label, tolerance)."""
    if self.has("jvp") and self._jvp_ok.get(direction, True):
      try:
        _, t_out = jax.jvp(self.restrict(direction),
                           tuple(self.leaves[i] for i in direction),
                           tuple(tangents))
        return list(t_out), "the jvp rule", self.tol
      except Exception:  # reported by the jvp check
        pass
    return (self.finite_difference(direction, tangents),
            "finite differences of expand", self.fd_tol)

  # -- the checks --

  def check_expand(self):
    inputs = self.describe_inputs()
    closed = jax.make_jaxpr(self.prim_fn)(*self.args)
    applications = []
    try:
      expanded = _eval_expanded(closed.jaxpr, closed.consts, self.leaves,
                                applications)
    except _ExpandStructureError as e:
      self.fail("expand", "expand's output structure matches out_aval", inputs,
                str(e), float("inf"), rule=f"{type(e.prim).__name__}.expand")
      return
    except Exception as e:
      self.fail_raised("expand", "evaluating expand", inputs, e)
      return
    self.ran("expand", "expand's output types match out_aval")
    for prim, _, out, _ in applications:
      for i, (x, aval) in enumerate(zip(jax.tree.leaves(out),
                                        prim.out_avals_flat)):
        got = _core.typeof(x)
        if (getattr(aval, "shape", None) is not None and (
            got.shape != aval.shape or got.dtype != aval.dtype)):
          self.fail("expand", "expand's output types match out_aval", inputs,
                    f"output leaf {i}: expand returned {got.str_short()}, but "
                    f"out_aval declares {aval.str_short()}", float("inf"),
                    rule=f"{type(prim).__name__}.expand")
    expanded = [jnp.asarray(x) for x in expanded]
    for how, fn in [("eager call", self.prim_fn),
                    ("jitted call", jax.jit(self.prim_fn))]:
      try:
        got = jax.tree.leaves(fn(*self.args))
      except Exception as e:
        self.fail_raised("expand", f"{how} vs expand", inputs, e)
        continue
      self.ran("expand", f"{how} vs expand")
      self.compare("expand", f"{how} vs expand", inputs, got, expanded,
                   self.tol, names=self.out_names, got_label=how,
                   want_label="expand")

  def check_jvp(self):
    for direction in self.directions():
      inputs = self.describe_inputs(direction)
      tangents = [self.random_like(self.leaves[i]) for i in direction]
      f = self.restrict(direction)
      xs = tuple(self.leaves[i] for i in direction)
      check = "jvp vs central finite differences of expand"
      try:
        out, t_out = jax.jvp(f, xs, tuple(tangents))
      except Exception as e:
        self.fail_raised("jvp", check, inputs, e)
        self._jvp_ok[direction] = False
        continue
      self.ran("jvp", f"{check} ({self.describe_direction(direction)})")
      ok = self.compare("jvp", "jvp's primal output vs the primitive's output",
                        inputs, out, self.ref_out(), self.tol,
                        got_label="jvp", want_label="the primitive")
      fd = self.finite_difference(direction, tangents)
      ok &= self.compare("jvp", check, inputs, t_out, fd, self.fd_tol,
                         got_label="jvp", want_label="finite differences")
      self._jvp_ok[direction] = ok

  def check_vjp(self):
    self.check_nzs_out("vjp")
    cts_out = [self.random_like(self.ref_out()[k])
               for k in range(len(self.out_float_idx))]
    for direction in self.directions():
      inputs = self.describe_inputs(direction)
      f = self.restrict(direction)
      xs = tuple(self.leaves[i] for i in direction)
      tangents = [self.random_like(self.leaves[i]) for i in direction]
      try:
        out, f_vjp = jax.vjp(f, *xs)
        cts_in = f_vjp(tuple(cts_out))
      except Exception as e:
        self.fail_raised("vjp", "vjp", inputs, e)
        continue
      ref, ref_label, tol = self.tangent_reference(direction, tangents)
      check = f"vjp vs {ref_label} (<ȳ, J ṫ> = <vjp(ȳ), ṫ>)"
      self.ran("vjp", f"{check} ({self.describe_direction(direction)})")
      self.compare("vjp", "vjp's primal output vs the primitive's output",
                   inputs, out, self.ref_out(), self.tol, got_label="vjp",
                   want_label="the primitive")
      lhs, lscale = _inner(cts_out, ref)
      rhs, rscale = _inner(cts_in, tangents)
      bound = (tol.atol * sum(float(np.sum(np.abs(c))) for c in cts_out)
               + tol.rtol * max(lscale, rscale))
      if not abs(lhs - rhs) <= bound:
        self.fail("vjp", check, inputs,
                  f"<ȳ, J ṫ> = {lhs:.8g} with J ṫ from {ref_label}, but "
                  f"<vjp(ȳ), ṫ> = {rhs:.8g}: error {abs(lhs - rhs):.3g} "
                  f"(tolerance {bound:.3g})", abs(lhs - rhs))

  def check_nzs_out(self, mode):
    """Checks the nzs_out each primitive's vjp_fwd / lin declares."""
    method = "vjp_fwd" if mode == "vjp" else "lin"
    for prim, p_args in self.applications():
      name = f"{type(prim).__name__}.{method}"
      p_leaves = jax.tree.leaves(p_args)
      nzs_in = jax.tree.unflatten(prim.in_tree,
                                  [_is_float(x) for x in p_leaves])
      inputs = "\n".join(f"{type(prim).__name__} argument leaf {i} = "
                         f"{_fmt_array(x)}" for i, x in enumerate(p_leaves))
      check = f"{method}'s nzs_out vs the output's derivative"
      try:
        result = getattr(prim, method)(nzs_in, *p_args)
      except Exception as e:
        self.fail_raised(mode, f"calling {method}", inputs, e, rule=name)
        continue
      if not isinstance(result, tuple) or len(result) < 3 or result[2] is None:
        continue
      try:
        nzs_out = _api.tuptree_flags(result[2], prim.out_tree, "nzs_out",
                                     f"the nzs_out returned by {name}")
      except Exception as e:
        self.fail_raised(mode, check, inputs, e, rule=name)
        continue
      zero_outs = [k for k, nz in enumerate(nzs_out)
                   if not nz and jnp.issubdtype(prim.out_avals_flat[k].dtype,
                                                jnp.floating)]
      if not zero_outs:
        continue
      self.ran(mode, f"{check} ({name})")
      sub = _Checker(lambda *a: prim(*a), p_args,
                     leaf_names=[f"leaf {i}" for i in range(len(p_leaves))],
                     tol=self.tol, fd_tol=self.fd_tol, eps=self.eps,
                     rng=self.rng, report=RuleReport([], ""), prims=[prim],
                     jit=self.jit)
      direction = tuple(sub.float_idx)
      if not direction:
        continue
      tangents = [sub.random_like(sub.leaves[i]) for i in direction]
      t_out, label, tol = sub.tangent_reference(direction, tangents)
      out_pos = {k: j for j, k in enumerate(sub.out_float_idx)}
      for k in zero_outs:
        t = np.asarray(t_out[out_pos[k]], np.float64)
        err = float(np.max(np.abs(t))) if t.size else 0.0
        if err > tol.atol:
          self.fail(mode, check, inputs,
                    f"{method} returned nzs_out False for {sub.out_names[k]} "
                    f"(a symbolically zero tangent), but its derivative is "
                    f"nonzero: max |J ṫ| = {err:.3g} from {label}", err,
                    rule=name)

  def applications(self):
    closed = jax.make_jaxpr(self.prim_fn)(*self.args)
    applications = []
    try:
      _eval_expanded(closed.jaxpr, closed.consts, self.leaves, applications)
    except Exception:
      pass  # reported by the expand check
    return [(prim, p_args) for prim, p_args, _, _ in applications]

  def check_lin(self):
    self.check_nzs_out("lin")
    for direction in self.directions():
      inputs = self.describe_inputs(direction)
      f = self.restrict(direction)
      xs = tuple(self.leaves[i] for i in direction)
      tangents = [self.random_like(self.leaves[i]) for i in direction]
      try:
        out, f_lin = jax.linearize(f, *xs)
        t_out = f_lin(*tangents)
      except Exception as e:
        self.fail_raised("lin", "linearize", inputs, e)
        continue
      ref, ref_label, tol = self.tangent_reference(direction, tangents)
      check = f"linearized vs {ref_label}"
      self.ran("lin", f"{check} ({self.describe_direction(direction)})")
      self.compare("lin", "lin's primal output vs the primitive's output",
                   inputs, out, self.ref_out(), self.tol, got_label="lin",
                   want_label="the primitive")
      self.compare("lin", check, inputs, t_out, ref, tol,
                   got_label="linearized", want_label=ref_label)

  def linear_sets(self):
    """The sets of leaves in which prim_fn is linear (each transposed alone)."""
    arg_leaves = []
    start = 0
    for a in self.args:
      n = len(jax.tree.leaves(a))
      arg_leaves.append(tuple(range(start, start + n)))
      start += n
    if self.linear_argnums is not None:
      sets = []
      for entry in self.linear_argnums:
        nums = (entry,) if isinstance(entry, int) else tuple(entry)
        sets.append(tuple(i for n in nums for i in arg_leaves[n]))
      return sets, None
    sets = []
    for n, idx in enumerate(arg_leaves):
      if idx and all(i in self.float_idx for i in idx) and self.is_linear(idx):
        sets.append(idx)
    return sets, "detected numerically"

  def is_linear(self, direction) -> bool:
    f = self.restrict(direction, evaluate=True)
    try:
      zero = f(*[jnp.asarray(np.zeros_like(self.leaves[i])) for i in direction])
      u = [self.random_like(self.leaves[i]) for i in direction]
      v = [self.random_like(self.leaves[i]) for i in direction]
      fu, fv = f(*u), f(*v)
      fuv = f(*[jnp.asarray(0.75 * np.asarray(a) - 1.5 * np.asarray(b))
                for a, b in zip(u, v)])
    except Exception:
      return False
    for z, a, b, ab in zip(zero, fu, fv, fuv):
      want = 0.75 * np.asarray(a) - 1.5 * np.asarray(b)
      if (_compare_leaf(z, np.zeros_like(z), self.fd_tol) is not None
          or _compare_leaf(ab, want, self.fd_tol) is not None):
        return False
    return bool(zero)

  def check_transpose(self):
    sets, how = self.linear_sets()
    if not sets:
      self.fail("transpose", "transpose", self.describe_inputs(),
                "the primitive defines a transpose rule, but prim_fn is not "
                "linear in any one argument on this input; pass "
                "linear_argnums= to say which arguments are linear",
                float("inf"))
      return
    for direction in sets:
      names = ", ".join(self.leaf_names[i] for i in direction)
      inputs = self.describe_inputs(extra=f"transposed in {names}" + (
          f" ({how})" if how else ""))
      f = self.restrict(direction)
      f_eval = self.restrict(direction, evaluate=True)
      xs = tuple(self.leaves[i] for i in direction)
      cts_out = tuple(self.random_like(y) for y in self.ref_out())
      try:
        cts_in = jax.linear_transpose(f, *xs)(cts_out)
      except Exception as e:
        self.fail_raised("transpose", "linear_transpose", inputs, e)
        continue
      check = "transpose vs the linear map (<ȳ, A ṫ> = <Aᵀ ȳ, ṫ>)"
      self.ran("transpose", f"{check} (in {names})")
      for k in range(len(direction)) if len(direction) > 1 else [None]:
        tangents = [self.random_like(x) if k in (None, j)
                    else jnp.asarray(np.zeros_like(x)) for j, x in enumerate(xs)]
        lhs, lscale = _inner(cts_out, f_eval(*tangents))
        rhs, rscale = _inner(cts_in, tangents)
        bound = (self.tol.atol * sum(float(np.sum(np.abs(c))) for c in cts_out)
                 + self.tol.rtol * max(lscale, rscale))
        if not abs(lhs - rhs) <= bound:
          leaf = names if k is None else self.leaf_names[direction[k]]
          self.fail("transpose", check, inputs,
                    f"cotangent for {leaf}: <ȳ, A ṫ> = {lhs:.8g}, but "
                    f"<transpose(ȳ), ṫ> = {rhs:.8g}: error {abs(lhs - rhs):.3g} "
                    f"(tolerance {bound:.3g})", abs(lhs - rhs))
          break

  # -- batching --

  def batch_variants(self, arg):
    """``batch_size`` variants of ``arg`` stacked on a new leading axis:
    the first is ``arg`` itself, the others perturb its floating-point leaves
    (integer leaves are repeated, as they may be indices)."""
    def stack(x):
      x = np.asarray(x)
      if not _is_float(x):
        return np.stack([x] * self.batch_size)
      noise = lambda: self.rng.standard_normal(x.shape).astype(x.dtype)
      vs = [x] + [x * (1 + 0.2 * noise()) + 0.1 * noise()
                  for _ in range(self.batch_size - 1)]
      return np.stack(vs)
    return jax.tree.map(stack, arg)

  def batch_combinations(self):
    n = len(self.args)
    if self.batch_in_axes is not None:
      return [tuple(a) if isinstance(a, (tuple, list)) else (a,)
              for a in self.batch_in_axes]
    subsets = [s for r in range(1, n + 1)
               for s in itertools.combinations(range(n), r)]
    if len(subsets) > 15:  # many arguments: each alone, and all together
      subsets = [(i,) for i in range(n)] + [tuple(range(n))]
    combos = []
    for s in subsets:
      combos.append(tuple(0 if i in s else None for i in range(n)))
      last = tuple(jax.tree.map(lambda x: np.ndim(x), self.args[i])
                   if i in s else None for i in range(n))
      if any(np.ndim(x) > 0 for i in s for x in jax.tree.leaves(self.args[i])):
        combos.append(last)
    return combos

  def check_batch(self):
    stacked = [self.batch_variants(a) for a in self.args]
    refs = {}
    for in_axes in self.batch_combinations():
      batched = tuple(i for i, ax in enumerate(in_axes) if ax is not None)
      desc = f"vmap with in_axes={in_axes}, batch size {self.batch_size}"
      inputs = self.describe_inputs(extra=desc)
      if batched not in refs:
        try:
          outs = []
          for k in range(self.batch_size):
            args_k = [jax.tree.map(lambda x: jnp.asarray(x[k]), stacked[i])
                      if i in batched else a for i, a in enumerate(self.args)]
            outs.append(jax.tree.leaves(self.fn(*args_k)))
          refs[batched] = [np.stack(ys) for ys in zip(*outs)]
        except Exception as e:
          self.fail_raised("batch", "loop over the batch", inputs, e,
                           rule="prim_fn")
          continue
      args_b = []
      for i, ax in enumerate(in_axes):
        if ax is None:
          args_b.append(self.args[i])
        else:
          axes = (jax.tree.map(lambda _: ax, self.args[i])
                  if isinstance(ax, int) else ax)
          args_b.append(jax.tree.map(
              lambda x, d: jnp.asarray(np.moveaxis(x, 0, d)), stacked[i], axes))
      check = "vmap vs a loop over the batch"
      try:
        got = jax.tree.leaves(jax.vmap(self.prim_fn, in_axes=in_axes)(*args_b))
      except Exception as e:
        self.fail_raised("batch", check, inputs, e)
        continue
      self.ran("batch", f"{check} (in_axes={in_axes})")
      self.compare("batch", check, inputs, got, refs[batched], self.tol,
                   names=self.out_names, got_label="vmap",
                   want_label="the loop")
    if self.batch_in_axes is None:
      self.check_batched_derivatives(stacked)

  def check_batched_derivatives(self, stacked):
    direction = tuple(self.float_idx)
    if not direction or not self.out_float_idx:
      return
    leaves_b = jax.tree.leaves(stacked)
    xs = [jnp.asarray(leaves_b[i]) for i in direction]
    f = self.restrict(direction)
    inputs = self.describe_inputs(
        extra=f"all arguments batched along axis 0, batch size "
              f"{self.batch_size}")
    ts = [self.random_like(x) for x in xs]
    cts = [self.random_like(np.stack([y] * self.batch_size))
           for y in self.ref_out()]
    cases = []
    if self.has("jvp"):
      cases.append(("vmap of jvp vs a loop", lambda x, t: jax.jvp(f, x, t)[1],
                    (xs, ts)))
    if self.has("vjp"):
      cases.append(("vmap of vjp vs a loop",
                    lambda x, c: jax.vjp(f, *x)[1](tuple(c)), (xs, cts)))
    for check, g, (a, b) in cases:
      try:
        got = jax.tree.leaves(jax.vmap(lambda a, b: g(tuple(a), tuple(b)))(
            a, b))
        a_np, b_np = _to_numpy(a), _to_numpy(b)
        want = [jax.tree.leaves(g(tuple(jnp.asarray(x[k]) for x in a_np),
                                  tuple(jnp.asarray(y[k]) for y in b_np)))
                for k in range(self.batch_size)]
        want = [np.stack(ys) for ys in zip(*want)]
      except Exception as e:
        self.fail_raised("batch", check, inputs, e)
        continue
      self.ran("batch", check)
      names = ([self.out_names[i] for i in self.out_float_idx]
               if "jvp" in check else [self.leaf_names[i] for i in direction])
      self.compare("batch", check, inputs, got, want, self.tol, names=names,
                   got_label="vmap", want_label="the loop")

  # -- second order --

  def check_second_order(self, modes):
    direction = tuple(self.float_idx)
    if not direction or not self.out_float_idx:
      self.report.skipped.append(
          ("second_order", self.label + "no floating-point inputs or outputs"))
      return
    f = self.restrict(direction)
    xs = [self.leaves[i] for i in direction]
    x_names = [self.leaf_names[i] for i in direction]
    out_names = [self.out_names[i] for i in self.out_float_idx]
    n = len(xs)
    derived = []
    if self.has("jvp") and "jvp" in modes:
      derived.append((
          "jvp", "the tangent map x, ṫ -> jvp(f, x, ṫ)[1]",
          lambda *a: jax.jvp(f, tuple(a[:n]), tuple(a[n:]))[1],
          xs + [self.random_like(x) for x in xs],
          x_names + [f"ṫ for {m}" for m in x_names]))
    if self.has("vjp") and "vjp" in modes:
      derived.append((
          "vjp", "the backward pass x, ȳ -> vjp(f, x)[1](ȳ)",
          lambda *a: jax.vjp(f, *a[:n])[1](tuple(a[n:])),
          xs + [self.random_like(y) for y in self.ref_out()],
          x_names + [f"ȳ for {m}" for m in out_names]))
    if self.has("lin") and "lin" in modes:
      derived.append((
          "lin", "the linearized map x, ṫ -> linearize(f, x)[1](ṫ)",
          lambda *a: jax.linearize(f, *a[:n])[1](*a[n:]),
          xs + [self.random_like(x) for x in xs],
          x_names + [f"ṫ for {m}" for m in x_names]))
    for kind, what, g, g_args, names in derived:
      try:
        closed = jax.make_jaxpr(g)(*g_args)
        live, _ = _pe.dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars))
        prims = _find_hiprims(live, [])
      except Exception as e:
        self.fail_raised("second_order", f"tracing {what}",
                         self.describe_inputs(), e, rule=self.rule_name(kind))
        continue
      if not prims:
        self.report.skipped.append(
            ("second_order", f"{self.label}{what} binds no hijax primitive"))
        continue
      sub = _Checker(g, tuple(g_args), leaf_names=names, tol=self.tol,
                     fd_tol=self.fd_tol, eps=self.eps, rng=self.rng,
                     report=self.report, prims=prims,
                     label=f"{self.label}second order, on {what}: ",
                     order=self.order - 1, jit=self.jit, per_leaf=False)
      sub_modes = [m for m in _DERIVATIVE_MODES if m in modes and sub.has(m)]
      if not sub_modes:
        self.report.skipped.append(
            ("second_order", f"{self.label}{what}: its primitives "
             f"({', '.join(type(p).__name__ for p in prims)}) define no "
             "derivative rule"))
      sub.run(sub_modes + (["second_order"] if sub.order > 1 else []),
              modes)

  def run(self, modes, all_modes=None):
    all_modes = modes if all_modes is None else all_modes
    for mode in modes:
      if mode in _DERIVATIVE_MODES and not self.float_idx:
        self.report.skipped.append((mode, self.label + "no floating-point "
                                    "inputs to differentiate"))
      elif mode in _DERIVATIVE_MODES + ("transpose",) and not self.out_float_idx:
        self.report.skipped.append((mode, self.label + "no floating-point "
                                    "outputs"))
      else:
        try:
          if mode == "second_order":
            self.check_second_order(all_modes)
          else:
            getattr(self, f"check_{mode}")()
        except Exception as e:  # e.g. prim_fn fails to evaluate under jit
          self.fail_raised(mode, f"running the {mode} checks",
                           self.describe_inputs(), e)


def _real_or_int(dtype) -> bool:
  return any(jnp.issubdtype(dtype, t) for t in (jnp.floating, jnp.integer,
                                                jnp.bool_))


def _check_arrays(what, root, paths_and_leaves, ok):
  for path, x in paths_and_leaves:
    try:
      good = ok(x)
    except Exception:  # e.g. np.asarray of a hi value
      good = False
    if not good:
      try:
        desc = (x if isinstance(x, _core.AbstractValue)
                else _core.typeof(x)).str_short()
      except Exception:
        desc = f"a {type(x).__name__}"
      raise TypeError(
          f"check_rules checks functions of arrays (and pytrees of arrays) "
          f"with real or integer dtypes, but {what} {root}"
          f"{jax.tree_util.keystr(path)} is {desc}; hi types and complex "
          "numbers are not supported")


def _to_numpy(xs):
  return [np.asarray(x) for x in xs]


def _first_lines(s, n=6):
  lines = s.strip().splitlines()
  return "\n".join(lines[:n] + (["..."] if len(lines) > n else []))


# --- the entry points -------------------------------------------------------------------

def _to_dtype(x, dtype):
  x = jnp.asarray(x)
  if _is_float(x):
    return jnp.array(x, dtype=dtype)
  return jnp.array(x, dtype=x.dtype)  # drops weak types


def check_rules(prim_fn: Callable, *args, modes: Iterable[str] | str | None = None,
                atol: float | None = None, rtol: float | None = None,
                eps: float | None = None, x64: bool | None = None,
                seed: int = 0, batch_size: int = 3,
                batch_in_axes: Sequence[Any] | None = None,
                linear_argnums: Sequence[int | Sequence[int]] | None = None,
                order: int = 2, jit: bool = True,
                raise_on_failure: bool = True) -> RuleReport:
  """Checks the rules of the hijax primitives that ``prim_fn`` binds.

  Args:
    prim_fn: a function of ``args`` that builds and applies a hijax primitive,
      like ``lambda x: Log1pExp(jax.typeof(x))(x)``. It is traced once with
      ``jax.make_jaxpr`` to find the primitives it binds (their instances are
      the ``prim`` parameter of the equations) and which rules they define.
      The checks transform ``prim_fn`` as a whole, so it may also do other
      JAX operations or bind several primitives; a mode runs when every
      primitive found defines its rule. Static data (functions, shapes) is
      closed over, not passed in ``args``.
    *args: the point to check at: pytrees of arrays (or Python scalars) of
      real or integer dtypes (hi types and complex numbers are not supported).
      Floating-point leaves are differentiated; integer and boolean leaves are
      not (they are held fixed, and kept equal across the batch in the batching
      check, since they may be indices). Choose a point where the primitive is
      smooth: finite differences step ``eps`` either side.
    modes: the checks to run, a subset of `MODES`. By default, every mode whose
      rules the primitives define. Naming a mode whose rule is not defined is a
      ``ValueError``.
    atol, rtol: the tolerances of every comparison, ``|got - want| <= atol +
      rtol |want|``. By default ``1e-6`` and ``1e-5`` when the checks run in
      float64; in float32, ``1e-5`` and ``1e-4`` between rules, and ``1e-3``
      for finite differences.
    eps: the finite-difference step (``1e-6`` in float64, ``1e-3`` in float32).
    x64: run in float64 (floating-point leaves of ``args`` are converted, under
      ``jax.enable_x64``). The default, None, tries float64 and falls back to
      the given dtypes if ``prim_fn`` cannot be traced in float64 (e.g. a
      primitive that hard-codes float32 types).
    seed: seeds the random tangents, cotangents and batch perturbations.
    batch_size: the batch size of the batching checks.
    batch_in_axes: the ``in_axes`` values to check ``vmap`` with (one per
      entry), instead of every combination of batched (along the first or the
      last axis) and unbatched arguments. Use it for a `batch` rule that
      supports only some combinations.
    linear_argnums: for the transpose check, the arguments in which
      ``prim_fn`` is linear, as a list whose entries are an argument index or
      a tuple of indices transposed together. By default each argument is
      tested numerically for linearity and the linear ones are transposed one
      at a time.
    order: 2 (the default) also checks the rules of the primitives that the
      first-order rules bind (see the ``"second_order"`` mode); 1 does not.
      Higher values recurse further.
    jit: compute the references (finite differences, loops over a batch,
      plain evaluations) with ``jax.jit(prim_fn)``, which compiles once for
      all of them. The transformations under test (``jax.jvp``, ``jax.vjp``,
      ``jax.vmap``, ...) are applied to ``prim_fn`` itself either way. With
      False, the references run eagerly too: slower, but an `expand` that
      branches in Python on values works (leave out the ``"expand"`` mode,
      whose check includes a jitted call).
    raise_on_failure: when False, return the report with its ``failures``
      instead of raising.

  Returns:
    A `RuleReport` listing the checks that ran and the modes skipped.

  Raises:
    RuleCheckError: (an ``AssertionError``) if a check fails. Its message has
      one paragraph per failure naming the rule, the check, the input and the
      largest error.
  """
  __tracebackhide__ = True  # pylint: disable=unused-variable
  if isinstance(modes, str):
    modes = (modes,)
  explicit = modes is not None
  modes = list(MODES if modes is None else modes)
  unknown = [m for m in modes if m not in MODES]
  if unknown:
    raise ValueError(f"unknown mode(s) {unknown}; the modes are {MODES}")

  _check_arrays("argument", "args",
                jax.tree_util.tree_flatten_with_path(args)[0],
                lambda x: _real_or_int(jnp.result_type(x)))
  with contextlib.ExitStack() as stack:
    dtype = None
    if x64 is not False:
      with jax.enable_x64(True):
        args64 = jax.tree.map(lambda x: _to_dtype(x, jnp.float64), args)
        try:
          jax.make_jaxpr(prim_fn)(*args64)
          ok64 = True
        except Exception:
          if x64:
            raise
          ok64 = False
      if ok64:
        stack.enter_context(jax.enable_x64(True))
        args, dtype = args64, "float64"
    if dtype is None:
      args = jax.tree.map(lambda x: _to_dtype(x, jnp.result_type(x)), args)
      floats = [x.dtype for x in jax.tree.leaves(args) if _is_float(x)]
      dtype = str(floats[0]) if floats else "no floating-point inputs"
    wide = dtype == "float64"
    tol = _Tol(atol if atol is not None else (1e-6 if wide else 1e-5),
               rtol if rtol is not None else (1e-5 if wide else 1e-4))
    fd_tol = _Tol(atol if atol is not None else (1e-6 if wide else 1e-3),
                  rtol if rtol is not None else (1e-5 if wide else 1e-3))
    eps = eps if eps is not None else (1e-6 if wide else 1e-3)

    closed = jax.make_jaxpr(prim_fn)(*args)
    prims = _find_hiprims(closed.jaxpr, [])
    if not prims:
      raise ValueError(
          "prim_fn binds no hijax primitive: pass a function that applies one, "
          "e.g. lambda x: MyPrim(jax.typeof(x))(x)")
    report = RuleReport([repr(p) for p in prims], dtype)
    paths = jax.tree_util.tree_flatten_with_path(args)[0]
    names = [f"args[{p[0].idx}]" + jax.tree_util.keystr(p[1:])
             for p, _ in paths]
    checker = _Checker(prim_fn, args, leaf_names=names, tol=tol, fd_tol=fd_tol,
                       eps=eps, rng=np.random.default_rng(seed), report=report,
                       prims=prims, batch_size=batch_size,
                       batch_in_axes=batch_in_axes,
                       linear_argnums=linear_argnums, order=order, jit=jit)
    to_run = []
    for mode in modes:
      if mode == "second_order":
        if order < 2:
          report.skipped.append((mode, "order < 2"))
        elif any(checker.has(m) for m in _DERIVATIVE_MODES if m in modes):
          to_run.append(mode)
        else:
          report.skipped.append((mode, "no first-order derivative mode runs"))
      elif checker.has(mode):
        to_run.append(mode)
      elif explicit:
        missing = [type(p).__name__ for p, r in zip(prims, checker.rules)
                   if mode not in r]
        raise ValueError(f"mode {mode!r} was requested, but {', '.join(missing)} "
                         f"define(s) no {mode} rule")
      else:
        report.skipped.append((mode, "rule not defined"))
    checker.run(to_run, modes)

  if report.failures and raise_on_failure:
    raise RuleCheckError(report)
  return report


def assert_rules(prim_fn: Callable, *args, **kwargs) -> RuleReport:
  """`check_rules` for test suites: same arguments, same `RuleCheckError`.

  Pytest hides this module's frames from the traceback, so a failing test
  shows the call and the message naming the rule, the input and the error.
  """
  __tracebackhide__ = True  # pylint: disable=unused-variable
  kwargs["raise_on_failure"] = True
  return check_rules(prim_fn, *args, **kwargs)
