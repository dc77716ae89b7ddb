"""The lowest layer: errors, units, statistics and the typed settings every other layer may import."""
