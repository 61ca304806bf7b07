"""`python -m bench.ahead`: its defaults on each pair (the testbed's as before, the real pair's sized for a
2-core CPU); `auto` floors from the pair's GPU ratio and a calibrated ahead step; the cold start picked out of
each conversation's calls; a real pair not on disk exits 2 with one line naming the fetch; and a small run
on a fake real pair (the testbed's models under a chat template) with a verify floor is lossless and
reports every setting of every workload."""

from __future__ import annotations

import json

import pytest

import bench.ahead_floor
from bench.ahead import cold_calls, main
from bench.ahead_args import parse_args
from bench.ahead_floor import settled_floors
from bench.harness.gpu_floors import GPU_MODELS
from bench.realpair.benchmark import DEFAULT_DIR
from bench.realpair.workloads import KINDS
from bench.testbed import PAIR
from tests.test_bench_realpair import fake_realpair  # noqa: F401 - the fixture, shared

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_testbed_is_the_default_pair_with_its_former_defaults():
    args = parse_args([], "")
    assert args.pair == args.testbed == PAIR and args.realpair is None and args.target == PAIR / "target"
    assert args.k == 8 and args.verify_floor_ms == [0.0] and args.max_prompts is None
    assert [path.stem for path in args.prompts] == ["code", "edit", "prose"]
    assert args.workloads == ["code", "edit", "prose"] and args.gpu.name == "H100, Qwen3-8B / 0.6B FP8"


def test_realpair_defaults_fit_a_two_core_cpu_and_quick_fits_less():
    args = parse_args(["--realpair"], "")
    assert args.pair == args.realpair == DEFAULT_DIR and args.testbed is None and args.prompts is None
    assert (args.k, args.max_prompts, args.max_new_tokens) == (3, 2, 64)  # 4 steps fit in 4.9
    assert args.verify_floor_ms == [0.0, "auto"] and args.gpu == GPU_MODELS["qwen2.5-coder-1.5b"]
    assert (args.drafter, args.device, args.dtype) == ("weight-only", "cpu", "float32")
    quick = parse_args(["--realpair", "elsewhere", "--quick", "--verify-floor-ms", "120"], "")
    assert (quick.max_prompts, quick.max_new_tokens, quick.verify_floor_ms) == (1, 48, [120.0])
    assert str(quick.target) == "elsewhere/target"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--quick"], "give --realpair"),
        (["--verify-floor-ms", "fast"], 'expected ms or "auto"'),
        (["--verify-floor-ms", "-1"], "at least 0 ms"),
        (["--testbed", "--realpair"], "not allowed with argument"),
    ],
)
def test_bad_command_lines_exit_2(capsys, argv, says):
    with pytest.raises(SystemExit) as exited:
        parse_args(argv, "")
    assert exited.value.code == 2 and says in capsys.readouterr().err


def test_auto_floor_is_the_gpu_ratio_times_the_calibrated_ahead_step(monkeypatch):
    monkeypatch.setattr(bench.ahead_floor, "ahead_step_ms", lambda *_: 250.0)
    args = parse_args(["--realpair"], "")
    given, auto = settled_floors(args, None, [], [])
    gpu = GPU_MODELS["qwen2.5-coder-1.5b"]
    assert given == {"ms": 0.0, "basis": "given"}
    assert auto["ms"] == pytest.approx(250.0 * gpu.verify_ms / gpu.draft_step_ms)
    assert "4.90) x the server's ahead step on an idle CPU (250.0 ms)" in auto["basis"]


def test_the_cold_start_is_each_conversations_first_two_calls():
    # Three conversations: five calls, one call, none.
    cold, firsts = cold_calls([0, 5, 6], 6)
    assert cold == {0, 1, 5} and firsts == {0, 5}


def test_a_real_pair_not_fetched_exits_2_with_one_line(tmp_path, capsys):
    assert main(["--realpair", str(tmp_path / "absent")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run `python -m bench.realpair fetch` first" in err, err


def test_a_floored_run_on_a_fake_real_pair_is_lossless_for_every_setting(fake_realpair, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "ahead.json"
    argv = ["--realpair", str(fake_realpair), "--quick", "--max-new-tokens=8", "--verify-floor-ms=40"]
    assert main([*argv, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["stop_at_eos"] and report["k"] == 3 and report["num_prompts"] == dict.fromkeys(KINDS, 1)
    assert [(r["workload"], r["draft_ahead"]) for r in report["rows"]] == [
        (kind, branches) for branches in (0, 8) for kind in ("code", "edit", "prose")
    ]
    for row in report["rows"]:
        assert row["lossless"] and row["verify_floor_ms"] == 40 and row["cold_calls"] >= 1
        assert row["call_ms_cold"]["p50"] is not None
    assert [server["draft_ahead"] for server in report["servers"]] == [0, 8]
    table = capsys.readouterr().out
    assert table.count("\n| code |") == 2 and "verify floor 40 ms: given" in table
