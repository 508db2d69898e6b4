"""The committed notebooks carry no noise and no trace of the machine that built them.

- no stored traceback is longer than 15 lines, and none shows a library frame;
- no output (text, error message, traceback) holds a machine path: a virtual
  environment, a kernel's temporary cell file, /work/..., /root/..., /tmp/...;
- tools/notebook_outputs.py, which `tools/notebooks.py build` applies, is
  checked on made-up tracebacks and outputs, and end to end: a small page
  built twice gives the same bytes;
- every cell the site hides is marked as such in the notebook a reader runs
  (tools/notebook_marks.py): checked on made-up cells, and on every
  committed notebook.
"""
import copy
import importlib.util
import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.pages

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
MAX_LINES = 15


def _load(name, path):
  spec = importlib.util.spec_from_file_location(name, path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


nbout = _load("notebook_outputs", ROOT / "tools" / "notebook_outputs.py")
marks = _load("notebook_marks", ROOT / "tools" / "notebook_marks.py")

# A path of the machine: a root directory of a Unix machine, a home directory,
# or an installed package. `<cell>`, `<site-packages>` and `<tmpfile>` are
# what tools/nbval_sanitize.cfg masks them with.
MACHINE_PATH = re.compile(
    r"(?<![\w.<>-])(/(work|root|tmp|home|Users|usr|opt|var|private|mnt|srv)/"
    r"|~/)|site-packages/|dist-packages/|ipykernel_\d+")


def _texts(output):
  """Every text a reader can see in ``output``, ANSI codes removed."""
  out = []
  for key in ("text", "evalue"):
    if key in output:
      out.append("".join(output[key]) if isinstance(output[key], list) else output[key])
  out.extend(output.get("traceback", []))
  for mime, value in output.get("data", {}).items():
    if mime.startswith("text/"):
      out.append("".join(value) if isinstance(value, list) else value)
  return [nbout.plain(t) for t in out]


def _outputs(path):
  nb = json.loads(path.read_text(encoding="utf-8"))
  for i, cell in enumerate(nb["cells"]):
    for output in cell.get("outputs", []):
      yield i, output


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_tracebacks_are_short(path):
  long = []
  for i, output in _outputs(path):
    if output["output_type"] != "error":
      continue
    text = nbout.plain("\n".join(output["traceback"]))
    n = len(text.split("\n"))
    if n > MAX_LINES or re.search(r"^File ", text, re.M):
      long.append(f"cell {i} ({output['ename']}): {n} lines\n{text[:400]}")
  assert not long, (f"{path.name}: tracebacks over {MAX_LINES} lines or with "
                    "library frames (rebuild with tools/notebooks.py build):\n"
                    + "\n".join(long))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_machine_paths(path):
  found = []
  for i, output in _outputs(path):
    for text in _texts(output):
      for m in MACHINE_PATH.finditer(text):
        found.append(f"cell {i}: ...{text[max(0, m.start() - 40):m.end() + 40]}...")
  assert not found, f"{path.name}: machine paths in outputs:\n" + "\n".join(found[:10])


def test_machine_path_pattern():
  for bad in ["/work/venv/lib/x.py", "at /tmp/ipykernel_1/2.py:3", "~/.pyenv/x",
              "/root/.cache", "lib/python3.12/site-packages/jax"]:
    assert MACHINE_PATH.search(bad), bad
  for fine in ["<cell>:2:17", "<site-packages>/jax/_src/core.py",
               "hijax/primitive.py", "float32[8@i,4]", "a/b", "<tmpfile>"]:
    assert not MACHINE_PATH.search(fine), fine


# --- the sanitize rules ----------------------------------------------------------

SAMPLES = [
    "f32[5] output of cos from /tmp/ipykernel_12215/1685601473.py:2:17 (block)",
    "File /work/venv/lib/python3.12/site-packages/jax/_src/core.py:2042",
    "in /work/wt-x/hijax/implicit/linear.py:10 and /root/r/docs/refs.md",
    "wrote /tmp/tmpab12_x9 at 0x7f8c3c6d62a0 in 3.5 ms",
]


@pytest.mark.parametrize("text", SAMPLES)
def test_stored_masks_leave_nbval_comparison_unchanged(text):
  """A masked stored output equals a fresh one under nbval's sanitizing, and
  masking twice changes nothing."""
  everything, stored = nbout.sanitize_rules()
  masked = nbout.mask(text, stored)
  assert nbout.mask(masked, everything) == nbout.mask(text, everything)
  assert nbout.mask(masked, stored) == masked
  assert not MACHINE_PATH.search(masked), masked


def test_stored_masks_are_marked():
  _, stored = nbout.sanitize_rules()
  assert len(stored) == 4  # kernel cell files, packages, the checkout, temp files
  assert nbout.mask(SAMPLES[0], stored) == "f32[5] output of cos from <cell>:2:17 (block)"
  assert nbout.mask(SAMPLES[2], stored) == "in hijax/implicit/linear.py:10 and docs/refs.md"


# --- tracebacks ------------------------------------------------------------------

def _c(code, text):
  return f"\x1b[{code}m{text}\x1b[39m"


def _lib_frame(path, line):
  return (f"{_c(36, 'File ')}{_c(32, f'{path}:{line}')}, in {_c(36, 'f')}()\n"
          f"{_c(32, f'    {line - 1}')} try:\n{_c(32, '--> ')}{_c(32, str(line))}   x()\n")


def _cell_frame(n, line, code, context=()):
  ctx = "".join(f"{_c(32, f'      {line - len(context) + k}')} {c}\n"
                for k, c in enumerate(context))
  return (f"{_c(36, 'Cell')}{_c(36, ' ')}{_c(32, f'In[{n}]')}{_c(32, f', line {line}')}\n"
          f"{ctx}{_c(32, '----> ')}{_c(32, str(line))} {code}\n")


RULE = _c(31, "-" * 75)
CAUSE = "\nThe above exception was the direct cause of the following exception:\n"
SITE = "/work/venv/lib/python3.12/site-packages"

# What IPython stores for `grad(not_linear)(1.)` (custom-jvp-vjp), shortened.
JAX_CHAIN = [
    RULE,
    _c(31, "KeyError") + "                                  Traceback (most recent call last)",
    _lib_frame(f"{SITE}/jax/_src/interpreters/ad.py", 292),
    _c(31, "KeyError") + ": integer_pow",
    CAUSE,
    _c(31, "JaxStackTraceBeforeTransformation") + "         Traceback (most recent call last)",
    _lib_frame("<frozen runpy>", 198),
    *[_lib_frame(f"{SITE}/ipykernel/kernelbase.py", 500 + k) for k in range(12)],
    _cell_frame(12, 1, "grad(not_linear)(1.)"),
    _cell_frame(11, 6, "not_linear.defjvp(lambda p, t: (not_linear(p[0]), t[0] ** 2))"),
    _lib_frame(f"{SITE}/jax/_src/numpy/ufuncs.py", 2735),
    _c(31, "JaxStackTraceBeforeTransformation") + ": NotImplementedError: Transpose "
    "rule\n\nThe preceding stack trace is the source of the JAX operation.\n\n------",
    CAUSE,
    _c(31, "NotImplementedError") + "                       Traceback (most recent call last)",
    _cell_frame(12, 1, "grad(not_linear)(1.)"),
    "    " + _c(31, "[... skipping hidden 8 frame]") + "\n",
    _lib_frame(f"{SITE}/jax/_src/interpreters/ad.py", 294),
    _c(31, "NotImplementedError") + ": Transpose rule for 'integer_pow' not implemented",
]


def test_short_traceback_keeps_messages_and_the_readers_frames():
  short = nbout.plain("\n".join(nbout.short_traceback(JAX_CHAIN)))
  assert short == (
      "KeyError: integer_pow\n" + CAUSE + "\n"
      "NotImplementedError                       Traceback (most recent call last)\n"
      "Cell In[12], line 1\n----> 1 grad(not_linear)(1.)\n\n"
      "NotImplementedError: Transpose rule for 'integer_pow' not implemented")
  assert "JaxStackTraceBeforeTransformation" not in short
  assert "site-packages" not in short and "File " not in short


def test_short_traceback_cuts_until_it_fits():
  context = [f"step_{k}()" for k in range(5)]
  long = [RULE, _c(31, "ValueError") + "      Traceback (most recent call last)",
          _cell_frame(3, 9, "f(1)", context), _cell_frame(3, 2, "raise ValueError", context),
          _c(31, "ValueError") + ": bad\nsecond line", CAUSE,
          _c(31, "TypeError") + "      Traceback (most recent call last)",
          _cell_frame(3, 7, "raise TypeError('outer') from e", context),
          _c(31, "TypeError") + ": outer"]
  full = nbout.plain("\n".join(nbout.short_traceback(long, limit=100)))
  assert full.count("step_") == 15
  fits = nbout.plain("\n".join(nbout.short_traceback(long)))
  assert len(fits.split("\n")) <= MAX_LINES
  assert "step_" not in fits  # context lines go first
  assert "ValueError: bad\nsecond line" in fits and fits.endswith("TypeError: outer")
  assert "----> 7 raise TypeError('outer') from e" in fits
  tiny = nbout.plain("\n".join(nbout.short_traceback(long, limit=3)))
  assert tiny == "TypeError: outer"


def test_short_traceback_of_a_plain_error():
  tb = [RULE, _c(31, "ValueError") + "   Traceback (most recent call last)",
        _cell_frame(4, 1, "get(x)"), _lib_frame(f"{SITE}/jax/_src/state/x.py", 3),
        _c(31, "ValueError") + ": `get` must be called on `Ref` types"]
  short = nbout.plain("\n".join(nbout.short_traceback(tb)))
  assert short == ("ValueError   Traceback (most recent call last)\n"
                   "Cell In[4], line 1\n----> 1 get(x)\n\n"
                   "ValueError: `get` must be called on `Ref` types")


# --- whole notebooks ---------------------------------------------------------------

def _cell(source, outputs, tags=()):
  return {"cell_type": "code", "id": "random", "source": source, "execution_count": 1,
          "metadata": {"tags": list(tags)} if tags else {}, "outputs": outputs}


def _stream(name, text):
  return {"output_type": "stream", "name": name, "text": text}


def test_normalise_merges_streams_and_gives_content_ids():
  nb = {"cells": [
      {"cell_type": "markdown", "id": "x1", "metadata": {}, "source": "# t"},
      _cell("print(1)", [_stream("stdout", "1\n"), _stream("stderr", "w\n"),
                         _stream("stdout", "at /tmp/ipykernel_7/8.py:1\n")]),
      _cell("print(1)", [])]}
  nbout.normalise(nb)
  outs = nb["cells"][1]["outputs"]
  assert outs == [_stream("stdout", "1\nat <cell>:1\n"), _stream("stderr", "w\n")]
  ids = [c["id"] for c in nb["cells"]]
  assert len(set(ids)) == 3 and ids[2] == ids[1] + "-2"
  assert all(re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", i) for i in ids)


def test_normalise_keeps_stored_outputs_only_for_unchanged_code():
  def page(timing, address, code="t()"):
    return {"cells": [
        _cell(code, [_stream("stdout", f"took {timing}\n")], tags=["nbval-ignore-output"]),
        _cell("f", [{"output_type": "execute_result", "execution_count": 2, "metadata": {},
                     "data": {"text/plain": f"<function f at {address}>"}}])]}
  stored = nbout.normalise(page("3.1 µs", "0x7f0000000001"))
  again = nbout.normalise(page("2.9 µs", "0x7f00000000ff"), previous=stored)
  assert again == stored
  changed = nbout.normalise(page("2.9 µs", "0x7f00000000ff", "t(); t()"), previous=stored)
  assert "2.9 µs" in changed["cells"][0]["outputs"][0]["text"]
  assert "0x7f00000000ff" in changed["cells"][1]["outputs"][0]["data"]["text/plain"]
  differs = page("2.9 µs", "0x7f00000000ff")
  differs["cells"][1]["outputs"][0]["data"]["text/plain"] = "<function g at 0x7f00000000ff>"
  assert "function g" in str(nbout.normalise(differs, previous=stored))


def test_normalise_drops_what_the_machine_wrote_to_stderr():
  """A build on a loaded machine stores no check_rules progress line or XLA
  alarm (nbval skips those in a fresh run where the stored cell has no
  stderr); the page's own stderr stays."""
  progress = "check_rules: 10.3 s of 30 s: batch: vmap of vjp vs a loop\n"
  nb = {"cells": [_cell("check()", [_stream("stdout", "ok\n"), _stream("stderr", progress)]),
                  _cell("warn()", [_stream("stderr", "UserWarning: the page's own\n")])]}
  nbout.normalise(nb)
  assert nb["cells"][0]["outputs"] == [_stream("stdout", "ok\n")]
  assert nb["cells"][1]["outputs"] == [_stream("stderr", "UserWarning: the page's own\n")]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_notebooks_are_normalised(path):
  """Building an unchanged page writes the same notebook: normalising a
  committed notebook, with itself as the stored one, changes nothing."""
  nbformat = pytest.importorskip("nbformat")
  nb = nbformat.read(path, as_version=4)
  again = nbout.normalise(nbformat.read(path, as_version=4),
                          previous=nbformat.read(path, as_version=4))
  assert nbformat.writes(again) == nbformat.writes(nb), (
      f"{path.name} is not what tools/notebooks.py build writes: rebuild it")


PAGE = '''---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---

# A small page

```{code-cell}
import sys, time
def where():
  return where.__code__.co_filename
for k in range(3):
  print(k, flush=True)
  print('warn', k, file=sys.stderr, flush=True)
print('defined in', where())
```

```{code-cell}
:tags: [nbval-ignore-output]

t0 = time.perf_counter(); print(f'{time.perf_counter() - t0:.9f} s')
```

```{code-cell}
:tags: [raises-exception]

import json
def parse(s):
  return json.loads(s)
parse('{')
```
'''


def test_building_a_page_twice_gives_the_same_notebook(tmp_path):
  """End to end, on a page made to vary: streams split across messages, a
  kernel cell file's path, a timing, a traceback through the standard library.
  (That nbval accepts the masked outputs is what nbval on notebooks/ shows.)"""
  pytest.importorskip("nbclient")
  pytest.importorskip("jupytext")
  try:  # a kernel talks to its client over TCP
    socket.socket(socket.AF_INET).close()
  except OSError as e:  # as on the TPU machine lent to this project
    pytest.skip(f"this machine allows no IPv4 socket ({e}), over which a Jupyter "
                "kernel talks to its client")
  docs, notebooks = tmp_path / "docs", tmp_path / "notebooks"
  docs.mkdir()
  (docs / "small.md").write_text(PAGE, encoding="utf-8")
  cmd = [sys.executable, str(ROOT / "tools" / "notebooks.py"), "--docs", str(docs),
         "--notebooks", str(notebooks), "build", "small"]
  first = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
  assert first.returncode == 0, first.stdout + first.stderr
  stored = (notebooks / "small.ipynb").read_bytes()
  second = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
  assert second.returncode == 0, second.stdout + second.stderr
  assert (notebooks / "small.ipynb").read_bytes() == stored
  nb = json.loads(stored)
  outs = nb["cells"][1]["outputs"]
  assert [o["name"] for o in outs] == ["stdout", "stderr"]
  assert "".join(outs[0]["text"]) == "0\n1\n2\ndefined in <cell>\n"
  err = nb["cells"][3]["outputs"][-1]
  tb = nbout.plain("\n".join(err["traceback"]))
  assert "File " not in tb and tb.endswith(err["ename"] + ": " + err["evalue"])
  assert "----> 4 parse('{')" in tb and "----> 3   return json.loads(s)" in tb


def test_clean_normalises_a_notebook_without_executing_it(tmp_path):
  """`tools/notebooks.py clean` fixes a notebook built by an older build."""
  nbformat = pytest.importorskip("nbformat")
  pytest.importorskip("jupytext")
  docs, notebooks = tmp_path / "docs", tmp_path / "notebooks"
  docs.mkdir()
  notebooks.mkdir()
  (docs / "small.md").write_text(PAGE, encoding="utf-8")
  nb = nbformat.v4.new_notebook()
  nb.cells = [nbformat.v4.new_code_cell("grad(not_linear)(1.)", execution_count=1, outputs=[
      nbformat.v4.new_output("stream", name="stdout", text="a /tmp/ipykernel_3/4.py\n"),
      nbformat.v4.new_output("stream", name="stdout", text="b\n"),
      nbformat.v4.new_output("error", ename="NotImplementedError", evalue="Transpose",
                             traceback=JAX_CHAIN)])]
  nbformat.write(nb, notebooks / "small.ipynb")
  cmd = [sys.executable, str(ROOT / "tools" / "notebooks.py"), "--docs", str(docs),
         "--notebooks", str(notebooks), "clean", "small"]
  out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0 and "cleaned: small.ipynb" in out.stdout, out
  cleaned = nbformat.read(notebooks / "small.ipynb", as_version=4)
  stream, error = cleaned.cells[0].outputs
  assert stream.text == "a <cell>\nb\n"
  assert len("\n".join(error.traceback).split("\n")) <= MAX_LINES
  assert cleaned.cells[0].id == nbout.normalise(cleaned).cells[0].id
  again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
  assert "unchanged: small.ipynb" in again.stdout, again


def test_nbval_skips_only_the_machine_s_own_stderr_messages():
  """notebooks/conftest.py: XLA's slow-operation alarms and JAX's warning for a
  compilation-cache entry read while another kernel wrote it are not compared;
  any other stderr output is."""
  spec = importlib.util.spec_from_file_location("nb_conftest", ROOT / "notebooks" / "conftest.py")
  nb_conftest = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(nb_conftest)
  stderr = lambda text: {"output_type": "stream", "name": "stderr", "text": text}
  assert nb_conftest._is_machine_stderr(stderr(
      "E1202 slow_operation_alarm.cc:65] Constant folding an instruction is taking > 1s"))
  assert nb_conftest._is_machine_stderr(stderr(
      "UserWarning: Error reading persistent compilation cache entry for 'jit_f': "
      "ValueError: truncated"))
  # check_rules' progress, printed once a run has taken 10 s (load alone can)
  assert nb_conftest._is_machine_stderr(stderr(
      "check_rules: 10.3 s of 30 s: batch: vmap of vjp vs a loop\n"))
  assert nb_conftest._is_machine_stderr(stderr(  # with no time budget
      "check_rules: 13.2 s: expand: all its checks\n"))
  assert not nb_conftest._is_machine_stderr(stderr("see check_rules: 10 s of 30 s: x"))
  assert not nb_conftest._is_machine_stderr(stderr("UserWarning: something else"))
  assert not nb_conftest._is_machine_stderr(
      {"output_type": "stream", "name": "stdout",
       "text": "Error reading persistent compilation cache entry"})


# --- hidden cells, marked --------------------------------------------------------

def _marked_example():
  nbformat = pytest.importorskip("nbformat")
  new = nbformat.v4.new_code_cell

  def hidden(source, tag="remove-cell"):
    return new(source, metadata={"tags": [tag]})

  nb = nbformat.v4.new_notebook()
  nb.cells = [
      new("x = 1"),
      hidden("assert x == 1"),                                     # 1: checks
      hidden("helper = lambda v: v + 1\nassert helper(1) == 2"),  # 2: both
      hidden("y = [e for e in range(3)]"),                         # 3: setup
      hidden("def f(t):\n  return t"),                           # 4: defines
      hidden("try:\n  f(-1)\nexcept ValueError:\n  pass\n"
             "else:\n  raise AssertionError('no error')"),        # 5: checks
      hidden("plot(x)", "remove-input"),                          # 6: output only
      new("def g():\n  pass", metadata={"tags": ["hide-input"]}),  # 7: folded
      nbformat.v4.new_markdown_cell("text"),
      new("print(helper(x), f(2), [e for e in 'ab'])\ny = 5\nprint(y)"),
  ]
  return nb


def test_mark_says_what_each_hidden_cell_is_for():
  nb = _marked_example()
  before = copy.deepcopy(nb)
  marks.mark(nb)
  firsts = [c.source.split("\n")[0] for c in nb.cells]
  assert firsts[1] == "# Hidden on the site: checks the claims above."
  assert firsts[2] == ("# Hidden on the site: checks the claims above, and defines "
                       "names later cells use.")
  # `y` is bound anew below before it is read, and `e` is the comprehension's own.
  assert firsts[3] == "# Hidden on the site: setup."
  assert firsts[4] == "# Hidden on the site: defines names later cells use."
  assert firsts[5] == "# Hidden on the site: checks the claims above."
  assert firsts[6] == "# Hidden on the site, which shows only this cell's output."
  assert [c.source for c in nb.cells[7:]] == [c.source for c in before.cells[7:]]
  assert nb.cells[0] == before.cells[0]
  collapsed = [i for i, c in enumerate(nb.cells)
               if c.metadata.get("jupyter") == {"source_hidden": True}]
  assert collapsed == [1, 2, 3, 4, 5, 6, 7]
  # The code itself is unchanged below the mark.
  for cell, old in zip(nb.cells[1:7], before.cells[1:7]):
    assert cell.source.split("\n", 1)[1] == old.source


def test_mark_is_idempotent_and_unmark_undoes_it():
  nb = _marked_example()
  page = copy.deepcopy(nb)
  once = copy.deepcopy(marks.mark(nb))
  assert marks.mark(nb) == once
  assert marks.unmark(once) == page


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_notebooks_mark_every_hidden_cell(path):
  """A reader who downloads a page's notebook sees which cells the site hides."""
  nb = json.loads(path.read_text(encoding="utf-8"))
  hidden_tags = {"remove-cell", "remove-input"}
  wrong = []
  for i, cell in enumerate(nb["cells"]):
    if cell["cell_type"] != "code":
      continue
    first = "".join(cell["source"]).split("\n")[0]
    hidden = bool(hidden_tags & set(cell["metadata"].get("tags", [])))
    if hidden != (first in marks.MARKS.values()):
      wrong.append(f"cell {i}: hidden on the site: {hidden}, first line {first!r}")
    if hidden and not cell["metadata"].get("jupyter", {}).get("source_hidden"):
      wrong.append(f"cell {i}: hidden on the site but not collapsed")
  assert not wrong, (f"{path.name} (rebuild it with tools/notebooks.py build):\n"
                     + "\n".join(wrong))
