"""TABED: batched ensemble speculative decoding for vision-language models."""
