"""What JAX documents of ``jax.custom_jvp`` and ``jax.custom_vjp``, run on
JAX's decorators and on `hijax.custom_jvp` and `hijax.custom_vjp`.

Each test takes ``api``, one of the two pairs of decorators, and asserts the
same values (closed forms or plain JAX) for both: replacing JAX's decorator
with hijax's changes nothing that worked. Where JAX raises and hijax does
not (forward mode of a custom_vjp function, a traced non-differentiable
argument), or gives a silent zero (custom_jvp's derivative with respect to
a traced non-differentiable argument), the test says so and asserts both
outcomes; what hijax computes
there is tested in test_custom_decorators_additions.py. Written after the
behaviours of JAX's docs and its tests/custom_api_test.py, in our own code.
"""
import collections
import functools
import types

import hypothesis
import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.custom_derivatives import CustomVJPPrimal, SymbolicZero

import hijax

JAX = types.SimpleNamespace(name="jax", custom_jvp=jax.custom_jvp,
                            custom_vjp=jax.custom_vjp)
HIJAX = types.SimpleNamespace(name="hijax", custom_jvp=hijax.custom_jvp,
                              custom_vjp=hijax.custom_vjp)


@pytest.fixture(params=[JAX, HIJAX], ids=lambda a: a.name)
def api(request):
  return request.param


def close(a, b, rtol=1e-5, atol=1e-6):
  jax.tree.map(lambda a, b: np.testing.assert_allclose(
      np.asarray(a), np.asarray(b), rtol=rtol, atol=atol), a, b)


def sin_jvp(api):
  """sin with its derivative rule; the rule calls the function itself."""
  @api.custom_jvp
  def f(x):
    return jnp.sin(x)

  @f.defjvp
  def f_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return f(x), jnp.cos(x) * t
  return f


def sin_vjp(api):
  @api.custom_vjp
  def f(x):
    return jnp.sin(x)

  def f_fwd(x):
    return f(x), jnp.cos(x)

  def f_bwd(cos_x, g):
    return (cos_x * g,)
  f.defvjp(f_fwd, f_bwd)
  return f


# --- custom_jvp ---------------------------------------------------------------

def test_jvp_values_and_transformations(api):
  f = sin_jvp(api)
  x = jnp.array([0.3, -1.2, 2.0])
  close(f(x), jnp.sin(x))
  y, t = jax.jvp(f, (x,), (jnp.ones(3),))
  close((y, t), (jnp.sin(x), jnp.cos(x)))
  close(jax.grad(lambda x: f(x).sum())(x), jnp.cos(x))
  close(jax.jit(jax.grad(f))(0.5), np.cos(0.5))
  close(jax.vmap(jax.grad(f))(x), jnp.cos(x))
  close(jax.jacfwd(f)(x), jnp.diag(jnp.cos(x)))
  close(jax.linearize(f, x)[1](2 * jnp.ones(3)), 2 * jnp.cos(x))


def test_jvp_higher_order_uses_the_rule_when_it_calls_the_function(api):
  f = sin_jvp(api)
  close(jax.grad(jax.grad(f))(0.5), -np.sin(0.5))
  close(jax.hessian(f)(0.5), -np.sin(0.5))
  close(jax.grad(jax.grad(jax.grad(f)))(0.5), -np.cos(0.5))


def test_jvp_rule_not_calling_the_function_is_differentiated_as_written(api):
  @api.custom_jvp
  def f(x):
    return x ** 3

  @f.defjvp
  def f_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return x ** 3, 5. * t  # a wrong but deliberate first derivative
  close(jax.grad(f)(2.), 5.)
  close(jax.grad(jax.grad(f))(2.), 0.)


def test_defjvp_returns_the_rule_and_works_as_a_call(api):
  f = api.custom_jvp(lambda x, y: x * y)

  def rule(primals, tangents):
    (x, y), (tx, ty) = primals, tangents
    return x * y, tx * y + x * ty
  assert f.defjvp(rule) is rule
  close(jax.grad(f, (0, 1))(2., 3.), (3., 2.))


def test_defjvps_one_rule_per_argument_and_none(api):
  @api.custom_jvp
  def f(x, y):
    return jnp.sin(x) * y
  f.defjvps(lambda x_dot, out, x, y: jnp.cos(x) * x_dot * y,
            lambda y_dot, out, x, y: jnp.sin(x) * y_dot)
  close(jax.grad(f, (0, 1))(1., 2.), (np.cos(1.) * 2., np.sin(1.)))
  close(jax.jvp(f, (1., 2.), (1., 1.))[1], np.cos(1.) * 2 + np.sin(1.))

  g = api.custom_jvp(lambda x, y: x * y)
  g.defjvps(None, lambda y_dot, out, x, y: x * y_dot)
  close(jax.grad(g, (0, 1))(2., 3.), (0., 2.))


def test_defjvps_one_rule_with_an_integer_output():
  """One rule, and an integer output: its float0 tangent is kept as the
  rule returns it (no sum of one term), the float output's is the rule's."""
  f = hijax.custom_jvp(lambda x: (jnp.sin(x), jnp.int32(3)))
  f.defjvps(lambda t, out, x: (jnp.cos(x) * t,
                               np.zeros((), jax.dtypes.float0)))
  (y, n), (t, tn) = jax.jvp(f, (0.5,), (2.,))
  close(y, np.sin(0.5))
  close(t, 2. * np.cos(0.5))
  assert n == 3 and tn.dtype == jax.dtypes.float0


def test_defjvps_with_no_rule_at_all_gives_zero_tangents():
  """Every argument's rule None: the output depends on none of them, so its
  tangent is zero, and so is the gradient (JAX's own ``defjvps`` raises
  here, its zero tangent a symbolic one of another tree structure)."""
  f = hijax.custom_jvp(lambda x, y: jnp.sin(x) * y)
  f.defjvps(None, None)
  out, t = jax.jvp(f, (0.5, 2.), (1., 1.))
  close(out, np.sin(0.5) * 2.)
  close(t, 0.)
  close(jax.grad(f, (0, 1))(0.5, 2.), (0., 0.))
  g = jax.custom_jvp(lambda x, y: jnp.sin(x) * y)
  g.defjvps(None, None)
  with pytest.raises(TypeError, match="equal container"):
    jax.jvp(g, (0.5, 2.), (1., 1.))


def test_defjvps_rejects_nondiff_argnums(api):
  f = api.custom_jvp(lambda n, x: x * n, nondiff_argnums=(0,))
  with pytest.raises(TypeError, match="nondiff_argnums"):
    f.defjvps(lambda t, out, n, x: t * n)


def test_log1pexp_stability_under_jit_and_vmap(api):
  @api.custom_jvp
  def log1pexp(x):
    return jnp.log(1. + jnp.exp(x))

  @log1pexp.defjvp
  def _(primals, tangents):
    (x,), (t,) = primals, tangents
    return log1pexp(x), (1. - 1. / (1. + jnp.exp(x))) * t
  assert np.isnan(jax.grad(lambda x: jnp.log(1. + jnp.exp(x)))(100.))
  close(jax.grad(log1pexp)(100.), 1.)
  close(jax.jit(jax.grad(log1pexp))(3.), 1. / (1. + np.exp(-3.)))
  close(jax.vmap(jax.grad(log1pexp))(jnp.array([0., 100.])), [0.5, 1.])


def test_which_runs_jvp(api):
  log = []

  @api.custom_jvp
  def f(x):
    log.append("f")
    return jnp.sin(x)

  @f.defjvp
  def f_jvp(primals, tangents):
    log.append("f_jvp")
    (x,), (t,) = primals, tangents
    return f(x), jnp.cos(x) * t
  f(3.)
  assert log == ["f"]  # an eager call runs the function only
  # JAX runs the rule, which runs f. hijax first traces f once, for the types
  # of its output (a Python side effect in f shows it); the rule's call of f
  # then runs f eagerly under jvp. Under grad, f (reading the same values:
  # log is empty again) is not traced again: the jvp's trace is kept.
  log.clear()
  jax.jvp(f, (3.,), (1.,))
  assert log == (["f_jvp", "f"] if api is JAX else ["f", "f_jvp", "f"])
  log.clear()
  jax.grad(f)(3.)
  assert log == (["f_jvp", "f"] if api is JAX else ["f_jvp"])


def test_python_control_flow_on_concrete_values(api):
  @api.custom_jvp
  def f(x):
    if x > 0:
      return jnp.sin(x)
    return jnp.cos(x)

  @f.defjvp
  def f_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return f(x), (jnp.cos(x) if x > 0 else -jnp.sin(x)) * t
  close(jax.grad(f)(1.), np.cos(1.))
  close(jax.grad(f)(-1.), np.sin(1.))
  with pytest.raises(jax.errors.ConcretizationTypeError):
    jax.jit(f)(1.)


def test_jvp_pytrees_in_and_out(api):
  Point = collections.namedtuple("Point", ["x", "y"])

  @api.custom_jvp
  def f(pt):
    return {"a": (pt.x * pt.y, jnp.sin(pt.x))}

  @f.defjvp
  def f_jvp(primals, tangents):
    (pt,), (t,) = primals, tangents
    out = f(pt)
    return out, {"a": (t.x * pt.y + pt.x * t.y, jnp.cos(pt.x) * t.x)}
  pt = Point(2., 3.)
  close(jax.grad(lambda p: f(p)["a"][0] + f(p)["a"][1])(pt),
        Point(3. + np.cos(2.), 2.))


def test_jvp_nondiff_argnums_function_first_in_the_rule(api):
  @functools.partial(api.custom_jvp, nondiff_argnums=(0,))
  def app(fn, x):
    return fn(x)

  @app.defjvp
  def app_jvp(fn, primals, tangents):
    (x,), (t,) = primals, tangents
    return app(fn, x), jax.jvp(fn, (x,), (t,))[1]
  close(jax.grad(app, 1)(jnp.sin, 0.5), np.cos(0.5))
  close(jax.jit(jax.grad(app, 1), static_argnums=0)(jnp.tanh, 0.5),
        1 - np.tanh(0.5) ** 2)


def test_jvp_nondiff_argnames_and_keywords(api):
  @functools.partial(api.custom_jvp, nondiff_argnames=("power",))
  def f(x, power=2):
    return x ** power

  @f.defjvp
  def f_jvp(power, primals, tangents):
    (x,), (t,) = primals, tangents
    return f(x, power), power * x ** (power - 1) * t
  close(jax.grad(f)(3.), 6.)
  close(jax.grad(lambda x: f(x, power=3))(2.), 12.)
  close(jax.grad(lambda x: f(x=x, power=3))(2.), 12.)


def test_jvp_nondiff_traced_argument(api):
  @functools.partial(api.custom_jvp, nondiff_argnums=(1,))
  def f(x, s):
    return x * s

  @f.defjvp
  def f_jvp(s, primals, tangents):
    (x,), (t,) = primals, tangents
    return f(x, s), t * s
  close(jax.vmap(jax.grad(f), (None, 0))(1., jnp.arange(3.)), [0., 1., 2.])
  if api is JAX:  # a silent zero: the rule gives no derivative in s
    close(jax.grad(lambda s: f(2., s))(3.), 0.)
  else:  # hijax differentiates f's own code in s, as for a closed-over value
    close(jax.grad(lambda s: f(2., s))(3.), 2.)


def test_jvp_symbolic_zeros(api):
  seen = []

  @api.custom_jvp
  def f(x, y):
    return x * y

  @functools.partial(f.defjvp, symbolic_zeros=True)
  def f_jvp(primals, tangents):
    (x, y), (tx, ty) = primals, tangents
    seen.append((type(tx) is SymbolicZero, type(ty) is SymbolicZero))
    out = x * y
    t = 0.
    if type(tx) is not SymbolicZero:
      t = t + tx * y
    if type(ty) is not SymbolicZero:
      t = t + x * ty
    return out, t
  close(jax.jvp(lambda x: f(x, 3.), (2.,), (1.,))[1], 3.)
  assert seen[-1] == (False, True)
  close(jax.grad(f, 1)(2., 3.), 2.)
  assert (True, False) in seen


def test_jvp_integer_input_has_float0_tangent(api):
  @api.custom_jvp
  def f(x, n):
    return x * n

  @f.defjvp
  def f_jvp(primals, tangents):
    (x, n), (tx, tn) = primals, tangents
    assert tn.dtype == jax.dtypes.float0
    return f(x, n), tx * n
  close(jax.grad(f)(2., 3), 3.)


def test_a_rule_reading_a_value_traced_by_jit_works_under_jvp_of_that_jit():
  """``jax.jvp`` of a jitted function that defines a `custom_jvp` closing
  over one of the jit's traced values: the rule runs after the jit's
  tracing ended, so hijax traced it ahead with stand-in tangents (an
  integer input's is a float0 array, whose dtype and shape the rule reads)
  and the traced value as an input. Run directly instead, the rule would
  read a tracer of a trace that has ended."""
  def g(x, w):
    @hijax.custom_jvp
    def f(x, n):
      return jnp.sin(x) * w * n

    @f.defjvp
    def f_jvp(primals, tangents):
      (x, n), (tx, tn) = primals, tangents
      assert tn.dtype == jax.dtypes.float0 and tn.shape == jnp.shape(n)
      return f(x, n), jnp.cos(x) * w * n * tx
    return f(x, 3)
  out, t = jax.jvp(jax.jit(g), (0.5, 2.), (1., 0.))
  close(out, np.sin(0.5) * 6.)
  close(t, np.cos(0.5) * 6.)


def test_a_rule_alone_reading_a_value_traced_by_jit_works_under_jvp_of_that_jit():
  """As above, but only the rule reads the jit's value (the function does
  not): it is still traced ahead, and a tangent that is a symbolic zero
  (``y`` is a constant) reaches it as a zero array, as at a direct call."""
  def g(x, w):
    @hijax.custom_jvp
    def f(x, y):
      return jnp.sin(x) * y

    @f.defjvp
    def f_jvp(primals, tangents):
      (x, y), (tx, ty) = primals, tangents
      # a deliberately odd rule: its tangent is scaled by the jit's w
      return f(x, y), jnp.cos(x) * y * tx * w + jnp.sin(x) * ty
    return f(x, 3.)
  out, t = jax.jvp(jax.jit(g), (0.5, 2.), (1., 0.))
  close(out, np.sin(0.5) * 3.)
  close(t, np.cos(0.5) * 6.)


def test_a_function_that_needs_concrete_values_runs_under_jaxs_decorator():
  """Python control flow on a value cannot be traced abstractly: under an
  eager ``grad`` such a function (and its rules) is handed to JAX's own
  ``custom_vjp``, which runs it on concrete values, as without hijax."""
  @hijax.custom_vjp
  def f(x):
    return jnp.sin(x) if x > 0 else jnp.cos(x)
  f.defvjp(lambda x: (f(x), x),
           lambda x, g: ((jnp.cos(x) if x > 0 else -jnp.sin(x)) * g,))
  close(jax.grad(f)(0.5), np.cos(0.5))
  close(jax.grad(f)(-0.5), -np.sin(-0.5))


def test_a_broken_rule_of_a_function_reading_a_jit_value_raises_its_own_error():
  """The function closes over a value of the jit, so hijax tries its rules
  ahead; ``fwd`` raises there. The call itself works, and differentiating
  it raises ``fwd``'s own error, when the rule is used, as with JAX."""
  @jax.jit
  def loss(x, w):
    @hijax.custom_vjp
    def f(x):
      return jnp.sin(x) * w

    def fwd(x):
      raise ValueError("fwd is broken")

    def bwd(res, g):
      return (g,)
    f.defvjp(fwd, bwd)
    return f(x)
  close(loss(0.5, 2.), np.sin(0.5) * 2.)
  with pytest.raises(ValueError, match="^fwd is broken"):
    jax.grad(loss)(0.5, 2.)


def test_jvp_under_scan_and_checkpoint(api):
  f = sin_jvp(api)

  def loop(x):
    return jax.lax.scan(lambda c, _: (f(c), None), x, None, length=3)[0]

  def ref(x):
    return jax.lax.scan(lambda c, _: (jnp.sin(c), None), x, None, length=3)[0]
  close(jax.grad(loop)(0.7), jax.grad(ref)(0.7))
  close(jax.grad(jax.checkpoint(loop))(0.7), jax.grad(ref)(0.7))
  close(jax.jit(jax.hessian(loop))(0.7), jax.hessian(ref)(0.7))


def test_jvp_closing_over_a_value_that_is_not_differentiated(api):
  def outer(y, x):
    @api.custom_jvp
    def g(x):
      return jnp.sin(x) * y

    @g.defjvp
    def g_jvp(primals, tangents):
      (x,), (t,) = primals, tangents
      return g(x), jnp.cos(x) * y * t
    return g(x)
  ys = jnp.arange(3.)
  close(jax.grad(lambda x: jax.vmap(outer, (0, None))(ys, x).sum())(0.5),
        np.cos(0.5) * 3.)
  close(jax.jit(jax.grad(outer, 1))(2., 0.5), 2. * np.cos(0.5))


def test_jvp_rule_errors(api):
  f = api.custom_jvp(jnp.sin)
  with pytest.raises(AttributeError, match="No JVP defined"):
    f(1.)
  f.defjvp(lambda p, t: (f(p[0]),))
  with pytest.raises(TypeError, match="pair"):
    jax.jvp(f, (1.,), (1.,))
  f.defjvp(lambda p, t: ((f(p[0]),), t[0]))
  with pytest.raises(TypeError, match="structure"):
    jax.jvp(f, (1.,), (1.,))
  f.defjvp(lambda p, t: (f(p[0]), t[0].astype(jnp.float16)))
  with pytest.raises(TypeError, match="float16"):
    jax.jvp(f, (jnp.float32(1.),), (jnp.float32(1.),))
  f.defjvp(lambda p, t: (f(p[0]).astype(jnp.float16), t[0]))
  with pytest.raises(TypeError, match="float16"):
    jax.jvp(f, (jnp.float32(1.),), (jnp.float32(1.),))


def test_jvp_wraps_the_function(api):
  def documented(x):
    """Doubles x."""
    return 2 * x
  f = api.custom_jvp(documented)
  assert f.__name__ == "documented" and f.__doc__ == "Doubles x."
  assert f.__wrapped__ is documented


# --- custom_vjp ---------------------------------------------------------------

def test_vjp_values_and_transformations(api):
  f = sin_vjp(api)
  x = jnp.array([0.3, -1.2, 2.0])
  close(f(x), jnp.sin(x))
  close(jax.grad(lambda x: f(x).sum())(x), jnp.cos(x))
  close(jax.value_and_grad(f)(0.5), (np.sin(0.5), np.cos(0.5)))
  close(jax.jit(jax.grad(f))(0.5), np.cos(0.5))
  close(jax.vmap(jax.grad(f))(x), jnp.cos(x))
  close(jax.jacrev(f)(x), jnp.diag(jnp.cos(x)))
  y, f_vjp = jax.vjp(f, x)
  close((y, f_vjp(2 * jnp.ones(3))), (jnp.sin(x), (2 * jnp.cos(x),)))


def test_vjp_grad_of_grad_differentiates_the_backward_rule(api):
  f = sin_vjp(api)
  # bwd multiplies g by cos(x), saved by fwd: its derivative is -sin(x)
  close(jax.grad(jax.grad(f))(0.5), -np.sin(0.5))


def test_vjp_none_is_a_zero_cotangent_and_clipping(api):
  @api.custom_vjp
  def clip_gradient(lo, hi, x):
    return x

  def fwd(lo, hi, x):
    return x, (lo, hi)

  def bwd(res, g):
    lo, hi = res
    return (None, None, jnp.clip(g, lo, hi))
  clip_gradient.defvjp(fwd, bwd)
  xs = jnp.linspace(0., 10., 7)
  grads = jax.vmap(jax.grad(
      lambda x: jnp.sin(clip_gradient(-0.75, 0.75, x))))(xs)
  close(grads, jnp.clip(jnp.cos(xs), -0.75, 0.75))
  close(jax.grad(clip_gradient, (0, 1))(-0.75, 0.75, 2.), (0., 0.))


@pytest.mark.parametrize("remat3", [False, True], ids=["remat", "remat3"])
def test_vjp_clipping_rule_under_checkpoint(api, remat3):
  @api.custom_vjp
  def clip_gradient(x):
    return x
  clip_gradient.defvjp(lambda x: (x, None),
                       lambda _, g: (jnp.clip(g, -1., 1.),))
  f = jax.checkpoint(lambda x: jnp.sin(3. * clip_gradient(x)))
  old = jax.config.jax_remat3
  jax.config.update("jax_remat3", remat3)
  try:
    xs = jnp.array([0.1, 0.5, 2.])
    expected = jnp.clip(3. * jnp.cos(3. * xs), -1., 1.)
    close(jax.vmap(jax.grad(f))(xs), expected)
    close(jax.jit(jax.vmap(jax.grad(f)))(xs), expected)
  finally:
    jax.config.update("jax_remat3", old)


def test_which_runs_vjp(api):
  log = []

  @api.custom_vjp
  def f(x):
    log.append("f")
    return jnp.sin(x)

  def f_fwd(x):
    log.append("fwd")
    return f(x), jnp.cos(x)

  def f_bwd(cos_x, g):
    log.append("bwd")
    return (cos_x * g,)
  f.defvjp(f_fwd, f_bwd)
  f(3.)
  assert log == ["f"]
  log.clear()
  _, f_vjp = jax.vjp(f, 3.)
  assert "fwd" in log and "bwd" not in log
  log.clear()
  f_vjp(1.)
  assert log == ["bwd"]
  log.clear()
  jax.grad(f)(3.)
  assert log.count("fwd") == 1 and log.count("bwd") == 1


def test_vjp_forward_mode(api):
  f = sin_vjp(api)
  if api is JAX:
    with pytest.raises(TypeError, match="can't apply forward-mode"):
      jax.jvp(f, (0.5,), (1.,))
  else:  # hijax derives forward mode from bwd
    close(jax.jvp(f, (0.5,), (1.,)), (np.sin(0.5), np.cos(0.5)))


def test_vjp_pytrees_in_and_out(api):
  Point = collections.namedtuple("Point", ["x", "y"])

  @api.custom_vjp
  def f(pt):
    return {"a": (pt.x * pt.y, jnp.sin(pt.x))}

  def fwd(pt):
    return f(pt), pt

  def bwd(pt, g):
    a, b = g["a"]
    return (Point(a * pt.y + b * jnp.cos(pt.x), a * pt.x),)
  f.defvjp(fwd, bwd)
  pt = Point(2., 3.)
  close(jax.grad(lambda p: f(p)["a"][0] + f(p)["a"][1])(pt),
        Point(3. + np.cos(2.), 2.))


def test_vjp_none_inside_a_pytree_cotangent(api):
  @api.custom_vjp
  def f(d):
    return d["x"] * d["y"]
  f.defvjp(lambda d: (f(d), d["y"]), lambda y, g: ({"x": g * y, "y": None},))
  close(jax.grad(f)({"x": 2., "y": 3.}), {"x": 3., "y": 0.})
  f.defvjp(lambda d: (f(d), d["y"]), lambda y, g: (None,))
  close(jax.grad(f)({"x": 2., "y": 3.}), {"x": 0., "y": 0.})


def test_vjp_bwd_may_return_a_list(api):
  @api.custom_vjp
  def f(x, y):
    return x * y
  f.defvjp(lambda x, y: (f(x, y), (x, y)),
           lambda res, g: [g * res[1], g * res[0]])
  close(jax.grad(f, (0, 1))(2., 3.), (3., 2.))


def test_vjp_nondiff_argnums_function_first_in_bwd(api):
  @functools.partial(api.custom_vjp, nondiff_argnums=(0,))
  def app(fn, x):
    return fn(x)

  def fwd(fn, x):
    return app(fn, x), x

  def bwd(fn, x, g):
    return (g * jax.grad(fn)(x),)
  app.defvjp(fwd, bwd)
  close(jax.grad(app, 1)(jnp.sin, 0.5), np.cos(0.5))
  close(jax.vmap(jax.grad(app, 1), (None, 0))(jnp.sin, jnp.arange(3.)),
        jnp.cos(jnp.arange(3.)))


def test_vjp_nondiff_argnames_and_keywords(api):
  @functools.partial(api.custom_vjp, nondiff_argnames=("power",))
  def f(x, power=2):
    return x ** power
  f.defvjp(lambda x, power: (f(x, power), x),
           lambda power, x, g: (g * power * x ** (power - 1),))
  close(jax.grad(f)(3.), 6.)
  close(jax.grad(lambda x: f(x, power=3))(2.), 12.)


def test_vjp_keywords_resolved_with_defaults(api):
  @api.custom_vjp
  def f(x, scale=2.):
    return x * scale
  f.defvjp(lambda x, scale: (f(x, scale), scale),
           lambda scale, g: (g * scale, None))
  close(jax.grad(f)(1.), 2.)
  close(jax.grad(lambda x: f(x, scale=3.))(1.), 3.)
  close(jax.grad(lambda x: f(scale=3., x=x))(1.), 3.)

  @api.custom_vjp
  def g(x, *, s=2.):
    return x * s
  g.defvjp(lambda x: (g(x), None), lambda _, ct: (2 * ct,))
  with pytest.raises(TypeError, match="could not be resolved"):
    jax.grad(lambda x: g(x, s=3.))(1.)


def test_vjp_nondiff_traced_argument(api):
  @functools.partial(api.custom_vjp, nondiff_argnums=(1,))
  def f(x, s):
    return x * s
  f.defvjp(lambda x, s: (f(x, s), None), lambda s, _, g: (g * s,))
  if api is JAX:
    with pytest.raises(jax.errors.UnexpectedTracerError):
      jax.vmap(jax.grad(f), (None, 0))(1., jnp.arange(3.))
    with pytest.raises(jax.errors.UnexpectedTracerError):
      jax.grad(lambda s: f(2., s))(3.)
  else:  # hijax passes it on; its derivative is that of f's own code
    close(jax.vmap(jax.grad(f), (None, 0))(1., jnp.arange(3.)), [0., 1., 2.])
    close(jax.grad(lambda s: f(2., s))(3.), 2.)


def test_vjp_symbolic_zeros(api):
  seen = []

  @api.custom_vjp
  def f(x, y):
    return x * y, x + y

  def fwd(x, y):
    assert isinstance(x, CustomVJPPrimal) and isinstance(y, CustomVJPPrimal)
    seen.append(("fwd", x.perturbed, y.perturbed))
    return f(x.value, y.value), (x.value, y.value)

  def bwd(res, g):
    x, y = res
    g_mul, g_add = g
    seen.append(("bwd", type(g_mul) is SymbolicZero,
                 type(g_add) is SymbolicZero))
    g_mul = jnp.zeros_like(x) if type(g_mul) is SymbolicZero else g_mul
    g_add = jnp.zeros_like(x) if type(g_add) is SymbolicZero else g_add
    return g_mul * y + g_add, g_mul * x + g_add
  f.defvjp(fwd, bwd, symbolic_zeros=True)
  close(jax.grad(lambda x: f(x, 3.)[0])(2.), 3.)
  assert ("fwd", True, False) in seen and ("bwd", False, True) in seen
  close(jax.grad(lambda x, y: f(x, y)[1], (0, 1))(2., 3.), (1., 1.))
  assert ("bwd", True, False) in seen


def test_vjp_optimize_remat(api):
  f = api.custom_vjp(jnp.sin)
  f.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)), lambda c, g: (c * g,),
           optimize_remat=True)
  close(jax.grad(jax.checkpoint(lambda x: f(f(x))))(0.5),
        np.cos(np.sin(0.5)) * np.cos(0.5))
  with pytest.raises(NotImplementedError, match="symbolic zeros"):
    f.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)), lambda c, g: (c * g,),
             symbolic_zeros=True, optimize_remat=True)


def test_vjp_with_logs(api):
  f = api.custom_vjp(jnp.sin)
  f.defvjp_with_logs(lambda x: (jnp.sin(x), jnp.cos(x)),
                     lambda c, g: ((c * g,), {"g": g}))
  _, f_vjp = jax.vjp(f, 0.5)
  (ct,), logs = f_vjp.with_logs(2.)
  close((ct, logs["g"]), (2 * np.cos(0.5), 2.))
  close(f_vjp(2.), (2 * np.cos(0.5),))


def test_vjp_integer_inputs_and_outputs(api):
  @api.custom_vjp
  def f(x, n):
    return x * n, n
  f.defvjp(lambda x, n: (f(x, n), n), lambda n, g: (g[0] * n, None))
  close(jax.grad(lambda x: f(x, 3)[0])(2.), 3.)
  ct_n = jax.grad(lambda x, n: f(x, n)[0], 1, allow_int=True)(2., 3)
  assert ct_n.dtype == jax.dtypes.float0


def test_vjp_under_scan_checkpoint_and_jit(api):
  f = sin_vjp(api)

  def loop(x):
    return jax.lax.scan(lambda c, _: (f(c) * c, None), x, None, length=3)[0]

  def ref(x):
    return jax.lax.scan(lambda c, _: (jnp.sin(c) * c, None), x, None,
                        length=3)[0]
  for transform in (jax.grad, lambda g: jax.grad(jax.checkpoint(g)),
                    lambda g: jax.jit(jax.grad(g)),
                    lambda g: jax.grad(jax.grad(g))):
    close(transform(loop)(0.7), transform(ref)(0.7))
  close(jax.vmap(jax.grad(loop))(jnp.arange(3.)),
        jax.vmap(jax.grad(ref))(jnp.arange(3.)))


def test_vjp_fixed_point_by_implicit_differentiation(api):
  @functools.partial(api.custom_vjp, nondiff_argnums=(0,))
  def fixed_point(f, a, x_guess):
    def cond(carry):
      x_prev, x = carry
      return jnp.abs(x_prev - x) > 1e-6

    def body(carry):
      _, x = carry
      return x, f(a, x)
    _, x_star = jax.lax.while_loop(cond, body, (x_guess, f(a, x_guess)))
    return x_star

  def fwd(f, a, x_init):
    x_star = fixed_point(f, a, x_init)
    return x_star, (a, x_star)

  def rev_iter(f, packed, u):
    a, x_star, x_star_bar = packed
    _, vjp_x = jax.vjp(lambda x: f(a, x), x_star)
    return x_star_bar + vjp_x(u)[0]

  def bwd(f, res, x_star_bar):
    a, x_star = res
    _, vjp_a = jax.vjp(lambda a: f(a, x_star), a)
    a_bar, = vjp_a(fixed_point(functools.partial(rev_iter, f),
                               (a, x_star, x_star_bar), x_star_bar))
    return a_bar, jnp.zeros_like(x_star)
  fixed_point.defvjp(fwd, bwd)

  def newton_sqrt(a):
    return fixed_point(lambda a, x: 0.5 * (x + a / x), a, a)
  close(newton_sqrt(2.), np.sqrt(2.))
  close(jax.grad(newton_sqrt)(2.), 0.5 / np.sqrt(2.))
  close(jax.grad(jax.grad(newton_sqrt))(2.), -0.25 * 2. ** -1.5, rtol=1e-4)


def test_vjp_rule_errors(api):
  f = api.custom_vjp(jnp.sin)
  with pytest.raises(AttributeError, match="No VJP defined"):
    f(1.)
  f.defvjp(lambda x: (jnp.sin(x),), lambda c, g: (g,))
  with pytest.raises(TypeError, match="pair"):
    jax.grad(f)(1.)
  f.defvjp(lambda x: ((jnp.sin(x),), None), lambda c, g: (g,))
  if api is HIJAX:
    with pytest.raises(TypeError, match="structure"):
      jax.grad(f)(1.)
  else:  # JAX takes fwd's primal output as it is, unchecked
    assert isinstance(jax.vjp(f, 1.)[0], tuple)
  f.defvjp(lambda x: (jnp.sin(x).astype(jnp.float16), None),
           lambda c, g: (g,))
  if api is HIJAX:
    with pytest.raises(TypeError, match="float16"):
      jax.grad(f)(jnp.float32(1.))
  else:  # again unchecked: the output changes dtype under differentiation
    assert jax.vjp(f, jnp.float32(1.))[0].dtype == jnp.float16
  f.defvjp(lambda x: (jnp.sin(x), None), lambda c, g: (g, g))
  with pytest.raises(TypeError):
    jax.grad(f)(1.)
  # a cotangent of the wrong shape: ValueError in JAX, and hijax's error is
  # a ValueError too (and a TypeError, as all its rule-type errors)
  f.defvjp(lambda x: (jnp.sin(x), None), lambda c, g: (jnp.ones(2) * g.sum(),))
  with pytest.raises(ValueError, match=r"float32\[2\]"):
    jax.grad(lambda x: f(x).sum())(jnp.ones(3))


def test_vjp_cotangent_of_another_float_dtype(api):
  f = api.custom_vjp(lambda x: 2. * x)
  f.defvjp(lambda x: (f(x), None),
           lambda _, g: ((2. * g).astype(jnp.float16),))
  if api is JAX:  # passed on unconverted: the gradient changes dtype
    assert jax.grad(f)(jnp.float32(1.)).dtype == jnp.float16
  else:
    with pytest.raises(TypeError, match=r"astype\(jnp.float32\)"):
      jax.grad(f)(jnp.float32(1.))


def test_vjp_wraps_the_function(api):
  def documented(x):
    """Doubles x."""
    return 2 * x
  f = api.custom_vjp(documented)
  assert f.__name__ == "documented" and f.__doc__ == "Doubles x."
  assert f.__wrapped__ is documented


# --- effects, refs, and values that vary ---------------------------------------

def test_callbacks_in_the_function_and_the_rule(api):
  log = []

  @api.custom_vjp
  def f(x):
    jax.debug.callback(lambda v: log.append(("f", float(v))), x)
    return x * 2

  def bwd(_, g):
    jax.debug.callback(lambda v: log.append(("bwd", float(v))), g)
    return (2 * g,)
  f.defvjp(lambda x: (f(x), None), bwd)
  # a debug callback runs when the device gets to it: on an accelerator,
  # after the call returns. effects_barrier waits for it (without, on a TPU
  # v5e, the next call's "f" came before the last call's "bwd")
  for call in (lambda: jax.jit(f)(1.), lambda: jax.jit(jax.grad(f))(3.),
               lambda: jax.grad(f)(4.)):
    call()
    jax.effects_barrier()
  assert log == [("f", 1.), ("f", 3.), ("bwd", 1.), ("f", 4.), ("bwd", 1.)]


@pytest.mark.parametrize("jit", [False, True])
def test_backward_rule_writing_into_a_ref(api, jit):
  def run(x):
    ref = jax.new_ref(0.)

    @api.custom_vjp
    def f(x):
      return jnp.sin(x)

    def f_bwd(cos_x, g):
      ref[...] += g
      return (cos_x * g,)
    f.defvjp(lambda x: (f(x), jnp.cos(x)), f_bwd)
    return jax.grad(lambda x: 3. * f(x))(x), ref[...]
  grad, seen = (jax.jit(run) if jit else run)(1.)
  close((grad, seen), (3. * np.cos(1.), 3.))


_FUNCTIONS = {a.name: (sin_vjp(a), sin_jvp(a)) for a in (JAX, HIJAX)}


@hypothesis.settings(max_examples=15, deadline=None)
@hypothesis.given(hnp.arrays(np.float32, (3,), elements=st.floats(
    -4., 4., width=32)), st.floats(-2., 2., width=32))
def test_both_decorators_agree_on_random_inputs(x, s):
  (jax_f, jax_g), (our_f, our_g) = _FUNCTIONS["jax"], _FUNCTIONS["hijax"]
  loss = lambda f, g: lambda x, s: jnp.sum(f(s * x) * g(x) + f(x) ** 2)
  close(jax.grad(loss(our_f, our_g), (0, 1))(x, s),
        jax.grad(loss(jax_f, jax_g), (0, 1))(x, s))
  # forward mode of hijax's custom_vjp equals reverse mode of JAX's
  close(jax.jacfwd(loss(our_f, our_g), (0, 1))(x, s),
        jax.grad(loss(jax_f, jax_g), (0, 1))(x, s), rtol=1e-5, atol=1e-5)
