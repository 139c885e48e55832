"""Time each phase of a few PRIME steps of a 0.5B-sized Qwen2 on one GPU (random weights, bf16).

    python bench/bench_gpu.py                                # vLLM rollouts (needs vllm), 3 steps
    python bench/bench_gpu.py --rollout hf                   # HF generate instead
    python bench/bench_gpu.py --prompts 64 --n 4 --prompt-len 512 --response-len 2048 --steps 3
    python bench/bench_gpu.py --vllm-sleep                   # vLLM frees its memory during updates

Not run in CI (it needs a CUDA GPU and exits at once without one). The model has Qwen2.5-0.5B's
shapes (hidden 896, 24 layers, 14 heads, 2 KV heads, intermediate 4864, vocab 151936), random
weights, saved to a temporary folder for vLLM to load; prompts are random token ids, and since a
random model almost never samples EOS, every response runs to --response-len: the timing is of
full-length responses. Outcome rewards are random 0/1 (verification runs on CPU and is not timed).

Each step runs the phases of train.py's loop with train.py's own functions (response_logprobs,
run_update, prime.*), in the order of the loop:
    rollout        sampler.generate, K samples per prompt
    old/ref        no-grad log-probs of the policy and the frozen reference
    prm            implicit PRM forward + cross-entropy update (prime.prm_ce_loss)
    advantages     RLOO of outcome and process rewards, whitened
    policy         PPO clip update (prime.ppo_clip_loss)
    sync           push_weights into the engine (vLLM; waking it when --vllm-sleep)
For each phase it prints mean seconds over the steps after the first (warm-up), tokens/s (response
tokens generated for rollout; prompt+response tokens through the model for the others) and peak
memory: torch's peak allocation during the phase, and the GPU's used memory at its end (this one
also counts vLLM's KV cache and what the caching allocator holds).

Simplification: policy, PRM and reference are all bf16 here (train.py keeps policy and PRM in fp32
for AdamW); pass --dtype float32 to measure that instead.
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

QWEN25_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                  rope_theta=1_000_000.0, tie_word_embeddings=True, rms_norm_eps=1e-6)
EOS = 151643  # Qwen2.5's <|endoftext|>; only an id here: the bench feeds and reads token ids


def build_models(path: Path, shapes: dict, dtype: torch.dtype, device):
    """Random policy saved for vLLM; PRM and reference start from the same weights (as from SFT)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    import toy_task

    config = Qwen2Config(**shapes, bos_token_id=EOS, eos_token_id=EOS, pad_token_id=EOS, torch_dtype=str(dtype)[6:])
    torch.manual_seed(0)
    policy = Qwen2ForCausalLM(config).to(dtype)
    policy.save_pretrained(path)
    toy_task.build_tokenizer().save_pretrained(path)  # vLLM loads one; nothing here decodes text
    prm = Qwen2ForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    reference = Qwen2ForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval().requires_grad_(False)
    return policy.to(device), prm, reference


def run(args, device, shapes: dict = QWEN25_05B) -> dict:
    """The timed steps; returns {phase: {"s": [...], "tokens": [...], "peak_gib": ..., "used_gib": ...}}."""
    import prime
    import config
    import ddp
    import microbatch
    import train
    from rollout import HFRollout, VLLMRollout

    dtype = getattr(torch, args.dtype)
    tmp = tempfile.TemporaryDirectory()
    path = Path(tmp.name) / "qwen2-0.5b-random"
    policy, prm, reference = build_models(path, shapes, dtype, device)
    tokenizer = SimpleNamespace(eos_token_id=EOS, pad_token_id=EOS)  # all the samplers read
    if args.rollout == "vllm":
        sampler = VLLMRollout(str(path), tokenizer, args.response_len, max_model_len=args.prompt_len + args.response_len,
                              seed=0, dtype=args.dtype, gpu_memory_utilization=args.vllm_gpu_memory_utilization,
                              sleep=args.vllm_sleep)
    else:
        sampler = HFRollout(policy, tokenizer, args.response_len)
    policy_opt = torch.optim.AdamW(policy.parameters(), lr=1e-6, weight_decay=0.01)
    prm_opt = torch.optim.AdamW(prm.parameters(), lr=1e-6)
    loop_args = config.Args(micro_batch_size=args.micro_batch_size, mini_batches=1, n_samples=args.n, beta=0.05)
    d = ddp.Dist(device=device)
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, shapes["vocab_size"], (args.prompts, args.prompt_len), generator=generator)
    results = {}

    def phase(name, tokens):
        """Context manager: time a phase, its token count and its memory."""
        class Phase:
            def __enter__(self):
                if device.type == "cuda":
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                self.start = time.perf_counter()

            def __exit__(self, *exc):
                if device.type == "cuda":
                    torch.cuda.synchronize()
                r = results.setdefault(name, {"s": [], "tokens": [], "peak_gib": 0.0, "used_gib": 0.0})
                r["s"].append(time.perf_counter() - self.start)
                r["tokens"].append(tokens() if callable(tokens) else tokens)
                if device.type == "cuda":
                    free, total = torch.cuda.mem_get_info()
                    r["peak_gib"] = max(r["peak_gib"], torch.cuda.max_memory_allocated() / 2**30)
                    r["used_gib"] = max(r["used_gib"], (total - free) / 2**30)
        return Phase()

    for step in range(args.steps):
        box = {}
        with phase("rollout", lambda: int(box["ro"].response_mask.sum())):
            box["ro"] = sampler.generate(prompts.tolist(), n=args.n)
        ro = box["ro"]
        B, T = len(ro), ro.prompt_ids.shape[1] + ro.response_ids.shape[1]
        mask = ro.response_mask.to(device).to(torch.float32)
        outcome = torch.randint(0, 2, (B,), generator=generator).float().to(device)
        with phase("old/ref", 2 * B * T):
            logp_old = microbatch.logprobs_no_grad(policy, ro, loop_args)
            logp_ref = microbatch.logprobs_no_grad(reference, ro, loop_args)
        with phase("prm", B * T):  # train.py's own PRM step: forward for rewards + CE update
            batch = train.with_plans(train.Batch(ro, outcome, mask, None, [], [], B, B), loop_args, d)
            log_ratio, _ = train.implicit_prm_step(prm, prm_opt, batch, logp_ref, loop_args, d)
        with phase("advantages", B * T):
            process = prime.normalize_process_reward(log_ratio, mask)
            adv = prime.whiten(prime.rloo_advantage(process, outcome, mask, args.n, 1.0, "official"), mask)

        def policy_loss_fn(mb):
            logp = microbatch.response_logprobs(policy, mb.rollout(ro))
            return prime.ppo_clip_loss(logp, mb.rows_of(logp_old), mb.rows_of(adv), mb.rows_of(mask), 0.2)

        with phase("policy", B * T):
            microbatch.run_update(policy, policy_opt, policy_loss_fn, lambda mb: float(mb.rows_of(mask).sum()),
                                  microbatch.plan_update(ro, B, loop_args, d), loop_args, d, 1.0)
        with phase("sync", sum(p.numel() for p in policy.parameters())):
            sampler.push_weights(policy)
        print(f"step {step + 1}/{args.steps}: " + ", ".join(f"{k} {v['s'][-1]:.2f}s" for k, v in results.items()),
              flush=True)
    tmp.cleanup()
    return results


def report(results: dict) -> None:
    print(f"\n{'phase':11s} {'seconds':>8s} {'tokens/s':>12s} {'peak alloc GiB':>15s} {'GPU used GiB':>13s}")
    for name, r in results.items():
        seconds = r["s"][1:] or r["s"]  # the first step warms up (allocation, kernel selection)
        tokens = r["tokens"][1:] or r["tokens"]
        per_s = statistics.mean(tokens) / statistics.mean(seconds)
        rate = f"{per_s / 1e9:.2f}G par/s" if name == "sync" else f"{per_s:.0f}"  # sync moves parameters
        print(f"{name:11s} {statistics.mean(seconds):8.2f} {rate:>12s} {r['peak_gib']:15.2f} {r['used_gib']:13.2f}")
    total = sum(statistics.mean(r["s"][1:] or r["s"]) for r in results.values())
    print(f"{'step':11s} {total:8.2f}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollout", default="vllm", choices=("vllm", "hf"))
    parser.add_argument("--prompts", type=int, default=32, help="prompts per step")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt (K)")
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--response-len", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=3, help="the first one is a warm-up")
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--vllm-gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--vllm-sleep", action="store_true")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench/bench_gpu.py needs a CUDA GPU (torch.cuda.is_available() is False); "
                         "for CPU numbers use bench/bench_rollout.py")
    if args.rollout == "vllm":
        import importlib.util
        if importlib.util.find_spec("vllm") is None:
            raise SystemExit("--rollout vllm: vLLM is not installed (see README: vLLM on a GPU), or pass --rollout hf")
    print(f"{torch.cuda.get_device_name()}: Qwen2 0.5B shapes, random weights, {args.dtype}; {args.prompts} prompts x "
          f"{args.n} samples, prompt {args.prompt_len} + response {args.response_len} tokens, rollout {args.rollout}")
    report(run(args, torch.device("cuda")))


if __name__ == "__main__":
    main()
