"""Executors run a Schedule: :mod:`.cuda` on copy engines, :mod:`.reference` on CPU shared memory."""
