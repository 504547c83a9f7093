"""The run settings: one schema (RunConfig), the library releases they model, and the checks TRL would make."""
