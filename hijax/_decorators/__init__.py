"""`hijax.custom_vjp` and `hijax.custom_jvp`: JAX's decorators on `HiPrim`.

The modules, each importing only those listed before it:

  _arguments  keywords resolved to positions, non-differentiable arguments,
              names for messages
  _tracing    tracing a function once per call, hoisting the traced values
              it closes over; the calls running now (a rule calling ``f``)
  _outputs    what the rules return, checked, with messages in JAX's words
              then naming the function, the rule and the argument
  _batching   ``vmap``: the rules' own batching, or a `defbatch` rule
  _common     the decorator object, `Call`, one call signature, and its
              primitive (unused outputs dropped: `PrunedCall`)
  _vjp        `custom_vjp` and its primitive, `CustomVJPCall` (forward
              mode where it is not jvp_from_vjp's; methods refused)
  _jvp        `custom_jvp` and its primitive, `CustomJVPCall`
"""
from hijax._decorators._jvp import CustomJVPCall, custom_jvp
from hijax._decorators._vjp import CustomVJPCall, custom_vjp

__all__ = ["custom_vjp", "custom_jvp", "CustomVJPCall", "CustomJVPCall"]
