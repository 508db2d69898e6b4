"""hijax: custom JAX primitives with your own derivative and batching rules.

Subclass `HiPrim`, declare the argument and result types, give an `expand`
implementation in ordinary JAX, and add the rules the transformations you use
need (see the JAX 301 pages, "Custom derivative rules with hijax primitives").
"""
import importlib
from typing import TYPE_CHECKING, Any

from jax.core import ShapedArray
# Names of jax.experimental.hijax that hijax's rules need nothing new for:
# JAX's own objects (types, effects, the transpose helper).
from jax.experimental.hijax import (AbstractRef, AbstractValue, TransformedRef,
                                    control_flow_allowed_effects,
                                    is_undefined_primal)

from hijax import _metadata

# Re-exports only. Imports point one way (see ARCHITECTURE.md): primitive
# imports only private helpers; autodiff, remat import primitive; batching and
# derived import autodiff; testing and implicit import those; hitypes stands alone.
# Importing the rule modules is what registers them: each appends its installer
# to primitive.RULE_INSTALLERS, run for every HiPrim subclass defined later.
from hijax.primitive import HiPrim, VJPHiPrimitive
from hijax.autodiff import (GradAccum, NullAccum, RefAccum, ValAccum, Zero,
                            instantiate_zeros)
from hijax.batching import (bdims_at_front, unmap_avals,  # (installs the vmap rule)
                            vmap_rule)
from hijax.derived import (NonlinearBackwardError, jvp_from_lin, jvp_from_vjp,
                           linearize_from_jvp, vjp_from_jvp, vjp_from_lin)
from hijax.hitypes import (HiPspec, HiType, MappingSpec, aval_method,
                           aval_property, register_hitype)
from hijax.remat import (SaveAndOffloadOnlyTheseNames, SaveAnyNamesButThese,
                         SaveOnlyTheseNames, custom_remat,
                         save_and_offload_only_these_names,
                         save_any_names_but_these, save_only_these_names)
from hijax._avals import (mapped_aval, saved_residuals, shard_aval,
                          unmapped_aval, unshard_aval)
from hijax.closure import (ClosureConverted, closure_convert,
                           closure_convert_params)
from hijax.residuals import (Residual, ResidualReport, assert_residual_bytes,
                             residual_report)
from hijax._decorators import custom_jvp, custom_vjp
from hijax._checks import RuleTypeError
from hijax._decorators._outputs import CotangentTypeError
from hijax import implicit  # noqa: F401  (hijax.implicit.fixed_point, ...)
from hijax import debug  # noqa: F401  (hijax.debug.CotangentWatch)

__all__ = [
    "HiPrim", "VJPHiPrimitive", "AbstractValue", "AbstractRef",
    "TransformedRef", "control_flow_allowed_effects", "is_undefined_primal",
    "vmap_rule", "bdims_at_front", "unmap_avals",
    "SaveAndOffloadOnlyTheseNames", "save_and_offload_only_these_names",
    "ShapedArray", "Zero", "instantiate_zeros", "GradAccum",
    "ValAccum", "RefAccum", "NullAccum", "linearize_from_jvp", "vjp_from_lin",
    "vjp_from_jvp", "jvp_from_lin", "jvp_from_vjp", "HiType", "register_hitype", "MappingSpec",
    "HiPspec", "aval_method", "aval_property", "custom_remat",
    "SaveOnlyTheseNames", "save_only_these_names", "SaveAnyNamesButThese",
    "save_any_names_but_these", "mapped_aval", "unmapped_aval", "shard_aval",
    "unshard_aval", "saved_residuals", "closure_convert",
    "closure_convert_params", "ClosureConverted", "residual_report",
    "assert_residual_bytes", "ResidualReport", "Residual",
    "custom_vjp", "custom_jvp",
    "RuleTypeError", "CotangentTypeError", "NonlinearBackwardError",
]
if TYPE_CHECKING:
  from hijax import testing  # noqa: F401  (loaded when first used: below)


def __getattr__(name: str) -> Any:
  """``hijax.testing`` (the rule checker) is imported when first used, so
  that ``import hijax`` loads no checker."""
  if name == "testing":
    return importlib.import_module("hijax.testing")
  raise AttributeError(f"module 'hijax' has no attribute {name!r}")


__version__: str = _metadata.installed_version()
_metadata.warn_on_clash()
