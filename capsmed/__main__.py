"""``python -m capsmed`` runs the CLI."""

from capsmed.cli import main

main()
