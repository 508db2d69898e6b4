"""Adapts ``jax._src.interpreters.remat``: the rule table of ``jax_remat3``.

| internal name | why no public API serves |
| --- | --- |
| ``rules`` | where a primitive registers its rule for the new ``jax.checkpoint`` implementation (``jax_remat3``); no public registry |
| ``RematTrace`` | only inspected by ``hijax._compat``: its source tells the supported JAX versions' rule signatures apart |
"""
from jax._src.interpreters.remat import RematTrace, rules

__all__ = ["RematTrace", "rules"]
