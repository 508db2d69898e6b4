"""`HiPrim`: a user-defined JAX primitive whose implementation is a JAX function.

Each subclass of `HiPrim` gets its own `jax.extend.core.Primitive`, named after the
class, so that a jaxpr shows ``Square[...] a`` and every error names the class.
An instance is one application site's *signature*: its argument types
(``in_avals``), output type (``out_aval``) and static ``params``. Calling the
instance binds the primitive:

* eagerly, the primitive is "high": JAX lowers it on the spot by calling
  `HiPrim.expand` on the concrete arguments;
* under a staging trace (``jit``) it is recorded as one equation, and `expand`
  is traced only when the jaxpr is lowered to XLA;
* under autodiff and ``vmap`` the rules registered by `hijax.autodiff` and
  `hijax.batching` call the subclass's methods.

The registries a primitive needs are filled by *installers*: functions that
other modules append to `RULE_INSTALLERS` and that run once per subclass.
"""
from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Collection, Hashable
from typing import Any

import jax
import jax.extend  # noqa: F401  (jax.extend.core.Primitive)
import jax.numpy as jnp
from jax._src import api
from jax._src import core
from jax._src import effects as jax_effects
from jax._src import pretty_printer as pp
from jax._src import traceback_util
from jax._src import tree_util
from jax._src.core import AbstractValue
from jax._src.interpreters import partial_eval as pe

from hijax import _checks, _compat

# Like JAX's own frames, hijax's are hidden from user tracebacks and from the
# source locations of residuals, so both point at the user's code.
traceback_util.register_exclusion(os.path.dirname(__file__))

RULE_INSTALLERS: list[Callable[[type[HiPrim]], None]] = []
"""Functions ``install(cls)`` run for each new `HiPrim` subclass."""


class HiPrim:
  """Base class of hijax primitives.

  A subclass's ``__init__`` sets three attributes and then calls
  ``super().__init__()``:

  * ``in_avals``: a tuple with one entry per positional argument; each entry is
    a type (``jax.typeof(x)``, a `ShapedArray`, a hi type) or a pytree of types;
  * ``out_aval``: the output type, or a pytree of types;
  * ``params``: a dict of *hashable* static parameters. Each becomes an
    attribute of the instance (``params = dict(f=f)`` gives ``self.f``), so
    its key is a string that names no method or attribute of the class.

  Two instances are equal (and JAX treats them as the same primitive
  application) exactly when their class, ``in_avals``, ``out_aval``,
  ``params`` and ``effects`` (any collection of JAX effects) are equal.

  The only required method is `expand`, the implementation in ordinary JAX
  operations. The other methods are rules for transformations, each optional
  until the transformation is used: `vjp_fwd` with `vjp_bwd_retval` or
  `vjp_bwd` (reverse mode), `jvp` (forward mode), `lin` with `linearized`
  (``jax.linearize``), `batch_dim_rule` or `batch` (``vmap``), `transpose`
  (linear primitives), `dce` and `remat`.
  """

  in_avals: tuple[Any, ...]
  out_aval: Any
  params: dict[str, Hashable]
  effects: frozenset = frozenset()

  vjp_bwd_retval_logs: bool = False
  """Set to True when `vjp_bwd_retval` returns ``(cotangents, logs)``."""

  # Filled in by `__init_subclass__`.
  _primitive: jax.extend.core.Primitive
  _linearized_primitive: jax.extend.core.Primitive

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    cls._primitive = _new_primitive(cls.__name__)
    cls._linearized_primitive = _new_primitive(f"{cls.__name__}.linearized")
    _check_backward_rules(cls)
    cls._reserved_names = _reserved_names(cls)
    for install in RULE_INSTALLERS:
      install(cls)

  def __init__(self):
    try:
      in_avals, params = self.in_avals, self.params
      self.out_aval  # noqa: B018 - only checking that it is set
    except AttributeError:
      raise _missing_attribute_error(self) from None
    name = type(self).__name__
    if not isinstance(in_avals, (tuple, list)):
      raise TypeError(
          f"{name}.in_avals must be a tuple with one type per positional "
          f"argument, got {type(in_avals).__name__}; for a single "
          "argument write `self.in_avals = (x_aval,)`")
    if type(params) is not dict:
      raise TypeError(f"{name}.params must be a dict, got "
                      f"{type(params).__name__}")
    for key in params:
      if type(key) is not str or key in self._reserved_names:
        raise _param_name_error(self, key)
    self.in_avals = tuple(self.in_avals)
    self.in_avals_flat, self.in_tree = _flatten_types(
        name, "in_avals", self.in_avals)
    self.out_avals_flat, self.out_tree = _flatten_types(
        name, "out_aval", self.out_aval)
    if self.effects or type(self.effects) is not frozenset:
      self.effects = _effect_set(self)
    # Two instances are interchangeable (JAX caches abstract evaluation and
    # tracing on them) exactly when their types, params and effects agree.
    try:
      self._key = (type(self), self.in_tree, tuple(self.in_avals_flat),
                   self.out_tree, tuple(self.out_avals_flat),
                   frozenset(params.items()) if params else (), self.effects)
      self._hash = hash(self._key)
    except TypeError:
      raise _unhashable_error(self) from None
    self.__dict__.update(self.params)
    # Fast paths for the common case: array arguments and a single output.
    n = len(self.in_avals)
    self._args_are_leaves = self.in_tree.num_nodes == n + 1 == (
        self.in_tree.num_leaves + 1)
    self._single_output = self.out_tree.num_nodes == 1 == self.out_tree.num_leaves

  # --- the implementation -------------------------------------------------

  def expand(self, *args):
    """The implementation, in ordinary JAX operations on ``args``.

    Runs on every eager call and is traced once when a jaxpr containing the
    primitive is lowered (e.g. under ``jit``).
    """
    raise NotImplementedError(
        f"{type(self).__name__} must implement `expand(self, *args)`, the "
        "primitive's implementation in ordinary JAX operations")

  # --- reverse mode -------------------------------------------------------

  def vjp_fwd(self, nzs_in, *args):
    """Forward pass of reverse mode: returns ``(out, residuals)``.

    ``nzs_in`` mirrors ``in_avals`` with booleans: False for an input that is
    not differentiated. May also return ``(out, res, nzs_out)`` or
    ``(out, res, nzs_out, structured_residuals)``.
    """
    raise NotImplementedError(
        f"{type(self).__name__} has no reverse-mode rule: implement "
        "`vjp_fwd(self, nzs_in, *args)` and `vjp_bwd_retval(self, res, g)` (or "
        "`vjp_bwd`), or derive them in the class body with "
        "`vjp_fwd, vjp_bwd_retval = vjp_from_jvp` (or `= vjp_from_lin`)")

  def vjp_bwd_retval(self, res, g):
    """Backward pass returning one cotangent per input (None for zero)."""
    raise NotImplementedError(
        f"{type(self).__name__} has `vjp_fwd` but no backward rule: implement "
        "`vjp_bwd_retval(self, res, g)` or `vjp_bwd(self, res, g, *accums)`")

  def vjp_bwd(self, res, g, *arg_accums):
    """Backward pass pushing cotangents into gradient accumulators.

    Receives one `GradAccum` per input (a pytree matching ``in_avals``) and
    calls ``acc.accum(ct)``. Returns None or a dict of backward-pass logs. The
    default calls `vjp_bwd_retval` and accumulates what it returns.
    """
    out = self.vjp_bwd_retval(res, g)
    logs = None
    if self.vjp_bwd_retval_logs:
      out, logs = _split_retval_logs(self, out)
    from hijax.autodiff import accumulate
    accumulate(self, arg_accums, out)
    return logs

  # --- forward mode and linearization --------------------------------------

  def jvp(self, primals, tangents):
    """Forward mode: ``(primals, tangents) -> (out, out_tangent)``."""
    raise NotImplementedError(
        f"{type(self).__name__} has no forward-mode rule: implement "
        "`jvp(self, primals, tangents)`, or derive it from `lin`/`linearized` "
        "with `jvp = jvp_from_lin` in the class body")

  def lin(self, nzs_in, *args):
    """Linearization: returns ``(out, residuals)`` like `vjp_fwd`."""
    raise NotImplementedError(
        f"{type(self).__name__} has no linearization rule: implement "
        "`lin(self, nzs_in, *args)` and `linearized(self, res, *tangents)`, or "
        "derive them with `lin, linearized = linearize_from_jvp`")

  def linearized(self, res, *tangents):
    """The linear map of `lin`: ``(res, *tangents) -> out_tangent``."""
    raise NotImplementedError(
        f"{type(self).__name__} has `lin` but no `linearized(self, res, "
        "*tangents)`")

  def transpose(self, ct, *maybe_accums):
    """Transpose rule for a primitive linear in some inputs.

    Linear inputs arrive as `GradAccum` objects to ``accum`` into; the others
    as values. Returns None or a dict of backward-pass logs.
    """
    raise NotImplementedError(
        f"{type(self).__name__} is being transposed but has no transpose rule: "
        "implement `transpose(self, ct, *maybe_accums)`")

  # --- batching -------------------------------------------------------------

  def batch_dim_rule(self, axis_data, in_dims):
    """Returns the output's batch dimension given the inputs' (None: unbatched).

    The batched computation is then derived by ``vmap``-ing the other rules.
    """
    raise NotImplementedError(
        f"{type(self).__name__} has no batching rule: implement "
        "`batch_dim_rule(self, axis_data, in_dims)` (returns the output batch "
        "dimension) or `batch(self, axis_data, args, dims)` (returns the "
        "batched output and its dimension)")

  def batch(self, axis_data, args, dims):
    """Full batching rule: ``(axis_data, args, dims) -> (out, out_dim)``.

    The default derives it from `batch_dim_rule`.
    """
    from hijax.batching import batch_from_dim_rule
    return batch_from_dim_rule(self, axis_data, args, dims)

  # --- dead code elimination and rematerialization ----------------------------

  def dce(self, used_outs, live_ins):
    """Dead-code elimination: ``-> (used_ins, produced_outs, new_prim | None)``.

    ``used_outs`` mirrors ``out_aval`` with booleans. The default keeps the whole
    primitive if any output is used (or it has effects) and drops it otherwise.
    ``live_ins`` is None on JAX versions that do not report it.
    """
    del live_ins
    if any(jax.tree.leaves(used_outs)) or self.effects:
      return True, True, self
    return False, False, None

  def remat(self, trace, *args):
    """Rematerialization under ``jax.checkpoint`` (with ``jax_remat3``).

    Returns ``(out, res, rem)``: ``res`` is saved, and ``rem(res, *args)``
    recomputes ``out`` in the backward pass. The default saves nothing and
    recomputes the whole primitive.
    """
    del trace
    return self(*args), (), lambda _, *args: self(*args)

  # --- binding ----------------------------------------------------------------

  def __call__(self, *args):
    args_flat = self.check_args(args)
    outs = self._primitive.bind(*args_flat, _prim=self)
    return outs[0] if self._single_output else jax.tree.unflatten(
        self.out_tree, outs)

  def check_args(self, args) -> list:
    """Flattens ``args`` and checks them against ``in_avals`` (TypeError if not)."""
    if len(args) != len(self.in_avals):
      raise TypeError(
          f"{type(self).__name__} takes {len(self.in_avals)} positional "
          f"argument(s), one per entry of in_avals, but got {len(args)}")
    if self._args_are_leaves:
      args_flat = args  # a non-array argument fails in `typeof` below
    else:
      args_flat, tree = jax.tree.flatten(args)
      if tree != self.in_tree:
        raise TypeError(
            f"{type(self).__name__}: the arguments have pytree structure "
            f"{tree}, but in_avals has structure {self.in_tree}")
    convert = False
    for x, expected in zip(args_flat, self.in_avals_flat):
      if getattr(x, "aval", None) is expected:
        continue  # the common case, without typeof's sharding lookup
      try:
        actual = core.typeof(x)
      except TypeError:
        raise _argument_type_error(self, args) from None
      if actual is not expected and not core.typematch(actual, expected):
        raise _argument_type_error(self, args)
      convert = convert or not isinstance(x, _JAX_VALUES)
    if convert:
      # NumPy arrays and Python scalars become JAX arrays, as for any JAX
      # operation: `expand` then computes (and returns) what it does under jit.
      args_flat = [x if isinstance(x, _JAX_VALUES) or not isinstance(
          core.typeof(x), core.ShapedArray) else jnp.asarray(x)
                   for x in args_flat]
    return args_flat

  def __repr__(self):
    return f"{type(self).__name__}{_pp_params(self)}"

  def __getattr__(self, name):
    # Reached only when ordinary lookup fails: an attribute that
    # `HiPrim.__init__` sets is missing when a subclass forgot to call it.
    if name in _SET_BY_INIT:
      raise AttributeError(
          f"{type(self).__name__}.__init__ did not call super().__init__(): "
          "set self.in_avals, self.out_aval and self.params, then call "
          "`super().__init__()` at the end of __init__")
    raise AttributeError(
        f"{type(self).__name__!r} object has no attribute {name!r}")

  def __hash__(self):
    return self._hash

  def __eq__(self, other):
    return self is other or (isinstance(other, HiPrim)
                             and self._key == other._key)


_JAX_VALUES = (jax.Array, core.Tracer)

_SET_BY_INIT = frozenset({
    "_key", "_hash", "in_avals_flat", "in_tree", "out_avals_flat", "out_tree",
    "_args_are_leaves", "_single_output"})


def _owner(cls, name) -> type:
  return next(c for c in cls.__mro__ if name in c.__dict__)


def _check_backward_rules(cls):
  """Rejects a class whose `vjp_bwd_retval` would never be called.

  The default `HiPrim.vjp_bwd` is what calls `vjp_bwd_retval`, so a `vjp_bwd`
  defined in the same class, or in a subclass of the one defining
  `vjp_bwd_retval`, hides it. (A subclass may replace an inherited
  `vjp_bwd_retval` with its own `vjp_bwd`.)
  """
  bwd, retval = _owner(cls, "vjp_bwd"), _owner(cls, "vjp_bwd_retval")
  if bwd is HiPrim or retval is HiPrim:
    return
  if cls.__mro__.index(retval) <= cls.__mro__.index(bwd):
    name = cls.__name__
    raise TypeError(
        f"{name}.vjp_bwd (from {bwd.__name__}) and {name}.vjp_bwd_retval "
        f"(from {retval.__name__}) are both defined, so vjp_bwd_retval would "
        "never be called: reverse mode calls vjp_bwd. Define only one "
        "backward rule: vjp_bwd_retval(self, res, g) returning cotangents, or "
        "vjp_bwd(self, res, g, *accums) accumulating them")


def _reserved_names(cls) -> frozenset:
  """Names a param may not take: methods and HiPrim's own attributes.

  Params become instance attributes, which would shadow them.
  """
  methods = {n for n in dir(cls) if callable(getattr(cls, n, None))
             or isinstance(inspect.getattr_static(cls, n, None), property)}
  own = {"in_avals", "out_aval", "params", "effects", "vjp_bwd_retval_logs"}
  return frozenset(methods | own | _SET_BY_INIT)


def _param_name_error(prim, key) -> TypeError:
  name = type(prim).__name__
  if type(key) is not str:
    return TypeError(
        f"{name}.params keys must be strings (each param becomes an "
        f"attribute of the instance), got {key!r}")
  what = ("method" if callable(getattr(type(prim), key, None))
          else "attribute")
  return TypeError(
      f"{name}.params[{key!r}] would shadow the {what} {name}.{key} (each "
      "param becomes an attribute of the instance): rename the param")


def _missing_attribute_error(prim) -> AttributeError:
  missing = next(a for a in ("in_avals", "out_aval", "params")
                 if not hasattr(prim, a))
  return AttributeError(
      f"{type(prim).__name__}.__init__ must set `self.{missing}` before "
      "calling `super().__init__()`")


def _effect_set(prim) -> frozenset:
  """``prim.effects`` as a frozenset, from any collection of effects."""
  effects = prim.effects
  if isinstance(effects, frozenset) and all(
      isinstance(e, jax_effects.Effect) for e in effects):
    return effects
  if (isinstance(effects, Collection) and not isinstance(effects, str)
      and all(isinstance(e, jax_effects.Effect) for e in effects)):
    return frozenset(effects)
  raise TypeError(
      f"{type(prim).__name__}.effects must be a collection (e.g. a set) of JAX "
      f"effects, got {effects!r:.80}; write `self.effects = {{effect}}`")


def _unhashable_error(prim) -> TypeError:
  """Names the param or type that made ``hash(prim)`` fail."""
  name = type(prim).__name__
  for key, value in prim.params.items():
    if not _hashable(value):
      return TypeError(
          f"{name}.params[{key!r}] is a {type(value).__name__}, which is not "
          "hashable. Params are static and must be hashable (use a tuple "
          "instead of a list, or pass array data as an input)")
  for attr, avals in (("in_avals", prim.in_avals_flat),
                      ("out_aval", prim.out_avals_flat)):
    for aval in avals:
      if not _hashable(aval):
        return TypeError(
            f"{name}.{attr} contains the type {type(aval).__name__}, which is "
            "not hashable: write a hi type as a frozen dataclass")
  return TypeError(f"{name}: its effects must be hashable")


def _hashable(x) -> bool:
  try:
    hash(x)
  except TypeError:
    return False
  return True


def _split_retval_logs(prim, out):
  # The logs are None or a dict; a second entry that is neither is a cotangent
  # of a two-input primitive whose rule forgot the logs.
  if not (isinstance(out, tuple) and len(out) == 2
          and (out[1] is None or type(out[1]) is dict)):
    raise TypeError(
        f"{type(prim).__name__}.vjp_bwd_retval returned {_describe(out)}, but "
        "the class sets vjp_bwd_retval_logs = True, so vjp_bwd_retval must "
        "return a pair (cotangents, logs) with logs None or a dict: return "
        "`(cts, logs)`, or remove `vjp_bwd_retval_logs = True`")
  return out


def _describe(x) -> str:
  if isinstance(x, (tuple, list)):
    return f"a {type(x).__name__} of length {len(x)}"
  return f"a {type(x).__name__}"


def _flatten_types(name, attr, tree):
  # Fast paths for the common cases, a single type or a tuple of types.
  if isinstance(tree, AbstractValue):
    return [tree], _LEAF
  if type(tree) is tuple:
    for t in tree:
      if not isinstance(t, AbstractValue):
        break
    else:
      return list(tree), _tuple_of_leaves(len(tree))
  leaves, treedef = tree_util.tree_flatten(tree)
  for leaf in leaves:
    if not isinstance(leaf, AbstractValue):
      raise TypeError(
          f"{name}.{attr} must contain types (e.g. jax.typeof(x) or "
          f"ShapedArray(shape, dtype)), but contains a {type(leaf).__name__}: "
          f"{leaf!r:.80}")
  return leaves, treedef


_LEAF = tree_util.tree_structure(0)


@functools.cache
def _tuple_of_leaves(n):
  return tree_util.tree_structure((0,) * n)


def _argument_type_error(prim, args) -> TypeError:
  """Names the first argument (and pytree path) whose type is not declared."""
  expected_leaves = jax.tree_util.tree_flatten_with_path(prim.in_avals)[0]
  actual_leaves = jax.tree_util.tree_flatten_with_path(args)[0]
  if len(expected_leaves) != len(actual_leaves):
    return TypeError(
        f"{type(prim).__name__}: the arguments have pytree structure "
        f"{jax.tree.structure(args)}, but in_avals has structure {prim.in_tree}")
  for (path, expected), (_, x) in zip(expected_leaves, actual_leaves):
    position = str(path[0].idx) + jax.tree_util.keystr(path[1:])
    try:
      actual = core.typeof(x)
    except TypeError:
      return TypeError(
          f"{type(prim).__name__}: argument {position} is a {type(x).__name__}, "
          f"not a JAX value; in_avals declares {expected.str_short()}")
    if not core.typematch(actual, expected):
      return TypeError(
          f"{type(prim).__name__}: argument {position} has type "
          f"{actual.str_short()}, but in_avals declares "
          f"{expected.str_short()}. Build the primitive from the arguments' "
          "types, e.g. with jax.typeof")
  raise AssertionError("no mismatching argument")


def _pp_params(prim) -> str:
  shown = {k: v for k, v in prim.params.items() if not k.startswith("_")}
  if not shown:
    return ""
  return "[" + " ".join(f"{k}={_short(v)}" for k, v in shown.items()) + "]"


def _short(v) -> str:
  if callable(v) and hasattr(v, "__name__"):
    return v.__name__
  if isinstance(v, core.AbstractValue):
    return v.str_short()
  return str(v)


# --- the JAX primitive behind each subclass -------------------------------------

def _new_primitive(name):
  p = jax.extend.core.Primitive(name)
  p.multiple_results = True
  return p


# The one param of a primitive's equations is the HiPrim instance, named `_prim`
# (as in JAX's own hijax): JAX calls a checkpoint policy as
# ``policy(primitive, *avals, **params)``, whose first parameter is ``prim``.
def taking_prim(rule):
  """Adapts ``rule(*args, prim=...)`` to JAX's call with the equation's params."""
  return lambda *args, _prim: rule(*args, prim=_prim)


def _install_core_rules(cls):
  p = cls._primitive
  p.skip_canonicalization = True
  p.is_high = lambda *avals, _prim: True
  p.is_effectful = lambda params: bool(params["_prim"].effects)
  p.def_effectful_abstract_eval(
      lambda *avals, _prim: (_prim.out_avals_flat, _prim.effects))
  p.to_lojax = _expand_flat
  pe.custom_staging_rules[p] = _stage
  core.custom_typechecks[p] = _typecheck
  core.pp_eqn_rules[p] = _pp_eqn
  _compat.register_dce_rule(p, _dce)
  _compat.register_remat_rule(p, _remat)


RULE_INSTALLERS.append(_install_core_rules)


def _expand_flat(*args_flat, _prim):
  prim = _prim
  if prim._args_are_leaves:
    out = prim.expand(*args_flat)
  else:
    out = prim.expand(*jax.tree.unflatten(prim.in_tree, args_flat))
  out_flat = flatten_output(prim, "expand", out)
  # Eagerly the returned value is the result; under jit the declared type is.
  return _checks.conform_outputs(prim, "expand", prim.out_avals_flat, out_flat)


def flatten_output(prim, method, out) -> list:
  """Flattens what ``prim.method`` returned, checking it against ``out_aval``."""
  out_flat, tree = jax.tree.flatten(out)
  if tree != prim.out_tree:
    raise TypeError(
        f"{type(prim).__name__}.{method} returned a value with structure "
        f"{tree}, but out_aval has structure {prim.out_tree}")
  return out_flat


def _stage(trace, source_info, *args_flat, _prim):
  trace.frame.is_high = True  # the jaxpr must be lowered with `expand`
  return trace.default_process_primitive(
      _prim._primitive, args_flat, dict(_prim=_prim), source_info)


def _typecheck(_ctx_factory, *in_atoms, _prim):
  prim = _prim
  for i, (atom, expected) in enumerate(zip(in_atoms, prim.in_avals_flat)):
    if not core.typematch(atom.aval, expected):
      raise TypeError(
          f"{type(prim).__name__}: jaxpr input {i} has type "
          f"{atom.aval.str_short()}, expected {expected.str_short()}")
  return prim.out_avals_flat, prim.effects


def _pp_eqn(eqn, context, settings):
  prim = eqn.params["_prim"]
  lhs = core.pp_vars(eqn.outvars, context, print_shapes=settings.print_shapes,
                     is_binder=True)
  rhs = pp.text(type(prim).__name__ + _pp_params(prim) + " ") + core.pp_vars(
      eqn.invars, context)
  return pp.concat([lhs, pp.text(" = "), rhs]) if eqn.outvars else rhs


def _dce(used_outs_flat, live_ins_flat, eqn):
  prim = eqn.params["_prim"]
  used_outs = jax.tree.unflatten(prim.out_tree, used_outs_flat)
  live_ins = (None if live_ins_flat is None
              else jax.tree.unflatten(prim.in_tree, live_ins_flat))
  used_ins, produced_outs, new_prim = prim.dce(used_outs, live_ins)
  if new_prim is None:
    return [False] * len(eqn.invars), None
  used_ins_flat = _broadcast_flags(prim, "dce", "used inputs", used_ins,
                                   prim.in_tree)
  produced_flat = _broadcast_flags(prim, "dce", "produced outputs",
                                   produced_outs, prim.out_tree)
  if new_prim is prim and all(used_ins_flat) and all(produced_flat):
    return used_ins_flat, eqn
  new_eqn = eqn.replace(
      primitive=new_prim._primitive,
      invars=[v for v, u in zip(eqn.invars, used_ins_flat) if u],
      outvars=[v for v, u in zip(eqn.outvars, produced_flat) if u],
      params=dict(_prim=new_prim))
  return used_ins_flat, new_eqn


def _broadcast_flags(prim, method, what, flags, treedef) -> list[bool]:
  """Broadcasts a pytree prefix of booleans to the leaves of ``treedef``."""
  return api.tuptree_flags(flags, treedef, what,
                           f"the {what} returned by {type(prim).__name__}.{method}")


def _remat(trace, *args_flat, _prim):
  prim = _prim
  args = jax.tree.unflatten(prim.in_tree, args_flat)
  out, res, rem = prim.remat(trace, *args)

  def rem_flat(res, *args_flat):
    args = jax.tree.unflatten(prim.in_tree, args_flat)
    return flatten_output(prim, "remat", rem(res, *args))
  return flatten_output(prim, "remat", out), res, rem_flat
