"""Per-rank timeline plots (queue depths, extend tokens, host free, acks, isends) as PNGs."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from hicache_diag.diagnosis.series import QUEUES, timelines  # noqa: E402

PANELS = (
    ("extend_tokens.png", "extend_num_tokens", ("extend_num_tokens",)),
    ("host_free.png", "host pool free tokens", ("host_free",)),
    ("acks_consumed.png", "acks consumed per step", ("acks_consumed_write", "acks_consumed_load")),
    ("queues.png", "HiCache queue depths", QUEUES),
    ("inflight_sends.png", "pp_sync isends still kept (a leak grows here)", ("inflight_sends",)),
)


def _plot(table: pd.DataFrame, title: str, columns: tuple[str, ...], mark: int | None, path: Path):
    ranks = sorted(table["rank"].unique())
    fig, axes = plt.subplots(
        len(ranks), 1, figsize=(8, 1.8 + 1.6 * len(ranks)), squeeze=False, sharex=True
    )
    for ax, rank in zip(axes[:, 0], ranks, strict=True):
        rows = table[table["rank"] == rank]
        for col in columns:
            if rows[col].notna().any():
                ax.step(rows["step"], rows[col], where="post", label=col)
        if mark is not None:
            ax.axvline(mark, color="red", linestyle="--", linewidth=1, label="first divergence")
        ax.set_ylabel(f"rank {rank}")
        ax.legend(loc="upper right", fontsize="x-small")
    axes[-1, 0].set_xlabel("step")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write_plots(frames: pd.DataFrame, out_dir: Path, mark: int | None = None) -> list[Path]:
    """One PNG per panel, a subplot per rank; `mark` draws the first divergence step."""
    table = timelines(frames)
    if table.empty:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, title, columns in PANELS:
        if not table[list(columns)].notna().any().any():
            continue  # an older run without these keys: no empty plot
        path = out_dir / name
        _plot(table, title, columns, mark, path)
        paths.append(path)
    return paths
