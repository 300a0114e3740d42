"""`hicache-diag shrink`: the smallest fault schedule and request count that still fail the way
a run failed (delta debugging over faults, their windows and the requests)."""
