"""Trace-driven simulator: replays workloads through the scheduling core with a simulated clock.

- :mod:`.traces`: native CSV, Microsoft ITP, Alibaba openb loaders (errors name line and column)
- :mod:`.synthetic`: the seeded synthetic workload (no external data needed)
- :mod:`.engine`: the discrete-event loop that feeds ``core.scheduler.Scheduler``
- :mod:`.metrics`, :mod:`.report`: figures, tables, JSON and plots
- :mod:`.openb`: the FGD-paper placement reproduction
- :mod:`.run`: trace + budgets + inventory → result (used by ``gpubudget simulate``)
"""
