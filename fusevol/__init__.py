"""fusevol: a node agent that serves Kubernetes configuration volumes from memory over FUSE."""

__version__ = "0.1.0"
__all__ = ["__version__"]
