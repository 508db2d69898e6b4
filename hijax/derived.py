"""Rules derived from other rules, assigned in a `HiPrim` subclass's body.

* ``lin, linearized = linearize_from_jvp``: partially evaluate `jvp`;
* ``vjp_fwd, vjp_bwd_retval = vjp_from_lin``: save `lin`'s residuals, transpose
  `linearized` on the backward pass (what ``jax.custom_jvp`` does);
* ``vjp_fwd, vjp_bwd_retval = vjp_from_jvp``: save the primal inputs, then
  linearize and transpose `jvp` on the backward pass (recomputing, remat-style);
* ``jvp = jvp_from_lin``: forward mode from `lin`/`linearized`;
* ``jvp = jvp_from_vjp``: forward mode by transposing the backward rule in its
  cotangent (checked to be linear in it first, by `hijax._linearity`).

The pairs are named tuples of two functions, with JAX's field names
(``linearize_from_jvp.lin``, ``.linearized``; ``vjp_from_jvp.vjp_fwd``,
``.vjp_bwd_retval``; likewise ``vjp_from_lin``), so they unpack into two
methods.
A class that assigns a derived method to another name (``lin, linearized =
vjp_from_jvp``), or a pair without unpacking it, is rejected when it is created.

Imports: `hijax.primitive`, `hijax.autodiff` and the private modules; its
class-creation checks are installers appended to `RULE_INSTALLERS`.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.extend.core
import numpy as np
from jax import api_util
from jax.extend import linear_util as lu

from hijax import _linearity
from hijax._internals import ad, core
from hijax._core_rules import flatten_output
from hijax._util import Static, is_float0, is_zero, store_bounded
from hijax.autodiff import (NullAccum, ValAccum, Zero, _flatten_tangent,
                            _unpack_forward, checked_backward,
                            instantiate_zeros)
from hijax.primitive import HiPrim, RULE_INSTALLERS

__all__ = ["linearize_from_jvp", "vjp_from_lin", "vjp_from_jvp", "jvp_from_lin",
           "jvp_from_vjp", "LinearizeFromJvp", "VjpFromJvp", "VjpFromLin",
           "NonlinearBackwardError", "tangent_from_backward"]


class NonlinearBackwardError(TypeError):
  """`jvp_from_vjp` found that a backward rule is not linear in its cotangent.

  A ``TypeError``. ``prim`` is the primitive whose rule it is, ``method`` the
  rule (``vjp_bwd_retval`` or ``vjp_bwd``) and ``reason`` the operation that
  is not linear in ``g``, with its source line.
  """

  prim: Any
  method: str
  reason: str

  def __init__(self, message: str, prim: Any, method: str, reason: str):
    super().__init__(message)
    self.prim, self.method, self.reason = prim, method, reason


def _zero_tangents(prim: HiPrim, nzs_flat, nz_tangents):
  """Rebuilds the full tangent tuple, with `Zero` where ``nzs_flat`` is False."""
  it = iter(nz_tangents)
  flat = [next(it) if nz else Zero(a.to_tangent_aval())
          for a, nz in zip(prim.in_avals_flat, nzs_flat)]
  return jax.tree.unflatten(prim.in_tree, flat)


def _instantiate(tree):
  return jax.tree.map(instantiate_zeros, tree, is_leaf=is_zero)


# --- linearize_from_jvp -------------------------------------------------------------

def _lin_from_jvp(self, nzs_in, *primals):
  """`lin` derived by partially evaluating `jvp` at ``primals``.

  The tangents are unknown values whose operations are recorded, not
  differentiated, so a linear primitive's `jvp` may apply the primitive itself
  to its tangent. A tangent that does not depend on them (a float0 tangent for
  "not differentiable", a constant) is a zero of the output's tangent type.
  """
  out_flat, nzs_out_flat, consts, linear_map = linearize_flat(
      self, jax.tree.leaves(nzs_in), jax.tree.leaves(primals))
  return (jax.tree.unflatten(self.out_tree, out_flat),
          (consts, Static(linear_map)),
          jax.tree.unflatten(self.out_tree, list(nzs_out_flat)))


def linearize_flat(self: HiPrim, nzs_flat: Any, primals_flat: Any) -> Any:
  """`_lin_from_jvp` on leaves: (outs, nonzero flags, residuals, linear map)."""
  def jvp_flat(primals_flat, tangents_flat):
    out, t_out = self.jvp(jax.tree.unflatten(self.in_tree, primals_flat),
                          jax.tree.unflatten(self.in_tree, tangents_flat))
    return flatten_output(self, "jvp", out), _flatten_tangent(self, "jvp", t_out)

  primals = jax.tree.unflatten(self.in_tree, primals_flat)
  debug = api_util.debug_info("linearize_from_jvp", self.jvp, (primals, primals),
                              {})
  out_flat, nzs_out_flat, consts, _, linear_map = ad.linearize_from_jvp(
      lu.wrap_init(jvp_flat, debug_info=debug), True, nzs_flat, False, False,
      primals_flat, {})
  return out_flat, nzs_out_flat, consts, linear_map


def _linearized_from_jvp(self, res, *tangents):
  """`linearized` half of `linearize_from_jvp`: evaluates the recorded map."""
  consts, linear_map = res
  out_flat = linear_map.value(consts, None, *self.in_tree.flatten_up_to(tangents))
  return jax.tree.unflatten(self.out_tree, out_flat)


# --- jvp_from_lin -----------------------------------------------------------------

def jvp_from_lin(self: HiPrim, primals: Any, tangents: Any, /) -> Any:
  """`jvp` derived from handwritten `lin` and `linearized` rules."""
  tangents_flat = self.in_tree.flatten_up_to(tangents)
  nzs_in = jax.tree.unflatten(self.in_tree,
                              [not is_zero(t) for t in tangents_flat])
  out, res, *rest = self.lin(nzs_in, *primals)
  if len(rest) > 1:
    return out, _checked_tangent(self, "linearized",
                                 self.linearized(res, rest[1], *tangents))
  return out, _checked_tangent(self, "linearized",
                               self.linearized(res, *tangents))


# --- jvp_from_vjp -----------------------------------------------------------------

def jvp_from_vjp(self: HiPrim, primals: Any, tangents: Any, /) -> Any:
  """`jvp` derived from the reverse-mode rules, by transposing the backward rule.

  ``jvp = jvp_from_vjp`` in a class body gives a primitive that has only
  `vjp_fwd` and `vjp_bwd_retval` (or `vjp_bwd`) forward mode, and with it
  ``jax.jvp``, ``jax.jacfwd``, ``jax.hessian`` (forward over reverse) and,
  with ``lin, linearized = linearize_from_jvp`` too, ``jax.linearize``.
  A backward rule is linear in the output cotangent ``g``, so transposing it
  in ``g`` (``jax.linear_transpose``) maps input tangents to the output
  tangent.

  Cost: each `jvp` runs `vjp_fwd` (the primal output and all residuals) and
  the backward rule, transposed. The backward rule is traced, checked and
  transposed once per primitive (class and params), nonzero flags and
  residual types, and kept: an eager `jvp` then runs the transposed rule as
  one compiled program. Before transposing, the jaxpr of the
  backward rule is checked to be linear in ``g``: a rule that is not (one
  that clips ``g``, adds a constant to it, multiplies it by itself) raises a
  TypeError naming the rule, the operation and its source line, rather than
  giving a wrong tangent (`NonlinearBackwardError`).
  """
  name = type(self).__name__
  if type(self).vjp_fwd is HiPrim.vjp_fwd:
    raise NotImplementedError(
        f"{name} sets `jvp = jvp_from_vjp`, which derives forward mode from "
        "the reverse-mode rule, but has no `vjp_fwd`: implement `vjp_fwd(self, "
        "nzs_in, *args)` and `vjp_bwd_retval(self, res, g)`, or write `jvp`")
  tangents_flat = self.in_tree.flatten_up_to(tangents)
  nzs_flat = [not (t is None or is_zero(t) or is_float0(t))
              for t in tangents_flat]
  nzs_in = jax.tree.unflatten(self.in_tree, nzs_flat)
  out, res, nzs_out, sres = _unpack_forward(
      self, "vjp_fwd", self.vjp_fwd(nzs_in, *primals))
  if nzs_out is None:
    live = [True] * len(self.out_avals_flat)
  else:
    live = [bool(nz) for nz in self.out_tree.flatten_up_to(nzs_out)]
  t_out = tangent_from_backward(self, nzs_flat, live, res, sres,
                                tangents_flat)
  if all(t is None for t in t_out):
    return out, None
  return out, jax.tree.unflatten(self.out_tree, t_out)


def tangent_from_backward(self: HiPrim, nzs_flat: list[bool],
                          live: list[bool], res: Any, sres: Any,
                          tangents_flat: list[Any]) -> list[Any]:
  """The output tangent leaves (None for zero) of `jvp_from_vjp`, given the
  residuals of `vjp_fwd`: the backward rule, transposed in the cotangents of
  the ``live`` outputs, applied to the input tangents (those ``nzs_flat``
  says are nonzero)."""
  g_avals = [a.to_ct_aval() for a in self.out_avals_flat]
  live = [nz and not is_float0(a) for nz, a in zip(live, g_avals)]
  if not any(nzs_flat) or not any(live):
    return [None] * len(live)
  tangents_live = [instantiate_zeros(t) for t, nz in zip(tangents_flat,
                                                          nzs_flat) if nz]
  transposed = _transposed_backward(self, nzs_flat, live, g_avals, res, sres,
                                    tangents_live)
  t_live = iter(transposed(tangents_live))
  return [next(t_live) if nz else None for nz in live]


# Transposed backward rules, as jaxprs of (residual arrays, input tangents),
# by primitive, flags and types: see _transposed_backward.
_TRANSPOSED: dict[Any, Any] = {}
_TRANSPOSED_MAX = 512


def _backward_in_g(self: HiPrim, nzs_flat, live, g_avals, res, sres):
  """The backward rule at these residuals, as a function of the live output
  cotangents returning the cotangents of the differentiated inputs."""
  def backward(*g_live):
    it = iter(g_live)
    g = jax.tree.unflatten(self.out_tree, [next(it) if nz else Zero(a)
                                          for a, nz in zip(g_avals, live)])
    accums = [ValAccum(a.to_ct_aval()) if nz else NullAccum(a.to_ct_aval())
              for a, nz in zip(self.in_avals_flat, nzs_flat)]
    arg_accums = jax.tree.unflatten(self.in_tree, accums)
    with checked_backward(self, accums):
      if sres is None:
        self.vjp_bwd(res, g, *arg_accums)
      else:
        self.vjp_bwd(res, sres, g, *arg_accums)
    return [instantiate_zeros(acc.freeze())
            for acc, nz in zip(accums, nzs_flat) if nz]
  return backward


def _transpose_in_g(self: HiPrim, backward, examples, tangents_live):
  """The output tangents: ``backward``, checked linear in g, transposed."""
  backward_jaxpr = jax.make_jaxpr(backward)(*examples)
  reason = _linearity.nonlinear_reason(backward_jaxpr, [True] * len(examples))
  if reason is not None:
    name = type(self).__name__
    method = ("vjp_bwd" if type(self).vjp_bwd is not HiPrim.vjp_bwd
              else "vjp_bwd_retval")
    raise NonlinearBackwardError(
        f"{name}.jvp = jvp_from_vjp transposes {name}.{method} in the "
        f"cotangent g, but {name}.{method} is not linear in g: {reason}. A "
        "backward rule must be linear in g (the chain rule multiplies g by "
        "the Jacobian); fix the rule, or write `jvp` by hand", self, method,
        reason)
  return jax.linear_transpose(
      jax.extend.core.jaxpr_as_fun(backward_jaxpr), *examples)(tangents_live)


def _static_key(leaf):
  """A residual leaf that is not an array, by type and value (raises
  TypeError if unhashable); floats by their bits (0.0 and -0.0 differ)."""
  if isinstance(leaf, float):
    return float, leaf.hex()
  hash(leaf)
  return type(leaf), leaf


def _transposed_backward(self: HiPrim, nzs_flat, live, g_avals, res, sres,
                         tangents_live):
  """The backward rule transposed in g: a function of the live input
  tangents.

  Tracing the backward rule, checking it linear and transposing it costs
  milliseconds, more than an eager call of the rule itself: it is done once
  per primitive (class and params), flags and residual types, as a jaxpr of
  the residual arrays and the tangents, and kept. Called eagerly, that jaxpr
  runs as one compiled program; under a trace, its equations are traced in.
  Residuals that are not arrays (Python numbers, flags) are part of the key;
  an unhashable one, or types other than arrays, trace afresh each call."""
  leaves, tree = jax.tree.flatten((res, sres))
  is_array = [isinstance(x, (jax.Array, np.ndarray, np.generic))
              for x in leaves]
  arrays = [x for x, a in zip(leaves, is_array) if a]
  examples = [jax.ShapeDtypeStruct(a.shape, a.dtype)
              for a, nz in zip(g_avals, live) if nz]

  def transposed(arrays, tangents_live):
    it = iter(arrays)
    res, sres = jax.tree.unflatten(tree, [next(it) if a else x
                                          for x, a in zip(leaves, is_array)])
    backward = _backward_in_g(self, nzs_flat, live, g_avals, res, sres)
    return _transpose_in_g(self, backward, examples, tangents_live)

  try:
    types = [jax.typeof(x) for x in (*arrays, *tangents_live)]
    if not all(type(t) is core.ShapedArray for t in types):
      raise TypeError("hi types")
    key = (self, tuple(nzs_flat), tuple(live), tree, tuple(types), tuple(
        _static_key(x) for x, a in zip(leaves, is_array) if not a))
    entry = _TRANSPOSED.get(key)
  except TypeError:
    return lambda tangents: transposed(arrays, tangents)
  if entry is None:
    specs = [jax.ShapeDtypeStruct(t.shape, t.dtype, weak_type=t.weak_type)
             for t in types]
    closed = jax.make_jaxpr(lambda *xs: transposed(
        xs[:len(arrays)], list(xs[len(arrays):])))(*specs)
    entry = store_bounded(_TRANSPOSED, key, (
        closed, jax.jit(jax.extend.core.jaxpr_as_fun(closed))), _TRANSPOSED_MAX)
  closed, compiled = entry
  if any(isinstance(x, core.Tracer) for x in (*arrays, *tangents_live)):
    return lambda tangents: jax.extend.core.jaxpr_as_fun(closed)(
        *arrays, *tangents)
  return lambda tangents: compiled(*arrays, *tangents)


# --- vjp_from_lin and vjp_from_jvp ----------------------------------------------------

def _transpose_tangent_map(prim: HiPrim, nzs_flat, tangent_map, g):
  """Cotangents of the inputs, by transposing a function of the nonzero tangents."""
  examples = [jax.ShapeDtypeStruct(t.shape, t.dtype) for t in (
      a.to_tangent_aval() for a, nz in zip(prim.in_avals_flat, nzs_flat) if nz)]
  cts = iter(jax.linear_transpose(
      lambda *ts: _instantiate(tangent_map(*ts)), *examples)(_instantiate(g)))
  return jax.tree.unflatten(prim.in_tree, [next(cts) if nz else None
                                           for nz in nzs_flat])


def _vjp_fwd_from_lin(self, nzs_in, *primals):
  """`vjp_fwd` half of `vjp_from_lin`: runs `lin`, saving its residuals."""
  out, res, *rest = self.lin(nzs_in, *primals)
  sres = rest[1] if len(rest) > 1 else None
  saved = (res, sres, Static(jax.tree.leaves(nzs_in)))
  return (out, saved, rest[0]) if rest else (out, saved)


def _vjp_bwd_from_lin(self, saved, g):
  """`vjp_bwd_retval` half of `vjp_from_lin`: transposes `linearized`."""
  res, sres, nzs = saved
  extra = () if sres is None else (sres,)

  def tangent_map(*nz_tangents):
    tangents = _zero_tangents(self, nzs.value, nz_tangents)
    return _checked_tangent(self, "linearized",
                            self.linearized(res, *extra, *tangents))
  return _transpose_tangent_map(self, nzs.value, tangent_map, g)


def _checked_tangent(prim: HiPrim, method, tangent):
  """``tangent``, checked against the output's tangent type (None: `Zero`)."""
  return jax.tree.unflatten(prim.out_tree,
                            _flatten_tangent(prim, method, tangent))


def _vjp_fwd_from_jvp(self, nzs_in, *primals):
  """`vjp_fwd` half of `vjp_from_jvp`: saves only the primal inputs."""
  return self(*primals), (primals, Static(jax.tree.leaves(nzs_in)))


def _vjp_bwd_from_jvp(self, saved, g):
  """`vjp_bwd_retval` half of `vjp_from_jvp`: linearizes and transposes `jvp`."""
  primals, nzs = saved

  def tangent_map(*nz_tangents):
    _, t = self.jvp(primals, _zero_tangents(self, nzs.value, nz_tangents))
    return _checked_tangent(self, "jvp", t)
  return _transpose_tangent_map(self, nzs.value, tangent_map, g)


# --- the pairs ----------------------------------------------------------------------

class _Pair:
  """What the three pairs add to their named tuple's fields."""

  __slots__ = ()
  name: str
  targets: str

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    raise TypeError(f"{self.name} defines two methods: unpack it in the class "
                    f"body, `{self.targets} = {self.name}`")

  def __repr__(self) -> str:
    return self.name

  # Each pair's two methods by position, for code that does not know the
  # pair's field names (such as hijax.testing).
  @property
  def first(self) -> Callable[..., Any]:
    """The first of the two methods."""
    return self[0]  # pyright: ignore[reportIndexIssue]

  @property
  def second(self) -> Callable[..., Any]:
    """The second of the two methods."""
    return self[1]  # pyright: ignore[reportIndexIssue]


class _LinFields(NamedTuple):
  lin: Callable[..., Any]
  """`HiPrim.lin` derived from `HiPrim.jvp`."""
  linearized: Callable[..., Any]
  """`HiPrim.linearized`, the linear map `lin` recorded."""


class _VjpFields(NamedTuple):
  vjp_fwd: Callable[..., Any]
  """The derived `HiPrim.vjp_fwd`."""
  vjp_bwd_retval: Callable[..., Any]
  """The derived `HiPrim.vjp_bwd_retval`."""


class LinearizeFromJvp(_Pair, _LinFields):
  """The pair `linearize_from_jvp`: a named tuple ``(lin, linearized)``."""

  __slots__ = ()
  name = "linearize_from_jvp"
  targets = "lin, linearized"


class VjpFromJvp(_Pair, _VjpFields):
  """The pair `vjp_from_jvp`: a named tuple ``(vjp_fwd, vjp_bwd_retval)``,
  saving the primal inputs and transposing `HiPrim.jvp`."""

  __slots__ = ()
  name = "vjp_from_jvp"
  targets = "vjp_fwd, vjp_bwd_retval"


class VjpFromLin(_Pair, _VjpFields):
  """The pair `vjp_from_lin`: a named tuple ``(vjp_fwd, vjp_bwd_retval)``,
  saving the residuals of `HiPrim.lin` and transposing `HiPrim.linearized`."""

  __slots__ = ()
  name = "vjp_from_lin"
  targets = "vjp_fwd, vjp_bwd_retval"


# Where no tangent flows in, a derived forward rule has nothing to compute:
# hijax.autodiff applies the primitive instead (JAX's own module runs it).
for _forward in (_lin_from_jvp, _vjp_fwd_from_lin, _vjp_fwd_from_jvp):
  _forward.skipped_without_tangents = True  # type: ignore[attr-defined]

RulePair: tuple[type, ...] = (LinearizeFromJvp, VjpFromJvp, VjpFromLin)
"""The classes of the derived pairs (named tuples of two methods, with JAX's
field names), for ``isinstance``."""

linearize_from_jvp: LinearizeFromJvp = LinearizeFromJvp(_lin_from_jvp,
                                                        _linearized_from_jvp)
"""``lin, linearized = linearize_from_jvp``: linearization from the `jvp` rule."""

vjp_from_lin: VjpFromLin = VjpFromLin(_vjp_fwd_from_lin, _vjp_bwd_from_lin)
"""``vjp_fwd, vjp_bwd_retval = vjp_from_lin``: reverse mode by transposing `linearized`."""

vjp_from_jvp: VjpFromJvp = VjpFromJvp(_vjp_fwd_from_jvp, _vjp_bwd_from_jvp)
"""``vjp_fwd, vjp_bwd_retval = vjp_from_jvp``: reverse mode by transposing `jvp`."""


_PAIRS = (linearize_from_jvp, vjp_from_lin, vjp_from_jvp)
_RIGHT_NAME: dict[int, tuple[Any, Any, str]] = {
    id(f): (f, pair, name) for pair in _PAIRS
    for f, name in zip(pair, pair.targets.split(", "))}
_RIGHT_NAME[id(jvp_from_lin)] = (jvp_from_lin, None, "jvp")
_RIGHT_NAME[id(jvp_from_vjp)] = (jvp_from_vjp, None, "jvp")


def _install_derivation_check(cls):
  for attr, value in vars(cls).items():
    if isinstance(value, RulePair):
      raise TypeError(
          f"{cls.__name__}.{attr} is set to the pair {value.name}, which "
          f"defines two methods: unpack it, `{value.targets} = {value.name}`")
    entry = _RIGHT_NAME.get(id(value))
    if entry is None or entry[0] is not value or entry[2] == attr:
      continue
    _, pair, right = entry
    source = value.__name__ if pair is None else pair.name
    unpack = f"jvp = {source}" if pair is None else (
        f"{pair.targets} = {pair.name}")
    raise TypeError(
        f"{cls.__name__}.{attr} is set to {source}'s `{right}` method: "
        f"{source} derives `{right}`, so write `{unpack}`. "
        f"{_which_derives(attr)}")


def _which_derives(attr) -> str:
  if attr in ("lin", "linearized"):
    return "`lin, linearized` are derived with `= linearize_from_jvp`."
  if attr in ("vjp_fwd", "vjp_bwd_retval"):
    return ("`vjp_fwd, vjp_bwd_retval` are derived with `= vjp_from_lin` or "
            "`= vjp_from_jvp`.")
  if attr == "jvp":
    return ("`jvp` is derived with `jvp = jvp_from_lin` or "
            "`jvp = jvp_from_vjp`.")
  return ""


RULE_INSTALLERS.append(_install_derivation_check)


def _install_circularity_check(cls):
  if cls.jvp is jvp_from_lin and cls.lin is _lin_from_jvp:
    raise TypeError(
        f"{cls.__name__} sets both `jvp = jvp_from_lin` and `lin, linearized = "
        "linearize_from_jvp`: each rule would be derived from the other. Write "
        "`jvp` or `lin`/`linearized` by hand")
  if cls.jvp is jvp_from_vjp and (
      cls.vjp_fwd is _vjp_fwd_from_jvp
      or cls.vjp_fwd is _vjp_fwd_from_lin and cls.lin is _lin_from_jvp):
    via = ("`vjp_fwd, vjp_bwd_retval = vjp_from_jvp`"
           if cls.vjp_fwd is _vjp_fwd_from_jvp else
           "`vjp_fwd, vjp_bwd_retval = vjp_from_lin` with `lin, linearized = "
           "linearize_from_jvp`")
    raise TypeError(
        f"{cls.__name__} sets both `jvp = jvp_from_vjp` and {via}: forward "
        "and reverse mode would each be derived from the other. Write `jvp` "
        "or `vjp_fwd`/`vjp_bwd_retval` by hand")


RULE_INSTALLERS.append(_install_circularity_check)
