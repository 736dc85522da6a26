"""RL-guided SCoRe's guidance-model (HL) advantages, under the settings of recipes/rl_guided_score: a feedback after
which the solver's second attempt is correct gets a higher advantage than one after which it is not.

``advantages.level_advantages`` (the function the trainer calls) on the HL rows of one problem, n = 2 attempts,
m = 2 feedbacks each, checked against an independent computation with a known sign: REINFORCE on R3 (the recipe)
puts +1 on every token of a feedback that led to a correct refinement and 0 on the others; GRPO over the m feedbacks
on one attempt (the trainer's default estimator) gives +1/√2 and −1/√2 for R3 = (1, 0). Both stages (the guidance
reward is R3 in each). A negated advantage fails every case. The update that follows, on a real verl actor:
tests/integration/test_rl_guided_score_direction_on_cpu.py.
"""

import numpy as np
import pytest
import torch

from agent_system.config import compose_config
from agent_system.trainer import advantages as adv
from agent_system.trainer.rows import LevelInputs, RowKeys, StepScores

# the recipe's keys (recipes/rl_guided_score/run_rl_guided_score.sh: RR, the SCoRe stages, the guidance reward)
RECIPE = [
    "mlmt.reward.hl_reward=r3",
    "mlmt.ll.adv_estimator=reinforce",
    "mlmt.hl.adv_estimator=reinforce",
    "mlmt.stages.schedule=[0,2]",
    "mlmt.stages.stage_ids=[1,2]",
    "mlmt.stages.beta_turn1=[0.1,0.01]",
    "mlmt.stages.beta_turn2=[0.0,0.0]",
    "mlmt.stages.beta_turn3=[0.01,0.01]",
    "mlmt.stages.alpha=[0.0,10.0]",
    "hl.actor.use_kl_loss=true",
    "hl.actor.kl_loss_coef=0.05",
    "hl.actor.kl_loss_type=low_var_kl",
]
HL_ROWS = {"problem": [0, 0, 0, 0], "attempt": [0, 0, 1, 1], "feedback": [0, 1, 0, 1], "turn": [2, 2, 2, 2]}
R3 = np.array([[[1.0, 0.0], [0.0, 1.0]]])  # the second attempt is correct after feedbacks (0, 0) and (1, 1)
R1 = np.array([[0.0, 1.0]])  # attempt 1 was already right: R1 must not enter the guidance reward


def _expected(estimator: str) -> np.ndarray:
    r3 = R3.reshape(-1)
    if estimator == "reinforce":
        return r3
    # GRPO: (R3 − mean) / (std + ε) over the feedbacks on one attempt (unbiased std, as torch.std)
    out = np.empty_like(r3)
    for attempt in (0, 1):
        rows = np.array(HL_ROWS["attempt"]) == attempt
        out[rows] = (r3[rows] - r3[rows].mean()) / (r3[rows].std(ddof=1) + 1e-6)
    return out


@pytest.mark.parametrize("step", [1, 2])
@pytest.mark.parametrize("estimator", ["reinforce", "grpo"])
def test_feedback_that_led_to_a_correct_refinement_gets_the_higher_advantage(estimator, step):
    config = compose_config([*RECIPE, f"mlmt.hl.adv_estimator={estimator}"])
    _, stage = adv.stage_at(config.mlmt.stages, step)
    mask = torch.ones(4, 5, dtype=torch.long)
    mask[1::2, 3:] = 0  # feedbacks of different lengths
    result = adv.level_advantages(
        level="hl",
        rows=RowKeys(**HL_ROWS),
        scores=StepScores(r1=R1, r3=R3),
        stage=stage,
        mlmt=config.mlmt,
        algorithm=config.algorithm,
        inputs=LevelInputs(kl=np.zeros(4), response_mask=mask),
    )
    expected = torch.as_tensor(_expected(estimator), dtype=torch.float32)[:, None] * mask
    torch.testing.assert_close(result.advantages.float() * mask, expected)
    np.testing.assert_array_equal(result.task_rewards, R3.reshape(-1))
    per_row = (result.advantages * mask).sum(-1) / mask.sum(-1)
    assert per_row[0] > per_row[1] and per_row[3] > per_row[2], per_row  # the sign, stated on its own
    assert per_row[0] > 0 and per_row[3] > 0, per_row
