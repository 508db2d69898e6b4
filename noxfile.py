"""Sessions for building the JAX 301 site and testing hijax.

  python3.12 -m nox -s ci                    everything CI checks, in two lanes at once
  python3.12 -m nox -s docs                  build the site into _build/html
  python3.12 -m nox -s tests tests-jax011    unit tests and nbval; unit tests on the oldest JAX
  python3.12 -m nox -s site                  the browser test of the site docs built
  python3.12 -m nox -s package typecheck     wheel and sdist installed and tested; types
  python3.12 -m nox -s notebooks             regenerate + execute notebooks/*.ipynb
  python3.12 -m nox -s fuzz                  the property tests, with many more examples
  python3.12 -m nox -s mutants               mutation testing of hijax/ (tools/mutants.py)
  python3.12 -m nox -s lab                   JupyterLab on notebooks/ with hijax installed

Versions are pinned here and only here; pyproject.toml keeps ranges.

Where the time goes (2 cores): environments are made by uv and kept between
runs; each page is executed once per run, by nbval in `tests` (the site renders
those same committed notebooks, see tools/sphinx_jax301.py); pytest runs on two
workers; most of the tests' CPU time is XLA compiling, and JAX's persistent
compilation cache, kept between runs (_cache_root below), loads what an
earlier run compiled; `ci` runs the sessions in two lanes at once. A test
session whose inputs (every file in the checkout, ../shared, the pins) are
unchanged since its last successful run says so and is skipped; HIJAX_FORCE=1
runs it anyway (.ci/run sets it).
"""
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import nox

# Containers often set PYTHONDONTWRITEBYTECODE (this project's machines do);
# then every process of a run, each notebook kernel, test worker and
# subprocess, compiles the sources of JAX, NumPy and matplotlib again: about
# 5 s of CPU before a page's first line runs. The environments under .nox/
# are ours, so Python may cache bytecode in them (and in the checkout's
# ignored __pycache__ folders), as it does by default on a reader's machine.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

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
    "pytest-xdist==3.8.0",
    "basedpyright==1.40.2",
    "mypy==2.4.1",
    # The libraries the implicit page runs in its comparison (its hidden
    # cells assert what each does with this JAX).
    "optimistix==0.1.0",
    "lineax==0.1.1",
    "equinox==0.13.8",
    "jaxopt==0.8.5",
]

ROOT = Path(__file__).resolve().parent
BUILD = "_build"
STAMPS = ROOT / ".nox" / ".passed"
# The environment of the Jupyter kernels that run the pages (nbval, the build,
# `notebooks`, JupyterLab): a reader's, with nothing of ours set. Variables that
# would change what a page prints are removed even if the caller has them; the
# temp dir is the system's, not nox's per-session one, as a reader's would be.
READER_ENV = {
    "JAX_PPRINT_USE_COLOR": None,
    "MPLBACKEND": None,
    "XLA_FLAGS": None,
    "TMPDIR": tempfile.gettempdir(),
}
NBVAL_ARGS = [
    "--nbval",
    "--nbval-current-env",
    "--nbval-sanitize-with", "tools/nbval_sanitize.cfg",
    "--nbval-cell-timeout", "300",
]
# Two workers; a notebook's cells stay together on one worker (one kernel).
XDIST_ARGS = ["-n", "2", "--dist", "loadfile"]

# Caches kept between runs, outside the checkout (like uv's cache of wheels),
# under HIJAX_CACHE (default ~/.cache/hijax; HIJAX_CACHE=off keeps none):
# - JAX's persistent compilation cache for the test sessions, one folder per
#   JAX version: most of the tests' CPU time is XLA compiling programs that an
#   earlier run compiled already. A hit skips only XLA's compilation of an
#   identical program (keyed by the program, the JAX and jaxlib versions and
#   the compile options); tracing, lowering, every rule, check and execution
#   run as without it. Without it each test process keeps a private one
#   (tests/conftest.py).
# - mypy's incremental cache (`typecheck`), which checks each cached module
#   against its source and mypy's version.
COMPILE_CACHE_MAX_BYTES = 2 << 30  # pruned to half, oldest entries first, past this

# Run one after another by a plain `nox`; `nox -s ci` runs the same in two lanes.
nox.options.sessions = ["docs", "tests", "site", "tests-jax011", "package", "typecheck"]
nox.options.error_on_missing_interpreters = True
# uv makes and fills an environment in seconds; plain venv + pip where it is missing.
nox.options.default_venv_backend = "uv|virtualenv"
# Keep environments between runs (the installs below still run, and are no-ops
# when nothing changed).
nox.options.reuse_venv = "yes"


def _cache_root():
  """Where the kept caches go, or None with HIJAX_CACHE=off."""
  setting = os.environ.get("HIJAX_CACHE", "")
  if setting == "off":
    return None
  if setting:
    return Path(setting)
  return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"), "hijax")


def _compile_cache_env(session, jax_version):
  """The variables that point JAX at the kept compilation cache for
  ``jax_version`` (pruned first), or {} with HIJAX_CACHE=off."""
  root = _cache_root()
  if root is None:
    session.log("compilation cache: none kept (HIJAX_CACHE=off)")
    return {}
  path = root / "jax-compilation-cache" / f"jax-{jax_version}"
  path.mkdir(parents=True, exist_ok=True)
  entries = []  # (modified, bytes, file), oldest first
  for f in path.iterdir():
    if f.is_file():
      stat = f.stat()
      entries.append((stat.st_mtime, stat.st_size, f))
  entries.sort()
  total = sum(size for _, size, _ in entries)
  if total > COMPILE_CACHE_MAX_BYTES:
    while entries and total > COMPILE_CACHE_MAX_BYTES // 2:
      _, size, f = entries.pop(0)
      f.unlink(missing_ok=True)
      total -= size
  count = sum(1 for _, _, f in entries if f.name.endswith("-cache"))
  session.log(f"compilation cache: {path}, {count} programs, {total / 1e6:.0f} MB "
              "(HIJAX_CACHE=off runs without it)")
  return {"JAX_COMPILATION_CACHE_DIR": str(path),
          "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
          "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def _install(session, extra, jax_version, pages=True):
  """Install hijax (editable) with an extra, the given JAX, and TOOL_PINS as constraints.

  ``pages``: the environment runs pages, so their first imports run once here.
  """
  constraints = Path(session.create_tmp()) / "constraints.txt"
  constraints.write_text("\n".join(TOOL_PINS) + "\n")
  session.install("-e", f".[{extra}]", f"jax=={jax_version}", "-c", str(constraints))
  if pages:
    # First imports can print one-off messages (e.g. matplotlib building its
    # font cache on a new machine); get them out of the way before any page
    # runs, so they never land in a cell's output.
    session.run("python", "-c", "import matplotlib.pyplot, jax.numpy as jnp; jnp.zeros(1)",
                silent=True)


def _timed(fn):
  """Log a session's wall time (.ci/run collects these lines into a table)."""
  @functools.wraps(fn)
  def run(session):
    t0 = time.perf_counter()
    try:
      fn(session)
    finally:
      session.log(f"session time: {session.name} {time.perf_counter() - t0:.0f} s")
  return run


def _inputs_key(session, jax_version):
  """A hash of everything a test session's result depends on, or None outside git."""
  try:
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
  except (OSError, subprocess.CalledProcessError):
    return None
  h = hashlib.sha256(f"{session.name} {jax_version} {TOOL_PINS}".encode())
  paths = [ROOT / f.decode() for f in files if f]
  shared = ROOT.parent / "shared"
  if shared.is_dir():
    paths += [p for p in shared.rglob("*") if p.is_file()]
  for path in sorted(paths):
    if path.is_file():
      h.update(str(path).encode() + b"\0" + path.read_bytes())
  return h.hexdigest()


def _unchanged_since_last_pass(session, jax_version):
  """True (and says so) if the session passed before with exactly these inputs.

  Returns also the key to record once the session passes this time.
  """
  if session.posargs:  # a narrowed run neither uses nor records a pass
    return False, None
  key = _inputs_key(session, jax_version)
  stamp = STAMPS / session.name
  if (key and not os.environ.get("HIJAX_FORCE")
      and stamp.exists() and stamp.read_text() == key):
    session.log(f"{session.name}: nothing changed since its last successful run "
                "(same files, ../shared and pins): skipped. HIJAX_FORCE=1 runs it anyway.")
    return True, key
  return False, key


def _record_pass(session, key):
  if key:
    STAMPS.mkdir(parents=True, exist_ok=True)
    (STAMPS / session.name).write_text(key)


@nox.session(python=PYTHON)
@_timed
def docs(session):
  """Build the site: _build/html/index.html.

  Pages render the committed, executed notebooks; a page edited since its
  notebook was made is executed by the build. Extra arguments go to
  sphinx-build (e.g. `-E` to read every page again).
  """
  _install(session, "docs", JAX)
  # In CI every page must render its committed, tested notebook.
  strict = ["-D", "jax301_require_notebooks=1"] if os.environ.get("CI") else []
  session.run(
      "sphinx-build", "-W", "--keep-going", "-n", "-b", "html", "-c", ".",
      "-j", "auto", *strict, "docs", f"{BUILD}/html", *session.posargs, env=READER_ENV)
  session.run("python", "tools/check_offline_html.py", f"{BUILD}/html")
  session.log(f"open {ROOT / BUILD / 'html' / 'index.html'}")


@nox.session(python=PYTHON)
@_timed
def notebooks(session):
  """Regenerate notebooks/*.ipynb from docs/*.md and execute them.

  Give page names to redo only those: `nox -s notebooks -- refs remat`.
  """
  _install(session, "tests", JAX)
  session.run("python", "tools/notebooks.py", "build", "-j", "2", *session.posargs,
              env=READER_ENV)
  session.run("python", "tools/notebooks.py", "check")


def notebooks_alone(notebooks, folder):
  """Copy each notebook into an empty folder of its own under ``folder``, as a
  reader who downloads one page has it (nbval starts a notebook's kernel in
  the notebook's folder), and notebooks/conftest.py (nbval's settings, which
  no kernel sees) into ``folder``. Returns the copies' paths."""
  folder = Path(folder)
  shutil.copy(Path(notebooks) / "conftest.py", folder / "conftest.py")
  copies = []
  for notebook in sorted(Path(notebooks).glob("*.ipynb")):
    (folder / notebook.stem).mkdir()
    copies.append(str(shutil.copy(notebook, folder / notebook.stem / notebook.name)))
  return copies


@nox.session(python=PYTHON)
@_timed
def tests(session):
  """Unit tests, the notebook sync and spec-page checks, and nbval on
  notebooks/ (each page executed once, copied alone into an empty folder
  outside the checkout, in a fresh kernel with a reader's environment and
  the kept compilation cache). The browser test is `site`.
  """
  skip, key = _unchanged_since_last_pass(session, JAX)
  if skip:
    return
  _install(session, "tests", JAX)
  alone = tempfile.mkdtemp(prefix="hijax-notebooks-alone-")
  try:
    notebooks_alone("notebooks", alone)
    # the folder, not each copy: a file named on the command line outside the
    # checkout gets the test ids "::Cell N", the same in every notebook, and
    # xdist runs one item per id; under the folder they are "PAGE/PAGE.ipynb::Cell N"
    paths = ["tests", alone]
    session.run("pytest", *XDIST_ARGS, *paths, "--ignore", "tests/test_site.py",
                "-c", "pyproject.toml", *NBVAL_ARGS, *session.posargs,
                env={**READER_ENV, **_compile_cache_env(session, JAX)})
  finally:
    shutil.rmtree(alone, ignore_errors=True)
  _record_pass(session, key)


@nox.session(python=PYTHON)
@_timed
def site(session):
  """The browser test (tests/test_site.py) of the site that `nox -s docs`
  built, in Debian's Chromium (installed with apt-get when missing and run as
  root; in CI a missing piece fails the test, elsewhere it is skipped).
  """
  skip, key = _unchanged_since_last_pass(session, JAX)
  if skip:
    return
  _install(session, "site", JAX, pages=False)
  have_chromium = _finish_chromium_install(session, _start_chromium_install(session))
  env = dict(READER_ENV)
  if have_chromium and os.environ.get("CI"):
    # In CI the browser test must run: a missing piece fails it.
    env["HIJAX_SITE_TEST"] = "required"
  session.run("pytest", "tests/test_site.py", *session.posargs, env=env)
  if have_chromium:  # a pass without the browser test is not remembered
    _record_pass(session, key)


def _start_chromium_install(session):
  """Start installing Debian's Chromium for the browser test, if it is missing.

  Playwright drives the system binary; it never downloads a browser. Returns
  the running apt-get process, True if Chromium is there already, or False
  where it cannot be installed (not root, no apt-get): the browser test is
  then skipped, and says why.
  """
  if shutil.which("chromium"):
    return True
  if not shutil.which("apt-get") or os.geteuid() != 0:
    session.warn("no `chromium` and not root with apt-get: the browser test "
                 "(tests/test_site.py) will be skipped")
    return False
  log = Path(tempfile.mkdtemp(prefix="hijax-apt-")) / "apt-chromium.log"
  session.log(f"installing chromium with apt-get in the background (log: {log})")
  script = "apt-get update -q && apt-get install -y -q chromium"
  with open(log, "w") as out:
    proc = subprocess.Popen(["sh", "-c", script], stdout=out, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL,
                            env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
  proc.log = log
  return proc


def _finish_chromium_install(session, chromium):
  """Wait for the install started by _start_chromium_install; True if Chromium is there."""
  if isinstance(chromium, bool):
    return chromium
  if chromium.wait() != 0:
    session.error(f"apt-get install chromium failed (exit {chromium.returncode}): "
                  f"{chromium.log.read_text()[-2000:]}")
  return True


# `nox -s ci`: what .ci/run runs. The unit tests and nbval (lane A) and the
# other sessions (lane B) run at once, each lane keeping a core busy (the
# pytest runs have two workers each; installs and Chromium's download wait on
# the network). The browser test needs the site `docs` builds (lane B's
# first session), and is mostly waiting on Chromium: it runs beside the
# lanes as soon as `docs` has ended, instead of after the unit tests.
CI_LANES = {"A": ["tests"], "B": ["docs", "tests-jax011", "package", "typecheck"]}
CI_AFTER_DOCS = "site"


@nox.session(python=False)
def ci(session):
  """Every check CI runs: CI_LANES at once, and CI_AFTER_DOCS as soon as
  `docs` has built the site.

  Lane A prints as it goes; the browser test's and lane B's output follow
  when they end. Chromium, if missing, installs in the background
  meanwhile. Fails if any session did.
  """
  chromium = _start_chromium_install(session)
  logs = Path(tempfile.mkdtemp(prefix="hijax-ci-"))
  lane_b_log, site_log = logs / "lane-B.log", logs / "site.log"
  docs, *rest_of_b = CI_LANES["B"]
  site = CI_AFTER_DOCS
  failed = []

  def nox_run(names, **kw):
    """`nox -s NAMES` in the checkout; True if every session passed."""
    return subprocess.run([sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"),
                           "-s", *names], cwd=ROOT, stdin=subprocess.DEVNULL,
                          check=False, **kw).returncode == 0

  def browser_test():
    with open(site_log, "w") as out:
      try:
        if not _finish_chromium_install(session, chromium):
          out.write("no Chromium: the browser test is skipped\n")
      except Exception as e:  # apt-get failed (session.error)
        failed.append(f"{site} (not run: {e})")
        return
      if not nox_run([site], stdout=out, stderr=subprocess.STDOUT):
        failed.append(site)

  def lane_b():
    with open(lane_b_log, "w") as out:
      site_thread = None
      if nox_run([docs], stdout=out, stderr=subprocess.STDOUT):
        site_thread = threading.Thread(target=browser_test)
        site_thread.start()
      else:
        failed.append(docs)
        failed.append(f"{site} (not run: {docs} failed, so there is no site to test)")
      if not nox_run(rest_of_b, stdout=out, stderr=subprocess.STDOUT):
        failed.append(f"{' '.join(rest_of_b)} (lane B's log above says which)")
      if site_thread:
        site_thread.join()

  lane_b_thread = threading.Thread(target=lane_b)
  lane_b_thread.start()
  if not nox_run(CI_LANES["A"]):
    failed.append(" ".join(CI_LANES["A"]))
  lane_b_thread.join()
  if site_log.exists():
    print(f"\n----- {site} -----", flush=True)
    print(site_log.read_text(), flush=True)
  print(f"\n----- lane B ({', '.join(CI_LANES['B'])}) -----", flush=True)
  print(lane_b_log.read_text(), flush=True)
  if failed:
    session.error("failed: " + "; ".join(failed))


@nox.session(name="tests-jax011", python=PYTHON)
@_timed
def tests_jax011(session):
  """Unit tests and the spec-page check on the oldest supported JAX (no nbval,
  no checks of our own pages: those run on the pinned JAX)."""
  skip, key = _unchanged_since_last_pass(session, JAX_OLD)
  if skip:
    return
  # No page runs here; pytest's header names the JAX it runs (tests/conftest.py).
  _install(session, "tests", JAX_OLD, pages=False)
  # The pages' checks (marker `pages`) run in `tests`: the pages and their
  # notebooks are built and executed on the pinned JAX only.
  session.run("pytest", *XDIST_ARGS, "tests", "--ignore", "tests/test_site.py",
              "-m", "not pages", *session.posargs,
              env=_compile_cache_env(session, JAX_OLD))
  _record_pass(session, key)


@nox.session(python=PYTHON)
@_timed
def fuzz(session):
  """The property tests with many more examples (HIJAX_PROPERTY_EXAMPLES, default 2000)."""
  _install(session, "tests", JAX)
  env = {"HIJAX_PROPERTY_EXAMPLES": os.environ.get("HIJAX_PROPERTY_EXAMPLES", "2000")}
  session.run("pytest", "-n", "2", "tests/test_properties.py", *session.posargs, env=env)


@nox.session(python=PYTHON)
@_timed
def mutants(session):
  """Mutation testing (tools/mutants.py): one-token changes to hijax/ that no test catches.

  Not in the default sessions. Extra arguments go to the script, e.g.
  `nox -s mutants -- _checks batching --sample 30`.
  """
  _install(session, "tests", JAX)
  session.run("python", "tools/mutants.py", *session.posargs,
              env={"PYTHONPATH": None})


@nox.session(python=PYTHON)
def lab(session):
  """Open JupyterLab on notebooks/ with hijax installed (editable): the
  `notebooks` extra, which the README gives readers for the same."""
  _install(session, "notebooks", JAX)
  # Jupyter refuses to start as root unless told to (these machines run as root).
  root = ["--allow-root"] if os.geteuid() == 0 else []
  session.run("jupyter", "lab", "--notebook-dir", "notebooks", *root,
              *session.posargs, env=READER_ENV)


# The unit tests `package` runs from the installed sdist: every unit-test module
# is collected (so a helper missing from the sdist fails), these few run. The
# sdist has no docs/ or site, so test_docs and test_site are left out.
SDIST_TESTS = ["tests/test_layout.py", "tests/test_packaging.py"]


def _fresh_hijax(session):
  """Install options that rebuild and reinstall hijax even where a kept
  environment has the same version (its files may have changed since)."""
  if session.venv_backend == "uv":
    return ["--reinstall-package", "jax-hijax"]
  return ["--force-reinstall"]


def _constraints(session):
  path = Path(session.create_tmp()) / "constraints.txt"
  path.write_text("\n".join(TOOL_PINS) + "\n")
  return str(path)


@nox.session(python=PYTHON)
@_timed
def package(session):
  """Build the wheel and the sdist; in this session's clean environment, run
  the README example from the installed wheel, then install the sdist and run
  unit tests from its unpacked copy (SDIST_TESTS; every test module collected).
  """
  skip, key = _unchanged_since_last_pass(session, JAX)
  if skip:
    return
  tmp = Path(session.create_tmp()).resolve()
  dist = tmp / "dist"
  shutil.rmtree(dist, ignore_errors=True)
  if shutil.which("uv"):
    session.run("uv", "build", "--out-dir", str(dist), ".", external=True)
  else:
    session.install("build")
    session.run("python", "-m", "build", "--outdir", str(dist), ".")
  (wheel,), (sdist,) = dist.glob("*.whl"), dist.glob("*.tar.gz")

  session.install(*_fresh_hijax(session), str(wheel), f"jax=={JAX}")
  example = tmp / "readme_example.py"
  readme = (ROOT / "README.md").read_text()
  example.write_text(readme.split("```python\n", 1)[1].split("```", 1)[0])
  session.chdir(tmp)  # away from the checkout, so `import hijax` is the wheel's
  out = session.run("python", str(example), silent=True)
  session.log(f"README example printed: {out.split()}")
  if out.split() != ["1.0", "nan"]:
    session.error(f"the README example printed {out!r}, not 1.0 and nan")
  session.run("python", "-c", PACKAGE_CHECK, wheel.name)

  unpacked = tmp / "sdist"
  shutil.rmtree(unpacked, ignore_errors=True)
  shutil.unpack_archive(sdist, unpacked)
  (root,) = unpacked.iterdir()
  # Replace the wheel's hijax with the sdist's (built from it); keep the rest.
  session.install(*_fresh_hijax(session), f"{sdist}[tests]", f"jax=={JAX}",
                  "-c", _constraints(session))
  session.chdir(root)
  # The `pytest` script, not `python -m pytest`, so the sdist's own hijax/
  # folder is not on sys.path: the tests import the installed copy. One run
  # collects every module (an error in any fails it) and runs SDIST_TESTS.
  session.run("pytest", "-q", "-p", "no:cacheprovider",
              "tests", "--ignore", "tests/test_site.py",
              "--ignore", "tests/test_docs.py",
              # checks the committed notebooks and tools/, which the sdist lacks
              "--ignore", "tests/test_notebook_hygiene.py",
              "-k", " or ".join(Path(t).name for t in SDIST_TESTS), *session.posargs)
  session.chdir(ROOT)
  _record_pass(session, key)


# Run in the installed wheel's environment: hijax is the installed copy, its
# version the built one, and py.typed and the license travelled with it.
PACKAGE_CHECK = """
import importlib.metadata as md, pathlib, sys, tomllib, hijax
wheel = sys.argv[1]
dist = md.distribution("jax-hijax")
assert "site-packages" in hijax.__file__, hijax.__file__
assert hijax.__version__ == dist.version, (hijax.__version__, dist.version)
assert wheel.startswith(f"jax_hijax-{dist.version}-"), wheel
assert (pathlib.Path(hijax.__file__).parent / "py.typed").exists()
assert dist.metadata["License-Expression"] == "Apache-2.0"
files = {str(f) for f in dist.files}
assert any(f.endswith("licenses/LICENSE") for f in files), sorted(files)
assert not any(f.startswith(("tests/", "docs/")) for f in files)
print("wheel", wheel, "ok: version", dist.version)
"""


@nox.session(python=PYTHON)
@_timed
def typecheck(session):
  """Types: `basedpyright --verifytypes hijax` (every exported symbol's type
  known; JAX's own types are not counted), basedpyright in standard mode
  (pyproject.toml) on hijax/ and tests/typecheck/, and mypy on
  tests/typecheck/ (typical user code: natural overrides of HiPrim's rules).
  """
  skip, key = _unchanged_since_last_pass(session, JAX)
  if skip:
    return
  # Not editable: the type checkers read the installed copy as a user's would.
  # pytest: the plugin's modules (hijax.testing._plugin) import it.
  session.install(*_fresh_hijax(session), ".", f"jax=={JAX}", "pytest", "basedpyright", "mypy",
                  "-c", _constraints(session))
  tmp = Path(session.create_tmp()).resolve()
  session.run("basedpyright")  # hijax/ and tests/typecheck/, as configured
  # Away from the checkout, `import hijax` is the installed copy: verifytypes
  # checks what a user gets, and mypy sees the user code as a user's mypy does
  # (errors inside an installed package are not the user's to fix).
  session.chdir(tmp)
  session.run("basedpyright", "--verifytypes", "hijax", "--ignoreexternal")
  # A kept cache changes no result (mypy checks each cached module against its
  # source); an empty one costs about 18 s of CPU here.
  mypy_cache = (_cache_root() or tmp) / "mypy"
  session.run("mypy", "--config-file", str(ROOT / "pyproject.toml"),
              "--cache-dir", str(mypy_cache), str(ROOT / "tests" / "typecheck"))
  session.chdir(ROOT)
  _record_pass(session, key)
