"""GGUF files into HF checkpoints (`export/gguf.py`) and through `python -m export`: the weights transformers
reads back from the converted directory are the ones written into the GGUF (after its quantization and the
cast), the tokenizer and chat template come along, an interrupted conversion leaves nothing, and a file that
is not a GGUF of a family the engine serves is refused in one line before any slow work."""

from __future__ import annotations

import importlib.util
import json
import logging
import struct

import pytest
import torch
from safetensors import safe_open

from engine.engine import Engine
from engine.model.config import ConfigError, ModelConfig
from engine.model.fp8 import FP8_DTYPE, LINEAR_NAMES
from export import gguf as export_gguf
from export.__main__ import main
from export.gguf import convert_gguf
from export.staging import ExportError
from tests.export_helpers import ENGINE
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


def refused(argv: list[str], capsys, message: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("export: error: ")]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in err, err


def test_export_refuses_files_that_are_not_a_served_gguf(tmp_path, capsys, monkeypatch):
    destination = str(tmp_path / "out" / "dst")
    (tmp_path / "weights.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    refused([str(tmp_path / "weights.safetensors"), destination], capsys, "is not a GGUF file")
    (tmp_path / "v9.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 9, 0, 0))
    refused([str(tmp_path / "v9.gguf"), destination], capsys, "is GGUF version 9")
    (tmp_path / "cut.gguf").write_bytes(b"GGUF" + struct.pack("<I", 3) + b"\x01")
    refused([str(tmp_path / "cut.gguf"), destination], capsys, "is not a readable GGUF file")
    write_gguf(tmp_path / "llama.gguf", architecture="llama")
    refused([str(tmp_path / "llama.gguf"), destination], capsys, "holds a 'llama' model; the engine serves")

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real_find_spec(name, *a)
    )
    write_gguf(tmp_path / "tiny.gguf")
    refused(
        [str(tmp_path / "tiny.gguf"), destination], capsys, "needs the gguf package: pip install 'drafter["
    )
    assert not (tmp_path / "out" / "dst").exists() and leftovers(tmp_path / "out") == []


def engine_serves(directory) -> bool:
    try:
        ModelConfig.from_hf(json.loads((directory / "config.json").read_text()))
    except ConfigError:
        return False
    return True


@pytest.mark.parametrize(("architecture", "quantization"), [("qwen3", "Q8_0"), ("qwen2", "F16")])
def test_export_cli_turns_a_gguf_into_a_served_fp8_checkpoint(tmp_path, caplog, architecture, quantization):
    written = write_gguf(tmp_path / "tiny.gguf", architecture=architecture, quantization=quantization)
    if not engine_serves(convert_gguf(tmp_path / "tiny.gguf", tmp_path / "hf")):
        # Qwen2 in engine/ and export/ is another branch's work: this passes once it lands
        pytest.xfail(f"the engine does not serve {architecture} in this tree yet")
    destination = tmp_path / "out" / "fp8"
    with caplog.at_level(logging.INFO, logger="export"):
        assert main([str(tmp_path / "tiny.gguf"), str(destination)]) == 0
    for step in (
        "loading and dequantizing tiny.gguf",
        "saving the weights in bfloat16",
        f"wrote {destination}",
    ):
        assert step in caplog.text
    assert leftovers(tmp_path / "out") == []  # the intermediate bf16 directory is gone

    config = json.loads((destination / "config.json").read_text())
    assert (
        config["model_type"] == architecture and config["quantization_config"]["format"] == "float-quantized"
    )
    with safe_open(str(destination / "model.safetensors"), framework="pt") as f:
        for name in LINEAR_NAMES:
            assert f.get_tensor(f"model.layers.0.{name}.weight").dtype == FP8_DTYPE
        if architecture == "qwen2":
            bias = f.get_tensor("model.layers.0.self_attn.q_proj.bias")
            assert torch.equal(bias, written["model.layers.0.self_attn.q_proj.bias"].to(torch.bfloat16))
    assert (destination / "chat_template.jinja").read_text() == CHAT_TEMPLATE
    assert {"tokenizer.json", "tokenizer_config.json", "report.json"} <= {
        p.name for p in destination.iterdir()
    }

    engine = Engine.load(str(destination), ENGINE)
    draft = engine.draft([1, 2, 3, 4], 4)
    assert len(draft) == 4 and all(0 <= t < config["vocab_size"] for t in draft)
