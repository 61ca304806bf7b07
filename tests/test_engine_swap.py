"""The engine's in-place weight swap (engine/swap.py) and the versions it saves (export/versions.py): after a
swap, drafts equal transformers' greedy drafts on the saved version, for Qwen3 and Qwen2 (non-zero biases),
unquantized and FP8, eager and compiled, with nothing cached from the old weights answered after it."""

from __future__ import annotations

import pytest
import torch

from drafter.adaptation.weights import source_tensors
from engine.config import EngineConfig
from engine.engine import Engine
from engine.model.errors import LoadError
from export.versions import served_tensors, version_config, write_version
from tests.export_helpers import read_file
from tests.oracle import hf_greedy

CONFIG = EngineConfig(max_seq_len=128, max_batch_size=2, max_draft_tokens=8, dtype="float32")
FAMILIES = ["gqa2-untied", "mha-tied", "qwen2-gqa2-tied"]  # Qwen3 untied, Qwen3 tied, Qwen2 (biases)


def contexts(vocab: int, num: int = 3, seed: int = 7) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (length,), generator=generator).tolist() for length in (5, 23, 40)[:num]]


def perturbed(model, seed: int = 1) -> dict[str, torch.Tensor]:
    """Every weight of `model` moved by noise of a third of its own scale: other drafts, same shapes."""
    generator = torch.Generator().manual_seed(seed)
    return {
        name: tensor + torch.randn(tensor.shape, generator=generator) * tensor.float().std() / 3
        for name, tensor in model.state_dict().items()
    }


def oracle_of(directory, quantized: bool):
    """transformers' own model of a saved version (compressed-tensors decompresses an FP8 one itself)."""
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    options = {"quantization_config": CompressedTensorsConfig(run_compressed=False)} if quantized else {}
    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, **options).eval()


def swap_and_save(engine: Engine, state, hf_config: dict, directory):
    loaded = engine.loaded
    tensors = served_tensors(state, loaded.quantization, torch.float32, loaded.config.tie_word_embeddings)
    version = engine.swap_weights(tensors)
    write_version(directory, tensors, version_config(hf_config, loaded.quantization, torch.float32))
    return version


@pytest.mark.filterwarnings("ignore:You passed `quantization_config`:UserWarning")
@pytest.mark.parametrize("name", FAMILIES)
def test_swap_drafts_equal_transformers_on_the_saved_version(name, hf_checkpoint, tmp_path, one_thread):
    model, directory = hf_checkpoint(name)
    engine = Engine.load(str(directory), CONFIG)
    prompts = contexts(model.config.vocab_size)
    before = [engine.draft(c, 8, session=f"s{i}") for i, c in enumerate(prompts)]
    assert before == [hf_greedy(model, c, 8) for c in prompts]

    assert swap_and_save(engine, perturbed(model), model.config.to_dict(), tmp_path / "v1") == 1
    oracle = oracle_of(tmp_path / "v1", quantized=False)
    results = [engine.draft_batch([r])[0] for r in _requests(prompts)]
    assert [r.tokens for r in results] == [hf_greedy(oracle, c, 8) for c in prompts]
    assert [r.cached for r in results] == [0, 0, 0]  # the old weights' keys and values were all dropped
    assert [r.tokens for r in results] != before  # the swap changed what the engine drafts
    assert engine.info()["weights_version"] == 1 and engine.info()["kv_cache"]["sequences"] == 3

    # The saved version is a checkpoint `--model` serves: the same drafts.
    assert [Engine.load(str(tmp_path / "v1"), CONFIG).draft(c, 8) for c in prompts] == [
        r.tokens for r in results
    ]


def _requests(prompts):
    from engine.requests import DraftRequest

    return [DraftRequest(c, 8, f"s{i}") for i, c in enumerate(prompts)]


@pytest.mark.filterwarnings("ignore:You passed `quantization_config`:UserWarning")
@pytest.mark.parametrize("name", ["gqa2-untied", "qwen2-gqa2-tied"])
def test_swap_in_fp8_quantizes_as_the_export_does(name, hf_checkpoint, tmp_path, one_thread):
    """An FP8 weight-only engine: the version's fp8 bytes and scales are the export's own for the same
    weights, and after the swap the drafts are transformers' on that version (compressed-tensors)."""
    from export.__main__ import run_export

    model, directory = hf_checkpoint(name)
    run_export(str(directory), tmp_path / "export", "weight-only")
    engine = Engine.load(str(tmp_path / "export"), CONFIG)
    assert engine.loaded.quantization == "fp8-weight-only"
    tied = model.config.tie_word_embeddings
    bf16 = {name: t.to(torch.bfloat16) for name, t in model.state_dict().items()}  # as the export reads it
    exported = read_file(tmp_path / "export")
    ours = served_tensors(bf16, "fp8-weight-only", torch.float32, tied)
    assert set(ours) == set(exported)
    for tensor_name, tensor in ours.items():
        assert tensor.dtype == exported[tensor_name].dtype, tensor_name
        assert torch.equal(tensor.view(torch.uint8), exported[tensor_name].view(torch.uint8)), tensor_name

    prompts = contexts(model.config.vocab_size)
    for i, c in enumerate(prompts):
        engine.draft(c, 8, session=f"s{i}")
    hf_config = model.config.to_dict()
    swap_and_save(engine, perturbed(model), hf_config, tmp_path / "v1")
    assert "quantization_config" in (tmp_path / "v1" / "config.json").read_text()
    oracle = oracle_of(tmp_path / "v1", quantized=True)
    results = [engine.draft_batch([r])[0] for r in _requests(prompts)]
    assert [r.tokens for r in results] == [hf_greedy(oracle, c, 8) for c in prompts]
    assert [r.cached for r in results] == [0, 0, 0]

    # Back to the export's own tensors (a rollback): the export's drafts again, exactly.
    engine.swap_weights(exported)
    assert [engine.draft(c, 8) for c in prompts] == [
        Engine.load(str(tmp_path / "export"), CONFIG).draft(c, 8) for c in prompts
    ]


def test_swap_refuses_tensors_that_do_not_fit_and_changes_nothing(hf_checkpoint, one_thread):
    model, directory = hf_checkpoint("gqa2-untied")
    engine = Engine.load(str(directory), CONFIG)
    prompt = contexts(model.config.vocab_size, num=1)[0]
    first = engine.draft(prompt, 8, session="s0")
    state = perturbed(model)
    state["model.layers.0.mlp.up_proj.weight"] = state["model.layers.0.mlp.up_proj.weight"][:, :-1]
    with pytest.raises(LoadError, match="up_proj"):
        engine.swap_weights(served_tensors(state, "none", torch.float32, tied=False))
    del state["model.norm.weight"]
    with pytest.raises(LoadError, match="missing"):
        engine.swap_weights(served_tensors(state, "none", torch.float32, tied=False))
    assert engine.weights_version == 0
    again = engine.draft_batch(_requests([prompt]))[0]
    assert again.tokens == first and again.cached > 0  # the cache of the weights still served is kept


@pytest.mark.slow
def test_compiled_engine_swaps_without_recompiling(hf_checkpoint, tmp_path):
    """Compiled code holds the live parameters, and the swap writes into them: the next drafts are the new
    version's, and nothing compiles again."""
    model, directory = hf_checkpoint("gqa2-untied")
    torch._dynamo.reset()  # the suite's other engines must not have filled the process-wide recompile limit
    small = dict(
        max_seq_len=224, max_batch_size=2, max_draft_tokens=8, batch_buckets=(1, 2), min_kv_bucket=256
    )
    engine = Engine.load(str(directory), EngineConfig(**small, compile=True, dtype="float32"))
    assert engine.warmup()["fallbacks"] == []
    prompts = contexts(model.config.vocab_size)
    assert [engine.draft(c, 8) for c in prompts] == [hf_greedy(model, c, 8) for c in prompts]
    torch._dynamo.config.error_on_recompile = True
    try:
        swap_and_save(engine, perturbed(model), model.config.to_dict(), tmp_path / "v1")
        oracle = oracle_of(tmp_path / "v1", quantized=False)
        assert [engine.draft(c, 8) for c in prompts] == [hf_greedy(oracle, c, 8) for c in prompts]
    finally:
        torch._dynamo.config.error_on_recompile = False
    assert engine.recompiles.count == 0


@pytest.mark.parametrize(("dtype", "mode"), [("bfloat16", None), ("float32", "dynamic")])
def test_swap_equals_loading_the_saved_version(dtype, mode, hf_checkpoint, tmp_path, one_thread):
    """Where transformers' math is not ours bit for bit (bf16's packed oneDNN linears, fp8 activations), a
    swapped engine drafts exactly what an engine loaded from the saved version drafts. The swap is made a
    piece at a time with a batch between every two: those are the old weights' drafts, from their cache.
    The embedding and the norms are the live weights' own, as adaptation's versions share what training
    leaves: named `shared`, their modules (and the tied head packed from the embedding) are not made again."""
    from export.__main__ import run_export

    model, directory = hf_checkpoint("qwen2-gqa2-tied")
    if mode is not None:
        run_export(str(directory), tmp_path / "export", mode)
        directory = tmp_path / "export"
    config = EngineConfig(max_seq_len=128, max_batch_size=2, max_draft_tokens=8, dtype=dtype)
    engine = Engine.load(str(directory), config)
    prompts = contexts(model.config.vocab_size)
    before = [engine.draft(c, 8, session=f"s{i}") for i, c in enumerate(prompts)]
    loaded = engine.loaded
    tensors = served_tensors(perturbed(model), loaded.quantization, getattr(torch, dtype), tied=True)
    live = source_tensors(loaded, getattr(torch, dtype))
    shared = {name for name in tensors if name.endswith(("embed_tokens.weight", "norm.weight"))}
    tensors = {name: live[name] if name in shared else tensor for name, tensor in tensors.items()}
    pieces, num_pieces = engine.weight_swap(tensors, shared), 0
    while True:
        try:
            next(pieces)
        except StopIteration as committed:
            assert committed.value == engine.weights_version == 1
            break
        i = num_pieces % len(prompts)
        between = engine.draft_batch(_requests(prompts)[i : i + 1])[0]
        assert between.tokens == before[i] and between.cached > 0 and engine.weights_version == 0
        num_pieces += 1
    made = {name.rsplit(".", 1)[0] for name in tensors if name not in shared}
    assert num_pieces == 1 + len(made)  # the check, then a piece a module with a new tensor
    write_version(
        tmp_path / "v1",
        tensors,
        version_config(model.config.to_dict(), loaded.quantization, getattr(torch, dtype)),
    )
    fresh = Engine.load(str(tmp_path / "v1"), config)
    assert fresh.loaded.quantization == loaded.quantization
    results = [engine.draft_batch([r])[0] for r in _requests(prompts)]
    assert [r.tokens for r in results] == [fresh.draft(c, 8) for c in prompts]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [None, "weight-only"])
def test_cuda_graphs_stay_valid_across_a_swap(mode, hf_checkpoint, tmp_path):
    """On CUDA with torch.compile and captured graphs: the swap copies into the tensors the graphs read, so
    the same graphs (not recaptured, nothing recompiled) draft what an eager engine loaded from the saved
    version drafts."""
    from export.__main__ import run_export

    model, directory = hf_checkpoint("qwen2-gqa2-tied")
    if mode is not None:
        run_export(str(directory), tmp_path / "export", mode)
        directory = tmp_path / "export"
    config = dict(device="cuda", dtype="float32", max_seq_len=512, max_batch_size=2, max_draft_tokens=8)
    config |= dict(batch_buckets=(1, 2), min_kv_bucket=256)
    graphed = Engine.load(str(directory), EngineConfig(**config, compile=True, cuda_graphs=True))
    report = graphed.warmup()
    assert graphed.graphs is not None, report
    graphs, prompts = graphed.graphs, contexts(model.config.vocab_size)
    for i, c in enumerate(prompts):
        graphed.draft(c, 8, session=f"s{i}")
    loaded = graphed.loaded
    tensors = served_tensors(perturbed(model), loaded.quantization, torch.float32, tied=True)
    graphed.swap_weights(tensors)
    write_version(
        tmp_path / "v1", tensors, version_config(model.config.to_dict(), loaded.quantization, torch.float32)
    )
    eager = Engine.load(str(tmp_path / "v1"), EngineConfig(**config))
    results = [graphed.draft_batch([r])[0] for r in _requests(prompts)]
    assert [r.tokens for r in results] == [eager.draft(c, 8) for c in prompts]
    assert graphed.graphs is graphs and graphed.recompiles.count == 0
