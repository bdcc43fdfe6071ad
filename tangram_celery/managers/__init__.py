"""Resource managers: they own the units of one pool and turn actions into scheduler inputs.

May import: the ground floor and scheduling.
"""
