"""pytest setup of the unit tests: a program compiled twice in one test
process is compiled once.

Tests reach the same XLA program again and again (the same primitive, shapes
and transformations, from different examples of a property test or from
different tests), and each new Python function means a new ``jit`` cache
entry, so JAX compiles it again. JAX's persistent compilation cache, in a
directory private to this test process and removed at its end, turns those
repeats into cache loads (about 30% of the compilations of
test_properties.py). Nothing else changes: the programs are the same, and
the notebooks' kernels, which are other processes, keep a reader's
environment.
"""
import shutil
import tempfile

import jax

_CACHE_DIR = None


def pytest_configure(config):
  global _CACHE_DIR
  _CACHE_DIR = tempfile.mkdtemp(prefix="hijax-tests-jax-cache-")
  jax.config.update("jax_compilation_cache_dir", _CACHE_DIR)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_unconfigure(config):
  if _CACHE_DIR:
    shutil.rmtree(_CACHE_DIR, ignore_errors=True)
