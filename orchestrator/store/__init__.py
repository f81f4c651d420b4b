"""The results database: jobs, instances, events, metrics, ledger, plans, calibrations."""
