"""Every figure the pipeline draws, one module per figure family, each a stage's picture of its tables: the
measured and predicted sweeps (ncmoe), placement variants, the tuned matrix, the budget check, the speed
model's fidelity, the RAM tier, quant types, expert routing and a merged publication. matplotlib draws them
with its Agg backend (files only, no display), chosen here before any of them imports pyplot."""

import matplotlib

matplotlib.use("Agg")
