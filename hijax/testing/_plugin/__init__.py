"""``pytest --hijax-check-rules``, a layer over the checker reaching it only
through `hijax.testing`'s public names; loaded by the entry module
``_hijax_pytestplugin`` (at the repository root) only when asked for.

  _recorder  which rule a call is, and the inputs kept (CallRecorder)
  _check     one recorded rule checked at its inputs (check_rule)
  _pytest    RuleCheckPlugin: the hooks, the table, the JSON report
"""
from hijax.testing._plugin._pytest import PLUGIN_NAME, RuleCheckPlugin

__all__ = ["PLUGIN_NAME", "RuleCheckPlugin"]
