"""Bad input fails early with an error that names the problem."""
from __future__ import annotations

import pytest

from pipeline.data.sample import Sample
from pipeline.decoding.config import DecodeConfig
from pipeline.drafting.policies import GridSearchPolicy, InverseErrorPolicy, make_policy
from pipeline.decoding.loop import speculative_decode
from pipeline.models.base import ModelInputError
from pipeline.models.loading import ModelLoadError, load_model, load_pair
from pipeline.models.tiny import build_llava, build_tokenizer, llava_processor
from tests.conftest import solid

IMAGE_PROMPT = "USER: <image>\nWhat is this? ASSISTANT:"


@pytest.mark.parametrize(
    "config,message",
    [
        (DecodeConfig(methods="MX"), "unknown drafting method letter"),
        (DecodeConfig(methods=""), "at least one drafting method"),
        (DecodeConfig(methods="MM"), "repeated"),
        (DecodeConfig(gamma=0), "gamma"),
        (DecodeConfig(temperature=-1), "temperature"),
        (DecodeConfig(policy=GridSearchPolicy(measure="best")), "unknown grid measure"),
        (DecodeConfig(policy=GridSearchPolicy(distance="js")), "unknown distance"),
        (DecodeConfig(policy=InverseErrorPolicy(window=0)), "window"),
        (DecodeConfig(policy=InverseErrorPolicy(temperature=float("nan"))), "finite number > 0"),
    ],
)
def test_invalid_config_is_rejected_before_decoding(tiny_pair, config, message):
    target, draft = tiny_pair
    with pytest.raises(ValueError, match=message):
        speculative_decode(target, draft, [Sample("u", "t", 0, "first", IMAGE_PROMPT, (solid((1, 2, 3)),))], config)[0]


@pytest.mark.parametrize(
    "kind,fields,message",
    [("oracle", {}, "unknown weight policy 'oracle'"), ("static", {"temperature": 2}, "not a field of weight policy 'static'")],
)
def test_unknown_policy_or_field_is_named(kind, fields, message):
    with pytest.raises(ValueError, match=message):
        make_policy(kind, **fields)


def test_image_count_must_match_placeholders(tiny_pair):
    target, draft = tiny_pair
    sample = Sample("u", "t", 0, "first", "USER: <image> <image> Compare. ASSISTANT:", (solid((1, 2, 3)),))
    with pytest.raises(ValueError, match=r"2 <image> placeholder\(s\) but 1 image"):
        speculative_decode(target, draft, [sample], DecodeConfig())[0]


def test_sample_with_load_error_is_refused_with_its_message(tiny_pair):
    target, draft = tiny_pair
    sample = Sample("u", "t", 0, "first", IMAGE_PROMPT, (), error="image 0 is unreadable: truncated file")
    with pytest.raises(ModelInputError, match="unreadable"):
        speculative_decode(target, draft, [sample], DecodeConfig())[0]


def test_prompt_ending_in_an_image_is_refused(tiny_pair):
    target, draft = tiny_pair
    sample = Sample("u", "t", 0, "first", "USER: <image>", (solid((1, 2, 3)),))
    with pytest.raises(ModelInputError, match="must end with text"):
        speculative_decode(target, draft, [sample], DecodeConfig())[0]


def test_caption_method_without_captioner(tiny_pair):
    target, draft = tiny_pair
    with pytest.raises(ModelInputError, match="captioner"):
        speculative_decode(target, draft, [Sample("u", "t", 0, "first", IMAGE_PROMPT, (solid((1, 2, 3)),))], DecodeConfig(methods="MC"))[0]


def test_draft_with_another_tokenizer_is_refused(tiny_dirs, tmp_path):
    other = build_tokenizer(vocab_size=320)
    build_llava(other).save_pretrained(tmp_path / "other")
    llava_processor(other).save_pretrained(tmp_path / "other")
    with pytest.raises(ValueError, match="different tokenizer"):
        load_pair(tiny_dirs["target"], str(tmp_path / "other"))


def test_missing_model_and_bad_dtype(tmp_path):
    with pytest.raises(ModelLoadError, match="cannot load model"):
        load_model(str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="unknown dtype"):
        load_model(str(tmp_path), dtype="fp8")
