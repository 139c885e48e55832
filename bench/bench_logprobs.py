"""Peak memory and time of prime.token_logprobs against the naive log_softmax, forward + backward.

    python bench/bench_logprobs.py                      # CPU: (1, 2048, 152064) bf16 logits
    python bench/bench_logprobs.py --batch 8 --seq 4096 # the issue's shape (needs a GPU: 10 GB of logits)

Each variant runs in a fresh subprocess so its peak is its own: on CUDA the peak is
torch.cuda.max_memory_allocated; on CPU it is the process's peak resident set (ru_maxrss) minus the
resident set after the logits were made, i.e. the extra memory the log-prob computation needed.
"""

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def run_one(variant: str, batch: int, seq: int, vocab: int, device: str) -> dict:
    import torch

    import prime

    torch.manual_seed(0)
    logits = torch.randn(batch, seq, vocab, device=device, dtype=torch.bfloat16).requires_grad_()  # no float32 copy
    labels = torch.randint(0, vocab, (batch, seq), device=device)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    if variant == "chunked":
        logp = prime.token_logprobs(logits, labels)
    else:
        logp = torch.log_softmax(logits.float(), -1).gather(-1, labels[..., None]).squeeze(-1)
    logp.sum().backward()
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    return {"variant": variant, "seconds": time.perf_counter() - start, "extra_peak_gib": peak / 2**30,
            "logits_gib": logits.numel() * 2 / 2**30}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=152064)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    import torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.child:
        print(json.dumps(run_one(args.child, args.batch, args.seq, args.vocab, device)))
        return
    print(f"logits ({args.batch}, {args.seq}, {args.vocab}) bf16 on {device}, forward + backward")
    for variant in ("chunked", "naive"):
        cmd = [sys.executable, __file__, "--child", variant, "--batch", str(args.batch),
               "--seq", str(args.seq), "--vocab", str(args.vocab)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{variant:>8}: failed (exit {proc.returncode}; out of memory?) {proc.stderr[-300:]}")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{variant:>8}: extra peak {r['extra_peak_gib']:.2f} GiB beyond the {r['logits_gib']:.2f} GiB "
              f"of logits, {r['seconds']:.2f} s")


if __name__ == "__main__":
    main()
