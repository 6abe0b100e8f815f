"""Gateway policy logic without any server: limits, buckets, rules, windows, keys, config."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from rayfleet.config import parse_fleet
from rayfleet.errors import ConfigError
from rayfleet.gateway.auth import KeyTable, hash_key
from rayfleet.gateway.errors import RequestError
from rayfleet.gateway.limits import KeyQuota, Limits, TokenBucket, check_context, check_request
from rayfleet.gateway.policies import Policies
from rayfleet.gateway.rules import DailyWindow, Route
from rayfleet.gateway.tokens import TokenCounter, context_length, prompt_of
from rayfleet.gateway.validate import parse_request

KEY = "sk-test-alpha"


def fleet(gateway: dict, **extra_model) -> dict:
    return {
        "gateway": gateway,
        "models": [
            {
                "name": "small",
                "source": "/models/small",
                "engine_args": {"max_model_len": 1024},
                **extra_model,
            },
            {"name": "large", "source": "/models/large"},
        ],
    }


# -- limits ------------------------------------------------------------------------------


def test_max_tokens_rejected_with_the_cap():
    limits = Limits(max_tokens=100)
    with pytest.raises(RequestError) as err:
        check_request(limits, {"max_tokens": 101}, 1, "small")
    assert err.value.status == 400 and "limit for 'small' is 100" in err.value.message
    assert err.value.param == "max_tokens"
    assert check_request(limits, {"max_tokens": 100}, 1, "small") is False


def test_max_tokens_clamped_when_configured():
    body = {"max_completion_tokens": 500}
    assert check_request(Limits(max_tokens=64, max_tokens_action="clamp"), body, 1, "m") is True
    assert body == {"max_completion_tokens": 64}


def test_n_and_messages_caps():
    with pytest.raises(RequestError, match="n is 4; the limit for 'm' is 2"):
        check_request(Limits(max_n=2), {"n": 4}, 1, "m")
    with pytest.raises(RequestError, match="has 5 messages; the limit for 'm' is 4"):
        check_request(Limits(max_messages=4), {}, 5, "m")


def test_context_check_states_both_numbers():
    with pytest.raises(RequestError) as err:
        check_context("m", 1024, 1000, 100)
    assert "maximum context length is 1024" in err.value.message
    assert "1000 prompt tokens plus max_tokens 100 = 1100" in err.value.message
    check_context("m", 1024, 900, 124)


def test_model_limits_override_field_by_field():
    config = parse_fleet(
        fleet(
            {
                "limits": {"max_tokens": 256, "max_n": 2},
                "model_limits": {"small": {"max_tokens": 32}},
            }
        )
    )
    policies = Policies.from_fleet(config)
    assert policies.limits["small"] == Limits(max_tokens=32, max_n=2)
    assert policies.limits["large"] == Limits(max_tokens=256, max_n=2)


# -- token buckets and quotas ------------------------------------------------------------


def test_token_bucket_refills_at_its_rate():
    bucket = TokenBucket(60, period_s=60.0, now=0.0)  # one per second
    assert all(bucket.take(1, now=0.0) == 0.0 for _ in range(60))
    assert bucket.take(1, now=0.0) == pytest.approx(1.0)
    assert bucket.take(1, now=0.5) == pytest.approx(0.5)
    assert bucket.take(1, now=1.0) == 0.0
    assert bucket.wait_s(61, now=1.0) == math.inf


def test_key_quota_rate_tokens_and_concurrency():
    quota = KeyQuota("a", requests_per_minute=2, tokens_per_minute=100, max_concurrent=2)
    quota.admit(40, now=0.0)
    quota.admit(40, now=0.0)
    with pytest.raises(RequestError) as err:
        quota.admit(1, now=0.0)
    assert err.value.status == 429 and "concurrency" in err.value.reason
    quota.release()
    with pytest.raises(RequestError) as err:
        quota.admit(1, now=0.0)
    assert err.value.headers["Retry-After"] == "30" and "2 requests per minute" in err.value.message
    with pytest.raises(RequestError) as err:
        quota.admit(80, now=30.0)  # a request is back, but only 20 + 50 tokens
    assert "tokens per minute" in err.value.message
    assert int(err.value.headers["Retry-After"]) >= 1
    with pytest.raises(RequestError, match="more than API key 'a' may use per minute"):
        quota.admit(101, now=60.0)


def test_key_quota_refuses_early_what_needs_no_body_and_takes_nothing():
    quota = KeyQuota("a", requests_per_minute=2, tokens_per_minute=100, max_concurrent=1)
    quota.refuse_early(now=0.0)  # room: nothing raised, nothing taken
    quota.admit(10, now=0.0)
    with pytest.raises(RequestError) as err:
        quota.refuse_early(now=0.0)
    assert err.value.reason == "rate_limited_concurrency"
    quota.release()
    quota.admit(10, now=0.0)
    quota.release()
    with pytest.raises(RequestError) as err:  # both requests of the minute are spent
        quota.refuse_early(now=0.0)
    assert err.value.status == 429 and err.value.headers["Retry-After"] == "30"
    quota.refuse_early(now=30.0)  # the tokens are left for admit, which sees the body
    quota.admit(80, now=30.0)


# -- keys --------------------------------------------------------------------------------


def test_keys_are_matched_by_hash(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("sk-from-file\n")
    config = parse_fleet(
        fleet(
            {
                "api_keys": [
                    {"name": "alpha", "key_sha256": hash_key(KEY), "models": ["small"]},
                    {"name": "beta", "key_file": str(key_file)},
                ]
            }
        )
    )
    table = KeyTable.from_config(config.gateway.api_keys)
    assert table.authenticate(f"Bearer {KEY}").name == "alpha"
    assert table.authenticate("Bearer sk-from-file").name == "beta"
    for header in (None, "Bearer wrong", f"Basic {KEY}"):
        with pytest.raises(RequestError) as err:
            table.authenticate(header)
        assert err.value.status == 401 and KEY not in err.value.message
    with pytest.raises(RequestError) as err:
        table.authenticate(f"Bearer {KEY}").check_model("large")
    assert err.value.status == 403


def test_hash_key_form():
    assert hash_key("abc") == (
        "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    )


# -- rules -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "window, minute, inside",
    [
        ((0, 360), 0, True),
        ((0, 360), 359, True),
        ((0, 360), 360, False),
        ((22 * 60, 6 * 60), 23 * 60, True),
        ((22 * 60, 6 * 60), 5 * 60, True),
        ((22 * 60, 6 * 60), 12 * 60, False),
    ],
)
def test_daily_window(window, minute, inside):
    assert DailyWindow(*window).contains(minute) is inside


class Facts:
    def __init__(self, tokens=0, priority_class=None, minute=12 * 60):
        self.tokens, self.priority_class, self.minute = tokens, priority_class, minute
        self.counted_with: list = []

    def minute_of_day(self):
        return self.minute

    def prompt_tokens(self, model):
        self.counted_with.append(model)
        return self.tokens


ROUTE = {
    "name": "auto",
    "fallback": "backup",
    "rules": [
        {
            "name": "night",
            "target": "fallback:backup",
            "time_of_day": {"from": "00:00", "to": "06:00"},
        },
        {"name": "vip", "target": "large", "priority_classes": ["high"]},
        {"name": "short", "target": "small", "prompt_tokens_below": 512},
        {"name": "long", "target": "large"},
    ],
}
GATEWAY = {
    "routes": [ROUTE],
    "priority_classes": [{"name": "high", "priority": -10}, {"name": "low", "priority": 10}],
    "fallback": {
        "providers": [{"name": "backup", "base_url": "http://127.0.0.1:1/v1", "default_model": "x"}]
    },
}


def decide(facts, usable=lambda m: True):
    route = Route.from_config(parse_fleet(fleet(GATEWAY)).gateway.routes[0])
    return route.decide(facts, usable)


def test_rules_in_order():
    assert decide(Facts(minute=3 * 60)).provider == "backup"
    assert decide(Facts(minute=3 * 60)).rule == "night"
    assert decide(Facts(priority_class="high", tokens=10)).model == "large"
    assert decide(Facts(tokens=511)).model == "small"
    assert decide(Facts(tokens=512)).model == "large"


def test_prompt_counted_with_target_tokenizer_only_when_needed():
    facts = Facts(priority_class="high")
    decide(facts)
    assert facts.counted_with == []
    facts = Facts(tokens=5)
    assert decide(facts).rule == "short"
    assert facts.counted_with == ["small"]


def test_unavailable_target_falls_through_then_to_fallback():
    assert decide(Facts(tokens=5), usable=lambda m: m != "small").rule == "long"
    decision = decide(Facts(tokens=5), usable=lambda m: False)
    assert decision.rule == "fallback" and decision.provider == "backup"


# -- tokens ------------------------------------------------------------------------------


def test_prompt_text_and_bounds():
    chat = prompt_of(
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "user", "content": "héllo"},
                {"role": "user", "content": [{"type": "text", "text": "there"}]},
            ]
        },
    )
    assert chat.text == "héllo\nthere"
    assert chat.max_tokens_bound() == len("héllo\nthere".encode())
    ids = prompt_of("/v1/completions", {"prompt": [1, 2, 3]})
    assert ids.max_tokens_bound() == 3
    assert TokenCounter({}).count("none", chat) == math.ceil(chat.num_bytes / 4)


def test_counter_uses_the_model_tokenizer(tiny_model):
    counter = TokenCounter({"tiny": str(tiny_model)})
    counter.load()
    prompt = prompt_of("/v1/completions", {"prompt": "hello world " * 20})
    count = counter.count("tiny", prompt)
    assert 0 < count <= prompt.max_tokens_bound()
    assert counter.has_tokenizer("tiny")


def test_context_length_sources(tiny_model):
    assert context_length(str(tiny_model), {"max_model_len": 512}) == 512
    assert context_length(str(tiny_model), {}) > 0  # config.json max_position_embeddings
    assert context_length("org/hub-model", {}) is None


def test_request_parsed_once_then_admitted_with_policies(tiny_model):
    config = parse_fleet(
        {
            "gateway": {
                "limits": {"max_tokens": 64, "max_tokens_action": "clamp"},
                "priority_classes": [{"name": "batch", "priority": 5}],
                "default_priority_class": "batch",
            },
            "models": [
                {"name": "tiny", "source": str(tiny_model), "engine_args": {"max_model_len": 128}}
            ],
        }
    )
    policies = Policies.from_fleet(config)
    policies.counter.load(policies.tokenizers_needed())
    parsed = parse_request(
        "/v1/completions", b'{"model": "tiny", "prompt": "hi", "max_tokens": 99}'
    )
    admission = policies.admit("/v1/completions", parsed, 50, {}, lambda m: True)
    assert admission.body["max_tokens"] == 64 and admission.body["priority"] == 5
    assert admission.clamped and admission.model == "tiny"
    long = parse_request(
        "/v1/completions", b'{"model": "tiny", "prompt": "' + b"hello world " * 40 + b'"}'
    )
    with pytest.raises(RequestError, match="maximum context length is 128"):
        policies.admit("/v1/completions", long, 500, {}, lambda m: True)


# -- config ------------------------------------------------------------------------------


def test_priority_classes_turn_on_the_priority_scheduler():
    config = parse_fleet(fleet({"priority_classes": [{"name": "a", "priority": 0}]}))
    assert all(config.engine_args_for(m)["scheduling_policy"] == "priority" for m in config.models)
    assert all("scheduling_policy" not in m.engine_args for m in config.models), "user data kept"
    plain = parse_fleet(fleet({}))
    assert "scheduling_policy" not in plain.engine_args_for(plain.models[0])


@pytest.mark.parametrize(
    "gateway, extra, expected",
    [
        (
            {"priority_classes": [{"name": "a", "priority": 1}]},
            {"engine_args": {"scheduling_policy": "fcfs"}},
            "model 'small' sets scheduling_policy 'fcfs', "
            "but gateway.priority_classes need 'priority'",
        ),
        (
            {"routes": [{"name": "auto", "rules": [{"name": "r", "target": "medium"}]}]},
            {},
            "rule 'r' targets 'medium', which is not a model of the fleet",
        ),
        (
            {"routes": [{"name": "small", "rules": [{"name": "r", "target": "large"}]}]},
            {},
            "'small' is both a model and a route",
        ),
        (
            {"routes": [{"name": "auto", "rules": [{"name": "r", "target": "fallback:nope"}]}]},
            {},
            "rule 'r' target 'fallback:nope' is not a fallback provider",
        ),
        (
            {"api_keys": [{"name": "k", "key_sha256": "abc"}]},
            {},
            "must be 'sha256:' followed by 64 hex digits",
        ),
        ({"api_keys": [{"name": "k"}]}, {}, "needs exactly one of key_sha256 and key_file"),
        (
            {"api_keys": [{"name": "k", "key_sha256": hash_key("x"), "priority_class": "vip"}]},
            {},
            "priority_class 'vip' is not defined",
        ),
        (
            {
                "routes": [
                    {
                        "name": "auto",
                        "rules": [
                            {
                                "name": "r",
                                "target": "large",
                                "prompt_tokens_at_least": 10,
                                "prompt_tokens_below": 5,
                            }
                        ],
                    }
                ]
            },
            {},
            "prompt_tokens_at_least (10) must be below prompt_tokens_below (5)",
        ),
        ({"timezone": "Mars/Olympus"}, {}, "is not an IANA time zone"),
        (
            {
                "routes": [
                    {
                        "name": "auto",
                        "rules": [
                            {
                                "name": "r",
                                "target": "large",
                                "time_of_day": {"from": "25:00", "to": "06:00"},
                            }
                        ],
                    }
                ]
            },
            {},
            "'25:00' is not a time of day",
        ),
        ({"model_limits": {"medium": {"max_tokens": 5}}}, {}, "is neither a model nor a route"),
        ({"limits": {"max_tokens_action": "trim"}}, {}, "gateway.limits.max_tokens_action"),
        ({"limits": {"max_tokenz": 4}}, {}, "did you mean 'max_tokens'?"),
    ],
)
def test_bad_gateway_config_is_one_line(gateway, extra, expected):
    with pytest.raises(ConfigError) as err:
        parse_fleet(fleet(gateway, **extra))
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_provider_key_comes_from_the_environment(monkeypatch):
    provider = {
        "name": "p",
        "base_url": "http://127.0.0.1:1/v1",
        "api_key_env": "RF_TEST_KEY",
        "default_model": "m",
    }
    config = parse_fleet(fleet({"fallback": {"providers": [provider]}}))
    monkeypatch.delenv("RF_TEST_KEY", raising=False)
    with pytest.raises(ConfigError, match="RF_TEST_KEY is not set"):
        Policies.from_fleet(config)
    monkeypatch.setenv("RF_TEST_KEY", "secret")
    assert Policies.from_fleet(config).providers[0].headers["Authorization"] == "Bearer secret"


def test_time_of_day_uses_the_configured_zone():
    config = parse_fleet(fleet({"timezone": "Asia/Tokyo", **GATEWAY}))
    noon_utc = datetime(2024, 1, 1, 12, 0, tzinfo=UTC)  # 21:00 in Tokyo
    policies = Policies.from_fleet(config, clock=lambda: noon_utc)
    parsed = parse_request("/v1/completions", b'{"model": "auto", "prompt": "hi"}')
    assert policies.admit("/v1/completions", parsed, 10, {}, lambda m: True).route_rule == "short"
    three_utc = datetime(2024, 1, 1, 18, 0, tzinfo=UTC)  # 03:00 in Tokyo
    policies.clock = lambda: three_utc
    admission = policies.admit("/v1/completions", parsed, 10, {}, lambda m: True)
    assert admission.route_rule == "night" and admission.provider.name == "backup"


def test_key_quota_refund_gives_back_the_request_and_its_tokens_up_to_the_capacity():
    quota = KeyQuota("a", requests_per_minute=1, tokens_per_minute=100)
    quota.admit(60, now=0.0)
    quota.release()
    with pytest.raises(RequestError):
        quota.admit(1, now=0.0)
    quota.refund(60, now=0.0)
    quota.admit(100, now=0.0)  # the request and all 100 tokens are back
    quota.release()
    quota.refund(100, now=0.0)
    quota.refund(100, now=0.0)  # more than was taken: no more than the capacity
    assert quota.requests is not None and quota.requests.level == 1.0
    assert quota.tokens is not None and quota.tokens.level == 100.0
