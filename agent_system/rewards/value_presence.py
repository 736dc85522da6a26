"""Value presence (docs/LEAK.md): does a feedback express the gold's value where nothing accounts for it?

A value the feedback expresses (:mod:`agent_system.rewards.values_in_text`) that equals the gold by exact rational
equality gives the gold away, unless it is accounted for:

- it is in the problem: a number the problem writes, or an expression the problem writes ("24 ÷ 2");
- the feedback rejects it: a negation before it ("not 90", "neither 240 nor …", "rather than 5"), a verdict after it
  ("48 is wrong", "is too large"), or it reports the solver ("your 3/5", "you wrote 8") without calling it right;
  a negation in a question is no rejection ("wouldn't 12 make more sense?");
- it stands in a condition: a sentence that opens with "if" / "suppose" / "assume" / "were" (not "if you …"), the
  clause of such a word, or a sentence with one that says "would" or asks ("Would it be 2/5 if there were 10?");
- it is a reference: step 4, line 3, equation (9), question 2, problem 12, ``\\tag{3}``, a list's "3.", or a count of
  the feedback's own points ("Two things to fix").

Besides exact values, a decimal or percent of at least :data:`APPROXIMATE_DIGITS` significant digits that the gold
rounds to, and a square root whose value is the gold's, give it away; a number gold that is one of the problem's
options is also found by that option's letter.

Golds that are not one rational value: a tuple or interval gold is found as its members in order, each within
:data:`PAIR_WINDOW` characters of the one before, none accounted for; an option letter by "(C)" / "option C", its
position ("the third option") or as the only option left when the feedback rules out all the others; another text
gold ("Monday", "Carol") by its text when the problem does not write it, and by its initial when no other
capitalised word of the problem has it; a gold with LaTeX that has no rational value
(``5\\sqrt{2}``, ``9\\pi``) by its text, spaces and ``\\left`` / ``\\dfrac`` aside. "Yes" / "No" golds are not read
(a bare "no" is too common); the rules of :mod:`agent_system.rewards.leak` still read "the answer is no".
"""

from __future__ import annotations

import bisect
import functools
import math
import re
from fractions import Fraction

from agent_system.rewards.value_descriptions import (
    named_values,
    option_values,
    ratio_values,
    relative_values,
    swapped,
    unique_options,
    unique_values,
)
from agent_system.rewards.values_in_text import Value, exact_value, literal_values, plain, values

PAIR_WINDOW = 60  # the members of a tuple gold are read within this many characters of each other
CONTEXT_CHARS = 80  # read before a value to account for it
MAX_TUPLE_STARTS = 64  # first members of a tuple gold followed up
MAX_GOLD_CHARS = 200  # a longer gold is not evaluated as a number
APPROXIMATE_DIGITS = 3  # a rounded decimal needs this many significant digits to give the gold away ("0.333")

_REFERENCE_RE = re.compile(
    r"\b(?:step|steps|line|lines|equation|equations|eq|eqn|part|case|row|item|stage|paragraph|problem|question|turn|"
    r"exercise|page|chapter|section|figure|fig|table|lemma|theorem|rule|no)\W{0,3}$|#\s*$|\\tag\s*$",
    re.IGNORECASE,
)
_REJECTED_BEFORE_RE = re.compile(
    r"(?:n't|\b(?:not|never|no|rather\s+than|instead\s+of|other\s+than|except|neither|nor))(?:\s+[\w$\\.,-]+){0,3}"
    r"\s*\(?$",
    re.IGNORECASE,
)
_REPORTED_RE = re.compile(
    r"\b(?:your|you(?:'ve|\s+have)?\s+(?:wrote|write|got|get|said|say|found|gave|answered|computed|calculated|"
    r"concluded|reported|claimed|put|had|used|stopped\s+at))(?:\s+[\w$\\.,-]+){0,3}\s*\(?$",
    re.IGNORECASE,
)
_REJECTED_AFTER_RE = re.compile(
    r"^[^.;:!?\n]{0,40}?(?:n't|\b(?:not|wrong|incorrect|mistaken|off|out)\b|\btoo\s+(?:large|big|small|high|low|much|"
    r"many|few|little)|\ban?\s+(?:error|mistake)|\bthe\s+wrong|\b(?:is|are)\s+ruled\s+out)",
    re.IGNORECASE,
)
_CORRECTION_RE = re.compile(  # "24, not 11", "LIV diagonals, not LXVI": the value is set against another
    r"^(?:\s*[a-zA-Z$%]+){0,3}\s*[,(—–-]?\s*(?:not|rather\s+than|instead\s+of)\s+(?:[-$\\(]?\d|(?-i:[MDCLXVI]{2,})\b)",
    re.IGNORECASE,
)
_PRESCRIBED_RE = re.compile(  # "your count should be 32": the feedback's value, not the solver's reported
    r"\b(?:should|must|ought|needs?\s+to|has\s+to|have\s+to|supposed\s+to)\b", re.IGNORECASE
)
_SINGLED_OUT_RE = re.compile(  # "anything other than 42 is wrong": every value but this one is rejected
    r"\b(?:anything|everything|any\s+(?:\w+\s+){0,2}?\w+|every\s+\w+|all\s+\w+)\s+(?:other\s+than|except|but|besides)"
    r"\s*\(?$",
    re.IGNORECASE,
)
_AFFIRMED_RE = re.compile(r"\b(?:right|correct|good|true|fine|works|checks\s+out)\b", re.IGNORECASE)
_CONDITION_RE = re.compile(
    r"\b(?:if(?!\s+(?:you|we)\b)|suppose|supposing|assume|assuming|were|whether|unless|imagine)\b", re.I
)
_COUNTERFACTUAL_RE = re.compile(r"\bwould\b|\?\s*$")
_CLAUSE_END_RE = re.compile(r"[.;:!?\n]|,\s+(?=(?:so|then|and|but|which|it|the|that|this|you|we)\b)|\s[—–-]{1,2}\s")
_SENTENCE_END_RE = re.compile(r"[.!?\n](?=\s|$)")
_QUESTION_NEGATION_RE = re.compile(r"n't\b", re.IGNORECASE)
_ENUMERATOR_RE = re.compile(r"^[.)]\s")
_ORDINALS = {"first": 0, "second": 1, "third": 2, "fourth": 3, "fifth": 4}
_OPTION_RE = re.compile(r"\(([A-E])\)")
_OPTION_GOLD_RE = re.compile(r"^\(?([A-E])\)?$")
_TEXT_GOLD_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]{0,60})\}")
_TUPLE_GOLD_RE = re.compile(r"^\s*[(\[]([^()\[\]]{1,120})[)\]]\s*$")
_RULED_OUT_RE = re.compile(r"\b(?:out|wrong|incorrect|fails?|eliminated?|ruled?\s+out|cannot|can't|not)\b", re.I)
_LETTER_RE = re.compile(r"\(([A-E])\)|(?<![\w(])([A-E])(?=\s*(?:,|and\b|or\b|are\b|is\b|\)|$))")
_CANONICAL_DROPS = re.compile(r"\s+|\\left|\\right|\\!|\\,|\$|\\displaystyle")
_WORD_GOLD_RE = re.compile(r"[A-Za-z][A-Za-z '-]{1,40}")  # a gold in plain words ("Carol", "No")
_INITIAL_RE = re.compile(
    r"\b(?:starts?|begins?|starting|beginning)\s+with\s+(?:the\s+letter\s+|an?\s+)?['\"]?(?P<letter>[A-Z])\b"
    r"|\binitial\s+(?:is\s+)?['\"]?(?P<letter2>[A-Z])\b"
)
_NAME_RE = re.compile(r"(?<![.!?:]\s)(?<![.!?:])(?<!^)\b[A-Z][a-z]+\b")  # capitalised, not opening a sentence
_DECIMAL_RE = re.compile(r"(?<![\w.])(?P<digits>\d{1,30}\.\d{1,30})(?!\d)\s*(?P<percent>%)?")
_ROOT_RE = re.compile(
    r"(?<![\w.])(?:(?P<coefficient>\d{1,10})\s*\*?\s*)?(?:sqrt\(\s*(?P<radicand>\d{1,15}(?:\.\d{1,15})?)\s*\)"
    r"|square\s+root\s+of\s+(?P<words>\d{1,15}(?:\.\d{1,15})?)(?!\d))",
    re.I,
)
_FEEDBACK_ITEMS_RE = re.compile(  # "Two things to fix": a count of the feedback's own points, not a value
    r"^\s+(?:more\s+)?(?:things?|points?|issues?|mistakes?|errors?|fixes?|changes?|hints?|remarks?|suggestions?|"
    r"tips?|corrections?)\b",
    re.I,
)


def gold_leaked(feedback: str, problem: str, gold: str, attempt: str = "") -> list[str]:
    """The passages of a feedback that give the gold away by value presence (empty: none).

    Args:
        feedback: The feedback, as :func:`agent_system.rewards.leak.normalized` gives it.
        problem: The problem, normalized the same way (its values account for the feedback's).
        gold: The row's ground truth as the dataset writes it.
        attempt: The final answer of the attempt the feedback replies to ("" without one): an operation the
            feedback names on it gives a value (:mod:`agent_system.rewards.value_descriptions`).
    """
    text, problem_text = plain(feedback), plain(problem)
    gold = gold.strip().strip("$").strip()
    option = _OPTION_GOLD_RE.match(_text_of(gold) or gold)
    if option:
        return _option_leaks(text, problem, option.group(1))
    if (_TEXT_GOLD_RE.fullmatch(gold) or _WORD_GOLD_RE.fullmatch(gold)) and not re.search(r"\d", gold):
        return _text_leaks(text, problem, _text_of(gold))
    attempt = attempt.strip().strip("$").strip()
    tuple_gold = _tuple_values(gold)
    if tuple_gold:
        reversed_attempt = swapped(text, _tuple_values(attempt))
        swap = [reversed_attempt[1]] if reversed_attempt and reversed_attempt[0] == tuple_gold else []
        return _tuple_leaks(text, problem_text, tuple_gold) + swap
    golds = _gold_values(gold)
    attempt_values = _gold_values(attempt) if attempt else set()
    relative = relative_values(text, min(attempt_values)) if len(attempt_values) == 1 else []
    described = unique_values(text) + ratio_values(text) + named_values(text)
    found = [v for v in values(text) + described if v.value in golds]
    numbers = [float(g) for g in golds] if golds else [n for n in [gold_number(gold)] if n is not None]
    roots = []  # no rational value: accounted for only by their text or context
    for number in numbers:
        found += _approximations(text, number)
        roots += _root_spans(text, number)
    leaks = [text[v.start : v.end] for v in found if not _accounted(text, v, problem_text)]
    relative = [v for v in relative if v.value in golds]
    leaks += [text[v.start : v.end] for v in relative if not _accounted(text, v, problem_text, relative=True)]
    leaks += _unvalued_leaks(text, problem_text, roots)
    letter = _option_of(problem, golds)
    if letter:
        leaks += _option_leaks(text, problem, letter)
    return leaks if golds else leaks + _symbol_leaks(text, problem_text, gold)


@functools.lru_cache(maxsize=4096)
def gold_number(gold: str) -> float | None:
    """The gold's real value as a float (``5\\sqrt{2}``, ``9\\pi``, ``\\frac{1+\\sqrt{5}}{2}``), read by
    math-verify's LaTeX reader (the gold is the dataset's, not the policy's), None when it is no real number."""
    from latex2sympy2_extended import latex2sympy  # noqa: PLC0415 - loads sympy: only for golds that need it

    if len(gold) > MAX_GOLD_CHARS:
        return None
    try:
        number = complex(latex2sympy(gold).evalf())
    except Exception:  # noqa: BLE001 - any gold the reader cannot evaluate (a word, a set) has no number
        return None
    if number.imag or not math.isfinite(number.real):
        return None
    return number.real


def _approximations(text: str, number: float) -> list[Value]:
    """Decimals and percents of at least :data:`APPROXIMATE_DIGITS` significant digits that the gold rounds to
    ("about 16.67%" for 1/6, "near 28.27" for 9π; the gold written exactly is found here too)."""
    found = []
    for match in _DECIMAL_RE.finditer(text):
        digits, scale = match["digits"], 100 if match["percent"] else 1
        decimals = len(digits.split(".")[1]) + (2 if match["percent"] else 0)
        significant = len(digits.replace(".", "").lstrip("0"))
        if significant >= APPROXIMATE_DIGITS and abs(float(digits) / scale - number) <= 0.5 * 10**-decimals * (
            1 + 1e-9
        ):
            found.append(Value(Fraction(digits), *match.span()))
    return found


def _root_spans(text: str, number: float) -> list[tuple[int, int]]:
    """Square roots whose value is the gold's ("the square root of 50" or ``\\sqrt{50}`` for ``5\\sqrt{2}``), a
    coefficient before them counted ("5 sqrt(2)")."""
    spans = []
    for match in _ROOT_RE.finditer(text):
        radicand = float(match["radicand"] or match["words"])
        if math.isclose(float(match["coefficient"] or 1) * math.sqrt(radicand), number, rel_tol=1e-9):
            spans.append(match.span())
    return spans


def _option_of(problem: str, golds: set[Fraction]) -> str | None:
    """The letter of the problem's option whose value is the gold ("(B) 2" for the gold 2), None if none is."""
    if not golds:
        return None
    return next((letter for letter, value in option_values(problem) if value in golds), None)


def _text_of(gold: str) -> str:
    """The text inside ``\\text{…}`` (and kin), else the gold itself."""
    match = _TEXT_GOLD_RE.search(gold)
    return match.group(1).strip() if match else gold


def _gold_values(gold: str) -> set[Fraction]:
    """The gold's rational values (a percent gold ``25\\%`` is 1/4 and 25), empty when it has none."""
    text = plain(gold.replace("\\%", "%"))
    percent = text.rstrip().endswith("%")
    value = exact_value(text.rstrip().rstrip("%")) if percent else exact_value(text)
    if value is None:
        return set()
    return {value, value / 100} if percent else {value}


def _tuple_values(gold: str) -> list[Fraction] | None:
    """The members of a tuple or interval gold ``(-2, 4)``, None unless every member is rational."""
    match = _TUPLE_GOLD_RE.match(gold)
    if not match or "," not in match.group(1):
        return None
    members = [exact_value(plain(part)) for part in match.group(1).split(",")]
    return members if all(m is not None for m in members) and len(members) <= 8 else None


def _accounted(text: str, value: Value, problem_text: str, relative: bool = False) -> bool:
    """Whether a value of the feedback is accounted for (in the problem, rejected, in a condition, a reference);
    ``relative``: an operation on the solver's answer, which names that answer by construction, so "your value"
    before it reports nothing."""
    if value.value in literal_values(problem_text) or _in_problem(text[value.start : value.end], problem_text):
        return True
    before = text[max(0, value.start - CONTEXT_CHARS) : value.start]
    clause_start = max((m.end() for m in _CLAUSE_END_RE.finditer(before)), default=0)
    clause = before[clause_start:]
    line = before.rsplit("\n", 1)[-1]
    if _REFERENCE_RE.search(before) or (not line.strip() and _ENUMERATOR_RE.match(text[value.end : value.end + 2])):
        return True
    if _FEEDBACK_ITEMS_RE.match(text[value.end : value.end + 40]):
        return True
    if _SINGLED_OUT_RE.search(clause):
        return False
    sentence = _sentence(text, value.start)
    question = sentence.rstrip().endswith("?")
    if _REJECTED_BEFORE_RE.search(clause) and not (question and _QUESTION_NEGATION_RE.search(sentence)):
        return True
    after = text[value.end : value.end + CONTEXT_CHARS]
    reported = not relative and _REPORTED_RE.search(clause)
    if (
        reported
        and not _PRESCRIBED_RE.search(clause[reported.start() :])
        and not _AFFIRMED_RE.search(after.split(".")[0])
    ):
        return True
    if _REJECTED_AFTER_RE.match(after) and not question and not _CORRECTION_RE.match(after):
        return True
    if _CONDITION_RE.search(sentence) and _COUNTERFACTUAL_RE.search(sentence):  # "Would it be 2/5 if there were 10?"
        return True
    return bool(_CONDITION_RE.search(clause) or _CONDITION_RE.match(sentence.lstrip(" *-(")))


def _sentence(text: str, position: int) -> str:
    """The sentence of the text that holds ``position`` (read within :data:`CONTEXT_CHARS` either side)."""
    window_start = max(0, position - CONTEXT_CHARS)
    before = text[window_start:position]
    start = max((m.end() for m in _SENTENCE_END_RE.finditer(before)), default=0)
    after = text[position : position + CONTEXT_CHARS]
    end = next((m.end() for m in _SENTENCE_END_RE.finditer(after)), len(after))
    return before[start:] + after[:end]


def _in_problem(passage: str, problem_text: str) -> bool:
    """Whether the problem writes the passage (an expression like ``24 / 2``), spaces aside."""
    passage = _CANONICAL_DROPS.sub("", passage)
    return len(passage) > 1 and passage in _CANONICAL_DROPS.sub("", problem_text)


def _tuple_leaks(text: str, problem_text: str, members: list[Fraction]) -> list[str]:
    """The passages that write a tuple gold's members in order, each close to the one before, none accounted."""
    free = [v for v in values(text) if v.value in members and not _accounted(text, v, problem_text)]
    starts = {m: [v for v in free if v.value == m] for m in members}  # in text order
    leaks = []
    for first in starts[members[0]][:MAX_TUPLE_STARTS]:
        end = first.end
        for member in members[1:]:
            following = starts[member]
            index = bisect.bisect_left([v.start for v in following], end)
            if index == len(following) or following[index].start > end + PAIR_WINDOW:
                break
            end = following[index].end
        else:
            leaks.append(text[first.start : end])
    return leaks


def _options(problem: str) -> list[str]:
    """The option letters a problem lists ("(A) 21 (B) 27 …"), in order."""
    return list(dict.fromkeys(_OPTION_RE.findall(problem)))


def _option_leaks(text: str, problem: str, letter: str) -> list[str]:
    """An option-letter gold named by its letter, its position, as the only option not ruled out, or as the only
    option with the properties the feedback names ("the only perfect square listed")."""
    options = _options(problem) or list("ABCDE")
    leaks = [passage for named, passage in unique_options(text, problem) if named == letter]
    for match in re.finditer(rf"\({letter}\)|\b(?:option|choice|answer)\s+\(?{letter}\b", text):
        clause = text[max(0, match.start() - CONTEXT_CHARS) : match.end() + CONTEXT_CHARS]
        if not _RULED_OUT_RE.search(
            _clause_around(clause, CONTEXT_CHARS if match.start() >= CONTEXT_CHARS else match.start())
        ):
            leaks.append(match.group())
    if letter in options:
        position = options.index(letter)
        for match in re.finditer(r"\b(first|second|third|fourth|fifth)\s+(?:option|choice|one|answer)\b", text, re.I):
            if _ORDINALS[match.group(1).lower()] == position:
                leaks.append(match.group())
    ruled_out = set()
    for clause in _CLAUSE_SPLIT_RE.split(text):
        if _RULED_OUT_RE.search(clause):
            ruled_out.update(a or b for a, b in _LETTER_RE.findall(clause))
    if len(options) > 1 and letter not in ruled_out and ruled_out >= set(options) - {letter}:
        leaks.append(f"all options but ({letter}) ruled out")
    return leaks


_CLAUSE_SPLIT_RE = re.compile(r"[.;!?\n]|\s[—–-]{1,2}\s")


def _clause_around(window: str, position: int) -> str:
    """The clause of ``window`` that holds ``position``."""
    start = max((m.end() for m in _CLAUSE_SPLIT_RE.finditer(window[:position])), default=0)
    end = next((m.start() + position for m in _CLAUSE_SPLIT_RE.finditer(window[position:])), len(window))
    return window[start:end]


def _text_leaks(text: str, problem: str, gold_text: str) -> list[str]:
    """A text gold ("Monday", "Carol") named where the problem does not name it, or by its initial where it is the
    only one of the problem's capitalised words with that initial ("the name starts with C"); Yes / No golds are not
    read."""
    if not gold_text or gold_text.lower() in ("yes", "no"):
        return []
    leaks = []
    for match in _INITIAL_RE.finditer(text):
        letter = (match["letter"] or match["letter2"]).upper()
        named = {word for word in _NAME_RE.findall(problem) if word[0] == letter}
        if gold_text[0].upper() == letter and named <= {gold_text}:
            leaks.append(match.group())
    if gold_text.lower() in problem.lower():
        return leaks
    for match in re.finditer(rf"(?<!\w){re.escape(gold_text)}(?!\w)", text, re.IGNORECASE):
        if not _REJECTED_BEFORE_RE.search(text[max(0, match.start() - CONTEXT_CHARS) : match.start()]):
            leaks.append(match.group())
    return leaks


def _symbol_leaks(text: str, problem_text: str, gold: str) -> list[str]:
    """A gold with no rational value (``5\\sqrt{2}``, ``9\\pi``) found by its text, spaces aside, not accounted."""
    canonical = _CANONICAL_DROPS.sub("", plain(gold.replace("π", "\\pi")))
    if len(canonical) < 2 or len(canonical) > 80:
        return []
    pattern = re.compile(r"(?<![\w.\\])" + r"\s*".join(map(re.escape, canonical)) + r"(?!\w|\.\d)")
    text = text.replace("π", "\\pi")
    return _unvalued_leaks(text, problem_text, [match.span() for match in pattern.finditer(text)])


def _unvalued_leaks(text: str, problem_text: str, spans: list[tuple[int, int]]) -> list[str]:
    """The passages at ``spans`` that express the gold without a rational value (its text, a root): accounted for
    only by their text (the problem writes them) or their context, never by a value of the problem."""
    leaks = []
    for start, end in spans:
        if not _in_problem(text[start:end], problem_text) and not _accounted(text, Value(Fraction(0), start, end), ""):
            leaks.append(text[start:end])
    return leaks
