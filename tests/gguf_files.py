"""Tiny GGUF files written here with the `gguf` package, the way llama.cpp's converter writes a Qwen2.5:
HF tensor names mapped to GGUF's (`blk.N.attn_q`, ...), a byte-level BPE vocabulary (`tokenizer.ggml.model`
= gpt2, `pre` = qwen2) padded with `[PADn]` tokens up to the embedding's rows, ChatML control tokens, and a
chat template. `write_gguf` returns the weights a reader must find, under their HF names."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
NUM_PADDING_TOKENS = 3  # a real Qwen2.5 GGUF pads 151,665 tokens to 151,936 embedding rows the same way
SHAPE = {"hidden": 64, "intermediate": 96, "layers": 2, "heads": 4, "kv_heads": 2}


def tiny_vocabulary() -> tuple[list[str], list[str]]:
    """`(tokens, merges)`: a byte-level BPE trained on a few lines, in id order, specials last."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    lines = ["def hello(world):\n    return world + 1\n", "the quick brown fox jumps over the lazy dog\n"]
    tokenizer.train_from_iterator(lines * 20, trainer)
    model = json.loads(tokenizer.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    return tokens + list(SPECIAL_TOKENS), [" ".join(pair) for pair in model["merges"]]


def head_dim(architecture: str) -> int:
    """Qwen2's is hidden / heads; a Qwen3 GGUF's config gets Qwen3Config's default, 128, as every Qwen3 has."""
    return 128 if architecture == "qwen3" else SHAPE["hidden"] // SHAPE["heads"]


def random_weights(
    architecture: str, num_embeddings: int, tied: bool, seed: int = 0
) -> dict[str, torch.Tensor]:
    """HF-named fp32 weights of a tiny model: Qwen2's with non-zero q/k/v biases, Qwen3's with q/k norms
    and no biases; norms away from one."""
    generator = torch.Generator().manual_seed(seed)
    hidden, inter, dim = SHAPE["hidden"], SHAPE["intermediate"], head_dim(architecture)
    q, kv = SHAPE["heads"] * dim, SHAPE["kv_heads"] * dim

    def rand(*shape: int, scale: float = 0.3) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * scale

    weights = {
        "model.embed_tokens.weight": rand(num_embeddings, hidden),
        "model.norm.weight": 1 + rand(hidden),
    }
    for n in range(SHAPE["layers"]):
        p = f"model.layers.{n}."
        weights |= {
            p + "input_layernorm.weight": 1 + rand(hidden),
            p + "post_attention_layernorm.weight": 1 + rand(hidden),
            p + "self_attn.q_proj.weight": rand(q, hidden),
            p + "self_attn.k_proj.weight": rand(kv, hidden),
            p + "self_attn.v_proj.weight": rand(kv, hidden),
            p + "self_attn.o_proj.weight": rand(hidden, q),
            p + "mlp.gate_proj.weight": rand(inter, hidden),
            p + "mlp.up_proj.weight": rand(inter, hidden),
            p + "mlp.down_proj.weight": rand(hidden, inter),
        }
        if architecture == "qwen3":
            weights |= {
                p + "self_attn.q_norm.weight": 1 + rand(dim),
                p + "self_attn.k_norm.weight": 1 + rand(dim),
            }
        else:
            weights |= {f"{p}self_attn.{x}_proj.bias": rand(n) for x, n in (("q", q), ("k", kv), ("v", kv))}
    if not tied:
        weights["lm_head.weight"] = rand(num_embeddings, hidden)
    return weights


def write_gguf(
    path: Path, architecture: str = "qwen2", quantization: str = "F32", tied: bool = False
) -> dict[str, torch.Tensor]:
    """Write a tiny model of `architecture` (qwen2, qwen3; any other gets Qwen2's tensors) to `path`: 2-D weights in `quantization` (F32, F16 or Q8_0),
    1-D tensors (norms, biases) in F32 as llama.cpp keeps them. Returns the values a reader must get back
    (after the quantization round trip), under HF names."""
    import gguf

    tokens, merges = tiny_vocabulary()
    padding = [f"[PAD{len(tokens) + i}]" for i in range(NUM_PADDING_TOKENS)]
    types = [gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIAL_TOKENS))
    types += [gguf.TokenType.CONTROL] * len(SPECIAL_TOKENS) + [gguf.TokenType.UNUSED] * len(padding)
    tokens += padding
    weights = random_weights(architecture, len(tokens), tied)

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny-test")
    writer.add_context_length(256)
    writer.add_embedding_length(SHAPE["hidden"])
    writer.add_block_count(SHAPE["layers"])
    writer.add_feed_forward_length(SHAPE["intermediate"])
    writer.add_head_count(SHAPE["heads"])
    writer.add_head_count_kv(SHAPE["kv_heads"])
    writer.add_key_length(head_dim(architecture))
    writer.add_value_length(head_dim(architecture))
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    qtype = gguf.GGMLQuantizationType[quantization]
    arch = next(key for key, name in gguf.MODEL_ARCH_NAMES.items() if name == architecture)
    names = gguf.get_tensor_name_map(arch, SHAPE["layers"])
    stored = {}
    for hf_name, tensor in weights.items():
        module, suffix = hf_name.rsplit(".", 1)
        array = tensor.numpy()
        if tensor.dim() == 2 and qtype != gguf.GGMLQuantizationType.F32:
            raw = gguf.quants.quantize(array, qtype)
            writer.add_tensor(f"{names.get_name(module)}.{suffix}", raw, raw_dtype=qtype)
            array = gguf.quants.dequantize(raw, qtype).reshape(array.shape)
        else:
            writer.add_tensor(f"{names.get_name(module)}.{suffix}", array)
        stored[hf_name] = torch.from_numpy(np.array(array, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored
