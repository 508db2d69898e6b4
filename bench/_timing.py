"""The steady-state timing the benchmarks share (run as scripts, they import
it from their own folder)."""
from __future__ import annotations

import time

import jax


def best(fn, *args, repeat=5, number=None, clock=time.perf_counter,
         wait_each=False):
  """Best seconds per call of ``fn(*args)`` over ``repeat`` loops of
  ``number`` calls (by default as many as take about 50 ms), each loop
  waiting for its last result, or with ``wait_each`` for every result (so
  that what a call waits for, such as a host callback's round trip, counts
  as it does for a user who reads every result)."""
  jax.block_until_ready(fn(*args))
  if number is None:
    t = clock()
    jax.block_until_ready(fn(*args))
    number = max(1, int(0.05 / max(clock() - t, 1e-6)))
  times = []
  for _ in range(repeat):
    t = clock()
    for _ in range(number):
      out = fn(*args)
      if wait_each:
        jax.block_until_ready(out)
    jax.block_until_ready(out)
    times.append((clock() - t) / number)
  return min(times)
