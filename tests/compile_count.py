"""`Compiles`, the counter of compilations shared by the cache tests, and
`Lowered`, the names of the programs lowered.

A test of a cache asserts that a second call compiles nothing; JAX reports
each trace of a jaxpr, each lowering and each XLA compilation as an event
of `jax.monitoring`, which these count while active.
"""
import jax
import jax.monitoring


class Compiles:
  """Counts XLA compilations and jaxpr traces while active (``with``)."""
  EVENTS = ("/jax/core/compile/backend_compile_duration",
            "/jax/core/compile/jaxpr_trace_duration")

  def __enter__(self):
    self.count = 0
    jax.monitoring.register_event_duration_secs_listener(self._listen)
    return self

  def _listen(self, event, duration, **kwargs):
    del duration, kwargs
    self.count += event in self.EVENTS

  def __exit__(self, *exc):
    jax.monitoring.unregister_event_duration_listener(self._listen)


class BackendCompiles(Compiles):
  """Counts XLA compilations only (not traces)."""
  EVENTS = ("/jax/core/compile/backend_compile_duration",)


class Lowered:
  """The names of the programs lowered while active (``with ... as
  names``), one per program (a persistent-cache hit is lowered too)."""
  EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"

  def __enter__(self) -> list:
    self.names = []
    jax.monitoring.register_event_duration_secs_listener(self._listen)
    return self.names

  def _listen(self, event, duration, **kwargs):
    del duration
    if event == self.EVENT:
      self.names.append(kwargs.get("fun_name"))

  def __exit__(self, *exc):
    jax.monitoring.unregister_event_duration_listener(self._listen)
