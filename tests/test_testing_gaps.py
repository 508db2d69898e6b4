"""The checker's own blind spots (issue 22): check_rules fed rules that are
wrong in the ways a careless checker would let through. Each test fails if
the checker treats NaN on one side as agreement, skips the comparison of a
rule's primal output, or allows the finite-difference error in a comparison
of two rules (which agree up to rounding)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hijax import HiPrim, ShapedArray, vjp_from_jvp
from hijax.testing import RuleCheckError, check_rules
from hijax.testing._numerics import Tol, compare_leaf

import zoo

X = jnp.array([0.3, -1.2, 2.0])


def _failures(cls, *, x=X, **kwargs):
  with pytest.raises(RuleCheckError) as info:
    check_rules(lambda x: cls(jax.typeof(x))(x), x, **kwargs)
  return info.value.failures


# --- NaN agrees only with NaN -------------------------------------------------------------

def test_compare_leaf_nan_on_one_side_is_a_violation():
  tol = Tol(ulps=256)
  assert compare_leaf(np.array([1.0, np.nan]), np.array([1.0, 2.0]), tol)
  assert compare_leaf(np.array([1.0, 2.0]), np.array([1.0, np.nan]), tol)
  # even where the reference cannot resolve the element (bound inf)
  assert compare_leaf(np.array([np.nan]), np.array([2.0]), tol,
                      np.array([np.inf]))
  assert compare_leaf(np.array([1.0, np.nan]), np.array([1.0, np.nan]),
                      tol) is None


class NanJvp(zoo.SinDerived):
  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), jnp.where(x > 1, jnp.nan, jnp.cos(x)) * t


def test_a_jvp_rule_returning_nan_fails():
  fails = _failures(NanJvp, modes="jvp")
  assert [f.rule for f in fails] == ["NanJvp.jvp"]
  assert "jvp gives nan" in fails[0].detail


class NanVjp(zoo.Log1pExp):
  def vjp_bwd_retval(self, x, g):
    return (jnp.where(x > 1, jnp.nan, jax.nn.sigmoid(x)) * g,)


def test_a_backward_rule_returning_nan_fails():
  fails = _failures(NanVjp, modes=("jvp", "vjp"))
  assert {f.rule for f in fails} == {"NanVjp.vjp_fwd/vjp_bwd_retval"}


class NanExpand(zoo.SinDerived):
  """expand is NaN at x > 1, the rules are those of sin."""

  def expand(self, x):
    return jnp.where(x > 1, jnp.nan, jnp.sin(x))


def test_a_nan_reference_does_not_pass_a_finite_rule():
  fails = _failures(NanExpand, modes="jvp")
  assert any("finite differences gives nan" in f.detail for f in fails)


class NanBatch(zoo.SinDerived):
  def batch(self, axis_data, args, dims):
    (x,), (d,) = args, dims
    return jnp.where(x > 1, jnp.nan, jnp.sin(x)), d


def test_a_batch_rule_returning_nan_fails():
  fails = _failures(NanBatch, modes="batch")
  assert {f.rule for f in fails} == {"NanBatch.batch"}


# --- the primal output of every rule is compared ------------------------------------------

class VjpWrongPrimal(zoo.Log1pExp):
  def vjp_fwd(self, nzs_in, x):
    return 1.5 * self(x), x  # the backward rule itself is right


class JvpWrongPrimal(zoo.Log1pExp):
  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return 1.5 * self(x), jax.nn.sigmoid(x) * t


class LinWrongPrimal(zoo.SinDerived):
  def lin(self, nzs_in, x):
    return 1.5 * self(x), jnp.cos(x)

  def linearized(self, slope, t):
    return slope * t


@pytest.mark.parametrize("cls, mode, check", [
    (VjpWrongPrimal, "vjp", "vjp's primal output vs the primitive's output"),
    (JvpWrongPrimal, "jvp", "jvp's primal output vs the primitive's output"),
    (LinWrongPrimal, "lin", "lin's primal output vs the primitive's output"),
])
def test_a_wrong_primal_output_of_a_rule_fails(cls, mode, check):
  fails = _failures(cls, modes=mode)
  assert [f.check for f in fails] == [check]


# --- two rules agree to rounding: no finite-difference slack ------------------------------

OFF = 1 + 1e-11  # far above rounding in float64, far below finite differences


class LinSlightlyOff(zoo.SinDerived):
  def lin(self, nzs_in, x):
    return self(x), jnp.cos(x) * OFF

  def linearized(self, slope, t):
    return slope * t


class VjpSlightlyOff(zoo.Log1pExp):
  def vjp_bwd_retval(self, x, g):
    return (jax.nn.sigmoid(x) * g * OFF,)


class BatchSlightlyOff(zoo.SinDerived):
  def batch(self, axis_data, args, dims):
    (x,), (d,) = args, dims
    return jnp.sin(x) * OFF, d


class JvpSlightlyOff(zoo.SinDerived):
  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), jnp.cos(x) * t * OFF

  vjp_fwd, vjp_bwd_retval = vjp_from_jvp


def test_finite_differences_cannot_see_an_error_of_1e_11():
  """The premise: such an error is inside the finite-difference error bound
  (so only an exact comparison between rules catches it)."""
  report = check_rules(lambda x: JvpSlightlyOff(jax.typeof(x))(x), X,
                       modes="jvp", order=1)
  assert report.passed


@pytest.mark.parametrize("cls, mode, rule, check", [
    (LinSlightlyOff, "lin", "LinSlightlyOff.lin/linearized",
     "linearized vs the jvp rule"),
    (VjpSlightlyOff, "vjp", "VjpSlightlyOff.vjp_fwd/vjp_bwd_retval",
     "vjp vs the jvp rule (<ȳ, J ṫ> = <vjp(ȳ), ṫ>)"),
    # its batched output, differentiated, is also slightly off
    (BatchSlightlyOff, "batch", "BatchSlightlyOff.batch",
     {"vmap vs a loop over the batch", "jvp of vmap vs a loop",
      "vjp of vmap vs a loop"}),
])
def test_rules_compared_with_each_other_get_no_finite_difference_slack(
    cls, mode, rule, check):
  modes = ("jvp", mode) if mode != "batch" else ("batch",)
  fails = _failures(cls, modes=modes, order=1)
  assert {f.rule for f in fails} == {rule}
  checks = check if isinstance(check, set) else {check}
  assert {f.check for f in fails} == checks
  assert all("finite differences' error bound" not in f.detail
             for f in fails)


@pytest.mark.parametrize("cls, mode, check", [
    (LinSlightlyOff, "lin", "linearized vs the jvp rule"),
    (VjpSlightlyOff, "vjp", "vjp vs the jvp rule (<ȳ, J ṫ> = <vjp(ȳ), ṫ>)"),
])
def test_the_jvp_rule_is_the_reference_where_its_check_did_not_run(
    cls, mode, check):
  """Without the jvp mode, the jvp rule has not failed: it is still the
  reference, and an error of 1e-11 is caught."""
  fails = _failures(cls, modes=(mode,), order=1)
  assert {f.check for f in fails} == {check}


def test_float32_rules_compared_exactly_too():
  """In float32 an error of 1e-4 is below what finite differences resolve
  at large inputs but far above rounding between rules."""
  class LinOff32(zoo.SinDerived):
    def lin(self, nzs_in, x):
      return self(x), jnp.cos(x) * (1 + 1e-4)

    def linearized(self, slope, t):
      return slope * t

  x = jnp.array([100., 300., 700.], jnp.float32)
  with pytest.raises(RuleCheckError) as info:
    check_rules(lambda x: LinOff32(jax.typeof(x))(x), x, x64=False,
                modes=("jvp", "lin"), order=1)
  assert {f.rule for f in info.value.failures} == {
      "LinOff32.lin/linearized"}


def test_truncation_counts_steps_into_which_the_differences_shrink():
  """Central quotients converging as h² (differences shrinking by 16 per
  halving) give a finite truncation estimate from the second step on; a
  sequence whose differences grow gives none (without rounding to explain
  them)."""
  from hijax.testing._finite_diff import _truncation
  errors = 16.0 ** -np.arange(6)
  for D in (1.0 + errors, 1.0 - 3 * errors):
    D = D.reshape(6, 1)
    diff = np.abs(np.diff(D, axis=0))
    trunc = _truncation(D, diff, np.zeros_like(D))
    assert np.isinf(trunc[0]).all() and np.isfinite(trunc[1:]).all(), trunc
    # within a few percent of the true error |D_k - 1|
    assert np.allclose(trunc[1:-1, 0], np.abs(D - 1)[1:-1, 0], rtol=0.07)
  D = (1.0 + 2.0 ** np.arange(6)).reshape(6, 1)  # diverging
  diff = np.abs(np.diff(D, axis=0))
  assert np.isinf(_truncation(D, diff, np.zeros_like(D))).all()


class _EmptyThenSin(HiPrim):
  """(an empty array, sin x); vjp_fwd claims both have zero tangents."""

  def __init__(self, x_aval):
    self.in_avals = (x_aval,)
    self.out_aval = (ShapedArray((0,), x_aval.dtype), x_aval)
    self.params = {}
    super().__init__()

  def expand(self, x):
    return jnp.zeros(0, x.dtype), jnp.sin(x)

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), (jnp.zeros(0, x.dtype), jnp.cos(x) * t)

  def vjp_fwd(self, nzs_in, x):
    return self(x), x, (False, False)  # the second is a lie

  def vjp_bwd_retval(self, x, ct):
    return (jnp.cos(x) * ct[1],)


def test_an_empty_output_does_not_end_the_nzs_out_check():
  """The output after an empty one is still checked against its declared
  zero tangent."""
  x = jnp.array([0.3, -1.2, 2.0])
  report = check_rules(lambda x: _EmptyThenSin(jax.typeof(x))(x), x,
                       raise_on_failure=False, order=1)
  nzs = [f for f in report.failures if "nzs_out" in f.check]
  assert nzs and nzs[0].rule == "_EmptyThenSin.vjp_fwd", report
  assert "out[1]" in str(nzs[0]), nzs[0]


# --- derivatives of the batched primitive -----------------------------------------------

class SumSquares(HiPrim):
  """sum(x**2) over the last axis. Its batch rule binds an instance on the
  batched type, whose backward rule forgets the batch axis of g: ``2 * x *
  g`` broadcasts g, of shape (batch,), along x's last axis. With a batch size
  equal to the length of x the shapes agree and the values are wrong."""

  def __init__(self, x_aval):
    self.in_avals = (x_aval,)
    self.out_aval = ShapedArray(x_aval.shape[:-1], x_aval.dtype)
    self.params = {}
    super().__init__()

  def expand(self, x):
    return jnp.sum(x ** 2, axis=-1)

  def vjp_fwd(self, nzs_in, x):
    return self(x), x

  def vjp_bwd_retval(self, x, g):
    return (2 * x * g,)  # right for one x; needs g[..., None] when batched

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), jnp.sum(2 * x * t, axis=-1)

  def batch(self, axis_data, args, dims):
    (x,), (d,) = args, dims
    x = jnp.moveaxis(x, d, 0)
    return SumSquares(jax.typeof(x))(x), 0


def test_a_batched_instance_with_a_wrong_backward_rule_fails():
  # vmap of grad runs the rules of the unbatched instance, traced by vmap:
  # right. grad of vmap runs the batched instance's rules: wrong.
  f = lambda x: SumSquares(jax.typeof(x))(x)
  xs = jnp.stack([X, 2 * X, -X])
  w = jnp.array([1., 2., 3.])  # a cotangent that differs across the batch
  want = 2 * xs * w[:, None]
  grad_of_vmap = jax.grad(lambda xs: jnp.dot(w, jax.vmap(f)(xs)))(xs)
  assert not np.allclose(grad_of_vmap, want)
  vmap_of_grad = jax.vmap(lambda x, w: jax.grad(lambda x: w * f(x))(x))(xs, w)
  np.testing.assert_allclose(vmap_of_grad, want, rtol=1e-6)
  fails = _failures(SumSquares, modes=("vjp", "batch"))
  assert {f.rule for f in fails} == {"SumSquares.batch"}
  assert {f.check for f in fails} == {"vjp of vmap vs a loop"}
  # with g[..., None] the check passes
  class Fixed(SumSquares):
    def vjp_bwd_retval(self, x, g):
      return (2 * x * g[..., None],)
    def batch(self, axis_data, args, dims):
      (x,), (d,) = args, dims
      x = jnp.moveaxis(x, d, 0)
      return Fixed(jax.typeof(x))(x), 0
  assert check_rules(lambda x: Fixed(jax.typeof(x))(x), X,
                     modes=("vjp", "batch")).passed


# --- tangents: signed powers of two, exact at every step ---------------------------------

@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "float64"])
def test_tangents_are_signed_powers_of_two_and_every_step_is_exact(dtype):
  """Each element of a tangent is a signed power of two of its input's size
  (no fraction bits), so no candidate step rounds unless it carries an
  element into the next binade."""
  from hijax.testing._finite_diff import (candidate_steps, scaled_tangents,
                                         shifted)
  rng = np.random.default_rng(0)
  top = 10 if dtype == "float16" else 20
  # significands in [1, 1.5): no step carries x +- h t into the next binade
  # (where an ulp doubles, the one case in which a step is dropped)
  x = (rng.choice([-1, 1], 200) * rng.uniform(1, 1.5, 200)
       * 2.0 ** rng.integers(-10, top, 200)).astype(jnp.dtype(dtype))
  (t,) = scaled_tangents(rng, [x])
  mantissa, exponent = np.frexp(np.abs(t.astype(np.float64)))
  assert np.all(mantissa == 0.5) and set(np.sign(t)) == {-1, 1}
  np.testing.assert_array_equal(exponent, np.frexp(np.abs(
      x.astype(np.float64)))[1])  # of the input's size
  for h in candidate_steps([x.dtype]):
    assert shifted([x], [t], h) is not None, h
    assert shifted([x], [t], -h) is not None, h
