"""`Compiles`, the counter of compilations shared by the cache tests,
`Lowered`, the names of the programs lowered, and `opcodes`, the
instructions of a compiled program by opcode (its kernels: fusions).

A test of a cache asserts that a second call compiles nothing; JAX reports
each trace of a jaxpr, each lowering and each XLA compilation as an event
of `jax.monitoring`, which these count while active.
"""
import collections
import re

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


# An instruction of compiled HLO text: `%name = TYPE opcode(operands), ...`
# (the type may be a tuple, in parentheses; the opcode is the first word
# followed by a parenthesis after it).
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%\S+ = .*?([a-z][a-z\-]*)\(", re.M)


def opcodes(fn, *args) -> collections.Counter:
  """How many instructions of each opcode ``jax.jit(fn)`` compiled at
  ``args`` holds, in every computation of its optimized HLO (the kernels
  XLA's CPU backend compiles one by one are its ``fusion`` instructions)."""
  text = jax.jit(fn).lower(*args).compile().as_text()
  return collections.Counter(_INSTRUCTION.findall(text))
