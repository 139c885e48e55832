"""The credit-assignment study: when do dense rewards pay off, and how much of it does the implicit
PRM capture? Along a dial of task settings (chain length, slip rate), outcome-only RLOO vs the exact
step checker (a perfect process signal) vs the implicit PRM, under several advantage constructions.

    python studies/credit_study.py                                                # every setting's arms, 5 seeds, 70 steps
    python studies/credit_study.py --settings sparse --arms outcome-nf step-nf    # a part of it
    python studies/credit_study.py --settings sparser --arms outcome-nf step-nf-gamma --tag gamma   # its own plot
    python studies/credit_study.py --report-only                                  # tables and plots from finished runs
    python studies/credit_study.py --gradients runs/e1/prime-s1                   # policy-gradient statistics per construction
    python studies/credit_study.py --paired-from-json                             # paired verdicts of the recorded runs
    python studies/credit_study.py --plots-from-json                              # the study's figures from credit.json

Research code beside the papers' comparisons (reproduce.py, whose runner it uses): each arm is a
plain `python train.py` run in runs/repro/credit-<setting>-<arm>-s<seed>/. The per-seed numbers go
to credit.json in --figures: an arm whose outcome-only baseline or checker has no runs in --out (runs
made on another machine) is compared with the numbers recorded for them. docs/REPRODUCTION.md has the
results and what they do and do not show.
"""

import dataclasses
import json
import math
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (after choosing the backend)
from safetensors.torch import load_file  # noqa: E402

from runner import (ARMS, LABELS, REPO, build_sft, load_finished, merge_json, parse_study_args, run_all,  # noqa: E402
                    same_parser, save_figure, series, steps_to_reach, train_config)  # (first: it puts the repository on the path)
import ddp  # noqa: E402
import microbatch  # noqa: E402
import models as run_models  # noqa: E402
import runlog  # noqa: E402
import step_prm  # noqa: E402
import toy_task  # noqa: E402
import torch  # noqa: E402
import train  # noqa: E402
from rollout import HFRollout  # noqa: E402
from runlog import moving_average, nanmean  # noqa: E402
from stats import (CLAIM_SEEDS, CLAIM_T, CLAIM_T_STRONG, NULL_RATE, collapsed, fmt, paired, paired_cells,  # noqa: E402
                   paired_text)


# The dial: chain length and the SFT demonstrator's slip rate. Longer chains and more slips make a
# correct answer rarer (sparser outcomes: fewer prompt groups with both right and wrong responses).
# Each setting has its own SFT checkpoint: the recipe's (toy_task.run_sft), trained on first use where it
# is not shipped. The runs docs/REPRODUCTION.md records used the earlier starts, trained to convergence.
# The sparse settings' first runs were made before --loss-mean global became the default, with the
# official mean of micro-batch means; their later runs keep that loss, so that all arms compare.
MICRO = ["--loss-mean", "micro"]
SETTINGS = {
    "short": ["--toy-ops", "2-4"],                         # slip 0.15: most groups mixed or all right
    "default": [],                                          # 3-6 operations, slip 0.15: the README's run
    "sparse": ["--toy-ops", "6-8", "--toy-slip", "0.25", *MICRO],   # the first trials' sparse setting
    # With the SFT trained to convergence, 6-8 operations at slip 0.25 still start at ~0.11 sampled
    # accuracy with ~17 of 32 groups mixed: not sparse. Longer chains, more slips, more tokens:
    "sparser": ["--toy-ops", "8-10", "--toy-slip", "0.3", "--max-response-len", "128", *MICRO],
}
NO_FILTER = ["--filter-low", "0", "--filter-high", "1"]  # all-wrong groups stay: they can carry a process signal
MIXED = [*NO_FILTER, "--prm-groups", "mixed"]  # ...but the implicit PRM learns from the mixed groups only
E1 = ["--rloo-form", "paper", "--process-gamma", "0.5"]  # issue 29's local credit: Eq. 5, the outcome undiscounted
E5 = [*MIXED, "--process-groups", "mixed", *E1]  # E1, with process rewards in the mixed groups only
# Each arm: flags, the outcome-only arm its gain is measured against (same filter, same lr), and the
# exact-checker arm whose gain it is compared with (same advantage construction where one was run).
CREDIT_ARMS = {
    "outcome": dict(flags=["--process", "none"], baseline="outcome", checker="step"),
    "step": dict(flags=["--process", "step"], baseline="outcome", checker="step"),
    "implicit": dict(flags=[], baseline="outcome", checker="step"),
    "outcome-nf": dict(flags=["--process", "none", *NO_FILTER], baseline="outcome-nf", checker="step-nf"),
    "step-nf": dict(flags=["--process", "step", *NO_FILTER], baseline="outcome-nf", checker="step-nf"),
    "implicit-nf": dict(flags=NO_FILTER, baseline="outcome-nf", checker="step-nf"),
    "implicit-nf-mixed": dict(flags=MIXED, baseline="outcome-nf", checker="step-nf"),
    "implicit-nf-mixed-warm": dict(flags=[*MIXED, "--prm-warmup-steps", "20"], baseline="outcome-nf",
                                   checker="step-nf"),
    "implicit-nf-mixed-prmlr": dict(flags=[*MIXED, "--prm-lr", "1e-3"], baseline="outcome-nf", checker="step-nf"),
    "implicit-nf-mixed-k8": dict(flags=[*MIXED, "--n-samples", "8", "--prompts-per-step", "16"],
                                 baseline="outcome-nf", checker="step-nf"),
    # The batch normaliser (the largest |return-to-go| in the batch) is set by the one most extreme
    # response; in the sparse settings it is ~15x a typical response's own, which squashes the
    # implicit rewards. --process-norm beta feeds the raw beta x log-ratio instead (paper Eq. 3).
    "implicit-nf-mixed-raw": dict(flags=[*MIXED, "--process-norm", "beta"], baseline="outcome-nf", checker="step-nf"),
    "step-nf-gamma": dict(flags=["--process", "step", *NO_FILTER, "--gamma", "0.9"], baseline="outcome-nf",
                          checker="step-nf"),
    "step-nf-grpo": dict(flags=["--process", "step", "--estimator", "grpo", *NO_FILTER], baseline="outcome-nf",
                         checker="step-nf"),
    "step-nf-pass": dict(flags=["--process", "step", "--estimator", "pass", "--kl-coef", "0", *NO_FILTER],  # as recorded
                         baseline="outcome-nf",
                         checker="step-nf"),
    # The control for gamma 0.9: outcome-only with it (the outcome's return then fades from the last
    # token back, 0.9^k for k tokens before it: the discount alone, with no process signal)
    "outcome-nf-gamma": dict(flags=["--process", "none", *NO_FILTER, "--gamma", "0.9"], baseline="outcome-nf",
                             checker="step-nf-gamma"),
    # The implicit PRM under the construction that helped the checker most (gamma 0.9, sparser setting)
    "implicit-nf-mixed-gamma": dict(flags=[*MIXED, "--gamma", "0.9"], baseline="outcome-nf", checker="step-nf-gamma"),
    # Issue 29's E1, local credit: Eq. 5's form with the process return discounted (gamma_p < 1) and
    # the outcome not (gamma_o = 1). At gamma_p = 1 the implicit reward telescopes into a learned copy
    # of the outcome minus a prefix value (a baseline); discounted, a slip's penalty stays near the
    # slip. Outcome-only RLOO is the same run in either form (no process return to discount).
    "implicit-e1": dict(flags=["--rloo-form", "paper", "--process-gamma", "0.5"], baseline="outcome",
                        checker="step-e1"),
    "implicit-e1-0.9": dict(flags=["--rloo-form", "paper", "--process-gamma", "0.9"], baseline="outcome",
                            checker="step-e1-0.9"),
    "step-e1": dict(flags=["--process", "step", "--rloo-form", "paper", "--process-gamma", "0.5"],
                    baseline="outcome", checker="step-e1"),
    "step-e1-0.9": dict(flags=["--process", "step", "--rloo-form", "paper", "--process-gamma", "0.9"],
                        baseline="outcome", checker="step-e1-0.9"),
    # ... and E1 where the checker gains most (sparser, no filter): all three under Eq. 5's form,
    # process gamma 0.5, the outcome undiscounted, against outcome-only without the filter.
    "step-nf-e1": dict(flags=["--process", "step", *NO_FILTER, *E1], baseline="outcome-nf", checker="step-nf-e1"),
    "step-nf-e1-0.9": dict(flags=["--process", "step", *NO_FILTER, "--rloo-form", "paper", "--process-gamma", "0.9"],
                           baseline="outcome-nf", checker="step-nf-e1-0.9"),
    "implicit-nf-mixed-e1": dict(flags=[*MIXED, *E1], baseline="outcome-nf", checker="step-nf-e1"),
    # E3, the most an outcome-trained PRM could tell: the checker marking only the first wrong line
    # (every wrong response then sums to the same score, as under an outcome-trained PRM's q_T)
    "step-first": dict(flags=["--process", "step", "--step-scorer", "toy-first"], baseline="outcome",
                       checker="step"),
    "step-first-e1": dict(flags=["--process", "step", "--step-scorer", "toy-first", *E1], baseline="outcome",
                          checker="step-e1"),
    "step-first-nf-e1": dict(flags=["--process", "step", "--step-scorer", "toy-first", *NO_FILTER, *E1],
                             baseline="outcome-nf", checker="step-nf-e1"),
    "step-first-nf": dict(flags=["--process", "step", "--step-scorer", "toy-first", *NO_FILTER],
                          baseline="outcome-nf", checker="step-nf"),
    # E4: the checker with noise of sd 1.4 on its 0/1 scores: a slip then stands out by 1/1.4 = 0.7
    # noise widths, the implicit PRM's separation under E1 in `sparser` (its blame table)
    "step-noise-nf-e1": dict(flags=["--process", "step", "--step-noise", "1.4", *NO_FILTER, *E1],
                             baseline="outcome-nf", checker="step-nf-e1"),
    # E5: process rewards reach the mixed groups only, every group kept (where does the harm enter?)
    "implicit-nf-mixed-only": dict(flags=[*MIXED, "--process-groups", "mixed"], baseline="outcome-nf",
                                   checker="step-nf"),
    # ... and E5 under E1's construction, where E1's implicit PRM lost (sparser): is the harm its rewards
    # in the all-wrong groups, which it never learns from?
    "implicit-nf-mixed-only-e1": dict(flags=E5, baseline="outcome-nf", checker="step-nf-e1"),
    # E2, scale: E1's construction with the raw beta x log-ratio rewards, not divided by the batch's
    # largest |return-to-go| (57 against a response's own 3.1 at the end of sparser's E1 runs)
    "implicit-nf-mixed-raw-e1": dict(flags=[*MIXED, "--process-norm", "beta", *E1], baseline="outcome-nf",
                                     checker="step-nf-e1"),
    # E1 with a longer process horizon: process gamma 0.9 (a slip's penalty reaches ~10 tokens back)
    "implicit-nf-mixed-e1-0.9": dict(flags=[*MIXED, "--rloo-form", "paper", "--process-gamma", "0.9"],
                                     baseline="outcome-nf", checker="step-nf-e1-0.9"),
    # E6, samples per prompt, at the same 128 responses a step: K = 2 (64 prompts), 8 (16) and 16 (8),
    # each with its own outcome-only baseline (a smaller K gives RLOO's baseline one or a few peers);
    # no checker ran at these K, so no share of its gain (the checker named is the arm itself)
    "outcome-nf-k2": dict(flags=["--process", "none", *NO_FILTER, "--n-samples", "2", "--prompts-per-step", "64"],
                          baseline="outcome-nf-k2", checker="outcome-nf-k2"),
    "implicit-nf-mixed-e1-k2": dict(flags=[*MIXED, *E1, "--n-samples", "2", "--prompts-per-step", "64"],
                                    baseline="outcome-nf-k2", checker="implicit-nf-mixed-e1-k2"),
    "outcome-nf-k8": dict(flags=["--process", "none", *NO_FILTER, "--n-samples", "8", "--prompts-per-step", "16"],
                          baseline="outcome-nf-k8", checker="outcome-nf-k8"),
    "implicit-nf-mixed-e1-k8": dict(flags=[*MIXED, *E1, "--n-samples", "8", "--prompts-per-step", "16"],
                                    baseline="outcome-nf-k8", checker="implicit-nf-mixed-e1-k8"),
    "outcome-nf-k16": dict(flags=["--process", "none", *NO_FILTER, "--n-samples", "16", "--prompts-per-step", "8"],
                           baseline="outcome-nf-k16", checker="outcome-nf-k16"),
    "implicit-nf-mixed-e1-k16": dict(flags=[*MIXED, *E1, "--n-samples", "16", "--prompts-per-step", "8"],
                                     baseline="outcome-nf-k16", checker="implicit-nf-mixed-e1-k16"),
    # E5 at two more policy lrs, each against outcome-only at its own lr (the checker ran at 1e-4 only,
    # below; an arm at 3e-5 names itself as its checker, so no share of a checker's gain)
    "outcome-nf-lr3e-5": dict(flags=["--process", "none", *NO_FILTER, "--policy-lr", "3e-5"],
                              baseline="outcome-nf-lr3e-5", checker="outcome-nf-lr3e-5"),
    "implicit-nf-mixed-only-e1-lr3e-5": dict(flags=[*E5, "--policy-lr", "3e-5"], baseline="outcome-nf-lr3e-5",
                                             checker="implicit-nf-mixed-only-e1-lr3e-5"),
    "implicit-nf-mixed-only-e1-lr1e-4": dict(flags=[*E5, "--policy-lr", "1e-4"], baseline="outcome-nf-lr1e-4",
                                             checker="step-nf-e1-lr1e-4"),
    # ... PRIME-E1 with its rewards in every group at those lrs (do E5's mixed-only rewards still save
    # points there?), and at lr 1e-4, where outcome-only gains 26 points, the checker and E7 under E1
    "implicit-nf-mixed-e1-lr3e-5": dict(flags=[*MIXED, *E1, "--policy-lr", "3e-5"], baseline="outcome-nf-lr3e-5",
                                        checker="implicit-nf-mixed-e1-lr3e-5"),
    "implicit-nf-mixed-e1-lr1e-4": dict(flags=[*MIXED, *E1, "--policy-lr", "1e-4"], baseline="outcome-nf-lr1e-4",
                                        checker="step-nf-e1-lr1e-4"),
    "step-nf-e1-lr1e-4": dict(flags=["--process", "step", *NO_FILTER, *E1, "--policy-lr", "1e-4"],
                              baseline="outcome-nf-lr1e-4", checker="step-nf-e1-lr1e-4"),
    "implicit-nf-mixed-e1-teacher-lr1e-4": dict(flags=[*MIXED, *E1, "--prm-init", "teacher", "--policy-lr", "1e-4"],
                                                baseline="outcome-nf-lr1e-4", checker="step-nf-e1-lr1e-4"),
    # E7 under E1 in sparser: the PRM starts from the setting's clean demonstrator (slip 0, the teacher's
    # recipe), the reference and the policy from the SFT: a prover other than the policy (Setlur et al.)
    "implicit-nf-mixed-e1-teacher": dict(flags=[*MIXED, *E1, "--prm-init", "teacher"], baseline="outcome-nf",
                                         checker="step-nf-e1"),
    # ... and its control: the same start, never trained on outcomes (--no-prm-online): the reward is
    # beta log(pi_teacher / pi_SFT) throughout, what the clean demonstrator alone tells
    "implicit-nf-e1-teacher-frozen": dict(flags=[*NO_FILTER, *E1, "--prm-init", "teacher", "--no-prm-online"],
                                          baseline="outcome-nf", checker="step-nf-e1"),
    # Issue 45's causal test: PRIME, local's PRM learns for 20 steps, then holds still. Up to step 20 the
    # run IS PRIME, local's (same seed, same flags), so its frozen PRM is the one --slip-rewards scores with.
    "implicit-nf-mixed-e1-freeze20": dict(flags=[*MIXED, *E1, "--prm-freeze-step", "20"], baseline="outcome-nf",
                                          checker="step-nf-e1"),
    # E7: the PRM starts from the clean demonstrator (a prover other than the policy); reference: the SFT
    "implicit-teacher": dict(flags=["--prm-init", "teacher"], baseline="outcome", checker="step"),
    "outcome-nf-lr1e-4": dict(flags=["--process", "none", *NO_FILTER, "--policy-lr", "1e-4"],
                              baseline="outcome-nf-lr1e-4", checker="step-nf-lr1e-4"),
    "step-nf-lr1e-4": dict(flags=["--process", "step", *NO_FILTER, "--policy-lr", "1e-4"],
                           baseline="outcome-nf-lr1e-4", checker="step-nf-lr1e-4"),
    "implicit-nf-mixed-lr1e-4": dict(flags=[*MIXED, "--policy-lr", "1e-4"], baseline="outcome-nf-lr1e-4",
                                     checker="step-nf-lr1e-4"),
    # The first trials' greedy collapse: outcome-only with PRIME's filter (few groups kept) at lr 1e-4;
    # and the three signals with the filter at that lr.
    "outcome-lr1e-4": dict(flags=["--process", "none", "--policy-lr", "1e-4"], baseline="outcome-lr1e-4",
                           checker="step-lr1e-4"),
    "step-lr1e-4": dict(flags=["--process", "step", "--policy-lr", "1e-4"], baseline="outcome-lr1e-4",
                        checker="step-lr1e-4"),
    "implicit-lr1e-4": dict(flags=["--policy-lr", "1e-4"], baseline="outcome-lr1e-4", checker="step-lr1e-4"),
    # A tiny batch (8 prompts: 2-4 groups kept by the filter), the first trials' collapse regime, at both lrs.
    "outcome-tiny": dict(flags=["--process", "none", "--prompts-per-step", "8"], baseline="outcome-tiny",
                         checker="step"),
    "outcome-tiny-lr1e-4": dict(flags=["--process", "none", "--prompts-per-step", "8", "--policy-lr", "1e-4"],
                                baseline="outcome-tiny", checker="step"),
}
CREDIT_LABELS = {
    "outcome": "outcome-only", "step": "exact step checker", "implicit": "PRIME",
    "outcome-nf": "outcome-only, no filter", "step-nf": "exact step checker, no filter",
    "implicit-nf": "PRIME, no filter", "implicit-nf-mixed": "PRIME, no filter, PRM on mixed groups",
    "implicit-nf-mixed-warm": "... + PRM warmed up offline (20 batches)",
    "implicit-nf-mixed-prmlr": "... + PRM lr 1e-3", "implicit-nf-mixed-k8": "... + 8 samples x 16 prompts",
    "implicit-nf-mixed-raw": "... + raw rewards (--process-norm beta)",
    "step-nf-gamma": "exact step checker, no filter, gamma 0.9", "step-nf-grpo": "GRPO + exact step checker, no filter",
    "step-nf-pass": "PASS + exact step checker, no filter",
    "implicit-nf-mixed-gamma": "PRIME, no filter, PRM on mixed, gamma 0.9",
    "outcome-nf-gamma": "outcome-only, no filter, gamma 0.9",
    "outcome-nf-lr1e-4": "outcome-only, no filter, lr 1e-4", "step-nf-lr1e-4": "exact step checker, no filter, lr 1e-4",
    "implicit-nf-mixed-lr1e-4": "PRIME, no filter, PRM on mixed, lr 1e-4",
    "outcome-lr1e-4": "outcome-only, lr 1e-4", "step-lr1e-4": "exact step checker, lr 1e-4",
    "implicit-lr1e-4": "PRIME, lr 1e-4", "outcome-tiny": "outcome-only, 8 prompts a step",
    "outcome-tiny-lr1e-4": "outcome-only, 8 prompts a step, lr 1e-4",
    "implicit-e1": "PRIME, local, filtered",
    "implicit-e1-0.9": "PRIME, local 0.9, filtered",
    "step-e1": "checker, local, filtered",
    "step-e1-0.9": "checker, local 0.9, filtered",
    "step-nf-e1": "checker, local",
    "implicit-nf-mixed-e1": "PRIME, local",
    "step-first": "first-slip checker, gamma 1", "step-first-e1": "... the same, Eq. 5 form, gamma 0.5",
    "step-first-nf-e1": "first-slip checker, local",
    "step-first-nf": "first-slip checker, gamma 1",
    "step-nf-e1-0.9": "checker, local 0.9",
    "step-noise-nf-e1": "noisy checker, local",
    "implicit-nf-mixed-only": "PRIME, mixed groups only",
    "implicit-teacher": "PRIME, PRM started from the clean demonstrator",
    "implicit-nf-mixed-only-e1": "PRIME, local, mixed groups only",
    "implicit-nf-mixed-raw-e1": "PRIME, local, raw rewards",
    "implicit-nf-mixed-e1-0.9": "PRIME, local 0.9",
    "outcome-nf-k2": "outcome-only, no filter, K = 2",
    "implicit-nf-mixed-e1-k2": "PRIME, local, K = 2",
    "outcome-nf-k8": "outcome-only, no filter, K = 8",
    "implicit-nf-mixed-e1-k8": "PRIME, local, K = 8",
    "outcome-nf-k16": "outcome-only, no filter, K = 16",
    "implicit-nf-mixed-e1-k16": "PRIME, local, K = 16",
    "outcome-nf-lr3e-5": "outcome-only, no filter, lr 3e-5",
    "implicit-nf-mixed-only-e1-lr3e-5": "PRIME, local, mixed groups only, lr 3e-5",
    "implicit-nf-mixed-only-e1-lr1e-4": "PRIME, local, mixed groups only, lr 1e-4",
    "implicit-nf-mixed-e1-lr3e-5": "PRIME, local, lr 3e-5",
    "implicit-nf-mixed-e1-lr1e-4": "PRIME, local, lr 1e-4",
    "step-nf-e1-lr1e-4": "checker, local, lr 1e-4",
    "implicit-nf-mixed-e1-teacher-lr1e-4": "teacher-started PRM, local, lr 1e-4",
    "implicit-nf-mixed-e1-teacher": "teacher-started PRM, local",
    "implicit-nf-e1-teacher-frozen": "frozen teacher PRM, local",
    "implicit-nf-mixed-e1-freeze20": "PRIME, local, PRM frozen at step 20",
}
# What `python studies/credit_study.py` runs in each setting (5 seeds each); the rest of CREDIT_ARMS are
# there to be run with --arms. The dense settings get the three process sources with PRIME's filter;
# the sparse one, where the first trials found a lead, gets every construction.
CREDIT = {
    "short": ["outcome", "step", "implicit"],
    "default": ["outcome", "step", "implicit", "outcome-lr1e-4", "implicit-lr1e-4"],
    "sparse": list(CREDIT_ARMS),
    "sparser": ["outcome-nf", "step-nf", "implicit-nf-mixed", "implicit-nf-mixed-warm", "implicit-nf-mixed-prmlr",
                "implicit-nf-mixed-k8", "implicit-nf-mixed-raw", "outcome", "step", "implicit", "implicit-nf",
                "outcome-nf-lr1e-4", "step-nf-lr1e-4", "implicit-nf-mixed-lr1e-4", "outcome-lr1e-4", "step-lr1e-4",
                "implicit-lr1e-4", "outcome-tiny", "outcome-tiny-lr1e-4", "step-nf-gamma", "step-nf-grpo", "step-nf-pass",
                "outcome-nf-gamma", "implicit-nf-mixed-gamma"],
}


def credit_runs(settings: list[str], arms: list[str] | None) -> list[tuple[str, str, list[str]]]:
    """(setting, arm, train.py flags) of every run of the study, in priority order within a seed."""
    return [(s, a, [*SETTINGS[s], *CREDIT_ARMS[a]["flags"]]) for s in settings for a in (arms or CREDIT[s])]


def credit_run_name(setting: str, arm: str) -> str:
    """A run's folder name; a study run with the same flags as a comparison's arm IS that run (the
    default setting's outcome-only and PRIME runs are prime-vs-rloo's), so it is not run twice."""
    flags = [*SETTINGS[setting], *CREDIT_ARMS[arm]["flags"]]
    return next((name for name, f in ARMS.items() if f == flags), f"credit-{setting}-{arm}")


def gap_closed(outcome: float, checker: float, arm: float) -> float | None:
    """The share of the exact checker's gain over outcome-only that `arm` captures: (arm - outcome) /
    (checker - outcome). None when the checker does not gain (there is no gap to close)."""
    gain = checker - outcome
    return (arm - outcome) / gain if gain > 0 else None


def same_seeds(stats: dict, seeds: list[int], key: str = "end_sampled") -> list[float]:
    """An arm's per-seed `key` (default: end-of-run held-out sampled accuracy) for these seeds, or all
    of them when it has none of these seeds: an arm run with fewer seeds is compared seed for seed."""
    picked = [v for s, v in zip(stats["seeds"], stats[key]) if s in seeds]
    return picked or stats[key]


def per_seed(stats: dict, key: str = "end_sampled") -> dict[int, float]:
    return dict(zip(stats["seeds"], stats[key]))


def credit_report(setting: str, arms: list[str], runs: dict, window: int,
                  recorded: dict | None = None) -> tuple[str, dict]:
    """The Markdown table of one dial setting and its numbers (mean [min, max] over seeds). An arm's
    baseline or checker whose runs are not in `runs` is read from `recorded`, the numbers an earlier
    report kept (credit.json), so that new arms compare with runs made on another machine."""
    stats = {}
    for arm in arms:
        rs = runs[arm]
        stats[arm] = {"seeds": [r["config"]["seed"] for r in rs],
                      "start_sampled": [r["summary"]["start_sampled_accuracy"] for r in rs],
                      "end_sampled": [r["summary"]["end_sampled_accuracy"] for r in rs],
                      "end_greedy": [r["summary"]["end_accuracy"] for r in rs],
                      "start_greedy": [r["summary"]["start_accuracy"] for r in rs],
                      "reward_last": [float(np.mean(c[-window:])) for c in series(rs, "reward")],
                      "mixed_groups": [float(np.nanmean(c)) for c in series(rs, "mixed_groups")],
                      "prm_accuracy_last": [nanmean(c[-window:]) for c in series(rs, "prm_accuracy")],
                      "localization_last": [nanmean(c[-window:]) for c in series(rs, "prm_localization")],
                      "kept_groups": [float(np.nanmean(c)) for c in series(rs, "kept_groups")],
                      "weight_change": [run_weight_change(r) for r in rs]}
    lines = [f"| arm | seeds | held-out sampled, start -> end | greedy, start -> end | training reward, last {window} | "
             f"mixed / kept groups a step | PRM acc. / localisation, last {window} | steps to reach the baseline's final "
             "reward | gain over outcome-only, paired by seed | share of the checker's gain | RMS weight change (x 1e-3) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    recorded = recorded or {}
    for arm in arms:
        st, spec = stats[arm], CREDIT_ARMS[arm]
        base = stats.get(spec["baseline"], recorded.get(spec["baseline"]))
        check = stats.get(spec["checker"], recorded.get(spec["checker"]))
        gain = share = reach = "n/a"
        if base is not None and arm != spec["baseline"]:
            # against the baseline's runs of the same seeds (same RL prompts and start) where it has them
            b_end = same_seeds(base, st["seeds"])
            gain = paired_text(paired(per_seed(st), per_seed(base)))
            # the baseline's final moving-average reward (reward_last is that average), same seeds
            level = float(np.mean(same_seeds(base, st["seeds"], "reward_last")))
            reach = ", ".join(str(x) if x else "never" for x in steps_to_reach(runs[arm], level, window))
            if check is not None and arm != spec["checker"]:
                # a share of the checker's gain only where that gain is measured: over all the
                # checker's and the baseline's seeds, every checker seed above every baseline seed
                c_end = same_seeds(check, st["seeds"])
                closed = gap_closed(np.mean(b_end), np.mean(c_end), np.mean(st["end_sampled"]))
                checked = paired(per_seed(check), per_seed(base))
                measured = checked["t"] >= CLAIM_T and checked["up"] == len(checked["seeds"])
                share = "no measured gap" if closed is None or not measured else f"{closed:.2f}"
        lines.append(f"| {CREDIT_LABELS[arm]} | {len(st['seeds'])} | {np.mean(st['start_sampled']):.3f} -> "
                     f"{fmt(st['end_sampled'])} | {np.mean(st['start_greedy']):.2f} -> {fmt(st['end_greedy'], 2)} | "
                     f"{fmt(st['reward_last'])} | {np.mean(st['mixed_groups']):.1f} / {np.mean(st['kept_groups']):.1f} | "
                     f"{fmt(st['prm_accuracy_last'], 2)} / {fmt(st['localization_last'], 2)} | {reach} | {gain} | {share} | "
                     f"{fmt([1e3 * w for w in st['weight_change']], 2)} |")
    return "\n".join(lines), stats


def slipped_lines(response: str) -> list[bool]:
    """Per line of a toy-task response: a slip, i.e. a line `a op b = c` whose c is not a op b (the
    demonstrator's kind of error); any other line (the box, text that does not parse) is not."""
    out = []
    for line in response.split("\n"):
        m = toy_task.STEP.fullmatch(line.strip())
        out.append(bool(m) and int(m[4]) != toy_task.apply(m[2], int(m[1]), int(m[3])))
    return out


def blame_stats(episodes: list[dict], after_step: int) -> dict:
    """Where a PRM's process reward blames the wrong responses that episodes.jsonl keeps after
    `after_step`: the line (step_ids) with the most negative summed reward, against the slipped lines.
    Returns the counts and shares: `first` (that line is the first slip, what prm_localization
    counts), `any` (it is one of the slips), slips per response, and `normaliser`: the median over
    responses of raw / received reward on their tokens with |raw| > 0.3, which under
    --process-norm batch is the batch's largest |return-to-go|, set against `own`, the median of a
    response's own largest |return-to-go| of the raw reward. And the raw reward summed per line
    (r_phi before any normalisation): `slip_reward` (mean over slipped lines), `clean_reward` and
    `clean_sd` (the other lines but the last, the box), and `separation` = (clean - slip) / clean_sd,
    how many noise widths a slip stands out by."""
    n = first = anywhere = slips = 0
    ratios, own, slip_lines, clean_lines = [], [], [], []
    for e in episodes:
        if e["step"] <= after_step or e["outcome"] >= 1:
            continue
        bad = slipped_lines(e["response"])
        if not any(bad) or max(e["step_ids"]) + 1 != len(bad):
            continue
        sums, raw_sums = [0.0] * len(bad), [0.0] * len(bad)
        for k, r, raw_r in zip(e["step_ids"], e["process_reward"], e["reward"]):
            sums[k] += r
            raw_sums[k] += raw_r
        for k in range(len(bad) - 1):
            (slip_lines if bad[k] else clean_lines).append(raw_sums[k])
        worst = min(range(len(bad)), key=lambda k: sums[k])
        n, slips = n + 1, slips + sum(bad)
        first += worst == bad.index(True)
        anywhere += bad[worst]
        raw, got = np.array(e["reward"], dtype=float), np.array(e["process_reward"], dtype=float)
        big = (np.abs(raw) > 0.3) & (got != 0)
        if big.any():
            ratios.append(float(np.median(raw[big] / got[big])))
        own.append(float(np.abs(np.cumsum(raw[::-1])).max()))
    share = (lambda k: k / n) if n else (lambda k: float("nan"))
    mean = (lambda x: float(np.mean(x)) if x else float("nan"))
    clean_sd = float(np.std(clean_lines)) if len(clean_lines) > 1 else float("nan")
    separation = (mean(clean_lines) - mean(slip_lines)) / clean_sd if clean_sd > 0 else float("nan")
    return {"responses": n, "slips_per_response": share(slips), "first": share(first), "any": share(anywhere),
            "normaliser": float(np.median(ratios)) if ratios else float("nan"),
            "own": float(np.median(own)) if own else float("nan"), "slip_reward": mean(slip_lines),
            "clean_reward": mean(clean_lines), "clean_sd": clean_sd, "separation": separation}


def blame_report(arms: list[str], runs: dict, after_step: int = 60, kept: dict | None = None) -> str:
    """The Markdown table of blame_stats for the seeds' kept wrong responses, per arm with a PRM; each
    arm's blame_stats also go into `kept` (credit.json keeps them beside the accuracies)."""
    lines = [f"| arm | wrong responses read (steps > {after_step}) | slips per response | most negative line: the first "
             "slip / any slip | batch normaliser / a response's own largest return-to-go | raw reward of a line: "
             "slipped / clean (sd) | separation (clean - slip) / sd |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for arm in arms:
        config = runs[arm][0]["config"]
        if config.get("process") == "none":  # no process reward to read: skip before any file is read
            continue
        episodes = [json.loads(l) for r in runs[arm] if (Path(r["dir"]) / "episodes.jsonl").exists()
                    for l in (Path(r["dir"]) / "episodes.jsonl").read_text().splitlines() if l.strip()]
        if not episodes:
            continue
        b = blame_stats(episodes, after_step)
        if kept is not None:
            kept[arm] = {**b, "after_step": after_step}
        implicit = config.get("process") == "implicit"
        norm = f"{b['normaliser']:.1f} / {b['own']:.1f}" if implicit and config.get("process_norm") == "batch" else "n/a"
        raw = (f"{b['slip_reward']:+.2f} / {b['clean_reward']:+.2f} ({b['clean_sd']:.2f}) | {b['separation']:.1f}"
               if implicit else "n/a | n/a")
        lines.append(f"| {CREDIT_LABELS[arm]} | {b['responses']} | {b['slips_per_response']:.2f} | "
                     f"{b['first']:.2f} / {b['any']:.2f} | {norm} | {raw} |")
    return "\n".join(lines)


def credit_plot(setting: str, arms: list[str], runs: dict, figures: Path, window: int, tag: str = "") -> Path:
    """Training reward and held-out sampled accuracy of every arm of one setting (band: min..max over seeds)."""
    fig, axes = plt.subplots(1, 2, figsize=(17, 4.8), width_ratios=[1.2, 1], layout="constrained")
    for i, arm in enumerate(arms):
        style = dict(color=f"C{i % 10}", ls="-" if i < 10 else "--", label=CREDIT_LABELS[arm])
        x = moving_average(series(runs[arm], "reward"), window)
        steps = np.arange(1, x.shape[1] + 1)
        axes[0].plot(steps, np.nanmean(x, 0), **style)
        axes[0].fill_between(steps, np.nanmin(x, 0), np.nanmax(x, 0), color=style["color"], alpha=0.12)
        ends = [r["summary"]["end_sampled_accuracy"] for r in runs[arm]]
        start = np.mean([r["summary"]["start_sampled_accuracy"] for r in runs[arm]])
        axes[1].errorbar([i], [np.mean(ends)], yerr=[[np.mean(ends) - min(ends)], [max(ends) - np.mean(ends)]],
                         fmt="o", color=style["color"], capsize=4)
        axes[1].scatter([i], [start], marker="_", s=200, color="grey")
    axes[0].set_title(f"{setting}: training reward ({window}-step moving average; band = min..max over seeds)",
                      fontsize=9)
    axes[0].set_xlabel("RL step")
    # many arms: the legend goes beside the curves, not over them
    axes[0].legend(fontsize=6 if len(arms) > 8 else 7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes[1].set_xticks(range(len(arms)), [CREDIT_LABELS[a] for a in arms], rotation=35, ha="right", fontsize=7)
    axes[1].set_title(f"{setting}: held-out sampled accuracy at the end (dot: mean, bar: min..max over seeds; "
                      "grey: start)", fontsize=9)
    return save_figure(fig, figures, f"credit-{setting}-{tag}" if tag else f"credit-{setting}")


# The study's figures in docs/REPRODUCTION.md, drawn from credit.json alone (what every run ended at,
# per seed), so that a figure is redrawn without its runs: (setting, arms) per figure name.
ENDS_FIGURES = {
    "default": ("default", ["outcome", "implicit", "implicit-e1", "step-e1", "implicit-e1-0.9", "step-e1-0.9",
                            "step-first"]),
    "sparser": ("sparser", ["outcome-nf", "step-nf-e1", "step-nf-e1-0.9", "step-first-nf-e1", "step-first-nf",
                            "step-noise-nf-e1", "implicit-nf-mixed-e1", "implicit-nf-mixed-e1-0.9",
                            "implicit-nf-mixed-only-e1", "implicit-nf-mixed-only", "implicit-nf-mixed-raw-e1"]),
    "sparser-lr": ("sparser", ["outcome-nf-lr3e-5", "implicit-nf-mixed-e1-lr3e-5", "implicit-nf-mixed-only-e1-lr3e-5",
                               "outcome-nf", "step-nf-e1", "implicit-nf-mixed-e1-teacher", "implicit-nf-mixed-e1",
                               "implicit-nf-mixed-only-e1", "outcome-nf-lr1e-4", "step-nf-e1-lr1e-4",
                               "implicit-nf-mixed-e1-teacher-lr1e-4", "implicit-nf-mixed-e1-lr1e-4",
                               "implicit-nf-mixed-only-e1-lr1e-4"]),
    "sparser-k": ("sparser", ["outcome-nf-k2", "implicit-nf-mixed-e1-k2", "outcome-nf", "implicit-nf-mixed-e1",
                              "outcome-nf-k8", "implicit-nf-mixed-e1-k8", "outcome-nf-k16", "implicit-nf-mixed-e1-k16"]),
    "sparser-teacher": ("sparser", ["outcome-nf", "step-nf-e1", "implicit-nf-mixed-e1", "implicit-nf-mixed-e1-teacher",
                                    "implicit-nf-e1-teacher-frozen"]),
}
VERDICT_COLORS = {"up": "tab:green", "down": "tab:red"}  # "none", a bimodal difference: grey


def missing_arms(name: str, recorded: dict) -> list[str]:
    """The arms figure `name` of ENDS_FIGURES shows that credit.json (`recorded`) does not hold."""
    setting, arms = ENDS_FIGURES[name]
    return [a for a in arms if a not in recorded.get(setting, {})]


def ends_plot(name: str, recorded: dict, figures: Path) -> Path:
    """One of ENDS_FIGURES from credit.json: left, each arm's held-out sampled accuracy at the end, a dot
    a seed (x: a collapsed run, stats.collapsed), a bar at the mean, grey: the start; right, the
    arm minus its outcome-only baseline paired by seed (CREDIT_ARMS' baseline), a dot a seed and the
    mean with its 95% interval, coloured by the verdict of the one rule (a difference with a collapsed
    run gets no interval: its verdict is the sign count, as in --paired-from-json)."""
    setting, arms = ENDS_FIGURES[name]
    if missing := missing_arms(name, recorded):
        raise ValueError(f"--plots-from-json: figure {name!r} needs {setting} arms that credit.json lacks: {missing}")
    stats = recorded[setting]
    fig, axes = plt.subplots(1, 2, figsize=(13, 1.2 + 0.42 * len(arms)), sharey=True, layout="constrained")
    rows = np.arange(len(arms))[::-1]  # the first arm on top
    for y, arm in zip(rows, arms):
        ends, greedy = per_seed(stats[arm]), per_seed(stats[arm], "end_greedy")
        start = per_seed(stats[arm], "start_greedy")
        for seed, value in ends.items():
            axes[0].scatter(value, y, marker="x" if collapsed(start[seed], greedy[seed]) else "o", s=22, color="C0",
                            alpha=0.7)
        axes[0].scatter(np.mean(list(ends.values())), y, marker="|", s=300, color="black")
        axes[0].scatter(np.mean(stats[arm]["start_sampled"]), y, marker="|", s=300, color="grey", alpha=0.6)
        baseline = CREDIT_ARMS[arm]["baseline"]
        if baseline == arm or baseline not in stats:
            continue
        p = paired(ends, per_seed(stats[baseline]))
        fell = any(collapsed_runs(stats[arm], stats[baseline], p["seeds"]))
        color = "grey" if fell else VERDICT_COLORS.get(p["verdict"], "grey")
        axes[1].scatter(p["diffs"], [y] * len(p["diffs"]), s=22, color=color, alpha=0.7)
        lo, hi = p["ci95"]
        if fell or math.isnan(lo):
            label = f"{p['mean']:+.3f}, {p['up']}/{len(p['seeds'])} up, sign test p {p['sign_p']:.2f} (a run collapsed: no t)"
        else:
            axes[1].plot([lo, hi], [y, y], color=color, lw=2)
            label = f"{p['mean']:+.3f}, t {p['t']:.1f}, {p['up']}/{len(p['seeds'])} up: {p['verdict']}"
        axes[1].scatter(p["mean"], y, marker="|", s=300, color=color)
        axes[1].annotate(label, (1.01, y), xycoords=("axes fraction", "data"), va="center", fontsize=7)
    axes[0].set_yticks(rows, [CREDIT_LABELS[a] for a in arms], fontsize=8)
    axes[0].set_xlabel("held-out sampled accuracy at the end\n(dot: a seed, x: a collapsed run; bar: mean; "
                       "grey: start)", fontsize=8)
    axes[1].axvline(0, color="black", lw=0.6)
    axes[1].set_xlabel("minus outcome-only at the same filter, lr and K, paired by seed\n(bar: mean; line: "
                       "its 95% interval; colour: the verdict)", fontsize=8)
    fig.suptitle(f"{setting}: the end of every run, {len(stats[arms[0]]['seeds'])} seeds "
                 f"(`python studies/credit_study.py --plots-from-json`: ends-{name}.png)", fontsize=9)
    return save_figure(fig, figures, f"ends-{name}")


def plots_from_json(figures: Path) -> None:
    """`--plots-from-json`: those of ENDS_FIGURES whose arms figures/credit.json records (the others are
    named and skipped: docs/figures/credit.json is the superseded 3-seed study) and gradients.png from
    figures/gradients.json, whichever of the two the folder has."""
    jsons = [figures / "credit.json", figures / "gradients.json"]
    if not any(j.exists() for j in jsons):
        raise SystemExit(f"--plots-from-json: --figures {figures} has neither credit.json nor gradients.json")
    if jsons[0].exists():
        recorded = json.loads(jsons[0].read_text())
        for name, (setting, _) in ENDS_FIGURES.items():
            missing = missing_arms(name, recorded)
            print(f"skipped ends-{name}.png: {jsons[0]} lacks {setting} {missing}" if missing
                  else ends_plot(name, recorded, figures))
    if jsons[1].exists():
        print(plot_gradients(json.loads(jsons[1].read_text()), figures))


def weight_change(start: Path, end: Path) -> float:
    """RMS over every parameter of (end - start), two saved models (model.safetensors). Adam moves
    each weight by about lr a step in the direction of its gradient's sign, however small or noisy
    the gradient is; so after n steps a steady direction gives ~n x lr and a random one ~sqrt(n) x lr.
    The study reads it beside the rewards: how far a run moved, whatever its signal was."""
    a, b = load_file(str(Path(start) / "model.safetensors")), load_file(str(Path(end) / "model.safetensors"))
    common = sorted(set(a) & set(b))
    if not common:
        raise ValueError(f"weight_change: {start} and {end} share no parameter names")
    sq = sum(float(((b[k].double() - a[k].double()) ** 2).sum()) for k in common)
    return (sq / sum(a[k].numel() for k in common)) ** 0.5


def run_weight_change(run: dict) -> float:
    """weight_change from a finished run's starting model (its config's model_path, relative to the
    folder it ran in, which is this repository for reproduce's runs) to its final/ weights."""
    start = Path(run["config"]["model_path"])
    return weight_change(start if start.is_absolute() else REPO / start, Path(run["dir"]) / "final")


def credit_main(args) -> None:
    """`python studies/credit_study.py`: run the study's missing runs, then a table and a plot per dial setting."""
    plan = credit_runs(args.settings, args.arms)
    if not args.report_only:
        configs = {(s, a): train_config([*args.train_args, *flags, "--steps", str(args.steps)]) for s, a, flags in plan}
        for setting in args.settings:  # each setting's SFT checkpoint first, once
            build_sft(configs[next((s, a) for s, a, _ in plan if s == setting)], args.cache_dir)
        run_all([(credit_run_name(s, a), seed, flags) for seed in args.seeds for s, a, flags in plan], args,
                f"{len(plan)} setting x arm pairs")
    figures = Path(args.figures)
    old = json.loads((figures / "credit.json").read_text()) if (figures / "credit.json").exists() else {}
    results = {}
    for setting in args.settings:
        runs = {}
        for arm in dict.fromkeys(a for s, a, _ in plan if s == setting):
            runs[arm] = load_finished(args.out, credit_run_name(setting, arm), args.seeds)
            if 0 < len(runs[arm]) < len(args.seeds):
                print(f"warning: {setting} {arm}: {len(runs[arm])} of {len(args.seeds)} seeds finished")
        arms = [a for a in runs if runs[a]]
        if not arms:
            continue
        text, stats = credit_report(setting, arms, runs, args.window, old.get(setting))
        plot_path = credit_plot(setting, arms, runs, figures, args.window, args.tag)
        print(f"\n## credit: {setting} ({' '.join(SETTINGS[setting]) or 'the default task'}; {plot_path})\n")
        print(text)
        print(f"\nWhere the process reward blames the wrong responses ({setting}):\n")
        blame = {}
        print(blame_report(arms, runs, kept=blame))
        for arm, b in blame.items():
            stats[arm]["blame"] = b
        results[setting] = {**old.get(setting, {}), **stats}  # arms of other calls stay
    merge_json(figures / "credit.json", results)


# Issue 29's mechanism test: the advantages the policy would receive from each construction, turned
# into policy gradients on the SAME rollouts, batch after batch, at a fixed checkpoint.
CONSTRUCTIONS = {
    "outcome": ["--process", "none"],                                     # outcome-only RLOO
    "implicit": [],                                                       # PRIME, gamma 1 (telescopes)
    "implicit-e1": ["--rloo-form", "paper", "--process-gamma", "0.5"],    # PRIME, E1's local credit
    "step": ["--process", "step"],                                        # the exact checker, gamma 1
    "step-e1": ["--process", "step", "--rloo-form", "paper", "--process-gamma", "0.5"],
    "step-first-e1": ["--process", "step", "--step-scorer", "toy-first", "--rloo-form", "paper",
                      "--process-gamma", "0.5"],                          # E3: where, not how many
    # E4: the checker with independent noise as large as the implicit PRM's (sd 1.4: a slip stands out by
    # 0.7 noise widths in sparser); noise of that size averages out over batches, a bias would not
    "step-noise-e1": ["--process", "step", "--step-noise", "1.4", "--rloo-form", "paper", "--process-gamma", "0.5"],
}


def policy_gradients(run_dir: Path | None, batches: int, seed: int = 0, at_start: bool = False,
                     cache_dir: str = ".cache") -> tuple[dict, int]:
    """({construction: (batches, parameters) float32 gradients of Eq. 6 at rho = 1}, checkpoint step).

    The task (operations, slip, length) and the filter are the run's; the policy and the PRM are its
    final ones (run_dir/checkpoint), or with at_start (or no run: the default task) its SFT start,
    where the PRM equals the reference and the implicit rewards are 0. Each batch: fresh prompts, K
    responses each from the policy, verified, the run's filter; then, for every construction, the
    advantages train.py would compute (process_signal with the PRM frozen, process_rewards,
    advantages: whitened) and the gradient of the token-mean loss -A_t log pi(y_t) on those rows."""
    d = ddp.Dist()
    config = json.loads((run_dir / "config.json").read_text()) if run_dir else {}
    flags = [] if not run_dir else ["--toy-ops", config["toy_ops"], "--toy-slip", str(config["toy_slip"]),
                                    "--max-response-len", str(config["max_response_len"]),
                                    "--filter-low", str(config["filter_low"]), "--filter-high", str(config["filter_high"])]
    flags += ["--cache-dir", cache_dir]  # where a start that is not shipped was built
    base = train_config([*flags, "--no-prm-online", "--seed", str(seed)])
    models = run_models.build_models(base, d)
    step = 0
    if run_dir and not at_start:
        step = runlog.load_checkpoint(run_dir, models, d)
    tokenizer, policy = models.tokenizer, models.policy
    sampler = HFRollout(policy, tokenizer, base.max_response_len, base.temperature, base.top_p)
    params = [p for p in policy.parameters() if p.requires_grad]
    grads = {name: [] for name in CONSTRUCTIONS}
    # each construction's train.py configuration; the PRM is read, never updated
    configs = {name: train_config([*flags, *([] if "--process" in extra else ["--no-prm-online"]), *extra])
               for name, extra in CONSTRUCTIONS.items()}
    scorers = {spec: step_prm.load_step_scorer(spec, d.device) for spec in step_prm.TOY_SCORERS}
    torch.manual_seed(seed)
    for k in range(batches):
        tasks = train.step_prompts(base, [], tokenizer, 1_000_000 + k, d)  # prompts no run trained on
        ro = sampler.generate([t.prompt_ids for t in tasks], n=base.n_samples)
        texts, scores, outcome = train.verify_rollouts(sampler, ro, tasks, base)
        b, kept = train.kept_batch(ro, outcome, texts, tasks, base, d)
        if not kept:
            continue
        logp_ref = microbatch.logprobs_no_grad(models.reference, b.rollout, base)
        formats = torch.tensor([scores[i].format for i in b.rows.tolist()], dtype=torch.float32)
        logp = microbatch.response_logprobs(policy, b.rollout, base.temperature)
        for name, args in configs.items():
            models.step_scorer = scorers[args.step_scorer]  # each construction's own checker
            signal, _, step_ids, _ = train.process_signal(args, models, b, None, logp_ref, d, k)
            process = train.process_rewards(args, signal, step_ids, b.train_mask, b.outcome, d)
            adv, *_ = train.advantages(args, models, b, process, signal, step_ids, formats, d)
            loss = -(adv * logp * b.mask).sum() / b.mask.sum()  # Eq. 6 at rho = 1
            grads[name].append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params,
                                                                                       retain_graph=True)]))
    return {name: torch.stack(g).numpy() for name, g in grads.items()}, step


def gradient_report(grads: dict) -> dict:
    """The statistics issue 29 asks for, from (batches, parameters) gradients per construction.
    Directions are judged on held-out halves: a batch's gradient against a mean over the OTHER half
    of the batches (its own batch in the mean would inflate the cosine)."""
    def cos(a, b):
        return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))

    n = len(next(iter(grads.values())))
    halves = (np.arange(n) % 2 == 0, np.arange(n) % 2 == 1)
    means = {c: g.mean(0) for c, g in grads.items()}
    out = {"batches": n, "per_construction": {}, "cosine_of_means": {}}
    per_batch = {}  # each batch's cosine to outcome-only's mean, in the same batch order for all
    for c, g in grads.items():
        to_outcome, to_own = [], []
        for this, other in (halves, halves[::-1]):
            ref_outcome, ref_own = grads["outcome"][other].mean(0), g[other].mean(0)
            to_outcome += [cos(x, ref_outcome) for x in g[this]]
            to_own += [cos(x, ref_own) for x in g[this]]
        per_batch[c] = np.array(to_outcome)
        noise = float(np.mean(np.sum((g - means[c]) ** 2, axis=1)))
        # paired over batches (the constructions share their rollouts): this construction's cosine
        # minus outcome-only's on the same batch, its mean, SE and t
        diff = per_batch[c] - per_batch["outcome"] if "outcome" in per_batch else np.zeros(n)
        diff_se = float(np.std(diff, ddof=1) / np.sqrt(n)) if n > 1 else float("nan")
        out["per_construction"][c] = {
            "cosine_minus_outcome": float(np.mean(diff)), "cosine_minus_outcome_se": diff_se,
            "cosine_minus_outcome_t": float(np.mean(diff) / diff_se) if diff_se > 0 else float("nan"),
            "cosine_to_outcome_mean": float(np.mean(to_outcome)), "cosine_to_outcome_mean_se":
            float(np.std(to_outcome, ddof=1) / np.sqrt(n)), "cosine_to_own_mean": float(np.mean(to_own)),
            "mean_norm": float(np.linalg.norm(means[c])), "batch_norm": float(np.mean(np.linalg.norm(g, axis=1))),
            # one batch's signal-to-noise: |E g|^2 over E|g - E g|^2
            "snr": float(np.sum(means[c] ** 2) / noise) if noise else float("inf")}
        out["cosine_of_means"][c] = {o: cos(means[c], means[o]) for o in grads}
    return out


# Arm-against-arm differences the study's text quotes besides each arm's own baseline (setting, arm,
# against): so that every paired number in docs/REPRODUCTION.md comes out of one command.
QUOTED_PAIRS = [
    ("sparser", "step-first-nf-e1", "step-nf-e1"), ("sparser", "step-noise-nf-e1", "step-nf-e1"),
    ("sparser", "step-nf-e1-0.9", "step-nf-e1"), ("sparser", "step-first-nf", "step-first-nf-e1"),
    ("sparser", "implicit-nf-mixed-e1-0.9", "step-nf-e1-0.9"),
    ("sparser", "implicit-nf-mixed-e1-0.9", "implicit-nf-mixed-e1"),
    ("sparser", "implicit-nf-mixed-only-e1", "implicit-nf-mixed-e1"),
    ("sparser", "implicit-nf-mixed-e1-teacher", "implicit-nf-mixed-e1"),
    ("sparser", "implicit-nf-mixed-e1-teacher", "step-nf-e1"),
    ("sparser", "implicit-nf-e1-teacher-frozen", "implicit-nf-mixed-e1-teacher"),
    ("sparser", "implicit-nf-e1-teacher-frozen", "step-nf-e1"),
    ("sparser", "outcome-nf-k2", "outcome-nf"), ("sparser", "outcome-nf-k8", "outcome-nf"),
    ("sparser", "outcome-nf-k16", "outcome-nf"), ("sparser", "outcome-nf-k16", "outcome-nf-k8"),
    ("sparser", "outcome-nf-lr3e-5", "outcome-nf"), ("sparser", "outcome-nf-lr1e-4", "outcome-nf"),
    ("sparser", "step-nf-e1-lr1e-4", "step-nf-e1"),
    ("sparser", "implicit-nf-mixed-only-e1-lr3e-5", "implicit-nf-mixed-e1-lr3e-5"),
    ("sparser", "implicit-nf-mixed-only-e1-lr1e-4", "implicit-nf-mixed-e1-lr1e-4"),
    ("sparser", "implicit-nf-mixed-e1-teacher-lr1e-4", "step-nf-e1-lr1e-4"),
    ("sparser", "implicit-nf-mixed-e1-teacher-lr1e-4", "implicit-nf-mixed-e1-lr1e-4"),
]


def collapsed_runs(arm: dict, against: dict, seeds: list[int]) -> list[int]:
    """How many of `seeds`' runs of each side collapsed (stats.collapsed: greedy below half its start's
    at the end; 0 where the stats have no greedy accuracy)."""
    return [sum(collapsed(start, end) for s, start, end in zip(x["seeds"], x["start_greedy"], x["end_greedy"])
                if s in seeds) if "end_greedy" in x else 0 for x in (arm, against)]


def paired_from_json(recorded: dict) -> str:
    """Every recorded arm against its outcome-only baseline, and the QUOTED_PAIRS, paired by seed, from
    credit.json alone: the verdicts the study's text may state (stats.paired), the 95% interval of
    the difference (what "no difference" may mean), and how many runs of each side collapsed (greedy
    below half its start's at the end, stats.collapsed). A difference with a collapsed run is bimodal, so its t is not
    trusted: its verdict is the sign count and the sign test's p instead. Ends with the family: how
    many tests had enough seeds, and how many false claims the rule and the strong threshold expect
    among them if no difference were real."""
    pairs = [(setting, arm, CREDIT_ARMS[arm]["baseline"]) for setting, stats in recorded.items() for arm in stats
             if arm != CREDIT_ARMS[arm]["baseline"] and CREDIT_ARMS[arm]["baseline"] in stats]
    pairs += [q for q in QUOTED_PAIRS if q[0] in recorded and q[1] in recorded[q[0]] and q[2] in recorded[q[0]]]
    # a pair of two runs that are a comparison's own (the default's PRIME and outcome-only are
    # prime-vs-rloo's runs) is that comparison's difference: counted there, once, not in this family
    shared = [q for q in pairs if not any(credit_run_name(q[0], arm).startswith("credit-") for arm in q[1:])]
    pairs = [q for q in pairs if q not in shared]
    lines = ["| setting | arm | against | seeds | end sampled difference, paired | 95% interval | "
             "runs collapsed (arm / against) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    family = strong = 0
    for setting, arm, against in pairs:
        a, b = recorded[setting][arm], recorded[setting][against]
        p = paired(per_seed(a), per_seed(b))
        fell = collapsed_runs(a, b, p["seeds"])
        text, interval = paired_cells(p, any(fell))
        if not (any(fell) and len(p["seeds"]) > 1) and p["verdict"] != "too few seeds":
            family += 1
            strong += abs(p["t"]) >= CLAIM_T_STRONG and p["verdict"] in ("up", "down")
        lines.append(f"| {setting} | {CREDIT_LABELS[arm]} | {CREDIT_LABELS[against]} | {len(p['seeds'])} | {text} | "
                     f"{interval} | {fell[0]} / {fell[1]} |")
    for setting, arm, against in shared:
        lines.append(f"\n{setting}: {CREDIT_LABELS[arm]} - {CREDIT_LABELS[against]} are the runs of "
                     f"`studies/reproduce.py` ({credit_run_name(setting, arm)}, {credit_run_name(setting, against)}): "
                     "its difference is counted there, not here.")
    lines.append(f"\n{family} differences with {CLAIM_SEEDS}+ seeds and no collapse were tested (t). If none were real, "
                 f"the rule (|t| >= {CLAIM_T:g}, every sign alike) would make {family * NULL_RATE[CLAIM_T]:.1f} false "
                 f"claims among them, |t| >= {CLAIM_T_STRONG:g} {family * NULL_RATE[CLAIM_T_STRONG]:.2f}; "
                 f"{strong} of them pass |t| >= {CLAIM_T_STRONG:g}.")
    return "\n".join(lines)


# Issue 45's discriminating experiment. PRIME, local costs accuracy in `sparser` (section 4's answer 3).
# Steerable errors or crowding-out? Freeze PRIME, local's PRM at step 20 and, with it, score the lines
# that PRIME, local's and outcome-only's policies write at steps 0-40 of the same seeds, on the same
# held-out prompts. If the policy steers into the PRM's errors, PRIME, local's policy raises the frozen
# PRM's reward on the lines the checker marks slipped faster than outcome-only's does; if the cost is
# crowding-out, the two policies' slipped lines score alike. The causal test's arm trains against that
# very PRM from step 20 on (it is frozen there): if its errors can be climbed, this arm climbs them most.
SLIP_ARMS = ("outcome-nf", "implicit-nf-mixed-e1", "implicit-nf-mixed-e1-freeze20")
SLIP_STEPS = (0, 10, 20, 30, 40)  # 0: the SFT start, shared by every arm; the others: kept checkpoints
SLIP_PRM_STEP = 20
SLIP_PAIRS = (("implicit-nf-mixed-e1", "outcome-nf"), ("implicit-nf-mixed-e1-freeze20", "outcome-nf"),
              ("implicit-nf-mixed-e1-freeze20", "implicit-nf-mixed-e1"))


def slip_run_name(arm: str) -> str:
    return f"slip-sparser-{arm}"


def slip_run_flags(arm: str) -> list[str]:
    """The study's flags for the arm in `sparser`, run to step 40 keeping a checkpoint every 10 steps."""
    return [*SETTINGS["sparser"], *CREDIT_ARMS[arm]["flags"], "--save-every", str(SLIP_STEPS[1]), "--keep-checkpoints",
            "--eval-every", "0"]


def operation_count(prompt: str) -> int:
    """The operations of a toy problem ("(7+5)*3" has 2): its response's first lines, one per operation."""
    return len(toy_task.OPERATION.findall(prompt))


def line_rewards(reward: torch.Tensor, step_ids: torch.Tensor, step_scores: torch.Tensor,
                 n_ops: list[int]) -> tuple[list[float], list[float]]:
    """(rewards of the lines the exact checker marks right, of those it marks slipped): the per-token
    reward (B, R) summed over each operation line (step_ids (B, R), the line of each token, -1 on
    padding; step_scores (B, S), the checker's 1 / 0 per line). Only a response's first n_ops[i]
    lines count, the operations; its box line and anything after it are left out."""
    right, slipped = [], []
    for i in range(reward.shape[0]):
        for k in range(min(n_ops[i], step_scores.shape[1])):
            tokens = step_ids[i] == k
            if tokens.any():
                (right if step_scores[i, k] == 1 else slipped).append(float(reward[i][tokens].sum()))
    return right, slipped


def slip_scores(seed: int, arms: list[str], out: str, problems: int, samples: int, cache_dir: str,
                at_start: dict | None = None) -> dict:
    """{arm: {step: statistics}} for one seed and these arms: PRIME, local's PRM of checkpoint-20
    frozen, each arm's policy at each of SLIP_STEPS samples `samples` responses to the first
    `problems` held-out prompts (the same random numbers for every policy: step 0, the shared start,
    gives every arm the same samples: `at_start`, if already scored), and every operation line gets the PRM's raw reward
    beta log(pi_phi / pi_ref) summed over its tokens (Eq. 3 before any normaliser). Statistics: mean
    reward of the right and of the slipped lines and their counts, slips per response, the sampled
    accuracy."""
    d = ddp.Dist()
    base = train_config([*slip_run_flags("implicit-nf-mixed-e1"), "--cache-dir", cache_dir, "--seed", str(seed),
                         "--eval-problems", str(problems), "--n-samples", str(samples)])
    models = run_models.build_models(base, d)
    load = lambda arm, step: torch.load(Path(out) / f"{slip_run_name(arm)}-s{seed}" / f"checkpoint-{step}" /  # noqa: E731
                                        "state.pt", map_location="cpu", mmap=True, weights_only=False)
    models.prm.load_state_dict(load("implicit-nf-mixed-e1", SLIP_PRM_STEP)["prm"])
    start = {k: v.clone() for k, v in models.policy.state_dict().items()}
    tokenizer = models.tokenizer
    _, tasks = train.load_tasks(base, tokenizer)
    sampler = HFRollout(models.policy, tokenizer, base.max_response_len, base.temperature, base.top_p)
    results = {}
    for arm in arms:
        results[arm] = {}
        for step in SLIP_STEPS:
            if step == 0 and at_start is not None:
                results[arm][0] = at_start
                continue
            models.policy.load_state_dict(start if step == 0 else load(arm, step)["policy"])
            torch.manual_seed(seed)
            with torch.no_grad():
                ro = sampler.generate([t.prompt_ids for t in tasks], n=samples)
            texts, _, outcome = train.verify_rollouts(sampler, ro, tasks, base)
            with torch.no_grad():  # greedy, one answer a prompt: what the collapse rule reads
                _, _, greedy = train.verify_rollouts(sampler, sampler.generate([t.prompt_ids for t in tasks], greedy=True),
                                                     tasks, dataclasses.replace(base, n_samples=1))
            prompts = [t.text for t in tasks for _ in range(samples)]
            scores, step_ids = step_prm.step_scores_and_ids(step_prm.ToyStepChecker(), tokenizer, prompts, texts,
                                                            ro.response_ids, ro.response_mask)
            reward = base.beta * (microbatch.logprobs_no_grad(models.prm, ro, base)
                                  - microbatch.logprobs_no_grad(models.reference, ro, base)) * ro.response_mask
            right, slipped = line_rewards(reward, step_ids, scores, [operation_count(p) for p in prompts])
            r = results[arm][step] = {"right_reward": float(np.mean(right)) if right else math.nan,
                                      "slip_reward": float(np.mean(slipped)) if slipped else math.nan,
                                      "right_lines": len(right), "slipped_lines": len(slipped),
                                      "slips_per_response": len(slipped) / len(prompts),
                                      "accuracy": float(outcome.mean()), "greedy": float(greedy.mean())}
            at_start = r if step == 0 else at_start
            print(f"  seed {seed} {arm} step {step}: right lines {r['right_reward']:+.3f} ({len(right)}), slipped "
                  f"{r['slip_reward']:+.3f} ({len(slipped)}), accuracy {r['accuracy']:.3f}, greedy {r['greedy']:.3f}", flush=True)
    return results


def slip_report(scores: dict) -> str:
    """The paired table from slip.json ({seed: {arm: {step: statistics}}}). The test is the step-40
    (SLIP_STEPS[-1]) difference of each pair of SLIP_PAIRS (arm - against, paired by seed) in the frozen
    PRM's mean reward of slipped lines: a verdict by the one rule, a collapsed run (stats.collapsed on
    the scored prompts' greedy accuracy, step 0 against step 40) giving a sign count instead of a t.
    Beside it, as numbers without a verdict: right lines, slipped minus right (how much more the PRM
    likes the slips each policy writes than its right lines), slips per response; and the earlier
    steps' slipped-line differences, the way there. A slip.json without greedy accuracy cannot apply
    the collapse rule: its step-40 cell says so and gives no verdict."""
    last = SLIP_STEPS[-1]

    def at(arm, step, key):
        return {int(seed): v[arm][str(step)][key] for seed, v in scores.items() if arm in v}

    def gap(arm, step):
        slip, right = at(arm, step, "slip_reward"), at(arm, step, "right_reward")
        return {seed: slip[seed] - right[seed] for seed in slip}

    def mean_up(p):
        return f"{p['mean']:+.3f} ({p['up']}/{len(p['seeds'])} up)"

    def fell(arm):  # runs of the arm whose greedy accuracy on the scored prompts collapsed by the last step
        start, end = at(arm, 0, "greedy"), at(arm, last, "greedy")
        return sum(collapsed(start[s], end[s]) for s in end)

    checkable = all("greedy" in v[arm][str(step)] for v in scores.values() for arm in v for step in (0, last))
    lines = [f"| pair | slipped lines at step {last}: the test | 95% interval | runs collapsed (arm / against) | "
             f"right lines at {last} | slipped - right at {last} | slips per response at {last}, arm / against | "
             "slipped lines at steps " + ", ".join(map(str, SLIP_STEPS[1:-1])) + " |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for arm, against in SLIP_PAIRS:
        if not at(arm, last, "slip_reward") or not at(against, last, "slip_reward"):
            continue
        p = paired(at(arm, last, "slip_reward"), at(against, last, "slip_reward"))
        if checkable:
            runs = [fell(arm), fell(against)]
            cell, interval = paired_cells(p, any(runs))
            runs = f"{runs[0]} / {runs[1]}"
        else:
            cell, interval, runs = f"{mean_up(p)}; no greedy accuracy recorded: collapses unchecked, no verdict", "n/a", "?"
        earlier = ", ".join(mean_up(paired(at(arm, k, "slip_reward"), at(against, k, "slip_reward")))
                            for k in SLIP_STEPS[1:-1])
        per_response = [np.mean(list(at(a, last, "slips_per_response").values())) for a in (arm, against)]
        lines.append(f"| {CREDIT_LABELS[arm]} - {CREDIT_LABELS[against]} | {cell} | {interval} | {runs} | "
                     f"{mean_up(paired(at(arm, last, 'right_reward'), at(against, last, 'right_reward')))} | "
                     f"{mean_up(paired(gap(arm, last), gap(against, last)))} | "
                     f"{per_response[0]:.2f} / {per_response[1]:.2f} | {earlier} |")
    return "\n".join(lines)


def slip_main(args) -> None:
    """`python studies/credit_study.py --slip-rewards`: the arms' runs to step 40 (those not there), then each
    seed's scores of the arms slip.json lacks into --figures/slip.json, and the paired table."""
    args.steps = SLIP_STEPS[-1]
    if not args.report_only:
        jobs = [(slip_run_name(arm), seed, slip_run_flags(arm)) for seed in args.seeds for arm in SLIP_ARMS]
        build_sft(train_config([*args.train_args, *slip_run_flags(SLIP_ARMS[0])]), args.cache_dir)
        run_all(jobs, args, f"{len(SLIP_ARMS)} arms to step {args.steps}")
    path = Path(args.figures) / "slip.json"
    scores = json.loads(path.read_text()) if path.exists() else {}
    for seed in args.seeds:
        done = scores.get(str(seed), {})
        missing = [arm for arm in SLIP_ARMS if arm not in done]
        if missing and not args.report_only:
            start = next(iter(done.values()))["0"] if done else None  # the shared start, scored before
            new = slip_scores(seed, missing, args.out, args.slip_problems, args.slip_samples, args.cache_dir, start)
            scores[str(seed)] = {**done, **json.loads(json.dumps(new))}  # steps as strings, as read back
            runlog.write_json(path, scores, indent=1)  # after each seed: an interrupted scoring keeps the rest
    print(f"\nPRIME, local's PRM of step {SLIP_PRM_STEP} frozen; {args.slip_problems} held-out prompts x "
          f"{args.slip_samples} samples per policy ({path})\n")
    print(slip_report(scores))


def main(argv=None):
    parser = same_parser(__doc__)
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS),
                        help="the dial settings (default: all)")
    parser.add_argument("--arms", nargs="+", choices=list(CREDIT_ARMS),
                        help="run these arms in every chosen setting (default: CREDIT's arms per setting)")
    parser.add_argument("--tag", default="", help="name the plots credit-<setting>-<tag>.png, so that a plot of a "
                        "few --arms does not replace the setting's plot of all of them")
    parser.add_argument("--gradients", nargs="*", metavar="RUN_DIR",
                        help="instead of training: the policy-gradient statistics of every advantage construction "
                             "at the SFT start and at each given run's final checkpoint (issue 29's mechanism test)")
    parser.add_argument("--gradient-batches", type=int, default=40, help="--gradients: batches per checkpoint")
    parser.add_argument("--paired-from-json", action="store_true",
                        help="print every recorded arm's paired difference from its baseline (--figures/credit.json)")
    parser.add_argument("--plots-from-json", action="store_true",
                        help="draw the study's figures from --figures/credit.json (ENDS_FIGURES) and "
                             "--figures/gradients.json (gradients.png) alone, whichever the folder has")
    parser.add_argument("--slip-rewards", action="store_true",
                        help="issue 45's discriminating experiment: PRIME, local's step-20 PRM frozen scores the lines "
                             "that PRIME, local's and outcome-only's policies write at steps 0-40 (sparser)")
    parser.add_argument("--slip-problems", type=int, default=100, help="--slip-rewards: held-out prompts")
    parser.add_argument("--slip-samples", type=int, default=4, help="--slip-rewards: samples per prompt")
    args = parse_study_args(parser, argv)
    if args.slip_rewards:
        slip_main(args)
    elif args.paired_from_json:
        print(paired_from_json(json.loads((Path(args.figures) / "credit.json").read_text())))
    elif args.plots_from_json:
        plots_from_json(Path(args.figures))
    elif args.gradients is not None:
        gradients_main(args)
    else:
        credit_main(args)


def gradients_main(args) -> None:
    """`python studies/credit_study.py --gradients [RUN_DIR ...]`: the table, gradients.json and gradients.png."""
    results = {}
    run_dirs = list(map(Path, args.gradients))
    # the SFT start of the first run's task (the default task without a run), then each run's end
    for run_dir, at_start in [(run_dirs[0] if run_dirs else None, True), *((r, False) for r in run_dirs)]:
        grads, step = policy_gradients(run_dir, args.gradient_batches, at_start=at_start, cache_dir=args.cache_dir)
        task = f" ({run_dir.name.rsplit('-s', 1)[0]}'s task)" if run_dir else ""
        name = f"SFT start{task}" if at_start else f"{run_dir.name} step {step}"
        results[name] = gradient_report(grads)
        print(f"\n## {name}: {results[name]['batches']} batches\n")
        print("| construction | cosine to outcome-only's mean (held-out half) | minus outcome-only's, paired by batch "
              "| cosine to its own mean | one batch's SNR | mean gradient norm / one batch's |")
        print("| --- | --- | --- | --- | --- | --- |")
        for c, r in results[name]["per_construction"].items():
            print(f"| {c} | {r['cosine_to_outcome_mean']:.3f} +- {r['cosine_to_outcome_mean_se']:.3f} | "
                  f"{r['cosine_minus_outcome']:+.3f} +- {r['cosine_minus_outcome_se']:.3f} "
                  f"(t {r['cosine_minus_outcome_t']:.1f}) | {r['cosine_to_own_mean']:.3f} | {r['snr']:.3f} | "
                  f"{r['mean_norm']:.3g} / {r['batch_norm']:.3g} |")
        print("cosine between the means: " + "; ".join(
            f"{c}/{o} {v:.2f}" for c, row in results[name]["cosine_of_means"].items() for o, v in row.items() if c < o))
    figures = Path(args.figures)
    merge_json(figures / "gradients.json", results)
    print(f"\n{plot_gradients(json.loads((figures / 'gradients.json').read_text()), figures)}")


# The constructions and checkpoints by the names docs/REPRODUCTION.md gives them
CONSTRUCTION_LABELS = {"outcome": "outcome-only", "implicit": "PRIME", "implicit-e1": "PRIME, local",
                       "step": "checker, gamma 1", "step-e1": "checker, local",
                       "step-first-e1": "first-slip checker, local", "step-noise-e1": "noisy checker, local"}


def checkpoint_label(name: str) -> str:
    """'credit-sparser-implicit-nf-mixed-e1-s1 step 20' -> 'PRIME, local, seed 1, step 20' (a run of
    reproduce.py: 'prime-s1 step 70' -> 'PRIME, seed 1, step 70'); 'SFT start (...)' -> 'SFT start'."""
    if " step " not in name:
        return "SFT start"
    run, step = name.rsplit(" step ", 1)
    arm, seed = run.rsplit("-s", 1)
    arm = arm.split("-", 2)[2] if arm.startswith("credit-") else arm  # credit-<setting>-<arm>
    return f"{CREDIT_LABELS.get(arm, LABELS.get(arm, arm))}, seed {seed}, step {step}"


def plot_gradients(results: dict, figures: Path) -> Path:
    """gradients.png from gradients.json: every recorded checkpoint, each construction's batch cosine to
    outcome-only's mean, its per-batch SNR, and the cosine of its mean gradient with outcome-only's."""
    def step(name):  # "SFT start (...)" first, then "<run> step N" by N
        return int(name.rsplit(" ", 1)[1]) if " step " in name else 0

    fig, axes = plt.subplots(1, 3, figsize=(16, 3.8))
    width = 0.8 / len(results)
    for i, (name, r) in enumerate(sorted(results.items(), key=lambda kv: step(kv[0]))):
        cs = list(r["per_construction"])
        x, label = np.arange(len(cs)) + width * i - 0.3, checkpoint_label(name)
        axes[0].bar(x, [r["per_construction"][c]["cosine_to_outcome_mean"] for c in cs], width,
                    yerr=[r["per_construction"][c]["cosine_to_outcome_mean_se"] for c in cs], label=label)
        axes[1].bar(x, [r["per_construction"][c]["snr"] for c in cs], width, label=label)
        axes[2].bar(x, [r["cosine_of_means"][c]["outcome"] for c in cs], width, label=label)
    lowest = min(row["outcome"] for r in results.values() for row in r["cosine_of_means"].values())
    axes[2].set_ylim(min(0.5, lowest - 0.05), 1.02)  # no bar cut off below the axis
    for ax, title in zip(axes, ("one batch's gradient: cosine to outcome-only's mean (other half)",
                                "one batch's signal-to-noise |E g|^2 / E|g - E g|^2",
                                "the mean gradient: cosine with outcome-only's mean")):
        ax.set_xticks(range(len(cs)), [CONSTRUCTION_LABELS.get(c, c) for c in cs], fontsize=7, rotation=20,
                      ha="right")  # every checkpoint has the same ones
        ax.set_title(title, fontsize=9)
    # one legend under the three panels, where it hides no bar
    fig.legend(*axes[0].get_legend_handles_labels(), loc="upper center", bbox_to_anchor=(0.5, 0.0),
               ncol=len(results), fontsize=8)
    return save_figure(fig, figures, "gradients")


if __name__ == "__main__":
    main()
