"""Dead-code elimination of a decorated function's unused outputs, and its
call staged as one equation when lowered: a pruned call computes only the
used outputs and keeps the function's rules (values against JAX's
decorators and closed forms)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import ClosedJaxpr, jaxpr_as_fun
from jax.interpreters import partial_eval as pe

import hijax
from hijax._decorators._common import CallPrimitive


def close(a, b, rtol=1e-5, atol=1e-6):
  jax.tree.map(lambda a, b: np.testing.assert_allclose(
      np.asarray(a), np.asarray(b), rtol=rtol, atol=atol), a, b)


def two_outputs(api, kind):
  """(sin x, x + cos y) whose rules are deliberately not its derivative
  (2 cos x, and 1.5 for x in the second output): values tell which rules
  ran."""
  if kind == "custom_vjp":
    f = api.custom_vjp(lambda x, y: (jnp.sin(x), x + jnp.cos(y)))
    f.defvjp(lambda x, y: (f(x, y), (jnp.cos(x), jnp.sin(y))),
             lambda r, c: (2. * r[0] * c[0] + 1.5 * c[1], -0.5 * r[1] * c[1]))
    return f
  f = api.custom_jvp(lambda x, y: (jnp.sin(x), x + jnp.cos(y)))
  f.defjvp(lambda p, t: (f(*p), (2. * jnp.cos(p[0]) * t[0],
                                 1.5 * t[0] - 0.5 * jnp.sin(p[1]) * t[1])))
  return f


def pruned(api, kind, used):
  closed = jax.make_jaxpr(two_outputs(api, kind))(0.1, -1.3)
  jaxpr, used_inputs = pe.dce_jaxpr(closed.jaxpr, used)
  return jaxpr, (lambda *a: jaxpr_as_fun(ClosedJaxpr(jaxpr, closed.consts))(
      *a)[0])


@pytest.mark.parametrize("kind", ["custom_vjp", "custom_jvp"])
@pytest.mark.parametrize("used", [[True, False], [False, True]])
def test_an_unused_output_is_pruned_and_the_rules_still_apply(kind, used):
  jaxpr, f = pruned(hijax, kind, used)
  (eqn,) = jaxpr.eqns
  prim = eqn.params["_prim"]
  assert isinstance(prim, CallPrimitive) and len(eqn.outvars) == 1
  assert prim.kept == tuple(used) and prim is not prim._call
  _, jax_f = pruned(jax, kind, used)
  x, y = 0.1, -1.3
  close(f(x, y), jax_f(x, y))
  close(jax.grad(f, (0, 1))(x, y), jax.grad(jax_f, (0, 1))(x, y))
  close(jax.grad(f, (0, 1))(x, y), (2. * np.cos(x), 0.) if used[0]
        else (1.5, -0.5 * np.sin(y)))
  close(jax.jit(jax.grad(f))(x, y), jax.grad(jax_f)(x, y))
  close(jax.vmap(jax.grad(f))(jnp.ones(2), jnp.ones(2)),
        jax.vmap(jax.grad(jax_f))(jnp.ones(2), jnp.ones(2)))
  if kind == "custom_jvp":
    close(jax.jvp(f, (x, y), (1., 1.)), jax.jvp(jax_f, (x, y), (1., 1.)))
  xs, ys = jnp.linspace(0.1, 0.5, 3), jnp.linspace(-1., 1., 3)
  close(jax.vmap(f)(xs, ys), jnp.sin(xs) if used[0] else xs + jnp.cos(ys))
  out, linear = jax.linearize(f, x, y)  # the rules' tangent, both kinds
  close((out, linear(1., 2.)), (np.sin(x), 2. * np.cos(x)) if used[0]
        else (x + np.cos(y), 1.5 - np.sin(y)))
  # the pruned call lowers to the kept output's computation only
  text = jax.jit(f).lower(x, y).as_text()
  assert ("stablehlo.sine" in text) == used[0], text
  assert ("stablehlo.cosine" in text) == used[1], text


@pytest.mark.parametrize("kind", ["custom_vjp", "custom_jvp"])
def test_no_output_used_drops_the_call(kind):
  jaxpr, _ = pruned(hijax, kind, [False, False])
  assert not jaxpr.eqns


def test_a_pruned_call_pruned_again():
  @hijax.custom_vjp
  def f(x):
    return x, 2. * x, 3. * x
  f.defvjp(lambda x: (f(x), None), lambda _, g: (g[0] + 2 * g[1] + 3 * g[2],))
  closed = jax.make_jaxpr(f)(1.)
  once, _ = pe.dce_jaxpr(closed.jaxpr, [False, True, True])
  twice, _ = pe.dce_jaxpr(once, [False, True])
  (eqn,) = twice.eqns
  assert eqn.params["_prim"].kept == (False, False, True)
  g = lambda x: jaxpr_as_fun(ClosedJaxpr(twice, closed.consts))(x)[0]
  close((g(2.), jax.grad(g)(2.)), (6., 3.))


def test_the_call_is_lowered_as_one_call_of_its_jaxpr():
  """Lowering a call records one closed_call of the function's traced
  jaxpr, not its equations one by one (JAX's decorators do the same)."""
  @hijax.custom_vjp
  def f(x):
    for _ in range(10):
      x = jnp.sin(x)
    return x
  f.defvjp(lambda x: (f(x), x), lambda x, g: (g,))
  jaxpr = jax.make_jaxpr(lambda x: f(x) * 2.)(1.)
  (call, _) = jaxpr.eqns
  lowered = jax.make_jaxpr(call.params["_prim"].expand)(1., ())
  (eqn,) = lowered.eqns
  assert eqn.primitive.name in ("closed_call", "eval_jaxpr")
  assert len(eqn.params["call_jaxpr"].eqns) == 10
  close(jax.jit(f)(1.), f(1.))


def test_a_pruned_call_keeps_the_tangent_flag_of_its_kept_output():
  """The first output, an integer (no tangent), dropped: linearizing the
  pruned call gives the kept output's tangent."""
  f = hijax.custom_jvp(lambda x: (jnp.floor(x).astype(jnp.int32),
                                  jnp.sin(x)))
  f.defjvp(lambda p, t: (f(*p), (np.zeros((), jax.dtypes.float0),
                                 jnp.cos(p[0]) * t[0])))
  closed = jax.make_jaxpr(f)(0.3)
  jaxpr, _ = pe.dce_jaxpr(closed.jaxpr, [False, True])
  g = lambda x: jaxpr_as_fun(ClosedJaxpr(jaxpr, closed.consts))(x)[0]
  out, linear = jax.linearize(g, 0.3)
  close((out, linear(2.)), (np.sin(0.3), 2. * np.cos(0.3)))
  close(jax.grad(g)(0.3), np.cos(0.3))


def test_a_pruned_linear_call_is_transposed():
  """A custom_jvp function linear in its input, one output dropped: the
  kept output's transpose (3 x transposed is 3 ct)."""
  f = hijax.custom_jvp(lambda x: (2. * x, 3. * x))
  f.defjvp(lambda p, t: (f(*p), f(*t)))
  closed = jax.make_jaxpr(f)(1.)
  jaxpr, _ = pe.dce_jaxpr(closed.jaxpr, [False, True])
  g = lambda x: jaxpr_as_fun(ClosedJaxpr(jaxpr, closed.consts))(x)[0]
  close(jax.linear_transpose(g, 1.)(5.), (15.,))
  close(jax.grad(g)(1.), 3.)
