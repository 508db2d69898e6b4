"""HiPrim construction, binding, jaxprs, type checks and missing-rule errors."""
from collections import namedtuple
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hijax
from hijax import HiPrim, ShapedArray

from unary_prim import UnaryPrim


class Sin(UnaryPrim):
  def expand(self, x):
    return jnp.sin(x)


def sin(x):
  return Sin(jax.typeof(x))(x)


class Scale(HiPrim):
  """Keyword-only constructor argument, a param used as an attribute."""

  def __init__(self, x_aval, *, factor):
    self.in_avals = (x_aval,)
    self.out_aval = x_aval
    self.params = dict(factor=factor)
    super().__init__()

  def expand(self, x):
    return self.factor * x


def test_params_become_attributes_and_keyword_only_args_work():
  p = Scale(jax.typeof(1.), factor=3.)
  assert p.factor == 3.
  assert p(2.) == 6.


def test_params_must_be_hashable():
  with pytest.raises(TypeError, match=r"Scale.params\['factor'\].*not hashable"):
    Scale(jax.typeof(1.), factor=[1, 2])


def test_equal_params_give_equal_primitives():
  a = Scale(jax.typeof(1.), factor=2.)
  assert a == Scale(jax.typeof(1.), factor=2.)
  assert hash(a) == hash(Scale(jax.typeof(1.), factor=2.))
  assert a != Scale(jax.typeof(1.), factor=3.)


@pytest.mark.parametrize("missing", ["in_avals", "out_aval", "params"])
def test_init_must_set_the_three_attributes(missing):
  class Bad(HiPrim):
    def __init__(self):
      values = dict(in_avals=(jax.typeof(1.),), out_aval=jax.typeof(1.),
                    params={})
      for k, v in values.items():
        if k != missing:
          setattr(self, k, v)
      super().__init__()

  with pytest.raises(AttributeError, match=f"Bad.__init__ must set `self.{missing}`"):
    Bad()


def test_in_avals_must_be_a_tuple_of_types():
  class NotTuple(HiPrim):
    def __init__(self, aval):
      self.in_avals, self.out_aval, self.params = aval, aval, {}
      super().__init__()

  with pytest.raises(TypeError, match=r"NotTuple.in_avals must be a tuple"):
    NotTuple(jax.typeof(1.))

  class NotTypes(HiPrim):
    def __init__(self, x):
      self.in_avals, self.out_aval, self.params = (x,), jax.typeof(x), {}
      super().__init__()

  with pytest.raises(TypeError, match=r"NotTypes.in_avals must contain types"):
    NotTypes(jnp.ones(3))


def test_eager_call_runs_expand_every_time():
  calls = []

  class Counted(Sin):
    def expand(self, x):
      calls.append(x)
      return jnp.sin(x)

  f = lambda x: Counted(jax.typeof(x))(x)
  np.testing.assert_allclose(f(1.), np.sin(1.), rtol=1e-6)
  f(1.)
  assert len(calls) == 2


def test_jit_records_one_equation_named_after_the_class():
  jaxpr = jax.jit(sin).trace(1.).jaxpr
  assert [str(e.primitive) for e in jaxpr.eqns] == ["Sin"]
  assert "Sin a" in str(jaxpr)
  jaxpr = jax.make_jaxpr(lambda x: Scale(jax.typeof(x), factor=2.)(x))(1.)
  assert "Scale[factor=2.0] a" in str(jaxpr)


def test_expand_traced_only_when_lowering_and_jit_is_cached():
  traced = []

  class Lazy(Sin):
    def expand(self, x):
      traced.append(1)
      return jnp.sin(x)

  f = jax.jit(lambda x: Lazy(jax.typeof(x))(x))
  jax.make_jaxpr(lambda x: Lazy(jax.typeof(x))(x))(1.)
  assert traced == []  # staging a jaxpr does not expand
  assert f(1.) == jnp.sin(1.)
  assert traced == [1]
  f(2.)
  assert traced == [1]  # cached


def test_compiled_hlo_matches_plain_expand():
  hlo_prim = jax.jit(sin).lower(1.).as_text()
  hlo_plain = jax.jit(jnp.sin).lower(1.).as_text()
  assert "sine" in hlo_prim
  assert hlo_prim.count("stablehlo.sine") == hlo_plain.count("stablehlo.sine") == 1


def test_python_control_flow_in_expand_eagerly():
  class Branchy(Sin):
    def expand(self, x):
      return jnp.sin(x) if x > 0 else jnp.cos(x)

  f = lambda x: Branchy(jax.typeof(x))(x)
  assert f(1.) == jnp.sin(1.)
  assert f(-1.) == jnp.cos(-1.)


def test_lax_control_flow_in_expand():
  class Loops(Sin):
    def expand(self, x):
      y = jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 2),
                             (0, x))[1]
      y, _ = jax.lax.scan(lambda c, _: (c + 1., None), y, None, length=2)
      return jax.lax.cond(y > 0, jnp.sin, jnp.cos, y)

  f = lambda x: Loops(jax.typeof(x))(x)
  np.testing.assert_allclose(f(1.), np.sin(10.), rtol=1e-6)
  np.testing.assert_allclose(jax.jit(f)(-3.), np.cos(-22.), rtol=1e-6)


def test_argument_type_is_checked_on_every_bind():
  p = Sin(jax.typeof(jnp.ones(3)))
  with pytest.raises(TypeError, match=r"Sin: argument 0 has type float32\[4\], "
                     r"but in_avals declares float32\[3\]"):
    p(jnp.ones(4))
  with pytest.raises(TypeError, match=r"int32\[3\].*float32\[3\]"):
    jax.jit(p)(jnp.ones(3, jnp.int32))


def test_argument_type_error_names_the_pytree_position():
  Pt = namedtuple("Pt", "x y")

  class Norm(HiPrim):
    def __init__(self, a, pt):
      self.in_avals = (a, pt)
      self.out_aval = pt.y  # the type of a + pt.x * pt.y
      self.params = {}
      super().__init__()

    def expand(self, a, pt):
      return a + pt.x * pt.y

  avals = (jax.typeof(1.), Pt(jax.typeof(1.), jax.typeof(jnp.ones(2))))
  p = Norm(*avals)
  assert p(1., Pt(2., jnp.ones(2))).shape == (2,)
  with pytest.raises(TypeError, match=r"argument 1\.y has type float32\[3\]"):
    p(1., Pt(2., jnp.ones(3)))
  with pytest.raises(TypeError, match=r"pytree structure"):
    p(1., (2., jnp.ones(2)))
  with pytest.raises(TypeError, match=r"takes 2 positional argument"):
    p(1.)


def test_expand_result_structure_is_checked():
  class Wrong(Sin):
    def expand(self, x):
      return (x, x)

  with pytest.raises(TypeError, match=r"Wrong.expand returned a value with structure"):
    Wrong(jax.typeof(1.))(1.)


def test_shaped_array_out_aval():
  class Total(HiPrim):
    def __init__(self, x_aval):
      self.in_avals = (x_aval,)
      self.out_aval = ShapedArray((), x_aval.dtype)
      self.params = {}
      super().__init__()

    def expand(self, x):
      return x.sum()

  x = jnp.arange(4.)
  assert Total(jax.typeof(x))(x) == 6.
  assert jax.jit(lambda x: Total(jax.typeof(x))(x))(x) == 6.


@pytest.mark.parametrize("transform, methods", [
    (lambda f: jax.grad(f), r"vjp_fwd.*vjp_bwd_retval.*vjp_from_jvp"),
    (lambda f: lambda x: jax.jvp(f, (x,), (1.,)), r"jvp\(self, primals, tangents\)"),
    (lambda f: lambda x: jax.linearize(f, x), r"lin\(self, nzs_in.*linearize_from_jvp"),
    (lambda f: jax.vmap(f), r"batch_dim_rule.*batch\(self"),
    (lambda f: lambda x: jax.linear_transpose(f, x)(x), r"transpose\(self, ct"),
])
def test_missing_rule_names_the_methods_to_implement(transform, methods):
  x = 1. if "batch" not in methods else jnp.ones(3)
  with pytest.raises(NotImplementedError, match="Sin .*" + methods):
    transform(sin)(x)


def test_missing_expand():
  class NoExpand(UnaryPrim):
    """Defines no expand, and no rule."""

  with pytest.raises(NotImplementedError, match=r"NoExpand must implement `expand"):
    NoExpand(jax.typeof(1.))(1.)


def test_effects_free_primitive_is_dead_code_eliminated():
  f = jax.jit(lambda x: (sin(x), x * 2)[1])
  jaxpr = jax.make_jaxpr(f)(1.)
  from jax._src.interpreters import partial_eval as pe
  inner = jaxpr.eqns[0].params["jaxpr"].jaxpr
  dced, _ = pe.dce_jaxpr(inner, [True])
  assert "Sin" not in str(dced)
  assert f(3.) == 6.


def test_an_unhashable_type_is_named_when_jax_hashes_the_primitive():
  @dataclasses.dataclass  # not frozen, so not hashable
  class ListTy(hijax.HiType):
    n: int

  class Ident(HiPrim):
    def __init__(self, x_aval):
      self.in_avals, self.out_aval, self.params = (x_aval,), x_aval, {}
      super().__init__()

    def expand(self, x):
      return x

  p = Ident(ListTy(3))  # construction does not hash the types (eager calls never do)
  with pytest.raises(TypeError, match=r"Ident.in_avals contains the type "
                     r"ListTy, which is not hashable: write a hi type as a "
                     r"frozen dataclass"):
    hash(p)
