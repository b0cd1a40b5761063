"""A user's --aux-layers: checked by the rules every engine's aux layers obey, or read in the
convention it names ("vllm:2,16,29", "sglang:1,15,28"; no name = specdraft indices)."""

from __future__ import annotations

from specdraft.conventions.defaults import default_aux_layers
from specdraft.conventions.ids import ConventionError, check_aux_layers, from_engine_ids


def check_aux_flag(aux_layers, num_layers: int) -> None:
    """`check_aux_layers` for a user's --aux-layers: ConventionError naming the flag, the rule broken
    and an example that obeys it (capture checks it before writing, train --online before loading
    the drafter)."""
    try:
        check_aux_layers(list(aux_layers), num_layers)
    except ConventionError as e:
        example = ",".join(map(str, default_aux_layers(num_layers))) if num_layers >= 4 else "0,1,2"
        raise ConventionError(
            f"--aux-layers {','.join(map(str, aux_layers))}: {e}; give 3 increasing "
            f"layers in 0..{num_layers}, e.g. {example}"
        ) from None


# The conventions an --aux-layers value may be written in ("vllm:2,16,29"; no name = specdraft).
AUX_CONVENTIONS = ("specdraft", "vllm", "sglang", "speculators")


def split_aux_option(text: str) -> tuple[str, str]:
    """An --aux-layers value as (convention, the comma-separated list): "sglang:1,15,28" ->
    ("sglang", "1,15,28"), "2,16,29" -> ("specdraft", "2,16,29"). ConventionError for another name."""
    name, sep, rest = text.partition(":")
    if not sep:
        return "specdraft", text
    if name.strip() not in AUX_CONVENTIONS:
        raise ConventionError(
            f"{text!r}: {name.strip()!r} is no aux-id convention; write "
            f"{' | '.join(AUX_CONVENTIONS)}:IDS, e.g. vllm:2,16,29 or sglang:1,15,28"
        )
    return name.strip(), rest


def layers_of_option(
    convention: str,
    ids,
    num_layers: int,
    target_class: str = "llama",
    sglang_version: str | None = None,
) -> list[int]:
    """Specdraft indices an --aux-layers value names: ids in `convention` ("specdraft": as given,
    checked by `check_aux_layers`; an engine: `from_engine_ids` by its rule for the target's class
    and SGLang version). Raises ConventionError naming the rule broken."""
    if (
        convention == "specdraft"
    ):  # no engine's count: the drafter's fc width bounds it (`check_aux_count`)
        return check_aux_layers(list(ids), num_layers, engine="specdraft")
    return from_engine_ids(list(ids), convention, num_layers, target_class, sglang_version)
