"""A GGUF file (llama.cpp's format) into a plain HF checkpoint directory that the export reads like any other.

`convert_gguf(gguf_path, out_dir, dtype)` checks the file before any slow work (the `GGUF` magic and
version, an architecture the engine serves, the packages transformers needs to read it), lets transformers
dequantize it (`from_pretrained(..., gguf_file=...)`), moves its weights into a fresh model of the same
class (transformers refuses to `save_pretrained` a model it loaded from GGUF), casts them to `dtype` and
saves `config.json`, `model.safetensors`, the tokenizer and its chat template. The directory is written
next to `out_dir` and renamed into place at the end, so an interrupted conversion leaves nothing behind.
It stops there: quantizing to FP8 is `export/__main__.py`'s job, from the directory this writes.
"""

from __future__ import annotations

import gc
import importlib.util
import logging
import struct
from collections import Counter
from pathlib import Path

import torch

from export.staging import ExportError, staged_directory

log = logging.getLogger("export")

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # what transformers' reader accepts; v1 (32-bit counts) is long gone
SERVED_ARCHITECTURES = ("qwen2", "qwen3")  # GGUF's `general.architecture` names of the engine's families
# The extra of ours that installs what transformers needs for GGUF: `gguf` (its reader and dequantizers for
# these architectures) and `accelerate` (which `from_pretrained(gguf_file=...)` insists on).
EXTRA = "realpair"
PACKAGES = ("gguf", "accelerate")


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write the model in `gguf_path` to `out_dir` (created; an existing empty directory is replaced) as an
    HF checkpoint in `dtype`, with its tokenizer. Returns `out_dir`; raises `ExportError` for a file it
    cannot convert, saying why in one line."""
    gguf_path, out_dir = Path(gguf_path).expanduser(), Path(out_dir).expanduser()
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ExportError(f"dtype must be a floating-point torch dtype, not {dtype!r}")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ExportError(f"GGUF conversion target {str(out_dir)!r} already exists and is not empty")
    metadata = read_metadata(gguf_path)
    check_packages()
    with staged_directory(out_dir, force=True) as staging:
        save_model(gguf_path, metadata, staging, dtype)
        save_tokenizer(gguf_path, staging)
    log.info("converted %s to %s", gguf_path.name, out_dir)
    return out_dir


def read_metadata(path: Path) -> dict:
    """The file's metadata (long arrays such as the vocabulary left as counts), once its magic, version and
    architecture are known to be ones we convert."""
    if not path.is_file():
        raise ExportError(f"GGUF file {str(path)!r} does not exist or is not a file")
    with path.open("rb") as file:
        head = file.read(8)
    if len(head) < 8 or head[:4] != MAGIC:
        raise ExportError(f"{str(path)!r} is not a GGUF file (it does not start with the bytes 'GGUF')")
    (version,) = struct.unpack("<I", head[4:8])
    if version not in VERSIONS:
        raise ExportError(f"{str(path)!r} is GGUF version {version}; versions {VERSIONS} are supported")
    # transformers' own reader, which needs no `gguf` package: an unservable file is refused without it
    from transformers.integrations.gguf import read_gguf_metadata

    try:
        metadata, tensor_names = read_gguf_metadata(str(path))
    except (ValueError, struct.error, IndexError, OverflowError, UnicodeDecodeError) as error:
        raise ExportError(f"{str(path)!r} is not a readable GGUF file: {error}") from None
    architecture = metadata.get("general.architecture")
    if architecture not in SERVED_ARCHITECTURES:
        raise ExportError(
            f"{str(path)!r} holds a {architecture!r} model; the engine serves {', '.join(SERVED_ARCHITECTURES)}"
        )
    if not tensor_names:
        raise ExportError(f"{str(path)!r} holds no tensors (a vocabulary-only GGUF?)")
    return metadata


def check_packages() -> None:
    missing = [name for name in PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise ExportError(
            f"reading a GGUF file needs the {' and '.join(missing)} package{'s' * (len(missing) > 1)}: "
            f"pip install 'drafter[{EXTRA}]'"
        )


def save_model(gguf_path: Path, metadata: dict, directory: Path, dtype: torch.dtype) -> None:
    """Dequantize with transformers (fp32), then save the same weights in `dtype` from a model that is not
    marked as GGUF-quantized. The fp32 weights are freed one by one as their casts are made, so the peak
    is about the fp32 model (measured: 3.2 GB for a Qwen2.5-0.5B-shaped Q8_0 file)."""
    from transformers import AutoModelForCausalLM

    types = Counter(tensor_type_names(gguf_path)).most_common()
    log.info(
        "loading and dequantizing %s (%s, %s%s)",
        gguf_path.name,
        metadata["general.architecture"],
        metadata.get("general.name", "unnamed"),
        "".join(f", {count} {name}" for name, count in types),
    )
    loaded, info = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent,
        gguf_file=gguf_path.name,
        dtype=torch.float32,
        local_files_only=True,
        output_loading_info=True,
    )
    problems = {kind: sorted(map(str, keys)) for kind, keys in info.items() if keys}
    if problems:  # a missing or misshapen weight would be left at its random initialization
        raise ExportError(f"{gguf_path.name}: transformers could not map every tensor: {problems}")
    model_class, config, state = type(loaded), loaded.config, loaded.state_dict()
    del loaded  # from here the state dict holds the only reference to each fp32 weight
    gc.collect()
    cast_in_place(state, dtype)
    clean_config(config, dtype)
    with torch.device("meta"):  # no random initialization, and no memory, for weights replaced below
        model = model_class(config)
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()  # what the config says, whatever the loading did
    del state
    log.info("saving the weights in %s", str(dtype).removeprefix("torch."))
    model.save_pretrained(directory)  # safetensors: the only format transformers 5 writes


def cast_in_place(state: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    """Replace each tensor by its `dtype` copy one at a time, freeing the original as it goes; names that
    share storage (tied embeddings: `state_dict()` gives each its own detached view) share the copy."""
    done: dict[tuple[int, torch.Size], torch.Tensor] = {}
    for name, tensor in state.items():
        key = (
            tensor.untyped_storage().data_ptr() + tensor.storage_offset() * tensor.element_size(),
            tensor.shape,
        )
        if key not in done:
            done[key] = tensor.detach().to(dtype).contiguous()
        state[name] = done[key]
    done.clear()


def clean_config(config, dtype: torch.dtype) -> None:
    """The config of a plain checkpoint: no GGUF quantization, the save dtype, and float32 metadata values
    (GGUF stores them so) printed the way their source config wrote them (1e-06, not 9.99999997e-07)."""
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = dtype
    if isinstance(getattr(config, "rms_norm_eps", None), float):
        config.rms_norm_eps = shortest_float32(config.rms_norm_eps)


def shortest_float32(value: float) -> float:
    """The shortest decimal that reads back as the same float32: what the config held before llama.cpp's
    converter stored it in 32 bits."""
    import numpy as np

    return float(str(np.float32(value)))


def save_tokenizer(gguf_path: Path, directory: Path) -> None:
    """The tokenizer transformers rebuilds from the file's vocabulary, merges and chat template."""
    from transformers import AutoTokenizer

    log.info("rebuilding the tokenizer from %s", gguf_path.name)
    tokenizer = AutoTokenizer.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, local_files_only=True
    )
    if not tokenizer.chat_template:
        log.warning("%s has no chat template; the checkpoint will have none either", gguf_path.name)
    tokenizer.save_pretrained(directory)


def tensor_type_names(path: Path) -> list[str]:
    """The ggml type of each tensor (F32, F16, Q8_0, Q4_K, ...), for the progress line; none for a file
    whose types transformers' own header reader does not know (the `gguf` package still dequantizes it)."""
    from gguf import GGMLQuantizationType
    from transformers.integrations.gguf.reader import GgufHeader

    try:
        tensors = GgufHeader.from_file(str(path)).tensors
    except ValueError:
        return []
    return [GGMLQuantizationType(info.ggml_type).name for info in tensors]
