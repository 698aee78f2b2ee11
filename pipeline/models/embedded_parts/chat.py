"""LLaVA-style conversation text -> SmolLM2's ChatML.

The pipeline writes every prompt in LLaVA-1.5's format (``USER: ... ASSISTANT: ...``, see
pipeline/data/prompts.py). SmolLM2-Instruct was tuned on ChatML and only writes long,
well-ended answers there, so the embedded model renders the same turns in ChatML (without the
chat template's default system prompt, which would add 20+ tokens to every row).
"""
from __future__ import annotations

import re

_ROLE = re.compile(r"(USER:|ASSISTANT:)")
_ROLES = {"USER:": "user", "ASSISTANT:": "assistant"}


def to_chatml(prompt: str, started: bool = False) -> str:
    """``USER: a ASSISTANT: b USER: c ASSISTANT:`` -> ChatML ending in an open assistant turn.

    Text before the first ``USER:`` is kept as a system message; a prompt with no roles at all
    is one user message. A prompt must end with the assistant cue (that is where the model
    writes), else ValueError; with `started`, the last assistant turn may hold the start of the
    answer (``ASSISTANT: It``), which the open turn then begins with.
    """
    parts = _ROLE.split(prompt)
    preamble, turns = parts[0].strip(), list(zip(parts[1::2], parts[2::2]))
    if not turns:
        turns = [("USER:", preamble), ("ASSISTANT:", "")]
        preamble = ""
    if turns[-1][0] != "ASSISTANT:" or (turns[-1][1].strip() and not started):
        raise ValueError(f"prompt must end with 'ASSISTANT:' (where the model answers): {prompt[-80:]!r}")
    messages = [("system", preamble)] if preamble else []
    messages += [(_ROLES[role], text.strip()) for role, text in turns]
    body = "".join(f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in messages[:-1])
    return body + "<|im_start|>assistant\n" + messages[-1][1]
