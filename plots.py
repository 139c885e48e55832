"""Plots of train.py runs, and a run's closing summary (train.py calls write_summary at its end).

    python eval.py --plot runs/A runs/B --plot-out compare.png   # the curves of several runs (plot_runs)
    python eval.py --episodes runs/<name>                        # tokens coloured by their process reward

plot_runs draws the papers' Figs. 3-5 for several runs side by side; plot_episodes draws sample
episodes with each token coloured by its implicit process reward; write_summary writes summary.json,
curves.png and episodes.png and prints a run's closing lines.
"""

import math
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402 (after choosing the backend)
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from runlog import fmt, machine, moving_average, nanmean, read_jsonl, read_run, save_figure, write_json  # noqa: E402

PHASES = ("rollout", "verify", "prm", "policy", "eval", "other")  # train.py's step-time split


# ---------------------------------------------------------------------------------------------------
# Plots: compare runs the way the papers' Figs. 3-5 do
# ---------------------------------------------------------------------------------------------------


def load_run(run_dir: str | Path) -> dict:
    """runlog.read_run for --plot: a run folder with at least one step."""
    run = read_run(run_dir)
    if not run["metrics"]:
        raise SystemExit(f"--plot {run_dir}: no steps in metrics.jsonl (is it a train.py run folder?)")
    return run


def _series(metrics: list[dict], key: str) -> list[float]:
    return [math.nan if m.get(key) is None else float(m[key]) for m in metrics]


def pick_episodes(episodes: list[dict], per_phase: tuple[int, int] = (2, 1)) -> list[dict]:
    """Episodes for the picture: from the first and the last 15% of the run's steps, up to
    `per_phase` = (wrong ones that have a first wrong step, right ones), earliest first."""
    if not episodes:
        return []
    last = max(e["step"] for e in episodes)
    cut = max(1, round(0.15 * last))
    chosen = []
    for phase in ([e for e in episodes if e["step"] <= cut], [e for e in episodes if e["step"] > last - cut]):
        wrong = [e for e in phase if e["outcome"] < 1 and e.get("first_wrong_step", -1) >= 0][:per_phase[0]]
        right = [e for e in phase if e["outcome"] >= 1][:per_phase[1]]
        chosen += sorted(wrong + right, key=lambda e: e["step"])
    return chosen


def plot_episodes(run_dir: str | Path, out: str | Path | None = None) -> Path | None:
    """runs/<name>/episodes.png: a few responses, early and late in the run, each token's background
    coloured by its process reward (Eq. 3's r_phi for PRIME: blue credited, red blamed, the scale
    symmetric around 0 and set by the largest |r| shown), the steps' sums at the right, and the first
    step the exact checker marks wrong boxed. Read from episodes.jsonl; None if it has no episode."""
    run_dir = Path(run_dir)
    path = run_dir / "episodes.jsonl"
    if not path.exists():
        raise SystemExit(f"--episodes {run_dir}: no episodes.jsonl (is it a train.py run folder?)")
    episodes = pick_episodes(read_jsonl(path))
    if not episodes:
        return None
    vmax = max(max((abs(r) for r in e["reward"]), default=0.0) for e in episodes) or 1.0
    cmap = plt.get_cmap("coolwarm_r")  # negative (blamed) red, positive (credited) blue
    layout = []  # per episode: its lines, each a list of (char, reward, step)
    for e in episodes:
        lines, line = [], []
        steps = e.get("step_ids") or [0] * len(e["tokens"])
        for token, r, k in zip(e["tokens"], e["reward"], steps):
            text = {"Ċ": "\n", "<eos>": "⏎", "<|im_end|>": "⏎", "<|endoftext|>": "⏎", None: "·"}.get(token, token)
            text = text.replace("Ġ", " ") if text != "\n" else text  # a BPE token's leading space (byte-level)
            if text == "\n":
                line.append(("↵", r, k))
                lines.append(line)
                line = []
            else:
                line.append((text, r, k))
        lines.append(line)
        layout.append([l for l in lines if l])
    n_rows = sum(len(l) + 1.6 for l in layout)
    width = max(sum(len(ch) for ch, _, _ in l) for lines in layout for l in lines) + 16  # a token as wide as its text
    fig, ax = plt.subplots(figsize=(0.16 * width + 2, 0.27 * n_rows + 1.0))
    y = 0.0
    for e, lines in zip(episodes, layout):
        verdict = "right" if e["outcome"] >= 1 else "wrong"
        extra = f", first wrong step: line {e['first_wrong_step'] + 1}" if e.get("first_wrong_step", -1) >= 0 else ""
        ax.text(0, y, f"step {e['step']}: {verdict} (outcome {e['outcome']:g}{extra})", fontsize=9,
                fontweight="bold", va="center")
        y += 1.1
        for line in lines:
            x = 0
            for ch, r, _ in line:
                shade = max(-1, min(1, r / vmax))
                ax.add_patch(Rectangle((x, y - 0.45), len(ch), 0.9, color=cmap(0.5 + 0.5 * shade)))
                ax.text(x + len(ch) / 2, y, ch, fontsize=9, family="monospace", ha="center", va="center",
                        color="white" if abs(shade) > 0.6 else "black")  # readable on the darkest cells
                x += len(ch)
            step = line[0][2]
            total = sum(r for _, r, _ in line)
            wrong_line = e.get("first_wrong_step", -1) == step and e["outcome"] < 1
            if wrong_line:
                ax.add_patch(Rectangle((-0.1, y - 0.5), x + 0.2, 1.0, fill=False, lw=1.6, ec="black"))
            ax.text(x + 1, y, f"Σ {total:+.2f}" + ("  ← first wrong step" if wrong_line else ""),
                    fontsize=8, va="center", family="monospace")
            y += 1
        y += 0.5
    ax.set_xlim(-0.5, width)
    ax.set_ylim(y, -1)
    ax.axis("off")
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(-vmax, vmax))
    fig.colorbar(sm, ax=ax, fraction=0.02, pad=0.01, label="process reward per token")
    ax.set_title(f"{run_dir.name}: per-token process rewards, early and late episodes", fontsize=10)
    out = save_figure(fig, Path(out) if out else run_dir / "episodes.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


def plot_runs(run_dirs: list[str], out: str | Path) -> Path:
    """One PNG, six panels, one colour per run (train.py draws a run's own curves.png with it):
      outcome training reward, raw and 10-step moving average                  (PRIME Fig. 3a, 4a)
      held-out accuracy, sampled (solid) and greedy (dashed): the start (step 0), every
        --eval-every steps, the end                                             (Fig. 3b)
      PRM pairwise classification accuracy                                      (Fig. 5)
      localisation: the most blamed step is the first wrong one (embedded task)
      response length (tokens)
      mean seconds per step, split into train.py's phases, as stacked bars     (Table 2)
    """
    runs = [load_run(d) for d in run_dirs]
    names = [r["dir"].name for r in runs]
    if len(set(names)) < len(names):  # runs/A and other/A: the full paths tell them apart
        names = [str(r["dir"]) for r in runs]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(2, 3, figsize=(17, 8.5))
    curves = [(axes[0, 0], "reward", "outcome training reward"),
              (axes[0, 2], "prm_accuracy", "PRM pairwise accuracy"),
              (axes[1, 0], "prm_localization", "first wrong step = most blamed step"),
              (axes[1, 1], "response_length", "response length (tokens)")]
    for i, (run, name) in enumerate(zip(runs, names)):
        colour = colours[i % len(colours)]
        metrics, summary = run["metrics"], run["summary"]
        steps = [m["step"] for m in metrics]
        for ax, key, _ in curves:
            values = _series(metrics, key)
            ax.plot(steps, values, color=colour, alpha=0.3, linewidth=1)
            ax.plot(steps, moving_average(values), color=colour, label=f"{name} (10-step mean)")
        # held-out accuracy: the summary's start (step 0), the logged steps, the summary's end
        for kind, key, start, end, style in (("sampled", "heldout_sampled_accuracy", "start_sampled_accuracy",
                                              "end_sampled_accuracy", "o-"),
                                             ("greedy", "heldout_accuracy", "start_accuracy", "end_accuracy", "s--")):
            points = [(0, summary.get(start))] + [(m["step"], m.get(key)) for m in metrics] + \
                     [(steps[-1], summary.get(end))]
            points = [(x, y) for x, y in points if y is not None]
            if points:
                axes[0, 1].plot(*zip(*points), style, color=colour, label=f"{name} ({kind})")
        # mean seconds per step, split into train.py's phases (PRIME Table 2)
        timed = [m["time"] for m in metrics if m.get("time")]
        left = 0.0
        for j, phase in enumerate(PHASES):
            seconds = float(np.mean([t.get(phase, 0.0) for t in timed])) if timed else 0.0
            axes[1, 2].barh(name, seconds, left=left, color=plt.get_cmap("Set2")(j),  # not a run colour
                            label=phase if i == 0 else None)
            left += seconds
    for ax, key, title in curves:
        ax.set_title(f"{title} (faint: per step)")
        if not any(np.isfinite(_series(run["metrics"], key)).any() for run in runs):  # e.g. --data: no step checker
            ax.text(0.5, 0.5, f"not logged by {'this run' if len(runs) == 1 else 'these runs'}",
                    ha="center", va="center", transform=ax.transAxes, color="grey")
    axes[0, 1].set_title("held-out accuracy")
    axes[1, 2].set_title("mean seconds per step, by phase")
    axes[1, 2].set_xlabel("seconds")
    for ax in axes.flat:
        if ax is not axes[1, 2]:
            ax.set_xlabel("step")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    out = save_figure(fig, out, dpi=100)
    plt.close(fig)
    return out


def write_summary(run_dir: Path, args, start: dict, end: dict, timing: dict, eval_problems: int) -> None:
    """summary.json, curves.png and episodes.png, and the run's closing lines on the terminal."""
    metrics = read_run(run_dir)["metrics"]
    summary = {"start_accuracy": start["greedy"], "end_accuracy": end["greedy"],
               "start_sampled_accuracy": start["sampled"], "end_sampled_accuracy": end["sampled"],
               "steps": args.steps, "eval_problems": eval_problems, "wall_seconds": timing["wall_seconds"],
               "step_seconds": timing["step_seconds"], "eval_seconds": timing["eval_seconds"], "machine": machine(),
               "final_reward_10": float(np.mean([m["reward"] for m in metrics[-10:]])),
               "final_prm_accuracy_10": nanmean([m["prm_accuracy"] for m in metrics[-10:]]),
               "final_prm_localization_10": nanmean([m.get("prm_localization") for m in metrics[-10:]])}
    write_json(run_dir / "summary.json", summary)
    plot_runs([run_dir], run_dir / "curves.png")
    # the episode picture: which tokens the process signal blamed (none to draw with --episodes-per-step 0,
    # or when no step kept a group)
    if not args.data and (run_dir / "episodes.jsonl").exists():
        plot_episodes(run_dir)
    split = ", ".join(f"{k} {v:.2f}s" for k, v in summary["step_seconds"].items())
    print(f"\nheld-out accuracy ({eval_problems} problems): greedy {start['greedy']:.3f} -> {end['greedy']:.3f}; "
          f"sampled ({args.eval_samples} per problem) {start['sampled']:.3f} -> {end['sampled']:.3f}")
    print(f"training reward (last 10 steps): {summary['final_reward_10']:.3f}; "
          f"PRM pairwise accuracy (last 10): {fmt(summary['final_prm_accuracy_10'])}; "
          f"localisation (last 10): {fmt(summary['final_prm_localization_10'])}")
    print(f"time per step: {split}; wall {timing['wall_seconds']:.0f}s")
    state = Path(run_dir) / "checkpoint" / "state.pt"  # models and optimizers (with --lora-rank: adapters only)
    saved = f", checkpoint/ ({state.stat().st_size / 1e6:.1f} MB of models and optimizers)" if state.exists() else ""
    print(f"run folder: {run_dir} (metrics.jsonl, episodes.jsonl, curves.png, final/, summary.json{saved})", flush=True)
