"""bench.device.check --smoke: the device check's pipeline on CPU, every kind of stage in the device's
order (export, flex and sdpa in-process, a server over HTTP), each in its own process, the report rewritten
after every stage; and a stage that raises does not sink the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.server_process import REPO


def run_check(tmp_path, *flags: str, work=None) -> tuple[subprocess.CompletedProcess, dict, str]:
    out, work = tmp_path / "check", work or tmp_path / "work"
    command = [
        sys.executable,
        "-m",
        "bench.device.check",
        "--smoke",
        "--out",
        str(out),
        "--work",
        str(work),
        *flags,
    ]
    # PYTHONPATH: the script's imports must be this checkout's, whatever an installed copy says.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    result = json.loads((out / "device_check.json").read_text())
    return done, result, (out / "device_check.md").read_text()


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    root = tmp_path_factory.mktemp("smoke")
    return (*run_check(root), root / "work")


def test_device_check_smoke_runs_every_stage_and_writes_its_report(smoke):
    done, result, table, _ = smoke
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    names = [s["stage"] for s in result["stages"]]
    assert all(s["status"] == "ok" for s in result["stages"]), result["stages"]
    # the production path (flex) before the comparisons; the report rewritten after every stage
    assert names.index("fp8-weight-only flex in-process") < names.index("fp8-weight-only sdpa in-process")
    written = [line.removeprefix("wrote device_check.json after stage ") for line in done.stdout.splitlines()]
    assert [w for w in written if w in names] == names
    assert set(result["exports"]) == {"export fp8-weight-only"}
    rows = result["results"]
    variants = {row["variant"] for row in rows}
    assert variants == {
        "fp8-weight-only flex in-process",
        "fp8-weight-only sdpa in-process",
        "fp8-weight-only sdpa http",
    }
    assert len(rows) == 3 * 2 and result["skipped"] == []  # 2 cases (k 8, 1 and 4 clients) per variant
    for row in rows:
        assert 0 < row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"] and row["floor_ms"] > 0
        assert row["calls"] == 2 * row["concurrency"]
        assert row["fallbacks"] == [] and row["num_graphs"] == 0  # every row says what path it measured
    assert all(row["ms_per_step"] > 0 for row in rows if "in-process" in row["variant"])
    assert all(facts["recompiles_after_warmup"] == 0 for facts in result["engines"].values())
    for name, facts in result["engines"].items():  # the HTTP path's own cost, from a lone client
        if name.endswith("http"):
            # 2048 capped at the server's context: 96 + 3 calls x 9 positions + 8, less 2
            assert [row["context_len"] for row in facts["overhead"]] == [128, 129]
            assert all(
                row["wall_ms"] > row["engine_ms"] > 0 and row["health_ms"] > 0 for row in facts["overhead"]
            )
    # The sdpa engine drafts in a few ms on a CPU, so a lone client's calls ran on the loop.
    assert result["engines"]["fp8-weight-only sdpa http"]["inline_batches"] > 0
    assert "| fp8-weight-only flex in-process | 96 | 8 | 4 |" in table and table.strip() in done.stdout
    assert "| fp8-weight-only sdpa http | 128 |" in table
    # Drafting ahead's B-branch loop against batch 1, every B measured (engine/ahead.py)
    ahead = result["engines"]["fp8-weight-only sdpa ahead loop"]["ahead_loop"]
    assert [row["branches"] for row in ahead] == [1, 4, 8, 16, 24]
    assert all(row["p50_ms"] > 0 and row["batch1_p50_ms"] > 0 for row in ahead)
    assert "| fp8-weight-only sdpa ahead loop | 24 |" in table


def test_device_check_survives_a_stage_that_raises(tmp_path):
    stages = "export fp8-weight-only,fp8-weight-only flex in-process,fp8-weight-only sdpa in-process"
    done, result, table = run_check(
        tmp_path, "--stages", stages, "--fail-stage", "fp8-weight-only flex in-process"
    )
    assert done.returncode == 1  # a failed stage fails the check, after every other stage ran
    records = {s["stage"]: s for s in result["stages"]}
    assert list(records) == stages.split(",")
    failed = records["fp8-weight-only flex in-process"]
    assert failed["status"].startswith("failed") and "asked to fail" in failed["log_tail"]
    assert records["fp8-weight-only sdpa in-process"]["status"] == "ok"
    assert {row["variant"] for row in result["results"]} == {"fp8-weight-only sdpa in-process"}
    assert "| fp8-weight-only flex in-process | failed (exit 1) |" in table


def test_device_check_budget_skips_what_does_not_fit_and_says_so():
    from bench.device.check import Budget

    budget = Budget(seconds=10)
    assert budget.allows("a short step", 5)
    assert not budget.allows("a long step", 60)
    assert len(budget.skipped) == 1 and budget.skipped[0].startswith("a long step: needs ~60 s")


def test_device_check_skips_stages_its_budget_no_longer_holds_and_says_so(tmp_path):
    done, result, table = run_check(tmp_path, "--budget-s", "1")
    assert done.returncode == 0 and result["stages"] == []
    assert [why.split(":")[0] for why in result["skipped"]] == [
        "export fp8-weight-only", "fp8-weight-only flex in-process", "fp8-weight-only sdpa in-process",
        "fp8-weight-only sdpa http", "fp8-weight-only sdpa ahead loop",
    ]  # fmt: skip
    assert "skipped: export fp8-weight-only: needs ~25 s" in table
