"""Entry of the hicache-diag plugin in every process of one SGLang launch (a run's, or a recorded
server's: `hicache-diag record`).

This directory is on PYTHONPATH for that launch only, beside the plugin bundle's library
(engines/sglang/bundle.py): the plugin comes from those files, never from the tool's own
environment, so a release's interpreter imports only its own packages. Being first on the path,
this file shadows the image's own sitecustomize: that one is found further down sys.path and
run first, as Python would have run it. Nothing here may break an interpreter: any error is one
line on stderr and the interpreter goes on.
"""

import os
import sys

_HICACHE_DIAG_SITE = True  # marks this file: never chained to a second copy of itself


def _chain() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if os.path.abspath(entry or os.curdir) == here:
            continue
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry])
        if spec is None or spec.loader is None or spec.origin is None:
            continue
        try:
            with open(spec.origin, "rb") as fh:
                if b"_HICACHE_DIAG_SITE = True" in fh.read():
                    continue
        except OSError:
            pass
        module = importlib.util.module_from_spec(spec)
        sys.modules["_hicache_diag_chained_sitecustomize"] = module
        spec.loader.exec_module(module)
        return


def _say(what: str, exc: BaseException) -> None:
    try:
        sys.stderr.write(f"hicache-diag: {what}: {type(exc).__name__}: {exc}\n")
    except Exception:  # noqa: BLE001 - no stderr at all: nothing to say it on
        pass


def _boot() -> None:
    from hicache_diag.engines.sglang.plugin.start import start

    start()


try:
    _chain()
except Exception as exc:  # noqa: BLE001 - the image's own sitecustomize failed, as it would have
    _say("the image's own sitecustomize failed", exc)
try:
    _boot()
except Exception as exc:  # noqa: BLE001 - never break an interpreter over the plugin
    _say("plugin not loaded", exc)
