"""The batching checks: ``vmap`` against a Python loop over the batch, for
combinations of batched arguments, ``vmap`` of ``jvp`` and ``vjp``, and
``jvp`` and ``vjp`` of ``vmap``."""
from __future__ import annotations

import itertools

import jax
import numpy as np

from hijax._checks import HIJAX_CHECK, raised_by
from hijax.testing._compiled import Part
from hijax.testing._context import Point, Settings, Writer
from hijax.testing._numerics import dtype_of, is_float, on_device, to_numpy


def _batch_variants(p: Point, s: Settings, arg):
  """``batch_size`` perturbed variants of ``arg``, stacked (the first
  ``arg``; integers repeated)."""
  size = s.batch_size

  def stack(x):
    x = np.asarray(x)
    if not is_float(x):
      return np.stack([x] * size)
    noise = lambda: np.asarray(p.random_like(x))
    vs = [x] + [x * (1 + 0.2 * noise()) + 0.1 * noise()
                for _ in range(size - 1)]
    return np.stack(vs)
  return jax.tree.map(stack, arg)


def _batch_combinations(p: Point, s: Settings) -> list[tuple]:
  """The ``in_axes`` to check: the user's, or each subset of the arguments
  batched along the first axis and the last."""
  n = len(p.args)
  if s.batch_in_axes is not None:
    return [tuple(a) if isinstance(a, (tuple, list)) else (a,)
            for a in s.batch_in_axes]
  if n > 4:  # (2**n - 1 subsets) many arguments: each alone, and all
    subsets = [(i,) for i in range(n)] + [tuple(range(n))]
  else:
    subsets = [s for r in range(1, n + 1)
               for s in itertools.combinations(range(n), r)]
  combos = []
  for sub in subsets:
    combos.append(tuple(0 if i in sub else None for i in range(n)))
    last = tuple(jax.tree.map(lambda x: np.ndim(x), p.args[i])
                 if i in sub else None for i in range(n))
    if any(np.ndim(x) > 0 for i in sub for x in jax.tree.leaves(p.args[i])):
      combos.append(last)
  return combos


def _loop(p: Point, s: Settings, stacked, batched) -> list:
  """``prim_fn``'s outputs on each batch element, stacked (one call)."""
  fulls = []
  for k in range(s.batch_size):
    args_k = [jax.tree.map(lambda x: np.asarray(x[k]), stacked[i])
              if i in batched else a for i, a in enumerate(p.args)]
    fulls.append(jax.tree.leaves(args_k))
  outs = p.compiled.evaluate(fulls)
  return [np.stack(ys) for ys in zip(*outs)]


def _broadcast(p: Point, s: Settings) -> list:
  """Each argument repeated ``batch_size`` times on a new leading axis."""
  size = s.batch_size
  return [jax.tree.map(lambda x: np.broadcast_to(
      np.asarray(x), (size,) + np.shape(x)), a) for a in p.args]


def _derivative_cases(p: Point, s: Settings) -> list:
  """``(check, rule, batched function, template)``: vmap of jvp / vjp and
  jvp / vjp of vmap."""
  direction = tuple(p.float_idx)
  size = s.batch_size
  f = p.restrict(direction)
  jvp = lambda f: lambda x, t: jax.jvp(f, x, t)[1]
  vjp = lambda f: lambda x, c: jax.vjp(f, *x)[1](tuple(c))
  vmap = lambda g: jax.vmap(lambda a, b: g(tuple(a), tuple(b)))
  f_b = jax.vmap(f)
  ts = lambda: [np.zeros((size,) + np.shape(p.leaves[i]),
                         dtype_of(p.leaves[i])) for i in direction]
  cts = lambda: [np.zeros((size,) + p.out_avals[i].shape,
                          p.out_avals[i].dtype) for i in p.out_float_idx]
  # vmap of a derivative runs the unbatched instance's rules; a derivative
  # of vmap those of the instance the batch rule binds
  cases = []
  if p.has("jvp"):
    cases += [("vmap of jvp vs a loop", "jvp", vmap(jvp(f)), ts),
              ("jvp of vmap vs a loop", "jvp", jvp(f_b), ts)]
  if p.has("vjp"):
    cases += [("vmap of vjp vs a loop", "vjp", vmap(vjp(f)), cts),
              ("vjp of vmap vs a loop", "vjp", vjp(f_b), cts)]
  return cases


def _vmap_part(in_axes) -> Part:
  # in_axes may hold a pytree's dict (unhashable): its repr tells it apart
  return Part("batch", "batch", "jax.vmap with in_axes={}", repr(in_axes))


def add_batch_parts(p: Point, s: Settings):
  """Adds the programs `check_batch` runs to ``p``'s compiled program."""
  for in_axes in _batch_combinations(p, s):
    p.compiled.add(
        _vmap_part(in_axes), jax.vmap(p.fn, in_axes=in_axes),
        lambda in_axes=in_axes: tuple(_batched_args(p, s, _broadcast(p, s),
                                                    in_axes)))
  if s.batch_in_axes is not None or not p.float_idx or (
      not p.out_float_idx):
    return
  leaves_b = lambda: jax.tree.leaves(_broadcast(p, s))
  for check, _, g_b, b in _derivative_cases(p, s):
    p.compiled.add(Part("batch", "batch", check), g_b, lambda b=b: (
        tuple(leaves_b()[i] for i in p.float_idx), tuple(b())))


def _refused_or_failed(s: Settings, w: Writer, refusals: list, check: str,
                       inputs: str, e: BaseException,
                       label: str | None = None):
  """A failure, or a refusal where the rule raised on a combination the
  checker chose."""
  rule = raised_by(e) if s.batch_in_axes is None else None
  if rule is None or rule == HIJAX_CHECK:
    w.fail_raised("batch", check, inputs, e)
    return
  label = label or check
  first = (str(e).strip().splitlines() or [""])[0]
  refusals.append((label, inputs, e, (
      f"{label}: {rule} raised {type(e).__name__}: {first}; it ran for other "
      "combinations of batched arguments, so it is taken to support only "
      "those: pass batch_in_axes= to check the ones it supports")))


def check_batch(p: Point, s: Settings, w: Writer):
  """``vmap`` of ``prim_fn`` against a loop, for each ``in_axes``; then
  ``vmap`` of its ``jvp`` and ``vjp`` (unless ``batch_in_axes`` is given)."""
  stacked = [_batch_variants(p, s, a) for a in p.args]
  refs = {}
  refusals = []  # (check, inputs, exception, why skipped)
  handled_some = False
  for in_axes in _batch_combinations(p, s):
    desc = f"vmap with in_axes={in_axes}, batch size {s.batch_size}"
    if w.out_of_time("batch", desc):
      continue
    args_b = _batched_args(p, s, stacked, in_axes)
    batched = tuple(i for i, ax in enumerate(in_axes) if ax is not None)
    inputs = p.describe_inputs(extra=desc)
    if batched not in refs:
      try:
        refs[batched] = _loop(p, s, stacked, batched)
      except Exception as e:  # pylint: disable=broad-except
        w.fail_raised("batch", "loop over the batch", inputs, e,
                        rule="prim_fn")
        continue
    check = "vmap vs a loop over the batch"
    try:
      got = jax.tree.leaves(p.compiled.run(_vmap_part(in_axes), args_b))
    except Exception as e:  # pylint: disable=broad-except
      _refused_or_failed(s, w, refusals, check, inputs, e,
              label=f"vmap with in_axes={in_axes}")
      continue
    handled_some = True
    w.ran("batch", f"{check} (in_axes={in_axes})")
    w.compare("batch", check, inputs, got, refs[batched], s.tol,
                names=p.out_names, got_label="vmap", want_label="the loop")
  if s.batch_in_axes is None:
    _check_batched_derivatives(p, s, w, stacked, refusals)
  w.judge_refusals("batch", refusals, handled_some)


def _batched_args(p: Point, s: Settings, stacked, in_axes) -> list:
  """The arguments of ``vmap`` with ``in_axes`` (the point where None)."""
  args_b = []
  for i, ax in enumerate(in_axes):
    if ax is None:
      args_b.append(p.args[i])
    else:
      axes = (jax.tree.map(lambda _: ax, p.args[i])
              if isinstance(ax, int) else ax)
      args_b.append(jax.tree.map(
          lambda x, d: on_device(np.array(np.moveaxis(x, 0, d))),  # contiguous
          stacked[i], axes))
  return args_b


def _check_batched_derivatives(p: Point, s: Settings, w: Writer, stacked,
                               refusals: list):
  """vmap of jvp and vjp, and jvp and vjp of vmap, against loops."""
  direction = tuple(p.float_idx)
  if not direction or not p.out_float_idx:
    return
  size = s.batch_size
  leaves_b = jax.tree.leaves(stacked)
  xs = [on_device(leaves_b[i]) for i in direction]
  inputs = p.describe_inputs(
      extra=f"all arguments batched along axis 0, batch size {size}")
  ts = [p.random_like(x) for x in xs]
  cts = [p.random_like(np.stack([y] * size)) for y in p.ref_out()]
  k_th = lambda arrays, k: [on_device(a[k]) for a in to_numpy(arrays)]
  for check, kind, _, _ in _derivative_cases(p, s):
    if w.out_of_time("batch", check):
      continue
    vs = ts if kind == "jvp" else cts
    try:
      got = jax.tree.leaves(p.compiled.run(Part("batch", "batch", check),
                                             (tuple(xs), tuple(vs))))
      # one example's derivative: the programs the jvp and vjp checks ran
      want = [np.stack(ys) for ys in zip(*(jax.tree.leaves(p.derivative(
          kind, direction, k_th(vs, k), xs=k_th(xs, k))[1])
                                            for k in range(size)))]
    except Exception as e:  # pylint: disable=broad-except
      _refused_or_failed(s, w, refusals, check, inputs, e)
      continue
    w.ran("batch", check)
    names = ([p.out_names[i] for i in p.out_float_idx]
             if kind == "jvp" else [p.names[i] for i in direction])
    w.compare("batch", check, inputs, got, want, s.tol,
                names=names, got_label="vmap", want_label="the loop")
