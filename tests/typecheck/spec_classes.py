"""Primitives written like the spec page's classes (../shared/spec), plus the
same rules annotated, and the derived-rule pairs unpacked in a class body."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from hijax import (HiPrim, NullAccum, RefAccum, ShapedArray, jvp_from_lin,
                   linearize_from_jvp, vjp_from_jvp)


class SinTimesY(HiPrim):
  jet_from_expand = True  # its rules are expand's derivatives

  def __init__(self, x_aval, y_aval):
    self.in_avals = (x_aval, y_aval)
    self.out_aval = x_aval
    self.params = {}
    super().__init__()

  def expand(self, x, y):
    return jnp.sin(x) * y

  def vjp_fwd(self, nzs_in, x, y):
    return self(x, y), (jnp.cos(x), jnp.sin(x), y)

  def vjp_bwd_retval(self, res, g):
    cos_x, sin_x, y = res
    return (cos_x * g * y, sin_x * g)

  def jvp(self, primals, tangents):
    (x, y), (x_dot, y_dot) = primals, tangents
    return self(x, y), jnp.cos(x) * x_dot * y + jnp.sin(x) * y_dot

  def batch_dim_rule(self, axis_data, in_dims):
    return in_dims[0]


class TakeElt(HiPrim):
  """Accumulates into the gradient itself (``vjp_bwd``), with a param."""

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
    if isinstance(x_acc, NullAccum):
      return
    elif isinstance(x_acc, RefAccum):
      ref = x_acc.ref
      assert ref is not None  # JAX types RefAccum.ref as optional
      ref[self.i] += g
    else:
      one_hot = jnp.zeros(x_acc.aval.shape, x_acc.aval.dtype).at[self.i].add(g)
      x_acc.accum(one_hot)


class Scale(HiPrim):
  """Annotated rules, a linear primitive with a transpose, derived pairs."""

  def __init__(self, x_aval: ShapedArray, c: float) -> None:
    self.in_avals = (x_aval,)
    self.out_aval = x_aval
    self.params = {"c": c}
    super().__init__()

  def expand(self, x: jax.Array) -> jax.Array:
    return self.c * x

  def jvp(self, primals: tuple[jax.Array], tangents: tuple[Any]
          ) -> tuple[jax.Array, jax.Array]:
    (x,), (t,) = primals, tangents
    return self(x), self(t)

  vjp_fwd, vjp_bwd_retval = vjp_from_jvp

  def transpose(self, ct: jax.Array, x_acc: Any) -> None:
    x_acc.accum(self.c * ct)

  def dce(self, used_outs: bool, live_ins: Any) -> tuple[bool, bool, HiPrim]:
    return True, True, self


class Cube(HiPrim):
  """Forward mode derived from a handwritten linearization."""

  def __init__(self, x_aval: ShapedArray) -> None:
    self.in_avals, self.out_aval, self.params = (x_aval,), x_aval, {}
    super().__init__()

  def expand(self, x: jax.Array) -> jax.Array:
    return x ** 3

  def lin(self, nzs_in: tuple[bool, ...], x: jax.Array
          ) -> tuple[jax.Array, jax.Array]:
    return self(x), 3 * x ** 2

  def linearized(self, res: jax.Array, x_dot: jax.Array) -> jax.Array:
    return res * x_dot

  jvp = jvp_from_lin


class Exp(HiPrim):
  """Linearization derived from ``jvp``."""

  def __init__(self, x_aval):
    self.in_avals, self.out_aval, self.params = (x_aval,), x_aval, {}
    super().__init__()

  def expand(self, x):
    return jnp.exp(x)

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    y = self(x)
    return y, y * t

  lin, linearized = linearize_from_jvp


def main() -> None:
  x = jnp.arange(3.)
  f = lambda x, y: SinTimesY(jax.typeof(x), jax.typeof(y))(x, y)
  assert jnp.allclose(jax.grad(f)(2., 3.), jnp.cos(2.) * 3.)
  take = lambda x: TakeElt(jax.typeof(x), 1)(x)
  assert jnp.allclose(jax.grad(take)(x), jnp.array([0., 1., 0.]))
  scale = lambda x: Scale(jax.typeof(x), 2.)(x).sum()
  assert jnp.allclose(jax.grad(scale)(x), 2.)
  cube = lambda x: Cube(jax.typeof(x))(x)
  assert jnp.allclose(jax.jvp(cube, (2.,), (1.,))[1], 12.)
  exp = lambda x: Exp(jax.typeof(x))(x)
  assert jnp.allclose(jax.linearize(exp, 0.)[1](1.), 1.)


if __name__ == "__main__":
  main()
