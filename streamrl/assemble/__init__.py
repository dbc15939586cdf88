"""The assemble stage: join rollouts with their annotations into complete groups, staleness filter, advantages, batches."""
