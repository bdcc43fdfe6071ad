"""Pool autoscaling: a pure sizing policy, the work predicted for queued actions, actuators that
apply the policy, and the controller loop."""
