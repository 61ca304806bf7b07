"""Online adaptation through a real server (`--adapt`): a target drives conversations in v2 form, the server
learns what it emits while idle, and once a version is swapped in, every draft equals transformers' greedy
drafts on that version as saved in `--adapt-dir`; `/info` and `/metrics` report it. Without the flag
nothing changes, and bad flag values are refused at start."""

from __future__ import annotations

import time

import httpx
import pytest
import torch

from drafter.server.cli import UsageError, config_from_args
from tests.oracle import hf_greedy, make_hf_model
from tests.server_process import ServerProcess, metric_value

K = 4
PROMPT_LEN, OUTPUT_LEN = 20, 64


def drafter_near(target, seed: int = 11):
    """The target with every weight moved by noise: it agrees with the target on some tokens."""
    drafter = make_hf_model("gqa2-untied", seed=0)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in drafter.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * parameter.std() * 0.15)
    return drafter


@pytest.fixture(scope="module")
def adapting(tmp_path_factory):
    target = make_hf_model("gqa2-untied", seed=0)
    drafter = drafter_near(target)
    directory = tmp_path_factory.mktemp("drafter")
    drafter.save_pretrained(directory)
    versions = tmp_path_factory.mktemp("adapt") / "versions"
    server = ServerProcess(
        [
            f"--model={directory}",
            "--device=cpu",
            "--dtype=float32",
            "--no-compile",
            "--max-seq-len=512",
            "--draft-source=model",
            "--request-timeout-s=30",
            "--adapt",
            "--adapt-buffer-tokens=8192",
            f"--adapt-dir={versions}",
        ]
    )
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=30) as client:
            yield target, drafter, versions, client
    finally:
        server.close()


def converse(client, target, name: str, prompt: list[int]) -> list[tuple[list[int], list[int]]]:
    """A target's conversation: it keeps the drafts that match its own greedy output and adds its next
    token, in v2 calls; every (context, drafts) the server answered."""
    output = hf_greedy(target, prompt, OUTPUT_LEN)
    answer = client.post("/draft", json={"tokens": prompt, "session": name, "num_draft_tokens": K}).json()
    context, answered = list(prompt), [(list(prompt), answer["tokens"])]
    while len(context) - len(prompt) < OUTPUT_LEN - K - 1:
        done = len(context) - len(prompt)
        drafts, truth = answer["tokens"], output[done:]
        kept = next((i for i, (a, b) in enumerate(zip(drafts, truth, strict=False)) if a != b), len(drafts))
        bonus = truth[kept]
        prefix_len = len(context) + kept
        context = context + drafts[:kept] + [bonus]
        body = {
            "session": name,
            "session_token": answer["session_token"],
            "prefix_len": prefix_len,
            "tokens": [bonus],
            "num_draft_tokens": K,
        }
        answer = client.post("/draft", json=body).json()
        assert answer["accepted"] == kept
        answered.append((list(context), answer["tokens"]))
    return answered


def adaptation(client) -> dict:
    return client.get("/info").json()["adaptation"]


def settled(client, timeout_s: float = 60) -> dict:
    """/info's adaptation once its cycle has nothing left to do, every swapped version is saved and the
    conversations are cached again after the last swap."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = adaptation(client)
        if (
            not info["round"]["busy"]
            and info["version"] in info["saved_versions"]
            and not info["recache"]["pending"]
        ):
            return info
        time.sleep(0.1)
    raise AssertionError(f"adaptation never settled: {info}")


def oracle(directory):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


def test_server_adapts_to_the_target_and_drafts_as_the_saved_version(adapting):
    target, drafter, versions, client = adapting
    info = adaptation(client)
    assert info["version"] == 0 and info["saved_versions"] == [0] and info["directory"] == str(versions)
    generator = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 512, (PROMPT_LEN,), generator=generator).tolist() for _ in range(3)]
    first = converse(client, target, "warm", prompts[0])
    assert all(drafts == hf_greedy(drafter, context, K) for context, drafts in first[:3])  # version 0

    deadline = time.monotonic() + 240
    session = 0
    while adaptation(client)["version"] == 0:
        assert time.monotonic() < deadline, adaptation(client)
        session += 1
        converse(client, target, f"s{session}", prompts[session % 3])
    info = settled(client)
    version = info["version"]
    assert info["swaps"] >= 1 and info["training_steps"] > 0 and info["buffer"]["tokens"] > 0
    assert info["recache"]["sessions"] >= 1  # conversations that ended before the swap
    last = info["last_candidate"]
    assert (
        last["swapped"] is False or last["candidate"]["tokens_per_round"] > last["live"]["tokens_per_round"]
    )

    # Every draft now is transformers' greedy draft on the version saved, which `--model` could serve,
    # for contexts the old weights had cached too (sessionless calls: they verify nothing, so they train
    # nothing and the version stays).
    assert (versions / f"v{version}" / "config.json").is_file()
    adapted = oracle(versions / f"v{version}")
    contexts = [context for context, _ in first[::4]]
    drafts = [
        client.post("/draft", json={"tokens": c, "num_draft_tokens": K}).json()["tokens"] for c in contexts
    ]
    assert adaptation(client)["version"] == version
    assert drafts == [hf_greedy(adapted, c, K) for c in contexts]
    # Not version 0's drafts: over every context of the first conversation (on a few, a version that
    # learned a little can still draft what version 0 did).
    every = [context for context, _ in first]
    now = [client.post("/draft", json={"tokens": c, "num_draft_tokens": K}).json()["tokens"] for c in every]
    assert now != [hf_greedy(drafter, c, K) for c in every]

    # A conversation in v2 form trains on, and a later version may be swapped in during it: each answer is
    # the greedy draft of the version live when it was drafted, versions in order, none drafted before.
    answered = converse(client, target, "after", prompts[1])
    final = settled(client)
    assert final["saved_versions"] == list(range(final["version"] + 1))
    oracles = [adapted, *(oracle(versions / f"v{n}") for n in range(version + 1, final["version"] + 1))]
    live = 0
    for context, drafts in answered:
        while drafts != hf_greedy(oracles[live], context, K):
            live += 1
            assert live < len(oracles), f"an answer no version live since {version} drafts"

    metrics = client.get("/metrics").text
    assert metric_value(metrics, "drafter_adapt_version") == final["version"]
    assert metric_value(metrics, "drafter_adapt_swaps_total") == final["swaps"]
    assert metric_value(metrics, "drafter_adapt_training_steps_total") >= final["training_steps"]
    assert metric_value(metrics, "drafter_adapt_recached_sessions_total") == final["recache"]["sessions"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--adapt", "--adapt-buffer-tokens=100"], "--adapt-buffer-tokens must be in"),
        (["--adapt", "--adapt-rank=-1"], "--adapt-rank must be in"),
        (["--adapt", "--adapt-rank=100000"], "--adapt-rank must be in"),
        (["--adapt-dir=/tmp"], "needs --adapt"),
        (["--adapt", "--adapt-dir={file}"], "is not a directory"),
        (["--adapt", "--adapt-dir={used}"], "already holds versions"),
    ],
)
def test_bad_adaptation_flags_are_refused_at_start(argv, message, tmp_path):
    (tmp_path / "file").write_text("")
    (tmp_path / "used" / "v0").mkdir(parents=True)
    argv = [arg.format(file=tmp_path / "file", used=tmp_path / "used") for arg in argv]
    with pytest.raises(UsageError, match=message):
        config_from_args(["--device=cpu", *argv], {})


def test_adaptation_is_off_by_default(tmp_path):
    config = config_from_args(["--device=cpu"], {})
    assert config.adapt is False and config.adapt_dir is None
    on = config_from_args(
        ["--device=cpu"], {"DRAFTER_ADAPT": "1", "DRAFTER_ADAPT_DIR": str(tmp_path / "new")}
    )
    assert on.adapt is True and on.adapt_dir == str(tmp_path / "new")


def test_without_adapt_the_server_reports_it_off_and_trains_nothing(request):
    from tests.server_process import MAIN_ARGS, main_oracle, shared_server

    server = shared_server(request.config, MAIN_ARGS)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for n in (3, 40):
            context = list(range(5, 5 + n))
            answer = client.post(
                "/draft", json={"tokens": context, "session": f"off{n}", "num_draft_tokens": K}
            )
            body = {"session": f"off{n}", "session_token": answer.json()["session_token"]}
            body |= {"prefix_len": n + 1, "tokens": [7], "num_draft_tokens": K}
            again = client.post("/draft", json=body).json()
            assert again["tokens"] == main_oracle().draft([*context, answer.json()["tokens"][0], 7], K)
        assert client.get("/info").json()["adaptation"] == {"enabled": False}
        assert "drafter_adapt" not in client.get("/metrics").text
