"""The one place where the checker recognizes an error raised by others (JAX,
a JAX library) by its words, where no exception type tells: each pattern,
who raises it, the releases it was seen in (tests/test_testing_words.py).
hijax's own conditions are told by type, never by these words.
"""
from __future__ import annotations

import re
from typing import NamedTuple


class Words(NamedTuple):
  """A regular expression searched in the message, who raises it, and the
  releases whose error it was seen to match."""
  pattern: str
  raised_by: str
  seen_in: tuple[str, ...]


# What JAX and JAX libraries raise where a function declares that it cannot
# be differentiated (again) in some mode: a limit by design, not a broken rule.
DECLARED_LIMITS = (
    Words(r"can't apply forward-mode autodiff \(jvp\) to a custom_vjp function",
          "JAX: jax.jvp of a jax.custom_vjp function (TypeError)",
          ("jax 0.11.2", "jax 0.12.0.1")),
    Words(r"Reverse-mode differentiation does not work for lax\.while_loop",
          "JAX: reverse mode of lax.while_loop (ValueError)",
          ("jax 0.11.2", "jax 0.12.0.1")),
    Words(r"not (?:reverse-mode |forward-mode )?differentiable",
          "a library's refusal in these words (none of JAX, equinox, "
          "optimistix, lineax raises it in the releases below; kept for "
          "others)", ()),
    Words(r"does not support (?:reverse|forward)-mode",
          "JAX: linearizing an operation without reverse mode (ValueError "
          "'... does not support reverse-mode autodiff')",
          ("jax 0.11.2", "jax 0.12.0.1")),
    Words(r"cannot be (?:auto)?differentiated",
          "equinox.nondifferentiable's jvp rule (RuntimeError 'Unexpected "
          "tangent. ... cannot be autodifferentiated.'); JAX's FFI calls "
          "without a rule", ("equinox 0.13",)),
)


def declares_limit(e: BaseException) -> bool:
  """Whether ``e``'s message is one of `DECLARED_LIMITS`."""
  return any(re.search(w.pattern, str(e)) for w in DECLARED_LIMITS)
