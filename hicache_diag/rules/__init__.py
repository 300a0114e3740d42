"""The rule book: error-text signatures (crash forms, timeouts, cascade, noise) and the wait-site
table. Triage and the run classifier both read them from here and nowhere else."""
