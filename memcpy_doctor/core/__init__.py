"""What every stage of the pipeline stands on: the trace data model, the cost model and device
profiles, units, defaults, paths and the one import point for PyTorch's private modules.
Nothing here imports from the rest of the package."""

__version__ = "0.1.0"
