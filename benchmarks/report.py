"""Collecting figures and target checks, and writing them out: a stdout table, ``results.md``,
``results.json`` and ``results.png``.

In ``results.json`` every figure is ``{name, unit, median, min, max}`` over its repetitions, and every
ratio or target check is ``{name, value, target, op, met}`` (``op`` is ``>=`` or ``<=``: how ``value``
must compare with ``target``).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Figure:
    name: str
    unit: str
    values: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "unit": self.unit, "median": statistics.median(self.values),
                "min": min(self.values), "max": max(self.values)}


@dataclass(frozen=True)
class Ratio:
    name: str
    value: float
    target: float
    op: str  # ">=" or "<="
    note: str = ""

    @property
    def met(self) -> bool:
        return self.value >= self.target if self.op == ">=" else self.value <= self.target

    def summary(self) -> dict[str, Any]:
        out = {"name": self.name, "value": self.value, "target": self.target, "op": self.op, "met": self.met}
        if self.note:
            out["note"] = self.note
        return out


@dataclass
class Results:
    """Every figure (name -> repetitions) and target check of one run, in the order they were added."""

    meta: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, Figure] = field(default_factory=dict)
    ratios: list[Ratio] = field(default_factory=list)

    def add(self, name: str, unit: str, value: float) -> None:
        """One repetition's value of figure ``name``."""
        fig = self.figures.setdefault(name, Figure(name, unit))
        if fig.unit != unit:
            raise ValueError(f"figure {name}: unit {unit!r} differs from {fig.unit!r}")
        fig.values.append(float(value))

    def median(self, name: str) -> float | None:
        fig = self.figures.get(name)
        return statistics.median(fig.values) if fig and fig.values else None

    def check(self, name: str, value: float | None, target: float, op: str, note: str = "") -> None:
        """Record a ratio or bound; skipped (with nothing recorded) when ``value`` could not be measured."""
        if op not in (">=", "<="):
            raise ValueError(f"check {name}: op must be >= or <=, got {op!r}")
        if value is not None:
            self.ratios.append(Ratio(name, float(value), target, op, note))

    def to_json(self) -> dict[str, Any]:
        return {"meta": self.meta, "figures": [f.summary() for f in self.figures.values() if f.values],
                "ratios": [r.summary() for r in self.ratios]}


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}" if abs(v) < 1 else f"{v:.2f}"


def _pivot(results: Results, prefix: str) -> dict[str, dict[str, float]]:
    """``{contender: {size: median}}`` of the figures named ``<prefix><contender>_<size>``."""
    out: dict[str, dict[str, float]] = {}
    for name, f in results.figures.items():
        if name.startswith(prefix) and f.values:
            contender, size = name[len(prefix):].rsplit("_", 1)
            out.setdefault(contender, {})[size] = statistics.median(f.values)
    return out


def summary(results: Results) -> str:
    """Throughput and peak memory as contender x backlog tables (medians), if there are any."""
    rates, mbs = _pivot(results, "throughput_records_"), _pivot(results, "throughput_mb_")
    memory = _pivot(results, "memory_peak_total_")
    if not rates:
        return ""
    sizes = list(dict.fromkeys(s for per in rates.values() for s in per))
    lines = ["| throughput, records/s (MB/s) | " + " | ".join(sizes) + " |",
             "|---|" + "---:|" * len(sizes)]
    for c, per in rates.items():
        lines.append(f"| {c} | " + " | ".join(f"{_fmt(per[s])} ({_fmt(mbs[c][s])})" if s in per else ""
                                               for s in sizes) + " |")
    lines += ["", "| peak RSS, MB (driver + Spark JVM) | " + " | ".join(sizes) + " |",
              "|---|" + "---:|" * len(sizes)]
    for c, per in memory.items():
        lines.append(f"| {c} | " + " | ".join(_fmt(per[s]) if s in per else "" for s in sizes) + " |")
    return "\n".join(lines) + "\n\n"


def table(results: Results) -> str:
    """The summary, every figure, then the ratios and targets, as Markdown (which reads well on a terminal)."""
    lines = ["| figure | unit | median | min | max |", "|---|---|---:|---:|---:|"]
    for f in results.figures.values():
        if f.values:
            s = f.summary()
            lines.append(f"| {f.name} | {f.unit} | {_fmt(s['median'])} | {_fmt(s['min'])} | {_fmt(s['max'])} |")
    lines += ["", "| ratio / target | value | target | met |", "|---|---:|---:|---|"]
    for r in results.ratios:
        note = f" ({r.note})" if r.note else ""
        lines.append(f"| {r.name}{note} | {r.value:.2f} | {r.op} {r.target:g} | {'yes' if r.met else '**no**'} |")
    return summary(results) + "\n".join(lines)


def write_markdown(results: Results, path: Path) -> None:
    meta = results.meta
    reps = f"{meta.get('reps')} repetition(s)"
    if meta.get("large_reps", meta.get("reps")) != meta.get("reps"):
        reps += f", {meta.get('large_reps')} at the large backlog"
    head = [f"# Reclock benchmarks: `--size {meta.get('size')}`, {reps}", "",
            f"Run {meta.get('started')} on {meta.get('machine')}; took {meta.get('seconds', 0):.0f} s. "
            "Figures are medians of the repetitions (min, max beside them); every ratio compares medians.",
            ""]
    backlogs = meta.get("backlogs", {})
    if backlogs:
        head += ["Backlogs: " + ", ".join(f"{k} = {v['records']:,} records ({v['megabytes']:.0f} MB)"
                                          for k, v in backlogs.items()) + ".", ""]
    notes = meta.get("notes", [])
    tail = ["", "Notes:", "", *[f"- {n}" for n in notes]] if notes else []
    path.write_text("\n".join(head) + "\n" + table(results) + "\n" + "\n".join(tail) + "\n")


def write_json(results: Results, path: Path) -> None:
    path.write_text(json.dumps(results.to_json(), indent=2) + "\n")


def write_png(results: Results, path: Path, contenders: list[str], sizes: list[str]) -> bool:
    """Throughput (records/s) per contender and backlog size, and peak memory beside it; False if matplotlib
    is not installed (nothing is written then)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    width = 0.8 / max(1, len(contenders))
    for i, c in enumerate(contenders):
        xs = [j + i * width for j in range(len(sizes))]
        for ax, prefix, scale in ((ax1, "throughput_records", 1e3), (ax2, "memory_peak_total", 1.0)):
            figs = [results.figures.get(f"{prefix}_{c}_{s}") for s in sizes]
            med = [statistics.median(f.values) / scale if f and f.values else 0 for f in figs]
            lo = [m - min(f.values) / scale if f and f.values else 0 for m, f in zip(med, figs)]
            hi = [max(f.values) / scale - m if f and f.values else 0 for m, f in zip(med, figs)]
            ax.bar(xs, med, width, yerr=[lo, hi], capsize=2, label=c)
    labels = [f"{s}\n{results.meta.get('backlogs', {}).get(s, {}).get('records', 0):,}" for s in sizes]
    for ax, title, unit in ((ax1, "Ingest throughput (median, min-max)", "thousand records/s"),
                            (ax2, "Peak RSS: driver + Spark JVM", "MB")):
        ax.set_xticks([j + width * (len(contenders) - 1) / 2 for j in range(len(sizes))], labels)
        ax.set_title(title)
        if ax is ax1:
            ax.set_yscale("log")
        ax.set_ylabel(unit)
        ax.grid(axis="y", alpha=0.3)
    ax1.legend(fontsize=8)
    fig.suptitle(f"Reclock benchmarks (--size {results.meta.get('size')}, {results.meta.get('machine')})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
