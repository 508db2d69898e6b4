"""`pytest --nbval notebooks` works as it is: outputs that vary between runs
(addresses, temp-file names, timings) are masked by tools/nbval_sanitize.cfg
unless another file is given with --nbval-sanitize-with.

nbval's fixed waits are also made long enough for a heavily loaded machine,
where they, not the pages, failed cells: it waited 5 s (not configurable) for
each output message of a cell that had finished, then stopped the kernel,
failing the cell and xfailing every later one; and 60 s for a kernel to start.
A page that hangs is still stopped by --nbval-cell-timeout. And XLA writes a
"slow operation" alarm to the kernel's stderr when constant folding takes
over a second, which load alone can cause; and JAX warns, then compiles
again, when it reads an entry of the compilation cache that another process
is still writing (the `tests` session shares one cache among the kernels);
and `check_rules` says what it is doing once a run has taken 10 s: such a
stderr output, in a cell whose stored outputs have none, is not
compared.
"""
import re
from pathlib import Path

SANITIZE = Path(__file__).resolve().parent.parent / "tools" / "nbval_sanitize.cfg"
OUTPUT_TIMEOUT = 120  # seconds between two output messages of a finished cell
KERNEL_STARTUP_TIMEOUT = 300  # seconds, where the command line keeps nbval's 60


def pytest_configure(config):
  if getattr(config.option, "nbval_sanitize_with", "") is None:
    config.option.nbval_sanitize_with = str(SANITIZE)
  if getattr(config.option, "nbval_kernel_startup_timeout", None) == 60:
    config.option.nbval_kernel_startup_timeout = KERNEL_STARTUP_TIMEOUT


def pytest_collection_modifyitems(items):
  for item in items:
    if isinstance(getattr(item, "output_timeout", None), (int, float)):
      item.output_timeout = max(item.output_timeout, OUTPUT_TIMEOUT)


# What the machine, not the page, writes to stderr (see the docstring).
_MACHINE_STDERR = re.compile(r"slow_operation_alarm\.cc|Constant folding an "
                             r"instruction is taking|Error reading persistent "
                             r"compilation cache entry|"
                             r"^check_rules: [\d.]+ s(?: of [\d.]+ s)?: ", re.M)


def _is_machine_stderr(output) -> bool:
  return (output.get("output_type") == "stream"
          and output.get("name") == "stderr"
          and bool(_MACHINE_STDERR.search(output.get("text", ""))))


def _patch_nbval():
  try:
    from nbval.plugin import IPyNbCell
  except ImportError:
    return
  compare = IPyNbCell.compare_outputs
  if getattr(compare, "_hijax", False):
    return

  def compare_outputs(self, test, ref, skip_compare=None):
    if not any(o.get("name") == "stderr" for o in ref):
      test = [o for o in test if not _is_machine_stderr(o)]
    return compare(self, test, ref, skip_compare)

  compare_outputs._hijax = True
  IPyNbCell.compare_outputs = compare_outputs


_patch_nbval()
