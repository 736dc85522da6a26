"""Value presence (agent_system.rewards.value_presence, docs/LEAK.md): a feedback that expresses the gold's value
anywhere, in any notation, language or arithmetic on the page, leaks unless the value is accounted for (in the
problem, rejected, in a condition, a reference). Pure Python: no pool, no process."""

import time

import pytest

from agent_system.rewards import leak, value_presence, values_in_text

TOM = "Tom buys 3 books at 8 dollars each. How much does he pay in total, in dollars?"
TOM_LEAKS = [  # issue 44: 16 plain leaks written for one problem (the first five were missed before)
    "Tom pays 24 dollars.",
    "Hint: it's two dozen dollars.",
    "The cost is twenty-four dollars.",
    "Recheck: 3*8=24. Put that in the box.",
    "I get 24 for the total.",
    "The answer is 24.",
    "\\boxed{24}",
    "Final answer: 24",
    "The total is 24 dollars.",
    "3 × 8 = 24",
    "You should get 24.",
    "It's 24, not 11.",
    "So the total cost is $24.",
    "Multiply to get 24.",
    "The correct total is 24.",
    "He pays $24 in all.",
]
TOM_NEAR_MISSES = [  # the gold as a reference, values of the problem, the solver's wrong value rejected
    "Re-check step 24 of your work.",
    "Look again at line 24: 3 books cost 8 dollars each.",
    "Your 11 is wrong: you added 3 and 8.",
    "It is not 24 dollars; recount.",  # a (wrong) rejection of the gold gives nothing away
    "He buys 3 books and each costs 8 dollars; what operation joins them?",
]


def _leaks(feedback, gold, problem=""):
    return value_presence.gold_leaked(leak.normalized(feedback), leak.normalized(problem), gold)


@pytest.mark.parametrize("feedback", TOM_LEAKS)
def test_the_issues_plain_leaks_for_one_problem(feedback):
    assert _leaks(feedback, "24", TOM)


@pytest.mark.parametrize("feedback", TOM_NEAR_MISSES)
def test_references_problem_values_and_rejected_values_are_accounted_for(feedback):
    assert not _leaks(feedback, "24", TOM)


MISSED_KINDS = [  # (feedback, gold, problem): the kinds issue 44 lists as missed by the phrase rules
    ("It reduces to three quarters.", "\\frac{3}{4}", ""),
    ("So the chance is 75%.", "\\frac{3}{4}", ""),
    ("So the count is $2^{10}$.", "1024", "A set has 10 elements. How many subsets does it have?"),
    ("This is simply 6!, not 6 squared.", "720", "In how many ways can 6 books be ordered?"),
    ("Halving gives 2 1/2 cups.", "\\frac{5}{2}", ""),
    ("It is $2\\frac{1}{2}$ cups.", "\\frac{5}{2}", ""),
    ("So it is ${2 \\over 6}$, count again.", "\\frac{1}{3}", ""),
    ("That is $\\dfrac{125}{1000}$.", "0.125", ""),
    ("Plug x = 6 in and check that it gives 25.", "6", "Solve $3x + 7 = 25$."),
    ("You took off 15 dollars (which would leave 34).", "34", "A $40 shirt is 15% off. What is the price?"),
    ("| day | pages |\n|---|---|\n| 7 | 84 |", "84", "12 pages a day. How many in a week?"),
    ("```\n>>> sum(range(1, 21))\n210\n```", "210", "Sum the integers from 1 to 20."),
    ("Wouldn't 8 make more sense?", "8", ""),
    ("isn't there a bigger one, like twelve?", "12", "What is the GCD of 48 and 36?"),
    ("Il y a vingt-quatre œufs.", "24", ""),
    ("Tu trouves quatre-vingt-dix.", "90", ""),
    ("El resultado es nueve.", "9", ""),
    ("Son treinta y dos.", "32", ""),
    ("Die Geschwindigkeit ist sechzig km/h.", "60", ""),
    ("Es sind vierundzwanzig.", "24", ""),
    ("七乘八等于五十六。", "56", ""),
    ("答案是三分之一。", "\\frac{1}{3}", ""),
    ("The digits should read one, four, three.", "143", ""),
    ("It is a 2 followed by a 4.", "24", ""),
    ("Undo it: add 6 back to your 41.", "47", "She gave away 6 and has 41 left. How many at first?"),
    ("Write it as n + 19 = 30 and solve.", "11", "A number increased by 19 is 30."),
    ("Set it up as n = 30 - 19.", "11", "A number increased by 19 is 30."),
    ("Recheck: 3*8. Put that in the box.", "24", TOM),
    ("Seven times eight, then stop.", "56", ""),
    ("Take half of 5.", "\\frac{5}{2}", "5 cups for 2 cakes: how many for one?"),
    ("x is four and y is three.", "(4,3)", "Solve $x + y = 7$, $x - y = 1$."),
    ("It runs from negative two up to four.", "(-2,4)", "Solve $|x - 1| < 3$."),
    ("Look at the third option instead.", "\\text{(C)}", "Which is prime? (A) 21 (B) 27 (C) 29 (D) 33"),
    ("So B, C and D are out.", "\\text{(A)}", "Which is a square? (A) 64 (B) 50 (C) 72 (D) 90"),
    ("Choose option C.", "C", "Which is prime? (A) 21 (B) 27 (C) 29 (D) 33"),
    ("150 minutes is 2 h 30 min.", "\\frac{5}{2}", "A movie lasts 150 minutes. How many hours is that?"),
    ("Three days after Friday is Monday, not Sunday.", "\\text{Monday}", "Today is Friday. What day in 10 days?"),
    ("Another solver got 12 by listing multiples.", "12", "What is the LCM of 4 and 6?"),
    ("The area is $9\\pi$.", "9\\pi", "A circle has radius 3. What is its area?"),
    ("We are left with 5√2.", "5\\sqrt{2}", ""),
    ("One fourth of the day: 25\\%.", "\\frac{1}{4}", ""),
    ("3 \\times 10^8 km", "300000000", ""),
    ("It is 2,500 m.", "2500", ""),
]


@pytest.mark.parametrize(("feedback", "gold", "problem"), MISSED_KINDS)
def test_every_missed_kind_of_the_issue_is_read(feedback, gold, problem):
    assert _leaks(feedback, gold, problem)


NEAR_MISSES = [  # (feedback, gold, problem): the gold's value or words present but accounted for, or not the gold
    ("Step 4 of your work divides too early.", "4", "Solve $2x + 3 = 11$."),
    ("In equation (9) you dropped the +1.", "9", ""),
    ("Check each one:\n1. Is 4 a square?\n2. Is 9?\n3. Is 16?", "3", "How many of 4, 9, 16, 20 are squares?"),
    ("As in question 2, test each number.", "2", ""),
    ("You stopped at the sum of 4, 8, 10 and 18.", "10", "What is the mean of 4, 8, 10 and 18?"),
    ("Do the division first: 24 ÷ 2 comes before.", "12", "What is $6 \\times 4 - 24 \\div 2$?"),
    ("Vingt-quatre divisé par six : combien de fois ?", "4", "What is 24 divided by 6?"),
    ("It is not 90: 15% is a small part of 60.", "90", ""),
    ("Your pair (3, 4) has the coordinates swapped.", "(4,3)", ""),
    ("You found 1/2, which is wrong.", "\\frac{1}{2}", ""),
    ("Neither 240 nor 2.4 is what you want.", "24", ""),
    ("If the die had 8 faces the count would change.", "8", ""),
    ("Would the probability be 2/5 if there were 10 candies?", "\\frac{2}{5}", ""),
    ("Rule out (A) first, then test the others.", "\\text{(A)}", "Which? (A) 21 (B) 27 (C) 29 (D) 33"),
    ("No need to test every number up to 91.", "\\text{No}", "Is 91 prime? Answer Yes or No."),
    ("Count forward from Friday: Saturday is the first day.", "\\text{Monday}", "Today is Friday."),
    ("5! = 120 counts five books.", "720", ""),
    ("Twenty-four hours is a day; vingt-quatre too.", "4", ""),  # a compound is one number, not its last word
    ("The 24th term is what you want.", "24", ""),
]


@pytest.mark.parametrize(("feedback", "gold", "problem"), NEAR_MISSES)
def test_near_misses_are_not_flagged(feedback, gold, problem):
    assert not _leaks(feedback, gold, problem)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("10^10^10", None),
        ("100000!", None),
        ("(" * 50 + "1" + ")" * 50, None),
        ("2^{-2}", "1/4"),
        ("\\sqrt{49}", "7"),
        ("5 choose 2", "10"),
        ("7!/5!", "42"),
        ("1/0", None),
        ("9\\pi", None),  # a gold of 9π is not 9
    ],
)
def test_arithmetic_is_exact_and_bounded(text, value):
    result = values_in_text.exact_value(values_in_text.plain(text))
    assert (None if result is None else str(result)) == value


OTHER_NOTATIONS = [  # (feedback, gold, problem): the gold in another notation (issue 44, held-out 5's missed kinds)
    ("The polygon has XXXV diagonals.", "35", ""),
    ("Written in base 2 the sum is 101101.", "45", ""),
    ("Its hexadecimal form is 0x2A.", "42", ""),
    ("As a base-8 numeral it reads 52_8.", "42", ""),
    ("Read your total backwards and you have it: 24.", "42", ""),
    ("The count lies strictly above 40 and below 42.", "41", ""),
    ("The true sum is one more than 99.", "100", ""),
    ("The chance is roughly 0.333.", "\\frac{1}{3}", ""),
    ("It comes to about 14.29%.", "\\frac{1}{7}", ""),
    ("The area is close to 50.27 square units.", "16\\pi", ""),
    ("The hypotenuse is the square root of 18.", "3\\sqrt{2}", ""),
    ("The hypotenuse is $\\sqrt{18}$.", "3\\sqrt{2}", ""),
    ("The hypotenuse is the square root of 18.", "3\\sqrt{2}", "One corner is at 0 and the legs are 3 long."),
    ("The ratio is near 1.618.", "\\frac{1+\\sqrt{5}}{2}", ""),
    ("Pick (C).", "7", "Which is prime? (A) 4 (B) 6 (C) 7 (D) 9"),
    ("The winner's name begins with the letter D.", "Dana", "Ana, Ben and Dana race. Ana beats Ben. Who wins?"),
    ("The winner is Dana.", "Dana", "Who wins the race?"),
]
OTHER_NOTATION_NEAR_MISSES = [  # short decimals, other options, ambiguous initials, words that are golds
    ("A third is about 0.3, so check your 0.5.", "\\frac{1}{3}", ""),
    ("Option (B) is wrong; look again.", "7", "Which is prime? (A) 4 (B) 6 (C) 7 (D) 9"),
    ("The winner's name begins with A.", "Dana", "Ana, Ben and Dana race. Ana beats Ben. Who wins?"),
    ("No matter which case you take, check each divisor.", "No", "Is 91 prime?"),
    ("Two things to check: the sign and the divisor.", "2", "Solve 3x = 6."),
    ("The square root of 16 is not the diagonal.", "3\\sqrt{2}", ""),
    ("Step XII of the proof is fine, see equation (42).", "42", ""),
    ("In base 16, add the digits of the two numbers first.", "2781", ""),  # "add" is no hexadecimal numeral
    ("Compute the term $a_{12}$ from the recurrence.", "10", ""),  # a sequence's term, not "a" in base 12
    ("That is a Type II error; recount the cases.", "2", ""),  # a label, not a numeral
]


@pytest.mark.parametrize(("feedback", "gold", "problem"), OTHER_NOTATIONS)
def test_the_gold_in_other_notations_is_read(feedback, gold, problem):
    assert _leaks(feedback, gold, problem)


@pytest.mark.parametrize(("feedback", "gold", "problem"), OTHER_NOTATION_NEAR_MISSES)
def test_near_misses_of_the_other_notations_are_not_flagged(feedback, gold, problem):
    assert not _leaks(feedback, gold, problem)


@pytest.mark.parametrize(
    ("numeral", "value"), [("LIV", 54), ("MCMXCIV", 1994), ("XL", 40), ("IIII", None), ("VX", None), ("IC", None)]
)
def test_roman_numerals_only_in_their_standard_form(numeral, value):
    read = {v.value for v in values_in_text.values(numeral)}
    assert read == ({value} if value else set())


def test_a_gold_is_evaluated_once_and_words_have_no_number():
    assert value_presence.gold_number("5\\sqrt{2}") == pytest.approx(7.0710678118654755)
    assert value_presence.gold_number("\\text{Carol}") is None and value_presence.gold_number("(1, 2)") is None


@pytest.mark.parametrize(
    "text",
    [
        "9" * 16_000,
        "LIV " * 4_000,
        "in binary " + "1 0 11 " * 2_500,
        "written backwards " + "12 " * 5_000,
        "more than 3 and fewer than 5 " * 600,
        "sqrt(50) 2 square root of 8 " * 600,
        "16.67% 0.333 " * 1_300,
        "starts with C " * 1_200,
        "0x" + "F" * 16_000,
        "10^" * 5_000 + "10",
        "(" * 8_000 + ")" * 8_000,
        "\\frac{" * 3_000 + "1" + "}{2}" * 3_000,
        "999999! " * 2_000,
        "add 6 back to your 41 " * 700,
        "vingt-quatre " * 1_200 + "五十六" * 1_000,
        "1 2 3 4 5 6 7 8 9 " * 900,
        "x + 1 = 2 = 3 = " * 1_000,
    ],
)
@pytest.mark.parametrize("gold", ["24", "(4, 3)", "\\text{(B)}", "5\\sqrt{2}"])
def test_a_hostile_feedback_is_checked_in_bounded_time_and_never_raises(text, gold):
    """One feedback's check (normalizing included) per gold kind: each takes under 0.4 s of CPU; the bound is on this
    process's CPU time, which other processes on the machine do not inflate (a quadratic pattern took 6 s)."""
    value_presence.gold_number(gold)  # the gold's value is read once per gold (cached), the feedback's every time
    started = time.process_time()
    value_presence.gold_leaked(leak.normalized(leak.scanned_text(text)), "", gold)
    assert time.process_time() - started < 2.0


def _leaks_after(feedback, gold, attempt, problem=""):
    """Value presence on a feedback that replies to an attempt whose final answer is ``attempt``."""
    return value_presence.gold_leaked(leak.normalized(feedback), leak.normalized(problem), gold, attempt)


DESCRIBED = [  # (feedback, gold, the attempt's answer, problem): values given by description (value_descriptions)
    ("You counted every game twice, so halve what you got.", "36", "72", "9 teams each play each other once."),
    (
        "A probability cannot exceed 1: you flipped your fraction upside down, so invert it.",
        "\\frac{3}{8}",
        "\\frac{8}{3}",
        "3 red and 5 blue marbles: the chance of red?",
    ),
    ("Your digits are right, but move the decimal point one place to the left.", "3.5", "35", "250 g a cake, 14 cakes"),
    ("Right method, but the minimum has the same size as your value and the opposite sign.", "-4", "4", ""),
    ("You are off by 3.", "17", "20", ""),
    ("That is 2 too many.", "10", "12", ""),
    ("Off by a factor of 10.", "4.5", "45", ""),
    ("You found the two numbers; just swap them.", "(4,3)", "(3,4)", "Give (x, y)."),
    ("Your remainder should be the only even prime.", "2", "", "Find the remainder of 5^100 divided by 7."),
    ("The largest one is the only perfect number in the twenties.", "28", "", "Three consecutive even numbers …"),
    ("It is the only prime between 20 and 28.", "23", "", ""),
    ("The right choice is the only perfect square listed.", "\\text{(B)}", "", "Which? (A) 72 (B) 36 (C) 48 (D) 60"),
    ("Counting correctly, the odds in favour are 2 to 3.", "\\frac{2}{5}", "", "A number from 1 to 5 is drawn …"),
    ("Girls to total students is 4 : 7 once reduced.", "\\frac{4}{7}", "", "12 boys and 16 girls …"),
    ("Lena actually has a baker's dozen.", "13", "", "Jo has 11 apples; Lena has 2 more."),
    ("So angle B is a right angle.", "90", "", "A triangle has sides 3, 4 and 5. Find angle B."),
    # the prescriptive "your … should be" is the feedback's value; "anything other than 42" singles 42 out
    ("Each element is either in or out, so your count should be $2^5$, not $5^2$.", "32", "25", ""),
    ("If your final value is anything other than 42, go back and recheck.", "42", "40", ""),
]


@pytest.mark.parametrize(("feedback", "gold", "attempt", "problem"), DESCRIBED)
def test_values_given_by_description_are_read(feedback, gold, attempt, problem):
    assert _leaks_after(feedback, gold, attempt, problem)


DESCRIBED_NEAR_MISSES = [  # (feedback, gold, attempt, problem): alike, but the gold cannot be read off
    ("You counted every game twice, so halve what you got.", "36", "", ""),  # no attempt: nothing to halve
    ("Halve what you got, then add the diagonals back.", "36", "70", ""),  # half of 70 is not 36
    ("Your pair (3, 4) has the coordinates in the wrong order; check which is larger.", "(4,3)", "(3,4)", ""),
    ("You are off by one place value somewhere.", "350", "35", ""),  # "one place": no count of units
    ("Step 1: 5 apples are shared, not 7.", "\\frac{1}{5}", "", ""),  # a label, not a ratio
    ("The train leaves at 3:45.", "\\frac{3}{45}", "", ""),  # a time of day
    ("It is the only one that works.", "7", "", ""),  # no property to check
    ("Think about the only even prime and where it enters your factorisation.", "4", "", ""),  # 2 is not the gold
    ("There are several primes between 20 and 30.", "23", "", ""),
    ("Your answer should be checked against the constraint.", "12", "", ""),
    ("Use the right angle at C to find the other two.", "60", "", ""),
    ("A gross profit of 50 is not the point here.", "144", "", ""),
    ("Your 40 is wrong; anything near it fails too.", "42", "40", ""),
]


@pytest.mark.parametrize(("feedback", "gold", "attempt", "problem"), DESCRIBED_NEAR_MISSES)
def test_near_misses_of_the_descriptions_are_not_flagged(feedback, gold, attempt, problem):
    assert not _leaks_after(feedback, gold, attempt, problem)


@pytest.mark.parametrize(
    "text",
    [
        "halve it invert it off by 3 2 too many off by a factor of 10 square it " * 250,
        "the only even prime between 1 and 999 " * 400,
        "the only prime between 9000 and 9999 " * 400,
        "the only prime between 999999000 and 999999999 " * 300,
        "odds of 2 to 3 and a ratio 4 : 7 " * 500,
        "a baker's dozen and a right angle " * 500,
        "anything other than 5 " * 800,
    ],
)
def test_a_hostile_feedback_with_an_attempt_is_checked_in_bounded_time(text):
    started = time.process_time()
    value_presence.gold_leaked(leak.normalized(leak.scanned_text(text)), "", "24", "12")
    assert time.process_time() - started < 2.0


@pytest.mark.parametrize(
    ("attempt", "answer"),
    [
        ("Each game is counted from both sides, 9 * 8 = 72. \\boxed{70} no wait \\boxed{72}", "72"),
        ("(3,4)", "(3,4)"),  # a labelled set's bare answer
        ("I think it is 72 because each team plays 8 games and there are 9 teams in all, so 72.", ""),  # no box
        (None, ""),
    ],
)
def test_the_attempt_s_answer_is_its_last_box_or_a_bare_answer(attempt, answer):
    assert leak.attempt_answer(attempt) == answer
