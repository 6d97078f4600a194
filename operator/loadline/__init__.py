"""loadline: size, render and keep vLLM model-serving fleets out of out-of-memory trouble."""

__version__ = "0.1.0"
__all__ = ["__version__"]
