"""The pure parts of tools/plugin_trials.py and tools/plugin_on_library.py
(no library suite needed)."""
import pytest

from tools_loader import load_tool

trials = load_tool("plugin_trials")
on_library = load_tool("plugin_on_library")


def _report(*rows):
  return {"rules": [{"rule": r, "via": v, "defined_at": "x.py:1",
                     "verdict": verdict, "detail": detail}
                    for r, v, verdict, detail in rows],
          "counts": {}}


def test_only_selects_trials_by_name_or_library():
  args = trials.parse(["--python", "p", "--src", "s", "--only", "lineax",
                       "optax_simplex_vmap"])
  names = [t.name for t in trials.chosen(args.only)]
  assert "optax_simplex_vmap" in names and "lineax_two_norm_large" in names
  assert not any(n.startswith("optimistix") for n in names)
  assert trials.chosen(None) == trials.TRIALS


def test_an_unknown_trial_is_refused_with_the_known_names(capsys):
  with pytest.raises(SystemExit):
    trials.parse(["--python", "p", "--src", "s", "--only", "nope"])
  err = capsys.readouterr().err
  assert "unknown trials ['nope']" in err and "optax_simplex_vmap" in err


def test_every_trial_targets_a_library_with_a_selection():
  assert len(trials.TRIALS) >= 8
  assert {t.library for t in trials.TRIALS} <= set(trials.SELECTIONS)
  assert len(trials.BY_NAME) == len(trials.TRIALS)
  for t in trials.TRIALS:
    namespace = {}
    exec(compile(trials.patch_module(t.patch), t.name, "exec"), namespace)
    assert callable(namespace["pytest_configure"])  # nothing ran yet


def test_the_rule_is_found_by_name_or_by_the_function_it_was_made_by():
  report = _report(("fn_wrapper", "optimistix._ad._implicit_impl (x.py:3)",
                    "passed", ""), ("_two_norm", None, "failed", "jvp"))
  assert trials.rule_verdict(report, "_implicit_impl") == "passed"
  assert trials.rule_verdict(report, "_two_norm") == "failed"
  assert trials.rule_verdict(report, "other") is None


def test_the_worst_verdict_of_a_rules_rows_counts():
  report = _report(("r", None, "passed", ""), ("r", None, "failed", ""),
                   ("r", None, "inconclusive", ""))
  assert trials.rule_verdict(report, "r") == "failed"


def _base(failed_tests, verdict):
  return {"off": {"failed": failed_tests},
          "on": {"report": _report(("r", None, verdict, ""))}}


def test_judge_counts_only_new_test_failures_and_new_rule_failures():
  base = _base(["t::old"], "passed")
  got = trials.judge(base, {"failed": ["t::old", "t::new"]},
                     {"report": _report(("r", None, "failed", "x"))}, "r")
  assert got["tests_caught"] and got["tests_failing"] == ["t::new"]
  assert got["plugin"] == "caught" and got["plugin_caught"]
  got = trials.judge(base, {"failed": ["t::old"]},
                     {"report": _report(("r", None, "passed", ""))}, "r")
  assert not got["tests_caught"] and got["plugin"] == "missed (passed)"


def test_a_rule_failed_without_the_defect_is_not_a_catch():
  got = trials.judge(_base([], "failed"), {"failed": []},
                     {"report": _report(("r", None, "failed", ""))}, "r")
  assert got["plugin"].startswith("masked") and not got["plugin_caught"]
  got = trials.judge(_base([], "passed"), {"failed": []},
                     {"report": {}}, "r")
  assert got["plugin"] == "not recorded"


def test_merge_replaces_the_trials_run_and_keeps_the_others():
  old = {"baselines": {"a": 1, "b": 2}, "trials": {"x": 1, "y": 2},
         "python": ["0.1"]}
  new = {"baselines": {"b": 3}, "trials": {"y": 4, "z": 5},
         "python": ["0.2"]}
  assert trials.merge(old, new) == {
      "baselines": {"a": 1, "b": 3}, "trials": {"x": 1, "y": 4, "z": 5},
      "python": ["0.2"]}
  assert trials.merge({}, new)["trials"] == {"y": 4, "z": 5}


def test_summary_has_a_row_per_trial():
  results = {"trials": {"x": {"kind": "dtype", "tests_caught": True,
                              "plugin": "missed (passed)"}}}
  assert trials.summary(results) == ["trial | kind | tests | plugin",
                                     "x | dtype | caught | missed (passed)"]


def test_on_library_summarizes_failed_and_inconclusive_rules_with_reasons():
  report = _report(("a", None, "failed", "vmap: wrong\nTraceback ..."),
                   ("b", "m.f (x.py:2)", "inconclusive", ""),
                   ("c", None, "passed", ""))
  report["counts"] = {"failed": 1, "inconclusive": 1, "passed": 1}
  got = on_library.summarize(report)
  assert got["counts"] == {"failed": 1, "inconclusive": 1, "passed": 1}
  assert got["failed"] == [{"rule": "a", "via": None,
                            "defined_at": "x.py:1", "reason": "vmap: wrong"}]
  assert [r["rule"] for r in got["inconclusive"]] == ["b"]
  assert got["inconclusive"][0]["reason"] == ""


def test_on_library_overhead_is_the_median_ratio_and_the_final_total():
  offs = [{"wall": 10, "cpu": 10, "cpu_total": 20},
          {"wall": 10, "cpu": 10, "cpu_total": 20}]
  ons = [{"wall": 11, "cpu": 12, "cpu_total": 21},
         {"wall": 13, "cpu": 12, "cpu_total": 30}]
  got = on_library.overheads(offs, ons)
  assert got["wall"] == pytest.approx(0.2) and got["cpu"] == pytest.approx(0.2)
  assert got["cpu_total"] == pytest.approx(0.5)  # the final pair's
  assert "cpu_total" not in on_library.overheads(
      [{"wall": 1, "cpu": 1}], [{"wall": 1, "cpu": 1}])


def test_a_masked_rule_says_whether_its_reason_changed():
  on = {"report": _report(("r", None, "failed", "new"))}
  got = trials.judge(_base([], "failed"), {"failed": []}, on, "r")
  assert got["plugin"].endswith("the reason changed)")


def test_rejudge_recomputes_a_trial_from_what_it_holds():
  results = {"baselines": {"lib": _base([], "passed")},
             "trials": {"x": {"library": "lib", "rule": "r", "kind": "k",
                              "off_failed": ["t::a"], "tests_caught": False,
                              "plugin": "?",
                              "report": _report(("r", None, "failed", ""))}}}
  got = trials.rejudge(results)["trials"]["x"]
  assert got["tests_caught"] and got["plugin"] == "caught"


def test_failed_tests_are_read_from_the_short_summary_subtests_included():
  out = ("x\n=== short test summary info ===\n"
         "SUBFAILED[Check a b] m_test.py::T::test_a\n"
         "SUBFAILED[Check c] m_test.py::T::test_a\n"
         "FAILED m_test.py::test_b[1-2] - AssertionError: x\n"
         "ERROR m_test.py::test_c\n1 failed, 3 passed\n")
  assert trials.failed_tests(out) == ["m_test.py::T::test_a",
                                      "m_test.py::test_b[1-2]",
                                      "m_test.py::test_c"]


def test_a_run_where_pytest_itself_failed_is_no_catch():
  got = trials.judge(_base([], "passed"), {"failed": [], "returncode": 3},
                     {"report": {}}, "r")
  assert got["tests_caught"] is None and got["plugin"] == "no run"
