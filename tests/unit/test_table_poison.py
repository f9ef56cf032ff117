"""A record that trips a bug in the conversion (the conversion raises instead of calling the
record invalid) must not stop its partition's table: converting is pure, so the writer would
retry the same batch forever. tabletopic.writer.convert_isolating converts such a batch record
by record; what must hold: every other record becomes its row at its own offset, the one that
raises is a dead letter saying why, and with errors.tolerance=none the partition stops at it
with the rows before it. A fault that every record trips is the conversion's, not a record's:
it is raised as before (the writer retries), nothing goes to the dead letters."""

from __future__ import annotations

import pyarrow as pa
import pytest

from broker.protocol import records
from broker.protocol.recordcodec import encode_batch
from tabletopic.columnar import Columns, decode_columns
from tabletopic.convert import Converter, Invalid
from tabletopic.writer import _convert_columns, convert_isolating

POISON = b'{"a": 3, "poison": true}'


class Buggy(Converter):
    """A converter with a bug that only one record trips."""

    def convert_columns(self, partition: int, cols: Columns
                        ) -> tuple[pa.Table | None, list[Invalid]]:
        if POISON in cols.values:
            raise RuntimeError("a bug")
        return super().convert_columns(partition, cols)


VALUES = [b'{"a": 1}', b'{"a": 2, "b": "x"}', POISON, b"not json", b'{"a": 5, "c": {"d": 1}}']


def test_the_record_that_raises_is_a_dead_letter_and_the_others_rows() -> None:
    cols = Columns(list(range(10, 15)), [1_700_000_000_000] * 5, [None] * 5, list(VALUES),
                   [()] * 5)
    table, dead = convert_isolating(Buggy("json"), 4, cols)
    assert [(d.record.offset, d.reason.split(":")[0]) for d in dead] == \
        [(12, "conversion failed"), (13, "invalid JSON record")]
    assert "RuntimeError: a bug" in dead[0].reason and dead[0].record.value == POISON
    assert table is not None
    kafka = table.column("_kafka").combine_chunks()
    assert kafka.field("offset").to_pylist() == [10, 11, 14]
    assert kafka.field("partition").to_pylist() == [4, 4, 4]
    assert table.column("a").to_pylist() == [1, 2, 5]
    assert table.column("b").to_pylist() == [None, "x", None]
    assert table.column("c").to_pylist() == [None, None, {"d": 1}]
    # a batch without the poison converts in one go, as before
    clean = cols.take([0, 1, 4])
    once, none = convert_isolating(Buggy("json"), 4, clean)
    assert not none and once is not None and once.num_rows == 3


def test_with_tolerance_none_the_partition_stops_at_it() -> None:
    batch = bytearray(encode_batch([(None, v, []) for v in VALUES], 1_700_000_000_000))
    hs = records.validate(batch)
    records.assign_offsets(batch, hs, 100, None)
    data = bytes(batch)
    assert len(decode_columns(data, hs, 100)) == 5
    table, dead, first = _convert_columns(Buggy("json"), 0, data, hs, 100, True)
    assert not dead and first is not None and first.record.offset == 102
    assert first.reason.startswith("conversion failed: RuntimeError")
    assert table is not None and table.column("a").to_pylist() == [1, 2]


class Broken(Converter):
    """A converter every record trips."""

    def convert_columns(self, partition: int, cols: Columns
                        ) -> tuple[pa.Table | None, list[Invalid]]:
        raise RuntimeError("broken for all")


def test_a_fault_every_record_trips_is_raised_not_dead_lettered() -> None:
    cols = Columns(list(range(3)), [0] * 3, [None] * 3, [b'{"a": 1}'] * 3, [()] * 3)
    with pytest.raises(RuntimeError, match="broken for all"):
        convert_isolating(Broken("json"), 0, cols)
    alone = cols.take([0])  # one record alone: nothing tells the two apart, so it waits
    with pytest.raises(RuntimeError):
        convert_isolating(Broken("json"), 0, alone)
    with pytest.raises(RuntimeError):  # the poison alone too: the next records will tell
        convert_isolating(Buggy("json"), 0, Columns([7], [0], [None], [POISON], [()]))
