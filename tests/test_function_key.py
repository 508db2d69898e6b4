"""hijax/_function_key.py: what a function reads through a module or a class
(``config.SCALE``, ``Settings.scale``) is part of its key, so the caches that
key on it (the decorators' kept traces, hijax.implicit's eager programs) see
a change at the next call, as they see a changed global array."""
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hijax
from hijax import implicit
from hijax._function_key import by_value, split

_config = types.ModuleType("_hijax_test_config")
_config.SCALE = 2.0
_config.inner = types.ModuleType("_hijax_test_config.inner")
_config.inner.SHIFT = 0.0
sys.modules[_config.__name__] = _config


class Settings:
  scale = 2.0


def _reads_module(x):
  return jnp.sin(x) * _config.SCALE + _config.inner.SHIFT


def _reads_class(x):
  return jnp.sin(x) * Settings.scale


@pytest.fixture(autouse=True)
def _restore():
  yield
  _config.SCALE, _config.inner.SHIFT, Settings.scale = 2.0, 0.0, 2.0


def _set(scale, shift=0.0):
  _config.SCALE, _config.inner.SHIFT, Settings.scale = scale, shift, scale


def _vjp_decorated(fn):
  f = hijax.custom_vjp(fn)
  f.defvjp(lambda x: (f(x), x),
           lambda x, g: (g * jnp.cos(x) * (_config.SCALE if fn is _reads_module
                                           else Settings.scale),))
  return f


@pytest.mark.parametrize("fn", [_reads_module, _reads_class], ids=["module", "class"])
def test_custom_vjp_sees_an_attribute_changed_between_eager_calls(fn):
  f = _vjp_decorated(fn)
  xs = jnp.linspace(0.1, 1.0, 3)
  for scale, shift in ((2.0, 0.0), (5.0, 0.0), (5.0, 1.5), (2.0, 0.0)):
    _set(scale, shift if fn is _reads_module else 0.0)
    shift = _config.inner.SHIFT
    np.testing.assert_allclose(jax.vmap(f)(xs), scale * np.sin(xs) + shift, rtol=1e-6)
    _, tangent = jax.jvp(f, (xs[1],), (1.0,))
    np.testing.assert_allclose(tangent, scale * np.cos(xs[1]), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(f)(xs[1]), scale * np.cos(xs[1]), rtol=1e-6)


def test_custom_jvp_sees_an_attribute_changed_between_eager_calls():
  f = hijax.custom_jvp(_reads_module)
  f.defjvp(lambda p, t: (f(*p), t[0] * jnp.cos(p[0]) * _config.SCALE))
  xs = jnp.linspace(0.1, 1.0, 3)
  for scale in (2.0, 7.0):
    _set(scale)
    np.testing.assert_allclose(jax.vmap(f)(xs), scale * np.sin(xs), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(f)(xs[1]), scale * np.cos(xs[1]), rtol=1e-6)


def test_implicit_root_sees_a_module_attribute_changed_between_eager_calls():
  def residual(x, a):
    return x ** 3 - a * _config.SCALE
  for scale in (2.0, 3.0):
    _set(scale)
    np.testing.assert_allclose(implicit.root(residual, 1.0, 8.0), (8.0 * scale) ** (1 / 3),
                               rtol=1e-6)


def test_the_key_holds_what_is_read_through_a_module_or_class_and_only_that():
  spec, _ = split(_reads_module)
  assert split(_reads_module)[0] == spec and by_value(_reads_class) == by_value(_reads_class)
  _config.SCALE = 3.0
  assert split(_reads_module)[0] != spec
  _config.SCALE, _config.UNREAD = 2.0, 1.0  # an attribute the code does not read
  assert split(_reads_module)[0] == spec
  before = by_value(_reads_class)
  Settings.scale = 4.0
  assert by_value(_reads_class) != before


_namespace = types.SimpleNamespace(scale=2.0, w=jnp.asarray(1.0))


def _reads_namespace(x):
  return jnp.sin(x) * _namespace.scale + _namespace.w


def test_a_namespace_attribute_changed_between_eager_calls_is_seen():
  """types.SimpleNamespace, a common holder of settings, is keyed by its
  attributes like an object of a plain class (it was keyed by identity)."""
  f = hijax.custom_vjp(_reads_namespace)
  f.defvjp(lambda x: (f(x), x), lambda x, g: (g * jnp.cos(x) * _namespace.scale,))
  xs = jnp.linspace(0.1, 1.0, 3)
  try:
    for scale, w in ((2.0, jnp.asarray(1.0)), (5.0, jnp.asarray(1.0)), (5.0, jnp.asarray(0.0))):
      _namespace.scale, _namespace.w = scale, w
      np.testing.assert_allclose(jax.vmap(f)(xs), scale * np.sin(xs) + float(w), rtol=1e-6)
      _, tangent = jax.jvp(f, (xs,), (jnp.ones(3),))
      np.testing.assert_allclose(tangent, scale * np.cos(xs), rtol=1e-6)
  finally:
    _namespace.scale, _namespace.w = 2.0, jnp.asarray(1.0)
  spec, arrays = split(lambda x: x * _namespace.scale + _namespace.w)
  assert arrays == []  # read from the globals: by identity, not taken out


def test_a_namespace_in_a_closure_is_rebuilt_with_its_arrays():
  ns = types.SimpleNamespace(w=jnp.arange(3.0), scale=2.0)
  spec, arrays = split(lambda x: x * ns.scale + ns.w)
  assert len(arrays) == 1
  again = spec.rebuild([jnp.ones(3)])
  np.testing.assert_allclose(again(jnp.ones(3)), 3.0 * np.ones(3))
