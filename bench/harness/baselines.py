"""The drafters a user would write instead of ours, on the same weights, for the benchmark to divide by.

- `HFGenerate`: a per-request `model.generate(max_new_tokens=k, do_sample=False)` from scratch: what most
  deployments start with; every call prefills the whole context.
- `HFReuse`: transformers with its own KV cache kept across calls of one conversation, cropped to the longest
  common prefix with the new context: what a careful in-process user would write.
"""

from __future__ import annotations

import torch


def load_hf_model(directory: str, dtype: torch.dtype, device: str):
    """transformers' Qwen3 on the same checkpoint the engine serves (an FP8 export loads through its
    compressed-tensors `quantization_config`)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype)
    return model.to(device).eval()


class HFGenerate:
    def __init__(self, model):
        self.model = model
        self.device = next(model.parameters()).device

    @torch.inference_mode()
    def draft(self, tokens: list[int], num_draft_tokens: int) -> list[int]:
        ids = torch.tensor([tokens], device=self.device)
        out = self.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=num_draft_tokens,
            min_new_tokens=num_draft_tokens,
            pad_token_id=0,  # random checkpoints have none; generate warns on every call without it
        )
        return out[0, len(tokens) :].tolist()


class HFReuse:
    """One conversation's DynamicCache and the tokens it holds, reused across calls."""

    def __init__(self, model):
        self.model = model
        self.device = next(model.parameters()).device
        self.cache = None
        self.cached: list[int] = []

    def common_prefix(self, tokens: list[int]) -> int:
        n = 0
        for a, b in zip(self.cached, tokens, strict=False):
            if a != b:
                break
            n += 1
        return min(n, len(tokens) - 1)  # the last context token is always fed: its logits give draft 1

    @torch.inference_mode()
    def draft(self, tokens: list[int], num_draft_tokens: int) -> list[int]:
        from transformers import DynamicCache

        reuse = self.common_prefix(tokens)
        if self.cache is None or reuse == 0:
            self.cache, reuse = DynamicCache(config=self.model.config), 0
        elif (surplus := self.cache.get_seq_length() - reuse) > 0:
            self.cache.crop(-surplus)  # transformers 5 crops by a negative count of tokens to drop
        feed = torch.tensor([tokens[reuse:]], device=self.device)
        drafts: list[int] = []
        for _ in range(num_draft_tokens):
            logits = self.model(input_ids=feed, cache=self.cache, use_cache=True, logits_to_keep=1).logits
            token = int(logits[0, -1].argmax())
            drafts.append(token)
            feed = torch.tensor([[token]], device=self.device)
        self.cached = [*tokens, *drafts[:-1]]  # the last draft was never fed back
        return drafts
