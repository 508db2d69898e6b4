"""The checker's one walk over a jaxpr (hijax/testing/_discovery.py): which
hijax primitives and custom functions a program holds, wherever they sit,
and which of them run once at the program's top level (in place of a call
of jit or jax.checkpoint, under every policy), where the expansion check
replaces each primitive by its expand and where a custom function can be
taken out and checked alone at its first call's inputs; those inside
scan, cond, while_loop, a custom function or shard_map are bound as they
are."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hijax.testing._discovery import (custom_calls, eval_expanded,
                                      find_custom_rules, find_hiprims)
from zoo import Log1pExp, log1pexp

_cp = jax.checkpoint_policies
POLICIES = [None, _cp.everything_saveable, _cp.nothing_saveable,
            _cp.dots_saveable, _cp.checkpoint_dots,
            _cp.dots_with_no_batch_dims_saveable,
            _cp.checkpoint_dots_with_no_batch_dims,
            _cp.save_only_these_names("a"),
            _cp.save_any_names_but_these("a"),
            _cp.save_anything_except_these_names("a"),
            _cp.save_from_both_policies(_cp.nothing_saveable,
                                        _cp.dots_saveable)]

# Wrappers under which the function runs once, in place (walked into).
IN_PLACE = {"jit": jax.jit, "jit twice": lambda f: jax.jit(jax.jit(f))} | {
    f"checkpoint {i}": functools.partial(jax.checkpoint, policy=p)
    for i, p in enumerate(POLICIES)}


def _shard_map(f):
  mesh = jax.make_mesh((1,), ("i",))
  spec = jax.sharding.PartitionSpec()  # the body sees the whole array
  return jax.shard_map(f, mesh=mesh, in_specs=spec, out_specs=spec)


def _custom(f):
  g = jax.custom_jvp(f)
  g.defjvp(lambda p, t: (g(p[0]), t[0]))
  return g


# Wrappers that run it in a loop, a branch, a custom function or shard_map.
ELSEWHERE = {
    "scan": lambda f: lambda x: jax.lax.scan(
        lambda c, xi: (c, f(xi)), 0., x)[1],
    "cond": lambda f: lambda x: jax.lax.cond(True, f, jnp.cos, x),
    "while_loop": lambda f: lambda x: jax.lax.while_loop(
        lambda c: c[0] < 1, lambda c: (c[0] + 1, f(c[1])), (0, x))[1],
    "custom_jvp": _custom,
    "shard_map": _shard_map,
}

X = jnp.array([0.3, 1.2, -0.7])


@jax.custom_jvp
def good(x):
  return jnp.sin(x)


good.defjvp(lambda p, t: (jnp.sin(p[0]), jnp.cos(p[0]) * t[0]))


@pytest.mark.parametrize("where", [*IN_PLACE, *ELSEWHERE])
def test_every_primitive_and_custom_function_is_found(where):
  wrap = (IN_PLACE | ELSEWHERE)[where]
  closed = jax.make_jaxpr(wrap(lambda x: log1pexp(good(x))))(X)
  assert [type(p) for p in find_hiprims(closed.jaxpr)] == [Log1pExp]
  found = find_custom_rules(closed.jaxpr)
  assert [repr(r) for r in found] == (
      ["<lambda> (custom_jvp)"] if where == "custom_jvp"  # not inside another
      else ["good (custom_jvp)"])


@pytest.mark.parametrize("where", [*IN_PLACE, *ELSEWHERE])
def test_expand_replaces_the_primitives_that_run_in_place(where):
  """Where the primitive runs once in place it is replaced by its expand
  and recorded (a call of jit or jax.checkpoint is evaluated in place);
  elsewhere it is bound again, and the value is the same."""
  wrap = (IN_PLACE | ELSEWHERE)[where]
  fn = wrap(lambda x: log1pexp(x) * 2.)
  closed = jax.make_jaxpr(fn)(X)
  found = []
  (out,) = eval_expanded(closed.jaxpr, closed.consts, [X], found)
  np.testing.assert_allclose(out, fn(X), rtol=1e-6)
  assert len(found) == (1 if where in IN_PLACE else 0), found
  if found:
    np.testing.assert_allclose(found[0][1][0], X)  # the inputs it was given


@pytest.mark.parametrize("where", [*IN_PLACE, *ELSEWHERE])
def test_custom_functions_are_taken_out_where_they_run_in_place(where):
  """custom_calls: each custom function that runs once at the program's top
  level, alone, with the inputs of its first call (the program's own)."""
  wrap = (IN_PLACE | ELSEWHERE)[where]
  calls = custom_calls(
      lambda x: wrap(lambda y: good(2. * y))(x) + good(x), (X,))
  # the call at the top level is found in any case; the one inside `wrap`
  # (called first) only where it runs in place
  rules = [repr(r) for r, _, _ in calls]
  if where == "custom_jvp":  # the wrapper is one, taken out; not good in it
    assert rules == ["<lambda> (custom_jvp)", "good (custom_jvp)"], rules
    calls = calls[1:]
  else:
    assert rules == ["good (custom_jvp)"], rules  # one function, named once
  ((_, fn, (inputs,)),) = calls
  first = 2. * X if where in IN_PLACE else X
  np.testing.assert_allclose(inputs, first, rtol=1e-6)
  np.testing.assert_allclose(fn(inputs), jnp.sin(first), rtol=1e-6)


def test_a_custom_function_without_source_information():
  """(a callable object: JAX names it "<unknown>", with no file or line)"""
  class Sine:
    def __call__(self, x):
      return jnp.sin(x)
  f = jax.custom_jvp(Sine())
  f.defjvp(lambda p, t: (jnp.sin(p[0]), jnp.cos(p[0]) * t[0]))
  (rules,) = find_custom_rules(jax.make_jaxpr(f)(1.).jaxpr)
  assert (rules.name, rules.file, rules.line) == ("<unknown>", "", 0)
  assert rules.kind == "custom_jvp"
  assert repr(rules) == "<unknown> (custom_jvp)"


def test_the_rules_each_custom_function_and_primitive_defines():
  from hijax import HiPrim
  from hijax.testing import defined_rules

  @jax.custom_jvp
  def f(x):
    return jnp.sin(x)
  f.defjvp(lambda p, t: (jnp.sin(p[0]), jnp.cos(p[0]) * t[0]))

  @jax.custom_vjp
  def g(x):
    return jnp.sin(x)
  g.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)), lambda c, ct: (c * ct,))
  (jvp_rules,) = find_custom_rules(jax.make_jaxpr(f)(1.).jaxpr)
  (vjp_rules,) = find_custom_rules(jax.make_jaxpr(g)(1.).jaxpr)
  assert defined_rules(jvp_rules) == {
      "expand": "f (custom_jvp): the function",
      "jvp": "f (custom_jvp): the jvp rule",
      "vjp": "f (custom_jvp): the jvp rule, transposed by JAX",
      "lin": "f (custom_jvp): the jvp rule, linearized by JAX",
      "batch": "f (custom_jvp): vmap of the function and its jvp rule"}
  assert defined_rules(vjp_rules) == {
      "expand": "g (custom_vjp): the function",
      "vjp": "g (custom_vjp): fwd/bwd",
      "batch": "g (custom_vjp): vmap of the function, fwd and bwd"}

  class Called(HiPrim):  # a decorator's call: named after its function
    def __init__(self):
      self.in_avals, self.params = (), {"fun": "h"}
  assert defined_rules(Called()) == {"expand": "Called[fun=h].expand"}
  assert defined_rules(Called) == {"expand": "Called.expand"}
  # half a pair of rules is no rule
  for half in ("vjp_fwd", "vjp_bwd_retval", "lin", "linearized"):
    cls = type("Half", (HiPrim,), {half: lambda self, *a: None})
    assert defined_rules(cls) == {"expand": "Half.expand"}, half


def test_each_primitive_instance_is_found_once():
  same = Log1pExp(jax.typeof(X))
  closed = jax.make_jaxpr(lambda x: same(same(x)) + log1pexp(x))(X)
  found = find_hiprims(closed.jaxpr)
  assert len(found) == 2 and found[0] is same and found[1] is not same


def test_applications_their_types_and_an_expand_of_another_structure():
  from hijax.testing._discovery import (ExpandStructureError,
                                        application_types, applications)
  fn = lambda x: log1pexp(x) * 2
  ((prim, p_args),) = applications(fn, (X,))
  assert type(prim) is Log1pExp and len(p_args) == 1
  np.testing.assert_array_equal(p_args[0], X)
  ((prim_t, types),) = application_types(fn, (X,))
  assert type(prim_t) is Log1pExp and types == (jax.typeof(X),)

  class Pair(Log1pExp):
    def expand(self, x):  # pyright: ignore[reportIncompatibleMethodOverride]
      return x, x
  closed = jax.make_jaxpr(lambda x: Pair(jax.typeof(x))(x))(X)
  found = []
  with pytest.raises(ExpandStructureError, match="Pair.expand returned"):
    eval_expanded(closed.jaxpr, closed.consts, [X], found)
  assert len(found) == 1
  # applications: those found up to the failure (the expand check says why)
  assert [type(p) for p, _ in applications(
      lambda x: Pair(jax.typeof(x))(x), (X,))] == [Pair]


def test_expand_replaces_each_application_not_binds_it():
  calls = []

  class Counted(Log1pExp):
    def expand(self, x):
      calls.append(None)
      return super().expand(x)
  closed = jax.make_jaxpr(lambda x: Counted(jax.typeof(x))(x))(X)
  calls.clear()
  (out,) = eval_expanded(closed.jaxpr, closed.consts, [X], [])
  np.testing.assert_allclose(out, np.logaddexp(np.asarray(X), 0), rtol=1e-6)
  assert len(calls) == 1
