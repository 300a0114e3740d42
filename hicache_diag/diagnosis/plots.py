"""Timeline plots (queue depths, extend tokens, host free, acks, isends) as PNG bytes.

Every rank on ONE axis per quantity, so a gap between ranks reads at a glance on a shared scale
(a subplot per rank, each with its own scale, hid exactly that). The first divergence is marked
above the axes, beside the data, never drawn over it."""

from __future__ import annotations

import io
from dataclasses import dataclass

import pandas as pd

from hicache_diag.diagnosis.series import QUEUES, timelines

PANELS = (
    ("extend_tokens.png", "extend_num_tokens", ("extend_num_tokens",)),
    ("host_free.png", "host pool free tokens", ("host_free",)),
    ("acks_consumed.png", "acks consumed per step", ("acks_consumed_write", "acks_consumed_load")),
    ("queues.png", "HiCache queue depths", QUEUES),
    ("inflight_sends.png", "pp_sync isends still kept (a leak grows here)", ("inflight_sends",)),
)
PLOT_NAMES = tuple(name for name, _, _ in PANELS)
# One colour per rank, the same in every plot (the HTML test looks for the first two).
RANK_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf")
MARK_COLOUR = "#d62728"


@dataclass(frozen=True, slots=True)
class Plot:
    name: str  # file name, e.g. queues.png
    title: str
    png: bytes


def _colour(rank: int) -> str:
    return RANK_COLOURS[rank % len(RANK_COLOURS)]


def _mark(ax, step: int) -> None:
    """A triangle and its label above the top spine at `step`: beside the curves, not on them."""
    where = ("data", "axes fraction")
    ax.annotate(
        "",
        xy=(step, 1.0),
        xycoords=where,
        xytext=(step, 1.16),
        textcoords=where,
        arrowprops={"arrowstyle": "-|>", "color": MARK_COLOUR, "lw": 2},
        annotation_clip=False,
    )
    ax.annotate(
        f"first divergence, step {step}",
        xy=(step, 1.17),
        xycoords=where,
        ha="center",
        va="bottom",
        color=MARK_COLOUR,
        fontsize="small",
        annotation_clip=False,
    )


def _axis(ax, table: pd.DataFrame, column: str, ranks: list[int]) -> None:
    for i, rank in enumerate(ranks):
        rows = table[table["rank"] == rank]
        if not rows[column].notna().any():
            continue
        # Later ranks thinner and dashed: where ranks agree, every colour still shows.
        ax.step(
            rows["step"],
            rows[column],
            where="post",
            color=_colour(rank),
            linewidth=max(1.2, 3.0 - 0.8 * i),
            linestyle="-" if i == 0 else "--",
            label=f"rank {rank}",
        )
    ax.set_ylabel(column, fontsize="small")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="x-small", frameon=False)


def _plot(table: pd.DataFrame, title: str, columns: tuple[str, ...], mark: int | None) -> bytes:
    import os

    # PNG files through Agg, never a display: the user's MPLBACKEND is not ours to read, and a
    # value matplotlib does not know makes its import raise.
    os.environ.pop("MPLBACKEND", None)
    import matplotlib  # only when drawing: PLOT_NAMES is read to check output paths

    matplotlib.use("Agg")  # headless: never needs a display
    import matplotlib.pyplot as plt

    shown = [c for c in columns if table[c].notna().any()]
    ranks = sorted(int(r) for r in table["rank"].unique())
    fig, axes = plt.subplots(
        len(shown), 1, figsize=(9, 1.2 + 2.2 * len(shown)), squeeze=False, sharex=True
    )
    for ax, column in zip(axes[:, 0], shown, strict=True):
        _axis(ax, table, column, ranks)
    if mark is not None:
        _mark(axes[0, 0], mark)
        for ax in axes[1:, 0]:  # the same step above each lower axis, unlabelled
            ax.plot(
                [mark],
                [1.04],
                marker="v",
                color=MARK_COLOUR,
                markersize=6,
                clip_on=False,
                transform=ax.get_xaxis_transform(),
            )
    axes[-1, 0].set_xlabel("step")
    fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return buf.getvalue()


def render_plots(frames: pd.DataFrame, mark: int | None = None) -> list[Plot]:
    """One PNG per panel, one axis per quantity with every rank on it; `mark`: the first
    divergence step. A panel whose keys an older run lacks is left out, never drawn empty."""
    table = timelines(frames)
    if table.empty:
        return []
    plots = []
    for name, title, columns in PANELS:
        if table[list(columns)].notna().any().any():
            plots.append(Plot(name, title, _plot(table, title, columns, mark)))
    return plots
