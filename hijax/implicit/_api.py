"""The public functions of `hijax.implicit`: `fixed_point`, `root` and
`linear_solve`, their argument checks and the cache of eager calls.

Called on concrete values (eagerly, as in a notebook), each function runs a
``jax.jit`` of itself whose static arguments are the keys of the functions,
the solvers and ``throw`` (`hijax._function_key`: code and the values
read, not the objects), and whose inputs include the arrays the function
captures: the second call of the same code with the same argument types,
even of a new lambda, compiles and traces nothing. Under ``grad``, ``jvp``, ``jacfwd`` or ``vmap``
applied eagerly, it calls that same ``jax.jit``, so the rules' work runs as a
few compiled programs rather than op by op (an eager ``grad`` of a scalar
solve: 3 compilations instead of about 60). Under ``jit`` or ``make_jaxpr``
it binds the primitive directly, and the jaxpr shows it.
"""
from __future__ import annotations

from typing import Any

import dataclasses
import functools
import inspect
from collections.abc import Callable

import jax
import jax.numpy as jnp

from hijax._internals import ad, batching, core
from hijax._util import store_bounded
from hijax.closure import closure_convert_params
from hijax._function_key import Uncacheable, by_identity, split
from hijax.implicit._dense import Dense
from hijax.implicit._linear import MatMul
from hijax.implicit._matrix import matrix_matvec
from hijax.implicit._nonlinear import FixedPointIteration, Newton
from hijax.implicit._primitives import (FixedPoint, LinearSolve, Root, _avals,
                                        _name)
from hijax.implicit._status import SolveError, quiet_solve_errors

__all__ = ["fixed_point", "root", "linear_solve"]

_CONVENTION = ("hijax.implicit calls it as `{arg}(x, params)`: the unknown "
               "first, then everything it depends on in one pytree")


def _strong(tree: Any) -> Any:
  """Arrays of ``tree``'s canonical dtypes, without weak types; integer and
  boolean leaves become floating point (the unknowns are real numbers)."""
  def convert(x: Any) -> Any:
    dtype = jnp.result_type(x)
    if not jnp.issubdtype(dtype, jnp.inexact):
      dtype = jnp.result_type(float)
    return jnp.asarray(x, dtype=dtype)
  return jax.tree.map(convert, tree)


def _takes_two(fn: Any) -> bool:
  try:
    inspect.signature(fn).bind(None, None)
  except TypeError:
    return False
  except ValueError:  # no signature (a builtin): let the call decide
    pass
  return True


def _tracer_inside(obj: Any, depth: Any=0) -> bool:
  """Whether ``obj`` (a solver) holds a tracer in its fields or closure."""
  if isinstance(obj, core.Tracer):
    return True
  if depth > 3:
    return False
  if isinstance(obj, (list, tuple)):
    return any(_tracer_inside(o, depth + 1) for o in obj)
  if isinstance(obj, dict):
    return any(_tracer_inside(o, depth + 1) for o in obj.values())
  inner = []
  for cell in getattr(obj, "__closure__", None) or ():
    try:
      inner.append(cell.cell_contents)
    except ValueError:  # an empty cell
      pass
  if isinstance(obj, functools.partial):
    inner += [obj.func, *obj.args, *obj.keywords.values()]
  if dataclasses.is_dataclass(obj):
    inner += [getattr(obj, f.name, None) for f in dataclasses.fields(obj)]
  return any(_tracer_inside(o, depth + 1) for o in inner)


def _check_solver(api: Any, cls, argname: Any, solver: Any, signature: Any) -> Any:
  if not callable(solver):
    raise TypeError(f"hijax.implicit.{api} ({cls}): `{argname}` must be a "
                    f"solver called as {signature}, got a "
                    f"{type(solver).__name__}")
  if _tracer_inside(solver):
    raise TypeError(
        f"hijax.implicit.{api} ({cls}): the `{argname}` ({_name(solver)}) "
        "holds or closes over a traced value. A solver is a static, hashable "
        f"option, called as {signature}: pass traced values in `params` "
        "(they reach the solver as its `params` argument) instead")


def _closure_converted(api: str, argname: str, fn: Any, x: Any, params: Any) -> Any:
  """``(fn, params)``, with the traced arrays ``fn`` captures moved into
  ``params`` (`hijax.closure.closure_convert_params`)."""
  if not callable(fn) or not _takes_two(fn):
    return fn, params  # _check_function says what is wrong
  try:
    jax.eval_shape(fn, x, params)
  except Exception:
    return fn, params  # the call fails: _check_function says how
  try:
    return closure_convert_params(fn, x, params)
  except TypeError as e:
    raise TypeError(f"hijax.implicit.{api}: `{argname}`: {e}") from None


def _check_function(api: str, cls: str, argname: str, fn: Any, x: Any, params: Any,
                    x_name: str) -> Any:
  """Traces ``fn(x, params)``; rejects closed-over tracers and a result whose
  types differ from ``x``'s, with errors naming the function's argument."""
  if not callable(fn):
    raise TypeError(f"hijax.implicit.{api}: `{argname}` must be a function "
                    f"of (x, params), got a {type(fn).__name__}")
  if not _takes_two(fn):
    raise TypeError(
        f"hijax.implicit.{api} ({cls}): `{argname}` ({_name(fn)}) does not "
        f"take two positional arguments; {_CONVENTION.format(arg=argname)}. "
        f"Write it as `def {argname}(x, params): ...` (ignore `params` if "
        "it needs none)")
  try:
    closed, out = jax.make_jaxpr(fn, return_shape=True)(x, params)
  except Exception as e:
    listed = isinstance(x, (list, tuple)) and all(
        getattr(leaf, "ndim", 1) == 0 for leaf in jax.tree.leaves(x))
    hint = (f" `{x_name}` is a Python {type(x).__name__} of scalars, which "
            "is a pytree of separate unknowns: pass `jnp.asarray(...)` for a "
            "vector." if listed else "")
    raise TypeError(
        f"hijax.implicit.{api} ({cls}): calling `{argname}(x, params)` with "
        f"x like `{x_name}` ({jax.tree.map(jax.typeof, x)}) raised "
        f"{type(e).__name__}: {e}.{hint} "
        f"({_CONVENTION.format(arg=argname)}.)") from e
  if any(isinstance(c, core.Tracer) for c in closed.consts):
    raise TypeError(
        f"hijax.implicit.{api} ({cls}): the function passed as `{argname}` "
        f"({_name(fn)}) closes over a traced value, whose derivatives and "
        f"batching the {cls} rules cannot see. Pass that value in `params` "
        f"and read it from the second argument of `{argname}(x, params)` "
        "instead of capturing it")
  want = jax.tree.map(lambda a: (a.shape, a.dtype), _avals(x))
  got = jax.tree.map(lambda a: (a.shape, a.dtype), out)
  if jax.tree.structure(want) != jax.tree.structure(got) or want != got:
    raise TypeError(
        f"hijax.implicit.{api} ({cls}): `{argname}(x, params)` must return "
        f"the shapes and dtypes of x, {want}, but returned {got}")


def _is_concrete(tree: Any) -> bool:
  return not any(isinstance(leaf, core.Tracer)
                 for leaf in jax.tree.leaves(tree))


# The traces whose primal values are computed by the trace below them.
_OVER_PARENT = (ad.JVPTrace, ad.LinearizeTrace, batching.BatchTrace)


def _eager_underneath() -> bool:
  """Whether only ``grad``, ``jvp``, ``linearize`` or ``vmap`` are tracing, over
  eager evaluation (no ``jit``, ``make_jaxpr`` or other trace below them)."""
  trace = core.trace_ctx.trace
  while type(trace) in _OVER_PARENT:
    trace = trace.parent_trace
  return type(trace) is core.EvalTrace


def _eager_cached(impl: Any) -> Any:
  """``impl(fn, x, params, **options)``, compiled once per program when called
  on concrete values or under eager ``grad``, ``jvp`` or ``vmap``
  (`_eager_underneath`); bound directly otherwise.

  The program is keyed by value (`_function_key.split`): ``fn`` by its code
  and what it reads, the JAX arrays it captures passed as inputs, and the
  options (solvers, ``throw``) likewise, so an inline lambda written again
  finds the program compiled for the first one. A function that needs a
  captured array as a constant (``float(a)``, ``if a > 0``) is traced again
  with its arrays as constants, keyed by identity, and remembered."""
  options = [n for n, p in inspect.signature(impl).parameters.items()
             if p.kind is p.KEYWORD_ONLY]

  def traced(fn_spec: Any, arrays: Any, x: Any, params: Any,
             **option_specs: Any) -> Any:
    return impl(fn_spec.rebuild(arrays), x, params,
                **{k: s.rebuild(()) for k, s in option_specs.items()})
  traced.__name__ = impl.__name__.lstrip("_")  # the name jaxprs show
  compiled = jax.jit(traced, static_argnums=0, static_argnames=options)
  needs_constants: dict[Any, None] = {}  # specs whose arrays are constants

  def attempt(spec: Any, arrays: Any, x: Any, params: Any, eager: bool,
              option_specs: Any) -> Any:
    if eager:
      return _raising_solve_errors(lambda: jax.block_until_ready(
          compiled(spec, arrays, x, params, **option_specs)))

    # Wait for the values under the tracers, so that a failed solve raises
    # here, as a SolveError, as it does in an eager call.
    def run() -> Any:
      out = compiled(spec, arrays, x, params, **option_specs)
      jax.block_until_ready(_values_below(out))
      return out
    return _raising_solve_errors(run)

  @functools.wraps(impl)
  def call(fn: Any, x: Any, params: Any, **opts: Any) -> Any:
    eager = _is_concrete((x, params)) and core.trace_state_clean()
    if not (eager or _eager_underneath()):
      return impl(fn, x, params, **opts)
    try:
      # A solver holding a tracer cannot be static: _check_solver names it.
      option_specs = {k: split(v, dynamic=False)[0] for k, v in opts.items()}
      spec, arrays = split(fn)
      if arrays and spec in needs_constants:
        spec, arrays = split(fn, dynamic=False)
    except Uncacheable:
      if not eager:  # a tracer where no input can carry it: unjitted
        return impl(fn, x, params, **opts)
      spec, arrays = by_identity(fn), []
      option_specs = {k: by_identity(v) for k, v in opts.items()}
    try:
      return attempt(spec, arrays, x, params, eager, option_specs)
    except SolveError:
      raise
    except Exception:
      if not arrays:
        raise
    # The trace failed with the captured arrays as inputs: again with them
    # as constants (raising what the function raises, if it fails anyway).
    try:
      constant_spec = split(fn, dynamic=False)[0]
    except Uncacheable:
      return impl(fn, x, params, **opts)
    try:
      out = attempt(constant_spec, [], x, params, eager, option_specs)
    except SolveError:  # it compiled: the solve itself failed
      store_bounded(needs_constants, spec, None, 1024)
      raise
    store_bounded(needs_constants, spec, None, 1024)
    return out
  return call


def _raising_solve_errors(run: Any) -> Any:
  """``run()``, with JAX's runtime error that carries a `SolveError`
  raised on the host turned back into that `SolveError`."""
  try:
    with quiet_solve_errors():
      return run()
  except SolveError:
    raise
  except Exception as e:  # a SolveError raised on the host, wrapped by JAX
    text = str(e)
    if "SolveError: " not in text:
      raise
    raise SolveError(text.split("SolveError: ", 1)[1].splitlines()[0]) \
        from None


def _values_below(tree: Any) -> list[Any]:
  """The arrays held under the tracers of eager ``jvp``, ``linearize`` and
  ``vmap`` (their primal or batched values), computed by the trace below."""
  arrays = []
  for leaf in jax.tree.leaves(tree):
    while isinstance(leaf, core.Tracer):
      leaf = getattr(leaf, "primal", None) if hasattr(leaf, "primal") else (
          getattr(leaf, "val", None))
    if isinstance(leaf, jax.Array):
      arrays.append(leaf)
  return arrays


@_eager_cached
def _fixed_point(f: Any, x0: Any, params: Any, *, solver: Any, linear_solver: Any, throw: Any) -> Any:
  x0 = _strong(x0)
  _check_solver("fixed_point", "FixedPoint", "solver", solver,
                "solver(f, x0, params)")
  _check_solver("fixed_point", "FixedPoint", "linear_solver", linear_solver,
                "linear_solver(matvec, b)")
  f, params = _closure_converted("fixed_point", "f", f, x0, params)
  _check_function("fixed_point", "FixedPoint", "f", f, x0, params, "x0")
  x, st = FixedPoint(_avals(x0), _avals(params), f=f, solver=solver,
                     linear_solver=linear_solver, throw=throw)(x0, params)
  return x if throw else (x, st)


@_eager_cached
def _root(g: Any, x0: Any, params: Any, *, solver: Any, linear_solver: Any, throw: Any) -> Any:
  x0 = _strong(x0)
  _check_solver("root", "Root", "solver", solver, "solver(g, x0, params)")
  _check_solver("root", "Root", "linear_solver", linear_solver,
                "linear_solver(matvec, b)")
  g, params = _closure_converted("root", "g", g, x0, params)
  _check_function("root", "Root", "g", g, x0, params, "x0")
  x, st = Root(_avals(x0), _avals(params), g=g, solver=solver,
               linear_solver=linear_solver, throw=throw)(x0, params)
  return x if throw else (x, st)


@_eager_cached
def _linear_solve(matvec: Any, b: Any, params: Any, *, solver: Any, throw: Any) -> Any:
  b = _strong(b)
  _check_solver("linear_solve", "LinearSolve", "solver", solver,
                "solver(matvec, b)")
  if isinstance(matvec, MatMul):
    _check_matrix(b, params)
  else:
    matvec, params = _closure_converted("linear_solve", "matvec", matvec, b,
                                        params)
  _check_function("linear_solve", "LinearSolve", "matvec", matvec, b, params,
                  "b")
  if isinstance(solver, Dense) and not isinstance(matvec, MatMul):
    matvec = matrix_matvec(matvec, b, params)
  x, st = LinearSolve(_avals(b), _avals(params), matvec=matvec,
                      solver=solver, throw=throw)(b, params)
  return x if throw else (x, st)


def _check_matrix(b: Any, A: Any) -> Any:
  shape = getattr(b, "shape", None)
  if (shape is None or len(shape) != 1 or getattr(A, "shape", None)
      != (shape[0], shape[0])):
    raise TypeError(
        "hijax.implicit.linear_solve (LinearSolve): with `matvec=MatMul()`, "
        "`b` must be a vector of size n and `params` the (n, n) matrix; got "
        f"b of shape {shape} and params of shape {getattr(A, 'shape', None)}")


def fixed_point(f: Callable, x0: Any, params: Any, *,
                solver: Callable = FixedPointIteration(),
                linear_solver: Callable = Dense(), throw: bool = True) -> Any:
  """The ``x`` with ``x == f(x, params)``, differentiable in ``params``.

  Args:
    f: a function ``f(x, params)`` returning a pytree like ``x0``. Traced
      values it closes over are moved into ``params``.
    x0: the starting point (a pytree of arrays); not differentiated.
    params: a pytree of arrays, the parameters the solution depends on.
    solver: ``solver(f, x0, params) -> (x, Status)`` (or ``x``), the forward
      solve (default: plain iteration, `FixedPointIteration`, whose ``tol``
      bounds the estimated distance to the fixed point).
    linear_solver: ``linear_solver(matvec, b) -> (x, Status)``, for the
      tangent and cotangent systems with the matrix ``I - df/dx`` (default
      `Dense`; `GMRES` for large ``x``).
    throw: True (the default): a failed solve (tolerance not met within
      ``max_iter``, a non-finite iterate, a failed derivative solve) raises
      `SolveError` eagerly (also under eager ``grad``, ``jvp`` and ``vmap``),
      or a JAX runtime error containing its message under ``jit`` and in the
      derivative solves of ``grad``'s backward pass (the reason is then
      logged first, at level ERROR on the ``hijax.implicit`` logger, since
      JAX's message begins with its callback machinery). The check is a
      host callback, which ``jax.export`` cannot serialize: exporting a
      solve with ``throw=True`` raises a ValueError that says to pass
      ``throw=False``. On an accelerator a program that holds a host
      callback costs more per call even when the callback is not made (on
      a TPU v5e about 2 ms more, four times a small solve's call: see the
      accelerators page); there, in a program called many times, prefer
      ``throw=False``. False: return ``(x, Status)`` and let the caller
      check ``Status.converged``; derivatives of a failed solve are then
      NaN.
  """
  return _fixed_point(f, x0, params, solver=solver,
                      linear_solver=linear_solver, throw=throw)


def root(g: Callable, x0: Any, params: Any, *, solver: Callable = Newton(),
         linear_solver: Callable = Dense(), throw: bool = True) -> Any:
  """The ``x`` with ``g(x, params) == 0`` (near ``x0``), differentiable in
  ``params``.

  Args:
    g: a function ``g(x, params)`` returning a pytree like ``x0``; traced
      values it closes over are moved into ``params``.
    x0: the starting point; not differentiated.
    params: a pytree of arrays.
    solver: ``solver(g, x0, params) -> (x, Status)`` (default `Newton`, whose
      ``tol`` bounds the last Newton step).
    linear_solver: for the tangent and cotangent systems with the matrix
      ``dg/dx`` (default `Dense`).
    throw: as for `fixed_point`.
  """
  return _root(g, x0, params, solver=solver, linear_solver=linear_solver,
               throw=throw)


def linear_solve(matvec: Callable, b: Any, params: Any, *, solver: Callable = Dense(),
                 throw: bool = True) -> Any:
  """The ``x`` with ``matvec(x, params) == b``, differentiable in ``b`` and
  ``params``.

  Args:
    matvec: ``matvec(x, params)``, linear in ``x`` (a pytree like ``b``);
      traced values it closes over are moved into ``params``. `MatMul()`
      says that ``params`` is the matrix: `Dense` then factorizes it as it
      is, once for the solve and its gradient; so it does for a matvec that
      is a product of ``x`` with a square params leaf (``A @ x``,
      ``x @ A``, ``A.T @ x``, ``jnp.dot``, ``jnp.einsum``), recognised from
      its jaxpr.
    b: the right-hand side, a pytree of arrays.
    params: a pytree of arrays on which the matrix depends.
    solver: ``solver(matvec1, b) -> (x, Status)`` with ``matvec1`` a function
      of ``x`` alone: `Dense` (the default), `CG` (symmetric positive definite
      systems) or `GMRES`. Every one checks the residual of its solution.
      Also used for the tangent systems and, with the transposed matrix, the
      cotangent ones.
    throw: as for `fixed_point`.
  """
  return _linear_solve(matvec, b, params, solver=solver, throw=throw)


