"""Benchmark verify.py: math verifications per second, and the worst latency of one hostile item.

    python bench/bench_verify.py                # 1024 MATH-500 responses, default pool size
    python bench/bench_verify.py --workers 2 --n 1024 --timeout 5
    python bench/bench_verify.py --math-grader official        # the last-box rule of PRIME's grader
    python bench/bench_verify.py --reasoning-chars 3000         # longer responses, closer to a real model's

The batch is shaped like a training step (train.py, n_samples = 4): groups of 4 responses to one
MATH-500 problem (benchmarks/math500/test.jsonl), each a short solution ending in `\\boxed{...}`;
in each group two box the problem's gold answer (right) and two box another problem's gold (wrong).
The pool is started and warmed up before timing, as it is after the first step of a training run.
Then hostile items are scored one at a time and their latency printed: those a worker interrupts
itself (at 0.8 * timeout), and one whose worker never answers (SIGSTOPped, as if stuck in C), which
the parent kills at the time limit.
"""

import argparse
import json
import os
import random
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import sandbox  # noqa: E402
import verify  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "benchmarks"


REASONING = ("Let $x$ be the unknown. Then $2x + 3 = 11$, so $x = 4$ and $x^2 = 16$; checking, "
             "$\\frac{16}{4} = 4$ as required. ")


def math_batch(n: int, seed: int = 0, reasoning_chars: int = 0) -> tuple[list[str], list[str], list[int]]:
    """n responses, references and expected rewards (1 right / 0 wrong) from MATH-500 golds, each
    after `reasoning_chars` characters of reasoning with intermediate values (the grader reads past them)."""
    rows = [json.loads(line) for line in (DATA / "math500" / "test.jsonl").open()]
    golds = [row["answer"] for row in rows]
    rng = random.Random(seed)
    responses, references, expected = [], [], []
    for i in range(n):
        gold = golds[(i // 4) % len(golds)]  # 4 samples per problem
        boxed = gold if i % 2 == 0 else rng.choice([g for g in golds if g != gold])
        reasoning = (REASONING * (reasoning_chars // len(REASONING) + 1))[:reasoning_chars]
        responses.append(f"We simplify step by step. {reasoning}\nSo the final answer is $\\boxed{{{boxed}}}$.")
        references.append(gold)
        expected.append(1 if i % 2 == 0 else 0)
    return responses, references, expected


HOSTILE = {  # response -> gold "7"; each must score 0 within the time limit
    "unbalanced braces": "so \\boxed{\\frac{7}{2} {{",
    "boxed nested 1000 deep": "\\boxed{" * 1000 + "8" + "}" * 1000,
    "braces nested 400 deep": "\\boxed{" + "{" * 400 + "8" + "}" * 400 + "}",
    "power tower": "\\boxed{10^{10^{10^{10}}}}",
    "1 MB response": "\\boxed{" + "x+" * 500_000 + "}",
    "NUL bytes, odd unicode": "\\boxed{\x00\u202e\ud800\U0001f4a5\x00}\x00",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1024, help="responses in the timed batch")
    parser.add_argument("--workers", type=int, default=None,
                        help="pool size (default: verify's, the CPUs this process may use)")
    parser.add_argument("--timeout", type=float, default=verify.DEFAULT_TIMEOUT,
                        help="per-item time limit, seconds")
    parser.add_argument("--math-grader", default="math-verify", choices=verify.MATH_GRADERS,
                        help="who finds the answer: math-verify's extraction or the official last-box rule")
    parser.add_argument("--reasoning-chars", type=int, default=0, help="reasoning text before each answer")
    args = parser.parse_args()
    grade = dict(workers=args.workers, math_grader=args.math_grader)
    print(f"math grader: {args.math_grader}; responses of {args.reasoning_chars} + ~60 characters")

    responses, references, expected = math_batch(args.n, reasoning_chars=args.reasoning_chars)
    t0 = time.perf_counter()
    verify.score_batch(responses[:8], references[:8], ["math"] * 8, **grade)
    print(f"pool start + warm-up: {time.perf_counter() - t0:.2f} s")

    for n in (128, args.n):
        t0 = time.perf_counter()
        scores = verify.score_batch(responses[:n], references[:n], ["math"] * n, timeout=args.timeout, **grade)
        seconds = time.perf_counter() - t0
        right = [s.reward for s, e in zip(scores, expected) if e == 1]
        wrong = [s.reward for s, e in zip(scores, expected) if e == 0]
        timeouts = sum(s.reason == "timeout" for s in scores)
        print(f"batch {n:5d}: {seconds:6.2f} s = {n / seconds:6.1f} verifications/s  "
              f"(right scored 1: {sum(right):.0f}/{len(right)}, wrong scored 1: "
              f"{sum(wrong):.0f}/{len(wrong)}, timeouts: {timeouts})")

    worst = 0.0
    for name, response in HOSTILE.items():
        t0 = time.perf_counter()
        score = verify.score_batch([response], ["7"], ["math"], timeout=args.timeout, **grade)[0]
        seconds = time.perf_counter() - t0
        worst = max(worst, seconds)
        print(f"hostile {name:24s}: {seconds:5.2f} s  reward {score.reward}  reason {score.reason}")
    # The parent's backstop: a worker that does not answer at all (stuck in C; here SIGSTOPped).
    verify.score_batch(["\\boxed{1}"], ["1"], ["math"], **grade)
    for worker in sandbox._pool:
        os.kill(worker.process.pid, signal.SIGSTOP)
    t0 = time.perf_counter()
    score = verify.score_batch(["\\boxed{7}"], ["7"], ["math"], timeout=args.timeout, **grade)[0]
    seconds = time.perf_counter() - t0
    worst = max(worst, seconds)
    print(f"hostile {'worker stuck (SIGSTOP)':24s}: {seconds:5.2f} s  reward {score.reward}  "
          f"reason {score.reason}")
    print(f"worst hostile latency: {worst:.2f} s (time limit {args.timeout} s)")
    sandbox.shutdown()


if __name__ == "__main__":
    main()
