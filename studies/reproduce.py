"""The papers' headline comparisons at laptop scale, on the embedded task, several seeds each.

    python studies/reproduce.py prime-vs-rloo          # PRIME vs outcome-only RLOO (PRIME Fig. 3)
    python studies/reproduce.py online-vs-offline      # online vs offline (frozen) implicit PRM (Fig. 5)
    python studies/reproduce.py estimators             # REINFORCE / GRPO / PPO / RLOO with and without process rewards (Fig. 7)
    python studies/reproduce.py pass                   # GRPO outcome-only vs PASS, implicit PRM and exact step checker (PASS Table 1)
    python studies/reproduce.py timing                 # step-time split, PRIME vs RLOO (Table 2)
    python studies/reproduce.py all                    # everything above (each run once; arms are shared)
    python studies/reproduce.py all --report-only      # redraw plots and tables from the finished runs
    python studies/reproduce.py all --paired-from-json # the paired differences the text quotes, from results.json
    python studies/reproduce.py prime-vs-rloo --seeds 1 2 --steps 40 --jobs 1
    python studies/reproduce.py real                   # PRIME vs outcome-only on SmolLM2, tuned, 5 seeds (real_study.py)

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

import json
import sys
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (after choosing the backend)

from runner import (LABELS, build_sft, load_finished, merge_json, parse_study_args, run_all,  # noqa: E402
                    same_parser, save_figure, series, steps_to_reach, train_config)
from runlog import moving_average, nanmean  # noqa: E402  (runner put the repository on the path)
from stats import collapsed, eval_se, fmt, paired, paired_cells, paired_text  # noqa: E402

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
            fell = [sum(collapsed(g0, g) for s, g0, g in zip(x["seed"], x["start_accuracy"], x["end_accuracy"])
                        if s in p["seeds"]) for x in (a, b)]
            text, interval = paired_cells(p, any(fell))
            lines.append(f"{head} {len(p['seeds'])} | {text} | {interval} | {fell[0]} / {fell[1]} |")
    return "\n".join(lines)


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


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["real"]:  # the real model's comparison has its own protocol and flags
        import real_study
        return real_study.main(argv[1:])
    parser = same_parser(__doc__)
    parser.add_argument("comparison", choices=[*COMPARISONS, "all", "real"],  # real: handled above, listed here
                        help="a comparison, all five, or real (the SmolLM2 study: real_study.py, with flags of its "
                             "own: reproduce.py real --help); the credit-assignment study is credit_study.py")
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


def sample_efficiency(rloo: list[dict], prime_runs: list[dict], window: int) -> str:
    """Fig. 3's reading: the step at which PRIME's moving-average reward first reaches RLOO's final
    moving-average reward, per seed (paired by seed), and the final gap. Only full windows count
    (from step `window` on); the paper's 2.5x is RLOO's final step over that step."""
    lines = []
    for a, b in zip(rloo, prime_runs):
        r = moving_average(series([a], "reward"), window)[0]
        p = moving_average(series([b], "reward"), window)[0]
        reach = steps_to_reach([b], r[-1], window)[0]  # full windows only: early means are too noisy
        lines.append(f"seed {a['config']['seed']}: outcome-only final {r[-1]:.3f}, PRIME final {p[-1]:.3f}; PRIME "
                     f"reaches outcome-only's final reward at step {reach if reach else 'never'} of {len(p)}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
