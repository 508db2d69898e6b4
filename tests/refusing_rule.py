"""A rule that refuses differentiation by design, as equinox's
``nondifferentiable`` does: a custom_jvp whose jvp rule raises saying the
value cannot be differentiated. Used by tests/test_testing_verdicts.py and,
as a file of a pytester run, by tests/test_plugin.py."""
import functools

import jax


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def guarded(msg, x):
  return x


@guarded.defjvp
def _guarded_jvp(msg, primals, tangents):
  raise RuntimeError(msg)


def no_grad(x):
  """x, refusing to be differentiated."""
  return guarded("Unexpected tangent. This operation cannot be "
                 "autodifferentiated.", x)
