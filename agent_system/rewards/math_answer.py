"""Final-answer extraction from free-form math responses.

Pure string functions, no math-verify: they decide *which* part of a response is the answer, and
``agent_system.rewards.math_reward`` decides whether it is right.

Priority (the last occurrence of the first rule that matches wins):

1. the last ``\\boxed{...}`` / ``\\fbox{...}`` (balanced braces) or ``\\boxed 5``;
2. GSM8K's ``#### N`` line;
3. a closing "The (final) answer is ..." / "Answer: ..." statement;
4. only when ``allow_last_number`` is set (GSM8K and the arithmetic set): the last number in the text.
"""

from __future__ import annotations

import re

# An answer longer than this is not a final answer but a runaway generation; it scores 0 without parsing.
MAX_ANSWER_CHARS = 1000

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_HASH_RE = re.compile(r"####\s*([^\n]+)")
_ANSWER_IS_RE = re.compile(
    r"(?:the\s+(?:final\s+)?answer\s+is|final\s+answer\s*(?:is)?\s*[:=]?|answer\s*[:=])\s*(.+)",
    re.IGNORECASE,
)
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
# "The answer is $\frac{1}{2}$." -> keep the maths between the dollars
_DOLLAR_RE = re.compile(r"^\$+((?:\\.|[^$\\])+)\$")  # skips escaped \$ inside


def _matching_brace(text: str, open_index: int) -> int:
    """Returns the index of the ``}`` closing the ``{`` at ``open_index``, or -1 if unbalanced."""
    depth = 0
    for i in range(open_index, len(text)):
        char = text[i]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i
    return -1


def last_boxed_content(text: str) -> str | None:
    """Returns the content of the last ``\\boxed{...}`` or ``\\fbox{...}`` in ``text``.

    Args:
        text: A model response or reference solution.

    Returns:
        The content between the braces (nested braces kept), the token after ``\\boxed `` for the
        brace-less form, or None when there is no complete box.
    """
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    # a bounded number of retries keeps ``"\\boxed{" * 50_000`` linear instead of quadratic
    for _ in range(5):
        if start < 0:
            break
        cmd = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
        rest = start + len(cmd)
        if text.startswith("{", rest):
            end = _matching_brace(text, rest)
            if end > 0:
                return text[rest + 1 : end]
        elif text.startswith(" ", rest):
            match = re.match(r"\s+([^\s$]+)", text[rest : rest + MAX_ANSWER_CHARS])
            # "\boxed 6." ends a sentence: the period (or comma, colon) is not part of the answer
            token = match.group(1).rstrip(".,;:") if match else ""
            if token:
                return token
        # unbalanced / empty box: fall back to an earlier complete one
        start = max(text.rfind(c, 0, start) for c in _BOX_COMMANDS)
    return None


def _strip_sentence(answer: str) -> str:
    """Cleans a phrase like ``$\\frac{1}{2}$.`` or ``**12** apples.`` down to the maths."""
    answer = answer.strip().replace("**", "").strip()
    dollars = _DOLLAR_RE.match(answer)
    if dollars:
        return dollars.group(1).strip()
    if answer.startswith("\\(") and "\\)" in answer:
        return answer[2 : answer.index("\\)")].strip()
    return answer.rstrip(" .").strip()


def last_number(text: str) -> str | None:
    """Returns the last number in ``text`` (commas kept, e.g. ``1,000``), or None."""
    numbers = _NUMBER_RE.findall(text)
    return numbers[-1].rstrip(",") if numbers else None


def extract_answer(text: str, allow_last_number: bool = False) -> str | None:
    """Extracts the final answer from a response.

    Args:
        text: The model response.
        allow_last_number: Whether to fall back to the last number in the text (GSM8K-style data).

    Returns:
        The answer string (not normalised), or None when no rule applies.
    """
    boxed = last_boxed_content(text)
    if boxed is not None and boxed.strip():
        return boxed.strip()
    hashes = _HASH_RE.findall(text)
    if hashes:
        return _strip_sentence(hashes[-1])
    tail = text[-4 * MAX_ANSWER_CHARS :]
    stated = None
    for match in _ANSWER_IS_RE.finditer(tail):
        stated = match
    if stated is not None:
        return _strip_sentence(stated.group(1).split("\n")[0])
    if allow_last_number:
        return last_number(tail)
    return None


def gsm8k_gold(answer_field: str) -> str | None:
    """Returns the ``#### N`` final answer of a GSM8K ``answer`` field with thousands commas removed."""
    hashes = _HASH_RE.findall(answer_field)
    if not hashes:
        return None
    return hashes[-1].strip().replace(",", "")


def normalize_answer(answer: str) -> str:
    """Light normalisation applied before math-verify parses an answer.

    math-verify leaves ``10\\%`` as an unparsed string, so percent signs are removed (MATH grades
    ``10\\%`` and ``10`` as the same answer); thin spaces ``\\!`` (with the spaces around them: MATH writes
    ``11,\\! 111,\\! 100``, which must stay one number, not become the set ``11, 111, 100``) and ``{,}``
    thousands separators are collapsed too.

    Args:
        answer: An extracted answer or a gold answer.

    Returns:
        The normalised answer.
    """
    answer = answer.strip()
    answer = re.sub(r"\s*\\!\s*", "", answer).replace("{,}", ",")
    answer = re.sub(r"\\?%", "", answer)
    answer = re.sub(r"\\text\{\s*\}", "", answer)
    return answer.strip()
