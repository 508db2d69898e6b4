"""What `hijax.custom_vjp` and `hijax.custom_jvp` add to JAX's decorators,
each under jit, vmap, scan, checkpoint and second order: forward mode from
the backward rule, closed-over traced values, and vmap by the rules or by a
`defbatch` rule. Values are checked against closed forms and plain JAX.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hijax
from hijax import custom_jvp, custom_vjp


def close(a, b, rtol=1e-5, atol=1e-6):
  jax.tree.map(lambda a, b: np.testing.assert_allclose(
      np.asarray(a), np.asarray(b), rtol=rtol, atol=atol), a, b)


@custom_vjp
def safe_norm(x):
  return jnp.sqrt(jnp.sum(x ** 2))


def _safe_norm_fwd(x):
  n = safe_norm(x)  # fwd calls the function itself: JAX's classic failure
  return n, (x, n)


def _safe_norm_bwd(res, g):
  x, n = res
  return (g * jnp.where(n == 0., 0., x / jnp.where(n == 0., 1., n)),)


safe_norm.defvjp(_safe_norm_fwd, _safe_norm_bwd)
X = jnp.array([0.5, -1.5, 2.0])


def scan_loop(f):
  def loop(x):
    return jax.lax.scan(lambda c, _: (c * f(c), None), x, None, length=2)[0]
  return loop


# --- forward mode from the backward rule ------------------------------------

def test_forward_mode_values():
  n = np.linalg.norm(X)
  close(jax.jvp(safe_norm, (X,), (jnp.ones(3),)),
        (n, np.sum(X) / n))
  close(jax.jacfwd(safe_norm)(X), X / n)
  close(jax.linearize(safe_norm, X)[1](jnp.ones(3)), np.sum(X) / n)
  close(jax.hessian(safe_norm)(X), jax.hessian(jnp.linalg.norm)(X))


def test_forward_mode_of_a_logged_function_twice():
  """With logs, forward mode is the equation whose transpose runs bwd; its
  own forward mode (jvp of jvp, jacfwd of jacfwd) gives the second
  derivative."""
  f = custom_vjp(jnp.sin)
  f.defvjp_with_logs(lambda x: (jnp.sin(x), jnp.cos(x)),
                     lambda c, g: ((c * g,), None))
  close(jax.jvp(lambda x: jax.jvp(f, (x,), (1.,))[1], (1.,), (1.,)),
        (np.cos(1.), -np.sin(1.)))
  close(jax.jit(jax.jacfwd(jax.jacfwd(f)))(1.), -np.sin(1.))


@pytest.mark.parametrize("transform", [
    "jit", "vmap", "scan", "checkpoint", "second_order"])
def test_forward_mode_under(transform):
  norm = jnp.linalg.norm
  if transform == "jit":
    close(jax.jit(jax.jacfwd(safe_norm))(X), jax.jacrev(norm)(X))
    close(jax.jit(jax.hessian(safe_norm))(X), jax.hessian(norm)(X))
  elif transform == "vmap":
    xs = jnp.stack([X, 2 * X, -X])
    close(jax.vmap(jax.jacfwd(safe_norm))(xs), jax.vmap(jax.grad(norm))(xs))
    close(jax.jacfwd(lambda xs: jax.vmap(safe_norm)(xs))(xs),
          jax.jacrev(lambda xs: jax.vmap(norm)(xs))(xs))
  elif transform == "scan":
    close(jax.jacfwd(scan_loop(safe_norm))(X), jax.jacrev(scan_loop(norm))(X))
    close(jax.hessian(lambda x: scan_loop(safe_norm)(x).sum())(X),
          jax.hessian(lambda x: scan_loop(norm)(x).sum())(X), rtol=1e-4)
  elif transform == "checkpoint":
    f = jax.checkpoint(lambda x: safe_norm(jnp.sin(x)))
    g = lambda x: norm(jnp.sin(x))
    close(jax.jacfwd(f)(X), jax.grad(g)(X))
    close(jax.hessian(f)(X), jax.hessian(g)(X))
  else:
    close(jax.jacfwd(jax.jacfwd(safe_norm))(X), jax.hessian(norm)(X))
    close(jax.jacrev(jax.jacfwd(safe_norm))(X), jax.hessian(norm)(X))
    close(jax.jacfwd(jax.jacrev(safe_norm))(X), jax.hessian(norm)(X))
    third = jax.jacfwd(jax.hessian(safe_norm))(X)
    close(third, jax.jacfwd(jax.hessian(norm))(X), rtol=1e-4)


def test_forward_mode_keeps_the_safe_rule_at_the_singularity():
  zero = jnp.zeros(3)
  assert np.isnan(jax.jacfwd(jnp.linalg.norm)(zero)).all()
  close(jax.jacfwd(safe_norm)(zero), zero)
  close(jax.hessian(safe_norm)(zero), jnp.zeros((3, 3)))


def test_forward_mode_of_pytrees_and_several_arguments():
  @custom_vjp
  def f(p, y):
    return {"s": p["a"] * jnp.sin(y), "c": p["b"] * y}

  def fwd(p, y):
    return f(p, y), (p, y)

  def bwd(res, g):
    p, y = res
    return ({"a": g["s"] * jnp.sin(y), "b": g["c"] * y},
            g["s"] * p["a"] * jnp.cos(y) + g["c"] * p["b"])
  f.defvjp(fwd, bwd)

  def ref(p, y):
    return {"s": p["a"] * jnp.sin(y), "c": p["b"] * y}
  args = ({"a": 2., "b": 3.}, 0.7)
  tangents = ({"a": 0.5, "b": -1.}, 2.)
  close(jax.jvp(f, args, tangents), jax.jvp(ref, args, tangents))
  close(jax.jacfwd(f, (0, 1))(*args), jax.jacrev(ref, (0, 1))(*args))


def _clip_gradient():
  """The identity, whose backward rule clips the cotangent to [-1, 1]: not
  linear in g."""
  @custom_vjp
  def clip_gradient(x):
    return x

  def clip_bwd(_, g):
    return (jnp.clip(g, -1., 1.),)
  clip_gradient.defvjp(lambda x: (x, None), clip_bwd)
  return clip_gradient


def test_forward_mode_of_a_rule_that_is_not_linear_in_g_is_refused():
  clip_gradient = _clip_gradient()
  close(jax.grad(lambda x: 3. * clip_gradient(x))(2.), 1.)
  with pytest.raises(TypeError) as e:
    jax.jvp(clip_gradient, (2.,), (1.,))
  message = str(e.value)
  assert "hijax.custom_vjp function clip_gradient" in message
  assert "the bwd rule clip_bwd is not linear in the cotangent g" in message
  assert "clip" in message and "hijax.custom_jvp" in message


def test_forward_mode_of_a_rule_not_linear_in_g_is_refused_when_evaluated():
  """Reverse mode through a forward-mode pass (JAX's default checkpoint, a
  linearize later transposed) works; a forward-mode value raises, as JAX's
  decorator raises for any custom_vjp function."""
  clip_gradient = _clip_gradient()
  for fwd_mode in (lambda: jax.jvp(clip_gradient, (2.,), (1.,)),
                   lambda: jax.jit(lambda t: jax.jvp(clip_gradient, (2.,),
                                                     (t,))[1])(1.),
                   lambda: jax.linearize(clip_gradient, 2.)[1](1.),
                   lambda: jax.vmap(lambda t: jax.jvp(clip_gradient, (2.,),
                                                      (t,))[1])(jnp.ones(2))):
    with pytest.raises(TypeError, match="clip_bwd is not linear in the "
                       "cotangent g"):
      fwd_mode()
  lin = jax.linearize(lambda x: 3. * clip_gradient(x), 2.)[1]
  close(jax.linear_transpose(lin, 1.)(1.), (1.,))
  # forward over reverse never needs the forward mode of bwd here: fwd does
  # not call the function, so the gradient, clip(1) = 1, is differentiated
  close(jax.hessian(clip_gradient)(2.), 0.)


def test_forward_mode_with_symbolic_zeros_and_a_nondiff_argument():
  @functools.partial(custom_vjp, nondiff_argnums=(0,))
  def scaled(k, x, y):
    return k * x * y

  def fwd(k, x, y):
    return scaled(k, x.value, y.value), (x.value, y.value)

  def bwd(k, res, g):
    x, y = res
    return k * g * y, k * g * x
  scaled.defvjp(fwd, bwd, symbolic_zeros=True)
  close(jax.jvp(lambda x: scaled(3., x, 2.), (1.5,), (1.,)), (9., 6.))
  close(jax.hessian(lambda x, y: scaled(3., x, y), (0, 1))(1.5, 2.),
        ((0., 3.), (3., 0.)))


# --- closed-over traced values ---------------------------------------------------

def closing_vjp(w, x):
  """sin(w x), with w read from the enclosing function by fun, fwd and bwd."""
  @custom_vjp
  def f(x):
    return jnp.sin(w * x)

  def fwd(x):
    return f(x), jnp.cos(w * x)

  def bwd(c, g):
    return (g * c * w,)
  f.defvjp(fwd, bwd)
  return f(x)


def closing_jvp(w, x):
  @custom_jvp
  def f(x):
    return jnp.sin(w * x)

  @f.defjvp
  def f_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return f(x), jnp.cos(w * x) * w * t
  return f(x)


def plain(w, x):
  return jnp.sin(w * x)


@pytest.mark.parametrize("closing", [closing_vjp, closing_jvp],
                         ids=["custom_vjp", "custom_jvp"])
@pytest.mark.parametrize("transform", [
    "grad", "jit", "vmap", "scan", "checkpoint", "second_order"])
def test_closure_over_a_differentiated_value(closing, transform):
  w, x = 1.3, 0.7
  if transform == "grad":
    close(jax.grad(closing, (0, 1))(w, x), jax.grad(plain, (0, 1))(w, x))
    close(jax.jvp(lambda w: closing(w, x), (w,), (1.,)),
          jax.jvp(lambda w: plain(w, x), (w,), (1.,)))
  elif transform == "jit":  # the rules run after the jit trace has ended
    close(jax.grad(jax.jit(closing), (0, 1))(w, x),
          jax.grad(plain, (0, 1))(w, x))
    close(jax.jit(jax.grad(closing))(w, x), jax.grad(plain)(w, x))
  elif transform == "vmap":  # reverse mode outside the vmap over w
    ws = jnp.array([0.5, 1.3, -2.])
    for argnums in (0, 1):
      close(jax.grad(lambda ws, x: jax.vmap(closing, (0, None))(ws, x).sum(),
                     argnums)(ws, x),
            jax.grad(lambda ws, x: jax.vmap(plain, (0, None))(ws, x).sum(),
                     argnums)(ws, x))
    close(jax.vmap(jax.grad(closing), (0, None))(ws, x),
          jax.vmap(jax.grad(plain), (0, None))(ws, x))
  elif transform == "scan":
    def loop(f):
      return lambda w, x: jax.lax.scan(
          lambda c, _: (f(w, c), None), x, None, length=3)[0]
    close(jax.grad(loop(closing), (0, 1))(w, x),
          jax.grad(loop(plain), (0, 1))(w, x))
  elif transform == "checkpoint":
    close(jax.grad(jax.checkpoint(closing), (0, 1))(w, x),
          jax.grad(plain, (0, 1))(w, x))
  else:
    close(jax.hessian(closing, (0, 1))(w, x), jax.hessian(plain, (0, 1))(w, x))
    close(jax.jacrev(jax.grad(closing))(w, x), jax.hessian(plain)(w, x))


def test_closure_with_symbolic_zeros_traces_the_rules_without_zeros():
  seen = []

  def model(w, x, y):
    @custom_vjp
    def f(x, y):
      return w * x * y, w * x

    def fwd(x, y):
      seen.append(("fwd", x.perturbed, y.perturbed))
      return f(x.value, y.value), (x.value, y.value)

    def bwd(res, g):
      x, y = res
      seen.append(("bwd", *(type(t).__name__ for t in g)))
      g_mul, g_lin = g
      return w * (g_mul * y + g_lin), w * g_mul * x
    f.defvjp(fwd, bwd, symbolic_zeros=True)
    return f(x, y)[0]
  plain = lambda w, x, y: w * x * y
  close(jax.grad(model, (0, 1))(2., 3., 4.), jax.grad(plain, (0, 1))(2., 3., 4.))
  # traced once, at the call, with every input perturbed and every
  # cotangent an array (g_lin is zero here, yet not a SymbolicZero)
  assert ("fwd", True, True) in seen
  assert all(kind != "SymbolicZero" for entry in seen if entry[0] == "bwd"
             for kind in entry[1:])


def test_closure_used_by_the_backward_rule_only():
  """A gradient scaled by a traced value, with reverse mode outside vmap."""
  def scale_gradient(s, x):
    @custom_vjp
    def f(x):
      return x
    f.defvjp(lambda x: (x, None), lambda _, g: (g * s,))
    return f(x)
  ss = jnp.array([0.5, 2., 3.])
  close(jax.grad(lambda x: jax.vmap(scale_gradient, (0, None))(ss, x).sum())(
      1.), 5.5)
  close(jax.vmap(jax.grad(scale_gradient, 1), (0, None))(ss, 1.), ss)
  close(jax.grad(jax.jit(scale_gradient), 1)(4., 1.), 4.)
  # the value does not depend on s; the gradient does, linearly
  close(jax.grad(lambda s: jax.grad(scale_gradient, 1)(s, 1.))(3.), 1.)
  close(jax.grad(scale_gradient)(3., 1.), 0.)


def test_closure_with_residuals_unlike_the_output():
  """Rules closing over a traced value are traced once, bwd with the types
  of fwd's residuals (a vector here, where the output is a scalar)."""
  def grad_at(c):
    @custom_vjp
    def f(x):
      return jnp.sum(x * c)
    f.defvjp(lambda x: (f(x), x), lambda x, g: (g * c * jnp.ones_like(x),))
    return jax.grad(f)(jnp.arange(3.))
  close(jax.jit(grad_at)(2.), 2. * jnp.ones(3))


def test_closure_that_cannot_be_differentiated_says_what_to_do():
  def solve(w, x):
    @custom_vjp
    def f(x):
      return jax.lax.while_loop(lambda c: c[1] < 3, lambda c: (c[0] * w, c[1] + 1),
                                (x, 0))[0]
    f.defvjp(lambda x: (f(x), None), lambda _, g: (g * w ** 3,))
    return f(x)
  close(jax.grad(solve, 1)(2., 1.), 8.)  # the rule: fine
  with pytest.raises(Exception) as e:
    jax.grad(solve)(2., 1.)  # d/dw would go through the while_loop
  message = str(e.value)
  assert "hijax.custom_vjp function f closes over traced values" in message
  assert "Pass them as arguments" in message


# --- vmap: the rules' own batching, and defbatch ----------------------------------

def test_vmap_by_the_rules_and_reverse_mode_of_it():
  xs = jnp.stack([X, 2 * X, -X])
  norms = jnp.linalg.norm(xs, axis=1)
  close(jax.vmap(safe_norm)(xs), norms)
  close(jax.grad(lambda xs: jax.vmap(safe_norm)(xs).sum())(xs),
        xs / norms[:, None])
  close(jax.vmap(jax.grad(safe_norm))(xs), xs / norms[:, None])
  close(jax.vmap(safe_norm, in_axes=1)(xs.T), norms)


def _callback_sin(x):
  return jax.pure_callback(lambda v: np.sin(v).astype(v.dtype),
                           jax.ShapeDtypeStruct(x.shape, x.dtype), x)


def batched_sin():
  """sin, whose batch rule computes through a callback: no derivatives."""
  calls = []

  @custom_vjp
  def f(x):
    return jnp.sin(x)
  f.defvjp(lambda x: (f(x), jnp.cos(x)), lambda c, g: (c * g,))

  @f.defbatch
  def f_batch(axis_size, in_batched, x):
    calls.append((axis_size, in_batched))
    return _callback_sin(x), True
  return f, calls


def _has_batched_by_rule(jaxpr):
  return any(isinstance(e.params.get("_prim"), hijax._decorators._batching.
                        BatchedByRule) for e in jaxpr.eqns)


@pytest.mark.parametrize("transform", [
    "vmap", "jit", "scan", "checkpoint", "second_order"])
def test_defbatch_rule_with_derivatives_from_the_rules(transform):
  f, calls = batched_sin()
  xs = jnp.array([0.3, -1.2, 2.0])
  if transform == "vmap":
    close(jax.vmap(f)(xs), jnp.sin(xs))
    assert calls == [(3, [True])]
    assert _has_batched_by_rule(jax.make_jaxpr(jax.vmap(f))(xs).jaxpr)
    close(jax.grad(lambda xs: jax.vmap(f)(xs).sum())(xs), jnp.cos(xs))
    close(jax.vmap(jax.grad(f))(xs), jnp.cos(xs))
    close(jax.jvp(jax.vmap(f), (xs,), (jnp.ones(3),))[1], jnp.cos(xs))
  elif transform == "jit":
    close(jax.jit(jax.vmap(f))(xs), jnp.sin(xs))
    close(jax.jit(jax.grad(lambda xs: jax.vmap(f)(xs).sum()))(xs), jnp.cos(xs))
  elif transform == "scan":
    def loop(xs):
      return jax.lax.scan(lambda c, _: (jax.vmap(f)(c), None), xs, None,
                          length=2)[0]
    close(loop(xs), jnp.sin(jnp.sin(xs)))
    close(jax.grad(lambda xs: loop(xs).sum())(xs),
          jnp.cos(jnp.sin(xs)) * jnp.cos(xs))
  elif transform == "checkpoint":
    g = jax.checkpoint(lambda xs: jax.vmap(f)(xs).sum())
    close(jax.grad(g)(xs), jnp.cos(xs))
  else:
    close(jax.hessian(lambda xs: jax.vmap(f)(xs).sum())(xs),
          jnp.diag(-jnp.sin(xs)))
    close(jax.vmap(jax.grad(jax.grad(f)))(xs), -jnp.sin(xs))
  assert calls, "the batch rule was used"


def test_defbatch_flags_per_output_linearized_and_vmapped_twice():
  """out_batched as a tuple of flags (an unbatched output broadcast by
  vmap); the batched call linearized with the jvp rule, and vmapped again
  (the rule then runs on the inner batch)."""
  @custom_jvp
  def g(x, c):
    return jnp.sin(x) * c, 2. * c
  g.defjvp(lambda p, t: (g(*p), (jnp.cos(p[0]) * p[1] * t[0]
                                 + jnp.sin(p[0]) * t[1], 2. * t[1])))
  seen = []

  @g.defbatch
  def g_batch(axis_size, in_batched, x, c):
    seen.append(in_batched)
    return (jnp.sin(x) * c, 2. * c), (True, False)
  xs = jnp.array([0.3, -1.2, 2.0])
  vg = jax.vmap(g, (0, None))
  close(vg(xs, 1.5), (jnp.sin(xs) * 1.5, jnp.full(3, 3.)))
  assert seen == [[True, False]]
  out, linear = jax.linearize(lambda xs: vg(xs, 1.5), xs)
  close((out, linear(jnp.arange(3.))),
        (vg(xs, 1.5), (1.5 * jnp.cos(xs) * jnp.arange(3.), jnp.zeros(3))))
  x2 = jnp.stack([xs, -xs])
  close(jax.vmap(vg, (0, None))(x2, 1.5),
        (jnp.sin(x2) * 1.5, jnp.full((2, 3), 3.)))


def test_defbatch_sees_which_arguments_are_batched():
  seen = []

  @functools.partial(custom_jvp, nondiff_argnums=(0,))
  def f(k, x, y):
    return k * x * y

  @f.defjvp
  def f_jvp(k, primals, tangents):
    (x, y), (tx, ty) = primals, tangents
    return f(k, x, y), k * (tx * y + x * ty)

  @f.defbatch
  def f_batch(axis_size, in_batched, k, x, y):
    seen.append(in_batched)
    return k * x * y, in_batched[1] or in_batched[2]
  close(jax.vmap(f, (None, 0, None))(2., jnp.arange(3.), 5.),
        10. * jnp.arange(3.))
  assert seen[-1] == [False, True, False]
  close(jax.vmap(f, (None, None, 0))(2., 3., jnp.ones(2)), [6., 6.])
  assert seen[-1] == [False, False, True]
  close(jax.grad(lambda y: jax.vmap(f, (None, 0, None))(
      2., jnp.arange(3.), y).sum())(5.), 6.)


def test_defbatch_is_not_used_for_a_batched_closed_over_value():
  def g(w, x):
    @custom_vjp
    def f(x):
      return jnp.sin(w * x)
    f.defvjp(lambda x: (f(x), jnp.cos(w * x) * w), lambda c, g: (c * g,))

    @f.defbatch
    def f_batch(axis_size, in_batched, x):
      raise AssertionError("the rule cannot see the batched w")
    return f(x)
  ws = jnp.array([0.5, 1.5])
  close(jax.vmap(g, (0, None))(ws, 0.7), jnp.sin(ws * 0.7))
  close(jax.grad(lambda x: jax.vmap(g, (0, None))(ws, x).sum())(0.7),
        jnp.sum(ws * jnp.cos(ws * 0.7)))


def test_defbatch_reading_a_traced_value_the_function_does_not():
  """A batch rule reading a traced c that the function does not read: vmap
  batches the function instead (its value and gradient, under jit); a rule
  reading only what the function reads is used."""
  def g(c, xs, fun_reads_c):
    @custom_vjp
    def f(x):
      return jnp.sin(x) + (0. * c if fun_reads_c else 0.)
    f.defvjp(lambda x: (f(x), jnp.cos(x)), lambda r, g: (r * g,))
    f.defbatch(lambda axis_size, in_batched, x: (jnp.sin(x) + 0. * c, True))
    return jax.vmap(f)(xs)
  xs, c = jnp.array([0.3, -1.2]), 2.
  for reads in (True, False):
    h = functools.partial(g, fun_reads_c=reads)
    jaxpr = jax.make_jaxpr(h)(c, xs)
    assert _has_batched_by_rule(jaxpr) == reads
    assert ("BatchedByRule[fun=f]" in str(jaxpr)) == reads
    close(jax.jit(h)(c, xs), jnp.sin(xs))
    close(jax.jit(jax.grad(lambda xs: h(c, xs).sum(), 0))(xs), jnp.cos(xs))


def test_defbatch_returns_the_rule_and_def_methods_forward():
  f = custom_vjp(jnp.sin)

  def rule(axis_size, in_batched, x):
    return jnp.sin(x), True
  assert f.defbatch(rule) is rule
  inner = jax.custom_batching.custom_vmap(jnp.cos)
  outer = custom_jvp(inner)
  assert outer.def_vmap == inner.def_vmap
  # any other name is the decorator's own missing attribute, not the inner one's
  with pytest.raises(AttributeError,
                     match="^'custom_jvp' object has no attribute 'not_a_method'$"):
    outer.not_a_method  # noqa: B018
