"""The models of a run: the policy, and the PRM, reference, teacher, step scorer and critic its
--process and --estimator need, with their optimisers; the sampler; the memory estimate.

    models = build_models(args, d)        # loads what the flags need, each wrapped in DDP
    models.policy, models.prm, models.reference, ...   # None where a flag does not use one

Policy, PRM and reference all start from the SFT checkpoint (paper Sec. 3.3): `--model`, or the
embedded tiny model's checkpoint (toy_task.sft_checkpoint: shipped, or trained on first use).
"""

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

import step_prm
import toy_task
from config import Args
from ddp import Dist, broadcast_from_master, print0, unwrap, wrap_ddp
from rollout import HFRollout, VLLMRollout


@dataclass
class Models:
    """Everything that trains or is read during a run; a field is None when the flags do not use it."""
    path: str                 # the SFT checkpoint every model starts from
    tokenizer: object
    policy: torch.nn.Module   # wrapped in DDP when world > 1 (unwrap() for the plain model)
    policy_opt: torch.optim.Optimizer
    prm: torch.nn.Module | None = None          # --process implicit: PRIME's implicit PRM (trained)
    prm_opt: torch.optim.Optimizer | None = None
    reference: torch.nn.Module | None = None    # frozen SFT model: the PRM's reference, G-OPD's base
    teacher: torch.nn.Module | None = None      # --process opd / gopd
    step_scorer: object = None                  # --process step
    critic: torch.nn.Module | None = None       # --estimator ppo
    critic_opt: torch.optim.Optimizer | None = None


def build_models(args: Args, d: Dist) -> Models:
    """Load the policy and whatever --process and --estimator need, on the device, with AdamW each."""
    path, policy, tokenizer = load_model_and_tokenizer(args, d)
    m = Models(path, tokenizer, policy, policy_opt=None)
    if args.process == "implicit":  # from the SFT checkpoint, or --prm-init's model (E7: another prover)
        m.prm = AutoModelForCausalLM.from_pretrained(prm_start(args, path, tokenizer, d),
                                                     dtype=torch.float32).to(d.device).train()
    if args.estimator == "ppo":  # PPO's critic: the SFT backbone with a fresh scalar head
        m.critic = AutoModelForTokenClassification.from_pretrained(path, num_labels=1, dtype=torch.float32)
        m.critic.to(d.device).train()
    if (args.process == "implicit" and args.reference == "sft") or args.process == "gopd":
        m.reference = load_frozen(path, d)
    if args.process in ("opd", "gopd"):
        # the embedded teacher: a longer SFT on a clean demonstrator (it never slips)
        teacher_path = args.teacher or embedded_checkpoint(args, args.teacher_sft_steps, d, "teacher: ", slip=0.0)
        m.teacher = load_teacher(teacher_path, tokenizer, d)
    if args.process == "step":
        m.step_scorer = step_prm.load_step_scorer(args.step_scorer, d.device, args.step_separator)
    policy.to(d.device).train()  # from_pretrained returns eval mode; checkpointing needs train mode
    if args.precision == "bf16":
        for model in (policy, m.prm, m.reference, m.teacher, m.critic):
            if model is not None:
                keep_head_fp32(model)
    if args.gradient_checkpointing:
        for model in (policy, m.prm, m.critic):  # non-reentrant checkpointing is the variant that works under DDP
            if model is not None:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    m.policy = wrap_ddp(policy, d)
    m.policy_opt = torch.optim.AdamW(m.policy.parameters(), lr=args.policy_lr, weight_decay=args.policy_weight_decay)
    if m.prm is not None:
        m.prm = wrap_ddp(m.prm, d)
        m.prm_opt = torch.optim.AdamW(m.prm.parameters(), lr=args.prm_lr, weight_decay=0.0)
    if m.critic is not None:
        m.critic = wrap_ddp(m.critic, d)
        m.critic_opt = torch.optim.AdamW(m.critic.parameters(), lr=args.critic_lr, weight_decay=0.01)  # veRL's critic
    return m


def keep_head_fp32(model) -> None:
    """--precision bf16: the output layer (the LM head, or the critic's value head) still computes in
    fp32 under autocast, on the fp32 weights. Log-probs, their PPO ratio and the implicit reward
    log pi_phi - log pi_ref are differences of nearly equal numbers: bf16 logits (8 bits of mantissa,
    a logit of 20 to +-0.06) would put that much noise into each token's reward. The decoder's matmuls
    stay bf16; the head is one matmul per token against the layers' dozens."""
    head = model.get_output_embeddings() if hasattr(model, "lm_head") else model.score

    def forward(hidden, head=head):
        with torch.autocast(hidden.device.type, enabled=False):
            return torch.nn.functional.linear(hidden.float(), head.weight.float(),
                                              None if head.bias is None else head.bias.float())
    head.forward = forward  # the instance's forward: parameter names, saving and vLLM's push are unchanged


def prm_start(args: Args, sft_path: str, tokenizer, d: Dist) -> str:
    """The implicit PRM's starting weights: the SFT checkpoint (the paper), or --prm-init: 'teacher'
    (--teacher, or the embedded clean demonstrator) or a path; on the policy's vocabulary, since its
    log-probs are compared with the reference's token by token."""
    if not args.prm_init:
        return sft_path
    if args.prm_init == "teacher":
        path = args.teacher or embedded_checkpoint(args, args.teacher_sft_steps, d, "PRM start: ", slip=0.0)
    else:
        path = args.prm_init
    try:
        same = AutoTokenizer.from_pretrained(path).get_vocab() == tokenizer.get_vocab()
    except OSError as e:
        raise SystemExit(f"--prm-init {args.prm_init}: cannot load {path} ({e})")
    if not same:
        raise SystemExit(f"--prm-init {args.prm_init}: {path}'s tokenizer differs from the policy's; the implicit "
                         "reward compares log-probs of the same token ids, so the vocabularies must be identical")
    return path


def make_sampler(args: Args, models: Models, d: Dist):
    """The run's one sampler, for training rollouts and the held-out evaluation alike: --rollout vllm,
    an engine in this process, fed the policy's weights after every update, returning its own log-probs
    for the rollout correction; --rollout hf, HF generate on the policy itself (512 sequences a call:
    the default's 800 held-out samples in two calls, not four, a quarter less time on 2 CPU cores)."""
    if args.rollout == "vllm":
        return VLLMRollout(models.path, models.tokenizer, args.max_response_len, args.temperature, args.top_p,
                           max_model_len=args.max_prompt_len + args.max_response_len, seed=args.seed + d.rank,
                           dtype="bfloat16" if d.device.type == "cuda" else "float32",
                           gpu_memory_utilization=args.vllm_gpu_memory_utilization, sleep=args.vllm_sleep,
                           logprobs=True)
    return HFRollout(unwrap(models.policy), models.tokenizer, args.max_response_len, args.temperature, args.top_p,
                     batch_size=512, bf16=args.precision == "bf16")


def embedded_checkpoint(args: Args, sft_steps: int, d: Dist, label: str = "", slip: float | None = None) -> str:
    """Path of the toy SFT checkpoint (of `sft_steps` steps, 0 = the recipe's toy_task.SFT_STEPS) for
    the task's --toy-ops and --toy-slip (or `slip`): shipped in checkpoints/ (hash-checked), or trained
    by rank 0 into --cache-dir on first use while the other ranks wait for its path."""
    slip = args.toy_slip if slip is None else slip
    path = str(toy_task.sft_checkpoint(Path(args.cache_dir), sft_steps, log=lambda m: print0(d, label + m),
                                       ops=toy_task.parse_ops(args.toy_ops), slip=slip)) if d.master else None
    return broadcast_from_master(path, d)


def load_model_and_tokenizer(args: Args, d: Dist):
    """The SFT checkpoint: policy, PRM and reference all start from it (paper Sec. 3.3)."""
    path = args.model
    if not path:
        path = embedded_checkpoint(args, args.sft_steps, d)
    elif not Path(path).exists() and "/" not in path:
        raise SystemExit(f"--model {path}: no such local path (and not a hub name like org/model)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        check_memory(path, args, d)  # from the config alone, before any weight is loaded
        policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except OSError as e:
        raise SystemExit(f"--model {path}: cannot load it ({e})")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return path, policy, tokenizer


def memory_estimate_gb(n_params: int, args: Args, config=None) -> dict:
    """Per-GPU GB under plain DDP (vLLM's share comes on top): the model state, and the activations of
    the largest training pass (the policy's or the PRM's update, one micro-batch at a time).

    State: policy and PRM in fp32 with fp32 grads and two AdamW moments = 16 bytes/param each; the
    frozen reference in bf16 = 2 bytes/param (none when the reference is the old policy).
    Activations (needs the model `config`), for the padded tokens T of one micro-batch (the token
    budget, or micro_batch_size x (max prompt + max response)), fp32: what autograd keeps per token
    of each decoder layer, about 10 x hidden (the norms' inputs and outputs, q and the GQA-repeated k
    and v, attention output, o_proj input) + 4 x intermediate (gate, SiLU, up, their product), with a
    memory-efficient attention kernel (no seq x seq scores); with gradient checkpointing only each
    layer's input (hidden) plus one layer's worth recomputed. Logits: only `logits_to_keep` response
    positions P (the budget, or micro_batch_size x (max response + 1)) go through the LM head; their
    fp32 logits and the gradient of them, 2 x P x vocab x 4 bytes."""
    gb = n_params / 1e9
    est = {"policy (weights+grads+adam)": 16 * gb, "prm (weights+grads+adam)": 16 * gb,
           "reference (bf16)": 2 * gb if args.reference == "sft" else 0.0}
    if args.estimator == "ppo":  # the critic: the policy's backbone with a scalar head, trained
        est["critic (weights+grads+adam)"] = 16 * gb
    if config is not None:
        budget = args.max_tokens_per_micro_batch
        tokens = budget or args.micro_batch_size * (args.max_prompt_len + args.max_response_len)
        positions = budget or args.micro_batch_size * (args.max_response_len + 1)
        h, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
        per_layer = 10 * h + 4 * inter  # fp32 values kept per token of a layer
        kept = layers * h + per_layer if args.gradient_checkpointing else layers * per_layer
        est["activations (one micro-batch)"] = 4 * tokens * kept / 1e9
        est["logits (one micro-batch)"] = 2 * 4 * positions * config.vocab_size / 1e9
    est["total"] = sum(est.values())
    return est


def memory_line(policy, args: Args, measured_gb: float) -> str:
    """The estimate next to what the first step used (torch.cuda.max_memory_allocated, in GB)."""
    est = memory_estimate_gb(sum(p.numel() for p in policy.parameters()), args, policy.config)
    return (f"memory per GPU after the first step: estimated {est['total']:.2f} GB, measured {measured_gb:.2f} GB "
            f"(torch.cuda.max_memory_allocated{', vLLM included' if args.rollout == 'vllm' else ''})")


def check_memory(path: str, args: Args, d: Dist) -> None:
    """Print the estimate and refuse a model whose state cannot fit, before loading any weight."""
    with torch.device("meta"):  # parameters without storage: just their shapes
        config = AutoConfig.from_pretrained(path)
        skeleton = AutoModelForCausalLM.from_config(config)
    est = memory_estimate_gb(sum(p.numel() for p in skeleton.parameters()), args, config)
    print0(d, "memory estimate per GPU: " + ", ".join(f"{k} {v:.2f} GB" for k, v in est.items()))
    budget = args.max_memory_gb or (torch.cuda.get_device_properties(d.device).total_memory / 1e9
                                    if d.device.type == "cuda" else 0.0)
    if budget and est["total"] > 0.9 * budget:
        raise SystemExit(f"model state and activations need ~{est['total']:.0f} GB per GPU, more than 90% of the "
                         f"{budget:.0f} GB available: plain DDP cannot hold it. Use a smaller --model "
                         "(e.g. --preset 1.5b with a 1.5B model) or a sharded trainer (FSDP/ZeRO).")


def load_teacher(path: str, tokenizer, d: Dist):
    """The OPD/G-OPD teacher: frozen, and on the policy's token ids (it scores the student's tokens)."""
    try:
        if AutoTokenizer.from_pretrained(path).get_vocab() != tokenizer.get_vocab():
            raise SystemExit(f"--teacher {path}: its tokenizer differs from the policy's; OPD compares "
                             "log-probs of the same token ids, so the vocabularies must be identical")
        return load_frozen(path, d)
    except OSError as e:
        raise SystemExit(f"--teacher {path}: cannot load it ({e})")


def load_frozen(path: str, d: Dist):
    """A model that is only read (reference, teacher): fp32, eval mode, no gradients, on the device."""
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval().requires_grad_(False).to(d.device)
