"""The coordinator's choice of file sets (tabletopic.coordinator.pick): per partition, the chain
of the current leader epoch's sets from the table's offset, without a gap; everything else
dropped (a deposed leader's, behind the table, cut off from it)."""

from __future__ import annotations

from broker.metadata.tablework import FileSet, Outstanding
from tabletopic.coordinator import pick


def fs(p: int, start: int, nxt: int, epoch: int) -> FileSet:
    return FileSet("t", p, start, epoch, nxt, 1, 1, "", nxt - start, 0, 0)


def test_chains_start_at_the_table_and_follow_the_current_epoch() -> None:
    sets = [
        fs(0, 10, 20, 2), fs(0, 20, 30, 2), fs(0, 40, 50, 2),  # a gap after 30: 40- dropped
        fs(0, 10, 25, 1),  # a deposed leader's set from the same offset: dropped
        fs(1, 0, 5, 7), fs(1, 5, 9, 7),  # partition 1: behind the table (at 5) and the next
        fs(2, 3, 8, 4),  # partition 2: the table does not know it yet: from its first set
        fs(3, 0, 4, 1),  # partition 3: no leader now: dropped
    ]
    out = Outstanding(sets, {0: (1, 2), 1: (2, 7), 2: (3, 4), 3: (-1, 2)}, {}, None)
    chains = pick(out, {0: 10, 1: 5})
    assert chains.start == {0: 10, 1: 5, 2: 3}
    assert chains.new == {0: 30, 1: 9, 2: 8}
    assert [f.key for f in chains.sets] == [(0, 10, 2), (0, 20, 2), (1, 5, 7), (2, 3, 4)]
    assert sorted(f.key for f in chains.dropped) == [
        (0, 10, 1), (0, 40, 2), (1, 0, 7), (3, 0, 1)]


def test_nothing_to_take() -> None:
    out = Outstanding([fs(0, 20, 30, 2)], {0: (1, 2)}, {}, None)
    chains = pick(out, {0: 10})  # the set starts past the table: it can never link
    assert chains.sets == [] and chains.new == {}
    assert [f.key for f in chains.dropped] == [(0, 20, 2)]
