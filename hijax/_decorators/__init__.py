"""`hijax.custom_vjp` and `hijax.custom_jvp`: JAX's decorators on `HiPrim`.

Each module imports only those before it: _tracing, _outputs,
_batching, _common, _vjp, _jvp (ARCHITECTURE.md says what each does).
"""
from hijax._decorators._jvp import CustomJVPCall, custom_jvp
from hijax._decorators._vjp import CustomVJPCall, custom_vjp

__all__ = ["custom_vjp", "custom_jvp", "CustomVJPCall", "CustomJVPCall"]
