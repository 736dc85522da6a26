"""Every MBPP reference solution still scores 1 through the reward, over the whole file (974 tasks).

Each task's ``code`` goes through ``compute_score("mbpp", ...)`` as a model's fenced answer, with its
``test_setup_code`` in ``extra_info``, in the real sandbox: the asserts are split (the program's side evaluated in the
sandbox, the comparison here), so this checks that the split keeps every assert form MBPP holds working. Integration
tier: about 20 s on two idle cores, minutes on a loaded machine (limits are roomy so that load never decides a score).
Also the sanitized set (427 tasks, with its ``math.isclose`` / ``set(...)`` / truth-value forms).
"""

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agent_system.rewards import compute_score
from agent_system.rewards.code_sandbox import SandboxLimits

pytestmark = pytest.mark.integration
# The data lives beside the repository (../shared/data); MLMT_SHARED_DATA overrides.
DATA = Path(os.environ.get("MLMT_SHARED_DATA", Path(__file__).resolve().parents[2].parent / "shared" / "data")) / "mbpp"
ROOMY = SandboxLimits(timeout_s=120.0, per_test_s=60.0)


def _sweep(path: Path, setup_key: str) -> tuple[int, list[tuple[int, str]]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def score(row):
        setup = row.get(setup_key) or ""
        setup = "\n".join(setup) if isinstance(setup, list) else setup
        answer = "```python\n" + row["code"].replace("\r\n", "\n") + "\n```"
        extra = {"test_setup_code": setup}
        return compute_score("mbpp", answer, json.dumps(row["test_list"]), extra, sandbox_limits=ROOMY)

    with ThreadPoolExecutor(2) as pool:  # each score is its own sandbox process
        results = list(pool.map(score, rows))
    return len(rows), [
        (row["task_id"], r["first_failure"]) for row, r in zip(rows, results, strict=True) if r["score"] != 1.0
    ]


@pytest.mark.skipif(not DATA.exists(), reason=f"needs the MBPP data set in {DATA}")
def test_every_mbpp_reference_solution_scores_one():
    count, failures = _sweep(DATA / "mbpp.jsonl", "test_setup_code")
    assert count == 974
    assert failures == []


@pytest.mark.skipif(not DATA.exists(), reason=f"needs the MBPP data set in {DATA}")
def test_every_sanitized_mbpp_reference_solution_scores_one():
    count, failures = _sweep(DATA / "sanitized-mbpp.jsonl", "test_imports")
    assert count == 427
    assert failures == []
