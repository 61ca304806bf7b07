"""`python -m export` from the outside: bad input fails with one clear line and a non-zero exit, and never
leaves a destination (or a temporary directory) behind; a good run prints a clean summary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import export.checkpoint
from export.__main__ import main, run_export

ROOT = Path(__file__).resolve().parents[1]


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def fails(argv: list[str], capsys, message: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err


def test_export_cli_missing_source(tmp_path, capsys):
    fails([str(tmp_path / "nope"), str(tmp_path / "dst")], capsys, "does not exist")
    assert not (tmp_path / "dst").exists() and leftovers(tmp_path) == []


def test_export_cli_source_of_another_family(tmp_path, capsys):
    source = tmp_path / "llama"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 8}))
    save_file({"x": torch.zeros(1)}, str(source / "model.safetensors"))
    fails([str(source), str(tmp_path / "dst")], capsys, "not a Qwen3 or Qwen2 checkpoint")
    fails([str(tmp_path), str(tmp_path / "dst")], capsys, "has no config.json")
    assert not (tmp_path / "dst").exists() and leftovers(tmp_path) == []


def test_export_cli_unknown_mode(tmp_path, capsys):
    fails(["tiny", str(tmp_path / "dst"), "--mode", "int4"], capsys, "unknown mode 'int4'")
    assert not (tmp_path / "dst").exists() and leftovers(tmp_path) == []


def test_export_cli_unknown_scales(tmp_path, capsys):
    fails(["tiny", str(tmp_path / "dst"), "--scales", "group"], capsys, "unknown scales 'group'")
    assert not (tmp_path / "dst").exists() and leftovers(tmp_path) == []


def test_export_cli_refuses_an_existing_destination_without_force(tmp_path, capsys):
    destination = tmp_path / "dst"
    destination.mkdir()
    (destination / "keep.txt").write_text("mine")
    fails(["tiny", str(destination)], capsys, "already exists; pass --force")
    assert [p.name for p in destination.iterdir()] == ["keep.txt"] and leftovers(tmp_path) == []
    assert main(["tiny", str(destination), "--force"]) == 0
    assert sorted(p.name for p in destination.iterdir()) == [
        "config.json",
        "model.safetensors",
        "report.json",
    ]
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("existing", [False, True])
def test_export_failure_midway_leaves_no_half_written_destination(tmp_path, monkeypatch, existing):
    destination = tmp_path / "dst"
    if existing:
        destination.mkdir()
        (destination / "keep.txt").write_text("mine")

    def disk_full(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(export.checkpoint, "save_file", disk_full)
    with pytest.raises(OSError, match="No space left"):
        run_export("tiny", destination, force=True)
    assert leftovers(tmp_path) == []
    if existing:
        assert [p.name for p in destination.iterdir()] == ["keep.txt"]
    else:
        assert not destination.exists()


def test_export_cli_runs_cleanly_as_a_module(tmp_path):
    destination = tmp_path / "fp8"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "export",
            "tiny",
            str(destination),
            "--mode",
            "dynamic",
            "--scales",
            "channel",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for noise in ("Traceback", "_C_mxfp8", "Failed to load", "register_constant", "Warning"):
        assert noise not in output, output
    assert "greedy next-token agreement" in output and "one scale per channel" in output
    assert f"wrote {destination} (dynamic, channel weight scales)" in output
    group = json.loads((destination / "config.json").read_text())["quantization_config"]["config_groups"][
        "group_0"
    ]
    assert group["input_activations"]["dynamic"] is True and group["weights"]["strategy"] == "channel"
