"""`hicache-diag export`: a run directory -> what an SGLang maintainer needs with nothing of ours
installed (a unit test in SGLang's style, a launch script, a markdown report; docs/export.md)."""
