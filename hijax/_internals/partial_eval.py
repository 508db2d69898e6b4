"""Adapts ``jax._src.interpreters.partial_eval``: staging and DCE.

| internal name | why no public API serves |
| --- | --- |
| ``Saveable`` | what a ``jax.checkpoint`` policy returns to save a value (``hijax.SaveAndOffloadOnlyTheseNames``); JAX's public policies return it, but it is not exported |
| ``Offloadable`` | what a policy returns to save a value in another memory kind; likewise |
| ``Recompute`` | what a policy returns to recompute a value; likewise |
| ``custom_staging_rules`` | where a primitive registers how ``jit`` records it (one equation, the jaxpr marked as holding a high primitive); no public registry |
| ``_default_dce_rule`` | only inspected by ``hijax._compat``: the number of its parameters tells the supported JAX versions' DCE rule signatures apart |

Public names re-exported: ``dce_jaxpr``, ``dce_rules``
(``jax.interpreters.partial_eval``).
"""
from jax._src.interpreters.partial_eval import (Offloadable, Recompute,
                                                Saveable, _default_dce_rule,
                                                custom_staging_rules)
from jax.interpreters.partial_eval import dce_jaxpr, dce_rules

__all__ = ["Offloadable", "Recompute", "Saveable", "_default_dce_rule",
           "custom_staging_rules", "dce_jaxpr", "dce_rules"]
