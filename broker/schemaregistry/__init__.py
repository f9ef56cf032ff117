"""A Confluent-compatible Schema Registry served by the broker (issue 14, first part).

`SchemaRegistry` (.registry) is the in-process API (register, lookup, get_by_id, latest,
get_version, deletes, config, compatibility checks) over the broker's metadata store (.store);
`serve_registry` (.http) serves Confluent's REST API for it. Schema types and compatibility
rules: .schemas (AVRO via fastavro, JSON via jsonschema, PROTOBUF via protobuf).
"""

from broker.schemaregistry.errors import RegistryError
from broker.schemaregistry.http import serve_registry
from broker.schemaregistry.registry import SchemaRegistry, SubjectVersion
from broker.schemaregistry.store import Reference, StoredSchema

__all__ = ["Reference", "RegistryError", "SchemaRegistry", "StoredSchema", "SubjectVersion",
           "serve_registry"]
