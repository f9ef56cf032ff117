"""The broker's tables, component "broker.metadata" of the shared migration runner
(s3stream.metadata.migrations), applied after s3stream's own component:
- `kafka_topics(name, topic_id, configs, created_ms)`: configs as a JSON object;
- `kafka_partitions(topic, partition, stream_id)`: which s3stream stream holds a partition;
- `kafka_producer_batches(stream_id, producer_id, epoch, first_seq, last_seq, base_offset,
  last_offset)`: the last PRODUCER_BATCHES_KEPT idempotent batches per partition and producer,
  written in the WAL commit's own transaction (broker.metadata.producers);
- `kafka_group_offsets(group_id, topic, partition, committed_offset, leader_epoch, metadata,
  commit_ms)`;
- `kafka_meta(key, value)`: `next_producer_id`, `controller`;
- `kafka_brokers(node_id, host, port, rack, incarnation, lease_expires_ms)` and the
  partitions' `leader`, `leader_epoch` (migration 2; see broker.cluster);
- `kafka_group_coordinators(group_id, node_id, epoch)` and the partitions' `target_leader`
  (migration 5: offset-commit fencing, partition reassignments).

Migration 1 creates them and moves in what s3stream's tables held before s3stream's migration 3
(`topics`, the hand-over `legacy_stream_partitions`, `producer_batches`, `group_offsets`,
meta['next_producer_id']), then drops those: a database made before the split keeps every
topic, config, partition, producer-state row, committed offset and the producer id counter.
"""

from __future__ import annotations

from s3stream.metadata.backend import Connection, Dialect
from s3stream.metadata.migrations import Component, sql_migration, table_exists

TABLES = """
CREATE TABLE kafka_topics(
    name TEXT PRIMARY KEY, topic_id TEXT NOT NULL, configs TEXT NOT NULL,
    created_ms {int} NOT NULL);
CREATE TABLE kafka_partitions(
    topic TEXT NOT NULL, partition {int} NOT NULL, stream_id {int} NOT NULL UNIQUE,
    PRIMARY KEY(topic, partition)){without_rowid};
CREATE TABLE kafka_producer_batches(
    stream_id {int} NOT NULL, producer_id {int} NOT NULL, epoch {int} NOT NULL,
    first_seq {int} NOT NULL, last_seq {int} NOT NULL, base_offset {int} NOT NULL,
    last_offset {int} NOT NULL,
    PRIMARY KEY(stream_id, producer_id, base_offset)){without_rowid};
CREATE TABLE kafka_group_offsets(
    group_id TEXT NOT NULL, topic TEXT NOT NULL, partition {int} NOT NULL,
    committed_offset {int} NOT NULL, leader_epoch {int} NOT NULL, metadata TEXT,
    commit_ms {int} NOT NULL, PRIMARY KEY(group_id, topic, partition)){without_rowid};
CREATE TABLE kafka_meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO kafka_meta(key, value) VALUES ('next_producer_id', '1000')
"""

# (legacy table, the statement moving its rows in); each legacy table is dropped afterwards
MOVES = [
    ("topics", "INSERT INTO kafka_topics SELECT name, topic_id, configs, created_ms FROM topics"),
    ("legacy_stream_partitions", "INSERT INTO kafka_partitions SELECT topic, partition,"
     " stream_id FROM legacy_stream_partitions"),
    ("producer_batches", "INSERT INTO kafka_producer_batches SELECT p.stream_id, p.producer_id,"
     " p.epoch, p.first_seq, p.last_seq, p.base_offset, p.last_offset FROM producer_batches p"
     " WHERE p.stream_id IN (SELECT stream_id FROM legacy_stream_partitions)"),
    ("group_offsets", "INSERT INTO kafka_group_offsets SELECT group_id, topic, partition,"
     " committed_offset, leader_epoch, metadata, commit_ms FROM group_offsets"),
]


def _create_and_move(db: Connection, dialect: Dialect) -> None:
    sql_migration(TABLES)(db, dialect)
    present = [(t, move) for t, move in MOVES if table_exists(db, dialect, t)]
    for _table, move in present:
        db.execute(move)
    for table, _move in present:  # after every move: the producers' move reads the hand-over
        db.execute(f"DROP TABLE {table}")
    if table_exists(db, dialect, "meta"):
        row = db.execute("SELECT value FROM meta WHERE key='next_producer_id'").fetchone()
        if row is not None:
            db.execute("UPDATE kafka_meta SET value=? WHERE key='next_producer_id'", (row[0],))
            db.execute("DELETE FROM meta WHERE key='next_producer_id'")


# 2: brokers sharing the database (broker.cluster). A partition's leader (node id, -1: none)
# and leader epoch, bumped on every change of leader; every WAL commit checks them (and the
# writer's lease) in its own transaction. `kafka_brokers`: one row per registered broker, live
# while lease_expires_ms (its own clock) is ahead; incarnation names the process (a restarted
# broker fences its earlier self). kafka_meta['controller'] = 'NODE INCARNATION' of the broker
# that assigns leaders (valid while that broker's lease is).
CLUSTER = """
ALTER TABLE kafka_partitions ADD COLUMN leader {int} NOT NULL DEFAULT -1;
ALTER TABLE kafka_partitions ADD COLUMN leader_epoch {int} NOT NULL DEFAULT 0;
CREATE TABLE kafka_brokers(
    node_id {int} PRIMARY KEY, host TEXT NOT NULL, port {int} NOT NULL, rack TEXT,
    incarnation TEXT NOT NULL, lease_expires_ms {int} NOT NULL);
INSERT INTO kafka_meta(key, value) VALUES ('controller', '')
"""

# 3: transactions (broker.txn). `kafka_transactions`: the coordinator's state of each
# transactional id (producer id, epoch, state, the partitions and groups of its open
# transaction as JSON, its timeout, when it began and last changed), so that any broker can
# take the coordinator over; `kafka_txn_offsets`: TxnOffsetCommit offsets pending until their
# transaction commits (moved into kafka_group_offsets then, dropped on abort);
# `kafka_txn_streams`: partitions that ever took part in a transaction (their open
# transactions and aborted ranges are rebuilt from the log when a broker loads them).
TXNS = """
CREATE TABLE kafka_transactions(
    transactional_id TEXT PRIMARY KEY, producer_id {int} NOT NULL, epoch {int} NOT NULL,
    state TEXT NOT NULL, partitions TEXT NOT NULL, groups TEXT NOT NULL,
    timeout_ms {int} NOT NULL, start_ms {int} NOT NULL, update_ms {int} NOT NULL);
CREATE TABLE kafka_txn_offsets(
    transactional_id TEXT NOT NULL, group_id TEXT NOT NULL, topic TEXT NOT NULL,
    partition {int} NOT NULL, committed_offset {int} NOT NULL, leader_epoch {int} NOT NULL,
    metadata TEXT,
    PRIMARY KEY(transactional_id, group_id, topic, partition)){without_rowid};
CREATE TABLE kafka_txn_streams(stream_id {int} PRIMARY KEY)
"""

# 4: a transactional id's last epoch (KIP-588): the producer's epoch before the coordinator
# bumped it to abort an expired transaction; that producer may recover (its requests get the
# retriable INVALID_PRODUCER_EPOCH, its InitProducerId with that epoch is accepted); -1: none.
TXN_LAST_EPOCH = """
ALTER TABLE kafka_transactions ADD COLUMN last_epoch {int} NOT NULL DEFAULT -1
"""

# 5: fencing of group coordinators and pinned partition leaders (broker.cluster).
# `kafka_group_coordinators`: which broker took each group over last and its coordinator
# epoch, bumped at every take-over (a broker loading the group's committed offsets); an
# OffsetCommit lands only in a transaction that finds the committing broker there at the epoch
# it took (broker.cluster.groupguard). `kafka_partitions.target_leader`: the broker an
# AlterPartitionReassignments pinned the partition to (-1: none); the controller moves the
# partition there while that broker is live and never balances it away.
PINS_AND_GROUPS = """
CREATE TABLE kafka_group_coordinators(
    group_id TEXT PRIMARY KEY, node_id {int} NOT NULL, epoch {int} NOT NULL){without_rowid};
ALTER TABLE kafka_partitions ADD COLUMN target_leader {int} NOT NULL DEFAULT -1
"""

# 6: a transactional id's coordinator epoch (broker.txn): bumped in the metadata transaction
# in which a broker takes the id over (reads its row as its coordinator: at start, after the
# live brokers changed, on finding the row changed by another coordinator); every marker that
# coordinator writes carries it, and a partition's leader refuses a marker whose coordinator
# epoch is below one it wrote for the producer (TRANSACTION_COORDINATOR_FENCED). Markers
# written before carry 0, the lowest.
TXN_COORDINATOR_EPOCH = """
ALTER TABLE kafka_transactions ADD COLUMN coordinator_epoch {int} NOT NULL DEFAULT 0
"""

COMPONENT = Component("broker.metadata", [
    _create_and_move, sql_migration(CLUSTER), sql_migration(TXNS), sql_migration(TXN_LAST_EPOCH),
    sql_migration(PINS_AND_GROUPS), sql_migration(TXN_COORDINATOR_EPOCH),
])
