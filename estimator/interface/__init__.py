"""What the user touches: the CLI, its flags, their config files and launch commands, and the report."""
