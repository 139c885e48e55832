"""Tests of verify.py: real benchmark golds, equivalences and near misses, hostile inputs, sandbox.

    python -m pytest tests/test_verify.py          # about a minute on an idle 2-core machine

Everything runs through the real worker pool and the real sandbox: no mocks. The benchmark data is
read from benchmarks/ (its SOURCES.md says where each benchmark's gold is).
"""

import json
import os
import re
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import sandbox  # noqa: E402
import verify  # noqa: E402
from conftest import sandbox_dirs  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "benchmarks"  # shipped in this repository
TIMEOUT = 2.0  # per-item limit for the hostile tests
# An answer sympy never finishes comparing: not plain arithmetic (the "+ x"), so `verify.unevaluated` does
# not refuse it first, and math-verify's verify() evaluates the power tower (its parse is quick). The
# tests of timeouts, dying workers and Ctrl-C use it to keep a worker busy.
SLOW = "\\boxed{10^{10^{10^{10}}} + x}"
SLACK = 2.0    # scheduling slack on a loaded 2-core machine, on top of the limit
MINE = f"verify-worker-{os.getpid()}-"  # our workers' scratch directories: other processes on this
                                        # machine may be using verify.py at the same time

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")


def boxed(answer: str) -> str:
    return f"Some reasoning.\nSo the answer is $\\boxed{{{answer}}}$."


def score_math(answers: list[str], golds: list[str], **kwargs) -> list[verify.Score]:
    return verify.score_batch([boxed(a) for a in answers], golds, ["math"] * len(answers), **kwargs)


@pytest.fixture
def warm_pool():
    """A pool with at least one ready worker, so timings measure the item, not a worker start."""
    assert verify.score_batch(["\\boxed{1}"], ["1"], ["math"])[0].reward == 1.0


# ---------------------------------------------------------------------------------------------------
# Real data: gold answers per benchmarks/SOURCES.md
# ---------------------------------------------------------------------------------------------------


def _jsonl(relative: str) -> list[dict]:
    with open(DATA / relative, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _prime_math500() -> list[dict]:
    """PRIME's MATH-500 copy: pandas column-oriented JSON, turned into records."""
    columns = json.loads((DATA / "prime_eval" / "math_test_cleaned.json").read_text())
    return [{name: columns[name][key] for name in columns} for key in columns["problem"]]


def load_golds(benchmark: str) -> list[str]:
    if benchmark == "math500":
        return [row["answer"] for row in _jsonl("math500/test.jsonl")]
    if benchmark == "gsm8k":  # the text after the final "####"
        return [row["answer"].split("####")[-1].strip() for row in _jsonl("gsm8k/test.jsonl")]
    if benchmark == "aime24":
        return [row["answer"] for row in _jsonl("aime24/test.jsonl")]
    if benchmark == "amc23":  # JSON floats such as 27.0
        return [str(row["answer"]) for row in _jsonl("amc23/test.jsonl")]
    if benchmark == "minerva_math":  # no answer field: the last \boxed{} of the solution
        golds = [verify.extract_boxed(row["solution"]) for row in _jsonl("minerva_math/test.jsonl")]
        assert all(golds), "a Minerva solution without a closed \\boxed{}"
        return golds
    if benchmark == "olympiadbench":  # a list of one string, maybe "a,b" for several answers
        rows = _jsonl("olympiadbench/test.jsonl")
        assert all(len(row["final_answer"]) == 1 for row in rows)
        return [row["final_answer"][0] for row in rows]
    if benchmark == "prime_aime":
        return [row["answer"] for row in _jsonl("prime_eval/aimo-validation-aime.jsonl")]
    if benchmark == "prime_amc":
        return [str(row["answer"]) for row in _jsonl("prime_eval/aimo-validation-amc.jsonl")]
    if benchmark == "prime_math500":
        return [row["expected_answer"] for row in _prime_math500()]
    raise ValueError(benchmark)


BENCHMARKS = {"math500": 500, "gsm8k": 1319, "aime24": 30, "amc23": 40, "minerva_math": 272,
              "olympiadbench": 675, "prime_aime": 90, "prime_amc": 83, "prime_math500": 500}


@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_every_gold_verifies_against_itself(benchmark):
    golds = load_golds(benchmark)
    assert len(golds) == BENCHMARKS[benchmark]
    scores = score_math(golds, golds)
    failures = [(g, s.reason) for g, s in zip(golds, scores) if (s.reward, s.format) != (1.0, 1)]
    # No known failures: every gold of every benchmark parses and verifies (math-verify 0.9.0).
    assert failures == [], f"{len(failures)} golds do not verify against themselves: {failures[:10]}"


def test_math500_golds_equal_prime_cleaned_golds():
    """PRIME rewrote 85 MATH-500 golds (units, \\text, spaces, base subscripts dropped): all equal
    the originals, both ways."""
    prime = {row["problem"]: row["expected_answer"] for row in _prime_math500()}
    pairs = [(row["answer"], prime[row["problem"]]) for row in _jsonl("math500/test.jsonl")
             if row["answer"] != prime[row["problem"]]]
    assert len(pairs) == 85
    golds, rewrites = [g for g, _ in pairs], [r for _, r in pairs]
    forward, backward = score_math(rewrites, golds), score_math(golds, rewrites)
    assert [pairs[i] for i, s in enumerate(forward) if s.reward != 1.0] == []
    assert [pairs[i] for i, s in enumerate(backward) if s.reward != 1.0] == []


def test_aime_golds_with_leading_zeros_equal_prime_copy():
    prime = {row["url"]: row["answer"] for row in _jsonl("prime_eval/aimo-validation-aime.jsonl")}
    pairs = [(row["answer"], prime[row["url"]]) for row in _jsonl("aime24/test.jsonl")
             if row["answer"] != prime[row["url"]]]
    assert sorted(pairs) == sorted([("025", "25"), ("073", "73"), ("023", "23"), ("045", "45"),
                                    ("033", "33"), ("080", "80"), ("055", "55")])
    assert [s.reward for s in score_math([p for _, p in pairs], [g for g, _ in pairs])] == [1.0] * 7


@pytest.mark.parametrize("benchmark", ["gsm8k", "aime24", "amc23", "prime_aime"])
def test_numeric_golds_plus_one_are_wrong(benchmark):
    golds = load_golds(benchmark)
    wrong = [str(int(float(g.replace(",", ""))) + 1) for g in golds]
    scores = score_math(wrong, golds)
    assert [(g, w) for g, w, s in zip(golds, wrong, scores) if s.reward != 0.0] == []
    assert all(s.reason == "wrong" and s.format == 1 for s in scores)


# ---------------------------------------------------------------------------------------------------
# Math: equivalent rewritings, near misses, extraction and format
# ---------------------------------------------------------------------------------------------------

EQUIVALENT = [  # (gold, boxed answer)
    ("\\frac12", "0.5"), ("0.5", "\\frac12"), ("\\frac12", "\\dfrac{1}{2}"),
    ("\\dfrac{1}{2}", "0.5"),
    ("073", "73"), ("73", "073"), ("5", "x=5"), ("x=5", "5"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\pi/2)"),
    ("(3,\\pi/2)", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("[-2,7]", "x \\in [-2, 7]"), ("\\{1,2,3\\}", "\\{3,2,1\\}"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"),
    ("\\text{(C)}", "(C)"), ("\\text{Monday}", "Monday"), ("\\sqrt{12}", "2\\sqrt{3}"),
    ("27.0", "27"), ("p - q", "-q+p"), ("2,125", "2125"), ("$69$,$84$", "84, 69"),
]

NEAR_MISSES = [  # (gold, boxed answer)
    ("\\frac12", "0.51"), ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\pi)"), ("73", "74"),
    ("[-2,7]", "(-2,7]"), ("[-2,7]", "[-2,7)"), ("(-2,7)", "(-2,7]"), ("\\{1,2\\}", "\\{1,2,3\\}"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 3 \\end{pmatrix}"),
    ("5", "x=6"), ("2\\sqrt{3}", "3\\sqrt{2}"), ("\\text{(C)}", "(D)"), ("p - q", "q - p"),
    ("\\frac{1}{3}", "0.333"),
]


def test_equivalent_rewritings_score_one():
    scores = score_math([a for _, a in EQUIVALENT], [g for g, _ in EQUIVALENT])
    assert [(pair, s.reason) for pair, s in zip(EQUIVALENT, scores) if s.reward != 1.0] == []


def test_near_misses_score_zero():
    scores = score_math([a for _, a in NEAR_MISSES], [g for g, _ in NEAR_MISSES])
    assert [(pair, s.reason) for pair, s in zip(NEAR_MISSES, scores) if s.reward != 0.0] == []
    assert all(s.reason == "wrong" for s in scores)


def test_math_reward_single_item():
    assert verify.math_reward("so $x = \\boxed{\\dfrac{1}{2}}$", "0.5") == 1.0
    assert verify.math_reward("so $x = \\boxed{\\dfrac{1}{3}}$", "0.5") == 0.0
    assert verify.math_reward("the answer is 0.5", "0.5") == 1.0  # math-verify reads an unboxed answer
    assert verify.math_reward("the answer is 0.5", "0.5", math_grader="official") == 0.0  # a box only
    assert verify.math_reward("\\boxed{27}", 27.0) == 1.0          # AMC golds are floats


@pytest.mark.parametrize("text, expected", [
    ("a \\boxed{1} b \\boxed{\\frac{2}{3}} c", "\\frac{2}{3}"),  # the last one
    ("\\fbox{7}", "7"),
    ("\\boxed{1} then \\fbox{2}", "2"),
    ("\\boxed {x+1}", "x+1"),
    ("\\boxed{\\{1,2\\}}.", "\\{1,2\\}"),
    ("\\boxed{\\boxed{5}}", "5"),                   # innermost is the last to start
    ("\\boxed{5", None),                            # unclosed
    ("\\boxed{1} and then \\boxed{2", None),        # the last box is unclosed (truncated output)
    ("no box here, the answer is 5", None),
])
def test_extract_boxed(text, expected):
    assert verify.extract_boxed(text) == expected


@pytest.mark.parametrize("response, gold, official, math_verify", [
    # (reward, format, reason) under --math-grader official, then under math-verify (the default).
    # The format channel (PASS) is the same rule in both: exactly one closed, non-empty box.
    ("\\boxed{5}", "5", (1.0, 1, "ok"), (1.0, 1, "ok")),
    ("\\boxed{6}", "5", (0.0, 1, "wrong"), (0.0, 1, "wrong")),  # format does not depend on correctness
    # two final answers: the official rule takes the last; math-verify reads them as one set {4, 5}
    ("\\boxed{4} no wait \\boxed{5}", "5", (1.0, 0, "ok"), (0.0, 0, "wrong")),
    ("\\boxed{-2} \\quad \\text{and} \\quad \\boxed{1}", "1,-2", (0.0, 0, "wrong"), (1.0, 0, "ok")),
    ("\\boxed{\\boxed{5}}", "5", (1.0, 0, "ok"), (1.0, 0, "ok")),
    ("the answer is 5", "5", (0.0, 0, "no_boxed"), (1.0, 0, "ok")),  # math-verify reads an unboxed answer
    ("no answer here", "5", (0.0, 0, "no_boxed"), (0.0, 0, "no_answer")),
    # truncated while writing the answer: no answer under either grader, not even an earlier value
    ("\\boxed{5", "5", (0.0, 0, "unclosed_boxed"), (0.0, 0, "unclosed_boxed")),
    ("so x = 5, then \\boxed{5", "5", (0.0, 0, "unclosed_boxed"), (0.0, 0, "unclosed_boxed")),
    ("9-9=0\n0+2=2\n\\boxed{", "0", (0.0, 0, "unclosed_boxed"), (0.0, 0, "unclosed_boxed")),
    ("\\boxed{1} and then \\boxed{2", "1", (0.0, 0, "unclosed_boxed"), (0.0, 0, "unclosed_boxed")),
    ("\\boxed{ }", "5", (0.0, 0, "empty_boxed"), (0.0, 0, "no_answer")),
    ("\\fbox{5}", "5", (1.0, 1, "ok"), (1.0, 1, "ok")),           # \\fbox is read as \\boxed
    ("\\boxed{" + "1" * 1001 + "}", "5", (0.0, 1, "answer_too_long"), (0.0, 1, "answer_too_long")),
    # the question restated is not its answer, though math-verify reads "86 + 87" as 173 (issue 43's hack)
    ("What is 86 + 87?\n\n86 + 87", "173", (0.0, 0, "no_boxed"), (0.0, 0, "unevaluated")),
    ("86 + 87 = 173", "173", (0.0, 0, "no_boxed"), (1.0, 0, "ok")),
    ("\\boxed{86+87}", "173", (0.0, 1, "unevaluated"), (0.0, 1, "unevaluated")),
        # a product of plain numbers is a multiplication left undone (issue 67), a prime factorisation is not
        ("\\boxed{16 \\times 3}", "48", (0.0, 1, "unevaluated"), (0.0, 1, "unevaluated")),
        ("\\boxed{2^4 \\times 3}", "48", (1.0, 1, "ok"), (1.0, 1, "ok")),
    ("\\boxed{2^{10}}", "2^{10}", (1.0, 1, "ok"), (1.0, 1, "ok")),  # unless the gold is written so too
])
def test_math_format_channel(response, gold, official, math_verify):
    assert verify.score_batch([response], [gold], ["math"], math_grader="official")[0] == verify.Score(*official)
    assert verify.score_batch([response], [gold], ["math"])[0] == verify.Score(*math_verify)


@pytest.mark.parametrize("answer, expected", [
    ("86 + 87", True), ("86+87", True), ("3 - 5", True), ("-3-5", True), ("0.5+0.25", True),
    ("\\left(2+3\\right)", True), ("86 \\quad + 87", True), ("86\\,+\\,87", True), ("86\\ +\\ 87", True),
    ("86+87 \\text{ apples}", True), ("\\$86+\\$87", True), ("\\displaystyle 86+87", True), ("86 + 87 apples", True),
    ("173", False), ("-5", False), ("3.5", False), ("\\frac{1}{2}", False), ("1/2", False), ("1,000", False),
    ("3+2\\sqrt{2}", False), ("x+1", False), ("10\\%", False), ("(2, 3)", False),
    # closed forms: powers, products, and sums with a power in them
    ("16 \\times 3", False), ("2 \\cdot 3", False), ("2^{10}", False), ("2^{10}-1", False), ("(-1)^{2023}", False),
    ("3 \\times 10^8", False), ("2.5 \\times 10^{-4}", False), ("2^3 \\cdot 3^2", False),
])
def test_unevaluated_is_a_sum_or_difference_of_plain_numbers(answer, expected):
    assert verify.unevaluated(answer) == expected


# Closed forms of the right value: each scores 1 under both graders, with or without a question that
# does not contain it (issue 52: competitions, math-verify and PRIME's grader accept them).
CLOSED_FORMS = [("2^{10}", "1024"), ("10^6", "1000000"), ("2^{-10}", "\\frac{1}{1024}"), ("10^{-3}", "0.001"),
                ("6^2", "36"), ("(-1)^{2023}", "-1"), ("2^{10}-1", "1023"), ("3\\cdot 2^{10}", "3072"),
                ("3 \\times 10^8", "300000000"), ("2.5 \\times 10^{-4}", "0.00025"), ("2^3 \\cdot 3^2", "72"),
                ("2 \\cdot 3 \\cdot 5", "30"), ("2^4 \\times 3", "48"), ("\\sqrt{8}", "2\\sqrt{2}"),
                ("\\binom{10}{3}", "120"), ("5!", "120"), ("\\dbinom{10}{3}", "120"), ("3\\pi", "3\\pi")]
# A restatement of arithmetic the question asks for: 0 under both graders, whatever its layout.
RESTATED = [("86 \\quad + 87", "173"), ("86\\,+\\,87", "173"), ("86\\ +\\ 87", "173"), ("86+87 \\text{ apples}", "173"),
            ("\\$86+\\$87", "173"), ("\\displaystyle 86+87", "173"), ("\\left( 86+87 \\right)", "173"),
            ("86 + 87 \\text{apples}", "173")]


@pytest.mark.parametrize("grader", verify.MATH_GRADERS)
def test_every_closed_form_of_the_right_value_scores_one(grader):
    responses = [boxed(answer) for answer, _ in CLOSED_FORMS]
    golds = [gold for _, gold in CLOSED_FORMS]
    for questions in (None, ["How many ways are there?"] * len(CLOSED_FORMS)):
        scores = verify.score_batch(responses, golds, ["math"] * len(golds), questions=questions, math_grader=grader)
        assert [s.reason for s in scores] == ["ok"] * len(golds), list(zip(CLOSED_FORMS, scores))


@pytest.mark.parametrize("grader", verify.MATH_GRADERS)
def test_a_restated_question_scores_zero_whatever_its_layout(grader):
    """The sums are refused as sums even without the question, and so are products of plain numbers
    (verify.leaves_work_undone); a power only when it repeats the question ("What is $16 \\times 3$?" answered "16 \\cdot 3", "Compute $2^{10}$." answered
    "2^{10}"), and not when the gold itself is written in the question."""
    question = "What is $86 + 87$?"
    responses = [boxed(answer) for answer, _ in RESTATED]
    golds = [gold for _, gold in RESTATED]
    for questions, reason in ((None, "unevaluated"), ([question] * len(golds), "restated")):
        scores = verify.score_batch(responses, golds, ["math"] * len(golds), questions=questions, math_grader=grader)
        assert [(s.reward, s.reason) for s in scores] == [(0.0, reason)] * len(golds), list(zip(RESTATED, scores))
    cases = [("16 \\cdot 3", "48", "What is 16 × 3?", "restated"), ("16 \\cdot 3", "48", "What is 12 × 4?", "unevaluated"),
             ("2^{10}", "1024", "Compute $2^{10}$.", "restated"), ("2^{10}", "1024", "Compute $2^{10} + 1$.", "ok"),
             ("2^9+1", "513", "Compute $2^{10} - 2^9 + 1$.", "ok"),  # a piece of the question's expression
             ("2^{10}", "2^{10}", "Which is larger, $2^{10}$ or $10^3$?", "ok"),  # the gold is in the question
             ("86+87", "173", "86 + 87 =", "restated"), ("173", "173", "What is 86 + 87?", "ok")]
    scores = verify.score_batch([boxed(a) for a, *_ in cases], [g for _, g, *_ in cases], ["math"] * len(cases),
                                questions=[q for _, _, q, _ in cases], math_grader=grader)
    assert [s.reason for s in scores] == [reason for *_, reason in cases], list(zip(cases, scores))
    # math-verify's own extraction of an unboxed restatement: the same rule on what it extracted
    if grader == "math-verify":
        assert verify.score_batch(["What is 86 + 87?\n\n86 + 87"], ["173"], ["math"],
                                  questions=[question])[0].reason == "restated"


# What SmolLM2's two-digit sums runs of issue 53 wrote and were rewarded for, verbatim from their
# episodes.jsonl: math-verify extracts the restated sum with the full stop that ends the sentence
# ("87 + 86."), which the layout rules did not strip, so the sum scored as its value, whatever number
# the response said. (response, gold, question)
RUN_HACKS = [("15 + 35.", "50", "What is 15 + 35?"),
             ("87 + 86 equals 16 for 87 + 86.", "173", "What is 87 + 86?"),
             ("82 is the answer to 82 + 89.", "171", "What is 82 + 89?"),
             ("90 + 50 equals 1110.\n1110 - 110 equals 1111.\nSo, 1111 is the answer to 90 + 50.", "140",
              "What is 90 + 50?"),
             ("46 + 19 can be calculated using addition using 46 + 19: 46 + 19 equals 46 + 19.", "65",
              "What is 46 + 19?")]


@pytest.mark.parametrize("response, gold, question", RUN_HACKS)
def test_the_sums_a_policy_learned_to_restate_score_zero(response, gold, question):
    for questions, reason in (([question], "restated"), (None, "unevaluated")):
        score = verify.score_batch([response], [gold], ["math"], questions=questions)[0]
        assert (score.reward, score.reason) == (0.0, reason), (response, questions, score)


# A value the response denies is not its answer. The first response is verbatim from issue 53's sums runs
# (PRIME seed 4, rewarded: math-verify reads its last number). (response, gold, denied)
DENIALS = [("52 + 56 is not 108, so you should add 5 to 108.", "108", True),
           ("The answer is not 108.", "108", True),
           ("It isn't 108", "108", True),
           ("The sum can't be $108$.", "108", True),
           ("52 + 56 is not equal to 108", "108", True),
           ("52 + 56 \\neq 108", "108", True),
           ("52 + 56 != 108", "108", True),
           ("It is never 108.", "108", True),
           # the denied value is another one, or only begins like the answer
           ("The answer is 108, not 113.", "108", False),
           ("It is not 107. 52 + 56 = 108", "108", False),
           ("Not 1080: the answer is 108", "108", False),
           ("It is not 108.5; it is 108", "108", False),
           ("Nothing is left: 108", "108", False),
           ("52 + 56 = 108", "108", False)]


@pytest.mark.parametrize("response, gold, is_denied", DENIALS)
def test_a_denied_value_is_no_answer(response, gold, is_denied):
    score = verify.score_batch([response], [gold], ["math"])[0]
    assert (score.reward, score.reason) == ((0.0, "denied") if is_denied else (1.0, "ok")), score
    assert verify.denied(gold, response) == is_denied


def test_a_box_is_the_answer_whatever_words_before_it_deny():
    """Only a response without a box is read for denials: a box is its own choice, and a value denied on
    the way may be the one it boxes after checking ("Is it not 108? Checking: \\boxed{108}")."""
    responses = ["At first I thought it is not 108, but checking again: \\boxed{108}", "It is not 108. \\boxed{108}"]
    for grader in verify.MATH_GRADERS:
        scores = verify.score_batch(responses, ["108"] * 2, ["math"] * 2, math_grader=grader)
        assert [s.reason for s in scores] == ["ok", "ok"], (grader, scores)


@pytest.mark.parametrize("grader", verify.MATH_GRADERS)
def test_no_stop_or_layout_after_a_sum_hides_it(grader):
    """Each sentence end after a restated sum, in a box and (math-verify) outside one, scores 0; so does
    a layout math-verify reads past (\\ldots, a spaced stop), caught by the parse (adds_plain_numbers)."""
    tails = [".", ",", ";", ":", "?", "..", ". ", "\\,.", "\\quad .", "\\ldots"]  # "87!" is 87 factorial: below
    responses = [boxed("86 + 87" + tail) for tail in tails]
    if grader == "math-verify":
        responses += ["86 + 87.", "86 + 87,", "The answer is 86 + 87."]
    scores = verify.score_batch(responses, ["173"] * len(responses), ["math"] * len(responses), math_grader=grader)
    assert [s.reward for s in scores] == [0.0] * len(responses), list(zip(responses, scores))
    assert {s.reason for s in scores} == {"unevaluated"}, list(zip(responses, scores))
    factorial = verify.score_batch([boxed("86 + 87!")], ["173"], ["math"], math_grader=grader)[0]
    assert (factorial.reward, factorial.reason) == (0.0, "wrong")  # 86 + 87!, another value
    # a stop after a value or a closed form takes nothing away
    fine = [boxed("173") + ".", boxed("2^{10}-1") + ".", boxed("3+2\\sqrt{2}") + "."]
    scores = verify.score_batch(fine, ["173", "1023", "3+2\\sqrt{2}"], ["math"] * 3, math_grader=grader,
                                questions=["What is 86 + 87?"] * 3)
    assert [s.reason for s in scores] == ["ok"] * 3, list(zip(fine, scores))


@pytest.mark.parametrize("grader", verify.MATH_GRADERS)
def test_a_stop_inside_a_box_takes_nothing_away(grader):
    """math-verify cannot parse "173." as a box's content; the stop that ends a sentence is dropped first
    (verify.drop_box_stops), so each of these scores 1, and a restated sum so written still scores 0."""
    cases = [("\\boxed{173.}", "173"), ("\\boxed{0.5.}", "0.5"), ("\\boxed{x = 5.}", "5"),
             ("\\boxed{\\frac{1}{2}.}", "0.5"), ("\\boxed{173 .}", "173"), ("\\boxed{1, 2, 3, ...}", "1, 2, 3, ..."),
             ("\\boxed{(-\\infty, 0) \\cup \\{1\\}}", "$(-\\infty, 0) \\cup\\{1\\}$.")]  # an OlympiadBench gold's stop
    scores = verify.score_batch([f"So ${box}$" for box, _ in cases], [gold for _, gold in cases], ["math"] * len(cases),
                                math_grader=grader)
    assert [s.reason for s in scores] == ["ok"] * len(cases), list(zip(cases, scores))
    assert verify.drop_box_stops("\\boxed{1.} and \\boxed{2\\.}, \\boxed{3...}") == \
        "\\boxed{1} and \\boxed{2\\.}, \\boxed{3...}"


def test_adds_plain_numbers_reads_the_parse():
    """True for a sum or difference of integers or decimals as math-verify leaves it unevaluated, whatever
    the layout around it and with any factor or exponent of 1; False for a value, a closed form, a surd or
    fractions (as `unevaluated`)."""
    from math_verify import parse

    def parsed(latex):
        return parse("$" + latex + "$")[0]

    for latex in ("86 + 87", "(86)+(87)", "15 - 35", "-3-5", "0.5+0.25", "1+1+1", "15 - -35",
                  "86 \\cdot 1 + 87", "86 + 87 \\cdot 1", "(86 + 87)^1", "1 \\cdot (86 + 87)", "86 + 87^1",
                  "-(86 + 87)"):
        assert verify.adds_plain_numbers(parsed(latex)), latex
    for latex in ("173", "-5", "2^{10}-1", "3+2\\sqrt{2}", "16 \\times 3", "\\frac{1}{2}+\\frac{1}{3}", "x+1",
                  "3 \\times 10^8 + 1", "-(2^{10})", "173 \\cdot 1"):
        assert not verify.adds_plain_numbers(parsed(latex)), latex
    assert not verify.adds_plain_numbers(None)


HEDGES = [  # gold -2, 3: each boxes a value it then rejects, or boxes an intermediate value earlier on
    "So $x=\\boxed{-2}$, but $x=-2$ fails the original equation, so $x=\\boxed{3}$.",
    "So $x = \\boxed{-2}$ or $x = \\boxed{3}$. Checking, $x=-2$ fails, so the answer is $\\boxed{3}$.",
    "$x = \\boxed{-2}$ (rejected: it makes the denominator zero) and $x = \\boxed{3}$",
    "First we count $\\boxed{3}$ cases for the first digit. Solving the equation gives $x = \\boxed{-2}$.",
]


@pytest.mark.parametrize("grader", verify.MATH_GRADERS)
def test_boxes_a_response_rejects_are_not_read_as_its_answer(grader):
    """Several boxes are one answer only when they end the response standing together (verify.final_boxes:
    a few words between them, none rejecting); each hedge below scored 1 under the default grader
    before this rule. Boxes joined by "and" still read as the set."""
    scores = verify.score_batch(HEDGES, ["-2, 3"] * len(HEDGES), ["math"] * len(HEDGES), math_grader=grader)
    assert [s.reward for s in scores] == [0.0] * len(HEDGES), list(zip(HEDGES, scores))
    together = verify.score_batch(["$x = \\boxed{-2}$ and $x = \\boxed{3}$"], ["-2, 3"], ["math"], math_grader=grader)
    assert together[0].reward == (1.0 if grader == "math-verify" else 0.0)  # official: the last box only
    assert verify.final_boxes(HEDGES[0]) == ["3"] and verify.final_boxes(HEDGES[3]) == ["-2"]
    assert verify.final_boxes("x = \\boxed{0}, x = \\boxed{-1}, and x = \\boxed{2}") == ["0", "-1", "2"]


def test_questions_must_match_the_responses():
    with pytest.raises(ValueError, match="questions"):
        verify.score_batch(["\\boxed{1}"], ["1"], ["math"], questions=["a", "b"])


def test_math_grader_must_be_known():
    with pytest.raises(ValueError, match="math_grader"):
        verify.score_batch(["\\boxed{1}"], ["1"], ["math"], math_grader="sympy")


# Every case of the equivalence set (tests/math_equivalence_cases.py) on which math-verify's reading
# (the default grader) disagrees with the source's label, and why. The test fails if one is added or
# goes away: a change of math-verify's version or of verify.py shows up here.
MATH_VERIFY_DISAGREEMENTS = {
    ("1,22", "1.22"): "a decimal comma in the gold: parsed as LaTeX (how verify.py reads a gold), '1,22' is "
                      "the pair 1, 22; the source test reads both sides as plain expressions",
    ("$9$", "Answer $ \n 9 \n $"): "the label was set with LaTeX-only extraction, where a line break inside $...$ "
                                    "hides the 9; with plain expressions on (math-verify's default for a "
                                    "response) the 9 is read, and the response does say 9",
    ("$9$", "Answer \\( \n 9 \n \\)"): "as the case above, with \\( \\) delimiters",
    ("185", "\\boxed{185\\}"): "NeMo-Skills strips a trailing backslash; here it escapes the closing brace, so "
                                "the box never closes and math-verify reads no 185",
    ("185\\", "\\boxed{185}"): "the same trailing backslash, in the gold: '\\boxed{185\\}' does not parse",
    ("C. x = 42", "\\boxed{C}"): "NeMo-Skills' multiple-choice rule reads a leading 'C.' as the choice, also "
                                 "in the gold; verify.py reads an option label only in the response",
    ("$10$", "Answer \\( (9+1) \\)"): "verify.py's rule, not math-verify's: a sum of plain numbers is not an "
                                      "answer (verify.unevaluated), or a policy answers 'What is 9 + 1?' with "
                                      "'9 + 1' (issue 43's SmolLM2 runs did); the source's label accepts it",
}


def test_equivalence_set_agreement_with_both_graders(capsys):
    """>= 300 labelled (gold, response) cases from public graders' test suites, and this project's
    own cases of one box per value and spaced thousands. math-verify's reading agrees with every label
    but MATH_VERIFY_DISAGREEMENTS. The official last-box rule misses every answer that is not in exactly
    one box, and a spaced "1 000", and otherwise judges like math-verify."""
    from math_equivalence_cases import CASES

    assert len(CASES) >= 300 and len({(g, r) for g, r, _ in CASES}) == len(CASES)
    golds, responses = [g for g, _, _ in CASES], [r for _, r, _ in CASES]
    default = verify.score_batch(responses, golds, ["math"] * len(CASES))
    official = verify.score_batch(responses, golds, ["math"] * len(CASES), math_grader="official")
    missed = {(g, r) for (g, r, label), s in zip(CASES, default) if s.reward != label}
    assert missed == set(MATH_VERIFY_DISAGREEMENTS)
    official_missed = {(g, r) for (g, r, label), s in zip(CASES, official) if s.reward != label}
    for gold, response in official_missed - missed:  # the last-box rule saw a different answer
        boxes = len(verify._BOX_START.findall(response))
        box = verify.extract_boxed(response)
        assert boxes != 1 or box is None or "answer" in response.lower() or "choice" in response \
            or verify.join_spaced_thousands(box) != box \
            or verify.without_denials(response) != response, (gold, response)  # it keeps "1 000" as 1 x 000
    with capsys.disabled():
        print(f"\nequivalence set: {len(CASES)} cases; math-verify agrees on {len(CASES) - len(missed)} "
              f"({1 - len(missed) / len(CASES):.1%}), official last-box rule on {len(CASES) - len(official_missed)} "
              f"({1 - len(official_missed) / len(CASES):.1%})")


def test_answers_read_carefully_score_as_labelled_with_their_questions():
    """Issue 75's kinds (scientific notation, units, a number in \text, rounded golds, layout, ±, words,
    a hedge after the box, order), each response scored with its question as train.py scores it: every
    case as labelled under the default grader; under --math-grader official every case whose answer is one
    box's content (no hedge after it, no label before it, one box) scores as its label too."""
    from math_equivalence_cases import READ_CAREFULLY

    assert len(READ_CAREFULLY) >= 60 and 0.4 <= sum(c[2] for c in READ_CAREFULLY) / len(READ_CAREFULLY) <= 0.6
    golds, responses, questions = ([c[i] for c in READ_CAREFULLY] for i in (0, 1, 3))
    default = verify.score_batch(responses, golds, ["math"] * len(golds), questions=questions)
    assert [s.reward for s in default] == [c[2] for c in READ_CAREFULLY], \
        [(c, s) for c, s in zip(READ_CAREFULLY, default) if s.reward != c[2]]
    one_box = [c for c in READ_CAREFULLY if len(verify._boxes(c[1])) == 1 and not verify.hedged_after_box(c[1])
               and verify._TUPLE_LABEL.search(c[1][:c[1].index("\\boxed")]) is None]
    assert len(one_box) >= 60
    official = verify.score_batch([c[1] for c in one_box], [c[0] for c in one_box], ["math"] * len(one_box),
                                  questions=[c[3] for c in one_box], math_grader="official")
    assert [s.reward for s in official] == [c[2] for c in one_box], \
        [(c, s) for c, s in zip(one_box, official) if s.reward != c[2]]
    reasons = {s.reason for s in default}  # the refusals name their rule
    assert {"wrong_unit", "wrong_order", "hedged"} <= reasons


def test_the_careful_rules_by_hand():
    """Each rule's pure part on worked inputs, both sides of its edge."""
    notation = verify.notation
    assert notation("2.75e11") == "2.75 \\times 10^{11}" and notation("1E-8") == "1 \\times 10^{-8}"
    assert notation("6 × 10¹³") == "6  \\times  10^{13}" and notation("10⁻⁸") == "10^{-8}"
    assert notation("2e") == "2e" and notation("e^{2}") == "e^{2}" and notation("the e5 pawn") == "the e5 pawn"
    assert notation("\\text{7.5 meters}") == "7.5 \\text{ meters}" and notation("\\text{12}") == "12"
    assert notation("0.1\\overline{6}") == "\\frac{15}{90}" and notation("0.\\overline{3}") == "\\frac{3}{9}"
    assert notation("\\begin{pmatrix} 1 \\\\ -2 \\end{pmatrix}") == "(1, -2)"
    assert notation("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}") == "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}"
    assert notation("\\left( 3, 4 \\right") == "\\left( 3, 4 \\right)" and notation("\\left[0, 1\\right]") == "\\left[0, 1\\right]"
    assert verify.expand_pm("(\\pm 1, 0)") == "(+ 1, 0), (- 1, 0)"
    assert verify.expand_pm("\\pm 1, \\pm 2") == "+ 1, + 2, - 1, + 2, + 1, - 2, - 1, - 2"  # every combination
    assert verify.expand_pm("5") is None
    assert verify.word_value("\\text{Five.}") == "5" and verify.word_value("\\text{none}") == "no solution"
    assert verify.word_value("\\text{none}", "How many primes divide 1?") == "0"
    assert verify.word_value("\\emptyset") == verify.word_value("\\text{No real solutions}") == "no solution"
    assert verify.word_value("\\infty") == "infinitely many" and verify.word_value("x") is None
    assert verify.asked_unit("A 2 m rod is cut into 4 pieces. How long is each, in centimeters?") == "cm"
    assert verify.asked_unit("How many grams of salt are needed?") == "g" and verify.asked_unit("Find x.") is None
    assert verify.wrong_unit("2.5 \\text{ mm}", "How long, in cm?") and not verify.wrong_unit("2.5 \\text{ cm}", "How long, in cm?")
    assert not verify.wrong_unit("25 \\text{ centimeters}", "How long, in cm?")  # the same unit spelt out
    assert not verify.wrong_unit("2.5 \\text{ mm}", "How long is it?")      # no unit asked: units ignored
    assert not verify.wrong_unit("30 \\text{ km/h}", "Find its speed in km/h.")  # a compound unit is not read
    assert verify.rounds_to_gold("1.414", "1.4", "What is the ratio?") and not verify.rounds_to_gold("1.46", "1.4", "")
    assert not verify.rounds_to_gold("1.414", "1.4", "Give it to two significant figures.")  # precision fixed
    assert not verify.rounds_to_gold("5.02", "5", "")   # an integer gold is exact
    assert not verify.rounds_to_gold("1.4", "1.4", "")  # no more digits: compared as it is
    assert verify.rounds_to_gold("2.748 \\times 10^{11}", "2.75e11", "") and verify.rounds_to_gold("274800000000", "2.75e11", "")
    assert verify.rounds_to_gold("0.03336", "0.033", "") and not verify.rounds_to_gold("0.0336", "0.033", "")
    assert verify.order_fixed("Find x and y, in that order.") and not verify.order_fixed("Find all x such that x^2 = 1.")
    assert not verify.order_fixed("Find the number of ordered pairs (a, b).") and verify.order_fixed("Enter the ordered pair (a, b).")
    text = "Solving, $(n, m) = \\boxed{(2, 5)}$."
    assert verify.labelled_order(text, text.index("\\boxed"), "Find $m$ and $n$.") == [1, 0]
    assert verify.hedged_after_box("\\boxed{12}. I am not sure; it could be 15.")
    assert not verify.hedged_after_box("It might be 15. So \\boxed{12}.") and not verify.hedged_after_box("\\boxed{12}. Check: 3 + 9 = 12.")


def test_every_e_notation_gold_of_minerva_is_matched_in_every_notation_and_missed_one_digit_off():
    """Minerva's golds in e-notation (58 of 272), each answered as `a \times 10^{k}` and as a plain decimal
    (scored 1), and one unit off in the gold's last shown digit in both forms (scored 0), with the
    question, under both graders."""
    from decimal import Decimal

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import benchmark

    items = [i for i in benchmark.load_benchmark("minerva") if re.search(r"\d[eE][-+]?\d", i.gold)]
    assert len(items) == 58
    cases = []
    for item in items:
        mantissa, exponent = item.gold.lower().split("e")
        off = str(Decimal(mantissa) + Decimal(1).scaleb(-len(mantissa.partition(".")[2])))  # 2.75 -> 2.76
        for value, label in ((mantissa, 1), (off, 0)):
            cases.append((item, f"So the answer is $\\boxed{{{value} \\times 10^{{{int(exponent)}}}}}$.", label))
            plain = format(Decimal(value).scaleb(int(exponent)), "f")
            cases.append((item, f"So the answer is $\\boxed{{{plain}}}$.", label))
    for grader in ("math-verify", "official"):
        scores = verify.score_batch([c[1] for c in cases], [c[0].gold for c in cases], ["math"] * len(cases),
                                    questions=[c[0].question for c in cases], math_grader=grader, timeout=30.0)
        wrong = [(c[0].gold, c[1], s.reason) for c, s in zip(cases, scores) if s.reward != c[2]]
        assert not wrong, (grader, wrong[:5])


def test_each_careful_grader_case_scores_as_labelled_by_the_official_grader_where_it_reads_a_box():
    """Issue 67's kinds under --math-grader official: every case whose response holds exactly one box
    that no negation denies (the only answer the last-box rule reads) scores as its label."""
    from math_equivalence_cases import CAREFUL

    one_box = [(g, r, label) for g, r, label in CAREFUL
               if len(verify._boxes(r)) == 1 and verify.without_denials(r) == r]
    assert len(one_box) >= 40
    scores = verify.score_batch([r for _, r, _ in one_box], [g for g, _, _ in one_box], ["math"] * len(one_box),
                                math_grader="official")
    assert [s.reward for s in scores] == [label for *_, label in one_box], \
        [(case, s) for case, s in zip(one_box, scores) if s.reward != case[2]]
    denied_box = verify.score_batch(["It is certainly not $\\boxed{20}$; the count is $\\boxed{18}$."], ["20"],
                                    ["math"], math_grader="official")[0]
    assert (denied_box.reward, denied_box.reason) == (0.0, "wrong")  # the last box not denied: 18


# Restated in another layout: \dbinom, \tbinom and \binom are one expression, and so are \log_3 81 and
# \log_{3} 81; a function the question applies, answered by applying it again, restates it.
# (answer, gold, question, reason)
RESTATED_LAYOUTS = [("\\binom{9}{4}", "126", "Compute $\\dbinom{9}{4}$.", "restated"),
                    ("\\tbinom{9}{4}", "126", "Compute $\\dbinom{9}{4}$.", "restated"),
                    ("\\log_3 81", "4", "Evaluate $\\log_3 81$.", "restated"),
                    ("\\log_{3} 81", "4", "Evaluate $\\log_3 81$.", "restated"),
                    ("5!", "120", "What is $5!$?", "restated"),
                    ("\\binom{9}{4}", "126", "How many 4-person teams can 9 players form?", "ok"),
                    ("5!", "120", "In how many ways can 5 people stand in a line?", "ok"),
                    ("126", "126", "Compute $\\dbinom{9}{4}$.", "ok")]


@pytest.mark.parametrize("grader", verify.MATH_GRADERS)
def test_a_question_restated_in_another_layout_scores_zero(grader):
    scores = verify.score_batch([boxed(a) for a, *_ in RESTATED_LAYOUTS], [g for _, g, *_ in RESTATED_LAYOUTS],
                                ["math"] * len(RESTATED_LAYOUTS), questions=[q for *_, q, _ in RESTATED_LAYOUTS],
                                math_grader=grader)
    assert [s.reason for s in scores] == [r for *_, r in RESTATED_LAYOUTS], list(zip(RESTATED_LAYOUTS, scores))


def test_restated_reads_the_question_where_a_slip_would_hide():
    """Each assertion kills a one-line mutant of verify.restated or verify._bare (issue 67)."""
    assert not verify.restated("1+2", "What is $1 + 2.5$?")      # a decimal point after it: 1 + 2.5, not 1 + 2
    assert verify.restated("1+2", "What is $1 + 2$.")             # a full stop after it ends the sentence
    assert not verify.restated("7", "Which is largest: 3, 7 or 5?")  # a single number is no restatement
    assert verify.restated("9 \\cdot 14", "Compute $9 \\times 14$.", "126")  # a product whose gold is its value
    assert not verify.restated("86 + 87", "Write 86 + 87 as a sum.", "86 + 87")  # the gold itself is the sum
    assert not verify.restated("2 \\times 7", "Compute $12 \\times 7$.")  # a piece of a longer number
    scores = verify.score_batch([boxed("7"), boxed("86 + 87"), boxed("9 \\times 14"), boxed("9 \\times 14")],
                                ["7", "86 + 87", "126", "9 \\times 14"], ["math"] * 4,
                                questions=["Which is largest: 3, 7 or 5?", "Write 86 + 87 as a sum.",
                                           "Compute $9 \\times 14$.", "What is the product, unevaluated?"])
    assert [s.reason for s in scores] == ["ok", "ok", "restated", "ok"], scores


def test_or_between_values_is_a_hedge_unless_the_gold_is_a_list():
    assert verify.hedged("4", "The answer is 4 or -1.") and verify.hedged("4", "It is 4 or x = -1.")
    assert not verify.hedged("4", "The answer is 4 or -1.", gold_is_list=True)
    assert not verify.hedged("4", "The answer is 4. Maybe 24 was a slip.")  # another sentence
    assert not verify.hedged("4", "The answer is 4, and 4.5 or 6 were never in doubt", gold_is_list=True)


def test_a_negating_word_inside_a_box_cuts_nothing():
    for text in ["\\boxed{\\text{not } 5}", "So $\\boxed{x \\text{ is not } 5}$.", "$\\boxed{\\text{never} 3}$"]:
        assert verify.without_denials(text) == text
    assert verify.without_denials("It is not \\boxed{5}, it is \\boxed{6}.") == "It is , it is \\boxed{6}."


@pytest.mark.parametrize("response", ["The answer is NOT 108.", "Not 108.", "NEVER 108", "It ISN'T 108"])
def test_a_denial_in_capitals_denies(response):
    score = verify.score_batch([response], ["108"], ["math"])[0]
    assert (score.reward, score.reason) == (0.0, "denied"), score


def test_boxes_stand_together_up_to_40_characters_apart():
    for gap, together in ((40, True), (41, False)):
        between = " " + "y" * (gap - 2) + " "  # no rejecting word, exactly `gap` characters
        text = "\\boxed{1}" + between + "\\boxed{2}"
        assert len(text) - len("\\boxed{1}") - len("\\boxed{2}") == gap
        assert verify.final_boxes(text) == (["1", "2"] if together else ["2"]), gap


REJECTING_WORDS = ["no", "not", "but", "fails", "fail", "failed", "rejected", "rejecting", "discarded", "extraneous",
                   "invalid", "wrong", "except", "excluded", "however", "instead", "impossible", "cannot", "can't",
                   "isn't", "doesn't", "checking", "check", "wait", "undefined"]


@pytest.mark.parametrize("word", REJECTING_WORDS)
def test_each_rejecting_word_between_two_boxes_parts_them(word):
    assert verify.final_boxes(f"x = \\boxed{{-2}} {word} x = \\boxed{{3}}") == ["3"]
    assert verify.final_boxes(f"x = \\boxed{{-2}} x{word} x = \\boxed{{3}}") == ["-2", "3"]  # a word, not a piece


# What the rules still get wrong, each with its reason; the test fails when one is put right, so the list
# stays true. (gold, response, what a careful grader gives, what verify.py gives)
STILL_WRONG = {
    ("D", "$\\boxed{7}$"): (1.0, 0.0, "the value of the right option, boxed without its letter: the options are "
                                      "in the question, which the rule does not read"),
    ("14", "$\\boxed{2 \\cdot 7}$"): (0.0, 1.0, "a product of primes is a closed form by its shape (so that a "
                                               "factorisation such as 2 \\cdot 3 \\cdot 5 scores), even where "
                                               "the question wants the value"),
    ("\\frac{5}{6}", "$\\boxed{\\frac{1}{2} + \\frac{1}{3}}$"): (0.0, 1.0, "a sum of fractions is not read as "
                                                                          "undone: only sums of whole and "
                                                                          "decimal numbers, and like terms"),
    ("B", "Option B looks tempting, but adding up gives 7."): (0.0, 1.0, "a letter named in passing is read as "
                                                                         "the choice"),
    ("72", "I might be off by a little, but I am going with 72."): (1.0, 0.0, "an unsure word in the answer's "
                                                                               "sentence reads as a hedge"),
    ("4, -1", "The roots are x = 4 or x = -1."): (1.0, 0.0, "values joined by 'or' with no box are not read as "
                                                          "the list (math-verify reads the last one); the "
                                                          "hedge rule lets them pass, but the reading fails"),
}


@pytest.mark.parametrize("case", STILL_WRONG)
def test_what_the_rules_still_get_wrong(case):
    careful, ours, _ = STILL_WRONG[case]
    assert careful != ours
    assert verify.score_batch([case[1]], [case[0]], ["math"])[0].reward == ours


# ---------------------------------------------------------------------------------------------------
# Math: hostile inputs
# ---------------------------------------------------------------------------------------------------

HOSTILE_MATH = {  # name -> response; the gold is "7" and each must score 0 within the limit
    "unbalanced braces": "}}{{ so \\boxed{\\frac{7}{2} {{",
    "boxed nested 1000 deep": "\\boxed{" * 1000 + "8" + "}" * 1000,
    "empty boxed nested 1000 deep": "\\boxed{" * 1000 + "}" * 1000,
    "braces nested 400 deep": "\\boxed{" + "{" * 400 + "8" + "}" * 400 + "}",
    "power tower": "\\boxed{10^{10^{10^{10}}}}",  # a closed form sympy never finishes evaluating
    "power tower plus x": SLOW,  # sympy evaluates 10^(10^10^10) for ever
    "1 MB box": "\\boxed{" + "x+" * 500_000 + "}",
    "1 MB of text, small box": "lorem ipsum " * 90_000 + "\\boxed{8}",
    "NUL bytes and odd unicode": "\x00\\boxed{\x00\u202e\ud800\U0001f4a5\ufeff\x00}\x00",
    # the rules of issue 67 on hostile shapes: every denial cut, every box a denial's value, every hedge
    # (5000 of each: the rules are linear in the response; math-verify's parse of a long one is not)
    "5000 denials": "It is not 1, " * 5_000 + "so 8.",
    "denials of 5000 boxes": "not \\boxed{7}; " * 5_000,
    "5000 hedges": "maybe 7 or 8. " * 5_000,
    "5000 option letters": "option D, " * 5_000,
    "relation sympy cannot solve": "\\boxed{x^{x^{x}} > \\sin(x) + 7}",
}


@pytest.mark.parametrize("name", HOSTILE_MATH)
def test_hostile_math_item_returns_zero_in_time(name, warm_pool):
    start = time.monotonic()
    score = verify.score_batch([HOSTILE_MATH[name]], ["7"], ["math"], timeout=TIMEOUT)[0]
    assert time.monotonic() - start < TIMEOUT + SLACK
    assert score.reward == 0.0 and score.reason != "ok"


def test_hostile_items_do_not_stall_a_batch(warm_pool):
    responses = list(HOSTILE_MATH.values()) + [boxed("\\frac{7}{1}")] * 20
    start = time.monotonic()
    scores = verify.score_batch(responses, ["7"] * len(responses), ["math"] * len(responses),
                                timeout=TIMEOUT)
    # Two items time out (0.8 * TIMEOUT each in the worker); the rest are quick.
    assert time.monotonic() - start < 2 * TIMEOUT + SLACK
    assert [s.reward for s in scores] == [0.0] * len(HOSTILE_MATH) + [1.0] * 20
    assert verify.score_batch(["\x00 junk \ufeff \\boxed{7}\x00"], ["7"], ["math"])[0].reward == 1.0


def _worker_pids() -> list[int]:
    """Pids of this process's verify workers, found in /proc."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if parent == os.getpid() and b"_worker_main" in cmdline:
            pids.append(int(entry.name))
    return pids


def _ready_pool() -> list[int]:
    """Wait until every worker of the (default-size) pool is warm; return their pids."""
    deadline = time.monotonic() + 60
    verify.score_batch(["\\boxed{1}"], ["1"], ["math"])  # starts the pool if there is none
    while not all(w.ready for w in sandbox._pool) and time.monotonic() < deadline:
        verify.score_batch(["\\boxed{1}"], ["1"], ["math"])
    assert len(sandbox._pool) == len(os.sched_getaffinity(0))
    return _worker_pids()


def test_pool_is_reused_resized_and_shut_down():
    workers = _ready_pool()
    assert len(workers) == len(os.sched_getaffinity(0))
    verify.score_batch(["\\boxed{1}"] * 8, ["1"] * 8, ["math"] * 8)
    assert _worker_pids() == workers  # the same processes serve the next batch
    assert verify.score_batch(["\\boxed{2}"], ["2"], ["math"], workers=1)[0].reward == 1.0
    assert len(_worker_pids()) == 1 and set(_worker_pids()) <= set(workers)
    sandbox.shutdown()
    assert _worker_pids() == []
    assert list(Path(tempfile.gettempdir()).glob(f"{MINE}*")) == []  # scratch dirs removed
    assert verify.math_reward("\\boxed{3}", "3") == 1.0  # a fresh pool after a shutdown
    # Under torchrun the node's CPUs are shared among its LOCAL_WORLD_SIZE ranks.
    os.environ["LOCAL_WORLD_SIZE"] = str(2 * len(workers))
    try:
        assert verify.math_reward("\\boxed{4}", "4") == 1.0
        assert len(_worker_pids()) == 1
    finally:
        del os.environ["LOCAL_WORLD_SIZE"]


def test_unresponsive_worker_is_killed_at_the_deadline_and_replaced():
    """The parent's hard deadline: a worker that does not answer (stopped here, as if stuck in C)."""
    stuck = _ready_pool()
    for pid in stuck:
        os.kill(pid, signal.SIGSTOP)
    n = len(stuck)  # one item for each stopped worker: they all time out, in parallel
    start = time.monotonic()
    scores = verify.score_batch(["\\boxed{7}"] * n, ["7"] * n, ["math"] * n, timeout=TIMEOUT)
    assert time.monotonic() - start < TIMEOUT + SLACK
    assert scores == [verify.Score(0.0, 1, "timeout")] * n
    assert verify.score_batch(["\\boxed{7}"] * 4, ["7"] * 4, ["math"] * 4) == \
        [verify.Score(1.0, 1, "ok")] * 4
    alive = _worker_pids()
    assert not set(stuck) & set(alive) and len(alive) == n  # replaced, and no worker leaked


def _kill_busy_workers(times: int) -> threading.Thread:
    """In the background, SIGKILL the worker that has an item, `times` times (for a slow item)."""
    def kill():
        killed, deadline = set(), time.monotonic() + 60
        while len(killed) < times and time.monotonic() < deadline:
            for worker in list(sandbox._pool):
                if worker.item is not None and worker.process.pid not in killed:
                    time.sleep(0.3)  # let it get going
                    os.kill(worker.process.pid, signal.SIGKILL)
                    killed.add(worker.process.pid)
            time.sleep(0.02)
    killer = threading.Thread(target=kill)
    killer.start()
    return killer


@pytest.mark.parametrize("deaths, reason", [(1, "timeout"), (2, "error: verify worker died twice")])
def test_item_whose_worker_dies_is_retried_once(deaths, reason):
    """A worker killed mid-item (OOM killer, a crash): the item gets a second worker, not a third."""
    victims = _ready_pool()
    killer = _kill_busy_workers(deaths)
    score = verify.score_batch([SLOW], ["7"], ["math"], timeout=3.0)[0]
    killer.join()
    assert score.reward == 0.0 and score.reason.startswith(reason), score
    assert verify.score_batch([boxed("0.5")], ["\\frac12"], ["math"])[0].reward == 1.0
    assert len(set(victims) - set(_worker_pids())) == deaths


def test_interrupted_batch_leaves_no_stale_answers():
    """Ctrl-C during a batch: the workers still busy with it must not answer into the next one."""
    _ready_pool()
    n = len(sandbox._pool)
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        with pytest.raises(KeyboardInterrupt):
            verify.score_batch([SLOW] * n, ["7"] * n, ["math"] * n)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert verify.score_batch(["\\boxed{7}"] * n, ["7"] * n, ["math"] * n) == \
        [verify.Score(1.0, 1, "ok")] * n


# ---------------------------------------------------------------------------------------------------
# QA: SQuAD normalisation, exact match, F1, "Final Answer:" format
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, normalised", [
    ("The  Eiffel-Tower!", "eiffeltower"),
    ("An apple, a day.", "apple day"),
    ("  Barack   Obama's ", "barack obamas"),
    ("Theatre", "theatre"),  # "the" only as a whole word
])
def test_squad_normalize(text, normalised):
    assert verify.squad_normalize(text) == normalised


def test_exact_match_and_f1_hand_worked():
    assert verify.exact_match("the Eiffel Tower.", "Eiffel Tower") == 1.0
    assert verify.exact_match("Eiffel Towers", "Eiffel Tower") == 0.0
    assert verify.exact_match("la tour eiffel", ["Eiffel Tower", "La Tour Eiffel"]) == 1.0
    # pred tokens [eiffel, tower, in, paris], gold [eiffel, tower]: P = 2/4, R = 1 -> 2/3
    assert verify.f1_score("the Eiffel Tower in Paris", "Eiffel Tower") == pytest.approx(2 / 3)
    # "a" is an article: pred [b, c], gold [b, c, d]: P = 1, R = 2/3 -> 0.8
    assert verify.f1_score("a b c", "b c d") == pytest.approx(0.8)
    # bags of tokens: "paris" counts once in common -> P = 1/2, R = 1 -> 2/3
    assert verify.f1_score("Paris paris", "Paris") == pytest.approx(2 / 3)
    assert verify.f1_score("Tower Eiffel", "Eiffel Tower") == 1.0
    assert verify.f1_score("Paris", "Eiffel Tower") == 0.0
    assert verify.f1_score("Tower", ["Paris", "Eiffel Tower"]) == pytest.approx(2 / 3)


@pytest.mark.parametrize("response, answer, format_", [
    ("Step 1.\nFinal Answer: Paris.\nThanks!", "Paris.", 1),
    ("FINAL ANSWER:\n  Paris", "Paris", 1),
    ("Final Answer: Lyon\nhmm, no.\nFinal Answer: Paris", "Paris", 0),  # two answers: last counts
    ("Final Answer:", "", 0),
    ("The answer is Paris.", None, 0),
])
def test_qa_answer_and_format(response, answer, format_):
    assert verify.qa_answer(response) == answer
    assert verify.qa_format(response) == format_


def test_qa_through_score_batch():
    responses = ["Hop 1 ... hop 2.\nFinal Answer: The Eiffel Tower.", "Final Answer: Louvre",
                 "I think it is the Eiffel Tower."]
    golds = [["Eiffel Tower", "La Tour Eiffel"], "Eiffel Tower", "Eiffel Tower"]
    assert verify.score_batch(responses, golds, ["qa"] * 3) == [
        verify.Score(1.0, 1, "ok"), verify.Score(0.0, 1, "wrong"),
        verify.Score(0.0, 0, "no_final_answer")]


# ---------------------------------------------------------------------------------------------------
# Code: rewards, schema, and the sandbox
# ---------------------------------------------------------------------------------------------------

ADD_PROGRAM = "a, b = map(int, input().split())\nprint(a + b)"
ADD = f"```python\n{ADD_PROGRAM}\n```"


def score_code(program: str, reference, timeout: float = TIMEOUT) -> verify.Score:
    return verify.score_batch([f"Here is my solution.\n```python\n{program}\n```"], [reference],
                              ["code"], timeout=timeout)[0]


def test_code_reward_is_fraction_of_tests_passed():
    tests = {"inputs": ["1 2\n", "3 4\n", "10 -1\n", "0 0\n"], "outputs": ["3\n", "7\n", "9", "1\n"]}
    scores = verify.score_batch([ADD, ADD, "no code here"], [tests, json.dumps(tests), tests],
                                ["code"] * 3, timeout=TIMEOUT)
    assert scores[0] == verify.Score(0.75, 1, "passed 3/4; first failure test 3: wrong output")
    assert scores[1] == scores[0]  # the PRIME/Eurus JSON-string form
    assert scores[2] == verify.Score(0.0, 0, "no_code_block")
    # The right output followed by a crash is a failed test.
    crash = score_code("print(3)\nraise SystemExit(3)", {"inputs": [""], "outputs": ["3"]})
    assert crash == verify.Score(0.0, 1, "passed 0/1; first failure test 0: exit code 3")


def test_assert_tests():
    program = "def add(a, b):\n    return a + b"
    reference = {"asserts": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0",
                             "assert add(2, 2) == 5"]}
    score = score_code(program, reference)
    # the assert is checked outside the sandbox on the value add(2, 2) returned: a wrong output
    assert score.reward == pytest.approx(2 / 3) and "test 2: wrong output" in score.reason
    # Exiting early with status 0 must not pass the asserts that never ran, and a failing exit
    # status fails the test even after the harness printed its values.
    assert score_code("import sys\nsys.exit(0)", reference).reward == 0.0
    exit_3_at_the_end = program + "\nimport atexit, os\natexit.register(os._exit, 3)"
    assert score_code(exit_3_at_the_end, reference).reward == 0.0
    both_ways = ("import sys\ndef add(a, b):\n    return a + b\nwords = sys.stdin.read().split()\n"
                 "if words:\n    print(add(int(words[0]), int(words[1])))")
    mixed = {"inputs": ["2 3\n"], "outputs": ["5\n"], "asserts": ["assert add(1, 1) == 2"]}
    assert score_code(both_ways, mixed) == verify.Score(1.0, 1, "ok")
    assert score_code(both_ways, json.dumps(mixed)) == verify.Score(1.0, 1, "ok")


TWO_SUM = {"fn_name": "twoSum", "inputs": [[[2, 7, 11, 15], 9], [[3, 2, 4], 6], [[3, 3], 6]],
           "outputs": [[0, 1], [[1, 2]], [0, 1]]}  # the second wrapped in a one-element list, as TACO does


@pytest.mark.parametrize("program, reward", [
    # LeetCode style: a method of class Solution; a returned tuple equals the expected list
    ("class Solution:\n    def twoSum(self, nums, target):\n        seen = {}\n"
     "        for i, x in enumerate(nums):\n            if target - x in seen:\n"
     "                return (seen[target - x], i)\n            seen[x] = i", 1.0),
    # a plain function, right on two calls of three
    ("def twoSum(nums, target):\n    return [0, 1]", 2 / 3),
    # the wrong name, a crash, an early exit(0): no call passes
    ("def two_sum(nums, target):\n    return [0, 1]", 0.0),
    ("def twoSum(nums, target):\n    raise ValueError", 0.0),
    ("import sys\nsys.exit(0)\ndef twoSum(nums, target):\n    return [0, 1]", 0.0),
])
def test_call_based_tests(program, reward):
    """APPS/TACO/LeetCode call-based tests: reward = the fraction of calls whose return value equals
    the expected one (tuple = list at any depth; [x] also accepts x)."""
    score = score_code(program, TWO_SUM)
    assert score.reward == pytest.approx(reward)
    assert score_code(program, json.dumps(TWO_SUM)) == score  # the PRIME/Eurus JSON-string form


def test_call_based_comparison_rules_by_hand():
    nested = {"fn_name": "f", "inputs": [[]], "outputs": [[[1, 2], [3]]]}
    assert score_code("def f():\n    return ((1, 2), (3,))", nested).reward == 1.0  # nested tuples
    assert score_code("def f():\n    return [[1, 2], [3]]", nested).reward == 1.0  # the list itself
    assert score_code("def f():\n    return [1, 2]", nested).reward == 0.0  # nested[0] is [[1, 2], [3]]
    wrapped = {"fn_name": "f", "inputs": [[]], "outputs": [[7]]}
    assert score_code("def f():\n    return 7", wrapped).reward == 1.0  # [7] accepts 7 (TACO)
    assert score_code("def f():\n    return [7]", wrapped).reward == 1.0
    assert score_code("def f():\n    return 7.0000001", wrapped).reward == 0.0  # no float tolerance
    args = {"fn_name": "f", "inputs": [["a", 2, None]], "outputs": ["aa"]}  # JSON values as arguments
    assert score_code("def f(s, n, x):\n    return s * n if x is None else ''", args).reward == 1.0


def test_code_extraction_and_format_channel():
    two_blocks = "```python\nprint(0)\n```\nbetter:\n" + ADD
    with_example = "Input:\n```text\n1 2\n```\nOutput:\n```\n3\n```\nCode:\n" + ADD
    assert verify.extract_code(with_example) == "a, b = map(int, input().split())\nprint(a + b)\n"
    scores = verify.score_batch([ADD, two_blocks, with_example],
                                [{"inputs": ["1 2"], "outputs": ["3"]}] * 3, ["code"] * 3)
    assert [(s.reward, s.format) for s in scores] == [(1.0, 1), (1.0, 0), (1.0, 0)]


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match=r"kinds\[0\]"):
        verify.score_batch(["x"], ["1"], ["maths"])
    with pytest.raises(ValueError, match="differ in length"):
        verify.score_batch(["x", "y"], ["1"], ["math"])
    with pytest.raises(ValueError, match=r"references\[1\] \(kind 'code'\) has no tests"):
        verify.score_batch([ADD, ADD], [{"inputs": ["1"], "outputs": ["1"]}, {}], ["code"] * 2)
    for bad, message in (({"fn_name": "not a name", "inputs": [[1]], "outputs": [1]}, "'fn_name' must be"),
                         ({"fn_name": "f", "inputs": [[1], [2]], "outputs": [1]}, "of the same length"),
                         ({"fn_name": "f", "inputs": [], "outputs": []}, "non-empty"),
                         ({"fn_name": "f", "inputs": [1], "outputs": [1]}, r"inputs\[0\] must be the list of arguments"),
                         ({"fn_name": "f", "inputs": [[{1, 2}]], "outputs": [1]}, "must be JSON values")):
        with pytest.raises(ValueError, match=r"references\[0\] \(kind 'code'\).*" + message):
            verify.score_batch([ADD], [bad], ["code"])
    with pytest.raises(ValueError, match=r"references\[0\] \(kind 'qa'\)"):
        verify.score_batch(["Final Answer: x"], [None], ["qa"])


def _sandbox_leftovers() -> list[str]:
    """Processes running in one of our sandbox directories, and sandbox directories left over."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            uid = int((entry / "status").read_text().split("\nUid:")[1].split()[0])
        except (OSError, IndexError, ValueError):
            continue
        if MINE in cwd or sandbox.SANDBOX_UID_BASE <= uid < sandbox.SANDBOX_UID_BASE + (1 << 22):
            found.append(f"pid {entry.name} (uid {uid}) in {cwd}")  # a test's own user: a sandboxed program
    return found + [str(p) for p in sandbox_dirs()]


@pytest.fixture
def no_leftovers():
    before = set(_sandbox_leftovers())
    yield
    deadline = time.monotonic() + 3  # the kernel tears a PID namespace down asynchronously
    while set(_sandbox_leftovers()) - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert set(_sandbox_leftovers()) - before == set()


ONE_TEST = {"inputs": [""], "outputs": ["done"]}  # a hostile program must not get to print "done"

HOSTILE_CODE = {  # name -> (program, what stops it)
    "infinite loop": ("while True:\n    pass\nprint('done')", "timeout"),
    "sleep for ever": ("import time\ntime.sleep(10**6)\nprint('done')", "timeout"),
    "fork bomb": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
                  "        pass", "timeout"),
    "allocate 50 GB": ("x = bytearray(50 * 2**30)\nprint('done')", "exit code 1"),
    "allocate 2 GB": ("x = bytearray(2 * 2**30)\nprint('done')", "exit code 1"),  # > the 1 GiB limit
    "write a 32 MB file": ("open('big', 'wb').write(b'x' * (32 << 20))\nprint('done')", "exit code"),
}


@pytest.mark.parametrize("name", HOSTILE_CODE)
def test_hostile_program_scores_zero_in_time(name, no_leftovers):
    program, stopped_by = HOSTILE_CODE[name]
    start = time.monotonic()
    score = score_code(program, ONE_TEST)
    assert time.monotonic() - start < TIMEOUT + 1.0 + SLACK  # a test's limit + sandbox set-up
    assert score.reward == 0.0 and f"test 0: {stopped_by}" in score.reason, score
    assert score_code(ADD_PROGRAM, {"inputs": ["2 2"], "outputs": ["4"]}).reward == 1.0  # still fine


def test_process_count_is_limited(no_leftovers):
    program = ("import os, time\nfor k in range(100):\n    try:\n        if os.fork() == 0:\n"
               "            time.sleep(5)\n            os._exit(0)\n    except OSError:\n"
               "        print('limited')\n        break\nelse:\n    print('unlimited')")
    assert score_code(program, {"inputs": [""], "outputs": ["limited"]}).reward == 1.0


def test_program_cannot_kill_its_parent_or_the_workers(no_leftovers):
    workers = _ready_pool()
    targets = [] if sandbox.sandbox_mode() == "rlimits" else [os.getpid(), *workers]
    program = ("import os, signal\nfor pid in " + repr(targets) + " + [os.getppid()]:\n"
               "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n"
               "        pass\nprint('done')")
    score = score_code(program, ONE_TEST)
    if sandbox.sandbox_mode() == "rlimits":  # same user: it kills its parent, a worker, replaced
        assert score.reward == 0.0 and score.reason.startswith("error: verify worker died")
    else:  # as 'nobody' it cannot signal root's processes: every kill failed, it ran to the end
        assert score == verify.Score(1.0, 1, "ok")
        assert _worker_pids() == workers
    assert score_code(ADD_PROGRAM, {"inputs": ["2 2"], "outputs": ["4"]}).reward == 1.0  # still fine


def test_sandbox_sees_a_minimal_environment_only(no_leftovers):
    sandbox.shutdown()  # new workers inherit the secret below: the sandbox must still not see it
    os.environ["VERIFY_TEST_SECRET"] = "hunter2"
    try:
        program = "import os\nprint(os.environ.get('VERIFY_TEST_SECRET', 'absent'))"
        assert score_code(program, {"inputs": [""], "outputs": ["hunter2"]}).reward == 0.0
        worker = _worker_pids()[0]
        assert b"VERIFY_TEST_SECRET=hunter2" in Path(f"/proc/{worker}/environ").read_bytes()
        names = " ".join(sorted(sandbox.SANDBOX_ENV))
        assert score_code("import os\nprint(*sorted(os.environ))",
                          {"inputs": [""], "outputs": [names]}).reward == 1.0
    finally:
        del os.environ["VERIFY_TEST_SECRET"]
        sandbox.shutdown()


SLEEPER = "import time\ntime.sleep(600)"
SLEEPING_GRANDCHILD = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                       "        time.sleep(600)\n    os._exit(0)\ntime.sleep(600)")


@pytest.mark.parametrize("program", [
    SLEEPER,
    pytest.param(SLEEPING_GRANDCHILD, marks=pytest.mark.skipif(
        sandbox.sandbox_mode() != "namespaces", reason="needs a PID namespace")),
])
def test_worker_killed_mid_code_item_leaves_nothing_behind(program, no_leftovers):
    """The sandbox dies with the worker that started it (parent-death signals, PID namespace)."""
    _ready_pool()
    killer = _kill_busy_workers(2)
    score = score_code(program, ONE_TEST, timeout=30.0)
    killer.join()
    assert score.reward == 0.0 and score.reason.startswith("error: verify worker died"), score


@pytest.mark.skipif(sandbox.sandbox_mode() == "rlimits", reason="needs root to drop to 'nobody'")
def test_sandbox_cannot_write_outside_its_directory(tmp_path, no_leftovers):
    targets = [tmp_path / "escaped.txt", Path(__file__).resolve().parents[1] / "escaped.txt"]
    if sandbox.sandbox_mode() == "namespaces":  # only then is the world-writable /tmp private
        targets.append(Path(tempfile.gettempdir()) / f"verify-escape-{os.getpid()}.txt")
    program = (f"for target in {[str(t) for t in targets]!r}:\n    try:\n"
               "        open(target, 'w').write('x')\n    except OSError:\n        pass\n"
               "open('inside.txt', 'w').write('fine')\nprint('ran')")
    assert score_code(program, {"inputs": [""], "outputs": ["ran"]}).reward == 1.0  # it did run
    assert [t for t in targets if t.exists()] == []


@pytest.mark.skipif(sandbox.sandbox_mode() != "namespaces", reason="needs PID/network namespaces")
def test_sandbox_has_no_network(no_leftovers):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.5)
    port = server.getsockname()[1]
    program = ("import socket\ntry:\n"
               f"    socket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'hi')\n"
               "    print('connected')\nexcept OSError as error:\n    print('blocked')")
    try:
        assert score_code(program, {"inputs": [""], "outputs": ["blocked"]}).reward == 1.0
        with pytest.raises(TimeoutError):
            server.accept()
    finally:
        server.close()


def test_processes_that_leave_the_process_group_are_killed(no_leftovers):
    """Double-forked, setsid() sleepers escape a process-group kill, but not the worker, a child
    subreaper that kills all its children after each test (nor, here, the PID namespace)."""
    program = ("import os, time\nfor _ in range(5):\n    if os.fork() == 0:\n        os.setsid()\n"
               "        if os.fork() == 0:\n            time.sleep(600)\n        os._exit(0)\n"
               "print('done')")
    assert score_code(program, ONE_TEST).reward == 1.0  # it exits at once; its sleepers must go


# ---------------------------------------------------------------------------------------------------
# Math: one box per value, and spaced thousands (by hand; the equivalence set has more)
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, joined", [
    ("1 000", "1000"), ("1\\,000", "1000"), ("12 345 678", "12345678"), ("3\\,000\\,000.5", "3000000.5"),
    ("1, 000", "1, 000"),  # a comma and a space: a list
    ("2023 100", "2023 100"), ("1 2 3", "1 2 3"), ("1 0001", "1 0001"), ("0.5 000", "0.5 000"),
    ("x = 25 000 and y = 1 500", "x = 25000 and y = 1500"),
])
def test_spaced_thousands_are_joined_and_nothing_else(text, joined):
    assert verify.join_spaced_thousands(text) == joined


def test_every_closed_box_is_found_in_order():
    text = "a \\boxed{3} b \\fbox{x = \\frac{1}{2}} c \\boxed{\\boxed{5}} d \\boxed{7"
    assert verify._boxes(text) == ["3", "x = \\frac{1}{2}", "\\boxed{5}"]  # the unclosed last one is no box
    assert [verify._BOX_LHS.sub("", b) for b in ("x = 5", "d(3/5) = \\frac13", "x_1=2", "a+b=5", "-4")] == \
        ["5", "\\frac13", "2", "a+b=5", "-4"]


@pytest.mark.parametrize("response, gold, reward", [
    ("The roots are $\\boxed{3}$, $\\boxed{5}$, and $\\boxed{7}$.", "3, 5, 7", 1.0),  # issue 44's examples
    ("$x = \\boxed{0}$, $x = \\boxed{-1}$, and $x = \\boxed{-\\frac{3}{2}}$", "0,-1,-\\frac{3}{2}", 1.0),
    ("$d(3/5) = \\boxed{\\frac{1}{3}}$, $d(5/8) = \\boxed{1}$, and $d(7/18) = \\boxed{9}$", "\\frac{1}{3}, 1, 9", 1.0),
    ("Try $\\boxed{3}$; no: $\\boxed{5}$, $\\boxed{7}$ and $\\boxed{9}$ too.", "3, 5, 7", 0.0),  # an extra one
    ("$\\boxed{3}$ is one; then comes $\\boxed{7}$.", "3, 5, 7", 0.0),  # one missing
    ("Try $\\boxed{3}$, then $\\boxed{5}$, finally $\\boxed{7}$.", "7", 1.0),  # the last box alone, a value gold
    ("Try $\\boxed{3}$, then $\\boxed{5}$, finally $\\boxed{7}$.", "3", 0.0),  # not any box
])
def test_one_box_per_value_is_graded_on_every_box(response, gold, reward):
    assert verify.score_batch([response], [gold], ["math"])[0].reward == reward
    # the official grader's last-box rule is unchanged: the last box only
    last = verify.score_batch(["\\boxed{" + verify.extract_boxed(response) + "}"], [gold], ["math"])[0].reward
    assert verify.score_batch([response], [gold], ["math"], math_grader="official")[0].reward == last
