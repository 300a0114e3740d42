"""The engines: one folder each (`builtin/`, `sglang/`), each registering itself in
`registry.py` through its `entry.py`. Kept empty: the SGLang plugin is a child of this package
and runs inside SGLang's processes, which must load nothing of the tool's."""
