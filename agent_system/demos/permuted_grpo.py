"""The null control of the relay demo and the learning study, loaded with
``mlmt.plugins=[agent_system.demos.permuted_grpo]``: registers the estimator ``permuted_grpo``, verl's GRPO advantages
of the rewards shuffled within each group, so that a level selecting it (``mlmt.hl.adv_estimator=permuted_grpo``) gets
as much reward, as often, as with GRPO, but none of it follows what the level wrote. Not a method: a control that
shows what a run looks like when the level's updates carry no signal."""

from __future__ import annotations

import numpy as np
import torch

from agent_system.trainer.advantages import compute_advantages, register_estimator

_RNG = np.random.default_rng(0)  # one stream per process: a step's shuffle differs from the last step's


@register_estimator("permuted_grpo")
def compute_permuted_grpo_advantage(token_level_rewards, response_mask, index, config=None, **kwargs):
    # GRPO scores a row by the sum of its token rewards: moving whole rows moves each row's reward to another row
    shuffled = token_level_rewards.clone()
    keys = np.asarray(index)
    for key in np.unique(keys):
        rows = np.flatnonzero(keys == key)
        shuffled[torch.as_tensor(rows)] = token_level_rewards[torch.as_tensor(_RNG.permutation(rows))]
    return compute_advantages("grpo", shuffled, response_mask, index, config)
