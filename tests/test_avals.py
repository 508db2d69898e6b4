"""The type-arithmetic helpers of hijax/_avals.py, and saved_residuals."""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import AbstractMesh, AxisType

import hijax
from hijax import HiPspec, HiType, MappingSpec, ShapedArray

F32 = jnp.dtype("float32")
MESH = AbstractMesh((4,), ("i",), axis_types=(AxisType.Explicit,))


@dataclass(frozen=True)
class Spec(MappingSpec):
  axis: int


@dataclass(frozen=True)
class Pspec(HiPspec):
  spec: jax.P

  def to_lo(self):
    return (self.spec,)


@dataclass(frozen=True)
class BoxTy(HiType):
  """A hi type wrapping one array type; every method forwards to the helpers."""
  inner: ShapedArray

  def dec_rank(self, size, spec):
    return BoxTy(hijax.mapped_aval(size, spec.axis, self.inner))

  def inc_rank(self, size, spec):
    return BoxTy(hijax.unmapped_aval(size, spec.axis, self.inner))

  def shard(self, mesh, manual_axes, check_vma, spec):
    return BoxTy(hijax.shard_aval(mesh, manual_axes, check_vma, spec.spec,
                                  self.inner))

  def unshard(self, mesh, check_vma, spec):
    return BoxTy(hijax.unshard_aval(mesh, check_vma, spec.spec, self.inner))


def test_mapped_aval_of_arrays():
  a = ShapedArray((2, 4, 3), F32)
  assert hijax.mapped_aval(4, 1, a) == ShapedArray((2, 3), F32)
  assert hijax.mapped_aval(2, 0, a) == ShapedArray((4, 3), F32)
  assert hijax.mapped_aval(7, None, a) == a


def test_unmapped_aval_of_arrays():
  a = ShapedArray((8, 3), F32)
  assert hijax.unmapped_aval(5, 1, a) == ShapedArray((8, 5, 3), F32)
  assert hijax.unmapped_aval(5, 0, a) == ShapedArray((5, 8, 3), F32)
  assert hijax.unmapped_aval(5, None, a) == a
  assert hijax.mapped_aval(5, 1, hijax.unmapped_aval(5, 1, a)) == a


def test_mapping_a_hi_type_asks_its_methods():
  box = BoxTy(ShapedArray((2, 3), F32))
  assert hijax.unmapped_aval(4, Spec(1), box) == BoxTy(ShapedArray((2, 4, 3), F32))
  assert hijax.mapped_aval(4, Spec(1), hijax.unmapped_aval(4, Spec(1), box)) == box
  assert hijax.mapped_aval(4, None, box) == box


def test_shard_and_unshard_arrays():
  a = ShapedArray((8, 3), F32)
  piece = hijax.shard_aval(MESH, frozenset({"i"}), True, jax.P("i", None), a)
  assert piece.shape == (2, 3)
  assert piece.str_short() == "float32[2,3]{V:i}"
  whole = hijax.unshard_aval(MESH, True, jax.P("i", None), piece)
  assert whole.shape == (8, 3)
  assert whole.sharding.spec == jax.P("i", None)
  replicated = hijax.shard_aval(MESH, frozenset({"i"}), False, jax.P(), a)
  assert replicated.shape == (8, 3)


def test_shard_and_unshard_a_hi_type_ask_its_methods():
  box = BoxTy(ShapedArray((8, 3), F32))
  piece = hijax.shard_aval(MESH, frozenset({"i"}), True,
                           Pspec(jax.P("i", None)), box)
  assert isinstance(piece, BoxTy) and piece.inner.shape == (2, 3)
  whole = hijax.unshard_aval(MESH, True, Pspec(jax.P("i", None)), piece)
  assert isinstance(whole, BoxTy) and whole.inner.shape == (8, 3)


def test_saved_residuals_lists_types_and_origins():
  def f(x):
    return jnp.sum(jnp.sin(jnp.sin(x)))

  res = hijax.saved_residuals(f, jnp.ones(3))
  assert [aval for aval, _ in res] == [ShapedArray((3,), F32)] * 2
  assert all(desc.startswith("output of cos") for _, desc in res)

  res = hijax.saved_residuals(jax.checkpoint(f), jnp.ones(3))
  assert res == [(ShapedArray((3,), F32), "from the argument x")]


def test_saved_residuals_names_and_keyword_arguments():
  def g(x, *, scale):
    return jnp.sum(checkpoint_name(jnp.sin(x) * scale, "s") ** 2)

  policy = jax.checkpoint_policies.save_only_these_names("s")
  res = hijax.saved_residuals(jax.checkpoint(g, policy=policy), jnp.ones(2),
                              scale=2.)
  assert [d.split(" from ")[0] for _, d in res if "named" in d] == ["named 's'"]
