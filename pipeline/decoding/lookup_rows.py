"""Rows of a draft-free drafter: the `Rows` verbs over one lookup per row (`pipeline.lookups`), an
index of the request's token context (its prompt, then every token settled), on the host.

- A block's first feed (the tokens the rows have not seen) looks up afresh after them: the
  lookup's continuation (transformers' candidates, for `pld`) becomes the row's plan. Each later
  token follows the plan while it is the plan's next token, and looks up afresh when it is not
  (another member of an ensemble chose it), so a block's chain is the lookup's continuation.
- A row's distribution is a point mass on the plan's next token. Where it has none (no match, or
  the plan is spent) the row abstains: its distribution is uniform (it spreads its weight over
  every token, so in an ensemble the other members choose), and `abstains` says so, so that a
  chain ends there (`ChainProposal.depths`): a request whose context has no match drafts nothing.
- A ranking lookup (`lookahead`'s trie) has no plan: at every position, prompt, drafted or a
  tree's node, its distribution is its weights for the next token after the context there.
- Settling commits the kept tokens to the lookup's index; nothing else is rolled back.
A prompt row arrives as `LookupDraft` embeds it: a column of token ids, each image one negative
id (a lookup never matches an image, nor proposes one).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from pipeline.lookups import Lookup
from pipeline.models.base import LVLM, StepLog


@dataclass(frozen=True)
class Follow:
    """Where a row stands in a block: the tokens fed since the last settle (`suffix`, fillers left
    out) and the plan it follows (`plan[at]` is its next proposal), or a ranking lookup's weights
    for the next token (`ranked`)."""

    suffix: tuple[int, ...]
    plan: tuple[int, ...]
    at: int
    ranked: dict[int, int] | None = None

    @property
    def proposal(self) -> int | dict[int, int] | None:
        if self.ranked is not None:
            return self.ranked or None
        return self.plan[self.at] if self.at < len(self.plan) else None


class LookupRows:
    """`prompts`: each row's token ids as a column `[L, 1]` (the prompt but its last token)."""

    rereads_kept = False

    def __init__(self, model: LVLM, prompts: list[torch.Tensor], *, per_request: int = 1,
                 step_log: StepLog | None = None, **unused: object) -> None:
        self.model, self.rows, self.per_request = model, len(prompts), per_request
        self.step_log = StepLog() if step_log is None else step_log
        self._prompts = [prompt[:, 0].tolist() for prompt in prompts]
        self._lookups: list[Lookup] = [model.new_lookup() for _ in prompts]
        self._states: list[Follow] = []
        self._block: list[list[int]] = [[] for _ in prompts]  # every token fed since the last settle
        self._skips = [0] * self.rows
        self._level: list[list[Follow]] = []  # the last tree level's node states, per row
        self.abstains: torch.Tensor | None = None  # [rows, keep] after a feed, [B, W, per] after a level

    def prefill(self, hidden: tuple[int, ...] = ()) -> torch.Tensor:
        if hidden:
            raise ValueError(f"{self.model.name}: a lookup has no hidden states to give")
        for lookup, prompt in zip(self._lookups, self._prompts):
            lookup.extend(prompt)
        self._prompts = []
        self._states = [self._fresh(r, ()) for r in range(self.rows)]
        self.step_log.modes.add("uncompiled")
        return self._distributions([[state.proposal] for state in self._states])

    def feed(self, token_ids: list[int] | torch.Tensor, keep: int = 1, valid: list[int] | None = None,
             hidden: tuple[int, ...] = (), features: torch.Tensor | None = None) -> torch.Tensor:
        ids = torch.as_tensor(token_ids)
        rows = (ids.view(1, -1).expand(self.rows, -1) if ids.dim() < 2 else ids).tolist()
        n = len(rows[0])
        if valid is not None:
            self._skips = [n - v for v in valid]
        proposals = []
        for r, tokens in enumerate(rows):
            real = tokens[self._skips[r]:] if valid is not None else tokens
            first = not self._block[r]  # a block's first feed: a fresh lookup after it
            self._block[r] += tokens
            mine = []
            for j, token in enumerate(real):
                state, wanted = self._states[r], j >= len(real) - keep
                if first:
                    suffix = state.suffix + (token,)
                    self._states[r] = self._fresh(r, suffix) if wanted else Follow(suffix, (), 0)
                else:
                    self._states[r] = self._follow(r, state, token)
                if wanted:
                    mine.append(self._states[r].proposal)
            proposals.append([None] * (keep - len(mine)) + mine)
        return self._distributions(proposals)

    def begin_tree(self) -> None:
        self._level = [[state] for state in self._states]

    def feed_level(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        tokens, parents = tokens.tolist(), parents.tolist()
        level = []
        for r in range(self.rows):
            b = r // self.per_request
            self._block[r] += tokens[b]
            level.append([self._follow(r, self._level[r][p], t) for t, p in zip(tokens[b], parents[b])])
        self._level = level
        logits = self._distributions([[state.proposal for state in row] for row in level])
        self.abstains = self.abstains.view(-1, self.per_request, len(tokens[0])).transpose(1, 2)
        return logits.view(-1, self.per_request, len(tokens[0]), logits.shape[-1]).transpose(1, 2)

    def settle(self, keep: list[int], order: torch.Tensor | None = None) -> None:
        order = None if order is None else order.tolist()
        for r, count in enumerate(keep):
            block, skip = self._block[r], self._skips[r]
            kept = block[skip : skip + count] if order is None else [block[i] for i in order[r][:count]]
            self._lookups[r].extend(kept)
            self._block[r] = []
        self._skips = [0] * self.rows
        self._states = [self._fresh(r, ()) for r in range(self.rows)]

    def observe_target(self, fed: torch.Tensor, top: torch.Tensor) -> None:
        """An observing lookup's rows learn the target's top tokens after each token it read."""
        fed, top = fed.tolist(), top.tolist()
        for r, lookup in enumerate(self._lookups):
            for token, best in zip(fed[r // self.per_request], top[r // self.per_request]):
                lookup.observe(token, best)
        self._states = [self._fresh(r, ()) for r in range(self.rows)]  # what it ranks next changed

    def copy_rows(self, groups: int, source: torch.Tensor, start: int) -> None:
        """Each group of a request's rows takes the block (and plan) of group `source[b]`."""
        per = self.per_request // groups
        for b, group in enumerate(source.tolist()):
            for g in range(groups):
                for i in range(per):
                    row, origin = b * self.per_request + g * per + i, b * self.per_request + group * per + i
                    self._block[row] = self._block[row][:start] + self._block[origin][start:]
                    self._states[row] = self._states[origin]

    def _fresh(self, row: int, suffix: tuple[int, ...]) -> Follow:
        """A new plan: the lookup's continuation after the settled context and `suffix`, cut
        before any image (a ranking lookup: its weights there)."""
        if self.model.ranks:
            return Follow(suffix, (), 0, self._lookups[row].counts(list(suffix)))
        return Follow(suffix, tuple(self._lookups[row].plan(list(suffix))), 0)

    def _follow(self, row: int, state: Follow, token: int) -> Follow:
        """`state` after `token`: on along the plan, or a fresh lookup where the token leaves it."""
        suffix = state.suffix + (token,)
        if not self.model.ranks and state.proposal == token:
            return Follow(suffix, state.plan, state.at + 1)
        return self._fresh(row, suffix)

    def _distributions(self, proposals: list[list[int | dict[int, int] | None]]) -> torch.Tensor:
        """fp32 logits `[rows, keep, V]`: 0 at each proposal and -inf elsewhere (a point mass),
        or log weight / total at each ranked token; all 0 (uniform) where a row abstains;
        `abstains` notes those."""
        abstains = torch.tensor([[p is None for p in row] for row in proposals])
        logits = torch.full((*abstains.shape, self.model.vocab_width), float("-inf"))
        for r, row in enumerate(proposals):
            for j, proposal in enumerate(row):
                if isinstance(proposal, dict):
                    total = sum(proposal.values())
                    weights = [math.log(c / total) for c in proposal.values()]
                    logits[r, j, list(proposal)] = torch.tensor(weights)
                elif proposal is not None:
                    logits[r, j, proposal] = 0.0
        logits[abstains] = 0.0
        self.abstains = abstains.to(self.model.device)
        return logits.to(self.model.device)
