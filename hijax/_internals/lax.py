"""Adapts ``jax._src.lax.lax``: setting a value's weak type.

| internal name | why no public API serves |
| --- | --- |
| ``_convert_element_type`` | gives a rule's output the declared weak type without changing its dtype; ``jax.lax.convert_element_type`` always makes the result strongly typed |
"""
from jax._src.lax.lax import _convert_element_type

__all__ = ["_convert_element_type"]
