"""The model: family records, a config.json read into shapes and exact parameter counts, the catalog, the hub."""
