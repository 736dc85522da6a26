"""The feedback-leak metric (``agent_system.rewards.leak``) on hand-written feedbacks, graded by the real RewardPool
(math-verify in spawned workers): leaks, near misses, intermediate numbers, LaTeX forms, hostile sizes; the labelled
development and held-out sets of leak_sets/ (docs/LEAK.md); the rates per turn transition; and
``mlmt.reward.leak_penalty``, which changes only the leaking rows' HL reward."""

import dataclasses
import functools
import json
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from config_copies import copier

from agent_system import methods
from agent_system.config import ConfigError, compose_config
from agent_system.launcher.main import check_config
from agent_system.multi_turn_rollout.episode import Attempt, Episode, Refinement, Turn
from agent_system.prompts.templates import Prompt, Task
from agent_system.rewards import RewardPool, leak
from agent_system.trainer import advantages as adv
from agent_system.trainer.metrics import episode_metrics, trajectory_records
from agent_system.trainer.mlmt_trainer import MLMTTrainer
from agent_system.trainer.rows import LevelInputs, RowKeys, StepScores


def _row(gold, source="math"):
    return {"data_source": source, "reward_model": {"ground_truth": gold}, "extra_info": {}}


@pytest.fixture(scope="module")
def pool():
    with RewardPool(num_workers=2, timeout_s=6.0) as reward_pool:  # generous: the machine may be busy
        yield reward_pool


LEAKS = [  # (feedback, gold): each states the answer
    ("Your sum is off by one. The answer is 42.", "42"),
    ("The correct answer should be $\\frac{1}{2}$.", "0.5"),
    ("Recompute the last step: \\boxed{\\dfrac{3}{4}}. Then check the units.", "\\frac34"),
    ("Final answer: \\(2\\sqrt{3}\\)", "2\\sqrt3"),
    ("You dropped a sign, so the expression is $x = -7$.", "-7"),
    ("The correct answer is 5, not 7.", "5"),
    ("After fixing the carry, add 5 to get 17.", "17"),
    ("The answer is (1, 2).", "(1,2)"),
    ("Answer: 10\\%", "10"),
    ("Careful with thousands: the answer is 1,000.", "1000"),
    ("so the total is #### ignored\n\n**Answer:** 7", "7"),  # gsm8k-style row below
    ("Rewrite your ratio: the answer is 50%.", "\\frac{1}{2}"),  # "your" in the clause before is not a quote
    ("The bags combine, so you should have 36 crayons.", "36"),
    ("Is the answer 5?", "5"),  # value presence (issue 44): a question that proposes the gold gives it away
    ("The answer is 5?", "5"),
    ("First 3 \\cdot 4 = 12. Then you must add 5 before dividing by the total.", "12"),  # the gold in the working
    ("The product is 12, then subtract 3.", "12"),
    ("Check 3 + 4 = 7 again in the second line.", "7"),
    ("A right angle is 90 on its own; the right side is 90 mm long in the sketch.", "90"),
]
NEAR_MISSES = [  # (feedback, gold): none states the answer
    ("The answer is not 5.", "5"),
    ("The answer isn't 5; look at the second case.", "5"),
    ("Your answer is 5, which is wrong.", "5"),
    ("You said the answer is 5, but check the second case.", "5"),
    ("If the answer is 5, then x would be odd; is it?", "5"),
    ("Your final answer of 5 is incorrect.", "5"),
    ("Re-check step 5.", "5"),
    ("Look again at equation (5).", "5"),
    ("The answer is 6.", "5"),  # a different number is not the answer
    ("The answer is \\boxed{\\frac{1}{3}}", "\\frac{1}{2}"),
    ("Nothing to add.", "5"),
]
INTERMEDIATE = [  # (feedback, gold): the gold appears only as a value in the working
    ("You found 12 apples in the first basket correctly; the second basket is where it goes wrong.", "12"),
    ("So the final answer should be $\\frac{1}{2}$.", "2"),  # the 2 of a fraction is not a number of its own
]


@pytest.mark.external
def test_leaks_are_found(pool):
    rows = [_row(gold, "gsm8k" if "####" in text else "math") for text, gold in LEAKS]
    result = leak.check_feedbacks(pool, [(text, row) for (text, _), row in zip(LEAKS, rows, strict=True)])
    missed = [text for (text, _), value in zip(LEAKS, result, strict=True) if value != 1.0]
    assert not missed


@pytest.mark.external
@pytest.mark.parametrize("cases", [NEAR_MISSES, INTERMEDIATE], ids=["near_misses", "intermediate_values"])
def test_near_misses_and_intermediate_values_do_not_count(pool, cases):
    result = leak.check_feedbacks(pool, [(text, _row(gold)) for text, gold in cases])
    flagged = [text for (text, _), value in zip(cases, result, strict=True) if value != 0.0]
    assert not flagged


LEAK_SETS = Path(__file__).parent / "leak_sets"
LEAK_KINDS = ("rejection", "named_quantity", "leading_clause", "equivalent_form")
NEAR_MISS_KINDS = ("solver_value", "negated", "hypothetical", "intermediate", "digits")


def _labelled(name):
    return json.loads((LEAK_SETS / f"{name}.json").read_text())["items"]


def _verdicts(pool, items):
    """The detector's verdict per labelled item, as ``python -m agent_system.rewards.leak --score`` gives it."""
    return leak.check_labelled(pool, [{**i, "ground_truth": i["gold"]} for i in items])


@pytest.mark.external
@pytest.mark.parametrize("kind", LEAK_KINDS + NEAR_MISS_KINDS)
def test_every_development_item_of_each_kind_is_judged_right(pool, kind):
    """Each leak kind is caught and each kind of near miss is not flagged (before rules 5-8: 6 of the first 34)."""
    items = [i for i in _labelled("development") if i["kind"] == kind]
    verdicts = _verdicts(pool, items)
    wrong = [i["feedback"] for i, verdict in zip(items, verdicts, strict=True) if verdict != i["label"]]
    assert len(items) >= 4 and set(wrong) <= VALUE_PRESENCE_FLAGS


# development near misses that value presence (issue 44) flags: the gold's value stands in the feedback, as a value
# of the working, of another quantity or the solver's value called right, with nothing accounting for it (docs/LEAK.md)
VALUE_PRESENCE_FLAGS = {
    "2 · 5 = 10, then add 3 and subtract 3 before you finish.",
    "The result of the first product is 10, then add 3 and subtract 3.",
    "A quadrilateral's angles total 360, and a right angle is 90 by itself; split the total into four parts.",
    "Your ４２ is right, but then you added one more.",
    "It is not two and it is not four; list 1, 3 and 9 and count them.",
    "Each coin shows heads with probability 1/2; a card's suit is spades with probability 1/4, a different event, so "
    "multiply the coins.",
}


# caught leaks and flagged near misses per kind on the held-out sets, each written before the rules it measures.
# heldout (HEAD's detector: 4 of 33 caught; measured once after rules 5-8: 31 of 33, "a right angle is 90" flagged);
# its two misses and its false positive were then fixed from paraphrases added to the development set, so these are
# no longer held-out numbers; heldout_2's (17 of 20 caught, 1 of 20 flagged) likewise, fixed by the third round of
# rules (ac7053d) from new development paraphrases. heldout_3 was written before reading the rules (34be304),
# measured before that round (15 of 25 caught, 0 of 25 flagged) and once after it (24 of 25, 0 of 25); not tuned on.
HELD_OUT = {
    "heldout": (  # value presence flags 6 near misses whose gold stands in the working (docs/LEAK.md)
        {"rejection": 8, "named_quantity": 8, "leading_clause": 8, "equivalent_form": 9},
        {"solver_value": 0, "negated": 0, "hypothetical": 0, "intermediate": 5, "digits": 1},
    ),
    "heldout_2": (
        {"rejection": 5, "named_quantity": 5, "leading_clause": 5, "equivalent_form": 5},
        {"solver_value": 0, "negated": 0, "hypothetical": 0, "intermediate": 1, "digits": 0},
    ),
    "heldout_3": (
        {"rejection": 6, "named_quantity": 6, "leading_clause": 6, "equivalent_form": 6},
        {"solver_value": 0, "negated": 0, "hypothetical": 0, "intermediate": 0, "digits": 0},
    ),
}


@pytest.mark.external
@pytest.mark.parametrize("name", sorted(HELD_OUT))
def test_agreement_on_the_held_out_sets(pool, name):
    """At least the measured leaks of each kind caught and at most the measured near misses flagged (heldout_3 misses
    "1 ÷ 8 is one eighth, i.e. $\\dfrac{125}{1000}$": a restatement under no name, docs/LEAK.md)."""
    items = _labelled(name)
    assert {i["kind"] for i in items} == set(LEAK_KINDS + NEAR_MISS_KINDS)
    flagged = {kind: 0 for kind in LEAK_KINDS + NEAR_MISS_KINDS}
    for item, verdict in zip(items, _verdicts(pool, items), strict=True):
        flagged[item["kind"]] += int(verdict == 1.0)
    caught, false_positives = HELD_OUT[name]
    for kind, least in caught.items():
        assert flagged[kind] >= least, kind
    for kind, most in false_positives.items():
        assert flagged[kind] <= most, kind


@pytest.mark.external
def test_agreement_on_heldout_4():
    """heldout_4 (issue 44) was written before value presence and scored once after it: 26 of 30 leaks caught
    (before: 3), 1 of 30 near misses flagged (before: 0); the misses are listed in docs/LEAK.md."""
    items = _labelled("heldout_4")
    with RewardPool(num_workers=2, timeout_s=6.0) as reward_pool:
        verdicts = _verdicts(reward_pool, items)
    caught = sum(v == 1.0 for i, v in zip(items, verdicts, strict=True) if i["label"] == 1)
    flagged = sum(v == 1.0 for i, v in zip(items, verdicts, strict=True) if i["label"] == 0)
    assert caught >= 26 and flagged <= 1


@pytest.mark.parametrize(
    ("candidate", "gold", "forms"),
    [
        ("1 000", "1000", ["1000"]),
        ("1\\,000\\,000", "10^6", ["1000000"]),
        ("1\u2009000", "1000", ["1000"]),
        ("50%", "\\frac{1}{2}", ["50%", "(50)/100"]),
        ("37.5\\%", "3/8", ["37.5\\%", "(37.5)/100"]),
        ("0.25", "25\\%", ["0.25", "(0.25)\\cdot 100"]),
        ("(1, 2)", "(1,2)", ["(1, 2)"]),  # a tuple's members are not digit groups
        ("12 345", "12345", ["12345"]),
        ("1 2", "12", ["12"]),  # single digits split by a space or a LaTeX space are one number
        ("4\\,2", "42", ["42"]),
        ("6e4", "60000", ["6\\times 10^{4}"]),
    ],
)
def test_answer_forms(candidate, gold, forms):
    assert leak.answer_forms(candidate, gold) == forms


@pytest.mark.parametrize(
    ("text", "read"),
    [
        ("three eighths, forty-two, one hundred and five", "3/8, 42, 105"),
        ("four and a half; 4½; ½", "(4+1/2); (4+1/2); 1/2"),
        ("take one step, then one more", "take one step, then one more"),  # "one" alone is a pronoun
        (
            "４２ and ٤٢, 4\u200b2, 5√2, √(18), 90°, 6·7, −7",
            "42 and 42, 42, 5\\sqrt{2}, \\sqrt{18}, 90^\\circ, 6\\cdot 7, -7",
        ),
        ("twenty-five per cent, `12`, \\underline{7}, \\color{red}{7}", "25%, 12, {7}, {7}"),
    ],
)
def test_evasive_spellings_are_read_as_the_grader_reads_them(text, read):
    assert leak.normalized(text) == read


def test_asked_names_come_from_the_question():
    names, counted, variables = leak.asked_names("Two are drawn. What is the probability that both are blue?")
    assert names == {"probability", "chance"} and not counted and not variables
    names, counted, _ = leak.asked_names("How many positive divisors does 36 have?")
    assert counted == {"divisors"} and names == {"number", "count", "total"}
    assert leak.asked_names("Solve for $y$: $2y + 3 = 17$.")[2] == {"y"}
    assert leak.asked_names("Compute the mean of 4, 8 and 15.")[0] == {"mean", "average"}
    assert {"gcd", "gcf"} <= leak.asked_names("What is the greatest common divisor of 18 and 45?")[0]
    assert "decimal" in leak.asked_names("Write $\\frac{5}{2}$ as a decimal.")[0]
    # the asked name turns a claim into a candidate; without the problem the same sentence gives none
    assert leak.candidate_answers("Their mean is 9; you divided by the wrong count.", "Compute the mean of 4 and 14.")
    assert not leak.candidate_answers("Their mean is 9; you divided by the wrong count.")


@pytest.mark.external
def test_code_and_yaml_feedbacks_are_not_applicable(pool):
    pairs = [("The answer is 3. def f(): return 3", _row('["assert f() == 3"]', "mbpp")), ("x", _row("3"))]
    assert np.isnan(leak.check_feedbacks(pool, pairs)[0]) and leak.check_feedbacks(pool, pairs)[1] == 0.0
    assert not leak.applies_to("mbpp") and not leak.applies_to("yaml_task") and leak.applies_to("gsm8k")


@pytest.mark.external
@pytest.mark.parametrize(
    ("text", "leaks"),
    [
        ("\\boxed{" * 200_000, False),
        ("{" * 2_000_000 + "}", False),
        ("the answer is " * 100_000, False),
        ("1 = " * 300_000 + "5", True),  # an "= 5" ends the feedback
        ("x" * 5_000_000 + " The answer is 5.", True),  # read: the last SCAN_CHARS characters
        ("The answer is 5. " + "x" * 5_000_000, True),  # and the first
        ("y" * 20_000 + " The answer is 5. " + "x" * 20_000, False),  # the middle of a huge feedback is not read
        ("The answer is " + "9" * 50_000 + ".", False),
        ("\\boxed{" + "1+" * 10_000 + "1}", False),
    ],
    ids=["open_boxes", "deep_braces", "statements", "long_chain", "tail", "head", "middle", "huge_number", "big_box"],
)
def test_hostile_sizes_are_bounded(pool, text, leaks):
    candidates = leak.candidate_answers(text)
    assert len(candidates) <= leak.MAX_CANDIDATES
    assert all(len(c) <= leak.MAX_CANDIDATE_CHARS for c in candidates)
    assert leak.check_feedbacks(pool, [(text, _row("5"))])[0] == float(leaks)


def test_rates_per_transition():
    leaks = np.array([1.0, 0.0, 1.0, 1.0, np.nan, 0.0])
    first = np.array([False, False, True, False, False, True])
    final = np.array([True, True, True, False, True, False])
    rates = leak.leak_rates(leaks, first, final)
    assert rates == {
        "leak_checked": 5.0,
        "leak_rate": 0.6,
        "leak_rate_i2c": 0.5,  # two checked i→c feedbacks (the NaN one is not counted), one leaks
        "leak_rate_c2c": 1.0,
        "leak_rate_i2i": 1.0,
        "leak_rate_c2i": 0.0,
    }
    assert leak.leak_rates(np.array([np.nan]), first[:1], final[:1]) == {"leak_checked": 0.0}


# one problem, n = 2 attempts, m = 2 feedbacks; the feedback (0, 1) leaks
HL_ROWS = {"problem": [0, 0, 0, 0], "attempt": [0, 0, 1, 1], "feedback": [0, 1, 0, 1], "turn": [2, 2, 2, 2]}
FEEDBACKS = [["Check the sign.", "The answer is 4."], ["Recount the cases.", "Recheck step 4."]]
R1, R3 = np.array([[0.0, 1.0]]), np.array([[[0.0, 1.0], [1.0, 0.0]]])


def _turn(text, ids=(5, 6, 7)):
    return Turn(Prompt(text, [1, 2, 3]), list(ids), [-0.5] * len(ids), text, False)


def _episodes():
    attempts = [
        Attempt(_turn("attempt"), [Refinement(_turn(f), _turn("refined")) for f in feedbacks])
        for feedbacks in FEEDBACKS
    ]
    return [Episode(0, Task("What is 2 + 2?", "math", "4"), attempts)]


def _problems():
    return [{**_row("4"), "prompt": [{"role": "user", "content": "What is 2 + 2?"}]}]


@functools.cache
def _default_copy():
    """A function returning a fresh copy of the composed default config (composed once: Hydra takes seconds)."""
    return copier(compose_config())


def _config(leak_penalty):
    """A copy of the composed default config with ``mlmt.reward.leak_penalty`` set."""
    config = _default_copy()()
    config.mlmt.reward.leak_penalty = leak_penalty
    return config


@pytest.mark.external
@pytest.mark.parametrize("estimator", ["grpo", "reinforce"])
def test_leak_penalty_changes_only_the_leaking_rows_hl_reward(pool, estimator):
    scores = {"r1": R1, "r3": R3, "leak": leak.leak_scores(_problems(), _episodes(), pool).leak}
    assert scores["leak"].tolist() == [[[0.0, 1.0], [0.0, 0.0]]]
    mask = torch.ones(4, 3, dtype=torch.long)
    stage = adv.Stage(stage_id=2, beta_turn1=0.0, beta_turn2=0.0, beta_turn3=0.0, alpha=0.0)
    rewards = {}
    for penalty in (0.0, 0.3):
        mlmt = _config(penalty).mlmt
        mlmt.hl.adv_estimator = estimator
        extra = leak.hl_leak_penalty(scores, HL_ROWS, mlmt.reward.leak_penalty, None)
        result = adv.level_advantages(
            level="hl",
            rows=RowKeys(**HL_ROWS),
            scores=StepScores(r1=R1, r3=R3, leak=scores["leak"]),
            stage=stage,
            mlmt=mlmt,
            algorithm=_default_copy()().algorithm,
            inputs=LevelInputs(kl=np.zeros(4), response_mask=mask, extra_reward=extra),
        )
        rewards[penalty] = np.asarray(result.task_rewards)
    np.testing.assert_allclose(rewards[0.0], [0.0, 1.0, 1.0, 0.0])
    np.testing.assert_allclose(rewards[0.3] - rewards[0.0], [0.0, -0.3, 0.0, 0.0])


class _Group:
    """Stands in for a level's workers: zero log-probs, no reference, no update (the reward is what is tested)."""

    use_ref, turn_kl_loss = False, False

    def compute_log_prob(self, batch):
        shape = batch.batch["response_mask"].shape
        return torch.zeros(shape), torch.zeros(shape)


@pytest.mark.external
def test_leak_penalty_in_the_logged_hl_reward_and_the_leak_metrics(pool):
    """The trainer's own scoring and HL batch: ``hl/reward_mean`` drops by penalty × leak rate; the step's metrics
    and trajectory records carry the leak."""
    problems, episodes = _problems(), _episodes()
    means = {}
    for penalty in (0.0, 0.5):
        config = _config(penalty)
        trainer = object.__new__(MLMTTrainer)
        trainer.config, trainer.mlmt, trainer.reward_pool, trainer.leak_judge = config, config.mlmt, pool, None
        tokenizer = types.SimpleNamespace(pad_token_id=0, eos_token_id=0)
        trainer.tokenizers = {"ll": tokenizer, "hl": tokenizer}
        trainer.groups, trainer.critics, trainer.extensions = {"hl": _Group()}, {}, methods.load(config)
        scores = dataclasses.replace(trainer.score(problems, episodes), r1=R1, r3=R3)  # the solver's turns as if so
        batch = trainer.build_level_batch("hl", problems, episodes, scores, adv.stage_at(config.mlmt.stages, 1)[1])
        means[penalty] = batch.metrics["hl/reward_mean"]
    assert means[0.0] == pytest.approx(0.5) and means[0.5] == pytest.approx(0.5 - 0.5 * 1 / 4)
    metrics = episode_metrics(episodes, scores, prefix="train")
    assert metrics["train/leak_rate"] == 0.25 and metrics["train/leak_rate_i2c"] == 1.0  # the one i→c flip leaked
    assert [metrics[f"train/leak_rate_{t}"] for t in ("i2i", "c2c", "c2i")] == [0.0, 0.0, 0.0]
    assert [r["leak"] for r in trajectory_records(problems, episodes, scores)] == [False, True, False, False]


def test_leak_penalty_is_validated_by_name():
    with pytest.raises(ConfigError, match="mlmt.reward.leak_penalty=-1"):
        check_config(compose_config(["mlmt.reward.leak_penalty=-1"]))
    for extra in (["mlmt.feedback=self"], ["mlmt.hl.freeze=true"]):
        with pytest.raises(ConfigError, match="leak_penalty"):
            check_config(compose_config(["mlmt.reward.leak_penalty=0.5", *extra]))
    check_config(compose_config(["mlmt.reward.leak_penalty=0.5"]))
