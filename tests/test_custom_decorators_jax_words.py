"""Each error JAX's decorators raise for a misuse, and hijax's for the same
misuse: the same exception type, and hijax's message begins with JAX's own
(taken from JAX's decorator at run time, so a test written against JAX's
text matches hijax's), followed by hijax's detail naming the function, the
rule and what to fix.

Where JAX's newer custom_vjp (``jax_custom_vjp3``) words an error
differently from its classic one, hijax's message begins with the newer
wording (that of a cotangent of the wrong type) or holds both (a fwd rule's
primal output of another type).
"""
import contextlib
import functools

import jax
import jax.numpy as jnp
import pytest
from jax._src import config

import hijax


def message(fn, *args, kind=Exception):
  with pytest.raises(kind) as e:
    fn(*args)
  return type(e.value), str(e.value).split("\n--------------------")[0]


def assert_begins_with_jax(make, call, vjp3=False, upto=None):
  """``make(api)`` builds the misused function with ``api``'s decorators;
  ``call(f)`` runs it. JAX's message (up to ``upto``, if given) must begin
  hijax's, and the types agree; returns hijax's detail, its last line."""
  with config.custom_vjp3(True) if vjp3 else contextlib.nullcontext():
    jax_type, jax_message = message(call, make(jax))
  hijax_type, hijax_message = message(call, make(hijax))
  if upto is not None:
    jax_message = jax_message[:jax_message.index(upto)]
  assert issubclass(hijax_type, jax_type), (hijax_type, jax_type)
  assert hijax_message.startswith(jax_message), (
      f"JAX: {jax_message}\nhijax: {hijax_message}")
  detail = hijax_message.rsplit("\n", 1)[-1]
  assert detail.startswith("hijax.custom_"), detail
  return detail


def scan_apply(f, x):
  return jax.lax.scan(lambda c, _: (f(c), None), x, None, length=1)[0]


# --- custom_jvp ---------------------------------------------------------------

def jvp_with(rule):
  def make(api):
    @api.custom_jvp
    def f(x):
      return x ** 2
    f.defjvp(functools.partial(rule, f))
    return f
  return make


def test_jvp_rule_not_returning_a_pair():
  def foo_jvp(f, primals, tangents):
    return tangents[0]
  detail = assert_begins_with_jax(jvp_with(foo_jvp),
                                  lambda f: jax.jvp(f, (2.,), (1.,)))
  assert "must return a pair (primal output, tangent output)" in detail


def test_jvp_rule_primal_and_tangent_structures_differ():
  def make(api):
    @api.custom_jvp
    def f(x):
      return (x ** 2,)

    @f.defjvp
    def foo_jvp(primals, tangents):
      (x,), (t,) = primals, tangents
      return f(x), [2 * x * t, x]
    return f
  assert "returned an output tangent with structure" in assert_begins_with_jax(
      make, lambda f: jax.jvp(f, (2.,), (1.,)))


@pytest.mark.parametrize("wrong", ["structure", "shape"])
def test_jvp_rule_primal_output_differs(wrong):
  def make(api):
    @api.custom_jvp
    def f(x):
      return x

    @f.defjvp
    def f_jvp(primals, tangents):
      (x,), (t,) = primals, tangents
      if wrong == "structure":
        return (x, x), (t, t)
      return jnp.zeros((3,), x.dtype), t
    return f
  detail = assert_begins_with_jax(make, lambda f: jax.jvp(
      lambda x: scan_apply(f, x), (jnp.float32(1.),), (jnp.float32(1.),)))
  assert "the jvp rule f_jvp returned a" in detail


def test_jvp_rule_tangent_of_another_type():
  def foo_jvp(f, primals, tangents):
    return f(primals[0]), jnp.reshape(tangents[0], (1,))
  detail = assert_begins_with_jax(jvp_with(foo_jvp), lambda f: jax.jvp(
      f, (jnp.float32(2.),), (jnp.float32(1.),)))
  assert "as the tangent of output" in detail


@pytest.mark.parametrize("kind", ["custom_jvp", "custom_vjp"])
@pytest.mark.parametrize("call", ["missing", "keyword_only"])
def test_arguments_that_do_not_resolve(kind, call):
  def make(api):
    def f(x, y, *, z=None):
      return jnp.sin(x) + y
    g = getattr(api, kind)(f)
    if kind == "custom_jvp":
      g.defjvp(lambda p, t: (g(*p), t[0]))
    else:
      g.defvjp(lambda x, y: (g(x, y), None), lambda _, ct: (ct, ct))
    return g
  run = ((lambda f: f(0.5)) if call == "missing"
         else (lambda f: f(0.5, 0.1, z=1.0)))
  detail = assert_begins_with_jax(make, run)
  assert ("keyword-only" in detail) == (call == "keyword_only")


@pytest.mark.parametrize("kind", ["custom_jvp", "custom_vjp"])
def test_missing_rule(kind):
  def make(api):
    return getattr(api, kind)(jnp.sin)
  with pytest.raises(AttributeError) as jax_error:
    make(jax)(1.)
  with pytest.raises(AttributeError) as hijax_error:
    make(hijax)(1.)
  assert str(hijax_error.value) == str(jax_error.value)


# --- custom_vjp ---------------------------------------------------------------

def vjp_with(fwd, bwd, fun=lambda x: x, **kw):
  def make(api):
    f = api.custom_vjp(fun)
    f.defvjp(fwd, bwd, **kw)
    return f
  return make


def test_fwd_rule_not_returning_a_pair():
  detail = assert_begins_with_jax(
      vjp_with(lambda x: x, lambda _, g: (g,)),
      lambda f: jax.grad(f)(1.))
  assert "the fwd rule <lambda> must return a pair" in detail


@pytest.mark.parametrize("vjp3", [False, True])
def test_fwd_rule_primal_output_of_another_structure(vjp3):
  def f_fwd(x):
    return (x, x), None
  # (the newer custom_vjp shows the structures without the types)
  assert_begins_with_jax(
      vjp_with(f_fwd, lambda _, g: (g,)),
      lambda f: jax.grad(lambda x: scan_apply(f, x))(jnp.float32(1.)),
      vjp3=vjp3, upto=":\n" if vjp3 else None)


def test_fwd_rule_primal_output_of_another_shape():
  def f_fwd2(x):
    return jnp.zeros((3, *x.shape), x.dtype), None
  make = vjp_with(f_fwd2, lambda _, g: (g,))
  run = lambda f: jax.grad(lambda x: scan_apply(f, x))(jnp.float32(1.))
  detail = assert_begins_with_jax(make, run)
  # the classic custom_vjp's words come first; the newer one's are in it too
  with config.custom_vjp3(True):
    _, newer = message(run, make(jax))
  assert "got fwd output type float32[3] which doesn't match" in newer
  assert "got fwd output type float32[3] which doesn't match" in (
      message(run, make(hijax))[1])
  assert "as its primal output" in detail


@pytest.mark.parametrize("bwd", [lambda _, g: 2. * g, lambda _, g: (g, g)])
def test_bwd_rule_not_returning_a_tuple_per_argument(bwd):
  detail = assert_begins_with_jax(
      vjp_with(lambda x: (x, None), bwd), lambda f: jax.grad(f)(3.))
  assert "must return a tuple with one cotangent per differentiable" in detail


def test_bwd_rule_cotangent_of_another_shape():
  def make(api):
    @api.custom_vjp
    def foo(x, y):
      return x
    foo.defvjp(lambda x, y: (x, None),
               lambda _, g: (jnp.zeros(3), jnp.zeros(3)))
    return foo
  detail = assert_begins_with_jax(make, lambda f: jax.grad(
      lambda x, y: f(x, y * y).sum(), 1)(jnp.ones(3), jnp.ones(4)), vjp3=True)
  assert "the bwd rule <lambda> returned a value of type float32[3] as the " \
         "cotangent of argument y (position 1)" in detail


def test_bwd_rule_symbolic_zero_of_another_shape():
  def make(api):
    @api.custom_vjp
    def f(x, y, z):
      return x, y, z

    def fwd(x, y, z):
      return f(x.value, y.value, z.value), None

    def bwd(_, gs):
      x_bar, y_bar, z_bar = gs
      return y_bar, x_bar, z_bar  # swapped
    f.defvjp(fwd, bwd, symbolic_zeros=True)
    return f
  detail = assert_begins_with_jax(make, lambda f: jax.grad(
      lambda x, y, z: f(x, y, z)[2].sum())(jnp.ones(1), jnp.ones(2),
                                           jnp.ones(3)), vjp3=True)
  assert "returned a symbolic zero of type" in detail


@pytest.mark.parametrize("bwd", [lambda _, ct: (ct,),
                                 lambda _, ct: ((ct,), [1.0])])
def test_logs_of_the_wrong_form(bwd):
  def make(api):
    @api.custom_vjp
    def e(x):
      return x
    e.defvjp_with_logs(lambda x: (e(x), None), bwd)
    return e
  assert_begins_with_jax(make, lambda f: jax.grad(f)(1.))


def test_forward_mode_of_a_bwd_not_linear_in_g():
  """JAX refuses forward mode of every custom_vjp function; hijax only where
  the bwd rule is not linear in g, beginning with JAX's words."""
  def clip_bwd(_, g):
    return (jnp.clip(g, -1., 1.),)
  detail = assert_begins_with_jax(vjp_with(lambda x: (x, None), clip_bwd),
                                  lambda f: jax.jvp(f, (3.,), (1.,)))
  assert "the bwd rule clip_bwd is not linear in the cotangent g" in detail


# --- the exception classes -------------------------------------------------------

def test_the_exceptions_a_user_may_catch_are_importable_and_documented():
  """Each is what JAX raises too (TypeError, ValueError), and is listed in
  the API reference's exceptions section."""
  from pathlib import Path
  assert issubclass(hijax.RuleTypeError, TypeError)
  assert issubclass(hijax.CotangentTypeError, hijax.RuleTypeError)
  assert issubclass(hijax.CotangentTypeError, ValueError)
  assert issubclass(hijax.NonlinearBackwardError, TypeError)
  api = (Path(__file__).parent.parent / "docs" / "api.md").read_text()
  section = api[api.index("## Exceptions"):]
  for name in ("RuleTypeError", "CotangentTypeError",
               "NonlinearBackwardError"):
    assert name in hijax.__all__
    assert f".. autoexception:: {name}" in section


def test_the_cotangent_error_is_caught_as_hijax_s_and_as_jax_s():
  f = hijax.custom_vjp(lambda x: x)
  f.defvjp(lambda x: (x, None), lambda _, g: (jnp.zeros(3),))
  for kind in (hijax.CotangentTypeError, hijax.RuleTypeError, ValueError):
    with pytest.raises(kind):
      jax.grad(lambda x: f(x).sum())(jnp.ones(2))
