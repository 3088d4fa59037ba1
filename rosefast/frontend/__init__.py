"""The path every token crosses on its way to the client: each module compiled, each with a pure twin
(rosefast.EXTENSIONS and rosefast.flavours() report these and the engine's and the model's compiled modules)."""
from rosefast.frontend import admission, collector, fanout
from rosefast._select import NO_EXTENSIONS, is_compiled

ACCELERATED = (admission, collector, fanout)

#: True when every accelerated module runs its compiled flavour.
EXTENSIONS = all(is_compiled(m._impl) for m in ACCELERATED)

__all__ = ["ACCELERATED", "EXTENSIONS", "NO_EXTENSIONS"]
