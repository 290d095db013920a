"""xlt: cross-lingual ability transfer experiments in JAX."""

__version__ = "0.1.0"
