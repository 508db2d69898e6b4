"""Behaviours of JAX's decorators that hijax's once lacked, found by running
JAX's own tests/custom_api_test.py with hijax's decorators
(tools/jax_custom_api.py), each tested here in our own code against JAX's
decorators or closed forms: ``jax_disable_bwd_checks``, pytree nodes that
refuse None, ``optimize_remat``'s primal output, logs under
``jax.checkpoint``, dead-code elimination of unused outputs, collectives
over a ``vmap`` axis name, and eager results of JAX's Python types.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import config

import hijax


def close(a, b, rtol=1e-5, atol=1e-6):
  jax.tree.map(lambda a, b: np.testing.assert_allclose(
      np.asarray(a), np.asarray(b), rtol=rtol, atol=atol), a, b)


# --- jax_disable_bwd_checks ---------------------------------------------------

def wrong_shaped_cotangent(api):
  @api.custom_vjp
  def foo(x, y):
    return x
  foo.defvjp(lambda x, y: (x, None), lambda _, g: (jnp.zeros(3), jnp.zeros(3)))
  return jax.grad(lambda x, y: foo(x, y).sum(), 1)


@pytest.mark.parametrize("transform", [lambda g: g, jax.jit])
def test_disable_bwd_checks_lets_a_wrong_cotangent_through(transform):
  """As JAX's flag says, it disables all backward-pass checks: the float32[3]
  cotangent for a float32[4] argument is passed on, as JAX passes it."""
  x, y = jnp.ones(3), jnp.ones(4)
  with pytest.raises(ValueError, match="doesn't match expected type"):
    transform(wrong_shaped_cotangent(hijax))(x, y)
  with config.disable_bwd_checks(True):
    ours = transform(wrong_shaped_cotangent(hijax))(x, y)
    theirs = transform(wrong_shaped_cotangent(jax))(x, y)
  assert ours.shape == theirs.shape == (3,)
  close(ours, theirs)


# --- pytree nodes that refuse None -------------------------------------------

class Box(list):
  """A pytree node whose unflatten refuses None children."""


def _unflatten_box(_, children):
  assert all(c is not None for c in children), children
  return Box(children)


jax.tree_util.register_pytree_node(Box, lambda b: (list(b), None),
                                   _unflatten_box)


@pytest.mark.parametrize("api", [jax, hijax], ids=["jax", "hijax"])
@pytest.mark.parametrize("zero", ["none", "box"])
def test_a_pytree_node_refusing_none(api, zero):
  """A Box argument and its cotangent are never rebuilt with None children:
  hijax did so when reading bwd's cotangents (checking them against the
  argument's structure), and when adding them up with None for the zero of
  another argument, both of which Box's unflatten refuses."""
  @api.custom_vjp
  def f(b, y):
    return b[0] * b[1] * y

  def bwd(res, g):
    (b0, b1), y = res
    if zero == "box":  # the Box's cotangent is zero: None for all of it
      return None, g * b0 * b1
    return Box([g * b1 * y, g * b0 * y]), None
  f.defvjp(lambda b, y: (f(b, y), ((b[0], b[1]), y)), bwd)
  b = Box([2., 3.])
  grads = jax.grad(f, argnums=(0, 1))(b, 5.)
  jit_grads = jax.jit(jax.grad(f, argnums=(0, 1)))(b, 5.)
  for g_b, g_y in (grads, jit_grads):
    assert type(g_b) is Box
    close((list(g_b), g_y), ([0., 0.], 6.) if zero == "box"
          else ([15., 10.], 0.))


# --- optimize_remat's primal output -------------------------------------------

def tan_with_sin_fwd(api):
  """A fwd rule whose primal (sin) is not the function's (tan): with
  optimize_remat, fwd is only asked for residuals under jax.checkpoint."""
  f = api.custom_vjp(jnp.tan)
  f.defvjp(lambda x: (jnp.sin(x), (x,)), lambda r, g: (jnp.cos(r[0]) * g,),
           optimize_remat=True)
  return f


@pytest.mark.parametrize("where", ["remat", "jit_remat", "plain"])
def test_optimize_remat_primal_output_is_the_function_s(where):
  def value_and_grad(api):
    f = tan_with_sin_fwd(api)
    g = (lambda x: jax.remat(f)(x) ** 2) if "remat" in where else f
    vg = jax.value_and_grad(g)
    return (jax.jit(vg) if "jit" in where else vg)(3.2)
  ours, theirs = value_and_grad(hijax), value_and_grad(jax)
  close(ours, theirs)
  if "remat" in where:
    close(ours, (np.tan(3.2) ** 2, 2 * np.tan(3.2) * np.cos(3.2)))
  else:  # the fwd rule's primal, as JAX (no checkpoint to optimize)
    close(ours[0], np.sin(3.2))


# --- logs under jax.checkpoint -------------------------------------------------

def logged(api):
  @api.custom_vjp
  def f(x, y):
    return jnp.sin(x) * y

  def f_bwd(res, g):
    cos_x, sin_x, y = res
    return (cos_x * g * y, sin_x * g), {"f": {"ct_out": g, "y": y,
                                              "half_ct": g / 2}}
  f.defvjp_with_logs(lambda x, y: (f(x, y), (jnp.cos(x), jnp.sin(x), y)),
                     f_bwd)
  return f


@pytest.mark.parametrize("policy", [None, "nothing_saveable",
                                    "everything_saveable"])
@pytest.mark.parametrize("jit", [False, True])
def test_logs_under_checkpoint(policy, jit):
  """Logged values that are the cotangent, linear in it, or a residual all
  reach with_logs under jax.checkpoint (JAX's default remat); they came back
  empty, silently, when forward mode derived from bwd was transposed."""
  kw = {} if policy is None else {
      "policy": getattr(jax.checkpoint_policies, policy)}

  def logs_of(api):
    fr = jax.checkpoint(lambda x, y: logged(api)(x, y) * 3., **kw)

    def run(x, y):
      return jax.vjp(fr, x, y)[1].with_logs(1.0)
    return (jax.jit(run) if jit else run)(1.0, 2.0)
  (ct, _), logs = logs_of(hijax)
  close(ct, 3. * np.cos(1.) * 2.)
  close(logs, {"f": {"ct_out": 3., "y": 2., "half_ct": 1.5}})
  close(logs, logs_of(jax)[1])


def test_logged_function_in_forward_mode_and_second_order():
  f = logged(hijax)
  x, y = 1.0, 2.0
  close(jax.jvp(f, (x, y), (1., 0.5)),
        (np.sin(x) * y, np.cos(x) * y + 0.5 * np.sin(x)))
  close(jax.jit(jax.jacfwd(f))(x, y), np.cos(x) * y)
  close(jax.hessian(jax.checkpoint(lambda x: f(x, y)))(x), -np.sin(x) * y)
  close(jax.vmap(lambda t: jax.jvp(lambda x: f(x, y), (x,), (t,))[1])(
      jnp.arange(3.)), jnp.arange(3.) * np.cos(x) * y)
  (ct,), logs = jax.vjp(lambda x: f(x, y), x)[1].with_logs(1.0)
  close((ct, logs["f"]["y"]), (np.cos(x) * y, y))


def test_logs_and_accums_with_symbolic_zeros():
  """defvjp_with_logs and defvjp_with_accums take symbolic_zeros (their
  optimize_remat is off unless asked for, as defvjp's)."""
  f = hijax.custom_vjp(lambda x, y: x * y)
  f.defvjp_with_logs(lambda x, y: (f(x.value, y.value), (x.value, y.value)),
                     lambda r, g: ((r[1] * g, r[0] * g), {"g": g}),
                     symbolic_zeros=True)
  close(jax.grad(f)(2., 3.), 3.)
  (ct, _), logs = jax.vjp(f, 2., 3.)[1].with_logs(4.)
  close((ct, logs["g"]), (12., 4.))
  g = hijax.custom_vjp(lambda x: 2. * x)
  g.defvjp_with_accums(lambda x: (g(x.value), None),
                       lambda _, ct, acc: acc.accum(2. * ct),
                       symbolic_zeros=True)
  close(jax.grad(g)(1.), 2.)


# --- a traced non-differentiable argument, differentiated ----------------------

def scaled(kind):
  """f(x, s) = x * s ** 2 with s non-differentiable; the rules give the
  derivative in x only (2 s x for the jvp, via s, to use s in them)."""
  if kind == "custom_jvp":
    @functools.partial(hijax.custom_jvp, nondiff_argnums=(1,))
    def f(x, s):
      return x * s ** 2

    @f.defjvp
    def f_jvp(s, primals, tangents):
      (x,), (t,) = primals, tangents
      return f(x, s), t * s ** 2
    return f

  @functools.partial(hijax.custom_vjp, nondiff_argnums=(1,))
  def g(x, s):
    return x * s ** 2
  g.defvjp(lambda x, s: (g(x, s), None), lambda s, _, ct: (ct * s ** 2,))
  return g


@pytest.mark.parametrize("kind", ["custom_jvp", "custom_vjp"])
def test_derivative_in_a_traced_nondiff_argument_is_not_a_silent_zero(kind):
  """d/ds of x s^2 is 2 x s (12 at x=2, s=3): the function's own code,
  differentiated, as for a value it closes over. It was 0.0, silently (JAX's
  custom_jvp still gives 0.0; its custom_vjp raises)."""
  f = scaled(kind)
  x, s = 2., 3.
  close(jax.grad(lambda s: f(x, s))(s), 12.)
  close(jax.jit(jax.grad(lambda s: f(x, s)))(s), 12.)
  close(jax.grad(f, argnums=(0, 1))(x, s), (9., 12.))
  close(jax.jvp(lambda s: f(x, s), (s,), (1.,))[1], 12.)
  close(jax.vmap(jax.grad(lambda s: f(x, s)))(jnp.arange(3.)),
        4. * jnp.arange(3.))
  close(jax.hessian(lambda s: f(x, s))(s), 4.)
  # through s = h(x): the chain rule sees both (x s^2 with s = x: 3 x^2)
  close(jax.grad(lambda x: f(x, x))(x), 12.)


# --- a float32 cotangent for a Python float under x64 ---------------------------

def product_with_float32_bwd(api):
  @api.custom_vjp
  def f(x, y):
    return x * y
  f.defvjp(lambda x, y: (f(x, y), (x, y)),
           lambda r, g: ((g * r[1]).astype(jnp.float32),
                         (g * r[0]).astype(jnp.float32)))
  return f


def test_float32_cotangent_for_a_python_float_under_x64():
  """A Python float is float64 under x64, but only by default (weakly
  typed): a float32 cotangent for it is accepted, as JAX accepts it, and
  converted, so the gradient has the argument's dtype. For an argument typed
  float64 explicitly it is still refused (JAX passes it on unconverted)."""
  with jax.enable_x64(True):
    grads = jax.grad(product_with_float32_bwd(hijax), (0, 1))(2.0, 3.0)
    close(grads, jax.grad(product_with_float32_bwd(jax), (0, 1))(2.0, 3.0))
    assert [g.dtype for g in grads] == [jnp.float64, jnp.float64]
    close(jax.jit(jax.grad(product_with_float32_bwd(hijax)))(2.0, 3.0), 3.)
    with pytest.raises(ValueError, match="doesn't match expected type "
                       "float64"):
      jax.grad(product_with_float32_bwd(hijax))(jnp.float64(2.), 3.0)


# --- JAX 0.12's other ways of defining the rules --------------------------------

def test_defvjp_with_accums():
  """bwd(res, g, *accums) adds its cotangents to one accumulator per
  argument (a pytree like it) and may return logs."""
  @hijax.custom_vjp
  def f(p, y):
    return jnp.sin(p["a"]) * y

  def bwd(res, g, p_acc, y_acc):
    cos_a, sin_a, y = res
    p_acc["a"].accum(cos_a * g * y)
    y_acc.accum(sin_a * g)
    y_acc.accum(sin_a * g)  # added twice: the accumulator sums
    return {"g": g}
  f.defvjp_with_accums(
      lambda p, y: (f(p, y), (jnp.cos(p["a"]), jnp.sin(p["a"]), y)), bwd)
  p, y = {"a": 1.}, 2.
  (ct_p, ct_y), logs = jax.vjp(f, p, y)[1].with_logs(3.)
  close((ct_p["a"], ct_y, logs["g"]), (3 * np.cos(1.) * 2,
                                       2 * 3 * np.sin(1.), 3.))
  close(jax.jit(jax.grad(f, (0, 1)))(p, y), ({"a": np.cos(1.) * 2},
                                             2 * np.sin(1.)))
  close(jax.jvp(lambda a: f({"a": a}, y), (1.,), (1.,))[1], np.cos(1.) * 2)
  f.defvjp_with_accums(lambda p, y: (f(p, y), None),
                       lambda res, g, p_acc, y_acc: ["not", "a", "dict"])
  with pytest.raises(TypeError, match="^Custom VJP bwd rule was registered with "
                     "defvjp_with_accums, and so must return None or a dict") as info:
    jax.grad(f)(p, y)
  # and hijax's detail: which rule, defined how, and what it returned
  assert ("was defined with defvjp_with_accums, so it must return None or a "
          "dict of backward-pass logs, but it is a list") in str(info.value)


@pytest.mark.parametrize("kind", ["defvjp_with_logs", "defvjp_with_accums"])
def test_by_default_fwd_gives_the_output_in_both_modes(kind):
  """Without ``optimize_remat`` (the default of every ``defvjp...``), the
  output of a differentiated call is ``fwd``'s, in reverse mode as in the
  forward mode hijax derives; here ``fwd``'s differs from the function's
  on purpose, so the two are told apart."""
  @hijax.custom_vjp
  def g(x):
    return jnp.sin(x)

  def fwd(x):
    return jnp.sin(x) + 1., x
  if kind == "defvjp_with_logs":
    g.defvjp_with_logs(fwd, lambda x, ct: ((jnp.cos(x) * ct,), None))
  else:
    def bwd(x, ct, acc):
      acc.accum(jnp.cos(x) * ct)
    g.defvjp_with_accums(fwd, bwd)
  close(jax.vjp(g, 0.5)[0], np.sin(0.5) + 1.)
  close(jax.jvp(g, (0.5,), (1.,))[0], np.sin(0.5) + 1.)


@pytest.mark.parametrize("method", ["defremat", "defremat_with_logs"])
def test_defremat_is_refused_naming_the_alternatives(method):
  f = hijax.custom_vjp(jnp.sin)
  with pytest.raises(NotImplementedError, match=rf"hijax.custom_vjp has no "
                     rf"{method}: .* use hijax.custom_remat"):
    getattr(f, method)(lambda x: (jnp.sin(x), x),
                       lambda x, *_: (jnp.sin(x), x), lambda x, g: (g,))


# --- eager results of JAX's Python types ---------------------------------------

def test_eager_jvp_and_vjp_keep_python_floats_as_jax_does():
  """Under an eager jax.jvp or jax.vjp, the rules get a Python float
  argument as it is, so what they compute on Python floats comes back a
  Python float, as with JAX's decorators (under jit or vmap: arrays)."""
  def results(api):
    f = api.custom_jvp(lambda a, b: a + b)
    f.defjvp(lambda p, t: (f(*p), t[1] + 91.))
    primal, tangent = jax.jvp(lambda b: f(1., b), (4.,), (7.,))

    g = api.custom_vjp(lambda a, b: a * b)
    g.defvjp(lambda a, b: (g(a, b), (a, b)), lambda r, ct: (ct * r[1],
                                                           ct * r[0]))
    out, g_vjp = jax.vjp(g, 2., 3.)
    return primal, tangent, out, *g_vjp(5.)
  ours, theirs = results(hijax), results(jax)
  assert [type(x) for x in ours] == [type(x) for x in theirs], (ours, theirs)
  assert [float(x) for x in ours] == [5., 98., 6., 15., 10.]
  assert all(isinstance(x, float) for x in ours[:2])
  jitted = jax.jit(lambda b: jax.jvp(lambda b: f_sum(1., b), (b,), (7.,)))
  assert all(isinstance(x, jax.Array) for x in jitted(4.))


@hijax.custom_jvp
def f_sum(a, b):
  return a + b


f_sum.defjvp(lambda p, t: (f_sum(*p), t[1] + 91.))


# --- collectives over a vmap axis name, no argument batched ----------------------

def psum_with(api):
  """psum over 'foo' with a custom derivative (3, not the psum's)."""
  f = api.custom_jvp(lambda x: jax.lax.psum(x, "foo"))
  f.defjvp(lambda p, t: (f(*p), 3. * t[0]))
  return f


@pytest.mark.parametrize("api", [jax, hijax], ids=["jax", "hijax"])
def test_psum_over_a_vmap_axis_of_an_unbatched_argument(api):
  """psum of an unbatched x over a vmap axis of size 4 is 4 x (unbatched):
  the call is batched, though none of its arguments is, so the psum is
  evaluated by the vmap (it was evaluated outside it: an AssertionError
  inside JAX's lowering). Staged with make_jaxpr and run with eval_jaxpr,
  called directly, and differentiated, with the function's rule."""
  f = psum_with(api)

  def staged(x):
    closed = jax.make_jaxpr(f)(x)
    return jax.extend.core.jaxpr_as_fun(closed)(x)[0]
  for g in (staged, f):
    v = jax.vmap(lambda _, x: g(x), axis_name="foo", in_axes=(0, None),
                 out_axes=None)(jnp.arange(4.), 2.)
    close(v, 8.)
  grads = jax.vmap(lambda _, x: jax.grad(f)(x), axis_name="foo",
                   in_axes=(0, None), out_axes=None)(jnp.arange(4.), 2.)
  close(grads, 3.)


def test_axis_index_of_an_unbatched_call():
  f = hijax.custom_jvp(lambda x: x * jax.lax.axis_index("i"))
  f.defjvp(lambda p, t: (f(*p), t[0] * jax.lax.axis_index("i")))
  out = jax.vmap(lambda _: f(2.), axis_name="i")(jnp.ones(3))
  close(out, [0., 2., 4.])
  _, tangents = jax.jvp(
      lambda c: jax.vmap(lambda _: f(c), axis_name="i")(jnp.ones(3)),
      (2.,), (1.,))
  close(tangents, [0., 1., 2.])


def test_a_rule_batched_where_the_function_is_not_raises_jax_s_error():
  f = hijax.custom_jvp(lambda x: x + 1.)
  f.defjvp(lambda p, t: (f(*p), t[0] * (1. + jax.lax.axis_index("i"))))
  with pytest.raises(ValueError, match=r"^under vmap, the jvp rule of "
                     r"<lambda> produced an output batched along the mapped "
                     r"axis .*\nhijax.custom_jvp function <lambda>: no "
                     r"argument of this call is batched"):
    jax.jvp(lambda c: jax.vmap(lambda x: x * f(c), axis_name="i")(
        jnp.ones(3)), (1.,), (1.,))


def test_a_rule_s_own_value_error_under_a_named_vmap_is_raised_as_it_is():
  """Only a rule output batched where the function's is not becomes the
  overbatched error; a rule's own ValueError reaches the caller unchanged."""
  f = hijax.custom_jvp(lambda x: x + 1.)

  @f.defjvp
  def _(p, t):
    raise ValueError("the rule's own error")
  with pytest.raises(ValueError) as info:
    jax.jvp(lambda c: jax.vmap(lambda x: x * f(c), axis_name="i")(
        jnp.ones(3)), (1.,), (1.,))
  assert str(info.value) == "the rule's own error"
