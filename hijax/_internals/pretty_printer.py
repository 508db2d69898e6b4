"""Adapts ``jax._src.pretty_printer``: the documents a jaxpr printer builds.

| internal name | why no public API serves |
| --- | --- |
| ``text`` | a rule in ``core.pp_eqn_rules`` must return JAX's printer documents; the printer is not public |
| ``concat`` | the same: joins such documents |
"""
from jax._src.pretty_printer import concat, text

__all__ = ["concat", "text"]
