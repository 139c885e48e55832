"""Tests of eval.py: the pass@k estimator, every benchmark's gold answers, end-to-end evaluations of
the toy SFT checkpoint on CPU, the run-comparison plot, and the error messages.

    python -m pytest tests/test_eval.py    # ~5 min on 2 idle cores: the SFT warmup and two short
                                           # train.py runs take most of it

No mocks: the real tiny model, the real rollout, the real verifier pool, the real data files in
benchmarks/ and real train.py runs.
"""

import hashlib
import json
import math
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import benchmark  # noqa: E402
import config  # noqa: E402
import data  # noqa: E402
import eval  # noqa: E402  (our eval.py; shadows the builtin only inside this file)
import runlog  # noqa: E402
import toy_task  # noqa: E402
import verify  # noqa: E402

DATA = benchmark.DATA_DIR  # benchmarks/ in this repository
from conftest import SFT_STEPS


@pytest.fixture(scope="session")
def cache(cache_dir):
    """The session's toy SFT checkpoint folder (tests/conftest.py builds it once for all files)."""
    return cache_dir


@pytest.fixture(scope="session")
def sft(cache):
    return toy_task.sft_checkpoint(cache, SFT_STEPS)


@pytest.fixture(scope="session")
def runs(cache, tmp_path_factory):
    """Two short real train.py runs to compare: PRIME (A) and the outcome-only baseline (B)."""
    from test_train import train_here  # in this process, one after the other: no interpreter to start
    out = tmp_path_factory.mktemp("runs")
    for name, steps, extra in (("A", 3, []), ("B", 2, ["--process", "none"])):
        train_here(["--steps", str(steps), "--run-name", name, *extra], cache, out)
    return out / "A", out / "B"


def run_eval(capsys, *argv):
    """eval.py's real entry point in this process (saves a torch import per call); -> (report, stdout)."""
    report = eval.main([str(a) for a in argv])
    return report, capsys.readouterr().out


# ---------------------------------------------------------------------------------------------------
# pass@k and the bootstrap
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n, c, k, expected", [
    (1, 0, 1, 0.0),
    (1, 1, 1, 1.0),
    (4, 1, 1, 1 / 4),            # pass@1 = c / n
    (5, 2, 2, 7 / 10),           # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (10, 3, 5, 11 / 12),         # 1 - C(7,5)/C(10,5) = 1 - 21/252
    (16, 4, 8, 25 / 26),         # 1 - C(12,8)/C(16,8) = 1 - 495/12870
    (10, 0, 3, 0.0),             # c = 0: never solved
    (10, 10, 3, 1.0),            # c = n: always solved
    (10, 1, 10, 1.0),            # k = n: all samples drawn, one is right
    (10, 0, 10, 0.0),            # k = n, c = 0
    (8, 7, 2, 1.0),              # n - c < k: every pair holds a correct sample
])
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert eval.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("c, k", [(1, 1), (10, 100), (500, 64), (3, 999), (990, 5), (0, 1000), (1, 1000)])
def test_pass_at_k_large_n_matches_exact_fractions(c, k):
    n = 1000  # C(1000, 500) has 300 digits: factorials in floats would overflow
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert eval.pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12)


def test_pass_at_k_rejects_impossible_arguments():
    for n, c, k in ((4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)):
        with pytest.raises(ValueError, match="pass_at_k"):
            eval.pass_at_k(n, c, k)


def test_ks_are_powers_of_two_up_to_n():
    assert eval.ks_for(1) == [1]
    assert eval.ks_for(6) == [1, 2, 4]
    assert eval.ks_for(16) == [1, 2, 4, 8, 16]


def test_bootstrap_interval():
    assert eval.bootstrap_interval([0.25] * 30) == (0.25, 0.25)
    # 100 problems, half solved: the normal approximation gives 0.5 +- 1.96 * 0.05
    low, high = eval.bootstrap_interval([0.0, 1.0] * 50)
    assert low == pytest.approx(0.402, abs=0.02) and high == pytest.approx(0.598, abs=0.02)
    assert eval.bootstrap_interval([0.0, 1.0] * 50) == (low, high)  # fixed seed: reproducible


def test_bootstrap_interval_equals_a_plain_numpy_loop():
    # the same generator, one resample at a time, and percentiles by linear interpolation by hand
    values = [0.0, 0.25, 1.0, 0.5, 0.75, 1.0, 0.0]
    for resamples, seed in ((200, 0), (2000, 3)):
        rng = np.random.default_rng(seed)
        means = sorted(sum(values[j] for j in rng.integers(0, len(values), size=len(values))) / len(values)
                       for _ in range(resamples))

        def percentile(p):
            pos = p / 100 * (resamples - 1)
            lo = int(pos)
            return means[lo] + (means[min(lo + 1, resamples - 1)] - means[lo]) * (pos - lo)

        low, high = eval.bootstrap_interval(values, resamples=resamples, seed=seed)
        assert low == pytest.approx(percentile(2.5), abs=1e-12)
        assert high == pytest.approx(percentile(97.5), abs=1e-12)
    assert eval.bootstrap_interval(values) == eval.bootstrap_interval(values, eval.BOOTSTRAP_RESAMPLES, eval.BOOTSTRAP_SEED)


def test_moving_average():
    assert runlog.moving_average([1, 2, 3, 4], window=2).tolist() == [1, 1.5, 2.5, 3.5]
    smooth = runlog.moving_average([math.nan, 1.0, math.nan, 3.0], window=10)  # PRM accuracy has gaps
    assert math.isnan(smooth[0]) and smooth[1:].tolist() == [1.0, 1.0, 2.0]


# ---------------------------------------------------------------------------------------------------
# Benchmarks: every gold answer, through eval.py's own loaders
# ---------------------------------------------------------------------------------------------------

# A few golds read by hand from the files, so that a loader reading the wrong field is caught (a
# wrong field could still verify against itself).
HAND_READ = [("math500", 0, "\\left( 3, \\frac{\\pi}{2} \\right)"), ("gsm8k", 0, "18"),
             ("aime24", 0, "204"), ("amc23", 0, "27.0"), ("minerva", 0, "1.6"),
             ("olympiad", 0, "2"), ("prime_amc", 0, "142.0"), ("prime_aime", 0, "116"),
             ("prime_math500", 0, "4")]
# Golds math-verify cannot match against themselves, with the reason: none with math-verify 0.9.0.
KNOWN_FAILURES: dict[tuple[str, int], str] = {}


# The math benchmarks that ship (code is tested in test_benchmarks.py; release files do not ship).
SHIPPED_MATH = [name for name, bench in benchmark.BENCHMARKS.items() if bench.kind == "math"]


def test_every_gold_verifies_against_itself():
    items = [(name, item) for name in SHIPPED_MATH for item in benchmark.load_benchmark(name, DATA)]
    for name in SHIPPED_MATH:  # problem counts as in SOURCES.md (prime_aime24: the 30 rows of 2024)
        expected = 30 if name == "prime_aime24" else benchmark.BENCHMARKS[name].rows
        assert sum(n == name for n, _ in items) == expected, name
    golds = {(name, item.index): item.gold for name, item in items}
    for name, index, gold in HAND_READ:
        assert golds[(name, index)] == gold, (name, index)
    olympiad = [json.loads(line) for line in open(DATA / "olympiadbench/test.jsonl", encoding="utf-8")]
    multiple = [i for i, row in enumerate(olympiad) if row["is_multiple_answer"]]
    assert len(multiple) == 94 and golds[("olympiad", multiple[1])] == "$69$,$84$"

    # One batch: each gold boxed as a model would write it; plus the forms models actually write for
    # GSM8K's thousands separators ("1,600" -> 1600) and AMC's floats ("27.0" -> 27).
    cases = [(f"The answer is $\\boxed{{{gold}}}$.", gold, key) for key, gold in golds.items()]
    cases += [(f"\\boxed{{{gold.replace(',', '')}}}", gold, key) for key, gold in golds.items()
              if key[0] == "gsm8k" and "," in gold]
    cases += [(f"\\boxed{{{int(float(gold))}}}", gold, key) for key, gold in golds.items()
              if key[0] in ("amc23", "prime_amc")]
    # what the grader accepts, not how fast: a generous time limit, so that a loaded machine (CI beside
    # training runs) cannot turn a slow sympy comparison into a "timeout" failure
    scores = verify.score_batch([c[0] for c in cases], [c[1] for c in cases], ["math"] * len(cases), timeout=60.0)
    failures = {key: (gold, s.reason) for (_, gold, key), s in zip(cases, scores)
                if (s.reward, s.format) != (1.0, 1)}
    assert {k: v for k, v in failures.items() if k not in KNOWN_FAILURES} == {}, \
        f"{len(failures)} golds do not verify: {list(failures.items())[:10]}"
    assert sum(key[0] == "gsm8k" for _, _, key in cases) > 1319  # the comma cases did run


def test_every_shipped_benchmark_file_has_the_hash_and_row_count_its_sources_page_gives():
    """benchmarks/SOURCES.md's table: each file byte-for-byte the upstream copy it names."""
    table = re.findall(r"^\| `([^`]+)` \(`(\w+)`\) \| (\d+) \|.*\| `([0-9a-f]{64})` \|$",
                       (DATA / "SOURCES.md").read_text(), re.MULTILINE)
    # every shipped file once (prime_aime24 is a selection of prime_aime's rows)
    assert {name for _, name, _, _ in table} == {name for name, b in benchmark.BENCHMARKS.items()
                                                 if b.path and b.keep is None}
    for path, name, rows, sha in table:
        assert benchmark.BENCHMARKS[name].path == path and benchmark.BENCHMARKS[name].rows == int(rows), name
        assert len(data.read_rows(DATA / path)) == int(rows), name
        assert hashlib.sha256((DATA / path).read_bytes()).hexdigest() == sha, f"{path} differs from its source"
    shipped = sorted(str(p.relative_to(DATA)) for p in DATA.rglob("*") if p.is_file() and p.name != "SOURCES.md")
    assert shipped == sorted(path for path, _, _, _ in table)  # nothing shipped that the page does not name


def test_eval_runs_every_benchmark_from_the_repository_alone(sft, tmp_path):
    """`python eval.py` as a user runs it, from another folder, with the default --data-dir: every
    benchmark it names, two problems each (the toy model answers none of the math; the point is that
    each file is found, read and scored)."""
    names = ",".join(name for name, bench in benchmark.BENCHMARKS.items() if not bench.release)
    out = subprocess.run([sys.executable, str(REPO / "eval.py"), "--model", str(sft), "--benchmarks", names,
                          "--greedy", "--limit", "2", "--max-new-tokens", "8", "--out", str(tmp_path / "r.json")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert list(report["benchmarks"]) == names.split(",")
    assert all(b["problems"] == 2 for b in report["benchmarks"].values())
    assert report["settings"]["data_dir"] == "benchmarks"  # relative: a report names no machine's folders
    golds = [p["gold"] for p in report["benchmarks"]["gsm8k"]["per_problem"]]
    assert golds == [item.gold for item in benchmark.load_benchmark("gsm8k", DATA, 2)] == ["18", "3"]


def test_sums_task_file_is_distinct_two_digit_questions_with_their_sums(tmp_path):
    """python data.py sums: what the README's real-model runs train on. Every row a distinct pair of
    two-digit numbers, gold their sum as math-verify reads it; the same seed writes the same file."""
    out = tmp_path / "sums.jsonl"
    subprocess.run([sys.executable, str(Path(data.__file__)), "sums", "--digits", "2", "--rows", "300",
                    "--out", str(out)], check=True, capture_output=True)
    rows = data.read_rows(out)
    pairs = [tuple(int(x) for x in r["question"].removeprefix("What is ").removesuffix("?").split(" + "))
             for r in rows]
    assert len(rows) == 300 and len(set(pairs)) == 300
    assert all(10 <= a <= 99 and 10 <= b <= 99 and r["answer"] == str(a + b) for (a, b), r in zip(pairs, rows))
    assert rows == data.sums_rows(300, 2, seed=0) != data.sums_rows(300, 2, seed=1)
    scores = verify.score_batch([f"\\boxed{{{r['answer']}}}" for r in rows], [r["answer"] for r in rows],
                                ["math"] * len(rows))
    assert all(s.reward == 1.0 for s in scores)
    with pytest.raises(SystemExit, match="--rows 82: there are only 81 pairs of 1-digit numbers"):
        data.sums_rows(82, 1)


def test_chain_task_file_its_worked_solutions_and_their_exact_checker(tmp_path):
    """python data.py chains (issue 53's task with steps): distinct questions of three one-digit numbers,
    gold the total; the SFT file's worked solutions leave out the RL file's questions, slip as often as
    asked and carry on from a slip; chain_steps marks each line by hand-worked rules."""
    rl, sft = tmp_path / "chains.jsonl", tmp_path / "chains-sft.jsonl"
    subprocess.run([sys.executable, str(Path(data.__file__)), "chains", "--terms", "3", "--digits", "1", "--rows", "400",
                    "--out", str(rl)], check=True, capture_output=True)
    subprocess.run([sys.executable, str(Path(data.__file__)), "chains", "--terms", "3", "--digits", "1", "--rows", "300",
                    "--seed", "1", "--slip", "0.2", "--exclude", str(rl), "--out", str(sft)], check=True, capture_output=True)
    rows, demos = data.read_rows(rl), data.read_rows(sft)
    numbers = [[int(x) for x in r["question"].removeprefix("What is ").removesuffix("?").split(" + ")] for r in rows]
    assert len({tuple(n) for n in numbers}) == 400 and all(len(n) == 3 and 1 <= min(n) and max(n) <= 9 for n in numbers)
    assert all(r["answer"] == str(sum(n)) for r, n in zip(rows, numbers))
    assert not {r["question"] for r in rows} & {r["question"] for r in demos}  # no held-out question is a demonstration
    steps = [data.chain_steps(r["question"], r["solution"]) for r in demos]
    assert all(len(s) == 2 for s in steps)
    slips = sum(s.count(0.0) for s in steps) / (2 * len(steps))
    assert 0.15 < slips < 0.25  # 600 steps at p = 0.2: 3 standard errors is 0.05
    for r, s in zip(demos, steps):  # a demonstration with no slip boxes the right total
        if s == [1.0, 1.0]:
            assert f"\\boxed{{{r['answer']}}}" in r["solution"]
    assert data.chain_solution((7, 5, 8), __import__("random").Random(0), 0.0) == \
        "7 + 5 = 12\n12 + 8 = 20\nThe answer is $\\boxed{20}$."
    question = "What is 7 + 5 + 8?"
    assert data.chain_steps(question, "7 + 5 = 12\n12 + 8 = 20") == [1.0, 1.0]
    assert data.chain_steps(question, "7 + 5 = 13\n13 + 8 = 21") == [0.0, 1.0]  # carries on from its slip
    assert data.chain_steps(question, "7 + 5 = 12\n13 + 8 = 21") == [1.0, 0.0]  # not its running total
    assert data.chain_steps(question, "1. 7 + 5 = 12\nso\n2. 12 + 9 = 21\n21 + 1 = 22") == [1.0, 0.0, 0.0]
    assert data.chain_steps(question, "The answer is 20.") == []
    assert data.chain_steps(question, "7 + 5 = 12.\n12 + 8 = 20 .") == [1.0, 1.0]  # a sentence's stop
    assert data.chain_steps(question, "7 + 5 = 12.5\n7 + 5 = 12..") == []  # not a whole-number step
    with pytest.raises(ValueError, match="not a chain question"):
        data.chain_steps("What is 7?", "7 + 0 = 7")
    with pytest.raises(SystemExit, match="only 729 questions"):
        data.chain_rows(700, 3, 1, exclude={r["question"] for r in rows})


def test_sft_on_solutions_learns_the_targets_and_saves_a_loadable_model(cache_dir, tmp_path):
    """models.sft_on_solutions on the embedded model (no chat template: the plain prompt): a few steps on
    two worked solutions lower their loss, and the folder it writes reloads with from_pretrained."""
    import models
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    start = toy_task.sft_checkpoint(cache_dir, SFT_STEPS)
    rows = [{"question": "(1+2)*3", "solution": "1+2=3\n3*3=9\n\\boxed{9}"},
            {"question": "(4+4)-5", "solution": "4+4=8\n8-5=3\n\\boxed{3}"}]
    tokenizer = AutoTokenizer.from_pretrained(start)

    def loss(model):
        total = 0.0
        for row in rows:
            prompt = data.build_prompt(tokenizer, row["question"])[0]
            target = tokenizer(row["solution"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            ids = torch.tensor([prompt + target])
            labels = torch.tensor([[-100] * len(prompt) + target])
            with torch.no_grad():
                total += model(input_ids=ids, labels=labels).loss.item()
        return total

    before = loss(AutoModelForCausalLM.from_pretrained(start))
    out = models.sft_on_solutions(start, rows, tmp_path / "sft", steps=8, lr=1e-3, batch_size=2, log=lambda m: None)
    after = loss(AutoModelForCausalLM.from_pretrained(out))
    assert after < 0.5 * before, (before, after)
    with pytest.raises(SystemExit, match="needs 'question' and 'solution'"):
        models.sft_on_solutions(start, [{"question": "1+1"}], tmp_path / "bad", steps=1)


def test_multiple_answer_gold_needs_all_answers_in_any_order():
    scores = verify.score_batch(["\\boxed{69}", "\\boxed{84, 69}", "\\boxed{69, 84}"],
                                ["$69$,$84$"] * 3, ["math"] * 3)
    assert [s.reward for s in scores] == [0.0, 1.0, 1.0]


# ---------------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------------


def test_prompts_match_training_prompts_with_and_without_chat_template(sft):
    tokenizer = eval.load_tokenizer(str(sft))
    assert data.MATH_SUFFIX.endswith("Present the answer in LaTex format: \\boxed{Your answer}")  # the paper's
    row = {"problem": "What is $1+1$?", "answer": "2"}
    for template in (None, "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
                           "{% if add_generation_prompt %}[assistant]{% endif %}"):
        tokenizer.chat_template = template
        for system in ("", "Think step by step."):
            ids, text = data.build_prompt(tokenizer, row["problem"], system_prompt=system)
            task = data.row_to_task(row, 0, config.Args(system_prompt=system), tokenizer)
            assert ids == task.prompt_ids
            if template:
                assert text.startswith(f"[system]{system}\n" if system else "[user]")
                assert text.endswith(f"[user]{row['problem']}{data.MATH_SUFFIX}\n[assistant]")
            else:
                assert text == (f"{system}\n\n" if system else "") + row["problem"] + data.MATH_SUFFIX
    tokenizer.chat_template = None
    problem = toy_task.heldout_problems(1)[0]  # the toy benchmark: the raw problem text
    assert data.build_prompt(tokenizer, problem.prompt, templated=False) == (
        tokenizer(problem.prompt)["input_ids"], problem.prompt)


# ---------------------------------------------------------------------------------------------------
# End to end on CPU with the toy SFT checkpoint
# ---------------------------------------------------------------------------------------------------


def test_toy_benchmark_greedy_with_the_default_flags(sft, capsys):
    _, stdout = run_eval(capsys, "--model", sft, "--greedy", "--limit", 50)
    report = json.loads((sft / "eval.json").read_text())  # default --out: next to the model
    assert list(report["benchmarks"]) == ["toy"]  # no chat template: the toy benchmark by default
    assert not list(sft.glob("*.tmp*"))  # the atomic write left nothing behind
    toy = report["benchmarks"]["toy"]
    problems = toy_task.heldout_problems(50)
    assert toy["problems"] == 50 and toy["n"] == 1 and "pass@2" not in toy
    assert [p["gold"] for p in toy["per_problem"]] == [p.answer for p in problems]
    assert toy["example_prompt"] == problems[0].prompt  # raw text: no template, no suffix
    correct = [p["correct"] for p in toy["per_problem"]]
    assert set(correct) <= {0, 1} and toy["pass@1"] == pytest.approx(sum(correct) / 50)
    assert toy["avg@n"] == pytest.approx(toy["pass@1"])
    low, high = toy["pass@1_ci95"]
    assert low <= toy["pass@1"] <= high
    for p in toy["per_problem"]:  # integer answers checked without math-verify
        answer = p["answers"][0]
        if answer is not None and answer.isdigit():
            assert p["correct"] == int(int(answer) == int(p["gold"])), p
    assert toy["format"] > 0.5, "the SFT model should write one \\boxed{} answer"
    assert 0 < toy["response_length"] <= 48
    row = next(line for line in stdout.splitlines() if line.startswith("toy "))
    assert f"{100 * toy['pass@1']:.1f}" in row.split()


def test_toy_benchmark_sampled_pass_at_k(sft, tmp_path, capsys):
    args = ["--model", sft, "--benchmarks", "toy", "--limit", "12", "--n", "4", "--temperature", "0.6",
            "--top-p", "0.95", "--seed", "3", "--batch-size", "16", "--out", tmp_path / "a.json"]
    report, stdout = run_eval(capsys, *args)
    toy = report["benchmarks"]["toy"]
    correct = [p["correct"] for p in toy["per_problem"]]
    assert len(correct) == 12 and all(len(p["answers"]) == 4 for p in toy["per_problem"])
    for k in (1, 2, 4):
        assert toy[f"pass@{k}"] == pytest.approx(sum(eval.pass_at_k(4, c, k) for c in correct) / 12)
    assert "pass@8" not in toy
    assert toy["pass@1"] <= toy["pass@2"] <= toy["pass@4"]
    assert toy["avg@n"] == pytest.approx(toy["pass@1"])  # 0/1 math rewards
    assert report["settings"]["temperature"] == 0.6 and report["settings"]["top_p"] == 0.95
    assert "pass@4" in stdout and json.loads((tmp_path / "a.json").read_text()) == report
    again, _ = run_eval(capsys, *args[:-1], tmp_path / "b.json")  # the same seed: the same samples
    assert [p["answers"] for p in again["benchmarks"]["toy"]["per_problem"]] == \
           [p["answers"] for p in toy["per_problem"]]
    assert report["settings"]["math_grader"] == "math-verify"
    # The official last-box rule on the same samples: where it counts fewer right, some response of
    # the problem has no box (math-verify read an answer elsewhere in it: at 48 tokens some toy
    # responses are cut off before their box); where there is one box each, both read the same.
    official, _ = run_eval(capsys, *args[:-1], tmp_path / "c.json", "--math-grader", "official")
    assert official["settings"]["math_grader"] == "official"
    for p, q in zip(toy["per_problem"], official["benchmarks"]["toy"]["per_problem"]):
        assert p["correct"] == q["correct"] or (p["correct"] > q["correct"] and None in p["answers"])
    # the per-problem counts --compare pairs add up to the benchmark's own rates
    assert sum(p["boxed"] for p in toy["per_problem"]) / 48 == pytest.approx(toy["format"])
    assert sum(p["truncated"] for p in toy["per_problem"]) / 48 == pytest.approx(toy["truncated"])
    assert np.mean([p["length"] for p in toy["per_problem"]]) == pytest.approx(toy["response_length"])
    # the two graders on the same samples: the same boxes, cut-offs and lengths; math-verify never fewer right
    stats, stdout = run_eval(capsys, "--compare", tmp_path / "a.json", tmp_path / "c.json")
    toy_stats = stats["toy"]
    for metric in ("boxed", "truncated", "length"):
        assert toy_stats[metric]["difference"] == 0 and toy_stats[metric]["agree"]
    diffs = [p["correct"] / 4 - q["correct"] / 4
             for p, q in zip(toy["per_problem"], official["benchmarks"]["toy"]["per_problem"])]
    assert toy_stats["pass@1"]["difference"] == pytest.approx(np.mean(diffs)) and min(diffs) >= 0
    assert "pass@1" in stdout and "(12 problems)" in stdout


def _report(n: int, problems: list[tuple]) -> dict:
    """An eval.py report of one benchmark: (index, correct, boxed, truncated, length) per problem."""
    return {"benchmarks": {"gsm8k": {"n": n, "per_problem": [
        dict(index=i, correct=c, boxed=b, truncated=t, length=length) for i, c, b, t, length in problems]}}}


def test_compare_pairs_problems_by_index_with_hand_computed_standard_errors():
    # A: problems 0, 1, 2, 9 at n = 4; B: problems 2, 1, 0 (another order) at n = 2, plus 7 that A lacks
    a = _report(4, [(0, 4, 4, 0, 10.0), (1, 2, 3, 1, 20.0), (2, 0, 1, 0, 30.0), (9, 1, 1, 1, 5.0)])
    b = _report(2, [(2, 0, 1, 1, 24.0), (1, 1, 2, 1, 20.0), (0, 1, 2, 0, 10.0), (7, 2, 2, 0, 1.0)])
    stats = eval.compare_evaluations(a, b)["gsm8k"]
    # pass@1 per shared problem 0, 1, 2: A 1, 1/2, 0; B 1/2, 1/2, 0 -> d = 1/2, 0, 0
    # mean 1/6; deviations 1/3, -1/6, -1/6: sum of squares 1/6, / 2 -> variance 1/12, SE sqrt(1/12 / 3) = 1/6
    p1 = stats["pass@1"]
    assert p1["problems"] == 3 and p1["a"] == pytest.approx(0.5) and p1["b"] == pytest.approx(1 / 3)
    assert p1["difference"] == pytest.approx(1 / 6) and p1["se"] == pytest.approx(1 / 6)
    assert p1["ci95"] == pytest.approx([1 / 6 - 1.96 / 6, 1 / 6 + 1.96 / 6]) and p1["agree"]
    # boxed: A 1, 3/4, 1/4; B 1, 1, 1/2 -> d = 0, -1/4, -1/4: mean -1/6, SE sqrt((1/36 + 2/144) / 2 / 3) = 1/12
    assert stats["boxed"]["difference"] == pytest.approx(-1 / 6) and stats["boxed"]["se"] == pytest.approx(1 / 12)
    assert not stats["boxed"]["agree"]  # |-1/6| > 1.96 / 12
    # lengths are compared in tokens, not over n: d = 0, 0, 6 -> mean 2, SE sqrt(24 / 2 / 3) = 2
    assert stats["length"]["difference"] == pytest.approx(2.0) and stats["length"]["se"] == pytest.approx(2.0)
    # a report from before a metric was recorded: that metric is left out, the others stay
    for p in a["benchmarks"]["gsm8k"]["per_problem"]:
        del p["boxed"]
    assert set(eval.compare_evaluations(a, b)["gsm8k"]) == {"pass@1", "truncated", "length"}
    one = _report(2, [(5, 1, 1, 0, 3.0)])
    with pytest.raises(SystemExit, match="gsm8k has 0 problems in both files"):
        eval.compare_evaluations(a, one)


def test_compare_names_a_missing_file(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        eval.parse_args(["--compare", str(tmp_path / "hf.json"), str(tmp_path / "vllm.json")])
    assert e.value.code == 2 and f"--compare {tmp_path / 'hf.json'}: no such file" in capsys.readouterr().err


def test_math500_slice_end_to_end(sft, tmp_path, capsys):
    """The toy model scores ~0 on MATH-500; the point is the whole path: prompts, generation in
    several calls, scoring, table, JSON (with the toy benchmark beside it: two rows and an average)."""
    report, stdout = run_eval(capsys, "--model", sft, "--benchmarks", "math500,toy", "--greedy", "--limit", "20",
                              "--max-new-tokens", "32", "--batch-size", "8", "--out", tmp_path / "r.json")
    assert list(report["benchmarks"]) == ["math500", "toy"]
    assert report["average_pass@1"] == pytest.approx(
        (report["benchmarks"]["math500"]["pass@1"] + report["benchmarks"]["toy"]["pass@1"]) / 2)
    assert report["benchmarks"]["toy"]["example_prompt"] == toy_task.heldout_problems(1)[0].prompt
    assert any(line.startswith("average ") for line in stdout.splitlines())
    math500 = report["benchmarks"]["math500"]
    rows = [json.loads(line) for line in open(DATA / "math500/test.jsonl", encoding="utf-8")][:20]
    assert math500["problems"] == 20 and [p["gold"] for p in math500["per_problem"]] == [r["answer"] for r in rows]
    assert math500["example_prompt"] == rows[0]["problem"] + data.MATH_SUFFIX  # no chat template: plain text
    assert 0.0 <= math500["pass@1"] <= 1.0 and 0 < math500["response_length"] <= 32
    assert report["settings"]["max_new_tokens"] == 32
    assert json.loads((tmp_path / "r.json").read_text())["benchmarks"]["math500"]["problems"] == 20
    assert any(line.startswith("math500 ") for line in stdout.splitlines()) and "95% CI" in stdout


def test_toy_greedy_equals_the_runs_own_end_accuracy(runs, tmp_path, capsys):
    """train.py's end accuracy is greedy on the first 16 held-out problems: eval.py must agree."""
    run_a, _ = runs
    report, _ = run_eval(capsys, "--model", run_a / "final", "--greedy", "--limit", "16",
                         "--out", tmp_path / "r.json")
    summary = json.loads((run_a / "summary.json").read_text())
    assert report["benchmarks"]["toy"]["pass@1"] == pytest.approx(summary["end_accuracy"])


def test_plot_compares_two_runs(runs, tmp_path, capsys):
    out = tmp_path / "figs" / "compare.png"
    eval.main(["--plot", *map(str, runs), "--plot-out", str(out)])
    assert f"wrote {out}" in capsys.readouterr().out
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image
    height, width, _ = matplotlib.image.imread(out).shape
    assert (width, height) == (1700, 850)
    assert [p.name for p in out.parent.iterdir()] == ["compare.png"]  # no temporary file left


# ---------------------------------------------------------------------------------------------------
# Clear errors
# ---------------------------------------------------------------------------------------------------


def test_eval_command_line_exit_code_and_no_traceback():
    """The command line itself, once: a usage error exits 2 with the message and no traceback."""
    proc = subprocess.run([sys.executable, str(REPO / "eval.py"), "--model", "unused",
                           "--benchmarks", "math500,mathh500"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--benchmarks: unknown benchmark 'mathh500'; choose from math500, gsm8k" in proc.stderr


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_missing_files_and_fields_name_the_benchmark_file_row_and_field(sft, tmp_path):
    with pytest.raises(SystemExit, match=r"--data-dir .*math500/test.jsonl: file not found"):
        benchmark.load_benchmark("math500", tmp_path)
    _write_jsonl(tmp_path / "math500/test.jsonl", [{"problem": "1+1?", "answer": "2"}, {"problem": "2+2?"}])
    with pytest.raises(SystemExit, match=r"--benchmarks math500: .*test.jsonl row 2 has no field 'answer'"):
        eval.main(["--model", str(sft), "--benchmarks", "math500", "--data-dir", str(tmp_path)])
    _write_jsonl(tmp_path / "aime24/test.jsonl", [])
    with pytest.raises(SystemExit, match=r"--benchmarks aime24: .*test.jsonl holds no problems"):
        benchmark.load_benchmark("aime24", tmp_path)
    _write_jsonl(tmp_path / "gsm8k/test.jsonl", [{"question": "q", "answer": "so 4"}])
    with pytest.raises(SystemExit, match=r"gsm8k: .* row 1: its 'answer' has no '####'"):
        benchmark.load_benchmark("gsm8k", tmp_path)
    _write_jsonl(tmp_path / "minerva_math/test.jsonl", [{"problem": "q", "solution": "it is 4"}])
    with pytest.raises(SystemExit, match=r"minerva: .* row 1: its 'solution' has no closed \\boxed"):
        benchmark.load_benchmark("minerva", tmp_path)
    _write_jsonl(tmp_path / "olympiadbench/test.jsonl", [{"question": "q", "final_answer": "4"}])
    with pytest.raises(SystemExit, match=r"olympiad: .* row 1: its 'final_answer' must be a non-empty list"):
        benchmark.load_benchmark("olympiad", tmp_path)


