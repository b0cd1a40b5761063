"""speculators 0.9.0 (its own code, in-process) against specdraft: it loads every speculators
export of specdraft (each norm-flag combination speculators accepts), its model's TTT forward on
fixed inputs gives specdraft's drafter's logits (float32, <= 1e-5), and the output of its
EAGLE-3 converter loads in specdraft with the same tensors."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from specdraft.checkpoint import load_draft
from specdraft.conventions.engines import SPECULATORS_EXCLUSIVE_FLAGS
from specdraft.draft_config import NORM_FLAGS
from specdraft.export import export_draft
from specdraft.train.loss import shift_left, ttt_unroll
from tests.support.doctor_helpers import draft_checkpoint, one_thread  # noqa: F401 (autouse: one torch thread)
from tests.support.drafts import FLAG_COMBINATIONS, flag_id

pytestmark = pytest.mark.speculators

TTT_STEPS, T = (
    3,
    128,
)  # speculators builds flex block masks of 128-token blocks: T a multiple of 128
# Every combination speculators' config accepts (it refuses norm_before_fc with fc_norm).
ACCEPTED = [f for f in FLAG_COMBINATIONS if not all(f[k] for k in SPECULATORS_EXCLUSIVE_FLAGS)]


def exported(root, flags, engine="speculators"):
    """(specdraft's drafter as loaded from its export for `engine`, the export dir, the target dir)."""
    draft, target = draft_checkpoint(root, draft_kw=flags)
    out = root / engine
    export_draft(draft, out, engine=engine, target=target)
    model = load_draft(out).model.eval()
    model.load_target_embedding(
        load_file(str(target / "model.safetensors"))["model.embed_tokens.weight"]
    )
    return model, out, target


def fixed_inputs(cfg):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (1, T), generator=gen)
    aux = torch.randn(1, T, cfg.n_aux * cfg.target_hidden_size, generator=gen)
    return ids, aux


@torch.no_grad()
def speculators_step_logits(model, ids, aux) -> list[torch.Tensor]:
    """The logits of each TTT step of speculators' Eagle3DraftModel.forward (read off lm_head).

    speculators feeds step k the given ids shifted left by k (zeros past the end), specdraft's
    unroll x shifted by 1 + k: given shift_left(x, 1), the two read the same tokens."""
    logits = []
    hook = model.lm_head.register_forward_hook(lambda _m, _i, out: logits.append(out))
    try:
        model(
            hidden_states=aux,
            input_ids=shift_left(ids, 1),
            document_ids=torch.zeros_like(ids),
            position_ids=torch.arange(T)[None],
            ttt_steps=TTT_STEPS,
        )
    finally:
        hook.remove()
    return logits


def load_in_speculators(out, embedding):
    from speculators.models.eagle3 import Eagle3DraftModel

    model = Eagle3DraftModel.from_pretrained(str(out)).float().eval()
    with torch.no_grad():
        model.embed_tokens.weight.copy_(embedding)  # shared with the target: not in the file
    return model


@pytest.mark.parametrize("flags", ACCEPTED, ids=flag_id)
def test_speculators_loads_the_export_and_its_forward_equals_specdraft(tmp_path, flags):
    ours, out, _ = exported(tmp_path, flags)
    theirs = load_in_speculators(out, ours.embed_tokens.weight)
    for name in NORM_FLAGS:
        assert getattr(theirs.config, name) is flags[name], name
    ids, aux = fixed_inputs(ours.cfg)
    with torch.no_grad():
        expected = [o.logits for o in ttt_unroll(ours, ids, aux, TTT_STEPS, flex=False)]
    got = speculators_step_logits(theirs, ids, aux)
    assert len(got) == TTT_STEPS
    for step, (a, b) in enumerate(zip(got, expected)):
        torch.testing.assert_close(
            a, b, rtol=1e-5, atol=1e-5, msg=lambda m, s=step: f"TTT step {s}: {m}"
        )


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_speculators_converter_output_loads_in_specdraft(tmp_path, norm_before_residual):
    """An official-layout export (vLLM's) through speculators' Eagle3Converter: specdraft loads the
    result with the flag and every tensor as they were."""
    from speculators.convert.eagle.eagle3_converter import Eagle3Converter

    flags = dict.fromkeys(NORM_FLAGS, False) | {"norm_before_residual": norm_before_residual}
    ours, out, target = exported(tmp_path, flags, engine="vllm")
    converted = tmp_path / "converted"
    Eagle3Converter().convert(
        out,
        converted,
        base_model=str(target),
        validate=False,
        norm_before_residual=norm_before_residual,
        eagle_aux_hidden_state_layer_ids=[2, 3, 4],
    )
    loaded = load_draft(converted, target_num_layers=ours.cfg.target_num_layers)
    assert loaded.layout == "speculators"
    assert loaded.model.cfg.norm_before_residual is norm_before_residual
    assert loaded.model.cfg.aux_layers == ours.cfg.aux_layers
    theirs = loaded.model.state_dict()
    for name, tensor in ours.state_dict().items():
        if name != "embed_tokens.weight":
            assert torch.equal(theirs[name], tensor), name
