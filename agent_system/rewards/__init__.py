"""Rewards: rule-based math grading (math-verify), sandboxed code tests, an optional LLM judge.

Public API:
    compute_score(data_source, solution_str, ground_truth, extra_info=None) -> dict   (verl custom reward)
    RewardPool(num_workers, timeout_s).score(items) -> list[dict]                   (batch scoring)
    grading_context(row, prompt_ids, tokenizer) -> str | None                      (the text a grader reads first)
"""

from agent_system.rewards.pool import RewardPool
from agent_system.rewards.scoring import compute_score, grading_context

__all__ = ["RewardPool", "compute_score", "grading_context"]
