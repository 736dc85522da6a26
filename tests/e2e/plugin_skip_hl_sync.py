"""A negative control of the learning study (issue 34), loaded with ``mlmt.plugins=[plugin_skip_hl_sync]``: every push
of the feedback writer's weights into its rollout server after the first is a no-op, so the server keeps sampling with
the weights it started with while the HL's actor trains. Test-side only (a patch of the class on import)."""

from __future__ import annotations

from agent_system.levels.policy import PolicyGroup

_push_weights = PolicyGroup.push_weights
_pushed: set[int] = set()  # the HL policy groups that have had their first push


def _first_push_only_for_the_hl(self, global_steps, *args, **kwargs):
    if self.level == "hl" and id(self) in _pushed:
        return
    if self.level == "hl":
        _pushed.add(id(self))
    _push_weights(self, global_steps, *args, **kwargs)


PolicyGroup.push_weights = _first_push_only_for_the_hl
