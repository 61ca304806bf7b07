"""bench/harness/gpu_floors.py: the shapes count each model's published parameters, the floors are bytes over
3.35 TB/s, Qwen3-8B's agrees with projection.py's documented defaults, and each model states its basis."""

from __future__ import annotations

import pytest

from bench.harness.gpu_floors import (
    GPU_MODELS,
    QWEN2_5_CODER_0_5B,
    QWEN2_5_CODER_1_5B,
    QWEN3_0_6B,
    QWEN3_8B,
    floor_ms,
)
from bench.harness.projection import GpuModel, project


@pytest.mark.parametrize(
    ("shape", "num_parameters"),
    [
        (QWEN2_5_CODER_0_5B, 494_032_768),
        (QWEN2_5_CODER_1_5B, 1_543_714_304),
        (QWEN3_0_6B, 596_049_920),
        (QWEN3_8B, 8_190_735_360),
    ],
)
def test_shapes_count_the_published_parameters(shape, num_parameters):
    assert shape.num_parameters() == num_parameters
    assert shape.fp8_bytes() < shape.bf16_bytes() == 2 * num_parameters


def test_floors_are_bytes_over_h100_bandwidth():
    real_pair = GPU_MODELS["qwen2.5-coder-1.5b"]
    assert real_pair.verify_ms == pytest.approx(3.0874e9 / 3.35e9, rel=1e-4)  # 0.92 ms
    assert real_pair.draft_step_ms == pytest.approx(floor_ms(QWEN2_5_CODER_0_5B.fp8_bytes()))
    assert 0.18 < real_pair.draft_step_ms < 0.19 and real_pair.draft_overhead_ms == 0.25
    qwen3, documented = GPU_MODELS["qwen3-8b"], GpuModel()
    assert qwen3.verify_ms == pytest.approx(documented.verify_ms, rel=0.01)
    assert qwen3.draft_step_ms == pytest.approx(documented.draft_step_ms, rel=0.03)
    for gpu in GPU_MODELS.values():
        assert "3.35 TB/s" in gpu.basis and "0.25 ms per draft call" in gpu.basis
    assert "untied input embedding" in qwen3.basis and "untied" not in real_pair.basis


def test_the_real_pairs_shapes_project_less_gain_than_qwen3s():
    """The same rounds (3 of 8 drafts, 4 kept each) gain less where a draft step is a fifth of a verify
    (0.5B over 1.5B) than where it is a twenty-second (0.6B over 8B)."""
    rounds = [(8, 4, True)] * 3
    real_pair = project(rounds, GPU_MODELS["qwen2.5-coder-1.5b"])["speedup"]
    qwen3 = project(rounds, GPU_MODELS["qwen3-8b"])["speedup"]
    assert 1 < real_pair < qwen3
