"""Case S2: one H-wide hidden state where n_aux·H is expected must never skip `fc` silently."""

import pytest
import torch

from tests.support.drafts import tiny_draft


def test_case_s2_single_hidden_state_is_refused_naming_aux_layers():
    model = tiny_draft()  # draft H == target H == 32, so a width heuristic would skip fc
    one_state = torch.randn(1, 3, model.cfg.target_hidden_size)
    with pytest.raises(ValueError) as err:
        model(torch.zeros(1, 3, dtype=torch.long), one_state, torch.arange(3), first_step=True)
    message = str(err.value)
    assert "layers [2, 3, 4]" in message and "3 x 32 = 96" in message and "got width 32" in message


def test_case_s2_three_states_use_fc():
    model = tiny_draft()
    aux = torch.randn(1, 3, 96)
    out = model(torch.zeros(1, 3, dtype=torch.long), aux, torch.arange(3), first_step=True)
    with torch.no_grad():
        model.fc.weight.mul_(2)
    changed = model(torch.zeros(1, 3, dtype=torch.long), aux, torch.arange(3), first_step=True)
    assert not torch.allclose(out.logits, changed.logits)
