"""The trainer: master weights and optimizer state, apart from the served weights, fine-tuned to predict what
targets emitted.

The master model is transformers' own `Qwen3ForCausalLM` / `Qwen2ForCausalLM` in fp32 (the oracle's model:
its weights need no translation into a checkpoint), started from the served version's weights as served
(an FP8 version's dequantized: the bf16 weights an export came from are not at hand). All its weights train
(full fine-tuning with AdamW; low-rank adapters would keep less optimizer state, see docs/adaptation.md).
A step is one example's window of at most `max_step_tokens` ids with its target tokens' cross-entropy, and
is abandoned between two decoder layers when a request arrives (drafter/adaptation/preempt.py).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence

import torch

from drafter.adaptation.buffer import Example
from drafter.adaptation.head import cross_entropy_backward
from drafter.adaptation.lora import add_adapters, merged_tensors
from drafter.adaptation.preempt import Preempted, preemptible


def hf_model(hf_config: dict, state: dict[str, torch.Tensor], device="cpu"):
    """transformers' model of this config holding `state` (HF names, fp32), in fp32 on `device`."""
    import transformers

    from engine.model.config import ARCHITECTURES

    family = hf_config["model_type"]
    config_class = getattr(transformers, f"{ARCHITECTURES[family].removesuffix('ForCausalLM')}Config")
    fields = {k: v for k, v in hf_config.items() if k not in ("quantization_config", "architectures")}
    config = config_class(**fields)
    model = getattr(transformers, ARCHITECTURES[family])(config).to(device=device, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [name for name in missing if not (config.tie_word_embeddings and name == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"weights do not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    if config.tie_word_embeddings:
        model.tie_weights()
    return model.eval()


class Trainer:
    def __init__(
        self,
        hf_config: dict,
        state: dict[str, torch.Tensor],
        learning_rate: float,
        max_step_tokens: int,
        seed: int = 0,
        device="cpu",
        adapter_rank: int = 0,  # 0: all decoder weights train; else low-rank adapters (lora.py) of this rank
    ):
        self.hf_config, self.device, self.adapter_rank = hf_config, device, adapter_rank
        self.learning_rate, self.max_step_tokens = learning_rate, max_step_tokens
        self.rng = random.Random(seed)
        self.reset(state)

    def reset(self, state: dict[str, torch.Tensor]) -> None:
        """Start again from `state` (a version rolled back to), with fresh optimizer state."""
        self.pending_loss: float | None = None  # a step's loss while its update waits (`step`)
        self.model = hf_model(self.hf_config, state, self.device)
        if self.adapter_rank:
            trained = add_adapters(self.model, self.adapter_rank, alpha=2.0 * self.adapter_rank)
            self.optimizer = torch.optim.AdamW(trained, lr=self.learning_rate, weight_decay=0.0)
            return
        # The embedding (and an untied lm_head) stay as they are: on a 151936-token vocabulary they are most
        # of the parameters, and their gradients and AdamW moments most of a step's time (measured below).
        self.model.get_input_embeddings().requires_grad_(False)
        self.model.get_output_embeddings().requires_grad_(False)
        trained = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trained, lr=self.learning_rate, weight_decay=0.0)

    def window(self, example: Example) -> tuple[list[int], int]:
        """A random window of `example`: (ids, how many of them lead the first target scored), at most
        `max_step_tokens` ids, at least one target token, and context before every target it scores."""
        tokens = example.tokens[:]  # the buffer may append to it on the event loop meanwhile
        end = self.rng.randint(example.num_context + 1, len(tokens))
        start = max(0, end - self.max_step_tokens)
        return tokens[start:end], max(example.num_context - start, 1)

    def step(self, examples: Sequence[Example], stop: Callable[[], bool] = lambda: False) -> float | None:
        """One optimizer step on a window of a random example; its loss, or None if `stop()` turned true
        during it: between two decoder layers the step is dropped, no weight changed; past the backward,
        its update (clipping and AdamW: 40 ms of adapters on the real drafter, after the first layer's
        backward) is left for the next call, which makes it and returns the loss."""
        if self.pending_loss is not None:
            return self.update()
        ids, num_context = self.window(self.rng.choice(examples))
        ids = torch.tensor([ids], device=self.device)
        self.optimizer.zero_grad(set_to_none=True)
        self.model.train()
        try:
            with preemptible(self.model, stop):
                self.pending_loss = self.forward_backward(ids, num_context, stop)
        except Preempted:
            self.optimizer.zero_grad(set_to_none=True)
            return None
        finally:
            self.model.eval()
        return None if stop() else self.update()

    def update(self) -> float:
        """The optimizer's step on the gradients of the last forward and backward: that step's loss."""
        torch.nn.utils.clip_grad_norm_(self.optimizer.param_groups[0]["params"], 1.0)
        self.optimizer.step()
        loss, self.pending_loss = self.pending_loss, None
        return loss

    def forward_backward(self, ids: torch.Tensor, num_context: int, stop: Callable[[], bool]) -> float:
        """The mean cross-entropy of the target tokens, its gradients accumulated. The lm_head (frozen) runs
        a slice of the vocabulary at a time, asking `stop()` between (drafter/adaptation/head.py): on a
        large vocabulary it is the longest part of a step, and the layers' hooks alone would let a request
        wait through it. Then one backward through the layers from the hidden states' gradient."""
        hidden = self.model.model(input_ids=ids[:, :-1]).last_hidden_state[0, num_context - 1 :]
        return cross_entropy_backward(self.model.lm_head, hidden, ids[0, num_context:], stop)

    def state(self) -> dict[str, torch.Tensor]:
        """The master weights now, adapters merged (copies: training goes on)."""
        return dict(self.tensors())

    def tensors(self, trained_only: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """`state()` one tensor at a time: a candidate is made in pieces a request can come between.
        `trained_only`: just the tensors training changes; every other one is as the trainer started (the
        embedding, and with adapters every tensor but the merged linears' weights)."""
        if self.adapter_rank:
            yield from merged_tensors(self.model, trained_only)
            return
        if trained_only:
            for name, parameter in self.model.named_parameters():
                if parameter.requires_grad:
                    yield name, parameter.detach().to("cpu", copy=True)
            return
        for name, tensor in self.model.state_dict().items():
            yield name, tensor.detach().to("cpu", copy=True)
