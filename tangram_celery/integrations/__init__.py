"""Adapters for the trainers people run: verl's tool and batch reward function, TRL's GRPO reward.

    from tangram_celery.integrations.trl import TestReward          # GRPOTrainer(reward_funcs=...)
    from tangram_celery.integrations.verl import TangramCodeTool    # verl tool config class_name
    from tangram_celery.integrations.verl import compute_score      # verl batch reward manager

Every solution's tests become tangram actions, submitted together so the CPU pool's scheduler sees
the whole batch (:mod:`.scoring`, with the plain-data parts in :mod:`.tests`). verl and TRL are
imported only by :mod:`.verl` and :mod:`.trl`, so the rest of tangram never needs them.

May import: the ground floor, sandbox and client; never the stack, the autoscaler or the benchmarks.
"""
