"""GPU-only checks (skipped without CUDA; CI has none). Run them on a GPU machine with

    python -m pytest -q tests/test_gpu.py

They check what the CPU tests cannot: the chunked log-prob kernel on CUDA in bf16 at a real
vocabulary size (values, gradients, and that it never holds a full float32 log-softmax), the
recomputed old log-probs against HF generate's on the GPU, and train.py's loop on CUDA.
"""

import json

import pytest
import torch

import microbatch
import prime
import toy_task
import train
from rollout import HFRollout

from conftest import SFT_STEPS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_token_logprobs_on_cuda_bf16_real_vocab_values_grads_and_memory():
    torch.manual_seed(0)
    B, T, V = 4, 512, 151936  # Qwen2.5's vocabulary
    logits = (torch.randn(B, T, V, device="cuda") * 3).to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, V, (B, T), device="cuda")
    weights = torch.randn(B, T, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    ours = prime.token_logprobs(logits, labels)
    (ours * weights).sum().backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    full_fp32 = B * T * V * 4
    # the gradient is itself a bf16 (B, T, V) tensor, half a float32 log-softmax; no float32 one is held
    assert extra < 0.75 * full_fp32, f"peak extra {extra / 2**30:.2f} GiB"
    grad_ours = logits.grad.float()
    logits.grad = None
    x = logits.detach().double().requires_grad_()
    naive = torch.log_softmax(x, -1).gather(-1, labels[..., None])[..., 0]
    (grad_naive,) = torch.autograd.grad((naive * weights.double()).sum(), x)
    assert torch.allclose(ours.double(), naive, atol=1e-4)
    assert torch.allclose(grad_ours.double(), grad_naive, atol=2e-2)  # the gradient is stored in bf16


def test_recomputed_old_logprobs_equal_hf_generate_on_cuda(cache_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path = toy_task.sft_checkpoint(cache_dir, SFT_STEPS)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda()
    problems = toy_task.make_problems(16, seed=5)
    prompts = [tokenizer(p.prompt)["input_ids"] for p in problems]
    prompts[0] = prompts[0][-3:]
    torch.manual_seed(0)
    ro = HFRollout(model, tokenizer, max_new_tokens=32, temperature=1.0).generate(prompts, n=2, return_logprobs=True)
    recomputed = microbatch.response_logprobs(model, ro).cpu()
    mask = ro.response_mask.bool()
    assert ro.prompt_mask[:, 0].min() == 0
    assert torch.allclose(recomputed[mask], ro.sampler_logprobs[mask].cpu(), atol=1e-3)


@pytest.mark.parametrize("flags", [[], ["--process", "step", "--estimator", "pass"]], ids=["prime", "pass-step"])
def test_train_loop_on_cuda(flags, cache_dir, tmp_path):
    run_dir = train.main(["--cache-dir", str(cache_dir), "--sft-steps", str(SFT_STEPS), "--out-dir", str(tmp_path),
                          "--run-name", "gpu", "--steps", "3", "--rollout", "hf", "--eval-problems", "32", *flags])
    config = json.loads((run_dir / "config.json").read_text())
    metrics = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert config["world_size"] == 1 and len(metrics) == 3
    summary = json.loads((run_dir / "summary.json").read_text())
    assert 0.0 <= summary["end_accuracy"] <= 1.0


def test_offloaded_moments_wait_on_the_cpu_and_change_no_update(cache_dir):
    """--offload-optimizer on CUDA: after an update the policy's AdamW moments are in CPU memory (the GPU
    holds 8 bytes a parameter less) and the weights are bitwise those of the update that kept them."""
    import config
    import ddp
    import models as models_module
    results = {}
    for offload in (False, True):
        args = config.parse_args(["--sft-steps", str(SFT_STEPS), "--cache-dir", str(cache_dir), "--rollout", "hf",
                                  "--process", "none", *(["--offload-optimizer"] if offload else [])])
        d = ddp.Dist(device=torch.device("cuda"))
        m = models_module.build_models(args, d)
        torch.manual_seed(0)
        tokenizer = m.tokenizer
        ro = HFRollout(ddp.unwrap(m.policy), tokenizer, 48).generate(
            [tokenizer(p.prompt)["input_ids"] for p in toy_task.make_problems(4, seed=3)], n=2)
        b = train.with_plans(train.Batch(ro, torch.zeros(8, device="cuda"), ro.response_mask.float().cuda(),
                                         torch.arange(8), [""] * 8, [""] * 8, 8, 8), args, d)
        adv = torch.randn(b.mask.shape, generator=torch.Generator().manual_seed(1)).cuda() * b.mask
        for _ in range(2):
            train.update_policy(args, m, b, None, adv, None, d)
        torch.cuda.synchronize()
        moments = [t for state in m.policy_opt.state.values() for t in state.values() if t.dim()]
        assert moments and all(t.device.type == ("cpu" if offload else "cuda") for t in moments)
        results[offload] = ([p.detach().cpu() for p in m.policy.parameters()], torch.cuda.memory_allocated())
        del m, moments, b, ro
        torch.cuda.empty_cache()
    n = sum(p.numel() for p in results[True][0])
    for a, c in zip(results[False][0], results[True][0]):
        assert torch.equal(a, c)
    print(f"allocated after the update: kept {results[False][1] / 1e6:.1f} MB, offloaded {results[True][1] / 1e6:.1f} MB "
          f"({8 * n / 1e6:.1f} MB of moments)")
