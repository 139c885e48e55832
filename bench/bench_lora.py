"""One update of the 7b preset (--lora-rank 64) on random weights of Qwen2.5-Math-7B's shape: the measured
peak memory against memory.memory_estimate_gb, and each pass's tokens a second and MFU.

    python bench/bench_lora.py --out gpu_out/lora7b.json         # on a GPU (bench/run_gpu_checks.sh)
    python bench/bench_lora.py --shape tiny --out /tmp/lora.json # the same code on CPU, a small shape

The model is built from its config alone (no download): a frozen bf16 base with the policy's and the
PRM's adapters (models.with_adapters, models.Adapter), both adapters' B set to small random numbers
(B = 0 would leave A without a gradient), gradient checkpointing and the fp32 head as train.py sets
them. The batch: --rows rows of the preset's longest sequence (1024 prompt + 3072 response tokens,
random ids), one row a micro-batch, --rows / 4 rows a mini-batch as the preset's 4 mini-batches. Passes,
in train.py's order: the reference's log-probs (the base with the adapters off), the PRM adapter's CE
update, the policy adapter's PPO update; each timed after a first, untimed round (kernel selection),
with torch.cuda.synchronize. FLOPs: 2 N a token for a forward pass, 4 N for an update (its forward
and the backward's input gradients; the adapters' own weight gradients are under 1% of N at rank 64;
the recomputed forward of checkpointing is not counted as useful work), N = the base's parameters,
attention's quadratic term left out. MFU is against --peak-tflops (dense bf16; 989 for an H100 or
H200 SXM). Memory: torch.cuda.max_memory_allocated over the whole round, against the estimate's
state + update terms (no sampling here, no allocator margin, nothing beyond tensors). The JSON file
is rewritten after each stage, so a run cut short keeps what it measured.
"""

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import config  # noqa: E402
import ddp  # noqa: E402
import memory  # noqa: E402
import microbatch  # noqa: E402
import models  # noqa: E402
import train  # noqa: E402
from rollout import Rollout  # noqa: E402

SHAPES = {  # Qwen2.5-Math-7B's published config.json; tiny: the same code in seconds on a CPU
    "7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False, max_position_embeddings=4096),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False, max_position_embeddings=4096),
}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=list(SHAPES), default="7b")
    p.add_argument("--rows", type=int, default=4, help="rows of 4096 tokens (one a micro-batch)")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="the GPU's dense bf16 TFLOP/s, for MFU")
    p.add_argument("--out", default="lora7b.json")
    opts = p.parse_args(argv)
    from transformers import AutoModelForCausalLM, Qwen2Config

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    args = config.parse_args(["--preset", "7b", "--precision", "bf16", "--rollout", "hf",
                              "--mini-batches", str(min(4, opts.rows))])
    shape = Qwen2Config(**SHAPES[opts.shape])
    report = {"device": torch.cuda.get_device_name() if cuda else "cpu", "shape": opts.shape, "rows": opts.rows,
              "tokens_per_row": args.max_prompt_len + args.max_response_len, "lora_rank": args.lora_rank}
    out = Path(opts.out)

    def save(stage):
        report["stage"] = stage
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1))
        print(f"{stage}: " + json.dumps({k: v for k, v in report.items() if k not in ("estimate_gb",)}), flush=True)

    t = time.time()
    torch.manual_seed(0)
    with torch.device(device):  # random weights straight on the device, in bf16: no fp32 copy on the way
        base = AutoModelForCausalLM.from_config(shape, dtype=torch.bfloat16)
    n = sum(p.numel() for p in base.parameters())
    shared = models.with_adapters(base, dataclasses.replace(args, process="implicit"))
    with torch.no_grad():
        for name, param in shared.named_parameters():
            if ".lora_B." in name:
                param.normal_(0.0, 1e-3)
    models.keep_head_fp32(shared)
    shared.get_base_model().gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    shared.train()
    policy, prm = models.Adapter(shared, "policy"), models.Adapter(shared, "prm")
    fused = True if cuda else None
    m = models.Models("random", None, policy, torch.optim.AdamW(policy.parameters(), lr=args.policy_lr, fused=fused),
                      prm=prm, prm_opt=torch.optim.AdamW(prm.parameters(), lr=args.prm_lr, fused=fused),
                      reference=models.Adapter(shared, None))
    report.update(parameters=n, adapter_parameters=sum(p.numel() for p in policy.parameters()),
                  build_seconds=round(time.time() - t, 1))
    save("built")

    g = torch.Generator().manual_seed(1)
    rows, prompt, response = opts.rows, args.max_prompt_len, args.max_response_len
    ro = Rollout(torch.randint(0, shape.vocab_size, (rows, prompt), generator=g), torch.ones(rows, prompt, dtype=torch.long),
                 torch.randint(0, shape.vocab_size, (rows, response), generator=g),
                 torch.ones(rows, response, dtype=torch.long), torch.zeros(rows, dtype=torch.bool))
    outcome = torch.tensor([1.0, 0.0] * (rows // 2) + [1.0] * (rows % 2), device=device)
    args = dataclasses.replace(args, micro_batch_size=1, n_samples=2 if rows % 2 == 0 else 1, prm_loss="ce")
    d = ddp.Dist(device=device)
    b = train.with_plans(train.Batch(ro, outcome, ro.response_mask.float().to(device), torch.arange(rows), [""] * rows,
                                     [""] * rows, n_train=rows, n_prm=rows), args, d)
    adv = torch.randn(b.mask.shape, generator=g).to(device) * b.mask
    tokens = rows * (prompt + response)

    def timed(fn):
        if cuda:
            torch.cuda.synchronize()
        start = time.time()
        result = fn()
        if cuda:
            torch.cuda.synchronize()
        return result, time.time() - start

    def one_round():
        logp_ref, t_ref = timed(lambda: microbatch.logprobs_no_grad(m.reference, b.rollout, args, plan=b.prm_plan))
        _, t_prm = timed(lambda: train.implicit_prm_step(m.prm, m.prm_opt, b, logp_ref, args, d))
        _, t_policy = timed(lambda: train.update_policy(args, m, b, None, adv, None, d))
        return {"reference": t_ref, "prm_update": t_prm, "policy_update": t_policy}

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    one_round()  # kernel selection, AdamW's state made
    report["first_round_peak_gb"] = torch.cuda.max_memory_allocated() / 1e9 if cuda else None
    save("first round")
    seconds = one_round()
    flops = {"reference": 2 * n * tokens, "prm_update": 4 * n * tokens, "policy_update": 4 * n * tokens}
    for k, s in seconds.items():
        report[k] = {"seconds": round(s, 3), "tokens_per_second": round(tokens / s, 1),
                     "tflops": round(flops[k] / s / 1e12, 2), "mfu": round(flops[k] / s / 1e12 / opts.peak_tflops, 4)}
    save("timed round")

    est = memory.memory_estimate_gb(n, args, shape, gpu_gb=80.0, cuda=cuda, world=1)
    state = sum(v for k, v in est.items() if k.startswith(("base", "policy", "prm")))
    update = sum(v for k, v in est.items() if k.startswith("  update:"))
    report["estimate_gb"] = est
    report["estimated_state_plus_update_gb"] = round(state + update, 2)
    report["measured_peak_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 2) if cuda else None
    save("memory")
    return report


if __name__ == "__main__":
    main()
