"""Doctor on correct exports raises no false alarm (issue #34, "done when"): for every target
class an engine serves a drafter on (every tiny architecture of tests/support/tiny_models.py but Gemma 2 /
3 and Qwen2-VL, which no engine serves; Qwen3.5 and Gemma 4 among them, read by their own rows),
a drafter exported for each engine that serves the class, on the default aux layers and on
others, gets 0 FAIL from `doctor --engine` of it."""

from __future__ import annotations

import pytest

from specdraft.doctor import run_doctor
from specdraft.export import export_draft
from tests.support.doctor_helpers import draft_checkpoint, one_thread  # noqa: F401
from tests.support.tiny_models import ARCHITECTURES, MORE_ARCHITECTURES, NEWER_ARCHITECTURES

SERVED_BY_NONE = ("gemma2", "gemma3", "qwen2_vl")
# SGLang 0.5.23 serves no EAGLE-3 drafter on Llava / Mistral3 (llava.py: no capture method)
SGLANG_REFUSES = ("llava", "mistral3")
DEEPSEEK_CLASS = ("deepseek_v2", "deepseek_v3", "kimi_k25")
DEFAULT = (2, 3, 4)  # specdraft's default on 7 layers: [2, L//2, L-3]
# Gemma 4's head_dim differs by layer (sliding / full): the drafter takes one, as draft_overrides
DRAFT_OVERRIDES = {"gemma4": {"head_dim": 8}}
ALL_ARCHITECTURES = ARCHITECTURES + MORE_ARCHITECTURES + NEWER_ARCHITECTURES


def other_layers(arch: str) -> tuple[int, ...]:
    """Non-default aux layers every engine writes alike; on DeepSeek not index 1 first (SGLang
    >= 0.5.13 cannot write it there: first id 1 reads as index 2)."""
    return (2, 4, 6) if arch in DEEPSEEK_CLASS else (1, 3, 5)


@pytest.mark.parametrize("arch", [a for a in ALL_ARCHITECTURES if a not in SERVED_BY_NONE])
def test_correct_exports_get_no_fail(tmp_path, arch):
    engines = [
        e
        for e in ("sglang", "vllm", "speculators")
        if not (e == "sglang" and arch in SGLANG_REFUSES)
    ]
    for aux in (DEFAULT, other_layers(arch)):
        root = tmp_path / "-".join(map(str, aux))
        overrides = DRAFT_OVERRIDES.get(arch)
        draft, target = draft_checkpoint(root, arch=arch, num_layers=7, aux=aux, draft_kw=overrides)
        for engine in engines:
            export_draft(draft, root / engine, engine=engine, target=target)
            served_by = "vllm" if engine == "speculators" else engine
            report = run_doctor(root / engine, target=target, engine=served_by)
            fails = [(f.check, f.evidence) for f in report.findings if f.verdict == "fail"]
            assert not fails, (arch, aux, engine, fails)
            assert report.finding("engine_captures_training_layers").verdict == "pass"
