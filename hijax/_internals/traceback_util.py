"""Adapts ``jax._src.traceback_util``: which frames tracebacks hide.

| internal name | why no public API serves |
| --- | --- |
| ``register_exclusion`` | hides hijax's own frames from the tracebacks JAX filters, as JAX hides its own; no public API |
"""
from jax._src.traceback_util import register_exclusion

__all__ = ["register_exclusion"]
