"""Spark on the broker's Iceberg tables: maintenance jobs (compaction, manifests, snapshot
expiry, orphan files), the policy that decides when they run, and `floe compact` / `floe sql`."""
