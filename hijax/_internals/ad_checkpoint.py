"""Adapts ``jax._src.ad_checkpoint``: what remat policies and residuals see.

| internal name | why no public API serves |
| --- | --- |
| ``name_p`` | the primitive ``jax.ad_checkpoint.checkpoint_name`` binds, which a name policy recognises in the equations it is shown; only the function is public |
| ``saved_residuals`` | the residuals reverse mode saves, as data; the public ``jax.ad_checkpoint.print_saved_residuals`` only prints them |
"""
from jax._src.ad_checkpoint import name_p, saved_residuals

__all__ = ["name_p", "saved_residuals"]
