"""Checks that tie the docs, the notebooks and the spec together.

- notebooks/*.ipynb agree cell for cell with docs/*.md (tools/notebooks.py)
  and were executed; regenerate with `nox -s notebooks`.
- docs/index.md and conf.PAGES list the eight JAX 301 pages in the spec's order.
- Every page is in a list of conf.py; a subpage hangs off one page's toctree.
- The spec's own custom-derivatives page runs on hijax (by swapping its
  `jax.experimental.hijax` import for `hijax`).
- (docs/portability.md, which lists the hijax-only names and the differences
  from jax.experimental.hijax, is run on both JAX versions by
  tests/test_portability_page.py.)
The notebooks' outputs themselves are checked by nbval (`nox -s tests`).
"""
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fresh_process import skip_if_the_chip_is_held

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
SPEC_PAGE = SHARED / "spec" / "custom-derivatives.md"
SPEC_INDEX = SHARED / "spec" / "index.rst"
RUN_CELLS = SHARED / "tools" / "run_myst_cells.py"


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_notebooks_in_sync_with_pages():
    pytest.importorskip("jupytext")
    nbtool = _load("jax301_notebooks", ROOT / "tools" / "notebooks.py")
    problems = nbtool.problems()
    assert not problems, (
        "notebooks/ is out of sync with docs/ (run `nox -s notebooks`):\n  "
        + "\n  ".join(problems))


def _conf_list(name):
    src = (ROOT / "conf.py").read_text()
    m = re.search(rf"^{name} = \[(.*?)\]", src, re.S | re.M)
    return re.findall(r'"([\w-]+)"', m.group(1))


def _conf_pages():
    return _conf_list("PAGES")


def _toctrees(text):
    """``(hidden, entries)`` of each ```{toctree}``` block of a MyST page."""
    blocks = []
    for block in re.findall(r"```\{toctree\}\n(.*?)```", text, re.S):
        lines = [l.strip() for l in block.splitlines() if l.strip()]
        blocks.append((":hidden:" in lines,
                       [l for l in lines if not l.startswith(":")]))
    return blocks


def test_index_lists_the_eight_pages_in_order():
    pages = _conf_pages()
    assert len(pages) == 8
    index = (ROOT / "docs" / "index.md").read_text()
    toctrees = [entries for _, entries in _toctrees(index)]
    # The 301 pages and their appendix, then "Beyond 301" in a second toctree,
    # then the API reference, so "Next" never leads into it halfway.
    assert toctrees == [pages + _conf_list("APPENDIX"), _conf_list("BEYOND"),
                        _conf_list("REFERENCE")]
    # The page's own lists follow the same order: the reference comes last.
    assert re.findall(r"^- \{doc\}`([\w-]+)`", index, re.M) == (
        pages + _conf_list("APPENDIX") + _conf_list("BEYOND") + _conf_list("REFERENCE"))
    if SPEC_INDEX.exists():
        spec = SPEC_INDEX.read_text()
        spec_toc = spec.split(".. toctree::", 1)[1]
        spec_pages = [l.strip() for l in spec_toc.splitlines()
                      if l.strip() and not l.strip().startswith(":")]
        assert spec_pages == pages


def test_pages_have_labels_and_headers():
    for page in _conf_pages():
        path = ROOT / "docs" / f"{page}.md"
        if not path.exists():
            continue
        text = path.read_text()
        assert text.startswith("---\njupytext:"), f"{page}.md: no jupytext header"
        header = text.split("\n---\n", 1)[0]
        assert "name: python3" in header, f"{page}.md: kernelspec is not python3"
        body = text.split("\n---\n", 1)[1].lstrip("\n")
        assert body.startswith(f"(jax-301-{page})=\n# "), (
            f"{page}.md: must start with the label (jax-301-{page})= and a # title")


def _hidden_toctree_entries(text):
    return [e for hidden, entries in _toctrees(text) if hidden for e in entries]


def test_every_page_is_listed_and_subpages_hang_off_one_page():
    """Each page under docs/ is in conf.py's PAGES, APPENDIX, BEYOND,
    REFERENCE or SUBPAGES; a subpage (the continuation of a long page) is in a hidden
    toctree of exactly one listed page, and has that page's kind of header."""
    listed = (_conf_pages() + _conf_list("APPENDIX") + _conf_list("BEYOND")
              + _conf_list("REFERENCE"))
    subpages = _conf_list("SUBPAGES")
    on_disk = sorted(p.stem for p in (ROOT / "docs").glob("*.md")
                     if p.stem != "index")
    assert sorted(listed + subpages) == on_disk
    assert not set(listed) & set(subpages)
    for sub in subpages:
        parents = [page for page in listed if sub in _hidden_toctree_entries(
            (ROOT / "docs" / f"{page}.md").read_text())]
        assert len(parents) == 1, f"{sub}: in the hidden toctrees of {parents}"
        text = (ROOT / "docs" / f"{sub}.md").read_text()
        parent = (ROOT / "docs" / f"{parents[0]}.md").read_text()
        assert f"{{doc}}`{parents[0]}`" in text, f"{sub}.md: no link back"
        assert f"{{doc}}`{sub}`" in parent, f"{parents[0]}.md: no link to {sub}"
        body = text.split("\n---\n", 1)[1].lstrip("\n")
        assert body.startswith(f"(jax-301-{sub})=\n# "), (
            f"{sub}.md: must start with (jax-301-{sub})= and a # title")


def test_spec_custom_derivatives_page_runs_on_hijax():
    if not (SPEC_PAGE.exists() and RUN_CELLS.exists()):
        pytest.skip(f"spec page check not run: {SHARED}/spec or tools is absent")
    pytest.importorskip("jupytext")
    env = dict(os.environ, MPLBACKEND="Agg")
    proc = subprocess.run(
        [sys.executable, str(RUN_CELLS), str(SPEC_PAGE),
         "--replace", "jax.experimental.hijax=hijax"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"spec page failed on hijax:\n{out[-6000:]}"
    assert re.search(r"^\d+ passed, 0 failed$", proc.stdout, re.M), out[-2000:]


def test_readme_example():
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"^```python\n(.*?)^```", readme, re.S | re.M).group(1)
    assert "from hijax import HiPrim" in code
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    if proc.returncode:
        skip_if_the_chip_is_held(proc.stderr)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["1.0", "nan"], proc.stdout


def test_the_readme_is_short_and_links_what_it_names():
    """The README stays a front door (200 lines at most) whose links resolve:
    the site (pyproject.toml's Documentation URL), the performance page,
    ARCHITECTURE.md, CONTRIBUTING.md and CHANGELOG.md."""
    import tomllib
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200, len(readme.splitlines())
    links = re.findall(r"\]\(([^)#\s]+)\)", readme)
    for link in links:
        if not link.startswith("http"):
            assert (ROOT / link).exists(), f"README links {link}, which is absent"
    for needed in ("docs/performance.md", "ARCHITECTURE.md", "CONTRIBUTING.md",
                   "CHANGELOG.md", "bench/README.md"):
        assert needed in links, f"README does not link {needed}"
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    assert urls["Documentation"] in readme


def test_pages_use_only_public_jax_api():
    """Readers copy the pages' code: no page imports JAX internals."""
    offenders = [
        f"docs/{path.name}:{n}"
        for path in sorted((ROOT / "docs").glob("*.md"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "jax._src" in line]
    assert not offenders, f"pages using jax._src: {offenders}"


def test_notebooks_are_checked_in_a_readers_environment():
    """nbval and the build run the pages with nothing of ours set: a page must
    print the same in a reader's fresh kernel (where, e.g., JAX colours
    jaxprs unless the page turns that off)."""
    nox_src = (ROOT / "noxfile.py").read_text()
    reader_env = re.search(r"^READER_ENV = \{(.*?)^\}", nox_src, re.S | re.M).group(1)
    for var in ("JAX_PPRINT_USE_COLOR", "MPLBACKEND"):
        assert re.search(rf'"{var}": None', reader_env), f"READER_ENV must unset {var}"
    for session in ("docs", "tests", "notebooks"):
        body = re.search(rf"^def {session}\(session\):(.*?)^(?:def|@)", nox_src,
                         re.S | re.M).group(1)
        assert re.search(r"env=(READER_ENV\b|\{\*\*READER_ENV\b)", body), \
            f"nox session {session} must use READER_ENV"


def _page_imports():
    """``{module: [pages]}`` for every top-level module a page's code imports
    (but the modules a page writes itself, with ``%%writefile NAME.py``)."""
    import ast
    jupytext = pytest.importorskip("jupytext")
    found = {}
    for md in sorted((ROOT / "docs").glob("*.md")):
        text = md.read_text(encoding="utf-8")
        if "{code-cell}" not in text:
            continue
        written = set()
        for cell in jupytext.reads(text, fmt="md:myst").cells:
            if cell.cell_type != "code":
                continue
            source = cell.source
            if source.startswith("%%"):  # a cell magic: only a Python file's body is code
                first, _, body = source.partition("\n")
                if not (first.startswith("%%writefile ") and first.endswith(".py")):
                    continue
                written.add(Path(first.split(maxsplit=1)[1].strip()).stem)
                source = body
            try:
                tree = ast.parse(source)
            except SyntaxError:  # IPython magics: leave out their lines
                tree = ast.parse("\n".join(
                    l for l in source.splitlines() if not l.startswith(("%", "!"))))
            for node in ast.walk(tree):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module] if isinstance(node, ast.ImportFrom)
                         and node.level == 0 else [])
                for name in names:
                    found.setdefault(name.split(".")[0], set()).add(md.stem)
        for name in written:  # written by this page (imports may come first)
            found.get(name, set()).discard(md.stem)
    return {name: pages for name, pages in found.items() if pages}


def test_the_notebooks_extra_installs_what_the_pages_import():
    """A reader who installs `.[notebooks]` (README) can run every page."""
    import tomllib
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())[
        "project"]["optional-dependencies"]
    provided = {re.split(r"[<>=!~\[ ]", req, maxsplit=1)[0].replace("-", "_")
                for req in extras["notebooks"]}
    # hijax, JAX and what JAX itself requires; IPython comes with the kernel
    provided |= {"jax", "jaxlib", "numpy", "scipy", "ml_dtypes", "hijax", "IPython"}
    missing = {mod: sorted(pages) for mod, pages in _page_imports().items()
               if mod not in provided and mod not in sys.stdlib_module_names}
    assert not missing, f"pages import modules the notebooks extra lacks: {missing}"


def test_every_public_name_is_on_the_api_page():
    """docs/api.md documents each name in the public modules' ``__all__``
    (an autodoc directive for it); a new export without one is caught here
    rather than by a cross-reference the build cannot resolve."""
    import importlib
    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    missing = {}
    for module in ("hijax", "hijax.testing", "hijax.implicit"):
        names = importlib.import_module(module).__all__
        absent = [n for n in names if not re.search(rf"::\s+{re.escape(n)}\b", api)]
        if absent:
            missing[module] = absent
    assert not missing, missing
