"""``reclock.grants``: the ACLs and grants a config needs, derived once (the secured tests grant exactly
these, and ``reclock grants`` prints them)."""

from __future__ import annotations

from reclock.config import parse_config
from reclock.grants import KafkaAcl, cdc_grants, consensus_grants, kafka_acls

CONFIG = parse_config({
    "sources": {"orders": {"kafka": {"topic": "orders", "connection": "k"}, "format": {"type": "text"}},
                "clicks": {"kafka": {"topic": "clicks", "connection": "other"}, "format": {"type": "text"}},
                "shop": {"postgres": {"dsn_env": "SHOP_DSN", "publication": "p"}, "tables": ["public.o"]}},
    "sinks": {"out": {"from": "orders", "kafka": {"topic": "orders_out", "connection": "k"}},
              "out2": {"from": "orders", "kafka": {"topic": "orders_out2", "connection": "k"}}}})


def test_kafka_acls_are_exactly_what_sources_and_sinks_need():
    acls = {(a.resource_type, a.name, a.operation) for a in kafka_acls(CONFIG, "k")}
    assert acls == {
        ("TOPIC", "orders", "DESCRIBE"), ("TOPIC", "orders", "READ"), ("GROUP", "reclock-orders", "READ"),
        *{("TOPIC", t, op) for t in ("orders_out", "orders_out2", "_reclock_progress")
          for op in ("DESCRIBE", "READ", "WRITE")},
        ("TRANSACTIONAL_ID", "reclock-sink-out", "WRITE"), ("TRANSACTIONAL_ID", "reclock-sink-out2", "WRITE"),
        *{("GROUP", f"reclock-sink-{s}-{g}", "DESCRIBE") for s in ("out", "out2") for g in ("progress", "check")}}
    progress = [a for a in kafka_acls(CONFIG, "k") if a.name == "_reclock_progress" and a.operation == "WRITE"]
    assert len(progress) == 1 and progress[0].why == "sink out, sink out2"  # one ACL, both reasons
    assert {a.name for a in kafka_acls(CONFIG, "other")} == {"clicks", "reclock-clicks"}
    assert not any(a.operation == "CREATE" for a in kafka_acls(CONFIG))


def test_acl_command_and_sql():
    line = KafkaAcl("TRANSACTIONAL_ID", "reclock-sink-out", "WRITE").command("User:reclock")
    assert "--allow-principal User:reclock --operation Write --transactional-id reclock-sink-out" in line
    assert consensus_grants('we"ird', "db")[2] == 'CREATE SCHEMA reclock AUTHORIZATION "we""ird"'
    assert cdc_grants("cdc", ["public.o", "s2.t"], "up") == (
        'ALTER ROLE "cdc" REPLICATION', 'GRANT CONNECT ON DATABASE "up" TO "cdc"',
        'GRANT USAGE ON SCHEMA "public" TO "cdc"', 'GRANT USAGE ON SCHEMA "s2" TO "cdc"',
        'GRANT SELECT ON TABLE "public"."o" TO "cdc"', 'GRANT SELECT ON TABLE "s2"."t" TO "cdc"')


def test_the_grants_docs_security_lists_are_exactly_the_derived_ones():
    """docs/security.md lists the Postgres grants by hand: they are exactly what ``reclock grants`` prints
    for its example (consensus database ``reclock``, role ``reclock_app``; ``shop``'s CDC role ``reclock_cdc``)."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    (block,) = [b for b in re.findall(r"```sql\n(.*?)```", doc, re.S) if "GRANT" in b]
    listed = [line.split("--")[0].strip().rstrip(";") for line in block.splitlines()]
    listed = [s for s in listed if s and not s.startswith("CREATE PUBLICATION")]
    derived = [*consensus_grants("reclock_app", "reclock"),
               *cdc_grants("reclock_cdc", ["public.orders", "public.items"], "shop")]
    assert listed == derived
