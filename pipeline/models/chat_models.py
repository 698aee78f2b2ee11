"""The base of the adapters for families with a chat format of their own (Qwen-VL and InternVL3
in ChatML, Gemma 3 in its turns): the pipeline's `USER: ... ASSISTANT:` prompts rendered through
the model's own chat template (`prompt_format: model`, the default) or by hand in the family's
turns (`converted`), each image as the family's markers around ONE placeholder that the image's
rows replace."""
from __future__ import annotations

from typing import Callable, ClassVar

from transformers import PreTrainedModel

from pipeline.models.base import ModelInputError
from pipeline.models.chat_formats import chat_messages, to_chatml
from pipeline.models.hf import HFModel


class HFChatModel(HFModel):
    """A multimodal checkpoint through its own transformers class, prompted in its chat format;
    an answer begun after `ASSISTANT:` opens the assistant turn."""

    render: ClassVar[Callable[[str, bool], str]] = staticmethod(to_chatml)  # the family's turns, by hand
    template_image: ClassVar[str] = ""  # what the family's chat template writes for an image
    image_in_chat: ClassVar[str] = ""  # what an image becomes: the family's markers and placeholder

    def __init__(self, model: PreTrainedModel, processor, name: str) -> None:
        super().__init__(model, processor.tokenizer, name)
        self.processor = processor
        self.family = model.config.model_type
        self.image_token_id = model.config.image_token_id

    @property
    def chat_template(self) -> str | None:
        """The model's own chat template: its processor's, else its tokenizer's."""
        return getattr(self.processor, "chat_template", None) or self.tokenizer.chat_template

    def chat_text(self, prompt: str) -> str:
        """The prompt as the text the family's processor would read (one placeholder per image)."""
        try:
            if self.prompt_format == "converted":
                return self.render(prompt, True).replace("<image>", self.image_in_chat)
            messages, answer = chat_messages(prompt, True)
        except ValueError as err:
            raise ModelInputError(f"{self.name}: {err}") from None
        if not self.chat_template:
            raise ModelInputError(f"{self.name} has no chat template to render its prompts with; name "
                                  "`prompt_format: converted` in the grid to use the pipeline's own turns")
        text = self.tokenizer.apply_chat_template(messages, chat_template=self.chat_template, tokenize=False,
                                                  add_generation_prompt=True)
        return text.replace(self.template_image, self.image_in_chat) + answer

    def tokenize_prompt(self, text: str) -> list[int]:
        return self.tokenizer(self.chat_text(text), add_special_tokens=False)["input_ids"]
