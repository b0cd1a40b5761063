"""Whether other processes keep this machine's CPU busy: timings taken then are low and noisy.

`generate`, `demo` and `bench` (against a server on this machine) say so next to their numbers;
the numbers themselves are never adjusted."""

from __future__ import annotations

import os

# The CPU threads torch uses in every command, the demo's too (--threads): one. On the CPU
# specdraft runs small models (stories260K, pycode-25m), whose threads only fight each other, and
# the README's serve lines put two servers and a benchmark on one machine (benchmarks/RESULTS.md,
# "CPU threads").
DEFAULT_THREADS = 1


def busy_note(numbers: str, remedy: str = "") -> str | None:
    """A one-line note when the 1-minute load average is at least half the core count (Unix
    only), or None. numbers: what the note is about ("the tokens/s above"); remedy: an optional
    hint appended after a semicolon."""
    if not hasattr(os, "getloadavg"):
        return None
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load < cores / 2:
        return None
    return (
        f"note: the machine was busy when this started (load {load:.1f} on {cores} cores): {numbers} are "
        f"lower and noisier than on an idle machine" + (f"; {remedy}" if remedy else "")
    )
