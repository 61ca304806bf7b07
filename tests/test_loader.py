"""Loading fails early, naming the problem; and presets load by the same path as directories."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.config import EngineConfig
from engine.engine import Engine
from engine.model.errors import LoadError
from engine.model.loader import load_model
from engine.model.presets import PRESETS, write_preset
from engine.requests import DraftError


@pytest.fixture
def checkpoint_copy(hf_checkpoint, tmp_path):
    _, directory = hf_checkpoint()
    target = tmp_path / "ckpt"
    shutil.copytree(directory, target)
    return target


def rewrite_weights(directory, edit):
    path = directory / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def test_loader_missing_directory_is_named(tmp_path):
    with pytest.raises(LoadError, match="does not exist"):
        load_model(str(tmp_path / "nope"))


def test_loader_directory_without_config(tmp_path):
    with pytest.raises(LoadError, match="no config.json"):
        load_model(str(tmp_path))


def test_loader_refuses_other_architectures(checkpoint_copy):
    config = json.loads((checkpoint_copy / "config.json").read_text())
    (checkpoint_copy / "config.json").write_text(json.dumps(config | {"model_type": "llama"}))
    with pytest.raises(LoadError, match="model_type is 'llama'"):
        load_model(str(checkpoint_copy))


def test_loader_names_a_missing_tensor(checkpoint_copy):
    rewrite_weights(checkpoint_copy, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(LoadError, match=r"1 missing .*model\.layers\.1\.mlp\.up_proj\.weight"):
        load_model(str(checkpoint_copy))


def test_loader_names_a_renamed_tensor(checkpoint_copy):
    rewrite_weights(
        checkpoint_copy,
        lambda t: t.__setitem__(
            "model.layers.0.mlp.gate.weight", t.pop("model.layers.0.mlp.gate_proj.weight")
        ),
    )
    with pytest.raises(LoadError, match=r"unexpected .*model\.layers\.0\.mlp\.gate\.weight"):
        load_model(str(checkpoint_copy))


def test_loader_names_a_wrong_shape(checkpoint_copy):
    rewrite_weights(checkpoint_copy, lambda t: t.__setitem__("model.norm.weight", torch.ones(3)))
    with pytest.raises(
        LoadError, match=r"model\.norm\.weight: shape \[3\] in the checkpoint, \[64\] expected"
    ):
        load_model(str(checkpoint_copy))


def test_loader_without_weights(checkpoint_copy):
    (checkpoint_copy / "model.safetensors").unlink()
    with pytest.raises(LoadError, match="no \\*.safetensors"):
        load_model(str(checkpoint_copy))


def test_loader_reads_sharded_checkpoints(hf_checkpoint, tmp_path):
    model, _ = hf_checkpoint()
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    loaded = load_model(str(tmp_path))
    torch.testing.assert_close(loaded.model.model.norm.weight, model.model.norm.weight)
    torch.testing.assert_close(loaded.model.lm_head.weight, model.lm_head.weight)


def test_preset_loads_the_same_as_its_written_directory(tmp_path):
    in_memory = Engine.load("tiny", EngineConfig())
    from_disk = Engine.load(str(write_preset("tiny", tmp_path)), EngineConfig())
    assert in_memory.loaded.is_random_preset and not from_disk.loaded.is_random_preset
    context = list(range(40))
    assert in_memory.draft(context, 16) == from_disk.draft(context, 16)
    assert in_memory.loaded.config == PRESETS["tiny"]


def test_engine_refuses_a_context_longer_than_max_seq_len():
    engine = Engine.load("tiny", EngineConfig(max_seq_len=64))
    with pytest.raises(DraftError, match="at most 64") as error:
        engine.draft(list(range(60)), 5)
    assert error.value.param == "tokens"
    assert len(engine.draft(list(range(59)), 5)) == 5


@pytest.mark.parametrize(
    ("tokens", "k", "param"),
    [
        ([], 4, "tokens"),
        ([1, 2.0], 4, "tokens"),
        ([1, True], 4, "tokens"),
        ([1, -1], 4, "tokens"),
        ([1, 1024], 4, "tokens"),
        ([1], 0, "num_draft_tokens"),
        ([1], 17, "num_draft_tokens"),
    ],
)
def test_engine_refuses_bad_requests_before_the_device(tokens, k, param):
    engine = Engine.load("tiny", EngineConfig())
    with pytest.raises(DraftError) as error:
        engine.draft(tokens, k)
    assert error.value.param == param
    assert engine.stats.requests == 0
