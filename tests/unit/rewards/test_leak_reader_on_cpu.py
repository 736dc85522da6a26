"""The reader test (``mlmt.reward.leak_reader``, docs/LEAK.md "The reader test") with a real model whose gain is
measurable: SmolLM2-135M-Instruct (the embedded default model, ``agent_system.models.smollm2``). A feedback stating the
gold makes the gold a likelier immediate answer than a neutral feedback does, one that names no value does not.
Through the trainer's path (rows packed for the LL's workers, scored by a stand-in reference worker that runs the
model on the packed batch) the reader's verdict joins the leak verdict and moves the leak penalty; ``--score
--reader`` flags the same; the settings that cannot act are refused by name."""

from __future__ import annotations

import functools
import json
import types

import numpy as np
import pytest
import torch

from agent_system import methods
from agent_system.config import ConfigError, compose_config
from agent_system.launcher.plan import build_plan
from agent_system.methods.leak_reader import LeakReader, feedback_gains, reader_on
from agent_system.multi_turn_rollout.episode import Attempt, Episode, Refinement, Turn
from agent_system.prompts.templates import Prompt, PromptBuilder, Task
from agent_system.rewards import leak
from agent_system.rewards.leak_reader import DEFAULT_THRESHOLD_NATS, hf_gains, reader_rows
from agent_system.trainer.rows import StepScores

pytestmark = pytest.mark.external  # converts and runs the embedded model (about a minute on a busy CPU)

PROBLEM = "Tom buys 3 boxes of 8 pencils. How many pencils does he have?"
GOLD, ATTEMPT = "24", "I got 20"
STATED, NEUTRAL_SOUNDING = "The answer is 24.", "You made an arithmetic slip; redo the last step carefully."
# one problem, n = 1 attempt, m = 2 feedbacks: the first states the gold, the second names no value
FEEDBACKS = [STATED, NEUTRAL_SOUNDING]
HL_ROWS = {"problem": [0, 0], "attempt": [0, 0], "feedback": [0, 1], "turn": [2, 2]}


@functools.cache
def _smollm2():
    from agent_system.demos.warm_up import load
    from agent_system.models.smollm2 import ensure_smollm2

    path = ensure_smollm2()
    tokenizer, model = load(path)
    return path, tokenizer, model.eval()


class _ReferenceWorker:
    """Stands in for the LL's workers: ``compute_ref_log_prob`` runs the model on the packed batch as verl's worker
    does (left-padded prompts, right-padded responses, the attention mask and position ids of ``build_rows``)."""

    def __init__(self, model):
        self.model = model

    @torch.no_grad()
    def compute_ref_log_prob(self, batch):
        tensors = batch.batch
        width = tensors["responses"].shape[1]
        logits = self.model(
            input_ids=tensors["input_ids"],
            attention_mask=tensors["attention_mask"],
            position_ids=tensors["position_ids"],
        ).logits[:, -width - 1 : -1]
        return logits.float().log_softmax(-1).gather(2, tensors["responses"][..., None])[..., 0]  # (B, R)


def _turn(text):
    return Turn(Prompt(text, [1, 2, 3]), [5, 6, 7], [-0.5] * 3, text, False)


def _episodes():
    return [
        Episode(
            0,
            Task(PROBLEM, "math", GOLD),
            [Attempt(_turn(ATTEMPT), [Refinement(_turn(f), _turn(GOLD)) for f in FEEDBACKS])],
        )
    ]


def _problems(source="math"):
    return [
        {
            "data_source": source,
            "prompt": [{"role": "user", "content": PROBLEM}],
            "reward_model": {"ground_truth": GOLD},
            "extra_info": {"question": PROBLEM},
        }
    ]


def _trainer(tokenizer, model):
    config = compose_config()
    return types.SimpleNamespace(
        config=config,
        mlmt=config.mlmt,
        tokenizers={"ll": tokenizer},
        runner=types.SimpleNamespace(prompts=PromptBuilder()),
        groups={"ll": _ReferenceWorker(model)},
    )


def test_a_stated_gold_gains_more_than_a_feedback_naming_no_value():
    """The gains the docs report (docs/LEAK.md, "The reader test"), measured with the CLI's and the trainer's paths:
    both score the same rows, so their gains agree."""
    _, tokenizer, model = _smollm2()
    rows = [
        reader_rows(PromptBuilder(), Task(PROBLEM, "math", GOLD), ATTEMPT, f, GOLD, tokenizer, 4096) for f in FEEDBACKS
    ]
    stated, neutral_sounding = hf_gains(model, rows)
    assert stated >= DEFAULT_THRESHOLD_NATS > neutral_sounding, (stated, neutral_sounding)  # measured: 3.7, 0.0
    assert stated - neutral_sounding > 2.0
    packed = feedback_gains(_trainer(tokenizer, model), _problems(), _episodes())  # (1, 1, 2)
    np.testing.assert_allclose(packed[0, 0], [stated, neutral_sounding], atol=1e-3)


def test_the_reader_joins_the_leak_verdict_and_moves_the_penalty():
    """The rules miss a feedback (here: labelled as missed); the reader flags it from its gain, so the step's leak
    verdict and the HL's penalty change; a code row is not read (NaN)."""
    _, tokenizer, model = _smollm2()
    trainer = _trainer(tokenizer, model)
    missed = np.zeros((1, 1, 2))  # as if the rules had missed the stated gold
    check = leak.LeakVerdicts(leak=missed, rules=missed)
    scores = StepScores(r1=np.zeros((1, 1)), r3=np.ones((1, 1, 2)), leak=missed, leak_check=check)
    joined = LeakReader(DEFAULT_THRESHOLD_NATS, demanded=False).after_scores(trainer, _problems(), _episodes(), scores)
    assert joined.leak.tolist() == [[[1.0, 0.0]]] and joined.leak_check.reader.tolist() == [[[1.0, 0.0]]]
    assert leak.hl_leak_penalty({"leak": scores.leak}, HL_ROWS, 0.5, None).tolist() == [0.0, 0.0]
    assert leak.hl_leak_penalty({"leak": joined.leak}, HL_ROWS, 0.5, None).tolist() == [-0.5, 0.0]
    metrics = leak.check_metrics(joined.leak_check)
    assert metrics["leak_reader_rate"] == 0.5 and metrics["leak_reader_read"] == 2.0
    assert metrics["leak_reader_gain_mean"] == pytest.approx(joined.leak_check.reader_gain.mean())
    strict = LeakReader(100.0, demanded=False).after_scores(trainer, _problems(), _episodes(), scores)
    assert strict.leak.tolist() == [[[0.0, 0.0]]]  # the threshold is what flags it
    code = np.full((1, 1, 2), np.nan)
    code_scores = StepScores(
        r1=np.zeros((1, 1)), r3=np.ones((1, 1, 2)), leak=code, leak_check=leak.LeakVerdicts(code, code)
    )
    unread = LeakReader(DEFAULT_THRESHOLD_NATS, demanded=False).after_scores(
        trainer, _problems("mbpp"), _episodes(), code_scores
    )
    assert np.isnan(unread.leak).all() and leak.check_metrics(unread.leak_check) == {"leak_reader_read": 0.0}


def test_score_with_a_reader_flags_what_the_rules_miss(tmp_path, capsys, monkeypatch):
    path, _, _ = _smollm2()
    lines = [
        {"problem": PROBLEM, "ground_truth": GOLD, "attempt": ATTEMPT, "feedback": STATED, "leak": True},
        {"problem": PROBLEM, "ground_truth": GOLD, "attempt": ATTEMPT, "feedback": NEUTRAL_SOUNDING, "leak": False},
    ]
    file = tmp_path / "two.jsonl"
    file.write_text("".join(json.dumps(line) + "\n" for line in lines))

    def nothing_found(pool, items):  # the rules as if they caught nothing: the reader alone decides
        return np.zeros(len(items))

    monkeypatch.setattr(leak, "check_labelled", nothing_found)
    assert leak.main(["--score", str(file), "--reader", path], object()) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "leak score: 2/2 right, 0 false positives, 0 misses"
    assert out[-4].startswith(f"reader {path}: 1/2 feedbacks with a gain >= {DEFAULT_THRESHOLD_NATS:g} nats")
    assert leak.main(["--score", str(file), "--reader", str(tmp_path / "none")], object()) == 2
    assert "--reader" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["mlmt.reward.leak_reader=true"], "mlmt.reward.leak_reader=true: the solver (LL) has no reference model"),
        (["mlmt.reward.leak_reader=true", "mlmt.feedback=self"], "mlmt.reward.leak_reader=true with mlmt.feedback"),
        (["mlmt.reward.leak_reader=maybe"], "mlmt.reward.leak_reader='maybe': choose auto, true or false"),
        (["mlmt.reward.leak_reader_threshold=1.5"], "mlmt.reward.leak_reader_threshold=1.5 (default 2.0)"),
        (["mlmt.stages.beta_turn1=[0.1]", "mlmt.reward.leak_reader_threshold=0"], "must be > 0"),
    ],
)
def test_settings_that_cannot_act_are_refused_by_name(overrides, says):
    with pytest.raises(ConfigError) as error:
        methods.check_config(compose_config(overrides))
    assert says in str(error.value)


def test_auto_is_on_where_the_solver_has_a_reference_and_true_refuses_rows_without_math():
    import pandas as pd

    assert not reader_on(compose_config()) and methods.load(compose_config()) == []
    with_reference = compose_config(["mlmt.stages.beta_turn1=[0.1]"])
    assert reader_on(with_reference) and [e.name for e in methods.load(with_reference)] == ["leak_reader"]
    assert not reader_on(compose_config(["mlmt.stages.beta_turn1=[0.1]", "mlmt.reward.leak_reader=false"]))
    assert any("reader test" in check for check in build_plan(with_reference, 100, 8, ["math"] * 100).leak.checks)
    frame = pd.DataFrame({"data_source": ["mbpp", "mbpp"]})
    LeakReader(2.0, demanded=False).check_data(frame, "code.parquet")  # auto: nothing to read, nothing refused
    with pytest.raises(ConfigError, match=r"mlmt.reward.leak_reader=true with data.train_files=code.parquet"):
        LeakReader(2.0, demanded=True).check_data(frame, "code.parquet")
