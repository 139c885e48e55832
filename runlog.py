"""The run folder runs/<name>/: written atomically, read back in one place, resumed exactly.

    config.json      the flags of the run, the SFT checkpoint it started from, the world size
    metrics.jsonl    one line per step (append_jsonl), cut back to the checkpoint on --resume
    episodes.jsonl   a few responses per step with their per-token rewards (write_episodes)
    summary.json     start and end held-out accuracy, the last-10-step means, the step-time split
    checkpoint/      policy, PRM, critic, their optimisers, the step, one RNG file per rank: a link to
                     checkpoint-<step>/, switched atomically (save_checkpoint)
    final/           the final policy, loadable with from_pretrained
    curves.png, episodes.png

Every file is written to a temporary name and renamed over the old one (write_atomic,
replace_folder): a kill at any moment leaves the old or the new version whole, never half of one.
`read_run` is the one reader of a finished or running run folder (train.py, eval.py, studies/).
"""

import contextlib
import json
import math
import os
import platform
import random
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import torch

import prime
from ddp import Dist, all_reduce, all_reduce_max, barrier, check_shared_storage, unwrap


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write text or bytes to a temporary file beside `path`, then rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp{os.getpid()}-{path.name}")  # same suffix: matplotlib picks the format by it
    if isinstance(data, bytes):
        tmp.write_bytes(data)
    else:
        tmp.write_text(data)
    os.replace(tmp, path)


def write_json(path: Path, data: dict, indent: int = 2) -> None:
    write_atomic(path, json.dumps(data, indent=indent))


REPO = Path(__file__).resolve().parent


def portable(path) -> str:
    """A path as a shipped record should hold it: relative to the repository when it is inside it
    ("/home/me/prime/.cache/smollm2" -> ".cache/smollm2"), so that no JSON the docs quote names one
    machine's folders; an absolute path elsewhere by its name alone ("/scratch/runs/sums2.jsonl" ->
    "sums2.jsonl": a record names its task file's sha256 beside it); a hub name unchanged."""
    if not str(path):
        return str(path)
    resolved = Path(path).resolve()
    if resolved.is_relative_to(REPO):
        return str(resolved.relative_to(REPO))
    return Path(path).name if Path(path).is_absolute() else str(path)


def machine() -> str:
    """What a run's times were measured on: the GPU's name, or the CPU's model and torch's thread count."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
             if line.startswith("model name")] if Path("/proc/cpuinfo").exists() else []
    return f"{names[0] if names else platform.processor() or 'CPU'}, {torch.get_num_threads()} threads"


def replace_folder(tmp: Path, final: Path) -> None:
    """Move a fully written folder `tmp` into place at `final` (the old one, if any, is removed after)."""
    old = final.with_name(final.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def save_figure(fig, path: Path, **kwargs) -> Path:
    """fig.savefig through a temporary file (same suffix, so the format is the same), then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp{os.getpid()}-{path.name}")
    fig.savefig(tmp, **kwargs)
    os.replace(tmp, path)
    return path


def append_jsonl(path: Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()


def read_jsonl(path: Path) -> list[dict]:
    path = Path(path)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def read_run(run_dir: str | Path) -> dict:
    """{"dir", "config", "metrics", "summary", "episodes"} of a run folder; a file not written yet
    (a run still going) reads as {} or []."""
    run_dir = Path(run_dir)
    read = lambda name: json.loads((run_dir / name).read_text()) if (run_dir / name).exists() else {}  # noqa: E731
    return {"dir": run_dir, "config": read("config.json"), "metrics": read_jsonl(run_dir / "metrics.jsonl"),
            "summary": read("summary.json"), "episodes": read_jsonl(run_dir / "episodes.jsonl")}


def truncate_metrics(path: Path, last_step: int) -> None:
    """On resume, drop metric lines written after the checkpoint (they will be redone)."""
    if path.exists():
        lines = [l for l in path.read_text().splitlines() if l.strip() and json.loads(l)["step"] <= last_step]
        write_atomic(path, "".join(l + "\n" for l in lines))


def make_run_dir(args, d: Dist) -> Path:
    """runs/<name>/, made by rank 0 (refusing to write over a run unless --resume), seen by every rank."""
    run_dir = Path(args.out_dir) / (args.run_name or time.strftime("run-%Y%m%d-%H%M%S"))
    if d.master:
        if run_dir.exists() and not args.resume and (run_dir / "metrics.jsonl").exists():
            raise SystemExit(f"{run_dir} already holds a run: pass --resume to continue it or choose another --run-name")
        run_dir.mkdir(parents=True, exist_ok=True)
        print(f"run folder: {run_dir} ({'resumed' if args.resume else 'new'}; --resume --run-name "
              f"{run_dir.name} continues it)", flush=True)
    barrier(d)
    check_shared_storage(run_dir, "--out-dir", d)
    if not args.model:  # rank 0 builds the embedded SFT checkpoint there; every rank loads it
        check_shared_storage(Path(args.cache_dir), "--cache-dir", d)
    return run_dir


# ---------------------------------------------------------------------------------------------------
# One line of metrics.jsonl per step (train.py)
# ---------------------------------------------------------------------------------------------------


def step_counts(args, tasks: list, ro, scores, outcome, kinds: list[str]) -> dict:
    """This rank's counts of the sampled responses, to be summed over ranks (named, never by position)."""
    row_kinds = [task.kind for task in tasks for _ in range(args.n_samples)]
    counts = {"reward": outcome.sum().item(), "responses": len(outcome), "prompts": len(tasks),
              "tokens": ro.response_mask.sum().item(), "truncated": float(ro.truncated.sum()),
              "format": sum(s.format for s in scores), "mixed_groups": int(prime.mixed_groups(outcome, args.n_samples).sum())}
    for k in kinds:  # a file mixing kinds (PRIME's data: math and code rows) logs the reward of each
        counts[f"reward_{k}"] = sum(s.reward for s, rk in zip(scores, row_kinds) if rk == k)
        counts[f"responses_{k}"] = row_kinds.count(k)
    return counts


def merge_counts(*parts: dict) -> dict:
    """One dict of a step's counts from its parts, refusing a key two parts share: merged with {**a, **b},
    the second would silently win (the rollout correction's token count once replaced the sampled
    responses' and divided the response length by the kept rows' tokens)."""
    merged = {}
    for part in parts:
        shared = merged.keys() & part.keys()
        assert not shared, f"two counts of a step share the names {sorted(shared)}"
        merged.update(part)
    return merged


def pairwise_accuracy_sum(sequence_score, outcome, n_train: int, args) -> list[float]:
    """[the PRM's pairwise accuracy summed over the mixed groups among the first n_train rows, their
    number], to be all-reduced over ranks. Only mixed groups count: a group whose labels are all equal
    scores 0.5 in prime.prm_pairwise_accuracy whatever the PRM does, so with the filter off (many
    all-wrong groups) a mean over every group would sit near 0.5 and hide what the PRM learned."""
    if args.process == "none" or n_train == 0:
        return [0.0, 0]
    mixed = prime.mixed_groups(outcome[:n_train], args.n_samples)
    if not mixed.any():
        return [0.0, 0]
    rows = mixed.repeat_interleave(args.n_samples)
    acc = prime.prm_pairwise_accuracy(sequence_score[:n_train][rows], outcome[:n_train][rows], args.n_samples)
    return [acc.item() * int(mixed.sum()), int(mixed.sum())]


def step_metrics(args, step: int, sums: dict, kept_per_rank: list, losses: dict) -> dict:
    """One line of metrics.jsonl from the counts summed over ranks (step_counts and the step's own)."""
    mean = lambda values: float(np.mean(values)) if values else 0.0  # noqa: E731 (run_update's are global already)
    n = sums["responses"]
    metrics = {
        "step": step + 1,
        "reward": sums["reward"] / n,
        "kept_groups": int(sums["kept_groups"]), "prompts": int(sums["prompts"]),
        "refill_draws": int(sums["refill_draws"]),  # --filter-mode refill: extra draws, all ranks
        "kept_groups_per_rank": [int(k) for k in kept_per_rank],
        "response_length": sums["tokens"] / n,
        "truncated_fraction": sums["truncated"] / n,
        "format": sums["format"] / n,
        "mixed_groups": int(sums["mixed_groups"]),  # of all sampled groups: some responses right, some wrong
        # Fig. 5, over the mixed kept groups
        "prm_accuracy": sums["prm_accuracy"] / sums["prm_groups"] if sums["prm_groups"] and args.process != "none"
        else None,
        "prm_loss": mean(losses["prm"]),
        "policy_loss": mean(losses["policy"]),
        "process_reward_abs_mean": sums["process_abs"] / max(sums["process_tokens"], 1),
        # the share of wrong responses whose most blamed step is their first wrong one
        "prm_localization": sums["localized"] / sums["wrong"] if sums["wrong"] else None,
        # the share of right training responses with a step an exact checker marks wrong (slips that cancel)
        "right_with_wrong_step": sums["right_slipped"] / sums["right"] if sums["right"] else None,
    }
    if args.estimator == "ppo":
        metrics["value_loss"] = mean(losses["value"])
    if "rho_max" in sums:  # vLLM sampled: the two engines' mismatch, before the correction's cap
        metrics["rollout_logp_abs_diff"] = sums["abs_logp_diff"] / max(sums["mismatch_tokens"], 1)
        metrics["rollout_rho_max"] = sums["rho_max"]
        metrics["rollout_over_cap"] = sums["over_cap"] / max(sums["units"], 1)  # share truncated or masked
    for key in sums:  # e.g. reward_math, reward_code; None on a step without that kind
        if key.startswith("responses_"):
            kind = key.removeprefix("responses_")
            metrics[f"reward_{kind}"] = sums[f"reward_{kind}"] / sums[key] if sums[key] else None
    return metrics


def step_record(args, step: int, batch, sampled: tuple, kept: tuple, credit: tuple, diagnostics: tuple,
                losses: dict, optimizers: dict, d: Dist) -> dict:
    """train.py's line of metrics.jsonl for one iteration, every count summed over ranks: the sampled
    responses' rewards and counts (step_counts), the filter's, the PRM's pairwise accuracy (Fig. 5), the
    checker's diagnostics, the rollout correction's mismatch, then the update's health (health_metrics).
    sampled = (tasks, rollout, scores, outcome, kinds), kept = (kept groups, refill draws, mismatch),
    credit = (signal, sequence score, process reward, advantages, PPO's (returns, old values))."""
    tasks, rollout, scores, outcome, kinds = sampled
    n_kept_groups, draws, mismatch = kept
    signal, sequence_score, process_reward, adv, ppo_targets = credit
    localized, n_wrong, right_slipped, n_right = diagnostics
    prm_accuracy, prm_groups = pairwise_accuracy_sum(sequence_score, batch.outcome, batch.n_train, args)
    sums = all_reduce(merge_counts(
        step_counts(args, tasks, rollout, scores, outcome, kinds),
        {"kept_groups": n_kept_groups, "refill_draws": draws, "prm_accuracy": prm_accuracy, "prm_groups": prm_groups,
         "localized": localized, "wrong": n_wrong, "right_slipped": right_slipped, "right": n_right,
         "process_abs": (process_reward.abs() * batch.train_mask).sum().item(),
         "process_tokens": batch.train_mask.sum().item()},
        {k: v for k, v in mismatch.items() if k != "rho_max"}), d)
    if mismatch:
        sums["rho_max"] = all_reduce_max([mismatch["rho_max"]], d)[0]
    kept_per_rank = all_reduce([n_kept_groups if r == d.rank else 0 for r in range(d.world)], d)
    # a response's return: PPO's GAE targets, else its total reward r_o + sum_t r_t (what RLOO and GRPO compare)
    returns = ppo_targets[0] if ppo_targets[0] is not None else \
        (batch.outcome[:, None] + process_reward.sum(-1, keepdim=True)).expand_as(batch.train_mask)
    metrics = step_metrics(args, step, sums, kept_per_rank, losses)
    # veRL's names for two figures step_metrics already has from the summed counts
    metrics["response_length/mean"], metrics["response_length/clip_ratio"] = \
        metrics["response_length"], metrics["truncated_fraction"]
    return {**metrics, **health_metrics(rollout, batch.train_mask, adv, returns, batch.health, optimizers, d)}


def masked_stats(x: torch.Tensor, mask: torch.Tensor, d: Dist) -> dict:
    """mean, std (population), min and max of x over the positions where mask is 1, on every rank
    together; all 0 when there is none."""
    m = mask.bool()
    values = x[m].double()
    n, total, squares = all_reduce([float(values.numel()), float(values.sum()), float((values ** 2).sum())], d)
    if not n:
        return dict.fromkeys(("mean", "std", "min", "max"), 0.0)
    high, neg_low = all_reduce_max([float(values.max()) if values.numel() else -math.inf,
                                    float(-values.min()) if values.numel() else -math.inf], d)
    mean = total / n
    return {"mean": mean, "std": math.sqrt(max(squares / n - mean * mean, 0.0)), "min": -neg_low, "max": high}


def health_metrics(rollout, train_mask: torch.Tensor, adv: torch.Tensor, returns: torch.Tensor, health: dict,
                   optimizers: dict, d: Dist) -> dict:
    """What an RL user watches to see a run go wrong, named as veRL names it (docs/runs.md maps them),
    over the whole batch (1 rank = 2 ranks):
        actor/pg_clipfrac (_high, _low)   tokens where Eq. 6's clip binds, each side and together
        actor/ppo_kl                      KL(pi_old || pi) per token, the k3 estimator
        actor/entropy                     entropy of the sampling distribution, mean over response tokens
        actor/kl_loss                     the reference regulariser (--kl-coef's term, before the coefficient)
        actor/grad_norm, prm/grad_norm    gradient norm before clipping, mean over the iteration's steps
        actor/lr, prm/lr                  the optimizers' current learning rates
        critic/advantages/{mean,std,min,max}, critic/returns/{...}   over the training tokens
        response_length/max               the longest sampled response (step_record adds /mean and /clip_ratio,
                                          the share cut at the cap, from step_metrics' sums)
    Metrics of an update that did not run (the PRM's without --process implicit, the policy's while PPO's
    critic warms up) are None."""
    lengths = rollout.response_mask.sum(-1).float()
    sums = all_reduce([health.get(k, 0.0) for k in ("clip_high", "clip_low", "kl_k3", "entropy", "kl_ref", "tokens")], d)
    clip_high, clip_low, kl_k3, entropy, kl_ref, tokens = sums
    per_token = (lambda x: x / tokens) if tokens else (lambda x: None)  # noqa: E731
    out = {"actor/pg_clipfrac": per_token(clip_high + clip_low), "actor/pg_clipfrac_high": per_token(clip_high),
           "actor/pg_clipfrac_low": per_token(clip_low), "actor/ppo_kl": per_token(kl_k3),
           "actor/entropy": per_token(entropy), "actor/kl_loss": per_token(kl_ref) if "kl_ref" in health else None}
    for name in ("actor", "prm"):  # DDP: every rank has the same norms
        norms = health.get(f"{'policy' if name == 'actor' else 'prm'}_grad_norms") or []
        out[f"{name}/grad_norm"] = float(np.mean(norms)) if norms else None
        out[f"{name}/lr"] = optimizers[name].param_groups[0]["lr"] if optimizers.get(name) is not None else None
    for key, value in masked_stats(adv, train_mask, d).items():
        out[f"critic/advantages/{key}"] = value
    for key, value in masked_stats(returns, train_mask, d).items():
        out[f"critic/returns/{key}"] = value
    out["response_length/max"] = all_reduce_max([float(lengths.max()) if len(lengths) else 0.0], d)[0]
    return out


TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb"}  # --tracker -> the package it needs


def tracker_missing(kind: str) -> str:
    """Why --tracker KIND cannot run here ("" if it can): its package, and the command that installs it."""
    import importlib.util

    package = TRACKERS.get(kind)
    if package and importlib.util.find_spec(package) is None:
        return f"--tracker {kind}: the package {package!r} is not installed (pip install -r requirements-trackers.txt)"
    return ""


class Tracker:
    """--tracker: every number of a metrics.jsonl line also to TensorBoard (run_dir/tensorboard/) or to
    Weights & Biases (offline by default: run_dir/wandb/, no account; WANDB_MODE=online to sync), by
    rank 0 only; the step's time split as time/<phase>. --tracker none (the default): nothing."""

    def __init__(self, kind: str, run_dir: Path, config: dict, master: bool):
        self.kind, self.writer = kind if master else "none", None
        if self.kind == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter
            self.writer = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))
        elif self.kind == "wandb":
            import wandb
            self.writer = wandb.init(project=os.environ.get("WANDB_PROJECT", "prime"), name=Path(run_dir).name,
                                     dir=str(run_dir), config=config, mode=os.environ.get("WANDB_MODE", "offline"),
                                     id=Path(run_dir).name.replace("/", "-"), resume="allow")

    def log(self, metrics: dict, step: int) -> None:
        numbers = {k: float(v) for k, v in metrics.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}
        numbers.update({f"time/{k}": float(v) for k, v in metrics.get("time", {}).items()})
        if self.kind == "tensorboard":
            for key, value in numbers.items():
                self.writer.add_scalar(key, value, step)
            self.writer.flush()
        elif self.kind == "wandb":
            self.writer.log(numbers, step=step)

    def close(self) -> None:
        if self.kind == "tensorboard":
            self.writer.close()
        elif self.kind == "wandb":
            self.writer.finish()


def run_label(args) -> str:
    """What runs, for the progress bar, by the arms' names: 'PRIME' for RLOO with the online implicit PRM,
    'outcome-only' for RLOO without a process reward."""
    if args.estimator == "rloo" and args.process == "implicit" and args.prm_online:
        return "PRIME"
    if args.estimator == "rloo" and args.process == "none":
        return "outcome-only"
    source = {"implicit": "implicit PRM" + ("" if args.prm_online else " (offline)"), "none": "outcome-only",
              "opd": "OPD", "gopd": "G-OPD", "step": "step PRM"}[args.process]
    return f"{args.estimator.upper() if args.estimator != 'prm-value' else 'PRM-value'} + {source}"


def fmt(x) -> str:
    return "n/a" if x is None else f"{x:.2f}"


@contextlib.contextmanager
def timed(times: dict, phase: str):
    """Add the seconds of the block to times[phase]: the step-time split of PRIME's Table 2."""
    start = time.time()
    yield
    times[phase] = times.get(phase, 0.0) + time.time() - start


# ---------------------------------------------------------------------------------------------------
# Summaries of a metric over steps
# ---------------------------------------------------------------------------------------------------


def moving_average(values, window: int = 10) -> np.ndarray:
    """Trailing mean over the last `window` steps (fewer at the start), NaNs (steps without a value)
    skipped, along the last axis: one curve (steps,) or several (seeds, steps).
    [1, 2, 3, 4], window 2 -> [1, 1.5, 2.5, 3.5]; [0, 1, nan, 3, 5] -> [0, 0.5, 1, 3, 4]."""
    x = np.asarray(values, dtype=float)
    out = np.full_like(x, np.nan)
    for t in range(x.shape[-1]):
        chunk = x[..., max(0, t - window + 1):t + 1]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a window of NaNs only (no PRM value yet): NaN
            out[..., t] = np.nanmean(chunk, axis=-1)
    return out


def nanmean(values) -> float | None:
    """Mean of the values that are not None or NaN; None when there are none (e.g. no PRM in the run)."""
    kept = [float(v) for v in values if v is not None and not math.isnan(v)]
    return float(np.mean(kept)) if kept else None


# ---------------------------------------------------------------------------------------------------
# Checkpoints: written atomically, resumed exactly
# ---------------------------------------------------------------------------------------------------


def seed_all(seed: int) -> None:
    """Seed torch's, Python's and NumPy's random streams (train.py: seed + rank, so ranks draw differently)."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None:
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(run_dir: Path, step: int, models, d: Dist, keep: bool = False) -> None:
    """runs/<name>/checkpoint/: models, optimisers, step, and one RNG file per rank (models.Models).

    A complete checkpoint is on disk at every moment, so a node that dies mid-save can always resume:
      1. every rank writes into a new folder beside the old one, checkpoint-<step>/ (rank 0 the models
         and optimisers, each rank its RNG file);
      2. once all have written, rank 0 points `checkpoint` at it: a symbolic link made under a
         temporary name and renamed over the old link, one atomic rename;
      3. then it removes the old folder.
    A kill before 2 leaves the old link and the old folder whole (the half-written new folder is
    removed by the next save); a kill after 2 leaves the new one whole and, at worst, an old folder
    that the next save removes. --resume reads whatever `checkpoint` points at. With `keep`
    (--keep-checkpoints) step 3 is skipped: every checkpoint-<step>/ stays, to be evaluated later
    (load_checkpoint's `name`); a half-written one is the step the resumed run saves next, so its
    own save replaces it (the rmtree above)."""
    link = run_dir / "checkpoint"
    current = os.readlink(link) if link.is_symlink() else None
    name = f"checkpoint-{step}" if current != f"checkpoint-{step}" else f"checkpoint-{step}-again"
    new = run_dir / name
    if d.master:
        shutil.rmtree(new, ignore_errors=True)
        new.mkdir(parents=True)
    barrier(d)
    torch.save(rng_state(), new / f"rng_rank{d.rank}.pt")
    if d.master:
        state = lambda m: unwrap(m).state_dict() if m is not None else None  # noqa: E731
        torch.save({"step": step, "policy": state(models.policy), "policy_opt": models.policy_opt.state_dict(),
                    "prm": state(models.prm),
                    "prm_opt": models.prm_opt.state_dict() if models.prm is not None else None,
                    "critic": state(models.critic),
                    "critic_opt": models.critic_opt.state_dict() if models.critic is not None else None,
                    "world": d.world}, new / "state.pt")
    barrier(d)
    if d.master:
        point_checkpoint_at(run_dir, name)
        for old in [] if keep else run_dir.glob("checkpoint-*"):  # the previous checkpoint, and any a kill left half-written
            if old.name != name:
                shutil.rmtree(old, ignore_errors=True)
    barrier(d)


def point_checkpoint_at(run_dir: Path, name: str) -> None:
    """Make run_dir/checkpoint a link to run_dir/<name> with one atomic rename (step 2 above)."""
    link, tmp = run_dir / "checkpoint", run_dir / ".checkpoint-link.tmp"
    if link.exists() and not link.is_symlink():  # a run folder from before links: keep its checkpoint
        os.replace(link, run_dir / "checkpoint-0-legacy")  # whole, under a name the next save removes
    tmp.unlink(missing_ok=True)
    os.symlink(name, tmp)  # relative: the run folder can be moved
    os.replace(tmp, link)


def drop_checkpoints(run_dir: Path) -> None:
    """Remove a finished run's resume state: the `checkpoint` link (or a folder of that name, from
    before links) and every checkpoint-<step>/. final/, the logs and summary.json stay, so the run still
    reads as finished (reproduce.finished) and is not trained again."""
    link = run_dir / "checkpoint"
    if link.is_symlink():
        link.unlink()
    elif link.exists():
        shutil.rmtree(link)
    for folder in run_dir.glob("checkpoint-*"):
        shutil.rmtree(folder)


def optimizer_state_to(optimizer: torch.optim.Optimizer, device) -> None:
    """--offload-optimizer (veRL's optimizer offload): move AdamW's moments, exp_avg and exp_avg_sq (8
    bytes a parameter), to `device`; the step counts (0-dim tensors) stay where AdamW keeps them (on the
    GPU for the fused kernel). The same numbers wherever they wait: a copy is exact. A new optimizer
    has no state yet; it is made on the parameters' device at the first step, then moved.

    To the CPU of a GPU machine they go into pinned (page-locked) memory: a copy between pinned memory
    and the GPU runs at the link's speed, and without pinning each copy is staged through a pinned
    buffer by the driver at a fraction of it. Back to the GPU, the copies are queued without waiting
    (non_blocking) and the update's first kernels follow them on the same stream."""
    pin = torch.device(device).type == "cpu" and torch.cuda.is_available()
    for state in optimizer.state.values():
        for key, value in state.items():
            if torch.is_tensor(value) and value.dim() > 0:
                if pin and value.device.type == "cuda":
                    state[key] = torch.empty(value.shape, dtype=value.dtype, pin_memory=True).copy_(value)
                else:
                    state[key] = value.to(device, non_blocking=value.is_pinned())


def load_checkpoint(run_dir: Path, models, d: Dist, name: str = "checkpoint", offload_optimizer: bool = False) -> int:
    """Restore what save_checkpoint wrote into `models` and this rank's RNG streams; the step to resume at.
    `name`: the newest checkpoint (what --resume reads), or a kept one, e.g. "checkpoint-20".

    The file is mapped from disk into CPU memory (mmap), never loaded whole onto a GPU: each tensor
    goes to its model's device as load_state_dict copies it. Call it before a vLLM engine takes its
    share of the GPU."""
    path = run_dir / name
    if not (path / "state.pt").exists():
        raise SystemExit(f"--resume: no checkpoint in {path}")
    state = torch.load(path / "state.pt", map_location="cpu", mmap=True, weights_only=False)
    if state["world"] != d.world:
        raise SystemExit(f"--resume: checkpoint was written by {state['world']} ranks, this run has {d.world}")
    if (state["prm"] is None) != (models.prm is None):
        raise SystemExit("--resume: the checkpoint and this run disagree on --process (implicit PRM or not)")
    if (state.get("critic") is None) != (models.critic is None):
        raise SystemExit("--resume: the checkpoint and this run disagree on --estimator (a PPO critic or not)")
    for name in ("policy", "prm", "critic"):
        if getattr(models, name) is None:
            continue
        unwrap(getattr(models, name)).load_state_dict(state[name])
        optimizer = getattr(models, f"{name}_opt")
        optimizer.load_state_dict(state[f"{name}_opt"])  # the moments land on the parameters' device
        if offload_optimizer:  # back to the CPU before the next model's come: one model's at a time on the GPU
            optimizer_state_to(optimizer, "cpu")
    set_rng_state(torch.load(path / f"rng_rank{d.rank}.pt", weights_only=False))
    return state["step"]


# ---------------------------------------------------------------------------------------------------
# Episodes: which tokens did the process signal credit or blame?
# ---------------------------------------------------------------------------------------------------


def write_episodes(run_dir: Path, step: int, batch, texts: list[str], rows, n_train: int, outcome, process,
                   reward, step_ids, first_wrong, tokenizer, per_step: int) -> None:
    """A few responses per step with their per-token rewards: the most instructive artifact of a
    PRIME run. One wrong and one right response first, when the step trained on both; `reward` is
    Eq. 3's r_phi (or the raw signal of --process), `process_reward` what the estimator received
    (after --process-norm); `step_ids` / `first_wrong` mark an exact checker's steps where the task
    has one (step_prm.checker_steps)."""
    real = list(range(max(n_train, 0)))
    wrong = [i for i in real if outcome[i] < 1][:1]
    right = [i for i in real if outcome[i] >= 1][:1]
    picks = (wrong + right + [i for i in real if i not in wrong + right])[:per_step]
    for i in picks:
        n = int(batch.response_mask[i].sum())
        tokens = tokenizer.convert_ids_to_tokens(batch.response_ids[i, :n].tolist())
        episode = {"step": step, "outcome": outcome[i].item(), "response": texts[int(rows[i])],
                   "tokens": tokens, "process_reward": [round(x, 5) for x in process[i, :n].tolist()],
                   "reward": [round(x, 5) for x in reward[i, :n].tolist()]}
        if step_ids is not None:
            episode["step_ids"] = step_ids[i, :n].tolist()
            episode["first_wrong_step"] = int(first_wrong[i])
        append_jsonl(run_dir / "episodes.jsonl", episode)
