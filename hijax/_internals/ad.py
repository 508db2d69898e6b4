"""Adapts ``jax._src.interpreters.ad``: the reverse-mode and transpose tables.

| internal name | why no public API serves |
| --- | --- |
| ``primitive_linearizations`` | the table ``jax.linearize``, ``grad`` and ``vjp`` consult for a primitive's own forward pass; ``jax.interpreters.ad`` exports only ``primitive_jvps`` and ``primitive_transposes`` |
| ``linearize_on_zero_tangents`` | the set of primitives whose linearization rule runs even when every tangent is zero (needed for refs); not exported |
| ``LinearizeTrace`` | the trace of ``jax.linearize`` and ``grad``, which ``hijax.implicit`` recognises as running over eager evaluation; ``jax.interpreters.ad`` exports only ``JVPTrace`` |
| ``fancy_transposes`` | the transpose table whose rules receive gradient accumulators (``GradAccum``), as ``vjp_bwd`` does; not exported |
| ``linearize_from_jvp`` | turns a JVP function into a primal output, residuals and a linear map; ``jax.linearize`` works on a whole function and does not take or return which tangents are symbolic zeros |

Public names re-exported: ``JVPTrace``, ``Zero``, ``instantiate_zeros``,
``primitive_jvps`` (``jax.interpreters.ad``); ``GradAccum``, ``ValAccum``, ``RefAccum``,
``NullAccum`` (``jax.experimental.hijax``).
"""
from jax._src.interpreters.ad import (LinearizeTrace, fancy_transposes,
                                      linearize_from_jvp,
                                      linearize_on_zero_tangents,
                                      primitive_linearizations)
from jax.experimental.hijax import GradAccum, NullAccum, RefAccum, ValAccum
from jax.interpreters.ad import JVPTrace, Zero, instantiate_zeros, primitive_jvps

__all__ = [
    "GradAccum", "JVPTrace", "LinearizeTrace", "NullAccum", "RefAccum",
    "ValAccum", "Zero",
    "fancy_transposes", "instantiate_zeros", "linearize_from_jvp",
    "linearize_on_zero_tangents", "primitive_jvps", "primitive_linearizations",
]
