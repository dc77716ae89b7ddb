"""What was measured: llama-bench sweeps and variants, the ceilings, tuning loads, routing, the RAM tier, quants."""
