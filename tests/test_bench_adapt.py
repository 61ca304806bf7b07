"""`python -m bench.adapt` end to end at its smallest: the testbed target, two real servers on its drafter
(`--adapt` off and on), a stream of two short prompts; both servers report, every output is the target's
alone, and the files of `--out` are written. Whether adaptation pays is the full run's question
(bench/README.md), not a test's: a few dozen tokens never start a training round."""

from __future__ import annotations

import json

import pytest

from bench.adapt.run import main

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_tiny_stream_is_lossless_and_reports_both_servers(tmp_path):
    argv = [
        "--prompts",
        "2",
        "--max-new-tokens",
        "8",
        "--window",
        "1",
        "--think-s",
        "0.1",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    summary = report["summary"]
    assert summary["lossless"] and len(report["prompts"]) == 2 and len(summary["windows"]) == 2
    for side in ("off", "on"):
        assert all(row[side]["rounds"] >= 1 and row[side]["lossless"] for row in report["prompts"])
        assert summary["whole_stream"][side]["tokens_per_round"] >= 1
        assert summary["costs"]["call_ms"][side]["p50"] > 0
    assert report["adaptation"]["version"] == 0 and "swap_seconds" in report["adaptation"]
    assert (tmp_path / "report.md").read_text().count("\n| 0-0 |") == 1
    assert (tmp_path / "adapt.png").stat().st_size > 0


def test_adapt_latency_times_both_servers_at_each_client_count_and_counts_the_trainer(tmp_path):
    """`python -m bench.adapt.latency` at its smallest: each client count's row holds both servers' calls
    (the same conversations, so the same number of calls) and what the trainer did while timed."""
    from bench.adapt.latency import main as latency_main

    argv = ["--prompts", "2", "--max-new-tokens", "12", "--clients", "1,2", "--repeats", "1"]
    argv += ["--verify-ms", "1", "--think-s", "0.05", "--out", str(tmp_path)]
    assert latency_main(argv) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert [row["clients"] for row in report["rows"]] == [1, 2]
    for row in report["rows"]:
        assert row["calls"] >= 2 and row["off"]["p99"] >= row["off"]["p50"] > 0 and row["on"]["p50"] > 0
        assert set(row["trainer_while_timed"]) >= {"training_steps", "swaps"}
    assert (tmp_path / "report.md").read_text().count("\n| 2 |") == 1
    with pytest.raises(SystemExit):  # argparse's usage error, exit 2
        latency_main(["--clients", "0"])


def test_the_real_pair_missing_is_one_line_naming_the_fetch_and_its_stream_is_this_projects_code(
    tmp_path, capsys
):
    assert main(["--realpair", str(tmp_path / "nowhere")]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "python -m bench.realpair fetch" in error
    with pytest.raises(SystemExit):  # one pair at a time
        main(["--realpair", "--testbed"])
    from bench.adapt.latency import main as latency_main

    capsys.readouterr()  # the usage error's
    assert latency_main(["--realpair", str(tmp_path / "nowhere")]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "python -m bench.realpair fetch" in error

    from bench.adapt.stream import code_stream_prompts
    from bench.testbed import PAIR

    # Any tokenizer cuts the same function heads; the testbed's is at hand where the real pair is not.
    prompts, source = code_stream_prompts(4, PAIR / "target" / "tokenizer.json")
    assert len(prompts) == 4 and all(prompt["name"].startswith("code/") for prompt in prompts)
    assert source["prompts_available"] >= 32 and all(name.endswith(".py") for name in source["files"])

    # --roots cuts it from other folders of the project, and a folder it does not have is refused at start.
    prompts, source = code_stream_prompts(3, PAIR / "target" / "tokenizer.json", ("tests",))
    assert all(name.startswith("tests/") for name in source["files"]) and "tests" in source["domain"]
    assert all(prompt["name"].startswith("code/tests/") for prompt in prompts)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["--realpair", "--roots", "tests,nowhere"])
    assert "no folder nowhere" in capsys.readouterr().err
