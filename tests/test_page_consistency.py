"""Statements that several pages make must not contradict each other.

Each fact below has one home page that asserts it in its cells; other pages
state it briefly and link there. These tests read the prose of every page
(docs/*.md, code cells left out) and fail on a phrasing that contradicts the
home page, or that states the fact without what makes it true:

- a `jax.custom_vjp` function has no forward mode; it has a Hessian exactly
  when its forward function computes with plain operations (not when it
  calls the function itself). Home: custom-jvp-vjp,
  `jax-301-custom-vjp-forward-mode`. Wrong: "no forward mode and so no
  jax.hessian".
- `jax.custom_vjp` does not convert closures over traced values (an escaped
  tracer). Home: custom-jvp-vjp, `jax-301-custom-vjp-closures`. Wrong:
  "closures are converted", said of `jax.custom_vjp`.
- `hijax.testing.check_rules` differentiates the batched program (`jvp` and
  `vjp` of `vmap`). Home: checking-rules, `jax-301-checking-rules`. Wrong:
  "does not differentiate the batched program".
- smaller ones found false once: `nondiff_argnums` needs a value that is not
  traced, not a hashable one; `jax_debug_nans`'s error points at the user's
  forward code (in its cause), not "into JAX's own differentiation code".

A test of each detector on made-up sentences shows what it flags and what it
lets through.
"""
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.pages

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").glob("*.md"))

FORWARD_MODE_LABEL = "jax-301-custom-vjp-forward-mode"
CLOSURES_LABEL = "jax-301-custom-vjp-closures"


# --- reading the prose -----------------------------------------------------------

def prose_units(text):
  """The prose of a MyST page as a list of units: each paragraph and list
  item (its lines joined) and each table row. Front matter, code cells,
  other fenced blocks, display math and headings are left out."""
  text = re.sub(r"\A---\n.*?\n---\n", "", text, flags=re.S)
  text = re.sub(r"^(```|~~~).*?^\1\s*$", "", text, flags=re.S | re.M)
  text = re.sub(r"^\$\$.*?^\$\$\s*$", "", text, flags=re.S | re.M)
  units, current = [], []

  def flush():
    if current:
      units.append(" ".join(current))
      current.clear()

  for line in text.splitlines():
    stripped = line.strip()
    if not stripped or stripped.startswith(("#", "(")) and stripped.endswith(")="):
      flush()
    elif stripped.startswith("#"):
      flush()
    elif stripped.startswith("|"):
      flush()
      units.append(stripped)
    elif re.match(r"([-*]|\d+\.)\s", stripped):
      flush()
      current.append(stripped)
    else:
      current.append(stripped)
  flush()
  return units


def sentences(unit):
  """A unit split into sentences (a table row stays whole)."""
  if unit.startswith("|"):
    return [unit]
  return [s for s in re.split(r"(?<=[.;:!?])\s+(?=[A-Z`(*{$])", unit) if s]


def _mentions_custom_vjp(text):
  """Names jax.custom_vjp (not the `custom_vjp_call` of a printed jaxpr)."""
  return re.search(r"custom_vjp(?![_\w])", text) is not None


# --- the detectors ----------------------------------------------------------------

# What makes a statement about a custom_vjp function's Hessian true: what its
# forward function does, or a link to the page that says it.
_FWD_QUALIFIER = re.compile(
    r"(calls? (the function|itself|`?\w+`? (itself|again))|"
    r"(computes?|written) [^.|]{0,40}(plain operations|inline)|"
    r"forward (function|rule)[^.|]{0,60}(calls|plain|inline)|"
    r"`fwd`[^.|]{0,60}(calls|plain|inline)|"
    + re.escape(FORWARD_MODE_LABEL) + ")", re.I)
_HESSIAN = re.compile(r"\bhessians?\b", re.I)
_NO_FORWARD_SO_NO = re.compile(
    r"no forward[- ]mode,?\s+(and\s+)?(so|hence|therefore|thus|so there is)\s+no\b", re.I)


def hessian_story_problems(unit):
  """Why ``unit`` misstates the custom_vjp Hessian story ([] if it does not)."""
  problems = []
  if _NO_FORWARD_SO_NO.search(unit):
    problems.append("infers 'no Hessian' from 'no forward mode' (a custom_vjp "
                    "whose forward function uses plain operations has one)")
  elif (_mentions_custom_vjp(unit) and _HESSIAN.search(unit)
        and not _FWD_QUALIFIER.search(unit)):
    problems.append("speaks of the Hessian of a custom_vjp function without "
                    "saying what its forward function does (or linking "
                    f"{{ref}}`{FORWARD_MODE_LABEL}`)")
  return problems


_CONVERTED = re.compile(
    r"(?P<lead>[^.|;]{0,60}?)\b(closures?|captured values?|closed-over values?)\b"
    r"(?P<mid>[^.|;]{0,40}?)\b(closure-)?convert(s|ed)?\b", re.I)
_CONVERTS_CLOSURES = re.compile(
    r"(?P<lead>[^.|;]{0,60}?)\b(closure-)?converts?\s+(its\s+|the\s+|any\s+)?"
    r"(closures?|captured values?|closed-over values?)\b", re.I)
_NEGATION = re.compile(r"\b(not|never|no|n't|cannot|nor)\b|n't\b", re.I)


def closure_problems(sentence):
  """Why ``sentence`` says custom_vjp converts closures ([] if it does not)."""
  if not _mentions_custom_vjp(sentence):
    return []
  for other in ("custom_root", "custom_linear_solve", "optimistix", "lineax",
                "hijax.implicit", "closure_convert"):
    if other in sentence:  # about another tool, or JAX's explicit helper
      return []
  for m in _CONVERTED.finditer(sentence):
    if not _NEGATION.search(m.group("lead") + m.group("mid")):
      return [f"says closures are converted: {m.group(0).strip()!r}"]
  for m in _CONVERTS_CLOSURES.finditer(sentence):
    if not _NEGATION.search(m.group("lead")):
      return [f"says closures are converted: {m.group(0).strip()!r}"]
  return []


_CHECK_RULES_NOT_BATCHED = re.compile(
    r"\b(does not|doesn't|do not|don't|never|not)\s+(\w+\s+){0,3}"
    r"differentiat\w*\s+(\w+\s+){0,3}(batched|vmap)", re.I)


def check_rules_problems(sentence):
  """Why ``sentence`` says check_rules skips the batched program's derivatives."""
  if _CHECK_RULES_NOT_BATCHED.search(sentence):
    return ["says the batched program is not differentiated (check_rules runs "
            "jvp and vjp of vmap)"]
  return []


_HASHABLE_NONDIFF = re.compile(r"nondiff_argnums[^.]*\b(needs?|requires?|must be|takes?)"
                               r"\s+(an?\s+)?hashable\b", re.I)
# said of jax_debug_nans's error (the sentence need not name it)
_DEBUG_NANS_INTO_JAX = re.compile(r"traceback into JAX'?s own", re.I)


def small_fact_problems(sentence):
  problems = []
  if _HASHABLE_NONDIFF.search(sentence):
    problems.append("nondiff_argnums needs a value that is not traced, not a "
                    "hashable one (an unhashable list works)")
  if _DEBUG_NANS_INTO_JAX.search(sentence):
    problems.append("jax_debug_nans's error leads to the user's forward code "
                    "(its cause), not into JAX's")
  return problems


def page_problems(text):
  """Every contradiction the detectors find in a page's prose."""
  found = []
  for unit in prose_units(text):
    for problem in hessian_story_problems(unit):
      found.append((problem, unit))
    for sentence in sentences(unit):
      for detector in (closure_problems, check_rules_problems,
                       small_fact_problems):
        for problem in detector(sentence):
          found.append((problem, sentence))
  return found


# --- the pages --------------------------------------------------------------------

@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_shared_statements_agree(page):
  found = page_problems(page.read_text(encoding="utf-8"))
  assert not found, f"{page.name}:\n" + "\n".join(
      f"  - {problem}\n    in: {text[:300]}" for problem, text in found)


def test_pages_were_read():
  """The detectors saw prose on every page (a parser that drops all text
  would pass every page)."""
  assert len(PAGES) >= 15, PAGES
  for page in PAGES:
    units = prose_units(page.read_text(encoding="utf-8"))
    assert sum(len(u) for u in units) > 300, page.name


# --- the detectors themselves -----------------------------------------------------

@pytest.mark.parametrize("unit", [
    "Written as a `custom_vjp`, an adjoint solver has no forward mode and so "
    "no `jax.hessian`.",
    "A `custom_vjp` function has no forward mode, so no jax.hessian either.",
    "The Hessian of a `custom_vjp` function fails.",
    "`jax.hessian` of a `custom_vjp` function works.",
])
def test_hessian_story_flags(unit):
  assert hessian_story_problems(unit), unit


@pytest.mark.parametrize("unit", [
    "Written as a `custom_vjp`, an adjoint solver has no forward mode, and "
    "`odeint`, whose forward rule calls itself, has no `jax.hessian` either.",
    "`jax.hessian` of a `custom_vjp` function runs when its forward function "
    "computes the output with plain operations.",
    "For the Hessian see {ref}`jax-301-custom-vjp-forward-mode`; `custom_vjp` "
    "has no forward mode.",
    "A `custom_vjp` function has no forward mode: `jvp` and `jacfwd` raise.",
    "Hessians of a `HiPrim` work in every mode.",
])
def test_hessian_story_passes(unit):
  assert not hessian_story_problems(unit), unit


@pytest.mark.parametrize("sentence", [
    "| `jax.custom_vjp` | yes | no | yes | closures are converted, or "
    "`nondiff_argnums` |",
    "With `jax.custom_vjp`, closures over traced values are converted for you.",
    "`jax.custom_vjp` converts closures into arguments.",
])
def test_closure_flags(sentence):
  assert closure_problems(sentence), sentence


@pytest.mark.parametrize("sentence", [
    "| `jax.custom_vjp` | yes | no | a closure over a traced value is not "
    "converted: `grad` raises an escaped-tracer error |",
    "`jax.custom_vjp` does not convert closures (an escaped tracer).",
    "| `jax.lax.custom_root` | closures over the parameters, converted by JAX |",
    "Closures are converted into `params` by `hijax.implicit`.",
])
def test_closure_passes(sentence):
  assert not closure_problems(sentence), sentence


@pytest.mark.parametrize("sentence, flagged", [
    ("`check_rules` compares `vmap` of each rule with a loop; it does not "
     "differentiate the batched program.", True),
    ("It never differentiates the vmapped function.", True),
    ("`check_rules` differentiates the batched program too: it compares `jvp` "
     "and `vjp` of `vmap` with a loop.", False),
])
def test_check_rules_detector(sentence, flagged):
  assert bool(check_rules_problems(sentence)) == flagged, sentence


@pytest.mark.parametrize("sentence, flagged", [
    ("`nondiff_argnums` needs a hashable Python value, not a traced array.", True),
    ("`nondiff_argnums` needs a value that is not traced; it need not be "
     "hashable.", False),
    ("`jax_debug_nans` gives a traceback into JAX's own differentiation code.",
     True),
    ("It names the primitive and gives a traceback into JAX's own "
     "differentiation code rather than a position in yours.", True),
    ("What `nondiff_argnums` needs is a value that is not traced.", False),
])
def test_small_fact_detector(sentence, flagged):
  assert bool(small_fact_problems(sentence)) == flagged, sentence


def test_prose_units_leave_out_code_and_headings():
  page = ("---\nkernelspec:\n  name: python3\n---\n\n(label)=\n# A title about "
          "custom_vjp Hessians\n\nSome prose\nover two lines.\n\n```{code-cell}\n"
          "# has no forward mode and so no hessian\n```\n\n| a | b |\n\n$$\nx\n$$\n")
  assert prose_units(page) == ["Some prose over two lines.", "| a | b |"]
