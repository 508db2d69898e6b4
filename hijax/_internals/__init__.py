"""The one door to JAX's internals (``jax._src``).

hijax builds on JAX's public extension points where they exist:
``jax.extend.core.Primitive``, ``jax.interpreters.ad.primitive_jvps``,
``jax.interpreters.batching.fancy_primitive_batchers``,
``jax.interpreters.partial_eval.dce_rules``, ``jax.tree_util``,
``jax.api_util``, ``jax.extend.linear_util`` and the classes of
``jax.experimental.hijax``. What it needs beyond them (the reverse-mode and
staging rule tables, the jaxpr printer, type matching, shard_map's per-device
types, ...) has no public API, and is imported from ``jax._src`` here and only
here: ``tests/test_layout.py`` fails when any other hijax module imports
``jax._src``.

Each module below is named for the JAX module it adapts and re-exports only
the names hijax uses from it. Its docstring has a table: each name taken from
``jax._src`` with why no public API serves (``tests/test_layout.py`` checks
that the table lists exactly those names), then the names that come from a
public module and are re-exported so the code that uses them keeps one
namespace (``core.typeof`` is ``jax.typeof``).

These are the files a new JAX release is most likely to break; the supported
versions' differences live in ``hijax._compat``.

==================  =====================================================
module              adapts
==================  =====================================================
``ad``              ``jax._src.interpreters.ad``
``ad_checkpoint``   ``jax._src.ad_checkpoint``
``api``             ``jax._src.api``
``batching``        ``jax._src.interpreters.batching``
``core``            ``jax._src.core``
``dtypes``          ``jax._src.dtypes``
``lax``             ``jax._src.lax.lax``
``partial_eval``    ``jax._src.interpreters.partial_eval``
``pretty_printer``  ``jax._src.pretty_printer``
``remat``           ``jax._src.interpreters.remat``
``traceback_util``  ``jax._src.traceback_util``
==================  =====================================================
"""
