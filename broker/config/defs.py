"""Config definitions and the registry each package adds its keys to.

A `ConfigDef` parses and checks one key's string value (Kafka's types: boolean, int, long,
double, string, list); a `ConfigRegistry` holds the keys of one kind (topic configs), each
registered by the package that acts on it. A key nobody registered is unknown: the broker
refuses it (INVALID_CONFIG for a topic config), so registration must happen before anything
is parsed, which is why packages register at import of the module the composition root
(broker.app, broker.cli) imports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    pass


class RegistrationError(RuntimeError):
    """A key or an owner registered twice: a programming error, never a user's."""


@dataclass(frozen=True)
class ConfigDef:
    name: str
    type: str  # boolean | int | long | double | string | list | password
    default: str | None
    doc: str = ""
    check: Callable[[Any], bool] | None = None
    choices: tuple[str, ...] = ()

    def parse(self, raw: str) -> Any:
        """The typed value of `raw` (bool, int, float, str, list[str]), or ConfigError."""
        try:
            value: Any
            if self.type == "boolean":
                low = raw.strip().lower()
                if low not in ("true", "false"):
                    raise ValueError(raw)
                value = low == "true"
            elif self.type in ("int", "long"):
                value = int(raw.strip())
                if self.type == "int" and not -(2**31) <= value < 2**31:
                    raise ValueError(raw)
                if not -(2**63) <= value < 2**63:
                    raise ValueError(raw)
            elif self.type == "double":
                value = float(raw)
            elif self.type == "list":
                value = [v.strip() for v in raw.split(",") if v.strip()]
            else:
                value = raw
        except ValueError:
            raise ConfigError(f"invalid value {raw!r} for {self.name} (a {self.type})") from None
        if self.choices:
            values = value if isinstance(value, list) else [value]
            for v in values:
                if str(v).lower() not in self.choices:
                    raise ConfigError(
                        f"invalid value {raw!r} for {self.name}: one of {', '.join(self.choices)}"
                    )
        if self.check is not None and not self.check(value):
            raise ConfigError(f"invalid value {raw!r} for {self.name}")
        return value


def nonneg(v: int) -> bool:
    return v >= 0


def min_minus1(v: int) -> bool:
    return v >= -1


def positive(v: int) -> bool:
    return v > 0


LONG_MAX = str(2**63 - 1)


class ConfigRegistry(Mapping[str, ConfigDef]):
    """Config keys of one kind by name, each owned by the package that registered it.
    Aliases are key prefixes another name for a registered prefix (AutoMQ's
    `automq.table.topic.` for `table.topic.`)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._defs: dict[str, ConfigDef] = {}
        self._owners: dict[str, list[str]] = {}  # owner -> its keys
        self._aliases: dict[str, tuple[str, str]] = {}  # alias prefix -> (prefix, owner)

    def register(
        self, owner: str, defs: Iterable[ConfigDef], aliases: Mapping[str, str] | None = None
    ) -> None:
        """Add `owner`'s keys; a key (or alias) already registered, or an owner registering
        twice, raises RegistrationError and registers nothing."""
        defs = list(defs)
        if owner in self._owners:
            raise RegistrationError(f"{self.kind}s of {owner} are already registered")
        names = [d.name for d in defs]
        taken = sorted({n for n in names if n in self._defs or names.count(n) > 1})
        if taken:
            raise RegistrationError(f"{self.kind} {', '.join(taken)} registered twice")
        for alias in aliases or {}:
            if alias in self._aliases:
                raise RegistrationError(f"{self.kind} alias {alias} registered twice")
        self._owners[owner] = names
        self._defs.update((d.name, d) for d in defs)
        for alias, prefix in (aliases or {}).items():
            self._aliases[alias] = (prefix, owner)

    def unregister(self, owner: str) -> None:
        for name in self._owners.pop(owner):
            del self._defs[name]
        self._aliases = {a: v for a, v in self._aliases.items() if v[1] != owner}

    def owner(self, name: str) -> str | None:
        return next((o for o, names in self._owners.items() if name in names), None)

    def canonical(self, key: str) -> str:
        """`key` with an alias prefix replaced by the prefix it stands for."""
        for alias, (prefix, _) in self._aliases.items():
            if key.startswith(alias):
                return prefix + key[len(alias) :]
        return key

    def __getitem__(self, name: str) -> ConfigDef:
        return self._defs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._defs)

    def __len__(self) -> int:
        return len(self._defs)
