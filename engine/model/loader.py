"""Build our Qwen3 or Qwen2 from an HF-layout directory (or a preset) without an extra copy of the weights.

The model is created on the meta device, every tensor of the checkpoint is checked against the name, shape
and dtype the model expects, and then assigned in place. FP8 checkpoints (see `export/`) swap the decoder
linears for FP8 modules before the check, so their fp8 bytes stay fp8 in memory.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from engine.model.config import ConfigError, ModelConfig
from engine.model.errors import LoadError
from engine.model.presets import PRESETS, is_preset, preset_state_dict
from engine.model.qwen3 import Qwen3

log = logging.getLogger(__name__)
# config.json key that export/ sets on a preset's checkpoint, so "these weights are random" survives export.
RANDOM_WEIGHTS_KEY = "drafter_random_weights"


@dataclass(frozen=True, slots=True)
class LoadedModel:
    model: Qwen3
    config: ModelConfig
    quantization: str  # "none" | "fp8-weight-only" | "fp8-dynamic"
    source: str
    is_random_preset: bool  # a preset, or a checkpoint exported from one (RANDOM_WEIGHTS_KEY)
    fallbacks: tuple[
        str, ...
    ] = ()  # what this device cannot run as the checkpoint asks, and what runs instead
    weight_scales: str | None = None  # FP8: "tensor" or "channel" (one scale per output row); else None


def read_hf_config(directory: Path) -> dict:
    if not directory.is_dir():
        raise LoadError(f"model directory {str(directory)!r} does not exist (or is not a directory)")
    path = directory / "config.json"
    if not path.is_file():
        raise LoadError(
            f"{str(directory)!r} has no config.json; expected an HF Qwen3 or Qwen2 checkpoint directory"
        )
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise LoadError(f"{path}: not valid JSON ({error})") from None


def checkpoint_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [s for s in shards if not (directory / s).is_file()]
        if missing:
            raise LoadError(f"{directory}: shards listed in the index are missing: {missing[:3]}")
        return [directory / s for s in shards]
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise LoadError(
            f"{str(directory)!r} has no *.safetensors weights (pickled .bin files are not loaded)"
        )
    return files


def read_tensors(files: list[Path]) -> dict[str, torch.Tensor]:
    tensors = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                tensors[name] = f.get_tensor(name)
    return tensors


def build_empty(config: ModelConfig, quantization: str, weight_scales: str | None = None) -> Qwen3:
    with torch.device("meta"):
        model = Qwen3(config)
    if quantization != "none":
        from engine.model.fp8 import swap_fp8_linears

        swap_fp8_linears(model, quantization, weight_scales)
    return model


def check_and_cast(model: Qwen3, tensors: dict[str, torch.Tensor], dtype, device) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors as the model expects them: exact names and shapes, in our dtype."""
    expected = dict(model.state_dict())
    if model.config.tie_word_embeddings:
        expected.pop("lm_head.weight")
        tensors.pop("lm_head.weight", None)  # some checkpoints store the tied copy; it is the embedding
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {missing[:3]})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (e.g. {unexpected[:3]})")
        raise LoadError(
            f"checkpoint tensors do not match a {model.config.family} model of this config: "
            + "; ".join(parts)
        )
    out = {}
    for name, want in expected.items():
        got = tensors[name]
        if got.shape != want.shape:
            why = f"tensor {name}: shape {list(got.shape)} in the checkpoint, {list(want.shape)} expected"
            if name.endswith(".weight_scale"):  # the FP8 module's shape is the one config.json declares
                strategy = model.get_submodule(name.removesuffix(".weight_scale")).weight_scales
                why += f" by config.json's quantization_config (weights strategy {strategy!r})"
            raise LoadError(why)
        # fp8 weights and their fp32 scales keep the dtype the FP8 module declares; the rest take ours.
        keep = want.dtype == torch.float8_e4m3fn or name.endswith("_scale")
        if want.dtype == torch.float8_e4m3fn and got.dtype != torch.float8_e4m3fn:
            raise LoadError(f"tensor {name}: dtype {got.dtype} in the checkpoint, float8_e4m3fn expected")
        out[name] = got.to(device=device, dtype=want.dtype if keep else dtype)
    return out


def load_model(
    source: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> LoadedModel:
    """Load a preset name (`tiny`, `bench-cpu`) or an HF-layout directory of Qwen3 or Qwen2 weights."""
    fallbacks: tuple[str, ...] = ()
    weight_scales = None
    if is_preset(source):
        config, quantization = PRESETS[source], "none"
        tensors = preset_state_dict(source)
        random_weights = True
    else:
        directory = Path(source)
        hf = read_hf_config(directory)
        try:
            config = ModelConfig.from_hf(hf)
        except ConfigError as error:
            raise LoadError(f"{directory}: {error}") from None
        quantization = "none"
        if "quantization_config" in hf:
            from engine.model.fp8 import quantization_from_config, servable_quantization

            quantization, weight_scales = quantization_from_config(hf["quantization_config"])
            quantization, why = servable_quantization(quantization, device)
            if why:  # logged by the engine that records it (Lifecycle.fall_back)
                fallbacks = (why,)
        tensors = read_tensors(checkpoint_files(directory))
        random_weights = hf.get(RANDOM_WEIGHTS_KEY) is True
    model = build_empty(config, quantization, weight_scales)
    model.load_state_dict(check_and_cast(model, tensors, dtype, device), strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    leftover = [n for n, p in model.named_parameters() if p.is_meta] + [
        n for n, b in model.named_buffers() if b.is_meta
    ]
    if leftover:
        raise LoadError(f"tensors left unassigned after loading: {leftover[:3]}")
    model.eval().requires_grad_(False)
    scales = f", {weight_scales} weight scales" if weight_scales else ""
    log.info("loaded %s (%s%s, %s) on %s", source, quantization, scales, dtype, device)
    return LoadedModel(model, config, quantization, source, random_weights, fallbacks, weight_scales)
