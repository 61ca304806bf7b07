"""bench/device_check.py --smoke: the device check's whole pipeline on CPU (build, export both FP8 modes,
measure every attention path in-process and over HTTP, write JSON, Markdown and a plot)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.server_process import REPO


def test_device_check_smoke_runs_every_step_and_writes_its_report(tmp_path):
    out = tmp_path / "check"
    command = [sys.executable, "bench/device_check.py", "--smoke", "--out", str(out)]
    # PYTHONPATH: the script's imports must be this checkout's, whatever an installed copy says.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "device_check.json").read_text())
    assert set(result["build"]["checkpoints"]) == {"weight-only", "dynamic"}
    for directory in result["build"]["checkpoints"].values():
        assert json.loads((out / directory / "config.json").read_text())["drafter_random_weights"] is True
    assert result["gpu_tests"] == {"skipped": "no CUDA device (smoke run)"}
    rows = result["results"]
    variants = {row["variant"] for row in rows}
    assert variants == {f"fp8-weight-only {a} {w}" for a in ("sdpa", "flex") for w in ("in-process", "http")}
    assert len(rows) == 4 * 4 and result["skipped"] == []  # 4 cases (k 4/16, 1/4 clients) per variant
    for row in rows:
        assert 0 < row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"] and row["floor_ms"] > 0
        assert row["calls"] == 2 * row["concurrency"]
    assert all(row["ms_per_step"] > 0 for row in rows if "in-process" in row["variant"])
    assert all(facts["recompiles_after_warmup"] == 0 for facts in result["engines"].values())
    for name, facts in result["engines"].items():  # the HTTP path's own cost, from a lone client
        if name.endswith("http"):
            assert [row["context_len"] for row in facts["overhead"]] == [
                128,
                result["args"]["max_seq_len"] - 2,
            ]
            assert all(
                row["wall_ms"] > row["engine_ms"] > 0 and row["health_ms"] > 0 for row in facts["overhead"]
            )
    # The sdpa engine drafts in ~1 ms on a CPU, so a lone client's calls ran on the loop (flex takes ~12).
    assert result["engines"]["fp8-weight-only sdpa http"]["inline_batches"] > 0
    table = (out / "device_check.md").read_text()
    assert "| fp8-weight-only flex http | 96 | 16 | 4 |" in table and table.strip() in done.stdout
    assert "| fp8-weight-only sdpa http | 128 |" in table
    assert (out / "device_check.png").stat().st_size > 0


def test_device_check_budget_skips_what_does_not_fit_and_says_so(tmp_path):
    from bench.device_check import Budget

    budget = Budget(seconds=10)
    assert budget.allows("a short step", 5)
    assert not budget.allows("a long step", 60)
    assert len(budget.skipped) == 1 and budget.skipped[0].startswith("a long step: needs ~60 s")
