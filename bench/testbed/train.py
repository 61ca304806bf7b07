"""Training the pair: the target on the corpus's next tokens, then the drafter on the target's own
distribution (its softmax: distillation, as real drafters are made) over windows whose ends the target has
rewritten greedily. That on-policy data decides agreement: in a trial against one target (220 drafter
steps each), a drafter distilled on corpus windows agreed with it on 31% of first draft positions on
`code`, one distilled on its continuations on 74%. Plain AdamW with warmup and cosine decay, seeded, on as
many threads as the recipe's machine has (at most 2, so a bigger machine computes the same sums in the
same order).

Models are transformers' Qwen3ForCausalLM (the oracle's own class) and are saved in bfloat16 as HF
directories; every figure the report gives is measured on the saved weights.
"""

from __future__ import annotations

import math
import sys
import time

import torch
import torch.nn.functional as F
from tqdm import tqdm

from bench.testbed.recipe import ModelShape, Recipe, Training
from bench.testbed.tokenizer import END_OF_TEXT

EOS_ID = 0
BUILD_THREADS = 2


def hf_config(shape: ModelShape, recipe: Recipe):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=recipe.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=4 * recipe.seq_len,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},  # trained on short windows
        tie_word_embeddings=True,
        bos_token_id=EOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=EOS_ID,
        attn_implementation="sdpa",
    )


def new_model(shape: ModelShape, recipe: Recipe, seed: int):
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    return Qwen3ForCausalLM(hf_config(shape, recipe)).float()


def flops_per_token(model) -> int:
    """2 x the parameters a token's forward pass multiplies by: every weight matrix, the tied LM head once
    (the embedding lookup is free)."""
    return 2 * sum(p.numel() for name, p in model.named_parameters() if p.dim() == 2)


def windows(documents: list[list[int]], seq_len: int) -> torch.Tensor:
    """[n, seq_len + 1]: the documents joined by EOS, cut into consecutive windows (input and next tokens)."""
    stream = [token for ids in documents for token in (*ids, EOS_ID)]
    n = len(stream) // (seq_len + 1)
    if n == 0:
        raise ValueError(f"the corpus has {len(stream)} tokens, less than one window of {seq_len + 1}")
    return torch.tensor(stream[: n * (seq_len + 1)]).view(n, seq_len + 1)


def batches(data: torch.Tensor, batch_size: int, steps: int, seed: int):
    """`steps` batches of windows, each epoch in a new seeded order."""
    generator = torch.Generator().manual_seed(seed)
    order = torch.empty(0, dtype=torch.long)
    for _ in range(steps):
        if len(order) < batch_size:
            order = torch.cat([order, torch.randperm(len(data), generator=generator)])
        yield data[order[:batch_size]]
        order = order[batch_size:]


def learning_rate(step: int, training: Training) -> float:
    if step < training.warmup_steps:
        return training.learning_rate * (step + 1) / training.warmup_steps
    progress = (step - training.warmup_steps) / max(1, training.steps - training.warmup_steps)
    return training.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(model, data: torch.Tensor, training: Training, seed: int, label: str, loss_of) -> list[float]:
    """Runs `training.steps` AdamW steps of `loss_of(model, batch)`; the loss curve (one value per step)."""
    decay = [p for p in model.parameters() if p.dim() == 2]
    rest = [p for p in model.parameters() if p.dim() != 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": training.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=training.learning_rate,
        betas=(0.9, 0.95),
    )
    model.train()
    curve = []
    tokens_per_step = training.batch_size * (data.shape[1] - 1)
    started = time.perf_counter()
    bar = tqdm(batches(data, training.batch_size, training.steps, seed), total=training.steps, desc=label,
               unit="step", file=sys.stderr, mininterval=5)  # fmt: skip
    for step, batch in enumerate(bar):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, training)
        loss = loss_of(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        curve.append(loss.item())
        rate = tokens_per_step * (step + 1) / (time.perf_counter() - started)
        bar.set_postfix(
            loss=f"{sum(curve[-20:]) / len(curve[-20:]):.3f}", tok_s=f"{rate:,.0f}", refresh=False
        )
    model.eval()
    return curve


GENERATION_BATCH = 64


@torch.inference_mode()
def target_continuations(
    target, data: torch.Tensor, sequences: int, new_tokens: int, seed: int
) -> torch.Tensor:
    """[sequences, seq_len + 1]: seeded training windows, each with its last `new_tokens` replaced by the
    target's greedy continuation of the rest (EOS suppressed, so every row is full)."""
    chosen = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))[:sequences]
    prompts = data[chosen, : data.shape[1] - new_tokens]
    rows = []
    for batch in tqdm(prompts.split(GENERATION_BATCH), desc="target continuations", unit="batch",
                      file=sys.stderr, mininterval=5):  # fmt: skip
        rows.append(target.generate(batch, attention_mask=torch.ones_like(batch), do_sample=False,
                                    max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                    pad_token_id=EOS_ID))  # fmt: skip
    return torch.cat(rows)


def next_token_loss(model, batch: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=batch[:, :-1]).logits
    return F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())


def distillation_loss(target):
    """Cross-entropy of the drafter against the target's softmax (the KL divergence plus a constant)."""

    def loss_of(drafter, batch: torch.Tensor) -> torch.Tensor:
        inputs = batch[:, :-1]
        with torch.no_grad():
            teacher = F.softmax(target(input_ids=inputs).logits.float(), dim=-1)
        student = F.log_softmax(drafter(input_ids=inputs).logits.float(), dim=-1)
        return -(teacher * student).sum(-1).mean()

    return loss_of


def to_saved_precision(model):
    """bfloat16, as saved, then back to float32 for CPU measurements: the report measures what is shipped."""
    return model.to(torch.bfloat16).float()


__all__ = ["END_OF_TEXT", "BUILD_THREADS", "new_model", "train", "windows", "flops_per_token"]
