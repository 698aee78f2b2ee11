"""Prompt rows of a state-space (Mamba, Mamba2) draft as ONE batch: the `Rows` of a model whose
cache is a state per row, updated in place, that cannot be cropped (`pipeline.models.recurrent`).

Rolling back is restoring: after every forward the state is copied into a ring of `slots`
saved states (slot `fed % slots`), and `keep_shared(n)` copies slot n back, bitwise the state a
run that never went past n would hold. A block never rolls back further than the tokens it fed,
so a ring as deep as one block's feeding (`span` + 2) is enough; a deeper restore is refused
rather than guessed. Continuation tokens go in one per forward: Mamba (v1)'s multi-token cached
forward restarts its scan from a zero state, and one-token steps also make trace replay's
teacher-forced pass the very computation live decoding runs. The prefill takes the left-padded
prompts with a 2-D padding mask, exact for a padded row; a recurrent model reads no 4-D mask, so
a token tree cannot be fed to it in one forward (`feed_tree` refuses).
"""
from __future__ import annotations

import torch

from pipeline.decoding.rows import left_padded
from pipeline.models.base import LVLM, StepLog


class StateRows:
    """The `Rows` verbs over a recurrent model's state (`pipeline.decoding.rows.Rows`)."""

    def __init__(self, model: LVLM, prompts: list[torch.Tensor], *, span: int,
                 step_log: StepLog | None = None) -> None:
        self.model = model
        self.step_log = StepLog() if step_log is None else step_log
        self.rows = len(prompts)
        self._prompt_embeds, padding = left_padded(prompts)
        self.width = padding.shape[1]
        self._padding = None if bool(padding.all()) else padding.long().to(model.device)  # the 2-D 0/1 mask
        self.cache = model.new_cache()
        self.slots = span + 2
        self.fed = 0
        self.tree_start = 0
        self._state: list[torch.Tensor] = []
        self._ring: list[list[torch.Tensor]] = []
        self._ring_fed = [-1] * self.slots

    def prefill(self) -> None:
        """Run the padded prompts once; the state after them is saved as continuation slot 0."""
        self.model.logits(cache=self.cache, attention_mask=self._padding, inputs_embeds=self._prompt_embeds,
                          keep=1)
        self._prompt_embeds = None
        self._state = self.model.state_tensors(self.cache)
        self._ring = [[torch.empty_like(t) for t in self._state] for _ in range(self.slots)]
        self._save()

    def feed(self, token_ids: list[int] | torch.Tensor, keep: int = 1) -> torch.Tensor:
        """Append tokens to every row (`[n]`: the same in each; `[rows, n]`: each row its own),
        one forward per token; fp32 logits of the last `keep`: `[B, keep, V]`."""
        ids = torch.as_tensor(token_ids, device=self.model.device)
        ids = ids.view(1, -1).expand(self.rows, -1) if ids.dim() < 2 else ids
        n = ids.shape[1]
        kept = []
        for i in range(n):
            step = ids[:, i : i + 1]
            logits = self.model.logits(cache=self.cache, attention_mask=None, input_ids=step, keep=1)
            self.fed += 1
            self._save()
            if i >= n - keep:
                kept.append(logits)
        self.step_log.modes.add("uncompiled")
        return torch.cat(kept, 1)

    def keep_shared(self, n: int) -> None:
        """Go back to the state after the first `n` continuation tokens (rejected proposals
        dropped): the ring's saved state, copied in place."""
        if n > self.fed:
            raise ValueError(f"cannot keep {n} continuation tokens: only {self.fed} were fed")
        if n == self.fed:
            return
        slot = n % self.slots
        if self._ring_fed[slot] != n:
            raise ValueError(f"cannot roll back to {n} continuation tokens: the last {self.slots} saved "
                             f"states reach back to {self.fed - self.slots + 1} only")
        torch._foreach_copy_(self._state, self._ring[slot])
        self.fed = n

    def copy_rows(self, groups: int, source: torch.Tensor, start: int) -> None:
        """Give every one of `groups` equal groups of rows group `source`'s state (0-d device
        tensor), now and in every state saved after continuation slot `start`: after a
        candidate tree, every branch's rows continue the accepted branch."""
        saved = [self._ring[slot] for slot in range(self.slots) if self._ring_fed[slot] > start]
        for states in [self._state, *saved]:
            for state in states:
                grouped = state.view(groups, self.rows // groups, *state.shape[1:])
                grouped.copy_(grouped.index_select(0, source.view(1)).expand_as(grouped))

    def snapshot(self) -> list[torch.Tensor]:
        """A copy of the live state (every row)."""
        return [state.clone() for state in self._state]

    def select_rows(self, index: torch.Tensor) -> None:
        """Make the live state rows `index` of the current one (any count; rows repeat): a
        level of a shape tree drafted as a batch, one group of method rows per node. Saved
        states are dropped: `restore` ends such a stretch."""
        self.restore([state.index_select(0, index) for state in self._state], self.fed)

    def restore(self, states: list[torch.Tensor], fed: int) -> None:
        """Make `states` (a `snapshot`, or rows of one) the live state after `fed` continuation
        tokens, and the only one saved."""
        self.model.replace_states(self.cache, states)
        self._state = self.model.state_tensors(self.cache)
        self.rows, self.fed = self._state[0].shape[0], fed
        self._ring = [[torch.empty_like(t) for t in self._state] for _ in range(self.slots)]
        self._ring_fed = [-1] * self.slots
        self._save()

    def begin_tree(self) -> None:
        raise NotImplementedError(f"{self.model.name}: a state-space draft cannot read a token tree in one "
                                  "forward (it takes no tree mask); use chain, candidates, shape or bandit "
                                  "trees")

    def feed_tree(self, token_ids: torch.Tensor, offsets: torch.Tensor, sees: torch.Tensor,
                  keep: int) -> torch.Tensor:
        self.begin_tree()

    def keep_path(self, slots: torch.Tensor, first: int) -> None:
        self.begin_tree()

    def _save(self) -> None:
        slot = self.fed % self.slots
        torch._foreach_copy_(self._ring[slot], self._state)
        self._ring_fed[slot] = self.fed
