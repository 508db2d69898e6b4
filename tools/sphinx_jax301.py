"""Sphinx glue for the JAX 301 site: pages render the notebooks the tests executed.

Every page under docs/ is a MyST notebook, and notebooks/<page>.ipynb is the same
page executed (``nox -s notebooks``), committed, and compared output by output
with a fresh execution by nbval in the tests. The build does not execute a page
a second time; it shows those outputs:

* ``prime_execution_cache`` (builder-inited): each committed notebook goes into
  myst-nb's jupyter cache, keyed (by jupyter-cache) on its code cells and their
  tags, as the page has them (without the marks of hidden cells that the
  notebook carries, tools/notebook_marks.py). A page whose code is unchanged finds it there and is rendered with the
  stored outputs; a page edited since its notebook was made misses, and myst-nb
  executes it as usual (so a plain ``sphinx-build`` always works, and the
  author sees the new outputs at once). The tests fail on such a stale
  notebook (tests/test_docs.py), so CI never publishes a page it did not test.
* ``use_notebook`` (source-read): a page is read again when its notebook
  changes, as when its source does; a page whose notebook is out of date is
  reported (a warning, so an error under -W, when ``jax301_require_notebooks``
  is set, as the docs session does in CI: the site then shows only outputs
  that the tests compared).
* ``offer_executed_notebook`` (html-page-context): the download menu offers the
  executed notebook, its hidden cells marked as in notebooks/.
* ``fail_on_execution_errors`` (build-finished): a page that did not execute to
  the end fails the build, listing every such page.
* ``sources_for_disk`` (build-finished): each download (``_sources/<page>.ipynb``
  and ``.md``) also as a script, ``<file>.js``, with which docs/_static/jax301.js
  saves the file when the site is opened from disk (file://), where a browser
  neither fetches a file nor honours a link's ``download`` attribute.
"""
from __future__ import annotations

import hashlib
from importlib import metadata
from pathlib import Path

from sphinx.util import logging

import notebook_marks  # tools/, on sys.path (conf.py)

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


def execution_cache_path(root: Path) -> str:
  """The jupyter cache for this version of hijax and JAX (conf.py's nb_execution_cache_path).

  The path is part of the configuration, so changing hijax or JAX also makes
  Sphinx read every page again, and a page the build executes itself is never
  served from a cache made with other code. The committed notebooks are put
  into it as they are: whether their outputs still hold for this hijax and
  JAX is what nbval checks, in the tests.
  """
  h = hashlib.sha256()
  for dist in ("jax", "jaxlib"):
    try:
      h.update(f"{dist}=={metadata.version(dist)}".encode())
    except metadata.PackageNotFoundError:
      pass
  for path in sorted((root / "hijax").rglob("*.py")):
    h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
  return str(root / "_build" / ".jupyter_cache" / h.hexdigest()[:16])


def _cache(app):
  from jupyter_cache import get_cache
  return get_cache(app.env.mystnb_config.execution_cache_path)


def prime_execution_cache(app):
  """Put every committed executed notebook into the execution cache.

  Runs before a parallel (-j) read starts, which also creates the cache's
  database in one process (two workers creating it at once race: "no such
  table: nbcache").
  """
  if app.env.mystnb_config.execution_mode != "cache":
    return
  import nbformat
  from jupyter_cache.base import CacheBundleIn

  cache = _cache(app)
  for path in sorted(NOTEBOOKS.glob("*.ipynb")):
    # Without the marks of hidden cells: the cache is keyed on the page's code.
    nb = notebook_marks.unmark(nbformat.read(path, as_version=4))
    cache.cache_notebook_bundle(CacheBundleIn(nb, str(path)), check_validity=False,
                                overwrite=True)
  cache.list_cache_records()


def use_notebook(app, docname, source):
  """Read a page again when its notebook changes; report a page whose notebook is stale."""
  from myst_nb.core.read import is_myst_markdown_notebook, read_myst_markdown_notebook
  from myst_parser.config.main import MdParserConfig

  if not is_myst_markdown_notebook(source[0]):
    return
  path = NOTEBOOKS / f"{docname}.ipynb"
  if path.exists():
    app.env.note_dependency(str(path))
    import nbformat

    page = read_myst_markdown_notebook(source[0], MdParserConfig())
    notebook = notebook_marks.unmark(nbformat.read(path, as_version=4))
    cache = _cache(app)
    if cache.create_hashed_notebook(page)[1] == cache.create_hashed_notebook(notebook)[1]:
      return
  report = logger.warning if app.config.jax301_require_notebooks else logger.info
  report(f"notebooks/{docname}.ipynb is missing or older than the page, so the build "
         f"executes the page itself: run `nox -s notebooks -- {docname}` and commit "
         "the notebook", location=docname)


def offer_executed_notebook(app, pagename, templatename, context, doctree):
  """Offer the executed .ipynb of a notebook page in the download menu.

  myst-nb writes _build/jupyter_execute/<page>.ipynb, but when the outputs come
  from the cache it writes the notebook without them (myst-nb 1.4.0), so they
  are merged in from the cache. tests/test_site.py checks that every download
  has outputs.
  """
  if doctree is None:
    return
  executed = Path(app.outdir).parent / "jupyter_execute" / f"{pagename}.ipynb"
  if not executed.exists():
    return
  import nbformat

  dest = Path(app.outdir) / "_sources" / f"{pagename}.ipynb"
  dest.parent.mkdir(parents=True, exist_ok=True)
  nb = nbformat.read(executed, as_version=4)
  if app.env.mystnb_config.execution_mode == "cache":
    try:
      _, nb = _cache(app).merge_match_into_notebook(nb)
    except KeyError:  # not in the cache: the file is what was executed
      pass
  nbformat.write(notebook_marks.mark(nb), dest)
  context["ipynb_source"] = f"{pagename}.ipynb"


def fail_on_execution_errors(app, exception):
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


def sources_for_disk(app, exception):
  """Write ``_sources/<file>.js`` beside each downloadable page source (see the docstring)."""
  if exception is not None:
    return
  import json

  sources = Path(app.outdir) / "_sources"
  for path in sorted(sources.glob("*")):
    if path.suffix not in (".ipynb", ".md"):
      continue
    text = path.read_text(encoding="utf-8")
    call = f"jax301SaveSource({json.dumps(path.name)}, {json.dumps(text)});\n"
    path.with_name(path.name + ".js").write_text(call, encoding="utf-8")


def setup(app):
  """Register the hooks (see the module docstring)."""
  # Before reading: the cache holds the committed notebooks (after myst-nb's
  # own builder-inited handlers, which set up its configuration).
  app.connect("builder-inited", prime_execution_cache, priority=600)
  # While reading: a page depends on its notebook.
  app.connect("source-read", use_notebook)
  # Whether a page without an up-to-date notebook is an error (docs session in CI).
  app.add_config_value("jax301_require_notebooks", False, "env", bool)
  # While writing: the executed notebook in the download menu (after
  # sphinx-book-theme has filled in the page context).
  app.connect("html-page-context", offer_executed_notebook, priority=500)
  # At the end: pages that did not execute fail the build.
  app.connect("build-finished", fail_on_execution_errors)
  # The downloads, also as scripts, for a site opened from disk.
  app.connect("build-finished", sources_for_disk)
  return {"parallel_read_safe": True, "parallel_write_safe": True}
