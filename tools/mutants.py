"""Mutation testing of hijax: does some test fail when one token is changed?

Each *mutant* is a copy of one module of ``hijax/`` with one token changed
(``<`` for ``<=``, ``+`` for ``-``, ``and`` for ``or``, ``True`` for ``False``,
a number plus one, a ``not`` dropped, ``is`` for ``is not``, ``raise`` made a
``return``, a ``return`` value made None, ``break`` for ``continue``),
outside docstrings, comments and f-strings (messages, checked by the
message tests rather than by mutants). For
each mutant the test files that cover the module (`MODULE_TESTS`) run with
``-x``; the mutant is *killed* if one fails and *survives* otherwise (a run
past the timeout is reported as undecided, one where ``-k`` selects no test
as not tested; neither is scored). A survivor is a change that no test
notices: either a missing test, or an *equivalent* mutant (one that cannot change behaviour),
listed with the reason in ``tools/mutants_equivalent.txt``.

  python tools/mutants.py                       every module in MODULE_TESTS
  python tools/mutants.py _checks batching      only those modules
  python tools/mutants.py --sample 40 --seed 1  at most 40 mutants per module
  python tools/mutants.py --list _util          print the mutants, run nothing
  python tools/mutants.py --only KEY ...        rerun the given mutants
  python tools/mutants.py --quick ...           only the fast core test files

Run with ``PYTHONPATH`` unset: the mutants run in a scratch copy of
``hijax/``, ``tests/`` and the pages some tests read, ``docs/*.md`` (the
checkout is never modified). jax, pytest and
the test dependencies are imported once, and each mutant's tests run in a
forked child, so a mutant costs its tests' time, not JAX's import.
``nox -s mutants`` runs this script (not part of the default sessions).
"""
from __future__ import annotations

import argparse
import io
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENT = ROOT / "tools" / "mutants_equivalent.txt"

# The fast, focused core tests run first, then the module's own test files.
CORE = ["tests/test_core_edges.py", "tests/test_core_misuse.py",
        "tests/test_core_rules.py"]
MODULE_TESTS = {
    "_util.py": CORE + ["tests/test_autodiff.py"],
    "_checks.py": CORE + ["tests/test_rule_outputs.py"],
    "_cotangents.py": CORE + ["tests/test_rule_outputs.py",
                              "tests/test_autodiff.py"],
    "_declaration.py": CORE + ["tests/test_primitive.py"],
    "_core_rules.py": CORE + ["tests/test_primitive.py"],
    "primitive.py": CORE + ["tests/test_primitive.py"],
    "autodiff.py": CORE + ["tests/test_autodiff.py",
                           "tests/test_rule_outputs.py"],
    "batching.py": CORE + ["tests/test_batching.py"],
    "derived.py": CORE + ["tests/test_derived.py"],
    "hitypes.py": CORE + ["tests/test_hitypes.py"],
    "remat.py": ["tests/test_remat.py"],
    "_avals.py": ["tests/test_avals.py"],
}
# hijax.implicit and hijax.testing: their own test files, fastest first (a
# survivor runs them all).
IMPLICIT = ["tests/test_implicit_failure.py", "tests/test_implicit_errors.py",
            "tests/test_implicit_solvers.py",
            "tests/test_implicit.py"]
TESTING = ["tests/test_testing_gaps.py", "tests/test_testing_scale.py",
           "tests/test_testing_properties.py", "tests/test_testing_decorators.py",
           "tests/test_testing.py"]
PLUGIN = ["tests/test_plugin_recording.py", "tests/test_plugin.py",
          "tests/test_plugin_behaviours.py"]
MODULE_TESTS.update({
    "implicit/_linear.py": IMPLICIT,
    "implicit/_dense.py": IMPLICIT,
    "implicit/_krylov.py": IMPLICIT,
    "implicit/_backward_error.py": ["tests/test_implicit_many_rhs.py",
                                    "tests/test_implicit_checks.py", *IMPLICIT],
    "implicit/_precision.py": IMPLICIT,
    "implicit/_status.py": IMPLICIT,
    "implicit/_nonlinear.py": IMPLICIT,
    "implicit/_primitives.py": IMPLICIT,
    "testing/_numerics.py": ["tests/test_testing_numerics.py", *TESTING],
    "testing/_finite_diff.py": ["tests/test_testing_numerics.py", *TESTING],
    "testing/_checks.py": ["tests/test_testing_verdicts.py", *TESTING],
    "testing/_discovery.py": ["tests/test_testing_walk.py",
                              "tests/test_testing_jax_rules.py",
                              "tests/test_testing_verdicts.py",
                              "tests/test_custom_decorators_checks.py",
                              *TESTING],
    "testing/_flow.py": ["tests/test_testing_verdicts.py",
                         "tests/test_testing_device.py",
                         "tests/test_testing_jax_rules.py", *TESTING],
    "testing/_foreign_words.py": ["tests/test_testing_words.py", *TESTING],
    "testing/_context.py": ["tests/test_testing_verdicts.py", *TESTING],
    "testing/_nzs_out.py": ["tests/test_testing_nzs_out_mutants.py",
                            "tests/test_testing_compiles.py", *TESTING],
    "testing/_device.py": ["tests/test_testing_device_mutants.py",
                           "tests/test_testing_device.py",
                           "tests/test_recorded_tpu_runs.py", *TESTING],
    "testing/_batching.py": ["tests/test_testing_batching_mutants.py",
                             "tests/test_testing_compiles.py", *TESTING],
    "testing/_second_order.py": ["tests/test_testing_second_order_mutants.py",
                                 "tests/test_testing_jax_rules.py", *TESTING],
    "testing/_api.py": ["tests/test_testing_verdicts.py",
                        "tests/test_testing_device.py", *TESTING],
    "testing/_report.py": ["tests/test_testing_words.py",
                           "tests/test_testing_verdicts.py", *TESTING],
    "testing/_plugin/_check.py": PLUGIN,
    "testing/_plugin/_recorder.py": PLUGIN,
    "testing/_plugin/_pytest.py": PLUGIN,
    "testing/_compiled.py": ["tests/test_testing_bundle.py",
                             "tests/test_testing_budget.py",
                             "tests/test_testing_compiles.py",
                             "tests/test_testing_import.py",
                             "tests/test_testing_jax_rules.py",
                             "tests/test_testing_verdicts.py", *TESTING],
})
# hijax.custom_jvp / custom_vjp: the decorators' tests, fastest first (the
# kept-trace cache's first: most mutants of the call path fail there).
DECORATORS = ["tests/test_custom_decorators_cache.py",
              "tests/test_custom_decorators_mutants.py", "tests/test_dropin_hooks.py",
              "tests/test_custom_decorators_review.py",
              "tests/test_custom_decorators_dce.py", "tests/test_dropin.py",
              "tests/test_custom_decorators_jax_words.py",
              "tests/test_dropin_remat.py", "tests/test_custom_decorators_gaps.py",
              "tests/test_custom_decorators_additions.py",
              "tests/test_custom_decorators.py",
              "tests/test_custom_decorators_checks.py"]
MODULE_TESTS["_function_key.py"] = ["tests/test_custom_decorators_cache.py",
                                    "tests/test_implicit_cache.py",
                                    "tests/test_function_key.py",
                                    "tests/test_testing_verdicts.py",
                                    "tests/test_plugin_recording.py"]
MODULE_TESTS.update({f"_decorators/{name}.py": DECORATORS for name in (
    "_batching", "_common", "_jvp", "_outputs", "_tracing", "_vjp")})

_SWAPS = {
    "<": ["<="], "<=": ["<"], ">": [">="], ">=": [">"], "==": ["!="],
    "!=": ["=="], "+": ["-"], "-": ["+"], "and": ["or"], "or": ["and"],
    "True": ["False"], "False": ["True"], "continue": ["break"],
    "break": ["continue"], "raise": ["return"], "return": ["return None and"],
}


@dataclass(frozen=True)
class Mutant:
  module: str
  line: int
  col: int
  old: str
  new: str
  text: str  # the source line, stripped
  nth: int   # which occurrence of `old` on the line

  @property
  def key(self) -> str:
    """Stable across edits elsewhere in the module (no line number)."""
    return f"{self.module} | {self.text} | #{self.nth} {self.old!r} -> {self.new!r}"

  def apply(self, source: str) -> str:
    lines = source.splitlines(keepends=True)
    line = lines[self.line - 1]
    assert line[self.col:self.col + len(self.old)] == self.old
    lines[self.line - 1] = (line[:self.col] + self.new
                            + line[self.col + len(self.old):])
    return "".join(lines)


def mutants_of(module: str, source: str) -> list[Mutant]:
  """Every single-token mutant of ``source`` that still compiles."""
  tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
  lines = source.splitlines()
  out = []

  def add(tok, old, new):
    row, c = tok.start
    nth = sum(1 for t in tokens if t.start[0] == row and t.start[1] < c
              and t.string == tok.string)
    m = Mutant(module, row, c, old, new, lines[row - 1].strip(), nth)
    try:
      compile(m.apply(source), module, "exec")
    except SyntaxError:
      return
    out.append(m)

  fstring = getattr(tokenize, "FSTRING_START", None)
  depth = 0  # inside an f-string: a message, not logic
  for i, tok in enumerate(tokens):
    nxt = tokens[i + 1] if i + 1 < len(tokens) else None
    prev = tokens[i - 1] if i else None
    s = tok.string
    if fstring is not None and tok.type in (fstring, tokenize.FSTRING_END):
      depth += 1 if tok.type == fstring else -1
    if depth:
      continue
    if tok.type in (tokenize.OP, tokenize.NAME) and s in _SWAPS:
      if s == "return" and (nxt is None or nxt.type in (
          tokenize.NEWLINE, tokenize.COMMENT) or nxt.string == "None"):
        continue
      for new in _SWAPS[s]:
        add(tok, s, new)
    if tok.type == tokenize.NAME and s == "not":
      if prev is not None and prev.string == "is":
        continue  # `is not` -> `is` below
      if nxt is not None and nxt.string == "in":
        add(tok, "not in", "in")
      else:
        add(tok, "not ", "")
    if tok.type == tokenize.NAME and s == "is":
      if nxt is not None and nxt.string == "not":
        add(tok, "is not", "is")
      else:
        add(tok, "is", "is not")
    if tok.type == tokenize.NUMBER and s.isdigit():
      add(tok, s, str(int(s) + 1))
      if s == "1":
        add(tok, s, "0")
  return out


def _equivalent_keys() -> dict[str, str]:
  """Keys listed in tools/mutants_equivalent.txt, with their reasons."""
  if not EQUIVALENT.exists():
    return {}
  keys, reason = {}, ""
  for line in EQUIVALENT.read_text().splitlines():
    if line.startswith("# "):
      reason = line[2:]
    elif line.strip() and not line.startswith("#"):
      keys[line.strip()] = reason
  return keys


def _workspace() -> Path:
  ws = Path(tempfile.mkdtemp(prefix="hijax-mutants-"))
  shutil.copytree(ROOT / "hijax", ws / "hijax",
                  ignore=shutil.ignore_patterns("__pycache__"))
  shutil.copytree(ROOT / "tests", ws / "tests",
                  ignore=shutil.ignore_patterns("__pycache__"))
  shutil.copy(ROOT / "pyproject.toml", ws / "pyproject.toml")
  (ws / "docs").mkdir()  # the pages some tests read (the API page's lists)
  for page in (ROOT / "docs").glob("*.md"):
    shutil.copy(page, ws / "docs" / page.name)
  return ws


def _preload():
  # Imported once in this process, inherited by every forked child. hijax
  # itself is not: each child imports the mutated copy.
  import hypothesis  # noqa: F401
  import jax  # noqa: F401
  import jax.numpy  # noqa: F401
  import numpy  # noqa: F401
  import pytest  # noqa: F401


# pytest's exit code when no test was collected (a -k that selects none)
NO_TESTS = 5


def _outcome(code: int) -> str:
  """The result of a forked child's exit code (see `_run_tests`)."""
  if code == 3:
    raise SystemExit("tools/mutants.py: the tests import an installed "
                     "hijax, not the mutated copy; uninstall it")
  return {0: "passed", NO_TESTS: "not tested"}.get(code, "failed")


def _run_tests(ws: Path, tests: list[str], timeout: float) -> str:
  """'passed', 'failed', 'not tested' (no test selected: neither a kill nor
  a survivor) or 'timeout' for the tests, in a forked child."""
  pid = os.fork()
  if pid == 0:  # the child
    try:
      os.chdir(ws)
      sys.path[:0] = [str(ws), str(ws / "tests")]
      sys.dont_write_bytecode = True
      devnull = os.open(os.devnull, os.O_WRONLY)
      os.dup2(devnull, 1)
      os.dup2(devnull, 2)
      import hijax
      if not Path(hijax.__file__).resolve().is_relative_to(ws.resolve()):
        os._exit(3)  # an installed hijax shadows the mutated copy
      import pytest
      code = pytest.main(["-x", "-q", "-p", "no:cacheprovider",
                          "-p", "no:randomly", "-W", "ignore", *tests])
      os._exit(code if code in (0, NO_TESTS) else 1)
    except BaseException:
      os._exit(2)
  deadline = time.monotonic() + timeout
  while True:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
      return _outcome(os.waitstatus_to_exitcode(status))
    if time.monotonic() > deadline:
      os.kill(pid, signal.SIGKILL)
      os.waitpid(pid, 0)
      return "timeout"
    time.sleep(0.05)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("modules", nargs="*",
                      help="modules of hijax/ (default: all in MODULE_TESTS)")
  parser.add_argument("--sample", type=int, default=0,
                      help="at most this many mutants per module, drawn at random")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--timeout", type=float, default=600,
                      help="seconds per mutant; a mutant whose tests run longer "
                      "is reported as undecided (a loop it made endless, or a "
                      "loaded machine), not scored")
  parser.add_argument("--only", nargs="*", default=None,
                      help="run only the mutants with these keys")
  parser.add_argument("--only-file", type=Path, default=None,
                      help="run only the mutants whose keys are lines of this file")
  parser.add_argument("--quick", action="store_true",
                      help="run only the core test files (tests/test_core_*.py) "
                      "where a module has them, not the module's own files")
  parser.add_argument("--no-baseline", action="store_true",
                      help="skip the run of the unmutated tests (known to pass)")
  parser.add_argument("-k", dest="keyword", default=None,
                      help="pytest -k expression selecting the tests to run")
  parser.add_argument("--list", action="store_true",
                      help="print the mutants and exit")
  parser.add_argument("--report", type=Path, default=None,
                      help="also write the report to this file")
  args = parser.parse_args(argv)

  if args.only_file:
    args.only = [*(args.only or []),
                 *args.only_file.read_text().strip().splitlines()]
  names = [m if m.endswith(".py") else f"{m}.py" for m in args.modules]
  names = names or list(MODULE_TESTS)
  for name in names:
    if name not in MODULE_TESTS:
      parser.error(f"no tests mapped for hijax/{name} (see MODULE_TESTS)")
  equivalent = _equivalent_keys()
  plan = {}
  for name in names:
    muts = mutants_of(name, (ROOT / "hijax" / name).read_text())
    if args.only is not None:
      muts = [m for m in muts if m.key in args.only]
    elif args.sample and len(muts) > args.sample:
      muts = sorted(random.Random(f"{args.seed} {name}").sample(
          muts, args.sample), key=lambda m: (m.line, m.col))
    plan[name] = muts
  if args.list:
    for muts in plan.values():
      for m in muts:
        print(f"{m.line:4d}  {m.key}")
    return 0

  _preload()
  ws = _workspace()
  report, baselines = [], {}

  def say(line=""):
    print(line, flush=True)
    report.append(line)

  try:
    for name, muts in plan.items():
      if not muts:
        continue
      tests = [t for t in MODULE_TESTS[name] if (ROOT / t).exists()]
      if args.quick and any(t in CORE for t in tests):
        tests = [t for t in tests if t in CORE]
      target = ws / "hijax" / name
      original = target.read_text()
      if args.keyword:
        tests = [*tests, "-k", args.keyword]
      t0 = time.monotonic()
      if not args.no_baseline and tuple(tests) not in baselines:
        baselines[tuple(tests)] = _run_tests(ws, tests, args.timeout * 3)
        say(f"unmutated: {' '.join(tests)} {baselines[tuple(tests)]} in "
            f"{time.monotonic() - t0:.0f} s")
      if baselines.get(tuple(tests), "passed") != "passed":
        say(f"{name}: the unmutated tests {baselines[tuple(tests)]}; skipped")
        continue
      say(f"{name}: {len(muts)} mutants, tests {' '.join(tests)}")
      counts = {"killed": 0, "timeout": 0, "survived": 0, "equivalent": 0,
                "not tested": 0}
      for m in muts:
        target.write_text(m.apply(original))
        try:
          result = _run_tests(ws, tests, args.timeout)
        finally:
          target.write_text(original)
        if result == "failed":
          counts["killed"] += 1
        elif result in ("timeout", "not tested"):
          counts[result] += 1
          say(f"  {result}   {m.key}")
        elif m.key in equivalent:
          counts["equivalent"] += 1
          say(f"  equivalent {m.key}  ({equivalent[m.key]})")
        else:
          counts["survived"] += 1
          say(f"  SURVIVED  line {m.line}: {m.key}")
      killed = counts["killed"]
      scored = killed + counts["survived"]
      say(f"{name}: {len(muts)} mutants: {killed} killed, "
          f"{counts['survived']} survived, {counts['equivalent']} equivalent, "
          f"{counts['timeout']} undecided (timeout), {counts['not tested']} "
          f"not tested (no test selected); score {killed}/{scored}; "
          f"{time.monotonic() - t0:.0f} s")
  finally:
    shutil.rmtree(ws, ignore_errors=True)
    if args.report:
      args.report.write_text("\n".join(report) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
