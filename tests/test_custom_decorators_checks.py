"""`hijax.custom_vjp` and `hijax.custom_jvp` as hijax primitives: what their
rules return is checked (each message names the function, the rule, the
argument or output, what was declared and what came back), residual reports
and budgets, ``jax.checkpoint`` policies, `hijax.testing.check_rules`, and
the compiled program, which is JAX's decorator's.
"""
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import checkpoint_name
from jax.custom_derivatives import SymbolicZero

import hijax
from hijax import custom_jvp, custom_vjp
from hijax._decorators import _tracing
from hijax.testing import RuleCheckError, check_rules


def close(a, b, rtol=1e-5, atol=1e-6):
  jax.tree.map(lambda a, b: np.testing.assert_allclose(
      np.asarray(a), np.asarray(b), rtol=rtol, atol=atol), a, b)


def norm_with(bwd, dec=custom_vjp):
  @dec
  def norm(x):
    return jnp.sqrt(jnp.sum(x ** 2))

  def norm_fwd(x):
    n = norm(x)
    return n, (x, n)
  norm.defvjp(norm_fwd, bwd)
  return norm


def norm_bwd(res, g):
  x, n = res
  return (g * x / n,)


def error_of(fn, *args, kind=Exception):
  with pytest.raises(kind) as e:
    fn(*args)
  return str(e.value).split("\n--------------------")[0]


def hijax_part(message):
  """The last line of a message: hijax's detail, after JAX's wording."""
  return message.rsplit("\n", 1)[-1]


def source_of(f):
  code = f.__code__
  return f"{f.__name__} at {code.co_filename}:{code.co_firstlineno}"


# --- rule outputs, checked --------------------------------------------------------

def test_wrong_cotangent_shape_names_function_rule_argument_and_types():
  def short_bwd(res, g):
    x, n = res
    return (g * x[:2] / n,)
  f = norm_with(short_bwd)
  message = error_of(jax.grad(f), jnp.ones(3), kind=ValueError)
  assert message == (
      # JAX's own words, then hijax's
      f"at output[0] the bwd rule attached to {source_of(f.fun)} produced an "
      "output of type float32[2] which doesn't match expected type "
      "float32[3]\n"
      # (and those of JAX's older custom_vjp, which JAX 0.11's tests match)
      f"Custom VJP bwd rule attached to {source_of(f.fun)} must produce an "
      "output with the same type as the args tuple of the primal function, "
      "but at output[0] the bwd rule produced an output of type float32[2] "
      "corresponding to an input of type float32[3]\n"
      "hijax.custom_vjp function norm: the bwd rule short_bwd returned a "
      "value of type float32[2] as the cotangent of argument x (position 0), "
      "but that argument has type float32[3], so its cotangent is "
      "float32[3]. Return a value of shape (3,).")
  with pytest.raises(TypeError):  # also a TypeError, as hijax's rule errors
    jax.grad(f)(jnp.ones(3))


@pytest.mark.parametrize("transform", [
    "jit", "vmap", "scan", "checkpoint", "second_order"])
def test_wrong_cotangent_is_caught_under(transform):
  def short_bwd(res, g):
    x, n = res
    return (g * x[:2] / n,)
  f = norm_with(short_bwd)
  g = {"jit": jax.jit(jax.grad(f)),
       "vmap": jax.vmap(jax.grad(f)),
       "scan": jax.grad(lambda x: jax.lax.scan(
           lambda c, _: (c * f(c), None), x, None, length=2)[0].sum()),
       "checkpoint": jax.grad(jax.checkpoint(f)),
       "second_order": jax.hessian(f)}[transform]
  x = jnp.ones((2, 3)) if transform == "vmap" else jnp.ones(3)
  assert "the bwd rule short_bwd returned a value of type float32[2] as the " \
         "cotangent of argument x (position 0)" in error_of(g, x)


def test_wrong_cotangent_dtype_and_pytree_path():
  @custom_vjp
  def f(params, x):
    return params["w"] * x
  f.defvjp(lambda p, x: (f(p, x), (p, x)),
           lambda r, g: ({"w": (g * r[1]).astype(jnp.float16)}, g * r[0]["w"]))
  message = error_of(jax.grad(f), {"w": jnp.float32(2.)}, jnp.float32(3.))
  assert message.startswith(
      f"at output[0]['w'] the bwd rule attached to {source_of(f.fun)} "
      "produced an output of type float16[] which doesn't match expected type "
      f"float32[]\nCustom VJP bwd rule attached to {source_of(f.fun)} must "
      "produce an output with the same type as the args tuple of the primal "
      "function, but at output[0]['w'] the bwd rule produced an output of type "
      "float16[] corresponding to an input of type float32[]\n"
      "hijax.custom_vjp function f: the bwd rule <lambda> returned a value of "
      "type float16[] as the cotangent of argument params (position 0)['w'], "
      "but that argument has type float32[], so its cotangent is float32[]. "
      "Convert it with `.astype(jnp.float32)`")


def test_wrong_number_and_structure_of_cotangents():
  f = norm_with(lambda res, g: (g, g))
  assert error_of(jax.grad(f), jnp.ones(3)) == (
      "Custom VJP bwd rule must produce an output with the same container "
      "(pytree) structure as the args tuple of the primal function, and in "
      "particular must produce a tuple of length equal to the number of "
      "arguments to the primal function, but got bwd output structure "
      "PyTreeDef((*, *)) for primal input structure PyTreeDef((*,)).\n"
      "hijax.custom_vjp function norm: the bwd rule <lambda> must return a "
      "tuple with one cotangent per differentiable argument of norm (1: x "
      "(position 0)), but returned a tuple of length 2")
  f = norm_with(lambda res, g: g)
  message = error_of(jax.grad(f), jnp.ones(3))
  assert "must return a tuple with one cotangent per differentiable " \
         "argument of norm" in message and "returned a tuple" not in message

  @custom_vjp
  def h(d):
    return d["a"] * d["b"]
  h.defvjp(lambda d: (h(d), d), lambda d, g: ({"a": g * d["b"]},))
  assert hijax_part(error_of(jax.grad(h), {"a": 1., "b": 2.})) == (
      "hijax.custom_vjp function h: the bwd rule <lambda> returned a "
      "cotangent with structure PyTreeDef({'a': *}) for argument d "
      "(position 0), whose structure is PyTreeDef({'a': *, 'b': *}): return "
      "a cotangent of the argument's structure (None for zeros)")


def test_wrong_symbolic_zero_cotangent():
  @custom_vjp
  def f(x, y):
    return x * y
  f.defvjp(lambda x, y: (f(x.value, y.value), None),
           lambda _, g: (g, SymbolicZero(jax.typeof(jnp.ones(2)))),
           symbolic_zeros=True)
  message = error_of(jax.grad(f), 1., 2., kind=ValueError)
  assert "returned a symbolic zero of type float32[2] as the cotangent of " \
         "argument y (position 1)" in message
  assert message.startswith(
      f"at output[1] the bwd rule attached to {source_of(f.fun)} produced an "
      "output of type float32[2] which doesn't match expected type float32[]."
      " Consider just returning a None here instead of a SymbolicZero "
      "object.\n")


def test_wrong_fwd_output():
  f = norm_with(norm_bwd)
  f.defvjp(lambda x: (jnp.sum(x ** 2).astype(jnp.float16), (x, 1.)), norm_bwd)
  assert error_of(jax.grad(f), jnp.ones(3)) == (
      "Custom VJP fwd rule <lambda> for function norm must produce a pair "
      "(list or tuple of length two) where the first element represents the "
      "primal output (equal to the output of the custom_vjp-decorated "
      "function norm) and the second element represents residuals (i.e. "
      "values stored from the forward pass for use on the backward pass), "
      "but instead the fwd rule output's first element had shapes/dtypes "
      "of:\n    float16[]\nwhile the custom_vjp-decorated function norm had "
      "output shapes/dtypes of:\n    float32[]\n"
      "at output, got fwd output type float16[] which doesn't match primal "
      "output type float32[]\n"
      "hijax.custom_vjp function norm: the fwd rule <lambda> returned a value "
      "of type float16[] as its primal output, but norm returns float32[] "
      "there. Convert it with `.astype(jnp.float32)` (hijax does not convert "
      "silently). The primal output must equal norm(*args).")
  f.defvjp(lambda x: jnp.sum(x), norm_bwd)
  message = error_of(jax.grad(f), jnp.ones(3))
  assert message.startswith(
      "Custom VJP fwd rule <lambda> for function norm must produce a pair "
      "(list or tuple of length two) where the first element represents the "
      "primal output (equal to those of the custom_vjp-decorated function "
      "norm) and the second element represents residuals (i.e. values stored "
      "from the forward pass for use on the backward pass), but instead of a "
      "pair the fwd rule <lambda> produced ")
  assert hijax_part(message) == (
      "hijax.custom_vjp function norm: the fwd rule <lambda> must return a "
      "pair (primal output, residuals), but returned a ArrayImpl")


def test_wrong_jvp_tangent():
  @custom_jvp
  def f(x):
    return {"a": jnp.sin(x), "b": x}

  @f.defjvp
  def f_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return f(x), {"a": jnp.cos(x) * t, "b": jnp.stack([t, t])}
  assert error_of(jax.jvp, f, (1.,), (1.,)) == (
      "Custom JVP rule must produce primal and tangent outputs with "
      "corresponding shapes and dtypes, but got:\n  primal float32[] with "
      "tangent float32[2], expecting tangent float32[]\n"
      "hijax.custom_jvp function f: the jvp rule f_jvp returned a value of "
      "type float32[2] as the tangent of output['b'], but that output is "
      "float32[], so its tangent is float32[]. Return a value of shape ().")


def test_wrong_symbolic_zero_tangent_and_logs():
  @custom_jvp
  def f(x):
    return jnp.sin(x)
  f.defjvp(lambda p, t: (f(p[0]), SymbolicZero(jax.typeof(jnp.ones(2)))),
           symbolic_zeros=True)
  assert "returned a symbolic zero of type float32[2] as the tangent of " \
         "output, whose tangent type is float32[]" in error_of(
             jax.jvp, f, (1.,), (1.,))
  g = custom_vjp(jnp.sin)
  g.defvjp_with_logs(lambda x: (jnp.sin(x), jnp.cos(x)),
                     lambda c, ct: ((c * ct,), ["not", "a", "dict"]))
  assert error_of(jax.grad(g), 1.) == (
      "Custom VJP bwd rule was registered with defvjp_with_logs, and so the "
      "second element of the pair it returns must be None or a dict of "
      "backward-pass log entries, but got list.\n"
      "hijax.custom_vjp function sin: the bwd rule <lambda> was defined with "
      "defvjp_with_logs, so the second entry of the pair it returns must be "
      "None or a dict of backward-pass logs, but it is a list")


def test_zero_tangents_and_cotangents_a_rule_may_return():
  """None or a symbolic zero of the right type as a tangent, a symbolic zero
  of the right type as a cotangent, and any array of the input's shape as
  the cotangent of an integer input (dropped, as JAX does): each is zero."""
  for zero in (lambda x: None, lambda x: SymbolicZero(jax.typeof(x))):
    f = custom_jvp(lambda x: (jnp.sin(x), 2. * x))
    f.defjvp(lambda p, t, zero=zero: (f(p[0]), (jnp.cos(p[0]) * t[0],
                                               zero(p[0]))),
             symbolic_zeros=True)
    close(jax.jvp(f, (1.,), (3.,))[1], (3. * np.cos(1.), 0.))
  g = custom_vjp(lambda x, y: x * y)
  g.defvjp(lambda x, y: (g(x, y), (x, y)),
           lambda r, ct: (r[1] * ct, SymbolicZero(jax.typeof(r[0]))))
  close(jax.grad(g, (0, 1))(2., 3.), (3., 0.))
  h = custom_vjp(lambda x, n: x * n)
  h.defvjp(lambda x, n: (h(x, n), n),
           lambda n, ct: (n * ct, jnp.zeros(())))
  close(jax.grad(h)(2., 3), 3.)


def test_wrong_batch_rule_outputs():
  f = custom_vjp(jnp.sin)
  f.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)), lambda c, g: (c * g,))

  @f.defbatch
  def sin_batch(axis_size, in_batched, x):
    return jnp.sin(x)[:2], True
  assert error_of(jax.vmap(f), jnp.ones(3)) == (
      "hijax.custom_vjp function sin: its batch rule sin_batch returned "
      "float32[2] as the output, which it says is batched, but sin returns "
      "float32[] there, so the rule must return float32[3] (a batched output "
      "has the batch axis, of size 3, first)")
  f.defbatch(lambda axis_size, in_batched, x: (jnp.sin(x), "yes"))
  assert "must return (out, out_batched) with out_batched a bool or a " \
         "pytree of bools" in error_of(jax.vmap(f), jnp.ones(3))
  f.defbatch(lambda axis_size, in_batched, x: jnp.sin(x))
  assert "must return a pair (out, out_batched)" in error_of(
      jax.vmap(f), jnp.ones(3))


def test_nondiff_argnames_must_name_a_parameter():
  with pytest.raises(ValueError, match="'y', which is not a positional "
                     "parameter of <lambda>"):
    custom_vjp(lambda x: x, nondiff_argnames=("y",))

  def f(x):
    return x
  with pytest.raises(ValueError, match=r"names 'y', which is not a "
                     r"positional parameter of f \('x',\)"):
    custom_jvp(f, nondiff_argnames="y")


def test_rule_outputs_are_checked_once_per_trace():
  calls = []

  def bwd(res, g):
    calls.append(1)
    return norm_bwd(res, g)
  f = norm_with(bwd)
  grad = jax.jit(jax.grad(f))
  grad(jnp.ones(3))
  grad(2 * jnp.ones(3))
  assert len(calls) == 1


def test_generic_batching_is_accepted_on_both_jax_versions():
  f = norm_with(norm_bwd)
  f.defvjp(lambda x: (f(x), (x, f(x))), norm_bwd, generic_batching=True)
  xs = jnp.array([[3., 4.], [6., 8.]])
  close(jax.vmap(jax.grad(f))(xs), xs / jnp.linalg.norm(xs, axis=1)[:, None])


# --- residuals, checkpoint policies, the checker ----------------------------------

def test_residual_report_and_budget_match_jax():
  x = jnp.ones(1000)
  mine = hijax.residual_report(norm_with(norm_bwd), x)
  jaxs = hijax.residual_report(norm_with(norm_bwd, jax.custom_vjp), x)
  assert mine.saved_bytes == jaxs.saved_bytes == 4  # n; x is the argument
  assert mine.total_bytes == jaxs.total_bytes == 4004
  assert [r.shape for r in mine.rows] == [r.shape for r in jaxs.rows]
  hijax.assert_residual_bytes(norm_with(norm_bwd), x, max_bytes=4)
  with pytest.raises(AssertionError, match="over the budget of 3 bytes"):
    hijax.assert_residual_bytes(norm_with(norm_bwd), x, max_bytes=3)


def _named_cos(dec):
  @dec
  def f(x):
    return jnp.sin(x)
  f.defvjp(lambda x: (f(x), checkpoint_name(jnp.cos(x), "cos")),
           lambda c, g: (c * g,))
  return lambda x: f(jnp.sin(x)).sum()


@pytest.mark.parametrize("remat3", [False, True], ids=["remat", "remat3"])
@pytest.mark.parametrize("policy", [
    jax.checkpoint_policies.save_only_these_names("cos"),
    hijax.save_only_these_names("cos"),
    hijax.save_any_names_but_these("cos"),
    jax.checkpoint_policies.nothing_saveable,
    jax.checkpoint_policies.everything_saveable],
    ids=["jax_names", "hijax_names", "hijax_but", "nothing", "everything"])
def test_checkpoint_policies_save_what_they_save_for_jax(remat3, policy):
  x = jnp.linspace(0., 1., 5)
  with _remat3(remat3):
    mine = hijax.residual_report(_named_cos(custom_vjp), x, policy=policy)
    jaxs = hijax.residual_report(_named_cos(jax.custom_vjp), x, policy=policy)
    grad = jax.grad(jax.checkpoint(_named_cos(custom_vjp), policy=policy))(x)
  assert [(r.what, r.shape) for r in mine.rows] == [
      (r.what, r.shape) for r in jaxs.rows]
  close(grad, jnp.cos(jnp.sin(x)) * jnp.cos(x))


class _remat3:
  def __init__(self, value):
    self.value = value

  def __enter__(self):
    self.old = jax.config.jax_remat3
    jax.config.update("jax_remat3", self.value)

  def __exit__(self, *exc):
    jax.config.update("jax_remat3", self.old)


def test_check_rules_passes_correct_decorators():
  x = jnp.array([0.5, -1.5, 2.0])
  report = check_rules(norm_with(norm_bwd), x)
  assert not report.failures
  assert {c.split(":")[0] for c in report.ran} >= {
      "expand", "jvp", "vjp", "lin", "batch", "second_order"}

  @custom_jvp
  def softplus(x):
    return jnp.logaddexp(x, 0.)
  softplus.defjvp(lambda p, t: (softplus(p[0]), jax.nn.sigmoid(p[0]) * t[0]))
  assert not check_rules(softplus, x).failures


def test_check_rules_catches_a_wrong_backward_rule():
  f = norm_with(lambda res, g: (-g * res[0] / res[1],))  # sign slip
  with pytest.raises(RuleCheckError, match="CustomVJPCall"):
    check_rules(f, jnp.array([0.5, -1.5, 2.0]))


def test_check_rules_on_a_linear_custom_jvp_checks_its_transpose():
  @custom_jvp
  def double(x):
    return 2. * x
  double.defjvp(lambda p, t: (double(p[0]), double(t[0])))
  report = check_rules(double, jnp.array([0.5, -1.5]))
  assert any(c.startswith("transpose") for c in report.ran)
  close(jax.grad(lambda x: double(x).sum())(jnp.ones(2)), 2 * jnp.ones(2))
  close(jax.linear_transpose(double, 1.)(3.), (6.,))
  transposable = lambda f, *args: jax.make_jaxpr(f)(*args).eqns[0].params[
      "_prim"].transposable
  assert transposable(double, 1.)
  # sin(x) y is linear in y: transposable in y
  assert transposable(_sin_times(custom_jvp), 1., 2.)
  softplus = custom_jvp(lambda x: jnp.logaddexp(x, 0.))
  softplus.defjvp(lambda p, t: (softplus(p[0]), jax.nn.sigmoid(p[0]) * t[0]))
  assert not transposable(softplus, 1.)
  report = check_rules(softplus, jnp.array([0.5, -1.5]))
  assert not any(c.startswith("transpose") for c in report.ran)
  # an integer argument has no tangent: sin(x) n is linear in no input
  sin_n = custom_jvp(lambda x, n: jnp.sin(x) * n)
  sin_n.defjvp(lambda p, t: (sin_n(*p), jnp.cos(p[0]) * t[0] * p[1]))
  assert not transposable(sin_n, 1., 2)
  with pytest.raises(NotImplementedError, match="has no transpose rule"):
    jax.linear_transpose(softplus, 1.)(3.)


# --- the compiled program ---------------------------------------------------------

def _optimized_hlo(f, *args):
  """The compiled program's instructions, without names of files, lines and
  the module (which differ between two definitions of one function)."""
  text = jax.jit(f).lower(*args).compile().as_text()
  text = re.sub(r", metadata=\{[^}]*\}", "", text)
  text = re.sub(r", stack_frame_id=\d+", "", text)
  text = re.sub(r"^HloModule \S+", "HloModule m", text, flags=re.M)
  return "\n".join(line for line in text.splitlines()
                   if line.startswith(("HloModule", "%", "ENTRY", "  ", "}")))


def _sin_times(dec):
  @dec
  def f(x, y):
    return jnp.sin(x) * y

  @f.defjvp
  def f_jvp(primals, tangents):
    (x, y), (tx, ty) = primals, tangents
    return f(x, y), jnp.cos(x) * tx * y + jnp.sin(x) * ty
  return f


@pytest.mark.parametrize("which", ["primal", "grad", "vmap"])
def test_compiled_program_equals_jax_decorators(which):
  x = jnp.linspace(0.5, 2., 4)
  pairs = [(norm_with(norm_bwd, jax.custom_vjp), norm_with(norm_bwd), (x,)),
           (_sin_times(jax.custom_jvp), _sin_times(custom_jvp), (x, 2 * x))]
  for jax_f, our_f, args in pairs:
    if which == "grad":
      jax_f, our_f = (jax.grad(lambda *a, f=f: f(*a).sum())
                      for f in (jax_f, our_f))
    elif which == "vmap":
      jax_f, our_f = jax.vmap(jax_f), jax.vmap(our_f)
      args = tuple(jnp.stack([a, a + 1]) for a in args)
    expected = _optimized_hlo(jax_f, *args)
    assert re.search(r"\b(sqrt|sine|rsqrt|multiply)\b", expected)
    assert _optimized_hlo(our_f, *args) == expected


# --- what a call traces, and when -------------------------------------------------

def test_eager_calls_run_the_function_and_traced_calls_bind_once():
  f = norm_with(norm_bwd)
  x = jnp.array([3., 4.])
  assert f(x) == 5.
  jaxpr = jax.make_jaxpr(jax.grad(f))(x).jaxpr
  prims = [e.params["_prim"] for e in jaxpr.eqns if "_prim" in e.params]
  assert [type(p).__name__ for p in prims] == ["CustomVJPCall"]
  # fwd's call of f is this call's own primitive: one instance per signature
  assert repr(prims[0]) == "CustomVJPCall[fun=norm]"


def test_a_mutated_closure_is_read_afresh_on_each_call():
  class Model:
    w = jnp.float32(2.)

  model = Model()

  @custom_vjp
  def f(x):
    return x * model.w
  f.defvjp(lambda x: (f(x), model.w), lambda w, g: (g * w,))
  close(jax.grad(f)(1.), 2.)
  close(jax.jit(f)(1.), 2.)
  model.w = jnp.float32(5.)
  close(jax.grad(f)(1.), 5.)
  close(jax.grad(lambda x: f(x))(1.), 5.)


def test_scan_for_closed_over_tracers():
  found = []

  def probe(y):
    def inner(x):
      return x * y
    part = functools.partial(lambda a, b: a + b, y)

    class Holder:
      def __init__(self):
        self.value = {"k": [y]}

      def method(self, x):
        return x

    def default(x, k=y):
      return x + k
    found.extend([_tracing.may_close_over_tracers(inner),
                  _tracing.may_close_over_tracers(part),
                  _tracing.may_close_over_tracers(Holder().method),
                  _tracing.may_close_over_tracers(default),
                  _tracing.may_close_over_tracers(jnp.sin),
                  _tracing.may_close_over_tracers(lambda x: x * 2.)])
    return y
  jax.jit(probe)(1.)
  assert found == [True, True, True, True, False, False]


# --- what mutation testing found untested -----------------------------------------

@pytest.mark.parametrize("dec", [custom_vjp, custom_jvp])
def test_nondiff_argnames_of_a_partial_asks_for_nondiff_argnums(dec):
  """A partial's signature is opaque (as JAX treats it): its argument names
  cannot be read, and the error says to pass positions instead."""
  f = functools.partial(lambda s, x: s * x, 2.)
  with pytest.raises(TypeError, match=r"nondiff_argnames needs the signature "
                     r"of <lambda>, .*; use nondiff_argnums"):
    dec(f, nondiff_argnames=("x",))


@pytest.mark.parametrize("dec", [custom_vjp, custom_jvp])
def test_a_negative_nondiff_argnum_is_refused(dec):
  with pytest.raises(ValueError, match=r"nondiff_argnums must be "
                     r"non-negative, got \[-1\]"):
    dec(lambda s, x: s * x, nondiff_argnums=(-1,))


@pytest.mark.parametrize("dec", [custom_vjp, custom_jvp])
def test_a_partial_is_decorated_and_differentiated(dec):
  """A ``functools.partial`` (no signature to read) is decorated, called
  and differentiated like a function."""
  f = dec(functools.partial(lambda s, x: jnp.sin(x) * s, 2.))
  if dec is custom_vjp:
    f.defvjp(lambda x: (f(x), x), lambda x, g: (2. * jnp.cos(x) * g,))
  else:
    f.defjvp(lambda p, t: (f(*p), 2. * jnp.cos(p[0]) * t[0]))
  close(f(1.), 2. * jnp.sin(1.))
  close(jax.grad(f)(1.), 2. * jnp.cos(1.))
  close(jax.jit(jax.grad(f))(0.5), 2. * jnp.cos(0.5))


def _keyword_only(x, *, k):
  return x * k


def _only_keywords(*, k):
  return k


@pytest.mark.parametrize("dec", [custom_vjp, custom_jvp])
@pytest.mark.parametrize("fun, args", [(_keyword_only, (1., 2.)),
                                       (_only_keywords, (1.,))])
def test_positional_arguments_for_a_keyword_only_parameter_are_jax_s_error(
    dec, fun, args):
  """Too many positional arguments for a function with a keyword-only
  parameter: JAX's binding error, raised before the function runs."""
  f = dec(fun)
  if dec is custom_vjp:
    f.defvjp(lambda *a, **k: (None, None), lambda r, g: (g,))
  else:
    f.defjvp(lambda p, t: (p, t))
  with pytest.raises(TypeError, match=r"^The input arguments to the "
                     rf"{dec.__name__}-decorated function {fun.__name__} "
                     r"could not be resolved to positional-only arguments"):
    f(*args)


@pytest.mark.parametrize("dec", [custom_vjp, custom_jvp])
def test_a_function_without_a_signature_takes_positions_only(dec):
  """A builtin without a readable signature (``max``) is called with its
  positional arguments as they are; a keyword argument is refused."""
  f = dec(max)
  if dec is custom_vjp:
    f.defvjp(lambda *a: (max(*a), None), lambda r, g: (g, g))
  else:
    f.defjvp(lambda p, t: (max(*p), t[0]))
  assert f(1., 2.) == 2.
  with pytest.raises(TypeError) as info:
    f(1., default=2.)
  message = str(info.value)
  assert message.startswith(f"The input arguments to the {dec.__name__}-"
                            "decorated function max could not be resolved")
  assert "no signature to bind keyword arguments with" in message
  assert message.endswith("pass its arguments by position")


@pytest.mark.parametrize("dec", [custom_vjp, custom_jvp])
def test_a_call_without_its_nondiff_argument_is_refused(dec):
  f = dec(lambda x, *rest: x, nondiff_argnums=(1,))
  if dec is custom_vjp:
    f.defvjp(lambda x, *rest: (x, None), lambda *a: (a[-1],))
  else:
    f.defjvp(lambda *a: (a[-2][0], a[-1][0]))
  with pytest.raises(TypeError, match=r"^<lambda> was called with 1 "
                     r"argument\(s\), but nondiff_argnums names position\(s\) "
                     r"\[1\]"):
    jax.jit(f)(1.)


# --- a rule's call of a decorated function: which running call it reuses ------------

def _jit_grad(f, x):
  return jax.jit(jax.grad(lambda x: jnp.sum(f(x))))(x)


@pytest.mark.parametrize("n, lower", [
    (3, lambda n: n - 1), (3, lambda n: n - 1.0),
    (np.array([3., 0.]), lambda n: n - np.array([1., 0.]))],
    ids=["int", "float for int", "numpy array"])
def test_a_rule_calling_the_function_with_another_static_argument_gets_its_value(
    n, lower):
  """fwd of ``x ** n`` calls the function with ``n - 1`` (an int, a float,
  an array whose comparison has no truth value): a new call, not the
  running one (whose static argument is ``n``)."""
  f = custom_vjp(lambda n, x: x ** jnp.ravel(n)[0], nondiff_argnums=(0,))
  f.defvjp(lambda n, x: (f(n, x), f(lower(n), x)),
           lambda n, x_to_n_minus_1, g: (g * 3 * x_to_n_minus_1,))
  x = jnp.array([0.5, 2.0])
  close(_jit_grad(lambda x: f(n, x), x), 3 * x ** 2)


def test_a_rule_calling_the_function_on_other_types_gets_its_value():
  """fwd calls the function on a float16 copy of ``x``: a new call (the
  running one is for float32)."""
  f = custom_vjp(jnp.sin)
  f.defvjp(lambda x: (f(x), f(x.astype(jnp.float16)).astype(x.dtype) * 0 + x),
           lambda x, g: (g * jnp.cos(x),))
  x = jnp.array([0.5, 2.0])
  close(_jit_grad(f, x), jnp.cos(x))


def test_a_rule_calling_another_decorated_function_gets_its_value():
  """``g``'s fwd calls ``f`` (another decorated function, same argument
  types) for its residual: ``f``'s value, not ``g``'s."""
  f = custom_vjp(jnp.sin)
  f.defvjp(lambda x: (f(x), x), lambda x, g: (g * jnp.cos(x),))
  g = custom_vjp(lambda x: jnp.sin(x) ** 2)
  g.defvjp(lambda x: (g(x), (f(x), jnp.cos(x))),
           lambda res, ct: (ct * 2 * res[0] * res[1],))
  x = jnp.array([0.5, 2.0])
  close(_jit_grad(g, x), 2 * jnp.sin(x) * jnp.cos(x))


def test_a_rule_calling_a_function_that_closes_over_a_traced_value_traces_it_once():
  """``fun`` closes over ``y`` (traced by ``jit``), so its call is not kept;
  ``fwd`` calls ``f`` itself: that call is the running one (``fun`` traced
  once, not again for each call of ``f`` inside a rule being traced)."""
  traced = []
  x = jnp.array([0.5, 2.0])

  def outer(y):
    def fun(x):
      traced.append(None)
      return jnp.sin(x) * y
    f = custom_vjp(fun)
    f.defvjp(lambda x: (f(x), x), lambda x, g: (g * jnp.cos(x) * y,))
    return jax.grad(lambda x: jnp.sum(f(x)))(x)
  close(jax.jit(outer)(2.), 2. * jnp.cos(x))
  assert len(traced) == 1


def test_a_rule_calling_the_function_with_an_equal_or_another_static_argument():
  """``fun`` closes over a traced ``y`` (no call is kept); ``fwd`` calls
  ``f`` with an equal new static tuple (the running call) and with a float
  one lower (a call of its own): the gradient of ``x ** 3 * y``, and ``fun``
  traced a bounded number of times (a call of another static argument is
  traced anew at each tracing of the rule that makes it)."""
  traced = []
  x = jnp.array([0.5, 2.0])

  def outer(y):
    def fun(n, x):
      traced.append(n)
      return x ** n[0] * y
    f = custom_vjp(fun, nondiff_argnums=(0,))

    def fwd(n, x):
      lower = f((n[0] - 1.0,), x) if n[0] > 1 else jnp.ones_like(x)
      return f((n[0],), x), lower
    f.defvjp(fwd, lambda n, lower, g: (g * n[0] * lower,))
    return jax.grad(lambda x: jnp.sum(f((3,), x)))(x)
  close(jax.jit(outer)(2.), 3. * x ** 2 * 2.)
  assert set(traced) == {(3,), (2.0,), (1.0,)} and len(traced) <= 7
