"""The nzs_out check (hijax/testing/_nzs_out.py) on the paths its other tests
leave out: a primitive without a jvp rule (finite differences of `expand`),
hi-typed arguments, integer-only inputs, a vjp_fwd that raises, and each of
these before another primitive whose nzs_out lies."""
import jax
import jax.numpy as jnp
import numpy as np

from hijax import HiPrim, ShapedArray
from hijax.testing import check_rules

import zoo
from test_testing_scale import X3, BoxTy, MakeBox, Unbox, _pipeline
from unary_prim import UnaryPrim

X = jnp.array([0.3, -1.2, 2.0])


def _nzs(report):
  return [f for f in report.failures if "nzs_out" in f.check]


def _check(fn, *args, **kwargs):
  return check_rules(fn, *args, raise_on_failure=False, order=1, **kwargs)


class SinNoJvp(UnaryPrim):
  """sin, reverse mode only; its vjp_fwd declares the output's tangent zero
  where ``lie`` (it is not)."""

  def expand(self, x):
    return jnp.sin(x)

  def vjp_fwd(self, nzs_in, x):
    return self(x), x, not self.params["lie"]

  def vjp_bwd_retval(self, x, g):
    return (jnp.cos(x) * zoo.inst(g),)


def test_a_lying_nzs_out_without_a_jvp_rule_is_found_by_finite_differences():
  report = _check(lambda x: SinNoJvp(jax.typeof(x), lie=True)(x), X,
                  modes="vjp")
  nzs = _nzs(report)
  assert [f.rule for f in nzs] == ["SinNoJvp.vjp_fwd"], report
  assert "from finite differences of expand" in nzs[0].detail
  # |cos x| * |ṫ| at the worst element: well above zero
  assert nzs[0].max_error is not None and nzs[0].max_error > 1e-3
  assert any("nzs_out" in r and "SinNoJvp" in r for r in report.ran), report


class SinAndFloorNoJvp(HiPrim):
  """(sin x, floor x), reverse mode only: floor's tangent is truly zero."""

  def __init__(self, x_aval):
    self.in_avals, self.out_aval, self.params = (x_aval,), (x_aval,) * 2, {}
    super().__init__()

  def expand(self, x):
    return jnp.sin(x), jnp.floor(x)

  def vjp_fwd(self, nzs_in, x):
    return self(x), x, (True, False)

  def vjp_bwd_retval(self, x, g):
    return (jnp.cos(x) * zoo.inst(g[0]),)


def test_a_true_zero_tangent_without_a_jvp_rule_passes_finite_differences():
  """floor x is 0 on (0, 1): its finite differences are 0 within a bound
  of 0, which passes (zero is at most zero)."""
  report = _check(lambda x: SinAndFloorNoJvp(jax.typeof(x))(x),
                  jnp.array([0.3, 0.5, 0.7]), modes="vjp")
  assert report.passed, report
  assert any("nzs_out" in r for r in report.ran), report


class UnboxLyingNzs(Unbox):
  def vjp_fwd(self, nzs_in, b) -> tuple:
    return self(b), None, False  # the output is b.x: its tangent is not zero


def test_a_hi_typed_argument_gets_a_tangent_of_its_tangent_type():
  """The jvp rule differentiates Unbox at a Box: its tangent is drawn in
  BoxTy's tangent type (a float32 array), and the lie is found."""
  report = _check(_pipeline(unbox=UnboxLyingNzs), X3, modes="vjp")
  nzs = _nzs(report)
  assert [f.rule for f in nzs] == ["UnboxLyingNzs.vjp_fwd"], report
  assert "from the jvp rule" in nzs[0].detail


class MakeBoxNoJvpLying(HiPrim):
  """MakeBox without a jvp rule, whose vjp_fwd claims the box's tangent is
  zero."""

  def __init__(self, x_aval):
    self.in_avals, self.out_aval = (x_aval,), BoxTy(x_aval.shape)
    self.params = {}
    super().__init__()

  expand = MakeBox.expand
  vjp_bwd_retval = MakeBox.vjp_bwd_retval

  def vjp_fwd(self, nzs_in, x):
    return self(x), None, False


class SinLyingNzs(zoo.Unary):
  """sin with a jvp rule, whose vjp_fwd declares its tangent zero."""

  def expand(self, x):
    return jnp.sin(x)

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), jnp.cos(x) * zoo.inst(t)

  def vjp_fwd(self, nzs_in, x):
    return self(x), x, False

  def vjp_bwd_retval(self, x, g):
    return (jnp.cos(x) * zoo.inst(g),)


def _lying_sin(x):
  return SinLyingNzs(jax.typeof(x))(x)


def test_a_hi_typed_output_without_a_jvp_rule_is_skipped_and_the_next_checked():
  """Nothing can differentiate MakeBox (a hi-typed output, no jvp rule): its
  nzs_out check is skipped with the reason, and the primitive after it is
  still checked."""
  def f(x):
    b = MakeBoxNoJvpLying(jax.typeof(x))(x)
    return Unbox(jax.typeof(b))(b) + _lying_sin(x)
  report = _check(f, X3, modes="vjp")
  assert [f.rule for f in _nzs(report)] == ["SinLyingNzs.vjp_fwd"], report
  skipped = [why for _, why in report.skipped if "nzs_out" in why]
  assert skipped == [
      "vjp_fwd's nzs_out vs the output's derivative (MakeBoxNoJvpLying.vjp_fwd):"
      " an argument or output of a hi type and no jvp rule to differentiate "
      "it with"], report.skipped


class IntToFloat(HiPrim):
  """n / 2 for an integer n: no floating-point input to differentiate."""

  def __init__(self, n_aval):
    self.in_avals = (n_aval,)
    self.out_aval = ShapedArray(n_aval.shape, jnp.dtype("float32"))
    self.params = {}
    super().__init__()

  def expand(self, n):
    return n.astype(jnp.float32) / 2

  def vjp_fwd(self, nzs_in, n):
    return self(n), None, False

  def vjp_bwd_retval(self, _, g):
    return (None,)


def test_integer_inputs_leave_nothing_to_compare_and_the_next_is_checked():
  def f(x, n):
    return IntToFloat(jax.typeof(n))(n) + _lying_sin(x)
  report = _check(f, X3, jnp.array([1, 2, 3], jnp.int32), modes="vjp")
  assert [f.rule for f in _nzs(report)] == ["SinLyingNzs.vjp_fwd"], report
  assert not [why for _, why in report.skipped if "IntToFloat" in why], (
      report.skipped)


class RaisingVjpFwd(zoo.Unary):
  def expand(self, x):
    return jnp.sin(x)

  def vjp_fwd(self, nzs_in, x):
    raise ValueError("no vjp_fwd here")

  def vjp_bwd_retval(self, x, g):
    return (g,)


def test_a_vjp_fwd_that_raises_is_reported_and_the_next_is_checked():
  def f(x):
    return RaisingVjpFwd(jax.typeof(x))(x) + _lying_sin(x)
  report = _check(f, X, modes="vjp")
  called = [f for f in report.failures if f.check == "calling vjp_fwd"]
  assert [f.rule for f in called] == ["RaisingVjpFwd.vjp_fwd"], report
  assert "no vjp_fwd here" in called[0].detail
  assert [f.rule for f in _nzs(report)] == ["SinLyingNzs.vjp_fwd"], report


class JvpEagerOnly(SinLyingNzs):
  """A jvp rule that reads a value (a compiled jvp cannot run it)."""

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    float(x[0])
    return self(x), jnp.cos(x) * zoo.inst(t)


def test_a_jvp_rule_that_runs_only_eagerly_still_differentiates():
  report = _check(lambda x: JvpEagerOnly(jax.typeof(x))(x), X, modes="vjp")
  nzs = _nzs(report)
  assert [f.rule for f in nzs] == ["JvpEagerOnly.vjp_fwd"], report
  assert "from the jvp rule" in nzs[0].detail


class ValuedNzsOut(zoo.Unary):
  """sin whose nzs_out is an array computed from x, not a bool."""

  def expand(self, x):
    return jnp.sin(x)

  def vjp_fwd(self, nzs_in, x):
    return self(x), x, jnp.all(x > 100.)

  def vjp_bwd_retval(self, x, g):
    return (jnp.cos(x) * zoo.inst(g),)


def test_each_primitive_after_one_without_or_with_a_bad_nzs_out_is_checked():
  """A vjp_fwd that returns no nzs_out (Log1pExp's) or a malformed one ends
  only its own primitive's nzs_out check."""
  def f(x):
    return (zoo.log1pexp(x) + ValuedNzsOut(jax.typeof(x))(x)
            + _lying_sin(x))
  report = _check(f, X, modes="vjp")
  assert [f.rule for f in _nzs(report)] == [
      "ValuedNzsOut.vjp_fwd", "SinLyingNzs.vjp_fwd"], report
  assert "nzs_out returned by ValuedNzsOut.vjp_fwd must be" in (
      _nzs(report)[0].detail)


class SinAllTangents(SinLyingNzs):
  def vjp_fwd(self, nzs_in, x) -> tuple:
    return self(x), x, True  # no output declared zero: nothing to check


def test_a_primitive_that_declares_no_zero_tangent_does_not_end_the_check():
  def f(x):
    return SinAllTangents(jax.typeof(x))(x) + _lying_sin(x)
  report = _check(f, X, modes="vjp")
  assert [f.rule for f in _nzs(report)] == ["SinLyingNzs.vjp_fwd"], report


class SinAndFloor(SinAndFloorNoJvp):
  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), (jnp.cos(x) * zoo.inst(t), jnp.zeros_like(x))


def test_an_exactly_zero_tangent_passes_at_a_tolerance_of_zero():
  """With atol=0 given (no ulps, no rtol), the declared-zero output's
  allowed size is 0: the jvp rule's exact zero passes (zero is at most
  zero)."""
  report = _check(lambda x: SinAndFloor(jax.typeof(x))(x), X, modes="vjp",
                  atol=0.0)
  assert report.passed, report
  assert any("nzs_out" in r for r in report.ran), report



class SwampedNoJvp(UnaryPrim):
  """sin with its first element set to 1e20, reverse mode only; vjp_fwd
  declares the whole output's tangent zero (a lie at the other elements)."""

  def expand(self, x):
    return jnp.sin(x).at[0].set(1e20)

  def vjp_fwd(self, nzs_in, x):
    return self(x), x, False

  def vjp_bwd_retval(self, x, g):
    return (jnp.cos(x) * zoo.inst(g),)


def test_a_declared_zero_that_finite_differences_cannot_resolve_is_inconclusive():
  """1e20 swamps every finite-difference step: no element of the output is
  resolved (the first is flat, so only bounded), so the nzs_out check judges
  nothing; it says so, and does not pass silently."""
  report = _check(lambda x: SwampedNoJvp(jax.typeof(x))(x), X, modes="vjp",
                  accept_inconclusive=True)
  assert not _nzs(report), report
  unjudged = [line for line in report.inconclusive if "nzs_out" in line]
  assert unjudged == [
      "vjp_fwd's nzs_out vs the output's derivative (SwampedNoJvp.vjp_fwd): "
      "finite differences of expand resolve no element of out"], report
  assert report.unjudged == 1, report


class SinAndLeak(SinAndFloorNoJvp):
  """(sin x, floor x) whose jvp rule gives floor a tangent of ``leak`` ṫ;
  vjp_fwd declares floor's tangent zero."""

  def __init__(self, x_aval, leak):  # pylint: disable=super-init-not-called
    self.in_avals, self.out_aval = (x_aval,), (x_aval,) * 2
    self.params = {"leak": leak}
    HiPrim.__init__(self)

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    t = zoo.inst(t)
    return self(x), (jnp.cos(x) * t, self.params["leak"] * t)


def test_the_jvp_path_of_the_nzs_out_check_allows_the_tolerance_given():
  """With atol given, a tangent of the order of rounding on a declared-zero
  output passes (atol allows it); one of 1e-3 fails."""
  def run(leak):
    return _check(lambda x: SinAndLeak(jax.typeof(x), leak)(x), X,
                  modes="vjp", atol=1e-12)
  assert not _nzs(run(1e-17)), run(1e-17)
  nzs = _nzs(run(1e-3))
  assert [f.rule for f in nzs] == ["SinAndLeak.vjp_fwd"]
  assert "from the jvp rule" in nzs[0].detail
  assert nzs[0].max_error is not None and nzs[0].max_error > 1e-4


def test_finite_differences_name_the_element_furthest_past_its_bound(
    monkeypatch):
  """Of a declared-zero output's elements, the one whose derivative exceeds
  its error bound the most is reported (not the largest derivative plus
  bound); an element finite differences do not resolve is never one."""
  from types import SimpleNamespace

  from hijax.testing import _nzs_out
  from hijax.testing._finite_diff import (BOUNDED, RESOLVED, UNRESOLVED,
                                          FDEstimate)
  est = FDEstimate([], [np.array([10.0, 9.5, 0.0, 1e9])],
                   [np.array([1e-3, 1.0, 50.0, np.inf])],
                   [np.array([RESOLVED, RESOLVED, BOUNDED, UNRESOLVED])], 0)
  sub = SimpleNamespace(float_idx=[0], out_float_idx=[0],
                        fd=lambda direction, w: est)
  monkeypatch.setattr(_nzs_out.Point, "of", lambda *a, **k: sub)
  monkeypatch.setattr(_nzs_out, "Writer", lambda *a: None)
  p = SimpleNamespace(fd_of="expand", rng=None, fd_scale=None)
  prim = SinNoJvp(jax.typeof(X), lie=True)
  assert _nzs_out._zero_derivatives(p, None, prim, (X,), [0]) == {
      0: (10.0, 1e-3, "finite differences of expand", True)}
