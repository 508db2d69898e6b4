"""Hi types used by the tests: a quantized array, a rank-1 matrix, and a tuple.

* `QArray`/`QArrayTy`: int8 values with one float32 scale per row. Its type
  keeps the `ShapedArray` of the int8 values, so shape, sharding and varying
  manual axes come along. Quantize/dequantize have straight-through
  derivatives; `qmatmul` mixes a hi and an array argument.
* `Rank1`/`Rank1Ty`: a matrix ``u v^T`` kept as its two factors; its tangent
  type is the dense matrix.
* `Tup`/`TupTy`: a tuple whose components are arrays or hi values.

Shared by tests/test_hitypes.py and the 8-device script tests/hitypes_sharded.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax._src import core

from hijax import (HiPrim, HiPspec, HiType, MappingSpec, ShapedArray,
                   instantiate_zeros, register_hitype)

F32 = jnp.dtype("float32")
I8 = jnp.dtype("int8")


# --- quantized arrays -----------------------------------------------------------------

@dataclass(frozen=True)
class QArray:
  values: jax.Array  # int8[..., n]
  scale: jax.Array   # float32[..., 1]


@dataclass(frozen=True)
class QSpec(MappingSpec):
  axis: int = 0


@dataclass(frozen=True)
class QPspec(HiPspec):
  spec: jax.P

  def to_lo(self):
    return (self.spec, self.spec)

  def to_tangent_spec(self):
    return self.spec


@dataclass(frozen=True)
class QArrayTy(HiType):
  values_ty: ShapedArray  # the type of the int8 values

  def __post_init__(self):
    spec = self.values_ty.sharding.spec
    if len(spec) == len(self.values_ty.shape) and spec[-1] is not None:
      raise TypeError(
          f"q8 keeps one scale per row, so the last axis cannot be sharded; "
          f"got {self.values_ty.str_short(mesh_axis_types=True)}")

  @property
  def shape(self):
    return self.values_ty.shape

  def scale_ty(self):
    return self.values_ty.update(shape=self.values_ty.shape[:-1] + (1,), dtype=F32)

  def lo_ty(self):
    return [self.values_ty, self.scale_ty()]

  def lower_val(self, q):
    return [q.values, q.scale]

  def raise_val(self, values, scale):
    return QArray(values, scale)

  def to_tangent_aval(self):
    return self.values_ty.update(dtype=F32)

  def str_short(self, short_dtypes=False, mesh_axis_types=False):
    return "q8" + self.values_ty.str_short(True, mesh_axis_types)[2:]

  def dec_rank(self, size, spec):
    if spec.axis >= len(self.shape) - 1:
      raise TypeError(f"cannot map {self.str_short()} along its last axis")
    return QArrayTy(core.mapped_aval(size, spec.axis, self.values_ty))

  def inc_rank(self, size, spec):
    return QArrayTy(core.unmapped_aval(size, spec.axis, self.values_ty))

  def leading_axis_spec(self):
    return QSpec(0)

  def shard(self, mesh, manual_axes, check_vma, spec):
    return QArrayTy(core.shard_aval(mesh, manual_axes, check_vma, spec.spec,
                                    self.values_ty))

  def unshard(self, mesh, check_vma, spec):
    return QArrayTy(core.unshard_aval(mesh, check_vma, spec.spec, self.values_ty))


def _typeof_qarray(q):
  return QArrayTy(jax.typeof(q.values))


register_hitype(QArray, _typeof_qarray)


def qtype_like(x_aval):
  """The q8 type quantizing an array of type ``x_aval``."""
  return QArrayTy(x_aval.update(dtype=I8, weak_type=False))


class Quantize(HiPrim):
  def __init__(self, x_aval):
    self.in_avals = (x_aval,)
    self.out_aval = qtype_like(x_aval)
    self.params = {}
    super().__init__()

  def expand(self, x):
    scale = jnp.max(jnp.abs(x), axis=-1, keepdims=True) / 127.
    scale = jnp.where(scale == 0, 1., scale)
    return QArray(jnp.round(x / scale).astype(I8), scale)

  def vjp_fwd(self, nzs_in, x):
    return self(x), None

  def vjp_bwd_retval(self, res, g):
    return (g,)  # straight-through

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), t

  def batch(self, axis_data, args, dims):
    (x,), (d,) = args, dims
    return quantize(jnp.moveaxis(x, d, 0)), QSpec(0)


class Dequantize(HiPrim):
  def __init__(self, q_aval):
    self.in_avals = (q_aval,)
    self.out_aval = q_aval.to_tangent_aval()
    self.params = {}
    super().__init__()

  def expand(self, q):
    return q.values.astype(F32) * q.scale

  def vjp_fwd(self, nzs_in, q):
    return self(q), None

  def vjp_bwd_retval(self, res, g):
    return (g,)

  def jvp(self, primals, tangents):
    (q,), (t,) = primals, tangents
    return self(q), t

  def batch(self, axis_data, args, dims):
    (q,), (d,) = args, dims
    return dequantize(q), d.axis


class QMatmul(HiPrim):
  """``dequantize(q) @ x``: a hi argument next to an array argument."""

  def __init__(self, q_aval, x_aval):
    self.in_avals = (q_aval, x_aval)
    self.out_aval = ShapedArray(q_aval.shape[:-1] + x_aval.shape[1:], F32)
    self.params = {}
    super().__init__()

  def expand(self, q, x):
    return (q.values.astype(F32) * q.scale) @ x

  def vjp_fwd(self, nzs_in, q, x):
    return self(q, x), (dequantize(q), x)

  def vjp_bwd_retval(self, res, g):
    w, x = res
    return g @ x.T, w.T @ g


def quantize(x):
  return Quantize(jax.typeof(x))(x)


def dequantize(q):
  return Dequantize(jax.typeof(q))(q)


def qmatmul(q, x):
  return QMatmul(jax.typeof(q), jax.typeof(x))(q, x)


# --- rank-1 matrices ----------------------------------------------------------------------

@dataclass(frozen=True)
class Rank1:
  u: jax.Array  # [m]
  v: jax.Array  # [n]


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
    return ShapedArray((self.m, self.n), F32)  # tangents are dense matrices

  def str_short(self, short_dtypes=False, mesh_axis_types=False):
    return f"r1[{self.m},{self.n}]"


register_hitype(Rank1, lambda r: Rank1Ty(r.u.shape[0], r.v.shape[0]))


class MakeRank1(HiPrim):
  def __init__(self, m, n):
    self.in_avals = (ShapedArray((m,), F32), ShapedArray((n,), F32))
    self.out_aval = Rank1Ty(m, n)
    self.params = {}
    super().__init__()

  def expand(self, u, v):
    return Rank1(u, v)

  def vjp_fwd(self, nzs_in, u, v):
    return self(u, v), (u, v)

  def vjp_bwd_retval(self, res, g):  # g: dense [m, n]
    u, v = res
    return g @ v, g.T @ u


class ToDense(HiPrim):
  def __init__(self, r_aval):
    self.in_avals = (r_aval,)
    self.out_aval = r_aval.to_tangent_aval()
    self.params = {}
    super().__init__()

  def expand(self, r):
    return jnp.outer(r.u, r.v)

  def vjp_fwd(self, nzs_in, r):
    return self(r), None

  def vjp_bwd_retval(self, res, g):
    return (g,)


class Rank1Matmul(HiPrim):
  def __init__(self, r_aval, x_aval):
    self.in_avals = (r_aval, x_aval)
    self.out_aval = ShapedArray((r_aval.m,) + x_aval.shape[1:], F32)
    self.params = {}
    super().__init__()

  def expand(self, r, x):  # u (v^T x): never forms the m x n matrix
    return jnp.outer(r.u, r.v @ x) if x.ndim == 2 else r.u * (r.v @ x)

  def vjp_fwd(self, nzs_in, r, x):
    return self(r, x), (to_dense(r), x)

  def vjp_bwd_retval(self, res, g):
    dense, x = res
    if x.ndim == 1:
      return jnp.outer(g, x), dense.T @ g
    return g @ x.T, dense.T @ g


def rank1(u, v):
  return MakeRank1(u.shape[0], v.shape[0])(u, v)


def to_dense(r):
  return ToDense(jax.typeof(r))(r)


def r1matmul(r, x):
  return Rank1Matmul(jax.typeof(r), jax.typeof(x))(r, x)


# --- tuples of arrays and hi values ----------------------------------------------------------

@dataclass(frozen=True)
class Tup:
  items: tuple


@dataclass(frozen=True)
class TupSpec(MappingSpec):
  specs: tuple  # per component: an int, None or a MappingSpec


@dataclass(frozen=True)
class TupPspec(HiPspec):
  specs: tuple  # per component: a jax.P or a HiPspec

  def to_lo(self):
    return tuple(lo for s in self.specs for lo in s.to_lo())


def _split(types, lo_vals):
  out, i = [], 0
  for t in types:
    k = len(t.lo_ty())
    out.append(lo_vals[i:i + k])
    i += k
  return out


@dataclass(frozen=True)
class TupTy(HiType):
  types: tuple

  def lo_ty(self):
    return [lo for t in self.types for lo in t.lo_ty()]

  def lower_val(self, tup):
    return [lo for t, x in zip(self.types, tup.items) for lo in t.lower_val(x)]

  def raise_val(self, *lo_vals):
    return Tup(tuple(t.raise_val(*chunk)
                     for t, chunk in zip(self.types, _split(self.types, lo_vals))))

  def str_short(self, short_dtypes=False, mesh_axis_types=False):
    return "tup(" + ", ".join(t.str_short(True, mesh_axis_types)
                              for t in self.types) + ")"

  def dec_rank(self, size, spec):
    return TupTy(tuple(t if s is None else t.dec_rank(size, s)
                       for t, s in zip(self.types, spec.specs)))

  def inc_rank(self, size, spec):
    return TupTy(tuple(t if s is None else t.inc_rank(size, s)
                       for t, s in zip(self.types, spec.specs)))

  def leading_axis_spec(self):
    return TupSpec(tuple(t.leading_axis_spec() for t in self.types))

  def shard(self, mesh, manual_axes, check_vma, spec):
    return TupTy(tuple(core.shard_aval(mesh, manual_axes, check_vma, s, t)
                       for t, s in zip(self.types, spec.specs)))

  def unshard(self, mesh, check_vma, spec):
    return TupTy(tuple(core.unshard_aval(mesh, check_vma, s, t)
                       for t, s in zip(self.types, spec.specs)))


register_hitype(Tup, lambda tup: TupTy(tuple(map(jax.typeof, tup.items))))


class MakeTup(HiPrim):
  def __init__(self, *types):
    self.in_avals = types
    self.out_aval = TupTy(types)
    self.params = {}
    super().__init__()

  def expand(self, *items):
    return Tup(items)

  def batch(self, axis_data, args, dims):
    return make_tup(*args), TupSpec(tuple(dims))


class Get(HiPrim):
  def __init__(self, tup_aval, i):
    self.in_avals = (tup_aval,)
    self.out_aval = tup_aval.types[i]
    self.params = dict(i=i)
    super().__init__()

  def expand(self, tup):
    return tup.items[self.i]

  def batch(self, axis_data, args, dims):
    (tup,), (spec,) = args, dims
    return get(tup, self.i), spec.specs[self.i]


def make_tup(*items):
  return MakeTup(*map(jax.typeof, items))(*items)


def get(tup, i):
  return Get(jax.typeof(tup), i)(tup)
