"""Prompt text in LLaVA-1.5's conversation format (paper Appendix I).

Every function returns text WITHOUT the BOS token (the tokenizer adds it) and with one
`<image>` placeholder per image, in the order the images are passed. The strings are what
the llava-hf chat template renders, which is how the authors' reference implementation built
them: ``USER: <image>\\n{text} ASSISTANT:`` for one image whose question comes after it, and
``USER: {text} ASSISTANT:`` when the text carries its own placeholders (multi-image rows).

A later turn is the whole earlier conversation, the target's answer, then the new user turn:
``{previous prompt} {answer} USER: {new text} ASSISTANT:``. The separator after the answer is
one space and no ``</s>``: that is what the reference produced (it decoded the first turn,
stripped ``<s>``/``</s>`` and joined with a space), and it is tokenizer-neutral, whereas LLaVA
training's ``</s>`` is the EOS of Llama tokenizers only (SmolLM2's is ``<|im_end|>``).
"""
from __future__ import annotations

from pipeline.data.sample import IMAGE_PLACEHOLDER

# Paper Appendix I: prepended to DocVQA, POPE and MM-Vet questions (newline-joined
# as in the reference; the paper's text extraction shows the newlines as spaces).
REASONING_INSTRUCTION = (
    "For the following question, provide a detailed explanation of your reasoning leading to the answer."
)


class PromptError(ValueError):
    """A row or answer that cannot become a prompt; the loader records it on the Sample."""


def user_turn(text: str) -> str:
    """One user message followed by the assistant cue."""
    return f"USER: {text} ASSISTANT:"


def image_question(question: str, instruction: str | None = None) -> str:
    """A single-image prompt: the image first, then the (optionally instructed) question."""
    text = f"{instruction}\n{question}" if instruction else question
    return user_turn(f"{IMAGE_PLACEHOLDER}\n{text}")


def clean_answer(answer: str) -> str:
    """The target's answer as it goes back into the conversation.

    Strips whitespace and literal BOS/EOS markers like the reference did; an answer that
    contains an image placeholder would silently shift every image after it, so it is refused.
    """
    text = answer.replace("<s>", "").replace("</s>", "").strip()
    if IMAGE_PLACEHOLDER in text:
        raise PromptError(f"the first-turn answer contains {IMAGE_PLACEHOLDER!r}; it cannot be replayed")
    return text


def continue_conversation(previous_prompt: str, answer: str, next_turn: str) -> str:
    """`previous_prompt` + the target's answer + `next_turn` (a full ``USER: ... ASSISTANT:``)."""
    answer = clean_answer(answer)
    parts = [previous_prompt, answer, next_turn] if answer else [previous_prompt, next_turn]
    return " ".join(parts)
