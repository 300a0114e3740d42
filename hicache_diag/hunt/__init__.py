"""`hicache-diag hunt`: from a release's unaligned per-rank reads (`sources`) to trials that try
to make them diverge, natural triggers first and physical perturbations second, with a rate and
the first-divergence evidence per trigger."""
