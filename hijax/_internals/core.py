"""Adapts ``jax._src.core``: types, their matching, jaxpr printing and checks.

| internal name | why no public API serves |
| --- | --- |
| ``typematch`` | JAX's equality of types up to weak type (and its hi-type rules); ``==`` on types also compares the weak type |
| ``custom_typechecks`` | where a primitive registers its rule for ``jax.core`` jaxpr type checking; no public registry |
| ``pp_eqn_rules`` | where a primitive registers how its equation prints in a jaxpr; no public registry |
| ``pp_vars`` | prints a jaxpr's variables in the context of that printer, which a ``pp_eqn_rules`` rule must use |
| ``pytype_aval_mappings`` | how ``jax.typeof`` maps a Python class of values to its type (``register_hitype``); ``jax.core.pytype_aval_mappings`` is deprecated |
| ``shard_aval`` | one device's piece of a type inside ``jax.shard_map`` (``in_specs``); not exported |
| ``unshard_aval`` | the inverse for ``out_specs``; not exported |
| ``trace_state_clean`` | whether no transformation is tracing (an eager call, which ``hijax.implicit`` compiles once and caches); no public API says so |
| ``trace_ctx`` | the trace now running; its ``parent_trace`` links lead down the stack of transformations (``hijax.implicit`` sends an eager ``grad`` or ``vmap`` through its compiled solve); no public API exposes the stack |
| ``EvalTrace`` | the bottom of that stack when the call is eager; not exported |

Public names re-exported: ``AbstractValue``, ``ShapedArray``, ``Tracer``
(``jax.core``); ``Jaxpr``, ``Literal``, ``mapped_aval``, ``unmapped_aval``
(``jax.extend.core``); ``aval_method``, ``aval_property``
(``jax.experimental.hijax``); ``typeof`` (``jax.typeof``).
"""
from jax import typeof
from jax._src.core import (EvalTrace, custom_typechecks, pp_eqn_rules,
                           pp_vars, pytype_aval_mappings, shard_aval,
                           trace_ctx, trace_state_clean, typematch,
                           unshard_aval)
from jax.core import AbstractValue, ShapedArray, Tracer
from jax.experimental.hijax import aval_method, aval_property
from jax.extend.core import Jaxpr, Literal, mapped_aval, unmapped_aval

__all__ = [
    "AbstractValue", "EvalTrace", "Jaxpr", "Literal", "ShapedArray", "Tracer",
    "aval_method",
    "aval_property", "custom_typechecks", "mapped_aval", "pp_eqn_rules",
    "pp_vars", "pytype_aval_mappings", "shard_aval", "trace_ctx",
    "trace_state_clean",
    "typematch", "typeof",
    "unmapped_aval", "unshard_aval",
]
