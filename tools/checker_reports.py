"""Prints `hijax.testing.check_rules`' full report for a fixed set of cases,
so that a restructuring of the checker can show it changed no verdict.

Every entry of tests/zoo.py (right and broken rules) and a few cases the
zoo does not cover (order 3, no jit, float32, a wrong custom_jvp and
custom_vjp, a checkpointed wrong rule beside a right one, the device
check, a surrogate). No time budget, so the reports do not depend on the
machine's load. Use::

  python tools/checker_reports.py > /tmp/before.txt    # on main
  python tools/checker_reports.py > /tmp/after.txt     # on your branch
  diff /tmp/before.txt /tmp/after.txt

(about two minutes of CPU).
"""
from pathlib import Path
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from hijax.testing import check_rules  # noqa: E402
import zoo  # noqa: E402


def show(name, fn, *args, **kwargs):
  print(f"=== {name} {sorted(kwargs)}")
  try:
    r = check_rules(fn, *args, raise_on_failure=False, time_budget=None,
                    progress=False, **kwargs)
  except Exception as e:  # noqa: BLE001  (what it raised is the result)
    print(f"raised {type(e).__name__}: {e}")
    return
  print(r)
  print(f"required={r.required} compared={r.compared} "
        f"by_intent={r.by_intent} first_order_only={r.first_order_only}")


def wrong_custom_rules():
  @jax.custom_jvp
  def sin(x):
    return jnp.sin(x)

  @sin.defjvp
  def _(primals, tangents):
    return sin(primals[0]), 1.1 * jnp.cos(primals[0]) * tangents[0]

  @jax.custom_vjp
  def exp(x):
    return jnp.exp(x)
  exp.defvjp(lambda x: (jnp.exp(x), x), lambda x, g: (g * x,))
  return sin, exp


def main():
  for e in zoo.ENTRIES:
    show(e.name, e.fn, *e.args(), **e.check_kwargs)
  tanh, sin_times_y = zoo.BY_NAME["tanh"], zoo.BY_NAME["sin_times_y"]
  show("tanh, order 3", tanh.fn, *tanh.args(), order=3)
  show("tanh, no jit", tanh.fn, *tanh.args(), jit=False,
       modes=("jvp", "vjp", "lin", "batch", "second_order"))
  show("sin_times_y, float32", sin_times_y.fn, *sin_times_y.args(), x64=False)
  sin, exp = wrong_custom_rules()
  x = jnp.array([0.3, 1.0])
  show("wrong custom_jvp", sin, x)
  show("wrong custom_vjp", exp, x)
  right = zoo.right_sin()
  show("checkpointed wrong rule beside right ones",
       lambda x: jax.checkpoint(sin)(x) + right(x) * exp(x), x)
  show("relu and tanh", lambda x: jax.nn.relu(x) + jnp.tanh(x), jnp.array([0.3, -1.0]))
  cpu = jax.devices("cpu")[0]
  for name in ("tanh", "matvec", "fpt", "gather"):
    e = zoo.BY_NAME[name]
    show(f"{name}, device check", e.fn, *e.args(), device=cpu, **e.check_kwargs)

  @jax.custom_vjp
  def straight_through(x):
    return jnp.round(x)
  straight_through.defvjp(lambda x: (jnp.round(x), None), lambda _, g: (g,))
  show("surrogate", straight_through, jnp.array([0.3, 1.6]),
       surrogates=[straight_through])


if __name__ == "__main__":
  main()
