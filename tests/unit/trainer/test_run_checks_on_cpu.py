"""Start-up checks of an MLMT run (issue 8, defect 5): reference models when a KL needs them, reference solutions
when the confidence term scores them."""

import re

import pandas as pd
import pytest
from omegaconf import OmegaConf

from agent_system.config import compose_config, reference_needed
from agent_system.methods.confidence import check_reference_solutions


def test_use_kl_loss_asks_for_a_reference_model():
    # actor.use_kl_loss=true crashed with KeyError ref_log_prob: no reference model was created for it
    config = compose_config([])
    assert reference_needed(config) == {"ll": False, "hl": False}
    OmegaConf.update(config, "actor_rollout_ref.actor.use_kl_loss", True)
    assert reference_needed(config) == {"ll": True, "hl": False}
    OmegaConf.update(config, "hl.actor.use_kl_loss", True)
    assert reference_needed(config) == {"ll": True, "hl": True}


def test_a_beta_asks_for_that_levels_reference_model():
    config = compose_config(["mlmt.stages.beta_turn2=[0.01]"])
    assert reference_needed(config) == {"ll": False, "hl": True}
    config = compose_config(["mlmt.stages.beta_turn1=[0.1]", "mlmt.stages.stage_ids=[1]"])
    assert reference_needed(config) == {"ll": True, "hl": False}


def _frame(references):
    return pd.DataFrame({"extra_info": [{"index": i, "reference_solution": r} for i, r in enumerate(references)]})


def test_rows_with_reference_solutions_pass():
    check_reference_solutions(_frame(["1 + 2 = 3", "x = 4"]), "train.parquet")


@pytest.mark.parametrize("bad", ["", "   ", None])
def test_an_empty_reference_solution_is_an_error_naming_the_row(bad):
    # the confidence term used to score token id 0 for such a row
    with pytest.raises(ValueError, match=r"train.parquet: row 1 .*reference_solution"):
        check_reference_solutions(_frame(["1 + 2 = 3", bad, "x"]), "train.parquet")


def test_rows_without_extra_info_are_an_error():
    with pytest.raises(ValueError, match="row 0"):
        check_reference_solutions(pd.DataFrame({"prompt": ["a"]}), "t.parquet")


# ---------------------------------------------------------------- the prompt budget (issue 9, item 5)


def _math_rows(problems):
    return pd.DataFrame(
        [
            {
                "data_source": "math",  # the math family's templates, which the tests measure
                "prompt": [{"role": "user", "content": p}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": "1"},
                "extra_info": {"index": i},
            }
            for i, p in enumerate(problems)
        ]
    )


@pytest.fixture(scope="module")
def tiny_tokenizers(tmp_path_factory):
    from agent_system.models.tiny import build_tiny_tokenizer

    return {
        "ll": build_tiny_tokenizer(tmp_path_factory.mktemp("ll_tok")),
        "hl": build_tiny_tokenizer(tmp_path_factory.mktemp("hl_tok"), vocab_size=300, seed=1),
    }


def test_prompt_budget_holds_the_longest_problem_or_start_up_fails_naming_the_keys(tiny_tokenizers):
    from agent_system.config import ConfigError
    from agent_system.launcher.main import check_prompt_budget
    from agent_system.prompts.templates import PromptBuilder

    prompts = PromptBuilder({}, min_quote_tokens=32)
    train = _math_rows(["What is 1 + 1?", "What is 2 + 2?"])
    val = _math_rows(["What is 3 + 3?", "Add the numbers " + "1 + " * 200 + "1."])  # row 1: a long problem
    frames = {"data.train_files": train, "data.val_files": val}
    config = compose_config(["data.max_prompt_length=4096"])
    check_prompt_budget(config, prompts, tiny_tokenizers, frames)
    config = compose_config(["data.max_prompt_length=600"])
    check_prompt_budget(config, prompts, tiny_tokenizers, {"data.train_files": train, "data.val_files": None})
    with pytest.raises(ConfigError) as error:
        check_prompt_budget(config, prompts, tiny_tokenizers, frames)
    message = str(error.value)
    for part in ("data.max_prompt_length=600", "row 1 of data.val_files", "mlmt.prompts.min_quote_tokens=32"):
        assert part in message, message
    needed = int(re.search(r"to at least (\d+)", message).group(1))
    check_prompt_budget(compose_config([f"data.max_prompt_length={needed}"]), prompts, tiny_tokenizers, frames)


def test_prompt_budget_checks_only_the_turns_the_run_renders(tiny_tokenizers):
    """A single-turn run (``mlmt.feedback=none``) was held to the size of the refinement prompt it never builds."""
    from agent_system.config import ConfigError
    from agent_system.launcher.main import check_prompt_budget
    from agent_system.prompts.templates import PromptBuilder

    prompts = PromptBuilder({}, min_quote_tokens=32)
    problem = "Add the numbers " + "1 + " * 100 + "1."
    frames = {"data.train_files": _math_rows([problem]), "data.val_files": None}
    solve = prompts.required_tokens("solve", tiny_tokenizers["ll"], problem)
    self_correct = prompts.required_tokens("refine_no_feedback", tiny_tokenizers["ll"], problem)
    refine = prompts.required_tokens("refine", tiny_tokenizers["ll"], problem)
    assert solve < self_correct < refine
    no_hl = {"ll": tiny_tokenizers["ll"]}
    check_prompt_budget(
        compose_config([f"data.max_prompt_length={solve}", "mlmt.feedback=none"]), prompts, no_hl, frames
    )
    with pytest.raises(ConfigError, match="refine_no_feedback prompt"):
        check_prompt_budget(
            compose_config([f"data.max_prompt_length={solve}", "mlmt.feedback=self"]), prompts, no_hl, frames
        )
    check_prompt_budget(
        compose_config([f"data.max_prompt_length={self_correct}", "mlmt.feedback=self"]), prompts, no_hl, frames
    )
    with pytest.raises(ConfigError, match="the (feedback|refine) prompt"):  # the HL reads with its tokenizer
        check_prompt_budget(
            compose_config([f"data.max_prompt_length={self_correct}"]), prompts, tiny_tokenizers, frames
        )
