"""Code that runs inside real SGLang's processes (`--engine sglang`): CPU shims, hook points and
the recorder. Loaded through `site/sitecustomize.py` on that launch's PYTHONPATH only; it imports
nothing of the harness and names every SGLang target once, in `targets.py`."""
