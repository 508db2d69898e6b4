"""Adapts ``jax._src.interpreters.partial_eval``: staging and DCE.

| internal name | why no public API serves |
| --- | --- |
| ``custom_staging_rules`` | where a primitive registers how ``jit`` records it (one equation, the jaxpr marked as holding a high primitive); no public registry |
| ``_default_dce_rule`` | only inspected by ``hijax._compat``: the number of its parameters tells the supported JAX versions' DCE rule signatures apart |

Public names re-exported: ``dce_jaxpr``, ``dce_rules``
(``jax.interpreters.partial_eval``).
"""
from jax._src.interpreters.partial_eval import (_default_dce_rule,
                                                custom_staging_rules)
from jax.interpreters.partial_eval import dce_jaxpr, dce_rules

__all__ = ["_default_dce_rule", "custom_staging_rules", "dce_jaxpr",
           "dce_rules"]
