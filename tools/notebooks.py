#!/usr/bin/env python
"""Generate notebooks/<page>.ipynb from docs/<page>.md, executed, and check them.

  python tools/notebooks.py build [PAGE ...] [-j N]   regenerate and execute
  python tools/notebooks.py check                     exit 1 if out of sync
  python tools/notebooks.py clean [PAGE ...]          normalise without executing

A page is a docs/*.md file with a jupytext header naming a kernel (index.md is
not a notebook). `build` reads each page with jupytext, drops jupytext's
pairing metadata (the notebook is generated, not paired), marks the cells the
site hides (tools/notebook_marks.py: a first comment line saying so, and the
input collapsed in Jupyter), executes it with nbclient in docs/ (cells tagged
raises-exception may raise; any other error aborts), normalises it
(tools/notebook_outputs.py: stable cell ids, merged streams, short
tracebacks, no machine paths, and the stored outputs kept where the page's
code is unchanged and they still hold), and writes the notebook with its
outputs. Building an unchanged page again leaves the file as it was. `clean`
applies the same normalisation to the committed notebooks without executing
anything (for a notebook built by an older version of this tool; what nbval
compares is unchanged by it). `check` compares every notebook's cells (type,
source, tags) with jupytext's reading of its page, marked, and also requires
each code cell to have been executed, and no stray notebooks.
"""
import argparse
import concurrent.futures as cf
import os
import sys
import time
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import notebook_marks  # noqa: E402
import notebook_outputs  # noqa: E402
DOCS = ROOT / "docs"
NOTEBOOKS = ROOT / "notebooks"


def pages():
    """Names of the notebook pages under docs/ (sorted)."""
    out = []
    for md in sorted(DOCS.glob("*.md")):
        text = md.read_text(encoding="utf-8")
        if text.startswith("---") and "kernelspec:" in text.split("\n---", 1)[0]:
            out.append(md.stem)
    return out


def read_page(name):
    """The page as a notebook, its hidden cells marked (tools/notebook_marks.py)."""
    nb = jupytext.read(DOCS / f"{name}.md")
    nb.metadata.pop("jupytext", None)
    return notebook_marks.mark(nb)


def cell_signature(nb):
    """What must agree between a page and its notebook: cell kinds, sources, tags."""
    return [(c.cell_type, c.source, list(c.metadata.get("tags", []))) for c in nb.cells]


def build_one(name, timeout):
    from nbclient import NotebookClient

    nb = read_page(name)
    t0 = time.perf_counter()
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", allow_errors=False,
        record_timing=False, resources={"metadata": {"path": str(DOCS)}})
    client.execute()
    nb.metadata.pop("widgets", None)
    target = NOTEBOOKS / f"{name}.ipynb"
    previous = nbformat.read(target, as_version=4) if target.exists() else None
    notebook_outputs.normalise(nb, previous)
    NOTEBOOKS.mkdir(exist_ok=True)
    nbformat.write(nb, target)
    return name, time.perf_counter() - t0


def build(names, jobs, timeout):
    # No environment of our own: a page must run, and print the same, in a
    # reader's fresh kernel (nothing set), so the stored outputs are those.
    names = names or pages()
    unknown = sorted(set(names) - set(pages()))
    if unknown:
        sys.exit(f"not notebook pages under docs/: {', '.join(unknown)}")
    failed = []
    with cf.ThreadPoolExecutor(max_workers=jobs) as ex:
        futs = {ex.submit(build_one, n, timeout): n for n in names}
        for fut in cf.as_completed(futs):
            try:
                name, dt = fut.result()
                print(f"executed {name} in {dt:.1f} s -> notebooks/{name}.ipynb", flush=True)
            except Exception as e:  # noqa: BLE001 - report every page
                failed.append(futs[fut])
                print(f"FAILED {futs[fut]}: {type(e).__name__}: {e}", flush=True)
    stray = [p for p in NOTEBOOKS.glob("*.ipynb") if p.stem not in pages()]
    for p in stray:
        print(f"removing {p} (no page {p.stem}.md)")
        p.unlink()
    if failed:
        sys.exit(f"{len(failed)} page(s) failed: {', '.join(sorted(failed))}")


def clean(names):
    """Normalises committed notebooks in place, without executing them."""
    for name in names or pages():
        path = NOTEBOOKS / f"{name}.ipynb"
        before = path.read_bytes()
        nb = notebook_outputs.normalise(nbformat.read(path, as_version=4))
        nbformat.write(nb, path)
        print(f"{'cleaned' if path.read_bytes() != before else 'unchanged'}: {path.name}")


def problems():
    """Every way notebooks/ disagrees with docs/ (empty when in sync)."""
    out = []
    want = pages()
    have = sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb"))
    for name in sorted(set(want) - set(have)):
        out.append(f"notebooks/{name}.ipynb is missing")
    for name in sorted(set(have) - set(want)):
        out.append(f"notebooks/{name}.ipynb has no page docs/{name}.md")
    for name in sorted(set(want) & set(have)):
        page = cell_signature(read_page(name))
        nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
        got = cell_signature(nb)
        if page != got:
            diff = next((i for i, (a, b) in enumerate(zip(page, got)) if a != b),
                        min(len(page), len(got)))
            out.append(f"notebooks/{name}.ipynb differs from docs/{name}.md "
                       f"(first at cell {diff}; {len(got)} vs {len(page)} cells)")
            continue
        unexecuted = [i for i, c in enumerate(nb.cells)
                      if c.cell_type == "code" and c.get("execution_count") is None]
        if unexecuted:
            out.append(f"notebooks/{name}.ipynb: code cells {unexecuted} were not executed")
    return out


def main():
    global DOCS, NOTEBOOKS
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=Path, default=DOCS, help="pages (default docs/)")
    ap.add_argument("--notebooks", type=Path, default=NOTEBOOKS,
                    help="notebooks (default notebooks/)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("pages", nargs="*")
    b.add_argument("-j", "--jobs", type=int, default=1)
    b.add_argument("--timeout", type=int, default=300, help="seconds per cell")
    sub.add_parser("check")
    c = sub.add_parser("clean")
    c.add_argument("pages", nargs="*")
    a = ap.parse_args()
    DOCS, NOTEBOOKS = a.docs.resolve(), a.notebooks.resolve()
    if a.cmd == "build":
        build(a.pages, a.jobs, a.timeout)
    elif a.cmd == "clean":
        clean(a.pages)
    else:
        msgs = problems()
        for m in msgs:
            print(m)
        if msgs:
            sys.exit("notebooks are out of sync with docs/: run `nox -s notebooks`")
        print(f"notebooks in sync with docs/ ({len(pages())} pages)")


if __name__ == "__main__":
    main()
