"""real_study.py (`python studies/reproduce.py real`): the protocol's order, its choices and its verdicts by hand,
on study.json records; the runs themselves are tested end to end in tests/test_real_model.py."""

import json
import math

import numpy as np
import pytest

import real_study
import runlog
import runner


def recorded(arm, seed, sampled, greedy=(0.5, 0.5), prm=None, setting=None):
    """A study.json entry of this arm, seed and setting (its lrs), with these held-out curves (start, ..., end)."""
    setting = {k: v for k, v in (setting or {}).items() if k not in ("arm", "seed")}
    return {"setting": dict(arm=arm, seed=seed, **setting), "curves": {
        "heldout_sampled": list(sampled), "heldout_greedy": list(greedy), "eval_step": [0, 50][:len(sampled)],
        "prm_accuracy": prm or [None] * 3, "train_seconds": [60.0, 120.0, 180.0], "reward": [0.1, 0.2, 0.3]}}


def test_the_lr_grid_comes_first_and_the_best_validation_score_is_chosen():
    study = {"runs": {}}
    names = [name for name, _ in real_study.grid_runs("chains", "lr", study)]
    assert names == [f"chains-lr-rloo-{lr}-s1" for lr in real_study.LR_GRID]
    assert real_study.grid_runs("chains", "prm", study) is None      # waits for the lr grid
    assert real_study.grid_runs("chains", "seeds", study) is None
    # scores: the mean of the last 3 validation evaluations; the second lr wins by (0.4 + 0.5 + 0.6) / 3 = 0.5
    curves = [[0.2, 0.3, 0.3, 0.4, 0.4], [0.2, 0.2, 0.4, 0.5, 0.6], [0.2, 0.6, 0.5, 0.45, 0.45]]
    for name, lr, c in zip(names[:2], real_study.LR_GRID, curves):
        study["runs"][name] = recorded("rloo", 1, c, setting={"policy_lr": lr})
    assert real_study.choice("chains", "lr", study) is None          # one grid run still missing
    study["runs"][names[2]] = recorded("rloo", 1, curves[2], setting={"policy_lr": real_study.LR_GRID[2]})
    assert real_study.score(study["runs"][names[1]]) == pytest.approx(0.5)
    assert real_study.score(study["runs"][names[2]]) == pytest.approx((0.5 + 0.45 + 0.45) / 3)
    assert real_study.choice("chains", "lr", study) == {"policy_lr": real_study.LR_GRID[1]}
    # the PRM grid runs at the chosen policy lr: PRM lr 1x and 3x it, beta 0.05 and 1.0
    lr = float(real_study.LR_GRID[1])
    prm = real_study.grid_runs("chains", "prm", study)
    assert [(float(s["prm_lr"]), s["beta"]) for _, s in prm] == [
        (pytest.approx(lr), "0.05"), (pytest.approx(lr), "1.0"), (pytest.approx(3 * lr), "0.05"), (pytest.approx(3 * lr), "1.0")]
    assert all(s["policy_lr"] == real_study.LR_GRID[1] and s["arm"] == "prime" for _, s in prm)
    # a tie goes to the earlier setting in grid order
    for (name, s), end in zip(prm, [0.3, 0.7, 0.7, 0.1]):
        study["runs"][name] = recorded("prime", 1, [0.2, end, end, end], setting=s)
    assert real_study.choice("chains", "prm", study)["beta"] == "1.0"
    assert float(real_study.choice("chains", "prm", study)["prm_lr"]) == pytest.approx(lr)
    seeds = real_study.grid_runs("chains", "seeds", study)
    assert len(seeds) == 10 and {s["seed"] for _, s in seeds} == {1, 2, 3, 4, 5}
    assert {(s["arm"], s.get("beta")) for _, s in seeds} == {("rloo", None), ("prime", "1.0")}
    # each arm's train.py flags: outcome-only has no PRM; PRIME carries its chosen PRM lr and beta
    rloo = dict(seeds)["chains-rloo-s1"]
    assert real_study.arm_flags(rloo) == ["--policy-lr", real_study.LR_GRID[1], "--process", "none"]
    assert real_study.arm_flags(dict(seeds)["chains-prime-s1"])[-2:] == ["--beta", "1.0"]


def test_a_best_lr_at_the_grids_edge_extends_the_grid_past_it_until_the_best_is_inside(monkeypatch):
    study = {"runs": {}}
    lr_run = lambda lr, end: recorded("rloo", 1, [0.1, end, end, end], setting={"policy_lr": lr})  # noqa: E731
    for lr, end in zip(real_study.LR_GRID, [0.3, 0.5, 0.6]):  # 3e-6, 1e-5, 3e-5: the top edge wins
        study["runs"][f"sums2-lr-rloo-{lr}-s1"] = lr_run(lr, end)
    assert real_study.LR_GRID == ["3e-6", "1e-5", "3e-5"]
    assert real_study.lr_grid("sums2", study) == ["3e-6", "1e-5", "3e-5", "1e-4"]
    assert real_study.choice("sums2", "lr", study) is None and real_study.grid_runs("sums2", "prm", study) is None
    assert real_study.next_run(["sums2"], real_study.PHASES, study, set())[2] == "sums2-lr-rloo-1e-4-s1"
    study["runs"]["sums2-lr-rloo-1e-4-s1"] = lr_run("1e-4", 0.6)  # a tie with 3e-5: the lower lr is chosen
    assert real_study.lr_grid("sums2", study) == ["3e-6", "1e-5", "3e-5", "1e-4"]
    assert real_study.choice("sums2", "lr", study) == {"policy_lr": "3e-5"}
    # the bottom edge: 3e-6 wins, 1e-6 is tried, wins too, and the ladder ends there
    study = {"runs": {f"chains-lr-rloo-{lr}-s1": lr_run(lr, end)
                      for lr, end in zip(["1e-6", *real_study.LR_GRID], [0.7, 0.6, 0.5, 0.4])}}
    assert real_study.lr_grid("chains", study) == ["1e-6", "3e-6", "1e-5", "3e-5"]
    assert real_study.choice("chains", "lr", study) == {"policy_lr": "1e-6"}
    # the top of the ladder: 3e-4 wins and nothing is left to try
    ladder = real_study.LR_LADDER[1:]
    study = {"runs": {f"sums2-lr-rloo-{lr}-s1": lr_run(lr, 0.1 * i) for i, lr in enumerate(ladder)}}
    assert real_study.lr_grid("sums2", study) == ladder and real_study.choice("sums2", "lr", study) == {
        "policy_lr": "3e-4"}
    # a grid of one lr (as the shortened end-to-end test sets it) has no neighbour to beat: it stays one
    monkeypatch.setattr(real_study, "LR_GRID", ["1e-5"])
    study = {"runs": {"sums2-lr-rloo-1e-5-s1": lr_run("1e-5", 0.5)}}
    assert real_study.lr_grid("sums2", study) == ["1e-5"]
    assert real_study.choice("sums2", "lr", study) == {"policy_lr": "1e-5"}


def test_next_run_goes_phase_by_phase_over_tasks_and_skips_what_is_recorded_or_running():
    study = {"runs": {}}
    tasks = ["chains", "sums2"]
    first = real_study.next_run(tasks, real_study.PHASES, study, busy=set())
    assert first[:3] == ("chains", "lr", f"chains-lr-rloo-{real_study.LR_GRID[0]}-s1")
    busy = {f"chains-lr-rloo-{lr}-s1" for lr in real_study.LR_GRID}
    assert real_study.next_run(tasks, real_study.PHASES, study, busy)[:2] == ("sums2", "lr")  # the other task's grid
    for name, setting in real_study.grid_runs("chains", "lr", study):
        study["runs"][name] = recorded("rloo", 1, [0.1, 0.2, 0.3], setting=setting)
    assert real_study.next_run(tasks, real_study.PHASES, study, set())[:2] == ("sums2", "lr")
    assert real_study.next_run(tasks, ["prm"], study, set())[:2] == ("chains", "prm")    # --phases prm
    assert real_study.next_run(["sums2"], ["prm", "seeds"], study, set()) is None          # nothing can start


def test_the_verdict_pairs_seeds_and_a_collapsed_run_gets_a_sign_count():
    # sampled ends: PRIME 0.40, 0.45, 0.50, 0.42, 0.47 against outcome-only 0.35, 0.40, 0.41, 0.40, 0.40
    # differences 0.05, 0.05, 0.09, 0.02, 0.07: mean 0.056, sd by hand below
    prime_end, rloo_end = [0.40, 0.45, 0.50, 0.42, 0.47], [0.35, 0.40, 0.41, 0.40, 0.40]
    study = {"runs": {}}
    for seed, (p, r) in enumerate(zip(prime_end, rloo_end), 1):
        study["runs"][f"chains-prime-s{seed}"] = recorded("prime", seed, [0.2, p], prm=[0.6, 0.7, 0.8])
        study["runs"][f"chains-rloo-s{seed}"] = recorded("rloo", seed, [0.2, r])
    for phase, arm in (("lr", "rloo"), ("prm", "prime")):  # the grid's records, so that the seeds phase exists
        for name, s in real_study.grid_runs("chains", phase, study):
            study["runs"][name] = recorded(arm, 1, [0.1, 0.2, 0.3], setting=s)
    diffs = [0.05, 0.05, 0.09, 0.02, 0.07]
    mean = sum(diffs) / 5
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 4)
    v = real_study.verdicts("chains", study)["end sampled"]
    assert v["mean"] == pytest.approx(0.056) and v["t"] == pytest.approx(mean / (sd / math.sqrt(5)))
    assert v["verdict"] == "up" and v["up"] == 5 and not v["collapsed"]
    lo, hi = v["ci95"]
    assert (lo + hi) / 2 == pytest.approx(mean) and hi - lo == pytest.approx(2 * 2.776 * sd / math.sqrt(5))
    # greedy: every run ends where it started (0.5): no difference, no claim
    assert real_study.verdicts("chains", study)["end greedy"]["verdict"] == "none"
    # a PRIME run whose greedy accuracy ends below half its start has collapsed: the sampled
    # difference is then bimodal and gets the sign count, not a t
    study["runs"]["chains-prime-s3"]["curves"]["heldout_greedy"] = [0.5, 0.2]
    v = real_study.verdicts("chains", study)["end sampled"]
    assert v["collapsed"] and "bimodal" in v["text"] and v["interval"] == "n/a"
    assert real_study.collapsed(study["runs"]["chains-prime-s3"]) and not real_study.collapsed(study["runs"]["chains-prime-s1"])
    table = real_study.seeds_table("chains", study)
    assert "| PRIME | 5 |" in table and "1 of 5" in table and "0.70" in table   # PRM pairwise: mean of 0.6, 0.7, 0.8
    assert np.isclose(float(table.split("| outcome-only | 5 | 0.500 -> 0.500 | 0.200 -> ")[1][:5]), np.mean(rloo_end))
    # the collapsed run had a mixed group on one of its last 3 steps: the PRM's accuracy is pooled over the
    # steps that have one, 4 x (0.6, 0.7, 0.8) and 1.0, (4 x 2.1 + 1.0) / 13 = 0.723, and says so
    study["runs"]["chains-prime-s3"]["curves"]["prm_accuracy"] = [None, None, 1.0]
    table = real_study.seeds_table("chains", study)
    rows = {line.split(" | ")[0]: line for line in table.splitlines() if line.startswith("| ")}
    assert "| 0.72 (13 of 15 steps) |" in rows["| PRIME"] and "| n/a |" in rows["| outcome-only"]


def test_a_seed_whose_two_arms_started_from_different_weights_is_not_paired():
    # PRIME ends 0.40, 0.45, 0.50 against outcome-only 0.35, 0.40, 0.41; seed 3's PRIME run started from a
    # rebuilt SFT (another sha256): only seeds 1 and 2 pair, differences 0.05 and 0.05, mean 0.05, sd 0
    study = {"runs": {}}
    for seed, (p, r) in enumerate(zip([0.40, 0.45, 0.50], [0.35, 0.40, 0.41]), 1):
        study["runs"][f"chains-prime-s{seed}"] = {**recorded("prime", seed, [0.2, p]), "start_sha256": "aaaa1111",
                                                  "data_sha256": "d"}
        study["runs"][f"chains-rloo-s{seed}"] = {**recorded("rloo", seed, [0.2, r]), "start_sha256": "aaaa1111",
                                                 "data_sha256": "d"}
    for phase, arm in (("lr", "rloo"), ("prm", "prime")):
        for name, s in real_study.grid_runs("chains", phase, study):
            study["runs"][name] = recorded(arm, 1, [0.1, 0.2, 0.3], setting=s)
    v = real_study.verdicts("chains", study)["end sampled"]
    assert v["seeds"] == [1, 2, 3] and v["mismatched"] == [] and v["mean"] == pytest.approx((0.05 + 0.05 + 0.09) / 3)
    study["runs"]["chains-prime-s3"]["start_sha256"] = "bbbb2222"
    v = real_study.verdicts("chains", study)["end sampled"]
    assert v["seeds"] == [1, 2] and v["mismatched"] == [3] and v["mean"] == pytest.approx(0.05)
    assert v["means"]["prime"] == pytest.approx(0.45)  # each arm's own mean still counts every run it has
    table = real_study.seeds_table("chains", study)
    assert "not paired (the two arms started from different weights): seeds [3]" in table
    assert "aaaa1111: outcome-only 1, outcome-only 2, outcome-only 3, PRIME 1, PRIME 2; bbbb2222: PRIME 3" in table
    # a different task file is a different start too
    study["runs"]["chains-prime-s3"]["start_sha256"] = "aaaa1111"
    study["runs"]["chains-rloo-s2"]["data_sha256"] = "e"
    assert real_study.verdicts("chains", study)["end greedy"]["mismatched"] == [2]


@pytest.mark.parametrize("layout", ["link", "folder"])
def test_a_recorded_run_loses_its_resume_checkpoint_but_stays_finished(tmp_path, layout):
    """The protocol drops a recorded run's checkpoint (GBs of Adam moments, runlog.drop_checkpoints);
    the run must still read as finished, or the next call would train it again from the start.
    "folder": a run from before `checkpoint` was a link."""
    run = tmp_path / "sums2-lr-rloo-1e-4-s1"
    for folder in ("checkpoint-30", "checkpoint-40", "final"):  # 30: what a kill mid-save leaves behind
        (run / folder).mkdir(parents=True)
        (run / folder / "state.pt").write_bytes(b"x")
    if layout == "link":
        runlog.point_checkpoint_at(run, "checkpoint-40")
    else:
        (run / "checkpoint-40").rename(run / "checkpoint")
    (run / "summary.json").write_text(json.dumps({"start_accuracy": 0.1, "end_accuracy": 0.5}))
    assert (run / "checkpoint" / "state.pt").exists()
    runlog.drop_checkpoints(run)
    assert sorted(p.name for p in run.iterdir()) == ["final", "summary.json"]
    assert runner.finished(run)


def test_code_version_names_the_commit_and_a_change_to_code_but_not_to_docs(tmp_path, monkeypatch):
    import subprocess
    git = lambda *a: subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True, text=True)  # noqa: E731
    monkeypatch.setattr(real_study, "REPO", tmp_path)
    assert real_study.code_version() == "unknown"   # not a git checkout
    (tmp_path / "docs").mkdir()
    (tmp_path / "verify.py").write_text("x = 1\n")
    (tmp_path / "docs" / "study.json").write_text("{}\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    head = git("rev-parse", "--short=12", "HEAD").stdout.strip()
    assert real_study.code_version() == head
    (tmp_path / "docs" / "study.json").write_text('{"runs": {}}\n')  # a run just recorded: still the same code
    (tmp_path / "notes.txt").write_text("untracked\n")
    assert real_study.code_version() == head
    (tmp_path / "verify.py").write_text("x = 2\n")
    assert real_study.code_version() == head + "+changes"


def test_the_seeds_table_pools_right_answers_with_a_wrong_step_over_the_runs_that_logged_it():
    # PRIME seed 1 logs [0.2, None, 0.4], seed 2 [0.1, 0.1, 0.1], seed 3 ran before train.py logged it
    # (no key); outcome-only logged only None (no right response on any step). PRIME: (0.2 + 0.4 + 0.3) / 5
    # values = 0.18 over 6 steps of 2 seeds; outcome-only: n/a, 0 seeds
    study = {"runs": {}}
    for phase, arm in (("lr", "rloo"), ("prm", "prime")):
        for name, s in real_study.grid_runs("chains", phase, study):
            study["runs"][name] = recorded(arm, 1, [0.1, 0.2, 0.3], setting=s)
    for seed, values in ((1, [0.2, None, 0.4]), (2, [0.1, 0.1, 0.1]), (3, None)):
        study["runs"][f"chains-prime-s{seed}"] = recorded("prime", seed, [0.2, 0.3])
        study["runs"][f"chains-rloo-s{seed}"] = recorded("rloo", seed, [0.2, 0.3])
        study["runs"][f"chains-rloo-s{seed}"]["curves"]["right_with_wrong_step"] = [None] * 3
        if values:
            study["runs"][f"chains-prime-s{seed}"]["curves"]["right_with_wrong_step"] = values
    rows = {line.split(" | ")[0]: line for line in real_study.seeds_table("chains", study).splitlines()
            if line.startswith("| ")}
    assert "| 0.18 (5 of 6 steps) (2 seeds) |" in rows["| PRIME"]
    assert "| n/a | n/a (0 seeds) |" in rows["| outcome-only"]


def test_the_report_draws_each_tasks_seeds_from_study_json_alone(tmp_path, capsys):
    """`studies/reproduce.py real --report-only`: the tables and the seeds plot from a study.json, with a run that
    logged right_with_wrong_step beside one recorded before train.py logged it; nothing before the seeds."""
    study = {"runs": {}}
    for phase, arm in (("lr", "rloo"), ("prm", "prime")):
        for name, s in real_study.grid_runs("chains", phase, study):
            study["runs"][name] = recorded(arm, 1, [0.1, 0.2, 0.3], setting=s)
    runlog.write_json(tmp_path / "study.json", study)
    real_study.report(["chains"], tmp_path)
    assert not list(tmp_path.glob("study-*.png"))  # no seed run yet: no plot
    for seed in (1, 2):
        study["runs"][f"chains-prime-s{seed}"] = recorded("prime", seed, [0.2, 0.3], prm=[0.6, 0.7, 0.8])
        study["runs"][f"chains-rloo-s{seed}"] = recorded("rloo", seed, [0.2, 0.25])
    study["runs"]["chains-prime-s2"]["curves"]["right_with_wrong_step"] = [0.3, None, 0.1]
    for seed in (1, 2):  # 3 steps (recorded's train_seconds), evaluated at the start and the end
        for arm in ("prime", "rloo"):
            study["runs"][f"chains-{arm}-s{seed}"]["curves"]["eval_step"] = [0, 3]
    runlog.write_json(tmp_path / "study.json", study)
    real_study.report(["chains"], tmp_path)
    out = capsys.readouterr().out
    assert "## 3. five seeds an arm" in out and "| PRIME | 2 |" in out and "0.20 (2 of 3 steps) (1 seed)" in out
    assert (tmp_path / "study-chains.png").stat().st_size > 10_000


def test_the_lora_phases_scale_the_full_choices_and_pair_each_arm_with_its_full_runs():
    """sums2 only: the LoRA lr grid is the full-FT choice x LORA_FACTORS; the LoRA seeds run both arms at
    the chosen factor, PRIME's PRM lr scaled by it and its beta kept; lora_table pairs each arm's LoRA run
    with the same arm's full-FT run of the same seed, by hand."""
    study = {"runs": {}}
    full = {"rloo": {"policy_lr": "1e-5"}, "prime": {"policy_lr": "1e-5", "prm_lr": "3e-5", "beta": "0.05"}}
    for name, _ in real_study.grid_runs("sums2", "lr", study):
        study["runs"][name] = recorded("rloo", 1, [0.1, 0.2, 0.2, 0.2], setting={"policy_lr": "1e-5"})
    for name, s in real_study.grid_runs("sums2", "prm", study):
        study["runs"][name] = recorded("prime", 1, [0.1, 0.2, 0.2, 0.2], setting=s)
    lr = float(real_study.choice("sums2", "lr", study)["policy_lr"])
    prm = real_study.choice("sums2", "prm", study)
    assert real_study.grid_runs("chains", "lora-lr", study) == []  # LoRA's comparison is on sums2 alone
    grid = real_study.grid_runs("sums2", "lora-lr", study)
    assert [float(s["policy_lr"]) for _, s in grid] == [pytest.approx(k * lr) for k in real_study.LORA_FACTORS]
    assert real_study.grid_runs("sums2", "lora-seeds", study) is None  # waits for the LoRA lr grid
    for (name, s), end in zip(grid, [0.3, 0.6, 0.4]):  # x3 wins
        study["runs"][name] = recorded("rloo", 1, [0.1, end, end, end], setting=s)
    assert real_study.lora_factors("sums2", study) == list(real_study.LORA_FACTORS)  # an inside best: no extension
    seeds = dict(real_study.grid_runs("sums2", "lora-seeds", study))
    assert len(seeds) == 10 and real_study.lora_factor("sums2", study) == 3
    assert float(seeds["sums2-lora-x3-rloo-s1"]["policy_lr"]) == pytest.approx(3 * lr)
    assert float(seeds["sums2-lora-x3-prime-s2"]["prm_lr"]) == pytest.approx(3 * float(prm["prm_lr"]))
    assert seeds["sums2-lora-x3-prime-s2"]["beta"] == prm["beta"]
    assert real_study.arm_flags(seeds["sums2-lora-x3-rloo-s1"])[2:4] == ["--lora-rank", real_study.LORA_RANK]
    # five seeds of each: LoRA's outcome-only ends 0.02 above full in every seed, PRIME's mixed
    for seed in range(1, 6):
        for arm, lora_end, full_end in (("rloo", 0.62, 0.60), ("prime", 0.5 + 0.01 * seed, 0.53)):
            setting = {**full[arm]}
            study["runs"][f"sums2-{arm}-s{seed}"] = recorded(arm, seed, [0.1, full_end], (0.9, 0.9), setting=setting)
            study["runs"][f"sums2-lora-x3-{arm}-s{seed}"] = recorded(arm, seed, [0.1, lora_end], (0.9, 0.9),
                                                                     setting=seeds[f"sums2-lora-x3-{arm}-s{seed}"])
            study["runs"][f"sums2-{arm}-s{seed}"]["summary"] = {"steps": 3, "machine": "CPU B, 2 threads"}
            study["runs"][f"sums2-lora-x3-{arm}-s{seed}"]["summary"] = {"steps": 3, "machine": "CPU A, 1 threads"}
    rows = real_study.lora_table("sums2", study, 3).splitlines()[2:]
    assert rows[0].startswith("| outcome-only | 5 / 5 | 0.620 / 0.600 | +0.020 (t inf, 5/5 up; up) |")
    # PRIME: differences -0.02, -0.01, 0, +0.01, +0.02: mean 0, 2 up
    assert "| +0.000 (t 0.0, 2/5 up; none) |" in rows[1]
    assert "| not on one machine yet |" in rows[0]  # seconds a step are not compared across machines
    # lora-timing: full FT's seed 1 of each arm again, at its seeds-phase setting, on the LoRA runs' machine
    timing = dict(real_study.grid_runs("sums2", "lora-timing", study))
    assert timing == {"sums2-lora-timing-full-rloo-s1": dict(arm="rloo", seed=1, **full["rloo"]),
                      "sums2-lora-timing-full-prime-s1": dict(arm="prime", seed=1, **prm)}
    assert "lora-timing" not in real_study.VALIDATION_PHASES  # held-out questions, as the seeds it repeats
    for name, s in timing.items():
        study["runs"][name] = recorded(s["arm"], 1, [0.1, 0.59], (0.9, 0.8), setting=s)
        study["runs"][name]["curves"]["train_seconds"] = [30.0, 1030.0, 1060.0]  # step 2 paused for 1000 s
        study["runs"][name]["summary"] = {"steps": 3, "machine": "CPU A, 1 threads"}
    table = real_study.lora_table("sums2", study, 3)
    # the median step: 60 s of LoRA's 60, 60, 60; 30 s of full FT's 30, 1000, 30 (a mean would say 353.3)
    assert "| 60.0 / 30.0 (CPU A, 1 threads) |" in table.splitlines()[2]
    assert ("outcome-only, full FT, seed 1 run again on CPU A, 1 threads: held-out sampled 0.590, greedy 0.800 "
            "(recorded: 0.600, 0.900, on CPU B, 2 threads)") in table


def test_the_lora_grid_extends_past_a_winning_edge_and_seeds_at_an_earlier_choice_stay_reported():
    """The LoRA lr grid follows the lr grid's rule (real_study.extended): x10 winning at the top of
    LORA_FACTORS adds x30; x30 winning adds x100; x100 losing ends it, x30 chosen. The seeds' names hold
    their factor, so seeds recorded at x10 (before the grid grew) are neither taken for x30's nor lost."""
    study = {"runs": {}}
    for name, _ in real_study.grid_runs("sums2", "lr", study):
        study["runs"][name] = recorded("rloo", 1, [0.1, 0.2, 0.2, 0.2], setting={"policy_lr": "1e-5"})
    for name, s in real_study.grid_runs("sums2", "prm", study):
        study["runs"][name] = recorded("prime", 1, [0.1, 0.2, 0.2, 0.2], setting=s)
    lora_run = lambda k, end: recorded("rloo", 1, [0.1, end, end, end], setting={"policy_lr": f"{k}e-5"})  # noqa: E731
    for k, end in zip(real_study.LORA_FACTORS, [0.2, 0.4, 0.7]):  # x1, x3, x10: the top edge wins
        study["runs"][f"sums2-lora-lr-rloo-x{k}-s1"] = lora_run(k, end)
    assert real_study.lora_factors("sums2", study) == [1, 3, 10, 30]
    assert real_study.grid_runs("sums2", "lora-seeds", study) is None  # x30 is not run yet
    assert real_study.next_run(["sums2"], ["lora-lr"], study, set())[2] == "sums2-lora-lr-rloo-x30-s1"
    # seeds run at x10 before the grid grew (under the names they would have had)
    for seed in real_study.SEEDS:
        for arm in ("rloo", "prime"):
            study["runs"][f"sums2-lora-x10-{arm}-s{seed}"] = recorded(arm, seed, [0.1, 0.5])
            study["runs"][f"sums2-{arm}-s{seed}"] = recorded(arm, seed, [0.1, 0.6])
    study["runs"]["sums2-lora-lr-rloo-x30-s1"] = lora_run(30, 0.8)
    assert real_study.lora_factors("sums2", study) == [1, 3, 10, 30, 100]
    study["runs"]["sums2-lora-lr-rloo-x100-s1"] = lora_run(100, 0.5)
    assert real_study.lora_factors("sums2", study) == [1, 3, 10, 30, 100]
    assert real_study.lora_factor("sums2", study) == 30
    seeds = dict(real_study.grid_runs("sums2", "lora-seeds", study))
    assert sorted(seeds) == sorted(f"sums2-lora-x30-{arm}-s{seed}" for seed in real_study.SEEDS for arm in ("rloo", "prime"))
    prm_lr = float(real_study.choice("sums2", "prm", study)["prm_lr"])
    assert float(seeds["sums2-lora-x30-prime-s1"]["prm_lr"]) == pytest.approx(30 * prm_lr)  # the full-FT PRM lr x30
    assert real_study.next_run(["sums2"], ["lora-seeds"], study, set())[2] == "sums2-lora-x30-rloo-s1"
    assert real_study.lora_seed_factors("sums2", study) == [10, 30]  # the earlier choice first, the chosen last
    assert real_study.lora_verdicts("sums2", study, 10)["rloo"]["end sampled"]["mean"] == pytest.approx(-0.1)
    assert real_study.lora_verdicts("sums2", study, 30)["rloo"]["end sampled"]["seeds"] == []
