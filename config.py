"""train.py's configuration: every option is a field of `Args`, its docstring the `--help` text.

    args = parse_args(["--estimator", "grpo", "--process", "none"])   # what `python train.py ...` parses

`parse_args` applies a `--preset`, then `check_args` checks every value against its domain
(DOMAINS) and every combination that cannot work, naming the flag, before anything is loaded or
written (exit code 2, like argparse).
"""

import argparse
import ast
import importlib.util
import inspect
import math
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import verify  # light: the sandbox's stdlib only; torch, transformers and the models load when a run needs them

TEACHER_SFT_STEPS = 1500  # toy_task.TEACHER_SFT_STEPS (tests/test_config.py checks they agree)
VLLM_MAX_LORA_RANK = 512  # max(rollout.LORA_SLOT_RANKS), vLLM 0.32's largest max_lora_rank (checked there too)


def default_precision() -> str:
    """--precision default: bf16 on a GPU (its bf16 matmuls run ~8x faster than fp32), fp32 on CPU (the
    embedded default stays the same numbers on every CPU, and most CPUs have no fast bf16)."""
    import torch
    return "bf16" if torch.cuda.is_available() else "fp32"


def default_rollout() -> str:
    """--rollout default: vLLM where it is installed and a GPU is present (much faster there), else HF."""
    import torch
    return "vllm" if torch.cuda.is_available() and importlib.util.find_spec("vllm") else "hf"


@dataclass
class Args:
    # --- what to train on
    model: str = ""
    """policy/PRM/reference initialisation: a local path or hub name of a causal LM; empty = the embedded tiny model after its SFT warmup"""
    data: str = ""
    """training prompts: a .jsonl or .parquet file; empty = the embedded arithmetic task"""
    toy_ops: str = "3-6"
    """embedded task: operations per chain, MIN-MAX (longer chains: more steps to slip on, sparser outcomes)"""
    toy_slip: float = 0.15
    """embedded task: the SFT demonstrator's chance of a wrong result at each step (0 = a clean demonstrator)"""
    prompt_key: str = "problem"
    """field holding the question (ignored for veRL-schema files, whose `prompt` is chat messages)"""
    answer_key: str = "answer"
    """field holding the gold answer (veRL schema: reward_model.ground_truth)"""
    math_grader: str = "math-verify"
    """who finds a math response's answer: 'math-verify' (its own extraction: boxed, several boxes, "final answer is") or 'official' (the last \\boxed{} only, as PRIME's grader)"""
    task: str = "math"
    """what a plain --data row is: 'math' (boxed answer, math-verify) or 'qa' (HotpotQA-style, "Final Answer: ..." exact match)"""
    context_key: str = "context"
    """--task qa: field with the supporting paragraphs (a string, or HotpotQA's title/sentences lists); optional"""
    user_suffix: str = "default"
    """appended to each question; 'default' = the task's own (math: the paper's \\boxed instruction; qa: PASS's Final Answer one); '' = none"""
    system_prompt: str = ""
    """optional system message for the chat template"""
    preset: str = ""
    """named hyper-parameter sets, each with its paper run's length: 'paper' (the paper's 7B run: 592 steps, 256 prompts x 4, 1024/3072 tokens), '1.5b' (App. B.7's 1.5B run: 330 steps; fits plain DDP on 80 GB GPUs), '7b' (the paper's own model as two LoRA adapters on one frozen base: 592 steps); a flag given beside it wins"""
    # --- the RL loop
    steps: int = 70
    """RL iterations (the embedded default's 70: docs/REPRODUCTION.md, "The embedded default")"""
    prompts_per_step: int = 32
    """prompts sampled per iteration, over all ranks (paper: 256)"""
    n_samples: int = 4
    """K, responses per prompt (paper: 4)"""
    max_prompt_len: int = 64
    """prompt tokens at most (chat template and suffix included); longer prompts of --data are dropped and counted, and dropping more than half of the training or held-out prompts is an error. Embedded model: 64; with --model and --data the default is 1024 (the paper's)"""
    max_response_len: int = 96
    """max new tokens per response. Embedded model: 96; with --model and --data the default is 1024 (paper: 3072)"""
    temperature: float = 1.0
    """rollout temperature (paper: 1.0)"""
    top_p: float = 1.0
    """rollout nucleus sampling (paper: 1.0)"""
    # --- PRIME's choices
    estimator: str = "rloo"
    """advantage estimator: rloo | grpo | reinforce | prm-value | pass | ppo (a learned critic and GAE)"""
    process: str = "implicit"
    """process signal: 'implicit' (PRIME's online PRM), 'opd' / 'gopd' (teacher vs student log-probs), 'step' (a step-level PRM), 'none' (outcome only: the RLOO/GRPO baselines)"""
    rloo_form: str = "official"
    """'official' (PRIME's compute_rloo_returns) or 'paper' (Eq. 5 literally); same sequence sums"""
    process_norm: str = "batch"
    """'batch' = official: raw log-ratio / max |return-to-go| of the batch; 'beta' = paper Eq. 3: beta * log-ratio"""
    reference: str = "sft"
    """PRM reference: 'sft' = frozen SFT model (paper default) or 'policy' = the rollout policy (App. B.1)"""
    prm_update: str = "after"
    """'after' = single forward (rewards from the pre-update PRM, the paper run); 'before' = double forward"""
    prm_loss: str = "ce"
    """PRM objective: 'ce' (Algorithm 1) or 'dpo' (App. C.2)"""
    prm_online: bool = True
    """update the implicit PRM during RL; --no-prm-online with --prm-warmup-steps N is the offline PRM of Fig. 5"""
    prm_warmup_steps: int = 0
    """before RL, train the implicit PRM on this many batches of the starting policy's rollouts"""
    prm_freeze_step: int = 0
    """freeze the implicit PRM from this RL step on (it learns online before it); 0 = never"""
    prm_groups: str = "kept"
    """which groups the implicit PRM learns from: 'kept' (every group the filter keeps, as the paper) or 'mixed' (only groups with both right and wrong responses, whose labels contrast); its rewards reach every kept group either way (see --process-groups)"""
    process_groups: str = "all"
    """which kept groups receive process rewards: 'all' (the paper) or 'mixed' (only groups with both right and wrong responses; the others train on their outcome advantage alone, 0 under RLOO): where a process signal's harm enters (the credit study, docs/REPRODUCTION.md)"""
    prm_init: str = ""
    """the implicit PRM's starting weights: empty = the SFT checkpoint, as the reference (paper Sec. 3.3); 'teacher' = the embedded clean demonstrator (or --teacher's model); or a path. The reference stays the SFT model, so rewards start at log(pi_init / pi_sft), a prover other than the policy (the credit study's teacher-started PRM)"""
    teacher: str = ""
    """--process opd/gopd: a frozen causal LM on the policy's tokenizer; empty = the embedded toy teacher (a longer SFT)"""
    teacher_sft_steps: int = TEACHER_SFT_STEPS
    """SFT steps of the embedded toy teacher (1500: shipped in checkpoints/; another count is trained into --cache-dir)"""
    gopd_lambda: float = 1.25
    """--process gopd: lambda of lambda (l_T - l_B) - (l_theta - l_B), base = the starting policy (PASS v1: 1.25)"""
    step_scorer: str = "toy"
    """--process step: 'toy' (the embedded task's exact step checker), 'toy-first' (the same checker marking only the first wrong line wrong: the most an outcome-trained PRM could tell), 'chains' (the exact checker of a `data.py chains` file) or the path of an HF step PRM (e.g. Qwen2.5-Math-PRM-7B)"""
    step_noise: float = 0.0
    """--process step: add N(0, SD^2) noise to every step score (seeded by --seed and the step): a perfect checker made as noisy as a learned PRM (the credit study's noisy checker)"""
    step_separator: str = ""
    """--process step with an HF step PRM: where steps split; empty = blank lines, as Qwen2.5-Math-PRM"""
    pass_preset: str = "math"
    """--estimator pass: pass_advantage.PRESETS entry ('math', 'qa' or 'v1'; v1 uses the step PRM's own steps as chunks)"""
    beta: float = 1.0
    """implicit-reward scale in the PRM's loss (paper: 0.05 for ~1000-token responses; 1.0 here, see docs/REPRODUCTION.md)"""
    filter_low: float = 0.2
    """keep prompt groups with mean accuracy >= this (inclusive)"""
    filter_high: float = 0.8
    """keep prompt groups with mean accuracy <= this (inclusive)"""
    filter_mode: str = "shrink"
    """'shrink': train on the groups the filter keeps, fewer than --prompts-per-step; 'refill' (the official code, and the presets): sample fresh prompts until --prompts-per-step groups are kept, at most --refill-draws more draws a step, surplus groups dropped"""
    refill_draws: int = 4
    """--filter-mode refill: the most extra draws of --prompts-per-step prompts in one step (the step trains on what it has then)"""
    filter_truncated: bool = False
    """drop a prompt group if any of its responses hit max_response_len (off in the paper run)"""
    clip_eps: float = 0.2
    """PPO clip range (Eq. 6)"""
    dual_clip: float = 0.0
    """dual-clip PPO's c > 1 for negative advantages (veRL: 3); 0 = off, as PRIME-RL and the paper"""
    kl_coef: float = -1.0
    """coefficient of the reference regulariser added to Eq. 6's loss (prime.kl_penalty); -1 = PASS's 1e-2 with --estimator pass, else 0 (PRIME's loop: no KL term)"""
    kl_kind: str = ""
    """the regulariser: 'k3' (veRL's low_var_kl on the sampled tokens) or 'abs' (PASS's QA runs: the masked absolute log-prob difference); '' = abs with --pass-preset qa under --estimator pass, else k3"""
    process_gamma: float = 1.0
    """discount of the process reward's return (official reward_model_gamma; paper: 1.0). --gamma G sets it and --outcome-gamma both"""
    outcome_gamma: float = 1.0
    """discount of the outcome reward's return, back from the last token (official verifier_gamma; paper Eq. 5: 1.0, the outcome undiscounted)"""
    gae_lambda: float = 1.0
    """--estimator ppo: GAE's lambda (veRL: 1.0; 0 = one-step TD errors)"""
    critic_lr: float = 3e-4
    """--estimator ppo: the critic's AdamW learning rate (veRL: 1e-5 for 7B models; the tiny model needs more)"""
    critic_warmup_steps: int = 0
    """--estimator ppo: the policy stays frozen for the first N iterations while the critic fits"""
    value_clip: float = 0.5
    """--estimator ppo: the value loss's clip range around the critic's old values (veRL: 0.5); 0 = unclipped"""
    # --- optimisation
    policy_lr: float = 5e-5
    """policy AdamW learning rate (paper: 5e-7 for a 7B model; here 5e-5: 1e-4 moves the tiny policy faster than its PRM keeps up, 3e-5 is slow)"""
    prm_lr: float = 3e-4
    """PRM AdamW learning rate (paper: 1e-6 for a 7B model; 3e-4 lets the tiny PRM keep up with the policy here)"""
    policy_weight_decay: float = 0.01
    """official actor weight decay"""
    policy_grad_clip: float = 1.0
    """official actor gradient-norm clip"""
    prm_grad_clip: float = 10.0
    """official PRM gradient-norm clip"""
    mini_batches: int = 1
    """optimizer steps per iteration for policy and PRM (paper: 1024 responses / 256 = 4)"""
    micro_batch_size: int = 64
    """responses per forward/backward when --max-tokens-per-micro-batch is 0 (giving this flag alone sets it to 0); gradients accumulate across micro-batches"""
    max_tokens_per_micro_batch: int = 4096
    """token budget of a micro-batch instead of a row count: rows grouped by length, each micro-batch at most N padded tokens (prompt + response); 0 = off (--micro-batch-size rows in order). The default's 128 rows go in 3 micro-batches with a quarter less padding than 2 of 64 rows: a quarter less time in every training pass on CPU"""
    loss_mean: str = "global"
    """'global': each optimizer step's loss is the token mean over its whole mini-batch, all ranks (Eq. 6; independent of the split); 'micro': the mean of micro-batch means (the official code, the paper's runs)"""
    lora_rank: int = 0
    """0: full fine-tuning. R > 0: the policy and the implicit PRM are two LoRA adapters of rank R (PEFT) on one frozen copy of the SFT model, which with the adapters off is the reference: no third copy (models.py, LoRA). Adapters on every linear layer of the decoder blocks (q, k, v, o, gate, up and down projections); the embeddings and the output layer stay frozen. With --precision bf16 the base is held in bf16, the adapters and their AdamW in fp32; vLLM gets the adapter after each update, never merged weights"""
    lora_alpha: float = 32.0
    """--lora-rank R: each adapter adds (alpha / R) B A x to its layer's output (LoRA Without Regret keeps alpha 32 at every rank; its RL learning rates are about 10x full fine-tuning's)"""
    gradient_checkpointing: bool = False
    """recompute activations in backward to save memory (big models)"""
    precision: str = field(default_factory=default_precision)
    """'bf16': every forward pass under bf16 autocast, while weights, gradients, AdamW's state, DDP's reduction, the output layer, log-probs, rewards and advantages stay fp32 (default on a GPU); 'fp32': everything in fp32 (default on CPU)"""
    # --- plumbing
    sandbox: str = "auto"
    """code rewards: 'auto' runs the policy's programs in the strongest sandbox this machine allows and says which at start-up; 'namespaces' refuses to start without full isolation (verify.py's docstring, item 5)"""
    rollout: str = field(default_factory=default_rollout)
    """generation backend: 'vllm' (an engine in each rank) or 'hf'; default: vllm where installed and a GPU is present, else hf"""
    vllm_gpu_memory_utilization: float = 0.3
    """--rollout vllm: fraction of the WHOLE GPU for vLLM's weights and KV cache; training gets the rest"""
    vllm_sleep: bool = False
    """--rollout vllm: free vLLM's GPU memory during the PRM and policy updates (sleep mode; GPU only)"""
    offload_optimizer: bool = False
    """keep each AdamW's moments (8 bytes a parameter) in CPU memory, on the GPU only while their model updates (veRL's optimizer offload): the 1.5b preset fits 80 GB with it; costs two copies of the moments over PCIe per model and step"""
    rollout_correction: str = "token-truncate"
    """--rollout vllm: weight each token's policy loss by pi_trainer/pi_sampler of the tokens vLLM drew (prime.rollout_is_weights): 'token-truncate' (TIS, veRL's threshold 2), 'token-mask' (TRL's: above the cap, 0), 'token-band' (IcePop as veRL's mask mode: outside [1/cap, cap], out of the loss), 'sequence-truncate', 'sequence-mask' (TRL's default), 'sequence-band' or 'none'; with --rollout hf the sampler is the trainer and the weights are 1"""
    rollout_correction_cap: float = 2.0
    """the rollout correction's cap on pi_trainer/pi_sampler: truncated to it, masked above it, or (band) masked outside [1/cap, cap]"""
    seed: int = 1
    """base seed; rank r uses seed + r"""
    run_name: str = ""
    """runs/<run_name>/ holds config, metrics, episodes, curves, checkpoints; default: a timestamp"""
    out_dir: str = "runs"
    """parent folder of runs"""
    save_every: int = 20
    """checkpoint every N iterations (and at the end)"""
    keep_checkpoints: bool = False
    """keep every checkpoint-<step>/ (to evaluate a run's intermediate policies later), not only the newest"""
    resume: bool = False
    """continue runs/<run_name> from its last checkpoint"""
    eval_problems: int = 200
    """held-out problems for the start/end accuracy (embedded task) or rows held out of --data"""
    eval_every: int = 35
    """held-out accuracy every N iterations (heldout_accuracy, heldout_sampled_accuracy); 0 = only at start and end"""
    eval_samples: int = 4
    """responses per held-out problem for the sampled accuracy (at --temperature)"""
    sft_steps: int = 0
    """SFT steps of the embedded model; 0 = the recipe's 3000, shipped in checkpoints/ for the README's and the study's settings (others are trained once into --cache-dir)"""
    cache_dir: str = ".cache"
    """where an embedded SFT checkpoint that is not shipped is trained and cached"""
    tracker: str = "none"
    """also log every metric to 'tensorboard' (run folder's tensorboard/) or 'wandb' (offline unless WANDB_MODE=online); pip install -r requirements-trackers.txt"""
    episodes_per_step: int = 2
    """sample episodes with per-token implicit rewards written to episodes.jsonl each iteration"""
    max_memory_gb: float = 0.0
    """GPU memory budget for the up-front estimate; 0 = the device's total"""

    def __post_init__(self):
        if self.kl_coef == -1.0:  # PASS keeps GRPO's reference regulariser (its App. G: 1e-2); PRIME's loop has none
            self.kl_coef = 0.01 if self.estimator == "pass" else 0.0
        if not self.kl_kind:  # PASS's QA runs: the masked absolute log-prob difference
            self.kl_kind = "abs" if self.estimator == "pass" and self.pass_preset == "qa" else "k3"


# The lengths of a run on a real model and data when neither a flag nor a preset sets them (the toy's 64 and 96
# dropped 7472 of GSM8K's 7473 prompts): the paper's prompt limit, and a third of its response limit.
DATA_DEFAULTS = dict(max_prompt_len=1024, max_response_len=1024)

PRESETS = {
    # The paper's run (official run_prime_main.sh): Eurus-2-7B-SFT, 256 prompts x 4, 1024/3072 tokens.
    # Its main run is 592 steps; a checkpoint every 40, the held-out accuracy every 80 (Table 1 reads 80, 160, 240, 320).
    "paper": dict(steps=592, save_every=40, eval_every=80, prompts_per_step=256, n_samples=4, max_prompt_len=1024,
                  max_response_len=3072,
                  policy_lr=5e-7, prm_lr=1e-6, beta=0.05, mini_batches=4, micro_batch_size=8,
                  max_tokens_per_micro_batch=0, gradient_checkpointing=True, temperature=1.0, top_p=1.0,
                  filter_mode="refill"),
    # DeepSeek-R1-Distill-Qwen-1.5B (paper App. B.7) and Qwen2.5(-Math)-1.5B under plain DDP on 8 x 80 GB, by
    # memory.memory_estimate_gb (tests/test_memory.py::test_the_1_5b_preset_fits_80gb_on_each_named_model): policy
    # and PRM in fp32 with their gradients, AdamW's moments on the CPU except during their model's update
    # (--offload-optimizer), the fp32 reference; one row per micro-batch with checkpointing in bf16; vLLM's
    # share, 0.25 of the GPU (20 GB), asleep during the updates (which, at 23.9 GB, bind: the share costs
    # nothing up to there), holds a step's 128 sequences a rank at once (memory.vllm_share_gb: one wave);
    # the CUDA context and NCCL: 69.6 GB (untied DeepSeek-R1-Distill, 1.78B parameters), 61.9 GB (tied
    # Qwen2.5, 1.54B), 10% margin included.
    # App. B.7 ran DeepScaleR's first stage for 330 steps; a checkpoint every 30, the held-out accuracy every 66.
    "1.5b": dict(steps=330, save_every=30, eval_every=66, prompts_per_step=256, n_samples=4, max_prompt_len=1024,
                 max_response_len=3072,
                 policy_lr=1e-6, prm_lr=1e-6, beta=0.05, mini_batches=4, micro_batch_size=1,
                 max_tokens_per_micro_batch=0, gradient_checkpointing=True, temperature=1.0, top_p=1.0,
                 filter_mode="refill", vllm_gpu_memory_utilization=0.25, vllm_sleep=True, offload_optimizer=True),
    # The paper's own model, Qwen2.5-Math-7B (7.6B parameters), under plain DDP on 8 x 80 GB: full fine-tuning
    # cannot fit (its policy alone is 122 GB at 16 bytes a parameter), so the policy and the PRM are two rank-64
    # adapters on one frozen bf16 base that is also the reference (--lora-rank). vLLM's share holds its bf16
    # copy of the base (15.2 GB), the adapter's slot, its activations and graphs, and the KV cache; its size
    # is chosen by memory.vllm_share_gb: at 0.56 of the GPU (44.8 GB), asleep during the updates (level 1: the
    # base waits in CPU memory), the KV cache holds a step's 128 sequences a rank at full length at once (one
    # wave; awake beside the updates at 0.35, it held 40: four waves). By memory.memory_estimate_gb
    # (tests/test_memory.py::test_the_7b_preset_fits_80gb): 75.9 GB, the CUDA context and NCCL included.
    # The learning rates are the paper's x10 (LoRA Without Regret: LoRA's RL lr is about 10x full fine-tuning's).
    # The paper's main run, 592 steps, with the paper preset's cadences.
    "7b": dict(steps=592, save_every=40, eval_every=80, prompts_per_step=256, n_samples=4, max_prompt_len=1024,
               max_response_len=3072,
               policy_lr=5e-6, prm_lr=1e-5, beta=0.05, mini_batches=4, micro_batch_size=1,
               max_tokens_per_micro_batch=0, gradient_checkpointing=True, temperature=1.0, top_p=1.0,
               filter_mode="refill", vllm_gpu_memory_utilization=0.56, vllm_sleep=True, lora_rank=64,
               lora_alpha=32.0),
}

CHOICES = dict(estimator=("rloo", "grpo", "reinforce", "prm-value", "pass", "ppo"), rloo_form=("official", "paper"),
               process=("implicit", "opd", "gopd", "step", "none"), task=("math", "qa"),
               math_grader=verify.MATH_GRADERS,
               pass_preset=("math", "qa", "v1"),
               process_norm=("batch", "beta"), reference=("sft", "policy"), prm_update=("after", "before"),
               prm_loss=("ce", "dpo"), prm_groups=("kept", "mixed"), process_groups=("all", "mixed"), loss_mean=("global", "micro"),
               rollout=("hf", "vllm"), precision=("bf16", "fp32"), preset=("", "paper", "1.5b", "7b"), sandbox=("auto", "namespaces"),
               filter_mode=("shrink", "refill"), tracker=("none", "tensorboard", "wandb"), kl_kind=("k3", "abs"),
               rollout_correction=("none", "token-truncate", "token-mask", "token-band", "sequence-truncate",
                                   "sequence-mask", "sequence-band"))


def parse_args(argv=None, description: str = "") -> Args:
    """argparse from the dataclass: each field is a flag, its docstring the help text."""
    source = inspect.getsource(Args)
    docs = {}
    tree = ast.parse(source).body[0].body
    for node, nxt in zip(tree, tree[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr):
            docs[node.target.id] = nxt.value.value
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(Args):
        flag = "--" + f.name.replace("_", "-")
        shown = f" (default: {f.default!r})" if f.default is not dataclasses.MISSING else ""  # a factory's: its docstring
        if f.type is bool or f.type == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=docs.get(f.name) + shown)
        else:
            kind = {"int": int, "float": float, "str": str}.get(str(f.type), f.type)
            parser.add_argument(flag, type=kind, default=None, help=docs.get(f.name).replace("%", "%%") + shown,
                                choices=CHOICES.get(f.name))
    parser.add_argument("--gamma", type=float, default=None,
                        help="shorthand for --process-gamma G --outcome-gamma G (either flag given beside it wins)")
    given = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
    gamma = given.pop("gamma", None)
    if gamma is not None:
        if not 0 <= gamma <= 1:
            parser.exit(2, f"{parser.prog}: error: --gamma {gamma} must be in [0, 1]\n")
        given = {"process_gamma": gamma, "outcome_gamma": gamma, **given}
    values = dict(PRESETS.get(given.get("preset", ""), {}))
    if given.get("data") and given.get("model"):  # real text: the toy's 64 prompt tokens would drop nearly all
        values = {**DATA_DEFAULTS, **values}
    if "micro_batch_size" in given and "max_tokens_per_micro_batch" not in given:
        values["max_tokens_per_micro_batch"] = 0  # a row count asked for alone replaces the default token budget
    values.update(given)  # explicit flags beat the preset
    args = Args(**values)
    try:
        check_args(args)
    except ConfigError as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")  # like argparse: exit code 2, no traceback
    return args


class ConfigError(Exception):
    """A configuration that cannot work; `parse_args` reports it like argparse (exit code 2)."""


# The domain of every numeric flag: (test, what is allowed). Checked right after parsing (and after a
# preset is applied), before anything is loaded or written.
POSITIVE, AT_LEAST_1, AT_LEAST_0 = (lambda v: v > 0, "> 0"), (lambda v: v >= 1, ">= 1"), (lambda v: v >= 0, ">= 0")
UNIT = (lambda v: 0 <= v <= 1, "in [0, 1]")
DOMAINS = dict(
    steps=AT_LEAST_1, prompts_per_step=AT_LEAST_1, n_samples=AT_LEAST_1, max_prompt_len=AT_LEAST_1,
    max_response_len=AT_LEAST_1, temperature=POSITIVE, top_p=(lambda v: 0 < v <= 1, "in (0, 1]"),
    prm_warmup_steps=AT_LEAST_0, prm_freeze_step=AT_LEAST_0, teacher_sft_steps=AT_LEAST_1, gopd_lambda=POSITIVE, beta=POSITIVE,
    filter_low=UNIT, filter_high=UNIT, clip_eps=(lambda v: 0 < v < 1, "in (0, 1)"),
    dual_clip=(lambda v: v == 0 or v > 1, "0 (off) or > 1 (veRL: 3)"), process_gamma=UNIT, outcome_gamma=UNIT,
    policy_lr=POSITIVE,
    prm_lr=POSITIVE, policy_weight_decay=AT_LEAST_0, policy_grad_clip=POSITIVE, prm_grad_clip=POSITIVE,
    refill_draws=AT_LEAST_0, mini_batches=AT_LEAST_1, micro_batch_size=AT_LEAST_1,
    max_tokens_per_micro_batch=AT_LEAST_0,
    gae_lambda=UNIT, critic_lr=POSITIVE,
    critic_warmup_steps=AT_LEAST_0, value_clip=AT_LEAST_0,
    vllm_gpu_memory_utilization=(lambda v: 0 < v <= 1, "in (0, 1]"), save_every=AT_LEAST_1,
    rollout_correction_cap=(lambda v: v >= 1, ">= 1 (a cap below 1 would cut tokens the two engines agree on)"),
    eval_problems=AT_LEAST_1, eval_every=AT_LEAST_0, eval_samples=AT_LEAST_1, sft_steps=AT_LEAST_0,
    lora_rank=AT_LEAST_0, lora_alpha=POSITIVE, episodes_per_step=AT_LEAST_0, step_noise=AT_LEAST_0, max_memory_gb=AT_LEAST_0, toy_slip=(lambda v: 0 <= v < 1, "in [0, 1)"),
)


def check_args(args: Args) -> None:
    """Every bad value and every combination that cannot work fails here, naming the flag, the value
    and what is allowed, before anything is loaded or written (raises ConfigError)."""
    import runlog
    import step_prm
    import toy_task
    from transformers import AutoTokenizer
    def bad(message):
        raise ConfigError(message)

    if args.kl_coef < 0:
        bad(f"--kl-coef {args.kl_coef}: must be >= 0 (or -1, the default: 1e-2 under --estimator pass, else 0)")
    if args.tracker != "none" and (missing := runlog.tracker_missing(args.tracker)):
        bad(missing)
    for name, (ok, allowed) in DOMAINS.items():
        value = getattr(args, name)
        if not (isinstance(value, (int, float)) and math.isfinite(value) and ok(value)):
            bad(f"--{name.replace('_', '-')} {value}: must be {allowed}")
    # paths that must exist (a --model without a "/" is no hub name either)
    if args.data and not Path(args.data).is_file():
        bad(f"--data {args.data}: file not found")
    if args.data and Path(args.data).suffix not in (".jsonl", ".parquet"):
        bad(f"--data {args.data}: expected a .jsonl or .parquet file")
    for flag, path in (("--model", args.model), ("--teacher", args.teacher)):
        if path and not Path(path).exists() and ("/" not in path or path.startswith(("/", ".", "~"))):
            bad(f"{flag} {path}: no such local path" + ("" if "/" in path else " (and not a hub name like org/model)"))
    if args.process == "step" and args.step_scorer not in (*step_prm.TOY_SCORERS, "chains") \
            and not Path(args.step_scorer).exists() and "/" not in args.step_scorer:
        bad(f"--step-scorer {args.step_scorer}: 'toy', 'toy-first', 'chains' or the path of a step PRM")
    if args.prm_init not in ("", "teacher") and not Path(args.prm_init).exists() and "/" not in args.prm_init:
        bad(f"--prm-init {args.prm_init}: 'teacher' or a model path (no such local path)")
    if not args.data:
        try:
            toy_task.parse_ops(args.toy_ops)
        except ValueError as e:
            bad(f"--toy-ops {e}")
    # combinations
    if args.n_samples < 2 and args.estimator in ("rloo", "grpo", "pass"):
        bad(f"--n-samples {args.n_samples}: --estimator {args.estimator} needs at least 2 responses per "
            "prompt for its group baseline")
    if args.filter_low > args.filter_high:
        bad(f"--filter-low {args.filter_low} / --filter-high {args.filter_high}: need low <= high")
    if args.estimator == "ppo" and args.process_gamma != args.outcome_gamma:
        bad(f"--process-gamma {args.process_gamma} / --outcome-gamma {args.outcome_gamma}: --estimator ppo "
            "discounts one token reward (outcome + process) with one critic, so they must be equal (use --gamma)")
    if args.estimator == "pass" and (args.process_gamma, args.outcome_gamma) != (1.0, 1.0):
        bad("--process-gamma / --outcome-gamma: --estimator pass has no returns to discount (its own gamma is "
            "Advantage Fusion's weight, set by --pass-preset)")
    if args.estimator == "prm-value" and args.process != "implicit":
        bad(f"--estimator prm-value uses the implicit PRM as its value model: needs --process implicit, "
            f"not {args.process}")
    if args.critic_warmup_steps and args.estimator != "ppo":
        bad(f"--critic-warmup-steps {args.critic_warmup_steps}: only --estimator ppo has a critic")
    if args.critic_warmup_steps >= args.steps:
        bad(f"--critic-warmup-steps {args.critic_warmup_steps}: must be below --steps {args.steps} (the policy "
            "would never train)")
    if (args.prm_warmup_steps or not args.prm_online or args.prm_freeze_step) and args.process != "implicit":
        bad("--prm-warmup-steps / --no-prm-online / --prm-freeze-step are about the implicit PRM: they need "
            "--process implicit")
    if args.prm_loss == "dpo" and not args.max_tokens_per_micro_batch and args.micro_batch_size % args.n_samples:
        bad(f"--prm-loss dpo compares responses within a group: --micro-batch-size {args.micro_batch_size} "
            f"must be a multiple of --n-samples {args.n_samples}")
    if args.teacher and args.process not in ("opd", "gopd") and args.prm_init != "teacher":
        bad(f"--teacher is used only by --process opd/gopd and --prm-init teacher, not --process {args.process}")
    if args.process in ("opd", "gopd") and not args.teacher and (args.model or args.data):
        bad(f"--process {args.process} with your own --model/--data needs --teacher PATH "
            "(the embedded teacher only knows the embedded task)")
    if args.teacher and args.model and Path(args.teacher).is_dir() and Path(args.model).is_dir():
        # tokenizers only: cheap, and the run would fail later
        if AutoTokenizer.from_pretrained(args.teacher).get_vocab() != AutoTokenizer.from_pretrained(args.model).get_vocab():
            bad(f"--teacher {args.teacher}: its tokenizer differs from --model {args.model}'s; OPD compares "
                "log-probs of the same token ids, so the vocabularies must be identical")
    if args.process == "step" and args.step_scorer in step_prm.TOY_SCORERS and args.data:
        bad(f"--step-scorer {args.step_scorer} checks the embedded arithmetic task only: give the path of a step PRM")
    if args.step_noise and args.process != "step":
        bad(f"--step-noise {args.step_noise}: adds noise to a step scorer's scores, needs --process step")
    if args.process_groups == "mixed" and args.process == "none":
        bad("--process-groups mixed: there is no process reward with --process none")
    if args.prm_init and args.process != "implicit":
        bad(f"--prm-init {args.prm_init}: the implicit PRM's start, needs --process implicit")
    if args.prm_init == "teacher" and not args.teacher and (args.model or args.data):
        bad("--prm-init teacher with your own --model/--data needs --teacher PATH (the embedded teacher only "
            "knows the embedded task)")
    if args.pass_preset == "v1" and args.estimator == "pass" and args.process != "step":
        bad("--pass-preset v1 chunks by the step PRM's steps: it needs --process step")
    if args.lora_rank > VLLM_MAX_LORA_RANK and args.rollout == "vllm":
        bad(f"--lora-rank {args.lora_rank}: vLLM 0.32 holds adapters of rank {VLLM_MAX_LORA_RANK} at most; "
            "choose a smaller rank or --rollout hf")
    if args.lora_rank and args.estimator == "ppo":
        bad(f"--lora-rank {args.lora_rank} with --estimator ppo: PPO's critic is a whole model with a value head of "
            "its own, not an adapter of the shared base; use full fine-tuning (--lora-rank 0) or another estimator")
    if args.lora_rank and args.prm_init:
        bad(f"--lora-rank {args.lora_rank} with --prm-init {args.prm_init}: the PRM is an adapter on the policy's "
            "base, so it starts from that base (the paper's start); --prm-init needs --lora-rank 0")
    if args.resume and not args.run_name:
        bad("--resume needs --run-name of the run to continue")
    if args.resume and not (Path(args.out_dir) / args.run_name / "checkpoint" / "state.pt").exists():
        bad(f"--resume: no checkpoint in {Path(args.out_dir) / args.run_name / 'checkpoint'}")
    if args.rollout == "vllm":
        if importlib.util.find_spec("vllm") is None:
            bad("--rollout vllm: vLLM is not installed (see docs/node.md, vLLM rollouts), or use --rollout hf")
    if not args.prm_online and not args.prm_warmup_steps and not args.prm_init:
        print("warning: --no-prm-online without --prm-warmup-steps: the PRM stays equal to the reference and "
              "every implicit reward is 0")
    if args.process == "implicit" and args.filter_low <= 0 and args.filter_high >= 1 and args.policy_lr >= 1e-4:
        # the credit-assignment study (docs/REPRODUCTION.md): without the filter the untrained PRM's rewards
        # are the only advantage of every all-wrong group, and at lr 1e-4 they took greedy accuracy to 0
        print(f"warning: --filter-low {args.filter_low:g} --filter-high {args.filter_high:g} keeps every group, "
              f"and at --policy-lr {args.policy_lr:g} implicit process rewards without PRIME's filter collapsed "
              "the embedded policy in the credit study; keep the filter, lower the lr, or use --prm-groups mixed "
              "with care")
