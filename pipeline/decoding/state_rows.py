"""Rows of a state-space (Mamba, Mamba2) draft: the `Rows` verbs over a model whose cache is a
state per row, updated in place, that cannot be cropped (`pipeline.models.recurrent`; the model
says it is recurrent and reads and replaces its state tensors, the rows never look inside).

Rolling back is restoring: after every token the state is copied into a ring of saved states
(block position p at slot (p + 1) mod depth, the block's start at slot 0), and each row takes
back the state after its last kept token, bitwise the state a run that never went further would
hold. A block never rolls back past its own start, so a ring as deep as one block's feeding is
enough; a restore of a state the ring no longer holds is refused rather than guessed.
Continuation tokens go in one per forward: Mamba (v1)'s multi-token cached forward restarts its
scan from a zero state, and one-token steps also make trace replay's teacher-forced pass the
very computation live decoding runs. A recurrent model reads no 4-D mask, so:
- a request's leading fillers (right-aligned pending tokens) are fed like any token and the
  row's state is then put back to the block's start;
- a draft tree is read level by level by batch expansion: each node of a level is a copy of its
  parent's rows, fed the node's token (`feed_level`), and the level's states are kept until the
  block settles on the accepted node's. Its nodes count as block positions, as on KV rows.
The prefill takes the left-padded prompts with a 2-D padding mask, exact for a padded row.
"""
from __future__ import annotations

import torch

from pipeline.decoding.prompt_rows import left_padded
from pipeline.models.base import LVLM, ModelInputError, StepLog


class StateRows:
    """The `Rows` verbs over a recurrent model's state (`pipeline.decoding.rows.Rows`); `span`:
    the most tokens fed in one block before it settles (the ring's depth)."""

    rereads_kept = False

    def __init__(self, model: LVLM, prompts: list[torch.Tensor], *, span: int, per_request: int = 1,
                 step_log: StepLog | None = None) -> None:
        self.model = model
        self.step_log = StepLog() if step_log is None else step_log
        self.rows, self.per_request = len(prompts), per_request
        self._prompt_embeds, padding = left_padded(prompts)
        self._padding = None if bool(padding.all()) else padding.long().to(model.device)  # the 2-D 0/1 mask
        self.cache = model.new_cache()
        self.depth = span + 2
        self.fed = 0  # block positions fed since the block began
        self.skips = [0] * self.rows
        self.tree_start: int | None = None
        self._state: list[torch.Tensor] = []  # the live state of the rows, at fixed addresses
        self._ring: list[torch.Tensor] = []  # per state tensor: [depth, rows, ...]
        self._ring_at = [-2] * self.depth  # the block position each slot holds (-1: the block's start)
        self._levels: list[tuple[int, int, list[torch.Tensor]]] = []  # (first position, width, states)

    def prefill(self) -> torch.Tensor:
        """Run the padded prompts once; the state after them is the first block's start."""
        logits = self.model.logits(cache=self.cache, attention_mask=self._padding,
                                   inputs_embeds=self._prompt_embeds, keep=1)
        self._prompt_embeds = None
        self._state = self.model.state_tensors(self.cache)
        self._ring = [t.new_empty(self.depth, *t.shape) for t in self._state]
        self._save(-1)
        return logits

    def feed(self, token_ids: list[int] | torch.Tensor, keep: int = 1, valid: list[int] | None = None,
             hidden: tuple[int, ...] = (), features: torch.Tensor | None = None) -> torch.Tensor:
        """Append tokens to every row (`[n]`) or each row its own (`[rows, n]`), one forward per
        token; fp32 logits of the last `keep`: `[rows, keep, V]`."""
        if hidden:
            raise ModelInputError(
                f"{self.model.name}: a state-space draft has no target hidden states to give"
            )
        ids = torch.as_tensor(token_ids, device=self.model.device)
        ids = ids.view(1, -1).expand(self.rows, -1) if ids.dim() < 2 else ids
        n = ids.shape[1]
        if valid is not None:
            if self.fed:
                raise ValueError("fillers go at the start of a block only")
            self.skips = [n - v for v in valid]
        kept = []
        for i in range(n):
            logits = self.model.logits(cache=self.cache, attention_mask=None, input_ids=ids[:, i : i + 1],
                                       keep=1)
            fillers = [skip > self.fed for skip in self.skips]  # block positions before a row's first token
            if any(fillers):  # a filler leaves its row at the block's start
                self._restore_rows(torch.tensor(fillers, device=self.model.device), self._slot(-1))
            self.fed += 1
            self._save(self.fed - 1)
            if i >= n - keep:
                kept.append(logits)
        self.step_log.modes.add("uncompiled")
        return torch.cat(kept, 1)

    def begin_tree(self) -> None:
        self.tree_start = self.fed
        self._levels = [(self.fed - 1, 1, self._state)]  # the root: the rows after the last token fed

    def feed_level(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """Each node of the level: its parent's rows, copied, fed the node's token; the level's
        states are kept for `settle`."""
        _, above, states = self._levels[-1]
        requests, width = tokens.shape
        per = self.per_request
        request = torch.arange(requests, device=tokens.device)[:, None, None]
        method = torch.arange(per, device=tokens.device)
        index = ((request * above + parents[..., None]) * per + method).flatten()
        self.model.replace_states(self.cache, [state.index_select(0, index) for state in states])
        ids = tokens[..., None].expand(-1, -1, per).reshape(-1, 1)
        logits = self.model.logits(cache=self.cache, attention_mask=None, input_ids=ids, keep=1)
        self._levels.append((self.fed, width, self.model.state_tensors(self.cache)))
        self.fed += width
        self.step_log.modes.add("uncompiled")
        return logits.view(requests, width, per, -1)

    def settle(self, keep: list[int], order: torch.Tensor | None = None) -> None:
        """Each row takes the state after its last kept block position (the block's start when
        it keeps nothing): from the ring for a token fed in a row, from its level for a tree node."""
        check_keep(keep, self.skips, self.fed)
        if order is None and len({(k, s) for k, s in zip(keep, self.skips)}) == 1:
            slot = self._known_slot(keep[0] + self.skips[0] - 1 if keep[0] else -1)
            torch._foreach_copy_(self._state, [ring[slot] for ring in self._ring])
        else:
            self._settle_rows(keep, order)
        if len(self._levels) > 1:
            self.model.replace_states(self.cache, self._state)
        self.fed, self.skips, self.tree_start, self._levels = 0, [0] * self.rows, None, []
        self._save(-1)

    def copy_rows(self, groups: int, source: torch.Tensor, start: int) -> None:
        """Give every group of each request's rows its group `source[b]`'s state, now and in
        every state saved from block position `start` on."""
        sources = source.view(-1)
        slots = [slot for slot in range(self.depth) if self._ring_at[slot] >= start]
        saved = [ring[slot] for ring in self._ring for slot in slots]
        for state in [*self._state, *saved]:
            grouped = state.view(sources.shape[0], groups, -1, *state.shape[1:])
            index = sources.view(-1, *[1] * (grouped.dim() - 1)).expand(-1, 1, *grouped.shape[2:])
            grouped.copy_(grouped.gather(1, index).expand_as(grouped))

    def _settle_rows(self, keep: list[int], order: torch.Tensor | None) -> None:
        """Rows settling on different positions: each row's source found on the device."""
        device = self.model.device
        counts = torch.tensor(keep, device=device)
        if order is None:
            steps = torch.arange(max(1, self.fed), device=device)
            order = torch.tensor(self.skips, device=device)[:, None] + steps
        last = order.gather(1, (counts - 1).clamp_min(0)[:, None])[:, 0]
        last = torch.where(counts > 0, last, torch.full_like(last, -1))  # -1: the block's start
        # positions fed as tokens, not as tree nodes
        chained = self.fed if self.tree_start is None else self.tree_start
        if any(self._ring_at[self._slot(p)] != p for p in range(-1, chained)):
            raise ValueError(
                f"cannot roll back: the last {self.depth} saved states do not reach the block's start"
            )
        rows = torch.arange(self.rows, device=device)
        in_ring = (last + 1).remainder(self.depth) * self.rows + rows
        picked = [ring.flatten(0, 1).index_select(0, in_ring) for ring in self._ring]
        request, method = rows // self.per_request, rows % self.per_request
        for first, width, states in self._levels[1:]:
            node = (last - first).clamp(0, width - 1)
            here = (last >= first) & (last < first + width)
            at = (request * width + node) * self.per_request + method
            picked = [torch.where(rows_of(here, mine), state.index_select(0, at), mine)
                      for state, mine in zip(states, picked)]
        torch._foreach_copy_(self._state, picked)

    def _slot(self, position: int) -> int:
        return (position + 1) % self.depth

    def _known_slot(self, position: int) -> int:
        slot = self._slot(position)
        if self._ring_at[slot] != position:
            raise ValueError(f"cannot roll back to block position {position}: the last {self.depth} saved "
                             f"states reach back to {self.fed - self.depth} only")
        return slot

    def _save(self, position: int) -> None:
        slot = self._slot(position)
        torch._foreach_copy_([ring[slot] for ring in self._ring], self._state)
        self._ring_at[slot] = position

    def _restore_rows(self, rows: torch.Tensor, slot: int) -> None:
        """Rows where `rows` (`[rows]` bool) is set take the state saved at `slot`."""
        for state, ring in zip(self._state, self._ring):
            state.copy_(torch.where(rows_of(rows, state), ring[slot], state))


def check_keep(keep: list[int], skips: list[int], fed: int) -> None:
    """A row cannot keep more of the block than it was fed."""
    most = max(k + s for k, s in zip(keep, skips))
    if most > fed:
        raise ValueError(f"cannot keep {most} block positions: only {fed} were fed")


def rows_of(flags: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """Per-row `flags` (`[rows]`) shaped to broadcast over a state tensor's rows."""
    return flags.view(-1, *[1] * (state.dim() - 1))
