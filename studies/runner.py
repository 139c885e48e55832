"""What the studies share besides their statistics (stats.py): the arms' train.py flags and their one
name each, running an arm as a plain `python train.py` process (skipped when finished, resumed when
checkpointed), several at a time, reading finished runs, the shared command-line flags, JSON and
figure writing. reproduce.py, real_study.py and credit_study.py import it; it imports no study.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (after choosing the backend)

REPO = Path(__file__).resolve().parents[1]  # the repository: the system's modules and train.py
sys.path.insert(0, str(REPO))
import runlog  # noqa: E402
from config import Args  # noqa: E402
from config import parse_args as parse_train_args  # noqa: E402
from runlog import moving_average  # noqa: E402

TRAIN_STEPS = Args.steps  # train.py's default: the comparisons run the default as shipped

# Each arm: train.py flags on top of the defaults (which are PRIME's: RLOO + online implicit PRM).
ARMS = {
    "prime": [],
    "rloo": ["--process", "none"],
    "prime-offline": ["--prm-warmup-steps", "20", "--no-prm-online"],
    "reinforce": ["--estimator", "reinforce", "--process", "none"],
    "reinforce+prm": ["--estimator", "reinforce"],
    "grpo": ["--estimator", "grpo", "--process", "none"],
    "grpo+prm": ["--estimator", "grpo"],
    # --kl-coef 0: the recorded PASS arms ran before train.py kept PASS's reference term (default 1e-2 now), and a
    # rerun reproduces them; PASS with its regulariser is another arm
    "pass-implicit": ["--estimator", "pass", "--kl-coef", "0"],
    "pass-step": ["--estimator", "pass", "--process", "step", "--kl-coef", "0"],
    "ppo": ["--estimator", "ppo", "--process", "none"],
    "ppo+prm": ["--estimator", "ppo"],
}
LABELS = {"prime": "PRIME", "rloo": "outcome-only", "prime-offline": "PRIME, offline PRM",
          "reinforce": "REINFORCE", "reinforce+prm": "REINFORCE + implicit PRM", "grpo": "GRPO",
          "grpo+prm": "GRPO + implicit PRM", "pass-implicit": "PASS, implicit PRM", "pass-step": "PASS, exact step checker",
          "ppo": "PPO (critic + GAE)", "ppo+prm": "PPO + implicit PRM"}
def finished(run_dir: Path) -> bool:
    """A run is finished once its summary has the end-of-run numbers (the start ones come first)."""
    return (run_dir / "summary.json").exists() and "end_accuracy" in json.loads((run_dir / "summary.json").read_text())


def load_finished(out: str, name: str, seeds: list[int]) -> list[dict]:
    """The finished runs <out>/<name>-s<seed> of these seeds, loaded."""
    return [runlog.read_run(d) for d in (Path(out) / f"{name}-s{seed}" for seed in seeds) if finished(d)]


def run_all(jobs: list[tuple], args, what: str) -> None:
    """Every (name, seed, flags) job through run_arm, args.jobs at a time, threads split between them
    (OMP_NUM_THREADS wins where it is set, as in train.py: e.g. 1 while something else uses a core)."""
    threads = int(os.environ.get("OMP_NUM_THREADS") or max(1, (os.cpu_count() or 1) // args.jobs))
    t = time.time()
    print(f"{len(jobs)} runs ({what} x {len(args.seeds)} seeds), {args.jobs} at a time", flush=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(lambda job: run_arm(job[0], job[1], args, threads, *job[2:]), jobs))
    print(f"all runs finished in {(time.time() - t) / 60:.1f} min", flush=True)


def merge_json(path: Path, results: dict) -> dict:
    """Update the JSON object at `path` with `results`, written atomically; returns the merged object."""
    old = json.loads(path.read_text()) if path.exists() else {}
    merged = {**old, **results}
    runlog.write_json(path, merged, indent=1)
    return merged


def save_figure(fig, figures: Path, name: str) -> Path:
    if fig.get_layout_engine() is None:  # a figure made with its own layout (constrained) keeps it
        fig.tight_layout()
    path = runlog.save_figure(fig, figures / f"{name}.png", dpi=110, bbox_inches="tight")  # keeps an outside legend
    plt.close(fig)
    return path


def run_arm(arm: str, seed: int, args, threads: int, flags: list[str] | None = None) -> Path:
    """One train.py run, runs/repro/<arm>-s<seed>/; skipped if finished, resumed if checkpointed."""
    name = f"{arm}-s{seed}"
    run_dir = Path(args.out) / name
    if finished(run_dir):
        return run_dir
    cmd = [sys.executable, str(REPO / "train.py"), "--run-name", name, "--out-dir", args.out, "--seed", str(seed),
           "--steps", str(args.steps), "--cache-dir", args.cache_dir, *(ARMS[arm] if flags is None else flags),
           *args.train_args]
    if (run_dir / "checkpoint" / "state.pt").exists():
        cmd.append("--resume")
    elif run_dir.exists():  # started but never checkpointed: start again
        shutil.rmtree(run_dir)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    t = time.time()
    log = Path(args.out) / f"{name}.log"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed (exit {proc.returncode}); see {log}")
    print(f"  {name}: done in {time.time() - t:.0f}s", flush=True)
    return run_dir


def series(runs: list[dict], key: str) -> np.ndarray:
    """(seeds, steps) of one metric; None (e.g. no PRM accuracy on a step) becomes NaN."""
    return np.array([[np.nan if m.get(key) is None else m[key] for m in r["metrics"]] for r in runs], dtype=float)


def first_step_reaching(curve: np.ndarray, level: float) -> int | None:
    hits = np.nonzero(curve >= level)[0]
    return int(hits[0]) + 1 if len(hits) else None


def steps_to_reach(runs: list[dict], level: float, window: int) -> list[int | None]:
    """Sample efficiency, per seed: the first RL step at which the `window`-step moving average of the
    training reward reaches `level` (e.g. outcome-only's final moving average); full windows only."""
    out = []
    for curve in moving_average(series(runs, "reward"), window):
        hit = first_step_reaching(curve[window - 1:], level)
        out.append(hit + window - 1 if hit else None)
    return out


def same_parser(description: str) -> argparse.ArgumentParser:
    """The flags every study shares (reproduce.py's comparisons, credit_study.py)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5],
                        help="5: what a paired claim needs (CLAIM_SEEDS)")
    parser.add_argument("--steps", type=int, default=TRAIN_STEPS, help="RL steps of every run (train.py's default)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    parser.add_argument("--out", default="runs/repro", help="where the runs go")
    parser.add_argument("--cache-dir", default=".cache", help="the shared SFT checkpoint cache")
    parser.add_argument("--figures", default="docs/figures", help="where the plots and results.json go")
    parser.add_argument("--window", type=int, default=20, help="steps averaged for 'first'/'last' and the curves")
    parser.add_argument("--report-only", action="store_true", help="only plots and tables from finished runs")
    return parser


def parse_study_args(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """Parse and check the shared flags; anything the parser does not know goes to every train.py run."""
    args, args.train_args = parser.parse_known_args(argv)
    for flag, value in (("--steps", args.steps), ("--jobs", args.jobs), ("--window", args.window)):
        if value < 1:
            parser.error(f"{flag} {value}: must be >= 1")
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds {' '.join(map(str, args.seeds))}: each seed once")
    return args


def build_sft(task, cache_dir: str) -> None:
    """The embedded SFT checkpoint of a configuration, once, before any run (the runs would race)."""
    subprocess.run([sys.executable, "-c", "import sys, toy_task; from pathlib import Path; "
                    f"toy_task.sft_checkpoint(Path({cache_dir!r}), int(sys.argv[1]), "
                    "ops=toy_task.parse_ops(sys.argv[2]), slip=float(sys.argv[3]))",
                    str(task.sft_steps), task.toy_ops, str(task.toy_slip)], check=True, cwd=REPO)


def train_config(train_args: list[str]):
    """The train.py configuration every run of the comparison shares (for the SFT it needs)."""
    return parse_train_args(train_args)
