"""A negative control of the learning study (issue 34), loaded with ``mlmt.plugins=[plugin_negated_grpo]``: registers
the estimator ``negated_grpo``, minus verl's GRPO advantages (the same groups), so that a level selecting it
(``mlmt.hl.adv_estimator=negated_grpo``) is pushed away from what was rewarded. Test-side only."""

from __future__ import annotations

from agent_system.trainer.advantages import compute_advantages, register_estimator


@register_estimator("negated_grpo")
def compute_negated_grpo_advantage(token_level_rewards, response_mask, index, config=None, **kwargs):
    advantages, returns = compute_advantages("grpo", token_level_rewards, response_mask, index, config)
    return -advantages, returns
