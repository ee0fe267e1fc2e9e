"""``python -m search`` = the ``servetune`` command."""

from search.cli import main

main()
