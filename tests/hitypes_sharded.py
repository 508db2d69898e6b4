"""Hi types with explicit sharding and shard_map, on 8 CPU devices.

Run by tests/test_hitypes.py in a subprocess (XLA_FLAGS must be set before JAX
starts). Each ``check_*`` function is one test; the script prints ``PASS name``
or ``FAIL name message`` for each.
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import sys  # noqa: E402
import traceback  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import P  # noqa: E402
from jax._src import core  # noqa: E402
from jax.sharding import AxisType  # noqa: E402

from hitype_examples import (QArrayTy, QPspec, TupPspec, dequantize, get,  # noqa: E402
                             make_tup, quantize)

MESH = jax.make_mesh((4,), ("i",), axis_types=(AxisType.Explicit,),
                     devices=jax.devices()[:4])
X = jnp.arange(24., dtype=jnp.float32).reshape(8, 3) - 7.


def sharded_x():
  return jax.device_put(X, P("i", None))


def check_eight_devices():
  assert jax.device_count() == 8, jax.devices()


def check_shardings_flow_into_hi_types():
  x = sharded_x()
  assert str(jax.typeof(x)) == "float32[8@i,3]", jax.typeof(x)
  q = quantize(x)
  assert jax.typeof(q).str_short() == "q8[8@i,3]"
  assert q.values.sharding.spec == P("i", None)
  assert q.scale.sharding.spec == P("i", None)
  jaxpr = jax.make_jaxpr(lambda x: dequantize(quantize(x)))(x)
  assert "b:q8[8@i,3] = Quantize a" in str(jaxpr), jaxpr
  y = jax.jit(lambda x: dequantize(quantize(x)))(x)
  assert str(jax.typeof(y)) == "float32[8@i,3]"
  np.testing.assert_allclose(y, dequantize(quantize(X)), rtol=1e-6)
  qj = jax.jit(quantize)(x)
  assert jax.typeof(qj) == jax.typeof(q)
  g = jax.grad(lambda q: (dequantize(q) ** 2).sum())(q)
  assert str(jax.typeof(g)) == "float32[8@i,3]"
  g = jax.jit(jax.grad(lambda x: dequantize(quantize(x)).sum()))(x)
  assert str(jax.typeof(g)) == "float32[8@i,3]"


def check_sharding_check_raises_type_error_at_trace_time():
  x = jax.device_put(jnp.ones((8, 4)), P(None, "i"))
  try:
    jax.jit(quantize).trace(x)
  except TypeError as e:
    assert "last axis cannot be sharded" in str(e), e
  else:
    raise AssertionError("no TypeError")


def check_hipspec_to_lo_and_shard_unshard():
  spec = QPspec(P("i", None))
  assert spec.to_lo() == (P("i", None), P("i", None))
  ty = jax.typeof(quantize(sharded_x()))
  local = ty.shard(MESH.abstract_mesh, frozenset({"i"}), False, spec)
  assert local.shape == (2, 3), local
  assert local.unshard(MESH.abstract_mesh, False, spec).shape == (8, 3)
  # JAX's own helpers dispatch to the hi type's methods:
  assert core.shard_aval(MESH.abstract_mesh, frozenset({"i"}), False, spec,
                         ty).shape == (2, 3)


def check_shard_map_with_hi_in_and_out_specs():
  q = quantize(sharded_x())
  seen = []

  def body(q):
    seen.append(jax.typeof(q))
    return quantize(dequantize(q) * 2)

  f = jax.jit(jax.shard_map(body, in_specs=QPspec(P("i", None)),
                            out_specs=QPspec(P("i", None))))
  out = f(q)
  assert seen[0].shape == (2, 3), seen
  assert isinstance(seen[0], QArrayTy)
  assert jax.typeof(out) == jax.typeof(q)
  np.testing.assert_allclose(dequantize(out), 2 * dequantize(q), rtol=1e-6)
  assert "shard_map" in str(jax.make_jaxpr(f)(q))
  row_sums = jax.jit(jax.shard_map(
      lambda q: dequantize(q).sum(1, keepdims=True),
      in_specs=QPspec(P("i", None)), out_specs=P("i", None)))(q)
  np.testing.assert_allclose(row_sums, dequantize(q).sum(1, keepdims=True),
                             atol=1e-5)


def check_grad_through_shard_map_with_hi_values():
  q = quantize(sharded_x())
  consume = jax.shard_map(lambda q: dequantize(q) * 2,
                          in_specs=QPspec(P("i", None)), out_specs=P("i", None))
  g = jax.jit(jax.grad(lambda q: consume(q).sum()))(q)
  assert str(jax.typeof(g)) == "float32[8@i,3]"
  np.testing.assert_array_equal(g, 2 * np.ones((8, 3)))
  produce = jax.shard_map(lambda x: quantize(x * 3), in_specs=P("i", None),
                          out_specs=QPspec(P("i", None)))
  g = jax.jit(jax.grad(lambda x: dequantize(produce(x)).sum()))(sharded_x())
  assert str(jax.typeof(g)) == "float32[8@i,3]"
  np.testing.assert_array_equal(g, 3 * np.ones((8, 3)))


def check_tuple_with_sharded_components():
  x = sharded_x()
  t = make_tup(x, quantize(x))
  assert jax.typeof(t).str_short() == "tup(f32[8@i,3], q8[8@i,3])", jax.typeof(t)
  spec = TupPspec((P("i", None), QPspec(P("i", None))))
  assert spec.to_lo() == (P("i", None),) * 3
  f = jax.jit(jax.shard_map(
      lambda t: make_tup(get(t, 0) + 1, get(t, 1)), in_specs=spec,
      out_specs=spec))
  out = f(t)
  assert jax.typeof(out) == jax.typeof(t)
  np.testing.assert_allclose(out.items[0], X + 1)
  np.testing.assert_array_equal(out.items[1].values, t.items[1].values)


def main():
  failed = 0
  with jax.set_mesh(MESH):
    for name, fn in list(globals().items()):
      if name.startswith("check_") and callable(fn):
        try:
          fn()
          print(f"PASS {name}")
        except Exception:  # report and go on with the next check
          failed += 1
          msg = traceback.format_exc().replace("\n", "\\n")
          print(f"FAIL {name} {msg}")
  sys.exit(1 if failed else 0)


if __name__ == "__main__":
  main()
