"""Adapts ``jax._src.interpreters.batching``: batch-axis markers.

| internal name | why no public API serves |
| --- | --- |
| ``BatchTrace`` | the trace of ``vmap``, which ``hijax.implicit`` recognises as running over eager evaluation; not exported |
| ``infer`` | the marker that asks ``vmap`` inside a rule to infer an output's batch axis; not exported |
| ``sum_axis`` | the marker for a cotangent whose batch axis is summed over; not exported |

Public names re-exported: ``fancy_primitive_batchers``
(``jax.interpreters.batching``).
"""
from jax._src.interpreters.batching import BatchTrace, infer, sum_axis
from jax.interpreters.batching import fancy_primitive_batchers

__all__ = ["BatchTrace", "fancy_primitive_batchers", "infer", "sum_axis"]
