"""Tests that start a fresh process using JAX, on a machine whose accelerator
one process at a time can hold.

On a TPU the process running the tests holds the chip once it has used JAX,
and a second process then cannot start JAX there: its first use of the
devices raises (seen on a TPU v5e: "Unable to initialize backend 'tpu':
ABORTED: Internal error when accessing libtpu multi-process lockfile").
Such a test skips, quoting that error, instead of failing. Its subject still
runs on the accelerator in a process of its own: tools/accelerator_run.py
runs each page so, and its tests child reads the devices only after its
tests, so these tests, run first in a call of their own, get the chip.
"""
import re

import pytest

_HELD = re.compile(r"Unable to initialize backend '(\w+)': ABORTED: [^\n|]*lockfile[^\n|]*")


def skip_if_the_chip_is_held(output: str) -> None:
  """Skips the calling test if ``output`` (a fresh process's error) says the
  accelerator is held by another process; returns otherwise."""
  held = _HELD.search(output)
  if held:
    pytest.skip(f"one process at a time can hold a {held.group(1).upper()} and this "
                f"test's process holds it, so the fresh process could not start JAX "
                f"({held.group(0).strip()})")
