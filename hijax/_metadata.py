"""The version, read from the installed distribution, and the import-name clash.

hijax is installed as the distribution ``jax-hijax`` and imported as
``hijax``. The package index's ``hijax`` is an unrelated 2021 project ("An
experiment framework for Haiku and Jax") with a top-level package of the same
name, so the two cannot share an environment: whichever was installed last
overwrites the other's files. Its releases need ``torch<2``, which has no
builds for the Pythons hijax supports (3.12 and later), so a resolver will not
install both; a ``pip install --no-deps hijax`` could, and `warn_on_clash`
says so at import.
"""
from __future__ import annotations

import importlib.metadata
import warnings

DISTRIBUTION = "jax-hijax"
UNRELATED_DISTRIBUTION = "hijax"
# Whether DISTRIBUTION can be installed from PyPI: the release checklist
# (CONTRIBUTING.md) sets it with the project's real URLs, and
# tests/test_packaging.py fails while the two disagree.
ON_PYPI = False
# What `installed_version` returns for a checkout used without installing it
# (e.g. on PYTHONPATH): a valid version that says it is not known.
UNKNOWN_VERSION = "0+unknown"
# How this project's summary begins; metadata left by a build of a checkout
# from before the rename to jax-hijax carries it under the name "hijax".
OWN_SUMMARY_START = "Custom primitives, derivative rules and types for JAX"


def installed_version() -> str:
  """The version of the installed ``jax-hijax`` (pyproject.toml's, at build)."""
  try:
    return importlib.metadata.version(DISTRIBUTION)
  except importlib.metadata.PackageNotFoundError:
    return UNKNOWN_VERSION


def warn_on_clash() -> None:
  """Warn if the unrelated ``hijax`` distribution shares this environment."""
  try:
    other = importlib.metadata.distribution(UNRELATED_DISTRIBUTION)
  except importlib.metadata.PackageNotFoundError:
    return
  if (other.metadata.get("Summary") or "").startswith(OWN_SUMMARY_START):
    return  # this project's own metadata from before its rename (a stale build)
  warnings.warn(
      f"the unrelated package {UNRELATED_DISTRIBUTION!r} "
      f"{other.version} (an experiment framework for Haiku) is installed in "
      f"this environment; it also installs the import name 'hijax', so the "
      f"files of one overwrote the other's. Fix: pip uninstall "
      f"{UNRELATED_DISTRIBUTION} {DISTRIBUTION}, then {_reinstall()}",
      RuntimeWarning, stacklevel=3)


def _reinstall() -> str:
  """How to install this project again, in its release state."""
  if ON_PYPI:
    return f"pip install {DISTRIBUTION}"
  return (f"install {DISTRIBUTION} again from a checkout of it, with "
          f"`pip install -e .` in its root ({DISTRIBUTION} is not on PyPI yet)")
