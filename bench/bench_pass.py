"""Time `pass_advantage` on one large rollout batch, on the CPU.

    python bench/bench_pass.py                      # (1024, 4096) float32, groups of 16, 7 runs
    python bench/bench_pass.py --threads 1          # one thread (faster on a shared, busy machine)
    python bench/bench_pass.py --rows 256 --length 1024 --repeats 3

The batch mirrors the seed's settings (math: 512 prompts x 16 responses, responses up to 3072
tokens; QA: 128 x 16): ragged lengths (uniform in [length/8, length], one response per group at
full length so the last column is used), groups of 16 contiguous rows, a token-varying signal
(OPD-like, as in QA or PRIME's implicit PRM) and a step-level one (PRM steps of ~110 tokens).
Prints the median wall and CPU time of several calls after one warm-up call, for the function
defaults and for each preset, with the load average: other jobs on the same cores inflate both
(try --threads 1 then). Synthetic data only; the timing does not depend on the values beyond the
chunking.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pass_advantage import PRESETS, broadcast_step_scores, pass_advantage  # noqa: E402


def make_batch(rows: int, length: int, group: int, seed: int = 0):
    """A synthetic rollout batch: (B, T) signals and masks, (B,) rewards and group ids."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(length // 8, length + 1, (rows,), generator=gen)  # (B,)
    lengths[::group] = length  # one full-length response per group
    pos = torch.arange(length)
    mask = (pos < lengths[:, None]).float()  # (B, T), right padding
    token_signal = torch.randn(rows, length, generator=gen) * mask  # (B, T), OPD-like
    # PRM steps of ~110 tokens on average: a new step starts at each token with probability 1/110
    starts = torch.rand(rows, length, generator=gen) < 1 / 110
    step_ids = starts.long().cumsum(dim=1)  # (B, T), 0-based step of each token
    step_scores = torch.rand(rows, int(step_ids.max()) + 1, generator=gen)  # (B, S) probabilities
    step_signal = broadcast_step_scores(step_scores, step_ids, mask)  # (B, T)
    outcome = torch.randint(0, 2, (rows,), generator=gen).float()  # (B,)
    fmt = (torch.rand(rows, generator=gen) < 0.9).float()  # (B,)
    group_ids = torch.arange(rows) // group  # (B,)
    return dict(token_signal=token_signal, step_signal=step_signal, step_ids=step_ids, mask=mask,
                outcome=outcome, fmt=fmt, group_ids=group_ids)


def median_times(fn, repeats: int):
    """Median wall time and median CPU time of fn(), in seconds. The CPU time sums this process's
    threads: above the wall time when both cores work for it, close to it on one thread."""
    fn()  # warm-up: first-call allocations
    wall, cpu = [], []
    for _ in range(repeats):
        start_wall, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start_wall)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1024, help="B, responses in the batch")
    parser.add_argument("--length", type=int, default=4096, help="T, padded response length")
    parser.add_argument("--group", type=int, default=16, help="responses per prompt")
    parser.add_argument("--repeats", type=int, default=7, help="timed calls per setting")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads (0: torch's default, one per core); 1 is faster when "
                             "other jobs share the cores, as OpenMP threads then wait on each other")
    args = parser.parse_args(argv)
    if args.rows % args.group:
        parser.error(f"--rows {args.rows} must be a multiple of --group {args.group}")
    if args.threads:
        torch.set_num_threads(args.threads)

    batch = make_batch(args.rows, args.length, args.group)
    common = (batch["mask"], batch["outcome"], batch["fmt"], batch["group_ids"])
    settings = [  # (name, signal, kwargs)
        ("defaults (seed: batch scope, consecutive)", "token_signal", {}),
        ("math preset, step-PRM signal", "step_signal", PRESETS["math"]),
        ("qa preset, token signal", "token_signal", PRESETS["qa"]),
        ("qa preset, abs_max", "token_signal", dict(PRESETS["qa"], normalizer="abs_max")),
        ("v1 preset, step chunks", "step_signal", dict(PRESETS["v1"], step_ids=batch["step_ids"])),
        ("v1 preset, token signal (anchor scan)", "token_signal", dict(PRESETS["v1"], chunking="trace")),
    ]
    print(f"pass_advantage on ({args.rows}, {args.length}) float32, groups of {args.group}, "
          f"{int(batch['mask'].sum())} valid tokens, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.2f}; "
          f"median of {args.repeats} runs")
    print(f"  {'setting':<42s} {'wall':>10s} {'CPU':>10s}")
    for name, signal, kwargs in settings:
        wall, cpu = median_times(lambda: pass_advantage(batch[signal], *common, **kwargs), args.repeats)
        print(f"  {name:<42s} {wall * 1000:7.1f} ms {cpu * 1000:7.1f} ms")


if __name__ == "__main__":
    main()
