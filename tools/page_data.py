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


_CELL = re.compile(
    r"(```\{code-cell\}[^\n]*\n:tags: \[[^\]\n]*\b" + re.escape(TAG)
    + r"\b[^\]\n]*\]\n\n)(.*?)(^```)", re.S | re.M)


def cell_source(value: object, sources: str) -> str:
  """The body of a page-data cell holding `value`."""
  literal = pprint.pformat(value, width=88, sort_dicts=False)
  return (f"# The recorded results this page shows, from {sources}\n"
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


HIPRIM_ROWS = ("eager call", "eager grad", "jit(grad) compile", "construct",
               "construct and hash")


def _hiprim(seconds: dict) -> dict:
  ratios = {}
  for ours, anchor, label in (("hijax HiPrim", "jax HiPrim", "HiPrim"),
                              ("hijax.custom_vjp", "jax.custom_vjp", "custom_vjp")):
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
    return {**_hiprim(figures["seconds"]), "same HLO": figures["same HLO"]}
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
