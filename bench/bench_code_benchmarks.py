"""Benchmark the code benchmarks' grading: the sandbox on PRIME's full LeetCode set and on LiveCodeBench.

    python bench/bench_code_benchmarks.py     # the verify pool eval.py uses: one worker a CPU

What it grades, through benchmark.grade exactly as `eval.py` does (the pool started and warmed first):
    1. LeetCode, all 180 problems: one response each that runs the whole 100-assert suite and fails
       it (a `Solution` whose every method returns 0: every call runs, nothing is right), so each
       problem costs one full sandboxed run of its suite; and the six right solutions of
       tests/test_benchmarks.py, which pass.
    2. One LeetCode response that loops: it costs the suite's 10 s limit, and no more.
    3. LiveCodeBench, the release-format fixture tests/fixtures/releases/livecodebench.jsonl (a functional
       and a stdin problem, 3 tests each): right programs, and a looping one (stopped at its first test's 6 s).
Prints the seconds each part took and the grades; no figure is asserted (docs/benchmarks.md records them).
"""

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
import benchmark  # noqa: E402
import sandbox  # noqa: E402
import verify  # noqa: E402
from test_benchmarks import FILES, LEETCODE_RIGHT, MAX_SUM, MEAN, fenced  # noqa: E402

ZEROS = "class Solution:\n    def __getattr__(self, name):\n        return lambda *args, **kwargs: 0"
LOOP = "class Solution:\n    def __getattr__(self, name):\n        while True:\n            pass"


def timed(name: str, items, texts) -> list:
    start = time.perf_counter()
    graded = benchmark.grade(name, items, texts)
    seconds = time.perf_counter() - start
    right = sum(g.correct for g in graded)
    print(f"{name:<14}{len(texts):>5} responses  {seconds:8.1f} s  ({seconds / len(texts):.3f} s a response)  "
          f"{right} pass")
    return graded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args()
    workers = sandbox.default_workers()
    print(f"sandbox mode: {sandbox.sandbox_mode()}, {workers} verify workers")
    verify.score_batch(["\\boxed{1}"] * workers, ["1"] * workers, ["math"] * workers)  # start and warm the pool

    leetcode = benchmark.load_benchmark("leetcode")
    print("1. LeetCode, every problem's 100-assert suite run whole, failing (180 sandboxed runs)")
    timed("leetcode", leetcode, [fenced(ZEROS)] * len(leetcode))
    print("   the six right solutions of tests/test_benchmarks.py")
    timed("leetcode", [leetcode[i] for i in LEETCODE_RIGHT], [fenced(c) for c in LEETCODE_RIGHT.values()])
    print(f"2. one looping response (the suite's limit is {benchmark.LEETCODE_SECONDS:.0f} s)")
    graded = timed("leetcode", leetcode[:1], [fenced(LOOP)])
    print(f"   reason: {graded[0].reason}")

    lcb = benchmark.load_benchmark("livecodebench", files=FILES)
    print("3. LiveCodeBench fixture: right programs (3 tests each, one sandboxed run a test), then a loop")
    timed("livecodebench", lcb, [fenced(MAX_SUM), fenced(MEAN)])
    graded = timed("livecodebench", lcb[1:], [fenced("while True:\n    pass")])
    print(f"   reason: {graded[0].reason} (limit {benchmark.LCB_SECONDS:.0f} s a test)")


if __name__ == "__main__":
    main()
