from __future__ import annotations

from pathlib import Path

import pytest

from broker.config import ConfigError, load_settings, validate_topic_configs


def test_precedence_flags_env_file_defaults(tmp_path: Path) -> None:
    f = tmp_path / "floe.toml"
    f.write_text(
        'listen = "127.0.0.1:1111"\nnum_partitions = 4\nnode-id = 3\n'
        '"auto.create.topics.enable" = false\n'
    )
    env = {"FLOE_NUM_PARTITIONS": "6", "FLOE_NODE_ID": "5"}
    s = load_settings({"node.id": "9"}, str(f), env)
    assert s.node_id == 9 and s.sources["node.id"] == "flag"
    assert s.num_partitions == 6 and s.sources["num.partitions"].startswith("env")
    assert s.listen == ("127.0.0.1", 1111) and s.sources["listen"].startswith("file")
    assert s.auto_create_topics_enable is False
    assert s.socket_request_max_bytes == 100 * 1024 * 1024
    assert s.object_store_url.startswith("file://")
    assert s.metadata_url.startswith("sqlite:///")


@pytest.mark.parametrize(
    ("flags", "env", "match"),
    [
        ({"listen": "nope"}, {}, "HOST:PORT"),
        ({"node.id": "-1"}, {}, "node.id"),
        ({}, {"FLOE_NUM_PARTITIONS": "zero"}, "FLOE_NUM_PARTITIONS"),
        ({"log.level": "loud"}, {}, "log.level"),
    ],
)
def test_bad_settings_name_the_key_and_source(
    flags: dict[str, str], env: dict[str, str], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        load_settings(flags, None, env)


def test_unknown_key_in_file(tmp_path: Path) -> None:
    f = tmp_path / "floe.toml"
    f.write_text("no_such_setting = 1\n")
    with pytest.raises(ConfigError, match=r"no\.such\.setting"):
        load_settings({}, str(f), {})


def test_topic_configs_validated_like_kafka() -> None:
    assert validate_topic_configs({"retention.ms": "-1", "cleanup.policy": "compact,delete"})
    for bad in (
        {"retention.ms": "x"},
        {"nope": "1"},
        {"message.timestamp.type": "Wall"},
        {"cleanup.policy": "keep"},
        {"min.insync.replicas": "0"},
    ):
        with pytest.raises(ConfigError):
            validate_topic_configs(bad)
