"""SGLang's draft forward (its LlamaForCausalLMEagle3, torch-native attention over its own KV pool)
against specdraft's Eagle3Draft on the same inputs, float32, for each norm flag SGLang implements
(FLAG_RULES; a flag whose row starts after the installed release is checked to be ignored: the
drafter without it is what SGLang computes): the first step over a prompt's aux states, then a second step fed the first step's
own hidden state at the last position (as SGLang carries it: pre-norm, or post-norm with
norm_output), attending to the cached keys. Logits and hidden states within 1e-5; the proposed
token equal after SGLang's hot_token_id map and specdraft's d2t."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from specdraft.checkpoint import load_draft
from specdraft.conventions import parse_version
from specdraft.conventions.engines import FLAG_RULES
from specdraft.draft_config import NORM_FLAGS
from tests.sglang_tier import engine
from tests.sglang_tier.worlds import sglang_export
from tests.support.doctor_helpers import edit_config, one_thread  # noqa: F401 (autouse: one torch thread)

T = 12  # prompt positions
TOL = dict(rtol=1e-5, atol=1e-5)
SGLANG_RULES = [r for r in FLAG_RULES if r.engine == "sglang"]
# the flags SGLang implements (use_aux_norm: its legacy name of fc_norm)
FLAGS = [r.flag for r in SGLANG_RULES if r.implemented and r.flag != "use_aux_norm"]
COMBINATIONS = [dict(zip(FLAGS, v)) for v in itertools.product((False, True), repeat=len(FLAGS))]


def both_drafters(export):
    """(SGLang's drafter with the target embedding set, specdraft's from the same directory as
    this SGLang computes it: `as_built_by_this_sglang`)."""
    loaded = engine.load(export.path, draft=True, dtype="float32")
    engine.set_embed(loaded.model, export.embedding)
    ours = load_draft(export.path).model.eval()
    ours.load_target_embedding(export.embedding)
    return loaded.model, as_built_by_this_sglang(ours)


def as_built_by_this_sglang(ours):
    """`ours` without the flags the installed SGLang does not implement yet (FlagRule.since)."""
    version = parse_version(engine.VERSION)
    late = {r.flag for r in SGLANG_RULES if r.since is not None and version < r.since}
    if "norm_before_fc" in late:
        ours.input_norm = None
    if "fc_norm" in late:
        ours.fc_norm = None
    ours.cfg = dataclasses.replace(
        ours.cfg, **{f: False for f in late if f in NORM_FLAGS and getattr(ours.cfg, f)}
    )
    return ours


def fixed_inputs(ours):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, ours.cfg.vocab_size, (T,), generator=gen)
    aux = torch.randn(T, ours.cfg.n_aux * ours.cfg.target_hidden_size, generator=gen)
    return ids, aux


@torch.no_grad()
def two_steps_each(theirs, ours, ids, aux):
    """[(SGLang's output, specdraft's output)] of the first step and the second step."""
    runner = engine.Runner(theirs)
    first = runner.extend(ids, aux)
    mine = ours(ids[None], aux[None], torch.arange(T)[None], first_step=True)
    token = theirs.hot_token_id[first.next_token_logits.argmax(-1)]
    assert torch.equal(token, ours.draft_to_target(mine.logits[:, -1].argmax(-1)))
    second = runner.decode(token, first.hidden_states[-1:])
    mine2 = ours(
        token[None], mine.hidden[:, -1:], torch.tensor([[T]]), first_step=False, past_kv=mine.kv
    )
    return [(first, mine), (second, mine2)]


@pytest.mark.parametrize(
    "flags", COMBINATIONS, ids=lambda f: "+".join(k for k, v in f.items() if v) or "none"
)
def test_first_and_second_step_equal_specdraft(tmp_path, flags):
    theirs, ours = both_drafters(sglang_export(tmp_path, flags=flags))
    for step, (sg, sd) in enumerate(two_steps_each(theirs, ours, *fixed_inputs(ours))):
        torch.testing.assert_close(sg.next_token_logits[0], sd.logits[0, -1], **TOL)
        torch.testing.assert_close(sg.hidden_states, sd.hidden[0], **TOL, msg=f"step {step}")
        token = theirs.hot_token_id[sg.next_token_logits.argmax(-1)]
        assert torch.equal(token, ours.draft_to_target(sd.logits[:, -1].argmax(-1))), step


def test_norm_before_residual_is_not_implemented(tmp_path):
    """FLAG_RULES: SGLang has no norm_before_residual (export refuses it); a config that sets it
    runs as the drafter without it."""
    (rule,) = [r for r in SGLANG_RULES if r.flag == "norm_before_residual"]
    assert not rule.implemented
    export = sglang_export(tmp_path)
    theirs, ours = both_drafters(export)  # ours: as exported (flag off)
    edit_config(export.path, lambda c: c.update(norm_before_residual=True))
    theirs = engine.load(export.path, draft=True, dtype="float32").model
    engine.set_embed(theirs, export.embedding)
    ids, aux = fixed_inputs(ours)
    sg = engine.Runner(theirs).extend(ids, aux)
    with torch.no_grad():
        without = ours(ids[None], aux[None], torch.arange(T)[None], first_step=True)
        ours.cfg = dataclasses.replace(ours.cfg, norm_before_residual=True)
        with_flag = ours(ids[None], aux[None], torch.arange(T)[None], first_step=True)
    torch.testing.assert_close(sg.hidden_states, without.hidden[0], **TOL)
    assert not torch.allclose(sg.hidden_states, with_flag.hidden[0], **TOL)
