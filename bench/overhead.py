"""What one `/draft` call costs beyond the engine's own work, with a lean client on keep-alive connections.

    python -m bench.overhead [--targets URL[,URL...]] [--contexts 128,2048] [--k 1] [--calls 400]
                             [--clients 1,4,16] [--v2] [--json OUT]

Each call is a `GET /health/live` and a `POST /draft` on the same connection (the standard library's
http.client: no pool, ~30 us of client work). Per call, `excess` = (draft wall time - the engine's own
time) - the health round trip, where the engine's own time is Server-Timing `engine` (the whole engine call:
cache lookup, prefill, decode, readback) or, from a server that does not send it, `prefill + decode` (also
reported for every server: `excess vs prefill+decode` counts the engine's cache work as overhead); with
several clients the queue wait (Server-Timing `queue`: the others' batches) is taken out too, while a lone
client's (a batching window) counts. So `excess` is what our /draft
path adds to a plain HTTP round trip: parse and validation, the batcher, the hand-offs to and from the
engine thread (none where the event loop drafts a lone short request itself), the response. `draft wall` is
the whole call as the client waits for it: compare it too, since where the loop drafts, the engine's time
also holds what running right after the HTTP work costs it (caches), and leaves `excess` smaller for it.
The same context is sent on every call (fully cached: the engine only decodes); `--v2` sends it once, then
only `prefix_len` (a session), so the body no longer grows with it.

Targets are `http://HOST:PORT` or `unix:/PATH` (a server's --uds socket); calls alternate between targets in
one run, so an A/B of two servers (say, two checkouts) is fair on a shared machine. Without --targets, one
server of the tiny preset is started here and measured over TCP and over its Unix socket. With --clients N,
N threads each hold a connection and call concurrently; `mean batch` (from /metrics) shows batches form.
Figures are medians over the calls after a warm-up fifth.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness.call_cost import context_tokens, measure  # noqa: E402
from bench.harness.refusals import exits_2_on_refusal  # noqa: E402
from bench.harness.server import ServerProcess  # noqa: E402


def table(rows: list[dict]) -> str:
    lines = [
        "| target | proto | ctx | k | clients | health | draft - engine | excess | excess vs prefill+decode "
        "| engine | draft wall | queue | mean batch |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['target']} | {r['protocol']} | {r['context_len']} | {r['num_draft_tokens']} | {r['clients']} "
            f"| {r['health_ms']:.3f} | {r['draft_minus_engine_ms']:.3f} | {r['excess_ms']:+.3f} "
            f"| {r['excess_model_ms']:+.3f} "
            f"| {r['engine_ms']:.3f} | {r['wall_ms']:.3f} | {r['queue_ms']:.3f} | {r['mean_batch']:.2f} |"
        )
    return "\n".join(lines)


@exits_2_on_refusal
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--targets", help="comma-separated http://HOST:PORT or unix:/PATH (default: start one)"
    )
    parser.add_argument("--contexts", default="128,2048")
    parser.add_argument("--k", type=int, default=1, help="draft tokens per call")
    parser.add_argument("--calls", type=int, default=400, help="calls per client and target")
    parser.add_argument("--clients", default="1", help="comma-separated concurrent client counts")
    parser.add_argument("--v2", action="store_true", help="also measure v2 (session) calls")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    contexts = [int(c) for c in args.contexts.split(",")]
    with ExitStack() as stack:
        if args.targets:
            targets = args.targets.split(",")
        else:
            uds = str(Path(stack.enter_context(tempfile.TemporaryDirectory())) / "drafter.sock")
            server_args = ["--model", "tiny", "--max-seq-len", str(max(contexts) + 64), f"--uds={uds}"]
            server = stack.enter_context(ServerProcess(server_args))
            targets = [server.url, f"unix:{uds}"]
        rows = []
        for clients in (int(c) for c in args.clients.split(",")):
            for v2 in (False, True) if args.v2 else (False,):
                for context_len in contexts:
                    rows += measure(targets, context_tokens(context_len), args.k, args.calls, clients, v2)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
