"""A zoo of correct hijax primitives, each with a plain-JAX equivalent.

Between them they cover every kind of rule (`jvp`, `vjp_fwd` with
`vjp_bwd_retval` or `vjp_bwd`, structured residuals, `lin`/`linearized`, the
derived rules, `transpose`, `batch`, `batch_dim_rule`), pytree inputs and
outputs, integer inputs and outputs, and rules that bind primitives again.

`ENTRIES` lists them for tests: each `ZooEntry` has the wrapper that applies the
primitive, the plain-JAX function it must agree with, example arguments and
which transformations it supports.
"""
from __future__ import annotations

import dataclasses
import functools
from collections import namedtuple
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.lax import while_loop

from hijax import (HiPrim, NullAccum, ShapedArray, Zero, instantiate_zeros,
                   jvp_from_lin, linearize_from_jvp, vjp_from_jvp, vjp_from_lin)

from unary_prim import UnaryPrim


def inst(t):
  """A tangent or cotangent as an array (symbolic zeros instantiated)."""
  return instantiate_zeros(t) if isinstance(t, Zero) else t


def is_zero(t):
  return t is None or isinstance(t, Zero)


def first_dim(*dims):
  """The first batch dimension that is not None (an elementwise output's)."""
  return next((d for d in dims if d is not None), None)


def _typeof(tree):
  return jax.tree.map(jax.typeof, tree)


class Unary(UnaryPrim):
  """Base for elementwise primitives of one array (they batch elementwise)."""

  def batch_dim_rule(self, axis_data, in_dims):
    return in_dims[0]


# --- hand-written jvp and vjp, batch_dim_rule -------------------------------------------

class Log1pExp(Unary):
  """log(1 + e^x), with the stable derivative 1 - 1 / (1 + e^x)."""

  def expand(self, x):
    return jnp.log1p(jnp.exp(x))

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), (1 - 1 / (1 + jnp.exp(x))) * t

  def vjp_fwd(self, nzs_in, x):
    return self(x), x

  def vjp_bwd_retval(self, x, g):
    return ((1 - 1 / (1 + jnp.exp(x))) * g,)


def log1pexp(x):
  return Log1pExp(jax.typeof(x))(x)


class SinTimesY(HiPrim):
  """sin(x) * y; the rules skip the work for inputs not differentiated."""

  def __init__(self, x_aval, y_aval):
    self.in_avals = (x_aval, y_aval)
    self.out_aval = x_aval
    self.params = {}
    super().__init__()

  def expand(self, x, y):
    return jnp.sin(x) * y

  def jvp(self, primals, tangents):
    (x, y), (x_dot, y_dot) = primals, tangents
    t = jnp.zeros_like(x)
    if not is_zero(x_dot):
      t = t + jnp.cos(x) * x_dot * y
    if not is_zero(y_dot):
      t = t + jnp.sin(x) * y_dot
    return self(x, y), t

  def vjp_fwd(self, nzs_in, x, y):
    x_nz, y_nz = nzs_in
    return self(x, y), (x, y if x_nz else None, y_nz)

  def vjp_bwd_retval(self, res, g):
    x, y, y_nz = res
    return (None if y is None else jnp.cos(x) * y * g,
            jnp.sin(x) * g if y_nz else None)

  def batch_dim_rule(self, axis_data, in_dims):
    return first_dim(*in_dims)


def sin_times_y(x, y):
  return SinTimesY(jax.typeof(x), jax.typeof(y))(x, y)


# --- derived rules ------------------------------------------------------------------------

class SinDerived(Unary):
  """sin, with a hand-written jvp and everything else derived from it."""

  def expand(self, x):
    return jnp.sin(x)

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), jnp.cos(x) * t

  lin, linearized = linearize_from_jvp
  vjp_fwd, vjp_bwd_retval = vjp_from_lin


def sin_derived(x):
  return SinDerived(jax.typeof(x))(x)


class CubeLin(Unary):
  """x ** 3, with hand-written lin/linearized; jvp and vjp derived."""

  def expand(self, x):
    return x ** 3

  def lin(self, nzs_in, x):
    return self(x), 3 * x ** 2

  def linearized(self, slope, t):
    return slope * t

  jvp = jvp_from_lin
  vjp_fwd, vjp_bwd_retval = vjp_from_jvp


def cube_lin(x):
  return CubeLin(jax.typeof(x))(x)


# --- linear in some inputs: transpose; a full batch rule ----------------------------------

class MatVec(HiPrim):
  """A @ x: bilinear, with a transpose rule and a hand-written batch rule."""

  def __init__(self, A_aval, x_aval):
    self.in_avals = (A_aval, x_aval)
    self.out_aval = ShapedArray((A_aval.shape[0],), A_aval.dtype)
    self.params = {}
    super().__init__()

  def expand(self, A, x):
    return A @ x

  def jvp(self, primals, tangents):
    (A, x), (A_dot, x_dot) = primals, tangents
    t = jnp.zeros(self.out_aval.shape, self.out_aval.dtype)
    if not is_zero(A_dot):
      t = t + A_dot @ x
    if not is_zero(x_dot):
      t = t + A @ x_dot
    return self(A, x), t

  def vjp_fwd(self, nzs_in, A, x):
    return self(A, x), (A, x)

  def vjp_bwd_retval(self, res, g):
    A, x = res
    g = inst(g)
    return jnp.outer(g, x), A.T @ g

  def transpose(self, ct, A, x):
    ct = inst(ct)
    if _is_accum(A):
      if not isinstance(A, NullAccum):
        A.accum(jnp.outer(ct, x))
    elif _is_accum(x):
      if not isinstance(x, NullAccum):
        x.accum(A.T @ ct)

  def batch(self, axis_data, args, dims):
    A, x = args
    A_dim, x_dim = dims
    if A_dim is not None:
      A = jnp.moveaxis(A, A_dim, 0)
    if x_dim is not None:
      x = jnp.moveaxis(x, x_dim, 0)
    if A_dim is not None and x_dim is not None:
      return jnp.einsum("bij,bj->bi", A, x), 0
    if A_dim is not None:
      return jnp.einsum("bij,j->bi", A, x), 0
    return x @ A.T, 0


class MatVecXOnly(MatVec):
  """A @ x, whose batch rule supports only x batched."""

  def batch(self, axis_data, args, dims):
    A, x = args
    A_dim, x_dim = dims
    assert A_dim is None, "only x may be batched"
    return jnp.moveaxis(x, x_dim, 0) @ A.T, 0


def _is_accum(x):
  from hijax import GradAccum
  return isinstance(x, GradAccum)


def matvec(A, x):
  return MatVec(jax.typeof(A), jax.typeof(x))(A, x)


class Scale(HiPrim):
  """c * x, linear in x: only expand, transpose and batch_dim_rule."""

  def __init__(self, c_aval, x_aval):
    self.in_avals = (c_aval, x_aval)
    self.out_aval = x_aval
    self.params = {}
    super().__init__()

  def expand(self, c, x):
    return c * x

  def transpose(self, ct, c, x_acc):
    x_acc.accum(c * inst(ct))

  def batch_dim_rule(self, axis_data, in_dims):
    return first_dim(in_dims[1], in_dims[0])


def scale(c, x):
  return Scale(jax.typeof(c), jax.typeof(x))(c, x)


# --- pytrees in and out ---------------------------------------------------------------------

Point = namedtuple("Point", ["x", "y"])


class FPt(HiPrim):
  """Point(x, y) -> {'a': x ** 2, 'b': (sin x, cos y)}."""

  def __init__(self, pt_aval):
    self.in_avals = (pt_aval,)
    self.out_aval = {"a": pt_aval.x, "b": (pt_aval.x, pt_aval.y)}
    self.params = {}
    super().__init__()

  def expand(self, pt):
    return {"a": pt.x ** 2, "b": (jnp.sin(pt.x), jnp.cos(pt.y))}

  def jvp(self, primals, tangents):
    (pt,), (pt_dot,) = primals, tangents
    x_dot, y_dot = inst(pt_dot.x), inst(pt_dot.y)
    return self(pt), {"a": 2 * pt.x * x_dot,
                      "b": (jnp.cos(pt.x) * x_dot, -jnp.sin(pt.y) * y_dot)}

  def vjp_fwd(self, nzs_in, pt):
    return self(pt), pt

  def vjp_bwd_retval(self, pt, g):
    g = jax.tree.map(inst, g, is_leaf=lambda x: isinstance(x, Zero))
    a_bar, (b0_bar, b1_bar) = g["a"], g["b"]
    return (Point(2 * pt.x * a_bar + jnp.cos(pt.x) * b0_bar,
                  -jnp.sin(pt.y) * b1_bar),)

  def batch_dim_rule(self, axis_data, in_dims):
    dx, dy = in_dims[0]
    return {"a": dx, "b": (dx, dy)}


def fpt(pt):
  return FPt(_typeof(pt))(pt)


# --- integer inputs and outputs -------------------------------------------------------------

class Gather(HiPrim):
  """x[i] for an integer index i that is an input, not a parameter."""

  def __init__(self, x_aval, i_aval):
    self.in_avals = (x_aval, i_aval)
    self.out_aval = ShapedArray(x_aval.shape[1:], x_aval.dtype)
    self.params = {}
    super().__init__()

  def expand(self, x, i):
    return x[i]

  def jvp(self, primals, tangents):
    (x, i), (x_dot, _) = primals, tangents
    return self(x, i), inst(x_dot)[i]

  def vjp_fwd(self, nzs_in, x, i):
    return self(x, i), i

  def vjp_bwd(self, i, g, x_acc, i_acc):
    if not isinstance(x_acc, NullAccum):
      x_acc.accum(jnp.zeros(x_acc.aval.shape, x_acc.aval.dtype).at[i].add(
          inst(g)))

  def batch_dim_rule(self, axis_data, in_dims):
    return 0 if any(d is not None for d in in_dims) else None


def gather(x, i):
  return Gather(jax.typeof(x), jax.typeof(i))(x, i)


class ArgmaxMax(HiPrim):
  """(argmax x, max x): an integer output whose tangent is declared zero."""

  def __init__(self, x_aval):
    self.in_avals = (x_aval,)
    self.out_aval = (ShapedArray((), jnp.dtype("int32")),
                     ShapedArray((), x_aval.dtype))
    self.params = {}
    super().__init__()

  def expand(self, x):
    return jnp.argmax(x).astype(jnp.int32), jnp.max(x)

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    i, m = self(x)
    return (i, m), (None, inst(t)[i])

  def vjp_fwd(self, nzs_in, x):
    i, m = self(x)
    return (i, m), (i, jnp.zeros_like(x)), (False, True)

  def vjp_bwd_retval(self, res, g):
    i, zeros = res
    return (zeros.at[i].set(inst(g[1])),)

  def batch_dim_rule(self, axis_data, in_dims):
    d = None if in_dims[0] is None else 0
    return (d, d)


def argmax_max(x):
  return ArgmaxMax(jax.typeof(x))(x)


def plain_argmax_max(x):
  return jnp.argmax(x).astype(jnp.int32), jnp.max(x)


# --- gradient accumulators, logs and structured residuals ---------------------------------

class Square(Unary):
  """x ** 2 with an accumulator-style backward rule that logs."""

  def __init__(self, x_aval, tag="sq"):
    self.in_avals = (x_aval,)
    self.out_aval = x_aval
    self.params = dict(tag=tag)
    HiPrim.__init__(self)

  def expand(self, x):
    return x ** 2

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), 2 * x * t

  def vjp_fwd(self, nzs_in, x):
    return self(x), x

  def vjp_bwd(self, x, g, x_acc):
    x_acc.accum(2 * x * inst(g))
    return {self.tag: {"x": x}}


def square(x):
  return Square(jax.typeof(x))(x)


class CubeSres(Unary):
  """x ** 3, saving x as a structured residual; a full `batch` rule."""

  def expand(self, x):
    return x ** 3

  def vjp_fwd(self, nzs_in, x):
    return self(x), (), True, {"x": x}

  def vjp_bwd(self, res, sres, g, x_acc):
    x_acc.accum(3 * sres["x"] ** 2 * inst(g))

  def batch(self, axis_data, args, dims):
    (x,), (d,) = args, dims
    return cube_sres(x), d  # a new instance, for the batched type


def cube_sres(x):
  return CubeSres(jax.typeof(x))(x)


# --- rules that bind primitives again -----------------------------------------------------

class Sech2(Unary):
  """1 / cosh(x) ** 2, the derivative of tanh."""

  def expand(self, x):
    return 1 / jnp.cosh(x) ** 2

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    s = self(x)
    return s, -2 * s * jnp.tanh(x) * t

  lin, linearized = linearize_from_jvp
  vjp_fwd, vjp_bwd_retval = vjp_from_jvp


def sech2(x):
  return Sech2(jax.typeof(x))(x)


class Tanh(Unary):
  """tanh, whose jvp rule binds another primitive (Sech2)."""

  def expand(self, x):
    return jnp.tanh(x)

  def jvp(self, primals, tangents):
    (x,), (t,) = primals, tangents
    return self(x), sech2(x) * t

  lin, linearized = linearize_from_jvp
  vjp_fwd, vjp_bwd_retval = vjp_from_lin


def tanh(x):
  return Tanh(jax.typeof(x))(x)


class FixedPoint(HiPrim):
  """The fixed point x = f(a, x), differentiated implicitly: the backward rule
  binds FixedPoint again."""

  def __init__(self, a_aval, x_aval, *, f):
    self.in_avals = (a_aval, x_aval)
    self.out_aval = x_aval
    self.params = dict(f=f)
    super().__init__()

  def expand(self, a, x_guess):
    cond, body = _loop_functions(self.f)
    return while_loop(cond, body, (a, x_guess, self.f(a, x_guess)))[2]

  def vjp_fwd(self, nzs_in, a, x_guess):
    x_star = self(a, x_guess)
    return x_star, (a, x_star)

  def vjp_bwd_retval(self, res, x_star_bar):
    a, x_star = res
    x_star_bar = inst(x_star_bar)
    _, vjp_a = jax.vjp(lambda a: self.f(a, x_star), a)
    w = fixed_point(_rev_iter(self.f), (a, x_star, x_star_bar), x_star_bar)
    return vjp_a(w)[0], jnp.zeros_like(x_star)

  def batch_dim_rule(self, axis_data, in_dims):
    a_dims, x_dim = in_dims
    return first_dim(x_dim, *jax.tree.leaves(a_dims))


@functools.cache
def _loop_functions(f):
  """The loop's functions, made once per f so that eager calls reuse the
  compiled loop (a new closure per call would recompile it every time)."""
  def cond(carry):
    _, x_prev, x = carry
    return jnp.max(jnp.abs(x_prev - x)) > 1e-6 * (1 + jnp.max(jnp.abs(x)))

  def body(carry):
    a, _, x = carry
    return a, x, f(a, x)
  return cond, body


@dataclasses.dataclass(frozen=True)
class _rev_iter:
  f: Callable

  def __call__(self, packed, u):
    a, x_star, x_star_bar = packed
    _, vjp_x = jax.vjp(lambda x: self.f(a, x), x_star)
    return x_star_bar + vjp_x(u)[0]


def fixed_point(f, a, x_guess):
  return FixedPoint(_typeof(a), _typeof(x_guess), f=f)(a, x_guess)


def _newton_update(a, x):
  return 0.5 * (x + a / x)


def newton_sqrt(a):
  return fixed_point(_newton_update, a, a)


# --- the registry ------------------------------------------------------------------------------

@dataclasses.dataclass
class ZooEntry:
  """A zoo primitive with what tests need to know about it.

  Attributes:
    name: a short id.
    fn: applies the primitive.
    plain: the same function in plain JAX.
    args: example arguments (float32), built on demand.
    transforms: the transformations its rules support, from "jvp", "vjp",
      "lin", "vmap" ("grad" needs "vjp").
    check_kwargs: extra keyword arguments for `check_rules`.
    elementwise: True when ``fn`` maps one array elementwise (so property
      tests may feed it arrays of any shape).
    domain: the interval that floating-point inputs may be drawn from.
  """
  name: str
  fn: Callable
  plain: Callable
  args: Callable[[], tuple]
  transforms: frozenset
  check_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
  elementwise: bool = False
  domain: tuple[float, float] = (-2.0, 2.0)


def _vec(*xs):
  return jnp.array(xs, jnp.float32)


ALL = frozenset({"jvp", "vjp", "lin", "vmap"})

ENTRIES = [
    ZooEntry("log1pexp", log1pexp, lambda x: jnp.logaddexp(x, 0.),
             lambda: (_vec(-2., 0.5, 3.),), frozenset({"jvp", "vjp", "vmap"}),
             elementwise=True),
    ZooEntry("sin_times_y", sin_times_y, lambda x, y: jnp.sin(x) * y,
             lambda: (_vec(0.3, -1.2), _vec(2., 0.5)),
             frozenset({"jvp", "vjp", "vmap"})),
    ZooEntry("sin_derived", sin_derived, jnp.sin,
             lambda: (_vec(0.3, -1.2, 2.),), ALL, elementwise=True),
    ZooEntry("cube_lin", cube_lin, lambda x: x ** 3,
             lambda: (_vec(0.3, -1.2, 2.),), ALL, elementwise=True),
    ZooEntry("matvec", matvec, lambda A, x: A @ x,
             lambda: (jnp.arange(6., dtype=jnp.float32).reshape(2, 3) / 4 - 0.5,
                      _vec(1., -2., 0.5)),
             frozenset({"jvp", "vjp", "vmap"})),
    ZooEntry("scale", scale, lambda c, x: c * x,
             lambda: (jnp.float32(1.5), _vec(1., -2., 0.5)),
             frozenset({"vmap"}), check_kwargs=dict(linear_argnums=[1])),
    ZooEntry("fpt", fpt,
             lambda pt: {"a": pt.x ** 2, "b": (jnp.sin(pt.x), jnp.cos(pt.y))},
             lambda: (Point(_vec(0.5, 1.5), _vec(-1., 2.)),),
             frozenset({"jvp", "vjp", "vmap"})),
    ZooEntry("gather", gather, lambda x, i: x[i],
             lambda: (_vec(1., -2., 0.5, 4.), jnp.int32(2)),
             frozenset({"jvp", "vjp", "vmap"})),
    ZooEntry("argmax_max", argmax_max, plain_argmax_max,
             lambda: (_vec(1., -2., 4.5, 0.5),),
             frozenset({"jvp", "vjp", "vmap"})),
    ZooEntry("square", square, lambda x: x ** 2,
             lambda: (_vec(0.3, -1.2, 2.),), frozenset({"jvp", "vjp", "vmap"}),
             elementwise=True),
    ZooEntry("cube_sres", cube_sres, lambda x: x ** 3,
             lambda: (_vec(0.3, -1.2, 2.),), frozenset({"vjp", "vmap"}),
             elementwise=True),
    ZooEntry("sech2", sech2, lambda x: 1 / jnp.cosh(x) ** 2,
             lambda: (_vec(0.3, -1.2, 2.),), ALL, elementwise=True),
    ZooEntry("tanh", tanh, jnp.tanh, lambda: (_vec(0.3, -1.2, 2.),), ALL,
             elementwise=True),
    ZooEntry("newton_sqrt", newton_sqrt, jnp.sqrt,
             lambda: (_vec(2., 0.5, 9.),), frozenset({"vjp", "vmap"}),
             elementwise=True, domain=(0.5, 10.0)),
]

BY_NAME = {e.name: e for e in ENTRIES}


def right_sin():
  """A `jax.custom_jvp` sin with a right jvp rule (a fresh one per call)."""
  @jax.custom_jvp
  def sin(x):
    return jnp.sin(x)

  @sin.defjvp
  def _(primals, tangents):
    return sin(primals[0]), jnp.cos(primals[0]) * tangents[0]
  return sin


def right_relu():
  """A `jax.custom_jvp` relu with a right jvp rule (0 at the kink)."""
  @jax.custom_jvp
  def relu(x):
    return jnp.maximum(x, 0.)

  @relu.defjvp
  def _(primals, tangents):
    (x,), (t,) = primals, tangents
    return relu(x), jnp.where(x > 0, t, 0.)
  return relu
