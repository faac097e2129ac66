"""The base types every layer above imports: names, thresholds, formulas, the store, samples, the part interfaces."""
