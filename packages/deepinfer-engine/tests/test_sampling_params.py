import math

import pytest

from deepinfer_engine import InvalidRequestError, SamplingParams


@pytest.mark.parametrize(
    "kwargs, field, limit",
    [
        ({"max_tokens": 0}, "max_tokens", ">= 1"),
        ({"max_tokens": -3}, "max_tokens", ">= 1"),
        ({"temperature": -0.1}, "temperature", ">= 0"),
        ({"temperature": math.nan}, "temperature", ">= 0"),
        ({"top_p": 0.0}, "top_p", "(0, 1]"),
        ({"top_p": 1.5}, "top_p", "(0, 1]"),
        ({"top_k": 0}, "top_k", ">= 1"),
        ({"top_k": -2}, "top_k", ">= 1"),
        ({"seed": -1}, "seed", "2**64"),
        ({"logprobs": 99}, "logprobs", "20"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens", "max_tokens=2"),
        ({"stop_token_ids": [-4]}, "stop_token_ids", ">= 0"),
    ],
)
def test_invalid_field_names_field_and_limit(kwargs, field, limit):
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**kwargs)
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}:") and limit in str(err.value)


def test_stop_ids_checked_against_vocab():
    p = SamplingParams(stop_token_ids=[5, 9000])
    with pytest.raises(InvalidRequestError, match=r"stop_token_ids: token id 9000 .*\[0, 8192\)"):
        p.validate(vocab_size=8192)
    p.validate(vocab_size=10000)


def test_defaults_are_valid_and_greedy_flag():
    assert not SamplingParams().is_greedy
    assert SamplingParams(temperature=0).is_greedy
