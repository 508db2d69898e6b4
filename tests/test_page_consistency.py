"""Statements that several pages make agree with the facts, and so with each
other.

The facts live in one table, tests/page_facts.py: each says what is true
about JAX or hijax, has a probe that asserts it on the installed JAX (run
here on both supported releases), and says how a sentence that states it
reads and what makes such a sentence true or false. These tests read the
prose of every page (docs/*.md; code, math and headings left out; a table
cell is read with its row's and its column's names) and fail on a sentence
that contradicts a fact or states it without what makes it true. The
sentences each fact was written to catch (some of them once on the pages)
are checked to fail, and correct ones to pass.
"""
import re
from pathlib import Path

import pytest

from page_facts import FACTS

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").glob("*.md"))
pages = pytest.mark.pages


# --- reading the prose -----------------------------------------------------------

def _cells(row):
  return [c.strip() for c in row.strip().strip("|").split("|")]


def prose_units(text):
  """The prose of a MyST page as a list of units: each paragraph and list
  item (its lines joined) and each table cell after the first of its row,
  as "first cell | column header: cell". Front matter, code cells, other
  fenced blocks, display math and headings are left out."""
  text = re.sub(r"\A---\n.*?\n---\n", "", text, flags=re.S)
  text = re.sub(r"^(```|~~~).*?^\1\s*$", "", text, flags=re.S | re.M)
  text = re.sub(r"^\$\$.*?^\$\$\s*$", "", text, flags=re.S | re.M)
  units, current = [], []
  header = None  # the header cells of the table being read

  def flush():
    if current:
      units.append(" ".join(current))
      current.clear()

  for line in text.splitlines():
    stripped = line.strip()
    if not stripped.startswith("|"):
      header = None
    if not stripped or stripped.startswith("#"):
      flush()
    elif stripped.startswith("(") and stripped.endswith(")="):
      flush()
    elif stripped.startswith("|"):
      flush()
      cells = _cells(stripped)
      if header is None:
        header = cells
      elif not all(re.fullmatch(r":?-+:?", c) for c in cells):
        for name, cell in zip(header[1:], cells[1:]):
          units.append(f"{cells[0]} | {name}: {cell}")
    elif re.match(r"([-*]|\d+\.)\s", stripped):
      flush()
      current.append(stripped)
    else:
      current.append(stripped)
  flush()
  return units


def sentences(unit):
  """A unit split into sentences (a table cell stays whole)."""
  if re.match(r"[^|]* \| [^|:]*: ", unit):
    return [unit]
  return [s for s in re.split(r"(?<=[.;:!?])\s+(?=[A-Z`(*{$])", unit) if s]


def page_problems(text):
  """(fact, why, sentence) for every sentence of a page's prose that
  misstates a fact."""
  found = []
  for unit in prose_units(text):
    parts = sentences(unit)
    for fact in FACTS:
      for why, sentence in fact.problems(unit, parts):
        found.append((fact.name, why, sentence))
  return found


# --- the facts hold on this JAX (both supported releases run these) ---------------

@pytest.mark.parametrize("fact", FACTS, ids=[f.name for f in FACTS])
def test_the_fact_holds(fact):
  fact.probe()


# --- the pages agree with them ----------------------------------------------------

@pages
@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_pages_agree_with_the_facts(page):
  found = page_problems(page.read_text(encoding="utf-8"))
  assert not found, f"{page.name}:\n" + "\n".join(
      f"  - [{name}] {why}\n    in: {text[:300]}" for name, why, text in found)


@pages
def test_pages_were_read():
  """The rules saw prose on every page (a parser that drops all text would
  pass every page), and each fact's home section exists."""
  assert len(PAGES) >= 15, PAGES
  for page in PAGES:
    units = prose_units(page.read_text(encoding="utf-8"))
    assert sum(len(u) for u in units) > 300, page.name
  labels = {m for p in PAGES for m in re.findall(r"^\(([\w-]+)\)=$",
                                                  p.read_text(encoding="utf-8"), re.M)}
  for fact in FACTS:
    assert fact.home in labels, (fact.name, fact.home)


# --- the rules catch what they are for -------------------------------------------

def _as_page(text):
  """A made-up sentence as page text; "first | column: cell" as a table."""
  if " | " not in text:
    return text
  first, rest = text.split(" | ", 1)
  column, cell = rest.split(": ", 1)
  return f"| | {column} |\n| --- | --- |\n| {first} | {cell} |\n"


def _flags(fact, text):
  return [why for unit in prose_units(_as_page(text))
          for why, _ in fact.problems(unit, sentences(unit))]


@pytest.mark.parametrize("fact", FACTS, ids=[f.name for f in FACTS])
def test_each_fact_flags_its_wrong_sentences_and_passes_right_ones(fact):
  assert fact.wrong, f"{fact.name}: no sentence shows what the rule catches"
  for text in fact.wrong:
    assert _flags(fact, text), f"{fact.name} lets through: {text}"
  for text in fact.right:
    assert not _flags(fact, text), f"{fact.name} flags: {text}"


# The sentences of the contradictions the facts table was made for, as the
# pages had them, each in its page's context (the accelerators page's two
# once stood on it and on its subpage, accelerator-runs).
OLD_SENTENCES = {
    "accelerators": """Every jitted hijax call took about 2 ms on the TPU, whatever the
problem, and the peers' calls as long (the ratios are near 1): a fixed cost
per call, not the arithmetic, so these ratios say only that hijax costs no
more than its peers there.

Every test file of the unit suite (but the site's browser test, which
involves no JAX backend) and every page (but {doc}`accelerator-runs`, which
only reads the record) have run on a TPU v5e, in eight calls, and each
file's and page's latest run there passed. {doc}`accelerator-runs` has what
each call ran, what failed there and what was fixed:
""",
    "remat": """JAX itself had a `custom_remat` for a while: jax 0.11.2 exports
`jax.custom_remat(f, f_fwd, f_rem, f_bwd, *, static_argnums=(),
static_argnames=())`, with the same four functions and the same
signatures as hijax's, and it too needs `jax_remat3`. jax 0.12.0.1 no longer
exports it. `hijax.custom_remat` works with both versions; it takes no
static arguments (close over them, or pass them as ordinary arguments).
""",
    "porting-custom-vjp": """| | `jax.custom_vjp` | `hijax.custom_vjp` |
| --- | --- | --- |
| `grad`, `vjp`, `jit`, `vmap`, `scan`, `checkpoint` | yes | yes, the same values |
| `jvp`, `jacfwd`, `hessian`, `linearize` | `TypeError` | yes, from `bwd` |
""",
    "custom-jvp-vjp": """A `custom_vjp` function is often built inside another function and closes
over some of its values. That is fine as long as the differentiation that
meets the rule is not also differentiating the closed-over value. Here the
factory makes $c \\sin x$ with a rule, closing over `c`:
""",    "checking-rules": """1. on the host CPU, which JAX has beside every accelerator, everything as
   above, in float64: the sharp verdict on the rules' logic;
""",
}


@pages
@pytest.mark.parametrize("page", sorted(OLD_SENTENCES))
def test_the_old_contradictions_fail(page):
  """Put back into its page, each old passage fails the page's test."""
  assert page_problems(OLD_SENTENCES[page])
  text = (ROOT / "docs" / f"{page}.md").read_text(encoding="utf-8")
  assert not page_problems(text)
  assert page_problems(text + "\n" + OLD_SENTENCES[page])


def test_prose_units_leave_out_code_and_headings():
  page = ("---\nkernelspec:\n  name: python3\n---\n\n(label)=\n# A title about "
          "custom_vjp Hessians\n\nSome prose\nover two lines.\n\n```{code-cell}\n"
          "# has no forward mode and so no hessian\n```\n\n| | a | b |\n| --- | --- | --- |\n"
          "| row | 1 | 2 |\n\n$$\nx\n$$\n")
  assert prose_units(page) == ["Some prose over two lines.", "row | a: 1", "row | b: 2"]
