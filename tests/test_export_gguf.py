"""GGUF files into HF checkpoints (`export/gguf.py`): the weights transformers reads back from the converted
directory are the ones written into the GGUF (after its quantization and the cast), the tokenizer and chat
template come along, and an interrupted conversion leaves nothing."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from export import gguf as export_gguf
from export.checkpoint import ExportError
from export.gguf import convert_gguf
from tests.gguf_files import CHAT_TEMPLATE, SHAPE, write_gguf

pytestmark = pytest.mark.usefixtures("one_thread")
TEXT = "def hello(world):\n    return world + 1  # the quick brown fox"


def leftovers(parent) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize(
    ("quantization", "tied", "dtype"),
    [("F32", False, torch.float32), ("F16", True, torch.bfloat16), ("Q8_0", False, torch.bfloat16)],
)
def test_convert_gguf_keeps_weights_tokenizer_and_chat_template(tmp_path, quantization, tied, dtype):
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    written = write_gguf(tmp_path / "tiny.gguf", quantization=quantization, tied=tied)
    out = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "hf", dtype=dtype)
    assert out == tmp_path / "hf" and leftovers(tmp_path) == []

    model = Qwen2ForCausalLM.from_pretrained(out)
    assert model.dtype == dtype and model.config.tie_word_embeddings == tied
    state = model.state_dict()
    assert set(written) <= set(state) and len(set(state) - set(written)) == tied  # lm_head when tied
    for name, tensor in written.items():
        assert torch.equal(state[name], tensor.to(dtype)), name
    assert state["model.layers.1.self_attn.k_proj.bias"].abs().min() > 0  # the biases came through
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        assert ("lm_head.weight" in f.keys()) != tied  # noqa: SIM118 - a tied head is not saved twice

    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen2" and "quantization_config" not in config
    assert config["rms_norm_eps"] == 1e-6 and config["vocab_size"] == len(
        written["model.embed_tokens.weight"]
    )
    assert (config["num_hidden_layers"], config["hidden_size"]) == (SHAPE["layers"], SHAPE["hidden"])

    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = tokenizer.encode(TEXT)
    assert tokenizer.decode(ids) == TEXT and len(ids) < len(TEXT.encode())  # the merges are used
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == config["eos_token_id"]
    assert (out / "chat_template.jinja").read_text() == CHAT_TEMPLATE
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n"
    special = tokenizer.encode("<|im_start|>hi<|im_end|>")  # control tokens stay whole
    assert [special[0], special[-1]] == tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])


def test_convert_gguf_interrupted_leaves_nothing(tmp_path, monkeypatch):
    write_gguf(tmp_path / "tiny.gguf")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(export_gguf, "save_tokenizer", interrupted)  # after the weights are written
    with pytest.raises(KeyboardInterrupt):
        convert_gguf(tmp_path / "tiny.gguf", tmp_path / "hf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.gguf"]


def test_convert_gguf_refuses_a_directory_that_holds_something(tmp_path):
    write_gguf(tmp_path / "tiny.gguf")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="already exists and is not empty"):
        convert_gguf(tmp_path / "tiny.gguf", tmp_path / "hf")
    assert [p.name for p in (tmp_path / "hf").iterdir()] == ["keep.txt"]
