"""memory.memory_estimate_gb against the live tensor bytes of real updates (tests/live_bytes.py), on CPU:
a Qwen2 of small widths run through train.update_policy exactly as train.py builds it (build_models:
train mode, checkpointing, the fp32 head under bf16), on a batch of rows at the flags' longest prompt
and response (the micro-batch the estimate sizes), with fixed rows and a token budget, checkpointing
on and off, fp32 and bf16, and once under DDP (a gloo group of one)."""

import dataclasses
import socket
import sys
from pathlib import Path

import pytest
import torch

import config
import ddp
import memory
import models
import train
from rollout import Rollout

sys.path.insert(0, str(Path(__file__).parent))
from live_bytes import LiveBytes  # noqa: E402

PROMPT, RESPONSE = 96, 160


@pytest.fixture(scope="module")
def qwen_path(tmp_path_factory):
    """A randomly initialised Qwen2 with small widths (4 layers, 4 heads over 2 KV heads, vocab 4096)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    import toy_task
    path = tmp_path_factory.mktemp("qwen")
    cfg = Qwen2Config(vocab_size=4096, hidden_size=128, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      tie_word_embeddings=True)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    toy_task.build_tokenizer().save_pretrained(path)  # ids are ids: any tokenizer will do
    return path


def full_batch(rows: int, vocab: int, prompt: int) -> train.Batch:
    """Rows of the longest response the flags allow, after prompts of `prompt` tokens."""
    g = torch.Generator().manual_seed(0)
    ones = lambda n: torch.ones(rows, n, dtype=torch.long)  # noqa: E731
    ro = Rollout(torch.randint(3, vocab, (rows, prompt), generator=g), ones(prompt),
                 torch.randint(3, vocab, (rows, RESPONSE), generator=g), ones(RESPONSE),
                 torch.zeros(rows, dtype=torch.bool))
    return train.Batch(ro, torch.zeros(rows), ro.response_mask.float(), torch.arange(rows), [""] * rows,
                       [""] * rows, n_train=rows, n_prm=rows)


def measured(args, d=None):
    """(estimate dict in bytes, model-state bytes of the policy, live bytes tracked over its second update,
    parameters) on the batch whose micro-batches the estimate sizes: with fixed rows, rows at the longest
    prompt and response; with a token budget, response-only rows (a one-token prompt) filling it, the
    most positions through the LM head a budget can hold."""
    d = d or ddp.Dist()
    m = models.build_models(args, d)
    policy = ddp.unwrap(m.policy)
    b = full_batch(8, policy.config.vocab_size, 1 if args.max_tokens_per_micro_batch else PROMPT)
    adv = torch.randn(b.mask.shape, generator=torch.Generator().manual_seed(1)) * b.mask
    b = train.with_plans(b, args, d)
    train.update_policy(args, m, b, None, adv, None, d)  # AdamW's state exists after this
    state = sum(t.numel() * t.element_size() for p in policy.parameters()
                for t in [p, p.grad, *m.policy_opt.state[p].values()] if t is not None and t.dim())
    with LiveBytes() as tracked:
        train.update_policy(args, m, b, None, adv, None, d)
    n = memory.base_parameters(policy)  # --lora-rank: the base's parameters, not the adapter's
    est = {k: v * 1e9 for k, v in memory.memory_estimate_gb(n, args, policy.config, cuda=False).items()}
    wrapped = isinstance(m.policy, torch.nn.parallel.DistributedDataParallel)
    del m
    return est, state, tracked.peak, n, wrapped


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["no-ckpt", "ckpt"])
@pytest.mark.parametrize("layout", [["--micro-batch-size", "2"], ["--max-tokens-per-micro-batch", str(4 * (RESPONSE + 1))]],
                         ids=["rows", "budget"])
def test_the_estimate_covers_what_an_update_holds_and_no_more_than_a_quarter_above(
        qwen_path, precision, checkpointing, layout, capsys):
    args = config.parse_args(["--model", str(qwen_path), "--precision", precision, "--max-prompt-len", str(PROMPT),
                              "--max-response-len", str(RESPONSE), "--rollout", "hf", "--process", "none",
                              *(["--gradient-checkpointing"] if checkpointing else []), *layout])
    est, state, peak, n, _ = measured(args)
    assert est["policy (weights, grads, AdamW)"] == pytest.approx(state, rel=1e-9)  # 16 bytes a parameter
    update = sum(v for k, v in est.items() if k.startswith("  update:"))
    optimizer = 8 * n  # foreach AdamW's temporaries on CPU
    assert est["phase: optimizer step (foreach AdamW's temporaries)"] == pytest.approx(optimizer)
    # the gradients are zeroed in place between steps (microbatch.run_update): they are in the state, and
    # what the update adds is its largest phase
    predicted = max(update, optimizer)
    print(f"{precision} ckpt={checkpointing} {layout}: tracked {peak / 1e6:.2f} MB, estimated {predicted / 1e6:.2f} MB "
          f"({predicted / peak:.2f}x)")
    assert peak <= predicted <= 1.25 * peak, (peak, predicted)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["no-ckpt", "ckpt"])
def test_the_lora_estimate_covers_what_an_update_holds_and_no_more_than_a_quarter_above(
        qwen_path, precision, checkpointing):
    """--lora-rank 8: the adapter's state is 16 bytes a parameter (lora_parameters counts them from the
    config), the update what the tracked tensors hold: each adapted layer's inputs again, no base
    weight's gradient, and (bf16) the head's fp32 copy instead of bf16 copies of the base."""
    args = config.parse_args(["--model", str(qwen_path), "--precision", precision, "--max-prompt-len", str(PROMPT),
                              "--max-response-len", str(RESPONSE), "--rollout", "hf", "--process", "none",
                              "--lora-rank", "8", "--micro-batch-size", "2",
                              *(["--gradient-checkpointing"] if checkpointing else [])])
    est, state, peak, n, _ = measured(args)
    assert est["policy adapter (weights, grads, AdamW)"] == pytest.approx(state, rel=1e-9)
    assert est[f"base, frozen ({precision}): policy, PRM and reference"] == \
        pytest.approx(n * (2 if precision == "bf16" else 4))
    update = sum(v for k, v in est.items() if k.startswith("  update:"))
    optimizer = est["phase: optimizer step (foreach AdamW's temporaries)"]
    predicted = max(update, optimizer)
    print(f"LoRA {precision} ckpt={checkpointing}: tracked {peak / 1e6:.2f} MB, estimated {predicted / 1e6:.2f} MB "
          f"({predicted / peak:.2f}x)")
    assert peak <= predicted <= 1.25 * peak, (peak, predicted)


def test_the_estimate_holds_under_ddp(qwen_path):
    """The same update through DistributedDataParallel (a gloo group of one in this process, as under
    `torchrun --nproc_per_node=1`): the gradients are views into DDP's buckets (gradient_as_bucket_view),
    allocated when the model is wrapped and zeroed in place, so the update holds no more than without."""
    import torch.distributed as dist
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, 1, True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        d = ddp.Dist()
        args = config.parse_args(["--model", str(qwen_path), "--max-prompt-len", str(PROMPT), "--max-response-len",
                                  str(RESPONSE), "--rollout", "hf", "--process", "none", "--micro-batch-size", "2"])
        est, state, peak, n, wrapped = measured(args, d)  # build_models wraps in DDP: there is a group
        assert wrapped
        update = sum(v for k, v in est.items() if k.startswith("  update:"))
        print(f"DDP: tracked {peak / 1e6:.2f} MB, estimated {max(update, 8 * n) / 1e6:.2f} MB")
        assert peak <= max(update, 8 * n) <= 1.25 * peak
    finally:
        import gc
        gc.collect()  # no DDP model may outlive the group (pytorch#56297)
        dist.destroy_process_group()


# The models the README names for the 1.5b preset, from their published config.json: one shape, tied
# (Qwen2.5-1.5B, Qwen2.5-Math-1.5B, whose max_position_embeddings 4096 holds the preset's 1024 + 3072)
# or untied (DeepSeek-R1-Distill-Qwen-1.5B: its own output layer, 233M parameters more).
QWEN2_1_5B = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                  num_attention_heads=12, num_key_value_heads=2)
NAMED_1_5B = {"DeepSeek-R1-Distill-Qwen-1.5B": dict(tie_word_embeddings=False, max_position_embeddings=131072),
              "Qwen2.5-1.5B": dict(tie_word_embeddings=True, max_position_embeddings=131072),
              "Qwen2.5-Math-1.5B": dict(tie_word_embeddings=True, max_position_embeddings=4096)}


@pytest.mark.parametrize("name", NAMED_1_5B)
def test_the_1_5b_preset_fits_80gb_on_each_named_model(name):
    """`torchrun --nproc_per_node=8 train.py --model NAME --preset 1.5b` on 80 GB cards, by the estimate
    check_memory makes on a GPU (bf16, vLLM colocated at its share of 80 GB, 8 ranks), the process's
    terms beyond tensors included. Without --offload-optimizer the untied model would not fit."""
    from transformers import AutoModelForCausalLM, Qwen2Config
    shape = Qwen2Config(**QWEN2_1_5B, **NAMED_1_5B[name])
    with torch.device("meta"):
        n = sum(p.numel() for p in AutoModelForCausalLM.from_config(shape).parameters())
    tied = shape.tie_word_embeddings
    assert n == (1_543_714_304 if tied else 1_777_088_000)
    # --rollout vllm set after parsing: the command line refuses it where vLLM is not installed (as on
    # the quickstart install), and the estimate needs only the flags, not the engine
    args = dataclasses.replace(config.parse_args(["--preset", "1.5b", "--precision", "bf16"]), rollout="vllm")
    assert args.offload_optimizer and args.vllm_sleep and args.max_prompt_len + args.max_response_len <= \
        shape.max_position_embeddings
    est = memory.memory_estimate_gb(n, args, shape, gpu_gb=80.0, world=8)
    print(f"{name}: {est['total']:.2f} GB")
    assert est["total"] <= 80.0
    beyond = {k: v for k, v in est.items() if k.startswith("beyond tensors")}
    assert beyond == {"beyond tensors: CUDA context and library workspaces": memory.CUDA_CONTEXT_GB,
                      "beyond tensors: NCCL buffers (2 groups of 8 ranks)": 2 * memory.NCCL_GB_PER_GROUP}
    # vLLM sleeps through the updates and keeps its CUDA-graph pool there (awake, the pool is in its share)
    assert est["  update: vLLM's CUDA-graph pool (kept through sleep)"] == pytest.approx(memory.VLLM_GRAPHS_GB)
    # its share, 0.25 of 80 GB, holds a step's 128 sequences a rank at once, and costs nothing: the update binds
    share = memory.vllm_share_gb(n, args, shape, 80.0, world=8)
    assert share["sequences a call"] == 128 and share["sequences at once"] >= 128 and share["waves"] == 1
    # the parts add up: the state, the largest phase with the allocator's 10%, then what is beyond tensors
    state = sum(v for k, v in est.items() if k.startswith(("policy", "prm", "reference")))
    largest = max(v for k, v in est.items() if k.startswith("phase:"))
    assert est["total"] == pytest.approx(1.1 * (state + largest) + sum(beyond.values()))
    assert est["phase: update"] > est["phase: sampling (vLLM's share, evaluation included)"]  # the binding phase
    kept = memory.memory_estimate_gb(n, dataclasses.replace(args, offload_optimizer=False), shape, gpu_gb=80.0, world=8)
    # kept on the GPU: both models' moments in the state (2 x 8 bytes a parameter), none added to an update
    kept_state = sum(v for k, v in kept.items() if k.startswith(("policy", "prm", "reference")))
    assert kept_state - state == pytest.approx(16 * n / 1e9, rel=1e-9)
    assert est["phase: update"] - kept["phase: update"] == pytest.approx(8 * n / 1e9, rel=1e-9)
    assert tied or kept["total"] > 80.0


# Qwen2.5-Math-7B, the PRIME paper's model, from its published config.json
QWEN25_MATH_7B = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                      num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False,
                      max_position_embeddings=4096)


def test_the_7b_preset_fits_80gb():
    """`torchrun --nproc_per_node=8 train.py --model Qwen2.5-Math-7B --preset 7b` on 80 GB cards, by the
    estimate check_memory makes on a GPU: one frozen bf16 base, two rank-64 adapters with fp32 AdamW,
    checkpointed activations of one row of 4096 tokens, vLLM's share (asleep during the updates)
    holding its own copy of the base and a KV cache for a step's sequences at once. Full fine-tuning of
    the same shape cannot fit."""
    from transformers import AutoModelForCausalLM, Qwen2Config
    shape = Qwen2Config(**QWEN25_MATH_7B)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(shape)
    n = sum(p.numel() for p in skeleton.parameters())
    assert n == 7_615_616_512  # Qwen2.5-Math-7B's parameter count
    args = dataclasses.replace(config.parse_args(["--preset", "7b", "--precision", "bf16"]), rollout="vllm")
    assert args.lora_rank == 64 and args.max_prompt_len + args.max_response_len <= shape.max_position_embeddings
    # the adapter's parameters as PEFT makes them on this shape, against lora_parameters' count from the config
    adapter = memory.lora_parameters(shape, 64)
    per_layer = sum(p.numel() for k, p in models.with_adapters(skeleton, args).named_parameters()
                    if ".lora_" in k and ".policy." in k and ".layers.0." in k)
    assert adapter == per_layer * shape.num_hidden_layers
    est = memory.memory_estimate_gb(n, args, shape, gpu_gb=80.0, world=8)
    print("7b preset:", ", ".join(f"{k} {v:.2f}" for k, v in est.items()))
    assert est["total"] <= 80.0
    assert est["base, frozen (bf16): policy, PRM and reference"] == pytest.approx(2 * n / 1e9)
    assert "reference (fp32, frozen)" not in est  # no third copy
    # vLLM sleeps through the updates at level 1 (rollout.VLLMRollout.sleep) and its share was chosen by
    # vllm_share_gb: the KV cache holds a step's 128 sequences a rank (4 samples of each of 32 prompts), at
    # full length, at once
    assert args.vllm_sleep
    share = memory.vllm_share_gb(n, args, shape, 80.0, world=8)
    print("7b preset's vLLM share:", memory.vllm_share_line(share, args))
    assert share["sequences a call"] == 128 and share["waves"] == 1
    assert share["LoRA slot (rank 64, bf16)"] == pytest.approx(2 * adapter / 1e9)
    # awake beside the updates, as the preset was before, its share held a third as many: three waves more
    awake = dataclasses.replace(args, vllm_sleep=False, vllm_gpu_memory_utilization=0.35)
    assert memory.vllm_share_gb(n, awake, shape, 80.0, world=8)["waves"] == 4
    assert memory.memory_estimate_gb(n, awake, shape, gpu_gb=80.0, world=8)["total"] <= 80.0
    full = memory.memory_estimate_gb(n, dataclasses.replace(args, lora_rank=0), shape, gpu_gb=80.0, world=8)
    assert full["policy (weights, grads, AdamW)"] > 120 and full["total"] > 80.0


def test_the_1_5b_shapes_fit_with_lora_without_offloading_the_optimizer():
    """The untied 1.5B (DeepSeek-R1-Distill-Qwen-1.5B), which full fine-tuning fits only with
    --offload-optimizer, fits with --lora-rank 64 and the moments on the GPU."""
    from transformers import AutoModelForCausalLM, Qwen2Config
    shape = Qwen2Config(**QWEN2_1_5B, **NAMED_1_5B["DeepSeek-R1-Distill-Qwen-1.5B"])
    with torch.device("meta"):
        n = sum(p.numel() for p in AutoModelForCausalLM.from_config(shape).parameters())
    args = dataclasses.replace(config.parse_args(["--preset", "1.5b", "--precision", "bf16", "--lora-rank", "64",
                                                  "--no-offload-optimizer"]), rollout="vllm")
    est = memory.memory_estimate_gb(n, args, shape, gpu_gb=80.0, world=8)
    print(f"1.5b with LoRA rank 64, moments on the GPU: {est['total']:.2f} GB")
    assert not args.offload_optimizer and est["total"] <= 80.0


def test_offloading_moves_the_moments_and_leaves_the_step_counts():
    """runlog.optimizer_state_to moves what has a size (exp_avg, exp_avg_sq: 8 bytes a parameter) and
    leaves AdamW's 0-dim step counts where the optimizer keeps them; here the target is the meta
    device, which only a move could put a tensor on."""
    import runlog
    layer = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(layer.parameters(), lr=0.1)
    layer(torch.ones(1, 3)).sum().backward()
    opt.step()
    runlog.optimizer_state_to(opt, "meta")
    for state in opt.state.values():
        assert state["exp_avg"].is_meta and state["exp_avg_sq"].is_meta
        assert not state["step"].is_meta and state["step"].item() == 1


def test_vllms_share_term_by_term_and_the_waves_a_call_takes():
    """memory.vllm_share_gb worked out by hand on a small shape: 3 layers, hidden 64, intermediate 256,
    4 heads of 16 over 2 KV heads (32 KV values a token a layer), vocabulary 1000."""
    from transformers import Qwen2Config
    shape = Qwen2Config(vocab_size=1000, hidden_size=64, intermediate_size=256, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2)
    args = config.Args(rollout="hf", lora_rank=4, vllm_gpu_memory_utilization=0.5, max_prompt_len=100,
                       max_response_len=300, n_samples=4, prompts_per_step=64)
    share = memory.vllm_share_gb(1_000_000, args, shape, gpu_gb=10.0, world=2)
    assert share["share"] == 5.0
    assert share["model (bf16)"] == pytest.approx(2e6 / 1e9)
    # the slot is rank 8 (vLLM's smallest that holds 4): 8 x (q 64+64, k and v 2 x (64+32), o 64+64,
    # gate and up 2 x (64+256), down 256+64) a layer, 3 layers, 2 bytes each
    assert share["LoRA slot (rank 8, bf16)"] == pytest.approx(2 * 8 * 1408 * 3 / 1e9)
    # 16384 tokens x (3 x 256 + 4 x 64) bf16 values, and 1024 rows of fp32 logits twice
    activations = 16384 * 1024 * 2 + 1024 * 1000 * 4 * 2
    assert share["profile run's activations"] == pytest.approx(activations / 1e9)
    kv = 5e9 - 2e6 - 2 * 8 * 1408 * 3 - activations - memory.VLLM_GRAPHS_GB * 1e9
    assert share["KV cache"] == pytest.approx(kv / 1e9)
    # a token's KV: 3 layers x (K and V) x 32 values x 2 bytes; a prompt's group: 100 + 4 x 300 tokens
    group = (100 + 4 * 300) * 3 * 2 * 32 * 2
    assert share["sequences at once"] == 4 * int(kv // group)
    assert share["sequences a call"] == 64 // 2 * 4 and share["waves"] == 1
    # a GPU of 2.2 GB: 1.1 GB of share, about 56 MB of KV cache, 112 groups of 4: 448 sequences, so
    # a call of 2048 (512 prompts a rank) takes 5 waves
    small = memory.vllm_share_gb(1_000_000, dataclasses.replace(args, prompts_per_step=1024), shape, 2.2, world=2)
    kv = 1.1e9 - 2e6 - 2 * 8 * 1408 * 3 - activations - memory.VLLM_GRAPHS_GB * 1e9
    assert small["sequences at once"] == 4 * int(kv // group) == 448
    assert small["sequences a call"] == 2048 and small["waves"] == 5


def test_a_vllm_share_with_no_room_for_a_sequence_is_refused_naming_the_flag(cache_dir, capsys):
    """check_memory, for a GPU of --max-memory-gb: a share that its weights, activations and graphs fill
    leaves no KV cache; the run is refused before any weight loads, naming the flag."""
    import toy_task
    from conftest import SFT_STEPS
    path = str(toy_task.sft_checkpoint(cache_dir, SFT_STEPS))
    args = dataclasses.replace(config.parse_args(["--max-memory-gb", "4", "--vllm-gpu-memory-utilization", "0.25"]),
                               rollout="vllm")
    with pytest.raises(SystemExit, match="--vllm-gpu-memory-utilization 0.25"):
        memory.check_memory(path, args, ddp.Dist(device=torch.device("cpu")))
    assert "vLLM's share 1.0 GB" in capsys.readouterr().out
    memory.check_memory(path, dataclasses.replace(args, vllm_gpu_memory_utilization=0.5), ddp.Dist(device=torch.device("cpu")))
    assert "1 wave(s) at most" in capsys.readouterr().out
