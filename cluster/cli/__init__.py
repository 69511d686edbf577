"""The `raypd` command line and its subcommands (docs/architecture.md, cluster/)."""
