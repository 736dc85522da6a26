"""``compute_score``: one entry point for every data source, with verl's custom-reward signature.

Plug into verl's own trainers with::

    custom_reward_function.path=<repo>/agent_system/rewards/scoring.py \
    custom_reward_function.name=compute_score
"""

from __future__ import annotations

import logging

from agent_system.rewards.math_answer import gsm8k_gold, last_boxed_content
from agent_system.rewards.math_reward import score_math

logger = logging.getLogger(__name__)

# canonical name -> (kind, fall back to the last number of the response)
_KINDS = {
    "math": ("math", False),
    "math500": ("math", False),
    "gsm8k": ("math", True),
    "arith": ("math", True),
    "mbpp": ("code", False),
    "yaml_task": ("yaml", False),
}
_ALIASES = {
    "math": "math", "hendrycks_math": "math", "lighteval/MATH": "math", "DigitalLearningGmbH/MATH-lighteval": "math",
    "EleutherAI/hendrycks_math": "math",
    "math500": "math500", "math_500": "math500", "HuggingFaceH4/MATH-500": "math500",
    "gsm8k": "gsm8k", "openai/gsm8k": "gsm8k",
    "arith": "arith",
    "yaml_task": "yaml_task",
    "mbpp": "mbpp", "mbpp_sanitized": "mbpp", "google-research-datasets/mbpp": "mbpp",
}  # fmt: skip
RESULT_KEYS = ("score", "acc", "pred", "error", "pass_rate", "first_failure")


def canonical_data_source(data_source: str) -> str:
    """Maps a data source name or alias to its canonical name.

    Raises:
        ValueError: For an unknown data source (the message lists the supported names).
    """
    name = _ALIASES.get(data_source) or _ALIASES.get(str(data_source).lower())
    if name is None:
        raise ValueError(f"unknown data_source {data_source!r}; supported: {sorted(_ALIASES)}")
    return name


def task_kind(data_source: str) -> str:
    """``math``, ``code`` or ``yaml``: which prompts (``agent_system.prompts``) and which grader a data source uses.

    Raises:
        ValueError: For an unknown data source (the message lists the supported names).
    """
    return _KINDS[canonical_data_source(data_source)][0]


def grading_context(row: dict, prompt_ids: list[int], tokenizer) -> str | None:
    """The text before a response that the row's grader reads (``prompt_str``): for a YAML task, the prompt the model
    read (:func:`agent_system.rewards.yaml_reward.grading_context`); None for graders that read the response alone."""
    if task_kind(row["data_source"]) != "yaml":
        return None
    from agent_system.rewards.yaml_reward import grading_context as prompt_as_read

    return prompt_as_read(row, prompt_ids, tokenizer)


def _math_gold(name: str, ground_truth) -> str:
    gold = str(ground_truth)
    if name == "gsm8k" and "####" in gold:
        return gsm8k_gold(gold) or gold
    if "\\boxed" in gold:  # a full reference solution was passed instead of its answer
        return last_boxed_content(gold) or gold
    return gold.replace(",", "") if name in ("gsm8k", "arith") else gold


def compute_score(data_source: str, solution_str: str, ground_truth, extra_info: dict | None = None, **kwargs) -> dict:
    """Scores one response (verl ``custom_reward_function`` signature).

    Args:
        data_source: ``math``, ``math500`` (``math_500``, ``HuggingFaceH4/MATH-500``), ``gsm8k``
            (``openai/gsm8k``), ``arith``, ``mbpp`` (``mbpp_sanitized``) or ``yaml_task`` (a YAML-defined task: its
            ``score_fn`` from ``extra_info``, run in the sandbox, :mod:`agent_system.rewards.yaml_reward`).
        solution_str: The model response.
        ground_truth: The gold answer (math) or the assert list / its JSON string (code).
        extra_info: Row metadata; code rows use ``test_setup_code`` and ``entry_point``.
        **kwargs: ``timeout_s`` (math-verify timeout, default 5), ``judge`` (a JudgeConfig; None, the default: no
            judge), ``sandbox_limits``,
            ``prompt_str`` (yaml_task: the context before the response that ``score_fn`` / ``done_fn`` read).

    Returns:
        A dict with ``score`` in [0, 1] plus ``acc``, ``pred``, ``error``, ``pass_rate`` and ``first_failure``
        (the same keys for every data source, as verl's reward_extra_info needs).
    """
    name = canonical_data_source(data_source)
    kind, allow_last_number = _KINDS[name]
    if kind == "yaml":
        from agent_system.rewards.yaml_reward import score_batch

        item = {"solution_str": solution_str, "ground_truth": ground_truth, "extra_info": extra_info or {}}
        result = score_batch([{**item, "prompt_str": kwargs.get("prompt_str")}], kwargs.get("sandbox_limits"))[0]
        return {**result, "pass_rate": result["score"], "first_failure": result["error"] or ""}
    if kind == "code":
        from agent_system.rewards.code_reward import score_code

        return score_code(solution_str, ground_truth, extra_info, kwargs.get("sandbox_limits"))
    judge = kwargs.get("judge")  # off unless passed: the environment never switches it on
    problem = (extra_info or {}).get("question", "") if isinstance(extra_info, dict) else ""
    result = score_math(
        solution_str,
        _math_gold(name, ground_truth),
        allow_last_number=allow_last_number,
        timeout_s=float(kwargs.get("timeout_s", 5.0)),
        judge=judge,
        problem=problem,
    )
    result["pass_rate"] = result["score"]
    result["first_failure"] = ""
    return result
