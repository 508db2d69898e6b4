"""`UnaryPrim`, the constructor shared by test primitives of one array.

Many tests need a primitive of one array whose output has the input's type and
differ only in the rules they define. They subclass `UnaryPrim` and write just
those rules; the keywords given to the constructor become its ``params``.
Tests about construction itself (``__init__`` errors, params, several inputs
or outputs, hi types) spell out their ``__init__`` instead.
"""
import jax

from hijax import HiPrim


class UnaryPrim(HiPrim):
  """``in_avals = (x_aval,)``, ``out_aval = x_aval``, ``params`` from keywords.

  It defines no rule: a subclass adds `expand` and the rules its test is about.
  """

  def __init__(self, x_aval, **params):
    self.in_avals = (x_aval,)
    self.out_aval = x_aval
    self.params = params
    super().__init__()


def unary(cls, **params):
  """The function ``x -> cls(typeof(x), **params)(x)``."""
  return lambda x: cls(jax.typeof(x), **params)(x)
