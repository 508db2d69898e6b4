"""pytest setup of the unit tests: a program compiled once is not compiled
again.

Tests reach the same XLA program again and again (the same primitive, shapes
and transformations, from different examples of a property test or from
different tests), and each new Python function means a new ``jit`` cache
entry, so JAX compiles it again. JAX's persistent compilation cache turns
those repeats into cache loads. Where ``JAX_COMPILATION_CACHE_DIR`` is set
(the nox sessions set it to a directory kept between runs, see noxfile.py),
that directory is used, shared by the test workers, the processes tests
start and later runs; otherwise a directory private to this test process,
removed at its end (about 30% of the compilations of test_properties.py are
repeats within one process).

A cache hit skips only XLA's compilation of an identical program (the key is
the program, the JAX and jaxlib versions and the compile options): tracing,
lowering, every rule and every execution happen as without it.

`check_rules`' time budget counts this process's CPU time here, not the wall
clock: on a loaded machine (two test workers, a second session beside them)
the wall clock ran four times faster than a worker's CPU, and checks that
pass on a quiet machine ended "skipped for time". The tests of the budget
itself run on clocks of their own (tests/test_testing_budget.py).
"""
import importlib.metadata
import importlib.util
import os
import shutil
import sys
import tempfile
import time
import types
from pathlib import Path

import pytest

_PRIVATE_DIR = None


def pytest_configure(config):
  global _PRIVATE_DIR
  if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
    return  # pytest-xdist's controller runs no test: its workers import JAX
  import jax
  if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    _PRIVATE_DIR = tempfile.mkdtemp(prefix="hijax-tests-jax-cache-")
    jax.config.update("jax_compilation_cache_dir", _PRIVATE_DIR)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  from hijax.testing import _compiled
  _compiled._clock = time.process_time


def pytest_report_header(config):
  version = importlib.metadata.version
  return f"jax {version('jax')}, jaxlib {version('jaxlib')}"


def pytest_unconfigure(config):
  if _PRIVATE_DIR:
    shutil.rmtree(_PRIVATE_DIR, ignore_errors=True)


@pytest.fixture
def noxfile(monkeypatch):
  """noxfile.py loaded as a module, nox stubbed (its sessions plain functions)."""
  path = Path(__file__).resolve().parent.parent / "noxfile.py"
  if not path.exists():
    pytest.skip("no noxfile.py (an sdist)")
  stub = types.ModuleType("nox")
  stub.options = types.SimpleNamespace()
  stub.session = lambda *args, **kwargs: (lambda fn: fn)
  monkeypatch.setitem(sys.modules, "nox", stub)
  saved = dict(os.environ)  # loading it changes os.environ (bytecode)
  try:
    spec = importlib.util.spec_from_file_location("noxfile_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
  finally:
    os.environ.clear()
    os.environ.update(saved)
  return module
