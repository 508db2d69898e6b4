"""tools/mutants.py's verdict on a mutant's test run: a run that selects no
test (``-k`` matching none: pytest's exit code 5) kills nothing."""
import importlib.util
import subprocess
import sys
import textwrap

import pytest

from tools_loader import ROOT

PATH = ROOT / "tools" / "mutants.py"
if not PATH.exists():
  pytest.skip("no tools/mutants.py (an sdist)", allow_module_level=True)
_spec = importlib.util.spec_from_file_location("mutants", PATH)
mutants = importlib.util.module_from_spec(_spec)
sys.modules["mutants"] = mutants  # its dataclasses look their module up
_spec.loader.exec_module(mutants)


def test_exit_codes_give_passed_failed_not_tested():
  assert mutants._outcome(0) == "passed"
  assert mutants._outcome(1) == "failed"
  assert mutants._outcome(2) == "failed"  # the child itself raised
  assert mutants._outcome(mutants.NO_TESTS) == "not tested"
  with pytest.raises(SystemExit, match="installed hijax"):
    mutants._outcome(3)


@pytest.mark.parametrize("keyword,result", [
    ("nothing_matches", "not tested"), ("passes", "passed"),
    ("fails", "failed")])
def test_a_run_of_a_workspace_reports_what_its_tests_did(tmp_path, keyword,
                                                         result):
  # a workspace of its own (a stub hijax), run in a fresh interpreter: the
  # forked child must import the workspace's hijax, not this process's
  (tmp_path / "hijax").mkdir()
  (tmp_path / "hijax" / "__init__.py").write_text("")
  (tmp_path / "tests").mkdir()
  (tmp_path / "tests" / "test_x.py").write_text(
      "def test_passes():\n  pass\n\ndef test_fails():\n  assert False\n")
  code = textwrap.dedent(f"""
      import sys
      from pathlib import Path
      sys.path.insert(0, {str(ROOT / "tests")!r})
      from test_mutants_tool import mutants
      print(mutants._run_tests(Path({str(tmp_path)!r}),
                               ["tests/test_x.py", "-k", {keyword!r}], 120))""")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, check=True, cwd=tmp_path, timeout=300)
  assert out.stdout.strip().splitlines()[-1] == result
