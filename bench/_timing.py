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


RESULTS = "results.json"  # beside this file: the record the performance page reads


def machine() -> dict:
  """Where this run ran: JAX's backend and device, and the CPU (its model,
  its cores, and the cores this process may use, e.g. 1 under taskset)."""
  import os
  import platform
  model = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      model = next(line.split(":", 1)[1].strip() for line in f
                   if line.startswith("model name"))
  except (OSError, StopIteration):
    pass
  device = jax.devices()[0]
  return {"backend": device.platform, "device": device.device_kind,
          "cpu": model, "cores": os.cpu_count(),
          "cores used": len(os.sched_getaffinity(0))
          if hasattr(os, "sched_getaffinity") else os.cpu_count()}


def add_save_option(parser) -> None:
  """The ``--save`` option every benchmark takes (see `save`)."""
  parser.add_argument(
      "--save", action="store_true",
      help=f"append this run's figures to bench/{RESULTS}, the record the "
      "documentation's performance page shows")


def save(options, bench: str, figures: dict, clock: str = "wall") -> None:
  """With ``--save``, append one run to ``bench/results.json``: the
  benchmark's name, the date (UTC), JAX's version, the machine, the clock
  (``wall`` or ``cpu``), the run's options and its figures (times in
  seconds). Then ``python tools/page_data.py write performance``."""
  if not getattr(options, "save", False):
    return
  import datetime
  import json
  import os
  import sys
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), RESULTS)
  runs = []
  if os.path.exists(path):
    with open(path) as f:
      runs = json.load(f)
  runs.append({
      "bench": bench,
      "date": datetime.datetime.now(datetime.timezone.utc).strftime(
          "%Y-%m-%d %H:%M"),
      "jax": jax.__version__,
      "machine": machine(),
      "clock": clock,
      "options": " ".join(sys.argv[1:]),
      "figures": figures,
  })
  with open(path, "w") as f:
    json.dump(runs, f, indent=1)
    f.write("\n")
  print(f"saved to bench/{RESULTS} (run {len(runs)}); then: python "
        "tools/page_data.py write performance")
