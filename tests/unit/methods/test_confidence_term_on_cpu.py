"""The HL's confidence term (agent_system/methods/confidence): λ·clip(log-likelihood gain of the reference).

* the bonus is weighted and clipped;
* the context without feedback is the turn-3 prompt with the feedback removed (the same ``refine`` template, not the
  ``refine_no_feedback`` instruction), checked on the ids the term scores, with a real tokenizer and PromptBuilder;
* the term adds to the HL rows' ``extra_reward`` in whichever order the leak penalty runs (issue 34, item 9).
"""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from agent_system.methods.confidence import ConfidenceTerm, confidence_bonus
from agent_system.methods.leak_penalty import LeakPenalty
from agent_system.models.tiny import build_tiny_tokenizer
from agent_system.multi_turn_rollout.episode import Attempt, Episode, Refinement, Turn
from agent_system.prompts.templates import Prompt, PromptBuilder, Task
from agent_system.trainer.rows import LevelInputs, RowKeys, StepScores

TASK = Task("What is 2 + 3?", "math", "5")
ATTEMPT = "2 + 3 = 6, so the answer is 6."
FEEDBACKS = ["Check the addition: 2 + 3 is not 6.", "Recount on your fingers."]
REFERENCE = "2 + 3 = 5. The answer is 5."
BUDGET = 1024
LAMBDA, CLIP = 2.0, 1.0


def test_confidence_bonus_is_weighted_and_clipped():
    with_fb = np.array([-0.5, -1.0, -4.0, -1.0])
    without_fb = np.array([-1.0, -4.0, -1.0, -1.0])  # gains 0.5, 3.0, -3.0, 0.0
    np.testing.assert_allclose(confidence_bonus(with_fb, without_fb, weight=2.0, clip=1.0), [1.0, 2.0, -2.0, 0.0])


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))


class _Solver:
    """The LL's workers: records the scored rows; each reference token's log-prob is −0.01 × the prompt's length."""

    def __init__(self) -> None:
        self.prompts: list[list[int]] = []

    def compute_log_prob(self, batch):
        width = batch.batch["prompts"].shape[1]
        prompt_mask = batch.batch["attention_mask"][:, :width].bool()
        self.prompts = [row[mask].tolist() for row, mask in zip(batch.batch["prompts"], prompt_mask, strict=True)]
        lengths = prompt_mask.sum(-1, keepdim=True).float()
        return -0.01 * lengths.expand_as(batch.batch["response_mask"]).clone(), None


def _turn(prompt: Prompt, text: str, tokenizer) -> Turn:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return Turn(prompt, ids, [0.0] * len(ids), text, False)


def _step(tokenizer):
    """One problem, one attempt, two feedbacks, built as the rollout builds them; the trainer the term reads."""
    builder = PromptBuilder()
    attempt = _turn(builder.solve(TASK, tokenizer, BUDGET), ATTEMPT, tokenizer)
    refinements = []
    for feedback in FEEDBACKS:
        feedback_turn = _turn(builder.feedback(TASK, ATTEMPT, "", tokenizer, BUDGET), feedback, tokenizer)
        refine_prompt = builder.refine(TASK, ATTEMPT, feedback, tokenizer, BUDGET)
        refinements.append(Refinement(feedback_turn, _turn(refine_prompt, "5", tokenizer)))
    episodes = [Episode(0, TASK, [Attempt(attempt, refinements)])]
    problems = [{"prompt": [{"content": TASK.problem}], "extra_info": {"reference_solution": REFERENCE}}]
    trainer = SimpleNamespace(
        tokenizers={"ll": tokenizer},
        runner=SimpleNamespace(prompts=builder),
        config=OmegaConf.create({"data": {"max_response_length": 256, "max_prompt_length": BUDGET}}),
        groups={"ll": _Solver()},
        mlmt=OmegaConf.create({"reward": {"confidence_lambda": LAMBDA, "confidence_clip": CLIP}}),
    )
    keys = RowKeys(problem=np.array([0, 0]), attempt=np.array([0, 0]), feedback=np.array([0, 1]), turn=np.array([2, 2]))
    scores = StepScores(r1=np.zeros((1, 1)), r3=np.zeros((1, 1, 2)), leak=np.array([[[1.0, 0.0]]]))
    step = SimpleNamespace(problems=problems, episodes=episodes, scores=scores)
    return trainer, step, SimpleNamespace(keys=keys), builder


def _decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids)


def test_the_context_without_feedback_is_the_turn3_prompt_with_the_feedback_removed(tokenizer):
    trainer, step, rows, builder = _step(tokenizer)
    inputs = LevelInputs(kl=np.zeros(2), response_mask=torch.ones(2, 3))
    ConfidenceTerm().level_inputs(trainer, "hl", step, rows, None, inputs)
    scored = trainer.groups["ll"].prompts
    assert len(scored) == 4  # two with feedback, then each one's context without it
    for k, feedback in enumerate(FEEDBACKS):
        with_feedback = _decode(tokenizer, scored[k])
        assert with_feedback == _decode(tokenizer, step.episodes[0].attempts[0].refinements[k].refinement.prompt_ids)
        assert _decode(tokenizer, scored[2 + k]) == with_feedback.replace(feedback, "", 1)
    # not the self-correction instruction, whose words differ from the turn-3 prompt's beyond the feedback
    instruction = builder.refine(TASK, ATTEMPT, None, tokenizer, BUDGET)
    assert _decode(tokenizer, scored[2]) != _decode(tokenizer, instruction.ids)
    # the bonus of each row from the scored log-probs: −0.01 × (prompt length with − without), clipped, × λ
    gains = [-0.01 * (len(scored[k]) - len(scored[2 + k])) for k in range(2)]
    np.testing.assert_allclose(inputs.extra_reward, LAMBDA * np.clip(gains, -CLIP, CLIP), rtol=1e-5)
    assert np.all(inputs.extra_reward < 0)  # a term the comparison can see


@pytest.mark.parametrize("confidence_first", [True, False])
def test_the_term_adds_to_the_other_methods_extra_rewards_in_either_order(tokenizer, confidence_first):
    trainer, step, rows, _ = _step(tokenizer)
    alone = LevelInputs(kl=np.zeros(2), response_mask=torch.ones(2, 3))
    ConfidenceTerm().level_inputs(trainer, "hl", step, rows, None, alone)
    inputs = LevelInputs(kl=np.zeros(2), response_mask=torch.ones(2, 3))
    hooks = [ConfidenceTerm(), LeakPenalty(0.5)]
    for hook in hooks if confidence_first else hooks[::-1]:
        hook.level_inputs(trainer, "hl", step, rows, None, inputs)
    # the first feedback leaks (−0.5), the second does not
    np.testing.assert_allclose(inputs.extra_reward, alone.extra_reward + np.array([-0.5, 0.0]), rtol=1e-6)
