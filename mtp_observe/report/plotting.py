"""The picture: `report --plot FILE.png`, the report's numbers versus K with their bootstrap bands.

Contract: `plot(report, path, comparison)` writes a PNG (matplotlib's Agg canvas, imported on use) and returns
its path; `figure(report, comparison)` is the Figure it writes. Panels, left to right: acceptance by depth (α_k, A_k); tokens per target step (τ_sim, the verdict's,
and τ(K), the per-position formula over every anchor); the speedup on its own axis, from K = 0 (no speculation,
1× by definition) to Kmax, with the verdict's K to run starred where the verdict puts it — at K = 0, "do not
speculate"; with several drafters, every drafter's speedup; with a cost table of several batch sizes, speedup
versus batch size. Legends sit below their panels, off the data. The title is the verdict's headline.
Nothing is computed here (presentation.py's rule).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..wording import plural
from . import Comparison, Report

COLOURS = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#ff7f0e"]


def _legend(ax) -> None:
    """Below the panel, outside the axes: never over the data."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize=8, frameon=False, ncol=1)


def plot(report: Report, path: str | Path, comparison: Comparison | None = None) -> Path:
    path = Path(path)
    figure(report, comparison).savefig(path, dpi=110)
    return path


def figure(report: Report, comparison: Comparison | None = None):
    """The matplotlib Figure `plot` writes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    o, K, v = report.overall, report.k, report.verdict
    ks = np.arange(1, K + 1)
    several = len(report.drafters) > 1
    by_batch = report.batch is not None and len(report.batch.times.batch) > 1
    n = 3 + several + by_batch
    fig = Figure(figsize=(5.0 * n, 5.6), layout="constrained")
    FigureCanvasAgg(fig)
    panels = list(fig.subplots(1, n))
    accept, tokens, speed = panels[0], panels[1], panels[2]

    # 1. Acceptance by depth.
    _with_band(accept, o, ks, "alpha", "α_k  conditional: accepted(k) / accepted(k-1)", "#1f77b4", "o")
    _with_band(accept, o, ks, "accept_rate", "A_k  unconditional: accepted(k) / evaluable(k)", "#ff7f0e", "s")
    if comparison is not None:
        base, kc = comparison.overall.baseline.value, np.arange(1, comparison.k + 1)
        accept.plot(kc, base.alpha[: comparison.k], "--", color="#1f77b4", alpha=0.6, label="α_k baseline")
        accept.plot(kc, base.accept_rate[: comparison.k], "--", color="#ff7f0e", alpha=0.6, label="A_k baseline")
    accept.set(title="acceptance by depth (95% bands)", xlabel="depth k", ylabel="acceptance rate", ylim=(0, 1.02),
               xticks=ks)
    accept.grid(alpha=0.3)
    _legend(accept)

    # 2. Tokens per target step.
    _with_band(tokens, o, ks, "tau_sim", "τ_sim(K)  simulated decode (the verdict's τ)", "#9467bd", "^")
    _with_band(tokens, o, ks, "tau", "τ(K)  per-position formula over every anchor", "#2ca02c", "o")
    tokens.set(title="tokens per target step (95% bands)", xlabel="draft length K", ylabel="tokens per step",
               xticks=ks)
    tokens.grid(alpha=0.3)
    _legend(tokens)

    # 3. The speedup on its own axis, K = 0 (no speculation: 1×) included, the K to run starred.
    _plot_speedup(speed, report, comparison)

    rest = panels[3:]
    if several:
        _plot_drafters(rest.pop(0), report, ks)
    if by_batch:
        plot_batch(rest.pop(0), report)
    judged = f" [{report.drafter}]" if several else ""
    fig.suptitle(f"{report.path.name}{judged}: {v.headline}\n{plural(len(report.sessions), 'session')}, "
                 f"{plural(o.anchors, 'anchor')}; {v.reason[:140]}", fontsize=10)
    return fig


def _with_band(ax, o, x, field, label, colour, marker):
    """One metric of the overall numbers `o` against x, with its 95% band where there is one."""
    y = getattr(o.value, field)
    if o.lo is not None:
        ax.fill_between(x, getattr(o.lo, field), getattr(o.hi, field), color=colour, alpha=0.18, linewidth=0)
    ax.plot(x, y, marker=marker, color=colour, label=label, linewidth=2)


def _plot_speedup(speed, report: Report, comparison: Comparison | None) -> None:
    """The speedup on its own axis, K = 0 (no speculation: 1×) included, the K to run starred."""
    o, K, v = report.overall, report.k, report.verdict
    x0 = np.arange(0, K + 1)
    y = np.concatenate([[1.0], o.value.speedup])
    if o.lo is not None:
        speed.fill_between(x0, np.concatenate([[1.0], o.lo.speedup]), np.concatenate([[1.0], o.hi.speedup]),
                           color="#d62728", alpha=0.18, linewidth=0)
    speed.plot(x0, y, marker="s", color="#d62728", linewidth=2,
               label=f"speedup(K) = τ_sim / cost,  c = {report.cost.c:.3f} ({report.cost.source}); K = 0: none")
    if comparison is not None:
        kc = np.arange(0, comparison.k + 1)
        speed.plot(kc, np.concatenate([[1.0], comparison.overall.baseline.value.speedup[: comparison.k]]), "--",
                   color="#d62728", alpha=0.6, label="speedup baseline")
    speed.axhline(1.0, color="grey", linewidth=1, linestyle=":", label="1× (no speedup)")
    if v.enforced and v.gate.metric == "speedup":
        speed.axhline(v.gate.threshold, color="black", linewidth=1, linestyle="--", label=f"gate {v.gate.text}")
    at = v.run_k
    speed.plot([at], [y[at]], marker="*", markersize=18, color="black", linestyle="none",
               label=f"K to run = {at}" if v.serves else
               f"K to run = 0: do not speculate ({v.status}; best K = {report.best_k} not recommended)")
    if not v.serves:
        speed.annotate("do not speculate", (0, 1.0), xytext=(6, -14), textcoords="offset points", fontsize=9)
    speed.set(title="projected speedup vs K (95% bands)", xlabel="draft length K (0: no speculation)",
              ylabel="speedup ×", xticks=x0)
    speed.grid(alpha=0.3)
    _legend(speed)


def _plot_drafters(ax, report: Report, ks: np.ndarray) -> None:
    """Every drafter's speedup against K, the judged one named."""
    for i, d in enumerate(report.drafters):
        colour = COLOURS[i % len(COLOURS)]
        if d.overall.lo is not None:
            ax.fill_between(ks, d.overall.lo.speedup, d.overall.hi.speedup, color=colour, alpha=0.15, linewidth=0)
        ax.plot(ks, d.overall.value.speedup, marker="o", color=colour, linewidth=2,
                label=f"{d.name}  c = {d.cost.c:.3f}" + (" (judged)" if d.judged else ""))
    ax.axhline(1.0, color="grey", linewidth=1, linestyle=":")
    ax.set(title="speedup vs K, every drafter (95% bands)", xlabel="draft length K", ylabel="speedup ×", xticks=ks)
    ax.grid(alpha=0.3)
    _legend(ax)


def plot_batch(ax, report: Report) -> None:
    """speedup(K, B) versus batch size, one line per K with τ_sim's band; the gated batch size marked."""
    b = report.batch
    x = np.array(b.times.batch, dtype=float)
    for k in range(1, report.k + 1):
        colour = COLOURS[k % len(COLOURS)]
        if b.lo is not None:
            ax.fill_between(x, b.lo[:, k - 1], b.hi[:, k - 1], color=colour, alpha=0.15, linewidth=0)
        ax.plot(x, b.value[:, k - 1], marker="o", color=colour, label=f"K = {k}", linewidth=2)
    ax.axhline(1.0, color="grey", linewidth=1, linestyle=":", label="1× (no speculation)")
    for g in b.gated:
        ax.axvline(g, color="black", linewidth=1, linestyle="--", alpha=0.5)
    ax.set_xscale("log", base=2)
    ax.set(title=f"speedup vs batch size ({b.times.source}; gate at B = {', '.join(map(str, b.gated))})",
           xlabel="batch size B (sequences per step)", ylabel="speedup(K, B): ×")
    ax.set_xticks(x, [str(int(val)) for val in x])
    ax.grid(alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize=8, frameon=False, ncol=4)
