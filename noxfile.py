"""Sessions for building the JAX 301 site and testing hijax.

  python3.12 -m nox -s docs                  build the executed site into _build/html
  python3.12 -m nox -s tests tests-jax011    every test (what .ci/run runs, after docs)
  python3.12 -m nox -s notebooks             regenerate + execute notebooks/*.ipynb
  python3.12 -m nox -s lab                   JupyterLab on notebooks/ with hijax installed

Versions are pinned here and only here; pyproject.toml keeps ranges.
"""
import os
import shutil
import tempfile
from pathlib import Path

import nox

PYTHON = "3.12"
# The JAX versions we test against. pyproject.toml says jax>=0.11.2,<0.13.
JAX = "0.12.0.1"  # main: docs, notebooks, tests
JAX_OLD = "0.11.2"  # oldest supported: tests-jax011
# Tools whose releases can change the build (new warnings, different notebook
# parsing); pinned so a new release cannot break CI overnight.
TOOL_PINS = [
    "sphinx==9.1.1",
    "myst-nb==1.4.0",
    "myst-parser==5.2.0",
    "sphinx-book-theme==1.4.0",
    "pydata-sphinx-theme==0.20.0",
    "sphinx-copybutton==0.5.2",
    "jupytext==1.19.6",
    "nbval==0.11.0",
    "nbclient==0.11.0",
    "playwright==1.65.2",
]

ROOT = Path(__file__).resolve().parent
BUILD = "_build"
# Environment for the Jupyter kernels that run the pages (myst-nb, nbclient,
# nbval, JupyterLab): figures drawn inline whatever the caller's environment
# says, so stored outputs always hold the figure; and jaxprs printed without
# ANSI colours (JAX colours them inside Jupyter), so outputs and asserts on
# str(jaxpr) are the same in a kernel as in plain Python.
KERNEL_ENV = {
    "MPLBACKEND": "module://matplotlib_inline.backend_inline",
    "JAX_PPRINT_USE_COLOR": "false",
    # The system temp dir rather than nox's per-session one, so file names in
    # outputs (ipykernel's cell files) don't carry .nox/<session> paths.
    "TMPDIR": tempfile.gettempdir(),
}
NBVAL_ARGS = [
    "--nbval",
    "--nbval-current-env",
    "--nbval-sanitize-with", "tools/nbval_sanitize.cfg",
    "--nbval-cell-timeout", "300",
]

nox.options.sessions = ["docs", "tests", "tests-jax011"]
nox.options.error_on_missing_interpreters = True


def _install(session, extra, jax_version):
    """Install hijax (editable) with an extra, the given JAX, and TOOL_PINS as constraints."""
    constraints = Path(session.create_tmp()) / "constraints.txt"
    constraints.write_text("\n".join(TOOL_PINS) + "\n")
    session.install("-e", f".[{extra}]", f"jax=={jax_version}", "-c", str(constraints))
    # First imports can print one-off messages (e.g. matplotlib building its
    # font cache on a new machine); get them out of the way before any page
    # runs, so they never land in a cell's output.
    session.run("python", "-c", "import matplotlib.pyplot, jax.numpy as jnp; jnp.zeros(1)",
                silent=True)


@nox.session(python=PYTHON)
def docs(session):
    """Build the site, executing every page: _build/html/index.html.

    Extra arguments go to sphinx-build (e.g. `-E` to rebuild everything).
    Page outputs are cached in _build/.jupyter_cache; a page is re-executed
    when its code changes.
    """
    _install(session, "docs", JAX)
    session.run(
        "sphinx-build", "-W", "--keep-going", "-n", "-b", "html", "-c", ".",
        "-j", "auto", "docs", f"{BUILD}/html", *session.posargs, env=KERNEL_ENV)
    session.run("python", "tools/check_offline_html.py", f"{BUILD}/html")
    session.log(f"open {ROOT / BUILD / 'html' / 'index.html'}")


@nox.session(python=PYTHON)
def notebooks(session):
    """Regenerate notebooks/*.ipynb from docs/*.md and execute them.

    Give page names to redo only those: `nox -s notebooks -- refs remat`.
    """
    _install(session, "tests", JAX)
    session.run("python", "tools/notebooks.py", "build", "-j", "2", *session.posargs,
                env=KERNEL_ENV)
    session.run("python", "tools/notebooks.py", "check")


@nox.session(python=PYTHON)
def tests(session):
    """Unit tests, the notebook sync and spec-page checks, nbval on notebooks/,
    and the browser test of the site that `nox -s docs` built (tests/test_site.py).
    """
    _install(session, "tests,site", JAX)
    env = dict(KERNEL_ENV)
    if _ensure_chromium(session) and os.environ.get("CI"):
        # In CI the browser test must run: a missing piece fails it.
        env["HIJAX_SITE_TEST"] = "required"
    paths = ["tests"]
    if any(Path("notebooks").glob("*.ipynb")):
        paths.append("notebooks")
    session.run("pytest", *paths, *NBVAL_ARGS, *session.posargs, env=env)


def _ensure_chromium(session):
    """Debian's Chromium for the browser test, installed with apt-get if missing.

    Playwright drives the system binary; it never downloads a browser. Without
    root or apt-get the browser test is skipped (it says why).
    """
    if shutil.which("chromium"):
        return True
    if not shutil.which("apt-get") or os.geteuid() != 0:
        session.warn("no `chromium` and not root with apt-get: the browser test "
                     "(tests/test_site.py) will be skipped")
        return False
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    session.run("apt-get", "update", "-q", external=True, env=env)
    session.run("apt-get", "install", "-y", "-q", "chromium", external=True, env=env)
    return True


@nox.session(name="tests-jax011", python=PYTHON)
def tests_jax011(session):
    """Unit tests and the spec-page check on the oldest supported JAX (no nbval)."""
    _install(session, "tests", JAX_OLD)
    session.run("python", "-c", "import jax; print('jax', jax.__version__)")
    session.run("pytest", "tests", *session.posargs)


@nox.session(python=PYTHON)
def lab(session):
    """Open JupyterLab on notebooks/ with hijax installed (editable)."""
    _install(session, "tests", JAX)
    session.install("jupyterlab")
    session.run("jupyter", "lab", "--notebook-dir", "notebooks", *session.posargs,
                env=KERNEL_ENV)
