"""Finding where a backward pass first produced a nan or an inf.

`CotangentWatch` puts identity probes into a function. Each probe is a
`HiPrim` whose backward rule passes the cotangent through unchanged and logs
a summary of it (how many entries are nan, how many inf, the largest finite
magnitude) under the probe's name. Call the VJP function through
``with_logs`` to get those logs, and `CotangentWatch.report` orders them as
the backward pass met them and names the first probe whose cotangent was not
finite::

  watch = CotangentWatch()
  def f(x):
    y = watch(jnp.sqrt(x), "sqrt")
    return watch(jnp.sum(y), "sum")
  _, f_vjp = jax.vjp(f, x)
  grads, logs = f_vjp.with_logs(1.)
  print(watch.report(logs))   # every probe, in backward order
  watch.check(logs)           # FloatingPointError naming the first bad probe

Probes cost nothing when logs are not asked for: ``jax.grad`` and a plain
``f_vjp(ct)`` discard the logs, and under ``jit`` the summaries are removed
as dead code. A probe is the identity in every mode (``jvp``, ``vmap``,
``jit``, ``scan``), so a watched function computes what the unwatched one
does.

Reverse mode reaches a probe two ways. ``jax.vjp`` runs its backward rule.
Under ``jax.checkpoint`` (without ``jax_remat3``, with any policy), JAX
differentiates the checkpointed code in forward mode and transposes the
tangent computation: there the probe's ``jvp`` passes the tangent through a
`TangentProbe`, a linear identity whose transpose logs the same summary.
Either way each probe logs once per backward pass.

Imports: primitive, autodiff (for `Zero`); nothing imports this module but
the package's ``__init__``.
"""
from __future__ import annotations

from typing import Any

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from hijax.autodiff import Zero
from hijax.primitive import HiPrim


class CotangentProbe(HiPrim):
  """The identity, whose backward rule logs a summary of its cotangent.

  The log entry, under the key ``site``, is a dict with ``nans`` and ``infs``
  (int32 counts of non-finite entries) and ``max_abs`` (the largest magnitude
  among the finite entries, 0 if there are none). A symbolic-zero cotangent
  is logged as all zeros. Made by `CotangentWatch`; usable on its own as
  ``CotangentProbe(jax.typeof(x), "name")(x)``.
  """

  in_avals: tuple[Any, ...]
  out_aval: Any
  params: dict[str, Any]

  def __init__(self, x_aval: Any, site: str) -> None:
    self.in_avals = (x_aval,)
    self.out_aval = x_aval
    self.params = dict(site=site)
    super().__init__()

  def expand(self, x: Any) -> Any:
    return x

  def vjp_fwd(self, nzs_in: Any, x: Any) -> Any:
    return self(x), None

  def vjp_bwd(self, res: Any, g: Any, x_acc: Any) -> Any:
    del res
    if not isinstance(g, Zero):
      x_acc.accum(g)
    return {self.site: _summary(g, self.out_aval.dtype)}

  def jvp(self, primals: Any, tangents: Any) -> Any:
    (t,) = tangents
    if isinstance(t, Zero):
      return self(primals[0]), t
    return self(primals[0]), TangentProbe(jax.typeof(t), self.site)(t)

  def batch_dim_rule(self, axis_data: Any, in_dims: Any) -> Any:
    return in_dims[0]


def _summary(g: Any, dtype: Any) -> dict[str, Any]:
  """What a probe logs of the cotangent ``g`` (all zeros for a `Zero`)."""
  if isinstance(g, Zero):
    zero = jnp.zeros((), jnp.int32)
    return dict(nans=zero, infs=zero, max_abs=jnp.zeros((), dtype))
  finite = jnp.isfinite(g)
  return dict(
      nans=jnp.sum(jnp.isnan(g), dtype=jnp.int32),
      infs=jnp.sum(jnp.isinf(g), dtype=jnp.int32),
      max_abs=jnp.max(jnp.where(finite, jnp.abs(g), 0.), initial=0.))


class TangentProbe(HiPrim):
  """The identity on a probe's tangent: a linear primitive whose transpose
  logs the cotangent as `CotangentProbe`'s backward rule does.

  `CotangentProbe.jvp` applies it, so that a backward pass that JAX builds by
  transposing forward mode (``jax.checkpoint`` without ``jax_remat3``,
  ``jax.linear_transpose`` of a linearized function) logs the probe too.
  """

  in_avals: tuple[Any, ...]
  out_aval: Any
  params: dict[str, Any]

  def __init__(self, t_aval: Any, site: str) -> None:
    self.in_avals = (t_aval,)
    self.out_aval = t_aval
    self.params = dict(site=site)
    super().__init__()

  def expand(self, t: Any) -> Any:
    return t

  def transpose(self, ct: Any, t_acc: Any) -> Any:
    if not isinstance(ct, Zero):
      t_acc.accum(ct)
    return {self.site: _summary(ct, self.out_aval.dtype)}

  def jvp(self, primals: Any, tangents: Any) -> Any:
    (t,) = tangents
    return self(primals[0]), t if isinstance(t, Zero) else self(t)

  def batch_dim_rule(self, axis_data: Any, in_dims: Any) -> Any:
    return in_dims[0]


@dataclasses.dataclass(frozen=True)
class SiteReport:
  """What one probe saw in the backward pass.

  Attributes:
    site: the probe's name.
    reached: False if the backward pass never ran the probe's rule (its
      output did not affect the result, or it sat inside a ``while_loop``).
    nans: number of nan entries in the cotangent (summed over loop
      iterations).
    infs: number of infinite entries, likewise.
    max_abs: the largest finite magnitude seen (a float).
    iterations: for a probe inside ``scan`` (whose logs are stacked, one row
      per iteration), the index tuples of the iterations whose cotangent was
      not finite, in the order the backward pass ran them (last iteration
      first); ``()`` otherwise.
  """

  site: str
  reached: bool
  nans: int = 0
  infs: int = 0
  max_abs: float = 0.
  iterations: tuple[Any, ...] = ()

  @property
  def finite(self) -> bool:
    """Whether every entry of the cotangent was finite."""
    return self.nans == 0 and self.infs == 0


@dataclasses.dataclass(frozen=True)
class NonFiniteReport:
  """Every probe of a `CotangentWatch`, in the order the backward pass ran them.

  The order is the reverse of the order in which the probes were first traced,
  which is the order the backward pass reaches them in straight-line code. In
  a loop body the backward pass runs every site once per iteration;
  `SiteReport.iterations` says which iterations went wrong.

  Attributes:
    sites: one `SiteReport` per probe, first reached first.
  """

  sites: tuple[SiteReport, ...]

  @property
  def first(self) -> str | None:
    """The first probe in backward order whose cotangent had a nan or an inf.

    The non-finite value was made between this probe and the one before it
    in `sites` (or the function's output, if it is the first). None if every
    reached probe saw only finite values.
    """
    for s in self.sites:
      if s.reached and not s.finite:
        return s.site
    return None

  def __str__(self) -> str:
    rows = [f"{'probe':<16} {'nans':>6} {'infs':>6} {'max |ct|':>10}"]
    for s in self.sites:
      if not s.reached:
        rows.append(f"{s.site:<16} (backward pass did not reach it)")
        continue
      line = f"{s.site:<16} {s.nans:>6} {s.infs:>6} {s.max_abs:>10.3g}"
      if s.iterations:
        line += f"  iterations {[list(i) for i in s.iterations]}"
      if s.site == self.first:
        line += "  <- first non-finite"
      rows.append(line)
    return "\n".join(rows)


class CotangentWatch:
  """Places cotangent probes and reads what they logged.

  ``watch(x, name)`` returns ``x`` through a `CotangentProbe` named ``name``
  (``x`` a floating-point array; names unique within one backward pass).
  `report` and `check` take the logs from ``f_vjp.with_logs(ct)``.
  """

  def __init__(self):
    self._order: dict[str, None] = {}  # site names, in first-traced order

  def __call__(self, x: Any, name: str) -> Any:
    if not isinstance(name, str):
      raise TypeError(f"CotangentWatch: a probe's name must be a str, got "
                      f"{type(name).__name__}")
    aval = jax.typeof(x)
    if not jnp.issubdtype(aval.dtype, jnp.inexact):
      raise TypeError(
          f"CotangentWatch: probe {name!r} was given a {aval.dtype} value; "
          "only floating-point (or complex) values have cotangents that can "
          "be non-finite. Probe a floating-point value instead")
    self._order.setdefault(name, None)
    return CotangentProbe(aval, name)(x)

  @property
  def sites(self) -> tuple[str, ...]:
    """The probe names seen so far, in the order they were first traced."""
    return tuple(self._order)

  def report(self, logs: Any) -> NonFiniteReport:
    """Reads the probes' entries out of ``logs`` (other keys are ignored).

    ``logs`` must hold concrete values: call this outside ``jit`` (return the
    logs from the jitted function). Raises TypeError for an entry that is not
    a probe's summary, e.g. from a probe inside ``cond``, whose logs JAX wraps
    per branch.
    """
    out = []
    for site in reversed(self._order):
      if site not in logs:
        out.append(SiteReport(site, reached=False))
        continue
      entry = logs[site]
      if not (isinstance(entry, dict)
              and set(entry) == {"nans", "infs", "max_abs"}):
        raise TypeError(
            f"CotangentWatch.report: the log entry {site!r} is "
            f"{type(entry).__name__}, not a probe's summary (a dict with "
            "'nans', 'infs', 'max_abs'); probes inside a `cond` branch are "
            "not supported: probe the cond's inputs and outputs instead")
      nans, infs = np.asarray(entry["nans"]), np.asarray(entry["infs"])
      max_abs = np.asarray(entry["max_abs"])
      bad = np.argwhere((nans + infs) > 0) if nans.ndim else ()
      # The backward pass runs a scan's iterations last to first.
      iterations = tuple(tuple(int(i) for i in row) for row in bad[::-1])
      out.append(SiteReport(site, True, int(nans.sum()), int(infs.sum()),
                            float(max_abs.max(initial=0.)), iterations))
    return NonFiniteReport(tuple(out))

  def check(self, logs: Any) -> NonFiniteReport:
    """`report`, raising FloatingPointError if any probe saw a nan or an inf.

    Raises ValueError if the watch has probes but none of them logged
    anything: then nothing was checked, and passing would be a false
    all-clear.
    """
    report = self.report(logs)
    if report.sites and not any(s.reached for s in report.sites):
      raise ValueError(
          f"CotangentWatch.check: none of the {len(report.sites)} probes "
          f"({', '.join(repr(s.site) for s in report.sites)}) logged a "
          "cotangent, so nothing was checked. Pass the logs that "
          "`f_vjp.with_logs(ct)` returns for a function that applies the "
          "probes; probes whose outputs do not affect the result, or that sit "
          "inside a jax.custom_vjp function or a while_loop, are not reached")
    first = report.first
    if first is not None:
      raise FloatingPointError(
          f"the backward pass produced a non-finite cotangent first at probe "
          f"{first!r}: it was made between that probe and the one the "
          f"backward pass reached before it.\n{report}")
    return report
