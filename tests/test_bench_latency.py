"""bench/latency.py: its baselines draft what the engine drafts, its workload grows as speculative decoding
does, and the script writes the JSON and plot its contract promises (a real, small run with a server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from bench.harness import baselines, machine
from bench.harness.runners import engine_round, run_lockstep, sequential_round
from bench.harness.workload import Conversation
from bench.latency import parse_args, sweep_cases
from engine.config import EngineConfig
from engine.engine import Engine
from engine.model.loader import load_model
from engine.model.presets import PRESETS, write_preset
from tests.server_process import REPO

RESULT_FIELDS = {"variant", "pattern", "context_len", "num_draft_tokens", "concurrency"}
RESULT_FIELDS |= {"p50_ms", "p90_ms", "p99_ms", "mean_ms", "step_mb", "step_ms"}


def test_growing_context_extends_by_an_accepted_prefix_plus_one_target_token():
    conversation = Conversation("growing", 50, vocab_size=1000, seed=1)
    for _ in range(20):
        before, drafts = list(conversation.context()), [7, 8, 9, 10]
        conversation.accept(drafts)
        after = conversation.context()
        accepted = len(after) - len(before) - 1
        assert 0 <= accepted <= len(drafts)
        assert after[: len(before) + accepted] == before + drafts[:accepted]


def test_cold_contexts_are_fresh_every_call():
    conversation = Conversation("cold", 64, vocab_size=1000, seed=1)
    first = list(conversation.context())
    conversation.accept([1, 2])
    assert len(conversation.context()) == 64 and conversation.context()[:8] != first[:8]


def test_shared_contexts_are_new_conversations_after_one_common_prompt():
    a, b = (Conversation("shared", 64, vocab_size=1000, seed=s, prompt_seed=7) for s in (1, 2))
    first = list(a.context())
    assert a.context()[:48] == b.context()[:48] and a.context()[48:] != b.context()[48:]
    a.accept([1, 2])
    assert len(a.context()) == 64 and a.context()[:48] == first[:48] and a.context()[48:] != first[48:]


def test_baselines_draft_what_the_engine_drafts_along_a_growing_conversation(tmp_path):
    """The ratio means something only if both sides compute the same drafts on the same contexts."""
    model = baselines.load_hf_model(str(write_preset("tiny", tmp_path)), torch.float32, "cpu")
    engine = Engine.load("tiny", EngineConfig(max_seq_len=512, max_draft_tokens=8))
    seen = {name: [] for name in ("engine", "hf-generate", "hf-reuse")}

    def recording(name, draft_round):
        def wrapped(contexts, k):
            drafts = draft_round(contexts, k)
            seen[name].append(drafts)
            return drafts

        return wrapped

    rounds = {
        "engine": engine_round(engine, "t"),
        "hf-generate": sequential_round([baselines.HFGenerate(model)]),
        "hf-reuse": sequential_round([baselines.HFReuse(model)]),
    }
    for name, draft_round in rounds.items():
        conversation = Conversation("growing", 100, PRESETS["tiny"].vocab_size, seed=3)
        run_lockstep(recording(name, draft_round), [conversation], k=6, calls=8)
    assert seen["hf-generate"] == seen["engine"]
    assert seen["hf-reuse"] == seen["engine"]


def test_weight_bytes_count_the_tied_embedding_once():
    config = PRESETS["tiny"]
    h, d, i = config.hidden_size, config.head_dim, config.intermediate_size
    per_layer = (
        (config.num_attention_heads * d * h * 2) + (config.num_key_value_heads * d * h * 2) + 3 * h * i
    )
    per_layer += 2 * h + 2 * d  # norms
    expected = 4 * (config.vocab_size * h + h + config.num_hidden_layers * per_layer)  # float32
    assert machine.weight_bytes(load_model("tiny").model) == expected


def test_served_weight_bytes_count_fp8_linears_as_the_cpu_serves_them():
    """On the CPU in float32 the engine reads an FP8 export's linears as their fp8 bytes (the CPU kernel)
    and its tied head as the bf16 the export stored; in bf16, and for dynamic exports, it turns them into
    plain weights at load, so a step reads those bytes; on a GPU the fp8 bytes."""
    from bench.testbed import PAIR
    from engine.model import cpu_gemv

    plain = load_model(str(PAIR / "drafter"))
    exported = {mode: load_model(str(PAIR / f"drafter-fp8-{mode}")) for mode in ("weight-only", "dynamic")}
    scales = 4 * 7 * plain.config.num_hidden_layers
    as_loaded = machine.weight_bytes(exported["weight-only"].model)
    if cpu_gemv.available()[0] is not None:
        head = exported["weight-only"].model.lm_head.weight.numel()
        served = machine.served_weight_bytes(exported["weight-only"], torch.float32, "cpu")
        assert served == as_loaded - 2 * head
    else:
        assert machine.served_weight_bytes(exported["weight-only"], torch.float32, "cpu") == (
            machine.weight_bytes(plain.model) + scales
        )
    # bf16 weight-only: the fp8 linears read as bf16; dynamic: as float32 whatever the dtype.
    linears = sum(p.numel() for p in exported["weight-only"].model.parameters() if p.dtype.itemsize == 1)
    assert machine.served_weight_bytes(exported["weight-only"], torch.bfloat16, "cpu") == as_loaded + linears
    assert machine.served_weight_bytes(exported["dynamic"], torch.bfloat16, "cpu") == as_loaded + 3 * linears
    assert machine.served_weight_bytes(exported["weight-only"], torch.float32, "cuda") == as_loaded
    assert machine.served_weight_bytes(plain, torch.float32, "cpu") == machine.weight_bytes(plain.model)


def test_sweep_varies_one_factor_at_a_time_around_the_centre():
    args = parse_args(
        ["--quick", "--contexts", "128,1024,4096", "--draft-lengths", "4,8", "--concurrency", "1,4"]
    )
    cases = {(c["context_len"], c["num_draft_tokens"], c["concurrency"]) for c in sweep_cases(args)}
    assert cases == {(128, 8, 1), (1024, 8, 1), (4096, 8, 1), (1024, 4, 1), (1024, 8, 4)}


def test_graphs_variant_needs_cuda():
    with pytest.raises(SystemExit):
        parse_args(["--quick", "--variants", "graphs"])


def test_script_writes_the_json_and_plot_of_its_contract(tmp_path):
    out, png = tmp_path / "latency.json", tmp_path / "latency.png"
    command = [sys.executable, "bench/latency.py", "--quick", "--contexts", "64,256", "--draft-lengths", "4"]
    command += ["--concurrency", "1,2", "--calls", "3", "--json", str(out), "--plot", str(png)]
    # An A/B in one run: a second server with other flags, every case twice with the variants in turn.
    command += ["--server-flags=", "--server-flags=--draft-ahead=2", "--repeats", "2"]
    # PYTHONPATH: the script's `bench` imports must be this checkout's, whatever an installed copy says.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert {"device", "versions", "cpu_cores"} <= report["machine"].keys()
    assert report["config"]["model"] == "tiny" and report["config"]["bandwidth_bytes_per_s"] > 0
    rows = report["results"]
    assert {r["variant"] for r in rows} == {
        "eager",
        "http",
        "http[--draft-ahead=2]",
        "hf-generate",
        "hf-reuse",
    }
    servers = report["config"]["variants"]
    assert servers["http"]["server_flags"] == "" and servers["http[--draft-ahead=2]"]["spawned"]
    assert {r["pattern"] for r in rows} == {"growing", "cold", "shared"}
    assert all(r["concurrency"] > 1 for r in rows if r["pattern"] == "shared")
    assert all(r["step_mb"] > 0 for r in rows)
    assert all("http_minus_in_process_ms" in r for r in rows if r["variant"] == "http")
    for row in rows:
        assert row.keys() >= RESULT_FIELDS
        assert 0 < row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"]
        assert row["calls"] == 2 * 3 * row["concurrency"]  # repeats x calls x clients, pooled
        assert ("speedup_vs_hf_generate" in row) == (row["concurrency"] == 1)
    assert not any(r["variant"].startswith("hf-") and r["concurrency"] > 1 for r in rows)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| eager | growing | 256 | 4 | 1 |" in done.stdout
