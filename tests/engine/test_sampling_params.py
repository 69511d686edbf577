"""SamplingParams validation: every out-of-range value names its field in InvalidRequestError.param."""
from __future__ import annotations

import dataclasses
import math
import pickle

import pytest

from raypd import engine
from raypd.protocol.errors import InvalidRequestError
from raypd.protocol.messages import NodeRequest
from raypd.protocol.sampling_params import SamplingParams


@pytest.mark.parametrize("param, value", [
    ("max_tokens", 0),
    ("max_tokens", -1),
    ("max_tokens", 1.0),
    ("max_tokens", True),
    ("max_tokens", "8"),
    ("max_tokens", None),
    ("temperature", -0.01),
    ("temperature", -1),
    ("temperature", 100.5),
    ("temperature", math.nan),
    ("temperature", "0.5"),
    ("temperature", True),
    ("top_p", 0.0),
    ("top_p", 0),
    ("top_p", -0.5),
    ("top_p", 1.01),
    ("top_p", math.nan),
    ("top_k", -2),
    ("top_k", 2.0),
    ("top_k", None),
    ("min_p", -0.01),
    ("min_p", 1.01),
    ("presence_penalty", -2.01),
    ("presence_penalty", 2.01),
    ("frequency_penalty", -2.01),
    ("frequency_penalty", 2.01),
    ("repetition_penalty", 0.0),
    ("repetition_penalty", -1.0),
    ("repetition_penalty", 10.01),
    ("seed", 1.5),
    ("seed", "7"),
    ("seed", True),
    ("stop_token_ids", (-1,)),
    ("stop_token_ids", (3, "4")),
    ("stop_token_ids", (2.0,)),
    ("num_replayed_tokens", -1),
    ("num_replayed_tokens", 1.0),
    ("num_replayed_tokens", True),
    ("num_replayed_tokens", "3"),
    ("num_replayed_tokens", None),
])
def test_out_of_range_value_names_its_param(param, value):
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**{param: value})
    assert info.value.param == param
    assert param in str(info.value)


@pytest.mark.parametrize("param, value", [
    ("max_tokens", 1),
    ("max_tokens", 100_000),
    ("temperature", 0),
    ("temperature", 0.0),
    ("temperature", 0.7),
    ("temperature", 100.0),
    ("top_p", 1e-6),
    ("top_p", 1),
    ("top_p", 1.0),
    ("top_k", -1),
    ("top_k", 0),
    ("top_k", 1),
    ("top_k", 50),
    ("min_p", 0.0),
    ("min_p", 1.0),
    ("presence_penalty", -2.0),
    ("presence_penalty", 2.0),
    ("frequency_penalty", -2.0),
    ("frequency_penalty", 2.0),
    ("repetition_penalty", 1e-3),
    ("repetition_penalty", 10.0),
    ("seed", None),
    ("seed", 0),
    ("seed", -5),
    ("seed", 2**63),
    ("stop_token_ids", ()),
    ("stop_token_ids", (0, 2, 7)),
    ("num_replayed_tokens", 0),
    ("num_replayed_tokens", 1),
    ("num_replayed_tokens", 4096),
])
def test_in_range_value_is_accepted(param, value):
    params = SamplingParams(**{param: value})
    assert getattr(params, param) == value or param == "stop_token_ids"


def test_defaults_are_valid():
    params = SamplingParams()
    assert params.max_tokens == 16
    assert params.temperature == 1.0
    assert params.top_k == -1 and params.top_p == 1.0 and params.min_p == 0.0
    assert params.seed is None
    assert params.stop_token_ids == ()
    assert not params.ignore_eos
    assert params.num_replayed_tokens == 0
    assert not params.greedy
    assert not params.has_penalties


def test_invalid_request_error_is_a_value_error_and_the_engines_own():
    with pytest.raises(ValueError):
        SamplingParams(max_tokens=0)
    with pytest.raises(engine.InvalidRequestError) as e:  # one type, whichever layer checks
        SamplingParams(top_p=0)
    assert e.value.param == "top_p" and engine.InvalidRequestError is InvalidRequestError


def test_stop_token_ids_are_stored_as_a_tuple():
    params = SamplingParams(stop_token_ids=[5, 3])
    assert params.stop_token_ids == (5, 3)
    assert isinstance(params.stop_token_ids, tuple)
    hash(params)  # frozen and hashable even when given a list


def test_params_survive_pickling():
    # Ray pickles SamplingParams inside NodeRequest on its way from the ingress to the nodes.
    params = SamplingParams(max_tokens=9, temperature=0.5, seed=-3, stop_token_ids=[4], num_replayed_tokens=7)
    request = NodeRequest("r", 1, (1, 2, 3, 4, 5, 6, 7, 8), params)
    assert pickle.loads(pickle.dumps(request)) == request
    assert pickle.loads(pickle.dumps(params)).num_replayed_tokens == 7


def test_params_are_frozen():
    params = SamplingParams()
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.temperature = 0.0  # type: ignore[misc]


@pytest.mark.parametrize("kwargs, greedy", [
    ({"temperature": 0.0}, True),
    ({"temperature": 0}, True),
    ({"temperature": 0.0, "top_k": 5, "top_p": 0.5}, True),
    ({"temperature": 1.0, "top_k": 1}, True),
    ({"temperature": 0.8, "top_k": 1, "top_p": 0.3}, True),
    ({"temperature": 1e-5}, False),
    ({"temperature": 1.0}, False),
    ({"temperature": 1.0, "top_k": 2}, False),
    ({"temperature": 1.0, "top_k": 0}, False),
    ({"temperature": 1.0, "top_p": 1e-3}, False),
])
def test_greedy(kwargs, greedy):
    assert SamplingParams(**kwargs).greedy is greedy


@pytest.mark.parametrize("kwargs, has", [
    ({}, False),
    ({"presence_penalty": 0.5}, True),
    ({"frequency_penalty": -0.1}, True),
    ({"repetition_penalty": 1.1}, True),
    ({"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}, False),
])
def test_has_penalties(kwargs, has):
    assert SamplingParams(**kwargs).has_penalties is has


@pytest.mark.parametrize("param, value", [("top_k", True), ("stop_token_ids", (True,))])
def test_bool_is_not_an_integer_for_int_fields(param, value):
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**{param: value})
    assert info.value.param == param
