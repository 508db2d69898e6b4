"""Facts about JAX and hijax that more than one page states: one record each.

Each `Fact` says, in words, what is true (`statement`), which page shows it
in its cells (`home`), how to recognise a sentence of any page that states
it, and what such a sentence must say or must not say to be true. Its
`probe` asserts the fact itself on the JAX that runs it; the tests run every
probe on both supported releases, so the table cannot drift from JAX.

tests/test_page_consistency.py reads every page's prose (code left out) and
applies each fact to it:

- a *unit* is a paragraph, a list item, or a table cell read with its row's
  first cell and its column's header ("`hessian` | `jax.custom_vjp`:
  `TypeError`"), so a table states facts as its reader reads them;
- the unit is *about* the fact when every pattern of `context` is found in
  it; each of its sentences that matches `claim` (and not `skip`) states it;
- such a sentence is wrong when it matches `forbids`, or when neither it
  (`requires_scope="sentence"`) or its unit (`"unit"`) matches `requires`.

`wrong` holds sentences found on the pages once (or written to be wrong)
that each fact must flag, and `right` sentences it must let through: the
proof that the rules catch the contradictions they are for.

The pages keep asserting, in their own hidden cells, the behaviour they
show; they do not import this module, because a reader's downloaded
notebook has no tests/ folder beside it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

_NEGATION = r"\b(no|not|never|without|nor|cannot|can't|doesn't|does not)\b"


@dataclass(frozen=True)
class Fact:
  name: str
  statement: str
  home: str                       # the label of the section that shows it
  probe: Callable[[], None]       # asserts the fact on the installed JAX
  claim: str                      # a sentence (of a unit about it) stating it
  context: tuple[str, ...] = ()   # every one is found in a unit about it
  skip: str | None = None         # a claim matching this is about something else
  forbids: str | None = None      # what contradicts the fact
  requires: str | None = None     # what makes a statement of it true
  requires_scope: str = "sentence"
  wrong: tuple[str, ...] = ()
  right: tuple[str, ...] = field(default=())

  def problems(self, unit: str, sentences: list[str]) -> list[tuple[str, str]]:
    """(why, the sentence) for each sentence of ``unit`` that misstates the fact."""
    if not all(re.search(c, unit, re.I) for c in self.context):
      return []
    found = []
    for s in sentences:
      if not re.search(self.claim, s, re.I):
        continue
      if self.skip and re.search(self.skip, s, re.I):
        continue
      if self.forbids and re.search(self.forbids, s, re.I):
        found.append((f"contradicts: {self.statement}", s))
        continue
      scope = s if self.requires_scope == "sentence" else unit
      if self.requires and not re.search(self.requires, scope, re.I):
        found.append((f"leaves out what makes it true: {self.statement}", s))
    return found


# --- the probes: each asserts its fact on the installed JAX ------------------------

def _raises(thunk, kind=Exception, text=""):
  try:
    thunk()
  except kind as e:
    assert text in str(e), (text, str(e))
    return True
  return False


def _remat_config(flag):
  import jax
  old = jax.config.jax_remat3
  jax.config.update("jax_remat3", flag)
  return old


def probe_custom_remat_static_arguments():
  import jax
  import jax.numpy as jnp
  import numpy as np
  import hijax

  def f(x, n):
    for _ in range(n):
      x = jnp.sin(x)
    return x

  def fwd(policy, x, n):
    return f(x, n), None

  def rem(_, x, n):
    cosines = []
    for _ in range(n):
      cosines.append(jnp.cos(x))
      x = jnp.sin(x)
    return x, cosines

  def bwd(cosines, g):
    for c in reversed(cosines):
      g = g * c
    return g, None

  x = jnp.linspace(0.1, 1., 3)
  want = jax.grad(lambda x: f(x, 2).sum())(x)
  old = _remat_config(True)
  try:
    by_num = hijax.custom_remat(f, fwd, rem, bwd, static_argnums=1)
    by_name = hijax.custom_remat(f, fwd, rem, bwd, static_argnames="n")
    for g in (jax.grad(jax.checkpoint(lambda x: by_num(x, 2).sum()))(x),
              jax.grad(jax.checkpoint(lambda x: by_name(x, n=2).sum()))(x)):
      np.testing.assert_allclose(g, want, rtol=1e-6)
  finally:
    _remat_config(old)


def _jax_sin(fwd_calls_itself):
  import jax
  import jax.numpy as jnp

  @jax.custom_vjp
  def s(x):
    return jnp.sin(x)

  s.defvjp((lambda x: (s(x), x)) if fwd_calls_itself else (lambda x: (jnp.sin(x), x)),
           lambda x, g: (g * jnp.cos(x),))
  return s


def probe_custom_vjp_hessian():
  import jax
  import numpy as np

  plain, calling = _jax_sin(False), _jax_sin(True)
  np.testing.assert_allclose(jax.hessian(plain)(1.), -np.sin(1.), rtol=1e-6)
  assert _raises(lambda: jax.hessian(calling)(1.), TypeError, "forward-mode")
  for f in (plain, calling):  # forward mode of the function itself: never
    assert _raises(lambda: jax.jvp(f, (1.,), (1.,)), TypeError, "forward-mode")
    assert _raises(lambda: jax.jacfwd(f)(1.), TypeError)
    assert _raises(lambda: jax.linearize(f, 1.)[1](1.), TypeError)


def probe_custom_vjp_closures():
  import jax
  import jax.numpy as jnp
  import numpy as np

  def scaled_sin_of(c, x):
    @jax.custom_vjp
    def f(x):
      return c * jnp.sin(x)
    f.defvjp(lambda x: (c * jnp.sin(x), jnp.cos(x)), lambda cx, g: (c * cx * g,))
    return f(x)

  cs = jnp.arange(3.)
  # every transformation that traced c is still running when the rule runs
  np.testing.assert_allclose(jax.jit(jax.grad(scaled_sin_of, 1))(2., 1.), 2 * np.cos(1.),
                             rtol=1e-6)
  np.testing.assert_allclose(jax.vmap(jax.grad(scaled_sin_of, 1), (0, None))(cs, 1.),
                             cs * np.cos(1.), rtol=1e-6)
  np.testing.assert_allclose(jax.grad(lambda c: jax.grad(scaled_sin_of, 1)(c, 1.))(2.),
                             np.cos(1.), rtol=1e-6)
  # c's trace has ended: differentiated by the same grad, or traced by a jit or
  # vmap inside it; each differentiates with respect to x only but the first
  err = jax.errors.UnexpectedTracerError
  assert _raises(lambda: jax.grad(scaled_sin_of)(2., 1.), err)
  assert _raises(lambda: jax.grad(
      lambda x: jax.vmap(scaled_sin_of, (0, None))(cs, x).sum())(1.), err)
  assert _raises(lambda: jax.grad(jax.jit(scaled_sin_of), 1)(2., 1.), Exception,
                 "No constant handler")


def probe_physicalize():
  import jax
  import jax.experimental.hijax as jax_hijax
  import jax.numpy as jnp
  import hijax

  def make(m):
    def __init__(self, x_aval):
      self.in_avals, self.out_aval, self.params = (x_aval,), x_aval, {}
      m.HiPrim.__init__(self)
    return type("Sin", (m.HiPrim,), dict(
        __init__=__init__, expand=lambda self, x: jnp.sin(x),
        physicalize=lambda self, ctx, *args: None))

  cls = make(jax_hijax)
  assert float(cls(jax.typeof(1.))(1.)) == float(jnp.sin(1.))
  assert _raises(lambda: make(hijax), TypeError, "physicalize")


def probe_batch_dim_rule():
  import jax
  import jax.experimental.hijax as jax_hijax
  import jax.numpy as jnp
  import numpy as np
  import hijax

  def make(m):
    def __init__(self, x_aval):
      self.in_avals, self.out_aval, self.params = (x_aval,), x_aval, {}
      m.HiPrim.__init__(self)
    return type("Sin", (m.HiPrim,), dict(
        __init__=__init__, expand=lambda self, x: jnp.sin(x),
        batch_dim_rule=lambda self, axis_data, dims: dims[0]))

  xs = jnp.linspace(0., 1., 3)
  run = lambda m: jax.vmap(lambda x: make(m)(jax.typeof(x))(x))(xs)
  np.testing.assert_allclose(run(hijax), np.sin(xs), rtol=1e-6)
  # JAX's module: with 0.11.2 (no `vmap_rule` yet) the rule is used; 0.12 has
  # no batch_dim_rule, and its vmap asks for `batch`
  if hasattr(jax_hijax, "vmap_rule"):
    assert not hasattr(jax_hijax.HiPrim, "batch_dim_rule")
    assert _raises(lambda: run(jax_hijax), NotImplementedError, "batch")
  else:
    np.testing.assert_allclose(run(jax_hijax), np.sin(xs), rtol=1e-6)


def probe_custom_vmap_reverse_mode():
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.custom_batching import custom_vmap

  @custom_vmap
  def softplus(x):
    return jnp.logaddexp(x, 0.)

  softplus.def_vmap(lambda n, batched, x: (jnp.logaddexp(x, 0.) * 1., batched[0]))
  xs = jnp.array([-2., 0., 3.])
  # rtol: a TPU's float32 exp and log1p are tens to thousands of units in the
  # last place off (docs/accelerator-results.json, "transcendental"); there
  # the two paths to sigmoid(-2) differ by 4.9e-6, a wrong rule by far more
  np.testing.assert_allclose(jax.grad(lambda v: jax.vmap(softplus)(v).sum())(xs),
                             jax.nn.sigmoid(xs), rtol=1e-4)
  assert _raises(lambda: jax.grad(softplus)(1.))
  assert _raises(lambda: jax.vmap(jax.grad(softplus))(xs))


def probe_check_rules_batched_derivatives():
  import jax.numpy as jnp
  import hijax
  from hijax.testing import check_rules

  @hijax.custom_vjp
  def f(x):
    return jnp.sin(x)
  f.defvjp(lambda x: (f(x), x), lambda x, g: (g * jnp.cos(x),))
  ran = check_rules(f, jnp.ones(3), order=1).ran
  for what in ("jvp of vmap", "vjp of vmap", "vmap of jvp", "vmap of vjp"):
    assert any(what in r for r in ran), (what, ran)


def probe_nondiff_argnums_unhashable():
  from functools import partial
  import jax
  import numpy as np

  @partial(jax.custom_vjp, nondiff_argnums=(0,))
  def scale(factors, x):
    return factors[0] * x
  scale.defvjp(lambda factors, x: (scale(factors, x), None),
               lambda factors, _, g: (factors[0] * g,))
  np.testing.assert_allclose(jax.grad(lambda x: scale([3.], x))(1.), 3.)


def probe_debug_nans_cause():
  import traceback
  import jax
  import jax.numpy as jnp

  def norm_of(x):
    y = x - jnp.mean(x)
    n = jnp.sqrt(jnp.sum(y * y))
    return jnp.sum(y / (n + 1e-6))

  try:
    with jax.debug_nans(True):
      jax.grad(norm_of)(jnp.ones(3))
  except FloatingPointError as e:
    frames = traceback.extract_tb(e.__cause__.__traceback__)
    assert any(f.name == "norm_of" and "jnp.sqrt" in f.line for f in frames), frames
  else:
    raise AssertionError("jax_debug_nans did not raise")


def probe_platforms_limit_backends():
  """JAX has only the backends JAX_PLATFORMS names: with it set to one
  platform, asking for another's devices raises. (On a CPU-only machine the
  mirror of JAX_PLATFORMS=tpu, which leaves out the CPU.)"""
  import os
  import subprocess
  import sys
  code = ("import jax\n"
          "try:\n  jax.devices('tpu')\nexcept RuntimeError as e:\n  print('refused:', e)\n"
          "print(sorted({d.platform for d in jax.devices()}))\n")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                       text=True, check=True).stdout
  assert "refused:" in out and "['cpu']" in out, out


def _tpu_record():
  """docs/accelerator-results.json: the runs on a TPU v5e."""
  import json
  from pathlib import Path
  path = Path(__file__).resolve().parent.parent / "docs" / "accelerator-results.json"
  return json.loads(path.read_text())


_TPU_RUNS = ("before", "after", "third", "fourth", "fifth", "sixth", "seventh", "eighth")


def probe_tpu_call_cost():
  import re
  output = _tpu_record()["fourth"]["bench"]["bench_call_cost"]["output"]
  us = {m[1]: float(m[2]) for m in re.finditer(r"^(\S.*?\S)\s+([\d.]+) us$", output, re.M)}
  # a call: about half a millisecond, whatever it computes
  assert all(400 < us[k] < 700 for k in ("add", "jnp.solve", "hijax throw=False",
                                         "root throw=False", "optx root throw=False"))
  # a host callback in the program, even in a branch never taken: about 2 ms more
  assert 1500 < us["add+cond(io_callback)"] - us["add"] < 2500
  for solve in ("hijax", "root", "optx root"):
    assert 1500 < us[f"{solve} throw=True"] - us[f"{solve} throw=False"] < 2500


def probe_tpu_latest_runs():
  record = _tpu_record()
  latest = {}
  for label in _TPU_RUNS:
    for part in ("tests", "pages"):
      for name, result in record[label].get(part, {}).items():
        latest[part, name] = label, result
  # each file's and page's latest result passed ...
  assert not [k for k, (_, r) in latest.items()
              if r["failed"] or r.get("error", 0) or r.get("not run", 0)]
  # ... in runs of different commits: 19 pages' latest is the fourth's, and
  # runs after it found failures that were fixed
  assert sum(label == "fourth" for (part, _), (label, _) in latest.items()
             if part == "pages") == 19
  assert "'fourth' ran at 9338683" in record["about"]
  assert sum(t["failed"] for t in record["fifth"]["tests"].values()) > 0


# --- the facts ---------------------------------------------------------------------

# JAX's decorator, not hijax's (whose forward mode always works)
_JAX_CUSTOM_VJP = r"(?<!hijax\.)\bcustom_vjp(?![_\w])"
_HESSIAN = r"\bhessians?\b|forward-over-reverse|\bjvp\(grad"
_FWD_QUALIFIER = (
    r"calls? (the function|itself|`?\w+`? (itself|again))|"
    r"(computes?|written) [^.|]{0,40}(plain operations|inline)|"
    r"forward (function|rule)[^.|]{0,60}(calls|plain|inline)|"
    r"`fwd`[^.|]{0,60}(calls|plain|inline)")

FACTS = [
    Fact(
        name="custom_remat-static-arguments",
        statement="hijax.custom_remat takes static_argnums and static_argnames, "
                  "which work with jax 0.11.2 and 0.12 (unlike jax 0.11.2's own "
                  "jax.custom_remat's)",
        home="jax-301-portability",
        probe=probe_custom_remat_static_arguments,
        context=(r"(?<!\bjax\.)custom_remat",),
        claim=r"\bstatic",
        skip=r"\bjax\.custom_remat|jax 0\.11\.2 exports",
        forbids=_NEGATION + r"[^.;,]{0,30}\bstatic|\bstatic[\w` ]{0,40}\b"
                r"(fail|unsupported|not supported|refused|ignored)",
        wrong=("JAX itself had a `custom_remat` for a while. `hijax.custom_remat` "
               "works with both versions; it takes no static arguments (close "
               "over them, or pass them as ordinary arguments).",
               "`custom_remat` has no static arguments."),
        right=("`hijax.custom_remat` takes `static_argnums` and `static_argnames`, "
               "as `jax.jit` does.",
               "`custom_remat` | jax 0.11.2: `jax.custom_remat`; its "
               "`static_argnums` and `static_argnames` fail at the call"),
    ),
    Fact(
        name="custom_vjp-hessian",
        statement="jax.hessian of a jax.custom_vjp function works when its fwd "
                  "computes the output with plain operations, and raises when fwd "
                  "calls the function itself (jvp, jacfwd and linearize of the "
                  "function always raise)",
        home="jax-301-custom-vjp-forward-mode",
        probe=probe_custom_vjp_hessian,
        context=(_JAX_CUSTOM_VJP,),
        claim=_HESSIAN,
        forbids=r"no forward[- ]mode,?\s+(and\s+)?(so|hence|therefore|thus|so there "
                r"is)\s+no\b",
        requires=_FWD_QUALIFIER + "|jax-301-custom-vjp-forward-mode",
        requires_scope="unit",
        wrong=("`jvp`, `jacfwd`, `hessian`, `linearize` | `jax.custom_vjp`: "
               "`TypeError`",
               "Written as a `custom_vjp`, an adjoint solver has no forward mode "
               "and so no `jax.hessian`.",
               "The Hessian of a `custom_vjp` function fails."),
        right=("`jax.hessian` of a `custom_vjp` function runs when its forward "
               "function computes the output with plain operations.",
               "For the Hessian see {ref}`jax-301-custom-vjp-forward-mode`; "
               "`custom_vjp` has no forward mode.",
               "`hessian` | `hijax.custom_vjp`: yes, from `bwd`"),
    ),
    Fact(
        name="custom_vjp-closures",
        statement="the rules of a jax.custom_vjp function may close over a "
                  "traced value only while every transformation that traced it "
                  "is still running when the backward pass runs: not when the "
                  "same grad differentiates it, nor when a jit or vmap inside "
                  "the grad traced it (grad(jit(f)) and grad outside a vmap "
                  "fail even for a derivative in x only)",
        home="jax-301-custom-vjp-closures",
        probe=probe_custom_vjp_closures,
        context=(r"(?<!hijax\.)\bcustom_[jv]{2}p(?![_\w])|decorator",
                 r"\bclos(e|es|ed|ing|ure|ures)\b"),
        claim=r"\b(fine|safe|works?|allowed|ok(ay)?)\b[^.]{0,60}\b(as long as|so long "
              r"as|provided|only if|only when|if|when|unless)\b",
        requires=r"\btrac(e|es|er|ed|ing)\b",
        wrong=("A `custom_vjp` function is often built inside another function "
               "and closes over some of its values. That is fine as long as the "
               "differentiation that meets the rule is not also differentiating "
               "the closed-over value.",),
        right=("A `custom_vjp` function may close over a traced value as long as "
               "the transformations that traced it are still running when its "
               "rule runs.",),
    ),
    Fact(
        name="import-swap-physicalize",
        statement="code written for jax.experimental.hijax runs on hijax by "
                  "changing the import, except a HiPrim defining `physicalize` "
                  "(the Pallas fuser's hook), which hijax refuses",
        home="jax-301-portability",
        probe=probe_physicalize,
        claim=r"\b(chang\w*|swap\w*|replac\w*)\s+(the|one|its|an?)\s+import|"
              r"reads `from hijax import|\bdiffers? on purpose\b[^.]{0,80}\(",
        skip=r"custom_vjp|decorator",
        requires=r"physicalize",
        requires_scope="unit",
        wrong=("It follows the API of `jax.experimental.hijax`: code written for "
               "JAX's module runs on `hijax` by changing one import.",
               "hijax differs on purpose in a few places (equality compares types "
               "too; `jax.experimental.jet` raises instead of ignoring a "
               "primitive's rules)."),
        right=("Code written for JAX's module runs on `hijax` by changing one "
               "import, unless a primitive defines `physicalize`.",),
    ),
    Fact(
        name="batch_dim_rule-jax-0.12",
        statement="jax 0.12's own HiPrim has no batch_dim_rule (0.11.2's has): "
                  "hijax derives the batched rules from it with either release",
        home="jax-301-portability",
        probe=probe_batch_dim_rule,
        context=(r"batch_dim_rule",),
        claim=r"\bJAX\b(?! 0\.11)[^.;]{0,15}\b(works out|derives)\b",
        requires=r"0\.12|0\.11",
        wrong=("`batch_dim_rule` returns only the batch dimension of the result. JAX works out "
               "the batched computation itself, by `vmap`-ing `expand` and your "
               "other rules.",),
        right=("hijax works out the batched computation itself.",),
    ),
    Fact(
        name="custom_vmap-reverse-mode",
        statement="grad of a custom_vmap function raises, but grad of its vmap "
                  "runs and differentiates the batching rule's code",
        home="jax-301-custom-batching",
        probe=probe_custom_vmap_reverse_mode,
        context=(r"custom_vmap",),
        claim=_NEGATION + r"[^.;]{0,25}reverse[- ]mode|reverse[- ]mode[^.;]{0,15}"
              r"\b(fails|raises)",
        requires=r"grad\W{0,3}(of\W{0,3})?\W?vmap|`grad\(vmap",
        requires_scope="unit",
        wrong=("A `custom_vmap` gives a function the first but has no reverse "
               "mode of its own.",
               "a batched implementation, differentiable | `jax.custom_vjp`: no "
               "(`custom_vmap` has no reverse mode)"),
        right=("`custom_vmap` alone supports forward mode and `vmap`, not reverse "
               "mode; `grad(vmap(f))` differentiates the batching rule's code.",),
    ),
    Fact(
        name="check_rules-batched-derivatives",
        statement="hijax.testing.check_rules differentiates the batched program "
                  "(jvp and vjp of vmap, and vmap of jvp and vjp, against a loop)",
        home="jax-301-checking-rules",
        probe=probe_check_rules_batched_derivatives,
        claim=r"\b(does not|doesn't|do not|don't|never|not)\s+(\w+\s+){0,3}"
              r"differentiat\w*\s+(\w+\s+){0,3}(batched|vmap)",
        forbids=r".",
        wrong=("`check_rules` compares `vmap` of each rule with a loop; it does "
               "not differentiate the batched program.",
               "It never differentiates the vmapped function."),
        right=("`check_rules` differentiates the batched program too: it compares "
               "`jvp` and `vjp` of `vmap` with a loop.",),
    ),
    Fact(
        name="nondiff_argnums-unhashable",
        statement="nondiff_argnums needs a value that is not traced, not a "
                  "hashable one (an unhashable list works)",
        home="jax-301-custom-jvp-vjp",
        probe=probe_nondiff_argnums_unhashable,
        claim=r"nondiff_argnums[^.]*\b(needs?|requires?|must be|takes?)\s+(an?\s+)?"
              r"hashable\b",
        forbids=r".",
        wrong=("`nondiff_argnums` needs a hashable Python value, not a traced "
               "array.",),
        right=("`nondiff_argnums` needs a value that is not traced; it need not "
               "be hashable.",),
    ),
    Fact(
        name="debug_nans-cause",
        statement="jax_debug_nans's error leads to the user's forward code (in "
                  "its cause), not into JAX's",
        home="jax-301-nan-gradients",
        probe=probe_debug_nans_cause,
        claim=r"traceback into JAX'?s own",
        forbids=r".",
        wrong=("It names the primitive and gives a traceback into JAX's own "
               "differentiation code rather than a position in yours.",),
    ),    Fact(
        name="tpu-call-cost",
        statement="on a TPU v5e a jitted call costs about half a millisecond, "
                  "whatever it computes; a program that holds a host callback "
                  "(a solve with throw=True) costs about 2 ms more a call",
        home="jax-301-accelerator-call-cost",
        probe=probe_tpu_call_cost,
        context=(r"\bTPU\b|\baccelerator",),
        claim=r"(?=.*\bcalls?\b)(?=.*(?<![\w.])(2|two)(\.\d+)?\s?(ms|milliseconds?)\b)",
        requires=r"callback|throw=True",
        wrong=("Every jitted hijax call took about 2 ms on the TPU, whatever the "
               "problem, and the peers' calls as long (the ratios are near 1): a "
               "fixed cost per call, not the arithmetic.",
               "On a TPU a call costs about 2 ms, whatever it computes."),
        right=("On a TPU a jitted call costs about half a millisecond. A call of a "
               "program that holds a host callback costs about 2 ms more.",
               "On a TPU a small solve costs about 2.4 ms a call with `throw=True`.",
               "On a TPU v5e the same solves took 0.8 to 1.2 ms each: about half "
               "a millisecond of each is what any call costs there."),
    ),
    Fact(
        name="tpu-latest-runs",
        statement="each test file's and page's latest result on the TPU passed, at "
                  "the commit of its run; the runs span commits, so a latest "
                  "result can predate later changes (19 pages last ran in full "
                  "at 9338683, before failures found after it were fixed)",
        home="jax-301-accelerator-results",
        probe=probe_tpu_latest_runs,
        claim=r"\blatest (run|result)s?\b[^.;]*\bpassed\b",
        requires=r"\bcommits?\b|\bpredates?\b",
        requires_scope="unit",
        wrong=("Every test file of the unit suite and every page have run on a TPU "
               "v5e, in eight calls, and each file's and page's latest run there "
               "passed.",),
        right=("The latest result of each of the 66 test files and 24 pages "
               "passed, at the commit of its run.",),
    ),
    Fact(
        name="host-cpu-needs-jax_platforms",
        statement="JAX has a host CPU backend beside an accelerator only where "
                  "JAX_PLATFORMS is unset or names cpu: with JAX_PLATFORMS=tpu "
                  "(or gpu) there is none, and check_rules' float64 half runs on "
                  "the accelerator",
        home="jax-301-checking-on-an-accelerator",
        probe=probe_platforms_limit_backends,
        claim=r"\bhost\b[^.]{0,60}\b(beside|alongside|next to|with) every "
              r"accelerator|\bevery accelerator\b[^.]{0,40}\bhost\b|"
              r"\balways (has|have)\b[^.]{0,20}\b(host|CPU)\b",
        forbids=r".",
        wrong=("1. on the host CPU, which JAX has beside every accelerator, "
               "everything as above, in float64: the sharp verdict on the rules' "
               "logic;",
               "JAX always has a host CPU, so the float64 checks run there."),
        right=("JAX has a CPU backend beside the accelerator unless "
               "`JAX_PLATFORMS` leaves it out.",),
    ),
]
