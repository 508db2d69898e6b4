"""JAX's own tests of its decorators, run with hijax's decorators in their place.

JAX's ``tests/custom_api_test.py`` defines what ``jax.custom_jvp`` and
``jax.custom_vjp`` do. This script takes that file from a checkout (or a bare
git directory) of the jax-ml/jax repository, into a temporary directory, and
runs it twice with pytest: as it is, and with every ``jax.custom_vjp`` and
``jax.custom_jvp`` in it replaced by ``hijax.custom_vjp`` and
``hijax.custom_jvp`` (nothing else changed). It prints a table: per test
class, the tests that pass with JAX's decorators, with hijax's, and those
that pass only with JAX's, split into the deliberate ones (`DELIBERATE`,
each listed with the reason in docs/porting-custom-vjp.md) and the others,
which are gaps. The exit status is 1 when there is a gap.

  python tools/jax_custom_api.py --jax-repo PATH [--ref REV] [--python PY]
      [--deps DIR] [--out FILE] [--keep DIR] [-k EXPR]

``--python`` is the interpreter to test with (its JAX is the one tested; the
default is this one); ``--deps`` a directory added to its path, for what
JAX's test helpers need beyond JAX (``absl-py``:
``pip install --target DIR absl-py``). ``--ref`` picks the revision of the
test file (default HEAD). ``-k`` is passed to pytest (a quick look at a few
tests). ``--keep`` keeps the junit reports in a directory and reuses the
run with JAX's decorators from there (it depends only on the JAX version
and the test file). Nothing of JAX's is copied into this repository: the file is read
from the given checkout each run.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST_PATH = "tests/custom_api_test.py"

DELIBERATE: dict[str, str] = {
    # name (a test method, or Class.method for one class only): why hijax
    # does not pass it. docs/porting-custom-vjp.md lists the same names, with
    # what hijax does instead (tests/test_jax_custom_api_tool.py checks that).
    "test_jvp_error": "hijax derives forward mode of a custom_vjp function",
    "test_jvp_error_symbolic_zeros": "hijax runs forward mode (this fwd "
                                     "fails there as in reverse mode)",
    "test_custom_lin_pretty_print": "hijax's tangent is bwd transposed",
    "test_closed_over_tracers_error_message": "closed-over traced values are "
                                              "inputs",
    "test_closed_over_tracer_error": "closed-over traced values are inputs",
    "test_nondiff_arg_hiding_jvp_tracer": "closed-over traced values are "
                                          "inputs",
    "test_nondiff_arg_tracer_error": "a traced nondiff argument is an input",
    "test_nondiff_arg_nested_tracer_error": "a traced nondiff argument is an "
                                           "input",
    "CustomVJP3Test.test_overbatched_fwd_rule_error": "every output batched",
    "CustomVJP3Remat3Test.test_overbatched_fwd_rule_error": "every output "
                                                            "batched",
    "CustomJVP3Test.test_hard_stuff2": "every output batched",
    "CustomJVP3Remat3Test.test_hard_stuff2": "every output batched",
    "test_pretty_print": "hijax prints its own primitive",
    "test_dce": "no call_jaxpr parameter (the outputs are pruned)",
    "CustomJVP3Test.test_symbolic_zero_custom_jvp": "Python floats, as JAX's "
                                                    "default custom_jvp",
    "CustomJVP3Remat3Test.test_symbolic_zero_custom_jvp": "Python floats, as "
                                                          "JAX's default "
                                                          "custom_jvp",
}

ALIAS = "hijax_decorators"
"""The name hijax is imported as (the test file has a ``hijax`` of JAX's)."""
_DECORATOR = re.compile(r"(?<![\w.])jax\.(custom_vjp|custom_jvp)\b")


def substitute(source: str) -> tuple[str, int]:
  """The test file with hijax's decorators for JAX's, and how many were
  replaced (``jax.custom_vjp``, not ``jax.custom_derivatives...``)."""
  new, n = _DECORATOR.subn(rf"{ALIAS}.\1", source)
  lines = new.splitlines(keepends=True)
  at = next(i for i, line in enumerate(lines) if line.startswith("import jax"))
  lines.insert(at, f"import hijax as {ALIAS}\n")
  return "".join(lines), n


def test_file(repo: str, ref: str) -> str:
  """The text of JAX's test file at ``ref`` in the git directory ``repo``."""
  return subprocess.run(["git", "-C", repo, "show", f"{ref}:{TEST_PATH}"],
                        check=True, capture_output=True, text=True).stdout


def run(python: str, path: Path, deps: list[str], k: str | None,
        xml: Path) -> None:
  """Runs the test file ``path`` with pytest, writing its junit report."""
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *deps])
  cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"--junitxml={xml}", "-o", "junit_family=xunit1", str(path.name)]
  if k:
    cmd += ["-k", k]
  subprocess.run(cmd, cwd=path.parent, env=env, stdout=subprocess.DEVNULL,
                 check=False)


def outcomes(xml: Path) -> dict[str, tuple[str, str]]:
  """``{Class.test: (outcome, first line of the failure)}`` of one run."""
  results = {}
  for case in ET.parse(xml).getroot().iter("testcase"):
    name = f"{case.get('classname', '').rsplit('.', 1)[-1]}.{case.get('name')}"
    outcome, message = "passed", ""
    for tag in ("failure", "error", "skipped"):
      node = case.find(tag)
      if node is not None:
        outcome = tag
        first = (node.get("message") or "").strip().splitlines()[:1]
        message = first[0][:160] if first else ""
        break
    results[name] = (outcome, message)
  return results


def deliberate_reason(name: str) -> str | None:
  """Why hijax deliberately fails ``Class.test``, if it does."""
  method = name.rsplit(".", 1)[-1].split("[")[0]
  return DELIBERATE.get(name) or DELIBERATE.get(method)


def report(jax_results, hijax_results) -> tuple[str, int]:
  """The table (markdown) and the number of gaps."""
  classes = sorted({n.split(".")[0] for n in jax_results})
  rows = ["| class | tests | pass with JAX's | pass with hijax's | only JAX's: "
          "deliberate | only JAX's: gap | only hijax's |",
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
  total: Counter[str] = Counter()
  gaps, only_hijax = [], []
  for cls in [*classes, None]:
    if cls is None:
      c = total
      label = "**all**"
    else:
      c = Counter()
      label = cls
      for name, (outcome, _) in jax_results.items():
        if name.split(".")[0] != cls:
          continue
        ours = hijax_results.get(name, ("missing", ""))[0]
        c["tests"] += 1
        c["jax"] += outcome == "passed"
        c["hijax"] += ours == "passed"
        if outcome == "passed" and ours != "passed":
          if deliberate_reason(name):
            c["deliberate"] += 1
          else:
            c["gap"] += 1
            gaps.append(name)
        if ours == "passed" and outcome != "passed":
          c["only_hijax"] += 1
          only_hijax.append(name)
      total.update(c)
    rows.append(f"| {label} | {c['tests']} | {c['jax']} | {c['hijax']} | "
                f"{c['deliberate']} | {c['gap']} | {c['only_hijax']} |")
  lines = rows + [""]
  if gaps:
    lines.append("Gaps (pass with JAX's decorators only):")
    lines += [f"- {n}: {hijax_results.get(n, ('', ''))[1]}" for n in gaps]
    lines.append("")
  deliberate = sorted(n for n, (o, _) in jax_results.items()
                      if o == "passed" and hijax_results.get(n, ("",))[0]
                      != "passed" and deliberate_reason(n))
  if deliberate:
    lines.append("Deliberate (see docs/porting-custom-vjp.md):")
    lines += [f"- {n}: {deliberate_reason(n)}" for n in deliberate]
    lines.append("")
  if only_hijax:
    lines.append("Pass with hijax's decorators only:")
    lines += [f"- {n}" for n in only_hijax]
  return "\n".join(lines), len(gaps)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--jax-repo", required=True,
                      help="a checkout or git directory of jax-ml/jax")
  parser.add_argument("--ref", default="HEAD")
  parser.add_argument("--python", default=sys.executable)
  parser.add_argument("--deps", action="append", default=[])
  parser.add_argument("--out", help="also write the table to this file")
  parser.add_argument("-k", help="pytest's -k expression")
  parser.add_argument("--keep", help="a directory for the junit reports; "
                      "the run with JAX's decorators is reused from there "
                      "(same JAX version and test file, no -k)")
  args = parser.parse_args(argv)
  source = test_file(args.jax_repo, args.ref)
  version = subprocess.run(
      [args.python, "-c", "import jax; print(jax.__version__)"], check=True,
      capture_output=True, text=True).stdout.strip()
  digest = hashlib.sha256(source.encode()).hexdigest()[:12]
  with tempfile.TemporaryDirectory() as tmp:
    keep = Path(args.keep) if args.keep else Path(tmp)
    keep.mkdir(parents=True, exist_ok=True)
    suffix = f"{version}-{digest}{'-k' if args.k else ''}"
    jax_xml = keep / f"jax-{suffix}.xml"
    hijax_xml = keep / f"hijax-{suffix}.xml"
    jax_file = Path(tmp, "custom_api_test.py")
    jax_file.write_text(source)
    hijax_dir = Path(tmp, "hijax_run")
    hijax_dir.mkdir()
    hijax_file = hijax_dir / "custom_api_test.py"
    substituted, n = substitute(source)
    hijax_file.write_text(substituted)
    if args.k or not jax_xml.exists():
      run(args.python, jax_file, args.deps, args.k, jax_xml)
    run(args.python, hijax_file, args.deps, args.k, hijax_xml)
    jax_results, hijax_results = outcomes(jax_xml), outcomes(hijax_xml)
  table, n_gaps = report(jax_results, hijax_results)
  head = (f"JAX's {TEST_PATH} at {args.ref}, jax {version}: {n} uses of "
          "jax.custom_vjp/jax.custom_jvp replaced by hijax's.\n")
  print(head)
  print(table)
  if args.out:
    Path(args.out).write_text(head + "\n" + table + "\n")
  return 1 if n_gaps else 0


if __name__ == "__main__":
  sys.exit(main())
