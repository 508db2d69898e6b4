"""What every check records: the checks run and skipped, comparisons (and
whether they judged anything), failures with the rule they name. A mixin of
`hijax.testing._context.CheckContext`, which supplies the report, the
labels, the settings and the names it uses. And the comparison of backward
rules, `check_identity`."""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hijax.testing._numerics import (compare_leaf, describe_tol,
                                     inner_identity, judged_elements,
                                     on_device, type_str)
from hijax.testing._report import (DERIVATIVE_MODES, RuleFailure,
                                   RuleReport, declared_limit, first_lines)


# A declared limit in JAX's words that is in fact a broken jvp rule.
PRIMAL_READS_TANGENT = (
    "raised {}\nthe jvp rule's primal output depends on the tangent, so JAX "
    "cannot linearize it: compute the primal output from the primals alone")


class Recorder:
  """The bookkeeping methods of a check context (see the module docstring)."""

  report: RuleReport
  label: str
  within: str | None
  settings: Any
  surrogate: bool
  out_names: list[str]
  out_float_idx: list[int]

  @functools.cached_property
  def primal_reads_tangent(self) -> bool:
    raise NotImplementedError  # the host's (CheckContext)

  rng: np.random.Generator

  def rule_name(self, mode) -> str:
    raise NotImplementedError  # the host's

  def random_like(self, x, rng: np.random.Generator | None = None):
    raise NotImplementedError  # the host's

  def ran(self, mode, what):
    if self.within:  # e.g. a sub-check of the second-order mode
      what, mode = f"{self.label}{mode}: {what}", self.within
    else:
      what = self.label + what
    self.report.ran.append(f"{mode}: {what}")

  def skip(self, mode, why):
    self.report.skipped.append((mode, self.label + why))

  def skip_by_intent(self, mode, why, rule=None):
    """Skips a check a surrogate's or a refusing rule cannot pass by design;
    the rule is then not required (`RuleReport.by_intent`)."""
    self.skip(mode, why)
    name = rule or self.rule_name(mode)
    if name not in self.report.by_intent:
      self.report.by_intent.append(name)

  def out_of_time(self, mode, what) -> bool:
    """Whether the budget is spent (the check then skipped for time); else
    the check starts."""
    label = f"{self.label}{mode}: {what}"
    if self.settings.budget.spent:
      self.report.skipped_for_time.append(label)
      return True
    self.settings.budget.starting(label)
    return False

  def inconclusive(self, check, why):
    self.report.inconclusive.append(f"{self.label}{check}: {why}")

  def judged_nothing(self, check, why):
    """Records a comparison that judged no element (see `RuleReport`)."""
    self.report.unjudged += 1
    self.inconclusive(check, why)

  def conclusive_pass(self, mode, rule=None):
    """Records a conclusive comparison of the rule of ``mode`` (or ``rule``)
    that passed."""
    if mode == "second_order":
      return
    name = rule or self.rule_name(mode)
    self.report.compared[name] = self.report.compared.get(name, 0) + 1

  def fail(self, mode, check, inputs, detail, max_error=None, rule=None,
           error=None):
    self.report.failures.append(RuleFailure(
        rule=rule or self.rule_name(mode), check=self.label + check,
        inputs=inputs, detail=detail, max_error=max_error, error=error))

  def fail_raised(self, mode, check, inputs, exc, rule=None):
    why = None
    if not (mode == "second_order" and self.settings.require_second_order):
      if self.surrogate:
        why = declared_limit(exc, surrogate=True)
      elif mode in DERIVATIVE_MODES + ("batch", "second_order"):
        why = declared_limit(exc, strict=True)
    if why is not None and mode != "jvp" and self.primal_reads_tangent:
      self.fail(mode, check, inputs, PRIMAL_READS_TANGENT.format(
          f"{type(exc).__name__}: {first_lines(str(exc), 2)}"),
          float("inf"), rule=self.rule_name("jvp"), error=exc)
      return
    if why is not None:  # a rule that refuses a mode by design
      short = why if len(why) <= 160 else why[:157] + "..."
      who = "the surrogate" if self.surrogate else "the rule"
      self.skip_by_intent(mode, f"{check}: {who} declares it cannot "
                          f"({short})", rule)
      return
    detail = f"raised {type(exc).__name__}: {first_lines(str(exc))}"
    self.fail(mode, check, inputs, detail, float("inf"), rule=rule,
              error=exc)

  def judge_refusals(self, mode, refusals, handled_some: bool):
    """Checks where the rule raised: skipped (``why``) where it handled
    other cases (``handled_some``), else failed."""
    for check, inputs, exc, why in refusals:
      if handled_some:
        self.skip(mode, why)
      else:
        self.fail_raised(mode, check, inputs, exc)

  def compare(self, mode, check, inputs, got, want, tol, names=None,
              got_label="rule", want_label="reference", rule=None,
              bounds=None, skip=None, floors=None, counts=True,
              uncounted=None, own=None) -> bool:
    """Compares lists of arrays leaf by leaf; records the worst difference
    as a failure."""
    names = names or [self.out_names[i] for i in self.out_float_idx]
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

  def check_types(self, mode, check, inputs, got, like, names,
                  got_label) -> bool:
    """Checks that each of ``got`` has the type of its input; records the
    first mismatch."""
    for name, g, x in zip(names, got, like):
      if type_str(g) != type_str(x):
        self.fail(mode, check, inputs,
                  f"{name}: {got_label} gives {type_str(g)}, but the input is "
                  f"{type_str(x)} (a cotangent has the shape and dtype of "
                  "its input)", float("inf"))
        return False
    return True


# --- the inner-product identity -------------------------------------------
# The inner-product identity ``<ȳ, J ṫ> = <Jᵀ ȳ, ṫ>`` that checks a
# backward rule against a reference for ``J ṫ`` (the jvp rule, or finite
# differences), element by element where it matters:
#
# * output elements the reference cannot judge (not smooth, not finite; for
#   finite differences also unresolved) get a zero cotangent and are left out
#   of ``<ȳ, J ṫ>``;
# * where the backward rule gives a non-finite cotangent and some output
#   element could not be judged (a kink, a domain boundary: ``entr`` at 0),
#   those input elements are left out too: the identity is checked again with
#   a tangent that is zero there, so that one element's NaN does not hide the
#   others' verdicts. A non-finite cotangent where every element was judged
#   is a failure;
# * two rules compared with each other may each lose a different part of a
#   result that cancels (softmax with a dominant logit, whose output is
#   1 - exp(-40)): where finite differences find the function flat, each
#   side may be off by the rounding of values of the output's size
#   (`CheckContext.flat_floors`). Finite differences allow their own error
#   bound instead.

def aligned_cotangents(ctx: Recorder, like, j_t, judged):
  """Random cotangents with the signs of ``J ṫ``: ``<ȳ, J ṫ>`` then has no
  cancellation to hide a wrong rule in."""
  out = []
  for y, t, ok in zip(like, j_t, judged):
    c = np.abs(np.asarray(ctx.random_like(y)))
    t = np.asarray(t)
    random_sign = ctx.rng.choice(np.array([-1.0, 1.0]), size=c.shape)
    with np.errstate(invalid="ignore", divide="ignore"):
      if np.iscomplexobj(t):  # Re(ȳ J ṫ) = c |J ṫ|: ȳ along conj(J ṫ)
        sign = np.where(np.isfinite(t) & (t != 0), np.conj(t) / np.abs(t),
                        random_sign)
      else:
        sign = np.where(np.isfinite(t) & (t != 0), np.sign(t), random_sign)
    ybar = np.where(ok, c * sign, 0)
    out.append(on_device(ybar.astype(np.asarray(y).dtype)))
  return out


def _finite(xs):
  return [np.isfinite(np.asarray(x)) for x in xs]


def check_identity(ctx: Recorder, mode: str, check: str, inputs: str,
                   tangents: list | None, like: Sequence,
                   reference: Callable, transpose: Callable,
                   floors: Callable | None = None, rule: str | None = None,
                   what: str = "<ȳ, J ṫ> = {lhs:.8g} with J ṫ from {ref}, but "
                   "<vjp(ȳ), ṫ> = {rhs:.8g}", hint: str = "") -> bool:
  """Checks ``<ȳ, J ṫ> = <transpose(ȳ), ṫ>``; records a failure or an
  inconclusive entry."""
  ref, label, bounds, judged, used, uncounted = reference(tangents)
  if not any(np.any(ok) for ok in judged):
    ctx.judged_nothing(check, "no output element can be judged along this "
                       "direction (see the finite differences above)")
    return True
  ybar = aligned_cotangents(ctx, like, ref, judged)
  cts_in = transpose(ybar)
  left_out = [~ok for ok in _finite(cts_in)]
  if any(np.any(b) for b in left_out) and not all(np.all(ok) for ok in judged):
    ctx.inconclusive(check, "the backward rule gives a non-finite cotangent "
                     f"at {sum(int(np.sum(b)) for b in left_out)} input "
                     "element(s), and the function is not smooth or not "
                     "finite at some output element (see above): those "
                     "input elements are left out")
    ref, label, bounds, judged, used, uncounted = reference(
        [on_device(np.where(b, 0, t)) for t, b in zip(used, left_out)])
    ybar = aligned_cotangents(ctx, like, ref, judged)
    cts_in = [on_device(np.where(b, 0, c))
              for c, b in zip(transpose(ybar), left_out)]
  ref = [np.where(ok, r, 0) for r, ok in zip(ref, judged)]
  lhs, rhs, bound = inner_identity(ybar, ref, cts_in, used,
                                   ctx.settings.tol, bounds)
  if floors is not None and bounds is None:
    top = max([float(np.max(np.abs(np.asarray(y)))) for y in ybar
               if np.size(y)] or [0.0])
    bound += 2 * top * sum(float(np.sum(f)) for f in floors(used))
  if abs(lhs - rhs) <= bound:
    counted = judged if uncounted is None or lhs == rhs else [
        ok & ~u for ok, u in zip(judged, uncounted)]
    if np.isfinite(bound) and any(np.any(ok) for ok in counted):
      ctx.conclusive_pass(mode, rule)
    else:
      ctx.judged_nothing(check, f"{label} only bounds the elements compared "
                         "(see above)")
    return True
  ctx.fail(mode, check, inputs,
           what.format(lhs=lhs, rhs=rhs, ref=label)
           + f": error {abs(lhs - rhs):.3g} (tolerance {bound:.3g})"
           + (hint if np.isfinite(rhs) else ""), abs(lhs - rhs), rule=rule)
  return False
