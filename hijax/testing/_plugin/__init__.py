"""``pytest --hijax-check-rules``: the pytest plugin, a layer over the
checker that reaches it only through `hijax.testing`'s public names
(``check_rules``, ``RuleReport``). Loaded by the entry point
``_hijax_pytestplugin`` (at the repository root) only when asked for.

  _rule_identity  which function a rule is (its code and what it holds), and
                  the short path that names where it is defined
  _recorder       CallRecorder: the rules the tests' calls reach, with the
                  inputs they were called with
  _inputs         the inputs a recorded rule is checked at
  _check          one recorded rule checked (check_rule, RuleResult)
  _table          the table and summary printed at the end of the session
  _pytest         RuleCheckPlugin: the hooks that record and then check
"""
from hijax.testing._plugin._pytest import PLUGIN_NAME, RuleCheckPlugin

__all__ = ["PLUGIN_NAME", "RuleCheckPlugin"]
