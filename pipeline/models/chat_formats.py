"""The pipeline's LLaVA-style conversation text in the chat formats of the models that need one.

The pipeline writes every prompt in LLaVA-1.5's format (``USER: ... ASSISTANT: ...``, see
pipeline/data/prompts.py); LLaVA models read it as it is. SmolLM2-Instruct (the embedded model),
Qwen-VL and InternVL were tuned on ChatML, Gemma 3 on its own turns, and each answers well only
there, so their adapters render the same turns in their format (without a chat template's
default system prompt, which would add tokens to every row).
"""
from __future__ import annotations

import re

_ROLE = re.compile(r"(USER:|ASSISTANT:)")
_ROLES = {"USER:": "user", "ASSISTANT:": "assistant"}


def conversation(prompt: str, started: bool = False) -> list[tuple[str, str]]:
    """``USER: a ASSISTANT: b USER: c ASSISTANT:`` -> ``[("user", "a"), ("assistant", "b"),
    ("user", "c"), ("assistant", "")]``, the last turn the open one where the model answers.

    Text before the first ``USER:`` is kept as a ``system`` turn first; a prompt with no roles at
    all is one user message. A prompt must end with the assistant cue (that is where the model
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
    return messages + [(_ROLES[role], text.strip()) for role, text in turns]


def to_chatml(prompt: str, started: bool = False) -> str:
    """The `conversation` in ChatML, ending in the open assistant turn."""
    messages = conversation(prompt, started)
    body = "".join(f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in messages[:-1])
    return body + "<|im_start|>assistant\n" + messages[-1][1]


def to_gemma(prompt: str, started: bool = False) -> str:
    """The `conversation` in Gemma's turns (BOS first; a system turn is prepended to the first
    user turn, as Gemma's chat template does; the assistant is `model`), ending in the open one."""
    messages = conversation(prompt, started)
    if messages[0][0] == "system" and len(messages) > 1:
        messages = [("user", f"{messages[0][1]}\n\n{messages[1][1]}")] + messages[2:]
    roles = {"user": "user", "assistant": "model", "system": "user"}
    body = "".join(f"<start_of_turn>{roles[role]}\n{text}<end_of_turn>\n" for role, text in messages[:-1])
    return "<bos>" + body + "<start_of_turn>model\n" + messages[-1][1]
