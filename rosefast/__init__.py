"""rosefast: an LLM inference server with a torch batching core and Cython hot paths."""
from rosefast.frontend import EXTENSIONS

__version__ = "0.1.0"
__all__ = ["EXTENSIONS", "__version__"]
