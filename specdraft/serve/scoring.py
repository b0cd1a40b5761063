"""The target's scores of a request's tokens and its penalties, in the engine's own round
(`ScoredTarget`), for the server's `logprobs`, `echo` with logprobs, and presence / frequency
penalties.

`ScoredTarget` is a `round.Target` over the engine's `TargetRunner`, installed for one request
(`scoring`): every forward's logits [N, V] pass through it. It keeps their log-softmax (the
target's raw log-probabilities, `logprobs.TokenScore`) with the proposal's tree, so that the
tokens the round emits (`take`, from the worker's token callback: accepted drafts, then the
bonus) get the row after their parent node; and it returns the logits with
`sampling.apply_penalties` applied, row i counting the output so far plus the drafts on the path
to node i, so the proposal's acceptance rule (greedy prefix, `verify_chain`, `verify_tree`)
runs on the penalised target: lossless against plain decoding with the same penalties. The first
token (the prefill's) follows no output, so no penalty applies to it.

While it is installed the engine's ahead-of-host paths, which verify without a `Target` call
(`rounds_ahead.RoundsAhead`, plain decoding's `GraphedTarget.decode_ahead`), are off:
`ScoredTarget.graphed` is None and the engine's `rounds_ahead` is set aside.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from specdraft.engine.sampling import apply_penalties, children_of
from specdraft.serve.logprobs import TokenScore


class ScoredTarget:
    """A `round.Target` wrapping `runner` for one request. num_top: alternatives kept per token
    (None: no scores); presence / frequency: the penalties; prompt_scores: keep the prompt's
    (echo). Other attributes are the runner's."""

    graphed = None  # `SpeculativeEngine.generate` then runs no decode ahead of the host

    def __init__(
        self,
        runner: Any,
        num_top: int | None,
        presence: float,
        frequency: float,
        prompt_scores: bool = False,
    ) -> None:
        self.runner, self.num_top = runner, num_top
        self.presence, self.frequency = presence, frequency
        self.keep_prompt = prompt_scores
        self.output: list[int] = []  # the tokens emitted so far
        self.prompt: list[TokenScore] = []
        self.rows: Tensor | None = None  # [N, V] log-probabilities of the last forward
        self.children: list[dict[int, int]] = [{}]  # its tree: {child token: node} per node

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)

    @property
    def penalised(self) -> bool:
        """Whether any penalty applies."""
        return bool(self.presence or self.frequency)

    def prefill(self, ids: Tensor) -> tuple[Tensor, Tensor | None]:
        """`Target.prefill`; keeps the last row's scores (and the prompt's, for echo)."""
        logits, aux = self.runner.prefill(ids)
        if self.num_top is not None:
            rows = logits.float().log_softmax(-1)
            if self.keep_prompt:
                ids_list = ids.tolist()
                self.prompt = [TokenScore(ids_list[0], None)] + [
                    self.score(rows[i], t) for i, t in enumerate(ids_list[1:])
                ]
            self.rows, self.children = rows[-1:], [{}]
        return logits, aux

    def verify(self, proposal: Any, start: int) -> tuple[Tensor, Tensor | None]:
        """`Target.verify`, its logits penalised per node's path; keeps their scores."""
        logits, aux = self.runner.verify(proposal, start)
        if self.num_top is None and not self.penalised:
            return logits, aux
        tokens = proposal.tokens.tolist()
        parents = parents_of(proposal, len(tokens))
        if self.num_top is not None:
            self.rows = logits.float().log_softmax(-1)
            self.children = children_of(parents, tokens)
        if self.penalised:
            counts = path_counts(parents, tokens, self.output, logits.shape[-1])
            logits = apply_penalties(logits, counts, self.presence, self.frequency)
        return logits, aux

    def commit(self, start: int, path: Tensor) -> None:
        """`Target.commit`."""
        self.runner.commit(start, path)

    def take(self, ids: list[int]) -> list[TokenScore] | None:
        """The round emitted `ids` (the first from the root, each next one from the node of the
        one before): their scores (None without num_top); they join the output."""
        self.output += ids
        if self.num_top is None:
            return None
        scores, node = [], 0
        for token in ids:
            scores.append(self.score(self.rows[node], token))
            node = self.children[node].get(token, node)  # the bonus: no child, the last token
        return scores

    def score(self, row: Tensor, token: int) -> TokenScore:
        """The token's log-probability in `row` [V] and the num_top most likely."""
        top = row.topk(self.num_top) if self.num_top else None
        pairs = () if top is None else tuple(zip(top.indices.tolist(), top.values.tolist()))
        return TokenScore(token, float(row[token]), pairs)


def parents_of(proposal: Any, num_nodes: int) -> list[int]:
    """Each node's parent (-1 for the root): a drafted tree's (`TreeProposal.tree`), a tree
    selected on the device (`SelectedProposal.parents`), else a chain's."""
    tree = getattr(proposal, "tree", None)
    if tree is not None:
        return list(tree.parents)
    parents = getattr(proposal, "parents", None)
    if parents is not None:
        return [int(p) for p in parents.tolist()]
    return list(range(-1, num_nodes - 1))


def path_counts(parents: list[int], tokens: list[int], output: list[int], vocab: int) -> Tensor:
    """[N, V] float32: each token's occurrences in the output and on the path to each node
    (the root's token is the output's last: counted once)."""
    base = torch.bincount(torch.tensor(output, dtype=torch.long), minlength=vocab)[:vocab]
    counts = base.float().repeat(len(tokens), 1)
    for node in range(1, len(tokens)):
        counts[node] = counts[parents[node]]
        counts[node, tokens[node]] += 1
    return counts


@contextlib.contextmanager
def scoring(engine: Any, target: ScoredTarget) -> Iterator[ScoredTarget]:
    """`target` as the engine's round target (its runner) for the block, the engine's
    ahead-of-host rounds set aside; both restored after."""
    runner, ahead = engine.runner, engine.rounds_ahead
    engine.runner, engine.rounds_ahead = target, None
    try:
        yield target
    finally:
        engine.runner, engine.rounds_ahead = runner, ahead
