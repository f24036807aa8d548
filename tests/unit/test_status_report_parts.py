"""The pure parts of the status report and its page: cycles read back from statistics rows, the plots'
series, redaction, and the HTML (escaped, no request for anything outside the page)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from reclock import status_page as sp
from reclock import status_report as sr

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def test_cycles_sum_several_descriptions_and_skip_a_cut_off_one():
    rows = [
        ("write_batches", {"seconds": 1.0}, _at(1)),  # the tail of a cycle whose mint is cut off
        ("append", {"seconds": 0.1}, _at(2)),
        ("resume", {"seconds": 0.1}, _at(3)),
        ("mint", {"seconds": 0.5, "offsets_known": 30}, _at(10.5)),
        ("write_batches", {"seconds": 2.0, "records": {"a": 10, "a_errors": 1}, "bytes": {"a": 100}}, _at(12.5)),
        ("write_batches", {"seconds": 2.0, "records": {"a": 19}, "bytes": {"a": 200}}, _at(14.5)),
        ("append", {"seconds": 0.2}, _at(16)),
        ("rebuild", {"seconds": 9.0}, _at(16.1)),
        ("resume", {"seconds": 0.3, "offsets_committed": {"0": 20, "1": 10}}, _at(16.5)),
        ("mint", {"seconds": 0.5}, _at(20)),  # a cycle under way: not complete
    ]
    (c,) = sr.cycles_from_statistics(rows)
    assert (c.mint, c.write_batches, c.append, c.resume) == (0.5, 4.0, 0.2, 0.3)
    assert (c.records, c.bytes, c.offsets_known, c.offsets_committed) == (30, 300, 30, 30)
    assert c.total == 6.5 and round(c.scheduler_gap, 6) == 1.5


def test_series_lag_is_the_backlog_beyond_the_previous_commit():
    def cycle(start: float, known: int, committed: int) -> sr.Cycle:
        return sr.Cycle(_at(start), _at(start + 2), 0.1, 1.0, 0.1, 0.1, 40, 400, known, committed)

    points = sr.series_of([cycle(0, 100, 100), cycle(10, 160, 150), cycle(20, 150, 150)])
    assert [p.lag for p in points] == [None, 60, 0]
    assert [p.throughput for p in points] == [20.0, 20.0, 20.0]


def test_redact_hides_passwords_in_urls_and_assignments():
    text = "postgresql://reclock:pa55@127.0.0.1:5432/r failed; password=hunter2 token: abc"
    out = sr.redact(text)
    assert "pa55" not in out and "hunter2" not in out and "abc" not in out
    assert "postgresql://reclock:***@127.0.0.1:5432/r" in out


def _source(name: str, error: str | None) -> sr.SourceStatus:
    return sr.SourceStatus(name=name, kind="kafka", status="stalled", error=error, status_at=T0, paused=None,
                           upper=1_767_225_600_500, since=0, now_ms=1_767_225_601_000, last_cycle=None,
                           lag=sr.Lag(None, "unknown: KafkaException: timed out"), read_holds=(), errors_count=1)


def test_overview_html_escapes_and_stays_self_contained():
    ov = sr.Overview(T0, (_source("a", "<script>alert(1)</script>"),), ())
    html = sp.overview_html(ov)
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "http://" not in html and "https://" not in html and "src=" not in html
    assert "data-field='upper'>1767225600500<" in html and "0.5s ago" in html


def test_plots_are_inline_svg_with_gaps_for_unknowns_a_time_axis_and_units():
    import re

    t0 = 1767225600  # 2026-01-01 00:00:00 UTC
    svg = sp.svg_plot("lag", [t0 + 1, t0 + 61, t0 + 121], [None, 5, 3 * 2**20], "bytes")
    assert svg.startswith("<svg") and "2 cycles" in svg
    assert len(re.findall(r"<circle ", svg)) == 2  # the unknown is a gap, not a 0
    assert re.findall(r"class='xtick'[^>]*>([^<]+)<", svg) == ["00:01:01", "00:01:31", "00:02:01"]
    assert re.findall(r"class='ytick'[^>]*>([^<]+)<", svg) == ["3.0 MiB", "0"] and "time (UTC)" in svg
    assert re.findall(r"class='ytick'[^>]*>([^<]+)<", sp.svg_plot("t", [1, 2], [0.5, 2.5], "s"))[0] == "2.50 s"
    assert "no data yet" in sp.svg_plot("lag", [], [])


def test_a_probe_that_does_not_answer_in_time_is_an_unknown_lag():
    import threading
    import time

    release = threading.Event()

    def probe(name: str) -> sr.Lag:
        if name == "slow":
            release.wait(5)
        return sr.Lag(1, "ok")

    t = time.monotonic()
    lags = sr._probe_all(probe, ["fast", "slow"], 0.3)
    release.set()
    assert time.monotonic() - t < 2
    assert lags == {"fast": sr.Lag(1, "ok"), "slow": sr.Lag(None, "unknown: no answer in 0.3s")}


def test_a_postgres_source_s_page_speaks_in_lsns_and_wal_bytes_and_its_history_names_steps_and_runs():
    from reclock.persist.status import Status
    from reclock.sources.registry import kind_named

    pg = kind_named("postgres")
    src = sr.SourceStatus(name="shop", kind="postgres", status="running", error=None, status_at=T0, paused=False,
                          upper=1_767_225_600_500, since=0, now_ms=1_767_225_601_000, last_cycle=None,
                          lag=sr.Lag(3 * 2**20, "slot x: confirmed 0/16B3748", "bytes"), read_holds=(),
                          errors_count=0, dags=("ingest__shop",))
    d = sr.SourceDetail(src, (sr.BindingRow(1_767_225_600_499, ("0/16B3748",)),),
                        (Status("shop", "stalled", "append: boom", T0, "append", "manual__1", "cycle.py:1 in f"),
                         Status("shop", "running", None, T0, "resume", None)), (), pg.progress_columns)
    html = sp.source_html(d)
    assert "<th>lsn</th>" in html and ">0/16B3748<" in html and "partition" not in html
    assert "3.0 MiB" in html and "lag at mint (bytes of WAL)" in html
    assert "data-field='step'>append<" in html and "/dags/ingest__shop/runs/manual__1" in html
    assert "<summary class='muted'>trace</summary><pre class='muted'>cycle.py:1 in f</pre>" in html
    assert "outside Airflow" in html  # a step run by `reclock cycle`
    assert pg.position_text(0, 0x16B3748) == "LSN 0/16B3748" and kind_named("kafka").position_text(2, 40) == \
        "partition 2 offset 40"
    assert sr.Lag(1234, "g").text() == "1,234 records" and sr.Lag(None).text() == "unknown"
    assert sr.Lag(1, "", "objects").text() == "1 object" and sr.Lag(1).text() == "1 record"


def test_redact_hides_every_kind_of_credential_a_message_may_quote():
    from reclock.redaction import redact

    cases = {
        "sc://127.0.0.1:15002/;token=t0k3n;use_ssl=true": "t0k3n",
        'ScramLoginModule required username="reclock" password="s3cr3t";': "s3cr3t",
        '{"sasl.password": "xyz1", "aws_secret_access_key": "k3y"}': ("xyz1", "k3y"),
        "key -----BEGIN PRIVATE KEY-----\nMIIabc\n-----END PRIVATE KEY----- done": "MIIabc",
        "kafka at 127.0.0.1:9093 refused the connection": (),
    }
    for text, secrets in cases.items():
        out = redact(text)
        for s in (secrets,) if isinstance(secrets, str) else secrets:
            assert s not in out, out
    assert redact("kafka at 127.0.0.1:9093 refused the connection") == "kafka at 127.0.0.1:9093 refused the connection"
    assert redact(None) is None
