"""bench/adapt/swap.py on the tiny preset: the swap in pieces is one piece per module (after the check), a
conversation's next call after a swap finds its context cached only when it was cached again, the report is
written, and the engine drafts as before (its own weights went in again)."""

from __future__ import annotations

import json

from bench.adapt.swap import main, measure
from engine.config import EngineConfig
from engine.engine import Engine
from engine.model.loader import build_empty


def test_a_swap_is_timed_in_one_go_and_piece_by_piece(tmp_path, one_thread):
    engine = Engine.load("tiny", EngineConfig(dtype="float32", max_seq_len=64, max_batch_size=1))
    before = engine.draft([1, 2, 3, 4, 5], 4)
    (row,) = measure(engine, 1, context_len=40)
    loaded = engine.loaded
    modules = {
        name.rsplit(".", 1)[0]
        for name in build_empty(loaded.config, loaded.quantization, loaded.weight_scales).state_dict()
    }
    if loaded.config.tie_word_embeddings:
        modules.discard("lm_head")
    assert row["pieces"] - len(modules) in (1, 2)  # each module, the check, a tied lm_head's own pack
    assert 0 < row["longest_piece_s"] <= row["whole_s"] and 0 < row["commit_s"] <= row["whole_s"]
    # The conversation's next call after a swap prefilled all of its context, or found it cached again.
    assert row["next_call_prefilled"]["cached"] == 0 and row["next_call_recached"]["cached"] == 40
    assert engine.weights_version == 4 and engine.draft([1, 2, 3, 4, 5], 4) == before

    assert main(["--model", "tiny", "--dtype", "float32", "--repeats", "1", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert len(report["repeats"]) == 1 and "| 1 |" in (tmp_path / "report.md").read_text()
