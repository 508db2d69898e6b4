"""residual_report and assert_residual_bytes: bytes per residual, per line,
under a checkpoint policy, and the budget error."""
import jax
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import checkpoint_name

from hijax import (HiPrim, SaveOnlyTheseNames, assert_residual_bytes,
                   jvp_from_vjp, residual_report, saved_residuals)


class Softplus(HiPrim):
  def __init__(self, x_aval):
    self.in_avals, self.out_aval, self.params = (x_aval,), x_aval, {}
    super().__init__()

  def expand(self, x):
    return jnp.logaddexp(x, 0.)

  def vjp_fwd(self, nzs_in, x):
    return self(x), jax.nn.sigmoid(x)  # saves one array like x

  def vjp_bwd_retval(self, s, g):
    return (g * s,)

  jvp = jvp_from_vjp  # jax.checkpoint's default remat rule needs jvp


def layer(x, w):
  h = checkpoint_name(jnp.sin(x @ w), "h")
  return jnp.sum(Softplus(jax.typeof(h))(h))


X = jnp.ones((4, 3), jnp.float32)
W = jnp.ones((3, 5), jnp.float32)


def test_rows_match_saved_residuals_with_sizes_and_lines():
  report = residual_report(layer, X, W)
  raw = saved_residuals(layer, X, W)
  assert len(report.rows) == len(raw)
  for row, (aval, _) in zip(report.rows, raw):
    assert row.shape == aval.shape and row.dtype == str(aval.dtype)
    assert row.nbytes == aval.size * aval.dtype.itemsize
  assert [r.what for r in report.rows if r.is_argument] == ["argument x",
                                                           "argument w"]
  assert report.total_bytes == 4 * (12 + 15) + report.saved_bytes
  # the primitive's vjp_fwd saves a (4, 5) float32 array, on its own line
  by_line = dict((w, b) for w, _, b in report.by_line())
  assert by_line["test_residuals.py:21 (Softplus.vjp_fwd)"] == 80
  assert all("/" not in r.where for r in report.rows)
  assert all(b > 0 for _, _, b in report.by_operation())


def test_policy_and_rendering():
  everything = residual_report(layer, X, W)
  only_h = residual_report(layer, X, W, policy=SaveOnlyTheseNames("h"))
  assert [r.what for r in only_h.rows if not r.is_argument] == ["named 'h'"]
  assert only_h.saved_bytes == 80 < everything.saved_bytes
  text, page = str(only_h), only_h._repr_html_()
  assert "named 'h'" in text and "80 B" in text and "SaveOnlyTheseNames" in text
  assert "<table>" in page and "named &#x27;h&#x27;" in page
  assert repr(only_h) == text


def test_assert_residual_bytes():
  report = assert_residual_bytes(layer, X, W, max_bytes=1000)
  assert report.saved_bytes <= 1000
  with pytest.raises(AssertionError, match=r"saves \d+ bytes .* over the "
                     r"budget of 100 bytes .*The biggest savers:\n .*"
                     r"test_residuals.py:\d+"):
    assert_residual_bytes(layer, X, W, max_bytes=100)
  assert_residual_bytes(layer, X, W, max_bytes=80,
                        policy=SaveOnlyTheseNames("h"))
  with pytest.raises(AssertionError, match="over the budget"):
    assert_residual_bytes(layer, X, W, max_bytes=100, count_arguments=True,
                          policy=SaveOnlyTheseNames("h"))


class ReverseOnlySoftplus(Softplus):
  jvp = HiPrim.jvp  # reverse-mode rules only


def test_a_policy_on_a_reverse_only_primitive_names_jax_remat3():
  """Classic jax.checkpoint differentiates in forward mode: the error used to
  say only that the class has no forward-mode rule."""
  if not hasattr(jax.config, "jax_remat3"):
    pytest.skip("this JAX has no jax_remat3 flag")
  f = lambda x: jnp.sum(ReverseOnlySoftplus(jax.typeof(x))(x))
  x = jnp.ones(3, jnp.float32)
  old = jax.config.jax_remat3
  try:
    jax.config.update("jax_remat3", False)
    with pytest.raises(NotImplementedError) as info:
      residual_report(f, x, policy=SaveOnlyTheseNames("h"))
    msg = str(info.value)
    assert "jax.config.update('jax_remat3', True)" in msg
    assert "forward mode" in msg and "ReverseOnlySoftplus" in msg
    assert residual_report(f, x).saved_bytes == 12  # no policy: reverse mode
    jax.config.update("jax_remat3", True)  # the fix it names works
    report = residual_report(f, x, policy=SaveOnlyTheseNames("h"))
    assert report.saved_bytes == 0
  finally:
    jax.config.update("jax_remat3", old)
