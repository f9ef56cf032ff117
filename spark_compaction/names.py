"""Table names in Spark SQL: identifiers split and quoted, string and timestamp literals, and
TableRef, a table of the catalog with the forms SQL and Iceberg's procedures want."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass


def split_identifier(text: str) -> list[str]:
    """`a.b.c`, `` `a.b`.c `` -> parts (backticks quote, doubled backticks escape one)."""
    parts: list[str] = []
    cur: list[str] = []
    i, quoted, was_quoted = 0, False, False
    while i < len(text):
        c = text[i]
        if quoted:
            if c == "`":
                if text[i + 1 : i + 2] == "`":
                    cur.append("`")
                    i += 1
                else:
                    quoted = False
            else:
                cur.append(c)
        elif c == "`":
            quoted = was_quoted = True
        elif c == ".":
            if not cur and not was_quoted:
                raise ValueError(f"empty name part in {text!r}")
            parts.append("".join(cur))
            cur, was_quoted = [], False
        else:
            cur.append(c)
        i += 1
    if quoted:
        raise ValueError(f"unclosed backtick in {text!r}")
    if not cur and not was_quoted:
        raise ValueError(f"empty name part in {text!r}")
    parts.append("".join(cur))
    return parts


def quote(part: str) -> str:
    return "`" + part.replace("`", "``") + "`"


def sql_string(value: str) -> str:
    """A Spark SQL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def timestamp_literal(epoch_s: float) -> str:
    when = dt.datetime.fromtimestamp(epoch_s, dt.UTC)
    return f"TIMESTAMP '{when.strftime('%Y-%m-%dT%H:%M:%S.%f')[:-3]}Z'"


@dataclass(frozen=True)
class TableRef:
    namespace: tuple[str, ...]
    name: str
    catalog: str = "floe"

    @classmethod
    def parse(cls, text: str, catalog: str = "floe") -> TableRef:
        """`NS.T` (or `NS1.NS2.T`, or `CATALOG.NS.T` with the catalog's own name)."""
        parts = split_identifier(text.strip())
        if len(parts) >= 3 and parts[0] == catalog:
            parts = parts[1:]
        if len(parts) < 2:
            raise ValueError(f"table {text!r}: expected NAMESPACE.TABLE")
        return cls(tuple(parts[:-1]), parts[-1], catalog)

    def __str__(self) -> str:
        """NS.T, backtick-quoted only where needed."""
        return ".".join(p if p.isidentifier() else quote(p) for p in (*self.namespace, self.name))

    @property
    def sql(self) -> str:
        """The fully qualified, quoted name for SQL: `floe`.`ns`.`t`."""
        return ".".join(quote(p) for p in (self.catalog, *self.namespace, self.name))

    def metadata(self, which: str) -> str:
        """A metadata table: files, snapshots, manifests, ..."""
        return f"{self.sql}.{quote(which)}"

    @property
    def arg(self) -> str:
        """The table argument of a `CALL floe.system.*` procedure (a string literal)."""
        return sql_string(".".join(quote(p) for p in (*self.namespace, self.name)))

    @property
    def procedures(self) -> str:
        return f"{quote(self.catalog)}.system"


def table_ref(table: str | TableRef, catalog: str) -> TableRef:
    return table if isinstance(table, TableRef) else TableRef.parse(table, catalog)
