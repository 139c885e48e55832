"""Generation for PRIME's rollouts: K samples per prompt, returned as token ids with masks.

One interface, two backends:
- `HFRollout`: Hugging Face `generate` on the training policy itself (always available; on CPU and
  for tiny models it is also the fastest).
- vLLM colocated with training (one engine per rank): planned in a separate issue; it will plug in
  behind the same `generate(prompt_token_ids, n) -> Rollout` and `push_weights(model)` interface.

Token layout (the same for every backend and for train.py):
- prompts are LEFT-padded to a common width P, so every response starts at column P;
- responses are RIGHT-padded to a common width R; `response_mask` is 1 up to and including the
  first EOS (the official PRIME code gives the EOS token a reward too), 0 after it;
- a response with no EOS within `max_new_tokens` is marked `truncated` (its mask covers all of it);
- the K samples of one prompt are contiguous rows (group g = rows [g*K, (g+1)*K)).
"""

from dataclasses import dataclass

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
                 top_p: float = 1.0):
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p

    def push_weights(self, model) -> None:
        """The HF backend samples from the training model itself: nothing to copy."""
        self.model = model

    @torch.no_grad()
    def generate(self, prompt_token_ids: list[list[int]], n: int = 1, greedy: bool = False,
                 return_logprobs: bool = False, batch_size: int = 256) -> Rollout:
        """K = n samples of each prompt, groups contiguous. `greedy` decodes one answer per prompt."""
        tok = self.tokenizer
        repeated = [ids for ids in prompt_token_ids for _ in range(n)]
        prompt_ids, prompt_mask = left_pad(repeated, tok.pad_token_id)
        was_training = self.model.training
        self.model.eval()
        chunks, logps = [], []
        for start in range(0, len(repeated), batch_size):
            ids, mask = prompt_ids[start:start + batch_size], prompt_mask[start:start + batch_size]
            device = self.model.device
            out = self.model.generate(
                input_ids=ids.to(device), attention_mask=mask.to(device),
                do_sample=not greedy, temperature=self.temperature if not greedy else None,
                top_p=self.top_p if not greedy else None, top_k=0 if not greedy else None,
                max_new_tokens=self.max_new_tokens, pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id, return_dict_in_generate=True,
                output_logits=return_logprobs)
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
