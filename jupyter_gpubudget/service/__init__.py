"""The gpubudget hub service: owns the ledger, runs the scheduling loop, serves /api/v1."""
