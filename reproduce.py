"""The papers' headline comparisons at laptop scale, on the embedded task, several seeds each.

    python reproduce.py prime-vs-rloo          # PRIME vs outcome-only RLOO (PRIME Fig. 3)
    python reproduce.py online-vs-offline      # online vs offline (frozen) implicit PRM (Fig. 5)
    python reproduce.py estimators             # REINFORCE / GRPO / PPO / RLOO with and without process rewards (Fig. 7)
    python reproduce.py pass                   # GRPO outcome-only vs PASS, implicit PRM and exact step checker (PASS Table 1)
    python reproduce.py timing                 # step-time split, PRIME vs RLOO (Table 2)
    python reproduce.py all                    # everything above (each run once; arms are shared)
    python reproduce.py all --report-only      # redraw plots and tables from the finished runs
    python reproduce.py all --paired-from-json # the paired differences the text quotes, from results.json
    python reproduce.py prime-vs-rloo --seeds 1 2 --steps 40 --jobs 1
    python reproduce.py real                   # PRIME vs outcome-only on SmolLM2, tuned, 5 seeds (real_study.py)

Each arm is a plain `python train.py` run with the flags in ARMS, written to runs/repro/<arm>-s<seed>/.
A finished run (summary.json present) is not run again, so an interrupted reproduction continues
where it stopped; an interrupted run restarts from its own last checkpoint (train.py --resume).
`--jobs 2` runs two at a time with OMP_NUM_THREADS split between them (the tiny model runs
better on one thread each than two runs fighting over both cores).

Output: one PNG per comparison and results.json in --figures (default docs/figures/), and a
Markdown table per comparison on the terminal (docs/REPRODUCTION.md quotes them). Every number is
what the runs printed; nothing is smoothed except the plotted moving averages, which say so. The
credit-assignment study, research beyond the papers' comparisons, is credit_study.py (it uses this
file's runner).
"""

import argparse
import json
import math
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

import runlog  # noqa: E402
from config import Args  # noqa: E402
from config import parse_args as parse_train_args  # noqa: E402
from runlog import moving_average, nanmean  # noqa: E402

REPO = Path(__file__).resolve().parent
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
    "pass-implicit": ["--estimator", "pass"],
    "pass-step": ["--estimator", "pass", "--process", "step"],
    "ppo": ["--estimator", "ppo", "--process", "none"],
    "ppo+prm": ["--estimator", "ppo"],
}
LABELS = {"prime": "PRIME", "rloo": "outcome-only", "prime-offline": "PRIME, offline PRM",
          "reinforce": "REINFORCE", "reinforce+prm": "REINFORCE + implicit PRM", "grpo": "GRPO",
          "grpo+prm": "GRPO + implicit PRM", "pass-implicit": "PASS, implicit PRM", "pass-step": "PASS, exact step checker",
          "ppo": "PPO (critic + GAE)", "ppo+prm": "PPO + implicit PRM"}
COMPARISONS = {
    "prime-vs-rloo": ["rloo", "prime"],
    "online-vs-offline": ["prime", "prime-offline"],
    "estimators": ["reinforce", "reinforce+prm", "grpo", "grpo+prm", "ppo", "ppo+prm", "rloo", "prime"],
    "pass": ["grpo", "pass-implicit", "pass-step"],
    "timing": ["rloo", "prime"],
}
# The paired differences (arm, against) each comparison's text quotes: `--paired-from-json` prints them
# from results.json alone, so that every difference docs/REPRODUCTION.md states can be recomputed.
PAIRS = {
    "prime-vs-rloo": [("prime", "rloo")],
    "online-vs-offline": [("prime-offline", "prime")],
    "estimators": [("reinforce+prm", "reinforce"), ("grpo+prm", "grpo"), ("ppo+prm", "ppo"), ("prime", "rloo"),
                   ("reinforce", "rloo"), ("grpo", "rloo"), ("ppo", "rloo")],
    "pass": [("pass-implicit", "grpo"), ("pass-step", "grpo"), ("pass-step", "pass-implicit")],
}


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


# A claim needs paired seeds: arms that share a seed share the RL prompts, the start and the evaluation's
# random numbers, so the per-seed difference cancels what the seed alone decides.
CLAIM_SEEDS = 5   # at least this many seeds both arms ran
CLAIM_T = 3.0     # and a paired t at least this large, every difference of the same sign
# A study tests many differences, and where there is none the rule above still fires in 3.6% of them
# (5 seeds, normal differences; simulated, 2e6 draws). The claims an answer rests on need |t| >= 5,
# which fires by chance in 0.76% (the same simulation). NULL_RATE: the expected false claims of a
# family of tests is its size times these.
CLAIM_T_STRONG = 5.0
NULL_RATE = {CLAIM_T: 0.036, CLAIM_T_STRONG: 0.0076}
# Student's t, 97.5% quantile by degrees of freedom, from a printed table; above 10 degrees,
# 1.96 + 2.4 / df (within 1.1% of the table's values up to 30).
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def t975(df: int) -> float:
    return T975.get(df, 1.96 + 2.4 / df)


def sign_test_p(up: int, down: int) -> float:
    """Exact two-sided sign test: the chance of a split at least this uneven among up + down
    non-zero differences when each is up or down with probability 1/2. With 5 seeds it is never
    below 0.0625 (5 of 5), so it cannot make a claim: it is what a bimodal difference (collapses)
    gets instead of a t, whose normal assumption such a difference breaks."""
    n, k = up + down, max(up, down)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k, n + 1)) / 2 ** n) if n else 1.0


def paired(arm: dict[int, float], base: dict[int, float]) -> dict:
    """arm - base over the seeds both ran ({seed: value} each): the per-seed differences, their mean,
    the paired t = mean / (sd / sqrt(n)) (sd with n - 1; +-inf when every difference is the same
    non-zero number, nan below 2 seeds), its 95% interval (mean +- t975(n - 1) sd / sqrt(n)), how
    many are > 0 and < 0 with their sign-test p, and the verdict: "up" / "down" (n >= CLAIM_SEEDS,
    |t| >= CLAIM_T and every difference of that sign), "none" (enough seeds, no such difference),
    "too few seeds"."""
    seeds = sorted(set(arm) & set(base))
    diffs = [arm[s] - base[s] for s in seeds]
    n = len(diffs)
    mean = float(np.mean(diffs)) if n else math.nan
    t, ci95 = math.nan, (math.nan, math.nan)
    if n > 1:
        sd = float(np.std(diffs, ddof=1))
        t = mean / (sd / math.sqrt(n)) if sd > 0 else (math.copysign(math.inf, mean) if mean else 0.0)
        half = t975(n - 1) * sd / math.sqrt(n)
        ci95 = (mean - half, mean + half)
    up, down = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
    verdict = "too few seeds"
    if n >= CLAIM_SEEDS:
        verdict = "up" if t >= CLAIM_T and up == n else "down" if t <= -CLAIM_T and down == n else "none"
    return {"seeds": seeds, "diffs": diffs, "mean": mean, "t": t, "ci95": ci95, "up": up, "down": down,
            "sign_p": sign_test_p(up, down), "verdict": verdict}


def paired_text(p: dict) -> str:
    """One table cell: '+0.021 (t 3.3, 4/5 up; too few seeds)'."""
    if not p["seeds"]:
        return "no shared seed"
    if len(p["seeds"]) == 1:
        return f"{p['mean']:+.3f} (one seed)"
    return f"{p['mean']:+.3f} (t {p['t']:.1f}, {p['up']}/{len(p['seeds'])} up; {p['verdict']})"


COLLAPSED = 0.5  # a run whose greedy held-out accuracy ends below this has collapsed


def paired_cells(p: dict, collapsed: bool) -> tuple[str, str]:
    """A paired difference's verdict cell and its 95% interval cell. A difference with a collapsed run
    is bimodal, so its t is not trusted: it gets the sign count and the sign test's p, no interval."""
    lo, hi = p["ci95"]
    if collapsed and len(p["seeds"]) > 1:
        return f"{p['mean']:+.3f} ({p['up']}/{len(p['seeds'])} up; bimodal: sign test p {p['sign_p']:.2f}, no t)", "n/a"
    return paired_text(p), "n/a" if math.isnan(lo) else f"[{lo:+.3f}, {hi:+.3f}]"


def eval_se(accuracy: float, draws: int) -> float:
    """Binomial standard error of an accuracy measured on `draws` responses (problems x samples): the
    evaluation's own noise, before any difference between seeds or arms."""
    return math.sqrt(accuracy * (1 - accuracy) / max(draws, 1))


def summarize(arm: str, runs: list[dict], window: int) -> dict:
    reward = series(runs, "reward")
    acc = series(runs, "prm_accuracy")
    tail = slice(-window, None)
    start = [r["summary"]["start_accuracy"] for r in runs]
    end = [r["summary"]["end_accuracy"] for r in runs]
    step_seconds = {k: float(np.mean([r["summary"]["step_seconds"][k] for r in runs]))
                    for k in runs[0]["summary"]["step_seconds"]}
    with np.errstate(all="ignore"):
        return {"arm": arm, "seeds": len(runs), "seed": [r["config"]["seed"] for r in runs],
                "steps": [r["summary"]["steps"] for r in runs],  # what default a result ran on, with the start
                "start_sampled": [r["summary"]["start_sampled_accuracy"] for r in runs],
                "end_sampled": [r["summary"]["end_sampled_accuracy"] for r in runs],
                "eval_draws": [r["summary"]["eval_problems"] * r["config"]["eval_samples"] for r in runs],
                "reward_last": [float(np.mean(r[tail])) for r in reward],
                "reward_first": [float(np.mean(r[:window])) for r in reward],
                "prm_accuracy_first": [nanmean(a[:window]) for a in acc],
                "prm_accuracy_last": [nanmean(a[tail]) for a in acc],
                "start_accuracy": start, "end_accuracy": end,
                "step_seconds": step_seconds,
                "wall_seconds": [r["summary"]["wall_seconds"] for r in runs]}


def paired_from_json(results: dict, names: list[str]) -> str:
    """The PAIRS of these comparisons from results.json alone, paired by seed: the verdict, the 95%
    interval and how many runs of each side collapsed. Only runs of the same default pair (results.json
    records `steps` for today's runs; an entry without it ran on an earlier default)."""
    lines = ["| comparison | arm | against | seeds | end sampled difference, paired | 95% interval | "
             "runs collapsed (arm / against) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for name in names:
        for arm, against in PAIRS.get(name, ()):
            a, b = results.get(arm), results.get(against)
            head = f"| {name} | {LABELS[arm]} | {LABELS[against]} |"
            if not a or not b or "steps" not in a or "steps" not in b or set(a["steps"]) != set(b["steps"]):
                lines.append(f"{head} 0 | not paired: one side has no runs of today's default | n/a | n/a |")
                continue
            p = paired(dict(zip(a["seed"], a["end_sampled"])), dict(zip(b["seed"], b["end_sampled"])))
            collapsed = [sum(g < COLLAPSED for s, g in zip(x["seed"], x["end_accuracy"]) if s in p["seeds"])
                         for x in (a, b)]
            text, interval = paired_cells(p, any(collapsed))
            lines.append(f"{head} {len(p['seeds'])} | {text} | {interval} | {collapsed[0]} / {collapsed[1]} |")
    return "\n".join(lines)


def fmt(values, digits=3) -> str:
    values = [v for v in values if v is not None and not np.isnan(v)]
    if not values:
        return "n/a"
    return f"{np.mean(values):.{digits}f} [{min(values):.{digits}f}, {max(values):.{digits}f}]"


def table(rows: list[dict]) -> str:
    """Mean [min, max] over seeds; the held-out sampled accuracy with one seed's evaluation SE (the
    binomial SE of its problems x samples draws at the mean accuracy), and its paired difference from
    the first row (the comparison's baseline) seed by seed."""
    lines = ["| arm | seeds | reward, first 20 steps | reward, last 20 steps | held-out start -> end (greedy) | "
             "held-out sampled start -> end (eval SE) | end sampled - first row's, paired | "
             "PRM pairwise acc., first 20 -> last 20 |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    base = rows[0]
    for r in rows:
        se = eval_se(float(np.mean(r["end_sampled"])), int(np.mean(r["eval_draws"])))
        diff = "baseline" if r is base else paired_text(paired(dict(zip(r["seed"], r["end_sampled"])),
                                                                  dict(zip(base["seed"], base["end_sampled"]))))
        lines.append(f"| {LABELS[r['arm']]} | {r['seeds']} | {fmt(r['reward_first'])} | {fmt(r['reward_last'])} | "
                     f"{np.mean(r['start_accuracy']):.3f} -> {fmt(r['end_accuracy'])} | "
                     f"{np.mean(r['start_sampled']):.3f} -> {fmt(r['end_sampled'])} (+-{se:.3f}) | {diff} | "
                     f"{fmt(r['prm_accuracy_first'], 2)} -> {fmt(r['prm_accuracy_last'], 2)} |")
    return "\n".join(lines)


def plot(comparison: str, arms: list[str], runs: dict, figures: Path, window: int) -> Path:
    matplotlib.use("Agg")

    keys = [("reward", "outcome training reward")]
    if comparison == "online-vs-offline":
        keys = [("prm_accuracy", "PRM pairwise accuracy on the batch"), ("reward", "outcome training reward")]
    elif comparison == "timing":
        keys = []
    fig, axes = plt.subplots(1, max(len(keys), 1), figsize=(6.5 * max(len(keys), 1), 4), squeeze=False)
    if comparison == "timing":
        ax = axes[0][0]
        phases = list(runs[arms[0]][0]["summary"]["step_seconds"])
        for i, arm in enumerate(arms):
            values = [np.mean([r["summary"]["step_seconds"][p] for r in runs[arm]]) for p in phases]
            left = np.cumsum([0] + values[:-1])
            ax.barh([i] * len(phases), values, left=left, color=[f"C{j}" for j in range(len(phases))],
                    label=phases if i == 0 else None)
        ax.set_yticks(range(len(arms)), [LABELS[a] for a in arms])
        ax.set_xlabel("seconds per step (mean over seeds)")
        ax.legend(ncol=len(phases), fontsize=8)
    for ax, (key, title) in zip(axes[0], keys):
        for i, arm in enumerate(arms):
            x = moving_average(series(runs[arm], key), window)
            steps = np.arange(1, x.shape[1] + 1)
            with np.errstate(all="ignore"):
                ax.plot(steps, np.nanmean(x, 0), color=f"C{i}", label=LABELS[arm])
                ax.fill_between(steps, np.nanmin(x, 0), np.nanmax(x, 0), color=f"C{i}", alpha=0.15)
        ax.set_title(f"{title} ({window}-step moving average; band = min..max over seeds)", fontsize=9)
        ax.set_xlabel("RL step")
        if key == "prm_accuracy":
            ax.axhline(0.5, color="grey", lw=0.8, ls=":")
        ax.legend(fontsize=8)
    return save_figure(fig, figures, comparison)


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


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["real"]:  # the real model's comparison has its own protocol and flags
        import real_study
        return real_study.main(argv[1:])
    parser = same_parser(__doc__)
    parser.add_argument("comparison", choices=[*COMPARISONS, "all"], help="a comparison, or all five")
    parser.add_argument("--paired-from-json", action="store_true",
                        help="only the paired differences the text quotes (PAIRS), from --figures/results.json")
    args = parse_study_args(parser, argv)
    names = list(COMPARISONS) if args.comparison == "all" else [args.comparison]
    if args.paired_from_json:
        print(paired_from_json(json.loads((Path(args.figures) / "results.json").read_text()), names))
        return
    if not args.report_only:  # a bad train.py flag fails now (exit 2), before the SFT or any run
        task = train_config(args.train_args + ["--steps", str(args.steps)])

    arms = list(dict.fromkeys(a for n in names for a in COMPARISONS[n]))
    if not args.report_only:
        build_sft(task, args.cache_dir)
        run_all([(arm, seed) for seed in args.seeds for arm in arms], args, f"{len(arms)} arms")

    runs = {}
    for arm in arms:  # report what has finished (the table says how many seeds each row has)
        runs[arm] = load_finished(args.out, arm, args.seeds)
        if len(runs[arm]) < len(args.seeds):
            print(f"warning: {arm}: {len(runs[arm])} of {len(args.seeds)} seeds finished")
    arms = [a for a in arms if runs[a]]
    names = [n for n in names if all(runs.get(a) for a in COMPARISONS[n])]
    results = {arm: summarize(arm, runs[arm], args.window) for arm in arms}
    figures = Path(args.figures)
    for name in names:
        path = plot(name, COMPARISONS[name], runs, figures, args.window)
        print(f"\n## {name}  ({path})\n")
        print(table([results[a] for a in COMPARISONS[name]]))
        if name == "prime-vs-rloo":
            print(sample_efficiency(runs["rloo"], runs["prime"], args.window))
        if name == "timing":
            for arm in COMPARISONS[name]:
                split = results[arm]["step_seconds"]
                print(f"{LABELS[arm]}: {sum(split.values()):.2f} s/step = " +
                      ", ".join(f"{k} {v:.2f}" for k, v in split.items()))
    recorded = merge_json(figures / "results.json", results)
    print("\n## paired differences\n\n" + paired_from_json(recorded, names))


def build_sft(task, cache_dir: str) -> None:
    """The embedded SFT checkpoint of a configuration, once, before any run (the runs would race)."""
    subprocess.run([sys.executable, "-c", "import sys, toy_task; from pathlib import Path; "
                    f"toy_task.sft_checkpoint(Path({cache_dir!r}), int(sys.argv[1]), "
                    "ops=toy_task.parse_ops(sys.argv[2]), slip=float(sys.argv[3]))",
                    str(task.sft_steps), task.toy_ops, str(task.toy_slip)], check=True, cwd=REPO)


def train_config(train_args: list[str]):
    """The train.py configuration every run of the comparison shares (for the SFT it needs)."""
    return parse_train_args(train_args)


def sample_efficiency(rloo: list[dict], prime_runs: list[dict], window: int) -> str:
    """Fig. 3's reading: the step at which PRIME's moving-average reward first reaches RLOO's final
    moving-average reward, per seed (paired by seed), and the final gap. Only full windows count
    (from step `window` on); the paper's 2.5x is RLOO's final step over that step."""
    lines = []
    for a, b in zip(rloo, prime_runs):
        r = moving_average(series([a], "reward"), window)[0]
        p = moving_average(series([b], "reward"), window)[0]
        reach = steps_to_reach([b], r[-1], window)[0]  # full windows only: early means are too noisy
        lines.append(f"seed {a['config']['seed']}: RLOO final {r[-1]:.3f}, PRIME final {p[-1]:.3f}; PRIME reaches "
                     f"RLOO's final reward at step {reach if reach else 'never'} of {len(p)}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
