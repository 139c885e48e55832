"""studies/: reproduce.py's curve arithmetic, the statistics every study shares (stats.py) by hand, and one tiny comparison end to end."""

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import credit_study
import real_study
import reproduce
import runlog
import runner
import stats

from conftest import SFT_STEPS

REPO = Path(__file__).resolve().parents[1]


def test_moving_average_and_first_step_reaching_by_hand():
    x = np.array([[0.0, 1.0, np.nan, 3.0, 5.0]])
    # trailing window 2: [0], [0,1], [1,nan], [nan,3], [3,5]
    assert runlog.moving_average(x, 2).tolist() == [[0.0, 0.5, 1.0, 3.0, 4.0]]
    assert runner.first_step_reaching(np.array([0.1, 0.3, 0.2, 0.5]), 0.3) == 2  # steps count from 1
    assert runner.first_step_reaching(np.array([0.1, 0.2]), 0.3) is None


def test_every_arm_is_in_a_comparison_and_has_a_label():
    used = {a for arms in reproduce.COMPARISONS.values() for a in arms}
    assert used == set(runner.ARMS) == set(runner.LABELS)


def test_one_comparison_end_to_end(cache_dir, tmp_path, capsys):
    """reproduce.py's entry point in this process; its two runs are real train.py processes, at once."""
    argv = ["prime-vs-rloo", "--seeds", "1", "--steps", "3", "--jobs", "2", "--out", str(tmp_path / "runs"),
            "--cache-dir", str(cache_dir), "--figures", str(tmp_path / "fig"), "--window", "2",
            "--sft-steps", str(SFT_STEPS), "--prompts-per-step", "8", "--eval-problems", "8", "--eval-every", "0"]
    reproduce.main(argv)
    stdout = capsys.readouterr().out
    assert (tmp_path / "fig" / "prime-vs-rloo.png").stat().st_size > 1000
    results = json.loads((tmp_path / "fig" / "results.json").read_text())
    assert set(results) == {"prime", "rloo"}
    metrics = [json.loads(l) for l in (tmp_path / "runs" / "rloo-s1" / "metrics.jsonl").read_text().splitlines()]
    assert results["rloo"]["reward_last"] == [np.mean([m["reward"] for m in metrics[-2:]])]
    assert "| outcome-only |" in stdout and "PRIME reaches" in stdout
    # a second call finds the runs finished and only redraws
    reproduce.main(argv)
    assert "done in" not in capsys.readouterr().out


def test_paired_difference_by_hand():
    # seeds 1-3 shared (seed 4 is the baseline's alone): differences 0.1, 0.05, 0.2; mean 0.35 / 3;
    # deviations -0.05/3, -0.2/3, 0.25/3 -> sd = sqrt((0.0025 + 0.04 + 0.0625) / 9 / 2) = sqrt(0.105 / 18)
    p = stats.paired({1: 0.5, 2: 0.6, 3: 0.7}, {1: 0.4, 2: 0.55, 3: 0.5, 4: 0.9})
    assert p["seeds"] == [1, 2, 3] and p["diffs"] == pytest.approx([0.1, 0.05, 0.2])
    assert p["mean"] == pytest.approx(0.35 / 3)
    assert p["t"] == pytest.approx((0.35 / 3) / (math.sqrt(0.105 / 18) / math.sqrt(3)))  # 2.65
    assert (p["up"], p["down"], p["verdict"]) == (3, 0, "too few seeds")
    assert stats.paired_text(p) == "+0.117 (t 2.6, 3/3 up; too few seeds)"
    # five seeds: a claim when |t| >= 3 and every difference has its sign
    base = {s: 0.5 for s in range(1, 6)}
    up = stats.paired({s: 0.5 + 0.01 * s for s in range(1, 6)}, base)  # 0.01 .. 0.05: t = 0.03 / (0.0158 / 2.24) = 4.2
    assert up["t"] == pytest.approx(0.03 / (np.std([0.01, 0.02, 0.03, 0.04, 0.05], ddof=1) / math.sqrt(5)))
    assert up["verdict"] == "up"
    mixed = stats.paired({1: 0.6, 2: 0.6, 3: 0.6, 4: 0.6, 5: 0.49}, base)  # one seed down: no claim
    assert mixed["down"] == 1 and mixed["verdict"] == "none"
    down = stats.paired({s: 0.4 for s in range(1, 6)}, base)  # every difference -0.1: t = -inf
    assert down["t"] == -math.inf and down["verdict"] == "down"
    assert stats.paired_text(stats.paired({1: 0.3}, {1: 0.1})) == "+0.200 (one seed)"
    assert stats.paired_text(stats.paired({1: 0.3}, {2: 0.1})) == "no shared seed"
    # the evaluation's binomial SE: 200 problems x 4 samples at 0.70 -> sqrt(0.21 / 800) = 0.0162
    assert stats.eval_se(0.7, 800) == pytest.approx(math.sqrt(0.21 / 800))


def test_credit_arithmetic_by_hand():
    # outcome 0.2, checker 0.6 (gain 0.4), arm 0.4: half the gain; below outcome-only: negative
    assert credit_study.gap_closed(0.2, 0.6, 0.4) == pytest.approx(0.5)
    assert credit_study.gap_closed(0.2, 0.6, 0.1) == pytest.approx(-0.25)
    assert credit_study.gap_closed(0.5, 0.5, 0.7) is None and credit_study.gap_closed(0.5, 0.4, 0.7) is None


def save_weights(folder, **tensors):
    from safetensors.torch import save_file
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def fake_run(seed, rewards, end_sampled, start_sampled=0.1, folder=None, step=0.0):
    """A finished run's loaded record; with a folder, real start and final/ weights `step` apart."""
    import torch
    metrics = [{"reward": r, "mixed_groups": 4, "kept_groups": 6, "prm_accuracy": None, "prm_localization": None}
               for r in rewards]
    run = {"metrics": metrics, "config": {"seed": seed},
           "summary": {"start_sampled_accuracy": start_sampled, "end_sampled_accuracy": end_sampled,
                       "start_accuracy": 0.5, "end_accuracy": 0.5}}
    if folder is not None:
        start = save_weights(folder / f"start-{seed}", w=torch.zeros(2, 2))
        save_weights(folder / f"run-{seed}" / "final", w=torch.full((2, 2), step))
        run.update(dir=folder / f"run-{seed}", config={"seed": seed, "model_path": str(start)})
    return run


def test_weight_change_is_the_rms_of_the_difference_by_hand(tmp_path):
    import torch
    a = save_weights(tmp_path / "a", w=torch.tensor([[1.0, 2.0], [3.0, 4.0]]), b=torch.tensor([0.0, 0.0]))
    b = save_weights(tmp_path / "b", w=torch.tensor([[1.0, 2.0], [3.0, 7.0]]), b=torch.tensor([4.0, 0.0]),
                     extra=torch.ones(5))  # only the parameters both hold are compared
    # differences 0, 0, 0, 3, 4, 0 over 6 parameters: sqrt((9 + 16) / 6)
    assert credit_study.weight_change(a, b) == pytest.approx((25 / 6) ** 0.5)
    assert credit_study.weight_change(a, a) == 0.0
    c = save_weights(tmp_path / "c", other=torch.ones(1))
    with pytest.raises(ValueError, match="share no parameter"):
        credit_study.weight_change(a, c)


def test_steps_to_reach_uses_full_windows_only():
    # window 2: moving averages [0.8 (one value, not full), 0.45, 0.2, 0.5, 0.7]
    run = fake_run(1, [0.8, 0.1, 0.3, 0.7, 0.7], 0.5)
    assert runner.steps_to_reach([run], 0.5, 2) == [4]  # step 1's 0.8 is not a full window
    assert runner.steps_to_reach([run], 0.71, 2) == [None]


def test_credit_report_reads_gains_against_the_arms_own_baseline_and_checker(tmp_path):
    runs = {"outcome-nf": [fake_run(s, [0.1] * 4, e, folder=tmp_path / "o", step=0.001) for s, e in ((1, 0.10), (2, 0.12))],
            "step-nf": [fake_run(s, [0.1, 0.2, 0.3, 0.4], e, folder=tmp_path / "s", step=0.003 * s)
                        for s, e in ((1, 0.30), (2, 0.34))],
            "implicit-nf-mixed": [fake_run(s, [0.1, 0.1, 0.1, 0.2], e, folder=tmp_path / "i") for s, e in ((1, 0.11), (2, 0.31))]}
    text, stats = credit_study.credit_report("sparse", list(runs), runs, window=2)
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines()[2:]}
    step = rows[credit_study.CREDIT_LABELS["step-nf"]]
    # paired differences 0.20 and 0.22: mean +0.21, sd 0.01414, t = 0.21 / (0.01414 / sqrt 2) = 21.0;
    # outcome's final 2-step mean 0.1 is reached at step 2
    assert "+0.210 (t 21.0, 2/2 up; too few seeds)" in step and "| 2, 2 |" in step
    implicit = rows[credit_study.CREDIT_LABELS["implicit-nf-mixed"]]
    # differences 0.01 and 0.19: mean +0.10, sd 0.1273, t = 1.1; the checker's gain is measured (t 21,
    # every seed up): share 0.10 / 0.21 = 0.48
    assert "+0.100 (t 1.1, 2/2 up; too few seeds)" in implicit and "| 0.48 |" in implicit
    assert stats["step-nf"]["end_sampled"] == [0.30, 0.34]
    # each weight moved 0.003 and 0.006: RMS 3e-3 and 6e-3, shown x 1e3 as mean [min, max]; 4 mixed / 6 kept
    assert stats["step-nf"]["weight_change"] == pytest.approx([0.003, 0.006])
    assert step.endswith("| 4.50 [3.00, 6.00] |") and "| 4.0 / 6.0 |" in step


def test_credit_arms_are_complete_and_shared_runs_keep_their_names():
    for arm, spec in credit_study.CREDIT_ARMS.items():
        assert arm in credit_study.CREDIT_LABELS and spec["baseline"] in credit_study.CREDIT_ARMS
        assert spec["checker"] in credit_study.CREDIT_ARMS
    assert all(set(arms) <= set(credit_study.CREDIT_ARMS) for arms in credit_study.CREDIT.values())
    assert credit_study.credit_run_name("default", "outcome") == "rloo"  # prime-vs-rloo's run, not a second one
    assert credit_study.credit_run_name("default", "implicit") == "prime"
    assert credit_study.credit_run_name("sparse", "outcome") == "credit-sparse-outcome"
    for setting, arm, flags in credit_study.credit_runs(list(credit_study.SETTINGS), None):
        runner.train_config(flags)  # every study run's flags parse and pass config.check_args


def test_slipped_lines_are_the_lines_whose_arithmetic_is_wrong():
    assert credit_study.slipped_lines("7+5=12\n12*3=35\n35-4=31\n\\boxed{31}") == [False, True, False, False]
    assert credit_study.slipped_lines("7+5=13\nnonsense\n\\boxed{9}") == [True, False, False]


def test_blame_stats_by_hand(tmp_path):
    # wrong, two slips (lines 1 and 2), most negative line 2: a slip, not the first one.
    # raw rewards on the tokens with |raw| > 0.3 are 10x what the estimator received: normaliser 10.
    a = {"step": 5, "outcome": 0.0, "response": "7+5=12\n12*3=35\n35-4=30\n\\boxed{30}",
         "step_ids": [0, 0, 1, 1, 2, 2, 3], "process_reward": [0.0, 0.01, -0.05, 0.0, -0.08, 0.0, 0.02],
         "reward": [0.0, 0.1, -0.5, 0.0, -0.8, 0.0, 0.2]}
    # wrong, one slip (line 0) that gets the most negative reward: first and any
    b = {"step": 6, "outcome": 0.0, "response": "7+5=13\n13*3=39\n\\boxed{39}",
         "step_ids": [0, 1, 2], "process_reward": [-0.2, 0.0, 0.1], "reward": [-1.0, 0.0, 0.5]}
    right = {**b, "outcome": 1.0}                      # right responses are not read
    early = {**b, "step": 1}                           # nor steps up to after_step
    clean = {**b, "response": "7+5=12\n12*3=36\n\\boxed{37}"}  # nor wrong ones with no slip
    got = credit_study.blame_stats([a, b, right, early, clean], after_step=2)
    assert got["responses"] == 2 and got["slips_per_response"] == 1.5
    assert got["first"] == 0.5 and got["any"] == 1.0
    assert got["normaliser"] == pytest.approx(7.5)     # median of 10 (a) and 5 (b)
    # largest |return-to-go| of the raw reward: a: |-0.5 - 0.8 + 0.2| = 1.1 (from t = 2); b: 0.5 (t = 0 and t = 2)
    assert got["own"] == pytest.approx(0.8)
    # raw line sums: a: 0.1 (clean), -0.5 and -0.8 (slips), the box not counted; b: -1.0 (slip), 0.0 (clean)
    assert got["slip_reward"] == pytest.approx(-2.3 / 3) and got["clean_reward"] == pytest.approx(0.05)
    assert got["clean_sd"] == pytest.approx(0.05)
    assert got["separation"] == pytest.approx((0.05 + 2.3 / 3) / 0.05)
    assert np.isnan(credit_study.blame_stats([right], after_step=0)["first"])
    # blame_report reads the runs' episodes.jsonl and keeps each PRM arm's statistics (credit.json)
    runs = {}
    for arm, process in (("implicit", "implicit"), ("outcome", "none")):
        (tmp_path / arm).mkdir()
        (tmp_path / arm / "episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in (a, b, right)))
        runs[arm] = [{"config": {"process": process, "process_norm": "batch"}, "dir": str(tmp_path / arm)}]
    kept = {}
    table = credit_study.blame_report(list(runs), runs, after_step=2, kept=kept)
    assert set(kept) == {"implicit"} and kept["implicit"]["after_step"] == 2  # outcome-only has no PRM to read
    assert {k: v for k, v in kept["implicit"].items() if k != "after_step"} == \
        credit_study.blame_stats([a, b, right], after_step=2)
    assert "| 2 | 1.50 | 0.50 / 1.00 | 7.5 / 0.8 |" in table


def test_an_arm_with_fewer_seeds_is_compared_seed_for_seed(tmp_path):
    runs = {"outcome-nf": [fake_run(s, [0.1] * 4, e, folder=tmp_path / "o") for s, e in ((1, 0.10), (2, 0.20), (3, 0.30))],
            "step-nf": [fake_run(s, [0.1] * 4, e, folder=tmp_path / "s") for s, e in ((1, 0.20), (2, 0.30), (3, 0.40))],
            "implicit-nf-mixed": [fake_run(1, [0.1] * 4, 0.15, folder=tmp_path / "i")]}
    text, _ = credit_study.credit_report("sparser", list(runs), runs, window=2)
    implicit = [line for line in text.splitlines() if line.startswith(f"| {credit_study.CREDIT_LABELS['implicit-nf-mixed']} |")][0]
    # seed 1 only: 0.15 - 0.10 = +0.05 over outcome's seed 1 (not -0.05 under its 3-seed mean 0.20),
    # one seed, so no t; the checker's paired differences are all +0.10 (t = inf, every seed up): a
    # measured gap, of which this arm's seed 1 takes (0.15 - 0.10) / (0.20 - 0.10) = 0.50
    assert "| +0.050 (one seed) | 0.50 |" in implicit
    runs["step-nf"] = [fake_run(s, [0.1] * 4, e, folder=tmp_path / "s1") for s, e in ((1, 0.20), (2, 0.15), (3, 0.40))]
    text, _ = credit_study.credit_report("sparser", list(runs), runs, window=2)
    implicit = [line for line in text.splitlines() if line.startswith(f"| {credit_study.CREDIT_LABELS['implicit-nf-mixed']} |")][0]
    assert "| +0.050 (one seed) | no measured gap |" in implicit  # the checker's seed 2 is down: no gap
    runs["step-nf"] = [fake_run(s, [0.1] * 4, e, folder=tmp_path / "s2") for s, e in ((1, 0.35), (2, 0.40), (3, 0.45))]
    text, _ = credit_study.credit_report("sparser", list(runs), runs, window=2)
    implicit = [line for line in text.splitlines() if line.startswith(f"| {credit_study.CREDIT_LABELS['implicit-nf-mixed']} |")][0]
    assert "| +0.050 (one seed) | 0.20 |" in implicit  # (0.15 - 0.10) / (0.35 - 0.10), seed 1
    stats = {"seeds": [1, 2, 3], "end_sampled": [0.1, 0.2, 0.3]}
    assert credit_study.same_seeds(stats, [1]) == [0.1]
    assert credit_study.same_seeds(stats, [4]) == [0.1, 0.2, 0.3]  # none shared: all


def test_a_baseline_and_checker_recorded_by_an_earlier_report_stand_in_for_their_runs(tmp_path):
    runs = {"outcome-nf": [fake_run(s, [0.1] * 4, e, folder=tmp_path / "o") for s, e in ((1, 0.10), (2, 0.12))],
            "step-nf": [fake_run(s, [0.1, 0.2, 0.3, 0.4], e, folder=tmp_path / "s") for s, e in ((1, 0.30), (2, 0.34))],
            "step-nf-gamma": [fake_run(s, [0.1, 0.1, 0.2, 0.2], e, folder=tmp_path / "g") for s, e in ((1, 0.20), (2, 0.16))]}
    text, stats = credit_study.credit_report("sparser", list(runs), runs, window=2)
    full = [line for line in text.splitlines() if line.startswith(f"| {credit_study.CREDIT_LABELS['step-nf-gamma']} |")][0]
    # by hand: differences 0.10 and 0.04, mean +0.070, sd 0.04243, t = 0.07 / 0.03 = 2.3; share of the
    # checker's (measured, +0.21) gain 0.07 / 0.21 = 0.33; outcome's final 2-step mean 0.1 is reached at step 2
    assert "| 2, 2 | +0.070 (t 2.3, 2/2 up; too few seeds) | 0.33 |" in full
    alone, _ = credit_study.credit_report("sparser", ["step-nf-gamma"], {"step-nf-gamma": runs["step-nf-gamma"]}, window=2,
                                       recorded={a: stats[a] for a in ("outcome-nf", "step-nf")})
    assert alone.splitlines()[2] == full  # the same row from the recorded numbers as from the runs
    bare, _ = credit_study.credit_report("sparser", ["step-nf-gamma"], {"step-nf-gamma": runs["step-nf-gamma"]}, window=2)
    assert "| n/a | n/a | n/a |" in bare.splitlines()[2]  # nothing to compare with: said, not guessed


def test_gradient_report_by_hand():
    """Two constructions, four batches in 2-D. outcome: (1, 0), (1, 0), (1, 2), (1, -2): mean (1, 0);
    a batch against the other half's mean: (1, 0) vs (1, 0) -> 1, (1, +-2) vs (1, 0) -> 1/sqrt(5).
    copy: the same gradients x 3 (a scaled copy: the same directions, the same SNR)."""
    outcome = np.array([[1.0, 0.0], [1.0, 2.0], [1.0, 0.0], [1.0, -2.0]])
    got = credit_study.gradient_report({"outcome": outcome, "copy": 3 * outcome})
    # halves: batches 0, 2 = (1, 0), (1, 0) -> mean (1, 0); batches 1, 3 = (1, 2), (1, -2) -> mean (1, 0)
    expected = (2 * 1.0 + 2 / math.sqrt(5)) / 4
    for c in ("outcome", "copy"):
        r = got["per_construction"][c]
        assert r["cosine_to_outcome_mean"] == pytest.approx(expected)
        assert r["cosine_to_own_mean"] == pytest.approx(expected)
        # |mean|^2 = 1 (x 9 for copy); noise: E|g - mean|^2 = (0 + 4 + 0 + 4) / 4 = 2 (x 9): SNR 1/2
        assert r["snr"] == pytest.approx(0.5)
    assert got["per_construction"]["copy"]["mean_norm"] == pytest.approx(3.0)
    # paired by batch: a scaled copy has the same cosine on every batch, a difference of 0 each
    assert got["per_construction"]["copy"]["cosine_minus_outcome"] == pytest.approx(0.0, abs=1e-12)
    # a construction that turns batch 1 (an odd batch) to outcome-only's mean direction: its cosine
    # there is 1 instead of 1/sqrt(5); the other three batches are the same -> differences
    # (0, 1 - 1/sqrt(5), 0, 0), in the report's order (even batches first): mean and SE by hand
    turned = outcome.copy()
    turned[1] = [1.0, 0.0]
    r = credit_study.gradient_report({"outcome": outcome, "turned": turned})["per_construction"]["turned"]
    gap = 1 - 1 / math.sqrt(5)
    assert r["cosine_minus_outcome"] == pytest.approx(gap / 4)
    sd = math.sqrt((3 * (gap / 4) ** 2 + (gap - gap / 4) ** 2) / 3)
    assert r["cosine_minus_outcome_se"] == pytest.approx(sd / 2)
    assert r["cosine_minus_outcome_t"] == pytest.approx((gap / 4) / (sd / 2))
    assert got["cosine_of_means"]["outcome"]["copy"] == pytest.approx(1.0) and got["batches"] == 4


def test_policy_gradients_at_the_start_the_implicit_prm_adds_nothing(cache_dir):
    """At the SFT start the PRM is the reference: implicit rewards are 0 and PRIME's gradient is
    outcome-only's on the same rollouts; the checker's is not."""
    grads, step = credit_study.policy_gradients(None, batches=2)
    assert step == 0 and set(grads) == set(credit_study.CONSTRUCTIONS)
    assert grads["outcome"].shape[0] == 2 and np.abs(grads["outcome"]).max() > 0
    assert np.allclose(grads["implicit"], grads["outcome"], atol=1e-7)
    assert np.allclose(grads["implicit-e1"], grads["outcome"], atol=1e-7)
    assert not np.allclose(grads["step"], grads["outcome"], atol=1e-4)
    # the checker of the first wrong line is its own construction (a later slip scores 1 there)
    assert not np.allclose(grads["step-first-e1"], grads["step-e1"], atol=1e-6)
    # E4's noise reaches the gradient (and is drawn afresh for each batch)
    assert not np.allclose(grads["step-noise-e1"], grads["step-e1"], atol=1e-6)


def test_paired_from_json_reads_every_arm_against_its_baseline():
    recorded = {"sparse": {"outcome-nf": {"seeds": [1, 2], "end_sampled": [0.10, 0.20]},
                           "step-nf": {"seeds": [1, 2], "end_sampled": [0.15, 0.27]},
                           "implicit-nf-mixed": {"seeds": [2], "end_sampled": [0.19]}}}
    text = credit_study.paired_from_json(recorded)
    # step-nf: differences 0.05 and 0.07, mean 0.06, sd 0.01414, t = 0.06 / 0.01 = 6.0;
    # 95% interval 0.06 +- 12.706 x 0.01 = [-0.067, +0.187]
    assert ("| sparse | exact step checker, no filter | outcome-only, no filter | 2 | +0.060 (t 6.0, 2/2 up; "
            "too few seeds) | [-0.067, +0.187] | 0 / 0 |") in text
    assert "| sparse | PRIME, no filter, PRM on mixed groups | outcome-only, no filter | 1 | -0.010 (one seed) | n/a |" in text
    assert "| sparse | outcome-only, no filter |" not in text  # the baseline itself has no row
    assert text.endswith("0 differences with 5+ seeds and no collapse were tested (t). If none were real, the rule "
                         "(|t| >= 3, every sign alike) would make 0.0 false claims among them, |t| >= 5 0.00; "
                         "0 of them pass |t| >= 5.")


def test_paired_from_json_gives_collapses_a_sign_count_and_counts_the_family():
    seeds = [1, 2, 3, 4, 5]
    outcome = {"seeds": seeds, "end_sampled": [0.20, 0.22, 0.24, 0.26, 0.28], "start_greedy": [1.0] * 5, "end_greedy": [1.0] * 5}
    checker = {"seeds": seeds, "end_sampled": [0.25, 0.28, 0.29, 0.32, 0.33], "start_greedy": [1.0] * 5, "end_greedy": [1.0] * 5}
    collapsed = {"seeds": seeds, "end_sampled": [0.0, 0.20, 0.01, 0.0, 0.0], "start_greedy": [1.0] * 5, "end_greedy": [0.0, 0.99, 0.2, 0.0, 0.0]}
    text = credit_study.paired_from_json({"sparser": {"outcome-nf": outcome, "step-nf-e1": checker,
                                                      "implicit-nf-mixed-e1": collapsed}})
    # checker - outcome: 0.05, 0.06, 0.05, 0.06, 0.05; mean 0.054, sd 0.005477, t = 0.054 / 0.002449 = 22.0;
    # interval 0.054 +- 2.776 x 0.002449 = [+0.047, +0.061]
    assert "| checker, local | outcome-only, no filter | 5 | +0.054 (t 22.0, 5/5 up; up) | [+0.047, +0.061] | 0 / 0 |" in text
    # 4 of 5 runs below greedy 0.5: a sign count (5 of 5 down, p = 2 / 32 = 0.0625) instead of a t or an interval
    assert ("| PRIME, local | outcome-only, no filter | 5 | -0.198 (0/5 up; bimodal: sign test p 0.06, no t) | n/a | "
            "4 / 0 |") in text
    assert text.endswith("1 differences with 5+ seeds and no collapse were tested (t). If none were real, the rule "
                         "(|t| >= 3, every sign alike) would make 0.0 false claims among them, |t| >= 5 0.01; "
                         "1 of them pass |t| >= 5.")


def test_reproduce_paired_from_json_pairs_todays_runs_only():
    seeds = [1, 2, 3, 4, 5]
    today = {"steps": [70] * 5, "seed": seeds, "start_accuracy": [1.0] * 5, "end_accuracy": [1.0] * 5}
    results = {"grpo": {**today, "end_sampled": [0.70, 0.69, 0.73, 0.71, 0.71]},
               "pass-step": {**today, "end_sampled": [0.69, 0.68, 0.72, 0.71, 0.70]},
               # a collapsed seed (greedy 0.3): a sign count, no t and no interval
               "pass-implicit": {**today, "end_sampled": [0.72, 0.70, 0.74, 0.20, 0.73],
                                 "end_accuracy": [1.0, 1.0, 1.0, 0.3, 1.0]},
               "reinforce": {"seed": [1, 2, 3], "end_sampled": [0.7] * 3}}  # an earlier default: no `steps`
    text = reproduce.paired_from_json(results, ["pass", "estimators"])
    # PASS, step - GRPO: -0.01, -0.01, -0.01, 0.0, -0.01; mean -0.008, sd 0.004472, SE 0.002, t -4.0;
    # interval -0.008 +- 2.776 x 0.002 = [-0.0136, -0.0024]; one difference is 0, so 0/5 up and no claim
    assert "| pass | PASS, exact step checker | GRPO | 5 | -0.008 (t -4.0, 0/5 up; none) | [-0.014, -0.002] | 0 / 0 |" in text
    # PASS, implicit - GRPO: +0.02, +0.01, +0.01, -0.51, +0.02, mean -0.09; 4 up, 1 down: sign test p 2 x 6/32
    assert ("| pass | PASS, implicit PRM | GRPO | 5 | -0.090 (4/5 up; bimodal: sign test p 0.38, no t) | n/a | "
            "1 / 0 |") in text
    assert "| estimators | REINFORCE + implicit PRM | REINFORCE | 0 | not paired" in text
    assert "| estimators | GRPO + implicit PRM | GRPO | 0 | not paired" in text  # grpo+prm has no entry


def test_the_collapse_rule_by_hand():
    """One rule (stats.collapsed, docs/REPRODUCTION.md): a run collapsed when its greedy held-out accuracy
    ends below half its start's. Each line kills a mutant: the boundary, a start below 0.5, a fixed level."""
    assert stats.COLLAPSE == 0.5
    assert stats.collapsed(1.0, 0.49) and not stats.collapsed(1.0, 0.5)  # exactly half is not below half
    assert not stats.collapsed(0.425, 0.475)  # started below 0.5 and rose: SmolLM2's chains runs
    assert not stats.collapsed(0.425, 0.2125) and stats.collapsed(0.425, 0.21)  # its own half: 0.2125
    assert stats.collapsed(0.8, 0.39) and not stats.collapsed(0.8, 0.41)


def test_an_outcome_only_run_collapsing_and_a_low_start_in_the_paired_table():
    seeds = [1, 2, 3, 4, 5]
    today = {"steps": [70] * 5, "seed": seeds, "start_accuracy": [1.0] * 5, "end_accuracy": [1.0] * 5}
    results = {"prime": {**today, "end_sampled": [0.70, 0.69, 0.73, 0.71, 0.71]},
               # outcome-only's seed 2 collapsed (greedy 1.0 -> 0.4): the difference is bimodal
               "rloo": {**today, "end_sampled": [0.69, 0.20, 0.72, 0.70, 0.70], "end_accuracy": [1.0, 0.4, 1.0, 1.0, 1.0]},
               # every offline-PRM run started below 0.5 and rose: none collapsed, the t stands
               "prime-offline": {**today, "end_sampled": [0.72, 0.70, 0.74, 0.73, 0.73],
                                 "start_accuracy": [0.4] * 5, "end_accuracy": [0.45] * 5}}
    text = reproduce.paired_from_json(results, ["prime-vs-rloo", "online-vs-offline"])
    # PRIME - outcome-only: +0.01, +0.49, +0.01, +0.01, +0.01: 5 up, sign test 2/32
    assert "| prime-vs-rloo | PRIME | outcome-only | 5 | +0.106 (5/5 up; bimodal: sign test p 0.06, no t) | n/a | 0 / 1 |" in text
    # offline - online: +0.02, +0.01, +0.01, +0.02, +0.02: mean 0.016, sd 0.005477, t 6.5
    assert "| online-vs-offline | PRIME, offline PRM | PRIME | 5 | +0.016 (t 6.5, 5/5 up; up) |" in text
    assert text.count("| 0 / 0 |") == 1


def test_interval_quantiles_and_sign_test_by_hand():
    # Student's t 97.5% points from a printed table; above 10 degrees within 1.1% of it
    for df, q in ((1, 12.706), (4, 2.776), (10, 2.228), (12, 2.179), (20, 2.086), (30, 2.042)):
        assert stats.t975(df) == pytest.approx(q, rel=0.011)
    # 5 of 5 one way: 2 x 1/32; 4 of 5: 2 x 6/32; 3 of 5: 2 x 16/32 = 1; nothing non-zero: 1
    assert stats.sign_test_p(5, 0) == stats.sign_test_p(0, 5) == pytest.approx(2 / 32)
    assert stats.sign_test_p(4, 1) == pytest.approx(12 / 32)
    assert stats.sign_test_p(3, 2) == stats.sign_test_p(0, 0) == 1.0
    p = stats.paired({1: 0.3, 2: 0.5, 3: 0.4}, {1: 0.1, 2: 0.2, 3: 0.2})  # 0.2, 0.3, 0.2: sd 0.0577
    se = np.std([0.2, 0.3, 0.2], ddof=1) / math.sqrt(3)
    assert p["ci95"] == pytest.approx((0.7 / 3 - 4.303 * se, 0.7 / 3 + 4.303 * se))
    assert all(math.isnan(x) for x in stats.paired({1: 0.3}, {1: 0.1})["ci95"])


def test_plot_gradients_draws_every_recorded_checkpoint_from_the_json(tmp_path):
    """gradients.png is redrawn from gradients.json alone, whatever order its checkpoints were recorded in."""
    def checkpoint(cos):
        per = {c: {"cosine_to_outcome_mean": 0.2, "cosine_to_outcome_mean_se": 0.01, "snr": 0.1}
               for c in ("outcome", "implicit")}
        return {"per_construction": per, "cosine_of_means": {"outcome": {"outcome": 1.0, "implicit": cos},
                                                             "implicit": {"outcome": cos, "implicit": 1.0}}}
    recorded = {"SFT start": checkpoint(1.0), "run-s1 step 70": checkpoint(0.8), "run-s1 step 20": checkpoint(0.7)}
    path = credit_study.plot_gradients(recorded, tmp_path)
    assert path == tmp_path / "gradients.png" and path.stat().st_size > 0


def test_line_rewards_split_by_the_checkers_marks_by_hand():
    import torch
    reward = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0, 0.0], [0.5, 0.5, 1.0, 1.0, 0.0, 0.0], [9.0] * 6])
    step_ids = torch.tensor([[0, 0, 1, 1, 2, -1], [0, 1, 1, 2, -1, -1], [-1] * 6])  # row 3: an empty response
    scores = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    # row 1: two operations, its line 2 (the box, 5.0) left out; row 2: three operations, every line counts
    right, slipped = credit_study.line_rewards(reward, step_ids, scores, [2, 3, 7])
    assert right == [3.0, 1.5] and slipped == [7.0, 0.5, 1.0]
    assert credit_study.operation_count("(7+5)*3\n") == 2 and credit_study.operation_count("((2-1)*3)+10\n") == 3


def test_slip_rewards_end_to_end_on_the_default_task(cache_dir, tmp_path, monkeypatch, capsys):
    """The discriminating experiment's whole path at toy size: the arms run with kept checkpoints, the
    PRM of one step frozen, every policy's lines scored, slip.json and the paired table; a second call
    with an arm more runs and scores that arm only. The default task's shipped start stands in for
    `sparser`'s (a 30-minute build), steps 1 and 2 for 10-40, a freeze at step 1 for the one at 20."""
    monkeypatch.setitem(credit_study.SETTINGS, "sparser", [])
    monkeypatch.setattr(credit_study, "SLIP_STEPS", (0, 1, 2))
    monkeypatch.setattr(credit_study, "SLIP_PRM_STEP", 1)
    freeze = "implicit-nf-mixed-e1-freeze20"
    flags = credit_study.CREDIT_ARMS[freeze]["flags"]
    monkeypatch.setitem(credit_study.CREDIT_ARMS, freeze, {**credit_study.CREDIT_ARMS[freeze],
                                                           "flags": [*flags[:-1], "1"]})  # --prm-freeze-step 1
    monkeypatch.setattr(credit_study, "SLIP_ARMS", credit_study.SLIP_ARMS[:2])
    runs, fig = tmp_path / "runs", tmp_path / "fig"
    argv = ["--slip-rewards", "--seeds", "1", "2", "--jobs", "2", "--out", str(runs), "--cache-dir", str(cache_dir),
            "--figures", str(fig), "--sft-steps", str(SFT_STEPS), "--prompts-per-step", "8", "--eval-problems", "8",
            "--slip-problems", "6", "--slip-samples", "2"]
    credit_study.main(argv)
    first = json.loads((fig / "slip.json").read_text())
    assert {p.name for p in (runs / "slip-sparser-implicit-nf-mixed-e1-s1").glob("checkpoint-*")} == \
           {"checkpoint-1", "checkpoint-2"}  # both kept
    monkeypatch.setattr(credit_study, "SLIP_ARMS", (*credit_study.SLIP_ARMS, freeze))
    capsys.readouterr()
    credit_study.main(argv)
    stdout = capsys.readouterr().out
    assert "seed 1 outcome-nf step" not in stdout  # scored by the first call: not again
    scores = json.loads((fig / "slip.json").read_text())
    assert set(scores) == {"1", "2"}
    for seed, v in scores.items():
        assert {a: v[a] for a in first[seed]} == first[seed]
        outcome, prime, frozen = v["outcome-nf"], v["implicit-nf-mixed-e1"], v[freeze]
        assert set(outcome) == set(prime) == set(frozen) == {"0", "1", "2"}
        assert outcome["0"] == prime["0"] == frozen["0"]  # the shared start: the same samples
        assert frozen["1"] == prime["1"]  # the same run up to the freeze
        for r in (*outcome.values(), *prime.values(), *frozen.values()):
            assert r["right_lines"] + r["slipped_lines"] > 0 and 0 <= r["accuracy"] <= 1
            assert r["slips_per_response"] == r["slipped_lines"] / 12
    import torch  # the frozen arm's PRM after the freeze is the PRM the lines were scored with
    state = lambda run, step: torch.load(runs / run / f"checkpoint-{step}" / "state.pt", weights_only=False)["prm"]  # noqa: E731
    scorer, held = state("slip-sparser-implicit-nf-mixed-e1-s1", 1), state(f"slip-sparser-{freeze}-s1", 2)
    assert all(torch.equal(scorer[k], held[k]) for k in scorer)
    rows = [line for line in stdout.splitlines() if line.startswith("| PRIME, local")]
    assert len(rows) == 3 and all("/2 up" in row and "unchecked" not in row for row in rows)
    assert all(0 <= r["greedy"] <= 1 for v in scores.values() for a in v.values() for r in a.values())


def slip_scores_by_hand(slipped: dict, greedy: dict) -> dict:
    """slip.json's shape for 5 seeds: each arm's slipped-line reward at each step (its right lines 0,
    one slip per response), and its greedy accuracy at step 0 and at the end ({arm: (start, [end by seed])})."""
    out = {}
    for seed in range(1, 6):
        out[str(seed)] = {arm: {str(step): {"slip_reward": slipped[arm][seed - 1] * step / 40, "right_reward": 0.0,
                                            "slips_per_response": 1.0, "accuracy": 0.1,
                                            **({"greedy": greedy[arm][0] if step == 0 else greedy[arm][1][seed - 1]}
                                               if greedy else {})}
                                for step in credit_study.SLIP_STEPS} for arm in slipped}
    return out


def test_the_slip_tests_verdict_applies_the_collapse_rule_at_step_40():
    """credit_study.slip_report: the step-40 slipped-line difference gets the one rule's verdict; a
    collapsed run on either side (greedy below half its start's: PRIME's, or outcome-only's) turns it
    into a sign count; exactly half is no collapse; without greedy accuracy there is no verdict. The
    earlier steps are numbers only."""
    prime, outcome = "implicit-nf-mixed-e1", "outcome-nf"
    slipped = {prime: [1.0, 1.1, 0.9, 1.2, 1.0], outcome: [0.0, 0.05, -0.05, 0.1, 0.0]}
    fine = {prime: (1.0, [0.5, 0.9, 0.9, 0.9, 0.9]), outcome: (1.0, [1.0] * 5)}  # 0.5 = half: not below it
    row = lambda table: [r for r in table.splitlines() if r.startswith("| PRIME, local - outcome-only")][0]  # noqa: E731
    cells = [c.strip() for c in row(credit_study.slip_report(slip_scores_by_hand(slipped, fine))).strip("|").split("|")]
    # differences 1.0, 1.05, 0.95, 1.1, 1.0: mean 1.02, sd 0.0570, t = 1.02 / (0.0570 / sqrt 5) = 40.0
    assert cells[1] == "+1.020 (t 40.0, 5/5 up; up)" and cells[2] == "[+0.949, +1.091]" and cells[3] == "0 / 0"
    assert "(t" not in cells[-1] and cells[-1].count("5/5 up") == 3  # steps 10-30: numbers, no verdict
    prime_fell = {**fine, prime: (1.0, [0.49, 0.9, 0.9, 0.9, 0.9])}
    cells = row(credit_study.slip_report(slip_scores_by_hand(slipped, prime_fell))).split("|")
    assert "bimodal: sign test p 0.06, no t" in cells[2] and cells[3].strip() == "n/a" and cells[4].strip() == "1 / 0"
    outcome_fell = {**fine, outcome: (0.8, [0.8, 0.39, 0.8, 0.8, 0.8])}  # below half of its own start
    cells = row(credit_study.slip_report(slip_scores_by_hand(slipped, outcome_fell))).split("|")
    assert "bimodal" in cells[2] and cells[4].strip() == "0 / 1"
    cells = row(credit_study.slip_report(slip_scores_by_hand(slipped, {}))).split("|")
    assert "no greedy accuracy recorded: collapses unchecked, no verdict" in cells[2] and "up;" not in cells[2]


def test_plots_from_json_draws_every_study_figure_from_the_shipped_numbers(tmp_path):
    """The study's figures in docs/REPRODUCTION.md come from credit.json alone: every arm they show must
    be recorded there (a renamed or dropped arm fails here, not in a reader's browser)."""
    shutil.copy(REPO / "docs/figures/e1/credit.json", tmp_path / "credit.json")
    shutil.copy(REPO / "docs/figures/e1/gradients.json", tmp_path / "gradients.json")
    credit_study.main(["--plots-from-json", "--figures", str(tmp_path)])
    assert (tmp_path / "gradients.png").stat().st_size > 10_000
    for name in credit_study.ENDS_FIGURES:
        assert (tmp_path / f"ends-{name}.png").stat().st_size > 10_000, name
    with pytest.raises(ValueError, match=r"figure 'sparser-k' needs sparser arms that credit.json lacks: \['outcome-nf-k2'"):
        credit_study.ends_plot("sparser-k", {"sparser": {"outcome-nf": {}}}, tmp_path)
    assert credit_study.checkpoint_label("credit-sparser-implicit-nf-mixed-e1-s2 step 20") == "PRIME, local, seed 2, step 20"
    assert credit_study.checkpoint_label("prime-s1 step 70") == "PRIME, seed 1, step 70"


def claim_cells(printed: tuple[str, str, str]) -> list[str]:
    """A printer's (difference text, interval, runs collapsed) as the claims table writes it: points with
    one decimal, t with one, the verdict bold at |t| >= 5; a collapsed pair as its sign count."""
    text, interval, fell = printed
    diff, t, up, seeds, rest = re.match(r"([+-]\d+\.\d+) \((?:t (\S+), )?(\d+)/(\d+) up; (.*)\)$", text).groups()
    points = f"{100 * float(diff):+.1f}"
    if "bimodal" in rest:
        p = re.search(r"p (\d\.\d\d)", rest).group(1)
        return [points, f"collapsed ({fell.split(' / ')[0]} of {seeds} runs)", "", f"{up}/{seeds}, p {p}", "none"]
    lo, hi = (100 * float(x) for x in interval.strip("[]").split(", "))
    strong = rest in ("up", "down") and abs(float(t)) >= stats.CLAIM_T_STRONG
    return [points, f"[{lo:+.1f}, {hi:+.1f}]", f"{float(t):.1f}", f"{up}/{seeds}", f"**{rest}**" if strong else rest]


def printed_pairs(text: str, section: str) -> dict:
    """(section, setting, arm, against) -> (difference text, interval, runs collapsed) of a printer's table."""
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[3].isdigit():
            setting = cells[0] if section == "4" else "default"
            out[(section, setting, cells[1], cells[2])] = (cells[4], cells[5], cells[6])
    return out


def test_every_row_of_the_claims_table_is_what_the_printers_print():
    """docs/REPRODUCTION.md's table of claims, row by row, against what the code prints from the shipped
    JSON: sections 2 and 4 by the two --paired-from-json printers, section 3 by real_study's verdicts and
    lora_verdicts and stats.paired on the untuned runs, the slip test by credit_study.slip_report (its
    differences are rewards, not points: two decimals)."""
    figures = REPO / "docs" / "figures"
    printed = printed_pairs(reproduce.paired_from_json(json.loads((figures / "results.json").read_text()),
                                                       list(reproduce.COMPARISONS)), "2")
    printed |= printed_pairs(credit_study.paired_from_json(json.loads((figures / "e1" / "credit.json").read_text())), "4")
    study = json.loads((figures / "real" / "study.json").read_text())
    for task, setting in (("sums2", "SmolLM2, two-digit sums, tuned per arm"),
                          ("chains", "SmolLM2, five-number chains with steps, tuned per arm")):
        v = real_study.verdicts(task, study)["end sampled"]
        printed[("3", setting, "PRIME", "outcome-only")] = (v["text"], v["interval"], "0 / 0")
    for k in real_study.lora_seed_factors("sums2", study):
        lora = f"SmolLM2, two-digit sums, tuned, LoRA rank 16 at lr x{k} against full fine-tuning"
        for arm, v in real_study.lora_verdicts("sums2", study, k).items():
            label = real_study.LABELS[arm]
            printed[("3", lora, f"{label}, LoRA", f"{label}, full FT")] = (v["end sampled"]["text"],
                                                                         v["end sampled"]["interval"], "0 / 0")
    untuned = json.loads((figures / "real" / "smollm2-sums2.json").read_text())
    ends = {arm: {int(name.rsplit("-s", 1)[1]): run["summary"]["end_sampled_accuracy"]
                  for name, run in untuned.items() if name.startswith(f"{arm}-s")} for arm in ("prime", "rloo")}
    text, interval = stats.paired_cells(stats.paired(ends["prime"], ends["rloo"]), False)
    printed[("3", "SmolLM2, two-digit sums, untuned", "PRIME", "outcome-only")] = (text, interval, "0 / 0")

    slip = "sparser, slip test: the frozen PRM's reward on slipped lines at step 40"
    slip_rows = [[c.strip() for c in line.strip("|").split("|")] for line in credit_study.slip_report(
        json.loads((figures / "e1" / "slip.json").read_text())).splitlines()[2:]]
    assert len(slip_rows) == 3
    for pair, cell, interval, fell, *_ in slip_rows:
        arm, against = pair.split(" - ")
        printed[("4", slip, arm, against)] = ("slip", cell, interval, fell)

    page = (REPO / "docs" / "REPRODUCTION.md").read_text()
    table = page[page.index("| § | setting | arm | against |"):].split("\n\n")[0].splitlines()[2:]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table]
    checked = 0
    for section, setting, arm, against, *cells in rows:
        key = (section.split(".")[0], setting, arm, against)
        if setting == slip:  # a reward difference (two decimals); every such run collapsed: a sign count
            _, cell, interval, fell = printed[key]
            found = re.match(r"([+-][\d.]+) \((\d)/5 up; bimodal: sign test p ([\d.]+), no t\)", cell)
            assert found and interval == "n/a", cell
            assert cells == [f"{float(found.group(1)):+.2f}", f"collapsed ({fell.split(' / ')[0]} of 5 runs)", "",
                             f"{found.group(2)}/5, p {found.group(3)}", "none"], key
        elif arm == "each of its 5 other arms":  # the default's other arms against outcome-only, in one row
            others = [v for k, v in printed.items() if k[:2] == ("4", "default") and k[3] == against]
            assert len(others) == 5
            diffs = [100 * float(v[0].split()[0]) for v in others]
            lows = [100 * float(v[1].strip("[]").split(", ")[0]) for v in others]
            highs = [100 * float(v[1].strip("[]").split(", ")[1]) for v in others]
            ts = [abs(float(re.search(r"t (\S+),", v[0]).group(1))) for v in others]
            assert cells == [f"{min(diffs):+.1f} to {max(diffs):+.1f}", f"within [{min(lows):+.1f}, {max(highs):+.1f}]",
                             f"at most {max(ts):.1f}", "", "none"]
            assert all(v[0].endswith("; none)") for v in others)
        else:
            assert key in printed, f"row {key}: no printer prints this pair"
            assert cells == claim_cells(printed[key]), key
        checked += 1
    assert checked == len(rows) >= 45
    # each comparison once: no pair stands in two rows
    assert len({tuple(r[:4]) for r in rows}) == len(rows)


def test_reproductions_lora_tables_and_their_seconds_are_what_real_study_prints():
    """REPRODUCTION.md 3.2 quotes real_study's LoRA tables at the chosen factor verbatim, seconds a step and
    by part included, and its appendix those of every other factor with seeds: every figure there is
    recomputed from study.json (a rerun recorded there, or a changed printer, fails here)."""
    study = json.loads((REPO / "docs" / "figures" / "real" / "study.json").read_text())
    page = (REPO / "docs" / "REPRODUCTION.md").read_text()
    appendix = (REPO / "docs" / "REPRODUCTION-runs.md").read_text()
    chosen = real_study.lora_factor("sums2", study)
    factors = real_study.lora_seed_factors("sums2", study)
    assert chosen in factors and len(factors) >= 2
    for k in factors:
        where = page if k == chosen else appendix
        for table in (real_study.lora_table("sums2", study, k), real_study.lora_time_parts("sums2", study, k)):
            for line in filter(None, table.splitlines()):
                assert line in where, (k, line)
