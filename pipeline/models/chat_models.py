"""The base of the adapters for families with a chat format of their own (Qwen-VL and InternVL3
in ChatML, Gemma 3 in its turns): the pipeline's `USER: ... ASSISTANT:` prompts rendered in the
family's turns, each image as the family's markers around ONE placeholder that the image's rows
replace."""
from __future__ import annotations

from typing import Callable, ClassVar

from transformers import PreTrainedModel

from pipeline.models.base import ModelInputError
from pipeline.models.chat_formats import to_chatml
from pipeline.models.hf import HFModel


class HFChatModel(HFModel):
    """A multimodal checkpoint through its own transformers class, prompted in its chat format
    (no default system message); an answer begun after `ASSISTANT:` opens the assistant turn."""

    render: ClassVar[Callable[[str, bool], str]] = staticmethod(to_chatml)  # the family's turns
    image_in_chat: ClassVar[str] = ""  # what an `<image>` becomes: the family's markers and placeholder

    def __init__(self, model: PreTrainedModel, processor, name: str) -> None:
        super().__init__(model, processor.tokenizer, name)
        self.processor = processor
        self.family = model.config.model_type
        self.image_token_id = model.config.image_token_id

    def chat_text(self, prompt: str) -> str:
        """The prompt as the text the family's processor would read (one placeholder per image)."""
        try:
            chat = self.render(prompt, True)
        except ValueError as err:
            raise ModelInputError(f"{self.name}: {err}") from None
        return chat.replace("<image>", self.image_in_chat)

    def tokenize_prompt(self, text: str) -> list[int]:
        return self.tokenizer(self.chat_text(text), add_special_tokens=False)["input_ids"]
