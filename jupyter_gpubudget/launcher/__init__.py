"""The privileged launcher: the one part of gpubudget that may run as root.

The service runs as an unprivileged user (``gpubudget``); to start a batch job as the
submitting user's Unix account it runs, through a sudoers line that pins the config file::

    sudo -n /path/to/python -I -m jupyter_gpubudget.launcher --config /etc/gpubudget/launcher.json VERB ...

Verbs are grouped one module per group (``jobs``: ``launch``, ``signal``; ``mps``:
``mps-acquire``, ``mps-release``, ``mps-ensure``; ``mig``: ``mig-create``, ``mig-destroy``);
each verb is a function ``(config, args, stdin) -> dict`` registered in ``__main__.VERBS`` and answers one
JSON line on stdout. Nothing here imports the rest of the package: standard library only (the
MIG verbs import NVIDIA's ``pynvml`` when they run).
"""
