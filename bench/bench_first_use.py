"""A new user's first `python train.py`, timed end to end, with the split of where the time went.

    python bench/bench_first_use.py                 # this machine as it is
    python bench/bench_first_use.py --avx2          # emulate a 2-core AVX2 CPU (no AVX512, no AMX, no bf16)
    python bench/bench_first_use.py --avx2 --threads 1 -- --seed 2   # flags after -- go to train.py

The command runs in a subprocess exactly as the README gives it, with an empty `--cache-dir` and a
fresh `--out-dir` (as on a fresh clone), and is timed from launch to exit: Python's start-up, the
imports, loading the shipped SFT checkpoint, the start and end held-out evaluations, the RL steps and
the plots. The run's summary.json then gives the split: seconds per RL step by phase (rollout,
verify, PRM forward and update, policy log-probs and update, held-out evaluation every --eval-every
steps, other), all held-out evaluations together, and the rest (start-up and writing).

`--avx2` emulates the slow path on a faster x86 CPU by capping every kernel library at AVX2:
ATEN_CPU_CAPABILITY=avx2 (PyTorch's own kernels), ONEDNN_MAX_CPU_ISA=AVX2 and
MKL_ENABLE_INSTRUCTIONS=AVX2 (matrix products). Nothing in the run uses bf16, so the fp32 path is the
only path. It is an emulation: the cores' clock, caches and memory are still this machine's.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def cpu_steal_seconds() -> float:
    """Seconds of 'steal' over all cores since boot (/proc/stat; 0 where there is none)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return 0.0
    return int(fields[8]) / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--avx2", action="store_true", help="cap PyTorch, oneDNN and MKL at AVX2")
    parser.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of the run (default 2)")
    parser.add_argument("--keep", default="", help="write the run here instead of a temporary folder")
    parser.add_argument("train_args", nargs="*", help="extra train.py flags, after --")
    opts = parser.parse_args(argv)
    env = {**os.environ, "OMP_NUM_THREADS": str(opts.threads), **(AVX2 if opts.avx2 else {})}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(opts.keep or tmp)
        cmd = [sys.executable, "train.py", "--cache-dir", str(out / "cache"), "--out-dir", str(out / "runs"),
               "--run-name", "first-use", *opts.train_args]
        start, stolen = time.perf_counter(), cpu_steal_seconds()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        wall, stolen = time.perf_counter() - start, cpu_steal_seconds() - stolen
        if proc.returncode:
            raise SystemExit(f"train.py failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        summary = json.loads((out / "runs" / "first-use" / "summary.json").read_text())
    steps = summary["steps"]
    per_step = summary["step_seconds"]
    rl = sum(per_step.values()) * steps
    report = {
        "command": " ".join(["python", *cmd[1:]]), "avx2": opts.avx2, "threads": opts.threads,
        "wall_s": round(wall, 1),
        # CPU time the hypervisor gave to other machines meanwhile (all cores): on a shared host a
        # wall time is only as good as this is small
        "cpu_steal_s": round(stolen, 1),
        "rl_loop_s": round(rl, 1),
        "per_step_s": {k: round(v, 3) for k, v in per_step.items()},
        "eval_s_all": round(summary["eval_seconds"], 1),
        "outside_loop_s": round(wall - rl, 1),  # start-up, start/end evaluation, plots, final checkpoint
        "start": {"greedy": summary["start_accuracy"], "sampled": summary["start_sampled_accuracy"]},
        "end": {"greedy": summary["end_accuracy"], "sampled": summary["end_sampled_accuracy"]},
        "prm_accuracy_10": summary["final_prm_accuracy_10"],
        "localization_10": summary["final_prm_localization_10"],
    }
    print(proc.stdout.strip().splitlines()[-4] if proc.stdout.strip() else "")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
