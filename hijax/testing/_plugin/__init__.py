"""``pytest --hijax-check-rules`` (loaded by ``_hijax_pytestplugin`` only when
asked for): `_recorder` records the rules called, `_check` checks one,
`_pytest` holds the hooks; the checker only through `hijax.testing`."""
from hijax.testing._plugin._pytest import PLUGIN_NAME, RuleCheckPlugin

__all__ = ["PLUGIN_NAME", "RuleCheckPlugin"]
