"""Adapts ``jax._src.interpreters.batching``: batch-axis markers.

| internal name | why no public API serves |
| --- | --- |
| ``bdim_at_front`` | moves a batch axis to the front, or broadcasts an unbatched value along a new leading axis with the sharding of ``vmap``'s explicit mesh axis (for ``hijax.bdims_at_front`` on jax 0.11.2, where ``jax.experimental.hijax`` lacks it); ``jnp.moveaxis`` and ``jnp.broadcast_to`` do not place the new axis on a mesh axis |
| ``BatchTrace`` | the trace of ``vmap``, which ``hijax.implicit`` recognises as running over eager evaluation; not exported |
| ``infer`` | the marker that asks ``vmap`` inside a rule to infer an output's batch axis; not exported |
| ``sum_axis`` | the marker for a cotangent whose batch axis is summed over; not exported |

Public names re-exported: ``fancy_primitive_batchers``
(``jax.interpreters.batching``).
"""
from jax._src.interpreters.batching import (BatchTrace, bdim_at_front, infer,
                                             sum_axis)
from jax.interpreters.batching import fancy_primitive_batchers

__all__ = ["BatchTrace", "bdim_at_front", "fancy_primitive_batchers", "infer",
           "sum_axis"]
