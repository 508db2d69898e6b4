"""`jvp = jvp_from_vjp`: forward mode by transposing a reverse-only rule.

Values are checked against plain JAX; the non-linear backward rules must be
rejected with a message naming the class, the rule and the operation.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hijax import (HiPrim, instantiate_zeros, jvp_from_vjp, linearize_from_jvp,
                   vjp_from_jvp, vjp_from_lin)
from hijax import _linearity


class Softplus(HiPrim):
  """log(1 + e^x), with only a reverse-mode rule."""

  def __init__(self, x_aval):
    self.in_avals, self.out_aval, self.params = (x_aval,), x_aval, {}
    super().__init__()

  def expand(self, x):
    return jnp.logaddexp(x, 0.)

  def vjp_fwd(self, nzs_in, x):
    return self(x), jax.nn.sigmoid(x)

  def vjp_bwd_retval(self, s, g):
    return (g * s,)

  def batch_dim_rule(self, axis_data, in_dims):
    return in_dims[0]

  jvp = jvp_from_vjp
  lin, linearized = linearize_from_jvp


def softplus(x):
  return Softplus(jax.typeof(x))(x)


def ref_softplus(x):
  return jnp.logaddexp(x, 0.)


class SinTimes(HiPrim):
  """sin(x) * y, two inputs; the backward rule uses jnp.where and None."""

  def __init__(self, x_aval, y_aval):
    self.in_avals, self.out_aval, self.params = (x_aval, y_aval), x_aval, {}
    super().__init__()

  def expand(self, x, y):
    return jnp.sin(x) * y

  def vjp_fwd(self, nzs_in, x, y):
    return self(x, y), (x, y, nzs_in)

  def vjp_bwd_retval(self, res, g):
    x, y, (nx, ny) = res
    dx = jnp.where(x == x, jnp.cos(x) * y * g, 0.) if nx else None
    return dx, (jnp.sin(x) * g if ny else None)

  def batch_dim_rule(self, axis_data, in_dims):
    return next(d for d in in_dims if d is not None)

  jvp = jvp_from_vjp


def sin_times(x, y):
  return SinTimes(jax.typeof(x), jax.typeof(y))(x, y)


class Polar(HiPrim):
  """(x, y) -> {"r": hypot, "t": atan2}: a pytree output, and vjp_bwd."""

  def __init__(self, x_aval):
    self.in_avals = (x_aval, x_aval)
    self.out_aval = {"r": x_aval, "t": x_aval}
    self.params = {}
    super().__init__()

  def expand(self, x, y):
    return {"r": jnp.hypot(x, y), "t": jnp.arctan2(y, x)}

  def vjp_fwd(self, nzs_in, x, y):
    out = self(x, y)
    return out, (x, y, out["r"])

  def vjp_bwd(self, res, g, x_acc, y_acc):
    x, y, r = res
    gr, gt = (instantiate_zeros(g[k]) for k in ("r", "t"))
    x_acc.accum(gr * x / r - gt * y / r ** 2)
    y_acc.accum(gr * y / r + gt * x / r ** 2)

  jvp = jvp_from_vjp


def polar(x, y):
  return Polar(jax.typeof(x))(x, y)


def ref_polar(x, y):
  return {"r": jnp.hypot(x, y), "t": jnp.arctan2(y, x)}


class MatVec(HiPrim):
  """A @ x, with a backward rule built from a scan and a cond."""

  def __init__(self, a_aval, x_aval):
    self.in_avals = (a_aval, x_aval)
    self.out_aval = jax.core.ShapedArray(a_aval.shape[:1], a_aval.dtype)
    self.params = {}
    super().__init__()

  def expand(self, a, x):
    return a @ x

  def vjp_fwd(self, nzs_in, a, x):
    return self(a, x), (a, x)

  def vjp_bwd_retval(self, res, g):
    a, x = res

    def step(acc, row_and_gi):
      row, gi = row_and_gi
      return acc + row * gi, None
    gx, _ = jax.lax.scan(step, jnp.zeros_like(x), (a, g))
    ga = jax.lax.cond(True, lambda g: jnp.outer(g, x), lambda g: -g[:, None]
                      * x, g)
    return ga, gx

  jvp = jvp_from_vjp


def matvec(a, x):
  return MatVec(jax.typeof(a), jax.typeof(x))(a, x)


X = jnp.array([-1.5, -0.2, 0.7, 2.0])
V = jnp.array([1.0, -2.0, 0.5, 3.0])


# The rules compute the derivative with other formulas than JAX's autodiff of
# the same functions (softplus's slope as a sigmoid, not the derivative of
# logaddexp). On a CPU they agree to float32's last bits; a TPU's float32
# exp and logistic are each up to about 100 ulps off (measured on a TPU v5e,
# docs/accelerator-results.json), and the two formulas differed by 8.7e-5
# relative there.
FORMULAS = 1 if jax.default_backend() == "cpu" else 20


def close(a, b, rtol=1e-5):
  jax.tree.map(lambda a, b: np.testing.assert_allclose(
      a, b, rtol=rtol * FORMULAS, atol=1e-6), a, b)


@pytest.mark.parametrize("jit", [False, True])
def test_jvp_jacfwd_hessian_linearize_match_plain_jax(jit):
  wrap = jax.jit if jit else (lambda f: f)
  close(wrap(lambda x, v: jax.jvp(softplus, (x,), (v,)))(X, V),
        jax.jvp(ref_softplus, (X,), (V,)))
  close(wrap(jax.jacfwd(softplus))(X), jax.jacfwd(ref_softplus)(X))

  def loss(f):
    return lambda x: jnp.sum(f(x) ** 3)
  close(wrap(jax.hessian(loss(softplus)))(X),
        jax.hessian(loss(ref_softplus))(X), rtol=1e-4)
  y, f_lin = jax.linearize(softplus, X)
  close((y, f_lin(V)), jax.jvp(ref_softplus, (X,), (V,)))


def test_vmap_of_jvp_jacfwd_hessian_linearize():
  xs = jnp.stack([X, X + 1., -X])
  vs = jnp.stack([V, -V, 2 * V])
  jvp = lambda f: jax.vmap(lambda x, v: jax.jvp(f, (x,), (v,)))
  close(jax.jit(jvp(softplus))(xs, vs), jvp(ref_softplus)(xs, vs))
  close(jax.vmap(jax.jacfwd(softplus))(xs),
        jax.vmap(jax.jacfwd(ref_softplus))(xs))
  loss = lambda f: (lambda x: jnp.sum(jnp.sin(f(x))))
  close(jax.vmap(jax.hessian(loss(softplus)))(xs),
        jax.vmap(jax.hessian(loss(ref_softplus)))(xs), rtol=1e-4)
  lin = lambda f: jax.vmap(lambda x, v: jax.linearize(f, x)[1](v))
  close(lin(softplus)(xs, vs), lin(ref_softplus)(xs, vs))


def test_two_inputs_one_differentiated_and_where_in_the_rule():
  ref = lambda x, y: jnp.sin(x) * y
  y0 = jnp.cos(X)
  for tangents in ((V, jnp.zeros(4)), (jnp.zeros(4), V), (V, 2 * V)):
    close(jax.jvp(sin_times, (X, y0), tangents),
          jax.jvp(ref, (X, y0), tangents))
  close(jax.jvp(lambda x: sin_times(x, y0), (X,), (V,)),
        jax.jvp(lambda x: ref(x, y0), (X,), (V,)))
  close(jax.jacfwd(sin_times, (0, 1))(X, y0), jax.jacfwd(ref, (0, 1))(X, y0))


def test_pytree_output_and_accumulating_backward_rule():
  y0 = jnp.abs(X) + 0.5
  close(jax.jit(lambda t: jax.jvp(polar, (X, y0), t))((V, -V)),
        jax.jvp(ref_polar, (X, y0), (V, -V)))


def test_scan_and_cond_in_the_backward_rule():
  a = jnp.arange(12.).reshape(3, 4) / 7.
  close(jax.jvp(matvec, (a, X), (a[::-1], V)),
        jax.jvp(jnp.matmul, (a, X), (a[::-1], V)))
  close(jax.jit(jax.jacfwd(matvec, 1))(a, X), a)


# --- what is rejected ---------------------------------------------------------

def _variant(bwd):
  return type("Bad", (Softplus,), {"vjp_bwd_retval": bwd})


@pytest.mark.parametrize("bwd, what", [
    (lambda self, s, g: (jnp.clip(g, -1., 1.) * s,),
     r"`max` inside `clip` at .*test_jvp_from_vjp.py:\d+.* is applied to the "
     r"cotangent, and is not linear"),
    (lambda self, s, g: (g * s + 1.,),
     r"`add` at .* combines the cotangent with a value that does not depend "
     r"on it \(the rule is affine in g"),
    (lambda self, s, g: (g * g * s,), r"`mul` .* multiplies the cotangent by "
     r"itself"),
    (lambda self, s, g: (jnp.where(g > 0, g, 0.) * s,), r"`gt` .* is applied"),
    (lambda self, s, g: (jnp.ones_like(s),), r"its output 0 does not depend on "
     r"the cotangent"),
    (lambda self, s, g: ((g * 4).astype(jnp.int32).astype(s.dtype) * s,),
     r"`convert_element_type` .* converts the cotangent to an integer"),
    (lambda self, s, g: (s / g,), r"`div` .* where it is not linear"),
])
def test_a_nonlinear_backward_rule_is_rejected(bwd, what):
  bad = _variant(bwd)
  prefix = (r"Bad.jvp = jvp_from_vjp transposes Bad.vjp_bwd_retval in the "
            r"cotangent g, but Bad.vjp_bwd_retval is not linear in g: ")
  for run in (lambda: jax.jvp(lambda x: bad(jax.typeof(x))(x), (X,), (V,)),
              lambda: jax.jit(jax.jacfwd(lambda x: bad(jax.typeof(x))(x)))(X)):
    with pytest.raises(TypeError, match=prefix + what):
      run()


def test_affine_cond_and_scan_are_rejected():
  def traced(f):
    return jax.make_jaxpr(f)(X)
  branches = lambda g: jax.lax.cond(g[0] > 0, lambda g: g, lambda g: g + 0.,
                                    g)
  assert "`gt`" in _linearity.nonlinear_reason(traced(branches), [True])
  one_path = lambda g: jax.lax.cond(True, lambda g: 2 * g,
                                    lambda g: jnp.ones_like(g), g)
  assert "gives the cotangent on one path" in _linearity.nonlinear_reason(
      traced(one_path), [True])

  def carry_from_ones(g):
    return jax.lax.scan(lambda c, gi: (c + gi, c), jnp.ones(()), g)[1]
  assert "affine" in _linearity.nonlinear_reason(traced(carry_from_ones),
                                                 [True])

  def carry_from_zeros(g):
    return jax.lax.scan(lambda c, gi: (c + gi, c), jnp.zeros(()), g)[1]
  assert _linearity.nonlinear_reason(traced(carry_from_zeros), [True]) is None


def test_deriving_both_modes_from_each_other_is_an_error():
  with pytest.raises(TypeError, match=r"Circle sets both `jvp = jvp_from_vjp` "
                     r"and `vjp_fwd, vjp_bwd_retval = vjp_from_jvp`"):
    class Circle(HiPrim):
      jvp = jvp_from_vjp
      vjp_fwd, vjp_bwd_retval = vjp_from_jvp
  with pytest.raises(TypeError, match=r"Circle2 sets both `jvp = jvp_from_vjp` "
                     r"and `vjp_fwd, vjp_bwd_retval = vjp_from_lin` with "
                     r"`lin, linearized = linearize_from_jvp`"):
    class Circle2(HiPrim):
      jvp = jvp_from_vjp
      vjp_fwd, vjp_bwd_retval = vjp_from_lin
      lin, linearized = linearize_from_jvp


def test_assigned_to_the_wrong_name_or_without_a_reverse_rule():
  with pytest.raises(TypeError, match=r"Wrong.lin is set to jvp_from_vjp's "
                     r"`jvp` method: .* write `jvp = jvp_from_vjp`"):
    class Wrong(HiPrim):
      lin = jvp_from_vjp

  class NoReverse(HiPrim):
    def __init__(self, x_aval):
      self.in_avals, self.out_aval, self.params = (x_aval,), x_aval, {}
      super().__init__()

    def expand(self, x):
      return 2 * x
    jvp = jvp_from_vjp
  with pytest.raises(NotImplementedError, match=r"NoReverse sets `jvp = "
                     r"jvp_from_vjp`, .* but has no `vjp_fwd`"):
    jax.jvp(lambda x: NoReverse(jax.typeof(x))(x), (X,), (V,))


def _carry_chain(g, first):
  """A scan whose carries settle one per pass: ``first`` enters carry a on
  the first pass, reaches b on the second, c on the third, and only on the
  fourth d, which holds the cotangent."""
  def body(carry, _):
    a, b, c, d = carry
    return (first(a), a, b, d + g + c), None
  z = jnp.zeros_like(g)
  (_, _, _, d), _ = jax.lax.scan(body, (z, z, z, z), None, length=5)
  return d


def test_scan_carries_that_settle_over_several_passes():
  """The walk must repeat the body until no carry changes: stopping after
  one pass (or two) passed an affine rule, whose transpose drops the
  constant, so that jvp_from_vjp gave a wrong tangent silently."""
  traced = lambda f: jax.make_jaxpr(f)(X)
  affine = lambda g: _carry_chain(g, jnp.ones_like)
  assert "affine in g" in _linearity.nonlinear_reason(traced(affine), [True])
  linear = lambda g: _carry_chain(g, lambda a: 2 * a)  # zeros stay zeros
  assert _linearity.nonlinear_reason(traced(linear), [True]) is None

  def bwd(first):
    return lambda self, s, g: (_carry_chain(g, first) * s,)
  bad = _variant(bwd(jnp.ones_like))
  with pytest.raises(TypeError, match=r"not linear in g: `add` .* affine"):
    jax.jvp(lambda x: bad(jax.typeof(x))(x), (X,), (V,))
  good = _variant(bwd(lambda a: 2 * a))  # the backward rule is 5 g s
  close(jax.jvp(lambda x: good(jax.typeof(x))(x), (X,), (V,))[1],
        5 * jax.nn.sigmoid(X) * V)
