"""Values a feedback gives by describing them rather than writing them (docs/LEAK.md, "Value presence"); the leak
check compares them with the gold in :mod:`agent_system.rewards.value_presence`, which accounts for them as for any
value.

Read on the plain text :mod:`agent_system.rewards.value_presence` reads (numbers in words already digits):

- **relative to the attempt**: an operation the feedback names on the solver's own answer, applied to it: "halve
  what you got", "you counted each game twice" (half), "double it", "invert it" / "the reciprocal", "the opposite
  sign", "move the decimal point one place to the left", "off by 3" (both ways), "3 too many", "off by a factor of
  10" (both ways), "square it"; and, for a tuple, "swap them" / "reverse the order" (:func:`swapped`; "in the wrong
  order" alone is a diagnosis, not read). Only where the feedback replies to an attempt whose answer has a value;
- **a unique description**: "the only even prime", "the only perfect number in the twenties", "the only prime
  between 20 and 28", "the only perfect square listed": the one integer of the range (or the one option of the
  problem) that has every property named, where exactly one has them (:func:`unique_values`,
  :func:`unique_options`);
- **a ratio or odds**: "4 : 7" (not a time, "3:45"), "a ratio of 4 to 7" (4/7), "odds of 2 to 3" (2/3, and the
  probability 2/5 that odds in favour give; 3/5 against);
- **a named quantity**: "a baker's dozen" (13), "a gross" (144), "a right angle" (90), "a straight angle" (180), "a
  full turn" (360) (:func:`named_values`).

Bounded like :mod:`agent_system.rewards.values_in_text`: at most :data:`MAX_DESCRIPTIONS` descriptions read per text,
ranges of at most :data:`MAX_RANGE` integers none above :data:`MAX_NUMBER`, numbers of at most 30 digits. Nothing here
raises on any text.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from agent_system.rewards.values_in_text import Value, exact_value, plain

MAX_DESCRIPTIONS = 16  # matches of each pattern read per text
MAX_RANGE = 1_000  # integers a unique description is checked over (its default range: "the only even prime")
MAX_NUMBER = 10_000  # the largest integer a range may hold (a primality test costs its square root)
_PERFECT_NUMBERS = (6, 28, 496)  # below MAX_RANGE
_NUMBER = r"(?:\d{1,30}(?:\.\d{1,30})?|one)"


def _count(text: str) -> Fraction:
    return Fraction(1) if text.lower() == "one" else Fraction(text)


# --------------------------------------------------------------------------------------------------- the attempt
_OBJECT = r"(?:it|that|this|them|what\s+you\s+(?:got|have|found|wrote)|your\s+(?:\w+\s+){0,2}?\w+)"
_ATTEMPT_OPERATIONS = [  # (pattern, the values the operation gives from the attempt's answer a and the pattern's n)
    (
        rf"\bhalve\b|\bhalf\s+(?:of\s+)?{_OBJECT}|\bdivide\s+{_OBJECT}\s+by\s+2\b|\bcounted\s+(?:\w+\s+){{0,6}}?twice\b"
        r"|\bdouble[- ]count",
        lambda a, n: [a / 2],
    ),
    (
        rf"\bdouble\s+{_OBJECT}|\btwice\s+{_OBJECT}|\bmultiply\s+{_OBJECT}\s+by\s+2\b|\bhalf\s+(?:of\s+)?what\s+it\s+"
        r"should",
        lambda a, n: [a * 2],
    ),
    (
        r"\binvert\b|\breciprocal\b|\bupside[- ]down\b|\bflip(?:ped)?\s+(?:\w+\s+){0,2}?(?:fraction|ratio)\b",
        lambda a, n: [1 / a] if a else [],
    ),
    (
        r"\bopposite\s+sign\b|\bflip\s+(?:the|its|your)\s+sign\b|\bwrong\s+sign\b|\bnegate\b|\bsign\s+(?:is\s+)?"
        r"(?:wrong|flipped|off)\b|\bdropped\s+(?:a|the)\s+(?:minus|negative)\s+sign\b",
        lambda a, n: [-a],
    ),
    (
        rf"\bdecimal\s+point\b[^.;!?]{{0,40}}?\b(?P<n>{_NUMBER})\s+places?\s+(?:to\s+the\s+)?left\b",
        lambda a, n: [a / 10**n] if n.denominator == 1 and n <= 30 else [],
    ),
    (
        rf"\bdecimal\s+point\b[^.;!?]{{0,40}}?\b(?P<n>{_NUMBER})\s+places?\s+(?:to\s+the\s+)?right\b",
        lambda a, n: [a * 10**n] if n.denominator == 1 and n <= 30 else [],
    ),
    (rf"\boff\s+by\s+(?P<n>{_NUMBER})\b(?!\s*(?:%|percent|times|places?))", lambda a, n: [a - n, a + n]),
    (rf"\b(?P<n>{_NUMBER})\s+too\s+(?:many|much|high|large|big)\b", lambda a, n: [a - n]),
    (rf"\b(?P<n>{_NUMBER})\s+too\s+(?:few|little|low|small)\b", lambda a, n: [a + n]),
    (rf"\boff\s+by\s+a\s+factor\s+of\s+(?P<n>{_NUMBER})\b", lambda a, n: [a / n, a * n] if n else []),
    (rf"\b(?P<n>{_NUMBER})\s+times\s+too\s+(?:many|much|high|large|big)\b", lambda a, n: [a / n] if n else []),
    (rf"\b(?P<n>{_NUMBER})\s+times\s+too\s+(?:few|little|low|small)\b", lambda a, n: [a * n]),
    (rf"\bsquare\s+{_OBJECT}", lambda a, n: [a * a] if abs(a) < 10**15 else []),
]
_ATTEMPT_RE = [(re.compile(pattern, re.IGNORECASE), apply) for pattern, apply in _ATTEMPT_OPERATIONS]
_SWAP_RE = re.compile(
    r"\bswap\b|\bswitch\s+them\b|\b(?:reverse|flip)\s+(?:the\s+|their\s+)?order\b",
    re.IGNORECASE,
)


def relative_values(text: str, attempt: Fraction | None) -> list[Value]:
    """Values the text gives as an operation on the attempt's answer ``attempt`` (module docstring); none without
    one. A result equal to the attempt's answer is not one (the operation changes nothing)."""
    if attempt is None:
        return []
    found = []
    for pattern, apply in _ATTEMPT_RE:
        for match in list(pattern.finditer(text))[:MAX_DESCRIPTIONS]:
            n = _count(match["n"]) if "n" in pattern.groupindex else Fraction(0)
            found += [Value(value, *match.span()) for value in apply(attempt, n) if value != attempt]
    return found


def swapped(text: str, attempt: list[Fraction] | None) -> tuple[list[Fraction], str] | None:
    """The attempt's tuple in reverse order and the passage that says to reverse it, or None."""
    match = _SWAP_RE.search(text)
    if not attempt or len(attempt) < 2 or not match:
        return None
    return attempt[::-1], match.group()


# ------------------------------------------------------------------------------------------- unique descriptions
_ONLY_RE = re.compile(
    r"\b(?:the|an?|its)\s+(?:one\s+and\s+)?only\s+(?P<what>(?:[\w-]+\s+){0,3}?(?:prime|number|integer|square|cube|"
    r"option|choice|answer|one|value|multiple\s+of\s+\d{1,9}|divisor\s+of\s+\d{1,9}|factor\s+of\s+\d{1,9}))\b"
    r"(?P<where>[^.;!?\n]{0,50})",
    re.IGNORECASE,
)
_DECADES = {"teens": (13, 19), "twenties": (20, 29), "thirties": (30, 39), "forties": (40, 49), "fifties": (50, 59),
            "sixties": (60, 69), "seventies": (70, 79), "eighties": (80, 89), "nineties": (90, 99)}  # fmt: skip
_BETWEEN_RE = re.compile(r"\bbetween\s+(?P<a>\d{1,9})\s+and\s+(?P<b>\d{1,9})\b", re.IGNORECASE)
_BELOW_RE = re.compile(r"\b(?:less\s+than|below|under|smaller\s+than)\s+(?P<b>\d{1,9})\b", re.IGNORECASE)
_DIGITS_RE = re.compile(r"\b(?P<n>single|one|\d)[- ]digit\b", re.IGNORECASE)
_LISTED_RE = re.compile(r"\b(?:listed|offered|given|shown|among\s+the\s+(?:options|choices|answers))\b|\b(?:option|"
                        r"choice)s?\b", re.IGNORECASE)  # fmt: skip
_OPTION_VALUE_RE = re.compile(r"\((?P<letter>[A-E])\)\s*(?P<value>[^()]{1,40}?)\s*(?=\([A-E]\)|$|\n)")


def option_values(problem: str) -> list[tuple[str, Fraction | None]]:
    """``(letter, value)`` of each option the problem lists ("(B) 36"); None for an option that is no number."""
    return [
        (match["letter"], exact_value(plain(match["value"].strip().rstrip(".,;"))))
        for match in _OPTION_VALUE_RE.finditer(problem)
    ]


def _is_prime(n: int) -> bool:
    return n >= 2 and all(n % d for d in range(2, math.isqrt(n) + 1))


def _properties(what: str) -> list:
    """The tests of each property a description names (empty: none the reader knows)."""
    words = what.lower()
    tests = []
    if re.search(r"\beven\b", words):
        tests.append(lambda n: n % 2 == 0)
    if re.search(r"\bodd\b", words):
        tests.append(lambda n: n % 2 == 1)
    if re.search(r"\bprimes?\b", words):
        tests.append(_is_prime)
    if re.search(r"\bperfect\b(?!\s+(?:square|cube))", words):
        tests.append(lambda n: n in _PERFECT_NUMBERS)
    if re.search(r"\bsquare\b", words):
        tests.append(lambda n: n >= 0 and math.isqrt(n) ** 2 == n)
    if re.search(r"\bcube\b", words):
        tests.append(lambda n: round(abs(n) ** (1 / 3)) ** 3 == abs(n))
    for kind, number in re.findall(r"\b(multiple|divisor|factor)\s+of\s+(\d{1,9})\b", words):
        m = int(number)
        tests.append((lambda n, m=m: n % m == 0) if kind == "multiple" else (lambda n, m=m: n > 0 and m % n == 0))
    return tests


def _range(where: str, what: str) -> range | None:
    """The integers a description ranges over: a decade ("in the twenties"), "between a and b", "less than b", "a
    single-digit / 2-digit …" (at most :data:`MAX_RANGE` of them); None when it names none or a larger one."""
    text = f"{what} {where}".lower()
    for decade, (low, high) in _DECADES.items():
        if re.search(rf"\b{decade}\b", text):
            return range(low, high + 1)
    between = _BETWEEN_RE.search(text)
    if between:
        low, high = sorted((int(between["a"]), int(between["b"])))
        return range(low + 1, high) if high - low <= MAX_RANGE and high <= MAX_NUMBER else None
    below = _BELOW_RE.search(text)
    if below:
        return range(0, int(below["b"])) if int(below["b"]) <= MAX_RANGE else None
    digits = _DIGITS_RE.search(text)
    if digits:
        count = 1 if digits["n"].lower() in ("single", "one") else int(digits["n"])
        return range(10 ** (count - 1) if count > 1 else 0, 10**count) if count <= 3 else None
    return None


def unique_values(text: str) -> list[Value]:
    """Integers the text names as the only one of a range with its properties ("the only even prime", "the only
    perfect number in the twenties"); a prime with no range is looked for below :data:`MAX_RANGE`."""
    found = []
    for match in list(_ONLY_RE.finditer(text))[:MAX_DESCRIPTIONS]:
        if _LISTED_RE.search(match["where"]) or re.search(r"\b(?:option|choice)\b", match["what"], re.I):
            continue  # among the problem's options: unique_options
        tests = _properties(match["what"])
        numbers = _range(match["where"], match["what"]) or range(0, MAX_RANGE)  # none named: "the only even prime"
        if not tests:
            continue
        having = [n for n in numbers if all(test(n) for test in tests)]
        if len(having) == 1:
            found.append(Value(Fraction(having[0]), *match.span()))
    return found


def unique_options(text: str, problem: str) -> list[tuple[str, str]]:
    """``(letter, passage)`` of each option of the problem the text names as the only one listed with its
    properties ("the only perfect square listed")."""
    options = option_values(problem)
    if not options:
        return []
    found = []
    for match in list(_ONLY_RE.finditer(text))[:MAX_DESCRIPTIONS]:
        tests = _properties(match["what"])
        if not tests or not (_LISTED_RE.search(match["where"]) or re.search(r"\b(?:option|choice)\b", match["what"])):
            continue
        having = [letter for letter, value in options if value is not None and value.denominator == 1
                  and all(test(int(value)) for test in tests)]  # fmt: skip
        if len(having) == 1:
            found.append((having[0], match.group()))
    return found


# ---------------------------------------------------------------------------------------------- ratios and odds
_RATIO_RE = re.compile(  # "a ratio of 4 to 7", "odds of 2 : 3"
    r"\b(?P<kind>ratio|odds|proportion)\b[^.;!?\n]{0,40}?(?<![\d.])(?P<a>\d{1,15})\s*(?::|\bto\b)\s*(?P<b>\d{1,15})"
    r"(?!\d|\.\d)",
    re.IGNORECASE,
)
_COLON_RE = re.compile(r"(?<![\d.:])(?P<a>\d{1,15})(?P<colon>\s*:\s*)(?P<b>\d{1,15})(?!\d|[.:]\d)")  # "4 : 7", not 3:45


def ratio_values(text: str) -> list[Value]:
    """A ratio: "a : b" or "a:b" (not a time of day, "3:45", nor a label, "Step 1: 5"), or "a to b" after "ratio" /
    "odds" / "proportion": a/b; odds also give the probabilities a/(a+b) (in favour) and b/(a+b) (against)."""
    found = []
    for match in list(_RATIO_RE.finditer(text))[:MAX_DESCRIPTIONS]:
        a, b = int(match["a"]), int(match["b"])
        span = match.start("a"), match.end()
        found += [Value(Fraction(a, b), *span)] if b else []
        if match["kind"].lower() == "odds" and a + b:
            found += [Value(Fraction(a, a + b), *span), Value(Fraction(b, a + b), *span)]
    for match in list(_COLON_RE.finditer(text))[:MAX_DESCRIPTIONS]:
        tight = match["colon"] == ":"  # "4:7"; spaced on one side only, "Step 1: 5 apples", is a label
        spaced = match["colon"][0].isspace() and match["colon"][-1].isspace()
        time = tight and len(match["b"]) == 2 and int(match["b"]) < 60
        if int(match["b"]) and (tight or spaced) and not time:
            found.append(Value(Fraction(int(match["a"]), int(match["b"])), *match.span()))
    return found


# ---------------------------------------------------------------------------------------------- named quantities
_NAMED = [
    (r"\bbaker'?s\s+dozen\b", 13),
    (r"\ba\s+gross\b(?!\s+(?:profit|income|margin|weight|pay|salary|domestic|revenue|error|mistake))", 144),
    (r"\bright\s+angle\b", 90),
    (r"\bstraight\s+angle\b", 180),
    (r"\bfull\s+(?:turn|revolution|rotation|circle)\b", 360),
]
_NAMED_RE = [(re.compile(pattern, re.IGNORECASE), Fraction(value)) for pattern, value in _NAMED]


def named_values(text: str) -> list[Value]:
    """Quantities the text names by their common name (module docstring)."""
    return [
        Value(value, *match.span())
        for pattern, value in _NAMED_RE
        for match in list(pattern.finditer(text))[:MAX_DESCRIPTIONS]
    ]
