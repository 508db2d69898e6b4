"""hijax.debug: cotangent probes find where a backward pass went non-finite."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hijax.debug import CotangentWatch


def _chain(watch):
  # sqrt(sin(x)) summed: at x = 0, sqrt's backward divides by zero.
  def f(x):
    a = watch(jnp.sin(x), "sin")
    b = watch(jnp.sqrt(a), "sqrt")
    return watch(jnp.sum(b), "sum")
  return f


def _plain(x):
  return jnp.sum(jnp.sqrt(jnp.sin(x)))


def test_probes_change_no_value_or_derivative():
  f = _chain(CotangentWatch())
  x = jnp.array([0.3, 1.1])
  np.testing.assert_allclose(f(x), _plain(x), rtol=1e-6)
  np.testing.assert_allclose(jax.grad(f)(x), jax.grad(_plain)(x), rtol=1e-6)
  t = jnp.array([1., -2.])
  np.testing.assert_allclose(jax.jvp(f, (x,), (t,))[1],
                             jax.jvp(_plain, (x,), (t,))[1], rtol=1e-6)
  xs = jnp.array([[0.3, 1.1], [0.5, 0.7]])
  np.testing.assert_allclose(jax.vmap(jax.grad(f))(xs),
                             jax.vmap(jax.grad(_plain))(xs), rtol=1e-6)
  np.testing.assert_allclose(jax.hessian(f)(x), jax.hessian(_plain)(x),
                             rtol=1e-5)


def test_report_names_the_first_non_finite_cotangent():
  watch = CotangentWatch()
  _, f_vjp = jax.vjp(_chain(watch), jnp.array([0., 1.]))
  (g,), logs = f_vjp.with_logs(1.)
  assert np.isinf(g[0]) and np.isfinite(g[1])
  report = watch.report(logs)
  assert [s.site for s in report.sites] == ["sum", "sqrt", "sin"]
  assert report.first == "sin"  # made by sqrt's rule, between the two probes
  by_site = {s.site: s for s in report.sites}
  assert by_site["sin"].infs == 1 and by_site["sin"].nans == 0
  assert by_site["sqrt"].finite and by_site["sum"].finite
  # the finite entry of d/da sqrt(a) at a = sin(1)
  np.testing.assert_allclose(by_site["sin"].max_abs,
                             0.5 / np.sqrt(np.sin(1.)), rtol=1e-6)
  assert "<- first non-finite" in str(report).splitlines()[3]


def test_all_finite_and_check():
  watch = CotangentWatch()
  _, f_vjp = jax.vjp(_chain(watch), jnp.array([0.5, 1.]))
  _, logs = f_vjp.with_logs(1.)
  assert watch.check(logs).first is None
  _, f_vjp = jax.vjp(_chain(watch), jnp.array([0., 1.]))
  _, logs = f_vjp.with_logs(1.)
  with pytest.raises(FloatingPointError, match="first at probe 'sin'"):
    watch.check(logs)


def test_nan_counted_separately_from_inf():
  watch = CotangentWatch()
  def f(x):
    y = watch(jnp.sqrt(x), "sqrt")  # sqrt(-1) = nan
    return jnp.sum(watch(y * 2., "double"))
  _, f_vjp = jax.vjp(f, jnp.array([-1., 0., 4.]))
  _, logs = f_vjp.with_logs(1.)
  report = watch.report(logs)
  assert report.first is None  # the cotangents are 1 and 2: all finite
  # the forward nan reaches the cotangent of the next rule's input
  def g(x):
    y = watch(jnp.sqrt(x), "sqrt2")
    return jnp.sum(watch(y * y, "square"))
  _, g_vjp = jax.vjp(g, jnp.array([-1., 4.]))
  _, logs = g_vjp.with_logs(1.)
  s = {r.site: r for r in watch.report(logs).sites}
  assert s["sqrt2"].nans == 1 and s["sqrt2"].infs == 0
  assert s["square"].finite


def test_logs_under_jit_and_dropped_without_with_logs():
  watch = CotangentWatch()
  f = _chain(watch)
  logged = jax.jit(lambda x: jax.vjp(f, x)[1].with_logs(1.))
  (g,), logs = logged(jnp.array([0., 1.]))
  assert watch.report(logs).first == "sin"
  plain = jax.jit(lambda x: jax.vjp(f, x)[1](1.))
  text = plain.lower(jnp.array([0., 1.])).as_text()
  assert "is_finite" not in text
  assert "is_finite" in logged.lower(jnp.array([0., 1.])).as_text()


def test_scan_reports_iterations_last_first():
  watch = CotangentWatch()
  def h(xs):
    def body(c, x):
      return c + jnp.sqrt(watch(x, "x")), None
    return jax.lax.scan(body, 0., xs)[0]
  _, h_vjp = jax.vjp(h, jnp.array([1., 0., 2., 0.]))
  _, logs = h_vjp.with_logs(1.)
  (site,) = watch.report(logs).sites
  assert site.infs == 2 and site.iterations == ((3,), (1,))
  np.testing.assert_allclose(site.max_abs, 0.5, rtol=1e-6)


def test_unreached_probe():
  watch = CotangentWatch()
  def f(x):
    watch(x * 3., "unused")
    return watch(x * 2., "used")
  _, f_vjp = jax.vjp(f, 1.)
  _, logs = f_vjp.with_logs(1.)
  report = watch.report(logs)
  assert [(s.site, s.reached) for s in report.sites] == [
      ("used", True), ("unused", False)]
  assert "did not reach" in str(report)


def test_misuse_messages():
  watch = CotangentWatch()
  with pytest.raises(TypeError, match="probe 'i' was given a int32 value"):
    watch(jnp.arange(3), "i")
  with pytest.raises(TypeError, match="name must be a str"):
    watch(1., 3)
  watch(jnp.ones(2), "a")
  with pytest.raises(TypeError, match="log entry 'a' is list"):
    watch.report({"a": [1]})


# --- under jax.checkpoint: every remat mode and policy -----------------------------------

def _policies():
  cp = jax.checkpoint_policies
  return [("default", None), ("nothing_saveable", cp.nothing_saveable),
          ("everything_saveable", cp.everything_saveable),
          ("dots_saveable", cp.dots_saveable),
          ("save_only_these_names", cp.save_only_these_names("a"))]


@pytest.fixture(params=[False, True], ids=["classic", "remat3"])
def remat_mode(request):
  if request.param and not hasattr(jax.config, "jax_remat3"):
    pytest.skip("this JAX has no jax_remat3 flag")
  old = getattr(jax.config, "jax_remat3", False)
  jax.config.update("jax_remat3", request.param)
  yield request.param
  jax.config.update("jax_remat3", old)


@pytest.mark.parametrize("policy_name, policy", _policies(),
                         ids=[p[0] for p in _policies()])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_checkpoint_reports_what_the_plain_backward_pass_does(
    remat_mode, policy_name, policy, jit):
  """Under classic jax.checkpoint, JAX transposes forward mode: the probes
  used to log nothing, so check() passed while the gradient held an inf."""
  del remat_mode, policy_name
  from jax.ad_checkpoint import checkpoint_name
  watch = CotangentWatch()

  def f(x):
    a = checkpoint_name(watch(jnp.sin(x), "sin"), "a")
    b = watch(jnp.sqrt(a), "sqrt")
    return watch(jnp.sum(b), "sum")
  g = jax.checkpoint(f, policy=policy)
  with_logs = lambda x: jax.vjp(g, x)[1].with_logs(1.)
  (grad,), logs = (jax.jit(with_logs) if jit else with_logs)(
      jnp.array([0., 1.]))
  assert np.isinf(grad[0])
  report = watch.report(logs)
  assert all(s.reached for s in report.sites), report
  assert report.first == "sin"
  with pytest.raises(FloatingPointError, match="first at probe 'sin'"):
    watch.check(logs)
  # the same summaries as without the checkpoint
  _, plain = jax.vjp(f, jnp.array([0., 1.]))[1].with_logs(1.)
  for site in ("sin", "sqrt", "sum"):
    for key in ("nans", "infs", "max_abs"):
      np.testing.assert_allclose(logs[site][key], plain[site][key], rtol=1e-6)


def test_checkpointed_scan_body_reports_iterations(remat_mode):
  del remat_mode
  watch = CotangentWatch()

  def h(xs):
    @jax.checkpoint
    def body(c, x):
      return c + jnp.sqrt(watch(x, "x")), None
    return jax.lax.scan(body, 0., xs)[0]
  _, logs = jax.vjp(h, jnp.array([1., 0., 2., 0.]))[1].with_logs(1.)
  (site,) = watch.report(logs).sites
  assert site.infs == 2 and site.iterations == ((3,), (1,))


def test_check_refuses_logs_in_which_no_probe_was_reached():
  watch = CotangentWatch()

  @jax.custom_vjp
  def opaque(x):  # its backward rule is the user's: the probe is not run
    return jnp.sum(watch(jnp.sqrt(x), "sqrt"))
  opaque.defvjp(lambda x: (opaque(x), x), lambda x, g: (g / x,))
  (grad,), logs = jax.vjp(opaque, jnp.array([0., 1.]))[1].with_logs(1.)
  assert np.isinf(grad[0])
  with pytest.raises(ValueError, match="none of the 1 probes"):
    watch.check(logs)
