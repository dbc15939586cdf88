"""The pieces every stage shares: wire types, keys, the consumer protocol, the worker lifecycle, the trainer's batch, accounting, staleness, trimming, run end."""
