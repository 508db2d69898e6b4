"""Core behaviours that a one-token mistake in hijax would break.

Each section pins down one class of behaviour, against plain JAX or closed
forms, so that a plausible slip in the core (a flipped comparison, a dropped
``not``, a conversion applied to every argument, an off-by-one in batch-axis
arithmetic, a search that skips base classes) fails a test here:

* eager arguments: NumPy and Python numbers become JAX arrays, JAX values
  (arrays, tracers, hi values) pass through as they are;
* symbolic zeros reach every derived rule (`jvp_from_lin`,
  `linearize_from_jvp`, `vjp_from_jvp`, `vjp_from_lin`) and the default ones
  un-instantiated, and the results still match plain JAX;
* ``float0`` tangents and cotangents mean "zero", and only they do;
* nested ``vmap`` of rules derived from `batch_dim_rule`, with the batch axes
  before, between and after the per-example axes, matches plain JAX;
* a hi value built from tracers is found wherever the tracer sits, base-class
  slots included;
* batch dimensions at the edges of their range, weak types of eager
  outputs, and the backward-rule override check.

tools/mutants.py runs this file first for the core modules.
"""
import itertools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hijax import (HiPrim, HiType, Zero, instantiate_zeros,
                   jvp_from_lin, linearize_from_jvp, register_hitype,
                   vjp_from_jvp, vjp_from_lin)
import hitype_examples as hx
from unary_prim import UnaryPrim, unary

F32 = jnp.float32
RTOL = 1e-6


def close(a, b, rtol=RTOL):
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=rtol,
                                                       atol=1e-6), a, b)


# --- eager arguments ------------------------------------------------------------------

class Double(UnaryPrim):
  seen = []

  def expand(self, x):
    Double.seen.append(x)
    return x * 2  # NumPy or Python arithmetic, were x not converted


class AddTwo(HiPrim):
  seen = []

  def __init__(self, x_aval, y_aval):
    self.in_avals, self.out_aval, self.params = (x_aval, y_aval), x_aval, {}
    super().__init__()

  def expand(self, x, y):
    AddTwo.seen.append((x, y))
    return x + y


@pytest.mark.parametrize("x", [
    np.arange(3, dtype=np.float32), np.arange(3.),  # float64 -> f32 (no x64)
    1.5, 2, np.float32(1.5)], ids=lambda x: type(x).__name__)
def test_numpy_and_python_arguments_become_jax_arrays(x):
  Double.seen.clear()
  f = unary(Double)
  out = f(x)
  assert isinstance(Double.seen[-1], jax.Array), type(Double.seen[-1])
  assert isinstance(out, jax.Array), type(out)
  want = jax.jit(f)(x)
  assert jax.typeof(out) == jax.typeof(want) == jax.typeof(x)
  np.testing.assert_array_equal(out, want)


def test_jax_values_pass_through_unchanged_beside_numpy_ones():
  a, b = jnp.arange(3.), np.ones(3, np.float32)
  AddTwo.seen.clear()
  out = AddTwo(jax.typeof(a), jax.typeof(b))(a, b)
  x, y = AddTwo.seen[-1]
  assert x is a and isinstance(y, jax.Array)
  np.testing.assert_array_equal(out, a + 1)
  # a tracer beside a NumPy argument stays the tracer
  jax.jit(lambda a: AddTwo(jax.typeof(a), jax.typeof(b))(a, b))(a)
  assert isinstance(AddTwo.seen[-1][0], jax.core.Tracer)
  # a hi value beside a NumPy argument is passed on, not converted
  q = hx.quantize(jnp.arange(6.).reshape(2, 3))
  x = np.arange(6, dtype=np.float32).reshape(3, 2)
  np.testing.assert_allclose(hx.qmatmul(q, x), hx.dequantize(q) @ x,
                             rtol=RTOL)


def test_eager_output_has_the_declared_weak_type():
  class Strong(UnaryPrim):  # declared weak, computes a strong value
    def expand(self, x):
      return jnp.asarray(x, F32) * 2

  class Weak(UnaryPrim):  # declared strong, computes a weak value
    def expand(self, x):
      return jnp.sin(1.) + 0 * x.sum()

  weak, strong = jax.typeof(1.), jax.typeof(jnp.float32(1))
  out = Strong(weak)(1.)
  assert jax.typeof(out) == weak == jax.typeof(jax.jit(Strong(weak))(1.))
  out = Weak(strong)(jnp.float32(1))
  assert jax.typeof(out) == strong
  np.testing.assert_allclose(out, np.sin(1.), rtol=RTOL)
  # a weak value is promoted as a weak one: f32 stays f32 with a weak f32
  assert (Strong(weak)(1.) + jnp.float16(1)).dtype == jnp.float16


# --- symbolic zeros into the derived and default rules --------------------------------

def pair_ref(x, y):
  return jnp.sin(x) * y, jnp.cos(x)


class Pair(HiPrim):
  """``(x, y) -> (sin(x) y, cos(x))``: the second output ignores y, so its
  tangent is a symbolic zero whenever only y is differentiated."""

  log = []

  def __init__(self, x_aval, y_aval):
    self.in_avals = (x_aval, y_aval)
    self.out_aval = (x_aval, x_aval)
    self.params = {}
    super().__init__()

  def expand(self, x, y):
    return pair_ref(x, y)

  def batch_dim_rule(self, axis_data, in_dims):
    d = in_dims[0] if in_dims[0] is not None else in_dims[1]
    return (d, d if in_dims[0] is not None else None)


def _skipping_zeros(dx, dy, x, y, res=None):
  """The output tangents, with None (a zero) where no input tangent feeds."""
  cy, s, ms = res if res is not None else (jnp.cos(x) * y, jnp.sin(x),
                                           -jnp.sin(x))
  zx, zy = isinstance(dx, Zero), isinstance(dy, Zero)
  t0 = None if zx and zy else (0 if zx else cy * dx) + (0 if zy else s * dy)
  return t0, None if zx else ms * dx


class WithJvp(Pair):
  def jvp(self, primals, tangents):
    (x, y), (dx, dy) = primals, tangents
    Pair.log.append(("jvp", isinstance(dx, Zero), isinstance(dy, Zero)))
    return self(x, y), _skipping_zeros(dx, dy, x, y)


class WithLin(Pair):
  def lin(self, nzs_in, x, y):
    Pair.log.append(("lin", *nzs_in))
    return self(x, y), (jnp.cos(x) * y, jnp.sin(x), -jnp.sin(x))

  def linearized(self, res, dx, dy):
    Pair.log.append(("linearized", isinstance(dx, Zero), isinstance(dy, Zero)))
    return _skipping_zeros(dx, dy, None, None, res)


class VjpFromJvp(WithJvp):
  vjp_fwd, vjp_bwd_retval = vjp_from_jvp


class LinFromJvp(WithJvp):
  lin, linearized = linearize_from_jvp
  vjp_fwd, vjp_bwd_retval = vjp_from_lin


class VjpFromLin(WithLin):
  vjp_fwd, vjp_bwd_retval = vjp_from_lin


class JvpFromLin(WithLin):
  jvp = jvp_from_lin
  vjp_fwd, vjp_bwd_retval = vjp_from_lin


class HandVjp(Pair):
  """Hand-written retval rule receiving the default rules' zeros."""

  def vjp_fwd(self, nzs_in, x, y):
    Pair.log.append(("vjp_fwd", *nzs_in))
    return self(x, y), (x, y)

  def vjp_bwd_retval(self, res, g):
    x, y = res
    g0, g1 = g
    Pair.log.append(("vjp_bwd", isinstance(g0, Zero), isinstance(g1, Zero)))
    g0, g1 = instantiate_zeros(g0), instantiate_zeros(g1)
    return jnp.cos(x) * y * g0 - jnp.sin(x) * g1, jnp.sin(x) * g0


DERIVED = [VjpFromJvp, LinFromJvp, VjpFromLin, JvpFromLin, HandVjp]
X, Y = jnp.array([0.3, -0.8, 1.1]), jnp.array([1.7, 0.4, -0.6])
DX, DY = jnp.array([1., -2., 0.5]), jnp.array([0.25, 1., -1.])


def bind(cls):
  return lambda x, y: cls(jax.typeof(x), jax.typeof(y))(x, y)


# Scalar losses that leave one output, one input, or both, undifferentiated.
LOSSES = {
    "out0": lambda o: jnp.sum(o[0] ** 2),
    "out1": lambda o: jnp.sum(jnp.tanh(o[1])),
    "both": lambda o: jnp.sum(o[0] * o[1]),
}


@pytest.mark.parametrize("cls", DERIVED, ids=lambda c: c.__name__)
def test_reverse_mode_with_zero_cotangents_and_undifferentiated_inputs(cls):
  f = bind(cls)
  for (name, loss), argnums in itertools.product(LOSSES.items(),
                                                 (0, 1, (0, 1))):
    got = jax.grad(lambda x, y: loss(f(x, y)), argnums)(X, Y)
    want = jax.grad(lambda x, y: loss(pair_ref(x, y)), argnums)(X, Y)
    close(got, want)
  # a vjp applied to a cotangent that is zero for one output
  _, f_vjp = jax.vjp(f, X, Y)
  _, ref_vjp = jax.vjp(pair_ref, X, Y)
  close(f_vjp((DX, jnp.zeros(3))), ref_vjp((DX, jnp.zeros(3))))


@pytest.mark.parametrize("cls", [VjpFromJvp, LinFromJvp, VjpFromLin,
                                 JvpFromLin], ids=lambda c: c.__name__)
def test_forward_mode_and_linearize_with_a_zero_input_tangent(cls):
  f = bind(cls)
  for g, ref in ((lambda x: f(x, Y), lambda x: pair_ref(x, Y)),
                 (lambda y: f(X, y), lambda y: pair_ref(X, y))):
    if cls in (VjpFromJvp, LinFromJvp):
      close(jax.jvp(g, (X,), (DX,)), jax.jvp(ref, (X,), (DX,)))
    if cls is not VjpFromJvp:
      y, g_lin = jax.linearize(g, X)
      y_ref, ref_lin = jax.linearize(ref, X)
      close((y, g_lin(DX)), (y_ref, ref_lin(DX)))
    if cls is JvpFromLin:
      close(jax.jvp(g, (X,), (DX,)), jax.jvp(ref, (X,), (DX,)))


def test_derived_rules_receive_symbolic_zeros_and_flags():
  cases = [
      # (class, what to run, entries of the log that must appear)
      (VjpFromJvp, lambda f: jax.grad(lambda y: f(X, y)[0].sum())(Y),
       [("jvp", True, False)]),
      (VjpFromJvp, lambda f: jax.grad(lambda x: f(x, Y)[0].sum())(X),
       [("jvp", False, True)]),
      (LinFromJvp, lambda f: jax.linearize(lambda y: f(X, y), Y),
       [("jvp", True, False)]),
      (VjpFromLin, lambda f: jax.grad(lambda y: f(X, y)[0].sum())(Y),
       [("lin", False, True), ("linearized", True, False)]),
      (JvpFromLin, lambda f: jax.jvp(lambda y: f(X, y), (Y,), (DY,)),
       [("lin", False, True), ("linearized", True, False)]),
      (JvpFromLin, lambda f: jax.jvp(lambda x: f(x, Y), (X,), (DX,)),
       [("lin", True, False), ("linearized", False, True)]),
      (HandVjp, lambda f: jax.grad(lambda y: f(X, y)[0].sum())(Y),
       [("vjp_fwd", False, True), ("vjp_bwd", False, True)]),
  ]
  for cls, run, want in cases:
    Pair.log.clear()
    run(bind(cls))
    for entry in want:
      assert entry in Pair.log, (cls.__name__, entry, Pair.log)
    assert all(e[0] != "jvp" or e[1:] != (True, True) for e in Pair.log)


@pytest.mark.parametrize("cls", DERIVED, ids=lambda c: c.__name__)
def test_vmap_of_derived_rules_with_symbolic_zeros(cls):
  f = bind(cls)
  xs, ys = jnp.stack([X, 2 * X]), jnp.stack([Y, Y - 1])
  loss = LOSSES["both"]
  for in_axes in ((0, 0), (0, None), (None, 0)):
    args = (xs if in_axes[0] is not None else X,
            ys if in_axes[1] is not None else Y)
    for argnums in (0, 1):
      # the rules under vmap, and the batched rules (`Batched`) differentiated
      close(jax.vmap(jax.grad(lambda x, y: loss(f(x, y)), argnums),
                     in_axes)(*args),
            jax.vmap(jax.grad(lambda x, y: loss(pair_ref(x, y)), argnums),
                     in_axes)(*args))
      close(jax.grad(lambda x, y: loss(jax.vmap(f, in_axes)(x, y)),
                     argnums)(*args),
            jax.grad(lambda x, y: loss(jax.vmap(pair_ref, in_axes)(x, y)),
                     argnums)(*args))
    if cls in (VjpFromJvp, LinFromJvp, JvpFromLin):
      tan = lambda g: lambda x, y: jax.jvp(
          lambda y: jax.vmap(g, in_axes)(x, y), (y,), (jnp.ones_like(y),))
      close(tan(f)(*args), tan(pair_ref)(*args))
      tan = lambda g: lambda x, y: jax.jvp(
          lambda x: jax.vmap(g, in_axes)(x, y), (x,), (jnp.ones_like(x),))
      close(tan(f)(*args), tan(pair_ref)(*args))


class InstantiatingJvp(Pair):
  """Instantiates its zero tangents: their types must be per-example."""

  def jvp(self, primals, tangents):
    (x, y), (dx, dy) = primals, tangents
    dx, dy = instantiate_zeros(dx), instantiate_zeros(dy)
    assert dx.shape == x.shape and dy.shape == y.shape, (dx.shape, x.shape)
    return self(x, y), (jnp.cos(x) * y * dx + jnp.sin(x) * dy,
                        -jnp.sin(x) * dx)


def test_batched_rule_gives_zero_tangents_the_per_example_type():
  f = bind(InstantiatingJvp)
  xs, ys = jnp.stack([X, 2 * X]), jnp.stack([Y, Y - 1])
  for in_axes, args in (((0, 0), (xs, ys)), ((1, 1), (xs.T, ys.T)),
                        ((1, 0), (xs.T, ys))):
    # y is batched and not differentiated: a batched symbolic zero
    tan = lambda g: jax.jvp(lambda x: jax.vmap(g, in_axes)(x, args[1]),
                            (args[0],), (jnp.cos(args[0]),))
    close(tan(f), tan(pair_ref))
    tan = lambda g: jax.jvp(lambda y: jax.vmap(g, in_axes)(args[0], y),
                            (args[1],), (jnp.cos(args[1]),))
    close(tan(f), tan(pair_ref))


def test_grad_of_vmap_counts_an_unbatched_outputs_cotangent_once():
  # Pair's second output, cos(x), is unbatched when only y is: computed once,
  # so its cotangent reaches x once, not once per example.
  ys = jnp.stack([Y, Y - 1, 2 * Y])
  for cls in (HandVjp, VjpFromJvp):
    f = jax.vmap(bind(cls), (None, 0), (0, None))
    assert f(X, ys)[1].shape == (3,)
    close(jax.grad(lambda x: jnp.sum(f(x, ys)[1]))(X), -jnp.sin(X))
    f = jax.vmap(bind(cls), (None, 0))  # out_axes 0: cos(x) broadcast 3 times
    close(jax.grad(lambda x: jnp.sum(f(x, ys)[1]))(X), -3 * jnp.sin(X))
    close(jax.grad(lambda x: LOSSES["both"](f(x, ys)))(X),
          jax.grad(lambda x: LOSSES["both"](
              jax.vmap(pair_ref, (None, 0))(x, ys)))(X))


class OnlyFirst(WithLin):
  """lin says its second output's tangent is zero, then returns one."""

  def lin(self, nzs_in, x, y):
    out, res = super().lin(nzs_in, x, y)
    return out, res, (True, False)


def test_linearized_zeros_follow_nzs_out():
  # A None for an output lin declared nonzero is a zero array, not an error
  # from inside JAX; a nonzero tangent for one declared zero is an error.
  _, f_lin = jax.linearize(bind(VjpFromLin), X, Y)
  _, ref_lin = jax.linearize(pair_ref, X, Y)
  g = lambda x, y: VjpFromLin(jax.typeof(x), jax.typeof(y))(x, y)
  close(jax.linearize(lambda y: g(X, y), Y)[1](DY),
        jax.linearize(lambda y: pair_ref(X, y), Y)[1](DY))
  close(f_lin(DX, DY), ref_lin(DX, DY))
  with pytest.raises(TypeError, match="OnlyFirst.linearized returned a "
                     "nonzero tangent for output 1.*nzs_out False"):
    jax.linearize(lambda x: bind(OnlyFirst)(x, Y), X)[1](DX)


# --- float0: "not differentiable", and only that ----------------------------------------

class Stop(UnaryPrim):
  """A float function declared not differentiable: its tangent is float0."""

  def expand(self, x):
    return jnp.round(x)

  def jvp(self, primals, tangents):
    (x,), _ = primals, tangents
    return self(x), np.zeros(x.shape, jax.dtypes.float0)


class Floor(HiPrim):
  """float32[3] -> int32[3] with a float0 tangent, given as a float0 array."""

  def __init__(self, x_aval):
    self.in_avals = (x_aval,)
    self.out_aval = x_aval.update(dtype=jnp.int32, weak_type=False)
    self.params = {}
    super().__init__()

  def expand(self, x):
    return jnp.floor(x).astype(jnp.int32)

  def jvp(self, primals, tangents):
    (x,), _ = primals, tangents
    return self(x), np.zeros(x.shape, jax.dtypes.float0)


class Shift(HiPrim):
  """``(x: f32, n: i32) -> x + n``; the backward rule returns some value for
  the integer input, which is dropped."""

  def __init__(self, x_aval, n_aval, n_ct=None):
    self.in_avals, self.out_aval = (x_aval, n_aval), x_aval
    self.params = dict(n_ct=n_ct)
    super().__init__()

  def expand(self, x, n):
    return x + n

  def vjp_fwd(self, nzs_in, x, n):
    return self(x, n), None

  def vjp_bwd_retval(self, res, g):
    ct = {"none": None, "f32": jnp.zeros(g.shape),
          "float0": np.zeros(g.shape, jax.dtypes.float0)}[self.n_ct]
    return g, ct


def test_a_float0_tangent_is_a_zero_for_a_float_output():
  f = unary(Stop)
  x = jnp.array([0.4, 1.6, -2.2])
  out, t = jax.jvp(f, (x,), (jnp.ones(3),))
  np.testing.assert_array_equal(out, jnp.round(x))
  assert t.dtype == F32 and not t.any()
  out, t = jax.jvp(lambda x: f(x) + x, (x,), (jnp.ones(3),))
  np.testing.assert_array_equal(t, jnp.ones(3))


def test_a_float0_tangent_for_an_integer_output_is_kept():
  x = jnp.array([0.4, 1.6, -2.2])
  out, t = jax.jvp(lambda x: Floor(jax.typeof(x))(x), (x,), (jnp.ones(3),))
  assert out.dtype == jnp.int32 and t.dtype == jax.dtypes.float0


@pytest.mark.parametrize("n_ct", ["none", "f32", "float0"])
def test_any_cotangent_of_the_right_shape_for_an_integer_input_is_dropped(n_ct):
  x, n = jnp.array([0.5, 1.5]), jnp.array([1, 2], jnp.int32)
  f = lambda x, n: Shift(jax.typeof(x), jax.typeof(n), n_ct)(x, n).sum()
  gx, gn = jax.grad(f, (0, 1), allow_int=True)(x, n)
  np.testing.assert_array_equal(gx, jnp.ones(2))
  assert gn.dtype == jax.dtypes.float0 and gn.shape == (2,)


def test_a_float_zero_tangent_for_an_integer_output_is_rejected():
  class BadFloor(Floor):
    def jvp(self, primals, tangents):
      (x,), _ = primals, tangents
      return self(x), jnp.zeros(x.shape)

  with pytest.raises(TypeError, match="BadFloor.jvp.*float0.*return None"):
    jax.jvp(lambda x: BadFloor(jax.typeof(x))(x), (X,), (DX,))


# --- nested vmap: batch axes before, between and after the per-example axes ------------

class SumLast(UnaryPrim):
  """Sums the last per-example axis: ``(a, b) -> (a,)``.

  With the batch axis at ``d`` of the batched ``(a, b)`` operand, the output
  batch axis is ``d`` for ``d < 2`` and 1 for ``d == 2`` (after ``a``): the
  rule's arithmetic depends on where the axis is.
  """

  def __init__(self, x_aval):
    self.in_avals = (x_aval,)
    self.out_aval = x_aval.update(shape=x_aval.shape[:-1])
    self.params = {}
    HiPrim.__init__(self)

  def expand(self, x):
    return jnp.sum(jnp.sin(x), axis=-1)

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), jnp.sum(jnp.cos(x) * instantiate_zeros(t), axis=-1)

  vjp_fwd, vjp_bwd_retval = vjp_from_jvp

  def batch_dim_rule(self, axis_data, in_dims):
    (d,) = in_dims
    ndim = len(self.in_avals[0].shape)  # per-example rank, batch axis excluded
    return min(d, ndim - 1)


def sum_last(x):
  return SumLast(jax.typeof(x))(x)


def sum_last_ref(x):
  return jnp.sum(jnp.sin(x), axis=-1)


A, B, INNER, OUTER = 2, 3, 4, 5


def _batched(shape_axes):
  """An array of shape (A, B) with INNER and OUTER axes inserted."""
  (i_in, i_out) = shape_axes
  shape = [A, B]
  shape.insert(i_in % 3, INNER)
  shape.insert(i_out % 4, OUTER)
  return jnp.sin(jnp.arange(np.prod(shape), dtype=F32)).reshape(shape)


def test_nested_vmap_with_batch_axes_on_every_side():
  # Every inner axis with every outer one (before, at and after it), each
  # with another pair of out_axes.
  outs = itertools.cycle(((0, 0), (1, 2), (-1, 1), (0, -1), (1, 0)))
  for (i_in, i_out), (o_in, o_out) in zip(itertools.product(
      (0, 1, 2, -1), (0, 1, 2, 3)), outs):
    x = _batched((i_in, i_out))
    nest = lambda f: jax.vmap(jax.vmap(f, i_in, o_in), i_out, o_out)
    got, want = nest(sum_last)(x), nest(sum_last_ref)(x)
    assert got.shape == want.shape, (i_in, i_out, o_in, o_out)
    close(got, want)


def test_nested_vmap_of_derivatives_with_moved_axes():
  for i_in, i_out in ((2, 1), (1, 3), (2, 2)):
    x = _batched((i_in, i_out))
    nest = lambda f: jax.vmap(jax.vmap(f, i_in, 1), i_out, 0)
    close(nest(jax.grad(lambda x: sum_last(x).sum()))(x),
          nest(jax.grad(lambda x: sum_last_ref(x).sum()))(x))
    # derivatives of the batched primitives themselves (Batched of Batched)
    loss = lambda f: lambda x: jnp.sum(jnp.cos(nest(f)(x)))
    close(jax.grad(loss(sum_last))(x), jax.grad(loss(sum_last_ref))(x))
    close(jax.jvp(nest(sum_last), (x,), (jnp.cos(x),)),
          jax.jvp(nest(sum_last_ref), (x,), (jnp.cos(x),)))
    tangent = lambda f: lambda x: jax.jvp(f, (x,), (jnp.cos(x),))[1]
    close(nest(tangent(sum_last))(x), nest(tangent(sum_last_ref))(x))
    # the outer vmap over a function holding a batched primitive inside jit
    close(jax.vmap(jax.jit(jax.vmap(sum_last, i_in)), i_out)(x),
          jax.vmap(jax.vmap(sum_last_ref, i_in), i_out)(x))


def test_triple_vmap_and_unbatched_second_argument():
  x = jnp.sin(jnp.arange(2 * 3 * 4 * 5 * 2, dtype=F32)).reshape(2, 3, 4, 5, 2)
  for axes in ((0, 1, 2), (2, 0, 1), (1, 2, 4)):
    nest = lambda f: jax.vmap(jax.vmap(jax.vmap(f, axes[0]), axes[1]),
                              axes[2], 2)
    close(nest(sum_last)(x), nest(sum_last_ref)(x))
  f, ref = bind(VjpFromJvp), pair_ref
  xs = jnp.stack([X, -X, 2 * X])  # (3, 3): outer batch over rows
  ys = jnp.stack([Y, Y + 1])      # (2, 3)
  nest = lambda f: jax.vmap(jax.vmap(f, (None, 0)), (0, None), 1)
  close(nest(f)(xs, ys), nest(ref)(xs, ys))


# --- batch dimensions at the edges of their range ------------------------------------

class MoveBatch(UnaryPrim):
  """Elementwise, putting the output's batch axis where `params` says."""

  def expand(self, x):
    return jnp.sin(x)

  def batch(self, axis_data, args, dims):
    (x,), (d,) = args, dims
    return jnp.moveaxis(jnp.sin(x), d, self.out % (x.ndim)), self.out


class MoveBatchDim(UnaryPrim):
  """The same through batch_dim_rule: the derived rule moves the axis."""

  def expand(self, x):
    return jnp.sin(x)

  def batch_dim_rule(self, axis_data, in_dims):
    return self.out


@pytest.mark.parametrize("cls", [MoveBatch, MoveBatchDim])
def test_batch_dims_from_minus_ndim_plus_one_to_ndim_are_accepted(cls):
  x = jnp.arange(24.).reshape(4, 2, 3) / 24  # batch axis 0, per example (2, 3)
  for out in (-3, -2, -1, 0, 1, 2):  # per-example rank 2: batched rank 3
    got = jax.vmap(unary(cls, out=out), out_axes=0)(x)
    close(got, jnp.sin(x))


@pytest.mark.parametrize("cls", [MoveBatch, MoveBatchDim])
@pytest.mark.parametrize("out", [3, -4, True])
def test_batch_dims_out_of_range_or_bool_are_rejected(cls, out):
  x = jnp.arange(24.).reshape(4, 2, 3)
  method = "batch" if cls is MoveBatch else "batch_dim_rule"
  with pytest.raises(TypeError, match=rf"{cls.__name__}.{method} returned the "
                     rf"batch dimension {out!r}.*from -3 to 2"):
    jax.vmap(unary(cls, out=out))(x)


# --- hi values built from tracers, wherever the tracer sits --------------------------

class Base:
  __slots__ = ("a",)


class Holder(Base):
  __slots__ = ("b", "__dict__")

  def __init__(self, a, b, **extra):
    self.a, self.b = a, b
    self.__dict__.update(extra)


@dataclass(frozen=True)
class HolderTy(HiType):
  def lo_ty(self):
    return []


register_hitype(Holder, lambda h: HolderTy())


@pytest.mark.parametrize("where", [
    "base-slot", "own-slot", "dict", "in-tuple", "in-dict", "nested-object"])
def test_a_hi_value_built_from_tracers_is_found(where):
  def build(x):
    c = jnp.zeros(2)
    return {
        "base-slot": lambda: Holder(x, c),
        "own-slot": lambda: Holder(c, x),
        "dict": lambda: Holder(c, c, extra=x),
        "in-tuple": lambda: Holder(c, (1, [c, x])),
        "in-dict": lambda: Holder(c, c, extra={"k": x}),
        "nested-object": lambda: Holder(c, Holder(c, x)),
    }[where]()

  with pytest.raises(TypeError, match="Holder value was built from traced"):
    jax.jit(lambda x: jax.typeof(build(x)))(jnp.ones(2))
  assert jax.typeof(build(jnp.ones(2))) == HolderTy()  # concrete: fine


# --- the backward-rule override check ------------------------------------------------

class RetvalRule(UnaryPrim):
  def expand(self, x):
    return 3 * x

  def vjp_fwd(self, nzs_in, x):
    return self(x), None

  def vjp_bwd_retval(self, res, g):
    return (3 * g,)


def test_vjp_bwd_beside_vjp_bwd_retval():
  with pytest.raises(TypeError, match="Both.vjp_bwd .*never be called"):
    class Both(RetvalRule):  # noqa: F841
      def vjp_bwd(self, res, g, acc):
        acc.accum(3 * g)

      def vjp_bwd_retval(self, res, g):
        return (3 * g,)

  class Replaces(RetvalRule):  # a subclass's vjp_bwd replaces the retval rule
    def vjp_bwd(self, res, g, acc):
      acc.accum(4 * g)

  np.testing.assert_allclose(jax.grad(unary(Replaces))(1.), 4.)

  class AccumBase(UnaryPrim):
    def vjp_bwd(self, res, g, acc):
      acc.accum(g)

  with pytest.raises(TypeError, match="Hidden.vjp_bwd .*never be called"):
    class Hidden(AccumBase):  # noqa: F841
      def vjp_bwd_retval(self, res, g):
        return (g,)
