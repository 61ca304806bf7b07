"""The FP8 checkpoint on disk: where the source comes from, and what the destination holds.

A destination is `config.json` (the source's HF config plus a compressed-tensors `quantization_config`),
`model.safetensors` (fp8 `.weight` + float32 `.weight_scale` per decoder linear, `[1]` per tensor or `[out, 1]`
per channel, bf16 for the rest
(Qwen2's q/k/v `.bias` included, beside its linear's fp8 weight, as compressed-tensors and vLLM read it),
no lm_head when it is tied) and the source's tokenizer files. It is written into a temporary directory next
to the destination and renamed into place at the end, so a failure never leaves a half-written one.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from engine.model.config import ConfigError, ModelConfig
from engine.model.presets import PRESETS, is_preset, write_preset
from export.quantize import LINEAR_NAMES, fp8_parts
from export.staging import ExportError

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "generation_config.json",
)
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_source(source: str, scratch: Path) -> Path:
    """A local HF directory for `source`: the directory itself, a GGUF file or a preset written into
    `scratch`, or a hub snapshot. Refuses anything that is not a Qwen3 or Qwen2 checkpoint our engine can serve."""
    path = Path(source).expanduser()
    if path.is_file():  # export.gguf refuses, in one line, a file that is not a GGUF of a served family
        from export.gguf import convert_gguf

        directory = convert_gguf(path, scratch / "hf")
    elif path.exists():
        directory = path
    elif is_preset(source):
        directory = write_preset(source, scratch / source)
    elif HUB_ID.match(source):
        directory = download(source)
    else:
        raise ExportError(
            f"source {source!r} does not exist; expected a Qwen3 or Qwen2 directory, a GGUF file, a hub id (owner/name) "
            f"or a preset ({', '.join(PRESETS)})"
        )
    check_source(directory)
    return directory


def download(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "*.txt", "*.jinja"]
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns))
    except Exception as error:  # noqa: BLE001 - offline, unknown repo, gated: all the same to the user
        raise ExportError(
            f"could not fetch {repo_id!r} from the hub: {type(error).__name__}: {error}"
        ) from None


def check_source(directory: Path) -> dict:
    """The source's HF config, once it is known to be an unquantized checkpoint of a family we serve."""
    if not directory.is_dir():
        raise ExportError(f"source {str(directory)!r} is not a directory")
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ExportError(
            f"source {str(directory)!r} has no config.json; expected an HF Qwen3 or Qwen2 checkpoint"
        )
    try:
        hf = json.loads(config_path.read_text())
    except json.JSONDecodeError as error:
        raise ExportError(f"{config_path}: not valid JSON ({error})") from None
    if "quantization_config" in hf:
        raise ExportError(
            f"source {str(directory)!r} is already quantized; export from the unquantized model"
        )
    try:
        ModelConfig.from_hf(hf)
    except ConfigError as error:
        raise ExportError(
            f"source {str(directory)!r} is not a Qwen3 or Qwen2 checkpoint we can serve: {error}"
        ) from None
    if not list(directory.glob("*.safetensors")):
        raise ExportError(
            f"source {str(directory)!r} has no *.safetensors weights (pickled .bin is not read)"
        )
    return hf


def quantization_config(mode: str, weight_scales: str = "tensor") -> dict:
    """compressed-tensors' layout for FP8 weights with one scale per tensor or per output channel
    (`weight_scales`: the weights' "strategy"), with dynamic per-tensor fp8 activations in the `dynamic`
    mode and none in `weight-only`. (Dynamic activations need no stored scale, so "tensor" is valid beside
    either weight strategy: compressed-tensors parses it and vLLM runs it; vLLM quantizes them per token.)"""
    weights = {"num_bits": 8, "type": "float", "strategy": weight_scales, "symmetric": True, "dynamic": False}
    activations = None
    if mode == "dynamic":
        activations = {
            "num_bits": 8,
            "type": "float",
            "strategy": "tensor",
            "symmetric": True,
            "dynamic": True,
        }
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": weights,
                "input_activations": activations,
                "output_activations": None,
                "format": "float-quantized",
            }
        },
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
    }


def checkpoint_tensors(model, show_progress: bool = True) -> dict[str, torch.Tensor]:
    """The state dict to save: fp8 bytes and scales for the quantized linears, bf16 for everything else."""
    tied = model.config.tie_word_embeddings
    tensors = {}
    layers = model.model.layers
    for index, layer in enumerate(tqdm(layers, desc="saving", unit="layer", disable=not show_progress)):
        prefix = f"model.layers.{index}."
        quantized = {f"{name}.weight" for name in LINEAR_NAMES}
        for name, tensor in layer.state_dict().items():
            if name in quantized:
                tensors[prefix + name], tensors[prefix + name + "_scale"] = fp8_parts(tensor)
            else:
                tensors[prefix + name] = tensor.detach().to(torch.bfloat16).contiguous()
    for name, tensor in model.state_dict().items():
        if name.startswith("model.layers.") or (tied and name == "lm_head.weight"):
            continue
        tensors[name] = tensor.detach().to(torch.bfloat16).contiguous()
    return tensors


def write_checkpoint(
    directory: Path, model, hf_config: dict, mode: str, source: Path, weight_scales: str = "tensor"
) -> None:
    config = {**hf_config, "quantization_config": quantization_config(mode, weight_scales)}
    for key in [k for k in ("dtype", "torch_dtype") if k in config] or ["torch_dtype"]:
        config[key] = "bfloat16"
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(checkpoint_tensors(model), str(directory / "model.safetensors"), metadata={"format": "pt"})
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, directory / name)


def size_of(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.glob("*.safetensors"))
