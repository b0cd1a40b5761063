"""The demo's recommendation in words (`verdict_text`): the setting picked and why, the settings
within its noise, a faster median the rule passed over, or why none is recommended (the rule:
`bench.speedup.beats_plain` / `ties_at_top`)."""

from __future__ import annotations

from typing import Any

from specdraft.bench.speedup import beats_plain, speedup_text, ties_at_top


def setting_text(r: dict[str, Any]) -> str:
    """ "num_steps 3, topk 1, num_draft_tokens 4"."""
    return f"num_steps {r['num_steps']}, topk {r['topk']}, num_draft_tokens {r['num_draft_tokens']}"


def passed_over(rows: list[dict[str, Any]], chosen: dict[str, Any], min_speedup: float) -> str:
    """The sentence naming the setting of the fastest median when the rule passed it over (its
    lower quartile not above 1x, or its median under min_speedup), else ""."""
    fastest = max(rows, key=lambda r: r["speedup"])
    if (
        fastest is chosen
        or fastest["speedup"] <= chosen["speedup"]
        or beats_plain(fastest, min_speedup)
    ):
        return ""
    return (
        f" The fastest median, {setting_text(fastest)} at {speedup_text(fastest)}, is not picked: "
        f"its lower quartile {fastest['speedup_q1']:.2f}x is not above 1x (slower than plain "
        "decoding in more than one round of four)."
    )


LOW_TAU = (
    1.2  # a best accept length below this: the drafter barely accepts (tau 1.00: nothing accepted)
)


def verdict_text(
    rows: list[dict[str, Any]],
    chosen: dict[str, Any] | None,
    repeats: int,
    min_speedup: float,
    train_steps: int | None = None,
    num_train: int | None = None,
) -> str:
    """One paragraph: the recommended setting and why, or why none is recommended (a drafter that
    barely accepts, best tau below LOW_TAU, is named as the cause rather than a busy machine;
    train_steps / num_train, when given, are quoted in its fix)."""
    rule = (
        f"a median speedup of at least {min_speedup:.2f}x and a lower quartile above 1x over {repeats} "
        "rounds, each setting timed once per round in turns with plain decoding"
    )
    if chosen is not None:
        ties = [r for r in ties_at_top(rows, min_speedup) if r is not chosen]
        tie_note = (
            f" Within the noise of it: {'; '.join(setting_text(r) + ' ' + speedup_text(r) for r in ties)}"
            "; the pick is the one verifying the fewest tokens per step."
            if ties
            else ""
        )
        return (
            f"Recommended setting: {setting_text(chosen)}: tau {chosen['accept_length']:.2f}, median "
            f"{chosen['tokens_per_s']:.0f} tokens/s, speedup {speedup_text(chosen)} over the same engine "
            f"without speculation (rule: {rule}).{tie_note}{passed_over(rows, chosen, min_speedup)}"
        )
    best = max(rows, key=lambda r: r["speedup"])
    top_tau = max(r["accept_length"] for r in rows)
    if top_tau < LOW_TAU:
        now = [
            f"now --train-steps {train_steps}" if train_steps else "",
            f"--num-train {num_train}" if num_train else "",
        ]
        now_text = f" ({', '.join(n for n in now if n)})" if any(now) else ""
        return (
            f"No setting is recommended: the drafter barely accepts any draft token (best tau {top_tau:.2f}; "
            f"tau 1.00 means none accepted), so speculation only adds work over plain decoding; the best, "
            f"{setting_text(best)}, measured {speedup_text(best)}. Train the drafter longer (--train-steps) "
            f"or on more data (--num-train){now_text}, then re-run the demo."
        )
    return (
        f"No setting is recommended: none was faster than plain decoding beyond the noise on this machine "
        f"(rule: {rule}); the best, {setting_text(best)}, measured {speedup_text(best)}. The machine may be "
        "busy: re-run the demo on an idle one, or measure on the serving machine with `specdraft bench`."
    )
