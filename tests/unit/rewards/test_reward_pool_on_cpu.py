"""RewardPool with real spawn workers: order, mixed sources, pathological answers, hung items."""

import time

import pytest

from agent_system.rewards import RewardPool

pytestmark = pytest.mark.external  # the reward pool's worker processes


def _item(source, response, gold, extra=None):
    return {"data_source": source, "solution_str": response, "ground_truth": gold, "extra_info": extra}


@pytest.fixture(scope="module")
def pool():
    with RewardPool(num_workers=2, timeout_s=6.0) as reward_pool:  # generous: the machine may be busy
        yield reward_pool


def test_scores_in_order_with_mixed_sources(pool):
    items = [
        _item("math", "\\boxed{\\frac{1}{2}}", "0.5"),
        _item("gsm8k", "so 3 + 4 = 7\n#### 7", "7"),
        _item("math500", "\\boxed{4}", "5"),
        _item("arith", "no answer", "3"),
        _item("mbpp", "def add(a, b):\n    return a + b\n", '["assert add(1, 2) == 3"]'),
        _item("unknown_source", "\\boxed{1}", "1"),
    ]
    results = pool.score(items)
    assert [r["acc"] for r in results] == [True, True, False, False, True, False]
    assert [r["score"] for r in results] == [1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    assert results[0]["pred"] == "\\frac{1}{2}" and results[3]["pred"] == ""
    assert results[5]["error"].startswith("ValueError") and results[0]["error"] is None
    assert all(set(r) == {"score", "acc", "pred", "error"} for r in results)
    assert pool.score([]) == []


def test_pathological_math_costs_at_most_the_timeout(pool):
    bad = [
        _item("math", "\\boxed{9^{9^{9}}}", "3"),
        _item("math", "\\boxed{" + "1" * 100_000 + "}", "1"),
        _item("math", "x" * 100_000 + "\\boxed{" + "\\frac{" * 300 + "1" + "}{2}" * 300 + "}", "1"),
        _item("math", "\\boxed{(x+1)^{100000}}", "x"),
    ]
    good = [_item("math", f"\\boxed{{{i}}}", str(i)) for i in range(6)]
    start = time.monotonic()
    results = pool.score(bad + good)
    elapsed = time.monotonic() - start
    assert [r["score"] for r in results] == [0.0] * 4 + [1.0] * 6
    # 4 bad items over 2 workers, each bounded by the timeout (+ worker restarts, slow on a busy machine); unbounded
    # they would take minutes
    assert elapsed < 2 * pool.timeout_s + 20


def test_hung_code_item_scores_zero_with_timeout():
    items = [_item("mbpp", "while True:\n    pass\n", ["assert True"]), _item("arith", "\\boxed{2}", "2")]
    with RewardPool(num_workers=1, timeout_s=1.0) as pool:
        pool.score([_item("arith", "1", "1")])  # worker start-up is not part of the measurement
        start = time.monotonic()
        results = pool.score(items)
        # bounded, not fast: 1 s timeout + a worker restart (failed at 15 s once under a load average of 9); unbounded:
        # the hung item would block forever
        assert time.monotonic() - start < 60
        assert results[0]["score"] == 0.0 and results[0]["error"] == "timeout"
        assert results[1]["acc"] is True


def test_invalid_arguments():
    with pytest.raises(ValueError):
        RewardPool(num_workers=0, timeout_s=1.0)
    with pytest.raises(ValueError):
        RewardPool(num_workers=1, timeout_s=1.0, start_method="fork")
