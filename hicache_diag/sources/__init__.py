"""Divergence-source inventory: static reads of per-rank physical quantities in a release's
scheduler, cache, controller and session code, the decisions they feed, and how they are aligned.

`scan.scan_tree` builds an `Inventory`; `diff.diff_inventories` compares two; `locate` finds the
source tree for `--source`, `--sglang-python` or the builtin runtime. Rendering is cli/render's.
"""
