"""Settings: each variable is parsed as declared, and the declarations are the documentation."""

from __future__ import annotations

import dataclasses

import pytest

from shared.settings import ENV_VARS, OTHER_VARS, Settings, declarations, split_list


def test_defaults_without_environment() -> None:
    assert Settings.from_env({}) == Settings()
    blank = {v.name: "  " for v in declarations().values()}
    assert Settings.from_env(blank) == Settings()  # a blank variable leaves the default


def test_every_field_is_declared_once() -> None:
    names = [v.name for v in declarations().values()]
    assert list(declarations()) == [f.name for f in dataclasses.fields(Settings)]
    assert len(set(names)) == len(names)
    assert set(ENV_VARS) == set(names) | {v.name for v in OTHER_VARS}
    assert not set(names) & {v.name for v in OTHER_VARS}


def test_values_parse_by_declaration() -> None:
    s = Settings.from_env(
        {
            "LW_NATS_URL": " nats://a:1 , ,nats://b:2 ",
            "LW_REPLICAS": "3",
            "LW_COMMIT_RETRY_SECONDS": "2.5",
            "LW_DEMO_CHUNK_DELAY": "-1",
            "LW_LEASE_TTL_SECONDS": "0.1",
            "LW_RESULTS_TTL_SECONDS": "0",
            "LW_HTTP_ALLOW": "example.com",
            "LW_LOG_FORMAT": "JSON",
            "LW_UVLOOP": "no",
            "LW_ANTHROPIC_THINKING_BUDGET": "4000",
            "LW_OPENAI_API_KEY": "sk-secret",
        }
    )
    assert s.nats_urls == ("nats://a:1", "nats://b:2")
    assert s.replicas == 3
    assert s.commit_retry_seconds == 2.5
    assert s.demo_chunk_delay == 0.0
    assert s.lease_ttl_seconds == 0.5
    assert s.results_ttl_seconds == 1.0
    assert s.http_allow == ("example.com",)
    assert s.log_format == "json"
    assert s.uvloop is False  # on by default
    assert s.anthropic_thinking_budget == 4000
    assert "sk-secret" not in repr(s)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("LW_REPLICAS", "2", "LW_REPLICAS must be 1 or 3, got 2"),
        ("LW_MAX_RECORD_BYTES", "big", "LW_MAX_RECORD_BYTES must be an integer"),
        ("LW_TOOL_TIMEOUT_SECONDS", "soon", "LW_TOOL_TIMEOUT_SECONDS must be a number"),
        ("LW_HEARTBEAT_SECONDS", "nan", "LW_HEARTBEAT_SECONDS must be a finite number"),
        ("LW_LOG_FORMAT", "xml", "LW_LOG_FORMAT must be text or json"),
    ],
)
def test_bad_values_name_the_variable(name: str, value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Settings.from_env({name: value})


def test_overrides_by_field_name() -> None:
    s = Settings.from_env({"LW_PREFIX": "a"}, prefix="b", nats_urls=split_list("nats://x:1,nats://y:2"))
    assert (s.prefix, s.nats_urls) == ("b", ("nats://x:1", "nats://y:2"))
    with pytest.raises(TypeError, match="unknown settings"):
        Settings.from_env({}, no_such_setting=1)


def test_a_nats_url_names_a_scheme_nats_py_speaks() -> None:
    urls = "nats://a:1, tls://b:2,ws://c:3,wss://d:4,e:5,NATS://f:6"
    assert len(Settings.from_env({"LW_NATS_URL": urls}).nats_urls) == 6
    for env, overrides, name in [
        ({"LW_NATS_URL": "nats://a:1,http://127.0.0.1:4222"}, {}, "LW_NATS_URL"),
        ({}, {"nats_urls": ("https://x",)}, "--nats-url"),
    ]:
        with pytest.raises(ValueError, match=rf"^{name}: '\w+://[^']+' is not a NATS URL \(scheme \w+://;"):
            Settings.from_env(env, **overrides)
