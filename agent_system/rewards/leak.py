"""Feedback leaks: does a feedback (the HL's turn 2) state the problem's answer?

The HL must guide the solver without solving for it. A feedback *leaks* when one of its candidate answers is the
ground truth under the grader's own equivalence: each candidate is graded as the answer ``\\boxed{candidate}`` by
:class:`agent_system.rewards.RewardPool` (math-verify, in killable worker processes with the pool's wall-clock limit
per candidate, rules only: never the LLM judge). A feedback is hostile input: only its first and last
:data:`SCAN_CHARS` characters are read, at most :data:`MAX_CANDIDATES` candidates of at most
:data:`MAX_CANDIDATE_CHARS` characters each are graded, and box matching looks at most that far.

The text is first :func:`normalized` (numbers in words, other scripts' digits, ``½``, ``√``, ``°``, invisible
characters, markdown ticks and LaTeX colour / underline wrappers written as the grader reads them). Candidates
(nothing else counts):

1. the content of every complete ``\\boxed{...}`` / ``\\fbox{...}`` (a box states a final answer);
2. a statement of *the* answer: "the (final / correct / right) answer is X", "... should be X", "final answer: X",
   "Answer: X"; not when negated ("the answer is not 5", "isn't"), quoting the solver ("your answer is 5", "you
   said the answer is 5", "you wrote: the answer is 5"), conditional ("if the answer is 5"), a question, or
   followed by "which is wrong" (quoting and conditions are read after the last ``;``, dash or colon: "Re-express
   your fraction: the answer is 50%" states it);
3. the right side of an ``= X`` that ends the feedback (only closing punctuation after X);
4. the last number (or fraction ``3 / 4``) of the feedback when it ends the text, in a last sentence with no
   negation, no question mark, and not a reference ("step 2", "equation (3)").

Rules 5 to 8 read a sentence with no question mark clause by clause (clauses end at ``;``, a dash, "but", and a
comma or colon before a new subject), so a clause that rejects the solver's value does not hide the next one:

5. a claim about the asked quantity: its name in the problem's question ("the probability (of two heads) is X",
   "the total number ... equals X", "their mean is X"; "how many" adds number / count / total; a name of three
   words adds its initials, "the GCD"; "as a decimal" adds decimal), a correctness name
   ("the right value", "the correct sum", "the result", "the solution"; correct / right / ... only before value,
   answer, number, result, amount, figure, quantity, sum or total: "a right angle is 90" is no claim) or the
   problem's variable
   (``$y$``: "y is actually 7", "y = 7"), then a copula ("is", "=", "equals", "should be", "comes to", ":"); or the
   value first: "42 is the total", "72 is the answer" (not "12 is the number of months in a year");
6. a result verb: "you / we get / obtain / find / land on X", "you should / will have X", "we are left with X",
   "gives", "yields", "becomes", "works out to", "results in"; a conclusion whose value ends its clause: "and so
   10.", "so it's 2 500 m.";
7. a count of the noun a "how many" question counts: "there are 8 subsets", "has 9 diagonals", "= 9 divisors",
   "3 minutes is 180 seconds", not a per-unit count ("each box has 12 eggs");
8. after a clause that rejects a value (a negation, "no", "too large / small", "overshoots"), a correction: "it's
   24", "it should be 1/3", "not 9.5 but 12", "= 45", "the other root is 3"; anywhere, a value set against another
   value: "is 25% of the day, not 1/6".

A claim does not count when its clause is hypothetical ("if", "suppose", "were", ...; a leading condition reaches
past a comma, "If there were 4 sections, the probability would be 1/4", unless it is an instruction, "if you divide
by 3, the mean would be 9") or reports the solver ("your",
"you said / got / wrote"), when a negation governs it ("is not 7", "does not give 7"), when its value has no digit
or LaTeX, when the working continues from it ("12, then add 5"), or when a negation follows it other than a
correction ("42, not 40" counts, "5, which is wrong" does not).

Each candidate is graded in the forms :func:`answer_forms` gives (digit groups and split digits joined, percentages
as fractions, ``6e4`` as ``6\\times 10^{4}``): ``1 000``, ``1 2``, ``50%`` and ``37.5%`` state ``1000``, ``12``,
``1/2`` and ``3/8``.

A feedback also leaks by **value presence** (:func:`agent_system.rewards.value_presence.gold_leaked`, docs/LEAK.md):
a value it expresses anywhere (any notation, five languages, arithmetic on the page) equals the gold and nothing
accounts for it (the problem writes it, the feedback rejects it, a condition, a reference). It is decided in
Python before any candidate is graded.

Code (mbpp) and YAML-defined tasks: **not applicable**. Their HL writes about an execution result, and "the
answer" is a program that passes hidden tests; no equivalence grader exists for a program written inside prose, so
their feedbacks are not checked and not counted (the metrics cover math rows only; ``leak_checked`` says how many).

With a **leak judge** (``mlmt.reward.leak_judge``, :func:`agent_system.rewards.judge.judge_leak`; docs/LEAK.md, "The
leak judge") a checked feedback also leaks when the judge says YES; its NO clears none of the verdicts above, and
where it fails (error, timeout, another reply) they stand alone (:func:`judged_verdicts`).

Scored on labelled feedbacks of one's own: ``python -m agent_system.rewards.leak --score FILE.jsonl``
(:mod:`agent_system.rewards.leak_score`, docs/LEAK.md, "Auditing the check on your own feedbacks").
"""

from __future__ import annotations

import functools
import logging
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agent_system.rewards.judge import JudgeConfig, judge_leaks
from agent_system.rewards.number_words import spelled_out
from agent_system.rewards.scoring import task_kind
from agent_system.rewards.value_presence import gold_leaked

logger = logging.getLogger(__name__)

SCAN_CHARS = 8_000  # read this many characters from each end of a feedback
MAX_CANDIDATES = 8  # candidates per feedback (boxes first, then statements and claims, then the ending)
MAX_CANDIDATE_CHARS = 200
MAX_BOXES = 16  # boxes examined per feedback (the last ones)
CLAIM_CONTEXT_CHARS = 2 * MAX_CANDIDATE_CHARS  # read around a claim: before its subject, after its verb
MAX_PROBLEM_CHARS = 4_000  # the end of the problem text read for what it asks
TRANSITIONS = ("i2c", "i2i", "c2c", "c2i")  # turn-1 outcome → turn-3 outcome (i: incorrect, c: correct)

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_STATEMENT_RE = re.compile(
    r"(?:\b(?:the\s+)?(?:final|correct|right|true|actual|expected)\s+answer|\bthe\s+answer|^\W*answer)"
    r"\s*(?:is|should\s+be|would\s+be|will\s+be|must\s+be|equals|=|:)",
    re.IGNORECASE | re.MULTILINE,
)
_DIRECT_NEGATION_RE = re.compile(r"^(?:n't|\s*not\b|\s*never\b)", re.IGNORECASE)
_QUOTING_RE = re.compile(
    r"\b(?:your|you|you've|you're|if|whether|suppose|assume|assuming|claims?|claimed|thought|think)\W+"
    r"(?:\w+\W+){0,4}$",
    re.IGNORECASE,
)
_WRONG_RE = re.compile(r"\b(?:wrong|incorrect|not\s+correct|not\s+right|mistaken|a\s+mistake|an\s+error)\b", re.I)
_NEGATION_RE = re.compile(
    r"n't\b|\b(?:not|never|no|wrong|incorrect|mistake|mistaken|error|instead|rather|than)\b", re.IGNORECASE
)
_REFERENCE_RE = re.compile(
    r"\b(?:step|steps|line|lines|equation|eq|part|case|row|item|stage|paragraph|problem|question|turn)\W*$",
    re.IGNORECASE,
)
_SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+|\n+")
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?")  # a fraction "3 / 4" is one number
_TRAILER_RE = re.compile(r"^[\s$.!*)\]}]*$")  # what may follow an answer that ends the text
_DOLLAR_RE = re.compile(rf"^\$+((?:\\.|[^$\\]){{1,{MAX_CANDIDATE_CHARS}}})\$")
_PROSE_RE = re.compile(r"\s+[A-Za-z]{2,}\b")  # a value ends before a word
_QUESTION_RE = re.compile(
    r"\b(?:what|which)\s+(?:is|are|was|will\s+be)\s+(?P<np>[^?.;$]{1,80})"
    r"|\bwhat\s+(?P<kind>\w+)\s+(?:of|is|does|do)\b"
    r"|\b(?:find|compute|calculate|determine|evaluate|give|state)\s+(?P<np2>[^?.;$]{1,80})"
    r"|\bhow\s+(?:many|much)\s+(?P<counted>[^?.;$]{1,60})"
    r"|\b(?:as|in|into)\s+(?:an?\s+|the\s+)?(?P<form>decimal|fraction|percent|percentage|integer)\b",  # "as a decimal"
    re.IGNORECASE,
)
_NP_END_RE = re.compile(
    r"\b(?:of|that|when|if|in|for|such|whose|which|with|from|to|between|after|so|does|do|is|are|can|will|must|"
    r"should|could|would|were|was|did|has|have|there)\b",
    re.IGNORECASE,
)
_NOT_NAMES = {"the", "a", "an", "its", "their", "his", "her", "this", "that", "half", "twice", "all", "each", "exact"}
_SYNONYMS = {
    **{"mean": "average", "average": "mean", "probability": "chance", "number": "count", "count": "number"},
    **{"solution": "root", "gcd": "gcf", "gcf": "gcd", "hcf": "gcd"},
}
_VARIABLE_RE = re.compile(r"\$\s*([a-zA-Z])\s*\$")  # "solve for $y$"
_ADVERB = r"(?:\s+(?:actually|exactly|really|just|simply|precisely|indeed|then))?"
_COPULA = (
    r"(?:'s|\s+is(?!n't)|\s+equals|\s*=(?!=)|\s+should\s+be|\s+must\s+be|\s+would\s+be|\s+will\s+be|\s+is\s+equal\s+to"
    r"|\s+comes?\s+(?:out\s+)?to|\s+works?\s+out\s+(?:to|as)|\s+becomes|\s*:)" + _ADVERB + r"\s*"
)
_QUALIFIED = r"(?:\s+(?:of|for|in|on)\b[^=:;,]{1,60}?)?" + _COPULA  # "the probability of two heads is"
_CORRECTNESS_NAME = (  # "the right value", not "a right angle" ("the right probability": the asked name matches)
    r"(?:final|correct|right|true|actual|expected)\s+(?:value|answer|number|result|amount|figure|quantity|sum|total)"
    r"|result|solution"
)
_VERB_RE = re.compile(
    r"\b(?:(?:you|we)(?:'ll|\s+will|\s+should|\s+would|\s+now)?\s+(?:get|obtain|find|end\s+up\s+with|arrive\s+at|reach"
    r"|land\s+on|end\s+(?:up\s+)?(?:with|at))"
    r"|(?:you|we)(?:'ll|\s+will|\s+should)\s+have|(?:you|we)(?:'re|\s+are)\s+left\s+with"
    r"|gives?|giving|yields?|becomes?|comes?\s+(?:out\s+)?to|works?\s+out\s+(?:to|as)|results?\s+in|leads?\s+to)\b\s*",
    re.IGNORECASE,
)
_PRONOUN_RE = re.compile(r"\b(?:it|that|this)" + _COPULA, re.IGNORECASE)
_DEFINITE_RE = re.compile(r"\b(?:the|its|their)\s+(?:[a-z]+\s+){0,2}?[a-z]+" + _COPULA, re.I)  # "the other root is"
_CONCLUSION_RE = re.compile(  # "and so 10.", "so it's 2 500 m." (the value ends its clause)
    r"\b(?:so|hence|thus|therefore)(?:\s+(?:it's|it\s+is|that's|that\s+is|we\s+get|you\s+get))?\s+(?=[-\d$\\(])",
    re.IGNORECASE,
)
_COPULA_RE = re.compile(r"(?:\bis|\bare|\bequals)\s+|=\s*", re.IGNORECASE)
_VALUE_CORRECTION_RE = re.compile(  # "is 25% of the day, not 1/6": a value corrected against another value
    r"^(?:\s+[A-Za-z]+(?:/[A-Za-z]+)?){0,3}\s*,?\s*(?:not|rather\s+than|instead\s+of)\s+[-\d$\\(]", re.IGNORECASE
)
_VALUE_FIRST = r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?%?|\$[^$]{1,60}\$|\\\w+\{[^{}]{0,40}\}(?:\{[^{}]{0,40}\})?"
_LEADING_CONDITION_RE = re.compile(  # "If there were 4 sections, the probability would be 1/4" (not "if you divide")
    r"^\W*(?:if|suppose|supposing|assuming|imagine|were|had|unless)\b(?!\s+(?:you|we)\b)", re.IGNORECASE
)
_CLAUSE_RE = re.compile(
    r"\s*[;—–]\s*|\s+--\s+|\bbut\b|[,:]\s+(?=(?:so|and|which|then|the|it|its|it's|that|this|there|you|we|hence|thus|"
    r"therefore)\b)",
    re.IGNORECASE,
)
_HYPOTHETICAL_RE = re.compile(r"\b(?:if|suppose|supposing|assume|assuming|imagine|whether|unless|were)\b", re.I)
_REPORTED_RE = re.compile(
    r"\byour\b|\byou(?:'ve|\s+have|\s+had)?\s+(?:said|wrote|write|got|found|claimed|claim|concluded|conclude|computed|"
    r"calculated|gave|say|state|stated|thought|think|believe|assumed|put|answered|reported|obtained|arrived\s+at|"
    r"ended\s+up\s+with|came\s+up\s+with|had|used)\b",
    re.IGNORECASE,
)
_PER_UNIT_RE = re.compile(r"\b(?:each|every|per|one|a\s+single)\b", re.IGNORECASE)
_CONTINUED_RE = re.compile(
    r"^\W*(?:then|and\s+then|before|after|plus|minus|times|divided|multiplied|so\s+far|at\s+first|first|for\s+now|"
    r"per|each)\b",
    re.IGNORECASE,
)
_CORRECTION_TAIL_RE = re.compile(  # "42, not 40", "30 km/h, not a product"
    r"^(?:\s+[A-Za-z]+(?:/[A-Za-z]+)?){0,3}\s*(?:,|\(|—|–)?\s*(?:not|rather\s+than|instead\s+of)\b", re.I
)
_NEGATED_TAIL_RE = re.compile(r"n't\b|\b(?:not|never|wrong|incorrect|mistaken|a\s+mistake|an\s+error|off)\b", re.I)
_REJECTION_RE = re.compile(  # a clause that rejects a value: a negation, or "too large", "overshoots"
    _NEGATED_TAIL_RE.pattern
    + r"|^\W*no\b|\btoo\s+(?:large|big|high|small|low|much|many|few|little)\b|\b(?:over|under)shoots?\b",
    re.IGNORECASE,
)
_GROUPED_DIGITS_RE = re.compile(r"(?<=\d)(?:\s|\\[,;: !]|~|\u2009|\u202f|\u00a0)(?=\d{3}(?!\d))")
_PERCENT_RE = re.compile(r"^(.*\d)\s*\\?%$")
_NEGATED_BEFORE_RE = re.compile(r"(?:n't|\b(?:not|never|no|cannot))\s+(?:\w+\s+)?$", re.IGNORECASE)
_CLAUSE_MARK_RE = re.compile(r"\s*[;:—–]\s*|\s+--\s+")
_REPORT_VERB_RE = re.compile(
    r"\b(?:said|wrote|write|say|state|stated|claimed|claim|concluded|answered|reported)\W*$", re.I
)
_RELATIVE_RE = re.compile(r"[,:]\s+that\b", re.IGNORECASE)
_EQUALS_RE = re.compile(r"(?<![!<>=\\])=(?!=)\s*")
_BARE_VALUE_RE = re.compile(r"\s*(?:rather\s+)?[-\d$\\(]")
_SPACED_DIGITS_RE = re.compile(r"\d(?:(?:\s|\\[,;: !]|~)\d)+")  # "1 2", "4\\,2" for 12, 42
_SPACE_RE = re.compile(r"\s|\\[,;: !]|~")
_E_NOTATION_RE = re.compile(r"(-?\d+(?:\.\d+)?)[eE]([-+]?\d+)")
_WRAPPER_RE = re.compile(r"\\(?:underline|boldsymbol|bm|emph|(?:text)?color\{[a-zA-Z]{1,20}\})(?![a-zA-Z])")
_INVISIBLE_RE = re.compile("[\u00ad\u200b-\u200f\u2060\ufeff]")
_UNITS = "one two three four five six seven eight nine".split()
_SMALL = ["zero", *_UNITS, *"ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split()]
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
_WORD_VALUES = {**{w: i for i, w in enumerate(_SMALL)}, **{w: 20 + 10 * i for i, w in enumerate(_TENS)}}
_DENOMINATORS = {
    **{"half": 2, "halves": 2, "quarter": 4, "quarters": 4, "hundredth": 100, "hundredths": 100},
    **{w: i for i, w in enumerate("third fourth fifth sixth seventh eighth ninth tenth".split(), start=3)},
}
_NUMBER_WORD = rf"(?:{'|'.join(_TENS)})(?:[-\s](?:{'|'.join(_UNITS)}))?|{'|'.join(_SMALL)}"
_NUMBER_WORDS_RE = re.compile(  # "forty-two", "one hundred and five", "three eighths", "two and a half"
    rf"\b(?P<n>{_NUMBER_WORD})(?P<hundred>\s+hundred(?:(?:\s+and)?\s+(?P<rest>{_NUMBER_WORD}))?)?"
    rf"(?:\s+(?P<den>{'|'.join(w + 's?' for w in _DENOMINATORS)})|\s+and\s+a\s+(?P<plus>half|quarter))?\b",
    re.IGNORECASE,
)
_PERCENT_WORD_RE = re.compile(r"(\d)\s*per\s*cent\b", re.IGNORECASE)
_VULGAR = {
    "½": "1/2",
    "⅓": "1/3",
    "⅔": "2/3",
    "¼": "1/4",
    "¾": "3/4",
    "⅕": "1/5",
    "⅛": "1/8",
    "⅜": "3/8",
    "⅝": "5/8",
    "⅞": "7/8",
}
_VULGAR_RE = re.compile(rf"(?<!\d)(\d{{0,12}})([{''.join(_VULGAR)}])")  # bounded: "9" * 16_000 is linear
_ROOT_SIGN_RE = re.compile(r"√\s*(?:\((?P<group>[^()]{1,50})\)|(?P<plain>\d+(?:\.\d+)?|[a-zA-Z]))")
_OTHER_DIGIT_RE = re.compile(r"(?![0-9])\d")  # a decimal digit of another script ("４２", "٤٢")


def scanned_text(feedback: str) -> str:
    """The part of a feedback that is read: all of it, or its first and last :data:`SCAN_CHARS` characters."""
    if len(feedback) <= 2 * SCAN_CHARS:
        return feedback
    return feedback[:SCAN_CHARS] + "\n" + feedback[-SCAN_CHARS:]


def _word_number(match: re.Match) -> str:
    """The digits of a number in words (``_NUMBER_WORDS_RE``), or the words unchanged ("one" alone is a pronoun)."""
    words = match.group("n").lower().replace("-", " ").split()
    value = sum(_WORD_VALUES[w] for w in words)
    if match.group("hundred"):
        value = 100 * value + sum(
            _WORD_VALUES[w] for w in (match.group("rest") or "").lower().replace("-", " ").split()
        )
    if match.group("den"):
        den = match.group("den").lower()
        return f"{value}/{_DENOMINATORS.get(den, _DENOMINATORS.get(den[:-1]))}"
    if match.group("plus"):
        return f"({value}+1/{_DENOMINATORS[match.group('plus').lower()]})"
    return match.group() if words == ["one"] and not match.group("hundred") else str(value)


def normalized(text: str) -> str:
    """The text with numbers in words, other scripts' digits, vulgar fractions, root signs, ``°``, ``·``, the minus
    sign, "per cent" and markdown code ticks written as the grader reads them ("three eighths" → ``3/8``, "４２" →
    ``42``, "4½" → ``(4+1/2)``, "5√2" → ``5\\sqrt{2}``)."""
    text = spelled_out(_WRAPPER_RE.sub("", _INVISIBLE_RE.sub("", text)))
    text = _OTHER_DIGIT_RE.sub(lambda m: str(unicodedata.digit(m.group())), text)
    text = _NUMBER_WORDS_RE.sub(_word_number, text)
    text = _VULGAR_RE.sub(lambda m: f"({m[1]}+{_VULGAR[m[2]]})" if m[1] else _VULGAR[m[2]], text)
    text = _ROOT_SIGN_RE.sub(lambda m: "\\sqrt{" + (m["group"] or m["plain"]) + "}", text)
    text = _PERCENT_WORD_RE.sub(r"\1%", text)
    return text.replace("°", "^\\circ").replace("·", "\\cdot ").replace("\u2212", "-").replace("`", "")


def _boxes(text: str) -> list[str]:
    """Contents of the last :data:`MAX_BOXES` complete boxes, each matched within :data:`MAX_CANDIDATE_CHARS`."""
    found = []
    for match in list(_BOX_RE.finditer(text))[-MAX_BOXES:]:
        depth, start = 0, match.end() - 1
        for i in range(start, min(len(text), start + MAX_CANDIDATE_CHARS + 2)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                found.append(text[start + 1 : i])
                break
    return found


MAX_BARE_ANSWER_CHARS = 60  # an attempt without a box this short is its answer ("72", "(3,4)")


def attempt_answer(attempt: str | None) -> str:
    """The final answer of the attempt a feedback replies to: its last box, or the attempt itself when it is a bare
    answer (one line of at most :data:`MAX_BARE_ANSWER_CHARS` characters, as a labelled set may give it); "" else."""
    boxes = _boxes(attempt or "")
    if boxes:
        return boxes[-1]
    bare = (attempt or "").strip()
    return bare if len(bare) <= MAX_BARE_ANSWER_CHARS and "\n" not in bare else ""


def _value(rest: str) -> str:
    """The maths at the start of ``rest``: ``$...$``, ``\\(...\\)``, else the text before prose or punctuation
    outside brackets (a comma, semicolon or stop followed by a space, a line break, a word of two letters or more)."""
    rest = rest.strip().replace("**", "").lstrip()
    dollars = _DOLLAR_RE.match(rest)
    if dollars:
        return dollars.group(1).strip()
    if rest.startswith("\\(") and "\\)" in rest[:MAX_CANDIDATE_CHARS]:
        return rest[2 : rest.index("\\)")].strip()
    depth, end = 0, min(len(rest), MAX_CANDIDATE_CHARS + 1)
    for i, char in enumerate(rest[:end]):
        depth += (char in "([{") - (char in ")]}")
        if depth > 0:
            continue
        following = rest[i + 1 : i + 2]
        if char in "\n—–" or (char in ",;." and following in ("", " ", "\n")) or _PROSE_RE.match(rest, i):
            end = i
            break
    return rest[:end].strip().rstrip(".,;:!?").strip().strip("$").strip().strip("*_~").strip()


def _own_clause(before: str) -> str:
    """The end of ``before`` that is in the clause of what follows it: after its last ``;``, dash or colon, unless
    that mark follows a report of the solver ("You wrote: the answer is 5" quotes; "your fraction: the answer is"
    does not)."""
    cuts = list(_CLAUSE_MARK_RE.finditer(before))
    if not cuts or _REPORT_VERB_RE.search(before[: cuts[-1].start()]):
        return before
    return before[cuts[-1].end() :]


def _statements(sentence: str) -> list[str]:
    """Rule 2: the values "the answer is X" states in one sentence, unless negated, quoted or conditional."""
    values = []
    for match in _STATEMENT_RE.finditer(sentence):
        rest = sentence[match.end() :]
        before = _own_clause(sentence[max(0, match.start() - 60) : match.start()])
        if _DIRECT_NEGATION_RE.match(rest) or _QUOTING_RE.search(before) or sentence.rstrip().endswith("?"):
            continue
        value = _value(rest)
        after = rest.split(value, 1)[-1] if value else rest
        if value and not _WRONG_RE.search(after[:80]):
            values.append(value)
    return values


def _ending(sentence: str) -> list[str]:
    """Rules 3 and 4: an ``= X`` or a number that ends the last sentence of the feedback."""
    values = []
    equals = [m for m in re.finditer(r"(?<![!<>=\\])=(?!=)", sentence)]
    if equals:
        rest = sentence[equals[-1].end() :]
        value = _value(rest)
        if value and _TRAILER_RE.match(rest.split(value, 1)[-1]):
            values.append(value)
    numbers = list(_NUMBER_RE.finditer(sentence))
    if numbers:
        last = numbers[-1]
        clean = not _NEGATION_RE.search(sentence) and "?" not in sentence
        head = sentence[: last.start()]
        in_latex = head[-1:] in ("{", "^", "_", "/", ".", "\\")  # the 2 of \\frac{1}{2}, x^2, 1.5
        plain = not in_latex and head.count("(") <= head.count(")")  # nor the last member of a tuple
        reference = _REFERENCE_RE.search(head)
        if clean and plain and not reference and _TRAILER_RE.match(sentence[last.end() :]):
            values.append(last.group().rstrip(","))
    return values


def asked_names(problem: str) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """What a problem asks for: the names of the asked quantity ("probability", "total", "number"; with "how many",
    also number / count / total), the noun a "how many" question counts ("ways"), and its variables (``$y$``)."""
    problem = problem[-MAX_PROBLEM_CHARS:]
    names, counted = set(), set()
    for match in _QUESTION_RE.finditer(problem):
        if match.group("kind") or match.group("form"):
            names.add((match.group("kind") or match.group("form")).lower())
            continue
        phrase = match.group("np") or match.group("np2") or match.group("counted")
        words = [w for w in re.findall(r"[a-z]{3,}", _NP_END_RE.split(phrase, 1)[0].lower()) if w not in _NOT_NAMES]
        if match.group("counted"):
            counted.update(words[-1:])
            names.update(("number", "count", "total"))
        else:
            names.update(words)
            if len(words) >= 3:  # "greatest common divisor" is also "gcd"
                names.add("".join(word[0] for word in words))
    names.update(_SYNONYMS[name] for name in list(names) if name in _SYNONYMS)
    variables = {m.group(1) for m in _VARIABLE_RE.finditer(problem)}
    return frozenset(names), frozenset(counted), frozenset(variables)


@functools.lru_cache(maxsize=1024)
def _claim_patterns(problem: str) -> tuple[re.Pattern, re.Pattern, re.Pattern | None]:
    """The problem's subject pattern (a correctness name, an asked name or a variable, then a copula), its
    value-first pattern ("42 is the total", not "12 is the number of months in a year") and its count pattern
    ("there are 9 diagonals"), None without a "how many" noun."""
    names, counted, variables = asked_names(problem)
    alternatives = [_CORRECTNESS_NAME] + [rf"\b{name}\b" for name in sorted(names)]
    named = "|".join(alternatives + [r"answer\b"])
    alternatives += [rf"(?<![\w\\]){re.escape(v)}(?!\w)" for v in sorted(variables)]
    subject = re.compile(rf"(?:{'|'.join(alternatives)})" + _QUALIFIED, re.IGNORECASE)
    value_first = re.compile(
        rf"(?<![\w.])(?P<v>{_VALUE_FIRST})\s+(?:is|must\s+be|should\s+be)\s+(?:(?:indeed|actually|exactly)\s+)?the\s+"
        rf"(?:{named})(?!\s+(?:of|for|in|on)\b)",
        re.IGNORECASE,
    )
    if not counted:
        return subject, value_first, None
    nouns = "|".join(sorted(counted))
    count = re.compile(
        rf"(?:\bthere\s+(?:are|is|will\s+be|would\s+be)|\bha(?:s|ve)|\byou(?:'ll|\s+will|\s+should)?\s+get|\bgives?"
        rf"|\byields?|=|\bmakes?|\bobtain|\b(?:is|are|equals?))"
        rf"\s+(?:exactly\s+|only\s+)?(?P<n>\d[\d,]*(?:\.\d+)?)\s+(?:\w+\s+){{0,2}}?(?:{nouns})\b",
        re.IGNORECASE,
    )
    return subject, value_first, count


def _clauses(sentence: str) -> list[tuple[int, int]]:
    """The (start, end) spans of a sentence's clauses, cut at ``;``, dashes, "but" and a comma or colon before a new
    subject ("the", "it", "so", "you", ...)."""
    cuts = list(_CLAUSE_RE.finditer(sentence))
    starts, ends = [0] + [m.end() for m in cuts], [m.start() for m in cuts] + [len(sentence)]
    return [(start, end) for start, end in zip(starts, ends, strict=True) if start < end]


def _claimed(sentence: str, clause_start: int, start: int, end: int) -> str | None:
    """The value a claim states when its subject or verb spans ``sentence[start:end]``: None when the clause
    before it is hypothetical or reports the solver, a negation governs it, the value is no maths, the working
    continues from it ("then", "before"), or a negation follows it other than a correction ("42, not 40")."""
    before = sentence[max(clause_start, start - CLAIM_CONTEXT_CHARS) : start]
    opening = sentence[:clause_start].rsplit(";", 1)[-1][-CLAIM_CONTEXT_CHARS:]  # the sentence's clauses before it
    if (
        _LEADING_CONDITION_RE.match(opening)
        or _HYPOTHETICAL_RE.search(before)
        or _REPORTED_RE.search(before)
        or _NEGATED_BEFORE_RE.search(before)
    ):
        return None
    rest = sentence[end : end + CLAIM_CONTEXT_CHARS]
    if _DIRECT_NEGATION_RE.match(rest):
        return None
    value = _value(rest)
    if not value or not re.search(r"\d|\\", value):
        return None
    tail = rest.split(value, 1)[-1]
    if _CONTINUED_RE.match(tail):
        return None
    own = tail[: next((m.start() for m in _CLAUSE_RE.finditer(tail) if not _RELATIVE_RE.match(m.group())), None)]
    if _NEGATED_TAIL_RE.search(own) and not _CORRECTION_TAIL_RE.match(own):
        return None
    return value


def _ends_clause(rest: str) -> bool:
    """Whether the value at the start of ``rest`` ends it (only closing punctuation after it)."""
    value = _value(rest)
    return bool(value) and bool(_TRAILER_RE.match(rest.split(value, 1)[-1]))


def _corrects(rest: str) -> bool:
    """Whether the value at the start of ``rest`` is set against another value ("25% of the day, not 1/6")."""
    value = _value(rest)
    return bool(value) and bool(_VALUE_CORRECTION_RE.match(rest.split(value, 1)[-1]))


def _claims(sentence: str, problem: str) -> list[str]:
    """Rules 5 to 8: the values a sentence (with no question mark) claims for the asked quantity, clause by clause."""
    subject, value_first, count = _claim_patterns(problem)
    values, rejected = [], False
    for start, end in _clauses(sentence):
        clause = sentence[start:end]
        spans = [m.span() for m in subject.finditer(clause)] + [m.span() for m in _VERB_RE.finditer(clause)]
        spans += [m.span() for m in _CONCLUSION_RE.finditer(clause) if _ends_clause(clause[m.end() :])]
        spans += [(m.start("v"), m.start("v")) for m in value_first.finditer(clause)]
        spans += [m.span() for m in _COPULA_RE.finditer(clause) if _corrects(clause[m.end() :])]
        if rejected:  # a correction: "16 isn't right, it's 24", "not 9.5 but 12", "= 45 instead", "the root is 3"
            spans += [m.span() for m in _PRONOUN_RE.finditer(clause)] + [m.span() for m in _EQUALS_RE.finditer(clause)]
            spans += [m.span() for m in _DEFINITE_RE.finditer(clause)]
            spans += [(0, 0)] if _BARE_VALUE_RE.match(clause) else []
        if count is not None:
            spans += [
                (m.start(), m.start("n"))
                for m in count.finditer(clause)
                if not _PER_UNIT_RE.search(clause[: m.start()].rsplit(",", 1)[-1])  # "each box has 12 eggs"
            ]
        for span_start, span_end in spans:
            value = _claimed(sentence, start, start + span_start, start + span_end)
            if value is not None:
                values.append(value)
        rejected = rejected or bool(_REJECTION_RE.search(clause))
    return values


def candidate_answers(feedback: str, problem: str = "") -> list[str]:
    """The candidate answers of a feedback (the module docstring's rules 1 to 8; ``problem`` names the asked quantity
    for rules 5 and 7), distinct, at most :data:`MAX_CANDIDATES`, each with balanced braces and at most
    :data:`MAX_CANDIDATE_CHARS` characters."""
    text = normalized(scanned_text(feedback or ""))
    sentences = [s for s in _SENTENCE_END_RE.split(text) if s.strip()]
    found = _boxes(text)
    for sentence in sentences:
        found += _statements(sentence)
        if "?" not in sentence:
            found += _claims(sentence, problem)
    if sentences:
        found += _ending(sentences[-1])
    distinct: list[str] = []
    for value in (v.strip() for v in found):
        balanced = value.count("{") == value.count("}")
        if value and balanced and len(value) <= MAX_CANDIDATE_CHARS and value not in distinct:
            distinct.append(value)
    return distinct[:MAX_CANDIDATES]


def answer_forms(candidate: str, gold: str) -> list[str]:
    """The forms of a candidate that are graded: digit groups joined (``1 000``, ``1\\,000`` → ``1000``; single
    digits too, ``1 2`` → ``12``), e-notation as a power of ten (``6e4`` → ``6\\times 10^{4}``), and a
    percentage as a fraction (``50%`` → ``(50)/100``) or, against a gold in percent, a number as a percentage
    (``0.25`` → ``(0.25)\\cdot 100``): the grader reads ``50\\%`` as 50."""
    value = _GROUPED_DIGITS_RE.sub("", candidate)
    value = _SPACE_RE.sub("", value) if _SPACED_DIGITS_RE.fullmatch(value) else value
    value = _E_NOTATION_RE.sub(r"\1\\times 10^{\2}", value) if _E_NOTATION_RE.fullmatch(value) else value
    percent = _PERCENT_RE.match(value)
    if percent:
        return [value, f"({percent.group(1)})/100"]
    return [value, f"({value})\\cdot 100"] if "%" in gold else [value]


def applies_to(data_source: str) -> bool:
    """Whether the leak check applies to a data source's feedbacks (math tasks; not code or YAML tasks)."""
    return task_kind(data_source) == "math"


def check_feedbacks(
    pool, feedbacks: Sequence[tuple[str, dict]], attempts: Sequence[str | None] | None = None
) -> np.ndarray:
    """Whether each feedback states its problem's answer, graded in one ``pool.score`` call.

    Args:
        pool: A :class:`agent_system.rewards.RewardPool` (or anything with its ``score``).
        feedbacks: ``(feedback text, dataset row)`` pairs; the row gives ``data_source`` and
            ``reward_model.ground_truth`` (verl parquet schema).
        attempts: The text of the attempt each feedback replies to (None: not known); value presence applies an
            operation the feedback names to its last boxed answer ("halve what you got").

    Returns:
        (N,) float: 1.0 leaks, 0.0 does not, NaN not applicable (code and YAML tasks). A candidate whose grading
        timed out or crashed counts as not stating the answer (a warning gives the count).
    """
    result = np.full(len(feedbacks), np.nan)
    items, owners = [], []
    for index, (text, row) in enumerate(feedbacks):
        if not applies_to(row["data_source"]):
            continue
        result[index] = 0.0
        gold = str(row["reward_model"]["ground_truth"])
        problem = str((row.get("extra_info") or {}).get("question") or "")
        answer = attempt_answer(attempts[index]) if attempts is not None else ""
        feedback = normalized(scanned_text(text or ""))
        if gold_leaked(feedback, normalized(problem[-MAX_PROBLEM_CHARS:]), gold, normalized(answer)):
            result[index] = 1.0
            continue
        for form in (f for c in candidate_answers(text, problem) for f in answer_forms(c, gold)):
            owners.append(index)
            items.append(
                {
                    "data_source": row["data_source"],
                    "solution_str": "\\boxed{" + form + "}",
                    "ground_truth": gold,
                    "extra_info": {},
                    "rules_only": True,  # the pool never asks the LLM judge about a leak candidate
                }
            )
    if not items:
        return result
    graded = pool.score(items)
    failed = sum(r.get("error") in ("timeout", "worker crashed") for r in graded)
    if failed:
        logger.warning(
            "leak check: %d of %d candidate answers could not be graded (counted as no leak)", failed, len(items)
        )
    for owner, graded_item in zip(owners, graded, strict=True):
        if graded_item["acc"]:
            result[owner] = 1.0
    return result


@dataclass(frozen=True)
class LeakVerdicts:
    """Each feedback's leak verdict and what decided it; every array has the same shape.

    Attributes:
        leak: 1.0 leaks, 0.0 does not, NaN not applicable: the verdict the penalty and ``leak_rate`` read.
        rules: The rules' and value presence's verdict (:func:`check_feedbacks`), what ``leak`` falls back to.
        judge: The leak judge's verdict (1.0 / 0.0, NaN where it gave none or was not asked), or None without a
            judge; ``leak`` is its 1.0 or the rules' verdict.
        reader_gain: The reader test's gain in nats (:mod:`agent_system.rewards.leak_reader`), NaN where not read,
            or None without the reader.
        reader: The reader's verdict (1.0 where the gain reached the threshold, 0.0 below, NaN not read), or None.
    """

    leak: np.ndarray
    rules: np.ndarray
    judge: np.ndarray | None = None
    reader_gain: np.ndarray | None = None
    reader: np.ndarray | None = None

    def __post_init__(self) -> None:
        for name in ("rules", "judge", "reader_gain", "reader"):
            value = getattr(self, name)
            if value is not None and value.shape != self.leak.shape:
                raise ValueError(f"LeakVerdicts.{name} has shape {value.shape}, not leak's {self.leak.shape}")

    @property
    def judged(self) -> np.ndarray | None:
        """Where the leak judge answered (bool), or None without a judge."""
        return None if self.judge is None else ~np.isnan(self.judge)

    def reshape(self, shape: tuple[int, ...]) -> LeakVerdicts:
        """The same verdicts with every array in ``shape``."""
        arrays = {name: getattr(self, name) for name in ("leak", "rules", "judge", "reader_gain", "reader")}
        return LeakVerdicts(**{name: None if a is None else a.reshape(shape) for name, a in arrays.items()})


def judged_verdicts(
    feedbacks: Sequence[tuple[str, dict]], rules: np.ndarray, judge: JudgeConfig | None
) -> LeakVerdicts:
    """Each checked feedback (``rules`` not NaN) leaks when the rules say so or the leak judge does: the judge adds
    leaks and never clears one, since the feedback it reads is the policy's text and may be written to talk it out of
    a YES; the rules' verdict alone where it gives none.

    Args:
        feedbacks: ``(feedback text, dataset row)`` pairs, as :func:`check_feedbacks` reads them.
        rules: (N,) :func:`check_feedbacks`'s verdicts on them.
        judge: The leak judge, or None (the rules' verdicts as they are).
    """
    if judge is None:
        return LeakVerdicts(leak=rules, rules=rules)
    checked = np.flatnonzero(~np.isnan(rules))
    questions = []
    for index in checked:
        text, row = feedbacks[index]
        problem = str((row.get("extra_info") or {}).get("question") or "")[-MAX_PROBLEM_CHARS:]
        questions.append((problem, str(row["reward_model"]["ground_truth"]), scanned_text(text or "")))
    said = np.full(rules.shape, np.nan)
    for index, verdict in zip(checked, judge_leaks(questions, judge), strict=True):
        if verdict is not None:
            said[index] = float(verdict)
    fallbacks = len(checked) - int((~np.isnan(said)).sum())
    if fallbacks:
        logger.warning(
            "leak judge %s at %s gave no verdict on %d of %d feedbacks: the rules' verdict stands for them",
            judge.model,
            judge.base_url,
            fallbacks,
            len(checked),
        )
    return LeakVerdicts(leak=np.where(np.isnan(said), rules, np.maximum(rules, said)), rules=rules, judge=said)


def with_reader(verdicts: LeakVerdicts, gains: np.ndarray, reader: np.ndarray) -> LeakVerdicts:
    """``verdicts`` with the reader test's joined in: a feedback leaks when it did before or the reader says so.

    Args:
        verdicts: The rules' (and the judge's) verdicts.
        gains: The reader's gains in nats (same shape), NaN where not read.
        reader: Its verdicts (:func:`agent_system.rewards.leak_reader.reader_verdicts`), NaN where not read.
    """
    joined = np.where(np.isnan(reader), verdicts.leak, np.fmax(verdicts.leak, reader))
    return LeakVerdicts(joined, verdicts.rules, verdicts.judge, np.asarray(gains, dtype=np.float64), reader)


def labelled_pairs(items: Sequence[dict]) -> list[tuple[str, dict]]:
    """``(feedback, math row)`` of labelled feedbacks ``{"problem", "ground_truth", "feedback"}`` (the problem given
    as the dataset row gives it, ``extra_info.question``): what :func:`check_feedbacks` and :func:`judged_verdicts`
    read."""
    return [
        (
            i["feedback"],
            {
                "data_source": "math",
                "reward_model": {"ground_truth": i["ground_truth"]},
                "extra_info": {"question": i["problem"]},
            },
        )
        for i in items
    ]


def check_labelled(pool, items: Sequence[dict]) -> np.ndarray:
    """:func:`check_feedbacks` on labelled feedbacks (:func:`labelled_pairs`), with the ``attempt`` each replies to
    where it is given. The held-out tests and ``python -m agent_system.rewards.leak --score``
    (:mod:`agent_system.rewards.leak_score`) score with it."""
    return check_feedbacks(pool, labelled_pairs(items), [i.get("attempt") for i in items])


def leak_scores(problems: Sequence[dict], episodes, pool, judge: JudgeConfig | None = None) -> LeakVerdicts | None:
    """The (B, n, m) verdicts of a batch whose refinements follow HL feedbacks, or None (no feedback turn).

    Args:
        problems: The B dataset rows.
        episodes: Their :class:`agent_system.multi_turn_rollout.episode.Episode` s (n attempts, m refinements each).
        pool: The reward pool the batch is graded with.
        judge: The leak judge (``mlmt.reward.leak_judge``), or None.
    """
    shape = (len(episodes), len(episodes[0].attempts), len(episodes[0].attempts[0].refinements))
    pairs, attempts = [], []
    for row, episode in zip(problems, episodes, strict=True):
        for attempt in episode.attempts:
            for refinement in attempt.refinements:
                pairs.append((refinement.feedback.text if refinement.feedback is not None else None, row))
                attempts.append(attempt.attempt.text)
    if not pairs or any(text is None for text, _ in pairs):
        return None
    return judged_verdicts(pairs, check_feedbacks(pool, pairs, attempts), judge).reshape(shape)


def transition_names(first: np.ndarray, final: np.ndarray) -> np.ndarray:
    """``i2c`` / ``i2i`` / ``c2c`` / ``c2i`` per pair from boolean turn-1 and final correctness."""
    first, final = np.asarray(first, dtype=bool), np.asarray(final, dtype=bool)
    return np.where(first, np.where(final, "c2c", "c2i"), np.where(final, "i2c", "i2i"))


def leak_rates(leak: np.ndarray, first: np.ndarray, final: np.ndarray) -> dict[str, float]:
    """``leak_rate`` (share of checked feedbacks that leak), ``leak_checked`` (their number) and ``leak_rate_<t>``
    among the feedbacks of each turn transition ``t`` (absent when no checked feedback had that transition).

    Args:
        leak: Per feedback, 1.0 / 0.0 / NaN (not applicable), any shape.
        first: Turn-1 correctness of the attempt each feedback answers (same shape).
        final: Correctness of the refinement that followed the feedback (same shape).
    """
    leak = np.asarray(leak, dtype=np.float64).ravel()
    checked = ~np.isnan(leak)
    metrics = {"leak_checked": float(checked.sum())}
    if not checked.any():
        return metrics
    metrics["leak_rate"] = float(leak[checked].mean())
    names = transition_names(np.ravel(first), np.ravel(final))
    for name in TRANSITIONS:
        rows = checked & (names == name)
        if rows.any():
            metrics[f"leak_rate_{name}"] = float(leak[rows].mean())
    return metrics


def check_metrics(verdicts: LeakVerdicts) -> dict[str, float]:
    """What decided the verdicts beyond the rules: :func:`judge_metrics`, and with the reader test
    ``leak_reader_rate`` (share of the feedbacks it read whose gain reached the threshold), ``leak_reader_gain_mean``
    (their mean gain in nats) and ``leak_reader_read`` (their number)."""
    metrics = judge_metrics(verdicts)
    if verdicts.reader is not None:
        read = ~np.isnan(np.ravel(verdicts.reader))
        metrics["leak_reader_read"] = float(read.sum())
        if read.any():
            metrics["leak_reader_rate"] = float(np.ravel(verdicts.reader)[read].mean())
            metrics["leak_reader_gain_mean"] = float(np.ravel(verdicts.reader_gain)[read].mean())
    return metrics


def judge_metrics(verdicts: LeakVerdicts) -> dict[str, float]:
    """With a leak judge: ``leak_judge_decided`` (feedbacks it answered on), ``leak_judge_fallbacks`` (checked
    feedbacks it gave no verdict on), ``leak_judge_added`` (leaks it found that the rules did not) /
    ``leak_judge_disputed`` (rule leaks it called clean, which stay leaks) and ``leak_rate_rules`` (the rules' rate
    on the same feedbacks); {} without a judge or a checked feedback."""
    if verdicts.judge is None:
        return {}
    rules, said = np.ravel(verdicts.rules), np.ravel(verdicts.judge)
    judged, checked = ~np.isnan(said), ~np.isnan(rules)
    if not checked.any():
        return {}
    return {
        "leak_judge_decided": float(judged.sum()),
        "leak_judge_fallbacks": float((checked & ~judged).sum()),
        "leak_judge_added": float(((said == 1.0) & (rules == 0.0)).sum()),
        "leak_judge_disputed": float(((said == 0.0) & (rules == 1.0)).sum()),
        "leak_rate_rules": float(rules[checked].mean()),
    }


def record_leak_metrics(records: Sequence[dict], prefix: str) -> dict[str, float]:
    """:func:`leak_rates` over trajectory records (``agent_system.trainer.metrics.trajectory_records``: ``leak``,
    ``R1``, ``R3``), with ``prefix/`` on every name; {} when no record was checked. Validation pools its batches
    with it: a rate among one transition's feedbacks is not the mean of the batches' rates."""
    checked = [r for r in records if "leak" in r and "R3" in r]
    if not checked:
        return {}
    leaks = np.array([float(r["leak"]) for r in checked])
    first = np.array([r["R1"] > 0.5 for r in checked])
    final = np.array([r["R3"] > 0.5 for r in checked])
    return {f"{prefix}/{k}": v for k, v in leak_rates(leaks, first, final).items()}


def hl_leak_penalty(
    scores: dict[str, np.ndarray], rows: dict[str, list], penalty: float, hl_extra: np.ndarray | None
) -> np.ndarray | None:
    """The HL's extra score per row with ``mlmt.reward.leak_penalty``: ``hl_extra − penalty`` on the rows whose
    feedback leaks, unchanged elsewhere (``hl_extra`` as is when the penalty is 0 or nothing was checked).

    Args:
        scores: The batch's scores with ``leak`` (B, n, m).
        rows: The HL rows' ``problem``, ``attempt`` and ``feedback`` indices.
        penalty: ``mlmt.reward.leak_penalty`` (>= 0).
        hl_extra: (N,) extra HL scores so far (the confidence term), or None.
    """
    if penalty <= 0 or "leak" not in scores:
        return hl_extra
    leak = scores["leak"][np.asarray(rows["problem"]), np.asarray(rows["attempt"]), np.asarray(rows["feedback"])]
    terms = -penalty * np.nan_to_num(leak, nan=0.0)
    return terms if hl_extra is None else hl_extra + terms


def main(argv: Sequence[str] | None = None, pool=None) -> int:
    """``python -m agent_system.rewards.leak --score FILE.jsonl``: this check on labelled feedbacks
    (:mod:`agent_system.rewards.leak_score`, docs/LEAK.md), given this module to check and join with (the audit does
    not import the check it audits); returns the exit status."""
    import sys

    from agent_system.rewards.leak_score import main as score

    return score(argv, pool, sys.modules[__name__])


if __name__ == "__main__":
    import sys

    sys.exit(main())
