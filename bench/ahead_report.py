"""bench/ahead.py's table: one row per run, in Markdown (it reads on a terminal and pastes into
bench/README.md)."""

from __future__ import annotations

HEADER = (
    "| workload | ahead | verify floor ms | hit rate | after cold start | hits / misses / none | "
    "hits by accepted | plans too slow | call p50 / p99 ms, hits | server p50 / p99 ms, hits | "
    "call p50 / p99 ms, others | call p50 ms, cold start | tok/s CPU | tok/s projected GPU | lossless |"
)


def ms(stats: dict | None, key: str) -> str:
    return f"{stats[key]:.2f}" if stats and stats.get(key) is not None else "-"


def share(value: float | None) -> str:
    return f"{value:.0%}" if value is not None else "-"


def print_table(rows: list[dict]) -> None:
    print(HEADER)
    print("|---" * HEADER.count(" | ") + "|---|")
    for r in rows:
        counts = " / ".join(str(r.get(key, "-")) for key in ("hits", "misses", "not_ready"))
        by_accepted = ", ".join(map(str, r["hits_by_accepted"])) or "-"
        print(
            f"| {r['workload']} | {r['draft_ahead']} | {r['verify_floor_ms']:.0f} | {share(r['hit_rate'])} | "
            f"{share(r['hit_rate_after_cold'])} | {counts if r['draft_ahead'] else '-'} | {by_accepted} | "
            f"{r['too_slow'] if r['draft_ahead'] else '-'} | "
            f"{ms(r['call_ms_hit'], 'p50')} / {ms(r['call_ms_hit'], 'p99')} | "
            f"{ms(r['server_ms_hit'], 'p50')} / {ms(r['server_ms_hit'], 'p99')} | "
            f"{ms(r['call_ms_miss'], 'p50')} / {ms(r['call_ms_miss'], 'p99')} | {ms(r['call_ms_cold'], 'p50')} | "
            f"{r['target_tokens_per_s_cpu']:.1f} | {r['projected_gpu_tokens_per_s']:.1f} | {r['lossless']} |"
        )
