"""Parts of the embedded CPU LVLM: SmolLM2 language model, EfficientNet-Lite0 vision encoder,
MLP projector, easy-vqa labels and the colour/shape captioner."""
