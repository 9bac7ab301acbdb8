"""Orchestration: the driver, the training job, the rollout manager, the train group, placement and the plan."""
