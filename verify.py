"""Outcome and format rewards: math answers, multi-hop QA answers and code, checked safely and fast.

The verifier is PRIME's only ground truth: every outcome reward r_o, every implicit-PRM label and
every filter decision comes from here. So it must be right, it must never hang, and nothing a model
writes may crash the training loop. Public API (train.py, eval.py and the tests use these names):

    score_batch(responses, references, kinds, *, questions=None, timeout=5.0, workers=None,
                math_grader="math-verify")
        Score(reward, format, reason): reward in [0, 1] (0/1 for math and QA, the fraction of tests
        passed for code), format 0/1 (a separate channel; PASS fuses it), reason "ok", "wrong",
        "no_boxed", "timeout", "error: ...", ...
        -> list[Score]
    math_reward(response, gold, math_grader) -> float   one math item (goes through score_batch)
    extract_boxed(text) -> str | None               content of the LAST \\boxed{...} / \\fbox{...}
    squad_normalize / exact_match / f1_score        SQuAD answer normalisation and metrics
    sandbox.sandbox_mode() -> str                   which code-sandbox defences this machine allows (sandbox.py)
    sandbox.shutdown()                              stop the worker pool (also runs at exit)

    >>> score_batch(["... so $\\boxed{\\frac12}$.", "Final Answer: the Eiffel Tower"],
    ...             ["0.5", ["Eiffel Tower"]], ["math", "qa"])
    [Score(reward=1.0, format=1, reason='ok'), Score(reward=1.0, format=1, reason='ok')]

References by kind:
- "math": the gold answer as a LaTeX string ("\\frac{1}{2}", "(3,\\pi/2)", "\\text{(C)}"); an int
  or float (AMC golds are floats) is accepted too. `$` signs around or inside it are ignored.
- "qa": the gold answer string, or a list of accepted aliases (the best match counts).
- "code": a dict of tests, or the same dict as a JSON string (the PRIME/Eurus `ground_truth` form):
      {"inputs": ["1 2\\n", ...], "outputs": ["3\\n", ...]}  one test per pair: stdin -> stdout
      {"asserts": ["assert add(1, 2) == 3", ...]}             one test per string, run after the code
      {"fn_name": "add", "inputs": [[1, 2], ...], "outputs": [3, ...]}   call-based (APPS/TACO,
          LeetCode): one call per argument list, of `Solution().add` if the program defines a
          `class Solution` with that method, else of the function `add`; the return value must
          equal the expected one (a tuple equals a list; `[3]` also accepts 3, as TACO stores it)
      {"assert_script": "my_solution = Solution()\\n...assert my_solution.f(**test_input) == 5 ..."}
          a benchmark's whole test script (LeetCode's 100 asserts), run once after the program, in one
          sandboxed process within one `timeout`; each assert must read `<expr> == <literal>`
  inputs/outputs and asserts may both be given (the tests add up); fn_name and assert_script stand alone.
  Options a benchmark's protocol adds to any of them: "header" (source put before the program: the
  imports the benchmark's harness provides), "pass_all": true (reward 1 if every test passes, else 0;
  the first failing test ends the run) and, for stdin tests, "compare": "lines" (LiveCodeBench's
  lenient line comparison, sandbox.lines_match, instead of whitespace-separated tokens).

Design
------
1. Math, two graders (`math_grader`; train.py and eval.py `--math-grader`). The gold is always
   parsed by math-verify as LaTeX (`\\boxed{<gold>}`, LatexExtractionConfig), and the answer is
   compared with `verify(gold, answer)`, which knows numbers, fractions, intervals, tuples, sets,
   matrices, `\\text{}` and `x=` answers. They differ in who finds the answer in the response:
   - "math-verify" (default): math-verify's own extraction reads the whole response (`parse` with
     its default targets, LaTeX and plain expressions): a boxed answer, several boxes close
     together read as one set (`\\boxed{-2} and \\boxed{1}` for the gold `1,-2`), a final answer with
     no box ("The final answer is $10,455$"). `\\fbox` is read as `\\boxed`. Reason "no_answer" when
     it finds nothing. A hedge such as `\\boxed{4} \\boxed{5}` (boxes close together) reads as {4, 5}
     and is wrong. When that reading is wrong, a gold that is a list of two or more values is also
     compared with the boxes that end the response standing together (final_boxes: "x = \\boxed{0},
     x = \\boxed{-1}, and x = \\boxed{2}" for "0, -1, 2"; a leading "x =" inside a box dropped): in any
     order, but the same elements, so an extra or a missing box scores 0, and a box the response
     rejects in words before its last ("\\boxed{-2}, but -2 fails, so \\boxed{3}") is not read. Digits
     grouped in threes by a space or a thin space read as one number ("1 000", "1\\,000"; "1, 000"
     stays a list). A full stop ending a box's content is dropped first ("\\boxed{173.}" answers 173).
     A response whose last box is never closed was cut off while writing its answer: it scores 0
     ("unclosed_boxed") under both graders, so no intermediate value ("9-9=0" in a toy chain whose
     gold is 0) is read in its place. A response with no box at all is read wherever math-verify
     finds an answer; `--filter-truncated` drops groups with responses cut at the length limit.
   - "official" (PRIME-RL's rule, for exact fidelity to the paper's runs): only the LAST
     `\\boxed{}`/`\\fbox{}`, braces matched, is the answer ("no_boxed", "unclosed_boxed",
     "empty_boxed" otherwise), then parsed as a box's content.
   Rules a careful grader applies (docs/verification.md gives each with what it does not do):
   - an answer that repeats an expression of the question ("restated", given `questions`; \\dbinom
     is \\binom) or leaves work undone ("unevaluated": a sum of plain numbers, a product of plain
     numbers that is no prime factorisation, like terms not combined; not_an_answer,
     leaves_work_undone) scores 0 under both graders; powers, roots, factorials, binomials,
     scientific notation and products of primes are closed forms. The rules read the answer stripped
     of layout and of the stop that ends its sentence ("82 is the answer to 82 + 89." was rewarded as
     171 until issue 53's runs found it), and read math-verify's parse too.
   - under both graders, a relation in one variable answers an interval gold by the set it describes
     ("x \\ge 5" for [5, \\infty)), a percent answers a gold without one ("7.5\\%" for 7.5), and a gold
     that is one option letter is answered by the letter (choice_letter, answered_letter); a value,
     or a box, a negating word denies is cut out with its clause before the answer is read
     (without_denials: "18, not 24" answers 18).
   - under the default grader only: boxes that end the response together read as a tuple, in order,
     for a tuple gold; a response with no box whose answer stands right after a negation scores 0
     ("denied"), and so does one that hedges in its answer's sentence ("hedged": "either 36 or 63").
   - how a value is written, read as a careful grader reads it ("Reading an answer as a careful
     grader reads it" below; notation, exact plain numbers, rounded golds, ±, words, units, order, a
     hedge after the last box): `notation` under both graders, the rules on the last box's content
     under both, the hedge after the box and labelled order under the default grader only.
   On tests/math_equivalence_cases.py (445 labelled cases, 332 from public graders' test suites) the
   math-verify reading agrees with the label on 438 (98.4%), the official rule on 288 (64.7%, most
   misses are answers outside a box); with the 79 cases of READ_CAREFULLY, scored with their
   questions, 517 of 524 and 363 (bench/grader_diff.py).
   No string shortcut: every answer goes through math-verify, so the real-data tests test it.
   The format channel (PASS's `math_format`) is the same rule under both graders: 1 iff the response
   has exactly one closed, non-empty box. So under math-verify a right answer in two boxes, or with
   no box, earns the outcome reward but not the format reward, and PASS's fusion sees both.
2. Worker pool. math-verify's own timeouts use SIGALRM, which only works in a main thread, and a
   pathological answer (`10^{10^{10^{10}}}`) can keep sympy busy for ever. So every math and code
   item runs in a small pool of persistent worker processes, each a fresh interpreter started with
   `subprocess` (a 'spawn' that does not re-import the caller's `__main__`: train.py may be a script
   without a main guard; and never a fork of a parent that has torch and its threads loaded). The
   pool is created lazily, reused across calls, and shut down at exit. Requests and answers are
   JSON lines on the worker's stdin/stdout; a worker has one item at a time.
3. Time limits, two of them. In the worker, a SIGALRM timer (0.8 * timeout) interrupts Python-level
   work (almost all of sympy), the item scores 0 with reason "timeout" and the worker lives on. In
   the parent, a hard deadline (timeout, counted from when the item was handed over) kills a worker
   that did not answer (stuck in C, stopped, swapped out) and starts a replacement in the
   background; the batch carries on with the other workers. If a worker dies, its item is tried
   once more on another worker, then scores 0 with "error: ...". So a hostile item costs at most
   `timeout` seconds of one worker (or two worker restarts), never an exception or a hang in the
   training loop. Caller errors (a wrong kind, a malformed reference) do raise ValueError, naming
   the item and the field: those are bugs to fix, not model outputs.
4. QA runs in the calling process: it is a few linear-time string operations.
5. Code runs in the workers, each test in its own sandboxed process (sandbox.py): the base
   interpreter (never a venv's; stdlib only), a minimal environment, CPU-time, memory (1 GiB a
   process), file-size (16 MB), open-file and process-count (32) limits, a wall-clock timeout
   (`timeout`, per test) that kills the whole process group. What the test expects never enters the
   sandbox: a call's return value, and each value an assert reads from the program, come back as
   the repr() of plain Python values (ast.literal_eval), and the worker compares them itself (the
   assert's comparison runs there, on those values). So no __eq__, patched module, frame walk or
   early exit can pass a test the program did not solve. `fn_name` must be the program's own name
   (a builtin it never defined is not called); an empty test, an assert that reads nothing from the
   program, or a reference nested past Python's limits is a ValueError at load time.
   `sandbox_mode()` picks the strongest defences the machine allows; train.py prints it at start-up
   and `--sandbox namespaces` refuses to run without the first:
   - "namespaces" (root, unshare and mount work): new PID, network, IPC and mount namespaces; the
     program runs chrooted in a fresh tmpfs (64 MB, 2048 inodes, gone with the namespace) holding
     /usr, /lib*, the interpreter's prefix (bound read-only, wherever Python lives), four /dev nodes
     and empty /tmp and /work: it cannot see your checkout, your data, /run, /proc or other users'
     files, has no network and no shared memory that outlives it, and when the sandbox's first
     process dies the kernel kills everything the program started.
   - "nobody" (root, no namespaces): the same limits, run as a user of its own; no network or
     filesystem isolation (sandbox.MODE_GAPS says what is open), and a warning at start-up.
   - "rlimits" (not root): only the limits, the process group and the minimal environment. The
     program runs as your user: it can read and write what you can. Use a container for RL on code.
   As root, each test runs as a user of its own (uid 200000 + the worker's pid), so its 32
   processes are its own (a hog cannot starve a sibling) and it cannot signal or read another
   test's processes. In every mode the worker is a child subreaper: whatever a program leaves
   running is re-parented to the worker, which kills and reaps all its children after each test.
   Directories are removed with `rm -rf` (any depth), and a replaced worker's scratch directory in
   the background, never file by file in the trainer's thread. Memory: 1 GiB of address space a
   process, and where a cgroup-v1 memory controller is writable (root; this project's machines), 2
   GiB for all of one test's processes together (a cgroup per worker, the OOM killer stops the test
   there); elsewhere a test may hold 32 x 1 GiB. "nobody" and "rlimits" keep what MODE_GAPS lists;
   tests/test_sandbox.py holds the attacks, one per class.
6. Linux only: resource limits, prctl and /proc.

Where we differ from the official PRIME math grader (the PRIME team's, as veRL ships it: github.com/volcengine/verl,
`verl/utils/reward_score/prime_math/`)
1. Equivalence by math-verify instead of the official chain (normalised string match, sympy
   simplify of the difference, numeric check at 1e-4 relative tolerance with percentage variants).
   math-verify rounds numbers to 6 decimals: 3.1416 != \\pi and 0.33333 != 1/3 here, while the
   official 1e-4 relative tolerance accepts both.
2. Extraction (default "math-verify") is math-verify's, not the official "answer is" / last-box
   rule; with --math-grader official only a boxed answer counts, with no "the answer is ..."
   fallback, `\\boxed 5` without braces is not read (reason "no_boxed"), and where the official
   grader reads `\\fbox` only when there is no `\\boxed` we take whichever comes last. As in the
   official code, if the last box is not closed (a truncated response) there is no answer, even if
   an earlier box was complete.
3. Failures score 0 (the official code scored a global failure 0.5, a bug) and the time limit is
   per item (default 5 s) instead of 1 s per sympy call and 300 s per sample.
4. A last box longer than MAX_ANSWER_CHARS scores 0 without parsing ("answer_too_long"), under both
   graders; the longest gold in our benchmarks has 210 characters.
5. The format channel is ours (PASS's): exactly one final answer in the expected form.
QA: PASS's training reward is a case-insensitive exact match with terminal periods stripped; we use
SQuAD normalisation (also drops punctuation and articles) for training and evaluation alike.
Code: outputs are compared token by token (whitespace-insensitive), with no float tolerance.
"""

import bisect
import json
import logging
import os
import re
import resource
import signal
import string
import sys
from collections import Counter
from dataclasses import dataclass

import sandbox

KINDS = ("math", "code", "qa")
MATH_GRADERS = ("math-verify", "official")  # who finds the answer in a math response (see "Math" below)
DEFAULT_TIMEOUT = 5.0        # seconds per math/QA item, and per test of a code item
SOFT_TIMEOUT_FRACTION = 0.8  # the worker interrupts itself at 0.8 * timeout; the parent kills at 1.0
MAX_ANSWER_CHARS = 1000      # longer boxed answers are not parsed (the longest real gold is 210)
WORKER_MEMORY_BYTES = 4 << 30   # address-space limit of a math worker: sympy blow-ups -> MemoryError

@dataclass(frozen=True)
class Score:
    reward: float  # outcome reward r_o in [0, 1]
    format: int    # 1 if the response has exactly one final answer in the expected form, else 0
    reason: str    # "ok" when reward is 1, otherwise why not ("wrong", "timeout", "error: ...")


# ---------------------------------------------------------------------------------------------------
# Math: answer extraction and format (run in the calling process: string scans, linear time)
# ---------------------------------------------------------------------------------------------------

_BOX_START = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE = re.compile(r"[{}]")
_UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")
_FBOX = re.compile(r"\\fbox\s*\{")
# An answer is a value that answers the question. math-verify reads "86 + 87" as the sum 173, so a
# response that restates the question "What is 86 + 87?" would score as its answer, and a policy finds
# that: SmolLM2's two-digit sums runs learned to answer "86 + 87" (issue 43, seed 2). Two rules, under
# both graders: an answer that repeats an expression written in the question is no answer (reason
# "restated"; score_batch needs the questions for it), and neither is a sum or difference of plain
# numbers (reason "unevaluated": an addition left undone), unless the gold is written so too. Powers,
# products and what combines them are closed forms: 2^{10}, 3 \times 10^8, 2^{10}-1, (-1)^{2023}, 2 \cdot 3 \cdot 5.
# Both rules compare expressions stripped of layout (_bare): spacing (\quad, \, and the like), $ and \$,
# \displaystyle, \left and \right, braces, \text{} units and trailing unit words; x, \cdot and \times are *.
_NUMBER = r"\(*[-+]?\d+(?:\.\d+)?\)*"
_SUM = re.compile(rf"{_NUMBER}(?:[-+]{_NUMBER})+")
_UNITS = re.compile(r"\\(?:text|textbf|textrm|textit|mathrm|mbox|operatorname)\s*\{[^{}]*\}")
_UNIT_WORDS = re.compile(r"(?<=[\d})])\s+[A-Za-z]{2,}(?:\s+[A-Za-z]+)*[.\s]*$")  # "86 + 87 apples"
_TIMES = re.compile(r"\\times|\\cdot|\\ast|×|·")
_LAYOUT = re.compile(r"\\\$|\\displaystyle|\\textstyle|\\left|\\right|\\q?quad|\\[,;:! ]|\s+|[{}$~]")
# an operation: a sign in front is not one; a function applied (\binom{9}{4}, \log_3 81, 5!) is
_OPERATOR = re.compile(r"(?<=.)[-+*/^!]|\\frac|\\sqrt|\\binom|\\log|\\ln|\\sin|\\cos|\\tan")
_INSIDE = set("0123456789.^*/+-")  # what would make a match in the question a piece of a longer expression
_SENTENCE_END = ".,;:?"  # what may end the sentence an answer stands in; math-verify extracts "86 + 87."
# ("!" is not there: after a number it is a factorial)


def _bare(expression: str) -> str:
    """An expression without its layout, for comparing how two are written: "\\displaystyle 86 \\quad +
    \\$87 \\text{ apples}" -> "86+87"; "16 \\times 3" -> "16*3"; "2^{10}" -> "2^10"."""
    text = _UNIT_WORDS.sub("", _UNITS.sub("", expression))
    text = _TIMES.sub("*", text).replace("\\div", "/").replace("÷", "/").replace("−", "-")
    for variant, plain in (("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\dbinom", "\\binom"), ("\\tbinom", "\\binom")):
        text = text.replace(variant, plain)
    text = _LAYOUT.sub("", text)
    return text.rstrip(_SENTENCE_END)  # "86 + 87." restates 86 + 87 (issue 53: a policy found the stop)


def unevaluated(answer: str) -> bool:
    """Whether an extracted answer is a sum or difference of plain numbers ("86 + 87", "3 - 5",
    "\\left(2+3\\right)"): an addition left undone, not a value ("173", "-5", "\\frac{1}{2}",
    "3+2\\sqrt{2}", and the closed forms "2^{10}", "3 \\times 10^8", "2^{10}-1", "2 \\cdot 3 \\cdot 5")."""
    return bool(_SUM.fullmatch(_bare(answer)))


def restated(answer: str, question: str, gold: str = "") -> bool:
    """Whether an extracted answer repeats an expression written in the question ("86 + 87" for "What
    is $86+87$?", "2^{10}" for "Compute $2^{10}$.") instead of answering it: it has an operator, and it
    stands in the question as a whole expression, not as a piece of a longer one ("2^9+1" is not
    restated from "2^{10} - 2^9 + 1"). A gold that is itself an expression of the question ("Which is
    larger, 2^{10} or 10^3?") is answered by repeating it. No question (""), nothing is restated."""
    bare, text = _bare(answer), _bare(question)
    while bare[:1] == "(" and bare[-1:] == ")" and "(" not in bare[1:-1] and ")" not in bare[1:-1]:
        bare = bare[1:-1]  # "\\left( 86+87 \\right)" restates 86 + 87
    if not question or not _OPERATOR.search(bare):
        return False
    if _OPERATOR.search(_bare(gold)) and _bare(gold) in text:
        return False
    start = text.find(bare)
    while start >= 0:
        end = start + len(bare)
        after = text[end:end + 2]  # a full stop ends a sentence; a decimal point is followed by a digit
        if (start == 0 or text[start - 1] not in _INSIDE) and \
                (not after or after[0] not in _INSIDE or (after[0] == "." and not after[1:].isdigit())):
            return True
        start = text.find(bare, start + 1)
    return False


def adds_plain_numbers(parsed) -> bool:
    """Whether what math-verify parsed (a sympy expression, left unevaluated) is a sum or difference of
    plain numbers: the same rule as `unevaluated`, read from the parse, not the string, so no layout
    math-verify reads past ("86 + 87.", "86 + 87 \\ldots") hides the addition, and a factor or an
    exponent of 1 ("86 + 87 \\cdot 1", "(86 + 87)^1", "-(86 + 87)") changes nothing."""
    from sympy import Add, Float, Integer, Mul, Pow  # only workers import sympy

    def without_ones(e):
        if isinstance(e, Mul) and len(rest := [a for a in e.args if a != 1]) == 1:
            return without_ones(rest[0])
        if isinstance(e, Mul) and len(e.args) == 2 and e.args[0] == -1 and isinstance(e.args[1], Add):
            return without_ones(e.args[1])  # -(86 + 87): as undone as 86 + 87
        return without_ones(e.args[0]) if isinstance(e, Pow) and e.args[1] == 1 else e

    def plain(term) -> bool:  # 35, 35.0, or -35 as "- 35" parses (Mul(-1, 35))
        term = without_ones(term)
        return isinstance(term, (Integer, Float)) or \
            (isinstance(term, Mul) and len(term.args) == 2 and term.args[0] == -1 and plain(term.args[1]))

    parsed = without_ones(parsed)
    return isinstance(parsed, Add) and all(plain(term) for term in parsed.args)


# A response with no box is read where math-verify finds its answer, often its last number, whatever the
# words around it say: "The answer is not 108." reads as 108, and so did "52 + 56 is not 108, so you
# should add 5 to 108.", rewarded in issue 53's two-digit sums runs. A value the response denies is not
# its answer (reason "denied"): the value written right after a negation ("not", "n't", "never", \neq,
# ≠, !=), a few set words allowed between ("is not equal to 108", "can't be $108$"). Only without a box:
# a box is the response's own choice of answer, and words before it may be a rejected first try.
_SET_WORDS = r"(?:\s+(?:be|equal|equals|to|the|a|answer|sum|result|value|total|exactly|simply|just|is)\b)*[\s$]*"
_DENIAL = re.compile(r"(?:\bnot\b|n't\b|\bnever\b|\\neq?(?![a-zA-Z])|≠|!=)" + _SET_WORDS, re.IGNORECASE)


def _as_a_whole(answer: str):
    """The answer's text as a pattern of a whole value, not a piece of a longer number ("108" is not in
    "1080" or "108.5"); None for an empty answer."""
    value = re.escape(answer.strip().strip("$").strip())
    return re.compile(rf"(?<![\d.]){value}(?!\d|[.,]\d)") if value else None


def denied(answer: str, response: str) -> bool:
    """Whether the response denies the answer math-verify read from it: the answer's text stands right
    after a negation (_DENIAL), as a whole number, not the start of a longer one. "The answer is not
    108." denies 108; "It is 108, not 113." and "not 1080" do not."""
    whole = _as_a_whole(answer)
    return whole is not None and any(whole.match(response, m.end()) for m in _DENIAL.finditer(response))


def leaves_work_undone(parsed) -> bool:
    """Whether what math-verify parsed (left unevaluated) still holds a computation a competition grader
    expects done: a product of two or more plain numbers that is not a prime factorisation ("9 \\times 14",
    "8 \\cdot 13", "5 \\cdot \\frac{2}{3}"), a factor that is a sum of plain numbers ("4(11+6)"), or like
    terms not combined ("49\\pi - 16\\pi"). Closed forms are values: powers, roots, factorials and
    binomials ("2^{10}", "\\sqrt{8}", "5!", "3 \\cdot 2^{10}"), one number times a power of ten
    ("3 \\times 10^8"), a product of primes ("2 \\cdot 3 \\cdot 5"), a percent ("7.5\\%" parses as a
    product with 1/100, marked unevaluated) and unlike terms ("3 + 2\\sqrt{2}", "2^{10} - 1")."""
    from sympy import Add, Float, Integer, Mul, Rational, UnevaluatedExpr, isprime  # only workers import sympy

    if parsed is None:
        return False
    if isinstance(parsed, Mul):
        factors = [f for f in parsed.args if f != -1 and not isinstance(f, UnevaluatedExpr)]
        if any(isinstance(f, Add) and adds_plain_numbers(f) for f in factors):
            return True
        plain = [f for f in factors if isinstance(f, (Rational, Float))]  # an Integer is a Rational
        return len(plain) >= 2 and not all(isinstance(f, Integer) and isprime(abs(int(f))) for f in plain)
    if isinstance(parsed, Add):
        symbolic = [term.doit().as_coeff_Mul()[1] for term in parsed.args]
        symbolic = [part for part in symbolic if part != 1]
        return len(symbolic) != len(set(symbolic))  # two terms in pi (or in sqrt 2, or in x): like terms
    return False


def not_an_answer(answer: str, gold: str, question: str, parsed=None, gold_parsed=None) -> str:
    """The reason an extracted answer is no answer to `question` whatever its value ("restated",
    "unevaluated"), or "" when it is one. `parsed`, `gold_parsed`: math-verify's readings of the answer
    and of the gold, when there are any; what the gold itself leaves undone, an answer may too."""
    if restated(answer, question, gold):
        return "restated"
    if (unevaluated(answer) or adds_plain_numbers(parsed)) and not unevaluated(gold):
        return "unevaluated"
    if leaves_work_undone(parsed) and not (unevaluated(gold) or leaves_work_undone(gold_parsed)):
        return "unevaluated"
    return ""


# A value a negation denies is not the response's answer, and neither is what follows it in the same
# clause: "It is 18, not 24 (which does not divide 54)." answers 18; "So the answer is not $\\frac14$; it is
# $\\frac16$." answers 1/6; "It is certainly not \\boxed{20}; the count is 18." answers 18, not the box. A
# denial here is a word ("not", "n't", "never", with _DENIAL's set words after it), outside any box,
# followed by something that starts like a value (a digit, a box, \\frac, \\sqrt; a $ may open it); its
# clause runs to the next , ; : ? ! or line break, a full stop (not a decimal point or a thousands comma),
# or a word that turns to the value meant ("but", "instead", "rather", "which", "it's", "it is"). (\\ne and != are
# relations, "x \\ne 2" an answer: they deny only through `denied`.)
_WORD_DENIAL = re.compile(r"(?:\bnot\b|n't\b|\bnever\b)" + _SET_WORDS, re.IGNORECASE)
_VALUE_START = re.compile(r"\\boxed|\\fbox|\\\(|\\frac|\\dfrac|\\sqrt|[-−]?\.?\d")
_VALUE_TOKEN = re.compile(r"\$[^$]*\$|[^\s,;:?!]*?(?=[\s,;:?!]|\.(?!\d)|$)")  # "$\\frac14$", "24", "108.5"
_REMARK = re.compile(r"\s*\([^()]*\)")  # " (which does not divide 54)"
_CLAUSE_END = re.compile(r"[;:?!\n]|[,.](?!\d)|\b(?:but|instead|rather|which|it'?s|it is)\b")


def without_denials(response: str) -> str:
    """The response with each denied value cut out, up to the end of its clause (see above); a remark in
    parentheses right after the value goes with it ("not 24 (which does not divide 54)")."""
    denials = list(_WORD_DENIAL.finditer(response))
    if not denials:  # most responses: nothing to scan for boxes
        return response
    boxes = _box_spans(response)
    box_starts = [start for start, _ in boxes]
    cuts, position = [], 0
    for m in denials:
        inside = bisect.bisect_left(box_starts, m.start()) - 1  # the last box that opens before the word
        if m.start() < position or not _VALUE_START.match(response, m.end()) or \
                (inside >= 0 and m.start() < boxes[inside][1]):
            continue
        end = m.end()
        if (box := _BOX_START.match(response, end)) is not None:  # the box is the value, braces matched
            close = _box_end(response, box.end())
            end = len(response) if close is None else close + 1
        else:
            end = _VALUE_TOKEN.match(response, end).end()
        if (remark := _REMARK.match(response, end)) is not None:
            end = remark.end()
        clause_end = _CLAUSE_END.search(response, end)
        position = clause_end.start() if clause_end else len(response)
        cuts.append((m.start(), position))
    kept, position = [], 0
    for start, end in cuts:  # one join: linear in the response's length, however many cuts
        kept.append(response[position:start])
        position = end
    return "".join(kept) + response[position:]


# A response with no box that offers two values, or is unsure of the one it gives, commits to none:
# "either 36 or 63", "probably 72, but it might be 78", "4 or -1" (unless the gold is itself a list of
# values, where "x = 4 or x = -1" names them). Read in the sentence where the answer stands.
_HEDGE = re.compile(r"\b(?:either|probably|perhaps|maybe|might|possibly|likely|guess|unsure|not sure|depending)\b",
                    re.IGNORECASE)
_OR_VALUES = re.compile(r"(?<![\w.])[-−]?\d+(?:\.\d+)?\$?\s+or\s+\$?(?:[a-z]\s*=\s*)?[-−]?\d")
_SENTENCE_BREAK = re.compile(r"[.!?](?=\s|$)|\n")


def hedged(answer: str, response: str, gold_is_list: bool = False) -> bool:
    """Whether the sentence of `response` where the answer `answer` last stands hedges (see above)."""
    whole = _as_a_whole(answer)
    found = list(whole.finditer(response)) if whole else []
    if not found:
        return False
    start, end = found[-1].start(), found[-1].end()
    breaks = [m.end() for m in _SENTENCE_BREAK.finditer(response, 0, start)]
    after = _SENTENCE_BREAK.search(response, end)
    sentence = response[breaks[-1] if breaks else 0:after.start() if after else len(response)]
    return bool(_HEDGE.search(sentence)) or (not gold_is_list and bool(_OR_VALUES.search(sentence)))


# Multiple choice. A gold that is one option letter ("D", "(D)", "\\text{(D)}") is answered by the letter:
# a box that starts with an option's label ("\\boxed{\\textbf{(D)}\\ 7}", "\\boxed{(D)}", "\\boxed{C. x = 42}"),
# or without a box, the last "option D", "choice (D)", "answer is D" or "answer: D" of the response. A
# wrong letter beside the right value is wrong.
_CHOICE_GOLD = re.compile(r"^\s*\$?\s*(?:\\(?:text|textbf|mathrm|mathbf)\s*\{\s*)?\(?\s*([A-E])\s*\)?\s*\}?\s*\$?\s*$")
_CHOICE_BOX = re.compile(r"^\s*(?:\\(?:text|textbf|mathrm|mathbf)\s*\{\s*\(?\s*([A-E])\s*\)?\s*\}|\(\s*([A-E])\s*\)"
                         r"|([A-E])(?=[.:)]|\s*$))(?=\s|\\[ ,;:]|~|[.:)]|$)")  # a label, then no operator ("E*2")
_CHOICE_WORDS = re.compile(r"(?i:\b(?:option|choice|answer)(?:\s+choice)?\s*(?:is\s*|:\s*|=\s*)?)\$?\s*"
                           r"(?:\\(?:text|textbf|mathrm|mathbf)\s*\{\s*)?\(?([A-E])\)?(?![A-Za-z])")


def choice_letter(gold: str) -> str:
    """The option letter a gold names ("D", "(D)", "\\text{(D)}" -> "D"), or "" when it is no letter."""
    m = _CHOICE_GOLD.match(gold)
    return m.group(1) if m else ""


def box_letter(content: str) -> str:
    """The option letter a box's content starts with as a label ("\\textbf{(D)}\\ 7" -> "D"), or ""."""
    m = _CHOICE_BOX.match(content)
    return next((g for g in m.groups() if g), "") if m else ""


def answered_letter(response: str) -> str:
    """The option letter a response commits to (see above), or "" when it names none that way."""
    boxes = _boxes(response)
    if boxes:
        return box_letter(boxes[-1])
    found = _CHOICE_WORDS.findall(response)
    return found[-1] if found else ""


def _last_box(text: str) -> tuple[str | None, int, str]:
    """(content of the last box or None, number of boxes, reason when None).

    Like the official `last_boxed_only_string`: find the LAST box opening, then match braces
    (every `{` and `}` counts, escaped or not) until the depth returns to 0. Iterative, so a box
    nested 1000 deep is as cheap as any other; the content of `\\boxed{\\boxed{5}}` is "5".
    """
    starts = [m.end() for m in _BOX_START.finditer(text)]
    if not starts:
        return None, 0, "no_boxed"
    end = _box_end(text, starts[-1])
    return (text[starts[-1]:end], len(starts), "") if end is not None else (None, len(starts), "unclosed_boxed")


def _box_end(text: str, start: int) -> int | None:
    """Where the box whose content starts at `start` closes (its `}`), braces matched; None if never."""
    depth = 1
    for brace in _BRACE.finditer(text, start):
        depth += 1 if brace.group() == "{" else -1
        if depth == 0:
            return brace.start()
    return None


def _box_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of every closed outermost box: its opening command and its closing brace, in order
    (braces matched as in _last_box)."""
    found, position = [], 0
    while (start := _BOX_START.search(text, position)) is not None:
        end = _box_end(text, start.end())
        if end is None:  # unclosed: nothing after it is a box either
            break
        found.append((start.start(), end))
        position = end + 1
    return found


_STOP_IN_BOX = re.compile(r"(?<![.\\])\.\s*$")  # one full stop ending a box's content, not "..." or "\\."


def drop_box_stops(text: str) -> str:
    """Every box's content without the full stop that ends its sentence ("\\boxed{173.}" -> "\\boxed{173}"),
    which math-verify cannot parse; "\\boxed{1, 2, 3, ...}" keeps its dots."""
    for start, end in reversed(_box_spans(text)):
        content_start = _BOX_START.match(text, start).end()
        text = text[:content_start] + _STOP_IN_BOX.sub("", text[content_start:end]) + text[end:]
    return text


def _box_content(text: str, span: tuple[int, int]) -> str:
    """What a box of _box_spans holds, between its opening brace and its closing one."""
    return text[_BOX_START.match(text, span[0]).end():span[1]]


def _boxes(text: str) -> list[str]:
    """The contents of every closed outermost box, in order."""
    return [_box_content(text, span) for span in _box_spans(text)]


# Between two boxes that state one answer together: a few words of connection ("and", ", then", "; the
# other is", "x =", "g(3) ="), nothing that rejects a value or goes on reasoning.
_REJECTING = re.compile(r"\b(?:not?|but|fails?|failed|reject\w*|discard\w*|extraneous|invalid|wrong|except|"
                        r"exclud\w*|however|instead|impossible|cannot|can't|isn't|doesn't|check\w*|wait|"
                        r"undefined)\b", re.IGNORECASE)
_MAX_BETWEEN = 40  # characters of connection; "$, while $g(3) = $" is 17


def final_boxes(text: str) -> list[str]:
    """The contents of the boxes that end `text` standing together: the last box, and each box before it
    while what stands between the two is short (at most _MAX_BETWEEN characters) and rejects nothing
    (no "but", "not", "fails", "extraneous", "check", ...). "x = \\boxed{-2} fails; x = \\boxed{3}" ->
    ["3"]; "x = \\boxed{0}, x = \\boxed{-1}, and x = \\boxed{2}" -> ["0", "-1", "2"]. What follows the last
    box is not read: a rejection written after the boxes ("... \\boxed{3}. But -2 fails.") is not seen."""
    spans = _box_spans(text)
    if not spans:
        return []
    group = [spans[-1]]
    for span in reversed(spans[:-1]):
        between = text[span[1] + 1:group[0][0]]
        if len(between) > _MAX_BETWEEN or _REJECTING.search(between):
            break
        group.insert(0, span)
    return [_box_content(text, span) for span in group]


# "x = " or "f(3/5) = " at the start of a box: the value is what follows
_BOX_LHS = re.compile(r"^\s*[A-Za-z](?:_\{?\w+\}?)?(?:\s*\([^()=]*\))?\s*=\s*")
# digits grouped in threes by a space or a thin space (\, \: \; ~ or "\ "): 1 000 and 1\,000 are 1000;
# "1, 000" (a comma and a space) stays a list
_SPACED_THOUSANDS = re.compile(r"(?<![\d.,])\d{1,3}(?:(?: |\\[,:; ]|~)\d{3})+(?![\d])")
_THOUSANDS_SPACE = re.compile(r" |\\[,:; ]|~")


def join_spaced_thousands(text: str) -> str:
    """"1 000 000" and "1\\,000" -> "1000000" and "1000"; lists and other numbers are left alone."""
    return _SPACED_THOUSANDS.sub(lambda m: _THOUSANDS_SPACE.sub("", m.group()), text)


def extract_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, None if there is none.

    "so $x = \\boxed{\\frac{1}{2}}$." -> "\\frac{1}{2}";  "\\boxed{5" (unclosed) -> None.
    """
    return _last_box(text)[0]


def math_format(response: str) -> int:
    """Format reward for math: 1 iff the response has exactly one box, closed and not empty."""
    content, n_boxes, _ = _last_box(response)
    return int(n_boxes == 1 and content is not None and content.strip() != "")


def _clean_latex(answer: str) -> str:
    """Drop unescaped `$` (OlympiadBench golds look like "$69$,$84$"), surrounding space and a final full
    stop ("$(-\\infty, 0) \\cup\\{1\\}$." is an OlympiadBench gold; "173." an answer)."""
    return _STOP_IN_BOX.sub("", _UNESCAPED_DOLLAR.sub("", answer).strip())


# ---------------------------------------------------------------------------------------------------
# Reading an answer as a careful grader reads it: notation, values in words, units, order, rounding
# ---------------------------------------------------------------------------------------------------
# Each rule is one function; docs/verification.md gives each in a sentence with what it does not do.
# notation() rewrites how a value is written, in the gold and in the response alike, before anything
# is parsed (both graders); the others read the last box's content (both graders) or, for a hedge
# written after the last box, the response (default grader only).

# 1. Scientific notation: e/E notation (Minerva's golds: 2.75e11, 1e-8), unicode superscripts and the
#    multiplication signs read as a x 10^{k}, which math-verify compares by value (2.75e11 read as
#    written is 2.75 * e * 11, Euler's number, which only e-notation matched).
_E_NOTATION = re.compile(r"(?<![\w.\\^])(\d+(?:\.\d*)?|\.\d+)[eE]([-+]?\d+)(?![\w.])")
_SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺", "0123456789-+")
_SUPERSCRIPT_RUN = re.compile(r"[⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺]+")
# 2. A number written inside \text{} ("\text{7.5 meters}"): the number outside, the words a unit.
_NUMBER_IN_TEXT = re.compile(r"\\(?:text|textrm|mbox)\s*\{\s*([-+]?\d[\d,]*(?:\.\d+)?)\s*([^{}]*)\}")
# 3. Layout: "2i\sqrt{2}" (an i run into a command), a repeating decimal "0.1\overline{6}", a column
#    vector against a coordinate tuple, a \left( whose \right lost its delimiter.
_I_BEFORE_COMMAND = re.compile(r"(?<=[\d}])\s*i\s*(?=\\[a-zA-Z])")
_REPEATING = re.compile(r"(?<![\d.])(-?)(\d*)\.(\d*)\\(?:overline|bar)\s*\{(\d+)\}")
_COLUMN_VECTOR = re.compile(r"\\begin\{[pb]matrix\}((?:[^&\\]|\\(?!\\|end))*?(?:\\\\(?:[^&\\]|\\(?!\\|end))*?)+)"
                            r"\\end\{[pb]matrix\}")
_LEFT = re.compile(r"\\left\s*([(\[])")
_BARE_RIGHT = re.compile(r"\\right(?![)\]|.\\]|\\\}|\\rangle)")


def _repeating_fraction(m: re.Match) -> str:
    """"0.1\\overline{6}" -> "\\frac{1}{6}": the digits before the bar and the repeating block as one fraction."""
    sign, whole, fixed, block = m.group(1), m.group(2) or "0", m.group(3), m.group(4)
    numerator = int(whole + fixed + block) - int(whole + fixed)
    denominator = (10 ** len(block) - 1) * 10 ** len(fixed)
    return f"{sign}\\frac{{{numerator}}}{{{denominator}}}"


def _column_tuple(m: re.Match) -> str:
    rows = [row.strip() for row in m.group(1).split("\\\\")]
    return "(" + ", ".join(row for row in rows if row) + ")"


def _close_bare_rights(text: str) -> str:
    """A \\right with no delimiter after it closes the \\left before it: "\\left( 3, 4 \\right" -> "... \\right)"."""
    opens = [m.group(1) for m in _LEFT.finditer(text)]
    if not opens or not _BARE_RIGHT.search(text):
        return text
    closing = {"(": ")", "[": "]"}[opens[-1]]
    return _BARE_RIGHT.sub(lambda _: "\\right" + closing, text, count=1)


def notation(text: str) -> str:
    """How a value is written, made plain, in a gold or a response (both graders; see the rules above):
        "2.75e11" -> "2.75 \\times 10^{11}";  "6 × 10¹³" -> "6 \\times 10^{13}";  "\\text{7.5 meters}" ->
        "7.5 \\text{ meters}";  "2i\\sqrt{2}" -> "2 i \\sqrt{2}";  "0.1\\overline{6}" -> "\\frac{1}{6}";
        "\\begin{pmatrix} 1 \\\\ -2 \\end{pmatrix}" -> "(1, -2)"."""
    if "e" in text or "E" in text:
        text = _E_NOTATION.sub(r"\1 \\times 10^{\2}", text)
    if _SUPERSCRIPT_RUN.search(text):
        text = _SUPERSCRIPT_RUN.sub(lambda m: "^{" + m.group().translate(_SUPERSCRIPTS) + "}", text)
    text = text.replace("×", " \\times ").replace("·", " \\cdot ")
    text = _NUMBER_IN_TEXT.sub(lambda m: m.group(1) + (f" \\text{{ {m.group(2).strip()}}}" if m.group(2).strip() else ""),
                               text)
    text = _I_BEFORE_COMMAND.sub(" i ", text)
    if "\\overline" in text or "\\bar" in text:
        text = _REPEATING.sub(_repeating_fraction, text)
    if "matrix" in text:
        text = _COLUMN_VECTOR.sub(lambda m: m.group() if "&" in m.group() else _column_tuple(m), text)
    if "\\left" in text:
        text = _close_bare_rights(text)
    return text


# 4. Values in words: a number word in a box ("\text{five}") is that number; "none" is 0 when the
#    question asks "how many"; a gold that is a phrase ("\text{no solution}", "\text{infinitely many}") is
#    answered by any phrase of its kind ("no real solutions", "\emptyset"; "infinitely many solutions",
#    "\infty"), never by a number.
_NUMBER_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())}
_NO_SOLUTION = {"no solution", "no solutions", "no real solution", "no real solutions", "no real roots", "no roots",
                "there is no solution", "there are no solutions", "there are no real solutions", "none", "no such",
                "no such value", "no value", "empty set", "\\emptyset", "\\varnothing", "\\{\\}", "{}", "dne",
                "does not exist"}
_INFINITELY_MANY = {"infinitely many", "infinitely many solutions", "infinite", "infinitely", "infinity", "\\infty",
                    "infinitely many values", "there are infinitely many", "an infinite number", "infinitely many ways"}
_WORD_MARKUP = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox)\s*\{([^{}]*)\}")


def _words(content: str) -> str:
    """A box's content as plain lower-case words: "\\text{No Real Solutions.}" -> "no real solutions"."""
    text = _WORD_MARKUP.sub(r"\1", content).replace("$", "").replace("~", " ")
    return " ".join(text.lower().strip().rstrip(".").split())


def word_value(content: str, question: str = "") -> str | None:
    """What a box's words say as a value the grader compares: "5" for "\\text{five}", "0" for "none"
    when the question asks how many, "no solution" or "infinitely many" for a phrase of either kind;
    None when the content is no such word."""
    words = _words(content)
    if words in _NUMBER_WORDS:
        return str(_NUMBER_WORDS[words])
    if words in ("none", "no", "zero") and re.search(r"\bhow many\b", question, re.IGNORECASE):
        return "0"
    if words in _NO_SOLUTION:
        return "no solution"
    if words in _INFINITELY_MANY:
        return "infinitely many"
    return None


# 5. The unit the question asks for ("in centimeters", "(in cm)", "how many grams"): a unit written in
#    the answer that is not that one (another prefix, another unit of any kind) makes it wrong; the same
#    unit, in any spelling, is ignored; where the question asks for none, units are ignored as before.
_UNITS_OF = {
    "m": ("m", "meter", "meters", "metre", "metres"), "km": ("km", "kilometer", "kilometers", "kilometre", "kilometres"),
    "dm": ("dm", "decimeter", "decimeters"), "cm": ("cm", "centimeter", "centimeters", "centimetre", "centimetres"),
    "mm": ("mm", "millimeter", "millimeters", "millimetre", "millimetres"),
    "um": ("um", "µm", "μm", "\\mum", "micrometer", "micrometers", "micron", "microns"),
    "nm": ("nm", "nanometer", "nanometers"), "pm": ("pm", "picometer", "picometers"),
    "angstrom": ("å", "\\aa", "\\a", "angstrom", "angstroms"), "in": ("inch", "inches"), "ft": ("ft", "foot", "feet"),
    "yd": ("yd", "yard", "yards"), "mi": ("mile", "miles"),
    "g": ("g", "gram", "grams"), "kg": ("kg", "kilogram", "kilograms"), "mg": ("mg", "milligram", "milligrams"),
    "lb": ("lb", "lbs", "pound", "pounds"), "oz": ("oz", "ounce", "ounces"),
    "s": ("s", "sec", "secs", "second", "seconds"), "ms": ("ms", "millisecond", "milliseconds"),
    "min": ("min", "mins", "minute", "minutes"), "h": ("h", "hr", "hrs", "hour", "hours"), "day": ("day", "days"),
    "year": ("yr", "yrs", "year", "years"),
    "l": ("l", "liter", "liters", "litre", "litres"), "ml": ("ml", "milliliter", "milliliters", "millilitre"),
    "j": ("j", "joule", "joules"), "kj": ("kj", "kilojoule", "kilojoules"), "ev": ("ev", "electronvolt", "electronvolts"),
    "w": ("w", "watt", "watts"), "kw": ("kw", "kilowatt", "kilowatts"), "n": ("newton", "newtons"),
    "hz": ("hz", "hertz"), "khz": ("khz",), "mhz": ("mhz",), "ghz": ("ghz",),
}
_UNIT = {spelling: unit for unit, spellings in _UNITS_OF.items() for spelling in spellings}
_ASKED_UNIT = re.compile(r"(?:\bin units of|\bexpressed in|\banswer in|\bgive your answer in|\bin|\bhow many)\s+"
                         r"(?:\$?\\(?:mathrm|text|rm)\s*\{\s*~?)?([A-Za-zµμÅ\\]+)", re.IGNORECASE)
_ANSWER_UNIT = re.compile(r"(?:\\(?:text|textrm|mathrm|mbox|rm)\s*\{\s*~?\s*([^{}]+?)\s*\}|(?<=[\d}\s])([A-Za-zµμÅ]+)\s*\.?)\s*$")


def asked_unit(question: str) -> str | None:
    """The unit the question asks the answer in ("... in centimeters?", "(in cm)", "How many grams"), None if none."""
    asked = [_UNIT.get(m.group(1).lower()) for m in _ASKED_UNIT.finditer(question)]
    asked = [unit for unit in asked if unit is not None]
    return asked[-1] if asked else None  # the last: a question states its data first, then what it asks


def answer_unit(content: str) -> tuple[str, str | None]:
    """(the unit written at the end of a box's content, as spelt; the unit it names or None if unknown)."""
    m = _ANSWER_UNIT.search(content.strip())
    if not m:
        return "", None
    spelt = (m.group(1) or m.group(2) or "").strip().lower().replace(" ", "")
    return spelt, _UNIT.get(spelt)


def wrong_unit(content: str, question: str) -> bool:
    """Whether the box writes a unit other than the one the question asks for ("2.5 mm" when it asks cm)."""
    asked = asked_unit(question) if question else None
    if asked is None:
        return False
    spelt, unit = answer_unit(content)
    return unit is not None and unit != asked


# 6. Order: where the question fixes it ("in that order", "enter the ordered pair") or the response
#    labels its values ("(m, n) = (2, 5)": read in the order the question names m and n), a gold written
#    as a bare list is an ordered tuple; elsewhere a bare list stays a set of solutions.
_ORDER_WORDS = re.compile(r"\bin (?:that|this|the given|the same) order\b|\b(?:enter|give|as|express\w*)\b[^.?]{0,30}"
                          r"\bordered (?:pair|triple)\b", re.IGNORECASE)
_TUPLE_LABEL = re.compile(r"\(\s*([A-Za-z])\s*(?:,\s*([A-Za-z])\s*)(?:,\s*([A-Za-z])\s*)?\)\s*=\s*\$?\s*$")


def order_fixed(question: str) -> bool:
    return bool(_ORDER_WORDS.search(question))


def labelled_order(response: str, box_start: int, question: str) -> list[int] | None:
    """Where the last box is labelled "(m, n) = \\boxed{...}" with letters the question names: the
    positions of the box's values in the question's order (m first if the question names m first)."""
    label = _TUPLE_LABEL.search(response[max(0, box_start - 40):box_start])
    if not label:
        return None
    names = [g for g in label.groups() if g]
    where = [re.search(rf"(?<![A-Za-z\\]){n}(?![A-Za-z])", question) for n in names]
    if not all(where) or len(set(names)) != len(names):
        return None
    return sorted(range(len(names)), key=lambda i: where[i].start())


def _values(content: str) -> list[str]:
    """A box's values: its top-level comma-separated parts, outer parentheses dropped."""
    text = _BOX_LHS.sub("", content.strip())
    text = re.sub(r"^\\left\s*", "", text)
    text = re.sub(r"\\right\s*\)$", ")", text)
    if text[:1] in "([" and text[-1:] in ")]":
        text = text[1:-1]
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    return parts + [current.strip()]


# 7. ± in a box: "\pm" (or ±) names both signs, each combination one value: "(\pm 1, 0)" is (1, 0) and
#    (-1, 0); "\frac{1 \pm \sqrt{5}}{2}" is the two roots. It answers a gold that lists them all.
_PM = re.compile(r"\\pm|±")


def expand_pm(content: str) -> str | None:
    """"(\\pm 1, 0)" -> "(+1, 0), (-1, 0)"; None without a ± or with more than three."""
    pieces = _PM.split(content)
    if not 2 <= len(pieces) <= 4:
        return None
    variants = []
    for signs in range(2 ** (len(pieces) - 1)):
        text = pieces[0]
        for k, piece in enumerate(pieces[1:]):
            text += ("-" if signs >> k & 1 else "+") + piece
        variants.append(text)
    return ", ".join(variants)


# 8. Rounded golds (Minerva's are rounded: 1.4 for a value given to two significant figures): where the
#    question fixes no precision, an answer given with more digits is right when it rounds to the gold at
#    the gold's own precision (1.414 for 1.4; 2.748e11 for 2.75e11); 1.46 is not. A question that fixes a
#    precision (decimal places, significant figures, "nearest", "round", "exact", "as a decimal" or a
#    fraction) is answered at that precision only, and an integer gold is never a rounded one.
_PRECISION_FIXED = re.compile(r"significant|decimal|nearest|round|exact|fraction|simplest|radical|integer",
                              re.IGNORECASE)
_PLAIN_NUMBER = re.compile(r"^\s*(-?)(\d+(?:\.\d+)?)(?:\s*\\(?:times|cdot)\s*10\s*\^\s*\{?\s*([-+]?\d+)\s*\}?)?\s*$")


def plain_numbers(content: str, gold: str):
    """(answer, gold) as exact decimals when both are plain numbers (a decimal, or a x 10^{k}), else None.
    math-verify rounds numbers to 6 decimal places before comparing them, so 2 x 10^{-8} would answer a
    gold of 10^{-8} (Minerva has 16 golds under 10^{-5}); two plain numbers are compared here exactly."""
    from decimal import Decimal

    found = [_PLAIN_NUMBER.match(text) for text in (_UNITS.sub("", _BOX_LHS.sub("", content)), _clean_latex(gold))]
    if not all(found):
        return None
    return tuple(Decimal(m.group(1) + m.group(2)).scaleb(int(m.group(3) or 0)) for m in found)


def rounds_to_gold(content: str, gold: str, question: str) -> bool:
    """Whether the answer, written with more digits than the gold, rounds to it at the gold's precision."""
    from decimal import ROUND_HALF_UP, Decimal

    g, a = _PLAIN_NUMBER.match(notation(_clean_latex(gold))), _PLAIN_NUMBER.match(_UNITS.sub("", content))
    if not g or not a or _PRECISION_FIXED.search(question) or ("." not in g.group(2) and g.group(3) is None):
        return False
    gold_value = Decimal(g.group(1) + g.group(2)) * Decimal(10) ** int(g.group(3) or 0)
    answer_value = Decimal(a.group(1) + a.group(2)) * Decimal(10) ** int(a.group(3) or 0)
    scale = Decimal(10) ** int(g.group(3) or 0)  # round the mantissa at the gold's own decimals
    step = Decimal(1).scaleb(-len(g.group(2).partition(".")[2]))
    digits = len((a.group(2).replace(".", "")).lstrip("0"))
    if digits <= len(g.group(2).replace(".", "").lstrip("0")):  # not written more precisely: compared as is
        return False
    return (answer_value / scale).quantize(step, rounding=ROUND_HALF_UP) == gold_value / scale


# 9. A hedge after the last box: "\boxed{12}. Hmm, but I am not certain; it might be 15 instead" commits
#    to neither value (default grader; a hedge before the box is a first try the box settles).
_DOUBT = re.compile(r"\b(?:not (?:certain|sure|confident)|unsure|uncertain|(?:might|may|could) be wrong)\b", re.IGNORECASE)
_ALTERNATIVE = re.compile(r"\b(?:(?:might|could|may)(?: also| instead)? be|maybe|perhaps|possibly|probably|or)\s*\$?\s*"
                          r"([-−]?\d+(?:\.\d+)?)", re.IGNORECASE)
_NUMBER_TOKEN = re.compile(r"(?<![\w.])[-−]?\d+(?:\.\d+)?")


def hedged_after_box(response: str) -> bool:
    """Whether the words after the last box doubt it and name another value: "\\boxed{12}. I am not
    certain; it might be 15" and "\\boxed{12}, or maybe 15" do; "\\boxed{12}. Check: 3 + 9 = 12." does not."""
    spans = _box_spans(response)
    if not spans:
        return False
    boxed, after = set(_NUMBER_TOKEN.findall(_box_content(response, spans[-1]))), response[spans[-1][1] + 1:]
    others = [n for n in _NUMBER_TOKEN.findall(after) if n not in boxed]
    return bool(others) and (bool(_DOUBT.search(after)) or any(n not in boxed for n in _ALTERNATIVE.findall(after)))


def careful_verdict(content: str, gold: str, question: str, gold_parsed, boxes: list[str] | None = None,
                    order: list[int] | None = None) -> tuple[float, str] | None:
    """The rules above that read the last box's content, in the order a grader applies them:
    (0, "wrong_unit") or (0, "wrong_order") refuse an answer whatever its value; (1, "ok") accepts one by
    its words, its ± or its rounding; None leaves the verdict to the comparison of values. `boxes`: the
    boxes that end the response together (labelled parts of one answer); `order`: labelled_order's."""
    from math_verify import verify  # only workers import sympy

    if wrong_unit(content, question):
        return 0.0, "wrong_unit"
    if (order is not None or order_fixed(question)) and _is_list(gold_parsed):
        values = [_BOX_LHS.sub("", box) for box in boxes] if boxes and len(boxes) >= 2 else _values(content)
        if order is not None and len(order) == len(values):
            values = [values[i] for i in order]
        same = verify(_parse_boxed("(" + ", ".join(_values(gold)) + ")"), _parse_boxed("(" + ", ".join(values) + ")"),
                      timeout_seconds=None)
        return (1.0, "ok") if same else (0.0, "wrong_order")
    said, gold_said = word_value(content, question), word_value(gold, question)
    if said is not None:
        if gold_said is not None:
            return (1.0, "ok") if said == gold_said else (0.0, "wrong")
        if said.isdigit() and verify(gold_parsed, _parse_boxed(said), timeout_seconds=None):
            return 1.0, "ok"
    if (expanded := expand_pm(content)) is not None and not _PM.search(gold) and \
            verify(gold_parsed, _parse_boxed(expanded), timeout_seconds=None):
        return 1.0, "ok"
    if (numbers := plain_numbers(content, gold)) is not None:  # two numbers: their exact values decide
        return (1.0, "ok") if numbers[0] == numbers[1] or rounds_to_gold(content, gold, question) else (0.0, "wrong")
    return None


# ---------------------------------------------------------------------------------------------------
# QA: PASS's "Final Answer: ..." format and SQuAD metrics (run in the calling process)
# ---------------------------------------------------------------------------------------------------

_FINAL_ANSWER = re.compile(r"final answer\s*:", re.IGNORECASE)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def squad_normalize(text: str) -> str:
    """SQuAD v1.1 answer normalisation: lower case, drop punctuation, drop articles, squash spaces.

    "The  Eiffel-Tower!" -> "eiffeltower";  "an Apple a day" -> "apple day".
    """
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str | list[str]) -> float:
    """1.0 if the normalised prediction equals a normalised gold alias, else 0.0."""
    aliases = [gold] if isinstance(gold, str) else gold
    return float(any(squad_normalize(prediction) == squad_normalize(alias) for alias in aliases))


def f1_score(prediction: str, gold: str | list[str]) -> float:
    """SQuAD v1.1 token F1 (best alias): F1 = 2PR/(P+R) over the bag of normalised tokens.

    "the Eiffel Tower in Paris" vs "Eiffel Tower": common 2, P = 2/4, R = 2/2 -> F1 = 2/3.
    """
    aliases = [gold] if isinstance(gold, str) else gold
    pred_tokens = squad_normalize(prediction).split()
    best = 0.0
    for alias in aliases:
        gold_tokens = squad_normalize(alias).split()
        common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
        if common > 0:
            precision, recall = common / len(pred_tokens), common / len(gold_tokens)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def qa_answer(response: str) -> str | None:
    """The text after the last "Final Answer:" (any case), to the end of its line; None if absent.

    "It is Paris.\\nFinal Answer: Paris." -> "Paris."  (the answer may also start on the next line)
    """
    markers = list(_FINAL_ANSWER.finditer(response))
    if not markers:
        return None
    rest = response[markers[-1].end():].lstrip()
    return rest.split("\n", 1)[0].strip()


def qa_format(response: str) -> int:
    """Format reward for QA: 1 iff exactly one "Final Answer:" marker, followed by an answer."""
    return int(len(_FINAL_ANSWER.findall(response)) == 1 and bool(qa_answer(response)))


def _score_qa(response: str, gold: str | list[str]) -> Score:
    answer = qa_answer(response)
    if answer is None:
        return Score(0.0, 0, "no_final_answer")
    reward = exact_match(answer, gold)
    return Score(reward, qa_format(response), "ok" if reward == 1.0 else "wrong")


# ---------------------------------------------------------------------------------------------------
# Code: program extraction, reference schema, sandbox
# ---------------------------------------------------------------------------------------------------

# Any fenced block, whatever its language tag, so that fences pair up as the writer meant.
_FENCED_BLOCK = re.compile(r"```[ \t]*([\w+-]*)[ \t]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = ("", "python", "python3", "py")


def _python_blocks(response: str) -> list[str]:
    return [code for tag, code in _FENCED_BLOCK.findall(response) if tag.lower() in _PYTHON_TAGS]


def extract_code(response: str) -> str | None:
    """The last ```python (or ```py, or untagged) fenced block of the response, None if none."""
    blocks = _python_blocks(response)
    return blocks[-1] if blocks else None


def code_format(response: str) -> int:
    """Format reward for code: 1 iff exactly one Python code block."""
    return int(len(_python_blocks(response)) == 1)


def _code_job(reference, index: int) -> dict:
    """Validate a code reference and flatten it to what sandbox.run_code_tests runs: {"tests":
    [{"stdin", "stdout"} | {"assert", "calls", "check"} | {"call", "args", "expected"} | {"script",
    "expected"}, ...], "header": source before the program, "pass_all": bool}.
    Anything malformed (no test, an empty one, JSON nested past Python's limits, an assert that
    checks nothing the program computes) is a ValueError naming the item, never a reward."""
    where = f"references[{index}] (kind 'code')"
    try:
        if isinstance(reference, str):
            try:
                reference = json.loads(reference)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where} is a string but not JSON: {error}") from None
        if not isinstance(reference, dict):
            raise ValueError(f"{where} must be a dict of tests, got {type(reference).__name__}")
        header, pass_all = reference.get("header", ""), reference.get("pass_all", False)
        if not isinstance(header, str) or not isinstance(pass_all, bool):
            raise ValueError(f"{where}: 'header' must be a string and 'pass_all' true or false")
        return {"tests": _parse_code_reference(reference, where), "header": header, "pass_all": pass_all}
    except (RecursionError, MemoryError):
        raise ValueError(f"{where} is nested too deeply to read") from None


def _parse_code_reference(reference: dict, where: str) -> list[dict]:
    if "fn_name" in reference:
        return _call_tests(reference, where)
    if "assert_script" in reference:
        if not isinstance(reference["assert_script"], str):
            raise ValueError(f"{where}: 'assert_script' must be the test script's source")
        return [sandbox.parse_assert_script(reference["assert_script"], f"{where}: assert_script")]
    compare = reference.get("compare", "tokens")
    if compare not in ("tokens", "lines"):
        raise ValueError(f"{where}: 'compare' must be 'tokens' or 'lines', got {compare!r}")
    inputs, outputs = reference.get("inputs", []), reference.get("outputs", [])
    asserts = reference.get("asserts", [])
    if not (isinstance(inputs, list) and isinstance(outputs, list) and len(inputs) == len(outputs)):
        raise ValueError(f"{where}: 'inputs' and 'outputs' must be lists of the same length")
    if not all(isinstance(x, str) for x in inputs + outputs):
        raise ValueError(f"{where}: every 'inputs'/'outputs' entry must be a string")
    if not (isinstance(asserts, list) and all(isinstance(a, str) for a in asserts)):
        raise ValueError(f"{where}: 'asserts' must be a list of strings (one test each)")
    if any(not o.strip() for o in outputs):
        raise ValueError(f"{where}: an empty expected output tests nothing (a program that prints nothing "
                         "would pass it)")
    tests = [{"stdin": i, "stdout": o, "compare": compare} for i, o in zip(inputs, outputs)]
    tests += [sandbox.parse_assert(a, f"{where}: asserts[{k}]") for k, a in enumerate(asserts)]
    if not tests:
        raise ValueError(f"{where} has no tests: give 'inputs'/'outputs' and/or 'asserts'")
    return tests


def _call_tests(reference: dict, where: str) -> list[dict]:
    """Call-based tests (APPS/TACO, LeetCode style): {"fn_name": "f", "inputs": [[arg, ...], ...],
    "outputs": [expected, ...]} -> [{"call": fn_name, "args": [...], "expected": ...}, ...]."""
    name, inputs, outputs = reference["fn_name"], reference.get("inputs"), reference.get("outputs")
    if not (isinstance(name, str) and name.isidentifier()):
        raise ValueError(f"{where}: 'fn_name' must be the name of a function, got {name!r}")
    if not (isinstance(inputs, list) and isinstance(outputs, list) and len(inputs) == len(outputs) and inputs):
        raise ValueError(f"{where}: call-based tests need 'inputs' (a list of argument lists) and 'outputs' "
                         "(one expected value each), non-empty and of the same length")
    for k, args in enumerate(inputs):
        if not isinstance(args, list):
            raise ValueError(f"{where}: inputs[{k}] must be the list of arguments of one call, got "
                             f"{type(args).__name__}")
    try:
        return [{"call": name, "args": json.dumps(args), "expected": json.dumps(out)}
                for args, out in zip(inputs, outputs)]
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: call-based inputs/outputs must be JSON values: {error}") from None


# ---------------------------------------------------------------------------------------------------
# Worker process: one item at a time, JSON lines on stdin/stdout
# ---------------------------------------------------------------------------------------------------


class _SoftTimeout(BaseException):
    """Raised by the worker's SIGALRM; a BaseException, so math-verify's `except Exception` lets it
    through."""


def _raise_soft_timeout(signum, frame):
    raise _SoftTimeout()


def _parse_boxed(latex: str):
    """A gold answer, or an answer the official rule extracted: LaTeX (not a whole response), parsed
    by math-verify as the content of a box."""
    from math_verify import LatexExtractionConfig, parse  # only workers import sympy

    # Timeouts None: math-verify's SIGALRM timers are replaced by the worker's own, per item.
    return parse("\\boxed{" + _clean_latex(latex) + "}", [LatexExtractionConfig(boxed_match_priority=0)],
                 parsing_timeout=None)


def _math_equal(answer: str, gold: str, question: str = "") -> tuple[float, str]:
    """--math-grader official: the extracted answer, parsed as a box's content, against the gold;
    verify(gold, answer) (not symmetric), then the readings of _equal. (reward, reason)."""
    if letter := choice_letter(gold):
        return (1.0, "ok") if box_letter(answer) == letter else (0.0, "wrong")
    answer, gold = notation(answer), notation(gold)
    answer_parsed, gold_parsed = _parse_boxed(answer), _parse_boxed(gold)  # "\\boxed{173.}" answers 173
    if refused := not_an_answer(answer, gold, question, answer_parsed[0] if answer_parsed else None,
                                gold_parsed[0] if gold_parsed else None):
        return 0.0, refused
    if (verdict := careful_verdict(answer, gold, question, gold_parsed)) is not None:
        return verdict
    return (1.0, "ok") if _equal(gold_parsed, answer_parsed, answer, gold) else (0.0, "wrong")


_PERCENT = re.compile(r"\\?%|\\text\{\s*percent\s*\}")


def _equal(gold_parsed, answer_parsed, answer: str, gold: str) -> bool:
    """verify(gold, answer), then two readings a careful grader makes and math-verify does not:
    - a percent answers a gold written without one: "7.5\\%" for "What percent of 80 is 6?" (gold 7.5),
      as PRIME's official grader accepts percentage variants (math-verify reads 7.5% as 0.075, which a
      gold of 0.075 still matches);
    - a relation in one variable answers a gold that is an interval or a union of intervals, by the set
      it describes: "x \\ge 5" for [5, \\infty), "-3 < x < 4" for (-3, 4), "x \\ne 2" for
      (-\\infty, 2) \\cup (2, \\infty), "x < -2 \\text{ or } x > 2" for (-\\infty, -2) \\cup (2, \\infty)."""
    from math_verify import verify  # only workers import sympy
    from sympy import Interval, Union

    if verify(gold_parsed, answer_parsed, timeout_seconds=None):
        return True
    if _PERCENT.search(answer) and not _PERCENT.search(gold) and \
            verify(gold_parsed, _parse_boxed(_PERCENT.sub("", answer)), timeout_seconds=None):
        return True
    if gold_parsed and isinstance(gold_parsed[0], (Interval, Union)):
        described = _relation_set(answer_parsed[0]) if answer_parsed else None
        return described is not None and described == gold_parsed[0]
    return False


def _relation_set(parsed):
    """The set of reals a parsed relation in one variable describes (x >= 5 -> [5, oo); several joined
    by "or", which math-verify reads as a set of relations, -> their union), or None if it is none."""
    from sympy import FiniteSet
    from sympy.core.relational import Relational
    from sympy.logic.boolalg import And, Or

    if isinstance(parsed, FiniteSet) and parsed.args and all(isinstance(a, (Relational, And, Or)) for a in parsed.args):
        parsed = Or(*parsed.args)
    if not isinstance(parsed, (Relational, And, Or)) or len(parsed.free_symbols) != 1:
        return None
    try:
        return parsed.as_set()
    except (NotImplementedError, TypeError, ValueError):  # a relation sympy cannot solve for its variable
        return None


def _math_verify_response(response: str, gold: str, question: str = "") -> tuple[float, str]:
    """--math-grader math-verify: math-verify reads the whole response with its default extraction
    targets (LaTeX and plain expressions; boxed answers, "final answer is ..." anchors, several
    boxes close together read as one set), then verify(gold, answer) and the readings of _equal.
    Digits grouped by spaces are joined first (join_spaced_thousands); a denied value and the rest of
    its clause are cut out (without_denials), and a response without a box that hedges scores 0.

    One box per value: math-verify joins boxes only when nothing but "and" or a comma stands between
    them; with "x = \\boxed{0}, x = \\boxed{-1}, and ..." it reads the last box alone. So when that
    reading is wrong and the response ends in two or more boxes that stand together (final_boxes), a
    leading "x =" or "f(a) =" inside a box dropped, those boxes are read together: as one set when
    the gold is a list of two or more values (in any order, but the same elements, so a response that
    boxes every candidate it considered (an extra element) or leaves one out scores 0, and so does one
    that boxes a value, rejects it in words and boxes another), and as a tuple in the order written
    when the gold is a tuple of as many values ("the quotient is \\boxed{4} and the remainder is
    \\boxed{4}" for (4, 4))."""
    from math_verify import parse, verify  # only workers import sympy

    response, gold = notation(drop_box_stops(join_spaced_thousands(response))), notation(join_spaced_thousands(gold))
    read = without_denials(response)

    def denied_as_it_stands() -> bool:  # the whole response, read as math-verify reads it, answers a denied value
        whole = parse(_FBOX.sub(r"\\boxed{", response), parsing_timeout=None)
        return read != response and not _BOX_START.search(response) and bool(whole) and denied(whole[-1], response)

    if letter := choice_letter(gold):
        if chosen := answered_letter(read):
            return (1.0, "ok") if chosen == letter else (0.0, "wrong")
    # \fbox is the official grader's other box; math-verify knows only \boxed
    answer_parsed = parse(_FBOX.sub(r"\\boxed{", read), parsing_timeout=None)
    if not answer_parsed:
        return 0.0, "denied" if read != response else "no_answer"
    gold_parsed = _parse_boxed(gold)
    if refused := not_an_answer(answer_parsed[-1], gold, question, answer_parsed[0],
                                gold_parsed[0] if gold_parsed else None):
        return 0.0, "denied" if denied_as_it_stands() else refused
    verdict = None
    if not _BOX_START.search(read):
        if denied(answer_parsed[-1], response):  # as it stands: "52 + 56 is not 108, so add 5 to 108."
            return 0.0, "denied"
        if hedged(answer_parsed[-1], read, _is_list(gold_parsed)):
            return 0.0, "hedged"
    elif spans := _box_spans(read):
        if hedged_after_box(read):
            return 0.0, "hedged"
        content, boxes, read_as = _box_content(read, spans[-1]), final_boxes(read), _bare(answer_parsed[-1])
        # only where the answer math-verify read is the last box (or the boxes that end the response together)
        if _bare(content) == read_as or (len(boxes) >= 2 and _bare(content) in read_as):
            verdict = careful_verdict(content, gold, question, gold_parsed, boxes,
                                      labelled_order(read, spans[-1][0], question))
        if verdict is not None:
            return verdict
    if _equal(gold_parsed, answer_parsed, answer_parsed[-1], gold):
        return 1.0, "ok"
    boxes = [_BOX_LHS.sub("", box) for box in final_boxes(read)]
    if len(boxes) >= 2 and _is_list(gold_parsed):
        if verify(gold_parsed, _parse_boxed(", ".join(boxes)), timeout_seconds=None):
            return 1.0, "ok"
    if len(boxes) >= 2 and _is_tuple(gold_parsed, len(boxes)):
        if verify(gold_parsed, _parse_boxed("(" + ", ".join(boxes) + ")"), timeout_seconds=None):
            return 1.0, "ok"
    return 0.0, "wrong"


def _is_tuple(parsed, length: int) -> bool:
    """Whether a parsed gold is an ordered tuple of `length` values ("(4, 4)", "(1, -5, 6)")."""
    from sympy import Tuple

    return bool(parsed) and isinstance(parsed[0], Tuple) and len(parsed[0]) == length


def _is_list(parsed) -> bool:
    """Whether a parsed gold is a set of two or more values ("3, 5, 7": math-verify reads a bare list as
    an unordered set)."""
    from sympy import FiniteSet

    return bool(parsed) and isinstance(parsed[0], FiniteSet) and len(parsed[0]) >= 2


# One answer of each common shape. The LaTeX parser (ANTLR) caches its decisions as it meets new
# constructs, and a cold parse costs about twice a warm one: warming up pays that once, at startup.
_WARM_UP = [("\\frac{1}{2}", "0.5"), ("\\dfrac{3}{4}", "\\frac34"), ("2\\sqrt{3}", "\\sqrt{12}"),
            ("x=5", "5"), ("(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)"),
            ("[-2, 7)", "[-2,7)"), ("(-\\infty, 0] \\cup (1, \\infty)", "x \\le 0"),
            ("\\{1, 2\\}", "1, 2"), ("\\begin{pmatrix} 1 \\\\ -2 \\end{pmatrix}", "(1,-2)"),
            ("\\text{(C)}", "C"), ("30^\\circ", "30"), ("\\$18.90", "18.9"), ("10\\%", "0.1"),
            ("3x^2 - 2x + 1", "1-2x+3x^2"), ("e^{i\\pi/4}", "\\frac{1+i}{\\sqrt2}"), ("52_8", "42"),
            ("\\log_2 5", "\\ln 5/\\ln 2"), ("\\sin x + \\cos^2 y", "p - q"), ("1{,}000", "1000"),
            ("\\infty", "-\\infty"), ("a \\ge 3", "\\binom{5}{2}")]


def _do_job(job: dict) -> tuple[float, str]:
    if job["kind"] == "code":  # code has its own per-test wall-clock limits
        return sandbox.run_code_tests(job["program"], job["tests"], job["timeout"], job.get("pass_all", False))
    signal.setitimer(signal.ITIMER_REAL, SOFT_TIMEOUT_FRACTION * job["timeout"])
    try:
        if "response" in job:  # --math-grader math-verify
            return _math_verify_response(job["response"], job["gold"], job["question"])
        return _math_equal(job["answer"], job["gold"], job["question"])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _worker_main(parent_pid: int) -> None:
    """Entry point of a worker process (started by sandbox._start_worker)."""
    sandbox.set_parent_death_signal()  # the parent may be SIGKILLed while we are stuck in C
    if os.getppid() != parent_pid:
        os._exit(0)  # it already died before the line above
    sandbox.become_reaper()
    logging.disable(logging.CRITICAL)  # math-verify logs every timeout and parse failure
    sandbox.lower_limit(resource.RLIMIT_AS, WORKER_MEMORY_BYTES)
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # stray prints from libraries go to stderr, not into the protocol
    signal.signal(signal.SIGALRM, _raise_soft_timeout)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business

    def answer(message: dict) -> None:
        try:
            answers.write(json.dumps(message) + "\n")
            answers.flush()
        except BrokenPipeError:  # the parent stopped listening (shutdown): nothing left to do
            os._exit(0)

    for answer_text, gold in _WARM_UP:  # before saying ready: the first real items are not slower
        _math_equal(answer_text, gold, "")
        _math_verify_response(f"So the answer is $\\boxed{{{answer_text}}}$.", gold)
    answer({"ready": True})
    for line in sys.stdin.buffer:  # ends when the parent closes our stdin (or dies)
        job = json.loads(line)
        try:
            reward, reason = _do_job(job)
        except _SoftTimeout:  # also when it fires inside _do_job's `finally`
            reward, reason = 0.0, "timeout"
        except Exception as error:  # noqa: BLE001 -- any error of any item scores 0, with its reason
            reward, reason = 0.0, f"error: {type(error).__name__}: {error}"[:300]
        answer({"reward": reward, "reason": reason})


# ---------------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------------


def score_batch(responses: list[str], references: list, kinds: list[str], *, questions: list[str] | None = None,
                timeout: float = DEFAULT_TIMEOUT, workers: int | None = None,
                math_grader: str = "math-verify") -> list[Score]:
    """Score a batch of responses: one Score(reward, format, reason) per response, in order.

    `kinds[i]` in {"math", "code", "qa"} says how to read `references[i]` (see the module docstring).
    `timeout`: seconds per math or QA item, and per test of a code item. `workers`: size of the
    process pool (default: this process's CPUs / LOCAL_WORLD_SIZE). `math_grader`: who finds the
    answer of a math response, "math-verify" (its own extraction) or "official" (the last box only,
    as PRIME's grader). `questions`: each response's question, so that a math answer repeating an
    expression of it scores 0 (reason "restated"; without them that rule is off). Never raises because
    of what a response contains; raises ValueError for malformed arguments.
    """
    if not len(responses) == len(references) == len(kinds):
        raise ValueError(f"responses, references and kinds differ in length: "
                         f"{len(responses)}, {len(references)}, {len(kinds)}")
    if questions is not None and len(questions) != len(responses):
        raise ValueError(f"questions has {len(questions)} entries, responses {len(responses)}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    workers = sandbox.default_workers() if workers is None else workers
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if math_grader not in MATH_GRADERS:
        raise ValueError(f"math_grader must be one of {MATH_GRADERS}, got {math_grader!r}")

    scores: list[Score | None] = [None] * len(responses)
    formats, jobs = {}, {}
    for i, (response, reference, kind) in enumerate(zip(responses, references, kinds)):
        if not isinstance(response, str):
            raise ValueError(f"responses[{i}] must be a string, got {type(response).__name__}")
        if kind == "math":
            if isinstance(reference, (int, float)) and not isinstance(reference, bool):
                reference = str(reference)
            if not isinstance(reference, str):
                raise ValueError(f"references[{i}] (kind 'math') must be a gold answer string, "
                                 f"got {type(reference).__name__}")
            # the official grader's last box is one no negation denies ("certainly not \\boxed{20}");
            # math-verify's worker cuts the denials itself
            answer, _, reason = _last_box(response if math_grader == "math-verify" else without_denials(response))
            formats[i] = math_format(response)
            if answer is not None and len(answer) > MAX_ANSWER_CHARS:  # both graders: never parsed
                scores[i] = Score(0.0, formats[i], "answer_too_long")
            elif reason == "unclosed_boxed":  # both graders: cut off while writing its answer, so
                scores[i] = Score(0.0, formats[i], reason)  # no earlier value is read as the answer
            elif math_grader == "math-verify":  # math-verify reads the whole response
                jobs[i] = {"kind": "math", "response": response, "gold": reference, "timeout": timeout,
                           "question": questions[i] if questions else ""}
            else:
                if answer is not None and not answer.strip():
                    answer, reason = None, "empty_boxed"
                if answer is None:
                    scores[i] = Score(0.0, formats[i], reason)
                else:
                    jobs[i] = {"kind": "math", "answer": answer, "gold": reference, "timeout": timeout,
                               "question": questions[i] if questions else ""}
        elif kind == "qa":
            if not (isinstance(reference, str) or (isinstance(reference, list) and reference
                                                   and all(isinstance(a, str) for a in reference))):
                raise ValueError(f"references[{i}] (kind 'qa') must be a string or a non-empty "
                                 "list of strings")
            scores[i] = _score_qa(response, reference)
        elif kind == "code":
            job = _code_job(reference, i)
            program, formats[i] = extract_code(response), code_format(response)
            if program is None:
                scores[i] = Score(0.0, formats[i], "no_code_block")
            else:
                program = f"{job['header']}\n{program}" if job["header"] else program
                jobs[i] = {"kind": "code", "program": program, "tests": job["tests"], "pass_all": job["pass_all"],
                           "timeout": timeout}
        else:
            raise ValueError(f"kinds[{i}] must be one of {KINDS}, got {kind!r}")

    if jobs:
        with sandbox.pool_lock:
            try:
                results = sandbox.run_jobs(jobs, workers)
            except BaseException:  # e.g. Ctrl-C: busy workers would answer into the next batch
                sandbox.stop_pool(kill=True)
                raise
        for i, (reward, reason) in results.items():
            scores[i] = Score(float(reward), formats[i], reason)
    return scores


def math_reward(response: str, gold: str, math_grader: str = "math-verify") -> float:
    """Outcome reward of one math response: 1.0 if its final answer equals `gold`, else 0.0.

    math_reward("... = \\boxed{\\dfrac{1}{2}}", "0.5") -> 1.0
    """
    return score_batch([response], [gold], ["math"], math_grader=math_grader)[0].reward
