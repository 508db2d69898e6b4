"""A hi type: a value made of two arrays, as a user writes one."""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from hijax import HiPrim, HiType, ShapedArray, register_hitype

F32 = jnp.float32


@dataclass(frozen=True)
class Rank1:
  """The matrix ``outer(u, v)``, kept as its two factors."""
  u: jax.Array
  v: jax.Array


@dataclass(frozen=True)
class Rank1Ty(HiType):
  m: int
  n: int

  def lo_ty(self):
    return [ShapedArray((self.m,), F32), ShapedArray((self.n,), F32)]

  def lower_val(self, r):
    return [r.u, r.v]

  def raise_val(self, u, v):
    return Rank1(u, v)

  def to_tangent_aval(self):
    return ShapedArray((self.m, self.n), F32)

  def str_short(self, short_dtypes=False, mesh_axis_types=False):
    return f"r1[{self.m},{self.n}]"


register_hitype(Rank1, lambda r: Rank1Ty(r.u.shape[0], r.v.shape[0]))


class MakeRank1(HiPrim):
  def __init__(self, m: int, n: int) -> None:
    self.in_avals = (ShapedArray((m,), F32), ShapedArray((n,), F32))
    self.out_aval = Rank1Ty(m, n)
    self.params = {}
    super().__init__()

  def expand(self, u: jax.Array, v: jax.Array) -> Rank1:
    return Rank1(u, v)


class Dense(HiPrim):
  def __init__(self, r_ty: Rank1Ty) -> None:
    self.in_avals = (r_ty,)
    self.out_aval = ShapedArray((r_ty.m, r_ty.n), F32)
    self.params = {}
    super().__init__()

  def expand(self, r: Rank1) -> jax.Array:
    return jnp.outer(r.u, r.v)


def main() -> None:
  u, v = jnp.arange(2.), jnp.arange(3.)
  r = jax.jit(lambda u, v: MakeRank1(2, 3)(u, v))(u, v)
  dense = jax.jit(lambda r: Dense(Rank1Ty(2, 3))(r))(r)
  assert jnp.allclose(dense, jnp.outer(u, v))


if __name__ == "__main__":
  main()
