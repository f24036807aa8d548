"""The status report as HTML: the overview page and one source's page, plots drawn here as inline SVG
(nothing is fetched at view time). Pure: values of ``reclock.status_report`` in, a string out; every text
is escaped. The Airflow plugin (``plugins/reclock_status.py``) serves these pages.
"""

from __future__ import annotations

from html import escape
from typing import Sequence
from urllib.parse import quote

from reclock.status_report import (Overview, SinkStatus, SourceDetail, SourceStatus, age, secs, status_text,
                                   ts_text)

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:16px;color:#1d2433;background:#fff}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:20px 0 6px}
table{border-collapse:collapse;width:100%;margin-bottom:8px} td,th{padding:4px 8px;border-bottom:1px solid #e3e6ec;
text-align:left;vertical-align:top} th{background:#f4f6fa;font-weight:600} td.n{text-align:right;
font-variant-numeric:tabular-nums} .muted{color:#6b7385;font-size:12px}
.st{display:inline-block;padding:1px 8px;border-radius:9px;font-weight:600;font-size:12px}
.running{background:#d8f3dc;color:#1b5e20} .stalled,.failed{background:#fde2e1;color:#a4161a}
.paused{background:#e9ecef;color:#495057} .starting,.never{background:#fff3bf;color:#7a5d00}
.err{color:#a4161a;font-size:12px;min-width:200px;max-width:360px;overflow-wrap:anywhere} a{color:#1f5fbf}
.split{display:flex;height:10px;width:160px;border-radius:3px;overflow:hidden;background:#eee}
.split span{display:block;height:100%} .charts{display:flex;flex-wrap:wrap;gap:16px}
"""
SPLIT_COLOURS = (("mint", "#4c6ef5"), ("write_batches", "#f08c00"), ("append", "#2f9e44"),
                 ("resume", "#ae3ec9"), ("scheduler gap", "#adb5bd"))


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{body}</body></html>")


def _badge(status: str | None, paused: bool | None) -> str:
    text = status_text(status, paused)
    css = "paused" if paused else (status or "never")
    return f"<span class='st {escape(css)}'>{escape(text)}</span>"


def _dag_links(dags: Sequence[str], airflow_root: str) -> str:
    return " ".join(f"<a target='_top' href='{escape(airflow_root)}dags/{quote(d)}'>{escape(d)}</a>" for d in dags)


def _split_bar(s: SourceStatus) -> str:
    c = s.last_cycle
    if c is None or c.total <= 0:
        return "<span class='muted'>no complete cycle</span>"
    parts = (c.mint, c.write_batches, c.append, c.resume, c.scheduler_gap)
    spans = "".join(f"<span title='{name} {secs(x)}' style='width:{100 * (x or 0) / c.total:.1f}%;"
                    f"background:{colour}'></span>" for (name, colour), x in zip(SPLIT_COLOURS, parts))
    words = " + ".join(f"{name} {secs(x)}" for (name, _), x in zip(SPLIT_COLOURS, parts))
    return (f"<div class='split'>{spans}</div><div class='muted' data-field='split'>{secs(c.total)} = "
            f"{escape(words)}</div>")


def _ago(seconds: float | None) -> str:
    return "" if seconds is None else f"{age(seconds)} ago"


def _source_row(s: SourceStatus, airflow_root: str) -> str:
    c = s.last_cycle
    holds = "".join(f"<div>{escape(h.holder)} <span class='muted'>on {escape(h.shard)} at</span> {h.ts}</div>"
                    for h in s.read_holds) or "none"
    newest = s.errors_latest[0] if s.errors_latest else None
    latest = (f"<div class='muted' title='{escape(str(newest.get('reason', '')))}'>newest: partition "
              f"{escape(str(newest.get('partition')))} offset {escape(str(newest.get('offset')))}</div>"
              if newest else "")
    err = f"<div class='err' data-field='error'>{escape(s.error)}</div>" if s.status == "stalled" and s.error else ""
    lag = "unknown" if s.lag.records is None else f"{s.lag.records:,}" + ("" if s.lag.unit == "records" else
                                                                          f" {s.lag.unit}")
    return (
        f"<tr data-source='{escape(s.name)}'><td><a href='source/{quote(s.name)}'><b>{escape(s.name)}</b></a>"
        f"<div class='muted'>{escape(s.kind)}</div></td>"
        f"<td><span data-field='status'>{_badge(s.status, s.paused)}</span>{err}</td>"
        f"<td><span data-field='upper'>{s.upper}</span><div>{ts_text(s.upper)}</div>"
        f"<div class='muted'>{_ago(s.upper_age_s)}</div></td>"
        f"<td><span data-field='since'>{s.since}</span><div>{ts_text(s.since)}</div>"
        f"<div class='muted'>{_ago(s.since_age_s)}</div></td>"
        f"<td>{_split_bar(s)}</td>"
        f"<td class='n' data-field='records'>{c.records if c else '-'}</td>"
        f"<td class='n' data-field='bytes'>{c.bytes if c else '-'}</td>"
        f"<td class='n'><span data-field='lag'>{lag}</span><div class='muted'>{escape(s.lag.detail)}</div></td>"
        f"<td data-field='holds'>{holds}</td><td class='n'><span data-field='errors'>{s.errors_count}</span>{latest}</td>"
        f"<td>{_dag_links(s.dags, airflow_root)}</td></tr>")


def _sink_row(k: SinkStatus, airflow_root: str) -> str:
    err = f"<div class='err'>{escape(k.error)}</div>" if k.status == "stalled" and k.error else ""
    dash = lambda x: "-" if x is None else str(x)  # noqa: E731
    return (f"<tr data-sink='{escape(k.name)}'><td><b>{escape(k.name)}</b></td><td>{escape(dash(k.collection))}</td>"
            f"<td>{_badge(k.status, k.paused)}{err}</td><td class='n' data-field='frontier'>{dash(k.frontier)}</td>"
            f"<td class='n' data-field='lag_ms'>{dash(k.lag_ms)}</td><td class='n'>{dash(k.read_hold)}</td>"
            f"<td class='n'>{dash(k.messages)}</td><td class='n'>{dash(k.bytes)}</td><td class='n'>{secs(k.seconds)}</td>"
            f"<td>{_dag_links(k.dags, airflow_root)}</td></tr>")


def overview_html(ov: Overview, airflow_root: str = "/") -> str:
    """The overview page: one row per source and per sink."""
    rows = "".join(_source_row(s, airflow_root) for s in ov.sources) or "<tr><td colspan=11>no sources yet</td></tr>"
    sinks = "".join(_sink_row(k, airflow_root) for k in ov.sinks) or "<tr><td colspan=10>no sinks</td></tr>"
    legend = " ".join(f"<span style='color:{c}'>&#9632;</span> {n}" for n, c in SPLIT_COLOURS)
    body = (
        f"<h1>Reclock</h1><div class='muted'>as of {ov.generated_at:%Y-%m-%d %H:%M:%S} UTC &middot; "
        f"<a href='api/overview'>JSON</a></div>"
        "<h2>Sources</h2><table><tr><th>source</th><th>status</th><th>upper</th><th>since</th>"
        f"<th>last cycle <span class='muted'>{legend}</span></th><th>records</th><th>bytes</th>"
        f"<th>lag</th><th>read holds</th><th>errors</th><th>DAGs</th></tr>{rows}</table>"
        "<h2>Sinks</h2><table><tr><th>sink</th><th>collection</th><th>status</th><th>frontier</th><th>lag (ms)</th>"
        "<th>read hold</th><th>messages</th><th>bytes</th><th>step time</th><th>DAG</th></tr>"
        f"{sinks}</table>")
    return _page("Reclock", body)


def svg_plot(title: str, xs: Sequence[float], ys: Sequence[float | None], unit: str = "",
             width: int = 420, height: int = 160) -> str:
    """A line plot of ``ys`` over ``xs`` (None: a gap) as inline SVG, with its range labelled."""
    pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
    head = f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' role='img' " \
           f"aria-label='{escape(title)}'><text x='4' y='14' font-size='12' font-weight='600'>{escape(title)}</text>"
    if not pts:
        return head + f"<text x='4' y='{height // 2}' font-size='12' fill='#6b7385'>no data yet</text></svg>"
    left, top, right, bottom = 48, 22, width - 8, height - 18
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y1 = max(p[1] for p in pts) or 1.0
    sx = (right - left) / ((x1 - x0) or 1.0)
    sy = (bottom - top) / y1
    line = " ".join(f"{left + (x - x0) * sx:.1f},{bottom - y * sy:.1f}" for x, y in pts)
    return (head + f"<line x1='{left}' y1='{bottom}' x2='{right}' y2='{bottom}' stroke='#ccc'/>"
            f"<line x1='{left}' y1='{top}' x2='{left}' y2='{bottom}' stroke='#ccc'/>"
            f"<text x='{left - 4}' y='{top + 8}' font-size='10' text-anchor='end'>{y1:,.4g}</text>"
            f"<text x='{left - 4}' y='{bottom}' font-size='10' text-anchor='end'>0</text>"
            f"<text x='{right}' y='{height - 4}' font-size='10' text-anchor='end' fill='#6b7385'>{len(pts)} cycles"
            f"{(' · ' + escape(unit)) if unit else ''}</text>"
            f"<polyline fill='none' stroke='#1f5fbf' stroke-width='1.5' points='{line}'/></svg>")


def source_html(d: SourceDetail, airflow_root: str = "/") -> str:
    """One source's page: its row of the overview, plots of throughput, lag and cycle time, its bindings
    and its status history."""
    s = d.source
    xs = [p.at.timestamp() for p in d.series]
    plots = "".join((
        svg_plot("throughput (records/s)", xs, [p.throughput for p in d.series], "records per second of cycle"),
        svg_plot("lag at mint (records)", xs, [p.lag for p in d.series], "offsets beyond the last commit"),
        svg_plot("cycle time (s)", xs, [p.cycle_s for p in d.series], "wall time, mint to resume"),
    ))
    bindings = "".join(f"<tr><td class='n'>{b.ts}</td><td>{ts_text(b.ts)}</td><td class='n'>{b.partition}</td>"
                       f"<td class='n'>{b.offset}</td></tr>" for b in d.bindings)
    errors = "".join(f"<tr><td class='n'>{escape(str(e.get('ts')))}</td><td class='n'>{escape(str(e.get('partition')))}"
                     f"</td><td class='n'>{escape(str(e.get('offset')))}</td><td class='err'>"
                     f"{escape(str(e.get('reason')))}</td></tr>" for e in s.errors_latest)
    history = "".join(f"<tr><td>{h.at:%Y-%m-%d %H:%M:%S}</td><td>{_badge(h.status, None)}</td>"
                      f"<td class='err'>{escape(h.error or '')}</td></tr>" for h in d.history)
    body = (
        f"<div><a href='../'>&larr; all sources</a></div><h1>{escape(s.name)}</h1>"
        f"<div class='muted'><a href='../api/source/{quote(s.name)}'>JSON</a></div>"
        "<table><tr><th>source</th><th>status</th><th>upper</th><th>since</th>"
        "<th>last cycle</th><th>records</th><th>bytes</th><th>lag</th><th>read holds</th><th>errors</th><th>DAGs</th>"
        f"</tr>{_source_row(s, airflow_root).replace(chr(39) + 'source/', chr(39))}</table>"
        f"<h2>Over time</h2><div class='charts'>{plots}</div>"
        f"<h2>Errors <span class='muted'>({s.errors_count} in the error collection; newest first)</span></h2>"
        f"<table><tr><th>ts</th><th>partition</th><th>offset</th><th>reason</th></tr>{errors}</table>"
        f"<h2>Bindings <span class='muted'>(the {escape(s.name)}_progress relation, newest first)</span></h2>"
        f"<table><tr><th>ts</th><th>time</th><th>partition</th><th>offset</th></tr>{bindings}</table>"
        f"<h2>Status history <span class='muted'>(newest first)</span></h2>"
        f"<table><tr><th>at</th><th>status</th><th>error</th></tr>{history}</table>")
    return _page(f"Reclock: {s.name}", body)
