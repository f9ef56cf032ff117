"""Every topic config floe accepts is either applied or inert by design, and README says which."""

from __future__ import annotations

import re
from pathlib import Path

from broker.config import INERT_TOPIC_CONFIGS, TOPIC_CONFIGS, ConfigError, validate_topic_configs

README = Path(__file__).resolve().parents[2] / "README.md"


def _section() -> str:
    text = README.read_text()
    m = re.search(r"^## Topic configs\n(.*?)^## ", text, re.S | re.M)
    assert m, "README.md has no 'Topic configs' section"
    return m.group(1)


def test_readme_lists_every_accepted_topic_config() -> None:
    """Must survive: a topic config added to TOPIC_CONFIGS without saying in README whether it
    is applied or inert (and why) fails here."""
    section = _section()
    named = set(re.findall(r"`([a-z.]+)`", section))
    # ".after.max.ms"-style shorthand in the table names the message.timestamp.* family
    named |= {"message.timestamp" + n for n in named if n.startswith(".")}
    missing = [
        k for k in TOPIC_CONFIGS if not k.startswith("table.topic.") and k not in named
    ]
    assert not missing, f"README 'Topic configs' does not mention {missing}"
    inert_rows = section.split("accepted, no effect", 1)[1]
    for key in INERT_TOPIC_CONFIGS:
        assert f"`{key}`" in inert_rows, f"{key} is inert but not in README's inert table"


def test_inert_configs_say_so_and_unknown_ones_are_refused() -> None:
    """Must survive: DescribeConfigs documentation of an inert key says it has no effect; an
    unknown key is refused (INVALID_CONFIG upstream) instead of being accepted silently."""
    for key in INERT_TOPIC_CONFIGS:
        assert TOPIC_CONFIGS[key].doc.startswith("accepted, no effect")
    for key in ("message.format.version", "confluent.placement.constraints", "segment.size"):
        try:
            validate_topic_configs({key: "1"})
        except ConfigError as e:
            assert key in str(e)
        else:
            raise AssertionError(f"{key} accepted")
