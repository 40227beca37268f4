"""Pure functions and rule classes over traces: attribution, rules and their suggestions,
placement, gates, and comparisons of two traces or of a run's ranks. The summary figures and
the cost model they use are in core/."""
