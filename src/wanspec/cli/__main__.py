"""`python -m wanspec.cli`: the `wanspec` command without its console script."""

from wanspec.cli import main

main()
