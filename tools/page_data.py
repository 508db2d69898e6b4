"""The recorded results a page shows, carried inside the page.

A page that shows figures from a committed record (benchmark results, runs on
an accelerator, the pytest plugin's runs on libraries) holds just those
figures in one hidden code cell tagged ``page-data``, which binds ``RECORD``.
So its notebook runs when downloaded alone, with no checkout beside it, and
the site shows what the record says. The record files stay the source: this
tool writes each page's cell from them, and ``check`` fails where a page's
cell is not what its record gives (``tests/test_page_data.py``).

  python tools/page_data.py write [PAGE ...]   rewrite the pages' cells
  python tools/page_data.py check              exit 1 where a cell is stale

After ``write``, regenerate the changed pages' notebooks
(``nox -s notebooks -- PAGE``).

A page takes part by having an entry in ``EXTRACTORS``: its name, mapped to a
function that reads the records (paths relative to the checkout) and returns
a small value of plain Python literals (dicts, lists, str, int, float, bool,
None): what the page shows and asserts, nothing more.
"""
from __future__ import annotations

import json
import pprint
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
TAG = "page-data"


def read_json(relative: str):
  """A record file of the checkout, parsed."""
  return json.loads((ROOT / relative).read_text())


# page name -> the function that picks what the page shows from the records.
EXTRACTORS: dict[str, Callable[[], object]] = {}


def extractor(page: str, sources: str):
  """Register the decorated function as the extractor of `page`; `sources`
  names the record files it reads, for the cell's first line."""
  def register(fn):
    fn.sources = sources
    EXTRACTORS[page] = fn
    return fn
  return register


# --- accelerators (docs/accelerators.md): the runs on a TPU ----------------------

# The runs in docs/accelerator-results.json, in the order they ran.
_TPU_RUNS = ("before", "after", "third", "fourth", "fifth", "sixth", "seventh", "eighth",
             "ninth", "tenth")


def _tpu_run_commits(record: dict, label: str) -> list[str]:
  """The hijax commits a run ran at: its runs' own ``at``, else the one the
  record's ``about`` names for it ("'fourth' ran at 9338683")."""
  own = [r["at"] for r in record[label]["runs"] if "at" in r]
  if own:
    return list(dict.fromkeys(own))
  about = record["about"]
  start = about.index(f"'{label}' ran")
  return [re.compile(r"\bat ([0-9a-f]{7})\b").search(about, start)[1]]


def _tpu_call_cost(output: str) -> dict[str, float]:
  """bench/bench_call_cost.py's lines "NAME  123.4 us": microseconds a call."""
  return {m[1]: float(m[2]) for m in re.finditer(
      r"^(\S.*?\S)\s+([\d.]+) us$", output, re.M)}


@extractor("accelerators", "docs/accelerator-results.json")
def _accelerators():
  record = read_json("docs/accelerator-results.json")
  facts, env = record["facts"], record["environment"]
  rows, latest_tests, latest_pages = [], {}, {}
  for label in _TPU_RUNS:
    run = record[label]
    tests, pages = run.get("tests", {}), run.get("pages", {})
    latest_tests.update(dict.fromkeys(tests, label))
    latest_pages.update(dict.fromkeys(pages, label))
    rows.append({
        "run": label,
        "date": run.get("environment", env)["date"],
        "jax": run.get("environment", env)["jax"],
        "commits": _tpu_run_commits(record, label),
        "test files": len(tests),
        "tests": [sum(t[k] + (t.get("error", 0) if k == "failed" else 0)
                      for t in tests.values()) for k in ("passed", "failed", "skipped")],
        "pages": len(pages),
        "cells": [sum(p[k] for p in pages.values()) for k in ("cells", "failed", "not run")],
        "cut short": any(r["status"] == "killed at the deadline" for r in run["runs"]),
    })
  for row in rows:
    row["latest for"] = [sum(v == row["run"] for v in latest_tests.values()),
                         sum(v == row["run"] for v in latest_pages.values())]
  latest = [record[label]["tests"][name] for name, label in latest_tests.items()]
  latest_page_runs = [record[label]["pages"][name] for name, label in latest_pages.items()]
  checker = record["seventh"]["facts"]["checker"]
  float64_check = facts["checker"]["broken x64=None"]
  return {
      "backends": sorted({r["environment"]["backend"] for r in record.values()
                          if isinstance(r, dict) and "environment" in r}),
      "device": {k: env[k] for k in ("device_kind", "backend", "device_count", "jax",
                                     "python")},
      "matmul": {p: {k: round(v, 2) for k, v in r.items()}
                 for p, r in facts["matmul"].items()},
      "transcendental": {f: {"max_ulp": round(r["max_ulp"], 1), "at": round(r["at"], 4),
                             "median_ulp": round(r["median_ulp"], 1)}
                         for f, r in facts["transcendental"].items()},
      "float64": {op: True if r["ok"] else r["error"].split(":     @")[0]
                  for op, r in facts["float64"].items()},
      "cost": {what: {k: float(f"{v:.3g}") for k, v in r.items()}
               for what, r in facts["cost"].items()},
      "call_cost_us": _tpu_call_cost(record["fourth"]["bench"]["bench_call_cost"]["output"]),
      "checker_seconds": {case[:-len(" default again")]: {
          "verdict": r["verdict"], "with device": r["seconds"],
          "host only": checker[case.replace("default", "host only")]["seconds"]}
          for case, r in checker.items() if case.endswith("default again")},
      "float64_check": {"seconds": float64_check["seconds"],
                        "backend_compiles": float64_check["backend_compiles"]},
      "callback_errors": record["seventh"]["facts"]["callback_errors"],
      "runs": rows,
      "float32 rule, run 9": {
          k: {"verdict": r["verdict"], "tolerance_ulps": round(float(re.findall(
              r"tolerance ([\d.]+) ulps", r.get("device check", r.get("first failure")))[0]))}
          for k, r in record["ninth"]["float32_rule"].items() if k != "what"},
      "visible cells, run 8": {k: record["eighth"]["tests"]["tests/test_visible_cells.py"][k]
                               for k in ("passed", "failed")},
      "latest": {"test files": len(latest), "pages": len(latest_page_runs),
                 "failed": sum(t["failed"] + t.get("error", 0) for t in latest)
                           + sum(p["failed"] + p["not run"] for p in latest_page_runs),
                 "skips": sorted(s.split(": Skipped: ", 1)[1].split(": /")[0]  # no paths
                                 for t in latest for s in t["skips"])},
  }


_CELL = re.compile(
    r"(```\{code-cell\}[^\n]*\n:tags: \[[^\]\n]*\b" + re.escape(TAG)
    + r"\b[^\]\n]*\]\n\n)(.*?)(^```)", re.S | re.M)


def cell_source(value: object, sources: str) -> str:
  """The body of a page-data cell holding `value`."""
  literal = pprint.pformat(value, width=88, sort_dicts=False)
  head = f"# The recorded results this page shows, from {sources}"
  if len(head) > 88:  # wider than a code block on the site
    head = f"# The recorded results this page shows, from\n# {sources}"
  return (f"{head}\n"
          f"# (written by tools/page_data.py; edit the record, not this cell).\n"
          f"RECORD = {literal}\n")


def expected(page: str) -> str:
  fn = EXTRACTORS[page]
  return cell_source(fn(), fn.sources)


def current(page: str) -> str | None:
  """The body of the page's page-data cell, or None if it has none."""
  match = _CELL.search((DOCS / f"{page}.md").read_text())
  return match.group(2) if match else None


def write(page: str) -> bool:
  """Rewrite the page's cell from its record; True if the page changed."""
  path = DOCS / f"{page}.md"
  text = path.read_text()
  if not _CELL.search(text):
    raise SystemExit(
        f"docs/{page}.md has no code cell tagged {TAG!r}: add one "
        f"(```{{code-cell}}, then ':tags: [remove-cell, {TAG}]') where the "
        f"page first needs RECORD, then run this again")
  new = _CELL.sub(lambda m: m.group(1) + expected(page) + m.group(3), text, count=1)
  if new != text:
    path.write_text(new)
  return new != text


def stale() -> list[str]:
  """Pages whose page-data cell differs from what their records give."""
  return [page for page in EXTRACTORS if current(page) != expected(page)]


# --- Pages that state figures of the TPU runs or of the pytest plugin's runs:
# checking-rules, cookbook, custom-derivatives, hijax-types, implicit,
# porting-custom-vjp, sparse-jacobians, spectral-gradients, vjp-objects,
# pytest-plugin. Each carries the parts of the record its cells read, nested
# as in the record, so the cells index RECORD as they would the file.
ACCELERATOR_RESULTS = "docs/accelerator-results.json"


def pick(record, *paths: tuple):
  """The parts of `record` at `paths` (each a tuple of keys), nested as in
  the record."""
  out: dict = {}
  for path in paths:
    source, target = record, out
    for key in path[:-1]:
      source = source[key]
      target = target.setdefault(key, {})
    target[path[-1]] = source[path[-1]]
  return out


def _accelerator_page(page: str, *paths: tuple):
  extractor(page, ACCELERATOR_RESULTS)(
      lambda: pick(read_json(ACCELERATOR_RESULTS), *paths))


_MATMUL_DEFAULT = ("facts", "matmul", "default", "matmul_eps")
_CALL_COST = ("fourth", "bench", "bench_call_cost", "output")


def _ulps(*names: str) -> list[tuple]:
  return [("facts", "transcendental", name) for name in names]


_accelerator_page("checking-rules", ("facts", "checker", "broken x64=None"),
                  *[("facts", "float64", op) for op in ("solve", "fft", "slogdet")],
                  _MATMUL_DEFAULT)
_accelerator_page("cookbook", _MATMUL_DEFAULT, ("facts", "matmul", "highest", "matmul_eps"),
                  *_ulps("log", "log1p"))
_accelerator_page("custom-derivatives", _MATMUL_DEFAULT, *_ulps("exp", "log", "log1p"),
                  ("third", "pages", "custom-derivatives", "failures"))
_accelerator_page("hijax-types", _MATMUL_DEFAULT)
_accelerator_page("implicit", _MATMUL_DEFAULT, ("facts", "float64", "solve"),
                  ("third", "pages", "implicit", "failures"),
                  ("fourth", "pages", "implicit", "failures"),
                  ("sixth", "pages", "implicit", "failures"), _CALL_COST)
_accelerator_page("porting-custom-vjp", *_ulps("exp", "log1p", "logistic"))
_accelerator_page("sparse-jacobians", ("third", "pages", "sparse-jacobians", "failures"),
                  _CALL_COST)
_accelerator_page("spectral-gradients", _MATMUL_DEFAULT, *_ulps("exp"))
_accelerator_page("vjp-objects", _MATMUL_DEFAULT, *_ulps("tanh"))


def _plugin_rules(rules: list, input_keys: tuple, batch_refusals: bool = False) -> list:
  """What the pytest-plugin page shows and asserts of each rule of a plugin
  report: its name, where defined, verdict, detail, and of each input the
  `input_keys` it has (and, with `batch_refusals`, its skipped batch
  combinations)."""
  out = []
  for r in rules:
    inputs = []
    for i in r["inputs"]:
      kept = {k: i[k] for k in input_keys if k in i}
      if batch_refusals:
        kept["skipped"] = [s for s in i.get("skipped", []) if s.startswith("batch: ")]
      inputs.append(kept)
    out.append({k: r[k] for k in ("rule", "defined_at", "in_test_file", "verdict",
                                  "detail")} | {"inputs": inputs})
  return out


# The libraries whose suites' runs the pytest-plugin page tabulates.
LIBRARIES = ("optimistix", "lineax", "diffrax", "optax")


def _library_run(lib: str) -> dict:
  """Of tools/plugin_on_library_<lib>.json: what was run, the overhead, the
  verdicts, and each rule's name, where, verdict and reason."""
  run = read_json(f"tools/plugin_on_library_{lib}.json")
  return {"version": run["version"], "tests_run": run["tests_run"],
          "failed_tests": run["runs"]["on"][-1]["failed"],
          "cpu_total": run["overhead"]["cpu_total"],
          "counts": run["report"]["counts"],
          "budget": round(run["report"]["checks"]["budget"], 1),
          "checks_cpu": round(run["report"]["checks"].get("cpu_seconds", 0), 1),
          "rules": [{"rule": r["rule"], "defined_at": r["defined_at"],
                     "verdict": r["verdict"],
                     "reason": (r["detail"] or "").split("; if deliberate")[0],
                     "not_checked": [i["detail"] for i in r["inputs"]
                                     if i["verdict"] == "not checked"]}
                    for r in run["report"]["rules"]]}


def _equinox_fully_checked() -> dict:
  """Of tools/plugin_on_library_equinox_budget600.json (the same run at a
  600 s budget): what was run, the checks' budget and CPU time, and each
  rule's name, whether a test file defines it, verdict and reason."""
  run = read_json("tools/plugin_on_library_equinox_budget600.json")
  report = run["report"]
  return {"tests_run": run["tests_run"], "pytest_args": run["pytest_args"],
          "deliberate": len(run["deliberate"]),
          "failed_tests": run["runs"]["on"][-1]["failed"],
          "checks": {k: round(report["checks"][k], 1)
                     for k in ("budget", "cpu_seconds")},
          "rules": [{"rule": r["rule"], "in_test_file": r["in_test_file"],
                     "verdict": r["verdict"],
                     "reason": (r["detail"] or "").split("; if deliberate")[0]}
                    for r in report["rules"]]}


@extractor("pytest-plugin", "tools/plugin_on_*.json and " + ACCELERATOR_RESULTS)
def _pytest_plugin():
  own = read_json("tools/plugin_on_own_examples.json")
  equinox = read_json("tools/plugin_on_library_equinox.json")
  report = equinox["report"]
  return {
      "own_examples": {"rules": _plugin_rules(own["rules"], (), batch_refusals=True),
                       "counts": own["counts"]},
      "equinox": {"version": equinox["version"], "tests_run": equinox["tests_run"],
                  "runs": equinox["runs"],
                  "table": [line for line in equinox["table"] if line.startswith("FAILED")],
                  "report": {"recording": {k: report["recording"][k]
                                           for k in ("calls", "seconds", "errors")},
                             "checks": {k: report["checks"][k] for k in ("seconds", "budget")},
                             "rules": _plugin_rules(report["rules"], (
                                 "test", "verdict", "skipped", "by_intent"))}},
      "equinox_budget600": _equinox_fully_checked(),
      "tpu": pick(read_json(ACCELERATOR_RESULTS), *_ulps("log", "tanh"),
                  ("third", "pages", "pytest-plugin", "failures")),
      "libraries": {lib: _library_run(lib) for lib in LIBRARIES},
      "trials": {name: {k: t[k] for k in ("library", "kind", "rule", "defect",
                                          "tests_caught", "plugin_caught",
                                          "plugin")}
                 for name, t in read_json("tools/plugin_trials.json")["trials"].items()},
  }


def main(argv: list[str]) -> int:
  if not argv or argv[0] not in ("write", "check"):
    print(__doc__)
    return 2
  if argv[0] == "write":
    for page in argv[1:] or list(EXTRACTORS):
      if write(page):
        print(f"docs/{page}.md: page-data cell rewritten; regenerate its notebook")
    return 0
  bad = stale()
  for page in bad:
    print(f"docs/{page}.md: its page-data cell is not what its record gives: "
          f"run `python tools/page_data.py write {page}`")
  return 1 if bad else 0


# --- performance (docs/performance.md): the benchmarks' runs -----------------
# bench/results.json (each bench's --save) and the benchmark outputs of the TPU
# runs in docs/accelerator-results.json. Every ratio is hijax's time over its
# anchor's (below 1: hijax takes less time).

def _sig(x: float) -> float:
  return float(f"{x:.3g}")


HIPRIM_ROWS = ("eager call", "eager grad", "eager jvp", "jit(grad) compile", "construct",
               "construct and hash")


def _hiprim(seconds: dict) -> dict:
  ratios = {}
  for ours, anchor, label in (("hijax HiPrim", "jax HiPrim", "HiPrim"),
                              ("hijax.custom_vjp", "jax.custom_vjp", "custom_vjp"),
                              ("hijax.custom_jvp", "jax.custom_jvp", "custom_jvp")):
    if ours in seconds and anchor in seconds:
      for row in HIPRIM_ROWS:
        if row in seconds[ours] and row in seconds[anchor]:
          ratios[f"{label}: {row}"] = _sig(seconds[ours][row] / seconds[anchor][row])
  return {"ratios": ratios}


def _implicit(figures: dict) -> dict:
  rows = figures["rows"]
  return {"ratios": {**{name: _sig(1 / r["ratio"]) for name, r in rows.items()},
                     **{name: _sig(1 / figures[name]["ratio"])
                        for name in ("eager fixed_point", "eager-lambda root")}},
          "compile": {name: _sig(1 / r["compile ratio"]) for name, r in rows.items()},
          "seconds": {name: _sig(r["hijax seconds"]) for name, r in rows.items()}}


def _per_run(run: dict) -> dict:
  bench, figures = run["bench"], run["figures"]
  if bench == "bench_hiprim":
    ratios = _hiprim(figures["seconds"])["ratios"]
    # the decorators' interleaved rounds (newer runs), where recorded
    ratios.update({f"{kind}: {row}": _sig(r)
                   for kind, rows in figures.get("decorator ratios", {}).items()
                   for row, r in rows.items()})
    return {"ratios": ratios, "same HLO": figures["same HLO"]}
  if bench == "bench_implicit":
    return _implicit(figures)
  if bench == "bench_jvp_from_vjp":
    return {"ratios": {name: _sig(r["ratio"]) for name, r in figures.items()}}
  if bench == "bench_call_cost":
    return {"seconds": {name: _sig(s) for name, s in figures["seconds"].items()}}
  if bench == "bench_checker":
    return {"seconds": {name: _sig(c["seconds"])
                        for name, c in figures["check_rules seconds"].items()}}
  raise ValueError(f"bench/results.json: no plot for {bench}")


def _machine(m: dict) -> str:
  if m["backend"] != "cpu":
    return f"{m['device']} ({m['backend']})"
  return f"{m['cpu']}, {m['cores used']} of {m['cores']} cores"


def _tpu_runs(record: dict) -> list[dict]:
  """The benchmark outputs of the TPU runs, parsed as the benches print them."""
  runs = []
  for part in record.values():
    if not isinstance(part, dict) or "bench" not in part or "environment" not in part:
      continue
    env = part["environment"]
    for bench, result in part["bench"].items():
      if result["status"] != 0:
        continue
      out = result["output"]
      if bench == "bench_hiprim":
        seconds = {}
        for name, e, g, c in re.findall(
            r"^(\S+(?: HiPrim)?)\s+([\d.]+) us\s+([\d.]+) us\s+([\d.]+) ms$", out, re.M):
          seconds[name] = {"eager call": float(e) * 1e-6, "eager grad": float(g) * 1e-6,
                           "jit(grad) compile": float(c) * 1e-3}
        for name, c, h in re.findall(
            r"^(\S+ HiPrim)\s+construct ([\d.]+) us, construct and hash ([\d.]+) us$",
            out, re.M):
          seconds[name].update({"construct": float(c) * 1e-6,
                                "construct and hash": float(h) * 1e-6})
        figures = {**_hiprim(seconds), "same HLO": bool(re.search(
            r"== jit\(expand as a plain function\): True$", out, re.M))}
      elif bench == "bench_implicit":
        rows = re.findall(r"^([\w-]+ (?:value|grad|jacrev|hvp))\s+([\d.]+)\s+([\d.]+)\s.*"
                          r"\s(\d+)us$", out, re.M)
        eager = dict(re.findall(r"^(eager fixed_point|eager-lambda root)\s+([\d.]+)\s",
                                out, re.M))
        figures = {"ratios": {**{n: _sig(1 / float(r)) for n, r, _, _ in rows},
                              **{n: _sig(1 / float(r)) for n, r in eager.items()}},
                   "compile": {n: _sig(1 / float(c)) for n, _, c, _ in rows},
                   "seconds": {n: _sig(float(t) * 1e-6) for n, _, _, t in rows}}
      elif bench == "bench_call_cost":
        figures = {"seconds": {n: _sig(float(t) * 1e-6) for n, t in re.findall(
            r"^(\S+(?: \S+)*?)\s{2,}([\d.]+) us$", out, re.M)}}
      else:
        continue
      runs.append({"bench": bench, "date": env["date"], "jax": env["jax"],
                   "machine": f"{env['device_kind']} ({env['backend']})",
                   "clock": "wall", **figures})
  return runs


@extractor("performance", "bench/results.json and docs/accelerator-results.json")
def performance():
  cpu = [{"bench": run["bench"], "date": run["date"], "jax": run["jax"],
          "machine": _machine(run["machine"]), "clock": run["clock"], **_per_run(run)}
         for run in read_json("bench/results.json")
         if not run["figures"].get("stubbed")]
  return {"runs": cpu + _tpu_runs(read_json("docs/accelerator-results.json"))}


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
