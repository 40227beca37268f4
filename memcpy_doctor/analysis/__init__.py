"""Pure functions over traces: summary figures, the cost model, and (later) attribution and rules."""
