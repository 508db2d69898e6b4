"""The checker's numbers: default tolerances, how a tolerance is described,
the error allowed, how leaves are compared and shown in a report. Every
expected value is a closed form."""
import dataclasses
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hijax.testing import _numerics as nu
from hijax.testing._numerics import Tol

EPS32 = float(np.finfo(np.float32).eps)
EPS64 = float(np.finfo(np.float64).eps)
TINY64 = float(np.finfo(np.float64).tiny)


def test_default_tolerance_is_256_ulps_unless_atol_or_rtol_is_given():
  assert nu.defaults() == Tol(ulps=256.0)
  assert nu.defaults(atol=1e-3) == Tol(1e-3, 0.0, 0.0)
  assert nu.defaults(rtol=1e-2) == Tol(0.0, 1e-2, 0.0)
  assert nu.defaults(1e-3, 1e-2) == Tol(1e-3, 1e-2, 0.0)
  with pytest.raises(dataclasses.FrozenInstanceError):
    nu.defaults().atol = 1.0  # pyright: ignore[reportAttributeAccessIssue]


def test_ulps_scale_with_the_dtype_and_stop_at_one_sixteenth():
  assert nu.ulp_factor(Tol(ulps=256), np.float32) == 256 * EPS32
  assert nu.ulp_factor(Tol(ulps=256), jnp.bfloat16) == 1 / 16
  assert nu.ulp_factor(Tol(ulps=256), np.float16) == 1 / 16
  assert nu.ulp_factor(Tol(atol=1.0), np.float32) == 0.0
  assert nu.eps_of(np.int32) == EPS64
  assert nu.eps_of(np.complex64) == EPS32


def test_a_tolerance_is_described_as_a_report_shows_it():
  assert nu.describe_tol(Tol(ulps=256)) == "tolerance 256 ulps"
  assert nu.describe_tol(Tol(1e-6, 1e-5)) == "tolerance atol=1e-06, rtol=1e-05"
  assert nu.describe_tol(Tol(1e-6, 0, 4)) == "tolerance atol=1e-06, 4 ulps"
  assert nu.describe_tol(Tol()) == "tolerance 0"


def test_on_device_keeps_a_jax_array_of_the_dtype_and_converts_others():
  a = jnp.ones(2, jnp.float32)
  assert nu.on_device(a) is a
  assert nu.on_device(a, jnp.float32) is a
  assert nu.on_device(a, jnp.float16).dtype == jnp.float16
  b = nu.on_device(np.arange(3, dtype=np.int32))
  assert isinstance(b, jax.Array) and b.dtype == np.int32
  assert nu.on_device(np.arange(3, dtype=np.int32), np.float32).dtype == np.float32


def test_dtypes_of_arrays_and_scalars():
  assert nu.dtype_of(np.ones(2, np.float16)) == np.float16
  assert nu.dtype_of(1) == np.result_type(1)
  assert nu.dtype_of(1.0) == np.float64
  assert nu.is_float(np.ones(2, np.float32)) is True
  assert nu.is_float(np.complex64(1)) is True
  assert nu.is_float(np.arange(2)) is False
  assert nu.is_float(object()) is False
  assert nu.wide(np.ones(2, np.float32)).dtype == np.float64
  assert nu.wide(np.ones(2, np.complex64)).dtype == np.complex128
  assert nu.real_or_int(np.int8) is True
  assert nu.real_or_int(np.bool_) is True
  assert nu.real_or_int(np.dtype("U1")) is False
  assert nu.type_str(np.ones((2, 3), np.float32)) == "float32[2,3]"
  assert [x.tolist() for x in nu.to_numpy([1, [2.0]])] == [1, [2.0]]


def test_check_arrays_names_the_first_bad_leaf():
  leaves = [((jax.tree_util.DictKey("a"),), np.ones(2, np.float32)),
            ((jax.tree_util.DictKey("b"),), np.ones((2, 3), np.float32))]
  nu.check_arrays("argument", "x", leaves, lambda x: True)
  with pytest.raises(TypeError, match=r"but argument x\['b'\] is float32\[2,3\]; "
                     "hi types are not supported"):
    nu.check_arrays("argument", "x", leaves, lambda x: x.ndim < 2)
  with pytest.raises(TypeError, match=r"x\['a'\] is float32\[2\]"):
    nu.check_arrays("argument", "x", leaves, lambda x: 1 / 0)


def test_fmt_array_shows_six_values_with_four_digits():
  assert nu.fmt_array(np.arange(7.0)) == "f64[7] [0., 1., 2., 3., 4., 5., ...]"
  assert nu.fmt_array(np.arange(6.0) / 3) == (
      "f64[6] [0.    , 0.3333, 0.6667, 1.    , 1.3333, 1.6667]")
  assert nu.fmt_array(np.arange(7, dtype=np.uint8).reshape(7, 1)) == (
      "u8[7, 1] [0, 1, 2, 3, 4, 5, ...]")
  assert nu.fmt_array(np.float32(1 / 3)) == "f32[] 0.333333"
  assert nu.fmt_array(np.int32(3)) == "i32[] 3"
  assert nu.describe_leaf(np.int32(3)) == "i32[] 3"


def test_inner_pairs_without_conjugate():
  assert nu.inner([np.array([1 + 2j])], [np.array([3 + 0j])]) == (
      3.0, np.sqrt(45.0))


def test_inner_identity_bound_closed_form():
  ct, jt = [np.array([2.0, 0.0])], [np.array([3.0, 5.0])]
  ci, t = [np.array([1.0])], [np.array([4.0])]
  lhs, rhs, bound = nu.inner_identity(ct, jt, ci, t, Tol(0.5, 0.25))
  # <ct, jt> = 6, |ct| = 2, products' magnitudes max(6, 4)
  assert (lhs, rhs, bound) == (6.0, 4.0, 0.5 * 2 + 0.25 * 6)
  f32 = [np.array([2.0, 0.0], np.float32)]
  _, _, bound = nu.inner_identity(f32, jt, ci, t, Tol(ulps=2))
  assert bound == 2 * EPS32 * 6
  # finite-difference bounds weighted by |ct|; an element of ct that is 0
  # ignores its (infinite) bound
  _, _, bound = nu.inner_identity(
      [np.array([0.5, 0.0])], jt, ci, t, Tol(),
      bounds=[np.array([0.25, np.inf])])
  assert bound == 0.5 * 0.25


def test_allowed_error_closed_form():
  want = np.array([1.0, -3.0, np.inf])
  tol = Tol(0.5, 0.25, 2)
  ulp = 2 * EPS64
  expect = [0.5 + 0.25 * 1 + ulp * (1 + 3) + TINY64,
            0.5 + 0.25 * 3 + ulp * (3 + 3) + TINY64,
            0.5 + ulp * 3 + TINY64]
  np.testing.assert_array_equal(nu.allowed_error(want, tol), expect)
  own = np.array([True, False, False])
  expect[0] = 0.5 + 0.25 * 1 + ulp * 2 + TINY64
  np.testing.assert_array_equal(nu.allowed_error(want, tol, own=own), expect)
  bound = np.array([1.0, 2.0, 0.0])
  np.testing.assert_array_equal(
      nu.allowed_error(want, tol, bound, own), np.add(expect, bound))


def test_judged_elements_leave_out_nan_skipped_and_unbounded():
  want = np.array([1.0, np.nan, 2.0, 3.0])
  assert nu.judged_elements(want, Tol()) == 3
  assert nu.judged_elements(want, Tol(), bound=[0, 0, np.inf, 0]) == 2
  assert nu.judged_elements(want, Tol(), skip=[0, 0, 0, 1]) == 2
  # integers are compared exactly: every element is judged, whatever bound
  assert nu.judged_elements(np.arange(3), Tol(), bound=[0, np.inf, 0]) == 3


def test_compare_leaf_of_different_shapes_dtypes_and_integers():
  assert nu.compare_leaf(np.ones(2), np.ones(3), Tol()) == (
      np.inf, "shape (2,) instead of (3,)", None, None)
  assert nu.compare_leaf(np.ones(2, np.float32), np.ones(2), Tol()) == (
      np.inf, "dtype float32 instead of float64", None, None)
  assert nu.compare_leaf(np.array([1, 5, 3]), np.array([1, 2, 3]), Tol()) == (
      3.0, (1,), 5, 2)
  assert nu.compare_leaf(np.array([1, 2]), np.array([1, 2]), Tol()) is None
  assert nu.compare_leaf(np.int32(4), np.int32(1), Tol()) == (3.0, (), 4, 1)


def test_compare_leaf_of_floats():
  tol = Tol(atol=1e-6)
  assert nu.compare_leaf(np.array([1.0]), np.array([1.0 + 1e-9]), tol) is None
  assert nu.compare_leaf(np.array([1.0, 2.0]), np.array([1.0, 2.5]), tol) == (
      0.5, (1,), 2.0, 2.5)
  assert nu.compare_leaf(np.float64(1.0), np.float64(2.0), tol) == (
      1.0, (), 1.0, 2.0)
  nan = np.array([np.nan, 1.0])
  assert nu.compare_leaf(nan, nan, tol) is None
  assert nu.compare_leaf(nan, np.array([np.nan, 1.5]), tol, skip=[0, 1]) is None
  worst = nu.compare_leaf(np.array([1.0, np.nan]), np.array([1.0, 1.0]), tol)
  assert worst is not None and worst[:2] == (np.inf, (1,))
  # an error at the limit passes; the worst violation is reported, not the
  # largest error
  assert nu.compare_leaf(np.array([11.0]), np.array([10.0]), Tol(rtol=0.1)) is None
  assert nu.compare_leaf(np.array([11.0, 0.5]), np.array([10.0, 0.0]),
                         Tol(rtol=0.1)) == (0.5, (1,), 0.5, 0.0)
  assert nu.compare_leaf(np.array([11.0, 0.25]), np.array([10.0, 0.0]),
                         Tol(rtol=0.1)) == (0.25, (1,), 0.25, 0.0)


# --- finite differences -----------------------------------------------------
from hijax.testing import _finite_diff as fd  # noqa: E402


def _estimate(f, x, t, dtype: Any = np.float64, **kwargs):
  x, t = np.asarray(x, dtype), np.asarray(t, dtype)
  with np.errstate(all="ignore"):
    return fd.estimate(lambda points: [[f(*p)] for p in points], [x], [t],
                       [np.dtype(dtype)], **kwargs)


def test_fd_of_a_smooth_function_is_resolved_within_its_bound():
  x = np.array([1.0, 2.0, 0.5])
  e = _estimate(lambda x: x ** 3, x, np.ones(3))
  assert e.status[0].tolist() == [fd.RESOLVED] * 3
  assert np.all(np.abs(e.values[0] - 3 * x ** 2) <= e.bounds[0])
  assert np.all(e.bounds[0] < 1e-9) and np.all(e.bounds[0] > 0)
  assert e.own[0].tolist() == [True] * 3
  assert 0 < e.floors[0].max() < 1e-13
  assert e.evaluations == 39 and len(e.center) == 1
  assert e.tangents[0].tolist() == [1.0] * 3
  assert e.count(fd.RESOLVED) == 3 and e.count(fd.UNRESOLVED) == 0
  assert [f.tolist() for f in e.flat()] == [[False] * 3]
  assert [u.tolist() for u in e.uncounted()] == [[False] * 3]
  assert [s.tolist() for s in e.skipped()] == [[False] * 3]


def test_fd_verdicts_at_a_kink_a_pole_and_a_flat_point():
  e = _estimate(np.abs, [0.0, 1.0], [1.0, 1.0])
  assert e.status[0].tolist() == [fd.NOT_SMOOTH, fd.RESOLVED]
  assert np.isnan(e.values[0][0]) and e.bounds[0][0] == np.inf
  assert [s.tolist() for s in e.skipped()] == [[True, False]]
  e = _estimate(np.log, [0.0, 1.0], [1.0, 1.0])
  assert e.status[0].tolist() == [fd.NOT_FINITE, fd.RESOLVED]
  e = _estimate(lambda x: 0 * x + 3, [0.5, 1.0], [1.0, 1.0])
  assert e.status[0].tolist() == [fd.BOUNDED] * 2
  assert e.values[0].tolist() == [0.0, 0.0]
  assert np.all(e.bounds[0] < 1e-9) and np.all(e.bounds[0] > 0)
  assert [f.tolist() for f in e.flat()] == [[True, True]]
  assert [u.tolist() for u in e.uncounted()] == [[True, True]]
  assert e.count(fd.BOUNDED) == 2


def test_fd_noise_is_a_fourth_difference():
  f = (16.0, 1.0, 0.0, 1.0, 16.0)  # x^4 at -2..2: q1 = 24
  assert fd._noise(*f) == 6.0
  # with the points at -4 and 4 (q2 = 24 * 16) the curvature cancels
  assert fd._noise(*f, 256.0, 256.0) == 0.0
  # one point off by 1 (fm2, fm1, f0, fp1, fp2, fm4, fp4): |q2 - 16 q1| / 64
  expect = [20, 64, 90, 64, 20, 1, 1]
  for i, e in enumerate(expect):
    assert fd._noise(*np.eye(7)[i]) == e / 64
    if i < 5:
      assert fd._noise(*np.eye(5)[i]) == [1, 4, 6, 4, 1][i] / 4
  cubic = np.array([-8.0, -1.0, 0.0, 1.0, 8.0])
  assert fd._noise(*cubic) == 0.0


def _cols(*cols):
  """Columns of second differences (one per element), steps coarse to fine."""
  return np.array(cols, np.float64).T


def test_fd_kinks_are_second_differences_not_shrinking_by_8():
  s = _cols([64, 4, 0.25],   # shrinks by 16: smooth
            [64, 16, 4],     # by 4 at the finest pair: a kink
            [64, 32, 4],     # by 8 exactly: smooth
            [64, 32, 2.5],   # the finest pair above 16 sigma decides
            [64, 16, 2],     # 2 = 16 sigma is rounding: the coarser pair
            [64, 32, 2.1],
            [64, 7.68, 0.01],
            [64, 1, 8])      # no pair of successive steps above 16 sigma
  found = fd._not_smooth(s, np.ones(s.shape, bool), 0.125)
  assert found.tolist() == [False, True, False, False, True, False, False,
                            False]


def test_fd_rough_where_second_differences_shrink_by_less_than_4():
  s = _cols([8, 4, 0.01], [8, 1, 0.01], [8, 2, 0.01], [0.5, 0.5, 0.01],
            [0.6, 0.6, 0.01], [8, 1.8, 0.01], [8, 1, 1], [0.6, 0.45, 0.01])
  valid = np.ones(s.shape, bool)
  found = fd._rough(s, valid, 0.125)
  assert found.tolist() == [True, False, False, False, True, False, True,
                            False]
  valid[0] = False
  assert fd._rough(s, valid, 0.125).tolist()[:2] == [False, False]


def test_fd_curvature_from_the_finest_second_difference_above_rounding():
  s = _cols([8, 0.6], [8, 0.5], [0.1, 0.1])
  h = np.array([2.0, 1.0]).reshape(2, 1)
  curv = fd._curvature(s, np.ones(s.shape, bool), 0.125, h)
  assert curv.tolist() == [0.6, 2.0, 0.125]


def test_fd_truncation_of_one_step_is_unknown():
  assert fd._truncation(np.ones((1, 2)), np.zeros((0, 2)),
                        np.zeros((1, 2))).tolist() == [[np.inf, np.inf]]


def test_fd_truncation_closed_forms():
  def trunc(d, noise, agree=None):
    d = np.array(d, np.float64)[:, None]
    diff = np.abs(np.diff(d, axis=0))
    full = lambda v: np.full(d.shape, v, np.float64)
    return fd._truncation(d, diff, full(noise),
                          None if agree is None else full(agree))[:, 0].tolist()
  # quotients converging by 16: the first is not seen to converge, each
  # later one is judged by the next difference or its gap to every finer one
  assert trunc([2, 1 + 1 / 16, 1 + 1 / 256, 1 + 1 / 4096], 0.0) == [
      np.inf, 255 / 4096, 15 / 4096, 15 / 4096]
  # not shrinking but within the noise; gaps beyond `agree` count
  assert trunc([1, 1.5, 2, 2.5], 1.0, 0.25) == [1.25, 0.75, 0.5, 0.5]
  assert trunc([1, 1.5, 2, 2.5], 1.0) == [0.5, 0.5, 0.5, 0.5]
  assert trunc([1, 1.5, 2, 2.5], 0.25) == [np.inf] * 4
  # differences shrinking by exactly 4 are seen to converge
  assert trunc([0, 4, 5, 5.25], 0.0) == [np.inf, 1.25, 0.25, 0.25]
  # differences exactly at the noise are explained by it
  assert trunc([1, 1.5, 2, 2.5], 0.5) == [1.0, 0.5, 0.5, 0.5]
  # a step after a large difference keeps 1/16 of it
  assert trunc([0, 1, 1, 1], 1.0, 0.0) == [1.0, 1 / 16, 0.0, 0.0]
  assert trunc([1, 1.5, 2, np.nan], 1.0) == [0.5, np.inf, np.inf, np.inf]


# --- a value of a hi type ---------------------------------------------------

def test_a_hi_value_is_not_float_and_is_described_by_its_type():
  import hitype_examples as H  # pylint: disable=import-outside-toplevel
  box = H.quantize(jnp.ones(2))
  ty = jax.typeof(box).str_short()
  assert nu.is_float(box) is False
  assert nu.describe_leaf(box) == f"a value of hi type {ty}"
  with pytest.raises(TypeError, match="is " + re.escape(ty)):
    nu.check_arrays("argument", "x", [((), box)], nu.is_float)


def test_a_result_flushed_to_zero_below_the_normal_numbers_passes():
  tiny = float(np.finfo(np.float32).tiny)
  assert nu.allowed_error(np.zeros(1, np.float32), Tol()).tolist() == [tiny]
  sub = np.array([tiny / 4], np.float32)
  assert nu.compare_leaf(np.zeros(1, np.float32), sub, Tol()) is None
  assert nu.compare_leaf(np.zeros(1, np.float32), 4 * sub * 2, Tol()) == (
      2 * tiny, (0,), 0.0, 2 * tiny)


def test_fd_options_of_estimate():
  cube = lambda x: x ** 3
  with pytest.raises(ValueError, match="no finite-difference step keeps"):
    _estimate(cube, [2.0 ** 60], [1.0])
  x = np.array([1.0, 2.0])
  e = _estimate(cube, x, [1.0, 1.0], f_x=[x ** 3])
  assert e.evaluations == 38 and e.center[0] is not None
  assert e.center[0].tolist() == [1.0, 8.0]
  e = _estimate(cube, x, [1.0, 1.0], eps=2.0 ** -20)  # two steps, no noise
  assert e.evaluations == 5 and e.status[0].tolist() == [fd.RESOLVED] * 2
  assert np.all(np.abs(e.values[0] - 3 * x ** 2) <= e.bounds[0])
  # tangents are divided by a power of two: values are along t / 8
  e = _estimate(lambda x: x ** 2, [1.0], [8.0], cast_to=[np.float32],
                tangent_dtypes=[np.float32])
  assert e.tangents[0].tolist() == [1.0]
  assert e.tangents[0].dtype == np.float32 and e.values[0].dtype == np.float32
  assert abs(float(e.values[0][0]) - 2.0) <= e.bounds[0][0]
  e = _estimate(lambda x: 1 / x, [0.0, 1.0], [1.0, 1.0])
  assert e.status[0].tolist() == [fd.NOT_FINITE, fd.RESOLVED]
  assert abs(e.values[0][1] + 1) <= e.bounds[0][1] < 1e-9


def test_fd_a_cancellation_remainder_has_the_noise_of_what_it_combines():
  f = lambda x: 1e-10 * x
  quiet = _estimate(f, [1.0], [1.0])
  loud = _estimate(f, [1.0], [1.0], combines=1.0)
  assert quiet.floors[0][0] < 1e-20
  assert loud.floors[0][0] >= fd.FLOOR * EPS64


def test_fd_of_several_outputs():
  x = np.array([0.5, 1.0], np.float64)
  with np.errstate(all="ignore"):
    e = fd.estimate(lambda ps: [[p[0] ** 2, np.sin(p[0])] for p in ps], [x],
                    [np.ones(2)], [np.dtype(np.float64)] * 2)
  assert [s.tolist() for s in e.status] == [[fd.RESOLVED] * 2] * 2
  assert np.all(np.abs(e.values[0] - 2 * x) <= e.bounds[0])
  assert np.all(np.abs(e.values[1] - np.cos(x)) <= e.bounds[1])
  assert np.all(e.bounds[1] < 1e-9)


def test_fd_a_jump_between_the_steps_is_unresolved_and_still_compared():
  e = _estimate(np.floor, [0.5, 1.0], [1.0, 1.0])
  assert e.status[0].tolist() == [fd.BOUNDED, fd.UNRESOLVED]
  assert e.count(fd.UNRESOLVED) == 1 and e.bounds[0][1] == np.inf
  assert [s.tolist() for s in e.skipped()] == [[False, False]]
  # each verdict has its own reason in a report
  assert len(fd.REASONS) == 4 and fd.RESOLVED not in fd.REASONS


def test_fd_flat_elements_are_judged_ones_within_their_bound():
  e = fd.FDEstimate([], [np.array([1.0, 2.0, 0.0, 0.0])],
                    [np.full(4, 1.0)],
                    [np.array([fd.RESOLVED, fd.RESOLVED, fd.NOT_SMOOTH,
                               fd.BOUNDED], np.int8)], 0)
  assert [f.tolist() for f in e.flat()] == [[True, False, False, True]]
  assert [u.tolist() for u in e.uncounted()] == [[False, False, False, True]]
  assert [s.tolist() for s in e.skipped()] == [[False, False, True, False]]
  assert e.count(fd.RESOLVED) == 2


def test_fd_evaluates_exact_steps_by_4_then_twice_the_finest_and_the_point():
  seen = []

  def evaluate(points):
    seen.extend(float(p[0][0]) - 1.0 for p in points)
    return [[p[0] ** 2] for p in points]

  fd.estimate(evaluate, [np.array([1.0])], [np.array([1.0])],
              [np.dtype(np.float64)])
  steps = [2.0 ** -k for k in range(17, 52, 2)]
  assert seen == [s for h in steps for s in (h, -h)] + [2 * 2.0 ** -51,
                                                       -2 * 2.0 ** -51, 0.0]


def test_fd_noise_from_the_points_at_1_2_and_4_finest_steps():
  h = 2.0 ** -51  # the finest step about 1.0 (float64)

  def evaluate(points):
    u = [(float(p[0][0]) - 1.0) / h for p in points]
    # a quartic (its fourth differences cancel) plus 1 at the point itself
    return [[np.array([v ** 4 + (v == 0)])] for v in u]

  e = fd.estimate(evaluate, [np.array([1.0])], [np.array([1.0])],
                  [np.dtype(np.float64)])
  # q1 = 24 + 6, q2 = 384 + 6: noise |q2 - 16 q1| / 64 = 90 / 64, times FLOOR
  assert e.floors[0].tolist() == [fd.FLOOR * 90 / 64]
  # flat along t: bounded by the noise the coarsest step could hide, plus
  # eps t'H t from the finest second difference above 4 sigma (at 4h:
  # 2 * 4^4 - 2 = 510)
  assert e.status[0].tolist() == [fd.BOUNDED]
  assert e.bounds[0].tolist() == [
      2 * (90 / 64) / 2.0 ** -17 + fd.FLOOR * EPS64 * 510 / (4 * h) ** 2]
  # the same with two steps only (t = 2^-32: 1 + 2^-53 would round)
  e = fd.estimate(evaluate, [np.array([1.0])], [np.array([2.0 ** -32])],
                  [np.dtype(np.float64)])
  assert e.evaluations == 2 * 2 + 2 + 1
  assert e.floors[0].tolist() == [fd.FLOOR * 90 / 64]


def test_fd_bound_of_a_converging_quotient_closed_form():
  h, c = 2.0 ** -51, 2.0 ** -40  # the finest step about 1.0; a small cubic

  def evaluate(points):
    u = [(float(p[0][0]) - 1.0) / h for p in points]
    return [[np.array([v + c * v ** 3])] for v in u]  # every value exact

  e = fd.estimate(evaluate, [np.array([1.0])], [np.array([1.0])],
                  [np.dtype(np.float64)])
  # D_k = (1 + c s^2) / h at s = h_k / h: the finest quotient, its
  # truncation the last difference 15 c / h, its rounding 4 eps |D|
  d = (1 + c) / h
  assert e.values[0].tolist() == [d]
  assert e.status[0].tolist() == [fd.RESOLVED]
  assert e.bounds[0].tolist() == [2 * (15 * c / h + 4 * EPS64 * d)]
  # two correct evaluations differ by the rounding of x: eps |J t|
  assert e.floors[0].tolist() == [fd.FLOOR * EPS64 * d]
  f = lambda x: 2.0 ** -26 * x  # exactly sqrt(eps) times what it combines
  assert _estimate(f, [1.0], [1.0], combines=1.0).floors[0][0] < 1e-20


def test_fd_a_quotient_that_never_converges_is_bounded_by_its_spread():
  h = 2.0 ** -51  # the finest step about 1.0 (float64)

  def evaluate(points):
    out = []
    for p in points:
      u = (float(p[0][0]) - 1.0) / h
      m = np.log2(abs(u)) / 2 if abs(u) > 2 else 0  # the step is 4^m h
      out.append([np.array([top * u, u * (1 + m % 2)])])
    return out

  top = 2.0 ** 20
  with np.errstate(all="ignore"):
    e = fd.estimate(evaluate, [np.ones(2)], [np.ones(2)],
                    [np.dtype(np.float64)])
  # element 1: quotients 1/h and 2/h by turns, never converging: the
  # finest, 1/h, within 2 (spread + |finest|) plus its rounding; resolved
  # on the scale of its leaf (element 0's 2^20 / h)
  assert e.status[0].tolist() == [fd.RESOLVED, fd.RESOLVED]
  assert e.values[0][1] == 1 / h
  assert e.bounds[0][1] == 2 * (1 / h + 1 / h) + 4 * EPS64 / h
  # element 0, linear: every quotient the same, bounded by its rounding
  assert e.bounds[0][0] == 2 * (TINY64 / 2.0 ** -17 + 4 * EPS64 * top / h)
  # resolved still where the bound is exactly half its leaf's scale
  top = 2 * (4 + 4 * EPS64)
  with np.errstate(all="ignore"):
    e = fd.estimate(evaluate, [np.ones(2)], [np.ones(2)],
                    [np.dtype(np.float64)])
  assert e.bounds[0][1] == 0.5 * top / h
  assert e.status[0].tolist() == [fd.RESOLVED, fd.RESOLVED]


def test_fd_bfloat16_has_three_steps_enough_to_see_a_flat_function():
  e = _estimate(lambda x: 0 * x + 3, [0.5], [1.0], dtype=jnp.bfloat16)
  assert e.evaluations == 2 * 3 + 2 + 1
  assert e.status[0].tolist() == [fd.BOUNDED] and e.values[0].tolist() == [0]


def test_fd_steps_where_x_plus_or_minus_h_t_rounds_are_left_out():
  # 1 + 2^-53 rounds, 1 - 2^-53 does not: the finest step is left out
  e = _estimate(lambda x: x ** 2, [1.0, 1.0], [1.0, 0.25])
  assert e.evaluations == 2 * 17 + 2 + 1
  assert np.all(np.abs(e.values[0] - [2.0, 0.5]) <= e.bounds[0])
  # one step only: estimated (not resolved) without the points at 4h
  e = _estimate(lambda x: x ** 2, [1.0], [2.0 ** -34])
  assert e.evaluations == 2 + 2 + 1
  assert e.status[0].tolist() == [fd.UNRESOLVED]


def test_fd_a_zero_derivative_with_a_zero_bound_stays_resolved():
  """At 0, f = min(y², c) + k max(y - d, 0) is even at every step below d
  (its quotients there are 0, exactly: a bound of 0) but for the largest
  step, whose second difference shrinks by less than 4 into the next one:
  an element resolved to 0 within 0 is not resolved only on its leaf's
  scale, so that roughness does not unresolve it."""
  h0 = 2.0 ** -17  # the largest float64 step
  f = lambda y: (np.minimum(y * y, h0 * h0 / 8)
                 + 2.0 ** -20 * np.maximum(y - h0 / 2, 0))
  e = _estimate(f, [0.0], [1.0])
  assert e.status[0].tolist() == [fd.RESOLVED], e.status
  assert e.values[0].tolist() == [0.0]
