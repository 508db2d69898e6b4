"""A script of tools/ loaded as a module, for the tests of the tools."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_tool(name):
  """tools/NAME.py as a module (tools/ is no package); a test module that
  needs it is skipped where tools/ is not there (an unpacked sdist)."""
  path = ROOT / "tools" / f"{name}.py"
  if not path.exists():
    import pytest
    pytest.skip(f"no tools/{name}.py (an sdist)", allow_module_level=True)
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
