"""What a result was measured on, and the physical floor it can be read against.

A greedy decode step at batch 1 is memory-bound: it must read every weight once (the tied embedding too, as
the lm_head) and the KV cache of every context position. So a k-token draft cannot take less than
k × bytes-per-step ÷ memory bandwidth, measured here with a large read-only reduction on the same device.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import time
from importlib import metadata

import torch

PACKAGES = ("torch", "torchao", "transformers", "starlette", "hypercorn", "orjson")


def describe(device: str) -> dict:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    except OSError:
        pass
    machine = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu,
        "cpu_cores": len(os.sched_getaffinity(0)),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "device": device,
        "device_name": torch.cuda.get_device_name(device) if device.startswith("cuda") else cpu,
        "torch_threads": torch.get_num_threads(),
        "versions": {},
    }
    for package in PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            machine["versions"][package] = metadata.version(package)
    return machine


def measure_bandwidth(device: str, repeats: int = 10) -> float:
    """Read bandwidth in bytes/s: the best of `repeats` sums over a buffer far larger than any cache."""
    size = 2**30 if device.startswith("cuda") else 2**28
    buffer = torch.ones(size // 4, dtype=torch.float32, device=device)
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        buffer.sum()
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return size / best


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes one decode step reads of the weights: every tensor once (a tied embedding is one tensor, read
    whole as the lm_head); an untied input embedding only gives one row per token, so it is not counted."""
    seen, total = set(), 0
    untied_embedding = None
    if model.lm_head.weight is not model.model.embed_tokens.weight:
        untied_embedding = model.model.embed_tokens.weight.data_ptr()
    for tensor in [*model.parameters(), *model.buffers()]:
        pointer = tensor.data_ptr()
        if pointer in seen or pointer == untied_embedding:
            continue
        seen.add(pointer)
        total += tensor.numel() * tensor.element_size()
    return total


def served_weight_bytes(loaded, dtype: torch.dtype, device: str) -> int:
    """`weight_bytes` of a loaded checkpoint (engine/model/loader.py's LoadedModel) as the eager engine on
    `device` reads them per step (engine/model/cpu_linears.py). On the CPU in float32 an FP8 weight-only
    export keeps its one byte a weight where the CPU kernel builds, and its LM head is read as the export
    stored it (bf16: half the float32 the loader made of it); otherwise the CPU dequantizes each FP8 linear
    once at load into a plain weight (`dtype` for weight-only, float32 for dynamic). A GPU reads the fp8
    bytes."""
    counted = weight_bytes(loaded.model)
    if torch.device(device).type != "cpu" or loaded.quantization == "none":
        return counted
    if loaded.quantization == "fp8-weight-only" and dtype == torch.float32:
        from engine.model import cpu_gemv

        if cpu_gemv.available()[0] is not None:
            head = loaded.model.lm_head.weight
            narrow = torch.equal(head.to(torch.bfloat16).to(head.dtype), head)
            return counted - head.numel() * (head.element_size() - 2) * narrow
    served = torch.float32 if loaded.quantization == "fp8-dynamic" else dtype
    fp8 = [p for p in loaded.model.parameters() if p.dtype == torch.float8_e4m3fn]
    return counted + sum(p.numel() for p in fp8) * (served.itemsize - 1)


def resident_bytes() -> int | None:
    """This process's resident memory (Linux; None elsewhere)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def kv_bytes_per_position(config, element_size: int) -> int:
    """Bytes of keys and values one context position holds across all layers (`config`: a ModelConfig)."""
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * element_size


def step_bytes(weights: int, kv_per_position: int, context_len: int, k: int, batch: int) -> float:
    """Bytes the average decode step of a k-token draft must read: the weights once, and each of `batch`
    conversations' keys and values at exactly its length (growing by one a step). Paged attention reads
    exactly these; the old static-shape path read spans rounded up to a power of two, and a gathered copy."""
    return weights + batch * (context_len + (k - 1) / 2) * kv_per_position


def floor_ms(
    weights: int, kv_per_position: int, bandwidth: float, context_len: int, k: int, batch: int
) -> float:
    """The fastest a k-token draft of `batch` conversations can be: k steps at `step_bytes` each."""
    return k * step_bytes(weights, kv_per_position, context_len, k, batch) / bandwidth * 1e3
