"""`floe local-cluster`: several brokers on one S3-compatible store and metadata database, on
127.0.0.1, for development and for the cluster tests.

Modules: plan (ports, shared URLs, each broker's flags; pure), s3server (moto, buckets),
postgres (a throwaway PostgreSQL), brokers (the child processes), launcher (the command).
"""
