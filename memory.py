"""What a run holds in GPU memory, per rank under plain DDP, term by term, from the config alone: the
estimate train.py checks before any weight loads (check_memory), prints beside what the first step used
(memory_line), and the presets are sized by (config.PRESETS, tests/test_memory.py).

    est = memory_estimate_gb(n_params, args, config, gpu_gb=80.0, world=8)   # {term: GB, ..., "total": GB}

The terms: the model state (update_peak_bytes's activations and logits for one update, the adapters'
count lora_parameters for --lora-rank), the largest phase (an update, the optimizer step, sampling),
the allocator's margin, and what a CUDA process holds outside its tensors (beyond_tensors_gb); for
--rollout vllm, what the engine's share holds and how many sequences its KV cache takes at once
(vllm_share_gb).
"""

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from config import Args
from ddp import Dist, print0


def update_peak_bytes(config, n_params: int, args: Args) -> dict:
    """Bytes that one training update (the policy's or the PRM's: the same shapes) holds at its peak on
    top of the model state, for its largest micro-batch, term by term. Calibrated against the live
    tensor bytes of real updates (tests/test_memory.py counts them on CPU for Qwen2 shapes, fixed rows
    and token budgets, fp32 and bf16, with and without checkpointing: every term here is at least what
    was measured and the sum at most 25% above it).

    The largest micro-batch: `tokens` padded tokens (the budget, or micro_batch_size x (max prompt +
    max response); a row longer than the budget gets one of its own), `positions` of them through the
    LM head (its responses, + 1 a row), rows of up to `longest` tokens. Per token of each decoder layer,
    what autograd keeps: fp32, 4 x intermediate (gate, up, SiLU, their product) + 10 x hidden (the norms'
    outputs, q after RoPE, k and v repeated to every head, attention output, the residual sums) floats;
    bf16 autocast, 4 x intermediate x 2 bytes + 36 x hidden bytes (the matmuls' bf16 outputs and the
    bf16 casts of their fp32 inputs; the norms and the residual stream stay fp32); plus the attention
    mask, rows x longest^2 values a layer. The head's backward comes first, with every layer still held:
    then the logits (fp32, positions x vocabulary) are there twice (logits and their gradient,
    prime.token_logprobs), with two chunks of at most 2^24 floats (positions of one row). With gradient checkpointing each
    layer keeps only its input (hidden values in the residual stream's dtype: fp32, or bf16 on a --lora-rank
    bf16 base) and the peak is the larger of the head's backward and one layer's recomputed activations with
    the gradients flowing through it. bf16 autocast also keeps a
    bf16 copy of every decoder weight for the backward."""
    h, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    vocab, heads = config.vocab_size, config.num_attention_heads
    longest = args.max_prompt_len + args.max_response_len
    budget = args.max_tokens_per_micro_batch
    tokens = max(budget, longest) if budget else args.micro_batch_size * longest
    positions = tokens if budget else args.micro_batch_size * (args.max_response_len + 1)
    bf16 = args.precision == "bf16"
    size = 2 if bf16 else 4  # bytes of what the matmuls produce
    stream = 2 if bf16 and args.lora_rank else 4  # bytes of the residual stream: a bf16 base makes it bf16
    layer = tokens * (4 * inter * size + (36 if bf16 else 40) * h + 4 * heads) + tokens * longest * size
    # embeddings, final norm, the head's input, the boolean mask; norm scales, gathers: 64 bytes a token
    once = tokens * h * 4 * 2 + positions * h * 4 + tokens * longest + 64 * tokens
    chunk = min(2**24 // vocab, args.max_response_len + 1) * vocab * 4  # a chunk: positions of one row
    logits = 2 * positions * vocab * 4 + 2 * chunk
    flowing = tokens * (2 * inter + 2 * h) * size  # a layer's backward: the gradients passing through it
    copies = 2 * max(n_params - vocab * h, 0) if bf16 else 0
    if args.lora_rank:  # the adapters: each target's input again (bf16: its own cast) and its r-wide A x
        r = args.lora_rank
        layer += tokens * ((6 * h + inter) * 2 + 7 * r * 2 if bf16 else 7 * r * 4)
        if bf16:  # a bf16 base makes a bf16 residual stream: its sums, norms and embeddings at 2 bytes, not 4
            layer -= tokens * 8 * h
            once -= tokens * h * 2 * 2
        copies = 2 * lora_parameters(config, r) if bf16 else 0  # the base is bf16 already: only the adapters
    if args.gradient_checkpointing:
        held = {"activations (each layer's input)": layers * tokens * h * stream + once,
                "logits or one recomputed layer": max(logits, layer + flowing)}
    else:
        held = {"activations (every layer)": layers * layer + once, "logits and their gradient": logits}
    held["autocast's bf16 weight copies"] = copies
    if not args.lora_rank:
        # the output layer's fp32 weight gradient, computed whole before autograd adds it into .grad (its
        # DDP bucket): vocabulary x hidden floats, beside the logits' gradient
        held["the output layer's gradient before its bucket"] = vocab * h * 4
    elif bf16:  # frozen, no gradient; but keep_head_fp32's fp32 copy of the bf16 head, kept for the backward
        held["the output layer's fp32 copy"] = vocab * h * 4
    return held


def head_dim(config) -> int:
    """An attention head's width: the config's head_dim, or hidden / heads where it names none."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def lora_parameters(config, rank: int) -> int:
    """Parameters of one adapter on LORA_TARGETS: r x (inputs + outputs) of each projection, every layer."""
    h, inter = config.hidden_size, config.intermediate_size
    q, kv = config.num_attention_heads * head_dim(config), config.num_key_value_heads * head_dim(config)
    per_layer = (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + inter) + (inter + h)
    return rank * per_layer * config.num_hidden_layers


# What a GPU process holds beyond its tensors, per rank. Not measured by this project yet (no GPU has
# been lent since these terms were added): bench/run_gpu_checks.sh prints the estimate beside the
# device's own use. The sizes, from published measurements:
CUDA_CONTEXT_GB = 1.0  # the CUDA context with its kernels and the cuBLAS/cuDNN handles and workspaces,
#   one per process (vLLM runs in it too): 0.5-1 GB on an H100; vLLM's start-up profile on an 80 GB
#   GPU logs "non_torch_memory takes 1.27GiB", NCCL included (vllm-project/vllm pull 11743)
NCCL_GB_PER_GROUP = 1.6  # one NCCL communicator's buffers, linear in its channels: 0.54-0.69 GB on
#   4 x A100 over NVLink (NVIDIA/nccl issue 964), about 1.6 GB with an all-reduce in NVIDIA/nccl
#   issue 864; an H100's NVLink uses more channels
VLLM_GRAPHS_GB = 1.0  # vLLM's CUDA-graph pool, captured at start-up (vllm-project/vllm pull 45623: 1.5 GB
#   on a far larger model). vLLM 0.32 sizes its KV cache as its share less the weights, the profile run's
#   activations and this pool (v1/worker/gpu_worker.py, determine_available_memory; the pool's estimate is
#   on by default, VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1): awake, the pool is inside the share. Sleep
#   frees the weights and the KV cache only, so asleep the pool stays beside the updates.
# vLLM's offline defaults on an H100 or H200 (engine/arg_utils.py): the profile run's batch, and the
# sequences its sampler is profiled with
VLLM_BATCHED_TOKENS, VLLM_MAX_SEQS = 16384, 1024


def beyond_tensors_gb(args: Args, world: int) -> dict:
    """The per-rank GB a GPU process holds outside the tensors the estimate counts, each a named term:
    the CUDA context; NCCL's buffers for DDP's group (world > 1) and for the group vLLM's external
    launcher makes over the same ranks (an upper count: NCCL makes a communicator only for a group
    that runs a collective on the GPU). (vLLM's CUDA-graph pool is inside its share, or, asleep, in the
    update phase: memory_estimate_gb.)"""
    terms = {"CUDA context and library workspaces": CUDA_CONTEXT_GB}
    groups = (world > 1) * (1 + (args.rollout == "vllm"))
    if groups:
        terms[f"NCCL buffers ({groups} group{'s' * (groups > 1)} of {world} ranks)"] = groups * NCCL_GB_PER_GROUP
    return terms


def vllm_share_gb(n_params: int, args: Args, config, gpu_gb: float, world: int = 1) -> dict:
    """What vLLM's share (--vllm-gpu-memory-utilization of a `gpu_gb` GPU) holds awake, term by term as
    vLLM 0.32 sizes it, and how many sequences of the run's length its KV cache holds at once against
    the sequences a rank samples in one generate call (its prompts of the step x --n-samples; a refill
    is another call). More than fit run in waves: vLLM's scheduler starts a sequence when it has blocks
    for it, so a call of S sequences against a capacity of C takes about ceil(S / C) waves of decoding,
    fewer where responses end early. C counts every response at full length (the worst case), the K
    samples of a prompt sharing its blocks (prefix caching): a group of K needs prompt + K x response
    tokens.

    The terms: the model in bf16 (2 bytes a parameter), the LoRA slot (the adapter at the engine's
    max_lora_rank, bf16), the profile run's activations (VLLM_BATCHED_TOKENS through a layer's MLP: its
    gate-up output and activation, 3 x intermediate + 4 x hidden values a token; VLLM_MAX_SEQS rows of
    fp32 logits and their softmax), the CUDA-graph pool; the rest is KV cache, 2 (K and V) x layers x
    KV heads x head dim bf16 values a token. An estimate from the shapes, not yet measured on a GPU."""
    from rollout import lora_slot_rank
    gb = 1e9
    h, inter, layers, vocab = config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.vocab_size
    kv_dim = config.num_key_value_heads * head_dim(config)
    share = {"share": args.vllm_gpu_memory_utilization * gpu_gb, "model (bf16)": 2 * n_params / gb}
    if args.lora_rank:
        slot = lora_slot_rank(args.lora_rank)
        share[f"LoRA slot (rank {slot}, bf16)"] = 2 * lora_parameters(config, slot) / gb
    share["profile run's activations"] = (VLLM_BATCHED_TOKENS * (3 * inter + 4 * h) * 2 + VLLM_MAX_SEQS * vocab * 4 * 2) / gb
    share["CUDA-graph pool"] = VLLM_GRAPHS_GB
    share["KV cache"] = share["share"] - sum(v for k, v in share.items() if k != "share")
    per_token = layers * 2 * kv_dim * 2
    group = (args.max_prompt_len + args.n_samples * args.max_response_len) * per_token  # K samples, one prompt
    share["sequences at once"] = max(int(share["KV cache"] * gb // group), 0) * args.n_samples
    share["sequences a call"] = -(-args.prompts_per_step // world) * args.n_samples
    share["waves"] = -(-share["sequences a call"] // share["sequences at once"]) if share["sequences at once"] else 0
    return share


def memory_estimate_gb(n_params: int, args: Args, config=None, gpu_gb: float = 0.0, cuda: bool = True,
                       world: int = 1) -> dict:
    """Per-GPU GB under plain DDP, everything a rank holds at its fullest, term by term; "total" is what
    check_memory compares with the GPU's memory. n_params: the policy's (the PRM, reference and critic
    are copies of it). `gpu_gb` sizes vLLM's share; `cuda`: AdamW is fused there (no temporaries) and
    the process holds more than tensors (beyond_tensors_gb); `world`: the ranks, which share the step's
    prompts and the held-out problems.

    Always held (the model state): the policy and the PRM in fp32 with their gradients and AdamW's two
    moments, 16 bytes a parameter each (under DDP the gradients are views into its all-reduce buckets,
    gradient_as_bucket_view, so the buckets add nothing), or 8 with --offload-optimizer, whose moments
    come to the GPU only for their model's update; the frozen reference as load_frozen loads it, fp32
    (4); the critic (PPO, 16 or 8) and a teacher (OPD, 4) when used. Then the largest of the phases:
    an update (update_peak_bytes, + the updating model's moments when offloaded; with vLLM colocated
    and awake, its share beside it), the optimizer step (foreach AdamW's temporaries, 8 bytes a
    parameter; none when fused), and sampling (vLLM's share, --vllm-gpu-memory-utilization of the GPU,
    which the held-out evaluation shares; or HF generate's KV cache for --rollout hf). On top, 10% of
    that for the caching allocator's fragmentation, and on a GPU what the process holds outside the
    allocator (the CUDA context, NCCL's buffers; vLLM's CUDA-graph pool is inside its share while it is
    awake, and added to the update while it sleeps).

    --lora-rank R: one frozen base (2 bytes a parameter in bf16, 4 in fp32) holds the policy, the PRM
    and the reference; each adapter (lora_parameters) has its fp32 weights, gradients and AdamW; an
    update adds each adapted layer's inputs again (update_peak_bytes), and no base weight has a
    gradient. vLLM's share then holds its own copy of the base (bf16) and the adapter's slot beside
    its KV cache."""
    gb = 1e9
    n = n_params
    trained = "(weights, grads; AdamW on the CPU)" if args.offload_optimizer else "(weights, grads, AdamW)"
    trained_n = lora_parameters(config, args.lora_rank) if args.lora_rank else n  # an adapter, or the model
    per_trained = (8 if args.offload_optimizer else 16) * trained_n / gb
    est = {}
    if args.lora_rank:  # one frozen base, bf16 or fp32, for the policy, the PRM and the reference
        est[f"base, frozen ({args.precision}): policy, PRM and reference"] = (2 if args.precision == "bf16" else 4) * n / gb
    adapter = " adapter" if args.lora_rank else ""
    est[f"policy{adapter} {trained}"] = per_trained
    if args.process == "implicit":
        est[f"prm{adapter} {trained}"] = per_trained
    if ((args.process == "implicit" and args.reference == "sft") or args.process == "gopd") and not args.lora_rank:
        est["reference (fp32, frozen)"] = 4 * n / gb
    if args.process in ("opd", "gopd"):
        est["teacher (fp32, frozen)"] = 4 * n / gb
    if args.estimator == "ppo":
        est[f"critic {trained}"] = per_trained
    state = sum(est.values())
    vllm = args.vllm_gpu_memory_utilization * gpu_gb if args.rollout == "vllm" else 0.0
    phases = {"optimizer step (foreach AdamW's temporaries)": 0.0 if cuda else 8 * trained_n / gb}
    if config is not None:
        held = update_peak_bytes(config, n, args)
        if args.offload_optimizer:
            held["its AdamW moments, back on the GPU"] = 8 * trained_n
        if vllm and args.vllm_sleep and cuda:  # asleep, vLLM keeps its CUDA-graph pool beside the update
            held["vLLM's CUDA-graph pool (kept through sleep)"] = VLLM_GRAPHS_GB * gb
        est.update({f"  update: {k}": v / gb for k, v in held.items()})
        phases["update" + ("" if args.vllm_sleep or not vllm else " beside vLLM's share")] = \
            sum(held.values()) / gb + (0.0 if args.vllm_sleep else vllm)
        if args.rollout == "hf":  # HF generate: a KV cache for every sequence of a call (512 at most)
            kv_dim = config.num_key_value_heads * head_dim(config)
            sequences = min(512, max(args.prompts_per_step // world * args.n_samples,  # a call's sequences
                                     -(-args.eval_problems // world) * args.eval_samples))
            cache = sequences * (args.max_prompt_len + args.max_response_len) * config.num_hidden_layers * 2 * kv_dim
            phases["sampling (HF generate's KV cache)"] = cache * (2 if args.precision == "bf16" else 4) / gb
    if vllm:
        phases["sampling (vLLM's share, evaluation included)"] = vllm
    est.update({f"phase: {k}": v for k, v in phases.items()})
    largest = max(phases.values())
    est["allocator (10%)"] = 0.1 * (state + largest)
    beyond = beyond_tensors_gb(args, world) if cuda else {}
    est.update({f"beyond tensors: {k}": v for k, v in beyond.items()})
    # the state, the largest phase, the allocator's margin, and what the process holds outside the allocator
    est["total"] = state + largest + est["allocator (10%)"] + sum(beyond.values())
    return est


def vllm_share_line(share: dict, args: Args) -> str:
    """vllm_share_gb in one line: its terms, and the waves a generate call takes."""
    terms = ", ".join(f"{k} {v:.1f}" for k, v in share.items() if k not in ("share", "sequences at once",
                                                                            "sequences a call", "waves"))
    return (f"vLLM's share {share['share']:.1f} GB: {terms} GB; the KV cache holds {share['sequences at once']} "
            f"sequences at once ({args.n_samples} a prompt of {args.max_prompt_len} tokens, "
            f"each {args.max_response_len} long), against {share['sequences a call']} a rank samples a call: {share['waves']} wave(s) at most")


def measured_memory(device) -> dict:
    """What a GPU rank holds now, in GB: the caching allocator's peaks (tensors, and the blocks it
    reserved for them) and the device's own count (torch.cuda.mem_get_info: everything on the device,
    the CUDA context, NCCL's buffers and vLLM's memory included)."""
    free, total = torch.cuda.mem_get_info(device)
    return {"allocated": torch.cuda.max_memory_allocated(device) / 1e9,
            "reserved": torch.cuda.max_memory_reserved(device) / 1e9, "device": (total - free) / 1e9,
            "device_total": total / 1e9}


def base_parameters(model) -> int:
    """The parameters the memory estimate sizes by: the model's, or for a LoRA Adapter its base's (no adapter's)."""
    whole = getattr(model, "shared", model)
    return sum(p.numel() for k, p in whole.named_parameters() if ".lora_" not in k)


def memory_line(policy, args: Args, measured: dict) -> str:
    """The estimate next to what the first step used (measured_memory), in GB."""
    gpu = measured["device_total"]
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    est = memory_estimate_gb(base_parameters(policy), args, policy.config, gpu, world=world)
    beyond = sum(v for k, v in est.items() if k.startswith("beyond tensors"))
    return (f"memory per GPU after the first step: estimated {est['total']:.2f} GB ({beyond:.2f} of it beyond "
            f"tensors, the allocator's margin included); the allocator's peaks {measured['allocated']:.2f} GB "
            f"allocated, {measured['reserved']:.2f} GB reserved; the device in use now {measured['device']:.2f} "
            f"of {gpu:.2f} GB (torch.cuda.mem_get_info{', vLLM included' if args.rollout == 'vllm' else ''})")


def check_memory(path: str, args: Args, d: Dist) -> None:
    """On a GPU (or for --max-memory-gb, a GPU of that size), print the estimate and refuse a run that
    cannot fit, before loading any weight, naming the flags that lower it. A CPU run checks nothing:
    its memory is the machine's, not a card's."""
    gpu = d.device.type == "cuda"
    if not (gpu or args.max_memory_gb):
        return
    with torch.device("meta"):  # parameters without storage: just their shapes
        config = AutoConfig.from_pretrained(path)
        skeleton = AutoModelForCausalLM.from_config(config)
    budget = args.max_memory_gb or torch.cuda.get_device_properties(d.device).total_memory / 1e9
    n_params = sum(p.numel() for p in skeleton.parameters())
    est = memory_estimate_gb(n_params, args, config, budget, world=d.world)
    print0(d, "memory estimate per GPU: " + ", ".join(f"{k} {v:.2f} GB" for k, v in est.items()))
    if args.rollout == "vllm":
        share = vllm_share_gb(n_params, args, config, budget, d.world)
        print0(d, vllm_share_line(share, args))
        if share["sequences at once"] == 0:
            raise SystemExit(f"memory: vLLM's share ({share['share']:.1f} GB, --vllm-gpu-memory-utilization "
                             f"{args.vllm_gpu_memory_utilization}) leaves no KV cache for one sequence of "
                             f"{args.max_prompt_len + args.max_response_len} tokens; raise it (with --vllm-sleep "
                             "the updates do not share the GPU with it)")
    if budget and est["total"] > budget:
        raise SystemExit(f"memory: the estimate is {est['total']:.0f} GB per GPU, more than the {budget:.0f} GB "
                         "available. Lower it with --micro-batch-size / --max-tokens-per-micro-batch (activations "
                         "and logits), --gradient-checkpointing, --precision bf16, --offload-optimizer, "
                         "--vllm-sleep or a smaller "
                         "--vllm-gpu-memory-utilization (vLLM's share), or a smaller --model; plain DDP holds "
                         "the policy, the PRM and the reference whole on every GPU (a sharded trainer, "
                         "FSDP/ZeRO, would not).")
