"""models.memory_estimate_gb against the live tensor bytes of real updates (tests/live_bytes.py), on CPU:
a Qwen2 of small widths run through train.update_policy exactly as train.py builds it (build_models:
train mode, checkpointing, the fp32 head under bf16), on a batch of rows at the flags' longest prompt
and response (the micro-batch the estimate sizes), with fixed rows and a token budget, checkpointing
on and off, fp32 and bf16, and once under DDP (a gloo group of one)."""

import socket
import sys
from pathlib import Path

import pytest
import torch

import config
import ddp
import models
import train
from rollout import Rollout

sys.path.insert(0, str(Path(__file__).parent))
from live_bytes import LiveBytes  # noqa: E402

PROMPT, RESPONSE = 96, 160


@pytest.fixture(scope="module")
def qwen_path(tmp_path_factory):
    """A randomly initialised Qwen2 with small widths (4 layers, 4 heads over 2 KV heads, vocab 4096)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    import toy_task
    path = tmp_path_factory.mktemp("qwen")
    cfg = Qwen2Config(vocab_size=4096, hidden_size=128, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      tie_word_embeddings=True)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    toy_task.build_tokenizer().save_pretrained(path)  # ids are ids: any tokenizer will do
    return path


def full_batch(rows: int, vocab: int, prompt: int) -> train.Batch:
    """Rows of the longest response the flags allow, after prompts of `prompt` tokens."""
    g = torch.Generator().manual_seed(0)
    ones = lambda n: torch.ones(rows, n, dtype=torch.long)  # noqa: E731
    ro = Rollout(torch.randint(3, vocab, (rows, prompt), generator=g), ones(prompt),
                 torch.randint(3, vocab, (rows, RESPONSE), generator=g), ones(RESPONSE),
                 torch.zeros(rows, dtype=torch.bool))
    return train.Batch(ro, torch.zeros(rows), ro.response_mask.float(), torch.arange(rows), [""] * rows,
                       [""] * rows, n_train=rows, n_prm=rows)


def measured(args, d=None):
    """(estimate dict in bytes, model-state bytes of the policy, live bytes tracked over its second update,
    parameters) on the batch whose micro-batches the estimate sizes: with fixed rows, rows at the longest
    prompt and response; with a token budget, response-only rows (a one-token prompt) filling it, the
    most positions through the LM head a budget can hold."""
    d = d or ddp.Dist()
    m = models.build_models(args, d)
    policy = ddp.unwrap(m.policy)
    b = full_batch(8, policy.config.vocab_size, 1 if args.max_tokens_per_micro_batch else PROMPT)
    adv = torch.randn(b.mask.shape, generator=torch.Generator().manual_seed(1)) * b.mask
    train.update_policy(args, m, b, None, adv, (None, None), None, 0, d)  # AdamW's state exists after this
    state = sum(t.numel() * t.element_size() for p in policy.parameters()
                for t in [p, p.grad, *m.policy_opt.state[p].values()] if t is not None and t.dim())
    with LiveBytes() as tracked:
        train.update_policy(args, m, b, None, adv, (None, None), None, 1, d)
    n = sum(p.numel() for p in policy.parameters())
    est = {k: v * 1e9 for k, v in models.memory_estimate_gb(n, args, policy.config, cuda=False).items()}
    wrapped = isinstance(m.policy, torch.nn.parallel.DistributedDataParallel)
    del m
    return est, state, tracked.peak, n, wrapped


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["no-ckpt", "ckpt"])
@pytest.mark.parametrize("layout", [["--micro-batch-size", "2"], ["--max-tokens-per-micro-batch", str(4 * (RESPONSE + 1))]],
                         ids=["rows", "budget"])
def test_the_estimate_covers_what_an_update_holds_and_no_more_than_a_quarter_above(
        qwen_path, precision, checkpointing, layout, capsys):
    args = config.parse_args(["--model", str(qwen_path), "--precision", precision, "--max-prompt-len", str(PROMPT),
                              "--max-response-len", str(RESPONSE), "--rollout", "hf", "--process", "none",
                              *(["--gradient-checkpointing"] if checkpointing else []), *layout])
    est, state, peak, n, _ = measured(args)
    assert est["policy (weights, grads, AdamW)"] == pytest.approx(state, rel=1e-9)  # 16 bytes a parameter
    update = sum(v for k, v in est.items() if k.startswith("  update:"))
    optimizer = 8 * n  # foreach AdamW's temporaries on CPU
    assert est["phase: optimizer step (foreach AdamW's temporaries)"] == pytest.approx(optimizer)
    # the gradients are zeroed in place between steps (microbatch.run_update): they are in the state, and
    # what the update adds is its largest phase
    predicted = max(update, optimizer)
    print(f"{precision} ckpt={checkpointing} {layout}: tracked {peak / 1e6:.2f} MB, estimated {predicted / 1e6:.2f} MB "
          f"({predicted / peak:.2f}x)")
    assert peak <= predicted <= 1.25 * peak, (peak, predicted)


def test_the_estimate_holds_under_ddp(qwen_path):
    """The same update through DistributedDataParallel (a gloo group of one in this process, as under
    `torchrun --nproc_per_node=1`): the gradients are views into DDP's buckets (gradient_as_bucket_view),
    allocated when the model is wrapped and zeroed in place, so the update holds no more than without."""
    import torch.distributed as dist
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, 1, True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        d = ddp.Dist()
        args = config.parse_args(["--model", str(qwen_path), "--max-prompt-len", str(PROMPT), "--max-response-len",
                                  str(RESPONSE), "--rollout", "hf", "--process", "none", "--micro-batch-size", "2"])
        est, state, peak, n, wrapped = measured(args, d)  # build_models wraps in DDP: there is a group
        assert wrapped
        update = sum(v for k, v in est.items() if k.startswith("  update:"))
        print(f"DDP: tracked {peak / 1e6:.2f} MB, estimated {max(update, 8 * n) / 1e6:.2f} MB")
        assert peak <= max(update, 8 * n) <= 1.25 * peak
    finally:
        import gc
        gc.collect()  # no DDP model may outlive the group (pytorch#56297)
        dist.destroy_process_group()
