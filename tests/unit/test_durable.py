"""s3stream/_durable.c, the file store's durable write, seen from the outside: the system
calls it makes, in order (strace), what it writes, the errors it reports and what they leave,
and that it holds no GIL while it waits for the disk. What must hold: an object is written
whole, fsynced, renamed, and its directory fsynced, in that order; one not to stay in the
page cache (drop_cached, the WAL's) is written around it (O_DIRECT, padded to the block and
cut back to its size) where the file system allows, else through it and its pages dropped
only once durable; a failure at any step raises OSError naming the path of that step and
never leaves an object under its final name before its data was fsynced; other Python
threads run while it waits."""

from __future__ import annotations

import array
import errno
import json
import os
import re
import select
from pathlib import Path

import pytest

from s3stream import _durable
from tests.strace import direct_io, names, needs_strace, traced

PUT = """
    import json
    from s3stream import _durable
    d = {d!r}
    try:
        _durable.put(d + "/obj.tmp", d + "/obj", d, [b"ab", bytearray(b"cd"), b""], {drop})
    except OSError as e:
        print(json.dumps({{"errno": e.errno, "filename": e.filename}}))
    else:
        print(json.dumps({{"ok": open(d + "/obj", "rb").read().decode()}}))
"""


@needs_strace
@pytest.mark.parametrize("drop", [False, True])
def test_put_writes_fsyncs_renames_and_fsyncs_the_directory_in_that_order(
    tmp_path: Path, drop: bool
) -> None:
    out, calls = traced(PUT.format(d=str(tmp_path), drop=drop), tmp_path, "obj.tmp")
    assert json.loads(out) == {"ok": "abcd"}
    if drop and direct_io(tmp_path):  # one block written around the cache, cut to 4 bytes
        writes = ["openat", "pwrite64", "ftruncate", "fsync"]
    elif drop:  # no O_DIRECT here: refused at open, then through the cache
        writes = ["openat", "openat", "writev", "fsync", "fadvise64"]
    else:
        writes = ["openat", "writev", "fsync"]
    expected = [*writes, "close", "rename", "openat", "fsync", "close"]
    assert names(calls)[: len(expected)] == expected, calls
    opened = calls[writes.index("openat", 1) if writes[1] == "openat" else 0]
    assert "O_CREAT" in opened and "O_TRUNC" in opened, opened
    if writes[1] == "pwrite64":
        assert "O_DIRECT" in calls[0] and ", 4096, 0) = 4096" in calls[1], calls[:2]
        assert re.match(r"ftruncate\(\d+, 4\)\s+= 0", calls[2]), calls[2]
    if "fadvise64" in writes:  # after the fsync: dirty pages are not dropped
        assert "POSIX_FADV_DONTNEED" in calls[writes.index("fadvise64")]
    assert f'rename("{tmp_path}/obj.tmp", "{tmp_path}/obj")' in calls[len(expected) - 4]
    opened_dir = calls[len(expected) - 3]
    assert f'"{tmp_path}"' in opened_dir and "O_DIRECTORY" in opened_dir, opened_dir


@needs_strace
@pytest.mark.parametrize(
    ("rule", "drop", "failed", "renamed"),
    [
        ("writev:error=ENOSPC", False, "obj.tmp", False),
        ("WRITE:error=ENOSPC", True, "obj.tmp", False),  # pwrite64 (O_DIRECT) or writev
        ("ftruncate:error=EIO", True, "obj.tmp", False),  # O_DIRECT only: cut to size
        ("fsync:error=EIO:when=1", True, "obj.tmp", False),  # the file's
        ("rename:error=EXDEV", True, "obj", False),
        ("fsync:error=EIO:when=2", True, "", True),  # the directory's (its path is tmp_path)
    ],
)
def test_a_failed_step_raises_with_its_path_and_the_object_is_not_there_before_durable(
    tmp_path: Path, rule: str, drop: bool, failed: str, renamed: bool
) -> None:
    """Each step's failure surfaces as OSError naming that step's path (file, final name or
    directory). Before the rename, nothing is under the final name; a failure of the
    directory's fsync comes after it (the caller then does not acknowledge the object)."""
    direct = drop and direct_io(tmp_path)
    if rule.startswith("ftruncate") and not direct:
        rule = "writev:error=EIO"  # no O_DIRECT here: no cut either; the write fails instead
    rule = rule.replace("WRITE", "pwrite64" if direct else "writev")
    out, _calls = traced(PUT.format(d=str(tmp_path), drop=drop), tmp_path, "obj.tmp", rule)
    result = json.loads(out)
    expected_errno = {"ENOSPC": errno.ENOSPC, "EIO": errno.EIO, "EXDEV": errno.EXDEV}
    assert result["errno"] == expected_errno[rule.split("error=")[1].split(":")[0]], result
    assert result["filename"] == str(tmp_path / failed) if failed else str(tmp_path)
    assert (tmp_path / "obj").exists() == renamed


@pytest.mark.parametrize("drop", [False, True])
def test_put_joins_any_number_of_parts_of_any_buffer_kind(tmp_path: Path, drop: bool) -> None:
    """More parts than one writev takes (IOV_MAX, 1024), empty ones, bytearrays, sliced
    views and a view whose items are not bytes: written one after the other, as bytes;
    around the page cache (drop) whatever the size against the 4 KiB block."""
    parts: list[bytes | bytearray | memoryview] = [
        bytes([i % 251]) * (i % 7) for i in range(3000)]
    ints = array.array("I", [1, 2, 3])
    parts += [bytearray(b"tail"), memoryview(b"xyz")[1:], memoryview(ints), b""]
    _durable.put(tmp_path / "a.tmp", tmp_path / "a", tmp_path, parts, drop)
    assert (tmp_path / "a").read_bytes() == b"".join(bytes(p) for p in parts)
    assert not (tmp_path / "a.tmp").exists()
    _durable.put(str(tmp_path / "b.tmp"), str(tmp_path / "b"), str(tmp_path), [], drop)
    assert (tmp_path / "b").read_bytes() == b""
    (tmp_path / "c").write_bytes(b"an older, longer object" * 1000)  # replaced whole
    _durable.put(tmp_path / "c.tmp", tmp_path / "c", tmp_path, [b"new"], drop)
    assert (tmp_path / "c").read_bytes() == b"new"
    for n in (1, 4095, 4096, 4097, 8192, (16 << 20) + 1, 5000):  # the last after a big one
        data = bytes(i % 253 for i in range(n % 70000)) * (n // 70000 + 1)
        data = data[:n]
        _durable.put(tmp_path / "d.tmp", tmp_path / "d", tmp_path, [data[:7], data[7:]], drop)
        assert (tmp_path / "d").read_bytes() == data, n


@needs_strace
@pytest.mark.parametrize("refused", ["openat", "pwrite64"])
def test_a_file_system_that_refuses_direct_io_gets_the_write_through_the_cache(
    tmp_path: Path, refused: str
) -> None:
    """O_DIRECT refused at the open (EINVAL: tmpfs) or only at the write: the object is
    written through the page cache instead, whole, and its pages dropped once durable."""
    if refused == "pwrite64" and not direct_io(tmp_path):
        refused = "openat"  # no O_DIRECT here at all: the open is what refuses
    rule = f"{refused}:error=EINVAL:when=1"
    out, calls = traced(PUT.format(d=str(tmp_path), drop=True), tmp_path, "obj.tmp", rule,
                        only=tmp_path / "obj.tmp")
    assert json.loads(out) == {"ok": "abcd"}
    called = names(calls)
    if refused == "openat":
        writes = ["openat", "openat", "writev", "fsync", "fadvise64"]
    else:  # O_DIRECT turned off on the open file, which is emptied, then written again
        writes = ["openat", "pwrite64", "fcntl", "fcntl", "ftruncate", "writev", "fsync",
                  "fadvise64"]
        assert "O_DIRECT" not in calls[3] and re.match(r"ftruncate\(\d+, 0\)\s+= 0", calls[4]), (
            calls[:5])
    assert called[: len(writes) + 2] == [*writes, "close", "rename"], calls


def test_bad_arguments_write_nothing(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        _durable.put(tmp_path / "a.tmp", tmp_path / "a", tmp_path, [b"x", 42], False)  # type: ignore[list-item]
    with pytest.raises(TypeError):
        _durable.put(tmp_path / "a.tmp", tmp_path / "a", tmp_path, 42, False)  # type: ignore[arg-type]
    with pytest.raises(ValueError):  # a path with a NUL byte: refused before any system call
        _durable.put(f"{tmp_path}/a\0.tmp", tmp_path / "a", tmp_path, [b"x"], False)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(FileNotFoundError) as e:  # the temporary file's directory is missing
        _durable.put(tmp_path / "no" / "a.tmp", tmp_path / "no" / "a", tmp_path / "no",
                     [b"x"], False)
    assert e.value.filename == tmp_path / "no" / "a.tmp"


@needs_strace
def test_other_threads_run_while_it_waits_for_the_disk(tmp_path: Path) -> None:
    """The file's fsync made to take 300 ms (strace delays it): a Python thread counting
    meanwhile keeps counting (it would stop were the GIL held)."""
    code = f"""
        import json, threading, time
        from s3stream import _durable
        d = {str(tmp_path)!r}
        counts = [0]
        stop = False
        def count():
            while not stop:
                counts[0] += 1
        t = threading.Thread(target=count)
        t.start()
        time.sleep(0.05)
        first = counts[0]
        time.sleep(0.1)  # the thread alone: its pace
        pace = (counts[0] - first) / 0.1
        before = counts[0]
        began = time.monotonic()
        _durable.put(d + "/obj.tmp", d + "/obj", d, [b"x" * 4096], False)
        took = time.monotonic() - began
        during = counts[0] - before
        stop = True
        t.join()
        print(json.dumps({{"took": took, "during": during, "pace": pace}}))
    """
    out, _calls = traced(code, tmp_path, "obj.tmp", "fsync:delay_enter=300000:when=1")
    result = json.loads(out)
    assert result["took"] >= 0.25, result  # the delay applied
    # counting for at least half of those 300 ms (with the GIL held: a switch interval or two)
    assert result["during"] > 0.15 * result["pace"], result


def _collect(writer: _durable.Writer, count: int) -> list[tuple[int, int, object]]:
    """Wait (bounded) on the writer's eventfd until `count` writes are reported."""
    out: list[tuple[int, int, object]] = []
    for _ in range(200):
        if len(out) >= count:
            break
        select.select([writer.fileno()], [], [], 0.05)
        out += writer.completed()
    return out


def test_the_writer_writes_in_order_and_holds_the_buffers_until_collected(
    tmp_path: Path,
) -> None:
    """Writes finish in the order submitted, each reported once with its id; a failed one
    names the path that failed and does not stop the ones after it; a buffer cannot change
    size until its write is collected (its exporter is held, nothing was copied)."""
    writer = _durable.Writer()
    held = bytearray(b"held")
    ids = [writer.submit(tmp_path / "a.tmp", tmp_path / "a", tmp_path, [held, b"!"], True),
           writer.submit(tmp_path / "no" / "b.tmp", tmp_path / "no" / "b", tmp_path / "no",
                         [b"x"], False),
           writer.submit(tmp_path / "c.tmp", tmp_path / "c", tmp_path, [b"c"], False)]
    assert ids == sorted(set(ids))
    select.select([writer.fileno()], [], [], 5)
    with pytest.raises(BufferError):  # written or not, not collected: still held
        held.extend(b"more")
    done = _collect(writer, 3)
    assert [d[0] for d in done] == ids
    assert done[0][1:] == (0, None) and done[2][1:] == (0, None)
    assert done[1][1] == errno.ENOENT and done[1][2] == tmp_path / "no" / "b.tmp"
    held.extend(b"more")  # released once collected
    assert (tmp_path / "a").read_bytes() == b"held!" and (tmp_path / "c").read_bytes() == b"c"
    assert writer.completed() == []
    writer.close()


def test_closing_the_writer_finishes_what_was_submitted(tmp_path: Path) -> None:
    writer = _durable.Writer()
    for i in range(20):
        writer.submit(tmp_path / f"{i}.tmp", tmp_path / str(i), tmp_path, [b"x" * i], False)
    writer.close()  # waits for the thread, which writes all twenty first
    assert sorted(int(p.name) for p in tmp_path.iterdir()) == list(range(20))
    assert len(writer.completed()) == 20
    with pytest.raises(ValueError):
        writer.submit(tmp_path / "late.tmp", tmp_path / "late", tmp_path, [b"x"], False)
    writer.close()  # again: nothing to do
    with pytest.raises(TypeError):
        _durable.Writer(1)  # type: ignore[call-arg]


def test_the_writers_thread_gives_way_to_the_event_loop(tmp_path: Path) -> None:
    """The writer's thread is named (floe-wal-write, for top and py-spy) and scheduled
    SCHED_BATCH: woken by a submit, it does not preempt the thread that woke it (the event
    loop's). Seen failing without the policy (SCHED_OTHER, 0)."""
    writer = _durable.Writer()
    before = set(os.listdir("/proc/self/task"))
    writer.submit(tmp_path / "a.tmp", tmp_path / "a", tmp_path, [b"x"], False)
    assert len(_collect(writer, 1)) == 1
    (tid,) = [int(t) for t in set(os.listdir("/proc/self/task")) - before]
    assert Path(f"/proc/self/task/{tid}/comm").read_text().strip() == "floe-wal-write"
    assert os.sched_getscheduler(tid) == os.SCHED_BATCH
    writer.close()
