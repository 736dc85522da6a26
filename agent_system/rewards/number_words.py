"""Numbers written in words in the languages of math text, rewritten as digits (docs/LEAK.md, "Value presence").

:func:`spelled_out` runs before the English rules of :func:`agent_system.rewards.leak.normalized`: French
("vingt-quatre", "quatre-vingt-dix", "trois quarts"), Spanish ("veinticuatro", "treinta y dos", "tres cuartos"),
German ("vierundzwanzig", "drei Viertel"), Chinese ("五十六", "三分之一", "百分之五十", "七乘八等于…"), English
"dozen" / "thousand" / "million", "negative two", and digits spelled one by one ("one, four, three" → ``143``,
"a 2 followed by a 4" → ``24``). Words that are also common English words ("once", "seize", "cent", "un" alone,
"elf") are left as they are. Pure regular expressions over bounded text; never raises.
"""

from __future__ import annotations

import re

_FRENCH = {
    **{"zéro": 0, "un": 1, "une": 1, "deux": 2, "trois": 3, "quatre": 4, "cinq": 5, "six": 6, "sept": 7, "huit": 8},
    **{"neuf": 9, "dix": 10, "onze": 11, "douze": 12, "treize": 13, "quatorze": 14, "quinze": 15, "seize": 16},
    **{"vingt": 20, "vingts": 20, "trente": 30, "quarante": 40, "cinquante": 50, "soixante": 60},
    **{"cent": 100, "cents": 100, "mille": 1000},
}
_SPANISH = {
    **{"cero": 0, "uno": 1, "una": 1, "dos": 2, "tres": 3, "cuatro": 4, "cinco": 5, "seis": 6, "siete": 7},
    **{"ocho": 8, "nueve": 9, "diez": 10, "doce": 12, "trece": 13, "catorce": 14, "quince": 15, "dieciséis": 16},
    **{"dieciseis": 16, "diecisiete": 17, "dieciocho": 18, "diecinueve": 19, "veinte": 20, "veintiuno": 21},
    **{"veintidós": 22, "veintidos": 22, "veintitrés": 23, "veintitres": 23, "veinticuatro": 24, "veinticinco": 25},
    **{"veintiséis": 26, "veintiseis": 26, "veintisiete": 27, "veintiocho": 28, "veintinueve": 29, "treinta": 30},
    **{"cuarenta": 40, "cincuenta": 50, "sesenta": 60, "setenta": 70, "ochenta": 80, "noventa": 90, "cien": 100},
    **{"ciento": 100, "doscientos": 200, "trescientos": 300, "cuatrocientos": 400, "quinientos": 500, "mil": 1000},
}
_GERMAN_UNITS = {"ein": 1, "eins": 1, "zwei": 2, "drei": 3, "vier": 4, "fünf": 5, "sechs": 6, "sieben": 7, "acht": 8}
_GERMAN_UNITS["neun"] = 9
_GERMAN_TEENS = {"zehn": 10, "zwölf": 12, "dreizehn": 13, "vierzehn": 14, "fünfzehn": 15, "sechzehn": 16}
_GERMAN_TEENS.update({"siebzehn": 17, "achtzehn": 18, "neunzehn": 19})
_GERMAN_TENS = {"zwanzig": 20, "dreißig": 30, "dreissig": 30, "vierzig": 40, "fünfzig": 50, "sechzig": 60}
_GERMAN_TENS.update({"siebzig": 70, "achtzig": 80, "neunzig": 90})
_AMBIGUOUS = {"un", "une", "uno", "una", "ein", "eins", "cent", "cents", "seize", "six", "dos"}  # alone: not a number
_ENGLISH_DIGITS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine".split())}
_DENOMINATORS = {
    **{"quart": 4, "quarts": 4, "tiers": 3, "cuarto": 4, "cuartos": 4, "tercio": 3, "tercios": 3, "medio": 2},
    **{"viertel": 4, "drittel": 3, "fünftel": 5, "achtel": 8, "halb": 2},
}
_CHINESE_DIGITS = {c: i for i, c in enumerate("零一二三四五六七八九")} | {"〇": 0, "两": 2}
_CHINESE_UNITS = {"十": 10, "百": 100, "千": 1000, "万": 10_000}
_CHINESE_OPERATORS = {"乘以": " * ", "乘": " * ", "除以": " / ", "加上": " + ", "加": " + ", "减去": " - ", "减": " - "}
_CHINESE_OPERATORS["等于"] = " = "

_WORD = r"[a-zA-ZÀ-ÿß]+"
_FRENCH_RE = re.compile(
    rf"\b(?:{'|'.join(sorted(_FRENCH, key=len, reverse=True))})(?:(?:-|\s+et\s+|\s+)(?:{'|'.join(_FRENCH)})){{0,5}}\b",
    re.IGNORECASE,
)
_SPANISH_RE = re.compile(
    rf"\b(?:{'|'.join(sorted(_SPANISH, key=len, reverse=True))})(?:(?:\s+y\s+|\s+)(?:{'|'.join(_SPANISH)})){{0,4}}\b",
    re.IGNORECASE,
)
_GERMAN_RE = re.compile(
    rf"\b(?:(?P<h>{'|'.join(_GERMAN_UNITS)})?hundert)?(?:(?P<u>{'|'.join(_GERMAN_UNITS)})und)?"
    rf"(?P<t>{'|'.join(sorted(_GERMAN_TENS | _GERMAN_TEENS | _GERMAN_UNITS, key=len, reverse=True))})?\b",
    re.IGNORECASE,
)
_FRACTION_WORD_RE = re.compile(rf"\b(\d+)\s+({'|'.join(_DENOMINATORS)})\b", re.IGNORECASE)
_CHINESE_NUMBER = rf"[{''.join(_CHINESE_DIGITS)}{''.join(_CHINESE_UNITS)}]{{1,12}}"
_CHINESE_FRACTION_RE = re.compile(rf"({_CHINESE_NUMBER})分之({_CHINESE_NUMBER})")
_CHINESE_PERCENT_RE = re.compile(rf"百分之({_CHINESE_NUMBER})")
_CHINESE_RE = re.compile(_CHINESE_NUMBER)
_SCALE_RE = re.compile(
    r"(?<![\d.])(?:(?P<n>\d{1,12}(?:\.\d{1,6})?)|\ba)\s+(?P<s>dozen|thousand|million|billion)\b", re.IGNORECASE
)
_SCALES = {"dozen": 12, "thousand": 1000, "million": 10**6, "billion": 10**9}
_NEGATIVE_RE = re.compile(
    r"\b(?:negative|minus|moins|menos)\s+(?=\d|(?:one|two|three|four|five|six|seven|eight|nine|ten|twenty|thirty|"
    r"forty|fifty|a\s+half|half)\b)",
    re.IGNORECASE,
)
_DIGIT_WORDS_RE = re.compile(  # "one, four, three": digits spelled one by one (two or more)
    rf"(?<![-\w])(?:{'|'.join(_ENGLISH_DIGITS)})(?:(?:\s*,\s*|\s*-\s*|\s+)(?:{'|'.join(_ENGLISH_DIGITS)})\b){{1,11}}"
    r"(?![-\w]|\s+(?:hundred|thousand|million|dozen|and\s+a)\b)",
    re.IGNORECASE,
)
_FOLLOWED_RE = re.compile(  # "a 2 followed by a 4", "a 2 then a 4"
    r"\b(?:an?\s+)?(\d)\s+(?:followed\s+by|then)\s+(?:an?\s+)?(\d)\b(?:\s+(?:and\s+)?(?:then\s+)?(?:an?\s+)?(\d)\b)?",
    re.IGNORECASE,
)
_SMALL_WORDS = ("ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen")


def _total(values: list[int], multiplies) -> str:
    """The digits of a number said as ``values`` in order: a thousand multiplies what came before it, a value for
    which ``multiplies(value, current)`` holds multiplies the group so far ("quatre-vingts" = 4 × 20), the rest add."""
    total, current = 0, 0
    for value in values:
        if value == 1000:
            total, current = total + max(current, 1) * 1000, 0
        elif multiplies(value, current):
            current = max(current, 1) * value
        else:
            current += value
    return str(total + current)


def _french(match: re.Match) -> str:
    """The digits of a French number ("quatre-vingt-dix" = 4 × 20 + 10, "deux cents" = 200)."""
    words = [w for w in re.split(r"[-\s]+", match.group().lower()) if w != "et"]
    if len(words) == 1 and words[0] in _AMBIGUOUS:
        return match.group()
    return _total([_FRENCH[word] for word in words], lambda value, current: value == 100 or (value, current) == (20, 4))


def _spanish(match: re.Match) -> str:
    """The digits of a Spanish number ("treinta y dos", "ciento veinte")."""
    words = [w for w in match.group().lower().split() if w != "y"]
    if len(words) == 1 and words[0] in _AMBIGUOUS:
        return match.group()
    return _total([_SPANISH[word] for word in words], lambda value, current: False)


def _german(match: re.Match) -> str:
    """The digits of a German number ("vierundzwanzig", "zweihundertfünf"), the text itself when none."""
    text = match.group().lower()
    if not text or text in _AMBIGUOUS or not (match.group("t") or "hundert" in text):
        return match.group()
    value = 0
    if "hundert" in text:
        value += 100 * _GERMAN_UNITS.get((match.group("h") or "ein").lower(), 1)
    if match.group("u"):
        value += _GERMAN_UNITS[match.group("u").lower()]
    if match.group("t"):
        value += (_GERMAN_TENS | _GERMAN_TEENS | _GERMAN_UNITS)[match.group("t").lower()]
    return str(value)


def _chinese_value(text: str) -> int:
    """The value of a Chinese numeral ("五十六" = 56, "十二" = 12, "三千零五" = 3005, "四二" = 42)."""
    if not any(c in _CHINESE_UNITS for c in text):
        return int("".join(str(_CHINESE_DIGITS[c]) for c in text))
    total, section, digit = 0, 0, 0
    for char in text:
        if char in _CHINESE_DIGITS:
            digit = _CHINESE_DIGITS[char]
        elif char == "万":
            total, section, digit = (total + section + digit) * 10_000, 0, 0
        else:
            section, digit = section + max(digit, 1) * _CHINESE_UNITS[char], 0
    return total + section + digit


def _chinese(text: str) -> str:
    """Chinese numerals, fractions ("三分之一" = 1/3), percents and the operators 乘 / 加 / 减 / 除以 / 等于."""
    text = _CHINESE_PERCENT_RE.sub(lambda m: f" {_chinese_value(m[1])}% ", text)
    text = _CHINESE_FRACTION_RE.sub(lambda m: f" {_chinese_value(m[2])}/{_chinese_value(m[1])} ", text)
    text = _CHINESE_RE.sub(lambda m: f" {_chinese_value(m.group())} ", text)
    for word, operator in _CHINESE_OPERATORS.items():
        text = text.replace(word, operator)
    return text


def _scaled(match: re.Match) -> str:
    """ "2 dozen" → 24, "a dozen" → 12, "3 thousand" → 3000."""
    number = float(match.group("n")) if match.group("n") else 1.0
    value = number * _SCALES[match.group("s").lower()]
    return str(int(value)) if value == int(value) else str(value)


def _digit_words(match: re.Match) -> str:
    """ "one, four, three" → 143 (digits spelled one by one)."""
    return "".join(str(_ENGLISH_DIGITS[w.lower()]) for w in re.findall(r"[a-zA-Z]+", match.group()))


def spelled_out(text: str) -> str:
    """``text`` with numbers in French, Spanish, German and Chinese words, spelled digit by digit, "negative …",
    "dozen" / "thousand" / "million" and fraction words of those languages written in digits ("trois quarts" →
    ``3/4``). English number words are left to :func:`agent_system.rewards.leak.normalized`, which calls this
    first; a word that is also common English ("once", "six" alone is read there) stays."""
    text = _DIGIT_WORDS_RE.sub(_digit_words, text)
    if re.search(r"[\u4e00-\u9fff]", text):
        text = _chinese(text)
    text = _FRENCH_RE.sub(_french, text)
    text = _SPANISH_RE.sub(_spanish, text)
    text = _GERMAN_RE.sub(_german, text)
    text = _english_scales(text)
    text = _FRACTION_WORD_RE.sub(lambda m: f"{m[1]}/{_DENOMINATORS[m[2].lower()]}", text)
    text = _FOLLOWED_RE.sub(lambda m: "".join(d for d in m.groups() if d), text)
    return _NEGATIVE_RE.sub("-", text)


def _english_scales(text: str) -> str:
    """ "two dozen", "a dozen", "forty thousand": the number word first in digits (only before a scale word)."""
    words = "|".join((*_ENGLISH_DIGITS, *_SMALL_WORDS, "nineteen", "twenty", "thirty", "forty", "fifty", "hundred"))
    text = re.sub(
        rf"\b({words})(?=\s+(?:dozen|thousand|million|billion)\b)",
        lambda m: str({**_ENGLISH_DIGITS, **_ENGLISH_SCALE_WORDS}.get(m[1].lower(), m[1])),
        text,
        flags=re.IGNORECASE,
    )
    return _SCALE_RE.sub(_scaled, text)


_ENGLISH_SCALE_WORDS = {w: i for i, w in enumerate(_SMALL_WORDS, start=10)} | {
    **{"nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "hundred": 100}
}
