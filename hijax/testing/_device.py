"""The device's half: each part of the checks' program the host evaluated in
float64 runs again on the accelerator in the inputs' dtype, compared within
the device's measured accuracy (`calibrate`); it adds failures, never
conclusive passes."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from hijax.testing._compiled import Part
from hijax.testing._numerics import (RULE_ULPS, Tol, eps_of, is_float,
                                     on_device, wide)
from hijax.testing._report import MODES

# The device tolerance allows this many times the worst measured error.
SAFETY = 4.0


def _logistic(x):
  return 1 / (1 + np.exp(-x))


_FUNCTIONS = {
    "exp": (jnp.exp, np.exp, (-20.0, 20.0)),
    "log": (jnp.log, np.log, (1e-3, 1e3)),
    "log1p": (jnp.log1p, np.log1p, (-0.9, 10.0)),
    "expm1": (jnp.expm1, np.expm1, (-5.0, 5.0)),
    "tanh": (jnp.tanh, np.tanh, (-5.0, 5.0)),
    "sin": (jnp.sin, np.sin, (-20.0, 20.0)),
    "logistic": (jax.nn.sigmoid, _logistic, (-20.0, 20.0)),
}

# Their first and second derivatives, exact (float64 on the host).
_DERIVATIVES = {
    "exp": (np.exp, np.exp),
    "log": (lambda x: 1 / x, lambda x: -1 / x**2),
    "log1p": (lambda x: 1 / (1 + x), lambda x: -1 / (1 + x)**2),
    "expm1": (np.exp, np.exp),
    "tanh": (lambda x: 1 - np.tanh(x)**2,
             lambda x: -2 * np.tanh(x) * (1 - np.tanh(x)**2)),
    "sin": (np.cos, lambda x: -np.sin(x)),
    "logistic": (lambda x: _logistic(x) * (1 - _logistic(x)),
                 lambda x: _logistic(x) * (1 - _logistic(x)) * (1 - 2 * _logistic(x))),
}


def platform_of(device) -> str:
  return getattr(device, "platform", "cpu")


def describe(device, dtype) -> str:
  """``TPU v5 lite (tpu), float32``."""
  kind = getattr(device, "device_kind", platform_of(device))
  return f"{kind} ({platform_of(device)}), {dtype}"


def on_accelerator() -> bool:
  """Whether JAX's default device is not a CPU."""
  return platform_of(jax.devices()[0]) != "cpu"


def accelerator(device=None):
  """The device to check on besides the host (None: none)."""
  if device is False:
    return None
  if device is not None and device is not True:
    return device
  default = jax.devices()[0]
  return None if platform_of(default) == "cpu" else default


def host():
  """The host CPU device, or None where JAX has no CPU backend."""
  try:
    return jax.devices("cpu")[0]
  except RuntimeError:
    return None


def _ulps(got, want, dtype, floor=None) -> float:
  """The largest ``|got - want|`` (less ``floor``) in ulps of ``dtype``."""
  got, want = wide(got), wide(want)  # a complex error counts both parts
  finite = np.isfinite(got) & np.isfinite(want)
  want = np.where(finite, want, 0.0)
  err = np.abs(np.where(finite, got, 0.0) - want)
  if floor is not None:
    err = np.maximum(err - floor, 0.0)
  scale = np.abs(want) + np.max(np.abs(want), initial=0.0)
  with np.errstate(invalid="ignore", divide="ignore"):
    ratio = np.where(scale > 0, err / scale, 0.0)
  return float(np.max(ratio, initial=0.0)) / eps_of(dtype)


def _measured(a, b, xs):
  """What `calibrate` runs on the device, as one program (one compile): a
  product, each function and its first and second derivatives at ``xs``."""
  values, derivatives = [], []
  for (jf, _, _), x in zip(_FUNCTIONS.values(), xs):
    d1 = jax.grad(jf)
    values.append(jf(x))
    derivatives += [jax.vmap(d1)(x), jax.vmap(jax.grad(d1))(x)]
  return jnp.matmul(a, b), values, derivatives


@functools.lru_cache(maxsize=16)
def _calibration(device, dtype_name: str, precision) -> dict[str, float]:
  del precision  # part of the cache key: the matmul precision measured
  dtype = np.dtype(dtype_name)
  rng = np.random.default_rng(0)
  a = rng.standard_normal((64, 64)).astype(dtype)
  b = rng.standard_normal((64, 8)).astype(dtype)
  xs = [np.linspace(lo, hi, 257).astype(dtype) for _, _, (lo, hi) in _FUNCTIONS.values()]
  with jax.default_device(device):
    product, values, derivatives = jax.jit(_measured)(
        on_device(a), on_device(b), [on_device(x) for x in xs])

  def worst(pairs):
    # only where the exact value is representable (exp(20) is not in float16)
    return max([_ulps(np.asarray(got)[fits], want[fits], dtype) for got, want in pairs
                for fits in [np.abs(want) <= float(np.finfo(dtype).max)]])
  functions = worst((got, nf(x.astype(np.float64))) for got, (_, nf, _), x
                    in zip(values, _FUNCTIONS.values(), xs))
  exact = [d(x.astype(np.float64)) for name, x in zip(_FUNCTIONS, xs)
           for d in _DERIVATIVES[name]]
  return {"matmul": _ulps(product, a.astype(np.float64) @ b.astype(np.float64), dtype),
          "transcendental": functions,
          "differentiated": max(functions, worst(zip(derivatives, exact)))}


def calibrate(device, dtype) -> dict[str, float]:
  """The device's measured error in ``dtype`` against float64 on the host,
  in units of ``dtype``'s epsilon: ``matmul`` (a product at the current
  ``jax.default_matmul_precision``) and ``transcendental`` (the worst of
  exp, log, log1p, expm1, tanh, sin and the logistic function, where the
  exact value is representable in ``dtype``) and ``differentiated`` (the
  worst of those and of their first and second derivatives)."""
  return _calibration(device, np.dtype(dtype).name,
                      jax.config.jax_default_matmul_precision)


def tolerance(measured: dict[str, float], products: bool = True,
              derived: bool = False) -> Tol:
  """`SAFETY` times the worst error measured (at least the CPU's): matrix
  products' only with ``products``, derivatives' only where ``derived``."""
  worst = max((v for k, v in measured.items()
               if (products or k != "matmul") and (derived or k != "differentiated")),
              default=0)
  return Tol(ulps=max(RULE_ULPS, SAFETY * worst))


def multiplies_matrices(part) -> bool:
  """Whether a part's lowered program has a matrix product or a
  convolution (True where it cannot be lowered)."""
  try:
    text = jax.jit(lambda args: part.fn(*args)).lower(part.template()).as_text()
  except Exception:  # pylint: disable=broad-except
    return True
  return "stablehlo.dot" in text or "stablehlo.convolution" in text


def rounded(args, like):
  """``args`` with each floating leaf cast to ``like``'s (where floating)."""
  leaves, tree = jax.tree.flatten(args)
  return jax.tree.unflatten(tree, [
      np.asarray(x).astype(np.asarray(d).dtype) if is_float(x) and is_float(d)
      else np.asarray(x) for x, d in zip(leaves, jax.tree.leaves(like))])


def _part_of(key, p) -> tuple[int, str, str, str]:
  """A part's rank (the function first), mode, rule and description."""
  if key == "points":
    return 0, "expand", p.rule_name("expand"), "the function"
  if isinstance(key, Part):
    return (MODES.index(key.mode), key.mode, p.rule_name(key.rule),
            key.describe())
  # a derived function's part, ``((..., kind), key)``: its kind's rule
  return (len(MODES), "second_order", p.rule_name(key[0][-1]),
          f"the second-order part {key!r}")


_FLOATS = ("float16", "bfloat16", "float32", "float64")


def _float_dtype(name, default):
  """The floating dtype ``name`` names, else ``default``."""
  return np.dtype(name) if name in _FLOATS else default


def function_floors(p, w, dtype, n_values: int) -> list:
  """The host's `primal_floors`, scaled to ``dtype``, for ``n_values``
  outputs on the device."""
  floors = p.primal_floors(w, all_outputs=True, computed_only=True)
  if not floors or n_values % len(floors):
    return [None] * n_values
  ratio = eps_of(dtype) / eps_of(_float_dtype(w.report.dtype, np.float64))
  scaled = [None if f is None else np.asarray(f) * ratio for f in floors]
  return scaled * (n_values // len(floors))


def check_on_device(p, w, device, bundle, dtype_name, host_run, plan,
                    device_x64: bool = False) -> None:
  """Each part the host's point ``p`` evaluated, evaluated again on
  ``device`` by ``bundle`` (in ``dtype_name``) and compared with the host's
  float64 (``host_run``)."""
  host_bundle = p.compiled.bundle
  dtype = _float_dtype(dtype_name, np.dtype(np.float32))
  where = describe(device, dtype)
  keys = [k for k in host_bundle.seen if k in bundle.parts]
  keys.sort(key=lambda k: _part_of(k, p)[0])
  measured = dict(calibrate(device, dtype))
  inputs = p.describe_inputs()
  with_products = set()  # the parts judged at the products' tolerance
  for key in keys:
    _, mode, rule, what = _part_of(key, p)
    check = (f"on {where.split(' (')[0]}: {what} in {dtype.name} vs the "
             "host's float64")
    if w.out_of_time(mode, check):
      continue
    template = bundle.parts[key].template()
    try:
      got, want = [], []
      for call in host_bundle.seen[key]:
        args = rounded(call, template)
        with jax.default_device(device), jax.enable_x64(device_x64):
          got += map(np.asarray, jax.tree.leaves(bundle.run(key, args)))
        want += map(np.asarray, jax.tree.leaves(host_run(key, rounded(
            args, call))))
    except Exception as e:  # pylint: disable=broad-except
      if key in host_bundle.raised:
        continue  # the host half judged it (a failure, or a rule's refusal)
      if key == "points":  # the function itself does not run there
        w.skip(mode, f"{check}: the function does not run on "
                 f"{where} ({type(e).__name__}: {str(e).strip()[:120]}); "
                 "nothing was checked there")
        w.report.devices["device check"] = (
            f"{where}: not checked, the function does not run there")
        return
      w.fail_raised(mode, check, inputs, e, rule=rule)
      continue
    floors = None
    if key == "points":  # the function's own accuracy on the device
      floors = function_floors(p, w, dtype, len(got))
      floats = [(g, w, f) for g, w, f in zip(got, want, floors)
                if is_float(g)]
      measured["the function"] = max(
          [_ulps(g, w, g.dtype, f) for g, w, f in floats] or [0.0])
      if "expand" not in plan:
        continue
    # the host's values in the device's dtypes: float64 rounded to the
    # dtype, and an integer of the host's width (int64 where float64 is on)
    # as the device's (int32), compared by value (both signed, unsigned or
    # boolean, of any widths)
    want = [w.astype(g.dtype) if is_float(g) or (
        g.dtype.kind == w.dtype.kind and g.dtype.kind in "iub") else w
            for g, w in zip(got, want)]
    w.ran(mode, check)
    # (lowered only where the products' error is the largest measured)
    products = (tolerance(measured) != tolerance(measured, False)
                and multiplies_matrices(bundle.parts[key]))
    if products:
      with_products.add(key)
    tol = tolerance(measured, products, mode == "second_order")
    # the host's verdict says whether a rule was judged: the device's half
    # compares a rule with itself elsewhere, so it adds failures, not
    # conclusive comparisons
    w.compare(mode, check, inputs, got, want, tol,
                names=[f"output {i}" for i in range(len(got))],
                got_label=where.split(" (")[0], want_label="the host",
                rule=rule, counts=False, floors=floors)
  widened = (f", {tolerance(measured).ulps:.0f} for the {len(with_products)} "
             "with a matrix product" if with_products else "")
  if any(_part_of(k, p)[1] == "second_order" for k in keys):
    widened += (f", {tolerance(measured, False, True).ulps:.0f} for a "
                "second-order part")
  w.report.devices["device check"] = (
      f"{where}: {len(keys)} part(s) of the checks' program against the "
      f"host's float64, tolerance {tolerance(measured, False).ulps:.0f} ulps"
      f"{widened} (measured, in ulps of the dtype: " + ", ".join(
          f"{k} {v:.0f}" for k, v in measured.items()) + ")")
