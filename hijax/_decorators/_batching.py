"""``vmap`` of a decorated function by a `defbatch` rule (`BatchedByRule`,
differentiated as `Batched`), and of a call with no batched argument inside
a named ``vmap`` (the function may use the name)."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from hijax import _checks
from hijax._decorators import _tracing
from hijax._decorators._outputs import pair
from hijax._internals import batching, core
from hijax._util import is_none
from hijax.batching import Batched, batch_from_dim_rule, vmap_rule


def batch_unbatched_call(prim, axis_data, args_flat):
  """A call with no batched argument inside a named vmap."""
  args = jax.tree.unflatten(prim.in_tree, args_flat)
  dims = jax.tree.map(lambda _: None, args)
  infer = jax.tree.map(lambda _: batching.infer, prim.out_aval)
  found = []  # where vmapping the function batches its outputs
  jax.make_jaxpr(lambda *a: found.append(
      vmap_rule(axis_data, prim.expand, dims, infer)(*a)[1]))(*args)
  out_dim = found[0]
  out = UnbatchedCallBatched(prim, axis_data, dims, out_dim)(*args)
  return (jax.tree.leaves(out),
          jax.tree.leaves(out_dim, is_leaf=is_none))


class UnbatchedCallBatched(Batched):
  """`Batched` for a call with no batched argument, whose outputs are
  batched where vmapping the function makes them so: a rule whose output is
  batched where the function's is not raises JAX's error for it."""

  def _batched_where_none(self, f: Any, e: ValueError) -> Exception:
    owner = self.prim
    member = ("jvp rule" if getattr(f, "__name__", "") == "jvp"
              else "fwd rule" if owner.decorated.kind == "custom_vjp" else "rules")
    return ValueError(
        f"under vmap, the {member} of {owner.name} produced an output "
        "batched along the mapped axis where the application itself was "
        f"inferred to be unbatched.\n{owner}: no argument of this call is "
        "batched, but a value its rules compute depends on the vmap axis "
        f"{self.axis_data.name!r} (an axis_index or a collective, say) where "
        "the function's own value does not. Compute that value in the "
        "function too, or pass what it depends on as a batched argument")


def batch_by_rule(prim, rule, axis_data, args, dims):
  rule_name = f"its batch rule {_tracing.function_name(rule)}"
  *xs, hvals = args
  size, x_dims = axis_data.size, list(dims[:-1])
  in_batched = list(prim.signature.merge(
      [jax.tree.map(lambda _: False, s) for s in prim.statics],
      jax.tree.map(lambda d: d is not None, x_dims, is_leaf=is_none)))
  examples = tuple(jax.tree.map(_example, x_dims, xs, is_leaf=is_none))
  found = []

  def run(*moved):
    out, out_batched = pair(prim, rule_name, rule(
        size, in_batched, *prim.full_args(moved)), "(out, out_batched)")
    found.append(_flags(prim, rule_name, out_batched))
    return prim.kept_leaves(_check_batched(prim, rule_name, out, found[0],
                                           size))

  hoisted = _tracing.Hoisted(hvals)  # the call's traced values: the rule's
  with _tracing.running(prim, hvals):
    traced, _ = _tracing.trace(run, examples, hoisted)
  if len(hoisted) > len(hvals):  # it closes over another: vmap the function
    return batch_from_dim_rule(prim, axis_data, args, dims)
  out_dim = jax.tree.unflatten(prim.out_tree, [
      0 if b else None for b in prim.kept_leaves(found[0])])
  new = BatchedByRule(prim, axis_data, dims, out_dim, traced)
  return new(*args), out_dim


def _example(d, x):  # x with its batch axis d first
  shape = core.typeof(x).shape
  if d is not None:
    shape = (shape[d], *shape[:d], *shape[d + 1:])
  return jax.ShapeDtypeStruct(shape, core.typeof(x).dtype)


def _flags(owner, rule_name, out_batched) -> list[bool]:
  if isinstance(out_batched, bool):
    return [out_batched] * len(owner.fun_avals)
  try:
    flags: list[Any] = owner.fun_tree.flatten_up_to(out_batched)
  except (ValueError, TypeError):
    flags = [None]
  if not all(isinstance(b, bool) for b in flags):
    raise owner.error(
        rule_name, "must return (out, out_batched) with out_batched a bool or "
        "a pytree of bools with the structure of the output "
        f"({owner.fun_tree}), but out_batched is {out_batched!r}")
  return flags


def _check_batched(owner, rule_name, out, flags, size) -> list[Any]:
  try:
    out_flat = owner.fun_tree.flatten_up_to(out)
  except (ValueError, TypeError):
    raise owner.error(
        rule_name, f"returned an output with structure "
        f"{jax.tree.structure(out)}, but {owner.name} returns structure "
        f"{owner.fun_tree}") from None
  for i, (x, batched, aval) in enumerate(zip(out_flat, flags,
                                             owner.fun_avals)):
    declared = aval.update(shape=(size, *aval.shape)) if batched else aval
    actual = _checks.type_of(x)
    if not _checks.matches(declared, actual, "rule-primal"):
      got = "a non-JAX value" if actual is None else actual.str_short()
      what = "the output" if len(out_flat) == 1 else f"output {i}"
      raise owner.error(
          rule_name, f"returned {got} as {what}, which it says is "
          f"{'batched' if batched else 'not batched'}, but "
          f"{owner.name} returns {aval.str_short()} there, so the rule "
          f"must return {declared.str_short()} (a batched output has the "
          f"batch axis, of size {size}, first)", _checks.RuleTypeError)
  return out_flat


class BatchedByRule(Batched):
  """A call applied to a batch, computed by its batch rule (traced, reading
  the call's hoisted values); its derivatives are `Batched`'s (the call's
  rules, vmapped)."""

  _rule: Any

  def __init__(self, prim: Any, axis_data: Any, in_dims: Any, out_dim: Any,
               rule: Any) -> None:
    self.effects = rule.effects
    super().__init__(prim, axis_data, in_dims, out_dim, _rule=rule)

  def pp_params(self) -> dict[str, Any]:
    return {"fun": self.prim.name}

  def expand(self, *args: Any) -> Any:
    *xs, hvals = args
    moved = jax.tree.map(lambda d, x: x if d is None else jnp.moveaxis(x, d, 0),
                         list(self.in_dims[:-1]), xs, is_leaf=is_none)
    out_flat = self._rule(hvals, *moved)
    out_dim_flat = jax.tree.leaves(self.out_dim, is_leaf=is_none)
    return jax.tree.unflatten(self.out_tree, [
        x if d is None else jnp.moveaxis(x, 0, d)
        for x, d in zip(out_flat, out_dim_flat)])
