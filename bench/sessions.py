"""Sessions benchmark, over HTTP against one server in one run:

- `adaptive`: scripted targets of known acceptance (each draft accepted with probability p, stopping at the
  first rejection; p in 0.9, 0.6, 0.3, and one that drops from 0.9 to 0.3 halfway) drive v2 conversations
  with `"num_draft_tokens": "auto"` and with every fixed k. Per strategy: accepted tokens per call, accepted
  tokens per ms of drafting (the server's prefill + decode time), and the target's modelled throughput,
  (accepted + 1) / (verify ms + the call's round trip), the quantity auto maximizes.
- `protocol`: the per-call server-side host time (Server-Timing `host`: parse, validate, session work,
  answer, and with `receive` also reading the body; not queueing or the engine) of v1 calls (the whole context each time) against v2 calls (only the
  new tokens) of growing conversations at 2k, 8k and 32k tokens, and the request body sizes.

    python -m bench.sessions [--url URL] [--rounds 40] [--contexts 2048,8192,32768] [--json OUT]

Without `--url` it spawns `python -m drafter` (tiny preset, CPU) sized for the longest context.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

import httpx
import orjson

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness.refusals import ServerRefused, exits_2_on_refusal  # noqa: E402
from bench.harness.server import ServerProcess  # noqa: E402

SCENARIOS = {"p=0.9": [0.9], "p=0.6": [0.6], "p=0.3": [0.3], "0.9→0.3": [0.9, 0.3]}
VERIFY_MS = 25.0  # the server's --target-verify-ms for this run: what the modelled throughput charges


def timing(response: httpx.Response) -> dict[str, float]:
    parts = (part.strip().split(";dur=") for part in response.headers["server-timing"].split(","))
    return {name: float(ms) for name, ms in parts}


def post(client: httpx.Client, body: dict) -> httpx.Response:
    response = client.post("/draft", content=orjson.dumps(body), headers={"Content-Type": "application/json"})
    if response.status_code != 200:
        raise ServerRefused(response.status_code, response.content)
    return response


def run_conversation(client: httpx.Client, strategy, phases: list[float], rounds: int, seed: int) -> dict:
    """One v2 conversation of `rounds` calls with a target accepting with probability p (phase by phase)."""
    rng = random.Random(seed)
    context = [rng.randrange(1024) for _ in range(64)]
    name = f"bench-{strategy}-{seed}-{rng.random()}"
    answer = post(client, {"tokens": context, "session": name, "num_draft_tokens": strategy}).json()
    accepted, draft_ms, round_ms, ks = [], [], [], []
    for call in range(rounds):
        p = phases[min(call * len(phases) // rounds, len(phases) - 1)]
        drafts, num_accepted = answer["tokens"], 0
        while num_accepted < len(drafts) and rng.random() < p:
            num_accepted += 1
        own = rng.randrange(1024)
        if num_accepted < len(drafts) and own == drafts[num_accepted]:
            own = (own + 1) % 1024  # the target's token differs from the draft it rejected
        prefix_len = len(context) + num_accepted
        context = context + drafts[:num_accepted] + [own]
        body = {"session": name, "session_token": answer["session_token"], "prefix_len": prefix_len}
        response = post(client, {**body, "tokens": [own], "num_draft_tokens": strategy})
        answer, parts = response.json(), timing(response)
        if call:  # the first answer's drafts were chosen before any feedback
            accepted.append(num_accepted)
            ks.append(len(drafts))
        draft_ms.append(parts["prefill"] + parts["decode"])
        round_ms.append(VERIFY_MS + response.elapsed.total_seconds() * 1e3)
    tokens = sum(accepted) + len(accepted)
    return {
        "accepted_per_call": statistics.fmean(accepted),
        "accepted_per_draft_ms": sum(accepted) / max(sum(draft_ms), 1e-9),
        "modelled_tokens_per_ms": tokens / sum(round_ms[1:]),
        "mean_k": statistics.fmean(ks),
    }


def adaptive(client: httpx.Client, rounds: int, max_k: int, seeds: int) -> list[dict]:
    rows = []
    for strategy in ["auto", *range(1, max_k + 1)]:
        row = {"strategy": strategy}
        for scenario, phases in SCENARIOS.items():
            results = [
                run_conversation(client, strategy, phases, rounds, seed) for seed in range(1, seeds + 1)
            ]
            row[scenario] = {key: statistics.fmean(r[key] for r in results) for key in results[0]}
        rows.append(row)
        print(f"  {strategy}: done", file=sys.stderr)
    return rows


def protocol(client: httpx.Client, contexts: list[int], rounds: int) -> list[dict]:
    rows = []
    for length in contexts:
        rng = random.Random(length)
        base = [rng.randrange(1024) for _ in range(length)]
        row = {"context": length}
        for form in ("v1", "v2"):
            name, context = f"proto-{form}-{length}", list(base)
            answer = post(client, {"tokens": context, "session": name, "num_draft_tokens": 8}).json()
            host, receive, sizes = [], [], []
            for _ in range(rounds):
                num_accepted = rng.randrange(len(answer["tokens"]) + 1)
                own = rng.randrange(1024)
                prefix_len = len(context) + num_accepted
                context = context + answer["tokens"][:num_accepted] + [own]
                if form == "v1":
                    body = {"tokens": context, "session": name, "num_draft_tokens": 8}
                else:
                    body = {"session": name, "session_token": answer["session_token"]}
                    body |= {"prefix_len": prefix_len, "tokens": [own], "num_draft_tokens": 8}
                sizes.append(len(orjson.dumps(body)))
                response = post(client, body)
                answer = response.json()
                parts = timing(response)
                host.append(parts["host"])
                receive.append(parts["receive"] + parts["host"])
            row[form] = {
                "host_ms_p50": statistics.median(host),
                "receive_and_host_ms_p50": statistics.median(receive),
                "body_bytes": statistics.median(sizes),
            }
        row["v1_over_v2"] = row["v1"]["host_ms_p50"] / row["v2"]["host_ms_p50"]
        row["v1_over_v2_with_receive"] = (
            row["v1"]["receive_and_host_ms_p50"] / row["v2"]["receive_and_host_ms_p50"]
        )
        rows.append(row)
        print(f"  {length}: done", file=sys.stderr)
    return rows


def report(adaptive_rows: list[dict], protocol_rows: list[dict]) -> str:
    return "\n\n".join(
        ([report_adaptive(adaptive_rows)] if adaptive_rows else [])
        + ([report_protocol(protocol_rows)] if protocol_rows else [])
    )


def report_adaptive(adaptive_rows: list[dict]) -> str:
    lines = ["### Adaptive k (per scenario: accepted/call · accepted per draft-ms · modelled tokens/ms)", ""]
    lines.append("| k | " + " | ".join(SCENARIOS) + " |")
    lines.append("|---|" + "---|" * len(SCENARIOS))
    best = {s: max(r[s]["modelled_tokens_per_ms"] for r in adaptive_rows[1:]) for s in SCENARIOS}
    for row in adaptive_rows:
        cells = []
        for scenario in SCENARIOS:
            cell = row[scenario]
            text = (
                f"{cell['accepted_per_call']:.2f} · {cell['accepted_per_draft_ms']:.2f} · "
                f"{cell['modelled_tokens_per_ms']:.4f}"
            )
            if row["strategy"] == "auto":
                text += f" (mean k {cell['mean_k']:.1f}, {cell['modelled_tokens_per_ms'] / best[scenario]:.2f}x best fixed)"
            elif cell["modelled_tokens_per_ms"] == best[scenario]:
                text = f"**{text}**"
            cells.append(text)
        lines.append(f"| {row['strategy']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report_protocol(protocol_rows: list[dict]) -> str:
    lines = ["### Host time per call, v1 vs v2 (server-side CPU, p50 ms; + receiving the body)", ""]
    lines.append(
        "| context | v1 host | v2 host | v1 / v2 | v1 receive+host | v2 receive+host | v1 / v2 | v1 body | v2 body |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for row in protocol_rows:
        v1, v2 = row["v1"], row["v2"]
        lines.append(
            f"| {row['context']} | {v1['host_ms_p50']:.3f} | {v2['host_ms_p50']:.3f} | {row['v1_over_v2']:.1f}x | "
            f"{v1['receive_and_host_ms_p50']:.3f} | {v2['receive_and_host_ms_p50']:.3f} | "
            f"{row['v1_over_v2_with_receive']:.1f}x | {v1['body_bytes']:.0f} B | {v2['body_bytes']:.0f} B |"
        )
    return "\n".join(lines)


@exits_2_on_refusal
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running server (started with --target-verify-ms 25)")
    parser.add_argument("--seeds", type=int, default=2, help="conversations per strategy and scenario [2]")
    parser.add_argument("--rounds", type=int, default=40, help="calls per conversation [40]")
    parser.add_argument("--contexts", default="2048,8192,32768", help="protocol context lengths")
    parser.add_argument("--max-draft-tokens", type=int, default=16)
    parser.add_argument("--parts", default="adaptive,protocol", help="which parts to run [both]")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args(argv)
    contexts = [int(c) for c in args.contexts.split(",") if c]
    server_args = [
        f"--max-seq-len={max(contexts) + 4 * args.rounds * (args.max_draft_tokens + 1)}",
        f"--max-draft-tokens={args.max_draft_tokens}",
        "--max-batch-size=1",
        f"--target-verify-ms={VERIFY_MS}",
        "--request-timeout-s=600",
    ]
    server = None if args.url else ServerProcess(server_args, timeout_s=900)
    try:
        url = args.url or server.wait_ready()
        with httpx.Client(base_url=url, timeout=600) as client:
            adaptive_rows, protocol_rows = [], []
            if "adaptive" in args.parts:
                print("adaptive k ...", file=sys.stderr)
                adaptive_rows = adaptive(client, args.rounds, args.max_draft_tokens, args.seeds)
            if "protocol" in args.parts:
                print("v1 vs v2 host time ...", file=sys.stderr)
                protocol_rows = protocol(client, contexts, args.rounds)
            info = client.get("/info").json()  # after the run: the step cost has followed every batch
    finally:
        if server is not None:
            server.close()
    print(f"policy: {json.dumps(info.get('draft_length_policy'))}\n")
    print(report(adaptive_rows, protocol_rows))
    if args.json:
        args.json.write_text(json.dumps({"adaptive": adaptive_rows, "protocol": protocol_rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
