"""The values a text expresses, wherever they stand (docs/LEAK.md, "Value presence"; the leak check compares them
with the gold in :mod:`agent_system.rewards.value_presence`).

Read on the text :func:`agent_system.rewards.leak.normalized` gives (numbers in words of five languages, digits
spelled one by one), after :func:`plain`: every number, fraction (``\\frac``, ``\\dfrac``, ``{a \\over b}``, "3 out
of 8"), mixed number ("2 1/2"), percent, power, factorial, binomial and square root of a square, every run of
arithmetic on the page ("3*8", "30 - 19", "7 times 8", "add 6 back to your 41", "half of 5"), the unknown of a
one-variable linear equation ("n + 19 = 30" gives 11), a quantity in two units ("2 h 30 min" is 5/2 and 150) and
integers in other notations (Roman numerals, other bases, digits reversed, the one integer between two bounds).
Values are exact rationals (:class:`fractions.Fraction`).

Everything is bounded: at most :data:`MAX_VALUES` values per text, an expression of at most
:data:`MAX_EXPRESSION_TOKENS` tokens and :data:`MAX_DEPTH` levels of brackets, a power or product of at most
:data:`MAX_BITS` bits (``10^10^10`` has no value), a factorial of at most :data:`MAX_FACTORIAL`. Nothing here raises
on any text.
"""

from __future__ import annotations

import dataclasses
import math
import re
from fractions import Fraction

MAX_VALUES = 2_000  # values read per text
MAX_EXPRESSION_TOKENS = 40
MAX_DEPTH = 8  # brackets in one expression
MAX_BITS = 4_096  # a power or product larger than this has no value
MAX_FACTORIAL = 100

_LATEX = [  # (pattern, replacement): LaTeX and signs in the plain form the expression reader parses
    (re.compile(r"\\[dt]?frac\s*\{([^{}]{1,60})\}\s*\{([^{}]{1,60})\}"), r"((\1)/(\2))"),
    (re.compile(r"\\[dt]?frac\s*(\d)\s*(\d)"), r"((\1)/(\2))"),
    (re.compile(r"\{([^{}]{1,60})\\over([^{}]{1,60})\}"), r"((\1)/(\2))"),
    (re.compile(r"\\binom\s*\{(\d{1,4})\}\s*\{(\d{1,4})\}|\bC\((\d{1,4}),\s*(\d{1,4})\)"), r"(\1\3 choose \2\4)"),
    (re.compile(r"\\sqrt\s*\{([^{}]{1,60})\}"), r"sqrt(\1)"),
    (re.compile(r"\^\s*\{([^{}]{1,60})\}"), r"^(\1)"),
    (re.compile(r"\\(?:cdot|times)|[×·⋅∙]|(?<=\d)\s*\*\*?\s*(?=[\d(])|(?<=[\d)])\s+x\s+(?=\d)"), " * "),
    (re.compile(r"\\div|÷"), " / "),
    (re.compile(r"\\left|\\right|\\[,;:! ]|\\displaystyle|\$|\\\(|\\\)|\\\[|\\\]"), " "),
    (re.compile(r"\\%"), "%"),
    (re.compile(r"[{}]"), " "),
]
_WORD_OPERATORS = re.compile(
    r"(?<=\d)\s+(?:(?P<times>times|multiplied\s+by|fois|por|mal)|(?P<plus>plus|más|mas)|(?P<minus>minus)"
    r"|(?P<over>divided\s+by|over|divisé\s+par|dividido\s+(?:por|entre)|geteilt\s+durch)|(?P<choose>choose))\s+"
    r"(?=[-(]?\d)",
    re.IGNORECASE,
)
_MIXED_RE = re.compile(
    r"(?<![\d./)])(\d{1,30})(?:\s+(\d{1,30})\s*/\s*(\d{1,30})|\s*\((\d{1,30})/(\d{1,30})\))(?![\d/])"
)
_WORD_ARITHMETIC = [  # (pattern, value from its numbers a, b): arithmetic said in words, on digits
    (r"\badd(?:ing)?\s+{a}\s+(?:back\s+)?(?:on\s+)?to\s+(?:your\s+|the\s+|it\s+)?{b}", lambda a, b: a + b),
    (
        r"\b(?:subtract(?:ing)?|tak(?:e|ing)(?:\s+away)?)\s+{a}\s+(?:away\s+)?from\s+(?:your\s+|the\s+)?{b}",
        lambda a, b: b - a,
    ),
    (r"\b(?:multiply(?:ing)?)\s+(?:your\s+|the\s+)?{a}\s+by\s+{b}", lambda a, b: a * b),
    (r"\b(?:divid(?:e|ing))\s+(?:your\s+|the\s+)?{a}\s+by\s+{b}", lambda a, b: a / b if b else None),
    (r"\b{a}\s+more\s+than\s+(?:your\s+|the\s+)?{b}", lambda a, b: a + b),
    (r"\b{a}\s+less\s+than\s+(?:your\s+|the\s+)?{b}", lambda a, b: b - a),
    (r"\b{a}\s+out\s+of\s+(?:the\s+|all\s+)?{b}", lambda a, b: a / b if b else None),
]
_NUMBER = r"(?P<{}>-?\d{{1,60}}(?:\.\d{{1,60}})?(?!\d)|\bone\b)"  # "one less than 50": "one" alone stays a word
_WORD_ARITHMETIC_RE = [
    (re.compile(p.format(a=_NUMBER.format("a"), b=_NUMBER.format("b")), re.IGNORECASE), f) for p, f in _WORD_ARITHMETIC
]
_UNARY_WORDS_RE = re.compile(
    r"\b(?:(?P<half>half)\s+of\s+(?:the\s+|your\s+)?|(?P<double>twice|double)\s+(?:the\s+|your\s+)?"
    r"|(?P<root>square\s+root)\s+of\s+)(?P<n>\d{1,60}(?:\.\d{1,60})?)\b|(?<!\d)(?P<m>\d{1,60}(?:\.\d{1,60})?)\s+"
    r"(?P<power>squared|cubed)\b",
    re.IGNORECASE,
)
_UNIT_PAIRS = [  # "2 h 30 min": (big unit, small unit, small units per big unit)
    (r"h|hrs?|hours?", r"min|mins|minutes?", 60),
    (r"min|mins|minutes?", r"s|secs?|seconds?", 60),
    (r"days?", r"h|hrs?|hours?", 24),
    (r"m|metres?|meters?", r"cm|centimetres?|centimeters?", 100),
    (r"km|kilometres?|kilometers?", r"m|metres?|meters?", 1000),
    (r"kg|kilograms?", r"g|grams?", 1000),
    (r"ft|feet|foot", r"in|inch|inches", 12),
    (r"lb|lbs|pounds?", r"oz|ounces?", 16),
]
_UNIT_PAIR_RE = [
    (
        re.compile(
            rf"(?<!\d)(?P<a>\d{{1,60}}(?:\.\d{{1,60}})?)\s*(?:{big})\.?\s*(?:and\s+)?(?P<b>\d{{1,60}})\s*(?:{small})\b",
            re.I,
        ),
        k,
    )
    for big, small, k in _UNIT_PAIRS
]
_TOKEN_RE = re.compile(r"\d+(?:\.\d+)?|\.\d+|sqrt|choose|[-+*/^!()%=]|[a-zA-Z]|\s+|.", re.IGNORECASE)
_LITERAL_RE = re.compile(
    r"(?<![\w.])((?:(?<![\d)\]])(?<![\d)\]]\s)-)?\d{1,60}(?:\.\d{1,60})?|\.\d{1,60})(?:\s*/\s*(\d{1,60})(?!\d|\.\d))?(?:\s*(%))?(?!\d|st\b|nd\b|rd\b|th\b)"
)
_SIMPLE_FRACTION_RE = re.compile(r"\(\(\s*(\d{1,60})\s*\)/\(\s*(\d{1,60})\s*\)\)")
_GROUP_RE = re.compile(r"(?<=\d)(?:,|[ \u2009\u202f\u00a0]|\\,)(?=\d{3}(?![\d.]))")  # "1,000", "2 500"


@dataclasses.dataclass(frozen=True)
class Value:
    """A value a text expresses: its exact rational value and the span of the (plain) text that expresses it."""

    value: Fraction
    start: int
    end: int


def plain(text: str) -> str:
    """A normalized text with LaTeX fractions, powers, roots, binomials and the signs of multiplication and division
    written as the expression reader parses them (``\\frac{a}{b}`` → ``((a)/(b))``, ``×`` → ``*``, "7 times 8" →
    ``7 * 8``, "2 1/2" → ``(2+1/2)``)."""
    text = _GROUP_RE.sub("", text)
    for pattern, replacement in _LATEX:
        for _ in range(3):  # nested fractions, bounded
            text, count = pattern.subn(replacement, text)
            if not count:
                break
    text = _SIMPLE_FRACTION_RE.sub(r"(\1/\2)", text)  # "((1)/(2))" → "(1/2)": its 2 alone is no value
    text = _WORD_OPERATORS.sub(_word_operator, text)
    return _MIXED_RE.sub(_mixed, text)


def _mixed(match: re.Match) -> str:
    """ "2 1/2" and ``2\\frac{1}{2}`` as ``(2+1/2)`` (a proper fraction after a whole number), else unchanged."""
    whole, top, bottom = match[1], match[2] or match[4], match[3] or match[5]
    return f"({whole}+{top}/{bottom})" if int(top) < int(bottom) else match.group()


def _word_operator(match: re.Match) -> str:
    """The sign of an operator said in words."""
    signs = {"times": "*", "plus": "+", "minus": "-", "over": "/", "choose": " choose "}
    return " " + next(signs[name] for name, text in match.groupdict().items() if text) + " "


def values(text: str) -> list[Value]:
    """Every value a plain text (:func:`plain`) expresses: its numbers, percents, evaluated arithmetic, solved
    linear equations, arithmetic in words and two-unit quantities; at most :data:`MAX_VALUES`."""
    found: list[Value] = []
    for match in _LITERAL_RE.finditer(text):
        found += _literal(match)
        if len(found) >= MAX_VALUES:
            return found[:MAX_VALUES]
    found += _arithmetic(text)
    for pattern, combine in _WORD_ARITHMETIC_RE:
        for match in pattern.finditer(text):
            found += _value_of(combine(_number(match["a"]), _number(match["b"])), match.span())
    found += _encoded(text)
    for match in _UNARY_WORDS_RE.finditer(text):
        found += _value_of(_unary(match), match.span())
    for pattern, per in _UNIT_PAIR_RE:
        for match in pattern.finditer(text):
            big, small = Fraction(match["a"]), Fraction(match["b"])
            found += _value_of(big + small / per, match.span()) + _value_of(big * per + small, match.span())
    return found[:MAX_VALUES]


def _number(text: str) -> Fraction:
    """A number of the word arithmetic: digits, or the word "one"."""
    return Fraction(1) if text.lower() == "one" else Fraction(text)


def _encoded(text: str) -> list[Value]:
    """Integers written in another notation: Roman numerals ("LIV"), other bases ("0xFF", "111111_2", "in binary
    … 111111"), digits reversed in a sentence that says so ("written backwards: 193"), and the one integer strictly
    between two bounds two apart ("more than 33 and fewer than 35", "between 33 and 35")."""
    found: list[Value] = []
    for match in _ROMAN_RE.finditer(text):
        if set(match.group()) != {"I"}:  # "II", "III" are labels far more often ("Type II", "Phase III")
            found += _value_of(_roman(match.group()), match.span())
    for match in _PREFIXED_BASE_RE.finditer(text):
        found += _value_of(_in_base(match["digits"], _PREFIX_BASES[match["prefix"].lower()]), match.span())
    for match in _SUBSCRIPT_BASE_RE.finditer(text):
        if _numeral_like(match["digits"]):  # "FF_16", "52_8"; not a sequence's term "a_{12}"
            found += _value_of(_in_base(match["digits"], int(match["base"])), match.span())
    for sentence in _SENTENCE_RE.finditer(text):
        base = _BASE_WORDS_RE.search(sentence.group())
        if base:
            radix = _BASE_NAMES[base["name"].lower()] if base["name"] else int(base["radix"])
            for match in _BASE_DIGITS_RE.finditer(sentence.group()):
                span = (sentence.start() + match.start(), sentence.start() + match.end())
                if len(match.group()) > 1 and match.group() != base["radix"] and _numeral_like(match.group()):
                    found += _value_of(_in_base(match.group(), radix), span)
        if _REVERSED_RE.search(sentence.group()):
            for match in re.finditer(r"(?<![\d.])\d{2,30}(?!\d|\.\d)", sentence.group()):
                span = (sentence.start() + match.start(), sentence.start() + match.end())
                found.append(Value(Fraction(int(match.group()[::-1])), *span))
    for match in _BETWEEN_RE.finditer(text):
        low, high = sorted((Fraction(match["a"] or match["a2"]), Fraction(match["b"] or match["b2"])))
        if high - low == 2 and low.denominator == 1:
            found.append(Value(low + 1, *match.span()))
    return found


_ROMAN_RE = re.compile(r"(?<![\w'])[MDCLXVI]{2,15}(?![\w'])")
_ROMAN_DIGITS = {"M": 1000, "D": 500, "C": 100, "L": 50, "X": 10, "V": 5, "I": 1}
_ROMAN_PAIRS = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"), (50, "L"), (40, "XL"),
                (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]  # fmt: skip
_PREFIX_BASES = {"0x": 16, "0b": 2, "0o": 8}
_PREFIXED_BASE_RE = re.compile(r"(?<![\w.])(?P<prefix>0[xXbBoO])(?P<digits>[0-9a-fA-F]{1,30})(?!\w|\.\w)")
_SUBSCRIPT_BASE_RE = re.compile(
    r"(?<![\w.])\(?(?P<digits>[0-9A-Fa-f]{1,30})\)?\s*_\s*\{?\s*(?:\(\s*)?(?P<base>[2-9]|1[0-6])(?:\s*\))?\s*\}?(?!\w|\.\w)"
)
_BASE_NAMES = {"binary": 2, "octal": 8, "hexadecimal": 16, "hex": 16, "ternary": 3, "duodecimal": 12}
_BASE_WORDS_RE = re.compile(
    r"\b(?:(?P<name>binary|octal|hexadecimal|hex|ternary|duodecimal)|base[-\s]+(?P<radix>[2-9]|1[0-6]))\b", re.I
)
_BASE_DIGITS_RE = re.compile(r"(?<![\w.])[0-9A-Fa-f]{1,30}(?!\w|\.\w)")
_SENTENCE_RE = re.compile(r"[^.!?;\n]+(?:[.!?;\n]|$)")
_REVERSED_RE = re.compile(r"\b(?:backwards?|reversed?|reversing|in\s+reverse|mirror(?:ed)?)\b", re.I)
_BETWEEN_RE = re.compile(
    r"\b(?:(?:more|greater|larger|bigger|higher)\s+than|above|over)\s+(?P<a>\d{1,30})\s*,?\s*(?:and|but)\s+"
    r"(?:(?:less|fewer|smaller|lower)\s+than|below|under)\s+(?P<b>\d{1,30})(?!\d)"
    r"|\b(?:strictly\s+)?between\s+(?P<a2>\d{1,30})\s+and\s+(?P<b2>\d{1,30})\s*(?:,\s*)?(?:exclusive|not\s+counting)",
    re.I,
)


def _roman(numeral: str) -> Fraction | None:
    """The value of a Roman numeral in its standard form ("LIV" is 54; "IIII" and "VX" are none)."""
    total = 0
    for index, letter in enumerate(numeral):
        value = _ROMAN_DIGITS[letter]
        following = _ROMAN_DIGITS[numeral[index + 1]] if index + 1 < len(numeral) else 0
        total += -value if value < following else value
    if total <= 0 or total >= 4000:
        return None
    standard, rest = "", total
    for value, letters in _ROMAN_PAIRS:
        count, rest = divmod(rest, value)
        standard += letters * count
    return Fraction(total) if standard == numeral else None


def _numeral_like(token: str) -> bool:
    """Whether a token of hexadecimal letters reads as a numeral: it has a digit, or is two or more capitals ("FF";
    not the words "add", "bed" or a lone "a")."""
    return any(c.isdigit() for c in token) or (len(token) > 1 and token.isupper())


def _in_base(digits: str, base: int) -> Fraction | None:
    """The value of ``digits`` in ``base``, None when a digit is not one of the base's."""
    try:
        return Fraction(int(digits, base))
    except ValueError:
        return None


def _literal(match: re.Match) -> list[Value]:
    """A number as written ("37.5"), its percent ("37.5%" is also 3/8) and a plain fraction ("3 / 8")."""
    number = Fraction(match[1])
    start, end = match.span()
    found = [] if match[2] else [Value(number, match.start(1), match.end(1))]  # 1/2 is not 1
    if match[2]:
        found += _value_of(number / int(match[2]) if int(match[2]) else None, (start, end))
    elif match[3]:
        found.append(Value(number / 100, start, end))
    return found


def literal_values(text: str) -> set[Fraction]:
    """The numbers a plain text writes (with its percents and plain fractions), not the values of its arithmetic."""
    return {value.value for match in _LITERAL_RE.finditer(text) for value in _literal(match)}


def exact_value(text: str) -> Fraction | None:
    """The value of a plain text that is one expression ("\\frac{5}{2}" after :func:`plain`, "2^{10}"), else None."""
    runs = _runs(text)
    if len(runs) != 1 or len(runs[0]) != 1 or "".join(t[0] for t in runs[0][0]) != "".join(text.split()):
        return None  # more than one expression, or text besides it ("9\\pi" is not 9)
    value = _evaluate(runs[0][0])
    return value if isinstance(value, Fraction) else None


def _value_of(value: Fraction | None, span: tuple[int, int]) -> list[Value]:
    """``[Value]`` when there is a value, else ``[]``."""
    return [] if value is None else [Value(Fraction(value), *span)]


def _unary(match: re.Match) -> Fraction | None:
    """ "half of 5", "twice 12", "square root of 49", "7 squared"."""
    number = Fraction(match["n"] or match["m"])
    if match["half"]:
        return number / 2
    if match["double"]:
        return 2 * number
    if match["root"]:
        return _root(number)
    return number ** (2 if match["power"].lower() == "squared" else 3)


def _root(value: Fraction) -> Fraction | None:
    """The square root of a rational square, else None."""
    if value < 0 or value.numerator.bit_length() > MAX_BITS or value.denominator.bit_length() > MAX_BITS:
        return None
    top, bottom = math.isqrt(value.numerator), math.isqrt(value.denominator)
    return Fraction(top, bottom) if top * top == value.numerator and bottom * bottom == value.denominator else None


def _arithmetic(text: str) -> list[Value]:
    """The values of the runs of arithmetic in a text: each side of an ``=`` chain that is an expression of two or
    more numbers, and the unknown of a side with one variable set equal to a number."""
    found: list[Value] = []
    for run in _runs(text):
        sides = [_evaluate(tokens) for tokens in run]
        for tokens, side in zip(run, sides, strict=True):
            if isinstance(side, Fraction) and len(tokens) >= 2:
                found.append(Value(side, tokens[0][1], tokens[-1][2]))
        for index, (left, right) in enumerate(zip(sides, sides[1:], strict=False)):
            solved = _solve(left, right)
            if solved is not None:  # the span: the whole equation
                found.append(Value(solved, run[index][0][1], run[index + 1][-1][2]))
        if len(found) >= MAX_VALUES:
            break
    return found


Token = tuple[str, int, int]  # (text, start, end)


def _runs(text: str) -> list[list[list[Token]]]:
    """The runs of arithmetic in a text, each as its ``=``-separated sides of tokens (a side: numbers, operators,
    brackets, ``sqrt``, ``choose`` and one-letter variables; anything else ends the run)."""
    runs: list[list[list[Token]]] = []
    sides: list[list[Token]] = [[]]
    for match in _TOKEN_RE.finditer(text):
        token = match.group()
        if len(token) > 60:  # a number too long to be a value here
            _close(runs, sides)
            sides = [[]]
            continue
        if token.isspace() and "\n" not in token:
            continue
        if token == "=":
            sides.append([])
        elif _is_math(token, text, match.start(), match.end()) and len(sides[-1]) < MAX_EXPRESSION_TOKENS:
            sides[-1].append((token, match.start(), match.end()))
        else:
            _close(runs, sides)
            sides = [[]]
    _close(runs, sides)
    return runs


def _is_math(token: str, text: str, start: int, end: int) -> bool:
    """Whether a token belongs to arithmetic: a number, an operator, a bracket, a function, or a letter that stands
    alone (not a word's)."""
    if token[0].isdigit() or token[0] == "." and len(token) > 1 or token in ("sqrt", "choose"):
        return True
    if token in "-+*/^!()%":
        return True
    alone = not text[end : end + 1].isalpha() and not text[max(0, start - 1) : start].isalpha()
    return token.isalpha() and len(token) == 1 and alone


def _close(runs: list, sides: list[list[Token]]) -> None:
    """Adds the finished run's non-empty sides to ``runs``."""
    kept = [side for side in sides if side]
    if kept:
        runs.append(kept)


Linear = tuple[Fraction, Fraction]  # a * unknown + b


def _evaluate(tokens: list[Token]) -> Fraction | Linear | None:
    """The value of a side (a Fraction), a linear form of its one variable ``(a, b)``, or None when it is no
    complete expression or a bound is passed."""
    letters = {t[0] for t in tokens if t[0].isalpha() and len(t[0]) == 1}
    if len(letters) > 1:
        return None
    parser = _Parser([t[0] for t in tokens])
    try:
        result = parser.expression(0)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None
    if parser.position != len(tokens) or result is None:
        return None
    return result[1] if result[0] == 0 else result


def _solve(left, right) -> Fraction | None:
    """The unknown of ``left = right`` when one side is linear in it and the other a number."""
    if isinstance(left, Fraction) and isinstance(right, tuple):
        left, right = right, left
    if isinstance(left, tuple) and isinstance(right, Fraction) and left[0] != 0:
        return (right - left[1]) / left[0]
    return None


class _Parser:
    """A recursive-descent reader of ``+ - * / ^ ! %``, brackets, ``sqrt(…)``, ``n choose k`` and one variable, on
    linear forms ``(a, b)`` (``a * unknown + b``); a product or power of the unknown, a bound passed or a division by
    zero raise ValueError (the caller's None)."""

    def __init__(self, tokens: list[str]):
        self.tokens, self.position = tokens, 0

    def peek(self) -> str:
        return self.tokens[self.position] if self.position < len(self.tokens) else ""

    def take(self) -> str:
        self.position += 1
        return self.tokens[self.position - 1]

    def expression(self, depth: int) -> Linear:
        value = self.term(depth)
        while self.peek() in ("+", "-"):
            sign = 1 if self.take() == "+" else -1
            other = self.term(depth)
            value = (value[0] + sign * other[0], value[1] + sign * other[1])
        return value

    def term(self, depth: int) -> Linear:
        value = self.power(depth)
        while self.peek() in ("*", "/", "choose") or _starts_factor(self.peek()) and value[0] == 0:
            operator = self.take() if self.peek() in ("*", "/", "choose") else "*"
            value = _combine(value, operator, self.power(depth))
        return value

    def power(self, depth: int) -> Linear:
        value = self.postfix(depth)
        if self.peek() == "^":
            self.take()
            exponent = self.power(depth)  # right-associative: 10^10^10 is 10^(10^10), refused by its size
            if value[0] != 0 or exponent[0] != 0:
                raise ValueError("power of the unknown")
            return (Fraction(0), _bounded_power(value[1], exponent[1]))
        return value

    def postfix(self, depth: int) -> Linear:
        value = self.atom(depth)
        while self.peek() in ("!", "%"):
            if value[0] != 0:
                raise ValueError("postfix on the unknown")
            number = value[1]
            if self.take() == "%":
                value = (Fraction(0), number / 100)
            elif number.denominator != 1 or not 0 <= number <= MAX_FACTORIAL:
                raise ValueError("factorial out of bounds")
            else:
                value = (Fraction(0), Fraction(math.factorial(int(number))))
        return value

    def atom(self, depth: int) -> Linear:
        if depth > MAX_DEPTH:
            raise ValueError("too deep")
        token = self.take() if self.peek() else ""
        if token == "-":
            value = self.power(depth)
            return (-value[0], -value[1])
        if token == "(":
            value = self.expression(depth + 1)
            if self.take() if self.peek() == ")" else None:
                return value
            raise ValueError("unclosed bracket")
        if token == "sqrt":
            root = _root(self.atom(depth + 1)[1]) if self.peek() == "(" else None
            if root is None:
                raise ValueError("no rational root")
            return (Fraction(0), root)
        if token[:1].isdigit() or token[:1] == ".":
            return (Fraction(0), Fraction(token))
        if token.isalpha() and len(token) == 1:
            return (Fraction(1), Fraction(0))
        raise ValueError(f"unexpected {token!r}")


def _starts_factor(token: str) -> bool:
    """Whether a token starts a factor of an implicit product ("3x", "2(4)")."""
    return token == "(" or (token.isalpha() and len(token) == 1)


def _combine(left: Linear, operator: str, right: Linear) -> Linear:
    """``left * right``, ``left / right`` or ``left choose right`` on linear forms (one side a number)."""
    if operator == "choose":
        n, k = left[1], right[1]
        if left[0] or right[0] or n.denominator != 1 or k.denominator != 1 or not 0 <= k <= n <= 10 * MAX_FACTORIAL:
            raise ValueError("binomial out of bounds")
        return (Fraction(0), Fraction(math.comb(int(n), int(k))))
    if operator == "/":
        if right[0] != 0:
            raise ValueError("division by the unknown")
        return (left[0] / right[1], left[1] / right[1])
    if left[0] != 0 and right[0] != 0:
        raise ValueError("product of the unknown")
    product = (left[0] * right[1] + right[0] * left[1], left[1] * right[1])
    if max(abs(product[1].numerator), product[1].denominator).bit_length() > MAX_BITS:
        raise ValueError("too large")
    return product


def _bounded_power(base: Fraction, exponent: Fraction) -> Fraction:
    """``base ** exponent`` for an integer exponent whose result stays within :data:`MAX_BITS` bits."""
    if exponent.denominator != 1:
        raise ValueError("fractional power")
    bits = max(abs(base.numerator), base.denominator, 2).bit_length()
    if abs(exponent) * bits > MAX_BITS or (base == 0 and exponent < 0):
        raise ValueError("power out of bounds")
    return base ** int(exponent)
