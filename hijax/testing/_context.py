"""The three values one check works with: `Settings` (the run's options), the
`Point` checked (a function at flat leaves, with the program that evaluates
it), and the `Writer` of the report."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hijax._internals import partial_eval as _pe
from hijax.testing._compiled import (Budget, Compiled, derivative_part,
                                     replaced)
from hijax.testing._discovery import Surrogates, applications, defined_rules
from hijax.testing._finite_diff import (BOUNDED, REASONS, UNRESOLVED,
                                       FDEstimate, estimate, scaled_tangents,
                                       wider)
from hijax.testing._numerics import (Tol, check_arrays, compare_leaf,
                                     describe_tol, dtype_of,
                                     fmt_array, is_float, judged_elements,
                                     on_device, real_or_int, to_numpy)
from hijax.testing._report import (DERIVATIVE_MODES, KINK, NOT_RESOLVED,
                                   RuleFailure, RuleReport, declared_limit,
                                   first_lines)


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
  require_second_order: bool = False  # a declared limit fails too
  budget: Budget = dataclasses.field(default_factory=lambda: Budget(None))
  surrogates: Surrogates = dataclasses.field(default_factory=Surrogates)
  modes: tuple[str, ...] = ()  # the modes asked for


@dataclasses.dataclass
class _Memo:
  fd: dict = dataclasses.field(default_factory=dict)  # direction -> estimate
  ref_out: tuple | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class Point:
  """``fn`` of the flat ``leaves`` of ``args`` (named ``names``), the
  primitives it applies, and ``compiled``, which evaluates it and its
  derivatives (`of` builds one)."""
  fn: Callable
  args: tuple
  names: list[str]
  prims: list
  compiled: Compiled
  rng: np.random.Generator
  leaves: list
  in_tree: Any
  rules: list[dict]
  surrogate: bool  # never compared with finite differences
  float_idx: list[int]
  out_names: list[str]
  out_avals: list
  out_float_idx: list[int]
  per_leaf: bool = True  # also differentiate each input alone
  fd_scale: float | None = None  # the size of the values fn combines
  _memo: _Memo = dataclasses.field(default_factory=_Memo, repr=False)

  @classmethod
  def of(cls, fn, args, names, prims, settings: Settings, rng,
         compiled: Compiled | None = None, **kw) -> Point:
    args = tuple(args)
    leaves, in_tree = jax.tree.flatten(args)
    out_paths = jax.tree_util.tree_flatten_with_path(
        jax.eval_shape(fn, *args))[0]
    check_arrays("output", "out", out_paths,
                 lambda a: isinstance(a, jax.ShapeDtypeStruct)
                 and real_or_int(a.dtype))
    avals = [a for _, a in out_paths]
    return cls(
        fn, args, names, prims, compiled or Compiled(
            fn, args, settings.jit, budget=settings.budget), rng, leaves,
        in_tree, [defined_rules(p) for p in prims],
        any(p in settings.surrogates for p in prims),
        [i for i, x in enumerate(leaves) if is_float(x)],
        ["out" + jax.tree_util.keystr(p) for p, _ in out_paths], avals,
        [i for i, a in enumerate(avals)
         if jnp.issubdtype(a.dtype, jnp.inexact)], **kw)

  def has(self, mode) -> bool:
    return all(mode in r for r in self.rules)

  @property
  def fd_of(self) -> str:
    """``expand`` (hijax primitives) or ``the function`` (custom_jvp/vjp)."""
    return ("expand" if all(hasattr(p, "in_avals") for p in self.prims)
            else "the function")

  def rule_name(self, mode) -> str:
    # not a rule's own check: name the primitives
    return ", ".join([r[mode] for r in self.rules if mode in r]
                     or [r["expand"].split(".")[0] for r in self.rules])

  def describe_inputs(self, direction=None, extra=None) -> str:
    return "\n".join(
        [f"input {n} = {fmt_array(x)}"
         for n, x in zip(self.names, self.leaves)]
        + (["tangent/cotangent on " + self.describe_direction(direction)]
           if direction is not None else []) + ([extra] if extra else []))

  def describe_direction(self, direction) -> str:
    if len(direction) == len(self.float_idx) and len(direction) > 1:
      return "all floating-point inputs"
    return ", ".join(self.names[i] for i in direction) + (
        " only (the others get symbolic zeros)" if len(self.float_idx) > 1
        else "")

  def directions(self) -> list[tuple[int, ...]]:
    each = self.per_leaf and len(self.float_idx) > 1
    return [tuple(self.float_idx)] + [(i,) for i in self.float_idx if each]

  def xs_of(self, direction) -> list:
    return [self.leaves[i] for i in direction]

  def zeros_like_inputs(self, direction) -> list:
    return [np.zeros(np.shape(self.leaves[i]), dtype_of(self.leaves[i]))
            for i in direction]

  def zeros_like_outputs(self) -> list:
    return [np.zeros(self.out_avals[i].shape, self.out_avals[i].dtype)
            for i in self.out_float_idx]

  def restrict(self, direction, evaluate=False) -> Callable:
    """``fn`` of the leaves in ``direction`` (others fixed), returning its
    floating-point output leaves."""
    def f(*xs):
      full = replaced(self.leaves, direction, xs)
      if evaluate:
        out = [on_device(y) for y in self.compiled.evaluate([full])[0]]
      else:
        out = jax.tree.leaves(self.fn(*jax.tree.unflatten(self.in_tree,
                                                          full)))
      return tuple(out[i] for i in self.out_float_idx)
    return f

  @functools.cached_property
  def application_values(self) -> list:
    """The arguments of each primitive applied outside loops and branches."""
    def application_inputs(*args):
      return [a for _, a in applications(self.fn, args)]
    if self.compiled.jit:
      try:
        return jax.jit(application_inputs)(*self.args)
      except Exception:  # pylint: disable=broad-except  (eagerly: same values)
        pass
    return application_inputs(*self.args)

  @functools.cached_property
  def primal_reads_tangent(self) -> bool:
    """Whether ``jax.jvp``'s primal output depends on the tangent (JAX then
    refuses to linearize in a declared limit's words)."""
    if not self.has("jvp") or not self.float_idx or not self.out_float_idx:
      return False
    d = tuple(self.float_idx)
    f = self.restrict(d)
    try:
      closed = jax.make_jaxpr(lambda xs, ts: jax.jvp(f, tuple(xs), tuple(
          ts))[0])(self.xs_of(d), self.zeros_like_inputs(d))
    except Exception:  # pylint: disable=broad-except  (the jvp check reports it)
      return False
    _, used = _pe.dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars))
    return any(used[len(d):])

  def ref_out(self) -> tuple:
    """The floating-point outputs at the point."""
    out = self._memo.ref_out
    if out is None:
      out = self._memo.ref_out = self.restrict([], evaluate=True)()
    return out

  def random_like(self, x, rng: np.random.Generator | None = None):
    rng, x = self.rng if rng is None else rng, np.asarray(x)
    v = rng.standard_normal(x.shape)
    if np.iscomplexobj(x):
      v = v + 1j * rng.standard_normal(x.shape)
    return on_device(v.astype(x.dtype))

  def fd(self, direction, w: Writer) -> FDEstimate:
    """Central differences along ``direction`` (once per direction); ``w``
    reports the elements they cannot judge."""
    if direction not in self._memo.fd:
      est = self._memo.fd[direction] = self.fd_along(
          direction, scaled_tangents(self.rng, self.xs_of(direction)),
          w.settings.eps)
      names = [self.out_names[i] for i in self.out_float_idx]
      for verdict, reason in REASONS.items():
        at = [name + (str(tuple(int(i) for i in idx)) if s.ndim else "")
              for name, s in zip(names, est.status)
              for idx in np.argwhere(s == verdict)[:3]]
        if at:
          w.inconclusive(
              f"finite differences ({self.describe_direction(direction)})",
              f"{est.count(verdict)} output element(s) {reason} (at "
              f"{', '.join(at[:3])}{', ...' if len(at) > 3 else ''})"
              + (": compared with that bound only" if verdict == BOUNDED
                 else ": not compared with finite differences"),
              {UNRESOLVED: NOT_RESOLVED, BOUNDED: None}.get(verdict, KINK))
    return self._memo.fd[direction]

  def fd_along(self, direction, tangents, eps) -> FDEstimate:
    """Central differences along ``tangents``, not cached nor reported."""
    xs, ts = to_numpy(self.xs_of(direction)), to_numpy(tangents)
    out_dtypes = [self.out_avals[i].dtype for i in self.out_float_idx]

    def evaluate(points):  # the floating-point outputs, one compiled call
      return [[outs[i] for i in self.out_float_idx]
              for outs in self.compiled.at_points(direction, points)]
    # in the next wider dtype, where fn takes and returns it
    wide = [x.astype(wider(x.dtype) or x.dtype) for x in xs]
    want = [np.dtype(wider(d) or d) for d in out_dtypes]
    x64 = any(w.dtype != x.dtype and w.dtype in (np.float64, np.complex128)
              for w, x in zip(wide, xs))
    if any(w.dtype != x.dtype for w, x in zip(wide, xs)):
      with jax.enable_x64(True) if x64 else contextlib.nullcontext():
        try:
          est = estimate(evaluate, wide, [t.astype(w.dtype) for t, w in zip(
              ts, wide)], want, None, eps, cast_to=out_dtypes,
                         tangent_dtypes=[t.dtype for t in ts],
                         combines=self.fd_scale)
          if [np.asarray(y).dtype for y in est.center] == want:
            return est
        except Exception:  # pylint: disable=broad-except  (types fixed by the primitive)
          pass
    est = estimate(evaluate, xs, ts, out_dtypes, self._memo.ref_out, eps,
                   combines=self.fd_scale)
    if self._memo.ref_out is None:  # the point was evaluated with the others
      self._memo.ref_out = tuple(on_device(y) for y in est.center)
    return est

  def add_derivative(self, kind, direction):
    """Adds the part ``jax.jvp`` (``vjp``, ``linearize``) in the leaves of
    ``direction``, the others fixed."""
    f = self.restrict(direction)

    def part(xs, extra):  # extra: tangents (a cotangent for vjp)
      if kind == "jvp":
        return jax.jvp(f, tuple(xs), tuple(extra))
      out, f_vjp = (jax.vjp if kind == "vjp" else jax.linearize)(f, *xs)
      return out, f_vjp(tuple(extra)) if kind == "vjp" else f_vjp(*extra)
    extra = (self.zeros_like_outputs if kind == "vjp"
             else lambda: self.zeros_like_inputs(direction))
    self.compiled.add(derivative_part(kind, direction), part,
                      lambda: (self.xs_of(direction), extra()))

  def derivative(self, kind, direction, extra, xs=None):
    """``(out, J ṫ)`` (``Jᵀ ȳ`` for vjp) of ``kind`` in the leaves of
    ``direction``, at ``xs`` (default: the point)."""
    if not self.compiled.has(derivative_part(kind, direction)):
      self.add_derivative(kind, direction)
    return self.compiled.run(derivative_part(kind, direction), (
        self.xs_of(direction) if xs is None else list(xs), list(extra)))

  def primal_floors(self, w: Writer, all_outputs=False,
                    computed_only=False) -> list:
    """Per output, the error allowed between two evaluations at the point."""
    floors = [None] * len(self.out_float_idx)
    direction = tuple(self.float_idx)
    if direction and self.out_float_idx and not (
        computed_only and direction not in self._memo.fd):
      try:
        floors = list(self.fd(direction, w).floors)
      except Exception:  # pylint: disable=broad-except  (the checks report it)
        pass
    by_out = dict(zip(self.out_float_idx, floors))
    return ([by_out.get(i) for i in range(len(self.out_avals))]
            if all_outputs else floors)

  def judged(self, direction, bounds=None, est=None) -> list[np.ndarray]:
    """Per output, the elements a reference along ``direction`` judges."""
    est = self._memo.fd.get(direction) if est is None else est
    return [np.ones(np.shape(y), bool)
            & (True if est is None else ~est.skipped()[k])
            & (True if bounds is None else np.isfinite(bounds[k]))
            for k, y in enumerate(self.ref_out())]


@dataclasses.dataclass
class Writer:
  """Writes what the checks of ``point`` find into ``report`` (``label``
  prefixes its lines; ``within``: the mode a sub-check runs under)."""
  report: RuleReport
  point: Point
  settings: Settings
  label: str = ""
  within: str | None = None

  def ran(self, mode, what):
    what = f"{self.label}{mode}: {what}" if self.within else self.label + what
    self.report.ran.append(f"{self.within or mode}: {what}")
    self.report._modes.add(self.within or mode)  # pylint: disable=protected-access

  def skip(self, mode, why):
    self.report.skipped.append((mode, self.label + why))

  def skip_by_intent(self, mode, why, rule=None):
    """Skips a check a surrogate's or a refusing rule cannot pass by design;
    the rule is then not required (`RuleReport.by_intent`)."""
    self.skip(mode, why)
    name = rule or self.point.rule_name(mode)
    if name not in self.report.by_intent:
      self.report.by_intent.append(name)

  def out_of_time(self, mode, what) -> bool:
    """Whether the budget is spent (the check skipped for time)."""
    label = f"{self.label}{mode}: {what}"
    if self.settings.budget.spent:
      self.report.skipped_for_time.append(label)
      return True
    self.settings.budget.starting(label)
    return False

  def inconclusive(self, check, why, cause=None):
    """Records an inconclusive comparison (``cause``: `NOT_RESOLVED` or
    `KINK`, for the report's hint)."""
    self.report.inconclusive.append(f"{self.label}{check}: {why}")
    if cause:
      self.report._causes.add(cause)  # pylint: disable=protected-access

  def judged_nothing(self, check, why):
    self.report.unjudged += 1
    self.inconclusive(check, why)

  def conclusive_pass(self, mode, rule=None):
    if mode != "second_order":
      name = rule or self.point.rule_name(mode)
      self.report.compared[name] = self.report.compared.get(name, 0) + 1

  def fail(self, mode, check, inputs, detail, max_error=None, rule=None,
           error=None):
    self.report.failures.append(RuleFailure(
        rule=rule or self.point.rule_name(mode), check=self.label + check,
        inputs=inputs, detail=detail, max_error=max_error, error=error))

  def fail_raised(self, mode, check, inputs, exc, rule=None):
    p, why = self.point, None  # a refusal by design (a surrogate's: more)
    if (p.surrogate or mode in DERIVATIVE_MODES + ("batch", "second_order")
        ) and not (mode == "second_order"
                   and self.settings.require_second_order):
      why = declared_limit(exc, not p.surrogate, p.surrogate)
    if why is None:
      self.fail(mode, check, inputs, f"raised {type(exc).__name__}: "
                f"{first_lines(str(exc))}", float("inf"), rule=rule, error=exc)
    elif mode != "jvp" and p.primal_reads_tangent:
      # a declared limit in JAX's words that is in fact a broken jvp rule
      self.fail(mode, check, inputs, f"raised {why}\nthe jvp rule's primal "
                "output depends on the tangent, so JAX cannot linearize it: "
                "compute the primal output from the primals alone",
                float("inf"), rule=p.rule_name("jvp"), error=exc)
    else:
      short = why if len(why) <= 160 else why[:157] + "..."
      who = "the surrogate" if p.surrogate else "the rule"
      self.skip_by_intent(mode, f"{check}: {who} declares it cannot "
                          f"({short})", rule)

  def judge_refusals(self, mode, refusals, handled_some: bool):
    """Where the rule raised: skipped where it handled other cases, else
    failed."""
    for check, inputs, exc, why in refusals:
      if handled_some:
        self.skip(mode, why)
      else:
        self.fail_raised(mode, check, inputs, exc)

  def compare(self, mode, check, inputs, got, want, tol, names=None,
              got_label="rule", want_label="reference", rule=None,
              bounds=None, skip=None, floors=None, counts=True,
              uncounted=None, own=None) -> bool:
    """Compares lists of arrays leaf by leaf, failing at the worst."""
    p = self.point
    names = names or [p.out_names[i] for i in p.out_float_idx]
    bounds, skip, floors, uncounted, own = (
        x or [None] * len(want) for x in (bounds, skip, floors, uncounted, own))
    worst, judged = None, 0
    for name, g, w, b, k, fl, u, o in zip(names, got, want, bounds, skip,
                                          floors, uncounted, own):
      if fl is not None:
        b = fl if b is None else b + fl
      res = compare_leaf(g, w, tol, b, k, o)
      if u is not None:  # bounded only: counted where the rule is exact
        u = np.asarray(u, bool) & (np.asarray(g) != np.asarray(w))
        k = u if k is None else np.asarray(k, bool) | u
      judged += judged_elements(w, tol, b, k)
      if res is not None and (worst is None or res[0] > worst[1][0]):
        worst = (name, res)
    if worst is None:
      if judged and counts:
        self.conclusive_pass(mode, rule)
      elif not judged:
        self.judged_nothing(check, f"{want_label} judges no element of "
                            f"{got_label}'s result here")
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
