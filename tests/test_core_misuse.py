"""Held-out misuse: copied primitives, non-array residuals, jnp on hi values.

* A primitive instance that is pickled and unpickled (or deep-copied) is the
  same primitive: equal, hash-equal (also when pickled in another process,
  whose string hashes differ), and a cache hit for ``jit``.
* A residual that is not a JAX value, and a hi value given to ``jax.numpy``
  or an array operator, get errors that name the class, the method and the
  fix, instead of JAX's internal ones.
"""
import copy
import os
import pickle
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hitype_examples as hx
from unary_prim import UnaryPrim, unary
from zoo import SinTimesY, Square

TESTS = Path(__file__).resolve().parent


def _copies(p):
  return [pickle.loads(pickle.dumps(p)), copy.deepcopy(p), copy.copy(p)]


def _examples():
  x = jnp.arange(6.).reshape(2, 3)
  return [Square(jax.typeof(1.5)),
          SinTimesY(jax.typeof(x), jax.typeof(x)),
          hx.Quantize(jax.typeof(x)),
          hx.QMatmul(jax.typeof(hx.quantize(x)), jax.typeof(x.T))]


@pytest.mark.parametrize("hashed_first", [False, True])
def test_copied_primitives_are_equal_and_hash_equal(hashed_first):
  for p in _examples():
    if hashed_first:
      hash(p)
    for q in _copies(p):
      assert q == p and p == q, (p, q)
      assert hash(q) == hash(p), (p, q)
      assert len({p, q}) == 1


def test_pickled_array_types_are_equal():
  # The root cause of unequal copies: JAX's layout singleton did not survive
  # pickling, so an unpickled ShapedArray differed from the original.
  for aval in (jax.typeof(1.), jax.typeof(jnp.ones((2, 3), jnp.int32))):
    assert pickle.loads(pickle.dumps(aval)) == aval


def test_primitive_pickled_in_another_process_is_equal():
  # The other process has other string hashes (PYTHONHASHSEED), so a hash
  # cached in the pickle would differ from this process's.
  script = (
      "import pickle, sys, jax; import hijax; from zoo import Square; "
      "p = Square(jax.typeof(1.5)); hash(p); "
      "sys.stdout.buffer.write(pickle.dumps(p))")
  env = dict(os.environ, PYTHONHASHSEED="12345",
             PYTHONPATH=os.pathsep.join([str(TESTS.parent), str(TESTS),
                                         os.environ.get("PYTHONPATH", "")]),
             JAX_PLATFORMS="cpu")
  data = subprocess.run([sys.executable, "-c", script], env=env, check=True,
                        capture_output=True, timeout=120).stdout
  q, p = pickle.loads(data), Square(jax.typeof(1.5))
  assert q == p and hash(q) == hash(p)


def test_copied_primitive_hits_the_jit_cache():
  traces = []

  @jax.jit
  def apply(x):
    traces.append(1)
    return Square(jax.typeof(x))(x)

  call = jax.jit(lambda prim, x: prim(x), static_argnums=0)
  p = Square(jax.typeof(1.5))
  want = call(p, 1.5)
  for q in _copies(p):
    np.testing.assert_allclose(call(q, 1.5), want)
  assert call._cache_size() == 1
  # and a primitive rebuilt from an unpickled type is the same jit key too
  aval = pickle.loads(pickle.dumps(jax.typeof(1.5)))
  np.testing.assert_allclose(call(Square(aval), 1.5), want)
  assert call._cache_size() == 1
  np.testing.assert_allclose(apply(1.5), 2.25)
  np.testing.assert_allclose(apply(2.5), 6.25)
  assert len(traces) == 1


# --- a residual that is not a JAX value ----------------------------------------------

class StrResidual(UnaryPrim):
  def expand(self, x):
    return jnp.sin(x)

  def vjp_fwd(self, nzs_in, x):
    return self(x), {"how": "cos", "c": jnp.cos(x)}

  def vjp_bwd_retval(self, res, g):
    return (g * res["c"],)


@pytest.mark.parametrize("transform,arg", [
    (jax.grad, 0.5), (lambda f: jax.jit(jax.grad(f)), 0.5),
    (lambda f: lambda x: jax.vjp(f, x), 0.5)], ids=["grad", "jit-grad", "vjp"])
def test_string_residual_is_named_with_the_fix(transform, arg):
  with pytest.raises(TypeError) as e:
    transform(unary(StrResidual))(arg)
  msg = str(e.value)
  for part in ("StrResidual.vjp_fwd", "a str", "residuals['how']",
               "not a JAX value", "StrResidual.params", "as an array"):
    assert part in msg, (part, msg)


def test_array_and_static_residuals_still_work():
  # Python and NumPy numbers are JAX values; `None` is no leaf at all.
  class Mixed(UnaryPrim):
    def expand(self, x):
      return jnp.sin(x)

    def vjp_fwd(self, nzs_in, x):
      return self(x), (jnp.cos(x), 2, np.float32(3.), None)

    def vjp_bwd_retval(self, res, g):
      c, two, three, none = res
      assert none is None
      return (g * c * two * three / 6,)

  np.testing.assert_allclose(jax.grad(unary(Mixed))(0.5), np.cos(0.5),
                             rtol=1e-6)


# --- jax.numpy applied to a hi value --------------------------------------------------

Q = hx.quantize(jnp.arange(6.).reshape(2, 3))


@pytest.mark.parametrize("use", [
    lambda q: jnp.sin(q), lambda q: jnp.sum(q), lambda q: jnp.ones(3) @ q,
    lambda q: jnp.add(jnp.ones((2, 3)), q)], ids=["sin", "sum", "rmatmul",
                                                 "add"])
@pytest.mark.parametrize("jit", [False, True])
def test_jnp_on_a_traced_hi_value_names_the_type_and_the_fix(use, jit):
  with pytest.raises(TypeError) as e:
    (jax.jit(use) if jit else use)(Q)
  msg = str(e.value)
  for part in ("hi type QArrayTy", "q8[2,3]", "jax.numpy",
               "QArrayTy.__jax_array__", "HiPrim", "expand"):
    assert part in msg, (part, msg)


@pytest.mark.parametrize("op,name", [(lambda q: q + 1., "add"),
                                     (lambda q: q @ jnp.ones(3), "matmul"),
                                     (lambda q: -q, "neg"),
                                     (lambda q: q[0], "getitem")])
def test_operator_on_a_traced_hi_value_names_the_type_and_the_fix(op, name):
  with pytest.raises(AttributeError) as e:
    jax.jit(op)(Q)
  msg = str(e.value)
  for part in (f"array operator `{name}`", "hi type QArrayTy", "HiPrim",
               f"QArrayTy._{name} = aval_method(fn)"):
    assert part in msg, (part, msg)


def test_reading_a_field_of_a_traced_hi_value_is_explained():
  with pytest.raises(AttributeError) as e:
    jax.jit(lambda q: q.values)(Q)
  msg = f"{e.value} {e.value.__cause__}"  # JAX's tracer re-raises ours
  for part in ("hi type QArrayTy has no attribute 'values'", "opaque",
               "QArrayTy.values = aval_method(fn)"):
    assert part in msg, (part, msg)


def test_hi_values_still_work_through_their_primitives():
  x = jnp.arange(6.).reshape(2, 3)
  np.testing.assert_allclose(jax.jit(hx.dequantize)(Q), hx.dequantize(Q))
  np.testing.assert_allclose(hx.dequantize(Q), x, atol=0.03)
