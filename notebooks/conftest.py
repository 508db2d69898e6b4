"""`pytest --nbval notebooks` works as it is: outputs that vary between runs
(addresses, temp-file names, timings) are masked by tools/nbval_sanitize.cfg
unless another file is given with --nbval-sanitize-with."""
from pathlib import Path

SANITIZE = Path(__file__).resolve().parent.parent / "tools" / "nbval_sanitize.cfg"


def pytest_configure(config):
  if getattr(config.option, "nbval_sanitize_with", "") is None:
    config.option.nbval_sanitize_with = str(SANITIZE)
