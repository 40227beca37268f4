"""Pure functions over traces: summary figures, the cost model, attribution, rules, placement
and gates."""
