"""Requests of different lengths for the batch scheduler's tests (`engine.batch`), and a run in
which they join a running batch one round apart."""

from __future__ import annotations

from specdraft.engine.sampling import SamplingParams
from tests.support.engine_helpers import random_prompts

LENGTHS, NUM_NEW = (3, 9, 5, 12, 7, 4), (10, 20, 6, 15, 12, 9)
GREEDY = SamplingParams()


def prompts() -> list[list[int]]:
    """Six prompts of LENGTHS (seeded)."""
    return [random_prompts(1, n, seed=30 + i)[0] for i, n in enumerate(LENGTHS)]


def requests(engine, num_new=NUM_NEW, params=GREEDY):
    """A request per prompt (generator seeds 100, 101, ...), built and checked by the engine."""
    return [
        engine.new_request(p, n, params, (), None, 100 + i, None)
        for i, (p, n) in enumerate(zip(prompts(), num_new))
    ]


def staggered_run(scheduler, reqs) -> dict:
    """Three requests first, one more after each of the first rounds, then to the end:
    {id(request): its GenerationResult}."""
    for req in reqs[:3]:
        scheduler.add(req)
    results = []
    for req in reqs[3:]:
        results += scheduler.step()
        scheduler.add(req)
    results += scheduler.run()
    assert sorted(id(req) for req, _ in results) == sorted(map(id, reqs))
    return {id(req): result for req, result in results}
