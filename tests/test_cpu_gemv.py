"""The CPU's FP8 and bf16 decode kernels (engine/model/cpu_gemv.py): every build exact, checked before it
serves, split over threads without changing a bit, and a machine that cannot build them served the old way."""

from __future__ import annotations

import ctypes
import logging
import shutil

import pytest
import torch
import torch.nn.functional as F

from engine.config import EngineConfig
from engine.engine import Engine
from engine.model import cpu_gemv
from engine.model.cpu_fp8 import CpuBf16Head, CpuFP8Linear
from engine.model.cpu_linears import CpuLinear, use_cpu_linears
from engine.model.loader import load_model
from tests.oracle import hf_greedy

needs_compiler = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler on PATH")
# -march for each path the C file has: what the build reports, and whether it serves.
BUILDS = [("native", None, True), ("haswell", "avx2", True), ("x86-64", "portable", False)]


@pytest.fixture
def rebuilt(monkeypatch, tmp_path):
    """Builds made in a fresh cache, and the process's kernel forgotten before and after."""
    monkeypatch.setenv("DRAFTER_KERNEL_CACHE", str(tmp_path))
    cpu_gemv.kernel.cache_clear()
    yield tmp_path
    cpu_gemv.kernel.cache_clear()


@needs_compiler
@pytest.mark.parametrize(("march", "isa", "serves"), BUILDS)
def test_cpu_gemv_every_build_converts_every_fp8_byte_exactly(rebuilt, monkeypatch, march, isa, serves):
    flags = tuple(f"-march={march}" if flag == "-march=native" else flag for flag in cpu_gemv.FLAGS)
    monkeypatch.setattr(cpu_gemv, "FLAGS", flags)
    built = cpu_gemv.Kernel(ctypes.CDLL(str(cpu_gemv.build())))
    assert built.isa == isa or (isa is None and built.isa in cpu_gemv.FAST_ISAS)
    cpu_gemv.self_check(built)  # raises on any difference
    if serves:
        assert cpu_gemv.kernel().isa == built.isa
    else:
        with pytest.raises(cpu_gemv.KernelUnavailable, match="neither AVX-512 nor AVX2"):
            cpu_gemv.kernel()


@needs_compiler
def test_cpu_gemv_self_check_refuses_a_build_that_is_slightly_off():
    """The negative control of the check every build passes before it serves."""
    good = cpu_gemv.kernel()

    class OffByAnUlp(cpu_gemv.Kernel):
        def __init__(self):
            self.isa = "off"

        def fp8(self, x, weight, scale, bias):
            out = good.fp8(x, weight, scale, bias)
            out[..., -1] = torch.nextafter(out[..., -1], torch.tensor(float("inf")))
            return out

    with pytest.raises(cpu_gemv.KernelUnavailable, match="converts fp8 bytes wrongly"):
        cpu_gemv.self_check(OffByAnUlp())


@needs_compiler
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9, 17])
# the last two are large enough to be split over threads (MIN_PARALLEL_BYTES in the C file)
@pytest.mark.parametrize(("out", "inner"), [(37, 50), (96, 64), (1030, 272), (300, 900)])
def test_cpu_gemv_products_equal_torch_s_and_do_not_depend_on_threads(rows, out, inner):
    kernel = cpu_gemv.kernel()
    generator = torch.Generator().manual_seed(rows * out)
    weight = (torch.randn(out, inner, generator=generator) * 40).to(torch.float8_e4m3fn)
    scale = torch.rand(out, generator=generator) + 0.1
    bias = torch.randn(out, generator=generator)
    half = torch.randn(out, inner, generator=generator).bfloat16()
    x = torch.randn(rows, inner, generator=generator)
    threads = kernel.threads
    try:
        kernel.threads = 1
        alone = kernel.fp8(x, weight, scale, bias), kernel.bf16(x, half)
        kernel.threads = 3  # more threads than cores splits the rows unevenly too
        split = kernel.fp8(x, weight, scale, bias), kernel.bf16(x, half)
    finally:
        kernel.threads = threads
    assert torch.equal(alone[0], split[0]) and torch.equal(alone[1], split[1])
    exact = weight.float() * scale[:, None]
    assert cpu_gemv.summed_alike(alone[0], F.linear(x, exact, bias), x, exact)  # float32 rounding only
    assert cpu_gemv.summed_alike(alone[1], x @ half.float().T, x, half.float())
    off = alone[0] + 1e-4 * (x.abs() @ exact.abs().T)  # the negative control: an error 10x the tolerance
    assert not cpu_gemv.summed_alike(off, F.linear(x, exact, bias), x, exact)


@needs_compiler
def test_fp8_engine_holds_one_byte_a_weight_and_the_embedding_once(exported):
    engine = Engine.load(str(exported["weight-only"][0]), EngineConfig(max_seq_len=128))
    model = engine.model
    linears = [m for m in model.modules() if isinstance(m, CpuFP8Linear)]
    assert len(linears) == 7 * len(model.model.layers) and engine.lifecycle.fallbacks == []
    assert all(m.weight_.dtype == torch.float8_e4m3fn for m in linears)
    embedding = model.model.embed_tokens.weight
    assert embedding.dtype == torch.bfloat16 and isinstance(model.lm_head, CpuBf16Head)
    assert model.lm_head.weight.data_ptr() == embedding.data_ptr()  # tied: one table, read as stored
    assert engine.packed_linears == len(linears) + 1
    assert engine.info()["cpu_kernel"] in cpu_gemv.FAST_ISAS


def test_an_embedding_bf16_cannot_hold_stays_float32(exported):
    loaded = load_model(str(exported["weight-only"][0]))
    with torch.no_grad():
        loaded.model.model.embed_tokens.weight[0, 0] += 1e-6  # no longer a bf16 value
    use_cpu_linears(loaded.model, torch.float32)
    assert loaded.model.model.embed_tokens.weight.dtype == torch.float32
    assert isinstance(loaded.model.lm_head, CpuLinear)


@pytest.mark.filterwarnings("ignore:You passed `quantization_config`:UserWarning")
@pytest.mark.parametrize("broken", ["missing", "failing"])
def test_without_a_working_compiler_fp8_is_served_dequantized_with_one_reason(
    rebuilt, monkeypatch, caplog, hf_checkpoint, exported_qwen2, broken
):
    """No compiler, or one that fails: the engine says why once (log and /info's fallbacks) and serves the
    dequantized float32 linears, whose drafts are still transformers' on the same weights."""
    failing = rebuilt / "cc"  # runs, and refuses to compile anything
    failing.write_text(
        '#!/bin/sh\n[ "$1" = --version ] && echo cc 0 && exit 0\necho "error: broken" >&2; exit 1\n'
    )
    failing.chmod(0o755)
    monkeypatch.setenv("CC", "/nonexistent/cc" if broken == "missing" else str(failing))
    directory, _ = exported_qwen2["weight-only"]
    with caplog.at_level(logging.WARNING):
        engine = Engine.load(str(directory), EngineConfig(max_seq_len=128))
    (why,) = engine.lifecycle.fallbacks
    assert why.startswith("FP8 weights dequantized to float32 at load")
    assert ("no C compiler" if broken == "missing" else "could not build the kernel: error: broken") in why
    assert engine.lifecycle.snapshot()["fallbacks"] == [why] and engine.info()["cpu_kernel"] is None
    assert sum(why in record.getMessage() for record in caplog.records) == 1
    assert not any(isinstance(m, CpuFP8Linear | CpuBf16Head) for m in engine.model.modules())
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    oracle = AutoModelForCausalLM.from_pretrained(
        directory, quantization_config=CompressedTensorsConfig(run_compressed=False), dtype=torch.float32
    ).eval()
    context = torch.randint(0, 700, (20,), generator=torch.Generator().manual_seed(5)).tolist()
    assert engine.draft(context, 8) == hf_greedy(oracle, context, 8)
