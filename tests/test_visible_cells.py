"""What a reader copies from the site runs: each page's visible code cells,
alone, in order, in a fresh process (tools/visible_cells.py).

The site hides cells tagged ``remove-cell`` (checks, setup) and
``remove-input``; nbval runs every page with them. A visible cell that reads
a name only a hidden cell defines, or needs a setting only a hidden cell
makes (more CPU devices, say), passes nbval and fails for a reader who
copies the page. Here each page's visible cells run without them; a cell
tagged ``raises-exception`` must raise and no other may.

Cost: each page runs in a process forked from one that has imported JAX and
the pages' libraries once, and, in the `tests` session, with the compilation
cache nbval's kernels use, so the programs the visible cells compile are
mostly loaded, not compiled again.
"""
import importlib.util
from pathlib import Path

import pytest
from fresh_process import skip_if_the_chip_is_held

pytestmark = pytest.mark.pages

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "visible_cells.py"  # not in the sdist, nor are the pages


def _pages():
  """The notebook pages under docs/ (those with a kernelspec)."""
  return [md.stem for md in sorted((ROOT / "docs").glob("*.md"))
          if "kernelspec:" in md.read_text(encoding="utf-8").split("\n---", 1)[0]]


@pytest.fixture(scope="module")
def visible_cells():
  pytest.importorskip("jupytext")
  spec = importlib.util.spec_from_file_location("visible_cells", TOOL)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture(scope="module")
def runner(visible_cells):
  with visible_cells.Runner() as r:
    yield r


@pytest.mark.parametrize("page", _pages())
def test_visible_cells_run_alone(page, runner, visible_cells):
  failure, _ = runner.run(page)
  if failure is not None:
    skip_if_the_chip_is_held(failure["error"])
  assert failure is None, visible_cells.describe(page, failure)


def test_the_pages_are_found_as_the_tool_finds_them(visible_cells):
  assert _pages() == visible_cells.pages() and len(_pages()) >= 15


def test_a_name_only_a_hidden_cell_defines_fails(runner, visible_cells, tmp_path,
                                                 monkeypatch):
  """The runner drops hidden cells (a page that passes nbval fails here) and
  holds a raises-exception cell to raising."""
  page = tmp_path / "made-up.md"
  page.write_text(
      "---\nkernelspec:\n  name: python3\n  display_name: Python 3\n---\n\n"
      "```{code-cell}\n:tags: [remove-cell]\n\nhidden = 1\n```\n\n"
      "```{code-cell}\nprint(hidden)\n```\n")
  monkeypatch.setattr(visible_cells, "DOCS", tmp_path)
  failure, _ = runner.run("made-up")
  assert failure["cell"] == 1 and failure["error"].startswith("NameError"), failure
  page.write_text(page.read_text().replace(
      "```{code-cell}\nprint(hidden)", "```{code-cell}\n:tags: [raises-exception]\n\n1 + 1"))
  failure, _ = runner.run("made-up")
  assert failure["error"] == "tagged raises-exception but ran", failure


def test_a_page_data_cell_runs_with_the_visible_cells(runner, visible_cells, tmp_path,
                                                     monkeypatch):
  """A page's recorded figures (its page-data cell, hidden on the site) come
  with its downloaded notebook, so its visible cells may read them."""
  page = tmp_path / "made-up.md"
  page.write_text(
      "---\nkernelspec:\n  name: python3\n  display_name: Python 3\n---\n\n"
      "```{code-cell}\n:tags: [remove-cell, page-data]\n\nRECORD = {'x': 2}\n```\n\n"
      "```{code-cell}\n:tags: [remove-cell]\n\nhidden = 1\n```\n\n"
      "```{code-cell}\nassert RECORD['x'] == 2\n```\n")
  monkeypatch.setattr(visible_cells, "DOCS", tmp_path)
  assert [c["index"] for c in visible_cells.visible_cells("made-up")] == [0, 2]
  failure, _ = runner.run("made-up")
  assert failure is None, failure


def test_a_writefile_cell_writes_its_file(runner, visible_cells, tmp_path, monkeypatch):
  """``%%writefile`` (IPython's cell magic, run by a reader's Jupyter) writes
  its body to the file; any other magic fails as the Python it is not."""
  page = tmp_path / "made-up.md"
  head = "---\nkernelspec:\n  name: python3\n  display_name: Python 3\n---\n\n"
  scratch = tmp_path / "scratch"
  scratch.mkdir()
  page.write_text(
      head + f"```{{code-cell}}\nimport os, sys\nos.chdir({str(scratch)!r})\n"
      "sys.path.insert(0, '.')\n```\n\n"
      "```{code-cell}\n%%writefile made_up_mod.py\nVALUE = 'it's'[:2]\n```\n\n"
      "```{code-cell}\nimport made_up_mod\nassert made_up_mod.VALUE == 'it'\n```\n")
  monkeypatch.setattr(visible_cells, "DOCS", tmp_path)
  failure, _ = runner.run("made-up")
  assert failure is not None and failure["cell"] == 2, failure  # 'it's' is not Python
  page.write_text(page.read_text().replace("'it's'[:2]", "'its'[:2]"))
  failure, _ = runner.run("made-up")
  assert failure is None, failure
  assert (scratch / "made_up_mod.py").read_text() == "VALUE = 'its'[:2]\n"
  page.write_text(head + "```{code-cell}\n%timeit 1 + 1\n```\n")
  failure, _ = runner.run("made-up")
  assert failure["error"].startswith("SyntaxError"), failure


# What a fresh process said on a TPU v5e while the test process held the chip.
_HELD_ON_A_TPU = ("RuntimeError: Unable to initialize backend 'tpu': ABORTED: Internal "
                  "error when accessing libtpu multi-process lockfile. Run \"$ sudo rm "
                  "/tmp/libtpu_lockfile\". (set JAX_PLATFORMS='' to automatically choose "
                  "an available backend)")


@pytest.mark.parametrize("error, skips", [
    (_HELD_ON_A_TPU, True),
    ("NameError: name 'hidden' is not defined", False),
    ("RuntimeError: Unable to initialize backend 'cuda': no CUDA-capable device", False),
    ("AssertionError: Unable to initialize backend 'tpu': ABORTED: a page's own words",
     False),
])
def test_a_page_skips_only_where_the_tpu_is_held(error, skips):
  """Only the held chip's error skips a page (naming the backend and quoting
  the error); any other failure of a visible cell still fails it."""
  if not skips:
    skip_if_the_chip_is_held(error)  # returns
    return
  with pytest.raises(pytest.skip.Exception) as info:
    skip_if_the_chip_is_held(error)
  reason = str(info.value)
  assert reason.startswith("one process at a time can hold a TPU and this test's "
                           "process holds it"), reason
  assert "ABORTED: Internal error when accessing libtpu multi-process lockfile" in reason
