"""PRIME: online RL with implicit process rewards, one loop, top to bottom like the paper's Algorithm 1.

    python train.py                                   # embedded default: tiny model, toy task, CPU
    python train.py --steps 5 --run-name smoke        # a shorter run
    torchrun --nproc_per_node=8 train.py --model PATH --data train.parquet --preset 1.5b
    torchrun --nnodes=2 --nproc_per_node=8 --node_rank=R --master_addr=HOST --master_port=29500 \\
        train.py --model PATH --data train.parquet    # when one node is no longer enough

Each iteration (paper Algorithm 1; official code `ray_trainer.py`):
    1. sample n_samples responses for each prompt                      (rollout.py)
    2. verify them -> outcome r_o in [0, 1]                            (verify.py)
    3. filter prompt groups by mean accuracy in [low, high]            (prime.keep_groups)
    4. implicit PRM forward (Eq. 3) and its cross-entropy update       (prime.implicit_process_reward,
       (or another process signal, --process: a teacher, a step PRM)    prime.prm_ce_loss; step_prm.py)
    5. advantages: RLOO over outcome and process rewards, whitened    (prime.rloo_advantage, whiten)
    6. PPO clip update of the policy (Eq. 6)                           (prime.ppo_clip_loss)
    7. log, checkpoint

Simplifications relative to the paper's setup (each one a choice a reader should know about):
    1. Plain DDP on one process per GPU; no FSDP/ZeRO, so a model must fit with its gradients and
       AdamW states (fp32) on one GPU, twice (policy and PRM). An estimate is printed up front.
    2. The filter trains on what survives from a fixed number of sampled prompts, instead of
       sampling more prompts until the batch is full (official code). Ranks keep different numbers
       of groups; the shorter ranks run zero-weight micro-batches so DDP's collectives line up.
    3. One PPO epoch, no KL term, no entropy bonus (as the paper's run).
    4. Generation: `--rollout vllm` (the default where vLLM and a GPU are present) runs a vLLM engine
       inside each rank, fed the policy's weights after every update; `--rollout hf` samples with HF
       `generate` on the policy itself. Held-out accuracy always uses HF greedy decoding.
    5. Each optimizer step minimises the token mean over its whole mini-batch, all ranks and micro-
       batches (--loss-mean global), so the split changes nothing; the official code averaged the
       micro-batch means (--loss-mean micro, what the paper's runs did).
"""

import argparse
import contextlib
import dataclasses
import json
import math
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

import pass_advantage
import prime
import step_prm
import toy_task
import verify
from data import Task, load_tasks
from rollout import HFRollout, Rollout, VLLMRollout, position_ids_from_mask

# ---------------------------------------------------------------------------------------------------
# Configuration: every option the paper studies is a flag
# ---------------------------------------------------------------------------------------------------


def default_rollout() -> str:
    """--rollout default: vLLM where it is installed and a GPU is present (much faster there), else HF."""
    import importlib.util
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
    """named hyper-parameter sets: 'paper' (the paper's 7B run) or '1.5b' (fits plain DDP on 80 GB GPUs)"""
    # --- the RL loop
    steps: int = 100
    """RL iterations"""
    prompts_per_step: int = 32
    """prompts sampled per iteration, over all ranks (paper: 256)"""
    n_samples: int = 4
    """K, responses per prompt (paper: 4)"""
    max_prompt_len: int = 64
    """prompts longer than this are dropped from the data with a warning (paper: 1024)"""
    max_response_len: int = 96
    """max new tokens per response (paper: 3072)"""
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
    prm_groups: str = "kept"
    """which groups the implicit PRM learns from: 'kept' (every group the filter keeps, as the paper) or 'mixed' (only groups with both right and wrong responses, whose labels contrast); its rewards reach every kept group either way"""
    teacher: str = ""
    """--process opd/gopd: a frozen causal LM on the policy's tokenizer; empty = the embedded toy teacher (a longer SFT)"""
    teacher_sft_steps: int = toy_task.TEACHER_SFT_STEPS
    """SFT steps of the embedded toy teacher (1500: shipped in checkpoints/; another count is trained into --cache-dir)"""
    gopd_lambda: float = 1.25
    """--process gopd: lambda of lambda (l_T - l_B) - (l_theta - l_B), base = the starting policy (PASS v1: 1.25)"""
    step_scorer: str = "toy"
    """--process step: 'toy' (the embedded task's exact step checker) or the path of an HF step PRM (e.g. Qwen2.5-Math-PRM-7B)"""
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
    filter_truncated: bool = False
    """drop a prompt group if any of its responses hit max_response_len (off in the paper run)"""
    clip_eps: float = 0.2
    """PPO clip range (Eq. 6)"""
    dual_clip: float = 0.0
    """dual-clip PPO's c > 1 for negative advantages (veRL: 3); 0 = off, as PRIME-RL and the paper"""
    gamma: float = 1.0
    """discount of the process return (paper: 1.0)"""
    gae_lambda: float = 1.0
    """--estimator ppo: GAE's lambda (veRL: 1.0; 0 = one-step TD errors)"""
    critic_lr: float = 3e-4
    """--estimator ppo: the critic's AdamW learning rate (veRL: 1e-5 for 7B models; the tiny model needs more)"""
    critic_warmup_steps: int = 0
    """--estimator ppo: the policy stays frozen for the first N iterations while the critic fits"""
    value_clip: float = 0.5
    """--estimator ppo: the value loss's clip range around the critic's old values (veRL: 0.5); 0 = unclipped"""
    # --- optimisation
    policy_lr: float = 3e-5
    """policy AdamW learning rate (paper: 5e-7 for a 7B model; 1e-4 degraded the tiny model here)"""
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
    """responses per forward/backward; gradients accumulate across micro-batches"""
    max_tokens_per_micro_batch: int = 0
    """token budget of a micro-batch instead of a row count: rows grouped by length, each micro-batch at most N padded tokens (prompt + response); 0 = off"""
    loss_mean: str = "global"
    """'global': each optimizer step's loss is the token mean over its whole mini-batch, all ranks (Eq. 6; independent of the split); 'micro': the mean of micro-batch means (the official code, the paper's runs)"""
    gradient_checkpointing: bool = False
    """recompute activations in backward to save memory (big models)"""
    # --- plumbing
    rollout: str = field(default_factory=default_rollout)
    """generation backend: 'vllm' (an engine in each rank) or 'hf'; default: vllm where installed and a GPU is present, else hf"""
    vllm_gpu_memory_utilization: float = 0.3
    """--rollout vllm: fraction of the WHOLE GPU for vLLM's weights and KV cache; training gets the rest"""
    vllm_sleep: bool = False
    """--rollout vllm: free vLLM's GPU memory during the PRM and policy updates (sleep mode; GPU only)"""
    seed: int = 1
    """base seed; rank r uses seed + r"""
    run_name: str = ""
    """runs/<run_name>/ holds config, metrics, episodes, curves, checkpoints; default: a timestamp"""
    out_dir: str = "runs"
    """parent folder of runs"""
    save_every: int = 20
    """checkpoint every N iterations (and at the end)"""
    resume: bool = False
    """continue runs/<run_name> from its last checkpoint"""
    eval_problems: int = 200
    """held-out problems for the start/end accuracy (embedded task) or rows held out of --data"""
    eval_every: int = 20
    """held-out accuracy every N iterations (heldout_accuracy, heldout_sampled_accuracy); 0 = only at start and end"""
    eval_samples: int = 4
    """responses per held-out problem for the sampled accuracy (at --temperature)"""
    sft_steps: int = 0
    """SFT steps of the embedded model; 0 = the recipe's 3000, shipped in checkpoints/ for the README's and the study's settings (others are trained once into --cache-dir)"""
    cache_dir: str = ".cache"
    """where an embedded SFT checkpoint that is not shipped is trained and cached"""
    episodes_per_step: int = 2
    """sample episodes with per-token implicit rewards written to episodes.jsonl each iteration"""
    max_memory_gb: float = 0.0
    """GPU memory budget for the up-front estimate; 0 = the device's total"""


PRESETS = {
    # The paper's run (official run_prime_main.sh): Eurus-2-7B-SFT, 256 prompts x 4, 1024/3072 tokens.
    "paper": dict(prompts_per_step=256, n_samples=4, max_prompt_len=1024, max_response_len=3072,
                  policy_lr=5e-7, prm_lr=1e-6, beta=0.05, mini_batches=4, micro_batch_size=8,
                  gradient_checkpointing=True, temperature=1.0, top_p=1.0),
    # DeepSeek-R1-Distill-Qwen-1.5B (paper App. B.7) under plain DDP on 80 GB: fp32 policy and PRM with
    # AdamW take ~48 GB, so fewer tokens per micro-batch and checkpointing.
    "1.5b": dict(prompts_per_step=256, n_samples=4, max_prompt_len=1024, max_response_len=3072,
                 policy_lr=1e-6, prm_lr=1e-6, beta=0.05, mini_batches=4, micro_batch_size=2,
                 gradient_checkpointing=True, temperature=1.0, top_p=1.0),
}

CHOICES = dict(estimator=("rloo", "grpo", "reinforce", "prm-value", "pass", "ppo"), rloo_form=("official", "paper"),
               process=("implicit", "opd", "gopd", "step", "none"), task=("math", "qa"),
               math_grader=verify.MATH_GRADERS,
               pass_preset=("math", "qa", "v1"),
               process_norm=("batch", "beta"), reference=("sft", "policy"), prm_update=("after", "before"),
               prm_loss=("ce", "dpo"), prm_groups=("kept", "mixed"), loss_mean=("global", "micro"),
               rollout=("hf", "vllm"), preset=("", "paper", "1.5b"))


def parse_args(argv=None) -> Args:
    """argparse from the dataclass: each field is a flag, its docstring the help text."""
    import ast
    import inspect

    source = inspect.getsource(Args)
    docs = {}
    tree = ast.parse(source).body[0].body
    for node, nxt in zip(tree, tree[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr):
            docs[node.target.id] = nxt.value.value
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(Args):
        flag = "--" + f.name.replace("_", "-")
        if f.type is bool or f.type == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=docs.get(f.name))
        else:
            kind = {"int": int, "float": float, "str": str}.get(str(f.type), f.type)
            parser.add_argument(flag, type=kind, default=None, help=docs.get(f.name),
                                choices=CHOICES.get(f.name))
    given = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
    values = dict(PRESETS.get(given.get("preset", ""), {}))
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
    prm_warmup_steps=AT_LEAST_0, teacher_sft_steps=AT_LEAST_1, gopd_lambda=POSITIVE, beta=POSITIVE,
    filter_low=UNIT, filter_high=UNIT, clip_eps=(lambda v: 0 < v < 1, "in (0, 1)"),
    dual_clip=(lambda v: v == 0 or v > 1, "0 (off) or > 1 (veRL: 3)"), gamma=UNIT, policy_lr=POSITIVE,
    prm_lr=POSITIVE, policy_weight_decay=AT_LEAST_0, policy_grad_clip=POSITIVE, prm_grad_clip=POSITIVE,
    mini_batches=AT_LEAST_1, micro_batch_size=AT_LEAST_1, max_tokens_per_micro_batch=AT_LEAST_0,
    gae_lambda=UNIT, critic_lr=POSITIVE,
    critic_warmup_steps=AT_LEAST_0, value_clip=AT_LEAST_0,
    vllm_gpu_memory_utilization=(lambda v: 0 < v <= 1, "in (0, 1]"), save_every=AT_LEAST_1,
    eval_problems=AT_LEAST_1, eval_every=AT_LEAST_0, eval_samples=AT_LEAST_1, sft_steps=AT_LEAST_0,
    episodes_per_step=AT_LEAST_0, max_memory_gb=AT_LEAST_0, toy_slip=(lambda v: 0 <= v < 1, "in [0, 1)"),
)


def check_args(args: Args) -> None:
    """Every bad value and every combination that cannot work fails here, naming the flag, the value
    and what is allowed, before anything is loaded or written (raises ConfigError)."""
    def bad(message):
        raise ConfigError(message)

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
        if path and not Path(path).exists() and "/" not in path:
            bad(f"{flag} {path}: no such local path (and not a hub name like org/model)")
    if args.process == "step" and args.step_scorer != "toy" and not Path(args.step_scorer).exists() \
            and "/" not in args.step_scorer:
        bad(f"--step-scorer {args.step_scorer}: 'toy' or the path of a step PRM")
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
    if args.estimator == "prm-value" and args.process != "implicit":
        bad(f"--estimator prm-value uses the implicit PRM as its value model: needs --process implicit, "
            f"not {args.process}")
    if args.critic_warmup_steps and args.estimator != "ppo":
        bad(f"--critic-warmup-steps {args.critic_warmup_steps}: only --estimator ppo has a critic")
    if args.critic_warmup_steps >= args.steps:
        bad(f"--critic-warmup-steps {args.critic_warmup_steps}: must be below --steps {args.steps} (the policy "
            "would never train)")
    if (args.prm_warmup_steps or not args.prm_online) and args.process != "implicit":
        bad("--prm-warmup-steps / --no-prm-online are about the implicit PRM: they need --process implicit")
    if args.prm_loss == "dpo" and not args.max_tokens_per_micro_batch and args.micro_batch_size % args.n_samples:
        bad(f"--prm-loss dpo compares responses within a group: --micro-batch-size {args.micro_batch_size} "
            f"must be a multiple of --n-samples {args.n_samples}")
    if args.teacher and args.process not in ("opd", "gopd"):
        bad(f"--teacher is used only by --process opd/gopd, not {args.process}")
    if args.process in ("opd", "gopd") and not args.teacher and (args.model or args.data):
        bad(f"--process {args.process} with your own --model/--data needs --teacher PATH "
            "(the embedded teacher only knows the embedded task)")
    if args.teacher and args.model and Path(args.teacher).is_dir() and Path(args.model).is_dir():
        from transformers import AutoTokenizer  # tokenizers only: cheap, and the run would fail later
        if AutoTokenizer.from_pretrained(args.teacher).get_vocab() != AutoTokenizer.from_pretrained(args.model).get_vocab():
            bad(f"--teacher {args.teacher}: its tokenizer differs from --model {args.model}'s; OPD compares "
                "log-probs of the same token ids, so the vocabularies must be identical")
    if args.process == "step" and args.step_scorer == "toy" and args.data:
        bad("--step-scorer toy checks the embedded arithmetic task only: give the path of a step PRM")
    if args.pass_preset == "v1" and args.estimator == "pass" and args.process != "step":
        bad("--pass-preset v1 chunks by the step PRM's steps: it needs --process step")
    if args.resume and not args.run_name:
        bad("--resume needs --run-name of the run to continue")
    if args.resume and not (Path(args.out_dir) / args.run_name / "checkpoint" / "state.pt").exists():
        bad(f"--resume: no checkpoint in {Path(args.out_dir) / args.run_name / 'checkpoint'}")
    if args.rollout == "vllm":
        import importlib.util
        if importlib.util.find_spec("vllm") is None:
            bad("--rollout vllm: vLLM is not installed (see the README's vLLM section), or use --rollout hf")
    if not args.prm_online and not args.prm_warmup_steps:
        print("warning: --no-prm-online without --prm-warmup-steps: the PRM stays equal to the reference and "
              "every implicit reward is 0")
    if args.process == "implicit" and args.filter_low <= 0 and args.filter_high >= 1 and args.policy_lr >= 1e-4:
        # the credit-assignment study (docs/REPRODUCTION.md): without the filter the untrained PRM's rewards
        # are the only advantage of every all-wrong group, and at lr 1e-4 they took greedy accuracy to 0
        print(f"warning: --filter-low {args.filter_low:g} --filter-high {args.filter_high:g} keeps every group, "
              f"and at --policy-lr {args.policy_lr:g} implicit process rewards without PRIME's filter collapsed "
              "the embedded policy in the credit study; keep the filter, lower the lr, or use --prm-groups mixed "
              "with care")


# ---------------------------------------------------------------------------------------------------
# Distributed set-up: plain DDP, one process per GPU (or per CPU worker with gloo)
# ---------------------------------------------------------------------------------------------------


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def master(self) -> bool:
        return self.rank == 0


def setup_distributed() -> Dist:
    if "RANK" not in os.environ:
        return Dist(device=torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    rank, world, local_rank = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    # Rollouts are long: a rank waiting for a slower rank's generation must not time out.
    import datetime
    dist.init_process_group(backend, timeout=datetime.timedelta(hours=2))
    return Dist(rank, world, local_rank, device)


def check_shared_storage(folder: Path, flag: str, d: Dist) -> None:
    """More than one process: every rank must see the files rank 0 writes in `folder`.

    Several nodes need a file system they all share (NFS, Lustre, ...) for --out-dir (rank 0 writes
    the logs, metrics and the checkpoint's models; every rank writes its own RNG file into the same
    checkpoint and reads it back on --resume) and, for the embedded model, --cache-dir (rank 0
    trains the SFT checkpoint there; every rank loads it). --model and --data must be readable at
    the same path on every node. Without a shared folder a run would fail at its first checkpoint
    or hang; this check stops it at the start, on every rank, with the reason."""
    if d.world == 1:
        return
    probe = folder / f".shared-check-{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}"
    if d.master:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_text("written by rank 0")
    barrier(d)
    missing = all_reduce([0.0 if probe.exists() else 1.0], d)[0]
    barrier(d)
    if d.master:
        probe.unlink(missing_ok=True)
    if missing:
        raise SystemExit(f"{flag} {folder}: {int(missing)} rank(s) cannot see the files rank 0 writes there. "
                         f"A run on several nodes needs {flag} on a file system all nodes share (see the "
                         "README's multi-node section)")


def all_reduce(values: list[float], d: Dist, op=None) -> list[float]:
    """Sum (or another op) of a few floats over ranks, for metrics and for lining up micro-batches."""
    if d.world == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=d.device)
    dist.all_reduce(t, op=op or dist.ReduceOp.SUM)
    return t.tolist()


def print0(d: Dist, *a, **kw):
    if d.master:
        print(*a, **kw, flush=True)


def step_prompts(args: Args, train_tasks: list[Task], tokenizer, step: int, d: Dist) -> list[Task]:
    """This rank's prompts for iteration `step`: a deterministic function of (seed, step), so a
    resumed run continues with exactly the prompts it would have seen. Rank r takes every
    world-th prompt of the global list; whole groups stay on one rank."""
    if args.prompts_per_step % d.world:
        raise SystemExit(f"--prompts-per-step {args.prompts_per_step} is not divisible by the "
                         f"world size {d.world}")
    if not args.data:
        problems = toy_task.make_problems(args.prompts_per_step, args.seed * 1_000_003 + step,
                                          *toy_task.parse_ops(args.toy_ops))
        tasks = [Task(tokenizer(p.prompt)["input_ids"], p.answer, "math", p.prompt) for p in problems]
    else:
        epoch, offset = divmod(step * args.prompts_per_step, len(train_tasks))
        order = list(range(len(train_tasks)))
        random.Random(args.seed + epoch).shuffle(order)
        order = order + order  # wrap around the epoch boundary
        tasks = [train_tasks[i] for i in order[offset:offset + args.prompts_per_step]]
    return tasks[d.rank::d.world]


# ---------------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------------


def embedded_checkpoint(args: Args, sft_steps: int, d: Dist, label: str = "", slip: float | None = None) -> str:
    """Path of the toy SFT checkpoint (of `sft_steps` steps, 0 = the recipe's toy_task.SFT_STEPS) for
    the task's --toy-ops and --toy-slip (or `slip`): shipped in checkpoints/ (hash-checked), or trained
    by rank 0 into --cache-dir on first use while the other ranks wait for its path."""
    slip = args.toy_slip if slip is None else slip
    path = str(toy_task.sft_checkpoint(Path(args.cache_dir), sft_steps, log=lambda m: print0(d, label + m),
                                       ops=toy_task.parse_ops(args.toy_ops), slip=slip)) if d.master else None
    if d.world > 1:
        box = [path]
        dist.broadcast_object_list(box, src=0)
        path = box[0]
    return path


def load_model_and_tokenizer(args: Args, d: Dist):
    """The SFT checkpoint: policy, PRM and reference all start from it (paper Sec. 3.3)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

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
    from transformers import AutoConfig, AutoModelForCausalLM

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
    from transformers import AutoTokenizer

    try:
        if AutoTokenizer.from_pretrained(path).get_vocab() != tokenizer.get_vocab():
            raise SystemExit(f"--teacher {path}: its tokenizer differs from the policy's; OPD compares "
                             "log-probs of the same token ids, so the vocabularies must be identical")
        return load_frozen(path, d)
    except OSError as e:
        raise SystemExit(f"--teacher {path}: cannot load it ({e})")


def load_frozen(path: str, d: Dist):
    """A model that is only read (reference, teacher): fp32, eval mode, no gradients, on the device."""
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval().requires_grad_(False).to(d.device)


def wrap_ddp(model, d: Dist):
    if d.world == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP
    return DDP(model, device_ids=[d.local_rank] if d.device.type == "cuda" else None)


def unwrap(model):
    return model.module if hasattr(model, "module") else model


# ---------------------------------------------------------------------------------------------------
# Log-probs of sampled responses (the same positions the sampler used)
# ---------------------------------------------------------------------------------------------------


def response_logprobs(model, ro: Rollout, temperature: float = 1.0) -> torch.Tensor:
    """log pi(y_t | x, y_<t) for every response token, (B, R) float32, 0 on padding.

    Each row's prompt and response go in as one sequence (forward_sequences); only the last
    positions, where the responses are, go through the LM head (`logits_to_keep`), and
    prime.token_logprobs never builds a full float32 log-softmax.
    """
    t = ro.trimmed()
    R = t.response_ids.shape[1]
    out, input_ids = forward_sequences(model, t, logits_to_keep=R + 1)
    logits = out.logits[:, :-1]  # (B, R, V): the prediction of each of the last R tokens of each row
    logp = prime.token_logprobs(logits, input_ids[:, -R:], temperature)
    return widen(to_response_columns(logp, t.response_mask), ro.response_ids.shape[1])


def forward_sequences(model, ro: Rollout, **kwargs):
    """(model output, input ids) of each row's prompt + response on the model's device, as ONE
    left-padded sequence: the real tokens of prompt and response, contiguous, ending at the last
    column. A batch's padding is then what its longest sequence needs, whatever the spread of prompt
    and response lengths (prompts left-padded to the widest prompt and responses right-padded to the
    widest response would pad twice). Positions come from the attention mask, so left padding does
    not shift them, exactly as in HF generate. Response token t of a row with L response tokens sits
    L - t columns from the end; to_response_columns puts it back in column t."""
    device = next(model.parameters()).device
    ids = torch.cat([ro.prompt_ids, ro.response_ids], 1)
    mask = torch.cat([ro.prompt_mask, ro.response_mask], 1)
    order = torch.argsort(mask, dim=1, stable=True)  # per row: padding first, then the real tokens in order
    width = int(mask.sum(1).max())
    ids, mask = ids.gather(1, order)[:, -width:].to(device), mask.gather(1, order)[:, -width:].to(device)
    return model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                 use_cache=False, **kwargs), ids


def to_response_columns(last: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B, R) values of the last R tokens of each forward_sequences row -> (B, R) with response
    token t in column t, 0 on padding. Row i's response (L_i tokens) fills the last L_i of the R
    columns, so its token t is at column R - L_i + t of `last`."""
    R = response_mask.shape[1]
    lengths = response_mask.sum(1).to(last.device)
    column = ((R - lengths)[:, None] + torch.arange(R, device=last.device)[None]).clamp(max=R - 1)
    return last.gather(1, column) * response_mask.to(last.device)


def widen(x: torch.Tensor, width: int) -> torch.Tensor:
    """(B, R') -> (B, width) with zeros on the right: back to the batch's response width."""
    return torch.nn.functional.pad(x, (0, width - x.shape[1]))


def critic_values(critic, ro: Rollout) -> torch.Tensor:
    """--estimator ppo: V(x, y_<t) for every response token t, (B, R) float32, 0 on padding.

    The critic is the SFT model's backbone with a scalar head (AutoModelForTokenClassification, one
    label): its output at a position is the value of the sequence up to and including that position,
    so the state BEFORE response token t is read one position to the left, as the log-prob of token
    t is read from the logits one position to the left."""
    t = ro.trimmed()
    R = t.response_ids.shape[1]
    out, _ = forward_sequences(critic, t)
    values = out.logits[:, -R - 1:-1, 0].float()  # the state before each of the last R tokens
    return widen(to_response_columns(values, t.response_mask), ro.response_ids.shape[1])


@dataclasses.dataclass
class MicroBatch:
    """The rows of one forward/backward and the response columns they use.

    `rows` index the batch (any order: the token-budget plan groups rows by length); `width` is the
    widest response among them, so `of(x)` cuts a (B, R) tensor of the batch down to the micro-batch's
    (b, width) and `rollout(batch)` gives its rows trimmed of the padding they do not use. `weight`
    is 0 for a zero-weight repeat (see plan_update)."""
    rows: torch.Tensor
    width: int
    weight: float = 1.0

    def of(self, x: torch.Tensor) -> torch.Tensor:
        return x[self.rows.to(x.device), :self.width]

    def put(self, x: torch.Tensor, value: torch.Tensor) -> None:
        x[self.rows.to(x.device), :self.width] = value.to(x.dtype)

    def rollout(self, ro: Rollout) -> Rollout:
        return ro.select(self.rows).trimmed()


_told_long_rows = False  # a row over the token budget is reported once per process


def pack_rows(ro: Rollout, start: int, stop: int, args: Args, unit: int = 1) -> list[MicroBatch]:
    """Rows [start, stop) of `ro` as micro-batches, `unit` consecutive rows never split (a group, for
    the DPO loss, which compares responses within it).

    --max-tokens-per-micro-batch 0: `micro_batch_size` rows at a time, in order. Otherwise the units are
    sorted by length (prompt + response), longest first, and cut into runs whose padded size, rows x
    the run's longest sequence (forward_sequences pads each row to that), fits the budget: as FEW
    micro-batches as the budget allows and, among those cuts, the least padding (fewest computed
    tokens), found exactly by dynamic programming over the cut points. Rows of like length then share
    a micro-batch instead of each being padded to the longest row of the whole batch. A unit longer
    than the budget gets a micro-batch of its own."""
    global _told_long_rows
    prompt_len, response_len = ro.prompt_mask.sum(1).tolist(), ro.response_mask.sum(1).clamp(min=1).tolist()
    units = [list(range(s, min(s + unit, stop))) for s in range(start, stop, unit)]
    if not args.max_tokens_per_micro_batch:
        per = max(args.micro_batch_size // unit, 1)
        groups = [sum(units[i:i + per], []) for i in range(0, len(units), per)]
        return [MicroBatch(torch.tensor(g), max(response_len[r] for r in g)) for g in groups]
    budget = args.max_tokens_per_micro_batch
    longest_of = lambda u: max(prompt_len[r] + response_len[r] for r in u)  # noqa: E731
    units.sort(key=lambda u: -longest_of(u))
    longest = [longest_of(u) for u in units]
    # best[i] = (micro-batches, computed tokens, end of the first run) for units i..n-1
    n = len(units)
    best = [(0, 0, n)] * (n + 1)
    for i in range(n - 1, -1, -1):
        rows, choice = 0, None
        for j in range(i + 1, n + 1):  # the run i..j-1, padded to longest[i]
            rows += len(units[j - 1])
            size = rows * longest[i]
            if size > budget and j > i + 1:
                break
            if size > budget and not _told_long_rows:
                _told_long_rows = True
                print(f"--max-tokens-per-micro-batch {budget}: a row of {size} tokens (prompt + response"
                      f"{', its group' if unit > 1 else ''}) gets a micro-batch of its own", flush=True)
            option = (1 + best[j][0], size + best[j][1], j)
            if choice is None or option[:2] < choice[:2]:
                choice = option
        best[i] = choice
    batches, i = [], 0
    while i < n:
        rows = sum(units[i:best[i][2]], [])
        batches.append(MicroBatch(torch.tensor(rows), max(response_len[r] for r in rows)))
        i = best[i][2]
    return batches


def plan_update(ro: Rollout, n_rows: int, args: Args, d: Dist, unit: int = 1) -> list[list[MicroBatch]]:
    """This rank's micro-batches for each of the `args.mini_batches` optimizer steps over rows
    [0, n_rows): the rows are split into that many contiguous parts (at unit boundaries), each part
    packed by pack_rows.

    DDP all-reduces gradients at every backward of the sync step: every rank must run the same number
    of backwards or the job hangs. A rank with fewer micro-batches in a step repeats its first unit
    with weight 0 (a real forward/backward that contributes nothing); a rank whose filter kept
    nothing (n_rows = 0) uses the first rows of the placeholder group train.py keeps for this purpose."""
    n_units = math.ceil(n_rows / unit)
    M = args.mini_batches
    bounds = [min((k * n_units + M - 1) // M * unit, n_rows) for k in range(M + 1)]  # the first parts get any extra
    steps = [pack_rows(ro, a, b, args, unit) for a, b in zip(bounds, bounds[1:])]
    n_global = all_reduce([len(s) for s in steps], d, dist.ReduceOp.MAX if d.world > 1 else None)
    repeat = pack_rows(ro, 0, min(unit, len(ro)), args, unit)[0]
    return [s + [dataclasses.replace(repeat, weight=0.0)] * (int(n) - len(s)) for s, n in zip(steps, n_global)]


@torch.no_grad()
def batched_no_grad(fn, ro: Rollout, args: Args) -> torch.Tensor:
    """fn(trimmed micro-batch Rollout) -> (b, width) for the whole batch, micro-batch by micro-batch,
    without a graph; (B, R) float32, 0 on padding."""
    out = torch.zeros(ro.response_ids.shape, dtype=torch.float32)
    for mb in pack_rows(ro, 0, len(ro), args):
        value = fn(mb.rollout(ro))
        out = out.to(value.device)
        mb.put(out, value.float())
    return out


def logprobs_no_grad(model, ro: Rollout, args: Args, temperature: float = 1.0) -> torch.Tensor:
    """response_logprobs for a whole batch, one micro-batch at a time, without a graph."""
    return batched_no_grad(lambda r: response_logprobs(model, r, temperature), ro, args)


def values_no_grad(critic, ro: Rollout, args: Args) -> torch.Tensor:
    return batched_no_grad(lambda r: critic_values(critic, r), ro, args)


def run_update(model, optimizer, loss_fn, count, plan: list[list[MicroBatch]], args: Args, d: Dist,
               grad_clip: float) -> list[float]:
    """One optimizer step per entry of `plan` (plan_update); loss_fn(micro-batch) -> its loss, a mean
    over `count(micro-batch)` units (tokens for the token-mean losses, responses for the PRM's).
    Returns each step's loss, the same on every rank.

    --loss-mean global (default): each step minimises the mean over ALL its units, on every rank and
    in every micro-batch, as Eq. 6's token mean over the mini-batch reads: micro-batch i's mean is
    weighted by n_i / N (N = the units of the step over all ranks) and multiplied by the world size,
    because DDP averages gradients over ranks. The split into micro-batches and ranks then changes
    nothing but round-off; zero-weight repeats add nothing and dilute nothing.
    --loss-mean micro: the official code's mean of micro-batch means (veRL's loss / gradient
    accumulation steps, then DDP's average over ranks), which the paper's runs used: a short
    micro-batch's tokens weigh more than a long one's, and a rank with fewer rows weighs as much as
    one with many."""
    n_step = all_reduce([sum(count(mb) for mb in step if mb.weight) for step in plan], d)
    losses = []
    for step, n in zip(plan, n_step):
        if not n:  # nothing kept on any rank: no update (an AdamW step on zero gradients would still move)
            continue
        n_real = sum(1 for mb in step if mb.weight)
        optimizer.zero_grad(set_to_none=True)
        logged = 0.0
        for j, mb in enumerate(step):
            # DDP: all-reduce gradients only on the last micro-step of the optimizer step
            sync = j == len(step) - 1 or not hasattr(model, "no_sync")
            with (contextlib.nullcontext() if sync else model.no_sync()):
                loss = loss_fn(mb)
                if args.loss_mean == "global":
                    share = mb.weight * count(mb) / n  # of the step's global mean
                else:
                    share = mb.weight / max(n_real, 1) / d.world  # of the mean over ranks of micro-means
                (loss * share * d.world).backward()  # x world: DDP divides the summed gradients by it
            logged += loss.item() * share
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        losses.append(logged)
    return all_reduce(losses, d)  # the global mean (global), the mean over ranks of micro-means (micro)


# ---------------------------------------------------------------------------------------------------
# Verification and the online filter (steps 2-3; also used by the offline PRM's warm-up)
# ---------------------------------------------------------------------------------------------------


def verify_rollouts(sampler, ro: Rollout, tasks: list[Task], args: Args):
    """(decoded texts, verify.Score per response, outcome r_o as a (B,) float tensor)."""
    texts = sampler.decode(ro)
    scores = verify.score_batch(texts, [task.answer for task in tasks for _ in range(args.n_samples)],
                                [task.kind for task in tasks for _ in range(args.n_samples)],
                                math_grader=args.math_grader)
    return texts, scores, torch.tensor([s.reward for s in scores], dtype=torch.float32)


def filter_groups(outcome, ro: Rollout, args: Args):
    """Sec. 3.4's online filter: (rows to train on, kept groups, rows that carry gradient, rows the
    implicit PRM learns from).

    Keeps whole groups with low <= mean accuracy <= high (and, with --filter-truncated, none of its
    responses cut at max_response_len). When nothing is kept, the first group stays as a placeholder
    (with zero rows of gradient) so that this rank can still run zero-weight passes under DDP.
    With --prm-groups mixed the kept groups are reordered, mixed ones (some right, some wrong) first,
    and the PRM learns from those rows only: a group whose labels are all equal teaches it no
    contrast, only to shift every reward of the group (with the filter off, mostly down)."""
    keep = prime.keep_groups(outcome, args.n_samples, args.filter_low, args.filter_high)
    if args.filter_truncated:
        keep &= ~ro.truncated.view(-1, args.n_samples).any(-1)
    groups = keep.nonzero().squeeze(-1)
    n_prm_groups = len(groups)
    if args.prm_groups == "mixed":
        mixed = mixed_groups(outcome, args.n_samples)[groups]
        groups = torch.cat([groups[mixed], groups[~mixed]])  # stable: mixed first, each part in order
        n_prm_groups = int(mixed.sum())
    rows = (groups[:, None] * args.n_samples + torch.arange(args.n_samples)).reshape(-1)
    n_kept_groups, n_train = len(groups), len(rows)
    if n_kept_groups == 0:
        rows = torch.arange(args.n_samples)
    return rows, n_kept_groups, n_train, n_prm_groups * args.n_samples


def pairwise_accuracy_sum(sequence_score, outcome, n_train: int, args: Args) -> list[float]:
    """[the PRM's pairwise accuracy summed over the mixed groups among the first n_train rows, their
    number], to be all-reduced over ranks. Only mixed groups count: a group whose labels are all equal
    scores 0.5 in prime.prm_pairwise_accuracy whatever the PRM does, so with the filter off (many
    all-wrong groups) a mean over every group would sit near 0.5 and hide what the PRM learned."""
    if args.process == "none" or n_train == 0:
        return [0.0, 0]
    mixed = mixed_groups(outcome[:n_train], args.n_samples)
    if not mixed.any():
        return [0.0, 0]
    rows = mixed.repeat_interleave(args.n_samples)
    acc = prime.prm_pairwise_accuracy(sequence_score[:n_train][rows], outcome[:n_train][rows], args.n_samples)
    return [acc.item() * int(mixed.sum()), int(mixed.sum())]


def mixed_groups(outcome, n_samples: int) -> torch.Tensor:
    """(B,) outcomes -> (G,) bool: the groups whose responses do not all have the same outcome."""
    grouped = outcome.view(-1, n_samples)
    return grouped.max(-1).values > grouped.min(-1).values


# ---------------------------------------------------------------------------------------------------
# Process signals: PRIME's implicit PRM (Eq. 3 + its CE update), a teacher (OPD, G-OPD), a step PRM
# ---------------------------------------------------------------------------------------------------


def implicit_prm_step(prm, prm_opt, batch: Rollout, logp_ref, mask, outcome, n_train: int, args: Args,
                      d: Dist, update: bool, n_prm: int | None = None):
    """Implicit process rewards log(pi_phi / pi_ref) per token (B, R), and the PRM's CE (or DPO) update.

    Single forward (--prm-update after, the paper run): the rewards come from the same forward pass
    as the PRM loss, before its optimizer step. Double forward (before): update first, then a fresh
    forward with the updated PRM. With update=False (an offline, frozen PRM) only the forward runs.
    The PRM learns from the first `n_prm` rows (default all n_train; fewer with --prm-groups mixed);
    the rest of the n_train rows get their rewards from a gradient-free forward of the same PRM."""
    if not update:
        return prime.implicit_process_reward(logprobs_no_grad(unwrap(prm), batch, args), logp_ref, mask, 1.0), []
    n_prm = n_train if n_prm is None else n_prm
    logp_prm_store = torch.zeros_like(mask)
    if n_prm < n_train:  # rows the PRM does not learn from: rewards from the pre-update PRM too
        logp_prm_store[n_prm:n_train] = logprobs_no_grad(unwrap(prm), batch.select(slice(n_prm, n_train)), args)

    def prm_loss_fn(mb: MicroBatch):
        logp_prm = response_logprobs(prm, mb.rollout(batch))
        if mb.weight:  # single forward: the rewards come from this (pre-update) forward
            mb.put(logp_prm_store, logp_prm.detach())
        if args.prm_loss == "ce":
            return prime.prm_ce_loss(logp_prm, mb.of(logp_ref), mb.of(mask), outcome[mb.rows], args.beta)
        return prime.prm_dpo_loss(logp_prm, mb.of(logp_ref), mb.of(mask), outcome[mb.rows], args.beta,
                                  args.n_samples)

    # both losses are means over responses; DPO's groups stay whole in a micro-batch
    plan = plan_update(batch, n_prm, args, d, unit=args.n_samples if args.prm_loss == "dpo" else 1)
    losses = run_update(prm, prm_opt, prm_loss_fn, lambda mb: len(mb.rows), plan, args, d, args.prm_grad_clip)
    if args.prm_update == "before":  # double forward: rewards from the updated PRM
        logp_prm_store = logprobs_no_grad(unwrap(prm), batch, args)
    return prime.implicit_process_reward(logp_prm_store, logp_ref, mask, 1.0), losses


def process_signal(args: Args, batch: Rollout, mask, responses, questions, outcome, logp_old, logp_ref,
                   n_train: int, prm, prm_opt, teacher, step_scorer, tokenizer, d: Dist, n_prm: int | None = None):
    """The raw process signal of --process, before any scaling: (signal (B, R), sequence score (B,)
    for the pairwise-accuracy diagnostic, step ids (B, R) or None, PRM losses).

        implicit  log pi_phi(y_t) - log pi_ref(y_t)                     (Eq. 3 without beta)
        opd       log pi_teacher(y_t) - log pi_student(y_t)             (PASS seed Eq. 5)
        gopd      lambda (l_T - l_B) - (l_student - l_B), B = the starting policy   (PASS v1 Eq. 5)
        step      each step's score broadcast over its tokens           (step_prm.py)
        none      zeros (outcome-only baselines)
    The student's log-probs are the old policy's (the sampler's). The sequence score is the signal's
    sum over tokens; for step scores it is their mean over steps (more steps should not score higher)."""
    step_ids, losses = None, []
    if args.process == "implicit":
        signal, losses = implicit_prm_step(prm, prm_opt, batch, logp_ref, mask, outcome, n_train, args, d,
                                           update=args.prm_online, n_prm=n_prm)
    elif args.process in ("opd", "gopd"):
        logp_teacher = logprobs_no_grad(teacher, batch, args)
        if args.process == "opd":
            signal = pass_advantage.opd_signal(logp_teacher, logp_old) * mask
        else:  # logp_ref holds the frozen starting policy here: G-OPD's base
            signal = pass_advantage.gopd_signal(logp_teacher, logp_ref, logp_old, args.gopd_lambda) * mask
    elif args.process == "step":
        step_scores, step_ids = step_prm.step_scores_and_ids(step_scorer, tokenizer, questions, responses,
                                                             batch.response_ids, batch.response_mask)
        step_scores, step_ids = step_scores.to(d.device), step_ids.to(d.device)
        signal = pass_advantage.broadcast_step_scores(step_scores, step_ids, mask)
        n_steps = (step_ids.max(-1).values + 1).clamp(min=1)
        return signal, step_scores.sum(-1) / n_steps, step_ids, losses
    else:
        signal = torch.zeros_like(mask)
    return signal, signal.sum(-1), step_ids, losses


def process_rewards(args: Args, signal, step_ids, mask):
    """Per-token process rewards r_t for the estimators' Eq. 5, from the raw signal.

    A step score is one reward per step, placed on the step's last token (a token-level signal is a
    reward on every token). Scaling, --process-norm: 'batch' (official) divides by the batch's largest
    |return-to-go|, for any source; 'beta' (paper Eq. 3) multiplies log-ratio signals by beta and
    leaves step scores, already in [0, 1], as they are."""
    if args.process == "step":
        signal = step_prm.step_end_rewards(signal, step_ids, mask)
    if args.process_norm == "batch":
        return prime.normalize_process_reward(signal, mask)
    return signal if args.process == "step" else args.beta * signal


def warmup_prm(args: Args, prm, prm_opt, sampler, reference, tokenizer, train_tasks, d: Dist) -> list[float]:
    """--prm-warmup-steps: train the implicit PRM on the STARTING policy's rollouts before RL.

    With --no-prm-online this is the offline PRM of the paper's Fig. 5: fit once on the SFT model's
    responses, then frozen while the policy moves away from them. Prompts come from steps -1, -2, ...
    of step_prompts, which RL never draws. Returns the PRM's pairwise accuracy on each batch, measured
    before that batch's update (as in the RL loop)."""
    accuracies = []
    for i in range(args.prm_warmup_steps):
        tasks = step_prompts(args, train_tasks, tokenizer, -1 - i, d)
        ro = sampler.generate([task.prompt_ids for task in tasks], n=args.n_samples)
        _, _, outcome = verify_rollouts(sampler, ro, tasks, args)
        rows, n_kept_groups, n_train, n_prm = filter_groups(outcome, ro, args)
        batch, outcome = ro.select(rows), outcome[rows].to(d.device)
        mask = batch.response_mask.to(d.device).float()
        logp_ref = logprobs_no_grad(reference, batch, args)
        log_ratio, _ = implicit_prm_step(prm, prm_opt, batch, logp_ref, mask, outcome, n_train, args, d,
                                         update=True, n_prm=n_prm)
        accuracies.append(all_reduce(pairwise_accuracy_sum(log_ratio.sum(-1), outcome, n_train, args), d))
    return [a / n if n else float("nan") for a, n in accuracies]  # NaN: a batch without a mixed group


# ---------------------------------------------------------------------------------------------------
# Checkpoints: written atomically, resumed exactly
# ---------------------------------------------------------------------------------------------------


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None:
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(run_dir: Path, step: int, policy, prm, policy_opt, prm_opt, d: Dist, critic=None,
                    critic_opt=None) -> None:
    """runs/<name>/checkpoint/: models, optimisers, step, and one RNG file per rank.

    Written to checkpoint.tmp, then renamed over the old one: a kill at any moment leaves either the
    old or the new checkpoint complete, never half of one."""
    tmp, final = run_dir / "checkpoint.tmp", run_dir / "checkpoint"
    if d.master:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier(d)
    torch.save(rng_state(), tmp / f"rng_rank{d.rank}.pt")
    if d.master:
        torch.save({"step": step, "policy": unwrap(policy).state_dict(), "policy_opt": policy_opt.state_dict(),
                    "prm": unwrap(prm).state_dict() if prm is not None else None,
                    "prm_opt": prm_opt.state_dict() if prm is not None else None,
                    "critic": unwrap(critic).state_dict() if critic is not None else None,
                    "critic_opt": critic_opt.state_dict() if critic is not None else None,
                    "world": d.world}, tmp / "state.pt")
    barrier(d)
    if d.master:
        old = run_dir / "checkpoint.old"
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    barrier(d)


def load_checkpoint(run_dir: Path, policy, prm, policy_opt, prm_opt, d: Dist, critic=None, critic_opt=None) -> int:
    path = run_dir / "checkpoint"
    if not (path / "state.pt").exists():
        raise SystemExit(f"--resume: no checkpoint in {path}")
    state = torch.load(path / "state.pt", map_location=d.device, weights_only=False)
    if state["world"] != d.world:
        raise SystemExit(f"--resume: checkpoint was written by {state['world']} ranks, this run has {d.world}")
    if (state["prm"] is None) != (prm is None):
        raise SystemExit("--resume: the checkpoint and this run disagree on --process (implicit PRM or not)")
    if (state.get("critic") is None) != (critic is None):
        raise SystemExit("--resume: the checkpoint and this run disagree on --estimator (a PPO critic or not)")
    unwrap(policy).load_state_dict(state["policy"])
    policy_opt.load_state_dict(state["policy_opt"])
    if prm is not None:
        unwrap(prm).load_state_dict(state["prm"])
        prm_opt.load_state_dict(state["prm_opt"])
    if critic is not None:
        unwrap(critic).load_state_dict(state["critic"])
        critic_opt.load_state_dict(state["critic_opt"])
    set_rng_state(torch.load(path / f"rng_rank{d.rank}.pt", weights_only=False))
    return state["step"]


def barrier(d: Dist) -> None:
    if d.world > 1:
        dist.barrier()


def truncate_metrics(path: Path, last_step: int) -> None:
    """On resume, drop metric lines written after the checkpoint (they will be redone)."""
    if path.exists():
        lines = [l for l in path.read_text().splitlines() if l.strip() and json.loads(l)["step"] <= last_step]
        write_atomic(path, "".join(l + "\n" for l in lines))


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------------
# Evaluation and plots
# ---------------------------------------------------------------------------------------------------


def heldout_accuracy(model, tokenizer, tasks: list[Task], args: Args, d: Dist, samples: int = 0) -> float:
    """Held-out accuracy, each rank scoring its share: greedy (samples = 0), or the mean reward of
    `samples` responses per problem at the training temperature and top-p.

    Where the model's mode is right and its slips live in the sampling distribution (the embedded
    noisy demonstrator: greedy ~0.9), the sampled accuracy is the one RL moves. Sampling draws from
    a forked RNG with a fixed seed: evaluating never shifts the training's random stream, and every
    evaluation of a run (and every run of a seed) uses the same random numbers."""
    mine, n = tasks[d.rank::d.world], max(samples, 1)
    correct = 0.0
    if mine:
        with torch.random.fork_rng(devices=[d.device] if d.device.type == "cuda" else []):
            torch.manual_seed(args.seed * 7919 + d.rank)
            sampler = HFRollout(unwrap(model), tokenizer, args.max_response_len, args.temperature, args.top_p)
            ro = sampler.generate([t.prompt_ids for t in mine], n=n, greedy=not samples)
        scores = verify.score_batch(sampler.decode(ro), [t.answer for t in mine for _ in range(n)],
                                    [t.kind for t in mine for _ in range(n)], math_grader=args.math_grader)
        correct = sum(s.reward for s in scores) / n
    total, count = all_reduce([correct, len(mine)], d)
    return total / max(count, 1)


def heldout_metrics(model, tokenizer, tasks: list[Task], args: Args, d: Dist) -> dict:
    """{"greedy": accuracy, "sampled": mean accuracy of --eval-samples responses per problem}."""
    return {"greedy": heldout_accuracy(model, tokenizer, tasks, args, d),
            "sampled": heldout_accuracy(model, tokenizer, tasks, args, d, args.eval_samples)}


def plot_curves(run_dir: Path, metrics: list[dict], summary: dict | None = None) -> None:
    """curves.png: training reward (with held-out sampled accuracy where measured), the PRM's pairwise
    accuracy, its localisation of the first wrong step, response length; per step and a 10-step mean."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [m["step"] for m in metrics]
    panels = (("reward", "outcome training reward"), ("prm_accuracy", "PRM pairwise accuracy (Fig. 5)"),
              ("prm_localization", "first wrong step = most blamed step"), ("response_length", "response length"))
    fig, axes = plt.subplots(1, len(panels), figsize=(18, 3.8))
    for ax, (key, title) in zip(axes, panels):
        values = [float("nan") if m.get(key) is None else m[key] for m in metrics]
        ax.plot(steps, values, alpha=0.35, label="per step")
        window = 10
        if len(values) >= window:
            smooth = [np.nanmean(values[i - window + 1:i + 1]) if not all(np.isnan(values[i - window + 1:i + 1]))
                      else float("nan") for i in range(window - 1, len(values))]
            ax.plot(steps[window - 1:], smooth, label=f"{window}-step mean")
        if key == "reward":  # the held-out sampled accuracy: start, every --eval-every, end
            held = [(m["step"], m["heldout_sampled_accuracy"]) for m in metrics if "heldout_sampled_accuracy" in m]
            if summary and "start_sampled_accuracy" in summary:
                held = [(0, summary["start_sampled_accuracy"])] + held
                if "end_sampled_accuracy" in summary:
                    held.append((steps[-1], summary["end_sampled_accuracy"]))
            if held:
                ax.plot(*zip(*held), "o-", color="k", label="held-out sampled accuracy")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = run_dir / "curves.tmp.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, run_dir / "curves.png")


# ---------------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------------


def main(argv=None):
    args = parse_args(argv)
    import transformers
    transformers.utils.logging.disable_progress_bar()  # one progress bar: the RL loop's
    d = setup_distributed()
    # Each rank must sample different responses for its prompts: seed + rank. (Same seed on every
    # rank would make the "8 GPUs" draw 8 copies of the same batch.)
    torch.manual_seed(args.seed + d.rank)
    random.seed(args.seed + d.rank)
    np.random.seed(args.seed + d.rank)
    if d.device.type == "cpu":
        # OMP_NUM_THREADS wins (e.g. 1 when several runs share a small machine), else the cores per rank
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or max(1, (os.cpu_count() or 1) // d.world)))

    run_name = args.run_name or time.strftime("run-%Y%m%d-%H%M%S")
    run_dir = Path(args.out_dir) / run_name
    if d.master:
        if run_dir.exists() and not args.resume and (run_dir / "metrics.jsonl").exists():
            raise SystemExit(f"{run_dir} already holds a run: pass --resume to continue it or choose another --run-name")
        run_dir.mkdir(parents=True, exist_ok=True)
    barrier(d)
    check_shared_storage(run_dir, "--out-dir", d)
    if not args.model:  # rank 0 builds the embedded SFT checkpoint there; every rank loads it
        check_shared_storage(Path(args.cache_dir), "--cache-dir", d)

    model_path, policy, tokenizer = load_model_and_tokenizer(args, d)
    train_tasks, eval_tasks = load_tasks(args, tokenizer)
    # a file mixing kinds (PRIME's data: math and code rows, `ability`) logs the reward of each kind
    kinds = sorted({t.kind for t in train_tasks})
    kinds = kinds if len(kinds) > 1 else []
    from transformers import AutoModelForCausalLM

    # The implicit PRM (trained) and its frozen reference; the G-OPD base (= the starting policy, so the
    # same frozen copy); the OPD/G-OPD teacher; the step scorer. Each is loaded only when used.
    prm = prm_opt = reference = teacher = step_scorer = critic = critic_opt = None
    if args.process == "implicit":
        prm = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(d.device).train()
    if args.estimator == "ppo":  # PPO's critic: the SFT backbone with a fresh scalar head
        from transformers import AutoModelForTokenClassification
        critic = AutoModelForTokenClassification.from_pretrained(model_path, num_labels=1, dtype=torch.float32)
        critic.to(d.device).train()
    if (args.process == "implicit" and args.reference == "sft") or args.process == "gopd":
        reference = load_frozen(model_path, d)
    if args.process in ("opd", "gopd"):
        # the embedded teacher: a longer SFT on a clean demonstrator (it never slips)
        teacher_path = args.teacher or embedded_checkpoint(args, args.teacher_sft_steps, d, "teacher: ", slip=0.0)
        teacher = load_teacher(teacher_path, tokenizer, d)
    if args.process == "step":
        step_scorer = step_prm.load_step_scorer(args.step_scorer, d.device, args.step_separator)
    policy.to(d.device).train()  # from_pretrained returns eval mode; checkpointing needs train mode
    if args.gradient_checkpointing:
        for m in (policy, prm, critic):  # non-reentrant checkpointing is the variant that works under DDP
            if m is not None:
                m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    policy = wrap_ddp(policy, d)
    policy_opt = torch.optim.AdamW(policy.parameters(), lr=args.policy_lr, weight_decay=args.policy_weight_decay)
    if prm is not None:
        prm = wrap_ddp(prm, d)
        prm_opt = torch.optim.AdamW(prm.parameters(), lr=args.prm_lr, weight_decay=0.0)
    if critic is not None:
        critic = wrap_ddp(critic, d)
        critic_opt = torch.optim.AdamW(critic.parameters(), lr=args.critic_lr, weight_decay=0.01)  # veRL's critic
    if args.rollout == "vllm":  # an engine in this process, fed the policy's weights after every update
        sampler = VLLMRollout(model_path, tokenizer, args.max_response_len, args.temperature, args.top_p,
                              max_model_len=args.max_prompt_len + args.max_response_len, seed=args.seed + d.rank,
                              dtype="bfloat16" if d.device.type == "cuda" else "float32",
                              gpu_memory_utilization=args.vllm_gpu_memory_utilization, sleep=args.vllm_sleep)
    else:
        sampler = HFRollout(unwrap(policy), tokenizer, args.max_response_len, args.temperature, args.top_p)

    start_step = 0
    if args.resume:
        start_step = load_checkpoint(run_dir, policy, prm, policy_opt, prm_opt, d, critic, critic_opt)
        sampler.push_weights(unwrap(policy))  # a vLLM engine loaded model_path, not the checkpoint
        if d.master:
            truncate_metrics(run_dir / "metrics.jsonl", start_step)
        print0(d, f"resumed {run_dir} at step {start_step}")
    if d.master:
        write_atomic(run_dir / "config.json", json.dumps({**dataclasses.asdict(args), "model_path": model_path,
                                                          "world_size": d.world}, indent=2))
    summary_path = run_dir / "summary.json"
    eval_seconds = 0.0  # every held-out evaluation of this launch: start, every --eval-every steps, end
    if args.resume and summary_path.exists():
        saved = json.loads(summary_path.read_text())
        start = {"greedy": saved["start_accuracy"], "sampled": saved["start_sampled_accuracy"]}
    else:
        t = time.time()
        start = heldout_metrics(policy, tokenizer, eval_tasks, args, d)
        eval_seconds += time.time() - t
        if d.master:
            write_atomic(summary_path, json.dumps({"start_accuracy": start["greedy"],
                                                   "start_sampled_accuracy": start["sampled"]}, indent=2))
    print0(d, f"held-out accuracy of the starting checkpoint: greedy {start['greedy']:.3f}, sampled "
              f"{start['sampled']:.3f} ({len(eval_tasks)} problems x {args.eval_samples} at T={args.temperature})")
    if args.prm_warmup_steps and not args.resume:  # an offline PRM: fit on the starting policy's rollouts
        warmup = warmup_prm(args, prm, prm_opt, sampler, reference if reference is not None else unwrap(policy),
                            tokenizer, train_tasks, d)
        print0(d, f"PRM warmup ({args.prm_warmup_steps} batches of the starting policy's rollouts): pairwise "
                  f"accuracy before each update, first 5 {np.nanmean(warmup[:5]):.2f}, last 5 {np.nanmean(warmup[-5:]):.2f}")

    from tqdm import tqdm
    wall_start = time.time()
    phase_totals = {"rollout": 0.0, "verify": 0.0, "prm": 0.0, "policy": 0.0, "eval": 0.0, "other": 0.0}
    bar = tqdm(range(start_step, args.steps), initial=start_step, total=args.steps, disable=not d.master,
               desc=run_label(args), dynamic_ncols=True)
    for step in bar:
        t_step = time.time()
        times = {}

        # 1. Sample K responses for each prompt (whole groups on this rank) -----------------------
        t = time.time()
        tasks = step_prompts(args, train_tasks, tokenizer, step, d)
        ro = sampler.generate([task.prompt_ids for task in tasks], n=args.n_samples)
        times["rollout"] = time.time() - t

        # 2. Verify: outcome reward r_o in [0, 1] ------------------------------------------------
        t = time.time()
        texts, scores, outcome = verify_rollouts(sampler, ro, tasks, args)
        times["verify"] = time.time() - t

        # 3. Online prompt filter: keep groups with low <= mean accuracy <= high ------------------
        rows, n_kept_groups, n_train, n_prm = filter_groups(outcome, ro, args)
        batch, batch_outcome = ro.select(rows), outcome[rows].to(d.device)
        mask = batch.response_mask.to(d.device).float()

        # old log-probs and reference log-probs: no gradient, recomputed by the training models
        t = time.time()
        logp_old = logprobs_no_grad(unwrap(policy), batch, args, args.temperature)
        if reference is not None:
            logp_ref = logprobs_no_grad(reference, batch, args)
        else:  # App. B.1: the rollout policy is the reference
            logp_ref = logp_old
        times["policy"] = time.time() - t

        # 4. Process signal: the implicit PRM's rewards (Eq. 3) and its CE update, or another source
        t = time.time()
        questions = [tasks[i // args.n_samples].text for i in rows.tolist()]
        signal, sequence_score, step_ids, prm_losses = process_signal(
            args, batch, mask, [texts[i] for i in rows.tolist()], questions, batch_outcome, logp_old, logp_ref, n_train,
            prm, prm_opt, teacher, step_scorer, tokenizer, d, n_prm=n_prm)
        prm_accuracy_sum = pairwise_accuracy_sum(sequence_score, batch_outcome, n_train, args)
        # Does the process signal blame the first wrong step? (embedded task: the exact checker knows it)
        step_ids_toy, first_wrong = toy_steps(args, batch, [texts[i] for i in rows.tolist()], questions, tokenizer)
        localization = (0, 0)
        if first_wrong is not None and args.process != "none":
            step_ids_toy, first_wrong = step_ids_toy.to(d.device), first_wrong.to(d.device)
            wrong = (batch_outcome < 1) & (torch.arange(len(batch), device=d.device) < n_train)
            localization = step_prm.step_localization(signal, step_ids_toy, torch.where(wrong, first_wrong, -1))
        times["prm"] = time.time() - t

        # 5. Advantages -------------------------------------------------------------------------
        process = process_rewards(args, signal, step_ids, mask)  # (B, R) per-token rewards for Eq. 5
        process_in = process if args.process != "none" else None
        if args.estimator == "rloo":
            adv = prime.rloo_advantage(process_in, batch_outcome, mask, args.n_samples, args.gamma, args.rloo_form)
        elif args.estimator == "grpo":
            adv = prime.grpo_advantage(process_in, batch_outcome, mask, args.n_samples, args.gamma)
        elif args.estimator == "reinforce":
            adv = prime.reinforce_advantage(process_in, batch_outcome, mask, args.gamma)
        elif args.estimator == "prm-value":
            adv = prime.prm_value_advantage(args.beta * signal, batch_outcome, mask, args.gamma)
        elif args.estimator == "ppo":  # a learned critic: GAE over outcome (+ process) token rewards
            old_values = values_no_grad(unwrap(critic), batch, args)
            adv, returns = prime.gae_advantage(prime.token_rewards(process_in, batch_outcome, mask), old_values,
                                               mask, args.gamma, args.gae_lambda)
        else:  # PASS: the raw process signal shaped into GRPO's advantage (pass_advantage.py)
            fmt = torch.tensor([scores[i].format for i in rows.tolist()], dtype=torch.float32, device=d.device)
            group_ids = torch.arange(len(batch), device=d.device) // args.n_samples
            preset = pass_advantage.PRESETS[args.pass_preset]
            if args.pass_preset == "v1":
                preset = dict(preset, step_ids=step_ids)
            pass_in = args.beta * signal if args.process == "implicit" else signal
            adv = pass_advantage.pass_advantage(pass_in, mask, batch_outcome, fmt, group_ids, **preset)
        if args.estimator in ("rloo", "reinforce", "prm-value", "ppo"):
            adv = prime.whiten(adv, mask)  # official: global whitening of every advantage

        # 6. PPO clip update of the policy (Eq. 6) -----------------------------------------------
        t = time.time()

        def policy_loss_fn(mb: MicroBatch):
            logp = response_logprobs(policy, mb.rollout(batch), args.temperature)
            return prime.ppo_clip_loss(logp, mb.of(logp_old), mb.of(adv), mb.of(mask), args.clip_eps,
                                       args.dual_clip or None)

        plan = plan_update(batch, n_train, args, d)  # the same micro-batches for the policy and the critic
        n_tokens = lambda mb: float(mb.of(mask).sum())  # both losses are token means
        policy_losses = []
        if step >= args.critic_warmup_steps:  # (PPO: frozen while the critic warms up)
            policy_losses = run_update(policy, policy_opt, policy_loss_fn, n_tokens, plan, args, d,
                                       args.policy_grad_clip)
            sampler.push_weights(unwrap(policy))
        value_losses = []
        if critic is not None:  # PPO's critic regresses on the GAE returns (clipped value loss)
            def value_loss_fn(mb: MicroBatch):
                return prime.value_loss(critic_values(critic, mb.rollout(batch)), mb.of(old_values), mb.of(returns),
                                        mb.of(mask), args.value_clip or None)

            value_losses = run_update(critic, critic_opt, value_loss_fn, n_tokens, plan, args, d,
                                      args.policy_grad_clip)  # veRL clips the critic at 1.0 too
        times["policy"] += time.time() - t  # (the critic's forward and update count here too)

        # 7. Log and checkpoint ----------------------------------------------------------------
        row_kinds = [task.kind for task in tasks for _ in range(args.n_samples)]
        by_kind = [x for k in kinds for x in (sum(s.reward for s, rk in zip(scores, row_kinds) if rk == k),
                                              row_kinds.count(k))]
        sums = all_reduce([outcome.sum().item(), len(outcome), n_kept_groups, len(tasks),
                           ro.response_mask.sum().item(), float(ro.truncated.sum()),
                           sum(s.format for s in scores), *prm_accuracy_sum, *localization,
                           int(mixed_groups(outcome, args.n_samples).sum()), *by_kind], d)
        by_kind = sums[12:]  # [reward sum, responses] of each kind, summed over ranks
        mean = lambda losses: float(np.mean(losses)) if losses else 0.0  # run_update's are global already
        kept_per_rank = all_reduce([n_kept_groups if r == d.rank else 0 for r in range(d.world)], d)
        metrics = {
            "step": step + 1,
            "reward": sums[0] / sums[1],
            "kept_groups": int(sums[2]), "prompts": int(sums[3]),
            "kept_groups_per_rank": [int(k) for k in kept_per_rank],
            "response_length": sums[4] / sums[1],
            "truncated_fraction": sums[5] / sums[1],
            "format": sums[6] / sums[1],
            "mixed_groups": int(sums[11]),  # of all sampled groups: some responses right, some wrong
            "prm_accuracy": sums[7] / sums[8] if sums[8] and args.process != "none" else None,  # mixed kept groups
            "prm_loss": mean(prm_losses),
            "policy_loss": mean(policy_losses),
            "process_reward_abs_mean": prime.masked_mean(process.abs(), mask).item(),
            "prm_localization": sums[9] / sums[10] if sums[10] else None,  # share of wrong responses
        }
        if critic is not None:
            metrics["value_loss"] = mean(value_losses)
        for j, k in enumerate(kinds):  # e.g. reward_math, reward_code; None on a step without that kind
            metrics[f"reward_{k}"] = by_kind[2 * j] / by_kind[2 * j + 1] if by_kind[2 * j + 1] else None
        t = time.time()
        if args.eval_every and (step + 1) % args.eval_every == 0 and step + 1 < args.steps:
            held = heldout_metrics(policy, tokenizer, eval_tasks, args, d)
            metrics["heldout_accuracy"], metrics["heldout_sampled_accuracy"] = held["greedy"], held["sampled"]
        times["eval"] = time.time() - t
        eval_seconds += times["eval"]
        times["other"] = (time.time() - t_step) - sum(times.values())  # filter, advantages, metrics
        if d.master:
            with open(run_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps({**metrics, "time": times}) + "\n")
                f.flush()
            reward = args.beta * signal if args.process == "implicit" else signal  # Eq. 3's r_phi per token
            write_episodes(run_dir, step + 1, batch, texts, rows, n_train, batch_outcome, process, reward,
                           step_ids_toy, first_wrong, tokenizer, args)
            bar.set_postfix(reward=f"{metrics['reward']:.3f}", prm_acc=_fmt(metrics["prm_accuracy"]),
                            kept=f"{metrics['kept_groups']}/{metrics['prompts']}")
        if (step + 1) % args.save_every == 0 or step + 1 == args.steps:
            save_checkpoint(run_dir, step + 1, policy, prm, policy_opt, prm_opt, d, critic, critic_opt)
        if step == start_step and d.device.type == "cuda":  # the up-front estimate against the first step
            print0(d, memory_line(unwrap(policy), args, torch.cuda.max_memory_allocated(d.device) / 1e9))
        for k in phase_totals:
            phase_totals[k] += times[k]
        phase_totals["other"] += (time.time() - t_step) - sum(times.values())  # + writing, checkpoint

    # End: held-out accuracy of the final policy, curves, summary, final checkpoint -------------
    t = time.time()
    end = heldout_metrics(policy, tokenizer, eval_tasks, args, d)
    eval_seconds += time.time() - t
    if d.master:
        metrics = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines() if l.strip()]
        toy_task.save_pretrained_atomic(unwrap(policy), tokenizer, run_dir / "final")
        n_steps = max(args.steps - start_step, 1)
        summary = {"start_accuracy": start["greedy"], "end_accuracy": end["greedy"],
                   "start_sampled_accuracy": start["sampled"], "end_sampled_accuracy": end["sampled"],
                   "steps": args.steps,
                   "eval_problems": len(eval_tasks), "wall_seconds": time.time() - wall_start,
                   "step_seconds": {k: v / n_steps for k, v in phase_totals.items()},
                   "eval_seconds": eval_seconds,
                   "final_reward_10": float(np.mean([m["reward"] for m in metrics[-10:]])),
                   "final_prm_accuracy_10": _nanmean([m["prm_accuracy"] for m in metrics[-10:]]),
                   "final_prm_localization_10": _nanmean([m.get("prm_localization") for m in metrics[-10:]])}
        write_atomic(summary_path, json.dumps(summary, indent=2))
        plot_curves(run_dir, metrics, summary)
        if not args.data:  # the episode picture: which tokens the process signal blamed
            import eval as evaluation
            evaluation.plot_episodes(run_dir)
        split = ", ".join(f"{k} {v:.2f}s" for k, v in summary["step_seconds"].items())
        print0(d, f"\nheld-out accuracy ({len(eval_tasks)} problems): greedy {start['greedy']:.3f} -> "
                  f"{end['greedy']:.3f}; sampled ({args.eval_samples} per problem) {start['sampled']:.3f} -> "
                  f"{end['sampled']:.3f}")
        print0(d, f"training reward (last 10 steps): {summary['final_reward_10']:.3f}; "
                  f"PRM pairwise accuracy (last 10): {_fmt(summary['final_prm_accuracy_10'])}; "
                  f"localisation (last 10): {_fmt(summary['final_prm_localization_10'])}")
        print0(d, f"time per step: {split}; wall {summary['wall_seconds']:.0f}s")
        print0(d, f"run folder: {run_dir} (metrics.jsonl, episodes.jsonl, curves.png, final/, summary.json)")
    if args.rollout == "vllm":
        sampler.close()  # vLLM's shutdown destroys its process groups, the default one included
    elif d.world > 1:
        dist.destroy_process_group()
    return run_dir


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _nanmean(values) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None



def run_label(args: Args) -> str:
    """What runs, for the progress bar: 'PRIME' only for RLOO with the online implicit PRM."""
    if args.estimator == "rloo" and args.process == "implicit" and args.prm_online:
        return "PRIME"
    source = {"implicit": "implicit PRM" + ("" if args.prm_online else " (offline)"), "none": "outcome only",
              "opd": "OPD", "gopd": "G-OPD", "step": "step PRM"}[args.process]
    return f"{args.estimator.upper() if args.estimator != 'prm-value' else 'PRM-value'} + {source}"


def toy_steps(args: Args, batch: Rollout, responses: list[str], questions: list[str], tokenizer):
    """Embedded task only: the step of each response token (B, R) and the first step the exact
    checker marks wrong (B,), -1 if none; (None, None) for --data."""
    if args.data:
        return None, None
    scores, step_ids = step_prm.step_scores_and_ids(step_prm.ToyStepChecker(), tokenizer, questions, responses,
                                                    batch.response_ids, batch.response_mask)
    return step_ids, step_prm.first_wrong_steps(scores, step_ids)


def write_episodes(run_dir, step, batch, texts, rows, n_train, outcome, process, reward, step_ids, first_wrong,
                   tokenizer, args) -> None:
    """A few responses per step with their per-token rewards: the most instructive artifact of a
    PRIME run (which tokens did the PRM credit or blame?). One wrong and one right response first,
    when the step trained on both; `reward` is Eq. 3's r_phi (or the raw signal of --process),
    `process_reward` what the estimator received (after --process-norm)."""
    real = list(range(max(n_train, 0)))
    wrong = [i for i in real if outcome[i] < 1][:1]
    right = [i for i in real if outcome[i] >= 1][:1]
    picks = (wrong + right + [i for i in real if i not in wrong + right])[:args.episodes_per_step]
    with open(run_dir / "episodes.jsonl", "a") as f:
        for i in picks:
            n = int(batch.response_mask[i].sum())
            tokens = tokenizer.convert_ids_to_tokens(batch.response_ids[i, :n].tolist())
            episode = {"step": step, "outcome": outcome[i].item(), "response": texts[int(rows[i])],
                       "tokens": tokens, "process_reward": [round(x, 5) for x in process[i, :n].tolist()],
                       "reward": [round(x, 5) for x in reward[i, :n].tolist()]}
            if step_ids is not None:
                episode["step_ids"] = step_ids[i, :n].tolist()
                episode["first_wrong_step"] = int(first_wrong[i])
            f.write(json.dumps(episode) + "\n")


if __name__ == "__main__":
    main()
