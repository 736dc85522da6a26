"""The loop's extension points (agent_system/trainer/hooks.py, docs/EXTENDING.md): the loop and the advantage code name
no method, each method is selected by its own config keys, and the typed step data checks its shapes."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from agent_system import methods
from agent_system.config import compose_config
from agent_system.trainer import advantages as adv
from agent_system.trainer.mlmt_trainer import MLMTTrainer
from agent_system.trainer.rows import LevelInputs, RowKeys, StepScores

METHOD_WORDS = ("archer", "value_baseline", "value_shaped", "value_shaping", "ref_refresh", "confidence_lambda", "yaml")


def test_the_methods_read_of_the_trainer_only_what_the_hooks_protocol_lists():
    """Every ``trainer.<name>`` a method reads (its hooks are handed the trainer) is an attribute of ``hooks.Loop``."""
    import ast
    from pathlib import Path

    from agent_system.trainer.hooks import Loop

    read = {}
    for path in Path(methods.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "trainer":
                read.setdefault(node.attr, set()).add(path.name)
    assert {"groups", "tokenizers"} <= set(read)
    assert set(read) <= set(Loop.__annotations__), {
        name: f for name, f in read.items() if name not in Loop.__annotations__
    }


def test_the_loop_and_the_advantage_code_name_no_method():
    loop = [MLMTTrainer.fit, MLMTTrainer.score, MLMTTrainer.train_levels, MLMTTrainer.build_level_batch]
    sources = {f.__qualname__: inspect.getsource(f) for f in loop} | {"advantages.py": inspect.getsource(adv)}
    found = {name: [w for w in METHOD_WORDS if w in source.lower()] for name, source in sources.items()}
    assert not any(found.values()), found


@pytest.mark.parametrize(
    ("overrides", "selected"),
    [
        ([], []),
        (["mlmt.ll.adv_estimator=archer"], ["archer"]),
        (["mlmt.ll.adv_estimator=value_baseline"], ["value_shaping"]),
        (["mlmt.ll.ref_refresh_freq=2"], ["ref_refresh"]),
        (["mlmt.reward.confidence_lambda=0.1"], ["confidence"]),
        (["mlmt.reward.leak_penalty=0.5"], ["leak_penalty"]),
    ],
)
def test_each_method_is_selected_by_its_own_keys(overrides, selected):
    assert [extension.name for extension in methods.load(compose_config(overrides))] == selected


def test_only_a_run_with_the_reference_refresh_gets_the_refreshable_worker():
    from agent_system.levels.turn_kl import ActorWorker
    from agent_system.methods.reinforce_kl.ref_refresh import RefreshableActorWorker

    def classes(overrides):
        extensions = methods.load(compose_config(overrides))
        result = {}
        for level in ("ll", "hl"):
            result[level] = ActorWorker
            for extension in extensions:
                result[level] = extension.actor_class(level, result[level])
        return result

    assert classes([]) == {"ll": ActorWorker, "hl": ActorWorker}
    assert not hasattr(ActorWorker, "refresh_reference")
    assert classes(["mlmt.ll.ref_refresh_freq=2"]) == {"ll": RefreshableActorWorker, "hl": ActorWorker}


def test_step_scores_state_their_shapes():
    r1, r3 = np.zeros((2, 3)), np.zeros((2, 3, 2))
    assert StepScores(r1=r1, r3=r3).refinements == 2
    with pytest.raises(ValueError, match="r3 has shape"):
        StepScores(r1=r1, r3=np.zeros((2, 2, 2)))
    with pytest.raises(ValueError, match="r_ref_attempt"):
        StepScores(r1=r1, r3=r3, r_ref_attempt=np.zeros((2, 3, 2)))
    with pytest.raises(ValueError, match="not both"):
        StepScores(r1=r1, r3=r3, r_ref_attempt=np.zeros((2, 3)), r_ref_feedback=np.zeros((2, 3, 2)))
    keys = RowKeys(turn=[2, 2], problem=[0, 1], attempt=[2, 0], feedback=[1, 0])
    scores = StepScores(r1=r1, r3=r3, r_ref_feedback=np.arange(12.0).reshape(2, 3, 2))
    np.testing.assert_array_equal(scores.r_ref_of(keys), [5.0, 6.0])


def test_a_registered_task_reward_replaces_the_levels_reward_and_extra_reward_adds():
    mlmt = OmegaConf.create(
        {
            "ll": {"adv_estimator": "reinforce", "turn3_group_by": "problem"},
            "hl": {"adv_estimator": "reinforce"},
            "reward": {"hl_reward": "test_only", "contrastive_lambda": 0.0},
            "stages": {"kl_in": "loss"},
        }
    )
    rows = RowKeys(turn=[2, 2], problem=[0, 0], attempt=[0, 0], feedback=[0, 1])
    scores = StepScores(r1=np.zeros((1, 1)), r3=np.array([[[1.0, 0.0]]]))
    stage = adv.Stage(stage_id=2, beta_turn1=0.0, beta_turn2=0.0, beta_turn3=0.0, alpha=0.0)
    inputs = LevelInputs(kl=np.zeros(2), response_mask=torch.ones(2, 3), extra_reward=np.array([0.5, 0.25]))

    def rewards(rows, scores, stage, mlmt, inputs):
        return np.array([10.0, 20.0])

    adv.register_task_reward("test_only", lambda level, m: level == "hl" and m.reward.hl_reward == "test_only")(rewards)
    try:
        result = adv.level_advantages(
            level="hl", rows=rows, scores=scores, stage=stage, mlmt=mlmt, algorithm=None, inputs=inputs
        )
        with pytest.raises(ValueError, match="already registered"):
            adv.register_task_reward("test_only", lambda level, m: False)(lambda *a: None)
    finally:
        del adv.TASK_REWARDS["test_only"]
    np.testing.assert_allclose(result.task_rewards, [10.5, 20.25])
    torch.testing.assert_close(result.advantages, torch.tensor([[10.5] * 3, [20.25] * 3]))
