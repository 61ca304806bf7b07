"""What a testbed build is made of: every number that decides its bytes, in one place. Its hash keys the
committed artifacts (bench/testbed/pair/manifest.json): change anything here and the check that the pair
matches its recipe fails until the pair is rebuilt.

The two models are Qwen3 (tied embeddings, as Qwen3-0.6B). The drafter's cost per token (2 x its
parameters, the LM head included, in FLOPs) is about 1/6.3 of the target's, and it is distilled from the
target's logits on the target's own greedy continuations, as real drafters are (on-policy data: what a
drafter is asked to predict is what the target generates, not the corpus). MINIATURE is the suite's: the
same path, seconds instead of minutes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace


@dataclass(frozen=True)
class ModelShape:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    head_dim: int = 64


@dataclass(frozen=True)
class Training:
    steps: int
    batch_size: int  # sequences per step
    learning_rate: float
    warmup_steps: int
    weight_decay: float = 0.1


@dataclass(frozen=True)
class Recipe:
    seed: int = 0
    held_out_per_mille: int = 50  # documents, by a hash of their name
    edit_every: int = 3  # one rename edit per this many training code files
    edit_lines: int = 24
    vocab_size: int = 4096
    seq_len: int = 512
    max_files: int | None = None  # None: the whole standard library
    target: ModelShape = ModelShape(256, 6, 4, 2, 768)
    drafter: ModelShape = ModelShape(128, 2, 2, 1, 384)
    target_training: Training = Training(steps=800, batch_size=8, learning_rate=4e-3, warmup_steps=40)
    # The drafter's data: this many training windows whose last `distillation_new_tokens` the target
    # rewrites greedily; its steps go over them twice (generating costs more than a drafter step).
    distillation_sequences: int = 1024
    distillation_new_tokens: int = 128
    drafter_training: Training = Training(steps=256, batch_size=8, learning_rate=4e-3, warmup_steps=20)
    eval_batches: int = 16
    workload_prompts: int = 8  # per workload
    workload_new_tokens: int = 128  # each prompt leaves this much room below seq_len
    agreement_positions: int = 16
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)

    def key(self) -> str:
        return hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True).encode()).hexdigest()[:16]


FULL = Recipe()
MINIATURE = replace(
    FULL,
    max_files=6,
    vocab_size=768,
    seq_len=256,
    edit_every=1,
    target=ModelShape(32, 2, 2, 1, 64, head_dim=16),
    drafter=ModelShape(16, 1, 1, 1, 32, head_dim=16),
    target_training=Training(steps=4, batch_size=2, learning_rate=3e-3, warmup_steps=1),
    distillation_sequences=4,
    distillation_new_tokens=16,
    drafter_training=Training(steps=3, batch_size=2, learning_rate=3e-3, warmup_steps=1),
    eval_batches=1,
    workload_prompts=1,
    workload_new_tokens=16,
    agreement_positions=4,
)
