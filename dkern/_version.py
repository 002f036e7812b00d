"""The dkern version, recorded in every store dkern writes."""

__version__ = "0.1.0"
