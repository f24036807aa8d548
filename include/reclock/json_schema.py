"""A JSON Schema (as a Schema Registry holds one for ``format: json_schema``) as a collection's columns (pure).

A record's JSON is parsed by Spark's ``from_json`` into the Spark type of its schema
(``reclock.spark.registry_decode.json_decoded``): JSON matches fields by name, so one reader type serves
every writer whose fields fit it. The mapping:

==========================================  ============================================================
JSON Schema                                 Spark type
==========================================  ============================================================
``integer``                                 ``bigint``
``number``                                  ``double``
``string`` (any ``format``)                 ``string`` (the text as it is: no value changes on its way)
``boolean``                                 ``boolean``
``array`` of ``items``                      ``array<items>``
``object`` with ``properties``              ``struct<...>`` (the properties in their order)
``object`` with only ``additionalProperties``  ``map<string, ...>``
``["T", "null"]``, ``nullable``             T, nullable
==========================================  ============================================================

A property is nullable unless it is ``required`` and its type excludes ``null``. A schema this cannot map
(``$ref``, ``oneOf``/``anyOf`` of several types, a type list of several non-null types, an object without
properties) is a :class:`JsonSchemaError` naming the property: such a writer's records cannot be read as
columns, and the source says so.
"""

from __future__ import annotations

import json
from typing import Any

from reclock.schema_evolution import CollectionSchema, Column, _struct

__all__ = ["JsonSchemaError", "collection_schema", "spark_type"]

_PRIMITIVES = {"integer": "bigint", "number": "double", "string": "string", "boolean": "boolean"}


class JsonSchemaError(ValueError):
    """A JSON Schema Reclock cannot map to columns (the property's path first)."""


def _types(node: dict, path: str) -> tuple[str, bool]:
    """The one non-null JSON type of ``node`` and whether it admits null."""
    if "$ref" in node:
        raise JsonSchemaError(f"{path or '(root)'}: $ref is not resolved (inline the referenced schema)")
    for key in ("oneOf", "anyOf"):
        if key in node:
            branches = node[key]
            non_null = [b for b in branches if not (isinstance(b, dict) and b.get("type") == "null")]
            if len(non_null) != 1 or not isinstance(non_null[0], dict):
                raise JsonSchemaError(f"{path or '(root)'}: {key} of several types has no column type")
            t, nullable = _types(non_null[0], path)
            return t, nullable or len(non_null) < len(branches)
    t = node.get("type")
    if t is None:
        if "properties" in node:
            return "object", bool(node.get("nullable", False))
        raise JsonSchemaError(f"{path or '(root)'}: no `type`")
    if isinstance(t, list):
        non_null = [x for x in t if x != "null"]
        if len(non_null) != 1:
            raise JsonSchemaError(f"{path or '(root)'}: type {t} is not one type (and null)")
        return non_null[0], len(non_null) < len(t) or bool(node.get("nullable", False))
    return t, t == "null" or bool(node.get("nullable", False))


def _branch(node: dict) -> dict:
    for key in ("oneOf", "anyOf"):
        if key in node:
            return next(b for b in node[key] if not (isinstance(b, dict) and b.get("type") == "null"))
    return node


def spark_type(node: Any, path: str = "") -> tuple[str, bool]:
    """The Spark SQL type string of a JSON Schema node, and whether it may be null."""
    if not isinstance(node, dict):
        raise JsonSchemaError(f"{path or '(root)'}: a schema must be an object, got {node!r}")
    t, nullable = _types(node, path)
    node = _branch(node)
    if t in _PRIMITIVES:
        return _PRIMITIVES[t], nullable
    if t == "array":
        items = node.get("items")
        if not isinstance(items, dict):
            raise JsonSchemaError(f"{path}: an array needs one `items` schema")
        return f"array<{spark_type(items, path + '[]')[0]}>", nullable
    if t == "object":
        props = node.get("properties")
        if props:
            fields = [(name, spark_type(sub, f"{path}.{name}" if path else name)[0]) for name, sub in props.items()]
            return _struct(fields), nullable
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            return f"map<string,{spark_type(extra, path + '{}')[0]}>", nullable
        raise JsonSchemaError(f"{path or '(root)'}: an object without `properties` has no columns")
    raise JsonSchemaError(f"{path or '(root)'}: type {t!r} has no column type")


def collection_schema(schema: str | dict) -> CollectionSchema:
    """A JSON Schema of an object as the collection's columns (one per property, in order)."""
    s = json.loads(schema) if isinstance(schema, str) else schema
    if not isinstance(s, dict):
        raise JsonSchemaError(f"(root): a schema must be an object, got {s!r}")
    t, _ = _types(s, "")
    s = _branch(s)
    if t != "object" or not s.get("properties"):
        raise JsonSchemaError("(root): the schema of a record must be an object with `properties`")
    required = set(s.get("required", ()))
    cols = []
    for name, sub in s["properties"].items():
        ft, nullable = spark_type(sub, name)
        cols.append(Column(name, ft, nullable or name not in required))
    return CollectionSchema(tuple(cols))
