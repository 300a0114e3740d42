"""`--engine sglang`: real SGLang releases launched, driven and reaped (the harness side), the
plugin that runs inside their processes (`plugin/`), multi-node launch and SGLang's own
injectors. Kept empty: the plugin is a child of this package (see engines/__init__.py)."""
