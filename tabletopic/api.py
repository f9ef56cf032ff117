"""The table operations on the broker's admin port (broker/admin.py routes `/tables/...` here;
`floe table ...` in broker/table_cli.py is the client):

  GET  /tables/T/lineage                      every snapshot with its offset ranges
  GET  /tables/T/locate?partition=P&offset=O  the snapshot that first holds a record
  POST /tables/T/pause[?reason=...]           POST /tables/T/resume
  POST /tables/T/rollback?snapshot=S
  POST /tables/T/rebuild?from=P:O[,P:O...]    or ?all=true
  POST /tables/T/replay-dlq[?dry_run=true]

Answers are JSON: the result, or {"error": "..."} with 400 (bad arguments), 404 (unknown
route), 409 (refused: see tabletopic.ops) or 503 (the writer did not stop in time).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pyiceberg.exceptions import CommitFailedException, NoSuchTableError

from tabletopic import lazyload
from tabletopic.ops import OperationError, TableOps

if TYPE_CHECKING:
    from tabletopic.replay import DlqReplay

log = logging.getLogger(__name__)
Answer = tuple[int, dict[str, Any]]


def parse_from(text: str) -> dict[int, int]:
    """'0:5,1:7' -> {0: 5, 1: 7}; ValueError for anything else."""
    out: dict[int, int] = {}
    for item in text.split(","):
        p, sep, o = item.partition(":")
        if not sep:
            raise ValueError(f"from: {item!r} is not PARTITION:OFFSET")
        if int(p) < 0 or int(o) < 0:
            raise ValueError(f"from: {item!r}: partition and offset must be >= 0")
        out[int(p)] = int(o)
    return out


class TableApi:
    def __init__(self, ops: TableOps) -> None:
        self.ops = ops
        self.replay: DlqReplay | None = None  # made with the first replay (it loads pyarrow)

    async def handle(self, method: str, path: str, query: dict[str, str]) -> Answer:
        parts = path.strip("/").split("/")
        if len(parts) != 3 or parts[0] != "tables":
            return 404, {"error": f"no route {path}"}
        topic, action = parts[1], parts[2]
        try:
            return 200, await self._dispatch(method, topic, action, query)
        except KeyError as e:
            return 400, {"error": f"missing parameter {e}"}
        except LookupError as e:
            return 404, {"error": str(e)}
        except ValueError as e:
            return 400, {"error": str(e)}
        except OperationError as e:
            return 409, {"error": str(e)}
        except NoSuchTableError as e:
            return 409, {"error": f"the table of {topic} does not exist yet: {e}"}
        except CommitFailedException as e:
            return 409, {"error": f"the table changed meanwhile, nothing was done: {e}"}
        except TimeoutError as e:
            return 503, {"error": str(e)}
        except Exception as e:  # a catalog or store error: the operation did not finish
            log.exception("table operation %s %s on %s failed", method, action, topic)
            return 500, {"error": f"{type(e).__name__}: {e}"}

    async def _dispatch(
        self, method: str, topic: str, action: str, q: dict[str, str]
    ) -> dict[str, Any]:
        ops = self.ops
        if method == "GET" and action == "lineage":
            return await ops.lineage(topic)
        if method == "GET" and action == "locate":
            return await ops.locate(topic, int(q["partition"]), int(q["offset"]))
        if method != "POST":
            raise LookupError(f"no route {method} /tables/{topic}/{action}")
        if action == "pause":
            return await ops.pause(topic, q.get("reason") or "paused by an operator")
        if action == "resume":
            return await ops.resume(topic)
        if action == "rollback":
            return await ops.rollback(topic, int(q["snapshot"]))
        if action == "rebuild":
            if q.get("all") == "true":
                return await ops.rebuild(topic, None)
            if "from" not in q:
                raise ValueError("rebuild needs from=P:O[,P:O...] or all=true")
            return await ops.rebuild(topic, parse_from(q["from"]))
        if action == "replay-dlq":
            cfg = ops.config(topic)
            if cfg.upsert:
                raise OperationError(f"{topic} is an upsert table: replay-dlq appends rows and "
                                     "does not merge them by key yet")
            if self.replay is None:
                await lazyload.load("tabletopic.replay")  # it loads pyarrow
                from tabletopic.replay import DlqReplay

                if self.replay is None:  # the import awaited: another replay may have made it
                    self.replay = DlqReplay(ops.storage, ops.catalog, None)
            self.replay.schemas = ops.tables.schemas
            return await self.replay.run(topic, cfg, q.get("dry_run") == "true",
                                         lambda: ops.held(topic, "replay-dlq"))
        raise LookupError(f"no route POST /tables/{topic}/{action}")
