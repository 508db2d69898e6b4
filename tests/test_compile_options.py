"""The unit tests compile with XLA's backend optimizations off
(tests/conftest.py), to save compile time. What they check must be the
program a user's optimized compile runs: these tests show that the flag
leaves XLA's optimized HLO (fusions, what is kept and removed, the host
calls of a solve's failure check) unchanged, and changes only LLVM's code
generation."""
import re

import jax
import jax.numpy as jnp
import pytest

from hijax.implicit import Newton, root

import zoo


def _optimized_hlo(fn, *args):
  """The optimized HLO of ``jit(fn)`` at ``args``, without source locations
  (which name this file's lines)."""
  jax.clear_caches()
  text = jax.jit(fn).lower(*args).compile().as_text()
  text = re.sub(r", metadata=\{[^}]*\}", "", text)
  keep = [line for line in text.splitlines()
          if not re.match(r"^(FileNames|FunctionNames|FileLocations|StackFrames)$",
                          line)
          and not re.match(r"^\d+ [\"{]", line)]
  return "\n".join(keep)


@pytest.fixture
def both_settings():
  """Compiles a function twice, with most optimizations off and on; restores
  the setting the session runs with."""
  before = jax.config.read("jax_disable_most_optimizations")

  def compile_both(fn, *args):
    texts = []
    for off in (True, False):
      jax.config.update("jax_disable_most_optimizations", off)
      texts.append(_optimized_hlo(fn, *args))
    return texts
  yield compile_both
  jax.config.update("jax_disable_most_optimizations", before)


def test_the_unit_tests_run_with_most_optimizations_off():
  import os
  if "JAX_DISABLE_MOST_OPTIMIZATIONS" in os.environ:
    pytest.skip("the environment chose the setting")
  assert jax.config.read("jax_disable_most_optimizations")


def _newton_jacrev(c):
  M = jnp.eye(6) * 3 + 0.1 * jnp.arange(36.).reshape(6, 6) / 36
  g = lambda x, c: M @ x + 0.1 * jnp.tanh(x) - c
  return jax.jacrev(lambda c: root(g, jnp.zeros(6), c, solver=Newton()))(c)


def _remat_grad(x):
  f = jax.checkpoint(lambda x: zoo.log1pexp(zoo.sin_derived(x)) * jnp.exp(x))
  return jax.grad(lambda x: jnp.sum(f(f(x))))(x)


def _hiprim_vmap_grad(x):
  return jax.vmap(jax.grad(lambda x: zoo.log1pexp(x) * zoo.sin_derived(x)))(x)


@pytest.mark.parametrize("fn, arg", [
    (_newton_jacrev, jnp.linspace(-1., 1., 6)),  # a host callback in a cond
    (_remat_grad, jnp.linspace(0., 1., 5)),
    (_hiprim_vmap_grad, jnp.linspace(0., 1., 5)),
], ids=["newton-jacrev", "checkpoint-grad", "hiprim-vmap-grad"])
def test_the_optimized_program_is_the_same_with_most_optimizations_off(
    both_settings, fn, arg):
  off, on = both_settings(fn, arg)
  assert off == on
  if fn is _newton_jacrev:  # the failure check's host call is kept in both
    assert "custom-call" in on

