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
run once per subclass, listed in `RULE_INSTALLERS`. The core rules (lowering,
staging, type check, printing, DCE, remat; `hijax._core_rules`) come first; each
rule module appends its own installer when it is imported.

Imports: this is the foundation of the rule modules. It imports only the
private modules below it (`hijax._checks`, `hijax._compat`,
`hijax._declaration`, `hijax._cotangents`, `hijax._core_rules`), never
`hijax.autodiff`, `hijax.batching`, `hijax.derived` or `hijax.remat`, which
import it. A default that needs a rule module (the `HiPrim.batch` derived from
`HiPrim.batch_dim_rule`) is looked up in `DEFAULT_RULES`, which that module
fills.
"""
from __future__ import annotations

import copyreg
import os
import sys
from collections.abc import Callable, Collection, Sequence
from typing import Any

import jax
import jax.extend  # noqa: F401  (jax.extend.core.Primitive)
import jax.numpy as jnp
from jax.extend import source_info_util

from jax.experimental.hijax import ValAccum

from hijax._core_rules import (JAX_VALUES, flatten_output,  # noqa: F401
                               format_params, install_core_rules,
                               new_primitive, taking_prim)
from hijax._cotangents import accumulate
from hijax._internals import core
from hijax._internals import traceback_util
from hijax._declaration import (SET_BY_INIT, argument_type_error,
                                captured_tracer, captured_tracer_error,
                                check_backward_rules, effect_set,
                                falsy_method, flatten_types, hook_flags,
                                missing_attribute_error, missing_jvp_fix,
                                owner, param_name_error, reserved_names,
                                split_retval_logs, unhashable_error)

# Like JAX's own frames, hijax's are hidden from user tracebacks and skipped
# in JAX's source information (the "user frame" of an equation, which
# residual reports and jaxpr locations show), so both point at the user's code.
traceback_util.register_exclusion(os.path.dirname(__file__))
source_info_util.register_exclusion(os.path.dirname(__file__) + os.sep)

__all__ = ["HiPrim", "VJPHiPrimitive", "RULE_INSTALLERS", "DEFAULT_RULES"]

RULE_INSTALLERS: list[Callable[[type[HiPrim]], None]] = [install_core_rules]
"""Functions ``install(cls)`` run for each new `HiPrim` subclass."""

DEFAULT_RULES: dict[str, Callable[..., Any]] = {}
"""Default rules defined in a rule module, by method name.

A rule module fills its entry next to its installer when it is imported
(`hijax.batching` sets ``"batch"``), so that `HiPrim` reaches the default
without importing the module above it. ``import hijax`` imports them all.
"""


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
  ``params`` and ``effects`` (any collection of JAX effects) are equal. (JAX's
  own ``HiPrim`` does not compare the types; hijax does, so that two
  applications are never confused under ``jit``.)

  The only required method is `expand`, the implementation in ordinary JAX
  operations. The other methods are rules for transformations, each optional
  until the transformation is used: `vjp_fwd` with `vjp_bwd_retval` or
  `vjp_bwd` (reverse mode), `jvp` (forward mode), `lin` with `linearized`
  (``jax.linearize``), `batch_dim_rule` or `batch` (``vmap``), `transpose`
  (linear primitives), `dce` and `remat`. The hooks `check`, `staging` and
  `pp_params` and the flag `skip_linearization_on_zero_tangents` do what they
  do in ``jax.experimental.hijax``; a rule whose form changed between JAX
  releases (`vjp_bwd_retval_logs`, `dce`, `remat`) may take either form.
  `VJPHiPrimitive`, the class's name in JAX's earlier API, is the same class.

  For type checkers, a rule that takes a variable number of arguments is
  declared ``(self, ..., *args: Any, **kwargs: Any)``, the form they read as
  "any parameters", so an override may name its own (``expand(self, x)``,
  ``vjp_fwd(self, nzs_in, x, y)``); the other rules' parameters are
  positional-only, so an override may rename them. hijax passes no keyword
  arguments to a rule.
  """

  in_avals: tuple[Any, ...]
  out_aval: Any
  params: dict[str, Any]
  effects: Collection[Any] = frozenset()
  # Set by `HiPrim.__init__` from in_avals and out_aval.
  in_avals_flat: list[Any]
  in_tree: Any  # a jax.tree_util.PyTreeDef
  out_avals_flat: list[Any]
  out_tree: Any

  def _jet_subject(self) -> HiPrim:
    """The primitive whose `jet_from_expand` decides (a wrapper's inner one)."""
    return self

  def _derivative_rules(self) -> list[str]:
    """The derivative rules (``jvp``, ``lin``, ``vjp_fwd``) the class defines."""
    return [m for m in ("jvp", "lin", "vjp_fwd")
            if owner(type(self), m) is not HiPrim]

  # Filled in by `__init_subclass__`.
  _primitive: jax.extend.core.Primitive
  _linearized_primitive: jax.extend.core.Primitive
  _has_check: bool = False  # (these three: by `hook_flags`)
  _has_staging: bool = False
  _dce_takes_live_ins: bool = True

  def __init_subclass__(cls, **kwargs: Any) -> None:
    super().__init_subclass__(**kwargs)
    # Which hooks the class overrides and which form of `dce` it uses; a hook
    # hijax cannot honour (`physicalize`) is refused here.
    hook_flags(cls, HiPrim)
    cls._primitive = new_primitive(cls.__name__)
    cls._linearized_primitive = new_primitive(f"{cls.__name__}.linearized")
    check_backward_rules(cls, HiPrim)
    cls._reserved_names = reserved_names(cls)
    for install in RULE_INSTALLERS:
      install(cls)

  def __init__(self) -> None:
    try:
      in_avals, params = self.in_avals, self.params
      self.out_aval  # noqa: B018 - only checking that it is set
    except AttributeError:
      raise missing_attribute_error(self) from None
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
        raise param_name_error(self, key)
    self.in_avals = tuple(self.in_avals)
    self.in_avals_flat, self.in_tree, in_kind = flatten_types(
        name, "in_avals", self.in_avals)
    self.out_avals_flat, self.out_tree, out_kind = flatten_types(
        name, "out_aval", self.out_aval)
    if self.effects or type(self.effects) is not frozenset:
      self.effects = effect_set(self)
    # Two instances are interchangeable (JAX caches abstract evaluation and
    # tracing on them) exactly when their types, params and effects agree
    # (`_key`). Hashing the types is left until JAX first asks (an eager call
    # never does); params are checked to be hashable now.
    params_key = ()
    if params:
      try:
        params_key = frozenset(params.items())
        hash(params_key)
      except TypeError:
        raise unhashable_error(self) from None
      captured = captured_tracer(params)
      if captured is not None:
        raise captured_tracer_error(self, *captured)
    self._params_key = params_key
    self._hash = None
    self.__dict__.update(self.params)
    # Fast paths for the common case: array arguments and a single output.
    self._args_are_leaves = in_kind == "tuple"
    self._single_output = out_kind == "leaf"
    if self._has_check:
      self.check(*self.in_avals)

  # --- the implementation -------------------------------------------------

  def expand(self, *args: Any, **kwargs: Any) -> Any:
    """The implementation, in ordinary JAX operations on ``args``.

    Runs on every eager call and is traced once when a jaxpr containing the
    primitive is lowered (e.g. under ``jit``).
    """
    raise NotImplementedError(
        f"{type(self).__name__} must implement `expand(self, *args)`, the "
        "primitive's implementation in ordinary JAX operations")

  # --- reverse mode -------------------------------------------------------

  def vjp_fwd(self, nzs_in: Any, /, *args: Any, **kwargs: Any) -> Any:
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

  def vjp_bwd_retval(self, res: Any, g: Any, /) -> Any:
    """Backward pass returning one cotangent per input (None for zero)."""
    raise NotImplementedError(
        f"{type(self).__name__} has `vjp_fwd` but no backward rule: implement "
        "`vjp_bwd_retval(self, res, g)` or `vjp_bwd(self, res, g, *accums)`")

  def vjp_bwd(self, res: Any, g: Any, /, *arg_accums: Any, **kwargs: Any
              ) -> dict[str, Any] | None:
    """Backward pass pushing cotangents into gradient accumulators.

    Receives one `GradAccum` per input (a pytree matching ``in_avals``) and
    calls ``acc.accum(ct)``. Returns None or a dict of backward-pass logs. The
    default calls `vjp_bwd_retval` (or an overriding `vjp_bwd_retval_logs`)
    and accumulates what it returns.
    """
    form = self.vjp_bwd_retval_logs
    if not form:  # neither the flag nor an overriding method
      accumulate(self, arg_accums, self.vjp_bwd_retval(res, g))
      return None
    method = self._retval_rule()
    out = self.vjp_bwd_retval(res, g) if form is True else form(res, g)
    out, logs = split_retval_logs(self, out, method)
    accumulate(self, arg_accums, out, method)
    return logs

  @falsy_method
  def vjp_bwd_retval_logs(self, res: Any, g: Any, /) -> Any:
    """Backward pass returning ``(cotangents, logs)``, logs None or a dict.

    Two forms. Override this method (as in jax 0.11.2 and 0.12) to return
    the cotangents together with the logs; or set ``vjp_bwd_retval_logs =
    True`` in the class body (as in JAX's earlier ``VJPHiPrimitive``) to say
    that `vjp_bwd_retval` itself returns the pair. By default it returns
    ``(vjp_bwd_retval(res, g), None)``, or, for a class that overrides
    `vjp_bwd`, runs that with value accumulators; read as a boolean it is
    then False.
    """
    if type(self).vjp_bwd is not HiPrim.vjp_bwd:
      accums = [ValAccum(getattr(a, "inner_aval", a).to_ct_aval())
                for a in self.in_avals_flat]
      logs = self.vjp_bwd(res, g, *jax.tree.unflatten(self.in_tree, accums))
      return jax.tree.unflatten(self.in_tree, [a.freeze() for a in accums]), logs
    return self.vjp_bwd_retval(res, g), None

  def _retval_rule(self) -> str:
    """The rule whose cotangents the default `vjp_bwd` accumulates."""
    form = self.vjp_bwd_retval_logs
    return "vjp_bwd_retval_logs" if form and form is not True else "vjp_bwd_retval"

  # --- forward mode and linearization --------------------------------------

  def jvp(self, primals: Any, tangents: Any, /) -> Any:
    """Forward mode: ``(primals, tangents) -> (out, out_tangent)``."""
    raise NotImplementedError(f"{type(self).__name__} has no forward-mode "
                              f"rule: {missing_jvp_fix(type(self), HiPrim)}")

  def lin(self, nzs_in: Any, /, *args: Any, **kwargs: Any) -> Any:
    """Linearization: returns ``(out, residuals)`` like `vjp_fwd`."""
    raise NotImplementedError(
        f"{type(self).__name__} has no linearization rule: implement "
        "`lin(self, nzs_in, *args)` and `linearized(self, res, *tangents)`, or "
        "derive them with `lin, linearized = linearize_from_jvp`")

  def linearized(self, res: Any, /, *tangents: Any, **kwargs: Any) -> Any:
    """The linear map of `lin`: ``(res, *tangents) -> out_tangent``."""
    raise NotImplementedError(
        f"{type(self).__name__} has `lin` but no `linearized(self, res, "
        "*tangents)`")

  def transpose(self, ct: Any, /, *maybe_accums: Any, **kwargs: Any
                ) -> dict[str, Any] | None:
    """Transpose rule for a primitive linear in some inputs.

    Linear inputs arrive as `GradAccum` objects to ``accum`` into; the others
    as values. Returns None or a dict of backward-pass logs.
    """
    raise NotImplementedError(
        f"{type(self).__name__} is being transposed but has no transpose rule: "
        "implement `transpose(self, ct, *maybe_accums)`")

  # --- batching -------------------------------------------------------------

  def batch_dim_rule(self, axis_data: Any, in_dims: Any, /) -> Any:
    """Returns the output's batch dimension given the inputs' (None: unbatched).

    The batched computation is then derived by ``vmap``-ing the other rules.
    """
    raise NotImplementedError(
        f"{type(self).__name__} has no batching rule: implement "
        "`batch_dim_rule(self, axis_data, in_dims)` (returns the output batch "
        "dimension) or `batch(self, axis_data, args, dims)` (returns the "
        "batched output and its dimension)")

  def batch(self, axis_data: Any, args: Any, dims: Any, /) -> Any:
    """Full batching rule: ``(axis_data, args, dims) -> (out, out_dim)``.

    The default derives it from `batch_dim_rule`.
    """
    return DEFAULT_RULES["batch"](self, axis_data, args, dims)

  # --- dead code elimination and rematerialization ----------------------------

  def dce(self, used_outs: Any, live_ins: Any, /) -> Any:
    """Dead-code elimination: ``-> (used_ins, produced_outs, new_prim | None)``.

    ``used_outs`` mirrors ``out_aval`` with booleans. The default keeps the whole
    primitive if any output is used (or it has effects) and drops it otherwise.
    ``live_ins`` is None on JAX versions that do not report it. An override
    may take ``(used_outs)`` alone, as in jax 0.11.2, on any JAX version.
    """
    del live_ins
    if any(jax.tree.leaves(used_outs)) or self.effects:
      return True, True, self
    return False, False, None

  def remat(self, trace: Any, /, *args: Any, **kwargs: Any) -> Any:
    """Rematerialization under ``jax.checkpoint`` (with ``jax_remat3``).

    Returns ``(out, res, rem)``: ``res`` is saved, and ``rem(res, *args)``
    recomputes ``out`` in the backward pass (jax 0.12's form); or ``(out,
    rem)`` with ``rem(*args)`` (jax 0.11.2's), on any JAX version. The default
    saves nothing and recomputes the whole primitive.
    """
    del trace
    return self(*args), (), lambda _, *args: self(*args)

  # --- checking, staging and printing ------------------------------------------

  def check(self, *in_avals: Any) -> None:
    """Validation of the argument types, to raise on a misuse; by default none.

    Called with ``in_avals`` at the end of `HiPrim.__init__` and again when
    JAX type-checks a jaxpr containing the primitive (``jax_enable_checks``).
    """

  def staging(self, trace: Any, source_info: Any, /, *args: Any) -> Any:
    """How ``jit`` (any staging trace) records an application; returns the
    output. The default records one equation of the primitive; an override
    may record something else (``self.expand(*args)``, say), traced into
    ``trace``, as JAX's own ``HiPrim.staging`` may."""
    outs = trace.default_process_primitive(
        self._primitive, jax.tree.leaves(args), dict(_prim=self), source_info)
    return jax.tree.unflatten(self.out_tree, outs)

  def pp_params(self) -> dict[str, Any]:
    """The params a jaxpr and ``repr`` show: by default those not starting with ``_``."""
    return {k: v for k, v in self.params.items() if not k.startswith("_")}

  # --- flags --------------------------------------------------------------------

  skip_linearization_on_zero_tangents: bool = False
  """Set to True to skip `vjp_fwd` (and `lin`) when no input has a nonzero
  tangent: the primitive is then applied as it is and its output tangents
  are zeros (as in JAX's own ``HiPrim``). A derived rule
  (`linearize_from_jvp`, `vjp_from_lin`, `vjp_from_jvp`) is skipped there
  whatever this says (JAX's own module runs it)."""

  jet_from_expand: bool = False
  """Set to True to let ``jax.experimental.jet`` (Taylor mode) differentiate
  `expand`. jet cannot apply the primitive's rules, so without this it raises
  a TypeError: the series of `expand` can disagree with a rule that is not
  `expand`'s derivative (straight-through, or safe at a singularity)."""

  # --- binding ----------------------------------------------------------------

  def __call__(self, *args: Any) -> Any:
    args_flat = self.check_args(args)
    outs = self._primitive.bind(*args_flat, _prim=self)
    return outs[0] if self._single_output else jax.tree.unflatten(
        self.out_tree, outs)

  def check_args(self, args: tuple[Any, ...]) -> Sequence[Any]:
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
        raise argument_type_error(self, args) from None
      if actual is not expected and not core.typematch(actual, expected):
        raise argument_type_error(self, args)
      convert = convert or not isinstance(x, JAX_VALUES)
    if convert:
      # NumPy arrays and Python scalars become JAX arrays, as for any JAX
      # operation: `expand` then computes (and returns) what it does under jit.
      args_flat = [x if isinstance(x, JAX_VALUES) or not isinstance(
          core.typeof(x), core.ShapedArray) else jnp.asarray(x)
                   for x in args_flat]
    return args_flat

  def __repr__(self) -> str:
    return f"{type(self).__name__}{format_params(self)}"

  def __getattr__(self, name: str) -> Any:
    # Reached only when ordinary lookup fails: an attribute that
    # `HiPrim.__init__` sets is missing when a subclass forgot to call it.
    if name in SET_BY_INIT:
      raise AttributeError(
          f"{type(self).__name__}.__init__ did not call super().__init__(): "
          "set self.in_avals, self.out_aval and self.params, then call "
          "`super().__init__()` at the end of __init__")
    raise AttributeError(
        f"{type(self).__name__!r} object has no attribute {name!r}")

  def __hash__(self) -> int:
    if self._hash is None:
      # A tuple of array types (or one output type) implies its tree.
      ins = (self.in_avals if self._args_are_leaves
             else (self.in_tree, tuple(self.in_avals_flat)))
      out = (self.out_aval if self._single_output
             else (self.out_tree, tuple(self.out_avals_flat)))
      self._key = (type(self), ins, out, self._params_key, self.effects)
      try:
        self._hash = hash(self._key)
      except TypeError:
        raise unhashable_error(self) from None
    return self._hash

  def __eq__(self, other: object) -> bool:
    return self is other or (isinstance(other, HiPrim)
                             and hash(self) == hash(other)
                             and self._key == other._key)

  def __getstate__(self) -> dict[str, Any]:
    # The cached hash is of this process (string hashes differ between
    # processes): a copy, pickled or deep-copied, computes its own.
    state = dict(self.__dict__)
    state.pop("_key", None)
    state["_hash"] = None
    return state


# JAX's array types hold a layout that is a singleton compared by identity,
# which pickle copies into a second, unequal object: an unpickled ShapedArray
# (and so an unpickled primitive) would differ from the original. Pickle it by
# name instead, so that it unpickles as the singleton itself.
_AUTO_LAYOUT = core.ShapedArray((), jnp.float32).layout
if getattr(sys.modules.get(type(_AUTO_LAYOUT).__module__), "AutoLayout",
           None) is _AUTO_LAYOUT:
  copyreg.pickle(type(_AUTO_LAYOUT), lambda _: "AutoLayout")


VJPHiPrimitive = HiPrim
"""The name of `HiPrim` in JAX's development API until jax 0.11.1 (2026)."""
