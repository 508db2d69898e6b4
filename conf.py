"""Sphinx configuration for the JAX 301 site: settings only.

Build from the repository root (``nox -s docs`` does the same, in a virtual
environment with pinned tools):

    sphinx-build -W -n -b html -c . docs _build/html

Every page under docs/ is a MyST notebook. Its outputs come from the executed
notebook notebooks/<page>.ipynb, the one the tests compare with a fresh run
(nbval); a page edited since its notebook was made is executed by the build
instead (tools/sphinx_jax301.py). A cell that raises, unless tagged
``raises-exception``, fails the build, and so does any warning (``-W``) or
unresolved cross-reference (``-n``). Nothing is fetched from the network.
"""
from pathlib import Path
import sys

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tools"))  # our Sphinx extensions

import sphinx_jax301  # noqa: E402

project = "JAX 301: advanced autodiff and extending JAX"
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
# The pages after the eight, in the same toctree of docs/index.md.
APPENDIX = ["checking-rules", "implicit", "pytest-plugin"]
# "Beyond 301": the questions people ask, in a second toctree of docs/index.md.
BEYOND = ["nan-gradients", "integer-inputs", "custom-batching",
          "spectral-gradients", "ode-gradients", "taylor-mode",
          "sparse-jacobians", "porting-custom-vjp", "accelerators"]
# The API reference, last (a third toctree), so that "Next" leads from one
# page to the next and not into the long reference halfway.
# tests/test_docs.py checks that docs/index.md lists all of these in order.
REFERENCE = ["portability", "performance", "api"]
# Pages that continue one of the above: each is in a hidden toctree at the end
# of the page it continues, not in docs/index.md (tests/test_docs.py checks).
SUBPAGES = ["custom-derivatives-advanced"]

extensions = [
    "myst_nb",
    "sphinx_copybutton",
    "sphinx_book_theme",
    # The API reference (docs/api.md).
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx_hijax_api",  # tools/: docstring links for the API page
    "sphinx_jax301",  # tools/: pages render the tested notebooks
    "sphinx_offline_search",  # tools/: search excerpts from a site on disk
]

root_doc = "index"
exclude_patterns = ["_build", "**.ipynb_checkpoints", "_static"]
templates_path = []

# Every cross-reference must resolve (with -W, a broken one fails the build).
nitpicky = True
# hijax signatures name JAX's types (public ones such as jax.Array, and
# internals) and the standard library, which cannot be
# linked without intersphinx (offline); our own names must all resolve.
# dataclasses.InitVar: a deprecated init-only argument (CG and GMRES maxiter);
# Python's inventory does not list it. A type variable (surrogate's T) has no
# page of its own.
nitpick_ignore_regex = [("py:class", r"jax\..*"), ("py:class", r"collections\.abc\..*"),
                        ("py:class", r"dataclasses\.InitVar"),
                        ("py:class", r"hijax\..*\._\w+\.T")]

# --- API reference ------------------------------------------------------------
# In docstrings, `name` links to the hijax object it names, else is code.
default_role = "hijax-obj"
# Members in the order the source defines them, which is the reading order.
autodoc_member_order = "bysource"
# docs/api.md lists what it documents by hand.
autosummary_generate = False
# Google-style "Attributes:" as one entry per attribute.
napoleon_use_ivar = True

# --- MyST / myst-nb -------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
# $$...$$ inside a paragraph is display math, as in Jupyter's own Markdown.
myst_dmath_double_inline = True
# Section anchors for links such as {doc}`page#section`.
myst_heading_anchors = 3

# Outputs come from the cache, which sphinx_jax301 fills with the committed
# notebooks; a page that misses (edited since) is executed and cached.
nb_execution_mode = "cache"
# One cache per hijax + JAX: changing either re-reads every page.
nb_execution_cache_path = sphinx_jax301.execution_cache_path(ROOT)
# A failing page is listed at the end (sphinx_jax301.fail_on_execution_errors)
# rather than stopping the build at the first, whose traceback -j would lose.
nb_execution_raise_on_error = False
nb_execution_show_tb = True
nb_execution_timeout = 300
nb_execution_allow_errors = False
nb_merge_streams = True
# Tracebacks of raises-exception cells with their ANSI colours; the default
# "ipythontb" lexer fails (a warning, so an error) on some messages.
nb_render_error_lexer = "myst-ansi"
# No widget JavaScript from a CDN.
nb_ipywidgets_js = {}

# --- HTML ---------------------------------------------------------------------
html_theme = "sphinx_book_theme"
html_title = "JAX 301: advanced autodiff and extending JAX"
html_static_path = ["docs/_static"]
# The layout at laptop and phone widths, one search box, words that wrap as
# words (jax301.css); the theme's sidebar buttons made to work on phones,
# names in code that break at their dots, downloads that save (jax301.js).
# tests/test_site.py checks each in Chromium at 1280 and 390 px.
html_css_files = ["jax301.css"]
html_js_files = ["jax301.js"]
html_theme_options = {
    "use_download_button": True,
    "use_fullscreen_button": True,
    "show_toc_level": 2,
    "home_page_in_toc": True,
}
# Light or dark as the reader's system is set, until they pick one with the
# theme's button. (Some default is needed: without one a first visit logs a
# console error, "Got invalid theme mode", which the browser test fails on.)
# In dark mode the theme sets figures and rich outputs on a light ground, so
# plots stay readable; tests/test_site.py checks the pages in both modes.
html_context = {"default_mode": "auto"}
html_last_updated_fmt = None
html_show_sourcelink = True
html_copy_source = True

# MathJax 3 from the local copy in docs/_static (relative to _static).
mathjax_path = "mathjax/tex-chtml-full.js"

# Copy buttons leave out doctest prompts.
copybutton_prompt_text = r">>> |\.\.\. "
copybutton_prompt_is_regexp = True
