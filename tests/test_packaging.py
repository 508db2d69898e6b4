"""What a user of the package sees: its name, version, license, description.

Building and installing the wheel and sdist is `nox -s package`; these checks
read the files only, so they run anywhere (also from the sdist).
"""
from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import pathlib
import re
import sys
import tomllib
import warnings

import pytest

import hijax
from hijax import _metadata

ROOT = pathlib.Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]


def _python_blocks(path: pathlib.Path) -> list[str]:
  return re.findall(r"^```python\n(.*?)^```$", path.read_text(), re.M | re.S)


def test_the_distribution_name_is_the_one_installed_and_documented():
  assert PROJECT["name"] == _metadata.DISTRIBUTION == "jax-hijax"
  for doc in ("README.md", "README_PYPI.md"):
    install = " ".join(_install_section(doc).split())
    assert "The distribution is `jax-hijax`" in install, doc
    assert "Do not `pip install hijax`" in install, doc


# The project's URLs until the first release: placeholders, which the release
# checklist in CONTRIBUTING.md replaces with the real ones.
PLACEHOLDER_URLS = {
    "https://github.com/hijax-dev/jax-hijax",
    "https://hijax-dev.github.io/jax-hijax/",
    "https://github.com/hijax-dev/jax-hijax/issues",
    "https://github.com/hijax-dev/jax-hijax/blob/main/CHANGELOG.md",
}
NOT_YET = "not on PyPI yet"


def _install_section(doc: str) -> str:
  text = (ROOT / doc).read_text()
  return text.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]


def _commands(section: str) -> list[str]:
  blocks = re.findall(r"^```sh\n(.*?)^```$", section, re.M | re.S)
  return [line.split("#")[0].strip() for b in blocks for line in b.splitlines()]


def test_install_instructions_match_the_release_state():
  """Before the first release the install sections say that hijax is not on
  PyPI and give only commands that work from a checkout; the release
  checklist (CONTRIBUTING.md) sets the real URLs and `pip install jax-hijax`
  together, and this test fails until both are done."""
  urls = set(PROJECT["urls"].values())
  released = not urls & PLACEHOLDER_URLS
  assert released or urls <= PLACEHOLDER_URLS, (
      f"some URLs are real and some placeholders: {sorted(urls & PLACEHOLDER_URLS)}")
  for doc in ("README.md", "README_PYPI.md"):
    install = _install_section(doc)
    commands = _commands(install)
    from_index = [c for c in commands if c.endswith(f"pip install {PROJECT['name']}")]
    install = " ".join(install.split())
    if released:
      assert NOT_YET not in install, f"{doc} still says hijax is {NOT_YET}"
      assert from_index, f"{doc}: released, but no `pip install {PROJECT['name']}`"
    else:
      assert NOT_YET in install, f"{doc}: unreleased, but does not say {NOT_YET!r}"
      assert not from_index, f"{doc}: `pip install {PROJECT['name']}` cannot work yet"
      assert "python -m pip install -e ." in commands, doc
  # the import-name clash warning gives the reinstall of this release state
  assert _metadata.ON_PYPI is released, (
      f"hijax/_metadata.py ON_PYPI = {_metadata.ON_PYPI}, but the URLs say "
      f"released = {released}")
  checklist = (ROOT / "CONTRIBUTING.md").read_text().split("\n## Releasing", 1)[1]
  assert "tests/test_packaging.py" in checklist and "ON_PYPI" in checklist


def test_the_readme_wheel_is_the_version_built():
  """The wheel the README's install builds and installs is this version's."""
  install = _install_section("README.md")
  wheels = set(re.findall(r"jax_hijax-[^\s`]+\.whl", install))
  assert wheels == {f"jax_hijax-{PROJECT['version']}-py3-none-any.whl"}, wheels


def test_version_is_read_from_the_installed_metadata(monkeypatch):
  versions = {_metadata.DISTRIBUTION: "7.8.9"}

  def version(name):
    if name not in versions:
      raise importlib.metadata.PackageNotFoundError(name)
    return versions[name]

  monkeypatch.setattr(importlib.metadata, "version", version)
  assert _metadata.installed_version() == "7.8.9"
  versions.clear()
  assert _metadata.installed_version() == _metadata.UNKNOWN_VERSION == "0+unknown"


def test_the_package_reports_its_version():
  try:
    installed = importlib.metadata.version(_metadata.DISTRIBUTION)
  except importlib.metadata.PackageNotFoundError:  # a checkout on PYTHONPATH
    assert hijax.__version__ == "0+unknown"
  else:
    assert hijax.__version__ == installed == PROJECT["version"]


class _Distribution:
  version = "0.1.0"
  metadata = {"Summary": "An experiment framework for Haiku and Jax"}


class _StaleOwnDistribution:
  version = "0.1.0"
  metadata = {"Summary": "Custom primitives, derivative rules and types for "
              "JAX, with the JAX 301 docs that teach them."}


def test_the_unrelated_hijax_distribution_is_named_with_the_fix(monkeypatch):
  def distribution(name):
    if name == "hijax":
      return _Distribution()
    raise importlib.metadata.PackageNotFoundError(name)

  monkeypatch.setattr(importlib.metadata, "distribution", distribution)
  with pytest.warns(RuntimeWarning) as caught:
    _metadata.warn_on_clash()
  message = str(caught[0].message)
  assert "'hijax' 0.1.0" in message and "Haiku" in message
  assert "pip uninstall hijax jax-hijax" in message
  # the reinstall the message gives works in the project's release state
  if _metadata.ON_PYPI:
    assert "&& pip install jax-hijax" in message, message
  else:
    assert "pip install jax-hijax" not in message, message
    assert NOT_YET in message and "pip install -e ." in message, message


def test_no_warning_for_this_projects_metadata_from_before_the_rename(monkeypatch):
  monkeypatch.setattr(importlib.metadata, "distribution",
                      lambda name: _StaleOwnDistribution())
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    _metadata.warn_on_clash()


def test_no_warning_without_the_unrelated_distribution(monkeypatch):
  def distribution(name):
    raise importlib.metadata.PackageNotFoundError(name)

  monkeypatch.setattr(importlib.metadata, "distribution", distribution)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    _metadata.warn_on_clash()


def test_license_is_apache_2():
  assert PROJECT["license"] == "Apache-2.0"
  assert PROJECT["license-files"] == ["LICENSE"]
  text = (ROOT / "LICENSE").read_text()
  assert "Apache License" in text and "Version 2.0, January 2004" in text
  assert not any(c.startswith("License ::") for c in PROJECT["classifiers"])


def test_the_long_description_shows_the_readme_example():
  assert PROJECT["readme"]["file"] == "README_PYPI.md"
  (example,) = _python_blocks(ROOT / "README_PYPI.md")
  assert example == _python_blocks(ROOT / "README.md")[0], (
      "README_PYPI.md's example differs from the README's first: copy it")


def test_the_long_description_links_are_absolute():
  text = (ROOT / "README_PYPI.md").read_text()
  targets = re.findall(r"\]\(([^)]+)\)", text) + re.findall(
      r"(?<![(\w])(https?://\S+)", text)
  assert targets
  for target in targets:
    assert target.startswith("https://"), f"relative link off-site: {target}"
  for name, url in PROJECT["urls"].items():
    if name != "Homepage":
      assert url in text, f"README_PYPI.md does not link {name} ({url})"


def _local_imports(path: pathlib.Path) -> set[str]:
  names = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      names |= {a.name.split(".")[0] for a in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      names.add(node.module.split(".")[0])
  return {n for n in names if (path.parent / f"{n}.py").exists()}


def test_the_sdist_holds_every_test_helper():
  """MANIFEST.in grafts tests/; each module a test imports is a file there."""
  manifest = (ROOT / "MANIFEST.in").read_text().splitlines()
  assert "graft tests" in manifest
  helpers = set()
  for path in (ROOT / "tests").glob("*.py"):
    helpers |= _local_imports(path)
  assert {"zoo", "unary_prim", "hitype_examples"} <= helpers


def test_py_typed_ships_in_the_wheel():
  assert (ROOT / "hijax" / "py.typed").exists()
  assert PYPROJECT["tool"]["setuptools"]["package-data"]["hijax"] == ["py.typed"]


TYPECHECK = ROOT / "tests" / "typecheck"


def _load(name: str):
  spec = importlib.util.spec_from_file_location(
      f"typecheck_{name}", TYPECHECK / f"{name}.py")
  assert spec and spec.loader
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # dataclasses look their module up there
  spec.loader.exec_module(module)
  return module


def test_the_type_checked_readme_primitive_is_the_readmes():
  source = (TYPECHECK / "readme_primitive.py").read_text()
  assert source.split('"""\n', 2)[-1] == _python_blocks(ROOT / "README.md")[0]


@pytest.mark.parametrize("name", ["spec_classes", "hi_type"])
def test_the_type_checked_user_code_runs(name):
  _load(name).main()
