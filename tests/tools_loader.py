"""A script of tools/ loaded as a module, for the tests of the tools."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_tool(name):
  """tools/NAME.py as a module (tools/ is no package)."""
  spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
