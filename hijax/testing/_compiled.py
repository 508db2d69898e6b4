"""Every evaluation of a run as a part of one compiled program (compiling is
what a check mostly costs): a ``lax.cond`` on the part asked for; a part
that cannot join it is compiled alone. And the run's time budget: no check
starts once it is spent, no compile that would end past `HARD_LIMIT` times
it (estimated from its StableHLO's size: `BudgetSpent` instead)."""
from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
import dataclasses
import functools
import sys
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hijax.testing._numerics import dtype_of, is_float, on_device

# The default budget, per rule checked (primitive or jax.custom_* function).
SECONDS_PER_RULE = 30.0

PROGRESS_AFTER = 10.0  # progress=None: shown after this long, this often

# No compile starts that would end past this many times the budget.
HARD_LIMIT = 1.4

# Seconds per character of StableHLO a compile takes before the run measured
# its own: hyp2f1's program, 351,387 characters in 19.8 s of CPU time (jax
# 0.12.0.1), the slowest per character of bench/bench_checker.py's (i0: 6e-6).
PRIOR_RATE = 6e-5

_clock = time.monotonic
_cpu_clock = time.process_time


class BudgetSpent(BaseException):
  """A compile would end past `HARD_LIMIT` times the budget: the run ends
  (a BaseException: not taken for a rule's failure)."""

  def __init__(self, what: str, seconds: float,
               estimate: float | None = None):
    self.what, self.seconds, self.estimate = what, seconds, estimate
    super().__init__(f"{what} was not started after {seconds:.1f} s: " + (
        "the time budget was spent" if estimate is None else
        f"it would take about {estimate:.1f} s, past {HARD_LIMIT:g} times "
        "the time budget"))


@dataclasses.dataclass
class Budget:
  """The deadline of one run (``seconds``, None: no limit) and where its
  progress lines go (``always``: from the start)."""
  seconds: float | None
  progress: Callable[[str], None] | None = None
  always: bool = False
  start: float = dataclasses.field(default_factory=lambda: _clock())
  _cpu_start: float = dataclasses.field(default_factory=lambda: _cpu_clock())
  _last: float = -float("inf")
  # the slowest seconds per character of the compiles measured (None: none)
  rate: float | None = None
  # the threads `begin` started, for `finish`
  _threads: list = dataclasses.field(default_factory=list)

  @classmethod
  def of(cls, time_budget: float | str | None,
         progress: bool | Callable[[str], None] | None,
         n_rules: int) -> Budget:
    """The budget of `check_rules`'s ``time_budget`` and ``progress``."""
    if time_budget == "default":
      seconds = SECONDS_PER_RULE * max(1, n_rules)
    else:
      seconds = None if time_budget is None else float(time_budget)
    if callable(progress):
      return cls(seconds, progress, always=True)
    if progress is False:
      return cls(seconds)
    return cls(seconds, lambda line: print(line, file=sys.stderr, flush=True),
               always=bool(progress))

  @property
  def elapsed(self) -> float:
    return _clock() - self.start

  @property
  def spent(self) -> bool:
    return self.seconds is not None and self.elapsed > self.seconds

  def estimate(self, size: int) -> float:
    """The seconds a compile of ``size`` characters of StableHLO takes."""
    if self.rate is not None:
      return size * self.rate
    wall, cpu = _clock() - self.start, _cpu_clock() - self._cpu_start
    return size * PRIOR_RATE * max(1.0, wall / cpu if cpu > 0 else 1.0)

  def fits(self, size: int) -> bool:
    """Whether a compile of ``size`` characters would end within
    `HARD_LIMIT` times the budget."""
    return self.seconds is None or (
        self.elapsed + self.estimate(size) <= HARD_LIMIT * self.seconds)

  def size(self, lowered: Any) -> int:
    """A lowered program's characters (0 without a budget)."""
    return 0 if self.seconds is None else len(lowered.as_text())

  def compile(self, what: str, lowered: Any, probe: bool = False,
              size: int | None = None) -> Any:
    """``lowered.compile()``, measuring the rate; `BudgetSpent` where it
    does not fit (but a first ``probe``)."""
    if self.seconds is None:
      return lowered.compile()
    size = self.size(lowered) if size is None else size
    if self.spent:
      raise BudgetSpent(what, self.elapsed)
    if not (self.fits(size) or (probe and self.rate is None)):
      raise BudgetSpent(what, self.elapsed, self.estimate(size))
    start = _clock()
    executable = lowered.compile()
    self.rate = max(self.rate or 0.0, (_clock() - start) / size)
    return executable

  def begin(self, what: str, lowered: Any,
            size: int | None = None) -> Callable[[], Any]:
    """A function returning ``lowered.compile()``, compiled in a thread
    started now where it fits (`finish` waits for it)."""
    if not self.fits(self.size(lowered) if size is None else size):
      return functools.cache(lambda: self.compile(what, lowered, probe=True))
    box: dict[str, Any] = {}

    def work():
      try:
        box["value"] = lowered.compile()
      except BaseException as e:  # pylint: disable=broad-except  (re-raised below)
        box["error"] = e
    worker = threading.Thread(target=work, name=f"check_rules: {what}")
    worker.start()
    self._threads.append(worker)

    def wait():
      worker.join()
      if "error" in box:
        raise box["error"]
      return box["value"]
    return wait

  def finish(self) -> None:
    """Waits for the compiles `begin` started: no thread outlives the run."""
    for worker in self._threads:
      worker.join()
    self._threads = []

  def starting(self, what: str) -> None:
    """Shows that the check ``what`` starts, if progress is shown now."""
    if self.progress is None:
      return
    now = self.elapsed
    if (self.always or now > PROGRESS_AFTER) and now - self._last >= (
        0 if self.always else PROGRESS_AFTER):
      self._last = now
      limit = "" if self.seconds is None else f" of {self.seconds:.0f} s"
      self.progress(f"check_rules: {now:.1f} s{limit}: {what}")


# The points one call evaluates at most (finite differences take 20-40).
POINTS = 64


def replaced(leaves, idx, values) -> list:
  """``leaves`` with those at ``idx`` replaced by ``values``."""
  out = list(leaves)
  for i, v in zip(idx, values):
    out[i] = v
  return out


def _signature(flat) -> list:
  return [(np.shape(x), dtype_of(x), bool(getattr(x, "weak_type", False)))
          for x in flat]


def compiled_within(fn: Callable, budget: Budget, what: str) -> Callable:
  """``jax.jit(fn)``, each new signature compiled within ``budget``."""
  jitted = jax.jit(fn)
  if budget.seconds is None:
    return jitted
  cache: dict = {}

  def call(*args):
    flat, tree = jax.tree.flatten(args)
    sig = (tree, tuple(_signature(flat)))  # (a treedef hashes its structure)
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
  out_trees: list
  executable: Callable
  broken: bool = False


@dataclasses.dataclass(frozen=True)
class Part:
  """A key of the checks' program: the ``mode`` it is reported under, the
  mode whose ``rule`` it runs, ``what`` it computes (``{}``: ``where``)."""
  mode: str
  rule: str
  what: str
  where: Any = None

  def describe(self) -> str:
    return self.what.format(self.where)


def derivative_part(kind, direction) -> Part:
  """The part ``jax.jvp`` (``vjp``, ``linearize``) in ``direction``."""
  name = "linearize" if kind == "lin" else kind
  return Part(kind, kind, f"jax.{name} in {{}}", direction)


class Bundle:
  """Parts (functions of a tuple of arguments) compiled as one program at
  the first call of one of them."""

  def __init__(self, jit: bool = True, budget: Budget | None = None):
    self.jit = jit
    self.budget = budget if budget is not None else Budget(None)
    self.parts: dict[Hashable, _Part] = {}
    # each part's first and last two calls' arguments (the device's half)
    self.seen: dict[Hashable, list] = {}
    self.raised: set[Hashable] = set()  # the parts that raised here
    self._where: dict[Hashable, _Program | None] = {}  # None: alone
    self._alone: dict[Hashable, Callable] = {}

  def add(self, key: Hashable, fn: Callable, template: Callable[[], tuple]):
    """Adds a part (a later ``add`` of the same key is ignored)."""
    self.parts.setdefault(key, _Part(fn, template))

  def run(self, key: Hashable, args: tuple):
    calls = self.seen.setdefault(key, [])
    calls.append(jax.tree.map(np.asarray, args))
    if len(calls) > 3:
      del calls[1]
    try:
      # waited for: an error at run time (a callback's) comes with results
      return jax.block_until_ready(self._run(key, args))
    except Exception:
      self.raised.add(key)
      raise

  def _run(self, key: Hashable, args: tuple):
    if not self.jit:
      return self.parts[key].fn(*args)
    if key not in self._where:
      self._build()
    program = self._where[key]
    if program is not None and not program.broken:
      k, flat = program.index[key], jax.tree.leaves(args)
      if _signature(flat) == _signature(program.templates[k]):
        try:
          outs = jax.block_until_ready(program.executable(
              np.int32(k), [*program.templates[:k], flat,
                            *program.templates[k + 1:]]))
          return jax.tree.unflatten(program.out_trees[k], outs[k])
        except Exception:  # pylint: disable=broad-except  (alone, each says why)
          program.broken = True
    if key not in self._alone:
      self._alone[key] = compiled_within(self.parts[key].fn, self.budget,
                                         f"compiling {key!r}")
    return self._alone[key](*args)

  def compile_ahead(self) -> None:
    """Lowers the new parts now, compiled in a thread (`Budget.begin`)."""
    if self.jit:
      self._build(ahead=True)

  def _build(self, ahead=False):
    """Compiles the new parts as one program (alone: those that cannot)."""
    new = [k for k in self.parts if k not in self._where]
    self._where.update(dict.fromkeys(new))
    flats, trees = {}, {}
    for key in new:
      try:
        flat, trees[key] = jax.tree.flatten(self.parts[key].template())
        flats[key] = [on_device(np.array(x)) for x in flat]  # contiguous
      except Exception:  # pylint: disable=broad-except  (alone, it raises where its check reports it)
        pass
    keys = list(flats)
    if len(keys) > 1 and not self._program(keys, flats, trees, ahead):
      keys = [k for k in keys if self._traces(k, flats[k], trees[k])]
      if len(keys) > 1:
        self._program(keys, flats, trees, ahead)

  def _traces(self, key, flat, in_tree) -> bool:
    try:
      jax.eval_shape(lambda *f: self.parts[key].fn(*jax.tree.unflatten(
          in_tree, f)), *flat)
      return True
    except Exception:  # pylint: disable=broad-except  (alone, it raises where its check reports it)
      return False

  def _program(self, keys, flats, trees, ahead) -> bool:
    """Compiles ``keys`` as one program; False where that fails (too long
    for the budget: True, each alone)."""
    out_trees: list = [None] * len(keys)

    def program(which, all_flat):
      outs = []
      for k, (key, flat) in enumerate(zip(keys, all_flat)):
        avals = []

        def run(k=k, key=key, flat=flat, avals=avals):
          leaves, out_trees[k] = jax.tree.flatten(
              self.parts[key].fn(*jax.tree.unflatten(trees[key], flat)))
          avals.extend(jax.typeof(x) for x in leaves)
          return leaves
        # cond traces `run` first, so that `avals` is known in `zeros`
        zeros = lambda avals=avals: [jnp.zeros(a.shape, a.dtype)
                                     for a in avals]
        outs.append(jax.lax.cond(which == k, run, zeros))
      return outs
    templates = [flats[k] for k in keys]
    what = f"compiling the checks' program ({len(keys)} parts)"
    try:
      lowered = jax.jit(program).lower(np.int32(0), templates)
      size = self.budget.size(lowered)
      if ahead:
        wait = self.budget.begin(what, lowered, size)
        executable = lambda *a: wait()(*a)
      elif self.budget.fits(size):
        executable = self.budget.compile(what, lowered, size=size)
      else:
        return True
    except Exception:  # pylint: disable=broad-except
      return False
    built = _Program({key: k for k, key in enumerate(keys)}, templates,
                     out_trees, executable)
    self._where.update(dict.fromkeys(keys, built))
    return True


class Compiled:
  """``prim_fn``'s evaluations at points and its transformations' (parts).
  ``evaluate_one``: a program compiled elsewhere evaluates one point;
  ``bound``: ``{key: (other, other_key, extra)}`` runs ``key`` as
  ``other``'s ``other_key`` with ``extra`` after ``xs``; ``shared``:
  ``(bundle, name)``, the parts go into that bundle (`nested`)."""

  def __init__(self, prim_fn: Callable, args: Sequence[Any], jit: bool,
               evaluate_one: Callable | None = None,
               bound: dict[Hashable, tuple] | None = None,
               shared: tuple[Bundle, Hashable] | None = None,
               budget: Budget | None = None):
    self.prim_fn = prim_fn
    self.jit = jit
    self.leaves, self.in_tree = jax.tree.flatten(tuple(args))
    self.float_idx = [i for i, x in enumerate(self.leaves) if is_float(x)]
    self.bundle, self._name = shared or (Bundle(jit, budget), None)
    self._evaluate_one = evaluate_one
    self._bound = dict(bound or {})
    self._jitted: Callable | None = None
    self._mapped_failed = False
    if jit and evaluate_one is None:
      self.add("points", self._points, self._points_template)

  def nested(self, name: Hashable) -> tuple[Bundle, Hashable]:
    """The ``shared`` of a `Compiled` whose parts go into this program."""
    return self.bundle, (self._name, name)

  def _in_bundle(self, key: Hashable) -> Hashable:
    return key if self._name is None else (self._name, key)

  def add(self, key: Hashable, fn: Callable, template: Callable[[], tuple]):
    self.bundle.add(self._in_bundle(key), fn, template)

  def run(self, key: Hashable, args: Sequence[Any]):
    if key in self._bound:
      other, other_key, extra = self._bound[key]
      return other.run(other_key, (args[0], *extra, *args[1:]))
    return self.bundle.run(self._in_bundle(key), tuple(args))

  def has(self, key: Hashable) -> bool:
    return key in self._bound or self._in_bundle(key) in self.bundle.parts

  def call(self, full: Sequence[Any]) -> list:
    """The output leaves of the jitted ``prim_fn`` at the leaves ``full``."""
    if self._jitted is None:
      self._jitted = (self.prim_fn if not self.jit else compiled_within(
          self.prim_fn, self.bundle.budget, "compiling prim_fn"))
    return jax.tree.leaves(
        self._jitted(*jax.tree.unflatten(self.in_tree, list(full))))

  def evaluate(self, fulls: Sequence[Sequence[Any]]) -> list[list]:
    """``prim_fn``'s output leaves at each of ``fulls`` (flat leaves)."""
    same = lambda x, y: x is y or np.array_equal(np.asarray(x),
                                                 np.asarray(y))
    if all(same(full[i], x) for full in fulls
           for i, x in enumerate(self.leaves) if i not in self.float_idx):
      return self.at_points(self.float_idx, [
          [full[i] for i in self.float_idx] for full in fulls])
    return [[np.asarray(y) for y in self.call(full)] for full in fulls]

  def at_points(self, idx: Sequence[int], points: Sequence[Sequence[Any]]
                ) -> list[list[np.ndarray]]:
    """``prim_fn``'s output leaves at points giving the leaves ``idx``."""
    one = self._evaluate_one
    if one is not None and all(
        np.shape(v) == np.shape(self.leaves[i])
        and dtype_of(v) == dtype_of(self.leaves[i])
        for p in points[:1] for i, v in zip(idx, p)):
      return [[np.asarray(y) for y in one(
          [replaced(self.leaves, idx, p)[i] for i in self.float_idx])] for p in points]
    if self.jit and not self._mapped_failed and one is None:
      try:
        return [y for start in range(0, len(points), POINTS)
                for y in self._mapped(idx, points[start:start + POINTS])]
      except Exception:  # pylint: disable=broad-except  (e.g. not traceable in a loop body)
        self._mapped_failed = True
    return [[np.asarray(y) for y in self.call(replaced(self.leaves, idx, p))]
            for p in points]

  def _mapped(self, idx, points):
    n, idx = len(points), list(idx)
    padded = list(points) + [points[0]] * (POINTS - n)
    stacked, _ = self._points_template()  # every floating-point leaf
    stacked = tuple(np.stack([np.asarray(p[idx.index(i)]) for p in padded])
                    if i in idx else x for i, x in zip(self.float_idx, stacked))
    outs = [np.asarray(y) for y in self.run("points", (stacked, np.int32(n)))]
    return [[y[k] for y in outs] for k in range(n)]

  def _points_template(self) -> tuple:
    return tuple(np.broadcast_to(np.asarray(self.leaves[i]), (POINTS,)
                                 + np.shape(self.leaves[i]))
                 for i in self.float_idx), np.int32(1)

  def _points(self, stacked, n):
    """``prim_fn`` at the first ``n`` of the stacked points, in a loop."""
    def one(float_values):
      full = replaced(self.leaves, self.float_idx, float_values)
      return tuple(jax.tree.leaves(self.prim_fn(*jax.tree.unflatten(
          self.in_tree, full))))
    shapes = jax.eval_shape(one, tuple(s[0] for s in stacked))
    init = tuple(jnp.zeros((POINTS,) + a.shape, a.dtype) for a in shapes)

    def body(k, outs):
      ys = one(tuple(s[k] for s in stacked))
      return tuple(o.at[k].set(y) for o, y in zip(outs, ys))
    return jax.lax.fori_loop(0, n, body, init)
