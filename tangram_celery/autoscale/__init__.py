"""Pool autoscaling: a pure sizing policy, actuators that apply it, and the controller loop."""
