"""Reverse mode through a hi type whose cotangent type differs from its
tangent type: the zero cotangent of an output nobody differentiates, and the
accumulator of an input nobody differentiates, have the cotangent type
(``to_ct_aval``), not the tangent type. (A mutation run found that nothing
failed when they were given the tangent type.)"""
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hijax import (HiPrim, HiType, ShapedArray, Zero, instantiate_zeros,
                   register_hitype)

F32 = jnp.dtype("float32")
N = 3


@dataclass(frozen=True)
class Vec:
  v: jax.Array  # float32[n]


@dataclass(frozen=True)
class VecTy(HiType):
  """A vector whose tangent is float32[n] and whose cotangent is a column,
  float32[n, 1]."""
  n: int

  def lo_ty(self):
    return [ShapedArray((self.n,), F32)]

  def lower_val(self, x):
    return [x.v]

  def raise_val(self, v):
    return Vec(v)

  def to_tangent_aval(self):
    return ShapedArray((self.n,), F32)

  def to_ct_aval(self):
    return ShapedArray((self.n, 1), F32)

  def str_short(self, short_dtypes=False, mesh_axis_types=False):
    return f"vec[{self.n}]"


register_hitype(Vec, lambda x: VecTy(x.v.shape[0]))
COLUMN = ShapedArray((N, 1), F32)


class Mix(HiPrim):
  """(Vec(2), sum(v * x)) of a Vec v and an array x: the Vec output is a
  constant, and `vjp_fwd` says so (``nzs_out``), so hijax hands the backward
  rule a symbolic zero for its cotangent. The rule records the types of what
  it gets: that zero and the accumulator of each input."""
  seen: list = []

  def __init__(self, x_aval):
    self.in_avals = (VecTy(N), x_aval)
    self.out_aval = (VecTy(N), ShapedArray((), F32))
    self.params = {}
    super().__init__()

  def expand(self, v, x):
    return Vec(jnp.full((N,), 2.0, F32)), jnp.sum(v.v * x)

  def vjp_fwd(self, nzs_in, v, x):
    return self(v, x), (v.v, x), (False, True)

  def vjp_bwd(self, res, g, v_acc, x_acc):
    v, x = res
    g_vec, g_sum = g
    Mix.seen.append({"g_vec": g_vec.aval if isinstance(g_vec, Zero) else None,
                     "v_acc": (type(v_acc).__name__, v_acc.aval)})
    g_sum = instantiate_zeros(g_sum)
    v_acc.accum(jnp.reshape(g_sum * x, v_acc.aval.shape))
    x_acc.accum(jnp.reshape(g_sum * v, x_acc.aval.shape))


def mix(v, x):
  return Mix(jax.typeof(x))(v, x)


V0 = jnp.array([1.0, -2.0, 0.5], F32)
X0 = jnp.array([0.3, 1.5, -1.0], F32)


@pytest.fixture(autouse=True)
def _clear_seen():
  Mix.seen.clear()


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_an_output_without_cotangent_and_an_undifferentiated_hi_input(jit):
  """Only x is differentiated: v's accumulator is a null one, and the Vec
  output (declared constant) gets a symbolic zero; both have the cotangent
  type, float32[3, 1], not the tangent type, float32[3]."""
  v = Vec(V0)
  loss = lambda x: mix(v, x)[1]
  grad = jax.jit(jax.grad(loss)) if jit else jax.grad(loss)
  np.testing.assert_allclose(grad(X0), V0, rtol=1e-6)
  (seen,) = Mix.seen
  assert seen["g_vec"] == COLUMN
  assert seen["v_acc"] == ("NullAccum", COLUMN)


def test_vjp_of_both_outputs():
  """jax.vjp with a cotangent for each output: the declared-zero Vec output
  still reaches the rule as a zero of the cotangent type."""
  v = Vec(V0)
  out, f_vjp = jax.vjp(lambda x: mix(v, x), X0)
  (gx,) = f_vjp((jnp.zeros((N, 1), F32), jnp.float32(3.0)))
  np.testing.assert_allclose(gx, 3.0 * V0, rtol=1e-6)
  np.testing.assert_allclose(out[1], jnp.sum(V0 * X0), rtol=1e-6)
  (seen,) = Mix.seen
  assert seen["g_vec"] == COLUMN
  assert seen["v_acc"] == ("NullAccum", COLUMN)
