"""The command line: flags beat DRAFTER_* variables beat defaults, bad settings (and a port already taken)
end with one error line naming the flag or variable and status 2 (no traceback), `./serve.sh` with no
arguments serves the tiny preset on CPU, and an export of a preset is served as random weights."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import httpx
import pytest

from drafter.server.cli import config_from_args
from tests.server_process import REPO, ServerProcess

CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}


def clean_environ(**extra) -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("DRAFTER_")} | CPU_ONLY | extra


def test_cli_flag_beats_variable_beats_default():
    config = config_from_args(["--max-queue", "9"], {"DRAFTER_MAX_QUEUE": "5", "DRAFTER_PORT": "9001"})
    assert config.max_queue == 9
    assert config.port == 9001
    assert config.host == "127.0.0.1"
    assert config.max_draft_tokens == 16
    assert config.model == "tiny"


def test_cli_switches_and_cpu_defaults():
    config = config_from_args(["--device", "cpu"], {"DRAFTER_COMPILE": "yes"})
    assert (config.device, config.dtype, config.compile, config.cuda_graphs) == (
        "cpu",
        "float32",
        True,
        False,
    )
    assert config_from_args(["--device", "cpu", "--no-compile"], {"DRAFTER_COMPILE": "1"}).compile is False


def test_cli_api_key_is_never_in_the_config_repr():
    config = config_from_args(["--device", "cpu"], {"DRAFTER_API_KEY": "s3cret-value"})
    assert config.api_key == "s3cret-value"
    assert "s3cret-value" not in repr(config)


BAD_SETTINGS = {
    # name: (argv, environment, words in the one error line)
    "batch size zero": (["--max-batch-size", "0"], {}, "--max-batch-size must be a positive integer"),
    "unknown attention": (["--attention", "paged"], {}, "--attention must be 'sdpa' or 'flex'"),
    "budget not positive": (["--kv-cache-gb", "0"], {}, "--kv-cache-gb must be positive"),
    "port not a number": (["--port", "eighty"], {}, "--port"),
    "port variable not a number": (
        [],
        {"DRAFTER_PORT": "abc"},
        "DRAFTER_PORT (or --port) must be an integer",
    ),
    "variable not a number": ([], {"DRAFTER_MAX_QUEUE": "many"}, "DRAFTER_MAX_QUEUE"),
    "missing model dir": (
        ["--model", "/nonexistent/qwen3"],
        {},
        "neither a preset (tiny, bench-cpu, qwen3-0.6b-random)",
    ),
    "misspelt preset": (
        ["--model", "tinny"],
        {},
        "neither a preset (tiny, bench-cpu, qwen3-0.6b-random) nor a directory",
    ),
    "hub id": (["--model", "Qwen/Qwen3-0.6B"], {}, "python -m export Qwen/Qwen3-0.6B DIR"),
    "graphs on cpu": (["--cuda-graphs"], {}, "--cuda-graphs needs a CUDA device"),
    "unknown flag": (["--max-batch", "4"], {}, "unrecognized"),
    "unknown source": (
        ["--draft-source", "oracle"],
        {},
        "--draft-source must be one of model, suffix, hybrid",
    ),
    "suffix off, hybrid on": (
        ["--suffix-tokens", "0", "--draft-source", "hybrid"],
        {},
        "--suffix-tokens 0 turns suffix drafting off: --draft-source must be model",
    ),
}


def test_cli_draft_source_defaults_to_hybrid_and_to_model_with_suffix_drafting_off():
    config = config_from_args(["--device", "cpu"], {})
    assert (config.default_source, config.sources) == ("hybrid", ("model", "suffix", "hybrid"))
    off = config_from_args(["--device", "cpu"], {"DRAFTER_SUFFIX_TOKENS": "0"})
    assert (off.default_source, off.sources) == ("model", ("model",))


def test_cli_bad_settings_end_with_one_line_and_status_2():
    with socket.socket() as taken:  # a port in use: one line naming it and the fix, not a traceback
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cases = BAD_SETTINGS | {
            "port in use": ([f"--port={port}"], {}, f"port {port} on 127.0.0.1 is already")
        }
        # Started together: each pays the torch import once, in parallel.
        runs = {
            name: subprocess.Popen(
                [sys.executable, "-m", "drafter", "--device=cpu", *argv],  # no CUDA probe: no torch import
                env=clean_environ(PYTHONPATH=str(REPO), **env),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name, (argv, env, _) in cases.items()
        }
        try:
            for name, run in runs.items():
                out, err = run.communicate(timeout=60)
                words = cases[name][2]
                assert run.returncode == 2, (name, err)
                assert "Traceback" not in err, name
                lines = err.strip().splitlines()
                assert len(lines) == 1 and "ERROR" in lines[0] and words in lines[0], (name, err)
        finally:
            for run in runs.values():  # a setting wrongly accepted starts a server; do not leave it behind
                if run.poll() is None:
                    run.kill()
                    run.wait()


def test_cli_help_lists_every_variable_and_prefers_the_api_key_variable():
    run = subprocess.run(
        [sys.executable, "-m", "drafter", "--help"],
        env=clean_environ(PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0
    text = " ".join(run.stdout.split())  # argparse wraps lines
    assert "--num-threads" in text and "--body-timeout-s" in text and "$DRAFTER_BODY_TIMEOUT_S" in text
    assert "prefer the variable, since a flag's value shows in ps" in text


def port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_serve_sh_with_no_arguments_serves_tiny_on_cpu(tmp_path):
    if not port_is_free(8000):
        pytest.skip("port 8000, serve.sh's default, is taken on this machine")
    # From an unrelated directory, with no flags and no DRAFTER_* variables.
    # PYTHON: serve.sh runs this test's interpreter, not whatever .venv or python the checkout has.
    env = clean_environ(PYTHON=sys.executable)
    server = ServerProcess([], command=[str(REPO / "serve.sh")], env=env, cwd=tmp_path)
    try:
        url = server.wait_ready()
        assert url == "http://127.0.0.1:8000"
        response = httpx.post(f"{url}/draft", json={"tokens": [1, 2, 3]})
        assert response.status_code == 200, response.text
        assert len(response.json()["tokens"]) == 16
        info = httpx.get(f"{url}/info").json()
        assert (info["model"], info["device"], info["dtype"]) == ("tiny", "cpu", "float32")
        assert "WARNING" in server.log and "RANDOM" in server.log
        assert server.stop() == 0
    finally:
        server.close()


def test_export_of_a_preset_is_served_as_random_weights(tmp_path):
    from export.__main__ import run_export

    run_export("tiny", tmp_path / "fp8")
    server = ServerProcess([f"--model={tmp_path / 'fp8'}", "--device=cpu", "--max-seq-len=256"])
    try:
        url = server.wait_ready()
        assert httpx.get(f"{url}/info").json()["random_weights"] is True
        assert "WARNING" in server.log and "RANDOM" in server.log
    finally:
        server.close()
