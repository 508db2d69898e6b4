"""Check a hijax primitive's rules against each other, against finite
differences of `expand`, and against loops.

Hand-written derivative and batching rules are easy to get subtly wrong: a
backward rule that is not the transpose of the forward rule, a batching rule
that puts the batch dimension in the wrong place, an ``nzs_out`` that declares
a tangent zero when it is not. Such rules often run without error and give
plausible numbers. `check_rules` exercises every rule a primitive defines and
compares the results with an independent reference:

==================  =========================================================
mode                what is compared
==================  =========================================================
``"expand"``        the eager call and the ``jit``-compiled call with `expand`
                    evaluated directly; `expand`'s output types with
                    ``out_aval`` (for a ``jax.custom_jvp``/``custom_vjp``
                    function, the compiled call's types with its trace)
``"jvp"``           ``jax.jvp`` (the `jvp` rule) with central finite
                    differences of `expand`, differentiating all inputs and
                    each input alone (the others then get symbolic zeros),
                    element by element (see below)
``"vjp"``           ``jax.vjp`` (`vjp_fwd` with `vjp_bwd_retval` or `vjp_bwd`)
                    with the `jvp` rule through the inner-product identity
                    ``<ȳ, J ṫ> = <Jᵀ ȳ, ṫ>`` on random vectors (finite
                    differences stand in for a missing or failing `jvp`);
                    the ``nzs_out`` that `vjp_fwd` returns
``"lin"``           ``jax.linearize`` (`lin` and `linearized`) with the `jvp`
                    rule (or finite differences); `lin`'s ``nzs_out``
``"transpose"``     ``jax.linear_transpose`` (the `transpose` rule) with the
                    linear map it transposes, through the same identity
``"batch"``         ``jax.vmap`` (`batch` or `batch_dim_rule`) with a Python
                    loop over the batch, for every combination of batched and
                    unbatched arguments, with the batch axis first and last;
                    ``vmap`` of ``jvp`` and of ``vjp``, and ``jvp`` and
                    ``vjp`` of ``vmap`` (the batched instance's rules), with
                    loops
``"second_order"``  the backward pass and the tangent map, differentiated
                    again, with their finite differences; and the checks
                    above, applied to the tangent map, the backward pass and
                    the linearized map of the function, where those bind
                    hijax primitives again (a `jvp` rule that calls another
                    primitive, a backward rule that calls the primitive
                    itself, ...). A rule that declares it cannot be
                    differentiated again is reported first-order only
==================  =========================================================

Types are compared as well as values: a tangent must have the dtype of its
output and a cotangent that of its input, so a backward rule that returns
float32 cotangents fails the check in float64 even where its values are
close enough.

Finite differences judge each output element on its own: where the
function has a kink or a domain boundary within the step, or where they
cannot resolve the derivative in the dtype, the element is left out and the
report lists it under ``inconclusive``, with the reason; the others are
compared as usual. Complex inputs and outputs are checked with JAX's
convention (a complex number is the pair of its parts; a cotangent ``w``
pairs with a tangent ``t`` as ``Re(w t)``). Several ``jax.custom_jvp`` /
``custom_vjp`` functions in one program are each checked alone. What a run
evaluates under ``jit`` (the function at the finite differences' points and
every transformation under test) is compiled together, as one program, each
call running only the part a check asks for; and a run stops starting
checks once its time budget is spent (the report lists what it skipped).

A rule counts as defined when the primitive's class overrides the `HiPrim`
method (derived rules such as ``vjp_fwd, vjp_bwd_retval = vjp_from_jvp``
count). Modes whose rules are not defined are skipped, and the returned
`RuleReport` says so.

Example::

    def log1pexp(x):
      return Log1pExp(jax.typeof(x))(x)

    check_rules(log1pexp, jnp.array([-2.0, 0.5, 3.0]))

A failing check raises `RuleCheckError`, an `AssertionError` that names the
rule, the input and the largest error. In a pytest suite, call
`assert_rules`, which keeps this module's frames out of the traceback.
"""
from __future__ import annotations

# Its modules, each importing only those before it: _foreign_words (others'
# errors recognized), _report, _numerics, _finite_diff, _discovery (the
# jaxpr walk, surrogates), _compiled (the checks' program, the time
# budget), _context (the settings, the point checked, the report's writer),
# _nzs_out, _checks (with the identity of backward rules), _batching,
# _second_order, _device (the accelerator's half), _flow (one run), _api.
from hijax.testing import _report
from hijax.testing._api import assert_rules, check_rules
from hijax.testing._discovery import defined_rules, surrogate
from hijax.testing._report import (InconclusiveCheckError, RuleCheckError,
                                   RuleFailure, RuleReport)

__all__ = ["check_rules", "assert_rules", "defined_rules", "surrogate",
           "RuleCheckError", "InconclusiveCheckError", "RuleFailure",
           "RuleReport", "MODES"]

MODES = _report.MODES
"""Every mode `check_rules` knows, in the order it runs them."""

# The public names live in private modules; they say they are hijax.testing's
# (as before the split), for their reprs, pickling and the API reference.
for _obj in (check_rules, assert_rules, defined_rules, surrogate,
             RuleCheckError, InconclusiveCheckError, RuleFailure, RuleReport):
  _obj.__module__ = __name__
del _obj
