"""The pieces every stage shares: wire types, keys, the consumer protocol, the worker lifecycle, accounting, staleness, trimming, run end."""
