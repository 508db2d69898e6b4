"""Smaller contracts of the core, each pinned by value or by message.

Written against the survivors of tools/mutants.py: every test here fails on
a one-token change to the code it names (a dropped check, a value returned
early, an index off by one), which the larger tests did not notice.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hijax import HiPrim, Zero, instantiate_zeros, vjp_from_jvp
from hijax._util import Static
import hitype_examples as hx
from unary_prim import UnaryPrim, unary

X = jnp.array([0.3, -0.8, 1.1])


# --- what vjp_fwd and vjp_bwd_retval may return -------------------------------------

class Cube(UnaryPrim):
  """x ** 3; `form` picks the shape of what the rules return."""

  def expand(self, x):
    return x ** 3

  def vjp_fwd(self, nzs_in, x):
    if self.form == "pair":
      return self(x), x
    if self.form == "triple":
      return self(x), x, True
    return self(x), x, True, {"x2": x * x}  # structured residuals

  def vjp_bwd(self, res, *rest):
    *sres, g, acc = rest
    x2 = sres[0]["x2"] if sres else res * res
    acc.accum(3 * x2 * g)
    return {"g": g}


@pytest.mark.parametrize("form", ["pair", "triple", "quadruple"])
def test_vjp_fwd_may_return_two_three_or_four_values(form):
  f = unary(Cube, form=form)
  np.testing.assert_allclose(jax.grad(f)(0.5), 0.75, rtol=1e-6)
  _, f_vjp = jax.vjp(f, 0.5)
  (g,), logs = f_vjp.with_logs(2.)
  np.testing.assert_allclose(g, 1.5, rtol=1e-6)
  assert logs == {"g": 2.}


class FiveTuple(UnaryPrim):
  def expand(self, x):
    return x

  def vjp_fwd(self, nzs_in, x):
    return x, None, True, None, None

  def vjp_bwd_retval(self, res, g):
    return (g,)


def test_vjp_fwd_returning_five_values_is_an_error():
  with pytest.raises(TypeError, match=r"FiveTuple.vjp_fwd must return "
                     r"\(out, residuals\).*got a tuple of length 5"):
    jax.grad(unary(FiveTuple))(1.)


class TwoIn(HiPrim):
  """``x * y``, with a backward rule returning `cts` (a param)."""

  def __init__(self, x_aval, y_aval, cts="right", logs=False):
    self.in_avals, self.out_aval = (x_aval, y_aval), x_aval
    self.params = dict(cts=cts)
    if logs:
      self.vjp_bwd_retval_logs = True
    super().__init__()

  def expand(self, x, y):
    return x * y

  def vjp_fwd(self, nzs_in, x, y):
    return self(x, y), (x, y)

  def vjp_bwd_retval(self, res, g):
    x, y = res
    cts = {"right": (g * y, g * x), "short": (g * y,),
           "long": (g * y, g * x, g), "list": [g * y, g * x]}[self.cts]
    if self.vjp_bwd_retval_logs:
      return cts, ({"g": g} if self.cts == "right" else None)
    return cts


def two_in(cts="right", logs=False):
  return lambda x, y: TwoIn(jax.typeof(x), jax.typeof(y), cts, logs)(x, y)


@pytest.mark.parametrize("cts", ["short", "long"])
def test_a_wrong_number_of_cotangents_is_an_error(cts):
  with pytest.raises(TypeError, match=r"TwoIn.vjp_bwd_retval must return a "
                     r"tuple with one cotangent per input \(2\), got a tuple "
                     rf"of length {1 if cts == 'short' else 3}"):
    jax.grad(two_in(cts), (0, 1))(2., 3.)


def test_cotangents_as_a_list_and_with_logs():
  np.testing.assert_allclose(jax.grad(two_in("list"), (0, 1))(2., 3.),
                             (3., 2.))
  _, f_vjp = jax.vjp(two_in("right", logs=True), 2., 3.)
  cts, logs = f_vjp.with_logs(1.)
  np.testing.assert_allclose(cts, (3., 2.))
  assert logs == {"g": 1.}
  np.testing.assert_allclose(
      jax.grad(two_in("list", logs=True), (0, 1))(2., 3.), (3., 2.))


# --- pytree inputs: cotangents matched leaf by leaf -----------------------------------

class DictIn(HiPrim):
  """``p["a"] * x + p["b"]``; the backward rule gives None for ``p["b"]``."""

  def __init__(self, p_aval, x_aval, none_for_x=False):
    self.in_avals, self.out_aval = (p_aval, x_aval), x_aval
    self.params = dict(none_for_x=none_for_x)
    super().__init__()

  def expand(self, p, x):
    return p["a"] * x + p["b"]

  def vjp_fwd(self, nzs_in, p, x):
    return self(p, x), (p, x)

  def vjp_bwd_retval(self, res, g):
    p, x = res
    return {"a": jnp.sum(g * x), "b": None}, (None if self.none_for_x
                                              else g * p["a"])


def dict_in(none_for_x=False):
  return lambda p, x: DictIn(jax.tree.map(jax.typeof, p), jax.typeof(x),
                             none_for_x)(p, x)


def test_pytree_input_cotangents_with_none_leaves():
  p = {"a": jnp.float32(2.), "b": jnp.float32(5.)}
  loss = lambda f: lambda p, x: jnp.sum(f(p, x) ** 2)
  gp, gx = jax.grad(loss(dict_in()), (0, 1))(p, X)
  y = 2. * X + 5.
  np.testing.assert_allclose(gp["a"], np.sum(2 * y * X), rtol=1e-6)
  np.testing.assert_allclose(gp["b"], 0.)  # declared zero by the rule
  np.testing.assert_allclose(gx, 2 * y * 2., rtol=1e-6)
  gp, gx = jax.grad(loss(dict_in(True)), (0, 1))(p, X)
  np.testing.assert_allclose(gx, jnp.zeros(3))
  np.testing.assert_allclose(gp["a"], np.sum(2 * y * X), rtol=1e-6)


# --- transpose rules and their logs ---------------------------------------------------

class Scale(HiPrim):
  """``c * x``, linear in x, with a transpose rule."""

  def __init__(self, c_aval, x_aval):
    self.in_avals, self.out_aval, self.params = (c_aval, x_aval), x_aval, {}
    super().__init__()

  def expand(self, c, x):
    return c * x

  def jvp(self, primals, tangents):
    (c, x), (dc, dx) = primals, tangents
    t = self(c, instantiate_zeros(dx))  # applied to the tangent: transposed
    if not isinstance(dc, Zero):
      t = t + dc * x
    return self(c, x), t

  def transpose(self, ct, c, x_acc):
    x_acc.accum(c * ct)
    return {"ct": ct}

  vjp_fwd, vjp_bwd_retval = vjp_from_jvp


def scale(c, x):
  return Scale(jax.typeof(c), jax.typeof(x))(c, x)


def test_transpose_rule_of_a_linear_primitive():
  f = lambda x: Scale(jax.typeof(3.), jax.typeof(x))(3., x)
  (ct,) = jax.linear_transpose(f, X)(jnp.ones(3))
  np.testing.assert_allclose(ct, 3 * jnp.ones(3))
  # vjp_from_jvp transposes the jvp, which applies Scale to the tangent
  np.testing.assert_allclose(jax.grad(lambda x: jnp.sum(jnp.sin(f(x))))(X),
                             3 * jnp.cos(3 * X), rtol=1e-6)


def test_logs_of_a_transpose_rule_reach_with_logs():
  # A custom_jvp rule applying Scale to its tangent puts Scale in the linear
  # part of the VJP, so reverse mode transposes it with Scale.transpose.
  @jax.custom_jvp
  def sin(x):
    return jnp.sin(x)

  @sin.defjvp
  def sin_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    return jnp.sin(x), scale(jnp.cos(x), dx)

  _, f_vjp = jax.vjp(sin, X)
  (g,), logs = f_vjp.with_logs(2 * jnp.ones(3))
  np.testing.assert_allclose(g, 2 * jnp.cos(X), rtol=1e-6)
  np.testing.assert_allclose(logs["ct"], 2 * jnp.ones(3))


@pytest.mark.parametrize("names,pair,hint", [
    ("lin, linearized", "vjp_from_jvp", "`lin, linearized` are derived with "
     "`= linearize_from_jvp`"),
    ("vjp_fwd, vjp_bwd_retval", "linearize_from_jvp", "`vjp_fwd, "
     "vjp_bwd_retval` are derived with `= vjp_from_lin` or `= vjp_from_jvp`"),
    ("jvp, lin", "vjp_from_lin", "`jvp` is derived with `jvp = jvp_from_lin`")])
def test_a_derived_pair_under_the_wrong_names_says_which_derives(names, pair,
                                                                 hint):
  import hijax
  body = f"{names} = hijax.{pair}"
  with pytest.raises(TypeError, match="is set to") as e:
    exec(f"class Misnamed(UnaryPrim):\n  {body}\n",
         {"UnaryPrim": UnaryPrim, "hijax": hijax})
  assert hint in str(e.value), str(e.value)


# --- expand: every output is checked and conformed ---------------------------------------

class TwoOut(UnaryPrim):
  def __init__(self, x_aval, bad):
    self.in_avals, self.out_aval = (x_aval,), (x_aval, x_aval)
    self.params = dict(bad=bad)
    HiPrim.__init__(self)

  def expand(self, x):
    weak = jnp.sin(1.) + 0 * x.sum()  # weak-typed, where x is not
    first = weak if self.bad.startswith("weak-") else x
    second = {"dtype": x.astype(jnp.float16), "weak": weak,
              "weak-weak": weak, "weak-dtype": x.astype(jnp.float16)}[self.bad]
    return first, second


def test_each_output_of_expand_is_checked():
  x = jnp.float32(1.)
  with pytest.raises(TypeError, match="TwoOut.expand returned a value of "
                     "type float16.* for output 1"):
    TwoOut(jax.typeof(x), "dtype")(x)
  _, second = TwoOut(jax.typeof(x), "weak")(x)
  assert jax.typeof(second) == jax.typeof(x)  # the weak type conformed
  # after an output that was conformed, the next ones are still checked
  first, second = TwoOut(jax.typeof(x), "weak-weak")(x)
  assert jax.typeof(first) == jax.typeof(second) == jax.typeof(x)
  with pytest.raises(TypeError, match="TwoOut.expand returned a value of "
                     "type float16.* for output 1"):
    TwoOut(jax.typeof(x), "weak-dtype")(x)


# --- hi types: defaults, and the search for tracers ------------------------------------

def test_cotangent_type_and_spec_default_to_the_tangent_ones():
  q = jax.typeof(hx.quantize(jnp.ones((2, 3))))
  assert q.to_ct_aval() == q.to_tangent_aval()
  spec = hx.QPspec(jax.P("x", None))
  assert spec.to_ct_spec() == spec.to_tangent_spec() == jax.P("x", None)


class Node:
  def __init__(self, payload):
    self.payload = payload
    self.self_ref = {"me": self}  # cycles: the search must stop
    self.ring = [None]
    self.ring[0] = self.ring


def test_tracer_search_stops_on_cycles():
  from dataclasses import dataclass
  from hijax import HiType, register_hitype

  @dataclass(frozen=True)
  class NodeTy(HiType):
    pass

  register_hitype(Node, lambda n: NodeTy())
  assert jax.typeof(Node(jnp.ones(2))) == NodeTy()
  with pytest.raises(TypeError, match="Node value was built from traced"):
    jax.jit(lambda x: jax.typeof(Node(x)))(jnp.ones(2))


# --- Static: compared by its value --------------------------------------------------------

def test_static_compares_by_value():
  assert Static((0, None)) == Static((0, None))
  assert hash(Static((0, None))) == hash(Static((0, None)))
  for a, b in (((0, None), (1, None)), ((0,), (0, 0)), (True, 1.5)):
    assert Static(a) != Static(b), (a, b)
  assert Static(1) != 1
  assert jax.tree.structure(Static(1)) != jax.tree.structure(Static(2))
  assert jax.tree.leaves([Static(1), 2]) == [2]


# --- declarations -------------------------------------------------------------------------

class Sin(UnaryPrim):
  def expand(self, x):
    return jnp.sin(x)

  def batch_dim_rule(self, axis_data, in_dims):
    return in_dims[0]


def test_repr_and_jaxpr_show_the_class_and_params():
  p = Sin(jax.typeof(1.), k=2, f=jnp.sin, _hidden=3)
  assert repr(p) == "Sin[k=2 f=sin]"
  assert repr(Sin(jax.typeof(1.))) == "Sin"
  jaxpr = str(jax.make_jaxpr(lambda x: Sin(jax.typeof(x), k=2)(x))(1.))
  assert "Sin[k=2] a" in jaxpr, jaxpr


def test_params_errors_name_the_param():
  with pytest.raises(TypeError, match=r"Sin.params\['bad'\] is a list, which "
                     "is not hashable"):
    Sin(jax.typeof(1.), good=(1, 2), bad=[1, 2])
  with pytest.raises(TypeError, match="Effects.effects must be a collection"):
    class Effects(Sin):
      effects = ["io"]
    Effects(jax.typeof(1.))


def test_jaxpr_type_check_passes_with_checks_enabled():
  f = lambda x: Sin(jax.typeof(x))(x) * 2
  with jax.enable_checks(True):
    np.testing.assert_allclose(jax.jit(f)(X), 2 * np.sin(X), rtol=1e-6)
    np.testing.assert_allclose(jax.jit(jax.vmap(f))(X), 2 * np.sin(X),
                               rtol=1e-6)


# --- who raised an error under vmap: the rule, or hijax's check of it ---------------
# (hijax.testing reads the mark: a rule that refuses some combinations of
# batched arguments is partial, one whose output fails hijax's check is wrong)

class Doubler(UnaryPrim):
  """2 x, with a batch rule chosen by `form`."""

  def expand(self, x):
    return 2 * x

  def batch(self, axis_data, args, dims):
    (x,), (d,) = args, dims
    if self.form == "refuses":
      raise ValueError("no batching here")
    if self.form == "wrong":
      return jnp.zeros(3), 0  # no batch axis
    return 2 * jnp.moveaxis(x, d, 0), 0


class DoublerByDim(UnaryPrim):
  def expand(self, x):
    return 2 * x

  def batch_dim_rule(self, axis_data, in_dims):
    raise NotImplementedError("refuses")


def _raised_under_vmap(fn):
  from hijax._checks import raised_by
  with pytest.raises(Exception) as info:
    jax.vmap(fn)(jnp.ones((2, 3)))
  return raised_by(info.value)


@pytest.mark.parametrize("form, by", [("refuses", "Doubler.batch"),
                                      ("wrong", "hijax")])
def test_an_error_under_vmap_is_marked_with_who_raised_it(form, by):
  assert _raised_under_vmap(unary(Doubler, form=form)) == by
  assert jax.vmap(unary(Doubler, form="works"))(X[None]).tolist() == [
      (2 * X).tolist()]


def test_a_batch_dim_rule_s_own_error_is_marked_as_its():
  """The derived batch rule's mark (hijax) does not replace the nearer
  one."""
  assert _raised_under_vmap(unary(DoublerByDim)) == "DoublerByDim.batch_dim_rule"
