"""The EAGLE-3 tree proposer (EAGLE-2 / SGLang expansion, `tree.TreeExpansion`) and its proposals.

`EagleTree` drafts like `eagle.EagleChain` (the first step over the pending positions, then
num_steps - 1 steps), but every step expands the top-k children of the frontier and the best
num_draft_tokens - 1 nodes by cumulative draft score are verified; compiled, the whole round,
selection and verify inputs included, is one graph replay (`draft_round.GraphedRound`).
A tree's acceptance rule (`TreeProposal.accept`): follow the target's argmax (T = 0) or one draw
from p per node (T > 0, target-only) while it is a child (`sampling.verify_greedy`,
`sampling.verify_tree`); the accepted path's K/V then move behind the prefix (`Target.commit`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specdraft.engine import sampling
from specdraft.engine.eagle import DRAFT_SDPA_BACKENDS, NO_CONTEXT, EagleChain, sdpa_kernel
from specdraft.engine.requests import Request
from specdraft.engine.round import Proposal
from specdraft.engine.sampling import Verdict, logits_to_probs, sample
from specdraft.engine.tree import DraftTree, TreeExpansion, depths_of


def kept_path(tokens: list[int], verdict: Verdict, device: torch.device) -> tuple:
    """`Proposal.accept`'s result from a tree's verdict: the emitted tokens and the accepted
    path's node ids [a + 1] long on device, or None when they are 0..a (in place already)."""
    emitted = [tokens[node] for node in verdict.accepted] + [verdict.bonus]
    path = [0] + verdict.accepted
    if path[-1] == len(path) - 1:  # a path is increasing: 0..a is the only one ending at a
        return emitted, None
    return emitted, torch.tensor(path, device=device)


@dataclass
class TreeProposal(Proposal):
    """A drafted tree (`tree`, a `DraftTree`) as the round verifies it."""

    tree: DraftTree | None = None

    @classmethod
    def of(cls, tree: DraftTree) -> TreeProposal:
        """The proposal of a tree (a chain-shaped one attends causally)."""
        ancestors = None if tree.is_chain else tree.ancestor_mask()
        depths = torch.tensor(tree.depths)
        return cls(tree.tokens, depths, ancestors, None, tree.num_nodes - 1, tree=tree)

    def within(self, num_nodes: int) -> Proposal:
        """The root and the num_nodes - 1 best nodes (`DraftTree.best`); itself when it has no
        more."""
        if self.tokens.numel() <= num_nodes:
            return self
        return TreeProposal.of(self.tree.best(num_nodes))

    def accept(self, req: Request, logits: Tensor) -> tuple[list[int], Tensor | None]:
        """A tree's rule: `sampling.verify_greedy` (T = 0), `sampling.verify_tree` (T > 0)."""
        tokens, parents = self.tokens.tolist(), self.tree.parents
        if req.greedy:
            verdict = sampling.verify_greedy(parents, tokens, logits)
        else:
            probs = logits_to_probs(logits, req.params)
            verdict = sampling.verify_tree(parents, tokens, probs, req.generator)
        return kept_path(tokens, verdict, self.tokens.device)


@dataclass
class SelectedProposal(Proposal):
    """A tree a graphed round selected on the device (`tree.select_on_device`): its tokens,
    positions, slots and mask are in the verify's inputs already (in_place). parents: [N] long
    (-1 for the root); scores: [N] float32; ok: [] bool, False when the selection kept a node
    without its parent (read with the verdict's inputs, then raised)."""

    parents: Tensor | None = None
    scores: Tensor | None = None
    ok: Tensor | None = None

    def read(self, req: Request, logits: Tensor) -> tuple[DraftTree, list[int], Verdict]:
        """The tree, its tokens and the verdict (the target's argmax, or one draw from p per
        node, walked as `sampling.walk`), from one read of the device after the verify.
        Raises RuntimeError when the selection kept a node without its parent (as
        `tree.select` does)."""
        if req.greedy:
            choices = logits.argmax(-1)
        else:
            choices = sample(logits_to_probs(logits, req.params), req.generator)
        n = self.tokens.numel()
        packed = torch.cat([self.tokens, self.parents, choices, self.ok.view(1).long()]).tolist()
        tree = self.tree_of(packed[n : 2 * n], packed[-1])
        tokens, choice = packed[:n], packed[2 * n : 3 * n]
        return tree, tokens, sampling.walk(tree.parents, tokens, choice)

    def tree_of(self, parents: list[int], ok: int) -> DraftTree:
        """The selected tree from its parents and ok as read from the device. Raises
        RuntimeError when the selection kept a node without its parent."""
        if not ok:
            raise RuntimeError(
                "draft tree selection kept nodes without their parents: scores are not monotone "
                "along paths"
            )
        return DraftTree(self.tokens, parents, depths_of(parents), self.scores)

    def within(self, num_nodes: int) -> Proposal:
        """The best num_nodes of the selected tree (`TreeProposal.within`), verified from the
        host (read from the device here); itself when it has no more."""
        if self.tokens.numel() <= num_nodes:
            return self
        packed = torch.cat([self.parents, self.ok.view(1).long()]).tolist()
        tree = self.tree_of(packed[:-1], packed[-1]).best(num_nodes)  # tokens copied
        return TreeProposal.of(tree)

    def accept(self, req: Request, logits: Tensor) -> tuple[list[int], Tensor | None]:
        """A tree's rule (`read`), on the selected nodes."""
        _, tokens, verdict = self.read(req, logits)
        return kept_path(tokens, verdict, self.tokens.device)


class EagleTree(EagleChain):
    """The `round.Proposer` of EAGLE-3 trees (topk > 1; any topk runs, 1 included); arguments
    as `EagleChain`'s. Greedy expansion at every temperature (the tree's children are the
    top-k, whatever T), so every round may replay the compiled graph."""

    def propose(self, req: Request) -> Proposal:
        """The tree's nodes: one graph replay once compiled, else step by step (`draft_steps`)."""
        out = None if self.runner.graphed is None else self.runner.device_input_ids(self.num_nodes)
        out = None if out is None else out[0]
        if self.rounds is not None:
            proposal = self.graphed_round(req, out)
            if proposal is not None:
                return proposal
        return TreeProposal.of(self.draft_steps(req, out))

    def graphed_round(self, req: Request, out: Tensor | None) -> Proposal | None:
        """A tree selected on the device (`replay`), or None. Raises RuntimeError when the
        draft cache and the target disagree on the tree's positions."""
        inputs = self.runner.verify_inputs(self.num_nodes)  # before the round writes them (a
        # capture of the verify graph overwrites them)
        candidates = self.replay(req)
        if candidates is None:
            return None
        if self.cache.length != req.length:  # its positions start at the committed entries
            raise RuntimeError(
                f"draft cache holds {self.cache.length} entries, the target {req.length}: "
                "a graphed tree round would verify at wrong positions"
            )
        n = self.num_nodes
        return SelectedProposal(inputs[0][0], None, None, None, n - 1, True, *candidates)

    def expansion(self, req: Request) -> TreeExpansion:
        """A round's expansion from req's root: top-k children (greedy at every temperature)."""
        spec, kernels = self.spec, self.fast.triton_kernels
        return TreeExpansion(
            req.output_ids[-1],
            spec.topk,
            False,
            req.params,
            self.vocab,
            self.vocab_size,
            req.generator,
            kernels=kernels,
        )

    def draft_steps(self, req: Request, out: Tensor | None) -> DraftTree:
        """The round step by step: the first step over the m pending positions, then the tree
        steps, each expanding the frontier (`TreeExpansion`); out as `tree.tree_of`'s."""
        draft, cache, spec = self.run_draft, self.cache, self.spec
        start, m = cache.length, req.pending_ids.numel()
        expansion = self.expansion(req)
        with sdpa_kernel(DRAFT_SDPA_BACKENDS) if self.cuda else NO_CONTEXT:
            positions = torch.arange(start, start + m, device=self.device)
            logits, hidden = draft(req.pending_ids, req.pending_aux, positions, True, cache, start)
            cache.commit(m)
            tokens, hidden = expansion.expand(logits[-1:], hidden[-1:], written=False)
            for step in range(1, spec.num_steps):  # frontier at depth `step`, RoPE t + step
                past = cache.length + expansion.num_scratch
                position = torch.full(
                    (tokens.numel(),), cache.length - 1 + step, device=self.device
                )
                mask = expansion.draft_mask(cache.length)
                logits, hidden = draft(tokens, hidden, position, False, cache, past, mask)
                tokens, hidden = expansion.expand(logits, hidden, written=True)
        return expansion.tree(spec.num_draft_tokens, out=out)
