"""A Kafka source's registry formats in the config: ``format: {type: avro | json_schema, registry: ...}`` and
``schema: fixed | evolve``; every mistake names the source and the key."""

from __future__ import annotations

import json

import pytest

from reclock.config import RegistrySpec, parse_source
from reclock.errors import ConfigError


def source(fmt, **extra):
    return parse_source("orders", {"kafka": {"topic": "orders", "bootstrap": "b:1"}, "format": fmt, **extra})


def test_defaults_and_keys(tmp_path):
    s = source({"type": "avro", "registry": {}})
    assert s.format.registry == RegistrySpec("reclock_registry", None, "orders-value")
    assert (s.format.wire, s.format.schema, s.schema_mode) == ("confluent", None, "fixed")
    s = source({"type": "json_schema", "registry": {"url": "https://sr:8081", "subject": "o"}}, schema="evolve")
    assert s.format.registry == RegistrySpec("reclock_registry", "https://sr:8081", "o") and s.schema_mode == "evolve"
    avsc = tmp_path / "o.avsc"
    avsc.write_text(json.dumps({"type": "record", "name": "o", "fields": [{"name": "id", "type": "long"}]}))
    s = source({"type": "avro", "schema_file": str(avsc), "registry": {"connection": "shop_registry"}})
    assert json.loads(s.format.schema)["name"] == "o" and s.format.registry.connection == "shop_registry"


@pytest.mark.parametrize("fmt, extra, words", [
    ({"type": "json_schema"}, {}, "format: type json_schema needs `registry:`"),
    ({"type": "json", "schema": "a INT", "registry": {}}, {}, "format: `registry:` is for avro, json_schema, protobuf"),
    ({"type": "protobuf"}, {}, "format: type protobuf needs `registry:`"),
    ({"type": "avro", "registry": {}, "wire": "plain"}, {}, "format: records read through a registry are in the "
                                                           "Confluent wire format"),
    ({"type": "avro", "registry": {"user": "x"}}, {}, "format.registry: unknown key"),
    ({"type": "avro", "registry": {"url": "sr:8081"}}, {}, "format.registry: url 'sr:8081' is not an http"),
    ({"type": "avro", "registry": {}}, {"schema": "sometimes"}, "schema 'sometimes' is not one of fixed, evolve"),
    ({"type": "json", "schema": "a INT"}, {"schema": "evolve"}, "`schema: evolve` needs writer schemas from a "
                                                                "registry"),
])
def test_mistakes_say_what_to_fix(fmt, extra, words):
    with pytest.raises(ConfigError, match=f"source orders.*{words}"):
        source(fmt, **extra)
