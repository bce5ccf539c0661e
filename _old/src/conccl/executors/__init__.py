"""Executors run a Schedule: ``cuda_ce`` on copy engines, ``reference`` on CPU shared memory."""
