"""Run the unit tests, the pages and the benchmarks on whatever backend JAX
finds, and write a results table.

  python tools/accelerator_run.py --out DIR [--tests FILE ...] [--pages PAGE ...]
                                  [--bench NAME ...] [--facts] [--deadline SECONDS]
                                  [--merge RESULTS.json] [--resume RECORDS.jsonl ...]
  python tools/accelerator_run.py --todo RESULTS.json

Written for a machine with an accelerator (a TPU or a GPU), where one process at
a time can hold the device: this process never initialises a JAX backend
itself; it starts one child process after another (the unit tests in one
pytest process, the pages in one process, each benchmark, the measurements of
``tools/accelerator_facts.py``), each told the time left. A child that runs
past its share is killed, and what it finished is kept: each child writes its
results as it goes.

A suite longer than one call (a device machine gives ten minutes a call)
runs in several: ``--resume`` the ``tests.jsonl`` and ``pages.jsonl`` an
earlier call wrote, and the tests and pages they recorded are not run again
and count in this call's results.

Writes ``DIR/accelerator-results.json`` (``--merge`` an earlier file to add to
it: the same file's results from an earlier call are kept unless run again)
and ``DIR/accelerator-results.md``, a table per part:

- the environment: backend, device kind, JAX version, Python, libtpu, date,
  and the checkout's commit (``+changes`` where tracked files differed from it);
- per test file: passed / failed / skipped, each failure's test id and first
  line, each skip's reason;
- per page: cells passed / failed (a cell tagged ``raises-exception`` passes
  when it raises), each failure's cell and first line;
- each benchmark's output; the measurements' JSON.

The parts run in this order: the measurements, the tests, the pages, the
benchmarks.

``--todo`` reads a results file holding several runs (each a top-level
entry with its ``tests`` and ``pages``, in the order they ran, as
``docs/accelerator-results.json`` does) and prints what no run has shown
passing: the test files and pages that no run recorded, or whose latest
record has a failure, a cell not run, or a skip for a package the machine
lacked (not a limit of the backend). The next device session runs those.

Pages run as their cells do in a notebook kernel: in order, in one namespace,
each page in a fresh process; IPython magics are skipped.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import linecache
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = "accelerator-results.json"


# --------------------------------------------------------------------------
# Children: each runs in its own process and appends JSON lines to a file.

def _emit(path, record):
  with open(path, "a") as f:
    f.write(json.dumps(record) + "\n")


def _commit():
  """The checkout's commit, "+changes" where its tracked files differ from
  it; "" where git cannot tell (a copy without its history)."""
  def git(*args):
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True,
                          text=True, check=False)
  head = git("rev-parse", "--short", "HEAD")
  if head.returncode:
    return ""
  changed = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
  return head.stdout.strip() + ("+changes" if changed else "")


def _libtpu():
  """The libtpu a TPU backend loads: ``TPU_LIBRARY_PATH`` where set (JAX
  loads that file), else the installed package's version ("" if none)."""
  import importlib.metadata  # pylint: disable=import-outside-toplevel
  if os.environ.get("TPU_LIBRARY_PATH"):
    return os.environ["TPU_LIBRARY_PATH"]
  try:
    return importlib.metadata.version("libtpu")
  except importlib.metadata.PackageNotFoundError:
    return ""


def _environment():
  import jax  # pylint: disable=import-outside-toplevel
  dev = jax.devices()[0]
  return {
      "commit": _commit(),
      "backend": jax.default_backend(),
      "device_kind": dev.device_kind,
      "device_count": jax.device_count(),
      "jax": jax.__version__,
      "jaxlib": jax.lib.__version__ if hasattr(jax.lib, "__version__") else "",
      "python": sys.version.split()[0],
      "libtpu": _libtpu(),
      "date": datetime.date.today().isoformat(),
      # as the run was started: read after a page's cells, JAX's config holds
      # what the page set (spectral-gradients asks for "highest")
      "default_matmul_precision": os.environ.get("JAX_DEFAULT_MATMUL_PRECISION",
                                                 "None"),
  }


class _Collector:
  """A pytest plugin that writes one record per test as it ends, and stops
  the session at the deadline."""

  def __init__(self, path, deadline, skip=()):
    self.path, self.deadline, self.skip = path, deadline, set(skip)
    self.session = None

  def pytest_sessionstart(self, session):
    self.session = session

  def pytest_collection_modifyitems(self, config, items):
    """Leaves out the tests an earlier call recorded (``--resume``)."""
    done = [item for item in items if item.nodeid in self.skip]
    if done:
      items[:] = [item for item in items if item.nodeid not in self.skip]
      config.hook.pytest_deselected(items=done)

  def pytest_runtest_teardown(self, item):
    """Waits for the test's programs' effects (``jax.effects_barrier``) and
    records what that raises as the test's ``async_error``: on a TPU, JAX
    raises a host callback's error with the program's result and again at
    the next barrier, which it also calls at exit, where the error would be
    named after no test (a failed solve's error surfaced so in a TPU run)."""
    import jax  # pylint: disable=import-outside-toplevel
    try:
      jax.effects_barrier()
    except Exception as e:  # pylint: disable=broad-except
      _emit(self.path, {"kind": "async_error", "id": item.nodeid,
                        "detail": _one_line(f"{type(e).__name__}: {e}")[:800]})

  def pytest_runtest_logreport(self, report):
    if report.when == "call" or report.outcome != "passed":
      outcome = report.outcome
      detail = ""
      if report.skipped:
        longrepr = report.longrepr
        detail = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
      elif report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        # the whole message, and where it was raised
        detail = _one_line(crash.message if crash else report.longrepr)
        if crash:
          detail += f" | at {Path(crash.path).name}:{crash.lineno}"
        if report.when != "call":
          outcome = "error"
      _emit(self.path, {"kind": "test", "id": report.nodeid, "outcome": outcome,
                        "detail": detail[:800], "seconds": round(report.duration, 2)})
    if time.time() > self.deadline and self.session is not None:
      self.session.shouldstop = "the accelerator run's deadline"


def _one_line(text):
  """A message's non-empty lines on one line (an assert_allclose's first
  line is empty)."""
  return " | ".join(line.strip() for line in str(text).splitlines() if line.strip())


def child_tests(path, files, deadline, skip_file=None):
  import pytest  # pylint: disable=import-outside-toplevel
  args = ["-q", "-p", "no:cacheprovider", "-p", "no:randomly", *files]
  skip = Path(skip_file).read_text().splitlines() if skip_file else ()
  code = pytest.main(args, plugins=[_Collector(path, deadline, skip)])
  # Read after the tests: asking for the devices takes a TPU for this process,
  # and a test that starts a fresh process using JAX (a page's visible cells)
  # gets the chip only while no other process holds it.
  _emit(path, {"kind": "environment", **_environment()})
  _emit(path, {"kind": "tests_done", "exit": int(code)})


_CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```\s*$", re.S | re.M)


def page_cells(text):
  """``(source, tags)`` of each code cell of a MyST page, in order."""
  cells = []
  for m in _CELL.finditer(text):
    body = m.group(1)
    tags = []
    lines = body.splitlines()
    if lines and lines[0].strip() == "---":  # a YAML block of options
      end = lines.index("---", 1)
      for line in lines[1:end]:
        if line.strip().startswith("tags:"):
          tags = re.findall(r"[\w-]+", line.split(":", 1)[1])
      lines = lines[end + 1:]
    while lines and lines[0].startswith(":"):  # `:tags: [a, b]` options
      key, _, value = lines[0][1:].partition(":")
      if key.strip() == "tags":
        tags = re.findall(r"[\w-]+", value)
      lines = lines[1:]
    if lines and lines[0].startswith("%%writefile "):  # the one cell magic the pages use
      src = (f"open({lines[0].split(None, 1)[1].strip()!r}, 'w').write("
             f"{chr(10).join(lines[1:]) + chr(10)!r})")
    else:
      src = "\n".join(l for l in lines
                      if not l.lstrip().startswith(("%", "!")) or l.lstrip().startswith("!="))
    cells.append((src, tags))
  return cells


def child_pages(path, pages, deadline, docs):
  os.environ.setdefault("MPLBACKEND", "Agg")
  path = os.path.abspath(path)
  docs = Path(docs).resolve()
  os.chdir(docs)  # where the site build runs them: a page may read files beside it
  for page in pages:
    md = docs / f"{page}.md"
    cells = page_cells(md.read_text())
    ns = {"__name__": "__main__"}
    t0 = time.time()
    _emit(path, {"kind": "page_start", "page": page, "cells": len(cells)})
    for i, (src, tags) in enumerate(cells):
      if time.time() > deadline:
        _emit(path, {"kind": "cell", "page": page, "cell": i, "outcome": "not run",
                     "detail": "the accelerator run's deadline"})
        continue
      expect_raise = "raises-exception" in tags
      c0 = time.time()
      try:
        with contextlib.redirect_stdout(io.StringIO()):
          name = f"{page}.md:cell{i}"
          # as a Jupyter kernel does: a traceback's frames show the cell's lines
          linecache.cache[name] = (len(src), None, src.splitlines(True), name)
          exec(compile(src, name, "exec"), ns)  # pylint: disable=exec-used
        ok, detail = not expect_raise, ("expected an exception, none was raised"
                                        if expect_raise else "")
      except BaseException as e:  # pylint: disable=broad-except
        if isinstance(e, KeyboardInterrupt):
          raise
        ok, detail = expect_raise, f"{type(e).__name__}: {_one_line(e)}"
        if not ok:
          detail += " | " + " ".join(traceback.format_exc().splitlines()[-3:])[:400]
      _emit(path, {"kind": "cell", "page": page, "cell": i,
                   "outcome": "passed" if ok else "failed", "detail": detail[:600],
                   "first_line": src.strip().splitlines()[0][:80] if src.strip() else "",
                   "seconds": round(time.time() - c0, 2)})
    _emit(path, {"kind": "page_done", "page": page, "seconds": round(time.time() - t0, 1)})
    # Only now: asking JAX for its devices before the first cell would keep a
    # page from configuring them (jax_num_cpu_devices, XLA_FLAGS).
    _emit(path, {"kind": "environment", **_environment()})
    try:
      import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
      plt.close("all")
    except ImportError:
      pass


# --------------------------------------------------------------------------
# The parent: starts the children, one at a time, and writes the table.

def _run_child(args, path, budget):
  """Runs this script as a child with ``args``, killed after ``budget`` s."""
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  cmd = [sys.executable, __file__, *args, "--records", str(path)]
  t0 = time.time()
  try:
    proc = subprocess.run(cmd, env=env, timeout=budget, capture_output=True, text=True,
                          check=False)
    tail = (proc.stdout + proc.stderr)[-3000:]
    status = proc.returncode
  except subprocess.TimeoutExpired as e:
    tail = ((e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes)
            else (e.stdout or ""))[-3000:]
    status = "killed at the deadline"
  return status, tail, round(time.time() - t0, 1)


def _read(path):
  if not Path(path).exists():
    return []
  return [json.loads(l) for l in Path(path).read_text().splitlines() if l.strip()]


def _summarize_tests(records):
  files = {}
  for r in records:
    if r["kind"] not in ("test", "async_error"):
      continue
    f = files.setdefault(r["id"].split("::")[0], {"passed": 0, "failed": 0, "skipped": 0,
                                                  "error": 0, "failures": [], "skips": []})
    if r["kind"] == "async_error":  # after the test's own outcome
      f.setdefault("async_errors", []).append(f"{r['id']}: {r['detail']}")
      continue
    f[r["outcome"]] = f.get(r["outcome"], 0) + 1
    if r["outcome"] in ("failed", "error"):
      f["failures"].append(f"{r['id']}: {r['detail']}")
    elif r["outcome"] == "skipped":
      f["skips"].append(f"{r['id']}: {r['detail']}")
  return files


def _summarize_pages(records):
  pages = {}
  for r in records:
    if r["kind"] == "page_start":
      pages[r["page"]] = {"cells": r["cells"], "passed": 0, "failed": 0, "not run": 0,
                          "failures": [], "seconds": None, "cell_seconds": {}}
    elif r["kind"] == "cell":
      p = pages[r["page"]]
      p[r["outcome"]] += 1
      if "seconds" in r:
        p["cell_seconds"][str(r["cell"])] = r["seconds"]
      if r["outcome"] == "failed":
        p["failures"].append(f"cell {r['cell']} ({r.get('first_line', '')}): {r['detail']}")
    elif r["kind"] == "page_done":
      pages[r["page"]]["seconds"] = r["seconds"]
  return pages


def to_markdown(results):
  """The results as Markdown tables."""
  out = []
  env = results.get("environment", {})
  if env:
    out += ["| backend | device | JAX | Python | date | commit |",
            "| --- | --- | --- | --- | --- | --- |",
            f"| {env.get('backend')} | {env.get('device_kind')} | {env.get('jax')} | "
            f"{env.get('python')} | {env.get('date')} | {env.get('commit', '')} |", ""]
  if results.get("tests"):
    out += ["| test file | passed | failed | skipped |", "| --- | --- | --- | --- |"]
    for name, f in sorted(results["tests"].items()):
      out.append(f"| {name} | {f['passed']} | {f['failed'] + f.get('error', 0)} | "
                 f"{f['skipped']} |")
    out.append("")
    for name, f in sorted(results["tests"].items()):
      for line in f["failures"]:
        out.append(f"- failed: {line}")
      for line in f["skips"]:
        out.append(f"- skipped: {line}")
      for line in f.get("async_errors", []):
        out.append(f"- error after the test (its programs' effects): {line}")
    out.append("")
  if results.get("pages"):
    out += ["| page | cells | passed | failed | not run | seconds |",
            "| --- | --- | --- | --- | --- | --- |"]
    for name, p in sorted(results["pages"].items()):
      out.append(f"| {name} | {p['cells']} | {p['passed']} | {p['failed']} | "
                 f"{p['not run']} | {p['seconds']} |")
    out.append("")
    for name, p in sorted(results["pages"].items()):
      for line in p["failures"]:
        out.append(f"- {name}: {line}")
    out.append("")
  for name, b in sorted(results.get("bench", {}).items()):
    out += [f"### bench {name} (exit {b['status']}, {b['seconds']} s)", "", "```",
            b["output"].strip(), "```", ""]
  if results.get("facts"):
    out += ["### measurements", "", "```json", json.dumps(results["facts"], indent=1),
            "```", ""]
  return "\n".join(out)


MISSING_PACKAGE = "Skipped: could not import"


def todo(results: dict, test_files: list[str], pages: list[str]) -> tuple[list, list]:
  """The test files of ``test_files`` and the pages of ``pages`` that no run
  in ``results`` (its top-level entries holding ``tests`` or ``pages``, in
  order) shows passing: unrecorded, or their latest record failed, left
  cells unrun, or skipped a test for a missing package."""
  runs = [r for r in results.values()
          if isinstance(r, dict) and ("tests" in r or "pages" in r)]
  latest_tests: dict = {}
  latest_pages: dict = {}
  for run in runs:
    latest_tests.update(run.get("tests", {}))
    latest_pages.update(run.get("pages", {}))

  def test_done(name):
    t = latest_tests.get(name)
    return t is not None and not (t["failed"] or t.get("error", 0)) and not any(
        MISSING_PACKAGE in skip for skip in t.get("skips", []))

  def page_done(name):
    p = latest_pages.get(name)
    return p is not None and not p["failed"] and not p.get("not run", 0)
  return ([t for t in test_files if not test_done(t)],
          [p for p in pages if not page_done(p)])


def _every_test_file() -> list[str]:
  """tests/test_*.py but the site's test (a browser on the built HTML site,
  which involves no JAX backend)."""
  return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                if p.name != "test_site.py")


def _every_page(docs: str) -> list[str]:
  """The names of the pages under ``docs``."""
  return sorted(p.stem for p in Path(docs).glob("*.md"))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=".")
  parser.add_argument("--tests", nargs="*", default=[],
                      help="test files (or 'all' for every tests/test_*.py but the site test)")
  parser.add_argument("--pages", nargs="*", default=[],
                      help="page names under docs/ (or 'all')")
  parser.add_argument("--bench", nargs="*", default=[],
                      help="bench/NAME.py scripts to run (with their default arguments)")
  parser.add_argument("--bench-args", default="", help="extra arguments for every bench script")
  parser.add_argument("--facts", action="store_true",
                      help="run tools/accelerator_facts.py")
  parser.add_argument("--facts-args", default="",
                      help="arguments for tools/accelerator_facts.py")
  parser.add_argument("--facts-budget", type=float, default=300,
                      help="seconds the measurements may take")
  parser.add_argument("--deadline", type=float, default=540,
                      help="seconds this whole run may take")
  parser.add_argument("--tests-budget", type=float, default=float("inf"),
                      help="seconds the tests may take (no new test starts after)")
  parser.add_argument("--pages-budget", type=float, default=float("inf"),
                      help="seconds the pages may take (no new cell starts after)")
  parser.add_argument("--merge", help="an earlier results file to add to")
  parser.add_argument("--resume", nargs="*", default=[],
                      help="tests.jsonl and pages.jsonl of earlier calls: the tests "
                      "and pages they recorded are not run again, and count in "
                      "this call's results (a suite longer than one call)")
  parser.add_argument("--todo", metavar="RESULTS.json",
                      help="print the test files and pages no run in RESULTS.json "
                      "shows passing, and exit")
  parser.add_argument("--docs", default=str(ROOT / "docs"),
                      help="the folder of the pages (default: docs/)")
  parser.add_argument("--records", help=argparse.SUPPRESS)
  parser.add_argument("--skip-ids", help=argparse.SUPPRESS)
  parser.add_argument("--child", choices=("tests", "pages"), help=argparse.SUPPRESS)
  parser.add_argument("--until", type=float, help=argparse.SUPPRESS)
  a = parser.parse_args()

  if a.child == "tests":
    return child_tests(a.records, a.tests, a.until, a.skip_ids)
  if a.child == "pages":
    return child_pages(a.records, a.pages, a.until, a.docs)

  if a.todo:
    every_test = _every_test_file()
    every_page = _every_page(a.docs)
    tests_left, pages_left = todo(json.loads(Path(a.todo).read_text()), every_test,
                                  every_page)
    print("tests:", " ".join(tests_left))
    print("pages:", " ".join(pages_left))
    return 0

  start = time.time()
  end = start + a.deadline
  out = Path(a.out)
  out.mkdir(parents=True, exist_ok=True)
  results = json.loads(Path(a.merge).read_text()) if a.merge else {}
  results.setdefault("tests", {})
  results.setdefault("pages", {})
  results.setdefault("bench", {})
  results.setdefault("runs", [])
  tests = a.tests
  if tests == ["all"]:
    tests = _every_test_file()
  pages = a.pages
  if pages == ["all"]:
    pages = _every_page(a.docs)

  def save():
    (out / RESULTS).write_text(json.dumps(results, indent=1))
    (out / "accelerator-results.md").write_text(to_markdown(results))

  if a.facts and time.time() < end - 20:
    facts_path = out / "facts.json"
    cmd = [sys.executable, str(ROOT / "tools" / "accelerator_facts.py"), "--out",
           str(facts_path), *a.facts_args.split()]
    t0 = time.time()
    try:
      proc = subprocess.run(cmd, timeout=max(min(end - time.time(), a.facts_budget), 1),
                            capture_output=True, text=True, check=False)
      status, tail = proc.returncode, (proc.stdout + proc.stderr)[-3000:]
    except subprocess.TimeoutExpired:
      status, tail = "killed at the deadline", ""
    if facts_path.exists():
      results["facts"] = json.loads(facts_path.read_text())
    results["runs"].append({"part": "facts", "status": status,
                            "seconds": round(time.time() - t0, 1), "tail": tail[-1500:]})
    print(f"facts: {status}", flush=True)
    save()
  def child_part(part, names, budget, margin, summarize):
    """Runs the child of ``part`` ("tests" or "pages") on ``names``, within
    ``budget`` seconds and ``margin`` before the deadline, and records it."""
    path = out / f"{part}.child.jsonl"  # this child's records
    path.unlink(missing_ok=True)
    until = min(end - margin, time.time() + budget)
    extra = ["--skip-ids", str(skip_ids)] if part == "tests" else []
    status, tail, secs = _run_child(
        ["--child", part, f"--{part}", *names, "--until", str(until),
         "--docs", str(a.docs), *extra],
        path, max(min(end, until + margin) - time.time(), 1))
    new = _read(path)
    path.unlink(missing_ok=True)
    with open(out / f"{part}.jsonl", "a") as f:  # every child's, in order
      f.writelines(json.dumps(r) + "\n" for r in new)
    kept[part] += new
    records = kept[part]  # with the earlier calls' (--resume)
    envs = [r for r in records if r["kind"] == "environment"]
    if envs and "environment" not in results:
      results["environment"] = {k: v for k, v in envs[0].items() if k != "kind"}
    results[part].update(summarize(records))
    results["runs"].append({"part": part, part: names, "status": status,
                            "seconds": secs, "tail": tail[-1500:]})
    print(f"{part}: {status} in {secs} s", flush=True)
    save()

  # the records of this part in this call's results: --resume's, then each
  # child's as it ends
  kept = {"tests": [], "pages": []}
  for f in a.resume:
    for r in _read(f):
      if r["kind"] in ("test", "async_error"):
        kept["tests"].append(r)
      elif r["kind"] in ("page_start", "cell", "page_done"):
        kept["pages"].append(r)
  # a page is done if it ended and the deadline left none of its cells unrun
  cut_short = {r["page"] for r in kept["pages"]
               if r["kind"] == "cell" and r["outcome"] == "not run"}
  done_pages = {r["page"] for r in kept["pages"]
                if r["kind"] == "page_done"} - cut_short
  kept["pages"] = [r for r in kept["pages"] if r["page"] in done_pages]
  pages = [p for p in pages if p not in done_pages]
  skip_ids = out / "tests.done"
  skip_ids.write_text("\n".join(r["id"] for r in kept["tests"]
                                if r["kind"] == "test"))
  for part, summarize in (("tests", _summarize_tests), ("pages", _summarize_pages)):
    with open(out / f"{part}.jsonl", "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in kept[part])
    results[part].update(summarize(kept[part]))
  if tests:
    child_part("tests", tests, a.tests_budget, 30, _summarize_tests)
  # Each page in a fresh process, as in a fresh kernel: a page's first cell may
  # configure JAX (two CPU devices, say), which only works before any use of it.
  pages_until = time.time() + a.pages_budget
  for page in pages:
    if time.time() > min(end - 20, pages_until):
      break
    child_part("pages", [page], pages_until - time.time(), 15, _summarize_pages)
  for name in a.bench:
    if time.time() > end - 20:
      break
    cmd = [sys.executable, str(ROOT / "bench" / f"{name}.py"), *a.bench_args.split()]
    t0 = time.time()
    try:
      proc = subprocess.run(cmd, timeout=max(end - time.time(), 1), capture_output=True,
                            text=True, check=False, cwd=ROOT)
      status, output = proc.returncode, proc.stdout + proc.stderr[-2000:]
    except subprocess.TimeoutExpired as e:
      status = "killed at the deadline"
      output = (e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes)
                else (e.stdout or ""))
    results["bench"][name] = {"status": status, "seconds": round(time.time() - t0, 1),
                              "output": output[-6000:]}
    print(f"bench {name}: {status}", flush=True)
    save()
  save()
  print(to_markdown(results)[-6000:])


if __name__ == "__main__":
  main()
