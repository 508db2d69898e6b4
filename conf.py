"""Sphinx configuration for the JAX 301 site.

Build (from the repository root):

    sphinx-build -W -n -b html -c . docs _build/html

or simply ``nox -s docs``. Every page under docs/ is a MyST notebook that
myst-nb executes during the build; a cell that raises (unless tagged
``raises-exception``) fails the build, and so does any warning (``-W``) or
unresolved cross-reference (``nitpicky``). The build needs no network: no
intersphinx, and MathJax is served from a local copy in docs/_static/mathjax.
"""
from pathlib import Path
import re
import shutil
import sys

from sphinx.util import logging

logger = logging.getLogger("jax301")

ROOT = Path(__file__).resolve().parent

project = "JAX 301: advanced autodiff"
author = "the hijax authors"
copyright = "2026, the hijax authors"

# The eight pages of JAX 301, in reading order (../shared/spec/index.rst).
PAGES = [
    "cookbook",
    "vjp-objects",
    "sharding-ad",
    "custom-derivatives",
    "custom-jvp-vjp",
    "refs",
    "remat",
    "hijax-types",
]
# Further pages listed after the eight (index.md lists them too), once they exist.
APPENDIX = ["checking-rules", "api"]

# Labels that pages define and other pages may point at with {ref}, mapped to
# the page that defines them (used only while that page does not exist yet).
PLANNED_LABELS = {f"jax-301-{p}": p for p in PAGES}
PLANNED_LABELS.update({
    "jax-301-bwd-logging": "custom-derivatives",
    "jax-301-structured-residuals": "custom-derivatives",
    "jax-301-derived-rules": "custom-derivatives",
    "jax-301-vjp-bwd-accums": "custom-derivatives",
})

extensions = [
    "myst_nb",
    "sphinx_copybutton",
    "sphinx_book_theme",
    # The API reference (docs/api.md).
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx_hijax_api",  # tools/sphinx_hijax_api.py
]
sys.path.insert(0, str(ROOT / "tools"))

root_doc = "index"
exclude_patterns = ["_build", "**.ipynb_checkpoints", "_static"]
templates_path = []

# Warnings are errors (nox passes -W) and every cross-reference must resolve.
nitpicky = True
# Offline: no intersphinx, no remote images.
suppress_warnings = []
# Type hints in hijax signatures that name JAX internals or the standard
# library cannot be linked without intersphinx; our own names must resolve.
nitpick_ignore_regex = [("py:class", r"jax\._src\..*"), ("py:class", r"collections\.abc\..*")]

# --- API reference ----------------------------------------------------------
# In docstrings, `name` links to the hijax object it names, else is code
# (tools/sphinx_hijax_api.py). MyST pages are unaffected.
default_role = "hijax-obj"
autodoc_member_order = "bysource"
autosummary_generate = False
napoleon_use_ivar = True

# --- MyST / myst-nb -------------------------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
# $$...$$ inside a paragraph (no blank line before it) is display math, as
# in Jupyter's own Markdown rendering, rather than literal dollar signs.
myst_dmath_double_inline = True
myst_heading_anchors = 3

# Execute every page at build time. "cache" re-executes a page only when its
# code, hijax or JAX changed (the cache lives in _build/.jupyter_cache); a
# fresh checkout executes everything. A cell that raises (unless tagged
# raises-exception) fails the build: myst-nb logs the failing cell's traceback
# as a warning, and _fail_on_execution_errors (below) then fails the build
# listing every page that did not execute, with or without -W.
# (nb_execution_raise_on_error would stop at the first failing page, and in a
# parallel -j build the traceback of the failing cell would be lost.)
nb_execution_mode = "cache"


def _code_key():
    """Hash of what page outputs depend on besides the page: hijax and JAX."""
    import hashlib
    from importlib import metadata

    h = hashlib.sha256()
    for dist in ("jax", "jaxlib"):
        try:
            h.update(f"{dist}=={metadata.version(dist)}".encode())
        except metadata.PackageNotFoundError:
            pass
    for path in sorted((ROOT / "hijax").rglob("*.py")):
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


# One cache per version of hijax + JAX. As the path is part of the config,
# changing hijax also makes Sphinx re-read (and so re-execute) every page.
nb_execution_cache_path = str(ROOT / "_build" / ".jupyter_cache" / _code_key())
nb_execution_raise_on_error = False
nb_execution_show_tb = True
nb_execution_timeout = 300
nb_execution_allow_errors = False
nb_merge_streams = True
# Show tracebacks of raises-exception cells with their ANSI colours; the
# default "ipythontb" lexer fails (a warning, so an error) on some messages.
nb_render_error_lexer = "myst-ansi"
# No widget JavaScript from a CDN.
nb_ipywidgets_js = {}

# --- HTML -------------------------------------------------------------------
html_theme = "sphinx_book_theme"
html_title = "JAX 301: advanced autodiff"
html_static_path = ["docs/_static"]
html_theme_options = {
    "use_download_button": True,
    "use_fullscreen_button": True,
    "show_toc_level": 2,
    "home_page_in_toc": True,
}
# The theme's colour mode before a reader picks one. Without it a first visit
# (empty localStorage) logs a console error ("Got invalid theme mode"), which
# the browser test (tests/test_site.py) fails on.
html_context = {"default_mode": "light"}
html_last_updated_fmt = None
html_show_sourcelink = True
html_copy_source = True

# MathJax 3 from a local copy (see tools/vendor_mathjax.sh): a relative
# mathjax_path is resolved against _static.
mathjax_path = "mathjax/tex-chtml-full.js"

copybutton_prompt_text = r">>> |\.\.\. "
copybutton_prompt_is_regexp = True


# --- pages that do not exist yet --------------------------------------------
def _existing_pages(srcdir):
    return [p for p in PAGES + APPENDIX if (Path(srcdir) / f"{p}.md").exists()]


def _drop_missing_from_index(app, docname, source):
    """Leave pages not written yet out of the index page.

    docs/index.md lists all eight pages (its toctree and its overview list)
    and the reference pages in APPENDIX.
    Until a page exists, every line of index.md that names it (a toctree entry
    or a list item with {doc}`page`) is dropped before parsing, so the build
    stays warning-free. Once all eight exist this does nothing.
    """
    if docname != "index":
        return
    missing = [p for p in PAGES + APPENDIX if p not in _existing_pages(app.srcdir)]
    if not missing:
        return
    logger.info("index: leaving out pages not written yet: %s", ", ".join(missing))
    pats = [re.compile(rf"^\s*{re.escape(p)}\s*$|{{doc}}`{re.escape(p)}`") for p in missing]
    lines = source[0].splitlines(keepends=True)
    source[0] = "".join(l for l in lines if not any(pt.search(l) for pt in pats))


def _planned_reference(app, env, node, contnode):
    """Render a reference to a page that is planned but not written yet as text.

    Only for the JAX 301 pages (and APPENDIX) and the labels they define, and only while
    the target page does not exist; any other unresolved reference still warns
    (and so fails the build).
    """
    reftype, target = node.get("reftype"), node.get("reftarget", "")
    page = None
    if reftype == "doc":
        name = target.lstrip("/").removesuffix(".md")
        page = name if name in PAGES + APPENDIX else None
    elif reftype in ("ref", "myst"):
        page = PLANNED_LABELS.get(target.lstrip("#"))
    if page is None or page in _existing_pages(app.srcdir):
        return None
    logger.info("reference to %r left as text: page %r is not written yet", target, page)
    return contnode


def _offer_executed_notebook(app, pagename, templatename, context, doctree):
    """Offer the executed .ipynb of a notebook page in the download menu.

    myst-nb writes _build/jupyter_execute/<page>.ipynb, but when a page's
    outputs come from the jupyter cache (its code did not change) it writes
    that notebook without them (myst-nb 1.4.0), so we merge them in from the
    cache. tests/test_site.py checks that every download has outputs.
    """
    if doctree is None or pagename not in PAGES + APPENDIX:
        return
    executed = Path(app.outdir).parent / "jupyter_execute" / f"{pagename}.ipynb"
    if not executed.exists():
        return
    dest = Path(app.outdir) / "_sources" / f"{pagename}.ipynb"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(executed, dest)
    if app.env.mystnb_config.execution_mode == "cache":
        import nbformat
        from jupyter_cache import get_cache

        nb = nbformat.read(executed, as_version=4)
        try:
            _, nb = get_cache(app.env.mystnb_config.execution_cache_path) \
                .merge_match_into_notebook(nb)
        except KeyError:  # not in the cache: the file is what was executed
            pass
        else:
            nbformat.write(nb, dest)
    context["ipynb_source"] = f"{pagename}.ipynb"


def _create_execution_cache(app):
    """Create the jupyter-cache database before a parallel (-j) read starts.

    Otherwise two worker processes may both find no database and race to
    create it ("no such table: nbcache").
    """
    if app.env.mystnb_config.execution_mode != "cache":
        return
    from jupyter_cache import get_cache

    get_cache(app.env.mystnb_config.execution_cache_path).list_cache_records()


def _fail_on_execution_errors(app, exception):
    """Fail the build if any page did not execute to the end."""
    if exception is not None:
        return
    failed = sorted(
        doc for doc, meta in getattr(app.env, "nb_metadata", {}).items()
        if (meta.get("exec_data") or {}).get("succeeded") is False)
    if failed:
        logger.error(
            "pages failed to execute: %s (the failing cell's traceback is in the "
            "'Executing notebook failed' warning when the page runs; an unchanged "
            "page is not run again, `rm -rf _build` to see it again)", ", ".join(failed))
        app.statuscode = 1


def setup(app):
    app.connect("build-finished", _fail_on_execution_errors)
    app.connect("builder-inited", _create_execution_cache, priority=600)
    app.connect("source-read", _drop_missing_from_index)
    app.connect("missing-reference", _planned_reference)
    app.connect("html-page-context", _offer_executed_notebook, priority=500)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
