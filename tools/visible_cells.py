#!/usr/bin/env python
"""Run what a reader can copy from the site: each page's visible code cells,
alone, in order, in a fresh Python process.

  python tools/visible_cells.py [PAGE ...]

A page's visible cells are its code cells the site shows: those tagged
``remove-cell`` (checks and setup) or ``remove-input`` (only the output is
shown) are dropped, but for a ``page-data`` cell (tools/page_data.py): the
recorded figures the page shows, which its downloaded notebook holds and
which its visible cells may read. Each page runs in a process of its own, in docs/ as the
notebook build runs it, with matplotlib drawing off screen and none of a
test run's XLA flags; a cell tagged ``raises-exception`` must raise, any
other must not. A visible cell that reads a name only a hidden cell
defines, or needs a setting only a hidden cell makes, fails here with the
reader's NameError or ValueError.

The process of each page is forked from one that has imported JAX and the
pages' libraries (`PRELOAD`) and nothing else, so a page's run skips the
seconds a fresh import takes: the saving that keeps this cheap enough for
CI, with the compilation cache the `tests` session shares with nbval.
`pages` (tools/notebooks.py's), `visible_cells`, `Runner` and `describe` are used by
tests/test_visible_cells.py.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
sys.path.insert(0, str(ROOT / "tools"))
from notebooks import pages  # noqa: E402  (the notebook pages, as the build finds them)
HIDDEN = {"remove-cell", "remove-input"}

# Modules most pages import, imported once by the process each page's process
# is forked from (a zygote), so each page's run starts without the seconds a
# fresh `import jax` takes. Importing them neither starts JAX's backend nor
# changes a setting (checked below), and a page still binds each name with
# its own import, so a page that forgets an import still fails; what differs
# from a reader's fresh kernel is only that these modules' code runs sooner.
PRELOAD = ["jax", "jax.numpy", "numpy", "matplotlib.pyplot", "hijax", "hijax.testing",
           "hijax.implicit", "optimistix", "lineax", "jaxopt"]

# The zygote: reads one page's cells (a JSON line) at a time from stdin, forks,
# and the child runs them in a fresh namespace; the result (the first cell
# that did what it should not, or null) goes back as a JSON line.
_ZYGOTE = r"""
import importlib, json, os, sys, traceback
import matplotlib
matplotlib.use("Agg")
for name in PRELOAD:
  try:
    importlib.import_module(name)
  except ImportError:
    pass
from jax._src import xla_bridge
assert not xla_bridge._backends, "a preloaded module started JAX's backend"
out = sys.stdout
sys.stdout = sys.stderr

def run(cells):
  ns = {"__name__": "__main__"}
  for cell in cells:
    code = compile(cell["source"], f"<{cell['page']} cell {cell['index']}>", "exec")
    try:
      exec(code, ns)
    except BaseException as e:
      if cell["raises"] and isinstance(e, Exception):
        continue
      return dict(cell=cell["index"], error=f"{type(e).__name__}: {e}"[:2000],
                  traceback=traceback.format_exc()[-3000:], source=cell["source"])
    else:
      if cell["raises"]:
        return dict(cell=cell["index"], error="tagged raises-exception but ran",
                    traceback="", source=cell["source"])
  return None

for line in sys.stdin:
  cells = json.loads(line)
  read, write = os.pipe()
  pid = os.fork()
  if pid == 0:
    os.close(read)
    sys.stdout = open(os.devnull, "w")  # what the cells print is not compared
    try:
      result = json.dumps(run(cells))
    except BaseException as e:
      result = json.dumps(dict(cell=None, error=repr(e), traceback=traceback.format_exc(),
                               source=""))
    with os.fdopen(write, "w") as w:
      w.write(result)
    os._exit(0)
  os.close(write)
  with os.fdopen(read) as r:
    result = r.read()
  _, status = os.waitpid(pid, 0)
  if not result:
    result = json.dumps(dict(cell=None, error=f"the page's process died (status {status})",
                             traceback="", source=""))
  out.write(result + "\n")
  out.flush()
""".replace("PRELOAD", repr(PRELOAD))


def visible_cells(page: str) -> list[dict]:
  """The code cells of docs/<page>.md the site shows, in order: dicts with
  ``index`` (among all the page's cells), ``source`` and ``raises``."""
  import jupytext

  nb = jupytext.read(DOCS / f"{page}.md")
  cells = []
  for i, cell in enumerate(nb.cells):
    tags = set(cell.metadata.get("tags", []))
    if cell.cell_type != "code" or (tags & HIDDEN and "page-data" not in tags):
      continue
    cells.append({"page": page, "index": i, "source": _as_python(cell.source),
                  "raises": "raises-exception" in tags})
  return cells


def _as_python(source: str) -> str:
  """The cell as plain Python: a ``%%writefile PATH`` cell (IPython's cell
  magic, which a reader's Jupyter runs) becomes the code that writes its
  body there. Other magics are left, to fail where they are used."""
  first, _, body = source.partition("\n")
  if not first.startswith("%%writefile "):
    return source
  path = first.removeprefix("%%writefile ").strip()
  return f"open({path!r}, 'w').write({body + chr(10)!r})\n"


class Runner:
  """Runs pages' visible cells, each page in a fresh process forked from one
  that has imported PRELOAD (started in docs/, as the notebook build runs a
  page, with matplotlib drawing off screen). Use as a context manager."""

  def __init__(self, python: str = sys.executable, env: dict | None = None):
    env = dict(os.environ if env is None else env, MPLBACKEND="Agg")
    # A reader's process has none of ours: no device count or flags of a test run.
    env.pop("XLA_FLAGS", None)
    self.proc = subprocess.Popen([python, "-c", _ZYGOTE], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, cwd=DOCS, env=env)

  def run(self, page: str) -> tuple[dict | None, float]:
    """Runs the page's visible cells; returns (the failure or None, seconds)."""
    t0 = time.perf_counter()
    self.proc.stdin.write(json.dumps(visible_cells(page)) + "\n")
    self.proc.stdin.flush()
    line = self.proc.stdout.readline()
    if not line:
      raise RuntimeError(f"the zygote process ended (exit {self.proc.wait()})")
    return json.loads(line), time.perf_counter() - t0

  def close(self):
    self.proc.stdin.close()
    self.proc.wait()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def describe(page: str, failure: dict) -> str:
  """A failure as a reader would want to read it."""
  return (f"{page}: visible cell {failure['cell']}: {failure['error']}\n"
          f"--- the cell ---\n{failure['source']}\n--- traceback ---\n"
          f"{failure['traceback']}")


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("pages", nargs="*")
  args = ap.parse_args()
  names = args.pages or pages()
  failed = []
  with Runner() as runner:
    for name in names:
      failure, dt = runner.run(name)
      print(f"{'FAILED' if failure else 'ok    '} {name} ({dt:.1f} s)", flush=True)
      if failure:
        failed.append(name)
        print(describe(name, failure), flush=True)
  if failed:
    sys.exit(f"{len(failed)} page(s) whose visible cells fail: {', '.join(failed)}")


if __name__ == "__main__":
  main()
