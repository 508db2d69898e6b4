"""vmap through `batch_dim_rule` (derived batched rules) and through `batch`."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hijax import HiPrim, ShapedArray, Zero, instantiate_zeros


class SinTimesY(HiPrim):
  def __init__(self, x_aval, y_aval):
    self.in_avals = (x_aval, y_aval)
    self.out_aval = x_aval
    self.params = {}
    super().__init__()

  def expand(self, x, y):
    return jnp.sin(x) * y

  def vjp_fwd(self, nzs_in, x, y):
    return self(x, y), (x, y)

  def vjp_bwd(self, res, g, x_acc, y_acc):
    x, y = res
    x_acc.accum(jnp.cos(x) * g * y)
    y_acc.accum(jnp.sin(x) * g)
    return {"g": g}

  def jvp(self, primals, tangents):
    (x, y), (dx, dy) = primals, map(instantiate_zeros, tangents)
    return self(x, y), jnp.cos(x) * dx * y + jnp.sin(x) * dy

  def lin(self, nzs_in, x, y):
    return self(x, y), (jnp.cos(x) * y, jnp.sin(x))

  def linearized(self, res, dx, dy):
    a, b = res
    return a * instantiate_zeros(dx) + b * instantiate_zeros(dy)

  def batch_dim_rule(self, axis_data, in_dims):
    x_dim, y_dim = in_dims
    return x_dim if x_dim is not None else y_dim


def f(x, y):
  return SinTimesY(jax.typeof(x), jax.typeof(y))(x, y)


def ref(x, y):
  return jnp.sin(x) * y


X = jnp.linspace(-1., 1., 3)
Y = jnp.linspace(0.5, 1.5, 3)
AXES = [(0, 0), (0, None), (None, 0)]


def _args(in_axes):
  return tuple(X if a is not None else 0.7 for a in in_axes)


@pytest.mark.parametrize("in_axes", AXES)
def test_vmap_primal(in_axes):
  args = _args(in_axes)
  np.testing.assert_allclose(jax.vmap(f, in_axes)(*args),
                             jax.vmap(ref, in_axes)(*args), rtol=1e-6)


@pytest.mark.parametrize("in_axes", AXES)
def test_vmap_of_grad_and_jvp_and_linearize(in_axes):
  args = _args(in_axes)
  for argnums in (0, 1):
    np.testing.assert_allclose(
        jax.vmap(jax.grad(f, argnums), in_axes)(*args),
        jax.vmap(jax.grad(ref, argnums), in_axes)(*args), rtol=1e-6)
  tangent = lambda g: lambda x, y: jax.jvp(g, (x, y), (1., 2.))[1]
  np.testing.assert_allclose(jax.vmap(tangent(f), in_axes)(*args),
                             jax.vmap(tangent(ref), in_axes)(*args), rtol=1e-6)
  lin = lambda g: lambda x, y: jax.linearize(g, x, y)[1](1., 2.)
  np.testing.assert_allclose(jax.vmap(lin(f), in_axes)(*args),
                             jax.vmap(lin(ref), in_axes)(*args), rtol=1e-6)


def test_grad_of_vmap_sums_unbatched_cotangents():
  g = jax.grad(lambda y: jax.vmap(f, (0, None))(X, y).sum())(0.7)
  np.testing.assert_allclose(g, jnp.sin(X).sum(), rtol=1e-6)


def test_logs_from_a_batched_backward_rule_are_stacked():
  _, f_vjp = jax.vjp(jax.vmap(f), X, Y)
  _, logs = f_vjp.with_logs(jnp.ones(3))
  np.testing.assert_array_equal(logs["g"], jnp.ones(3))


def test_nested_vmap_and_moved_axes():
  xs = jnp.arange(6.).reshape(2, 3) / 6
  ys = jnp.arange(6.).reshape(3, 2) / 3
  got = jax.vmap(jax.vmap(f), in_axes=(1, 0))(xs, ys)
  want = jax.vmap(jax.vmap(ref), in_axes=(1, 0))(xs, ys)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  got = jax.vmap(f, in_axes=(1, 0), out_axes=1)(xs, ys)
  np.testing.assert_allclose(got, jax.vmap(ref, (1, 0), 1)(xs, ys), rtol=1e-6)
  got = jax.vmap(jax.vmap(jax.grad(f)))(xs, xs)
  np.testing.assert_allclose(got, jax.vmap(jax.vmap(jax.grad(ref)))(xs, xs),
                             rtol=1e-6)


class MatVec(HiPrim):
  calls = []

  def __init__(self, A_aval, x_aval):
    self.in_avals = (A_aval, x_aval)
    self.out_aval = ShapedArray((A_aval.shape[0],), A_aval.dtype)
    self.params = {}
    super().__init__()

  def expand(self, A, x):
    return A @ x

  def batch(self, axis_data, args, dims):
    A, X = args
    MatVec.calls.append((dims, axis_data.size))
    if dims[0] is not None:
      return jax.vmap(jnp.matmul, in_axes=dims)(A, X), 0
    return jnp.moveaxis(X, dims[1], 0) @ A.T, 0


def matvec(A, x):
  return MatVec(jax.typeof(A), jax.typeof(x))(A, x)


def test_batch_rule_gets_args_dims_and_axis_size():
  A = jnp.arange(6.).reshape(2, 3)
  xs = jnp.arange(12.).reshape(3, 4)
  MatVec.calls.clear()
  np.testing.assert_allclose(jax.vmap(matvec, (None, 1))(A, xs), (A @ xs).T)
  assert MatVec.calls == [((None, 1), 4)]
  np.testing.assert_allclose(jax.jit(jax.vmap(matvec, (None, 1)))(A, xs), (A @ xs).T)


def test_batch_rule_must_return_a_pair():
  class Bad(MatVec):
    def batch(self, axis_data, args, dims):
      return args[1]

  with pytest.raises(TypeError, match=r"Bad.batch must return a pair"):
    jax.vmap(lambda x: Bad(jax.typeof(jnp.ones((2, 3))), jax.typeof(x))(
        jnp.ones((2, 3)), x))(jnp.ones((4, 3)))


def test_batch_dim_rule_with_pytree_outputs():
  class Both(HiPrim):
    def __init__(self, a):
      self.in_avals, self.out_aval, self.params = (a,), {"s": a, "c": a}, {}
      super().__init__()

    def expand(self, x):
      return {"s": jnp.sin(x), "c": jnp.cos(x)}

    def batch_dim_rule(self, axis_data, in_dims):
      return {"s": in_dims[0], "c": in_dims[0]}

  out = jax.vmap(lambda x: Both(jax.typeof(x))(x))(X)
  np.testing.assert_allclose(out["c"], jnp.cos(X), rtol=1e-6)


def test_batch_dim_rule_may_return_one_dim_for_all_outputs():
  class SinCos(HiPrim):
    def __init__(self, a):
      self.in_avals, self.out_aval, self.params = (a,), (a, a), {}
      super().__init__()

    def expand(self, x):
      return jnp.sin(x), jnp.cos(x)

    def batch_dim_rule(self, axis_data, in_dims):
      return in_dims[0]

  s, c = jax.vmap(lambda x: SinCos(jax.typeof(x))(x))(X)
  np.testing.assert_allclose(s, jnp.sin(X), rtol=1e-6)
  np.testing.assert_allclose(c, jnp.cos(X), rtol=1e-6)
