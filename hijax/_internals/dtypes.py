"""Adapts ``jax._src.dtypes``: canonicalization of values.

| internal name | why no public API serves |
| --- | --- |
| ``canonicalize_value`` | converts a residual the way JAX converts an argument (e.g. to 32 bits without ``jax_enable_x64``); ``jax.dtypes.canonicalize_dtype`` converts dtypes, not values |
| ``register_canonicalize_value_handler`` | lets a hi value pass through that conversion unchanged; no public registry |

Public names re-exported: ``float0`` (``jax.dtypes``).
"""
from jax._src.dtypes import (canonicalize_value,
                             register_canonicalize_value_handler)
from jax.dtypes import float0

__all__ = ["canonicalize_value", "float0", "register_canonicalize_value_handler"]
