"""The papers' own benchmarks beyond math (benchmark.py, eval.py): LeetCode and AIME 2025 shipped,
LiveCodeBench and the three multi-hop QA sets read from their release files, each graded as its paper's
code grades it, and `eval.py --responses` grading saved generations with no model.

    python -m pytest tests/test_benchmarks.py    # ~1 min on 2 cores (the sandbox runs every program)

No mocks: the shipped files, small release files written in each release's format
(tests/fixtures/releases/), the real sandbox and the real eval.py entry point.
"""

import base64
import json
import pickle
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

import benchmark
import sandbox
import verify

REPO = Path(__file__).resolve().parents[1]
RELEASES = REPO / "tests" / "fixtures" / "releases"
FILES = {"livecodebench": [str(RELEASES / "livecodebench.jsonl")],
         "hotpotqa": [str(RELEASES / "hotpot_dev_distractor.json")],
         "2wiki": [str(RELEASES / "2wiki_dev.json")], "2wiki-aliases": [str(RELEASES / "2wiki_id_aliases.json")],
         "musique": [str(RELEASES / "musique_ans_dev.jsonl")]}
FILE_FLAGS = [f"--benchmark-file={name}={path}" for name, paths in FILES.items() for path in paths]


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```"


# ---------------------------------------------------------------------------------------------------
# LeetCode: PRIME's 180 problems, each suite of 100 asserts run whole in the sandbox
# ---------------------------------------------------------------------------------------------------

# Right solutions, written here, of six problems (one builds linked lists with the test's own helpers).
LEETCODE_RIGHT = {
    0: "class Solution:\n    def minimumPushes(self, word: str) -> int:\n"
       "        return sum(i // 8 + 1 for i in range(len(word)))",
    1: "class Solution:\n    def countOfPairs(self, n: int, x: int, y: int) -> List[int]:\n"
       "        result = [0] * n\n"
       "        for i in range(1, n + 1):\n"
       "            for j in range(1, n + 1):\n"
       "                if i != j:\n"
       "                    d = min(abs(i - j), abs(i - x) + 1 + abs(y - j), abs(i - y) + 1 + abs(x - j))\n"
       "                    result[d - 1] += 1\n"
       "        return result",
    2: "class Solution:\n    def minimumPushes(self, word: str) -> int:\n"
       "        counts = sorted(Counter(word).values(), reverse=True)\n"
       "        return sum(c * (i // 8 + 1) for i, c in enumerate(counts))",
    4: "class Solution:\n    def minimumCost(self, nums: List[int]) -> int:\n"
       "        return nums[0] + sum(sorted(nums[1:])[:2])",
    5: "class Solution:\n    def canSortArray(self, nums: List[int]) -> bool:\n"
       "        groups = [list(g) for _, g in itertools.groupby(nums, key=lambda v: bin(v).count('1'))]\n"
       "        return all(max(a) <= min(b) for a, b in zip(groups, groups[1:]))",
    141: "class ListNode:\n    def __init__(self, val=0, next=None):\n        self.val = val\n        self.next = next\n"
         "class Solution:\n    def doubleIt(self, head: Optional[ListNode]) -> Optional[ListNode]:\n"
         "        digits = []\n        while head:\n            digits.append(head.val)\n            head = head.next\n"
         "        value = 2 * int(''.join(map(str, digits)))\n        out = None\n"
         "        for d in reversed(str(value)):\n            out = ListNode(int(d), out)\n        return out",
}


@pytest.fixture(scope="module")
def leetcode():
    return benchmark.load_benchmark("leetcode")


def test_leetcode_ships_prime_s_180_problems_each_a_suite_of_100_asserts(leetcode):
    assert len(leetcode) == 180 and leetcode[0].id == "weekly-contest-381-minimum-number-of-pushes-to-type-word-i"
    for item in leetcode:  # every suite splits into sandbox code and 100 literals compared outside
        test = sandbox.parse_assert_script(item.gold["assert_script"], item.id)
        assert len(test["expected"]) == 100 and "assert" not in test["script"]
    assert leetcode[0].question.endswith("```python\nclass Solution:\n    def minimumPushes(self, word: str) -> int:\n"
                                         "        \n```")


def test_right_leetcode_solutions_pass_and_wrong_crashing_looping_writing_ones_score_zero(leetcode, tmp_path):
    marker = tmp_path / "written-by-the-program"
    right = [(leetcode[i], fenced(code)) for i, code in LEETCODE_RIGHT.items()]
    minimum_pushes = LEETCODE_RIGHT[0]
    wrong = [
        minimum_pushes.replace("i // 8 + 1", "i // 9 + 1"),                    # wrong on a few of the 100
        minimum_pushes.replace("return", "raise ValueError('crash')  #"),      # crashes
        minimum_pushes.replace("return", "while True: pass  #"),               # loops past the 10 s
        f"open({str(marker)!r}, 'w').write('x')\n" + minimum_pushes,          # writes outside its sandbox
        "import sys\nsys.exit(0)\n" + minimum_pushes,                         # exits before the tests run
        minimum_pushes.replace("return sum", "print([1, 2, 3]); return -sum"),  # prints a plausible line
    ]
    graded = benchmark.grade("leetcode", [item for item, _ in right] + [leetcode[0]] * len(wrong),
                             [text for _, text in right] + [fenced(code) for code in wrong])
    assert [g.correct for g in graded] == [True] * len(right) + [False] * len(wrong), [g.reason for g in graded]
    assert "timeout" in graded[len(right) + 2].reason
    if sandbox.sandbox_mode() != "rlimits":  # as your own user ("rlimits") a program can write your files
        assert not marker.exists()


def test_leetcode_reads_code_as_prime_s_script_does():
    # the last ```python block that defines something wins over a later usage example
    text = ("```python\nclass Solution:\n    def f(self):\n        return 1\n```\nUsage:\n"
            "```python\nprint(Solution().f())\n```")
    assert benchmark.prime_code(text).strip().startswith("class Solution:")
    # a bare function is wrapped in `class Solution:`, each line indented, as evaluate_leetcode.py does
    assert benchmark.leetcode_program("```python\ndef f(self, x):\n    return x\n```") == \
        "class Solution:\n    \n    def f(self, x):\n        return x\n    "
    assert benchmark.prime_code("no fence at all") == "no fence at all"
    assert benchmark.prime_code("```\ndef g():\n    pass\n```") == "\ndef g():\n    pass\n"


def test_a_test_script_keeps_its_statements_and_compares_each_literal_outside():
    test = sandbox.parse_assert_script("s = Solution()\nx = {'a': 1}\nassert s.f(**x) == [1, (2, 3)]\n"
                                       "assert s.g() == 'b'", "t")
    assert test["expected"] == ["[1, (2, 3)]", "'b'"]
    assert test["script"] == "s = Solution()\nx = {'a': 1}\n_sandbox_got.append(s.f(**x))\n_sandbox_got.append(s.g())"
    for bad, message in (("assert f() > 2", "not of the form"), ("assert f() == g()", "not a literal"),
                         ("x = 1", "holds no assert"), ("assert (", "not Python")):
        with pytest.raises(ValueError, match=message):
            sandbox.parse_assert_script(bad, "t")
    program = "class Solution:\n    def f(self, a):\n        return [a, (2, 3)]\n    def g(self):\n        return 'b'"
    reference = {"assert_script": "s = Solution()\nx = {'a': 1}\nassert s.f(**x) == [1, (2, 3)]\nassert s.g() == 'b'"}
    # Python's == as the assert would use it: a tuple is not a list
    tuple_for_list = program.replace("return [a, (2, 3)]", "return [a, [2, 3]]")
    got = verify.score_batch([fenced(program), fenced(tuple_for_list)], [reference] * 2, ["code"] * 2)
    assert [s.reward for s in got] == [1.0, 0.0]


# ---------------------------------------------------------------------------------------------------
# LiveCodeBench: the release's rows, functional and stdin tests, public and private
# ---------------------------------------------------------------------------------------------------

MAX_SUM = "class Solution:\n    def maxSum(self, nums, k):\n        return max(sum(nums[i:i + k]) for i in range(len(nums) - k + 1))"
MEAN = "n = int(input())\na = list(map(int, input().split()))\nprint(sum(a) / n)"


def test_livecodebench_rows_are_read_as_released_within_the_date_window():
    items = benchmark.load_benchmark("livecodebench", files=FILES)
    assert [i.id for i in items] == ["3000", "abc300_a"]  # abc360_a (2024-07-01) is past v2's window
    functional, stdin = (i.gold for i in items)
    # public and private tests together; the private ones were base64(zlib(pickle(JSON))) and plain JSON
    assert functional["fn_name"] == "maxSum" and functional["inputs"] == [[[1, 2, 3, 4], 2], [[5, -1, 3], 1],
                                                                         [[2, 2, 2], 3]]
    assert functional["outputs"] == [7, 5, 6] and functional["pass_all"] and "from typing import *" in functional["header"]
    assert stdin["inputs"] == ["3\n1 2 4\n", "2\n1 2\n", "1\n7\n"] and stdin["compare"] == "lines"
    assert "### Format: You will use the following starter code" in items[0].question
    assert "Read the inputs from stdin" in items[1].question
    later = benchmark.load_benchmark("livecodebench", files=FILES, dates=("2024-01-06", "2024-12-31"))
    assert [i.id for i in later] == ["abc360_a"]


def test_livecodebench_grades_functional_and_stdin_tests_passing_and_failing():
    functional, stdin = benchmark.load_benchmark("livecodebench", files=FILES)
    cases = [(functional, MAX_SUM, True),
             (functional, MAX_SUM.replace("max(", "min("), False),       # wrong from the first test
             (functional, "def maxSum(nums, k):\n    return max(sum(nums[i:i + k]) for i in range(len(nums) - k + 1))",
              True),                                                      # the program's own function
             (functional, MAX_SUM.replace("return", "return 7 or"), False),  # right on the public test only
             (stdin, MEAN, True),
             (stdin, MEAN.replace("print(sum(a) / n)", "print(f'{sum(a) / n:.9f}')"), True),  # within 1e-5
             (stdin, MEAN.replace("print(sum(a) / n)", "print(round(sum(a) / n, 2))"), False),  # 2.33 is too far
             (stdin, MEAN.replace("print(sum(a) / n)", "print(sum(a) // n)"), False),
             (stdin, "while True:\n    pass", False)]
    graded = benchmark.grade("livecodebench", [c[0] for c in cases], [fenced(c[1]) for c in cases])
    assert [g.correct for g in graded] == [c[2] for c in cases], [g.reason for g in graded]
    assert graded[-1].reason.startswith("failed test 0 of 3: timeout")  # stopped at the first failure


def test_lines_match_is_livecodebench_s_lenient_rule():
    assert sandbox.lines_match("3 \n\n4\n", "3\n4")
    assert sandbox.lines_match("0.3333333", "0.33333333") and sandbox.lines_match("1e-9\n", "0\n")
    assert not sandbox.lines_match("1 2", "1\n2")        # the line structure counts
    assert not sandbox.lines_match("3\n4", "3\n5")       # integers compare exactly
    assert not sandbox.lines_match("0.34", "0.33")       # 0.01 > 1e-8 + 1e-5 * 0.33
    assert not sandbox.lines_match("a b", "a  c")


def _lcb_row(private: str) -> dict:
    return {"question_title": "t", "question_content": "q", "platform": "leetcode", "question_id": "9",
            "contest_id": "c", "contest_date": "2023-08-01T00:00:00", "starter_code": "", "difficulty": "easy",
            "public_test_cases": json.dumps([{"input": "1\n", "output": "1\n", "testtype": "stdin"}]),
            "private_test_cases": private, "metadata": "{}"}


def test_a_private_test_blob_that_would_run_code_is_refused_unread(tmp_path):
    row = json.loads((RELEASES / "livecodebench_unsafe.jsonl").read_text())
    blob = zlib.decompress(base64.b64decode(row["private_test_cases"]))
    # the fixture is live: pickle.loads on it calls print, in a process of its own
    naive = subprocess.run([sys.executable, "-c", f"import pickle; pickle.loads({blob!r})"], capture_output=True,
                           text=True, timeout=60)
    assert "UNPICKLED: this payload ran code" in naive.stdout
    with pytest.raises(SystemExit, match=r"livecodebench_unsafe.jsonl row 1: its private tests are a pickle that "
                                         r"holds STACK_GLOBAL, TUPLE1, REDUCE .*refused, nothing was unpickled"):
        benchmark.load_benchmark("livecodebench", files={"livecodebench": [str(RELEASES / "livecodebench_unsafe.jsonl")]})
    # other payloads than one JSON string: a list object, two strings, garbage, not base64
    two_strings = b"\x80\x04X\x01\x00\x00\x00aX\x01\x00\x00\x00b."  # BINUNICODE 'a', BINUNICODE 'b', STOP
    for payload, message in ((pickle.dumps([1, 2]), "holds EMPTY_LIST"), (pickle.dumps(("a", "b")), "holds TUPLE2"),
                             (two_strings, "2 strings"),
                             (b"not a pickle", "not a readable pickle")):
        path = tmp_path / "r.jsonl"
        path.write_text(json.dumps(_lcb_row(base64.b64encode(zlib.compress(payload)).decode())) + "\n")
        with pytest.raises(SystemExit, match=message):
            benchmark.load_benchmark("livecodebench", files={"livecodebench": [str(path)]})
    path.write_text(json.dumps(_lcb_row("%%% not base64 %%%")) + "\n")
    with pytest.raises(SystemExit, match="neither JSON nor base64"):
        benchmark.load_benchmark("livecodebench", files={"livecodebench": [str(path)]})
    # bytes, as a release might store them, decode like a string
    tests = json.dumps([{"input": "2\n", "output": "2\n", "testtype": "stdin"}]).encode()
    path.write_text(json.dumps(_lcb_row(base64.b64encode(zlib.compress(pickle.dumps(tests))).decode())) + "\n")
    assert benchmark.load_benchmark("livecodebench", files={"livecodebench": [str(path)]})[0].gold["inputs"] == \
        ["1\n", "2\n"]


# ---------------------------------------------------------------------------------------------------
# Multi-hop QA: exact match and F1 under SQuAD's normalisation, best over aliases
# ---------------------------------------------------------------------------------------------------


def test_qa_release_files_are_read_with_labelled_paragraphs_and_their_aliases():
    hotpot = benchmark.load_benchmark("hotpotqa", files=FILES)
    assert [i.gold for i in hotpot] == [["yes"], ["the Chief of Protocol"]]
    assert hotpot[0].question.startswith("Context:\n[P1] Ed Wood: [S1] Edward Davis Wood Jr. was an American")
    assert "[P2] Scott Derrickson: [S1] Scott Derrickson is an American director, screenwriter and producer. " \
           "[S2] He lives in Los Angeles, California." in hotpot[0].question
    assert hotpot[0].question.endswith("\n\nQuestion: Were Scott Derrickson and Ed Wood of the same nationality?")
    wiki = benchmark.load_benchmark("2wiki", files=FILES)  # answer_id keys id_aliases.json's aliases and demonyms
    assert wiki[1].gold == ["United States of America", "USA", "United States", "U.S.", "American"]
    without_aliases = benchmark.load_benchmark("2wiki", files={"2wiki": FILES["2wiki"]})
    assert without_aliases[1].gold == ["United States of America"]
    musique = benchmark.load_benchmark("musique", files=FILES)  # the unanswerable row is not a question
    assert [i.id for i in musique] == ["2hop__153573_109006", "3hop1__9285_5188_23307"]
    assert musique[1].gold == ["Paris", "Paris, France", "City of Light"]


def test_qa_exact_match_and_f1_on_worked_cases_of_the_official_normalisation():
    items = benchmark.load_benchmark("hotpotqa", files=FILES) + benchmark.load_benchmark("2wiki", files=FILES)
    hotpot_yes, hotpot_chief, _, wiki_usa = items
    cases = [  # (item, response, exact match, F1 worked by hand)
        (hotpot_chief, "Step.\nFinal Answer: Chief of Protocol", True, 1.0),              # article dropped
        (hotpot_chief, "Final Answer: THE   chief-of protocol!", False, 0.4),  # "chiefof protocol": 1 of 2 and 3
        (hotpot_chief, "Final Answer: Chief of Protocol of the United States", False, 2 * (3 / 6) * 1 / (3 / 6 + 1)),
        (hotpot_yes, "Final Answer: Yes.", True, 1.0),                                     # case, full stop
        (hotpot_yes, "Final Answer: no", False, 0.0),
        (wiki_usa, "Final Answer: the U.S.", True, 1.0),                                   # alias "U.S." -> "us"
        (wiki_usa, "Final Answer: an American", True, 1.0),                                # a demonym alias
        (wiki_usa, "Final Answer: United Kingdom", False, 2 * 0.5 * 0.5 / 1.0),          # best alias: "United States"
        (wiki_usa, "The answer is the USA.", False, 0.0),                                  # no "Final Answer:"
    ]
    graded = benchmark.grade("2wiki", [c[0] for c in cases], [c[1] for c in cases])
    assert [g.correct for g in graded] == [c[2] for c in cases]
    assert [g.f1 for g in graded] == pytest.approx([c[3] for c in cases])


# ---------------------------------------------------------------------------------------------------
# eval.py --responses: every new benchmark graded from saved generations, no model
# ---------------------------------------------------------------------------------------------------


def _responses(path: Path, rows: list[tuple[str, int, str]]) -> Path:
    path.write_text("".join(json.dumps({"benchmark": b, "index": i, "response": r}) + "\n" for b, i, r in rows))
    return path


def test_eval_grades_every_new_benchmark_from_a_responses_file_alone(tmp_path):
    """`python eval.py --responses` from another folder, as a user runs it: no model is named or loaded."""
    rows = [("leetcode", 0, fenced(LEETCODE_RIGHT[0])), ("leetcode", 0, fenced("print('no')")),
            ("leetcode", 4, fenced(LEETCODE_RIGHT[4])),
            ("aime25", 0, "So the sum is $\\boxed{70}$."), ("aime25", 1, "\\boxed{587}"),
            ("livecodebench", 1, fenced(MEAN)), ("livecodebench", 1, fenced(MEAN)), ("livecodebench", 0, fenced(MAX_SUM)),
            ("livecodebench", 0, "I cannot solve it."),
            ("hotpotqa", 1, "Final Answer: Chief of Protocol"), ("2wiki", 1, "Final Answer: the USA"),
            ("musique", 0, "Final Answer: Gong"), ("musique", 1, "Final Answer: Paris")]
    responses = _responses(tmp_path / "generations.jsonl", rows)
    out = subprocess.run([sys.executable, str(REPO / "eval.py"), "--responses", str(responses), *FILE_FLAGS,
                          "--out", str(tmp_path / "r.json")], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    got = report["benchmarks"]
    assert list(got) == ["leetcode", "aime25", "livecodebench", "hotpotqa", "2wiki", "musique"]
    # only the problems the file names; several rows of one problem are its samples
    assert got["leetcode"]["problems"] == 2 and got["leetcode"]["n"] == 1 and got["leetcode"]["responses"] == 3
    assert [p["correct"] for p in got["leetcode"]["per_problem"]] == [1, 1]
    assert got["leetcode"]["pass@1"] == pytest.approx((1 / 2 + 1) / 2) and got["leetcode"]["avg@n"] == pytest.approx(2 / 3)
    assert got["aime25"]["pass@1"] == pytest.approx(0.5)  # 70 right, 587 wrong (588)
    assert [(p["index"], p["correct"], p["n"]) for p in got["livecodebench"]["per_problem"]] == [(0, 1, 2), (1, 2, 2)]
    assert got["livecodebench"]["pass@1"] == pytest.approx(0.75) and got["livecodebench"]["pass@2"] == pytest.approx(1.0)
    assert got["hotpotqa"]["pass@1"] == 1.0 and got["2wiki"]["pass@1"] == 1.0 and got["musique"]["pass@1"] == 0.5
    assert got["musique"]["f1"] == pytest.approx(0.5) and "response_length" not in got["musique"]
    assert report["model"] is None and report["settings"]["livecodebench_dates"] == ["2023-05-01", "2024-05-31"]
    assert "livecodebench 2023-05-01..2024-05-31" in out.stdout and "F1" in out.stdout


def test_a_panel_names_and_leaves_out_a_member_whose_release_file_is_missing(tmp_path):
    rows = [("prime_aime24", 0, "\\boxed{204}"), ("prime_amc", 0, "\\boxed{142}"), ("leetcode", 0, fenced(LEETCODE_RIGHT[0]))]
    out = subprocess.run([sys.executable, str(REPO / "eval.py"), "--responses", str(_responses(tmp_path / "g.jsonl", rows)),
                          "--panel", "prime", "--out", str(tmp_path / "r.json")], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert "code_generation_lite" in report["left_out"].pop("livecodebench")  # no release file named
    assert report["left_out"] == {name: f"no rows in --responses {tmp_path / 'g.jsonl'}"
                                  for name in ("prime_math500", "minerva", "olympiad")}
    assert list(report["benchmarks"]) == ["prime_aime24", "prime_amc", "leetcode"]
    lines = out.stdout.splitlines()
    assert any(line.startswith("LiveCodeBench") and "not run" in line for line in lines)
    assert any(line.startswith("AIME 2024") for line in lines) and any(line.startswith("average (3 of 7)") for line in lines)
    assert report["settings"]["system_prompt"] == benchmark.PRIME_SYSTEM_PROMPT
    # then the paper's layout: its columns in its order, "-" where a column did not run, the average of the rest
    top = lines.index("PRIME, Table 2 (greedy pass@1)", 1)
    assert lines[top + 1].split() == ["AIME", "2024", "AMC", "MATH-500", "MinervaMath", "OlympiadBench", "LeetCode",
                                      "LiveCodeBench", "Avg."]
    assert lines[top + 2].split() == ["100.0", "100.0", "-", "-", "-", "100.0", "-", "100.0", "pass@1", "(3", "of", "7)"]


@pytest.mark.parametrize("row, message", [
    ('{"benchmark": "leetcode", "index": 0}', "line 2: expected the fields benchmark, index and response"),
    ('{"benchmark": "leetcodes", "index": 0, "response": "x"}', "line 2: unknown benchmark 'leetcodes'"),
    ('{"benchmark": "leetcode", "index": 180, "response": "x"}', r"line 2: index 180 is not a problem of leetcode \(0 to 179\)"),
    ('{"benchmark": "aime25", "index": "3", "response": "x"}', "line 2: index '3' is not a problem"),
    ('{"benchmark": "hotpotqa", "index": 0, "response": "x"}', "line 2: hotpotqa needs its release file"),
    ("not json", "line 2: not JSON"),
])
def test_a_bad_responses_row_stops_with_its_line_number(tmp_path, row, message):
    import eval
    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps({"benchmark": "aime25", "index": 0, "response": "\\boxed{70}"}) + "\n" + row + "\n")
    with pytest.raises(SystemExit, match=message):
        eval.main(["--responses", str(path), "--out", str(tmp_path / "r.json")])


def test_release_benchmark_flags_name_what_is_wrong(tmp_path, capsys):
    import eval
    for argv, message in ((["--benchmark-file", "aime25=x.jsonl"], "NAME one of livecodebench"),
                          (["--benchmark-file", f"hotpotqa={tmp_path / 'none.json'}"], "no such file"),
                          (["--lcb-dates", "2024-05-31:2023-05-01"], "two dates YYYY-MM-DD in order")):
        with pytest.raises(SystemExit):
            eval.parse_args(["--responses", str(RELEASES / "musique_ans_dev.jsonl"), *argv])
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit, match="livecodebench needs its release file: the `test.*jsonl` files"):
        benchmark.load_benchmark("livecodebench")


def test_panels_follow_their_papers_tables():
    assert [m[0] for m in benchmark.PANELS["prime"].members] == [
        "prime_aime24", "prime_amc", "prime_math500", "minerva", "olympiad", "leetcode", "livecodebench"]
    assert [m[0] for m in benchmark.PANELS["pass-math"].members] == [
        "aime24", "aime25", "amc23", "gsm8k", "math500", "minerva", "olympiad"]
    assert [m[0] for m in benchmark.PANELS["pass-qa"].members] == ["musique", "2wiki", "hotpotqa"]
    lcb = dict((m[0], m[2]) for m in benchmark.PANELS["prime"].members)["livecodebench"]
    assert (lcb.n, lcb.greedy, lcb.temperature, lcb.top_p, lcb.max_new_tokens) == (10, False, 0.2, 0.95, 4096)
    assert all(m[2].greedy for m in benchmark.PANELS["prime"].members[:6])
    assert {(m[2].temperature, m[2].top_p, m[2].max_new_tokens) for m in benchmark.PANELS["pass-math"].members} == \
        {(1.0, 0.95, 2048)} and all(m[2].n >= 8 for m in benchmark.PANELS["pass-math"].members)
    assert {m[2].n for m in benchmark.PANELS["pass-qa"].members} == {16}
    assert len(benchmark.load_benchmark("prime_aime24")) == 30
    assert benchmark.load_benchmark("aime25")[0].question.endswith("is a divisor of $97_b.$")
