"""`engine.batch_graphs.GraphedRows` behind `BatchRunner(graphs=True)`: the batched verify as one
graph per (B, T) and placement, every input at a static address. On the CPU the graphs are the
eager stand-in (`EagerGraph`), so the staging, the keys and the static outputs (overwritten by
each replay) run through the same code as on CUDA: at T = 0 a batch run with graphs emits the
same tokens as without, sequences joining and leaving; and sampled too, seeded."""

from __future__ import annotations

import copy

import pytest
import torch

from specdraft.engine.batch import BatchScheduler
from specdraft.engine.batch_graphs import EagerGraph, GraphedRows
from specdraft.engine.batch_target import BatchRunner, batch_causal_mask
from specdraft.engine.errors import EngineError
from specdraft.engine.fast_load import load_fast_target
from specdraft.engine.sampling import SamplingParams
from specdraft.engine.spec_config import SpecConfig
from specdraft.engine.speculate import SpeculativeEngine
from tests.support.batch import requests, staggered_run
from tests.support.engine_helpers import MAX_SEQ, hf_setup, one_thread, tiny_setup  # noqa: F401

SETTINGS = {"plain": None, "chain": SpecConfig.chain(3), "tree": SpecConfig(3, 2, 6)}


def run_tokens(engine, graphs: bool, params=None) -> tuple[list[list[int]], BatchScheduler]:
    """Every request's tokens of a staggered run (`tests.support.batch`), in request order."""
    reqs = requests(engine) if params is None else requests(engine, params=params)
    scheduler = BatchScheduler(engine, 3, graphs=graphs)
    results = staggered_run(scheduler, reqs)
    return [results[id(req)].token_ids for req in reqs], scheduler


@pytest.mark.parametrize("setting", SETTINGS)
def test_graphed_rows_emit_what_the_eager_batch_emits(setting):
    setup, spec = tiny_setup("llama"), SETTINGS[setting]
    engine = setup.engine(setup.trained if spec else None, spec)
    eager, _ = run_tokens(engine, graphs=False)
    graphed, scheduler = run_tokens(engine, graphs=True)
    assert graphed == eager
    rows = scheduler.runner.graphed_rows
    sizes = {(b, t) for b, t, *_ in rows.graphs}
    assert {b for b, _ in sizes} == {1, 2, 3}  # the batch grew and shrank: a graph per size
    assert all(isinstance(graph, EagerGraph) for graph, _, _ in rows.graphs.values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need CUDA")
@pytest.mark.parametrize("setting", SETTINGS)
def test_cuda_graphed_rows_emit_what_the_eager_batch_emits(setting):
    """On CUDA (fp32) the graphs are captured `torch.cuda.CUDAGraph`s: the same tokens as the
    eager batch, sequences joining and leaving."""
    setup, spec = tiny_setup("llama"), SETTINGS[setting]
    target = load_fast_target(setup.target_dir, device="cuda")
    draft = copy.deepcopy(setup.trained).to("cuda") if spec else None
    engine = SpeculativeEngine(target, draft, spec, None, MAX_SEQ, "cuda", None)
    eager, _ = run_tokens(engine, graphs=False)
    graphed, scheduler = run_tokens(engine, graphs=True)
    assert graphed == eager
    graphs = [graph for graph, _, _ in scheduler.runner.graphed_rows.graphs.values()]
    assert graphs and all(isinstance(graph, torch.cuda.CUDAGraph) for graph in graphs)


def test_graphed_rows_sampled_equal_the_eager_batch_seeded():
    setup = tiny_setup("llama")
    engine = setup.engine(setup.trained, SETTINGS["chain"])
    params = SamplingParams(temperature=0.8)
    eager, _ = run_tokens(engine, graphs=False, params=params)
    graphed, _ = run_tokens(engine, graphs=True, params=params)
    assert graphed == eager


def test_a_key_seen_again_replays_its_graph_into_the_same_outputs():
    setup = tiny_setup("llama")
    target = setup.target
    target.setup_cache(2, 32)
    rows = GraphedRows(target, (1, 2), 32)
    starts = torch.tensor([4, 7])
    slots = starts[:, None] + torch.arange(2)
    ids = torch.tensor([[1, 2], [3, 4]])
    mask = batch_causal_mask(starts, 2, 32)
    first = rows(ids, slots, slots, mask, (1, 2))
    logits = first.logits.clone()
    again = rows(ids.flip(1), slots, slots, mask, (1, 2))
    assert again.logits is first.logits and len(rows.graphs) == 1  # one graph, its outputs
    assert not torch.equal(again.logits, logits)  # overwritten by the replay
    eager = target(ids, slots, slots, mask, (1, 2))
    assert torch.equal(rows(ids, slots, slots, mask, (1, 2)).logits, eager.logits)
    rows(ids[:1], slots[:1], slots[:1], mask[:1], (1, 2))
    assert len(rows.graphs) == 2  # another B: another graph


def test_graphs_over_a_target_reading_host_inputs_are_refused():
    setup = hf_setup("llama")
    with pytest.raises(EngineError, match="fast target"):
        BatchRunner(setup.target, (1, 2), 2, 32, torch.device("cpu"), graphs=True)
