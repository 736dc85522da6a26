"""recipes/custom_yaml: `python -m verl.trainer.main_mlmt` trains on a task defined in YAML, graded by its score_fn.

The task file is preprocessed by the real CLI (``agent_system.data.preprocess --dataset yaml``); the trainer grades
its rows in the sandbox through the RewardPool. The task's functions are chosen so that the rewards can only have
come from them, with the done_fn cut and the context applied as documented: ``score_fn`` is 0 unless ``text`` starts
with the chat-templated prompt (the context), and otherwise (length of the response up to the cut) mod 5, / 4;
``done_fn`` ends the episode once the response holds two spaces. The test recomputes every R1 and R3 of the
trajectories from the attempt and refinement texts with the same rule. 3 steps, tiny models, the hf rollout at both
levels.

The same run checks its pre-flight plan (``run_plan.json``) against what it did: under (tH, tL) = (1, 2) the LL is
updated at steps 1 and 3, the HL at step 2; cosine schedules with a 50 % warm-up span each level's updates (the
lr verl reports after each update is the plan's); the LL's 12 rows with mini-batches of "5" run as 3 mini-batches of
4, which start-up says; stage II starts at step 3.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mlmt_run import run_main, trajectories

pytestmark = pytest.mark.e2e

TASK = """\
main_prompt: "Answer in a few words."
items:
  - {prompt: "Name a colour.", answer: red}
  - {prompt: "Name an animal.", answer: cat}
  - {prompt: "Name a fruit.", answer: pear}
  - {prompt: "Name a tool.", answer: saw}
score_fn: |
  def score_fn(text, answer):
      if not text.startswith("<|im_start|>user\\n"):
          return 0.0
      return (len(text.split("<|im_start|>assistant\\n")[-1]) % 5) / 4
done_fn: |
  def done_fn(text):
      return text.split("<|im_start|>assistant\\n")[-1].count(" ") >= 2
split_fn: |
  def split_fn(output):
      return output.endswith("\\n")
"""


def expected_score(response: str) -> tuple[float, bool]:
    """The task's reward of ``response`` (cut after its second space), and whether the cut dropped anything."""
    spaces = [i for i, char in enumerate(response) if char == " "]
    cut = response[: spaces[1] + 1] if len(spaces) >= 2 else response
    return (len(cut) % 5) / 4, len(cut) < len(response)


def test_main_mlmt_trains_on_a_yaml_task_graded_by_its_score_fn(tiny_models, tmp_path):
    task = tmp_path / "task.yaml"
    task.write_text(TASK)
    data = tmp_path / "task.parquet"
    command = [sys.executable, "-m", "agent_system.data.preprocess", "--dataset", "yaml", "--input", str(task)]
    done = subprocess.run([*command, "--output", str(data)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    out = tmp_path / "run"
    metrics = run_main(
        out,
        [
            f"actor_rollout_ref.model.path={tiny_models['ll']}",
            f"hl.model.path={tiny_models['hl']}",
            "actor_rollout_ref.rollout.name=hf",
            "hl.rollout.name=hf",
            f"data.train_files={data}",
            f"data.val_files={data}",
            "data.train_batch_size=2",
            "data.max_response_length=12",
            "hl.rollout.response_length=8",
            "mlmt.n=2",
            "mlmt.m=2",
            "mlmt.reward.num_workers=1",
            "mlmt.trajectories_per_step=100",
            # the grades are what this checks, not the time limit (tests/unit/rewards: the pool's timeouts): a CI
            # run at 5 s had a reward worker time out while two vLLM servers started beside it, every response 0
            "mlmt.reward.timeout_s=60",
            "trainer.total_training_steps=3",
            "mlmt.schedule.tH=1",
            "mlmt.schedule.tL=2",
            "mlmt.stages.schedule=[0,3]",
            "mlmt.stages.stage_ids=[1,2]",
            "mlmt.stages.alpha=[0,1]",
            *[f"mlmt.stages.{key}=[0,0]" for key in ("beta_turn1", "beta_turn2", "beta_turn3")],
            "actor_rollout_ref.actor.ppo_mini_batch_size=5",
            *[
                f"{tree}.optim.{key}"
                for tree in ("actor_rollout_ref.actor", "hl.actor")
                for key in ("lr_scheduler_type=cosine", "lr_warmup_steps_ratio=0.5")
            ],  # fmt: skip
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "actor_rollout_ref.actor.optim.lr=1e-3",
            "hl.actor.optim.lr=1e-3",
        ],
    )
    assert sorted(metrics) == [1, 2, 3]
    rewards, cut = [], 0
    for step in (1, 2, 3):
        records = trajectories(out, step)
        assert len(records) == 2 * 2 * 2  # B problems x n attempts x m feedbacks
        for record in records:
            assert record["prompts"]["solve"].startswith("Answer in a few words.\n\nName a")  # main_prompt + prompt
            for text, reward in ((record["attempt"], record["R1"]), (record["refinement"], record["R3"])):
                expected, was_cut = expected_score(text)
                assert reward == pytest.approx(expected), (step, text, reward, expected)
                rewards.append(reward)
                cut += was_cut
    assert len(set(rewards)) > 1 and cut > 0, (rewards, cut)  # graded texts varied and the cut acted
    assert Path(out.parent / f"{out.name}.log").read_text().count("yaml_task grading") == 0  # no function failed

    # the plan written before any worker started, and what the run did
    log = Path(out.parent / f"{out.name}.log").read_text()
    plan = json.loads((out / "run_plan.json").read_text())
    ll, hl = plan["levels"]["ll"], plan["levels"]["hl"]
    assert (ll["update_steps"], hl["update_steps"]) == ([1, 3], [2])
    for level, steps in (("ll", [1, 3]), ("hl", [2])):
        assert [step for step in (1, 2, 3) if metrics[step].get(f"{level}/updated")] == steps, level
    assert [metrics[step]["train/stage_index"] for step in (1, 2, 3)] == [0, 0, 1]
    assert [stage["first_step"] for stage in plan["stages"]] == [1, 3]
    # lr verl reported after each update: LL warm-up of 1 update of 2, then the cosine's end; HL: its only update
    lr = 1e-3
    assert ll["lr"]["horizon"] == 2 and ll["lr"]["first"] == 0.0 and ll["lr"]["last"] == pytest.approx(lr)
    assert metrics[1]["ll/lr"] == pytest.approx(lr) and metrics[3]["ll/lr"] == pytest.approx(0.0, abs=1e-12)
    assert hl["lr"]["horizon"] == 1 and hl["lr"]["last"] == pytest.approx(lr)
    assert metrics[2]["hl/lr"] == pytest.approx(0.0, abs=1e-12)
    assert (ll["mini_batch"], ll["optimizer_steps_per_update"]) == (4, 3)
    assert "actor_rollout_ref.actor.ppo_mini_batch_size=5: 12 rows per update split into mini-batches of 4" in log
    assert "run plan checked" in log  # the trainer's own end-of-run comparison passed
