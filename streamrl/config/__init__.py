"""The config's sections, one module per part of a job; streamrl/config/schema.py assembles them into
`Config` and re-exports every name (import from streamrl.config.schema)."""
