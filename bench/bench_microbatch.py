"""Fixed-size vs token-budget micro-batches: padding share, time of each training pass, peak memory.

    python bench/bench_microbatch.py                        # CPU: the two cases below
    python bench/bench_microbatch.py --case qwen1.5b        # on a GPU: 1.5B shapes, and the estimate
    python bench/bench_microbatch.py --case toy --budget 2048 --micro-batch-size 16

Cases (each a batch with a realistic spread of response lengths):
- `toy`: the embedded task's shipped SFT model sampling 32 prompts x 4 of 2-10 operations (longer
  chains than it was trained on, so longer and more varied responses) with up to 192 tokens.
- `qwen0.5b`: a randomly initialised Qwen2 with Qwen2.5-0.5B's widths (hidden 896, 14 heads, 2 KV
  heads, intermediate 4864, vocabulary 151936) and `--layers` layers (24 in the real model; 4 by
  default on CPU to keep a pass under a minute), on `--rows` rows: prompts of 30-200 tokens, and
  responses long-tailed as RL responses are (log-normal, median 150 tokens, cut at 1024).
- `qwen1.5b` (meant for a GPU): the same at Qwen2.5-1.5B's widths (hidden 1536, 12 heads, 2 KV heads,
  intermediate 8960, 28 layers), 64 rows, responses cut at 3072.

Each mode runs in a fresh subprocess with train.py's own code, as train.py runs it: a process group of
one, so policy, PRM (fp32 weights, gradients and AdamW state, DDP-wrapped, train mode, checkpointing
engaged when asked) and the frozen fp32 reference come from models.build_models; --precision bf16 (the
default on a GPU) runs the passes under bf16 autocast. Passes: old + reference log-probs in the
micro-batches of the updates they pair with (`microbatch.logprobs_no_grad`), the PRM's CE update
(`train.implicit_prm_step`) and the policy's PPO update (`train.update_policy`). Padding share = 1 -
real tokens / computed tokens, where a micro-batch computes rows x its longest prompt + response tokens
(microbatch.forward_sequences); "before" is the layout this replaced: every micro-batch as wide as the
whole batch's widest prompt plus its widest response. The policy update's TFLOP/s counts 6 FLOPs per
parameter and computed token (8 with checkpointing); on a GPU its MFU is against the H200's 790 TFLOP/s
of dense bf16. Peak memory is torch.cuda.max_memory_allocated on a GPU, next to memory.memory_estimate_gb's
state + update for the same settings (no sampling here, no allocator margin), and the process's peak
resident set (ru_maxrss) on CPU, where it includes the model state.
"""

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

QWEN = {  # Qwen2.5's published configs (hidden, heads, kv heads, intermediate, layers)
    "qwen0.5b": dict(hidden_size=896, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864,
                     num_hidden_layers=24, tie_word_embeddings=True),
    "qwen1.5b": dict(hidden_size=1536, num_attention_heads=12, num_key_value_heads=2, intermediate_size=8960,
                     num_hidden_layers=28, tie_word_embeddings=True),
}


def make_batch(case: str, opts, device):
    """(model path, Rollout, outcome) for a case; the Rollout is built on CPU, as train.py's is."""
    import torch

    import toy_task
    from rollout import HFRollout, Rollout

    if case == "toy":
        from transformers import AutoModelForCausalLM, AutoTokenizer
        path = toy_task.sft_checkpoint(Path(opts.cache_dir), 0)
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        torch.manual_seed(0)
        problems = toy_task.make_problems(32, seed=5, min_ops=2, max_ops=10)
        ro = HFRollout(model, tokenizer, max_new_tokens=192).generate(
            [tokenizer(p.prompt)["input_ids"] for p in problems], n=4)
        return str(path), ro, torch.randint(0, 2, (len(ro),)).float()
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
    path = Path(opts.work) / f"{case}-{opts.layers}"
    if not (path / "config.json").exists():
        config = Qwen2Config(vocab_size=151936, max_position_embeddings=8192, **dict(
            QWEN[case], num_hidden_layers=opts.layers or QWEN[case]["num_hidden_layers"]))
        torch.manual_seed(0)
        Qwen2ForCausalLM(config).save_pretrained(path)
        toy_task.build_tokenizer().save_pretrained(path)  # ids only matter as ids: any tokenizer will do
        AutoTokenizer.from_pretrained(path)
    gen = torch.Generator().manual_seed(1)
    rows, max_response = opts.rows, opts.max_response_len
    prompt_lens = torch.randint(30, 201, (rows,), generator=gen)
    response_lens = (150 * torch.exp(0.8 * torch.randn(rows, generator=gen))).long().clamp(4, max_response)
    P, R = int(prompt_lens.max()), int(response_lens.max())
    prompt_mask = (torch.arange(P)[None] >= P - prompt_lens[:, None]).long()
    response_mask = (torch.arange(R)[None] < response_lens[:, None]).long()
    ids = lambda mask: torch.randint(10, 151000, mask.shape, generator=gen) * mask
    ro = Rollout(ids(prompt_mask), prompt_mask, ids(response_mask), response_mask, response_lens == max_response)
    return str(path), ro, torch.randint(0, 2, (rows,), generator=gen).float()


def run_one(case: str, mode: str, opts) -> dict:
    """One mode in this (child) process, built and run by train.py's own code: a process group of one (so
    the models are DDP-wrapped, as under torchrun), models.build_models (train mode, checkpointing, the
    fp32 head under bf16, the reference as load_frozen loads it), the passes paired with their updates,
    train.implicit_prm_step and train.update_policy."""
    import os
    import socket

    import torch
    from transformers import AutoConfig

    import config
    import ddp
    import microbatch
    import memory
    import models
    import prime
    import train

    with socket.socket() as sock:  # a group of one: DDP as train.py has it under torchrun
        sock.bind(("127.0.0.1", 0))
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(sock.getsockname()[1]))
    d = ddp.setup_distributed()
    device = d.device
    path, ro, outcome = make_batch(case, opts, device)
    flags = ["--model", path, "--rollout", "hf", "--n-samples", "4", "--precision", opts.precision,
             "--micro-batch-size", str(opts.micro_batch_size), "--max-prompt-len", str(int(ro.prompt_ids.shape[1])),
             "--max-response-len", str(int(ro.response_ids.shape[1])), "--max-memory-gb", "1e6"]
    if mode != "fixed":  # "budget=N"
        flags += ["--max-tokens-per-micro-batch", mode.split("=")[1]]
    if opts.gradient_checkpointing:
        flags.append("--gradient-checkpointing")
    args = config.parse_args(flags)
    m = models.build_models(args, d)
    mask = ro.response_mask.float().to(device)
    outcome = outcome.to(device)
    batch = train.with_plans(train.Batch(ro, outcome, mask, torch.arange(len(ro)), [""] * len(ro), [""] * len(ro),
                                         len(ro), len(ro)), args, d)

    plan = batch.plan
    real = int(ro.prompt_mask.sum() + ro.response_mask.sum())
    lengths = ro.prompt_mask.sum(1) + ro.response_mask.sum(1)
    computed = sum(len(mb.rows) * int(lengths[mb.rows].max()) for mb in plan[0])  # rows x longest sequence
    whole = len(ro) * (ro.prompt_ids.shape[1] + ro.response_ids.shape[1])  # before: all padded to the batch's widest
    result = dict(case=case, mode=mode, rows=len(ro), micro_batches=len(plan[0]), real_tokens=real,
                  computed_tokens=computed, padding_share=1 - real / computed,
                  padding_share_untrimmed=1 - real / whole, precision=args.precision, seconds={})

    def timed(name, fn):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        result["seconds"][name] = time.perf_counter() - start
        return out

    policy = ddp.unwrap(m.policy)
    for repeat in range(opts.repeats):  # the first repeat warms up kernels and allocator; the last is kept
        logp_old, logp_ref = timed("old+ref logprobs", lambda: (
            microbatch.logprobs_no_grad(policy, ro, args, args.temperature, plan),
            microbatch.logprobs_no_grad(m.reference, ro, args, plan=batch.prm_plan)))
        timed("prm update", lambda: train.implicit_prm_step(m.prm, m.prm_opt, batch, logp_ref, args, d))
        adv = prime.whiten(torch.randn(mask.shape, device=device) * mask, mask)
        timed("policy update", lambda: train.update_policy(args, m, batch, logp_old, adv, None, d))
    n_params = sum(p.numel() for p in policy.parameters())
    # the policy update's model FLOPs: 6 per parameter and computed token (forward and backward), 2 more
    # when checkpointing recomputes the forward; against the H200's dense bf16 peak, 790 TFLOP/s
    flops = (8 if args.gradient_checkpointing else 6) * n_params * computed
    result["policy_update_tflops"] = flops / result["seconds"]["policy update"] / 1e12
    if device.type == "cuda":
        result["peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
        est = memory.memory_estimate_gb(n_params, args, AutoConfig.from_pretrained(path), world=1)
        # what this bench holds: the model state and an update (no sampling here), before the allocator's margin
        result["estimate_gb"] = sum(v for k, v in est.items()
                                    if not k.startswith(("  ", "phase", "allocator", "beyond", "total"))) \
            + max(v for k, v in est.items() if k.startswith("phase: update") or k.startswith("phase: optimizer"))
    else:
        result["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    m = policy = None  # the DDP models go before the group
    import gc
    gc.collect()  # no DDP model may outlive the group (pytorch#56297)
    ddp.close(d)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", nargs="+", default=None, choices=["toy", "qwen0.5b", "qwen1.5b"],
                        help="default: toy and qwen0.5b on CPU, qwen1.5b on a GPU")
    parser.add_argument("--micro-batch-size", type=int, default=None, help="fixed mode's rows (default: 64 toy, 4 qwen)")
    parser.add_argument("--budget", type=int, nargs="+", default=None,
                        help="budget modes' --max-tokens-per-micro-batch (default: 4096 2048 toy; 2800 1400 qwen0.5b; "
                             "16384 8192 qwen1.5b)")
    parser.add_argument("--rows", type=int, default=None, help="qwen cases: rows of the batch (default 8 / 64)")
    parser.add_argument("--layers", type=int, default=None, help="qwen cases: decoder layers (default 4 on CPU, all on GPU)")
    parser.add_argument("--max-response-len", type=int, default=None, help="qwen cases (default 1024 / 3072)")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--precision", choices=["bf16", "fp32"], default=None, help="default: bf16 on a GPU, fp32 on CPU")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--cache-dir", default=str(REPO / ".cache"), help="the embedded SFT checkpoint cache")
    parser.add_argument("--work", default=str(REPO / ".cache" / "bench_microbatch"), help="where random models go")
    parser.add_argument("--out", default=None, help="also write the results' JSON here")
    parser.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    import torch
    gpu = torch.cuda.is_available()
    if opts.child:
        case = opts.child[0]
        big = case == "qwen1.5b"
        defaults = dict(micro_batch_size=64 if case == "toy" else 4, rows=64 if big else 8,
                        layers=0 if gpu else 4, max_response_len=3072 if big else 1024,
                        precision="bf16" if gpu else "fp32")
        for k, v in defaults.items():
            if getattr(opts, k) is None:
                setattr(opts, k, v)
        print(json.dumps(run_one(case, opts.child[1], opts)))
        return
    cases = opts.case or (["qwen1.5b"] if gpu else ["toy", "qwen0.5b"])
    forward, skip = [], False  # the flags for the children, without --case and --budget
    for a in sys.argv[1:]:
        skip = a in ("--case", "--budget", "--out") or (skip and not a.startswith("--"))
        if not skip:
            forward.append(a)
    budgets = {"toy": [4096, 2048], "qwen0.5b": [2800, 1400], "qwen1.5b": [16384, 8192]}
    results = []
    for case in cases:
        for mode in ["fixed"] + [f"budget={b}" for b in opts.budget or budgets[case]]:
            proc = subprocess.run([sys.executable, __file__, *forward, "--child", case, mode],
                                  capture_output=True, text=True, cwd=REPO)
            if proc.returncode:
                sys.exit(f"{case} {mode} failed:\n{proc.stderr[-3000:]}")
            results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            r = results[-1]
            memory = (f"peak {r['peak_gb']:.2f} GB (estimate {r['estimate_gb']:.2f} GB, "
                      f"{r['estimate_gb'] / r['peak_gb'] - 1:+.0%})" if "peak_gb" in r else
                      f"peak RSS {r['peak_rss_gb']:.2f} GB")
            if mode == "fixed":
                print(f"{case:9s} every micro-batch as wide as the batch's widest row (before): padding "
                      f"{r['padding_share_untrimmed']:.1%}")
            mfu = f", MFU {r['policy_update_tflops'] / 790:.1%}" if "peak_gb" in r else ""
            print(f"{case:9s} {mode:11s} {r['precision']} {r['rows']} rows in {r['micro_batches']} micro-batches, padding "
                  f"{r['padding_share']:.1%} of {r['computed_tokens']} computed tokens; " +
                  ", ".join(f"{k} {v:.2f}s" for k, v in r["seconds"].items()) +
                  f"; policy update {r['policy_update_tflops']:.2f} TFLOP/s{mfu}; {memory}", flush=True)
    print(json.dumps(results, indent=1))
    if opts.out:
        Path(opts.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
