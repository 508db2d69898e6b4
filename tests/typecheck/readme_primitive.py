"""The README example, as written there (tests/test_packaging.py checks it is)."""
import jax, jax.numpy as jnp
from hijax import HiPrim

class Log1pExp(HiPrim):
  def __init__(self, x_aval):
    self.in_avals, self.out_aval, self.params = (x_aval,), x_aval, {}
    super().__init__()
  def expand(self, x):              # how to compute it (also under jit)
    return jnp.logaddexp(x, 0.)
  def vjp_fwd(self, nzs_in, x):     # forward pass: output and residuals
    return self(x), jax.nn.sigmoid(x)
  def vjp_bwd_retval(self, s, g):   # backward pass: input cotangents
    return (g * s,)

log1pexp = lambda x: Log1pExp(jax.typeof(x))(x)
print(jax.grad(log1pexp)(100.))                           # 1.0
print(jax.grad(lambda x: jnp.log(1 + jnp.exp(x)))(100.))  # nan
