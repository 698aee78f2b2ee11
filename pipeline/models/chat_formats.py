"""The pipeline's LLaVA-style conversation text in the chat formats of the models that need one.

The pipeline writes every prompt in LLaVA-1.5's format (``USER: ... ASSISTANT: ...``, see
pipeline/data/prompts.py); LLaVA models read it as it is. Qwen-VL, InternVL3 and Gemma 3 were
tuned on their own chat templates: by default (`prompt_format: model`) their adapters render the
same turns as messages through the model's own template (`chat_messages`), as transformers'
`apply_chat_template` does for a user, images where the template puts them. `to_chatml` and
`to_gemma` render them by hand (`prompt_format: converted`: no default system turn, the
newline after LLaVA's image kept), as the embedded SmolLM2 target always is.
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


def chat_messages(prompt: str, started: bool = False) -> tuple[list[dict], str]:
    """The `conversation` as chat-template messages, and the answer the open turn begins with:
    a user turn's text is split at each ``<image>`` into `{"type": "image"}` and stripped text
    parts, as a user writes messages for `apply_chat_template`; other turns are plain strings."""
    messages = conversation(prompt, started)
    rendered = []
    for role, text in messages[:-1]:
        if role != "user":
            rendered.append({"role": role, "content": text})
            continue
        content = []
        for k, part in enumerate(text.split("<image>")):
            if k:
                content.append({"type": "image"})
            if part.strip():
                content.append({"type": "text", "text": part.strip()})
        rendered.append({"role": role, "content": content})
    return rendered, messages[-1][1]
