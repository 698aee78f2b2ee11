"""The base of the adapters for families that chat in ChatML (Qwen2.5-VL, InternVL3): the
pipeline's `USER: ... ASSISTANT:` prompts rendered in the family's own turns, each image as the
family's markers around ONE placeholder that the image's rows replace."""
from __future__ import annotations

from typing import ClassVar

from transformers import PreTrainedModel

from pipeline.models.base import ModelInputError
from pipeline.models.embedded_parts.chat import to_chatml
from pipeline.models.hf import HFModel


class HFChatModel(HFModel):
    """A multimodal checkpoint through its own transformers class, prompted in ChatML (no
    default system message); an answer begun after `ASSISTANT:` opens the assistant turn."""

    image_in_chat: ClassVar[str] = ""  # what an `<image>` becomes: the family's markers and placeholder

    def __init__(self, model: PreTrainedModel, processor, name: str) -> None:
        super().__init__(model, processor.tokenizer, name)
        self.processor = processor
        self.family = model.config.model_type
        self.image_token_id = model.config.image_token_id

    def chat_text(self, prompt: str) -> str:
        """The prompt as the text the family's processor would read (one placeholder per image)."""
        try:
            chat = to_chatml(prompt, started=True)
        except ValueError as err:
            raise ModelInputError(f"{self.name}: {err}") from None
        return chat.replace("<image>", self.image_in_chat)

    def tokenize_prompt(self, text: str) -> list[int]:
        return self.tokenizer(self.chat_text(text), add_special_tokens=False)["input_ids"]
