"""PRIME against outcome-only RLOO on a real model (SmolLM2-135M-Instruct), tuned per arm and paired over
5 seeds, by the protocol below (issue 53). Resumable across machines: every finished run's numbers and
curves go to docs/figures/real/study.json, and a run recorded there is never run again, so a later
session (whose runs/ is gone) continues the protocol where the file stops.

    python studies/reproduce.py real                            # the whole protocol, resuming study.json
    python studies/reproduce.py real --tasks chains --phases lr # a part of it
    python studies/reproduce.py real --report-only              # tables, choices, verdicts, plots from study.json

The protocol, PRIME's adapted to a 2-core CPU (docs/REPRODUCTION.md section 3 states it):
  tasks    chains: "What is a + b + c + d + e?", five two-digit numbers (`python data.py chains`), worked
           one line a step, so the answer depends on every step and data.chain_steps checks each one.
           The start is SmolLM2 after a short SFT (60 steps) on a slipping demonstrator's worked
           solutions of FOUR numbers (PRIME starts RL from an SFT model too): on five it starts at 35%
           held-out sampled accuracy, 91% of its responses writing every step (bench/start_accuracy.py).
  sums2    "What is a + b?", two-digit, from SmolLM2 as converted (section 3's first task; one line,
           no steps to tell apart).
  a run    train.py, 8 prompts x 4 samples a step at temperature 0.7, STEPS steps, the official refill
           filter (the PRM learns from full batches), RLOO, bf16 autocast as on a GPU, vLLM sampling
           in bf16 where vllm is installed (with its rollout correction and logged mismatch), HF
           generate otherwise; the held-out accuracy (40 problems, greedy and 4 samples) every 10 steps.
  1. lr    outcome-only at each policy lr of LR_GRID, seed 1, on the validation split: the task file
           without its first 40 rows (train.py then holds out the next 40, the validation questions,
           and trains on the rest). Chosen: the highest validation score (SCORE_EVALS); while the
           best is at an edge of the grid, the grid grows one lr past it (LR_LADDER, x ~3).
  2. prm   PRIME at that policy lr, at each PRM lr x beta of PRM_GRID (beta: the paper's 0.05 and the
           project's 1.0), seed 1, the same split and rule.
  3. seeds both arms at their choices, seeds 1-5, on the whole file: its first 40 questions, which no
           grid run saw, are the held-out ones. Paired by seed (stats.paired), the project's rule.
Then, on sums2 (LORA_TASKS), does LoRA match full fine-tuning (--lora-rank LORA_RANK, the rest the same)?
  4. lora-lr     outcome-only with LoRA at the chosen full-FT policy lr x LORA_FACTORS, seed 1, validation
                 split, the same rule, extended past an edge that wins as the lr grid is (LoRA's RL lr is
                 about 10x full fine-tuning's: LoRA Without Regret).
  5. lora-seeds  both arms with LoRA, seeds 1-5, held-out questions: the policy lr chosen in 4, PRIME's PRM
                 lr the full-FT choice times the same factor, beta the full-FT choice. Each arm's LoRA runs
                 minus its full-FT runs, paired by seed (lora_table). A run's name holds its factor, so
                 seeds run at an earlier choice stay recorded and reported under their own.
  6. lora-timing full fine-tuning again, seed 1 of each arm at its seeds-phase setting, on the machine that
                 ran 5: seconds a step side by side (the recorded full-FT runs ran elsewhere), and how
                 closely a full-FT run repeats on another machine.
"""

import argparse
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (after choosing the backend)

from runner import LABELS, REPO, run_arm, save_figure  # noqa: E402  (it puts the repository on the path)
import data  # noqa: E402
import runlog  # noqa: E402
import stats  # noqa: E402
from stats import paired, paired_cells  # noqa: E402

TASKS = {  # the task file (data.py), its start, and what its responses need
    "chains": dict(data=["chains", "--terms", "5", "--digits", "2"], max_len=128,
                   sft=["chains", "--terms", "4", "--digits", "2", "--rows", "320", "--seed", "1", "--slip", "0.1"],
                   sft_steps=60, steps=True),
    # one line an answer: the exact checker reads "a + b = c" but not the other layouts the policies find
    # ("a + b equals c.", an unboxed "The answer is: c"), so right_with_wrong_step measures layout there
    "sums2": dict(data=["sums", "--digits", "2"], max_len=96, sft=None, sft_steps=0, steps=False),
}
ROWS = 500            # questions per task file: 40 held out, 40 validation, the rest to train on
HELD_OUT = 40
STEPS = 40
LR_GRID = ["3e-6", "1e-5", "3e-5"]                 # policy lr, outcome-only (section 3's runs used 5e-6) ...
LR_LADDER = ["1e-6", "3e-6", "1e-5", "3e-5", "1e-4", "3e-4"]  # ... extended along this past an edge that wins
PRM_GRID = [(1, "0.05"), (1, "1.0"), (3, "0.05"), (3, "1.0")]   # (PRM lr / policy lr, beta)
SEEDS = [1, 2, 3, 4, 5]
SCORE_EVALS = 3       # a grid run's score: the mean validation sampled accuracy of its last 3 evaluations
PHASES = ["lr", "prm", "seeds", "lora-lr", "lora-seeds", "lora-timing"]
VALIDATION_PHASES = ("lr", "prm", "lora-lr")  # the grids; the others are scored on the held-out questions
LORA_TASKS = ("sums2",)
LORA_RANK = "16"      # SmolLM2-135M: 4.9M adapter parameters, 3.6% of the model (alpha: train.py's 32)
LORA_FACTORS = (1, 3, 10)  # the LoRA policy lr: the full-FT choice times these ...
LORA_LADDER = (1, 3, 10, 30, 100, 300)  # ... extended along this past an edge that wins (lr_grid's rule)
_RECORD = threading.Lock()  # two runs finish at once: one writer of study.json at a time


def run_flags(task: str, paths: dict, validation: bool) -> list[str]:
    """train.py's flags every run of a task shares (the arm and its lrs come on top)."""
    rollout = "vllm" if importlib.util.find_spec("vllm") else "hf"
    return ["--model", str(paths["start"]), "--data", str(paths["tune" if validation else "data"]),
            "--prompt-key", "question", "--temperature", "0.7", "--max-response-len", str(TASKS[task]["max_len"]),
            "--prompts-per-step", "8", "--n-samples", "4", "--filter-mode", "refill", "--rloo-form", "paper",
            "--eval-problems", str(HELD_OUT), "--eval-samples", "4", "--eval-every", "10", "--save-every", "10",
            "--rollout", rollout, "--precision", "bf16",  # bf16 autocast: 1.6x faster updates on an AVX512-BF16 CPU
            "--max-tokens-per-micro-batch", "1024"]  # at 4096 a run's process peaked near 11 GB: two OOM a 24 GB host


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def code_version() -> str:
    """The commit a run starts from, "+changes" when tracked code differs from it (docs/ is not code: the
    study.json a finished run just wrote is there), "unknown" outside a git checkout: which verifier graded
    a recorded run (the sums runs graded before 57430c7 are withdrawn)."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)

    head = git("rev-parse", "--short=12", "HEAD")
    if head.returncode != 0:
        return "unknown"
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs").stdout.strip()
    return head.stdout.strip() + ("+changes" if changed else "")


def prepare(task: str, out: Path, cache_dir: str) -> dict:
    """The task file, its validation file and its start, built once by the commands the docs give;
    returns their paths and hashes (a recorded run pairs only with runs of the same start)."""
    spec, out = TASKS[task], out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    paths = {"data": out / f"{task}.jsonl", "tune": out / f"{task}-validation.jsonl"}
    if not paths["data"].exists():
        subprocess.run([sys.executable, "data.py", *spec["data"], "--rows", str(ROWS), "--out", str(paths["data"])],
                       check=True, cwd=REPO)
    if not paths["tune"].exists():  # the file without its held-out rows: train.py's next 40 validate
        rows = data.read_rows(str(paths["data"]))[HELD_OUT:]
        runlog.write_atomic(paths["tune"], "".join(json.dumps(r) + "\n" for r in rows))
    base = Path(cache_dir).resolve() / "smollm2-135m-instruct"
    if not (base / "config.json").exists():
        subprocess.run([sys.executable, "models.py", "smollm2", "--cache-dir", cache_dir], check=True, cwd=REPO)
    paths["start"] = base
    if spec["sft"]:
        paths["start"] = Path(cache_dir).resolve() / f"smollm2-{task}-sft"
        if not (paths["start"] / "config.json").exists():
            solutions = out / f"{task}-sft.jsonl"
            subprocess.run([sys.executable, "data.py", *spec["sft"], "--exclude", str(paths["data"]),
                            "--out", str(solutions)], check=True, cwd=REPO)
            # one thread, whoever starts the protocol: the same machine then rebuilds the same weights to the
            # bit. Another thread count or CPU differs in float32 round-off (max 3e-7 a weight seen here), so
            # the runs record the start's hash and the seeds pair only runs of one start (verdicts)
            subprocess.run([sys.executable, "models.py", "sft", "--model", str(base), "--data", str(solutions),
                            "--out", str(paths["start"]), "--steps", str(spec["sft_steps"])], check=True, cwd=REPO,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
    return {**paths, "data_sha256": sha256(paths["data"]),
            "start_sha256": sha256(paths["start"] / "model.safetensors")}


def lr_run_name(task: str, lr: str) -> str:
    """The name of the lr grid's run at one policy lr (its folder in --out, its key in study.json)."""
    return f"{task}-lr-rloo-{lr}-s1"


def lora_lr_run_name(task: str, factor: int) -> str:
    """The name of the LoRA lr grid's run at `factor` x the full-FT policy lr."""
    return f"{task}-lora-lr-rloo-x{factor}-s1"


def lora_seed_name(task: str, factor: int, arm: str, seed: int) -> str:
    """The name of a LoRA seed run at `factor` x the full-FT lrs (lora_seed_factors reads the factor back)."""
    return f"{task}-lora-x{factor}-{arm}-s{seed}"


def grid_runs(task: str, phase: str, study: dict) -> list[tuple[str, dict]] | None:
    """(run name, setting) of one phase of a task, or None while the phase it rests on is not finished
    (its choice is not made yet). A name is also the run's folder in --out and its key in study.json."""
    if phase.startswith("lora") and task not in LORA_TASKS:
        return []
    if phase == "lr":
        return [(lr_run_name(task, lr), dict(arm="rloo", seed=1, policy_lr=lr)) for lr in lr_grid(task, study)]
    lr = choice(task, "lr", study)
    if lr is None:
        return None
    if phase == "prm":
        return [(f"{task}-prm-{k}x-beta{beta}-s1", dict(arm="prime", seed=1, policy_lr=lr["policy_lr"],
                                                       prm_lr=f"{k * float(lr['policy_lr']):g}", beta=beta))
                for k, beta in PRM_GRID]
    if phase == "lora-lr":
        return [(lora_lr_run_name(task, k), dict(arm="rloo", seed=1, policy_lr=f"{k * float(lr['policy_lr']):g}",
                                                 lora_rank=LORA_RANK))
                for k in lora_factors(task, study)]
    prm = choice(task, "prm", study)
    if prm is None:
        return None
    if phase == "lora-seeds":
        factor = lora_factor(task, study)
        return None if factor is None else lora_seed_runs(task, lr, prm, factor)
    if phase == "lora-timing":
        return [(f"{task}-lora-timing-full-{arm}-s1", dict(arm=arm, seed=1, **(lr if arm == "rloo" else prm)))
                for arm in ("rloo", "prime")]
    return [(f"{task}-{arm}-s{seed}", dict(arm=arm, seed=seed, **(lr if arm == "rloo" else prm)))
            for seed in SEEDS for arm in ("rloo", "prime")]


def lora_seed_runs(task: str, lr: dict, prm: dict, factor: int) -> list[tuple[str, dict]]:
    """(name, setting) of both arms' LoRA seeds at `factor` x the full-FT lrs (the PRM's too)."""
    lora = dict(policy_lr=f"{factor * float(lr['policy_lr']):g}", lora_rank=LORA_RANK)
    lora_prm = dict(prm, **lora, prm_lr=f"{factor * float(prm['prm_lr']):g}")
    return [(lora_seed_name(task, factor, arm, seed), dict(arm=arm, seed=seed, **(lora if arm == "rloo" else lora_prm)))
            for seed in SEEDS for arm in ("rloo", "prime")]


def extended(grid, ladder, run_of) -> list:
    """`grid` extended one rung of `ladder` past an edge for as long as the point on that edge scores
    strictly above every other (a best at the grid's edge is not known to be the best); run_of(point) is
    its recorded run or None. A tie extends nothing. The one rule of both lr grids."""
    grid = list(grid)
    while True:
        runs = [run_of(point) for point in grid]
        if None in runs or len(runs) < 2:  # not finished yet, or no neighbour to beat: nothing to extend
            return grid
        scores = [score(run) for run in runs]
        low, high = ladder.index(grid[0]), ladder.index(grid[-1])
        if scores[-1] > max(scores[:-1]) and high + 1 < len(ladder):
            grid.append(ladder[high + 1])
        elif scores[0] > max(scores[1:]) and low > 0:
            grid.insert(0, ladder[low - 1])
        else:
            return grid


def lr_grid(task: str, study: dict) -> list[str]:
    """The task's policy lrs: LR_GRID extended along LR_LADDER (on sums2 3e-5 won at the top of LR_GRID)."""
    return extended(LR_GRID, LR_LADDER, lambda lr: study["runs"].get(lr_run_name(task, lr)))


def lora_factors(task: str, study: dict) -> list[int]:
    """The LoRA lr grid's factors: LORA_FACTORS extended along LORA_LADDER (on sums2 x10 won at its top)."""
    return extended(LORA_FACTORS, LORA_LADDER, lambda k: study["runs"].get(lora_lr_run_name(task, k)))


def arm_flags(setting: dict) -> list[str]:
    flags = ["--policy-lr", setting["policy_lr"], *(["--lora-rank", setting["lora_rank"]] if "lora_rank" in setting else [])]
    if setting["arm"] == "rloo":
        return flags + ["--process", "none"]
    return flags + ["--prm-lr", setting["prm_lr"], "--beta", setting["beta"]]


def score(run: dict) -> float:
    """A grid run's validation score: its last SCORE_EVALS held-out sampled accuracies (the end's included)."""
    return float(np.mean(run["curves"]["heldout_sampled"][-SCORE_EVALS:]))


def choice(task: str, phase: str, study: dict) -> dict | None:
    """The setting of the phase's best run by score (the earlier in grid order on a tie), once every
    run of the phase is recorded; None before."""
    names = [name for name, _ in grid_runs(task, phase, study) or []]
    runs = [study["runs"].get(name) for name in names]
    if not names or None in runs:
        return None
    best = max(range(len(runs)), key=lambda i: (score(runs[i]), -i))
    return {k: v for k, v in runs[best]["setting"].items() if k not in ("arm", "seed")}


def read_study(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"runs": {}}


def record(study_path: Path, name: str, setting: dict, paths: dict, run_dir: Path, code: str) -> None:
    """A finished run's setting, end numbers and curves into study.json (atomically, one writer), with the
    code it (last) started from."""
    run = runlog.read_run(run_dir)
    metrics, summary = run["metrics"], run["summary"]
    seconds = np.cumsum([sum(v for k, v in m["time"].items() if k != "eval") for m in metrics])
    evals = [m for m in metrics if m.get("heldout_sampled_accuracy") is not None]
    curves = {"step": [m["step"] for m in metrics], "train_seconds": seconds.round(2).tolist(),
              **{key: [m.get(key) for m in metrics] for key in ("reward", "prm_accuracy", "prm_localization",
                                                                "right_with_wrong_step",
                                                                "response_length", "kept_groups", "refill_draws",
                                                                "rollout_logp_abs_diff")},
              "eval_step": [0, *(m["step"] for m in evals), summary["steps"]],
              "heldout_greedy": [summary["start_accuracy"], *(m["heldout_accuracy"] for m in evals),
                                 summary["end_accuracy"]],
              "heldout_sampled": [summary["start_sampled_accuracy"], *(m["heldout_sampled_accuracy"] for m in evals),
                                  summary["end_sampled_accuracy"]]}
    flags = {k: runlog.portable(v) if k in ("model", "data", "model_path", "out_dir", "cache_dir") else v
             for k, v in run["config"].items()}
    entry = {"setting": setting, "code": code, "flags": flags, "start_sha256": paths["start_sha256"],
             "data_sha256": paths["data_sha256"], "summary": summary, "curves": curves}
    with _RECORD:
        study = read_study(study_path)
        study["runs"][name] = entry
        runlog.write_json(study_path, study, indent=1)


def next_run(tasks: list[str], phases: list[str], study: dict, busy: set) -> tuple | None:
    """The first run, phase by phase and task by task, that study.json lacks and nobody is running,
    and whose phase can start (the choices it needs are made)."""
    for phase in phases:
        for task in tasks:
            for name, setting in grid_runs(task, phase, study) or []:
                if name not in study["runs"] and name not in busy:
                    return task, phase, name, setting
    return None


def run_protocol(tasks: list[str], args) -> None:
    """args.jobs workers, each taking the next run it can start until none is left: a task's prm grid
    starts as soon as its lr grid is recorded, while the other task's runs go on."""
    study_path = Path(args.figures) / "study.json"
    paths = {task: prepare(task, Path(args.out), args.cache_dir) for task in tasks}
    busy, wake, failures = set(), threading.Condition(), []

    def worker() -> None:
        while True:
            with wake:
                job = next_run(tasks, args.phases, read_study(study_path), busy)
                while job is None and len(busy) > len(failures):  # what is left waits on a running run
                    wake.wait()
                    job = next_run(tasks, args.phases, read_study(study_path), busy)
                if job is None:
                    return
                busy.add(job[2])
            task, phase, name, setting = job
            failed = True
            try:
                flags = [*run_flags(task, paths[task], validation=phase in VALIDATION_PHASES), *arm_flags(setting)]
                code = code_version()
                run_dir = run_arm(name.rsplit("-s", 1)[0], setting["seed"], args, args.threads, flags)
                record(study_path, name, setting, paths[task], run_dir, code)
                # its numbers are in study.json, its weights in final/; its resume checkpoint (Adam moments:
                # 1.6 GB outcome-only, 3.1 GB PRIME on SmolLM2-135M) would make the 37 runs hold ~86 GB
                runlog.drop_checkpoints(run_dir)
                print(f"  {name}: recorded ({phase})", flush=True)
                failed = False
            except SystemExit as error:  # run_arm names the log; the other worker goes on
                failures.append(str(error))
            finally:
                with wake:
                    if not failed:  # a failed run stays "busy": it is not tried again in this call
                        busy.discard(name)
                    wake.notify_all()

    t = time.time()
    threads = [threading.Thread(target=worker) for _ in range(args.jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(f"finished what could run in {(time.time() - t) / 60:.1f} min", flush=True)
    if failures:
        raise SystemExit("\n".join(failures))


# Report: everything from study.json alone ------------------------------------------------------------

def grid_table(task: str, phase: str, study: dict) -> str:
    runs = grid_runs(task, phase, study)
    if runs is None:
        return f"{task}, {phase}: not started (the lr grid is not finished)"
    chosen = choice(task, phase, study)
    keys = ["policy_lr"] if phase in ("lr", "lora-lr") else ["prm_lr", "beta"]
    lines = [f"| {' | '.join(keys)} | validation sampled: start, each 10 steps, end | score (last {SCORE_EVALS}) | "
             "greedy start -> end | PRM pairwise, last 10 steps | minutes (training) | chosen |",
             "| " + " | ".join(["---"] * (len(keys) + 6)) + " |"]
    for name, setting in runs:
        run = study["runs"].get(name)
        head = " | ".join(setting[k] for k in keys)
        if run is None:
            lines.append(f"| {head} | not run yet |" + " |" * 5)
            continue
        c = run["curves"]
        mark = "yes" if chosen and all(chosen[k] == setting[k] for k in keys) else ""
        lines.append(f"| {head} | {', '.join(f'{a:.3f}' for a in c['heldout_sampled'])} | {score(run):.3f} | "
                     f"{c['heldout_greedy'][0]:.3f} -> {c['heldout_greedy'][-1]:.3f} | "
                     f"{last10_cell([run])} | {c['train_seconds'][-1] / 60:.1f} | {mark} |")
    return "\n".join(lines)


def logged(run: dict, key: str) -> bool:
    """Did the run log this step metric at all (train.py before 7c69564 had no right_with_wrong_step)?"""
    return any(v is not None for v in run["curves"].get(key, []))


def last10_cell(runs: list[dict], key: str = "prm_accuracy") -> str:
    """A step metric over the last 10 steps of these runs, pooled; by default the PRM's pairwise accuracy,
    "n/a" without a PRM. A step with no value (no mixed group) is skipped, and then the cell says on how
    many steps the mean rests (a collapsed run may have two such steps in its last ten, each from one
    group). A run recorded before the metric was logged has none: the cell counts only the others."""
    runs = [run for run in runs if logged(run, key)]
    values = [a for run in runs for a in run["curves"][key][-10:] if a is not None]
    steps = sum(len(run["curves"][key][-10:]) for run in runs)
    if not values:
        return "n/a"
    return f"{np.mean(values):.2f}" + ("" if len(values) == steps else f" ({len(values)} of {steps} steps)")


def seed_runs(task: str, study: dict) -> dict[str, dict[int, dict]]:
    """{arm: {seed: recorded run}} of the task's seeds phase (full fine-tuning)."""
    out = {"rloo": {}, "prime": {}}
    for name, setting in grid_runs(task, "seeds", study) or []:
        if name in study["runs"]:
            out[setting["arm"]][setting["seed"]] = study["runs"][name]
    return out


def collapsed(run: dict) -> bool:
    """stats.collapsed on a recorded run's held-out greedy curve (its first point is the start)."""
    greedy = run["curves"]["heldout_greedy"]
    return stats.collapsed(greedy[0], greedy[-1])


def start_of(run: dict) -> tuple:
    """The weights and task file a run started from. The chains start is rebuilt by its SFT command on each
    machine, and a rebuild on another machine or thread count differs in float32 round-off (max 3e-7 a
    weight), so two runs pair only when they share this."""
    return run.get("start_sha256"), run.get("data_sha256")


def mismatched_seeds(runs: dict[str, dict[int, dict]]) -> list[int]:
    """Seeds both arms ran, but from different starts (or task files): not paired."""
    return sorted(s for s in set(runs["rloo"]) & set(runs["prime"])
                  if start_of(runs["rloo"][s]) != start_of(runs["prime"][s]))


def end_verdicts(a: dict[int, dict], b: dict[int, dict]) -> dict:
    """{"end greedy" | "end sampled": stats.paired of a - b at the end, with its table cells}: two sets of
    {seed: recorded run} on the held-out questions, paired over the seeds both ran (a sign count when a
    paired run collapsed)."""
    out = {}
    for metric, key in (("end greedy", "heldout_greedy"), ("end sampled", "heldout_sampled")):
        p = paired({s: r["curves"][key][-1] for s, r in a.items()}, {s: r["curves"][key][-1] for s, r in b.items()})
        bimodal = any(collapsed(runs[s]) for runs in (a, b) for s in p["seeds"])
        text, interval = paired_cells(p, bimodal)
        out[metric] = {**p, "text": text, "interval": interval, "collapsed": bimodal}
    return out


def verdicts(task: str, study: dict) -> dict:
    """PRIME - outcome-only on the held-out questions, paired by seed (a seed whose two runs started
    from different weights is left out and named): greedy and sampled at the end."""
    runs = seed_runs(task, study)
    mismatched = mismatched_seeds(runs)
    out = end_verdicts({s: r for s, r in runs["prime"].items() if s not in mismatched}, runs["rloo"])
    for metric, key in (("end greedy", "heldout_greedy"), ("end sampled", "heldout_sampled")):
        out[metric] |= {"mismatched": mismatched, "means": {
            arm: float(np.mean([r["curves"][key][-1] for r in by_seed.values()])) if by_seed else None
            for arm, by_seed in runs.items()}}
    return out


def seeds_table(task: str, study: dict) -> str:
    runs = seed_runs(task, study)
    lines = ["| arm | seeds | held-out greedy, start -> end | held-out sampled, start -> end | PRM pairwise, last 10 | "
             "right answers with a wrong step, last 10 | minutes of training (mean) | collapsed |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for arm in ("rloo", "prime"):
        r = list(runs[arm].values())
        if not r:
            lines.append(f"| {LABELS[arm]} | 0 | | | | | | |")
            continue
        at = lambda key, i: np.mean([x["curves"][key][i] for x in r])  # noqa: E731
        n_logged = sum(logged(x, "right_with_wrong_step") for x in r)
        slipped = f"{last10_cell(r, 'right_with_wrong_step')} ({n_logged} seed{'' if n_logged == 1 else 's'})" \
            if TASKS[task]["steps"] else "n/a (one line)"
        lines.append(f"| {LABELS[arm]} | {len(r)} | {at('heldout_greedy', 0):.3f} -> {at('heldout_greedy', -1):.3f} | "
                     f"{at('heldout_sampled', 0):.3f} -> {at('heldout_sampled', -1):.3f} | "
                     f"{last10_cell(r)} | {slipped} | "
                     f"{np.mean([x['curves']['train_seconds'][-1] for x in r]) / 60:.1f} | "
                     f"{sum(map(collapsed, r))} of {len(r)} |")
    starts = {}
    for arm in ("rloo", "prime"):
        for seed, run in runs[arm].items():
            starts.setdefault((run.get("start_sha256") or "unknown")[:8], []).append(f"{LABELS[arm]} {seed}")
    if len(starts) > 1:
        lines.append("\nstarts (sha256 of the weights): " + "; ".join(f"{h}: {', '.join(r)}" for h, r in starts.items()))
    for metric, v in verdicts(task, study).items():
        lines.append(f"\nPRIME - outcome-only, {metric}, paired by seed: {v['text']}, 95% interval {v['interval']}")
    if v["mismatched"]:
        lines.append(f"\nnot paired (the two arms started from different weights): seeds {v['mismatched']}")
    return "\n".join(lines)


def seconds_a_step(runs) -> dict[str, float]:
    """{machine: seconds of training a step} of recorded runs (rollout, verify, PRM and policy: no evaluation),
    by the machine each summary names ("unrecorded" for runs from before it was named): the median step of
    each run, averaged over its runs. The median, not total / steps: a step during which the run was paused
    (to let the tests run) or shared its cores with something else is one outlier, not a shift of the mean."""
    by_machine = {}
    for r in runs:
        step = np.diff([0.0, *r["curves"]["train_seconds"]])
        by_machine.setdefault(r["summary"].get("machine", "unrecorded"), []).append(float(np.median(step)))
    return {m: float(np.mean(v)) for m, v in by_machine.items()}


def lora_seeds(task: str, study: dict, factor: int) -> dict[str, dict[int, dict]]:
    """{arm: {seed: recorded run}} of the LoRA seeds at `factor` x the full-FT lrs."""
    return {arm: {seed: study["runs"][name] for seed in SEEDS
                  if (name := lora_seed_name(task, factor, arm, seed)) in study["runs"]} for arm in ("rloo", "prime")}


def lora_factor(task: str, study: dict) -> int | None:
    """The LoRA lr grid's chosen factor (of the full-FT policy lr); None before it has chosen."""
    chosen, lr = choice(task, "lora-lr", study), choice(task, "lr", study)
    return round(float(chosen["policy_lr"]) / float(lr["policy_lr"])) if chosen and lr else None


def lora_seed_factors(task: str, study: dict) -> list[int]:
    """The factors with LoRA seeds recorded, and the chosen one (last) once the grid has chosen."""
    recorded = {int(m.group(1)) for name in study["runs"]
                if (m := re.fullmatch(rf"{task}-lora-x(\d+)-(?:rloo|prime)-s\d+", name))}
    chosen = lora_factor(task, study)
    return sorted(recorded - {chosen}) + ([chosen] if chosen else [])


def lora_verdicts(task: str, study: dict, factor: int) -> dict:
    """{arm: {"end sampled" | "end greedy": paired}}: the arm with LoRA at `factor` minus the arm fully
    fine-tuned on the held-out questions at the end, paired by seed (seeds whose two runs started from
    the same weights)."""
    full, lora = seed_runs(task, study), lora_seeds(task, study, factor)
    out = {}
    for arm in ("rloo", "prime"):
        same_start = {s: r for s, r in lora[arm].items() if s in full[arm] and start_of(r) == start_of(full[arm][s])}
        out[arm] = end_verdicts(same_start, full[arm])
    return out


def lora_table(task: str, study: dict, factor: int) -> str:
    """Each arm with LoRA against the same arm fully fine-tuned, paired by seed (the same start, prompts and
    held-out questions): held-out sampled and greedy accuracy at the end; and seconds of training a step
    of each, side by side only on a machine that ran both (the lora-timing runs are full FT run again
    where the LoRA seeds ran), with how closely such a rerun repeats its recorded seed."""
    full, lora = seed_runs(task, study), lora_seeds(task, study, factor)
    verdict = lora_verdicts(task, study, factor)
    timing = {s["arm"]: study["runs"][name] for name, s in grid_runs(task, "lora-timing", study) or []
              if name in study["runs"]}
    lines = ["| arm | seeds (LoRA / full) | held-out sampled, LoRA / full (end) | LoRA - full, sampled, paired | "
             "95% interval | LoRA - full, greedy, paired | training s a step, LoRA / full (one machine) | "
             "collapsed, LoRA / full |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    notes = []
    for arm in ("rloo", "prime"):
        a, b = lora[arm], full[arm]
        cells = [(verdict[arm][metric]["text"], verdict[arm][metric]["interval"]) for metric in ("end sampled", "end greedy")]
        mine, theirs = seconds_a_step(a.values()), seconds_a_step([*b.values(), *([timing[arm]] if arm in timing else [])])
        same = [m for m in mine if m in theirs and m != "unrecorded"]
        per_step = "; ".join(f"{mine[m]:.1f} / {theirs[m]:.1f} ({m})" for m in same) or "not on one machine yet"
        end = [np.mean([r["curves"]["heldout_sampled"][-1] for r in x.values()]) if x else float("nan") for x in (a, b)]
        lines.append(f"| {LABELS[arm]} | {len(a)} / {len(b)} | {end[0]:.3f} / {end[1]:.3f} | {cells[0][0]} | "
                     f"{cells[0][1]} | {cells[1][0]} | {per_step} | "
                     f"{sum(map(collapsed, a.values()))} / {sum(map(collapsed, b.values()))} |")
        if arm in timing and 1 in b:
            again, first = timing[arm], b[1]
            notes.append(f"{LABELS[arm]}, full FT, seed 1 run again on {again['summary'].get('machine', 'unrecorded')}: "
                         f"held-out sampled {again['curves']['heldout_sampled'][-1]:.3f}, greedy "
                         f"{again['curves']['heldout_greedy'][-1]:.3f} (recorded: {first['curves']['heldout_sampled'][-1]:.3f}, "
                         f"{first['curves']['heldout_greedy'][-1]:.3f}, on {first['summary'].get('machine', 'unrecorded')})")
    if lora["rloo"] and lora["prime"]:  # within LoRA; and whether LoRA costs one arm more than the other
        within = end_verdicts(lora["prime"], lora["rloo"])["end sampled"]
        notes.append(f"with LoRA, PRIME - outcome-only, held-out sampled, paired: {within['text']}, 95% interval "
                     f"{within['interval']}")
        cost = {arm: verdict[arm]["end sampled"] for arm in ("rloo", "prime")}
        gap = {arm: dict(zip(c["seeds"], c["diffs"])) for arm, c in cost.items()}
        text, interval = paired_cells(paired(gap["prime"], gap["rloo"]), any(c["collapsed"] for c in cost.values()))
        notes.append(f"LoRA - full for PRIME minus LoRA - full for outcome-only (the interaction), paired: {text}, "
                     f"95% interval {interval}")
    return "\n".join(lines + ["\n" + note for note in notes])


def lora_time_parts(task: str, study: dict, factor: int) -> str:
    """Seconds a step by part, LoRA at `factor` against full fine-tuning, on the machine that ran full FT's
    reruns (the lora-timing runs, seed 1 of each arm) beside the LoRA seeds: each run's mean over its steps
    (its summary's step_seconds), then mean [min, max] over an arm's runs on that machine."""
    lora = lora_seeds(task, study, factor)
    timing = {s["arm"]: study["runs"][name] for name, s in grid_runs(task, "lora-timing", study) or []
              if name in study["runs"]}
    machines = {r["summary"].get("machine") for r in timing.values()}
    if len(machines) != 1:
        return "(full fine-tuning's reruns are not recorded on one machine)"
    machine = machines.pop()
    columns = [(f"{LABELS[arm]}, {kind}", runs) for arm in ("rloo", "prime")
               for kind, runs in (("LoRA", [r for r in lora[arm].values() if r["summary"].get("machine") == machine]),
                                  ("full FT", [timing[arm]] if arm in timing else []))]
    lines = [f"| part of a step (s, a run's mean; {machine}) | " + " | ".join(f"{name} ({len(runs)})" for name, runs in columns)
             + " |", "| --- |" + " --- |" * len(columns)]
    for part in ("rollout", "prm", "policy"):
        cells = []
        for _, runs in columns:
            values = [r["summary"]["step_seconds"][part] for r in runs]
            cells.append(f"{np.mean(values):.1f} [{min(values):.1f}, {max(values):.1f}]" if values else "n/a")
        lines.append(f"| {part} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_task(task: str, study: dict, figures: Path) -> Path | None:
    """The seeds phase: held-out sampled accuracy against step and against training seconds (the
    compute each arm spent), the training reward, PRIME's PRM pairwise accuracy and the share of right
    answers with a wrong step (over the runs that logged it); mean over seeds, band min..max."""
    runs = seed_runs(task, study)
    if not runs["rloo"] and not runs["prime"]:
        return None
    fig, axes = plt.subplots(1, 5, figsize=(27, 4))
    for i, arm in enumerate(("rloo", "prime")):
        r = list(runs[arm].values())
        if not r:
            continue
        style = dict(color=f"C{i}", label=f"{LABELS[arm]} ({len(r)} seeds)")
        steps = np.array(r[0]["curves"]["eval_step"])
        acc = np.array([x["curves"]["heldout_sampled"] for x in r])
        axes[0].plot(steps, acc.mean(0), marker="o", **style)
        axes[0].fill_between(steps, acc.min(0), acc.max(0), color=f"C{i}", alpha=0.15)
        for x in r:  # against the seconds each run had spent when it was evaluated
            seconds = [0.0, *(x["curves"]["train_seconds"][s - 1] for s in x["curves"]["eval_step"][1:])]
            axes[1].plot(np.array(seconds) / 60, x["curves"]["heldout_sampled"], color=f"C{i}", alpha=0.6)
        panels = [(axes[2], "reward"), (axes[3], "prm_accuracy")]
        if TASKS[task]["steps"]:  # (on one-line answers it measures layout: TASKS)
            panels.append((axes[4], "right_with_wrong_step"))
        for ax, key in panels:
            values = np.array([[np.nan if v is None else v for v in x["curves"][key]] for x in r if logged(x, key)],
                              dtype=float)
            if not values.size:  # none logged it (no PRM; runs from before train.py logged it)
                continue
            smooth = runlog.moving_average(values, 5)
            with np.errstate(all="ignore"):
                ax.plot(np.arange(1, smooth.shape[1] + 1), np.nanmean(smooth, 0), **style)
    titles = ["held-out sampled accuracy (mean, band min..max)", "held-out sampled against minutes of training "
              "(each seed)", "training reward (5-step moving average)", "PRM pairwise accuracy (5-step average)",
              "right answers with a wrong step (5-step average, runs that log it)"]
    for ax, title, xlabel in zip(axes, titles, ["RL step", "minutes (rollout + PRM + policy)", *["RL step"] * 3]):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(xlabel)
    axes[0].legend(fontsize=8)
    axes[3].axhline(0.5, color="grey", lw=0.8, ls=":")
    fig.suptitle(f"SmolLM2-135M-Instruct, {task}: PRIME vs outcome-only at their chosen settings")
    return save_figure(fig, figures, f"study-{task}")


def report(tasks: list[str], figures: Path) -> None:
    study = read_study(figures / "study.json")
    for task in tasks:
        print(f"\n# {task}\n\n## 1. the policy lr, outcome-only, validation split\n\n{grid_table(task, 'lr', study)}")
        print(f"\n## 2. the PRM lr and beta, PRIME, validation split\n\n{grid_table(task, 'prm', study)}")
        print(f"\n## 3. five seeds an arm, held-out questions\n\n{seeds_table(task, study)}")
        if task in LORA_TASKS:
            print(f"\n## 4. LoRA (rank {LORA_RANK}): the policy lr, outcome-only, validation split\n\n"
                  f"{grid_table(task, 'lora-lr', study)}")
            chosen = lora_factor(task, study)
            for k in lora_seed_factors(task, study):
                which = "the chosen lr" if k == chosen else "an earlier choice"
                print(f"\n## 5. LoRA at x{k} ({which}) against full fine-tuning, five seeds an arm, held-out questions\n\n"
                      f"{lora_table(task, study, k)}\n\n{lora_time_parts(task, study, k)}")
        path = plot_task(task, study, figures)
        if path:
            print(f"\n{path}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    parser.add_argument("--phases", nargs="+", choices=PHASES, default=PHASES, help="run only these phases")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (each on its own thread)")
    parser.add_argument("--out", default="runs/real-study", help="where the runs, task files and logs go")
    parser.add_argument("--cache-dir", default=".cache", help="where SmolLM2 and the SFT starts are built")
    parser.add_argument("--figures", default="docs/figures/real", help="where study.json and the plots go")
    parser.add_argument("--report-only", action="store_true", help="only the tables and plots, from study.json")
    args, args.train_args = parser.parse_known_args(argv)  # the rest goes to every train.py run
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: must be >= 1")
    # threads a run: OMP_NUM_THREADS where it is set (as runner.run_all), else the cores split between the jobs
    args.steps = STEPS
    args.threads = int(os.environ.get("OMP_NUM_THREADS") or max(1, (os.cpu_count() or 1) // args.jobs))
    if not args.report_only:
        run_protocol(args.tasks, args)
    report(args.tasks, Path(args.figures))


if __name__ == "__main__":
    main()
