"""Property tests: random stacks of transformations applied to the zoo's hijax
primitives agree with the same stacks applied to their plain-JAX equivalents.

Each example draws a zoo primitive, an input, a stack of one to three
transformations (jit, grad, vjp, jvp, linearize, vmap, checkpoint, a scan
wrapper) and whether ``jax_remat3`` is on, and compares the two results in
float64 to 1e-5 relative. A transformation is drawn only when the primitive has
the rules it needs; without ``jax_remat3``, differentiating a checkpointed
primitive in reverse mode also needs its `jvp` rule.

The runs are derandomized and bounded (about 1 minute of CPU time); set
HIJAX_PROPERTY_EXAMPLES to run more examples.
"""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from jax._src import config as jax_config

from hijax.testing import check_rules

import zoo

EXAMPLES = int(os.environ.get("HIJAX_PROPERTY_EXAMPLES", "150"))


def _bounded(n):
  return settings(max_examples=n, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow,
                                         HealthCheck.filter_too_much],
                  print_blob=True)


# --- the transformations, each taking a function of one array to another ----------------

def _weights(shape, dtype):
  n = int(np.prod(shape))
  return jnp.cos(jnp.arange(n, dtype=dtype) + 0.5).reshape(shape)


def _direction(x):
  return jnp.sin(jnp.arange(x.size, dtype=x.dtype) + 1.0).reshape(x.shape)


def t_jit(f):
  return jax.jit(f)


def t_checkpoint(f):
  # a fresh function each time: JAX 0.11 caches checkpoint's trace by the
  # function without the jax_remat3 setting
  return jax.checkpoint(lambda x: f(x))


def t_grad(f):
  def g(x):
    def loss(x):
      y = f(x)
      return jnp.sum(y * _weights(y.shape, y.dtype))
    return jax.grad(loss)(x)
  return g


def t_vjp(f):
  def g(x):
    y, f_vjp = jax.vjp(f, x)
    return f_vjp(_weights(y.shape, y.dtype))[0]
  return g


def t_jvp(f):
  def g(x):
    y, y_dot = jax.jvp(f, (x,), (_direction(x),))
    return y_dot + 0.5 * y
  return g


def t_linearize(f):
  def g(x):
    y, f_lin = jax.linearize(f, x)
    return f_lin(_direction(x)) - 0.5 * y
  return g


def t_vmap(f):
  def g(x):
    return jax.vmap(f)(jnp.stack([x, 0.75 * x + 0.1]))
  return g


def t_scan(f):
  """Runs f in a two-step scan whose carry depends on f."""
  def g(x):
    y = jax.eval_shape(f, x)

    def body(c, xi):
      c = 0.5 * c + f(xi)
      return c, c
    return jax.lax.scan(body, jnp.zeros(y.shape, y.dtype),
                        jnp.stack([x, 0.9 * x]))[1]
  return g


TRANSFORMS = dict(jit=t_jit, checkpoint=t_checkpoint, grad=t_grad, vjp=t_vjp,
                  jvp=t_jvp, linearize=t_linearize, vmap=t_vmap, scan=t_scan)
NEEDS = dict(grad="vjp", vjp="vjp", jvp="jvp", linearize="lin", vmap="vmap")


# --- the zoo entries as functions of one vector ------------------------------------------

ADAPTERS = {
    "sin_times_y": lambda g: lambda x: g(x, 0.5 * x[::-1] + 1.0),
    "matvec": lambda g: lambda x: g(jnp.stack([x, 0.1 * x ** 2]), x),
    "scale": lambda g: lambda x: g(x[0], x),
    "fpt": lambda g: lambda x: _concat_fpt(g(zoo.Point(x, 0.5 * x + 0.2))),
    "gather": lambda g: lambda x: g(x, jnp.int32(2)),
    "argmax_max": lambda g: lambda x: _stack_argmax_max(*g(x)),
}


def _concat_fpt(d):
  return jnp.concatenate([d["a"], d["b"][0], d["b"][1]])


def _stack_argmax_max(i, m):
  return jnp.stack([m, i.astype(m.dtype)])


def unary(entry):
  """(hijax version, plain version), as functions of one array."""
  adapt = ADAPTERS.get(entry.name, lambda g: g)
  return adapt(entry.fn), adapt(entry.plain)


def supported(entry, stack, remat3) -> bool:
  """Whether entry's rules support the stack (innermost transformation first)."""
  if any(t in NEEDS and NEEDS[t] not in entry.transforms for t in stack):
    return False
  if not remat3 and "jvp" not in entry.transforms and "checkpoint" in stack:
    # reverse mode through classic remat differentiates with jvp rules
    first = stack.index("checkpoint")
    return not any(t in ("grad", "vjp") for t in stack[first + 1:])
  return True


def _allowed(entry):
  return [t for t in TRANSFORMS if t not in NEEDS or NEEDS[t] in entry.transforms]


@st.composite
def cases(draw):
  entry = draw(st.sampled_from(zoo.ENTRIES))
  remat3 = draw(st.booleans())
  stack = []
  for _ in range(draw(st.integers(1, 3))):
    stack.append(draw(st.sampled_from(
        [t for t in _allowed(entry) if supported(entry, stack + [t], remat3)])))
  shape = draw(st.sampled_from([(), (3,), (2, 3)])) if entry.elementwise else (4,)
  size = int(np.prod(shape))
  lo, hi = entry.domain
  values = draw(st.lists(st.floats(lo, hi, allow_nan=False, width=64),
                         min_size=size, max_size=size, unique=True))
  return entry, stack, remat3, np.array(values, np.float64).reshape(shape)


def _apply(stack, f):
  for name in stack:
    f = TRANSFORMS[name](f)
  return f


@_bounded(EXAMPLES)
@given(cases())
def test_transformation_stacks_match_plain_jax(case):
  entry, stack, remat3, x = case
  event(f"entry {entry.name}")
  event(f"depth {len(stack)}")
  for name in set(stack):
    event(f"uses {name}")
  hi, plain = unary(entry)
  with jax.enable_x64(True), jax_config.remat3(remat3):
    got = _apply(stack, hi)(jnp.asarray(x))
    want = _apply(stack, plain)(jnp.asarray(x))
  np.testing.assert_allclose(
      got, want, rtol=1e-5, atol=1e-8,
      err_msg=f"{entry.name} under {' -> '.join(stack)} (remat3={remat3})")


def test_every_transformation_is_drawn_for_every_entry_that_supports_it():
  """The filter leaves every transformation reachable for each entry."""
  for entry in zoo.ENTRIES:
    for remat3 in (False, True):
      for t in _allowed(entry):
        assert supported(entry, [t], remat3), (entry.name, t)
  assert supported(zoo.BY_NAME["cube_sres"], ["checkpoint", "grad"], True)
  assert not supported(zoo.BY_NAME["cube_sres"], ["checkpoint", "grad"], False)


@pytest.mark.parametrize("name", ["cube_sres", "newton_sqrt"])
def test_reverse_mode_through_checkpoint_needs_jvp_without_remat3(name):
  hi, plain = unary(zoo.BY_NAME[name])
  x = jnp.array([0.7, 1.3, 2.1])
  with pytest.raises(NotImplementedError, match="no forward-mode rule"):
    _apply(["checkpoint", "grad"], hi)(x)
  with jax_config.remat3(True):
    np.testing.assert_allclose(_apply(["checkpoint", "grad"], hi)(x),
                               _apply(["checkpoint", "grad"], plain)(x),
                               rtol=1e-5)


# --- check_rules itself, at random points -------------------------------------------------

CHEAP = [e for e in zoo.ENTRIES
         if e.name in ("log1pexp", "sin_derived", "cube_lin", "tanh", "fpt",
                       "sin_times_y")]


@st.composite
def points(draw):
  entry = draw(st.sampled_from(CHEAP))
  args = entry.args()
  lo, hi = entry.domain

  def draw_like(x):
    x = np.asarray(x)
    vals = draw(st.lists(st.floats(lo, hi, allow_nan=False, width=32),
                         min_size=x.size, max_size=x.size))
    return jnp.asarray(np.array(vals, np.float32).reshape(x.shape))
  return entry, jax.tree.map(draw_like, args)


@_bounded(max(EXAMPLES // 15, 1))
@given(points())
def test_check_rules_passes_the_zoo_at_random_points(point):
  entry, args = point
  report = check_rules(entry.fn, *args, modes=[
      m for m in ("jvp", "vjp", "lin") if m in entry.transforms])
  assert report.passed
