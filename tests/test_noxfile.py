"""The noxfile's caches kept between runs: JAX's compilation cache (one
folder per JAX version, pruned oldest first) and how the unit tests use it.

noxfile.py is loaded with a stand-in for the `nox` module (its decorators
return the functions), so these run without nox installed.
"""
import os
import re
from pathlib import Path

import jax
import pytest

ROOT = Path(__file__).resolve().parent.parent


class _Session:
  """Enough of nox's Session for the cache helpers: log lines are kept."""

  def __init__(self):
    self.lines = []

  def log(self, line):
    self.lines.append(line)




def test_each_jax_version_gets_its_own_kept_folder(noxfile, monkeypatch, tmp_path):
  monkeypatch.setenv("HIJAX_CACHE", str(tmp_path))
  env = noxfile._compile_cache_env(_Session(), "0.12.0.1")
  old = noxfile._compile_cache_env(_Session(), "0.11.2")
  assert env["JAX_COMPILATION_CACHE_DIR"] == str(
      tmp_path / "jax-compilation-cache" / "jax-0.12.0.1")
  assert old["JAX_COMPILATION_CACHE_DIR"] == str(
      tmp_path / "jax-compilation-cache" / "jax-0.11.2")
  assert Path(env["JAX_COMPILATION_CACHE_DIR"]).is_dir()
  # every compiled program is kept, however small or quick to compile
  assert env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0"
  assert env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] == "0"
  assert set(env) == {"JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
                      "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"}


def test_off_keeps_no_cache(noxfile, monkeypatch):
  monkeypatch.setenv("HIJAX_CACHE", "off")
  session = _Session()
  assert noxfile._cache_root() is None
  assert noxfile._compile_cache_env(session, "0.12.0.1") == {}
  assert "HIJAX_CACHE=off" in session.lines[-1]


@pytest.mark.parametrize("entries, kept", [
    (6, ["key0-cache"]),  # 1,800 bytes > 1,000: oldest first, down to 500
    (3, ["key0-cache", "key1-cache", "key2-cache"]),  # 900 bytes: left alone
])
def test_a_full_cache_loses_its_oldest_entries_down_to_half(
    noxfile, monkeypatch, tmp_path, entries, kept):
  monkeypatch.setenv("HIJAX_CACHE", str(tmp_path))
  monkeypatch.setattr(noxfile, "COMPILE_CACHE_MAX_BYTES", 1000)
  folder = tmp_path / "jax-compilation-cache" / "jax-0.12.0.1"
  folder.mkdir(parents=True)
  for age in range(entries):  # 300 bytes each, key0 the newest
    entry = folder / f"key{age}-cache"
    entry.write_bytes(b"x" * 300)
    os.utime(entry, (1e9 - age, 1e9 - age))
  session = _Session()
  noxfile._compile_cache_env(session, "0.12.0.1")
  assert sorted(f.name for f in folder.iterdir()) == kept
  assert f"{len(kept)} programs" in session.lines[-1]


def test_the_unit_tests_use_the_cache_folder_they_are_given():
  """tests/conftest.py: the folder in JAX_COMPILATION_CACHE_DIR (set by the
  nox sessions), else a private one; every program is cached either way."""
  given = os.environ.get("JAX_COMPILATION_CACHE_DIR")
  used = jax.config.jax_compilation_cache_dir
  if given:
    assert used == given
  else:
    assert used and Path(used).name.startswith("hijax-tests-jax-cache-")
  assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
  assert jax.config.jax_persistent_cache_min_entry_size_bytes == 0


def test_options_and_the_ci_lanes(noxfile):
  """uv environments kept between runs, a missing Python an error, and the
  `ci` lanes running exactly the sessions a plain `nox` runs, each once."""
  options = noxfile.nox.options
  assert options.default_venv_backend == "uv|virtualenv"
  assert options.reuse_venv == "yes"
  assert options.error_on_missing_interpreters is True
  lanes = [name for lane in noxfile.CI_LANES.values() for name in lane]
  lanes.append(noxfile.CI_AFTER_DOCS)
  assert sorted(lanes) == sorted(options.sessions) and len(set(lanes)) == len(lanes)
  # the browser test starts once `docs`, first in its lane, has built the site
  assert noxfile.CI_AFTER_DOCS == "site" and noxfile.CI_LANES["B"][0] == "docs"


def _sessions() -> list[str]:
  """Every nox session's name, read from noxfile.py's decorators."""
  source = (ROOT / "noxfile.py").read_text()
  return [name or fn for name, fn in re.findall(
      r'^@nox\.session\((?:name="([\w-]+)")?[^)]*\)\n(?:@\w+\n)*def (\w+)', source, re.M)]


def test_the_readme_states_the_versions_ci_tests(noxfile):
  """README "Versions": the JAX range is pyproject.toml's and the versions
  tested in CI are the noxfile's pins."""
  import tomllib
  deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
  (jax_range,) = [d.removeprefix("jax") for d in deps if re.match(r"jax\W", d)]
  readme = (ROOT / "README.md").read_text()
  row = f"| 0.1.x | `{jax_range}` | {noxfile.JAX_OLD} and {noxfile.JAX} |"
  assert row in readme, row
  assert f"`jax{jax_range}`" in readme


def test_the_readme_and_contributing_state_what_ci_runs(noxfile):
  """The README's test command is the one .ci/run runs; CONTRIBUTING.md
  lists the sessions `ci` runs and has a row for every nox session."""
  command = "python3.12 -m pip install nox uv && python3.12 -m nox -s ci"
  assert command in (ROOT / ".ci" / "run").read_text()
  assert f"```sh\n{command}\n```" in (ROOT / "README.md").read_text()
  contributing = (ROOT / "CONTRIBUTING.md").read_text()
  assert f"`{' '.join(noxfile.nox.options.sessions)}`" in " ".join(contributing.split())
  table = contributing.split("| session | what it does |", 1)[1].split("\n\n", 1)[0]
  rows = re.findall(r"^\| `([\w-]+)` \|", table, re.M)
  assert sorted(rows) == sorted(_sessions()), rows
