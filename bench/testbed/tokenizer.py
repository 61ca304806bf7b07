"""A byte-level BPE (Qwen's kind: any text encodes, nothing is unknown) trained on the training documents,
saved so that `AutoTokenizer.from_pretrained` loads it from each model's directory."""

from __future__ import annotations

import os
from pathlib import Path

END_OF_TEXT = "<|endoftext|>"  # id 0: separates documents, and is both models' EOS


def train_tokenizer(texts: list[str], vocab_size: int):
    # One thread: the merges do not depend on it, but the build's output must not depend on anything else.
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def save_tokenizer(tokenizer, directory: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=END_OF_TEXT, pad_token=END_OF_TEXT
    )
    wrapped.save_pretrained(directory)


def encode_documents(tokenizer, texts: list[str]) -> list[list[int]]:
    return [encoding.ids for encoding in tokenizer.encode_batch(texts, add_special_tokens=False)]
