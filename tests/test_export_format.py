"""The checkpoint `python -m export` writes, with per-tensor and per-channel weight scales: exactly the
expected tensors, a config.json compressed-tensors parses (and that says when the weights are random), and a
report of what was measured; a checkpoint whose scales disagree with its config.json is refused at load."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from engine.engine import Engine
from engine.model.config import ModelConfig
from engine.model.errors import LoadError
from engine.model.fp8 import FP8_DTYPE, LINEAR_NAMES, quantization_from_config
from engine.model.loader import RANDOM_WEIGHTS_KEY, load_model
from engine.model.presets import PRESETS
from tests.conftest import QWEN2_EXPORT
from tests.export_helpers import ENGINE, MODES, WEIGHT_SCALES, export_fixture, read_file

pytestmark = pytest.mark.usefixtures("one_thread")


def expected_layout(config, weight_scales="tensor") -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    h, d, i = config.hidden_size, config.head_dim, config.intermediate_size
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    bf16, fp8, f32 = torch.bfloat16, FP8_DTYPE, torch.float32
    layout = {"model.embed_tokens.weight": (bf16, (config.vocab_size, h)), "model.norm.weight": (bf16, (h,))}
    if not config.tie_word_embeddings:
        layout["lm_head.weight"] = (bf16, (config.vocab_size, h))
    shapes = {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q)}
    shapes |= {"gate_proj": (i, h), "up_proj": (i, h), "down_proj": (h, i)}
    for n in range(config.num_hidden_layers):
        p = f"model.layers.{n}."
        layout |= {
            p + "input_layernorm.weight": (bf16, (h,)),
            p + "post_attention_layernorm.weight": (bf16, (h,)),
        }
        if config.qk_norm:  # Qwen3
            layout |= {
                p + "self_attn.q_norm.weight": (bf16, (d,)),
                p + "self_attn.k_norm.weight": (bf16, (d,)),
            }
        if config.qkv_bias:  # Qwen2: the biases of the fp8 linears stay bf16 beside them
            layout |= {f"{p}self_attn.{x}_proj.bias": (bf16, shapes[f"{x}_proj"][:1]) for x in "qkv"}
        for name in LINEAR_NAMES:
            proj = name.split(".")[1]
            layout[f"{p}{name}.weight"] = (fp8, shapes[proj])
            scale = (1,) if weight_scales == "tensor" else (shapes[proj][0], 1)  # one per output row
            layout[f"{p}{name}.weight_scale"] = (f32, scale)
    return layout


@pytest.mark.parametrize("weight_scales", WEIGHT_SCALES)
@pytest.mark.parametrize("mode", MODES)
def test_export_writes_exactly_the_expected_tensors(request, mode, weight_scales):
    directory, _ = request.getfixturevalue(export_fixture("qwen3", weight_scales))[mode]
    tensors = read_file(directory)
    got = {name: (t.dtype, tuple(t.shape)) for name, t in tensors.items()}
    assert got == expected_layout(PRESETS["tiny"], weight_scales)  # no lm_head: tied to the embedding
    assert sorted(p.name for p in directory.iterdir()) == ["config.json", "model.safetensors", "report.json"]


@pytest.mark.parametrize("weight_scales", WEIGHT_SCALES)
@pytest.mark.parametrize("mode", MODES)
def test_export_of_qwen2_keeps_its_family_biases_and_untied_lm_head(
    request, hf_checkpoint, mode, weight_scales
):
    directory, _ = request.getfixturevalue(export_fixture("qwen2", weight_scales))[mode]
    source, _ = hf_checkpoint(QWEN2_EXPORT)
    config = ModelConfig.from_hf(json.loads((directory / "config.json").read_text()))
    assert config == ModelConfig.from_hf(source.config.to_dict())
    assert config.family == "qwen2" and not config.tie_word_embeddings
    tensors = read_file(directory)
    got = {name: (t.dtype, tuple(t.shape)) for name, t in tensors.items()}
    assert got == expected_layout(config, weight_scales)
    for name, parameter in source.named_parameters():  # the bf16 tensors are the source's, rounded
        if tensors[name].dtype == torch.bfloat16:
            assert torch.equal(tensors[name], parameter.detach().to(torch.bfloat16)), name
    hf = json.loads((directory / "config.json").read_text())
    assert hf["architectures"] == ["Qwen2ForCausalLM"] and hf["quantization_config"]["ignore"] == ["lm_head"]
    assert quantization_from_config(hf["quantization_config"]) == (f"fp8-{mode}", weight_scales)


@pytest.mark.parametrize("weight_scales", WEIGHT_SCALES)
@pytest.mark.parametrize("mode", MODES)
def test_export_config_is_what_compressed_tensors_expects(request, mode, weight_scales):
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationStrategy,
        QuantizationType,
        initialize_module_for_quantization,
    )

    directory, _ = request.getfixturevalue(export_fixture("qwen3", weight_scales))[mode]
    hf = json.loads((directory / "config.json").read_text())
    source = PRESETS["tiny"].to_hf()
    assert {k: hf[k] for k in source} == source and hf["torch_dtype"] == "bfloat16"
    parsed = QuantizationConfig.model_validate(hf["quantization_config"])
    assert parsed.quant_method == "compressed-tensors" and parsed.format == "float-quantized"
    assert parsed.ignore == ["lm_head"] and list(parsed.config_groups) == ["group_0"]
    scheme = parsed.config_groups["group_0"]
    assert scheme.targets == ["Linear"]
    weights = scheme.weights
    assert (weights.num_bits, weights.type, weights.strategy) == (
        8,
        QuantizationType.FLOAT,
        QuantizationStrategy(weight_scales),
    )
    assert weights.symmetric and not weights.dynamic
    # the scale compressed-tensors itself makes for a linear of this scheme has the shape we wrote
    tensors = read_file(directory)
    for name in ("model.layers.0.self_attn.k_proj", "model.layers.0.mlp.down_proj"):
        out_features, in_features = tensors[name + ".weight"].shape
        linear = torch.nn.Linear(in_features, out_features, bias=False)
        initialize_module_for_quantization(linear, scheme)
        assert linear.weight_scale.shape == tensors[name + ".weight_scale"].shape, name
    if mode == "dynamic":
        acts = scheme.input_activations
        assert (acts.num_bits, acts.type, acts.strategy) == (
            8,
            QuantizationType.FLOAT,
            QuantizationStrategy.TENSOR,
        )
        assert acts.dynamic and acts.symmetric
    else:
        assert scheme.input_activations is None
    assert quantization_from_config(hf["quantization_config"]) == (f"fp8-{mode}", weight_scales)


@pytest.mark.parametrize(("weight_scales", "declared"), [("tensor", "channel"), ("channel", "tensor")])
def test_export_scales_that_disagree_with_the_config_are_refused_at_load(
    request, tmp_path, weight_scales, declared
):
    """A checkpoint whose config.json declares the other weight strategy than its scales have."""
    source, _ = request.getfixturevalue(export_fixture("qwen3", weight_scales))["dynamic"]
    directory = shutil.copytree(source, tmp_path / "edited")
    hf = json.loads((directory / "config.json").read_text())
    hf["quantization_config"]["config_groups"]["group_0"]["weights"]["strategy"] = declared
    (directory / "config.json").write_text(json.dumps(hf))
    shape = r"\[1\]" if weight_scales == "tensor" else r"\[\d+, 1\]"
    with pytest.raises(
        LoadError, match=rf"weight_scale: shape {shape} in the checkpoint.*strategy '{declared}'"
    ):
        load_model(str(directory))


def test_export_report_says_what_was_measured(exported, exported_channel):
    directory, report = exported["weight-only"]
    assert json.loads((directory / "report.json").read_text()) == report
    assert (
        report["weight_scales"] == "tensor" and exported_channel["dynamic"][1]["weight_scales"] == "channel"
    )
    assert report["num_quantized_linears"] == len(report["weight_relative_error"]["per_linear"]) == 14
    assert report["logits"]["num_positions"] == 4 * 32
    sizes = report["size_bytes"]
    assert sizes["after"] == (directory / "model.safetensors").stat().st_size < sizes["before"]


def test_export_of_a_preset_says_its_weights_are_random(exported, hf_checkpoint, tmp_path):
    from export.__main__ import run_export

    directory, _ = exported["weight-only"]
    assert json.loads((directory / "config.json").read_text())[RANDOM_WEIGHTS_KEY] is True
    assert Engine.load(str(directory), ENGINE).info()["random_weights"] is True
    _, real = hf_checkpoint("gqa2-untied")  # random too, but nothing says so: we cannot know
    run_export(str(real), tmp_path / "fp8")
    assert RANDOM_WEIGHTS_KEY not in json.loads((tmp_path / "fp8" / "config.json").read_text())
    assert Engine.load(str(tmp_path / "fp8"), ENGINE).info()["random_weights"] is False
