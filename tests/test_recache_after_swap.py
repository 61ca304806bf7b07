"""After a swap the conversations' caches are made again while the engine idles (drafter/server/recache_work.py):
a session's next call finds its context cached and drafts transformers' greedy drafts on the new version; a
session whose call came first is skipped (its cache stays as that call left it), and a request stops the work
between two sessions, the rest done after it. Real parts: the engine on a transformers checkpoint, the
session table."""

from __future__ import annotations

import numpy as np
import torch

from drafter.server.recache_work import RecacheWork
from drafter.sessions.draft_length import Acceptance
from drafter.sessions.table import SessionTable
from engine.config import EngineConfig
from engine.engine import Engine
from engine.requests import DraftRequest
from export.versions import served_tensors, version_config, write_version
from tests.oracle import hf_greedy
from tests.test_engine_swap import oracle_of, perturbed

K = 4
CONFIG = EngineConfig(max_seq_len=256, max_batch_size=2, max_draft_tokens=8, dtype="float32")


def start(table: SessionTable, engine: Engine, name: str, context: list[int]) -> None:
    """A session's full-context call, as the server makes one: drafted, then stored."""
    stored = table.full_context(context)
    drafts = engine.draft_batch([DraftRequest(stored, K, name)])[0].tokens
    table.commit(name, None, True, stored, drafts, Acceptance())


def test_sessions_are_cached_again_after_a_swap_and_draft_as_the_new_version(
    hf_checkpoint, tmp_path, one_thread
):
    model, directory = hf_checkpoint("gqa2-untied")
    engine = Engine.load(str(directory), CONFIG)
    table = SessionTable(max_sessions=8, ttl_s=600, max_len=256)
    generator = np.random.default_rng(3)
    contexts = {f"s{i}": generator.integers(1, 512, 20 + 15 * i).tolist() for i in range(4)}
    for name, context in contexts.items():
        start(table, engine, name, context)
    tensors = served_tensors(perturbed(model), "none", torch.float32, tied=False)
    engine.swap_weights(tensors)
    write_version(tmp_path / "v1", tensors, version_config(model.config.to_dict(), "none", torch.float32))
    version_1 = oracle_of(tmp_path / "v1", quantized=False)

    work = RecacheWork(engine, table)
    work.after_swap()
    assert [session.name for session, _, _ in work.todo] == ["s0", "s1", "s2", "s3"]  # s3, the newest, first
    start(table, engine, "s1", contexts["s1"])  # its call came meanwhile: it cached itself
    asked = []
    work.work(lambda: asked.append(1) or len(asked) > 2)  # a request after two sessions
    assert [session.name for session, _, _ in work.todo] == ["s0", "s1"] and work.counters.pending == 2
    work.work(lambda: False)
    counted = work.counters.describe()
    assert counted["sessions"] == 3 and counted["skipped"] == 1 and counted["pending"] == 0
    assert counted["tokens"] == sum(len(contexts[name]) for name in ("s0", "s2", "s3"))

    stats = engine.stats.requests
    for name, context in contexts.items():
        nxt = [*context, 7]
        result = engine.draft_batch([DraftRequest(nxt, K, name)])[0]
        assert result.tokens == hf_greedy(version_1, nxt, K)
        assert result.cached >= len(context) - 1, name  # s1 by its own call, the others by the recaching
    assert engine.stats.requests == stats + len(contexts)  # the recaching counted no request

    # Without it, a session's context is gone with the swap: its next call prefills all of it.
    engine.swap_weights(tensors)
    nxt = [*contexts["s2"], 7]
    assert engine.draft_batch([DraftRequest(nxt, K, "s2")])[0].cached == 0
