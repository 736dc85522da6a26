"""What the trusted process reads of a model's program is bounded (issue 45, point 2): no process is started here.

The fence parser runs in one pass (the regex it replaces took quadratic time on a response of backticks), the parse
that finds the program's names refuses what is too long or too deep with its own exception (never the parser's
``RecursionError`` or ``MemoryError``), and messages from the sandbox are made printable.
"""

import random
import re
import time

import pytest

from agent_system.rewards.assert_split import MAX_PROGRAM_CHARS, UnparsableProgram, defined_names
from agent_system.rewards.code_reward import extract_code, fenced_blocks
from agent_system.rewards.code_sandbox import printable

OLD_FENCE_RE = re.compile(r"```([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)  # the regex fenced_blocks replaced


def test_fenced_blocks_read_as_the_old_regex_did():
    rng = random.Random(0)
    alphabet = ["`", "```", "\n", "py", "python", " ", "x", "-", "def f", "!"]
    for _ in range(5_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(30)))
        assert fenced_blocks(text) == OLD_FENCE_RE.findall(text), repr(text)


@pytest.mark.parametrize("response", ["```" * 40_000, "```a" * 30_000, "x```" * 30_000 + "\n"])
def test_fence_parsing_is_linear(response):
    start = time.perf_counter()
    extract_code(response, "add")
    assert time.perf_counter() - start < 2.0  # the old regex: about 20 s for 120,000 backticks on this machine


@pytest.mark.parametrize(
    "source",
    [
        "x = " + "-" * 3_000 + "1",  # RecursionError in the parser
        "x = " + "-" * 6_000 + "1",  # MemoryError in the parser
        "x = f" + "()" * 20_000,
        "x = 1" + "+1" * 20_000,
        "x = " + "not " * 10_000 + "1",
        "x = '" + "a" * MAX_PROGRAM_CHARS + "'",  # too long
    ],
)
def test_a_program_too_deep_or_too_long_to_parse_is_refused_with_a_reason(source):
    with pytest.raises(UnparsableProgram, match="nested too deeply|longer than"):
        defined_names("def add(a, b):\n    return a + b\n" + source)


def test_a_syntax_error_is_left_to_the_sandbox():
    assert defined_names("def add(a, b) return", "root = 1") == {"root"}
    assert defined_names("x = 1\0") == set()


def test_messages_from_the_sandbox_are_printable():
    assert printable("ValueError: \ud800\x00\x1b[2J é\tx\ny") == "ValueError: ???[2J é\tx\ny"
    printable("\udcff" * 10).encode("utf-8")
