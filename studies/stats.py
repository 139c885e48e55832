"""The statistics every study shares, written once: paired differences over seeds, their interval and
sign test, the verdict rule, and the collapse rule. reproduce.py, real_study.py and credit_study.py
import them; docs/REPRODUCTION.md states the same rules in words.

    paired(arm, base)            arm - base per shared seed: mean, paired t, 95% interval, sign test, verdict
    paired_text(p)               one table cell of a difference
    collapsed(start, end)        whether a run collapsed: greedy held-out accuracy below half its start's
    paired_cells(p, any_collapsed)  the verdict and interval cells; a difference with a collapsed run gets no t
    fmt(values)                  "mean [min, max]" of a metric over seeds
"""

import math

import numpy as np

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
# A run collapsed when its greedy held-out accuracy ends below this fraction of its start's: relative
# to the start, so that a start below any fixed level (SmolLM2's chains start at 0.425) that improves
# has not collapsed, and a start of 1.0 collapses below 0.5.
COLLAPSE = 0.5


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


def collapsed(start_greedy: float, end_greedy: float) -> bool:
    """The collapse rule: greedy held-out accuracy ended below COLLAPSE times its start's.
    collapsed(1.0, 0.45) -> True; collapsed(0.425, 0.475) -> False; collapsed(1.0, 0.5) -> False."""
    return end_greedy < COLLAPSE * start_greedy


def paired_cells(p: dict, any_collapsed: bool) -> tuple[str, str]:
    """A paired difference's verdict cell and its 95% interval cell. A difference with a collapsed run
    is bimodal, so its t is not trusted: it gets the sign count and the sign test's p, no interval."""
    lo, hi = p["ci95"]
    if any_collapsed and len(p["seeds"]) > 1:
        return f"{p['mean']:+.3f} ({p['up']}/{len(p['seeds'])} up; bimodal: sign test p {p['sign_p']:.2f}, no t)", "n/a"
    return paired_text(p), "n/a" if math.isnan(lo) else f"[{lo:+.3f}, {hi:+.3f}]"


def eval_se(accuracy: float, draws: int) -> float:
    """Binomial standard error of an accuracy measured on `draws` responses (problems x samples): the
    evaluation's own noise, before any difference between seeds or arms."""
    return math.sqrt(accuracy * (1 - accuracy) / max(draws, 1))


def fmt(values, digits=3) -> str:
    values = [v for v in values if v is not None and not np.isnan(v)]
    if not values:
        return "n/a"
    return f"{np.mean(values):.{digits}f} [{min(values):.{digits}f}, {max(values):.{digits}f}]"
