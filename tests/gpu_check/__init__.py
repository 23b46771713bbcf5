"""The GPU check behind ``make gpu-check``: one prepared command that proves the kit on a GPU within a short loan.

A GPU machine is lent now and then for minutes, with its own image (torch, Triton, pytest; no Jupyter, papermill,
nbgrader or mlxtend) and no network. ``make gpu-wheels`` downloads, on a machine with internet, the wheels the image
lacks (``wheels.txt``; ``image_packages.txt`` is what the image holds); ``make gpu-check`` installs them into a folder
of its own and runs, in one go:

- every lecture whose packages can travel, each in an interpreter of its own, with its lesson figures checked as the
  suite checks them and each GPU lesson's effect judged (``lessons.py``);
- the unit lane and the ``gpu`` lane of the suite;
- ``make bench QUICK=1`` (less the grading benchmarks, which need nbgrader);
- ``training_memory`` against ``torch.cuda.max_memory_allocated`` on models the kit was not tuned on (``memory_models.py``).

It writes one JSON and one table (``gpu-check.json``, ``gpu-check.md``) and exits non-zero on any failure. On a CPU
the same command is a dry run (``tests/test_gpu_check.py``).
"""
