"""Emulated teachers for the real-stack MOPD benchmark: :mod:`.model`, :mod:`.repository`."""
