"""No program can crash or stall the grader (issue 45, point 2): a deterministic list of hostile programs.

Each one is fed to ``compute_score`` (the code reward) and to the feedback turn's execution-result path
(``EpisodeRunner.execution_result``). Each must return, not raise, within a bounded time well under the run's wall-clock
limit, with a score of 0 and a reason; the few odd but correct programs at the end must still score 1.

The stage limit is short (0.5 s) and the wall-clock limit the default 12 s: a stall that only the wall-clock limit ends
(what a sleeping ``__str__`` did before this change) shows as a run of 12 s or more, and as the error ``"timeout"``.
Measured with 1 s stages on 2 cores (``compute_score``, two tests): at most 0.07 s for the parse and encoding cases,
1 to 2.3 s for those that sleep or compute (a stage each), 2 s when the program swallows the alarm, 4 s for a C loop
(the parent's per-stage deadline); before: 12 s for each of 9 stalls, and 8 programs raised RecursionError or
MemoryError out of ``compute_score`` and out of the execution result. The bound, two thirds of the wall-clock limit,
leaves room for a heavily loaded machine.
"""

import asyncio
import json
import time

import pytest

from agent_system.multi_turn_rollout.episode import EpisodeRunner
from agent_system.prompts.templates import Task
from agent_system.rewards import code_reward, compute_score
from agent_system.rewards.code_sandbox import SandboxLimits

pytestmark = pytest.mark.external  # the real sandbox: a subprocess per program

LIMITS = SandboxLimits(timeout_s=12.0, per_test_s=0.5)
BOUND_S = LIMITS.timeout_s * 2 / 3
TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]
QUESTION = f"Write a function add(a, b).\n\nYour code should pass this test, among others:\n{TESTS[0]}"
GOOD = "def add(a, b):\n    return a + b\n"
SLEEPER = "import time\nclass S:\n    def __{name}__(self, *args):\n        time.sleep(100)\n"
SWALLOWER = "class S:\n    def __{name}__(self, *args):\n        while True:\n            try:\n                __import__('time').sleep(100)\n            except BaseException:\n                pass\n"  # noqa: E501
STR_SLEEPS = "import time\nclass E(Exception):\n    def __str__(self):\n        time.sleep(100)\n        return 'e'\n"


def _raising(exception: str) -> str:
    return f"def add(a, b):\n    raise {exception}\n"


HOSTILE = {
    # parsing in the trusted process (the split needs the program's top-level names)
    "3,000 unary minus signs": GOOD + "x = " + "-" * 3_000 + "1\n",
    "6,000 unary minus signs": GOOD + "x = " + "-" * 6_000 + "1\n",
    "10,000 nots": GOOD + "x = " + "not " * 10_000 + "1\n",
    "attribute chain": GOOD + "x = add" + ".a" * 20_000 + "\n",
    "call chain": GOOD + "x = add" + "()" * 20_000 + "\n",
    "subscript chain": GOOD + "x = add" + "[0]" * 20_000 + "\n",
    "+ chain": GOOD + "x = 1" + "+1" * 20_000 + "\n",
    "nested brackets": GOOD + "x = " + "[" * 5_000 + "]" * 5_000 + "\n",
    "nested lambdas": GOOD + "x = " + "lambda: " * 5_000 + "1\n",
    "nested f-strings": GOOD + "x = " + "f'{" * 300 + "1" + "}'" * 300 + "\n",
    # size
    "huge string literal": GOOD + "x = '" + "a" * 2_000_000 + "'\n",
    "huge int literal": GOOD + "x = " + "9" * 50_000 + "\n",
    "huge int computed in C": "def add(a, b):\n    return a + b + 0 * 7 ** 7 ** 11\n",
    "a C loop the alarm cannot stop": GOOD + "sum(range(10 ** 13))\n",
    "a C loop in a thread": GOOD + "import threading\nthreading.Thread(target=sum, args=(range(10 ** 13),)).start()\n",
    "huge value returned": "def add(a, b):\n    return [a + b] * 10 ** 7\n",
    "huge exception message": _raising("ValueError('x' * 10 ** 8)"),
    # encodings
    "NUL byte": GOOD + "\0\n",
    "lone surrogate in the source": GOOD + "x = '\ud800'\n",
    "lone surrogate and NUL in the message": _raising("ValueError('\\ud800\\x00\\x1b[2J')"),
    "a byte-order mark inside": GOOD + "x = 1\ufeff\n",
    # exception formatting (runs the program's __str__)
    "__str__ sleeps (program)": STR_SLEEPS + "raise E()\n" + GOOD,
    "__str__ sleeps (test)": STR_SLEEPS + _raising("E()"),
    "__str__ swallows the alarm": SWALLOWER.format(name="str")
    + "class E(Exception):\n    __str__ = S.__str__\n"
    + _raising("E()"),
    "__str__ raises SystemExit": "class E(Exception):\n    def __str__(self):\n        raise SystemExit\nraise E()\n",
    "__str__ raises KeyboardInterrupt": "class E(Exception):\n    def __str__(self):\n        raise KeyboardInterrupt\n"
    + _raising("E()"),
    "__str__ recurses": "class E(Exception):\n    def __str__(self):\n        return str(self)\n" + _raising("E()"),
    "__str__ raises one whose __str__ sleeps": STR_SLEEPS
    + "class F(Exception):\n    def __str__(self):\n        raise E()\n"
    + _raising("F()"),
    "__notes__ sleep": SLEEPER.format(name="getitem")
    + "class N(list):\n    __iter__ = S.__getitem__\n"
    + "def add(a, b):\n    e = ValueError()\n    e.__notes__ = N([1])\n    raise e\n",
    # other dunders
    "__repr__ sleeps": SLEEPER.format(name="repr") + "def add(a, b):\n    return S()\n",
    "__eq__ sleeps": SLEEPER.format(name="eq") + "def add(a, b):\n    return S()\n",
    "__hash__ sleeps in a set": SLEEPER.format(name="hash") + "def add(a, b):\n    return {S()}\n",
    "__del__ sleeps (exception argument)": SLEEPER.format(name="del") + _raising("ValueError(S())"),
    "__del__ swallows the alarm": SWALLOWER.format(name="del") + _raising("ValueError(S())"),
    # the program ignores the alarm
    "the alarm swallowed": "import time\nwhile True:\n    try:\n        time.sleep(100)\n    except BaseException:\n"
    "        pass\n",
    "a signal handler that sleeps, run while the harness reports": (
        "import os, signal, threading, time\n"
        "def poke():\n    while True:\n        os.kill(os.getpid(), signal.SIGUSR1)\n        time.sleep(0.01)\n"
        "def add(a, b):\n    signal.signal(signal.SIGUSR1, lambda *args: time.sleep(100))\n"
        "    threading.Thread(target=poke, daemon=True).start()\n    return a + b\n"
    ),
}

CORRECT = {  # odd but correct: still 1
    "a coding cookie naming another encoding": "# -*- coding: latin-1 -*-\n" + GOOD,
    "non-ASCII names and text": "def add(a, b):\n    ünïcode = '\u00e9\u4e2d\U0001f600'\n    return a + b\n",
    "a 50 KB string literal": GOOD + "x = '" + "a" * 50_000 + "'\n",
    "NUL and a surrogate escaped in literals": GOOD + "x = '\\x00\\ud800'\n",
}


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    from transformers import AutoTokenizer

    from agent_system.models.tiny import build_tiny_tokenizer

    path = tmp_path_factory.mktemp("tokenizer")
    build_tiny_tokenizer(path, vocab_size=512, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return EpisodeRunner(None, None, tokenizer, tokenizer, None, LIMITS)


def _task() -> Task:
    row = {
        "data_source": "mbpp",
        "prompt": [{"role": "user", "content": QUESTION}],
        "ability": "code",
        "reward_model": {"style": "rule", "ground_truth": json.dumps(TESTS)},
        "extra_info": {"index": 0, "entry_point": "add", "test_setup_code": "", "question": QUESTION},
    }
    return Task.from_row(row)


def _timed(call):
    start = time.monotonic()
    value = call()
    return value, time.monotonic() - start


def _attempt(text: str):
    return type("Attempt", (), {"text": text})()


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_program_scores_zero_with_a_reason_in_bounded_time(name, runner):
    response = f"```python\n{HOSTILE[name]}```"
    result, seconds = _timed(lambda: compute_score("mbpp", response, json.dumps(TESTS), {}, sandbox_limits=LIMITS))
    assert result["score"] == 0.0 and not result["acc"], result
    assert result["error"] or result["first_failure"], result
    assert result["error"] != "timeout", result  # ended by its stage's clocks, not by the run's wall-clock limit
    assert seconds < BOUND_S, (name, seconds)
    (result["first_failure"] or "").encode("utf-8")  # printable into a prompt, a log, a trajectory file
    execution, seconds = _timed(lambda: asyncio.run(runner.execution_result(_task(), _attempt(response))))
    assert isinstance(execution, str) and "tests shown in the task passed" in execution, execution
    assert not execution.startswith("All"), execution
    assert seconds < BOUND_S, (name, seconds)
    execution.encode("utf-8")


@pytest.mark.parametrize("name", list(CORRECT))
def test_an_odd_but_correct_program_still_scores_one(name, runner):
    response = f"```python\n{CORRECT[name]}```"
    result = compute_score("mbpp", response, json.dumps(TESTS), {}, sandbox_limits=SandboxLimits(60.0, 30.0))
    assert result["score"] == 1.0, result


def test_the_execution_result_path_never_raises(runner, monkeypatch):
    def broken(*args):
        raise RecursionError("a defect of the grader that a program found")

    monkeypatch.setattr(code_reward, "execution_result", broken)
    execution = asyncio.run(runner.execution_result(_task(), _attempt(f"```python\n{GOOD}```")))
    assert execution == "The grader failed to run this program (RecursionError); there is no execution result."
