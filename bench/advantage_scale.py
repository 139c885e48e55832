"""How large the process part of an advantage is against its outcome part, GRPO against RLOO, on the
same rollouts and the same implicit PRM.

    python bench/advantage_scale.py runs/repro/grpo+prm-s1 --batches 8

docs/REPRODUCTION.md 2.3: with GRPO the implicit PRM costs 4.0 points (5 seeds), with RLOO nothing.
Both get the same per-token process rewards (train.process_rewards: the PRM's log-ratio divided by
the batch's largest |return-to-go|). RLOO (Eq. 5) subtracts a leave-one-out mean from them; our GRPO
(prime.grpo_advantage) subtracts the group's mean of per-response means and divides by their standard
deviation, a spread of means that can be far smaller than one token's reward. This measures it: for
each estimator, the root mean square over response tokens of the outcome part (the estimator with
process rewards switched off), of the process part (with them, less the outcome part), and the share
of tokens whose advantage sign the process part turns against the outcome part's. RLOO is measured
before its global whitening, which scales both parts alike. The run's final policy and PRM
(run_dir/checkpoint) roll out fresh prompts with its sampling settings, the default task's filter.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ddp  # noqa: E402
import microbatch  # noqa: E402
import models as run_models  # noqa: E402
import prime  # noqa: E402
import runlog  # noqa: E402
import train  # noqa: E402
from config import parse_args  # noqa: E402
from rollout import HFRollout  # noqa: E402


def parts(adv_with, adv_without, mask) -> dict:
    valid = mask.bool()
    out, proc = adv_without[valid], (adv_with - adv_without)[valid]
    return {"outcome_rms": out.pow(2).mean().sqrt().item(), "process_rms": proc.pow(2).mean().sqrt().item(),
            "sign_turned": ((out * adv_with[valid]) < 0).float().mean().item()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="a finished train.py run with an implicit PRM")
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", default=".cache")
    parser.add_argument("--out", type=Path, default=None,
                        help="a JSON file to keep the means in, under the run folder's name (merged with what it holds)")
    opts = parser.parse_args(argv)
    config = json.loads((opts.run_dir / "config.json").read_text())
    if config["process"] != "implicit":
        raise SystemExit(f"{opts.run_dir}: --process {config['process']}; this compares implicit process rewards")
    d = ddp.Dist()
    args = parse_args(["--toy-ops", config["toy_ops"], "--toy-slip", str(config["toy_slip"]),
                       "--max-response-len", str(config["max_response_len"]), "--cache-dir", opts.cache_dir,
                       "--no-prm-online", "--seed", str(opts.seed)])
    models = run_models.build_models(args, d)
    step = runlog.load_checkpoint(opts.run_dir, models, d)
    sampler = HFRollout(models.policy, models.tokenizer, args.max_response_len, args.temperature, args.top_p)
    torch.manual_seed(opts.seed)
    rows = []
    for k in range(opts.batches):
        tasks = train.step_prompts(args, [], models.tokenizer, 1_000_000 + k, d)  # prompts no run trained on
        ro = sampler.generate([t.prompt_ids for t in tasks], n=args.n_samples)
        texts, _, outcome = train.verify_rollouts(sampler, ro, tasks, args)
        b, kept = train.kept_batch(ro, outcome, texts, tasks, args, d)
        if not kept:
            continue
        with torch.no_grad():
            logp_ref = microbatch.logprobs_no_grad(models.reference, b.rollout, args)
            signal, _, step_ids, _ = train.process_signal(args, models, b, None, logp_ref, d, k)
            process = train.process_rewards(args, signal, step_ids, b.train_mask, b.outcome, d)
        mask, n, o = b.train_mask, args.n_samples, b.outcome
        grpo = parts(prime.grpo_advantage(process, o, mask, n), prime.grpo_advantage(None, o, mask, n), mask)
        rloo = parts(prime.rloo_advantage(process, o, mask, n), prime.rloo_advantage(None, o, mask, n), mask)
        rows.append((grpo, rloo))
        print(f"batch {k}: GRPO outcome {grpo['outcome_rms']:.3f}, process {grpo['process_rms']:.3f}, "
              f"sign turned {grpo['sign_turned']:.1%} | RLOO outcome {rloo['outcome_rms']:.3f}, "
              f"process {rloo['process_rms']:.3f}, sign turned {rloo['sign_turned']:.1%}", flush=True)
    if not rows:
        raise SystemExit("no batch kept a group; try more --batches")
    print(f"\n{opts.run_dir} step {step}, {len(rows)} batches, RMS over response tokens (mean over batches):")
    kept = {"step": step, "batches": len(rows), "seed": opts.seed}
    for i, name in enumerate(("GRPO", "RLOO")):
        mean = {key: sum(r[i][key] for r in rows) / len(rows) for key in rows[0][i]}
        kept[name] = dict(mean, process_over_outcome=mean["process_rms"] / mean["outcome_rms"])
        print(f"{name}: outcome part {mean['outcome_rms']:.3f}, process part {mean['process_rms']:.3f} "
              f"({mean['process_rms'] / mean['outcome_rms']:.2f}x), sign turned against the outcome's on "
              f"{mean['sign_turned']:.1%} of tokens")
    if opts.out:
        saved = json.loads(opts.out.read_text()) if opts.out.exists() else {}
        runlog.write_json(opts.out, {**saved, opts.run_dir.name: kept})


if __name__ == "__main__":
    main()
