"""tools/accelerator_run.py, which runs the tests and the pages on a TPU: how
it reads a page's cells and sums up its records. (Running it needs a device
machine; tools/accelerator_run.py --pages PAGE runs here too.)"""
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tools_loader import ROOT, load_tool


# The tool's own children on a CPU: on a device machine this test's process
# holds the accelerator (one process at a time can): the tool's children
# failed on a TPU, unable to take it
ON_A_CPU = dict(os.environ, JAX_PLATFORMS="cpu")


def _tool():
  return load_tool("accelerator_run")


def _run_tool(*args):
  """tools/accelerator_run.py run with ``args`` from the checkout, its
  children on a CPU; it must succeed."""
  run = subprocess.run(
      [sys.executable, str(ROOT / "tools" / "accelerator_run.py"), *map(str, args)],
      capture_output=True, text=True, check=False, env=ON_A_CPU, cwd=ROOT)
  assert run.returncode == 0, run.stderr[-2000:]
  return run


PAGE = """# A page

```{code-cell}
import os
x = 1
```

```{code-cell}
:tags: [remove-cell]

assert x == 1
```

```{code-cell}
%%writefile note.txt
first line
second line
```

```{code-cell}
---
tags: [raises-exception]
---
%matplotlib inline
raise ValueError("meant to")
```
"""


def test_cells_their_tags_and_the_one_cell_magic(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  cells = _tool().page_cells(PAGE)
  assert [tags for _, tags in cells] == [[], ["remove-cell"], [],
                                         ["raises-exception"]]
  assert cells[0][0] == "import os\nx = 1"
  assert "%matplotlib" not in cells[3][0] and "raise ValueError" in cells[3][0]
  namespace = {}
  exec(cells[2][0], namespace)  # pylint: disable=exec-used
  assert Path("note.txt").read_text() == "first line\nsecond line\n"


FIRST = """```{code-cell}
import jax
import jax.numpy as jnp
y = jnp.ones(3).sum()
jax.config.update('jax_default_matmul_precision', 'highest')  # as pages do
```
"""

SECOND = """```{code-cell}
import jax
jax.config.update('jax_num_cpu_devices', 2)  # before any use of JAX
```

```{code-cell}
assert len(jax.devices('cpu')) == 2
```

```{code-cell}
assert 'y' not in globals()
```

```{code-cell}
:tags: [raises-exception]

1 / 0
```

```{code-cell}
import traceback

def fails():
  raise ValueError("from this line")

try:
  fails()
except ValueError as e:
  frame = traceback.extract_tb(e.__traceback__)[-1]
  assert frame.line == 'raise ValueError("from this line")', frame
```
"""


# The tool run once for the tests below that only read its records: three
# test files in its tests child (the first one checking that nothing took
# the devices before it) and two pages, each in a process of its own.
FAILS_TO_MATCH = ("import numpy as np\n\ndef test_close():\n"
                  "  np.testing.assert_allclose(1.0, 1.1)\n")
UNTAKEN = ("from jax._src import xla_bridge\n\n"
           "def test_no_backend_is_initialized_yet():\n"
           "  assert not xla_bridge.backends_are_initialized()\n")


@pytest.fixture(scope="module")
def one_run(tmp_path_factory):
  """(the folder, the results, the Markdown table) of one tool run."""
  tmp = tmp_path_factory.mktemp("one_run")
  for name, source in (("test_untaken.py", UNTAKEN), ("test_one.py", FAILS_TO_MATCH),
                       ("test_async.py", LEAVES_AN_ERROR), ("first.md", FIRST),
                       ("second.md", SECOND)):
    (tmp / name).write_text(source)
  out = tmp / "out"
  _run_tool("--out", out, "--docs", tmp, "--deadline", "300", "--tests",
            *(tmp / f"test_{n}.py" for n in ("untaken", "one", "async")),
            "--pages", "first", "second")
  return (tmp, json.loads((out / "accelerator-results.json").read_text()),
          (out / "accelerator-results.md").read_text())


def _summary(results, name):
  """The results' summary of the test file ``name`` (named as pytest names it)."""
  (summary,) = [s for file, s in results["tests"].items() if Path(file).name == name]
  return summary


def test_each_page_runs_in_its_own_process_and_every_cell_is_recorded(one_run):
  """Each page in a fresh process: a page that configures JAX's devices in
  its first cell (as vjp-objects asks for two CPU devices) runs after one
  that used JAX, and sees none of its names; every cell's outcome and time
  are kept, of every page, and a cell meant to raise passes by raising. A
  traceback shows a cell's lines, as in a Jupyter kernel (nan-gradients
  asserts the line a NaN came from)."""
  tmp, results, _ = one_run
  for page, cells in (("first", 1), ("second", 5)):
    summary = results["pages"][page]
    assert (summary["cells"], summary["passed"], summary["failed"]) == (
        cells, cells, 0), summary
    assert len(summary["cell_seconds"]) == cells
  records = [json.loads(r) for r in (tmp / "out" / "pages.jsonl").read_text().splitlines()]
  assert sum(r["kind"] == "cell" for r in records) == 6
  # each page's process reads its environment after the page's cells:
  # the run's own precision, not what a page set
  environments = [r for r in records if r["kind"] == "environment"]
  assert len(environments) == 2, records
  for environment in environments:
    assert environment["backend"] == "cpu" and "libtpu" in environment
    assert environment["default_matmul_precision"] == "None", environment


def test_a_failures_whole_message_is_kept(one_run):
  """An assert_allclose's message starts with an empty line: the record
  keeps every line and where it was raised."""
  (failure,) = _summary(one_run[1], "test_one.py")["failures"]
  assert "Not equal to tolerance" in failure and "test_one.py:4" in failure


LEAVES_AN_ERROR = """import jax

def test_leaves_an_error():
  # as an accelerator reports a host callback's error that no result
  # carried: at the next wait for the programs' effects
  original = jax.effects_barrier

  def barrier():
    jax.effects_barrier = original
    raise RuntimeError("a callback failed on the device")
  jax.effects_barrier = barrier

def test_after():
  pass
"""


def test_an_error_left_by_a_tests_programs_is_named_after_it(one_run, resumed):
  """On a TPU a failed solve's error surfaced at exit, after no test: the
  tool waits for each test's effects and records what that raises under
  the test's name, beside its own outcome."""
  tmp, results, table = one_run
  summary = _summary(results, "test_async.py")
  assert (summary["passed"], summary["failed"]) == (2, 0)
  (line,) = summary["async_errors"]
  assert line.endswith("::test_leaves_an_error: RuntimeError: a callback "
                       "failed on the device"), line
  assert "error after the test (its programs' effects): " in table
  # a later call that resumes from this one keeps it
  kept = _summary(resumed[0], "test_async.py")
  assert kept["async_errors"] == [line]
  assert (kept["passed"], kept["failed"]) == (2, 0)


@pytest.fixture(scope="module")
def resumed(one_run):
  """(the results, the tests' records) of a second call resuming from
  one_run's: its test files and pages, and a new one of each."""
  tmp = one_run[0]
  (tmp / "test_b.py").write_text("def test_three():\n  pass\n")
  (tmp / "third.md").write_text(FIRST)
  out = tmp / "resumed"
  _run_tool("--out", out, "--docs", tmp, "--deadline", "300", "--tests",
            *(tmp / f"test_{n}.py" for n in ("untaken", "one", "async", "b")),
            "--pages", "first", "second", "third",
            "--resume", tmp / "out" / "tests.jsonl", tmp / "out" / "pages.jsonl")
  records = [json.loads(r) for r in (out / "tests.jsonl").read_text().splitlines()]
  return json.loads((out / "accelerator-results.json").read_text()), records


def test_a_later_call_resumes_where_an_earlier_one_stopped(resumed):
  """A suite longer than one call on a device (ten minutes there): with
  --resume, the tests and pages an earlier call recorded are not run again,
  and the results count them."""
  second, records = resumed
  summary = {Path(name).name: (t["passed"], t["failed"])
             for name, t in second["tests"].items()}
  assert summary == {"test_untaken.py": (1, 0), "test_one.py": (0, 1),
                     "test_async.py": (2, 0), "test_b.py": (1, 0)}, summary
  # the earlier call's tests ran once: in that call
  for name, tests in (("test_untaken.py", 1), ("test_one.py", 1), ("test_async.py", 2)):
    assert sum(r["kind"] == "test" and Path(r["id"].split("::")[0]).name == name
               for r in records) == tests, name
  assert [run_["pages"] for run_ in second["runs"] if run_["part"] == "pages"] == [
      ["third"]]
  assert set(second["pages"]) == {"first", "second", "third"}


def test_a_page_the_deadline_cut_short_runs_again_on_resume(tmp_path):
  """A page whose later cells the deadline left unrun is done only in part:
  --resume runs it again, whole (on a TPU, porting-custom-vjp's 20 last cells
  were left unrun and uncounted)."""
  (tmp_path / "first.md").write_text(FIRST)
  earlier = tmp_path / "pages.jsonl"
  earlier.write_text("\n".join(json.dumps(r) for r in (
      {"kind": "page_start", "page": "first", "cells": 1},
      {"kind": "cell", "page": "first", "cell": 0, "outcome": "not run",
       "detail": "the accelerator run's deadline"},
      {"kind": "page_done", "page": "first", "seconds": 0.1})) + "\n")
  out = tmp_path / "out"
  _run_tool("--out", out, "--docs", tmp_path, "--pages", "first", "--deadline", "300",
            "--resume", earlier)
  results = json.loads((out / "accelerator-results.json").read_text())
  assert [r["pages"] for r in results["runs"] if r["part"] == "pages"] == [["first"]]
  summary = results["pages"]["first"]
  assert (summary["cells"], summary["passed"], summary["not run"]) == (1, 1, 0), summary


def test_what_is_left_to_run_is_what_no_run_shows_passing():
  """--todo: a file that failed and passed later is done; one never run, one
  whose latest run failed, and one that skipped a test for a package the
  machine lacked are left; so are a page never run and one a deadline cut."""
  def counts(passed, failed=0, skips=()):
    return {"passed": passed, "failed": failed, "skipped": len(skips),
            "skips": list(skips), "failures": []}
  results = {
      "about": "two runs",
      "facts": {"matmul": {}},
      "first": {"tests": {"a.py": counts(1, 1), "b.py": counts(2), "c.py": counts(2)},
                "pages": {"p": {"cells": 2, "passed": 1, "failed": 1, "not run": 0},
                          "q": {"cells": 2, "passed": 2, "failed": 0, "not run": 0}}},
      "second": {"tests": {
          "a.py": counts(2),
          "b.py": counts(1, 1),
          "c.py": counts(1, skips=["c.py::t: Skipped: could not import 'jupytext': "
                                   "No module named 'jupytext'"]),
          "e.py": counts(1, skips=["e.py::t: Skipped: a TPU has no float64 LU"])},
          "pages": {"p": {"cells": 2, "passed": 2, "failed": 0, "not run": 0},
                    "q": {"cells": 2, "passed": 1, "failed": 0, "not run": 1}}},
  }
  tests, pages = _tool().todo(results, ["a.py", "b.py", "c.py", "d.py", "e.py"],
                              ["p", "q", "r"])
  assert tests == ["b.py", "c.py", "d.py"]
  assert pages == ["q", "r"]


def test_todo_prints_the_files_and_pages_left(tmp_path):
  (tmp_path / "page.md").write_text(FIRST)
  results = tmp_path / "results.json"
  results.write_text(json.dumps({"run": {"tests": {}, "pages": {}}}))
  run = _run_tool("--todo", results, "--docs", tmp_path)
  tests_line, pages_line = run.stdout.splitlines()
  assert "tests/test_accelerator_run_tool.py" in tests_line.split()
  # the site's test drives a browser over the built HTML, no JAX backend
  assert "tests/test_site.py" not in tests_line.split()
  assert pages_line == "pages: page"


def test_the_tests_find_no_backend_taken_and_the_record_still_names_it(one_run):
  """A test that starts a fresh process using JAX (a page's visible cells)
  needs the TPU free: the tool's child must not take the devices before its
  tests run (on a TPU the pages' fresh processes failed with "Unable to
  initialize backend 'tpu': ABORTED" while it held them); it reads the
  environment after them."""
  _, results, table = one_run
  summary = _summary(results, "test_untaken.py")
  assert (summary["passed"], summary["failed"]) == (1, 0), summary
  assert results["environment"]["backend"] == "cpu"
  # and the code that ran: the checkout's commit, marked where it was changed
  head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                        capture_output=True, text=True, check=False)
  if head.returncode == 0:
    assert results["environment"]["commit"].split("+")[0] == head.stdout.strip()
    assert results["environment"]["commit"] in (head.stdout.strip(),
                                                head.stdout.strip() + "+changes")
    assert f"| {results['environment']['commit']} |" in table.splitlines()[2]


def test_the_libtpu_a_tpu_loads_is_recorded(monkeypatch):
  """TPU_LIBRARY_PATH where set (the ninth TPU call loaded the machine's own
  libtpu so, beside a newer JAX), else the libtpu package's version."""
  monkeypatch.setenv("TPU_LIBRARY_PATH", "/opt/x/libtpu/libtpu.so")
  tool = _tool()
  assert tool._libtpu() == "/opt/x/libtpu/libtpu.so"
  monkeypatch.delenv("TPU_LIBRARY_PATH")
  monkeypatch.setattr("importlib.metadata.version", lambda name: {"libtpu": "0.0.50"}[name])
  assert tool._libtpu() == "0.0.50"

  def not_installed(name):
    raise importlib.metadata.PackageNotFoundError(name)
  monkeypatch.setattr("importlib.metadata.version", not_installed)
  assert tool._libtpu() == ""
