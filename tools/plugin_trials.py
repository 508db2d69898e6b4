#!/usr/bin/env python
"""Broken copies of real libraries' rules: does the library's own test
selection catch each defect, and does ``pytest --hijax-check-rules``?

Not a CI step: it needs the libraries' test suites (checkouts of the tags
that match the installed versions, e.g. optimistix 0.1.0, lineax 0.1.1,
diffrax 0.7.2, optax 0.2.8) and an environment with the libraries, their
test dependencies and hijax (see tools/plugin_on_library.py)::

  python tools/plugin_trials.py --python /work/libvenv/bin/python \\
      --src /work/libsrc [--only NAME ...]

``--src`` holds one checkout per library, named after it
(``<src>/optax``, ``<src>/optimistix``...). Each trial breaks one rule at
runtime: a small module, loaded with ``-p`` before the tests are collected,
re-defines the rule's jvp (or bwd) around the library's own one. Nothing
installed is edited. Each trial runs the library's selected tests twice,
without the plugin (do the tests catch it?) and with it (does the plugin
fail the rule, by name?). A baseline per library (no defect) tells which
tests and which rules fail already, so that neither counts as a catch.

Results go to tools/plugin_trials.json; a run of some trials (``--only``)
replaces those trials' entries and keeps the others.
"""
import argparse
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "tools" / "plugin_trials.json"

# The tests each library's trials run (small: every trial runs them twice).
SELECTIONS = {
    "optax": ["optax/projections/_projections_test.py",
              "optax/losses/_classification_test.py",
              "optax/_src/utils_test.py",
              "-k", "simplex or SoftmaxCrossEntropyTest or scale_gradient",
              # scales the gradient: deliberately not the derivative, but
              # the derivative of a reference (in _PRELUDE)
              "-o", "hijax_deliberate=optax/_src/utils.py::_scale_gradient: "
              "surrogate _hijax_trial:scale_gradient_reference"],
    "optimistix": ["tests/test_root_find.py", "-k",
                   "test_root_find_jvp and solver0 and "
                   "(_cos or _nn or _midpoint_y_linear)", "-o",
                   # the solver's state: a zero tangent by design
                   "hijax_deliberate=optimistix/_ad.py:64: output out[1]"],
    "lineax": ["tests/test_jvp.py", "-k",
               "float64 and construct_matrix and make_matrix_operator and "
               "(solver12- or solver13- or solver14-)"],
    "diffrax": ["test/test_adjoint.py", "-k",
                "test_sde_against or test_adjoint_seminorm"],
}

# Wraps a tangent- or cotangent-computing function so that every inexact
# leaf of what it returns goes through ``change``; and the references.
_PRELUDE = '''
import jax, jax.numpy as jnp
import jax.tree_util as jtu

def _leaves_map(change, tree):
  return jtu.tree_map(
      lambda x: change(x) if hasattr(x, "dtype")
      and jnp.issubdtype(x.dtype, jnp.inexact) else x, tree)

# The jvp rule given to an equinox filter_custom_jvp (its def_jvp returns
# None: a library module's name for the rule is None).
def _jvp_of(filter_custom_jvp):
  wrapper = filter_custom_jvp.fn.jvp
  return dict(zip(wrapper.__code__.co_freevars,
                  (c.cell_contents for c in wrapper.__closure__)))["fn_jvp"]

# The references of SELECTIONS' surrogates: plain JAX of the rule's value
# whose derivative is the one the rule means (optax's scales the gradient).
def scale_gradient_reference(inputs, scale):
  s = jax.lax.stop_gradient(scale)
  return jtu.tree_map(lambda x: x * s + jax.lax.stop_gradient(x - x * s),
                      inputs)
'''


@dataclasses.dataclass(frozen=True)
class Trial:
  name: str
  library: str
  kind: str  # dtype | domain | input | output | transpose | vmap | sign
  # | primitive
  rule: str  # the rule's name as the plugin reports it (or its "via")
  what: str
  patch: str  # Python run by the -p module before collection


TRIALS = [
    Trial("optax_simplex_float32", "optax", "dtype",
          "_projection_unit_simplex",
          "jvp 5% too large, only in float32", '''
from optax.projections import _projections as m
_orig = m._projection_unit_simplex_jvp
def _broken(primals, tangents):
  out, t = _orig(primals, tangents)
  return out, (t * 1.05 if t.dtype == jnp.float32 else t)
m._projection_unit_simplex.defjvp(_broken)
'''),
    Trial("optax_simplex_nonnegative", "optax", "domain",
          "_projection_unit_simplex",
          "jvp 10% too large where every input is >= 0", '''
from optax.projections import _projections as m
_orig = m._projection_unit_simplex_jvp
def _broken(primals, tangents):
  out, t = _orig(primals, tangents)
  return out, jnp.where(jnp.all(primals[0] >= 0), 1.1 * t, t)
m._projection_unit_simplex.defjvp(_broken)
'''),
    Trial("optax_simplex_vmap", "optax", "vmap",
          "_projection_unit_simplex",
          "jvp's sum in a callback that sums the whole batch under vmap", '''
import numpy as np
from optax.projections import _projections as m
def _broken(primals, tangents):
  (values,), (values_dot,) = primals, tangents
  out = m._projection_unit_simplex(values)
  supp = (out > 0).astype(values_dot.dtype)
  card = jnp.count_nonzero(supp)
  total = jax.pure_callback(
      lambda a: np.asarray(np.sum(a), a.dtype),
      jax.ShapeDtypeStruct((), values_dot.dtype), supp * values_dot,
      vmap_method="broadcast_all")
  return out, supp * values_dot - (total / card) * supp
m._projection_unit_simplex.defjvp(_broken)
'''),
    Trial("optax_wlogsoftmax_weights", "optax", "input",
          "weighted_logsoftmax",
          "jvp drops the weights' tangent term", '''
from optax.losses import _classification as m
def _broken(primals, tangents):
  x, w = primals
  x_dot, _ = tangents
  out, _t = m._weighted_logsoftmax_jvp(primals, tangents)
  t = w * x_dot - w * jnp.sum(x_dot * jax.nn.softmax(x, axis=-1), axis=-1,
                              keepdims=True)
  return out, t
m.weighted_logsoftmax.defjvp(_broken)
'''),
    Trial("optax_wlogsoftmax_float32", "optax", "dtype",
          "weighted_logsoftmax",
          "jvp 5% too large, only in float32", '''
from optax.losses import _classification as m
def _broken(primals, tangents):
  out, t = m._weighted_logsoftmax_jvp(primals, tangents)
  return out, (t * 1.05 if t.dtype == jnp.float32 else t)
m.weighted_logsoftmax.defjvp(_broken)
'''),
    Trial("optax_simplex_last_element", "optax", "output",
          "_projection_unit_simplex",
          "tangent of the last output element 10% too small (others "
          "right)", '''
from optax.projections import _projections as m
_orig = m._projection_unit_simplex_jvp
def _broken(primals, tangents):
  out, t = _orig(primals, tangents)
  return out, t.at[..., -1].multiply(0.9)
m._projection_unit_simplex.defjvp(_broken)
'''),
    Trial("optax_scale_gradient_bwd_sign", "optax", "transpose",
          "_scale_gradient", "bwd returns minus the scaled cotangent", '''
from optax._src import utils as m
def _broken(scale, g):
  return (jtu.tree_map(lambda g_: -g_ * scale, g), None)
m._scale_gradient.defvjp(m._scale_gradient_fwd, _broken)
'''),
    Trial("optimistix_implicit_sign", "optimistix", "sign", "_implicit_impl",
          "root's tangent has the wrong sign", '''
from optimistix import _ad as m
_orig = _jvp_of(m._implicit_impl)
def _broken(primals, tangents):
  (root, res), (t_root, t_res) = _orig(primals, tangents)
  return (root, res), (_leaves_map(lambda x: -x, t_root), t_res)
m._implicit_impl.def_jvp(_broken)
'''),
    Trial("optimistix_implicit_complex", "optimistix", "dtype",
          "_implicit_impl", "root's tangent conjugated, only for complex", '''
from optimistix import _ad as m
_orig = _jvp_of(m._implicit_impl)
def _broken(primals, tangents):
  (root, res), (t_root, t_res) = _orig(primals, tangents)
  return (root, res), (_leaves_map(jnp.conj, t_root), t_res)
m._implicit_impl.def_jvp(_broken)
'''),
    Trial("optimistix_implicit_last_leaf", "optimistix", "output",
          "_implicit_impl",
          "tangent of the root's last leaf 10% too small (others right)", '''
from optimistix import _ad as m
_orig = _jvp_of(m._implicit_impl)
def _broken(primals, tangents):
  (root, res), (t_root, t_res) = _orig(primals, tangents)
  leaves, tree = jtu.tree_flatten(t_root)
  if leaves:
    leaves[-1] = 0.9 * leaves[-1]
  return (root, res), (jtu.tree_unflatten(tree, leaves), t_res)
m._implicit_impl.def_jvp(_broken)
'''),
    Trial("lineax_two_norm_large", "lineax", "domain", "_two_norm",
          "jvp 10% too large where the norm exceeds 1", '''
from lineax import _norm as m
def _broken(x, tx):
  out, t = m._two_norm_jvp(x, tx)
  return out, jnp.where(out > 1, 1.1 * t, t)
m._two_norm.defjvp(_broken)
'''),
    Trial("lineax_linear_solve_jvp", "lineax", "primitive", "linear_solve",
          "linear_solve_p's registered jvp rule 10% too large", '''
from jax.interpreters import ad
from lineax import _solve as m
_orig = ad.primitive_jvps[m.linear_solve_p]
def _broken(primals, tangents, **params):
  out, t = _orig(primals, tangents, **params)
  return out, _leaves_map(lambda x: 1.1 * x, t)
ad.primitive_jvps[m.linear_solve_p] = _broken
'''),
    Trial("diffrax_backsolve_bwd", "diffrax", "transpose", "_loop_backsolve",
          "backsolve's cotangents 10% too small", '''
from diffrax import _adjoint as m
_orig = m._loop_backsolve.fn_bwd
def _broken(*args, **kwargs):
  return _leaves_map(lambda x: 0.9 * x, _orig(*args, **kwargs))
m._loop_backsolve.def_bwd(_broken)
'''),
]
BY_NAME = {t.name: t for t in TRIALS}


def parse(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--python", required=True,
                      help="the interpreter of the libraries' environment")
  parser.add_argument("--src", required=True,
                      help="folder holding a checkout per library")
  parser.add_argument("--only", nargs="*", default=None, metavar="NAME",
                      help="trials (or libraries) to run; default all")
  parser.add_argument("--out", default=str(RESULTS))
  parser.add_argument("--rule-budget", type=float, default=60.0)
  parser.add_argument("--budget", type=float, default=600.0)
  parser.add_argument("--no-baseline", action="store_true",
                      help="reuse the baselines already in --out")
  parser.add_argument("--rejudge", action="store_true",
                      help="run nothing: judge the trials in --out again")
  args = parser.parse_args(argv)
  if args.only:
    unknown = [n for n in args.only
               if n not in BY_NAME and n not in SELECTIONS]
    if unknown:
      parser.error(f"unknown trials {unknown}; known: {sorted(BY_NAME)} "
                   f"or libraries {sorted(SELECTIONS)}")
  return args


def chosen(only):
  """The trials ``--only`` names (by trial or by library), in order."""
  if not only:
    return list(TRIALS)
  return [t for t in TRIALS if t.name in only or t.library in only]


def _rows(report, rule):
  return [r for r in report.get("rules", [])
          if r["rule"] == rule or (r.get("via") or "").split(" ")[0]
          .split(".")[-1] == rule]


def rule_verdict(report, rule):
  """The plugin's verdict for the rule named ``rule`` (by its name or the
  function it was made by), the worst over its rows; None if not recorded."""
  order = ["failed", "inconclusive", "passed", "not checked"]
  found = [r["verdict"] for r in _rows(report, rule)]
  if not found:
    return None
  return min(found, key=lambda v: order.index(v) if v in order else 1)


def judge(baseline, off, on, rule):
  """What a trial's two runs show, against its library's baseline:
  whether the tests caught the defect (a test that passes on the unbroken
  library fails), and whether the plugin did (the rule is failed where
  the baseline did not fail it)."""
  if off.get("returncode") not in (None, 0, 1):  # no tests ran
    return {"tests_caught": None, "tests_failing": [], "plugin": "no run",
            "plugin_caught": None, "rule_verdict": None,
            "rule_verdict_baseline": None}
  new_failures = sorted(set(off["failed"]) - set(baseline["off"]["failed"]))
  before = rule_verdict(baseline["on"]["report"], rule)
  after = rule_verdict(on["report"], rule) if on.get("report") else None
  if after is None:
    plugin = "not recorded"
  elif after == "failed" and before == "failed":
    same = ({r.get("detail") for r in _rows(on["report"], rule)}
            == {r.get("detail") for r in _rows(baseline["on"]["report"], rule)})
    plugin = ("masked (failed already without the defect"
              + (", same reason)" if same else "; the reason changed)"))
  elif after == "failed":
    plugin = "caught"
  else:
    plugin = f"missed ({after})"
  return {"tests_caught": bool(new_failures),
          "tests_failing": new_failures[:10],
          "plugin": plugin, "plugin_caught": plugin == "caught",
          "rule_verdict": after, "rule_verdict_baseline": before}


def merge(old, new):
  """The results file after a run: ``new``'s trials and baselines replace
  those of the same name in ``old``; the rest of ``old`` is kept."""
  merged = {"baselines": dict(old.get("baselines", {})),
            "trials": dict(old.get("trials", {}))}
  merged["baselines"].update(new.get("baselines", {}))
  merged["trials"].update(new.get("trials", {}))
  for key in ("python", "selections"):
    if key in new:
      merged[key] = new[key]
  return merged


def summary(results):
  """One line per trial: the table of the report."""
  lines = ["trial | kind | tests | plugin"]
  for name, t in results.get("trials", {}).items():
    lines.append(f"{name} | {t['kind']} | "
                 f"{'caught' if t['tests_caught'] else 'missed'} | "
                 f"{t['plugin']}")
  return lines


def patch_module(patch):
  """The -p module's source: the patch runs in ``pytest_configure``, after
  the initial conftests, so that a library is first imported after
  jaxtyping's ``--jaxtyping-packages`` hook (it refuses packages already
  imported)."""
  body = "".join(f"  {line}\n" if line.strip() else "\n"
                 for line in (patch or "pass").strip("\n").splitlines())
  return _PRELUDE + "\n\ndef pytest_configure(config):\n" + body


def failed_tests(output):
  """The tests pytest's short summary (-rf) names as failed or in error,
  failed unittest subtests (``SUBFAILED[message] id``) included."""
  failed = set()
  for line in output.splitlines():
    for head in ("FAILED ", "ERROR ", "SUBFAILED"):
      if line.startswith(head):
        rest = line[len(head):]
        if head == "SUBFAILED":
          rest = rest.split("] ", 1)[-1] if rest.startswith("[") else rest
        failed.add(rest.strip().split(" ")[0])
  return sorted(failed)


def _run(args, library, patch, on, workdir):
  """One pytest run of the library's selection, with the trial's patch (if
  any) loaded first: failing tests, time, and the plugin's report."""
  workdir.mkdir(parents=True)
  (workdir / "_hijax_trial.py").write_text(patch_module(patch))
  cmd = [args.python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-p", "_hijax_trial", "-rf", *SELECTIONS[library]]
  if on:
    cmd += ["--hijax-check-rules", "--hijax-rules-fail-on=never",
            "--hijax-rules-json", str(workdir / "rules.json"),
            f"--hijax-rules-budget={args.budget}",
            f"--hijax-rule-budget={args.rule_budget}"]
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [str(workdir), os.environ.get("PYTHONPATH", "")]))
  start = time.perf_counter()
  proc = subprocess.run(cmd, cwd=Path(args.src) / library, env=env,
                        capture_output=True, text=True)
  out = proc.stdout + proc.stderr
  failed = failed_tests(out)
  result = {"failed": failed, "returncode": proc.returncode,
            "seconds": round(time.perf_counter() - start, 1),
            "last_line": out.strip().splitlines()[-1] if out.strip() else ""}
  if on and not (workdir / "rules.json").exists():
    result["tail"] = out.strip().splitlines()[-15:]  # why no report
  if on:
    path = workdir / "rules.json"
    result["report"] = json.loads(path.read_text()) if path.exists() else {}
  return result


def _both(args, library, patch, workdir):
  """The runs without and with the plugin, side by side (same load)."""
  from concurrent.futures import ThreadPoolExecutor
  with ThreadPoolExecutor(2) as pool:
    off = pool.submit(_run, args, library, patch, False, workdir / "off")
    on = pool.submit(_run, args, library, patch, True, workdir / "on")
    return off.result(), on.result()


def _slim(report):
  """The report's rows that a reader of the results needs."""
  return {"counts": report.get("counts"),
          "rules": [{k: r.get(k) for k in ("rule", "via", "defined_at",
                                           "verdict", "detail")}
                    for r in report.get("rules", [])]}


def rejudge(results):
  """The results with every trial judged again from what they hold."""
  for trial in results.get("trials", {}).values():
    if "off_failed" in trial:
      trial.update(judge(results["baselines"][trial["library"]],
                         {"failed": trial["off_failed"],
                          "returncode": trial.get("off_returncode")},
                         {"report": trial["report"]}, trial["rule"]))
  return results


def main(argv=None):
  args = parse(argv)
  out = Path(args.out)
  old = json.loads(out.read_text()) if out.exists() else {}
  if args.rejudge:
    out.write_text(json.dumps(rejudge(old), indent=1) + "\n")
    print("\n".join(summary(old)))
    return
  trials = chosen(args.only)
  new = {"python": subprocess.run(
      [args.python, "-c", "import jax, sys; print(jax.__version__, "
       "sys.version.split()[0])"], capture_output=True, text=True,
      check=True).stdout.split(),
         "selections": SELECTIONS, "baselines": {}, "trials": {}}
  with tempfile.TemporaryDirectory() as tmp:
    for library in dict.fromkeys(t.library for t in trials):
      if args.no_baseline and library in old.get("baselines", {}):
        base = old["baselines"][library]
      else:
        off, on = _both(args, library, None, Path(tmp) / library)
        base = {"off": off, "on": {**on, "report": _slim(on["report"])},
                "budget": [args.budget, args.rule_budget]}
        print(f"baseline {library}: {len(off['failed'])} tests failing, "
              f"rules {on['report'].get('counts')}", flush=True)
      new["baselines"][library] = base
      for trial in (t for t in trials if t.library == library):
        off, on = _both(args, library, trial.patch, Path(tmp) / trial.name)
        verdict = judge(base, off, on, trial.rule)
        new["trials"][trial.name] = {
            "library": library, "kind": trial.kind, "rule": trial.rule,
            "defect": trial.what, **verdict,
            "budget": [args.budget, args.rule_budget],  # (total, per rule)
            "seconds": {"off": off["seconds"], "on": on["seconds"]},
            "off_failed": off["failed"], "off_returncode": off["returncode"],
            "last_line": {"off": off["last_line"], "on": on["last_line"]},
            **({"on_tail": on["tail"]} if "tail" in on else {}),
            "report": _slim(on.get("report") or {})}
        print(f"{trial.name}: tests {'caught' if verdict['tests_caught'] else 'missed'}, "
              f"plugin {verdict['plugin']}", flush=True)
        out.write_text(json.dumps(merge(old, new), indent=1) + "\n")
  results = merge(old, new)
  out.write_text(json.dumps(results, indent=1) + "\n")
  print("\n".join(summary(results)))


if __name__ == "__main__":
  main()
