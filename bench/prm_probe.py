"""Does the implicit PRM learn to rank correct above wrong responses? A controlled probe.

    python bench/prm_probe.py                                  # CE loss, beta 0.05, lr 1e-4 (the paper's beta)
    python bench/prm_probe.py --beta 1.0                       # the embedded default's beta
    python bench/prm_probe.py --loss dpo --lr 3e-4
    python bench/prm_probe.py --sft-steps 400 --steps 40 --prompts 64 --seed 0

The policy is frozen at the SFT checkpoint, so the only thing that moves is the PRM: it is trained
online (one AdamW step per batch, as in train.py) on a stream of the SFT model's rollouts of fresh
prompts (groups kept by the [0.2, 0.8] filter), and every 5 steps its pairwise accuracy
(prime.prm_pairwise_accuracy, Fig. 5's metric) is measured on a FIXED held-out set: 256 other
prompts x 4 samples, the mixed groups only. That removes the two sources of noise of the loop's
per-batch accuracy (a new small batch every step, and a moving policy).

The rollouts are generated once per (SFT checkpoint, steps, prompts, seed) and cached in
--cache-dir, so a sweep over beta / lr / loss trains only PRMs. It prints one JSON line:
held-out accuracy at steps 0, 5, 10, ... and the mean on-batch accuracy of the last 20 steps.
"""

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import config  # noqa: E402
import microbatch  # noqa: E402
import prime  # noqa: E402
import toy_task  # noqa: E402
import verify  # noqa: E402
from rollout import HFRollout  # noqa: E402


def rollouts(model, tokenizer, problems, n: int, max_new_tokens: int = 48):
    sampler = HFRollout(model, tokenizer, max_new_tokens)
    ro = sampler.generate([tokenizer(p.prompt)["input_ids"] for p in problems], n=n)
    scores = verify.score_batch(sampler.decode(ro), [p.answer for p in problems for _ in range(n)],
                                ["math"] * (len(problems) * n))
    return ro, torch.tensor([s.reward for s in scores])


def kept(ro, outcome, n: int):
    rows = prime.keep_groups(outcome, n).repeat_interleave(n).nonzero().squeeze(-1)
    return ro.select(rows), outcome[rows]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sft-steps", type=int, default=400)
    parser.add_argument("--cache-dir", default=".cache")
    parser.add_argument("--steps", type=int, default=40, help="PRM updates")
    parser.add_argument("--prompts", type=int, default=64, help="prompts per batch (x 4 samples)")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--beta", type=float, default=0.05)
    parser.add_argument("--loss", default="ce", choices=("ce", "dpo"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=48, help="rollout length (train.py's default: 96)")
    parser.add_argument("--out", type=Path, default=None, help="a JSON file to add this setting's line to")
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    n = 4
    path = toy_task.sft_checkpoint(Path(args.cache_dir), args.sft_steps)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    pool = Path(args.cache_dir) / (f"prm-probe-rollouts-{path.name}-{args.steps}x{args.prompts}-seed{args.seed}"
                                   f"{'' if args.max_new_tokens == 48 else f'-len{args.max_new_tokens}'}.pt")
    if not pool.exists():
        pool.parent.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(args.seed)
        stream = [rollouts(reference, tokenizer, toy_task.make_problems(args.prompts, seed=777 + 1000 * args.seed + i), n,
                           args.max_new_tokens) for i in range(args.steps)]
        held = rollouts(reference, tokenizer, toy_task.make_problems(256, seed=4242), n, args.max_new_tokens)
        torch.save({"stream": stream, "held": held}, str(pool) + ".tmp")
        os.replace(str(pool) + ".tmp", pool)
    data = torch.load(pool, weights_only=False)
    held, held_outcome = kept(*data["held"], n)
    held_mask = held.response_mask.float()
    big = config.Args(micro_batch_size=256)  # no-grad passes: 256 responses at a time
    held_ref = microbatch.logprobs_no_grad(reference, held, big)

    prm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).train()
    optimizer = torch.optim.AdamW(prm.parameters(), lr=args.lr, weight_decay=0.0)

    def held_accuracy() -> float:
        log_ratio = prime.implicit_process_reward(microbatch.logprobs_no_grad(prm, held, big), held_ref, held_mask, 1.0)
        return prime.prm_pairwise_accuracy(log_ratio.sum(-1), held_outcome, n).item()

    curve, on_batch = [held_accuracy()], []
    for i, (ro, outcome) in enumerate(data["stream"]):
        batch, outcome = kept(ro, outcome, n)
        mask = batch.response_mask.float()
        logp_ref = microbatch.logprobs_no_grad(reference, batch, big)
        logp = microbatch.response_logprobs(prm, batch)
        on_batch.append(prime.prm_pairwise_accuracy(((logp.detach() - logp_ref) * mask).sum(-1), outcome, n).item())
        if args.loss == "ce":
            loss = prime.prm_ce_loss(logp, logp_ref, mask, outcome, args.beta)
        else:
            loss = prime.prm_dpo_loss(logp, logp_ref, mask, outcome, args.beta, n)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(prm.parameters(), 10.0)  # train.py's --prm-grad-clip
        optimizer.step()
        if (i + 1) % 5 == 0:
            curve.append(held_accuracy())
    line = {"loss": args.loss, "beta": args.beta, "lr": args.lr, "held_out_groups": len(held_outcome) // n,
            "start": path.name, "max_new_tokens": args.max_new_tokens,
            "held_out_accuracy_every_5_steps": [round(a, 3) for a in curve],
            "on_batch_accuracy_last_20": round(sum(on_batch[-20:]) / len(on_batch[-20:]), 3)}
    print(json.dumps(line))
    if args.out:  # one entry per (start, length, loss, beta, lr), the newest kept
        import runlog
        saved = json.loads(args.out.read_text()) if args.out.exists() else {}
        key = f"{path.name} len{args.max_new_tokens} {args.loss} beta {args.beta} lr {args.lr}"
        runlog.write_json(args.out, {**saved, key: line})


if __name__ == "__main__":
    main()
