"""CPU hosts only: a torchvision wheel built for another torch fails at `import sglang`
(`operator torchvision::nms does not exist`, from its fake-kernel registrations, reached through
sglang -> transformers.image_utils -> torchvision). Skip those registrations, nothing else;
where torchvision imports cleanly this file does nothing."""

import sys
import types

try:
    import torchvision  # noqa: F401
except RuntimeError as exc:
    if "torchvision::" not in str(exc):
        raise
    for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
        del sys.modules[name]
    stub = types.ModuleType("torchvision._meta_registrations")
    sys.modules[stub.__name__] = stub
except ImportError:
    pass
