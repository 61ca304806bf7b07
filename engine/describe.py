"""What the engine reports of itself for `/info`: plain values read from its config and tables."""

from __future__ import annotations

from engine.model.cpu_fp8 import kernel_isa


def describe_cache(engine) -> dict:
    cfg, pool, table = engine.config, engine.pool, engine.table
    return {
        "page_size": cfg.page_size,
        "pool_pages": pool.num_pages - 1,
        "pool_tokens": (pool.num_pages - 1) * cfg.page_size,
        "pool_bytes": pool.num_bytes,
        "budget_gb": cfg.budget_gb if cfg.kv_cache_tokens is None else None,
        "pages_used": table.pages_in_use,
        "pages_idle": len(table.index.idle),
        "pages_free": table.allocator.num_free,
        "sequences": len(table.sequences),
        "shared_prefix_tokens": table.counters.shared_tokens,
        "evicted_sequences": table.counters.evicted_sequences,
        "evicted_pages": table.counters.evicted_pages,
    }


def describe(engine) -> dict:
    """What /info shows of the engine: the model, its limits, the paths it runs and its KV cache."""
    cfg, model_cfg = engine.config, engine.loaded.config
    return {
        "model": engine.loaded.source,
        "model_type": model_cfg.family,  # config.json's: "qwen3" or "qwen2" (engine/model/config.py)
        "random_weights": engine.loaded.is_random_preset,
        "vocab_size": model_cfg.vocab_size,
        "max_context": cfg.max_seq_len,
        "max_draft_tokens": cfg.max_draft_tokens,
        "max_batch_size": cfg.max_batch_size,
        "quantization": engine.loaded.quantization,
        "weight_scales": engine.loaded.weight_scales,  # FP8: "tensor" or "channel"; None unquantized
        "device": cfg.device,
        "dtype": cfg.dtype,
        "compile": cfg.compile,
        "cuda_graphs": engine.graphs is not None,
        "attention": cfg.attention,
        "cpu_packed_linears": engine.packed_linears,  # packed or read as stored (engine/model/cpu_linears.py)
        # FP8 weights and the bf16 LM head read as stored by engine/model/cpu_gemv.c: "avx512" | "avx2" | None
        "cpu_kernel": kernel_isa(engine.model),
        "batch_buckets": list(cfg.buckets),
        "kv_buckets": list(engine.spans),
        "draft_length_tiers": list(cfg.tiers) if engine.graphs is not None else None,
        "kv_cache": describe_cache(engine),
        "recompiles_after_warmup": engine.recompiles.count,
        "weights_version": engine.weights_version,  # 0 as loaded, +1 per in-place swap (engine/swap.py)
    }
