"""`python -m raypd` is the `raypd` command."""
import sys

from raypd.cluster.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
