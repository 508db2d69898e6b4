"""docs/portability.md, run on the installed JAX (the notebook run, nbval, is
with jax 0.12.0.1 only; this runs the page's cells with 0.11.2 too), and its
table of hijax-only names (module names and `HiPrim` attributes) checked
against what its cells find on this release."""
from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import jax
import pytest

PAGE = Path(__file__).resolve().parent.parent / "docs" / "portability.md"


@pytest.fixture
def jax_config():
  saved = {k: getattr(jax.config, k) for k in ("jax_remat3",
                                               "jax_pprint_use_color")}
  yield
  for k, v in saved.items():
    jax.config.update(k, v)


def run_cells(path):
  """The namespace after running the page's code cells in order; a cell
  tagged raises-exception must raise."""
  jupytext = pytest.importorskip("jupytext")
  ns = {"__name__": "__page__"}
  for i, cell in enumerate(jupytext.read(path).cells):
    if cell.cell_type != "code":
      continue
    expect_raise = "raises-exception" in cell.metadata.get("tags", [])
    code = compile(cell.source, f"{path.name}:cell{i}", "exec")
    with contextlib.redirect_stdout(io.StringIO()):
      if expect_raise:
        with pytest.raises(Exception):
          exec(code, ns)
      else:
        exec(code, ns)
  return ns


def test_every_cell_of_the_page_runs_on_the_installed_jax(jax_config):
  ns = run_cells(PAGE)
  text = PAGE.read_text()
  section = text.split("## From hijax to JAX's module", 1)[1]
  rows = [l for l in section.splitlines() if l.startswith("| `")]
  listed = set()
  for row in rows:
    listed |= set(re.findall(r"`([\w.]+)`", row.split("|")[1]))
  # the names the page's cells found to be hijax's only, on this release
  assert ns["hiprim_only"] <= listed
  assert listed == (ns["table"] | ns["only_with_011"]
                    | {"HiPrim.jet_from_expand", "HiPrim.check_args",
                       "HiPrim.batch_dim_rule", "HiPrim.pp_params",
                       "hijax.testing", "hijax.implicit", "hijax.debug"})


def test_the_api_page_counts_the_deliberate_differences_the_page_lists():
  """docs/api.md summarises portability's "Where hijax differs on purpose"
  table: it gives their number, and names physicalize among them."""
  section = PAGE.read_text().split("## Where hijax differs on purpose", 1)[1]
  section = section.split("\n## ", 1)[0]
  rows = [l for l in section.splitlines() if l.startswith("| ") and "---" not in l][1:]
  api = (PAGE.parent / "api.md").read_text()
  words = {3: "three", 4: "four", 5: "five", 6: "six", 7: "seven"}
  assert f"differs on purpose in {words[len(rows)]} places" in " ".join(api.split())
  assert any("physicalize" in row for row in rows)
