"""Compiled evaluations shared by the checks.

A check evaluates ``prim_fn`` and its transformations many times, and
compiling is what it mostly costs, mostly per program rather than per
operation. So every evaluation a run needs is a *part* of one program:

* `Bundle`: the parts, each traced once, compiled as one program whose
  branches (a ``lax.cond`` on the part asked for) are the parts: a call
  costs what its part costs alone and runs only its side effects. A part
  that cannot be traced, one added after the compile, one called with other
  types, and every part once the program fails, is compiled alone. A
  program too long for the time budget is compiled in pieces
  (`hijax.testing._budget`).
* `Compiled`: ``prim_fn`` of a flat list of leaves, evaluated at up to
  `POINTS` points by one part (a loop: the batching rule under test is not
  involved), and its parts: the jvp, vjp and linearization, the vmaps and
  the second derivatives the checks add before the first evaluation. The
  derived functions the second-order mode checks again put their parts in
  the same `Bundle` (``shared=``, `Compiled.nested`).

Everything compiles with XLA's default options, as a user's ``jax.jit``
(without the backend's optimizations a Newton status changed and a right
rule failed: tests/test_testing_compiles.py). With ``jit=False`` every
evaluation runs eagerly (an `expand` that branches in Python on values).
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hijax.testing._budget import Budget, BudgetSpent
from hijax.testing._numerics import dtype_of, is_float, on_device

# The points one call of the points part evaluates at most (finite
# differences take 20 to 40 at a time).
POINTS = 64


def _signature(flat) -> list:
  return [(np.shape(x), dtype_of(x), bool(getattr(x, "weak_type", False)))
          for x in flat]


def compiled_within(fn: Callable, budget: Budget, what: str) -> Callable:
  """``jax.jit(fn)``, each new signature of its arguments traced, lowered
  and compiled here within ``budget`` (`Budget.compile`)."""
  jitted = jax.jit(fn)
  if budget.seconds is None:
    return jitted
  cache: dict = {}

  def call(*args):
    flat, tree = jax.tree.flatten(args)
    try:
      sig = (tree, tuple(_signature(flat)))
      hash(sig)
    except Exception:  # pylint: disable=broad-except  (unhashable: as jax.jit does)
      return jitted(*args)
    if sig not in cache:
      cache[sig] = budget.compile(what, jitted.lower(*args), probe=True)
    return cache[sig](*args)
  return call


@dataclasses.dataclass
class _Part:
  fn: Callable  # of the arguments' tuple
  template: Callable[[], tuple]  # the arguments of a call at the point


@dataclasses.dataclass
class _Program:
  index: dict  # key -> branch number
  templates: list  # per branch, the flat arguments of a call at the point
  signatures: list  # per branch, _signature of its flat arguments
  out_trees: list
  executable: Callable  # compiled ahead of time
  broken: bool = False


class _Ahead:
  """An executable being compiled (`Budget.begin`): a call waits for it."""

  def __init__(self, wait: Callable[[], Callable]):
    self._wait = wait
    self._executable: Callable | None = None

  def __call__(self, *args):
    if self._executable is None:
      self._executable = self._wait()
    return self._executable(*args)


class Bundle:
  """Parts, each a function of a tuple of arguments, compiled as one program
  on the first call of one of them (see the module docstring). Parts added
  after that are compiled together on the first call of one of them."""

  def __init__(self, jit: bool = True, budget: Budget | None = None):
    self.jit = jit
    self.budget = budget if budget is not None else Budget(None)
    self.parts: dict[Hashable, _Part] = {}
    # the arguments of each part's calls, the first and the last two (the
    # device check runs the parts again there: hijax.testing._device)
    self.seen: dict[Hashable, list] = {}
    # the parts that raised here (the device check leaves them to the checks
    # that ran them)
    self.raised: set[Hashable] = set()
    self._where: dict[Hashable, _Program] = {}
    self._alone: dict[Hashable, Callable] = {}

  def add(self, key: Hashable, fn: Callable, template: Callable[[], tuple]):
    """Adds a part (a later ``add`` of the same key is ignored)."""
    self.parts.setdefault(key, _Part(fn, template))

  def run(self, key: Hashable, args: tuple):
    """``fn(*args)`` of the part ``key``."""
    calls = self.seen.setdefault(key, [])
    calls.append(jax.tree.map(np.asarray, args))
    if len(calls) > 3:
      del calls[1]
    try:
      # waited for here: an accelerator runs a program asynchronously, and
      # an error at run time (a host callback's) arrives with its results
      return jax.block_until_ready(self._run(key, args))
    except Exception:
      self.raised.add(key)
      raise

  def _run(self, key: Hashable, args: tuple):
    part = self.parts[key]
    if not self.jit:
      return part.fn(*args)
    if key not in self._where and key not in self._alone:
      self._build([k for k in self.parts
                   if k not in self._where and k not in self._alone])
    program = self._where.get(key)
    if program is not None and not program.broken:
      k = program.index[key]
      flat, _ = jax.tree.flatten(args)
      if _signature(flat) == program.signatures[k]:
        all_flat = list(program.templates)
        all_flat[k] = flat
        try:
          outs = jax.block_until_ready(
              program.executable(np.int32(k), all_flat))
        except Exception:  # pylint: disable=broad-except  (alone, each says why)
          program.broken = True
        else:
          return jax.tree.unflatten(program.out_trees[k], outs[k])
    if key not in self._alone:
      self._compile_alone(key)
    return self._alone[key](*args)

  def compile_ahead(self) -> None:
    """Traces and lowers the parts added so far as one program now, and
    compiles it in a thread of its own (`Budget.begin`), to be waited for
    at the first call of one of its parts. The device's half of the checks
    on an accelerator starts its program's compile so, while the host's
    half runs (hijax.testing._device)."""
    if self.jit:
      self._build([k for k in self.parts
                   if k not in self._where and k not in self._alone],
                  ahead=True)

  def _compile_alone(self, key):
    """Runs the part ``key`` in a program of its own from now on."""
    self._alone[key] = compiled_within(self.parts[key].fn, self.budget,
                                       f"compiling {key!r}")

  def _build(self, keys, ahead=False):
    """Compiles the parts ``keys`` as one program (those that cannot be
    traced, or a single one, alone); ``ahead``: in the background (see
    `compile_ahead`)."""
    templates, trees = {}, {}
    for key in keys:
      try:
        flat, trees[key] = jax.tree.flatten(self.parts[key].template())
        templates[key] = [on_device(np.array(x)) for x in flat]  # contiguous
      except Exception:  # pylint: disable=broad-except  (alone, it raises where its check reports it)
        self._compile_alone(key)
    keys = list(templates)
    if len(keys) > 1 and not self._program(keys, templates, trees, ahead):
      # leave out what cannot be traced
      keys = [k for k in keys if self._traces(k, templates[k], trees[k])]
      if len(keys) > 1:
        self._program(keys, templates, trees, ahead)
    for key in keys:
      if key not in self._where and key not in self._alone:
        self._compile_alone(key)

  def _traces(self, key, flat, in_tree) -> bool:
    try:
      jax.eval_shape(lambda *f: self.parts[key].fn(*jax.tree.unflatten(
          in_tree, f)), *flat)
      return True
    except Exception:  # pylint: disable=broad-except  (alone, it raises where its check reports it)
      self._compile_alone(key)
      return False

  def _program(self, keys, templates, trees, ahead=False) -> bool:
    """Compiles the parts ``keys`` as one program, each traced once (in its
    branch), where its compile fits the budget (else `_in_pieces`); False
    (nothing compiled) if one of them cannot be traced or the program
    cannot be compiled. ``ahead``: compiled in the background, its
    executable waiting for the compile at its first call (where a failed
    compile raises, and the parts are then compiled alone, as `_run` does
    for a failed call)."""
    out_trees: list = [None] * len(keys)

    def program(which, all_flat):
      outs = []
      for k, (key, flat) in enumerate(zip(keys, all_flat)):
        avals = []

        def run(k=k, key=key, flat=flat, avals=avals):
          out = self.parts[key].fn(*jax.tree.unflatten(trees[key], flat))
          leaves, out_trees[k] = jax.tree.flatten(out)
          avals.extend(jax.typeof(x) for x in leaves)
          return leaves
        # cond traces run first, so avals are known here (else this
        # raises, and the parts are traced alone first)
        zeros = lambda avals=avals: [jnp.zeros(a.shape, a.dtype)
                                     for a in avals]
        outs.append(jax.lax.cond(which == k, run, zeros))
      return outs
    flats = [templates[k] for k in keys]
    what = f"compiling the checks' program ({len(keys)} parts)"
    try:
      lowered = jax.jit(program).lower(np.int32(0), flats)
      size = self.budget.size(lowered)
      if ahead:
        executable = _Ahead(self.budget.begin(what, lowered, size))
      elif len(keys) == 1 or self.budget.fits(size):
        executable = self.budget.compile(what, lowered, len(keys) == 1, size)
      else:
        self._in_pieces(keys, templates, trees)
        return True
    except Exception:  # pylint: disable=broad-except
      return False
    built = _Program({key: k for k, key in enumerate(keys)}, flats,
                     [_signature(t) for t in flats], out_trees, executable)
    for key in keys:
      self._where[key] = built
    return True

  def _in_pieces(self, keys, templates, trees) -> None:
    """Compiles the parts ``keys``, whose program would not fit the budget,
    as several: where no compile has measured the rate yet, the first part
    alone (it measures it), then the rest in halves, each compiled where it
    fits; a part that does not fit alone raises `BudgetSpent` where it is
    called (the checks that need it cannot run)."""
    cut = 1 if self.budget.rate is None else len(keys) // 2
    for group in (keys[:cut], keys[cut:]):
      try:
        if not self._program(group, templates, trees):
          for key in group:
            self._compile_alone(key)
      except BudgetSpent as e:
        for key in group:
          self._alone[key] = self._spent(e)

  def _spent(self, e: BudgetSpent) -> Callable:
    def spent(*args):
      raise BudgetSpent(e.what, self.budget.elapsed, e.estimate)
    return spent


class Compiled:
  """``prim_fn`` of a flat list of leaves (its arguments ``args``), and the
  compiled evaluations of it and its transformations (`Bundle` parts).

  ``evaluate_one``, where given, evaluates ``prim_fn`` at one point (its
  floating-point leaves, in their dtypes) with a program compiled elsewhere
  (a backward pass is the vjp its context already compiled): points are
  then evaluated with it, one call each, and nothing is compiled for them.
  ``bound`` maps a part's key to a part of another `Compiled` that computes
  the same thing given more arguments: ``{key: (other, other_key,
  extra)}`` runs ``key`` at ``(xs, *rest)`` as ``other_key`` at ``(xs,
  *extra, *rest)`` (the second derivatives of a backward pass are parts
  of its context's program, with the cotangent as an argument).

  ``shared``, where given, is ``(bundle, name)`` (see `nested`): the parts
  go into that `Bundle`, under keys ``(name, key)``, so that the
  evaluations of several functions (a function and those the second-order
  checks derive from it) are compiled as one program."""

  def __init__(self, prim_fn: Callable, args: Sequence[Any], jit: bool,
               evaluate_one: Callable | None = None,
               bound: dict[Hashable, tuple] | None = None,
               shared: tuple[Bundle, Hashable] | None = None,
               budget: Budget | None = None):
    self.prim_fn = prim_fn
    self.jit = jit
    self.leaves, self.in_tree = jax.tree.flatten(tuple(args))
    self.float_idx = [i for i, x in enumerate(self.leaves) if is_float(x)]
    if shared is None:
      self.bundle, self._name = Bundle(jit, budget), None
    else:
      self.bundle, self._name = shared
    self._evaluate_one = evaluate_one
    self._bound = dict(bound or {})
    self._jitted: Callable | None = None
    self._mapped_failed = False
    if jit and evaluate_one is None:
      self.add("points", self._points, self._points_template)

  # -- parts --

  def nested(self, name: Hashable) -> tuple[Bundle, Hashable]:
    """The ``shared`` of a `Compiled` whose parts go into this one's
    program, under ``name`` (unique among this one's nested ones)."""
    return self.bundle, (self._name, name)

  def _in_bundle(self, key: Hashable) -> Hashable:
    return key if self._name is None else (self._name, key)

  def add(self, key: Hashable, fn: Callable, template: Callable[[], tuple]):
    """Adds the part ``key`` (see `Bundle.add`)."""
    self.bundle.add(self._in_bundle(key), fn, template)

  def run(self, key: Hashable, args: Sequence[Any]):
    """The part ``key`` (added or bound before) at ``args``."""
    if key in self._bound:
      other, other_key, extra = self._bound[key]
      return other.run(other_key, (args[0], *extra, *args[1:]))
    return self.bundle.run(self._in_bundle(key), tuple(args))

  def has(self, key: Hashable) -> bool:
    """Whether the part ``key`` was added (or bound)."""
    return key in self._bound or self._in_bundle(key) in self.bundle.parts

  # -- prim_fn itself --

  @property
  def fn(self) -> Callable:
    """``jax.jit(prim_fn)`` (``prim_fn`` with ``jit=False``), for calls at
    leaves other than the point's non-floating-point ones."""
    if not self.jit:
      return self.prim_fn
    if self._jitted is None:
      self._jitted = compiled_within(self.prim_fn, self.bundle.budget,
                                     "compiling prim_fn")
    return self._jitted

  def call(self, full: Sequence[Any], fn: Callable | None = None) -> list:
    """The output leaves of ``fn`` (default: the jitted ``prim_fn``) at the
    flat leaves ``full``."""
    fn = self.fn if fn is None else fn
    return jax.tree.leaves(fn(*jax.tree.unflatten(self.in_tree, list(full))))

  def evaluate(self, fulls: Sequence[Sequence[Any]]) -> list[list]:
    """``prim_fn``'s output leaves at each of ``fulls`` (flat leaves), in one
    call of the points part where their non-floating-point leaves are the
    point's (an integer index, a flag), else one jitted call each."""
    same = lambda x, y: x is y or np.array_equal(np.asarray(x),
                                                 np.asarray(y))
    if all(same(full[i], self.leaves[i]) for full in fulls
           for i in range(len(self.leaves)) if i not in self.float_idx):
      return self.at_points(self.float_idx,
                            [[full[i] for i in self.float_idx]
                             for full in fulls])
    return [[np.asarray(y) for y in self.call(full)] for full in fulls]

  def _full(self, idx, values) -> list:
    full = list(self.leaves)
    for i, v in zip(idx, values):
      full[i] = v
    return full

  def at_points(self, idx: Sequence[int], points: Sequence[Sequence[Any]]
                ) -> list[list[np.ndarray]]:
    """``prim_fn``'s output leaves at each point, where a point gives the
    values of the leaves ``idx`` (the others keep their values)."""
    if not points:
      return []
    if self._evaluate_one is not None and self._same_types(idx, points[0]):
      return [[np.asarray(y) for y in self._evaluate_one(
          [self._full(idx, p)[i] for i in self.float_idx])] for p in points]
    if not self.jit or self._mapped_failed or self._evaluate_one is not None:
      return [[np.asarray(y) for y in self.call(self._full(idx, p))]
              for p in points]
    try:
      out = []
      for start in range(0, len(points), POINTS):
        out += self._mapped(idx, points[start:start + POINTS])
      return out
    except Exception:  # pylint: disable=broad-except  (e.g. not traceable in a loop body)
      self._mapped_failed = True
      return self.at_points(idx, points)

  def _same_types(self, idx, point) -> bool:
    return all(np.shape(v) == np.shape(self.leaves[i])
               and dtype_of(v) == dtype_of(self.leaves[i])
               for i, v in zip(idx, point))

  def _mapped(self, idx, points):
    n = len(points)
    padded = list(points) + [points[0]] * (POINTS - n)
    stacked = []
    for i in self.float_idx:  # every floating-point leaf: one program
      if i in idx:
        k = list(idx).index(i)
        stacked.append(np.stack([np.asarray(p[k]) for p in padded]))
      else:
        x = np.asarray(self.leaves[i])
        stacked.append(np.broadcast_to(x, (POINTS,) + x.shape))
    outs = self.run("points", (tuple(stacked), np.int32(n)))
    outs = [np.asarray(y) for y in outs]
    return [[y[k] for y in outs] for k in range(n)]

  def _points_template(self) -> tuple:
    stacked = tuple(np.broadcast_to(np.asarray(self.leaves[i]), (POINTS,)
                                    + np.shape(self.leaves[i]))
                    for i in self.float_idx)
    return stacked, np.int32(1)

  def _points(self, stacked, n):
    """``prim_fn`` at the first ``n`` of the stacked points, in a loop."""
    others = [x for i, x in enumerate(self.leaves) if i not in self.float_idx]

    def one(float_values):
      full, it_f, it_o = [], iter(float_values), iter(others)
      for i in range(len(self.leaves)):
        full.append(next(it_f) if i in self.float_idx else next(it_o))
      return tuple(self.call(full, self.prim_fn))
    shapes = jax.eval_shape(one, tuple(s[0] for s in stacked))
    init = tuple(jnp.zeros((POINTS,) + a.shape, a.dtype) for a in shapes)

    def body(k, outs):
      ys = one(tuple(s[k] for s in stacked))
      return tuple(o.at[k].set(y) for o, y in zip(outs, ys))
    return jax.lax.fori_loop(0, n, body, init)
