#!/usr/bin/env python
"""Run a library's own test suite with ``pytest --hijax-check-rules`` and
without it: what the plugin finds, and what recording costs.

Not a CI step: it needs the library's checkout and an environment with its
test dependencies (CI has no network). The figures on
docs/pytest-plugin.md come from the results file it writes
(tools/plugin_on_library_equinox.json), made like this::

  git --git-dir=<equinox.git> archive dfadb04 equinox tests pyproject.toml \\
      | tar -x -C /tmp/eqx                      # equinox 0.13.8
  uv venv /tmp/eqxvenv --python 3.12
  VIRTUAL_ENV=/tmp/eqxvenv uv pip install jax==0.12.0.1 jaxlib==0.12.0.1 \\
      jaxtyping wadler_lindig typing_extensions beartype optax pytest
  VIRTUAL_ENV=/tmp/eqxvenv uv pip install --no-deps -e /tmp/eqx -e .
  python tools/plugin_on_library.py --python /tmp/eqxvenv/bin/python \\
      --repo /tmp/eqx --name equinox --version 0.13.8 --repeat 1 \\
      --pytest-args "-k 'not test_speed'" tests/test_ad.py \\
      tests/test_debug.py tests/test_finalise_jaxpr.py tests/test_errors.py \\
      tests/test_enum.py tests/test_nontraceable.py tests/test_noinline.py \\
      tests/test_primitive.py

(the test files that call equinox's rules outside its loops: the whole
suite, about 545 s of CPU time without the plugin, did not fit twice at once
on the shared two-core machine; ``test_speed_*`` time loops and compare
the timings: they fail on a busy machine with or without the plugin.) The
runs with the plugin declare the library's deliberate rules (`DELIBERATE`). The other libraries' results files
say how each was run (``tests_selected``, ``pytest_args``; the plugin's
defaults otherwise).

Timing. The machines this runs on are shared, and their load changes over
the minutes a suite takes, so the runs with and without the plugin run at
the same time, as two processes, ``--repeat`` times: both see the same
load. Each loads a small timing plugin that notes the wall-clock and the
process's CPU time (all its threads, XLA's compiler included) when the
session starts and when it finishes, before the plugin's checks at the
end: the cost of recording, as the median over the pairs of the ratio on /
off minus 1, of wall-clock and CPU time. The runs with the plugin on record
as usual but skip the checks (``--hijax-rules-budget=0``) except the last,
which checks with the budget given and whose table and JSON report are
kept. The whole cost, ``cpu_total`` (what the page holds to 30%), is the
last pair's ratio of the two processes' whole CPU time (as the OS counts
it: start-up, recording and the checks at the end included) minus 1.
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TIMING_PLUGIN = '''
import json, os, time
import pytest

_start = {}
_failed = []

def pytest_runtest_logreport(report):
  if report.failed:
    _failed.append(report.nodeid)

def pytest_sessionstart(session):
  _start["wall"], _start["cpu"] = time.perf_counter(), time.process_time()

@pytest.hookimpl(tryfirst=True)  # before the plugin's checks
def pytest_sessionfinish(session, exitstatus):
  with open(os.environ["HIJAX_TIMING_OUT"], "w") as f:
    json.dump({"wall": time.perf_counter() - _start["wall"],
               "cpu": time.process_time() - _start["cpu"],
               "tests": session.testscollected,
               "failed": sorted(set(_failed))}, f)
'''

# Rules each suite defines wrong on purpose, declared as its maintainers
# would (``hijax_deliberate``, given with ``-o`` to the runs with the plugin).
# Equinox's test files hold fixtures of its decorators: rules returning
# ``g + 2`` or NaN to be seen called (surrogates), rules asserting which
# tangents are symbolic zeros in the one call the test makes, or that they
# are never called, and a jvp whose primal output adds an input the function
# ignores (the test checks only that no tracer leaks): their checks skipped.
_NOT_CALLED = "skip jvp,vjp,lin,transpose,second_order"
DELIBERATE = {"equinox": (
    *(f"tests/test_ad.py:{line}: surrogate" for line in (128, 158, 351, 375,
                                                          594)),
    "tests/test_debug.py:9: surrogate",
    *(f"tests/test_ad.py:{line}: {_NOT_CALLED}" for line in (411, 448, 521,
                                                             556)),
    *(f"tests/test_finalise_jaxpr.py:{line}: {_NOT_CALLED}"
      for line in (166, 182)))}


def start(args, on, final, workdir):
  """Starts one pytest run of the library's suite (in its own directory
  under ``workdir``, for its timing and report files)."""
  workdir.mkdir()
  cmd = [args.python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-p", "_hijax_timing", *args.pytest_args, *args.tests]
  if on:
    cmd += ["--hijax-check-rules", "--hijax-rules-fail-on=never",
            "--hijax-rules-json", str(workdir / "rules.json"),
            f"--hijax-rules-budget={args.budget if final else 0}",
            f"--hijax-rule-budget={args.rule_budget}"]
    if deliberate := DELIBERATE.get(args.name):
      cmd += ["-o", "hijax_deliberate=" + "\n".join(deliberate)]
  env = dict(os.environ, HIJAX_TIMING_OUT=str(workdir / "timing.json"),
             PYTHONPATH=os.pathsep.join(
                 [str(workdir.parent), os.environ.get("PYTHONPATH", "")]))
  with open(workdir / "output.txt", "w") as out:  # (the child keeps it)
    return subprocess.Popen(cmd, cwd=args.repo, env=env, stdout=out,
                            stderr=subprocess.STDOUT)


def finish(process, on, final, workdir):
  """Waits for a run: its timing (and with the plugin on, its JSON report
  and output)."""
  _, status, usage = os.wait4(process.pid, 0)  # (CPU of the whole run)
  process.returncode = os.waitstatus_to_exitcode(status)
  output = (workdir / "output.txt").read_text()
  result = json.loads((workdir / "timing.json").read_text())
  result["cpu_total"] = usage.ru_utime + usage.ru_stime
  if on and final:
    result["report"] = json.loads((workdir / "rules.json").read_text())
    result["output"] = output
  print(f"{'on ' if on else 'off'}: {result['wall']:.1f} s wall, "
        f"{result['cpu']:.1f} s CPU ({result['cpu_total']:.1f} s with start "
        f"and checks), {result['tests']} tests, "
        f"{len(result['failed'])} failed", flush=True)
  return result


def _table(output):
  """The plugin's lines of the output: from the table's heading on, without
  pytest's last line."""
  lines = output.splitlines()
  start = next(i for i, line in enumerate(lines)
               if "hijax: custom derivative rules called by the tests" in line)
  end = len(lines)
  if lines and (" passed" in lines[-1] or " failed" in lines[-1]):
    end -= 1
  return lines[start + 1:end]


def overheads(offs, ons):
  """Median over the pairs of runs of on / off - 1: of wall-clock and CPU
  time while the tests ran, and (``cpu_total``) of the whole process's CPU
  time, start-up and the final run's checks included (what a CI job pays;
  only the final run checks, so only its pair counts for it)."""
  out = {k: statistics.median(on[k] / off[k] - 1
                              for on, off in zip(ons, offs))
         for k in ("wall", "cpu")}
  if "cpu_total" in ons[-1] and "cpu_total" in offs[-1]:
    out["cpu_total"] = ons[-1]["cpu_total"] / offs[-1]["cpu_total"] - 1
  return out


def _run_row(r):
  return {"wall": round(r["wall"], 2), "cpu": round(r["cpu"], 2),
          "cpu_total": round(r.get("cpu_total", float("nan")), 2),
          "failed": r.get("failed")}


def summarize(report):
  """Per verdict, the rules the report gives it; for the failed and
  inconclusive ones, where they are defined and why (the detail's first
  line)."""
  out = {"counts": dict(report.get("counts", {}))}
  for verdict in ("failed", "inconclusive"):
    out[verdict] = [{"rule": r["rule"], "via": r.get("via"),
                     "defined_at": r["defined_at"],
                     "reason": (r.get("detail") or "").strip()
                     .splitlines()[0:1]}
                    for r in report.get("rules", [])
                    if r["verdict"] == verdict]
    for row in out[verdict]:
      row["reason"] = row["reason"][0] if row["reason"] else ""
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--python", required=True,
                      help="the interpreter of the library's environment")
  parser.add_argument("--repo", required=True, help="the library's checkout")
  parser.add_argument("--name", required=True)
  parser.add_argument("--version", required=True)
  parser.add_argument("--repeat", type=int, default=2)
  parser.add_argument("--budget", default="25%",
                      help="--hijax-rules-budget of the final run (seconds, "
                      "or a share of the tests' CPU time like 25%%)")
  parser.add_argument("--out", default=None,
                      help="results file (default tools/"
                      "plugin_on_library_<name>.json)")
  parser.add_argument("--rule-budget", type=float, default=30.0,
                      help="--hijax-rule-budget of the final run")
  parser.add_argument("--pytest-args", default="",
                      help="more pytest arguments, one string (e.g. "
                      "\"-k 'not speed'\")")
  parser.add_argument("tests", nargs="*", default=["tests"])
  args = parser.parse_args(argv)
  args.pytest_args = shlex.split(args.pytest_args)
  out_path = Path(args.out or ROOT / "tools" /
                  f"plugin_on_library_{args.name}.json")
  with tempfile.TemporaryDirectory() as tmp:
    (Path(tmp) / "_hijax_timing.py").write_text(TIMING_PLUGIN)
    offs, ons = [], []
    for i in range(args.repeat):
      final = i == args.repeat - 1
      dirs = [Path(tmp) / f"off{i}", Path(tmp) / f"on{i}"]
      off = start(args, False, final, dirs[0])
      on = start(args, True, final, dirs[1])
      offs.append(finish(off, False, final, dirs[0]))
      ons.append(finish(on, True, final, dirs[1]))
  final = ons[-1]
  overhead = overheads(offs, ons)
  results = {
      "library": args.name, "version": args.version,
      "python": subprocess.run(
          [args.python, "-c", "import jax, sys; print(jax.__version__, "
           "sys.version.split()[0])"], capture_output=True, text=True,
          check=True).stdout.split(),
      "tests_selected": args.tests, "pytest_args": args.pytest_args,
      "deliberate": list(DELIBERATE.get(args.name, ())),
      "tests_run": final["tests"],
      "runs": {"off": [_run_row(r) for r in offs],
               "on": [_run_row(r) for r in ons]},
      "overhead": {k: round(v, 4) for k, v in overhead.items()},
      "summary": summarize(final["report"]),
      "report": final["report"],
      "table": _table(final["output"]),
  }
  out_path.write_text(json.dumps(results, indent=1) + "\n")
  print(json.dumps(results["summary"], indent=1))
  print(f"overhead: wall {overhead['wall']:+.1%}, CPU {overhead['cpu']:+.1%}, "
        f"CPU with checks {overhead.get('cpu_total', float('nan')):+.1%}; "
        f"wrote {out_path}")


if __name__ == "__main__":
  main()
