"""Every bad configuration stops at once with a clear message naming the flag: exit code 2 as argparse,
no traceback, and nothing loaded or written (the run folder stays empty). One row per bad value."""

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

import eval
import reproduce
import config
import toy_task
import train

REPO = Path(__file__).resolve().parents[1]

# (flags, what the message must name); at least one row per flag that has a domain
TRAIN_BAD = [
    (["--steps", "0"], "--steps 0"), (["--steps", "-1"], "--steps -1"),
    (["--prompts-per-step", "0"], "--prompts-per-step 0"), (["--n-samples", "0"], "--n-samples 0"),
    (["--max-prompt-len", "0"], "--max-prompt-len 0"), (["--max-response-len", "0"], "--max-response-len 0"),
    (["--temperature", "0"], "--temperature 0"), (["--temperature", "nan"], "--temperature nan"),
    (["--top-p", "0"], "--top-p 0"), (["--top-p", "1.5"], "--top-p 1.5"),
    (["--prm-warmup-steps", "-1"], "--prm-warmup-steps -1"), (["--teacher-sft-steps", "0"], "--teacher-sft-steps 0"),
    (["--gopd-lambda", "0"], "--gopd-lambda 0"), (["--beta", "-1"], "--beta -1"), (["--beta", "0"], "--beta 0"),
    (["--filter-low", "-0.1"], "--filter-low -0.1"), (["--filter-high", "1.1"], "--filter-high 1.1"),
    (["--filter-low", "0.9", "--filter-high", "0.1"], "--filter-low 0.9 / --filter-high 0.1"),
    (["--clip-eps", "0"], "--clip-eps 0"), (["--clip-eps", "1"], "--clip-eps 1"),
    (["--dual-clip", "1"], "--dual-clip 1"), (["--dual-clip", "-3"], "--dual-clip -3"),
    (["--gamma", "1.5"], "--gamma 1.5"), (["--gamma", "-0.1"], "--gamma -0.1"),
    (["--policy-lr", "0"], "--policy-lr 0"), (["--prm-lr=-1e-4"], "--prm-lr -0.0001"),
    (["--policy-weight-decay", "-0.1"], "--policy-weight-decay -0.1"),
    (["--policy-grad-clip", "0"], "--policy-grad-clip 0"), (["--prm-grad-clip", "0"], "--prm-grad-clip 0"),
    (["--mini-batches", "0"], "--mini-batches 0"), (["--micro-batch-size", "0"], "--micro-batch-size 0"),
    (["--max-tokens-per-micro-batch", "-1"], "--max-tokens-per-micro-batch -1: must be >= 0"),
    (["--loss-mean", "tokens"], "--loss-mean"),
    (["--vllm-gpu-memory-utilization", "0"], "--vllm-gpu-memory-utilization 0"),
    (["--save-every", "0"], "--save-every 0"), (["--eval-problems", "0"], "--eval-problems 0"),
    (["--eval-every", "-1"], "--eval-every -1"), (["--eval-samples", "0"], "--eval-samples 0"),
    (["--sft-steps", "-5"], "--sft-steps -5"), (["--episodes-per-step", "-1"], "--episodes-per-step -1"),
    (["--max-memory-gb", "-1"], "--max-memory-gb -1"), (["--toy-slip", "1"], "--toy-slip 1"),
    (["--toy-ops", "6-3"], "--toy-ops '6-3'"), (["--toy-ops", "x"], "--toy-ops 'x'"),
    # paths
    (["--data", "/nonexistent.jsonl"], "--data /nonexistent.jsonl: file not found"),
    (["--data", "README.md"], "--data README.md: expected a .jsonl or .parquet"),
    (["--model", "nowhere"], "--model nowhere: no such local path"),
    (["--process", "opd", "--teacher", "nowhere"], "--teacher nowhere: no such local path"),
    (["--process", "step", "--step-scorer", "nowhere"], "--step-scorer nowhere"),
    (["--resume", "--run-name", "never-ran"], "--resume: no checkpoint in"),
    (["--resume"], "--resume needs --run-name"),
    # combinations that cannot work
    (["--n-samples", "1"], "--n-samples 1: --estimator rloo needs at least 2"),
    (["--estimator", "prm-value", "--process", "none"], "--estimator prm-value"),
    (["--process", "none", "--prm-warmup-steps", "2"], "--prm-warmup-steps"),
    (["--process", "none", "--prm-freeze-step", "2"], "--prm-freeze-step"),
    (["--prm-freeze-step", "-1"], "--prm-freeze-step -1"),
    (["--prm-loss", "dpo", "--micro-batch-size", "6"], "--micro-batch-size 6 must be a multiple of --n-samples 4"),
    (["--teacher", "README.md"], "--teacher is used only by --process opd/gopd"),
    (["--process", "opd", "--model", "README.md"], "needs --teacher PATH"),
    (["--process", "step", "--data", "README.md"], "--data README.md"),
    (["--pass-preset", "v1", "--estimator", "pass"], "--pass-preset v1"),
    (["--estimator", "ppo-typo"], "--estimator"),
    (["--critic-warmup-steps", "2"], "--critic-warmup-steps 2: only --estimator ppo has a critic"),
    (["--estimator", "ppo", "--critic-warmup-steps", "5", "--steps", "5"], "must be below --steps 5"),
    (["--estimator", "ppo", "--gae-lambda", "1.5"], "--gae-lambda 1.5: must be in [0, 1]"),
    (["--estimator", "ppo", "--value-clip", "-1"], "--value-clip -1.0: must be >= 0"),
    (["--prm-groups", "all"], "--prm-groups"), (["--math-grader", "sympy"], "--math-grader"),
    (["--step-noise", "0.5"], "--step-noise 0.5: adds noise to a step scorer's scores, needs --process step"),
    (["--process", "step", "--step-noise", "-1"], "--step-noise -1.0: must be >= 0"),
    (["--process", "none", "--process-groups", "mixed"], "--process-groups mixed"),
    (["--process-groups", "kept"], "--process-groups"),
    (["--process", "none", "--prm-init", "teacher"], "--prm-init teacher: the implicit PRM's start"),
    (["--prm-init", "nowhere"], "--prm-init nowhere"),
    (["--prm-init", "teacher", "--model", "README.md"], "--prm-init teacher with your own --model"),
]


@pytest.mark.parametrize("flags, names", TRAIN_BAD, ids=lambda x: " ".join(x) if isinstance(x, list) else None)
def test_train_refuses_a_bad_value_naming_the_flag(flags, names, tmp_path, capsys):
    out = tmp_path / "runs"
    with pytest.raises(SystemExit) as stop:
        train.main([*flags, "--out-dir", str(out), "--cache-dir", str(tmp_path / "cache")])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and names in err, err
    assert not out.exists() and not (tmp_path / "cache").exists()  # nothing loaded, nothing written


def test_a_local_model_path_must_exist_before_anything_loads(tmp_path, capsys):
    """An absolute path, or one starting with '.', names a folder on this machine: a missing one stops at the
    command line (a hub name, org/model, is left to the loader)."""
    for path in (str(tmp_path / "no" / "such" / "folder"), "./no/such/folder", "../nowhere/model"):
        with pytest.raises(SystemExit) as stop:
            config.parse_args(["--model", path])
        assert stop.value.code == 2 and f"--model {path}: no such local path" in capsys.readouterr().err


def test_help_shows_every_default_and_preset_fast_and_cites_no_issue():
    """`python train.py --help` is a document: every field's default, the three presets, no internal issue
    numbers; it answers before torch loads (the figure is measured by bench, not asserted: a loaded
    machine would make a timed test flaky; here: torch is not imported at all)."""
    code = ("import sys, runpy; sys.argv = ['train.py', '--help']\n"
            "try:\n    runpy.run_path('train.py', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('TORCH' if 'torch' in sys.modules else 'NO TORCH')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120).stdout
    assert out.rstrip().endswith("NO TORCH")
    assert "'paper' (the paper's 7B run: 592 steps" in " ".join(out.split()) and "'1.5b'" in out and "'7b'" in out
    fields = [f for f in dataclasses.fields(config.Args) if f.default is not dataclasses.MISSING]
    flat = " ".join(out.split())  # argparse wraps its lines
    assert flat.count("(default: ") == len(fields) and "(default: 70)" in flat
    assert not re.search(r"\bissue \d", out)
    assert config.TEACHER_SFT_STEPS == toy_task.TEACHER_SFT_STEPS


@pytest.mark.parametrize("flags", [
    ["--filter-low", "0", "--filter-high", "1"], ["--filter-low", "0.5", "--filter-high", "0.5"],
    ["--gamma", "0"], ["--gamma", "1"], ["--top-p", "1"], ["--toy-slip", "0"], ["--dual-clip", "0"],
    ["--dual-clip", "3"], ["--eval-every", "0"], ["--sft-steps", "0"], ["--prm-warmup-steps", "0"],
    ["--episodes-per-step", "0"], ["--toy-ops", "1-12"], ["--toy-ops", "4"], ["--clip-eps", "0.999"],
    ["--prm-loss", "dpo", "--micro-batch-size", "8"], ["--n-samples", "1", "--estimator", "reinforce"],
    ["--prm-loss", "dpo", "--micro-batch-size", "6", "--max-tokens-per-micro-batch", "500"],  # budget: groups whole
    ["--max-tokens-per-micro-batch", "0"],
])
def test_train_accepts_the_edge_values(flags):
    config.parse_args(flags)


@pytest.mark.parametrize("flags, warned", [
    (["--filter-low", "0", "--filter-high", "1", "--policy-lr", "1e-4"], True),
    (["--filter-low", "0", "--filter-high", "1", "--policy-lr", "3e-5"], False),  # the slower lr held
    (["--policy-lr", "1e-4"], False),  # PRIME's filter: the guard the study found
    (["--filter-low", "0", "--filter-high", "1", "--policy-lr", "1e-4", "--process", "none"], False),
])
def test_implicit_rewards_without_the_filter_at_a_high_lr_warn(flags, warned, capsys):
    config.parse_args(flags)
    assert ("without PRIME's filter collapsed" in capsys.readouterr().out) == warned


def test_train_cli_exit_code_and_no_traceback(tmp_path):
    # the command line's own exit (the messages of every case are checked in-process above): a bad
    # value and a missing path, both through parse_args' exit, started together
    cases = [["--prompts-per-step", "0"], ["--data", "/nonexistent.jsonl"]]
    procs = [subprocess.Popen([sys.executable, str(REPO / "train.py"), *flags, "--out-dir", str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO) for flags in cases]
    for flags, proc in zip(cases, procs):  # started together: each is mostly Python's imports
        stderr = proc.communicate(timeout=120)[1]
        assert proc.returncode == 2 and "Traceback" not in stderr, stderr
        assert flags[0] in stderr
        assert not any(tmp_path.iterdir())


EVAL_BAD = [
    (["--model", "x", "--greedy", "--n", "4"], "--greedy decodes one response per problem: drop --n 4"),
    (["--model", "x", "--n", "0"], "--n 0"), (["--model", "x", "--batch-size", "0"], "--batch-size 0"),
    (["--model", "x", "--limit", "-1"], "--limit -1"), (["--model", "x", "--max-new-tokens", "-1"], "--max-new-tokens -1"),
    (["--model", "x", "--temperature", "0"], "--temperature 0"), (["--model", "x", "--top-p", "2"], "--top-p 2"),
    (["--model", "nowhere", "--benchmarks", "toy"], "--model nowhere: no such local path"),
    (["--model", "x", "--benchmarks", "math500,mathh500"], "unknown benchmark 'mathh500'"),
    (["--model", "x", "--benchmarks", "math500", "--data-dir", "/nonexistent"], "--data-dir /nonexistent"),
    (["--benchmarks", "toy"], "--model is required"),
    (["--plot", "/nonexistent"], "--plot /nonexistent: no metrics.jsonl"),
    (["--model", "README.md", "--rollout", "vllm", "--gpu-memory-utilization", "0"], "--gpu-memory-utilization 0.0"),
    (["--model", "README.md", "--rollout", "sglang"], "--rollout"),
    (["--model", "README.md", "--math-grader", "sympy"], "--math-grader"),
    (["--episodes", "/nonexistent"], "--episodes /nonexistent: no episodes.jsonl"),
    (["--responses", "/nonexistent"], "--responses /nonexistent: no such file"),
    (["--model", "README.md", "--panel", "prime2"], "--panel"),
    (["--model", "README.md", "--benchmark-file", "livecodebench"], "--benchmark-file livecodebench: expected NAME=PATH"),
    (["--model", "README.md", "--lcb-dates", "2023-05-01"], "--lcb-dates 2023-05-01: expected START:END"),
]


@pytest.mark.parametrize("flags, names", EVAL_BAD, ids=lambda x: " ".join(x) if isinstance(x, list) else None)
def test_eval_refuses_a_bad_value_naming_the_flag(flags, names, capsys):
    with pytest.raises(SystemExit) as stop:
        eval.main(flags)
    assert stop.value.code == 2
    assert names in capsys.readouterr().err


@pytest.mark.parametrize("flags, names", [
    (["prime-vs-rloo", "--steps", "0"], "--steps 0"), (["prime-vs-rloo", "--jobs", "0"], "--jobs 0"),
    (["prime-vs-rloo", "--window", "0"], "--window 0"), (["prime-vs-rloo", "--seeds", "1", "1"], "--seeds 1 1"),
    (["prime-vs-rloo", "--beta", "-1"], "--beta -1"), (["prime-vs-rloo", "--temperature", "0"], "--temperature 0"),
    (["nothing"], "invalid choice"),
])
def test_reproduce_refuses_a_bad_value_before_any_run(flags, names, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        reproduce.main([*flags, "--out", str(tmp_path / "runs"), "--cache-dir", str(tmp_path / "cache")])
    assert stop.value.code == 2
    assert names in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_a_row_count_given_alone_replaces_the_default_token_budget():
    """The default packs rows by length under a token budget; --micro-batch-size alone means rows in
    order (the budget off), both flags keep both, and the presets count rows as the paper's runs do."""
    assert config.parse_args([]).max_tokens_per_micro_batch == 4096
    rows = config.parse_args(["--micro-batch-size", "8"])
    assert (rows.micro_batch_size, rows.max_tokens_per_micro_batch) == (8, 0)
    both = config.parse_args(["--micro-batch-size", "8", "--max-tokens-per-micro-batch", "500"])
    assert (both.micro_batch_size, both.max_tokens_per_micro_batch) == (8, 500)
    for preset in ("paper", "1.5b", "7b"):
        assert config.parse_args(["--preset", preset]).max_tokens_per_micro_batch == 0


def test_gamma_sets_both_discounts_and_either_flag_beside_it_wins():
    both = config.parse_args(["--gamma", "0.9"])
    assert (both.process_gamma, both.outcome_gamma) == (0.9, 0.9)
    mixed = config.parse_args(["--gamma", "0.9", "--outcome-gamma", "1"])
    assert (mixed.process_gamma, mixed.outcome_gamma) == (0.9, 1.0)
    default = config.parse_args([])
    assert (default.process_gamma, default.outcome_gamma) == (1.0, 1.0)  # the paper's runs


@pytest.mark.parametrize("flags,names", [
    (["--estimator", "ppo", "--process-gamma", "0.5"], "--estimator ppo"),
    (["--estimator", "pass", "--gamma", "0.9"], "--estimator pass"),
    (["--outcome-gamma", "2"], "--outcome-gamma 2"),
])
def test_discounts_an_estimator_cannot_apply_are_refused(flags, names, capsys):
    with pytest.raises(SystemExit) as e:
        config.parse_args(flags)
    assert e.value.code == 2 and names in capsys.readouterr().err
