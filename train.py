"""PRIME: online RL with implicit process rewards, one loop, top to bottom like the paper's Algorithm 1.

    python train.py                                   # embedded default: tiny model, toy task, CPU
    python train.py --steps 5 --run-name smoke        # a shorter run
    torchrun --nproc_per_node=8 train.py --model PATH --data train.parquet --preset 1.5b
    torchrun --nnodes=2 --nproc_per_node=8 --node_rank=R --master_addr=HOST --master_port=29500 \\
        train.py --model PATH --data train.parquet    # when one node is no longer enough

Each iteration (paper Algorithm 1; official code `ray_trainer.py`):
    1. sample n_samples responses for each prompt                      (rollout.py)       Alg. 1 lines 3-4
    2. verify them -> outcome r_o in [0, 1]                            (verify.py)        line 5
    3. filter prompt groups by mean accuracy in [low, high]            (prime.keep_groups) line 6
    4. implicit PRM forward (Eq. 3) and its cross-entropy update       (prime.implicit_process_reward,
       (or another process signal, --process: a teacher, a step PRM)    prime.prm_ce_loss) lines 7-8
    5. advantages: RLOO over outcome and process rewards, whitened    (prime.rloo_advantage) line 9
    6. PPO clip update of the policy (Eq. 6)                           (prime.ppo_clip_loss) lines 10-11
    7. log, checkpoint                                                 (runlog.py)

This file holds the loop and its steps; the plumbing: config, ddp, models, memory, microbatch, runlog, eval.

Simplifications relative to the paper's setup (each one a choice a reader should know about):
    1. Plain DDP on one process per GPU; no FSDP/ZeRO, so a model must fit with its gradients and
       AdamW states (fp32) on one GPU, twice (policy and PRM; --offload-optimizer keeps the moments in
       CPU memory between updates). An estimate is printed up front.
    2. By default (--filter-mode shrink) the filter trains on what survives from a fixed number of
       sampled prompts; --filter-mode refill (the presets) samples more until the batch is full, as
       the official code. Ranks keep different numbers of groups; the shorter ranks run zero-weight
       micro-batches so DDP's collectives line up.
    3. One PPO epoch, no entropy bonus and no KL term (as the paper's run; --kl-coef adds PASS's).
    4. Generation: `--rollout vllm` (the default where vLLM and a GPU are present) runs a vLLM engine
       inside each rank, fed the policy's weights after every update; `--rollout hf` samples with HF
       `generate` on the policy itself. The held-out evaluation samples with the same sampler.
    5. Each optimizer step minimises the token mean over its whole mini-batch, all ranks and micro-
       batches (--loss-mean global), so the split changes nothing; the official code averaged the
       micro-batch means (--loss-mean micro, what the paper's runs did).
"""

import sys
if __name__ == "__main__" and {"-h", "--help"} & set(sys.argv[1:]):  # --help answers before torch and the models load
    __import__("config").parse_args(sys.argv[1:], __doc__)
import dataclasses
import gc
import os
import random
import time
from dataclasses import dataclass

import numpy as np
import torch
import transformers
from tqdm import tqdm

import eval as evaluation
import pass_advantage
import plots
import prime
import runlog
import sandbox
import step_prm
import toy_task
import verify
from config import Args, parse_args
from data import Task, load_tasks
from ddp import Dist, all_reduce, barrier, close, print0, setup_distributed, unwrap
from microbatch import (MicroBatch, critic_values, logprobs_no_grad, needs_old_logprobs, plan_update, response_logprobs,
                        run_update, values_no_grad)
from memory import measured_memory, memory_line
from models import Models, build_models, lora_targets, make_sampler
from rollout import Rollout, concat_rollouts
from runlog import timed

# ---------------------------------------------------------------------------------------------------
# Steps 1-3: sample, verify, filter
# ---------------------------------------------------------------------------------------------------


def step_prompts(args: Args, train_tasks: list[Task], tokenizer, step: int, dist: Dist, draw: int = 0) -> list[Task]:
    """This rank's prompts for iteration `step` (and its `draw`-th refill, --filter-mode refill): a
    deterministic function of (seed, step, draw), so a resumed run continues with exactly the prompts
    it would have seen. Rank r takes every world-th prompt of the global list; whole groups stay on
    one rank."""
    if args.prompts_per_step % dist.world:
        raise SystemExit(f"--prompts-per-step {args.prompts_per_step} is not divisible by the "
                         f"world size {dist.world}")
    if not args.data:
        seed = args.seed * 1_000_003 + step if not draw else f"{args.seed}/{step}/{draw}"
        problems = toy_task.make_problems(args.prompts_per_step, seed, *toy_task.parse_ops(args.toy_ops))
        tasks = [Task(tokenizer(p.prompt)["input_ids"], p.answer, "math", p.prompt) for p in problems]
    elif draw:  # a refill: fresh rows of the file, drawn for (seed, step, draw)
        rows = random.Random(f"{args.seed}/{step}/{draw}").sample(range(len(train_tasks)),
                                                                    min(args.prompts_per_step, len(train_tasks)))
        tasks = [train_tasks[i] for i in rows]
    else:
        epoch, offset = divmod(step * args.prompts_per_step, len(train_tasks))
        order = list(range(len(train_tasks)))
        random.Random(args.seed + epoch).shuffle(order)
        order = order + order  # wrap around the epoch boundary
        tasks = [train_tasks[i] for i in order[offset:offset + args.prompts_per_step]]
    return tasks[dist.rank::dist.world]


def verify_rollouts(sampler, rollout: Rollout, tasks: list[Task], args: Args):
    """(decoded texts, verify.Score per response, outcome r_o as a (B,) float tensor)."""
    texts = sampler.decode(rollout)
    each = lambda field: [getattr(task, field) for task in tasks for _ in range(args.n_samples)]  # noqa: E731
    scores = verify.score_batch(texts, each("answer"), each("kind"), questions=each("text"), math_grader=args.math_grader)
    return texts, scores, torch.tensor([s.reward for s in scores], dtype=torch.float32)


def filter_groups(outcome, rollout: Rollout, args: Args, cap: int | None = None):
    """Sec. 3.4's online filter: (rows to train on, kept groups, rows that carry gradient, rows the
    implicit PRM learns from).

    Keeps whole groups with low <= mean accuracy <= high (and, with --filter-truncated, none of its
    responses cut at max_response_len), the first `cap` of them in sampling order if given (a refilled
    step: the surplus is dropped). When nothing is kept, the first group stays as a placeholder
    (with zero rows of gradient) so that this rank can still run zero-weight passes under DDP.
    With --prm-groups mixed the kept groups are reordered, mixed ones (some right, some wrong) first,
    and the PRM learns from those rows only: a group whose labels are all equal teaches it no
    contrast, only to shift every reward of the group (with the filter off, mostly down)."""
    keep = prime.keep_groups(outcome, args.n_samples, args.filter_low, args.filter_high)
    if args.filter_truncated:
        keep &= ~rollout.truncated.view(-1, args.n_samples).any(-1)
    groups = keep.nonzero().squeeze(-1)[:cap]
    n_prm_groups = len(groups)
    if args.prm_groups == "mixed":
        mixed = prime.mixed_groups(outcome, args.n_samples)[groups]
        groups = torch.cat([groups[mixed], groups[~mixed]])  # stable: mixed first, each part in order
        n_prm_groups = int(mixed.sum())
    rows = (groups[:, None] * args.n_samples + torch.arange(args.n_samples)).reshape(-1)
    n_kept_groups, n_train = len(groups), len(rows)
    if n_kept_groups == 0:
        rows = torch.arange(args.n_samples)
    return rows, n_kept_groups, n_train, n_prm_groups * args.n_samples


def refill(args: Args, sampler, train_tasks: list[Task], tokenizer, step: int, dist: Dist, sampled: tuple, times: dict):
    """--filter-mode refill, as the official code fills its batch: while the filter keeps fewer than
    this rank's share of --prompts-per-step groups, sample and verify that many fresh prompts more,
    at most --refill-draws times. `sampled` = (tasks, rollout, texts, scores, outcome) of the step so
    far; returns the same for every group sampled, in order, and the number of extra draws."""
    (tasks, rollout, texts, scores, outcome), draws = sampled, 0
    while draws < args.refill_draws and filter_groups(outcome, rollout, args)[1] < args.prompts_per_step // dist.world:
        draws += 1
        with timed(times, "rollout"):
            more = step_prompts(args, train_tasks, tokenizer, step, dist, draw=draws)
            more_rollout = sampler.generate([task.prompt_ids for task in more], n=args.n_samples)
        with timed(times, "verify"):
            more_texts, more_scores, more_outcome = verify_rollouts(sampler, more_rollout, more, args)
        rollout = concat_rollouts([rollout, more_rollout], tokenizer.pad_token_id)
        tasks, texts = tasks + more, texts + more_texts
        scores, outcome = scores + more_scores, torch.cat([outcome, more_outcome])
    return tasks, rollout, texts, scores, outcome, draws


@dataclass
class Batch:
    """What steps 4-6 train on: the kept groups of one iteration, on the device."""
    rollout: Rollout                # the kept rows (a placeholder group when nothing was kept)
    outcome: torch.Tensor      # (B,) r_o
    mask: torch.Tensor         # (B, R) float, 1 on response tokens
    rows: torch.Tensor         # their rows in the iteration's rollout
    texts: list[str]           # their decoded responses
    questions: list[str]       # their prompts' text
    n_train: int               # rows that carry gradient (0 when nothing was kept)
    n_prm: int                 # rows the implicit PRM learns from (the first n_prm)
    plan: list = None          # the policy update's micro-batches (microbatch.plan_update; with_plans)
    prm_plan: list = None      # the PRM update's: its rows; DPO's groups stay whole
    health: dict = dataclasses.field(default_factory=dict)  # what the updates saw: sums, gradient norms

    @property
    def train_mask(self) -> torch.Tensor:
        """(B, R) the mask of the rows that carry gradient: what the batch statistics (whitening, the
        process-reward normaliser, the metrics) are taken over; a placeholder group counts nowhere."""
        return self.mask * (torch.arange(len(self.mask), device=self.mask.device) < self.n_train)[:, None]


def kept_batch(rollout: Rollout, outcome, texts: list[str], tasks: list[Task], args: Args, dist: Dist):
    """(Batch of the groups filter_groups keeps, number of kept groups); a refilled step keeps this
    rank's share of --prompts-per-step at most."""
    cap = args.prompts_per_step // dist.world if args.filter_mode == "refill" else None
    rows, n_kept_groups, n_train, n_prm = filter_groups(outcome, rollout, args, cap)
    kept = rollout.select(rows)
    return with_plans(Batch(kept, outcome[rows].to(dist.device), kept.response_mask.to(dist.device).float(), rows,
                            [texts[i] for i in rows.tolist()], [tasks[i // args.n_samples].text for i in rows.tolist()],
                            n_train, n_prm), args, dist), n_kept_groups


def with_plans(batch: Batch, args: Args, dist: Dist) -> Batch:
    """`batch` with its updates' micro-batches, planned once a step; the no-grad pass paired with an update
    (pi_old with the policy's, the reference with the PRM's) runs in the same ones, for the same numbers."""
    prm_plan = plan_update(batch.rollout, batch.n_prm, args, dist, unit=args.n_samples if args.prm_loss == "dpo" else 1) \
        if args.process in ("implicit", "gopd") else None  # the PRM's update, or G-OPD's base pass
    return dataclasses.replace(batch, plan=plan_update(batch.rollout, batch.n_train, args, dist), prm_plan=prm_plan)


# ---------------------------------------------------------------------------------------------------
# Step 4: process signals. PRIME's implicit PRM (Eq. 3 + its CE update), a teacher (OPD, G-OPD), a step PRM
# ---------------------------------------------------------------------------------------------------


RAW = 1.0  # Eq. 3's beta, passed as 1 (the raw log-ratio): process_rewards scales it later, by beta (the paper) or
# by the batch's largest return (the official code, where beta has no effect); the PRM's loss takes beta itself


def implicit_prm_step(prm, prm_opt, batch: Batch, logp_ref, args: Args, dist: Dist, update: bool = True):
    """Implicit process rewards log(pi_phi / pi_ref) per token (B, R), and the PRM's CE (or DPO) update.

    Single forward (--prm-update after, the paper run): the rewards come from the same forward pass
    as the PRM loss, before its optimizer step. Double forward (before): update first, then a fresh
    forward with the updated PRM. With update=False (an offline, frozen PRM) only the forward runs.
    The PRM learns from the first batch.n_prm rows (fewer than n_train with --prm-groups mixed); the
    rest of the n_train rows get their rewards from a gradient-free forward of the same PRM."""
    mask = batch.mask
    if not update:
        return prime.implicit_process_reward(logprobs_no_grad(unwrap(prm), batch.rollout, args), logp_ref, mask, RAW), []
    logp_prm_store = torch.zeros_like(mask)
    if batch.n_prm < batch.n_train:  # rows the PRM does not learn from: rewards from the pre-update PRM too
        rest = slice(batch.n_prm, batch.n_train)
        logp_prm_store[rest] = logprobs_no_grad(unwrap(prm), batch.rollout.select(rest), args)

    def prm_loss_fn(mb: MicroBatch):
        logp_prm = response_logprobs(prm, mb.rollout(batch.rollout))
        if mb.weight:  # single forward: the rewards come from this (pre-update) forward
            mb.put(logp_prm_store, logp_prm.detach())
        if args.prm_loss == "ce":  # Alg. 1 line 8
            return prime.prm_ce_loss(logp_prm, mb.rows_of(logp_ref), mb.rows_of(mask), batch.outcome[mb.rows], args.beta)
        return prime.prm_dpo_loss(logp_prm, mb.rows_of(logp_ref), mb.rows_of(mask), batch.outcome[mb.rows], args.beta,
                                  args.n_samples)

    losses = run_update(prm, prm_opt, prm_loss_fn, lambda mb: len(mb.rows), batch.prm_plan, args, dist, args.prm_grad_clip,
                        batch.health.setdefault("prm_grad_norms", []))
    if args.prm_update == "before":  # double forward: rewards from the updated PRM
        logp_prm_store = logprobs_no_grad(unwrap(prm), batch.rollout, args)
    return prime.implicit_process_reward(logp_prm_store, logp_ref, mask, RAW), losses


def reference_logprobs(args: Args, models: Models, batch: Batch, logp_old):
    """Eq. 3's log pi_ref per token (B, R), at temperature 1 as the PRM's own, in the PRM update's
    micro-batches: the frozen SFT model, or with --reference policy the rollout policy (App. B.1).

    Eq. 3 compares two language models at one temperature. pi_old's log-probs at the sampling
    temperature T (what PPO's ratio needs) would make the reward at step 1 log pi(y) - log pi_T(y),
    not 0, whenever T != 1: so at T != 1 the policy's own pass at 1 is the reference. The official
    code reuses `old_log_probs`, which its actor takes at the rollout temperature (dp_prime.py): the
    same only at T = 1, the paper's setting."""
    if models.reference is not None:
        return logprobs_no_grad(models.reference, batch.rollout, args, plan=batch.prm_plan)
    if args.process != "implicit" or args.temperature == 1.0:
        return logp_old
    return logprobs_no_grad(unwrap(models.policy), batch.rollout, args, plan=batch.prm_plan)


def process_signal(args: Args, models: Models, batch: Batch, logp_old, logp_ref, dist: Dist, step: int):
    """The raw process signal of --process at iteration `step`, before any scaling: (signal (B, R),
    sequence score (B,) for the pairwise-accuracy diagnostic, step ids (B, R) or None, PRM losses).

        implicit  log pi_phi(y_t) - log pi_ref(y_t)                     (Eq. 3 without beta)
        opd       log pi_teacher(y_t) - log pi_student(y_t)             (PASS Eq. 5)
        gopd      lambda (l_T - l_B) - (l_student - l_B), B = the starting policy   (PASS v1 Eq. 5)
        step      each step's score broadcast over its tokens           (step_prm.py)
        none      zeros (outcome-only baselines)
    The student's log-probs are the old policy's, at temperature 1 like the teacher's and the base's:
    a log-ratio of two models at two temperatures is not OPD's (the official OPD and G-OPD code compares
    them with the student's rollout log-probs at the sampling temperature: the same only at T = 1).
    The sequence score is the signal's sum over tokens; for step scores it is their mean over steps
    (more steps should not score higher)."""
    step_ids, losses, mask = None, [], batch.mask
    if args.process == "implicit":
        online = args.prm_online and not (args.prm_freeze_step and step >= args.prm_freeze_step)
        signal, losses = implicit_prm_step(models.prm, models.prm_opt, batch, logp_ref, args, dist, update=online)
    elif args.process in ("opd", "gopd"):
        logp_teacher = logprobs_no_grad(models.teacher, batch.rollout, args)
        logp_student = logp_old if args.temperature == 1.0 else logprobs_no_grad(unwrap(models.policy), batch.rollout, args)
        if args.process == "opd":
            signal = pass_advantage.opd_signal(logp_teacher, logp_student) * mask
        else:  # logp_ref holds the frozen starting policy here: G-OPD's base
            signal = pass_advantage.gopd_signal(logp_teacher, logp_ref, logp_student, args.gopd_lambda) * mask
    elif args.process == "step":
        ids, response_mask = batch.rollout.response_ids, batch.rollout.response_mask
        step_scores, step_ids = step_prm.step_scores_and_ids(models.step_scorer, models.tokenizer, batch.questions,
                                                             batch.texts, ids, response_mask)
        if args.step_noise:  # the credit study's noisy checker, as noisy as a learned PRM; a draw per (seed, step, rank)
            step_scores = step_prm.add_step_noise(step_scores, step_ids, args.step_noise,
                                                  (args.seed * 1_000_003 + step) * 1024 + dist.rank)
        step_scores, step_ids = step_scores.to(dist.device), step_ids.to(dist.device)
        signal = pass_advantage.broadcast_step_scores(step_scores, step_ids, mask)
        n_steps = (step_ids.max(-1).values + 1).clamp(min=1)
        return signal, step_scores.sum(-1) / n_steps, step_ids, losses
    else:
        signal = torch.zeros_like(mask)
    return signal, signal.sum(-1), step_ids, losses


def process_rewards(args: Args, signal, step_ids, mask, outcome, dist: Dist):
    """Per-token process rewards r_t for the estimators' Eq. 5, from the raw signal.

    A step score is one reward per step, placed on the step's last token (a token-level signal is a
    reward on every token). With --process-groups mixed, only the groups whose outcomes differ keep
    theirs (0 elsewhere, before scaling). Scaling, --process-norm: 'batch' (official) divides by the
    batch's largest |return-to-go| (all ranks': the whole batch's), for any source; 'beta' (paper
    Eq. 3) multiplies log-ratio signals by beta and leaves step scores, already in [0, 1], as they are."""
    if args.process == "step":
        signal = step_prm.step_end_rewards(signal, step_ids, mask)
    if args.process_groups == "mixed":
        signal = signal * prime.mixed_groups(outcome, args.n_samples).repeat_interleave(args.n_samples)[:, None]
    if args.process_norm == "batch":
        return prime.normalize_process_reward(signal, mask, max_over_ranks=dist.max)
    return signal if args.process == "step" else args.beta * signal


def warmup_prm(args: Args, models: Models, sampler, train_tasks, dist: Dist) -> list[float]:
    """--prm-warmup-steps: train the implicit PRM on the STARTING policy's rollouts before RL.

    With --no-prm-online this is the offline PRM of the paper's Fig. 5: fit once on the SFT model's
    responses, then frozen while the policy moves away from them. Prompts come from steps -1, -2, ...
    of step_prompts, which RL never draws. Returns the PRM's pairwise accuracy on each batch, measured
    before that batch's update (as in the RL loop)."""
    reference = models.reference if models.reference is not None else unwrap(models.policy)
    accuracies = []
    for i in range(args.prm_warmup_steps):
        tasks = step_prompts(args, train_tasks, models.tokenizer, -1 - i, dist)
        rollout = sampler.generate([task.prompt_ids for task in tasks], n=args.n_samples)
        texts, _, outcome = verify_rollouts(sampler, rollout, tasks, args)
        sampler.sleep()  # --vllm-sleep: as in the loop, the engine sleeps through the PRM's update
        batch, _ = kept_batch(rollout, outcome, texts, tasks, args, dist)
        logp_ref = logprobs_no_grad(reference, batch.rollout, args, plan=batch.prm_plan)
        log_ratio, _ = implicit_prm_step(models.prm, models.prm_opt, batch, logp_ref, args, dist)
        sampler.push_weights(unwrap(models.policy))  # the same policy: only wakes the engine
        accuracies.append(all_reduce(runlog.pairwise_accuracy_sum(log_ratio.sum(-1), batch.outcome, batch.n_train, args), dist))
    return [a / n if n else float("nan") for a, n in accuracies]  # NaN: a batch without a mixed group


# ---------------------------------------------------------------------------------------------------
# Steps 5-6: advantages and the policy update
# ---------------------------------------------------------------------------------------------------


def advantages(args: Args, models: Models, batch: Batch, process_reward, signal, step_ids, formats, dist: Dist):
    """Step 5, the estimator of --estimator: (advantages (B, R), PPO's GAE returns and old values or None).
    Batch statistics (whitening, PASS's batch normaliser and trace) are the whole batch's, summed
    over ranks (dist.sum, dist.max), as the official code computes them in one place: 1 and 8 GPUs give
    the same advantages for the same global batch.

        rloo       Eq. 4-5: RLOO over the outcome and over the process rewards, whitened (PRIME)
        grpo       group-normalised outcome (+ process returns)                      (Fig. 7)
        reinforce  outcome (+ process) returns, no baseline, whitened                (Fig. 7)
        prm-value  the implicit PRM as a value model                                 (Sec. 5.4)
        ppo        GAE over token rewards with a learned critic, whitened            (Table 4)
        pass       PASS: the raw process signal shaped into GRPO's advantage         (pass_advantage.py)"""
    process_in = process_reward if args.process != "none" else None
    outcome, mask, returns, old_values = batch.outcome, batch.train_mask, None, None
    if args.estimator == "rloo":
        adv = prime.rloo_advantage(process_in, outcome, mask, args.n_samples, args.process_gamma, args.rloo_form,
                                   args.outcome_gamma)
    elif args.estimator == "grpo":
        adv = prime.grpo_advantage(process_in, outcome, mask, args.n_samples, args.process_gamma,
                                   outcome_gamma=args.outcome_gamma)
    elif args.estimator == "reinforce":
        adv = prime.reinforce_advantage(process_in, outcome, mask, args.process_gamma, args.outcome_gamma)
    elif args.estimator == "prm-value":  # the PRM is the baseline here: only the outcome has a return
        adv = prime.prm_value_advantage(args.beta * signal, outcome, mask, args.outcome_gamma)
    elif args.estimator == "ppo":  # a learned critic: GAE over outcome (+ process) token rewards
        old_values = values_no_grad(unwrap(models.critic), batch.rollout, args, batch.plan)
        adv, returns = prime.gae_advantage(prime.token_rewards(process_in, outcome, mask), old_values,
                                           mask, args.process_gamma, args.gae_lambda)
    else:  # PASS
        group_ids = torch.arange(len(batch.outcome), device=mask.device) // args.n_samples
        preset = pass_advantage.PRESETS[args.pass_preset]
        if args.pass_preset == "v1":
            preset = dict(preset, step_ids=step_ids)
        pass_in = args.beta * signal if args.process == "implicit" else signal
        adv = pass_advantage.pass_advantage(pass_in, mask, outcome, formats, group_ids, **preset,
                                            sum_over_ranks=dist.sum, max_over_ranks=dist.max)
    if args.estimator in ("rloo", "reinforce", "prm-value", "ppo"):
        adv = prime.whiten(adv, mask, sum_over_ranks=dist.sum)  # official: global whitening of every advantage
    return adv, returns, old_values


def kl_reference(args: Args, models: Models, batch: Batch, logp_ref):
    """--kl-coef: the frozen reference's log-probs at the sampling temperature (None without it; Eq. 3's at T = 1)."""
    if not args.kl_coef:
        return None
    if args.temperature == 1.0 and models.reference is not None and args.process in ("implicit", "gopd"):
        return logp_ref
    return logprobs_no_grad(models.reference, batch.rollout, args, args.temperature, batch.plan)


def rollout_correction(args: Args, batch: Batch, logp_old):
    """The sampler is not the trainer (vLLM draws with its own kernels, in bf16 on a GPU): the
    importance weights of --rollout-correction for the policy loss (None: every weight 1), and what
    they saw before any cap, as sums over ranks (prime.rollout_mismatch). HF rollouts sample from the
    policy itself, so they bring no log-probs of their own: no weights, nothing to log."""
    if batch.rollout.sampler_logprobs is None:
        return None, {}
    logp_rollout = batch.rollout.sampler_logprobs.to(logp_old.device)
    level, _, mode = args.rollout_correction.partition("-")
    level = "token" if level == "none" else level
    seen = prime.rollout_mismatch(logp_old, logp_rollout, batch.train_mask, level, args.rollout_correction_cap, mode)
    if args.rollout_correction == "none":
        return None, seen
    return prime.rollout_is_weights(logp_old, logp_rollout, batch.mask, level, mode, args.rollout_correction_cap), seen


def update_policy(args: Args, models: Models, batch: Batch, logp_old, adv, is_weights, dist: Dist,
                  logp_ref_kl=None) -> list[float]:
    """Step 6, Eq. 6: one PPO-clip step of the policy per mini-batch (token mean), each token's loss
    weighted by the rollout correction's `is_weights` (None: 1; a "band" mode also takes its masked
    tokens out of the mean), plus --kl-coef times the reference regulariser (prime.kl_penalty: GRPO's,
    as PASS runs it). Each step's loss, the same on every rank; what the update saw (clip fractions,
    KL to pi_old, entropy, gradient norms) goes to batch.health."""
    mask = prime.band_mask(is_weights, batch.mask) if args.rollout_correction.endswith("band") and is_weights is not None \
        else batch.mask
    health = batch.health

    def policy_loss_fn(mb: MicroBatch):
        logp, entropy = response_logprobs(models.policy, mb.rollout(batch.rollout), args.temperature, entropy=True)
        old = mb.rows_of(logp_old) if logp_old is not None else logp.detach()  # see needs_old_logprobs
        loss = prime.ppo_clip_loss(logp, old, mb.rows_of(adv), mb.rows_of(mask), args.clip_eps, args.dual_clip or None,
                                   mb.rows_of(is_weights) if is_weights is not None else None)
        kl = prime.kl_penalty(logp, mb.rows_of(logp_ref_kl), mb.rows_of(mask), args.kl_kind) if args.kl_coef else 0.0
        if mb.weight:  # a real micro-batch (not a zero-weight repeat): what the update saw, as sums
            stats = prime.policy_health_sums(logp, old, mb.rows_of(adv), mb.rows_of(mask), args.clip_eps)
            stats["entropy"] = float((entropy * mb.rows_of(mask)).sum())
            if args.kl_coef:
                stats["kl_ref"] = float(kl.detach()) * stats["tokens"]
            for key, value in stats.items():
                health[key] = health.get(key, 0.0) + value
        return loss + args.kl_coef * kl

    n_tokens = lambda mb: float(mb.rows_of(mask).sum())  # noqa: E731 (a token mean)
    return run_update(models.policy, models.policy_opt, policy_loss_fn, n_tokens, batch.plan, args, dist,
                      args.policy_grad_clip, health.setdefault("policy_grad_norms", []))


def update_critic(args: Args, models: Models, batch: Batch, ppo_targets, dist: Dist) -> list[float]:
    """--estimator ppo: the critic's clipped value loss (token mean) in the policy's micro-batches, each step's."""
    returns, old_values = ppo_targets

    def value_loss_fn(mb: MicroBatch):
        values = critic_values(models.critic, mb.rollout(batch.rollout))
        return prime.value_loss(values, mb.rows_of(old_values), mb.rows_of(returns), mb.rows_of(batch.mask),
                                args.value_clip or None)

    return run_update(models.critic, models.critic_opt, value_loss_fn, lambda mb: float(mb.rows_of(batch.mask).sum()),
                      batch.plan, args, dist, args.policy_grad_clip)


# ---------------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------------


def main(argv=None):
    args = parse_args(argv, __doc__)
    transformers.utils.logging.disable_progress_bar()  # one progress bar: the RL loop's
    dist = setup_distributed()
    runlog.seed_all(args.seed + dist.rank)  # seed + rank: one seed everywhere would draw 8 copies of a batch
    if dist.device.type == "cpu":  # OMP_NUM_THREADS wins (1 when runs share a small machine), else the cores per rank
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or max(1, (os.cpu_count() or 1) // dist.world)))
    run_dir = runlog.make_run_dir(args, dist)

    # Alg. 1 lines 1-2: policy, PRM and reference all start from the SFT checkpoint
    models = build_models(args, dist)
    tokenizer = models.tokenizer
    train_tasks, eval_tasks = load_tasks(args, tokenizer)
    kinds = sorted({t.kind for t in train_tasks})
    if "code" in kinds + [t.kind for t in eval_tasks]:  # the policy's programs will run: say where
        print0(dist, sandbox.announce_or_exit(args.sandbox))
    kinds = kinds if len(kinds) > 1 else []  # a file mixing math and code logs each kind's reward
    start_step = 0
    if args.resume:  # mapped into CPU memory, then into the models: before vLLM takes its share of the GPU
        start_step = runlog.load_checkpoint(run_dir, models, dist, offload_optimizer=args.offload_optimizer)
        if dist.master:
            runlog.truncate_metrics(run_dir / "metrics.jsonl", start_step)
        print0(dist, f"resumed {run_dir} at step {start_step}")
    sampler = make_sampler(args, models, dist)
    if args.resume:
        sampler.push_weights(unwrap(models.policy))  # a vLLM engine loaded the SFT checkpoint, not this one
    if dist.master:
        runlog.write_json(run_dir / "config.json", {**dataclasses.asdict(args), "model_path": models.path,
                                                    "world_size": dist.world, "lora_targets": lora_targets(args)})
    tracker = runlog.Tracker(args.tracker, run_dir, dataclasses.asdict(args), dist.master)
    start, eval_seconds = evaluation.start_accuracy(args, run_dir, sampler, eval_tasks, dist)
    print0(dist, f"held-out accuracy of the starting checkpoint: greedy {start['greedy']:.3f}, sampled "
              f"{start['sampled']:.3f} ({len(eval_tasks)} problems x {args.eval_samples} at T={args.temperature})")
    if args.prm_warmup_steps and not args.resume:  # an offline PRM: fit on the starting policy's rollouts
        warmup = warmup_prm(args, models, sampler, train_tasks, dist)
        print0(dist, f"PRM warmup ({args.prm_warmup_steps} batches of the starting policy's rollouts): pairwise "
                  f"accuracy before each update, first 5 {np.nanmean(warmup[:5]):.2f}, last 5 {np.nanmean(warmup[-5:]):.2f}")

    wall_start = time.time()
    phase_totals = dict.fromkeys(("rollout", "verify", "prm", "policy", "eval", "other"), 0.0)
    bar = tqdm(range(start_step, args.steps), initial=start_step, total=args.steps, disable=not dist.master,
               desc=runlog.run_label(args), dynamic_ncols=True)
    for step in bar:
        t_step, times = time.time(), {}

        # 1. Sample K responses for each prompt, whole groups on this rank (Alg. 1 lines 3-4) ------
        with timed(times, "rollout"):
            tasks = step_prompts(args, train_tasks, tokenizer, step, dist)
            rollout = sampler.generate([task.prompt_ids for task in tasks], n=args.n_samples)

        # 2. Verify: outcome reward r_o in [0, 1] (line 5) -----------------------------------------
        with timed(times, "verify"):
            texts, scores, outcome = verify_rollouts(sampler, rollout, tasks, args)

        # 3. Online prompt filter: keep groups with low <= mean accuracy <= high (line 6) ----------
        draws = 0
        if args.filter_mode == "refill":  # the official code: fresh prompts until the batch is full
            tasks, rollout, texts, scores, outcome, draws = refill(args, sampler, train_tasks, tokenizer, step, dist,
                                                              (tasks, rollout, texts, scores, outcome), times)
        sampler.sleep()  # --vllm-sleep: sampling is done, the engine's GPU memory goes to the updates
        batch, n_kept_groups = kept_batch(rollout, outcome, texts, tasks, args, dist)
        with timed(times, "policy"):  # pi_old: Eq. 6's ratio's denominator (and OPD's student, a reference at T = 1)
            logp_old = logprobs_no_grad(unwrap(models.policy), batch.rollout, args, args.temperature, batch.plan) \
                if needs_old_logprobs(args, models, batch.rollout) else None  # else the update's own forward gives them

        # 4. Process signal: the implicit PRM's rewards (Eq. 3) and its CE update (lines 7-8) ------
        with timed(times, "prm"):  # pi_ref in the PRM update's micro-batches, then the PRM
            logp_ref = reference_logprobs(args, models, batch, logp_old)
            signal, sequence_score, step_ids, prm_losses = process_signal(args, models, batch, logp_old, logp_ref, dist, step)

        # 5. Advantages, Eq. 5 (line 9), with the whole batch's statistics over all ranks ------------
        process_reward = process_rewards(args, signal, step_ids, batch.train_mask, batch.outcome, dist)  # (B, R)
        formats = torch.tensor([scores[i].format for i in batch.rows.tolist()], dtype=torch.float32, device=dist.device)
        adv, *ppo_targets = advantages(args, models, batch, process_reward, signal, step_ids, formats, dist)

        # 6. PPO clip update of the policy, Eq. 6 (line 10), and the sampler's weights (line 11) ----
        with timed(times, "policy"):  # (PPO: the policy stays frozen while the critic warms up)
            is_weights, mismatch = rollout_correction(args, batch, logp_old)  # vLLM sampled: pi_old / pi_vllm per token
            policy_losses = update_policy(args, models, batch, logp_old, adv, is_weights, dist,
                                          kl_reference(args, models, batch, logp_ref)) \
                if step >= args.critic_warmup_steps else []
            value_losses = update_critic(args, models, batch, ppo_targets, dist) if models.critic is not None else []
            sampler.push_weights(unwrap(models.policy))  # (wakes a sleeping engine)

        # 7. Log and checkpoint: every metric of the step, over the whole batch (gather_metrics) ---------
        metrics = gather_metrics(args, step, models, tokenizer, batch, (tasks, rollout, scores, outcome, kinds),
                                 (n_kept_groups, draws, mismatch), (signal, sequence_score, process_reward, adv, ppo_targets),
                                 {"prm": prm_losses, "policy": policy_losses, "value": value_losses}, dist)
        with timed(times, "eval"):
            if args.eval_every and (step + 1) % args.eval_every == 0 and step + 1 < args.steps:
                held = evaluation.heldout_metrics(sampler, eval_tasks, args, dist)
                metrics["heldout_accuracy"], metrics["heldout_sampled_accuracy"] = held["greedy"], held["sampled"]
        eval_seconds += times["eval"]
        times["other"] = (time.time() - t_step) - sum(times.values())  # filter, advantages, metrics
        if dist.master:
            runlog.append_jsonl(run_dir / "metrics.jsonl", {**metrics, "time": times})
            r_phi = args.beta * signal if args.process == "implicit" else signal  # Eq. 3's reward per token
            runlog.write_episodes(run_dir, step + 1, batch.rollout, texts, batch.rows, batch.n_train, batch.outcome,
                                  process_reward, r_phi, *batch.health["checked"], tokenizer, args.episodes_per_step)
            tracker.log({**metrics, "time": times}, step + 1)
            bar.set_postfix(reward=f"{metrics['reward']:.3f}", prm_acc=runlog.fmt(metrics["prm_accuracy"]),
                            kept=f"{metrics['kept_groups']}/{metrics['prompts']}", kl=runlog.fmt(metrics["actor/ppo_kl"]),
                            ent=runlog.fmt(metrics["actor/entropy"]))
        if (step + 1) % args.save_every == 0 or step + 1 == args.steps:
            runlog.save_checkpoint(run_dir, step + 1, models, dist, keep=args.keep_checkpoints)
        if step == start_step and dist.device.type == "cuda":  # the up-front estimate against the first step
            print0(dist, memory_line(unwrap(models.policy), args, measured_memory(dist.device)))
        for k in phase_totals:
            phase_totals[k] += times[k]
        phase_totals["other"] += (time.time() - t_step) - sum(times.values())  # + writing, checkpoint

    # End: held-out accuracy of the final policy, curves, summary, final checkpoint -------------------
    t = time.time()
    end = evaluation.heldout_metrics(sampler, eval_tasks, args, dist)
    eval_seconds += time.time() - t
    if dist.master:  # final/ first: a summary with end_accuracy marks a finished run (studies/runner.py)
        toy_task.save_pretrained_atomic(unwrap(models.policy), tokenizer, run_dir / "final")
        n_steps = max(args.steps - start_step, 1)
        timing = {"wall_seconds": time.time() - wall_start,
                  "step_seconds": {k: v / n_steps for k, v in phase_totals.items()}, "eval_seconds": eval_seconds}
        plots.write_summary(run_dir, args, start, end, timing, len(eval_tasks))
    tracker.close()
    barrier(dist)  # every rank leaves together, after rank 0's summary
    # DDP's reducers hold the process group: freed after it, the last would free gloo's group holding the GIL
    # while gloo's threads wait for it, a hang at exit (pytorch#56297). So the DDP models go first, then the group.
    del models
    gc.collect()
    if args.rollout == "vllm":
        sampler.close()  # vLLM's shutdown destroys its process groups, the default one included
    close(dist)  # whenever a group was made (torchrun with one rank too), and vLLM did not already
    return run_dir


def gather_metrics(args: Args, step: int, models: Models, tokenizer, batch: Batch, sampled: tuple, kept: tuple,
                   credit: tuple, losses: dict, dist: Dist) -> dict:
    """A line of metrics.jsonl over the whole batch (runlog.step_record), with the exact checker's diagnostics where
    it knows the steps (embedded task, chains, sums): is the first wrong step blamed, right answers via wrong ones."""
    batch.health["checked"] = step_prm.checker_steps(tokenizer, batch.questions, batch.texts, batch.rollout,
                                                     embedded=not args.data)
    diagnostics = step_prm.checker_diagnostics(None if args.process == "none" else credit[0], *batch.health["checked"],
                                               batch.outcome, batch.n_train)
    return runlog.step_record(args, step, batch, sampled, kept, credit, diagnostics, losses,
                              {"actor": models.policy_opt, "prm": models.prm_opt}, dist)


if __name__ == "__main__":
    main()
