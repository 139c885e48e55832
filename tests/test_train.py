"""train.py end to end on CPU: the real entry point, the real tiny model, tiny budgets."""

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import config
import ddp
import eval as evaluation
import microbatch
import prime
import runlog
import data
import toy_task
import train
from rollout import HFRollout

from conftest import SFT_STEPS, free_port

REPO = Path(__file__).resolve().parents[1]


def run_train(args, cache_dir, out_dir, timeout=600, torchrun=0, script="train.py"):
    return finish(start_train(args, cache_dir, out_dir, torchrun, script), timeout)


def start_train(args, cache_dir, out_dir, torchrun=0, script="train.py") -> subprocess.Popen:
    """train.py (under torchrun with `torchrun` ranks) in the background, one thread a process: two
    such runs at a time share 2 cores without oversubscribing them, so the tests start their runs
    together where they can. Every run a test compares with another has the same thread count."""
    cmd = [sys.executable, str(REPO / script)]
    if torchrun:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={torchrun}",
               "--master_port", str(free_port()), str(REPO / script)]
    cmd += ["--cache-dir", str(cache_dir), "--sft-steps", str(SFT_STEPS), "--out-dir", str(out_dir),
            "--eval-problems", "16", "--prompts-per-step", "8", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


def train_here(args, cache_dir, out_dir) -> Path:
    """train.py's entry point in this process, with start_train's flags: a run that needs no process of
    its own (nothing runs beside it) saves the interpreter's start and imports, ~8 s on 2 cores."""
    return train.main(["--cache-dir", str(cache_dir), "--sft-steps", str(SFT_STEPS), "--out-dir", str(out_dir),
                       "--eval-problems", "16", "--prompts-per-step", "8", *args])


def finish(proc: subprocess.Popen, timeout=600) -> subprocess.CompletedProcess:
    stdout, stderr = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def metrics_of(run_dir):
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(l).items() if k != "time"} for l in lines]


def test_default_run_end_to_end(cache_dir, tmp_path):
    proc = run_train(["--steps", "3", "--run-name", "smoke", "--save-every", "2"], cache_dir, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "smoke"
    summary = json.loads((run / "summary.json").read_text())
    for key in ("start_accuracy", "end_accuracy", "start_sampled_accuracy", "end_sampled_accuracy", "steps",
                "wall_seconds", "step_seconds", "final_prm_localization_10"):
        assert key in summary
    # sampled accuracy: 16 problems x 4 samples, so a multiple of 1/64
    assert (summary["start_sampled_accuracy"] * 64) == pytest.approx(round(summary["start_sampled_accuracy"] * 64))
    assert set(summary["step_seconds"]) == {"rollout", "verify", "prm", "policy", "eval", "other"}
    assert re.fullmatch(r".+, \d+ threads", summary["machine"])  # what the times were measured on (a CPU here)
    metrics = metrics_of(run)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(0.0 <= m["reward"] <= 1.0 for m in metrics)
    assert (run / "curves.png").stat().st_size > 1000
    # episodes come from the groups the filter kept (none from a step that trained on nothing)
    episodes = [json.loads(l) for l in (run / "episodes.jsonl").read_text().splitlines()]
    assert bool(episodes) == any(m["kept_groups"] for m in metrics)
    for episode in episodes:
        assert len(episode["tokens"]) == len(episode["process_reward"]) == len(episode["reward"]) == \
            len(episode["step_ids"])
    if episodes:
        assert (run / "episodes.png").stat().st_size > 1000  # the episode picture
    assert all(m["prm_localization"] is None or 0 <= m["prm_localization"] <= 1 for m in metrics)
    # a kept group is a mixed one, so a step that kept one has right responses for the checker to read
    assert all((m["right_with_wrong_step"] is not None) == (m["kept_groups"] > 0) for m in metrics)
    assert all(m["right_with_wrong_step"] is None or 0 <= m["right_with_wrong_step"] <= 1 for m in metrics)
    assert "held-out accuracy (" in proc.stdout
    from transformers import AutoModelForCausalLM
    final = AutoModelForCausalLM.from_pretrained(run / "final")
    start = AutoModelForCausalLM.from_pretrained(json.loads((run / "config.json").read_text())["model_path"])
    moved = any(not torch.equal(a, b) for a, b in zip(final.state_dict().values(), start.state_dict().values()))
    assert moved, "three PRIME steps left the policy's weights unchanged"


def test_saved_toy_tokenizer_reloads_with_the_same_ids(cache_dir):
    """AutoTokenizer reloads the checkpoint's tokenizer as Qwen2Tokenizer: it must give the SFT ids."""
    from transformers import AutoTokenizer
    text = "((7+5)*3)-4\n7+5=12\n12*3=36\n36-4=32\n\\boxed{32}"
    built = toy_task.build_tokenizer()
    loaded = AutoTokenizer.from_pretrained(toy_task.sft_checkpoint(cache_dir, SFT_STEPS))
    assert loaded(text)["input_ids"] == built(text)["input_ids"]
    assert len(built(text)["input_ids"]) == len(text)  # one token per character, newlines included
    assert loaded.decode(loaded(text)["input_ids"]) == text


def test_recomputed_old_logprobs_equal_the_samplers_on_left_padded_prompts(cache_dir):
    path = toy_task.sft_checkpoint(cache_dir, SFT_STEPS)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    problems = toy_task.make_problems(6, seed=5)
    prompts = [tokenizer(p.prompt)["input_ids"] for p in problems]
    prompts[0] = prompts[0][-3:]  # very different lengths: heavy left padding
    assert len({len(p) for p in prompts}) > 2
    torch.manual_seed(0)
    sampler = HFRollout(model, tokenizer, max_new_tokens=24, temperature=0.7)
    ro = sampler.generate(prompts, n=2, return_logprobs=True)
    assert ro.prompt_mask[:, 0].min() == 0  # some rows really are left-padded
    recomputed = microbatch.response_logprobs(model, ro, temperature=0.7)
    mask = ro.response_mask.bool()
    assert torch.allclose(recomputed[mask], ro.sampler_logprobs[mask], atol=1e-4)
    assert ro.sampler_logprobs[mask].min() < -0.1  # some sampled tokens were not near-certain


def kill_and_resume(args, cache_dir, tmp_path, capsys, monkeypatch) -> str:
    """Runs "full" (train.py with `args`) to its end beside a run "killed" stopped by SIGKILL right after
    its first checkpoint, then resumes "killed" in this process at the thread count of both; returns what
    the resumed run printed. The caller compares the two runs' metrics."""
    full = start_train(args + ["--run-name", "full"], cache_dir, tmp_path)  # beside the run we kill
    proc = start_train(args + ["--run-name", "killed"], cache_dir, tmp_path)
    state = tmp_path / "killed" / "checkpoint" / "state.pt"
    deadline = time.time() + 600
    while not state.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert state.exists(), "the run never wrote its first checkpoint"
    full = finish(full)
    assert full.returncode == 0, full.stderr[-3000:]
    capsys.readouterr()
    threads = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the thread count of the runs it is compared with
    try:
        train_here(args + ["--run-name", "killed", "--resume"], cache_dir, tmp_path)
    finally:
        torch.set_num_threads(threads)  # train.main set 1 for this process: the later tests get theirs back
    return capsys.readouterr().out


def test_kill_and_resume_gives_the_same_metrics(cache_dir, tmp_path, capsys, monkeypatch):
    """PPO + PRIME: the policy, the implicit PRM, the critic, their optimisers and every RNG stream are
    checkpointed (PRIME's default RLOO saves the same minus the critic; one run covers both)."""
    args = ["--steps", "4", "--save-every", "2", "--estimator", "ppo"]
    assert "resumed" in kill_and_resume(args, cache_dir, tmp_path, capsys, monkeypatch)
    assert metrics_of(tmp_path / "killed") == metrics_of(tmp_path / "full")


def test_torchrun_two_ranks_with_uneven_filtering(cache_dir, tmp_path):
    """Rank 1 gets problems whose gold answer the model can never produce, rank 0 solvable ones, and
    the filter keeps only all-wrong groups ([0, 0]): rank 1 keeps every group, rank 0 only some, so
    the ranks hold different numbers of micro-batches (and rank 0 sometimes none). The run goes through
    tests/ddp_exit_probe.py: at exit no DDP model may outlive the process group (a hang otherwise)."""
    problems = toy_task.make_problems(16, seed=3)
    rows = []
    for i, p in enumerate(problems):  # rank r takes prompts r, r + 2, ... of each step
        rows.append({"q": p.prompt, "a": p.answer if i % 2 == 0 else "\\frac{1}{7}"})
    data = tmp_path / "uneven.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows * 4))
    proc = run_train(["--steps", "3", "--run-name", "ddp", "--data", str(data), "--prompt-key", "q",
                      "--answer-key", "a", "--user-suffix", "", "--eval-problems", "2",
                      "--prompts-per-step", "4", "--micro-batch-size", "2", "--filter-low", "0.0",
                      "--filter-high", "0.0"], cache_dir, tmp_path, torchrun=2, script="tests/ddp_exit_probe.py")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.count("DDP models alive at destroy_process_group: 0") == 2, proc.stdout[-2000:]
    metrics = metrics_of(tmp_path / "ddp")
    assert len(metrics) == 3
    assert any(m["kept_groups_per_rank"][0] != m["kept_groups_per_rank"][1] for m in metrics), metrics


def test_no_episodes_finishes_on_one_and_on_two_ranks_and_cpu_prints_no_gpu_estimate(cache_dir, tmp_path):
    """--episodes-per-step 0 writes no episodes.jsonl: the run still draws its curves and exits 0, on one
    rank and under torchrun on two (where rank 0 failing at the end left the other at the barrier). A
    CPU run makes no GPU's memory report (check_memory speaks for a GPU, or for --max-memory-gb)."""
    flags = ["--steps", "1", "--episodes-per-step", "0", "--eval-problems", "8"]
    runs = {1: start_train([*flags, "--run-name", "one"], cache_dir, tmp_path),
            2: start_train([*flags, "--run-name", "two"], cache_dir, tmp_path, torchrun=2)}
    for ranks, proc in runs.items():
        done = finish(proc)
        assert done.returncode == 0, (ranks, done.stderr[-3000:])
        run_dir = tmp_path / ("one" if ranks == 1 else "two")
        assert (run_dir / "summary.json").exists() and (run_dir / "curves.png").exists()
        assert not (run_dir / "episodes.jsonl").exists()
        assert "memory estimate" not in done.stdout + done.stderr


def test_a_steps_counts_refuse_two_parts_with_one_name():
    """train.py sums a step's counts over ranks from several parts (the sampled responses', the kept
    batch's, the rollout correction's): a name two parts share would let the second silently win, as
    the rollout correction's token count once replaced the responses' and made response_length wrong."""
    args = config.Args(n_samples=2)
    from rollout import Rollout
    ro = Rollout(  # 2 responses of 3 and 1 tokens
        torch.ones(2, 1, dtype=torch.long), torch.ones(2, 1, dtype=torch.long), torch.ones(2, 3, dtype=torch.long),
        torch.tensor([[1, 1, 1], [1, 0, 0]]), torch.zeros(2, dtype=torch.bool))
    counts = runlog.step_counts(args, [data.Task([1], "1", "math", "q")], ro, [], torch.tensor([1.0, 0.0]), [])
    mismatch = prime.rollout_mismatch(torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]))
    merged = runlog.merge_counts(counts, mismatch)
    assert merged["tokens"] == 4 and merged["mismatch_tokens"] == 1  # each keeps its own count
    with pytest.raises(AssertionError, match="tokens"):
        runlog.merge_counts(counts, {"tokens": 1})


def test_the_loop_grades_each_response_against_its_own_question(cache_dir):
    """train.verify_rollouts passes every response's question to the verifier: a response that boxes the
    question's own arithmetic scores 0 as "restated" (without the question it would be refused only as
    an undone sum, "unevaluated"), and a right value scores 1."""
    from rollout import Rollout
    tokenizer = toy_task.build_tokenizer()
    problems = toy_task.make_problems(2, seed=5)
    tasks = [data.Task(tokenizer(p.prompt)["input_ids"], p.answer, "math", p.prompt) for p in problems]
    expression = problems[0].prompt.strip()
    texts = ["\\boxed{" + expression + "}", "\\boxed{" + problems[0].answer + "}",
             "\\boxed{" + problems[1].answer + "}", "\\boxed{0}"]
    ids = [tokenizer(t)["input_ids"] for t in texts]
    width = max(len(i) for i in ids)
    ro = Rollout(torch.ones(4, 1, dtype=torch.long), torch.ones(4, 1, dtype=torch.long),
                 torch.tensor([i + [tokenizer.pad_token_id] * (width - len(i)) for i in ids]),
                 torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids]), torch.zeros(4, dtype=torch.bool))
    sampler = HFRollout(None, tokenizer, 8)
    args = config.Args(n_samples=2)
    decoded, scores, outcome = train.verify_rollouts(sampler, ro, tasks, args)
    assert decoded == texts
    assert [s.reason for s in scores][:3] == ["restated", "ok", "ok"] and outcome.tolist()[:3] == [0.0, 1.0, 1.0]


def test_opd_and_gopd_compare_the_teacher_with_the_student_at_one_temperature(cache_dir):
    """The teacher (and G-OPD's base) score at temperature 1; the student must too, not at the sampling
    temperature. With teacher = base = student (all the SFT checkpoint), OPD's signal is exactly 0 and
    G-OPD's is 0 to round-off at T = 0.7, where the student's log-probs at 0.7 would differ by > 1e-2."""
    path = str(toy_task.sft_checkpoint(cache_dir, SFT_STEPS))
    d = ddp.Dist()
    for process in ("opd", "gopd"):
        args = config.parse_args(["--cache-dir", str(cache_dir), "--sft-steps", str(SFT_STEPS), "--process", process,
                                  "--teacher", path, "--temperature", "0.7", "--rollout", "hf", "--n-samples", "2"])
        models = train.build_models(args, d)
        torch.manual_seed(0)
        tokenizer = models.tokenizer
        ro = HFRollout(ddp.unwrap(models.policy), tokenizer, 48, temperature=0.7).generate(
            [tokenizer(p.prompt)["input_ids"] for p in toy_task.make_problems(3, seed=8)], n=2)
        b = train.with_plans(train.Batch(ro, torch.tensor([1.0, 0.0] * 3), ro.response_mask.float(), torch.arange(6),
                                         [""] * 6, [""] * 6, 6, 6), args, d)
        logp_old = microbatch.logprobs_no_grad(ddp.unwrap(models.policy), b.rollout, args, args.temperature, b.plan)
        logp_ref = train.reference_logprobs(args, models, b, logp_old)
        signal, *_ = train.process_signal(args, models, b, logp_old, logp_ref, d, 0)
        at_sampling_temperature = (microbatch.logprobs_no_grad(models.teacher, b.rollout, args) - logp_old) * b.mask
        assert at_sampling_temperature.abs().max().item() > 1e-2, process
        if process == "opd":
            assert signal.abs().max().item() == 0.0
        else:
            assert signal.abs().max().item() < 1e-5


def two_nodes(flags, cache_dir, out_dir, port, timeout=900):
    """The README's multi-node command, one torchrun per "node" on this machine (--nnodes 2
    --nproc_per_node 1 --node_rank 0|1, rendezvous at 127.0.0.1:port, gloo): -> (rc, output) each."""
    procs = []
    for node_rank in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={node_rank}",
               "--nproc_per_node=1", "--master_addr=127.0.0.1", f"--master_port={port}", str(REPO / "train.py"),
               "--cache-dir", str(cache_dir), "--sft-steps", str(SFT_STEPS), "--out-dir", str(out_dir),
               "--eval-problems", "16", "--prompts-per-step", "8", *flags]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      env=env))
    return [(proc.wait(timeout=timeout), proc.stdout.read()) for proc in procs]


def test_two_nodes_on_localhost_train_and_resume(cache_dir, tmp_path):
    """Two torchrun launches, as on two nodes sharing a file system: a few steps of the embedded
    default, then a resume; rank 0 (node 0) writes the logs and models, each rank its RNG file."""
    port = free_port()
    for (rc, out) in two_nodes(["--steps", "2", "--run-name", "nodes", "--save-every", "1"], cache_dir, tmp_path, port):
        assert rc == 0, out[-3000:]
    checkpoint = tmp_path / "nodes" / "checkpoint"
    assert sorted(p.name for p in checkpoint.iterdir()) == ["rng_rank0.pt", "rng_rank1.pt", "state.pt"]
    results = two_nodes(["--steps", "3", "--run-name", "nodes", "--save-every", "1", "--resume"], cache_dir, tmp_path,
                        free_port())
    for rc, out in results:
        assert rc == 0, out[-3000:]
    assert "resumed" in results[0][1]
    metrics = metrics_of(tmp_path / "nodes")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(len(m["kept_groups_per_rank"]) == 2 and m["prompts"] == 8 for m in metrics)


def test_ranks_that_share_no_out_dir_stop_at_the_start(cache_dir, tmp_path):
    """Node 1 pointed at a folder node 0 does not write into (as on nodes without a shared file
    system): both ranks stop before training, naming the flag."""
    port, procs = free_port(), []
    for node_rank, out in ((0, tmp_path / "node0"), (1, tmp_path / "node1")):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={node_rank}",
               "--nproc_per_node=1", "--master_addr=127.0.0.1", f"--master_port={port}", str(REPO / "train.py"),
               "--cache-dir", str(cache_dir), "--sft-steps", str(SFT_STEPS), "--out-dir", str(out),
               "--run-name", "x", "--steps", "1", "--prompts-per-step", "8"]
        procs.append(subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      env=dict(os.environ, OMP_NUM_THREADS="1")))
    outputs = [(proc.wait(timeout=600), proc.stdout.read()) for proc in procs]
    assert all(rc != 0 for rc, _ in outputs)
    assert any("--out-dir" in out and "cannot see the files rank 0 writes" in out for _, out in outputs)
    assert not (tmp_path / "node0" / "x" / "metrics.jsonl").exists()


# --------------------------------------------------------------------------- bad input


def expect_error(args, cache_dir, tmp_path, message, capsys):
    """train.py stops with `message` (a SystemExit's text, or the usage error on stderr), nonzero.
    In this process: test_train_cli_exit_code_and_no_traceback runs the command line itself."""
    with pytest.raises(SystemExit) as stop:
        train_here(args, cache_dir, tmp_path)
    text = f"{stop.value.code}\n{capsys.readouterr().err}"
    assert stop.value.code not in (0, None)
    assert message in text, text[-2000:]


def test_unknown_model_path(cache_dir, tmp_path, capsys):
    expect_error(["--model", str(tmp_path / "nope"), "--steps", "1"], cache_dir, tmp_path, "--model", capsys)


def test_missing_data_field(cache_dir, tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"question": "1+1", "answer": "2"}) + "\n")
    expect_error(["--data", str(data), "--steps", "1"], cache_dir, tmp_path, "no field 'problem'", capsys)


def test_real_data_lengths_dropped_prompts_and_an_empty_held_out_set(cache_dir, tmp_path, capsys):
    """Prompts longer than --max-prompt-len are dropped and counted, per part (training, held-out);
    dropping more than half of either stops the run naming the flag; a file too small to hold out a
    problem stops it too (an accuracy of no problems is no accuracy); with --model and --data the
    lengths default to the paper's 1024, not the toy's 64."""
    import data as data_module
    rows = [{"problem": ("1+" * (5 if i % 4 else 40)) + "1", "answer": str(6 if i % 4 else 41)} for i in range(40)]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = config.parse_args(["--data", str(data), "--user-suffix", "", "--max-prompt-len", "40",
                              "--eval-problems", "4"])
    train_tasks, held = data_module.load_tasks(args, toy_task.build_tokenizer())
    out = capsys.readouterr().out
    assert f"--data {data}: 9 of 36 training prompts are longer than --max-prompt-len 40 tokens" in out, out
    assert "1 of 4 held-out prompts" in out and (len(train_tasks), len(held)) == (27, 3)
    with pytest.raises(SystemExit, match="--max-prompt-len 10: it drops 36 of the 36 training prompts"):
        data_module.load_tasks(dataclasses.replace(args, max_prompt_len=10), toy_task.build_tokenizer())
    data.write_text("".join(json.dumps(r) + "\n" for r in rows[:9]))
    with pytest.raises(SystemExit, match="9 rows leave no held-out problem"):
        data_module.load_tasks(args, toy_task.build_tokenizer())
    assert (config.parse_args(["--data", str(data)]).max_prompt_len,  # the embedded model: its own lengths
            config.parse_args(["--data", str(data), "--model", str(tmp_path)]).max_prompt_len) == (64, 1024)
    assert config.parse_args(["--data", str(data), "--model", str(tmp_path), "--preset", "1.5b"]).max_response_len \
        == 3072  # a preset's lengths win over the data default


def test_unparseable_answer_field(cache_dir, tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"problem": "1+1\n", "answer": "\\frac{"}) + "\n" for _ in range(4)))
    expect_error(["--data", str(data), "--steps", "1"], cache_dir, tmp_path, "do not verify against themselves",
                 capsys)


def test_n_samples_below_two_with_rloo(cache_dir, tmp_path, capsys):
    expect_error(["--n-samples", "1", "--steps", "1"], cache_dir, tmp_path, "--n-samples 1", capsys)


def test_batch_not_divisible_by_world_size():
    args = config.Args(prompts_per_step=5)
    with pytest.raises(SystemExit, match="not divisible by the world size 2"):
        train.step_prompts(args, [], toy_task.build_tokenizer(), 0, ddp.Dist(rank=0, world=2))


def test_memory_estimate_refuses_a_7b_model_on_an_80gb_gpu(cache_dir, tmp_path, capsys):
    """A config-only folder is enough: the estimate is made before any weight is loaded, and the
    refusal names the flags that lower it."""
    from transformers import Qwen2Config
    model_dir = tmp_path / "qwen2-7b-config"
    Qwen2Config(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                num_attention_heads=28, num_key_value_heads=4).save_pretrained(model_dir)
    toy_task.build_tokenizer().save_pretrained(model_dir)
    with pytest.raises(SystemExit, match="--micro-batch-size .* --vllm-sleep"):
        train_here(["--model", str(model_dir), "--preset", "paper", "--max-memory-gb", "80"], cache_dir, tmp_path)
    stdout = capsys.readouterr().out
    # 16 bytes a parameter for policy and for PRM, 4 for the fp32 reference: 36 bytes in all, before
    # any activation (the terms' arithmetic: tests/test_microbatch.py)
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        n_params = sum(p.numel() for p in AutoModelForCausalLM.from_config(Qwen2Config.from_pretrained(model_dir)).parameters())
    assert 7.5e9 < n_params < 7.7e9
    assert f"policy (weights, grads, AdamW) {16 * n_params / 1e9:.2f} GB" in stdout, stdout[-2000:]
    assert f"reference (fp32, frozen) {4 * n_params / 1e9:.2f} GB" in stdout, stdout[-2000:]
    total = float(stdout.split(" total ")[1].split(" GB")[0])
    assert total > 1.1 * 36 * n_params / 1e9  # the state alone is 274 GB: the run is refused


def test_verl_parquet_and_jsonl_rows_become_tasks(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    tokenizer = toy_task.build_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    rows = [{"data_source": "numina", "ability": "math",
             "prompt": [{"role": "user", "content": "(1+2)*3\n"}],
             "reward_model": {"style": "rule", "ground_truth": "9"}},
            {"data_source": "numina", "ability": "math",
             "prompt": [{"role": "user", "content": "4-1\n"}],
             "reward_model": {"style": "rule", "ground_truth": "3"}}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    args = config.Args(data=str(tmp_path / "train.parquet"))
    tasks = data.read_tasks(args, tokenizer)
    assert [t.answer for t in tasks] == ["9", "3"]
    assert tokenizer.decode(tasks[0].prompt_ids) == "(1+2)*3\n\n"  # the chat template was applied
    assert tasks[0].kind == "math"
    (tmp_path / "t.jsonl").write_text(json.dumps({"problem": "2*4", "answer": 8}) + "\n")
    args = config.Args(data=str(tmp_path / "t.jsonl"), user_suffix="=")
    tasks = data.read_tasks(args, tokenizer)
    assert tasks[0].answer == "8" and tokenizer.decode(tasks[0].prompt_ids) == "2*4=\n"


# The embedded teacher is an SFT on the clean demonstrator (no slips), a model of its own: the shipped one
TEACHER = ["--teacher-sft-steps", str(toy_task.TEACHER_SFT_STEPS)]


@pytest.mark.parametrize("flags", [
    ["--estimator", "grpo"], ["--estimator", "reinforce"], ["--estimator", "prm-value"],
    ["--estimator", "pass"], ["--estimator", "pass", "--process", "none"], ["--process", "none"],
    ["--reference", "policy"], ["--reference", "policy", "--temperature", "0.7"], ["--offload-optimizer"],
    ["--prm-update", "before"], ["--prm-loss", "dpo"],
    ["--rloo-form", "paper", "--process-norm", "beta"], ["--gradient-checkpointing", "--mini-batches", "2"],
    ["--filter-truncated", "--filter-low", "0", "--filter-high", "1"],
    ["--prm-warmup-steps", "2", "--no-prm-online"], ["--prm-warmup-steps", "1", "--reference", "policy"],
    ["--process", "opd", *TEACHER], ["--process", "gopd", "--estimator", "pass", *TEACHER],
    ["--process", "step"], ["--process", "step", "--process-norm", "beta", "--estimator", "grpo"],
    ["--process", "step", "--estimator", "pass", "--pass-preset", "v1"],
    ["--dual-clip", "3", "--temperature", "0.7"], ["--prm-groups", "mixed"],
    ["--estimator", "ppo"], ["--estimator", "ppo", "--process", "none", "--gae-lambda", "0.95", "--value-clip", "0"],
    ["--max-tokens-per-micro-batch", "200", "--prm-loss", "dpo", "--estimator", "ppo", "--mini-batches", "2"],
    ["--loss-mean", "micro", "--micro-batch-size", "5"],
    ["--filter-mode", "refill", "--filter-low", "0.2", "--filter-high", "0.8"],
    ["--rloo-form", "paper", "--process-gamma", "0.5"], ["--estimator", "grpo", "--gamma", "0.9", "--outcome-gamma", "1"],
    ["--process", "step", "--step-scorer", "toy-first", "--step-noise", "0.3"],
    ["--prm-init", "teacher", "--process-groups", "mixed"],
], ids=lambda f: " ".join(f))
def test_every_loop_option_runs_a_training_step(flags, cache_dir, tmp_path):
    """Each option the paper studies, one real step in-process (the verifier pool is shared)."""
    run_dir = train.main(["--cache-dir", str(cache_dir), "--sft-steps", str(SFT_STEPS), "--out-dir", str(tmp_path),
                          "--run-name", "v", "--steps", "2", "--prompts-per-step", "4", "--eval-problems", "4",
                          "--micro-batch-size", "8", "--filter-low", "0", "--filter-high", "1", *flags])
    metrics = metrics_of(run_dir)
    assert len(metrics) == 2
    args = config.parse_args(flags)
    if args.process != "none" and any(m["kept_groups"] for m in metrics):  # wrong responses -> localisation
        episodes = [json.loads(l) for l in (run_dir / "episodes.jsonl").read_text().splitlines()]
        assert episodes and all("first_wrong_step" in e for e in episodes)
    kept = [m for m in metrics if m["kept_groups"] > 0]
    assert kept or "--filter-truncated" in flags
    if args.filter_mode == "refill":  # a full batch unless the step ran out of draws
        assert all(m["kept_groups"] == 4 or m["refill_draws"] == args.refill_draws for m in metrics)
    if args.process == "implicit" and args.prm_online:  # the PRM trained whenever the filter kept something
        assert all(m["prm_loss"] > 0 for m in kept if args.prm_groups == "kept" or m["mixed_groups"])
        assert all(m["prm_loss"] == 0 for m in kept if args.prm_groups == "mixed" and not m["mixed_groups"])
    else:  # no PRM update: no PRM loss
        assert all(m["prm_loss"] == 0 for m in metrics)
    if args.process == "none":
        assert all(m["prm_accuracy"] is None and m["process_reward_abs_mean"] == 0 for m in metrics)
    if args.estimator == "ppo":  # the critic trained on every step that kept something
        assert all(m["value_loss"] > 0 for m in kept)
    else:
        assert all("value_loss" not in m for m in metrics)
    if args.process == "step":  # the exact checker gives non-zero rewards to the steps it accepts
        assert all(m["process_reward_abs_mean"] > 0 for m in kept)
    if args.process in ("opd", "gopd"):  # teacher != student: a signal from the first step on
        assert all(m["process_reward_abs_mean"] > 0 for m in kept)
    saved = json.loads((run_dir / "config.json").read_text())
    changed = {k: v for k, v in dataclasses.asdict(config.parse_args(flags)).items()
               if v != getattr(config.Args(), k)}
    assert changed and {k: saved[k] for k in changed} == changed  # the run used the flags it was given


def test_qa_rows_become_hotpotqa_style_tasks(tmp_path):
    tokenizer = toy_task.build_tokenizer()
    rows = [{"question": "Q1?", "answer": "Paris", "context": [["France", ["Paris is big.", " It is old."]]]},
            {"question": "Q2?", "answer": ["NYC", "New York"],
             "context": {"title": ["A", "B"], "sentences": [["a1.", "a2."], ["b1."]]}},
            {"question": "Q3?", "answer": "x"}]
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = config.Args(data=str(tmp_path / "qa.jsonl"), task="qa", prompt_key="question", max_prompt_len=10_000)
    tasks = data.read_tasks(args, tokenizer)
    assert [t.kind for t in tasks] == ["qa"] * 3
    # labelled paragraphs and sentences, one paragraph a line (PASS's prompt; eval.py's QA benchmarks alike)
    assert tasks[0].text == "Context:\n[P1] France: [S1] Paris is big. [S2] It is old.\n\nQuestion: Q1?" + data.QA_SUFFIX
    assert tasks[1].text.startswith("Context:\n[P1] A: [S1] a1. [S2] a2.\n[P2] B: [S1] b1.\n\nQuestion: Q2?")
    assert tasks[1].answer == ["NYC", "New York"]  # aliases stay a list: verify.py takes the best match
    assert tasks[2].text == "Q3?" + data.QA_SUFFIX  # no context field: the question alone
    assert "Final Answer: [Entity]" in data.QA_SUFFIX
    tasks = data.read_tasks(config.Args(data=str(tmp_path / "qa.jsonl"), task="qa", prompt_key="question",
                                        max_prompt_len=10_000, user_suffix=""), tokenizer)
    assert tasks[2].text == "Q3?"  # --user-suffix '' means no suffix at all


def test_qa_task_trains_a_few_steps(cache_dir, tmp_path):
    rows = [{"question": f"Who is {i}?", "answer": "Ann" if i % 2 else ["Bob", "Robert"]} for i in range(12)]
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_dir = train.main(["--cache-dir", str(cache_dir), "--sft-steps", str(SFT_STEPS), "--out-dir", str(tmp_path),
                          "--run-name", "qa", "--steps", "2", "--prompts-per-step", "4", "--data",
                          str(tmp_path / "qa.jsonl"), "--task", "qa", "--prompt-key", "question",
                          "--user-suffix", " Final Answer:", "--max-prompt-len", "100",
                          "--filter-low", "0", "--filter-high", "1"])
    metrics = metrics_of(run_dir)
    assert len(metrics) == 2 and all(m["kept_groups"] == 4 for m in metrics)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_problems"] == 1  # a tenth of the rows is held out


def test_sampled_heldout_accuracy_near_zero_temperature_equals_greedy_and_keeps_the_rng(cache_dir):
    """The sampled metric at T -> 0 is the greedy one, and evaluating never shifts the training RNG."""
    from transformers import AutoModelForCausalLM
    path = toy_task.sft_checkpoint(cache_dir, SFT_STEPS)
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = toy_task.build_tokenizer()
    args = config.Args(temperature=1e-4, eval_problems=24, max_response_len=96, rollout="hf")
    _, tasks = data.load_tasks(args, tokenizer)
    d = ddp.Dist()
    state = torch.get_rng_state()
    sampler = HFRollout(model, tokenizer, args.max_response_len, args.temperature, args.top_p, batch_size=512)
    greedy = evaluation.heldout_accuracy(sampler, tasks, args, d)
    sampled = evaluation.heldout_accuracy(sampler, tasks, args, d, samples=3)
    assert torch.equal(torch.get_rng_state(), state)
    assert sampled == pytest.approx(greedy)
    # at T = 1 the value is a mean over 3 samples of 24 problems, and the same each time
    args = config.Args(temperature=1.0, eval_problems=24, max_response_len=96, rollout="hf")
    sampler = HFRollout(model, tokenizer, args.max_response_len, args.temperature, args.top_p, batch_size=512)
    first = evaluation.heldout_accuracy(sampler, tasks, args, d, samples=3)
    assert first * 72 == pytest.approx(round(first * 72))
    assert evaluation.heldout_accuracy(sampler, tasks, args, d, samples=3) == first


def test_progress_bar_names_what_runs():
    assert runlog.run_label(config.Args()) == "PRIME"
    assert runlog.run_label(config.Args(process="none")) == "outcome-only"
    assert runlog.run_label(config.Args(process="none", estimator="grpo")) == "GRPO + outcome-only"
    assert runlog.run_label(config.Args(estimator="pass", process="step")) == "PASS + step PRM"


def test_filter_groups_puts_mixed_groups_first_for_the_prm():
    """--prm-groups mixed: kept groups reordered mixed-first (each part in order); the PRM's rows are
    the mixed ones. K = 2, groups: 0 all wrong, 1 mixed, 2 all right, 3 mixed."""
    from types import SimpleNamespace
    outcome = torch.tensor([0., 0., 1., 0., 1., 1., 0., 1.])
    ro = SimpleNamespace(truncated=torch.zeros(8, dtype=torch.bool))
    args = config.parse_args(["--n-samples", "2", "--filter-low", "0", "--filter-high", "1", "--prm-groups", "mixed"])
    rows, n_groups, n_train, n_prm = train.filter_groups(outcome, ro, args)
    assert rows.tolist() == [2, 3, 6, 7, 0, 1, 4, 5] and (n_groups, n_train, n_prm) == (4, 8, 4)
    args.prm_groups = "kept"  # the paper: every kept group, in order
    rows, n_groups, n_train, n_prm = train.filter_groups(outcome, ro, args)
    assert rows.tolist() == list(range(8)) and (n_groups, n_train, n_prm) == (4, 8, 8)
    args.filter_low, args.filter_high = 0.2, 0.8  # the filter keeps the mixed groups only
    rows, n_groups, n_train, n_prm = train.filter_groups(outcome, ro, args)
    assert rows.tolist() == [2, 3, 6, 7] and (n_groups, n_train, n_prm) == (2, 4, 4)
    rows, n_groups, n_train, n_prm = train.filter_groups(torch.zeros(8), ro, args)  # nothing kept: placeholder
    assert rows.tolist() == [0, 1] and (n_groups, n_train, n_prm) == (0, 0, 0)
    assert prime.mixed_groups(torch.tensor([0.5, 0.5, 0.5, 1.0]), 2).tolist() == [False, True]  # soft labels


@pytest.mark.parametrize("norm", ["batch", "beta"])
def test_process_rewards_reach_the_mixed_groups_only_when_asked(norm):
    """--process-groups mixed: the uniform groups' process rewards are 0, set before the scaling, so
    the batch normaliser is the mixed groups' own largest |return-to-go|. K = 2, groups: 0 all wrong,
    1 mixed. By hand: with 'all' the largest |return-to-go| is row 0's |-3 - 1| = 4; with 'mixed' it
    is row 2's 1 + 0.5 = 1.5."""
    signal = torch.tensor([[-3.0, -1.0, 0.0], [2.0, 0.0, 0.0], [1.0, 0.5, 0.0], [-0.5, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1, 0], [1, 0, 0], [1, 1, 0], [1, 0, 0]])
    outcome = torch.tensor([0.0, 0.0, 1.0, 0.0])
    args = config.parse_args(["--n-samples", "2", "--process-norm", norm, "--beta", "0.5"])
    scale = (lambda m: m / 4) if norm == "batch" else (lambda m: 0.5 * m)
    assert torch.allclose(train.process_rewards(args, signal, None, mask, outcome, ddp.Dist()), scale(signal * mask))
    args.process_groups = "mixed"
    scale = (lambda m: m / 1.5) if norm == "batch" else (lambda m: 0.5 * m)
    expected = scale(signal * mask * torch.tensor([0.0, 0, 1, 1])[:, None])
    assert torch.allclose(train.process_rewards(args, signal, None, mask, outcome, ddp.Dist()), expected)


def test_prm_init_starts_the_prm_from_the_teacher_and_keeps_the_sft_reference(cache_dir):
    """--prm-init teacher (E7): the PRM's weights are the clean demonstrator's, the reference and the
    policy stay the SFT checkpoint's."""
    import models as run_models
    args = config.parse_args(["--cache-dir", str(cache_dir), "--sft-steps", str(SFT_STEPS), "--prm-init", "teacher"])
    m = run_models.build_models(args, ddp.Dist(device=torch.device("cpu")))
    teacher = run_models.load_frozen(str(toy_task.sft_checkpoint(cache_dir, toy_task.TEACHER_SFT_STEPS, slip=0.0)),
                                     ddp.Dist(device=torch.device("cpu")))
    same = lambda a, b: all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))  # noqa: E731
    assert same(m.prm, teacher) and same(m.reference, m.policy) and not same(m.prm, m.policy)


def test_prm_freeze_step_stops_the_prm_and_keep_checkpoints_keeps_every_step(cache_dir, tmp_path):
    """--prm-freeze-step 2: the PRM learns at steps 1 and 2 (0-based 0, 1) and not at step 3, while the
    policy still does; --keep-checkpoints leaves checkpoint-1, -2 and -3 to compare."""
    proc = run_train(["--steps", "3", "--run-name", "freeze", "--save-every", "1", "--keep-checkpoints",
                      "--prm-freeze-step", "2", "--prompts-per-step", "8", "--eval-problems", "8", "--eval-every", "0"],
                     cache_dir, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "freeze"
    state = {k: torch.load(run / f"checkpoint-{k}" / "state.pt", weights_only=False) for k in (1, 2, 3)}

    def same(a, b):
        return all(torch.equal(a[k], b[k]) for k in a)
    assert not same(state[1]["prm"], state[2]["prm"]) and same(state[2]["prm"], state[3]["prm"])
    assert not same(state[2]["policy"], state[3]["policy"])
    assert os.readlink(run / "checkpoint") == "checkpoint-3"


def test_pairwise_accuracy_counts_the_mixed_groups_only():
    """An all-wrong group scores 0.5 in prime.prm_pairwise_accuracy whatever the scores; the logged
    accuracy leaves it out. K = 2: group 0 mixed and ranked right (1.0), group 1 all wrong."""
    args = config.parse_args(["--n-samples", "2"])
    score, outcome = torch.tensor([2.0, -1.0, 5.0, -5.0]), torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert runlog.pairwise_accuracy_sum(score, outcome, 4, args) == [1.0, 1]
    assert runlog.pairwise_accuracy_sum(score, outcome, 2, args) == [1.0, 1]  # rows past n_train ignored
    score[:2] = torch.tensor([-1.0, 2.0])  # ranked wrong
    assert runlog.pairwise_accuracy_sum(score, outcome, 4, args) == [0.0, 1]
    assert runlog.pairwise_accuracy_sum(score, torch.zeros(4), 4, args) == [0.0, 0]  # no mixed group: no count
    args.process = "none"
    assert runlog.pairwise_accuracy_sum(score, outcome, 4, args) == [0.0, 0]


def test_prm_learns_from_its_rows_only_and_rewards_the_rest_from_the_same_prm(cache_dir):
    """implicit_prm_step with n_prm < n_train: the PRM's update equals an update on the first n_prm
    rows alone, and the other rows' rewards are the pre-update PRM's log-ratio."""
    path = toy_task.sft_checkpoint(cache_dir, SFT_STEPS)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(path)
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    torch.manual_seed(0)
    sampler = HFRollout(ref, tokenizer, max_new_tokens=24)
    ro = sampler.generate([tokenizer(p.prompt)["input_ids"] for p in toy_task.make_problems(3, seed=7)], n=2)
    mask = ro.response_mask.float()
    outcome = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    args = config.parse_args(["--n-samples", "2", "--micro-batch-size", "2"])
    logp_ref = microbatch.logprobs_no_grad(ref, ro, args)
    d = ddp.Dist(device=torch.device("cpu"))

    def fresh():  # a PRM that has moved off the reference (the same way each time): non-zero rewards
        prm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in prm.parameters():
                p.add_(0.02 * torch.randn(p.shape, generator=gen))
        return prm, torch.optim.AdamW(prm.parameters(), lr=1e-3)

    prm, opt = fresh()
    before = microbatch.logprobs_no_grad(prm, ro, args)
    rewards, losses = train.implicit_prm_step(prm, opt, train.with_plans(train.Batch(ro, outcome, mask, None, [], [], 6, 2),
                                                                         args, d), logp_ref, args, d)
    alone, opt_alone = fresh()
    first = ro.select(slice(0, 2))
    train.implicit_prm_step(alone, opt_alone, train.with_plans(train.Batch(first, outcome[:2], mask[:2], None, [], [], 2, 2),
                                                               args, d), logp_ref[:2], args, d)
    for a, b in zip(prm.parameters(), alone.parameters()):
        assert torch.equal(a, b)
    assert len(losses) == 1 and any(not torch.equal(a, b) for a, b in zip(prm.parameters(), ref.parameters()))
    expected = (before - logp_ref) * mask
    assert torch.allclose(rewards, expected, atol=1e-6) and rewards[2:].abs().sum() > 0


def test_one_update_per_batch_takes_the_old_logprobs_from_its_own_forward(cache_dir):
    """--mini-batches 1: update_policy without a separate old-log-prob pass (logp_old None) takes the
    same step, to float64 round-off, as with pi_old's log-probs recomputed by logprobs_no_grad; and
    needs_old_logprobs asks for the pass exactly where something else reads them."""
    path = toy_task.sft_checkpoint(cache_dir, SFT_STEPS)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(0)
    sampler = HFRollout(AutoModelForCausalLM.from_pretrained(path), tokenizer, max_new_tokens=32)
    ro = sampler.generate([tokenizer(p.prompt)["input_ids"] for p in toy_task.make_problems(3, seed=4)], n=2)
    mask = ro.response_mask.double()
    adv = torch.randn(mask.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * mask
    args = config.parse_args(["--n-samples", "2", "--micro-batch-size", "4", "--temperature", "0.7"])
    b = train.with_plans(train.Batch(ro, torch.zeros(6), mask, None, [], [], 6, 6), args, ddp.Dist())
    steps = []
    for recompute in (True, False):
        policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64)
        models = train.Models(path, tokenizer, policy, torch.optim.SGD(policy.parameters(), lr=1.0))
        start = [p.detach().clone() for p in policy.parameters()]
        logp_old = microbatch.logprobs_no_grad(policy, ro, args, args.temperature) if recompute else None
        losses = train.update_policy(args, models, b, logp_old, adv, None, ddp.Dist())
        steps.append(([p.detach() - s for p, s in zip(policy.parameters(), start)], losses))
    (with_pass, loss_with), (without, loss_without) = steps
    assert max(d.abs().max().item() for d in with_pass) > 1e-3  # a real step
    for a, c in zip(with_pass, without):
        assert torch.allclose(a, c, rtol=1e-9, atol=1e-12)
    assert loss_with == pytest.approx(loss_without, rel=1e-9, abs=1e-12)

    needs = lambda flags, reference=object(), rollout=ro: train.needs_old_logprobs(  # noqa: E731
        config.parse_args(flags), train.Models(path, tokenizer, None, None, reference=reference), rollout)
    assert not needs([]) and not needs(["--process", "none"], None) and not needs(["--estimator", "ppo"])
    assert not needs(["--process", "step", "--step-scorer", "toy"], None)
    assert needs(["--mini-batches", "2"]) and needs(["--reference", "policy"], None)
    assert needs(["--process", "opd"], None) and needs(["--process", "gopd"])
    # another engine sampled (vLLM brings its own log-probs): the rollout correction compares them with pi_old's
    sampled_elsewhere = dataclasses.replace(ro, sampler_logprobs=torch.zeros(ro.response_ids.shape))
    assert needs([], rollout=sampled_elsewhere) and needs(["--process", "none"], None, sampled_elsewhere)


def test_concat_rollouts_repads_prompts_left_and_responses_right():
    from rollout import Rollout, concat_rollouts
    a = Rollout(torch.tensor([[5, 6]]), torch.tensor([[1, 1]]), torch.tensor([[7, 8, 9]]), torch.tensor([[1, 1, 1]]),
                torch.tensor([True]))
    b = Rollout(torch.tensor([[0, 0, 4]]), torch.tensor([[0, 0, 1]]), torch.tensor([[3]]), torch.tensor([[1]]),
                torch.tensor([False]))
    got = concat_rollouts([a, b], pad_id=0)
    assert got.prompt_ids.tolist() == [[0, 5, 6], [0, 0, 4]] and got.prompt_mask.tolist() == [[0, 1, 1], [0, 0, 1]]
    assert got.response_ids.tolist() == [[7, 8, 9], [3, 0, 0]] and got.response_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert got.truncated.tolist() == [True, False] and got.sampler_logprobs is None


def test_refill_keeps_the_groups_a_plain_loop_keeps_until_the_batch_is_full(cache_dir):
    """--filter-mode refill: draw after draw of fresh prompts until 8 groups pass the filter; the
    batch is the first 8 kept groups in sampling order, exactly what a plain loop over the same draws
    keeps, and a capped number of draws trains on what it has."""
    path = toy_task.sft_checkpoint(cache_dir, SFT_STEPS)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    args = config.parse_args(["--filter-mode", "refill", "--prompts-per-step", "8", "--max-response-len", "96"])
    sampler, d = HFRollout(model, tokenizer, 96, args.temperature, args.top_p), ddp.Dist()

    def first_draw():
        torch.manual_seed(11)
        tasks = train.step_prompts(args, [], tokenizer, 5, d)
        ro = sampler.generate([t.prompt_ids for t in tasks], n=4)
        return (tasks, ro, *train.verify_rollouts(sampler, ro, tasks, args))

    tasks, ro, texts, scores, outcome, draws = train.refill(args, sampler, [], tokenizer, 5, d, first_draw(), {})
    b, kept = train.kept_batch(ro, outcome, texts, tasks, args, d)
    # the plain loop: the same draws, group by group
    torch.manual_seed(11)
    kept_prompts, plain_draws = [], 0
    for draw in range(args.refill_draws + 1):
        if len(kept_prompts) >= 8:
            break
        plain_draws = draw
        batch = train.step_prompts(args, [], tokenizer, 5, d, draw=draw)
        plain_ro = sampler.generate([t.prompt_ids for t in batch], n=4)
        _, _, rewards = train.verify_rollouts(sampler, plain_ro, batch, args)
        for g, task in enumerate(batch):
            if 0.2 <= rewards[4 * g:4 * g + 4].mean() <= 0.8:
                kept_prompts.append(task.text)
    assert draws == plain_draws >= 1  # the shipped start keeps about 5 of 8 groups a draw
    assert kept == min(8, len(kept_prompts)) == 8 and b.n_train == 32
    assert b.questions[::4] == kept_prompts[:8]
    assert len(tasks) == 8 * (draws + 1) and ro.response_ids.shape[0] == 32 * (draws + 1)
    capped = config.parse_args(["--filter-mode", "refill", "--prompts-per-step", "8", "--refill-draws", "0"])
    *_, none = train.refill(capped, sampler, [], tokenizer, 5, d, first_draw(), {})
    assert none == 0


def test_ppo_critic_warmup_freezes_the_policy_and_the_critic_learns(cache_dir, tmp_path):
    """--critic-warmup-steps 2 of 3: the policy's optimiser steps once, the critic's three times; the
    critic is the SFT backbone with a scalar head, and its value loss falls as it fits."""
    run_dir = train.main(["--cache-dir", str(cache_dir), "--sft-steps", str(SFT_STEPS), "--out-dir", str(tmp_path),
                          "--run-name", "w", "--steps", "3", "--prompts-per-step", "8", "--eval-problems", "4",
                          "--estimator", "ppo", "--process", "none", "--critic-warmup-steps", "2",
                          "--filter-low", "0", "--filter-high", "1", "--critic-lr", "1e-3"])
    state = torch.load(run_dir / "checkpoint" / "state.pt", weights_only=False)
    assert [int(v["step"]) for v in state["policy_opt"]["state"].values()][:1] == [1]
    assert [int(v["step"]) for v in state["critic_opt"]["state"].values()][:1] == [3]
    assert "score.weight" in state["critic"] and state["critic"]["score.weight"].shape[0] == 1
    metrics = metrics_of(run_dir)
    assert [m["policy_loss"] for m in metrics[:2]] == [0.0, 0.0] and metrics[2]["policy_loss"] != 0.0
    assert metrics[-1]["value_loss"] < metrics[0]["value_loss"]


def test_critic_values_read_the_state_before_each_response_token(cache_dir):
    """critic_values at response token t equals the critic's output at the position before it, on a
    left-padded batch (the same alignment as response_logprobs)."""
    path = toy_task.sft_checkpoint(cache_dir, SFT_STEPS)
    from transformers import AutoModelForTokenClassification, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(path)
    critic = AutoModelForTokenClassification.from_pretrained(path, num_labels=1, dtype=torch.float32).eval()
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM
    sampler = HFRollout(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), tokenizer, max_new_tokens=12)
    prompts = [tokenizer(p.prompt)["input_ids"] for p in toy_task.make_problems(2, seed=3)]
    prompts[0] = prompts[0][-4:]  # left padding in row 0
    ro = sampler.generate(prompts, n=1)
    with torch.no_grad():
        values = microbatch.critic_values(critic, ro)
        for i in range(2):  # each row alone, unpadded: V before token t = output at prompt_len - 1 + t
            ids = torch.tensor([prompts[i] + ro.response_ids[i][ro.response_mask[i].bool()].tolist()])
            out = critic(input_ids=ids).logits[0, :, 0]
            n = int(ro.response_mask[i].sum())
            torch.testing.assert_close(values[i, :n], out[len(prompts[i]) - 1:len(prompts[i]) - 1 + n],
                                       atol=1e-5, rtol=1e-4)
            assert (values[i, n:] == 0).all()


EURUS = Path(__file__).resolve().parent / "fixtures" / "eurus2_mixed.parquet"
EURUS_SOLUTIONS = {  # a right program for each code row of the fixture, by its prompt's first words
    "Read a and b": "a, b = map(int, input().split())\nprint(a + b)",
    "Read n;": "print(int(input()) * 2)",
    "Write add(a, b)": "class Solution:\n    def add(self, a, b):\n        return a + b",
    "Write pair(n)": "def pair(n):\n    return (n, n)",
}


def test_prime_rl_data_schema_mixes_math_and_code_rows():
    """PRIME's RL data (Eurus-2-RL-Data) in veRL's schema: `ability` picks the verifier per row; code
    ground truths are JSON tests, stdin/stdout and call-based, and a right program passes them all."""
    import verify
    tokenizer = toy_task.build_tokenizer()
    args = config.Args(data=str(EURUS), max_prompt_len=10_000)
    tasks = data.read_tasks(args, tokenizer)
    assert [t.kind for t in tasks] == ["math"] * 4 + ["code"] * 4
    assert tasks[0].text.startswith("What is 3+4?") and tasks[2].answer == "\\frac{3}{2}"
    programs = [next(p for k, p in EURUS_SOLUTIONS.items() if t.text.startswith(k)) for t in tasks[4:]]
    # a generous per-test limit: this checks the schema and the verdicts, not speed (under the whole
    # suite's load the first program of a fresh worker once scored 0 at the default 5 s)
    scores = verify.score_batch([f"```python\n{p}\n```" for p in programs], [t.answer for t in tasks[4:]],
                                ["code"] * 4, timeout=30)
    assert [s.reward for s in scores] == [1.0] * 4, [s.reason for s in scores]
    wrong = verify.score_batch(["```python\nprint(0)\n```"] * 4, [t.answer for t in tasks[4:]], ["code"] * 4)
    assert all(s.reward < 1.0 for s in wrong)


def pa_concat(tables):
    import pyarrow as pa
    return pa.concat_tables(tables)


def test_a_mixed_math_and_code_file_trains_and_logs_the_reward_per_ability(cache_dir, tmp_path, capsys):
    import pyarrow.parquet as pq
    table = pq.read_table(EURUS)
    twice = tmp_path / "eurus2_mixed_x2.parquet"  # 16 rows: one held out (a tenth), 15 to train on
    pq.write_table(pa_concat([table, table]), twice)
    run_dir = train.main(["--cache-dir", str(cache_dir), "--sft-steps", str(SFT_STEPS), "--out-dir", str(tmp_path),
                          "--run-name", "mixed", "--steps", "2", "--prompts-per-step", "8", "--data", str(twice),
                          "--max-prompt-len", "160", "--filter-low", "0", "--filter-high", "1"])
    metrics = metrics_of(run_dir)
    assert len(metrics) == 2
    for m in metrics:  # every step draws both kinds here (8 prompts of 15 rows, 7 or 8 of each kind)
        assert m["reward_math"] is not None and m["reward_code"] is not None
        low, high = sorted((m["reward_math"], m["reward_code"]))
        assert low - 1e-9 <= m["reward"] <= high + 1e-9  # the mean over both kinds
    import sandbox  # the policy's programs ran: the run said in which sandbox, at start-up
    assert sandbox.announce() in capsys.readouterr().out


@pytest.mark.parametrize("correction", ["token-band", "sequence-band", "token-truncate", "token-mask", "none"])
def test_the_policy_loss_takes_the_band_mask_in_band_modes_and_the_plain_mask_otherwise(correction, monkeypatch):
    """train.update_policy: in a "band" mode the tokens whose weight the correction zeroed leave the loss's
    token mean (prime.band_mask), numerator and denominator; in every other mode the mask is the
    responses' own, and a zero weight only zeroes a token's term. Checked on what reaches
    prime.ppo_clip_loss and on the token count that divides it."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from models import Models
    torch.manual_seed(0)
    policy = Qwen2ForCausalLM(Qwen2Config(vocab_size=20, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                          num_attention_heads=2, num_key_value_heads=1))
    models = Models("", None, policy, torch.optim.SGD(policy.parameters(), lr=0.0))
    args = config.Args(rollout_correction=correction, n_samples=2, micro_batch_size=4, max_tokens_per_micro_batch=0)
    ro = rollout_of(4, 5)
    b = train.with_plans(train.Batch(ro, torch.ones(4), ro.response_mask.float(), torch.arange(4), [""] * 4,
                                     [""] * 4, n_train=4, n_prm=4), args, ddp.Dist())
    weights = torch.ones(4, 5)
    weights[1, 2] = weights[3, 0] = 0.0  # out of the band
    seen = []
    clip = prime.ppo_clip_loss
    monkeypatch.setattr(prime, "ppo_clip_loss", lambda logp, old, adv, mask, *a, **k: (seen.append(mask.clone()),
                                                                                      clip(logp, old, adv, mask, *a, **k))[1])
    counted = []
    run_update = train.run_update
    monkeypatch.setattr(train, "run_update", lambda model, opt, loss_fn, count, plan, *a: (
        counted.append(sum(count(mb) for step in plan for mb in step)), run_update(model, opt, loss_fn, count, plan, *a))[1])
    train.update_policy(args, models, b, None, torch.ones(4, 5), weights if correction != "none" else None, ddp.Dist())
    band = correction.endswith("band")
    expected = b.mask * (weights > 0) if band else b.mask
    assert torch.equal(torch.cat(seen), expected)
    assert counted == [float(expected.sum())] and float(expected.sum()) == (18.0 if band else 20.0)


def rollout_of(rows: int, width: int):
    from rollout import Rollout
    g = torch.Generator().manual_seed(0)
    ones = torch.ones(rows, width, dtype=torch.long)
    return Rollout(torch.randint(3, 20, (rows, 3), generator=g), torch.ones(rows, 3, dtype=torch.long),
                   torch.randint(3, 20, (rows, width), generator=g), ones, torch.zeros(rows, dtype=torch.bool))


HEALTH = ["actor/pg_clipfrac", "actor/pg_clipfrac_high", "actor/pg_clipfrac_low", "actor/ppo_kl", "actor/entropy",
          "actor/kl_loss", "actor/grad_norm", "actor/lr", "prm/grad_norm", "prm/lr",
          *[f"critic/{what}/{stat}" for what in ("advantages", "returns") for stat in ("mean", "std", "min", "max")],
          "response_length/mean", "response_length/max", "response_length/clip_ratio"]


def test_every_step_logs_the_health_metrics_and_tensorboard_reads_them_back(cache_dir, tmp_path):
    """metrics.jsonl carries veRL's health metrics every step, and --tracker tensorboard writes the same
    numbers, read back here with TensorBoard's own reader: each value at its step."""
    pytest.importorskip("tensorboard", reason="--tracker tensorboard: pip install -r requirements-trackers.txt")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    run = train_here(["--steps", "2", "--run-name", "tb", "--tracker", "tensorboard", "--eval-every", "0",
                      "--mini-batches", "2"], cache_dir, tmp_path)
    metrics = metrics_of(run)
    for m in metrics:
        assert set(HEALTH) <= set(m), set(HEALTH) - set(m)
        assert m["actor/kl_loss"] is None  # no --kl-coef: PRIME's loop has no reference term
        assert 0 <= m["actor/pg_clipfrac"] <= 1 and m["actor/ppo_kl"] >= 0 and m["actor/entropy"] > 0
        assert m["actor/pg_clipfrac"] == pytest.approx(m["actor/pg_clipfrac_high"] + m["actor/pg_clipfrac_low"])
        assert m["actor/grad_norm"] > 0 and m["prm/grad_norm"] > 0 and m["actor/lr"] == 5e-5 and m["prm/lr"] == 3e-4
        assert m["critic/advantages/min"] <= m["critic/advantages/mean"] <= m["critic/advantages/max"]
        assert m["response_length/mean"] == pytest.approx(m["response_length"])  # the older name, the same number
        assert m["response_length/mean"] <= m["response_length/max"] <= 96
    assert metrics[1]["actor/ppo_kl"] > 0  # the second mini-batch's policy is no longer pi_old
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    for m in metrics:
        for key, value in m.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "step":
                point = next(e for e in events.Scalars(key) if e.step == m["step"])
                assert point.value == pytest.approx(value, rel=1e-6, abs=1e-9), key
    assert {e.step for e in events.Scalars("time/rollout")} == {1, 2}


def test_pass_keeps_its_reference_term_and_the_kl_flags_resolve_as_the_paper_runs():
    assert (config.parse_args([]).kl_coef, config.parse_args([]).kl_kind) == (0.0, "k3")  # PRIME: none
    passed = config.parse_args(["--estimator", "pass"])
    assert (passed.kl_coef, passed.kl_kind) == (0.01, "k3")  # PASS App. G: 1e-2, veRL's low_var_kl
    qa = config.parse_args(["--estimator", "pass", "--pass-preset", "qa", "--task", "qa"])
    assert (qa.kl_coef, qa.kl_kind) == (0.01, "abs")  # PASS's QA: the masked absolute log-prob difference
    assert config.parse_args(["--estimator", "pass", "--kl-coef", "0"]).kl_coef == 0.0
    assert config.Args(estimator="pass").kl_coef == 0.01 and config.Args().kl_coef == 0.0


def test_a_pass_run_trains_with_the_reference_term_against_the_frozen_sft_model(cache_dir, tmp_path):
    run = train_here(["--steps", "2", "--run-name", "pass-kl", "--estimator", "pass", "--eval-every", "0",
                      "--mini-batches", "2"], cache_dir, tmp_path)
    metrics = metrics_of(run)
    assert json.loads((run / "config.json").read_text())["kl_coef"] == 0.01
    assert metrics[0]["actor/kl_loss"] >= 0 and metrics[-1]["actor/kl_loss"] > 0  # the policy left the reference


def test_a_missing_tracker_package_is_named_with_its_install(monkeypatch, capsys):
    monkeypatch.setitem(runlog.TRACKERS, "wandb", "no_such_package_for_this_test")
    with pytest.raises(SystemExit) as stop:
        config.parse_args(["--tracker", "wandb"])
    assert stop.value.code == 2
    assert "--tracker wandb: the package 'no_such_package_for_this_test' is not installed (pip install -r " \
           "requirements-trackers.txt)" in capsys.readouterr().err
