"""Adapts ``jax._src.api``: JAX's reading of a pytree of flags.

| internal name | why no public API serves |
| --- | --- |
| ``tuptree_flags`` | expands a tree prefix of booleans (``nzs_out``) into one flag per leaf with JAX's own rules and error messages, the same reading ``jax.vjp`` gives its flags; a private helper with no public counterpart |
"""
from jax._src.api import tuptree_flags

__all__ = ["tuptree_flags"]
