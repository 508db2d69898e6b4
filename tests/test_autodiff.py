"""Reverse mode, accumulators, logs, structured residuals, forward mode,
linearization, transposition and compositions of transformations."""
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hijax import (GradAccum, HiPrim, NullAccum, RefAccum, ShapedArray, ValAccum,
                   Zero, instantiate_zeros)

from unary_prim import UnaryPrim, unary


class Base2(HiPrim):
  def __init__(self, x_aval, y_aval, **params):
    self.in_avals = (x_aval, y_aval)
    self.out_aval = x_aval
    self.params = params
    super().__init__()


class SinTimesY(Base2):
  seen_nzs = []

  def expand(self, x, y):
    return jnp.sin(x) * y

  def vjp_fwd(self, nzs_in, x, y):
    SinTimesY.seen_nzs.append(nzs_in)
    return self(x, y), (jnp.cos(x), jnp.sin(x), y)

  def vjp_bwd_retval(self, res, g):
    cos_x, sin_x, y = res
    return cos_x * g * y, sin_x * g

  def jvp(self, primals, tangents):
    (x, y), (dx, dy) = primals, tangents
    dx, dy = instantiate_zeros(dx), instantiate_zeros(dy)
    return self(x, y), jnp.cos(x) * dx * y + jnp.sin(x) * dy


def sin_times_y(x, y):
  return SinTimesY(jax.typeof(x), jax.typeof(y))(x, y)


def plain(x, y):
  return jnp.sin(x) * y


def test_grad_matches_plain_jax_and_nzs_in_is_exact():
  SinTimesY.seen_nzs.clear()
  for argnums in (0, 1, (0, 1)):
    np.testing.assert_allclose(jax.grad(sin_times_y, argnums)(0.7, 1.3),
                               jax.grad(plain, argnums)(0.7, 1.3), rtol=1e-6)
  assert SinTimesY.seen_nzs == [(True, False), (False, True), (True, True)]


def test_vjp_bwd_retval_none_means_zero():
  class Clip(Base2):
    def expand(self, x, bound):
      return x

    def vjp_fwd(self, nzs_in, x, bound):
      return self(x, bound), bound

    def vjp_bwd_retval(self, bound, g):
      return jnp.clip(g, -bound, bound), None

  f = lambda x, b: 3. * Clip(jax.typeof(x), jax.typeof(b))(x, b)
  assert jax.grad(f)(1., 0.5) == 0.5
  assert jax.grad(f, 1)(1., 0.5) == 0.
  assert jax.jit(jax.grad(f))(1., 2.) == 2.
  assert jax.jit(jax.grad(f))(1., 5.) == 3.


def test_unused_output_cotangent_arrives_as_zero():
  seen = []

  class Two(HiPrim):
    def __init__(self, a):
      self.in_avals, self.out_aval, self.params = (a,), (a, a), {}
      super().__init__()

    def expand(self, x):
      return jnp.sin(x), jnp.cos(x)

    def vjp_fwd(self, nzs_in, x):
      return self(x), x

    def vjp_bwd_retval(self, x, g):
      seen.append(tuple(type(t) for t in g))
      g_sin, g_cos = map(instantiate_zeros, g)
      return (jnp.cos(x) * g_sin - jnp.sin(x) * g_cos,)

  f = lambda x: Two(jax.typeof(x))(x)[0]
  np.testing.assert_allclose(jax.grad(f)(0.3), np.cos(0.3), rtol=1e-6)
  assert seen[0][1] is Zero and seen[0][0] is not Zero


class TakeElt(HiPrim):
  kinds = []

  def __init__(self, x_aval, i):
    self.in_avals = (x_aval,)
    self.out_aval = ShapedArray((), x_aval.dtype)
    self.params = dict(i=i)
    super().__init__()

  def expand(self, x):
    return x[self.i]

  def vjp_fwd(self, nzs_in, x):
    return self(x), None

  def vjp_bwd(self, res, g, x_acc):
    TakeElt.kinds.append(type(x_acc))
    assert isinstance(x_acc, GradAccum)
    if isinstance(x_acc, NullAccum):
      return
    if isinstance(x_acc, RefAccum):
      x_acc.ref[self.i] += g
    else:
      x_acc.accum(jnp.zeros(x_acc.aval.shape, x_acc.aval.dtype).at[self.i].add(g))


def take_elt(x, i):
  return TakeElt(jax.typeof(x), i)(x)


def test_accumulators_value_ref_and_null():
  x = jnp.arange(5.)
  TakeElt.kinds.clear()
  np.testing.assert_array_equal(jax.grad(take_elt)(x, 2), [0, 0, 1, 0, 0])
  assert TakeElt.kinds == [ValAccum]

  ref = jax.new_ref(jnp.zeros(5))
  for i in (1, 3, 1):
    _, f_vjp = jax.vjp(partial(take_elt, i=i), x)
    f_vjp.with_refs(ref)(2.)
  np.testing.assert_array_equal(ref[...], [0, 4, 0, 2, 0])
  assert TakeElt.kinds[-1] is RefAccum

  n = len(TakeElt.kinds)
  g = jax.grad(lambda x, y: take_elt(x, 0) * y, 1)(x, 3.)
  assert g == x[0]
  assert len(TakeElt.kinds) == n  # x not differentiated: no backward rule runs

  _, f_vjp = jax.vjp(partial(take_elt, i=0), x)
  (ct,) = f_vjp.with_refs(jax.ad.DontWant())(1.)
  assert TakeElt.kinds[-1] is NullAccum


def test_sparse_ref_accumulation_jaxpr_is_one_element_update():
  x = jnp.arange(10.)
  ref = jax.new_ref(jnp.zeros(10))

  def bwd():
    _, f_vjp = jax.vjp(partial(take_elt, i=3), x)
    f_vjp.with_refs(ref)(1.)

  text = str(jax.jit(bwd).trace().jaxpr)
  assert "b[3] <- " in text and "<- b[3]" in text
  assert "f32[10] = " not in text.split("TakeElt")[1]


class Square(UnaryPrim):
  def expand(self, x):
    return x ** 2

  def vjp_fwd(self, nzs_in, x):
    return self(x), x

  def vjp_bwd(self, x, g, x_acc):
    x_acc.accum(2. * x * g)
    return {self.tag: {"x": x, "g": g}}


def square(x, tag="sq"):
  return Square(jax.typeof(x), tag=tag)(x)


def test_logs_from_with_logs_and_dropped_otherwise():
  y, f_vjp = jax.vjp(lambda x: square(square(x, "in"), "out"), 2.)
  cts, logs = f_vjp.with_logs(1.)
  assert cts == (32.,)
  assert set(logs) == {"in", "out"}
  assert logs["out"]["x"] == 4. and logs["out"]["g"] == 1.
  assert logs["in"]["x"] == 2. and logs["in"]["g"] == 8.
  assert f_vjp(1.) == (32.,)
  assert jax.grad(lambda x: square(x))(3.) == 6.


def test_logs_through_jit_scan_and_cond():
  _, f_vjp = jax.vjp(jax.jit(lambda x: square(x, "j")), 3.)
  assert f_vjp.with_logs(1.)[1]["j"]["x"] == 3.

  def scanned(xs):
    return jax.lax.scan(lambda c, x: (c + square(x, "s"), None), 0., xs)[0]

  _, f_vjp = jax.vjp(scanned, jnp.arange(1., 4.))
  logs = f_vjp.with_logs(1.)[1]
  np.testing.assert_array_equal(logs["s"]["x"], [1., 2., 3.])

  def branchy(x):
    return jax.lax.cond(x > 0, lambda x: square(x, "pos"),
                        lambda x: 2. * square(x, "neg"), x)

  _, f_vjp = jax.vjp(branchy, 3.)
  logs = f_vjp.with_logs(1.)[1]
  assert type(logs["pos"]).__name__ == "CondSum"
  assert int(logs["pos"].index) == 1
  assert logs["pos"].branches[1]["x"] == 3.
  assert logs["pos"].branches[0] is None


def test_duplicate_log_key_raises_naming_key_and_primitive():
  _, f_vjp = jax.vjp(lambda x: square(square(x)), 2.)
  with pytest.raises(ValueError, match=r"Duplicate.*'sq'.*Square"):
    f_vjp.with_logs(1.)
  with pytest.raises(ValueError, match=r"'sq'"):
    jax.grad(lambda x: square(square(x)))(2.)


def test_non_dict_logs_are_rejected():
  class BadLog(Square):
    def vjp_bwd(self, x, g, x_acc):
      x_acc.accum(2. * x * g)
      return [1]

  with pytest.raises(TypeError, match=r"BadLog.vjp_bwd must return None or a dict"):
    jax.grad(unary(BadLog, tag="t"))(1.)


def test_vjp_bwd_retval_logs_flag():
  class Logged(UnaryPrim):
    vjp_bwd_retval_logs = True

    def expand(self, x):
      return jnp.exp(x)

    def vjp_fwd(self, nzs_in, x):
      y = self(x)
      return y, y

    def vjp_bwd_retval(self, y, g):
      return (y * g,), {"exp": g}

  _, f_vjp = jax.vjp(unary(Logged), 0.)
  cts, logs = f_vjp.with_logs(2.)
  assert cts == (2.,) and logs == {"exp": 2.}
  assert jax.grad(unary(Logged))(0.) == 1.


def test_structured_residuals():
  class Cube(UnaryPrim):
    def expand(self, x):
      return x ** 3

    def vjp_fwd(self, nzs_in, x):
      return self(x), (), True, {"x": x}

    def vjp_bwd(self, res, sres, g, x_acc):
      x_acc.accum(3. * sres["x"] ** 2 * g)

  assert jax.grad(unary(Cube))(2.) == 12.
  _, f_vjp = jax.vjp(unary(Cube), 2.)
  leaves = jax.tree.leaves(f_vjp.structured_residuals)
  assert [float(v) for v in leaves] == [2.]


def test_structured_residuals_need_vjp_bwd():
  class Retval(UnaryPrim):
    def expand(self, x):
      return x

    def vjp_fwd(self, nzs_in, x):
      return self(x), (), True, {"x": x}

    def vjp_bwd_retval(self, res, g):
      return (g,)

  with pytest.raises(TypeError, match=r"Retval.vjp_fwd returned structured residuals.*vjp_bwd"):
    jax.grad(unary(Retval))(1.)


def test_nzs_out_false_gives_zero_cotangent():
  class IntOut(HiPrim):
    def __init__(self, a):
      self.in_avals = (a,)
      self.out_aval = (a, ShapedArray((), jnp.int32))
      self.params = {}
      super().__init__()

    def expand(self, x):
      return 2. * x, jnp.int32(7)

    def vjp_fwd(self, nzs_in, x):
      return self(x), None, (True, False)

    def vjp_bwd_retval(self, res, g):
      assert isinstance(g[1], Zero)
      return (2. * g[0],)

  assert jax.grad(lambda x: IntOut(jax.typeof(x))(x)[0])(1.) == 2.


def test_bad_forward_and_backward_returns_are_clear():
  class OneThing(UnaryPrim):
    def expand(self, x):
      return x

    def vjp_fwd(self, nzs_in, x):
      return self(x)

  with pytest.raises(TypeError, match=r"OneThing.vjp_fwd must return \(out, residuals\)"):
    jax.grad(unary(OneThing))(1.)

  class WrongShape(UnaryPrim):
    def expand(self, x):
      return x

    def vjp_fwd(self, nzs_in, x):
      return self(x), None

    def vjp_bwd_retval(self, res, g):
      return (jnp.ones(3) * g,)

  with pytest.raises(TypeError, match=r"WrongShape.vjp_bwd_retval returned a value of type float32\[3\] for the cotangent of input 0, but in_avals declares float32\[\]"):
    jax.grad(unary(WrongShape))(1.)

  class WrongCount(WrongShape):
    def vjp_bwd_retval(self, res, g):
      return g

  with pytest.raises(TypeError, match=r"WrongCount.vjp_bwd_retval must return a tuple with one cotangent per input"):
    jax.grad(unary(WrongCount))(1.)

  class WrongOut(WrongShape):
    def vjp_fwd(self, nzs_in, x):
      return jnp.ones(2), None

  with pytest.raises(TypeError, match=r"WrongOut.vjp_fwd returned a value of type float32\[2\] for the output, but out_aval declares float32\[\]"):
    jax.grad(unary(WrongOut))(1.)

  class WrongJvp(UnaryPrim):
    def expand(self, x):
      return x

    def jvp(self, primals, tangents):
      return primals

  with pytest.raises(TypeError, match=r"WrongJvp.jvp must return a pair"):
    jax.jvp(unary(WrongJvp), (1.,), (1.,))


def test_jvp_rule_and_zero_tangents():
  seen = []

  class Rec(SinTimesY):
    def jvp(self, primals, tangents):
      seen.append(tuple(isinstance(t, Zero) for t in tangents))
      return super().jvp(primals, tangents)

  f = lambda x, y: Rec(jax.typeof(x), jax.typeof(y))(x, y)
  out, t = jax.jvp(lambda x: f(x, 2.), (0.5,), (1.,))
  np.testing.assert_allclose(t, 2 * np.cos(0.5), rtol=1e-6)
  assert seen[-1] == (False, True)


def test_grad_of_jvp_only_primitive_asks_for_vjp_fwd():
  class JvpOnly(UnaryPrim):
    def expand(self, x):
      return jnp.sin(x)

    def jvp(self, primals, tangents):
      (x,), (t,) = primals, tangents
      return self(x), jnp.cos(x) * t

  f = unary(JvpOnly)
  assert jax.jvp(f, (0.,), (2.,))[1] == 2.
  with pytest.raises(NotImplementedError, match="JvpOnly has no reverse-mode rule.*vjp_fwd"):
    jax.grad(f)(0.)


def test_linearize_uses_lin_and_linearized_only():
  calls = []

  class Lin(UnaryPrim):
    def expand(self, x):
      return jnp.sin(x)

    def lin(self, nzs_in, x):
      calls.append("lin")
      return self(x), jnp.cos(x)

    def linearized(self, cos_x, t):
      calls.append("linearized")
      return cos_x * t

    def jvp(self, primals, tangents):
      raise AssertionError("jax.linearize must not call jvp")

  y, f_lin = jax.linearize(unary(Lin), 0.3)
  np.testing.assert_allclose(f_lin(2.), 2 * np.cos(0.3), rtol=1e-6)
  assert calls[:2] == ["lin", "linearized"]


def test_lin_with_structured_residuals():
  class LinS(UnaryPrim):
    def expand(self, x):
      return jnp.exp(x)

    def lin(self, nzs_in, x):
      y = self(x)
      return y, (), True, {"y": y}

    def linearized(self, res, sres, t):
      return sres["y"] * t

  _, f_lin = jax.linearize(unary(LinS), 0.)
  assert f_lin(3.) == 3.


class Scale(UnaryPrim):
  """Linear in x: y = c * x, with a transpose rule."""

  def expand(self, x):
    return self.c * x

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), self(instantiate_zeros(t))

  def transpose(self, ct, x_acc):
    assert isinstance(x_acc, GradAccum)
    x_acc.accum(self.c * ct)


def test_transpose_rule():
  f = unary(Scale, c=3.)
  assert jax.linear_transpose(f, 1.)(2.) == (6.,)
  x = jnp.arange(3.)
  np.testing.assert_array_equal(jax.linear_transpose(f, x)(jnp.ones(3)), (3 * jnp.ones(3),))


def test_transpose_rule_with_nonlinear_operand():
  class MulBy(Base2):
    def expand(self, x, w):
      return x * w

    def transpose(self, ct, x_acc, w):
      assert not isinstance(w, GradAccum)
      x_acc.accum(ct * w)

  f = lambda x: MulBy(jax.typeof(x), jax.typeof(4.))(x, 4.)
  assert jax.linear_transpose(f, 1.)(2.) == (8.,)


class FixedPoint(HiPrim):
  def __init__(self, a_aval, x_aval, *, f):
    self.in_avals = (a_aval, x_aval)
    self.out_aval = x_aval
    self.params = dict(f=f)
    super().__init__()

  def expand(self, a, x0):
    def body(c):
      return c[1], self.f(a, c[1])
    return jax.lax.while_loop(lambda c: jnp.abs(c[0] - c[1]) > 1e-6, body,
                              (x0, self.f(a, x0)))[1]

  def vjp_fwd(self, nzs_in, a, x0):
    x = self(a, x0)
    return x, (a, x)

  def vjp_bwd_retval(self, res, x_bar):
    a, x = res
    _, vjp_a = jax.vjp(lambda a: self.f(a, x), a)
    w = fixed_point(partial(_rev_iter, self.f), (a, x, x_bar), x_bar)
    return vjp_a(w)[0], jnp.zeros_like(x)


def _rev_iter(f, packed, u):
  a, x, x_bar = packed
  _, vjp_x = jax.vjp(lambda x: f(a, x), x)
  return x_bar + vjp_x(u)[0]


def fixed_point(f, a, x0):
  return FixedPoint(jax.tree.map(jax.typeof, a), jax.typeof(x0), f=f)(a, x0)


def newton_sqrt(a):
  return fixed_point(lambda a, x: 0.5 * (x + a / x), a, a)


def test_grad_of_grad_with_a_backward_rule_that_binds_primitives():
  np.testing.assert_allclose(newton_sqrt(2.), np.sqrt(2.), rtol=1e-6)
  np.testing.assert_allclose(jax.grad(newton_sqrt)(2.), 0.5 / np.sqrt(2.), rtol=1e-5)
  np.testing.assert_allclose(jax.grad(jax.grad(newton_sqrt))(2.),
                             -0.25 * 2. ** -1.5, rtol=1e-4)


class SinTimesYBatched(SinTimesY):
  def batch_dim_rule(self, axis_data, in_dims):
    x_dim, y_dim = in_dims
    return x_dim if x_dim is not None else y_dim


def stb(x, y):
  return SinTimesYBatched(jax.typeof(x), jax.typeof(y))(x, y)


def test_hessian_with_jvp_rule():
  def f(x):
    return jnp.sum(stb(x, x ** 2))

  x = jnp.array([0.3, -1.2, 2.0])
  np.testing.assert_allclose(jax.hessian(f)(x),
                             jax.hessian(lambda x: jnp.sum(plain(x, x ** 2)))(x),
                             rtol=1e-5, atol=1e-6)


def test_vmap_of_jit_of_grad_and_jit_of_vmap():
  xs, ys = jnp.linspace(-1, 1, 4), jnp.linspace(0.5, 2, 4)
  expected = jax.vmap(jax.grad(plain))(xs, ys)
  np.testing.assert_allclose(jax.vmap(jax.jit(jax.grad(stb)))(xs, ys), expected,
                             rtol=1e-6)
  np.testing.assert_allclose(jax.jit(jax.vmap(jax.grad(stb)))(xs, ys), expected,
                             rtol=1e-6)
  np.testing.assert_allclose(jax.jit(jax.vmap(stb))(xs, ys), plain(xs, ys), rtol=1e-6)


@pytest.fixture
def remat3():
  if not hasattr(jax.config, "jax_remat3"):
    pytest.skip("this JAX has no jax_remat3 flag")
  old = jax.config.jax_remat3
  jax.config.update("jax_remat3", True)
  yield
  jax.config.update("jax_remat3", old)


def test_checkpoint_with_remat3(remat3):
  def f(x):
    return jnp.sum(sin_times_y(jnp.sin(x), x))

  x = jnp.array([0.1, 0.7])
  expected = jax.grad(lambda x: jnp.sum(plain(jnp.sin(x), x)))(x)
  np.testing.assert_allclose(jax.grad(jax.checkpoint(f))(x), expected, rtol=1e-6)
  np.testing.assert_allclose(jax.jit(jax.grad(jax.checkpoint(f)))(x), expected,
                             rtol=1e-6)
  _, f_vjp = jax.vjp(jax.checkpoint(lambda x: square(x, "r")), 3.)
  assert f_vjp.with_logs(1.)[1]["r"]["x"] == 3.


def test_remat_method_is_used_under_checkpoint(remat3):
  calls = []

  class Saving(SinTimesY):
    def remat(self, trace, x, y):
      calls.append("remat")

      def rem(res, x, y):
        calls.append("rem")
        return self(x, y)
      return self(x, y), (), rem

  f = lambda x: Saving(jax.typeof(x), jax.typeof(2.))(x, 2.)
  np.testing.assert_allclose(jax.grad(jax.checkpoint(f))(0.4), 2 * np.cos(0.4),
                             rtol=1e-6)
  assert calls == ["remat", "rem"]
