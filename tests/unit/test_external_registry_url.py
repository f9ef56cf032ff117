"""`schema.registry.url` (an external Schema Registry): validated at start-up with a message
naming the key and the problem; when set, the built-in registry is off unless
`schema.registry` was given explicitly."""

from __future__ import annotations

import pytest

from broker.config import ConfigError, load_settings


@pytest.mark.parametrize("url", ["http://127.0.0.1:8081", "https://sr.example.com:443/",
                                 "http://[::1]:8081", "http://sr:8081/prefix"])
def test_good_urls_are_taken_and_turn_the_built_in_registry_off(url: str) -> None:
    s = load_settings({"schema.registry.url": url}, environ={})
    assert s.schema_registry_url == url
    assert s.schema_registry is None  # not served: the external one is the registry


@pytest.mark.parametrize("url", ["127.0.0.1:8081", "ftp://h:21", "http://h", "http://:8081",
                                 "http://h:99999", "http://u:p@h:8081", "http://h:8081/?x=1"])
def test_bad_urls_stop_the_broker_with_a_clear_error(url: str) -> None:
    with pytest.raises(ConfigError, match=r"schema.registry.url: expected http\(s\)://HOST:PORT"):
        load_settings({"schema.registry.url": url}, environ={})


def test_env_works_and_an_explicit_built_in_registry_is_still_served() -> None:
    env = {"FLOE_SCHEMA_REGISTRY_URL": "http://127.0.0.1:18081"}
    s = load_settings({"schema.registry": "127.0.0.1:0"}, environ=env)
    assert s.schema_registry_url == "http://127.0.0.1:18081"
    assert s.schema_registry == ("127.0.0.1", 0)
    assert s.sources["schema.registry.url"] == "env FLOE_SCHEMA_REGISTRY_URL"
    with pytest.raises(ConfigError, match="from env FLOE_SCHEMA_REGISTRY_URL"):
        load_settings({}, environ={"FLOE_SCHEMA_REGISTRY_URL": "nope"})


def test_unset_or_empty_means_the_built_in_registry() -> None:
    for flags in ({}, {"schema.registry.url": ""}):
        s = load_settings(flags, environ={})
        assert s.schema_registry_url is None
        assert s.schema_registry == ("127.0.0.1", 8081)
