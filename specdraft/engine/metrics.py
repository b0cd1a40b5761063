"""The table of one request's, or several merged, speculative-decoding metrics
(`requests.SpecMetrics`: tau, acceptance per position, times; DESIGN.md §2 "Metrics", case M1).
"""

from __future__ import annotations

from rich.table import Table

from specdraft.engine.requests import SpecMetrics


def metrics_table(metrics: SpecMetrics, title: str = "speculative decoding") -> Table:
    """A rich table of one SpecMetrics (checks tau = 1 + sum p_k first)."""
    metrics.check()
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("output tokens", f"{metrics.num_output_tokens}"),
        ("verification steps", f"{metrics.num_verify_steps}"),
        ("drafted / accepted", f"{metrics.num_drafted_tokens} / {metrics.num_accepted_tokens}"),
        ("accept length tau", f"{metrics.accept_length:.3f}"),
        ("acceptance p_k", " ".join(f"{p:.2f}" for p in metrics.acceptance_per_position) or "-"),
        (
            "time prefill / draft / verify / other (s)",
            f"{metrics.time_prefill_s:.3f} / {metrics.time_draft_s:.3f} / "
            f"{metrics.time_verify_s:.3f} / {metrics.time_other_s:.3f}",
        ),
        ("tokens/s", f"{metrics.tokens_per_s:.1f}"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table
