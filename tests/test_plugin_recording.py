"""What ``pytest --hijax-check-rules`` records (hijax.testing._plugin._recorder),
the inputs it checks at (plugin._check.candidates) and how a rule's check
is stopped, without running pytest."""
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hijax
from hijax.testing._plugin import _check as _plugin_inputs
from hijax.testing._plugin import _recorder

import zoo


@jax.custom_jvp
def sin(x):
  return jnp.sin(x)


sin.defjvp(lambda p, t: (sin(p[0]), jnp.cos(p[0]) * t[0]))


def scaled(fn, x, scale):
  return fn(x) * scale


scaled = jax.custom_jvp(scaled, nondiff_argnums=(0,))
scaled.defjvp(lambda fn, p, t: (scaled(fn, *p), jax.jvp(
    lambda x, s: fn(x) * s, p, t)[1]))


@hijax.custom_vjp
def cube(x):
  return x ** 3


cube.defvjp(lambda x: (cube(x), x), lambda x, g: (3 * x * x * g,))


@pytest.fixture
def recorder():
  rec = _recorder.CallRecorder(samples=2)
  rec.install()
  try:
    yield rec
  finally:
    rec.remove()


def _rule(rec, name):
  rules = [r for r in rec.rules.values() if r.identity.name == name]
  assert len(rules) == 1, list(rec.rules)
  return rules[0]


def test_eager_calls_keep_a_copy_of_their_values(recorder):
  x = np.array([0.1, 0.2])
  sin(x)
  x[0] = 5.0  # the test changes its array afterwards
  rule = _rule(recorder, "sin")
  (sample,) = rule.samples.values()
  assert sample.source == "eager" and sample.concrete
  np.testing.assert_array_equal(sample.leaves[0], [0.1, 0.2])
  assert rule.identity.kind == "jax.custom_jvp"
  assert rule.identity.where() == (__file__, sin.fun.__code__.co_firstlineno)


def test_traced_calls_keep_types_or_the_values_jax_knows(recorder):
  # (each test traces its own shapes: jit does not trace a function again
  # for types it has seen, so no call would be recorded)
  jax.jit(sin)(jnp.ones((2, 3)))
  jax.grad(lambda x: sin(x).sum())(jnp.full(4, 0.5))
  sources = {s.types()[0]: s.source
             for s in _rule(recorder, "sin").samples.values()}
  assert sources == {"f32[2,3]": "traced", "f32[4]": "traced, values known"}
  known = next(s for s in _rule(recorder, "sin").samples.values()
               if s.source == "traced, values known")
  np.testing.assert_array_equal(known.leaves[0], np.full(4, 0.5))


def test_a_sample_of_types_is_replaced_by_one_with_values(recorder):
  jax.jit(sin)(jnp.ones(6))
  sin(jnp.zeros(6))
  (sample,) = _rule(recorder, "sin").samples.values()
  assert sample.source == "eager"


def test_samples_are_bounded_and_repeats_cost_a_lookup(recorder):
  for n in range(1, 6):
    sin(jnp.ones(n))
  rule = _rule(recorder, "sin")
  assert len(rule.samples) == 2 and rule.full and rule.calls == 5
  assert [s.types() for s in rule.samples.values()] == [["f32[1]"],
                                                        ["f32[2]"]]


def test_nondiff_arguments_and_functions_are_kept_by_reference(recorder):
  scaled(jnp.tanh, jnp.array([0.5]), scale=2.0)
  (sample,) = _rule(recorder, "scaled").samples.values()
  assert sample.types() == ["f32[1]", "float"]
  # float32 tanh on the default device (on a TPU 3e-5 off; sin would be 1%)
  assert sample.call([np.array([0.25]), 4.0]) == pytest.approx(
      4 * np.tanh(0.25), rel=1e-4)


def test_a_custom_jvp_made_per_call_is_one_rule(recorder):
  for scale in (1.0, 2.0):
    f = jax.custom_jvp(lambda x, scale=scale: scale * x)
    f.defjvp(lambda p, t, scale=scale: (scale * p[0], scale * t[0]))
    f(jnp.ones(2))
  assert len(recorder.rules) == 1
  assert next(iter(recorder.rules.values())).calls == 2


def test_hijax_decorators_and_primitives_are_recorded_once(recorder):
  cube(jnp.ones(2))
  jax.jit(cube)(jnp.ones(3))
  zoo.log1pexp(jnp.ones(2))
  jax.vmap(zoo.log1pexp)(jnp.ones((2, 2)))
  kinds = sorted((r.identity.kind, r.identity.name)
                 for r in recorder.rules.values())
  assert kinds == [("HiPrim", "Log1pExp"), ("hijax.custom_vjp", "cube")]


def test_rules_of_jax_are_counted_not_recorded(recorder):
  jax.nn.relu(jnp.ones(2))
  assert not recorder.rules and len(recorder.skipped_rules) == 1
  with_jax = _recorder.CallRecorder(include_jax=True)
  with_jax.install()
  try:
    jax.nn.relu(jnp.ones(2))
  finally:
    with_jax.remove()
  (rule,) = with_jax.rules.values()
  assert rule.identity.target.__module__.startswith("jax.")


@jax.custom_jvp
def noisy(x, key):
  return x + jax.random.normal(key, x.shape)


noisy.defjvp(lambda p, t: (noisy(*p), t[0]))


def test_prng_keys_and_large_inputs(recorder):
  noisy(jnp.ones(2), jax.random.key(0))  # a key: kept as it is
  (sample,) = _rule(recorder, "noisy").samples.values()
  assert sample.types() == ["f32[2]"] and 1 in sample.statics
  sin(jnp.ones(_recorder.MAX_ELEMENTS + 1))
  (big,) = _rule(recorder, "sin").samples.values()
  assert big.source == "too large to keep" and not big.concrete


def test_removing_restores_every_call(recorder):
  wrapped = [jax.custom_jvp, jax.custom_vjp, hijax.custom_vjp.__mro__[1],
             hijax.HiPrim]
  assert all("_recorder" in c.__call__.__code__.co_filename for c in wrapped)
  recorder.remove()
  assert not any("_recorder" in c.__call__.__code__.co_filename
                 for c in wrapped)
  recorder.install()  # (the fixture removes it again)


def test_a_library_primitive_is_recorded_once_registered(recorder):
  """A primitive whose jvp rule is registered outside JAX is watched from
  the next `watch` (each test's start) until `remove`."""
  from jax.extend.core import Primitive
  from jax.interpreters import ad
  p = Primitive("halved")
  p.def_impl(lambda x: x / 2)
  p.def_abstract_eval(lambda x: x)
  p.bind(1.0)
  ad.primitive_jvps[p] = lambda x, t: (p.bind(*x), p.bind(*t))
  try:
    p.bind(2.0)  # not watched yet
    recorder.watch()
    assert "bind" in vars(p)
    p.bind(jnp.array([3.0, 4.0]))
    (rule,) = [r for r in recorder.rules.values() if r.identity.name ==
               "halved"]
    assert (rule.identity.kind, rule.calls) == ("Primitive", 1)
    (sample,) = rule.samples.values()
    np.testing.assert_array_equal(sample.leaves[0], [3.0, 4.0])
    assert float(jax.jvp(sample.fn, (3.0,), (1.0,))[1]) == 0.5
    recorder.remove()
    assert "bind" not in vars(p)
    recorder.install()
  finally:
    del ad.primitive_jvps[p]


def test_a_primitive_bound_inside_jit_gets_the_values_its_program_ran_with(
    recorder):
  """Traced inside jit, a library primitive's bind sends its inputs back
  when the program runs (taken in at the next call or at `remove`); a
  program that never runs leaves the types (``values_inside_jit``, the
  default: --hijax-no-values-inside-jit turns it off)."""
  from jax.extend.core import Primitive
  from jax.interpreters import ad, mlir
  p = Primitive("thirds")
  p.def_impl(lambda x: x / 3)
  p.def_abstract_eval(lambda x: x)
  mlir.register_lowering(p, mlir.lower_fun(lambda x: x / 3,
                                           multiple_results=False))
  ad.primitive_jvps[p] = lambda x, t: (p.bind(*x), p.bind(*t))
  assert _recorder.CallRecorder().values_inside_jit
  try:
    recorder.watch()
    jax.eval_shape(jax.jit(lambda x: p.bind(x)), jnp.ones(3))
    np.testing.assert_allclose(jax.jit(lambda x: p.bind(x))(
        jnp.array([0.3, 0.6])), [0.1, 0.2], rtol=1e-6)
    recorder.remove()
    (rule,) = [r for r in recorder.rules.values() if r.identity.name ==
               "thirds"]
    sources = {s.types()[0]: s.source for s in rule.samples.values()}
    assert sources == {"f32[3]": "traced",
                       "f32[2]": "traced, values at run time"}, sources
    (ran,) = [s for s in rule.samples.values() if s.concrete]
    np.testing.assert_array_equal(ran.leaves[0],
                                  np.array([0.3, 0.6], np.float32))
    recorder.install()
  finally:
    del ad.primitive_jvps[p]


def test_a_library_wrapper_is_named_after_the_function_it_wraps(recorder):
  eqx = pytest.importorskip("equinox")

  @eqx.filter_custom_jvp
  def double(x):
    return 2 * x

  @double.def_jvp
  def _double_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return double(x), 2 * t

  double(jnp.ones(2))
  rule = _rule(recorder, "test_a_library_wrapper_is_named_after_the_"
               "function_it_wraps.<locals>.double")
  assert rule.identity.where()[0] == __file__
  assert rule.identity.where(via=True)[0].endswith("equinox/_ad.py")


def test_values_for_calls_seen_as_types(recorder):
  # (shapes no other test traces sin with: jit would not trace it again)
  sin(jnp.array([0.2, 0.4]))
  jax.jit(sin)(jnp.ones(5))
  rule = _rule(recorder, "sin")
  rng = np.random.default_rng(0)
  seen = rule.samples[next(k for k, s in rule.samples.items()
                           if s.source == "eager")]
  assert _plugin_inputs.candidates(rule, seen, rng) == [
      ([seen.leaves[0]], "eager")]
  traced = next(s for s in rule.samples.values() if s.source == "traced")
  (first, how), (drawn, how2) = _plugin_inputs.candidates(rule, traced, rng)
  assert how == "traced; drawn in the range seen"
  assert first[0].shape == (5,) and np.all((0.2 <= first[0])
                                           & (first[0] <= 0.4))
  assert how2 == "traced; drawn" and np.all((0.1 <= drawn[0])
                                            & (drawn[0] <= 0.9))


def test_drawn_integers_and_booleans():
  spec_i = jax.ShapeDtypeStruct((2,), jnp.int32)
  spec_b = jax.ShapeDtypeStruct((), jnp.bool_)
  rng = np.random.default_rng(0)
  drawn = _plugin_inputs._drawn(spec_i, rng)
  assert drawn.dtype == jnp.int32 and set(drawn.tolist()) <= {1, 2, 3}
  assert _plugin_inputs._drawn(spec_b, rng).tolist() is False
  found = [_plugin_inputs._from_calls(spec_i, [np.array([3, 1, 4])], rng)
           for _ in range(20)]  # across the range seen, ends included
  assert {v for f in found if f for v in f[0].tolist()} == {1, 2, 3, 4}


def _spin(seconds):
  end = time.process_time() + seconds
  while time.process_time() < end:
    pass


class _SlowToCollect:
  def __del__(self):  # an exception raised in here is printed and dropped
    _spin(0.6)


_SLOW = []  # non-empty while slowly is checked (not while the test calls it)


@jax.custom_jvp
def slowly(x):
  if _SLOW:
    _SlowToCollect()  # collected at once: the 0.5 s budget ends in __del__
    _spin(4.0)
  return jnp.sin(x)


slowly.defjvp(lambda p, t: (slowly(p[0]), jnp.cos(p[0]) * t[0]))


@jax.custom_jvp
def cleans_up(x):
  if _SLOW:
    try:
      _spin(4.0)  # the 0.5 s budget ends here
    finally:
      _spin(0.5)  # a cleanup, which the stop must let end
      _SLOW.append("cleaned up")
  return jnp.sin(x)


cleans_up.defjvp(lambda p, t: (cleans_up(p[0]), jnp.cos(p[0]) * t[0]))


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_the_stop_holds_when_its_first_raise_is_dropped(recorder):
  """The budget ends inside a ``__del__`` (as inside a gc callback), where
  Python drops the exception: the stop is raised again, at the next place
  it can land, so the rule is stopped soon after, not 4 s later; and JAX
  still works after it."""
  slowly(jnp.array([0.3, 0.7]))
  _SLOW.append(True)
  try:
    result = _plugin_inputs.check_rule(_rule(recorder, "slowly"), 0.5)
  finally:
    _SLOW.clear()
  assert result.verdict == "skipped for time"
  assert result.tried[0].detail == "stopped where the rule's budget ran out"
  assert result.seconds < 2.0  # (about 0.7; 4.6 where the stop was lost)
  sin(jnp.array([0.2]))
  assert _plugin_inputs.check_rule(_rule(recorder, "sin"), 30).verdict == (
      "passed")


def test_the_stop_is_not_raised_again_while_its_cleanups_run(recorder):
  """Raised again, the stop must not cut short the cleanups (``finally``
  blocks, ``__exit__``) that the first stop runs: JAX's among them."""
  cleans_up(jnp.array([0.3, 0.7]))
  _SLOW.append(True)
  try:
    result = _plugin_inputs.check_rule(_rule(recorder, "cleans_up"), 0.5)
    assert _SLOW == [True, "cleaned up"]
  finally:
    _SLOW.clear()
  assert result.tried[0].detail == "stopped where the rule's budget ran out"
  assert result.seconds < 2.5  # (about 1.1)
