"""Adapts ``jax._src.config``: the configuration a trace depends on.

| internal name | why no public API serves |
| --- | --- |
| ``trace_context`` | the hashable state of every option that changes what tracing a function gives (``jax_enable_x64``, the axis names of the ``vmap``s and the mesh in scope, ...), which ``jax.jit`` keys its own trace cache on and the decorators key theirs on; no public API returns it |
"""
from jax._src.config import trace_context

__all__ = ["trace_context"]
