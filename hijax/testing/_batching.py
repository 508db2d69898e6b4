"""The batching checks: ``vmap`` against a Python loop over the batch, for
combinations of batched arguments, ``vmap`` of ``jvp`` and ``vjp``, and
``jvp`` and ``vjp`` of ``vmap``."""
from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from hijax.testing._context import CheckContext
from hijax.testing._numerics import is_float, to_numpy


def _batch_variants(ctx: CheckContext, arg):
  """``batch_size`` variants of ``arg`` stacked on a new leading axis:
  the first is ``arg`` itself, the others perturb its floating-point leaves
  (integer leaves are repeated, as they may be indices)."""
  size = ctx.settings.batch_size

  def stack(x):
    x = np.asarray(x)
    if not is_float(x):
      return np.stack([x] * size)
    noise = lambda: np.asarray(ctx.random_like(x))
    vs = [x] + [x * (1 + 0.2 * noise()) + 0.1 * noise()
                for _ in range(size - 1)]
    return np.stack(vs)
  return jax.tree.map(stack, arg)


def _batch_combinations(ctx: CheckContext) -> list[tuple]:
  """The ``in_axes`` to check: the user's, or each subset of the arguments
  batched along the first axis and (where they have one) the last."""
  n = len(ctx.args)
  if ctx.settings.batch_in_axes is not None:
    return [tuple(a) if isinstance(a, (tuple, list)) else (a,)
            for a in ctx.settings.batch_in_axes]
  subsets = [s for r in range(1, n + 1)
             for s in itertools.combinations(range(n), r)]
  if len(subsets) > 15:  # many arguments: each alone, and all together
    subsets = [(i,) for i in range(n)] + [tuple(range(n))]
  combos = []
  for s in subsets:
    combos.append(tuple(0 if i in s else None for i in range(n)))
    last = tuple(jax.tree.map(lambda x: np.ndim(x), ctx.args[i])
                 if i in s else None for i in range(n))
    if any(np.ndim(x) > 0 for i in s for x in jax.tree.leaves(ctx.args[i])):
      combos.append(last)
  return combos


def _loop(ctx: CheckContext, stacked, batched) -> list:
  """The outputs of ``prim_fn`` on each batch element, stacked."""
  outs = []
  for k in range(ctx.settings.batch_size):
    args_k = [jax.tree.map(lambda x: jnp.asarray(x[k]), stacked[i])
              if i in batched else a for i, a in enumerate(ctx.args)]
    outs.append(jax.tree.leaves(ctx.fn(*args_k)))
  return [np.stack(ys) for ys in zip(*outs)]


def check_batch(ctx: CheckContext):
  """``vmap`` of ``prim_fn`` against a loop, for each ``in_axes``; then
  ``vmap`` of its ``jvp`` and ``vjp`` (unless ``batch_in_axes`` is given)."""
  stacked = [_batch_variants(ctx, a) for a in ctx.args]
  combos = []
  for in_axes in _batch_combinations(ctx):
    desc = f"vmap with in_axes={in_axes}, batch size {ctx.settings.batch_size}"
    if not ctx.out_of_time("batch", desc):
      combos.append((in_axes, desc, _batched_args(ctx, stacked, in_axes)))
  vmapped = [jax.vmap(ctx.prim_fn, in_axes=in_axes) for in_axes, _, _ in combos]
  all_got = ctx.compiled.together(("vmaps", tuple(repr(c[0]) for c in combos)),
                                  vmapped, [c[2] for c in combos])
  refs = {}
  for k, (in_axes, desc, args_b) in enumerate(combos):
    batched = tuple(i for i, ax in enumerate(in_axes) if ax is not None)
    inputs = ctx.describe_inputs(extra=desc)
    if batched not in refs:
      try:
        refs[batched] = _loop(ctx, stacked, batched)
      except Exception as e:  # pylint: disable=broad-except
        ctx.fail_raised("batch", "loop over the batch", inputs, e,
                        rule="prim_fn")
        continue
    check = "vmap vs a loop over the batch"
    try:
      if all_got is not None:
        got = jax.tree.leaves(all_got[k])
      else:
        got = jax.tree.leaves(ctx.compiled.cached(
            ("vmap", repr(in_axes)), lambda k=k: vmapped[k])(*args_b))
    except Exception as e:  # pylint: disable=broad-except
      ctx.fail_raised("batch", check, inputs, e)
      continue
    ctx.ran("batch", f"{check} (in_axes={in_axes})")
    ctx.compare("batch", check, inputs, got, refs[batched], ctx.settings.tol,
                names=ctx.out_names, got_label="vmap", want_label="the loop")
  if ctx.settings.batch_in_axes is None:
    _check_batched_derivatives(ctx, stacked)


def _batched_args(ctx: CheckContext, stacked, in_axes) -> list:
  """The arguments of ``vmap`` with ``in_axes``: the stacked variants with
  the batch axis moved where ``in_axes`` says, the point where None."""
  args_b = []
  for i, ax in enumerate(in_axes):
    if ax is None:
      args_b.append(ctx.args[i])
    else:
      axes = (jax.tree.map(lambda _: ax, ctx.args[i])
              if isinstance(ax, int) else ax)
      args_b.append(jax.tree.map(
          lambda x, d: jnp.asarray(np.moveaxis(x, 0, d)), stacked[i], axes))
  return args_b


def _check_batched_derivatives(ctx: CheckContext, stacked):
  """``vmap`` of ``jvp`` and of ``vjp``, and ``jvp`` and ``vjp`` of ``vmap``
  (where the rules exist), against loops, with every argument batched along
  axis 0."""
  direction = tuple(ctx.float_idx)
  if not direction or not ctx.out_float_idx:
    return
  size = ctx.settings.batch_size
  leaves_b = jax.tree.leaves(stacked)
  xs = [jnp.asarray(leaves_b[i]) for i in direction]
  f = ctx.restrict(direction)
  inputs = ctx.describe_inputs(
      extra=f"all arguments batched along axis 0, batch size {size}")
  ts = [ctx.random_like(x) for x in xs]
  cts = [ctx.random_like(np.stack([y] * size)) for y in ctx.ref_out()]
  jvp = lambda f: lambda x, t: jax.jvp(f, x, t)[1]
  vjp = lambda f: lambda x, c: jax.vjp(f, *x)[1](tuple(c))
  vmap = lambda g: jax.vmap(lambda a, b: g(tuple(a), tuple(b)))
  f_b = jax.vmap(f)
  # one example's derivative: the programs the jvp and vjp checks compiled
  one = {"jvp": lambda x, t: ctx.jvp_at(direction, t, xs=x)[1],
         "vjp": lambda x, c: ctx.vjp_at(direction, c, xs=x)[1]}
  # (check, rule, batched g, arguments): vmap of a derivative traces the
  # unbatched instance's rules; a derivative of vmap runs the rules of the
  # instance that the batch rule binds, on batched types.
  cases = []
  if ctx.has("jvp"):
    cases += [("vmap of jvp vs a loop", "jvp", vmap(jvp(f)), (xs, ts)),
              ("jvp of vmap vs a loop", "jvp", jvp(f_b), (xs, ts))]
  if ctx.has("vjp"):
    cases += [("vmap of vjp vs a loop", "vjp", vmap(vjp(f)), (xs, cts)),
              ("vjp of vmap vs a loop", "vjp", vjp(f_b), (xs, cts))]
  cases = [c for c in cases if not ctx.out_of_time("batch", c[0])]
  all_got = ctx.compiled.together(
      ("batched derivatives", tuple(c[0] for c in cases)),
      [c[2] for c in cases], [(tuple(a), tuple(b)) for *_, (a, b) in cases])
  for k, (check, kind, g_b, (a, b)) in enumerate(cases):
    g_b = ctx.compiled.cached(check, lambda g_b=g_b: g_b)
    try:
      got = jax.tree.leaves(all_got[k] if all_got is not None
                            else g_b(tuple(a), tuple(b)))
      a_np, b_np = to_numpy(a), to_numpy(b)
      want = [jax.tree.leaves(one[kind]([jnp.asarray(x[k]) for x in a_np],
                                        [jnp.asarray(y[k]) for y in b_np]))
              for k in range(size)]
      want = [np.stack(ys) for ys in zip(*want)]
    except Exception as e:  # pylint: disable=broad-except
      ctx.fail_raised("batch", check, inputs, e)
      continue
    ctx.ran("batch", check)
    names = ([ctx.out_names[i] for i in ctx.out_float_idx]
             if "jvp" in check else [ctx.leaf_names[i] for i in direction])
    ctx.compare("batch", check, inputs, got, want, ctx.settings.tol,
                names=names, got_label="vmap", want_label="the loop")
